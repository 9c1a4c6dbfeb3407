"""The owner's actors: placement, ordered calls, death, restarts, names and handle counts.

Owns: every actor of the session: its lease in the ledger (what it holds for its lifetime), its
dedicated worker, the calls queued for it (sent in submission order), its restarts, why it died,
the named-actor registry and the count of live handles (an actor whose handles are all gone
exits after its queued calls), and, in a driver joined to a node, a proxy of each named or
detached actor, which lives in the node's actor service (the proxy keeps call order and waits
for arguments here, then sends through ``actor_link.py``). Does not own: worker processes and
sockets (the owner spawns and watches them), actors placed on other nodes' leases and workers
(``remote_actors.py``: asked by the placer, it hands back a worker that stands in for a local
one), objects (the object table), or what runs inside the actor (``actor_host.py``).
Called by: ``owner.Owner`` with its lock held, for driver submissions and worker messages.

::

    create(spec) ──► deps ready ──► ledger.acquire(placement) ──► shrink to held ──► spawn
                        │                     └─ none: pending (retried on releases)
                        ▼
    call(spec) ──► queue (in order; a call waiting on an argument holds back later ones)
                        └──► ACTOR_CALL to the actor's worker ──► RESULT ──► objects ready
    worker exit ──► restart (max_restarts) or DEAD: every pending call gets ActorDiedError

An argument that is a result kept on another node (a ``RemoteCopy``, docs/remote-objects.md)
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
import time
from typing import Any, Protocol

from miniray._private.core import (
    ids,
    placement,
    protocol,
    runtime_envs,
    scheduling,
    serialization,
)
from miniray._private.core.dependency_errors import dependency_error, dependency_error_bytes
from miniray._private.core.resources import format_infeasible, infeasible_reasons
from miniray._private.core.task_spec import ActorCallSpec, ActorCreationSpec
from miniray._private.owner.object_table import PENDING, READY


def _locked_route(owner, route):
    """``route`` called with the owner's lock held: the actor service's route sends on its
    reactor, which every sender reaches under that lock."""
    def locked(target: str, text: str) -> bool:
        with owner.locked():
            return route(target, text)
    return locked


def _group_removed(pg_hex: str) -> str:
    """Ray's reason for an actor whose placement group was removed."""
    return ("The actor is dead because its worker process has died. Worker exit type: "
            "INTENDED_SYSTEM_EXIT Worker exit detail: Destroying worker since its placement "
            f"group was removed. Placement group id: {pg_hex}")


class ActorsOwner(Protocol):
    """What the actor manager and the actor-service link use of their owner: the seam between
    the actors and the rest of the owner, held by ``tests/unit/test_actor_seam.py`` (nothing
    else of the owner is read, and nothing private).

    State it shares: ``objects`` (the object table), ``store``, ``leases`` (the lease book:
    actors take theirs by its one path), ``ledger`` (shrinking a placement to what an actor
    holds), ``requests`` (argument pins), ``reactor``, ``node_state``, ``fork_server``,
    ``hello_info``, ``log_to_driver``, ``gpu_ids_are_ints``, ``actors`` (the manager itself,
    for the link), ``streams`` (a streaming call's values, for the link), ``closed``,
    ``fatal``. What it asks the owner to do is the methods below (``note_placement_use``: an
    actor was placed in a placement group, whose removal by any driver it must notice)."""

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

    def locked(self) -> Any: ...
    def defer(self, action) -> None: ...
    def may_dispatch(self) -> bool: ...
    def may_adopt(self, fork_server) -> bool: ...
    def note_placement_use(self) -> None: ...
    def placement_group_gone(self, pg_hex: str) -> bool: ...
    def in_remote_bundle(self, request: dict) -> bool: ...
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

A_PENDING, A_ALIVE, A_RESTARTING, A_DEAD = "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"


