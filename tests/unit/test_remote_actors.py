"""remote_actors' local pieces: an actor's lease request, what its worker's sender
writes (in order; an argument in this driver's shared memory by value), and its GETs and
WAITs on bounded helper threads (``_Blocking``)."""

from __future__ import annotations

import threading
import time

from miniray._private.core import protocol
from miniray._private.core.task_spec import ActorCreationSpec
from miniray._private.owner import remote_actors as ra

from .test_remote_drivers import wait_until


class _Data:
    def __init__(self):
        self.sent = []
        self.done = threading.Event()

    def send(self, message):
        self.sent.append(message)
        if message[0] == protocol.ACTOR_CALL and message[1] == b"last":
            self.done.set()


class _Inner:
    def __init__(self):
        self.pid = 7
        self.data = _Data()
        self.ctl = object()
        self.out = self.err = None  # its output streams (remote_worker.RemoteWorker)
        self.closed = False

    def close(self):
        self.closed = True


class _Entry:
    node_id, ip, incarnation = "n" * 56, "10.0.0.2", 1


class _Store:
    def __init__(self, shm_dir):
        self.shm_dir = shm_dir


def test_an_actors_lease_asks_for_what_it_holds_for_its_life():
    spec = ActorCreationSpec(actor_id=b"a" * 16, class_name="C", held={"CPU": 0, "X": 2},
                             placement={"CPU": 1, "X": 2}, affinity=("n", True, False))
    ask = ra._Ask(spec)
    assert ask.request == {"X": 2.0} and ask.name == "actor C"
    assert ask.affinity == ("n", True, False)
    assert ra._Ask(ActorCreationSpec(actor_id=b"a" * 16, class_name="C")).request == {}


def test_the_sender_writes_in_order_and_sends_a_shared_memory_argument_by_value(tmp_path):
    segment = tmp_path / "seg"
    segment.write_bytes(b"payload-bytes")
    inner = _Inner()
    worker = ra.RemoteActorWorker(inner, None, _Entry(), "lease", [], _Store(str(tmp_path)))
    try:
        worker.send((protocol.FUNC, b"f", b"code"))
        worker.send((protocol.ACTOR_INIT, b"a", b"f", "C", b"args",
                     [(0, protocol.OK, ("shm", "seg", 13))], ()))
        worker.send((protocol.ACTOR_CALL, b"last", "m", b"args",
                     [(0, protocol.OK, b"inline"), ("k", protocol.OK, ("shm", str(segment), 13))],
                     [b"r"], 1, "m", None))
        assert inner.data.done.wait(5)
    finally:
        worker.close()
    func, init, call = inner.data.sent
    assert func == (protocol.FUNC, b"f", b"code")
    assert init[5] == [(0, protocol.OK, ("peer", b"payload-bytes"))] and init[6] == ()
    assert call[4] == [(0, protocol.OK, b"inline"),
                       ("k", protocol.OK, ("peer", b"payload-bytes"))]
    assert call[5:] == ([b"r"], 1, "m", None)
    assert inner.closed and worker.ip == "10.0.0.2" and worker.elsewhere

class _Asks:
    """Stands in for ``RemoteRequests``: each ``serve`` blocks until released."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.served: list = []
        self.release = threading.Event()

    def serve(self, message):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(10)
        with self.lock:
            self.running -= 1
            self.served.append(message[1])
        if message[1] == "boom":
            raise OSError("the worker's data connection closed while it waited")
        return True


def test_waits_are_served_at_once_up_to_the_bound_then_in_turn(monkeypatch):
    monkeypatch.setattr(ra, "BLOCKING_THREADS", 3)
    asks = _Asks()
    blocking = ra._Blocking(asks, "worker")
    for n in range(7):
        blocking.submit(("GET", n))
    assert wait_until(lambda: asks.running == 3, timeout=10.0)
    time.sleep(0.05)
    assert asks.running == 3 and blocking.threads == 3 and len(blocking.waiting) == 4
    asks.release.set()
    assert wait_until(lambda: blocking.threads == 0, timeout=10.0)
    assert sorted(asks.served) == list(range(7)) and asks.most == 3


def test_a_wait_that_ends_with_the_worker_ends_its_thread_only():
    asks = _Asks()
    asks.release.set()
    blocking = ra._Blocking(asks, "worker")
    blocking.submit(("GET", "boom"))
    blocking.submit(("GET", 1))
    assert wait_until(lambda: blocking.threads == 0, timeout=10.0)
    assert sorted(map(str, asks.served)) == ["1", "boom"]


# ------------------------------------------------------------- ray.kill of a worker on N
class _KillClient:
    """``RemoteNodeClient.kill`` answering each ask in turn from ``outcomes``."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.asked = 0

    def kill(self, pid, timeout=None):
        self.asked += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome


