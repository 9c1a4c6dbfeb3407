"""The events of ``ray.timeline()`` and ``miniray timeline``: Chrome trace format (pure).

Mirrors the layout of ``ray.timeline`` (Ray 2.60). Differs: miniray records no profiling
events of its own (``ray.get``, ``submit_task``); a span per finished task, actor call or
actor constructor is made from the times its worker sent with the result (or with
ACTOR_READY), and the time a task waited in the queue (submitted to started) is in the
span's ``args``.

Owns: turning the spans each driver reports (``owner/state_records.spans``) into complete
events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds): one ``task::<name>`` event for
the whole call, and inside it ``task:deserialize_arguments``, ``task:execute`` and
``task:store_outputs``, as Ray shows them, with Ray's colour names (``cname``). Rows are
laid out as Ray's trace viewer layout does: ``pid`` is a node, ``tid`` a worker process,
both small integers (viewers such as Perfetto want integers) named by metadata events
(``"ph": "M"``: ``process_name`` "Node <ip>", ``thread_name`` "worker:<worker id>",
followed by the pid the output prefixes show).
Does not own: recording the times (``worker/execute.result_message``), nor gathering the
drivers (``state_api.timeline``).
"""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

# A RESULT's times: the worker's time_ns() at start, arguments loaded, call returned and
# result made, packed (32 bytes): the driver keeps the bytes as they came (one small bytes
# object per result, where four large ints would be unpickled on the task path) and unpacks
# them only when a reader asks.
TIMES = struct.Struct("<4q")

# Ray's colour names of its task events (a trace viewer's reserved colour names).
_COLOURS = {
    "task": "generic_work",
    "task:deserialize_arguments": "rail_load",
    "task:execute": "rail_animation",
    "task:store_outputs": "rail_idle",
}
# The keys of every complete ("X") event; a metadata ("M") event has name, args, pid, tid.
REQUIRED_KEYS = ("cat", "name", "pid", "tid", "ts", "dur", "ph", "cname", "args")


class Span(NamedTuple):
    """One finished task or actor call as its driver reports it (a JSON list).

    ``name``: what the event shows (Ray's: the function's qualified name for a task, the
    method's name for an actor call); ``category``: the task's name (``f``, ``A.m``), the
    event's ``cat`` being ``task::<category>``; ``times``: the worker's ``time_ns()`` at
    start, arguments loaded, call returned and result sent; ``created``: when the driver
    queued it (seconds since the epoch; None for an actor call)."""

    task_id: str
    name: str
    category: str
    actor_id: str | None
    pid: int
    created: float | None
    times: list
    failed: bool


def unpack_times(raw: bytes | None) -> tuple | None:
    """A RESULT's packed ``times`` as four ints (ns), None if it has none."""
    if not raw:
        return None
    try:
        return TIMES.unpack(raw)
    except (struct.error, TypeError):  # not ours: shown as a call without times
        return None


def worker_id(pid: int) -> str:
    """The worker id ``ray.util.state`` rows give a worker process (``list_workers``)."""
    return f"{pid:056x}"


def _us(ns: int) -> float:
    return ns / 1000.0


def span_events(span: Span, job_id: str, pid: int, tid: int) -> list[dict]:
    """The complete events of one span, on row ``(pid, tid)``."""
    start, loaded, returned, end = (list(span.times) + [None] * 4)[:4]
    if start is None or end is None:
        return []
    loaded = start if loaded is None else loaded
    returned = loaded if returned is None else returned
    args = {"name": span.name, "task_id": span.task_id, "job_id": job_id,
            "attempt_number": 0, "func_or_class_name": span.category,
            "actor_id": span.actor_id, "failed": span.failed}
    if span.created is not None:
        # Submitted to started: the time it waited for a worker (or behind another task).
        args["queue_delay_us"] = max(0.0, _us(start) - span.created * 1e6)
    out = [{"cat": f"task::{span.category}", "name": span.name, "pid": pid, "tid": tid,
            "ts": _us(start), "dur": _us(end - start), "ph": "X",
            "cname": _COLOURS["task"], "args": args}]
    for phase, begin, finish in (("task:deserialize_arguments", start, loaded),
                                 ("task:execute", loaded, returned),
                                 ("task:store_outputs", returned, end)):
        out.append({"cat": phase, "name": phase, "pid": pid, "tid": tid, "ts": _us(begin),
                    "dur": _us(max(0, finish - begin)), "ph": "X",
                    "cname": _COLOURS[phase], "args": {}})
    return out


def trace_events(drivers: Iterable[dict], node_ip: str = "127.0.0.1") -> list[dict]:
    """Every driver's spans (``{"driver": ids, "spans": [...]}`` each) as one list of
    Chrome trace events, ordered by start time, then the metadata naming the rows."""
    nodes: dict[str, int] = {}
    rows: dict[tuple[int, int], int] = {}
    events: list[dict] = []
    for doc in drivers:
        ids = doc.get("driver") or {}
        spans = doc.get("spans") or ()
        if not spans:  # a node is named only where something ran
            continue
        node = nodes.setdefault(str(ids.get("node_id")), len(nodes))
        for raw in spans:
            span = Span(*raw)
            tid = rows.setdefault((node, span.pid), len(rows))
            events.extend(span_events(span, ids.get("job_id"), node, tid))
    # The whole call before its phases at the same start: viewers nest by order.
    events.sort(key=lambda e: (e["ts"], not e["cat"].startswith("task::")))
    # Metadata events carry only what Ray's do: name, args, pid, tid (None: the node's).
    for _node_id, index in nodes.items():
        events.append({"name": "process_name", "args": {"name": f"Node {node_ip}"},
                       "pid": index, "tid": None, "ph": "M"})
    for (node, pid), index in rows.items():
        row = f"worker:{worker_id(pid)} (pid {pid})"
        events.append({"name": "thread_name", "args": {"name": row}, "pid": node,
                       "tid": index, "ph": "M"})
    return events
