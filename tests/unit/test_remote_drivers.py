"""node/remote_drivers.py: the pure checks, and the ``driver`` role served by a Peering on a
selector stepped in a thread of this process, against a real ledger file (no node
processes). The client is transport/remote_node.RemoteNodeClient. Bounded loops throughout."""

from __future__ import annotations

import math
import os
import pickle
import selectors
import threading
import time
from types import SimpleNamespace

import pytest

from miniray._private.core import placement
from miniray._private.core.cluster_view import NodeEntry
from miniray._private.ledger.ledger import Ledger
from miniray._private.node import peering
from miniray._private.node import remote_drivers as rd
from miniray._private.node.remote_tickets import ATTACH_ROLES, TicketBook
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.remote_node import (
    RemoteDenial,
    RemoteGrant,
    RemoteLeaseError,
    RemoteNodeClient,
)
from miniray.exceptions import NodeDiedError

TOKEN = b"d" * 40


# ------------------------------------------------------------------------------ pure parts
def test_check_request_accepts_amounts_and_drops_zeros():
    assert rd.check_request({"CPU": 1, "GPU": 0, "x": 0.5}, {"CPU": 2.0, "x": 1.0}) == (
        {"CPU": 1.0, "x": 0.5}, None)
    assert rd.check_request({}, {"CPU": 2.0}) == ({}, None)


@pytest.mark.parametrize("request_, kind, words", [
    ([("CPU", 1)], "malformed", "dict"),
    ({"CPU": -1}, "malformed", ">= 0"),
    ({"CPU": math.nan}, "malformed", "finite"),
    ({"CPU": math.inf}, "malformed", "finite"),
    ({"CPU": "1"}, "malformed", "number"),
    ({"CPU": True}, "malformed", "number"),
    ({1: 1}, "malformed", "names"),
    ({"": 1}, "malformed", "names"),
    ({"TPU": 1}, "infeasible", "no TPU"),
    ({"CPU": 3}, "infeasible", "only 2 CPU (asked 3)"),
])
def test_check_request_names_what_is_wrong(request_, kind, words):
    clean, problem = rd.check_request(request_, {"CPU": 2.0})
    assert clean is None and problem[0] == kind and words in problem[1], problem


@pytest.mark.parametrize("message, ok", [
    (("lease", 1, {"CPU": 1}, "t"), True), (("release", 2, "ab"), True), (("ping", 3), True),
    (("lease", 1, {"CPU": 1}), False), (("lease", 1, {}, 5), False), (("release", 2, 7), False),
    (("nope", 4), False), ([], False), ("lease", False), ((), False), ((5,), False),
    (("kill", 5, 123), True), (("kill", 5, "123"), False), (("kill", 5, True), False),
    (("kill", 5), False), (("groups", 6), True), (("groups", 6, "ab" * 18), False),
])
def test_parse_message(message, ok):
    op, req, rest = rd.parse_message(message)
    assert (op is not None) == ok, (message, rest)
    if not ok:
        assert isinstance(rest, str) and rest


def test_check_hello():
    assert rd.check_hello({"driver": {"host": "h", "pid": 3}}) is None
    for bad in ({}, {"driver": None}, {"driver": {"host": "h"}},
                {"driver": {"host": "h", "pid": True}}, {"driver": {"host": 1, "pid": 1}}):
        assert "driver" in rd.check_hello(bad)


def test_driver_leases_keeps_links_apart_and_bounded():
    book = rd.DriverLeases(limit=2)
    book.add("a", "1", "h1")
    book.add("a", "2")
    book.add("b", "3")
    assert not book.room("a") and book.room("b")
    assert book.remove("b", "1") == (False, None)  # another link's lease: unknown to b
    assert book.remove("a", "1") == (True, "h1")
    assert book.remove("a", "1") == (False, None)
    assert book.count() == 2 and book.take("a") == ["2"] and book.take("a") == []
    assert book.links() == ["b"]


# ------------------------------------------------------------------- the role, in-process
class Node:
    """A head Peering with a real ledger, its loop stepped in a thread."""

    def __init__(self, tmp_path, totals=None):
        self.ledger = Ledger.create(str(tmp_path / "ledger.json"), totals or {"CPU": 2.0}, {})
        self.listener = peering.bind_listener("127.0.0.1", 0)
        self.port = self.listener.getsockname()[1]
        self.entry = NodeEntry(node_id="n" * 16, ip="127.0.0.1", port=self.port, is_head=True,
                               totals=dict(totals or {"CPU": 2.0}), incarnation=1)
        self.sel = selectors.DefaultSelector()
        self.peering = peering.Peering(entry=self.entry, listener=self.listener, token=TOKEN,
                                       session_dir=str(tmp_path), ledger=self.ledger)
        self.peering.register(self.sel, lambda: None)
        self._stop = threading.Event()
        self._paused = threading.Event()
        self.calls: list = []
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self._stop.is_set():
            for key, _ in self.sel.select(0.01):
                key.data(key.fileobj)
            self.peering.tick(time.monotonic())
            while self.calls:
                self.calls.pop(0)()

    def on_loop(self, fn, timeout=5.0):
        """Run ``fn`` on the loop's thread; its result."""
        done = threading.Event()
        box = []
        self.calls.append(lambda: (box.append(fn()), done.set()))
        assert done.wait(timeout)
        return box[0]

    def client(self, **kw) -> RemoteNodeClient:
        return RemoteNodeClient(("127.0.0.1", self.port), kw.pop("token", TOKEN), timeout=5.0,
                                **kw)

    def leases(self) -> dict:
        return self.ledger.snapshot().leases

    def close(self):
        self._stop.set()
        self.thread.join(5)
        self.peering.close("the test ended")
        self.sel.close()


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()
    assert n.leases() == {}, "a remote lease outlived the node's links"


def test_a_driver_asks_whether_the_nodes_ledger_holds_a_live_group(node):
    # Step 14: another node's actor service asks whether a group of this node lives.
    from miniray._private.core import placement

    live, dead = "ab" * 18, "cd" * 18
    bundles = [{"CPU": 1}]
    for hex_, pid in ((live, os.getpid()), (dead, 2 ** 22 + 12345)):  # the second: dead
        assert node.ledger.acquire_group(bundles, {"id": hex_, "bundles": bundles},
                                         placement.bundle_provides(hex_, bundles),
                                         holder_pid=pid) is not None
    with node.client() as client:
        reserved = client.groups()
        assert live in reserved
        assert dead not in reserved  # its holder died: gone
        assert "ef" * 18 not in reserved
    node.ledger.release_group(live)
    node.ledger.reclaim_dead()


def test_lease_grant_release_and_the_holder_names_the_driver(node):
    with node.client() as client:
        assert client.node_id == node.entry.node_id
        grant = client.lease({"CPU": 1}, tag="f")
        assert isinstance(grant, RemoteGrant) and grant.gpu_ids == []
        (lease,) = node.leases().values()
        assert lease.lease_id == grant.lease_id
        assert lease.holder_pid == node.peering.drivers.node_pid
        assert lease.tag.startswith("remote driver 127.0.0.1 pid ") and lease.tag.endswith(": f")
        assert node.ledger.available() == {"CPU": 1.0}
        (name, ids), = node.on_loop(node.peering.drivers.leases_of).items()
        assert ids == [grant.lease_id] and lease.tag.startswith(name)
        client.release(grant.lease_id)
        assert node.leases() == {}
        with pytest.raises(RemoteLeaseError) as info:
            client.release(grant.lease_id)
        assert info.value.kind == "unknown_lease"
        assert client.ping() < 5.0


