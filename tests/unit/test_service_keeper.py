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
    service._here_lock = threading.Lock()
    service._keeper = ReplyKeeper(service._keep_here)
    service._pulls = set()
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


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def _gated_service(threads: int = reply_keeper.THREADS):
    """A service whose keeps of driver "one" wait for ``gate``; what it sends recorded
    as (token, task id or ("yield", index), what)."""
    service, lock = _service()
    service._keeper = ReplyKeeper(service._keep_here, threads=threads)
    gate = threading.Event()
    sent: list = []
    service._here = lambda: object()

    def keep_segment(_link, object_id, kind, data):
        if object_id.startswith(b"one"):
            gate.wait(10)  # a slow KEEP round trip for this driver only
        return kind, ("remote", object_id)

    service._keep_segment = keep_segment
    service._keeps_here = lambda client, results: any(d[0] == "shm" for _k, d in results
                                                      if type(d) is tuple)
    service._send_reply = lambda client, task_id, return_ids, results, nested: sent.append(
        (client.token, task_id, results[0][1]))
    service.send = lambda client, message: sent.append(
        (client.token, ("yield", message[2]), message[4])) or True
    return service, lock, gate, sent


def _driver(token: str) -> _Client:
    return _Client(token, 1, "t" * 16, "", ("n" * 56, "127.0.0.2"))


def test_one_drivers_slow_keep_does_not_hold_another_drivers_replies():
    """Defect: the keeper was one FIFO across every driver: a keep of one driver that
    waited (a slow round trip on the link to its own node) held every other driver's
    replies. Now each driver has its queue, served by a few threads: another driver's
    kept reply goes at once, each driver's replies keep their order, and a burst of many
    drivers uses THREADS threads at most."""
    service, lock, gate, sent = _gated_service()
    one, two = _driver("one"), _driver("two")
    before = _keep_threads()
    try:
        with lock:
            service._reply(one, b"1a", [b"one-a"], [(0, ("shm", "s1", 1 << 20))], None)
            service._reply(one, b"1b", [b"one-b"], [(0, b"small")], None)
            service._reply(two, b"2a", [b"two-a"], [(0, ("shm", "s2", 1 << 20))], None)
            service._reply(two, b"2b", [b"two-b"], [(0, b"small")], None)
        assert _wait_for(lambda: len(sent) >= 2), sent
        assert sent == [("two", b"2a", ("remote", b"two-a")), ("two", b"2b", b"small")]
        gate.set()
        assert _wait_for(lambda: len(sent) == 4)
        assert [task for token, task, _ in sent if token == "one"] == [b"1a", b"1b"]
        gate.clear()
        with lock:  # a burst of many drivers, each blocked: bounded threads
            for index in range(12):
                service._reply(_driver(f"d{index}"), b"t", [b"one-%d" % index],
                               [(0, ("shm", "s", 1 << 20))], None)
        assert _wait_for(lambda: service._keeper.statistics()["running"]
                         == reply_keeper.THREADS)
        assert _keep_threads() - before <= reply_keeper.THREADS
        gate.set()
        assert _wait_for(lambda: len(sent) == 16)
        assert not service._keeper.waiting
    finally:
        gate.set()
        service._keeper.close()
    assert _keep_threads() == before


def test_a_streaming_value_does_not_overtake_its_drivers_queued_result():
    """Defect: SVC_YIELD went at once while a reply of the same driver waited in the
    keeper: the driver saw a later streaming call's values before an earlier call's
    result (``ray.wait`` over both found the later one ready first, out of the actor's
    order). Now a value queues behind its driver's replies; another driver's goes at
    once."""
    service, lock, gate, sent = _gated_service()
    one, two = _driver("one"), _driver("two")
    service.owner.objects = types.SimpleNamespace(get=lambda _id: None)
    try:
        with lock:
            service._reply(one, b"big", [b"one-big"], [(0, ("shm", "s", 1 << 20))], None)
            service._reply_value(one, b"gen", 0, 0, b"item0", None)
            service._reply_value(two, b"gen2", 0, 0, b"other", None)
        assert sent == [("two", ("yield", 0), b"other")]
        gate.set()
        assert _wait_for(lambda: len(sent) == 3)
        assert sent[1:] == [("one", b"big", ("remote", b"one-big")),
                            ("one", ("yield", 0), b"item0")]
        assert not service._keeper.waiting
        with lock:  # nothing queued: at once
            service._reply_value(one, b"gen", 1, 0, b"item1", None)
        assert sent[-1] == ("one", ("yield", 1), b"item1")
    finally:
        gate.set()
        service._keeper.close()


