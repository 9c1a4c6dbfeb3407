"""``FramedSocket`` reads: into one reused buffer per thread (``recv_into``), never a fresh
256 KiB ``recv`` per read (glibc mapped, shrank and unmapped one each time: three system
calls per read). Frames still arrive whole: across reads, larger than the buffer, and from
several sockets read in turn by one thread."""

from __future__ import annotations

import os
import socket
import threading

from miniray._private.transport import framing
from miniray._private.transport.framing import FramedSocket


class _IntoOnly:
    """Stands for the socket: reads only through ``recv_into``, counting the buffers used."""

    def __init__(self, sock):
        self.sock = sock
        self.buffers: set[int] = set()

    def recv_into(self, view, size, flags=0):
        self.buffers.add(id(view.obj))
        return self.sock.recv_into(view, size, flags)

    def recv(self, *args):
        raise AssertionError("a read allocated a fresh buffer (recv)")


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def test_nonblocking_reads_reuse_the_threads_buffer_and_keep_frames_whole():
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    with a, b, c, d:
        first, second = FramedSocket(b), FramedSocket(d)
        first.sock, second.sock = _IntoOnly(b), _IntoOnly(d)
        big = bytes(range(256)) * 2500  # 640,000 bytes: more than one buffer's worth
        sender = threading.Thread(target=a.sendall, args=(_frame(b"x") + _frame(big),))
        sender.start()
        c.sendall(_frame(b"one") + _frame(b"two")[:-1])  # the second frame cut short...
        got, closed = second.recv_ready()
        assert got == [b"one"] and not closed
        c.sendall(b"o")  # ...and completed by a later read
        received: list[bytes] = []
        while len(received) < 2:
            frames, closed = first.recv_ready()
            assert not closed
            received += frames
        sender.join(10)
        assert received == [b"x", big]
        assert second.recv_ready() == ([b"two"], False)
        c.close()
        assert second.recv_ready() == ([], True)
        # one buffer for both sockets: this thread's
        assert first.sock.buffers == second.sock.buffers == {id(framing._read_view().obj)}


def test_blocking_reads_use_the_same_buffer_and_each_thread_its_own():
    a, b = socket.socketpair()
    with a, b:
        reader = FramedSocket(b)
        reader.sock = _IntoOnly(b)
        a.sendall(_frame(b"a") + _frame(b"b"))
        assert reader.recv() == [b"a", b"b"]
        views = []
        thread = threading.Thread(target=lambda: views.append(framing._read_view()))
        thread.start()
        thread.join(10)
        assert views[0].obj is not framing._read_view().obj
        assert reader.sock.buffers == {id(framing._read_view().obj)}


def test_the_read_buffer_is_a_mapping_faulted_in_as_used():
    """Not a zero-filled bytearray (its 64 pages faulted at once: 140-320 µs on a small VM,
    in the first ``get()`` of a driver's main thread): an anonymous mapping of the same
    size, writable through the view, each thread's own."""
    import mmap

    seen = []

    def take():
        seen.append(framing._read_view())

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    view = framing._read_view()
    assert isinstance(view.obj, mmap.mmap) and view.nbytes == framing._CHUNK
    assert not view.readonly and seen[0].obj is not view.obj
    view[:3] = b"abc"
    assert bytes(view[:3]) == b"abc" and framing._read_view() is view


def test_a_forked_childs_reads_do_not_land_in_the_parents_buffer():
    """The read buffer is a private mapping: a process forked from a thread that has one
    (user code forking in a task or the driver) writes into its own copy, as it did into
    its own bytearray before; a shared mapping let the child's reads overwrite the
    parent's."""
    view = framing._read_view()
    view[:4] = b"mine"
    pid = os.fork()
    if pid == 0:  # the child: write where its own reads would go, then leave at once
        try:
            framing._read_view()[:4] = b"kid!"
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and bytes(view[:4]) == b"mine"
