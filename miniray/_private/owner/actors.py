"""The owner's actors: placement, lifecycle (death, restarts), kill, and names.

Owns: every actor of the session: its lease in the ledger (what it holds for its lifetime), its
dedicated worker, its restarts, why it died, and the named-actor registry; the state the mixins
below work on (``ActorManager.__init__``). Split by seam into mixins of ``ActorManager`` (one
object, so the per-call path pays no extra hop): ``actor_calls.py`` (the calls queued for an
actor, sent in submission order, finished, cancelled), ``actor_handles.py`` (the count of live
handles: an actor whose handles are all gone exits after its queued calls) and
``actor_service_proxies.py`` (in a driver joined to a node, a proxy of each named or detached
actor, which lives in the node's actor service, and the requests made there); the records and
states are ``actor_records.py``. Does not own: worker processes and sockets (the owner spawns
and watches them), actors placed on other nodes' leases and workers (``remote_actors.py``:
asked by the placer, it hands back a worker that stands in for a local one), objects (the
object table), or what runs inside the actor (``actor_host.py``).
Called by: ``owner.Owner`` with its lock held, for driver submissions and worker messages.

::

    create(spec) ──► deps ready ──► ledger.acquire(placement) ──► shrink to held ──► spawn
                        │                     └─ none: pending (retried on releases)
                        ▼
    call(spec) ──► queue (in order; a call waiting on an argument holds back later ones)
                        └──► ACTOR_CALL to the actor's worker ──► RESULT ──► objects ready
    worker exit ──► restart (max_restarts) or DEAD: every pending call gets ActorDiedError

A constructor's argument kept on another node (a ``RemoteCopy``, docs/remote-objects.md) is
not pulled before placement: ``remote_actors.RemoteActors.where`` weighs where its bytes are;
placed on another node, its sender reads or fetches it there; placed here, the placer pulls
it first (``_pull_kept``). A call's argument kept on another node
is not waited for at submit: when the call heads the queue, an actor here pulls it first
(the call stays at the head meanwhile); an actor on another node gets it as ``("kept", id,
copy)``, which its sender reads there or has its node fetch (``remote_actors.py`` step 3).

Resources (a documented difference from Ray 2.60): an actor with no resource options needs 1
CPU to be placed and holds none while alive, as in Ray; an actor that names resources holds
exactly what it names, so ``num_gpus=0.5`` holds half a GPU and no CPU. Ray also holds an
implicit CPU there, which makes the documents' fractional-packing example (three 0.5-GPU
actors) hang on a 2-CPU host.
"""

from __future__ import annotations

import collections
import logging
import sys
from typing import Any, Protocol

from miniray._private.core import placement, protocol, scheduling, serialization
from miniray._private.core.dependency_errors import dependency_error
from miniray._private.core.resources import format_infeasible, infeasible_reasons
from miniray._private.core.task_spec import ActorCreationSpec
from miniray._private.owner.actor_calls import ActorCalls
from miniray._private.owner.actor_handles import ActorHandles
from miniray._private.owner.actor_records import (
    A_ALIVE,
    A_DEAD,
    A_PENDING,
    A_RESTARTING,
    _Actor,
    _Call,
    _CreationDep,
    _KeptCreationDep,
)
from miniray._private.owner.actor_service_proxies import ServiceProxies
from miniray._private.owner.object_table import PENDING


def _locked_route(owner, route):
    """``route`` called with the owner's lock held: the actor service's route sends on its
    reactor, which every sender reaches under that lock."""
    def locked(target: str, text: str) -> bool:
        with owner.locked():
            return route(target, text)
    return locked


def _group_removed(pg_hex: str) -> str:
    """Ray's reason for an actor that had started when its placement group was removed."""
    return ("The actor is dead because its worker process has died. Worker exit type: "
            "INTENDED_SYSTEM_EXIT Worker exit detail: Destroying worker since its placement "
            f"group was removed. Placement group id: {pg_hex}")


def owner_died(how: str) -> str:
    """The reason an actor died with the process that created it (its owner, as Ray calls
    it), in Ray's first sentence, then ``how``.

    >>> owner_died("the worker process (pid=7) of actor P ended: killed by SIGKILL")[46:]
    'the worker process (pid=7) of actor P ended: killed by SIGKILL.'
    >>> owner_died("x.")[:46]
    'The actor is dead because its owner has died: '
    """
    return f"The actor is dead because its owner has died: {how.rstrip('.')}."


