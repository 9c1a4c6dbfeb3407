"""Rows of the state API: their columns, filters, summaries and printed forms (pure).

Owns: each resource's columns as Ray 2.60 lists them (``ray.util.state.common``: the
default columns, the ``detail`` ones, the filterable ones), the row types (``ActorState``,
``TaskState``, ...: dicts whose keys read as attributes too, as Ray's schemas do), checking
and applying ``filters`` (Ray's ``[(key, "=" | "!=", value)]``; strings compare without
case), ``limit``, the summaries (``summarize_tasks/actors/objects``'s documents), and the
CLI's output: Ray's ``default``/``table`` listing, ``json``, ``yaml``, the summary tables,
``miniray memory``. Everything here is a function of plain data, unit-tested without
processes.
Does not own: gathering rows (``state_api.py``), nor the snapshot (``owner/state_records.py``).
"""

from __future__ import annotations

import collections
import datetime
import json
from typing import Any, Iterable, Sequence

# resource -> (default columns, detail-only columns, filterable columns); Ray 2.60's order.
SCHEMAS: dict[str, tuple[tuple[str, ...], tuple[str, ...], frozenset]] = {
    "actors": (
        ("actor_id", "class_name", "state", "job_id", "name", "node_id", "pid",
         "ray_namespace"),
        ("serialized_runtime_env", "required_resources", "death_cause", "is_detached",
         "placement_group_id", "repr_name", "num_restarts",
         "num_restarts_due_to_lineage_reconstruction", "num_restarts_due_to_node_preemption",
         "call_site"),
        frozenset({"actor_id", "class_name", "job_id", "name", "node_id", "pid",
                   "placement_group_id", "ray_namespace", "repr_name", "state"})),
    "tasks": (
        ("task_id", "attempt_number", "name", "state", "job_id", "actor_id", "type",
         "func_or_class_name", "parent_task_id", "node_id", "worker_id", "worker_pid",
         "error_type"),
        ("language", "required_resources", "runtime_env_info", "placement_group_id",
         "creation_time_ms", "start_time_ms", "end_time_ms", "error_message", "call_site"),
        frozenset({"actor_id", "attempt_number", "error_type", "func_or_class_name",
                   "is_debugger_paused", "job_id", "language", "name", "node_id",
                   "parent_task_id", "placement_group_id", "state", "task_id", "type",
                   "worker_id", "worker_pid"})),
    "objects": (
        ("object_id", "object_size", "task_status", "attempt_number", "reference_type",
         "call_site", "type", "pid", "ip"),
        ("node_id",),  # miniray's: where the value is (a result kept on its node: that node)
        frozenset({"attempt_number", "call_site", "ip", "node_id", "object_id", "object_size",
                   "pid", "reference_type", "task_status", "type"})),
    "nodes": (
        ("node_id", "node_ip", "is_head_node", "state", "state_message", "node_name",
         "resources_total", "labels"),
        ("start_time_ms", "end_time_ms"),
        frozenset({"is_head_node", "node_id", "node_ip", "node_name", "state"})),
    "workers": (
        ("worker_id", "is_alive", "worker_type", "exit_type", "node_id", "ip", "pid"),
        ("exit_detail", "worker_launch_time_ms", "worker_launched_time_ms", "start_time_ms",
         "end_time_ms", "debugger_port", "num_paused_threads"),
        frozenset({"debugger_port", "exit_type", "ip", "is_alive", "node_id",
                   "num_paused_threads", "pid", "worker_id", "worker_type"})),
    "jobs": (
        ("job_id", "submission_id", "entrypoint", "type", "status", "message", "error_type",
         "driver_info"),
        ("start_time", "end_time", "metadata", "runtime_env", "driver_exit_code"),
        frozenset({"job_id", "status", "submission_id", "type"})),
    "placement_groups": (
        ("placement_group_id", "name", "creator_job_id", "state"),
        ("bundles", "is_detached", "stats"),
        frozenset({"creator_job_id", "is_detached", "name", "placement_group_id", "state"})),
}
RESOURCES = tuple(SCHEMAS)
ID_COLUMN = {"actors": "actor_id", "tasks": "task_id", "objects": "object_id",
             "nodes": "node_id", "workers": "worker_id", "jobs": "job_id",
             "placement_groups": "placement_group_id"}
