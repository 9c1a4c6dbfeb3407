"""``FramedSocket.send_frames``: frames arrive whole and in order, and a burst of small
frames goes in a few writes of up to 64 KiB, not one write each (an async actor's burst of
results is one ``send_frames``)."""

from __future__ import annotations

import socket
import threading

from miniray._private.transport.framing import FramedSocket


class _CountingSocket:
    """Stands for the socket: records each ``sendall``, forwards it to the real one."""

    def __init__(self, sock):
        self.sock = sock
        self.writes: list[int] = []

    def sendall(self, data):
        self.writes.append(len(data))
        self.sock.sendall(data)


def _round_trip(frames: list[bytes]) -> tuple[list[bytes], list[int]]:
    a, b = socket.socketpair()
    with a, b:
        sender, receiver = FramedSocket(a), FramedSocket(b)
        b.settimeout(10)
        counting = _CountingSocket(a)
        sender.sock = counting
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: [
            received.extend(receiver.recv()) for _ in iter(
                lambda: len(received) < len(frames), False)])
        reader.start()
        sender.send_frames(frames)
        reader.join(10)
        assert not reader.is_alive()
        return received, counting.writes


def test_a_burst_of_small_frames_goes_in_few_writes_in_order():
    frames = [b"r%05d" % i + b"x" * 90 for i in range(3000)]  # ~300 KB in all
    received, writes = _round_trip(frames)
    assert received == frames
    assert len(writes) <= 6  # 64 KiB each, not 3,000 writes
    assert all(size < 65536 + 200 for size in writes)


def test_large_frames_between_small_ones_keep_their_place():
    big = b"B" * 100_000
    frames = [b"a", big, b"b" * 10, b"c", big + b"2", b"d"]
    received, writes = _round_trip(frames)
    assert received == frames
