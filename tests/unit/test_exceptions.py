"""miniray.exceptions: Ray's hierarchy, the RayTaskError dual class, and pickling of every
exception (house-style habit 5). No processes."""

from __future__ import annotations

import builtins
import copy
import os
import pickle
import threading
import warnings

import cloudpickle
import pytest

import miniray.exceptions as ex
from miniray.exceptions import (
    ActorDiedError,
    GetTimeoutError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    TaskCancelledError,
    WorkerCrashedError,
)

# ---------------------------------------------------------------------------------------
# Hierarchy
# ---------------------------------------------------------------------------------------

# Direct bases of every public class, in order (Ray 2.60).
BASES = {
    "RayError": (Exception,),
    "RayTaskError": (RayError,),
    "RayActorError": (RayError,),
    "ActorDiedError": (RayActorError,),
    "ActorUnavailableError": (RayActorError,),
    "GetTimeoutError": (RayError, TimeoutError),
    "TaskCancelledError": (RayError,),
    "WorkerCrashedError": (RayError,),
    "LocalRayletDiedError": (RayError,),
    "NodeDiedError": (RayError,),
    "ObjectLostError": (RayError,),
    "OwnerDiedError": (ObjectLostError,),
    "ObjectFreedError": (ObjectLostError,),
    "ObjectFetchTimedOutError": (ObjectLostError,),
    "ObjectReconstructionFailedError": (ObjectLostError,),
    "ObjectReconstructionFailedMaxAttemptsExceededError": (ObjectLostError,),
    "ObjectReconstructionFailedLineageEvictedError": (ObjectLostError,),
    "ReferenceCountingAssertionError": (ObjectLostError, AssertionError),
    "ObjectStoreFullError": (RayError,),
    "OutOfDiskError": (RayError,),
    "OutOfMemoryError": (RayError,),
    "RaySystemError": (RayError,),
    "RayChannelError": (ex.RaySystemError,),
    "RayChannelTimeoutError": (ex.RayChannelError, TimeoutError),
    "RayCgraphCapacityExceeded": (ex.RaySystemError,),
    "RayDirectTransportError": (ex.RaySystemError,),
    "StreamingGeneratorReplayInconsistentError": (ex.RaySystemError,),
    "RuntimeEnvSetupError": (RayError,),
    "TaskUnschedulableError": (RayError,),
    "ActorUnschedulableError": (RayError,),
    "TaskPlacementGroupRemoved": (RayError,),
    "ActorPlacementGroupRemoved": (RayError,),
    "PendingCallsLimitExceeded": (RayError,),
    "ActorAlreadyExistsError": (ValueError, RayError),
    "ActorHandleNotFoundError": (ValueError, RayError),
    "AsyncioActorExit": (RayError,),
    "CrossLanguageError": (RayError,),
    "UnserializableException": (RayError,),
    "UserCodeException": (RayError,),
    "AuthenticationError": (RayError,),
    "RpcError": (RayError,),
    "PlasmaObjectNotAvailable": (RayError,),
    "ObjectRefStreamEndOfStreamError": (RayError,),
    "OufOfBandObjectRefSerializationException": (RayError,),
}


def test_all_lists_exactly_the_public_classes():
    assert sorted(ex.__all__) == sorted(BASES)
    assert len(ex.__all__) == len(set(ex.__all__))
    defined = {
        name
        for name, value in vars(ex).items()
        if isinstance(value, type) and issubclass(value, BaseException) and name[0] != "_"
    }
    assert defined == set(BASES)


@pytest.mark.parametrize("name", sorted(BASES))
def test_bases_and_module(name):
    cls = getattr(ex, name)
    assert cls.__bases__ == BASES[name]
    assert issubclass(cls, RayError)
    assert issubclass(cls, Exception)
    assert cls.__module__ == "miniray.exceptions"
    assert cls.__qualname__ == name


@pytest.mark.parametrize(
    "name, builtin",
    [
        ("GetTimeoutError", TimeoutError),
        ("RayChannelTimeoutError", TimeoutError),
        ("ReferenceCountingAssertionError", AssertionError),
        ("ActorAlreadyExistsError", ValueError),
        ("ActorHandleNotFoundError", ValueError),
    ],
)
def test_dual_builtin_bases_are_caught_by_builtin_except(name, builtin):
    cls = getattr(ex, name)
    assert issubclass(cls, builtin)


