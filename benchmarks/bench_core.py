"""Core-runtime workloads for one implementation, run in this interpreter.

Owns: the workloads of the "start-up, round trip, throughput, footprint" issue and the way each
is measured. Does not own: comparing implementations or judging targets (``compare.py`` runs
this script once per implementation, each in its own process, and prints the table).

    python benchmarks/bench_core.py --impl {miniray,ray,ppe,pipe}

prints exactly one JSON object on stdout (anything a library prints while the workloads run is
sent to stderr, so stdout stays parseable) and exits 1 if a workload failed (its error is in
the object's ``errors``).

Workloads, all with the same no-op function (``def noop(): return None``)::

    start_to_init_s     parent: perf_counter() before Popen([python, -c, CHILD]) ... until the
                        child's line printed right after init() returned; median of 3 children.
                        (One unmeasured child imports the module first, so page-cache misses
                        of a first import do not count.)
    shutdown_s          the same children then run 2 concurrent no-op tasks (workers exist),
                        and time shutdown() themselves; median of 3.
    round_trip_ms       in this process: init(), 200 warm-up calls, then 2,000 sequential
                        get(f.remote()), each timed; mean and p50 (p99 in details).
    throughput_tasks_per_s
                        refs = [f.remote() for _ in range(10_000)]; get(refs), wall time
                        including submission; best of 3.
    processes_after_init, rss_mb_driver_and_2_workers, pss_mb_driver_and_2_workers
                        in a dedicated child: init(), two concurrent 0.3 s tasks (so at least
                        2 workers exist), 1 s to settle, then the child itself plus every
                        descendant process (walked through /proc/*/stat ppid links): count,
                        sum of VmRSS (/proc/<pid>/status) and sum of Pss
                        (/proc/<pid>/smaps_rollup; RSS counts pages shared after fork once per
                        process, PSS splits them).

``--impl ppe`` runs the round trip, throughput and footprint with
``concurrent.futures.ProcessPoolExecutor(2)`` (``ex.submit(noop).result()``; 10,000
``ex.submit`` then every ``.result()``). ``--impl pipe`` is the floor: the round trip of a
small message (``conn.send(None)`` / ``recv()``) over ``multiprocessing.Pipe`` between two
processes.

Ray is measured as users run it: plain ``ray.init()`` with no arguments (dashboard and all
defaults), ``RAY_ADDRESS`` removed from the environment, and no ``ray start`` cluster running,
so every init starts a fresh local cluster. miniray and ray are imported only inside the
functions that need them, never at module level.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

IMPLS = ("miniray", "ray", "ppe", "pipe")
# Removed from the environment, so no init() joins a cluster or node someone else started.
UNSET_ENV = ("RAY_ADDRESS", "MINIRAY_ADDRESS")
MODULES = {"miniray": "miniray", "ray": "ray"}

START_RUNS = 3
ROUND_TRIP_WARMUP = 200
ROUND_TRIP_CALLS = 2_000
THROUGHPUT_TASKS = 10_000
THROUGHPUT_RUNS = 3
FOOTPRINT_TASK_S = 0.3
FOOTPRINT_SETTLE_S = 1.0
CHILD_TIMEOUT_S = 90.0
DEFAULT_TOTAL_TIMEOUT_S = 300.0


def noop():
    return None


def sleep_then_pid():
    """The footprint's task: long enough that two submitted together need two workers."""
    time.sleep(FOOTPRINT_TASK_S)
    return os.getpid()


# The same no-op, for the children started with ``-c``.
NOOP_SOURCE = "def noop():\n    return None\n"

