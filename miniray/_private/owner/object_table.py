"""The owner's object table: the state of every object, who waits for it, who refers to it.

Owns: one entry per object id (pending or ready, value or error), the waiters of pending
objects, the driver's ObjectRef counts and freeing an object when nothing can read it any more.
Does not own: the bytes (the object store), tasks (owner.py), or the lock (the owner's, shared
so that a result and the task bookkeeping it triggers change together).
Called by: owner.py (with its lock held), and the driver's ``get``/``wait`` through the owner.

::

    ObjectRef() / del ref ──► ref_created / ref_dropped  (lock-free deque appends)
                                   │ applied in batches under the lock
                                   ▼
    set_ready(id, kind, data) ──► store.put ──► waiters.notify(is_error, id)
                                   └─► freed at once if its last ref is already gone

A task's result kept on another node (``RemoteCopy``) stays PENDING here until its first
waiter starts its pull; freeing it frees the node's copy (``owner/remote_nodes.py``).

A waiter is anything with ``notify(is_error, object_id)``: a blocked driver ``get``/``wait``
(``Waiter``), a worker's get/wait (``CallbackWaiter``), or a task waiting on an argument.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

from miniray._private.core import protocol
from miniray._private.object_store import values

PENDING, READY = 0, 1


class RemoteCopy:
    """A task's result that its node keeps (issue 16, ``owner/remote_nodes.py``): the entry
    stays PENDING, and nothing of it is in this store, until someone waits for it; the
    first waiter starts the pull (``want``, locked: ``start`` only hands the pull to a
    thread, after the lock), whose end makes the entry READY (or an ObjectLostError) and
    wakes every waiter: two gets share one pull. The owner freeing the entry frees the
    node's copy (``free``, locked: queued, sent after the lock)."""

    __slots__ = ("node_id", "size", "path", "pulling", "again", "_start", "_free")

    def __init__(self, node_id: str, size: int, start: Callable[[], None],
                 free: Callable[[], None], path: str = ""):
        self.node_id = node_id
        self.size = size
        self.path = path  # the segment on that node (a task placed there reads it)
        self.pulling = False
        # A pull that found no room here (ObjectStoreFullError, its entry READY with it)
        # sets the entry's kind before it: the next reader makes the entry PENDING again
        # (``ObjectTable._renew``) and pulls anew, since the node still has the value.
        self.again: int | None = None
        self._start = start
        self._free = free

    def want(self) -> None:
        if not self.pulling:
            self.pulling = True
            self._start()

    def free(self) -> None:
        self._free()


class Entry:
    __slots__ = ("state", "kind", "waiters", "refs", "escaped", "holders", "dropped", "borrows",
                 "contains", "remote", "read")

    def __init__(self):
        self.state = PENDING
        self.kind = protocol.OK
        self.waiters: list | None = None
        self.refs = 0          # live ObjectRef objects in this process
        self.escaped = False   # a ref was pickled: someone else may read it (kept until shutdown)
        self.holders = 0       # pending calls taking it (as an argument, or a ref nested in
        #                        one), stored objects that contain a ref to it (not the
        #                        store's pins, which keep a value in shared memory for readers)
        self.dropped = False   # the last ref went away while it was still pending
        self.borrows = 0       # workers that hold a ref to it (they report it)
        self.contains: tuple = ()  # ids of refs pickled inside this object
        self.remote: RemoteCopy | None = None  # kept on another node (freed with it)
        # Its value was read or waited for (a get, a wait, a call taking it): an error
        # nobody read is reported when it is freed (``on_unhandled_error``), as Ray does.
        self.read = False

    def add_waiter(self, waiter) -> None:
        if self.waiters is None:
            self.waiters = [waiter]
        else:
            self.waiters.append(waiter)
        if self.remote is not None and self.state == PENDING:
            self.remote.want()  # kept on its node: pulled now that someone needs it

    def remove_waiter(self, waiter) -> None:
        if self.waiters and waiter in self.waiters:
            self.waiters.remove(waiter)


