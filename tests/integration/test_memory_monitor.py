"""Ray's out-of-memory prevention: the driver's memory monitor kills a busy worker when the
host is over ``memory_usage_threshold`` of its memory.

Ray 2.60 was run with ``_system_config={"memory_usage_threshold": 0.2}`` and tasks and an actor
that filled 4-8 GB (``ray_oom_prevention.py`` and variants): a ``max_retries=0`` task raised
OutOfMemoryError; a task with the default retries was killed and run again without end (seven
attempts in 120 s: the waits grow), each time logging "There are infinite oom retries
remaining"; an actor with ``max_restarts=0`` died, its running call and every later call
raising OutOfMemoryError. The same scripts under miniray give the same outcomes (one run kept
in the module's notes). Here the monitor's reading of the host is replaced
(``MemoryWatch._read``) so that it sees the host over its threshold without anyone filling
it; everything after the reading (the choice, the kill, the retry, the errors) is real.
"""

from __future__ import annotations

import os
import time

import pytest

from .helpers import wait_until

LOW = (99, 100)  # the host as the monitor reads it: 99% used
FINE = (10, 100)


def _watch():
    from miniray._private import runtime

    return runtime.current().memory_watch


def _marks(path) -> int:
    return len(os.listdir(path))


@pytest.fixture
def marks(tmp_path):
    """A folder for the attempts' marks (the session root is in ``tmp_path`` too)."""
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


def test_a_task_that_may_not_retry_fails_with_out_of_memory_error(ray_start, tmp_path):
    ray = __import__("miniray")
    ray_start(num_cpus=2, _system_config={"memory_monitor_refresh_ms": 50})

    @ray.remote(max_retries=0)
    def hog(path):
        open(path, "w").close()
        time.sleep(60)

    started = tmp_path / "started"
    ref = hog.remote(str(started))
    assert wait_until(started.exists, 30)
    watch = _watch()
    watch._read = lambda: LOW
    with pytest.raises(ray.exceptions.OutOfMemoryError) as error:
        ray.get(ref, timeout=30)
    watch._read = lambda: FINE
    text = str(error.value)
    assert text.startswith("1 worker(s) were killed due to the node running low on memory. "
                           "Memory on the node (IP: 127.0.0.1, ID: "), text
    assert "exceeded threshold of 95B (95.0% of 100B limit)" in text
    assert "Killed: task hog, pid=" in text and "Set max_retries (tasks)" in text
    assert watch.kills == 1
    assert ray.get(ray.remote(lambda: 1).remote(), timeout=30) == 1  # the session goes on


