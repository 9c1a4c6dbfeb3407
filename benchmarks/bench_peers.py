"""miniray against every single-host peer, side by side in one run, with ratios to the best.

Owns: the peer workloads and their table. Does not own: the issue-specific suites
(``compare.py`` and the ``bench_*.py`` scripts it runs).

    python benchmarks/bench_peers.py [--only miniray,ray,mp,ppe,loky] [--ray-python PATH]
                                     [--json OUT]
    python benchmarks/bench_peers.py --impl miniray      # one implementation: one JSON object

Implementations, each run in its own child process with 2 workers:

* ``miniray``: ``init(num_cpus=2)``; ``ray``: Ray 2.60, ``init(num_cpus=2,
  include_dashboard=False)``, run with ``--ray-python`` (default: the venv of
  ``setup_ray_venv.sh``; skipped with a note when there is none);
* ``mp``: ``multiprocessing.Pool(2)``; ``ppe``: ``concurrent.futures.ProcessPoolExecutor(2)``;
  ``loky``: ``loky.get_reusable_executor(max_workers=2)`` (``setup_peers.sh`` installs loky
  into the benchmark's interpreter; it is never a dependency of miniray; skipped when absent).
  Each with the platform's default start method, as users get it.

Workloads (the array is ``np.random.default_rng(0).random(25_000_000)``, 200 MB of float64,
made before anything is timed; the task given it is ``def size(a): return len(a)``):

* ``start_s``: ``init()`` or the pool's constructor, until it returned.
* ``first_task_ms``: right after that, the first no-op submitted and its result received
  (a worker's start included where workers start lazily).
* ``round_trip_p50_ms``: 200 warm-up no-ops, then 2,000 sequential round trips; p50.
* ``round_trip_spaced_p50_ms``: then 100 round trips, each 20 ms after the last ended (a
  program that submits at its own pace: workers and threads have gone to sleep); p50.
* ``first_vs_warm``: ``first_task_ms`` / ``round_trip_p50_ms``.
* ``tasks_10k_s``: 10,000 no-ops submitted, then every result taken; wall time; best of 3.
* ``async_actor_10k_s`` (miniray and Ray): 10,000 calls of ``async def f(self): return None``
  on one actor, submitted then gotten (``get`` of the list); best of 3, after 200 warm-up
  calls; ``async_vs_tasks``: ``tasks_10k_s`` / that (at least 1.0: the calls go at the
  no-op task rate of the same run or faster).
* ``arg_by_value_ms``: ``size(arr)`` by value, submit to result; median of 3 after a first
  call.
* ``arg_by_ref_ms`` (miniray and Ray): ``size(put(arr))``, the put included, the ref dropped
  each time; median of 3.
* ``arg_by_stored_ref_ms`` (miniray and Ray): ``size(ref)`` of a ref already stored; median
  of 5.
* ``first_put_ms``, ``first_put_vs_memcpy`` (miniray and Ray): the session's first
  ``put(arr)`` (after a small put); ``memcpy_ms`` (``np.copyto`` of the same 200 MB into a
  written buffer, best of 5 in the same run) / that time.
* ``pipe_round_trip_ms`` (the round trip's floor, measured in each child before the
  implementation starts): one byte to a forked child over a pipe and back over another,
  200 warm-up then 2,000 timed; p50.

``ratio`` columns: each figure against the best implementation's (1.00 = the best; for
times, value / best; for ``tasks_10k_s`` and ``first_put_vs_memcpy``, best / value).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench_core import _child_env, _import_impl  # noqa: E402  (imports no library at import)

IMPLS = ("miniray", "ray", "mp", "ppe", "loky")
DEFAULT_RAY_VENV = os.path.join(os.path.expanduser("~"), ".cache", "miniray-bench", "ray-2.60")
CHILD_TIMEOUT_S = 400
ARRAY_ITEMS = 25_000_000
ROUND_TRIPS, WARMUP, TASKS = 2_000, 200, 10_000
SPACED_TRIPS, SPACED_GAP_S = 100, 0.02

# key, label, higher_is_better, format
METRICS = [
    ("start_s", "init() / pool constructor", False, "{:.3f} s"),
    ("first_task_ms", "first no-op after it", False, "{:.1f} ms"),
    ("round_trip_p50_ms", "no-op round trip, p50", False, "{:.3f} ms"),
    ("round_trip_spaced_p50_ms", "no-op round trip 20 ms after the last, p50", False,
     "{:.3f} ms"),
    ("first_vs_warm", "first task / warm round trip", False, "{:.0f}x"),
    ("tasks_10k_s", "10,000 no-ops, submit then get", False, "{:.3f} s"),
    ("async_actor_10k_s", "10,000 async actor calls, submit then get", False, "{:.3f} s"),
    ("async_vs_tasks", "async actor calls / no-op tasks rate", True, "{:.2f}"),
    ("arg_by_value_ms", "200 MB argument by value", False, "{:.1f} ms"),
    ("arg_by_ref_ms", "200 MB argument: put + by ref", False, "{:.1f} ms"),
    ("arg_by_stored_ref_ms", "200 MB argument, ref already stored", False, "{:.2f} ms"),
    ("first_put_ms", "first 200 MB put", False, "{:.1f} ms"),
    ("first_put_vs_memcpy", "first put / memcpy speed", True, "{:.2f}"),
    ("memcpy_ms", "memcpy of 200 MB (floor)", False, "{:.1f} ms"),
    ("pipe_round_trip_ms", "pipe round trip, p50 (floor)", False, "{:.3f} ms"),
]


def noop():
    return None


def size(a):
    return len(a)


class AsyncNoop:
    async def f(self):
        return None


class _Futures:
    """One interface over each implementation: start, submit, result, put."""

    def __init__(self, impl: str):
        self.impl = impl
        self.lib = None
        self.pool = None
        self._remotes: dict = {}

    def start(self) -> None:
        impl = self.impl
        if impl in ("miniray", "ray"):
            self.lib = _import_impl(impl)
            kwargs = {"include_dashboard": False} if impl == "ray" else {}
            self.lib.init(num_cpus=2, **kwargs)
        elif impl == "mp":
            import multiprocessing

            self.pool = multiprocessing.Pool(2)
        elif impl == "ppe":
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(2)
        elif impl == "loky":
            import loky

            self.pool = loky.get_reusable_executor(max_workers=2)

    def submit(self, fn, *args):
        if self.lib is not None:
            return self._remote(fn).remote(*args)
        if self.impl == "mp":
            return self.pool.apply_async(fn, args)
        return self.pool.submit(fn, *args)

    def _remote(self, fn):
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = self.lib.remote(fn)
        return remote

    def result(self, future):
        if self.lib is not None:
            return self.lib.get(future)
        if self.impl == "mp":
            return future.get()
        return future.result()

    def results(self, futures):
        if self.lib is not None:
            return self.lib.get(futures)
        return [self.result(f) for f in futures]

    def stop(self) -> None:
        if self.lib is not None:
            self.lib.shutdown()
        elif self.impl == "mp":
            self.pool.close()
            self.pool.join()
        elif self.impl == "ppe":
            self.pool.shutdown()
        elif self.impl == "loky":
            self.pool.shutdown(wait=True)


def _pipe_round_trip_ms() -> float:
    """p50 of a byte's round trip to a forked child and back over two pipes (no threads
    run yet in this process: the child only reads and writes, then ``_exit``s)."""
    from_parent, to_child = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(to_child)
        os.close(from_child)
        while os.read(from_parent, 1):
            os.write(to_parent, b"x")
        os._exit(0)
    os.close(from_parent)
    os.close(to_parent)
    trips = []
    try:
        for _ in range(WARMUP + ROUND_TRIPS):
            t = time.perf_counter()
            os.write(to_child, b"x")
            os.read(from_child, 1)
            trips.append(time.perf_counter() - t)
    finally:
        os.close(to_child)
        os.waitpid(pid, 0)
        os.close(from_child)
    return statistics.median(trips[WARMUP:]) * 1e3


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_impl(impl: str) -> dict:
    import gc

    import numpy as np

    out: dict = {"impl": impl, "python": sys.executable, "details": {}}
    arr = np.random.default_rng(0).random(ARRAY_ITEMS)
    dst = np.empty_like(arr)
    np.copyto(dst, arr)
    memcpy = [_timed(lambda: np.copyto(dst, arr)) for _ in range(5)]
    out["memcpy_ms"] = min(memcpy) * 1e3
    out["pipe_round_trip_ms"] = _pipe_round_trip_ms()
    f = _Futures(impl)
    out["start_s"] = _timed(f.start)
    try:
        out["first_task_ms"] = _timed(lambda: f.result(f.submit(noop))) * 1e3
        if f.lib is not None:  # the first large put of the session, after a small one
            f.lib.put(1)
            holder = []
            out["first_put_ms"] = _timed(lambda: holder.append(f.lib.put(arr))) * 1e3
            out["first_put_vs_memcpy"] = out["memcpy_ms"] / out["first_put_ms"]
            del holder
            gc.collect()
        for _ in range(WARMUP):
            f.result(f.submit(noop))
        trips = [_timed(lambda: f.result(f.submit(noop))) for _ in range(ROUND_TRIPS)]
        out["round_trip_p50_ms"] = statistics.median(trips) * 1e3
        out["details"]["round_trip_min_ms"] = min(trips) * 1e3
        out["first_vs_warm"] = out["first_task_ms"] / out["round_trip_p50_ms"]
        spaced = []
        for _ in range(SPACED_TRIPS):
            time.sleep(SPACED_GAP_S)
            spaced.append(_timed(lambda: f.result(f.submit(noop))))
        out["round_trip_spaced_p50_ms"] = statistics.median(spaced) * 1e3
        runs = [_timed(lambda: f.results([f.submit(noop) for _ in range(TASKS)]))
                for _ in range(3)]
        out["tasks_10k_s"] = min(runs)
        out["details"]["tasks_10k_runs_s"] = runs
        if f.lib is not None:
            actor = f.lib.remote(AsyncNoop).remote()
            f.lib.get([actor.f.remote() for _ in range(WARMUP)])
            calls = [_timed(lambda: f.lib.get([actor.f.remote() for _ in range(TASKS)]))
                     for _ in range(3)]
            out["async_actor_10k_s"] = min(calls)
            out["async_vs_tasks"] = out["tasks_10k_s"] / out["async_actor_10k_s"]
            out["details"]["async_actor_10k_runs_s"] = calls
            f.lib.kill(actor)
            del actor
        assert f.result(f.submit(size, arr)) == len(arr)
        by_value = [_timed(lambda: f.result(f.submit(size, arr))) for _ in range(3)]
        out["arg_by_value_ms"] = statistics.median(by_value) * 1e3
        out["details"]["arg_by_value_runs_ms"] = [t * 1e3 for t in by_value]
        if f.lib is not None:
            by_ref = []
            for _ in range(3):
                by_ref.append(_timed(lambda: f.result(f.submit(size, f.lib.put(arr)))))
                gc.collect()
            out["arg_by_ref_ms"] = statistics.median(by_ref) * 1e3
            out["details"]["arg_by_ref_runs_ms"] = [t * 1e3 for t in by_ref]
            ref = f.lib.put(arr)
            f.result(f.submit(size, ref))
            stored = [_timed(lambda: f.result(f.submit(size, ref))) for _ in range(5)]
            out["arg_by_stored_ref_ms"] = statistics.median(stored) * 1e3
            out["details"]["by_value_vs_by_ref"] = out["arg_by_value_ms"] / out["arg_by_ref_ms"]
            del ref
    finally:
        f.stop()
    return out


# --- the parent: one child per implementation, then the table ------------------------------


def _child(impl: str, python: str) -> tuple[dict | None, str]:
    cmd = [python, os.path.abspath(__file__), "--impl", impl]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              env=_child_env())
    except subprocess.TimeoutExpired:
        return None, f"{impl}: timed out after {CHILD_TIMEOUT_S} s"
    if proc.returncode != 0:
        return None, f"{impl}: exit {proc.returncode}: {proc.stderr.strip()[-600:]}"
    # Ray's raylet may print warnings on stdout before the result: the JSON is the last line
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None, f"{impl}: no result on stdout: {proc.stdout.strip()[-600:]}"
    return json.loads(lines[-1]), ""


def _ratio(value, best, higher_is_better: bool) -> str:
    if value is None or best in (None, 0) or value == 0:
        return ""
    return f"{(best / value) if higher_is_better else (value / best):.2f}"


def report(results: dict) -> None:
    impls = [i for i in IMPLS if results.get(i)]
    headers = ["metric"] + [h for i in impls for h in (i, "ratio")]
    rows = []
    for key, label, higher, spec in METRICS:
        values = {i: results[i].get(key) for i in impls}
        present = [v for v in values.values() if v is not None]
        if not present:
            continue
        best = max(present) if higher else min(present)
        row = [label]
        for i in impls:
            v = values[i]
            row += [spec.format(v) if v is not None else "n/a", _ratio(v, best, higher)]
        rows.append(row)
    widths = [max(len(r[c]) for r in rows + [headers]) for c in range(len(headers))]
    for r in [headers, ["-" * w for w in widths]] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=IMPLS, help="run one implementation, print its JSON")
    parser.add_argument("--only", help="comma-separated implementations (default: all)")
    parser.add_argument("--ray-python", default=os.path.join(DEFAULT_RAY_VENV, "bin", "python"))
    parser.add_argument("--json", help="write every raw result to this file")
    args = parser.parse_args(argv)
    if args.impl:
        print(json.dumps(run_impl(args.impl)))
        return 0
    wanted = args.only.split(",") if args.only else list(IMPLS)
    results, notes = {}, []
    for impl in wanted:
        python = sys.executable
        if impl == "ray":
            if not os.path.exists(args.ray_python):
                notes.append(f"ray: no interpreter at {args.ray_python}; run setup_ray_venv.sh")
                continue
            python = args.ray_python
        if impl == "loky" and subprocess.run(
                [python, "-c", "import loky"], capture_output=True).returncode != 0:
            notes.append("loky: not installed in this interpreter; run setup_peers.sh")
            continue
        print(f"running {impl} ...", file=sys.stderr, flush=True)
        results[impl], problem = _child(impl, python)
        if problem:
            notes.append(problem)
    report(results)
    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"results": results, "notes": notes}, out, indent=1)
    return 1 if any("exit" in n or "timed out" in n for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