def test_closing_the_keeper_sends_or_fails_every_queued_reply():
    """Defect: ``close`` dropped the queued replies silently (their callers waited for
    results that never came, their segments stayed). Now each is sent at once as a plain
    value (nothing kept) when its driver can still receive it in order, else failed:
    its segments removed, its kept copies freed."""
    service, lock, gate, sent = _gated_service(threads=1)
    one, two = _driver("one"), _driver("two")
    discarded: list = []
    service._discard = discarded.append
    freed: list = []
    copy = types.SimpleNamespace(free=lambda: freed.append("copy"))
    try:
        with lock:
            service._reply(one, b"1a", [b"one-a"], [(0, ("shm", "s1", 1))], None)
            service._reply(one, b"1b", [b"one-b"], [(0, ("shm", "s1b", 1))], None)
            service._reply(one, b"1c", [b"one-c"], [(0, ("remote", copy))], None)
            # the one thread is in 1a: driver two's reply waits, not begun
            service._reply(two, b"2a", [b"two-a"], [(0, ("shm", "s2", 1))], None)
        assert _wait_for(lambda: service._keeper.statistics()["running"] == 1)
        left = service._keeper.close(timeout=0.1)
        assert [job[1] for job in left] == [b"1b", b"1c", b"2a"]
        with lock:
            service._settle_queued(left)
        # two's: its driver still there, nothing of its unsent: sent, not kept
        assert sent == [("two", b"2a", ("shm", "s2", 1))]
        # one's: its 1a not sent yet (in progress): failed, not sent out of order
        assert discarded == [("shm", "s1b", 1)] and freed == ["copy"]
        assert service._keeper.waiting == {"one": 1}  # 1a's, done when it is sent
        assert not service._keeper.put("two", (two,))  # closed
    finally:
        gate.set()


def test_a_result_kept_for_a_caller_that_named_no_node_is_pulled_and_sent_as_a_value():
    """Defect: ``_hand_on_kept`` failed a result kept on its actor's node for a caller
    that named no node (ObjectLostError "link lost"). Now the keeper pulls it here for
    that caller, in its turn, and it goes as a value, as before results were kept; a
    caller that left is told so, not "link lost"."""
    service, lock, gate, sent = _gated_service()
    nameless = _Client("far", 1, "t" * 16, "", ("", ""))
    pulled: list = []

    def pull_here(object_id, kind, copy):
        pulled.append((object_id, copy))
        return kind, ("shm", "/pulled", 5)

    service._pull_here = pull_here
    copy = types.SimpleNamespace(node_id="m" * 56, free=lambda: None)
    try:
        with lock:
            service._reply(nameless, b"t", [b"far-r"], [(0, ("remote", copy))], None)
        assert _wait_for(lambda: sent)
        assert pulled == [(b"far-r", copy)] and sent == [("far", b"t", ("shm", "/pulled", 5))]
    finally:
        service._keeper.close()
    freed: list = []
    copy = types.SimpleNamespace(node_id="m" * 56, free=lambda: freed.append(True))
    service.owner.remote_nodes = types.SimpleNamespace(kept_results=types.SimpleNamespace(
        hand_on=lambda *args: None))
    gone = _driver("gone")
    gone.gone = True
    kind, data = service._hand_on_kept(0, copy, gone, b"r")
    error = actor_service.serialization.loads(data)
    assert kind == actor_service.protocol.ERR and freed == [True]
    assert "left before it was handed on" in str(error) and "was lost" not in str(error)
    kind, data = service._hand_on_kept(0, copy, _driver("here"), b"r")
    assert "link to that node was lost" in str(actor_service.serialization.loads(data))


def test_keeper_threads_at_once_ask_for_the_link_to_its_own_node_once(monkeypatch):
    """With a thread per driver, two keeps may need the link at the same moment: one asks
    (its grant key, up to OWN_LINK_TIMEOUT_S), the other goes on without it at once."""
    service, lock = _service()
    nodes = _Nodes()
    nodes.broken = False
    inside = threading.Event()
    release = threading.Event()
    asked: list = []

    def grant_key(link, timeout=None):
        asked.append(timeout)
        inside.set()
        release.wait(10)

    nodes.kept_results = types.SimpleNamespace(grant_key=grant_key)
    service.owner._remote_nodes = lambda: nodes
    first: list = []
    thread = threading.Thread(target=lambda: first.append(service._here()))
    thread.start()
    try:
        assert inside.wait(10)
        assert service._here() is None and len(asked) == 1  # not asked twice
    finally:
        release.set()
        thread.join(10)
    assert first and first[0] is not None and service._here() is first[0]


