"""Actor failures: application errors, ``__ray_terminate__``, ``exit_actor``, ``ray.kill``,
crashes with and without restarts, task retries, constructor errors, dead handles.

The actor row of the failure matrix (house style, habit 11).
Ray 2.60 behaviour: ray-api-surface.md §2.8 (failures, retries, restarts), §2.9 (built-in
methods), §3.5 (``ray.kill``), §5 (``ActorDiedError``).
"""

from __future__ import annotations

import os
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private.host import procinfo

from .helpers import wait_until

GET_TIMEOUT = 30


@pytest.fixture
def Worker(ray):
    @ray.remote
    class Worker:
        def __init__(self):
            self.count = 0
            self.items = []

        def incr(self):
            self.count += 1
            return self.count

        def add(self, item):
            time.sleep(0.05)
            self.items.append(item)
            return item

        def items_(self):
            return list(self.items)

        def pid(self):
            return os.getpid()

        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

        def crash(self, code=1):
            os._exit(code)

        def crash_once(self, marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            return "second attempt"

        def fail(self):
            raise ValueError("app error")

        def leave(self):
            miniray.actor.exit_actor()
            return "unreachable"

    return Worker


def _assert_dead(ray, ref, *texts):
    with pytest.raises(exceptions.ActorDiedError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.RayActorError)
    for text in texts:
        assert text in str(info.value), str(info.value)
    return info.value


def test_application_error_keeps_the_actor_alive(ray, Worker):
    actor = Worker.remote()
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    with pytest.raises(ValueError, match="app error") as info:
        ray.get(actor.fail.remote(), timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.RayTaskError)
    assert "Worker.fail" in str(info.value)
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 2


def test_ray_terminate_finishes_queued_calls_first(ray, Worker):
    actor = Worker.remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    queued = [actor.add.remote(i) for i in range(5)]
    done = actor.__ray_terminate__.remote()
    later = actor.incr.remote()
    assert ray.get(queued, timeout=GET_TIMEOUT) == list(range(5))
    _assert_dead(ray, done, "exited intentionally")  # as in Ray 2.60: no value
    _assert_dead(ray, later)
    _assert_dead(ray, actor.incr.remote())
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)


def test_exit_actor_fails_its_call_then_later_calls(ray, Worker):
    actor = Worker.options(max_restarts=2).remote()  # an intentional exit never restarts
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    _assert_dead(ray, actor.leave.remote(), "exited")  # as in Ray 2.60: no value
    error = _assert_dead(ray, actor.incr.remote(), "exited")
    assert not error.actor_init_failed
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)
    with pytest.raises(TypeError, match="non-actor"):
        miniray.actor.exit_actor()  # in the driver


def test_exit_actor_fails_the_calls_queued_behind_it(ray, Worker):
    actor = Worker.remote()
    leaving = actor.leave.remote()
    queued = actor.incr.remote()
    _assert_dead(ray, leaving, "exited")
    _assert_dead(ray, queued, "exited")


def test_exit_actor_in_an_async_actor(ray):
    @ray.remote
    class AsyncLeaver:
        async def leave(self):
            miniray.actor.exit_actor()

        async def ping(self):
            return "pong"

    actor = AsyncLeaver.remote()
    assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT) == "pong"
    _assert_dead(ray, actor.leave.remote(), "exited")
    _assert_dead(ray, actor.ping.remote(), "exited")


def test_exit_actor_in_a_threaded_actor_fails_later_calls(ray):
    @ray.remote(max_concurrency=3)
    class ThreadedLeaver:
        def leave(self):
            import sys
            import threading

            me, real = threading.get_ident(), sys.stdout

            class SlowExitFlush:  # the process takes a moment to go, as a busy one may
                flushes = 0

                def write(self, text):
                    return real.write(text)

                def flush(self):
                    if threading.get_ident() == me:
                        SlowExitFlush.flushes += 1
                        if SlowExitFlush.flushes > 1:  # the flush in exit_process
                            time.sleep(1.0)
                    return real.flush()

            sys.stdout = SlowExitFlush()
            miniray.actor.exit_actor()

        def ping(self):
            return "pong"

    actor = ThreadedLeaver.remote()
    _assert_dead(ray, actor.leave.remote(), "exited")
    _assert_dead(ray, actor.ping.remote(), "exited")


