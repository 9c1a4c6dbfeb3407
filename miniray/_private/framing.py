"""Length-prefixed frames over a stream socket, read in bulk.

Owns: the framing of the driver ⇄ worker data channel: an 8-byte big-endian length, then the
payload. Does not own: what a payload means (``protocol.py``).
Called by: owner.py (the I/O thread reads with ``recv_ready``) and worker_api.py.

The socket stays blocking, so writes simply block when the peer is slow; the I/O thread reads
with ``MSG_DONTWAIT`` and gets every frame that has arrived in one system call, instead of two
reads and a poll per frame.
"""

from __future__ import annotations

import socket
import struct

_HEADER = struct.Struct("!Q")
_HEADER_SIZE = _HEADER.size
_CHUNK = 1 << 18


class FramedSocket:
    __slots__ = ("sock", "buffer", "fd")

    def __init__(self, sock: socket.socket):
        sock.setblocking(True)
        self.sock = sock
        self.buffer = bytearray()
        self.fd = sock.fileno()

    def fileno(self) -> int:
        return self.fd

    def send(self, data: bytes) -> None:
        header = _HEADER.pack(len(data))
        if len(data) < 65536:
            self.sock.sendall(header + data)
        else:
            self.sock.sendall(header)
            self.sock.sendall(data)

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
        while True:
            try:
                chunk = self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return self._frames(), False
            except OSError:
                return self._frames(), True
            if not chunk:
                return self._frames(), True
            self.buffer += chunk
            if len(chunk) < _CHUNK:
                return self._frames(), False

    def recv(self) -> list[bytes]:
        """Block until at least one frame arrives; EOFError when the peer closed."""
        while True:
            frames = self._frames()
            if frames:
                return frames
            chunk = self.sock.recv(_CHUNK)
            if not chunk:
                raise EOFError("peer closed the socket")
            self.buffer += chunk

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
