"""A get() that reads its own result (``owner/direct_reads.py``) and the reactor's paused
fds: when a caller may read, that it handles every frame in order, that the I/O thread
leaves a claimed socket alone and sees what is left once it is back, the window, EOF, and
an interruption with frames still to handle. No processes: a socketpair stands for the
worker."""

from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
import time
from types import SimpleNamespace

import pytest

from miniray._private.core.scheduling import T_DONE, T_RUNNING
from miniray._private.owner.direct_reads import DirectReads, may_read
from miniray._private.owner.object_table import Waiter
from miniray._private.owner.workers import WorkerSlot
from miniray._private.transport.framing import FramedSocket
from miniray._private.transport.reactor import Reactor


def frame(data: bytes) -> bytes:
    return struct.pack("!Q", len(data)) + data


def _worker(conn=None) -> WorkerSlot:
    worker = WorkerSlot(conn, None, 1)
    worker.pid = 4242
    return worker


def _task(worker, state=T_RUNNING):
    return SimpleNamespace(state=state, worker=worker)


# -- may_read: the decision -----------------------------------------------------------------
def test_a_running_task_on_a_local_task_worker_may_be_read():
    assert may_read(_task(_worker()), closed=False, in_io_thread=False)


@pytest.mark.parametrize("change", ["none", "done", "closed", "io", "direct", "dead", "actor",
                                    "no pid", "remote"])
def test_other_cases_wait_as_before(change):
    worker = _worker()
    task = _task(worker)
    closed = in_io = False
    if change == "none":
        task = None
    elif change == "done":
        task.state = T_DONE
    elif change == "closed":
        closed = True
    elif change == "io":
        in_io = True
    elif change == "direct":
        worker.direct = True  # another caller reads it
    elif change == "dead":
        worker.dead = True
    elif change == "actor":
        worker.actor = object()
    elif change == "no pid":
        worker.pid = None
    elif change == "remote":
        task.worker = SimpleNamespace(direct=False, dead=False, actor=None, pid=1)
    assert not may_read(task, closed=closed, in_io_thread=in_io)


# -- the reactor's paused fds ---------------------------------------------------------------
def _reactor():
    lock = threading.Lock()
    return lock, Reactor(lock, lambda: None, lambda: None)


def _ready(reactor, timeout=0.05):
    return [fd for fd, _ in reactor._epoll.poll(timeout)]


def test_a_paused_fd_is_not_reported_and_what_is_left_is_reported_once_back():
    a, b = socket.socketpair()
    lock, reactor = _reactor()
    try:
        reactor.register(a.fileno(), lambda fd: None)
        assert reactor.pause_read(a.fileno())
        assert not reactor.pause_read(a.fileno())  # already paused
        b.send(b"x")
        assert a.fileno() not in _ready(reactor)
        reactor.resume_read(a.fileno())
        assert a.fileno() in _ready(reactor)  # level-triggered: left unread, reported now
    finally:
        reactor.close()
        a.close()
        b.close()


def test_writes_go_on_while_paused_and_the_fd_comes_back_for_both():
    a, b = socket.socketpair()
    lock, reactor = _reactor()
    try:
        fd = a.fileno()
        reactor.register(fd, lambda fd: None)
        reactor.pause_read(fd)
        reactor.want_write(fd, lambda fd: None)  # watched for EPOLLOUT alone
        assert dict(reactor._epoll.poll(0.05)).get(fd) == select.EPOLLOUT
        b.send(b"x")
        assert dict(reactor._epoll.poll(0.05)).get(fd) == select.EPOLLOUT
        reactor.done_write(fd)  # out of the set again
        assert fd not in _ready(reactor)
        reactor.want_write(fd, lambda fd: None)
        reactor.resume_read(fd)
        assert dict(reactor._epoll.poll(0.05)).get(fd) == select.EPOLLIN | select.EPOLLOUT
        reactor.unregister(fd)  # while a writer waits
        assert fd not in _ready(reactor)
        reactor.register(fd, lambda fd: None)
        reactor.pause_read(fd)
        reactor.unregister(fd)  # paused, no writer: nothing left to remove
        reactor.resume_read(fd)  # gone: stays out
        assert fd not in _ready(reactor)
    finally:
        reactor.close()
        a.close()
        b.close()