def test_get_timeout_error_is_a_timeout_error():
    with pytest.raises(TimeoutError):
        raise GetTimeoutError("Get timed out: some object(s) not ready.")
    assert str(GetTimeoutError("Get timed out: some object(s) not ready.")) == (
        "Get timed out: some object(s) not ready."
    )


# ---------------------------------------------------------------------------------------
# Constructors and messages
# ---------------------------------------------------------------------------------------


def test_task_cancelled_error_messages():
    assert str(TaskCancelledError()) == ""
    assert str(TaskCancelledError(None, None)) == ""
    assert str(TaskCancelledError("abc123")).startswith("Task: abc123 was cancelled. ")
    assert str(TaskCancelledError(task_id="abc", error_message="why")) == (
        "Task: abc was cancelled. why"
    )
    assert str(TaskCancelledError(error_message="only why")) == "only why"
    assert TaskCancelledError("abc").task_id == "abc"


def test_ray_actor_error_defaults_and_properties():
    e = RayActorError()
    assert e.actor_id is None
    assert str(e) == RayActorError.BASE_ERROR_MSG
    assert e.actor_init_failed is False
    assert e.preempted is False
    e = RayActorError(actor_id="ff01", error_msg="gone", actor_init_failed=True, preempted=True)
    assert (e.actor_id, str(e), e.actor_init_failed, e.preempted) == ("ff01", "gone", True, True)


def test_actor_died_error_default_message():
    e = ActorDiedError()
    assert str(e) == "The actor died unexpectedly before finishing this task."
    assert isinstance(e, RayActorError)
    assert e.actor_init_failed is False


def test_actor_died_error_from_failed_constructor():
    task_error = RayTaskError(
        "Counter.__init__",
        "Traceback (most recent call last):\nZeroDivisionError: division by zero",
        ZeroDivisionError("division by zero"),
        pid=11,
        actor_repr="<Counter>",
        actor_id="aa11",
    )
    e = ActorDiedError(task_error)
    assert e.actor_init_failed is True
    assert e.actor_id == "aa11"
    assert str(e).startswith(
        "The actor died because of an error raised in its creation task, ray::Counter.__init__()"
    )
    assert "ZeroDivisionError: division by zero" in str(e)
    assert ActorDiedError.from_task_error(task_error).actor_init_failed is True


def test_actor_died_error_carries_reason_verbatim():
    reason = "The actor is dead because it was killed by `ray.kill`."
    e = ActorDiedError(actor_id="ab", error_msg=reason, preempted=True)
    assert str(e) == reason
    assert e.actor_id == "ab" and e.preempted is True
    assert str(ActorDiedError("exited with code 3")) == "exited with code 3"
    with pytest.raises(TypeError):
        ActorDiedError(42)


def test_actor_died_error_from_context():
    e = ActorDiedError.from_context(
        "Counter",
        "ab12",
        pid=99,
        namespace="ns",
        ip="127.0.0.1",
        reason="The actor is dead because it was killed by `ray.kill`.",
    )
    assert str(e).split("\n") == [
        "The actor died unexpectedly before finishing this task.",
        "\tclass_name: Counter",
        "\tactor_id: ab12",
        "\tpid: 99",
        "\tnamespace: ns",
        "\tip: 127.0.0.1",
        "The actor is dead because it was killed by `ray.kill`.",
    ]
    assert e.actor_id == "ab12"
    assert str(e).endswith("The actor is dead because it was killed by `ray.kill`.")


def test_actor_unavailable_error_accepts_bytes_id():
    e = ex.ActorUnavailableError("restarting", b"\x01\x02")
    assert e.actor_id == "0102"
    assert "0102" in str(e) and "restarting" in str(e)


def test_worker_crashed_error_messages():
    first = "The worker died unexpectedly while executing this task."
    assert str(WorkerCrashedError()).startswith(first + " ")
    e = WorkerCrashedError("The worker (pid=7) was killed by signal 9 (SIGKILL).")
    assert str(e) == first + " The worker (pid=7) was killed by signal 9 (SIGKILL)."


