"""An actor's life as Ray 2.60 runs it: how it ends (``exit_actor``, ``__ray_terminate__``,
``sys.exit``, its last handle dropped, ``ray.kill``) and which of those run its
``__ray_shutdown__`` and ``atexit`` handlers; actors created inside actors, also after a
restart; ``async def __init__``; ``was_current_actor_reconstructed``; how a handle finds a
method (instance attributes, static and class methods); ``ActorMethod.options`` checks.

Every behaviour here was compared side by side with Ray 2.60 (its own virtualenv), as each
test's docstring says. Failures of other kinds (crashes, restarts, retries) are in
``test_actor_failures.py``.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private.host import procinfo

from .helpers import wait_until

GET_TIMEOUT = 30


# ----------------------------------------------------------------------------- actors in actors
def test_an_actor_created_in_a_constructor_works_also_after_a_restart(ray):
    """A constructor that creates an actor: the first start and the restart both work (before,
    the nested creation failed with AttributeError '_lock'). Compared with Ray 2.60: both
    starts answer through the child."""

    @ray.remote
    class Child:
        def ping(self):
            return "child"

    @ray.remote(max_restarts=1)
    class Parent:
        def __init__(self):
            self.child = Child.remote()

        def ask(self):
            return miniray.get(self.child.ping.remote(), timeout=GET_TIMEOUT), os.getpid()

        def crash(self):
            os._exit(1)

    parent = Parent.remote()
    answer, first_pid = ray.get(parent.ask.remote(), timeout=GET_TIMEOUT)
    assert answer == "child"
    with pytest.raises(exceptions.ActorUnavailableError):  # the call lost with the process
        ray.get(parent.crash.remote(), timeout=GET_TIMEOUT)
    answer, second_pid = ray.get(parent.ask.remote(), timeout=GET_TIMEOUT)
    assert answer == "child" and second_pid != first_pid


def test_was_current_actor_reconstructed_is_true_only_after_a_restart(ray):
    """Compared with Ray 2.60: False on the first start, True in the constructor and the
    methods of a restarted actor (miniray always said False); AssertionError in the driver
    and in a task."""

    @ray.remote(max_restarts=2)
    class Phoenix:
        def __init__(self):
            self.at_init = miniray.get_runtime_context().was_current_actor_reconstructed

        def state(self):
            context = miniray.get_runtime_context()
            return self.at_init, context.was_current_actor_reconstructed

        def crash(self):
            os._exit(1)

    @ray.remote
    def in_a_task():
        return miniray.get_runtime_context().was_current_actor_reconstructed

    actor = Phoenix.remote()
    assert ray.get(actor.state.remote(), timeout=GET_TIMEOUT) == (False, False)
    with pytest.raises(exceptions.ActorUnavailableError):
        ray.get(actor.crash.remote(), timeout=GET_TIMEOUT)
    assert ray.get(actor.state.remote(), timeout=GET_TIMEOUT) == (True, True)
    with pytest.raises(AssertionError, match="only available inside an actor"):
        miniray.get_runtime_context().was_current_actor_reconstructed  # noqa: B018
    with pytest.raises(AssertionError, match="only available inside an actor"):
        ray.get(in_a_task.remote(), timeout=GET_TIMEOUT)


def test_kill_with_restart_right_after_creation_restarts_it(ray):
    """``ray.kill(a, no_restart=False)`` before the actor is even placed: it restarts and
    later calls run on the restarted actor. Compared with Ray 2.60: ``(True, True)``."""

    @ray.remote(max_restarts=1)
    class Restartable:
        def __init__(self):
            self.at_init = miniray.get_runtime_context().was_current_actor_reconstructed

        def state(self):
            return self.at_init, miniray.get_runtime_context().was_current_actor_reconstructed

    actor = Restartable.remote()
    ray.kill(actor, no_restart=False)
    assert ray.get(actor.state.remote(), timeout=GET_TIMEOUT) == (True, True)
    assert ray.get(actor.state.remote(), timeout=GET_TIMEOUT) == (True, True)


def test_kill_with_restart_of_an_actor_waiting_for_room_is_one_of_its_restarts(ray_start):
    """An actor still waiting for a CPU, killed with ``no_restart=False``: with a restart
    left it is created once room comes (the kill used the restart); with none it is dead;
    ``no_restart=True`` kills it. Compared with Ray 2.60 (its test_actor_killing): ``ok``,
    ``ActorDiedError``, ``ActorDiedError``."""
    ray_start(num_cpus=1)

    @miniray.remote(num_cpus=1)
    class Actor:
        def foo(self):
            return "ok", miniray.get_runtime_context().was_current_actor_reconstructed

    blocker = Actor.remote()
    miniray.get(blocker.foo.remote(), timeout=GET_TIMEOUT)  # holds the only CPU
    waiting = [Actor.options(max_restarts=1).remote(), Actor.options(max_restarts=0).remote(),
               Actor.options(max_restarts=1).remote()]
    for actor, no_restart in zip(waiting, (False, False, True)):
        miniray.kill(actor, no_restart=no_restart)
    miniray.kill(blocker)
    assert miniray.get(waiting[0].foo.remote(), timeout=GET_TIMEOUT) == ("ok", True)
    for actor in waiting[1:]:
        with pytest.raises(miniray.exceptions.ActorDiedError, match="killed by `ray.kill`"):
            miniray.get(actor.foo.remote(), timeout=GET_TIMEOUT)


def test_async_init_is_awaited_before_any_call(ray):
    """``async def __init__`` of an async actor is awaited on the actor's loop before any
    call, and its error is the constructor's error. Compared with Ray 2.60: 5 and 6 (miniray
    never awaited it: state missing, a "never awaited" warning)."""

    @ray.remote
    class AsyncInit:
        async def __init__(self, value):
            await asyncio.sleep(0.05)
            self.value = value
            self.loop = asyncio.get_running_loop()

        async def get(self):
            return self.value, asyncio.get_running_loop() is self.loop

    @ray.remote
    class AsyncInitSyncMethods:  # the async __init__ alone makes it an async actor, as in Ray
        async def __init__(self):
            self.value = 6

        def get(self):
            return self.value

    @ray.remote
    class AsyncInitFails:
        async def __init__(self):
            await asyncio.sleep(0)
            raise ValueError("async constructor failed")

        async def get(self):
            return "never"

    assert ray.get(AsyncInit.remote(5).get.remote(), timeout=GET_TIMEOUT) == (5, True)
    assert ray.get(AsyncInitSyncMethods.remote().get.remote(), timeout=GET_TIMEOUT) == 6
    error = _assert_dead(ray, AsyncInitFails.remote().get.remote(), "async constructor failed")
    assert error.actor_init_failed


# ----------------------------------------------------------------------------- method lookup
def test_an_instance_attribute_does_not_hide_a_method_of_the_same_name(ray):
    """``self.flag = False`` beside ``def flag``: the handle calls the method. Compared with
    Ray 2.60, which answers "method" (miniray called the bool before)."""

    @ray.remote
    class Shadowed:
        def __init__(self):
            self.flag = False

        def flag(self):
            return "method", self.__dict__["flag"]

    actor = Shadowed.remote()
    assert ray.get(actor.flag.remote(), timeout=GET_TIMEOUT) == ("method", False)


def test_static_and_class_methods_are_called_through_a_handle(ray):
    """Compared with Ray 2.60: both run in the actor, and a call that does not fit their
    signature fails at ``.remote()`` with TypeError (Ray: "too many positional arguments",
    "missing a required argument: 'x'")."""

    @ray.remote
    class Tools:
        @staticmethod
        def static(x):
            return "static", x, os.getpid()

        @classmethod
        def klass(cls, x):
            return "class", cls.__name__, x

        def pid(self):
            return os.getpid()

    actor = Tools.remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    assert ray.get(actor.static.remote(1), timeout=GET_TIMEOUT) == ("static", 1, pid)
    assert ray.get(actor.klass.remote(2), timeout=GET_TIMEOUT) == ("class", "Tools", 2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        actor.static.remote(1, 2)
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        actor.klass.remote()


# ----------------------------------------------------------------------------- how an actor ends
@pytest.fixture
def Ending(ray, tmp_path):
    """An actor that writes to ``<tmp_path>/<tag>`` from its ``__ray_shutdown__`` and from an
    ``atexit`` handler, so a test sees which ran, in which order."""
    import atexit
    import sys

    folder = str(tmp_path)

    @ray.remote
    class Ending:
        def __init__(self, tag):
            self.path = os.path.join(folder, tag)
            atexit.register(self._write, "atexit")

        def _write(self, what):
            with open(self.path, "a") as log:
                log.write(what + "\n")

        def __ray_shutdown__(self):
            self._write("shutdown")

        def pid(self):
            return os.getpid()

        def leave(self):
            miniray.actor.exit_actor()
            return "unreachable"

        def sys_exit(self, code=None):
            sys.exit(code)

    def log(tag):
        path = os.path.join(folder, tag)
        return open(path).read().split() if os.path.exists(path) else []

    Ending.log = log
    return Ending


def _assert_dead(ray, ref, *texts):
    with pytest.raises(exceptions.ActorDiedError) as info:
        ray.get(ref, timeout=GET_TIMEOUT)
    for text in texts:
        assert text in str(info.value), str(info.value)
    return info.value


def test_exit_actor_fails_its_own_call_and_runs_shutdown_then_atexit(ray, Ending):
    """Compared with Ray 2.60: the call that ran ``exit_actor()`` raises ``ActorDiedError``
    (miniray returned None), the call queued behind it and later calls too; the actor's
    ``__ray_shutdown__`` runs, then its ``atexit`` handlers; it never restarts."""
    actor = Ending.options(max_restarts=1).remote("exit")
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    leaving, queued = actor.leave.remote(), actor.pid.remote()
    error = _assert_dead(ray, leaving, "exited intentionally")
    assert not error.actor_init_failed
    _assert_dead(ray, queued, "exited intentionally")
    _assert_dead(ray, actor.pid.remote(), "exited intentionally")
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)
    assert Ending.log("exit") == ["shutdown", "atexit"]


def test_ray_terminate_fails_its_own_call_and_runs_shutdown_then_atexit(ray, Ending):
    """Compared with Ray 2.60: ``get(a.__ray_terminate__.remote())`` raises ``ActorDiedError``
    (miniray returned None) after the calls queued before it ran; the hooks run."""
    actor = Ending.remote("terminate")
    before = actor.pid.remote()
    done = actor.__ray_terminate__.remote()
    pid = ray.get(before, timeout=GET_TIMEOUT)
    _assert_dead(ray, done, "exited intentionally")
    _assert_dead(ray, actor.pid.remote())
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)
    assert Ending.log("terminate") == ["shutdown", "atexit"]


@pytest.mark.parametrize("code", [None, 3])
def test_sys_exit_in_a_method_runs_shutdown_then_atexit(ray, Ending, code):
    """Compared with Ray 2.60: the call and later ones raise ``ActorDiedError`` naming the
    exit code, and ``__ray_shutdown__`` then the ``atexit`` handlers run (miniray ran
    neither)."""
    actor = Ending.remote("sys_exit")
    ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    status = 0 if code is None else code
    _assert_dead(ray, actor.sys_exit.remote(code), f"exited with code {status}")
    _assert_dead(ray, actor.pid.remote(), f"exited with code {status}")
    assert Ending.log("sys_exit") == ["shutdown", "atexit"]


@pytest.mark.parametrize("code, restarts", [(0, False), (False, False), (None, True),
                                           (3, True), ("text", True)])
def test_sys_exit_zero_is_an_intended_exit_other_codes_restart(ray, Ending, code, restarts):
    """Compared with Ray 2.60 (``max_restarts=1``): ``sys.exit(0)`` and ``sys.exit(False)``
    are intended exits: ``ActorDiedError`` for the call and later ones, no restart (miniray
    restarted). ``sys.exit()``, ``sys.exit(3)``, ``sys.exit("text")`` are crashes: the call
    gets ``ActorUnavailableError`` and the restarted actor answers. The hooks run in both."""
    actor = Ending.options(max_restarts=1).remote("sys_exit")
    first = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    if restarts:
        with pytest.raises(exceptions.ActorUnavailableError):
            ray.get(actor.sys_exit.remote(code), timeout=GET_TIMEOUT)
        assert ray.get(actor.pid.remote(), timeout=GET_TIMEOUT) != first
    else:
        error = _assert_dead(ray, actor.sys_exit.remote(code), "exited intentionally",
                             f"sys.exit({code!r}) was called in Ending.sys_exit")
        assert not error.actor_init_failed
        _assert_dead(ray, actor.pid.remote(), "exited intentionally")
    assert wait_until(lambda: Ending.log("sys_exit")[:2] == ["shutdown", "atexit"], timeout=10)


def test_exit_in_a_constructor_is_an_intended_exit(ray, tmp_path):
    """``exit_actor()`` or ``sys.exit(0)`` in ``__init__`` (also an ``async def`` one):
    compared with Ray 2.60, calls raise ``ActorDiedError`` with ``actor_init_failed`` False
    (not a creation error; miniray reported one for ``exit_actor()``, and hung on the async
    one), the hooks run, and there is no restart."""
    import atexit
    import sys

    log = str(tmp_path / "log")

    @ray.remote(max_restarts=1)
    class LeavesAtOnce:
        def __init__(self, how):
            atexit.register(lambda: open(log, "a").write(f"atexit {how}\n"))
            if how == "exit_actor":
                miniray.actor.exit_actor()
            sys.exit(0)

        def __ray_shutdown__(self):
            open(log, "a").write("shutdown\n")

        def get(self):
            return "never"

    @ray.remote
    class LeavesAtOnceAsync:
        async def __init__(self):
            await asyncio.sleep(0)
            miniray.actor.exit_actor()

        async def get(self):
            return "never"

    for how, text in (("exit_actor", "exit_actor() was called in LeavesAtOnce.__init__"),
                      ("sys_exit", "sys.exit(0) was called in LeavesAtOnce.__init__")):
        actor = LeavesAtOnce.remote(how)
        error = _assert_dead(ray, actor.get.remote(), text)
        assert not error.actor_init_failed
        _assert_dead(ray, actor.get.remote(), text)
    assert open(log).read().split("\n") == [
        "shutdown", "atexit exit_actor", "shutdown", "atexit sys_exit", ""]
    error = _assert_dead(ray, LeavesAtOnceAsync.remote().get.remote(),
                         "exit_actor() was called in LeavesAtOnceAsync.__init__")
    assert not error.actor_init_failed


@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_exit_actor_lets_running_calls_finish(ray, kind):
    """With threads or asyncio, the calls running when ``exit_actor()`` is called finish
    with their values before the actor exits; the exiting call raises ``ActorDiedError``.
    Compared with Ray 2.60 (and its ``exit_actor`` document); miniray cut them off."""

    @ray.remote(max_concurrency=3)
    class Threaded:
        def slow(self):
            time.sleep(1.0)
            return "slow done"

        def leave(self):
            time.sleep(0.2)
            miniray.actor.exit_actor()

    @ray.remote
    class Async:
        async def slow(self):
            await asyncio.sleep(1.0)
            return "slow done"

        async def leave(self):
            await asyncio.sleep(0.2)
            miniray.actor.exit_actor()

    actor = (Threaded if kind == "threaded" else Async).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    slow, leave = actor.slow.remote(), actor.leave.remote()
    _assert_dead(ray, leave, "exit_actor() was called")
    assert ray.get(slow, timeout=GET_TIMEOUT) == "slow done"
    _assert_dead(ray, actor.slow.remote(), "exit_actor() was called")


def test_the_last_handle_dropped_runs_shutdown_then_atexit(ray, Ending):
    """Compared with Ray 2.60: an actor whose handles are all gone ends gracefully, running
    ``__ray_shutdown__`` and its ``atexit`` handlers (miniray ran neither)."""
    actor = Ending.remote("dropped")
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    del actor
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)
    assert Ending.log("dropped") == ["shutdown", "atexit"]


def test_kill_and_shutdown_run_neither_hook(ray, Ending):
    """Compared with Ray 2.60 (and its documents): ``ray.kill`` ends the actor at once,
    without ``__ray_shutdown__`` or ``atexit``; so does ``shutdown()`` for actors still
    alive."""
    killed, alive = Ending.remote("killed"), Ending.remote("alive")
    pids = ray.get([killed.pid.remote(), alive.pid.remote()], timeout=GET_TIMEOUT)
    ray.kill(killed)
    _assert_dead(ray, killed.pid.remote(), "killed by `ray.kill`")
    assert wait_until(lambda: not procinfo.is_alive(pids[0]), timeout=10)
    miniray.shutdown()
    assert wait_until(lambda: not procinfo.is_alive(pids[1]), timeout=10)
    time.sleep(0.2)
    assert Ending.log("killed") == [] and Ending.log("alive") == []


def test_a_failing_or_async_ray_shutdown_does_not_stop_the_exit(ray, tmp_path, capfd):
    """A ``__ray_shutdown__`` that raises: the error is printed and the actor still exits
    (compared with Ray 2.60, which prints "Error during actor __ray_shutdown__ method").
    An ``async def __ray_shutdown__`` is awaited (Ray 2.60 never awaits it: a documented
    difference)."""
    done = str(tmp_path / "awaited")

    @ray.remote
    class Failing:
        def __ray_shutdown__(self):
            raise ValueError("broken cleanup")

        def leave(self):
            miniray.actor.exit_actor()

    @ray.remote
    class Awaiting:
        async def __ray_shutdown__(self):
            await asyncio.sleep(0.01)
            open(done, "w").close()

        async def leave(self):
            miniray.actor.exit_actor()

    _assert_dead(ray, Failing.remote().leave.remote(), "exited intentionally")
    _assert_dead(ray, Awaiting.remote().leave.remote(), "exited intentionally")
    assert wait_until(lambda: os.path.exists(done), timeout=10)
    seen = []
    assert wait_until(lambda: seen.append(capfd.readouterr().err)
                      or "broken cleanup" in "".join(seen), timeout=10)
    assert "Error during actor __ray_shutdown__ method" in "".join(seen)
