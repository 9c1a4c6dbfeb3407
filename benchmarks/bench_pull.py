"""A 200 MB value between two fake hosts, against raw TCP and Ray in the same run (#16).

What one run measures, each ``--repeat`` times (best and median, ms, and GB/s of the best):

* ``raw_tcp``: ``sendall`` from 127.0.0.1 to ``recv_into`` a preallocated buffer in
  another process on 127.0.0.2, timed from the first byte to a 1-byte acknowledgement
  (the floor: the loopback copies only);
* ``channel_mac``: the same bytes as one ``PeerChannel`` carries a value
  (``framing.send_in_frames``: MAC'd frames of ``framing.PEER_CHUNK``, their tags computed
  on the MAC pool, ``MINIRAY_PEER_MAC_THREADS``; received with ``recv_value_into`` into a
  preallocated buffer, or frame by frame by a miniray without it): what the MAC costs;
* ``result_get``: ``ray.get(held.remote())`` by a driver on the head's host (127.0.0.1)
  of a task on the member (127.0.0.2, ``NodeAffinitySchedulingStrategy``) that returns
  a 200 MB numpy array its worker process made on its first call and keeps, so the
  figure is the value's way, not its making; ``result_task`` is a task that makes the
  array (``np.ones``) and returns it;
* ``argument``: ``ray.get(nbytes.remote(ref))`` of a task on the member given a 200 MB
  array the driver ``put`` just before (untimed; a new object each time, so that Ray's
  copy on the member from an earlier call cannot serve it);
* Ray 2.60 (``--ray-python``, default the venv of ``setup_ray_venv.sh``, or
  ``$MINIRAY_BENCH_RAY_VENV``): the same
  ``result_get`` and ``argument`` on a ``ray.cluster_utils.Cluster`` of a head and a
  second node on this machine (both raylets on one address: the utility's way; each has
  its own object store and objects move between them over TCP; skipped with a note when
  that interpreter is missing or the cluster does not come up within ``--ray-timeout``
  seconds).

Prints a line about the run (size, repeats, CPUs, load average, the MAC pool's size, which
miniray), then one line per figure: best and median ms, GB/s of the best, its ratio to
``raw_tcp`` (and miniray's to Ray's); ``--json``: one JSON object instead. Every process
shares this machine's cores: on two real hosts each side has its own. Needs numpy,
cloudpickle and filelock only (Ray only without ``--no-ray``); from the repository root::

    PYTHONPATH=$PWD python3 benchmarks/bench_pull.py --no-ray [--mb 200] [--repeat 3]

``--links-only``: ``raw_tcp`` and ``channel_mac`` alone (no cluster; the standard library
is enough).

An A/B of two trees: run this script with ``PYTHONPATH`` set to each tree in turn (every
process it starts then uses that tree's miniray).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time

import fake_hosts  # beside this script

from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.framing import send_in_frames

TOKEN = b"bench-pull-token" * 4
RAY_PYTHON = os.path.join(os.environ.get("MINIRAY_BENCH_RAY_VENV") or os.path.expanduser(
    "~/.cache/miniray-bench/ray-2.60"), "bin", "python")  # setup_ray_venv.sh makes it

# What both drivers run once connected (``{calls}``: their timed calls by name).
TIMED = """
@ray.remote
def held():
    array = getattr(np, "_bench_pull_held", None)  # made once per worker process
    if array is None or array.size != n:
        array = np._bench_pull_held = np.ones(n)
    return array

@ray.remote
def make():
    return np.ones(n)

@ray.remote
def nbytes(array):
    return array.nbytes

every = {{
    "result_get": lambda ref: ray.get(held.options(scheduling_strategy=there).remote()),
    "result_task": lambda ref: ray.get(make.options(scheduling_strategy=there).remote()),
    "argument": lambda ref: ray.get(nbytes.options(scheduling_strategy=there).remote(ref)),
}}
calls = {{name: every[name] for name in {calls}}}
samples = {{name: [] for name in calls}}
for rounds in (1, REPEAT):
    for i in range(rounds):
        for name, fn in calls.items():
            ref = ray.put(np.full(n, float(i))) if name == "argument" else None
            t0 = time.perf_counter()
            value = fn(ref)
            if rounds == REPEAT:
                samples[name].append(time.perf_counter() - t0)
            del value, ref
"""

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
""" + TIMED.replace("{calls}", repr(["result_get", "result_task", "argument"])) + """
assert ray.get(held.options(scheduling_strategy=there).remote()).sum() == n
print(json.dumps(samples), flush=True)
ray.shutdown()
"""

RAY_DRIVER = """
import json, sys, time
import numpy as np
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

MB, REPEAT = {mb}, {repeat}
cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1}})
node = cluster.add_node(num_cpus=2, resources={{"member": 1}})
ray.init(address=cluster.address)
cluster.wait_for_nodes()
there = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
n = MB * 1000 * 1000 // 8
""" + TIMED.replace("{calls}", repr(["result_get", "argument"])) + """
print(json.dumps(samples), flush=True)
ray.shutdown()
cluster.shutdown()
"""


def _receiver(size: int, rounds: int) -> None:
    """The other end of ``raw_tcp`` and ``channel_mac``, on 127.0.0.2."""
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(2)
    print(listener.getsockname()[1], flush=True)
    view = memoryview(bytearray(size))
    view[:] = b"\0" * size  # its pages exist before the first round
    conn, _ = listener.accept()
    with conn:
        for _ in range(rounds):
            got = 0
            while got < size:
                n = conn.recv_into(view[got:])
                if not n:
                    raise SystemExit("raw: the sender closed early")
                got += n
            conn.sendall(b"!")
    conn, _ = listener.accept()
    with ph.accept(conn, TOKEN, timeout=30) as channel:
        channel.send_bytes(b"ready")
        for _ in range(rounds):
            if hasattr(channel, "recv_value_into"):
                channel.recv_value_into(view, timeout=60)
            else:  # a miniray before values were received as one
                got = 0
                while got < size:
                    got += channel.recv_bytes_into(view[got:], timeout=60)
            channel.send_bytes(b"!")
    listener.close()


