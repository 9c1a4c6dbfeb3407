"""``ray.util.state`` and ``miniray list/get/summary/memory/status`` against live sessions.

An embedded ``init()`` session (the ``ray`` fixture) is read from the driver itself, from one
of its tasks, and from other processes (the CLI, a second Python program), through each
driver's state socket. Field names and value spellings were compared with Ray 2.60's
``ray.util.state`` (its schemas in ``ray/util/state/common.py``): task states
``RUNNING``/``FINISHED``/``FAILED`` with ``error_type`` ``TASK_EXECUTION_EXCEPTION``, actors
``ALIVE`` then ``DEAD``, summaries under ``"cluster"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .helpers import wait_until


def _cli(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "miniray", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def _tasks_by_name(state, **kw) -> dict:
    return {t["name"]: t for t in state.list_tasks(**kw)}


@pytest.fixture
def work(ray):
    """A session with a running task, a finished one, a failed one and a live actor."""
    import miniray.util.state  # noqa: F401  (the package under test)

    @ray.remote
    def finished(x):
        return x

    @ray.remote
    def failing():
        raise ValueError("boom")

    @ray.remote
    def running(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    @ray.remote
    class Counter:
        def ping(self):
            return 1

    ray.get(finished.remote(1))
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(failing.remote())
    actor = Counter.remote()
    ray.get(actor.ping.remote())
    return ray, running, actor


def test_task_states_in_the_driver(work, tmp_path):
    """A running task shows RUNNING with its function name and worker pid, a finished one
    FINISHED, a failed one FAILED with Ray's error type; filters and limit apply."""
    ray, running, _actor = work
    from miniray.util import state

    release = str(tmp_path / "go")
    ref = running.remote(release)
    assert wait_until(lambda: _tasks_by_name(state).get("running", {}).get("state")
                      == "RUNNING", 30.0)
    tasks = _tasks_by_name(state)
    assert tasks["running"]["func_or_class_name"] == "running"
    assert tasks["running"]["type"] == "NORMAL_TASK"
    assert tasks["running"]["worker_pid"] in ray._private.runtime.current().pids()
    assert tasks["finished"]["state"] == "FINISHED"
    assert tasks["failing"]["state"] == "FAILED"
    assert tasks["failing"]["error_type"] == "TASK_EXECUTION_EXCEPTION"
    assert tasks["failing"].error_type == "TASK_EXECUTION_EXCEPTION"  # read as an attribute
    assert tasks["Counter.ping"]["type"] == "ACTOR_TASK"
    assert tasks["Counter.__init__"]["type"] == "ACTOR_CREATION_TASK"
    assert "error_message" not in tasks["failing"]  # a detail column
    failed = state.list_tasks(filters=[("state", "=", "failed")], detail=True)
    assert [t["name"] for t in failed] == ["failing"] and "boom" in failed[0]["error_message"]
    assert 0 < failed[0]["creation_time_ms"] <= failed[0]["end_time_ms"]
    assert all(t["state"] != "FINISHED"
               for t in state.list_tasks(filters=[("state", "!=", "FINISHED")]))
    assert len(state.list_tasks(limit=1)) == 1
    with pytest.raises(ValueError, match="Unsupported filter predicate"):
        state.list_tasks(filters=[("state", ">", "x")])
    with pytest.raises(ValueError, match="filter column bogus is not supported"):
        state.list_tasks(filters=[("bogus", "=", "x")])
    summary = state.summarize_tasks()["cluster"]
    assert summary["summary"]["failing"]["state_counts"] == {"FAILED": 1}
    assert summary["summary"]["running"]["state_counts"] == {"RUNNING": 1}
    open(release, "w").close()
    ray.get(ref)
    assert _tasks_by_name(state)["running"]["state"] == "FINISHED"
    task_id = tasks["finished"]["task_id"]
    assert state.get_task(task_id)["name"] == "finished"
    assert state.get_task("00" * 24) is None


