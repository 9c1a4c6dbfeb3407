"""Mirrors `ray.exceptions` (Ray 2.60). Differs: see the list below.

Owns: every exception class a miniray program can catch, with Ray's names, bases and
constructor signatures, and the ``RayTaskError`` "dual class" machinery that makes
``except ValueError`` catch a task's ``ValueError``. Does not own: deciding *when* an error
is raised or stored; the runtime, owner and worker modules do that and build these objects.
Called by: the worker (``RayTaskError.from_exception`` when a task raises), the owner (stores
errors in the object table, raises them from ``get()``), the public API (argument errors).

Hierarchy (every class derives from ``RayError``, which derives from ``Exception``)::

    RayError
    +-- RayTaskError                  raised as the dual class "RayTaskError(<Cause>)"
    +-- RayActorError
    |   +-- ActorDiedError, ActorUnavailableError
    +-- GetTimeoutError               also TimeoutError
    +-- TaskCancelledError, WorkerCrashedError, LocalRayletDiedError, NodeDiedError
    +-- ObjectLostError
    |   +-- OwnerDiedError, ObjectFreedError, ObjectFetchTimedOutError,
    |   +-- ObjectReconstructionFailedError (+ ...MaxAttemptsExceeded..., ...LineageEvicted...)
    |   +-- ReferenceCountingAssertionError   also AssertionError
    +-- ObjectStoreFullError, OutOfDiskError, OutOfMemoryError
    +-- RaySystemError
    |   +-- RayChannelError
    |   |   +-- RayChannelTimeoutError        also TimeoutError
    |   +-- RayCgraphCapacityExceeded, RayDirectTransportError,
    |       StreamingGeneratorReplayInconsistentError
    +-- RuntimeEnvSetupError, TaskUnschedulableError, ActorUnschedulableError,
    |   TaskPlacementGroupRemoved, ActorPlacementGroupRemoved, PendingCallsLimitExceeded
    +-- ActorAlreadyExistsError, ActorHandleNotFoundError     also ValueError
    +-- AsyncioActorExit, CrossLanguageError, UnserializableException, UserCodeException,
        AuthenticationError, RpcError, PlasmaObjectNotAvailable,
        ObjectRefStreamEndOfStreamError, OufOfBandObjectRefSerializationException

Pickling: ``RayError.__reduce__`` rebuilds an instance from its ``args`` and ``__dict__``
without calling ``__init__``, so every class survives pickle and cloudpickle whatever its
constructor signature and however it was built (keyword arguments included). Dual classes
are created at run time and cannot be found by name, so their ``__reduce__`` rebuilds the
plain ``RayTaskError`` and calls ``as_instanceof_cause()`` again on the receiving side.

Differs from Ray:

* ``str(RayTaskError)`` carries no ANSI colour codes around the ``ray::fn()`` header.
* ``RayTaskError`` defaults ``pid`` to ``os.getpid()``, ``ip`` to ``127.0.0.1`` and
  ``proctitle`` to ``"ray::<function_name>"`` (Ray reads the process title and node IP).
* ``RayTaskError`` checks that its cause survives a cloudpickle round trip (dump *and* load,
  Ray only dumps) and otherwise replaces it with a ``RayError`` naming its type and text.
* ``RayTaskError.from_exception`` and ``ActorDiedError.from_context`` are miniray helpers,
  not in Ray. ``ActorDiedError`` also accepts ``actor_id``, ``error_msg``,
  ``actor_init_failed`` and ``preempted`` keywords (Ray builds it from a protobuf context).
* Dual classes are cached per cause class; on a cause of a builtin exception type the
  dual instance also copies the builtin's C-level fields (``errno``, ``filename``,
  ``code``, ...) that would otherwise shadow the fall-through to ``.cause``.
* A cause that is itself a dual ``RayTaskError(X)`` (a nested task failure) yields the same
  ``RayTaskError(X)`` class, whose ``.cause`` is the innermost ``X``.
* ``WorkerCrashedError``, ``LocalRayletDiedError``, ``ObjectStoreFullError`` and a few
  others accept an optional message naming what happened (exit code, signal, sizes).
* ``CrossLanguageError`` accepts a plain message (miniray has no protobuf exceptions), and
  ``RayError`` has no ``to_bytes``/``from_bytes``.
* Messages are miniray's own wording, except those quoted from observed Ray behaviour:
  ``TaskCancelledError``'s "Task: <id> was cancelled. ", ``ActorDiedError``'s opening
  sentences, ``WorkerCrashedError``'s first sentence and ``RaySystemError``'s prefix.
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
import traceback
import types
import warnings
import weakref
from typing import Any

# fmt: off
__all__ = [
    "RayError", "RayTaskError", "RayActorError", "ActorDiedError", "ActorUnavailableError",
    "GetTimeoutError", "TaskCancelledError", "WorkerCrashedError", "LocalRayletDiedError",
    "NodeDiedError", "ObjectLostError", "OwnerDiedError", "ObjectFreedError",
    "ObjectFetchTimedOutError", "ObjectReconstructionFailedError",
    "ObjectReconstructionFailedMaxAttemptsExceededError",
    "ObjectReconstructionFailedLineageEvictedError", "ReferenceCountingAssertionError",
    "ObjectStoreFullError", "OutOfDiskError", "OutOfMemoryError", "RaySystemError",
    "RayChannelError", "RayChannelTimeoutError", "RayCgraphCapacityExceeded",
    "RayDirectTransportError", "StreamingGeneratorReplayInconsistentError",
    "RuntimeEnvSetupError", "TaskUnschedulableError", "ActorUnschedulableError",
    "TaskPlacementGroupRemoved", "ActorPlacementGroupRemoved", "PendingCallsLimitExceeded",
    "ActorAlreadyExistsError", "ActorHandleNotFoundError", "AsyncioActorExit",
    "CrossLanguageError", "UnserializableException", "UserCodeException", "AuthenticationError",
    "RpcError", "PlasmaObjectNotAvailable", "ObjectRefStreamEndOfStreamError",
    "OufOfBandObjectRefSerializationException",
]
# fmt: on

logger = logging.getLogger(__name__)

# Ray joins the frames of a recorded call site with this delimiter; ObjectLostError
# turns it back into indented lines.
_CALL_STACK_LINE_DELIMITER = " | "
_DEFAULT_IP = "127.0.0.1"
# Frames from these files are the worker's own dispatch code, not the user's: they are
# dropped from remote tracebacks as Ray drops its ray/_private/ frames.
_PRIVATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_private") + os.sep


def _restore(cls: type, args: tuple, state: dict) -> BaseException:
    """Unpickle helper: rebuild an exception without running its ``__init__``.

    ``cls.__new__`` gets the original args so builtin bases that parse them (OSError for
    ``TimeoutError`` subclasses) see the same values as at construction.
    """
    obj = cls.__new__(cls, *args)
    obj.args = args
    obj.__dict__.update(state)
    return obj


class RayError(Exception):
    """Base class of every miniray exception.

    Example:
        >>> try:
        ...     raise GetTimeoutError("Get timed out: some object(s) not ready.")
        ... except RayError as e:
        ...     print(type(e).__name__)
        GetTimeoutError
    """

    def __reduce__(self):
        return (_restore, (type(self), tuple(self.args), dict(self.__dict__)))


# --- Task errors and the dual class -------------------------------------------------------------

# cause class -> weakref to its dual class. The dual class holds its cause class in
# __bases__, so a strong value would keep the key alive forever; a weak value lets both go
# once no instance is left.
_dual_classes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_dual_lock = threading.Lock()
_warned_unsubclassable: weakref.WeakSet = weakref.WeakSet()

# BaseException fields that are not state of the cause worth copying onto a dual instance.
_SKIP_BUILTIN_FIELDS = frozenset(
    {"args", "__traceback__", "__cause__", "__context__", "__suppress_context__", "__dict__"}
)


def _describe(obj: Any) -> str:
    """``str(obj)`` that never raises."""
    try:
        return str(obj)
    except Exception as e:  # noqa: BLE001 - a broken __str__ must not hide the error
        return f"<str() failed: {type(e).__name__}>"


def _qualified_name(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    if module in (None, "builtins"):
        return name
    return f"{module}.{name}"


def _check_picklable(cause: BaseException) -> BaseException | None:
    """Return ``None`` if ``cause`` survives a round trip, else the error that broke it."""
    try:
        import cloudpickle as _pickler
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        import pickle as _pickler
    try:
        _pickler.loads(_pickler.dumps(cause))
    except Exception as e:  # noqa: BLE001 - any failure means "cannot travel"
        return e
    return None


class RayTaskError(RayError):
    """A task or actor method raised an exception.

    ``ray.get`` raises ``error.as_instanceof_cause()``: an instance of a class named
    ``RayTaskError(<Cause>)`` that derives from both ``RayTaskError`` and the cause's class,
    so ``except <Cause>`` still catches it. ``str()`` is the remote traceback under a
    ``ray::<function>() (pid=..., ip=...)`` header.

    Args:
        function_name: The task's name (``"f"``) or, for actors, ``"Cls.method"``.
        traceback_str: The formatted remote traceback.
        cause: The exception the task raised. If it cannot be pickled and unpickled, it is
            replaced by a ``RayError`` that names its type and message.
        proctitle: Header text; defaults to ``"ray::<function_name>"``.
        pid: The worker's pid; defaults to this process's.
        ip: The node's address; defaults to ``127.0.0.1``.
        actor_repr: ``repr()`` of the actor, for actor methods.
        actor_id: The actor's id in hex, for actor methods.

    Example:
        >>> try:
        ...     raise ValueError("bad thing")
        ... except ValueError as exc:
        ...     err = RayTaskError.from_exception(exc, "boom", pid=42)
        >>> dual = err.as_instanceof_cause()
        >>> isinstance(dual, ValueError), type(dual).__name__
        (True, 'RayTaskError(ValueError)')
    """

    def __init__(
        self,
        function_name,
        traceback_str,
        cause,
        proctitle=None,
        pid=None,
        ip=None,
        actor_repr=None,
        actor_id=None,
    ):
        if traceback_str is None:
            raise TypeError("RayTaskError needs a traceback_str (got None)")
        self.proctitle = proctitle or f"ray::{function_name}"
        self.pid = pid or os.getpid()
        self.ip = ip or _DEFAULT_IP
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.actor_repr = actor_repr
        self._actor_id = actor_id
        self.cause = cause
        if isinstance(cause, BaseException):
            failure = _check_picklable(cause)
            if failure is not None:
                message = (
                    f"The exception raised by {function_name} could not be sent back "
                    f"because it does not survive pickling "
                    f"({type(failure).__name__}: {_describe(failure)}); it was "
                    f"{_qualified_name(type(cause))}: {_describe(cause)}"
                )
                logger.warning("%s", message)
                self.cause = RayError(message)
        # Ray's argument tuple; pickling does not depend on it (see RayError.__reduce__).
        self.args = (function_name, traceback_str, self.cause, proctitle, pid, ip)

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        function_name: str,
        pid: int | None = None,
        ip: str | None = None,
        actor_repr: str | None = None,
        actor_id: str | None = None,
        traceback_str: str | None = None,
    ) -> RayTaskError:
        """Build the error a worker stores when a task raises ``exc``. Not in Ray.

        Formats ``exc``'s traceback (unless ``traceback_str`` is given) without the
        worker's own ``miniray/_private`` frames, and replaces a cause that cannot be
        pickled with a ``RayError`` describing it, so the error always travels.

        Example:
            >>> try:
            ...     {}["k"]
            ... except KeyError as exc:
            ...     err = RayTaskError.from_exception(exc, "lookup", pid=7, ip="10.0.0.1")
            >>> str(err).splitlines()[0]
            'ray::lookup() (pid=7, ip=10.0.0.1)'
        """
        if traceback_str is None:
            traceback_str = _format_user_traceback(exc)
        return cls(
            function_name,
            traceback_str,
            exc,
            pid=pid,
            ip=ip,
            actor_repr=actor_repr,
            actor_id=actor_id,
        )

    def _header(self) -> str:
        fields = vars(self)
        line = f"{fields.get('proctitle')}() (pid={fields.get('pid')}, ip={fields.get('ip')}"
        if fields.get("actor_repr"):
            line += f", actor_id={fields.get('_actor_id')}, repr={fields.get('actor_repr')})"
        else:
            line += ")"
        return line

    def __str__(self) -> str:
        # Fields are read from __dict__: on a dual instance the cause's class may define a
        # property of the same name.
        header = self._header()
        lines = str(vars(self).get("traceback_str", "")).strip().split("\n")
        out = []
        replaced = False
        for line in lines:
            # Each "Traceback ..." line (one per chained exception) becomes the header,
            # as in Ray.
            if line.startswith("Traceback "):
                out.append(header)
                replaced = True
            else:
                out.append(line)
        if not replaced:
            out.insert(0, header)
        return "\n".join(out)

    def as_instanceof_cause(self) -> RayTaskError:
        """Return an exception that is an instance of both ``RayTaskError`` and the cause's
        class, carrying the cause's attributes.

        If the cause's class is ``Exception``, ``RayError`` or another base of
        ``RayTaskError``, returns ``self``. If the class cannot be subclassed or
        instantiated that way, warns once per class and returns ``self``.
        """
        cause = vars(self).get("cause")
        # A nested task failure: keep the inner dual's class, unwrap to the original cause.
        while isinstance(cause, RayTaskError) and getattr(type(cause), "_miniray_dual", False):
            cause = vars(cause).get("cause")
        if not isinstance(cause, BaseException):
            return self
        cause_cls = type(cause)
        if issubclass(RayTaskError, cause_cls):
            return self
        try:
            dual_cls = _dual_class_for(cause_cls)
            instance = _instantiate_dual(dual_cls, cause_cls, cause)
        except Exception as e:  # noqa: BLE001 - __init_subclass__/metaclasses may raise anything
            _warn_unsubclassable(cause_cls, e)
            return self
        instance.__dict__.update(self.__dict__)
        instance.__dict__["cause"] = cause
        instance.args = (cause,)
        _copy_builtin_fields(cause, instance)
        return instance


def _format_user_traceback(exc: BaseException) -> str:
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    user_frames = [f for f in te.stack if not os.path.abspath(f.filename).startswith(_PRIVATE_DIR)]
    # If every frame is miniray's own, the error came from miniray: keep them all.
    if user_frames and len(user_frames) != len(te.stack):
        te.stack = traceback.StackSummary.from_list(user_frames)
    return "".join(te.format())


def _dual_class_for(cause_cls: type) -> type:
    with _dual_lock:
        ref = _dual_classes.get(cause_cls)
        dual = ref() if ref is not None else None
    if dual is not None:
        return dual
    # Built outside the lock: class creation runs the cause's __init_subclass__ and
    # metaclass, which are user code. If two threads race, the first one stored wins.
    built = _make_dual_class(cause_cls)
    with _dual_lock:
        ref = _dual_classes.get(cause_cls)
        dual = ref() if ref is not None else None
        if dual is None:
            dual = built
            _dual_classes[cause_cls] = weakref.ref(dual)
    return dual


def _make_dual_class(cause_cls: type) -> type:
    name = f"RayTaskError({cause_cls.__name__})"

    def __init__(self, cause):
        self.__dict__["cause"] = cause
        self.args = (cause,)

    def __getattr__(self, attr):
        # Only called when normal lookup fails. Read the cause from __dict__ so that a
        # half-built instance (during copy or unpickling) raises instead of recursing.
        try:
            cause = self.__dict__["cause"]
        except KeyError:
            raise AttributeError(attr) from None
        return getattr(cause, attr)

    def __reduce__(self):
        return (_rebuild_dual, (dict(self.__dict__),))

    namespace = {
        "__init__": __init__,
        "__getattr__": __getattr__,
        "__reduce__": __reduce__,
        "__str__": RayTaskError.__str__,
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"A task raised {cause_cls.__name__}; see RayTaskError.",
        "_miniray_dual": True,
    }
    # types.new_class picks the most derived metaclass, so a cause class with a custom
    # metaclass works too; the cause's __init_subclass__ runs and may refuse.
    return types.new_class(name, (RayTaskError, cause_cls), {}, lambda ns: ns.update(namespace))


# Python 3.11+; None before.
_EXCEPTION_GROUP = getattr(builtins, "BaseExceptionGroup", None)


def _instantiate_dual(dual_cls: type, cause_cls: type, cause: BaseException):
    # Allocate through a builtin __new__, skipping a user-defined __new__ that may demand
    # arguments the dual class cannot supply. It must be the one CPython checks as "safe":
    # that of the first builtin class on the dual class's layout chain (``__base__``), not
    # the cause's own builtin base. They differ for causes whose builtin class has its own
    # __new__ but no fields of its own: MemoryError's layout base is Exception, yet
    # ``MemoryError.__new__(dual)`` is refused as "not safe".
    layout_base = dual_cls.__base__
    while layout_base.__module__ != "builtins":
        layout_base = layout_base.__base__
    if _EXCEPTION_GROUP is not None and issubclass(layout_base, _EXCEPTION_GROUP):
        # A group's __new__ takes (message, exceptions) and checks them.
        instance = layout_base.__new__(dual_cls, cause.message, cause.exceptions)
    else:
        instance = layout_base.__new__(dual_cls, cause)
    dual_cls.__init__(instance, cause)
    return instance


def _copy_builtin_fields(cause: BaseException, instance: BaseException) -> None:
    """Copy C-level fields of builtin bases (``errno``, ``code``, ``value``, ...), which the
    dual instance has too and which would otherwise hide the cause's values."""
    for klass in type(cause).__mro__:
        if klass.__module__ != "builtins" or klass in (BaseException, object):
            continue
        for field, descriptor in vars(klass).items():
            if field in _SKIP_BUILTIN_FIELDS or not isinstance(
                descriptor, (types.MemberDescriptorType, types.GetSetDescriptorType)
            ):
                continue
            try:
                setattr(instance, field, getattr(cause, field))
            except (AttributeError, TypeError, ValueError):
                pass


