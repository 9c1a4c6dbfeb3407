"""The object store on ``/dev/shm`` against a tmpfs mounted with ``huge=within_size``.

A child process per run and directory, alternating: ``init(num_cpus=1)``, then (each the
first of its session, so every segment is new)

* ``first_put_ms``: ``put`` of a 200 MB float64 array (after a small put), and
  ``first_put_vs_memcpy``: the same child's memcpy of it (``np.copyto`` into a written
  buffer, best of 5) / that time;
* ``task_result_ms``: a task that returns the 200 MB array its worker made and touched
  on a first call (the worker's write of it into a new segment is the cost), submit to
  the driver holding its result;
* ``get_ms``: the driver's ``get`` of that result and a read of one byte per 4 KiB page
  (the mapping's page faults: 2 MiB pages need 512 times fewer).

The tmpfs is mounted in a mount namespace of this script's own (``unshare -m``, else
``unshare -r -m``), so nothing is mounted on the machine and it goes when the script exits;
the sessions' roots are in a temporary directory. Prints each directory's median
[min-max] of ``--runs`` runs and the load average.

    python benchmarks/bench_huge_pages.py [--runs 5] [--mb 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import numpy as np
import miniray as ray

n = int(sys.argv[1]) << 17  # float64 items of that many MiB
arr = np.random.default_rng(0).random(n)
dst = np.empty_like(arr)
np.copyto(dst, arr)
memcpy = []
for _ in range(5):
    t = time.perf_counter(); np.copyto(dst, arr); memcpy.append(time.perf_counter() - t)
del dst
ray.init(num_cpus=1)


@ray.remote
def make(n, keep=[]):
    if not keep:
        keep.append(np.ones(n))  # made and touched once; returned as it is after
        return None
    return keep[0]


ray.get(make.remote(n))  # a warm worker holding its array
ray.put(1)
t = time.perf_counter(); ref = ray.put(arr); put = time.perf_counter() - t
t = time.perf_counter(); done = make.remote(n); ray.wait([done]); made = time.perf_counter() - t
t = time.perf_counter()
int(ray.get(done).view(np.uint8)[::4096].sum())  # a byte of every 4 KiB page
got = time.perf_counter() - t
ray.shutdown()
print(json.dumps({"first_put_ms": put * 1e3, "first_put_vs_memcpy": min(memcpy) / put,
                  "task_result_ms": made * 1e3, "get_ms": got * 1e3}))
"""

MOUNT = ("mount -t tmpfs -o huge=within_size,size={size}m,mode=0700 tmpfs {point}"
         " && exec \"$@\"")


def _inside(args) -> None:
    root = tempfile.mkdtemp(prefix="mr-bench-huge-")
    try:
        _measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(args, root: str) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    dirs = {"/dev/shm": "/dev/shm", "huge=within_size": args.point}
    figures: dict = {name: [] for name in dirs}
    for _ in range(args.runs):
        for name, shm in dirs.items():
            env = dict(os.environ, MINIRAY_TMPDIR=os.path.join(root, "tmp"),
                       MINIRAY_HOST_DIR=os.path.join(root, "host"),  # a GPU host's ledger too
                       MINIRAY_SHM_DIR=shm, PYTHONPATH=here)
            done = subprocess.run([sys.executable, script, str(args.mb)], env=env, cwd=root,
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                sys.exit(f"a run on {shm} failed:\n{done.stderr}")
            figures[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.mb} MB, {args.runs} runs per directory, alternating; "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    keys = ("first_put_ms", "first_put_vs_memcpy", "task_result_ms", "get_ms")
    print(f"{'':18}" + "".join(f"{k:>26}" for k in keys))
    for name, runs in figures.items():
        cells = []
        for key in keys:
            values = sorted(r[key] for r in runs)
            cells.append(f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}]")
        print(f"{name:18}" + "".join(f"{c:>26}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--point", help=argparse.SUPPRESS)  # set inside the namespace
    args = parser.parse_args()
    if args.point:
        return _inside(args)
    point = tempfile.mkdtemp(prefix="mr-bench-huge-shm-")
    try:
        mount = MOUNT.format(size=args.mb * 4 + 64, point=point)
        command = [sys.executable, os.path.abspath(__file__), "--runs", str(args.runs),
                   "--mb", str(args.mb), "--point", point]
        tried = []
        for flags in (["-m"], ["-r", "-m"]):  # a probe first: a failed run is not retried
            prefix = ["unshare", *flags, "--propagation", "private", "sh", "-c", mount, "sh"]
            probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
            if probe.returncode == 0:
                sys.exit(subprocess.run([*prefix, *command]).returncode)
            tried.append(f"unshare {' '.join(flags)}: {probe.stderr.strip()}")
        sys.exit("no mount namespace with a tmpfs could be made here (" + "; ".join(tried)
                 + ")")
    finally:
        os.rmdir(point)


if __name__ == "__main__":
    main()
