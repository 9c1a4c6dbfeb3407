"""A ``get()`` that reads its own result from the worker's socket: a round trip without the
I/O thread.

Owns: the choice of when a waiting caller may read a worker's data socket itself
(``may_read``, pure), the claim of that socket (taken from the I/O thread's epoll set under
the owner's lock, given back after), and the bounded read loop. Does not own: what is done
with the frames read (``Owner._handle_frames``: exactly what the I/O thread does with them),
the epoll set (``transport/reactor.py``), the waiter (``object_table.py``).
Called by: ``ObjectTable.get_serialized`` (``claim`` under the owner's lock, ``read`` after
it), and the owner's ``_idle_hint`` (``active``).

Why: in ``get(f.remote())`` the result used to wake the I/O thread (epoll), which read and
handled it and woke the caller (a futex), which then waited for the GIL until the I/O thread
went back to sleep: two wake-ups and a GIL hand-off per round trip. A caller that reads the
socket itself is woken once, by the data.

::

    caller (owner's lock held)            caller (no lock)                      after
    claim(id): task running on a     ──►  with worker.read_lock:           ──►  lock: resume fd,
      local task worker, nobody else        poll(fd, ≤ WINDOW_S)                 wake a sleeping
      reads it  →  pause fd in epoll        frames → handle_frames               I/O thread
                                            until the waiter fired, EOF,         then waiter.wait
                                            or the window ends                   (the rest)

Rules that keep every message and wake-up:
1. The socket is read only by the holder of ``worker.read_lock``, and frames are handled
   before it is released: the I/O thread only *tries* the lock (it skips a socket a caller
   reads; the caller handles everything it reads, in order).
2. The fd leaves the epoll set before the caller reads and comes back after it released the
   read lock: epoll is level-triggered, so what is left in the socket is reported then.
3. The caller's waiter stays registered on the entry the whole time: whoever handles the
   result (the caller, or the I/O thread if it read it first) fires it, and the caller ends
   with ``waiter.wait``; a result that comes another way (a retry on another worker after
   this one died: EOF ends the read) is never missed, only waited for as before.
4. The read lasts at most ``WINDOW_S``: a long task's result comes through the I/O thread,
   which is then free to read the socket again.
5. A KeyboardInterrupt in the caller while frames wait to be handled: the rest are handled
   before it propagates (a handler interrupted half-way is as a submission interrupted
   half-way).
6. The I/O thread may have gone to sleep without a bound, or for longer than a lease's
   linger, while the lease was busy; the caller made it idle, so it wakes the I/O thread
   (the linger timer needs it), at most once per such sleep (``Reactor.unbounded_sleep``,
   ``Reactor.sleep_until``); while reads go on, the idle hint keeps the I/O thread's sleeps
   bounded. When it wakes within ``prompt`` (woken now, or asleep until then), refs dropped
   from now on need no wake-up of their own (``ObjectTable.wake_pending``, set under the
   owner's lock before the wake: the housekeeping that follows every wake-up takes the lock,
   applies them and clears it), as after a result the I/O thread read itself.
"""

from __future__ import annotations

import select
import time
from threading import get_ident
from typing import Callable

from miniray._private.core.scheduling import T_RUNNING
from miniray._private.owner.workers import WorkerSlot


def may_read(task, closed: bool, in_io_thread: bool) -> bool:
    """Whether a caller waiting for ``task``'s result may read its worker's socket: the task
    runs on a local task worker (not an actor, not another host's) that is alive and that
    no other caller reads, the session is open, and the caller is not the I/O thread."""
    if task is None or task.state != T_RUNNING or closed or in_io_thread:
        return False
    worker = task.worker
    return (type(worker) is WorkerSlot and not worker.direct and not worker.dead
            and worker.actor is None and worker.pid is not None)