def _warn_unsubclassable(cause_cls: type, error: BaseException) -> None:
    with _dual_lock:
        if cause_cls in _warned_unsubclassable:
            return
        try:
            _warned_unsubclassable.add(cause_cls)
        except TypeError:  # pragma: no cover - every class is weak-referenceable
            pass
    warnings.warn(
        f"The exception type {_qualified_name(cause_cls)} raised by a task cannot be "
        f"combined with RayTaskError ({type(error).__name__}: {_describe(error)}), so the "
        "error is raised as a plain RayTaskError; its .cause attribute holds the original "
        "exception.",
        UserWarning,
        stacklevel=3,
    )


def _rebuild_dual(state: dict) -> RayTaskError:
    """Unpickle helper for dual instances: rebuild the plain error, then the dual."""
    args = tuple(
        state.get(f) for f in ("function_name", "traceback_str", "cause", "proctitle", "pid", "ip")
    )
    plain = _restore(RayTaskError, args, state)
    return plain.as_instanceof_cause()


# --- Actor errors -------------------------------------------------------------------------------


class RayActorError(RayError):
    """The actor could not finish a call: it is dead (``ActorDiedError``) or unreachable for
    now (``ActorUnavailableError``).

    Args:
        actor_id: The actor's id in hex.
        error_msg: The full message.
        actor_init_failed: Whether the actor's constructor raised.
        preempted: Whether the actor's node was preempted.
    """

    BASE_ERROR_MSG = "The actor experienced an error before finishing this task."

    def __init__(
        self,
        actor_id: str | None = None,
        error_msg: str = BASE_ERROR_MSG,
        actor_init_failed: bool = False,
        preempted: bool = False,
    ):
        super().__init__(error_msg)
        self.actor_id = actor_id
        self.error_msg = error_msg
        self._actor_init_failed = actor_init_failed
        self._preempted = preempted

    def __str__(self) -> str:
        return str(self.error_msg)

    @property
    def actor_init_failed(self) -> bool:
        return self._actor_init_failed

    @property
    def preempted(self) -> bool:
        return self._preempted