class _Call:
    __slots__ = ("spec", "actor", "waiting", "failed", "retries_left", "sent", "exported",
                 "kept")

    def __init__(self, spec: ActorCallSpec, actor: _Actor):
        self.spec = spec
        self.actor = actor
        self.waiting = 0
        self.failed: bytes | None = None  # an argument's error: the call fails with it
        self.retries_left = spec.max_task_retries
        self.sent = False
        self.exported: list = []  # objects of nested refs sent to the actor service, pinned
        self.kept: tuple = ()  # arguments sent as kept on another node: not pinned here


class _Actor:
    __slots__ = ("spec", "state", "worker", "lease", "host_lease", "queue", "inflight",
                 "restarts_left",
                 "death", "killed", "no_restart", "exiting", "handles", "escaped", "waiting",
                 "pid", "init_failed", "remote", "holds", "restarts", "exit_why", "node")

    def __init__(self, spec: ActorCreationSpec):
        self.spec = spec
        self.state = A_PENDING
        self.worker = None
        self.lease = None
        self.host_lease = None
        self.queue: collections.deque = collections.deque()
        self.inflight: dict[bytes, _Call] = {}
        self.restarts_left = spec.max_restarts or 0
        self.death: bytes | None = None
        self.killed = False
        self.no_restart = True
        self.exiting = False
        self.exit_why = ""  # what the actor said when it chose to exit (ACTOR_EXITING)
        self.handles = 0
        self.escaped = False
        self.waiting = 0
        self.pid: int | None = None
        self.init_failed = False
        self.remote = False  # owned by the node's actor service; this is a proxy
        self.holds: list[bytes] = []  # constructor arguments, held for restarts until death
        self.restarts = 0  # how many times it was restarted (was_current_actor_reconstructed)
        self.node: str | None = None  # another node's id while it lives there (last one once
        # dead): remote_actors.py; None: this driver's node (the state rows read it)

    def __repr__(self) -> str:
        return f"<actor {self.spec.class_name} {self.spec.actor_id.hex()} {self.state}>"


class _CreationDep:
    __slots__ = ("manager", "actor")

    def __init__(self, manager, actor):
        self.manager = manager
        self.actor = actor

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.manager._creation_dep_ready(self.actor, is_error, object_id)


class _CallDep:
    __slots__ = ("manager", "call")

    def __init__(self, manager, call):
        self.manager = manager
        self.call = call

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.manager._call_dep_ready(self.call, is_error, object_id)


class _KeptCallDep(_CallDep):
    """An argument of a call to an actor of this driver still running: a result that
    stays on its node (``object_table.set_ready``'s ``places_first``) is not pulled for the
    call; ``_pump`` decides, once the call heads the queue, where the actor reads it."""

    __slots__ = ()
    places_first = True

    def kept(self, object_id: bytes) -> None:
        self.manager._call_dep_ready(self.call, False, object_id)


class _NestedDep(_CallDep):
    """A ref nested in the arguments of a call to a service actor: its value travels with the
    call, so the call waits for it (an error is the value, not the call's failure)."""

    __slots__ = ()

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.manager._call_dep_ready(self.call, False, object_id)


