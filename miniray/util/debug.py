"""``miniray.util.debug``: ``log_once``, to print a warning once per process.

Mirrors the logging helpers of ``ray.util.debug`` (Ray 2.60): ``log_once(key)`` is True the
first time a key is seen in this process and False after; ``disable_log_once_globally()``
makes it always False; ``enable_periodic_logging()`` forgets every key once a minute has
passed since the last True, so a warning comes back now and then; ``reset_log_once(key)``
forgets one key (or all). The per-process state is not shared with workers. ``Suspect`` is the
record type of Ray's memory-leak report. Differs: Ray's memory-leak test helpers themselves
(private in Ray) are not provided.

Example:
    >>> from miniray.util import log_once
    >>> log_once("doc-example-key"), log_once("doc-example-key")
    (True, False)
"""

from __future__ import annotations

import threading
import time
from collections import namedtuple

__all__ = ["Suspect", "disable_log_once_globally", "enable_periodic_logging", "log_once",
           "reset_log_once"]

# A suspected memory leak, as Ray's leak checker reports one.
Suspect = namedtuple("Suspect", ["traceback", "memory_increase", "slope", "rvalue", "hist"])

PERIOD_S = 60.0

_lock = threading.Lock()
_seen: set = set()
_disabled = False
_periodic = False
_last_true = 0.0


def log_once(key: str) -> bool:
    """True the first time ``key`` is seen in this process, False on every later call.

    Args:
        key: Names the message (its call site, say).
    """
    global _last_true
    with _lock:  # two threads asking for one key: exactly one gets True
        if _disabled:
            return False
        now = time.monotonic()
        if key not in _seen:
            _seen.add(key)
            _last_true = now
            return True
        if _periodic and now - _last_true > PERIOD_S:
            # As Ray: this call stays False; the next call of any key is a first one again.
            _seen.clear()
            _last_true = now
        return False


def disable_log_once_globally() -> None:
    """From now on ``log_once`` returns False in this process."""
    global _disabled
    _disabled = True


def enable_periodic_logging() -> None:
    """From now on ``log_once`` forgets its keys once ``PERIOD_S`` has passed since the last
    True, so each warning shows again now and then."""
    global _periodic
    _periodic = True


def reset_log_once(key: str | None = None) -> None:
    """Forget ``key`` (every key when None): the next ``log_once`` of it is True."""
    with _lock:
        if key is None:
            _seen.clear()
        else:
            _seen.discard(key)
