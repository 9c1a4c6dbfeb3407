"""The actor service's few threads that keep its actors' large results on their node.

Owns: the queues of replies whose large results the actor service keeps on its own node for
drivers on other hosts (``actor_service._keep_here``), one queue per driver, served in order
by a small pool of threads (at most ``THREADS``), how many replies each driver has queued or
not yet sent (``waiting``), what ``close`` hands back (the jobs not begun), and when the
service's link to its own node may be asked for again after it could not be had
(``LinkRetry``, pure). Does not own: what a job does (the service's ``work`` callable) or the
replies themselves (``actor_service.py`` sends them on its I/O thread).
Called by: ``node/actor_service.ActorService`` (``put`` and ``done`` under the owner's
lock, on its I/O thread; ``stop`` under it and ``join`` after it at teardown).

Why a pool, one queue per driver: keeping a result is a round trip to the node (a KEEP on
the link) and a rename; a thread per reply grew without bound under a burst of calls, and
one FIFO for every driver made each driver wait for every other's keeps. Each driver's
replies stay in the order their calls answered: while a driver has a reply queued or not
yet sent, its later replies, kept or not, its streaming values and the output of the
actors it created queue behind it (``waiting``), so none overtakes another; one driver's
job runs at a time, and a driver whose job is slow holds one thread, not the others'
replies::

    I/O thread (locked)            pool thread (not locked)          I/O thread (locked)
    _reply ── put(token, job) ──►  queue of token ──► work(job) ──►  call_later(0):
           (waiting[token] += 1)   (its jobs one by one, in order)   send, done(token)

Teardown (``stop``, then ``join`` outside the caller's lock): no job begins after it; the
jobs not begun are handed back to the caller, in each driver's order, which sends each as a
plain value or fails it (nothing is dropped silently); a job in progress ends as usual (its
reply is posted to the I/O thread).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

__all__ = ["LinkRetry", "ReplyKeeper", "RETRY_S", "THREADS"]

logger = logging.getLogger(__name__)

# After the service could not have its link to its own node, results cross at once until
# this long has passed; then the link is asked for again (at most this often).
RETRY_S = 5.0
THREADS = 4  # the keeper's threads at most: drivers beyond that many busy at once wait


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
    """Per-driver FIFO queues served by at most ``threads`` daemon threads, started as
    drivers' jobs become ready while none is idle; ``close`` ends them and hands back the
    jobs not begun.

    Example (``work`` records; one driver's jobs stay in order):
        >>> done = []
        >>> keeper = ReplyKeeper(done.append, threads=2)
        >>> keeper.put("a", ("a", 1)), keeper.put("b", ("b", 1)), keeper.put("a", ("a", 2))
        (True, True, True)
        >>> keeper.close(5.0) if keeper.drain(5.0) else "stuck"
        []
        >>> [job for job in done if job[0] == "a"], keeper.put("a", ("a", 3))
        ([('a', 1), ('a', 2)], False)
    """

    def __init__(self, work: Callable[[tuple], None], name: str = "miniray-svc-keep",
                 threads: int = THREADS):
        self._work = work
        self._name = name
        self._max_threads = max(1, threads)
        self._queues: dict[str, collections.deque] = {}  # token -> its jobs not begun
        self._ready: collections.deque = collections.deque()  # tokens whose next may begin
        self._running: set[str] = set()  # tokens with a job in progress
        self._cond = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a ready driver
        self._closed = False
        # driver token -> its replies put and not yet sent (``done``): changed under the
        # caller's lock and this condition's
        self.waiting: collections.Counter = collections.Counter()

    def put(self, token: str, job: tuple, behind: bool = False) -> bool:
        """*Caller's lock.* Queue ``job`` for driver ``token``, after its earlier ones;
        False once closed (the caller sends it at once). ``behind``: only when ``token``
        has a reply waiting, else False (the caller sends it at once); decided under the
        keeper's own lock, so a caller that may not hold its lock (an actor's output,
        read by the I/O thread) can ask: it never changes which drivers are waiting."""
        with self._cond:
            if self._closed or (behind and token not in self.waiting):
                return False
            queue = self._queues.get(token)
            becomes_ready = not queue and token not in self._running
            if becomes_ready and len(self._ready) >= self._idle and \
                    len(self._threads) < self._max_threads and not self._start_thread():
                if not self._threads:  # nothing would ever serve it: the caller sends it
                    return False  # (no job of anyone's is queued: no order to keep)
            if queue is None:
                queue = self._queues[token] = collections.deque()
            queue.append(job)
            self.waiting[token] += 1
            if becomes_ready:
                self._ready.append(token)
                self._cond.notify()
        return True

    def _start_thread(self) -> bool:
        """*Under the condition's lock.* One more thread, counted once it started; False
        when it could not start (the threads there are serve the jobs, later)."""
        thread = threading.Thread(target=self._run, daemon=True, name=self._name)
        try:
            thread.start()
        except RuntimeError as failed:  # "can't start new thread": the process's limit
            logger.warning("the actor service could not start a thread to keep replies "
                           "(%d running): %s", len(self._threads), failed)
            return False
        self._threads.append(thread)
        return True

    @property
    def closed(self) -> bool:
        """Whether ``stop`` ran (read under the caller's lock, which ``stop`` is under)."""
        return self._closed

    def done(self, token: str) -> None:
        """*Caller's lock.* One reply of ``token``'s that ``put`` queued was sent."""
        with self._cond:  # ``put(behind=True)`` reads ``waiting`` under it
            self.waiting[token] -= 1
            if self.waiting[token] <= 0:
                del self.waiting[token]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if self._closed:
                    return
                token = self._ready.popleft()
                job = self._queues[token].popleft()
                self._running.add(token)
            try:
                self._work(job)
            except Exception:  # noqa: BLE001 - the next replies must still go
                logger.exception("keeping a reply's results failed")
            finally:
                with self._cond:
                    self._running.discard(token)
                    queue = self._queues.get(token)
                    if queue:
                        self._ready.append(token)
                        self._cond.notify()
                    elif queue is not None:
                        del self._queues[token]
                    if not self._running and not self._ready:
                        self._cond.notify_all()  # ``drain``

    def drain(self, timeout: float) -> bool:
        """Wait until no job is queued or in progress (tests, teardown); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._ready or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 2.0) -> list[tuple]:
        """``stop`` then ``join``: the jobs not begun. A caller that settles them under
        its lock calls the two apart (``stop`` under it, ``join`` after it), so that no
        reply of its I/O thread comes between."""
        left = self.stop()
        self.join(timeout)
        return left

    def stop(self) -> list[tuple]:
        """*Caller's lock.* No job begins from now on (``put`` returns False); the threads
        end after the jobs they are in. Returns the jobs not begun, each driver's in
        order, for the caller to send at once or fail (they are still counted in
        ``waiting``)."""
        with self._cond:
            self._closed = True
            left = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._ready.clear()
            self._cond.notify_all()
        return left

    def join(self, timeout: float) -> None:
        """*Not under the caller's lock* (a job in progress takes it to post its reply).
        The threads waited for, up to ``timeout`` in all, after ``stop``."""
        with self._cond:
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def statistics(self) -> dict:
        with self._cond:
            return {"queued": sum(len(queue) for queue in self._queues.values()),
                    "drivers": len(self._queues), "running": len(self._running),
                    "threads": sum(1 for thread in self._threads if thread.is_alive())}

    def __repr__(self) -> str:
        return (f"<ReplyKeeper drivers={len(self._queues)} threads={len(self._threads)} "
                f"waiting={len(self.waiting)}>")
