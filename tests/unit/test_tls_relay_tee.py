"""The relay of a remote worker's output on its node (``transport/tls_relay.py`` with a
tee): a plain TCP socket relayed from a local socketpair end, every byte both delivered
and handed to the tee, a reader that stops reading bounding what the relay holds, and the
tee closed when the relay ends."""

from __future__ import annotations

import os
import socket
import threading
import time

from miniray._private.transport import tls_relay


class _Tee:
    def __init__(self):
        self.data = bytearray()
        self.closed = threading.Event()

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed.set()


def _tcp_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        far = socket.create_connection(listener.getsockname(), timeout=5)
        near, _ = listener.accept()
    finally:
        listener.close()
    return near, far


def _recv_exactly(sock: socket.socket, n: int, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _wait_no_relay():
    deadline = time.monotonic() + 5
    while tls_relay.live() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tls_relay.live() == 0


def test_a_plain_socket_is_relayed_and_teed_until_the_worker_closes():
    near, far = _tcp_pair()
    tee = _Tee()
    fd, relay = tls_relay.start(near, "stdout test", tee)
    worker = socket.socket(fileno=fd)
    try:
        data = os.urandom(3 << 20)
        sender = threading.Thread(target=worker.sendall, args=(data,))
        sender.start()
        assert _recv_exactly(far, len(data)) == data
        sender.join(10)
        worker.close()  # the worker exits: the far end sees EOF, the tee is closed
        far.settimeout(5)
        assert far.recv(10) == b""
        assert tee.closed.wait(5)
        assert bytes(tee.data) == data and relay.to_tls == len(data)
    finally:
        worker.close()
        far.close()
    _wait_no_relay()


def test_a_reader_that_stops_reading_stops_the_worker_not_the_nodes_memory():
    near, far = _tcp_pair()
    far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    tee = _Tee()
    fd, relay = tls_relay.start(near, "stderr test", tee)
    worker = socket.socket(fileno=fd)
    worker.setblocking(False)
    try:
        sent = 0
        chunk = b"y" * 65536
        deadline = time.monotonic() + 5
        stalled_since = None
        while time.monotonic() < deadline:  # write until the worker would block for 0.3 s
            try:
                sent += worker.send(chunk)
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 0.3:
                    break
                time.sleep(0.01)
        # Held in the relay at most one CHUNK; the rest is in the kernel's socket buffers.
        assert sent < 64 << 20 and len(relay._to_tls) <= tls_relay.CHUNK, sent
        print(f"\nbytes the worker wrote before it would block: {sent}")
        assert len(tee.data) <= sent
        got = _recv_exactly(far, sent)  # the reader catches up: nothing was dropped
        assert len(got) == sent and bytes(tee.data) == got
    finally:
        worker.close()
        far.close()
    assert tee.closed.wait(5)
    _wait_no_relay()
