"""``object_store/parallel_write.py``: the write plan, the ranges, and the threaded write
producing the same bytes as ``pwritev`` for every layout and thread count."""

from __future__ import annotations

import doctest
import os
import resource
import signal
import threading
import time

import numpy as np
import pytest

from miniray._private.core import config, oob
from miniray._private.object_store import parallel_write as pw
from miniray._private.object_store import shm_segments

MIB = 1 << 20


def test_doctests():
    assert doctest.testmod(pw, raise_on_error=False).failed == 0


# --- the plan ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size, cpus, huge, backed, override, expected", [
    # 4 KiB pages (/dev/shm): threads only from 8 CPUs on, at most MAX_THREADS
    (200 * MIB, 2, "never", True, None, 0),
    (200 * MIB, 4, "never", True, None, 0),
    (200 * MIB, 7, "never", True, None, 0),
    (200 * MIB, 8, "never", True, None, 8),
    (200 * MIB, 64, "never", True, None, pw.MAX_THREADS),
    # huge pages: from 4 CPUs on
    (200 * MIB, 3, "within_size", True, None, 0),
    (200 * MIB, 4, "within_size", True, None, 4),
    (200 * MIB, 6, "always", True, None, 6),
    (200 * MIB, 16, "within_size", True, None, pw.MAX_THREADS),
    (200 * MIB, 4, "advise", True, None, 0),  # advise without madvise: 4 KiB pages
    # small segments, disks and unknown mounts: pwritev
    (pw.MIN_BYTES - 1, 16, "within_size", True, None, 0),
    (pw.MIN_BYTES, 16, "within_size", True, None, 8),
    (200 * MIB, 16, None, False, None, 0),
    (200 * MIB, 16, None, None, None, 0),
    # the environment variable: 0 never, N always (from MIN_BYTES, on memory)
    (200 * MIB, 16, "within_size", True, 0, 0),
    (200 * MIB, 1, "never", True, 3, 3),
    (200 * MIB, 1, "never", True, 1000, pw.FORCED_MAX),
    (1 * MIB, 16, "never", True, 3, 0),
    (200 * MIB, 16, None, False, 3, 0),
])
def test_write_plan(size, cpus, huge, backed, override, expected):
    assert pw.write_plan(size, cpus, huge, backed, override) == expected


def test_plan_without_numpy_loaded_keeps_pwritev_unless_forced():
    assert pw.write_plan(200 * MIB, 16, "within_size", True, numpy_loaded=False) == 0
    assert pw.write_plan(200 * MIB, 16, "within_size", True, 4, numpy_loaded=False) == 4


def test_plan_never_gives_threads_on_two_cpus():
    for huge in ("never", "within_size", "always", None):
        for size in (MIB, 64 * MIB, 2048 * MIB):
            assert pw.write_plan(size, 2, huge, True) == 0


def test_store_write_threads_reads_the_environment(monkeypatch):
    for value, expected in (("", None), ("0", 0), ("6", 6), ("-2", 0), ("x", None)):
        monkeypatch.setenv("MINIRAY_STORE_WRITE_THREADS", value)
        assert config.store_write_threads() == expected
    monkeypatch.delenv("MINIRAY_STORE_WRITE_THREADS")
    assert config.store_write_threads() is None


def test_usable_cpus_is_the_affinity_mask():
    assert pw.usable_cpus() == len(os.sched_getaffinity(0))


# --- ranges -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[1], [24, 100, 40, 7], [5] * 100, [0, 0, 9, 0], [3, 1 << 20, 1]])
@pytest.mark.parametrize("parts", [1, 2, 3, 7, 8, 40])
def test_split_ranges_cover_every_byte_once_in_order(sizes, parts):
    ranges = pw.split_ranges(sizes, parts)
    total = sum(sizes)
    assert 1 <= len(ranges) <= parts
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    pos = 0
    lengths = []
    for rng in ranges:
        lengths.append(sum(r[3] for r in rng))
        for index, start, at, length in rng:
            assert at == pos and length > 0
            assert starts[index] + start == at and start + length <= sizes[index]
            pos += length
    assert pos == total
    assert max(lengths) - min(lengths) <= 1 or len(ranges) < parts


# --- the threaded write -----------------------------------------------------------------------


def _layouts():
    rng = np.random.default_rng(7)
    yield "many small buffers", [rng.integers(0, 255, n, dtype=np.uint8) for n in range(1, 300)]
    yield "one large", rng.integers(0, 255, 3 * MIB + 17, dtype=np.uint8)
    yield "odd sizes", {"a": rng.random(12345), "b": np.arange(7, dtype=np.int16),
                        "c": b"x" * 5000, "d": rng.integers(0, 9, 65537, dtype=np.uint8)}
    yield "metadata only", {"text": "t" * 300_000, "n": list(range(1000))}
    yield "empty buffers", [np.empty(0), np.ones(3), np.empty(0)]


