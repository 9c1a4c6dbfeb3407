"""A warm no-op task on another node against a local one, on two loopback fake hosts.

The head is on 127.0.0.1, the member on 127.0.0.2 (each node with a fresh temp root:
``MINIRAY_TMPDIR``, ``MINIRAY_HOST_DIR``; one token). A driver on the head's host runs, in
alternating blocks, ``ray.get(f.remote())`` for a no-op ``f`` locally and with
``NodeAffinitySchedulingStrategy(member, soft=False)`` (warm: the worker and its lease
exist; the very first remote call, which opens the link and starts the worker, is
timed apart: ``first_remote_ms``), and a 1-byte TCP echo from 127.0.0.1 to 127.0.0.2 (the
link's floor). Prints one JSON object: p50 and mean in microseconds for each, and the
target (remote within 3x local plus the raw RTT). Both nodes are stopped at the end and
their roots removed.

    python benchmarks/bench_remote_tasks.py [--calls 2000] [--blocks 5]
"""

from __future__ import annotations

import argparse
import json
import textwrap

import fake_hosts  # beside this script

DRIVER = """
import json, socket, statistics, threading, time
import miniray as ray
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

CALLS, BLOCKS = {calls}, {blocks}
ray.init(address="auto")
member = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.2")

@ray.remote
def noop():
    return None

remote = noop.options(scheduling_strategy=NodeAffinitySchedulingStrategy(member, soft=False))

server = socket.socket()
server.bind(("127.0.0.2", 0))
server.listen(1)

def echo():
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = conn.recv(1)
        if not data:
            return
        conn.sendall(data)

threading.Thread(target=echo, daemon=True).start()
client = socket.create_connection(server.getsockname(), source_address=("127.0.0.1", 0))
client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

def tcp():
    client.sendall(b"x")
    client.recv(1)

samples = {{"local": [], "remote": [], "tcp_rtt": []}}
calls = {{"local": lambda: ray.get(noop.remote()), "remote": lambda: ray.get(remote.remote()),
         "tcp_rtt": tcp}}
t0 = time.perf_counter()
calls["remote"]()  # the first: link, lease, spawn and attach, HELLO, FUNC
first_remote_ms = (time.perf_counter() - t0) * 1e3
for fn in calls.values():
    for _ in range(50):
        fn()
for _ in range(BLOCKS):
    for name, fn in calls.items():
        out = samples[name]
        for _ in range(CALLS // BLOCKS):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
client.close()
doc = {{name: {{"p50_us": round(statistics.median(v), 1), "mean_us": round(statistics.fmean(v), 1)}}
       for name, v in samples.items()}}
doc["first_remote_ms"] = round(first_remote_ms, 1)
doc["target_us"] = round(3 * doc["local"]["p50_us"] + doc["tcp_rtt"]["p50_us"], 1)
doc["met"] = doc["remote"]["p50_us"] <= doc["target_us"]
print(json.dumps(doc), flush=True)
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    code = textwrap.dedent(DRIVER.format(calls=args.calls, blocks=args.blocks))
    print(json.dumps(fake_hosts.run_on_two_hosts(code, prefix="mr-bench-remote-")))


if __name__ == "__main__":
    main()
