"""Reporting one call's outcome: the RESULT message and errors as bytes, shared by the worker's
task loop (``worker_main.py``) and the actor host (``actor_host.py``).

Owns: the RESULT tuple's layout on the worker side, pickling an error that may itself not
pickle, and flushing the user's output before a result goes out (so output is forwarded before
the caller sees the result). Does not own: running the call.
Called by: ``worker_main._Worker`` and ``actor_host.ActorHost``.
"""

from __future__ import annotations

import sys

from miniray._private.core import protocol, serialization


def result_message(task_id: bytes, results: list, retryable: bool) -> tuple:
    """(RESULT, task_id, [(kind, payload)], retryable, [ids of refs inside each value])."""
    contained = [item[2] if len(item) > 2 else () for item in results]
    plain = [item[:2] for item in results]
    return (protocol.RESULT, task_id, plain, retryable, contained if any(contained) else None)


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