def test_max_pending_calls_limits_queued_calls(ray, Worker):
    actor = Worker.options(max_pending_calls=1).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    first = actor.sleep.remote(3)  # still pending at the next calls, even on a loaded machine
    with pytest.raises(exceptions.PendingCallsLimitExceeded):
        for _ in range(3):
            actor.incr.remote()
    assert ray.get(first, timeout=GET_TIMEOUT) == 3


def test_kill_interrupts_a_running_call_and_fails_later_calls(ray, Worker):
    actor = Worker.options(num_cpus=1).remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    running = actor.sleep.remote(60)
    queued = actor.incr.remote()
    time.sleep(0.2)
    start = time.monotonic()
    ray.kill(actor)
    _assert_dead(ray, running, "killed by `ray.kill`")
    assert time.monotonic() - start < 10
    _assert_dead(ray, queued, "killed by `ray.kill`")
    _assert_dead(ray, actor.incr.remote(), "killed by `ray.kill`")
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)
    assert wait_until(lambda: miniray.available_resources().get("CPU") == 2.0, timeout=10)
    ray.kill(actor)  # killing a dead actor is a no-op
    with pytest.raises(ValueError, match="only supported for actors"):
        ray.kill("not an actor")
    with pytest.raises(ValueError, match="only supported for actors"):
        ray.kill(actor.incr.remote)