class ActorManager:
    """Given at construction: its owner, used only through ``ActorsOwner``."""

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

    def is_node_actor(self, spec: ActorCreationSpec) -> bool:
        """Whether this actor is created in the node's actor service (named or detached,
        from a driver joined to a node) rather than owned here. The service places it on
        another node by the same rules as a driver (``_other_node``)."""
        return self.link is not None and bool(spec.name or spec.detached)

    def _other_node(self, spec: ActorCreationSpec, actor=None):
        """*Locked.* Where another node takes this actor (``remote_actors.RemoteActors.where``:
        a node id or an ``Unschedulable`` text), or None to place it here as before: only an
        actor with a node affinity or SPREAD, or a request this node can never hold, outside
        a placement group (in a driver or in the node's actor service alike); or one in a
        placement group's bundle on another node (``remote_bundles``; in the actor
        service, one that its creating driver lent it: ``spec.lent``)."""
        if spec.pg is not None:
            if spec.lent is None and not self.owner.in_remote_bundle(spec.placement):
                return None
        elif (spec.affinity is None
                and not infeasible_reasons(self.owner.node_state, spec.placement)):
            return None
        return self._remote_actors().where(spec, actor)

    def _remote_actors(self):
        """*Locked.* ``self.elsewhere``, made at first use."""
        if self.elsewhere is None:
            from miniray._private.owner.remote_actors import RemoteActors  # lazy: multi-host

            self.elsewhere = RemoteActors(self.owner, self)
        return self.elsewhere

    # -- the node's actor service: requests made without the lock -------------------------
    def create_in_service(self, spec: ActorCreationSpec) -> bytes:
        """*Not locked.* Create the actor in the node's actor service and keep a proxy;
        raises what the service raised (e.g. ActorAlreadyExistsError). The values of its
        ObjectRef arguments go along (pinned while the request is out); those not ready yet
        follow when they are (the actor waits for them there, as any actor waits for its
        arguments)."""
        owner = self.owner
        lent = self._lend(spec) if spec.pg is not None else None
        try:
            return self._create_in_service(spec, lent)
        finally:
            if lent is not None:
                with owner.locked():
                    bundles = self._remote_actors().nodes.bundles
                    if lent.get("kept"):
                        bundles.lend(spec.actor_id, lent["bundle"], spec.name,
                                     spec.namespace, spec.held)
                        owner.note_placement_use()  # the watch follows the loan
                    else:
                        bundles.give_back(lent["bundle"], spec.held, spec.actor_id)

    LEND_WAIT_S = 30.0  # a named actor waits this long for room in a remote bundle

    def _lend(self, spec: ActorCreationSpec) -> dict | None:
        """*Not locked.* A named actor in a bundle this driver holds on another node
        (``remote_bundles`` step 7): its room taken there (waiting up to LEND_WAIT_S for
        it), "any bundle" made the bundle picked, and ``spec.lent`` set for the service;
        None when the bundle is not remote. Raises, naming why, for a detached actor, a
        driver on another host than the service, or no room in time."""
        owner = self.owner
        deadline = time.monotonic() + self.LEND_WAIT_S
        far = None
        while True:
            with owner.locked():
                if not owner.in_remote_bundle(spec.placement):
                    return None
            if far is None:
                far = self.link.on_another_host()
            with owner.locked():
                if not owner.in_remote_bundle(spec.placement):
                    return None
                if spec.detached or far:
                    why = ("a detached actor must outlive this driver, and the bundle's "
                           "lease on the other node is held by this driver's link; use a "
                           "bundle on this node, or leave out lifetime='detached'"
                           if spec.detached else
                           "the node's actor service is on another host than this driver, "
                           "and the group is held by this driver's node; leave out the "
                           "name, or create the actor from a driver on the head's host")
                    raise NotImplementedError(
                        f"actor {spec.class_name}: placement group bundle on another node: "
                        f"{why}")
                bundles = self._remote_actors().nodes.bundles
                bundle = bundles.take(spec.placement, spec.held, spec.actor_id)
                if bundle is not None:
                    pg_hex, index, base = placement.bundle_request(spec.placement)
                    if index < 0:  # the service borrows the very bundle picked here
                        spec.placement = placement.rewrite_request(base, pg_hex, bundle.index)
                        held = (placement.bundle_request(spec.held) or ("", 0, {}))[2]
                        spec.held = placement.rewrite_request(held, pg_hex, bundle.index)
                    spec.lent = (bundle.entry, bundle.gpus_of(spec.actor_id))
                    return {"bundle": bundle, "kept": False}
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"actor {spec.class_name}: its placement group bundle on another node "
                    f"had no room for it within {self.LEND_WAIT_S:g} s; end the actors "
                    "there, or create it once a task in that bundle ended")
            time.sleep(0.05)

    def _create_in_service(self, spec: ActorCreationSpec, lent: dict | None) -> bytes:
        owner = self.owner
        with owner.locked():
            if spec.fn_bytes is None:
                spec.fn_bytes = owner.function_bytes(spec.fn_id)
            job_env = owner.hello_info.get("runtime_env")
            if not spec.runtime_env and job_env:  # the service's own job is not this driver's
                spec.runtime_env = runtime_envs.env_key(job_env)
            objects = owner.objects
            needed = self.nested_ids(spec)
            later = [i for i in needed
                     if (e := objects.get(i)) is not None and e.state == PENDING]
            exported = self.export([i for i in needed if i not in later])
            objects.hold(later)  # not freed while the request is out, whoever drops its refs
        reply = None
        try:
            reply = self.link.create(spec, exported + [(i, None, None) for i in later])
        finally:
            with owner.locked():
                owner.requests.unpin_ids(object_id for object_id, _k, _p in exported)
                if reply is not None:
                    actor_id, state = reply
                    self.proxy(actor_id, state, spec)
                    if lent is not None:  # the service placed it in the room taken
                        lent["kept"] = actor_id == spec.actor_id
                    if actor_id == spec.actor_id:
                        for object_id in later:  # some may be ready by now: sent at once
                            self.link.forward_when_ready(object_id)
                objects.release(later)
        return reply[0]

    def lookup_in_service(self, name: str, namespace: str) -> tuple[bytes, object]:
        """*Not locked.* ``(actor id, handle state)`` of a named actor of the node's actor
        service; a proxy is kept for it."""
        actor_id, state = self.link.lookup(name, namespace)
        with self.owner.locked():
            self.proxy(actor_id, state)
        return actor_id, state

    def named_in_service(self, namespace: str, all_namespaces: bool) -> list:
        """*Not locked.* The named actors of the node's actor service."""
        return self.link.named(namespace, all_namespaces)

    def kill_in_service(self, actor_id: bytes, no_restart: bool) -> None:
        """*Not locked.* Ask the node's actor service to kill one of its actors (``kill``
        said that it lives there)."""
        self.link.kill(actor_id, no_restart)

    def export(self, object_ids) -> list:
        """*Locked.* ``[(id, kind, payload)]`` of the ready ones of these objects, for the
        actor service, pinned (the caller unpins them once the service has them)."""
        objects = self.owner.objects
        out = []
        for object_id in dict.fromkeys(object_ids or ()):
            entry = objects.get(object_id)
            if entry is None or entry.state != READY:
                continue  # freed: reading it in the actor raises its loss
            self.owner.store.pin(object_id)
            out.append((object_id,) + objects.read(object_id))
        return out

    def nested_ids(self, spec) -> list[bytes]:
        """Every object a call to the actor service needs the value of before it is sent."""
        ids = [object_id for _position, object_id in spec.deps or ()]
        return list(dict.fromkeys(ids + list(spec.contained or ())))

    def proxy(self, actor_id: bytes, state, spec: ActorCreationSpec | None = None) -> _Actor:
        """*Locked.* The proxy of an actor the node's actor service owns (made on first use)."""
        actor = self.actors.get(actor_id)
        if actor is None:
            if spec is None:
                spec = ActorCreationSpec(actor_id=actor_id, class_name="Actor",
                                         handle_state=state)
            actor = _Actor(ActorCreationSpec(
                actor_id=actor_id, class_name=spec.class_name, name=spec.name,
                namespace=spec.namespace, detached=spec.detached, handle_state=state,
                max_pending_calls=spec.max_pending_calls))
            actor.remote = True
            actor.state = A_ALIVE
            self.actors[actor_id] = actor
        return actor

    # -- creation ------------------------------------------------------------------------
    def create(self, spec: ActorCreationSpec) -> bytes:
        """Register and start placing an actor; returns the id of the actor to use (an
        existing one with ``get_if_exists``)."""
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
                actor.waiting += 1
                entry.add_waiter(_CreationDep(self, actor))
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
        error = dependency_error(serialization.loads(self.owner.store.inline_bytes(object_id)),
                                 f"{actor.spec.class_name}.__init__")
        actor.init_failed = True
        self._die(actor, serialization.dumps(ActorDiedError(error)))

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
                        self.kill(spec.actor_id, True, reason=_group_removed(spec.pg[0]))
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

    def _send(self, worker, message: tuple, soon: bool = False) -> None:
        """*Locked.* A message to an actor's worker, never blocking: a local one through the
        owner's I/O thread, one on another node through its sender (``remote_actors.py``)."""
        if getattr(worker, "elsewhere", False):
            worker.send(message)
        elif soon:
            self.owner.send_soon(worker, message)
        else:
            self.owner.send(worker, message)

    def fail_placement(self, actor_id: bytes, error: BaseException) -> None:
        actor = self.actors.get(actor_id)
        if actor is not None and actor.state != A_DEAD and actor.worker is None:
            self._die(actor, serialization.dumps(error))

    def place_pending(self) -> None:
        """*Locked.* Try the pending actors again (room may have appeared)."""
        if self.pending:
            self._schedule_placer()

    # -- calls ---------------------------------------------------------------------------
    def submit(self, actor_id: bytes, spec: ActorCallSpec) -> None:
        from miniray.exceptions import ActorDiedError

        owner = self.owner
        objects = owner.objects
        if spec.reply is None:
            for object_id in spec.return_ids:
                objects.ensure(object_id)
        actor = self.actors.get(actor_id)
        if actor is None and self.link is not None:
            actor = self.proxy(actor_id, None)  # a handle that came by value: ask the node's
        if actor is None:
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
        call = _Call(spec, actor)
        self.calls[spec.task_id] = call
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
        actor.queue.append(call)
        self._pump(actor)

    def _call_dep_ready(self, call: _Call, is_error: bool, object_id: bytes) -> None:
        if is_error and call.failed is None:
            call.failed = self._dep_error(call, object_id)
        call.waiting -= 1
        self._pump(call.actor)

    def _dep_error(self, call: _Call, object_id: bytes) -> bytes:
        """Ray's error for a call whose argument ``object_id`` failed: the call's own."""
        name = f"{call.actor.spec.class_name}.{call.spec.call_name}"
        return dependency_error_bytes(self.owner.store.inline_bytes(object_id), name)

    def _pump(self, actor: _Actor) -> None:
        """Send queued calls, in order, while the head of the queue is ready to go: to the
        actor's worker, or for a proxy to the node's actor service (argument values pinned
        here until the result comes back)."""
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
        while queue and queue[0].waiting <= 0:
            call = queue.popleft()
            spec = call.spec
            if call.failed is not None:
                self._finish(call, [(protocol.ERR, call.failed)] * max(1, spec.num_returns))
                continue
            dep_values = spec.payloads
            call.kept = ()
            if spec.deps:
                kept = self._kept_deps(spec.deps)
                if kept and (remote or mapper is not None):  # read here: pulled first
                    for entry in kept.values():
                        call.waiting += 1
                        entry.add_waiter(_CallDep(self, call))
                    queue.appendleft(call)
                    break
                if kept:  # on another node: its sender reads or fetches them there
                    call.kept = tuple(kept)
                    dep_values = owner.requests.dep_payloads(
                        [d for d in spec.deps if d[1] not in kept], pin=True)
                    dep_values += [(position, kept[object_id].kind,
                                    ("kept", object_id, kept[object_id].remote))
                                   for position, object_id in spec.deps if object_id in kept]
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
                    spec.concurrency_group), call.exported)
                continue
            try:
                self._send(actor.worker, (protocol.ACTOR_CALL, spec.task_id, spec.method,
                                          spec.args_blob, dep_values, spec.return_ids,
                                          spec.num_returns, spec.call_name,
                                          spec.concurrency_group), busy)
            except OSError:
                pass  # the worker is dying; its exit report decides what happens

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

    def on_remote_result(self, task_id: bytes, results: list, nested=None) -> None:
        """*Locked.* The node's actor service answered a call of a proxy. ``nested``:
        ``[(index, [(id, kind, payload)])]``, the objects of refs inside result ``index``,
        which become this driver's and live as long as that result."""
        call = self.calls.get(task_id)
        if call is None or call.actor.inflight.pop(task_id, None) is None:
            for _index, items in nested or ():
                for _id, _kind, payload in items:
                    self.link.discard(payload)
            return
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

    def _finish(self, call: _Call, results: list, contained=None, times=None) -> None:
        spec = call.spec
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

    def _deliver(self, spec: ActorCallSpec, results: list, contained=None) -> None:
        if spec.reply is not None:
            spec.reply(results, contained)
            return
        objects = self.owner.objects
        for object_id, (kind, data) in zip(spec.return_ids, results):
            objects.set_ready(object_id, kind, data)

    def _fail_refs(self, spec: ActorCallSpec, data: bytes) -> None:
        self._deliver(spec, [(protocol.ERR, data)] * max(1, len(spec.return_ids)))

    # -- messages from the actor's worker ------------------------------------------------
    def on_ready(self, worker, ok: bool, error: bytes | None, times=None) -> None:
        actor = worker.actor
        if self.records is not None and actor is not None and times is not None:
            self.records.creation_done(actor, worker.pid, not ok, times)
        if ok or actor is None:
            return
        from miniray.exceptions import ActorDiedError

        actor.init_failed = True
        cause = serialization.loads(error)
        self._die(actor, serialization.dumps(ActorDiedError(cause)))

    def on_result(self, worker, task_id: bytes, results: list, contained=None,
                  times=None) -> None:
        actor = worker.actor
        call = actor.inflight.pop(task_id, None) if actor is not None else None
        if call is None:
            return
        self._finish(call, results, contained, times)

    def on_exiting(self, worker, why: str) -> None:
        """The actor is leaving on purpose (exit_actor, __ray_terminate__, sys.exit(0), as
        ``why`` says): send it nothing more, never restart it; calls still queued fail with
        ActorDiedError when its process is gone."""
        if worker.actor is not None:
            worker.actor.exiting = True
            worker.actor.exit_why = why

    def on_worker_exit(self, worker, detail: str) -> None:
        """The actor's process is gone: restart it, or mark it dead and fail its calls."""
        from miniray.exceptions import ActorDiedError, ActorUnavailableError

        owner = self.owner
        actor = worker.actor
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

    def _die(self, actor: _Actor, death: bytes, init: bool = False) -> None:
        if actor.state != A_DEAD and actor.spec.contained:
            self.owner.objects.release(actor.spec.contained)
        holds, actor.holds = actor.holds, []
        self.owner.objects.release(holds)  # no restart will need them
        actor.state = A_DEAD
        actor.death = death
        if actor in self.pending:
            self.pending.remove(actor)
        spec = actor.spec
        if spec.name and self.names.get((spec.namespace, spec.name)) == spec.actor_id:
            del self.names[(spec.namespace, spec.name)]
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
        owner placed in it (or waiting to be) is killed and never restarts, dying with Ray's
        reason for it."""
        wildcard = f"bundle_group_{pg_hex}"
        for actor in list(self.actors.values()):
            if (actor.state != A_DEAD and not actor.remote and actor.spec.placement
                    and wildcard in actor.spec.placement):
                self.kill(actor.spec.actor_id, True, reason=_group_removed(pg_hex))

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
        actor.killed = True
        actor.no_restart = no_restart
        worker = actor.worker
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

    def cancel(self, task_id: bytes, force: bool, recursive: bool = True) -> bool:
        """Cancel an actor call (and with ``recursive`` the tasks it submitted); False if
        ``task_id`` is not an actor call."""
        call = self.calls.get(task_id)
        if call is None:
            return False
        if force:
            raise ValueError("force=True is not supported for actor tasks.")
        actor = call.actor
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

    def lookup(self, name: str, namespace: str) -> tuple[bytes, object]:
        """*Locked.* A named actor this manager owns (joined to a node, names live in the
        actor service: ``lookup_in_service``)."""
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
        out = []
        for (ns, name), actor_id in sorted(self.names.items()):
            if self.actors[actor_id].state == A_DEAD:
                continue
            if all_namespaces:
                out.append({"name": name, "namespace": ns})
            elif ns == namespace:
                out.append(name)
        return out

    # -- handles -------------------------------------------------------------------------
    def keep_for_workers(self, actor_id: bytes) -> None:
        """*Locked.* A worker got a handle to a named actor (``get_actor``, or its creation in
        the node's actor service): kept as if its handle had escaped (a name finds it
        again), and for a service actor this driver holds it until it disconnects. Other
        actors a worker makes or holds are counted from its handle events
        (``worker_handles``)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.escaped:
            return
        actor.escaped = True
        if actor.remote:
            self.link.hold(actor_id, True)

    def worker_handles(self, events: list) -> None:
        """*Locked.* A worker's actor handle events (a BORROW's ``handles``, in order):
        counted with the driver's own, so an actor whose last handle a worker dropped ends
        as when the driver drops its last one (Ray's rule, wherever the handle was made)."""
        for actor_id, delta in events:
            self.handle_event(actor_id, delta)

    def handle_event(self, actor_id: bytes, delta: int) -> None:
        """A handle to ``actor_id`` was made (+1), dropped (-1) or pickled (0); lock-free
        (a deque append: the I/O thread applies it, ``apply_handle_events``)."""
        if delta > 0:
            self.handle_created(actor_id)
        elif delta < 0:
            self.handle_dropped(actor_id)
        else:
            self.handle_pickled(actor_id)

    def handle_created(self, actor_id: bytes) -> None:
        self.handle_events.append((actor_id, 1))

    def handle_dropped(self, actor_id: bytes) -> None:
        first = not self.handle_events
        self.handle_events.append((actor_id, -1))
        if first:  # the I/O thread applies it (and the actor exits) even when all is idle
            self.owner.reactor.wake()

    def handle_pickled(self, actor_id: bytes) -> None:
        self.handle_events.append((actor_id, 0))

    def apply_handle_events(self) -> None:
        """When the last handle of a non-detached actor is gone, it exits after its calls."""
        events = self.handle_events
        while events:
            try:
                actor_id, delta = events.popleft()
            except IndexError:
                break
            actor = self.actors.get(actor_id)
            if actor is None:
                continue
            if delta == 0:
                actor.escaped = True
                continue
            actor.handles += delta
            if actor.remote:  # the service counts which drivers hold it
                if delta > 0 and actor.handles == 1:
                    self.link.hold(actor_id, True)
                elif actor.handles <= 0 and not actor.escaped:
                    self.link.hold(actor_id, False)
                continue
            if (delta < 0 and actor.handles <= 0 and not actor.escaped
                    and not actor.spec.detached and actor.state != A_DEAD):
                self._terminate_when_idle(actor)

    def _terminate_when_idle(self, actor: _Actor) -> None:
        task_id = ids.new_actor_task_id(actor.spec.actor_id)
        spec = ActorCallSpec(task_id, "__ray_terminate__", _NO_ARGS, None,
                             [ids.object_id_for(task_id, 1)], 1, "__ray_terminate__", 0)
        self.owner.objects.ensure(spec.return_ids[0]).dropped = True  # nobody will read it
        self.submit(actor.spec.actor_id, spec)

    def statistics(self) -> dict:
        states = collections.Counter(actor.state for actor in self.actors.values())
        return {"actors": dict(states), "named": len(self.names),
                "pending_placement": len(self.pending)}


_NO_ARGS = serialization.dumps(((), {}))
