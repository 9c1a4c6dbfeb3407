"""node/kept_objects.py (the node's book of results kept for remote drivers) and the remote
worker's payload rule (worker_api.result_route): pure, no processes."""

from __future__ import annotations

import os

import pytest

from miniray._private.node.kept_objects import KeptObjects
from miniray._private.object_store.shm_segments import segment_name
from miniray._private.worker.worker_api import result_route

TAG = "abcdef0123456789"
A, B = b"\x01" * 28, b"\x02" * 28


def _path(tag: str, object_id: bytes) -> str:
    return "/dev/shm/miniray-test/" + segment_name(tag, object_id)


def test_a_link_keeps_its_objects_finds_them_and_frees_them_once():
    book = KeptObjects()
    book.add_link("L", TAG)
    assert book.add("L", A, _path(TAG, A), 100) is None
    assert book.add("L", B, _path(TAG, B), 50) is None
    assert book.find("L", A) == (_path(TAG, A), 100)
    assert book.totals("L") == book.totals() == (2, 150)
    assert book.free("L", [A, b"\x09" * 28]) == [_path(TAG, A)]  # an unknown id is skipped
    assert book.free("L", [A]) == []  # freed already
    assert book.find("L", A) is None and book.totals() == (1, 50)


def test_only_the_link_that_keeps_an_object_finds_or_frees_it():
    book = KeptObjects()
    book.add_link("L", TAG)
    book.add_link("M", "fedcba9876543210")
    assert book.add("L", A, _path(TAG, A), 100) is None
    assert book.find("M", A) is None
    assert book.free("M", [A]) == [] and book.find("L", A) is not None
    assert book.find("nobody", A) is None and book.free("nobody", [A]) == []


@pytest.mark.parametrize("object_id, path, size, words", [
    (A, _path("fedcba9876543210", A), 10, "link's tag"),  # another link's name
    (A, _path(TAG, B), 10, "link's tag"),  # another object's name
    (A, _path(TAG, A), 0, "size > 0"),
    (A, _path(TAG, A), True, "size > 0"),
    ("not bytes", _path(TAG, A), 10, "object id"),
    (A, None, 10, "link's tag"),
])
def test_a_keep_that_does_not_name_the_links_segment_is_refused(object_id, path, size,
                                                               words):
    book = KeptObjects()
    book.add_link("L", TAG)
    why = book.add("L", object_id, path, size)
    assert why is not None and words in why, why
    assert book.totals() == (0, 0)


def test_the_cap_per_link_refuses_what_would_pass_it_and_counts_frees():
    book = KeptObjects(cap_bytes=100)
    book.add_link("L", TAG)
    book.add_link("M", "fedcba9876543210")
    assert book.room_for("L") == 100 and book.room_for("gone") == 0
    assert book.add("L", A, _path(TAG, A), 80) is None
    why = book.add("L", B, _path(TAG, B), 30)
    assert why is not None and "cap" in why and "send the value" in why
    assert book.add("M", B, _path("fedcba9876543210", B), 30) is None  # its own cap
    book.free("L", [A])
    assert book.add("L", B, _path(TAG, B), 30) is None and book.room_for("L") == 70


def test_a_duplicate_keep_and_a_closed_link_are_refused():
    book = KeptObjects()
    assert "not served" in book.add("L", A, _path(TAG, A), 10)
    book.add_link("L", TAG)
    assert book.add("L", A, _path(TAG, A), 10) is None
    assert "already" in book.add("L", A, _path(TAG, A), 10)


def test_dropping_a_link_hands_back_its_tag_and_every_path_and_forgets_it():
    book = KeptObjects()
    book.add_link("L", TAG)
    book.add("L", A, _path(TAG, A), 10)
    book.add("L", B, _path(TAG, B), 20)
    tag, paths = book.drop_link("L")
    assert tag == TAG and sorted(paths) == sorted([_path(TAG, A), _path(TAG, B)])
    assert book.totals() == (0, 0) and book.tag_of("L") is None
    assert "not served" in book.add("L", A, _path(TAG, A), 10)
    assert book.drop_link("L") == (None, [])


STORE = {"inline_threshold": 100}


