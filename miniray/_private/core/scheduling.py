"""Pure scheduling decisions of the owner: task states, keys, leases with room, retries.

Owns: the rules, as functions and small classes from state to a decision, so they are tested
without processes (``tests/unit/test_scheduling.py``): the task states and which moves between
them are legal, the scheduling key, which idle worker may take a lease of which shape, what a
worker blocked in ``get()`` gives back, where a task goes in its queue (nested tasks first,
handed-back ones in submission order), which pending actor to place next, which lease has
room, when to ask the ledger again for a request after one failed, retry-or-fail for a task
whose worker died or whose result asks for a retry, what cancelling does in each state, and
restart-or-die for an actor. Does not own: the tasks, leases and actors these are applied
to, or any I/O (the owner, ``owner/leases.py``, ``owner/workers.py`` and ``owner/actors.py``
call these under the owner's lock and act on the answer).
Called by: ``owner/owner.py``, ``owner/leases.py``, ``owner/workers.py``,
``owner/requests.py``, ``owner/actors.py``.

A task's life::

    WAITING ──► QUEUED ──► RUNNING ──► DONE
       │          │  ▲        │ worker died / retryable failure: retried while
       │          ▼  └────────┘ retries are left (RETRY), else failed (DONE)
       │      INFEASIBLE (stays pending; cancel or shutdown ends it)
       └──────────────────────────────────────► DONE (an argument failed, cancel)
"""

from __future__ import annotations

__all__ = [
    "CANCEL_FAIL", "CANCEL_IGNORE", "CANCEL_KILL", "CANCEL_REMOVE_QUEUED", "CANCEL_SIGNAL",
    "DEATH_FAIL_CANCELLED", "DEATH_FAIL_CRASHED", "DEATH_FAIL_SYSTEM", "DEATH_REQUEUE",
    "DEATH_RETRY", "RetryWindow", "T_DONE", "T_INFEASIBLE", "T_QUEUED", "T_RUNNING",
    "T_WAITING", "TRANSITIONS", "actor_should_restart", "after_worker_death",
    "actor_call_cancel_error", "blocked_release", "cancel_action",
    "cancelled_call_outcome_stands", "cancelled_call_results_stand", "consume_retry",
    "covers", "idle_worker_for",
    "key_tag", "lease_with_room", "may_move", "next_to_place", "queue_index",
    "retry_failed_result",
    "scheduling_key", "worker_fits", "worker_kind", "worker_serves",
]  # fmt: skip

from miniray._private.core import protocol
from miniray.exceptions import TaskCancelledError

# Task states.
T_WAITING, T_QUEUED, T_INFEASIBLE, T_RUNNING, T_DONE = range(5)
STATE_NAMES = ("WAITING", "QUEUED", "INFEASIBLE", "RUNNING", "DONE")

# The legal moves between task states (DONE is final).
TRANSITIONS: dict[int, frozenset] = {
    T_WAITING: frozenset({T_QUEUED, T_INFEASIBLE, T_DONE}),
    T_QUEUED: frozenset({T_RUNNING, T_DONE}),
    T_INFEASIBLE: frozenset({T_DONE}),
    T_RUNNING: frozenset({T_QUEUED, T_DONE}),  # QUEUED: retried or requeued after a death
    T_DONE: frozenset(),
}


def may_move(old: int, new: int) -> bool:
    """Whether a task may go from state ``old`` to ``new``.

    >>> may_move(T_RUNNING, T_QUEUED), may_move(T_DONE, T_QUEUED)
    (True, False)
    """
    return new in TRANSITIONS[old]


def scheduling_key(request: dict, max_calls: int, runtime_env: str = "") -> tuple:
    """Tasks with one key share leases: the same resource request, the same ``max_calls``
    (a worker that reaches a function's ``max_calls`` retires, so it cannot serve others)
    and the same runtime environment (its ``runtime_envs.env_key``; "" is the job's): a
    worker runs in one environment, as Ray starts a worker per runtime environment.

    >>> scheduling_key({"GPU": 1, "CPU": 1}, 0)
    ((('CPU', 1), ('GPU', 1)), 0, '')
    """
    return (tuple(sorted(request.items())), max_calls, runtime_env)