def test_a_kill_that_timed_out_is_asked_again(monkeypatch):
    """Defect: the kill of an actor's worker on N that failed once (the link blipped: a
    timeout) was never asked again; only its connections were closed, and a worker busy
    in a call kept running. Now a timeout is asked again, bounded; a lost link (N kills
    the link's workers itself) or a worker N no longer knows (it exited) is not."""
    from miniray._private.transport.remote_node import RemoteLeaseError
    from miniray.exceptions import NodeDiedError

    monkeypatch.setattr(ra, "KILL_PAUSE_S", 0.001)
    blip = TimeoutError("the node did not answer 'kill' within 2 s")
    client = _KillClient(blip, blip)
    assert ra.kill_on_node(client, 7) is None and client.asked == 3
    client = _KillClient(blip, blip, blip, blip)
    assert "did not answer" in ra.kill_on_node(client, 7) and client.asked == ra.KILL_TRIES
    client = _KillClient(RemoteLeaseError("not this link's", kind="unknown_worker"))
    assert ra.kill_on_node(client, 7) is None and client.asked == 1  # exited already
    client = _KillClient(NodeDiedError("its link closed"), None)
    assert "link closed" in ra.kill_on_node(client, 7) and client.asked == 1


def test_kill_later_closes_the_connections_only_when_the_kill_never_landed(monkeypatch):
    monkeypatch.setattr(ra, "KILL_PAUSE_S", 0.001)
    closed = []
    worker = ra.RemoteActorWorker.__new__(ra.RemoteActorWorker)
    worker.pid, worker.ip = 7, "127.0.0.2"
    worker.inner = type("Inner", (), {"close": lambda self: closed.append(1)})()
    worker.client = _KillClient(TimeoutError("slow"))
    worker.kill_later()
    assert wait_until(lambda: worker.client.asked == 2)
    time.sleep(0.05)
    assert closed == []  # killed on the second ask
    worker.client = _KillClient(*[TimeoutError("slow")] * ra.KILL_TRIES)
    worker.kill_later()
    assert wait_until(lambda: closed == [1])


# ------------------------------------------------- SPREAD on a view that lags the placements
class _SpreadNodes:
    """Stands in for ``RemoteNodes``: the view the test sets, read as ``where`` reads it."""

    closed = False
    local = "a"

    def __init__(self, view):
        self.now = view

    def view(self, fresh=False):
        return self.now

    def last_view(self):
        return self.now


def _spread_placer(monkeypatch, view):
    from miniray._private.owner.actor_records import A_ALIVE

    monkeypatch.setattr(ra, "infeasible_reasons", lambda state, request: [])
    monkeypatch.setattr(ra.RemoteActors, "_run", lambda self, actor, entry, bundle=None: None)
    manager = type("Manager", (), {})()
    manager.actors = {}
    placer = ra.RemoteActors.__new__(ra.RemoteActors)
    placer.owner = type("Owner", (), {"node_state": None})()
    placer.manager, placer.nodes = manager, _SpreadNodes(view)
    placer.excluded, placer.moves, placer.in_bundle = {}, {}, {}
    placer.started = placer.spread_turns = 0
    placer.spread_on = {}

    def place(n):
        spec = ActorCreationSpec(actor_id=bytes([n]) * 16, class_name="Where",
                                 affinity=ra.task_nodes.SPREAD, placement={"CPU": 0.5},
                                 held={"CPU": 0.5})
        actor = type("Actor", (), {"spec": spec, "state": A_ALIVE})()
        manager.actors[spec.actor_id] = actor
        return placer.where(spec, actor) or "a", actor

    return placer, place


def test_spread_actors_count_their_own_placements_the_view_does_not_show_yet(monkeypatch):
    """Four SPREAD actors over two idle nodes land 2 and 2 whenever the view is read. Read
    while the first (here, on "a") started its worker, the view showed it and not the second,
    placed on "b" a moment later: the least used node by that view, "b", took the third and
    the fourth too (3 and 1) until the view counted the driver's own placements."""
    from miniray._private.core.cluster_view import NodeEntry

    def entry(node_id, free):
        return NodeEntry(node_id, "10.0.0." + str(ord(node_id) - 96), 1,
                         totals={"CPU": 2.0}, available={"CPU": free})

    placer, place = _spread_placer(monkeypatch, [entry("a", 2.0), entry("b", 2.0)])
    first, _ = place(1)
    placer.nodes.now = [entry("a", 1.5), entry("b", 2.0)]  # read again: the first shows
    rest = [place(n)[0] for n in (2, 3, 4)]
    assert [first] + rest == ["a", "b", "a", "b"]
    assert placer.spread_on == {bytes([n]) * 16: node for n, node in
                                zip((1, 2, 3, 4), ["a", "b", "a", "b"])}