PREDICATES = ("=", "!=")


class _Row(dict):
    """A row: Ray's schema objects are read as ``row.state`` and as ``row["state"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def asdict(self) -> dict:
        return dict(self)


class ActorState(_Row):
    pass


class TaskState(_Row):
    pass


class ObjectState(_Row):
    pass


class NodeState(_Row):
    pass


class WorkerState(_Row):
    pass


class JobState(_Row):
    pass


class PlacementGroupState(_Row):
    pass


ROW_TYPES = {"actors": ActorState, "tasks": TaskState, "objects": ObjectState,
             "nodes": NodeState, "workers": WorkerState, "jobs": JobState,
             "placement_groups": PlacementGroupState}


def columns(resource: str, detail: bool) -> tuple[str, ...]:
    default, extra, _ = SCHEMAS[resource]
    return default + extra if detail else default


def check_filters(resource: str, filters) -> list[tuple[str, str, Any]]:
    """``filters`` as a list of ``(column, predicate, value)``, columns lowercased.
    ValueError naming the problem and what is allowed (Ray's messages)."""
    out = []
    for item in filters or ():
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"A filter must be a (key, predicate, value) tuple, got {item!r}.")
        key, predicate, value = item
        if predicate not in PREDICATES:
            raise ValueError(f"Unsupported filter predicate {predicate} is given. "
                             "Available predicates: =, !=.")
        key = str(key).lower()
        allowed = SCHEMAS[resource][2]
        if key not in allowed:
            raise ValueError(
                f"The given filter column {key} is not supported. Enter filters with "
                f"--filter key=value or --filter key!=value Supported filter columns: "
                f"{sorted(allowed)}")
        out.append((key, predicate, value))
    return out


def _matches(cell: Any, value: Any) -> bool:
    if isinstance(cell, str) and isinstance(value, str):
        return cell.lower() == value.lower()
    if isinstance(value, str) and cell is not None and not isinstance(cell, str):
        if isinstance(cell, bool):
            return str(cell).lower() == value.lower()
        try:
            return type(cell)(value) == cell
        except (TypeError, ValueError):
            return False
    return cell == value


def apply_filters(rows: Iterable[dict], filters: Sequence[tuple[str, str, Any]]) -> list[dict]:
    """The rows every filter accepts (a row without the column matches no filter)."""
    out = []
    for row in rows:
        keep = True
        for key, predicate, value in filters:
            if key not in row:
                keep = False
            else:
                same = _matches(row[key], value)
                keep = same if predicate == "=" else not same
            if not keep:
                break
        if keep:
            out.append(row)
    return out


def shape(resource: str, rows: Iterable[dict], detail: bool) -> list:
    """Rows of ``resource`` typed, with only its (default or detail) columns."""
    cols = columns(resource, detail)
    cls = ROW_TYPES[resource]
    return [cls((c, row.get(c)) for c in cols) for row in rows]


def parse_filter(text: str) -> tuple[str, str, str]:
    """``key=value`` or ``key!=value`` (the CLI's ``--filter``) as a filter tuple."""
    for predicate in ("!=", "="):
        key, sep, value = text.partition(predicate)
        if sep and key and "=" not in key and "!" not in key:
            return key.strip(), predicate, value.strip()
    raise ValueError(f"Invalid filter {text!r}: write key=value or key!=value.")


# ----------------------------------------------------------------------------- summaries


