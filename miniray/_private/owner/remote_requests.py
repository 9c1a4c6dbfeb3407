"""What the driver does for a task or an actor on another host that asks it for something.

Owns: serving one remote task's requests while the driver waits for its RESULT, or an
actor's on another host for its worker's life (``task`` None): nested tasks (SUBMIT,
under the remote task as parent, or the actor call that submits), actor calls
(ACTOR_SUBMIT), ``put`` (PUT: the object is the driver's), ``get`` and ``wait`` (GET,
WAIT: this thread blocks, never the owner's I/O thread or lock), a few CALLs (actors
created, killed and looked up among them), and the
refs the worker holds (BORROW: borrowed from the driver's object table until the worker
drops them or the task ends). Values travel over the worker's MAC'd data connection:
small ones inline, a large one's bytes in frames after its message (as a task's
arguments and results do).
Does not own: running the task there (lease, spawn, TASK, RESULT, retries:
``remote_nodes.py``), the objects (``object_table.py``), scheduling (``owner.py``), or the
worker's side (``worker/worker_api.py``: ``Channel._with_bulk``, ``send_bulk``).
Called by: ``remote_nodes.RemoteNodes._call``, in the task's thread, not locked: ``serve``
for each message of the worker that is not READY or its RESULT, ``contain`` with RESULT,
``end`` when the call ends however it ends; ``remote_actors.RemoteActors._read``, in the
actor's reader thread, not locked: ``serve`` for each request, GET and WAIT on a helper
thread (``remote_actors._Blocking``), ``end`` when the worker ended.

Steps for one message of the remote worker W of task T (W's half: ``worker_api.py``)::

    1. BORROW(added, dropped, escaped): W holds refs to ``added`` (borrowed: not freed
       under it), no longer to ``dropped`` (released); ``escaped`` are kept until
       shutdown. Every borrow still held when T ends is released then (``end``): a ref W
       keeps past its task (a global) is not followed.
    2. SUBMIT(spec, call_id): ``owner.submit_task(spec, parent=T)``: the child's depth is
       T's plus one, and ``cancel(T, recursive=True)`` reaches it; a submission the owner
       refuses fails the child's refs with the error. An actor's: the parent is the call
       ``call_id`` (``tasks.call_parent``, as for a local actor's worker).
    3. ACTOR_SUBMIT(actor_id, call): the call goes to the driver's actor as a local
       worker's does; an error fails its refs.
    4. PUT(id, OK, payload, contained): ``payload`` inline bytes, or ``("peer", size)``:
       its bytes follow in frames of at most ``framing.PEER_CHUNK``, received straight into a new
       segment of the driver's store; the object is the driver's, as a local worker's put
       is (it outlives W), ready, borrowed by W, holding the refs it contains. A store
       with no room for it: its frames are read and dropped, and the object holds
       ObjectStoreFullError (raised by its ``get``; Ray raises it from ``put``).
    5. GET(req, ids, timeout, call_id) and WAIT(req, ids, num_returns, timeout, call_id):
       this thread waits for the objects in slices of WATCH_S; between slices it answers
       CANCELLED once T was cancelled (W raises KeyboardInterrupt, as a local get does),
       fails T with W's death (its data connection's EOF, or a force-cancel's kill) and
       with its node's (the view, as while T runs). The REPLY (TIMEOUT, or the items as
       ``(kind, payload)``: inline bytes, errors always inline, a large value as
       ``("peer", size)``) is followed by each large value's bytes, sent from its
       segment's read-only mapping (held from the read to the last frame: the segment is
       not reused meanwhile). WAIT's REPLY is the ready ids, in the order asked.
    6. CALL(req, method, args): cancel, cluster_resources, available_resources and nodes
       are answered; so are creating an actor, ``kill``, ``get_actor`` and
       ``list_named_actors``, as for a worker on the driver's node
       (``requests.actor_request``): the actor is the driver's, placed by its rules (on any
       node); a named or detached one, and a lookup, go through the node's actor service
       when the driver is joined to one, asked from this thread without the lock.
       CALL_STREAM_NEXT (W iterates a generator's refs) waits as step 5 does and answers
       as the owner's ``Streams.next``. CALL_PLACEMENT_GROUP (create, ready, wait, remove,
       lookup, table, bundles) is answered as for a worker on the driver's node
       (``requests.placement_call``): the group is the driver's, placed by its rules. Any
       other is answered with an error naming it (W raises it in the task).
    7. YIELD(task_id, i, kind, payload, contained): value i of a streaming call T (or an
       actor's) runs; a large one's bytes follow in frames, received into a new segment
       named for the item (as PUT's); ``Streams.on_item`` takes it as a local worker's
       (a store with no room: the item holds ObjectStoreFullError). In order with the
       call's other messages: its RESULT, the call's end, comes after its last value.
    Anything else: not served, ``serve`` returns False and the caller fails T with an
    error saying a task on another host cannot ask for it.

An actor's GET, WAIT and the CALLs that may wait (``BLOCKING_CALLS``: stream next, placement
group calls, and the actor requests the node's actor service may answer) are served on
helper threads, so its reader thread goes on reading the results of its other calls (a
threaded or async actor);
their REPLYs, each followed by its large values' frames, and the actor's calls go out
under one ``send_lock``.

W's lease on its node while it waits: W holds its lease (its CPU too) while its children
run, on the driver's node or elsewhere; a child that needs that same node's only free
resources waits until W's task ends (a local blocked worker gives its CPU back instead).
Requests are served one at a time in the order W sent them: a task that blocks in ``get``
on one thread while another thread of it puts the object waits as long as its timeout
allows (for ever without one).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from miniray._private.core import ids, protocol, serialization
from miniray._private.object_store import shm_segments
from miniray._private.owner import requests
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.framing import send_in_frames

__all__ = ["BLOCKING_CALLS", "RemoteRequests", "WATCH_S"]

logger = logging.getLogger(__name__)

WATCH_S = 0.2  # a blocked get or wait looks at cancel, W's death and its node this often
BULK_FRAME_S = 60.0  # one frame of a large put's bytes comes within this
# The CALLs that may wait on other work (an actor's are served off its reader thread).
BLOCKING_CALLS = (frozenset((protocol.CALL_STREAM_NEXT, protocol.CALL_PLACEMENT_GROUP))
                  | requests.ACTOR_CALLS)
SERVED_CALLS = ("cancel", "cluster_resources", "available_resources", "nodes",
                "creating, killing and looking up actors", "iterating a generator's refs",
                "placement groups")


class RemoteRequests:
    """The requests of ``task``'s worker on another host (see the module docstring).

    ``data``: the worker's data connection (a ``PeerChannel``); ``check_node()`` raises
    when the node is lost (``RemoteNodes._check_alive``); ``receive_segment(data, path,
    size)`` receives a large value's frames into a new segment (``remote_nodes``).
    ``task`` None: an actor's worker ``slot`` (a ``RemoteActorWorker``), whose calls are
    the parents of its nested tasks; ``send_lock``: held while a REPLY and its frames go
    out (the actor's sender thread holds it too)."""

    def __init__(self, owner, task, data, check_node, receive_segment, slot=None,
                 send_lock=None):
        self.owner = owner
        self.task = task
        self.slot = slot
        self.data = data
        self.check_node = check_node
        self.receive_segment = receive_segment
        self.send_lock = send_lock if send_lock is not None else threading.Lock()
        self.borrowed: set = set()  # what ``requests.on_borrow`` reads as a worker's
        self.served = 0

    def __repr__(self) -> str:
        name = self.task.spec.name if self.task is not None else self.slot
        return (f"<RemoteRequests task={name} served={self.served} "
                f"borrowed={len(self.borrowed)}>")

    # -- the dispatch ------------------------------------------------------------------
    def serve(self, message: tuple) -> bool:
        """Serve one message of the worker (steps 1-6); False if it is none of those."""
        tag = message[0]
        if tag == protocol.BORROW:
            with self.owner.locked():
                self.owner.requests.on_borrow(self, *message[1:])
        elif tag == protocol.SUBMIT:
            self._submit(message[1], message[2] if len(message) > 2 else None)
        elif tag == protocol.ACTOR_SUBMIT:
            self._actor_submit(message[1], message[2])
        elif tag == protocol.PUT:
            self._put(*message[1:5])
        elif tag == protocol.GET:
            self._get(message[1], message[2], message[3], message[4])
        elif tag == protocol.WAIT:
            self._wait(message[1], message[2], message[3], message[4], message[5])
        elif tag == protocol.CALL:
            self._call(message[1], message[2], message[3])
        elif tag == protocol.YIELD:
            self._yield(*message[1:6])
        else:
            return False
        self.served += 1
        return True

    def contain(self, contained) -> None:
        """RESULT's refs pickled inside the returned values: each return object holds
        them (a child's ref returned by T outlives T's borrow)."""
        if not contained:
            return
        return_ids = self.task.spec.return_ids
        with self.owner.locked():
            for index, inner in enumerate(contained):
                if inner and index < len(return_ids):
                    self.owner.objects.contain(return_ids[index], inner)

    def end(self) -> None:
        """The call ended: every ref the worker still borrows is released."""
        if not self.borrowed:
            return
        borrowed, self.borrowed = self.borrowed, set()
        with self.owner.locked():
            for object_id in borrowed:
                self.owner.objects.unborrow(object_id)

    # -- steps 2-4 ---------------------------------------------------------------------
    def _submit(self, spec, call_id) -> None:
        owner = self.owner
        parent = self.task
        if parent is None and call_id is not None:  # an actor's call (or its constructor)
            with owner.locked():
                parent = owner.tasks.call_parent(call_id)
        try:
            owner.submit_task(spec, parent)
        except Exception as error:  # closed, an unknown function: the child's refs say so
            self._fail_refs(spec.return_ids, error)

    def _actor_submit(self, actor_id: bytes, call) -> None:
        owner = self.owner
        with owner.locked():
            try:
                owner.actors.submit(actor_id, call, self.slot or self)
            except Exception as error:  # e.g. PendingCallsLimitExceeded: the refs carry it
                data = serialization.dumps(error)
                for object_id in call.return_ids:
                    owner.objects.set_ready(object_id, protocol.ERR, data)

    def _fail_refs(self, object_ids, error: BaseException) -> None:
        data = serialization.dumps(error)
        with self.owner.locked():
            for object_id in object_ids:
                self.owner.objects.set_ready(object_id, protocol.ERR, data)

    def _receive(self, object_id: bytes, size: int):
        """A value's bytes that follow its message, into a new segment of the driver's
        store named for ``object_id``: its ``("shm", path, size)``, or, when the store has no
        room (its frames read and dropped), the ``ObjectStoreFullError`` to hold instead."""
        store = self.owner.store
        path = os.path.join(store.shm_dir,
                            shm_segments.segment_name(store.session_tag, object_id))
        try:
            self.receive_segment(self.data, path, size)
        except OSError as error:
            shm_segments.unlink_quiet(path)
            if error.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            self._skip_bytes(size)  # none was read: the store had no room for it
            return shm_segments.no_room_error(store.shm_dir, size, object_id)
        except BaseException:
            shm_segments.unlink_quiet(path)
            raise
        return ("shm", path, size)

    def _put(self, object_id: bytes, kind: int, payload, contained=()) -> None:
        owner = self.owner
        if type(payload) is tuple:  # ("peer", size): the bytes follow, into a segment
            payload = self._receive(object_id, payload[1])
            if isinstance(payload, BaseException):
                self._fail_refs([object_id], payload)
                return
        with owner.locked():
            owner.objects.set_ready(object_id, kind, payload)
            if object_id not in self.borrowed and owner.objects.borrow(object_id):
                self.borrowed.add(object_id)
            if contained:
                owner.objects.contain(object_id, contained)

    def _yield(self, task_id: bytes, index: int, kind: int, payload, contained) -> None:
        """Step 7: value ``index`` of a streaming call, as a local worker's YIELD is."""
        if type(payload) is tuple:  # ("peer", size, 0): the bytes follow, into a segment
            payload = self._receive(ids.stream_item_id(task_id, index), payload[1])
            if isinstance(payload, BaseException):  # the store's error is the value
                kind, payload, contained = protocol.ERR, serialization.dumps(payload), ()
        with self.owner.locked():
            self.owner.streams.on_item(task_id, index, kind, payload, contained)

    def _stream_next(self, task_id: bytes, index: int, timeout):
        """CALL_STREAM_NEXT: W's ``next()`` of a streaming call blocks as a get does (step
        5's slices, W's and its node's death checked between them; a cancel of W's call
        is raised in W once the answer comes, as for a local worker): ``Streams.next``'s
        answer, None once ``timeout`` passed."""
        owner = self.owner

        def attempt(seconds):
            state = owner.stream_next(task_id, index, seconds)
            return None if state is None else (state,)

        answer = self._blocked(attempt, timeout, None)
        return None if answer is None else answer[0]

    def _skip_bytes(self, size: int) -> None:
        """Read and drop the frames of a value of ``size`` bytes (a put with no room)."""
        while size > 0:
            size -= memoryview(self.data.recv_bytes(timeout=BULK_FRAME_S)).nbytes

    # -- step 5 ------------------------------------------------------------------------
    def _worker_slot(self):
        return self.task.worker if self.task is not None else self.slot

    def _interrupted(self, call_id) -> bool:
        slot = self._worker_slot()
        return call_id is not None and call_id in getattr(slot, "interrupted", ())

    def _blocked(self, attempt, timeout, call_id):
        """``attempt(seconds)`` (None: not yet) until it answers, the timeout passes
        (None returned) or the call is cancelled (CANCELLED returned); W's or its node's
        death raises."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            if self._interrupted(call_id):
                return protocol.CANCELLED
            left = WATCH_S if deadline is None else min(
                WATCH_S, max(0.0, deadline - time.monotonic()))
            try:
                answer = attempt(left)
            except RuntimeError:  # the owner's "shut down": the call ends with the driver
                if self.owner.closed:
                    raise OSError("the driver is shutting down") from None
                raise
            if answer is not None:
                return answer
            if deadline is not None and time.monotonic() >= deadline:
                return None
            self._check_worker()

    def _check_worker(self) -> None:
        """Between slices: W killed by a force-cancel, gone (EOF), or its node lost."""
        slot = self._worker_slot()
        if getattr(slot, "killed", False) or pc.closed_by_peer(self.data):
            raise OSError("the worker's data connection closed while it waited")
        self.check_node()

    def _get(self, req_id: int, object_ids: list, timeout, call_id) -> None:
        owner = self.owner
        from miniray.exceptions import ObjectFreedError  # lazy: the public package

        def attempt(seconds):
            try:
                return owner.get_serialized(object_ids, seconds)
            except ObjectFreedError as error:
                return [(protocol.ERR, serialization.dumps(error))]

        for _try in range(3):  # a segment spilled between the read and its mapping
            items = self._blocked(attempt, timeout, call_id)
            if items is None:
                self._reply(req_id, protocol.TIMEOUT)
                return
            if type(items) is int:  # CANCELLED
                self._reply(req_id, items)
                return
            try:
                items, mappings = _mapped(items, owner.store.shm_dir)
            except FileNotFoundError:
                continue
            try:
                self._reply(req_id, items, mappings)
            finally:
                for mapping in mappings:
                    mapping.close()
            return
        from miniray.exceptions import RaySystemError  # lazy: as above

        self._reply(req_id, [(protocol.ERR, serialization.dumps(RaySystemError(
            "an object's segment kept moving while it was read for another node; "
            "try again.")))])

    def _wait(self, req_id: int, object_ids: list, num_returns: int, timeout,
              call_id) -> None:
        owner = self.owner
        from miniray.exceptions import ObjectFreedError  # lazy: as above

        def ready_now() -> list:
            with owner.locked():
                return owner.objects.ready_ids(object_ids)

        def attempt(seconds):
            try:
                ready = owner.wait_ready(object_ids, num_returns, seconds)
            except ObjectFreedError:  # a freed id counts as ready (reading it raises)
                ready = ready_now()
            return ready if len(ready) >= num_returns else None

        answer = self._blocked(attempt, timeout, call_id)
        if type(answer) is int:  # CANCELLED
            self._reply(req_id, answer)
            return
        self._reply(req_id, ready_now())

    # -- step 6 ------------------------------------------------------------------------
    def _call(self, req_id: int, method: int, args) -> None:
        owner = self.owner
        try:
            if method == protocol.CALL_CANCEL:
                owner.cancel(*args)  # (object_id, force, recursive)
                value = None
            elif method == protocol.CALL_CLUSTER_RESOURCES:
                value = owner.requests.ledger.capacity()
            elif method == protocol.CALL_AVAILABLE_RESOURCES:
                value = owner.requests.ledger.available()
            elif method == protocol.CALL_NODES:
                value = owner.hello_info.get("nodes", [])
            elif method in requests.ACTOR_CALLS:
                value = self._actor_call(method, args)
            elif method == protocol.CALL_STREAM_NEXT:
                value = self._stream_next(*args)
            elif method == protocol.CALL_PLACEMENT_GROUP:
                value = requests.placement_call(owner.requests.placement_groups(), args)
            else:
                name = protocol.tag_name("call", method)
                raise NotImplementedError(
                    f"A task running on another host cannot make this request of its "
                    f"driver yet ({name}); those it can: {', '.join(SERVED_CALLS)}, "
                    "nested tasks, get, put, wait and calls on actor handles it was given. "
                    "Run the task on the driver's node for the rest.")
            result = (True, value)
        except Exception as error:
            result = (False, error)
        self._reply(req_id, result)

    def _actor_call(self, method: int, args):
        """Create, kill or look up an actor as for a worker on the driver's node
        (``requests.actor_request``): the driver owns what W creates and places it by its
        rules; a named or detached one, and every lookup of a driver joined to a node, is
        asked of the node's actor service here, in this thread, without the lock."""
        owner = self.owner
        spec = args[0] if method == protocol.CALL_CREATE_ACTOR else None
        if getattr(spec, "pg", None) is not None and owner.pgs is not None and \
                owner.actors.link is not None:
            owner.pgs.route_served(spec.placement)  # a detached group of the service
        # An actor's call creates actors that die with it (``ActorManager.creator_gone``);
        # a task's on another host, actors that live on as the driver's.
        creator = self.slot if self.task is None else None
        with owner.locked():
            value, ask = requests.actor_request(owner.actors, method, args, creator)
        if ask is None:
            return value
        request, request_args, keep = ask
        value = request(*request_args)
        if keep is not None:
            with owner.locked():
                owner.actors.keep_for_workers(keep(value))
        return value

    def _reply(self, req_id: int, payload, bulk=()) -> None:
        """The REPLY, then each of ``bulk``'s bytes in frames: nothing goes out between."""
        with self.send_lock:
            self.data.send((protocol.REPLY, req_id, payload))
            for mapping in bulk:
                send_in_frames(self.data.send_bytes, mapping)


def _mapped(items: list, shm_dir: str) -> tuple[list, list]:
    """GET's items for W: a large value's payload as ``("peer", size)``, its segment mapped
    read-only (returned, in order: their bytes follow the REPLY). FileNotFoundError: a
    segment moved (spilled) since it was read; the mappings made so far are closed."""
    out, mappings = [], []
    try:
        for kind, data in items:
            if not isinstance(data, (bytes, bytearray)):
                mapping = shm_segments.map_readonly(
                    shm_segments.resolve_path(data[1], shm_dir))
                mappings.append(mapping)
                data = ("peer", len(mapping))
            out.append((kind, data))
    except BaseException:
        for mapping in mappings:
            mapping.close()
        raise
    return out, mappings
