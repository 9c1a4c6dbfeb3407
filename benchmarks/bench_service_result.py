"""A large result of a named, detached actor on another fake host, got by a driver (#16).

The actor lives in the head's actor service (a named, detached actor) and runs on the
member (127.0.0.2, ``NodeAffinitySchedulingStrategy``); it returns a numpy array of
``--mb`` MB that it made once and keeps, so the figure is the value's way, not its making.
What one run measures, each ``--repeat`` times (best and median, ms):

* ``call_get``: ``ray.get(keeper.held.remote())`` by a driver on the head's host;
* ``call_del``: the call, waited for until its result is done (sent here, or kept on the
  member), then dropped without a ``get``: what a caller that never reads the value pays;
* ``open_pull``: within ``call_get``, each granted pull's new connection to the keeping
  node (``_Granted.open_pull``: TCP connect, the peer handshake and the grant's check;
  one per object, docs/remote-objects.md), timed in the driver around that call.

``--driver member``: the driver on the member's host and the actor on the head (the
actor service's own node), the other way a value crosses hosts.

Before results of the service's actors stayed on their node, every such value crossed
member -> service (head's host) -> the driver's store at once; now it stays on the member
until ``get`` pulls it straight into the driver's store. Prints one line about the run
(size, repeats, CPUs, load average, which miniray), then a line per figure; ``--json``:
one JSON object. An A/B of two trees: run it from each tree's root in turn, with
``PYTHONPATH`` set to that root (the nodes and the driver it starts import ``miniray``
from the working directory first)::

    PYTHONPATH=$PWD python3 benchmarks/bench_service_result.py [--mb 200] [--repeat 3]

The last line about the run says where the actor ran and whether its result was kept there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import textwrap
import time

import fake_hosts  # beside this script
from bench_pull import _which_miniray  # beside this script

DRIVER = """
import json, time
import numpy as np
import miniray as ray
from miniray._private import runtime
from miniray._private.owner.object_table import READY
from miniray._private.owner import remote_objects
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MB, REPEAT = {mb}, {repeat}
ray.init(address="auto")
member = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "{actor_ip}")
n = int(MB * 1000 * 1000) // 8
opened = []
_open_pull = remote_objects._Granted.open_pull

def open_pull(self, *args, **kwargs):  # a granted pull's connection, timed
    t0 = time.perf_counter()
    try:
        return _open_pull(self, *args, **kwargs)
    finally:
        opened.append(time.perf_counter() - t0)

remote_objects._Granted.open_pull = open_pull

@ray.remote
class Keeper:
    def node(self):
        return ray.get_runtime_context().get_node_id()

    def held(self):
        array = getattr(self, "array", None)
        if array is None:
            array = self.array = np.ones(n)
        return array

keeper = Keeper.options(name="keeper", lifetime="detached", scheduling_strategy=
                        NodeAffinitySchedulingStrategy(member, soft=False)).remote()

def done(ref):  # here, or kept on the member: not pulled
    entry = runtime.current().owner.objects.get(ref.binary())
    return entry is not None and (entry.state == READY or entry.remote is not None)

def call_del():
    ref = keeper.held.remote()
    while not done(ref):
        time.sleep(0.0005)

calls = {{"call_get": lambda: ray.get(keeper.held.remote()), "call_del": call_del}}
samples = {{name: [] for name in calls}}
for rounds in (1, REPEAT):
    for name, fn in calls.items():
        for _ in range(rounds):
            t0 = time.perf_counter()
            value = fn()
            if rounds == REPEAT:
                samples[name].append(time.perf_counter() - t0)
            del value
    if rounds == 1:
        opened.clear()  # the first round warms up
if opened:
    samples["open_pull"] = list(opened)
assert ray.get(keeper.held.remote()).sum() == n
ref = keeper.held.remote()
while not done(ref):
    time.sleep(0.001)
entry = runtime.current().owner.objects.get(ref.binary())
samples["facts"] = {{"actor_on": "{actor_ip}" if ray.get(keeper.node.remote()) == member
                     else "?", "kept_there": entry.remote is not None}}
del ref, entry
ray.kill(keeper)
print(json.dumps(samples), flush=True)
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="MB (1.048576: 1 MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON object instead")
    parser.add_argument("--driver", choices=("head", "member"), default="head",
                        help="member: the driver on the member's host, the actor on the "
                             "head (in the actor service's node)")
    args = parser.parse_args()
    started = time.monotonic()
    head, member = fake_hosts.HOSTS
    actor_ip = head if args.driver == "member" else member
    code = textwrap.dedent(DRIVER.format(mb=args.mb, repeat=args.repeat, actor_ip=actor_ip))
    samples = fake_hosts.run_on_two_hosts(code, prefix="mr-bench-svc-", own_shm_dirs=True,
                                          driver_ip=member if args.driver == "member"
                                          else None)
    load = samples.pop("load_average")
    facts = samples.pop("facts")
    out = {name: {"best_ms": round(min(v) * 1e3, 1),
                  "median_ms": round(statistics.median(v) * 1e3, 1)}
           for name, v in samples.items()}
    doc = {"mb": args.mb, "repeat": args.repeat, "driver": args.driver, "figures": out,
           "facts": facts,
           "load_average": load,
           "cpus": os.cpu_count(), "miniray": _which_miniray(),
           "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"bench_service_result: {args.mb} MB, repeat {args.repeat}, driver on the "
          f"{args.driver}'s host, {doc['cpus']} CPUs, "
          f"load average {' '.join(map(str, load))}, miniray {doc['miniray']}, "
          f"{doc['seconds']} s; {facts}", flush=True)
    for name, v in out.items():
        print(f"{name:<10} best {v['best_ms']:8.1f} ms  median {v['median_ms']:8.1f} ms")


if __name__ == "__main__":
    main()
