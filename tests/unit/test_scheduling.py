"""The owner's pure scheduling decisions (``core/scheduling.py``), without any process.

Retry counts follow Ray 2.60's ``max_retries`` / ``max_restarts`` / ``max_task_retries``:
0 means none, a negative number means infinite, and a retry spends one.
"""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest

from miniray._private.core import protocol
from miniray._private.core import scheduling as s


def test_doctests():
    result = doctest.testmod(s)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("old,new,legal", [
    (s.T_WAITING, s.T_QUEUED, True),
    (s.T_WAITING, s.T_INFEASIBLE, True),
    (s.T_WAITING, s.T_DONE, True),       # an argument failed, or cancelled while waiting
    (s.T_WAITING, s.T_RUNNING, False),   # always through the queue
    (s.T_QUEUED, s.T_RUNNING, True),
    (s.T_QUEUED, s.T_WAITING, False),
    (s.T_RUNNING, s.T_QUEUED, True),     # retried, or requeued after its worker died
    (s.T_RUNNING, s.T_DONE, True),
    (s.T_INFEASIBLE, s.T_DONE, True),
    (s.T_INFEASIBLE, s.T_QUEUED, False),  # stays pending until cancel or shutdown
    (s.T_DONE, s.T_QUEUED, False),
    (s.T_DONE, s.T_DONE, False),
])
def test_transitions(old, new, legal):
    assert s.may_move(old, new) is legal


def test_states_are_distinct_and_named():
    states = [s.T_WAITING, s.T_QUEUED, s.T_INFEASIBLE, s.T_RUNNING, s.T_DONE]
    assert len(set(states)) == 5
    assert set(s.TRANSITIONS) == set(states)
    assert s.STATE_NAMES[s.T_DONE] == "DONE"


def test_scheduling_key_ignores_request_order_and_separates_max_calls():
    assert s.scheduling_key({"CPU": 1, "GPU": 1}, 0) == s.scheduling_key({"GPU": 1, "CPU": 1}, 0)
    assert s.scheduling_key({"CPU": 1}, 0) != s.scheduling_key({"CPU": 1}, 3)
    assert s.scheduling_key({"CPU": 1}, 0) != s.scheduling_key({"CPU": 2}, 0)
    hash(s.scheduling_key({"CPU": 0.5, "memory": 10}, 1))  # usable as a dict key


def _slot(blocked=0, inflight=()):
    return SimpleNamespace(worker=SimpleNamespace(blocked=blocked, inflight=list(inflight)))


def test_lease_with_room_skips_busy_and_blocked_workers():
    busy, blocked, free, free2 = _slot(inflight=["t"]), _slot(blocked=1), _slot(), _slot()
    assert s.lease_with_room([busy, blocked, free, free2]) is free
    assert s.lease_with_room([busy, blocked]) is None
    assert s.lease_with_room([]) is None
    assert s.lease_with_room(None) is None


@pytest.mark.parametrize("request_,kind", [
    ({"CPU": 1}, False), ({}, False), ({"CPU": 1, "GPU": 1}, True), ({"GPU": 0.25}, True),
    ({"CPU": 1, "GPU": 0}, False), ({"CPU": 1, "custom": 1}, False),
])
def test_worker_kind_is_gpu_for_any_gpu_share(request_, kind):
    assert s.worker_kind(request_) is kind


def test_workers_are_not_shared_between_gpu_and_other_tasks():
    """Ray 2.60's worker pool keeps a worker that ran a GPU task for GPU tasks and one that
    ran any other task away from GPU tasks (compared with Ray 2.60: ``os.getpid()`` of a GPU
    task with ``max_calls=0`` never equals a CPU task's); a fresh worker fits either."""
    assert s.worker_fits(None, {"GPU": 1}) and s.worker_fits(None, {"CPU": 1})
    assert not s.worker_fits(False, {"CPU": 1, "GPU": 1})
    assert not s.worker_fits(True, {"CPU": 1})
    assert not s.worker_fits(True, {})
    assert s.worker_fits(True, {"GPU": 0.5})  # any share of a GPU: the same kind
    assert s.worker_fits(False, {"CPU": 2, "custom": 1})


