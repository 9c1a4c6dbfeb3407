"""Run the benchmarks for miniray, Ray 2.60 (and, for the core suite, two baselines); print tables.

Owns: which interpreter runs which implementation, the issues' targets, and the report.
Does not own: how a workload is measured (``bench_core.py``, ``bench_actors.py``,
``bench_gpu.py``, ``bench_store_e2e.py``, ``bench_node.py``).

    python benchmarks/compare.py [--suite core|actors|gpu|store|node|all] [--ray-python PATH]
                                 [--only miniray,ray,ppe,pipe] [--json OUT]

``--suite core`` (the default) runs ``bench_core.py`` for miniray, Ray, ppe and pipe; ``actors``,
``gpu``, ``store`` and ``node`` run their script for miniray and Ray only; ``all`` runs the five
suites one after the other and prints one table per suite. Each implementation runs in its own
process: miniray, ppe and pipe with this interpreter (so miniray is the one this interpreter
imports), Ray with ``--ray-python`` (default: the venv made by ``benchmarks/setup_ray_venv.sh``;
Ray is skipped with a note when there is none). Ray is never imported here nor by miniray.

The report judges miniray against the issues' targets; it exits 0 whatever the figures are,
and 1 only when a benchmark crashed (no JSON, or a workload that raised).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "bench_core.py")
IMPLS = ("miniray", "ray", "ppe", "pipe")
DEFAULT_RAY_VENV = os.path.join(os.path.expanduser("~"), ".cache", "miniray-bench", "ray-2.60")
BENCH_TIMEOUT_S = 420
# The actors, gpu, store and node scripts run each workload in a child with its own limit
# (harness.py); this bounds the whole script.
SUITE_TIMEOUT_S = 720

# metric key, label, unit, lower_is_better, target (miniray), format
METRICS = [
    ("start_to_init_s", "process start -> init() returned", "s", True, 0.25, "{:.3f}"),
    ("shutdown_s", "shutdown()", "s", True, 0.1, "{:.3f}"),
    ("round_trip_ms", "no-op round trip, mean", "ms", True, 0.2, "{:.3f}"),
    ("round_trip_p50_ms", "no-op round trip, p50", "ms", True, None, "{:.3f}"),
    ("throughput_tasks_per_s", "10,000 no-op tasks", "tasks/s", False, 15_000, "{:,.0f}"),
    ("processes_after_init", "processes (driver + all children)", "", True, None, "{:d}"),
    ("rss_mb_driver_and_2_workers", "RSS, driver + 2 workers", "MB", True, 150, "{:.0f}"),
    ("pss_mb_driver_and_2_workers", "PSS, driver + 2 workers", "MB", True, None, "{:.0f}"),
]

# Issue 4 (actors): init(num_cpus=2).
ACTOR_METRICS = [
    ("actor_call_ms", "sync actor call round trip, mean", "ms", True, 0.2, "{:.3f}"),
    ("actor_call_p50_ms", "sync actor call round trip, p50", "ms", True, None, "{:.3f}"),
    ("async_calls_per_s", "10,000 calls on one async actor", "calls/s", False, 15_000, "{:,.0f}"),
    ("actors_per_s", "20 actors created and pinged", "actors/s", False, 50, "{:,.1f}"),
]

# Issue 5 (GPUs): 2,000 tasks with num_gpus=0.25 on init(num_gpus=4, num_cpus=2).
GPU_METRICS = [
    (
        "gpu_default_tasks_per_s",
        "num_gpus=0.25 tasks, default (max_calls=1)",
        "tasks/s",
        False,
        100,
        "{:,.1f}",
    ),
    (
        "gpu_reuse_tasks_per_s",
        "num_gpus=0.25 tasks, max_calls=0",
        "tasks/s",
        False,
        10_000,
        "{:,.0f}",
    ),
]

# Issue 3 (object store), through the public API with init().
STORE_METRICS = [
    ("put_gbps", "put of a 200 MB float64 array", "GB/s", False, 8, "{:.2f}"),
    ("memcpy_gbps", "memcpy of the same array (np.copyto)", "GB/s", False, None, "{:.2f}"),
    ("put_vs_memcpy", "put / memcpy, same run", "", False, 0.5, "{:.3f}"),
    ("get_ms", "get of that ref, median of 20", "ms", True, 0.1, "{:.3f}"),
    ("get_first_ms", "get of that ref, first", "ms", True, None, "{:.3f}"),
    ("task_sum_ms", "task summing the array by ref", "ms", True, 20, "{:.1f}"),
    ("local_sum_ms", "arr.sum() in the driver (floor)", "ms", True, None, "{:.1f}"),
    ("small_puts_per_s", "put(1) x 20,000", "puts/s", False, 20_000, "{:,.0f}"),
    ("small_gets_per_s", "get of a small object x 50,000", "gets/s", False, 50_000, "{:,.0f}"),
    ("rss_delta_mb", "driver RSS after del + gc - baseline", "MB", True, 1, "{:.1f}"),
    ("shm_delta_mb", "/dev/shm used after del + gc - baseline", "MB", True, 1, "{:.1f}"),
    ("shm_new_files_mb", "/dev/shm files new since baseline, after del", "MB", True, 1, "{:.1f}"),
]

# Issue 6 (node): a node started from the shell (miniray start / ray start --head), a second
# driver, a detached named actor.
NODE_METRICS = [
    ("node_start_s", "CLI start -> node accepts drivers", "s", True, 1.0, "{:.3f}"),
    ("connect_s", "process start -> init(address) returned", "s", True, 0.25, "{:.3f}"),
    ("named_call_ms", "detached named actor, 2nd driver, call mean", "ms", True, 0.5, "{:.3f}"),
    ("named_call_p50_ms", "detached named actor, 2nd driver, call p50", "ms", True, None, "{:.3f}"),
    ("named_calls_per_s", "10,000 pipelined calls on it", "calls/s", False, 10_000, "{:,.0f}"),
    ("node_stop_s", "stop (miniray stop / SIGTERM to ray start)", "s", True, 1.0, "{:.3f}"),
]

# Rows whose Ray/miniray ratio means nothing (a yardstick, or a difference near zero).
NO_RATIO = {
    "memcpy_gbps",
    "local_sum_ms",
    "put_vs_memcpy",
    "rss_delta_mb",
    "shm_delta_mb",
    "shm_new_files_mb",
}

SUITES = {
    # name: (script, implementations, metrics, timeout)
    "core": ("bench_core.py", IMPLS, METRICS, BENCH_TIMEOUT_S),
    "actors": ("bench_actors.py", ("miniray", "ray"), ACTOR_METRICS, SUITE_TIMEOUT_S),
    "gpu": ("bench_gpu.py", ("miniray", "ray"), GPU_METRICS, SUITE_TIMEOUT_S),
    "store": ("bench_store_e2e.py", ("miniray", "ray"), STORE_METRICS, SUITE_TIMEOUT_S),
    "node": ("bench_node.py", ("miniray", "ray"), NODE_METRICS, SUITE_TIMEOUT_S),
}
SUITE_TITLES = {
    "core": "Core runtime (start-up, round trip, throughput, footprint)",
    "actors": "Actors (issue 4), init(num_cpus=2)",
    "gpu": "GPU tasks (issue 5), 2,000 tasks of num_gpus=0.25 on init(num_gpus=4, num_cpus=2)",
    "store": "Object store (issue 3), public API, init()",
    "node": "Node (issue 6): miniray start / ray start --head, a second driver, a detached named"
    " actor",
}


def default_ray_python() -> str:
    venv = os.environ.get("MINIRAY_BENCH_RAY_VENV", DEFAULT_RAY_VENV)
    return os.path.join(venv, "bin", "python")


def run_bench(
    impl: str, python: str, bench: str = BENCH, timeout: float = BENCH_TIMEOUT_S
) -> tuple[dict | None, str]:
    """Run one benchmark script for one implementation; return (its JSON or None, a note)."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "MINIRAY_ADDRESS"):
        env.pop(name, None)
    print(f"== {impl}: {python} {os.path.basename(bench)} --impl {impl}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [python, bench, "--impl", impl],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("MINIRAY_BENCH_VERBOSE") else subprocess.PIPE,
            env=env,
            timeout=timeout,
            text=True,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    print(f"   done in {time.perf_counter() - t0:.1f} s (exit {proc.returncode})", file=sys.stderr)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr or "")[-3000:]
        return None, f"exit {proc.returncode}, no JSON on stdout; stderr tail:\n{tail}"
    if result.get("errors"):
        # The last line of each traceback names the exception; bench_core's JSON has the rest.
        lines = [f"{name}: {tb.strip().splitlines()[-1]}" for name, tb in result["errors"].items()]
        return result, "workload(s) failed:\n    " + "\n    ".join(lines)
    if result.get("impl") in ("miniray", "ray") and not result.get("module_file"):
        return result, "imported a namespace package (no __init__.py?), not the library"
    return result, ""