class Waiter:
    """Released when ``count`` objects are ready, or at the first error if ``on_error``."""

    __slots__ = ("remaining", "on_error", "lock", "fired")

    def __init__(self, count: int, on_error: bool):
        self.remaining = count
        self.on_error = on_error
        self.lock = threading.Lock()
        self.lock.acquire()
        self.fired = False

    def notify(self, is_error: bool, object_id: bytes = b"") -> None:
        self.remaining -= 1
        if not self.fired and (self.remaining <= 0 or (is_error and self.on_error)):
            self.fired = True
            self.lock.release()

    def wait(self, timeout: float | None) -> bool:
        if timeout is None or timeout < 0:
            return self.lock.acquire()
        return self.lock.acquire(timeout=timeout)


class CallbackWaiter:
    """Calls ``finish()`` (under the owner's lock) once ``count`` objects are ready."""

    __slots__ = ("remaining", "on_error", "finish", "fired")

    def __init__(self, count: int, on_error: bool, finish: Callable[[], None]):
        self.remaining = count
        self.on_error = on_error
        self.finish = finish
        self.fired = False

    def notify(self, is_error: bool, object_id: bytes = b"") -> None:
        self.remaining -= 1
        if not self.fired and (self.remaining <= 0 or (is_error and self.on_error)):
            self.fired = True
            self.finish()


