"""``owner/remote_bundles.py`` without processes: which tasks a group's remote bundles take,
their room, the order tasks start in, removal, and an actor's room (fake owner and nodes)."""

from __future__ import annotations

import contextlib
import threading
import time
import types

from miniray._private.core import placement
from miniray._private.owner.remote_bundles import RemoteBundle, RemoteBundles
from miniray._private.owner.remote_offload import RemoteOffload
from miniray._private.owner.tasks import T_DONE, T_WAITING

H = "ab" * 18


class _Owner:
    closed = False

    def __init__(self):
        self.failed: list = []
        self.deferred: list = []
        self.resubmitted: list = []
        self.tasks = types.SimpleNamespace(fail=self._fail, resubmit=self._resubmit)

    def _resubmit(self, task):
        self.resubmitted.append(task.spec.name)

    def _fail(self, task, error):
        task.state = T_DONE
        self.failed.append((task.spec.name, type(error).__name__))

    def locked(self):
        return contextlib.nullcontext()

    def defer(self, action):
        self.deferred.append(action)


class _Nodes:
    local = "head"

    def __init__(self):
        self.started: list = []
        self.gpus: list = []
        self.released: list = []

    def run_in_bundle(self, task, bundle, gpu_ids=None):
        task.worker = types.SimpleNamespace(remote_kill=lambda: None)
        self.started.append((task.spec.name, bundle.index))
        self.gpus.append((task.spec.name, gpu_ids))

    def release(self, client, lease_id):
        self.released.append(lease_id)

    alive_entry = RemoteOffload.alive_entry  # over the ``view`` a test gives


class _Task:  # hashed by identity, as the owner's Task
    def __init__(self, name: str, request: dict, index: int):
        self.spec = types.SimpleNamespace(
            name=name, request=placement.rewrite_request(request, H, index))
        self.state, self.cancelled, self.worker = T_WAITING, False, None


_task = _Task


def _book(has_local: bool):
    owner, nodes = _Owner(), _Nodes()
    book = RemoteBundles(owner, nodes)
    entry = types.SimpleNamespace(node_id="member")
    parts = {i: RemoteBundle(H, i, {"CPU": 1.0}, entry, object(), f"lease{i}", [])
             for i in (1, 2)}
    book.adopt(H, parts, has_local)
    return book, owner, nodes


def test_tasks_in_a_full_remote_bundle_start_one_after_the_other():
    book, owner, nodes = _book(has_local=True)
    a, b, c = _task("a", {"CPU": 1}, 1), _task("b", {"CPU": 1}, 1), _task("c", {"CPU": 1}, 2)
    assert book.submit(a) and book.submit(b) and book.submit(c)
    assert nodes.started == [("a", 1), ("c", 2)]  # b waits for bundle 1's CPU
    assert not book.submit(_task("here", {"CPU": 1}, 0))  # bundle 0 is this node's
    assert not book.submit(_task("any", {"CPU": 1}, -1))  # "any": this node's bundles first
    book.done(a, book.groups[H][1])
    assert nodes.started[-1] == ("b", 1)
    book.done(a, book.groups[H][1])  # a second report of the same end changes nothing
    assert book.groups[H][1].free == {"CPU": 0.0}


def test_any_bundle_of_a_group_with_none_here_takes_the_first_with_room():
    book, _owner, nodes = _book(has_local=False)
    for name in "xyz":
        assert book.submit(_task(name, {"CPU": 1}, -1))
    assert nodes.started == [("x", 1), ("y", 2)]
    assert [t.spec.name for t in book.waiting[H]] == ["z"]


def test_any_bundle_waiting_here_spills_to_a_remote_bundle_with_room():
    book, _owner, nodes = _book(has_local=True)
    assert not book.spill(_task("one", {"CPU": 1}, 0))  # a bundle of its own: never
    for name in "pq":
        assert book.spill(_task(name, {"CPU": 1}, -1))
    assert not book.spill(_task("r", {"CPU": 1}, -1))  # no remote room left: it stays
    assert nodes.started == [("p", 1), ("q", 2)]


def test_removal_fails_waiting_and_running_tasks_and_kills_the_running_ones():
    book, owner, nodes = _book(has_local=True)
    run, wait = _task("run", {"CPU": 1}, 1), _task("wait", {"CPU": 1}, 1)
    book.submit(run)
    book.submit(wait)
    book.removed(H)
    assert sorted(owner.failed) == [("run", "TaskPlacementGroupRemoved"),
                                    ("wait", "TaskPlacementGroupRemoved")]
    assert len(owner.deferred) == 1  # the running one's worker is killed after the lock
    assert H not in book.waiting and H not in book.running


def test_an_actor_holds_its_held_request_of_the_bundle_until_it_gives_it_back():
    book, _owner, _nodes = _book(has_local=True)
    place = placement.rewrite_request({"CPU": 1}, H, 1)
    held = placement.rewrite_request({"CPU": 1}, H, 1)
    assert book.holds(place) and not book.holds(placement.rewrite_request({"CPU": 1}, H, 0))
    bundle = book.take(place, held)
    assert bundle.index == 1 and bundle.free == {"CPU": 0.0}
    assert book.take(place, held) is None  # a second one waits
    light = placement.rewrite_request({}, H, 2)  # placed with 1 CPU, holding none
    assert book.take(placement.rewrite_request({"CPU": 1}, H, 2), light).free == {"CPU": 1.0}
    book.give_back(bundle, held)
    assert bundle.free == {"CPU": 1.0}


