"""``Reactor.send_soon``: a frame for a busy peer waits in its socket's outbox and is
written by the I/O thread (with the frames queued after it), or by the caller once
``SOON_FRAMES`` wait; order is kept, and a plain ``send`` after it writes it too."""

from __future__ import annotations

import socket
import threading

from miniray._private.transport import reactor as reactor_mod
from miniray._private.transport.framing import FramedSocket
from miniray._private.transport.reactor import Reactor


class _Writes:
    def __init__(self, sock):
        self.sock = sock
        self.count = 0

    def sendmsg(self, *args):
        self.count += 1
        return self.sock.sendmsg(*args)


def _setup():
    a, b = socket.socketpair()
    lock = threading.Lock()
    reactor = Reactor(lock, lambda: None, lambda: None)
    conn = FramedSocket(a)
    writes = _Writes(a)
    conn.sock = writes
    reactor.register(conn.fd, lambda fd: None)
    b.settimeout(10)
    return a, b, lock, reactor, conn, writes


def _read(b, receiver, count):
    frames = []
    while len(frames) < count:
        frames.extend(receiver.recv())
    return frames


def test_frames_wait_for_the_io_thread_then_go_in_one_write_in_order():
    a, b, lock, reactor, conn, writes = _setup()
    flushed = threading.Event()

    def on_writable(fd):
        with lock:
            reactor.flush(fd, conn)
        flushed.set()

    try:
        with lock:
            for i in range(10):
                reactor.send_soon(conn, b"call %d" % i, on_writable)
            assert writes.count == 0 and len(conn.outbox) == 10  # nothing written yet
        reactor.start()
        assert flushed.wait(10)
        assert writes.count == 1
        assert _read(b, FramedSocket(b), 10) == [b"call %d" % i for i in range(10)]
        assert conn.fd not in reactor._writers  # the I/O thread stopped watching it
    finally:
        reactor.stop()
        reactor.close()
        a.close()
        b.close()


def test_a_full_batch_is_written_by_the_caller():
    a, b, lock, reactor, conn, writes = _setup()
    try:
        with lock:
            for i in range(reactor_mod.SOON_FRAMES):
                reactor.send_soon(conn, b"c%d" % i, lambda fd: None)
            assert writes.count == 1 and not conn.outbox
            reactor.send_soon(conn, b"next", lambda fd: None)
            reactor.send(conn, b"plain", lambda fd: None)  # writes what waited first
        assert _read(b, FramedSocket(b), reactor_mod.SOON_FRAMES + 2) == (
            [b"c%d" % i for i in range(reactor_mod.SOON_FRAMES)] + [b"next", b"plain"])
    finally:
        reactor.stop()
        reactor.close()
        a.close()
        b.close()