class ActorDiedError(RayActorError):
    """The actor is dead: killed, exited, crashed, or its constructor raised.

    Args:
        cause: The ``RayTaskError`` of a failed constructor (sets ``actor_init_failed``), a
            message string used as the whole message, or None.
        actor_id: The actor's id in hex (taken from ``cause`` when it is a task error).
        error_msg: The whole message, used verbatim; overrides the one built from ``cause``.
        actor_init_failed: Mark the constructor as failed without a ``RayTaskError``.
        preempted: Whether the actor's node was preempted.

    Example:
        >>> e = ActorDiedError.from_context(
        ...     "Counter", "ab12", pid=99,
        ...     reason="The actor is dead because it was killed by `ray.kill`.")
        >>> str(e).splitlines()[0]
        'The actor died unexpectedly before finishing this task.'
    """

    BASE_ERROR_MSG = "The actor died unexpectedly before finishing this task."

    def __init__(
        self,
        cause: Any = None,
        *,
        actor_id: str | None = None,
        error_msg: str | None = None,
        actor_init_failed: bool = False,
        preempted: bool = False,
    ):
        message = ActorDiedError.BASE_ERROR_MSG
        if isinstance(cause, RayTaskError):
            actor_init_failed = True
            if actor_id is None:
                actor_id = vars(cause).get("_actor_id")
            message = f"The actor died because of an error raised in its creation task, {cause}"
        elif isinstance(cause, str):
            message = cause
        elif cause is not None:
            raise TypeError(
                f"ActorDiedError(cause=...) takes a RayTaskError, a message or None, "
                f"not {type(cause).__name__}"
            )
        if error_msg is not None:
            message = error_msg
        super().__init__(actor_id, message, actor_init_failed, preempted)

    @classmethod
    def from_context(
        cls,
        class_name: str,
        actor_id: str,
        *,
        pid: int | None = None,
        name: str | None = None,
        namespace: str | None = None,
        ip: str | None = None,
        reason: str | None = None,
        never_started: bool = False,
        preempted: bool = False,
    ) -> ActorDiedError:
        """Build the message Ray builds for an actor that died of a system-level cause:
        the opening sentence, one tab-indented ``key: value`` line per known field, then
        ``reason`` (for example "The actor is dead because it was killed by `ray.kill`.").
        Not in Ray.
        """
        lines = [cls.BASE_ERROR_MSG, f"\tclass_name: {class_name}", f"\tactor_id: {actor_id}"]
        if pid:
            lines.append(f"\tpid: {pid}")
        if name:
            lines.append(f"\tname: {name}")
        if namespace:
            lines.append(f"\tnamespace: {namespace}")
        if ip:
            lines.append(f"\tip: {ip}")
        if reason:
            lines.append(reason)
        if never_started:
            lines.append("The actor was cancelled before it started running.")
        return cls(actor_id=actor_id, error_msg="\n".join(lines), preempted=preempted)

    @staticmethod
    def from_task_error(task_error: RayTaskError) -> ActorDiedError:
        return ActorDiedError(task_error)