def summarize_tasks(rows: Iterable[dict]) -> dict:
    """Ray's ``summarize_tasks()`` document for the rows of ``list_tasks(detail=True)``."""
    summary: dict[str, dict] = {}
    total = actor_tasks = actor_scheduled = 0
    for row in rows:
        name = row.get("func_or_class_name") or row.get("name")
        entry = summary.setdefault(name, {"func_or_class_name": name, "type": row.get("type"),
                                          "state_counts": {}})
        counts = entry["state_counts"]
        counts[row["state"]] = counts.get(row["state"], 0) + 1
        total += 1
        if row.get("type") == "ACTOR_TASK":
            actor_tasks += 1
        elif row.get("type") == "ACTOR_CREATION_TASK":
            actor_scheduled += 1
    return {"cluster": {"summary": summary, "total_tasks": total,
                        "total_actor_tasks": actor_tasks,
                        "total_actor_scheduled": actor_scheduled,
                        "summary_by": "func_name"}}


def summarize_actors(rows: Iterable[dict]) -> dict:
    summary: dict[str, dict] = {}
    total = 0
    for row in rows:
        entry = summary.setdefault(row["class_name"], {"class_name": row["class_name"],
                                                        "state_counts": {}})
        counts = entry["state_counts"]
        counts[row["state"]] = counts.get(row["state"], 0) + 1
        total += 1
    return {"cluster": {"summary": summary, "total_actors": total, "summary_by": "class"}}


def summarize_objects(rows: Iterable[dict]) -> dict:
    """Objects grouped by call site (``disabled`` unless recorded, as in Ray)."""
    summary: dict[str, dict] = {}
    total = 0
    size = 0.0
    for row in rows:
        site = row.get("call_site") or "disabled"
        entry = summary.setdefault(site, {
            "total_objects": 0, "total_size_mb": 0.0, "total_num_workers": 0,
            "total_num_nodes": 0, "task_state_counts": {}, "task_attempt_number_counts": {},
            "ref_type_counts": {}, "_pids": set(), "_nodes": set()})
        entry["total_objects"] += 1
        mb = max(0, row.get("object_size") or 0) / (1024 * 1024)
        entry["total_size_mb"] += mb
        entry["_pids"].add(row.get("pid"))
        entry["_nodes"].add(row.get("ip"))
        for key, value in (("task_state_counts", row.get("task_status")),
                           ("task_attempt_number_counts", str(row.get("attempt_number", 0))),
                           ("ref_type_counts", row.get("reference_type"))):
            entry[key][value] = entry[key].get(value, 0) + 1
        total += 1
        size += mb
    for entry in summary.values():
        entry["total_num_workers"] = len(entry.pop("_pids"))
        entry["total_num_nodes"] = len(entry.pop("_nodes"))
    return {"cluster": {"summary": summary, "total_objects": total, "total_size_mb": size,
                        "callsite_enabled": False, "summary_by": "callsite"}}


# ----------------------------------------------------------------------------- printing


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for rows (dicts, lists, scalars): what ``--format yaml`` prints."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{key}: {_scalar(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            text = to_yaml(item, indent + 2) if isinstance(item, (dict, list)) else None
            if text is None:
                out.append(f"{pad}- {_scalar(item)}\n")
            else:
                out.append(f"{pad}- {text.lstrip()}")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    text = str(value)
    if (not text or text.strip() != text or any(c in text for c in ":#{}[]&*!|>'\"%@`,\n")
            or text.lower() in ("null", "true", "false", "yes", "no", "~")
            or _number_like(text)):
        return json.dumps(text)
    return text


