"""The no-op round trip's cost on each side: latency, CPU per round trip of the driver and
of the worker that ran it, and the worker's Python calls per task.

    python benchmarks/rtt_cost.py [N] [--calls]

init(num_cpus=1) (one task worker: every round trip runs on it), 300 warm-up round trips,
then N sequential ``get(f.remote())`` (default 20,000): p50 and min, user and system CPU
per round trip of the driver (``os.times``, all its threads) and of the worker
(``/proc/<pid>/stat``; Linux). ``--calls``: then 5,000 more under a profile hook installed
in the worker by a task (it counts the calls its loop makes from then on), printed per
task. Compare two trees by running it with each on ``PYTHONPATH`` from a directory outside
both (a worker imports miniray from the driver's ``sys.path``).
"""

from __future__ import annotations

import os
import sys
import time


def noop():
    return None


def worker_pid():
    return os.getpid()


def start_counting():
    import builtins
    import collections

    counts = builtins._rtt_cost_counts = collections.Counter()

    def profile(frame, event, _arg):
        if event == "call":
            counts["python"] += 1
        elif event == "c_call":
            counts["c"] += 1

    sys.setprofile(profile)


def stop_counting():
    import builtins

    sys.setprofile(None)
    return dict(builtins._rtt_cost_counts)


def _cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    count = int(args[0]) if args else 20_000
    import miniray as ray

    ray.init(num_cpus=1)
    f = ray.remote(noop)
    for _ in range(300):
        ray.get(f.remote())
    pid = ray.get(ray.remote(worker_pid).remote())
    worker_before, driver_before = _cpu(pid), os.times()
    times = []
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        ray.get(f.remote())
        times.append(clock() - start)
    worker_after, driver_after = _cpu(pid), os.times()
    times.sort()
    per = 1e6 / count
    print(f"round trip p50 {times[count // 2] * 1e6:.1f} us, min {times[0] * 1e6:.1f} us; "
          f"CPU per round trip: driver user {(driver_after.user - driver_before.user) * per:.1f}"
          f" sys {(driver_after.system - driver_before.system) * per:.1f} us, worker user "
          f"{(worker_after[0] - worker_before[0]) * per:.1f} sys "
          f"{(worker_after[1] - worker_before[1]) * per:.1f} us; "
          f"load {os.getloadavg()[0]:.1f}")
    if "--calls" in sys.argv:
        ray.get(ray.remote(start_counting).remote())
        for _ in range(5000):
            ray.get(f.remote())
        counts = ray.get(ray.remote(stop_counting).remote())
        print(f"worker, per task: {counts.get('python', 0) / 5000:.1f} Python calls, "
              f"{counts.get('c', 0) / 5000:.1f} C calls")
    ray.shutdown()


if __name__ == "__main__":
    main()
