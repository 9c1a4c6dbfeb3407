"""Task failures: application errors, (un)pickling failures, worker crashes, retries.

The failure matrix of house style habit 11 (tasks only: actors are not implemented yet).
Ray 2.60 behaviour: ray-api-surface.md §2.8 (failures and retries), §3.1 (errors from get),
§5 (the RayTaskError dual class).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import pytest

import miniray
from miniray import exceptions

GET_TIMEOUT = 30


def _attempts(path) -> int:
    try:
        with open(path) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


# ----------------------------------------------------------------------------- app errors
def test_task_value_error_is_catchable_as_value_error(ray):
    @ray.remote
    def boom():
        raise ValueError("bad thing")

    with pytest.raises(ValueError) as info:
        ray.get(boom.remote(), timeout=GET_TIMEOUT)
    error = info.value
    assert isinstance(error, exceptions.RayTaskError)
    assert isinstance(error, exceptions.RayError)
    assert type(error).__name__ == "RayTaskError(ValueError)"
    assert [c.__name__ for c in type(error).__mro__[:5]] == [
        "RayTaskError(ValueError)",
        "RayTaskError",
        "RayError",
        "ValueError",
        "Exception",
    ]
    assert isinstance(error.cause, ValueError) and error.cause.args == ("bad thing",)
    text = str(error)
    assert "boom" in text
    assert 'raise ValueError("bad thing")' in text
    assert "ValueError: bad thing" in text
    assert f"pid={error.pid}" in text or "pid=" in text


def test_task_error_header_is_ray_task_name(ray):
    # Regression: the header used to name the module-qualified function.
    @ray.remote
    def boom():
        raise ValueError("bad thing")

    with pytest.raises(ValueError) as info:
        ray.get(boom.remote(), timeout=GET_TIMEOUT)
    assert str(info.value).startswith("ray::boom() (pid=")


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("k"),
        TypeError("t"),
        ZeroDivisionError("z"),
        RuntimeError("r"),
        AssertionError("a"),
        OSError(2, "no such file"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_task_errors_keep_their_type(ray, exc):
    @ray.remote(max_retries=0)
    def raise_it(error):
        raise error

    with pytest.raises(type(exc)) as info:
        ray.get(raise_it.remote(exc), timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.RayTaskError)
    assert type(info.value.cause) is type(exc)


def test_custom_exception_class_with_required_args(ray):
    class Custom(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)
            self.a, self.b = a, b

    @ray.remote
    def raise_custom():
        raise Custom(1, b="two")

    with pytest.raises(Custom) as info:
        ray.get(raise_custom.remote(), timeout=GET_TIMEOUT)
    assert (info.value.a, info.value.b) == (1, "two")  # attributes fall through to the cause


def test_get_raises_first_error_without_waiting_for_slow(ray):
    # slow never ends by itself: a get that waited for it would raise GetTimeoutError, not
    # the error (no bound on the seconds it took: a loaded runner may take any).
    @ray.remote(max_retries=0)
    def slow():
        time.sleep(600)

    @ray.remote(max_retries=0)
    def fail():
        raise IndexError("fast failure")

    slow_ref = slow.remote()
    with pytest.raises(IndexError):
        ray.get([slow_ref, fail.remote()], timeout=GET_TIMEOUT)
    assert ray.wait([slow_ref], timeout=0) == ([], [slow_ref])  # still running
    ray.cancel(slow_ref, force=True)


def test_error_propagates_through_dependent_task(ray):
    @ray.remote
    def fail():
        raise KeyError("upstream")

    @ray.remote
    def use(x):
        return x

    with pytest.raises(KeyError) as info:
        ray.get(use.remote(fail.remote()), timeout=GET_TIMEOUT)
    assert "upstream" in str(info.value)


class UpstreamError(Exception):
    pass


INPUTS_FAILED = "  At least one of the input arguments for this task could not be computed:"


def test_failed_argument_is_the_dependent_calls_error_with_rays_wording(ray):
    """A call whose argument failed raises its own RayTaskError at ``get``: the header names
    the call, then Ray's line, then the argument's error; ``cause`` is the user's exception
    at every level, so ``except UpstreamError`` catches it. Compared with Ray 2.60 for a task,
    a keyword argument, an actor method and two levels of chaining: the same lines (Ray's
    header names the worker's pid and the actor's repr where miniray names the driver's pid)
    and the same type ``RayTaskError(UpstreamError)``."""

    @ray.remote
    def fail():
        raise UpstreamError("boom")

    @ray.remote
    def use(x):
        return x

    @ray.remote
    class Holder:
        def take(self, x):
            return x

    def error_of(ref):
        with pytest.raises(UpstreamError) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        error = info.value
        assert isinstance(error, exceptions.RayTaskError)
        assert type(error).__name__ == "RayTaskError(UpstreamError)"
        assert type(error.cause) is UpstreamError and str(error.cause) == "boom"
        return str(error).splitlines()

    upstream = ["ray::fail() (pid=", '  File "', '    raise UpstreamError("boom")',
                f"{UpstreamError.__module__}.UpstreamError: boom"]

    def check(lines, *headers):
        shown = "miniray.exceptions.RayTaskError: "
        expected = []
        for index, header in enumerate(headers):
            expected += [(shown if index else "") + f"ray::{header}() (pid=", INPUTS_FAILED]
        expected += [shown + upstream[0]] + upstream[1:]
        assert len(lines) == len(expected), lines
        for line, start in zip(lines, expected):
            assert line.startswith(start), (line, start, lines)

    failed = fail.remote()
    check(error_of(use.remote(failed)), "use")
    check(error_of(use.remote(x=failed)), "use")
    check(error_of(use.remote(use.remote(failed))), "use", "use")
    holder = Holder.remote()
    check(error_of(holder.take.remote(failed)), "Holder.take")
    check(error_of(holder.take.remote(use.remote(failed))), "Holder.take", "use")
    ray.kill(holder)


def test_failed_constructor_argument_kills_the_actor_with_rays_wording(ray):
    """An actor whose constructor argument failed dies: ActorDiedError naming the creation
    task ``ray::Holder.__init__()``, Ray's line, then the argument's error (compared with
    Ray 2.60)."""

    @ray.remote
    def fail():
        raise UpstreamError("boom")

    @ray.remote
    class Holder:
        def __init__(self, x):
            self.x = x

        def ping(self):
            return 1

    holder = Holder.remote(fail.remote())
    with pytest.raises(exceptions.ActorDiedError) as info:
        ray.get(holder.ping.remote(), timeout=GET_TIMEOUT)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("The actor died because of an error raised in its creation "
                               "task, ray::Holder.__init__() (pid=")
    assert lines[1] == INPUTS_FAILED
    assert lines[2].startswith("miniray.exceptions.RayTaskError: ray::fail() (pid=")
    assert lines[-1] == f"{UpstreamError.__module__}.UpstreamError: boom"


def test_failed_system_error_argument_is_named_by_its_type(ray):
    """An argument that holds a system error (here a crashed worker) gives Ray's line then
    ``miniray.exceptions.WorkerCrashedError: ...``; the dependent call raises
    ``RayTaskError(WorkerCrashedError)``. Compared with Ray 2.60."""

    @ray.remote(max_retries=0)
    def crash():
        os._exit(3)

    @ray.remote
    def use(x):
        return x

    with pytest.raises(exceptions.WorkerCrashedError) as info:
        ray.get(use.remote(crash.remote()), timeout=GET_TIMEOUT)
    assert type(info.value).__name__ == "RayTaskError(WorkerCrashedError)"
    lines = str(info.value).splitlines()
    assert lines[0].startswith("ray::use() (pid=")
    assert lines[1] == INPUTS_FAILED
    assert lines[2].startswith("miniray.exceptions.WorkerCrashedError: The worker died ")


def test_error_in_nested_task_reaches_parent_and_driver(ray):
    @ray.remote(max_retries=0)
    def child():
        raise ValueError("from child")

    @ray.remote(max_retries=0)
    def parent():
        import miniray as inner

        try:
            inner.get(child.remote(), timeout=30)
        except ValueError as error:
            return "caught: " + type(error).__name__

    assert ray.get(parent.remote(), timeout=GET_TIMEOUT) == "caught: RayTaskError(ValueError)"


# ----------------------------------------------------------------------------- pickling
def test_unpicklable_argument_raises_type_error_at_remote(ray):
    @ray.remote
    def use(x):
        return 1

    stats_before = miniray._private.runtime.current().owner.statistics()
    with pytest.raises(TypeError) as info:
        use.remote(threading.Lock())
    assert "lock" in str(info.value).lower()
    with pytest.raises(TypeError):
        use.remote(x=threading.Lock())
    stats_after = miniray._private.runtime.current().owner.statistics()
    assert stats_after["tasks_pending"] == stats_before["tasks_pending"] == 0
    assert stats_after["queued"] == 0
    assert ray.get(use.remote(1), timeout=GET_TIMEOUT) == 1


def test_unpicklable_closure_raises_type_error_at_remote(ray):
    lock = threading.Lock()

    @ray.remote
    def uses_lock():
        with lock:
            return 1

    with pytest.raises(TypeError):
        uses_lock.remote()
    assert ray.get(ray.remote(lambda: 2).remote(), timeout=GET_TIMEOUT) == 2


def test_unpicklable_put_raises_type_error(ray):
    with pytest.raises(TypeError):
        ray.put(threading.Lock())


def test_unpicklable_return_value_is_a_task_error(ray):
    @ray.remote(max_retries=0)
    def give_lock():
        return threading.Lock()

    with pytest.raises(exceptions.RayTaskError) as info:
        ray.get(give_lock.remote(), timeout=GET_TIMEOUT)
    assert "pickle" in str(info.value).lower() or "serializ" in str(info.value).lower()
    # The worker survives and runs the next task.
    assert ray.get(ray.remote(lambda: 3).remote(), timeout=GET_TIMEOUT) == 3


def test_unpicklable_return_value_message_says_serialize(ray):
    # Regression: this used to be cloudpickle's bare TypeError with its internal frames.
    @ray.remote(max_retries=0)
    def give_lock():
        return threading.Lock()

    with pytest.raises(exceptions.RayTaskError) as info:
        ray.get(give_lock.remote(), timeout=GET_TIMEOUT)
    text = str(info.value)
    assert "serialize" in text.lower() and "give_lock" in text
    assert "cloudpickle" not in text


class _HoldsLock(Exception):
    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


class _KeywordOnly(Exception):
    def __init__(self, code, *, detail):  # pickle rebuilds it as _KeywordOnly(code): fails
        super().__init__(code)
        self.detail = detail


@pytest.mark.parametrize(
    "make",
    [_HoldsLock, lambda: _KeywordOnly(7, detail="holds a lock")],
    ids=["fails-to-pickle", "fails-to-unpickle"],
)
def test_exception_that_cannot_travel_is_replaced_by_a_description(ray, make):
    @ray.remote(max_retries=0)
    def raise_it(factory):
        raise factory()

    with pytest.raises(exceptions.RayError) as info:
        ray.get(raise_it.remote(make), timeout=GET_TIMEOUT)
    assert "raise_it" in str(info.value)
    assert "holds a lock" in str(info.value) or "7" in str(info.value)
    # The worker survives.
    assert ray.get(ray.remote(lambda: 3).remote(), timeout=GET_TIMEOUT) == 3


def test_argument_that_fails_to_unpickle_in_the_worker(ray):
    class FailsOnLoad:
        def __reduce__(self):
            return (_raise_on_load, ("cannot rebuild",))

    @ray.remote(max_retries=0)
    def use(x):
        return 1

    with pytest.raises(exceptions.RayError) as info:
        ray.get(use.remote(FailsOnLoad()), timeout=GET_TIMEOUT)
    assert "cannot rebuild" in str(info.value)
    assert ray.get(use.remote(1), timeout=GET_TIMEOUT) == 1


def _raise_on_load(message):
    raise RuntimeError(message)


# ----------------------------------------------------------------------------- crashes
def _exit_3():
    os._exit(3)


def _sigkill_self():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize(
    "crash, texts",
    [(_exit_3, ["exit", "3"]), (_sigkill_self, ["signal", "SIGKILL"])],
    ids=["os._exit(3)", "SIGKILL"],
)
def test_worker_crash_without_retries_raises_worker_crashed_error(ray, crash, texts):
    @ray.remote(max_retries=0)
    def crashing(fn):
        fn()

    with pytest.raises(exceptions.WorkerCrashedError) as info:
        ray.get(crashing.remote(crash), timeout=GET_TIMEOUT)
    assert not isinstance(info.value, exceptions.RayTaskError)
    message = str(info.value)
    assert message.startswith("The worker died unexpectedly while executing this task.")
    for text in texts:
        assert text in message
    # The session keeps working with a new worker.
    assert ray.get(ray.remote(lambda: "ok").remote(), timeout=GET_TIMEOUT) == "ok"


def test_worker_crashed_message_does_not_repeat_itself(ray):
    # Regression: the first sentence used to appear twice.
    @ray.remote(max_retries=0)
    def crashing():
        os._exit(3)

    with pytest.raises(exceptions.WorkerCrashedError) as info:
        ray.get(crashing.remote(), timeout=GET_TIMEOUT)
    assert str(info.value).count("The worker died unexpectedly") == 1


def test_crash_on_first_attempt_is_retried(ray, tmp_path):
    log = str(tmp_path / "attempts")

    @ray.remote(max_retries=2)
    def flaky(path):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        if _attempts(path) == 1:
            os._exit(1)
        return "recovered"

    assert ray.get(flaky.remote(log), timeout=GET_TIMEOUT) == "recovered"
    pids = open(log).read().split()
    assert len(pids) == 2 and pids[0] != pids[1]


def test_each_retry_prints_rays_line_counting_the_retries_before_it(ray, tmp_path, caplog):
    """Ray 2.60 prints, for each retry, "Task f failed. There are N retries remaining, so the
    task will be retried. Error: ..." where N counts the retry being made (a crash or a
    retried exception alike; checked with the same tasks, max_retries=2). miniray said 0 for
    the last retry and left the error out."""
    log = str(tmp_path / "attempts")

    @ray.remote(max_retries=2)
    def crash_twice(path):
        with open(path, "a") as f:
            f.write("x\n")
        if _attempts(path) <= 2:
            os._exit(3)
        return "third"

    @ray.remote(max_retries=2, retry_exceptions=True)
    def raise_twice(path):
        with open(path, "a") as f:
            f.write("x\n")
        if _attempts(path) <= 2:
            raise ValueError(f"attempt {_attempts(path)}")
        return "third"

    with caplog.at_level("WARNING"):
        assert ray.get(crash_twice.remote(log), timeout=GET_TIMEOUT) == "third"
        os.remove(log)
        assert ray.get(raise_twice.remote(log), timeout=GET_TIMEOUT) == "third"
    lines = [r.getMessage() for r in caplog.records if "retries remaining" in r.getMessage()]
    assert len(lines) == 4, lines
    for line, name, left in zip(lines, ["crash_twice"] * 2 + ["raise_twice"] * 2, [2, 1] * 2):
        assert line.startswith(f"Task {name} failed. There are {left} retries remaining, so "
                               "the task will be retried. Error: "), line
    assert "exited with code 3" in lines[0]
    assert lines[2].endswith("ValueError: attempt 1") and "User exception:" in lines[2]
    assert lines[3].endswith("ValueError: attempt 2")


def test_default_max_retries_is_three(ray, tmp_path):
    log = str(tmp_path / "attempts")

    @ray.remote
    def always_crash(path):
        with open(path, "a") as f:
            f.write("x\n")
        os._exit(1)

    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(always_crash.remote(log), timeout=60)
    assert _attempts(log) == 4  # the first attempt and 3 retries


def test_infinite_retries_until_success(ray, tmp_path):
    log = str(tmp_path / "attempts")

    @ray.remote(max_retries=-1)
    def crash_five_times(path):
        with open(path, "a") as f:
            f.write("x\n")
        if _attempts(path) <= 5:
            os._exit(1)
        return "done"

    assert ray.get(crash_five_times.remote(log), timeout=60) == "done"
    assert _attempts(log) == 6


def test_tasks_queued_behind_a_crash_still_run(ray):
    @ray.remote(max_retries=0, num_cpus=2)
    def crash():
        time.sleep(0.2)
        os._exit(1)

    @ray.remote(num_cpus=2)
    def after(i):
        return i

    crashed = crash.remote()
    rest = [after.remote(i) for i in range(4)]
    assert ray.get(rest, timeout=GET_TIMEOUT) == [0, 1, 2, 3]
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(crashed, timeout=GET_TIMEOUT)


# ----------------------------------------------------------------------------- retry_exceptions
def _attempts_failing(ray, tmp_path, error: Exception, **options) -> int:
    """A task (``options``) that notes each attempt in a file and always raises ``error``:
    its ``get`` raises that error's type; returns how many attempts ran."""
    log = str(tmp_path / "attempts")

    @ray.remote(**options)
    def fail(path):
        with open(path, "a") as f:
            f.write("x\n")
        raise error

    with pytest.raises(type(error)):
        ray.get(fail.remote(log), timeout=GET_TIMEOUT)
    return _attempts(log)


