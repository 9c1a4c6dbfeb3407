"""Length-prefixed frames over a stream socket, read in bulk.

Owns: the framing of the driver ⇄ worker data channel: an 8-byte big-endian length, then the
payload; and the slicing of a large value's bytes into frames of at most ``PEER_CHUNK``
(``send_in_frames``) where they follow a message between hosts, and their receipt
straight into a new file-backed mapping (``receive_segment``, ``receive_frames``). Does not
own: what a payload means (``protocol.py``), or what the file is (the object store's
segment naming: the callers name it).
Called by: owner.py (the I/O thread reads with ``recv_ready``), worker_api.py, and
remote_nodes.py, remote_requests.py, remote_worker.py and node/kept_serving.py (values
between hosts: ``send_in_frames``, ``receive_segment``, ``receive_frames``, which hand a
``PeerChannel`` the whole value: ``send_value``, ``recv_value_into``).

The socket stays blocking. The I/O thread reads with ``MSG_DONTWAIT`` and gets every frame
that has arrived in one system call, instead of two reads and a poll per frame. Reads go into
one reused 256 KiB buffer per reading thread (``recv_into``): a fresh ``recv(256 KiB)`` cost
three more system calls each time (glibc maps a buffer that size, shrinks and unmaps it). The
buffer is an anonymous mapping, whose pages are faulted in as reads reach them: a zero-filled
``bytearray`` faulted all 64 at once (140-320 µs on a small VM, paid by the first ``get()``
of a driver's main thread, which reads its result itself).
Two ways to write:

* ``send`` blocks until the frame is written: the worker's side, whose peer (the owner's I/O
  thread) always keeps reading.
* ``send_nowait`` never blocks: what does not fit in the socket buffer waits in an outbox that
  ``flush`` continues when the socket is writable again. The owner writes this way, so it never
  blocks while holding its lock, which could otherwise deadlock against a worker that is itself
  blocked writing results the owner cannot read yet.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import socket
import struct
import threading

_HEADER = struct.Struct("!Q")
_HEADER_SIZE = _HEADER.size
_CHUNK = 1 << 18
_GATHER = 64  # frames written by one sendmsg
_READS = threading.local()  # .view: this thread's read buffer (``_read_view``)
# A large value's bytes between hosts (a remote task's argument after TASK, its result
# after RESULT, a pulled or fetched kept result) travel in frames of at most this many
# bytes, each with its own sequence number and tag: a connection's value is hashed on
# several cores at once (``peer_wire.VALUE_FRAME``, ``transport/mac_pool.py``).
PEER_CHUNK = 8 << 20


def send_in_frames(send, buffer) -> None:
    """Send the bytes of ``buffer`` (a contiguous buffer: bytes, a mapping, an array's) in
    frames of at most PEER_CHUNK, none copied here. ``send`` is the bound send method of
    a ``PeerChannel`` (``send_bytes``) or a ``FramedPeer`` (``send``): the frames then go
    as one value (``send_value``: back to back under one hold of its send lock, their
    tags computed on the MAC pool ahead of the bytes). Any other callable is called once
    a frame. The receiver reads them into one buffer of the total size
    (``receive_frames``, ``recv_value_into``).

    >>> frames = []
    >>> send_in_frames(lambda frame: frames.append(bytes(frame)), b"abc")
    >>> frames
    [b'abc']
    """
    send_value = getattr(getattr(send, "__self__", None), "send_value", None)
    if send_value is not None:
        send_value(buffer, PEER_CHUNK)
        return
    with memoryview(buffer) as whole, whole.cast("B") as view:
        for start in range(0, view.nbytes, PEER_CHUNK):
            send(view[start:start + PEER_CHUNK])


def receive_segment(channel, path: str, size: int, frame_s: float, what: str) -> None:
    """Create file ``path`` (which must not exist) of ``size`` bytes, its pages reserved
    first (a full shm dir: ENOSPC here, never SIGBUS later), and receive the ``size`` bytes
    that follow on ``channel`` (a ``PeerChannel``) in frames straight into its mapping;
    OSError naming ``what`` when a frame is late by ``frame_s``. The caller unlinks it on
    failure (a frame that fails its check closes the channel: PeerAuthError)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    try:
        receive_frames(channel, mapping, size, frame_s, what)
    finally:
        try:  # unless a view is still alive: after a failed receive the traceback holds the
            mapping.close()  # frames' views, and close would raise BufferError in place of
        except BufferError:  # the failure; the mapping then goes with the last view
            pass


def receive_frames(channel, mapping, size: int, frame_s: float, what: str) -> None:
    """Receive ``size`` bytes that come as frames on ``channel`` into the first ``size``
    bytes of the writable ``mapping``; OSError naming ``what`` when a frame is late by
    ``frame_s``. A ``PeerChannel`` receives them as one value (``recv_value_into``):
    nothing of it may be used before this returns, and on any failure the channel is
    closed and no thread still reads ``mapping``."""
    with memoryview(mapping) as whole, whole[:size] as view:
        recv_value_into = getattr(channel, "recv_value_into", None)
        if recv_value_into is not None:  # a PeerChannel: every tag checked on return
            try:
                recv_value_into(view, timeout=frame_s)
            except TimeoutError as error:
                raise OSError(f"{what}'s bytes stopped coming: {error}") from None
            return
        offset = 0
        while offset < size:
            try:
                offset += channel.recv_bytes_into(view[offset:], timeout=frame_s)
            except TimeoutError as error:
                raise OSError(f"{what}'s bytes stopped coming: {error}") from None


def _read_view() -> memoryview:
    """The calling thread's read buffer: what a read puts there is copied out before the
    thread reads again, so one per thread serves every socket it reads."""
    view = getattr(_READS, "view", None)
    if view is None:  # unmapped when the thread's last reference goes; private, so a
        # process forked from this thread reads into its own copy, not this one
        view = _READS.view = memoryview(mmap.mmap(
            -1, _CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
    return view


class FramedSocket:
    __slots__ = ("sock", "buffer", "fd", "outbox")

    def __init__(self, sock: socket.socket):
        sock.setblocking(True)
        self.sock = sock
        self.buffer = bytearray()
        self.fd = sock.fileno()
        self.outbox: collections.deque = collections.deque()

    def fileno(self) -> int:
        return self.fd

    def send(self, data: bytes) -> None:
        header = _HEADER.pack(len(data))
        if len(data) < 65536:
            self.sock.sendall(header + data)
        else:
            self.sock.sendall(header)
            self.sock.sendall(data)

    def send_frames(self, frames: list) -> None:
        """Block until every frame of ``frames`` is written, in order: small frames joined
        into writes of up to 64 KiB (a burst of results is a few writes, not one each), a
        large one written on its own."""
        pending: list = []
        size = 0
        for data in frames:
            if len(data) >= 65536:
                if pending:
                    self.sock.sendall(b"".join(pending))
                    pending, size = [], 0
                self.send(data)
                continue
            pending.append(_HEADER.pack(len(data)) + data)
            size += _HEADER_SIZE + len(data)
            if size >= 65536:
                self.sock.sendall(b"".join(pending))
                pending, size = [], 0
        if pending:
            self.sock.sendall(b"".join(pending))

    def send_nowait(self, data: bytes) -> bool:
        """Queue a frame and write what fits now; True if some of it still waits (the caller
        then asks to be told when the socket is writable, and calls ``flush``)."""
        self.queue(data)
        return not self.flush()

    def queue(self, data: bytes) -> None:
        """Queue a frame for the next ``flush`` (several frames then go in one write)."""
        self.outbox.append(memoryview(_HEADER.pack(len(data)) + data)
                           if len(data) < 65536 else memoryview(_HEADER.pack(len(data))))
        if len(data) >= 65536:
            self.outbox.append(memoryview(data))

    def flush(self) -> bool:
        """Write queued frames without blocking, up to ``_GATHER`` of them per system call;
        True once the outbox is empty."""
        outbox = self.outbox
        while outbox:
            if len(outbox) == 1:
                views = [outbox[0]]
            else:
                views = list(itertools.islice(outbox, _GATHER))
            try:
                sent = self.sock.sendmsg(views, (), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            for view in views:
                if sent >= len(view):
                    sent -= len(view)
                    outbox.popleft()
                else:
                    outbox[0] = view[sent:]
                    return False
        return True

    def _frames(self) -> list[bytes]:
        buffer = self.buffer
        frames = []
        offset = 0
        end = len(buffer)
        while end - offset >= _HEADER_SIZE:
            (size,) = _HEADER.unpack_from(buffer, offset)
            if end - offset - _HEADER_SIZE < size:
                break
            start = offset + _HEADER_SIZE
            frames.append(bytes(buffer[start:start + size]))
            offset = start + size
        if offset:
            del buffer[:offset]
        return frames

    def recv_ready(self) -> tuple[list[bytes], bool]:
        """Every complete frame available now, and whether the peer closed the socket."""
        view = _read_view()
        recv_into = self.sock.recv_into
        while True:
            try:
                count = recv_into(view, _CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return self._frames(), False
            except OSError:
                return self._frames(), True
            if not count:
                return self._frames(), True
            self.buffer += view[:count]
            if count < _CHUNK:
                return self._frames(), False

    def recv(self) -> list[bytes]:
        """Block until at least one frame arrives; EOFError when the peer closed."""
        view = None
        while True:
            if self.buffer:  # empty between messages: no _frames() call then
                frames = self._frames()
                if frames:
                    return frames
            if view is None:
                view = _read_view()
            count = self.sock.recv_into(view, _CHUNK)
            if not count:
                raise EOFError("peer closed the socket")
            self.buffer += view[:count]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
