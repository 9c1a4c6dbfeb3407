"""What ``miniray status`` prints: nodes, resources, per-GPU use, leases, the host GPU ledger.

Owns: reading a node's files without taking any lock (``collect``: ``node.json``, the ledger
snapshot, ``node_stats.json``, the host GPU ledger's ``statistics()``; each is replaced
atomically by its writer, so a busy node never blocks or tears what is read) and formatting
them (``format_status``, a pure function of plain data, unit-tested without processes).
Does not own: the files' formats (``node_client.py``, ``ledger.py``, ``host_gpus.py``).
Called by: ``cli.py`` (``miniray status``).

Mirrors ``ray status`` (Ray 2.60) in spirit: a timestamped header, node status, the cluster's
Active/Dead nodes (``cluster_section``: with each member's heartbeat age in the head's view,
and a hint to move to Ray past ``PEERING_HINT_NODES``), then usage as ``used/total name``
lines. Differs: no autoscaler (no pending nodes);
instead it shows what Ray's CLI does not: each GPU's fractional use, the leases (running tasks
grouped by resource shape, actors by class) with the driver holding them, and the host GPU
ledger shared by every miniray session on the host, and on a node other hosts reach, the
results it keeps for their drivers (``_kept_lines``). ``-v`` adds the demands: what each
driver has waiting for resources, by function name and shape (Ray's hidden ``-v`` prints
debugging details instead).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from miniray._private.core import config, placement
from miniray._private.core.resources import UNIT, NodeState, from_units
from miniray._private.host import procinfo, session
from miniray._private.ledger.host_gpus import LEDGER_NAME, HostGpuLedger, default_host_dir
from miniray._private.ledger.ledger import Ledger
from miniray._private.object_store import shm_segments
from miniray._private.transport import node_client

__all__ = ["NodeView", "collect", "collect_embedded", "format_bytes", "format_status",
           "format_uptime"]

RULE = "-" * 72
_BYTES = ("memory", "object_store_memory")


@dataclass
class NodeView:
    """One node as status shows it: plain data, so formatting needs no files or processes."""

    node_id: str
    pid: int
    address: str
    started_at: float
    session_dir: str
    state: NodeState | None  # None: the ledger could not be read
    drivers: list[dict] | None = None  # node_stats.json's "drivers"
    dead_holders: frozenset = field(default_factory=frozenset)  # lease holders no longer alive
    gpu_keys: list = field(default_factory=list)
    stores: dict = field(default_factory=dict)  # driver pid -> its object store's statistics
    embedded: bool = False  # an init() session: the node lives in its driver
    cluster: dict | None = None  # the view the node publishes (node_client.read_cluster)
    kept: list | None = None  # node_stats.json's "kept": results kept for remote drivers


def collect(records: Sequence[Any]) -> tuple[list[NodeView], dict | None]:
    """Reads what status shows for ``records`` (``node_client.NodeRecord``): the nodes, and
    the host GPU ledger's statistics when that ledger exists (else None). Lock-free."""
    views = []
    keys: list[str] = []
    for record in records:
        state = None
        try:
            state = Ledger(os.path.join(record.session_dir, "ledger.json")).snapshot()
        except (OSError, ValueError):
            pass
        drivers = kept = None
        try:
            with open(os.path.join(record.session_dir, node_client.NODE_STATS)) as f:
                stats = json.load(f)
            drivers, kept = stats.get("drivers"), stats.get("kept")
        except (OSError, ValueError, AttributeError):
            pass
        holders = {(lease.holder_pid, lease.holder_start)
                   for lease in (state.leases.values() if state else ())}
        dead = frozenset(pid for pid, start in holders if not procinfo.is_alive(pid, start))
        views.append(NodeView(record.node_id, record.pid, record.address, record.started_at,
                              record.session_dir, state, drivers, dead, list(record.gpu_keys),
                              _store_stats(record.session_dir),
                              cluster=node_client.read_cluster(record.session_dir), kept=kept))
        keys += [k for k in record.gpu_keys if k and k not in keys]
    host = None
    host_dir = default_host_dir()
    if os.path.exists(os.path.join(host_dir, LEDGER_NAME)):
        try:
            host = HostGpuLedger(host_dir).statistics(keys)
        except (OSError, ValueError, RuntimeError) as error:
            host = {"path": os.path.join(host_dir, LEDGER_NAME), "error": str(error)}
    return views, host