def test_application_errors_are_not_retried_by_default(ray, tmp_path):
    assert _attempts_failing(ray, tmp_path, ValueError("no retry"), max_retries=3) == 1


@pytest.mark.parametrize(
    "retry_exceptions", [True, [ValueError], (KeyError, ValueError)], ids=["True", "list", "tuple"]
)
def test_retry_exceptions_retries_application_errors(ray, tmp_path, retry_exceptions):
    log = str(tmp_path / "attempts")

    @ray.remote(max_retries=2, retry_exceptions=retry_exceptions)
    def flaky(path):
        with open(path, "a") as f:
            f.write("x\n")
        if _attempts(path) == 1:
            raise ValueError("first attempt fails")
        return "second attempt"

    assert ray.get(flaky.remote(log), timeout=GET_TIMEOUT) == "second attempt"
    assert _attempts(log) == 2


def test_retry_exceptions_allow_list_does_not_retry_other_errors(ray, tmp_path):
    assert _attempts_failing(ray, tmp_path, TypeError("not on the list"), max_retries=2,
                             retry_exceptions=[ValueError]) == 1


def test_retry_exceptions_gives_up_after_max_retries(ray, tmp_path):
    assert _attempts_failing(ray, tmp_path, ValueError("always"), max_retries=2,
                             retry_exceptions=True) == 3


