"""A task on another host asks its driver for things (``owner/remote_requests.py``).

Fake hosts as in test_remote_tasks.py (a head on 127.0.0.1 and a member on 127.0.0.2, each
with its own root; the fixture's teardown checks that no process, segment, lease or session
file is left on either): a task placed on the member by a hard node affinity submits
tasks, gets, puts and waits, reads refs nested in its arguments, calls an actor of the
driver's, creates, finds and kills actors (the driver's, named and detached ones through
the node's actor service), sees its children's errors, and is cancelled with its children.
"""

from __future__ import annotations

import os

import pytest

from .helpers import CANCEL_AND_GET, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_tasks import MEMBER, _run_driver


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member's (host, port) with 2 CPUs."""
    yield hosts.start_member(MEMBER, "--num-cpus", "2")


def _no_member_leases(hosts) -> bool:
    from miniray._private.ledger.ledger import Ledger

    path = os.path.join(hosts.record(MEMBER).session_dir, "ledger.json")
    return not Ledger(path).snapshot().leases


def test_a_task_on_the_member_submits_gets_puts_waits_and_calls_an_actor(hosts, member):
    doc = _run_driver(hosts, """
    import numpy as np

    @ray.remote
    def square(x):
        return x * x, ray.get_runtime_context().get_node_id()

    @ray.remote
    def parent(n):
        refs = [square.remote(i) for i in range(n)]
        got = ray.get(refs, timeout=30)
        return [v for v, _ in got], sorted({node for _, node in got}), \\
            ray.get_runtime_context().get_node_id()

    @ray.remote
    def put_get(megabytes):
        array = np.arange(megabytes * 1024 * 1024 // 8, dtype=np.float64)
        ref = ray.put(array)
        back = ray.get(ref, timeout=30)
        return float(back.sum()) == float(array.sum()), back.nbytes, \\
            bool(back.flags.writeable), ref

    @ray.remote
    def sleepy(s):
        time.sleep(s)
        return s

    @ray.remote
    def waits():
        slow, fast = sleepy.remote(600), sleepy.remote(0)
        # fast is seen done while waiting, however long its worker takes to start (a
        # loaded runner's start has no bound); then a wait for both ends at its timeout
        first, _ = ray.wait([slow, fast], num_returns=1, timeout=60)
        assert first == [fast], first
        t0 = time.monotonic()
        ready, pending = ray.wait([slow, fast], num_returns=2, timeout=4.0)
        waited = time.monotonic() - t0
        ray.cancel(slow, force=True)
        return len(ready), len(pending), ray.get(ready[0], timeout=10), waited

    @ray.remote
    def nested(box):
        return sum(ray.get(box["refs"], timeout=30))

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k
            return self.n

    @ray.remote
    def calls(counter):
        return ray.get([counter.add.remote(k) for k in (1, 2, 3)], timeout=30)

    @ray.remote
    def hands_back(n):
        return [square.remote(i) for i in range(n)], ray.put(np.ones(1 << 18))

    on = dict(scheduling_strategy=there)
    values, nodes, ran_on = ray.get(parent.options(**on).remote(3), timeout=60)
    refs, big_ref = ray.get(hands_back.options(**on).remote(2), timeout=60)
    time.sleep(0.3)  # the task's borrows are released by now: its refs must still hold
    handed = [v for v, _ in ray.get(refs, timeout=30)] + [float(ray.get(big_ref).sum())]
    same, nbytes, writeable, put_ref = ray.get(put_get.options(**on).remote(20), timeout=60)
    from_put = ray.get(put_ref, timeout=30)  # the put is the driver's: it outlives the task
    ready, pending, first, waited = ray.get(waits.options(**on).remote(), timeout=60)
    inner = [ray.put(i) for i in (10, 20, 30)]
    summed = ray.get(nested.options(**on).remote({"refs": inner}), timeout=60)
    counter = Counter.remote()
    counted = ray.get(calls.options(**on).remote(counter), timeout=60)
    after = ray.get(counter.add.remote(0), timeout=30)
    print(json.dumps({
        "values": values, "nodes": nodes, "ran_on": ran_on, "member": member,
        "here": ray.get_runtime_context().get_node_id(), "same": same, "nbytes": nbytes,
        "writeable": writeable, "from_put": [from_put.nbytes, float(from_put[-1])],
        "wait": [ready, pending, first, waited], "summed": summed, "counted": counted,
        "after": after, "handed": handed}), flush=True)
    del from_put, put_ref, refs, big_ref
    ray.shutdown()
    """, timeout=120)
    assert doc["ran_on"] == doc["member"] != doc["here"], doc
    assert doc["values"] == [0, 1, 4], doc
    # The children are the driver's tasks: they run on its node, or spill over to the
    # member when the driver's node has no room at that moment (its CPUs are busy).
    assert doc["nodes"] and set(doc["nodes"]) <= {doc["here"], doc["member"]}, doc
    mb20 = 20 * 1024 * 1024
    assert [doc["same"], doc["nbytes"], doc["writeable"]] == [True, mb20, False], doc
    assert doc["from_put"] == [mb20, float(mb20 // 8 - 1)], doc
    ready, pending, first, waited = doc["wait"]
    # It ended at its timeout, not with slow (600 s; the bound leaves a loaded runner room)
    assert [ready, pending, first] == [1, 1, 0] and 3.8 < waited < 60, doc["wait"]
    assert doc["summed"] == 60, doc
    assert doc["counted"] == [1, 3, 6] and doc["after"] == 6, doc
    assert doc["handed"] == [0, 1, float(1 << 18)], doc  # refs in its result outlive it
    assert wait_until(lambda: _no_member_leases(hosts), 30.0)


def test_a_remote_task_or_actor_creates_finds_and_kills_actors_as_the_driver_would(
        hosts, member):
    """A task on the member creates an actor (the driver's: placed by its rules, here on
    the driver's node), calls it and returns its handle, which the driver calls too;
    another creates a named detached actor the driver finds and kills; an actor on the
    member looks it up, lists the names and creates an actor placed on the member; a task
    on the member kills actors it was given (on either node); looking up a missing name
    raises ValueError there, as in Ray."""
    doc = _run_driver(hosts, """
    @ray.remote
    class Counter:
        def __init__(self, start=0):
            self.n = start

        def add(self, k):
            self.n += k
            return self.n

        def node(self):
            return ray.get_runtime_context().get_node_id()

    @ray.remote
    def creates(n):
        counter = Counter.remote(n)
        return counter, ray.get(counter.add.remote(1), timeout=30), \\
            ray.get_runtime_context().get_node_id()

    @ray.remote
    def creates_named():
        keeper = Counter.options(name="keeper", lifetime="detached").remote(100)
        return ray.get(keeper.add.remote(1), timeout=30)

    @ray.remote
    class Finder:
        def find(self, name):
            try:
                handle = ray.get_actor(name)
            except ValueError as error:
                return ["ValueError", str(error)]
            return ray.get(handle.add.remote(10), timeout=30)

        def spawn(self):  # an actor's own creation: placed on the member by its option
            made = Counter.options(scheduling_strategy=there).remote(1)
            return made, ray.get(made.node.remote(), timeout=30)

        def names(self):
            return sorted(ray.util.list_named_actors()), \\
                ray.get_runtime_context().get_node_id()

    @ray.remote
    def kills(handle):
        ray.kill(handle)
        return True

    @ray.remote
    def missing():
        try:
            ray.get_actor("nobody")
        except ValueError as error:
            return type(error).__name__
        return None

    on = dict(scheduling_strategy=there)
    counter, first, task_node = ray.get(creates.options(**on).remote(5), timeout=60)
    second = ray.get(counter.add.remote(1), timeout=30)
    counter_node = ray.get(counter.node.remote(), timeout=30)
    made = ray.get(creates_named.options(**on).remote(), timeout=60)
    finder = Finder.options(**on).remote()
    found = ray.get(finder.find.remote("keeper"), timeout=60)
    names, finder_node = ray.get(finder.names.remote(), timeout=30)
    not_found = ray.get(finder.find.remote("nobody"), timeout=30)
    missing_type = ray.get(missing.options(**on).remote(), timeout=60)
    keeper = ray.get_actor("keeper")
    from_driver = ray.get(keeper.add.remote(100), timeout=30)
    ray.kill(keeper)
    try:
        ray.get_actor("keeper")
        after_kill = None
    except ValueError:
        after_kill = "ValueError"
    spawned, spawned_node = ray.get(finder.spawn.remote(), timeout=60)
    spawned_sum = ray.get(spawned.add.remote(2), timeout=30)
    killed, victim_after = [], []
    for victim in (Counter.remote(), spawned):  # one on the driver's node, one there
        ray.get(victim.add.remote(1), timeout=30)
        killed.append(ray.get(kills.options(**on).remote(victim), timeout=60))
        try:
            ray.get(victim.add.remote(1), timeout=30)
            victim_after.append(None)
        except ray.exceptions.RayActorError as error:
            victim_after.append(type(error).__name__)
    ray.kill(finder)
    del counter, keeper, victim, finder, spawned
    print(json.dumps({
        "first": first, "second": second, "task_node": task_node,
        "counter_node": counter_node, "made": made, "found": found, "names": names,
        "finder_node": finder_node, "not_found": not_found, "missing": missing_type,
        "from_driver": from_driver, "after_kill": after_kill, "killed": killed,
        "victim_after": victim_after, "member": member, "spawned": spawned_sum,
        "spawned_node": spawned_node,
        "here": ray.get_runtime_context().get_node_id()}), flush=True)
    ray.shutdown()
    """, timeout=150)
    assert doc["task_node"] == doc["member"] == doc["finder_node"] != doc["here"], doc
    # The driver's actor, placed by the driver's rules (no option: on its own node).
    assert [doc["first"], doc["second"], doc["counter_node"]] == [6, 7, doc["here"]], doc
    assert [doc["made"], doc["found"], doc["from_driver"]] == [101, 111, 211], doc
    assert doc["names"] == ["keeper"], doc
    assert doc["not_found"][0] == "ValueError" and "nobody" in doc["not_found"][1], doc
    assert doc["missing"] == "ValueError" and doc["after_kill"] == "ValueError", doc
    assert doc["spawned"] == 3 and doc["spawned_node"] == doc["member"], doc
    assert doc["killed"] == [True, True], doc
    assert doc["victim_after"] == ["ActorDiedError", "ActorDiedError"], doc
    assert wait_until(lambda: _no_member_leases(hosts), 30.0)


def test_a_childs_error_reaches_the_remote_parent_and_the_driver_with_its_type(hosts, member):
    """Also: a child placed on the member too, and a placement group the task creates,
    uses and removes (the driver's group)."""
    doc = _run_driver(hosts, """
    class Oops(ValueError):
        pass

    @ray.remote(max_retries=0)
    def child():
        raise Oops("child failed")

    @ray.remote(max_retries=0)
    def caught():
        try:
            ray.get(child.remote(), timeout=30)
        except Oops as error:
            return ["Oops", isinstance(error, ray.exceptions.RayTaskError), str(error)]
        return None

    @ray.remote(max_retries=0)
    def uncaught():
        return ray.get(child.remote(), timeout=30)

    @ray.remote
    def in_group():
        return ray.get_runtime_context().get_node_id()

    @ray.remote(max_retries=0)
    def creates_group():  # the group is the driver's, placed by its rules
        from miniray.util.placement_group import (placement_group,
                                                  placement_group_table,
                                                  remove_placement_group)
        from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        pg = placement_group([{"CPU": 1}], name="made-on-member")
        ray.get(pg.ready(), timeout=30)
        state = placement_group_table(pg)["state"]
        ran_on = ray.get(in_group.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg)).remote(), timeout=30)
        remove_placement_group(pg)
        return [state, ran_on]

    @ray.remote
    def there_too():
        return ray.get_runtime_context().get_node_id()

    @ray.remote
    def grandparent():  # a child placed on the member too: the parent's node
        return ray.get(there_too.options(scheduling_strategy=there).remote(), timeout=30)

    @ray.remote
    class GroupMaker:
        def make_here(self):  # served off the actor's reader thread (a blocking call)
            from miniray.util.placement_group import placement_group, remove_placement_group
            pg = placement_group([{"CPU": 1}])
            ok = pg.wait(30)
            remove_placement_group(pg)
            return ok

    on = dict(scheduling_strategy=there)
    group = ray.get(creates_group.options(**on).remote(), timeout=60)
    maker = GroupMaker.options(**on).remote()
    actor_group = ray.get(maker.make_here.remote(), timeout=60)
    ray.kill(maker)
    group_after = ray.util.placement_group_table()
    nested_there = ray.get(grandparent.options(**on).remote(), timeout=60)
    inside = ray.get(caught.options(**on).remote(), timeout=60)
    try:
        ray.get(uncaught.options(**on).remote(), timeout=60)
        outside = None
    except Oops as error:
        outside = [type(error).__name__, isinstance(error, ray.exceptions.RayTaskError),
                   str(error)]
    print(json.dumps({"inside": inside, "outside": outside, "group": group,
                      "actor_group": actor_group,
                      "group_after": [row["state"] for row in group_after.values()],
                      "head": ray.get_runtime_context().get_node_id(),
                      "nested_there": nested_there, "member": member}), flush=True)
    ray.shutdown()
    """)
    assert doc["inside"][:2] == ["Oops", True] and "child failed" in doc["inside"][2], doc
    name, is_task_error, text = doc["outside"]
    assert is_task_error and "child failed" in text and "uncaught" in text, doc
    # A placement group made by a task on the member is the driver's: placed on the
    # driver's node (local first), used by a child, removed by the task.
    assert doc["group"] == ["CREATED", doc["head"]], doc
    assert doc["group_after"] == ["REMOVED", "REMOVED"], doc
    assert doc["actor_group"] is True, doc
    assert doc["nested_there"] == doc["member"], doc


def test_cancelling_a_remote_parent_recursively_cancels_its_children(hosts, member):
    doc = _run_driver(hosts, CANCEL_AND_GET + """
    @ray.remote(max_retries=0)
    def child(path):
        open(path, "w").close()
        for _ in range(300):
            time.sleep(0.1)
        return "finished"

    @ray.remote(max_retries=0)
    def parent(paths):
        refs = [child.remote(p) for p in paths]
        return ray.get(refs)

    @ray.remote(max_retries=0)
    def waits_on(path):
        return ray.get(child.remote(path))

    # Not recursive: the parent's get is interrupted (KeyboardInterrupt there, as Ray).
    blocked_path = os.path.join(os.environ["MINIRAY_TMPDIR"], "blocked")
    blocked = waits_on.options(scheduling_strategy=there).remote(blocked_path)
    deadline = time.monotonic() + 30
    while not os.path.exists(blocked_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    interrupted = cancel_and_get(blocked)

    paths = [os.path.join(os.environ["MINIRAY_TMPDIR"], f"child-{i}") for i in range(2)]
    ref = parent.options(scheduling_strategy=there).remote(paths)
    deadline = time.monotonic() + 30
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = all(os.path.exists(p) for p in paths)
    outcome, waited = cancel_and_get(ref, recursive=True)
    from miniray.util.state import list_tasks
    state = list_tasks(filters=[("name", "=", "child")])
    print(json.dumps({"interrupted": interrupted, "started": started, "outcome": outcome,
                      "waited": waited,
                      "children": sorted(t["state"] for t in state)}), flush=True)
    ray.shutdown()
    """)
    # As on the driver's node: the interrupted get's error, wrapped as the task's.
    # Bounds short of the gets' 20 s timeout (no cancel), with room for a loaded runner.
    assert "TaskCancelledError" in doc["interrupted"][0] and doc["interrupted"][1] < 15, doc
    assert doc["started"], doc
    # As for a parent on the driver's node: its get raised its child's cancel first.
    assert "TaskCancelledError" in doc["outcome"] and doc["waited"] < 15, doc
    assert doc["children"] and all(s in ("FAILED",) for s in doc["children"]), doc
    assert wait_until(lambda: _no_member_leases(hosts), 30.0)


def test_the_idle_worker_serves_the_next_task_after_one_that_held_refs(hosts, member):
    """The refs a task's arguments held are dropped after its RESULT (a BORROW the idle
    worker then sends): the worker stays reusable."""
    doc = _run_driver(hosts, """
    @ray.remote
    def nested(box):
        return sum(ray.get(box["refs"], timeout=30)), os.getpid()

    on = dict(scheduling_strategy=there)
    inner = [ray.put(i) for i in (10, 20, 30)]
    pids = []
    for _ in range(3):
        pids.append(ray.get(nested.options(**on).remote({"refs": inner}), timeout=60)[1])
        time.sleep(0.1)
    print(json.dumps({"pids": pids}), flush=True)
    ray.shutdown()
    """, timeout=120)
    assert len(set(doc["pids"])) == 1, doc


def test_a_remote_worker_dying_while_its_get_waits_fails_the_task_at_once(hosts, member):
    doc = _run_driver(hosts, """
    import threading

    @ray.remote(max_retries=0)
    def sleeps():
        time.sleep(60)

    @ray.remote(max_retries=0)
    def dies_waiting():
        threading.Timer(1.0, os._exit, args=(1,)).start()
        return ray.get(sleeps.remote())

    t0 = time.monotonic()
    try:
        ray.get(dies_waiting.options(scheduling_strategy=there).remote(), timeout=30)
        outcome = None
    except Exception as error:
        outcome = type(error).__name__
    print(json.dumps({"outcome": outcome, "waited": time.monotonic() - t0}), flush=True)
    ray.shutdown()
    """)
    print(f"\nfailed {doc['waited']:.2f} s after submission (the worker died at 1 s)")
    # Short of the get's 30 s (the child's 60 s), with room for a loaded runner's start.
    assert doc["outcome"] == "WorkerCrashedError" and doc["waited"] < 25, doc
    assert wait_until(lambda: _no_member_leases(hosts), 30.0)


def test_an_actor_a_remote_task_made_ends_when_the_task_drops_its_handle(hosts, member):
    """As in Ray: an actor made by a task on the member (one placed on the driver's node,
    one on the member) whose handle the task dropped ends; the member's lease goes too."""
    doc = _run_driver(hosts, """
    import time
    from miniray.util.state import list_actors

    @ray.remote
    class Probe:
        def pid(self):
            return os.getpid()

    @ray.remote
    def uses_one(where):
        probe = (Probe.options(scheduling_strategy=there) if where else Probe).remote()
        return ray.get(probe.pid.remote(), timeout=30)

    on = dict(scheduling_strategy=there)
    pids = ray.get([uses_one.options(**on).remote(False),
                    uses_one.options(**on).remote(True)], timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        states = sorted(a.state for a in list_actors())
        if states == ["DEAD", "DEAD"]:
            break
        time.sleep(0.1)
    print(json.dumps({"states": states, "pids": pids}), flush=True)
    ray.shutdown()
    """, timeout=120)
    assert doc["states"] == ["DEAD", "DEAD"], doc
    assert wait_until(lambda: _no_member_leases(hosts), 30.0)
