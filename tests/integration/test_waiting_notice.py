"""The driver's line for work that waits for resources, and ``miniray status -v``'s demands.

Ray 2.60 prints nothing while a task waits (compared: a task queued behind another driver's
lease, or behind an actor holding the only CPU, stays silent); miniray names what holds the
resources once the wait passes ``MINIRAY_WAIT_NOTICE_S`` (README, "Differences from Ray").
"""

from __future__ import annotations

import re

from .helpers import cli

NOTICE = "have waited"


def test_a_task_blocked_by_another_drivers_lease_is_named_with_that_driver(node_env, drivers):
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    env = {"MINIRAY_TMPDIR": node_env["MINIRAY_TMPDIR"],
           "MINIRAY_HOST_DIR": node_env["MINIRAY_HOST_DIR"]}
    holder = drivers.start("""
        import os, time, miniray as ray
        ray.init(address="auto")
        @ray.remote(num_cpus=1)
        def hold():
            print("holding", flush=True)
            time.sleep(60)
        ref = hold.remote()
        while ray.available_resources().get("CPU", 0.0) > 0:
            time.sleep(0.02)
        print(f"holder {os.getpid()}", flush=True)
        time.sleep(60)
    """, **env)
    # The worker's forwarded "holding" line may land between print()'s writes (each
    # argument, each separator, then the newline): one argument, found by its marker.
    holder_pid = None
    while holder_pid is None:
        found = re.search(r"holder (\d+)", drivers.read_line(holder))
        holder_pid = int(found.group(1)) if found else None
    waiter = drivers.start("""
        import os, time, miniray as ray
        ray.init(address="auto")
        @ray.remote(num_cpus=1)
        def work(i):
            return i
        refs = [work.remote(i) for i in range(3)]
        ready, _ = ray.wait(refs, timeout=3.5)
        print(len(ready), os.getpid(), flush=True)
        time.sleep(60)
    """, MINIRAY_WAIT_NOTICE_S="1", **env)
    count, waiter_pid = drivers.read_line(waiter).split()
    assert count == "0"
    status = cli(node_env, "status", "-v")
    assert status.returncode == 0, status.stderr
    demands = status.stdout.split("Demands")[1].splitlines()
    assert any(line.split() == [waiter_pid, "3", "work", "{CPU=1}"] for line in demands), \
        status.stdout
    holder.kill()
    holder.wait(10)
    waiter.kill()
    _out, err = drivers.communicate(waiter, 30)
    notices = [line for line in err.splitlines() if NOTICE in line]
    assert len(notices) == 1, err  # one line for the shape, not one per task
    assert notices[0].startswith("miniray: 3 task(s)/actor(s) (work) have waited ")
    assert "for {CPU=1}; CPU held by another driver " \
           f"(pid {holder_pid}): 1 lease {{CPU=1}}." in notices[0]


def test_an_actor_holding_the_cpu_is_named_and_a_backlog_is_not(drivers):
    result = drivers.run("""
        import time, miniray as ray
        ray.init(num_cpus=1)
        @ray.remote
        def step(i):
            time.sleep(1.2)
            return i
        # A backlog behind this driver's own leases of the same shape: no news.
        assert ray.get([step.remote(i) for i in range(3)]) == [0, 1, 2]
        print("backlog done", flush=True)
        @ray.remote(num_cpus=1)
        class Holder:
            def ping(self):
                return 1
        holder = Holder.remote()
        ray.get(holder.ping.remote())
        ready, _ = ray.wait([step.remote(9)], timeout=2.5)
        assert not ready
        ray.shutdown()
    """, MINIRAY_WAIT_NOTICE_S="0.5")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if NOTICE in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("miniray: 1 task(s)/actor(s) (step) have waited ")
    assert "CPU held by this driver (pid " in lines[0] and "1 lease {CPU=1} [actor Holder]" \
        in lines[0]


def test_zero_turns_the_notice_off(drivers):
    result = drivers.run("""
        import miniray as ray
        ray.init(num_cpus=1)
        @ray.remote(num_cpus=1)
        class Holder:
            def ping(self):
                return 1
        @ray.remote
        def f():
            return 1
        holder = Holder.remote()
        ray.get(holder.ping.remote())
        ray.wait([f.remote()], timeout=2.5)
        ray.shutdown()
    """, MINIRAY_WAIT_NOTICE_S="0")
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr


def test_an_actor_waiting_behind_a_detached_one_names_the_actor_service(node_env, drivers):
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    result = drivers.run("""
        import miniray as ray
        ray.init(address="auto")
        @ray.remote(num_cpus=1)
        class Worker:
            def ping(self):
                return 1
        keeper = Worker.options(name="keeper", lifetime="detached").remote()
        ray.get(keeper.ping.remote())
        late = Worker.remote()  # waits for the CPU the detached actor holds
        ready, _ = ray.wait([late.ping.remote()], timeout=3)
        assert not ready
        ray.kill(keeper)
        ray.shutdown()
    """, MINIRAY_WAIT_NOTICE_S="1", MINIRAY_TMPDIR=node_env["MINIRAY_TMPDIR"],
        MINIRAY_HOST_DIR=node_env["MINIRAY_HOST_DIR"])
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if NOTICE in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("miniray: 1 task(s)/actor(s) (actor Worker) have waited ")
    assert "CPU held by the node's actor service (pid " in lines[0]
    assert "1 lease {CPU=1} [actor Worker name=keeper]" in lines[0]
