"""ray.cancel on pending, running and finished tasks.

Ray 2.60 behaviour: ray-api-surface.md §3.4.
"""

from __future__ import annotations

import os
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private.host import procinfo

GET_TIMEOUT = 30


def _wait_for_file(path, timeout=GET_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if text:
                return text
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    pytest.fail(f"{path} was not written within {timeout} s")


@pytest.fixture
def tasks(ray):
    """Remote functions that announce they started by writing their pid to a file."""

    class Tasks:
        @staticmethod
        @ray.remote(max_retries=0)
        def busy(path, seconds=20):
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            end = time.time() + seconds
            while time.time() < end:
                pass
            return "finished"

        @staticmethod
        @ray.remote(max_retries=0)
        def sleeper(path, seconds=30):
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(seconds)
            return "finished"

        @staticmethod
        @ray.remote
        def quick(x):
            return x

    return Tasks


def test_cancel_pending_task_raises_task_cancelled_error_immediately(ray, tasks, tmp_path):
    # Two busy tasks fill both CPUs; the third waits in the queue.
    running = [tasks.busy.remote(str(tmp_path / f"b{i}")) for i in range(2)]
    for i in range(2):
        _wait_for_file(tmp_path / f"b{i}")
    pending = tasks.quick.remote("never")
    start = time.monotonic()
    ray.cancel(pending)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(pending, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 1.0
    assert not isinstance(info.value, exceptions.RayTaskError)
    assert str(info.value) == f"Task: {pending.task_id()!r} was cancelled. "
    for ref in running:
        ray.cancel(ref, force=True)


def test_cancel_task_waiting_on_dependency(ray, tasks, tmp_path):
    upstream = tasks.sleeper.remote(str(tmp_path / "up"), 5)
    downstream = tasks.quick.remote(upstream)
    ray.cancel(downstream)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(downstream, timeout=GET_TIMEOUT)
    ray.cancel(upstream, force=True)


def test_cancel_running_busy_task_interrupts_it(ray, tasks, tmp_path):
    marker = tmp_path / "started"
    ref = tasks.busy.remote(str(marker))
    worker_pid = int(_wait_for_file(marker))
    start = time.monotonic()
    ray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 5.0
    assert isinstance(info.value, exceptions.RayTaskError)
    assert type(info.value).__name__ == "RayTaskError(TaskCancelledError)"
    # Ray 2.60's last line names the task by its TaskID (compared with Ray).
    assert str(info.value).splitlines()[-1] == (
        f"miniray.exceptions.TaskCancelledError: Task: {ref.task_id()!r} was cancelled.")
    assert info.value.cause.task_id == ref.task_id()
    # force=False does not kill the worker: it runs the next task.
    assert procinfo.is_alive(worker_pid)

    @ray.remote
    def pid():
        return os.getpid()

    assert ray.get(pid.remote(), timeout=GET_TIMEOUT) == worker_pid


def test_cancel_running_sleep_with_force_kills_the_worker(ray, tasks, tmp_path):
    marker = tmp_path / "started"
    ref = tasks.sleeper.remote(str(marker))
    worker_pid = int(_wait_for_file(marker))
    start = time.monotonic()
    ray.cancel(ref, force=True)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 5.0
    assert not isinstance(info.value, exceptions.RayTaskError)
    deadline = time.monotonic() + 5
    while procinfo.is_alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not procinfo.is_alive(worker_pid)

    @ray.remote
    def pid():
        return os.getpid()

    # The worker was replaced: new tasks run in another process.
    new_pid = ray.get(pid.remote(), timeout=GET_TIMEOUT)
    assert new_pid != worker_pid
    assert new_pid in miniray._private.runtime.current().pids()


def test_cancel_finished_task_is_a_noop(ray, tasks):
    ref = tasks.quick.remote("value")
    assert ray.get(ref, timeout=GET_TIMEOUT) == "value"
    ray.cancel(ref)
    ray.cancel(ref, force=True)
    assert ray.get(ref, timeout=GET_TIMEOUT) == "value"


def test_cancel_put_object_is_a_noop(ray):
    ref = ray.put(1)
    ray.cancel(ref)
    assert ray.get(ref) == 1


@pytest.mark.parametrize("arg", [1, "ref", None, [None]], ids=repr)
def test_cancel_non_ref_raises_type_error(ray, arg):
    with pytest.raises(TypeError) as info:
        ray.cancel(arg)
    assert str(info.value) == (
        "ray.cancel() only supported for object refs. For actors, try ray.kill(). "
        f"Got: {type(arg)}."
    )


@pytest.mark.parametrize("force", [False, True], ids=["cooperative", "force"])
def test_cancelled_tasks_are_not_retried(ray, tmp_path, force):
    log = tmp_path / "attempts"

    @ray.remote(max_retries=3, retry_exceptions=True)
    def busy(path):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        end = time.time() + 20
        while time.time() < end:
            pass

    ref = busy.remote(str(log))
    _wait_for_file(log)
    ray.cancel(ref, force=force)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    time.sleep(0.3)  # a retry would have started by now
    assert len(log.read_text().splitlines()) == 1


def test_cancel_recursive_cancels_children(ray, tmp_path):
    marker = tmp_path / "child-started"

    @ray.remote(max_retries=0)
    def child(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(30)

    @ray.remote(max_retries=0)
    def parent(path):
        import miniray as inner

        return inner.get(child.remote(path))

    ref = parent.remote(str(marker))
    child_pid = int(_wait_for_file(marker))
    ray.cancel(ref, force=True)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    deadline = time.monotonic() + 5
    while procinfo.is_alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not procinfo.is_alive(child_pid), "the child task's worker was not cancelled"


def test_many_pending_cancels_leave_the_session_usable(ray, tasks, tmp_path):
    blockers = [tasks.busy.remote(str(tmp_path / f"b{i}"), 20) for i in range(2)]
    for i in range(2):
        _wait_for_file(tmp_path / f"b{i}")
    pending = [tasks.quick.remote(i) for i in range(20)]
    for ref in pending[::2]:
        ray.cancel(ref)
    for ref in blockers:
        ray.cancel(ref, force=True)
    results = []
    for ref in pending:
        try:
            results.append(ray.get(ref, timeout=GET_TIMEOUT))
        except exceptions.TaskCancelledError:
            results.append("cancelled")
    assert results == ["cancelled" if i % 2 == 0 else i for i in range(20)]
    assert ray.available_resources()["CPU"] == 2.0


def test_force_cancel_right_after_submit(ray_start):
    # Regression: a force-cancel sent before the fork server reported the worker's pid used
    # to be dropped.
    ray_start(num_cpus=2)

    @miniray.remote(max_retries=0)
    def busy(seconds):
        end = time.time() + seconds
        while time.time() < end:
            pass
        return "finished"

    ref = busy.remote(3)  # the first task: its worker is being forked right now
    miniray.cancel(ref, force=True)
    with pytest.raises(exceptions.TaskCancelledError):
        miniray.get(ref, timeout=GET_TIMEOUT)
