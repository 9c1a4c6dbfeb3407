"""The I/O thread: one epoll loop over file descriptors, with timers.

Owns: the ``miniray-io`` thread, the epoll set and its fd → handler map, a wake-up pipe, and a
timer heap. Does not own: what a handler does (the owner's methods) or the lock the handlers
take (the owner's; timers and housekeeping run with it held).
Called by: owner.py.

::

    loop:  epoll.poll(timeout = next timer, or the idle hint)
             (an fd paused with ``pause_read`` is read by another thread meanwhile)
             └─ handler(fd) for every ready fd          (handlers take the lock themselves)
           with lock: due timers, then housekeeping()

A handler or timer that raises is logged as a miniray bug; the loop keeps going, so one bad
message never silences every later result.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time
from typing import Callable

logger = logging.getLogger(__name__)

_FOREVER = float("inf")

# ``send_soon``: frames held in a socket's outbox for the I/O thread before the caller writes
# them itself (a write gathers up to 64 frames).
SOON_FRAMES = 64


class Reactor:
    def __init__(self, lock: threading.Lock, housekeeping: Callable[[], None],
                 idle_hint: Callable[[], float | None],
                 after_unlock: Callable[[], None] | None = None, pending=None):
        self._lock = lock
        self._housekeeping = housekeeping
        self._after_unlock = after_unlock
        self._pending = pending  # sized: after_unlock is called only when it is not empty
        self._idle_hint = idle_hint
        self._epoll = select.epoll()
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._writers: dict[int, Callable[[int], None]] = {}
        # fds another thread reads for a while (``pause_read``): out of the epoll set, or
        # watched for EPOLLOUT alone while a write waits.
        self._paused: set[int] = set()
        # While a handler is "corked", frames wait in their socket's outbox and each socket
        # is written once at ``uncork``: the tasks sent in reply to a batch of results go in
        # one system call (guarded by the owner's lock, as every send is).
        self._corked: dict | None = None  # conn -> its on_writable
        self._timers: list = []
        self._seq = itertools.count()
        self._stopping = False
        # True from just before the loop decides how long to sleep until it wakes, when it
        # sleeps without a bound: a thread that changed what that decision reads without
        # waking the loop (owner/direct_reads.py) wakes it then (``wake``).
        self.unbounded_sleep = False
        # Likewise, when the loop will wake at the latest (``time.monotonic()``; infinite from
        # just before the decision, 0.0 while awake): such a thread wakes it if that is later
        # than the changed decision needs.
        self.sleep_until = 0.0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.register(self._wake_r, self._drain_wake)
        self._thread = threading.Thread(target=self._loop, name="miniray-io", daemon=True)
        self.ident = None  # the I/O thread's ``threading.get_ident()``, once it runs

    def start(self) -> None:
        self._thread.start()

    def register(self, fd: int, handler: Callable[[int], None]) -> None:
        self._handlers[fd] = handler
        self._epoll.register(fd, select.EPOLLIN)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd``. Call it before closing ``fd`` (and under the owner's lock), so
        the number cannot be reused in between."""
        writer = self._writers.pop(fd, None)
        paused = fd in self._paused
        self._paused.discard(fd)
        if self._handlers.pop(fd, None) is not None and (writer is not None or not paused):
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def want_write(self, fd: int, handler: Callable[[int], None]) -> None:
        """Call ``handler(fd)`` when ``fd`` (already registered for reading) is writable."""
        if fd in self._handlers and fd not in self._writers:
            self._writers[fd] = handler
            if fd in self._paused:
                self._epoll.register(fd, select.EPOLLOUT)
            else:
                self._epoll.modify(fd, select.EPOLLIN | select.EPOLLOUT)

    def done_write(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None and fd in self._handlers:
            if fd in self._paused:
                self._epoll.unregister(fd)
            else:
                self._epoll.modify(fd, select.EPOLLIN)

    def pause_read(self, fd: int) -> bool:
        """*Locked.* Stop watching ``fd`` (registered) for reading: another thread reads it
        until ``resume_read``. Its writes still go on (EPOLLOUT alone while one waits). False
        if it is not registered or already paused."""
        if fd not in self._handlers or fd in self._paused:
            return False
        try:
            if fd in self._writers:
                self._epoll.modify(fd, select.EPOLLOUT)
            else:
                self._epoll.unregister(fd)
        except (OSError, ValueError):  # the loop was closed (shutdown): nothing to pause
            return False
        self._paused.add(fd)
        return True

    def resume_read(self, fd: int) -> None:
        """*Locked.* Watch ``fd`` for reading again. epoll is level-triggered: whatever the
        other thread left unread is reported at the next ``poll``."""
        if fd not in self._paused:
            return
        self._paused.discard(fd)
        if fd not in self._handlers:
            return
        try:
            if fd in self._writers:
                self._epoll.modify(fd, select.EPOLLIN | select.EPOLLOUT)
            else:
                self._epoll.register(fd, select.EPOLLIN)
        except (OSError, ValueError):  # the loop was closed meanwhile (shutdown)
            pass

    def send(self, conn, data: bytes, on_writable: Callable[[int], None]) -> None:
        """Queue ``data`` on ``conn`` (a ``FramedSocket`` registered here) without blocking;
        what does not fit now is written when it is writable (``on_writable`` calls
        ``flush``). OSError if the peer is gone (not while corked: ``uncork``)."""
        corked = self._corked
        if corked is not None:
            conn.queue(data)
            corked[conn] = on_writable
            return
        conn.queue(data)  # send_nowait(), inlined: one call fewer per task sent
        if not conn.flush():
            self.want_write(conn.fd, on_writable)

    def send_soon(self, conn, data: bytes, on_writable: Callable[[int], None]) -> None:
        """Like ``send``, for a peer that is busy with earlier frames: ``data`` waits in
        ``conn``'s outbox and is written with the frames queued after it, by the I/O thread
        once it runs (``on_writable``: the socket is writable), or by this call once
        ``SOON_FRAMES`` frames wait. A burst of calls to one busy actor then costs a write
        per batch instead of one per call."""
        corked = self._corked
        if corked is not None:
            conn.queue(data)
            corked[conn] = on_writable
            return
        conn.queue(data)
        if len(conn.outbox) >= SOON_FRAMES:
            if not conn.flush():
                self.want_write(conn.fd, on_writable)
            return
        self.want_write(conn.fd, on_writable)

    def cork(self) -> None:
        """*Locked.* Hold what is sent from now on until ``uncork``."""
        if self._corked is None:
            self._corked = {}

    def uncork(self) -> None:
        """*Locked.* Write what was held, one system call per socket where it fits; a socket
        whose peer is gone is skipped (its worker's exit is reported apart)."""
        corked, self._corked = self._corked, None
        for conn, on_writable in (corked or {}).items():
            try:
                if not conn.flush():
                    self.want_write(conn.fd, on_writable)
            except OSError:
                pass

    def flush(self, fd: int, conn) -> None:
        """For an ``on_writable`` handler: continue ``conn``'s outbox, and stop watching
        ``fd`` once it is empty, broken, or ``conn`` is None (gone)."""
        try:
            done = conn is None or conn.flush()
        except OSError:
            done = True
        if done:
            self.done_write(fd)

    def in_io_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` with the lock held after ``delay`` seconds (caller holds the lock)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), callback))
        if threading.current_thread() is not self._thread:
            self.wake()

    def _drain_wake(self, fd: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass

    def _loop(self) -> None:
        self.ident = threading.get_ident()
        epoll = self._epoll
        handlers = self._handlers
        while not self._stopping:
            self.unbounded_sleep = True  # set before the look: a change after it is seen
            self.sleep_until = _FOREVER
            timeout = -1.0
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            hint = self._idle_hint()
            if hint is not None:
                timeout = hint if timeout < 0 else min(timeout, hint)
            if timeout >= 0:
                self.unbounded_sleep = False
                self.sleep_until = time.monotonic() + timeout
            try:
                events = epoll.poll(timeout)
            except InterruptedError:
                continue
            except (OSError, ValueError):
                if self._stopping:
                    break
                raise
            self.unbounded_sleep = False
            self.sleep_until = 0.0
            writers = self._writers
            for fd, mask in events:
                try:
                    if mask & select.EPOLLOUT:
                        writer = writers.get(fd)
                        if writer is not None:
                            writer(fd)
                    if mask & ~select.EPOLLOUT:
                        handler = handlers.get(fd)
                        if handler is not None:
                            handler(fd)
                except Exception:
                    logger.exception("miniray bug: error in the I/O thread handling fd %s", fd)
            try:
                with self._lock:
                    if self._timers:
                        now = time.monotonic()
                        while self._timers and self._timers[0][0] <= now:
                            _, _, callback = heapq.heappop(self._timers)
                            callback()
                    self._housekeeping()
            except Exception:
                logger.exception("miniray bug: error in the I/O thread's timers or housekeeping")
            if self._after_unlock is not None and (self._pending is None or self._pending):
                self._after_unlock()  # what they decided to do once the lock is free

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def close(self) -> None:
        self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
