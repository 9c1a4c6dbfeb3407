"""Run bench_core.py for miniray, Ray 2.60 and the two baselines; print one table.

Owns: which interpreter runs which implementation, the issue's targets, and the report.
Does not own: how a workload is measured (``bench_core.py``).

    python benchmarks/compare.py [--ray-python PATH] [--only miniray,ray,ppe,pipe] [--json OUT]

Each implementation runs in its own process: miniray, ppe and pipe with this interpreter (so
miniray is the one this interpreter imports), Ray with ``--ray-python`` (default: the venv made
by ``benchmarks/setup_ray_venv.sh``; Ray is skipped with a note when there is none). Ray is
never imported here nor by miniray.

The report judges miniray against the issue's targets; it exits 0 whatever the figures are,
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


def default_ray_python() -> str:
    venv = os.environ.get("MINIRAY_BENCH_RAY_VENV", DEFAULT_RAY_VENV)
    return os.path.join(venv, "bin", "python")


def run_bench(impl: str, python: str) -> tuple[dict | None, str]:
    """Run bench_core.py for one implementation; return (its JSON or None, a failure note)."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "MINIRAY_ADDRESS"):
        env.pop(name, None)
    print(f"== {impl}: {python} {os.path.basename(BENCH)} --impl {impl}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [python, BENCH, "--impl", impl],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("MINIRAY_BENCH_VERBOSE") else subprocess.PIPE,
            env=env,
            timeout=BENCH_TIMEOUT_S,
            text=True,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {BENCH_TIMEOUT_S} s"
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
    return f"{ray_value / mini_value:.1f}x"


def meets(value, target, lower_is_better) -> str:
    if target is None:
        return ""
    if value is None:
        return "pending"
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


def report(results: dict[str, dict | None]) -> None:
    mini = results.get("miniray") or {}
    ray = results.get("ray") or {}
    rows = []
    for key, label, unit, lower, target, spec in METRICS:
        better = "lower" if lower else "higher"
        rows.append(
            [
                f"{label} ({unit}, {better} is better)" if unit else f"{label} ({better})",
                fmt(mini.get(key), spec, mini),
                fmt(ray.get(key), spec, ray),
                ratio(ray.get(key), mini.get(key)),
                target_text(target, lower, spec),
                meets(mini.get(key), target, lower) if "miniray" in results else "",
            ]
        )
    ray_name = f"Ray {ray.get('version', '2.60')}"
    print()
    print_table(["metric", "miniray", ray_name, "Ray/miniray", "target", "meets?"], rows)
    print(
        "\nRay/miniray: for times, processes and memory (lower is better) > 1 means miniray is"
        "\nbetter; for throughput (higher is better) < 1 means miniray is better."
        "\nTargets apply to miniray. Ray runs as users run it: plain ray.init(), RAY_ADDRESS unset."
    )

    base_rows = []
    for key, label, unit, _lower, _target, spec in METRICS:
        base = [results.get(impl) or {} for impl in ("ppe", "pipe")]
        if any(b.get(key) is not None for b in base):
            unit_text = f" ({unit})" if unit else ""
            base_rows.append([label + unit_text] + [fmt(b.get(key), spec) for b in base])
    if base_rows:
        print("\nBaselines (no scheduler): ProcessPoolExecutor(2) and a multiprocessing.Pipe echo")
        print_table(["metric", "ProcessPoolExecutor(2)", "Pipe round trip"], base_rows)

    print()
    for impl, result in results.items():
        if result:
            where = result.get("module_file") or result.get("executable")
            print(f"{impl}: Python {result.get('python')}, {where}")
    date = next((r.get("date") for r in results.values() if r), None)
    cpus = next((r.get("cpu_count") for r in results.values() if r), None)
    if date:
        print(f"measured {date} on {cpus} CPUs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ray-python",
        help="interpreter with ray 2.60 installed (default: the setup_ray_venv.sh venv)",
    )
    parser.add_argument(
        "--only",
        default=",".join(IMPLS),
        help="comma-separated subset of " + ",".join(IMPLS),
    )
    parser.add_argument("--json", metavar="OUT", help="also write every raw result to OUT")
    args = parser.parse_args(argv)

    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in IMPLS]
    if unknown:
        parser.error(f"unknown implementation(s): {', '.join(unknown)}")

    results: dict[str, dict | None] = {}
    notes: list[str] = []
    failed = False
    for impl in wanted:
        python = sys.executable
        if impl == "ray":
            python = args.ray_python or default_ray_python()
            if not os.path.exists(python):
                notes.append(
                    f"ray: skipped, no interpreter at {python} "
                    "(run benchmarks/setup_ray_venv.sh or pass --ray-python)"
                )
                continue
        result, problem = run_bench(impl, python)
        results[impl] = result
        if problem:
            failed = True
            notes.append(f"{impl}: {problem}")

    report(results)
    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "notes": notes}, fh, indent=2)
            fh.write("\n")
        print(f"raw results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