def _start_fails_once(monkeypatch):
    real_start = threading.Thread.start
    failures = [1]

    def start(thread):
        if failures and thread.name == "miniray-svc-keep":
            failures.pop()
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)


def test_a_keeper_thread_that_cannot_start_leaves_no_job_stuck(monkeypatch):
    done: list = []
    keeper = ReplyKeeper(done.append, threads=2)
    _start_fails_once(monkeypatch)
    assert keeper.put("a", ("a", 1)) is False  # no thread to serve it: sent at once
    assert "a" not in keeper.waiting and keeper.statistics()["threads"] == 0
    assert keeper.put("a", ("a", 2)) is True
    assert keeper.drain(5.0) and done == [("a", 2)]
    assert keeper.close(5.0) == []  # no unstarted thread to join


def test_a_job_whose_thread_cannot_start_waits_for_a_running_one(monkeypatch):
    gate = threading.Event()
    done: list = []

    def work(job):
        gate.wait(10)
        done.append(job)

    keeper = ReplyKeeper(work, threads=2)
    try:
        assert keeper.put("a", ("a", 1))
        assert _wait_for(lambda: keeper.statistics()["running"] == 1)
        _start_fails_once(monkeypatch)
        assert keeper.put("b", ("b", 1)) is True  # queued: the running thread serves it
        assert keeper.statistics()["threads"] == 1
        gate.set()
        assert keeper.drain(5.0) and done == [("a", 1), ("b", 1)]
    finally:
        gate.set()
        assert keeper.close(5.0) == []


def test_no_reply_overtakes_the_queued_ones_while_the_service_closes(tmp_path):
    """Defect: ``close`` joined the keeper's threads (2 s) before taking the owner's lock;
    meanwhile the I/O thread's replies found their driver waiting, were refused by the
    closed keeper and went at once, before that driver's queued ones (a streaming value
    before an earlier call's result). Now the keeper stops, its queue is settled and the
    drivers are gone in one locked step: a later reply is not sent."""
    service, lock, gate, sent = _gated_service(threads=1)
    one = _driver("one")

    def send(client, message):
        if client.gone:
            return False
        sent.append((client.token, ("yield", message[2]), message[4]))
        return True

    service.send = send
    service.listener = types.SimpleNamespace(fileno=lambda: -1, close=lambda: None)
    service.owner.reactor.unregister = lambda _fd: None
    service.path = str(tmp_path / "actors.sock")
    service._conns = {}
    service._clients = {"one": one}
    closer = threading.Thread(target=service.close)
    try:
        with lock:
            service._reply(one, b"1a", [b"one-a"], [(0, ("shm", "s1", 1))], None)
            service._reply(one, b"1b", [b"one-b"], [(0, b"small")], None)
        assert _wait_for(lambda: service._keeper.statistics()["running"] == 1)
        closer.start()
        assert _wait_for(lambda: service._keeper._closed)
        with lock:  # the I/O thread, while the service closes
            service._reply_value(one, b"gen", 0, 0, b"item0", None)
        assert ("one", ("yield", 0), b"item0") not in sent, sent
    finally:
        gate.set()
        if closer.ident is not None:
            closer.join(10)


def test_closing_writes_what_the_sockets_still_have_queued_within_a_bound():
    """Defect: the settled replies were queued on the drivers' sockets (one non-blocking
    write tried) and the sockets closed at once, dropping the rest. Now what is queued is
    written, blocking, within a bound; a peer that does not read costs the bound only."""
    import socket

    from miniray._private.transport import framing
    from miniray._private.transport.framing import FramedSocket

    here, there = socket.socketpair()
    conn = FramedSocket(here)
    payload = b"x" * (8 << 20)  # far more than a socket's buffer
    conn.queue(payload)
    assert not conn.flush()
    got = bytearray()

    def read():
        time.sleep(0.2)
        while len(got) < len(payload) + framing._HEADER_SIZE:
            try:
                chunk = there.recv(1 << 20)
            except OSError:
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert actor_service._flush_out([conn], 10.0) == 0
        reader.join(10)
        assert bytes(got[framing._HEADER_SIZE:]) == payload
        conn.queue(payload)  # nobody reads now: bounded
        started = time.monotonic()
        assert actor_service._flush_out([conn], 0.3) == 1
        assert time.monotonic() - started < 2.0
    finally:
        conn.close()
        there.close()