def test_object_lost_error_fields_and_call_site():
    e = ObjectLostError("ab" * 28, None, "f at a.py:1 | g at b.py:2")
    assert e.object_ref_hex == "ab" * 28
    assert e.call_site == "f at a.py:1\n  g at b.py:2"
    assert str(e).startswith(f"Failed to retrieve object {'ab' * 28}.")
    for cls in (ex.OwnerDiedError, ex.ObjectFreedError, ex.ObjectFetchTimedOutError):
        assert str(cls("cd", None, "")).startswith("Failed to retrieve object cd.")


def test_messages_that_take_a_message():
    assert str(ex.OutOfMemoryError("worker 3 killed")) == "worker 3 killed"
    assert str(ex.NodeDiedError("node gone")) == "node gone"
    assert str(ex.ObjectStoreFullError("needed 10 MiB")).startswith("needed 10 MiB\n")
    assert str(ex.ObjectStoreFullError())  # a hint even without a message
    assert str(ex.RaySystemError("Ray has not been started yet.")) == (
        "System error: Ray has not been started yet."
    )
    assert str(ex.ActorAlreadyExistsError("name taken")) == "name taken"
    assert str(ex.RpcError("down", rpc_code=14)) == "down"


# ---------------------------------------------------------------------------------------
# RayTaskError and the dual class
# ---------------------------------------------------------------------------------------


class CustomError(Exception):
    def __init__(self, message, code):
        super().__init__(message, code)
        self.code = code


def _raise(exc):
    raise exc


def _task_error(exc, function_name="boom", **kwargs):
    try:
        _raise(exc)
    except BaseException as caught:  # noqa: BLE001
        return RayTaskError.from_exception(caught, function_name, **kwargs)
    raise AssertionError("unreachable")


def test_dual_class_mro_and_name():
    dual = _task_error(ValueError("bad thing")).as_instanceof_cause()
    assert type(dual).__name__ == "RayTaskError(ValueError)"
    assert type(dual).__qualname__ == "RayTaskError(ValueError)"
    assert type(dual).__module__ == "miniray.exceptions"
    assert [c.__name__ for c in type(dual).__mro__] == [
        "RayTaskError(ValueError)",
        "RayTaskError",
        "RayError",
        "ValueError",
        "Exception",
        "BaseException",
        "object",
    ]


@pytest.mark.parametrize("catch", [ValueError, RayTaskError, RayError, Exception])
def test_dual_class_is_caught_by(catch):
    dual = _task_error(ValueError("bad thing")).as_instanceof_cause()
    with pytest.raises(catch):
        raise dual


def test_dual_class_cause_args_and_attribute_fall_through():
    cause = CustomError("nope", 7)
    dual = _task_error(cause).as_instanceof_cause()
    assert isinstance(dual, CustomError)
    assert dual.cause is cause
    assert dual.args == (cause,)
    assert dual.code == 7  # falls through to the cause
    with pytest.raises(AttributeError):
        dual.no_such_attribute  # noqa: B018


def test_dual_class_is_cached_per_cause_class():
    a = _task_error(ValueError("a")).as_instanceof_cause()
    b = _task_error(ValueError("b")).as_instanceof_cause()
    c = _task_error(KeyError("c")).as_instanceof_cause()
    assert type(a) is type(b)
    assert type(a) is not type(c)
    assert str(a) != str(b)  # the message is per instance, not per class


def test_str_is_the_remote_traceback_with_header_and_no_colour():
    err = _task_error(ValueError("bad thing"), pid=6949, ip="10.0.0.5")
    text = str(err.as_instanceof_cause())
    lines = text.split("\n")
    assert lines[0] == "ray::boom() (pid=6949, ip=10.0.0.5)"
    assert lines[-1] == "ValueError: bad thing"
    assert any("in _raise" in line for line in lines)
    assert "Traceback (most recent call last)" not in text
    assert "\x1b" not in text
    assert str(err) == text


def test_actor_method_header():
    err = _task_error(
        KeyError("k"), "Counter.raise_", pid=5, ip="1.2.3.4", actor_repr="<Counter>", actor_id="ab"
    )
    assert str(err).split("\n")[0] == (
        "ray::Counter.raise_() (pid=5, ip=1.2.3.4, actor_id=ab, repr=<Counter>)"
    )


