"""The shared-memory object store: one POSIX shared-memory file per large object.

Owns: segment files (create, adopt, recycle, spill, restore, unlink), the owner's table of
stored objects with their pins and LRU order, the memory cap, and the sweep of segments left
by dead sessions. Does not own: *when* an object may be freed (the owner decides from
reference counts) or pickling rules (``oob.py``). No threads, no processes.
Called by: the owner (``SharedMemoryStore``), workers (``create_segment``, ``read_segment``,
``read_spilled``), and whoever sweeps dead sessions (``sweep_segments``).

Data flow::

    owner put(value) --serialize--> small? --> inline bytes in owner memory (as before)
                                     large? --> /dev/shm/mr_<tag>_<object id hex>
    worker result ----create_segment()------> /dev/shm/mr_<tag>_<object id hex>
                      (sends (path, size))      -- owner.put_segment_from(): owner adopts it
    reader (any process) --location()--> ("shm", path, size) --read_segment()--> arrays that
                                          view the segment, read-only, no copy
    over capacity: LRU unpinned segments --copy--> <spill_dir>/mr_<tag>_<hex>, then unlinked;
                   get_value() restores them (or reads the spill file where nothing fits)
    freed segment --rename--> mr_<tag>_pool<n> (kept mapped by the owner, reused by the next
                   put of a similar size: writes then run at memcpy speed; one a reader still
                   maps waits as draining until nobody does; ``recycled_for`` lends one to
                   bytes that arrive from another host, adopted by ``put_segment_from``)

Lifetime rules: see ``shm_segments.py``. In short, only the owner unlinks; readers attach
with a shared flock and never register with a resource tracker; pinned objects never move;
``close()`` (or the store's finalizer, in the creating process only) unlinks every file
carrying the session tag. Decisions (what to spill or recycle: ``store_policy.py``) are made
under the store's lock; copying, renaming and unlinking happen after it is released.
"""

from __future__ import annotations

import collections
import errno
import logging
import mmap
import os
import threading
import time
import weakref
from typing import Any, NamedTuple

from miniray._private.core import oob
from miniray._private.host import same_uid
from miniray._private.object_store import shm_segments as segs
from miniray._private.object_store import store_policy as policy

# re-exported: the store's module-level API
from miniray._private.object_store.shm_segments import (
    DEFAULT_INLINE_THRESHOLD,
    DEFAULT_SHM_DIR,
    create_segment,
    new_session_tag,
    read_segment,
    read_spilled,
    segment_name,
    session_tag_pid,
    sweep_segments,
    write_segment,
)
from miniray.exceptions import ObjectStoreFullError, OutOfDiskError

__all__ = [
    "DEFAULT_INLINE_THRESHOLD", "SharedMemoryStore", "StoredObject", "create_segment",
    "new_session_tag", "read_segment", "read_spilled", "segment_name",
    "session_tag_pid", "sweep_segments", "write_segment",
]  # fmt: skip

logger = logging.getLogger(__name__)

_MIN_SHM_FREE = 64 * 1024 * 1024
# Most live objects that keep the writable mapping of their recycled segment (warm for its
# next reuse); each mapping holds a descriptor (Python's mmap keeps a duplicate before 3.13).
_WARM_MAX = 32


class StoredObject(NamedTuple):
    """What ``put_value`` stored: ``kind`` is "inline", "shm" or "spilled"."""

    object_id: bytes
    kind: str
    size: int


class _Entry:
    """A segment-backed object. ``busy``: an operation outside the lock is moving it."""

    __slots__ = ("object_id", "kind", "path", "size", "pins", "busy", "freed", "rw", "ro")

    def __init__(self, object_id: bytes, path: str, size: int):
        self.object_id = object_id
        self.kind = "shm"  # or "spilled"
        self.path = path
        self.size = size  # bytes of memory (segment file size) or of the spill file
        self.pins = 0
        self.busy = True
        self.freed = False
        self.rw = None  # the owner's writable mapping (pre-faulted pages, reused when recycled)
        self.ro = None  # weak reference to the owner's read-only mapping (get_value)