class _Objects:
    """The owner's object table as ``_pull_here`` uses it; ``pulled`` makes the entry ready
    (its segment at ``path``) and calls the waiter."""

    def __init__(self, path: str):
        self.path = path
        self.entry = None
        self.finish = None
        self.held = 0
        self.timeouts: list = []

    def set_ready(self, _id, _kind, _data):
        self.entry = types.SimpleNamespace(state=actor_service.PENDING)

    def hold(self, _ids):
        self.held += 1

    def release(self, _ids):
        self.held -= 1

    def await_objects(self, _ids, _count, _on_error, finish, timeout, _add_timer):
        self.finish = finish
        self.timeouts.append(timeout)
        return lambda: True

    def get(self, _id):
        return self.entry

    def read(self, _id):
        return 0, ("shm", self.path, 5)

    def pulled(self):
        self.entry.state = "ready"
        self.finish(False)


def _pulling_service(tmp_path):
    service, lock = _service()
    src = tmp_path / "pulled"
    src.write_bytes(b"value")
    service.owner.objects = _Objects(str(src))
    service.owner.store = types.SimpleNamespace(shm_dir=str(tmp_path), session_tag="s" * 16)
    copy = types.SimpleNamespace(node_id="m" * 56, free=lambda: None)
    return service, lock, copy


def test_a_pulled_result_is_copied_outside_the_owners_lock(tmp_path, monkeypatch):
    """Defect: ``_pull_here`` copied the whole pulled segment while holding the owner's
    lock, stopping the I/O thread (every driver) for the copy. Now the copy is made after
    the lock, the entry held meanwhile, and the wait is bounded (PULL_WAIT_S, 30 s),
    given to ``await_objects`` too."""
    service, lock, copy = _pulling_service(tmp_path)
    objects = service.owner.objects
    real_copy = actor_service.segs.copy_file
    free_during_copy: list = []

    def copy_file(src, dst, size):
        other = threading.Thread(target=lambda: free_during_copy.append(
            lock.acquire(timeout=2) and (lock.release() or True)))
        other.start()
        other.join(5)
        free_during_copy.append(objects.held)
        real_copy(src, dst, size)

    monkeypatch.setattr(actor_service.segs, "copy_file", copy_file)
    threading.Timer(0.1, objects.pulled).start()
    kind, data = service._pull_here(b"r" * 28, 0, copy)
    assert kind == 0 and data[0] == "shm" and open(data[1], "rb").read() == b"value"
    assert free_during_copy == [True, 1] and objects.held == 0
    assert objects.timeouts == [actor_service.PULL_WAIT_S] and actor_service.PULL_WAIT_S <= 30


def test_closing_the_service_wakes_a_pull_and_leaves_no_segment(tmp_path):
    """Defect: a pull waited up to 300 s on a keeper thread and ``close`` did not wake
    it. Now ``close`` ends the wait: the pull fails saying the service stopped, the
    entry is released, no copy is made."""
    service, lock, copy = _pulling_service(tmp_path)
    service.listener = types.SimpleNamespace(fileno=lambda: -1, close=lambda: None)
    service.owner.reactor.unregister = lambda _fd: None
    service.path = str(tmp_path / "actors.sock")
    service._conns, service._clients = {}, {}
    out: list = []
    puller = threading.Thread(target=lambda: out.append(service._pull_here(b"r" * 28, 0,
                                                                           copy)))
    puller.start()
    assert _wait_for(lambda: service._pulls)
    started = time.monotonic()
    service.close()
    puller.join(10)
    assert time.monotonic() - started < 5 and out
    kind, data = out[0]
    assert kind == actor_service.protocol.ERR
    assert "stopped" in str(actor_service.serialization.loads(data))
    assert service.owner.objects.held == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pulled"]


