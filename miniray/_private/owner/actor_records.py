"""The records of the owner's actors and of their calls, and the actors' states.

Owns: ``_Actor`` (one per actor of the session, or per proxy of a node actor-service actor:
its state, worker, lease, queued and in-flight calls, restarts, handle count, why it died),
``_Call`` (one actor call: its spec, the arguments it waits for, whether it was sent), the
waiters that wake them when an argument is ready (``_CreationDep``, ``_CallDep``,
``_NestedDep``, registered on the object table), and the state names ``A_PENDING``,
``A_ALIVE``, ``A_RESTARTING``, ``A_DEAD`` (Ray's). Plain records: no decisions, no I/O.
Does not own: what happens to them (the actor manager: ``actors.py`` and its mixins
``actor_calls.py``, ``actor_handles.py``, ``actor_service_proxies.py``).
Called by: the actor manager (every field is its to change, with the owner's lock held); the
object table calls a waiter's ``notify``; ``waiting.py``, ``state_records.py`` and the node's
actor service read the records and states.
"""

from __future__ import annotations

import collections

from miniray._private.core.task_spec import ActorCallSpec, ActorCreationSpec

A_PENDING, A_ALIVE, A_RESTARTING, A_DEAD = "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"


class _Call:
    __slots__ = ("spec", "actor", "waiting", "failed", "retries_left", "sent", "exported",
                 "kept", "cancelled", "caller")

    def __init__(self, spec: ActorCallSpec, actor: _Actor, caller=None):
        self.spec = spec
        self.actor = actor
        # Who submitted it: None for this process, else the worker (or the actor service's
        # client) it came from. Calls are ordered per caller, as in Ray (``_pump``).
        self.caller = caller
        self.waiting = 0
        self.failed: bytes | None = None  # an argument's error: the call fails with it
        self.retries_left = spec.max_task_retries
        self.sent = False
        self.exported: list = []  # objects of nested refs sent to the actor service, pinned
        self.kept: tuple = ()  # arguments sent as kept on another node: not pinned here
        self.cancelled = False  # ray.cancel() returned while it was sent: a value fails


class _Actor:
    __slots__ = ("spec", "state", "worker", "lease", "host_lease", "queue", "inflight",
                 "restarts_left",
                 "death", "killed", "no_restart", "exiting", "handles", "escaped", "waiting",
                 "pid", "init_failed", "remote", "holds", "restarts", "exit_why", "node",
                 "creator", "repr_name", "callers")

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
        self.repr_name = ""  # repr(instance) when its class defines __repr__ (ACTOR_READY)
        self.creator = None  # the worker whose process created it, while it may take the
        # actor along when it dies (ActorManager.creator_gone); None: the driver's own
        # Whether calls came from more than one caller: only then may a later call go ahead
        # of one that waits for an argument (``_pump``); one caller pays nothing for it.
        self.callers = False

    def __repr__(self) -> str:
        return f"<actor {self.spec.class_name} {self.spec.actor_id.hex()} {self.state}>"


class _CreationDep:
    __slots__ = ("manager", "actor")

    def __init__(self, manager, actor):
        self.manager = manager
        self.actor = actor

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.manager._creation_dep_ready(self.actor, is_error, object_id)


class _KeptCreationDep(_CreationDep):
    """A constructor argument still running: a result that stays on its node
    (``object_table.set_ready``'s ``places_first``) is not pulled before the actor is
    placed; the placer decides where it is read (``ActorManager._run_placer``)."""

    __slots__ = ()
    places_first = True

    def kept(self, object_id: bytes) -> None:
        self.manager._creation_dep_ready(self.actor, False, object_id)


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
