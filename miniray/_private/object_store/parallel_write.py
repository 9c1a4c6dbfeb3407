"""Writing a large new segment on several threads through a mapping, and when to.

Owns: the decision how a new segment's bytes get into its file (``write_plan``, pure: ``pwritev``
on the caller, or K threads), the threaded write itself (``write_threaded``), and the small
pool of daemon threads it reuses across writes (``_Pool``, dropped in a forked child).
Does not own: the byte layout (``core/oob.py``: ``Serialized.pieces``), creating, naming or
unlinking the file, or turning ENOSPC into the store's error (``shm_segments.write_segment``).
Called by: ``shm_segments.write_segment`` (a driver's ``put``, a worker's task result, an
object too large for the store written to the spill directory: every first write of a
segment).

Why: a new tmpfs file's first write pays one page allocation (and, through a mapping, one
fault) per page. ``pwritev`` does all of it on one CPU. On a host with several CPUs, K threads
each copying a contiguous range through one shared mapping allocate and fault pages in
parallel (``benchmarks/bench_cold_put.py``, 16-core host, 200 MB, against memcpy into mapped
memory: pwritev 0.18-0.22x on /dev/shm and 0.51-0.73x on a ``huge=within_size`` tmpfs; this
module's 8 threads 0.25-0.38x and 1.67-1.96x; 4 threads 0.20-0.22x and 0.92-1.04x). On 2 CPUs
threads gain nothing (0.13x against pwritev's 0.18x), so the plan keeps ``pwritev`` there.

The threaded write, in steps:

1. ``posix_fallocate(fd, 0, total)`` reserves every page first: a full tmpfs answers ENOSPC
   (an OSError, as ``pwritev`` does) here, never SIGBUS at a fault during the copy. The
   reserved pages read as zeros, so the padding between pieces is never written.
2. ``mmap`` the whole file shared and writable.
3. The segment's pieces (``Serialized.pieces``: header, metadata, padding, buffers) are cut
   into K contiguous ranges of about equal size (a range may cross piece boundaries); ranges
   1..K-1 go to the pool, range 0 is copied by the caller. Each copy is ``numpy.copyto``
   between ``frombuffer`` views, which releases the GIL.
4. The caller waits for every range, even after an error of its own (nothing may write
   into the mapping once it is closed), drops every view, closes the mapping, then raises
   the first error any range met.

The pool: at most ``MAX_THREADS - 1`` daemon threads (they never keep the process alive at
exit), started on the first threaded write and reused by the writes that follow; a thread
idle for ``IDLE_S`` ends, so none lingers after a burst of puts (the test harness counts
``miniray-*`` threads after ``shutdown``). A forked child (workers come from a fork server)
starts with no pool (``os.register_at_fork``), never one whose threads died in the fork.
Writes on several caller threads share it; a range waits in its queue until a thread is free.
A range is counted as the write's before it is queued, so a caller interrupted while queueing
still waits for every range queued; when no thread is alive and none can start, the caller
copies every range itself.

numpy is imported only inside ``write_threaded`` (lazily): a process that never writes a large
segment never imports it here.
"""

from __future__ import annotations

import mmap
import os
import queue
import sys
import threading
from typing import Any, Callable

from miniray._private.core import config
from miniray._private.host import shm_mounts

__all__ = ["MAX_THREADS", "MIN_BYTES", "mount_of", "plan_for", "runnable_now", "split_ranges",
           "usable_cpus", "write_plan", "write_threaded"]

# From benchmarks/bench_cold_put.py on a 16-core host (benchmarks/RESULTS.md, 2026-11-28),
# against memcpy into mapped memory, "pwritev -> the plan's threads":
MIN_BYTES = 32 << 20  # 32 MB: 0.30x -> 0.31x in /dev/shm, 1.26x -> 2.71x on huge pages
MAX_THREADS = 8  # 200 MB on huge pages: 8 threads 1.71x, 16 threads 1.46x
HUGE_MIN_CPUS = 4  # 200 MB on huge pages with 4 CPUs: 0.54x -> 0.92x
SMALL_PAGE_MIN_CPUS = 8  # 200 MB in /dev/shm: 4 CPUs 0.20x -> 0.20x, 8 CPUs 0.22x -> 0.38x
IDLE_S = 1.0  # a pool thread with nothing to do this long ends
FORCED_MAX = 64  # MINIRAY_STORE_WRITE_THREADS above this is taken as this
_HUGE_MODES = ("always", "within_size")  # the tmpfs modes that give a large file 2 MiB pages