def collect_embedded(root: str, timeout: float = 5.0) -> list[NodeView]:
    """The live ``init()`` sessions of ``root`` (no ``miniray start`` node: the driver is the
    node), each read from its driver's state socket (``state_api.gather``) and ledger."""
    from miniray._private import state_api  # lazy: only status and the state CLI need it

    views = []
    for path in state_api.live_sessions(root):
        if os.path.exists(os.path.join(path, node_client.RECORD_FILE)):
            continue  # a node's session: collect() shows it
        try:
            gathered = state_api.gather(path, timeout, root)
        except (OSError, ValueError):
            continue
        docs = gathered[0].drivers if gathered else []
        if not docs:
            continue  # starting or leaving: nothing to show yet
        driver = docs[0]["driver"]
        state = None
        try:
            state = Ledger(os.path.join(path, "ledger.json")).snapshot()
        except (OSError, ValueError):
            pass
        drivers = [{"pid": d["driver"]["pid"],
                    "workers": sum(1 for w in d["workers"] if w["worker_type"] == "WORKER")}
                   for d in docs]
        stores = {d["driver"]["pid"]: d["driver"].get("store") or {} for d in docs}
        views.append(NodeView(driver["node_id"], driver["pid"], "(embedded in its driver)",
                              driver["started_at"], path, state, drivers, frozenset(), [],
                              stores, embedded=True))
    return views


# ------------------------------------------------------------------------------ formatting


def _store_stats(session_dir: str) -> dict:
    """The store statistics each connected driver publishes (live drivers only)."""
    folder = os.path.join(session_dir, session.STORE_STATS_DIR)
    out = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        pid = int(name[:-5])
        if not procinfo.is_alive(pid):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                out[pid] = json.load(f)
        except (OSError, ValueError):
            continue
    return out


# The dashboard shows the same published statistics (and the demands in them).
published_stats = _store_stats


def format_bytes(n: float) -> str:
    """``0B``, ``512.00KiB``, ``15.23GiB``: Ray's style for memory quantities."""
    n = float(n)
    if n < 1024:
        return f"{n:.0f}B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.2f}{unit}"
    raise AssertionError("unreachable")


def format_uptime(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _qty(name: str, units: int) -> str:
    value = from_units(units)
    return format_bytes(value) if name in _BYTES else f"{value:g}"


def _shape(resources: dict[str, int]) -> str:
    parts = [f"{_short(name)}={_qty(name, u)}"
             for name, u in sorted(resources.items(), key=_order)]
    return ", ".join(parts) or "(none)"


def _short(name: str) -> str:
    """A placement group's derived resource with its id cut to 8 characters."""
    parsed = placement.parse_derived(name) if "_group_" in name else None
    if parsed is None:
        return name
    base, index, hex_ = parsed
    return f"{base}_group_{'' if index is None else f'{index}_'}{hex_[:8]}"


def _group_rows(state) -> list[list[str]]:
    """One row per reserved placement group: id, name, strategy, holder, bundles and how
    much of its CPU/GPU the work in it uses now."""
    avail = state.available()
    rows = []
    for hex_, lease in sorted(state.groups().items()):
        g = lease.group
        bundles = " ".join("{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(b.items())) + "}"
                           for b in g.get("bundles", []))
        used = []
        for base in ("CPU", "GPU"):
            name = f"{base}_group_{hex_}"
            total = lease.provides.get(name, 0)
            if total:
                used.append(f"{base} {(total - max(0, avail.get(name, 0))) / UNIT:g}/"
                            f"{total / UNIT:g}")
        holder = f"{lease.holder_pid}" + (" (detached)" if g.get("detached") else "")
        rows.append([hex_[:12], g.get("name") or "-", g.get("strategy", "?"), holder,
                     bundles, ", ".join(used) or "-"])
    return rows


