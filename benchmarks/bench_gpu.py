"""GPU-task workloads (issue 5) for one implementation, run in this interpreter.

Owns: the GPU-task workloads of the GPUs issue and the way each is measured. Does not own:
running them side by side or judging targets (``compare.py --suite gpu``), the child processes
and the JSON (``harness.py``).

    python benchmarks/bench_gpu.py --impl {miniray,ray} [--workloads default_max_calls,...]

prints exactly one JSON object on stdout and exits 1 if a workload failed. The same code runs
for both (``import miniray as ray`` / ``import ray``). Every workload runs in its own child
process with its own ``init(num_gpus=4, num_cpus=2)``: logical GPUs, no real GPU needed (the
task never touches one). Each task is a no-op asking for ``num_gpus=0.25`` and, by default, 1
CPU, so at most 2 run at once on 2 CPUs.

Workloads::

    gpu_default_tasks_per_s
                        ``@remote(num_gpus=0.25) def g(): return None``: the default GPU worker
                        handling (``max_calls=1`` for a function with ``num_gpus``: a fresh
                        worker process per task). Submit N tasks, then
                        ``ready, _ = wait(refs, num_returns=N, timeout=60)``; tasks/s is
                        ``len(ready)`` / the time from the first ``.remote()`` to ``wait``
                        returning. N is 2,000 for miniray and 200 for Ray (Ray runs about 2.5 a
                        second here, so 2,000 would take 13 minutes); either stops at 60 s.
                        When fewer than 2,000 finished, the JSON says so (``extrapolated``)
                        and gives the time 2,000 would take at that rate. The tasks left are
                        cancelled before ``shutdown()``.
    gpu_reuse_tasks_per_s
                        ``@remote(num_gpus=0.25, max_calls=0) def g(): return None``: workers
                        are reused. 200 warm-up tasks, then ``get([g.remote() for _ in
                        range(2_000)])``, wall time including submission; best of 3.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

NUM_GPUS = 4
NUM_CPUS = 2
GPU_PER_TASK = 0.25
TASKS = 2_000
DEFAULT_TASKS = {"miniray": TASKS, "ray": 200}
DEFAULT_CAP_S = 60.0
REUSE_WARMUP = 200
REUSE_RUNS = 3


def gpu_noop():
    return None


def _init(ray):
    ray.init(num_gpus=NUM_GPUS, num_cpus=NUM_CPUS)


def default_max_calls(impl: str) -> dict:
    ray = harness.import_impl(impl)
    _init(ray)
    n = DEFAULT_TASKS[impl]
    try:
        g = ray.remote(num_gpus=GPU_PER_TASK)(gpu_noop)
        t0 = time.perf_counter()
        refs = [g.remote() for _ in range(n)]
        t_submitted = time.perf_counter()
        ready, not_ready = ray.wait(refs, num_returns=n, timeout=DEFAULT_CAP_S)
        elapsed = time.perf_counter() - t0
        ray.get(ready)  # none raised
        for ref in not_ready:
            try:
                ray.cancel(ref)
            except Exception as error:  # noqa: BLE001  (report, do not fail the figure)
                print(f"cancel failed: {error!r}", file=sys.stderr)
                break
    finally:
        ray.shutdown()
    done = len(ready)
    rate = done / elapsed
    details = {
        "submitted": n,
        "completed": done,
        "wall_s": elapsed,
        "submit_s": t_submitted - t0,
        "cap_s": DEFAULT_CAP_S,
        "extrapolated": done < TASKS,
    }
    if done < TASKS:
        details["note"] = (
            f"{done} of {TASKS} tasks ran ({n} submitted, cap {DEFAULT_CAP_S:.0f} s); "
            f"{TASKS} would take {TASKS / rate:.0f} s at this rate"
            if rate
            else "no task finished"
        )
        details["extrapolated_s_for_2000"] = TASKS / rate if rate else None
    return {"gpu_default_tasks_per_s": rate, "details": details}


def reuse_workers(impl: str) -> dict:
    ray = harness.import_impl(impl)
    _init(ray)
    try:
        g = ray.remote(num_gpus=GPU_PER_TASK, max_calls=0)(gpu_noop)
        ray.get([g.remote() for _ in range(REUSE_WARMUP)])
        runs = harness.time_batches(lambda: [g.remote() for _ in range(TASKS)], ray.get,
                                    REUSE_RUNS, TASKS, "tasks_per_s")
    finally:
        ray.shutdown()
    return {
        "gpu_reuse_tasks_per_s": max(r["tasks_per_s"] for r in runs),
        "details": {"runs": runs, "tasks_per_run": TASKS},
    }


WORKLOADS = {
    "default_max_calls": (default_max_calls, 120.0),
    "reuse_workers": (reuse_workers, 120.0),
}

if __name__ == "__main__":
    sys.exit(harness.main("bench_gpu", WORKLOADS, __doc__))
