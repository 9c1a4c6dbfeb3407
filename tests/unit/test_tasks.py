"""The owner's task queue (``owner/tasks.py``) with a real object table over a fake store:
argument waits, infeasibility, requeue at the front, completion. No processes."""

from __future__ import annotations

import collections
import threading
import types

from miniray._private.core import protocol, serialization
from miniray._private.core.resources import UNIT, NodeState
from miniray._private.core.scheduling import (
    T_DONE,
    T_INFEASIBLE,
    T_QUEUED,
    T_RUNNING,
    T_WAITING,
)
from miniray._private.owner.object_table import ObjectTable
from miniray._private.owner.tasks import TaskQueue
from miniray.exceptions import WorkerCrashedError


class _Store:
    def __init__(self):
        self.data = {}

    def put_serialized(self, object_id, data):
        self.data[object_id] = data

    def inline_bytes(self, object_id):
        return self.data[object_id]

    def free(self, object_id):
        self.data.pop(object_id, None)


def _spec(n: int, deps=(), request=None, affinity=None):
    task_id = bytes([n]) * 24
    return types.SimpleNamespace(
        task_id=task_id, return_ids=[task_id + b"\0\0\0\1"], contained=(),
        deps=[(i, d) for i, d in enumerate(deps)], request=request or {"CPU": 1.0},
        name=f"task{n}", max_retries=0, affinity=affinity, placement=None, num_returns=1)


def _queue(dispatched: list, leased=(), offload=None, locate=None):
    objects = ObjectTable(_Store(), threading.Lock(), lambda: None)
    node = NodeState(totals={"CPU": 2 * UNIT}, instance_ids={})
    tasks = TaskQueue(objects=objects, store=objects.store, node_state=node,
                      unpin_deps=lambda deps: None, has_lease=lambda key: key in leased,
                      dispatch=dispatched.append,
                      kill_worker=lambda worker: dispatched.append(("kill", worker)),
                      signal_cancel=lambda worker, task_id: dispatched.append(("signal", worker)),
                      skip_queued=lambda worker, task_id: dispatched.append(("skip", task_id)),
                      offload=offload, locate=locate)
    return tasks, objects


def test_a_task_is_queued_once_its_last_argument_is_ready():
    dispatched: list = []
    tasks, objects = _queue(dispatched)
    a, b = b"a" * 28, b"b" * 28
    objects.ensure(a)
    objects.ensure(b)
    tasks.submit(_spec(1, deps=[a, b]), "key")
    task = tasks.by_id[b"\1" * 24]
    assert task.state == T_WAITING and task.waiting == 2 and dispatched == []
    objects.set_ready(a, protocol.OK, b"x")
    assert task.state == T_WAITING and dispatched == []
    objects.set_ready(b, protocol.OK, b"y")
    assert task.state == T_QUEUED and dispatched == ["key"]
    assert list(tasks.queues["key"]) == [task]


def test_an_argument_that_failed_completes_the_task_with_its_error():
    dispatched: list = []
    tasks, objects = _queue(dispatched)
    a = b"a" * 28
    objects.ensure(a)
    spec = _spec(2, deps=[a])
    tasks.submit(spec, "key")
    objects.set_ready(a, protocol.ERR, b"boom")
    assert spec.task_id not in tasks.by_id and dispatched == []
    assert objects.get(spec.return_ids[0]).kind == protocol.ERR
    assert objects.store.data[spec.return_ids[0]] == b"boom"


def test_an_infeasible_task_waits_apart_and_is_reported_once_per_key(capsys):
    dispatched: list = []
    tasks, _objects = _queue(dispatched)
    tasks.submit(_spec(3, request={"CPU": 64.0}), "big")
    tasks.submit(_spec(4, request={"CPU": 64.0}), "big")
    assert [t.state for t in tasks.infeasible["big"]] == [T_INFEASIBLE, T_INFEASIBLE]
    assert dispatched == [] and "big" not in tasks.queues
    assert capsys.readouterr().err.count("task3") == 1
    assert tasks.statistics() == {"tasks_pending": 2, "queued": 0, "infeasible": 2,
                                  "handed_back": 0}
    tasks.remove_waiting(tasks.infeasible["big"][0])
    assert len(tasks.infeasible["big"]) == 1