def test_the_cap_per_driver_defaults_to_a_quarter_of_the_shm_dir_and_is_a_setting(
        monkeypatch):
    from miniray._private.core import config

    monkeypatch.delenv("MINIRAY_KEPT_BYTES_PER_DRIVER", raising=False)
    assert config.kept_bytes_per_driver(4000) == 1000
    monkeypatch.setenv("MINIRAY_KEPT_BYTES_PER_DRIVER", "123")
    assert config.kept_bytes_per_driver(4000) == 123
    monkeypatch.setenv("MINIRAY_KEPT_BYTES_PER_DRIVER", "0")  # nothing kept
    assert config.kept_bytes_per_driver(4000) == 0
    for bad in ("-1", "1.5", "lots"):
        monkeypatch.setenv("MINIRAY_KEPT_BYTES_PER_DRIVER", bad)
        with pytest.raises(ValueError, match="MINIRAY_KEPT_BYTES_PER_DRIVER"):
            config.kept_bytes_per_driver(4000)


def test_the_budget_file_reserves_within_the_cap_books_and_releases(tmp_path):
    from miniray._private.object_store import kept_budget, shm_segments

    shm = str(tmp_path)
    one, two = b"\x01" * 28, b"\x02" * 28
    assert not kept_budget.reserve(shm, TAG, 10, 100, one)  # no file: the link is gone
    path = kept_budget.create(shm, TAG)
    assert shm_segments.tag_of(os.path.basename(path)) == TAG  # swept with the link's tag
    assert kept_budget.used(shm, TAG) == 0
    assert kept_budget.reserve(shm, TAG, 60, 100, one)
    assert kept_budget.reserve(shm, TAG, 40, 100, two)
    assert not kept_budget.reserve(shm, TAG, 1, 100) and kept_budget.used(shm, TAG) == 100
    assert not kept_budget.reserve(shm, TAG, -1, 100)
    me = os.getpid()
    assert kept_budget.reservations(shm, TAG) == (0, [(me, one.hex(), 60), (me, two.hex(), 40)])
    kept_budget.book(shm, TAG, one, 60)  # the node's book took it: booked bytes now
    assert kept_budget.reservations(shm, TAG) == (60, [(me, two.hex(), 40)])
    assert kept_budget.unreserve(shm, TAG, two, pid=me + 1) == 0  # another worker's: kept
    assert kept_budget.unreserve(shm, TAG, two, pid=me) == 40  # its write failed
    kept_budget.release(shm, TAG, 60)  # the node freed it
    assert kept_budget.used(shm, TAG) == 0
    kept_budget.release(shm, TAG, 1000)  # never below 0
    assert kept_budget.used(shm, TAG) == 0
    kept_budget.reserve(shm, TAG, 5, 100, one)
    kept_budget.create(shm, TAG)  # a stale file of the tag: reset
    assert kept_budget.used(shm, TAG) == 0
    with open(path, "w") as old:  # an earlier version's file: one number, booked
        old.write("30")
    assert kept_budget.reserve(shm, TAG, 70, 100, one) and kept_budget.used(shm, TAG) == 100
    os.unlink(path)
    kept_budget.release(shm, TAG, 5)  # gone: nothing, no error
    assert kept_budget.unreserve(shm, TAG, one) == 0 and kept_budget.reconcile(shm, TAG) == 0
    assert not os.listdir(shm)


def test_a_torn_budget_write_reads_as_the_new_text(tmp_path):
    """A writer killed between its write from the start and its truncation leaves the new
    text, its end line and a tail of the old: the tail is not counted, and the next
    reservation (the slow path: the file is not whole) writes it whole again."""
    from miniray._private.object_store import kept_budget

    shm = str(tmp_path)
    path = kept_budget.create(shm, TAG)
    for n in range(3):
        assert kept_budget.reserve(shm, TAG, 10, 100, bytes([n + 1]) * 28)
    kept_budget.book(shm, TAG, b"\x01" * 28, 10)
    with open(path, "rb") as f:
        whole = f.read()
    assert whole.endswith(b"\nend\n") and whole.count(b"end") == 1
    with open(path, "r+b") as f:  # the same change torn: the old tail stayed behind it
        f.seek(0, os.SEEK_END)
        f.write(b"999 ff 50\nend\n")
    assert kept_budget.used(shm, TAG) == 30
    assert kept_budget.reserve(shm, TAG, 70, 100, b"\x09" * 28)
    assert kept_budget.used(shm, TAG) == 100
    with open(path, "rb") as f:
        assert f.read().count(b"end") == 1  # whole again
    os.unlink(path)