def test_constructor_signature_and_defaults():
    err = RayTaskError("f", "Traceback (most recent call last):\nValueError: x", ValueError("x"))
    assert err.function_name == "f"
    assert err.pid == os.getpid()
    assert err.proctitle == "ray::f"
    assert err.ip
    assert err.actor_repr is None
    assert err.args[:3] == ("f", "Traceback (most recent call last):\nValueError: x", err.cause)
    assert str(err).split("\n")[0].startswith("ray::f() (pid=")


def test_traceback_without_header_line_gets_one():
    err = RayTaskError("g", "ValueError: x", ValueError("x"), pid=1, ip="h")
    assert str(err) == "ray::g() (pid=1, ip=h)\nValueError: x"


def test_from_exception_drops_miniray_private_frames():
    # A "worker" frame whose code lives in miniray/_private calls the user's function.
    src = "def run(fn, arg):\n    return fn(arg)\n"
    namespace: dict = {}
    exec(compile(src, os.path.join(ex._PRIVATE_DIR, "fake_worker.py"), "exec"), namespace)
    try:
        namespace["run"](_raise, ValueError("user"))
    except ValueError as caught:
        err = RayTaskError.from_exception(caught, "user_fn")
    assert "fake_worker.py" not in err.traceback_str
    assert "in _raise" in err.traceback_str


def test_as_instanceof_cause_keeps_plain_for_base_classes():
    for cause in (Exception("x"), RayError("y")):
        err = RayTaskError("f", "tb", cause)
        assert err.as_instanceof_cause() is err


def test_ray_error_cause_gets_a_dual_class():
    # Observed in Ray 2.60: a cancelled running task raises RayTaskError(TaskCancelledError).
    dual = RayTaskError("f", "tb", TaskCancelledError("t1")).as_instanceof_cause()
    assert type(dual).__name__ == "RayTaskError(TaskCancelledError)"
    assert isinstance(dual, TaskCancelledError)
    assert dual.task_id == "t1"


def test_nested_task_error_keeps_the_inner_class():
    inner = _task_error(ValueError("deep"), "inner").as_instanceof_cause()
    outer = _task_error(inner, "outer")
    dual = outer.as_instanceof_cause()
    assert type(dual) is type(inner)
    assert type(dual).__name__ == "RayTaskError(ValueError)"
    assert isinstance(dual.cause, ValueError) and not isinstance(dual.cause, RayTaskError)
    assert str(dual).startswith("ray::outer()")
    assert "ray::inner()" in str(dual)
    assert type(pickle.loads(pickle.dumps(dual))) is type(inner)


@pytest.mark.parametrize(
    "cause, field, value",
    [
        (FileNotFoundError(2, "No such file", "/nope"), "filename", "/nope"),
        (FileNotFoundError(2, "No such file", "/nope"), "errno", 2),
        (SystemExit(3), "code", 3),
        (StopIteration(9), "value", 9),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "reason", "bad"),
    ],
)
def test_builtin_fields_reach_the_dual_instance(cause, field, value):
    dual = RayTaskError("f", "tb", cause).as_instanceof_cause()
    assert isinstance(dual, type(cause))
    assert getattr(dual, field) == value
    assert getattr(pickle.loads(pickle.dumps(dual)), field) == value