class ActorUnavailableError(RayActorError):
    """The actor cannot be reached right now but may come back (for example, restarting).

    Args:
        error_message: What happened.
        actor_id: The actor's id, as bytes or hex.
    """

    def __init__(self, error_message: str, actor_id: Any | None = None):
        if isinstance(actor_id, (bytes, bytearray)):
            actor_id = bytes(actor_id).hex()
        message = (
            f"The actor {actor_id} is unavailable: {error_message}. The call may or may not "
            "have run on the actor."
        )
        super().__init__(actor_id, message, False, False)
        self.error_message = error_message


class ActorAlreadyExistsError(ValueError, RayError):
    """A named actor with this name already exists in the namespace.

    Also a ``ValueError``, which is what older Ray versions raised.
    """

    def __init__(self, error_message: str):
        super().__init__(error_message)
        self.error_message = error_message

    def __str__(self) -> str:
        return str(self.error_message)


class ActorHandleNotFoundError(ValueError, RayError):
    """The actor a handle refers to is not known (for example, to ``kill()``).

    Also a ``ValueError``, which is what older Ray versions raised.
    """

    def __init__(self, error_message: str):
        super().__init__(error_message)
        self.error_message = error_message

    def __str__(self) -> str:
        return str(self.error_message)


class AsyncioActorExit(RayError):
    """An async actor asked to exit (``ray.actor.exit_actor()``)."""