def test_settle_gives_back_only_dead_workers_reservations_whose_segment_never_came():
    from miniray._private.object_store.kept_budget import Reservation, settle

    live, dead = 100, 200
    entries = [Reservation(live, "aa", 10), Reservation(dead, "bb", 20),
               Reservation(dead, "cc", 40), Reservation(live, "dd", 80)]
    files = {"cc", "dd"}  # cc: the dead worker wrote it (the driver may still keep it)
    booked, kept, back = settle(500, entries, dead=lambda pid: pid == dead,
                                has_file=files.__contains__)
    assert (booked, back) == (500, 20)
    assert kept == [entries[0], entries[2], entries[3]]
    # from the node: its book's bytes replace the count (a drift corrected either way)
    assert settle(500, entries, lambda pid: False, files.__contains__, book_bytes=450) == (
        450, entries, 50)
    assert settle(500, entries, lambda pid: False, files.__contains__, book_bytes=700)[2] == 0
    assert settle(0, [], lambda pid: True, files.__contains__) == (0, [], 0)


def test_a_dead_workers_reservation_goes_back_on_a_refusal_or_the_nodes_reconcile(tmp_path):
    import subprocess
    import sys

    from miniray._private.object_store import kept_budget

    shm = str(tmp_path)
    kept_budget.create(shm, TAG)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: a pid of no process
    one, two, three = b"\x01" * 28, b"\x02" * 28, b"\x03" * 28
    assert kept_budget.reserve(shm, TAG, 60, 100, one, pid=gone.pid)
    assert kept_budget.reserve(shm, TAG, 30, 100, three, pid=gone.pid)
    open(os.path.join(shm, f"mr_{TAG}_{three.hex()}"), "wb").close()  # it wrote this one
    assert kept_budget.used(shm, TAG) == 90
    # the cap refuses 50 more: the dead worker's unwritten 60 go back, and 50 fit
    assert kept_budget.reserve(shm, TAG, 50, 100, two)
    assert kept_budget.reservations(shm, TAG) == (0, [(gone.pid, three.hex(), 30),
                                                       (os.getpid(), two.hex(), 50)])
    assert not kept_budget.reserve(shm, TAG, 21, 100, one)  # a live worker's stay counted
    # the node, told the worker exited, with its book's bytes
    kept_budget.reserve(shm, TAG, 10, 100, one, pid=gone.pid)
    assert kept_budget.reconcile(shm, TAG, 0, dead=[gone.pid]) == 10
    assert kept_budget.used(shm, TAG) == 80
    kept_budget.book(shm, TAG, three, 30)  # the driver still booked the dead one's file
    assert kept_budget.reservations(shm, TAG) == (30, [(os.getpid(), two.hex(), 50)])


_RESERVER = """
import os, sys, time
from miniray._private.object_store import kept_budget
shm, tag, go, out = sys.argv[1:]
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:  # all start together
    time.sleep(0.001)
granted = sum(kept_budget.reserve(shm, tag, 7, 100) for _ in range(10))
with open(out + ".part", "w") as f:
    f.write(str(granted))
os.rename(out + ".part", out)
sys.stdin.read()  # alive till the test is done: a dead reserver's unwritten bytes go back
"""


def test_reservations_from_many_processes_never_pass_the_cap(tmp_path):
    # fresh interpreters, not forks of this (threaded) process: nothing inherited held
    import subprocess
    import sys
    import time

    import miniray
    from miniray._private.object_store import kept_budget

    shm, go = str(tmp_path), str(tmp_path / "go")
    kept_budget.create(shm, TAG)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__))),
         os.environ.get("PYTHONPATH", "")]))
    outs = [str(tmp_path / f"granted{i}") for i in range(4)]
    children = [subprocess.Popen([sys.executable, "-c", _RESERVER, shm, TAG, go, out], env=env,
                                 stdin=subprocess.PIPE) for out in outs]
    try:
        open(go, "w").close()
        deadline = time.monotonic() + 60
        while not all(map(os.path.exists, outs)) and time.monotonic() < deadline:
            assert all(child.poll() is None for child in children)
            time.sleep(0.01)
        granted = [int(open(out).read()) for out in outs]
        assert sum(granted) == 14 and kept_budget.used(shm, TAG) == 98
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdin.close()