def test_the_groups_reserved_in_the_nodes_ledger_are_answered(node):
    """Step 14: another host's state API reads the groups of this node's ledger."""
    from miniray._private.core import placement

    pg_hex = "ab" * 18
    record = {"id": pg_hex, "name": "g", "bundles": [{"CPU": 1.0}], "nodes": ["n" * 16],
              "detached": True, "job_id": "01000000"}
    with node.client() as client:
        assert client.groups() == {}
        node.ledger.acquire_group([{"CPU": 1.0}], record,
                                  placement.bundle_provides(pg_hex, [{"CPU": 1.0}]),
                                  holder_pid=os.getpid())
        try:
            assert client.groups() == {pg_hex: record}
        finally:
            node.ledger.release_group(pg_hex)
        assert rd.parse_message(("groups", 4)) == ("groups", 4, ())
        assert rd.parse_message(("groups", 4, "x"))[0] is None


def test_gpu_leases_name_their_gpu_ids(tmp_path):
    n = Node(tmp_path, totals={"CPU": 2.0, "GPU": 2.0})
    try:
        with n.client() as client:
            first = client.lease({"GPU": 1})
            second = client.lease({"GPU": 0.5, "CPU": 1})
            assert first.gpu_ids == ["0"] and second.gpu_ids == ["1"]
            with pytest.raises(RemoteLeaseError, match="GPU") as info:
                client.lease({"GPU": 1.5})  # the ledger's own rule: whole GPUs above 1
            assert info.value.kind == "malformed"
            assert isinstance(client.lease({"GPU": 1}), RemoteDenial)
    finally:
        n.close()
    assert n.leases() == {}


def test_deny_when_full_says_what_is_free(node):
    with node.client() as client:
        assert isinstance(client.lease({"CPU": 1.5}), RemoteGrant)
        denial = client.lease({"CPU": 1})
        assert isinstance(denial, RemoteDenial) and denial.available == {"CPU": 0.5}
        assert len(node.leases()) == 1
        assert node.peering.statistics()["remote_drivers"]["denied"] == 1


@pytest.mark.parametrize("request_, kind", [
    ({"CPU": -1}, "malformed"), ({"CPU": float("nan")}, "malformed"),
    ({"GPU": 1}, "infeasible"), ({"CPU": 64}, "infeasible"), ({"CPU": "x"}, "malformed"),
])
def test_bad_requests_get_an_error_and_the_link_stays(node, request_, kind):
    with node.client() as client:
        with pytest.raises(RemoteLeaseError) as info:
            client.lease(request_)
        assert info.value.kind == kind and "127.0.0.1" in str(info.value)
        assert pickle.loads(pickle.dumps(info.value)).kind == kind
        assert isinstance(client.lease({"CPU": 1}), RemoteGrant)  # still served
    assert wait_until(lambda: node.leases() == {})


def test_another_drivers_lease_cannot_be_released(node):
    with node.client() as a, node.client() as b:
        grant = a.lease({"CPU": 1})
        with pytest.raises(RemoteLeaseError):
            b.release(grant.lease_id)
        assert grant.lease_id in node.leases()


def test_closing_the_link_releases_every_lease_of_that_driver_only(node):
    a = node.client()
    b = node.client()
    a.lease({"CPU": 0.5})
    a.lease({"CPU": 0.5})
    kept = b.lease({"CPU": 0.5})
    a.close()
    assert wait_until(lambda: list(node.leases()) == [kept.lease_id])
    b.close()
    assert wait_until(lambda: node.leases() == {})


def test_nonsense_from_an_authenticated_driver_is_answered_not_obeyed(node):
    channel = ph.connect(("127.0.0.1", node.port), TOKEN, "driver",
                         hello={"driver": {"host": "h", "pid": 1}}, timeout=5)
    try:
        for message in [("lease", 1), ["lease"], ("reboot", 2), 42, ("release", 3, None),
                        ("lease", 4, {"CPU": 1}, None)]:
            channel.send(message)
            answer = channel.recv(timeout=5)
            assert answer[0] == "error" and answer[2] == "malformed", (message, answer)
        channel.send(("ping", 9))
        assert channel.recv(timeout=5) == ("pong", 9, node.entry.node_id)
    finally:
        channel.close()


def test_a_frame_that_fails_its_mac_closes_the_link_and_frees_its_leases(node):
    client = node.client()
    client.lease({"CPU": 1})
    sock = client._channel._sock
    sock.sendall(b"\x00" * 64)  # not a frame of this link: the MAC check fails
    assert wait_until(lambda: node.leases() == {})
    with pytest.raises(NodeDiedError):
        client.lease({"CPU": 1})
    client.close()


def test_a_bad_driver_hello_and_a_wrong_token_are_refused(node):
    with pytest.raises(pc.PeerRefused, match="driver"):
        ph.connect(("127.0.0.1", node.port), TOKEN, "driver", hello={}, timeout=5)
    t0 = time.monotonic()
    with pytest.raises(pc.PeerAuthError):
        node.client(token=b"w" * 40)
    assert time.monotonic() - t0 < 2.0


def test_fencing_releases_everything_and_tells_the_driver(node):
    client = node.client()
    client.lease({"CPU": 1})
    client.lease({"CPU": 1})
    released = node.on_loop(lambda: node.peering.drivers.fence("the head holds this node dead"))
    assert released == 2 and node.leases() == {}
    with pytest.raises(NodeDiedError, match="head holds this node dead"):
        client.ping()
    with pytest.raises(NodeDiedError):
        client.lease({"CPU": 1})
    client.close()


def test_a_stopping_node_tells_each_driver_and_releases_its_leases(node):
    clients = [node.client(), node.client()]
    for client in clients:
        client.lease({"CPU": 1})
    node.on_loop(lambda: node.peering.drivers.close("the node is stopping"))
    assert node.leases() == {} and node.peering.drivers.statistics()["links"] == 0
    for client in clients:
        with pytest.raises(NodeDiedError, match="node is stopping"):
            client.ping()
        client.close()
    assert node.peering.tls is False  # TLS off here; on: tests/integration/test_remote_tls.py


def test_a_fenced_node_refuses_new_drivers_until_it_rejoined(node):
    node.on_loop(lambda: node.peering.drivers.fence("the head holds this node dead"))
    late = node.client()
    with pytest.raises(NodeDiedError, match="has not rejoined yet"):
        late.ping()
    late.close()
    node.on_loop(node.peering.drivers.resume)
    with node.client() as again:
        assert isinstance(again.lease({"CPU": 1}), RemoteGrant)


