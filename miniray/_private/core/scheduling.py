"""Pure scheduling decisions of the owner: task states, keys, leases with room, retries.

Owns: the rules, as functions and small classes from state to a decision, so they are tested
without processes (``tests/unit/test_scheduling.py``): the task states and which moves between
them are legal, the scheduling key, which lease has room, when to ask the ledger again after
it was full, retry-or-fail for a task whose worker died or whose result asks for a retry, what
cancelling does in each state, and restart-or-die for an actor. Does not own: the tasks,
leases and actors these are applied to, or any I/O (the owner, ``owner/leases.py`` and
``owner/actors.py`` call these under the owner's lock and act on the answer).
Called by: ``owner/owner.py``, ``owner/leases.py``, ``owner/actors.py``.

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
    "actor_call_cancel_error", "cancel_action", "cancelled_call_outcome_stands",
    "consume_retry", "lease_with_room", "may_move", "retry_failed_result", "scheduling_key",
]  # fmt: skip

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


def scheduling_key(request: dict, max_calls: int) -> tuple:
    """Tasks with one key share leases: the same resource request and the same ``max_calls``
    (a worker that reaches a function's ``max_calls`` retires, so it cannot serve others).

    >>> scheduling_key({"GPU": 1, "CPU": 1}, 0)
    ((('CPU', 1), ('GPU', 1)), 0)
    """
    return (tuple(sorted(request.items())), max_calls)


def lease_with_room(leases):
    """The first lease whose worker is neither blocked in ``get()`` nor running a task, or
    None. One task in flight per worker: a task queued behind one that blocks in ``get()``
    could be the very task it waits for. ``leases`` are objects with a ``worker`` that has
    ``blocked`` (a count) and ``inflight`` (a sequence)."""
    for slot in leases or ():
        worker = slot.worker
        if not worker.blocked and not worker.inflight:
            return slot
    return None


class RetryWindow:
    """When to ask the ledger again after an acquire failed.

    After a failure, the ledger is asked again only once something was released here, or
    after ``retry_s`` (for releases by other processes of the node): a burst of queued tasks
    must not cost one ledger transaction each.

    >>> window = RetryWindow(0.05)
    >>> window.may_try(now=1.0)
    True
    >>> window.mark_full(now=1.0); window.may_try(now=1.01)
    False
    >>> window.note_release(); window.may_try(now=1.01)
    True
    """

    __slots__ = ("retry_s", "releases", "_full_at_release", "_full_since")

    def __init__(self, retry_s: float):
        self.retry_s = retry_s
        self.releases = 0  # releases (and other changes that free room) seen so far
        self._full_at_release = -1  # ``releases`` when an acquire last failed
        self._full_since = 0.0

    def may_try(self, now: float) -> bool:
        return not (self._full_at_release == self.releases
                    and now - self._full_since < self.retry_s)

    def mark_full(self, now: float) -> None:
        self._full_at_release = self.releases
        self._full_since = now

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
CANCEL_REMOVE_QUEUED = "remove-queued"  # sent behind another task: taken back, fails now
CANCEL_KILL = "kill"                    # running, force: its worker is killed
CANCEL_SIGNAL = "signal"                # running: the worker is asked to interrupt it


def cancel_action(state: int, force: bool, running_now: bool) -> str:
    """What ``cancel`` does to a task in ``state``; ``running_now``: it is the task its
    worker is executing (not one sent behind it).

    >>> cancel_action(T_QUEUED, False, False), cancel_action(T_RUNNING, True, True)
    ('fail', 'kill')
    >>> cancel_action(T_RUNNING, True, False), cancel_action(T_RUNNING, False, True)
    ('remove-queued', 'signal')
    """
    if state == T_DONE:
        return CANCEL_IGNORE
    if state != T_RUNNING:
        return CANCEL_FAIL
    if not force:
        return CANCEL_SIGNAL
    return CANCEL_KILL if running_now else CANCEL_REMOVE_QUEUED


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

    >>> cancelled_call_outcome_stands(None), cancelled_call_outcome_stands(KeyboardInterrupt())
    (False, False)
    >>> cancelled_call_outcome_stands(ValueError("its own"))
    True
    """
    return error is not None and not isinstance(error, KeyboardInterrupt)


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