def test_a_retriable_task_runs_again_after_a_wait_without_using_max_retries(
        ray_start, marks, caplog):
    ray = __import__("miniray")
    ray_start(num_cpus=1, _system_config={"memory_monitor_refresh_ms": 50})

    @ray.remote(max_retries=1)
    def hog(folder):
        open(os.path.join(folder, str(time.monotonic_ns())), "w").close()
        if len(os.listdir(folder)) < 3:
            time.sleep(60)
        return "done"

    ref = hog.remote(str(marks))
    watch = _watch()
    for kill in (1, 2):  # two kills: more than max_retries=1 allows for other deaths
        assert wait_until(lambda k=kill: _marks(marks) == k, 30)
        watch._read = lambda: LOW
        assert wait_until(lambda k=kill: watch.kills == k, 30)
        watch._read = lambda: FINE
    killed_at = time.monotonic()
    assert ray.get(ref, timeout=60) == "done" and _marks(marks) == 3
    assert time.monotonic() - killed_at >= 1.5  # the second wait is 2 s (the first 1 s)
    lines = [r.getMessage() for r in caplog.records if "failed due to oom" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith(
        "Task hog failed due to oom. There are infinite oom retries remaining, so the task "
        "will be retried. Error: 1 worker(s) were killed"), lines


def test_a_retriable_task_is_chosen_before_one_that_may_not_retry(ray_start, tmp_path):
    ray = __import__("miniray")
    ray_start(num_cpus=2, _system_config={"memory_monitor_refresh_ms": 50})

    @ray.remote
    def work(path, retriable_marks=None):
        if retriable_marks is not None:
            open(os.path.join(retriable_marks, str(time.monotonic_ns())), "w").close()
        open(path, "w").close()
        time.sleep(1.0)
        return os.path.basename(path)

    folder = tmp_path / "marks"
    folder.mkdir()
    firm = work.options(max_retries=0).remote(str(tmp_path / "firm"))
    assert wait_until((tmp_path / "firm").exists, 30)
    soft = work.options(max_retries=2).remote(str(tmp_path / "soft"), str(folder))
    assert wait_until((tmp_path / "soft").exists, 30)
    watch = _watch()
    watch._read = lambda: LOW
    assert wait_until(lambda: watch.kills == 1, 30)
    watch._read = lambda: FINE
    # The non-retriable task started first and would be the latest's peer otherwise: it is
    # left alone; the retriable one was killed and ran again.
    assert ray.get([firm, soft], timeout=60) == ["firm", "soft"]
    assert _marks(folder) == 2


def test_a_task_cancelled_while_it_waits_to_run_again_never_runs(ray_start, marks):
    ray = __import__("miniray")
    ray_start(num_cpus=1, _system_config={"memory_monitor_refresh_ms": 50})

    @ray.remote
    def hog(folder):
        open(os.path.join(folder, str(time.monotonic_ns())), "w").close()
        time.sleep(60)

    ref = hog.remote(str(marks))
    assert wait_until(lambda: _marks(marks) == 1, 30)
    watch = _watch()
    watch._read = lambda: LOW
    assert wait_until(lambda: watch.kills == 1, 30)
    watch._read = lambda: FINE
    ray.cancel(ref)  # within its 1 s wait
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=30)
    time.sleep(1.5)
    assert _marks(marks) == 1


def test_an_actor_killed_for_memory_dies_with_out_of_memory_error(ray_start, tmp_path):
    ray = __import__("miniray")
    ray_start(num_cpus=2, _system_config={"memory_monitor_refresh_ms": 50})

    @ray.remote
    class Hog:
        def eat(self):
            time.sleep(60)

        def ping(self):
            return os.getpid()

    @ray.remote(max_restarts=1)
    class Phoenix:
        def ping(self):
            return os.getpid()

    hog = Hog.remote()
    ray.get(hog.ping.remote(), timeout=30)
    call = hog.eat.remote()
    watch = _watch()
    watch._read = lambda: LOW
    with pytest.raises(ray.exceptions.OutOfMemoryError, match="Killed: actor Hog "):
        ray.get(call, timeout=30)
    watch._read = lambda: FINE
    with pytest.raises(ray.exceptions.OutOfMemoryError):
        ray.get(hog.ping.remote(), timeout=30)
    phoenix = Phoenix.remote()
    first = ray.get(phoenix.ping.remote(), timeout=30)
    watch._read = lambda: LOW
    assert wait_until(lambda: watch.kills == 2, 30)
    watch._read = lambda: FINE
    assert wait_until(lambda: _pid_or_none(ray, phoenix) not in (None, first), 30)


def _pid_or_none(ray, actor):
    try:
        return ray.get(actor.ping.remote(), timeout=10)
    except ray.exceptions.RayError:
        return None


def test_settings_are_checked_at_init_and_zero_turns_the_monitor_off(ray_start, tmp_path):
    ray = __import__("miniray")
    with pytest.raises(ValueError, match=r"memory_usage_threshold'\] must be a fraction"):
        ray.init(num_cpus=1, _system_config={"memory_usage_threshold": 2})
    assert not ray.is_initialized()
    ray_start(num_cpus=1, _system_config={"memory_monitor_refresh_ms": 0})

    @ray.remote(max_retries=0)
    def nap(path):
        open(path, "w").close()
        time.sleep(0.5)
        return 1

    watch = _watch()
    watch._read = lambda: LOW
    assert ray.get(nap.remote(str(tmp_path / "n")), timeout=30) == 1
    assert watch.kills == 0
