"""Object-store workloads at the store level (no runtime, no workers), run in this interpreter.

Owns: the store-level measurements of the shared-memory issue (issue 3) and memcpy as the
yardstick measured in the same run. Does not own: the end-to-end put/get/task figures beside
Ray (those need the runtime; ``bench_core.py`` style, once the store is integrated).

    python benchmarks/bench_store.py [--mb 200] [--repeat 7]

prints exactly one JSON object on stdout. Workloads (a float64 array of ``--mb`` MB)::

    memcpy_gbps              np.copyto into a destination whose pages are already mapped;
                             best of --repeat (memcpy_fresh_gbps: into a fresh np.empty)
    put_gbps, put_ms         store.put_value of the array, steady state: the previous object
                             was freed, so its segment is recycled (pages already mapped);
                             median of --repeat. put_vs_memcpy = put_gbps / memcpy_gbps
    put_first_gbps           the first put into a fresh store: a new segment, whose tmpfs pages
                             the kernel allocates and zeroes during the write; median
    create_segment_gbps      a worker's create_segment (always a new segment); median
    get_ms                   store.get_value of the stored array (the owner's cached mapping);
                             median; get_first_ms: the first get (maps the segment)
    read_segment_ms          read_segment(path) as another process does it: open, flock,
                             mmap, unpickle (the unmap when the value dies is not counted);
                             median
    sum_after_get_ms         arr.sum() of a fresh read_segment view (page faults included)
    small_puts_per_s, small_gets_per_s
                             put_value / get_value of a small value ({"x": 1, "y": "abc"}),
                             10,000 each, then free; best of 3
    threshold_sweep          per size: median us of an inline trip (pickle, socketpair send and
                             recv, unpickle) and of a segment trip (create_segment,
                             read_segment, unlink); the basis of the 100 KiB default
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import socket
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from miniray._private.core import oob  # noqa: E402
from miniray._private.object_store.shm_store import (  # noqa: E402
    SharedMemoryStore,
    create_segment,
    new_session_tag,
    read_segment,
)


def oid(n: int) -> bytes:
    return n.to_bytes(28, "big")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_memcpy(a: np.ndarray, repeat: int) -> dict:
    dst = np.empty_like(a)
    dst.fill(0)
    warm = min(timed(lambda: np.copyto(dst, a)) for _ in range(repeat))
    fresh = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = np.empty_like(a)
        np.copyto(out, a)
        fresh.append(time.perf_counter() - start)
        del out
    return {"memcpy_gbps": a.nbytes / warm / 1e9, "memcpy_fresh_gbps": a.nbytes / min(fresh) / 1e9}


def bench_large(a: np.ndarray, repeat: int, spill_dir: str) -> dict:
    out: dict = {}
    firsts = []
    for i in range(repeat):
        store = SharedMemoryStore(new_session_tag(), 2 << 30, spill_dir)
        firsts.append(timed(lambda store=store, i=i: store.put_value(oid(i), a)))
        store.close()
    out["put_first_gbps"] = a.nbytes / statistics.median(firsts) / 1e9

    store = SharedMemoryStore(new_session_tag(), 2 << 30, spill_dir)
    try:
        puts = []
        store.put_value(oid(0), a)
        for i in range(1, repeat + 1):
            store.free(oid(i - 1))
            puts.append(timed(lambda i=i: store.put_value(oid(i), a)))
        key = oid(repeat)
        out["put_ms"] = statistics.median(puts) * 1e3
        out["put_gbps"] = a.nbytes / statistics.median(puts) / 1e9
        out["put_best_gbps"] = a.nbytes / min(puts) / 1e9
        out["get_first_ms"] = timed(lambda: store.get_value(key)) * 1e3
        gets = [timed(lambda: store.get_value(key)) for _ in range(200)]
        out["get_ms"] = statistics.median(gets) * 1e3
        path = store.location(key)[1]
        reads = []
        for _ in range(50):
            start = time.perf_counter()
            value = read_segment(path)
            reads.append(time.perf_counter() - start)
            del value  # unmapping is not part of the read
        out["read_segment_ms"] = statistics.median(reads) * 1e3
        view = read_segment(path)
        out["sum_after_get_ms"] = timed(view.sum) * 1e3
        out["sum_again_ms"] = timed(view.sum) * 1e3
        assert view.flags.writeable is False and float(view[-1]) == float(a[-1])
        del view
        out["store_statistics"] = store.statistics()
    finally:
        store.close()

    tag = new_session_tag()
    creates = []
    for i in range(repeat):
        start = time.perf_counter()
        seg_path, _ = create_segment(tag, oid(i), a)
        creates.append(time.perf_counter() - start)
        os.unlink(seg_path)
    out["create_segment_gbps"] = a.nbytes / statistics.median(creates) / 1e9
    return out


def bench_small(spill_dir: str) -> dict:
    value = {"x": 1, "y": "abc"}
    n = 10_000
    put_rates, get_rates = [], []
    for _ in range(3):
        store = SharedMemoryStore(new_session_tag(), 1 << 30, spill_dir)
        keys = [oid(i) for i in range(n)]
        elapsed = timed(lambda store=store, keys=keys: [store.put_value(k, value) for k in keys])
        put_rates.append(n / elapsed)
        elapsed = timed(lambda store=store, keys=keys: [store.get_value(k) for k in keys])
        get_rates.append(n / elapsed)
        for k in keys:
            store.free(k)
        store.close()
    return {"small_puts_per_s": max(put_rates), "small_gets_per_s": max(get_rates)}


def bench_threshold() -> list:
    left, right = socket.socketpair()
    for s in (left, right):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)

    def recv_exactly(n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            got += right.recv_into(view[got:])
        return buf

    def inline(a):
        data = oob.serialize(a).inband()
        left.sendall(data)
        return pickle.loads(recv_exactly(len(data)))

    tag = new_session_tag()

    def segment(a):
        path, _ = create_segment(tag, oid(1), a, inline_threshold=0)
        left.sendall(path.encode())
        recv_exactly(len(path))
        value = read_segment(path)
        os.unlink(path)
        return value

    rows = []
    try:
        for kib in (16, 32, 64, 96, 128, 192, 256, 512, 1024, 4096):
            a = np.random.default_rng(0).random(kib * 1024 // 8)
            row = {"kib": kib}
            for name, fn in (("inline_us", inline), ("segment_us", segment)):
                for _ in range(20):
                    fn(a)
                samples = [timed(lambda fn=fn, a=a: fn(a)) for _ in range(200)]
                row[name] = round(statistics.median(samples) * 1e6, 1)
            rows.append(row)
    finally:
        left.close()
        right.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    a = np.random.default_rng(0).random(args.mb * 1_000_000 // 8)
    result: dict = {"array_bytes": a.nbytes}
    with tempfile.TemporaryDirectory(prefix="bench_store_") as spill_dir:
        result.update(bench_memcpy(a, args.repeat))
        result.update(bench_large(a, args.repeat, spill_dir))
        result["put_vs_memcpy"] = result["put_gbps"] / result["memcpy_gbps"]
        result["put_first_vs_memcpy"] = result["put_first_gbps"] / result["memcpy_gbps"]
        result.update(bench_small(spill_dir))
    result["threshold_sweep"] = bench_threshold()
    result["machine"] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }
    for key, value in list(result.items()):
        if isinstance(value, float):
            result[key] = round(value, 3)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