def _builtin_exception_instances():
    """One instance of every builtin exception class (their constructors differ)."""
    special = {
        UnicodeDecodeError: lambda: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
        UnicodeEncodeError: lambda: UnicodeEncodeError("utf-8", "x", 0, 1, "bad"),
        UnicodeTranslateError: lambda: UnicodeTranslateError("x", 0, 1, "bad"),
    }
    group = getattr(builtins, "BaseExceptionGroup", None)
    found = []
    for name in sorted(dir(builtins)):
        cls = getattr(builtins, name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        if group is not None and issubclass(cls, group):
            found.append(pytest.param(cls("group", [ValueError(1)]), id=name))
        else:
            found.append(pytest.param(special.get(cls, lambda c=cls: c("message"))(), id=name))
    return found


@pytest.mark.parametrize("cause", _builtin_exception_instances())
def test_every_builtin_exception_gets_a_dual_class(cause):
    """``except <its class>`` catches a task's builtin exception, whatever the class: before,
    MemoryError (its own __new__, no fields of its own) was refused by CPython as "not safe"
    and came back as a plain RayTaskError with a warning. Compared with Ray 2.60, which
    builds a dual class for every builtin exception class (ExceptionGroup included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dual = RayTaskError("f", "tb", cause).as_instanceof_cause()
    assert isinstance(dual, type(cause))
    assert isinstance(dual, RayTaskError)
    if not issubclass(RayTaskError, type(cause)):
        assert type(dual).__name__ == f"RayTaskError({type(cause).__name__})"
        assert dual.cause is cause
    again = pickle.loads(pickle.dumps(dual))
    assert type(again) is type(dual)


def test_memory_error_is_caught_by_except_memory_error():
    dual = _task_error(MemoryError("out of memory in task")).as_instanceof_cause()
    with pytest.raises(MemoryError, match="out of memory in task"):
        raise dual
    assert str(dual).splitlines()[-1] == "MemoryError: out of memory in task"


def test_half_built_dual_instance_does_not_recurse():
    dual = _task_error(ValueError("x")).as_instanceof_cause()
    empty = BaseException.__new__(type(dual))
    with pytest.raises(AttributeError):
        empty.anything  # noqa: B018
    assert str(copy.copy(dual)) == str(dual)
    assert copy.deepcopy(dual).cause.args == ("x",)


# ---------------------------------------------------------------------------------------
# Unsubclassable and unpicklable causes
# ---------------------------------------------------------------------------------------


class FinalError(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError("FinalError cannot be subclassed")


class _RefusingMeta(type):
    def __new__(mcs, name, bases, namespace, **kwargs):
        if any(isinstance(b, _RefusingMeta) for b in bases):
            raise TypeError("no subclasses")
        return super().__new__(mcs, name, bases, namespace, **kwargs)


class MetaFinalError(Exception, metaclass=_RefusingMeta):
    pass


class NeedsTwoArgs(Exception):
    def __new__(cls, a, b):
        return super().__new__(cls, a, b)

    def __init__(self, a, b):
        super().__init__(a, b)


@pytest.mark.parametrize("cause_cls", [FinalError, MetaFinalError])
def test_unsubclassable_cause_falls_back_and_warns_once(cause_cls):
    err = RayTaskError("f", "tb", cause_cls("x"))
    with pytest.warns(UserWarning, match="plain RayTaskError"):
        result = err.as_instanceof_cause()
    assert result is err
    assert type(result) is RayTaskError
    assert isinstance(result.cause, cause_cls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RayTaskError("f", "tb", cause_cls("y")).as_instanceof_cause().cause.args == ("y",)


def test_cause_with_demanding_new_still_gets_a_dual_class():
    dual = RayTaskError("f", "tb", NeedsTwoArgs(1, 2)).as_instanceof_cause()
    assert isinstance(dual, NeedsTwoArgs)
    assert dual.cause.args == (1, 2)
    assert pickle.loads(pickle.dumps(dual)).cause.args == (1, 2)


class HoldsLock(Exception):
    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


class BadReduce(Exception):
    # Pickles, but cannot be unpickled: unpickling calls BadReduce("msg") with one arg.
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


@pytest.mark.parametrize("make", [HoldsLock, lambda: BadReduce(1, 2)])
def test_unpicklable_cause_is_replaced_by_a_description(make):
    err = _task_error(make())
    assert type(err.cause) is RayError
    text = str(err.cause)
    assert "does not survive pickling" in text
    assert ("HoldsLock" in text) or ("BadReduce" in text)
    for module in (pickle, cloudpickle):
        back = module.loads(module.dumps(err.as_instanceof_cause()))
        assert type(back) is RayTaskError
        assert str(back.cause) == text
        assert str(back) == str(err)


# ---------------------------------------------------------------------------------------
# Pickling every exception
# ---------------------------------------------------------------------------------------


def _instances():
    """(label, instance) for every public class, built positionally and by keyword."""
    tb = 'Traceback (most recent call last):\n  File "t.py", line 1, in f\nValueError: v'
    task_error = RayTaskError("f", tb, ValueError("v"), pid=3, ip="h")
    yield "RayError", ex.RayError("plain")
    yield "RayError-noargs", ex.RayError()
    yield "RayTaskError", task_error
    yield (
        "RayTaskError-kw",
        RayTaskError(
            function_name="C.m",
            traceback_str=tb,
            cause=ValueError("v"),
            proctitle="ray::C.m",
            pid=4,
            ip="h",
            actor_repr="<C>",
            actor_id="ab",
        ),
    )
    yield "RayActorError", ex.RayActorError("ab", "msg", True, True)
    yield "RayActorError-kw", ex.RayActorError(actor_id="ab", error_msg="m", preempted=True)
    yield "ActorDiedError", ex.ActorDiedError()
    yield "ActorDiedError-cause", ex.ActorDiedError(task_error)
    yield "ActorDiedError-kw", ex.ActorDiedError(actor_id="ab", error_msg="killed")
    yield "ActorDiedError-ctx", ex.ActorDiedError.from_context("C", "ab", pid=1, reason="r")
    yield "ActorUnavailableError", ex.ActorUnavailableError("restarting", b"\x01")
    yield (
        "ActorUnavailableError-kw",
        ex.ActorUnavailableError(error_message="restarting", actor_id=None),
    )
    yield "GetTimeoutError", ex.GetTimeoutError("Get timed out: some object(s) not ready.")
    yield "TaskCancelledError", ex.TaskCancelledError("t1")
    yield "TaskCancelledError-empty", ex.TaskCancelledError()
    yield "TaskCancelledError-kw", ex.TaskCancelledError(task_id="t1", error_message="why")
    yield "WorkerCrashedError", ex.WorkerCrashedError()
    yield "WorkerCrashedError-kw", ex.WorkerCrashedError(message="exit code 3")
    yield "LocalRayletDiedError", ex.LocalRayletDiedError()
    yield "NodeDiedError", ex.NodeDiedError("gone")
    yield "NodeDiedError-kw", ex.NodeDiedError(message="gone")
    for name in (
        "ObjectLostError",
        "OwnerDiedError",
        "ObjectFreedError",
        "ObjectFetchTimedOutError",
        "ObjectReconstructionFailedError",
        "ObjectReconstructionFailedMaxAttemptsExceededError",
        "ObjectReconstructionFailedLineageEvictedError",
        "ReferenceCountingAssertionError",
    ):
        cls = getattr(ex, name)
        yield name, cls("ab" * 28, b"owner", "f | g")
        yield name + "-kw", cls(object_ref_hex="cd", owner_address=None, call_site="")
    yield "ObjectStoreFullError", ex.ObjectStoreFullError("needed 10 MiB")
    yield "ObjectStoreFullError-empty", ex.ObjectStoreFullError()
    yield "OutOfDiskError", ex.OutOfDiskError("disk")
    yield "OutOfMemoryError", ex.OutOfMemoryError("oom")
    yield "OutOfMemoryError-kw", ex.OutOfMemoryError(message="oom")
    for name in (
        "RaySystemError",
        "RayChannelError",
        "RayChannelTimeoutError",
        "RayCgraphCapacityExceeded",
        "RayDirectTransportError",
        "StreamingGeneratorReplayInconsistentError",
    ):
        cls = getattr(ex, name)
        yield name, cls("broken")
        yield name + "-kw", cls(client_exc=ValueError("inner"), traceback_str="tb")
    yield "RuntimeEnvSetupError", ex.RuntimeEnvSetupError("pip failed")
    yield "RuntimeEnvSetupError-empty", ex.RuntimeEnvSetupError()
    yield "RuntimeEnvSetupError-kw", ex.RuntimeEnvSetupError(error_message="pip failed")
    yield "TaskUnschedulableError", ex.TaskUnschedulableError("node dead")
    yield "TaskUnschedulableError-kw", ex.TaskUnschedulableError(error_message="node dead")
    yield "ActorUnschedulableError", ex.ActorUnschedulableError("node dead")
    yield "ActorUnschedulableError-kw", ex.ActorUnschedulableError(error_message="node dead")
    yield "TaskPlacementGroupRemoved", ex.TaskPlacementGroupRemoved()
    yield "ActorPlacementGroupRemoved", ex.ActorPlacementGroupRemoved()
    yield "PendingCallsLimitExceeded", ex.PendingCallsLimitExceeded("too many")
    yield "ActorAlreadyExistsError", ex.ActorAlreadyExistsError("taken")
    yield "ActorAlreadyExistsError-kw", ex.ActorAlreadyExistsError(error_message="taken")
    yield "ActorHandleNotFoundError", ex.ActorHandleNotFoundError("no actor")
    yield "ActorHandleNotFoundError-kw", ex.ActorHandleNotFoundError(error_message="no")
    yield "AsyncioActorExit", ex.AsyncioActorExit()
    yield "CrossLanguageError", ex.CrossLanguageError("from java")
    yield "UnserializableException", ex.UnserializableException("Traceback ...")
    yield "UnserializableException-kw", ex.UnserializableException(original_stack_trace="t")
    yield "UserCodeException", ex.UserCodeException("user")
    yield "AuthenticationError", ex.AuthenticationError("bad token")
    yield "AuthenticationError-kw", ex.AuthenticationError(message="bad token")
    yield "RpcError", ex.RpcError("down", 14)
    yield "RpcError-kw", ex.RpcError(message="down", rpc_code=14)
    yield "PlasmaObjectNotAvailable", ex.PlasmaObjectNotAvailable()
    yield "ObjectRefStreamEndOfStreamError", ex.ObjectRefStreamEndOfStreamError()
    yield (
        "OufOfBandObjectRefSerializationException",
        ex.OufOfBandObjectRefSerializationException("pickled a ref"),
    )
    # Dual classes, including keyword-built and actor ones.
    yield "dual-ValueError", task_error.as_instanceof_cause()
    yield "dual-CustomError", _task_error(CustomError("c", 5)).as_instanceof_cause()
    yield (
        "dual-kw",
        RayTaskError(
            function_name="C.m",
            traceback_str="tb",
            cause=KeyError("k"),
            actor_repr="<C>",
            actor_id="ab",
        ).as_instanceof_cause(),
    )
    yield (
        "dual-TaskCancelledError",
        RayTaskError("f", "tb", TaskCancelledError("t")).as_instanceof_cause(),
    )
    yield "dual-OSError", RayTaskError("f", "tb", OSError(2, "gone")).as_instanceof_cause()


INSTANCES = list(_instances())


def test_pickling_table_covers_every_class():
    covered = {type(e).__name__ for _, e in INSTANCES}
    assert set(ex.__all__) <= covered


def _comparable_state(e):
    state = {}
    for key, value in vars(e).items():
        if isinstance(value, BaseException):
            state[key] = (type(value).__name__, str(value))
        else:
            state[key] = value
    return state


@pytest.mark.parametrize("module", [pickle, cloudpickle], ids=["pickle", "cloudpickle"])
@pytest.mark.parametrize("label, error", INSTANCES, ids=[label for label, _ in INSTANCES])
def test_every_exception_round_trips(module, label, error):
    back = module.loads(module.dumps(error))
    assert type(back) is type(error), label
    assert str(back) == str(error)
    assert repr(back) == repr(error)
    assert _comparable_state(back) == _comparable_state(error)
    assert len(back.args) == len(error.args)
    if isinstance(error, RayTaskError) and type(error) is not RayTaskError:
        assert type(back).__name__.startswith("RayTaskError(")
        assert back.args == (back.cause,)
        assert isinstance(back, type(error.cause))
    if isinstance(error, RayActorError):
        assert back.actor_init_failed == error.actor_init_failed
        assert back.preempted == error.preempted
        assert back.actor_id == error.actor_id


@pytest.mark.parametrize("label, error", INSTANCES, ids=[label for label, _ in INSTANCES])
def test_every_exception_copies(label, error):
    assert str(copy.copy(error)) == str(error)
    assert type(copy.deepcopy(error)) is type(error)


def test_unschedulable_errors_read_as_rays():
    assert str(ex.TaskUnschedulableError("node dead")) == "The task is not schedulable: node dead"
    assert str(ex.ActorUnschedulableError("node dead")) == (
        "The actor is not schedulable: node dead")
