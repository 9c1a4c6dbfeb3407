"""The pure decisions of tasks on other hosts: which tasks go to another node
(``owner/task_nodes.placement_for``) and which options name one (``options.hard_affinity``);
and the one thread that places again what waits for a node that may join (``watch``)."""

from __future__ import annotations

import contextlib
import doctest
import threading

from miniray._private.core import node_pick, options, task_nodes
from miniray._private.core.cluster_view import NodeEntry
from miniray._private.core.task_spec import TaskSpec
from miniray._private.owner import remote_nodes, remote_offload, remote_worker
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .test_remote_drivers import wait_until

HERE = NodeEntry("here", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 2})
THERE = NodeEntry("there", "10.0.0.2", 1, totals={"CPU": 2, "GPU": 1},
                  available={"CPU": 0, "GPU": 1})
DEAD = NodeEntry("dead", "10.0.0.3", 1, totals={"CPU": 2}, available={"CPU": 2},
                 alive=False)
VIEW = [HERE, THERE, DEAD]


def test_doctests():
    for module in (remote_nodes, remote_worker, task_nodes):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_another_alive_node_with_the_totals_is_taken_even_when_full_now():
    assert task_nodes.placement_for("there", {"CPU": 1}, "here", VIEW) == "there"
    assert task_nodes.placement_for("there", {"GPU": 1}, "here", VIEW) == "there"


def test_an_affinity_to_this_node_or_no_affinity_goes_the_local_way_as_before():
    place = task_nodes.placement_for
    assert place("here", {"CPU": 1}, "here", VIEW) is None  # the driver's own node
    assert place(("here", True, False), {"CPU": 1}, "here", VIEW) is None
    assert place(None, {"CPU": 1}, "here", VIEW) is None
    assert place(None, {"GPU": 1}, "here", []) is None  # no view: a one-host driver


def test_a_hard_affinity_to_a_dead_unknown_or_too_small_node_is_unschedulable():
    place = task_nodes.placement_for
    for node_id, request, view in (("dead", {"CPU": 1}, VIEW), ("unknown", {"CPU": 1}, VIEW),
                                   ("there", {"CPU": 4}, VIEW), ("there", {"CPU": 1}, [])):
        answer = place(node_id, request, "here", view)
        assert isinstance(answer, task_nodes.Unschedulable), (node_id, answer)
        assert node_id in answer and "NodeAffinitySchedulingStrategy(soft=False)" in answer
    # The local node, when it can never hold the request (the infeasible path asks).
    answer = place(("here", False, False), {"CPU": 4}, "here", VIEW, local_feasible=False)
    assert isinstance(answer, task_nodes.Unschedulable) and "this node lacks" in answer
    # The node that just died under a retry counts as dead, whatever the view says.
    assert isinstance(place("there", {"CPU": 1}, "here", VIEW, exclude="there"),
                      task_nodes.Unschedulable)


def test_a_soft_affinity_runs_there_while_alive_with_the_totals_else_as_without():
    place = task_nodes.placement_for
    assert place(("there", True, False), {"GPU": 1}, "here", VIEW) == "there"
    assert place(("there", True, False), {"CPU": 1}, "here", VIEW) == "there"  # waits there
    assert place(("there", True, True), {"CPU": 1}, "here", VIEW) is None  # spills: full
    assert place(("there", True, False), {"CPU": 4}, "here", VIEW) is None  # too small
    assert place(("dead", True, False), {"CPU": 1}, "here", VIEW) is None
    assert place(("there", True, False), {"CPU": 1}, "here", VIEW, exclude="there") is None
    # Soft to a dead node, and the local node can never hold it: the default rules.
    assert place(("dead", True, False), {"GPU": 1}, "here", VIEW,
                 local_feasible=False) == "there"


def test_a_hard_affinity_that_fails_on_unavailable_is_unschedulable_when_full():
    answer = task_nodes.placement_for(("there", False, True), {"CPU": 1}, "here", VIEW)
    assert isinstance(answer, task_nodes.Unschedulable) and "_fail_on_unavailable" in answer
    assert task_nodes.placement_for(("there", False, True), {"GPU": 1}, "here",
                                      VIEW) == "there"


