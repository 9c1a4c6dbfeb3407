"""Reporting one call's outcome: the RESULT message and errors as bytes, shared by the worker's
task loop (``worker_main.py``) and the actor host (``actor_host.py``).

Owns: the RESULT tuple's layout on the worker side, the RayTaskError a failed call sends (with
the user's frames only, Ray's wording for arguments that could not be loaded, a
KeyboardInterrupt read as a cancellation), pickling an error that may itself not pickle,
``sys.exit()`` in user code ending the worker process, and flushing the user's output and the
metrics it recorded before a result goes out (so the caller that sees the result also sees
them). Does not own:
running the call.
Called by: ``worker_main._Worker`` and ``actor_host.ActorHost``.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from time import time_ns
from typing import TYPE_CHECKING, Callable, NoReturn

from miniray._private.core import ids, metric_values, protocol, serialization
from miniray._private.core.dependency_errors import INPUTS_FAILED
from miniray._private.core.timeline_events import TIMES

if TYPE_CHECKING:
    from miniray.exceptions import RayTaskError


# The session directory metric snapshots go to (``host/metric_files.py``); set at start.
metrics_session_dir = ""
# Threaded and async actors send results from several threads: one writer of the file at a
# time, so a snapshot never replaces a newer one half-written.
_metrics_write_lock = threading.Lock()


def flush_metrics() -> None:
    """Write this process's metric values if it recorded any since the last flush. A process
    that never records pays one attribute read per result."""
    if not metric_values.RECORDER.dirty:
        return
    from miniray._private.host import metric_files  # lazy: only processes that record load it

    try:
        with _metrics_write_lock:
            generation, snapshot = metric_values.RECORDER.snapshot_with_generation()
            metric_files.write_snapshot(metrics_session_dir, os.getpid(), snapshot)
            metric_values.RECORDER.mark_flushed(generation)
    except OSError:  # the session is being removed: nothing is left to read them
        pass


def is_retryable(error: BaseException, retry_exceptions) -> bool:
    """Whether a task's or actor call's ``error`` is one its ``retry_exceptions`` names:
    True for any Exception, else the pickled tuple of exception classes. Never a
    KeyboardInterrupt (a cancel)."""
    if not retry_exceptions or isinstance(error, KeyboardInterrupt):
        return False
    if retry_exceptions is True:
        return isinstance(error, Exception)
    try:
        allowed = serialization.loads(retry_exceptions)
    except Exception:  # noqa: BLE001 - classes that do not load here retry nothing
        return False
    return isinstance(error, tuple(allowed))


def result_message(task_id: bytes, results: list, retryable: bool,
                   times: tuple | None = None) -> tuple:
    """(RESULT, task_id, [(kind, payload)], retryable, [ids of refs inside each value],
    times). ``times``: ``time_ns()`` when the call started, when its arguments were loaded
    and when it returned; the end is taken here, the last moment before the result goes
    out; sent packed (``timeline_events.TIMES``). None for a call that never ran."""
    if metric_values.RECORDER.dirty:
        flush_metrics()
    if len(results) == 1:  # the common case, without two list comprehensions (calls)
        item = results[0]
        contained = [item[2] if len(item) > 2 else ()]
        plain = [item[:2]]
    else:
        contained = [item[2] if len(item) > 2 else () for item in results]
        plain = [item[:2] for item in results]
    if times is not None:
        times = TIMES.pack(*times, time_ns())
    return (protocol.RESULT, task_id, plain, retryable, contained if any(contained) else None,
            times)


def _dumps_error(error: BaseException) -> bytes:
    try:
        return serialization.dumps(error)
    except Exception as failure:  # the error itself cannot travel: describe it instead
        from miniray.exceptions import RaySystemError

        return serialization.dumps(
            RaySystemError(f"{type(error).__name__}: {error} (unpicklable: {failure})")
        )


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class ArgumentsNotLoaded(Exception):
    """A call's arguments could not be read or unpickled in the worker (``error``).

    The task fails with Ray's error for it, ``RayTaskError(RaySystemError)`` (an actor's
    constructor: ``ActorDiedError``), built by ``task_error_for``."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def task_error_for(error: BaseException, function_name: str, traceback_str: str | None = None,
                   task_id: bytes | None = None, **fields) -> RayTaskError:
    """The RayTaskError a worker sends for a failed call. ``fields``: pid, ip, actor_id,
    actor_repr, as ``RayTaskError.from_exception`` takes them."""
    from miniray.exceptions import RaySystemError, RayTaskError, TaskCancelledError

    if isinstance(error, KeyboardInterrupt):
        # Ray cancels a running task with a KeyboardInterrupt, so one raised by user code
        # reads as a cancelled task; sent back as it is, get() would re-raise it in the
        # driver as if the user had pressed Ctrl-C.
        cancelled = TaskCancelledError(ids.TaskID(task_id) if task_id else None)
        traceback_str = (_user_traceback(error).rstrip("\n")
                         + f"\n{_qualified(TaskCancelledError)}: {cancelled}")
        error = cancelled
    elif isinstance(error, TaskCancelledError) and not error.task_id and task_id:
        # Injected into the running task as a bare class: name the task, as Ray's does.
        error.task_id = ids.TaskID(task_id)
        error.args = (error.task_id,)
        if traceback_str is not None:
            traceback_str = _user_traceback(error)
    elif isinstance(error, ArgumentsNotLoaded):
        failure = error.error
        # Ray's wording, then the unpickling error with the user's frames only.
        error = RaySystemError(
            f"Could not deserialize an argument of {function_name} in its worker: "
            f"{type(failure).__name__}: {failure}. If it refers to a module, that module "
            "must be importable in the worker too.",
            traceback_str=_user_traceback(failure).rstrip("\n"),
        )
        traceback_str = (
            "Traceback (most recent call last):\n"
            f"  {INPUTS_FAILED}\n"
            f"{_qualified(type(error))}: {error}"
        )
    return RayTaskError.from_exception(error, function_name, traceback_str=traceback_str,
                                       **fields)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def exit_status(code) -> int:
    """The process exit status ``sys.exit(code)`` gives in a plain interpreter: None is 0, an
    int (bools too) is itself as the OS truncates it, anything else (printed) is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def exit_for_system_exit(error: SystemExit, what: str,
                         before_exit: Callable[[], None] | None = None) -> NoReturn:
    """``sys.exit()`` in user code ends the worker process, as it does in Ray: a task's
    worker crash is retried while ``max_retries`` allows, an actor dies (or restarts).
    ``before_exit`` runs after the line saying so (an actor's orderly end: its
    ``__ray_shutdown__`` and ``atexit`` handlers).

    Never sent back as the task's error: re-raised by the driver's ``get()``, a SystemExit
    would end the driver."""
    status = exit_status(error.code)
    call = "sys.exit()" if error.code is None else f"sys.exit({error.code!r})"
    try:
        print(f"{call} in {what}: the worker process exits with code {status}.",
              file=sys.stderr)
    except Exception:
        pass
    if before_exit is not None:
        before_exit()
    _flush_std()
    os._exit(status)


def _user_traceback(error: BaseException) -> str:
    tb = error.__traceback__
    # Skip miniray's own frames, so the traceback starts in user code.
    while tb is not None and _is_private_frame(tb.tb_frame):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _is_private_frame(frame) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(_PRIVATE_DIR)


# Every module of miniray._private, in whichever subpackage (a frame of user code never is).
_PRIVATE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
