"""A kept result consumed by a task on another member: through the driver, or fetched
directly from the member that keeps it (#16; docs/remote-objects.md, "Tasks given a kept
result").

Three fake hosts: a head on 127.0.0.1 (the driver's), member A on 127.0.0.2 and member B
on 127.0.0.3, each with its own root and shm dir. Each run: a task on A makes a
``--mb`` MB numpy array (untimed; A keeps it), then the timed ``ray.get`` of a task on B
given that ref (it returns ``nbytes``): ``through_driver`` with
``MINIRAY_FETCH_BETWEEN_NODES=0`` (the driver pulls it from A, then sends it to B's
worker), ``direct`` with the default (B's node fetches it from A with the driver's
grant; B's worker maps that copy). A new array each run, freed after it. Prints one JSON
object (ms per run, and the driver's pull and fetch counters). ``--actor``: the consumer
is a method of an actor on B instead of a task ("Actor calls and bundles given a kept
result").

    python benchmarks/bench_fetch.py [--mb 100] [--repeat 1] [--actor]
"""

from __future__ import annotations

import argparse
import json
import textwrap

import fake_hosts  # beside this script

DRIVER = """
import json, os, time
import numpy as np
import miniray as ray
from miniray._private import runtime
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address="auto")
ids = {{n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}}
on_a = NodeAffinitySchedulingStrategy(ids["127.0.0.2"], soft=False)
on_b = NodeAffinitySchedulingStrategy(ids["127.0.0.3"], soft=False)
n = {mb} * 1000 * 1000


@ray.remote
def make(seed):
    return np.full(n, seed % 251, dtype=np.uint8)


@ray.remote
def nbytes(array):
    return array.nbytes


@ray.remote
class Consumer:
    def nbytes(self, array):
        return array.nbytes


if {actor}:
    consumer = Consumer.options(scheduling_strategy=on_b).remote()
    consume = consumer.nbytes.remote
else:
    consume = nbytes.options(scheduling_strategy=on_b).remote
out = {{"mb": {mb}, "actor": {actor}}}
ray.get(consume(np.zeros(8)))  # B's worker is up
for name, flag in (("through_driver", "0"), ("direct", "1")):
    os.environ["MINIRAY_FETCH_BETWEEN_NODES"] = flag
    times = []
    for seed in range({repeat}):
        ref = make.options(scheduling_strategy=on_a).remote(seed)
        while runtime.current().owner.objects.get(ref.binary()).remote is None:
            time.sleep(0.005)
        t0 = time.perf_counter()
        assert ray.get(consume(ref)) == n
        times.append(round((time.perf_counter() - t0) * 1000, 1))
        del ref
        time.sleep(0.2)  # its copies freed
    out[name] = times
kept = runtime.current().owner.remote_nodes.kept_results
out["pulled"], out["fetched"] = kept.pulled, kept.fetched
print(json.dumps(out), flush=True)
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--actor", action="store_true")
    args = parser.parse_args()
    code = textwrap.dedent(DRIVER.format(mb=args.mb, repeat=args.repeat, actor=args.actor))
    doc = fake_hosts.run_on_two_hosts(code, prefix="miniray-bench-fetch-", own_shm_dirs=True,
                                      hosts=("127.0.0.1", "127.0.0.2", "127.0.0.3"))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