# -- DirectReads: the read loop ---------------------------------------------------------------
class _Owner:
    """The parts of an owner DirectReads uses, around one worker on a socketpair: its
    ``handle_frames`` records each message, and a RESULT message fires the waiter."""

    def __init__(self, window=2.0):
        self.a, self.b = socket.socketpair()
        self.lock, self.reactor = _reactor()
        self.worker = _worker(FramedSocket(self.a))
        self.reactor.register(self.worker.conn.fd, self.io_handler)
        self.handled: list = []
        self.handlers: list = []  # thread name per handled message
        self.waiter = Waiter(1, on_error=True)
        self.deferred: list = []
        self.interrupt_after = None
        self.reads = DirectReads(
            lock=self.lock, tasks_by_id={b"t" * 24: _task(self.worker)}, reactor=self.reactor,
            handle_frames=self.handle_frames, deferred=self.deferred,
            run_deferred=self.deferred.clear, closed=lambda: False)
        self.reads.WINDOW_S = window

    def handle_frames(self, worker, frames):
        with self.lock:
            frames.reverse()
            try:
                while frames:
                    message = pickle.loads(frames.pop())
                    self.handled.append(message)
                    self.handlers.append(threading.current_thread().name)
                    if message[0] == "RESULT":
                        self.waiter.notify(False)
                    if self.interrupt_after is not None and len(self.handled) == \
                            self.interrupt_after:
                        self.interrupt_after = None
                        raise KeyboardInterrupt
            finally:
                frames.reverse()

    def io_handler(self, fd):  # what Owner._on_worker_data does
        lock = self.worker.read_lock
        if not lock.acquire(False):
            return
        try:
            frames, _ = self.worker.conn.recv_ready()
            if frames:
                self.handle_frames(self.worker, frames)
        finally:
            lock.release()

    def send(self, *messages):
        self.b.sendall(b"".join(frame(pickle.dumps(m)) for m in messages))

    def claim(self):
        with self.lock:
            return self.reads.claim(b"t" * 24 + b"\x00\x00\x00\x01")

    def close(self):
        self.reactor.close()
        self.a.close()
        self.b.close()


@pytest.fixture
def owner():
    o = _Owner()
    yield o
    o.close()


def test_the_caller_handles_every_frame_in_order_and_gives_the_fd_back(owner):
    worker = owner.claim()
    assert worker is owner.worker and worker.direct and owner.reads.active == 1
    assert owner.claim() is None  # one reader per worker
    owner.send(("SUBMIT", 1), ("GET", 2))
    threading.Timer(0.05, owner.send, (("BORROW", 3), ("RESULT", 4), ("PUT", 5))).start()
    assert owner.reads.read(worker, owner.waiter, None)
    assert [m[1] for m in owner.handled] == [1, 2, 3, 4, 5]
    assert set(owner.handlers) == {threading.current_thread().name}
    assert not worker.direct and owner.reads.active == 0
    owner.send(("RESULT", 6))  # the I/O thread's again
    assert worker.conn.fd in _ready(owner.reactor)


def test_the_io_thread_leaves_a_claimed_socket_alone_and_reads_what_is_left(owner):
    worker = owner.claim()
    owner.send(("RESULT", 1))
    owner.io_handler(worker.conn.fd)  # a stale event: it read before the claim, not now
    assert owner.handled == [("RESULT", 1)]  # nothing held it: it read and handled it
    owner.waiter = Waiter(1, on_error=True)
    with worker.read_lock:  # as while the caller reads
        owner.send(("PUT", 2))
        owner.io_handler(worker.conn.fd)
        assert owner.handled == [("RESULT", 1)]
    owner.send(("RESULT", 3))
    assert owner.reads.read(worker, owner.waiter, None)
    assert owner.handled == [("RESULT", 1), ("PUT", 2), ("RESULT", 3)]


