"""node/peering.py in one process: a head and a member Peering, each on its own selector,
stepped by the test over loopback TCP (no node processes). Bounded loops throughout."""

from __future__ import annotations

import selectors
import socket
import threading
import time

import pytest

from miniray._private.core.cluster_view import NodeEntry
from miniray._private.node import peering
from miniray._private.transport import peer_handshake as ph

TOKEN = b"t" * 40


class _Ledger:
    def __init__(self, path):
        self.path = str(path)
        self.free = {"CPU": 1.0}

    def available(self):
        return dict(self.free)


class Side:
    def __init__(self, tmp_path, name, ip, head=None, incarnation=1):
        (tmp_path / name).mkdir()
        self.sel = selectors.DefaultSelector()
        self.listener = peering.bind_listener(ip, 0)
        self.entry = NodeEntry(node_id=name * 8, ip=ip, port=self.listener.getsockname()[1],
                               is_head=head is None, totals={"CPU": 2.0, f"node:{ip}": 1.0},
                               incarnation=incarnation)
        self.ledger = _Ledger(tmp_path / name / "ledger.json")
        self.dir = str(tmp_path / name)
        self.head = head
        self.peering = None

    def start(self, channel=None, snapshot=None):
        self.peering = peering.Peering(entry=self.entry, listener=self.listener, token=TOKEN,
                                       session_dir=self.dir, ledger=self.ledger,
                                       head=self.head, channel=channel, snapshot=snapshot)
        self.peering.register(self.sel, lambda: None)

    def step(self):
        for key, _ in self.sel.select(0.01):
            key.data(key.fileobj)
        self.peering.tick(time.monotonic())


