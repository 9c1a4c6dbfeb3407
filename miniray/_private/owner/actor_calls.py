"""The actor manager's calls: submitted, held in order, sent, finished, cancelled.

Owns: the methods of ``actors.ActorManager`` (a mixin of it: the state is the manager's,
made in ``ActorManager.__init__``) on the per-call path: a call's registration and argument
waits (``submit``; ``max_pending_calls``), sending queued calls in submission order while
the head of the queue is ready (``_pump``: to the actor's worker, to its node's sender for
an actor on another node, or to the node's actor service for a proxy), the results
(``on_result`` from the worker, ``on_remote_result`` from the service) and errors that end
a call (``_finish``: pins released, records, objects set), and ``cancel``. The owner decides
a cancelled call's outcome: once ``cancel`` returned for a call already sent, values that
come back (its process read the CANCEL too late) are freed and fail with the cancel error.
A mixin rather than an object of its own: every call reads the manager's actors and the
owner's objects, and an extra hop would cost each round trip.
Does not own: the actors' lifecycle (placement, restarts, death: ``actors.py``), the
records (``actor_records.py``), the sockets (the owner; ``actor_link.py`` for the service).
Called by: the owner with its lock held (driver submissions, RESULT messages, cancel),
the object table's waiters (``_call_dep_ready``), the manager (``_pump``, ``_finish``).

::

    submit ──► _Call (args pending? wait) ──► queue ──► _pump: head ready? ──► ACTOR_CALL
                                                                    └─ failed arg: _finish
    RESULT ──► on_result / on_remote_result ──► _finish ──► objects ready (or spec.reply)
"""

from __future__ import annotations

import logging

from miniray._private.core import protocol, scheduling, serialization
from miniray._private.core.dependency_errors import dependency_error_bytes
from miniray._private.core.task_spec import ActorCallSpec
from miniray._private.object_store.shm_segments import check_adoptable
from miniray._private.owner.actor_records import (
    A_ALIVE,
    A_DEAD,
    _Actor,
    _Call,
    _CallDep,
    _KeptCallDep,
    _NestedDep,
)
from miniray._private.owner.object_table import PENDING
from miniray._private.owner.tasks import error_text, retry_line

logger = logging.getLogger(__name__)


def _other_callers_next(queue) -> _Call | None:
    """The first queued call that may go while the head waits for an argument: ready, and
    of a caller none of whose earlier calls still waits (each caller's calls keep their
    order). A ``__ray_terminate__`` is a barrier: it runs after every call before it, and
    nothing passes it. None: nothing may go now. Pure: reads ``waiting``, ``caller`` and
    the method of each call.

    Example:
        >>> from types import SimpleNamespace as C
        >>> def call(caller, waiting=0, method="m"):
        ...     return C(caller=caller, waiting=waiting, spec=C(method=method))
        >>> queue = [call("a", 1), call("a"), call("b"), call(None)]
        >>> _other_callers_next(queue) is queue[2]
        True
        >>> _other_callers_next([call("a", 1), call("a"), call("b", 2), call("b")]) is None
        True
        >>> _other_callers_next([call("a", 1), call(None, method="__ray_terminate__"),
        ...                      call("b")]) is None
        True
    """
    waiting = set()
    for call in queue:
        if call.spec.method == "__ray_terminate__":
            return None
        if call.waiting > 0 or call.caller in waiting:
            waiting.add(call.caller)
            continue
        return call
    return None


