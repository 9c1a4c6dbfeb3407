"""10,000 no-op tasks on miniray and on ``multiprocessing.Pool(2)``, side by side in one run.

Owns: the pipelining workload (submit every task, then get every result) and its ratio to a
process pool of the same width measured in the same run, so that the load of a shared machine
weighs on both alike. Does not own: the other core workloads (``bench_core.py``).

    python benchmarks/bench_pipeline.py [--tasks 10000] [--rounds 3] [--num-cpus 2]

Each round runs miniray (one ``init(num_cpus=2)`` for all rounds, started before the first) and
then the pool (a fresh ``Pool(2)`` per round, started before its clock starts); the best
round of each is reported with the ratio miniray / Pool. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time


def noop():
    return None


def run_pool(tasks: int) -> float:
    with multiprocessing.Pool(2) as pool:
        pool.apply(noop)  # both processes started before the clock starts
        start = time.perf_counter()
        results = [pool.apply_async(noop) for _ in range(tasks)]
        for result in results:
            result.get()
        return tasks / (time.perf_counter() - start)


def run_miniray(ray, f, tasks: int) -> float:
    start = time.perf_counter()
    ray.get([f.remote() for _ in range(tasks)])
    return tasks / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    import miniray as ray

    ray.init(num_cpus=args.num_cpus)
    f = ray.remote(noop)
    ray.get([f.remote() for _ in range(200)])  # warm: workers started, function exported
    mini, pool = [], []
    for _ in range(args.rounds):
        mini.append(run_miniray(ray, f, args.tasks))
        pool.append(run_pool(args.tasks))
    ray.shutdown()
    print(json.dumps({
        "tasks": args.tasks, "miniray_tasks_per_s": [round(x) for x in mini],
        "pool_tasks_per_s": [round(x) for x in pool],
        "ratio_of_best": round(max(mini) / max(pool), 3),
        "ratios_per_round": [round(m / p, 3) for m, p in zip(mini, pool)],
    }))


if __name__ == "__main__":
    main()
