"""``owner/remote_requests.py`` with a stand-in owner and connection (no processes): what a
task on another host gets for each request, and the borrows it holds."""

from __future__ import annotations

import contextlib
import errno
import functools
import socket
from types import SimpleNamespace

import pytest

from miniray._private.core import protocol, serialization
from miniray._private.owner import remote_requests
from miniray._private.owner.remote_requests import RemoteRequests
from miniray._private.owner.requests import WorkerRequests


class _Objects:
    def __init__(self, known=()):
        self.borrows = {object_id: 0 for object_id in known}
        self.ready: dict = {}
        self.contained: dict = {}

    def borrow(self, object_id):
        if object_id not in self.borrows:
            return False
        self.borrows[object_id] += 1
        return True

    def unborrow(self, object_id):
        self.borrows[object_id] -= 1

    def escape(self, object_id):
        pass

    def set_ready(self, object_id, kind, data):
        self.borrows.setdefault(object_id, 0)
        self.ready[object_id] = (kind, data)

    def contain(self, outer, inner):
        self.contained[outer] = tuple(inner)

    def ready_ids(self, object_ids):
        return [i for i in object_ids if i in self.ready]


class _Data:
    """The worker's data connection: what the driver sent, the frames it will read."""

    def __init__(self, frames=()):
        self.sent: list = []
        self.frames = list(frames)
        self._pair = socket.socketpair()  # never readable: the worker is alive

    def fileno(self):
        return self._pair[0].fileno()

    def send(self, message):
        self.sent.append(message)

    def send_bytes(self, data):
        self.sent.append(bytes(data))

    def recv_bytes(self, timeout=None):
        return self.frames.pop(0)

    def close(self):
        for sock in self._pair:
            sock.close()


@pytest.fixture
def setup(tmp_path):
    objects = _Objects(known=[b"a", b"b"])
    owner = SimpleNamespace(
        objects=objects, closed=False, locked=contextlib.nullcontext,
        store=SimpleNamespace(shm_dir=str(tmp_path), session_tag="t"),
        requests=SimpleNamespace(on_borrow=functools.partial(
            WorkerRequests.on_borrow, SimpleNamespace(objects=objects))),
        get_serialized=lambda ids, timeout: None, hello_info={"nodes": ["n"]})
    slot = SimpleNamespace(interrupted=set(), killed=False)
    task = SimpleNamespace(spec=SimpleNamespace(name="t", return_ids=[b"r1", b"r2"]),
                           worker=slot)
    data = _Data()
    asks = RemoteRequests(owner, task, data, lambda: None, None)
    yield SimpleNamespace(owner=owner, objects=objects, slot=slot, data=data, asks=asks)
    data.close()


def test_borrows_follow_the_worker_and_all_go_when_the_task_ends(setup):
    asks, objects = setup.asks, setup.objects
    assert asks.serve((protocol.BORROW, [b"a", b"b", b"unknown"], [], []))
    assert objects.borrows == {b"a": 1, b"b": 1} and asks.borrowed == {b"a", b"b"}
    asks.serve((protocol.BORROW, [], [b"a"], []))
    assert objects.borrows[b"a"] == 0
    asks.serve((protocol.PUT, b"p", protocol.OK, b"inline", (b"b",)))
    assert objects.ready[b"p"] == (protocol.OK, b"inline") and objects.borrows[b"p"] == 1
    assert objects.contained[b"p"] == (b"b",)
    asks.contain([[b"a"], []])  # RESULT: its first return holds the ref to a
    assert objects.contained[b"r1"] == (b"a",) and b"r2" not in objects.contained
    asks.end()
    assert objects.borrows == {b"a": 0, b"b": 0, b"p": 0} and not asks.borrowed


def test_a_get_times_out_or_is_cancelled_and_answers_inline_values(setup, monkeypatch):
    monkeypatch.setattr(remote_requests, "WATCH_S", 0.01)
    asks, data, owner = setup.asks, setup.data, setup.owner
    asks.serve((protocol.GET, 1, [b"a"], 0.05, b"task"))
    assert data.sent[-1] == (protocol.REPLY, 1, protocol.TIMEOUT)
    setup.slot.interrupted.add(b"task")
    asks.serve((protocol.GET, 2, [b"a"], None, b"task"))
    assert data.sent[-1] == (protocol.REPLY, 2, protocol.CANCELLED)
    owner.get_serialized = lambda ids, timeout: [(protocol.OK, b"x") for _ in ids]
    asks.serve((protocol.GET, 3, [b"a", b"b"], None, None))
    assert data.sent[-1] == (protocol.REPLY, 3, [(protocol.OK, b"x"), (protocol.OK, b"x")])