def test_actors_in_a_gpu_bundle_get_their_own_share_and_give_it_back():
    book = RemoteBundles(_Owner(), _Nodes())
    entry = types.SimpleNamespace(node_id="member")
    bundle = RemoteBundle(H, 0, {"GPU": 2.0, "CPU": 2.0}, entry, object(), "lease0", [0, 1])
    book.adopt(H, {0: bundle}, False)
    one = placement.rewrite_request({"GPU": 1, "CPU": 1}, H, 0)
    assert book.take(one, one, "actor a") is bundle
    assert book.take(one, one, "actor b") is bundle
    assert (bundle.gpus_of("actor a"), bundle.gpus_of("actor b")) == (["0"], ["1"])
    assert book.take(one, one, "actor c") is None  # both devices are held
    book.give_back(bundle, one, "actor a")
    assert bundle.gpus_of("actor a") == [] and bundle.gpu_free[0] == placement.INSTANCE_UNIT
    none = placement.rewrite_request({"CPU": 1}, H, 0)
    assert book.take(none, none, "actor d") is bundle and bundle.gpus_of("actor d") == []
    task = _task("t", {"GPU": 1}, 0)  # a task gets the device actor a gave back
    book.submit(task)
    assert book.nodes.gpus == [("t", ["0"])]


def test_tasks_in_a_gpu_bundle_get_their_own_share_of_its_devices():
    owner, nodes = _Owner(), _Nodes()
    book = RemoteBundles(owner, nodes)
    entry = types.SimpleNamespace(node_id="member")
    bundle = RemoteBundle(H, 0, {"GPU": 2.0, "CPU": 2.0}, entry, object(), "lease0",
                          [3, 5])
    book.adopt(H, {0: bundle}, False)
    one, two, three = (_task(name, {"GPU": 1, "CPU": 0.5}, 0) for name in "abc")
    halves = [_task(f"h{i}", {"GPU": 0.5}, 0) for i in range(2)]
    for task in (one, two, three):
        book.submit(task)
    assert nodes.gpus == [("a", ["3"]), ("b", ["5"])]  # c waits: both devices are taken
    book.done(one, bundle)
    assert nodes.gpus[-1] == ("c", ["3"])  # a's device, given back
    book.done(two, bundle)
    for task in halves:
        book.submit(task)
    assert nodes.gpus[-2:] == [("h0", ["5"]), ("h1", ["5"])]  # fractions fill one first
    cpu_only = _task("cpu", {"CPU": 0.5}, 0)
    book.submit(cpu_only)
    assert nodes.gpus[-1] == ("cpu", [])  # no GPU asked: none given


def test_a_lost_bundle_takes_no_task_until_it_is_placed_again():
    book, owner, nodes = _book(has_local=False)
    first = _task("first", {"CPU": 1}, 1)
    book.submit(first)
    assert nodes.started == [("first", 1)]
    parts = book.groups[H]
    parts[1].entry = types.SimpleNamespace(node_id="dead")
    for part in parts.values():
        part.client = types.SimpleNamespace(lost=None)
    assert book.find_lost({"member"}) == {H: [1]}
    book.requeue(first, parts[1])  # its node died under it: it waits for the bundle
    book.done(first, parts[1])
    assert first.state == T_WAITING and first.worker is None
    any_bundle = _task("any", {"CPU": 1}, -1)
    book.submit(any_bundle)
    assert nodes.started[-1] == ("any", 2)  # bundle 2 is alive; bundle 1 is not used
    again = RemoteBundle(H, 1, {"CPU": 1.0}, types.SimpleNamespace(node_id="new"),
                         types.SimpleNamespace(lost=None), "lease9", [])
    assert book.replace(H, {1: again}) == []  # adopted; no loan moved
    assert nodes.started[-1] == ("first", 1) and book.groups[H][1] is again
    assert book.find_lost({"member", "new"}) == {}
    book.removed(H)
    assert book.replace(H, {1: again}) == []  # removal's second half has not run yet
    book.release(H)
    assert nodes.released == ["lease9", "lease2"]  # every alive bundle's lease
    assert book.replace(H, {1: again}) is None  # gone: the caller releases its lease


def test_a_lost_bundle_held_here_again_sends_its_tasks_to_the_owners_queue():
    book, owner, nodes = _book(has_local=False)
    alive = types.SimpleNamespace(lost=None)
    for part in book.groups[H].values():
        part.client = alive
    running = _task("running", {"CPU": 1}, 1)
    book.submit(running)
    old = book.groups[H][1]
    old.entry = types.SimpleNamespace(node_id="dead")
    assert book.find_lost({"member"}) == {H: [1]}
    for name, index in (("one", 1), ("any", -1), ("two", 2)):
        book.submit(_task(name, {"CPU": 1}, index))
    assert nodes.started[-1] == ("any", 2)  # bundle 2 had room; "two" waits for it
    assert book.replace(H, {}, [1]) == []  # bundle 1 is this node's now
    assert owner.resubmitted == ["one"] and 1 not in book.groups[H]
    assert book.has_local[H] and H not in book.lost
    assert not book.holds(placement.rewrite_request({"CPU": 1}, H, 1))  # the ledger's
    assert not book.holds(placement.rewrite_request({"CPU": 1}, H, -1))  # here first
    # The task that ran there, retried after the bundle came here: to the owner's queue,
    # and the bundle is not marked lost again.
    book.requeue(running, old)
    book.done(running, old)
    assert owner.resubmitted == ["one", "running"] and H not in book.lost
    # A bundle whose link is lost takes nothing, before the watch marks it.
    book.groups[H][2].client = types.SimpleNamespace(lost="reset")
    book.done(book.running[H].copy().pop(), book.groups[H][2])
    assert book.take(placement.rewrite_request({"CPU": 1}, H, 2),
                     placement.rewrite_request({"CPU": 1}, H, 2)) is None


