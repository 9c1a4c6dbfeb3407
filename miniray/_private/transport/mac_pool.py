"""A small pool of threads that compute large frames' MACs, several frames at once.

Owns: the process's hashing threads (``MAC_POOL``, a ``MacPool``) and the unit of work they
run (``MacJob``: one frame's HMAC, prepared with its key and sequence number by the
caller, fed the frame's payload and finished here). Does not own: the wire format, the
keys, which frames are hashed here or what a tag means (``peer_wire.py``), sockets
(``peer_channel.py``).
Called by: ``peer_wire.py`` (``FrameWriter.value``, ``FrameReader.begin_value``).

Why: HMAC-SHA256 runs about 1.5 GB/s on one core (SHA-NI) and hashlib releases the GIL
for large buffers, so a large value sent as frames of 8 MiB, each with its own sequence
number and tag, is hashed on as many cores as the pool has threads while the connection's
own thread moves the bytes.

Rules:

1. The size is ``config.peer_mac_threads()`` (``MINIRAY_PEER_MAC_THREADS``; default
   ``min(4, usable CPUs - 1)``), read when the first job is submitted. 0: no threads; every
   job is run by the thread that waits for it.
2. Threads are daemon, named ``miniray-peer-mac``, started lazily, one more only when a job
   is queued and none is idle. One idle for ``IDLE_EXIT_S`` (2 s) ends; ``stop()`` ends
   them all (teardown step 5, ARCHITECTURE.md: the driver's shutdown, once its peer
   connections are closed); a later job starts them again. A forked child starts with
   none (``os.register_at_fork``).
3. A waiter never waits for a job nobody runs: ``MacJob.result`` runs a job still queued
   itself (so a stopped pool, a pool of 0 and a busy pool all finish every job), and
   ``MacJob.cancel`` drops a queued job or waits for a running one. Either way the job
   drops its view of the payload before it reports done, so that its buffer (a segment's
   mapping) can be closed once every job of a value returned.
"""

from __future__ import annotations

import collections
import os
import threading

from miniray._private.core import config

__all__ = ["MAC_POOL", "MacJob", "MacPool"]

_QUEUED, _RUNNING, _DONE = 0, 1, 2


class MacJob:
    """One frame's MAC: ``mac`` (an hmac object already fed the key and the frame's
    sequence number) is fed ``view`` and finished by whoever runs it first: a pool thread
    or the waiter (``result``). ``seq`` and ``tag`` are the caller's (the frame's sequence
    number; the tag it arrived with, or None when sending)."""

    __slots__ = ("seq", "tag", "_mac", "_view", "_lock", "_state", "_done", "_digest",
                 "_error")

    def __init__(self, mac, view, seq: int = -1, tag: bytes | None = None):
        self.seq = seq
        self.tag = tag
        self._mac = mac
        self._view = view
        self._lock = threading.Lock()
        self._state = _QUEUED
        self._done = threading.Event()
        self._digest: bytes | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Compute the digest unless someone else took the job first."""
        with self._lock:
            if self._state != _QUEUED:
                return
            self._state = _RUNNING
        try:
            if self._mac is not None:
                self._mac.update(self._view)
                self._digest = self._mac.digest()
        except BaseException as error:  # handed to the waiter, which raises it
            self._error = error
        finally:
            self._mac = self._view = None
            self._state = _DONE
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> bytes | None:
        """The full digest (None for a job without a MAC), running the job here if no
        thread took it yet; the error it met, raised."""
        self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._digest

    def cancel(self) -> None:
        """Give the job up: a queued one never runs; a running one is waited for. On
        return no thread uses its view."""
        with self._lock:
            if self._state == _QUEUED:
                self._state = _DONE
                self._mac = self._view = None
                self._done.set()
                return
        self._done.wait()


class MacPool:
    """The hashing threads of this process (module docstring)."""

    IDLE_EXIT_S = 2.0  # a thread with nothing to do for this long ends

    def __init__(self, size: int | None = None):
        self._size = size
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._stopping = False
        self._generation = 0
        self._submitted = 0
        self._forked_hook = False

    @property
    def size(self) -> int:
        """How many threads at most (rule 1), read once."""
        if self._size is None:
            self._size = config.peer_mac_threads()
        return self._size

    def __repr__(self) -> str:
        stats = self.statistics()
        return (f"<MacPool size={stats['size']} threads={stats['threads']} "
                f"idle={stats['idle']} queued={stats['queued']}>")

    def statistics(self) -> dict:
        """A snapshot for tests and status: the size, live, idle and running threads,
        jobs queued, jobs submitted since the process started."""
        with self._cond:
            return {"size": self.size, "threads": len(self._threads), "idle": self._idle,
                    "running": self._running, "queued": len(self._queue),
                    "submitted": self._submitted}

    def submit(self, job: MacJob) -> None:
        """Queue ``job`` for a thread (rule 2); with a pool of 0, or while stopping, leave it
        to its waiter (rule 3)."""
        if self.size <= 0:
            return
        start = None
        with self._cond:
            if self._stopping:
                return
            self._queue.append(job)
            self._submitted += 1
            if self._idle == 0 and len(self._threads) < self.size:
                if not self._forked_hook:
                    os.register_at_fork(after_in_child=self._after_fork)
                    self._forked_hook = True
                start = threading.Thread(target=self._run, args=(self._generation,),
                                         daemon=True, name="miniray-peer-mac")
                self._threads.append(start)
            else:
                self._cond.notify()
        if start is not None:
            start.start()

    def _run(self, generation: int) -> None:
        queue = self._queue
        me = threading.current_thread()
        while True:
            with self._cond:
                while not queue and not self._stopping and generation == self._generation:
                    self._idle += 1
                    try:
                        woken = self._cond.wait(self.IDLE_EXIT_S)
                    finally:
                        self._idle -= 1
                    if not woken and not queue:  # idle long enough: end (rule 2)
                        if me in self._threads:
                            self._threads.remove(me)
                        return
                if self._stopping or generation != self._generation:
                    return
                job = queue.popleft()
                self._running += 1
            try:
                job.run()
            finally:
                with self._cond:
                    self._running -= 1

    def stop(self, timeout: float = 5.0) -> None:
        """End every thread (each finishes the job it runs: a frame's hash, milliseconds);
        jobs still queued are run by their waiters. Idempotent; the pool starts threads
        again on the next ``submit``."""
        with self._cond:
            if not self._threads:
                return
            self._stopping = True
            threads, self._threads = self._threads, []
            self._queue.clear()
            self._cond.notify_all()
        try:
            for thread in threads:  # one made by a submit but not started yet ends on its
                # own at its first look (its generation is old by then): never joined
                if thread.ident is not None and thread is not threading.current_thread():
                    thread.join(timeout)
        finally:
            with self._cond:
                self._stopping = False
                self._generation += 1

    def _after_fork(self) -> None:
        """In a forked child: the parent's threads do not exist here."""
        self._cond = threading.Condition(threading.Lock())
        self._queue = collections.deque()
        self._threads = []
        self._idle = self._running = 0
        self._stopping = False
        self._generation += 1


MAC_POOL = MacPool()