def _assert_unavailable(ray, ref, *texts):
    """A call lost with the process of an actor that restarts (compared with Ray 2.60)."""
    with pytest.raises(exceptions.ActorUnavailableError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    assert not isinstance(info.value, exceptions.ActorDiedError)
    for text in texts:
        assert text in str(info.value), str(info.value)
    return info.value


def test_crash_with_restart_gives_fresh_state(ray, Worker):
    actor = Worker.options(max_restarts=1).remote()
    assert ray.get([actor.incr.remote(), actor.incr.remote()], timeout=GET_TIMEOUT) == [1, 2]
    first_pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    # max_task_retries=0: the call fails, but the actor restarts
    _assert_unavailable(ray, actor.crash.remote(), "restarting", "exited with code 1",
                        actor._actor_id_hex())
    # restarted: the constructor ran again, in a new process
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    assert ray.get(actor.pid.remote(), timeout=GET_TIMEOUT) != first_pid
    # no restarts left: the next crash is final
    _assert_dead(ray, actor.crash.remote(7), "exited with code 7")
    _assert_dead(ray, actor.incr.remote(), "exited with code 7")


def test_crash_is_retried_with_max_task_retries(ray, Worker, tmp_path):
    actor = Worker.options(max_restarts=1, max_task_retries=1).remote()
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    marker = str(tmp_path / "crashed_once")
    assert ray.get(actor.crash_once.remote(marker), timeout=GET_TIMEOUT) == "second attempt"
    assert os.path.exists(marker)
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1  # fresh state


def test_method_level_max_task_retries(ray, Worker, tmp_path):
    actor = Worker.options(max_restarts=1).remote()
    marker = str(tmp_path / "crashed_once")
    ref = actor.crash_once.options(max_task_retries=1).remote(marker)
    assert ray.get(ref, timeout=GET_TIMEOUT) == "second attempt"


def test_crash_without_restarts_fails_every_later_call(ray, Worker):
    actor = Worker.options(num_cpus=1).remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    crash = actor.crash.remote(3)
    behind = actor.incr.remote()
    error = _assert_dead(ray, crash, "exited with code 3", "Worker", actor._actor_id_hex())
    assert "died unexpectedly" in str(error)
    assert error.actor_id == actor._actor_id_hex()
    _assert_dead(ray, behind, "exited with code 3")
    for _ in range(3):
        _assert_dead(ray, actor.incr.remote(), "exited with code 3")
    assert not procinfo.is_alive(pid)
    assert wait_until(lambda: miniray.available_resources().get("CPU") == 2.0, timeout=10)


def test_kill_with_no_restart_false_restarts_the_actor(ray, Worker):
    actor = Worker.options(max_restarts=1).remote()
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    first_pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    ray.kill(actor, no_restart=False)
    assert wait_until(lambda: not procinfo.is_alive(first_pid), timeout=10)
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    assert ray.get(actor.pid.remote(), timeout=GET_TIMEOUT) != first_pid
    # the restart used up max_restarts; a default kill is final anyway
    ray.kill(actor)
    _assert_dead(ray, actor.incr.remote(), "killed by `ray.kill`")


def test_kill_with_no_restart_true_is_final_even_with_restarts_left(ray, Worker):
    actor = Worker.options(max_restarts=5).remote()
    ray.get(actor.incr.remote(), timeout=GET_TIMEOUT)
    ray.kill(actor, no_restart=True)
    _assert_dead(ray, actor.incr.remote(), "killed by `ray.kill`")


def test_constructor_error_fails_every_call(ray):
    @ray.remote
    class Broken:
        def __init__(self, message):
            raise RuntimeError(message)

        def method(self):
            return "never"

    actor = Broken.remote("constructor exploded")
    for _ in range(3):
        error = _assert_dead(ray, actor.method.remote(), "constructor exploded", "creation task")
        assert error.actor_init_failed is True
    # __ray_ready__ reports the failure too
    _assert_dead(ray, actor.__ray_ready__.remote(), "constructor exploded")


def test_constructor_error_in_an_argument_fails_every_call(ray):
    @ray.remote
    def bad_arg():
        raise KeyError("missing piece")

    @ray.remote
    class NeedsArg:
        def __init__(self, value):
            self.value = value

        def get(self):
            return self.value

    actor = NeedsArg.remote(bad_arg.remote())
    error = _assert_dead(ray, actor.get.remote(), "missing piece")
    assert error.actor_init_failed is True


def test_handle_used_after_its_actor_died(ray, Worker):
    @ray.remote
    def call_it(handle):
        return ray.get(handle.incr.remote())

    actor = Worker.remote()
    assert ray.get(call_it.remote(actor), timeout=GET_TIMEOUT) == 1
    ray.kill(actor)
    _assert_dead(ray, actor.incr.remote(), "killed by `ray.kill`")
    # in a task: the task fails with RayTaskError(ActorDiedError), still an ActorDiedError
    with pytest.raises(exceptions.ActorDiedError) as info:
        ray.get(call_it.remote(actor), timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.RayTaskError)
    assert "killed by `ray.kill`" in str(info.value)


def test_async_actor_crash_and_kill(ray):
    @ray.remote(max_restarts=1)
    class AsyncCrash:
        def __init__(self):
            self.count = 0

        async def incr(self):
            self.count += 1
            return self.count

        async def crash(self):
            os._exit(5)

        async def nap(self, seconds):
            import asyncio

            await asyncio.sleep(seconds)

    actor = AsyncCrash.remote()
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    _assert_unavailable(ray, actor.crash.remote(), "exited with code 5")
    assert ray.get(actor.incr.remote(), timeout=GET_TIMEOUT) == 1
    running = actor.nap.remote(60)
    time.sleep(0.2)
    ray.kill(actor)
    _assert_dead(ray, running, "killed by `ray.kill`")


# --------------------------------------------------- actors die with the process that made them
# Ray 2.60 makes the process that creates an actor its owner, and a non-detached actor dies
# with its owner (the fault-tolerance page's "actor creator failure"); each case below was
# run under Ray 2.60 with the same classes: a child of a killed, exited or crashed actor
# raises ActorDiedError ("The actor is dead because its owner has died"), even when the
# parent restarts; a detached child lives on; so does an actor made by a task whose worker
# is still alive or was retired after max_calls. miniray kept every such child alive.


@pytest.fixture
def family(ray):
    @ray.remote
    class Child:
        def pid(self):
            return os.getpid()

    @ray.remote(max_restarts=1)
    class Parent:
        def make(self, detached_name=None):
            self.child = Child.remote()
            made = [self.child]
            if detached_name:
                self.other = Child.options(name=detached_name, lifetime="detached").remote()
                made.append(self.other)
            return made

        def make_parent(self):
            self.parent = Parent.remote()
            return [self.parent, ray.get(self.parent.make.remote())[0]]

        def pid(self):
            return os.getpid()

        def leave(self):
            miniray.actor.exit_actor()

    return Child, Parent


def _owner_died(ray, child, *texts):
    """The child's calls fail once its parent's end is seen (the parent's process is
    killed after ``ray.kill`` returns, in Ray too): calls answered until then are fine."""
    deadline = time.monotonic() + GET_TIMEOUT
    while time.monotonic() < deadline:
        try:
            ray.get(child.pid.remote(), timeout=GET_TIMEOUT)
        except exceptions.ActorDiedError as error:
            for text in ("its owner has died",) + texts:
                assert text in str(error), str(error)
            return error
        time.sleep(0.02)
    raise AssertionError("the child still answers")


def _created_by(ray):
    from miniray._private import runtime

    return runtime.current().owner.actors.created_by


@pytest.mark.parametrize("end", ["ray.kill", "exit_actor", "SIGKILL"])
def test_an_actors_children_die_with_its_process(ray, family, end):
    Child, Parent = family
    parent = Parent.remote()
    child, detached = ray.get(parent.make.remote(f"kept-{end}"), timeout=GET_TIMEOUT)
    assert ray.get(child.pid.remote(), timeout=GET_TIMEOUT) > 0
    pid = ray.get(parent.pid.remote(), timeout=GET_TIMEOUT)
    if end == "ray.kill":
        ray.kill(parent)
        how = "killed by signal 9"
    elif end == "exit_actor":
        with pytest.raises(exceptions.ActorDiedError):
            ray.get(parent.leave.remote(), timeout=GET_TIMEOUT)
        how = "exited with code 0"
    else:  # the parent restarts (max_restarts=1); its first process's children do not
        os.kill(pid, 9)
        how = "killed by signal 9"
    error = _owner_died(ray, child, f"pid={pid}) of actor Parent ended: {how}")
    assert "Child" in str(error)
    if end == "SIGKILL":
        assert ray.get(parent.pid.remote(), timeout=GET_TIMEOUT) != pid
    assert ray.get(detached.pid.remote(), timeout=GET_TIMEOUT) > 0  # detached: lives on
    ray.kill(detached)
    wait_until(lambda: not _created_by(ray), timeout=10)


def test_a_grandchild_dies_with_its_parent_in_turn(ray, family):
    Child, Parent = family
    top = Parent.remote()
    middle, grandchild = ray.get(top.make_parent.remote(), timeout=GET_TIMEOUT)
    assert ray.get(grandchild.pid.remote(), timeout=GET_TIMEOUT) > 0
    ray.kill(top)
    _owner_died(ray, middle, "of actor Parent")
    _owner_died(ray, grandchild, "of actor Parent")
    wait_until(lambda: not _created_by(ray), timeout=10)


def test_a_named_child_dies_and_frees_its_name(ray, family):
    Child, Parent = family

    @ray.remote
    class Namer:
        def make(self):
            self.child = Child.options(name="named-child").remote()
            return self.child

    namer = Namer.remote()
    child = ray.get(namer.make.remote(), timeout=GET_TIMEOUT)
    assert ray.get(ray.get_actor("named-child").pid.remote(), timeout=GET_TIMEOUT) > 0
    ray.kill(namer)
    _owner_died(ray, child, "of actor Namer")
    with pytest.raises(ValueError):
        ray.get_actor("named-child")


def test_a_tasks_actor_outlives_the_task_but_not_a_crash_of_its_worker(ray, family):
    Child, _ = family

    @ray.remote
    class Keeper:
        def keep(self, handles):
            self.kept = handles[0]

        def child_pid(self):
            return ray.get(self.kept.pid.remote())

    keeper = Keeper.remote()

    @ray.remote(max_calls=1)
    def make_and_return():
        return Child.remote()

    @ray.remote(max_retries=0)
    def make_and_crash():
        ray.get(keeper.keep.remote([Child.remote()]))
        os._exit(7)

    # Its worker ends on purpose after the call (max_calls=1): the actor stays, as in Ray.
    returned = ray.get(make_and_return.remote(), timeout=GET_TIMEOUT)
    time.sleep(0.5)
    assert ray.get(returned.pid.remote(), timeout=GET_TIMEOUT) > 0
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(make_and_crash.remote(), timeout=GET_TIMEOUT)
    with pytest.raises(exceptions.RayTaskError) as info:
        ray.get(keeper.child_pid.remote(), timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.ActorDiedError)
    assert "its owner has died" in str(info.value)
    assert "of task make_and_crash exited with code 7" in str(info.value)
    ray.kill(returned)
    wait_until(lambda: not _created_by(ray), timeout=10)


class _Flaky:
    """Fails its first two calls of ``flaky``; ``keyish`` always raises ValueError."""

    def __init__(self):
        self.calls = 0

    def flaky(self):
        self.calls += 1
        if self.calls < 3:
            raise ValueError(f"fail {self.calls}")
        return self.calls

    @miniray.method(retry_exceptions=[KeyError])
    def keyish(self):
        self.calls += 1
        raise ValueError(f"not a KeyError ({self.calls})")


def test_actor_methods_retry_the_exceptions_they_name(ray, caplog):
    """``retry_exceptions`` on an actor method (``.options`` or ``@ray.method``) retries a
    call that raised one of them, on the same actor, while ``max_task_retries`` (the
    actor's or the call's) allows, with Ray's retry line. Compared with Ray 2.60 (the
    fault-tolerance page's actor options, the same script): 3, 3, 3, then "fail 2" with
    one retry, no retry for an exception the list does not name, none without
    retry_exceptions. miniray accepted the option and never retried. The handle is
    dropped at once each time: the actor's exit waits for the retried call."""
    with_retries = miniray.remote(max_task_retries=3)(_Flaky)
    plain = miniray.remote(_Flaky)
    runs = {
        "actor's": lambda: with_retries.remote().flaky.options(
            retry_exceptions=True).remote(),
        "creation's": lambda: plain.options(max_task_retries=3).remote().flaky.options(
            retry_exceptions=True).remote(),
        "call's": lambda: plain.remote().flaky.options(
            max_task_retries=3, retry_exceptions=True).remote(),
    }
    for name, run in runs.items():
        assert ray.get(run(), timeout=60) == 3, name
    with pytest.raises(ValueError, match="fail 2"):
        ray.get(plain.remote().flaky.options(max_task_retries=1,
                                             retry_exceptions=True).remote(), timeout=60)
    with pytest.raises(ValueError, match=r"not a KeyError \(1\)"):
        ray.get(with_retries.remote().keyish.remote(), timeout=60)
    with pytest.raises(ValueError, match="fail 1"):
        ray.get(with_retries.remote().flaky.remote(), timeout=60)
    lines = [r.getMessage() for r in caplog.records if "retries remaining" in r.getMessage()]
    assert len(lines) == 7, lines  # two per successful run, one for the run with one retry
    assert lines[0].startswith("Task _Flaky.flaky failed. There are 3 retries remaining, so "
                               "the task will be retried. Error: User exception:"), lines[0]
    assert lines[1].startswith("Task _Flaky.flaky failed. There are 2 retries remaining")
