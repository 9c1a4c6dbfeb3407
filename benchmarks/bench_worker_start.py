"""Why workers come from miniray's own fork server and not from ``multiprocess``.

The design card names ``multiprocess`` (the dill-based fork of ``multiprocessing``). This script
measures, side by side in one run, what a worker start costs each way, and what pickling a
closure costs with each library's pickler, next to the floor of a pipe round trip:

* ``pipe_rt_us``: a ``multiprocessing.Pipe`` echo to an existing process (the floor).
* ``fresh_worker_ms``: a fresh worker process that runs one no-op and returns its result:
  miniray's fork server (``@remote(max_calls=1)``, so every call gets a new process, timed
  after a warm-up), ``multiprocess`` with the ``forkserver`` and ``spawn`` start methods (the
  two that are safe from a threaded driver), and the standard library's ``forkserver``.
* ``closure_pickle_us``: ``dumps`` plus ``loads`` of a small closure, cloudpickle against dill.

Run it with an interpreter that has ``multiprocess`` installed and miniray importable (neither
is a dependency of the other)::

    python -m venv /tmp/mp && /tmp/mp/bin/pip install multiprocess cloudpickle numpy
    PYTHONPATH=. /tmp/mp/bin/python benchmarks/bench_worker_start.py

It prints one JSON object. Figures are medians; read the ratios, not the absolute times.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def _noop(x=None):
    return x


def _echo(conn):
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(msg)


def pipe_round_trip_us(n: int = 2000) -> float:
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(child,))
    proc.start()
    for _ in range(200):
        parent.send(1)
        parent.recv()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        parent.send(1)
        parent.recv()
        samples.append(time.perf_counter() - t)
    parent.send(None)
    proc.join()
    return statistics.median(samples) * 1e6


def fresh_process_ms(mod, method: str, n: int = 20) -> float:
    ctx = mod.get_context(method)
    samples = []
    for _ in range(n + 2):
        parent, child = ctx.Pipe()
        t = time.perf_counter()
        proc = ctx.Process(target=_send_one, args=(child,))
        proc.start()
        parent.recv()
        samples.append(time.perf_counter() - t)
        proc.join()
    return statistics.median(samples[2:]) * 1e3  # the first two start the server


def _send_one(conn):
    conn.send(_noop(1))


def miniray_fresh_worker_ms(n: int = 20) -> float:
    import miniray

    miniray.init(num_cpus=2)
    try:
        f = miniray.remote(max_calls=1)(_noop)
        for _ in range(3):
            miniray.get(f.remote(1))
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            miniray.get(f.remote(1))
            samples.append(time.perf_counter() - t)
        return statistics.median(samples) * 1e3
    finally:
        miniray.shutdown()


def closure_pickle_us(dumps, loads, n: int = 2000) -> float:
    offset = 3

    def add(x):
        return x + offset

    samples = []
    for _ in range(n):
        t = time.perf_counter()
        loads(dumps(add))
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> int:
    import multiprocessing

    import cloudpickle

    out: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    out["pipe_rt_us"] = round(pipe_round_trip_us(), 1)
    fresh = {"miniray_forkserver": round(miniray_fresh_worker_ms(), 2)}
    fresh["stdlib_forkserver"] = round(fresh_process_ms(multiprocessing, "forkserver"), 2)
    pickles = {"cloudpickle": round(closure_pickle_us(cloudpickle.dumps, cloudpickle.loads), 1)}
    try:
        import dill
        import multiprocess
    except ImportError:
        out["multiprocess"] = "not installed"
    else:
        out["multiprocess_version"] = multiprocess.__version__
        fresh["multiprocess_forkserver"] = round(fresh_process_ms(multiprocess, "forkserver"), 2)
        fresh["multiprocess_spawn"] = round(fresh_process_ms(multiprocess, "spawn", n=8), 2)
        pickles["dill"] = round(closure_pickle_us(dill.dumps, dill.loads), 1)
    out["fresh_worker_ms"] = fresh
    out["closure_pickle_us"] = pickles
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