# Start-up child: prints READY right after init() returned (the parent stops its clock on that
# line), then runs 2 concurrent tasks and times its own shutdown().
START_CHILD = (
    "import time\n"
    "t0 = time.perf_counter()\n"
    "import {module} as ray\n"
    "t1 = time.perf_counter()\n"
    "ray.init()\n"
    "t2 = time.perf_counter()\n"
    "print('READY', t1 - t0, t2 - t1, flush=True)\n" + NOOP_SOURCE + "f = ray.remote(noop)\n"
    "ray.get([f.remote(), f.remote()])\n"
    "t3 = time.perf_counter()\n"
    "ray.shutdown()\n"
    "t4 = time.perf_counter()\n"
    "print('SHUTDOWN', t4 - t3, flush=True)\n"
)


# --------------------------------------------------------------------------------------------
# helpers


def _child_env() -> dict[str, str]:
    """The environment for children: no RAY_ADDRESS / MINIRAY_ADDRESS (so each init starts a
    fresh runtime) and a PYTHONPATH that makes them import the same miniray as this process."""
    env = dict(os.environ)
    for name in UNSET_ENV:
        env.pop(name, None)
    extra = os.environ.get("_MINIRAY_BENCH_SYS_PATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    return env


def _import_impl(impl: str):
    """Import miniray or ray. For miniray, fall back to the source tree next to this script
    when it is not installed, and remember where it came from for the children."""
    import importlib

    name = MODULES[impl]
    try:
        return importlib.import_module(name)
    except ImportError:
        if impl != "miniray":
            raise
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ["_MINIRAY_BENCH_SYS_PATH"] = root
    return importlib.import_module(name)


def _summary(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        "min_ms": ordered[0] * 1e3,
        "n": len(ordered),
    }


def _read_proc_kb(path: str, field: str) -> int | None:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _ppid_map() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # comm (field 2) may hold spaces and parentheses; ppid is the 2nd field after it.
        fields = stat.rsplit(")", 1)[1].split()
        parents[int(entry)] = int(fields[1])
    return parents


def _process_tree(root: int) -> list[dict]:
    """``root`` and every descendant, each with its name, VmRSS and Pss in MB."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            # Paths shortened to their last part, so the JSON says "raylet", "log_monitor.py".
            words = (os.path.basename(a.decode(errors="replace")) for a in argv[:4] if a)
            name = " ".join(words)[:100]
        except OSError:
            continue
        rss = _read_proc_kb(f"/proc/{pid}/status", "VmRSS")
        pss = _read_proc_kb(f"/proc/{pid}/smaps_rollup", "Pss")
        tree.append(
            {
                "pid": pid,
                "cmd": name,
                "rss_mb": None if rss is None else rss / 1024,
                "pss_mb": None if pss is None else pss / 1024,
            }
        )
    return tree


def _run_child(argv: list[str], timeout: float) -> str:
    proc = subprocess.run(
        argv,
        capture_output=True,
        env=_child_env(),
        timeout=timeout,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {argv[1:3]} exited with {proc.returncode}; stderr tail:\n{proc.stderr[-2000:]}"
        )
    return proc.stdout


# --------------------------------------------------------------------------------------------
# workloads


def _start_child_once(code: str) -> dict[str, float]:
    """One start-up child; the parent's clock runs from just before Popen to its READY line."""
    # stderr goes to a temp file, not a pipe: Ray logs a lot and nobody reads it live.
    with open(os.devnull, "wb") as devnull, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=devnull,
            stdout=subprocess.PIPE,
            stderr=err,
            env=_child_env(),
        )
        watchdog = threading.Timer(CHILD_TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            ready = proc.stdout.readline()
            while ready and not ready.startswith(b"READY"):
                ready = proc.stdout.readline()  # a library's own print, not ours
            t1 = time.perf_counter()
            rest = proc.stdout.read()
            t2 = time.perf_counter()
            proc.wait()
            t3 = time.perf_counter()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        shutdown = [ln for ln in rest.split(b"\n") if ln.startswith(b"SHUTDOWN")]
        if not ready or not shutdown or proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-3000:].decode(errors="replace")
            raise RuntimeError(
                f"start child exited with {proc.returncode} (killed after {CHILD_TIMEOUT_S} s "
                f"if negative), printed {ready + rest!r}; stderr tail:\n{tail}"
            )
    _, imported, init_call = ready.split()
    return {
        "start_to_init": t1 - t0,
        "import": float(imported),
        "init_call": float(init_call),
        "shutdown": float(shutdown[0].split()[1]),
        "exit_after_shutdown": t3 - t2,
    }