def test_a_task_with_a_node_affinity_is_submitted_as_any_and_offered_once_ready():
    """The one path of a task that may run on another node: registered, counted among its
    parent's children and waiting on its arguments as any task; offered (with whether this
    node could hold it) once they are ready; a retry placed here is not offered again."""
    dispatched: list = []
    offered: list = []
    taken: set = {b"\7" * 24}

    def offload(task, local_feasible):
        offered.append((task.spec.name, local_feasible))
        if task.spec.task_id in taken:
            task.state = T_RUNNING  # the remote module's from now on
            return True
        return None

    tasks, objects = _queue(dispatched, offload=offload)
    parent = types.SimpleNamespace(children=None, depth=0)
    a = b"a" * 28
    objects.ensure(a)
    tasks.submit(_spec(7, deps=[a], affinity="node-b"), "key", parent)
    remote = tasks.by_id[b"\7" * 24]
    assert parent.children == [remote] and remote.depth == 1 and offered == []
    objects.set_ready(a, protocol.OK, b"x")
    assert offered == [("task7", True)] and remote.state == T_RUNNING and not tasks.queues
    tasks.submit(_spec(8, affinity="this-node"), "key")  # it stays here: queued
    assert offered[-1] == ("task8", True) and dispatched == ["key"]
    tasks.submit(_spec(9, request={"CPU": 64.0}, affinity="node-b"), "big")
    assert offered[-1] == ("task9", False) and tasks.infeasible["big"]
    tasks.submit(_spec(10), "key")  # no affinity, feasible: never offered
    assert len(offered) == 3
    remote.worker = None
    tasks.resubmit(remote)  # its node died; placed here by the caller
    assert len(offered) == 3 and remote in tasks.queues["key"]


def test_a_key_with_a_lease_is_feasible_and_a_retry_goes_to_the_front():
    dispatched: list = []
    tasks, _objects = _queue(dispatched, leased={"big"})
    tasks.submit(_spec(5, request={"CPU": 64.0}), "big")
    tasks.submit(_spec(6, request={"CPU": 64.0}), "big")
    first, second = tasks.queues["big"]
    tasks.queues["big"].popleft()
    first.worker = object()
    tasks.requeue(first)
    assert list(tasks.queues["big"]) == [first, second] and first.worker is None
    tasks.fail(second, ValueError("no"))
    assert second.state == T_DONE and tasks.unfinished() == [first]
    tasks.drop_queues()
    assert tasks.queues == {} and tasks.infeasible == {}


def test_cancel_fails_a_queued_task_and_its_children_recursively_and_acts_on_running_ones():
    dispatched: list = []
    tasks, _objects = _queue(dispatched, leased={"key"})
    tasks.submit(_spec(7), "key")
    parent = tasks.by_id[b"\7" * 24]
    tasks.submit(_spec(8), "key", parent)
    tasks.submit(_spec(9), "key", parent)
    running, queued = parent.children
    tasks.queues["key"].remove(running)
    running.state = T_RUNNING
    running.worker = worker = types.SimpleNamespace(inflight=collections.deque([running]))
    tasks.cancel(parent, False, True, KeyboardInterrupt)
    assert queued.state == T_DONE and parent.state == T_DONE
    assert running.state == T_RUNNING and running.cancelled
    assert ("signal", worker) in dispatched
    tasks.cancel(running, True, False, KeyboardInterrupt)
    assert dispatched[-1] == ("kill", worker)


def test_a_failed_result_is_retried_at_the_front_while_retries_last():
    dispatched: list = []
    tasks, objects = _queue(dispatched, leased={"key"})
    spec = _spec(10)
    spec.max_retries = 1
    tasks.submit(spec, "key")
    task = tasks.queues["key"].popleft()
    task.state = T_RUNNING
    tasks.finished(task, [(protocol.ERR, b"raised")], retryable=True)
    assert task.state == T_QUEUED and tasks.queues["key"][0] is task
    tasks.queues["key"].popleft()
    tasks.finished(task, [(protocol.ERR, b"raised again")], retryable=True)
    assert task.state == T_DONE and objects.store.data[spec.return_ids[0]] == b"raised again"


