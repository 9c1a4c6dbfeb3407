"""The actor service's one thread that keeps its actors' large results on their node.

Owns: the queue of replies whose large results the actor service keeps on its own node for
drivers on other hosts (``actor_service._keep_here``), the one worker thread that serves it
in order, how many replies each driver has in it (``waiting``), and when the service's link
to its own node may be asked for again after it could not be had (``LinkRetry``, pure).
Does not own: what keeping a result does (the service's ``work`` callable) or the replies
themselves (``actor_service.py`` sends them on its I/O thread).
Called by: ``node/actor_service.ActorService`` (``put`` and ``done`` under the owner's
lock, on its I/O thread; ``close`` at teardown).

Why one thread: keeping a result is a round trip to the node (a KEEP on the link) and a
rename; a thread per reply grew without bound under a burst of calls. One FIFO thread
bounds it and keeps each driver's replies in the order their calls answered: while a
driver has a reply queued, its later replies, kept or not, queue behind it (``waiting``),
so a small result never overtakes a large one that answered first::

    I/O thread (locked)            worker thread (not locked)        I/O thread (locked)
    _reply ── put(job) ──► queue ──► work(job): keep the segments ──► call_later(0):
           (waiting[token] += 1)       on the node, then post ──►     send, done(token)
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

__all__ = ["LinkRetry", "ReplyKeeper", "RETRY_S"]

logger = logging.getLogger(__name__)

# After the service could not have its link to its own node, results cross at once until
# this long has passed; then the link is asked for again (at most this often).
RETRY_S = 5.0


class LinkRetry:
    """Pure: when the service's link to its own node may be asked for again.

    Example:
        >>> retry = LinkRetry(5.0)
        >>> retry.may_try(100.0)
        True
        >>> retry.trying(100.0); retry.may_try(100.1)
        False
        >>> retry.failed(101.0); retry.may_try(105.9), retry.may_try(106.0)
        (False, True)
        >>> retry.failures
        1
    """

    def __init__(self, every_s: float = RETRY_S):
        self.every_s = every_s
        self.not_before = 0.0
        self.failures = 0

    def may_try(self, now: float) -> bool:
        return now >= self.not_before

    def trying(self, now: float) -> None:
        """An attempt starts: no other until it failed and ``every_s`` passed (replies
        cross at once meanwhile instead of queueing behind it)."""
        self.not_before = now + self.every_s

    def failed(self, now: float) -> None:
        self.failures += 1
        self.not_before = now + self.every_s

    def had(self) -> None:
        """The attempt had the link: once it is lost, asked for again at once."""
        self.not_before = 0.0


class ReplyKeeper:
    """One daemon thread, started at the first ``put``, that runs ``work(job)`` for each job
    in the order put; ``close`` ends it (jobs not begun are dropped: the process ends)."""

    def __init__(self, work: Callable[[tuple], None], name: str = "miniray-svc-keep"):
        self._work = work
        self._name = name
        self._jobs: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        # driver token -> its replies put and not yet sent (``done``): the caller's lock only
        self.waiting: collections.Counter = collections.Counter()

    def put(self, token: str, job: tuple) -> bool:
        """*Caller's lock.* Queue ``job`` for driver ``token``; False once closed."""
        with self._cond:
            if self._closed:
                return False
            self._jobs.append(job)
            self.waiting[token] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
            self._cond.notify()
        return True

    def done(self, token: str) -> None:
        """*Caller's lock.* One reply of ``token``'s that ``put`` queued was sent."""
        self.waiting[token] -= 1
        if self.waiting[token] <= 0:
            del self.waiting[token]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._jobs.popleft()
            try:
                self._work(job)
            except Exception:  # noqa: BLE001 - the next replies must still go
                logger.exception("keeping a reply's results failed")

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread after the job it is in (waits up to ``timeout``)."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def statistics(self) -> dict:
        with self._cond:
            return {"queued": len(self._jobs), "thread": self._thread is not None
                    and self._thread.is_alive()}

    def __repr__(self) -> str:
        return f"<ReplyKeeper queued={len(self._jobs)} drivers={len(self.waiting)}>"