def test_idle_worker_for_picks_the_newest_worker_of_the_kind():
    cpu_old, gpu, cpu_new, fresh = (SimpleNamespace(kind=k, runtime_env="")
                                    for k in (False, True, False, None))
    idle = [cpu_old, gpu, cpu_new]
    assert s.idle_worker_for(idle, {"CPU": 1}) == 2
    assert s.idle_worker_for(idle, {"CPU": 1, "GPU": 1}) == 1
    assert s.idle_worker_for([cpu_old, cpu_new], {"GPU": 1}) is None
    assert s.idle_worker_for([gpu], {"CPU": 1}) is None
    assert s.idle_worker_for([gpu, fresh], {"CPU": 1}) == 1
    assert s.idle_worker_for([], {"CPU": 1}) is None
    assert s.idle_worker_for(idle, {"CPU": 1}, "env-A") is None  # started in another env


def test_a_blocked_task_gives_back_its_cpu_only():
    """Compared with Ray 2.60: while a task with ``num_gpus=0.5, num_cpus=2, resources={"R":
    1}`` waits in ``get()``, ``available_resources()`` shows its 2 CPUs free but not its GPU
    share nor its R."""
    assert s.blocked_release({"CPU": 20000, "GPU": 5000, "R": 10000}) == {"CPU": 20000}
    assert s.blocked_release({"CPU": 5000}) == {"CPU": 5000}
    assert s.blocked_release({"GPU": 10000}) == {}  # num_cpus=0: nothing to give back
    assert s.blocked_release({}) == {}
    # in a placement group's bundle: the bundle's CPU names (its other resources stay held)
    h = "ab" * 18
    assert s.blocked_release({f"CPU_group_0_{h}": 10000, f"CPU_group_{h}": 10000,
                              f"GPU_group_0_{h}": 10000, f"bundle_group_{h}": 10}) == {
        f"CPU_group_0_{h}": 10000, f"CPU_group_{h}": 10000}


def test_an_actor_that_cannot_be_placed_holds_back_only_actors_that_need_as_much():
    """Compared with Ray 2.60: a GPU actor waiting for the GPU does not keep a CPU actor
    created after it from being placed; actors of one shape stay in creation order."""
    gpu, cpu = {"CPU": 10000, "GPU": 10000}, {"CPU": 10000}
    assert s.next_to_place([gpu, cpu], []) == 0
    assert s.next_to_place([gpu, gpu, cpu], [gpu]) == 2
    assert s.next_to_place([gpu, cpu, cpu], [gpu, cpu]) is None
    assert s.next_to_place([cpu, gpu], [cpu]) is None  # the GPU actor needs the CPU too
    assert s.next_to_place([None, cpu], []) == 1  # a dead actor is skipped
    assert s.next_to_place([], []) is None


def test_retry_window_asks_again_after_a_release_or_the_delay():
    window = s.RetryWindow(0.05)
    cpu = {"CPU": 10000}
    assert window.may_try(10.0, cpu)
    window.mark_full(10.0, cpu)
    assert not window.may_try(10.0, cpu)
    assert not window.may_try(10.049, cpu)
    assert window.may_try(10.05, cpu)  # other processes may have released meanwhile
    window.mark_full(11.0, cpu)
    window.note_release()
    assert window.may_try(11.0, cpu)
    window.mark_full(11.0, cpu)  # full again after that release
    assert not window.may_try(11.0, cpu)


