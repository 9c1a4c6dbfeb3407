"""``miniray status`` formatting, on fabricated ledger states (no processes)."""

from __future__ import annotations

import json
import os

from miniray._private.core.resources import UNIT, Lease, NodeState
from miniray._private.ledger.ledger import Ledger
from miniray._private.node.node_status import (
    NodeView,
    collect,
    format_bytes,
    format_status,
    format_uptime,
)
from miniray._private.transport import node_client

NOW = 1_800_000_000.0
GIB = 1 << 30


def lease(lid, holder, resources, gpus=(), tag=""):
    units = {k: round(v * UNIT) for k, v in resources.items()}
    instances = {"GPU": [(i, round(f * UNIT)) for i, f in gpus]} if gpus else {}
    return Lease(lid, holder, 1, None, units, instances, tag)


def state(*leases, gpus=("0", "1")):
    totals = {"CPU": 4 * UNIT, "GPU": len(gpus) * UNIT, "foo": 2 * UNIT,
              "memory": 16 * GIB * UNIT, "object_store_memory": 2 * GIB * UNIT,
              "node:127.0.0.1": UNIT, "node:__internal_head__": UNIT}
    return NodeState(totals=totals, instance_ids={"GPU": list(gpus)},
                     leases={le.lease_id: le for le in leases})


def view(st, **kw):
    defaults = dict(node_id="ab" * 28, pid=4242, address="127.0.0.1:6379",
                    started_at=NOW - 3725, session_dir="/r/session_x", state=st)
    defaults.update(kw)
    return NodeView(**defaults)


def rows(text: str) -> dict:
    """First word of each line -> the rest, split on whitespace."""
    return {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}


