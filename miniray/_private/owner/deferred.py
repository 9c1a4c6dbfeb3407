"""Work decided under the owner's lock and done after it: the house rule "decide under a
lock, act after it" as one mechanism.

Owns: the owner's lock, the queue of actions decided while it was held (ledger transactions,
fork requests, socket writes that may block), and running them in order, by one thread at a
time, once the lock is free: by the thread that decided them when it lets go (``locked()``),
else by whoever runs the queue next (the owner's I/O thread after each turn). Does not own:
what the actions do, or waking the I/O thread (the owner's ``defer`` does that).
Called by: ``owner.Owner``, and through ``Owner.locked()`` / ``Owner.defer`` every component
that takes the owner's lock.

::

    with work.locked():          # decide
        work.defer(action)       # ... what to do once the lock is free
    # lock released ──► run(): actions in order; one thread at a time; an action that
    #                   defers more has it run by the same loop; ``run(wait=True)`` returns
    #                   only once everything deferred so far has run, by whichever thread

Example:
    >>> work = DeferredWork()
    >>> done = []
    >>> with work.locked():
    ...     work.defer(lambda: done.append(work.lock.locked()))
    >>> done  # ran after the lock was released
    [False]
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

logger = logging.getLogger(__name__)

__all__ = ["DeferredWork"]


class _Locked:
    """The lock as a context manager that runs the deferred work after releasing it."""

    __slots__ = ("_work", "_lock")

    def __init__(self, work: DeferredWork):
        self._work = work
        self._lock = work.lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()
        if self._work.queue:
            self._work.run()


class DeferredWork:
    """``lock``: the owner's lock. ``queue``: the actions decided under it, in order (sized:
    the I/O thread tests it before calling ``run``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque[Callable[[], None]] = collections.deque()
        self._runner = threading.Lock()  # one thread runs the queue at a time
        self._running_thread: int | None = None
        self._locked = _Locked(self)

    def locked(self) -> _Locked:
        """``with work.locked():`` holds the lock, then runs what was deferred under it."""
        return self._locked

    def defer(self, action: Callable[[], None]) -> None:
        """*Locked.* Run ``action`` once the lock is released."""
        self.queue.append(action)

    def run(self, wait: bool = False) -> None:
        """*Not locked.* Run the deferred actions, in order. If another thread is running
        them, that one also runs what was just added (it loops until none is left); so does
        this thread's own loop, when this is called from an action. ``wait``: return only
        once what was deferred so far has run, by whichever thread. An action that raises is
        logged (a bug) and the next one runs."""
        queue = self.queue
        if not queue and not wait:
            return
        me = threading.get_ident()
        if self._running_thread == me:
            return
        if not self._runner.acquire(blocking=wait):
            return
        self._running_thread = me
        try:
            while queue:
                try:
                    action = queue.popleft()
                except IndexError:
                    break
                try:
                    action()
                except Exception:
                    logger.exception("miniray bug: error in deferred owner work")
        finally:
            self._running_thread = None
            self._runner.release()
        if queue:  # added after the loop looked, while another thread found it busy
            self.run()
