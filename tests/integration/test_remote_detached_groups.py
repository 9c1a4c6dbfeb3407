"""Detached placement groups across nodes on fake hosts (docs/detached-placement-groups.md):
the node's actor service holds the group, its bundles on other nodes, and the named and
detached actors in them; the group outlives its driver, any driver of the node finds,
uses and removes it, the head stopping releases it on every node, and a member dying has
its bundle placed again with the actors in it restarted.

A head on 127.0.0.1 and members on 127.0.0.2 (and .3), each with its own root (``FakeHosts``
of test_cluster_join.py: every process, session, segment and lease of each root is checked
on teardown); drivers run on the head's host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

from .helpers import cli, driver, go_on, json_line, ledger_leases, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_placement import _cluster
from .test_remote_placement_groups import PG, _join_late
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver

WHERE = """
    @ray.remote(num_cpus=1)
    class Where:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]
    """


# The end of a driver script holding a pending group ``pg``: it waits for the group to be
# placed, removes it, and prints what it saw.
READY_LATER = """
    later = pg.wait(30)
    ready = ray.get(pg.ready(), timeout=10) is not None
    nodes = sorted(placement_group_table(pg)["bundles_to_node_id"].values())
    remove_placement_group(pg)
    print(json.dumps({"later": later, "ready": ready, "nodes": nodes}), flush=True)
    ray.shutdown()
    """


def _member_group_leases(hosts, ip: str = MEMBER) -> list:
    return [lease for lease in ledger_leases(hosts.env(ip)).values()
            if "placement group" in (lease.get("tag") or "")]


def _head_groups(hosts) -> list:
    return [lease for lease in ledger_leases(hosts.env("127.0.0.1")).values()
            if lease.get("group")]


def _no_group_left(hosts) -> None:
    """Every node's part of the test's groups is released (the member's and the head's)."""
    assert wait_until(lambda: not _member_group_leases(hosts), 30.0)
    assert wait_until(lambda: not _head_groups(hosts), 30.0)


def _let_the_creator_end(creator) -> None:
    """The creating driver, waiting on its stdin, is told to go on, and ends cleanly."""
    creator.stdin.write("\n")
    creator.stdin.flush()
    assert creator.wait(30) == 0


def _stop_both(creator, other) -> None:
    """The creating driver and the other one (None: not started yet) are stopped."""
    stop_driver(creator)
    if other is not None:
        stop_driver(other)


def _create_detached(hosts, name: str, *, max_restarts: int = 0, cpus: int = 1,
                     keeper: bool = True) -> dict:
    """A driver that creates detached STRICT_SPREAD group ``name`` (one CPU on the head,
    ``cpus`` on a member) and a detached actor ``keeper`` in bundle 1, then exits."""
    return _run_driver(hosts, PG + WHERE + f"""
    pg = placement_group([{{"CPU": 1}}, {{"CPU": {cpus}}}], strategy="STRICT_SPREAD",
                         name={name!r}, lifetime="detached")
    ready = pg.wait(20)
    table = placement_group_table(pg)
    kept = None
    if {keeper!r}:
        keeper = Where.options(
            name="keeper", namespace="kept", lifetime="detached", max_restarts={max_restarts},
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 1)).remote()
        kept = ray.get(keeper.ip.remote(), timeout=30)
    print(json.dumps({{"ready": ready, "here": here, "member": member,
                      "state": table["state"], "nodes": table["bundles_to_node_id"],
                      "keeper": kept}}), flush=True)
    ray.shutdown()
    """)


def test_a_detached_group_spans_nodes_outlives_its_driver_and_any_driver_removes_it(hosts):
    _cluster(hosts, "2", "2")
    doc = _create_detached(hosts, "dg")
    assert doc["ready"] is True and doc["state"] == "CREATED", doc
    assert doc["nodes"] == {"0": doc["here"], "1": doc["member"]}, doc
    assert doc["keeper"] == MEMBER, doc  # the detached actor runs in the member's bundle
    # The driver is gone: the group and its bundle on the member stay.
    (lease,) = _member_group_leases(hosts)
    assert "placement group dg bundle 1" in lease["tag"], lease
    assert len(_head_groups(hosts)) == 1
    other = _run_driver(hosts, PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("dg")
    nodes = placement_group_table(pg)["bundles_to_node_id"]
    keeper = ray.get_actor("keeper", namespace="kept")
    kept = ray.get(keeper.ip.remote(), timeout=30)

    def run(index):
        try:
            return ray.get(in_bundle(pg, index).remote(), timeout=20)[0]
        except Exception as error:
            return [type(error).__name__, str(error)]

    # The keeper holds the member bundle's one CPU: a task there waits for it.
    waiting = in_bundle(pg, 1).remote()
    ready, _ = ray.wait([waiting], timeout=1.5)
    waited = not ready
    ray.kill(keeper)
    head_task, member_task = run(0), run(1)
    after_kill = ray.get(waiting, timeout=20)[0]
    # A named actor of this driver in the member's bundle: the service runs it there too.

    @ray.remote(num_cpus=1)
    class Named:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    named = Named.options(name="named", scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    named_ip = ray.get(named.ip.remote(), timeout=30)
    remove_placement_group(pg)
    after = alive_or_error(named.ip.remote())
    print(json.dumps({"nodes": nodes, "kept": kept, "head_task": head_task,
                      "member_task": member_task, "named": named_ip, "after": after,
                      "waited": waited, "after_kill": after_kill,
                      "here": here, "member": member}), flush=True)
    ray.shutdown()
    """)
    assert other["nodes"] == {"0": other["here"], "1": other["member"]}, other
    assert other["kept"] == MEMBER, other
    assert other["head_task"] == "127.0.0.1", other  # the head's bundle: the node's ledger
    assert other["member_task"] == MEMBER, other  # room lent by the service
    assert other["waited"] is True and other["after_kill"] == MEMBER, other
    assert other["named"] == MEMBER, other
    assert other["after"] == "ActorDiedError", other
    _no_group_left(hosts)