def _remote_worker(tmp_path, keep_max: int, budget: bool = True):
    from miniray._private.object_store import kept_budget
    from miniray._private.worker import worker_api

    if budget:
        kept_budget.create(str(tmp_path), TAG)
    runtime = worker_api.WorkerRuntime.__new__(worker_api.WorkerRuntime)
    runtime.info = {"store": {"inline_threshold": 100, "remote": True, "keep_tag": TAG,
                              "keep_max": keep_max, "shm_dir": str(tmp_path)}}
    runtime.peer_out = []
    return runtime


def _segments(tmp_path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path) if not n.endswith("_budget"))


def test_a_remote_worker_keeps_a_result_within_the_cap_and_sends_one_past_it(tmp_path):
    """Reserved before it is written: past the cap nothing is written, and the bytes
    follow RESULT, never an error; the node's free releases room."""
    from miniray._private.object_store import kept_budget

    runtime = _remote_worker(tmp_path, keep_max=3000)
    kept = runtime.payload_for(A, b"a" * 2000)
    assert kept[0] == "kept" and os.path.exists(kept[1])
    assert kept_budget.used(str(tmp_path), TAG) == kept[2]
    sent = runtime.payload_for(B, b"b" * 2000)  # 2000 + ~2000 > 3000
    assert sent[0] == "peer" and len(runtime.peer_out) == 1
    assert _segments(tmp_path) == [os.path.basename(kept[1])]
    kept_budget.book(str(tmp_path), TAG, A, kept[2])  # the node booked it ...
    assert kept_budget.reservations(str(tmp_path), TAG) == (kept[2], [])
    os.unlink(kept[1])  # ... and freed it: room again
    kept_budget.release(str(tmp_path), TAG, kept[2])
    assert runtime.payload_for(B, b"b" * 2000)[0] == "kept"
    assert kept_budget.reservations(str(tmp_path), TAG)[1][0][:2] == (os.getpid(), B.hex())