def test_retry_exceptions_with_options(ray, tmp_path):
    log = str(tmp_path / "attempts")

    @ray.remote
    def flaky(path):
        with open(path, "a") as f:
            f.write("x\n")
        if _attempts(path) == 1:
            raise ValueError("first attempt fails")
        return "ok"

    ref = flaky.options(max_retries=1, retry_exceptions=True).remote(log)
    assert ray.get(ref, timeout=GET_TIMEOUT) == "ok"


# ----------------------------------------------------------------------------- pickling errors
def _collect_errors(ray, tmp_path) -> list[BaseException]:
    errors = []

    @ray.remote(max_retries=0)
    def value_error():
        raise ValueError("v")

    @ray.remote(max_retries=0)
    def crash():
        os._exit(4)

    @ray.remote(max_retries=0)
    def sleep(t):
        time.sleep(t)

    @ray.remote(max_retries=0)
    def busy(path):
        open(path, "w").close()
        end = time.time() + 20
        while time.time() < end:
            pass

    class CustomError(Exception):
        def __init__(self, code, detail):
            super().__init__(code, detail)
            self.code, self.detail = code, detail

    @ray.remote(max_retries=0)
    def custom():
        raise CustomError(7, detail="d")

    def capture(ref, timeout=GET_TIMEOUT):
        try:
            ray.get(ref, timeout=timeout)
        except Exception as error:
            errors.append(error)
        else:
            pytest.fail("expected an error")

    capture(value_error.remote())
    capture(custom.remote())
    capture(crash.remote())
    slow = sleep.remote(5)
    capture(slow, timeout=0.01)
    ray.cancel(slow, force=True)
    capture(slow)
    started = str(tmp_path / "busy-started")
    running = busy.remote(started)
    deadline = time.monotonic() + GET_TIMEOUT
    while not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.01)
    ray.cancel(running)
    capture(running)
    return errors


