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

import os
import signal
import subprocess

from .helpers import cli, driver, json_line, ledger_leases, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_placement import _cluster
from .test_remote_placement_groups import PG
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver

WHERE = """
    @ray.remote(num_cpus=1)
    class Where:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]
    """


def _member_group_leases(hosts, ip: str = MEMBER) -> list:
    return [lease for lease in ledger_leases(hosts.env(ip)).values()
            if "placement group" in (lease.get("tag") or "")]


def _head_groups(hosts) -> list:
    return [lease for lease in ledger_leases(hosts.env("127.0.0.1")).values()
            if lease.get("group")]


def _create_detached(hosts, name: str, *, max_restarts: int = 0) -> dict:
    """A driver that creates detached STRICT_SPREAD group ``name`` (one CPU on the head, one
    on a member) and a detached actor ``keeper`` in bundle 1, then exits."""
    return _run_driver(hosts, PG + WHERE + f"""
    pg = placement_group([{{"CPU": 1}}, {{"CPU": 1}}], strategy="STRICT_SPREAD",
                         name={name!r}, lifetime="detached")
    ready = pg.wait(20)
    table = placement_group_table(pg)
    keeper = Where.options(
        name="keeper", namespace="kept", lifetime="detached", max_restarts={max_restarts},
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 1)).remote()
    print(json.dumps({{"ready": ready, "here": here, "member": member,
                      "state": table["state"], "nodes": table["bundles_to_node_id"],
                      "keeper": ray.get(keeper.ip.remote(), timeout=30)}}), flush=True)
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

    head_task, member_task = run(0), run(1)
    # A named actor of this driver in the member's bundle: the service runs it there too
    # (once the keeper gives the bundle's one CPU back).
    ray.kill(keeper)

    @ray.remote(num_cpus=1)
    class Named:
        def ip(self):
            return ips[ray.get_runtime_context().get_node_id()]

    named = Named.options(name="named", scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, 1)).remote()
    named_ip = ray.get(named.ip.remote(), timeout=30)
    remove_placement_group(pg)
    try:
        ray.get(named.ip.remote(), timeout=20)
        after = "alive"
    except Exception as error:
        after = type(error).__name__
    print(json.dumps({"nodes": nodes, "kept": kept, "head_task": head_task,
                      "member_task": member_task, "named": named_ip, "after": after,
                      "here": here, "member": member}), flush=True)
    ray.shutdown()
    """)
    assert other["nodes"] == {"0": other["here"], "1": other["member"]}, other
    assert other["kept"] == MEMBER, other
    assert other["head_task"] == "127.0.0.1", other  # the head's bundle: the node's ledger
    kind, text = other["member_task"]
    assert kind == "TaskUnschedulableError", other
    assert "detached placement group 'dg'" in text and "not supported yet" in text, text
    assert other["named"] == MEMBER, other
    assert other["after"] == "ActorDiedError", other
    assert wait_until(lambda: not _member_group_leases(hosts), 10.0)
    assert wait_until(lambda: not _head_groups(hosts), 10.0)


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
    assert wait_until(lambda: not _member_group_leases(hosts), 10.0)


def test_a_detached_groups_bundle_whose_member_dies_is_placed_again_with_its_actor(hosts):
    _cluster(hosts, "2", "2")
    other = "127.0.0.3"
    joined = hosts.join(other, hosts.record("127.0.0.1").address, "--num-cpus", "2")
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.1").get(other) or {}).get("alive"), 5.0)
    doc = _create_detached(hosts, "moves", max_restarts=1)
    victim = doc["keeper"]
    assert victim in (MEMBER, other), doc
    survivor = other if victim == MEMBER else MEMBER
    os.kill(hosts.record(victim).pid, signal.SIGKILL)
    proc = driver(PRELUDE.replace('"127.0.0.2" and n["Alive"]', '"127.0.0.1"') + PG + """
    from miniray.util.placement_group import get_placement_group
    pg = get_placement_group("moves")
    first = placement_group_table(pg)["bundles_to_node_id"][1]
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
    remove_placement_group(pg)
    print(json.dumps({"states": sorted(set(states)), "moved_to": moved_to,
                      "restarted": restarted, "took": took}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.DEVNULL)
    try:
        moved = json_line(proc, 60)
        assert proc.wait(30) == 0
    finally:
        stop_driver(proc)
    assert moved["moved_to"] == survivor, moved
    assert moved["restarted"] == survivor, moved
    assert wait_until(lambda: not _member_group_leases(hosts, survivor), 10.0)
    assert wait_until(lambda: not _head_groups(hosts), 10.0)
    print(f"\ndetached bundle placed again {moved['took']:.2f} s after its driver looked")
