"""ray.cancel on pending, running and finished tasks, on tasks and actor calls blocked in
get/wait, and on actor calls of sync, threaded and async actors (queued, running, recursive,
force); ``is_canceled()``.

Ray 2.60 behaviour: ray-api-surface.md §3.4; each case below was also run side by side with
Ray 2.60, as its docstring says.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray._private.host import procinfo
from miniray._private.object_store import shm_segments
from tests.integration.helpers import CANCEL_REACHES_A_PYTHON_LOOP, wait_until

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
    ray.cancel(pending)
    # Failed by cancel() itself, before it returned (not timed: two spinning tasks and a
    # loaded machine made a 1 s bound on the get fail).
    assert ray.wait([pending], timeout=0)[0] == [pending]
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(pending, timeout=GET_TIMEOUT)
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
    assert time.monotonic() - start < 15.0  # well under the 20 s task: it was interrupted
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


@pytest.mark.parametrize("blocked_in", ["sleep", "pipe read", "event wait", "lock"])
def test_cancel_wakes_a_task_blocked_in_a_call(ray, tmp_path, blocked_in):
    """A non-forced cancel ends a task blocked in a C call at once, with KeyboardInterrupt
    raised inside it (its cleanup runs) and TaskCancelledError from get(); the worker lives
    on. Ray 2.60 raises it only when the call returns: a task cancelled 1 s into
    ``time.sleep(1e7)`` was still running 20 s later there, and so it was in miniray
    (README, Differences)."""
    marker = tmp_path / "started"
    cleanup = tmp_path / "cleanup"

    @ray.remote(max_retries=0)
    def blocked(path, cleanup_path, how):
        import threading

        with open(path, "w") as f:
            f.write(str(os.getpid()))
        try:
            if how == "sleep":
                time.sleep(1e7)
            elif how == "pipe read":
                os.read(os.pipe()[0], 1)
            elif how == "event wait":
                threading.Event().wait()
            else:
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()
        except Exception:  # a cancel is no Exception: not swallowed here
            return "swallowed"
        except KeyboardInterrupt:
            with open(cleanup_path, "w") as f:
                f.write("cleaned")
            raise
        return "returned"

    ref = blocked.remote(str(marker), str(cleanup), blocked_in)
    worker_pid = int(_wait_for_file(marker))
    time.sleep(0.2)  # into the call
    start = time.monotonic()
    ray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 10.0
    assert cleanup.read_text() == "cleaned"
    assert procinfo.is_alive(worker_pid)

    @ray.remote
    def pid():
        time.sleep(0.05)  # a signal left pending would land here
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
    assert time.monotonic() - start < 15.0  # well under the 30 s sleep: it was killed
    assert not isinstance(info.value, exceptions.RayTaskError)
    deadline = time.monotonic() + 30
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
    deadline = time.monotonic() + 30
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
    # The killed blockers' leases come back when the fork server reports their exits, which
    # a loaded machine may deliver after the last result.
    assert wait_until(lambda: ray.available_resources().get("CPU") == 2.0, 10)


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


# ------------------------------------------------- non-forced cancel of a blocked task
# A call blocked in miniray's get()/wait() waits on the owner's reply, where an injected
# exception cannot land: the owner answers the waits of a cancelled call instead.
@pytest.mark.parametrize("how", ["get", "wait", "get-timeout"])
def test_cancel_reaches_a_task_blocked_in_get_or_wait(ray, tmp_path, how):
    """The wait ends at once with KeyboardInterrupt inside the task, and ``get`` of the task
    raises ``RayTaskError(TaskCancelledError)``; the child (recursive=False) runs on.
    Compared with Ray 2.60: the same exception inside and outside, for get, wait and get with
    a timeout."""
    record = tmp_path / "caught"

    @ray.remote(max_retries=0)
    def child(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)

    @ray.remote(max_retries=0)
    def parent(path, record):
        ref = child.remote(path)
        try:
            if how == "get":
                ray.get(ref)
            elif how == "wait":
                ray.wait([ref])
            else:
                ray.get(ref, timeout=60)
        except BaseException as error:
            with open(record, "w") as f:
                f.write(type(error).__name__)
            raise

    ref = parent.remote(str(tmp_path / "child"), str(record))
    child_pid = int(_wait_for_file(tmp_path / "child"))
    start = time.monotonic()
    ray.cancel(ref, recursive=False)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 15.0  # well under the child's 60 s: the wait was interrupted
    assert type(info.value).__name__ == "RayTaskError(TaskCancelledError)"
    assert _wait_for_file(record) == "KeyboardInterrupt"
    assert procinfo.is_alive(child_pid)  # not recursive: the child was not cancelled
    os.kill(child_pid, 9)


def test_a_cancelled_task_that_catches_the_interrupt_returns_its_value(ray, tmp_path):
    """Ray 2.60 (compared): the task may catch the KeyboardInterrupt of its cancelled
    ``get``; its value is then its result, ``is_canceled()`` is true, and every later
    ``get``/``wait`` of the task raises again."""

    @ray.remote(max_retries=0)
    def child(path, seconds):
        with open(path, "w") as f:
            f.write("started")
        time.sleep(seconds)
        return seconds

    @ray.remote(max_retries=0)
    def parent(path):
        seen = []
        for i in range(2):
            try:
                ray.get(child.remote(path + str(i), 30 if i == 0 else 0))
            except KeyboardInterrupt:
                seen.append("interrupted")
        seen.append(ray.get_runtime_context().is_canceled())
        return seen

    ref = parent.remote(str(tmp_path / "child"))
    _wait_for_file(tmp_path / "child0")
    ray.cancel(ref, recursive=False)
    assert ray.get(ref, timeout=GET_TIMEOUT) == ["interrupted", "interrupted", True]


def test_non_forced_cancel_is_a_keyboard_interrupt_inside_the_task(ray, tasks, tmp_path):
    """Ray 2.60 (compared) interrupts a running task with KeyboardInterrupt: an ``except
    Exception`` in the task does not swallow it."""
    marker = tmp_path / "started"

    @ray.remote(max_retries=0)
    def swallows(path):
        with open(path, "w") as f:
            f.write("started")
        try:
            end = time.time() + 20
            while time.time() < end:
                pass
        except Exception:
            return "swallowed"
        return "finished"

    ref = swallows.remote(str(marker))
    _wait_for_file(marker)
    ray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert type(info.value).__name__ == "RayTaskError(TaskCancelledError)"


def test_a_task_interrupted_in_get_takes_its_cpu_back(ray, tmp_path):
    """The interrupted wait ends the worker's blocked state: the CPU it lent out while
    blocked is held again while it runs on, and free once it is done. The child is
    interrupted too (the cancel is recursive) and keeps running on purpose until the test
    lets both go: while both run they hold both CPUs. (It used to sleep through the cancel,
    which a wake-up ends at once: the CPUs were then both held only for a moment, and a
    loaded runner missed it.)"""
    go_on = tmp_path / "go-on"

    @ray.remote(max_retries=0)
    def child(path, go_on):
        with open(path, "w") as f:
            f.write("started")
        deadline = time.monotonic() + GET_TIMEOUT
        while not os.path.exists(go_on) and time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except KeyboardInterrupt:  # the recursive cancel: run on regardless
                pass

    @ray.remote(max_retries=0)
    def parent(path, go_on):
        try:
            ray.get(child.remote(path, go_on))
        except KeyboardInterrupt:
            while not os.path.exists(go_on):
                time.sleep(0.01)
        return "done"

    ref = parent.remote(str(tmp_path / "child"), str(go_on))
    _wait_for_file(tmp_path / "child")
    ray.cancel(ref)  # recursive: the child is interrupted too (at the end of its sleep)
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) != 0.0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ray.available_resources().get("CPU", 0) == 0.0  # the parent and its child
    go_on.write_text("yes")
    assert ray.get(ref, timeout=GET_TIMEOUT) == "done"


def test_is_canceled_in_the_driver_raises_runtime_error(ray):
    """As Ray 2.60 (compared): only a worker may ask."""
    with pytest.raises(RuntimeError, match="only available when the process is a worker"):
        ray.get_runtime_context().is_canceled()


# ----------------------------------------------------------------------- actor calls
@pytest.fixture
def Worker(ray):
    """A sync actor whose calls record what they saw."""

    @ray.remote
    class Worker:
        def __init__(self):
            self.log = []

        def busy(self, seconds, check=False, then=None, started=None):
            if started:
                with open(started, "w") as f:
                    f.write("started")
            end = time.time() + seconds
            while time.time() < end:
                if check and ray.get_runtime_context().is_canceled():
                    self.log.append("saw the cancel")
                    break
            if then == "raise":
                raise ValueError("its own error")
            if then == "interrupt":
                raise KeyboardInterrupt
            return "returned"

        def add(self, item):
            self.log.append(item)
            return item

        def canceled(self):
            return ray.get_runtime_context().is_canceled()

        def items(self):
            return self.log

    return Worker


def _cancel_error_text(ref) -> str:
    return f"Task: {ref.hex()[:48]} was cancelled."


def test_cancel_queued_actor_call_never_runs(ray, Worker):
    """A call queued behind a running one fails with TaskCancelledError (not a
    RayTaskError) naming the actor, never runs, and later calls run. Compared with Ray
    2.60: same error and words ("... is canceled from an actor ... before it executes.");
    Ray 2.60 runs such a call all the same and replaces its result (against its own
    documentation), miniray skips it."""
    actor = Worker.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    # The cancel reaches the actor's process on its own socket, and must get there before
    # the running call ends (else the queued call runs, and fails with a running call's
    # cancel error: test_cancel_of_a_queued_actor_call_that_reaches_it_too_late): 3 s, not
    # 1, of room for a loaded machine (no event says the cancel arrived).
    running = actor.busy.remote(3.0)
    queued = actor.add.remote("queued")
    time.sleep(0.2)
    ray.cancel(queued)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(queued, timeout=GET_TIMEOUT)
    assert not isinstance(info.value, exceptions.RayTaskError)
    assert str(info.value) == (f"The task {queued.hex()[:48]} is canceled from an actor "
                               f"{actor._actor_id_hex()} before it executes.")
    assert ray.get(running, timeout=GET_TIMEOUT) == "returned"
    assert ray.get(actor.add.remote("later"), timeout=GET_TIMEOUT) == "later"
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == ["later"]


@pytest.fixture
def LateCancel(ray, tmp_path):
    """A sync actor whose process handles a CANCEL only once the file ``cancel_gate`` exists
    (``MINIRAY_TEST_ACTOR_CANCEL_GATE``): a cancel that reaches it after the call ended."""

    @ray.remote
    class Gated:
        def __init__(self):
            self.log = []

        def wait_for(self, path):
            _wait_for_file(path)
            return "ahead"

        def add(self, item, size=0):
            self.log.append(item)
            return b"x" * size if size else item

        def pair(self):
            self.log.append("pair")
            return 1, 2

        def values(self, n):
            yield from range(n)

        def items(self):
            return self.log

    cancel_gate = tmp_path / "cancel-gate"
    actor = Gated.options(runtime_env={"env_vars": {
        "MINIRAY_TEST_ACTOR_CANCEL_GATE": str(cancel_gate)}}).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    yield actor, cancel_gate
    cancel_gate.write_text("open")  # the actor's control thread waits no more


@pytest.mark.parametrize("size", [0, 2 * 1024 * 1024])
def test_cancel_of_a_queued_actor_call_that_reaches_it_too_late(ray, LateCancel, tmp_path,
                                                               size):
    """A call queued behind another when ``ray.cancel()`` returned starts once the call
    ahead ends, and returns before its process handles the cancel: its value is replaced by
    the cancel error of a call cancelled while it ran, and freed (a small inline value, or
    a large one's segment, which the fixture checks). Compared with Ray 2.60, whose owner
    fails a cancelled actor call whatever it returns: "Task: ... was cancelled."."""
    actor, cancel_gate = LateCancel
    gate = tmp_path / "ahead-gate"
    ahead = actor.wait_for.remote(str(gate))
    queued = actor.add.remote("queued", size)
    ray.cancel(queued)
    gate.write_text("open")  # the queued call runs now; its process has not seen the cancel
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(queued, timeout=GET_TIMEOUT)
    assert not isinstance(info.value, exceptions.RayTaskError)
    assert str(info.value) == _cancel_error_text(queued)
    store = runtime.current().store  # the value's segment went before the error was set
    assert not os.path.exists(os.path.join(
        store.shm_dir, shm_segments.segment_name(store.session_tag, queued.binary())))
    assert ray.get(ahead, timeout=GET_TIMEOUT) == "ahead"
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == ["queued"]  # it ran
    cancel_gate.write_text("open")
    assert ray.get(actor.add.remote("later"), timeout=GET_TIMEOUT) == "later"


def test_cancel_too_late_fails_every_return_of_a_call(ray, LateCancel, tmp_path):
    """``num_returns=2``: both refs get the cancel error, as in Ray 2.60 (cancelling one
    ref of a running call fails both)."""
    actor, cancel_gate = LateCancel
    gate = tmp_path / "ahead-gate"
    ahead = actor.wait_for.remote(str(gate))
    first, second = actor.pair.options(num_returns=2).remote()
    ray.cancel(first)
    gate.write_text("open")
    for ref in (first, second):
        with pytest.raises(exceptions.TaskCancelledError) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        assert str(info.value) == _cancel_error_text(first)
    assert ray.get(ahead, timeout=GET_TIMEOUT) == "ahead"
    cancel_gate.write_text("open")


def test_cancel_too_late_ends_a_streaming_call_with_the_cancel_error(ray, LateCancel,
                                                                     tmp_path):
    """A streaming call that yielded all its values before its process saw the cancel:
    the values yielded stay readable and the stream ends with the cancel error, as a
    streaming call cancelled while it runs does in Ray 2.60 (values first, then
    TaskCancelledError)."""
    actor, cancel_gate = LateCancel
    gate = tmp_path / "ahead-gate"
    ahead = actor.wait_for.remote(str(gate))
    gen = actor.values.options(num_returns="streaming").remote(2)
    ray.cancel(gen)
    gate.write_text("open")
    outcome, refs = [], []
    for ref in gen:
        refs.append(ref)
        try:
            outcome.append(ray.get(ref, timeout=GET_TIMEOUT))
        except exceptions.TaskCancelledError as error:
            outcome.append(str(error))
    assert outcome == [0, 1, _cancel_error_text(refs[0])]
    assert ray.get(ahead, timeout=GET_TIMEOUT) == "ahead"
    cancel_gate.write_text("open")


def test_cancel_too_late_fails_a_dynamic_call(ray, LateCancel, tmp_path):
    """``num_returns="dynamic"``: the generator's ref gets the cancel error, as in Ray 2.60,
    and the values it stored are freed with the generator that held them."""
    actor, cancel_gate = LateCancel
    gate = tmp_path / "ahead-gate"
    ahead = actor.wait_for.remote(str(gate))
    with pytest.warns(Warning):
        ref = actor.values.options(num_returns="dynamic").remote(2)
    ray.cancel(ref)
    gate.write_text("open")
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert str(info.value) == _cancel_error_text(ref)
    assert ray.get(ahead, timeout=GET_TIMEOUT) == "ahead"
    del ref, info, ahead  # nothing else holds the values it stored
    objects = runtime.current().owner.objects
    assert wait_until(lambda: not objects.entries, GET_TIMEOUT), list(objects.entries)
    cancel_gate.write_text("open")



    """Calls are sent to the actor's process while its constructor runs; a cancel that
    arrives then is kept for the call, which never runs. Compared with Ray 2.60 (a call
    cancelled before its actor is ready fails with TaskCancelledError)."""

    @ray.remote
    class SlowStart:
        def __init__(self):
            time.sleep(3.0)  # the cancel must reach the process before this ends: room for load
            self.log = []

        def add(self, item):
            self.log.append(item)
            return item

        def items(self):
            return self.log

    actor = SlowStart.remote()
    queued = actor.add.remote("queued")
    time.sleep(0.5)  # the actor's process is running its constructor, the call was sent
    ray.cancel(queued)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(queued, timeout=GET_TIMEOUT)
    assert "before it executes" in str(info.value)
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == []


def test_cancel_actor_call_waiting_for_its_argument(ray, Worker, tasks, tmp_path):
    """A call not yet sent (its argument is pending) fails at once with Ray 2.60's words
    (compared); the actor goes on (under Ray 2.60 its next calls stall for 30 s and fail
    with ActorUnavailableError: a gap in its ordering, not copied)."""
    actor = Worker.remote()
    upstream = tasks.sleeper.remote(str(tmp_path / "up"), 2)
    waiting = actor.add.remote(upstream)
    ray.cancel(waiting)
    assert ray.wait([waiting], timeout=0)[0] == [waiting]  # failed by cancel() itself
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(waiting, timeout=GET_TIMEOUT)
    assert "before it executes" in str(info.value)
    assert ray.get(actor.add.remote("next"), timeout=GET_TIMEOUT) == "next"
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == ["next"]


@pytest.mark.parametrize("then, expected", [
    (None, "cancelled"), ("interrupt", "cancelled"), ("raise", "RayTaskError(ValueError)"),
])
def test_cancel_running_sync_actor_call_sets_a_flag(ray, Worker, tmp_path, then, expected):
    """A running sync call is not interrupted: ``is_canceled()`` turns true for it alone.
    When it ends, a returned value or a KeyboardInterrupt becomes TaskCancelledError ("Task:
    <id> was cancelled.", not a RayTaskError); an error of its own stands. Compared with Ray
    2.60, each case."""
    actor = Worker.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    ref = actor.busy.remote(20, check=True, then=then, started=str(tmp_path / "started"))
    _wait_for_file(tmp_path / "started")
    ray.cancel(ref)
    if expected == "cancelled":
        with pytest.raises(exceptions.TaskCancelledError) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        assert not isinstance(info.value, exceptions.RayTaskError)
        assert str(info.value) == _cancel_error_text(ref)
    else:
        with pytest.raises(ValueError) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        assert type(info.value).__name__ == expected
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == ["saw the cancel"]
    assert ray.get(actor.canceled.remote(), timeout=GET_TIMEOUT) is False


@pytest.mark.parametrize("max_concurrency", [1, 2], ids=["sync", "threaded"])
@pytest.mark.parametrize("how", ["get", "wait"])
def test_cancel_reaches_an_actor_call_blocked_in_get(ray_start, tmp_path, max_concurrency,
                                                     how):
    """A sync or threaded actor call blocked in ``get``/``wait`` gets KeyboardInterrupt
    there at once, with ``is_canceled()`` true; it caught it and returned, so its result is
    TaskCancelledError. Compared with Ray 2.60 (the same, for sync and threaded actors)."""
    ray_start(num_cpus=2)

    @miniray.remote(max_concurrency=max_concurrency)
    class Blocked:
        def __init__(self):
            self.log = []

        def blocked(self, path):
            @miniray.remote(max_retries=0)
            def child(path):
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(60)

            ref = child.remote(path)
            try:
                miniray.get(ref) if how == "get" else miniray.wait([ref])
            except BaseException as error:
                self.log.append((type(error).__name__,
                                 miniray.get_runtime_context().is_canceled()))
                return "caught"

        def items(self):
            return self.log

    actor = Blocked.remote()
    ref = actor.blocked.remote(str(tmp_path / "child"))
    child_pid = int(_wait_for_file(tmp_path / "child"))
    start = time.monotonic()
    miniray.cancel(ref, recursive=False)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        miniray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 15.0  # well under the child's 60 s: the wait was interrupted
    assert str(info.value) == _cancel_error_text(ref)
    assert miniray.get(actor.items.remote(), timeout=GET_TIMEOUT) == [
        ("KeyboardInterrupt", True)]
    os.kill(child_pid, 9)


@pytest.mark.parametrize("kind", ["sync", "threaded", "async"])
def test_force_cancel_of_an_actor_call_raises_value_error(ray, kind):
    """Ray 2.60 (compared): ValueError for a queued or running call of any actor; a finished
    call is a no-op."""
    options = {"threaded": {"max_concurrency": 2}}.get(kind, {})

    if kind == "async":
        class Napper:
            async def nap(self, seconds):
                await asyncio.sleep(seconds)
                return seconds
    else:
        class Napper:
            def nap(self, seconds):
                time.sleep(seconds)
                return seconds

    actor = ray.remote(**options)(Napper).remote() if options else ray.remote(Napper).remote()
    done = actor.nap.remote(0)
    assert ray.get(done, timeout=GET_TIMEOUT) == 0
    running = actor.nap.remote(3)
    # The second call takes as long too (queued behind the first, or running beside it): a
    # nap(0) could end before its cancel, which is then a no-op, as for ``done`` (so could
    # a nap of 0.5 s on a loaded machine).
    for ref in (running, actor.nap.remote(3)):
        with pytest.raises(ValueError, match="force=True is not supported for actor tasks"):
            ray.cancel(ref, force=True)
    ray.cancel(done, force=True)
    assert ray.get(running, timeout=GET_TIMEOUT) == 3


@pytest.fixture
def AsyncWorker(ray):
    @ray.remote
    class AsyncWorker:
        def __init__(self):
            self.log = []

        async def nap(self, seconds, swallow=False, started=None):
            if started:
                with open(started, "w") as f:
                    f.write("started")
            try:
                await asyncio.sleep(seconds)
                return "slept"
            except asyncio.CancelledError:
                self.log.append("CancelledError")
                if swallow:
                    return "swallowed"
                raise
            finally:
                self.log.append("finally")

        async def canceled(self):
            try:
                return ray.get_runtime_context().is_canceled()
            except RuntimeError as error:
                return str(error)

        def sync_canceled(self):
            try:
                return ray.get_runtime_context().is_canceled()
            except RuntimeError as error:
                return str(error)

        async def items(self):
            return self.log

    return AsyncWorker


@pytest.mark.parametrize("swallow", [False, True], ids=["raises", "swallows"])
def test_cancel_running_async_call_cancels_its_coroutine(ray, AsyncWorker, tmp_path, swallow):
    """The coroutine gets CancelledError (its ``finally`` runs) and ``get`` raises
    ``RayTaskError(TaskCancelledError)``, even when the coroutine swallowed the
    CancelledError and returned. Compared with Ray 2.60."""
    actor = AsyncWorker.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    ref = actor.nap.remote(30, swallow, str(tmp_path / "started"))
    _wait_for_file(tmp_path / "started")
    time.sleep(0.1)  # into its await
    ray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert type(info.value).__name__ == "RayTaskError(TaskCancelledError)"
    assert ray.get(actor.items.remote(), timeout=GET_TIMEOUT) == ["CancelledError", "finally"]
    assert ray.get(actor.nap.remote(0), timeout=GET_TIMEOUT) == "slept"


def test_cancel_async_call_waiting_for_its_turn(ray, tmp_path):
    """A call of an async actor at max_concurrency, waiting for a slot, fails at once with
    TaskCancelledError "... before it executes." and never runs; the running call and later
    ones are untouched. Compared with Ray 2.60."""

    gate = str(tmp_path / "gate")

    @ray.remote(max_concurrency=1)
    class One:
        async def nap(self, seconds, tag, gate=None):
            await asyncio.sleep(seconds)
            while gate and not os.path.exists(gate):  # held until the test opens it
                await asyncio.sleep(0.01)
            return tag

    actor = One.remote()
    first = actor.nap.remote(0, "first", gate)
    second = actor.nap.remote(0, "second")
    time.sleep(0.3)
    ray.cancel(second)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(second, timeout=GET_TIMEOUT)
    # at once: while the first call still holds the slot (not timed: a 1 s bound on the
    # get, with the first call a 1.5 s nap, failed on a loaded machine)
    assert ray.wait([first], timeout=0)[0] == []
    assert not isinstance(info.value, exceptions.RayTaskError)
    assert "before it executes" in str(info.value)
    open(gate, "w").close()
    assert ray.get(first, timeout=GET_TIMEOUT) == "first"
    assert ray.get(actor.nap.remote(0, "after"), timeout=GET_TIMEOUT) == "after"


def test_is_canceled_in_an_async_actor_raises_runtime_error(ray, AsyncWorker):
    """Ray 2.60 (compared): in async and sync methods of an async actor alike."""
    actor = AsyncWorker.remote()
    message = "This method is not supported in an async actor."
    assert ray.get(actor.canceled.remote(), timeout=GET_TIMEOUT) == message
    assert ray.get(actor.sync_canceled.remote(), timeout=GET_TIMEOUT) == message


@CANCEL_REACHES_A_PYTHON_LOOP
@pytest.mark.parametrize("recursive", [True, False])
def test_recursive_cancel_of_an_actor_call_reaches_its_tasks(ray, tmp_path, recursive):
    """The tasks an actor call submitted are cancelled with it when ``recursive`` (the
    default), as in Ray 2.60 (compared: the call's get of its cancelled child fails), and
    left running otherwise."""
    started, caught = tmp_path / "started", tmp_path / "caught"

    @ray.remote(max_retries=0)
    def child(started, caught):
        with open(started, "w") as f:
            f.write(str(os.getpid()))
        try:
            end = time.time() + 30
            while time.time() < end:
                pass
        except BaseException as error:
            with open(caught, "w") as f:
                f.write(type(error).__name__)
            raise

    @ray.remote
    class Parent:
        def run(self, started, caught):
            return ray.get(child.remote(started, caught))

    actor = Parent.remote()
    ref = actor.run.remote(str(started), str(caught))
    child_pid = int(_wait_for_file(started))
    ray.cancel(ref, recursive=recursive)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    if recursive:
        assert _wait_for_file(caught, timeout=GET_TIMEOUT) == "KeyboardInterrupt"
    else:
        time.sleep(0.5)
        assert not caught.exists() and procinfo.is_alive(child_pid)
        os.kill(child_pid, 9)