def test_actor_alive_then_dead(work):
    """An actor is ALIVE with its pid, then DEAD after ray.kill with its death cause."""
    ray, _running, actor = work
    from miniray.util import state

    [row] = state.list_actors()
    assert row["class_name"] == "Counter" and row["state"] == "ALIVE" and row["pid"]
    assert state.get_actor(row["actor_id"])["state"] == "ALIVE"
    assert state.summarize_actors()["cluster"]["summary"]["Counter"]["state_counts"] == {
        "ALIVE": 1}
    ray.kill(actor)
    assert wait_until(lambda: state.list_actors()[0]["state"] == "DEAD", 30.0)
    [dead] = state.list_actors(detail=True)
    assert "ray.kill" in dead["death_cause"]["actor_died_error_context"]["error_message"]
    assert dead["pid"] == row["pid"]  # the pid it had, as Ray shows a dead actor's
    assert state.list_actors(filters=[("state", "=", "ALIVE")]) == []


def test_objects_nodes_workers_jobs(ray):
    """Object sizes, the node with its totals, the driver and its workers, one job."""
    from miniray.util import state

    big = ray.put(b"x" * 300_000)  # noqa: F841  (held: it is listed)
    small = ray.put(7)  # noqa: F841
    objects = state.list_objects()
    sizes = sorted(o["object_size"] for o in objects)
    assert len(objects) == 2 and sizes[1] >= 300_000 and 0 < sizes[0] < 1000
    assert {o["reference_type"] for o in objects} == {"LOCAL_REFERENCE"}
    assert state.summarize_objects()["cluster"]["total_objects"] == 2
    [node] = state.list_nodes()
    assert node["state"] == "ALIVE" and node["resources_total"]["CPU"] == 2.0
    assert node["node_id"] == ray.get_runtime_context().get_node_id()
    workers = state.list_workers()
    assert {w["worker_type"] for w in workers} == {"DRIVER", "WORKER"}
    assert [w["pid"] for w in workers if w["worker_type"] == "DRIVER"] == [os.getpid()]
    [job] = state.list_jobs()
    assert job["type"] == "DRIVER" and job["driver_info"]["pid"] == str(os.getpid())
    assert state.list_placement_groups() == []
    from miniray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 0.5}], name="listed", lifetime="detached")
    assert pg.wait(10)
    [row] = state.list_placement_groups(detail=True)
    assert (row["placement_group_id"], row["name"], row["state"], row["is_detached"]) == (
        pg.id.hex(), "listed", "CREATED", True)
    assert row["bundles"][0]["unit_resources"] == {"CPU": 0.5}
    assert state.get_placement_group(pg.id.hex())["name"] == "listed"
    assert row["creator_job_id"] == ray.get_runtime_context().get_job_id()
    waiting = placement_group([{"CPU": 64}], name="waiting")  # never fits: stays pending
    rows = {r["name"]: r for r in state.list_placement_groups(detail=True)}
    assert (rows["waiting"]["state"], rows["waiting"]["stats"]["scheduling_state"]) == (
        "PENDING", "INFEASIBLE")
    assert rows["waiting"]["bundles"][0]["node_id"] is None
    assert rows["listed"]["state"] == "CREATED"
    remove_placement_group(waiting)
    remove_placement_group(pg)
    assert state.list_placement_groups() == []
    with pytest.raises(NotImplementedError, match="no event history"):
        state.list_cluster_events()


def test_get_log_and_list_logs(ray):
    """A task's output is read back by the worker's pid, by the task's id and by file
    name; list_logs groups the files as Ray does (``worker_out``, ``worker_err``)."""
    from miniray.util import state

    @ray.remote
    def talk():
        import sys

        print("hello from the task")
        print("and to stderr", file=sys.stderr)
        return os.getpid()

    ref = talk.remote()
    pid = ray.get(ref)
    task_id = [t for t in state.list_tasks() if t["name"] == "talk"][0]["task_id"]

    def logged(**kw) -> str:
        try:
            return "".join(state.get_log(**kw))
        except ValueError:
            return ""

    assert wait_until(lambda: "hello from the task" in logged(pid=pid), 30.0)
    assert "hello from the task" in logged(task_id=task_id)
    assert "and to stderr" in logged(pid=pid, suffix="err")
    assert "hello from the task" in logged(filename=f"worker-{pid}.out")
    logs = state.list_logs()
    assert f"worker-{pid}.out" in logs["worker_out"]
    assert f"worker-{pid}.err" in logs["worker_err"]
    assert state.list_logs(glob_filter="*.err") == {"worker_err": logs["worker_err"]}
    with pytest.raises(ValueError, match="no log of worker pid 1 "):
        "".join(state.get_log(pid=1))