class PendingCallsLimitExceeded(RayError):
    """More calls are queued on an actor than its ``max_pending_calls`` allows."""


# --- Task, worker and node errors ---------------------------------------------------------------


class GetTimeoutError(RayError, TimeoutError):
    """``get()`` timed out before every object was ready. Also a builtin ``TimeoutError``."""


class TaskCancelledError(RayError):
    """The task was cancelled with ``cancel()``.

    Args:
        task_id: The id of the cancelled task.
        error_message: Extra detail.
    """

    def __init__(self, task_id: Any = None, error_message: str | None = None):
        super().__init__(*(a for a in (task_id, error_message) if a is not None))
        self.task_id = task_id
        self.error_message = error_message

    def __str__(self) -> str:
        message = ""
        if self.task_id:
            message = f"Task: {self.task_id} was cancelled. "
        if self.error_message:
            message += str(self.error_message)
        return message


class WorkerCrashedError(RayError):
    """The worker process died while running the task.

    Args:
        message: What killed it (exit code or signal) and what to do; optional.
    """

    _FIRST_SENTENCE = "The worker died unexpectedly while executing this task."

    def __init__(self, message: str | None = None):
        super().__init__(*(() if message is None else (message,)))
        self.message = message

    def __str__(self) -> str:
        detail = self.message or (
            "Its exit status was not reported; the worker's last output above may say why."
        )
        return f"{self._FIRST_SENTENCE} {detail}"