def start_and_shutdown(impl: str) -> dict:
    module = MODULES[impl]
    # Unmeasured: warm the page cache with one import.
    _run_child([sys.executable, "-c", f"import {module}"], CHILD_TIMEOUT_S)
    code = START_CHILD.format(module=module)
    runs = [_start_child_once(code) for _ in range(START_RUNS)]
    return {
        "start_to_init_s": statistics.median(r["start_to_init"] for r in runs),
        "shutdown_s": statistics.median(r["shutdown"] for r in runs),
        "details": {
            "start_to_init_runs_s": [r["start_to_init"] for r in runs],
            "child_import_s": [r["import"] for r in runs],
            "child_init_call_s": [r["init_call"] for r in runs],
            "shutdown_runs_s": [r["shutdown"] for r in runs],
            "child_exit_after_shutdown_s": [r["exit_after_shutdown"] for r in runs],
        },
    }


def _footprint_child(impl: str) -> None:
    """Runs in the dedicated footprint child: start, make 2 workers exist, measure itself."""
    if impl == "ppe":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(2) as ex:
            futs = [ex.submit(time.sleep, FOOTPRINT_TASK_S) for _ in range(2)]
            for fut in futs:
                fut.result()
            time.sleep(FOOTPRINT_SETTLE_S)
            tree = _process_tree(os.getpid())
    else:
        ray = _import_impl(impl)
        ray.init()
        f = ray.remote(sleep_then_pid)
        worker_pids = ray.get([f.remote(), f.remote()])
        time.sleep(FOOTPRINT_SETTLE_S)
        tree = _process_tree(os.getpid())
        ray.shutdown()
        if len(set(worker_pids)) < 2:
            print(f"note: both tasks ran in one worker (pid {worker_pids[0]})", file=sys.stderr)
    print(json.dumps(tree))


def footprint(impl: str) -> dict:
    out = _run_child(
        [sys.executable, os.path.abspath(__file__), "--impl", impl, "--_footprint-child"],
        CHILD_TIMEOUT_S,
    )
    tree = json.loads(out.strip().splitlines()[-1])
    return {
        "processes_after_init": len(tree),
        "rss_mb_driver_and_2_workers": sum(p["rss_mb"] or 0 for p in tree),
        "pss_mb_driver_and_2_workers": sum(p["pss_mb"] or 0 for p in tree),
        "details": {"processes": tree},
    }


def time_calls(call_one, count: int, warmup: int = 0) -> list[float]:
    """``warmup`` untimed calls of ``call_one()``, then the duration of each of ``count``."""
    for _ in range(warmup):
        call_one()
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        call_one()
        samples.append(time.perf_counter() - t0)
    return samples


def time_batches(submit, get, batches: int, size: int, rate_key: str) -> list[dict]:
    """``batches`` times: ``refs = submit()`` (``size`` of them), then ``get(refs)``; for each,
    the rate under ``rate_key`` (size / total), the submission time and the total time."""
    runs = []
    for _ in range(batches):
        t0 = time.perf_counter()
        refs = submit()
        t_submitted = time.perf_counter()
        get(refs)
        elapsed = time.perf_counter() - t0
        runs.append({rate_key: size / elapsed, "submit_s": t_submitted - t0, "total_s": elapsed})
        del refs
    return runs


def _round_trip_and_throughput(call_one, submit_many) -> dict:
    rt = _summary(time_calls(call_one, ROUND_TRIP_CALLS, ROUND_TRIP_WARMUP))
    runs = []
    for _ in range(THROUGHPUT_RUNS):
        t0 = time.perf_counter()
        submit_many(THROUGHPUT_TASKS)
        runs.append(THROUGHPUT_TASKS / (time.perf_counter() - t0))
    return {
        "round_trip_ms": rt["mean_ms"],
        "round_trip_p50_ms": rt["p50_ms"],
        "throughput_tasks_per_s": max(runs),
        "details": {"round_trip": rt, "throughput_runs_tasks_per_s": runs},
    }