def key_tag(key) -> str:
    """A scheduling key as short text for the ledger's lease tag (shown by status).

    >>> key_tag(scheduling_key({"CPU": 1, "GPU": 0.5}, 0))
    'CPU=1,GPU=0.5'
    """
    return ",".join(f"{name}={value:g}" for name, value in key[0])


def worker_kind(request: dict) -> bool:
    """What a worker becomes once it runs a task of ``request``: a GPU worker (True) or not.

    A task in a placement group's GPU bundle (``GPU_group_...``) is a GPU task too.

    >>> worker_kind({"CPU": 1, "GPU": 0.5}), worker_kind({"CPU": 1}), worker_kind({"GPU": 0})
    (True, False, False)
    """
    if request.get("GPU"):
        return True
    return any(name.startswith("GPU_group_") and amount for name, amount in request.items())


def worker_fits(kind: bool | None, request: dict) -> bool:
    """Whether a worker of ``kind`` (``worker_kind`` of the first task it ran, None while it
    ran none) may run a task of ``request``. As in Ray 2.60's worker pool, a worker that ran a
    GPU task runs only GPU tasks and one that ran any other task never runs a GPU task: the
    device a task set up (``CUDA_VISIBLE_DEVICES``, an initialised CUDA context, memory it
    holds) must not leak into tasks of the other kind.

    >>> worker_fits(None, {"GPU": 1}), worker_fits(False, {"GPU": 1}), worker_fits(True, {})
    (True, False, False)
    """
    return kind is None or kind == worker_kind(request)


def worker_serves(worker, request: dict, runtime_env: str = "") -> bool:
    """Whether an idle ``worker`` (with ``kind`` and ``runtime_env``) may take a lease of
    ``request`` in ``runtime_env``: of a kind that fits (``worker_fits``) and started in that
    runtime environment (as Ray starts a worker per runtime environment).

    >>> from types import SimpleNamespace as W
    >>> worker_serves(W(kind=False, runtime_env=""), {"CPU": 1})
    True
    >>> worker_serves(W(kind=False, runtime_env="A"), {"CPU": 1}, "B")
    False
    """
    return worker.runtime_env == runtime_env and worker_fits(worker.kind, request)


def idle_worker_for(idle, request: dict, runtime_env: str = ""):
    """The index in ``idle`` (oldest first) of the worker to give a lease of ``request`` in
    ``runtime_env``: the most recently idle one that serves it (``worker_serves``), or None
    (start a new one).

    >>> from types import SimpleNamespace as W
    >>> idle = [W(kind=False, runtime_env=""), W(kind=True, runtime_env=""),
    ...         W(kind=False, runtime_env="")]
    >>> idle_worker_for(idle, {"GPU": 1}), idle_worker_for(idle, {"CPU": 1}, "A")
    (1, None)
    """
    for index in range(len(idle) - 1, -1, -1):
        if worker_serves(idle[index], request, runtime_env):
            return index
    return None


def queue_index(queued, depth: int, seq: int | None = None) -> int:
    """Where a task goes in its queue, given ``(depth, seq)`` of the tasks queued there,
    front first: deeper nesting first (a task submitted by a task has depth 1, and so on);
    within a depth, at the end (``seq`` None: a task just ready) or, for a task handed
    back, before the first one submitted after it (submission number ``seq``). A parent
    that submits tasks usually waits for them, blocked, its CPU given back: its children
    then run on that CPU before another parent starts, so nested work does not start a
    worker per parent (50 parents of 10 children each peaked at 52 workers on 2 CPUs with
    one FIFO queue).

    >>> queue_index([(0, 1), (0, 2)], 0), queue_index([(0, 1), (0, 2)], 1)
    (2, 0)
    >>> queue_index([(1, 4), (0, 1)], 1), queue_index([(0, 1), (0, 5)], 0, 3)
    (1, 1)
    """
    index = 0
    for queued_depth, queued_seq in queued:
        if queued_depth < depth or (
                queued_depth == depth and seq is not None and queued_seq > seq):
            return index
        index += 1
    return index