def test_a_dead_nodes_bundles_are_planned_again_on_any_alive_node_this_one_first():
    from miniray._private.core.cluster_view import NodeEntry
    from miniray._private.core.node_pick import replan_bundles

    def node(name, cpus, alive=True):
        return NodeEntry(name, "10.0.0.1", 1, totals={"CPU": 4}, available={"CPU": cpus},
                         alive=alive)

    view = [node("here", 4), node("a", 0), node("b", 2), node("dead", 4, alive=False)]
    two = [{"CPU": 1}, {"CPU": 1}]
    assert replan_bundles(two, "PACK", "here", view, {0: "a"}, [1]) == {1: "here"}
    assert replan_bundles(two, "STRICT_SPREAD", "here", view, {0: "b"}, [1]) == {1: "here"}
    assert replan_bundles(two, "STRICT_SPREAD", "here", view, {0: "here"}, [1]) == {1: "b"}
    assert replan_bundles(two, "STRICT_PACK", "here", view, {0: "b"}, [1]) == {1: "b"}
    assert replan_bundles(two, "STRICT_PACK", "here", view, {}, [0, 1]) == {0: "here",
                                                                            1: "here"}
    assert replan_bundles(two, "SPREAD", "here", view, {}, []) == {}
    # This node full (its ledger's room in the view), or left out by the caller: others.
    full = [node("here", 0)] + view[1:]
    assert replan_bundles(two, "PACK", "here", full, {0: "a"}, [1]) == {1: "b"}
    assert replan_bundles(two, "PACK", "here", view[1:], {0: "a"}, [1]) == {1: "b"}


def test_a_named_actors_room_is_lent_by_its_driver_and_borrowed_by_the_service():
    # The driver's side: the actor's room stays taken while lent, comes back once.
    book, _owner, _nodes = _book(has_local=False)
    place = placement.rewrite_request({"CPU": 1}, H, 1)
    bundle = book.take(place, place, b"actor")
    book.lend(b"actor", bundle, place)
    assert bundle.free == {"CPU": 0.0} and book.take(place, place, b"other") is None
    book.end_loan(b"actor")
    book.end_loan(b"actor")
    assert bundle.free == {"CPU": 1.0}
    book.lend(b"actor", book.take(place, place, b"actor"), place)
    assert book._move_loans(H, {2}) == []  # another bundle went elsewhere
    # Its own bundle was placed again on another node: the same room is lent there,
    # before any task takes it (``replace`` moves the loans first).
    elsewhere = RemoteBundle(H, 1, {"CPU": 1}, types.SimpleNamespace(node_id="m"),
                             object(), "lease-m", [])
    waiting = _task("waits", {"CPU": 1}, 1)
    assert book.submit(waiting) and _nodes.started == []  # the actor holds the room
    assert book.replace(H, {1: elsewhere}) == [(b"actor", elsewhere.entry, [], False)]
    assert book.loans == {b"actor": (elsewhere, place)} and elsewhere.free == {"CPU": 0.0}
    assert list(book.waiting[H]) == [waiting] and _nodes.started == []  # no room for it
    # No room in the new place (a task took it first): no loan, the caller kills it.
    other = RemoteBundle(H, 1, {"CPU": 1}, types.SimpleNamespace(node_id="n"), object(),
                         "lease-n", [])
    other.free = {"CPU": 0.0}
    assert book.replace(H, {1: other}) == [(b"actor", None, [], False)] and book.loans == {}
    # Placed again on this node: the loan stays until the caller knows who places it.
    book.lend(b"actor", other, place)
    assert book.replace(H, {}, [1]) == [(b"actor", None, [], True)]
    assert book.loans == {b"actor": (other, place)}
    del book.loans[b"actor"]
    book.has_local[H] = False
    book.groups[H][1] = bundle
    book.waiting.pop(H, None)
    book.give_back(bundle, place, b"actor")  # (a moved bundle is a new one: room is moot)
    book.lend(b"actor", book.take(place, place, b"actor"), place)
    book.removed(H)
    assert book.loans == {}  # the group's removal ends the actor in the service
    # The service's side: each actor's own room, no lease; nothing to release at the
    # group's end, and its removal forgets the rooms.
    service = RemoteBundles(_Owner(), _Nodes())
    entry = types.SimpleNamespace(node_id="member")
    one = placement.rewrite_request({"CPU": 1, "GPU": 1}, H, 1)
    for actor_id, gpus in ((b"a", ["3"]), (b"b", ["5"])):
        service.borrow(types.SimpleNamespace(placement=one, lent=(entry, gpus, "", False),
                                             actor_id=actor_id))
    lent = service.borrowed[b"a"]
    assert lent.lease_id is None and lent.client is None and lent.free == {"CPU": 1.0,
                                                                          "GPU": 1.0}
    assert service.take(one, one, b"a") is lent and lent.gpus_of(b"a") == ["3"]
    assert service.take(one, one, b"a") is None  # its room is taken (a restart waits)
    assert service.take(one, one, b"b").gpus_of(b"b") == ["5"]
    assert service.take(one, one, b"c") is None  # no room lent for it
    assert H in service.groups and service.find_lost({"member"}) == {}
    # Its node died: the restart goes to this node's ledger (no lent room any more).
    spec_b = types.SimpleNamespace(placement=one, lent=(entry, ["5"], "", False),
                                   actor_id=b"b")
    service.follow_ledger(spec_b)
    assert spec_b.lent is None and b"b" not in service.borrowed
    assert not service.holds(one)  # the placer asks the ledger
    # Its driver then lends its room in the bundle's new place on another node: the
    # restart goes there (told once only; another group's news is not its own).
    moved = types.SimpleNamespace(node_id="m")
    assert service.lent_moved(spec_b, moved, ["7"], running=False)
    assert spec_b.lent == (moved, ["7"], "", False) and service.borrowed[b"b"].entry is moved
    assert service.take(one, one, b"b").gpus_of(b"b") == ["7"]
    assert not service.lent_moved(spec_b, moved, ["7"], running=False)
    # Told before this side saw its node die: kept, and taken when it does.
    spec_b.lent = (entry, ["5"], "", True)
    assert service.lent_moved(spec_b, moved, ["6"], running=True)
    assert spec_b.lent == (entry, ["5"], "", True)  # it still runs there for now
    service.follow_ledger(spec_b)
    assert spec_b.lent == (moved, ["6"], "", True) and service.followed == {}
    assert service.moved_to == {}
    # An actor with no lent room (placed by this node's ledger): nothing to move.
    spec_c = types.SimpleNamespace(placement=one, lent=None, actor_id=b"c")
    assert not service.lent_moved(spec_c, moved, [], running=True)
    assert not service.lent_moved(spec_c, moved, [], running=False)
    # The group's removal forgets what waited to move.
    service.follow_ledger(spec_b)
    assert b"b" in service.followed
    service.removed(H)
    assert service.followed == {} and service.moved_to == {}
    service.borrow(types.SimpleNamespace(placement=one, lent=(entry, ["3"], "", False),
                                         actor_id=b"a"))
    # Lent by a driver on another host: watched (its node asked) while one of its actors
    # lives here.
    far = placement.rewrite_request({"CPU": 1}, "f" * len(H), 0)
    for actor_id in (b"x", b"y"):
        service.borrow(types.SimpleNamespace(placement=far, lent=(entry, [], "lender", True),
                                             actor_id=actor_id))
    assert service.lender_watched == {"f" * len(H): "lender"}
    service.unborrow(b"x")
    assert service.lender_watched == {"f" * len(H): "lender"} and b"x" not in service.borrowed
    service.unborrow(b"y")
    service.unborrow(b"y")
    assert service.lender_watched == {} and set(service.borrowed) == {b"a"}
    service.borrow(types.SimpleNamespace(placement=far, lent=(entry, [], "lender", True),
                                         actor_id=b"x"))
    service.removed("f" * len(H))  # its lender's node no longer holds it
    assert service.lender_watched == {} and set(service.borrowed) == {b"a"}
    service.removed(H)
    service.release(H)
    assert service.nodes.released == [] and service.borrowed == {}