def never_created_in_removed_group(state: str, pg_hex: str):
    """Pure. The error of an actor in ``state`` whose placement group ``pg_hex`` is removed,
    as Ray 2.60 gives it: one that never started (``A_PENDING``: waiting for room, or placed
    and not started yet) could not be created, ``ActorUnschedulableError`` naming the group;
    None for one that had started (alive, or restarting after a death): it is killed and
    dies with ``ActorDiedError`` (``_group_removed``)."""
    if state != A_PENDING:
        return None
    from miniray.exceptions import ActorUnschedulableError  # lazy: the public package

    return ActorUnschedulableError(
        "Could not create the actor because its associated placement group was removed.\n"
        f"Required placement group {pg_hex} is removed.")


class ActorsOwner(Protocol):
    """What the actor manager and the actor-service link use of their owner: the seam between
    the actors and the rest of the owner, held by ``tests/unit/test_actor_seam.py`` (nothing
    else of the owner is read, and nothing private).

    State it shares: ``objects`` (the object table), ``store``, ``leases`` (the lease book:
    actors take theirs by its one path), ``ledger`` (shrinking a placement to what an actor
    holds), ``requests`` (argument pins), ``reactor``, ``node_state``, ``fork_server``,
    ``hello_info``, ``log_to_driver``, ``gpu_ids_are_ints``, ``actors`` (the manager itself,
    for the link), ``streams`` (a streaming call's values, for the link), ``closed``,
    ``fatal``, ``remote_nodes`` (None outside a cluster; in one, the view and which
    driver lends room in a placement group's bundle on another node). What it asks the
    owner to do is the methods below (``note_placement_use``: an actor was placed in a
    placement group, whose removal by any driver it must notice)."""

    objects: Any
    store: Any
    leases: Any
    ledger: Any
    requests: Any
    reactor: Any
    node_state: Any
    fork_server: Any
    hello_info: dict
    log_to_driver: bool
    gpu_ids_are_ints: bool
    actors: Any
    streams: Any
    closed: bool
    fatal: str | None
    remote_nodes: Any

    def locked(self) -> Any: ...
    def defer(self, action) -> None: ...
    def may_dispatch(self) -> bool: ...
    def may_adopt(self, fork_server) -> bool: ...
    def note_placement_use(self) -> None: ...
    def placement_group_gone(self, pg_hex: str, far: bool = False) -> bool: ...
    def in_remote_bundle(self, request: dict) -> bool: ...
    def holds_own_group(self, pg_hex: str) -> bool: ...
    def serves_bundle(self, request: dict) -> bool: ...
    def make_room(self) -> bool: ...
    def retry_soon(self) -> None: ...
    def start_worker(self, fork_server) -> tuple: ...
    def adopt_worker(self, parts: tuple) -> Any: ...
    def discard_start(self, parts: tuple) -> None: ...
    def count_actor_worker(self, delta: int) -> None: ...
    def send(self, worker, message: tuple) -> None: ...
    def send_soon(self, worker, message: tuple) -> None: ...
    def signal_cancel(self, worker, task_id: bytes) -> None: ...
    def cancel_call_tasks(self, call_id: bytes) -> None: ...
    def actor_call_ended(self, call_id: bytes) -> None: ...
    def kill_process_later(self, pid: int) -> None: ...
    def release_lease_later(self, lease_id: str, host_lease: str | None) -> None: ...
    def export_function(self, fn_id: bytes, fn_bytes: bytes) -> None: ...
    def function_bytes(self, fn_id: bytes) -> bytes: ...
    def runtime_env_error(self, runtime_env: str) -> Any: ...


logger = logging.getLogger(__name__)

# ``_other_node``'s answer for an actor in room lent by a driver of another node whose
# node died: it waits for that driver's word on its bundle's new place, not in the queue
AWAITS_LENDER = "awaits its lender"

__all__ = ["A_DEAD", "ActorManager", "ActorsOwner"]  # A_DEAD: the records' state, read by
# waiting.py and the node's actor service


