"""``miniray.experimental.tqdm_ray``: bars of tasks and actors reach the driver's stderr.

Compared with Ray 2.60 (``ray.experimental.tqdm_ray``): a worker's bar is drawn by the driver,
not by the worker, with its description and its count; the state is sent at most once a
second and when the bar closes. Each test runs a separate driver process, so what is checked
is what reaches its real stderr: a pipe (plain lines) or a terminal (a pty: drawn in place).
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

BARS_DRIVER = """
    import json, sys, time
    import miniray as ray
    from miniray.experimental import tqdm_ray

    ray.init(num_cpus=2, **json.loads(sys.argv[1] if len(sys.argv) > 1 else "{{}}"))

    @ray.remote
    def crunch(n):
        print("crunch starts", flush=True)
        for _ in tqdm_ray.tqdm(range(n), desc="crunching"):
            time.sleep(0.01)
        return n

    @ray.remote
    class Counter:
        def count(self, n):
            bar = tqdm_ray.tqdm(total=n, desc="counting", flush_interval_s=0)
            for _ in range(n):
                bar.update(1)
            bar.close()
            return n

    assert ray.get(crunch.remote(12), timeout=60) == 12
    counter = Counter.remote()
    assert ray.get(counter.count.remote(5), timeout=60) == 5
    with tqdm_ray.tqdm(total=3, desc="in the driver") as bar:
        bar.update(3)
    tqdm_ray.safe_print("DONE", flush=True)
    {tail}
"""


def _script(tail="ray.shutdown()"):
    return BARS_DRIVER.format(tail=tail)


def test_a_tasks_and_an_actors_bars_reach_the_drivers_stderr(drivers):
    result = drivers.run(_script(), timeout=90)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    final = re.search(r"^\(crunch pid=\d+\) crunching: 100%\|[█ ]+\| 12/12 \[", err, re.M)
    assert final, err
    assert re.search(r"^\(Counter pid=\d+\) counting: 100%\|[█ ]+\| 5/5 \[", err, re.M), err
    assert re.search(r"^in the driver: 100%\|[█ ]+\| 3/3 \[", err, re.M), err
    # The worker's own lines are still forwarded; no marker or JSON leaks anywhere.
    assert re.search(r"^\(crunch pid=\d+\) crunch starts$", result.stdout, re.M)
    assert "DONE" in result.stdout
    for text in (result.stdout, result.stderr):
        assert "\x00" not in text and '"uuid"' not in text and "\x1b[" not in text
    # A log gets few lines per bar: the first, the last, one per interval in between.
    assert len(re.findall(r"crunching:", err)) <= 4


def test_no_bars_without_log_to_driver(drivers):
    result = drivers.run(_script(), timeout=90, args=['{"log_to_driver": false}'])
    assert result.returncode == 0, result.stderr
    assert "crunching" not in result.stderr and "counting" not in result.stderr
    assert "in the driver: 100%" in result.stderr  # the driver's own bar is its own


def test_bars_are_drawn_in_place_on_a_terminal(drivers):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, drivers.script(_script())], cwd=drivers.tmp_path,
                            env=drivers.env(), stdout=subprocess.PIPE, stderr=slave)
    drivers.started.append(proc)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the driver closed its end
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")[-3000:]
    text = seen.decode("utf-8", "replace")
    assert "\x1b[2K" in text and re.search(r"\x1b\[\d+F\x1b\[J", text), text[-3000:]
    assert re.search(r"\(crunch pid=\d+\) crunching: 100%\|[█ ]+\| 12/12 \[", text)
    assert re.search(r"\(Counter pid=\d+\) counting: 100%\|[█ ]+\| 5/5 \[", text)


def test_a_detached_actors_bar_on_a_node_reaches_the_driver_that_created_it(node_env):
    """The actor lives in the node's actor service; its output, bars included, is routed to
    its creator, which draws them (Ray 2.60 draws a detached actor's bars in the driver
    connected to its job's logs)."""
    from .helpers import cli, driver

    started = cli(node_env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    proc = driver("""
        import miniray as ray
        from miniray.experimental import tqdm_ray
        ray.init(address="auto")

        @ray.remote
        class Worker:
            def run(self, n):
                bar = tqdm_ray.tqdm(total=n, desc="routed", flush_interval_s=0)
                for _ in range(n):
                    bar.update(1)
                bar.close()
                print("ran", n)
                return n

        w = Worker.options(name="bars", lifetime="detached").remote()
        assert ray.get(w.run.remote(4), timeout=60) == 4
        ray.kill(w)
        ray.shutdown()
    """, node_env)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"^\(Worker pid=\d+\) routed: 100%\|[█ ]+\| 4/4 \[", err, re.M), err
    assert re.search(r"^\(Worker pid=\d+\) ran 4$", out, re.M), out
    assert "\x00" not in out + err and '"uuid"' not in out + err
