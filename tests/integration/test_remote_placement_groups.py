"""Placement groups across nodes on fake hosts (``owner/remote_bundles.py``,
``node_pick.plan_bundles``): bundles on the head and on a member, tasks in a member's
bundle, removal, and a group that no node set can hold.

A head on 127.0.0.1 and a member on 127.0.0.2, each with its own root (``FakeHosts`` of
test_cluster_join.py: every process, session and segment of each root is checked on
teardown); the driver runs on the head's host (``_run_driver`` of test_remote_tasks.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from .helpers import cli, driver, go_on, json_line, ledger_leases, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_placement import _cluster
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver

THIRD = "127.0.0.3"  # a driver's host that joins late, with no bundle of the groups

PG = """
    from miniray.util.placement_group import (placement_group, placement_group_table,
                                              remove_placement_group)
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}

    @ray.remote(num_cpus=1)
    def ip_of(seconds=0.0):  # its node's IP (util.get_node_ip_address says 127.0.0.1)
        time.sleep(seconds)
        return ips[ray.get_runtime_context().get_node_id()], time.monotonic()

    def in_bundle(pg, index):
        return ip_of.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index))

    here = ray.get_runtime_context().get_node_id()

    def meet(folder, count):
        # This task's mark in folder, then True once count tasks have left theirs: they ran
        # side by side (one after the other, the first would wait in vain: False).
        import tempfile
        os.close(tempfile.mkstemp(dir=folder)[0])
        deadline = time.monotonic() + 20
        while len(os.listdir(folder)) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(os.listdir(folder)) >= count

    def full():
        return (ray.available_resources().get("CPU", 0), ray.cluster_resources()["CPU"])

    def table_until(pg, done, seconds=20):
        # pg's table polled until done(table) or the time is up; the states seen, the table.
        states, t0 = [], time.monotonic()
        while time.monotonic() - t0 < seconds:
            table = placement_group_table(pg)
            states.append(table["state"])
            if done(table):
                break
            time.sleep(0.05)
        return states, table

    def alive_or_error(ref, timeout=20):
        # "alive" if ref's get returns, else the type of the error it raised
        try:
            ray.get(ref, timeout=timeout)
            return "alive"
        except Exception as error:
            return type(error).__name__

    def removed_under(pg, index):
        # A long task in bundle ``index``, then pg removed: how the task ended, how soon.
        long = in_bundle(pg, index).remote(30.0)
        time.sleep(1.0)
        t0 = time.monotonic()
        remove_placement_group(pg)
        try:
            ray.get(long, timeout=20)
            ended = "finished"
        except Exception as error:
            ended = type(error).__name__
        return ended, time.monotonic() - t0
    """

# Tasks and actors that each take one GPU of a bundle (the driver's ``strategy``).
GPUS = """
    @ray.remote(num_gpus=1)
    class Gpu:
        def ids(self):
            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    @ray.remote(num_gpus=1, num_cpus=0)
    def gpu():
        return ray.get_gpu_ids()
    """


def _group_holder(hosts, bundles: list, name: str):
    """A driver on the head's host holding a STRICT_SPREAD group ``name`` of ``bundles``
    (ready before this returns) until it is stopped."""
    proc = driver(f"""
    import json, time
    import miniray as ray
    from miniray.util.placement_group import placement_group
    ray.init(address="auto")
    pg = placement_group({bundles!r}, strategy="STRICT_SPREAD", name={name!r})
    print(json.dumps({{"ready": pg.wait(20)}}), flush=True)
    time.sleep(120)
    """, hosts.env("127.0.0.1"))
    try:
        assert json_line(proc, 30) == {"ready": True}
    except BaseException:
        stop_driver(proc)
        raise
    return proc


def _gpu_cluster(hosts, gpus: int = 2):
    """A head with no GPU and a member with ``gpus`` (two) and as many CPUs."""
    head = hosts.start_head("--num-cpus", "2", "--num-gpus", "0")
    hosts.join_alive(MEMBER, head, "--num-cpus", str(gpus), "--num-gpus", str(gpus))


def _join_late(hosts, ip: str = MEMBER) -> None:
    """A member with one CPU on ``ip`` joins the running head."""
    joined = hosts.join(ip, hosts.record("127.0.0.1").address, "--num-cpus", "1")
    assert joined.returncode == 0, joined.stderr


def _ends(pid: int) -> bool:
    """Whether process ``pid`` ends within 30 s."""
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    return wait_until(gone, 30.0)


def test_strict_spread_puts_a_bundle_on_each_node_and_tasks_run_there(hosts):
    _cluster(hosts, "2", "2")
    doc = _run_driver(hosts, PG + """
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="ss")
    ready = pg.wait(20)
    table = placement_group_table(pg)
    ips = ray.get([in_bundle(pg, i).remote() for i in range(2)], timeout=30)
    @ray.remote(num_cpus=1)
    def my_group():
        from miniray.util import get_current_placement_group
        return get_current_placement_group().id.hex()

    group_there = ray.get(my_group.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote(), timeout=30)
    # Two 1-CPU tasks in the member's 1-CPU bundle run one after the other.
    pair = ray.get([in_bundle(pg, 1).remote(1.0) for _ in range(2)], timeout=30)
    from miniray.util.state import list_placement_groups
    rows = list_placement_groups(filters=[("name", "=", "ss")], detail=True)
    remove_placement_group(pg)
    print(json.dumps({"here": here, "member": member, "ready": ready, "table": table,
                      "ips": [ip for ip, _ in ips], "pair": pair,
                      "group_there": group_there == pg.id.hex(),
                      "rows": [[b["node_id"] for b in r["bundles"]] for r in rows]}),
          flush=True)
    ray.shutdown()
    """)
    assert doc["ready"] is True, doc
    assert doc["table"]["state"] == "CREATED", doc
    assert doc["table"]["bundles_to_node_id"] == {"0": doc["here"], "1": doc["member"]}, doc
    assert doc["rows"] == [[doc["here"], doc["member"]]], doc
    assert doc["ips"] == ["127.0.0.1", "127.0.0.2"], doc
    assert doc["group_there"] is True, doc  # the task knows its group on the member
    (ip_a, end_a), (ip_b, end_b) = doc["pair"]
    assert ip_a == ip_b == "127.0.0.2", doc
    assert abs(end_a - end_b) >= 0.9, doc  # one after the other in the 1-CPU bundle


def test_spread_and_a_pack_that_does_not_fit_here_use_the_member_and_removal_frees_it(hosts):
    _cluster(hosts, "2", "3")
    doc = _run_driver(hosts, PG + """
    def wait_full(total, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and full() != (total, total):
            time.sleep(0.05)
        return full()

    before = wait_full(5.0)
    spread = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    assert spread.wait(20)
    spread_nodes = placement_group_table(spread)["bundles_to_node_id"]
    spread_ips = [ip for ip, _ in ray.get([in_bundle(spread, i).remote() for i in range(2)],
                                         timeout=30)]
    remove_placement_group(spread)
    wait_full(5.0)  # the member's heartbeat shows its bundle back
    # Any bundle (-1) of a group with bundles on both nodes: this node's first, then the
    # member's when this node's are full (two tasks run at once, one on each: each waits
    # for the other to start, so the first holds this node's bundle meanwhile).
    @ray.remote(num_cpus=1)
    def ip_met(folder):
        met = meet(folder, 2)
        return ips[ray.get_runtime_context().get_node_id()], met

    both = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    assert both.wait(20)
    import shutil, tempfile
    folder = tempfile.mkdtemp()
    anywhere = ray.get([ip_met.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        both, -1)).remote(folder) for _ in range(2)], timeout=60)
    shutil.rmtree(folder)
    remove_placement_group(both)
    wait_full(5.0)
    # Three CPUs in one group: the head has two, the member three.
    pack = placement_group([{"CPU": 1}] * 3, strategy="PACK")
    assert pack.wait(20)
    pack_nodes = placement_group_table(pack)["bundles_to_node_id"]
    # Any bundle (-1) of a group with no bundle here runs in one of the member's.
    anyone = ray.get([in_bundle(pack, -1).remote() for _ in range(4)], timeout=30)
    # A long task in a removed group ends as a local one does: TaskPlacementGroupRemoved.
    ended, took = removed_under(pack, 0)
    after = wait_full(5.0)
    print(json.dumps({"here": here, "member": member, "before": before, "after": after,
                      "spread": spread_nodes, "spread_ips": spread_ips, "pack": pack_nodes,
                      "any": sorted({ip for ip, _ in anyone}), "ended": ended,
                      "anywhere": sorted(ip for ip, _ in anywhere),
                      "anywhere_met": [met for _, met in anywhere],
                      "took": took}), flush=True)
    ray.shutdown()
    """)
    assert doc["before"] == [5.0, 5.0], doc
    assert sorted(doc["spread"].values()) == sorted([doc["here"], doc["member"]]), doc
    assert sorted(doc["spread_ips"]) == ["127.0.0.1", "127.0.0.2"], doc
    assert set(doc["pack"].values()) == {doc["member"]}, doc
    assert doc["any"] == ["127.0.0.2"], doc
    assert doc["anywhere"] == ["127.0.0.1", "127.0.0.2"], doc
    assert doc["anywhere_met"] == [True, True], doc  # at once, not one after the other
    assert doc["ended"] == "TaskPlacementGroupRemoved", doc
    assert doc["took"] < 15.0, doc  # not the task's 30 s (a loaded runner is slow to say so)
    assert doc["after"] == [5.0, 5.0], doc  # every node's part is back


def test_a_group_no_node_set_can_hold_stays_pending_until_a_member_joins(hosts):
    _cluster(hosts, "2", None)
    proc = driver("""
    import json
    import miniray as ray
    from miniray.util.placement_group import placement_group, placement_group_table
    ray.init(address="auto")
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    early = pg.wait(1.0)
    table = placement_group_table(pg)  # as Ray 2.60 shows a group it cannot place
    print(json.dumps({"early": early, "state": table["state"],
                      "where": table["bundles_to_node_id"],
                      "scheduling": table["stats"]["scheduling_state"]}), flush=True)
    later = pg.wait(30)
    nodes = sorted(placement_group_table(pg)["bundles_to_node_id"].values())
    print(json.dumps({"later": later, "nodes": nodes}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"))
    try:
        doc = json_line(proc, 30)
        assert doc == {"early": False, "state": "PENDING", "where": {"0": "", "1": ""},
                       "scheduling": "INFEASIBLE"}, doc
        _join_late(hosts)
        doc = json_line(proc, 30)
        assert doc["later"] is True and len(set(doc["nodes"])) == 2, doc
        assert proc.wait(30) == 0
        assert "stays pending until nodes that can hold it join" in proc.stderr.read()
    finally:
        stop_driver(proc)


def test_a_killed_driver_releases_its_groups_bundles_on_every_node(hosts):
    _cluster(hosts, "2", "2")
    proc = _group_holder(hosts, [{"CPU": 1}, {"CPU": 2}], "held")
    try:
        on_member = [lease for lease in ledger_leases(hosts.env(MEMBER)).values()
                     if "placement group held bundle" in (lease.get("tag") or "")]
        on_head = [lease for lease in ledger_leases(hosts.env("127.0.0.1")).values()
                   if lease.get("group")]
        assert len(on_member) == 1 and len(on_head) == 1, (on_member, on_head)
        # Bundle 1 (2 CPUs) is the member's; bundle 0 (1 CPU) the head's.
        assert on_member[0]["resources"] == {"CPU": 20000}, on_member
        assert on_head[0]["resources"] == {"CPU": 10000}, on_head
        listed = cli(hosts.env("127.0.0.1"), "list", "placement-groups", "--detail",
                     "--format", "json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        member_id = hosts.record(MEMBER).node_id
        head_id = hosts.record("127.0.0.1").node_id
        assert [b["node_id"] for b in row["bundles"]] == [head_id, member_id], row
    finally:
        stop_driver(proc)  # SIGKILL: nothing of the driver's runs after this
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)
    assert wait_until(lambda: not any(lease.get("group") for lease in ledger_leases(
        hosts.env("127.0.0.1")).values()), 30.0)


def test_actors_in_a_members_bundle_run_there_hold_its_room_and_die_with_the_group(hosts):
    _cluster(hosts, "2", "2")
    doc = _run_driver(hosts, PG + """
    @ray.remote(num_cpus=1)
    class Where:
        def node(self):
            from miniray.util import get_current_placement_group
            return ips[ray.get_runtime_context().get_node_id()], \\
                get_current_placement_group().id.hex()

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    strategy = PlacementGroupSchedulingStrategy(pg, 1)
    first = Where.options(scheduling_strategy=strategy).remote()
    where_first = ray.get(first.node.remote(), timeout=30)
    # The bundle's one CPU is the first actor's: a second waits for it.
    second = Where.options(scheduling_strategy=strategy).remote()
    ready, _ = ray.wait([second.node.remote()], timeout=1.5)
    waited = not ready
    ray.kill(first)
    where_second = ray.get(second.node.remote(), timeout=30)
    third = Where.options(scheduling_strategy=strategy).remote()  # waits for second's CPU
    remove_placement_group(pg)
    after = alive_or_error(second.node.remote())
    never = alive_or_error(third.node.remote())  # never started: as in Ray 2.60
    print(json.dumps({"first": where_first, "second": where_second, "waited": waited,
                      "after": after, "never": never, "pg": pg.id.hex()}), flush=True)
    ray.shutdown()
    """)
    assert doc["first"] == ["127.0.0.2", doc["pg"]], doc
    assert doc["waited"] is True, doc
    assert doc["second"] == ["127.0.0.2", doc["pg"]], doc
    assert doc["after"] == "ActorDiedError", doc
    assert doc["never"] == "ActorUnschedulableError", doc


def test_a_removal_by_another_driver_frees_the_members_part_too(hosts):
    """Another driver of the creator's node removes the group, as Ray lets any driver:
    the creator removes it first (asked on its state socket), so the creator's task
    waiting for the member bundle's room fails (TaskPlacementGroupRemoved) instead of
    taking the room the remover's killed task gives back; every node's part is freed."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "shared")
    try:
        assert len(ledger_leases(hosts.env(MEMBER))) == 1
        other = _driver_with("""
        from miniray.util.placement_group import placement_group_table, remove_placement_group
        nodes = sorted(placement_group_table(pg)["bundles_to_node_id"].values())
        running = in_bundle(1).remote("running", 120.0)
        print(json.dumps({"nodes": nodes, "started": marked("running")}), flush=True)
        sys.stdin.readline()  # the creator's own task waits for the bundle's room
        remove_placement_group(pg)
        print(json.dumps({"removed": run(running)}), flush=True)
        ray.shutdown()
        """, hosts, "shared")
        try:
            doc = json_line(other, 60)
            assert len(set(doc["nodes"])) == 2 and doc["started"], doc
            assert _tell(creator, "start shared") == {"ended": False}
            assert go_on(other, 60) == {"removed": "TaskPlacementGroupRemoved"}
            assert other.wait(30) == 0
        finally:
            stop_driver(other)
        assert _tell(creator, "finish") == {"finish": "TaskPlacementGroupRemoved"}
        # The creating driver, still running, released its lease there.
        assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)
        assert creator.poll() is None
    finally:
        stop_driver(creator)


# A driver on the head's host holding STRICT_SPREAD groups of two one-CPU bundles named
# by argv, that answers each line of its stdin: "run NAME" (a task in NAME's bundle on the
# member, 30 s at most: its node's IP), "start NAME" (such a task, not waited for; answers
# whether it ended within 2 s), "finish" (the started task's IP), "remove NAME", "call NAME"
# (actor NAME of namespace "pgs": its ip(), or the error's type), anything else ends it.
HOLDER = """
    import json, sys, time
    import miniray as ray
    from miniray.util.placement_group import placement_group, remove_placement_group
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}

    @ray.remote(num_cpus=1)
    def ip_of():
        return ips[ray.get_runtime_context().get_node_id()]

    groups = {name: placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD",
                                    name=name) for name in sys.argv[1:]}
    print(json.dumps({"ready": all(pg.wait(20) for pg in groups.values())}), flush=True)
    for line in sys.stdin:
        what, _, name = line.strip().partition(" ")
        if what == "run":
            strategy = PlacementGroupSchedulingStrategy(groups[name], 1)
            try:
                answer = ray.get(ip_of.options(scheduling_strategy=strategy).remote(),
                                 timeout=30)
            except Exception as error:
                answer = type(error).__name__
            print(json.dumps({"run": answer}), flush=True)
        elif what == "start":
            strategy = PlacementGroupSchedulingStrategy(groups[name], 1)
            started = ip_of.options(scheduling_strategy=strategy).remote()
            print(json.dumps({"ended": bool(ray.wait([started], timeout=2.0)[0])}),
                  flush=True)
        elif what == "finish":
            try:
                answer = ray.get(started, timeout=30)
            except Exception as error:
                answer = type(error).__name__
            print(json.dumps({"finish": answer}), flush=True)
        elif what == "remove":
            remove_placement_group(groups[name])
            print(json.dumps({"removed": name}), flush=True)
        elif what == "call":
            try:
                answer = ray.get(ray.get_actor(name, namespace="pgs").ip.remote(), timeout=30)
            except Exception as error:
                answer = type(error).__name__
            print(json.dumps({"call": answer}), flush=True)
        else:
            break
    ray.shutdown()
    """

# Another driver of the head's host: the group called argv[1] by name, a task that marks
# its start in a file (``marked``) and sleeps, and run(ref): its value or its error's type.
BORROWER = """
    import json, os, sys, tempfile, time
    import miniray as ray
    from miniray.util.placement_group import get_placement_group
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    if sys.argv[1].startswith("id:"):  # a handle built from the group's id, as one passed
        from miniray.util.placement_group import PlacementGroup, placement_group_table
        pg = PlacementGroup(ray.PlacementGroupID.from_hex(next(
            h for h, e in placement_group_table().items() if e["name"] == sys.argv[1][3:])),
            None)
    else:
        pg = get_placement_group(sys.argv[1])
    marks = tempfile.mkdtemp()

    @ray.remote(num_cpus=1)
    def ip_of(mark="", seconds=0.0):
        if mark:
            open(os.path.join(marks, mark), "w").close()
        time.sleep(seconds)
        return ips[ray.get_runtime_context().get_node_id()]

    def in_bundle(index):
        return ip_of.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index))

    def marked(mark, seconds=30.0):
        deadline = time.monotonic() + seconds
        while not os.path.exists(os.path.join(marks, mark)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def run(ref, timeout=30):
        try:
            return ray.get(ref, timeout=timeout)
        except Exception as error:
            return type(error).__name__
    """


def _driver_with(code: str, hosts, *argv, ip: str = "127.0.0.1") -> subprocess.Popen:
    """A driver program on host ``ip`` (the head's by default), ``BORROWER`` then ``code``
    (each dedented; just ``code`` when it is ``HOLDER``), given ``argv``, its stdin a pipe
    (as ``helpers.driver`` makes one, with arguments)."""
    program = textwrap.dedent(code) if code is HOLDER else \
        textwrap.dedent(BORROWER) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", program, *argv],
                            env=hosts.env(ip), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _holder(hosts, *names, ip: str = "127.0.0.1") -> subprocess.Popen:
    """``HOLDER`` on host ``ip`` holding the groups ``names`` (ready before this returns)."""
    proc = _driver_with(HOLDER, hosts, *names, ip=ip)
    try:
        assert json_line(proc, 40) == {"ready": True}
    except BaseException:
        stop_driver(proc)
        raise
    return proc


def _tell(proc, line: str, timeout: float = 40) -> dict:
    """Send ``line`` to a ``HOLDER``; its answer."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return json_line(proc, timeout)


def test_another_drivers_tasks_run_in_a_bundle_the_creator_holds_on_a_member(hosts):
    """As in Ray, another driver of the creator's node runs tasks in every bundle of the
    group (got by name, or a handle built from its id): on the member, in room the creator
    lends it, one loan per task, given back when the task ends (returns, fails or is
    cancelled: its next task there runs; the creator's own task there runs once it
    exits) or when that driver is killed mid-task."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "theirs")
    try:
        first = _driver_with("""
        @ray.remote(num_cpus=1)
        def fails():
            raise ValueError("no")

        doc = {"here": run(in_bundle(0).remote()), "there": run(in_bundle(1).remote()),
               "any": run(in_bundle(-1).remote())}
        # The bundle's one CPU comes back after a failure and a cancel: the next task runs.
        doc["failed"] = run(fails.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote())
        doc["after_failure"] = run(in_bundle(1).remote())
        long = in_bundle(1).remote("long", 120.0)
        doc["long"] = marked("long")
        ray.cancel(long, force=True)
        doc["cancelled"] = run(long)
        doc["after_cancel"] = run(in_bundle(1).remote())
        print(json.dumps(doc), flush=True)
        ray.shutdown()
        """, hosts, "theirs")
        try:
            doc = json_line(first, 120)
            assert "ValueError" in doc.pop("failed"), doc
            assert doc == {"here": "127.0.0.1", "there": MEMBER, "any": "127.0.0.1",
                           "after_failure": MEMBER, "long": True,
                           "cancelled": "TaskCancelledError", "after_cancel": MEMBER}, doc
            assert first.wait(30) == 0
        finally:
            stop_driver(first)
        # Its task ended: the room is the creator's again.
        assert _tell(creator, "run theirs") == {"run": MEMBER}
        second = _driver_with("""
        print(json.dumps({"there": run(in_bundle(1).remote())}), flush=True)
        late = in_bundle(1).remote("late", 120.0)
        print(json.dumps({"started": marked("late")}), flush=True)
        sys.stdin.readline()  # killed here
        """, hosts, "id:theirs")
        try:
            assert json_line(second, 60) == {"there": MEMBER}
            assert json_line(second, 60) == {"started": True}
            second.kill()  # mid-task: the creator drops its loan
            second.wait(10)
            assert _tell(creator, "run theirs") == {"run": MEMBER}
        finally:
            stop_driver(second)
        assert creator.poll() is None
    finally:
        stop_driver(creator)


def test_another_drivers_tasks_in_a_members_bundle_fail_when_the_group_goes(hosts):
    """Another driver's task running in the creator's bundle on the member, and one
    waiting for its room, both fail with TaskPlacementGroupRemoved when the creator removes
    the group; one waiting in a group whose creator is killed fails so too."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "a", "b")
    try:
        other = _driver_with("""
        from miniray.util.placement_group import get_placement_group
        b = get_placement_group("b")
        running = in_bundle(1).remote("running", 120.0)
        in_b = ip_of.options(scheduling_strategy=PlacementGroupSchedulingStrategy(b, 1))
        b_running = in_b.remote("b_running", 120.0)
        started = marked("running") and marked("b_running")
        waiting = in_bundle(1).remote()
        b_waiting = in_b.remote()
        print(json.dumps({"started": started}), flush=True)
        sys.stdin.readline()  # the creator removed group a
        removed = [run(running), run(waiting)]
        print(json.dumps({"removed": removed}), flush=True)
        sys.stdin.readline()  # the creator was killed
        print(json.dumps({"gone": [run(b_waiting), run(b_running)]}), flush=True)
        ray.shutdown()
        """, hosts, "a")
        try:
            assert json_line(other, 60) == {"started": True}
            assert _tell(creator, "remove a") == {"removed": "a"}
            doc = go_on(other, 60)
            assert doc == {"removed": ["TaskPlacementGroupRemoved"] * 2}, doc
            stop_driver(creator)
            doc = go_on(other, 60)
            assert doc == {"gone": ["TaskPlacementGroupRemoved"] * 2}, doc
            assert other.wait(30) == 0
        finally:
            stop_driver(other)
    finally:
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)


def test_another_drivers_actors_run_in_a_bundle_the_creator_holds_on_a_member(hosts):
    """As in Ray, another driver of the creator's node creates actors (a named one too) in
    the group's bundle on the member: each runs there in room the creator lends it, held
    for the actor's life (the creator's own task there waits until the actor is killed,
    then runs) and given back when that driver exits; the creator's removal of the group
    kills the actor there (its calls raise ActorDiedError)."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "a", "b")
    try:
        other = _driver_with("""
        from miniray.util.placement_group import get_placement_group

        @ray.remote(num_cpus=1)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        def actor_in(group, **options):
            return Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, 1), **options).remote()

        plain = actor_in(pg)
        print(json.dumps({"plain": run(plain.ip.remote())}), flush=True)
        sys.stdin.readline()  # the creator's task in bundle 1 of a waits
        ray.kill(plain)
        print(json.dumps({"killed": run(plain.ip.remote())}), flush=True)
        sys.stdin.readline()  # the creator's task ran
        named = actor_in(pg, name="lent")
        kept = actor_in(get_placement_group("b"))
        print(json.dumps({"named": run(named.ip.remote()), "kept": run(kept.ip.remote())}),
              flush=True)
        sys.stdin.readline()  # the creator removed a
        print(json.dumps({"removed": run(named.ip.remote())}), flush=True)
        sys.stdin.readline()
        ray.shutdown()  # the actor in b ends: its room is the creator's again
        """, hosts, "a")
        try:
            assert json_line(other, 90) == {"plain": MEMBER}
            assert _tell(creator, "start a") == {"ended": False}  # the actor holds the CPU
            doc = go_on(other, 60)
            assert doc == {"killed": "ActorDiedError"}, doc
            assert _tell(creator, "finish") == {"finish": MEMBER}
            doc = go_on(other, 90)
            assert doc == {"named": MEMBER, "kept": MEMBER}, doc
            assert _tell(creator, "remove a") == {"removed": "a"}
            doc = go_on(other, 60)
            assert doc == {"removed": "ActorDiedError"}, doc
            other.stdin.write("\n")
            other.stdin.flush()
            assert other.wait(60) == 0
        finally:
            stop_driver(other)
        assert _tell(creator, "run b") == {"run": MEMBER}
        assert creator.poll() is None
    finally:
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)


def test_another_drivers_actor_of_a_member_lives_in_the_creators_bundle_on_the_head(hosts):
    """Both drivers on the member, whose actor service is the head's (on another host, so
    it cannot read the member's ledger: it asks the member whether the group lives): the
    other driver's actor in the creator's bundle on the head lives there, not ended by the
    service's watch, until the creator removes the group; in a second group, its actor
    and a detached one (whose own driver left) die soon after the creator is killed. A
    driver of a third host runs actors in the creator's bundle on the member itself (the
    head's service leases their room there, from the group's bundle): they hold it (its
    task there waits until one is killed) and die when the creator removes the group."""
    _cluster(hosts, "2", "2")
    # STRICT_SPREAD: bundle 0 here, 1 on the head
    creator = _holder(hosts, "m", "n", ip=MEMBER)
    other = far = None
    try:
        _join_late(hosts, THIRD)
        far = _driver_with("""
        @ray.remote(num_cpus=0.5)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        def in_member(**options):
            return Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, 0), **options).remote()

        named, plain = in_member(name="z"), in_member()  # they fill bundle 0's CPU
        doc = {"named": run(named.ip.remote()), "plain": run(plain.ip.remote())}
        task = ip_of.options(num_cpus=0.5, scheduling_strategy=(
            PlacementGroupSchedulingStrategy(pg, 0))).remote()
        doc["waits"] = not ray.wait([task], timeout=2.0)[0]
        ray.kill(plain)
        doc["after_kill"] = run(task)
        print(json.dumps(doc), flush=True)
        sys.stdin.readline()  # the creator removed the group
        deadline = time.monotonic() + 30
        while (ended := run(named.ip.remote())) == "127.0.0.2" and time.monotonic() < deadline:
            time.sleep(0.05)  # the kill is async
        print(json.dumps({"removed": ended}), flush=True)
        ray.shutdown()
        """, hosts, "m", ip=THIRD)
        doc = json_line(far, 90)
        assert doc == {"named": MEMBER, "plain": MEMBER, "waits": True,
                       "after_kill": MEMBER}, doc
        first = _driver_with("""
        from miniray.util.placement_group import get_placement_group

        @ray.remote(num_cpus=0.5)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        kept = Where.options(name="dn", namespace="pgs", lifetime="detached",
                             scheduling_strategy=PlacementGroupSchedulingStrategy(
                                 get_placement_group("n"), 1)).remote()
        print(json.dumps({"there": run(kept.ip.remote())}), flush=True)
        ray.shutdown()
        """, hosts, "m", ip=MEMBER)
        try:
            assert json_line(first, 90) == {"there": "127.0.0.1"}
            assert first.wait(30) == 0
        finally:
            stop_driver(first)
        assert _tell(creator, "call dn") == {"call": "127.0.0.1"}  # its driver left
        other = _driver_with("""
        from miniray.util.placement_group import get_placement_group

        @ray.remote(num_cpus=1)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        actor = Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote()
        in_n = Where.options(num_cpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
            get_placement_group("n"), 1)).remote()
        first = run(actor.ip.remote())
        time.sleep(2.0)  # four turns of a group watch (0.5 s): the actor must outlive them
        print(json.dumps({"first": first, "later": run(actor.ip.remote()),
                          "in_n": run(in_n.ip.remote())}), flush=True)

        def until_gone(answer):
            deadline = time.monotonic() + 30
            ended = answer()
            while ended == "127.0.0.1" and time.monotonic() < deadline:  # the kill is async
                time.sleep(0.1)
                ended = answer()
            return ended

        def dn_ip():
            try:
                return run(ray.get_actor("dn", namespace="pgs").ip.remote())
            except ValueError:  # its name is free: it is gone
                return "ValueError"

        sys.stdin.readline()  # the creator removed the group
        print(json.dumps({"removed": until_gone(lambda: run(actor.ip.remote()))}), flush=True)
        sys.stdin.readline()  # the creator was killed: group n goes with it
        print(json.dumps({"in_n": until_gone(lambda: run(in_n.ip.remote())),
                          "dn": until_gone(dn_ip)}), flush=True)
        ray.shutdown()
        """, hosts, "m", ip=MEMBER)
        doc = json_line(other, 90)
        assert doc == {"first": "127.0.0.1", "later": "127.0.0.1", "in_n": "127.0.0.1"}, doc
        assert _tell(creator, "remove m") == {"removed": "m"}
        assert go_on(other, 60) == {"removed": "ActorDiedError"}
        assert go_on(far, 60) == {"removed": "ActorDiedError"}
        assert far.wait(30) == 0
        stop_driver(creator)
        doc = go_on(other, 90)
        assert doc["in_n"] == "ActorDiedError" and doc["dn"] in ("ActorDiedError",
                                                                  "ValueError"), doc
        assert other.wait(60) == 0
    finally:
        for driver_ in (other, far):
            if driver_ is not None:
                stop_driver(driver_)
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env("127.0.0.1")), 30.0)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)


def test_another_drivers_actor_in_a_members_bundle_dies_with_the_group_creator(hosts):
    """Another driver's actor (named) in the creator's bundle on the member dies when the
    creator ends (its group goes with it): its calls raise ActorDiedError, and nothing is
    left on the member."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "c")
    other = None
    try:
        other = _driver_with("""
        @ray.remote(num_cpus=1)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        actor = Where.options(name="lent", scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote()
        print(json.dumps({"there": run(actor.ip.remote())}), flush=True)
        sys.stdin.readline()  # the creator was killed: the actor dies soon after
        deadline = time.monotonic() + 30
        while (answer := run(actor.ip.remote())) == "127.0.0.2" and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"gone": answer}), flush=True)
        ray.shutdown()
        """, hosts, "c")
        assert json_line(other, 90) == {"there": MEMBER}
        stop_driver(creator)  # its group goes with it
        doc = go_on(other, 60)
        assert doc == {"gone": "ActorDiedError"}, doc
        assert other.wait(30) == 0
    finally:
        if other is not None:
            stop_driver(other)
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)


