"""Placement groups end to end: reservation, tasks and actors in bundles, removal, GPUs,
named and detached groups shared by the drivers of a node. Behaviour compared with Ray 2.60
(its error types and wording, the derived resource names, the table's keys)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

import miniray
from miniray.exceptions import (
    ActorDiedError,
    ActorUnschedulableError,
    TaskPlacementGroupRemoved,
)
from miniray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup


def _derived(resources: dict, pg) -> dict:
    """The resources named after ``pg`` (Ray's ``*_group_*_<hex>``), without the hex."""
    hex_ = pg.id.hex()
    return {k[: -len(hex_) - 1]: v for k, v in resources.items() if k.endswith(hex_)}


def test_a_group_reserves_its_bundles_and_shows_them_as_ray_does(ray):
    assert ray.util.placement_group is placement_group  # as ray.util exports them
    assert ray.util.remove_placement_group is remove_placement_group
    pg = placement_group([{"CPU": 1}], name="g1")
    assert isinstance(pg, PlacementGroup) and len(pg.id.hex()) == 36
    assert ray.get(pg.ready(), timeout=30) == pg
    assert pg.wait(5) is True
    assert pg.bundle_specs == [{"CPU": 1.0}] and pg.bundle_count == 1
    available = ray.available_resources()
    assert available["CPU"] == 1.0
    assert _derived(available, pg) == {"CPU_group": 1.0, "CPU_group_0": 1.0,
                                       "bundle_group": 1000.0, "bundle_group_0": 1000.0}
    totals = ray.cluster_resources()
    assert totals["CPU"] == 2.0 and _derived(totals, pg)["CPU_group_0"] == 1.0
    entry = placement_group_table(pg)
    assert set(entry) >= {"placement_group_id", "name", "bundles", "bundles_to_node_id",
                          "strategy", "state", "stats"}
    assert entry["placement_group_id"] == pg.id.hex() and entry["name"] == "g1"
    assert entry["bundles"] == {0: {"CPU": 1.0}} and entry["strategy"] == "PACK"
    assert entry["state"] == "CREATED"
    assert entry["bundles_to_node_id"] == {0: ray.get_runtime_context().get_node_id()}
    assert list(placement_group_table()) == [pg.id.hex()]
    owner = miniray._private.runtime.current().owner
    assert owner.statistics()["placement_groups"] == {"pending": 0, "created": 1, "removed": 0}
    remove_placement_group(pg)
    assert owner.statistics()["placement_groups"]["removed"] == 1
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert ray.available_resources()["CPU"] == 2.0
    assert _derived(ray.available_resources(), pg) == {}


@pytest.mark.parametrize("kwargs, error, text", [
    ({"bundles": []}, ValueError, "Bundles must be a non-empty list"),
    ({"bundles": [{"CPU": 0}]}, ValueError, "Bundles cannot be an empty dictionary"),
    ({"bundles": [{"CPU": 1}], "strategy": "FOO"}, ValueError,
     "Invalid placement group strategy FOO"),
    ({"bundles": [{"CPU": 1}], "lifetime": "x"}, ValueError,
     "Placement group `lifetime` argument must be either `None` or 'detached'. Got x."),
    ({"bundles": {"CPU": 1}}, ValueError, "Placement group bundles must be a list"),
])
def test_bad_arguments_raise_as_ray_does(ray, kwargs, error, text):
    with pytest.raises(error, match=None) as info:
        placement_group(**kwargs)
    assert str(info.value).startswith(text)
    assert placement_group_table() == {}


def test_tasks_run_in_their_bundle_and_see_their_group(ray_start):
    ray = miniray
    ray_start(num_cpus=3)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    def where():
        current = get_current_placement_group()
        return (None if current is None else current.id.hex(),
                ray.get_runtime_context().get_placement_group_id())

    hex_ = pg.id.hex()
    assert ray.get(where.options(scheduling_strategy=InGroup(pg)).remote()) == (hex_, hex_)
    assert ray.get(where.options(scheduling_strategy=InGroup(pg, 1)).remote()) == (hex_, hex_)
    # the older options, and a task outside any group
    assert ray.get(where.options(placement_group=pg).remote()) == (hex_, hex_)
    assert ray.get(where.remote()) == (None, None)
    assert get_current_placement_group() is None
    # many tasks share the two bundles
    assert len(ray.get([where.options(scheduling_strategy=InGroup(pg)).remote()
                        for _ in range(20)], timeout=60)) == 20
    remove_placement_group(pg)


def test_a_task_in_a_bundle_takes_the_bundles_resources(ray):
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    def hold(seconds):
        time.sleep(seconds)

    ref = hold.options(scheduling_strategy=InGroup(pg, 0)).remote(60)
    deadline = time.monotonic() + 20
    while _derived(ray.available_resources(), pg).get("CPU_group_0") and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    available = ray.available_resources()
    assert available["CPU"] == 1.0  # the group's CPU, not the node's other one
    assert _derived(available, pg) == {"bundle_group": 999.999, "bundle_group_0": 999.999}
    # a second task in the full bundle waits; one outside the group runs
    second = hold.options(scheduling_strategy=InGroup(pg)).remote(0)
    assert ray.wait([second], timeout=0.5)[0] == []
    assert ray.get(hold.remote(0), timeout=30) is None
    ray.cancel(ref, force=True)
    assert ray.get(second, timeout=30) is None
    remove_placement_group(pg)


def test_bundle_index_out_of_range_and_requests_no_bundle_holds_raise_as_ray(ray):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])

    @ray.remote
    def f():
        return 1

    for index in (2, -2):
        with pytest.raises(ValueError, match=f"placement group bundle index {index} is "
                                             "invalid. Valid placement group indexes: 0-2"):
            f.options(scheduling_strategy=InGroup(pg, index)).remote()
    # Named by its qualified name, as Ray 2.60 names it (the gotchas page quotes
    # "Cannot schedule train.<locals>.sample_task ...").
    here = "test_bundle_index_out_of_range_and_requests_no_bundle_holds_raise_as_ray.<locals>"
    with pytest.raises(ValueError, match=rf"Cannot schedule {here}.f with the placement group "
                       r"because the resource request \{'CPU': 2\} cannot fit into any "
                       r"bundles for the placement group, \[\{'CPU': 1.0\}, "
                       r"\{'CPU': 1.0\}\]."):
        f.options(num_cpus=2, scheduling_strategy=InGroup(pg)).remote()

    @ray.remote(num_cpus=2)
    class Big:
        pass

    with pytest.raises(ValueError, match=rf"Cannot schedule {here}.Big with the placement "):
        Big.options(scheduling_strategy=InGroup(pg)).remote()
    with pytest.raises(ValueError, match="cannot fit into any bundles"):
        f.options(resources={"x": 1}, scheduling_strategy=InGroup(pg)).remote()
    assert ray.get(f.options(num_cpus=0, scheduling_strategy=InGroup(pg)).remote(),
                   timeout=30) == 1
    remove_placement_group(pg)