def test_a_get_of_a_freed_object_answers_its_error(setup):
    from miniray.exceptions import ObjectFreedError

    def freed(ids, timeout):
        raise ObjectFreedError("ab" * 28, "", "")

    setup.owner.get_serialized = freed
    setup.asks.serve((protocol.GET, 4, [b"a"], None, None))
    _tag, _req, items = setup.data.sent[-1]
    assert items[0][0] == protocol.ERR
    assert isinstance(serialization.loads(items[0][1]), ObjectFreedError)


def test_a_killed_worker_ends_a_blocked_get(setup, monkeypatch):
    monkeypatch.setattr(remote_requests, "WATCH_S", 0.01)
    setup.slot.killed = True
    with pytest.raises(OSError, match="closed while it waited"):
        setup.asks.serve((protocol.GET, 5, [b"a"], None, None))


def test_a_put_the_store_has_no_room_for_drops_its_frames_and_holds_the_error(setup):
    def no_room(data, path, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    setup.asks.receive_segment = no_room
    setup.data.frames = [b"x" * 6, b"y" * 4, b"next message"]
    setup.asks.serve((protocol.PUT, b"big", protocol.OK, ("peer", 10), ()))
    assert setup.data.frames == [b"next message"]  # the stream stays in step
    kind, data = setup.objects.ready[b"big"]
    assert kind == protocol.ERR and "No room" in str(serialization.loads(data))


def test_calls_it_serves_and_one_it_refuses_naming_it(setup):
    setup.asks.serve((protocol.CALL, 6, protocol.CALL_NODES, ()))
    assert setup.data.sent[-1] == (protocol.REPLY, 6, (True, ["n"]))
    asked = []

    class Groups:  # the driver's placement groups, asked as for a local worker
        def table(self):
            asked.append("table")
            return {"g": {"state": "CREATED"}}

        def bundles_of(self, hex_):
            return None

    setup.owner.requests.placement_groups = Groups
    setup.asks.serve((protocol.CALL, 7, protocol.CALL_PLACEMENT_GROUP, ("table",)))
    assert setup.data.sent[-1] == (protocol.REPLY, 7, (True, {"g": {"state": "CREATED"}}))
    setup.asks.serve((protocol.CALL, 8, protocol.CALL_PLACEMENT_GROUP, ("bundles", "ab")))
    ok, error = setup.data.sent[-1][2]
    assert not ok and isinstance(error, ValueError) and "ab does not exist" in str(error)
    assert asked == ["table"]
    setup.asks.serve((protocol.CALL, 9, 79, ()))  # a method this version does not know
    ok, error = setup.data.sent[-1][2]
    assert not ok and isinstance(error, NotImplementedError)
    assert "another host" in str(error) and "placement groups" in str(error)
    assert not setup.asks.serve((protocol.SPAWNED, 1))  # not a worker's request at all


class _Streams:
    def __init__(self):
        self.items: list = []

    def on_item(self, task_id, index, kind, data, contained):
        self.items.append((task_id, index, kind, data, tuple(contained)))


def test_a_streaming_calls_values_go_to_the_streams_large_ones_into_a_segment(setup):
    from miniray._private.core import ids
    from miniray._private.object_store import shm_segments

    streams = setup.owner.streams = _Streams()
    received = []
    setup.asks.receive_segment = lambda data, path, size: received.append((path, size))
    task_id = b"s" * 24
    assert setup.asks.serve((protocol.YIELD, task_id, 0, protocol.OK, b"small", (b"a",)))
    assert setup.asks.serve((protocol.YIELD, task_id, 1, protocol.OK, ("peer", 10, 0), ()))
    path = received[0][0]
    assert received == [(path, 10)]
    assert path.endswith(shm_segments.segment_name("t", ids.stream_item_id(task_id, 1)))
    assert streams.items == [(task_id, 0, protocol.OK, b"small", (b"a",)),
                             (task_id, 1, protocol.OK, ("shm", path, 10), ())]

    def no_room(data, path, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    setup.asks.receive_segment = no_room  # the item holds the store's error instead
    setup.data.frames = [b"x" * 10, b"next message"]
    setup.asks.serve((protocol.YIELD, task_id, 2, protocol.OK, ("peer", 10, 0), ()))
    assert setup.data.frames == [b"next message"]
    _task, index, kind, data, _contained = streams.items[-1]
    assert (index, kind) == (2, protocol.ERR)
    assert "No room" in str(serialization.loads(data))


def test_a_generators_next_value_is_answered_once_there(setup, monkeypatch):
    monkeypatch.setattr(remote_requests, "WATCH_S", 0.01)
    answers = iter([None, None, True])  # not yet, not yet, there
    setup.owner.stream_next = lambda task_id, index, seconds: next(answers)
    setup.asks.serve((protocol.CALL, 8, protocol.CALL_STREAM_NEXT, (b"s", 0, None)))
    assert setup.data.sent[-1] == (protocol.REPLY, 8, (True, True))
    setup.owner.stream_next = lambda task_id, index, seconds: None
    setup.asks.serve((protocol.CALL, 9, protocol.CALL_STREAM_NEXT, (b"s", 1, 0.03)))
    assert setup.data.sent[-1] == (protocol.REPLY, 9, (True, None))  # the timeout passed
    assert protocol.CALL_STREAM_NEXT in remote_requests.BLOCKING_CALLS


def test_an_actors_nested_task_is_a_child_of_the_call_that_submits_it(setup):
    submitted = []
    parents = {}
    setup.owner.submit_task = lambda spec, parent: submitted.append((spec, parent))
    setup.owner.tasks = SimpleNamespace(
        call_parent=lambda call_id: parents.setdefault(call_id, ("parent of", call_id)))
    actor_slot = SimpleNamespace(interrupted=set(), killed=False)
    asks = RemoteRequests(setup.owner, None, setup.data, lambda: None, None, slot=actor_slot)
    asks.serve((protocol.SUBMIT, "child", b"call-1"))
    asks.serve((protocol.SUBMIT, "orphan", None))  # no call to parent it (none known)
    assert submitted == [("child", ("parent of", b"call-1")), ("orphan", None)]
    actor_slot.interrupted.add(b"call-1")  # the call was cancelled: its get says so
    asks.serve((protocol.GET, 7, [b"x"], None, b"call-1"))
    assert setup.data.sent[-1] == (protocol.REPLY, 7, protocol.CANCELLED)


class _Actors:
    """A stand-in actor manager: what ``requests.actor_request`` calls, recorded."""

    def __init__(self, link):
        self.link = link
        self.log: list = []
        self.kept: list = []
        self.held = {}

    def is_node_actor(self, spec):
        return self.link is not None and bool(spec.name)

    def create(self, spec, creator=None):
        # A task on another host creates actors that outlive its worker: no creator.
        assert creator is None
        self.log.append(("create", spec.name))
        return b"local-" + spec.name.encode()

    def create_in_service(self, spec):
        self.log.append(("create_in_service", spec.name))
        return b"svc-" + spec.name.encode()

    def kill(self, actor_id, no_restart):
        self.log.append(("kill", actor_id, no_restart))
        return actor_id.startswith(b"svc-")

    def kill_in_service(self, actor_id, no_restart):
        self.log.append(("kill_in_service", actor_id, no_restart))

    def lookup(self, name, namespace):
        if name not in self.held:
            raise ValueError(f"Failed to look up actor with name '{name}'.")
        return self.held[name], "state"

    def lookup_in_service(self, name, namespace):
        self.log.append(("lookup_in_service", name, namespace))
        return self.lookup(name, namespace)

    def named(self, namespace, all_namespaces):
        return sorted(self.held)

    def named_in_service(self, namespace, all_namespaces):
        self.log.append(("named_in_service", namespace, all_namespaces))
        return sorted(self.held)

    def keep_for_workers(self, actor_id):
        self.kept.append(actor_id)


@pytest.mark.parametrize("joined", [False, True])
def test_actor_calls_are_served_as_for_a_local_worker(setup, joined):
    """Creating, killing and looking up actors: answered with what the owner's path for a
    local worker gives, the actor service asked (without the lock) when joined to a node;
    a missing name raises ValueError in the task, as in Ray."""
    actors = _Actors(link=object() if joined else None)
    actors.held = {"found": b"f"}
    setup.owner.actors = actors
    asks, sent = setup.asks, setup.data.sent

    def ask(req, method, *args):
        asks.serve((protocol.CALL, req, method, args))
        assert sent[-1][:2] == (protocol.REPLY, req)
        return sent[-1][2]

    named = SimpleNamespace(name="n")
    assert ask(1, protocol.CALL_CREATE_ACTOR, SimpleNamespace(name="")) == (True, b"local-")
    created = ask(2, protocol.CALL_CREATE_ACTOR, named)
    assert created == (True, b"svc-n" if joined else b"local-n")
    assert ask(3, protocol.CALL_GET_ACTOR, "found", "ns") == (True, (b"f", "state"))
    ok, error = ask(4, protocol.CALL_GET_ACTOR, "missing", "ns")
    assert not ok and isinstance(error, ValueError) and "missing" in str(error)
    assert ask(5, protocol.CALL_LIST_NAMED_ACTORS, False, "ns") == (True, ["found"])
    assert ask(6, protocol.CALL_KILL_ACTOR, created[1], True) == (True, None)
    if joined:
        assert actors.log == [
            ("create", ""), ("create_in_service", "n"), ("lookup_in_service", "found", "ns"),
            ("lookup_in_service", "missing", "ns"), ("named_in_service", "ns", False),
            ("kill", b"svc-n", True), ("kill_in_service", b"svc-n", True)]
        assert actors.kept == [b"svc-n", b"f"]  # handles the worker now holds
    else:
        assert actors.log == [("create", ""), ("create", "n"), ("kill", b"local-n", True)]
        assert actors.kept == [b"f"]
