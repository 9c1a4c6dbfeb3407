"""Pure decisions of task pipelining (``core/pipelining.py``): depth, which lease takes a
task queued behind another, what a blocking worker hands back, where it goes back."""

from __future__ import annotations

import collections
import doctest
from types import SimpleNamespace as N

from miniray._private.core import pipelining as p
from miniray._private.core import protocol, scheduling


def test_doctests():
    result = doctest.testmod(p)
    assert result.failed == 0 and result.attempted > 0


def _lease(held: int, blocked: int = 0):
    return N(worker=N(blocked=blocked, inflight=list(range(held))))


def test_depth_is_one_for_gpu_and_max_calls():
    cpu = scheduling.scheduling_key({"CPU": 1.0}, 0)
    assert p.depth_for(cpu, 4) == 4
    assert p.depth_for(cpu, 1) == 1
    assert p.depth_for(cpu, 0) == 1  # never below one
    assert p.depth_for(scheduling.scheduling_key({"CPU": 1.0, "GPU": 0.25}, 0), 4) == 1
    assert p.depth_for(scheduling.scheduling_key({"CPU": 1.0}, 5), 4) == 1
    assert p.depth_for(scheduling.scheduling_key({"CPU": 1.0, "GPU": 0}, 0), 4) == 4
    # a runtime_env key pipelines like any other: its workers all run in that environment
    assert p.depth_for(scheduling.scheduling_key({"CPU": 1.0}, 0, "env-a"), 4) == 4


def test_lease_to_fill_picks_least_loaded_below_depth_and_skips_blocked():
    full, two, one, blocked = _lease(4), _lease(2), _lease(1), _lease(0, blocked=1)
    assert p.lease_to_fill([full, two, one], 4) is one
    assert p.lease_to_fill([full, two], 4) is two
    assert p.lease_to_fill([full], 4) is None
    assert p.lease_to_fill([blocked, full], 4) is None  # a blocked worker would hand it back
    assert p.lease_to_fill(None, 4) is None
    assert p.lease_to_fill([one], 1) is None  # depth 1: nothing queued behind


def test_an_idle_lease_is_preferred_before_pipelining():
    busy, idle = _lease(1), _lease(0)
    assert scheduling.lease_with_room([busy, idle]) is idle
    assert scheduling.lease_with_room([busy]) is None


def test_split_hand_back_keeps_non_tasks_in_order():
    inbox = collections.deque([
        (protocol.FUNC, b"f", b"..."), (protocol.TASK, b"t1"), (protocol.UNMAP, "/x"),
        (protocol.TASK, b"t2"),
    ])
    kept, ids = p.split_hand_back(inbox, protocol.TASK)
    assert ids == [b"t1", b"t2"]
    assert kept == [(protocol.FUNC, b"f", b"..."), (protocol.UNMAP, "/x")]
    assert p.split_hand_back([], protocol.TASK) == ([], [])


def _inflight(*names):
    return collections.deque(N(spec=N(task_id=name)) for name in names)


def test_a_result_takes_its_task_by_id_in_or_out_of_order():
    """The first task's result is the usual case; a result out of order still takes its own
    task (the ones before it stay in flight) instead of leaving it in flight forever, which
    hung a round of pipelined tasks; an unknown id takes nothing."""
    inflight = _inflight(b"a", b"b", b"c")
    task, in_order = p.take_finished(inflight, b"a")
    assert task.spec.task_id == b"a" and in_order
    task, in_order = p.take_finished(inflight, b"c")
    assert task.spec.task_id == b"c" and not in_order
    assert [t.spec.task_id for t in inflight] == [b"b"]
    assert p.take_finished(inflight, b"z") == (None, False)
    assert [t.spec.task_id for t in inflight] == [b"b"]
    assert p.take_finished(collections.deque(), b"a") == (None, False)