def test_a_group_larger_than_the_node_is_reported_at_once_and_stays_pending(ray, capfd):
    pg = placement_group([{"CPU": 1}, {"CPU": 2}], name="big")
    err = capfd.readouterr().err
    assert "can never run on this node" in err and "CPU 3.0 but the node has 2.0" in err
    assert "placement group big" in err
    assert pg.wait(0.2) is False
    assert ray.wait([pg.ready()], timeout=0.2)[0] == []
    assert placement_group_table(pg)["state"] == "PENDING"
    assert ray.available_resources()["CPU"] == 2.0
    remove_placement_group(pg)


def test_strict_spread_of_several_bundles_raises_naming_the_strategy_and_nodes(ray):
    with pytest.raises(ValueError, match=r"STRICT_SPREAD.*2 bundles.*1 node"):
        placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    pg = placement_group([{"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(10)
    for strategy in ("PACK", "SPREAD", "STRICT_PACK"):
        other = placement_group([{"CPU": 0.5}], strategy=strategy)
        assert other.wait(10)
        assert placement_group_table(other)["strategy"] == strategy
        remove_placement_group(other)
    remove_placement_group(pg)


def test_a_group_that_fits_later_becomes_ready_when_resources_free_up(ray, tmp_path):
    # The task holds both CPUs until the test opens its gate, and the group is asked for once
    # they are taken: a fixed pause for the start and a task of fixed length both lost to a
    # slow worker start or a stall.
    gate = str(tmp_path / "gate")

    @ray.remote(num_cpus=2)
    def busy(gate):
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)

    ref = busy.remote(gate)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(0.2) is False
    assert placement_group_table(pg)["state"] == "PENDING"
    ready = pg.ready()
    open(gate, "w").close()
    assert ray.get(ready, timeout=30) == pg
    ray.get(ref, timeout=30)
    assert placement_group_table(pg)["state"] == "CREATED"
    remove_placement_group(pg)


def test_a_pending_group_is_retried_when_another_process_frees_resources(ray):
    """Resources another process of the node gives back (not this driver's own work) are
    noticed too: pending groups are retried on a timer."""
    ledger = miniray._private.runtime.current().ledger
    ray.available_resources()  # this driver's idle lease (taken at init) goes back first
    held = ledger.acquire({"CPU": 2}, holder_pid=os.getpid(), tag="another driver")
    pg = placement_group([{"CPU": 1}])
    ready = pg.ready()
    assert ray.wait([ready], timeout=0.5)[0] == []
    ledger.release(held.lease_id)
    assert ray.get(ready, timeout=10) == pg
    remove_placement_group(pg)


def test_removing_a_group_kills_its_running_tasks_and_fails_queued_ones(ray):
    """Ray 2.60 kills the worker and retries the task into the removed group, where it stays
    pending forever; miniray fails it with TaskPlacementGroupRemoved instead."""
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    def sleeper():
        time.sleep(60)

    running = sleeper.options(scheduling_strategy=InGroup(pg)).remote()
    queued = sleeper.options(scheduling_strategy=InGroup(pg, 0)).remote()
    deadline = time.monotonic() + 30  # the first one runs: it holds the bundle's CPU
    while _derived(ray.available_resources(), pg).get("CPU_group_0") and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    remove_placement_group(pg)
    for ref in (running, queued):
        with pytest.raises(TaskPlacementGroupRemoved, match="has been removed"):
            ray.get(ref, timeout=20)
    assert time.monotonic() - start < 15
    later = sleeper.options(scheduling_strategy=InGroup(pg)).remote()
    with pytest.raises(TaskPlacementGroupRemoved):
        ray.get(later, timeout=20)
    with pytest.raises(TaskPlacementGroupRemoved):
        ray.get(pg.ready(), timeout=20)
    with pytest.raises(Exception, match="does not exist"):
        pg.wait(1)
    remove_placement_group(pg)  # twice: no error, as in Ray
    assert ray.available_resources()["CPU"] == 2.0


def test_a_handle_passed_to_a_task_works_there(ray):
    pg = placement_group([{"CPU": 1}], name="passed")

    @ray.remote(num_cpus=0)
    def use(group):
        return (group.bundle_count, group.wait(20), ray.get(group.ready(), timeout=20) == group,
                get_placement_group("passed") == group,
                list(placement_group_table()) == [group.id.hex()])

    assert ray.get(use.remote(pg), timeout=60) == (1, True, True, True, True)
    remove_placement_group(pg)


def test_child_tasks_are_captured_only_when_asked(ray):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote(num_cpus=0)
    def child():
        return ray.get_runtime_context().get_placement_group_id()

    @ray.remote(num_cpus=0)
    def parent():
        ctx = ray.get_runtime_context()
        return ctx.should_capture_child_tasks_in_placement_group, ray.get(child.remote())

    captured = parent.options(scheduling_strategy=InGroup(
        pg, placement_group_capture_child_tasks=True)).remote()
    assert ray.get(captured, timeout=60) == (True, pg.id.hex())
    plain = parent.options(scheduling_strategy=InGroup(pg)).remote()
    assert ray.get(plain, timeout=60) == (False, None)
    remove_placement_group(pg)


def test_a_parent_blocked_in_get_lends_its_bundles_cpu_to_a_captured_child(ray):
    """As Ray 2.60: the child runs in the parent's one-CPU bundle while the parent waits."""
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    def child():
        return ray.get_runtime_context().get_placement_group_id()

    @ray.remote
    def parent():
        return ray.get(child.remote(), timeout=30)

    captured = parent.options(scheduling_strategy=InGroup(
        pg, placement_group_capture_child_tasks=True)).remote()
    assert ray.get(captured, timeout=60) == pg.id.hex()
    remove_placement_group(pg)


def test_a_second_group_of_the_same_name_is_refused_as_ray_does(ray):
    from miniray.exceptions import RaySystemError

    pg = placement_group([{"CPU": 0.5}], name="dup")
    with pytest.raises(RaySystemError, match="because name 'dup' already exists"):
        placement_group([{"CPU": 0.5}], name="dup")
    remove_placement_group(pg)
    again = placement_group([{"CPU": 0.5}], name="dup")  # free again once removed
    assert again.wait(10)
    remove_placement_group(again)


def test_get_placement_group_by_name_and_missing_name(ray):
    pg = placement_group([{"CPU": 1}], name="named")
    assert get_placement_group("named") == pg
    assert get_placement_group("named").bundle_specs == [{"CPU": 1.0}]
    with pytest.raises(ValueError, match="Failed to look up placement group with name: nope"):
        get_placement_group("nope")
    remove_placement_group(pg)
    with pytest.raises(ValueError, match="Failed to look up"):
        get_placement_group("named")


# -- actors ---------------------------------------------------------------------------------------

def test_actors_run_in_their_bundle_and_see_their_group(ray):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote(num_cpus=1)
    class Member:
        def group(self):
            current = get_current_placement_group()
            return None if current is None else current.id.hex()

    a = Member.options(scheduling_strategy=InGroup(pg, 0)).remote()
    b = Member.options(scheduling_strategy=InGroup(pg)).remote()  # any bundle: the other
    assert ray.get([a.group.remote(), b.group.remote()], timeout=60) == [pg.id.hex()] * 2
    available = _derived(ray.available_resources(), pg)
    assert "CPU_group" not in available and "CPU_group_0" not in available
    assert "CPU_group_1" not in available
    # the group is full: a third member waits for room
    c = Member.options(scheduling_strategy=InGroup(pg)).remote()
    assert ray.wait([c.group.remote()], timeout=0.5)[0] == []
    ray.kill(a)
    assert ray.get(c.group.remote(), timeout=30) == pg.id.hex()
    remove_placement_group(pg)


def test_a_default_actor_in_a_bundle_holds_no_cpu_there(ray):
    """As in Ray: an actor without resource options needs 1 CPU to be placed and holds none
    while it lives, so a task fits in its bundle beside it."""
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    class Plain:
        def ping(self):
            return "pong"

    @ray.remote
    def task():
        return "ran"

    actor = Plain.options(scheduling_strategy=InGroup(pg)).remote()
    assert ray.get(actor.ping.remote(), timeout=30) == "pong"
    assert ray.get(task.options(scheduling_strategy=InGroup(pg)).remote(), timeout=30) == "ran"
    remove_placement_group(pg)


def test_removing_a_group_kills_its_actors_with_rays_reason(ray):
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote(num_cpus=1)
    class Member:
        def ping(self):
            return os.getpid()

    actor = Member.options(scheduling_strategy=InGroup(pg)).remote()
    waiting = Member.options(scheduling_strategy=InGroup(pg)).remote()  # no room: pending
    pid = ray.get(actor.ping.remote(), timeout=30)
    remove_placement_group(pg)
    # as in Ray 2.60: the one that had started died, the one waiting could never be created
    with pytest.raises(ActorDiedError, match="placement group was removed"):
        ray.get(actor.ping.remote(), timeout=20)
    with pytest.raises(ActorUnschedulableError, match=(
            "^The actor is not schedulable: Could not create the actor because its associated "
            f"placement group was removed.\nRequired placement group {pg.id.hex()} is removed.$")):
        ray.get(waiting.ping.remote(), timeout=20)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.available_resources()["CPU"] == 2.0
    # created after the removal: it can never be placed, so it dies instead of waiting
    late = Member.options(scheduling_strategy=InGroup(pg)).remote()
    with pytest.raises(ActorUnschedulableError, match="placement group was removed"):
        ray.get(late.ping.remote(), timeout=20)
    # the state API's death causes, as Ray's: the field says which kind of death
    from miniray.util.state import list_actors

    causes = {row["actor_id"]: row["death_cause"] for row in list_actors(detail=True)}
    started = causes[actor._actor_id.hex()]["actor_died_error_context"]
    assert started["pid"] == pid and "placement group was removed" in started["error_message"]
    never = causes[waiting._actor_id.hex()]
    assert list(never) == ["actor_unschedulable_context"], never
    assert never["actor_unschedulable_context"]["error_message"].startswith(
        "The actor is not schedulable: Could not create the actor"), never


# -- GPUs -----------------------------------------------------------------------------------------

def test_a_gpu_bundle_gives_its_tasks_exactly_its_devices(ray_start, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    ray_start(num_cpus=4, num_gpus=3)
    ray = miniray
    pg = placement_group([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}])
    ray.get(pg.ready(), timeout=30)

    @ray.remote(num_gpus=1)
    def devices():
        return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    @ray.remote(num_gpus=0.5)
    def half():
        time.sleep(0.5)
        return os.environ.get("CUDA_VISIBLE_DEVICES")

    in0 = ray.get(devices.options(scheduling_strategy=InGroup(pg, 0)).remote(), timeout=60)
    in1 = ray.get(devices.options(scheduling_strategy=InGroup(pg, 1)).remote(), timeout=60)
    assert in0 == (["3"], "3") and in1 == (["5"], "5")
    # outside the group, only the device the group did not reserve is left
    assert ray.get(devices.remote(), timeout=60) == (["7"], "7")
    assert ray.available_resources()["GPU"] == 1.0
    assert _derived(ray.available_resources(), pg)["GPU_group_1"] == 1.0
    # two halves share bundle 1's device
    assert ray.get([half.options(scheduling_strategy=InGroup(pg, 1)).remote()
                    for _ in range(2)], timeout=60) == ["5", "5"]

    @ray.remote(num_gpus=1, num_cpus=0)
    class OnGpu:
        def devices(self):
            return ray.get_gpu_ids()

    actor = OnGpu.options(scheduling_strategy=InGroup(pg, 1)).remote()
    assert ray.get(actor.devices.remote(), timeout=60) == ["5"]
    remove_placement_group(pg)
    assert ray.available_resources()["GPU"] == 3.0


def test_gpu_bundles_that_cannot_be_packed_are_reported(ray_start, capfd):
    ray_start(num_cpus=2, num_gpus=1)
    pg = placement_group([{"GPU": 1}, {"GPU": 1}])
    assert "GPU 2.0 but the node has 1.0" in capfd.readouterr().err
    assert pg.wait(0.2) is False
    half = placement_group([{"GPU": 0.5}, {"GPU": 0.5}])
    assert half.wait(20) is True
    remove_placement_group(pg)
    remove_placement_group(half)


def test_physical_gpus_of_a_group_are_held_in_the_host_gpu_ledger(drivers, tmp_path):
    """A group's physical GPUs are shared with other sessions on the host as a task's are:
    taken in the host ledger while reserved, given back on removal, by this driver or by
    another driver of the node."""
    from .conftest import MINIRAY_PARENT
    from .helpers import FAKE_PYNVML

    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    done = drivers.run("""
        import json, os, miniray as ray
        from miniray._private.ledger.host_gpus import HostGpuLedger
        from miniray.util.placement_group import placement_group, remove_placement_group
        from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as G
        ray.init(num_cpus=2)
        keys = ["GPU-aaaa0000", "GPU-bbbb1111"]
        def held():
            devices = HostGpuLedger().statistics(keys)["devices"]
            return {k: [h["pid"] for h in v["holders"]] for k, v in devices.items()}
        pg = placement_group([{"GPU": 1}])
        ray.get(pg.ready(), timeout=30)
        @ray.remote(num_gpus=1, num_cpus=0)
        def which():
            return ray.get_gpu_ids()
        seen = ray.get(which.options(scheduling_strategy=G(pg)).remote(), timeout=60)
        during = held()
        remove_placement_group(pg)
        after = held()
        # Removed by another driver of the node (its removal drops the ledger's record):
        # this driver's watch gives the host's GPU shares back too, with no work in it.
        import time
        from miniray._private import runtime
        other = placement_group([{"GPU": 1}])
        ray.get(other.ready(), timeout=30)
        during_other = held()
        runtime.current().owner.pgs.ledger.release_group(other.id.hex())
        deadline = time.monotonic() + 20
        while any(held().values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"pid": os.getpid(), "during": during, "after": after,
                          "seen": seen, "during_other": during_other,
                          "after_other": held()}))
        ray.shutdown()
    """, timeout=90, PYTHONPATH=os.pathsep.join([str(fake), MINIRAY_PARENT]),
        FAKE_NVML_DEVICES="Tesla V100-SXM2-16GB|GPU-aaaa0000,Tesla V100-SXM2-16GB|GPU-bbbb1111")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["seen"] == [0]
    assert result["during"]["GPU-aaaa0000"] == [result["pid"]]
    assert result["during"]["GPU-bbbb1111"] == []
    assert result["after"]["GPU-aaaa0000"] == []
    assert sorted(sum(result["during_other"].values(), [])) == [result["pid"]]
    assert result["after_other"] == {"GPU-aaaa0000": [], "GPU-bbbb1111": []}


# -- a node shared by several drivers -------------------------------------------------------------

def _groups_in_ledger(env) -> dict:
    from .helpers import ledger_leases

    return {lease["group"]["name"]: lease for lease in ledger_leases(env).values()
            if lease.get("group")}


CREATOR = """
    import json, os, sys, miniray as ray
    from miniray.util.placement_group import placement_group
    ray.init(address="auto")
    shared = placement_group([{"CPU": 1}], name="shared")
    kept = placement_group([{"CPU": 0.5}], name="kept", lifetime="detached")
    ray.get([shared.ready(), kept.ready()], timeout=30)
    print(json.dumps({"pid": os.getpid(), "shared": shared.id.hex(), "kept": kept.id.hex()}),
          flush=True)
    sys.stdin.readline()
    ray.shutdown()
"""

USER = """
    import json, miniray as ray
    from miniray.util.placement_group import (get_placement_group, placement_group_table,
                                              remove_placement_group)
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as G
    ray.init(address="auto")
    @ray.remote(num_cpus=0.5)
    def inside():
        return ray.get_runtime_context().get_placement_group_id()
    found = {}
    for name in %r:
        try:
            pg = get_placement_group(name)
        except ValueError as error:
            found[name] = str(error)
            continue
        found[name] = [pg.id.hex(), placement_group_table(pg)["state"],
                       ray.get(inside.options(scheduling_strategy=G(pg)).remote(), timeout=30)]
        if %r:
            remove_placement_group(pg)
    print(json.dumps(found), flush=True)
    ray.shutdown()
"""


def test_named_and_detached_groups_are_shared_by_the_drivers_of_a_node(node_env):
    from .helpers import cli, driver, json_line

    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    creator = driver(CREATOR, node_env, stdin=subprocess.PIPE)
    try:
        made = json_line(creator)
        status = cli(node_env, "status").stdout
        assert "Placement groups" in status
        assert made["kept"][:12] in status and "(detached)" in status
        # a second driver finds both by name and runs tasks in them
        user = driver(USER % (["shared", "kept"], False), node_env)
        found = json_line(user)
        assert user.wait(30) == 0, user.stderr.read()
        assert found["shared"] == [made["shared"], "CREATED", made["shared"]]
        assert found["kept"] == [made["kept"], "CREATED", made["kept"]]
        # the creator leaves: its group goes with it, the detached one stays with the node
        creator.stdin.write("bye\n")
        creator.stdin.flush()
        assert creator.wait(30) == 0, creator.stderr.read()
        assert set(_groups_in_ledger(node_env)) == {"kept"}
        user = driver(USER % (["shared", "kept"], True), node_env)
        found = json_line(user)
        assert user.wait(30) == 0, user.stderr.read()
        assert found["shared"] == "Failed to look up placement group with name: shared"
        assert found["kept"][0] == made["kept"]
        assert _groups_in_ledger(node_env) == {}  # removed by the driver that found it
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.wait(10)


def test_a_killed_driver_leaves_no_reservation(node_env):
    from .helpers import cli, driver, json_line, wait_until

    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    creator = driver(CREATOR, node_env, stdin=subprocess.PIPE)
    try:
        made = json_line(creator)
        assert set(_groups_in_ledger(node_env)) == {"shared", "kept"}
        creator.send_signal(signal.SIGKILL)
        creator.wait(10)
        assert wait_until(lambda: set(_groups_in_ledger(node_env)) == {"kept"}, 10)
        user = driver("""
            import json, time, miniray as ray
            ray.init(address="auto")
            deadline = time.time() + 10
            while ray.available_resources().get("CPU", 0) < 1.5 and time.time() < deadline:
                time.sleep(0.05)
            print(json.dumps({"CPU": ray.available_resources().get("CPU", 0)}), flush=True)
            ray.shutdown()
        """, node_env)
        assert json_line(user) == {"CPU": 1.5}  # the detached group's half CPU stays reserved
        assert user.wait(30) == 0, user.stderr.read()
        assert made["shared"] not in json.dumps(_groups_in_ledger(node_env))
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.wait(10)


def test_removal_by_another_driver_ends_the_work_in_the_group(node_env):
    from .helpers import cli, driver, json_line

    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    worker = driver("""
        import json, sys, time, miniray as ray
        from miniray.exceptions import ActorDiedError, TaskPlacementGroupRemoved
        from miniray.util.placement_group import placement_group
        from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as G
        ray.init(address="auto")
        pg = placement_group([{"CPU": 1}, {"CPU": 1}], name="x")
        ray.get(pg.ready(), timeout=30)
        @ray.remote(num_cpus=1)
        def long():
            time.sleep(60)
        @ray.remote(num_cpus=1)
        class Named:
            def ping(self):
                return 1
        ref = long.options(scheduling_strategy=G(pg, 0)).remote()
        actor = Named.options(name="in_x", scheduling_strategy=G(pg, 1)).remote()
        ray.get(actor.ping.remote(), timeout=30)
        # the node's actor service's, waiting for in_x's CPU in the bundle
        waits = Named.options(name="waits", scheduling_strategy=G(pg, 1)).remote()
        time.sleep(0.5)
        print(json.dumps({"ready": True}), flush=True)
        out = {}
        start = time.monotonic()
        try:
            ray.get(ref, timeout=30)
        except TaskPlacementGroupRemoved:
            out["task"] = "removed"
        deadline = time.monotonic() + 20  # each driver notices within about 0.5 s
        while "actor" not in out and time.monotonic() < deadline:
            try:
                ray.get(actor.ping.remote(), timeout=30)
                time.sleep(0.05)
            except ActorDiedError as error:
                out["actor"] = "placement group was removed" in str(error)
        try:  # never started: as in Ray 2.60
            ray.get(waits.ping.remote(), timeout=30)
        except Exception as error:
            out["waits"] = type(error).__name__
        out["seconds"] = time.monotonic() - start
        print(json.dumps(out), flush=True)
        ray.shutdown()
    """, node_env)
    try:
        assert json_line(worker) == {"ready": True}
        remover = driver("""
            import json, miniray as ray
            from miniray.util.placement_group import get_placement_group, remove_placement_group
            ray.init(address="auto")
            remove_placement_group(get_placement_group("x"))
            print(json.dumps({"removed": True}), flush=True)
            ray.shutdown()
        """, node_env)
        assert json_line(remover) == {"removed": True}
        assert remover.wait(30) == 0, remover.stderr.read()
        result = json_line(worker, timeout=60)
        assert worker.wait(30) == 0, worker.stderr.read()
        assert result["task"] == "removed" and result["actor"] is True
        assert result["waits"] == "ActorUnschedulableError", result
        assert result["seconds"] < 20
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def test_reservations_and_removals_take_the_ledger_outside_the_owner_lock(ray):
    """Decide under the owner's lock, act after it: a group's ledger transactions (and the
    ledger reads that look groups up) are made with the lock free, by the driver's thread,
    deferred work and the I/O thread's retries alike."""
    from miniray._private import runtime

    from .test_owner_lock import _assert_exercised_and_free, _LockProbe

    owner = runtime.current().owner
    names = ("acquire_group", "release_group", "groups", "acquire", "adjust")
    probes = [_LockProbe(owner, owner.ledger, name) for name in names]
    try:
        @ray.remote
        def child():
            return 1

        @ray.remote
        def parent():
            return ray.get(child.remote(), timeout=30)  # blocked: lends its bundle's CPU

        @ray.remote(num_cpus=2)
        def busy():
            time.sleep(0.5)

        first = busy.remote()
        time.sleep(0.2)
        pg = placement_group([{"CPU": 1}, {"CPU": 1}], name="locks")  # pending, retried
        assert ray.get(pg.ready(), timeout=30) == pg
        ray.get(first, timeout=30)
        captured = InGroup(pg, placement_group_capture_child_tasks=True)
        assert ray.get(parent.options(scheduling_strategy=captured).remote(), timeout=60) == 1
        assert get_placement_group("locks") == pg
        remove_placement_group(pg)
    finally:
        for probe in probes:
            probe.restore()
    _assert_exercised_and_free(probes)


def test_topology_strategy_names_the_node_level_strategy_as_ray(ray):
    pg = placement_group([{"CPU": 0.5}], topology_strategy={"ray.io/node-id": "STRICT_PACK"})
    assert pg.wait(10) and placement_group_table(pg)["strategy"] == "STRICT_PACK"
    assert placement_group_table(placement_group([{"CPU": 0.5}]))["strategy"] == "PACK"
    with pytest.raises(NotImplementedError, match="no topology labels"):
        placement_group([{"CPU": 0.5}], topology_strategy={"rack": "STRICT_PACK"})
    with pytest.raises(NotImplementedError, match="no labels to select on"):
        placement_group([{"CPU": 0.5}], bundle_label_selector=[{"zone": "a"}])
    soft = placement_group([{"CPU": 0.5}], "STRICT_PACK",
                           _soft_target_node_id=ray.get_runtime_context().get_node_id())
    assert soft.wait(10)
    for group in placement_group_table():
        remove_placement_group(PlacementGroup(miniray.PlacementGroupID(bytes.fromhex(group))))


def test_the_state_api_lists_groups_and_names_the_group_of_tasks_and_actors(ray):
    from miniray.util import state

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], name="seen")
    ray.get(pg.ready(), timeout=30)

    @ray.remote
    def nap():
        time.sleep(30)

    @ray.remote(num_cpus=1)
    class Member:
        def ping(self):
            return 1

    ref = nap.options(scheduling_strategy=InGroup(pg, 0)).remote()
    actor = Member.options(scheduling_strategy=InGroup(pg, 1)).remote()
    ray.get(actor.ping.remote(), timeout=30)
    [row] = state.list_placement_groups()
    assert row["placement_group_id"] == pg.id.hex() and row["name"] == "seen"
    [task] = [t for t in state.list_tasks(detail=True) if t["name"] == "nap"]
    assert task["placement_group_id"] == pg.id.hex()
    [member] = state.list_actors(detail=True)
    assert member["placement_group_id"] == pg.id.hex()
    ray.cancel(ref, force=True)
    remove_placement_group(pg)