def test_the_service_lends_a_tasks_room_and_gets_it_back_on_return_or_the_drivers_exit():
    book, _owner, nodes = _book(has_local=True)  # the actor service's own group
    cpu = {"CPU": 1.0}
    first = book.lend_room(H, 1, cpu, "d1")
    assert first[:2] == (1, 1) and first[2].node_id == "member" and first[3] == []
    assert book.groups[H][1].free == {"CPU": 0.0}
    assert book.lend_room(H, 1, cpu, "d1") is None  # full now: the driver asks again
    own = _task("own", {"CPU": 1}, 1)
    assert book.submit(own) and nodes.started == []  # the service's own task waits too
    book.return_room(first[0])
    assert nodes.started == [("own", 1)]  # the room came back to the bundle
    book.return_room(first[0])  # a second return changes nothing
    assert book.groups[H][1].free == {"CPU": 0.0}
    second = book.lend_room(H, -1, cpu, "d2")  # any bundle: the one with room
    assert second[1] == 2
    assert book.lend_room(H, 0, cpu, "d1") == "here"  # bundle 0 is this node's
    assert book.drop_loans("d2") == 1 and book.groups[H][2].free == {"CPU": 1.0}
    book.lose(H, [2])
    assert book.lend_room(H, 2, cpu, "d1") is None  # lost: no loan until placed again
    book.lose(H, [])
    third = book.lend_room(H, 1, {"CPU": 0.0}, "d3")
    book.removed(H)
    assert third[0] not in book.lent_out and not book.lent_out


def test_a_drivers_task_in_a_served_bundle_waits_for_a_loan_and_gives_it_back():
    owner, nodes = _Owner(), _Nodes()
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None  # no borrower thread: its answers are given by hand
    book.note_served(H, ["head", "member", "member"])
    entry = types.SimpleNamespace(node_id="member")
    cpu = {"CPU": 1.0}
    task = _task("t", {"CPU": 1}, 1)
    assert book.submit(task) and list(book.served_waiting[H]) == [task]
    assert not book.submit(_task("here", {"CPU": 1}, 0))  # bundle 0: this node's ledger
    assert not book.submit(_task("any", {"CPU": 1}, -1))  # "any": this node's first
    assert book.spill(_task("spilled", {"CPU": 1}, -1))  # then a loan elsewhere
    book._lent(task, H, cpu, None)  # no room now: it still waits
    assert task in book.served_waiting[H] and nodes.started == []
    client = object()
    book._lent(task, H, cpu, (7, 1, entry, ["0"]), client)
    assert nodes.started == [("t", 1)] and nodes.gpus == [("t", ["0"])]
    running = book.running[H]
    assert task in running
    lent = RemoteBundle(H, 1, cpu, entry, client, None, ["0"])
    lent.loan = 7
    book.done(task, lent)
    assert book._returns == [7] and task not in running
    gone = book.served_waiting[H][0]  # "spilled": cancelled before its loan came
    gone.cancelled = True
    book._lent(gone, H, cpu, (8, 2, entry, []), client)
    assert book._returns == [7, 8] and len(nodes.started) == 1
    moved = _task("moved", {"CPU": 1}, 2)
    assert book.submit(moved)
    book._lent(moved, H, cpu, "here")  # bundle 2 was placed again on this node
    assert owner.resubmitted == ["moved"] and H not in book.served
    book.note_served(H, ["head", "member", "member"])
    retried = _task("retried", {"CPU": 1}, 1)
    book.requeue(retried, lent)  # its node died: it waits for a new loan, first
    assert book.served_waiting[H][0] is retried
    book.removed(H)
    assert ("retried", "TaskPlacementGroupRemoved") in owner.failed
    assert H not in book.served_waiting and H not in book.served