def test_a_request_that_failed_holds_back_only_requests_that_cover_it():
    """A GPU task waiting for the GPU must not keep CPU tasks from asking the ledger: its
    holder may be blocked in ``get()`` on one of them (Ray 2.60 schedules each shape on its
    own; two GPU parents getting nested CPU tasks finish there)."""
    window = s.RetryWindow(0.05)
    gpu, cpu = {"CPU": 10000, "GPU": 10000}, {"CPU": 10000}
    window.mark_full(1.0, gpu)
    assert window.may_try(1.0, cpu)
    assert window.may_try(1.0, {"GPU": 5000})  # a smaller share may fit
    assert not window.may_try(1.0, gpu)
    assert not window.may_try(1.0, {"CPU": 20000, "GPU": 10000, "R": 1})  # asks for more
    window.mark_full(1.01, cpu)
    assert not window.may_try(1.02, {"CPU": 10000, "memory": 5})
    assert not window.may_try(1.055, cpu)  # each failure has its own delay
    assert not window.may_try(1.055, gpu)  # more than a request that failed
    assert window.may_try(1.065, gpu) and window.may_try(1.065, cpu)
    window.mark_full(1.07, None)  # the cap on workers: nothing may be tried
    assert not window.may_try(1.07, {"CPU": 1})
    window.note_release()
    assert window.may_try(1.07, gpu) and window.may_try(1.07, cpu)


@pytest.mark.parametrize("request_,failed,covered", [
    ({"CPU": 1, "GPU": 1}, {"GPU": 1}, True),
    ({"CPU": 1}, {"CPU": 1, "GPU": 1}, False),
    ({"CPU": 2}, {"CPU": 1}, True),
    ({"CPU": 1}, {"CPU": 2}, False),
    ({"CPU": 1}, {"CPU": 1, "GPU": 0}, True),  # a zero amount asks for nothing
    ({}, None, True),
])
def test_covers(request_, failed, covered):
    assert s.covers(request_, failed) is covered


@pytest.mark.parametrize("left,expected", [(3, (True, 2)), (1, (True, 0)), (0, (False, 0)),
                                           (-1, (True, -1))])
def test_consume_retry(left, expected):
    assert s.consume_retry(left) == expected


@pytest.mark.parametrize("retryable,left,cancelled,done,expected", [
    (True, 2, False, False, (True, 1)),
    (True, -1, False, False, (True, -1)),
    (True, 0, False, False, (False, 0)),
    (False, 2, False, False, (False, 2)),  # not a retry_exceptions match
    (True, 2, True, False, (False, 2)),    # being cancelled
    (True, 2, False, True, (False, 2)),    # already failed (e.g. cancelled meanwhile)
])
def test_retry_failed_result(retryable, left, cancelled, done, expected):
    assert s.retry_failed_result(retryable, left, cancelled, done) == expected


@pytest.mark.parametrize("position,cancelled,left,fatal,expected", [
    (0, False, 2, False, (s.DEATH_RETRY, 1)),
    (0, False, -1, False, (s.DEATH_RETRY, -1)),
    (0, False, 0, False, (s.DEATH_FAIL_CRASHED, 0)),
    (0, True, 2, False, (s.DEATH_FAIL_CANCELLED, 2)),
    (1, False, 0, False, (s.DEATH_REQUEUE, 0)),   # never started: no retry spent
    (1, True, 0, False, (s.DEATH_REQUEUE, 0)),
    (0, False, 5, True, (s.DEATH_FAIL_SYSTEM, 5)),
    (2, False, 5, True, (s.DEATH_FAIL_SYSTEM, 5)),
])
def test_after_worker_death(position, cancelled, left, fatal, expected):
    assert s.after_worker_death(position, cancelled, left, fatal) == expected


@pytest.mark.parametrize("state,force,running_now,expected", [
    (s.T_DONE, True, False, s.CANCEL_IGNORE),
    (s.T_WAITING, False, False, s.CANCEL_FAIL),
    (s.T_QUEUED, True, False, s.CANCEL_FAIL),
    (s.T_INFEASIBLE, False, False, s.CANCEL_FAIL),
    (s.T_RUNNING, False, True, s.CANCEL_SIGNAL),
    (s.T_RUNNING, False, False, s.CANCEL_REMOVE_QUEUED),  # pipelined, not started
    (s.T_RUNNING, True, True, s.CANCEL_KILL),
    (s.T_RUNNING, True, False, s.CANCEL_REMOVE_QUEUED),
])
def test_cancel_action(state, force, running_now, expected):
    assert s.cancel_action(state, force, running_now) == expected


