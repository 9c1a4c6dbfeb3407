"""The error of a call whose argument failed.

Owns: turning the error an argument object holds into the error of the call that needed it,
worded and chained as Ray 2.60 words and chains it. Does not own: when a call fails for its
arguments (the owner decides: ``owner/tasks.py`` for tasks, ``owner/actors.py`` for actor
calls) or errors raised while arguments are unpickled in the worker (``worker/execute.py``).
Called by: the owner, with its lock held (pure: no I/O).

Mirrors what Ray 2.60 stores for such a call: a ``RayTaskError`` named after the call, whose
traceback says "At least one of the input arguments for this task could not be computed:"
followed by the argument's error, and whose ``cause`` is the original user exception however
many calls it went through, so ``get`` raises ``RayTaskError(<user exception>)`` and ``except
<user exception>`` still catches it. Differs: Ray builds it in the worker that would have run
the call, so its header names that worker's pid (and the actor's repr); miniray fails the call
in the owner without running it, so the header names the driver's pid.
"""

from __future__ import annotations

from miniray._private.core import serialization
from miniray.exceptions import RayTaskError

__all__ = ["INPUTS_FAILED", "dependency_error", "dependency_error_bytes"]

INPUTS_FAILED = "At least one of the input arguments for this task could not be computed:"


def dependency_error(upstream: BaseException, function_name: str) -> RayTaskError:
    """The error of the call ``function_name`` whose argument holds ``upstream``.

    Example:
        >>> first = RayTaskError("produce", "Traceback (most recent call last):\\n"
        ...                      "ValueError: bad", ValueError("bad"), pid=7)
        >>> second = dependency_error(first, "consume")
        >>> type(second.cause).__name__, str(second).splitlines()[1]
        ('ValueError', '  At least one of the input arguments for this task could not be computed:')
    """
    if isinstance(upstream, RayTaskError):
        # Read from __dict__: a dual instance's class may define a property of that name.
        cause = vars(upstream).get("cause", upstream)
        shown = f"{RayTaskError.__module__}.{RayTaskError.__qualname__}"
    else:
        cause = upstream
        shown = f"{type(upstream).__module__}.{type(upstream).__qualname__}"
    traceback_str = f"Traceback (most recent call last):\n  {INPUTS_FAILED}\n{shown}: {upstream}"
    return RayTaskError(function_name, traceback_str, cause)


def dependency_error_bytes(upstream: bytes, function_name: str) -> bytes:
    """``dependency_error`` from and to the stored (pickled) form. An argument's error that
    cannot be unpickled here is passed on unchanged: ``get`` reports that problem itself."""
    try:
        error = serialization.loads(upstream)
    except Exception:
        return upstream
    if not isinstance(error, BaseException):
        return upstream
    return serialization.dumps(dependency_error(error, function_name))