def test_a_dead_worker_requeues_what_never_started_and_fails_the_running_task():
    dispatched: list = []
    tasks, objects = _queue(dispatched, leased={"key"})
    for n in (11, 12):
        tasks.submit(_spec(n), "key")
    running, behind = tasks.queues.pop("key")
    for task in (running, behind):
        task.state = T_RUNNING
    assert tasks.worker_died([running, behind], 4242, "exited with code 1", None, None) == (1, 1)
    assert running.state == T_DONE and list(tasks.queues["key"]) == [behind]
    error = serialization.loads(objects.store.data[running.spec.return_ids[0]])
    assert isinstance(error, WorkerCrashedError) and "pid=4242 exited with code 1" in str(error)


def _on_worker(tasks, key, count, first=20):
    """``count`` tasks of ``key`` sent to one worker, in order (the first one running)."""
    for n in range(first, first + count):
        tasks.submit(_spec(n), key)
    sent = list(tasks.queues.pop(key))
    worker = types.SimpleNamespace(inflight=collections.deque(sent))
    for task in sent:
        task.state, task.worker = T_RUNNING, worker
    return worker, sent


def test_tasks_handed_back_go_to_the_front_in_submission_order_without_a_retry():
    dispatched: list = []
    tasks, _objects = _queue(dispatched, leased={"key"})
    worker, (a, b, c, d) = _on_worker(tasks, "key", 4)
    tasks.submit(_spec(40), "key")  # newer work queued meanwhile
    newer = tasks.queues["key"][0]
    assert tasks.hand_back(worker, [d.spec.task_id]) == {"key"}  # one arrived while blocked
    assert tasks.hand_back(worker, [b.spec.task_id, c.spec.task_id]) == {"key"}
    assert list(tasks.queues["key"]) == [b, c, d, newer]
    assert list(worker.inflight) == [a]
    assert all(t.state == T_QUEUED and t.worker is None for t in (b, c, d))
    assert b.retries_left == 0 and tasks.handed_back == 3
    assert tasks.hand_back(worker, [b"unknown" * 3]) == set()


def test_cancel_of_a_pipelined_task_fails_it_now_and_tells_the_worker_to_skip_it():
    """With or without force: it never started, so no worker is killed or interrupted."""
    for force in (False, True):
        dispatched: list = []
        tasks, objects = _queue(dispatched, leased={"key"})
        worker, (a, b) = _on_worker(tasks, "key", 2)
        tasks.cancel(b, force, False, KeyboardInterrupt)
        assert b.state == T_DONE and a.state == T_RUNNING
        assert dispatched[-1] == ("skip", b.spec.task_id)
        assert not any(item[0] in ("kill", "signal") for item in dispatched[:-1]
                       if isinstance(item, tuple))
        assert list(worker.inflight) == [a, b]  # its RESULT (skipped) still comes, in order
        assert isinstance(serialization.loads(objects.store.data[b.spec.return_ids[0]]),
                          KeyboardInterrupt)
        # handed back after it was cancelled: dropped, not queued again
        assert tasks.hand_back(worker, [b.spec.task_id]) == set()
        assert list(worker.inflight) == [a] and "key" not in tasks.queues


def test_a_dead_worker_counts_positions_among_unfinished_tasks():
    """A cancelled task at the head was skipped by the worker, so the next one was the one
    running: it uses a retry (here none: it fails); those behind it are requeued."""
    dispatched: list = []
    tasks, _objects = _queue(dispatched, leased={"key"})
    worker, (skipped, running, behind) = _on_worker(tasks, "key", 3)
    tasks.fail(skipped, KeyboardInterrupt())  # cancelled while pipelined: done, skipped
    assert tasks.worker_died(list(worker.inflight), 7, "was killed", None, None) == (1, 1)
    assert running.state == T_DONE and list(tasks.queues["key"]) == [behind]


# ------------------------------------------- arguments kept on another node (issue 16)
def _kept(objects, object_id, node="n1"):
    """A result kept on ``node``: PENDING with a RemoteCopy; ``pulls`` counts its pulls."""
    from miniray._private.owner.object_table import RemoteCopy

    pulls: list = []
    copy = RemoteCopy(node, 20 << 20, lambda: pulls.append(object_id), lambda: None, "/p")
    objects.set_ready(object_id, protocol.OK, ("remote", copy))
    return pulls


def test_a_task_given_a_kept_result_is_placed_before_it_is_pulled():
    dispatched: list = []
    placed: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: placed.append(task) or True)
    a = b"a" * 28
    objects.ensure(a)
    pulls = _kept(objects, a)
    tasks.submit(_spec(1, deps=[a]), "key")
    task = placed[0]
    assert pulls == [] and dispatched == [] and task.kept == 0  # another node's now