class SharedMemoryStore:
    """The owner's object store: inline bytes for small objects, segments for large ones.

    Thread-safe: the owner's I/O thread and user threads may call it at once.

    Example (``oid``: a 28-byte object id)::

        store = SharedMemoryStore(new_session_tag(), 1 << 30, "/tmp/spill")
        store.put_value(oid, numpy.zeros(1 << 20)).kind       # 'shm'
        store.get_value(oid).flags.writeable                  # False: a view of the segment
    """

    def __init__(
        self,
        session_tag: str,
        capacity_bytes: int,
        spill_dir: str,
        *,
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        shm_dir: str = DEFAULT_SHM_DIR,
        fallback_dir: str | None = None,
        recycle_bytes: int | None = None,
        private_top: str | None = None,
    ):
        """``fallback_dir``: where segments go when ``shm_dir`` is unusable (default
        ``<spill_dir>/objects``; the owner passes ``<session dir>/objects``). ``recycle_bytes``:
        most bytes of freed segments kept for reuse (default: a quarter of the capacity, at
        most 1 GiB; 0: off); they count against the capacity and are dropped first for room.
        ``private_top``: the highest directory above ``spill_dir`` and ``fallback_dir`` that
        miniray made for them; it and everything below it are created or checked as private
        directories (default: each of those directories alone).
        """
        self.session_tag = segs.check_tag(session_tag)
        self.capacity = int(capacity_bytes)
        self.inline_threshold = int(inline_threshold)
        self.spill_dir = os.path.abspath(spill_dir)
        self._private_top = os.path.abspath(private_top) if private_top else None
        self.fallback = False
        self.shm_dir = os.path.abspath(shm_dir)
        problem = segs.shm_dir_problem(self.shm_dir, min(self.capacity, _MIN_SHM_FREE))
        if problem:
            self.fallback = True
            fallback = fallback_dir or os.path.join(self.spill_dir, "objects")
            self.shm_dir = os.path.abspath(fallback)
            same_uid.ensure_private_dir(self.shm_dir, top=self._top_of(self.shm_dir))
            logger.warning(
                "miniray object store: %s; keeping large objects in files under %s instead "
                "(slower, disk-backed). Mount a larger /dev/shm (docker run --shm-size=...) to "
                "avoid this.", problem, self.shm_dir,
            )  # fmt: skip
        if not self.fallback and segs.same_filesystem(self.spill_dir, self.shm_dir):
            logger.warning(
                "miniray object store: the spill directory %s is on the same memory-backed "
                "filesystem as %s, so spilling frees no memory; use a disk directory.",
                self.spill_dir, self.shm_dir,
            )  # fmt: skip
        if recycle_bytes is None:
            recycle_bytes = policy.default_recycle_bytes(self.capacity)
        self.recycle_bytes = max(0, int(recycle_bytes))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inline: dict[bytes, bytes] = {}
        self._inline_bytes = 0
        self._entries: dict[bytes, _Entry] = {}
        self._lru: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._used = 0  # bytes of segments (objects in memory, and ones being written)
        self._spilled = 0
        self._pool = segs.SegmentPool(self.shm_dir, self.session_tag)
        self._counts = collections.Counter()
        self._warm: set[_Entry] = set()  # entries holding a writable mapping (set ops: atomic)
        self._lent: dict[str, mmap.mmap] = {}  # recycled_for's segments until adopted
        self._closed = False
        self._oversized_warned = False  # the warning of policy.oversized_message: once
        # Registered as soon as the store exists: the store being garbage or the interpreter
        # exiting removes every file of the tag, in this process only (a fork never does).
        self._finalizer = weakref.finalize(
            self, segs.sweep_tag, self.session_tag, (self.shm_dir, self.spill_dir), os.getpid()
        )
        logger.debug("object store %r", self)

    def _top_of(self, path: str) -> str | None:
        top = self._private_top
        if top and (path == top or path.startswith(top.rstrip(os.sep) + os.sep)):
            return top
        return None

    # --- putting -----------------------------------------------------------------------------

    def put_value(self, object_id: bytes, value: Any) -> StoredObject:
        """Serialize and store ``value``; inline below the threshold, else in a segment.
        ``value`` may be serialized already (``oob.Serialized``).

        Raises ObjectStoreFullError naming the sizes when it cannot fit even after spilling.
        """
        ser = value if isinstance(value, oob.Serialized) else oob.serialize(value)
        if ser.total_size < self.inline_threshold:
            data = oob.inline_blob(ser)
            self.put_serialized(object_id, data)
            return StoredObject(object_id, "inline", len(data))
        return self._put_large(object_id, ser)

    def put_serialized(self, object_id: bytes, data: bytes) -> None:
        """Keep ``data`` (an in-band pickle: a small result, an error) in owner memory."""
        with self._lock:  # a new id (every task's result): nothing to free or check first
            if (object_id not in self._inline and object_id not in self._entries
                    and not self._closed):
                self._inline[object_id] = data
                self._inline_bytes += len(data)
                return
        self.free(object_id)
        with self._lock:
            self._check_replaceable(object_id)
            self._inline[object_id] = data
            self._inline_bytes += len(data)

    def _put_large(self, object_id: bytes, ser: oob.Serialized) -> StoredObject:
        size = ser.total_size
        if policy.oversized(size, self.capacity):
            return self._put_on_disk(object_id, ser)
        self.free(object_id)
        self._refresh_draining(size)
        with self._lock:
            self._check_replaceable(object_id)
            reuse = self._pool.take(size)
            net = reuse.size if reuse else size
            plan = self._plan(net)
            if plan is None:
                if reuse:
                    self._pool.add(reuse)
                raise self._full_error(object_id, size)
            drops, victims = plan
            entry = _Entry(object_id, self._path(object_id), net)
            self._entries[object_id] = entry
            self._used += net
        try:
            self._evict(drops, victims)
            if reuse:
                mapping = segs.write_through_mapping(reuse.path, reuse.size, reuse.mapping, ser)
                os.rename(reuse.path, entry.path)
                if len(self._warm) < _WARM_MAX:
                    entry.rw = mapping
                    self._warm.add(entry)
            else:
                write_segment(entry.path, ser)
        except BaseException as error:
            with self._lock:
                self._entries.pop(object_id, None)
                self._used -= net
                self._cond.notify_all()
            if reuse:
                segs.unlink_quiet(reuse.path)
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.ENOMEM):
                raise segs.no_room_error(self.shm_dir, size, object_id) from error
            raise
        self._counts["recycled" if reuse else "created"] += 1
        return StoredObject(object_id, "shm", self._commit(entry))

    def _put_on_disk(self, object_id: bytes, ser: oob.Serialized) -> StoredObject:
        """Store an object larger than the whole store straight into the spill directory,
        as Ray's fallback allocation does; reads map the file (``get_value``, ``location``).
        """
        size = ser.total_size
        self.free(object_id)
        with self._lock:
            self._check_replaceable(object_id)
            entry = _Entry(object_id, os.path.join(self.spill_dir, os.path.basename(
                self._path(object_id))), size)
            entry.kind = "spilled"
            self._entries[object_id] = entry
            self._spilled += size
            warn = not self._oversized_warned
            self._oversized_warned = True
        try:
            same_uid.ensure_private_dir(self.spill_dir, top=self._top_of(self.spill_dir),
                                        remedy="set TMPDIR to a private directory of your own")
            write_segment(entry.path, ser)
        except BaseException as error:
            with self._lock:
                self._entries.pop(object_id, None)
                self._spilled -= size
                self._cond.notify_all()
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OutOfDiskError(
                    f"Storing object {object_id.hex()} ({segs.mib(size)}, larger than the "
                    f"{segs.mib(self.capacity)} object store) in {self.spill_dir} failed: "
                    f"{error.strerror}. Free disk space there or raise object_store_memory."
                ) from error
            raise
        if warn:
            logger.warning("miniray object store: %s", policy.oversized_message(
                object_id.hex(), size, self.capacity, self.spill_dir))
        with self._lock:
            self._counts["oversized"] += 1
            entry.busy = False
            self._cond.notify_all()
            release = self._detach(entry) if (entry.freed or self._closed) else None
        if release:
            self._release(*release)
        return StoredObject(object_id, "spilled", size)

    def recycled_for(self, object_id: bytes, size: int) -> tuple[str, mmap.mmap] | None:
        """A freed segment of the pool, renamed to ``object_id``'s name, with a writable
        mapping of its pages (kept warm or mapped with MAP_POPULATE), for bytes that arrive
        from elsewhere (a remote task's result): ``(path, mapping)``, or None when none fits.
        Writing into pages that already exist skips the allocation, zeroing and faulting of
        fresh tmpfs pages (about 0.6 ms per MB here). The caller fills at most ``size``
        bytes, then hands the path to ``put_segment_from`` (which keeps the mapping warm for
        the next reuse), or to ``give_up_recycled`` on failure; until then it counts
        nowhere."""
        if policy.oversized(size, self.capacity):
            return None
        self._refresh_draining(size)
        with self._lock:
            if self._closed or object_id in self._entries:
                return None
            reuse = self._pool.take(size)
        if reuse is None:
            return None
        path = self._path(object_id)
        try:
            os.rename(reuse.path, path)
            mapping = reuse.mapping
            if mapping is None:
                mapping = segs.writable_mapping(path, reuse.size)
        except OSError:
            segs.unlink_quiet(reuse.path)
            segs.unlink_quiet(path)
            return None
        self._counts["recycled"] += 1
        self._lent[path] = mapping
        return path, mapping

    def give_up_recycled(self, path: str) -> None:
        """A segment ``recycled_for`` lent that will not be adopted: unlink it."""
        self._lent.pop(path, None)
        segs.unlink_quiet(path)

    def make_room(self, object_id: bytes, size: int) -> None:
        """Before ``size`` bytes are received into a new segment (a value pulled from the
        node that kept it): drop pooled segments and spill objects as a put of that size
        would; ObjectStoreFullError (a put's text) when they cannot make room. Nothing is
        reserved: ``put_segment_from`` then adopts it, over the capacity if another put took
        the room meanwhile. An object larger than the whole store needs no room (adopted
        straight into the spill directory)."""
        if policy.oversized(size, self.capacity):
            return
        with self._lock:
            plan = self._plan(size)
            if plan is None:
                raise self._full_error(object_id, size)
            drops, victims = plan
        self._evict(drops, victims)

    def put_segment_from(self, object_id: bytes, name: str, size: int) -> None:
        """Adopt a segment a worker created for ``object_id``; the store now owns it.

        ``name`` is what ``create_segment`` returned. Adoption never fails for lack of room:
        the least recently used objects (this one last) are spilled until the store fits. A
        segment larger than the whole store is spilled at once, and nothing else for it.
        A segment ``recycled_for`` lent keeps its writable mapping for its next reuse.
        """
        path, actual = segs.check_adoptable(name, size, self.shm_dir, self.session_tag)
        mapping = self._lent.pop(path, None) if self._lent else None
        self.free(object_id)
        if policy.oversized(actual, self.capacity):
            with self._lock:
                self._check_replaceable(object_id)
                entry = _Entry(object_id, path, actual)  # busy; _spill counts it as spilled
                self._entries[object_id] = entry
                warn = not self._oversized_warned
                self._oversized_warned = True
                self._counts["adopted"] += 1
                self._counts["oversized"] += 1
            if warn:
                logger.warning("miniray object store: %s", policy.oversized_message(
                    object_id.hex(), actual, self.capacity, self.spill_dir))
            self._evict([], [entry])  # on failure it stays in memory, over the capacity
            return
        with self._lock:
            self._check_replaceable(object_id)
            entry = _Entry(object_id, path, actual)
            self._entries[object_id] = entry
            self._used += actual
            self._lru[object_id] = None
            entry.busy = False
            if mapping is not None and len(self._warm) < _WARM_MAX:
                entry.rw = mapping
                self._warm.add(entry)
            drops, victims = self._plan(0, allow_over=True)
        self._counts["adopted"] += 1
        self._evict(drops, victims)

    def _path(self, object_id: bytes) -> str:
        return os.path.join(self.shm_dir, segment_name(self.session_tag, object_id))

    def _commit(self, entry: _Entry) -> int:
        """Under the lock: a write finished; a free() that arrived meanwhile runs now."""
        with self._lock:
            entry.busy = False
            self._lru[entry.object_id] = None
            self._cond.notify_all()
            release = self._detach(entry) if (entry.freed or self._closed) else None
        if release:
            self._release(*release)
        return entry.size

    # --- decisions (under the lock) ------------------------------------------------------------

    def _plan(self, need: int, allow_over: bool = False) -> tuple[list, list[_Entry]] | None:
        """Choose pooled segments to drop and objects to spill so ``need`` more bytes fit.

        Marks the victims busy and does the accounting now; ``_evict`` acts later. None if
        they cannot; with ``allow_over`` (adoption: the bytes exist) it spills what it can.
        """
        pool = self._pool.sizes()
        candidates = []
        for oid in self._lru:  # least recently used first
            entry = self._entries[oid]
            viewed = entry.ro is not None and entry.ro() is not None  # spill frees nothing
            if entry.kind == "shm" and not entry.busy and not entry.pins and not viewed:
                candidates.append((oid, entry.size))
        plan = policy.plan_room(need, self.capacity, self._used, pool, candidates, allow_over)
        if plan is None:
            return None
        drop_idx, victim_ids = plan
        drops = self._pool.remove(drop_idx)
        victims = []
        for oid in victim_ids:
            entry = self._entries[oid]
            entry.busy = True
            self._lru.pop(oid, None)
            self._used -= entry.size
            victims.append(entry)
        return drops, victims

    def _detach(self, entry: _Entry) -> tuple[_Entry, bool]:
        """Remove ``entry`` from the table; returns what ``_release`` needs afterwards."""
        if self._entries.get(entry.object_id) is entry:  # not a newer object of the same id
            del self._entries[entry.object_id]
            self._lru.pop(entry.object_id, None)
        if entry.kind == "shm":
            self._used -= entry.size
        else:
            self._spilled -= entry.size
        recycle = entry.kind == "shm" and not self._closed and self._may_recycle(entry.size)
        return entry, recycle

    def _may_recycle(self, size: int) -> bool:
        return policy.may_recycle(
            size, used=self._used, pooled=self._pool.bytes, pooled_count=len(self._pool),
            capacity=self.capacity, recycle_bytes=self.recycle_bytes,
        )  # fmt: skip

    def _full_error(self, object_id: bytes, size: int) -> ObjectStoreFullError:
        shm = [e for e in self._entries.values() if e.kind == "shm"]
        pinned, busy = sum(e.size for e in shm if e.pins), sum(e.size for e in shm if e.busy)
        return ObjectStoreFullError(
            policy.full_message(object_id.hex(), size, self._used, self.capacity, pinned, busy)
        )

    # --- acting (outside the lock) -------------------------------------------------------------

    def _evict(self, drops: list[segs.Pooled], victims: list[_Entry]) -> None:
        segs.discard(drops)
        for i, entry in enumerate(victims):
            try:
                self._spill(entry)
            except BaseException:
                with self._lock:
                    for undone in victims[i:]:
                        undone.busy = False
                        self._used += undone.size
                        self._lru[undone.object_id] = None
                    self._cond.notify_all()
                raise

    def _spill(self, entry: _Entry) -> None:
        started = time.monotonic()
        target = segs.spill_copy(entry.path, self.spill_dir, entry.size, entry.object_id.hex(),
                                 self._top_of(self.spill_dir))
        self._cool(entry)
        entry.ro = None
        segs.unlink_quiet(entry.path)
        logger.debug("spilled %s (%s) to %s", entry.object_id.hex(), segs.mib(entry.size), target)
        with self._lock:
            entry.kind, entry.path = "spilled", target
            self._spilled += entry.size
            self._counts["spilled"] += 1
            self._counts["bytes_spilled"] += entry.size
            self._counts["spill_seconds"] += time.monotonic() - started
            entry.busy = False
            self._cond.notify_all()
            release = self._detach(entry) if (entry.freed or self._closed) else None
        if release:
            self._release(*release)

    def _release(self, entry: _Entry, recycle: bool) -> None:
        """Unlink (or recycle) a detached entry's file. Never called under the lock."""
        entry.ro = None
        if not recycle:
            self._cool(entry)
            segs.unlink_quiet(entry.path)
            return
        pool_path = self._pool.new_path()
        ready = segs.retire_for_reuse(entry.path, pool_path)
        if ready is not None:
            # A segment a reader still maps (a worker that took it as an argument, until
            # the owner's UNMAP reaches it) waits in the pool as draining: reused once
            # nobody maps it, so a loop of calls with a large argument writes into pages
            # that already exist instead of faulting in new ones for every call.
            with self._lock:
                if not self._closed and self._may_recycle(entry.size):
                    self._pool.add(segs.Pooled(pool_path, entry.size, entry.rw,
                                               draining=not ready))
                    self._cool(entry)  # the mapping now belongs to the pool
                    return
            segs.unlink_quiet(pool_path)
        self._cool(entry)

    def _refresh_draining(self, size: int) -> None:
        """Mark pooled segments that no reader maps any more reusable (the checks, one
        ``flock`` each, run outside the lock; a segment taken meanwhile is skipped). When
        none is ready for ``size`` bytes but a draining one would do, wait a little for it
        (``policy.drain_wait_s``): a worker unmaps its argument as soon as the owner's UNMAP
        reaches it, which a put right after ``get`` of the task's result often beats."""
        with self._lock:
            draining = self._pool.draining()
            ready = self._pool.has_reusable(size)
        if not draining:
            return
        free = [p for p in draining if not segs.mapped_elsewhere(p.path)]
        wanted = None
        if not ready and policy.pick_reusable(size, [(p, p.size) for p in free]) is None:
            # Never twice for one segment: a reader that kept its view (a task that stored
            # its argument) would otherwise cost every put the wait until the segment expires.
            wanted = policy.pick_reusable(
                size, [(p, p.size) for p in draining if p not in free and not p.waited])
        if wanted is not None:
            wanted.waited = True
            deadline = time.monotonic() + policy.drain_wait_s(size)
            while time.monotonic() < deadline:
                time.sleep(0.0005)
                if not segs.mapped_elsewhere(wanted.path):
                    free.append(wanted)
                    break
        if free:
            with self._lock:
                self._pool.drained(free)

    def _cool(self, entry: _Entry) -> None:
        entry.rw = None
        self._warm.discard(entry)

    # --- reading ------------------------------------------------------------------------------

    def get_value(self, object_id: bytes) -> Any:
        """The value; large arrays are read-only views of the segment (no copy).

        A spilled object is restored into shared memory first (spilling others if needed);
        if nothing can make room it is read from its spill file, still without a copy.
        Raises KeyError when the store does not hold ``object_id``.
        """
        data = restore = mapping = None
        with self._cond:
            entry = self._wait_ready(object_id)
            if entry is None:
                data = self._inline[object_id]
            elif entry.kind == "spilled" and not entry.pins:  # _plan marks victims: act on it
                restore = self._plan(entry.size)
            if restore is not None:
                entry.busy = True
                self._used += entry.size
                self._spilled -= entry.size
            elif entry is not None:
                entry.pins += 1
                if entry.kind == "shm":
                    self._lru.move_to_end(object_id)
                mapping = entry.ro() if entry.ro is not None else None
                path = entry.path
        if data is not None:
            return oob.loads_inline(data)
        if restore:
            self._restore(entry, *restore)
            return self.get_value(object_id)
        try:
            if mapping is None:
                mapping = segs.map_readonly(path)
            return segs.load_mapping(mapping, path)
        finally:
            self._unpin(entry, cache=mapping if entry.kind == "shm" else None)

    def _wait_ready(self, object_id: bytes) -> _Entry | None:
        """Under the lock: the entry once no operation moves it (None: an inline object)."""
        while True:
            if object_id in self._inline:
                return None
            entry = self._entries.get(object_id)
            if entry is None:
                raise KeyError(object_id)
            if not entry.busy:
                return entry
            self._cond.wait()

    def _restore(self, entry: _Entry, drops: list[segs.Pooled], victims: list[_Entry]) -> None:
        spill_path, path = entry.path, self._path(entry.object_id)
        started = time.monotonic()
        try:
            self._evict(drops, victims)
            segs.copy_file(spill_path, path, entry.size)
        except BaseException:
            with self._lock:
                entry.busy = False
                self._used -= entry.size
                self._spilled += entry.size
                self._cond.notify_all()
            raise
        segs.unlink_quiet(spill_path)
        logger.debug("restored %s (%s)", entry.object_id.hex(), segs.mib(entry.size))
        with self._lock:
            entry.kind, entry.path = "shm", path
            self._counts["restored"] += 1
            self._counts["bytes_restored"] += entry.size
            self._counts["restore_seconds"] += time.monotonic() - started
        self._commit(entry)

    def inline_bytes(self, object_id: bytes) -> bytes:
        """The in-band bytes of an inline object (KeyError if absent, TypeError if it is in
        shared memory): for the small values known to be inline, such as errors. Any object's
        payload is ``location()``'s."""
        data = self._inline.get(object_id)  # one dict lookup: atomic, no lock needed
        if data is None:
            if object_id in self._entries:
                raise TypeError(
                    f"object {object_id.hex()} is in shared memory, not inline: "
                    "use location() or get_value()"
                )
            raise KeyError(object_id)
        return data

    def inline_or_none(self, object_id: bytes) -> bytes | None:
        """The in-band bytes of an inline object, None for any other (absent, or in shared
        memory: ``location()`` then): the per-object step of a get of many small values."""
        return self._inline.get(object_id)  # one dict lookup: atomic, no lock needed

    def location(self, object_id: bytes) -> tuple:
        """What a reader in another process needs: ``("inline", bytes)``,
        ``("shm", path, size)`` or ``("spilled", path, size)``.

        Pin the object before handing out a path, and unpin once the reader has it mapped:
        an unpinned object may be spilled (its segment unlinked) at any moment.
        """
        with self._cond:
            entry = self._wait_ready(object_id)
            if entry is None:
                return ("inline", self._inline[object_id])
            if entry.kind == "shm":
                self._lru.move_to_end(object_id)
            return (entry.kind, entry.path, entry.size)

    def contains(self, object_id: bytes) -> bool:
        return object_id in self._inline or object_id in self._entries  # atomic lookups

    def pin(self, object_id: bytes) -> None:
        """Mark as being read: not spilled, moved or unlinked until ``unpin``. KeyError if
        absent; a no-op for inline objects."""
        with self._cond:
            entry = self._wait_ready(object_id)
            if entry is not None:
                entry.pins += 1

    def unpin(self, object_id: bytes) -> None:
        with self._lock:
            entry = self._entries.get(object_id)
        if entry is not None:
            self._unpin(entry)

    def _unpin(self, entry: _Entry, cache: mmap.mmap | None = None) -> None:
        with self._lock:
            if entry.pins <= 0:
                raise RuntimeError(
                    f"unpin of object {entry.object_id.hex()} that is not pinned: "
                    "this is a bug in miniray"
                )
            entry.pins -= 1
            if cache is not None and entry.kind == "shm":
                # Weak: while the caller's arrays live, the next get reuses this mapping (the
                # same address); once they are gone the mapping and its lock go too.
                entry.ro = weakref.ref(cache)
            release = None
            if not entry.pins and entry.freed and not entry.busy:
                release = self._detach(entry)
        if release:
            self._release(*release)

    # --- freeing -------------------------------------------------------------------------------

    def free(self, object_id: bytes) -> None:
        """Forget the object and remove its segment or spill file; idempotent. The removal
        waits for the last ``unpin`` of a pinned object."""
        with self._lock:
            data = self._inline.pop(object_id, None)
            if data is not None:
                self._inline_bytes -= len(data)
                return
            entry = self._entries.get(object_id)
            if entry is None:
                return
            if entry.busy or entry.pins:
                entry.freed = True
                return
            release = self._detach(entry)
        self._release(*release)

    def pooled_segments(self) -> int:
        """How many freed segments are kept for reuse (cheap: for the owner's idle tick)."""
        return len(self._pool)

    def trim_pool(self, max_idle_s: float = 0.0) -> int:
        """Unlink recycled segments unused for ``max_idle_s`` seconds; returns bytes freed.

        The owner calls it from a periodic tick, so idle memory goes back to the system.
        """
        with self._lock:
            idle = self._pool.take_idle(max_idle_s)
        return segs.discard(idle)

    def close(self) -> None:
        """Free everything and unlink every file of the session tag (crashed workers' too)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entries = [self._detach(e)[0] for e in list(self._entries.values()) if not e.busy]
            pool = self._pool.take_idle(0.0)
            self._inline.clear()
            self._inline_bytes = 0
            self._cond.notify_all()
        for entry in entries:
            self._release(entry, False)
        segs.discard(pool)
        self._finalizer()  # sweeps the tag from shm_dir and spill_dir, then detaches itself
        logger.debug("object store closed: %r", self)

    def _check_replaceable(self, object_id: bytes) -> None:
        """Under the lock, after ``free``: the id is gone unless it is being read or moved."""
        if self._closed:
            raise RuntimeError("the object store is closed (miniray was shut down)")
        if object_id in self._entries:
            raise RuntimeError(
                f"object {object_id.hex()} is still being read or moved and cannot be "
                "replaced: this is a bug in miniray"
            )

    # --- observing ------------------------------------------------------------------------------

    def sizes(self) -> dict[bytes, int]:
        """Each stored object's size in bytes (inline payloads, segments, spill files), for
        ``ray.util.state.list_objects`` and ``miniray memory``."""
        with self._lock:
            out = {object_id: len(data) for object_id, data in self._inline.items()}
            out.update((object_id, e.size) for object_id, e in self._entries.items())
            return out

    def usage(self) -> tuple[int, int]:
        """``(bytes in memory, capacity)``, read without the lock (a sample for a timer)."""
        return self._inline_bytes + self._used, self.capacity

    def statistics(self) -> dict:
        with self._lock:
            segments = sum(1 for e in self._entries.values() if e.kind == "shm")
            return {
                "objects": len(self._inline) + len(self._entries),
                "bytes_in_memory": self._inline_bytes + self._used,
                "bytes_spilled": self._spilled,
                "pinned": sum(1 for e in self._entries.values() if e.pins),
                "capacity": self.capacity,
                "segments": segments,
                "fallback": self.fallback,
                "shm_dir": self.shm_dir,
                "spill_dir": self.spill_dir,
                "inline_threshold": self.inline_threshold,
                "inline_objects": len(self._inline),
                "bytes_inline": self._inline_bytes,
                "bytes_shm": self._used,
                "spilled_objects": len(self._entries) - segments,
                "pooled_segments": len(self._pool),
                "draining_segments": len(self._pool.draining()),
                "bytes_pooled": self._pool.bytes,
                "segments_created": self._counts["created"],
                "segments_recycled": self._counts["recycled"],
                "segments_adopted": self._counts["adopted"],
                "spills": self._counts["spilled"],
                "restores": self._counts["restored"],
                # Totals since start, as Ray's `ray memory` reports them (its throughputs).
                "bytes_spilled_total": self._counts["bytes_spilled"],
                "spill_seconds": self._counts["spill_seconds"],
                "bytes_restored_total": self._counts["bytes_restored"],
                "restore_seconds": self._counts["restore_seconds"],
                "oversized": self._counts["oversized"],
            }

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("fallback" if self.fallback else "shm")
        mib = segs.mib
        return (
            f"<SharedMemoryStore {self.session_tag} {state} dir={self.shm_dir} "
            f"objects={len(self._inline) + len(self._entries)} inline={len(self._inline)} "
            f"shm={mib(self._used)}/{mib(self.capacity)} spilled={mib(self._spilled)} "
            f"pooled={mib(self._pool.bytes)}>"
        )
