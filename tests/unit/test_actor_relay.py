"""Member drivers and the head's actor service: values crossing hosts, and the head's relay.

``actor_link.pack_value`` / ``unpack_value`` (a segment as bytes and back into a store) and
``node/actor_relay.ActorRelay`` between a real peer channel pair and a fake service on an
AF_UNIX socket in tmp_path (frames copied unchanged both ways; either side's end closes both).
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from miniray._private.node.actor_relay import SERVICE_SOCKET, ActorRelay
from miniray._private.object_store import shm_segments as segs
from miniray._private.owner.actor_link import COPY, pack_value, unpack_value
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.framing import FramedSocket

TOKEN = b"t" * 32
TAG = "mrtest0001"


def test_a_segment_crosses_as_bytes_and_lands_in_the_receivers_store(tmp_path):
    sender, receiver = tmp_path / "a", tmp_path / "b"
    sender.mkdir()
    receiver.mkdir()
    name = segs.segment_name("mrsend0001", b"\1" * 28)
    (sender / name).write_bytes(b"x" * 1000 + b"pool slack")
    packed = pack_value(("shm", name, 1000), str(sender))
    assert packed == (COPY, b"x" * 1000, 1000)  # only the value's bytes, not the slack
    assert pack_value(b"inline", str(sender)) == b"inline"
    assert pack_value(packed, str(sender)) is packed
    where, path, size = unpack_value(packed, str(receiver), TAG)
    assert where == "shm" and size == 1000 and os.path.dirname(path) == str(receiver)
    assert segs.tag_of(os.path.basename(path)) == TAG  # the receiving store adopts it
    assert open(path, "rb").read() == b"x" * 1000
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert unpack_value(b"inline", str(receiver), TAG) == b"inline"


def _pair():
    """A connected peer channel pair over loopback: (driver's end, head's end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(
        ph.accept(listener.accept()[0], TOKEN, timeout=5.0)))
    thread.start()
    try:
        client = ph.connect(listener.getsockname(), TOKEN, "actors", timeout=5.0)
        thread.join(5.0)
    finally:
        listener.close()
    return client, accepted[0]


@pytest.fixture
def service(tmp_path):
    """A fake actor service: accepts one connection and echoes each frame, prefixed."""
    path = str(tmp_path / SERVICE_SOCKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(5.0)
    conns = []

    def serve():
        conn = FramedSocket(listener.accept()[0])
        conns.append(conn)
        try:
            while True:
                for frame in conn.recv():
                    conn.send(b"echo:" + frame)
        except (OSError, EOFError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield conns
    for conn in conns:
        conn.sock.close()
    listener.close()
    thread.join(5.0)


def test_the_relay_copies_frames_both_ways_and_closes_both_ends(tmp_path, service):
    relay = ActorRelay(str(tmp_path))
    driver, head_end = _pair()
    try:
        relay.add(head_end)
        big = os.urandom(3 << 20)
        for frame in (b"hello", big):
            driver.send_bytes(frame)
            assert bytes(driver.recv_bytes(timeout=10.0)) == b"echo:" + frame
        assert len(relay) == 1
        driver.close()  # the driver leaves: the service's socket is closed too
        with pytest.raises((EOFError, OSError)):
            while True:
                service[0].sock.settimeout(5.0)
                service[0].recv()
    finally:
        driver.close()
        relay.close()
    assert len(relay) == 0


def test_without_a_service_the_relay_closes_the_channel(tmp_path, monkeypatch):
    from miniray._private.node import actor_relay

    monkeypatch.setattr(actor_relay, "SERVICE_WAIT_S", 0.2)
    relay = ActorRelay(str(tmp_path))
    driver, head_end = _pair()
    try:
        relay.add(head_end)
        with pytest.raises(pc.PeerClosed):
            driver.recv_bytes(timeout=5.0)
    finally:
        driver.close()
        relay.close()