@pytest.mark.parametrize("left,exiting,killed,no_restart,closed,fatal,expected", [
    (1, False, False, True, False, False, (True, 0)),    # crashed, one restart left
    (-1, False, False, True, False, False, (True, -1)),  # infinite restarts
    (0, False, False, True, False, False, (False, 0)),   # none left: dies
    (2, True, False, True, False, False, (False, 2)),    # exit_actor(): no restart
    (2, False, True, True, False, False, (False, 2)),    # ray.kill(no_restart=True)
    (2, False, True, False, False, False, (True, 1)),    # ray.kill(no_restart=False)
    (2, False, False, True, True, False, (False, 2)),    # shutting down
    (2, False, False, True, False, True, (False, 2)),    # fork server or node lost
])
def test_actor_should_restart(left, exiting, killed, no_restart, closed, fatal, expected):
    assert s.actor_should_restart(left, exiting, killed, no_restart, closed, fatal) == expected


def test_actor_call_cancel_error_is_worded_as_ray():
    """Ray 2.60's words (compared): a call that never ran names its actor; a call cancelled
    while it ran says it was cancelled. Neither sets ``task_id`` (Ray's does not)."""
    never_ran = s.actor_call_cancel_error(b"\x0a" * 2, b"\x0b" * 2)
    assert str(never_ran) == "The task 0a0a is canceled from an actor 0b0b before it executes."
    ran = s.actor_call_cancel_error(b"\x0a" * 2)
    assert str(ran) == "Task: 0a0a was cancelled."
    assert never_ran.task_id is None and ran.task_id is None


@pytest.mark.parametrize("error, stands", [
    (None, False), (KeyboardInterrupt(), False), (ValueError("x"), True),
    (SystemExit(1), True),
])
def test_cancelled_call_outcome_stands(error, stands):
    assert s.cancelled_call_outcome_stands(error) is stands


@pytest.mark.parametrize("kinds, stand", [
    ([protocol.OK], False), ([protocol.OK, protocol.OK], False), ([protocol.ERR], True),
    ([protocol.ERR, protocol.ERR], True), ([protocol.OK, protocol.ERR], True),
])
def test_a_cancelled_actor_calls_values_never_stand_its_errors_do(kinds, stand):
    assert s.cancelled_call_results_stand(kinds) is stand


def _queued_in_order(arrivals):
    """The queue built by inserting ``(depth, seq, handed_back)`` arrivals one by one."""
    queue: list = []
    for depth, seq, handed_back in arrivals:
        index = s.queue_index(queue, depth, seq if handed_back else None)
        queue.insert(index, (depth, seq))
    return queue


def test_nested_tasks_go_before_shallower_ones_fifo_within_a_depth():
    queue = _queued_in_order([
        (0, 1, False), (0, 2, False), (1, 3, False), (0, 4, False), (2, 5, False),
        (1, 6, False),
    ])
    assert queue == [(2, 5), (1, 3), (1, 6), (0, 1), (0, 2), (0, 4)]


def test_a_task_just_ready_goes_at_the_end_of_its_depth_not_by_its_number():
    """A task whose argument became ready late keeps the enqueue order within its depth
    (as the one FIFO queue did); only a handed-back task goes back by submission number."""
    assert _queued_in_order([(0, 5, False), (0, 2, False)]) == [(0, 5), (0, 2)]
    assert _queued_in_order([(0, 5, False), (0, 2, True)]) == [(0, 2), (0, 5)]


def test_handed_back_tasks_keep_submission_order_behind_nested_work():
    queue = _queued_in_order([
        (0, 20, False), (1, 21, False), (0, 7, True), (0, 3, True), (1, 9, True),
    ])
    assert queue == [(1, 9), (1, 21), (0, 3), (0, 7), (0, 20)]
    assert s.queue_index([], 3) == 0 and s.queue_index([], 0, 1) == 0