def fmt(value, spec: str, result: dict | None = None) -> str:
    if value is None:
        # Missing because its workload raised, or because it was not run at all.
        return "error" if result and result.get("errors") else "-"
    if spec == "{:d}":
        return str(int(value))
    return spec.format(value)


def ratio(ray_value, mini_value) -> str:
    if ray_value is None or mini_value is None or mini_value == 0:
        return "-"
    value = ray_value / mini_value
    return f"{value:.3f}x" if value < 0.1 else f"{value:.1f}x"


def meets(value, target, lower_is_better, result: dict | None = None) -> str:
    if target is None:
        return ""
    if value is None:
        # Its workload raised (error), or it has not been measured (pending).
        return "error" if result and result.get("errors") else "pending"
    ok = value < target if lower_is_better else value >= target
    return "yes" if ok else "NO"


def target_text(target, lower_is_better, spec) -> str:
    if target is None:
        return ""
    return ("< " if lower_is_better else ">= ") + fmt(target, spec)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    align = ["<"] + [">"] * (len(headers) - 1)
    line = "  ".join(f"{h:{a}{w}}" for h, a, w in zip(headers, align, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(f"{c:{a}{w}}" for c, a, w in zip(row, align, widths)))


def report(results: dict[str, dict | None], suite: str = "core", title: bool = False) -> None:
    metrics = SUITES[suite][2]
    mini = results.get("miniray") or {}
    ray = results.get("ray") or {}
    rows = []
    for key, label, unit, lower, target, spec in metrics:
        better = "lower" if lower else "higher"
        rows.append(
            [
                f"{label} ({unit}, {better} is better)" if unit else f"{label} ({better})",
                fmt(mini.get(key), spec, mini),
                fmt(ray.get(key), spec, ray),
                "" if key in NO_RATIO else ratio(ray.get(key), mini.get(key)),
                target_text(target, lower, spec),
                meets(mini.get(key), target, lower, mini) if "miniray" in results else "",
            ]
        )
    ray_name = f"Ray {ray.get('version', '2.60')}"
    print()
    if title or suite != "core":
        print(f"== {SUITE_TITLES[suite]}")
    print_table(["metric", "miniray", ray_name, "Ray/miniray", "target", "meets?"], rows)
    if suite == "core":
        print(
            "\nRay/miniray: for times, processes and memory (lower is better) > 1 means miniray is"
            "\nbetter; for throughput (higher is better) < 1 means miniray is better."
            "\nTargets apply to miniray. Ray runs as users run it: plain ray.init(), RAY_ADDRESS"
            " unset."
        )
    else:
        print(
            "\nRay/miniray: for times (lower is better) > 1 means miniray is better; for rates"
            "\n(higher is better) < 1 means miniray is better. Targets apply to miniray."
        )
        for line in suite_notes(suite, results):
            print(line)

    if suite != "core":
        _print_footer(results)
        return
    base_rows = []
    for key, label, unit, _lower, _target, spec in METRICS:
        base = [results.get(impl) or {} for impl in ("ppe", "pipe")]
        if any(b.get(key) is not None for b in base):
            unit_text = f" ({unit})" if unit else ""
            base_rows.append([label + unit_text] + [fmt(b.get(key), spec) for b in base])
    if base_rows:
        print("\nBaselines (no scheduler): ProcessPoolExecutor(2) and a multiprocessing.Pipe echo")
        print_table(["metric", "ProcessPoolExecutor(2)", "Pipe round trip"], base_rows)

    _print_footer(results)


def _print_footer(results: dict[str, dict | None]) -> None:
    print()
    for impl, result in results.items():
        if result:
            where = result.get("module_file") or result.get("executable")
            load = ""
            start, end = result.get("loadavg_start"), result.get("loadavg_end")
            if start is not None and end is not None:
                load = f"; load average {start:.1f} -> {end:.1f}"
            source = f" ({result['source']})" if result.get("source") else ""
            print(f"{impl}: Python {result.get('python')}, {where}{source}{load}")
    date = next((r.get("date") for r in results.values() if r), None)
    cpus = next((r.get("cpu_count") for r in results.values() if r), None)
    if date:
        print(f"measured {date} on {cpus} CPUs")


def suite_notes(suite: str, results: dict[str, dict | None]) -> list[str]:
    """What the table cannot say: extrapolated figures, zero-copy facts, memory details."""
    lines = []
    for impl, result in results.items():
        details = (result or {}).get("details") or {}
        if suite == "gpu":
            run = details.get("default_max_calls") or {}
            if run.get("extrapolated"):
                lines.append(f"{impl}: default GPU tasks extrapolated: {run.get('note')}")
        elif suite == "store":
            zc = (details.get("large") or {}).get("zero_copy")
            if zc:
                lines.append(
                    f"{impl}: get returns {zc['type']}, read-only={zc['readonly']}, same buffer on"
                    f" two gets={zc['same_buffer_two_gets']}"
                )
            large = details.get("large") or {}
            for key, when in (
                ("memory_delta_after_first_put", "after the first put"),
                ("memory_delta_after_first_put_deleted_settled", "after its del + gc + 1 s"),
                ("memory_delta_after_del_no_wait", "at the end, right after del + gc"),
            ):
                delta = large.get(key)
                if delta:
                    new_files = delta.get("shm_new_files_mb")
                    files = f" (new files {new_files:+.1f})" if new_files is not None else ""
                    lines.append(
                        f"{impl}: {when}: RSS {delta['rss_mb']:+.1f} MB (shmem"
                        f" {delta['rss_shmem_mb']:+.1f}), /dev/shm {delta['shm_used_mb']:+.1f} MB"
                        + files
                    )
        elif suite == "actors":
            rounds = (details.get("create_actors") or {}).get("rounds") or []
            if len(rounds) > 1:
                lines.append(
                    f"{impl}: 20 actors, second round (after killing the first 20):"
                    f" {rounds[1]['actors_per_s']:.1f} actors/s"
                )
        elif suite == "node":
            lines.extend(_node_notes(impl, details.get("node") or {}))
    if lines:
        lines.insert(0, "")
    return lines


def _node_notes(impl: str, node: dict) -> list[str]:
    """How Ray's node became ready and stopped; what a stop left behind."""
    lines = []
    start, stop = node.get("start") or {}, node.get("stop") or {}
    if start.get("successful_init_call_s") is not None:
        printed = start.get("cli_printed_started_s")
        printed = f"{printed:.2f} s" if printed is not None else "never"
        lines.append(
            f"{impl}: GCS port open at {start['gcs_port_open_s']:.2f} s, 'Ray runtime started'"
            f" printed at {printed}; the polling driver's init() that succeeded (attempt"
            f" {start.get('init_attempts')}) took {start['successful_init_call_s']:.2f} s"
        )
    for line in stop.get("drain") or []:
        lines.append(f"{impl}: on SIGTERM: {line}")
    if stop.get("group_gone_s") is not None:
        lines.append(
            f"{impl}: every process of the node gone {stop['group_gone_s']:.2f} s after SIGTERM"
        )
    if "processes_left" in stop and impl == "miniray":
        left, segments = stop.get("processes_left") or [], stop.get("segments_left") or []
        lines.append(
            f"{impl}: after `miniray stop` returned: {len(left)} process(es) and"
            f" {len(segments)} /dev/shm segment(s) of its MINIRAY_TMPDIR left"
        )
    if node.get("killed_by_cleanup"):
        lines.append(f"{impl}: cleanup had to SIGKILL {node['killed_by_cleanup']}")
    return lines


def run_suite(suite: str, wanted: list[str], ray_python: str | None):
    """Run one suite for the wanted implementations; return (results, notes, failed)."""
    script, impls, _metrics, timeout = SUITES[suite]
    results: dict[str, dict | None] = {}
    notes: list[str] = []
    failed = False
    for impl in wanted:
        if impl not in impls:
            notes.append(f"{impl}: not part of the {suite} suite, skipped")
            continue
        python = sys.executable
        if impl == "ray":
            python = ray_python or default_ray_python()
            if not os.path.exists(python):
                notes.append(
                    f"ray: skipped, no interpreter at {python} "
                    "(run benchmarks/setup_ray_venv.sh or pass --ray-python)"
                )
                continue
        result, problem = run_bench(impl, python, os.path.join(HERE, script), timeout)
        results[impl] = result
        if problem:
            failed = True
            notes.append(f"{impl}: {problem}")
    return results, notes, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        choices=(*SUITES, "all"),
        default="core",
        help="which workloads: core (default), actors, gpu, store, node, or all of them in turn",
    )
    parser.add_argument(
        "--ray-python",
        help="interpreter with ray 2.60 installed (default: the setup_ray_venv.sh venv)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated subset of " + ",".join(IMPLS) + " (default: every implementation"
        " of the suite; ppe and pipe are in the core suite only)",
    )
    parser.add_argument("--json", metavar="OUT", help="also write every raw result to OUT")
    args = parser.parse_args(argv)

    wanted = None
    if args.only is not None:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in IMPLS]
        if unknown:
            parser.error(f"unknown implementation(s): {', '.join(unknown)}")

    suites = list(SUITES) if args.suite == "all" else [args.suite]
    everything: dict[str, dict] = {}
    failed = False
    for suite in suites:
        impls = SUITES[suite][1]
        results, notes, suite_failed = run_suite(
            suite, wanted if wanted is not None else list(impls), args.ray_python
        )
        failed = failed or suite_failed
        if wanted is not None:
            # Not in this suite: say so only when a single suite was asked for.
            notes = [n for n in notes if "not part of" not in n] if len(suites) > 1 else notes
        report(results, suite, title=len(suites) > 1)
        for note in notes:
            print(f"note: {note}")
        everything[suite] = {"results": results, "notes": notes}

    if args.json:
        if len(suites) == 1:
            payload = {"suite": suites[0], **everything[suites[0]]}
        else:
            payload = {"suites": everything}
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
        print(f"raw results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
