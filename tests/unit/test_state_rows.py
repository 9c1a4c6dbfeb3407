"""The state API's pure parts: filters, columns, summaries and printed forms.

Compared with Ray 2.60 (``ray.util.state``): filter errors' wording, ``=``/``!=`` with
strings compared without case, the default and detail columns, the summary documents
(``{"cluster": {...}}``), the ``List:`` layout of ``ray list``.
"""

from __future__ import annotations

import datetime
import json

import pytest

from miniray._private.core import state_rows

ROWS = [
    {"task_id": "a", "name": "f", "state": "RUNNING", "type": "NORMAL_TASK",
     "func_or_class_name": "f", "worker_pid": 10, "error_type": None},
    {"task_id": "b", "name": "g", "state": "FAILED", "type": "NORMAL_TASK",
     "func_or_class_name": "g", "worker_pid": 11, "error_type": "TASK_EXECUTION_EXCEPTION"},
    {"task_id": "c", "name": "A.m", "state": "FINISHED", "type": "ACTOR_TASK",
     "func_or_class_name": "A.m", "worker_pid": 12, "error_type": None},
]
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5)


def test_filters_equal_and_not_equal_without_case():
    checked = state_rows.check_filters("tasks", [("STATE", "=", "running")])
    assert [r["task_id"] for r in state_rows.apply_filters(ROWS, checked)] == ["a"]
    checked = state_rows.check_filters("tasks", [("state", "!=", "RUNNING")])
    assert [r["task_id"] for r in state_rows.apply_filters(ROWS, checked)] == ["b", "c"]


def test_filter_values_of_numbers_given_as_strings():
    checked = state_rows.check_filters("tasks", [("worker_pid", "=", "11")])
    assert [r["task_id"] for r in state_rows.apply_filters(ROWS, checked)] == ["b"]


def test_bad_filters_say_what_is_allowed():
    with pytest.raises(ValueError, match=r"Available predicates: =, !="):
        state_rows.check_filters("tasks", [("state", "~", "x")])
    with pytest.raises(ValueError, match="filter column colour is not supported"):
        state_rows.check_filters("actors", [("colour", "=", "x")])
    with pytest.raises(ValueError, match=r"\(key, predicate, value\)"):
        state_rows.check_filters("actors", ["state=ALIVE"])


def test_parse_filter_of_the_cli():
    assert state_rows.parse_filter("state=RUNNING") == ("state", "=", "RUNNING")
    assert state_rows.parse_filter("state!=RUNNING") == ("state", "!=", "RUNNING")
    with pytest.raises(ValueError, match="key=value"):
        state_rows.parse_filter("state")


def test_shape_keeps_default_columns_unless_detail():
    row = dict(ROWS[1], error_message="boom", end_time_ms=5)
    [plain] = state_rows.shape("tasks", [row], detail=False)
    assert "error_message" not in plain and plain["state"] == "FAILED"
    assert list(plain)[:4] == ["task_id", "attempt_number", "name", "state"]
    [full] = state_rows.shape("tasks", [row], detail=True)
    assert full.error_message == "boom" and isinstance(full, state_rows.TaskState)
    assert full.asdict()["end_time_ms"] == 5


def test_summaries():
    doc = state_rows.summarize_tasks(ROWS)["cluster"]
    assert doc["total_tasks"] == 3 and doc["total_actor_tasks"] == 1
    assert doc["summary"]["g"] == {"func_or_class_name": "g", "type": "NORMAL_TASK",
                                   "state_counts": {"FAILED": 1}}
    actors = state_rows.summarize_actors([{"class_name": "A", "state": "ALIVE"},
                                          {"class_name": "A", "state": "DEAD"}])["cluster"]
    assert actors["summary"]["A"]["state_counts"] == {"ALIVE": 1, "DEAD": 1}
    objects = state_rows.summarize_objects([
        {"object_size": 1 << 20, "pid": 1, "ip": "127.0.0.1", "task_status": "FINISHED",
         "reference_type": "LOCAL_REFERENCE", "attempt_number": 0, "call_site": "disabled"},
    ])["cluster"]
    assert objects["total_size_mb"] == 1.0
    assert objects["summary"]["disabled"]["ref_type_counts"] == {"LOCAL_REFERENCE": 1}