def test_spread_counts_only_its_live_actors_and_not_one_placed_again(monkeypatch):
    from miniray._private.core.cluster_view import NodeEntry
    from miniray._private.owner.actor_records import A_DEAD

    view = [NodeEntry(n, "", 1, totals={"CPU": 2.0}, available={"CPU": 2.0}) for n in "ab"]
    placer, place = _spread_placer(monkeypatch, view)
    node, first = place(1)
    assert node == "a" and placer.spread_on == {first.spec.actor_id: "a"}
    # Placed again (a restart): its own old place is not counted against "a".
    assert placer._spread_view(first.spec, view)[0].available == {"CPU": 2.0}
    first.state = A_DEAD  # dead: forgotten, its node's view is the view's again
    second = place(2)[1]
    assert placer._spread_view(second.spec, view)[1].available == {"CPU": 2.0}
    assert first.spec.actor_id not in placer.spread_on


def test_a_lent_actor_follows_its_bundle_only_with_lent_room_and_a_restart_left():
    """The service's side of SVC_LENT_MOVED (``remote_bundles`` step 7): its restart goes
    to the bundle's new place when it has lent room here and a restart left; the driver
    ends the loan on False."""
    from miniray._private.core import placement
    from miniray._private.owner.remote_bundles import RemoteBundles

    class _Manager:
        placed = 0

        def place_again(self, actor):
            self.placed += 1

    owner, pg_hex = _Manager(), "ab" * 18
    bundles = RemoteBundles(None, None)
    placer = ra.RemoteActors.__new__(ra.RemoteActors)
    placer.manager, placer.in_bundle = owner, {}
    placer.nodes = type("Nodes", (), {"bundles": bundles})()
    request = placement.rewrite_request({"CPU": 1}, pg_hex, 1)
    spec = ActorCreationSpec(actor_id=b"m" * 16, class_name="C", placement=request,
                             held=request, pg=(pg_hex, 1, False))
    actor = type("Actor", (), {"spec": spec, "restarts_left": 1})()
    old, new = type("Entry", (), {"node_id": "n"})(), type("Entry", (), {"node_id": "m"})()
    spec.lent = (old, [], "", False)
    bundles.borrow(spec)
    placer.in_bundle[spec.actor_id] = bundles.borrowed[spec.actor_id]
    # Told while its worker still counts as alive on the dead node: kept for its end.
    assert placer.lent_moved(actor, new, ["1"]) and owner.placed == 0
    assert bundles.moved_to[spec.actor_id][1][0] is new
    actor.restarts_left = 0  # no restart left: it will not follow
    bundles.moved_to.clear()
    assert not placer.lent_moved(actor, new, ["1"])
    # Its node's death seen (the restart waits, its restart counted): borrowed there now.
    del placer.in_bundle[spec.actor_id]
    bundles.follow_ledger(spec)
    assert placer.lent_moved(actor, new, ["1"]) and owner.placed == 1  # queued again
    assert spec.lent == (new, ["1"], "", False) and bundles.borrowed[spec.actor_id].entry is new
    # Lent by a driver of another node: the restart waits for its word (this node's
    # ledger never holds the group), then goes to the bundle's new place, on another
    # node or on that driver's own (``here``: leased from that node's ledger there).
    lender = type("Entry", (), {"node_id": "lender"})()
    spec.lent = (old, [], "lender", True)
    del bundles.borrowed[spec.actor_id]
    bundles.borrow(spec)
    bundles.follow_ledger(spec)
    assert bundles.awaits_lender(spec.actor_id) and bundles.lender_watched == {
        pg_hex: "lender"}
    assert placer.lent_moved(actor, lender, [], here=True)
    assert spec.lent == (lender, [], "lender", True, True) and not bundles.awaits_lender(
        spec.actor_id)
    assert bundles.leased_there(spec.actor_id) is lender
    # "Here" from a driver of this node: its ledger is this one's, nothing to move.
    spec.lent = (old, [], "", False)
    bundles.on_lender_node.clear()
    bundles.borrow(spec)
    bundles.follow_ledger(spec)
    assert not bundles.awaits_lender(spec.actor_id)
    assert not placer.lent_moved(actor, lender, [], here=True)
    # Not in a placement group: nothing to move.
    plain = ActorCreationSpec(actor_id=b"p" * 16, class_name="C")
    assert not placer.lent_moved(type("Actor", (), {"spec": plain, "restarts_left": 1})(),
                                 new, [])