class DirectReads:
    """Given at construction: the owner's ``lock``, the task records by id
    (``tasks_by_id``), the ``reactor``, ``handle_frames(worker, frames)`` (the I/O thread's
    handling; it removes each frame from the list as it starts it), ``deferred`` (the
    owner's queue of work for after the lock) with ``run_deferred``, and ``closed()``."""

    WINDOW_S = 0.05

    def __init__(self, *, lock, tasks_by_id: dict, reactor, handle_frames: Callable,
                 deferred, run_deferred: Callable[[], None], closed: Callable[[], bool],
                 objects=None, linger: float = 0.0, prompt: float = 0.0):
        self._lock = lock
        self._objects = objects  # the owner's ObjectTable: its wake_pending (rule 6)
        self._linger = linger  # an idle lease's linger: a longer sleep is woken (rule 6)
        self._prompt = prompt  # a sleep at most this long frees dropped refs soon enough
        self._tasks_by_id = tasks_by_id
        self._reactor = reactor
        self._handle_frames = handle_frames
        self._deferred = deferred
        self._run_deferred = run_deferred
        self._closed = closed
        self.active = 0  # callers reading now (locked)
        self.reads = 0  # reads made (statistics)

    def claim(self, object_id: bytes):
        """*Locked.* The worker whose socket the caller may read for ``object_id`` (a task's
        return), taken out of the I/O thread's epoll set; None: wait as before."""
        task = self._tasks_by_id.get(object_id[:24])
        reactor = self._reactor
        if not may_read(task, self._closed(), get_ident() == reactor.ident):
            return None
        worker = task.worker
        return worker if self.claim_worker(worker) else None

    def claim_worker(self, worker: WorkerSlot) -> bool:
        """*Locked.* Take ``worker``'s socket out of the I/O thread's epoll set for this
        caller to ``read`` (``claim``'s second half; also init()'s warm-up round trip,
        ``OwnerEvents.warm_up_round_trip``). False: another caller reads it, or it is not
        watched (closed)."""
        if worker.direct or not self._reactor.pause_read(worker.conn.fd):
            return False
        worker.direct = True
        self.active += 1
        self.reads += 1
        return True

    def read(self, worker: WorkerSlot, waiter, timeout: float | None) -> bool:
        """*Not locked.* Read ``worker``'s socket until ``waiter`` fired (True), then, or
        once the window ended or the socket closed, wait as before for what is left of
        ``timeout`` (False: it passed)."""
        start = time.monotonic()
        window = self.WINDOW_S if timeout is None else min(timeout, self.WINDOW_S)
        end = start + window
        conn = worker.conn
        fd = conn.fd
        poller = worker.data_poll
        if poller is None:  # no OS resource: poll(2) takes the list at each call
            poller = worker.data_poll = select.poll()
            poller.register(fd, select.POLLIN)
        frames: list = []
        try:
            with worker.read_lock:  # the I/O thread may be handling what it read: wait
                try:
                    while not waiter.fired:
                        left = end - time.monotonic()
                        if left <= 0 or not poller.poll(left * 1e3):
                            break
                        frames, closed = conn.recv_ready()
                        if frames:
                            self._handle_frames(worker, frames)
                        if closed:
                            break  # the I/O thread sees the EOF again once the fd is back
                        if self._deferred:
                            self._run_deferred()
                except BaseException:
                    if frames:  # interrupted before they were all handled: none is lost
                        self._handle_frames(worker, frames)
                    raise
        finally:
            reactor = self._reactor
            with self._lock:
                worker.direct = False
                self.active -= 1
                reactor.resume_read(fd)
                until = reactor.sleep_until  # 0.0: awake, its idle hint is still to come
                now = time.monotonic()
                if reactor.unbounded_sleep or until > now + self._linger:
                    reactor.unbounded_sleep = False
                    reactor.sleep_until = 0.0
                    if self._objects is not None:
                        self._objects.wake_pending = True
                    reactor.wake()
                elif 0.0 < until <= now + self._prompt and self._objects is not None:
                    self._objects.wake_pending = True
            if self._deferred:
                self._run_deferred()
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - start))
        return waiter.wait(timeout)
