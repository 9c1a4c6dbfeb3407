"""Object-store workloads through the public API (issue 3) for one implementation.

Owns: the end-to-end object-store figures of the shared-memory issue (``put``, ``get``, a task
reading a large array by ref, small puts and gets, memory after ``del``) and memcpy as the
yardstick, measured in the same run. Does not own: the store-level figures without a runtime
(``bench_store.py``), running side by side or judging targets (``compare.py --suite store``),
the child processes and the JSON (``harness.py``).

    python benchmarks/bench_store_e2e.py --impl {miniray,ray} [--workloads large,small]

prints exactly one JSON object on stdout and exits 1 if a workload failed. The same code runs
for both (``import miniray as ray`` / ``import ray``), each workload in its own child process
with its own ``init()`` (no arguments: Ray sizes its object store as users get it). Needs numpy.

``large`` (a 200 MB float64 array, ``rng.random(25_000_000)``, made before anything is
measured; a warm-up task and a small put/get run first so workers exist)::

    memcpy_gbps         ``np.copyto(dst, arr)`` into a preallocated, already-written ``dst``;
                        best of 10: 5 before the puts and 5 after them (median in details)
    put_gbps            ``ref = ray.put(arr)``, 200 MB / median of 5 puts, each ref deleted
                        (and ``gc.collect()``) before the next; the first put is in details.
                        ``put_vs_memcpy`` = put_gbps / memcpy_gbps
    get_ms              ``ray.get(ref)`` of that array: median of 20 (``get_first_ms``: the
                        first get after the put). Details say whether the result is read-only,
                        whether two gets return the same buffer (zero-copy) and whether it is
                        the caller's own array.
    task_sum_ms         ``ray.get(total.remote(ref))`` with ``def total(a): return
                        float(a.sum())``: median of 5 after a first call (in details), and
                        ``local_sum_ms``, ``arr.sum()`` in the driver, as the floor
    rss_delta_mb, shm_delta_mb
                        memory after ``del`` of every ref and every value ``get`` returned,
                        ``gc.collect()`` and 1 s to settle, minus the baseline taken just
                        before the first put (``arr`` and ``dst`` live throughout, so they are
                        in both): the driver's VmRSS (/proc/self/status) and the space used on
                        /dev/shm (statvfs; host-wide, so other programs writing there show up).
    shm_new_files_mb    the bytes held by /dev/shm files that appeared or grew since the
                        baseline (named in details, so whose they are can be seen; a store that
                        unlinks its file after mapping it, as Ray's does, shows only in
                        shm_delta_mb).
                        The same right after ``gc.collect()`` with no wait, right after the
                        first put, and after the first put's ref was deleted (1 s to settle;
                        the later puts come after it) are in details.

A step of ``large`` that raises (``put``, ``get``, ``task_sum``) is recorded in ``errors`` as
``large.<step>`` with its traceback; the steps that can still run do, and memory is measured
whatever happened, so one failure does not hide the other figures.

``small``::

    small_puts_per_s    ``refs = [ray.put(1) for _ in range(20_000)]``; best of 3
    small_gets_per_s    ``ref = ray.put(1)``, then ``ray.get(ref)`` 50,000 times; best of 3
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

ARRAY_ELEMENTS = 25_000_000  # float64: 200 MB
MEMCPY_RUNS = 5
PUT_RUNS = 5
GET_RUNS = 20
SUM_RUNS = 5
SETTLE_S = 1.0
SMALL_PUTS = 20_000
SMALL_GETS = 50_000
SMALL_RUNS = 3
MB = 1e6


def total(a):
    return float(a.sum())


def noop():
    return None


def _proc_status_kb(field: str) -> int | None:
    return harness.read_proc_kb("/proc/self/status", field)


def _shm_files() -> dict[str, int]:
    """Every visible file under /dev/shm and the bytes it holds (allocated blocks)."""
    files = {}
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return files
    for name in names:
        try:
            files[name] = os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
        except OSError:
            pass
    return files


def _memory() -> dict:
    st = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    return {
        "rss_mb": (_proc_status_kb("VmRSS") or 0) / 1e3,
        "rss_anon_mb": (_proc_status_kb("RssAnon") or 0) / 1e3,
        "rss_file_mb": (_proc_status_kb("RssFile") or 0) / 1e3,
        "rss_shmem_mb": (_proc_status_kb("RssShmem") or 0) / 1e3,
        "shm_used_mb": (st.f_blocks - st.f_bfree) * st.f_frsize / MB if st else None,
        "shm_entries": len(os.listdir("/dev/shm")) if st else None,
        "_files": _shm_files(),
    }


def _delta(after: dict, before: dict) -> dict:
    """after - before for every figure, plus the /dev/shm files that appeared or grew since
    (``shm_new_files_mb`` and up to 10 of them by name: the statvfs figure is host-wide, so
    this says whose files they are; a store that unlinks its file, as Ray's does, shows only
    in ``shm_used_mb``)."""
    delta = {
        k: (after[k] - before[k]) if after[k] is not None and before[k] is not None else None
        for k in before
        if not k.startswith("_")
    }
    grown = {
        name: size - before["_files"].get(name, 0)
        for name, size in after["_files"].items()
        if size > before["_files"].get(name, 0)
    }
    delta["shm_new_files_mb"] = sum(grown.values()) / MB
    largest = sorted(grown.items(), key=lambda item: -item[1])[:10]
    delta["shm_new_files"] = {name: round(size / MB, 3) for name, size in largest}
    return delta


def _public(memory: dict) -> dict:
    return {k: v for k, v in memory.items() if not k.startswith("_")}


def _timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def large(impl: str) -> dict:
    import numpy as np

    ray = harness.import_impl(impl)
    arr = np.random.default_rng(0).random(ARRAY_ELEMENTS)
    nbytes = arr.nbytes
    dst = np.empty_like(arr)
    dst.fill(0.0)

    out: dict = {}
    details: dict = {"array": {"dtype": str(arr.dtype), "shape": list(arr.shape), "bytes": nbytes}}
    errors: dict = {}

    def step(name, fn) -> bool:
        """Run one step; on an exception record it and go on with the steps that can."""
        try:
            fn()
            return True
        except Exception:
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr)
            return False

    ray.init()
    try:
        t = ray.remote(total)
        ray.get(ray.remote(noop).remote())
        ray.get(t.remote(np.ones(10)))
        ray.get(ray.put(np.ones(10)))

        memcpy_s = []

        def memcpy() -> None:
            # Run before and after the puts; the best of both is the yardstick, so a moment
            # of load elsewhere on the machine does not make put look faster than memcpy.
            memcpy_s.extend(_timed(lambda: np.copyto(dst, arr))[0] for _ in range(MEMCPY_RUNS))
            out["memcpy_gbps"] = nbytes / min(memcpy_s) / 1e9
            details["memcpy_s"] = memcpy_s
            details["memcpy_median_gbps"] = nbytes / statistics.median(memcpy_s) / 1e9
            if "put_gbps" in out:
                out["put_vs_memcpy"] = out["put_gbps"] / out["memcpy_gbps"]

        memcpy()

        gc.collect()
        time.sleep(0.5)
        baseline = _memory()
        details["memory_baseline"] = _public(baseline)

        def puts():
            put_s = []
            for i in range(PUT_RUNS):
                dt, ref = _timed(lambda: ray.put(arr))
                put_s.append(dt)
                if i == 0:
                    details["memory_delta_after_first_put"] = _delta(_memory(), baseline)
                del ref
                gc.collect()
                if i == 0:
                    time.sleep(SETTLE_S)
                    gc.collect()
                    details["memory_delta_after_first_put_deleted_settled"] = _delta(
                        _memory(), baseline
                    )
            out["put_gbps"] = nbytes / statistics.median(put_s) / 1e9
            out["put_vs_memcpy"] = out["put_gbps"] / out["memcpy_gbps"]
            details["put_s"] = put_s
            details["put_first_gbps"] = nbytes / put_s[0] / 1e9
            details["put_best_gbps"] = nbytes / min(put_s) / 1e9

        step("put", puts)
        memcpy()
        refs = []
        step("put (the ref the next steps read)", lambda: refs.append(ray.put(arr)))

        def gets():
            get_first_s, first = _timed(lambda: ray.get(refs[0]))
            second = ray.get(refs[0])
            details["zero_copy"] = {
                "type": type(first).__name__,
                "readonly": not first.flags.writeable,
                "same_buffer_two_gets": (
                    first.__array_interface__["data"][0] == second.__array_interface__["data"][0]
                ),
                "is_callers_array": first is arr,
                "shares_memory_with_callers_array": bool(np.shares_memory(first, arr)),
                "equal_values": bool(
                    np.array_equal(first[:1000], arr[:1000]) and first[-1] == arr[-1]
                ),
            }
            del first, second
            get_s = []
            for _ in range(GET_RUNS):
                dt, value = _timed(lambda: ray.get(refs[0]))
                get_s.append(dt)
                del value
            out["get_ms"] = statistics.median(get_s) * 1e3
            out["get_first_ms"] = get_first_s * 1e3
            details["get"] = harness.summary(get_s)

        def task_sum():
            local_sum_s, expected = _timed(lambda: float(arr.sum()))
            out["local_sum_ms"] = local_sum_s * 1e3
            sum_first_s, got = _timed(lambda: ray.get(t.remote(refs[0])))
            assert abs(got - expected) < 1e-6 * abs(expected), (got, expected)
            details["task_sum_first_ms"] = sum_first_s * 1e3
            sum_s = []
            for _ in range(SUM_RUNS):
                sum_s.append(_timed(lambda: ray.get(t.remote(refs[0])))[0])
                details["task_sum"] = harness.summary(sum_s)
            out["task_sum_ms"] = statistics.median(sum_s) * 1e3

        if refs:
            step("get", gets)
            step("task_sum", task_sum)

        del refs[:]
        gc.collect()
        details["memory_delta_after_del_no_wait"] = _delta(_memory(), baseline)
        time.sleep(SETTLE_S)
        gc.collect()
        after_del = _memory()
        settled = _delta(after_del, baseline)
        out["rss_delta_mb"] = settled["rss_mb"]
        out["shm_delta_mb"] = settled["shm_used_mb"]
        out["shm_new_files_mb"] = settled["shm_new_files_mb"]
        details["memory_delta_after_del_settled"] = settled
        details["memory_after_del_settled"] = _public(after_del)
        details["settle_s"] = SETTLE_S
    finally:
        ray.shutdown()
    out["details"] = details
    if errors:
        out["errors"] = errors  # harness.py files them under "large.<step>"
    return out


def small(impl: str) -> dict:
    ray = harness.import_impl(impl)
    ray.init()
    try:
        ray.get(ray.remote(noop).remote())
        ray.get([ray.put(1) for _ in range(200)])

        put_runs = []
        for _ in range(SMALL_RUNS):
            t0 = time.perf_counter()
            refs = [ray.put(1) for _ in range(SMALL_PUTS)]
            put_runs.append(SMALL_PUTS / (time.perf_counter() - t0))
            del refs
            gc.collect()

        ref = ray.put(1)
        get = ray.get
        for _ in range(200):
            get(ref)
        get_runs = []
        for _ in range(SMALL_RUNS):
            t0 = time.perf_counter()
            for _ in range(SMALL_GETS):
                get(ref)
            get_runs.append(SMALL_GETS / (time.perf_counter() - t0))
    finally:
        ray.shutdown()
    return {
        "small_puts_per_s": max(put_runs),
        "small_gets_per_s": max(get_runs),
        "details": {
            "put_runs_per_s": put_runs,
            "get_runs_per_s": get_runs,
            "puts_per_run": SMALL_PUTS,
            "gets_per_run": SMALL_GETS,
            "value": 1,
        },
    }


WORKLOADS = {
    "large": (large, 180.0),
    "small": (small, 180.0),
}

if __name__ == "__main__":
    sys.exit(harness.main("bench_store_e2e", WORKLOADS, __doc__))
