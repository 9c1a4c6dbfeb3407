"""The Chrome trace events of ``ray.timeline()`` built from drivers' spans (pure).

The layout was compared with Ray 2.60's ``ray.timeline()``: complete events (``"ph": "X"``)
with ``cat``, ``name``, ``pid``, ``tid``, ``ts`` and ``dur`` in microseconds, ``cname`` and
``args``; a task's event ``task::<name>`` named by its qualified function name, an actor
call's named by its method, with ``task:deserialize_arguments``, ``task:execute`` and
``task:store_outputs`` inside; rows named by ``process_name``/``thread_name`` metadata.
"""

from __future__ import annotations

import json

from miniray._private.core import timeline_events as tl

MS = 1_000_000  # ns


def _driver(node: str, job: str, spans: list) -> dict:
    return {"driver": {"node_id": node, "job_id": job}, "spans": spans}


def _task(task_id: str, pid: int, start_ms: int, end_ms: int, created_s=None):
    times = [start_ms * MS, (start_ms + 1) * MS, (end_ms - 1) * MS, end_ms * MS]
    return [task_id, "__main__.f", "f", None, pid, created_s, times, False]


def test_a_task_is_one_span_with_rays_three_phases_inside():
    events = tl.trace_events([_driver("n1", "01000000", [_task("aa", 7, 1000, 1010, 0.995)])])
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["cat"] for e in spans] == ["task::f", "task:deserialize_arguments",
                                         "task:execute", "task:store_outputs"]
    whole = spans[0]
    assert whole["name"] == "__main__.f" and whole["cname"] == "generic_work"
    assert whole["ts"] == 1000 * 1000.0 and whole["dur"] == 10 * 1000.0
    assert whole["args"]["task_id"] == "aa" and whole["args"]["job_id"] == "01000000"
    assert whole["args"]["queue_delay_us"] == 5000.0  # submitted 5 ms before it started
    for phase in spans[1:]:  # inside the whole span, on its row
        assert whole["ts"] <= phase["ts"] <= phase["ts"] + phase["dur"] <= whole["ts"] + \
            whole["dur"]
        assert (phase["pid"], phase["tid"]) == (whole["pid"], whole["tid"])
    for event in spans:
        assert all(key in event for key in tl.REQUIRED_KEYS)
    json.dumps(events)  # what the file holds


def test_rows_are_workers_and_nodes_named_by_metadata():
    events = tl.trace_events([
        _driver("n1", "01000000", [_task("a", 7, 0, 5), _task("b", 8, 0, 5)]),
        _driver("n1", "02000000", [_task("c", 9, 1, 2)]),
        _driver("n2", "03000000", [_task("d", 7, 1, 2)]),
    ])
    rows = {e["args"]["task_id"]: (e["pid"], e["tid"]) for e in events
            if e["ph"] == "X" and e["cat"] == "task::f"}
    assert rows["a"][0] == rows["b"][0] == rows["c"][0] != rows["d"][0]
    assert len(set(rows.values())) == 4  # the same pid on another node is another row
    meta = [e for e in events if e["ph"] == "M"]
    assert sorted(e["name"] for e in meta) == ["process_name"] * 2 + ["thread_name"] * 4
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert names[rows["a"]] == f"worker:{7:056x} (pid 7)"


def test_an_actor_call_is_named_by_its_method():
    call = ["cc", "m", "A.m", "ab" * 16, 5, None, [0, 10, 20, 30], True]
    (whole, *_phases) = [e for e in tl.trace_events([_driver("n", "01", [call])])
                         if e["ph"] == "X"]
    assert (whole["cat"], whole["name"]) == ("task::A.m", "m")
    assert whole["args"]["actor_id"] == "ab" * 16 and whole["args"]["failed"] is True
    assert "queue_delay_us" not in whole["args"]


def test_spans_without_times_make_no_event_and_no_work_no_row():
    assert tl.trace_events([]) == []
    assert tl.trace_events([_driver("n", "01", [])]) == []  # no row named for nothing
    short = ["x", "f", "f", None, 3, None, [], False]
    events = tl.trace_events([_driver("n", "01", [short])])
    assert [e for e in events if e["ph"] == "X"] == []


def test_events_are_ordered_by_start():
    events = tl.trace_events([_driver("n", "01", [_task("late", 1, 50, 60),
                                                  _task("early", 2, 10, 20)])])
    starts = [e["ts"] for e in events if e["ph"] == "X"]
    assert starts == sorted(starts)


def test_packed_times_round_trip_and_foreign_bytes_are_no_times():
    raw = tl.TIMES.pack(1, 2, 3, 4)
    assert len(raw) == 32 and tl.unpack_times(raw) == (1, 2, 3, 4)
    assert tl.unpack_times(None) is None and tl.unpack_times(b"short") is None