def test_node_dead_from_the_view_fails_later_calls_naming_the_node(node):
    client = node.client()
    client.node_dead("missed heartbeats")
    with pytest.raises(NodeDiedError, match=f"127.0.0.1:{node.port}.*missed heartbeats"):
        client.lease({"CPU": 1})
    client.close()


def test_a_timeout_leaves_the_link_usable(node):
    with node.client() as client:
        node.calls.append(lambda: time.sleep(0.5))  # the node's loop is busy for 0.5 s
        with pytest.raises(TimeoutError, match="did not answer"):
            client.ping(timeout=0.05)
        assert client.ping() < 5.0  # the late pong was skipped


# ------------------------------------------------------------------ step 8: spawn tickets
def test_ticket_book_rules():
    book = TicketBook(ttl=5.0, per_link=2)
    a = book.issue("A", 1, "10.0.0.1", 0.0, "t1")
    assert book.issue("A", 2, "10.0.0.1", 0.0, "t2") is not None
    assert book.issue("A", 3, "10.0.0.1", 0.0, "t3") is None  # rule 1
    assert book.attach("t9", "data", "10.0.0.1", 1.0, "x")[0] == "unknown"
    assert book.attach("t1", "bogus", "10.0.0.1", 1.0, "x")[0] == "refused"
    assert book.attach("t1", "data", "10.0.0.2", 1.0, "x")[0] == "refused"  # another host
    assert book.attach("t1", "data", "10.0.0.1", 1.0, "d")[0] == "waiting"
    assert book.attach("t1", "data", "10.0.0.1", 1.0, "d2")[0] == "refused"  # twice
    assert book.next_deadline() == 5.0
    assert book.attach("t1", "stdout", "10.0.0.1", 5.0, "o")[0] == "unknown"  # expired
    assert [t.ticket for t in book.expired(5.0)] == ["t1", "t2"] and len(book) == 0
    assert a.parts == {"data": "d"}
    book.issue("B", 1, "h", 0.0, "u1")
    assert [t.ticket for t in book.drop_link("B")] == ["u1"] and book.next_deadline() is None


def test_check_attach_hello():
    assert rd.check_attach_hello({"ticket": "a" * 32, "fd": "data"}) is None
    for bad in ({}, {"ticket": "a" * 32}, {"ticket": "short", "fd": "data"},
                {"ticket": "a" * 32, "fd": "stdin"}, {"ticket": 5, "fd": "data"}):
        assert "attach" in rd.check_attach_hello(bad)


def test_spawn_is_unsupported_without_a_spawner(node):
    with node.client() as client:
        with pytest.raises(RemoteLeaseError) as info:
            client.spawn()
        assert info.value.kind == "unsupported"
        assert client.ping() < 5.0


class FakeSpawner:
    def __init__(self, answer=4242):
        self.answer = answer
        self.calls = []

    def __call__(self, channels, name, done):
        self.calls.append((channels, name))
        done(self.answer)


def test_spawn_hands_four_authenticated_channels_to_the_spawner(node):
    spawner = FakeSpawner()
    node.peering.drivers.spawner = spawner
    with node.client() as client:
        pid, mine = client.spawn()
        try:
            assert pid == 4242 and len(mine) == 4
            (theirs, name), = spawner.calls
            assert name.startswith("remote driver 127.0.0.1 pid ")
            assert [c.peer_hello["fd"] for c in theirs] == list(ATTACH_ROLES)
            # Each pair speaks MAC'd frames with keys that never crossed the wire.
            for here, there in zip(mine, theirs):
                here.send(("hello", here.role))
                assert there.recv(timeout=5) == ("hello", "attach")
                there.send(b"back")
                assert here.recv(timeout=5) == b"back"
        finally:
            for channel in mine + spawner.calls[0][0]:
                channel.close()
        assert node.peering.drivers.statistics()["spawned"] == 1
        assert node.peering.drivers.statistics()["tickets"] == 0


def test_kill_signals_only_a_worker_of_the_asking_link(node):
    drivers = node.peering.drivers
    spawner = FakeSpawner()
    drivers.spawner = spawner
    killed = []
    drivers.kill_worker = killed.append
    with node.client() as client, node.client() as other:
        pid, mine = client.spawn()
        try:
            with pytest.raises(RemoteLeaseError) as info:
                other.kill(pid)  # another driver's worker: nothing is signalled
            assert info.value.kind == "unknown_worker" and str(pid) in str(info.value)
            with pytest.raises(RemoteLeaseError, match="not a worker"):
                client.kill(os.getpid())  # any other process: the same
            assert killed == []
            client.kill(pid)
            assert killed == [pid]
        finally:
            for channel in mine + spawner.calls[0][0]:
                channel.close()


def test_a_failed_spawn_is_the_drivers_error(node):
    node.peering.drivers.spawner = FakeSpawner(answer="the fork server is gone")
    with node.client() as client:
        with pytest.raises(RemoteLeaseError, match="fork server is gone") as info:
            client.spawn()
        assert info.value.kind == "spawn_failed"


def _ticket(node, client):
    with client._lock:
        req = client._send("spawn", ())
        answer = client._await(req, "spawn", 5.0)
    assert answer[0] == "ticket"
    return req, answer[2]


def _attach(node, ticket, fd, source="127.0.0.1"):
    return ph.connect(("127.0.0.1", node.port), TOKEN, "attach",
                      hello={"ticket": ticket, "fd": fd}, timeout=5,
                      source_address=(source, 0))


def _closed_by_node(channel) -> bool:
    try:
        channel.recv(timeout=3)
    except pc.PeerClosed:
        return True
    return False


def test_attach_connections_that_match_no_ticket_are_closed(node):
    node.peering.drivers.spawner = FakeSpawner()
    stray = _attach(node, "f" * 32, "data")
    assert _closed_by_node(stray)
    stray.close()
    with node.client() as client:
        _req, ticket = _ticket(node, client)
        other_host = _attach(node, ticket, "data", source="127.0.0.2")
        assert _closed_by_node(other_host)  # the ticket is bound to the driver's host
        other_host.close()


def test_an_incomplete_ticket_times_out_and_closes_what_came(tmp_path):
    n = Node(tmp_path)
    try:
        n.peering.drivers.spawner = FakeSpawner()
        n.peering.drivers._tickets.ttl = 0.3
        with n.client() as client:
            req, ticket = _ticket(n, client)
            part = _attach(n, ticket, "data")
            with client._lock:
                with pytest.raises(RemoteLeaseError, match="did not all arrive") as info:
                    client._await(req, "spawn", 5.0)
            assert info.value.kind == "attach_timeout"
            assert _closed_by_node(part)
            part.close()
    finally:
        n.close()


def test_the_driver_link_closing_closes_its_tickets_connections(node):
    node.peering.drivers.spawner = FakeSpawner()
    client = node.client()
    _req, ticket = _ticket(node, client)
    part = _attach(node, ticket, "data")
    assert wait_until(lambda: node.peering.drivers.statistics()["tickets"] == 1)
    client.close()
    assert _closed_by_node(part)
    part.close()
    assert wait_until(lambda: node.peering.drivers.statistics()["tickets"] == 0)