def run(sides, until, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for side in sides:
            if side.peering is not None:
                side.step()
        if until():
            return True
    return False


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRAY_HEARTBEAT_S", "0.05")
    monkeypatch.setenv("MINIRAY_NODE_DEAD_AFTER_S", "0.4")
    head = Side(tmp_path, "a", "127.0.0.1")
    head.start()
    member = Side(tmp_path, "b", "127.0.0.2", head=("127.0.0.1", head.entry.port))
    result = {}

    def join():
        result["x"] = peering.join_head(member.head, TOKEN, member.entry)

    thread = threading.Thread(target=join)
    thread.start()
    assert run([head], lambda: not thread.is_alive())
    thread.join()
    member.start(*result["x"])
    yield head, member
    for side in (member, head):
        side.peering.close("test over")
        side.sel.close()


def _node(side, name):
    return side.peering.view.nodes.get(name * 8)


def test_join_heartbeat_and_view_copy(cluster):
    head, member = cluster
    assert _node(head, "b").alive
    member.ledger.free = {"CPU": 0.5}
    assert run([head, member], lambda: _node(head, "b").available == {"CPU": 0.5})
    assert run([head, member], lambda: _node(member, "b") is not None
               and _node(member, "b").available == {"CPU": 0.5})
    assert peering.nc.read_cluster(member.dir)["linked"] is True


def test_a_member_held_dead_rejoins_as_a_new_incarnation(cluster):
    head, member = cluster
    # The member does not run for longer than dead_after (as under SIGSTOP).
    assert run([head], lambda: not _node(head, "b").alive, timeout=2.0)
    assert run([head, member], lambda: _node(head, "b").alive, timeout=5.0)
    assert _node(head, "b").incarnation == 2 and member.entry.incarnation == 2


def _spy_fence(member):
    calls = []
    real = member.peering.drivers.fence

    def fence(reason):
        calls.append((reason, member.peering._state, member.entry.incarnation))
        return real(reason)

    member.peering.drivers.fence = fence
    return calls


def test_a_member_held_dead_fences_remote_drivers_before_it_rejoins(cluster):
    head, member = cluster
    calls = _spy_fence(member)
    assert run([head], lambda: not _node(head, "b").alive, timeout=2.0)
    assert run([head, member], lambda: _node(head, "b").alive, timeout=5.0)
    assert len(calls) == 1, calls
    reason, state, incarnation = calls[0]
    # Fenced while still holding the old link, before the rejoin as incarnation 2.
    assert "dead" in reason and state == "linked" and incarnation == 2
    assert member.peering.drivers.refusing is None  # rejoined: serving drivers again


def test_a_member_without_acks_for_dead_after_fences_itself(cluster):
    head, member = cluster
    calls = _spy_fence(member)
    # The head does not run (hung, or cut off): the member stops hearing acks.
    assert run([member], lambda: calls, timeout=2.0)
    assert "no heartbeat answer" in calls[0][0]
    assert run([head, member], lambda: _node(head, "b").alive
               and _node(head, "b").incarnation == 2, timeout=5.0)


def _driver_link(side, ip):
    result = {}

    def connect():
        result["c"] = ph.connect((ip, side.entry.port), TOKEN, "driver",
                                 hello={"driver": {"host": "h", "pid": 1}}, timeout=2.0)

    thread = threading.Thread(target=connect)
    thread.start()
    assert run([side], lambda: not thread.is_alive())
    thread.join()
    return result["c"]


def test_a_member_that_loses_its_head_keeps_its_remote_drivers(cluster):
    head, member = cluster
    calls = _spy_fence(member)
    head.peering.close("the head stops")  # EOF at the member: not a death sentence
    assert run([member], lambda: member.peering._state != "linked", timeout=2.0)
    run([member], lambda: False, timeout=0.6)  # past dead_after (0.4 s)
    assert calls == []


@pytest.mark.parametrize("which", ["head", "member"])
def test_a_head_accepts_drivers_and_a_member_too(cluster, which):
    side = cluster[0] if which == "head" else cluster[1]
    channel = _driver_link(side, "127.0.0.1" if which == "head" else "127.0.0.2")
    assert channel.peer_hello["node_id"] == side.entry.node_id
    assert run([side], lambda: side.peering.drivers.statistics()["links"] == 1)
    channel.close()
    assert run([side], lambda: side.peering.drivers.statistics()["links"] == 0)


def test_leave_is_an_expected_death(cluster):
    head, member = cluster
    member.peering.close("stopped by the test")
    assert run([head], lambda: not _node(head, "b").alive, timeout=2.0)
    assert _node(head, "b").death_reason == 1


def test_an_authenticated_peer_with_nonsense_is_dropped_not_obeyed(cluster):
    head, _member = cluster
    rogue = {}

    def connect():
        entry = NodeEntry(node_id="c" * 8, ip="127.0.0.3", port=1, totals={"CPU": 1.0},
                          labels={"bad": 1})  # malformed: refused
        try:
            peering.join_head(("127.0.0.1", head.entry.port), TOKEN, entry, timeout=2.0)
        except (ConnectionError, TimeoutError, OSError) as error:
            rogue["error"] = error

    thread = threading.Thread(target=connect)
    thread.start()
    assert run([head], lambda: not thread.is_alive(), timeout=5.0)
    assert "error" in rogue and _node(head, "c") is None
    # A well-formed member that sends an unknown message has its link closed.
    made = {}

    def connect_well_formed():
        made["channel"] = ph.connect(
            ("127.0.0.1", head.entry.port), TOKEN, "join", source_address=("127.0.0.4", 0),
            hello={"node": NodeEntry(node_id="d" * 8, ip="127.0.0.4", port=1,
                                     totals={"CPU": 1.0}).to_json()})

    thread = threading.Thread(target=connect_well_formed)
    thread.start()
    assert run([head], lambda: not thread.is_alive(), timeout=5.0)
    channel = made["channel"]
    try:
        assert run([head], lambda: _node(head, "d") is not None)
        channel.send(("rm -rf", "/"))
        assert run([head], lambda: head.peering.statistics()["members"] == 1)
    finally:
        channel.close()


def test_a_busy_port_names_itself():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(peering.nc.NodeStartError, match=f"127.0.0.1:{port}.*--port 0"):
            peering.bind_listener("127.0.0.1", port)


def test_a_member_without_its_head_does_not_spin(cluster):
    head, member = cluster
    head.peering.close("head gone")
    assert run([member], lambda: member.peering.statistics()["state"] != "linked", 2.0)
    now = time.monotonic()
    member.peering._connecting = True  # a rejoin in flight: nothing else is due
    assert member.peering.due(now) >= now + 0.04


def test_a_heartbeat_that_arrived_while_the_loop_was_busy_is_read_before_judging(cluster):
    """The node's loop runs a handler for longer than dead_after (or is not scheduled)
    after its select: the member's heartbeat sent meanwhile waits unread on the socket.
    The tick that follows reads it before the failure detector judges, so the member is
    not held dead (a false death killed the actors on it); likewise a member's ack."""
    head, member = cluster
    assert run([head, member], lambda: _node(head, "b").alive, timeout=2.0)
    for side in (head, member):
        side.step()
    time.sleep(0.45)  # neither loop reads: both are "busy" for longer than dead_after
    peering._send(member.peering._link, ("hb", 10_000, member.entry.incarnation, None))
    time.sleep(0.05)  # on the head's socket, unread
    head.peering.tick(time.monotonic())  # the tick after the busy handler, no select
    assert _node(head, "b").alive
    time.sleep(0.05)  # the head's ack, on the member's socket, unread
    calls = _spy_fence(member)
    member.peering.tick(time.monotonic())
    assert calls == [] and member.peering._state == "linked"