def test_list_output_as_ray_lays_it_out():
    rows = state_rows.shape("tasks", ROWS, detail=False)
    text = state_rows.format_list("tasks", rows, "default", False, NOW)
    lines = text.splitlines()
    assert lines[1] == "======== List: 2026-01-02 03:04:05 ========"
    assert lines[2:5] == ["Stats:", "-" * 30, "Total: 3"]
    header = lines[8]
    assert header.split()[:4] == ["TASK_ID", "ATTEMPT_NUMBER", "NAME", "STATE"]
    assert lines[10].split()[:2] == ["1", "b"] and "TASK_EXECUTION_EXCEPTION" in lines[10]
    assert state_rows.format_list("tasks", [], "default", False) == "No resource in the cluster"
    assert json.loads(state_rows.format_list("tasks", rows, "json", False))[0]["name"] == "f"
    with pytest.raises(ValueError, match="Unexpected format"):
        state_rows.format_list("tasks", rows, "xml", False)


def test_yaml_quotes_what_would_read_back_as_another_type():
    text = state_rows.to_yaml({"job_id": "01000000", "name": "f", "x": None, "ok": True,
                               "d": {"CPU": 1.0}, "msg": "a: b"})
    assert text.splitlines() == ['job_id: "01000000"', "name: f", "x: null", "ok: true",
                                 "d:", "  CPU: 1.0", 'msg: "a: b"']


def test_get_output_and_not_found():
    assert state_rows.format_get([], "abc", "default") == \
        "Resource with id=abc not found in the cluster."
    assert "state: ALIVE" in state_rows.format_get([{"state": "ALIVE"}], "abc", "default")


def test_memory_report_as_ray_lays_it_out_per_driver():
    text = state_rows.format_memory(
        [{"pid": 7, "node_id": "n" * 56, "store": {"bytes_in_memory": 3 << 20, "objects": 1,
                                                   "capacity": 30 << 20}}],
        {7: [{"object_id": "o1", "reference_type": "LOCAL_REFERENCE", "type": "DRIVER",
              "task_status": "FINISHED", "object_size": 3 << 20, "call_site": "disabled",
              "ip": "127.0.0.1", "pid": 7, "attempt_number": 0}]},
        NOW, num_entries=5)
    lines = text.splitlines()
    assert lines[0] == "======== Object references status: 2026-01-02 03:04:05 ========"
    assert "Sorting by object size..." in lines[1] and "Display 5 entries" in lines[1]
    at = lines.index("--- Summary for driver: pid 7 ---")
    assert lines[at + 1].split("  ")[0] == "Mem Used by Objects"
    assert lines[at + 2].split()[:4] == ["3145728", "B", "1,", "(3145728"]
    row = [cell.strip() for cell in lines[at + 6].split("|")]
    assert row == ["127.0.0.1", "7", "Driver", "disabled", "FINISHED", "0", "3145728 B",
                   "LOCAL_REFERENCE", "o1"]
    assert lines[-1] == "Plasma memory usage 3 MiB, 1 objects, 10.0% full, 10.0% needed"


def test_memory_report_in_rays_units_and_totals_alone():
    drivers = [{"pid": 7, "store": {"bytes_in_memory": 3 << 20, "objects": 2,
                                    "capacity": 30 << 20}},
               {"pid": 8, "store": {"bytes_in_memory": 1 << 20, "objects": 1,
                                    "capacity": 10 << 20}}]
    objects = {7: [{"object_id": "o1", "reference_type": "LOCAL_REFERENCE",
                    "object_size": 2_500_000}], 8: []}
    text = state_rows.format_memory(drivers, objects, NOW, units="MB")
    assert "| 2.5 MB " in text  # Ray's units are powers of ten
    summary = text.splitlines()[text.splitlines().index("--- Summary for driver: pid 7 ---")
                                + 2]
    assert summary.split()[:4] == ["2.5", "MB", "1,", "(2.5"]
    totals = state_rows.format_memory(drivers, objects, NOW, stats_only=True)
    assert totals.splitlines() == [  # both drivers' stores summed, no reference table
        "--- Aggregate object store stats across all drivers ---",
        "Plasma memory usage 4 MiB, 3 objects, 10.0% full, 10.0% needed"]
    drivers[0]["store"].update(bytes_spilled_total=40 << 20, spills=4, spill_seconds=0.5,
                               restores=0, restore_seconds=0.0, shm_dir="/dev/shm")
    drivers[1]["store"].update(bytes_spilled_total=10 << 20, spills=1, spill_seconds=0.5)
    assert state_rows.format_memory(drivers, objects, NOW, stats_only=True).splitlines()[2:] \
        == ["Spilled 50 MiB, 5 objects, avg write throughput 50 MiB/s"]  # none restored
