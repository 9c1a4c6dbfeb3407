"""10,000 calls on one async actor beside 10,000 no-op tasks, in one runtime, alternating.

    python benchmarks/actor_vs_tasks.py [--rounds 3] [--calls 10000]

Owns: the same-run ratio of the async-actor target of the speed issue (calls/s of
``async def f(self): return None`` on ONE actor over the no-op tasks/s). Each round times
``get([f.remote() for _ in range(N)])`` then ``get([a.f.remote() for _ in range(N)])``,
submission included; prints one line per round: both rates, their ratio, and the CPU time
per call of the driver and of the actor's process during the actor's 10,000 calls (less
noisy than wall-clock on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import time


def noop():
    return None


class AsyncActor:
    async def f(self):
        return None

    async def pid(self):
        return os.getpid()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10_000)
    args = parser.parse_args()
    import miniray as ray

    ray.init(num_cpus=2)
    try:
        f = ray.remote(noop)
        a = ray.remote(AsyncActor).remote()
        ray.get([f.remote() for _ in range(200)])
        ray.get([a.f.remote() for _ in range(200)])
        actor_pid = ray.get(a.pid.remote())
        n = args.calls
        for r in range(args.rounds):
            t0 = time.perf_counter()
            ray.get([f.remote() for _ in range(n)])
            tasks = n / (time.perf_counter() - t0)
            t0, driver0, actor0 = time.perf_counter(), time.process_time(), _cpu_s(actor_pid)
            ray.get([a.f.remote() for _ in range(n)])
            calls = n / (time.perf_counter() - t0)
            driver_us = (time.process_time() - driver0) / n * 1e6
            actor_us = (_cpu_s(actor_pid) - actor0) / n * 1e6
            print(f"round {r + 1}: tasks {tasks:,.0f}/s  async calls {calls:,.0f}/s  "
                  f"ratio {calls / tasks:.2f}  CPU per call: driver {driver_us:.0f} us, "
                  f"actor {actor_us:.0f} us  load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