def section(text: str, title: str) -> str:
    """The lines of the section starting with ``title`` up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def test_format_bytes_and_uptime():
    assert format_bytes(0) == "0B"
    assert format_bytes(1023) == "1023B"
    assert format_bytes(1536) == "1.50KiB"
    assert format_bytes(15.23 * GIB) == "15.23GiB"
    assert format_bytes(100_000_000) == "95.37MiB"
    assert format_uptime(42) == "42s"
    assert format_uptime(185) == "3m05s"
    assert format_uptime(3725) == "1h02m"
    assert format_uptime(3 * 86400 + 4 * 3600) == "3d04h"
    assert format_uptime(-5) == "0s"


def test_idle_node():
    out = format_status([view(state())], None, NOW)
    assert out.startswith("======== miniray status: ")
    assert out.endswith("\n")
    node = rows(section(out, "Node status"))
    assert node["node_" + "ab" * 6] == ["4242", "127.0.0.1:6379", "1h02m", "session_x"]
    res = rows(section(out, "Resources"))
    assert res["CPU"] == ["0", "4", "4"]
    assert res["GPU"] == ["0", "2", "2"]
    assert res["foo"] == ["0", "2", "2"]
    assert res["memory"] == ["0B", "16.00GiB", "16.00GiB"]
    assert res["object_store_memory"] == ["0B", "2.00GiB", "2.00GiB"]
    assert not any(name.startswith("node:") for name in res)
    assert list(res)[3:] == ["CPU", "GPU", "foo", "memory", "object_store_memory"]
    assert "(none)" in section(out, "Running tasks and actors")
    assert "Host GPU ledger" not in out and "Drivers" not in out


def test_busy_node_resources_gpus_and_grouped_leases():
    st = state(
        lease("a", 100, {"CPU": 1}, tag="CPU=1"),
        lease("b", 100, {"CPU": 1}, tag="CPU=1"),
        lease("c", 100, {"CPU": 1}, tag="CPU=1"),
        lease("d", 200, {"CPU": 0.5, "GPU": 0.5}, gpus=[(0, 0.5)], tag="CPU=0.5,GPU=0.5"),
        lease("e", 200, {"GPU": 1, "foo": 1}, gpus=[(1, 1.0)], tag="actor Trainer"),
        lease("f", 300, {"CPU": 1}, tag="actor Counter"),
    )
    out = format_status([view(st, dead_holders=frozenset({300}))], None, NOW)
    res = rows(section(out, "Resources"))
    assert res["CPU"] == ["4.5", "4", "-0.5"]  # oversubscribed: shown as it is
    assert res["GPU"] == ["1.5", "2", "0.5"]
    assert res["foo"] == ["1", "2", "1"]
    gpus = section(out, "GPUs").splitlines()[2:]
    assert gpus[1].split() == ["0", "0", "0.5", "0.5", "#####.....", "(logical)"]
    assert gpus[2].split() == ["1", "1", "1", "0", "##########", "(logical)"]
    leases = section(out, "Running tasks and actors").splitlines()[2:]
    assert leases[0].split() == ["count", "driver", "what", "resources"]
    assert leases[1].split() == ["3", "100", "CPU=1", "CPU=1"]
    assert leases[2].split() == ["1", "200", "CPU=0.5,GPU=0.5", "CPU=0.5,", "GPU=0.5"]
    assert leases[3].split() == ["1", "200", "actor", "Trainer", "GPU=1,", "foo=1"]
    assert leases[4].split() == ["1", "300", "(dead)", "actor", "Counter", "CPU=1"]


def test_gpu_device_keys_drivers_and_host_ledger():
    st = state(lease("a", 100, {"GPU": 0.25}, gpus=[(0, 0.25)], tag="GPU=0.25"), gpus=["3"])
    host = {"path": "/h/gpus.json", "leases": 2, "devices": {
        "GPU-aaaa": {"used": 0.75, "free": 0.25, "holders": [
            {"pid": 100, "tag": "GPU=0.25", "fraction": 0.25, "lease_id": "x", "alive": True},
            {"pid": 77, "tag": "", "fraction": 0.5, "lease_id": "y", "alive": False},
        ]},
    }}
    drivers = [{"pid": 100, "workers": 2, "leaving": False},
               {"pid": 101, "workers": 0, "leaving": True}]
    out = format_status([view(st, gpu_keys=["GPU-aaaa"], drivers=drivers)], host, NOW)
    gpus = section(out, "GPUs").splitlines()[2:]
    assert gpus[1].split() == ["0", "3", "0.25", "0.75", "##........", "GPU-aaaa"]
    assert section(out, "Drivers").splitlines()[2:] == [
        " pid 100: 2 worker(s)", " pid 101: 0 worker(s) (leaving)"]
    host_lines = section(out, "Host GPU ledger (/h/gpus.json)").splitlines()[2:]
    assert host_lines[1].split()[:3] == ["GPU-aaaa", "0.75", "0.25"]
    assert "pid 100 0.25 [GPU=0.25], pid 77 (dead) 0.5" in host_lines[1]


def test_empty_host_ledger_unreadable_ledger_and_several_nodes():
    host = {"path": "/h/gpus.json", "leases": 0, "devices": {}}
    nodes = [view(None, node_id="cd" * 28, pid=1, session_dir="/r/session_a"),
             view(state(), node_id="ef" * 28, pid=2, address="127.0.0.1:6380")]
    out = format_status(nodes, host, NOW)
    node = rows(section(out, "Node status"))
    assert node["node_" + "cd" * 6][0] == "1" and node["node_" + "ef" * 6][1] == "127.0.0.1:6380"
    assert "(ledger unreadable in /r/session_a)" in out
    assert "Resources (node efefefefefef)" in out
    assert "(no GPU leased by any miniray session)" in out
    broken = format_status(nodes[1:], {"path": "/h/gpus.json", "error": "bad"}, NOW)
    assert "(unreadable: bad)" in broken


def test_collect_reads_files_without_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRAY_HOST_DIR", str(tmp_path / "host"))
    sdir = tmp_path / "session_1"
    sdir.mkdir()
    ledger = Ledger.create(str(sdir / "ledger.json"), {"CPU": 2}, {})
    ledger.acquire({"CPU": 1}, holder_pid=os.getpid(), tag="CPU=1")
    with open(sdir / "node_stats.json", "w") as f:
        json.dump({"drivers": [{"pid": 5, "workers": 1, "leaving": False}]}, f)
    record = node_client.NodeRecord(pid=os.getpid(), start_time=None, address="127.0.0.1:6379",
                                    port=6379, socket=str(sdir / "node.sock"),
                                    session_dir=str(sdir), started_at=NOW, node_id="ab" * 28)
    # the ledger's lock is held (a writer mid-transaction): status must not wait for it
    with ledger._locked():
        views, host = collect([record])
    assert host is None  # no host GPU ledger on this "host"
    (v,) = views
    assert v.state.used() == {"CPU": UNIT}
    assert v.drivers == [{"pid": 5, "workers": 1, "leaving": False}]
    assert v.dead_holders == frozenset()
    missing = node_client.NodeRecord(pid=1, start_time=None, address="a:1", port=1, socket="",
                                     session_dir=str(tmp_path / "gone"), started_at=NOW)
    views, _ = collect([missing])
    assert views[0].state is None and views[0].drivers is None


def test_status_says_what_other_pid_namespaces_own():
    """Sessions and segments of another PID namespace sharing the root are never swept from
    here; status says how many were left alone, and says nothing when there are none."""
    quiet = format_status([view(state())], None, NOW, {"sessions": 0, "segments": 0})
    assert "PID namespaces" not in quiet
    out = format_status([view(state())], None, NOW, {"sessions": 1, "segments": 3})
    assert "1 session(s) / 3 segment(s) of other PID namespaces left alone" in out


def test_object_store_row_shows_what_the_drivers_stores_hold():
    """The store is never leased, so the ledger says 0 used: the row adds up the stores'
    bytes in memory instead (the Object stores section's numbers)."""
    mib = 1 << 20
    stores = {11: {"objects": 1, "bytes_in_memory": 10 * mib, "capacity": 2 * GIB},
              12: {"objects": 2, "bytes_in_memory": 6 * mib, "capacity": 2 * GIB}}
    text = format_status([view(state(), stores=stores)], None, NOW)
    resources = rows(section(text, "Resources"))
    assert resources["object_store_memory"][:2] == ["16.00MiB", "2.00GiB"]
    bare = rows(section(format_status([view(state())], None, NOW), "Resources"))
    assert bare["object_store_memory"][0] == "0B"  # no store statistics: nothing to add


def test_verbose_lists_each_drivers_demands_by_name_and_shape():
    stores = {
        200: {"objects": 0, "demands": [["f", "CPU=1", 3, False], ["big", "CPU=64", 1, True]]},
        100: {"objects": 0, "demands": [["actor A", "CPU=1, GPU=1", 1, False]]},
    }
    plain = format_status([view(state(), stores=stores)], None, NOW)
    assert "Demands" not in plain
    out = format_status([view(state(), stores=stores)], None, NOW, verbose=True)
    lines = section(out, "Demands").splitlines()[2:]
    assert [line.split(None, 2) for line in lines][1:] == [
        ["100", "1", "actor A  {CPU=1, GPU=1}"],
        ["200", "3", "f        {CPU=1}"],
        ["200", "1", "big      {CPU=64} (infeasible)"],
    ]
    assert lines[0].split() == ["driver", "count", "what", "resources"]
    idle = format_status([view(state(), stores={5: {"objects": 0}})], None, NOW, verbose=True)
    assert "(none)" in section(idle, "Demands")


def test_placement_groups_have_a_section_and_short_resource_names():
    from miniray._private.core import placement

    hex_ = "cd" * 18
    bundles = [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    group = lease("g", 100, {"CPU": 2, "GPU": 1}, gpus=[(0, 1.0)], tag="placement group train")
    group.provides = {k: round(v * UNIT) for k, v in
                      placement.bundle_provides(hex_, bundles).items()}
    group.group = {"id": hex_, "name": "train", "strategy": "PACK", "bundles": bundles,
                   "detached": True}
    task = lease("t", 100, placement.rewrite_request({"CPU": 1}, hex_, 1), tag="in group")
    out = format_status([view(state(group, task))], None, NOW)
    groups = rows(section(out, "Placement groups"))
    assert groups[hex_[:12]][:4] == ["train", "PACK", "100", "(detached)"]
    assert "CPU 1/2, GPU 0/1" in section(out, "Placement groups")
    assert f"CPU_group_1_{hex_[:8]}=1" in section(out, "Running tasks and actors")
    assert "Placement groups" not in format_status([view(state())], None, NOW)


def test_results_kept_for_remote_drivers_show_as_a_total_and_per_driver():
    kept = [{"driver": "remote driver 127.0.0.1 pid 11", "objects": 3, "bytes": 3 << 20,
             "cap": 1 << 30},
            {"driver": "remote driver 127.0.0.3 pid 12", "objects": 1, "bytes": 1 << 20,
             "cap": 1 << 30}]
    out = format_status([view(state(), kept=kept)], None, NOW)
    lines = out.splitlines()
    at = lines.index("Objects kept for remote drivers: 4, 4.00MiB")
    assert lines[at + 1:at + 3] == [
        " remote driver 127.0.0.1 pid 11: 3 object(s), 3.00MiB of its 1.00GiB cap",
        " remote driver 127.0.0.3 pid 12: 1 object(s), 1.00MiB of its 1.00GiB cap"]
    assert "Objects kept for remote drivers: 0, 0B" in format_status(
        [view(state(), kept=[])], None, NOW)  # a node other hosts reach: the line, always
    assert "Objects kept" not in format_status([view(state())], None, NOW)