def blocked_release(resources: dict) -> dict:
    """What a task's lease gives back to the ledger while its worker is blocked in ``get()``
    or ``wait()``: its CPU and nothing else (GPUs, memory and custom resources stay held), as
    Ray 2.60 does; a task in a placement group gives back its bundle's CPU (its
    ``CPU_group_*`` names), so a child captured in the same bundle can run, as in Ray. An
    actor's lease gives back nothing (its owner does not call this).

    >>> blocked_release({"CPU": 10000, "GPU": 10000, "R": 5000}), blocked_release({"GPU": 1})
    ({'CPU': 10000}, {})
    """
    out = {name: amount for name, amount in resources.items()
           if amount and (name == "CPU" or name.startswith("CPU_group_"))}
    return out


def lease_with_room(leases):
    """The first lease whose worker is neither blocked in ``get()`` nor holding a task, or
    None: an idle worker is given a task before any is queued behind another one
    (``core/pipelining.py`` decides those). ``leases`` are objects with a ``worker`` that
    has ``blocked`` (a count) and ``inflight`` (a sequence)."""
    for slot in leases or ():
        worker = slot.worker
        if not worker.blocked and not worker.inflight:
            return slot
    return None


def covers(request: dict, failed: dict | None) -> bool:
    """Whether ``request`` asks for at least everything ``failed`` asked for (every resource
    of ``failed``, at least as much), so it cannot fit where ``failed`` did not. None stands
    for a failure that holds back every request (the cap on workers).

    >>> covers({"CPU": 1, "GPU": 1}, {"GPU": 1}), covers({"CPU": 1}, {"CPU": 1, "GPU": 1})
    (True, False)
    >>> covers({"CPU": 1}, {"CPU": 2}), covers({"CPU": 1}, None)
    (False, True)
    """
    if failed is None:
        return True
    for name, amount in failed.items():
        if amount and request.get(name, 0) < amount:
            return False
    return True


def next_to_place(placements, failed) -> int | None:
    """The index of the first pending actor to try to place: ``placements`` are the pending
    actors' requests in creation order (None: skip it), ``failed`` those that did not fit in
    this pass. An actor whose request covers a failed one waits (it cannot fit, and actors of
    one shape are placed in creation order); any other may go ahead, as in Ray 2.60, where a
    GPU actor waiting for the GPU does not hold back a CPU actor that a task blocked in
    ``get()`` on it needs.

    >>> next_to_place([{"GPU": 1}, {"GPU": 1, "CPU": 1}, {"CPU": 1}], [{"GPU": 1}])
    2
    >>> next_to_place([{"CPU": 1}, None], [{"CPU": 1}]) is None
    True
    """
    for index, placement in enumerate(placements):
        if placement is not None and not any(covers(placement, f) for f in failed):
            return index
    return None


class RetryWindow:
    """When to ask the ledger again for a request after an acquire failed.

    After a request failed, the ledger is asked again for it, or for any request that covers
    it (``covers``: it cannot fit either), only once something was released here, or after
    ``retry_s`` (for releases by other processes of the node): a burst of queued tasks must
    not cost one ledger transaction each. Other requests may still be tried: a GPU task
    waiting for the GPU must not hold back the CPU task that would let the GPU's holder
    finish (a parent blocked in ``get()`` on it).

    >>> window = RetryWindow(0.05)
    >>> window.may_try(1.0, {"CPU": 1})
    True
    >>> window.mark_full(1.0, {"CPU": 1, "GPU": 1}); window.may_try(1.01, {"CPU": 1, "GPU": 2})
    False
    >>> window.may_try(1.01, {"CPU": 1})
    True
    >>> window.note_release(); window.may_try(1.01, {"CPU": 1, "GPU": 2})
    True
    """

    __slots__ = ("retry_s", "releases", "_failed", "_failed_at_release")

    def __init__(self, retry_s: float):
        self.retry_s = retry_s
        self.releases = 0  # releases (and other changes that free room) seen so far
        # The requests that failed since the last release: (request, when it failed).
        self._failed: list[tuple[dict | None, float]] = []
        self._failed_at_release = -1  # ``releases`` when they failed

    def may_try(self, now: float, request: dict) -> bool:
        if self._failed_at_release != self.releases:
            return True
        for failed, since in self._failed:  # a plain loop: asked twice per task in a burst
            if now - since < self.retry_s and (
                    failed is None or failed is request or covers(request, failed)):
                return False
        return True

    def mark_full(self, now: float, request: dict | None = None) -> None:
        """``request`` did not fit (None: no request may be tried, the cap on workers)."""
        if self._failed_at_release != self.releases:
            self._failed = []
            self._failed_at_release = self.releases
        self._failed = [(failed, since) for failed, since in self._failed
                        if failed != request and now - since < self.retry_s]
        self._failed.append((request, now))

    def note_release(self) -> None:
        """Room may have appeared (a lease was released, a worker blocked, or the retry
        timer fired): the next ``may_try`` says yes."""
        self.releases += 1