def test_a_result_the_io_thread_handled_first_ends_the_read_at_once(owner):
    worker = owner.claim()
    owner.waiter.notify(False)  # fired by the I/O thread before the caller took the lock
    start = time.monotonic()
    assert owner.reads.read(worker, owner.waiter, None)
    assert time.monotonic() - start < 0.5


def test_after_the_window_the_caller_waits_as_before(owner):
    owner.reads.WINDOW_S = 0.05
    worker = owner.claim()
    threading.Timer(0.3, owner.waiter.notify, (False,)).start()  # the I/O thread's turn
    assert owner.reads.read(worker, owner.waiter, 5.0)
    assert not worker.direct and owner.reactor._paused == set()


def test_a_timeout_shorter_than_the_window(owner):
    worker = owner.claim()
    start = time.monotonic()
    assert not owner.reads.read(worker, owner.waiter, 0.05)
    assert time.monotonic() - start < 1.0
    assert owner.reactor._paused == set()


def test_eof_ends_the_read_and_the_io_thread_sees_it(owner):
    worker = owner.claim()
    owner.send(("PUT", 1))
    owner.b.close()
    assert not owner.reads.read(worker, owner.waiter, 0.2)
    assert owner.handled == [("PUT", 1)]
    assert worker.conn.fd in _ready(owner.reactor)  # the EOF is reported again


def test_an_interrupted_caller_handles_the_rest_first(owner):
    worker = owner.claim()
    owner.interrupt_after = 1
    owner.send(("SUBMIT", 1), ("PUT", 2), ("RESULT", 3))
    with pytest.raises(KeyboardInterrupt):
        owner.reads.read(worker, owner.waiter, None)
    assert owner.handled == [("SUBMIT", 1), ("PUT", 2), ("RESULT", 3)]
    assert not worker.direct and owner.reactor._paused == set()


def test_a_sleeping_io_thread_is_woken_once_after_a_read(owner):
    worker = owner.claim()
    owner.reactor.unbounded_sleep = True
    owner.send(("RESULT", 1))
    assert owner.reads.read(worker, owner.waiter, None)
    assert not owner.reactor.unbounded_sleep
    assert owner.reactor._wake_r in _ready(owner.reactor)


@pytest.mark.parametrize("asleep_for, woken, pending", [
    (None, False, False),  # awake: its own idle hint is still to come
    (0.002, False, True),  # wakes within the linger: it frees dropped refs then
    (1.0, True, True),  # longer than the linger (a lease kept past it, say): woken
    (float("inf"), True, True),  # no bound
])
def test_after_a_read_the_io_thread_is_woken_if_it_sleeps_past_the_linger(
        owner, asleep_for, woken, pending):
    # and refs dropped from then on need no wake-up of their own while it wakes soon
    objects = SimpleNamespace(wake_pending=False)
    owner.reads._objects, owner.reads._linger, owner.reads._prompt = objects, 0.005, 0.01
    worker = owner.claim()
    owner.reactor.sleep_until = 0.0 if asleep_for is None else time.monotonic() + asleep_for
    owner.send(("RESULT", 1))
    assert owner.reads.read(worker, owner.waiter, None)
    assert (owner.reactor._wake_r in _ready(owner.reactor)) == woken
    assert objects.wake_pending == pending
    if woken:
        assert owner.reactor.sleep_until == 0.0  # once per sleep


def test_pause_and_resume_after_the_loop_closed_do_not_raise():
    a, b = socket.socketpair()
    lock, reactor = _reactor()
    try:
        reactor.register(a.fileno(), lambda fd: None)
        assert reactor.pause_read(a.fileno())
        reactor.close()
        reactor.resume_read(a.fileno())  # a reading get() ends after a shutdown
        other = socket.socket()
        try:
            reactor._handlers[other.fileno()] = lambda fd: None
            assert not reactor.pause_read(other.fileno())
        finally:
            other.close()
    finally:
        a.close()
        b.close()
