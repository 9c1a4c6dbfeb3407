"""The specs: what ``.remote()`` builds and the owner runs (TaskSpec, ActorCreationSpec,
ActorCallSpec), and the exception ``exit_actor()`` raises inside an actor.

Owns: the fields of a task, actor creation or actor call and their pickled form (a worker
submitting a nested task or call sends its spec to the owner; a driver sends actor specs to the
node's actor service). Does not own: validation (``options.py``), scheduling (``owner/owner.py``,
``owner/actors.py``) or running (``worker/``).
Called by: the public ``remote_function.py`` and ``actor.py``, the owner, the actor service and
the worker's actor host; here, in the lowest layer, so that none of them imports another's.
"""

from __future__ import annotations

from typing import Any

# ``num_returns`` of a generator call whose values are not a fixed number of returns. Both
# have one return id. STREAMING: that id is the completion object (None, or the task's
# system error), and each yielded value becomes its own object as it is yielded
# (``ids.stream_item_id``; ``ObjectRefGenerator`` iterates them). DYNAMIC: that id holds a
# ``DynamicObjectRefGenerator`` of the values' refs, set when the generator is exhausted.
# Every reader of ``num_returns`` counts ``max(1, num_returns)`` results, so both give one.
# The numbers are Ray's (``ray.actor.STREAMING_GENERATOR_RETURN`` is -2; dynamic is -1).
STREAMING = -2
DYNAMIC = -1


class TaskSpec:
    """One task submission. ``fn_bytes`` is None when the owner already has the function."""

    __slots__ = (
        "task_id",
        "fn_id",
        "fn_bytes",
        "name",
        "function_name",
        "args_blob",
        "deps",
        "return_ids",
        "num_returns",
        "request",
        "max_retries",
        "retry_exceptions",
        "max_calls",
        "contained",
        "runtime_env",
        "placement",
        "affinity",
    )

    def __init__(
        self,
        task_id: bytes,
        fn_id: bytes,
        fn_bytes: bytes | None,
        name: str,
        function_name: str,
        args_blob: bytes,
        deps: list[tuple[Any, bytes]],
        return_ids: list[bytes],
        num_returns: int,
        request: dict[str, float],
        max_retries: int,
        retry_exceptions: Any,
        max_calls: int,
        contained: tuple = (),
        runtime_env: str = "",
        placement: tuple | None = None,
        affinity: str | None = None,
    ):
        self.task_id = task_id
        self.fn_id = fn_id
        self.fn_bytes = fn_bytes
        self.name = name
        self.function_name = function_name
        self.args_blob = args_blob
        self.deps = deps
        self.return_ids = return_ids
        self.num_returns = num_returns
        self.request = request
        self.max_retries = max_retries
        self.retry_exceptions = retry_exceptions
        self.max_calls = max_calls
        self.contained = contained  # ids of refs nested in the arguments: held while pending
        # The environment it runs in (runtime_envs.env_key); "" is the job's. Workers are
        # kept per environment, so it is part of the scheduling key.
        self.runtime_env = runtime_env
        # Its placement group, (hex, bundles, capture_child_tasks) (core/placement.place);
        # its request already names the group's resources.
        self.placement = placement
        # A NodeAffinitySchedulingStrategy's (node_id, soft, on_unavailable), or "SPREAD"
        # (owner/remote_nodes.py places the task); None: no such strategy.
        self.affinity = affinity

    def __reduce__(self):
        return (TaskSpec, tuple(getattr(self, name) for name in TaskSpec.__slots__))

    def __repr__(self) -> str:
        return f"<TaskSpec {self.name} {self.task_id.hex()[:12]} request={self.request}>"


class ActorCreationSpec:
    """Everything needed to create (and re-create) one actor."""

    __slots__ = ("actor_id", "fn_id", "fn_bytes", "class_name", "args_blob", "deps",
                 "placement", "held", "max_restarts", "max_task_retries", "max_concurrency",
                 "is_async", "name", "namespace", "detached", "get_if_exists", "handle_state",
                 "max_pending_calls", "contained", "runtime_env", "concurrency_groups", "pg",
                 "affinity", "lent", "out_of_order")
    # ``out_of_order``: its calls may run as their arguments become ready, not in the order
    # they were submitted (an async or threaded actor, or allow_out_of_order_execution), as
    # Ray sends them (``owner/actor_calls._pump``).
    # ``lent``: a named actor that a driver places in a bundle it holds on another node
    # gives the node's actor service ``(that node's NodeEntry, the actor's GPU ids of the
    # bundle, the lending driver's node id when it is not the service's, else "", whether
    # the actor's creator borrowed the room from that driver[, True: the bundle is on the
    # lending driver's node, which is not the service's: the service leases the actor's
    # room there, and there is no loan])``; the driver keeps the room for it
    # (``owner/remote_bundles.py`` steps 7, 9 and 10).

    def __init__(self, **fields):
        for name in self.__slots__:
            setattr(self, name, fields.get(name))
        if self.runtime_env is None:
            self.runtime_env = ""  # the job's environment (runtime_envs.env_key)

    def __reduce__(self):
        return (_rebuild_creation, ({n: getattr(self, n) for n in self.__slots__},))


def _rebuild_creation(fields):
    return ActorCreationSpec(**fields)


class ActorCallSpec:
    """One actor call. ``payloads`` and ``reply`` are for calls that another driver made to
    an actor this process owns (``actor_service.py``): the argument values come ready, as
    ``[(position, kind, payload)]``, and ``reply(results, contained)`` receives the results
    instead of this process's object table."""

    __slots__ = ("task_id", "method", "args_blob", "deps", "return_ids", "num_returns",
                 "call_name", "max_task_retries", "contained", "payloads",
                 "concurrency_group", "retry_exceptions", "reply")

    def __init__(self, task_id, method, args_blob, deps, return_ids, num_returns, call_name,
                 max_task_retries, contained=(), payloads=None, concurrency_group=None,
                 retry_exceptions=False):
        self.task_id = task_id
        self.method = method
        self.args_blob = args_blob
        self.deps = deps
        self.return_ids = return_ids
        self.num_returns = num_returns
        self.call_name = call_name
        self.max_task_retries = max_task_retries
        self.contained = contained
        self.payloads = payloads
        # The group it runs in (None: the default group), decided by the caller's handle
        # (core/concurrency_groups.call_group).
        self.concurrency_group = concurrency_group
        # False, True or pickled exception classes: an exception the call raises that it
        # names is retried while max_task_retries allows (the actor's worker decides).
        self.retry_exceptions = retry_exceptions
        self.reply = None  # never pickled

    def __reduce__(self):
        return (ActorCallSpec, tuple(getattr(self, n) for n in self.__slots__[:-1]))


class _ExitActor(SystemExit):
    """Raised by ``exit_actor()`` inside an actor; the actor host exits after the call."""