def test_driver_links_get_tcp_keepalive_from_the_dead_after_setting(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("MINIRAY_NODE_DEAD_AFTER_S", "2")
    n = Node(tmp_path)
    try:
        with n.client():
            assert wait_until(lambda: n.peering.drivers.statistics()["links"] == 1)
            fd = n.on_loop(lambda: next(iter(n.peering.drivers._links)))
            sock = socket.socket(fileno=os.dup(fd))
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
            finally:
                sock.close()
    finally:
        n.close()


def test_a_driver_that_stops_reading_is_dropped_and_its_leases_freed(tmp_path, monkeypatch):
    monkeypatch.setattr(rd, "SEND_TIMEOUT_S", 0.3)
    n = Node(tmp_path)
    try:
        channel = ph.connect(("127.0.0.1", n.port), TOKEN, "driver",
                             hello={"driver": {"host": "h", "pid": 1}}, timeout=5)
        channel.send(("lease", 1, {"CPU": 1}, "t"))
        assert channel.recv(timeout=5)[0] == "grant"
        big = b"x" * (1 << 20)  # echoed back in each error: the answers pile up unread
        channel.set_send_timeout(5)
        with pytest.raises((pc.PeerClosed, TimeoutError, OSError)):
            for _ in range(64):
                channel.send(("nope", big))
        assert wait_until(lambda: n.leases() == {}, 10.0)
        channel.close()
        with n.client() as other:  # the loop still serves everyone else
            assert other.ping() < 5.0
    finally:
        n.close()


# ------------------------------------------------- step 11: results kept for a link
def _kept_node(node, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    node.peering.drivers._shm_dir = str(shm)  # never the user's shm dir
    return shm


def _write(shm, tag: str, object_id: bytes, data: bytes) -> str:
    path = str(shm / f"mr_{tag}_{object_id.hex()}")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_a_link_keeps_pulls_and_frees_its_results(node, tmp_path):
    shm = _kept_node(node, tmp_path)
    one, two = b"\x01" * 28, b"\x02" * 28
    value = os.urandom(3 << 20)
    with node.client() as client:
        tag, room = client.keeps()
        assert room >= 0 and len(tag) >= 8
        path = _write(shm, tag, one, value)
        client.keep(one, path, len(value))
        with pytest.raises(RemoteLeaseError) as refused:  # not named for this object
            client.keep(two, _write(shm, tag, b"\x03" * 28, b"x"), 1)
        assert refused.value.kind == "bad_segment"
        with pytest.raises(RemoteLeaseError) as again:  # kept already: its file stays
            client.keep(one, path, len(value))
        assert again.value.kind == "bad_segment" and os.path.exists(path)
        pull = client.open_pull(tag)
        try:
            pull.send(("pull", 1, one))
            assert pull.recv(timeout=5) == ("pulling", 1, len(value))
            got = bytearray(len(value))
            view, offset = memoryview(got), 0
            while offset < len(value):
                offset += pull.recv_bytes_into(view[offset:], timeout=5)
            assert bytes(got) == value
            pull.send(("pull", 2, two))  # never kept: an error, the connection stays
            answer = pull.recv(timeout=5)
            assert answer[:3] == ("error", 2, "unknown_object")
        finally:
            pull.close()
        assert client.free([one, two]) == 1
        assert not os.path.exists(path)


def test_a_closed_link_leaves_nothing_of_its_tag_and_pulls_need_its_tag(node, tmp_path):
    shm = _kept_node(node, tmp_path)
    client = node.client()
    other = node.client()
    tag, _room = client.keeps()
    other_tag, _ = other.keeps()
    assert tag != other_tag
    kept = _write(shm, tag, b"\x01" * 28, b"kept")
    client.keep(b"\x01" * 28, kept, 4)
    orphan = _write(shm, tag, b"\x02" * 28, b"a worker died before its keep")
    theirs = _write(shm, other_tag, b"\x01" * 28, b"the other link's")
    other.keep(b"\x01" * 28, theirs, 16)
    pull = other.open_pull(other_tag)  # the other link cannot pull this one's objects
    pull.send(("pull", 1, b"\x02" * 28))
    assert pull.recv(timeout=5)[:3] == ("error", 1, "unknown_object")
    pull.close()
    client.close()
    assert wait_until(lambda: not os.path.exists(kept) and not os.path.exists(orphan))
    assert os.path.exists(theirs)
    with pytest.raises((pc.PeerClosed, OSError, TimeoutError, pc.PeerRefused)):
        stale = other.open_pull(tag)  # the closed link's tag: refused, closed at once
        stale.send(("pull", 1, b"\x01" * 28))
        stale.recv(timeout=5)
    other.close()
    assert wait_until(lambda: not os.listdir(shm))


def test_fencing_frees_every_links_kept_results(node, tmp_path):
    shm = _kept_node(node, tmp_path)
    client = node.client()
    tag, _room = client.keeps()
    client.keep(b"\x01" * 28, _write(shm, tag, b"\x01" * 28, b"kept"), 4)
    node.on_loop(lambda: node.peering.drivers.fence("the head holds this node dead"))
    assert wait_until(lambda: not os.listdir(shm))
    node.on_loop(node.peering.drivers.resume)
    client.close()


# ------------------------------------------- step 12: a node fetches from another node
def test_a_node_fetches_another_links_object_with_the_drivers_grant_only(node, tmp_path):
    """One node plays N (link ``home`` keeps the object) and M (link ``there`` fetches
    it, connecting to its own port from its address): M's copy is booked for ``there``,
    bit-exact, freed by ``there``'s free; a wrong grant is refused at N's door (the fetch
    fails, nothing is left); a granted connection pulls its object only."""
    from miniray._private.core import pull_grants

    shm = _kept_node(node, tmp_path)
    one, two = b"\x01" * 28, b"\x02" * 28
    value = os.urandom(3 << 20)
    address = ("127.0.0.1", node.port)
    with node.client() as home, node.client() as there:
        tag, _room = home.keeps()
        there_tag, _room = there.keeps()
        home.keep(one, _write(shm, tag, one, value), len(value))
        home.keep(two, _write(shm, tag, two, b"other"), 5)
        key = home.grant_key()
        assert key == home.grant_key() != there.grant_key()
        grant = pull_grants.grant(key, one, node.entry.node_id, "127.0.0.1")
        with pytest.raises(RemoteLeaseError) as refused:  # granted for another object
            there.fetch(two, 5, address, tag, grant)
        assert refused.value.kind == "fetch_failed"
        assert sorted(n for n in os.listdir(shm) if not n.endswith("_budget")) == sorted([
            f"mr_{tag}_{one.hex()}", f"mr_{tag}_{two.hex()}"])
        path = there.fetch(one, len(value), address, tag, grant)
        assert os.path.basename(path) == f"mr_{there_tag}_{one.hex()}"
        with open(path, "rb") as f:
            assert f.read() == value
        assert there.fetch(one, len(value), address, tag, grant) == path  # kept: at once
        assert node.peering.drivers.fetched == 1
        peer = ph.connect(address, TOKEN, "pull", hello={
            "driver": {"host": "h", "pid": 1}, "tag": tag,
            "peer": {"node_id": node.entry.node_id, "object_id": one, "grant": grant}})
        try:  # a granted connection: its object only
            peer.send(("pull", 1, two))
            assert peer.recv(timeout=5)[:3] == ("error", 1, "unknown_object")
        finally:
            peer.close()
        assert there.free([one]) == 1 and not os.path.exists(path)
        assert os.path.exists(shm / f"mr_{tag}_{one.hex()}")  # home's copy: home's to free


def test_fetch_messages_are_checked_for_shape():
    good = ("fetch", 1, b"\x01" * 28, 5, ["127.0.0.2", 7000], "t" * 16, b"g" * 32)
    assert rd.parse_message(good)[0] == "fetch"
    for index, bad in ((3, 0), (3, True), (4, ["127.0.0.2"]), (4, [1, 2]), (5, "short"),
                       (6, "not bytes"), (2, "not bytes")):
        message = list(good)
        message[index] = bad
        assert rd.parse_message(tuple(message))[0] is None, message
    assert rd.parse_message(("grant_key", 3)) == ("grant_key", 3, ())
    hello = {"driver": {"host": "h", "pid": 1}, "tag": "t" * 16}
    assert rd.check_pull_hello(hello) is None
    assert rd.check_pull_hello({**hello, "peer": {"node_id": "n"}}) is None
    assert "pull hello" in rd.check_pull_hello({**hello, "peer": "not a dict"})


def test_a_link_is_told_the_nodes_cap_and_status_rows_count_what_it_keeps(node, tmp_path):
    from miniray._private.object_store import kept_budget

    shm = _kept_node(node, tmp_path)
    drivers = node.peering.drivers
    assert drivers.kept.cap_bytes > 0  # the default: a quarter of the shm dir's size
    drivers.kept.cap_bytes = 1000
    changes = []
    drivers.on_change = lambda: changes.append(1)
    with node.client() as client:
        tag, cap = client.keeps()
        assert cap == 1000 and kept_budget.used(str(shm), tag) == 0  # made with the link
        assert kept_budget.reserve(str(shm), tag, 600, cap, b"\x01" * 28)  # as a worker does
        client.keep(b"\x01" * 28, _write(shm, tag, b"\x01" * 28, b"x" * 600), 600)
        rows = drivers.kept_rows()
        assert [(r["objects"], r["bytes"], r["cap"]) for r in rows] == [(1, 600, 1000)]
        assert rows[0]["driver"].startswith("remote driver 127.0.0.1 pid ")
        assert not kept_budget.reserve(str(shm), tag, 600, cap, b"\x02" * 28)  # sent
        with pytest.raises(RemoteLeaseError) as refused:  # the book's own bound
            client.keep(b"\x02" * 28, _write(shm, tag, b"\x02" * 28, b"x" * 600), 600)
        assert "cap" in str(refused.value)
        assert client.free([b"\x01" * 28]) == 1
        assert drivers.kept_rows() == [] and len(changes) == 2
        assert kept_budget.used(str(shm), tag) == 0  # released with the free (and refusal)
        assert kept_budget.reserve(str(shm), tag, 100, cap, b"\x04" * 28)
        with pytest.raises(RemoteLeaseError):  # refused (not named for it): released
            client.keep(b"\x03" * 28, _write(shm, tag, b"\x04" * 28, b"x" * 100), 100)
        assert kept_budget.used(str(shm), tag) == 0
    assert wait_until(lambda: not os.listdir(shm))  # the budget file swept with the tag


def test_a_workers_exit_gives_back_what_it_reserved_and_never_wrote(node, tmp_path):
    """Step 9: the node reconciles the link's budget file when a worker of the link exits:
    its reservation of a result it never wrote goes back; one it wrote stays counted (the
    driver may still keep it), and another worker's is untouched."""
    import subprocess
    import sys

    from miniray._private.object_store import kept_budget

    shm = _kept_node(node, tmp_path)
    drivers = node.peering.drivers
    drivers.kept.cap_bytes = 1000
    # A process that stays alive: only the node's word (its exit reaped) says it is gone,
    # never a refused reservation's kill(pid, 0).
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    one, two, three = b"\x01" * 28, b"\x02" * 28, b"\x03" * 28
    with node.client() as client:
        tag, cap = client.keeps()
        assert kept_budget.reserve(str(shm), tag, 600, cap, one, pid=gone.pid)
        assert kept_budget.reserve(str(shm), tag, 100, cap, two, pid=gone.pid)
        _write(shm, tag, two, b"x" * 100)  # written before it died
        assert kept_budget.reserve(str(shm), tag, 200, cap, three)  # a live worker's
        assert not kept_budget.reserve(str(shm), tag, 200, cap, b"\x04" * 28, pid=1)

        def exited():
            link = next(iter(drivers._links.values()))
            drivers._workers[gone.pid] = link  # as if spawned for this link
            drivers.worker_exited(gone.pid, 9)

        node.on_loop(exited)
        assert kept_budget.reservations(str(shm), tag) == (0, [
            (gone.pid, two.hex(), 100), (os.getpid(), three.hex(), 200)])
        assert kept_budget.reserve(str(shm), tag, 600, cap, b"\x04" * 28, pid=1)
        client.keep(two, str(shm / f"mr_{tag}_{two.hex()}"), 100)  # the driver kept it
        assert kept_budget.used(str(shm), tag) == 900
    gone.kill()
    gone.wait()


def _kept_with_grant(node, shm, home, object_id: bytes, value: bytes) -> tuple:
    """``home``'s link keeps ``value`` as ``object_id`` on ``node``: (its tag, the grant
    its driver gives this node to fetch it)."""
    from miniray._private.core import pull_grants

    tag, _room = home.keeps()
    home.keep(object_id, _write(shm, tag, object_id, value), len(value))
    return tag, pull_grants.grant(home.grant_key(), object_id, node.entry.node_id,
                                  "127.0.0.1")


def _hold_fetches(drivers) -> threading.Event:
    """Every fetch's connect to the keeping node waits until the returned event is set."""
    gate = threading.Event()
    connect = drivers.connect_pull

    def held(*args, **kwargs):
        assert gate.wait(10)
        return connect(*args, **kwargs)

    drivers.connect_pull = held
    return gate


def _held_fetch(node, tmp_path) -> SimpleNamespace:
    """The scene of the held-fetch tests: a node keeping results (``shm``), a 1 MiB
    ``value`` to keep as object ``one``, every fetch's connect held until ``gate`` is set,
    and ``ask(request_id, tag, grant)``: the fetch message a driver sends for it."""
    shm = _kept_node(node, tmp_path)
    drivers = node.peering.drivers
    scene = SimpleNamespace(shm=shm, one=b"\x01" * 28, value=os.urandom(1 << 20),
                            address=("127.0.0.1", node.port), drivers=drivers,
                            gate=_hold_fetches(drivers))
    scene.ask = lambda request_id, tag, grant: (
        "fetch", request_id, scene.one, len(scene.value), list(scene.address), tag, grant)
    return scene


def test_a_fetch_asked_on_a_pull_connection_leaves_the_link_free_until_it_answers(
        node, tmp_path):
    """The driver asks on one of its pull connections: M's link answers a ping while the
    fetch waits (here: held at its connect), and the answer comes on that connection;
    the same object asked again there is M's copy at once; a malformed ask is answered
    and the connection stays."""
    scene = _held_fetch(node, tmp_path)
    shm, one, value, drivers, gate = (scene.shm, scene.one, scene.value, scene.drivers,
                                      scene.gate)
    with node.client() as home, node.client() as there:
        tag, grant = _kept_with_grant(node, shm, home, one, value)
        there_tag, _room = there.keeps()
        pull = there.open_pull(there_tag)
        try:
            ask = scene.ask(7, tag, grant)
            pull.send(ask)
            with pytest.raises(TimeoutError):
                pull.recv(timeout=0.3)  # the fetch waits at its connect
            started = time.monotonic()
            there.ping()  # the link is not held by the fetch
            assert time.monotonic() - started < 1.0
            gate.set()
            answer = pull.recv(timeout=10)
            assert answer[:2] == ("fetched", 7) and answer[3] == len(value)
            assert os.path.basename(answer[2]) == f"mr_{there_tag}_{one.hex()}"
            with open(answer[2], "rb") as f:
                assert f.read() == value
            pull.send(ask[:1] + (8,) + ask[2:])  # kept now: at once
            assert pull.recv(timeout=5) == ("fetched", 8, answer[2], len(value))
            pull.send(ask[:1] + (9, one, 0) + ask[4:])
            assert pull.recv(timeout=5)[:3] == ("error", 9, "malformed")
        finally:
            pull.close()
        assert drivers.fetched == 1
        assert there.free([one]) == 1


def test_a_drivers_link_dropped_while_its_fetch_runs_leaves_the_loop_alive(node, tmp_path):
    """The driver asks a fetch on a pull connection and goes (link and connection closed)
    before the fetch ends: the fetch's end finds the link dropped (its tag gone with it),
    gives nothing back to a budget file that is gone, books nothing, and the node's loop
    goes on; a fetch started on the loop after the link was dropped is refused."""
    scene = _held_fetch(node, tmp_path)
    shm, one, value, drivers, gate = (scene.shm, scene.one, scene.value, scene.drivers,
                                      scene.gate)
    with node.client() as home:
        tag, grant = _kept_with_grant(node, shm, home, one, value)
        there = node.client()
        there_tag, _room = there.keeps()
        link = node.on_loop(lambda: drivers._by_tag[there_tag])
        pull = there.open_pull(there_tag)
        pull.send(scene.ask(7, tag, grant))
        assert wait_until(lambda: node.on_loop(lambda: bool(drivers._fetching)), 5.0)
        there.close()
        pull.close()
        assert wait_until(lambda: not node.on_loop(lambda: drivers._served(link)), 5.0)
        gate.set()
        assert wait_until(lambda: not node.on_loop(lambda: bool(drivers._fetching)), 10.0)
        assert node.thread.is_alive()
        assert not [n for n in os.listdir(shm) if n.startswith(f"mr_{there_tag}")]
        refused = node.on_loop(lambda: drivers._fetch(
            link, 8, one, len(value), scene.address, tag, grant, answer=lambda reply: None))
        assert refused[:3] == ("error", 8, "fetch_failed"), refused
        home.ping()  # the node still answers its links
        assert home.free([one]) == 1


def test_a_fetch_nobody_waits_for_any_more_is_not_kept(node, tmp_path):
    """The driver gave up on a fetch (closed the pull connection it asked on) but its link
    stays: the copy the fetch made is unlinked and its bytes given back, not booked for a
    link that would never free it."""
    from miniray._private.object_store import kept_budget

    scene = _held_fetch(node, tmp_path)
    shm, one, drivers, gate = scene.shm, scene.one, scene.drivers, scene.gate
    with node.client() as home, node.client() as there:
        tag, grant = _kept_with_grant(node, shm, home, one, scene.value)
        there_tag, _room = there.keeps()
        pull = there.open_pull(there_tag)
        pull.send(scene.ask(7, tag, grant))
        assert wait_until(lambda: node.on_loop(lambda: bool(drivers._fetching)), 5.0)
        pull.close()  # the driver's wait timed out
        time.sleep(0.2)
        gate.set()
        assert wait_until(lambda: not node.on_loop(lambda: bool(drivers._fetching)), 10.0)
        assert not os.path.exists(shm / f"mr_{there_tag}_{one.hex()}")
        assert kept_budget.used(str(shm), there_tag) == 0
        assert drivers.fetched == 0 and node.thread.is_alive()
        assert home.free([one]) == 1



def _hold_budget_lock(path: str):
    """A child process that holds the budget file's lock, SIGSTOPped inside it (as a
    worker stopped in its short hold): the returned Popen; SIGCONT and closing its stdin
    let it go."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys\n"
         f"fd = os.open({path!r}, os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "locked"
    os.kill(child.pid, signal.SIGSTOP)
    return child


def _let_go(child) -> None:
    import signal

    os.kill(child.pid, signal.SIGCONT)
    child.stdin.close()
    child.wait(10)
    child.stdout.close()


def test_a_worker_stopped_holding_the_budget_lock_never_stalls_the_node(node, tmp_path):
    """Defect: book/release/reconcile took the budget file's flock on the node's loop with
    no bound, so a worker SIGSTOPped inside its hold stalled every link. Now the loop waits
    at most BUDGET_WAIT_S: the keep, the free and a worker's exit are answered at once,
    their budget changes wait in order and land once the lock is free."""
    from miniray._private.object_store import kept_budget

    shm = _kept_node(node, tmp_path)
    drivers = node.peering.drivers
    drivers.kept.cap_bytes = 1000
    one, two = b"\x01" * 28, b"\x02" * 28
    with node.client() as client:
        tag, cap = client.keeps()
        assert kept_budget.reserve(str(shm), tag, 600, cap, one)
        assert kept_budget.reserve(str(shm), tag, 100, cap, two)
        child = _hold_budget_lock(kept_budget.budget_path(str(shm), tag))
        try:
            start = time.monotonic()
            client.keep(one, _write(shm, tag, one, b"x" * 600), 600)
            client.keep(two, _write(shm, tag, two, b"y" * 100), 100)
            assert client.free([two]) == 1

            def exited():  # a worker of the link exits meanwhile (step 9)
                drivers._workers[4242420] = next(iter(drivers._links.values()))
                drivers.worker_exited(4242420, 9)

            node.on_loop(exited)
            assert client.ping() and time.monotonic() - start < 2.0  # the loop went on
            assert drivers._budget_ops[tag] == [
                ("book", one.hex(), 600), ("book", two.hex(), 100), ("release", 100),
                ("reconcile", 600, (4242420,))]
            assert drivers.statistics()["budget_waiting"] == 4
            with pytest.raises(kept_budget.BudgetBusy):  # nothing changed meanwhile
                kept_budget.change(str(shm), tag, [("release", 1)], wait_s=0.01)
        finally:
            _let_go(child)
        assert wait_until(lambda: kept_budget.reservations(str(shm), tag) == (600, []))
        assert node.on_loop(lambda: drivers.statistics()["budget_waiting"]) == 0
        assert node.on_loop(lambda: drivers.next_deadline()) is None
        assert client.free([one]) == 1 and kept_budget.used(str(shm), tag) == 0


def test_budget_ops_waiting_for_a_dropped_links_file_are_forgotten(node, tmp_path):
    from miniray._private.object_store import kept_budget

    shm = _kept_node(node, tmp_path)
    drivers = node.peering.drivers
    drivers.kept.cap_bytes = 1000
    one = b"\x01" * 28
    with node.client() as client:
        tag, cap = client.keeps()
        assert kept_budget.reserve(str(shm), tag, 600, cap, one)
        child = _hold_budget_lock(kept_budget.budget_path(str(shm), tag))
        try:
            client.keep(one, _write(shm, tag, one, b"x" * 600), 600)
            assert tag in drivers._budget_retry
        finally:
            client.close()  # the link goes: its tag swept, its waiting ops with it
            assert wait_until(lambda: tag not in drivers._budget_retry)
            _let_go(child)
    assert drivers._budget_ops == {}


def test_results_after_a_refused_keep_are_given_back_at_once(node, tmp_path):
    """Defect: a task's results after the one whose keep the node refused stayed on the
    node, reserved in the link's budget, until the link closed. Now the driver has the
    node book and free each of them at once (``KeptResults.keep_results``): their
    segments are unlinked and their room is back before the task fails."""
    from types import SimpleNamespace

    from miniray._private.core import protocol
    from miniray._private.object_store import kept_budget
    from miniray._private.owner.remote_objects import KeepRefused, KeptResults

    shm = _kept_node(node, tmp_path)
    node.peering.drivers.kept.cap_bytes = 1000
    owner = SimpleNamespace(defer=lambda fn: fn(), store=None)
    nodes = SimpleNamespace(owner=owner, last_view=lambda: [])
    results = KeptResults(nodes, None, None, 60.0)
    ids_ = [b"\x01" * 28, b"\x02" * 28, b"\x03" * 28]
    spec = SimpleNamespace(name="f", return_ids=ids_)
    with node.client() as client:
        tag, cap = client.keeps()
        for object_id, size in zip(ids_, (100, 200, 300)):
            assert kept_budget.reserve(str(shm), tag, size, cap, object_id)
        missing = str(shm / f"mr_{tag}_{ids_[0].hex()}")  # never written: refused
        items = [(protocol.OK, ("kept", missing, 100), ()),
                 (protocol.OK, ("kept", _write(shm, tag, ids_[1], b"x" * 200), 200), ()),
                 (protocol.OK, ("kept", _write(shm, tag, ids_[2], b"y" * 300), 300), ())]
        with pytest.raises(KeepRefused):
            results.keep_results(client, node.entry.node_id, spec, items)
        assert kept_budget.used(str(shm), tag) == 0  # every reservation given back
        assert os.listdir(shm) == [os.path.basename(kept_budget.budget_path(str(shm), tag))]
        assert node.peering.drivers.kept_rows() == []


def test_a_fetch_waits_behind_its_links_budget_changes_not_before_them(node, tmp_path):
    """Defect: the node's own fetch reserved in the budget file while changes of the same
    link waited for the lock; a waiting "unreserve" of the same object (an earlier fetch
    that failed) then removed the new fetch's reservation, and the file counted less than
    the segments held. Now a link with waiting changes refuses the fetch (the driver sends
    the value), and the changes land in order."""
    from miniray._private.object_store import kept_budget

    scene = _held_fetch(node, tmp_path)
    shm, one, value, drivers = scene.shm, scene.one, scene.value, scene.drivers
    drivers.kept.cap_bytes = 10 << 20
    with node.client() as home, node.client() as there:
        tag, grant = _kept_with_grant(node, shm, home, one, value)
        there_tag, _room = there.keeps()
        link = node.on_loop(lambda: drivers._by_tag[there_tag])

        def ask():
            return drivers._fetch(link, 8, one, len(value), scene.address, tag, grant,
                                  answer=None)

        child = _hold_budget_lock(kept_budget.budget_path(str(shm), there_tag))
        try:  # an earlier fetch of `one` failed while the lock was busy: its give-back waits
            node.on_loop(lambda: drivers._budget(there_tag,
                                                 ("unreserve", one.hex(), os.getpid())))
            assert node.on_loop(lambda: there_tag in drivers._budget_retry)
            # asked while the lock is still held, so no retry can land first (a retry
            # every BUDGET_RETRY_S raced the ask once the lock was let go)
            refused = node.on_loop(ask)
            assert refused[:3] == ("error", 8, "fetch_failed"), refused
            assert "busy" in refused[3]
        finally:
            _let_go(child)
        assert wait_until(lambda: node.on_loop(
            lambda: there_tag not in drivers._budget_retry), 2.0)
        assert kept_budget.reservations(str(shm), there_tag) == (0, [])
        scene.gate.set()
        assert node.on_loop(ask) is None  # the changes landed: reserved, fetched
        assert wait_until(lambda: not node.on_loop(lambda: bool(drivers._fetching)), 10.0)
        assert kept_budget.reservations(str(shm), there_tag) == (len(value), [])
        assert there.free([one]) == 1 and home.free([one]) == 1


def test_after_a_refused_keep_the_later_values_received_here_are_given_up(node, tmp_path):
    """Defect: after a refused keep, a later result of the task that came to the driver as
    a value (a segment received into its store) was never given up: it stayed in the
    store's directory, outside its accounting, until shutdown."""
    from types import SimpleNamespace

    from miniray._private.core import protocol
    from miniray._private.owner.remote_objects import KeepRefused, KeptResults

    shm = _kept_node(node, tmp_path)
    given_up = []
    owner = SimpleNamespace(defer=lambda fn: fn(),
                            store=SimpleNamespace(give_up_recycled=given_up.append))
    results = KeptResults(SimpleNamespace(owner=owner, last_view=lambda: []), None, None,
                          60.0)
    ids = [b"\x01" * 28, b"\x02" * 28, b"\x03" * 28]
    spec = SimpleNamespace(name="f", return_ids=ids)
    with node.client() as client:
        tag, _cap = client.keeps()
        items = [(protocol.OK, ("shm", "/driver/shm/seg0", 10), ()),
                 (protocol.OK, ("kept", str(shm / f"mr_{tag}_{ids[1].hex()}"), 100), ()),
                 (protocol.OK, ("shm", "/driver/shm/seg2", 10), ())]
        with pytest.raises(KeepRefused):  # no such segment on the node: refused
            results.keep_results(client, node.entry.node_id, spec, items)
    assert sorted(given_up) == ["/driver/shm/seg0", "/driver/shm/seg2"]


def test_a_pull_past_the_links_limit_is_told_busy_and_one_of_no_link_is_just_closed(
        node, tmp_path):
    """A link's pulls all taken: the next one's ask is read and answered "busy" (a granted
    puller asks again later), then closed; a pull naming no link is closed unanswered (its
    object is gone: final for the puller)."""
    from miniray._private.node.kept_serving import MAX_PULLS_PER_LINK

    _kept_node(node, tmp_path)
    with node.client() as client:
        tag, _room = client.keeps()
        held = [client.open_pull(tag) for _ in range(MAX_PULLS_PER_LINK)]
        try:
            assert wait_until(lambda: node.on_loop(
                lambda: len(node.peering.drivers._by_tag[tag].pulls)) == len(held), 5.0)
            extra = client.open_pull(tag)
            try:
                extra.send(("pull", 5, b"\x01" * 28))
                answer = extra.recv(timeout=5)
                assert answer[:3] == ("error", 5, "busy"), answer
                with pytest.raises((ConnectionError, OSError)):
                    extra.recv(timeout=5)  # then closed
            finally:
                extra.close()
        finally:
            for channel in held:
                channel.close()
        other = client.open_pull("nosuchtag0000000")
        try:
            other.send(("pull", 6, b"\x01" * 28))
            with pytest.raises((ConnectionError, OSError)):
                other.recv(timeout=5)
        finally:
            other.close()


def test_many_stalled_budget_files_wait_a_bounded_time_per_tick_and_each_is_reached(
        monkeypatch):
    """Defect: ``_retry_budgets`` waited up to BUDGET_WAIT_S per stalled tag at every tick,
    on the node's loop: 40 links whose budget files' locks a stopped worker holds cost
    200 ms per tick. Now BUDGET_TICK_S in all; the tags not reached keep their turn (the
    longest waiting first) and are tried at the next ticks (no real files: a fake clock)."""
    from miniray._private.node import kept_serving as ks
    from miniray._private.object_store import kept_budget

    clock = [100.0]
    monkeypatch.setattr(ks.time, "monotonic", lambda: clock[0])
    tried: list = []

    def change(_shm_dir, tag, ops, wait_s=None):
        assert wait_s is not None and 0 < wait_s <= ks.BUDGET_WAIT_S
        tried.append(tag)
        clock[0] += wait_s  # the whole wait spent: the lock stays busy
        raise kept_budget.BudgetBusy("held")

    monkeypatch.setattr(kept_budget, "change", change)
    serving = object.__new__(rd.RemoteDrivers)
    serving._shm_dir = "/nowhere"
    tags = [f"tag{index:05d}" for index in range(40)]
    serving._budget_ops = {tag: [("release", 1)] for tag in tags}
    serving._budget_retry = {tag: 99.0 + index * 1e-3 for index, tag in enumerate(tags)}
    start = clock[0]
    serving._retry_budgets(clock[0])
    assert clock[0] - start <= ks.BUDGET_TICK_S + 1e-9  # not 40 * BUDGET_WAIT_S
    assert tried == tags[:len(tried)] and len(tried) >= 1
    for _ in range(len(tags)):  # the next ticks reach the others, in their turn
        if len(set(tried)) == len(tags):
            break
        serving._retry_budgets(clock[0])
    assert sorted(set(tried)) == tags and tried[:len(tags)] == tags
    assert all(serving._budget_ops[tag] == [("release", 1)] for tag in tags)  # kept


def test_the_node_lists_the_groups_in_its_ledger(node):
    # Step 14: a driver of another host reads the groups reserved here (far_groups.py).
    mine, kept = "a1" * 14, "b2" * 14
    for hex_, detached in ((mine, False), (kept, True)):
        bundles = [{"CPU": 0.5}]
        record = {"id": hex_, "bundles": bundles, "name": hex_[:2], "detached": detached,
                  "nodes": [node.entry.node_id]}
        assert node.ledger.acquire_group(bundles, record,
                                         placement.bundle_provides(hex_, bundles),
                                         holder_pid=os.getpid()) is not None
    try:
        with node.client() as client:
            groups = client.groups()
        assert sorted(groups) == [mine, kept], groups  # far_groups leaves detached out
        assert groups[mine]["name"] == "a1" and groups[mine]["nodes"] == [node.entry.node_id]
    finally:
        for hex_ in (mine, kept):
            node.ledger.release_group(hex_)
    assert rd.parse_message(("groups", 3))[0] == "groups"
    assert rd.parse_message(("groups", 3, "x"))[0] is None


def test_a_loan_request_is_checked_and_a_group_no_driver_here_holds_lends_nothing(node):
    # Step 15 (loan_relay.py): only pg_lend, pg_return and pg_kept, well formed, reach a
    # driver.
    with node.client() as client:
        with pytest.raises(RemoteLeaseError) as info:
            client.loan("pg_kept", {"pg": "ab", "actor": "ff"})
        assert info.value.kind == "malformed"
        assert client.loan("pg_lend", {"pg": "ab", "index": 0, "base": {"CPU": 1}}) == {
            "loan": None}
        assert client.ping() < 5.0  # the link stays


def test_a_listing_gets_the_ledgers_groups_and_each_drivers_pending_rows(node, tmp_path):
    # Step 16 (group_listing.py): another host's listing of placement groups reads the
    # groups reserved here and the rows of those this node's drivers wait for; a driver
    # that does not answer within half the asker's wait is named, the rest still come.
    import socket

    from miniray._private.owner.placement_group_records import state_row
    from miniray._private.transport import state_socket
    from miniray._private.transport.node_client import sun_path

    node.peering.drivers.session_dir = str(tmp_path)  # as the node sets it
    reserved, waiting = "ab" * 18, "cd" * 18
    record = {"id": reserved, "name": "r", "bundles": [{"CPU": 1.0}], "nodes": ["n" * 16],
              "detached": False, "job_id": "01000000"}
    row = state_row({"id": waiting, "name": "w", "bundles": [{"CPU": 8.0}]}, "PENDING")
    server = state_socket.StateServer(state_socket.socket_path(str(tmp_path)), lambda: {},
                                      pending_groups=lambda: {"placement_groups": [row]})
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # never accepts: late
    with sun_path(state_socket.socket_path(str(tmp_path), os.getppid())) as name:
        silent.bind(name)
    silent.listen(1)
    node.ledger.acquire_group([{"CPU": 1.0}], record,
                              placement.bundle_provides(reserved, [{"CPU": 1.0}]),
                              holder_pid=os.getpid())
    try:
        with node.client() as client:
            doc = client.group_listing(0.4)
            assert client.ping() < 5.0  # the link stays
        assert node.peering.drivers.statistics()["listings"] == 1
    finally:
        node.ledger.release_group(reserved)
        server.close()
        silent.close()
    assert doc["reserved"] == {reserved: record}, doc
    assert doc["pending"] == [row], doc
    [late] = doc["missing"]  # (its socket's timeout or the bound: the same moment)
    assert late.startswith(f"driver pid {os.getppid()}: "), late
    assert late.endswith("did not answer within 0.2s"), late
    assert rd.parse_message(("pg_listing", 3, 1.5)) == ("pg_listing", 3, (1.5,))
    for wait in (0, -1.0, math.inf, "1", True):
        assert rd.parse_message(("pg_listing", 3, wait))[0] is None