def write_plan(total_size: int, cpus: int, huge_pages: str | None,
               memory_backed: bool | None, override: int | None = None,
               numpy_loaded: bool = True, runnable: int | None = None) -> int:
    """Pure: how to write a new segment of ``total_size`` bytes: 0 is one ``pwritev`` on the
    caller, K >= 2 is K threads through a mapping (``write_threaded``).

    ``cpus`` is how many CPUs this process may run on (``usable_cpus``); ``huge_pages`` the
    huge-page mode of the directory's tmpfs (``shm_mounts.huge_pages_of``; None: not a
    tmpfs); ``memory_backed`` whether the directory is on a memory filesystem (a spill
    directory on disk is written with ``pwritev``); ``override`` the value of
    ``MINIRAY_STORE_WRITE_THREADS`` (None: unset; 0: always ``pwritev``; N: N threads for
    every segment of at least ``MIN_BYTES`` on a memory filesystem, whatever the CPUs);
    ``numpy_loaded`` whether this process has imported numpy already: the copies need it,
    and a first import (about 0.1 s) costs more than threads save on a write of 32 MiB
    (a value without arrays, e.g. a large ``bytes``, in a process that never used numpy
    is written with ``pwritev`` unless the variable asks for threads).
    ``runnable`` is how many threads on the host are runnable now, this caller included
    (``runnable_now``: /proc/loadavg's 4th field; None: unknown, the plan above): the
    threads are capped at the CPUs the others leave free, so that many processes writing
    large values at once do not start 8 threads each; fewer than 2 free gives ``pwritev``.

    >>> write_plan(200 << 20, 16, "never", True), write_plan(200 << 20, 4, "within_size", True)
    (8, 4)
    >>> write_plan(200 << 20, 4, "never", True), write_plan(200 << 20, 2, "within_size", True)
    (0, 0)
    >>> write_plan(200 << 20, 16, "never", True, override=0), write_plan(1 << 20, 16, "never", True)
    (0, 0)
    >>> write_plan(200 << 20, 16, "never", True, runnable=11)
    6
    >>> write_plan(200 << 20, 16, "never", True, runnable=16)
    0
    """
    if override == 0 or total_size < MIN_BYTES or memory_backed is not True:
        return 0
    if override is not None and override > 0:
        return max(1, min(override, FORCED_MAX))
    need = HUGE_MIN_CPUS if huge_pages in _HUGE_MODES else SMALL_PAGE_MIN_CPUS
    if cpus < need or not numpy_loaded:
        return 0
    threads = min(MAX_THREADS, cpus)
    if runnable is not None:
        free = cpus - max(0, runnable - 1)  # the caller's own CPU is one of the threads
        threads = min(threads, free)
        if threads < 2:
            return 0
    return threads


def runnable_now(path: str = "/proc/loadavg") -> int | None:
    """Threads runnable on this host now (/proc/loadavg's 4th field, "runnable/total"; the
    reader counts itself), or None where it cannot be read (not Linux): one read per large
    write, about 10 us."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (a container or
    ``taskset`` narrows it), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# directory -> (st_dev when looked up, (memory_backed, huge_pages))
_mounts: dict[str, tuple[int | None, tuple[bool | None, str | None]]] = {}


def mount_of(directory: str) -> tuple[bool | None, str | None]:
    """``shm_mounts.describe(directory)``, cached per process and directory and looked up
    again when the directory's st_dev changes (it was remounted or unmounted since)."""
    try:
        dev: int | None = os.stat(directory).st_dev
    except OSError:
        dev = None
    cached = _mounts.get(directory)
    if cached is not None and dev is not None and cached[0] == dev:
        return cached[1]
    mount = shm_mounts.describe(directory)
    _mounts[directory] = (dev, mount)
    return mount


def plan_for(directory: str, total_size: int) -> int:
    """``write_plan`` for a new segment in ``directory``, looked into only for sizes the plan
    could give threads: ``MINIRAY_STORE_WRITE_THREADS``, the mount from ``mount_of``, the
    host's runnable threads from ``runnable_now`` (read once per write)."""
    if total_size < MIN_BYTES:
        return 0
    override = config.store_write_threads()
    if override == 0:
        return 0
    backed, huge = mount_of(directory)
    runnable = runnable_now() if override is None else None
    return write_plan(total_size, usable_cpus(), huge, backed, override,
                      numpy_loaded="numpy" in sys.modules, runnable=runnable)