def consume_retry(retries_left: int) -> tuple[bool, int]:
    """``(retry, retries_left after it)``: a negative count means infinite retries.

    >>> consume_retry(2), consume_retry(0), consume_retry(-1)
    ((True, 1), (False, 0), (True, -1))
    """
    if retries_left == 0:
        return False, 0
    return True, retries_left - 1 if retries_left > 0 else retries_left


def retry_failed_result(retryable: bool, retries_left: int, cancelled: bool,
                        done: bool) -> tuple[bool, int]:
    """A task's result reports a failure: ``(retry, retries_left)``. Only a failure the
    worker marked retryable (``retry_exceptions``) of a task still pending, not cancelled,
    with retries left, is retried.

    >>> retry_failed_result(True, 1, False, False), retry_failed_result(True, 1, True, False)
    ((True, 0), (False, 1))
    """
    if not retryable or cancelled or done:
        return False, retries_left
    return consume_retry(retries_left)


# What happens to a task in flight on a worker that died (after_worker_death).
DEATH_FAIL_SYSTEM = "fail-system"        # the session cannot go on: RaySystemError
DEATH_FAIL_CANCELLED = "fail-cancelled"  # it was being cancelled: TaskCancelledError
DEATH_RETRY = "retry"                    # it was running: run it again (a retry is used)
DEATH_FAIL_CRASHED = "fail-crashed"      # it was running, no retries left: WorkerCrashedError
DEATH_REQUEUE = "requeue"                # sent but not started: queue it again, no retry used


def after_worker_death(position: int, cancelled: bool, retries_left: int,
                       fatal: bool) -> tuple[str, int]:
    """``(decision, retries_left)`` for the task at ``position`` in a dead worker's queue
    (0: the one it was running).

    >>> after_worker_death(0, False, 1, False), after_worker_death(0, False, 0, False)
    (('retry', 0), ('fail-crashed', 0))
    >>> after_worker_death(1, False, 0, False), after_worker_death(1, False, 3, True)
    (('requeue', 0), ('fail-system', 3))
    """
    if fatal:
        return DEATH_FAIL_SYSTEM, retries_left
    if position != 0:
        return DEATH_REQUEUE, retries_left
    if cancelled:
        return DEATH_FAIL_CANCELLED, retries_left
    retry, left = consume_retry(retries_left)
    return (DEATH_RETRY if retry else DEATH_FAIL_CRASHED), left


# What cancelling a task does (cancel_action).
CANCEL_IGNORE = "ignore"                # already done
CANCEL_FAIL = "fail"                    # not running: it fails now with the cancel error
CANCEL_REMOVE_QUEUED = "remove-queued"  # sent behind another task: fails now, never runs
CANCEL_KILL = "kill"                    # running, force: its worker is killed
CANCEL_SIGNAL = "signal"                # running: the worker is asked to interrupt it


