"""The actor service keeps its own node's large results for drivers on other hosts with one
thread, in each driver's order, and asks for its link to its own node again after a failure
(``node/actor_service.py``, ``node/reply_keeper.py``), without processes."""

from __future__ import annotations

import doctest
import threading
import time
import types

from miniray._private.node import actor_service, reply_keeper
from miniray._private.node.actor_service import ActorService, _Client
from miniray._private.node.reply_keeper import LinkRetry, ReplyKeeper


def test_the_keepers_doctests():
    assert doctest.testmod(reply_keeper, raise_on_error=False).failed == 0


def _service():
    service = object.__new__(ActorService)
    lock = threading.RLock()
    reactor = types.SimpleNamespace(call_later=lambda _delay, callback: callback())
    service.owner = types.SimpleNamespace(
        locked=lambda: lock, reactor=reactor, streams=types.SimpleNamespace(forward={}),
        objects=types.SimpleNamespace(get=lambda _id: None))
    service._own_link = None
    service._link_retry = LinkRetry()
    service._keeper = ReplyKeeper(service._keep_here)
    return service, lock


def _keep_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "miniray-svc-keep")


def test_a_burst_of_kept_replies_uses_one_thread_and_keeps_each_drivers_order():
    service, lock = _service()
    gate = threading.Event()
    sent: list = []
    kept: list = []
    link = object()
    service._here = lambda: link

    def keep_segment(_link, object_id, kind, data):
        gate.wait(10)  # a slow KEEP round trip: every reply of the burst waits behind it
        kept.append(object_id)
        return kind, ("remote", object_id)

    service._keep_segment = keep_segment
    service._keeps_here = lambda client, results: any(d[0] == "shm" for _k, d in results)
    service._send_reply = lambda client, task_id, return_ids, results, nested: sent.append(
        (client.token, task_id, results[0][1][0]))
    before = _keep_threads()
    one = _Client("one", 1, "t" * 16, "", ("n" * 56, "127.0.0.2"))
    two = _Client("two", 2, "u" * 16, "", ("n" * 56, "127.0.0.2"))
    try:
        with lock:
            for index in range(40):
                large = ("shm", f"seg{index}", 1 << 20)
                service._reply(one, b"%d" % index, [b"r%d" % index], [(0, large)], None)
            # a small result of the same driver answered after: it must not overtake them
            service._reply(one, b"small", [b"rs"], [(0, b"bytes")], None)
            # another driver's small result has nothing queued: it goes at once
            service._reply(two, b"other", [b"ro"], [(0, b"bytes")], None)
        assert sent == [("two", b"other", 98)]  # b"bytes"[0]
        assert _keep_threads() - before <= 1, "a thread per reply"
        gate.set()
        deadline = time.monotonic() + 10
        while len(sent) < 42 and time.monotonic() < deadline:
            time.sleep(0.01)
        order = [task for token, task, _what in sent if token == "one"]
        assert order == [b"%d" % i for i in range(40)] + [b"small"]
        assert all(what == "remote" for token, task, what in sent[1:-1])
        assert kept == [b"r%d" % i for i in range(40)]
        assert not service._keeper.waiting  # every queued reply went
        with lock:  # nothing queued now: the next small result goes at once
            service._reply(one, b"late", [b"rl"], [(0, b"bytes")], None)
        assert sent[-1][1] == b"late"
    finally:
        gate.set()
        service._keeper.close()
    assert _keep_threads() == before


def test_a_failing_keep_still_sends_the_reply_unchanged():
    service, lock = _service()
    sent: list = []
    service._here = lambda: object()

    def keep_segment(*_args):
        raise RuntimeError("rename failed oddly")

    service._keep_segment = keep_segment
    service._keeps_here = lambda client, results: True
    service._send_reply = lambda client, task_id, return_ids, results, nested: sent.append(
        results)
    client = _Client("one", 1, "t" * 16, "", ("n" * 56, "127.0.0.2"))
    try:
        with lock:
            service._reply(client, b"t", [b"r"], [(0, ("shm", "seg", 10))], None)
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sent == [[(0, ("shm", "seg", 10))]]
        assert not service._keeper.waiting
    finally:
        service._keeper.close()


class _Nodes:
    local = "n" * 56

    def __init__(self):
        self.views = 0
        self.broken = True
        self.kept_results = types.SimpleNamespace(grant_key=lambda link, timeout=None: None)

    def view(self):
        self.views += 1
        if self.broken:
            return []  # this node not in the view yet
        return [types.SimpleNamespace(node_id=self.local)]

    def client(self, entry):
        return types.SimpleNamespace(kept=("t" * 16, 1 << 30), lost=None, node_id=entry.node_id)


def test_the_link_to_its_own_node_is_asked_for_again_after_a_failure_not_more_often(
        monkeypatch):
    service, lock = _service()
    nodes = _Nodes()
    service.owner._remote_nodes = lambda: nodes
    service.owner.hello_info = {"session_dir": "/tmp/x"}
    monkeypatch.setattr("miniray._private.owner.remote_nodes.keep_results", lambda: True)
    now = [1000.0]
    monkeypatch.setattr(actor_service.time, "monotonic", lambda: now[0])
    client = _Client("one", 1, "t" * 16, "", ("n" * 56, "127.0.0.2"))
    results = [(0, ("shm", "seg", 1 << 20))]
    assert service._keeps_here(client, results)
    assert service._here() is None and nodes.views == 1
    now[0] += 1.0  # within the pause: not kept, not asked
    assert not service._keeps_here(client, results)
    assert service._here() is None and nodes.views == 1
    nodes.broken = False
    now[0] += reply_keeper.RETRY_S  # past it: asked again, and had
    assert service._keeps_here(client, results)
    link = service._here()
    assert link is not None and nodes.views == 2
    assert service._here() is link and nodes.views == 2  # kept, not asked again
    link.lost = "the node went"  # lost: asked again at once
    assert service._here() is not link and nodes.views == 3


def test_replies_cross_at_once_while_the_link_to_its_own_node_is_asked_for(monkeypatch):
    """Defect: while the keeper's thread asked for the link (a grant key that takes up to
    its timeout), every large reply of every driver on another host queued behind it, and
    their small replies behind those; with a link that kept failing, for seconds out of
    every RETRY_S. Now an attempt in progress counts as a try: replies cross at once
    meanwhile, and the grant key is asked OWN_LINK_TIMEOUT_S at most."""
    service, lock = _service()
    nodes = _Nodes()
    nodes.broken = False
    asked = []
    inside = []

    def grant_key(link, timeout=None):
        asked.append(timeout)
        inside.append(service._keeps_here(client, results))  # while it is asked
        raise LookupError("no answer")

    nodes.kept_results = types.SimpleNamespace(grant_key=grant_key)
    service.owner._remote_nodes = lambda: nodes
    service.owner.hello_info = {"session_dir": "/tmp/x"}
    monkeypatch.setattr("miniray._private.owner.remote_nodes.keep_results", lambda: True)
    client = _Client("one", 1, "t" * 16, "", ("n" * 56, "127.0.0.2"))
    results = [(0, ("shm", "seg", 1 << 20))]
    assert service._keeps_here(client, results)
    assert service._here() is None
    assert asked == [actor_service.OWN_LINK_TIMEOUT_S] and inside == [False]
    assert not service._keeps_here(client, results)  # failed: not before RETRY_S