class LocalRayletDiedError(RayError):
    """The node process that scheduled the task died."""

    def __str__(self) -> str:
        return super().__str__() or "The local node process that ran this task has exited."


class NodeDiedError(RayError):
    """The node is dead or unreachable.

    Args:
        message: What happened.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return str(self.message)


class UserCodeException(RayError):
    """Wraps an exception raised by user code; ``retry_exceptions`` looks at its cause."""


class RuntimeEnvSetupError(RayError):
    """The task's or actor's ``runtime_env`` could not be set up.

    Args:
        error_message: Why it failed.
    """

    def __init__(self, error_message: str | None = None):
        super().__init__(*(() if error_message is None else (error_message,)))
        self.error_message = error_message

    def __str__(self) -> str:
        lines = ["Failed to set up runtime environment."]  # Ray's first line
        if self.error_message:
            lines.append(str(self.error_message))
        return "\n".join(lines)


class TaskUnschedulableError(RayError):
    """The task can never be scheduled (for example, its target node is gone).

    Args:
        error_message: Why.
    """

    def __init__(self, error_message: str):
        super().__init__(error_message)
        self.error_message = error_message

    def __str__(self) -> str:
        return f"The task is not schedulable: {self.error_message}"


class ActorUnschedulableError(RayError):
    """The actor can never be scheduled (for example, its target node is gone).

    Args:
        error_message: Why.
    """

    def __init__(self, error_message: str):
        super().__init__(error_message)
        self.error_message = error_message

    def __str__(self) -> str:
        return f"The actor is not schedulable: {self.error_message}"


class TaskPlacementGroupRemoved(RayError):
    """The placement group the task was scheduled into was removed."""

    def __str__(self) -> str:
        return super().__str__() or "The placement group of this task was removed."


class ActorPlacementGroupRemoved(RayError):
    """The placement group the actor was scheduled into was removed."""

    def __str__(self) -> str:
        return super().__str__() or "The placement group of this actor was removed."


# --- Object errors ------------------------------------------------------------------------------


class ObjectLostError(RayError):
    """The object's value is gone and cannot be fetched.

    Args:
        object_ref_hex: The object's id in hex.
        owner_address: Where its owner lives, if known.
        call_site: Where the ObjectRef was created, if recorded.
    """

    def __init__(self, object_ref_hex: str, owner_address: Any = None, call_site: str = ""):
        super().__init__(object_ref_hex, owner_address, call_site)
        self.object_ref_hex = object_ref_hex
        self.owner_address = owner_address
        self.call_site = (call_site or "").replace(_CALL_STACK_LINE_DELIMITER, "\n  ")

    def _base_str(self) -> str:
        message = f"Failed to retrieve object {self.object_ref_hex}."
        if self.call_site:
            message += f" The ObjectRef was created at: {self.call_site}"
        return message

    def _reason(self) -> str:
        # ``lost_on``: which node kept it and why it is lost, when the owner knows (set on
        # the instance: pickled with its __dict__).
        where = self.__dict__.get("lost_on")
        return (
            f"All copies of {self.object_ref_hex} have been lost due to node failure (the "
            "node that kept it died or dropped this driver's link before the value was "
            "read). " + (f"{where}. " if where else "") +
            "Check the node's log under its session directory for the failure."
        )

    def __str__(self) -> str:
        return f"{self._base_str()}\n\n{self._reason()}"


class ObjectFetchTimedOutError(ObjectLostError):
    """Fetching the object timed out because no copy could be located."""

    def _reason(self) -> str:
        return (
            f"Fetching object {self.object_ref_hex} timed out: no copy of it could be "
            "located. This is likely a bug in miniray."
        )


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """The object was deleted while a reference to it still existed."""

    def _reason(self) -> str:
        return (
            "Reference counting deleted the object while a reference to it still existed. "
            "This is a bug in miniray."
        )


class ObjectFreedError(ObjectLostError):
    """The object was freed explicitly by the application."""

    def _reason(self) -> str:
        return (
            "The object was freed explicitly (the internal `free` call). Only free objects "
            "that nothing will read again."
        )


class OwnerDiedError(ObjectLostError):
    """The process that owned the object exited while references to it remained."""

    def _reason(self) -> str:
        where = f" ({self.owner_address})" if self.owner_address else ""
        return (
            f"The object's owner{where} has exited. The owner is the process that created "
            "the ObjectRef with `.remote()` or `put()`; keep it alive while others use "
            "its objects."
        )


class ObjectReconstructionFailedError(ObjectLostError):
    """The lost object cannot be recomputed."""

    def _reason(self) -> str:
        return (
            "The object cannot be recomputed because it was created by an actor, by "
            "`put()`, or by a task whose ObjectRef was created by another worker."
        )


class ObjectReconstructionFailedMaxAttemptsExceededError(ObjectLostError):
    """The lost object cannot be recomputed: its task ran out of retries."""

    def _reason(self) -> str:
        return (
            "The object cannot be recomputed because its task has no retries left; raise "
            "the task's `max_retries` to allow more."
        )


class ObjectReconstructionFailedLineageEvictedError(ObjectLostError):
    """The lost object cannot be recomputed: its lineage was evicted."""

    def _reason(self) -> str:
        return (
            "The object cannot be recomputed because the record of how it was made was "
            "evicted to save memory."
        )


class ObjectStoreFullError(RayError):
    """The object store is full of objects still in use.

    Args:
        message: Sizes and what was being stored; optional.
    """

    def __str__(self) -> str:
        hint = (
            "The object store is full of objects that are still referenced, so nothing can "
            "be evicted. Drop ObjectRefs you no longer need, or start with a larger "
            "object_store_memory."
        )
        message = super().__str__()
        return f"{message}\n{hint}" if message else hint


class OutOfDiskError(RayError):
    """Both the object store and the disk it spills to are full."""

    def __str__(self) -> str:
        hint = (
            "The object could not be stored: the object store is full and the disk used "
            "for spilling is over capacity. Free disk space or drop unused ObjectRefs."
        )
        message = super().__str__()
        return f"{message}\n{hint}" if message else hint


class OutOfMemoryError(RayError):
    """The host ran low on memory and the task's or actor's worker was killed.

    Args:
        message: What was killed and why.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return str(self.message)