def test_a_task_the_local_node_can_never_hold_goes_to_a_node_that_can():
    place = task_nodes.placement_for
    other = NodeEntry("other", "10.0.0.4", 1,
                      totals={"CPU": 8, "special": 1, "node:10.0.0.4": 1},
                      available={"CPU": 0, "special": 1, "node:10.0.0.4": 1})
    view = [HERE, THERE, DEAD, other]
    assert place(None, {"GPU": 1}, "here", view, local_feasible=False) == "there"
    assert place(None, {"special": 1}, "here", view, local_feasible=False) == "other"
    assert place(None, {"CPU": 4}, "here", view, local_feasible=False) == "other"
    assert place(None, {"CPU": 1, "node:10.0.0.4": 0.001}, "here", view,
                 local_feasible=False) == "other"  # full now: its lease waits there
    # Nowhere: locally (pending with the infeasible line, as before), never a dead node.
    assert place(None, {"TPU": 1}, "here", view, local_feasible=False) is None
    assert place(None, {"CPU": 1, "node:10.0.0.3": 0.001}, "here", view,
                 local_feasible=False) is None
    assert place(None, {"GPU": 1}, "here", view, local_feasible=False,
                 exclude="there") is None


def test_spill_over_a_busy_local_node_goes_to_a_node_with_room_now():
    place = task_nodes.placement_for
    free = NodeEntry("free", "10.0.0.6", 1, totals={"CPU": 4}, available={"CPU": 3})
    view = [HERE, THERE, free]
    # Not asked (the ledger had room, or nobody asked): the local fast path, no rule run.
    assert place(None, {"CPU": 1}, "here", view) is None
    assert place(None, {"CPU": 1}, "here", view, local_room=True) is None
    # The ledger said "no room now": another node with room now (not THERE: no CPU free).
    assert place(None, {"CPU": 1}, "here", view, local_room=False) == "free"
    # No other node has room now: it waits here, in its queue.
    assert place(None, {"CPU": 1}, "here", [HERE, THERE], local_room=False) is None
    # Its arguments here are too large to move: it waits here.
    big = {"here": node_pick.MOVE_MAX_ARG_BYTES + 1}
    assert place(None, {"CPU": 1}, "here", view, local_room=False, arg_bytes=big) is None


def test_spill_over_leaves_alone_what_is_placed_already_or_cancelled():
    from types import SimpleNamespace as N

    def task(**fields):
        spec = dict(affinity=None, placement=None, num_returns=1, contained=())
        spec.update(fields)
        return N(spec=N(**spec), cancelled=False)

    assert task_nodes.may_spill(task())
    assert task_nodes.may_spill(task(num_returns=0))
    # Generators (streaming, dynamic) may: their values come back as the task runs; so
    # may a task given refs nested in its arguments: it gets them from the driver there.
    for fields in ({"num_returns": -1}, {"num_returns": -2}, {"contained": (b"ref",)}):
        assert task_nodes.may_spill(task(**fields)), fields
    for fields in ({"affinity": task_nodes.SPREAD}, {"affinity": ("b", True, False)},
                   {"placement": ("ab", [], False)}):
        assert not task_nodes.may_spill(task(**fields)), fields
    cancelled = task()
    cancelled.cancelled = True
    assert not task_nodes.may_spill(cancelled)


def test_spread_rotates_over_nodes_with_room_this_one_included():
    place = task_nodes.placement_for
    other = NodeEntry("other", "10.0.0.4", 1, totals={"CPU": 2}, available={"CPU": 2})
    view = [HERE, other]
    spread = task_nodes.SPREAD
    picked = [place(spread, {"CPU": 1}, "here", view, turn=t) for t in range(4)]
    assert picked == [None, "other", None, "other"]  # None: this node's own queue
    assert place(spread, {"CPU": 1}, "here", [HERE]) is None  # one node: it stays
    full = NodeEntry("other", "10.0.0.4", 1, totals={"CPU": 2}, available={"CPU": 0})
    assert {place(spread, {"CPU": 1}, "here", [HERE, full], turn=t)
            for t in range(3)} == {None}  # room only here
    # Room nowhere: it queues here when it can, else waits where it can run.
    busy = NodeEntry("here", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 0})
    assert place(spread, {"CPU": 1}, "here", [busy, full]) is None
    assert place(spread, {"CPU": 4}, "here", [busy, NodeEntry(
        "big", "10.0.0.7", 1, totals={"CPU": 8}, available={"CPU": 0})],
        local_feasible=False) == "big"