def test_a_detached_groups_name_is_the_clusters_and_the_head_stopping_releases_it(hosts):
    _cluster(hosts, "2", "2")
    doc = _create_detached(hosts, "once")
    assert doc["ready"] is True, doc
    again = _run_driver(hosts, PG + """
    try:
        placement_group([{"CPU": 1}], name="once", lifetime="detached")
        taken = "created"
    except Exception as error:
        taken = [type(error).__name__, str(error)]
    print(json.dumps({"taken": taken}), flush=True)
    ray.shutdown()
    """)
    assert again["taken"][0] == "RaySystemError" and "already exists" in again["taken"][1], again
    assert len(_member_group_leases(hosts)) == 1
    stopped = cli(hosts.env("127.0.0.1"), "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert wait_until(lambda: not _member_group_leases(hosts), 30.0)


def test_a_detached_groups_bundle_whose_member_dies_is_placed_again_with_its_actor(hosts):
    _cluster(hosts, "2", "2")
    other = "127.0.0.3"
    hosts.join_alive(other, hosts.record("127.0.0.1").address, "--num-cpus", "2")
    doc = _create_detached(hosts, "moves", max_restarts=1, cpus=2)
    victim = doc["keeper"]
    assert victim in (MEMBER, other), doc
    survivor = other if victim == MEMBER else MEMBER
    proc = driver(PRELUDE.replace('"127.0.0.2" and n["Alive"]', '"127.0.0.1"') + PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("moves")
    first = placement_group_table(pg)["bundles_to_node_id"][1]
    # A task of this driver in the member's bundle (room lent by the service), running when
    # its node dies: retried (max_retries=1) in the bundle's new place.
    long = ip_of.options(max_retries=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote(10.0)  # long enough to be running yet when a loaded runner kills it
    time.sleep(1.5)
    print(json.dumps({"started": True}), flush=True)
    sys.stdin.readline()  # the test kills bundle 1's node now
    states, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 20:
        table = placement_group_table(pg)
        states.append(table["state"])
        if table["state"] == "CREATED" and table["bundles_to_node_id"][1] not in ("", first):
            break
        time.sleep(0.05)
    took = time.monotonic() - t0
    ray_nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    moved_to = ray_nodes.get(table["bundles_to_node_id"][1])
    keeper = ray.get_actor("keeper", namespace="kept")
    restarted = ray.get(keeper.ip.remote(), timeout=30)
    retried = ray.get(long, timeout=30)[0]
    remove_placement_group(pg)
    print(json.dumps({"states": sorted(set(states)), "moved_to": moved_to,
                      "restarted": restarted, "retried": retried, "took": took}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        assert json_line(proc, 30) == {"started": True}
        os.kill(hosts.record(victim).pid, signal.SIGKILL)
        moved = go_on(proc, 60)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert moved["moved_to"] == survivor, moved
    assert moved["restarted"] == survivor, moved
    assert moved["retried"] == survivor, moved  # the borrowed task, retried there
    assert wait_until(lambda: not _member_group_leases(hosts, survivor), 30.0)
    assert wait_until(lambda: not _head_groups(hosts), 30.0)
    print(f"\ndetached bundle placed again {moved['took']:.2f} s after its driver looked")


def test_tasks_of_any_driver_borrow_room_in_a_members_bundle_and_give_it_back(hosts):
    """Every exit path of a loan (result, failure, cancel, removal, the driver's exit)
    gives the member bundle's one CPU back: the next task there runs at once. An actor
    without a name there is the service's, and dies with the group."""
    _cluster(hosts, "2", "2")
    assert _create_detached(hosts, "lend", keeper=False)["ready"] is True
    first = _run_driver(hosts, PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("lend")

    @ray.remote(num_cpus=1)
    def fails():
        raise ValueError("no")

    def quick():
        t0 = time.monotonic()
        ip = ray.get(in_bundle(pg, 1).remote(), timeout=20)[0]
        return ip, time.monotonic() - t0

    result = quick()
    try:
        ray.get(fails.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote(), timeout=20)
        failed = "returned"
    except Exception as error:
        failed = type(error).__name__
    after_failure = quick()
    long = in_bundle(pg, 1).remote(30.0)
    time.sleep(1.0)
    queued = in_bundle(pg, 1).remote()  # waits for the one CPU
    ray.cancel(queued)
    ray.cancel(long, force=True)
    cancelled = []
    for ref in (long, queued):
        try:
            ray.get(ref, timeout=20)
            cancelled.append("returned")
        except Exception as error:
            cancelled.append(type(error).__name__)
    after_cancel = quick()
    in_flight = in_bundle(pg, 1).remote(30.0)  # running when this driver exits
    time.sleep(1.0)
    print(json.dumps({"result": result, "failed": failed, "after_failure": after_failure,
                      "cancelled": cancelled, "after_cancel": after_cancel}), flush=True)
    ray.shutdown()
    """)
    assert first["result"][0] == MEMBER, first
    assert first["failed"] == "RayTaskError(ValueError)" or "ValueError" in first["failed"], first
    # "At once": far short of the 30 s tasks a CPU not given back would wait for (a new
    # worker may have to start on a loaded runner, so not within a few seconds)
    assert first["after_failure"][0] == MEMBER and first["after_failure"][1] < 15.0, first
    assert first["cancelled"] == ["TaskCancelledError", "TaskCancelledError"], first
    assert first["after_cancel"][0] == MEMBER and first["after_cancel"][1] < 15.0, first
    second = _run_driver(hosts, PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("lend")
    t0 = time.monotonic()
    after_exit = ray.get(in_bundle(pg, 1).remote(), timeout=20)[0]
    after_exit_s = time.monotonic() - t0
    timings = {}
    own = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert own.wait(20)
    # The head's bundle (the node's ledger), the member's (a loan), and for comparison
    # the member's bundle of this driver's own group (its lease, no loan).
    for what, group, index in (("here", pg, 0), ("lent", pg, 1), ("own", own, 1)):
        ray.get(in_bundle(group, index).remote(), timeout=20)
        t0 = time.monotonic()
        for _ in range(20):
            ray.get(in_bundle(group, index).remote(), timeout=20)
        timings[what] = (time.monotonic() - t0) / 20 * 1000
    remove_placement_group(own)

    @ray.remote(num_cpus=0)
    class Anonymous:  # no name: the service runs it in the member's bundle all the same
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    anonymous = Anonymous.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    anonymous_ip = ray.get(anonymous.ip.remote(), timeout=30)
    removed, removed_s = removed_under(pg, 1)
    anonymous_after = alive_or_error(anonymous.ip.remote())
    print(json.dumps({"after_exit": after_exit, "after_exit_s": after_exit_s,
                      "removed": removed, "removed_s": removed_s,
                      "anonymous": anonymous_ip, "anonymous_after": anonymous_after,
                      "timings": timings}),
          flush=True)
    ray.shutdown()
    """)
    assert second["after_exit"] == MEMBER and second["after_exit_s"] < 15.0, second
    assert second["removed"] == "TaskPlacementGroupRemoved", second
    assert second["removed_s"] < 15.0, second  # not the task's 30 s
    assert second["anonymous"] == MEMBER, second
    assert second["anonymous_after"] == "ActorDiedError", second
    ms = second["timings"]
    print(f"\na task in a detached group's bundle, one after another: {ms['here']:.1f} ms "
          f"on the head, {ms['lent']:.1f} ms on the member (room lent by the service); "
          f"{ms['own']:.1f} ms in the member's bundle of the driver's own group")
    _no_group_left(hosts)


def test_a_pending_detached_group_is_ready_in_its_driver_once_a_member_joins(hosts):
    _cluster(hosts, "2", None)
    proc = driver("""
    import json
    import miniray as ray
    from miniray.util.placement_group import (placement_group, placement_group_table,
                                              remove_placement_group)
    ray.init(address="auto")
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD",
                         lifetime="detached")
    print(json.dumps({"early": pg.wait(1.0),
                      "state": placement_group_table(pg)["state"]}), flush=True)
    """ + READY_LATER, hosts.env("127.0.0.1"))
    try:
        doc = json_line(proc, 30)
        assert doc == {"early": False, "state": "PENDING"}, doc
        _join_late(hosts)
        doc = json_line(proc, 40)
        assert doc["later"] is True and doc["ready"] is True, doc
        assert len(set(doc["nodes"])) == 2, doc
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert wait_until(lambda: not _member_group_leases(hosts), 30.0)


def test_another_driver_finds_a_pending_detached_group_by_name_and_its_ready_waits(hosts):
    """Ray finds a pending group by name and ``ready()`` waits: another driver's
    ``get_placement_group(name)`` finds the group the service holds pending; it is
    reserved once a member joins, and that driver's wait, ready() and removal work."""
    _cluster(hosts, "2", None)
    creator = driver("""
    import json, sys
    import miniray as ray
    from miniray.util.placement_group import placement_group
    ray.init(address="auto")
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD",
                         name="late", lifetime="detached")
    print(json.dumps({"early": pg.wait(0.5)}), flush=True)
    sys.stdin.readline()
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    other = None
    try:
        assert json_line(creator, 30) == {"early": False}
        other = driver("""
    import json
    import miniray as ray
    from miniray.util.placement_group import (get_placement_group, placement_group_table,
                                              remove_placement_group)
    from miniray.util.state import list_placement_groups
    ray.init(address="auto")
    pg = get_placement_group("late")
    rows = list_placement_groups(filters=[("name", "=", "late")])
    print(json.dumps({"early": pg.wait(0.5), "state": placement_group_table(pg)["state"],
                      "bundles": pg.bundle_specs, "rows": [r["state"] for r in rows]}),
          flush=True)
    """ + READY_LATER, hosts.env("127.0.0.1"))
        doc = json_line(other, 30)
        assert doc == {"early": False, "state": "PENDING",
                       "bundles": [{"CPU": 1.0}, {"CPU": 1.0}], "rows": ["PENDING"]}, doc
        _join_late(hosts)
        doc = json_line(other, 40)
        assert doc["later"] is True and doc["ready"] is True, doc
        assert len(set(doc["nodes"])) == 2, doc
        assert other.wait(30) == 0
        _let_the_creator_end(creator)
    finally:
        _stop_both(creator, other)
    _no_group_left(hosts)


def test_a_pending_detached_groups_handle_in_another_driver_places_an_actor_and_removes(hosts):
    """Handles of two pending detached groups passed to another driver (pickled): its
    actor without a name in one is the service's, placed on the member once it joins;
    its removal of the other ends that group in the driver that created it too."""
    _cluster(hosts, "2", None)
    creator = driver("""
    import base64, json, pickle, sys, time
    import miniray as ray
    from miniray.util.placement_group import placement_group, remove_placement_group
    ray.init(address="auto")
    later = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD",
                            lifetime="detached")
    never = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD", lifetime="detached")
    print(json.dumps({k: base64.b64encode(pickle.dumps(g)).decode()
                      for k, g in (("later", later), ("never", never))}), flush=True)
    sys.stdin.readline()  # the other driver removed `never`
    t0, seen = time.monotonic(), "pending"
    while time.monotonic() - t0 < 15:
        try:
            never.wait(0.2)
        except Exception as error:
            seen = str(error)
            break
    print(json.dumps({"never": seen, "took": time.monotonic() - t0}), flush=True)
    sys.stdin.readline()
    remove_placement_group(later)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    other = None
    try:
        handles = json_line(creator, 30)
        other = driver(f"""
    import base64, json, pickle
    import miniray as ray
    from miniray.util.placement_group import remove_placement_group
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")
    later = pickle.loads(base64.b64decode({handles["later"]!r}))
    never = pickle.loads(base64.b64decode({handles["never"]!r}))
    remove_placement_group(never)

    @ray.remote(num_cpus=1)
    class Where:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    where = Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        later, 1)).remote()
    print(json.dumps({{"removed": True}}), flush=True)
    node = ray.get(where.node.remote(), timeout=60)
    print(json.dumps({{"ip": {{n["NodeID"]: n["NodeManagerAddress"]
                               for n in ray.nodes()}}.get(node)}}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"))
        assert json_line(other, 30) == {"removed": True}
        seen = go_on(creator, 30)
        assert "does not exist" in seen["never"] and seen["took"] < 5.0, seen
        print(f"\na pending detached group removed by another driver: its creator saw it "
              f"{seen['took']:.2f} s later")
        _join_late(hosts)
        assert json_line(other, 60) == {"ip": MEMBER}
        assert other.wait(30) == 0
        _let_the_creator_end(creator)
    finally:
        _stop_both(creator, other)
    _no_group_left(hosts)


def test_an_actor_in_a_detached_groups_member_bundle_by_a_handle_got_by_id_runs_there(hosts):
    """A driver that got the group's handle neither by creating it nor by name (built from
    its id, as one passed in an argument is): its actor without a name in the member's
    bundle is the service's and runs there (it stayed pending in the driver), and so is
    one that its task in the head's bundle creates (a worker's request)."""
    _cluster(hosts, "2", "2")
    assert _create_detached(hosts, "byid", keeper=False)["ready"] is True
    doc = _run_driver(hosts, PG + WHERE + """
    from miniray.util.placement_group import PlacementGroup
    (group_id, entry), = placement_group_table().items()
    pg = PlacementGroup(ray.PlacementGroupID.from_hex(group_id), None)

    @ray.remote(num_cpus=1)
    def make(pg):  # a task in the head's bundle creates the actor (a worker's request)
        made = Where.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote()
        return ray.get(made.ip.remote(), timeout=30)

    from_task = ray.get(make.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 0)).remote(pg), timeout=40)
    where = Where.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    print(json.dumps({"ip": ray.get(where.ip.remote(), timeout=30), "from_task": from_task}),
          flush=True)
    remove_placement_group(pg)
    ray.shutdown()
    """)
    assert doc["ip"] == MEMBER and doc["from_task"] == MEMBER, doc
    _no_group_left(hosts)


def test_an_actor_in_a_pending_detached_group_another_driver_removed_stays_in_its_driver(
        hosts):
    """A driver that noted a pending detached group (its handle passed to it) as the
    service's sent every later actor in it to the service after another driver removed
    it. Now it asks the service again (at most every STATE_ASK_S): the group gone, a later
    actor stays in the driver and ends as in a removed group: neither ever started, so
    both raise ActorUnschedulableError naming the removal (Ray 2.60's error for an actor
    pending when its group is removed)."""
    _cluster(hosts, "2", None)
    creator = driver("""
    import base64, json, pickle, sys
    import miniray as ray
    from miniray.util.placement_group import placement_group, remove_placement_group
    ray.init(address="auto")
    never = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD", lifetime="detached")
    print(json.dumps({"never": base64.b64encode(pickle.dumps(never)).decode()}), flush=True)
    sys.stdin.readline()
    remove_placement_group(never)
    print(json.dumps({"removed": True}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    other = None
    try:
        handle = json_line(creator, 30)["never"]
        other = driver(f"""
    import base64, json, pickle, sys, time
    import miniray as ray
    from miniray._private import runtime
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")
    never = pickle.loads(base64.b64decode({handle!r}))
    strategy = PlacementGroupSchedulingStrategy(never, 0)

    @ray.remote(num_cpus=1)
    class Where:
        def node(self):
            return 1

    first = Where.options(scheduling_strategy=strategy).remote()  # noted: the service's
    print(json.dumps({{"first": True}}), flush=True)
    sys.stdin.readline()  # removed by its creator
    time.sleep(1.2)  # past STATE_ASK_S
    second = Where.options(scheduling_strategy=strategy).remote()
    out = {{}}
    for name, actor in (("first", first), ("second", second)):
        try:
            out[name] = repr(ray.get(actor.node.remote(), timeout=20))
        except Exception as error:
            out[name] = type(error).__name__ + ": " + str(error)
    actors = runtime.current().owner.actors.actors
    out["in_service"] = [actors[a._actor_id].remote for a in (first, second)]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
        assert json_line(other, 30) == {"first": True}
        assert go_on(creator, 30) == {"removed": True}
        seen = go_on(other, 60)
        assert seen["in_service"] == [True, False], seen
        for name in ("first", "second"):
            assert seen[name].startswith("ActorUnschedulableError"), seen
            assert "placement group was removed" in seen[name], seen
        assert other.wait(30) == 0
        assert creator.wait(30) == 0
    finally:
        _stop_both(creator, other)
    assert wait_until(lambda: not _head_groups(hosts), 30.0)  # (no member here)


def test_a_member_drivers_detached_group_is_the_clusters_and_outlives_it(hosts):
    """A driver on the member's host creates a detached group (as in Ray, it is the
    cluster's, whatever host its driver runs on): the head's actor service holds it across
    the head and the member; the creator's ready(), wait(), table and lookup by name work,
    and its tasks and named actors run in both bundles (the member's own bundle with room
    lent by the service). It outlives its creator; a driver on the head finds it by name,
    lists it, runs tasks in it and removes it: every node's part is back."""
    _cluster(hosts, "2", "2")
    creator = driver(PRELUDE + PG + WHERE + """
    from miniray.util.placement_group import get_placement_group
    head = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.1")
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="mg",
                         lifetime="detached")
    ready = pg.wait(30)
    got = ray.get(pg.ready(), timeout=10) is not None
    table = placement_group_table(pg)
    found = get_placement_group("mg").id.hex() == pg.id.hex()
    tasks = [ray.get(in_bundle(pg, i).remote(), timeout=30)[0] for i in (0, 1)]
    timings = []  # one task after another in each bundle: what a round trip to H costs
    for i in (0, 1):
        t0 = time.monotonic()
        for _ in range(20):
            ray.get(in_bundle(pg, i).remote(), timeout=20)
        timings.append((time.monotonic() - t0) / 20 * 1000)
    named = [Where.options(name=f"w{i}", scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, i)).remote() for i in (0, 1)]
    actors = [ray.get(a.ip.remote(), timeout=30) for a in named]
    print(json.dumps({"ready": ready, "got": got, "state": table["state"],
                      "nodes": table["bundles_to_node_id"], "head": head, "member": member,
                      "found": found, "tasks": tasks, "actors": actors,
                      "timings": timings}), flush=True)
    sys.stdin.readline()
    ray.shutdown()
    """, hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        doc = json_line(creator, 90)
        _let_the_creator_end(creator)
    finally:
        stop_driver(creator)
    assert doc["ready"] is True and doc["got"] is True and doc["state"] == "CREATED", doc
    assert doc["nodes"] == {"0": doc["head"], "1": doc["member"]}, doc
    assert doc["found"] is True, doc
    assert doc["tasks"] == ["127.0.0.1", MEMBER], doc
    assert doc["actors"] == ["127.0.0.1", MEMBER], doc
    print(f"\na member driver's task in the head's detached group, one after another: "
          f"{doc['timings'][0]:.1f} ms in the head's bundle (a lease there), "
          f"{doc['timings'][1]:.1f} ms in the member's own bundle (a loan)")
    # Its creator is gone: the group stays, held by the head's actor service.
    assert len(_head_groups(hosts)) == 1
    (lease,) = _member_group_leases(hosts)
    assert "placement group mg bundle 1" in lease["tag"], lease
    other = _run_driver(hosts, PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("mg")
    listed = [e["name"] for e in placement_group_table().values()]
    tasks = [ray.get(in_bundle(pg, i).remote(), timeout=30)[0] for i in (0, 1)]
    remove_placement_group(pg)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"listed": listed, "tasks": tasks,
                      "cpus": ray.available_resources().get("CPU", 0)}), flush=True)
    ray.shutdown()
    """)
    assert other["listed"] == ["mg"], other
    assert other["tasks"] == ["127.0.0.1", MEMBER], other
    assert other["cpus"] == 4, other
    _no_group_left(hosts)


def test_a_member_driver_finds_uses_and_removes_a_head_drivers_detached_group(hosts):
    """A driver on the member's host finds by name a detached group a head driver created
    (it reads the head's actor service's records: its own node's ledger does not hold
    it), lists it, runs a task in each bundle and an actor without a name in the member's
    bundle (the service's), and removes it: every node's part is back. With the member's
    bundle busy, a task for any bundle runs in the head's; so does one of a detached group
    entirely on the head. The state API and ``miniray list placement-groups`` list every
    group of the cluster from either host, the same rows: the member driver's own
    (reserved, and pending) on the head's host, the head's service's (reserved, and
    pending) on the member's."""
    _cluster(hosts, "2", "2")
    assert _create_detached(hosts, "hg", keeper=False)["ready"] is True
    proc = driver(PRELUDE + PG + WHERE + """
    from miniray.util.placement_group import get_placement_group
    from miniray.util.state import get_placement_group as state_group
    from miniray.util.state import list_placement_groups
    pg = get_placement_group("hg")
    table = placement_group_table()
    listed = [e["name"] for e in table.values()]
    ready = pg.wait(10)
    tasks = [ray.get(in_bundle(pg, i).remote(), timeout=30)[0] for i in (0, 1)]
    anonymous = Where.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    anonymous_ip = ray.get(anonymous.ip.remote(), timeout=30)
    import shutil, tempfile
    folder = tempfile.mkdtemp(prefix="mr-member-groups-")

    @ray.remote(num_cpus=1)
    def hold(folder, mark):
        open(os.path.join(folder, mark), "w").close()
        time.sleep(30)

    def held(index, mark):  # a task holding bundle index's CPU, once it started
        ref = hold.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, index)).remote(folder, mark)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(folder, mark)) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        return ref

    def ip_or_error(ref):
        try:
            return ray.get(ref, timeout=20)[0]
        except Exception as error:
            return type(error).__name__

    busy = held(1, "busy")  # the member's bundle is full
    anywhere = ip_or_error(in_bundle(pg, -1).remote())  # the head's bundle has room
    long = held(0, "long")  # on the head, under a lease there
    whole = placement_group([{"CPU": 1}], name="whole", lifetime="detached")
    whole_ready = whole.wait(20)  # the head's service places it on the head
    whole_any = ip_or_error(in_bundle(whole, -1).remote())
    rows = {r["name"]: r for r in list_placement_groups(detail=True)}
    state = {name: [r["state"], [b["node_id"] for b in r["bundles"]]]
             for name, r in rows.items()}
    got = state_group(whole.id.hex())
    got = None if got is None else [got["name"], got["state"]]
    shutil.rmtree(folder)
    remove_placement_group(pg)  # ends both: their workers are killed
    after = alive_or_error(anonymous.ip.remote())
    ended = [ip_or_error(ref) for ref in (long, busy)]
    # For the listings from both hosts: a group of this driver (in the member's ledger),
    # one it waits for, and a detached one the head's service waits for.
    mine = placement_group([{"CPU": 1}], name="mine")
    mine_nodes = list(placement_group_table(mine)["bundles_to_node_id"].values()) \
        if mine.wait(20) else None
    wants = placement_group([{"CPU": 64}], name="wants")
    huge = placement_group([{"CPU": 64}], name="huge", lifetime="detached")
    print(json.dumps({"listed": listed, "ready": ready, "tasks": tasks,
                      "anonymous": anonymous_ip, "after": after, "ended": ended,
                      "anywhere": anywhere, "whole_ready": whole_ready,
                      "whole_any": whole_any, "state": state, "got": got,
                      "mine": mine_nodes, "pending": [wants.wait(0.1), huge.wait(0.1)],
                      "head": next(n for n, ip in ips.items() if ip == "127.0.0.1"),
                      "member": member}), flush=True)
    sys.stdin.readline()  # the test lists the groups from both hosts' CLI meanwhile
    for group in (whole, mine, wants, huge):
        remove_placement_group(group)
    ray.shutdown()
    """, hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc, 120)
        listed = [cli(hosts.env(ip), "list", "placement-groups", "--format", "json",
                      "--detail") for ip in (MEMBER, "127.0.0.1")]
        _let_the_creator_end(proc)
    finally:
        stop_driver(proc)
    assert doc["listed"] == ["hg"] and doc["ready"] is True, doc
    assert doc["tasks"] == ["127.0.0.1", MEMBER], doc
    assert doc["anonymous"] == MEMBER, doc
    assert doc["after"] == "ActorDiedError", doc
    assert doc["ended"] == ["TaskPlacementGroupRemoved"] * 2, doc
    assert doc["anywhere"] == "127.0.0.1", doc  # any bundle: the one with room, the head's
    assert doc["whole_ready"] is True and doc["whole_any"] == "127.0.0.1", doc
    head, member = doc["head"], doc["member"]
    assert doc["state"] == {"hg": ["CREATED", [head, member]],
                            "whole": ["CREATED", [head]]}, doc
    assert doc["got"] == ["whole", "CREATED"], doc
    assert doc["pending"] == [False, False], doc
    assert [r.returncode for r in listed] == [0, 0], [r.stderr for r in listed]
    on_member, on_head = (json.loads(r.stdout) for r in listed)
    # Every group of the cluster from either host, as in Ray: the head's pending one on
    # the member's, the member driver's own (reserved, pending) on the head's.
    assert {r["name"]: [r["state"], [b["node_id"] for b in r["bundles"]]]
            for r in on_member} == {"whole": ["CREATED", [head]],
                                    "mine": ["CREATED", doc["mine"]],
                                    "wants": ["PENDING", [None]],
                                    "huge": ["PENDING", [None]]}, on_member
    for row in on_member + on_head:  # a pending group's attempts go on between the two
        if row["state"] == "PENDING":
            row["stats"].pop("scheduling_attempt")
    assert on_member == on_head  # the same rows, every field, in the same order
    _no_group_left(hosts)