def test_get_log_follow_yields_the_tail_then_what_is_appended(ray):
    """``get_log(follow=True)``: the actor's last lines, then each line it prints later,
    until the caller stops iterating (a thread iterates; the test bounds it)."""
    import threading

    from miniray.util import state

    @ray.remote
    class Ticker:
        def tick(self, i):
            print("tick", i, flush=True)

    ticker = Ticker.remote()
    ray.get(ticker.tick.remote(0))
    actor_id = ticker._actor_id.hex()

    def logged() -> str:
        try:
            return "".join(state.get_log(actor_id=actor_id))
        except ValueError:
            return ""

    assert wait_until(lambda: "tick 0" in logged(), 30.0)
    chunks: list = []

    def follow():
        for chunk in state.get_log(actor_id=actor_id, follow=True, _interval=0.02):
            chunks.append(chunk)
            if "tick 3" in "".join(chunks):
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert wait_until(lambda: chunks, 30.0)  # the tail first
    for i in (1, 2, 3):
        ray.get(ticker.tick.remote(i))
        time.sleep(0.05)
    follower.join(20)
    assert not follower.is_alive(), chunks
    lines = [line for line in "".join(chunks).splitlines() if line.startswith("tick")]
    assert lines == ["tick 0", "tick 1", "tick 2", "tick 3"], chunks  # none lost or twice
    with pytest.raises(ValueError, match="no log of worker pid 1 "):
        next(state.get_log(pid=1, follow=True))