def test_a_pull_with_no_keeper_thread_says_so_not_that_the_service_stopped(monkeypatch):
    """Defect: when no keeper thread could start (none running), a result kept for a
    caller that named no node went out at once and failed with ObjectLostError "the
    service stopped before it could pull it", though the service ran on. Now the error
    says no thread could be started to pull it, and what to do; once the service has
    stopped, it still says that."""
    service, lock, gate, sent = _gated_service()
    freed: list = []
    service.owner.remote_nodes = types.SimpleNamespace(kept_results=types.SimpleNamespace(
        hand_on=lambda *args: None))
    service._send_reply = ActorService._send_reply.__get__(service)
    out: list = []
    service.send = lambda client, message: out.append(message) or True
    nameless = _Client("far", 1, "t" * 16, "", ("", ""))
    copy = types.SimpleNamespace(node_id="m" * 56, free=lambda: freed.append(True))
    _start_fails_once(monkeypatch)
    with lock:
        service._reply(nameless, b"t", [b"far-r"], [(0, ("remote", copy))], None)
    assert len(out) == 1 and freed == [True] and not service._keeper.waiting
    (kind, data), = out[0][2]
    error = str(actor_service.serialization.loads(data))
    assert kind == actor_service.protocol.ERR
    assert "could not start a thread to pull it" in error and "ulimit" in error
    assert "stopped" not in error
    service._keeper.close()
    kind, data = service._hand_on_kept(0, copy, nameless, b"far-r")
    assert "stopped before it could pull it" in str(actor_service.serialization.loads(data))


def test_an_actors_output_does_not_overtake_its_drivers_queued_result(monkeypatch):
    """Defect: an actor's output (SVC_OUTPUT) went to the driver that created it at once
    while a reply of that driver waited in the keeper: the driver printed a later call's
    lines before an earlier call's result came, where a driver on the service's host gets
    them in the actor's order. Now the lines queue behind that driver's replies (from a
    route called without the owner's lock, as the I/O thread reads the pipes), another
    driver's go at once, and with nothing queued they are not delayed; lines whose driver
    is gone by their turn are printed here (node.log), at teardown too."""
    service, lock, gate, sent = _gated_service()
    one, two = _driver("one"), _driver("two")
    service._clients = {"one": one, "two": two}
    service._creators = {b"A": "one", b"B": "two"}

    def send(client, message):
        if client.gone:
            return False
        sent.append((client.token, "output" if message[0] == actor_service.protocol.SVC_OUTPUT
                     else message[1], message[2]))
        return True

    service.send = send
    printed: list = []
    monkeypatch.setattr(actor_service, "deliver", lambda target, text: printed.append(text),
                        raising=False)
    route_a = service._route_output(types.SimpleNamespace(spec=types.SimpleNamespace(
        actor_id=b"A")))
    route_b = service._route_output(types.SimpleNamespace(spec=types.SimpleNamespace(
        actor_id=b"B")))
    try:
        with lock:
            service._reply(one, b"1a", [b"one-a"], [(0, ("shm", "s", 1 << 20))], None)
        assert route_a("stdout", "(A pid=1) later call\n") is True
        assert route_b("stdout", "(B pid=2) other\n") is True
        assert sent == [("two", "output", "(B pid=2) other\n")]
        gate.set()
        assert _wait_for(lambda: len(sent) == 3)
        assert sent[1:] == [("one", b"1a", ("remote", b"one-a")),
                            ("one", "output", "(A pid=1) later call\n")]
        assert not service._keeper.waiting
        assert route_a("stdout", "now\n") and sent[-1] == ("one", "output", "now\n")
        gate.clear()
        with lock:
            service._reply(one, b"1b", [b"one-b"], [(0, ("shm", "s", 1 << 20))], None)
        route_a("stderr", "gone by its turn\n")
        one.gone = True
        gate.set()
        assert _wait_for(lambda: printed == ["gone by its turn\n"])
        assert not service._keeper.waiting
    finally:
        gate.set()
        service._keeper.close()
    service, lock, gate, sent = _gated_service(threads=1)  # teardown: sent, or printed
    one, two = _driver("one"), _driver("two")
    service._clients = {"one": one}
    service._creators = {b"A": "one"}
    service.send = send
    route_a = service._route_output(types.SimpleNamespace(spec=types.SimpleNamespace(
        actor_id=b"A")))
    try:
        with lock:
            service._reply(one, b"1a", [b"one-a"], [(0, ("shm", "s", 1 << 20))], None)
        assert _wait_for(lambda: service._keeper.statistics()["running"] == 1)
        route_a("stdout", "behind 1a\n")
        left = service._keeper.close(timeout=0.1)
        with lock:
            service._settle_queued(left)
        assert printed[-1] == "behind 1a\n" and not sent  # 1a unsent: not out of order
    finally:
        gate.set()