def _pwritev_bytes(ser, path) -> bytes:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        ser.write_fd(fd)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("name, value", list(_layouts()), ids=[n for n, _ in _layouts()])
def test_threaded_write_is_byte_identical_to_pwritev(name, value, tmp_path):
    ser = oob.serialize(value)
    expected = _pwritev_bytes(ser, tmp_path / "pwritev")
    assert len(expected) == ser.total_size
    for threads in range(1, 9):
        path = tmp_path / f"threads{threads}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            pw.write_threaded(fd, ser.pieces(), ser.total_size, threads)
        finally:
            os.close(fd)
        assert path.read_bytes() == expected, (name, threads)
        loaded = shm_segments.read_spilled(str(path))
        if isinstance(value, np.ndarray):
            assert np.array_equal(loaded, value)


def test_write_segment_takes_the_threaded_path_when_forced(tmp_path, monkeypatch):
    calls = []
    real = pw.write_threaded
    monkeypatch.setattr(pw, "write_threaded", lambda *a: calls.append(a[3]) or real(*a))
    monkeypatch.setattr(pw, "MIN_BYTES", 1 << 16)
    monkeypatch.setitem(pw._mounts, str(tmp_path), (os.stat(tmp_path).st_dev, (True, "never")))
    value = np.arange(1 << 16, dtype=np.int64)
    ser = oob.serialize(value)
    monkeypatch.setenv("MINIRAY_STORE_WRITE_THREADS", "4")
    shm_segments.write_segment(str(tmp_path / "forced"), ser)
    monkeypatch.setenv("MINIRAY_STORE_WRITE_THREADS", "0")
    shm_segments.write_segment(str(tmp_path / "never"), ser)
    assert calls == [4]
    assert (tmp_path / "forced").read_bytes() == (tmp_path / "never").read_bytes()


def test_an_error_in_a_thread_reaches_the_caller_and_the_pool_carries_on(tmp_path, monkeypatch):
    caller = threading.current_thread()
    real_copyto = np.copyto

    def failing(dst, src):
        if threading.current_thread() is not caller:
            raise MemoryError("copy failed in a pool thread")
        real_copyto(dst, src)

    ser = oob.serialize(np.ones(1 << 18))
    fd = os.open(tmp_path / "seg", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        monkeypatch.setattr(np, "copyto", failing)
        with pytest.raises(MemoryError, match="pool thread"):
            pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)
        monkeypatch.setattr(np, "copyto", real_copyto)
        os.ftruncate(fd, 0)
        pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)  # same fd, pool still serves
    finally:
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == _pwritev_bytes(ser, tmp_path / "ref")


def test_pool_threads_end_when_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "IDLE_S", 0.05)
    monkeypatch.setattr(pw, "_pool", None)
    ser = oob.serialize(np.ones(1 << 16))
    fd = os.open(tmp_path / "seg", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        pw.write_threaded(fd, ser.pieces(), ser.total_size, 8)
    finally:
        os.close(fd)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pool_threads():
        time.sleep(0.02)
    assert _pool_threads() == []
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("miniray-segment"))


def _pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("miniray-segment-write")]


def test_a_forked_child_writes_with_a_pool_of_its_own(tmp_path):
    ser = oob.serialize(np.arange(1 << 17, dtype=np.int32))
    expected = _pwritev_bytes(ser, tmp_path / "ref")
    fd = os.open(tmp_path / "parent", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)  # the parent's pool exists now
    finally:
        os.close(fd)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(20)  # a child waiting on the parent's dead threads ends anyway
            fd = os.open(tmp_path / "child", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)
            os.close(fd)
            code = 0 if (tmp_path / "child").read_bytes() == expected else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "parent").read_bytes() == expected


def test_a_failed_threaded_write_leaves_no_file(tmp_path, monkeypatch):
    # posix_fallocate beyond RLIMIT_FSIZE fails (EFBIG, SIGXFSZ ignored), as a full tmpfs
    # fails it with ENOSPC: write_segment unlinks the file before the error propagates.
    monkeypatch.setattr(pw, "MIN_BYTES", 1 << 16)
    monkeypatch.setitem(pw._mounts, str(tmp_path), (os.stat(tmp_path).st_dev, (True, "never")))
    monkeypatch.setenv("MINIRAY_STORE_WRITE_THREADS", "4")
    ser = oob.serialize(np.ones(1 << 17))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
            try:
                shm_segments.write_segment(str(tmp_path / "seg"), ser)
                code = 3
            except OSError:
                code = 0 if not (tmp_path / "seg").exists() else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.listdir(tmp_path) == []


