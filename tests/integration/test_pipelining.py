"""Pipelined tasks: a leased worker holds several tasks of one key, and gives back those it
has not started when it blocks in ``get()``/``wait()`` (``core/pipelining.py``).

Every scenario runs on ``num_cpus=1``, so the second task of a key can only wait in the
owner's queue or be pipelined behind the first on the one leased worker; the test first
checks that it was pipelined there (the owner's record of the task names that worker), then
opens the gates (files) that the tasks wait for. No sleep is used to order events.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray._private.core.scheduling import T_QUEUED, T_RUNNING

from .helpers import open_gate, wait_for_gate, wait_until

GATE_S = 30.0  # a task waits at most this long for its gate


_wait_for = wait_for_gate  # the tasks' file gates (GATE_S: its default timeout)
_open = open_gate


def _record(ref):
    """``(state, worker)`` of the owner's record of ``ref``'s task (None once done)."""
    owner = runtime.current().owner
    with owner.locked():
        task = owner.tasks.by_id.get(ref.binary()[:24])
        return None if task is None else (task.state, task.worker)


def _pipelined_behind(ref, first) -> bool:
    """``ref``'s task was sent to the worker that runs ``first``'s, behind it."""
    mine, theirs = _record(ref), _record(first)
    return (mine is not None and theirs is not None and mine[0] == T_RUNNING
            and mine[1] is theirs[1] and mine[1].inflight[0].spec.task_id
            == first.binary()[:24])


def _stats() -> dict:
    return runtime.current().owner.statistics()


@pytest.fixture
def one_cpu(ray_start):
    ray_start(num_cpus=1)
    return miniray


def _gated(started: str, gate: str, value="done"):
    """Says it started, then waits for ``gate``."""
    _open(started)
    if not _wait_for(gate):
        raise TimeoutError(f"{gate} was not opened")
    return value


def _mark(path: str, value=None):
    """Appends ``value`` to ``path`` (the order tasks ran in) and returns it."""
    with open(path, "a") as f:
        f.write(f"{value}\n")
    return value


gated = miniray.remote(max_retries=0)(_gated)
mark = miniray.remote(max_retries=0)(_mark)


@miniray.remote(max_retries=0)
def _after(_dep, path: str, value):
    """``mark`` once its first argument (an object) is ready."""
    with open(path, "a") as f:
        f.write(f"{value}\n")
    return value


@miniray.remote(num_cpus=0)
def opener(gate: str) -> bool:
    return _wait_for(gate)


def test_running_task_waits_on_the_task_pipelined_behind_it(one_cpu, tmp_path):
    """The classic deadlock of pipelining: A runs, B is pipelined behind A on A's worker, and
    A calls get(B). A's worker gives B back when it blocks, and B runs on another worker
    (A's CPU was given back while it waits)."""
    ray = one_cpu

    @ray.remote(max_retries=0)
    def waiter(started, gate, refs):
        _open(started)
        if not _wait_for(gate):
            raise TimeoutError(gate)
        return ray.get(refs[0]) + 1

    dep_gate, go = str(tmp_path / "dep"), str(tmp_path / "go")
    dep = opener.remote(dep_gate)  # B waits for it: it is queued only after A runs
    b = _after.remote(dep, str(tmp_path / "ran"), 41)
    a = waiter.remote(str(tmp_path / "a-started"), go, [b])
    assert _wait_for(str(tmp_path / "a-started"))
    _open(dep_gate)
    assert wait_until(lambda: _pipelined_behind(b, a), 20), "B was not pipelined behind A"
    before = _stats()["handed_back"]
    _open(go)
    assert ray.get(a, timeout=30) == 42
    assert _stats()["handed_back"] >= before + 1


def test_handed_back_tasks_run_in_submission_order(one_cpu, tmp_path):
    """A runs and B, C, D are pipelined behind it (depth 8); A then blocks in get() on an
    object no task here produces: the three go back, in order, and run on another worker
    in submission order while A waits."""
    ray = one_cpu
    log, go, release = str(tmp_path / "log"), str(tmp_path / "go"), str(tmp_path / "rel")

    @ray.remote(max_retries=0)
    def blocker(started, gate, refs):
        _open(started)
        if not _wait_for(gate):
            raise TimeoutError(gate)
        return ray.get(refs[0])

    pending = opener.remote(release)  # what A waits for: ready when the test says
    a = blocker.remote(str(tmp_path / "a-started"), go, [pending])
    assert _wait_for(str(tmp_path / "a-started"))
    rest = [mark.remote(log, name) for name in "BCD"]
    assert wait_until(lambda: all(_pipelined_behind(r, a) for r in rest), 20), \
        "B, C, D were not pipelined behind A"
    _open(go)
    assert ray.get(rest, timeout=30) == ["B", "C", "D"]
    with open(log) as f:
        assert f.read().split() == ["B", "C", "D"]
    assert _stats()["handed_back"] >= 3
    _open(release)
    assert ray.get(a, timeout=30) is True


@pytest.mark.parametrize("force", [False, True])
def test_cancel_of_a_pipelined_task_never_runs_it(one_cpu, tmp_path, force):
    """A task pipelined behind a running one and cancelled fails at once with
    TaskCancelledError and never runs; ``force=True`` does not kill the worker, which is
    busy with another task (Ray 2.60 fails a task that has not started without touching any
    worker; compared side by side)."""
    ray = one_cpu
    started, gate, ran = str(tmp_path / "a"), str(tmp_path / "go"), str(tmp_path / "ran")
    a = gated.remote(started, gate, "A")
    assert _wait_for(started)
    b = mark.remote(ran, "B")
    assert wait_until(lambda: _pipelined_behind(b, a), 20), "B was not pipelined behind A"
    pid = _record(a)[1].pid
    ray.cancel(b, force=force)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(b, timeout=10)  # at once: A still holds the worker
    assert os.path.exists(f"/proc/{pid}")
    _open(gate)
    assert ray.get(a, timeout=30) == "A"
    assert ray.get(mark.remote(ran, "C"), timeout=30) == "C"  # the worker went on
    with open(ran) as f:
        assert f.read().split() == ["C"]  # B never ran


def test_worker_death_requeues_the_tasks_pipelined_behind(one_cpu, tmp_path):
    """The worker running A dies (SIGKILL by its pid) with B and C pipelined behind: only A
    fails (max_retries=0: WorkerCrashedError); B and C did not start, so they run again
    elsewhere without using a retry (they have none)."""
    ray = one_cpu
    started, gate, log = str(tmp_path / "a"), str(tmp_path / "never"), str(tmp_path / "log")
    a = gated.remote(started, gate, "A")
    assert _wait_for(started)
    rest = [mark.remote(log, name) for name in "BC"]
    assert wait_until(lambda: all(_pipelined_behind(r, a) for r in rest), 20), \
        "B, C were not pipelined behind A"
    pid = _record(a)[1].pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(a, timeout=30)
    assert ray.get(rest, timeout=30) == ["B", "C"]
    with open(log) as f:
        assert f.read().split() == ["B", "C"]


def test_max_calls_and_gpu_tasks_are_never_pipelined(ray_start, tmp_path):
    """A worker retires after ``max_calls`` calls, so nothing is sent past them; a GPU task
    goes one at a time. Their second task stays in the owner's queue while the first runs."""
    ray_start(num_cpus=1, num_gpus=1)
    for options in ({"max_calls": 2}, {"num_gpus": 1, "num_cpus": 0}):
        tag = "gpu" if "num_gpus" in options else "calls"
        started, gate = str(tmp_path / f"{tag}-a"), str(tmp_path / f"{tag}-go")
        a = miniray.remote(**options)(_gated).remote(started, gate, "A")
        assert _wait_for(started)
        b = miniray.remote(**options)(_mark).remote(str(tmp_path / f"{tag}-log"), "B")
        time.sleep(0.2)  # not a sync: time for a wrong dispatch to happen, if it would
        assert _record(b)[0] == T_QUEUED
        _open(gate)
        assert miniray.get([a, b], timeout=30) == ["A", "B"]

    @miniray.remote(max_calls=2)
    def pid():
        return os.getpid()

    pids = miniray.get([pid.remote() for _ in range(8)], timeout=60)
    assert max(pids.count(p) for p in set(pids)) <= 2


def test_results_keep_submission_order_on_one_worker(one_cpu, tmp_path):
    """With one CPU, pipelined tasks run in the order they were submitted, and each ref
    gets its own task's value."""
    log = str(tmp_path / "log")
    refs = [mark.remote(log, i) for i in range(300)]
    assert miniray.get(refs, timeout=60) == list(range(300))
    with open(log) as f:
        assert [int(x) for x in f.read().split()] == list(range(300))


def test_nested_submissions_are_pipelined(one_cpu, tmp_path):
    """Tasks submitted from inside a task go through the same owner path: a parent that
    submits many children and waits for them gets them all (its own worker gives back what
    was pipelined to it when it blocks)."""
    ray = one_cpu

    @ray.remote
    def child(i):
        return i * 2

    @ray.remote
    def parent(n):
        return sum(ray.get([child.remote(i) for i in range(n)]))

    assert ray.get(parent.remote(500), timeout=60) == sum(i * 2 for i in range(500))


def test_an_idle_worker_gets_the_task_pipelined_behind_a_long_one(ray, tmp_path):
    """A and B run on the two workers (num_cpus=2) and C is pipelined behind one of them.
    When the other finishes and nothing else is queued, the busy worker is asked (RECALL) to
    give C back, and C runs on the idle one while the long task still runs."""
    gates = {name: (str(tmp_path / f"{name}-started"), str(tmp_path / f"{name}-go"))
             for name in "AB"}
    refs = {name: gated.remote(*gates[name], name) for name in "AB"}
    for started, _gate in gates.values():
        assert _wait_for(started)
    c = mark.remote(str(tmp_path / "log"), "C")
    assert wait_until(lambda: _pipelined_behind(c, refs["A"]) or _pipelined_behind(c, refs["B"]),
                      20), "C was not pipelined"
    long, short = ("A", "B") if _pipelined_behind(c, refs["A"]) else ("B", "A")
    _open(gates[short][1])
    assert ray.get(refs[short], timeout=30) == short
    assert ray.get(c, timeout=20) == "C"  # while the long one still waits for its gate
    assert _record(refs[long])[0] == T_RUNNING
    _open(gates[long][1])
    assert ray.get(refs[long], timeout=30) == long
