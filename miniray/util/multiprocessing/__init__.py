"""``miniray.util.multiprocessing``: a ``multiprocessing.Pool`` drop-in running on actors.

Mirrors ``ray.util.multiprocessing`` (Ray 2.60): ``Pool``, ``TimeoutError`` and
``JoinableQueue`` (the standard library's, as Ray re-exports it).
"""

from __future__ import annotations

from multiprocessing import JoinableQueue

from miniray.util.multiprocessing.pool import Pool, TimeoutError

__all__ = ["Pool", "TimeoutError", "JoinableQueue"]