def test_from_a_task_and_from_another_process(ray, drivers):
    """A task reads its driver's state (the driver is blocked in get() meanwhile); another
    Python program of the user finds the session with address="auto"."""

    @ray.remote
    def look():
        from miniray.util import state

        return [t["name"] for t in state.list_tasks(filters=[("state", "=", "RUNNING")])]

    assert ray.get(look.remote(), timeout=30) == ["look"]
    result = drivers.run("""
        from miniray.util import state
        print([a["class_name"] for a in state.list_actors(address="auto")])
        print(len(state.list_nodes()))
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "1"]


def test_cli_against_an_embedded_session(work, tmp_path):
    """`miniray list/get/summary/memory/status` see a program that only called init()."""
    ray, running, _actor = work
    release = str(tmp_path / "go")
    ref = running.remote(release)
    from miniray.util import state

    assert wait_until(lambda: _tasks_by_name(state).get("running", {}).get("state")
                      == "RUNNING", 30.0)
    big = ray.put(b"y" * (10 << 20))  # noqa: F841
    listing = _cli("list", "tasks")
    assert listing.returncode == 0, listing.stderr
    assert "Total: 5" in listing.stdout and "Table:" in listing.stdout
    lines = {line.split()[3]: line for line in listing.stdout.splitlines()
             if " NORMAL_TASK " in line}
    assert "RUNNING" in lines["running"] and "FAILED" in lines["failing"]
    assert "TASK_EXECUTION_EXCEPTION" in lines["failing"]
    failed = json.loads(_cli("list", "tasks", "--filter", "state=FAILED", "--format",
                             "json", "--detail").stdout)
    assert [t["name"] for t in failed] == ["failing"] and "boom" in failed[0]["error_message"]
    bad = _cli("list", "tasks", "--filter", "nope=1")
    assert bad.returncode == 1 and "nope is not supported" in bad.stderr
    actor_id = state.list_actors()[0]["actor_id"]
    got = _cli("get", "actors", actor_id)
    assert got.returncode == 0 and "state: ALIVE" in got.stdout and "class_name: Counter" in \
        got.stdout
    missing = _cli("get", "actors", "ab" * 16)
    assert missing.returncode == 1 and "not found" in missing.stdout
    summary = _cli("summary", "tasks")
    assert "Table (group by func_name):" in summary.stdout and "FAILED: 1" in summary.stdout
    memory = _cli("memory")
    assert memory.returncode == 0 and f"driver: pid {os.getpid()}" in memory.stdout
    assert f"| {(10 << 20) + 33} B " in memory.stdout  # the 10 MiB object, pickled
    open(release, "w").close()
    ray.get(ref)


def test_rays_private_memory_summary_reads_this_drivers_store(ray):
    """``ray._private.internal_api.memory_summary``, which benchmarks print and parse: the
    totals line in Ray's words, the reference table in Ray's units, bad options named."""
    import miniray._private.internal_api as internal_api

    big = ray.put(b"z" * (6 << 20))  # noqa: F841  (held: it is counted)
    totals = ray._private.internal_api.memory_summary(stats_only=True)
    assert totals.splitlines()[1].startswith("Plasma memory usage 6 MiB, 1 objects, ")
    assert totals.endswith("% needed\n") and "Object references" not in totals
    table = internal_api.memory_summary(units="KB", sort_by="PID", group_by="STACK_TRACE")
    assert f"driver: pid {os.getpid()}" in table and f"| {((6 << 20) + 33) / 1000} KB " \
        in table  # the 6 MiB object, pickled
    with pytest.raises(ValueError, match="units='TB' is not one of B, KB, MB, GB"):
        internal_api.memory_summary(units="TB")
    with pytest.raises(ValueError, match="sort_by='SIZE'"):
        internal_api.memory_summary(sort_by="SIZE")


def test_status_finds_an_init_session_and_shows_the_store_use(ray):
    """`miniray status` shows a program that only called init(), with its driver and
    workers, and the resources table's object-store row says what the store holds."""
    big = ray.put(b"y" * (10 << 20))  # noqa: F841  (held: it is counted)
    status = _cli("status")
    assert status.returncode == 0, status.stderr
    assert f"{os.getpid()} (driver)" in status.stdout
    assert f"pid {os.getpid()}: " in status.stdout  # the Drivers section
    store_row = [line for line in status.stdout.splitlines()
                 if line.split()[:1] == ["object_store_memory"]][0]
    assert store_row.split()[1] == "10.00MiB"  # the store's real use, not 0B


def test_status_verbose_shows_an_init_sessions_demands(ray):
    """`miniray status -v` lists what an init() session has waiting for resources, by
    function name and shape, as it does for a node's drivers."""
    @ray.remote(resources={"Widget": 1})
    def needs_widget():
        return 1

    ref = needs_widget.remote()  # noqa: F841  (held: it waits)
    status = _cli("status", "-v")
    assert status.returncode == 0, status.stderr
    demands = status.stdout.split("Demands (waiting for resources, per driver)")[1]
    row = [line for line in demands.splitlines() if "needs_widget" in line]
    assert row and row[0].split()[:3] == [str(os.getpid()), "1", "needs_widget"], demands
    assert "Widget=1" in row[0] and "(infeasible)" in row[0]


def test_registration_removed_at_shutdown_and_dead_drivers_swept(ray_start, tmp_path):
    """The driver's socket goes at shutdown; one left by a killed driver is removed by the
    first reader (its pid is gone), and the reader does not fail."""
    import miniray
    from miniray._private.transport import state_socket

    ctx = ray_start(num_cpus=1)
    session_dir = ctx["session_dir"]
    [(pid, path)] = state_socket.live_sockets(session_dir)
    assert pid == os.getpid() and oct(os.stat(path).st_mode & 0o777) == "0o600"
    stale = os.path.join(os.path.dirname(path), "999999999-12345.sock")
    open(stale, "w").close()
    assert state_socket.live_sockets(session_dir) == [(pid, path)]
    assert not os.path.exists(stale)
    miniray.shutdown()
    assert not os.path.exists(path)