def test_a_task_placed_here_waits_for_its_kept_argument_which_is_pulled():
    dispatched: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: None)
    a, b = b"a" * 28, b"b" * 28
    objects.ensure(a)
    objects.ensure(b)
    pulls = _kept(objects, a)
    tasks.submit(_spec(1, deps=[a, b]), "key")
    task = tasks.by_id[b"\1" * 24]
    assert pulls == [] and task.waiting == 1 and task.kept == 1  # b first
    objects.set_ready(b, protocol.OK, b"y")  # placed now: here, so a is pulled
    assert pulls == [a] and task.state == T_WAITING and task.waiting == 1
    objects.set_ready(a, protocol.OK, b"x")
    assert task.state == T_QUEUED and dispatched == ["key"]


def test_a_running_argument_that_comes_back_kept_places_its_task_first():
    dispatched: list = []
    placed: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: placed.append(task) or True)
    a = b"a" * 28
    objects.ensure(a)
    tasks.submit(_spec(1, deps=[a]), "key")
    task = tasks.by_id[b"\1" * 24]
    assert task.waiting == 1 and placed == []
    pulls = _kept(objects, a)  # its result stays on its node: not pulled for this task
    assert placed == [task] and pulls == [] and dispatched == []
    assert not objects.get(a).waiters


def test_a_task_reading_a_kept_result_where_it_must_run_is_never_offered_to_locate():
    dispatched: list = []
    placed: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: placed.append(task) or True,
                            offload=lambda task, feasible: True)
    a = b"a" * 28
    objects.ensure(a)
    pulls = _kept(objects, a, node="n1")
    tasks.submit(_spec(1, deps=[a], affinity=("n1", False, False)), "key")
    assert placed == [] and pulls == []  # offered to offload (its affinity), read there


def test_without_the_locate_hook_a_kept_argument_is_pulled_first_as_before():
    dispatched: list = []
    tasks, objects = _queue(dispatched)
    a = b"a" * 28
    objects.ensure(a)
    pulls = _kept(objects, a)
    tasks.submit(_spec(1, deps=[a]), "key")
    assert pulls == [a] and tasks.by_id[b"\1" * 24].waiting == 1


def test_a_spread_task_that_locate_keeps_here_is_not_offered_again_once_pulled():
    """One SPREAD turn per task: ``locate`` took it (and kept the task here); the pull's
    end queues the task without offering it to ``offload`` (a second turn)."""
    dispatched: list = []
    located: list = []
    offered: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: located.append(task),
                            offload=lambda task, feasible: offered.append(task))
    a = b"a" * 28
    objects.ensure(a)
    pulls = _kept(objects, a)
    tasks.submit(_spec(1, deps=[a], affinity="SPREAD"), "key")
    task = tasks.by_id[b"\1" * 24]
    assert located == [task] and pulls == [a] and task.waiting == 1
    objects.set_ready(a, protocol.OK, b"x")
    assert offered == [] and task.state == T_QUEUED and dispatched == ["key"]
    assert task.kept == 0


def test_a_spread_task_without_kept_arguments_is_offered_once():
    dispatched: list = []
    offered: list = []
    tasks, objects = _queue(dispatched, locate=lambda task: None,
                            offload=lambda task, feasible: offered.append(task))
    tasks.submit(_spec(1, affinity="SPREAD"), "key")
    assert len(offered) == 1 and dispatched == ["key"]


def test_a_placement_group_task_given_a_kept_result_asks_locate_before_any_pull():
    """Its bundle decides: on another node (``locate`` True) it reads or fetches the
    argument there, never pulled here; a bundle here (None): pulled, then queued here
    without being offered again."""
    for where in (True, None):
        dispatched: list = []
        offered: list = []
        tasks, objects = _queue(dispatched, locate=lambda task, where=where: where,
                                offload=lambda task, feasible, offered=offered:
                                offered.append(task))
        a = b"a" * 28
        objects.ensure(a)
        pulls = _kept(objects, a)
        spec = _spec(1, deps=[a])
        spec.placement = ("pg", 0)
        tasks.submit(spec, "key")
        if where:
            assert pulls == [] and dispatched == [] and offered == []
            continue
        assert pulls == [a]
        objects.set_ready(a, protocol.OK, b"x")
        assert offered == [] and dispatched == ["key"]
