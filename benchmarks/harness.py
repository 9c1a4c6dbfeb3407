"""The runner shared by bench_actors.py, bench_gpu.py and bench_store_e2e.py.

Owns: running each workload of a benchmark script in its own child process with a time limit,
keeping stdout to exactly one JSON object, and merging the children's figures into it. Does not
own: the workloads (each script), comparing implementations (``compare.py``).

A script calls :func:`main` with its workloads::

    WORKLOADS = {"sync_call": (sync_call, 120.0), ...}   # name -> (function(impl) -> dict, limit s)
    sys.exit(harness.main("bench_actors", WORKLOADS, __doc__))

``python bench_x.py --impl miniray|ray`` then runs every workload in a fresh child
(``--_workload NAME``), so each has a runtime of its own (its own ``init()``) and a crash or a
hang in one does not take the others with it. A child that passes its limit dumps every
thread's stack to stderr (faulthandler) and exits; the parent also kills the child's whole
process group once the limit plus a grace period has passed. The merged object is
``bench_core.py``'s shape: the headline figures at the top level, each workload's samples under
``details[workload]``, the interpreter, module file and version, and ``errors`` (workload name ->
traceback or what went wrong). The script exits 1 when ``errors`` is not empty.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench_core import (  # noqa: E402  (shared helpers; bench_core imports no library at import)
    MODULES,
    UNSET_ENV,
    _child_env,
    _describe,
    _import_impl,
    _read_proc_kb,
    _summary,
    time_batches,
    time_calls,
)

IMPLS = ("miniray", "ray")
KILL_GRACE_S = 15.0

__all__ = ["IMPLS", "main", "import_impl", "summary", "read_proc_kb", "describe",
           "time_calls", "time_batches"]

import_impl = _import_impl
summary = _summary
read_proc_kb = _read_proc_kb


def describe(impl: str) -> dict:
    """``bench_core``'s description of the run, plus what a shared machine needs said: the
    load average at the start, and which commit of miniray ran."""
    info = _describe(impl)
    info.pop("init", None)  # each suite says how it calls init()
    # 1-minute load average when the run started (and ended, added by main): on a shared
    # 2-core machine it says how much else was running.
    info["loadavg_start"] = os.getloadavg()[0]
    if impl != "ray" and info.get("module_file"):
        info["source"] = _git_state(os.path.dirname(info["module_file"]))
    return info


def _git_state(package_dir: str) -> str | None:
    """``<short commit>`` of the checkout miniray was imported from, ``+ N files edited`` when
    the package has uncommitted changes (other engineers edit it while benchmarks run)."""
    try:
        head = subprocess.run(
            ["git", "-C", package_dir, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", package_dir, "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + (f" + {len(dirty)} files edited" if dirty else "")


def _run_child(script: str, impl: str, name: str, limit_s: float) -> tuple[dict | None, str]:
    """Run one workload in a child; return (its JSON or None, what went wrong or '')."""
    cmd = [sys.executable, script, "--impl", impl, "--_workload", name, "--_limit", str(limit_s)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=None,  # straight to our stderr (compare.py captures it unless verbose)
        env=_child_env(),
        text=True,
        start_new_session=True,  # its own process group, so a hung runtime can be killed whole
    )
    try:
        out, _ = proc.communicate(timeout=limit_s + KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        return None, f"killed after {limit_s + KILL_GRACE_S:g} s (limit {limit_s:g} s)"
    lines = out.strip().splitlines()
    if not lines:
        if proc.returncode < 0:
            return None, f"killed by signal {-proc.returncode}, no JSON"
        return None, (
            f"exit {proc.returncode} with no JSON (over its {limit_s:g} s limit, or crashed; "
            "the stack dump is on stderr)"
        )
    try:
        return json.loads(lines[-1]), ""
    except ValueError:
        return None, f"exit {proc.returncode}, last stdout line is not JSON: {lines[-1][:200]}"


def _child(impl: str, name: str, fn, limit_s: float) -> int:
    # Dump every stack and exit a little before the parent would kill us.
    faulthandler.dump_traceback_later(max(1.0, limit_s), exit=True)
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        measured = fn(impl)
        payload = {"measured": measured}
        code = 0
    except Exception:
        payload = {"error": traceback.format_exc()}
        print(payload["error"], file=sys.stderr)
        code = 1
    faulthandler.cancel_dump_traceback_later()
    json_out.write(json.dumps(payload) + "\n")
    json_out.flush()
    return code


def main(script_name: str, workloads: dict, doc: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(doc or script_name).split("\n\n")[0])
    parser.add_argument("--impl", choices=IMPLS, required=True)
    parser.add_argument(
        "--workloads",
        default=",".join(workloads),
        help="comma-separated subset of " + ",".join(workloads),
    )
    parser.add_argument("--_workload", help=argparse.SUPPRESS)
    parser.add_argument("--_limit", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for env_name in UNSET_ENV:
        os.environ.pop(env_name, None)
    script = os.path.abspath(sys.modules["__main__"].__file__)

    if args._workload:
        fn, limit_s = workloads[args._workload]
        return _child(args.impl, args._workload, fn, args._limit or limit_s)

    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in workloads]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")

    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    result = describe(args.impl)
    result["benchmark"] = script_name
    result["errors"] = {}
    details = {}
    for name in wanted:
        fn, limit_s = workloads[name]
        print(f"[{script_name} {args.impl}] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        payload, problem = _run_child(script, args.impl, name, limit_s)
        elapsed = time.perf_counter() - t0
        if payload is None:
            result["errors"][name] = problem
            details[name] = {"elapsed_s": elapsed}
            continue
        if "error" in payload:
            result["errors"][name] = payload["error"]
            details[name] = {"elapsed_s": elapsed}
            continue
        measured = payload["measured"]
        # A workload may measure what it can and report the steps that failed.
        for step, error in (measured.pop("errors", None) or {}).items():
            result["errors"][f"{name}.{step}"] = error
        details[name] = measured.pop("details", {})
        details[name]["elapsed_s"] = elapsed
        result.update(measured)
    result["details"] = details
    result["loadavg_end"] = os.getloadavg()[0]
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()
    return 1 if result["errors"] else 0


assert set(IMPLS) <= set(MODULES)