def test_every_error_from_get_survives_pickling(ray, tmp_path):
    errors = _collect_errors(ray, tmp_path)
    names = [type(e).__name__ for e in errors]
    assert names == [
        "RayTaskError(ValueError)",
        "RayTaskError(CustomError)",
        "WorkerCrashedError",
        "GetTimeoutError",
        "TaskCancelledError",
        "RayTaskError(TaskCancelledError)",
    ]
    for error in errors:
        # A class defined inside a function (CustomError) only pickles by value (cloudpickle).
        local = type(getattr(error, "cause", None)).__qualname__.count("<locals>")
        dumps_ = miniray._private.core.serialization.dumps
        for dumps in [dumps_] + ([] if local else [pickle.dumps]):
            copy = pickle.loads(dumps(error))
            assert type(copy).__name__ == type(error).__name__
            assert str(copy) == str(error)
            for base in type(error).__mro__:
                if base.__module__ in ("builtins", "miniray.exceptions") and base is not object:
                    if base.__name__.startswith("RayTaskError("):
                        continue
                    assert isinstance(copy, base), (type(error), base)
    custom = pickle.loads(miniray._private.core.serialization.dumps(errors[1]))
    assert (custom.code, custom.detail) == (7, "d")


UNHANDLED = "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "


def _unhandled(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(UNHANDLED)]