def test_node_died_error_names_the_node_as_ray_does():
    error = remote_worker.node_died_error("f", THERE, "its link closed.")
    assert type(error).__name__ == "NodeDiedError"
    assert "Node IP: 10.0.0.2, node ID: there." in str(error)
    assert "its link closed." in str(error) and "max_retries" in str(error)


def test_hard_affinity_reads_only_a_hard_node_affinity():
    assert options.hard_affinity({}) is None
    assert options.hard_affinity({"scheduling_strategy": "SPREAD"}) is None
    soft = NodeAffinitySchedulingStrategy("ab" * 28, soft=True)
    hard = NodeAffinitySchedulingStrategy("ab" * 28, soft=False)
    assert options.hard_affinity({"scheduling_strategy": soft}) is None
    assert options.hard_affinity({"scheduling_strategy": hard}) == "ab" * 28
    assert options.node_affinity({"scheduling_strategy": soft}) == ("ab" * 28, True, False)
    assert options.node_affinity({"scheduling_strategy": hard}) == ("ab" * 28, False, False)
    spill = NodeAffinitySchedulingStrategy("ab" * 28, soft=True, _spill_on_unavailable=True)
    fail = NodeAffinitySchedulingStrategy("ab" * 28, soft=False, _fail_on_unavailable=True)
    assert options.node_affinity({"scheduling_strategy": spill}) == ("ab" * 28, True, True)
    assert options.node_affinity({"scheduling_strategy": fail}) == ("ab" * 28, False, True)
    assert options.hard_affinity({"scheduling_strategy": NodeAffinitySchedulingStrategy(
        "", soft=False)}) is None


def test_a_task_spec_carries_its_affinity_through_pickling():
    import pickle

    spec = TaskSpec(b"t", b"f", None, "f", "f", b"", [], [b"r"], 1, {"CPU": 1.0}, 3, False,
                    0)
    assert spec.affinity is None
    spec.affinity = ("there", True)
    assert pickle.loads(pickle.dumps(spec)).affinity == ("there", True)


def test_a_denied_task_moves_only_to_a_node_with_room_where_it_may_go():
    move = task_nodes.move_to
    full = NodeEntry("full", "10.0.0.5", 1, totals={"CPU": 4, "X": 1},
                     available={"CPU": 4, "X": 0})
    free = NodeEntry("free", "10.0.0.6", 1, totals={"CPU": 4, "X": 1},
                     available={"CPU": 4, "X": 1})
    busy = NodeEntry("free", "10.0.0.6", 1, totals={"CPU": 4, "X": 1},
                     available={"CPU": 4, "X": 0})
    view = [HERE, full, free]
    assert move(None, {"X": 1}, "here", view, "full", False) == "free"
    assert move(None, {"X": 1}, "here", [HERE, full, busy], "full", False) is None
    # Held to its node by an affinity (hard, or soft while it is alive with the totals).
    assert move(("full", False, False), {"X": 1}, "here", view, "full", False) is None
    assert move(("full", True, False), {"X": 1}, "here", view, "full", False) is None
    assert move(("full", True, True), {"X": 1}, "here", view, "full", False) == "free"
    # A task spilled from this node moves on to another node with room, never back here
    # (its queue is the owner's), even when the view shows room here.
    assert move(None, {"CPU": 1}, "here", view, "full", True) == "free"
    assert move(None, {"CPU": 1}, "here", [HERE, full], "full", True) is None


class _WatchOwner:
    """What ``RemoteNodes.watch`` reads of the owner: its lock, its infeasible tasks."""

    def __init__(self):
        self.hello_info = {}
        self.closed = False
        self.lock = threading.Lock()
        self.tasks = type("Tasks", (), {"infeasible": {}})()

    @contextlib.contextmanager
    def locked(self):
        with self.lock:
            yield