def _links(size: int, rounds: int) -> dict:
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", "--bytes", str(size),
                             "--repeat", str(rounds)], stdout=subprocess.PIPE, text=True)
    samples: dict[str, list] = {"raw_tcp": [], "channel_mac": []}
    try:
        port = int(proc.stdout.readline())
        payload = os.urandom(size)
        with socket.create_connection(("127.0.0.2", port),
                                      source_address=("127.0.0.1", 0)) as sock:
            for _ in range(rounds):
                start = time.perf_counter()
                sock.sendall(payload)
                assert sock.recv(1) == b"!"
                samples["raw_tcp"].append(time.perf_counter() - start)
        with ph.connect(("127.0.0.2", port), TOKEN, "bench", timeout=30,
                        source_address=("127.0.0.1", 0)) as channel:
            assert channel.recv_bytes(timeout=60) == b"ready"
            for _ in range(rounds):
                start = time.perf_counter()
                send_in_frames(channel.send_bytes, payload)
                assert channel.recv_bytes(timeout=60) == b"!"
                samples["channel_mac"].append(time.perf_counter() - start)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return samples


def _ray(mb: int, repeat: int, python: str, timeout: float) -> tuple[dict, str | None]:
    if not os.path.exists(python):
        return {}, f"Ray skipped: no interpreter at {python}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIRAY_", "RAY_"))}
    env.pop("PYTHONPATH", None)
    try:
        run = subprocess.run([python, "-c", textwrap.dedent(RAY_DRIVER.format(
            mb=mb, repeat=repeat))], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, f"Ray skipped: its two-node cluster took more than {timeout:.0f} s"
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {}, "Ray skipped: " + (run.stderr.strip().splitlines() or ["no output"])[-1]
    return {f"ray_{k}": v for k, v in json.loads(lines[-1]).items()}, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON object instead")
    parser.add_argument("--links-only", action="store_true",
                        help="raw_tcp and channel_mac only (no cluster, no numpy)")
    parser.add_argument("--ray-python", default=RAY_PYTHON)
    parser.add_argument("--ray-timeout", type=float, default=300.0)
    parser.add_argument("--shm-root", default="/dev/shm",
                        help="where each fake host's store folder is made (a tmpfs, e.g. "
                             "one mounted huge=within_size)")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        _receiver(args.bytes, args.repeat)
        return
    started = time.monotonic()
    size = args.mb * 1000 * 1000
    samples = _links(size, args.repeat)
    note = None
    if args.links_only:
        load = [round(x, 2) for x in os.getloadavg()]
    else:
        code = textwrap.dedent(DRIVER.format(mb=args.mb, repeat=args.repeat))
        doc = fake_hosts.run_on_two_hosts(code, prefix="mr-bench-pull-", own_shm_dirs=True,
                                         shm_root=args.shm_root)
        load = doc.pop("load_average")
        samples.update(doc)
    if not args.no_ray and not args.links_only:
        ray_samples, note = _ray(args.mb, args.repeat, args.ray_python, args.ray_timeout)
        samples.update(ray_samples)
    out = {name: {"best_ms": round(min(v) * 1e3, 1),
                  "median_ms": round(statistics.median(v) * 1e3, 1),
                  "gb_per_s": round(size / min(v) / 1e9, 3)} for name, v in samples.items()}
    raw = out["raw_tcp"]["gb_per_s"]
    ratios = {f"{name}/raw_tcp": round(v["gb_per_s"] / raw, 3) for name, v in out.items()}
    for name in ("result_get", "argument"):
        if f"ray_{name}" in out:
            ratios[f"{name}/ray"] = round(out[name]["gb_per_s"] / out[f"ray_{name}"]["gb_per_s"],
                                          3)
    doc = {"mb": args.mb, "repeat": args.repeat, "shm_root": args.shm_root,
           "figures": out, "ratios": ratios,
           "note": note, "load_average": load, "cpus": os.cpu_count(),
           "mac_threads": _mac_threads(), "miniray": _which_miniray(),
           "seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"bench_pull: {args.mb} MB, repeat {args.repeat}, stores under {args.shm_root}, "
          f"{doc['cpus']} CPUs, load average "
          f"{' '.join(map(str, load))}, MAC threads {doc['mac_threads']}, miniray "
          f"{doc['miniray']}, {doc['seconds']} s", flush=True)
    for name, v in out.items():
        versus = f"{ratios[f'{name}/raw_tcp']:.3f}x raw_tcp"
        if f"{name}/ray" in ratios:
            versus += f", {ratios[f'{name}/ray']:.3f}x Ray"
        print(f"{name:<14} best {v['best_ms']:8.1f} ms  median {v['median_ms']:8.1f} ms  "
              f"{v['gb_per_s']:6.3f} GB/s  {versus}")
    if note:
        print(note)


def _mac_threads():
    """The MAC pool's size in these processes (None: a miniray without the pool)."""
    try:
        from miniray._private.core import config
    except ImportError:
        return None
    return config.peer_mac_threads() if hasattr(config, "peer_mac_threads") else None


def _which_miniray() -> str:
    """The miniray these processes import: its folder and, in a git tree, its commit."""
    import miniray

    folder = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))
    try:
        commit = subprocess.run(["git", "-C", folder, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{folder}@{commit}" if commit else folder


if __name__ == "__main__":
    main()
