"""The state API and CLI against a ``miniray start`` node with two drivers.

Each driver of the node (and the node's actor service, itself a driver) serves its own
state; a reader merges them. Compared with Ray 2.60's ``ray list``/``ray summary`` (field
names, states, the listing's layout).
"""

from __future__ import annotations

import json
import subprocess

from .helpers import cli, driver, json_line, stop_driver, wait_until

DRIVER_A = """
    import json, sys, time, miniray as ray
    ray.init(address="auto")

    @ray.remote
    def sleeper():
        time.sleep(120)

    @ray.remote
    class Keeper:
        def ping(self):
            return 1

    keeper = Keeper.options(name="keeper").remote()
    ray.get(keeper.ping.remote())
    ref = sleeper.remote()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
"""

DRIVER_B = """
    import json, os, sys, miniray as ray
    ray.init(address="auto")

    @ray.remote
    def explode():
        raise KeyError("no")

    try:
        ray.get(explode.remote())
    except ray.exceptions.RayTaskError:
        pass
    big = ray.put(b"z" * 500_000)

    @ray.remote
    def job_of_task():
        return ray.get_runtime_context().get_job_id()

    print(json.dumps({"pid": os.getpid(), "job": ray.get_runtime_context().get_job_id(),
                      "task_job": ray.get(job_of_task.remote()),
                      "ref_job": big.job_id().hex()}), flush=True)
    sys.stdin.readline()
"""


def _lines_of(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line.split()]


def test_two_drivers_of_a_node(node_env):
    started = cli(node_env, "start", "--head", "--num-cpus", "3")
    assert started.returncode == 0, started.stderr
    a = driver(DRIVER_A, node_env, stdin=subprocess.PIPE)
    b = driver(DRIVER_B, node_env, stdin=subprocess.PIPE)
    try:
        json_line(a, 60)
        b_info = json_line(b, 60)
        b_pid = b_info["pid"]
        # Each driver of a node is a job of its own, numbered as Ray numbers them.
        assert b_info["job"] in ("01000000", "02000000")
        assert b_info["task_job"] == b_info["ref_job"] == b_info["job"]

        def sleeper_running():
            out = cli(node_env, "list", "tasks", "--format", "json").stdout
            return any(t["name"] == "sleeper" and t["state"] == "RUNNING"
                       for t in json.loads(out or "[]"))

        assert wait_until(sleeper_running, 30.0)
        tasks = json.loads(cli(node_env, "list", "tasks", "--format", "json", "--detail").stdout)
        by_name = {t["name"]: t for t in tasks}
        assert by_name["explode"]["state"] == "FAILED"
        assert by_name["explode"]["error_type"] == "TASK_EXECUTION_EXCEPTION"
        assert by_name["Keeper.ping"]["state"] == "FINISHED"
        jobs = json.loads(cli(node_env, "list", "jobs", "--format", "json").stdout)
        assert len(jobs) == 2 and str(b_pid) in {j["driver_info"]["pid"] for j in jobs}
        assert {j["job_id"] for j in jobs} == {"01000000", "02000000"}
        assert {t["job_id"] for t in tasks if t["name"] == "explode"} == {b_info["job"]}
        actors = json.loads(cli(node_env, "list", "actors", "--format", "json").stdout)
        assert [(x["name"], x["state"]) for x in actors] == [("keeper", "ALIVE")]
        nodes = json.loads(cli(node_env, "list", "nodes", "--format", "json").stdout)
        assert len(nodes) == 1 and nodes[0]["resources_total"]["CPU"] == 3.0
        summary = cli(node_env, "summary", "tasks")
        assert summary.returncode == 0 and "FAILED: 1" in summary.stdout
        memory = cli(node_env, "memory")
        assert f"driver: pid {b_pid}" in memory.stdout and "| 500033 B " in memory.stdout
        table = cli(node_env, "list", "workers", "--filter", "worker_type=DRIVER")
        assert "Total: 3" in table.stdout  # two drivers and the actor service
        status = cli(node_env, "status")
        assert status.returncode == 0 and f"pid {b_pid}:" in status.stdout
    finally:
        for proc in (a, b):
            stop_driver(proc)