def test_another_drivers_detached_actor_in_a_members_bundle_lives_until_the_group_ends(
        hosts):
    """As in Ray, another driver's detached actor in the creator's bundle on the member
    outlives its own driver and dies with the group: its removal (the name is freed), or
    its creator's end. An actor of that driver created while the group is removed does not
    wait for room in vain: it could never be created (ActorUnschedulableError on its calls,
    as Ray 2.60 gives one pending when its group is removed)."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "a", "b")
    other = None
    try:
        first = _driver_with("""
        from miniray.util.placement_group import get_placement_group

        @ray.remote(num_cpus=1)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        kept = [Where.options(name=name, namespace="pgs", lifetime="detached",
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  group, 1)).remote()
                for name, group in (("da", pg), ("db", get_placement_group("b")))]
        print(json.dumps({"there": [run(a.ip.remote()) for a in kept]}), flush=True)
        ray.shutdown()
        """, hosts, "a")
        try:
            assert json_line(first, 90) == {"there": [MEMBER, MEMBER]}
            assert first.wait(30) == 0
        finally:
            stop_driver(first)
        assert _tell(creator, "call da") == {"call": MEMBER}  # its driver left: it lives
        other = _driver_with("""
        import threading

        @ray.remote(num_cpus=1)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        print(json.dumps({"asking": True}), flush=True)
        late = Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 1)).remote()  # "da" holds the bundle's CPU: it waits, then a is removed
        print(json.dumps({"late": run(late.ip.remote())}), flush=True)
        box = {}
        b = get_placement_group("b")  # now: the thread may run after the creator's end

        def create_in_b():  # "db" holds b's CPU there: it waits, then the creator dies
            try:
                box["actor"] = Where.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(b, 1)).remote()
            except Exception as error:
                box["error"] = type(error).__name__

        asking = threading.Thread(target=create_in_b)
        asking.start()
        sys.stdin.readline()  # the creator was killed
        asking.join(60)
        late_b = run(box["actor"].ip.remote()) if "actor" in box else box.get("error")

        def db_ip():
            try:
                return run(ray.get_actor("db", namespace="pgs").ip.remote())
            except ValueError:  # its name is free: it is gone
                return "ValueError"

        deadline = time.monotonic() + 30
        while (answer := db_ip()) == "127.0.0.2" and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"db": answer, "late_b": late_b}), flush=True)
        ray.shutdown()
        """, hosts, "a")
        assert json_line(other, 90) == {"asking": True}
        assert _tell(creator, "remove a") == {"removed": "a"}
        doc = json_line(other, 60)
        assert doc == {"late": "ActorUnschedulableError"}, doc
        assert _tell(creator, "call da") == {"call": "ValueError"}  # dead, its name free
        assert _tell(creator, "call db") == {"call": MEMBER}
        stop_driver(creator)  # group b goes with it, and "db" too
        doc = go_on(other, 90)
        assert doc["db"] in ("ActorDiedError", "ValueError"), doc
        assert doc["late_b"] == "ActorUnschedulableError", doc
        assert other.wait(30) == 0
    finally:
        if other is not None:
            stop_driver(other)
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)


def test_tasks_in_a_members_gpu_bundle_each_see_their_own_gpu(hosts):
    _gpu_cluster(hosts)
    doc = _run_driver(hosts, PG + """
    pg = placement_group([{"GPU": 2, "CPU": 2}])
    assert pg.wait(20)

    @ray.remote(num_gpus=1, num_cpus=1)
    def gpu(folder):
        return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), meet(folder, 2)

    @ray.remote(num_gpus=2, num_cpus=0)
    def both():
        return ray.get_gpu_ids()

    strategy = PlacementGroupSchedulingStrategy(pg, 0)
    import shutil, tempfile
    folder = tempfile.mkdtemp()
    pair = ray.get([gpu.options(scheduling_strategy=strategy).remote(folder)
                    for _ in range(2)], timeout=60)
    shutil.rmtree(folder)
    whole = ray.get(both.options(scheduling_strategy=strategy).remote(), timeout=30)
    nodes = placement_group_table(pg)["bundles_to_node_id"]
    print(json.dumps({"pair": pair, "whole": whole, "nodes": nodes,
                      "member": member}), flush=True)
    ray.shutdown()
    """)
    assert doc["nodes"] == {"0": doc["member"]}, doc
    ids = sorted(ids[0] for ids, _visible, _met in doc["pair"])
    assert ids == [0, 1], doc  # one device each, not both
    assert sorted(visible for _ids, visible, _met in doc["pair"]) == ["0", "1"], doc
    assert [met for _ids, _visible, met in doc["pair"]] == [True, True], doc  # side by side
    assert sorted(doc["whole"]) == [0, 1], doc


def test_actors_in_a_members_gpu_bundle_each_see_their_own_gpu(hosts):
    # Two actors of the group's driver, and one of another driver of its node (in room the
    # driver lends it), each get a device of their own.
    _gpu_cluster(hosts, 3)
    proc = driver(PRELUDE + PG + """
    pg = placement_group([{"GPU": 3, "CPU": 3}], name="gpus")
    assert pg.wait(20)
    strategy = PlacementGroupSchedulingStrategy(pg, 0)
    """ + GPUS + """
    first, second = (Gpu.options(scheduling_strategy=strategy).remote() for _ in range(2))
    pair = ray.get([first.ids.remote(), second.ids.remote()], timeout=30)
    print(json.dumps({"pair": pair}), flush=True)
    sys.stdin.readline()  # another driver's actor took the third device
    # Every device is an actor's: a task waits until one of them leaves.
    ready, _ = ray.wait([gpu.options(scheduling_strategy=strategy).remote()], timeout=1.5)
    waited = not ready
    ray.kill(first)
    freed = ray.get(gpu.options(scheduling_strategy=strategy).remote(), timeout=30)
    print(json.dumps({"waited": waited, "freed": freed}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    other = None
    try:
        pair = json_line(proc, 60)["pair"]
        other = _driver_with(textwrap.dedent(GPUS) + textwrap.dedent("""
        theirs = Gpu.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, 0)).remote()
        print(json.dumps({"theirs": run(theirs.ids.remote())}), flush=True)
        sys.stdin.readline()
        ray.shutdown()
        """), hosts, "gpus")
        theirs = json_line(other, 90)["theirs"]
        doc = go_on(proc, 60)
        other.stdin.write("\n")
        other.stdin.flush()
        assert proc.wait(30) == 0 and other.wait(30) == 0
    finally:
        if other is not None:
            stop_driver(other)
        stop_driver(proc)
    seen = pair + [theirs]
    assert sorted(str(ids[0]) for ids, _visible in seen) == ["0", "1", "2"], seen  # one each
    assert sorted(visible for _ids, visible in seen) == ["0", "1", "2"], seen
    assert doc["waited"] is True, doc
    assert doc["freed"] == pair[0][0], (doc, pair)  # the killed actor's device


def test_a_bundle_whose_member_dies_is_placed_again_on_another_and_its_task_retried(hosts):
    _cluster(hosts, "2", "2")
    other = "127.0.0.3"
    hosts.join_alive(other, hosts.record("127.0.0.1").address, "--num-cpus", "2")
    proc = driver(PRELUDE + PG + """
    import sys
    ray_nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="moves")
    assert pg.wait(20)
    first = placement_group_table(pg)["bundles_to_node_id"]

    @ray.remote
    class Where:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    # An actor in bundle 1 (max_restarts=1): restarted in the bundle's new place.
    mover = Where.options(max_restarts=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    # A named one there (the actor service's, in room this driver lends it): restarted
    # in the bundle's new place too, its restarts then spent.
    named = Where.options(name="follows", max_restarts=1,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 1)).remote()
    ray.get([mover.ip.remote(), named.ip.remote()], timeout=30)
    # A task in bundle 1 that runs when its node dies: retried (max_retries=1) in the
    # bundle's new place.
    long = ip_of.options(max_retries=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote(3.0)
    time.sleep(1.0)
    print(json.dumps({"here": here, "first": first, "ip": ray_nodes[first[1]]}), flush=True)
    sys.stdin.readline()  # the test kills bundle 1's node now
    t0 = time.monotonic()
    states, table = table_until(pg, lambda table: table["state"] == "CREATED"
                                and table["bundles_to_node_id"][1] != first[1])
    moved = table["bundles_to_node_id"]
    took = time.monotonic() - t0
    retried = ray.get(long, timeout=30)[0]
    after = ray.get(in_bundle(pg, 1).remote(), timeout=30)[0]
    restarted = ray.get(mover.ip.remote(), timeout=30)
    named_after = ray.get(named.ip.remote(), timeout=30)
    ray.kill(named, no_restart=False)  # its one restart is spent: it stays dead
    try:
        ray.get(named.ip.remote(), timeout=30)
        named_end = "alive"
    except Exception as error:
        named_end = type(error).__name__
    print(json.dumps({"states": sorted(set(states)), "moved": moved, "took": took,
                      "retried": retried, "after": after, "restarted": restarted,
                      "named": named_after, "named_end": named_end,
                      "new_ip": ray_nodes.get(moved[1])}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc, 30)
        assert doc["first"]["0"] == doc["here"], doc
        victim = doc["ip"]
        assert victim in (MEMBER, other), doc
        survivor = other if victim == MEMBER else MEMBER
        os.kill(hosts.record(victim).pid, signal.SIGKILL)
        doc = go_on(proc, 60)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert "RESCHEDULING" in doc["states"] and doc["states"][-1] != "PENDING", doc
    assert doc["new_ip"] == survivor, doc
    assert doc["moved"]["0"] != doc["moved"]["1"], doc
    assert doc["retried"] == survivor and doc["after"] == survivor, doc
    assert doc["restarted"] == survivor, doc
    assert doc["named"] == survivor and doc["named_end"] == "ActorDiedError", doc
    print(f"\nbundle placed again {doc['took']:.2f} s after its node was killed")


def test_a_lost_bundle_with_no_node_to_go_to_waits_rescheduling_until_one_joins(hosts):
    _cluster(hosts, "2", "2")
    proc = driver(PRELUDE + PG + """
    import sys
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    print(json.dumps({"first": placement_group_table(pg)["bundles_to_node_id"]}), flush=True)
    sys.stdin.readline()  # the member is killed
    _, table = table_until(pg, lambda table: table["state"] == "RESCHEDULING")
    print(json.dumps({"state": table["state"], "where": table["bundles_to_node_id"],
                      "ready": pg.wait(0.1)}), flush=True)
    sys.stdin.readline()  # another member joined
    _, table = table_until(pg, lambda table: table["state"] == "CREATED")
    @ray.remote(num_cpus=1)
    def node_id():
        return ray.get_runtime_context().get_node_id()

    ran = ray.get(node_id.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote(), timeout=30)
    print(json.dumps({"state": table["state"], "where": table["bundles_to_node_id"],
                      "ran": ran}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        first = json_line(proc, 30)["first"]
        head_id = hosts.record("127.0.0.1").node_id
        assert first == {"0": head_id, "1": hosts.record(MEMBER).node_id}, first
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        doc = go_on(proc, 40)
        # As Ray 2.60 shows it: the lost bundle has no node, the other stays.
        assert doc == {"state": "RESCHEDULING", "where": {"0": head_id, "1": ""},
                       "ready": True}, doc
        _join_late(hosts, "127.0.0.3")
        doc = go_on(proc, 40)
        assert doc["state"] == "CREATED", doc
        third = hosts.record("127.0.0.3").node_id
        assert doc["where"] == {"0": head_id, "1": third} and doc["ran"] == third, doc
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)


def test_a_lost_pack_group_comes_back_to_the_drivers_node_with_its_task_and_actors(hosts):
    # A PACK group on the member (the head was full at creation) whose member dies is held
    # by the head once it has room: RESCHEDULING, then CREATED there, under the same bundle
    # numbers; the task that ran in it is retried here, an actor with a restart left
    # restarts here, and one with none dies with ActorDiedError naming the member; so do
    # another driver's actors there (in room the group's driver lends it).
    _cluster(hosts, "2", "2")
    proc = driver(PRELUDE + PG + """
    import sys

    @ray.remote(num_cpus=2)
    class Hog:
        def ready(self):
            return True

    @ray.remote
    class Where:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    hog = Hog.remote()
    ray.get(hog.ready.remote(), timeout=30)  # the head's 2 CPUs: the group goes elsewhere
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK", name="back")
    assert pg.wait(20)
    first = placement_group_table(pg)["bundles_to_node_id"]
    in0 = PlacementGroupSchedulingStrategy(pg, 0)
    again = Where.options(max_restarts=1, scheduling_strategy=in0).remote()
    once = Where.options(max_restarts=0, scheduling_strategy=in0).remote()
    named = Where.options(name="follows", max_restarts=1, scheduling_strategy=in0).remote()
    before = ray.get([again.ip.remote(), once.ip.remote(), named.ip.remote()], timeout=30)
    print(json.dumps({"here": here, "first": first, "before": before}), flush=True)
    sys.stdin.readline()  # another driver's actors run in bundle 0 too
    ray.kill(hog)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and ray.available_resources().get("CPU", 0) < 2:
        time.sleep(0.05)
    # Two tasks here leave their leases idle, kept for reuse (MINIRAY_LEASE_KEEP_MS): they
    # give way when the lost bundles need this node's room.
    assert ray.get([ip_of.remote(0.5) for _ in range(2)], timeout=30)[0][0] == "127.0.0.1"
    long = ip_of.options(max_retries=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote(3.0)
    time.sleep(1.0)
    print(json.dumps({"long": "started"}), flush=True)
    sys.stdin.readline()  # the test kills the member now
    t0 = time.monotonic()
    states, table = table_until(pg, lambda table: table["state"] == "CREATED"
                                and table["bundles_to_node_id"][1] != first[1])
    took = time.monotonic() - t0
    retried = ray.get(long, timeout=30)[0]
    after = [ray.get(in_bundle(pg, i).remote(), timeout=30)[0] for i in (0, 1)]
    restarted = ray.get(again.ip.remote(), timeout=30)
    named_restarted = ray.get(named.ip.remote(), timeout=30)
    try:
        ray.get(once.ip.remote(), timeout=30)
        died = "alive"
    except Exception as error:
        died = f"{type(error).__name__}: {error}"
    remove_placement_group(pg)
    print(json.dumps({"states": sorted(set(states)), "last": states[-1], "took": took,
                      "where": table["bundles_to_node_id"], "retried": retried,
                      "after": after, "restarted": restarted, "died": died,
                      "named": named_restarted}), flush=True)
    ray.shutdown()
    """, {**hosts.env("127.0.0.1"), "MINIRAY_LEASE_KEEP_MS": "60000"}, stdin=subprocess.PIPE)
    other = None
    try:
        doc = json_line(proc, 40)
        member = hosts.record(MEMBER).node_id
        assert doc["first"] == {"0": member, "1": member}, doc
        assert doc["before"] == [MEMBER] * 3, doc
        other = _driver_with("""
        from miniray.util.placement_group import placement_group_table

        @ray.remote
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        in0 = PlacementGroupSchedulingStrategy(pg, 0)
        again = Where.options(max_restarts=1, scheduling_strategy=in0).remote()
        once = Where.options(max_restarts=0, scheduling_strategy=in0).remote()
        print(json.dumps({"before": [run(again.ip.remote()), run(once.ip.remote())]}),
              flush=True)
        sys.stdin.readline()  # the member was killed
        head = ray.get_runtime_context().get_node_id()
        deadline = time.monotonic() + 30
        while placement_group_table(pg)["bundles_to_node_id"].get(0) != head and \\
                time.monotonic() < deadline:
            time.sleep(0.05)
        moved = placement_group_table(pg)["bundles_to_node_id"].get(0) == head
        restarted = run(again.ip.remote())
        try:
            ray.get(once.ip.remote(), timeout=30)
            died = "alive"
        except Exception as error:
            died = f"{type(error).__name__}: {error}"
        print(json.dumps({"moved": moved, "restarted": restarted, "died": died}), flush=True)
        ray.shutdown()
        """, hosts, "back")
        assert json_line(other, 90) == {"before": [MEMBER, MEMBER]}
        assert go_on(proc, 60) == {"long": "started"}
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        theirs = go_on(other, 90)  # before the group's driver removes it
        assert other.wait(30) == 0
        doc = go_on(proc, 60)
        assert proc.wait(30) == 0
    finally:
        if other is not None:
            stop_driver(other)
        stop_driver(proc)
    assert theirs["moved"] and theirs["restarted"] == "127.0.0.1", theirs
    assert theirs["died"].startswith("ActorDiedError") and member in theirs["died"], theirs
    head = hosts.record("127.0.0.1").node_id
    # RESCHEDULING lasts until the watch's next turn (WATCH_S): a poll may not see it.
    assert doc["last"] == "CREATED" and set(doc["states"]) <= {"CREATED", "RESCHEDULING"}, doc
    assert doc["where"] == {"0": head, "1": head}, doc
    assert doc["retried"] == "127.0.0.1" and doc["after"] == ["127.0.0.1"] * 2, doc
    assert doc["restarted"] == doc["named"] == "127.0.0.1", doc
    assert doc["died"].startswith("ActorDiedError") and member in doc["died"], doc
    print(f"\nbundles held here {doc['took']:.2f} s after their node was killed")


def test_a_named_actor_in_a_members_bundle_is_found_by_another_driver_and_holds_its_room(
        hosts):
    # The node's actor service owns named actors; it places this one in the bundle the
    # creating driver holds on the member, whose room the driver keeps for it until the
    # service no longer holds it alive (killed here by another driver); removing the
    # group ends a named one.
    _cluster(hosts, "2", "2")
    proc = driver(PRELUDE + PG + """
    import sys

    @ray.remote(num_cpus=1)
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k
            return self.n, ips[ray.get_runtime_context().get_node_id()]

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    in1 = PlacementGroupSchedulingStrategy(pg, 1)
    counter = Counter.options(name="counter", namespace="pgs", scheduling_strategy=in1).remote()
    first = ray.get(counter.add.remote(1), timeout=30)
    print(json.dumps({"first": first}), flush=True)
    sys.stdin.readline()  # another driver used it, then killed it
    t0 = time.monotonic()
    ran = ray.get(in_bundle(pg, 1).remote(), timeout=30)[0]  # the actor's CPU came back
    waited = time.monotonic() - t0
    second = Counter.options(name="second", namespace="pgs", scheduling_strategy=in1).remote()
    there = ray.get(second.add.remote(2), timeout=30)
    remove_placement_group(pg)
    try:
        ended = ray.get(second.add.remote(1), timeout=30)
    except Exception as error:  # Ray's reason: the group's removal, not a ray.kill
        ended = [type(error).__name__, "placement group was removed" in str(error)]
    print(json.dumps({"ran": ran, "waited": waited, "there": there, "ended": ended}),
          flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc, 40)
        assert doc["first"] == [1, MEMBER], doc
        other = driver("""
        import json
        import miniray as ray
        ray.init(address="auto")
        counter = ray.get_actor("counter", namespace="pgs")
        seen = ray.get(counter.add.remote(10), timeout=30)
        ray.kill(counter)
        print(json.dumps({"seen": seen}), flush=True)
        ray.shutdown()
        """, hosts.env("127.0.0.1"))
        try:
            assert json_line(other, 40) == {"seen": [11, MEMBER]}
            assert other.wait(30) == 0
        finally:
            stop_driver(other)
        doc = go_on(proc, 60)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert doc["ran"] == MEMBER and doc["there"] == [2, MEMBER], doc
    assert doc["ended"] == ["ActorDiedError", True], doc


def test_detached_actors_in_a_members_bundle_of_a_driver_group_live_as_long_as_the_group(
        hosts):
    # As in Ray: a detached actor in a group that is not detached lives until the group
    # ends, whatever its handles do; its driver's end ends the group, and so the actor.
    _cluster(hosts, "2", "2")
    proc = driver(PRELUDE + PG + """
    import sys

    @ray.remote(num_cpus=1)
    class Kept:
        def pid(self):
            return os.getpid(), ips[ray.get_runtime_context().get_node_id()]

    pg = placement_group([{"CPU": 1}, {"CPU": 2}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    in1 = PlacementGroupSchedulingStrategy(pg, 1)
    anon = Kept.options(lifetime="detached", scheduling_strategy=in1).remote()
    named = Kept.options(name="kept", namespace="pgs", lifetime="detached",
                         scheduling_strategy=in1).remote()
    pids = [ray.get(a.pid.remote(), timeout=30) for a in (anon, named)]
    del anon, named  # no handle left here: both live on, each holding a CPU of the bundle
    blocked = in_bundle(pg, 1).remote()
    held = not ray.wait([blocked], timeout=1.5)[0]
    print(json.dumps({"pids": pids, "held": held}), flush=True)
    sys.stdin.readline()  # another driver found the named one; this one ends, group and all
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    found = """
    import json
    import miniray as ray
    ray.init(address="auto")
    try:
        kept = ray.get_actor("kept", namespace="pgs")
        print(json.dumps({"pid": ray.get(kept.pid.remote(), timeout=30)[0]}), flush=True)
    except ValueError:
        print(json.dumps({"pid": None}), flush=True)
    ray.shutdown()
    """
    try:
        doc = json_line(proc, 60)
        (anon, anon_ip), (named, named_ip) = doc["pids"]
        assert anon_ip == named_ip == MEMBER and doc["held"], doc
        other = driver(found, hosts.env("127.0.0.1"))
        try:
            assert json_line(other, 40) == {"pid": named}
            assert other.wait(30) == 0
        finally:
            stop_driver(other)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert _ends(anon) and _ends(named), "a detached actor outlived its driver's group"
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)
    after = driver(found, hosts.env("127.0.0.1"))
    try:
        assert json_line(after, 40) == {"pid": None}
        assert after.wait(30) == 0
    finally:
        stop_driver(after)


def test_named_actors_in_a_members_gpu_bundle_each_see_their_own_gpu(hosts):
    _gpu_cluster(hosts)
    doc = _run_driver(hosts, PG + """
    pg = placement_group([{"GPU": 2, "CPU": 2}])
    assert pg.wait(20)
    strategy = PlacementGroupSchedulingStrategy(pg, -1)  # "any bundle": the member's
    """ + GPUS + """
    first = Gpu.options(name="g1", scheduling_strategy=strategy).remote()
    one = ray.get(first.ids.remote(), timeout=30)
    task = ray.get(gpu.options(scheduling_strategy=strategy).remote(), timeout=30)
    second = Gpu.options(name="g2", scheduling_strategy=strategy).remote()
    two = ray.get(second.ids.remote(), timeout=30)
    ray.kill(first)  # its device comes back once the name no longer finds it
    t0 = time.monotonic()
    third = Gpu.options(name="g3", scheduling_strategy=strategy).remote()
    three = ray.get(third.ids.remote(), timeout=30)
    print(json.dumps({"one": one, "task": task, "two": two, "three": three,
                      "waited": time.monotonic() - t0}), flush=True)
    ray.shutdown()
    """)
    (one, seen_one), (two, seen_two), (three, _seen) = doc["one"], doc["two"], doc["three"]
    assert sorted(one + two) == [0, 1], doc  # one device each
    assert (seen_one, seen_two) == (str(one[0]), str(two[0])), doc  # and only it
    assert doc["task"] != one, doc  # the task took the device the actor left free
    assert three == one, doc  # the killed actor's device, not the other one's


def test_a_named_actor_in_a_members_bundle_ends_with_its_driver_and_nothing_stays(hosts):
    _cluster(hosts, "2", "2")
    doc = _run_driver(hosts, PG + """
    @ray.remote
    class Pid:
        def pid(self):
            return os.getpid(), ips[ray.get_runtime_context().get_node_id()]

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    named = Pid.options(name="left", scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    print(json.dumps({"pid": ray.get(named.pid.remote(), timeout=30)}), flush=True)
    """)  # the driver ends without removing the group or killing the actor
    pid, ip = doc["pid"]
    assert ip == MEMBER, doc

    def member_leases() -> dict:
        with open(os.path.join(hosts.record(MEMBER).session_dir, "ledger.json")) as f:
            return json.load(f)["leases"]

    assert _ends(pid), "the named actor's worker outlived its driver"
    assert wait_until(lambda: not member_leases(), 30.0), member_leases()


def test_a_named_actor_from_a_members_driver_in_a_bundle_elsewhere_lives_there(hosts):
    # The names are the head's actor service's; a driver on the member holds the group in
    # the member's ledger, which that service cannot read: the driver lends the room as a
    # driver of the head does, and its own watch (0.5 s) ends the loan and the actor.
    _cluster(hosts, "2", "2")
    proc = driver("""
    import json, sys, time
    import miniray as ray
    from miniray.util.placement_group import placement_group, placement_group_table
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}

    @ray.remote(num_cpus=1)
    class A:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    @ray.remote(num_cpus=1)
    def ip_of():
        return ips[ray.get_runtime_context().get_node_id()]

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="g")
    assert pg.wait(20)
    here = ray.get_runtime_context().get_node_id()
    nodes = placement_group_table(pg)["bundles_to_node_id"]
    other = next(i for i, node in nodes.items() if node != here)
    there = PlacementGroupSchedulingStrategy(pg, other)
    far = A.options(name="far", namespace="pgs", scheduling_strategy=there).remote()
    out = {"far": ray.get(far.ip.remote(), timeout=30)}
    out["found"] = ray.get(ray.get_actor("far", namespace="pgs").ip.remote(), timeout=30)
    blocked = ip_of.options(scheduling_strategy=there).remote()
    out["held"] = not ray.wait([blocked], timeout=1.5)[0]  # the actor holds the CPU
    ray.kill(far)
    out["after_kill"] = ray.get(blocked, timeout=30)  # its room came back
    second = A.options(name="second", namespace="pgs", scheduling_strategy=there).remote()
    out["second"] = ray.get(second.ip.remote(), timeout=30)
    # and one in the driver's own bundle on its own node (the member), which the
    # service leases from the group's bundle in the member's ledger
    mine = next(i for i, node in nodes.items() if node == here)
    near = A.options(name="near", namespace="pgs",
                     scheduling_strategy=PlacementGroupSchedulingStrategy(pg, mine)).remote()
    try:
        out["near"] = ray.get(near.ip.remote(), timeout=30)
    except Exception as error:
        out["near"] = type(error).__name__
    print(json.dumps(out), flush=True)
    sys.stdin.readline()  # another driver of the member removed the group
    t0 = time.monotonic()
    ended = {"second": "alive", "near": "alive"}
    while "alive" in ended.values() and time.monotonic() - t0 < 30:
        for key, actor in (("second", second), ("near", near)):
            if ended[key] == "alive":
                try:
                    ray.get(actor.ip.remote(), timeout=30)
                except Exception as error:
                    ended[key] = type(error).__name__
        time.sleep(0.1)
    # within: promptly, by the watch, with room for a loaded runner (not the loop's 30 s)
    print(json.dumps({"ended": ended, "within": time.monotonic() - t0 < 15}), flush=True)
    ray.shutdown()
    """, hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc, 90)
        assert doc == {"far": "127.0.0.1", "found": "127.0.0.1", "held": True,
                       "after_kill": "127.0.0.1", "second": "127.0.0.1", "near": MEMBER}, doc
        other = driver("""
        import miniray as ray
        from miniray.util import get_placement_group, remove_placement_group
        ray.init(address="auto")
        remove_placement_group(get_placement_group("g"))
        ray.shutdown()
        """, hosts.env(MEMBER))
        try:
            assert other.wait(30) == 0, other.stderr.read()
        finally:
            stop_driver(other)
        doc = go_on(proc, 60)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    # the removal seen by this driver's watch, which kills the actor in the service
    assert doc == {"ended": {"second": "ActorDiedError", "near": "ActorDiedError"},
                   "within": True}, doc


def test_a_members_drivers_named_actors_follow_their_bundles_after_a_node_dies(hosts):
    # A driver on the member lends its named actors (the head's actor service runs them)
    # room in bundles on a third node. That node dies: one bundle is placed again on the
    # head, the other on the driver's own node, and each actor restarts in its bundle's
    # new place, as in Ray (before: ActorDiedError, restarts left or not).
    _cluster(hosts, "1", "2")
    hosts.join_alive(THIRD, hosts.record("127.0.0.1").address, "--num-cpus", "2")
    proc = driver(PRELUDE + PG + """
    import sys
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    head = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.1")

    @ray.remote(num_cpus=1)
    class Block:
        def ok(self):
            return True

    @ray.remote(num_cpus=0, max_restarts=1)
    class Where:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    # The head's CPU held while the groups are made: their second bundles go to the third
    block = Block.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, False)
                          ).remote()
    assert ray.get(block.ok.remote(), timeout=30)
    strict = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    soft = placement_group([{"CPU": 0.5}, {"CPU": 0.5}], strategy="SPREAD")
    assert strict.wait(20) and soft.wait(20)
    first = {"strict": placement_group_table(strict)["bundles_to_node_id"],
             "soft": placement_group_table(soft)["bundles_to_node_id"]}
    actors = {}
    for key, pg in (("strict", strict), ("soft", soft)):
        index = next(i for i, node in first[key].items() if node != here)
        actors[key] = (pg, index, Where.options(
            name=key, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index)).remote())
    before = {key: ray.get(a.ip.remote(), timeout=30) for key, (_p, _i, a) in actors.items()}
    ray.kill(block)  # room on the head again
    print(json.dumps({"first": first, "before": before, "here": here,
                      "third": [ips[n] for n in first["strict"].values()]}), flush=True)
    sys.stdin.readline()  # the third node is killed now
    after, where = {}, {}
    for key, (pg, index, actor) in actors.items():
        old = first[key][index]
        _states, table = table_until(pg, lambda t: t["state"] == "CREATED"
                                     and t["bundles_to_node_id"][index] != old, 30)
        where[key] = ips.get(table["bundles_to_node_id"][index], "?")
        try:
            after[key] = ray.get(actor.ip.remote(), timeout=30)
        except Exception as error:
            after[key] = type(error).__name__
    print(json.dumps({"after": after, "where": where}), flush=True)
    ray.shutdown()
    """, hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc, 60)
        assert doc["before"] == {"strict": THIRD, "soft": THIRD}, doc
        os.kill(hosts.record(THIRD).pid, signal.SIGKILL)
        doc = go_on(proc, 90)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert doc["where"] == {"strict": "127.0.0.1", "soft": MEMBER}, doc
    assert doc["after"] == {"strict": "127.0.0.1", "soft": MEMBER}, doc


def test_named_and_detached_actors_of_a_members_driver_in_a_bundle_elsewhere_end_with_it(
        hosts):
    _cluster(hosts, "2", "2")
    proc = driver("""
    import json, os
    import miniray as ray
    from miniray.util.placement_group import placement_group, placement_group_table
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address="auto")

    @ray.remote
    class Pid:
        def pid(self):
            return os.getpid()

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    here = ray.get_runtime_context().get_node_id()
    nodes = placement_group_table(pg)["bundles_to_node_id"]
    other = next(i for i, node in nodes.items() if node != here)
    there = PlacementGroupSchedulingStrategy(pg, other)
    named = Pid.options(name="left", scheduling_strategy=there).remote()
    kept = Pid.options(name="kept", lifetime="detached", scheduling_strategy=there).remote()
    pids = [ray.get(named.pid.remote(), timeout=30), ray.get(kept.pid.remote(), timeout=30)]
    print(json.dumps({"pids": pids}), flush=True)
    """, hosts.env(MEMBER))  # the driver ends without removing the group or killing them
    try:
        named, kept = json_line(proc, 40)["pids"]
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)

    assert _ends(named), "the named actor's worker outlived its driver"
    # Detached, but in the driver's own group, which ends with the driver (as in Ray).
    assert _ends(kept), "the detached actor's worker outlived its driver's group"
    assert wait_until(lambda: not ledger_leases(hosts.env("127.0.0.1")),
                      30.0)


def test_a_driver_on_another_host_finds_the_creators_group_and_runs_tasks_in_it(hosts):
    """As in Ray, a driver on another host than the creator finds its (not detached)
    group by name and in ``placement_group_table()``, each bundle's node as the creator's
    node records it (read from that node over this driver's link to it), and waits for
    it; a name no node holds still raises Ray's ValueError. Its tasks run in every bundle:
    on the creator's node under a lease its ledger provides from the group, on a third
    node (the member) in room the creator lends each task through its node; the group's
    removal fails its running and waiting tasks there with TaskPlacementGroupRemoved, and
    its death mid-task gives the room back (its link to the creator's node closed); the
    creator's death fails them too. Its actors there (a named one too) run in room the
    creator lends for the actor's life, through its node: on the member (the creator's
    own task there waits until the actor is killed, then runs) and on the creator's node
    (the head's service places it from the group's bundle there); the group's removal
    kills them (ActorDiedError). Its own groups (reserved on its host, and pending) are
    listed from the member's host beside the creator's."""
    _cluster(hosts, "2", "2")
    creator = _holder(hosts, "theirs", "gone")  # bundles on the head and the member
    try:
        _join_late(hosts, THIRD)  # the borrowing driver's host
        far = _driver_with("""
        from miniray.util.placement_group import placement_group_table
        table = placement_group_table(pg)
        doc = {"state": table["state"], "name": table["name"], "ready": pg.wait(10),
               "nodes": {i: ips[node] for i, node in table["bundles_to_node_id"].items()},
               "listed": pg.id.hex() in placement_group_table()}
        try:
            get_placement_group("nowhere")
            doc["unknown"] = "found"
        except ValueError as error:
            doc["unknown"] = str(error)
        doc["here"] = run(in_bundle(0).remote())
        doc["there"] = run(in_bundle(1).remote())
        doc["again"] = run(in_bundle(1).remote())  # the first one's loan came back

        @ray.remote(num_cpus=0.5)
        class Where:
            def ip(self):
                return ips[ray.get_runtime_context().get_node_id()]

        def actor_in(group, index, **options):
            return Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, index), **options).remote()

        plain = actor_in(pg, 1)
        doc["actor"] = run(plain.ip.remote())
        # Groups of its own, for the listing from the member's host: one reserved (on
        # this host, the only room left) and one that waits.
        from miniray.util.placement_group import placement_group, remove_placement_group
        own = placement_group([{"CPU": 1}], name="far_own")
        doc["own"] = own.wait(20)
        wants = placement_group([{"CPU": 64}], name="far_wants")
        print(json.dumps(doc), flush=True)
        sys.stdin.readline()  # the creator's task in bundle 1 waits: the actor holds room
        ray.kill(plain)
        print(json.dumps({"killed": run(plain.ip.remote())}), flush=True)
        sys.stdin.readline()  # the creator's task ran
        gone = get_placement_group("gone")
        named, head = actor_in(gone, 1, name="far", namespace="pgs"), actor_in(gone, 0)
        in_gone = ip_of.options(num_cpus=0.5, scheduling_strategy=(
            PlacementGroupSchedulingStrategy(gone, 1)))
        running, long = in_gone.remote("running", 120.0), in_bundle(1).remote("long", 120.0)
        started = marked("running") and marked("long")
        waiting = in_gone.remote()  # the actor and "running" fill the bundle
        print(json.dumps({"started": started, "named": run(named.ip.remote()),
                          "head": run(head.ip.remote())}), flush=True)

        def until_gone(actor):
            deadline = time.monotonic() + 30
            while (ended := run(actor.ip.remote())) in ips.values() and \
                    time.monotonic() < deadline:  # the kill is async
                time.sleep(0.05)
            return ended

        sys.stdin.readline()  # the creator removed group "gone"
        remove_placement_group(own)
        remove_placement_group(wants)
        print(json.dumps({"removed": [run(running), run(waiting), until_gone(named),
                                      until_gone(head)]}), flush=True)
        sys.stdin.readline()  # killed here, "long" running in the creator's bundle
        """, hosts, "theirs", ip=THIRD)
        try:
            doc = json_line(far, 120)
            assert doc == {"state": "CREATED", "name": "theirs", "ready": True,
                           "nodes": {"0": "127.0.0.1", "1": MEMBER}, "listed": True,
                           "unknown": "Failed to look up placement group with name: nowhere",
                           "here": "127.0.0.1", "there": MEMBER, "again": MEMBER,
                           "actor": MEMBER, "own": True}, (
                               doc, far.stderr.read() if far.poll() is not None else "")
            # Listed from the member's host: the head's groups, and this third host's
            # driver's own, reserved and pending (every other node is asked).
            listed = cli(hosts.env(MEMBER), "list", "placement-groups", "--format", "json",
                         "--detail")
            assert listed.returncode == 0, listed.stderr
            ids = {ip: hosts.record(ip).node_id for ip in ("127.0.0.1", MEMBER, THIRD)}
            rows = {r["name"]: [r["state"], sorted(str(b["node_id"]) for b in r["bundles"])]
                    for r in json.loads(listed.stdout)}
            spread = ["CREATED", sorted([ids["127.0.0.1"], ids[MEMBER]])]
            assert rows == {"theirs": spread, "gone": spread,
                            "far_own": ["CREATED", [ids[THIRD]]],
                            "far_wants": ["PENDING", ["None"]]}, rows
            assert _tell(creator, "start theirs") == {"ended": False}  # the actor holds it
            assert go_on(far, 60) == {"killed": "ActorDiedError"}
            assert _tell(creator, "finish") == {"finish": MEMBER}
            doc = go_on(far, 90)
            assert doc == {"started": True, "named": MEMBER, "head": "127.0.0.1"}, doc
            assert _tell(creator, "remove gone") == {"removed": "gone"}
            doc = go_on(far, 60)
            assert doc == {"removed": ["TaskPlacementGroupRemoved"] * 2 +
                           ["ActorDiedError"] * 2}, doc
            far.kill()  # mid-task: the creator's node tells it, which drops the loan
            far.wait(10)
            assert _tell(creator, "run theirs") == {"run": MEMBER}
        finally:
            stop_driver(far)
        assert creator.poll() is None
        second = _driver_with("""
        running = in_bundle(1).remote("running", 120.0)
        started = marked("running")
        waiting = in_bundle(1).remote()
        print(json.dumps({"started": started}), flush=True)
        sys.stdin.readline()  # the creator was killed: its group went with it
        print(json.dumps({"gone": [run(running), run(waiting)]}), flush=True)
        ray.shutdown()
        """, hosts, "theirs", ip=THIRD)
        try:
            assert json_line(second, 60) == {"started": True}
            stop_driver(creator)
            doc = go_on(second, 60)
            assert doc == {"gone": ["TaskPlacementGroupRemoved"] * 2}, doc
            assert second.wait(30) == 0
        finally:
            stop_driver(second)
    finally:
        stop_driver(creator)
    assert wait_until(lambda: not ledger_leases(hosts.env(MEMBER)), 30.0)
    # As in Ray, the driver on another host removes the creator's group: every node's
    # part is released (the creator, alive, notices), the creator's task waiting for
    # bundle 1's room fails, and so does that driver's own task running there.
    def parts_held() -> bool:  # a lease of group "removed" in any node's ledger
        for ip in ("127.0.0.1", MEMBER, THIRD):
            leases = ledger_leases(hosts.env(ip))
            for lease in leases.values() if isinstance(leases, dict) else leases:
                if (lease.get("group") or {}).get("name") == "removed" or \
                        "placement group removed " in lease.get("tag", ""):
                    return True
        return False

    creator = _holder(hosts, "removed")
    try:
        assert parts_held()
        remover = _driver_with("""
        from miniray.util.placement_group import remove_placement_group
        running = in_bundle(1).remote("running", 120.0)
        print(json.dumps({"started": marked("running")}), flush=True)
        sys.stdin.readline()  # the creator's own task waits for the bundle's room
        remove_placement_group(pg)
        print(json.dumps({"removed": run(running)}), flush=True)
        ray.shutdown()
        """, hosts, "removed", ip=THIRD)
        try:
            assert json_line(remover, 60) == {"started": True}
            assert _tell(creator, "start removed") == {"ended": False}
            doc = go_on(remover, 60)
            assert doc == {"removed": "TaskPlacementGroupRemoved"}, doc
            assert remover.wait(30) == 0
        finally:
            stop_driver(remover)
        assert _tell(creator, "finish") == {"finish": "TaskPlacementGroupRemoved"}
        assert wait_until(lambda: not parts_held(), 30.0)
        assert creator.poll() is None
    finally:
        stop_driver(creator)