def _number_like(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return to_yaml(value).rstrip("\n").replace("\n", "; ") if value else "{}"
    return str(value)


def _plain_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Columns as Ray's ``tabulate(..., showindex=True, tablefmt="plain")``: an index column,
    then each column left-aligned (numbers right-aligned), two spaces between."""
    cells = [[str(i)] + [_cell(v) for v in row] for i, row in enumerate(rows)]
    head = [""] + list(headers)
    numeric = [all(isinstance(row[i - 1], (int, float)) and not isinstance(row[i - 1], bool)
                   for row in rows if row[i - 1] is not None) if i else True
               for i in range(len(head))]
    widths = [max([len(head[i])] + [len(r[i]) for r in cells]) for i in range(len(head))]

    def line(items) -> str:
        return "  ".join(item.rjust(w) if numeric[i] else item.ljust(w)
                         for i, (item, w) in enumerate(zip(items, widths))).rstrip()

    return [line(head)] + [line(r) for r in cells]


def format_list(resource: str, rows: Sequence[dict], fmt: str, detail: bool,
                now: datetime.datetime | None = None) -> str:
    """What ``miniray list <resource>`` prints (Ray's layout), for ``fmt`` one of
    ``default``, ``table``, ``json``, ``yaml``."""
    if fmt == "json":
        return json.dumps([dict(r) for r in rows])
    if fmt == "yaml":
        return "".join("---\n" + to_yaml(dict(r)) for r in rows) + "..." if rows else "[]"
    if fmt not in ("default", "table"):
        raise ValueError(f"Unexpected format: {fmt}. Supported formatting: "
                         "['default', 'json', 'yaml', 'table']")
    if not rows:
        return "No resource in the cluster"
    cols = [c for c in columns(resource, detail) if any(c in r for r in rows)]
    stamp = now or datetime.datetime.now()
    table = _plain_table([c.upper() for c in cols], [[r.get(c) for c in cols] for r in rows])
    return "\n".join([
        "", "=" * 8 + f" List: {stamp} " + "=" * 8, "Stats:", "-" * 30,
        f"Total: {len(rows)}", "", "Table:", "-" * 30, *table, ""])


def format_get(rows: Sequence[dict], ident: str, fmt: str) -> str:
    """What ``miniray get <resource> <id>`` prints: the row in YAML (Ray's default)."""
    if not rows:
        return f"Resource with id={ident} not found in the cluster."
    if fmt == "json":
        return json.dumps([dict(r) for r in rows])
    return "".join("---\n" + to_yaml(dict(r)) for r in rows) + "..."


def format_summary(resource: str, doc: dict, now: datetime.datetime | None = None) -> str:
    """What ``miniray summary <resource>`` prints (Ray's layout)."""
    cluster = dict(doc.get("cluster") or {})
    if not cluster:
        return "No resource in the cluster"
    summaries = cluster.pop("summary")
    summary_by = cluster.pop("summary_by")
    stamp = now or datetime.datetime.now()
    title = "Object" if resource == "objects" else resource.capitalize()
    out = ["", "=" * 8 + f" {title} Summary: {stamp} " + "=" * 8, "Stats:", "-" * 36,
           to_yaml(cluster).rstrip("\n"), ""]
    if resource == "objects":
        out += [f"Table (group by {summary_by})", "-" * 36]
        for site, summary in summaries.items():
            headers = sorted(k.upper() for k in summary)
            out += [site] + _plain_table(headers, [[summary[h.lower()] for h in headers]])
            out += [""]
    else:
        out += [f"Table (group by {summary_by}):", "-" * 36]
        headers = sorted({k.upper() for s in summaries.values() for k in s})
        out += _plain_table(headers, [[s.get(h.lower()) for h in headers]
                                      for s in summaries.values()])
    return "\n".join(out) + "\n"


_REF_COUNTS = (("LOCAL_REFERENCE", "Local References"), ("PINNED_IN_MEMORY", "Pinned"),
               ("USED_BY_PENDING_TASK", "Used by task"),
               ("CAPTURED_IN_OBJECT", "Captured in Objects"), ("ACTOR_HANDLE", "Actor Handles"))
_SUMMARY_ROW = "{:<19}  {:<16}  {:<12}  {:<13}  {:<19}  {:<13}\n"
_REF_ROW = "{:<13} | {:<8} | {:<7} | {:<9} | {:<9} | {:<8} | {:<8} | {:<14} | {:<10}\n"
_SORT_NAMES = {"PID": "pid", "OBJECT_SIZE": "object size", "REFERENCE_TYPE": "reference type"}
_MIB = 1024 * 1024
MEMORY_UNITS = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9}
MEMORY_SORTS = tuple(_SORT_NAMES)
# Ray groups by node or by call site; a driver here owns its objects, so rows are grouped by
# driver whichever is asked (README, Differences).
MEMORY_GROUPS = ("NODE_ADDRESS", "STACK_TRACE")


def format_memory(drivers: Sequence[dict], objects_by_pid: dict[int, list[dict]],
                  now: datetime.datetime | None = None, sort_by: str = "OBJECT_SIZE",
                  num_entries: int | None = None, units: str = "B",
                  stats_only: bool = False) -> str:
    """``miniray memory``: Ray's ``ray memory`` layout, grouped by driver (each driver owns
    its objects and its store) instead of by node: a summary of its references by kind with
    their sizes, then each reference; last, the stores' totals, alone when ``stats_only``.
    Sizes in ``units`` (Ray's: B, KB, MB, GB, powers of ten); whole bytes print as
    integers."""
    scale = MEMORY_UNITS[units]

    def size_text(n: int) -> str:
        return f"{n if units == 'B' else n / scale} {units}"

    sums: dict[str, float] = collections.Counter()
    for driver in drivers:
        sums.update({k: v for k, v in (driver.get("store") or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
    used, capacity = sums["bytes_in_memory"], sums["capacity"]
    full = round(100 * used / capacity, 2) if capacity else 0
    totals = ["--- Aggregate object store stats across all drivers ---\n",
              # Ray's line, its "needed" included: every object here is a primary copy.
              f"Plasma memory usage {used // _MIB} MiB, {sums['objects']} objects, {full}% "
              f"full, {full}% needed\n"]
    for word, moved, count, seconds, way in (
            ("Spilled", "bytes_spilled_total", "spills", "spill_seconds", "write"),
            ("Restored", "bytes_restored_total", "restores", "restore_seconds", "read")):
        if sums[seconds] > 0:  # Ray's lines: totals since start, not what is on disk now
            totals.append(f"{word} {int(sums[moved] // _MIB)} MiB, {sums[count]} objects, "
                          f"avg {way} throughput {int(sums[moved] / _MIB / sums[seconds])} "
                          "MiB/s\n")
    if stats_only:
        return "".join(totals)
    stamp = now or datetime.datetime.now()
    out = ["=" * 8 + f" Object references status: {stamp} " + "=" * 8 + "\n",
           f"Grouping by driver...        Sorting by {_SORT_NAMES.get(sort_by, sort_by)}..."
           f"        Display {num_entries if num_entries is not None else 'all'} entries "
           "per group...\n\n\n"]
    for driver in drivers:
        pid = driver.get("pid")
        rows = objects_by_pid.get(pid, [])
        sizes = [max(0, r.get("object_size") or 0) for r in rows]
        summary = [size_text(sum(sizes))]
        for kind, _label in _REF_COUNTS:
            mine = [max(0, r.get("object_size") or 0) for r in rows
                    if r.get("reference_type") == kind]
            summary.append(f"{len(mine)}, ({size_text(sum(mine))})")
        out += [f"--- Summary for driver: pid {pid} ---\n",
                _SUMMARY_ROW.format("Mem Used by Objects",
                                    *(label for _kind, label in _REF_COUNTS)),
                _SUMMARY_ROW.format(*summary) + "\n",
                f"--- Object references for driver: pid {pid} ---\n",
                _REF_ROW.format("IP Address", "PID", "Type", "Call Site", "Status", "Attempt",
                                "Size", "Reference Type", "Object Ref")]
        for row in rows[:num_entries] if num_entries is not None else rows:
            size = row.get("object_size")
            out.append(_REF_ROW.format(
                row.get("ip") or "127.0.0.1", str(row.get("pid", pid)),
                str(row.get("type") or "Driver").capitalize(),
                str(row.get("call_site") or "disabled"), str(row.get("task_status")),
                str(row.get("attempt_number", 0)),
                size_text(size) if size is not None and size > -1 else "?",
                str(row.get("reference_type")), str(row.get("object_id"))))
        out.append("\n")
    return "".join(out + totals)