def test_one_watcher_thread_rechecks_every_placer_until_none_waits(monkeypatch):
    monkeypatch.setattr(remote_offload, "INFEASIBLE_WATCH_S", 0.005)
    owner = _WatchOwner()
    nodes = remote_nodes.RemoteNodes(owner)
    calls = {"a": 0, "b": 0}
    locked_in_call = []

    def recheck(name, rounds):
        def again(view):
            assert isinstance(view, list)
            locked_in_call.append(owner.lock.locked())
            calls[name] += 1
            return calls[name] < rounds
        return again

    a, b = recheck("a", 2), recheck("b", 4)
    with owner.locked():
        nodes.watch(a)
        nodes.watch(b)
        nodes.watch(a)  # registered once
    watchers = [t for t in threading.enumerate() if t.name == "miniray-remote-infeasible"]
    assert len(watchers) == 1
    watchers[0].join(5)
    assert not watchers[0].is_alive() and not nodes._watching
    # Each placer is asked every round until no one has work waiting (b's fourth answer).
    assert calls == {"a": 4, "b": 4} and all(locked_in_call)
    with owner.locked():
        nodes.watch()  # started again on demand, and ends at once with nothing waiting
    assert nodes._watching
    assert wait_until(lambda: not nodes._watching, 5.0)


class _Spec:
    def __init__(self, index: int, request: dict):
        self.task_id = index.to_bytes(4, "big")
        self.affinity = task_nodes.SPREAD
        self.request = request


class _Task:
    def __init__(self, index: int, request: dict):
        self.spec = _Spec(index, request)
        self.state = None
        self.worker = type("Slot", (), {"claim": None})()


def test_spread_tasks_count_the_drivers_own_whether_the_view_shows_them_or_not(monkeypatch):
    """The view shows one task here (0.5 of 2 CPUs) and none of the burst placed after
    it: each SPREAD task placed, here or there, counts at once, so 7 more of 0.5 CPU land
    3 here and 4 there (4 and 4); on the view alone, "there" took all 7. A view read
    later that shows them counts them once; one that ended here is forgotten then."""
    owner = _WatchOwner()
    nodes = remote_nodes.RemoteNodes(owner)
    nodes.local, nodes.session_dir = "here", "session"

    def node(node_id, available):
        return NodeEntry(node_id, "", 1, totals={"CPU": 2}, available={"CPU": available})

    shown = {}  # what the next read of the view file says (node id -> entry)
    monkeypatch.setattr(remote_offload.nc, "read_cluster", lambda _dir: shown)
    monkeypatch.setattr(remote_offload.cluster_view, "nodes_of", lambda doc: doc)
    monkeypatch.setattr(remote_offload, "VIEW_MAX_AGE_S", 3600.0)  # read when asked only

    def read(**available):
        shown.clear()
        shown.update({k: node(k, v) for k, v in available.items()})
        nodes.view(fresh=True)

    def place(tasks):
        out = []
        for task in tasks:
            placed = nodes._place(task, True)[0]
            if placed is not None:  # what _start does for a task on another node
                nodes._claim(task.worker, placed, task.spec.request)
            out.append(placed or "here")
        return out

    read(here=1.5, there=2.0)
    burst = [_Task(i, {"CPU": 0.5}) for i in range(7)]
    placed = place(burst)
    assert placed.count("here") == 3 and placed.count("there") == 4, placed
    # A read that shows all of them (no room left by it) counts each once: both full.
    read(here=0.0, there=0.0)
    assert all(e.available["CPU"] == 0.0 for e in nodes._own_view(nodes.last_view()))
    # One that shows none of them yet (a late heartbeat) counts them all the same; the
    # first task here is taken for one of them then (``less_claims``: the use it shows,
    # 0.5, is under what this driver's tasks there held at the read, 1.5).
    read(here=1.5, there=2.0)
    assert {e.node_id: e.available["CPU"] for e in nodes._own_view(nodes.last_view())} == \
        {"here": 0.5, "there": 0.0}
    # Those there count no more once they end; those here that ended, from the next read.
    read(here=0.0, there=0.0)
    for task in burst:
        if task.worker.claim is None:
            task.state = remote_offload.T_DONE
        else:
            nodes._claim(task.worker, None, task.spec.request)
    assert {e.node_id: e.available["CPU"] for e in nodes._own_view(nodes.last_view())} == \
        {"here": 0.0, "there": 2.0}
    read(here=1.5, there=2.0)  # the first task here still runs
    assert nodes._spread_here == {} and nodes._spread_use == {}
    assert {e.node_id: e.available["CPU"] for e in nodes._own_view(nodes.last_view())} == \
        {"here": 1.5, "there": 2.0}
