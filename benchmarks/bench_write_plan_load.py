"""What the large-write plan decides when N processes write at once: each of N processes
spins (as a copying writer would) and, once all run, asks ``write_plan`` for a 200 MB segment
in /dev/shm as if the host had ``--cpus`` CPUs, with the host's runnable count read then
(``runnable_now``) and without it (the plan before the cap). Prints the threads each chose.

    python benchmarks/bench_write_plan_load.py --procs 4 --cpus 16
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from miniray._private.object_store import parallel_write as pw


def _one(cpus: int, start: float, q) -> None:
    while time.time() < start:  # all become runnable together
        pass
    end = time.time() + 0.2
    while time.time() < end:
        pass
    run = pw.runnable_now()
    q.put((pw.write_plan(200 << 20, cpus, "never", True),
           pw.write_plan(200 << 20, cpus, "never", True, runnable=run), run))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--cpus", type=int, default=16)
    a = ap.parse_args()
    q = mp.Queue()
    start = time.time() + 0.5
    ps = [mp.Process(target=_one, args=(a.cpus, start, q)) for _ in range(a.procs)]
    for p in ps:
        p.start()
    rows = [q.get(timeout=30) for _ in ps]
    for p in ps:
        p.join()
    for old, new, run in rows:
        print(f"runnable {run}: old plan {old} threads, new plan {new}")


if __name__ == "__main__":
    main()