class PlasmaObjectNotAvailable(RayError):
    """The object was not available in the store within the timeout."""


class ObjectRefStreamEndOfStreamError(RayError):
    """A streaming generator has no more ObjectRefs to return."""


class OufOfBandObjectRefSerializationException(RayError):
    """An ObjectRef was pickled outside of miniray's own serialization (for example with
    plain ``pickle.dumps``), which would hide it from reference counting. The misspelt
    name is Ray's."""


class UnserializableException(RayError):
    """A stored exception could not be unpickled; this carries its text instead.

    Args:
        original_stack_trace: The original exception's type, message and traceback, as
            formatted when it was pickled.
    """

    def __init__(self, original_stack_trace: str):
        super().__init__(original_stack_trace)
        self.original_stack_trace = original_stack_trace

    def __str__(self) -> str:
        return (
            "An exception could not be unpickled on this side (its class may be missing "
            "here, or its constructor may not accept its own args). Here it is as text:\n"
            f"{self.original_stack_trace}"
        )


class CrossLanguageError(RayError):
    """An exception raised in another language's worker.

    Args:
        ray_exception: A message, or an object with ``language`` and
            ``formatted_exception_string`` attributes.
    """

    def __init__(self, ray_exception: Any):
        if isinstance(ray_exception, str):
            message = ray_exception
        else:
            language = getattr(ray_exception, "language", "another language")
            text = getattr(ray_exception, "formatted_exception_string", ray_exception)
            message = f"An exception was raised in {language}:\n{text}"
        super().__init__(message)