def cancel_action(state: int, force: bool, running_now: bool) -> str:
    """What ``cancel`` does to a task in ``state``; ``running_now``: it is the task its
    worker is executing (not one pipelined behind it). One pipelined behind has not started:
    it fails at once and the worker skips it, with or without ``force`` (its worker, busy
    with another task, is never killed for it).

    >>> cancel_action(T_QUEUED, False, False), cancel_action(T_RUNNING, True, True)
    ('fail', 'kill')
    >>> cancel_action(T_RUNNING, True, False), cancel_action(T_RUNNING, False, True)
    ('remove-queued', 'signal')
    >>> cancel_action(T_RUNNING, False, False)
    'remove-queued'
    """
    if state == T_DONE:
        return CANCEL_IGNORE
    if state != T_RUNNING:
        return CANCEL_FAIL
    if not running_now:
        return CANCEL_REMOVE_QUEUED
    return CANCEL_KILL if force else CANCEL_SIGNAL


# A cancelled actor call (Ray 2.60, compared side by side): one that never ran fails with
# the "before it executes" error; a sync or threaded one cancelled while it ran only has a
# flag set (``is_canceled()``) and its get()/wait() raise KeyboardInterrupt; when it ends,
# a returned value or a KeyboardInterrupt becomes the "was cancelled" error, and any other
# error it raised stands. (An async one has its coroutine cancelled: RayTaskError of it.)
def actor_call_cancel_error(task_id: bytes, actor_id: bytes | None = None) -> TaskCancelledError:
    """The error of a cancelled actor call, in Ray 2.60's words: with ``actor_id``, the
    call never ran; without, it was cancelled while it ran.

    >>> str(actor_call_cancel_error(b"\x01", b"\x02"))
    'The task 01 is canceled from an actor 02 before it executes.'
    >>> str(actor_call_cancel_error(b"\x01"))
    'Task: 01 was cancelled.'
    """
    if actor_id is not None:
        return TaskCancelledError(None, f"The task {task_id.hex()} is canceled from an actor "
                                        f"{actor_id.hex()} before it executes.")
    return TaskCancelledError(None, f"Task: {task_id.hex()} was cancelled.")


def cancelled_call_outcome_stands(error: BaseException | None) -> bool:
    """A sync or threaded actor call cancelled while it ran has ended, returning a value
    (``error`` None) or raising ``error``: is that its result, or the cancel error?

    A cancellation it raised is the cancel's too: the ``TaskCancelledError`` of a task it
    waited for, cancelled with it (``recursive``) and ended first.

    >>> cancelled_call_outcome_stands(None), cancelled_call_outcome_stands(KeyboardInterrupt())
    (False, False)
    >>> from miniray.exceptions import TaskCancelledError
    >>> cancelled_call_outcome_stands(TaskCancelledError())
    False
    >>> cancelled_call_outcome_stands(ValueError("its own"))
    True
    """
    from miniray.exceptions import TaskCancelledError

    return error is not None and not isinstance(error, (KeyboardInterrupt, TaskCancelledError))


def cancelled_call_results_stand(kinds) -> bool:
    """An actor call that ``ray.cancel()`` (not force) reached after it was sent has ended
    with results of ``kinds`` (``protocol.OK``/``ERR`` each), cancel or not seen by its
    process in time: do they stand, or does each become the cancel error of a call cancelled
    while it ran? As in Ray 2.60, whose owner fails a cancelled call's returned value: an
    error stands (the call's own, or the cancel error its process sent), a value never does,
    even one the process sent before the cancel reached it.

    >>> from miniray._private.core import protocol
    >>> cancelled_call_results_stand([protocol.OK, protocol.OK])
    False
    >>> cancelled_call_results_stand([protocol.ERR])
    True
    """
    return any(kind == protocol.ERR for kind in kinds)


def actor_should_restart(restarts_left: int, exiting: bool, killed: bool, no_restart: bool,
                         closed: bool, fatal: bool) -> tuple[bool, int]:
    """An actor's process is gone: ``(restart, restarts_left)``. It restarts while restarts
    are left (negative: infinite), unless it exited on purpose, was killed with
    ``no_restart``, or the session is closing or cannot run work any more.

    >>> actor_should_restart(1, False, False, True, False, False)
    (True, 0)
    >>> actor_should_restart(-1, False, True, True, False, False)
    (False, -1)
    """
    if exiting or (killed and no_restart) or closed or fatal:
        return False, restarts_left
    return consume_retry(restarts_left)
