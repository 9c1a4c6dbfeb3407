"""Large values through a task on another node against the same task locally (#16, P3).

Two loopback fake hosts as in ``bench_remote_tasks.py`` (head 127.0.0.1, member 127.0.0.2,
each node with a fresh temp root, shared-memory dir and one token). A driver on the head's
host times, ``--repeat`` times each, best and median in ms:

* ``result``: ``ray.get(make.remote())`` of a ``--mb`` MB numpy array made by the task;
* ``argument``: ``ray.get(size.remote(ref))`` of a task given a ``--mb`` MB array
  already ``put`` (the driver's store holds it);

locally and with ``NodeAffinitySchedulingStrategy(member, soft=False)`` (warm: each kind of
call once before timing), and the run's memcpy floor: one ``numpy.copyto`` of the same
size into warm memory. On another node a result crosses TCP once and is written into a
new segment of the driver's store; an argument is read from the driver's segment and
received into a buffer there: each at least one memcpy plus the loopback copies.

    python benchmarks/bench_remote_values.py [--mb 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import textwrap

import fake_hosts  # beside this script

DRIVER = """
import json, statistics, time
import numpy as np
import miniray as ray
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MB, REPEAT = {mb}, {repeat}
ray.init(address="auto")
member = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.2")
there = NodeAffinitySchedulingStrategy(member, soft=False)
n = MB * 1000 * 1000 // 8

@ray.remote
def make():
    return np.ones(n)

@ray.remote
def size(array):
    return array.nbytes

ref = ray.put(np.ones(n))
calls = {{
    "result_local": lambda: ray.get(make.remote()),
    "result_remote": lambda: ray.get(make.options(scheduling_strategy=there).remote()),
    "argument_local": lambda: ray.get(size.remote(ref)),
    "argument_remote": lambda: ray.get(size.options(scheduling_strategy=there).remote(ref)),
}}
samples = {{name: [] for name in calls}}
for fn in calls.values():
    fn()
for _ in range(REPEAT):
    for name, fn in calls.items():
        t0 = time.perf_counter()
        value = fn()
        samples[name].append((time.perf_counter() - t0) * 1e3)
        del value
src, dst = np.ones(n), np.zeros(n)
np.copyto(dst, src)
copies = []
for _ in range(REPEAT):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    copies.append((time.perf_counter() - t0) * 1e3)
doc = {{name: {{"best_ms": round(min(v), 1), "median_ms": round(statistics.median(v), 1)}}
       for name, v in samples.items()}}
doc["memcpy_ms"] = round(min(copies), 1)
doc["mb"] = MB
print(json.dumps(doc), flush=True)
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    code = textwrap.dedent(DRIVER.format(mb=args.mb, repeat=args.repeat))
    doc = fake_hosts.run_on_two_hosts(code, prefix="mr-bench-rvalues-", own_shm_dirs=True)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