def test_an_error_nobody_read_is_logged_when_freed_as_ray_logs_it(ray_start, caplog):
    """Ray 2.60, the same cases run there: a failed task whose ref was dropped unread (fire
    and forget; the second return of two) and an actor call's are logged once freed; one
    that was got, waited for, taken by another task as an argument, or cancelled is not,
    nor a call that failed because its actor was killed."""
    ray_start(num_cpus=2)

    @miniray.remote
    def fail(tag):
        raise ValueError(tag)

    @miniray.remote
    def passthrough(x):
        return x

    @miniray.remote
    def sleep():
        time.sleep(30)

    @miniray.remote
    class Failing:
        def fail(self, tag):
            raise KeyError(tag)

        def sleep(self):
            time.sleep(30)

    fail.remote("forgotten")
    with pytest.raises(ValueError):
        miniray.get(fail.options(num_returns=2).remote("second")[0], timeout=GET_TIMEOUT)
    Failing.remote().fail.remote("actor")
    with pytest.raises(ValueError):
        miniray.get(fail.remote("got"), timeout=GET_TIMEOUT)
    waited = fail.remote("waited")
    miniray.wait([waited], timeout=GET_TIMEOUT)
    del waited
    with pytest.raises(ValueError):
        miniray.get(passthrough.remote(fail.remote("argument")), timeout=GET_TIMEOUT)
    cancelled = sleep.remote()
    time.sleep(0.3)
    miniray.cancel(cancelled)
    with pytest.raises(exceptions.TaskCancelledError):
        miniray.get(cancelled, timeout=GET_TIMEOUT)
    cancelled_unread = sleep.remote()
    time.sleep(0.3)
    miniray.cancel(cancelled_unread)
    del cancelled_unread
    doomed = Failing.remote()
    doomed.sleep.remote()
    time.sleep(0.3)
    miniray.kill(doomed)
    wanted = {"ValueError: forgotten", "ValueError: second", "KeyError: 'actor'"}

    def seen():
        return {line for m in _unhandled(caplog) for line in m.splitlines()} & wanted

    deadline = time.monotonic() + GET_TIMEOUT
    while seen() != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # anything wrongly reported has come by now
    messages = _unhandled(caplog)
    assert seen() == wanted and len(messages) == 3, messages


def test_ray_ignore_unhandled_errors_silences_them(ray_start, caplog, monkeypatch):
    monkeypatch.setenv("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    ray_start(num_cpus=1)

    @miniray.remote
    def fail():
        raise ValueError("quiet")

    ref = fail.remote()
    miniray.wait([ref], timeout=GET_TIMEOUT)  # ready (and read: wait it below unread)
    unread = fail.remote()
    time.sleep(1.0)
    del unread, ref
    time.sleep(0.5)
    assert _unhandled(caplog) == []