class ObjectTable:
    """Entries of one owner. Methods marked *locked* expect the owner's lock to be held."""

    def __init__(self, store, lock: threading.Lock, check_usable: Callable[[], None],
                 wake: Callable[[], None] | None = None,
                 on_free: Callable[[bytes], None] | None = None):
        self.store = store
        self.wake = wake  # asks the I/O thread to apply ref events soon
        self.on_free = on_free  # told (locked) after an object is freed
        # Told (locked) before an error nobody read is freed: Ray's "Unhandled error".
        self.on_unhandled_error: Callable[[bytes], None] | None = None
        self.lock = lock
        self.check_usable = check_usable
        # Set (locked) by the owner at shutdown: the per-get test, check_usable called only
        # then (it raises only for a closed owner).
        self.closed = False
        self.entries: dict[bytes, Entry] = {}
        self.ref_events: collections.deque = collections.deque()
        # No wake-up needed for a drop: one was asked and not yet served, or the I/O thread
        # sleeps only briefly (``Owner._idle_hint``) and applies the events when it wakes.
        self.wake_pending = False
        self._applying = False
        # Set by the owner: a get() of one running task's result may read it from the
        # worker's socket (owner/direct_reads.py); None: every get() waits on its waiter.
        self.direct_reads = None

    def __len__(self) -> int:
        return len(self.entries)

    # -- refs (any thread, no lock: __del__ may run anywhere) ------------------------------
    def ref_created(self, object_id: bytes) -> None:
        self.ref_events.append((object_id, 1))

    def ref_dropped(self, object_id: bytes) -> None:
        self.ref_events.append((object_id, -1))
        if not self.wake_pending and self.wake is not None:
            self.wake_pending = True  # one wake-up per batch: memory is freed promptly
            self.wake()

    def ref_pickled(self, object_id: bytes) -> None:
        self.ref_events.append((object_id, 0))

    def apply_ref_events(self) -> None:
        """*Locked.* Apply queued ref events; free what nothing refers to any more."""
        self.wake_pending = False
        self._applying = True
        try:
            self._apply_events()
        finally:
            self._applying = False

    def _sync(self) -> None:
        """Before a free decision outside ``apply_ref_events``: apply queued events first, so
        a ref created a moment ago (its +1 still queued) counts."""
        if self.ref_events and not self._applying:
            self.apply_ref_events()

    def _apply_events(self) -> None:
        events = self.ref_events
        entries = self.entries
        while events:
            try:
                object_id, delta = events.popleft()
            except IndexError:
                break
            entry = entries.get(object_id)
            if entry is None:
                continue
            if delta == 0:
                entry.escaped = True
                continue
            entry.refs += delta
            if delta < 0 and entry.refs <= 0:
                self.maybe_free(object_id, entry)

    def maybe_free(self, object_id: bytes, entry: Entry) -> None:
        """*Locked.* Free it if nothing can read it any more: no driver ref, no holder, no
        borrowing worker, and it was never pickled somewhere untracked."""
        if entry.refs > 0 or entry.escaped or entry.holders > 0 or entry.borrows > 0:
            return
        if entry.state == READY or entry.remote is not None:
            self._free(object_id)
        else:
            entry.dropped = True

    def _free(self, object_id: bytes) -> None:
        entry = self.entries.pop(object_id)
        if (entry.kind == protocol.ERR and not entry.read and entry.state == READY
                and self.on_unhandled_error is not None):
            self.on_unhandled_error(object_id)
        self.store.free(object_id)
        if entry.remote is not None:  # its node's copy too (sent after the lock)
            entry.remote.free()
        if self.on_free is not None:
            self.on_free(object_id)
        if entry.contains:  # the refs it held inside go with it
            self.release(entry.contains)

    # -- holders, containment, borrowers (locked) ----------------------------------------
    def hold(self, object_ids) -> None:
        """Keep these objects while something (a pending call, a stored object) refers to
        them; an id already freed is skipped (reading it will raise its loss)."""
        for object_id in object_ids:
            entry = self.entries.get(object_id)
            if entry is not None:
                entry.holders += 1

    def release(self, object_ids) -> None:
        self._sync()
        for object_id in object_ids:
            entry = self.entries.get(object_id)
            if entry is not None:
                entry.holders -= 1
                if entry.holders <= 0:
                    self.maybe_free(object_id, entry)

    def contain(self, outer: bytes, inner_ids) -> None:
        """``outer`` holds refs to ``inner_ids``: they live at least as long as it does."""
        entry = self.entries.get(outer)
        if entry is None or not inner_ids:
            return
        inner_ids = tuple(i for i in inner_ids if i in self.entries)
        self.hold(inner_ids)
        entry.contains = entry.contains + inner_ids

    def borrow(self, object_id: bytes) -> bool:
        entry = self.entries.get(object_id)
        if entry is None:
            return False
        entry.borrows += 1
        return True

    def unborrow(self, object_id: bytes) -> None:
        self._sync()
        entry = self.entries.get(object_id)
        if entry is not None:
            entry.borrows -= 1
            if entry.borrows <= 0:
                self.maybe_free(object_id, entry)

    def forget_pending(self, object_id: bytes) -> None:
        """*Locked.* Drop a pending entry nothing waits for or holds (its value will never
        come)."""
        entry = self.entries.get(object_id)
        if entry is not None and entry.state == PENDING and not entry.waiters and \
                entry.holders <= 0 and entry.remote is None:
            del self.entries[object_id]

    def escape(self, object_id: bytes) -> None:
        entry = self.entries.get(object_id)
        if entry is not None:
            entry.escaped = True

    # -- entries (locked) -------------------------------------------------------------------
    def get(self, object_id: bytes) -> Entry | None:
        return self.entries.get(object_id)

    def ensure(self, object_id: bytes) -> Entry:
        entry = self.entries.get(object_id)
        if entry is None:
            entry = self.entries[object_id] = Entry()
        return entry

    def set_ready(self, object_id: bytes, kind: int, data, escaped: bool = False,
                  stored: bool = False) -> None:
        """*Locked.* Store an object (bytes, or a segment a worker made: ``("shm", path,
        size)``) and wake whoever waits for it. ``stored``: the store already holds it."""
        entry = self.entries.get(object_id)  # ensure(), inlined: a task's returns exist
        if entry is None:
            entry = self.ensure(object_id)
        if escaped:
            entry.escaped = True
        if type(data) is tuple and data[0] == "remote":  # kept on its node: not here yet
            entry.remote = data[1]
            entry.kind = kind
            waiters = entry.waiters
            if waiters and any(getattr(w, "places_first", False) for w in waiters):
                # Tasks placed before it comes here (``tasks._PlacingWaiter``): not pulled
                # for them; each is placed now, where it may read it.
                entry.waiters = [w for w in waiters if not getattr(w, "places_first", False)]
                for waiter in waiters:
                    if getattr(waiter, "places_first", False):
                        waiter.kept(object_id)
            if entry.waiters:
                entry.remote.want()
            elif (entry.dropped and entry.refs <= 0 and not entry.escaped
                  and entry.holders <= 0 and entry.borrows <= 0):
                self._free(object_id)
            return
        if stored:
            pass
        elif isinstance(data, tuple):
            self.store.put_segment_from(object_id, data[1], data[2])
        else:
            self.store.put_serialized(object_id, data)
        entry.state = READY
        entry.kind = kind
        waiters = entry.waiters
        if waiters:
            entry.waiters = None
            entry.read = True  # a get, a wait or a call takes it now
            is_error = kind == protocol.ERR
            for waiter in waiters:
                waiter.notify(is_error, object_id)
        if (entry.dropped and entry.refs <= 0 and not entry.escaped and entry.holders <= 0
                and entry.borrows <= 0):
            self._free(object_id)

    def _renew(self, object_id: bytes, entry: Entry) -> bool:
        """*Locked.* A READY error that a kept result's pull left for want of room here
        (``RemoteCopy.again``): PENDING again, its error dropped, so that the caller waits
        for it and its waiter pulls again. False for any other entry."""
        remote = entry.remote
        if remote is None or remote.again is None:
            return False
        entry.state, entry.kind = PENDING, remote.again
        remote.again, remote.pulling = None, False
        self.store.free(object_id)
        return True

    def read(self, object_id: bytes) -> tuple:
        """*Locked.* ``(kind, payload)`` of a ready object, for another process (see
        ``values.py``). Pin it first if the reader may be slow to map it."""
        entry = self.entries[object_id]
        entry.read = True
        return entry.kind, values.outgoing(self.store.location(object_id))

    def error_bytes(self, object_id: bytes) -> bytes:
        """*Locked.* The pickled error a ready error object holds, for the task, call or
        constructor that takes it as an argument and fails with it: read, so it is never
        reported unhandled."""
        entry = self.entries.get(object_id)
        if entry is not None:
            entry.read = True
        return self.store.inline_bytes(object_id)

    def lost(self, object_id: bytes) -> Exception:
        from miniray.exceptions import ObjectFreedError

        return ObjectFreedError(object_id.hex(), "", "")

    def ready_ids(self, object_ids) -> list[bytes]:
        """*Locked.* The ready ones among ``object_ids``, in order (a freed id counts as
        ready: reading it raises its loss)."""
        entries = self.entries
        return [i for i in object_ids if (e := entries.get(i)) is None or e.state == READY]

    def await_objects(self, object_ids, count: int, on_error: bool, finish, timeout,
                      add_timer) -> Callable[[], bool] | None:
        """*Locked.* Call ``finish(timed_out)`` once ``count`` ids are ready (or at the first
        error if ``on_error``), or with True when ``timeout`` passes first. Unknown ids are
        awaited too (a worker may read an object that a PUT will bring).

        Returns None if ``finish`` already ran, else ``abandon()``: it stops the wait without
        calling ``finish`` (False if ``finish`` ran meanwhile), for a cancelled waiter."""
        pending = []
        ready = 0
        for object_id in object_ids:
            entry = self.entries.get(object_id)
            if entry is None:  # freed (a worker only learns of an id through the owner)
                if on_error:
                    finish(False)
                    return None
                ready += 1
                continue
            if entry.state == READY and not (entry.kind == protocol.ERR
                                             and self._renew(object_id, entry)):
                ready += 1
                entry.read = True
                if on_error and entry.kind == protocol.ERR:
                    finish(False)
                    return None
            else:
                pending.append(entry)
        if ready >= count or timeout == 0:
            finish(False)
            return None
        callback = CallbackWaiter(count - ready, on_error, lambda: finish(False))
        for entry in pending:
            entry.add_waiter(callback)

        def abandon() -> bool:
            if callback.fired:
                return False
            callback.fired = True
            for entry in pending:
                entry.remove_waiter(callback)
            return True

        if timeout is not None and timeout >= 0:

            def expire():
                if abandon():
                    finish(True)

            add_timer(timeout, expire)
        return abandon

    # -- the driver's blocking calls (take the lock themselves) ----------------------------
    def get_serialized(self, object_ids: list[bytes], timeout: float | None):
        """``[(kind, data)]`` for each id (only the first error if any holds one), or None if
        the timeout passed first."""
        with self.lock:
            if self.closed:
                self.check_usable()
            waiter = reader = None
            pending = []
            for object_id in object_ids:
                entry = self.entries.get(object_id)
                if entry is None:
                    raise self.lost(object_id)
                if entry.state == PENDING or (entry.kind == protocol.ERR
                                              and self._renew(object_id, entry)):
                    pending.append(entry)
                    pending_id = object_id
                elif entry.kind == protocol.ERR:
                    pending = []
                    break
            if pending:
                waiter = Waiter(len(pending), on_error=True)
                for entry in pending:
                    entry.add_waiter(waiter)
                if len(pending) == 1 and timeout != 0 and self.direct_reads is not None:
                    reader = self.direct_reads.claim(pending_id)
        if waiter is not None:
            if reader is not None:  # the result is read from its worker's socket here
                ready = self.direct_reads.read(reader, waiter, timeout)
            else:
                ready = timeout != 0 and waiter.wait(timeout)
            if not ready:
                with self.lock:
                    for entry in pending:
                        entry.remove_waiter(waiter)
                return None
        inline_or_none = self.store.inline_or_none
        with self.lock:
            if self.closed:
                self.check_usable()
            out = []
            entries = self.entries
            for object_id in object_ids:
                entry = entries.get(object_id)
                if entry is None:
                    raise self.lost(object_id)
                if entry.state != READY:
                    continue
                data = inline_or_none(object_id)  # the common small value: no store lock
                if data is None:
                    data = values.outgoing(self.store.location(object_id))
                item = (entry.kind, data)
                if entry.kind == protocol.ERR:
                    entry.read = True
                    return [item]
                out.append(item)
            return out

    def wait_ready(self, object_ids: list[bytes], num_returns: int, timeout: float | None):
        """The set of ids that are ready once ``num_returns`` are (or the timeout passed)."""
        with self.lock:
            if self.closed:
                self.check_usable()
            ready = 0
            pending = []
            for object_id in object_ids:
                entry = self.entries.get(object_id)
                if entry is None:
                    raise self.lost(object_id)
                if entry.state == READY and not (entry.kind == protocol.ERR
                                                 and self._renew(object_id, entry)):
                    ready += 1
                    entry.read = True  # waited for: as Ray, not reported unhandled
                else:
                    pending.append(entry)
            waiter = None
            if num_returns > ready and pending and timeout != 0:
                waiter = Waiter(num_returns - ready, on_error=False)
                for entry in pending:
                    entry.add_waiter(waiter)
        if waiter is not None:
            waiter.wait(timeout)
            with self.lock:
                for entry in pending:
                    entry.remove_waiter(waiter)
        with self.lock:
            return set(self.ready_ids(object_ids))

    def statistics(self) -> dict:
        pending = sum(1 for e in self.entries.values() if e.state == PENDING)
        return {"objects": len(self.entries), "pending": pending,
                "store": self.store.statistics()}

    def clear(self) -> None:
        self.entries.clear()
        self.ref_events.clear()

    def __repr__(self) -> str:
        return f"<ObjectTable objects={len(self.entries)}>"