def _order(item) -> tuple:
    name = item[0] if isinstance(item, tuple) else item
    rank = {"CPU": 0, "GPU": 1, "memory": 3, "object_store_memory": 4}.get(name, 2)
    return (rank, name)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Aligned columns, one leading space per line; columns in ``right`` right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths)):
            out.append(str(cell).rjust(w) if i in right else str(cell).ljust(w))
        return (" " + "  ".join(out)).rstrip()

    return [line(header)] + [line(r) for r in rows]


def _node_sections(view: NodeView, verbose: bool = False) -> list[str]:
    out = [f"Resources (node {view.node_id[:12]})", RULE]
    state = view.state
    if state is None:
        return out + [f" (ledger unreadable in {view.session_dir})", ""]
    used = dict(state.used())
    if view.stores:  # the store is not leased: its use is what the drivers' stores hold
        used["object_store_memory"] = round(UNIT * sum(
            st.get("bytes_in_memory", 0) for st in view.stores.values()))
    rows = []
    for name, total in sorted(state.totals.items(), key=_order):
        if name.startswith("node:"):
            continue
        u = used.get(name, 0)
        rows.append([name, _qty(name, u), _qty(name, total), _qty(name, total - u)])
    out += _table(["resource", "used", "total", "available"], rows, {1, 2, 3})
    out.append("")
    gpu_ids = state.instance_ids.get("GPU", [])
    if gpu_ids:
        out += ["GPUs", RULE]
        rows = []
        for index, (gpu_id, free) in enumerate(zip(gpu_ids, state.instance_free("GPU"))):
            share = (UNIT - free) / UNIT
            bar = "#" * round(share * 10) + "." * (10 - round(share * 10))
            key = view.gpu_keys[index] if index < len(view.gpu_keys) else None
            rows.append([str(index), gpu_id, f"{share:g}", f"{free / UNIT:g}", bar,
                         key or "(logical)"])
        out += _table(["#", "id", "used", "free", "", "device"], rows, {2, 3})
        out.append("")
    group_rows = _group_rows(state)
    if group_rows:
        out += ["Placement groups", RULE]
        out += _table(["id", "name", "strategy", "held by", "bundles", "in use"], group_rows,
                      set())
        out.append("")
    out += ["Running tasks and actors (leases)", RULE]
    groups: dict[tuple, int] = {}
    for lease in state.leases.values():
        key = (lease.holder_pid, lease.tag, tuple(sorted(lease.resources.items())))
        groups[key] = groups.get(key, 0) + 1
    if not groups:
        out.append(" (none)")
    else:
        rows = []
        for (pid, tag, shape), count in sorted(groups.items(), key=lambda kv: (kv[0][0],
                                                                               kv[0][1])):
            holder = f"{pid} (dead)" if pid in view.dead_holders else str(pid)
            rows.append([str(count), holder, tag or "-", _shape(dict(shape))])
        out += _table(["count", "driver", "what", "resources"], rows, {0})
    out.append("")
    if view.drivers is not None:
        out += ["Drivers", RULE]
        if not view.drivers:
            out.append(" (none connected)")
        for d in view.drivers:
            left = " (leaving)" if d.get("leaving") else ""
            role = " (actor service: named and detached actors)" if d.get("actor_service") else ""
            out.append(f" pid {d.get('pid')}: {d.get('workers', 0)} worker(s){role}{left}")
        out.append("")
    if view.kept is not None:  # a node that serves drivers on other hosts
        out += _kept_lines(view.kept)
    if view.stores:
        out += ["Object stores (one per driver)", RULE]
        rows = [[str(pid), str(st.get("objects", 0)), format_bytes(st.get("bytes_in_memory", 0)),
                 format_bytes(st.get("bytes_spilled", 0)), str(st.get("pinned", 0)),
                 format_bytes(st.get("capacity", 0))]
                for pid, st in sorted(view.stores.items())]
        out += _table(["driver", "objects", "in memory", "spilled", "pinned", "capacity"], rows,
                      {1, 2, 3, 4, 5})
        out.append("")
    if verbose:
        out += _demands_section(view)
    return out


