"""``ray.timeline()`` and ``miniray timeline``: the finished tasks and actor calls of the live
drivers as a Chrome trace.

Compared with Ray 2.60's ``ray.timeline()``: it returns a list of event dicts without a
filename and writes that list as JSON with one (returning None); it works inside a task;
it raises RuntimeError before ``init()``; a task's event is ``task::<name>`` named by its
qualified function name, an actor call's ``task::<Class.method>`` named by the method;
``ray timeline`` writes ``ray-timeline-<date>_<time>.json`` and says where.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .helpers import cli, driver, json_line, stop_driver

_KEYS = ("cat", "name", "pid", "tid", "ts", "dur", "ph", "cname", "args")


def _check_trace(events: list) -> list:
    """The complete events of a trace a viewer can load: every key, numbers where numbers
    go, rows named by metadata. Returns the complete events."""
    assert isinstance(events, list)
    spans = [e for e in events if e["ph"] == "X"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M"}
    for event in spans:
        assert all(key in event for key in _KEYS), event
        assert isinstance(event["ts"], float) and event["dur"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert (event["pid"], event["tid"]) in named
    return spans


def _whole(spans: list) -> list:
    return [e for e in spans if e["cat"].startswith("task::")]


def test_tasks_and_actor_calls_appear_with_names_and_worker_times(ray, tmp_path):
    @ray.remote
    def step(x):
        time.sleep(0.02)
        return x

    @ray.remote
    class Counter:
        def add(self, x):
            return x

    before_us = time.time() * 1e6
    for i in range(3):  # one after the other: their spans on a worker must not overlap
        ray.get(step.remote(i))
    counter = Counter.remote()
    assert ray.get([counter.add.remote(i) for i in range(2)]) == [0, 1]
    after_us = time.time() * 1e6

    path = tmp_path / "trace.json"
    assert ray.timeline(filename=str(path)) is None
    with open(path) as f:
        spans = _check_trace(json.load(f))
    whole = _whole(spans)
    steps = [e for e in whole if e["cat"] == "task::step"]
    calls = [e for e in whole if e["cat"] == "task::Counter.add"]
    assert len(steps) == 3 and len(calls) == 2
    assert all(e["name"].endswith("test_timeline.step") for e in steps)  # module-qualified
    assert {e["name"] for e in calls} == {"add"}
    for event in steps + calls:
        assert before_us <= event["ts"] <= event["ts"] + event["dur"] <= after_us
        assert event["args"]["job_id"] == ray.get_runtime_context().get_job_id()
    for event in steps:  # as the worker measured: the 20 ms sleep is inside
        assert event["dur"] >= 20_000
        assert event["args"]["queue_delay_us"] >= 0
    by_row: dict = {}
    for event in steps:
        by_row.setdefault((event["pid"], event["tid"]), []).append(event)
    for row in by_row.values():
        row.sort(key=lambda e: e["ts"])
        for first, second in zip(row, row[1:]):
            assert first["ts"] + first["dur"] <= second["ts"]
    (init,) = [e for e in whole if e["cat"] == "task::Counter.__init__"]
    assert init["name"] == "__init__"
    assert len({(e["pid"], e["tid"]) for e in calls + [init]}) == 1  # one actor, one process
    assert init["ts"] + init["dur"] <= min(e["ts"] for e in calls)
    # Without a filename: the same events, as a list.
    listed = ray.timeline()
    assert {e["args"]["task_id"] for e in _whole(_check_trace(listed))} >= {
        e["args"]["task_id"] for e in whole}


def test_list_tasks_has_the_start_time(ray):
    import miniray.util.state as state

    @ray.remote
    def quick():
        return 1

    submitted_ms = time.time() * 1000
    ray.get(quick.remote())
    (row,) = [t for t in state.list_tasks(detail=True) if t["name"] == "quick"]
    assert row["start_time_ms"] is not None
    assert submitted_ms - 1 <= row["start_time_ms"] <= row["end_time_ms"]


def test_timeline_from_inside_a_task(ray):
    @ray.remote
    def first():
        return 1

    @ray.remote
    def read():
        import miniray

        return [e["cat"] for e in miniray.timeline() if e["ph"] == "X"]

    ray.get(first.remote())
    assert "task::first" in ray.get(read.remote())


def test_timeline_before_init_says_so(session_root):
    import miniray

    with pytest.raises(RuntimeError, match="initialized first"):
        miniray.timeline()


def test_miniray_timeline_names_an_unknown_address(session_root, tmp_path):
    """As `ray timeline --address` of no cluster: an error naming the address, no file."""
    done = subprocess.run([sys.executable, "-m", "miniray", "timeline", "--address",
                           "127.0.0.1:1", str(tmp_path / "t.json")], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))
    assert done.returncode == 1 and "127.0.0.1:1" in done.stderr
    assert not (tmp_path / "t.json").exists()


DRIVER = """
    import json, os, sys, miniray as ray
    ray.init(address="auto")

    @ray.remote
    def {name}():
        return os.getpid()

    worker = ray.get({name}.remote())
    print(json.dumps({{"pid": os.getpid(), "worker": worker}}), flush=True)
    sys.stdin.readline()
"""


def test_miniray_timeline_holds_both_drivers_of_a_node(node_env, tmp_path):
    started = cli(node_env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    a = driver(DRIVER.format(name="from_a"), node_env, stdin=subprocess.PIPE)
    b = driver(DRIVER.format(name="from_b"), node_env, stdin=subprocess.PIPE)
    try:
        workers = {json_line(a, 60)["worker"], json_line(b, 60)["worker"]}
        assert len(workers) == 2  # each driver leases its own workers
        path = str(tmp_path / "node-trace.json")
        done = cli(node_env, "timeline", path)
        assert done.returncode == 0, done.stderr
        assert f"Trace file written to {path}" in done.stdout
        with open(path) as f:
            events = json.load(f)
        spans = _check_trace(events)
        cats = {e["cat"] for e in _whole(spans)}
        assert {"task::from_a", "task::from_b"} <= cats
        rows = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert all(any(f"(pid {pid})" in row for row in rows) for pid in workers)
        # No FILE: Ray's name, in the current directory.
        default = subprocess.run(
            [*done.args[:3], "timeline"], env=node_env, cwd=str(tmp_path),
            capture_output=True, text=True, timeout=60)
        assert default.returncode == 0, default.stderr
        written = [n for n in os.listdir(tmp_path) if n.startswith("ray-timeline-")]
        assert len(written) == 1 and written[0].endswith(".json")
        with open(tmp_path / written[0]) as f:
            _check_trace(json.load(f))
    finally:
        for proc in (a, b):
            stop_driver(proc)
