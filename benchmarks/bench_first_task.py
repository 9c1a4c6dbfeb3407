"""The first task after ``init()``, against the warm round trip: one figure per fresh process.

A child process per run: ``init(num_cpus=2)``, then ``get(remote(noop).remote())`` timed from
the decoration (as ``bench_peers.py`` times it: the function is new, pickled by value), then
200 warm-up and 500 timed round trips (their p50), then 20 round trips each after a 20 ms
sleep (their p50: a warm task after idling, the fair reference on a VM whose vCPUs run
slower right after an idle spell). Also ``init()``'s own time and the time from the
process's start (the parent's clock before the spawn) to ``init()`` returned.
``--before-init`` decorates the function before ``init()`` instead (the first ``.remote()``
alone is timed then); ``--rates`` adds 10,000 no-ops submitted then gotten (best of 3 in
each run).

A/B: ``--trees DIR [DIR ...]`` runs each tree (a ``git archive`` of each commit, so that
neither is the tree under edit) on ``PYTHONPATH``, alternating run by run, from a directory
outside them, the session root on ``/dev/shm`` (``MINIRAY_TMPDIR``); prints each tree's
median [quartiles] of ``--runs`` runs and the load average.

    python benchmarks/bench_first_task.py --trees /tmp/base /tmp/branch --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
before = sys.argv[1] == "1"
rates = sys.argv[2] == "1"
import miniray as ray

def noop():
    return None

if before:
    f = ray.remote(noop)
i0 = time.perf_counter()
ray.init(num_cpus=2)
t0 = time.perf_counter()
init_s = t0 - i0
init_wall = time.time()
if not before:
    f = ray.remote(noop)
ray.get(f.remote())
first = time.perf_counter() - t0
for _ in range(200):
    ray.get(f.remote())
times = []
for _ in range(500):
    t = time.perf_counter()
    ray.get(f.remote())
    times.append(time.perf_counter() - t)
times.sort()
idle = []
for _ in range(20):  # a warm no-op after 20 ms asleep: what a warm task costs after idling
    time.sleep(0.02)
    t = time.perf_counter()
    ray.get(f.remote())
    idle.append(time.perf_counter() - t)
idle.sort()
out = {"first_ms": first * 1e3, "warm_ms": times[len(times) // 2] * 1e3,
       "idle_ms": idle[len(idle) // 2] * 1e3, "init_ms": init_s * 1e3, "init_wall": init_wall}
if rates:
    best = None
    for _ in range(3):
        t = time.perf_counter()
        ray.get([f.remote() for _ in range(10_000)])
        took = time.perf_counter() - t
        best = took if best is None else min(best, took)
    out["tasks_10k_s"] = best
ray.shutdown()
print(json.dumps(out))
"""


def _quartiles(values: list) -> tuple:
    ordered = sorted(values)
    if len(ordered) < 4:
        return ordered[0], statistics.median(ordered), ordered[-1]
    q = statistics.quantiles(ordered, n=4)
    return q[0], q[1], q[2]


def run_once(tree: str | None, before: bool, root: str, rates: bool = False) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    env["MINIRAY_TMPDIR"] = os.path.join(root, "tmp")  # made by init()
    started = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if before else "0",
                          "1" if rates else "0"], env=env,
                         cwd=root, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # process start (the parent's clock just before the spawn) -> init() returned
    result["start_to_init_ms"] = (result.pop("init_wall") - started) * 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="*", default=[None],
                        help="source trees to alternate (default: the importable miniray)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--before-init", action="store_true",
                        help="decorate the function before init()")
    parser.add_argument("--rates", action="store_true",
                        help="also 10,000 no-ops submitted then gotten, best of 3 per run")
    args = parser.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    results: dict = {tree: [] for tree in args.trees}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="mr-first-", dir=base) as root:
        for _ in range(args.runs):
            for tree in args.trees:
                results[tree].append(run_once(tree, args.before_init, root, args.rates))
            loads.append(os.getloadavg()[0])
    for tree, runs in results.items():
        first = [r["first_ms"] for r in runs]
        warm = [r["warm_ms"] for r in runs]
        ratio = [r["first_ms"] / r["warm_ms"] for r in runs]
        q1, med, q3 = _quartiles(first)
        w1, wmed, w3 = _quartiles(warm)
        r1, rmed, r3 = _quartiles(ratio)
        i1, imed, i3 = _quartiles([r["idle_ms"] for r in runs])
        d1, dmed, d3 = _quartiles([r["first_ms"] / r["idle_ms"] for r in runs])
        n1, nmed, n3 = _quartiles([r["init_ms"] for r in runs])
        s1, smed, s3 = _quartiles([r["start_to_init_ms"] for r in runs])
        print(f"{tree or 'miniray'}: first {med:.3f} ms [{q1:.3f}-{q3:.3f}], "
              f"warm {wmed:.3f} ms [{w1:.3f}-{w3:.3f}], first/warm {rmed:.1f}x "
              f"[{r1:.1f}-{r3:.1f}] ({len(runs)} runs)")
        print(f"    warm after 20 ms idle {imed:.3f} ms [{i1:.3f}-{i3:.3f}], first/idle "
              f"{dmed:.2f}x [{d1:.2f}-{d3:.2f}]")
        print(f"    init() {nmed:.1f} ms [{n1:.1f}-{n3:.1f}], process start -> init() "
              f"returned {smed:.1f} ms [{s1:.1f}-{s3:.1f}]")
        if args.rates:
            k1, kmed, k3 = _quartiles([r["tasks_10k_s"] for r in runs])
            print(f"    10,000 no-ops {kmed:.3f} s [{k1:.3f}-{k3:.3f}]")
    print(f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