class ActorCalls:
    """``ActorManager``'s per-call methods (see the module docstring); every attribute is
    the manager's."""

    def submit(self, actor_id: bytes, spec: ActorCallSpec, caller=None) -> None:
        """*Locked.* Queue (or send) call ``spec`` from ``caller`` (None: this process; a
        worker or the actor service's client it came from otherwise)."""
        owner = self.owner
        objects = owner.objects
        if spec.reply is None:
            for object_id in spec.return_ids:
                objects.ensure(object_id)
        actor = self.actors.get(actor_id)
        if actor is None and self.link is not None:
            actor = self.proxy(actor_id, None)  # a handle that came by value: ask the node's
        if actor is None:
            from miniray.exceptions import ActorDiedError  # lazy: only for an unknown actor

            self._fail_refs(spec, serialization.dumps(ActorDiedError(
                actor_id=actor_id.hex(),
                error_msg=f"The actor {actor_id.hex()} is unknown to this session: "
                          + (self.unknown_actor_hint or "its handle comes from a session that "
                             "was shut down, or it never existed."))))
            return
        if actor.state == A_DEAD:
            self._fail_refs(spec, actor.death)
            return
        limit = actor.spec.max_pending_calls
        if limit is not None and limit >= 0 and len(actor.queue) + len(actor.inflight) >= limit:
            from miniray.exceptions import PendingCallsLimitExceeded

            for object_id in spec.return_ids if spec.reply is None else ():
                objects.get(object_id).dropped = True  # nobody will read these: no ref made
            raise PendingCallsLimitExceeded(
                f"The actor {actor.spec.class_name} ({actor_id.hex()}) already has "
                f"{limit} calls pending, its max_pending_calls; wait for results before "
                "submitting more, or raise max_pending_calls.")
        call = _Call(spec, actor, caller)
        self.calls[spec.task_id] = call
        if (not spec.deps and not spec.contained and not actor.queue and not actor.remote
                and actor.state == A_ALIVE and not actor.exiting
                and (spec.method != "__ray_terminate__" or not actor.inflight)):
            worker = actor.worker
            if worker is not None and not getattr(worker, "elsewhere", False):
                # The common call (no argument refs, nothing queued before it, a local
                # worker): sent here, as ``_pump`` would send it, without the queue.
                busy = bool(actor.inflight)
                actor.inflight[spec.task_id] = call
                call.sent = True
                call.kept = ()
                self._send_call(worker, spec, spec.payloads, busy)
                return
        if spec.contained:
            objects.hold(spec.contained)
        for _position, object_id in spec.deps or ():
            entry = objects.get(object_id)
            if entry is None:
                call.failed = serialization.dumps(objects.lost(object_id))
                break
            entry.holders += 1
            if entry.state == PENDING:
                if entry.remote is not None and not actor.remote:
                    continue  # kept on another node: ``_pump`` decides where it is read
                call.waiting += 1
                entry.add_waiter(_CallDep(self, call) if actor.remote
                                 else _KeptCallDep(self, call))
            elif entry.kind == protocol.ERR:
                call.failed = self._dep_error(call, object_id)
        if actor.remote:  # nested refs' values go with the call: wait for them too
            for object_id in spec.contained or ():
                entry = objects.get(object_id)
                if entry is not None and entry.state == PENDING:
                    call.waiting += 1
                    entry.add_waiter(_NestedDep(self, call))
        queue = actor.queue
        if queue and not actor.callers and queue[-1].caller is not caller:
            actor.callers = True
        queue.append(call)
        self._pump(actor)

    def _call_dep_ready(self, call: _Call, is_error: bool, object_id: bytes) -> None:
        if is_error and call.failed is None:
            call.failed = self._dep_error(call, object_id)
        call.waiting -= 1
        self._pump(call.actor)

    def _dep_error(self, call: _Call, object_id: bytes) -> bytes:
        """Ray's error for a call whose argument ``object_id`` failed: the call's own."""
        name = f"{call.actor.spec.class_name}.{call.spec.call_name}"
        return dependency_error_bytes(self.owner.objects.error_bytes(object_id), name)

    def _pump(self, actor: _Actor) -> None:
        """Send queued calls, in order, while the head of the queue is ready to go: to the
        actor's worker, or for a proxy to the node's actor service (argument values pinned
        here until the result comes back). An actor whose calls may run out of order (async,
        threaded, ``allow_out_of_order_execution``: ``spec.out_of_order``) gets each call
        whose arguments are ready, whatever waits before it, as Ray 2.60 sends them (the
        task-orders page: a call waiting for an argument runs after a later one). Any other
        actor orders calls per caller, as Ray does: while one caller's call waits for an
        argument, the calls of other callers queued after it go (``_other_callers_next``)."""
        remote = actor.remote
        if not remote and (actor.state != A_ALIVE or actor.worker is None or actor.exiting):
            return
        owner = self.owner
        queue = actor.queue
        # A call to an actor that has not answered the calls before it yet is written with
        # the calls that follow it (one write per burst, see ``Reactor.send_soon``); a call
        # to an idle actor goes at once.
        busy = bool(actor.inflight)
        mapper = None if remote or getattr(actor.worker, "elsewhere", False) else actor.worker
        unordered = actor.spec.out_of_order
        while queue:
            if queue[0].waiting <= 0:
                call = queue.popleft()
            elif unordered:
                call = next((c for c in queue if c.waiting <= 0), None)
                if call is None:
                    break
                queue.remove(call)
            elif actor.callers:
                call = _other_callers_next(queue)
                if call is None:
                    break
                queue.remove(call)
            else:
                break
            spec = call.spec
            if call.failed is not None:
                self._finish(call, [(protocol.ERR, call.failed)] * max(1, spec.num_returns))
                continue
            if spec.method == "__ray_terminate__" and any(
                    c.spec.retry_exceptions for c in actor.inflight.values()):
                queue.appendleft(call)  # after them: one that fails may run again first
                break
            dep_values = spec.payloads
            call.kept = ()
            if spec.deps:
                kept = self._kept_deps(spec.deps)
                if kept and (remote or mapper is not None):  # read here: pulled first
                    for entry in kept.values():
                        call.waiting += 1
                        entry.add_waiter(_CallDep(self, call))
                    queue.appendleft(call)
                    if unordered:
                        continue  # it waits now: the calls after it may go
                    break
                if kept:  # on another node: its sender reads or fetches them there
                    call.kept = tuple(kept)
                    dep_values = self._kept_payloads(spec.deps, kept, pin=True)
                else:
                    dep_values = owner.requests.dep_payloads(spec.deps, pin=True,
                                                             worker=mapper)
            actor.inflight[spec.task_id] = call
            call.sent = True
            if remote:
                call.exported = self.export(spec.contained)
                self.link.call(actor.spec.actor_id, ActorCallSpec(
                    spec.task_id, spec.method, spec.args_blob, None, spec.return_ids,
                    spec.num_returns, spec.call_name, spec.max_task_retries, (), dep_values,
                    spec.concurrency_group, spec.retry_exceptions), call.exported)
                continue
            self._send_call(actor.worker, spec, dep_values, busy)

    def _kept_deps(self, deps) -> dict:
        """*Locked.* The arguments among ``deps`` kept on another node, not here yet:
        ``{object id: entry}`` (an entry PENDING with a ``RemoteCopy``)."""
        objects = self.owner.objects
        kept = {}
        for _position, object_id in deps:
            entry = objects.get(object_id)
            if entry is not None and entry.state == PENDING and entry.remote is not None:
                kept[object_id] = entry
        return kept

    def _kept_payloads(self, deps, kept: dict, pin: bool) -> list:
        """*Locked.* The payloads of ``deps`` for a worker on another node: those in
        ``kept`` (``_kept_deps``) as ``("kept", id, copy)``, which its sender reads there or
        has its node fetch (``remote_actors.py`` step 3); the others as any worker's,
        pinned with ``pin``."""
        payloads = self.owner.requests.dep_payloads(
            [d for d in deps if d[1] not in kept], pin=pin)
        payloads += [(position, kept[object_id].kind,
                      ("kept", object_id, kept[object_id].remote))
                     for position, object_id in deps if object_id in kept]
        return payloads

    def on_remote_result(self, task_id: bytes, results: list, nested=None) -> None:
        """*Locked.* The node's actor service answered a call of a proxy. ``nested``:
        ``[(index, [(id, kind, payload)])]``, the objects of refs inside result ``index``,
        which become this driver's and live as long as that result."""
        call = self.calls.get(task_id)
        if call is None or call.actor.inflight.pop(task_id, None) is None:
            for _index, items in nested or ():
                for _id, _kind, payload in items:
                    self.link.discard(payload)
            self.free_in_service(results)
            return
        results = self.kept_in_service(results)  # kept on the actor's node: pulled later
        objects = self.owner.objects
        return_ids = call.spec.return_ids
        for index, items in nested or ():
            for object_id, kind, payload in items:
                if objects.get(object_id) is None:
                    objects.set_ready(object_id, kind, payload)
                else:
                    self.link.discard(payload)  # already here (it came from this driver)
            if index < len(return_ids):
                objects.contain(return_ids[index], [i for i, _k, _p in items])
        self._finish(call, results)
        for _index, items in nested or ():  # held by a result nobody kept: they go now
            for object_id, _kind, _payload in items:
                entry = objects.get(object_id)
                if entry is not None and entry.holders <= 0:
                    objects.maybe_free(object_id, entry)

    def on_link_lost(self, error: bytes) -> None:
        """*Locked.* The actor service is gone: every proxy's calls fail with ``error``."""
        for actor in self.actors.values():
            if actor.remote and actor.state != A_DEAD:
                actor.state = A_DEAD
                actor.death = error
                self._fail_all(actor)

    def _finish(self, call: _Call, results: list, contained=None, times=None) -> bool:
        """*Locked.* ``call`` ended with ``results``; False if they were values replaced by
        the cancel error (``ray.cancel()`` returned before they came), which hold no refs."""
        spec = call.spec
        stand = not call.cancelled or scheduling.cancelled_call_results_stand(
            [kind for kind, _data in results])
        if not stand:
            results = self._cancelled_results(spec, results)
            contained = None
        self.owner.actor_call_ended(spec.task_id)  # its tasks are no longer its to cancel
        if self.calls.pop(spec.task_id, None) is not None and spec.contained:
            self.owner.objects.release(spec.contained)
        if call.sent and spec.deps:
            kept, call.kept = call.kept, ()
            self.owner.requests.unpin_deps([d for d in spec.deps if d[1] not in kept]
                                           if kept else spec.deps)
        if call.exported:
            exported, call.exported = call.exported, []
            self.owner.requests.unpin_ids(object_id for object_id, _k, _p in exported)
        self._deliver(spec, results, contained)
        if self.records is not None:
            self.records.call_done(call.actor, spec, results, times)
        objects = self.owner.objects
        if spec.deps:
            objects.release([object_id for _position, object_id in spec.deps])
        return stand

    def _cancelled_results(self, spec: ActorCallSpec, results: list) -> list:
        """*Locked.* A call ``ray.cancel()`` reached after it was sent returned values (its
        process saw the cancel too late, or not at all): they are freed (a segment here
        unlinked, a copy kept on another node freed there; inline bytes simply dropped),
        and each return gets the error of a call cancelled while it ran, as in Ray 2.60."""
        store = self.owner.store
        for _kind, data in results:
            if type(data) is not tuple:
                continue
            if data[0] == "remote":  # kept on its node (``kept_in_service``, remote actors)
                data[1].free()
            elif data[0] == "shm":
                try:
                    path, _size = check_adoptable(data[1], data[2], store.shm_dir,
                                                  store.session_tag)
                except (ValueError, OSError):
                    continue  # not one of this session's segments: never this store's
                store.give_up_recycled(path)
        error = serialization.dumps(scheduling.actor_call_cancel_error(spec.task_id))
        return [(protocol.ERR, error)] * max(1, len(results))

    def _deliver(self, spec: ActorCallSpec, results: list, contained=None) -> None:
        if spec.reply is not None:
            spec.reply(results, contained)
            return
        objects = self.owner.objects
        for object_id, (kind, data) in zip(spec.return_ids, results):
            objects.set_ready(object_id, kind, data)

    def _fail_refs(self, spec: ActorCallSpec, data: bytes) -> None:
        self._deliver(spec, [(protocol.ERR, data)] * max(1, len(spec.return_ids)))

    def on_result(self, worker, task_id: bytes, results: list, contained=None,
                  times=None, retryable: bool = False) -> bool:
        """*Locked.* ``worker``'s actor answered call ``task_id``: False if its values were
        replaced by the cancel error (``_finish``), so that refs inside them hold nothing,
        or if the call raised an exception its ``retry_exceptions`` names (``retryable``)
        and runs again, as Ray retries it while ``max_task_retries`` allows."""
        actor = worker.actor
        call = actor.inflight.pop(task_id, None) if actor is not None else None
        if call is None:
            return True
        if retryable and not call.cancelled and actor.state == A_ALIVE and not actor.exiting:
            before = call.retries_left
            again, call.retries_left = scheduling.consume_retry(before)
            if again:
                self._retry(call, before, results)
                return False
        stand = self._finish(call, results, contained, times)
        if call.spec.retry_exceptions and actor.queue:  # a __ray_terminate__ it held back
            self._pump(actor)
        return stand

    def _retry(self, call: _Call, before: int, results: list) -> None:
        """*Locked.* ``call`` raised an exception it retries: back at the head of its
        actor's queue, its arguments' pins of this send given back (the next send pins
        them again), with Ray's line."""
        spec = call.spec
        logger.warning("%s", retry_line(f"{call.actor.spec.class_name}.{spec.call_name}",
                                        before, "User exception:\n" + error_text(results)))
        if spec.deps:
            kept, call.kept = call.kept, ()
            self.owner.requests.unpin_deps([d for d in spec.deps if d[1] not in kept]
                                           if kept else spec.deps)
        call.sent = False
        call.actor.queue.appendleft(call)
        self._pump(call.actor)

    def _send_call(self, worker, spec: ActorCallSpec, dep_values, soon: bool) -> None:
        """*Locked.* The ACTOR_CALL of ``spec`` to the actor's worker (``_send``), with its
        arguments' values ``dep_values``; a worker that is dying is left to its exit report,
        which decides what happens to the call."""
        try:
            self._send(worker, (protocol.ACTOR_CALL, spec.task_id, spec.method, spec.args_blob,
                                dep_values, spec.return_ids, spec.num_returns, spec.call_name,
                                spec.concurrency_group, spec.retry_exceptions), soon)
        except OSError:
            pass

    def _send(self, worker, message: tuple, soon: bool = False) -> None:
        """*Locked.* A message to an actor's worker, never blocking: a local one through the
        owner's I/O thread, one on another node through its sender (``remote_actors.py``)."""
        if getattr(worker, "elsewhere", False):
            worker.send(message)
        elif soon:
            self.owner.send_soon(worker, message)
        else:
            self.owner.send(worker, message)

    def cancel(self, task_id: bytes, force: bool, recursive: bool = True) -> bool:
        """Cancel an actor call (and with ``recursive`` the tasks it submitted); False if
        ``task_id`` is not an actor call."""
        call = self.calls.get(task_id)
        if call is None:
            return False
        if force:
            raise ValueError("force=True is not supported for actor tasks.")
        actor = call.actor
        call.cancelled = call.sent  # from now on a value that comes back fails (``_finish``)
        if actor.remote and call.sent:
            self.link.cancel(task_id, force, recursive)
            return True
        if not call.sent:
            if call in actor.queue:
                actor.queue.remove(call)
            error = scheduling.actor_call_cancel_error(task_id, actor.spec.actor_id)
            self._finish(call, [(protocol.ERR, serialization.dumps(error))]
                         * max(1, call.spec.num_returns))
            return True
        worker = actor.worker
        if worker is not None:
            self.owner.signal_cancel(worker, task_id)
        if recursive:
            self.owner.cancel_call_tasks(task_id)
        return True