def tasks_in_process(impl: str) -> dict:
    if impl == "ppe":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(2) as ex:

            def many(n):
                futs = [ex.submit(noop) for _ in range(n)]
                return [fut.result() for fut in futs]

            return _round_trip_and_throughput(lambda: ex.submit(noop).result(), many)

    ray = _import_impl(impl)
    ray.init()
    try:
        f = ray.remote(noop)

        def many(n):
            refs = [f.remote() for _ in range(n)]
            return ray.get(refs)

        return _round_trip_and_throughput(lambda: ray.get(f.remote()), many)
    finally:
        ray.shutdown()


def _echo(conn, other_end) -> None:
    other_end.close()  # inherited through fork; closed so the parent's close() means EOF here
    try:
        while True:
            conn.send(conn.recv())
    except EOFError:
        pass


def pipe_round_trip(impl: str) -> dict:
    import multiprocessing

    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=_echo, args=(child, parent), daemon=True)
    proc.start()
    child.close()
    try:

        def call_one():
            parent.send(None)
            parent.recv()

        samples = time_calls(call_one, ROUND_TRIP_CALLS, ROUND_TRIP_WARMUP)
    finally:
        parent.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    rt = _summary(samples)
    return {
        "round_trip_ms": rt["mean_ms"],
        "round_trip_p50_ms": rt["p50_ms"],
        "details": {"round_trip": rt, "message": "conn.send(None); conn.recv() echoed"},
    }


WORKLOADS = {
    # Children first, so the in-process runtime does not compete with them for the 2 cores.
    "miniray": [start_and_shutdown, footprint, tasks_in_process],
    "ray": [start_and_shutdown, footprint, tasks_in_process],
    "ppe": [footprint, tasks_in_process],
    "pipe": [pipe_round_trip],
}


# --------------------------------------------------------------------------------------------
# main


def _describe(impl: str) -> dict:
    info = {
        "impl": impl,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "date": datetime.date.today().isoformat(),
    }
    if impl in MODULES:
        module = _import_impl(impl)
        info["version"] = getattr(module, "__version__", None)
        info["module_file"] = getattr(module, "__file__", None)
    if impl == "ray":
        info["init"] = "ray.init() with no arguments, RAY_ADDRESS unset (a fresh local cluster)"
        info["existing_ray_start_cluster"] = os.path.exists("/tmp/ray/ray_current_cluster")
    elif impl == "miniray":
        info["init"] = "miniray.init() with no arguments"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=IMPLS, required=True)
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TOTAL_TIMEOUT_S,
        help="dump every thread's stack and exit if the whole run takes longer (seconds)",
    )
    parser.add_argument("--_footprint-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in UNSET_ENV:
        os.environ.pop(name, None)

    if args._footprint_child:
        _footprint_child(args.impl)
        return 0

    faulthandler.dump_traceback_later(args.timeout, exit=True)
    # Keep stdout for the one JSON object; whatever the libraries print goes to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)

    result = _describe(args.impl)
    result["errors"] = {}
    details = {}
    for workload in WORKLOADS[args.impl]:
        t0 = time.perf_counter()
        print(f"[bench_core {args.impl}] {workload.__name__} ...", file=sys.stderr, flush=True)
        try:
            measured = workload(args.impl)
        except Exception:
            result["errors"][workload.__name__] = traceback.format_exc()
            print(traceback.format_exc(), file=sys.stderr)
            continue
        details[workload.__name__] = measured.pop("details", {})
        details[workload.__name__]["elapsed_s"] = time.perf_counter() - t0
        result.update(measured)
    result["details"] = details
    faulthandler.cancel_dump_traceback_later()
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