class AuthenticationError(RayError):
    """Authentication with the cluster failed (missing or mismatched token).

    Args:
        message: What failed.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return str(self.message)


class RpcError(RayError):
    """A call between miniray processes failed.

    Args:
        message: What failed.
        rpc_code: A transport-specific status code, if any.
    """

    def __init__(self, message: str, rpc_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.rpc_code = rpc_code

    def __str__(self) -> str:
        return str(self.message)


# --- System errors ------------------------------------------------------------------------------


class RaySystemError(RayError):
    """miniray itself failed, or was used before it was started.

    Args:
        client_exc: What went wrong (a message or an exception).
        traceback_str: The traceback of the failure, if any.
    """

    def __init__(self, client_exc: Any, traceback_str: str | None = None):
        super().__init__(client_exc)
        self.client_exc = client_exc
        self.traceback_str = traceback_str

    def __str__(self) -> str:
        message = f"System error: {self.client_exc}"
        if self.traceback_str:
            message += f"\ntraceback: {self.traceback_str}"
        return message


class RayChannelError(RaySystemError):
    """A compiled-graph channel failed."""


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    """A compiled-graph channel operation timed out. Also a builtin ``TimeoutError``."""


class RayCgraphCapacityExceeded(RaySystemError):
    """A compiled-graph channel's buffer is full."""


class RayDirectTransportError(RaySystemError):
    """A direct (device-to-device) object transfer failed."""


class StreamingGeneratorReplayInconsistentError(RaySystemError):
    """A retried streaming generator yielded different values than its first run."""


# Module attributes of Ray's exceptions module, not in ``__all__`` (which lists the classes).
# The language of a task's code, as Ray's exceptions module names it (an ``int``, the
# protobuf enum value: ``ray.exceptions.PYTHON == 0``; ``miniray.Language.PYTHON`` is the
# worker-language object).
PYTHON = 0

# Ray's own list of the error types a task or ``get`` can raise, in Ray 2.60's order.
RAY_EXCEPTION_TYPES = [
    PlasmaObjectNotAvailable, RayError, RayTaskError, WorkerCrashedError, RayActorError,
    ObjectStoreFullError, ObjectLostError, ObjectFetchTimedOutError,
    ReferenceCountingAssertionError, ObjectReconstructionFailedError, OwnerDiedError,
    GetTimeoutError, AsyncioActorExit, RuntimeEnvSetupError, TaskPlacementGroupRemoved,
    ActorPlacementGroupRemoved, PendingCallsLimitExceeded, LocalRayletDiedError,
    TaskUnschedulableError, ActorDiedError, ActorUnschedulableError, ActorUnavailableError,
    RayChannelError, RayChannelTimeoutError, OufOfBandObjectRefSerializationException,
    RayCgraphCapacityExceeded, UnserializableException, ActorAlreadyExistsError,
    ActorHandleNotFoundError, AuthenticationError,
]