def test_a_cap_of_zero_or_a_link_gone_keeps_nothing(tmp_path):
    runtime = _remote_worker(tmp_path, keep_max=0)
    assert runtime.payload_for(A, b"a" * 2000)[0] == "peer" and not _segments(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    runtime = _remote_worker(other, keep_max=10 ** 9, budget=False)  # no budget file
    assert runtime.payload_for(A, b"a" * 2000)[0] == "peer" and not os.listdir(other)


@pytest.mark.parametrize("size, store, route", [
    (99, STORE, "inline"),
    (99, {**STORE, "remote": True, "keep_tag": TAG, "keep_max": 10 ** 9}, "inline"),
    (100, STORE, "shm"),  # a local worker's large result
    (100, {**STORE, "keep_tag": TAG, "keep_max": 10 ** 9}, "shm"),  # a tag, not remote
    (100, {**STORE, "remote": True}, "send"),  # a driver that does not ask to keep
    (100, {**STORE, "remote": True, "keep_tag": TAG, "keep_max": 10 ** 9}, "keep"),
    (100, {**STORE, "remote": True, "keep_tag": TAG, "keep_max": 100}, "keep"),
    (101, {**STORE, "remote": True, "keep_tag": TAG, "keep_max": 100}, "send"),  # no room
    (100, {**STORE, "remote": True, "keep_tag": TAG}, "send"),  # no room said
    (100, {**STORE, "remote": True, "keep_tag": "", "keep_max": 10 ** 9}, "send"),
])
def test_the_payload_rule(size, store, route):
    assert result_route(size, store) == route


# --------------------------------------------- the owner's record of a kept result
class _Store:
    def __init__(self):
        self.data, self.freed = {}, []

    def put_serialized(self, object_id, data):
        self.data[object_id] = data

    def inline_or_none(self, object_id):
        return self.data.get(object_id)

    def free(self, object_id):
        self.freed.append(object_id)
        self.data.pop(object_id, None)


def _kept(events: list):
    import threading

    from miniray._private.owner.object_table import ObjectTable, RemoteCopy

    objects = ObjectTable(_Store(), threading.Lock(), lambda: None)
    copy = RemoteCopy("node", 500, lambda: events.append("pull"),
                      lambda: events.append("free"))
    return objects, copy


def test_a_kept_result_is_pulled_once_at_its_first_waiter_and_then_read_here():
    from miniray._private.core import protocol
    from miniray._private.owner.object_table import PENDING, READY, Waiter

    events: list = []
    objects, copy = _kept(events)
    objects.ensure(A).refs = 1
    objects.set_ready(A, protocol.OK, ("remote", copy))
    entry = objects.get(A)
    assert entry.state == PENDING and entry.remote is copy and events == []
    entry.add_waiter(Waiter(1, True))
    entry.add_waiter(Waiter(1, True))  # a second get shares the pull
    assert events == ["pull"]
    objects.set_ready(A, protocol.OK, b"value")  # the pull's end (inline here)
    assert entry.state == READY and objects.get_serialized([A], 0) == [(protocol.OK, b"value")]
    entry.refs = 0
    objects.maybe_free(A, entry)  # freed here and on its node
    assert events == ["pull", "free"] and objects.get(A) is None


def test_a_kept_result_nobody_waited_for_is_freed_on_its_node_and_never_pulled():
    from miniray._private.core import protocol

    events: list = []
    objects, copy = _kept(events)
    entry = objects.ensure(A)
    entry.refs = 1
    objects.set_ready(A, protocol.OK, ("remote", copy))
    objects.forget_pending(A)  # a pending entry with a copy on a node is not forgotten
    assert objects.get(A) is entry
    entry.refs = 0
    objects.maybe_free(A, entry)
    assert events == ["free"] and objects.get(A) is None


def test_a_kept_result_whose_refs_went_before_it_was_recorded_is_freed_at_once():
    from miniray._private.core import protocol

    events: list = []
    objects, copy = _kept(events)
    objects.ensure(A).dropped = True  # its last ref went while the task ran
    objects.set_ready(A, protocol.OK, ("remote", copy))
    assert events == ["free"] and objects.get(A) is None


@pytest.mark.parametrize("affinity, placement, reads_there", [
    ("n1", None, True),  # a bare node id is a hard affinity
    (("n1", False, False), None, True),
    (("n1", False, True), None, True),
    (("n1", True, False), None, False),  # soft: it may run elsewhere, pulled first
    (("n2", False, False), None, False),
    ("SPREAD", None, False),
    (None, None, False),
    (("n1", False, False), ("group", 0), False),  # a placement group's bundle decides
])
def test_a_task_reads_a_kept_argument_there_only_with_a_hard_affinity_to_its_node(
        affinity, placement, reads_there):
    import types

    from miniray._private.owner.tasks import _reads_there

    spec = types.SimpleNamespace(affinity=affinity, placement=placement)
    assert _reads_there(spec, "n1") is reads_there


def test_a_pull_that_found_no_room_raises_for_its_waiters_and_the_next_reader_pulls_again():
    """The node still keeps the value: the error of a full store here is for the gets of
    then; a later get (or wait, or a worker's GET) makes the entry PENDING again and pulls."""
    from miniray._private.core import protocol
    from miniray._private.owner.object_table import PENDING, READY

    events: list = []
    objects, copy = _kept(events)
    objects.ensure(A).refs = 1
    objects.set_ready(A, protocol.OK, ("remote", copy))
    entry = objects.get(A)
    assert objects.get_serialized([A], 0) is None and events == ["pull"]
    copy.again = entry.kind  # the pull's end: no room here
    objects.set_ready(A, protocol.ERR, b"full")
    assert entry.state == READY
    assert objects.get_serialized([A], 0) is None  # renewed: waits, pulls again
    assert events == ["pull", "pull"] and entry.state == PENDING and copy.again is None
    assert entry.kind == protocol.OK and A in objects.store.freed
    objects.set_ready(A, protocol.ERR, b"full again")  # no `again`: an error for good
    assert objects.get_serialized([A], 0) == [(protocol.ERR, b"full again")]
    assert objects.wait_ready([A], 1, 0) == {A} and events == ["pull", "pull"]


def test_wait_and_a_workers_get_renew_a_no_room_error_too():
    from miniray._private.core import protocol
    from miniray._private.owner.object_table import Waiter

    events: list = []
    objects, copy = _kept(events)
    objects.ensure(A).refs = 1
    objects.set_ready(A, protocol.OK, ("remote", copy))
    copy.pulling = True
    copy.again = protocol.OK
    objects.set_ready(A, protocol.ERR, b"full")
    assert objects.wait_ready([A], 1, 0) == set() and events == []  # PENDING again
    objects.get(A).add_waiter(Waiter(1, False))  # (wait with a timeout adds one): pulled
    assert events == ["pull"]
    copy.again = protocol.OK
    objects.set_ready(A, protocol.ERR, b"full")
    finished = []
    objects.await_objects([A], 1, True, finished.append, None, None)
    assert finished == [] and events == ["pull", "pull"]


# ------------------------------------------- a pull's liveness (remote_objects, no processes)
class _Nodes:
    closed = False

    def __init__(self):
        self.owner = object()
        self.why = None
        self.asked: list = []

    def last_view(self):
        return []

    def view(self):
        return []

    def node_lost(self, worker, client):
        self.asked.append((worker.node, worker.incarnation))
        return self.why


class _Client:
    lost = None
    timeout = 10.0
    name = "127.0.0.2:1"
    kept = ("t" * 16, 1000)

    def __init__(self, opens=()):
        self.opens = list(opens)

    def open_pull(self, tag, timeout=None):
        outcome = self.opens.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class _Channel:
    closed = False

    def close(self):
        self.closed = True


def _kept_results():
    from miniray._private.owner.remote_objects import KeptResults

    nodes = _Nodes()
    return nodes, KeptResults(nodes, None, None, 60.0)


def test_a_pull_in_flight_is_closed_once_the_view_holds_its_node_lost():
    import time

    from miniray._private.owner import remote_objects

    nodes, kept = _kept_results()
    channel, client = _Channel(), _Client()
    kept._watch(channel, client, "n1", 3)
    # Two looks of the watcher (every LIVENESS_S), awaited rather than slept for: a fixed
    # sleep of 2.5 LIVENESS_S can see none on a slow runner (an IndexError, not a finding).
    deadline = time.monotonic() + 10 + remote_objects.LIVENESS_S * 2
    while len(nodes.asked) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nodes.asked[:2] == [("n1", 3)] * 2
    assert not channel.closed  # alive: left alone
    nodes.why = "No heartbeat from the node for 1.0 s"
    deadline = time.monotonic() + 5
    while not channel.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert channel.closed and kept._unwatch(channel) == nodes.why
    deadline = time.monotonic() + 5
    while kept._watching and time.monotonic() < deadline:  # nothing in flight: it ends
        time.sleep(0.05)
    assert not kept._watching


def test_an_unanswered_pull_handshake_is_tried_again_until_the_view_holds_the_node_lost():
    nodes, kept = _kept_results()
    channel = _Channel()
    client = _Client([TimeoutError("handshake"), channel])
    assert kept._pull_channel(client, "n1", 3) is channel  # tried again: answered
    client = _Client([TimeoutError("handshake"), TimeoutError("handshake")])
    nodes.why = "the cluster holds it dead"
    with pytest.raises(LookupError, match="holds it dead"):
        kept._pull_channel(client, "n1", 3)
    client = _Client([ConnectionRefusedError("refused")])  # not a silence: at once
    with pytest.raises(ConnectionRefusedError):
        kept._pull_channel(client, "n1", 3)


def test_a_result_whose_budget_file_stays_locked_is_sent_not_waited_for(tmp_path):
    """A worker stopped (SIGSTOP) inside its hold of the link's budget-file lock stalled
    every other worker of the link at its next keep. Now a keep waits at most
    KEEP_RESERVE_WAIT_S, then the value is sent."""
    import fcntl
    import time

    from miniray._private.object_store import kept_budget

    runtime = _remote_worker(tmp_path, keep_max=10 ** 9)
    fd = os.open(kept_budget.budget_path(str(tmp_path), TAG), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: as another worker holds it
        started = time.monotonic()
        sent = runtime.payload_for(A, b"a" * 2000)
        assert time.monotonic() - started < 2.0
        assert sent[0] == "peer" and not _segments(tmp_path)
    finally:
        os.close(fd)
    assert runtime.payload_for(A, b"a" * 2000)[0] == "kept"  # the lock free: kept again