def split_ranges(sizes: list[int], parts: int) -> list[list[tuple[int, int, int, int]]]:
    """Pure: cut pieces of ``sizes`` bytes, laid end to end, into ``parts`` contiguous ranges
    of about equal size. Each range is a list of ``(piece index, start in piece, start in
    the file, length)``; a range may span several pieces and a piece several ranges. Empty
    ranges (more parts than bytes) are left out.

    >>> split_ranges([10, 0, 6], 2)
    [[(0, 0, 0, 8)], [(0, 8, 8, 2), (2, 0, 10, 6)]]
    """
    total = sum(sizes)
    parts = max(1, parts)
    bounds = [total * i // parts for i in range(parts + 1)]
    ranges: list[list[tuple[int, int, int, int]]] = []
    piece, piece_start = 0, 0  # piece index and where it starts in the file
    for lo, hi in zip(bounds, bounds[1:]):
        if hi <= lo:
            continue
        out = []
        pos = lo
        while pos < hi:
            while piece_start + sizes[piece] <= pos:  # skip pieces that end before pos
                piece_start += sizes[piece]
                piece += 1
            take = min(hi, piece_start + sizes[piece]) - pos
            out.append((piece, pos - piece_start, pos, take))
            pos += take
        ranges.append(out)
    return ranges


class _Pool:
    """Daemon threads taking ``(function, done)`` jobs from one queue; a thread idle for
    ``IDLE_S`` ends (no thread outlives the writes that needed it by long)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._made = 0

    def submit(self, jobs: list[Callable[[], None]], done: _Done) -> list:
        """Queue ``jobs``, with at least as many threads as jobs alive (up to
        ``MAX_THREADS - 1``); each job is counted in ``done`` as it is queued, so a caller
        interrupted inside this call still waits for every job that was queued. Returns
        the jobs not queued, for the caller to run itself: all of them when no thread is
        alive and none could be started (RuntimeError: "can't start new thread"); a thread
        counts once it started."""
        with self._lock:  # decided with the idle threads' exits (``_serve``)
            while len(self._threads) < min(len(jobs), MAX_THREADS - 1):
                thread = threading.Thread(target=self._serve, daemon=True,
                                          name=f"miniray-segment-write-{self._made}")
                self._made += 1
                try:
                    thread.start()
                except RuntimeError:  # the threads alive serve the queue; none: the caller
                    break
                self._threads.add(thread)
            if not self._threads:
                return list(jobs)
            for job in jobs:
                done.add()
                self._jobs.put((job, done))
        return []

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                job, done = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # under the lock: no job queued for this thread
                        self._threads.discard(me)
                        return
                continue
            try:
                job()
            except BaseException as error:  # handed to the caller, who raises it
                done.finish(error)
            else:
                done.finish(None)
            del job, done


class _Done:
    """Counts the ranges of one write queued and not yet finished, and keeps the first
    error."""

    def __init__(self) -> None:
        self._left = 0
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def add(self) -> None:
        """One more range queued (before it is put on the queue)."""
        with self._cond:
            self._left += 1

    def finish(self, error: BaseException | None) -> None:
        with self._cond:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            if self._left <= 0:
                self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            while self._left > 0:
                self._cond.wait()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _Pool()
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's threads did not survive the fork."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def write_threaded(fd: int, pieces: list[Any], total_size: int, threads: int) -> None:
    """Write ``pieces`` (byte-like objects that cover ``[0, total_size)`` in order, as
    ``oob.Serialized.pieces`` gives them) at offset 0 of the new, empty file ``fd`` on
    ``threads`` threads (the caller counts as one): steps 1-4 of the module docstring.

    Raises what ``posix_fallocate`` raises (OSError ENOSPC on a full tmpfs) or the first
    error of any range; the mapping is closed either way, the file is the caller's.
    """
    import numpy as np  # lazy: only writes of tens of MiB come here

    views = [memoryview(p).cast("B") for p in pieces]
    sizes = [v.nbytes for v in views]
    if sum(sizes) != total_size:
        raise ValueError(f"pieces cover {sum(sizes)} bytes, the segment has {total_size}")
    os.posix_fallocate(fd, 0, total_size)
    mapping = mmap.mmap(fd, total_size, flags=mmap.MAP_SHARED,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    ranges = split_ranges(sizes, threads)

    def copy(rng: list[tuple[int, int, int, int]]) -> None:
        dst = src = None
        try:
            for index, start, at, length in rng:
                dst = np.frombuffer(mapping, dtype=np.uint8, count=length, offset=at)
                src = np.frombuffer(views[index], dtype=np.uint8, count=length, offset=start)
                np.copyto(dst, src)
                dst = src = None
        finally:
            del dst, src  # a traceback kept by the caller must not keep the mapping exported

    done = _Done()
    error: BaseException | None = None
    try:
        mine = [lambda rng=ranges[0]: copy(rng)]
        if len(ranges) > 1:  # counted in ``done`` as queued: an interrupt in here still
            # leaves every queued range waited for below
            mine += _get_pool().submit([lambda rng=rng: copy(rng) for rng in ranges[1:]],
                                       done)
        for job in mine:
            job()
    except BaseException as own:
        error = own
    while True:  # every range finished before the mapping goes, even after an interrupt
        try:
            done.wait()
            break
        except BaseException as interrupt:
            error = error or interrupt
    views = []
    try:
        mapping.close()
    except BufferError:  # a view still exported: the mapping goes when it is garbage
        pass
    error = error or done.error
    if error is not None:
        raise error