def _kept_lines(kept: list) -> list[str]:
    """Results this node keeps in its shm dir for drivers on other hosts (until they pull
    or free them): the total, then each driver's share of its cap.

    >>> for line in _kept_lines([{"driver": "remote driver 127.0.0.1 pid 7", "objects": 2,
    ...                           "bytes": 3 << 20, "cap": 1 << 30}]):
    ...     print(line)
    Objects kept for remote drivers: 2, 3.00MiB
     remote driver 127.0.0.1 pid 7: 2 object(s), 3.00MiB of its 1.00GiB cap
    <BLANKLINE>
    """
    rows = [row for row in kept if isinstance(row, dict)]
    count = sum(int(row.get("objects", 0)) for row in rows)
    size = sum(int(row.get("bytes", 0)) for row in rows)
    out = [f"Objects kept for remote drivers: {count}, {format_bytes(size)}"]
    for row in rows:
        out.append(f" {row.get('driver', '?')}: {row.get('objects', 0)} object(s), "
                   f"{format_bytes(row.get('bytes', 0))} of its "
                   f"{format_bytes(row.get('cap') or 0)} cap")
    out.append("")
    return out


def _demands_section(view: NodeView) -> list[str]:
    """What each driver has waiting for resources (published once a second with its store
    statistics): Ray's "Demands" of ``ray status``, per driver, by function name and shape."""
    out = ["Demands (waiting for resources, per driver)", RULE]
    rows = []
    for pid, st in sorted(view.stores.items()):
        for name, shape, count, infeasible in st.get("demands") or ():
            rows.append([str(pid), str(count), name,
                         "{" + shape + "}" + (" (infeasible)" if infeasible else "")])
    if not rows:
        return out + [" (none)", ""]
    return out + _table(["driver", "count", "what", "resources"], rows, {1}) + [""]


def _host_section(host: dict) -> list[str]:
    out = [f"Host GPU ledger ({host.get('path')})", RULE]
    if host.get("error"):
        return out + [f" (unreadable: {host['error']})", ""]
    devices = host.get("devices", {})
    if not devices:
        return out + [" (no GPU leased by any miniray session)", ""]
    rows = []
    for key, d in devices.items():
        holders = ", ".join(
            f"pid {h['pid']}{'' if h.get('alive') is not False else ' (dead)'} "
            f"{h['fraction']:g}" + (f" [{h['tag']}]" if h.get("tag") else "")
            for h in d.get("holders", [])
        )
        rows.append([key, f"{d['used']:g}", f"{d['free']:g}", holders or "-"])
    return out + _table(["device", "used", "free", "held by"], rows, {1, 2}) + [""]


def foreign_line(foreign: dict | None) -> str | None:
    """``"N session(s) / M segment(s) of other PID namespaces left alone"`` when there are any
    (``foreign``: ``{"sessions": N, "segments": M}``, from ``collect_foreign``)."""
    if not foreign or not (foreign.get("sessions") or foreign.get("segments")):
        return None
    return (f"{foreign.get('sessions', 0)} session(s) / {foreign.get('segments', 0)} "
            "segment(s) of other PID namespaces left alone (their owners cannot be checked "
            "from here; they are removed from their own namespace)")


def collect_foreign(root: str) -> dict:
    """Sessions under ``root`` and segments of ``root`` owned by other PID namespaces."""
    prefix = f"{shm_segments.SEGMENT_PREFIX}{session.root_tag(root)}"
    return {"sessions": len(session.foreign_sessions(root)),
            "segments": shm_segments.foreign_segment_count(config.shm_dir(),
                                                           prefix)}


def _is_cluster(doc: dict | None) -> bool:
    """Whether a node's published view is worth a section: it is a member, or a head that
    has (or had) members. A lone head's section would repeat the node table."""
    if not doc:
        return False
    nodes = (doc.get("view") or {}).get("nodes") or []
    return not doc.get("is_head") or len(nodes) > 1


