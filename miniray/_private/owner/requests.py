"""What the owner does for a worker's own requests: get, wait, calls, and shared reads.

Owns: a worker blocked in ``get()``/``wait()`` (its CPU goes back to the ledger until the
reply), the waits of a cancelled call (answered ``CANCELLED``), replies to CALL requests,
the store pins of the objects a worker maps (task arguments, get replies) and which workers
map which segment (told to unmap when the object is freed).
Does not own: the objects (``object_table.py``), the store, the workers (``workers.py``), the
leases (``leases.py``) or scheduling (``owner.py``); it is given them at construction.
Called by: ``owner.Owner`` from the I/O thread, and ``actors.py``, with the owner's lock held;
``remote_requests.py`` (``actor_request``, locked) for a worker on another host.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from miniray._private.core import protocol, scheduling, serialization
from miniray._private.object_store import shm_segments
from miniray._private.owner.object_table import CallbackWaiter

ACTOR_CALLS = frozenset((protocol.CALL_CREATE_ACTOR, protocol.CALL_KILL_ACTOR,
                         protocol.CALL_GET_ACTOR, protocol.CALL_LIST_NAMED_ACTORS))


def actor_request(actors, method: int, args: tuple, creator=None) -> tuple:
    """*Locked.* A worker's actor request (one of ACTOR_CALLS: create, kill, get_actor,
    list_named_actors) as the owner serves it, for a worker on this node or another host
    (``remote_requests.py``). Returns ``(value, None)``: answered now; or ``(None, (request,
    request_args, keep))``: the caller makes ``request(*request_args)`` of the node's actor
    service once the lock is released (it waits for the service's reply), then, with the
    lock, ``actors.keep_for_workers(keep(value))`` unless ``keep`` is None (the worker now
    holds a handle to that actor). Raises what the request raises (e.g. ValueError for a
    name nobody holds, ActorAlreadyExistsError). ``creator``: the worker asking to create an
    actor, whose process's death takes the actor along (``ActorManager.creator_gone``)."""
    in_service = actors.link is not None  # joined to a node: ask its actor service
    if method == protocol.CALL_CREATE_ACTOR:
        if actors.is_node_actor(args[0]):
            return None, (actors.create_in_service, (args[0],), _same)
        return actors.create(args[0], creator), None
    if method == protocol.CALL_KILL_ACTOR:
        if actors.kill(args[0], args[1]):
            return None, (actors.kill_in_service, tuple(args), None)
        return None, None
    if method == protocol.CALL_GET_ACTOR:
        if in_service:
            return None, (actors.lookup_in_service, tuple(args), _first)
        value = actors.lookup(args[0], args[1])
        actors.keep_for_workers(value[0])
        return value, None
    if method == protocol.CALL_LIST_NAMED_ACTORS:
        if in_service:
            return None, (actors.named_in_service, (args[1], args[0]), None)
        return actors.named(args[1], args[0]), None
    raise ValueError(f"not an actor request: {protocol.tag_name('call', method)}")


def _same(value):
    return value


def _first(value):
    return value[0]


class WorkerRequests:
    """``send(worker, message)`` writes to a worker without blocking; ``defer(action)`` runs
    an action once the owner's lock is released, ``ledger_later(method, *args)`` a ledger
    transaction; ``dispatch_all()`` sends queued work; ``cancel(object_id, force,
    recursive)`` and ``release_idle_leases(force=...)`` are the owner's, and
    ``on_unblock(worker)``, told when a worker's last get/wait ended (its key's queue may go
    behind its running task again)."""

    def __init__(self, *, objects, store, reactor, workers, leases, ledger, actors, lock,
                 send, defer, ledger_later, dispatch_all, cancel, release_idle_leases,
                 hello_info: dict, streams, on_unblock: Callable[[Any], None] = lambda w: None):
        self.objects = objects
        self.store = store
        self.reactor = reactor
        self.workers = workers
        self.leases = leases
        self.ledger = ledger
        self.actors = actors
        self.hello_info = hello_info
        self.streams = streams
        self._lock = lock
        self.send = send
        self.defer = defer
        self._ledger_later = ledger_later
        self._dispatch_all = dispatch_all
        self._cancel_locked = cancel
        self._release_idle_leases = release_idle_leases
        self._on_unblock = on_unblock
        self.placement_groups: Callable[[], Any] = lambda: None  # the owner's, once set
        # Workers that were handed a segment (they may keep it mapped across tasks): told
        # to drop the mapping when the object is freed, so its memory really goes back.
        self.mapped_by: dict[bytes, list] = {}

    def prune_mapped(self) -> None:
        """Drop records of objects freed without a reader (they pile up otherwise)."""
        if self.mapped_by and len(self.mapped_by) > 4 * len(self.objects) + 64:
            live = self.objects.entries
            self.mapped_by = {k: v for k, v in self.mapped_by.items() if k in live}

    def on_borrow(self, worker, added, dropped, escaped, handles=()) -> None:
        """A worker now holds refs to ``added``, no longer to ``dropped``; ``escaped`` were
        pickled where nobody tracks them (kept until shutdown). ``handles``: its actor handle
        events, counted with the driver's (``actor_handles.ActorHandles.worker_handles``)."""
        if handles:
            self.actors.worker_handles(handles)
        objects = self.objects
        for object_id in added:
            if object_id not in worker.borrowed and objects.borrow(object_id):
                worker.borrowed.add(object_id)
        for object_id in escaped:
            objects.escape(object_id)
        for object_id in dropped:
            if object_id in worker.borrowed:
                worker.borrowed.discard(object_id)
                objects.unborrow(object_id)

    def dep_payloads(self, deps, pin: bool, worker=None) -> list:
        """``[(position, kind, payload)]`` of a call's argument objects. With ``pin``, they
        stay in shared memory (not spilled) until ``unpin_deps``: the worker maps them."""
        out = []
        for position, object_id in deps:
            if pin:
                self.store.pin(object_id)
            kind, payload = self.objects.read(object_id)
            if worker is not None and isinstance(payload, tuple):
                self._note_mapped(object_id, worker)
            out.append((position, kind, payload))
        return out

    def _note_mapped(self, object_id: bytes, worker) -> None:
        readers = self.mapped_by.setdefault(object_id, [])
        if worker not in readers:
            readers.append(worker)

    def object_freed(self, object_id: bytes) -> None:
        readers = self.mapped_by.pop(object_id, None)
        if not readers:
            return
        path = os.path.join(self.store.shm_dir,
                            shm_segments.segment_name(self.store.session_tag, object_id))
        for worker in readers:
            if not worker.dead:
                try:
                    self.send(worker, (protocol.UNMAP, path))
                except OSError:
                    pass

    def unpin_deps(self, deps) -> None:
        self.unpin_ids(object_id for _position, object_id in deps)

    def unpin_ids(self, object_ids) -> None:
        """Undo ``store.pin`` (an object freed meanwhile is skipped)."""
        for object_id in object_ids:
            try:
                self.store.unpin(object_id)
            except KeyError:
                pass

    def release_read_pins(self, worker) -> None:
        pins, worker.read_pins = worker.read_pins, []
        self.unpin_ids(pins)

    def _block(self, worker) -> None:
        worker.blocked += 1
        if worker.blocked == 1:
            self.workers.blocked += 1
            self.leases.window.note_release()  # the cap on workers just moved
        slot = worker.lease
        if worker.blocked == 1 and slot is not None:
            # Its CPU only (a bundle's CPU in a placement group), as in Ray: GPUs and custom
            # resources stay with the blocked task.
            given = {name: units / 10000.0 for name, units in
                     scheduling.blocked_release(slot.lease.resources).items()}
            if given:
                self._ledger_later(self.ledger.adjust, slot.lease.lease_id,
                                   {name: -amount for name, amount in given.items()})
                slot.cpu_released = given
        if worker.blocked == 1:
            self._dispatch_all()

    def _unblock(self, worker) -> None:
        worker.blocked -= 1
        if worker.blocked == 0:
            self.workers.blocked -= 1
        slot = worker.lease
        if worker.blocked == 0 and slot is not None and slot.cpu_released:
            self._ledger_later(self.ledger.adjust, slot.lease.lease_id, slot.cpu_released)
            slot.cpu_released = None

    def _unblock_and_reply(self, worker, req_id: int, payload) -> None:
        """End one of ``worker``'s waits with its reply; once it waits for nothing, its
        key's queued tasks may be sent to it again, after the reply (a task that reached it
        while blocked would only be handed back)."""
        self._unblock(worker)
        self._reply(worker, req_id, payload)
        if worker.blocked == 0:
            self._on_unblock(worker)

    def _reply(self, worker, req_id: int, payload) -> None:
        try:
            self.send(worker, (protocol.REPLY, req_id, payload))
        except OSError:
            pass

    # -- get and wait ---------------------------------------------------------------------
    # A non-forced cancel reaches a call blocked in get()/wait(): Ray raises KeyboardInterrupt
    # there, in tasks and in sync or threaded actor calls alike, and again at each later get
    # or wait of that call. The worker names the waiting call in its request, so the owner
    # answers the pending waits of a cancelled call, and its later ones, with CANCELLED.
    def interrupt(self, worker, task_id: bytes) -> None:
        """*Locked.* ``task_id`` running on ``worker`` was cancelled: end its waits."""
        worker.interrupted.add(task_id)
        for req_id, (waiting, abandon) in list(worker.waits.items()):
            if waiting == task_id and abandon():
                del worker.waits[req_id]
                self._unblock_and_reply(worker, req_id, protocol.CANCELLED)

    def call_ended(self, worker, task_id: bytes) -> None:
        """*Locked.* The call sent its result: nothing of it waits any more."""
        worker.interrupted.discard(task_id)

    def _answer_cancelled(self, worker, req_id, task_id) -> bool:
        if task_id is None or task_id not in worker.interrupted:
            return False
        self._reply(worker, req_id, protocol.CANCELLED)
        return True

    def _await(self, worker, req_id, task_id, object_ids, count: int, on_error: bool,
               timeout, answer) -> None:
        """*Locked.* Reply ``answer(timed_out)`` to request ``req_id`` once ``count`` of
        ``object_ids`` are ready (or at the first error if ``on_error``, or past
        ``timeout``). Answered at once when they are ready: as in Ray, a wait of ready
        objects gives nothing back, so no other worker is started for a CPU freed for a
        moment. Otherwise the worker is blocked meanwhile (its CPU goes back, ``_block``),
        and a cancel of call ``task_id`` ends the wait (``interrupt``)."""
        blocked = False

        def finish(timed_out: bool) -> None:
            worker.waits.pop(req_id, None)
            payload = answer(timed_out)
            if blocked:
                self._unblock_and_reply(worker, req_id, payload)
            else:
                self._reply(worker, req_id, payload)

        abandon = self.objects.await_objects(object_ids, count, on_error, finish, timeout,
                                             self.reactor.call_later)
        if abandon is None:  # answered already
            return
        blocked = True
        self._block(worker)
        if task_id is not None:
            worker.waits[req_id] = (task_id, abandon)

    def on_get(self, worker, req_id, object_ids, timeout, task_id=None) -> None:
        """*Locked.* A worker's ``get()`` (``_await``): the values, or the first error."""
        if self._answer_cancelled(worker, req_id, task_id):
            return

        def answer(timed_out: bool):
            if timed_out:
                return protocol.TIMEOUT
            payload = []
            for object_id in self.objects.ready_ids(object_ids):
                if object_id not in self.objects.entries:  # freed: the worker's get raises
                    lost = serialization.dumps(self.objects.lost(object_id))
                    return [(protocol.ERR, lost)]
                item = self.objects.read(object_id)
                if item[0] == protocol.ERR:
                    return [item]
                if isinstance(item[1], tuple):  # mapped by the worker: keep it in place
                    self.store.pin(object_id)
                    worker.read_pins.append(object_id)
                    self._note_mapped(object_id, worker)
                payload.append(item)
            return payload

        self._await(worker, req_id, task_id, object_ids, len(object_ids), True, timeout,
                    answer)

    def on_wait(self, worker, req_id, object_ids, num_returns, timeout, task_id=None) -> None:
        """*Locked.* A worker's ``wait()`` (``_await``): the ids that are ready."""
        if self._answer_cancelled(worker, req_id, task_id):
            return
        self._await(worker, req_id, task_id, object_ids, num_returns, False, timeout,
                    lambda _timed_out: self.objects.ready_ids(object_ids))

    def _ask_service(self, worker, req_id, request, *args, keep=None) -> None:
        """*Locked.* Make ``request(*args)`` to the node's actor service once the lock is
        released (it waits for the service's reply), then answer the worker; ``keep(value)``
        names an actor the worker now holds a handle to."""
        def ask():
            try:
                result = (True, request(*args))
            except Exception as error:
                result = (False, error)
            with self._lock:
                if result[0] and keep is not None:
                    self.actors.keep_for_workers(keep(result[1]))
                self._reply(worker, req_id, result)
        self.defer(ask)

    def _route_first(self, spec) -> bool:
        """*Locked.* Whether a worker's actor in a placement group waits for the group to be
        looked up first (``placement_group_nodes.needs_route``: a detached group of the
        node's actor service, got by handle, goes there as the driver's own actors do)."""
        pgs = self.placement_groups()
        return getattr(spec, "pg", None) is not None and pgs is not None and \
            pgs.needs_route(spec.placement)

    def _create_routed(self, worker, req_id, args) -> None:
        """*Not locked.* ``route_served`` (a ledger read, maybe a request to the service),
        then the worker's CREATE as ``on_call`` serves it."""
        try:
            self.placement_groups().route_served(args[0].placement)
        except Exception:  # noqa: BLE001 - not routed: placed by this driver as before
            pass
        with self._lock:
            try:
                value, ask = actor_request(self.actors, protocol.CALL_CREATE_ACTOR, args,
                                           worker)
                if ask is not None:
                    request, ask_args, keep = ask
                    self._ask_service(worker, req_id, request, *ask_args, keep=keep)
                    return
                self._reply(worker, req_id, (True, value))
            except Exception as error:
                self._reply(worker, req_id, (False, error))

    def _placement_call(self, worker, req_id, args) -> None:
        """*Not locked.* A worker's placement group call (``placement_call``)."""
        try:
            result = (True, placement_call(self.placement_groups(), args))
        except Exception as error:
            result = (False, error)
        with self._lock:
            self._reply(worker, req_id, result)

    def _reply_available(self, worker, req_id) -> None:
        """*Not locked.* ``available_resources()`` for a worker, after idle leases went back."""
        value = self.ledger.available()
        with self._lock:
            self._reply(worker, req_id, (True, value))

    def _stream_wait(self, worker, req_id, task_id: bytes, index: int, timeout) -> None:
        """A worker's ``next()`` of a streaming call waits, blocked like a ``get()``; its
        REPLY is ``(True, state)``, state as ``Streams.next`` (None: the timeout passed)."""
        self._block(worker)

        def finish() -> None:
            self.streams.remove_waiter(task_id, waiter)
            self._unblock_and_reply(worker, req_id, (True, self.streams.next(task_id, index)))

        waiter = CallbackWaiter(1, False, finish)
        self.streams.add_waiter(task_id, waiter)
        if timeout is not None and timeout >= 0:

            def expire() -> None:
                if not waiter.fired:
                    waiter.fired = True
                    finish()

            self.reactor.call_later(timeout, expire)

    def on_call(self, worker, req_id, method, args) -> None:
        try:
            if method == protocol.CALL_CREATE_ACTOR and self._route_first(args[0]):
                self.defer(lambda: self._create_routed(worker, req_id, args))
                return
            if method in ACTOR_CALLS:
                value, ask = actor_request(self.actors, method, args, worker)
                if ask is not None:
                    request, ask_args, keep = ask
                    self._ask_service(worker, req_id, request, *ask_args, keep=keep)
                    return
            elif method == protocol.CALL_CANCEL:
                self._cancel_locked(*args)  # (object_id, force, recursive)
                value = None
            elif method == protocol.CALL_CLUSTER_RESOURCES:
                value = self.ledger.capacity()  # a file read, no lock
            elif method == protocol.CALL_AVAILABLE_RESOURCES:
                self._release_idle_leases(force=True)
                self.defer(lambda: self._reply_available(worker, req_id))  # once released
                return
            elif method == protocol.CALL_NODES:
                value = self.hello_info.get("nodes", [])
            elif method == protocol.CALL_PLACEMENT_GROUP:
                self.defer(lambda: self._placement_call(worker, req_id, args))  # ledger I/O
                return
            elif method == protocol.CALL_STREAM_NEXT:
                value = self.streams.next(args[0], args[1])
                if value is None:  # answered when the value or the call's end is there
                    self._stream_wait(worker, req_id, *args)
                    return
            else:
                raise ValueError(f"unknown call {protocol.tag_name('call', method)}")
            self._reply(worker, req_id, (True, value))
        except Exception as error:
            self._reply(worker, req_id, (False, error))


def placement_call(pgs, args):
    """*Not locked* (ledger I/O, and other nodes' answers for a group across nodes): the
    value of a worker's ``CALL_PLACEMENT_GROUP`` (``args``: op, then its arguments), asked
    of the owner's placement groups ``pgs`` as the driver's own call would be; a ``wait``
    is one look (the worker polls). Raises what the call raises. Used for workers on this
    node (``Requests``) and on other hosts (``remote_requests``)."""
    op, rest = args[0], args[1:]
    if op == "create":
        return pgs.create(*rest)
    if op == "ready":
        return pgs.ready_object(rest[0].id.hex(), rest[0])
    if op == "wait":
        return pgs.wait(rest[0], 0)
    if op == "remove":
        return pgs.remove(rest[0])
    if op == "lookup":
        return pgs.lookup(rest[0])
    if op == "table":
        return pgs.table()
    if op == "bundles":
        value = pgs.bundles_of(rest[0])
        if value is None:
            raise ValueError(f"Placement group {rest[0]} does not exist.")
        return value
    raise ValueError(f"unknown placement group call {op!r}")
