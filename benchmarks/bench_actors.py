"""Actor workloads (issue 4) for one implementation, run in this interpreter.

Owns: the actor workloads of the actors issue and the way each is measured. Does not own:
running them side by side or judging targets (``compare.py --suite actors``), the child
processes and the JSON (``harness.py``).

    python benchmarks/bench_actors.py --impl {miniray,ray} [--workloads sync_call,...]

prints exactly one JSON object on stdout and exits 1 if a workload failed. The same code runs
for both (``import miniray as ray`` / ``import ray``). Every workload runs in its own child
process, with its own ``init(num_cpus=2)`` (RAY_ADDRESS / MINIRAY_ADDRESS unset, so a fresh
runtime; Ray's dashboard and other defaults as users have them). An actor with no resource
options needs 1 CPU to be placed and holds 0 while alive, in Ray and in miniray, so 20 plain
actors fit on 2 CPUs.

Workloads::

    actor_call_ms       one actor ``class A: def f(self): return None``; ping it once (so it
                        exists), 200 warm-up calls, then 2,000 sequential
                        ``get(a.f.remote())``, each timed; mean (p50, p99, min in details).
    async_calls_per_s   one actor whose method is ``async def f(self): return None``; ping it,
                        200 warm-up calls, then ``refs = [a.f.remote() for _ in range(10_000)];
                        get(refs)``, wall time including submission; best of 3 (every run in
                        details).
    actors_per_s        ``actors = [P.remote() for _ in range(20)]; get([a.ping.remote() for a
                        in actors])`` right after ``init()``, timed from the first ``.remote()``
                        to ``get`` returning; 20 / that time. The 20 actors are then killed and
                        a second round of 20 is timed the same way (details; the headline is
                        the first round, what a fresh program sees).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

NUM_CPUS = 2
WARMUP = 200
SYNC_CALLS = 2_000
ASYNC_CALLS = 10_000
ASYNC_RUNS = 3
ACTORS = 20
ACTOR_ROUNDS = 2


class SyncActor:
    def f(self):
        return None


class AsyncActor:
    async def f(self):
        return None


class Pinged:
    def ping(self):
        return None


def _init(ray):
    ray.init(num_cpus=NUM_CPUS)


def sync_call(impl: str) -> dict:
    ray = harness.import_impl(impl)
    _init(ray)
    try:
        a = ray.remote(SyncActor).remote()
        ray.get(a.f.remote())
        samples = harness.time_calls(lambda: ray.get(a.f.remote()), SYNC_CALLS, WARMUP)
    finally:
        ray.shutdown()
    rt = harness.summary(samples)
    return {
        "actor_call_ms": rt["mean_ms"],
        "actor_call_p50_ms": rt["p50_ms"],
        "details": {"actor_call": rt},
    }


def async_calls(impl: str) -> dict:
    ray = harness.import_impl(impl)
    _init(ray)
    try:
        a = ray.remote(AsyncActor).remote()
        ray.get(a.f.remote())
        ray.get([a.f.remote() for _ in range(WARMUP)])
        runs = harness.time_batches(lambda: [a.f.remote() for _ in range(ASYNC_CALLS)],
                                    ray.get, ASYNC_RUNS, ASYNC_CALLS, "calls_per_s")
    finally:
        ray.shutdown()
    return {
        "async_calls_per_s": max(r["calls_per_s"] for r in runs),
        "details": {"runs": runs, "calls_per_run": ASYNC_CALLS},
    }


def create_actors(impl: str) -> dict:
    ray = harness.import_impl(impl)
    t_init = time.perf_counter()
    _init(ray)
    init_s = time.perf_counter() - t_init
    rounds = []
    try:
        P = ray.remote(Pinged)
        for _ in range(ACTOR_ROUNDS):
            t0 = time.perf_counter()
            actors = [P.remote() for _ in range(ACTORS)]
            t_created = time.perf_counter()
            ray.get([a.ping.remote() for a in actors])
            elapsed = time.perf_counter() - t0
            rounds.append(
                {
                    "actors_per_s": ACTORS / elapsed,
                    "total_s": elapsed,
                    "create_calls_s": t_created - t0,
                }
            )
            for a in actors:
                ray.kill(a)
            del actors
            time.sleep(0.5)  # let the killed actors go before the next round
    finally:
        ray.shutdown()
    return {
        "actors_per_s": rounds[0]["actors_per_s"],
        "details": {"rounds": rounds, "actors_per_round": ACTORS, "init_s": init_s},
    }


WORKLOADS = {
    "sync_call": (sync_call, 120.0),
    "async_calls": (async_calls, 120.0),
    "create_actors": (create_actors, 150.0),
}

if __name__ == "__main__":
    sys.exit(harness.main("bench_actors", WORKLOADS, __doc__))