def test_writes_on_several_caller_threads_share_the_pool(tmp_path):
    values = [np.random.default_rng(i).integers(0, 255, (1 << 18) + i, dtype=np.uint8)
              for i in range(6)]
    sers = [oob.serialize(v) for v in values]
    expected = [_pwritev_bytes(s, tmp_path / f"ref{i}") for i, s in enumerate(sers)]
    errors = []

    def writer(i: int) -> None:
        try:
            for round_ in range(5):
                path = tmp_path / f"w{i}_{round_}"
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    pw.write_threaded(fd, sers[i].pieces(), sers[i].total_size, 8)
                finally:
                    os.close(fd)
                if path.read_bytes() != expected[i]:
                    errors.append(f"writer {i} round {round_}: bytes differ")
        except BaseException as error:  # reported below
            errors.append(f"writer {i}: {error!r}")

    callers = [threading.Thread(target=writer, args=(i,)) for i in range(len(sers))]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    assert not any(c.is_alive() for c in callers), "a write never finished"
    assert errors == []


def test_an_interrupt_while_queueing_still_waits_for_every_queued_range(tmp_path, monkeypatch):
    """KeyboardInterrupt after the pool queued the ranges but before submit returned: the
    caller must not close the mapping (and return) while pool threads still copy."""
    real_submit, real_copyto = pw._Pool.submit, np.copyto
    finished = []

    def slow(dst, src):
        if threading.current_thread().name.startswith("miniray-segment-write"):
            time.sleep(0.1)
            try:
                real_copyto(dst, src)
            finally:
                finished.append(time.monotonic())
        else:
            real_copyto(dst, src)

    def queue_then_interrupt(self, jobs, done):
        real_submit(self, jobs, done)
        raise KeyboardInterrupt

    ser = oob.serialize(np.ones(1 << 18))
    fd = os.open(tmp_path / "seg", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        monkeypatch.setattr(np, "copyto", slow)
        monkeypatch.setattr(pw._Pool, "submit", queue_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)
        returned = time.monotonic()
        deadline = returned + 5
        while len(finished) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(finished) == 3
        assert max(finished) <= returned  # every queued range ended before the call did
    finally:
        os.close(fd)


def test_no_thread_can_start_the_caller_copies_every_range(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "_pool", None)
    deadline = time.monotonic() + 5  # idle threads of earlier tests gone, so none serves
    monkeypatch.setattr(pw, "IDLE_S", 0.01)
    while time.monotonic() < deadline and _pool_threads():
        time.sleep(0.02)

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    ser = oob.serialize(np.arange(1 << 18, dtype=np.float64))
    fd = os.open(tmp_path / "seg", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        pw.write_threaded(fd, ser.pieces(), ser.total_size, 4)
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert (tmp_path / "seg").read_bytes() == _pwritev_bytes(ser, tmp_path / "ref")


def test_write_plan_caps_threads_at_free_cpus():
    big = 200 << 20
    # unknown load: today's plan
    assert pw.write_plan(big, 16, "never", True, runnable=None) == 8
    # only the caller runnable: the whole plan
    assert pw.write_plan(big, 16, "never", True, runnable=1) == 8
    # 10 others runnable on 16 CPUs: 6 free with the caller's
    assert pw.write_plan(big, 16, "never", True, runnable=11) == 6
    # 16 workers each writing at once: no free CPU, one pwritev each
    assert pw.write_plan(big, 16, "never", True, runnable=16) == 0
    assert pw.write_plan(big, 16, "never", True, runnable=40) == 0
    # one free besides the caller: 2 threads; none besides it: pwritev
    assert pw.write_plan(big, 4, "within_size", True, runnable=3) == 2
    assert pw.write_plan(big, 4, "within_size", True, runnable=4) == 0
    # the variable is obeyed whatever the load
    assert pw.write_plan(big, 16, "never", True, override=4, runnable=40) == 4


def test_runnable_now_reads_loadavg_and_fails_soft(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.50 0.40 0.30 7/812 12345\n")
    assert pw.runnable_now(str(f)) == 7
    f.write_text("garbage\n")
    assert pw.runnable_now(str(f)) is None
    assert pw.runnable_now(str(tmp_path / "none")) is None
    if os.path.exists("/proc/loadavg"):
        assert pw.runnable_now() >= 1


def test_mount_lookup_is_repeated_when_the_directory_is_remounted(monkeypatch):
    calls = []
    answers = {1: (True, "never"), 2: (True, "within_size")}
    dev = {"now": 1}

    def describe(d):
        calls.append(d)
        return answers[dev["now"]]

    class St:
        @property
        def st_dev(self):
            return dev["now"]

    real_stat = os.stat
    monkeypatch.setattr(pw.shm_mounts, "describe", describe)
    monkeypatch.setattr(pw.os, "stat",
                        lambda p, *a, **k: St() if p == "/fake" else real_stat(p, *a, **k))
    monkeypatch.setattr(pw, "_mounts", {})
    assert pw.mount_of("/fake") == (True, "never")
    assert pw.mount_of("/fake") == (True, "never")
    assert calls == ["/fake"]  # cached while st_dev stays
    dev["now"] = 2  # remounted huge=within_size
    assert pw.mount_of("/fake") == (True, "within_size")
    assert calls == ["/fake", "/fake"]
    assert pw.mount_of("/fake") == (True, "within_size")
    assert len(calls) == 2