def _resource_line(entry) -> str:
    parts = []
    for name, total in sorted(entry.totals.items(), key=lambda kv: _order((kv[0], 0))):
        if name.startswith("node:"):
            continue
        free = entry.available.get(name, 0.0) if entry.alive else 0.0
        if name in _BYTES:
            parts.append(f"{format_bytes(total - free)}/{format_bytes(total)} {name}")
        else:
            parts.append(f"{total - free:g}/{total:g} {name}")
    return ", ".join(parts)


PEERING_HINT_NODES = 8  # more alive nodes than this: one hint line to move to Ray


def heartbeat_text(age: float | None) -> str:
    """``", heartbeat 0.4 s ago"`` for a member's last heartbeat age; "" when unknown."""
    if age is None:
        return ""
    return f", heartbeat {age:.1f} s ago" if age < 60 else \
        f", heartbeat {format_uptime(age)} ago"


def peering_hint(alive: int) -> str | None:
    """The hint for a cluster of ``alive`` nodes past ``PEERING_HINT_NODES`` (else None)."""
    if alive <= PEERING_HINT_NODES:
        return None
    return (f"Hint: this cluster has {alive} nodes; miniray's peering is meant for a few "
            "hosts. Past that, run the same program on Ray (README: \"When you outgrow "
            "miniray\").")


def cluster_section(doc: dict, now: float) -> list[str]:
    """The cluster a node belongs to (its published view ``doc``): Ray's "Active:" and
    "Dead:" lines, each node with its used/total resources (from its last heartbeat) and,
    in a head's view, the age of that heartbeat, or its death reason; a hint past
    ``PEERING_HINT_NODES`` alive nodes. Pure (``now`` is ``time.time()``)."""
    from miniray._private.core.cluster_view import (  # lazy: status only
        ClusterView,
        heartbeat_age,
    )

    try:
        view = ClusterView.from_snapshot(doc.get("view"))
    except (ValueError, TypeError):
        return []
    link = "" if doc.get("is_head") or doc.get("linked") else \
        " (this node's link to the head is down: rejoining; the view may be stale)"
    out = [f"Cluster (head {doc.get('head')}){link}", RULE, "Active:"]
    for entry in sorted(view.alive(), key=lambda e: (not e.is_head, e.start_time)):
        head = " (head)" if entry.is_head else ""
        age = heartbeat_text(heartbeat_age(doc, entry, now))
        out.append(f" node_{entry.node_id[:12]} {entry.address}{head}: "
                   f"{_resource_line(entry)}{age}")
    out.append("Dead:")
    dead = view.dead()
    if not dead:
        out.append(" (no dead nodes)")
    for entry in dead:
        out.append(f" node_{entry.node_id[:12]} {entry.address}: {entry.death_message}")
    hint = peering_hint(len(view.alive()))
    return out + ([hint] if hint else []) + [""]


def format_status(nodes: Sequence[NodeView], host: dict | None, now: float,
                  foreign: dict | None = None, verbose: bool = False) -> str:
    """The whole report for ``nodes`` (``now`` is ``time.time()``, for uptimes and the
    header; ``foreign`` as for ``foreign_line``; ``verbose`` adds the demands), ending with
    a newline. Pure: everything it shows is in its arguments."""
    stamp = datetime.datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S")
    out = [f"======== miniray status: {stamp} ========", "Node status", RULE]
    rows = [[f"node_{v.node_id[:12]}", f"{v.pid} (driver)" if v.embedded else str(v.pid),
             v.address,
             format_uptime(now - v.started_at), os.path.basename(v.session_dir)] for v in nodes]
    out += _table(["node", "pid", "address", "uptime", "session"], rows, {1})
    out.append("")
    shown: set = set()  # a head's view first: it has the heartbeat ages
    for view in sorted(nodes, key=lambda v: not (v.cluster or {}).get("is_head")):
        if _is_cluster(view.cluster) and view.cluster.get("head") not in shown:
            shown.add(view.cluster.get("head"))
            out += cluster_section(view.cluster, now)
    for view in nodes:
        out += _node_sections(view, verbose)
    if host is not None:
        out += _host_section(host)
    line = foreign_line(foreign)
    if line:
        out += [line, ""]
    return "\n".join(out).rstrip("\n") + "\n"