def test_the_borrower_drops_cancelled_tasks_and_ends_with_nothing_to_ask():
    owner, nodes = _Owner(), _Nodes()
    owner.actors = None  # never asked: nothing to give back or borrow
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None
    book.note_served(H, ["head", "member"])
    task = _task("t", {"CPU": 1}, 1)
    assert book.submit(task)
    task.cancelled = True
    book._borrow_loop()  # on the caller's thread here: one turn, then it ends
    assert not book.served_waiting and book._borrower is None


def test_the_borrower_survives_a_refused_return_and_an_error_ends_it_cleared():
    """A loan the service refuses back (its error re-raised here) is logged, never the
    thread's end; an error the loop does not expect ends it with ``_borrower`` cleared,
    so the next kick starts another."""
    owner, nodes = _Owner(), _Nodes()
    returned: list = []

    def return_room(loan_id, timeout=None):
        returned.append(loan_id)
        raise KeyError(loan_id)  # as ActorLink re-raises the service's SVC_ERR

    owner.actors = types.SimpleNamespace(
        return_room_in_service=return_room,
        borrow_room_in_service=lambda pg_hex, index, base: None)
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None
    book._returns = [(None, 7)]  # the service's loan 7
    book._borrower = threading.current_thread()
    book._borrow_loop()  # one turn on this thread: the return refused, then nothing left
    assert returned == [7] and book._borrower is None
    book.note_served(H, ["head", "member"])
    task = _task("t", {"CPU": 1}, 1)
    assert book.submit(task)

    def broken(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    book._lent = broken
    book._borrower = threading.current_thread()
    book._borrow_loop()
    assert book._borrower is None and list(book.served_waiting[H]) == [task]


def test_loans_of_ended_tasks_go_back_when_the_driver_closes():
    """Teardown step 1: the loans queued for the borrower are sent before the link closes
    (``return_loans``, bounded), and a borrower turn that took them while the driver
    closed sends them too (it dropped them)."""
    owner, nodes = _Owner(), _Nodes()
    returned: list = []
    owner.actors = types.SimpleNamespace(
        return_room_in_service=lambda loan_id, timeout=None: returned.append(
            (loan_id, timeout)))
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None
    book._returns = [(None, 7), (None, 8)]
    assert book.return_loans(1.0) == 2 and book._returns == []
    assert [loan for loan, _t in returned] == [7, 8]
    assert all(0 < timeout <= 1.0 for _loan, timeout in returned)  # bounded
    returned.clear()
    owner.closed = True  # the borrower's turn after the driver started closing
    book._returns = [(None, 9)]
    book._borrower = threading.current_thread()
    book._borrow_loop()
    assert returned == [(9, None)] and book._borrower is None
    returned.clear()
    book._returns = [(None, 10), (None, 11)]
    assert book.return_loans(0.0) == 0 and returned == []  # no time left: the link's
    # closing gives them back (the service's drop_loans)


def test_loans_are_not_sent_at_shutdown_over_a_link_that_is_down():
    """Defect: with the link to the actor service lost (its node stopped), shutdown's
    return of the loans opened a new link first: a connect of up to 10 s at every such
    shutdown, for loans the service gave back when the old link closed."""
    owner, nodes = _Owner(), _Nodes()
    asked: list = []
    link = types.SimpleNamespace(up=False)
    link.connected = lambda: link.up
    owner.actors = types.SimpleNamespace(
        link=link, return_room_in_service=lambda loan_id, timeout=None: asked.append(loan_id))
    book = RemoteBundles(owner, nodes)
    book._returns = [(None, 1), (None, 2)]
    assert book.return_loans(1.0) == 0 and asked == [] and book._returns == []
    link.up = True
    book._returns = [(None, 3)]
    assert book.return_loans(1.0) == 1 and asked == [3]


def test_loans_go_back_until_the_service_is_gone():
    from miniray._private.owner.actor_link import ServiceUnavailable

    owner, nodes = _Owner(), _Nodes()
    asked: list = []

    def gone(loan_id, timeout=None):
        asked.append(loan_id)
        raise ServiceUnavailable("the node's actor service did not answer")

    owner.actors = types.SimpleNamespace(return_room_in_service=gone)
    book = RemoteBundles(owner, nodes)
    book._returns = [(None, 1), (None, 2), (None, 3)]
    assert book.return_loans(1.0) == 0 and asked == [1]  # one wait, not one per loan


# -- step 9: another driver of the node lends room in its own group's remote bundles ----------

def test_a_driver_lends_to_another_driver_by_pid_and_takes_back_only_its_loans():
    from miniray._private.owner import placement_group_loans as loans

    book, owner, _nodes = _book(has_local=True)  # the creating driver's own group
    owner.remote_nodes = types.SimpleNamespace(bundles=book)
    lend = {"what": "pg_lend", "pg": H, "index": 1, "base": {"CPU": 1}}
    answer = loans.answer_borrower(owner, lend, 4242)["loan"]
    assert answer[1:] == [1, "member", []]  # JSON: the node's id, not its entry
    assert book.groups[H][1].free == {"CPU": 0.0}
    assert loans.answer_borrower(owner, lend, 4242) == {"loan": None}  # full now
    assert loans.answer_borrower(owner, dict(lend, index=0), 4242) == {"loan": "here"}
    back = {"what": "pg_return", "loan": answer[0]}
    loans.answer_borrower(owner, back, 4343)  # another driver: not its loan
    assert book.groups[H][1].free == {"CPU": 0.0}
    loans.answer_borrower(owner, back, 4242)
    assert book.groups[H][1].free == {"CPU": 1.0}


def test_the_borrowers_gone_are_the_dead_drivers_each_once():
    from miniray._private.owner.placement_group_loans import gone_borrowers

    alive = {(1, 10)}
    tokens = [("driver", 1, 10), ("driver", 2, 20), "service-client", ("driver", 2, 20),
              ("driver", 1, 11)]  # pid 1 again, another start: another process
    assert gone_borrowers(tokens, lambda pid, start: (pid, start) in alive) == [
        ("driver", 2, 20), ("driver", 1, 11)]


def test_a_lent_group_is_gone_when_its_lenders_node_no_longer_holds_it_or_died():
    from miniray._private.owner.placement_group_nodes import GONE, lenders_gone

    watched = {"a": "n1", "b": "n1", "c": "n2", "d": "n3"}
    # b: released on n1; c: n2 is dead; d: n3 did not answer (asked again later)
    assert lenders_gone(watched, {"a": True, "b": False, "c": GONE, "d": None}) == ["b", "c"]
    assert lenders_gone(watched, {}) == []


def test_a_dead_borrowers_loans_come_back_to_the_lender():
    book, _owner, nodes = _book(has_local=True)
    first = book.lend_room(H, 1, {"CPU": 1.0}, ("driver", 7, 70))
    own = _task("own", {"CPU": 1}, 1)
    assert first is not None and book.submit(own) and nodes.started == []
    assert book.drop_loans(("driver", 7, 70)) == 1
    assert nodes.started == [("own", 1)]  # the lender's own task runs in that room


def test_a_borrower_asks_the_lending_driver_and_gives_each_loan_back_to_its_lender(
        monkeypatch):
    from miniray._private.transport import state_socket

    owner, nodes = _Owner(), _Nodes()
    member = types.SimpleNamespace(node_id="member", alive=True)
    nodes.view = lambda: [member]
    asked: list = []
    answers = [{"loan": [5, 1, "member", ["0"]]}, {"loan": [6, 1, "gone", []]},
               {"loan": None}, {"loan": None}]

    def ask(path, timeout=30.0, what="snapshot", **fields):
        asked.append((path, what, fields))
        return answers.pop(0) if what == "pg_lend" else {"loan": None}

    monkeypatch.setattr(state_socket, "ask", ask)
    returned: list = []
    owner.actors = types.SimpleNamespace(
        return_room_in_service=lambda loan_id, timeout=None: returned.append(loan_id))
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None
    book.note_served(H, ["head", "member"], "/s/d.sock")
    there, here = (placement.rewrite_request({"CPU": 1}, H, i) for i in (1, 0))
    assert book.serves(there) and book.actor_lender(there) == "/s/d.sock"  # S, lent by D
    assert not book.serves(here) and book.actor_lender(here) is None  # this node's ledger
    assert book._ask_lender(H, 1, {"CPU": 1.0}) == (("/s/d.sock", 5), 1, member, ["0"])
    assert asked[0] == ("/s/d.sock", "pg_lend", {"pg": H, "index": 1, "base": {"CPU": 1.0}})
    assert book._ask_lender(H, 1, {"CPU": 1.0}) is None  # on a node not alive here
    assert book._returns == [("/s/d.sock", 6)]  # given back
    assert book._give_back([("/s/d.sock", 6), (None, 9)]) == 2
    assert asked[-1] == ("/s/d.sock", "pg_return", {"loan": 6}) and returned == [9]
    book.removed(H)
    assert H not in book.lenders and H not in book.served


def test_the_state_socket_passes_a_loan_request_and_the_peers_pid(tmp_path):
    import os

    from miniray._private.transport import state_socket

    seen: list = []

    def loans(request, pid):
        seen.append((request, pid))
        return {"loan": None}

    server = state_socket.StateServer(str(tmp_path / "state" / "d.sock"), lambda: {},
                                      loans=loans)
    try:
        doc = state_socket.ask(server.path, 10.0, "pg_return", loan=3)
    finally:
        server.close()
    assert doc == {"loan": None}
    assert seen == [({"what": "pg_return", "loan": 3}, os.getpid())]


def test_a_member_drivers_tasks_borrow_room_in_every_bundle_of_the_heads_group():
    """A driver on a member (the service is the head's, on another host): its node's ledger
    provides no bundle of the group, its own node's included, so each of its tasks there
    waits for a loan; "here" from the service (the bundle is on the head) runs the task on
    the head, under a lease of its request, instead of this node's queue."""
    owner, nodes = _Owner(), _Nodes()
    head = types.SimpleNamespace(node_id="head", is_head=True, alive=True)
    nodes.view = lambda: [types.SimpleNamespace(node_id="member", is_head=False,
                                                alive=True), head]
    begun: list = []
    nodes._begin = lambda task, node_id: begun.append((task.spec.name, node_id))
    nodes.local = "member"
    book = RemoteBundles(owner, nodes)
    book._kick = lambda: None
    book.note_served(H, ["head", "member"], everywhere=True)
    own_node, on_head, anywhere = (_task(n, {"CPU": 1}, i)
                                   for n, i in (("own", 1), ("head", 0), ("any", -1)))
    assert all(book.submit(t) for t in (own_node, on_head, anywhere))
    assert list(book.served_waiting[H]) == [own_node, on_head, anywhere]
    assert book.serves(own_node.spec.request)  # an actor there is the service's
    book._lent(on_head, H, {"CPU": 1.0}, "here")
    assert begun == [("head", "head")] and H in book.served  # still borrowed from
    assert on_head not in book.served_waiting[H] and owner.resubmitted == []
    assert on_head in book.running[H]  # the group's removal ends it, as any of its tasks
    book.ended_on_head(on_head)
    assert on_head not in book.running[H]
    still = _task("still", {"CPU": 1}, 0)
    assert book.submit(still)
    book._lent(still, H, {"CPU": 1.0}, "here")
    book.removed(H)
    assert ("still", "TaskPlacementGroupRemoved") in owner.failed
    assert H not in book.served_everywhere
    book.note_served(H, ["head", "member"])  # not everywhere: this node's bundle is its
    assert not book.submit(_task("near", {"CPU": 1}, 1))  # ledger's, as for a head driver


def test_the_service_answers_here_for_its_group_with_no_bundle_on_other_nodes():
    """A group the service holds wholly on its own node has no remote parts: a driver on
    another host asking for room is told "here" (the head's ledger provides it), not left
    waiting; a group the service does not hold gets None."""
    owner, nodes = _Owner(), _Nodes()
    owner.pgs = types.SimpleNamespace(groups={H: types.SimpleNamespace(state="CREATED")})
    book = RemoteBundles(owner, nodes)
    assert book.lend_room(H, 0, {"CPU": 1.0}, "far") == "here"
    assert book.lend_room("cd" * 18, 0, {"CPU": 1.0}, "far") is None


def test_any_bundle_for_a_driver_on_another_host_is_the_heads_too_when_it_has_room():
    """A driver on another host asking for any bundle (-1) of the service's group: a
    remote bundle with room first (a loan); with none, "here" when the service's node's
    ledger has room in a bundle of the group now (the driver runs it there under a lease),
    else None (asked again). A driver of the service's own node is never told "here" for
    any bundle: its own queue had no room there (it spilled)."""
    book, owner, _nodes = _book(has_local=True)
    free: dict = {}
    owner.ledger = types.SimpleNamespace(available=lambda: dict(free))
    cpu = {"CPU": 1.0}
    loans = [book.lend_room(H, -1, cpu, "far", far=True) for _ in (1, 2)]
    assert [loan[1] for loan in loans] == [1, 2]  # the member's bundles, while they have room
    assert book.lend_room(H, -1, cpu, "far", far=True) is None  # the head's is full too
    free.update({f"CPU_group_0_{H}": 1.0, f"CPU_group_{H}": 1.0, f"bundle_group_0_{H}": 1.0})
    assert book.lend_room(H, -1, cpu, "far", far=True) == "here"
    assert book.lend_room(H, -1, {"CPU": 2.0}, "far", far=True) is None  # too big for it
    assert book.lend_room(H, -1, cpu, "near") is None  # a driver of this node: no "here"
    assert book.lend_room(H, 1, cpu, "far", far=True) is None  # a named bundle: its own
    book.return_room(loans[0][0])
    assert book.lend_room(H, -1, cpu, "far", far=True)[1] == 1  # room there again: a loan
    owner.ledger = types.SimpleNamespace(available=_unreadable)
    book.return_room(loans[1][0])
    book.lend_room(H, -1, cpu, "far", far=True)
    assert book.lend_room(H, -1, cpu, "far", far=True) is None  # the ledger is gone
    lone, _owner, _nodes = _book(has_local=False)  # no bundle on the service's node
    lone.owner.ledger = types.SimpleNamespace(available=lambda: dict(free))
    for _ in (1, 2):
        lone.lend_room(H, -1, cpu, "far", far=True)
    assert lone.lend_room(H, -1, cpu, "far", far=True) is None


def _unreadable():
    raise OSError("no ledger")


def test_a_driver_lends_an_actors_room_kept_while_the_service_holds_it():
    from miniray._private.owner import placement_group_loans as loans

    book, owner, nodes = _book(has_local=True)  # the creating driver's own group
    owner.remote_nodes = types.SimpleNamespace(bundles=book)
    owner.note_placement_use = lambda: None
    actor = b"\x01" * 4
    lend = {"what": "pg_lend", "pg": H, "index": -1, "base": {"CPU": 1}, "held": {"CPU": 1},
            "actor": actor.hex()}
    assert loans.answer_borrower(owner, lend, 4242) == {"loan": [1, "member", []]}
    assert loans.answer_borrower(owner, lend, 4242) == {"loan": [1, "member", []]}  # again
    assert book.groups[H][1].free == {"CPU": 0.0} and set(book.loans) == {actor}
    assert book.actor_loans_unsent == {actor: loans.borrower_token(4242)}
    assert loans.answer_borrower(owner, dict(lend, index=0), 4242) == {"loan": "here"}
    # Not created in the service: the room comes back (from the borrower only).
    kept = {"what": "pg_kept", "actor": actor.hex(), "kept": False}
    loans.answer_borrower(owner, kept, 4343)
    assert set(book.loans) == {actor}
    loans.answer_borrower(owner, kept, 4242)
    assert book.loans == {} and book.groups[H][1].free == {"CPU": 1.0}
    # Created: the loan is the group watch's (SVC_ALIVE) from then on, the borrower's end
    # no longer gives it back; the actor's end does (end_loan), and the lender's own task
    # runs in its room.
    loans.answer_borrower(owner, lend, 4242)
    loans.answer_borrower(owner, dict(kept, kept=True), 4242)
    assert book.actor_loans_unsent == {} and set(book.loans) == {actor}
    assert book.drop_loans(loans.borrower_token(4242)) == 0
    own = _task("own", {"CPU": 1}, 1)
    assert book.submit(own) and nodes.started == []
    book.end_loan(actor)
    assert nodes.started == [("own", 1)]
    # A borrower that went before saying: the service may hold its actor already, so the
    # room stays lent, as a kept loan, until the watch finds the service does not hold it
    # once the grace is over (a creation may still be on its way there).
    other = b"\x02" * 4
    loans.answer_borrower(owner, dict(lend, actor=other.hex(), index=2), 77)
    assert book.groups[H][2].free == {"CPU": 0.0}
    before = time.monotonic()
    assert book.drop_loans(loans.borrower_token(77)) == 1
    assert book.groups[H][2].free == {"CPU": 0.0} and set(book.loans) == {other}
    deadline = book.actor_loans_dropped[other]
    assert deadline >= before + loans.DROPPED_LOAN_GRACE_S
    assert loans.loans_ended([other], set(), book.actor_loans_dropped, before) == []
    assert loans.loans_ended([other], {other}, book.actor_loans_dropped, deadline) == []
    assert loans.loans_ended([other], set(), book.actor_loans_dropped, deadline) == [other]
    book.end_loan(other)
    assert book.groups[H][2].free == {"CPU": 1.0} and book.loans == {}
    assert book.actor_loans_dropped == {}
    # The group's removal forgets an unsent one too, and a dropped one.
    loans.answer_borrower(owner, lend, 4242)
    loans.answer_borrower(owner, dict(lend, actor=other.hex(), index=2), 77)
    book.drop_loans(loans.borrower_token(77))
    book.removed(H)
    assert book.loans == {} and book.actor_loans_unsent == {}
    assert book.actor_loans_dropped == {}


def test_an_actor_of_a_far_drivers_group_borrows_its_room_through_that_drivers_node():
    """``remote_bundles`` step 10: an actor of this driver in any bundle of a group that a
    driver of another node holds is the service's, lent room by that driver through its
    node (``pg_lend`` with the actor's id, then ``pg_kept``); ``spec.lent`` names the
    lender's node only when it is not the service's (the head); "here" (the bundle is on
    the lender's node) goes to the service's ledger when that node is the head, else the
    service leases the actor's room on that node (``leased_there``)."""
    from miniray._private.owner.actor_service_proxies import ServiceProxies

    owner, nodes = _Owner(), _Nodes()
    nodes.local = "third"
    entries = {n: types.SimpleNamespace(node_id=n, is_head=n == "head", alive=True)
               for n in ("head", "member", "third")}
    nodes.view = lambda: list(entries.values())
    asked: list = []
    answers: list = []

    def loan(what, fields, timeout=None):
        asked.append((what, fields))
        return answers.pop(0)

    nodes.client = lambda entry: types.SimpleNamespace(loan=loan, node=entry.node_id)
    book = RemoteBundles(owner, nodes)
    owner.remote_nodes = nodes
    nodes.bundles = book
    owner.placement_group_gone = lambda pg_hex, far=False: False
    on_member = placement.rewrite_request({"CPU": 1}, H, 1)
    assert book.actor_lender(on_member) is None  # not known as served yet
    for lender_node in ("head", "member"):
        book.note_served(H, ["head", "member"], ("node", lender_node, H), everywhere=True)
        assert book.serves(on_member)
        assert book.actor_lender(on_member) == ("node", lender_node, H)
        assert book.actor_lender(placement.rewrite_request({"CPU": 1}, H, 0)) is not None

    proxies = ServiceProxies()
    proxies.owner = owner
    proxies.link = types.SimpleNamespace(on_another_host=lambda: True)  # a member's driver
    spec = types.SimpleNamespace(
        actor_id=b"\x01" * 16, class_name="Where", lent=None,
        placement=placement.rewrite_request({"CPU": 1}, H, -1),
        held=placement.rewrite_request({"CPU": 0.5}, H, -1))
    answers[:] = [{"loan": [1, "member", ["0"]]}, {"loan": None}]  # pg_lend, pg_kept
    assert proxies._borrow_for_actor(spec, ("node", "member", H), 0.0) == {
        "lender": ("node", "member", H), "kept": False}
    assert asked[0] == ("pg_lend", {"pg": H, "index": -1, "base": {"CPU": 1.0},
                                    "held": {"CPU": 0.5}, "actor": spec.actor_id.hex()})
    assert placement.bundle_request(spec.placement)[1] == 1  # the bundle lent
    assert spec.lent == (entries["member"], ["0"], "member", True)  # the head asks member
    proxies._tell_lender(spec, {"lender": ("node", "member", H), "kept": True})
    assert asked[1] == ("pg_kept", {"pg": H, "actor": spec.actor_id.hex(), "kept": True})
    answers[:] = [{"loan": [1, "member", []]}]
    assert proxies._borrow_for_actor(spec, ("node", "head", H), 0.0) is not None
    assert spec.lent[2] == ""  # the lender's node is the service's: it reads its ledger
    answers[:] = [{"loan": "here"}, {"loan": "here"}]
    spec.lent = None
    assert proxies._borrow_for_actor(spec, ("node", "head", H), 0.0) is None
    assert spec.lent is None  # the head's ledger places it, as any actor of the group
    assert proxies._borrow_for_actor(spec, ("node", "member", H), 0.0) is None
    assert spec.lent == (entries["member"], [], "member", True, True)  # leased there

    service = RemoteBundles(_Owner(), _Nodes())  # the head's service takes both kinds
    leased = types.SimpleNamespace(actor_id=b"\x02" * 16, lent=spec.lent,
                                   placement=spec.placement)
    service.borrow(leased)
    lent = types.SimpleNamespace(actor_id=b"\x03" * 16, placement=spec.placement,
                                 lent=(entries["member"], [], "member", True))
    service.borrow(lent)
    assert service.leased_there(leased.actor_id) is entries["member"]
    assert service.leased_there(lent.actor_id) is None and lent.actor_id in service.borrowed
    assert service.lender_watched == {H: "member"}
    service.unborrow(lent.actor_id)
    assert service.lender_watched == {H: "member"}  # the leased one still lives
    service.unborrow(leased.actor_id)
    assert service.lender_watched == {} and service.on_lender_node == {}
