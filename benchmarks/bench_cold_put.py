"""Ways of writing a large value into a fresh tmpfs file, the store's cold put, side by side.

Owns: the measurement behind the store's choice of ``pwritev`` for a new segment
(``oob.Serialized.write_fd``) and the record of what else was tried (issue 14, "cold puts
near memcpy"). Does not own: the store's end-to-end first put (``bench_store.py``,
``bench_peers.py``).

    python benchmarks/bench_cold_put.py [--mb 200] [--dir /dev/shm] [--rounds 5]

prints the kernel's huge-page settings for shared memory, then per method the median of
``--rounds`` writes, each into a new file (unlinked after), and its speed against memcpy
into mapped memory in the same run:

    memcpy               np.copyto into pages already mapped (the floor)
    pwritev              what the store does: the kernel copies into new tmpfs pages
    fallocate_pwritev    posix_fallocate first, then pwritev
    mmap_faults          ftruncate, mmap, copy: a page fault per 4 KiB page
    mmap_hugepage        the same after madvise(MADV_HUGEPAGE) (only with shmem THP on)
    mmap_populate_write  the same after madvise(MADV_POPULATE_WRITE) (Linux 5.14+)
    mmap_threadsK        ftruncate, mmap, K threads each copying a slice (faults in parallel)
    fallocate_threadsK   posix_fallocate (room reserved: no SIGBUS on a full tmpfs), then
                         the same K threads
    store_writeK         the store's own threaded write (``object_store/parallel_write``:
                         posix_fallocate, mmap, K ranges, the caller copying one)
    store_plan           the store's ``write_segment`` as it is (``write_plan`` picks
                         pwritev or threads for this size, directory and CPU count; printed)

``MINIRAY_STORE_WRITE_THREADS`` set in the environment changes what ``store_plan`` does.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from miniray._private.core import oob  # noqa: E402
from miniray._private.object_store import parallel_write, shm_segments  # noqa: E402

MADV_POPULATE_WRITE = 23  # not among the constants of Python's mmap module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = args.mb << 20
    src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    dst = np.ones_like(src)

    def fresh() -> tuple[str, int]:
        path = os.path.join(args.dir, f"coldput.{os.getpid()}.{time.perf_counter_ns()}")
        return path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)

    def memcpy() -> None:
        np.copyto(dst, src)

    def pwritev(fallocate: bool = False) -> None:
        path, fd = fresh()
        try:
            if fallocate:
                os.posix_fallocate(fd, 0, size)
            os.pwritev(fd, [memoryview(src)], 0)
        finally:
            os.close(fd)
            os.unlink(path)

    def mapped(advice: int | None = None, threads: int = 1, fallocate: bool = False) -> None:
        path, fd = fresh()
        try:
            if fallocate:
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
            if advice is not None:
                try:
                    mapping.madvise(advice)
                except OSError:
                    pass  # not offered by this kernel: the copy faults as without
            view = np.frombuffer(mapping, dtype=np.uint8)
            step = (-(-size // threads) + 4095) & ~4095

            def part(out: np.ndarray, i: int) -> None:
                np.copyto(out[i * step:(i + 1) * step], src[i * step:(i + 1) * step])

            workers = [threading.Thread(target=part, args=(view, i)) for i in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            del view, workers
            mapping.close()
        finally:
            os.close(fd)
            os.unlink(path)

    methods = {"memcpy": memcpy, "pwritev": pwritev,
               "fallocate_pwritev": lambda: pwritev(fallocate=True),
               "mmap_faults": mapped,
               "mmap_hugepage": lambda: mapped(getattr(mmap, "MADV_HUGEPAGE", 14)),
               "mmap_populate_write": lambda: mapped(MADV_POPULATE_WRITE)}
    for k in (2, 4, 8, 16):
        if k <= (os.cpu_count() or 1):
            methods[f"mmap_threads{k}"] = lambda k=k: mapped(threads=k)
            methods[f"fallocate_threads{k}"] = lambda k=k: mapped(threads=k, fallocate=True)
    ser = oob.serialize(src)

    def store(threads: int | None = None) -> None:
        path, fd = fresh()
        try:
            if threads is None:
                os.close(fd)
                os.unlink(path)
                shm_segments.write_segment(path, ser)
            else:
                parallel_write.write_threaded(fd, ser.pieces(), ser.total_size, threads)
        finally:
            if threads is not None:
                os.close(fd)
            os.unlink(path)

    methods["store_plan"] = store
    for k in (2, 4, 8, 16):
        if k <= (os.cpu_count() or 1):
            methods[f"store_write{k}"] = lambda k=k: store(k)
    plan = parallel_write.plan_for(args.dir, ser.total_size)
    print(f"store plan for {ser.total_size} bytes in {args.dir} with "
          f"{parallel_write.usable_cpus()} usable CPUs: "
          + (f"{plan} threads" if plan else "pwritev"))
    for name in ("shmem_enabled", "enabled"):
        path = f"/sys/kernel/mm/transparent_hugepage/{name}"
        try:
            with open(path) as f:
                print(f"{path}: {f.read().strip()}")
        except OSError as error:
            print(f"{path}: {error}")
    print(f"cpus: {os.cpu_count()}, {args.mb} MB into {args.dir}, {args.rounds} rounds")
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, method in methods.items():
            start = time.perf_counter()
            method()
            times.setdefault(name, []).append(time.perf_counter() - start)
    floor = statistics.median(times["memcpy"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:22s} {median * 1e3:8.1f} ms  {floor / median:5.2f}x memcpy")


if __name__ == "__main__":
    main()