class ActorManager(ActorCalls, ActorHandles, ServiceProxies):
    """Given at construction: its owner, used only through ``ActorsOwner``. Its methods are
    here and in its mixins (see the module docstring)."""

    def __init__(self, owner: ActorsOwner):
        self.owner = owner
        self.actors: dict[bytes, _Actor] = {}
        self.records = None  # state_records.StateRecords, given by the owner: finished calls
        self.names: dict[tuple[str, str], bytes] = {}
        self.calls: dict[bytes, _Call] = {}
        self.pending: list[_Actor] = []  # waiting for a lease and a worker, in order
        self._placer_scheduled = False
        self.handle_events: collections.deque = collections.deque()
        self._reported: set = set()
        # Joined to a node: named and detached actors live in the node's actor service, and
        # this manager keeps a proxy of each (``actor_link.ActorLink``; None otherwise).
        self.link = None
        # In the actor service: route_output(actor) gives the route of its worker's output,
        # and unknown_actor_hint says why a handle may be unknown there.
        self.route_output = None
        self.unknown_actor_hint: str | None = None
        # Actors placed on other nodes (``remote_actors.RemoteActors``), made at first use:
        # their ``actor.worker`` is its ``RemoteActorWorker`` (``elsewhere`` is True).
        self.elsewhere = None
        # The actors each worker process created (not detached), which die with that
        # process as in Ray, whose owner of an actor is the process that created it:
        # worker -> actor ids, in creation order (``creator_gone``, ``creator_retired``).
        self.created_by: dict[Any, dict[bytes, None]] = {}

    def is_node_actor(self, spec: ActorCreationSpec) -> bool:
        """Whether this actor is created in the node's actor service (named or detached,
        from a driver joined to a node) rather than owned here. The service places it on
        another node by the same rules as a driver (``_other_node``)."""
        return self.link is not None and bool(
            spec.name or spec.detached or (spec.pg is not None and self.owner.serves_bundle(
                spec.placement)))  # a detached group's bundle on another node: the service's

    def _other_node(self, spec: ActorCreationSpec, actor=None):
        """*Locked.* Where another node takes this actor (``remote_actors.RemoteActors.where``:
        a node id or an ``Unschedulable`` text), or None to place it here as before: only an
        actor with a node affinity or SPREAD, or a request this node can never hold, or one
        whose constructor is given a result kept on another node (``where`` weighs where
        its bytes are), outside a placement group (in a driver or in the node's actor
        service alike); or one in a
        placement group's bundle on another node (``remote_bundles``; in the actor
        service, one that its creating driver lent it: ``spec.lent``, or one whose
        lending driver of another node has not yet said where its bundle went after its
        node died: AWAITS_LENDER, and it waits out of the placer's queue until that driver
        says so, ``RemoteActors.lent_moved``)."""
        if spec.pg is not None:
            if spec.lent is None and not self.owner.in_remote_bundle(spec.placement):
                if actor is not None and self.elsewhere is not None and \
                        self.elsewhere.nodes.bundles.awaits_lender(spec.actor_id):
                    return AWAITS_LENDER  # out of the queue: ``lent_moved`` queues it again
                return None
        elif (spec.affinity is None
                and not infeasible_reasons(self.owner.node_state, spec.placement)
                and not self._kept_deps(spec.deps or ())):
            return None
        return self._remote_actors().where(spec, actor)

    def _remote_actors(self):
        """*Locked.* ``self.elsewhere``, made at first use."""
        if self.elsewhere is None:
            from miniray._private.owner.remote_actors import RemoteActors  # lazy: multi-host

            self.elsewhere = RemoteActors(self.owner, self)
        return self.elsewhere

    # -- creation ------------------------------------------------------------------------
    def create(self, spec: ActorCreationSpec, creator=None) -> bytes:
        """Register and start placing an actor; returns the id of the actor to use (an
        existing one with ``get_if_exists``). ``creator``: the worker whose process asked
        for it (None: the driver); a non-detached actor dies with that process
        (``creator_gone``)."""
        from miniray.exceptions import ActorAlreadyExistsError

        owner = self.owner
        if spec.fn_bytes is not None:
            owner.export_function(spec.fn_id, spec.fn_bytes)
            spec.fn_bytes = None
        if spec.name:
            key = (spec.namespace, spec.name)
            existing = self.names.get(key)
            if existing is not None and self.actors[existing].state != A_DEAD:
                if spec.get_if_exists:
                    return existing
                raise ActorAlreadyExistsError(
                    f"The name {spec.name} (namespace={spec.namespace}) is already taken. "
                    "Please use a different name or get the existing actor using "
                    f"ray.get_actor('{spec.name}', namespace='{spec.namespace}')")
            self.names[key] = spec.actor_id
        actor = _Actor(spec)
        self.actors[spec.actor_id] = actor
        if creator is not None and not spec.detached:
            actor.creator = creator
            self.created_by.setdefault(creator, {})[spec.actor_id] = None
        objects = owner.objects
        if spec.contained:  # refs nested in the constructor's arguments: held while it lives
            objects.hold(spec.contained)
        env_error = owner.runtime_env_error(spec.runtime_env or "")
        if env_error is not None:  # as Ray: the handle is returned, every call fails
            from miniray.exceptions import RuntimeEnvSetupError

            self._die(actor, serialization.dumps(RuntimeEnvSetupError(
                "Could not create the actor because its associated runtime env failed to be "
                "created.\n" + env_error.error_message)), init=True)
            return spec.actor_id
        for _position, object_id in spec.deps or ():
            entry = objects.get(object_id)
            if entry is None:
                self._die(actor, serialization.dumps(objects.lost(object_id)), init=True)
                return spec.actor_id
            entry.holders += 1
            actor.holds.append(object_id)
            if entry.state == PENDING:
                if entry.remote is not None:
                    continue  # kept on another node: the placer decides where it is read
                actor.waiting += 1
                entry.add_waiter(_KeptCreationDep(self, actor))
            elif entry.kind == protocol.ERR:
                self._init_error_from_dep(actor, object_id)
                return spec.actor_id
        if spec.lent is not None and spec.pg is not None:  # lent by its driver
            self._remote_actors().nodes.bundles.borrow(spec)
        if actor.waiting == 0:
            self._place(actor)
        return spec.actor_id

    def _creation_dep_ready(self, actor: _Actor, is_error: bool, object_id: bytes) -> None:
        if actor.state == A_DEAD:
            return
        if is_error:
            self._init_error_from_dep(actor, object_id)
            return
        actor.waiting -= 1
        if actor.waiting == 0:
            self._place(actor)

    def _init_error_from_dep(self, actor: _Actor, object_id: bytes) -> None:
        from miniray.exceptions import ActorDiedError

        # Ray's: the constructor's own error, naming the argument's.
        error = dependency_error(serialization.loads(self.owner.objects.error_bytes(object_id)),
                                 f"{actor.spec.class_name}.__init__")
        actor.init_failed = True
        self._die(actor, serialization.dumps(ActorDiedError(error)))

    def place_again(self, actor: _Actor) -> None:
        """*Locked.* A restarting ``actor`` whose place is known now (``remote_actors``:
        its lending driver said where its bundle went) is placed; one already queued just
        gets a placer pass."""
        if actor.state != A_DEAD:
            self._place(actor)

    def _place(self, actor: _Actor) -> None:
        """*Locked.* Queue ``actor`` for placement; the placer takes its lease and starts its
        worker once the lock is released (``_run_placer``)."""
        if actor not in self.pending:
            self.pending.append(actor)
        self._schedule_placer()

    def _schedule_placer(self) -> None:
        if not self._placer_scheduled:
            self._placer_scheduled = True
            self.owner.defer(self._run_placer)

    def _run_placer(self) -> None:
        """*Not locked.* Place pending actors in order (first come, first placed, except that
        an actor whose request does not cover one that failed goes ahead of it:
        ``scheduling.next_to_place``): for each, a lease from the ledgers and a worker from
        the fork server, taken without the lock; then, under it, re-checked (killed
        meanwhile? fork server replaced?) and started."""
        owner = self.owner
        with owner.locked():
            self._placer_scheduled = False
        failed: list = []  # placements that did not fit in this pass
        while True:
            with owner.locked():
                while self.pending and self.pending[0].state == A_DEAD:
                    self.pending.pop(0)
                # A new fork server is being started (or none is left): wait for it.
                if not self.pending or not owner.may_dispatch():
                    return
                index = 0 if not failed else scheduling.next_to_place(  # the head is alive
                    [None if a.state == A_DEAD else a.spec.placement for a in self.pending],
                    failed)
                if index is None:
                    return
                actor = self.pending[index]
                spec = actor.spec
                fork_server = owner.fork_server
                if self._other_node(spec, actor) is not None:  # remote_actors.py has it now
                    if actor in self.pending:  # (not when it died unschedulable)
                        self.pending.remove(actor)
                    continue
                if self._pull_kept(actor):  # placed here: its kept arguments come first
                    continue
            tag = f"actor {spec.class_name}" + (f" name={spec.name}" if spec.name else "")
            try:
                lease, host_lease = owner.leases.acquire(
                    spec.placement, tag, ("actor", spec.actor_id), make_room=owner.make_room)
            except (OSError, ValueError) as error:  # a ledger that cannot hold it, or is gone
                with owner.locked():
                    if actor.state != A_DEAD:
                        self._die(actor, serialization.dumps(error))
                continue
            if lease is None:
                gone = spec.pg is not None and owner.placement_group_gone(spec.pg[0])
                with owner.locked():
                    if gone and actor.state != A_DEAD:  # its group was removed: never fits
                        self._end_in_removed_group(actor, spec.pg[0])
                        continue
                    if not self._report_infeasible(spec):
                        # Other sessions hold what it needs: their releases reach no event
                        # of this owner, so it asks the ledger again on the retry timer.
                        owner.retry_soon()
                failed.append(spec.placement)
                continue
            placed, held = placement.as_leased(spec.placement, spec.held, lease.resources)
            shrink = {name: held.get(name, 0) - amount
                      for name, amount in placed.items()
                      if not placement.keeps_instances(name) and held.get(name, 0) != amount}
            if shrink:
                owner.ledger.adjust(lease.lease_id, shrink)
            parts = owner.start_worker(fork_server)
            with owner.locked():
                usable = owner.may_adopt(fork_server)
                if actor.state == A_DEAD or not usable:  # killed, or its request was lost
                    owner.discard_start(parts)
                    owner.release_lease_later(lease.lease_id, host_lease)
                    if actor.state == A_DEAD:
                        continue
                    return
                self.pending.remove(actor)
                self._start(actor, lease, host_lease,
                            owner.adopt_worker(parts, spec.runtime_env or ""))

    def _pull_kept(self, actor: _Actor) -> bool:
        """*Locked.* The placer keeps ``actor`` on this node: its constructor's arguments
        kept on another node are pulled here now (waiters added), and the actor leaves the
        placer until they are here (``_creation_dep_ready`` places it again). Whether any
        was to pull. An argument lost meanwhile (a restart after the node that kept it
        died): the actor dies with the constructor's error naming it, as at creation."""
        objects = self.owner.objects
        for _position, object_id in actor.spec.deps or ():
            entry = objects.get(object_id)
            if entry is not None and entry.state != PENDING and entry.kind == protocol.ERR:
                self._init_error_from_dep(actor, object_id)
                return True
        kept = self._kept_deps(actor.spec.deps or ())
        if not kept:
            return False
        self.pending.remove(actor)
        for entry in kept.values():
            actor.waiting += 1
            entry.add_waiter(_CreationDep(self, actor))
        return True

    def _report_infeasible(self, spec) -> bool:
        """*Locked.* One stderr line per resource shape that this node can never hold;
        whether it can never hold this one."""
        owner = self.owner
        reasons = infeasible_reasons(owner.node_state, spec.placement)
        key = tuple(sorted(spec.placement.items()))
        if reasons and key not in self._reported:
            self._reported.add(key)
            print(f"{format_infeasible(spec.placement, reasons)} "
                  f"(actor {spec.class_name})", file=sys.stderr, flush=True)
        return bool(reasons)

    def _start(self, actor: _Actor, lease, host_lease, worker) -> None:
        """*Locked.* The actor has its lease and worker: send its constructor, then calls."""
        owner = self.owner
        spec = actor.spec
        actor.lease = lease
        actor.host_lease = host_lease
        if spec.pg is not None:
            owner.note_placement_use()
        elsewhere = getattr(worker, "elsewhere", False)  # on another node: no local lease
        gpu_ids = (worker.gpu_ids if elsewhere else owner.leases.gpu_ids(lease)
                   if scheduling.worker_kind(spec.held) else None)
        worker.actor = actor
        if self.route_output is not None:
            route = self.route_output(actor)
            if elsewhere:  # read by the worker's output threads, which hold no lock
                route = _locked_route(owner, route)
            worker.out.route = worker.err.route = route
        if not elsewhere:
            owner.count_actor_worker(1)
        actor.worker = worker
        actor.pid = None
        actor.node = worker.node if elsewhere else None
        actor.state = A_ALIVE
        dep_values = None
        if spec.deps:  # read now, while the constructor's arguments are pinned by this actor
            kept = self._kept_deps(spec.deps) if elsewhere else None
            if kept:  # kept on a node: its sender reads or fetches them there
                dep_values = self._kept_payloads(spec.deps, kept, pin=False)
            else:
                dep_values = owner.requests.dep_payloads(spec.deps, pin=False)
        ctx = ({k: float(v) for k, v in spec.held.items()}, gpu_ids, owner.gpu_ids_are_ints,
               spec.max_concurrency, spec.is_async, spec.name, spec.namespace,
               spec.handle_state, actor.restarts, spec.concurrency_groups, spec.pg)
        try:
            worker.funcs.add(spec.fn_id)
            self._send(worker, (protocol.FUNC, spec.fn_id, owner.function_bytes(spec.fn_id)))
            self._send(worker, (protocol.ACTOR_INIT, spec.actor_id, spec.fn_id,
                                spec.class_name, spec.args_blob, dep_values, ctx))
        except OSError:
            pass
        self._pump(actor)

    def fail_placement(self, actor_id: bytes, error: BaseException) -> None:
        actor = self.actors.get(actor_id)
        if actor is not None and actor.state != A_DEAD and actor.worker is None:
            self._die(actor, serialization.dumps(error))

    def place_pending(self) -> None:
        """*Locked.* Try the pending actors again (room may have appeared)."""
        if self.pending:
            self._schedule_placer()

    # -- messages from the actor's worker ------------------------------------------------
    def on_ready(self, worker, ok: bool, error: bytes | None, times=None,
                 repr_name: str = "") -> None:
        actor = worker.actor
        if actor is not None:  # the name its own __repr__ gives it (``custom_repr``)
            actor.repr_name = repr_name
        if self.records is not None and actor is not None and times is not None:
            self.records.creation_done(actor, worker.pid, not ok, times)
        if ok or actor is None:
            return
        from miniray.exceptions import ActorDiedError

        actor.init_failed = True
        cause = serialization.loads(error)
        self._die(actor, serialization.dumps(ActorDiedError(cause)))

    def on_exiting(self, worker, why: str) -> None:
        """The actor is leaving on purpose (exit_actor, __ray_terminate__, sys.exit(0), as
        ``why`` says): send it nothing more, never restart it; calls still queued fail with
        ActorDiedError when its process is gone."""
        if worker.actor is not None:
            worker.actor.exiting = True
            worker.actor.exit_why = why

    def on_worker_exit(self, worker, detail: str) -> None:
        """The actor's process is gone: restart it, or mark it dead and fail its calls."""
        from miniray.exceptions import ActorDiedError, ActorUnavailableError, OutOfMemoryError

        owner = self.owner
        actor = worker.actor
        if self.created_by and actor is not None and not owner.closed:  # its creations
            # die with it (at shutdown every process ends anyway)
            self.creator_gone(worker, f"the worker process (pid={worker.pid}) of actor "
                                      f"{actor.spec.class_name} ended: {detail}")
        elsewhere = getattr(worker, "elsewhere", False)
        if not elsewhere:
            owner.count_actor_worker(-1)
        if actor is None or actor.worker is not worker:
            return
        actor.worker = None
        if actor.lease is not None:
            # Queued before the death is visible to callers, given back once the lock is
            # released: available_resources() (which waits for deferred work) sees it back.
            owner.release_lease_later(actor.lease.lease_id, actor.host_lease)
            actor.lease = actor.host_lease = None
        if actor.state == A_DEAD:
            self._fail_all(actor)
            return
        if actor.killed:
            reason = "The actor is dead because it was killed by `ray.kill`."
        elif actor.exiting:
            reason = ("The actor is dead because its worker process exited intentionally: "
                      f"{actor.exit_why}")
        elif elsewhere and worker.death_reason:  # e.g. its node died (Ray's reason)
            reason = worker.death_reason
        else:
            reason = (f"The actor is dead because its worker process died unexpectedly: "
                      f"{detail}.")
        restart, restarts_left = scheduling.actor_should_restart(
            actor.restarts_left, actor.exiting, actor.killed, actor.no_restart, owner.closed,
            bool(owner.fatal))
        death = ActorDiedError.from_context(
            actor.spec.class_name, actor.spec.actor_id.hex(), pid=worker.pid,
            name=actor.spec.name, namespace=actor.spec.namespace,
            ip=worker.ip if elsewhere else "127.0.0.1", reason=reason)
        oom = getattr(worker, "oom", None)
        if oom is not None and not actor.killed:  # as Ray: its calls' error says so
            death = OutOfMemoryError(oom)
        death_bytes = serialization.dumps(death)
        if restart:
            actor.restarts_left = restarts_left
            actor.restarts += 1
            # As in Ray, a call sent to the process that died and not retried fails, but the
            # actor lives on: ActorUnavailableError, not ActorDiedError.
            why = ("it was killed by `ray.kill`" if actor.killed
                   else f"its worker process died unexpectedly: {detail}")
            actor.killed = False
            unavailable = serialization.dumps(ActorUnavailableError(
                f"The actor is restarting because {why}", actor.spec.actor_id.hex()))
            retry = []
            for call in actor.inflight.values():
                again, call.retries_left = scheduling.consume_retry(call.retries_left)
                if again:
                    retry.append(call)
                else:
                    self._finish(call, [(protocol.ERR, unavailable)]
                                 * max(1, call.spec.num_returns))
            actor.inflight.clear()
            for call in reversed(retry):
                actor.queue.appendleft(call)
            actor.state = A_RESTARTING
            logger.info("restarting actor %s (%s restarts left)", actor.spec.class_name,
                        actor.restarts_left)
            self._place(actor)
            return
        self._die(actor, death_bytes)

    def creator_gone(self, worker, how: str) -> None:
        """*Locked.* ``worker``'s process is gone (``how`` says which and how): every actor
        it created and not detached dies, never restarting, as in Ray, where the process
        that creates an actor owns it and the actor fate-shares with its owner. Their own
        processes' ends take their creations along in turn."""
        for actor in self._untie_creations(worker):
            if actor.state != A_DEAD and not actor.remote:
                self.kill(actor.spec.actor_id, True, reason=owner_died(how))

    def creator_retired(self, worker) -> None:
        """*Locked.* ``worker``'s process was asked to exit by its owner (idle, or
        ``max_calls`` reached): what it created lives on, owned by the driver (Ray keeps a
        worker that owns actors from exiting; here the driver is every actor's keeper)."""
        self._untie_creations(worker)

    def _untie_creations(self, worker) -> list:
        """*Locked.* The actors ``worker`` created, no longer tied to it."""
        created = [self.actors.get(actor_id)
                   for actor_id in self.created_by.pop(worker, None) or ()]
        for actor in created:
            if actor is not None:
                actor.creator = None
        return [actor for actor in created if actor is not None]

    def _die(self, actor: _Actor, death: bytes, init: bool = False) -> None:
        if actor.creator is not None:
            created = self.created_by.get(actor.creator)
            if created is not None:
                created.pop(actor.spec.actor_id, None)
                if not created:
                    del self.created_by[actor.creator]
            actor.creator = None
        if actor.state != A_DEAD and actor.spec.contained:
            self.owner.objects.release(actor.spec.contained)
        holds, actor.holds = actor.holds, []
        self.owner.objects.release(holds)  # no restart will need them
        actor.state = A_DEAD
        actor.death = death
        if actor in self.pending:
            self.pending.remove(actor)
        self.free_name(actor)
        self._fail_all(actor)
        if actor.worker is None and actor.lease is not None:
            self.owner.release_lease_later(actor.lease.lease_id, actor.host_lease)
            actor.lease = actor.host_lease = None

    def fail_every_actor(self, reason: str) -> None:
        """*Locked.* The session cannot run actors any more (its fork server or node is gone
        for good): every actor not dead yet, proxies included, dies with ``reason``."""
        from miniray.exceptions import ActorDiedError

        for actor in list(self.actors.values()):
            if actor.state == A_DEAD:
                continue
            spec = actor.spec
            death = serialization.dumps(ActorDiedError.from_context(
                spec.class_name, spec.actor_id.hex(), pid=actor.pid, name=spec.name,
                namespace=spec.namespace, ip="127.0.0.1", reason=reason))
            if actor.remote:  # as when the link to the actor service is lost
                actor.state = A_DEAD
                actor.death = death
                self._fail_all(actor)
            else:
                self._die(actor, death)

    def _fail_all(self, actor: _Actor) -> None:
        calls = list(actor.inflight.values()) + list(actor.queue)
        actor.inflight.clear()
        actor.queue.clear()
        for call in calls:
            self._finish(call, [(protocol.ERR, actor.death)] * max(1, call.spec.num_returns))

    # -- kill, cancel, lookup ------------------------------------------------------------
    def kill_in_group(self, pg_hex: str) -> None:
        """*Locked.* The placement group ``pg_hex`` is being removed: every actor of this
        owner placed in it (or waiting to be) ends and never restarts, with Ray's error for
        it (``_end_in_removed_group``)."""
        wildcard = f"bundle_group_{pg_hex}"
        for actor in list(self.actors.values()):
            if (actor.state != A_DEAD and not actor.remote and actor.spec.placement
                    and wildcard in actor.spec.placement):
                self._end_in_removed_group(actor, pg_hex)

    def end_in_removed_group(self, actor_id: bytes, pg_hex: str) -> None:
        """*Locked.* Actor ``actor_id``'s placement group ``pg_hex`` was removed (the node's
        actor service, told so by the driver that lent the actor room in the group:
        ``SVC_KILL``): it ends as ``kill_in_group`` ends the group's actors."""
        actor = self.actors.get(actor_id)
        if actor is not None and actor.state != A_DEAD and not actor.remote:
            self._end_in_removed_group(actor, pg_hex)

    def lent_moved(self, actor_id: bytes, entry, gpu_ids, here: bool) -> bool:
        """*Locked.* The node's actor service, told by the driver that lends actor
        ``actor_id`` room in a bundle on another node that the bundle was placed again
        on ``entry``'s node (``here``: the driver's own; ``SVC_LENT_MOVED``): its restart
        goes there (``remote_actors.RemoteActors.lent_moved``). False: it will not."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == A_DEAD or actor.remote or self.elsewhere is None:
            return False
        return self.elsewhere.lent_moved(actor, entry, gpu_ids, here)

    def _end_in_removed_group(self, actor: _Actor, pg_hex: str) -> None:
        """*Locked.* ``actor``'s placement group ``pg_hex`` was removed: one that never
        started dies unschedulable (no worker to kill: a placement under way sees it dead
        and gives its lease back), one that had started is killed, never restarting
        (``never_created_in_removed_group``)."""
        error = never_created_in_removed_group(actor.state, pg_hex)
        if error is None:
            self.kill(actor.spec.actor_id, True, reason=_group_removed(pg_hex))
            return
        actor.killed = True
        actor.no_restart = True
        self._die(actor, serialization.dumps(error))

    def kill(self, actor_id: bytes, no_restart: bool,
             reason: str = "The actor is dead because it was killed by `ray.kill`.") -> bool:
        """*Locked.* SIGKILL the actor's process (once the lock is released). Unless it will
        restart, it is dead from this moment: later calls fail at once, even before the
        process is gone (its lease is returned when the fork server reports the exit).
        True: the actor lives in the node's actor service, and the caller asks it there
        (``kill_in_service``, without the lock)."""
        from miniray.exceptions import ActorDiedError

        actor = self.actors.get(actor_id)
        if actor is None and self.link is not None:
            actor = self.proxy(actor_id, None)
        if actor is None or actor.state == A_DEAD:
            return False
        if actor.remote:
            return True
        worker = actor.worker
        if worker is None and not no_restart:
            # Not created yet (waiting for room, or between a death and its restart): as in
            # Ray, the kill is one of its restarts, and it is still created when room comes.
            restart, restarts_left = scheduling.actor_should_restart(
                actor.restarts_left, False, True, False, bool(self.owner.closed),
                bool(self.owner.fatal))
            if restart:
                actor.restarts_left = restarts_left
                actor.restarts += 1
                return False
        actor.killed = True
        actor.no_restart = no_restart
        if worker is not None:
            if getattr(worker, "elsewhere", False):
                worker.kill_later()  # its node SIGKILLs it (remote_actors.py)
            elif worker.pid is not None:
                self.owner.kill_process_later(worker.pid)
            else:
                worker.kill_on_spawn = True
        if no_restart or actor.restarts_left == 0 or worker is None:
            self._die(actor, serialization.dumps(ActorDiedError.from_context(
                actor.spec.class_name, actor_id.hex(), pid=worker.pid if worker else None,
                name=actor.spec.name, namespace=actor.spec.namespace,
                ip=getattr(worker, "ip", None) or "127.0.0.1", reason=reason)))
        else:
            # It will restart: send nothing more to the dying process; calls made from now
            # on queue and run on the new one once its exit is reported.
            actor.state = A_RESTARTING
        return False

    def free_name(self, actor: _Actor) -> None:
        """*Locked.* ``actor``'s name, if it still names it, names nothing from now on."""
        spec = actor.spec
        if spec.name and self.names.get((spec.namespace, spec.name)) == spec.actor_id:
            del self.names[(spec.namespace, spec.name)]

    def lookup(self, name: str, namespace: str) -> tuple[bytes, object]:
        """*Locked.* A named actor this manager owns (joined to a node, names live in the
        actor service: ``lookup_in_service``)."""
        self.apply_handle_events()  # a handle dropped just before frees its actor's name
        actor_id = self.names.get((namespace, name))
        actor = self.actors.get(actor_id) if actor_id is not None else None
        if actor is None or actor.state == A_DEAD:
            raise ValueError(
                f"Failed to look up actor with name '{name}'. This could because 1. You are "
                "trying to look up a named actor you didn't create. 2. The named actor died. "
                "3. You did not use a namespace matching the namespace of the actor.")
        return actor_id, actor.spec.handle_state

    def named(self, namespace: str, all_namespaces: bool) -> list:
        """*Locked.* The named actors this manager owns (joined to a node:
        ``named_in_service``)."""
        self.apply_handle_events()  # as lookup()
        out = []
        for (ns, name), actor_id in sorted(self.names.items()):
            if self.actors[actor_id].state == A_DEAD:
                continue
            if all_namespaces:
                out.append({"name": name, "namespace": ns})
            elif ns == namespace:
                out.append(name)
        return out

    def statistics(self) -> dict:
        states = collections.Counter(actor.state for actor in self.actors.values())
        return {"actors": dict(states), "named": len(self.names),
                "pending_placement": len(self.pending)}
