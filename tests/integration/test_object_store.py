"""The shared-memory object store through the public API (issue 3).

Zero-copy, read-only numpy views in the driver, in tasks and in actors; reference counting
(``del ref`` frees the segment, pending tasks and outer objects keep it alive, a reader's view
outlives the unlink); the memory cap with spilling and ``ObjectStoreFullError``; freed objects
raising ``ObjectLostError``; no segment left after owner death (SIGKILL), a worker crash or a
fork.

Segments are ``/dev/shm/mr_<session tag>_<object id hex>``; the tag starts with the 6-hex tag
of the test's session root (``session.root_tag(MINIRAY_TMPDIR)``), so an autouse check below
fails any test that leaves a file of its root in ``/dev/shm`` (the conftest's check looks for
the session *directory* name, which segment names do not carry).

``/dev/shm`` is shared with whatever else runs on the host (other sessions, benchmarks), so
memory is measured from this session's own files, never from ``statvfs``.
"""

from __future__ import annotations

import gc
import os
import signal
import time

import numpy as np
import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray._private.host import procinfo, session

from .helpers import wait_until

SHM = "/dev/shm"
MIB = 1 << 20
GET_TIMEOUT = 30


# ----------------------------------------------------------------------------- helpers
def _shm_names(prefix: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(SHM) if e.startswith(prefix))
    except OSError:
        return []


def _segments(tag: str) -> list[str]:
    """Every file of session ``tag`` in /dev/shm (objects and recycled ``pool`` segments)."""
    return _shm_names(f"mr_{tag}_")


def _segment_bytes(tag: str) -> int:
    total = 0
    for name in _segments(tag):
        try:
            total += os.stat(os.path.join(SHM, name)).st_size
        except FileNotFoundError:
            pass
    return total


def _store():
    return runtime.current().store


def _segment_path(ref) -> str:
    return os.path.join(SHM, f"mr_{_store().session_tag}_{ref.hex()}")


def _settle() -> None:
    """Make the owner apply queued ObjectRef drops now: every ``put`` does so first.

    Drops are applied by the I/O thread soon anyway (see
    ``test_dropped_ref_frees_segment_while_driver_is_idle``); this makes tests that count
    segments right after a ``del`` deterministic.
    """
    miniray.put(None)


def _unlink_all(names) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass


@pytest.fixture(autouse=True)
def _no_segments_left(session_root):
    """After the test (and after ``ray_start`` shut down): nothing of this root in /dev/shm."""
    prefix = f"mr_{session.root_tag(session_root)}"
    yield
    if not wait_until(lambda: not _shm_names(prefix), timeout=30):
        left = _shm_names(prefix)
        _unlink_all(left)
        pytest.fail(f"shared-memory segments left in {SHM}: {left}")


def _big(value: float = 1.0, mib: int = 2) -> np.ndarray:
    return np.full(mib * MIB // 8, value, dtype=np.float64)


# ----------------------------------------------------------------------------- zero-copy, read-only
def test_get_of_large_array_is_a_read_only_view_shared_by_every_get(ray):
    arr = np.arange(MIB // 4, dtype=np.float64)  # 2 MiB: a segment
    ref = ray.put(arr)
    assert os.path.exists(_segment_path(ref))
    first = ray.get(ref)
    second = ray.get(ref)
    np.testing.assert_array_equal(first, arr)
    assert first.flags.writeable is False
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 1.0
    # Both gets view the same memory: no copy.
    addr = first.__array_interface__["data"][0]
    assert second.__array_interface__["data"][0] == addr
    assert first[0] == 0.0  # the failed write changed nothing


def test_structures_of_arrays_come_back_with_read_only_arrays(ray):
    value = {
        "a": _big(1.0),
        "list": [_big(2.0, 1), np.arange(10)],
        "tuple": (np.ones(3), "text"),
        "n": 7,
    }
    got = ray.get(ray.put(value))
    assert set(got) == {"a", "list", "tuple", "n"}
    assert got["n"] == 7 and got["tuple"][1] == "text"
    arrays = [got["a"], got["list"][0], got["list"][1], got["tuple"][0]]
    for out, expected in zip(arrays, [value["a"], value["list"][0], value["list"][1],
                                      value["tuple"][0]]):
        np.testing.assert_array_equal(out, expected)
        assert out.flags.writeable is False
    with pytest.raises(ValueError, match="read-only"):
        got["list"][0][:] = 0


def test_small_arrays_are_read_only_too(ray):
    small = np.arange(1000, dtype=np.int32)  # 4 KB: inline
    ref = ray.put(small)
    assert not os.path.exists(_segment_path(ref))
    got = ray.get(ref)
    np.testing.assert_array_equal(got, small)
    assert got.flags.writeable is False
    with pytest.raises(ValueError, match="read-only"):
        got[0] = 5
    nested = ray.get(ray.put([small, {"k": small[:10]}]))
    assert nested[0].flags.writeable is False and nested[1]["k"].flags.writeable is False


def test_task_argument_is_a_read_only_view(ray):
    arr = np.arange(MIB, dtype=np.int64)  # 8 MiB

    @ray.remote
    def inspect(x):
        try:
            x[0] = 1
            wrote = True
        except ValueError:
            wrote = False
        return x.flags.writeable, wrote, int(x.sum()), x.shape, str(x.dtype)

    ref = ray.put(arr)
    writeable, wrote, total, shape, dtype = ray.get(inspect.remote(ref), timeout=GET_TIMEOUT)
    assert writeable is False and wrote is False
    assert (total, shape, dtype) == (int(arr.sum()), arr.shape, "int64")
    # The failed write in the worker left the shared memory alone.
    assert ray.get(ref)[0] == 0


def test_task_getting_a_ref_nested_in_a_list_sees_the_same_values(ray):
    arr = np.arange(MIB, dtype=np.int64)

    @ray.remote
    def read_nested(refs):
        value = ray.get(refs[0])
        return value.flags.writeable, int(value.sum()), int(value[-1])

    ref = ray.put(arr)
    assert ray.get(read_nested.remote([ref]), timeout=GET_TIMEOUT) == (
        False, int(arr.sum()), int(arr[-1]))


def test_large_task_result_is_a_read_only_view_in_the_driver(ray):
    @ray.remote
    def make(n):
        return np.arange(n, dtype=np.float64)

    ref = make.remote(MIB)  # 8 MiB, written by the worker, adopted by the owner
    first = ray.get(ref, timeout=GET_TIMEOUT)
    second = ray.get(ref)
    assert first.flags.writeable is False
    np.testing.assert_array_equal(first, np.arange(MIB, dtype=np.float64))
    assert first.__array_interface__["data"][0] == second.__array_interface__["data"][0]
    assert os.path.exists(_segment_path(ref))


def test_actor_receives_refs_as_read_only_views(ray):
    arr = np.arange(MIB, dtype=np.int64)

    @ray.remote
    class Holder:
        def __init__(self, x):
            self.total = int(x.sum())
            self.writeable = x.flags.writeable

        def init_info(self):
            return self.total, self.writeable

        def total_of(self, x):
            return int(x.sum()), x.flags.writeable

        def total_nested(self, refs):
            value = ray.get(refs[0])
            return int(value.sum()), value.flags.writeable

    ref = ray.put(arr)
    expected = int(arr.sum())
    actor = Holder.remote(ref)
    assert ray.get(actor.init_info.remote(), timeout=GET_TIMEOUT) == (expected, False)
    assert ray.get(actor.total_of.remote(ref), timeout=GET_TIMEOUT) == (expected, False)
    assert ray.get(actor.total_nested.remote([ref]), timeout=GET_TIMEOUT) == (expected, False)
    ray.kill(actor)


# ----------------------------------------------------------------------------- reference counting
def test_dropped_ref_frees_segment_while_driver_is_idle(ray):
    ref = ray.put(_big())
    path = _segment_path(ref)
    assert os.path.exists(path)
    del ref
    gc.collect()
    assert wait_until(lambda: not os.path.exists(path), timeout=30), (
        f"{path} still exists 30 s after its only ObjectRef was dropped"
    )


def test_dropped_ref_frees_segment(ray):
    ref = ray.put(_big())
    path = _segment_path(ref)
    assert os.path.exists(path)
    assert _store().statistics()["objects"] >= 1
    del ref
    gc.collect()
    _settle()
    assert wait_until(lambda: not os.path.exists(path), 30), f"{path} was not freed"
    stats = _store().statistics()
    assert stats["bytes_shm"] == 0 and stats["bytes_in_memory"] < 100 * 1024, stats
    # What is left is at most its recycled segment (renamed ..._pool<n>, kept for reuse).
    assert all("_pool" in name for name in _segments(_store().session_tag))


def test_recycled_segment_is_given_back_while_driver_is_idle(ray):
    ref = ray.put(_big())
    del ref
    gc.collect()
    _settle()  # frees it in this thread; it goes to the pool for reuse
    tag = _store().session_tag
    assert wait_until(lambda: not _segments(tag), timeout=30), (
        f"{_segments(tag)} still held 30 s after the last object was freed "
        f"(Owner.POOL_IDLE_S is {runtime.current().owner.POOL_IDLE_S} s)"
    )


def test_put_get_del_loop_runs_in_constant_memory(ray):
    tag = _store().session_tag
    base = _big(0.0)  # 2 MiB
    most_files = most_bytes = 0
    for i in range(300):
        ref = ray.put(base + i)
        view = ray.get(ref)
        assert view[0] == i and view[-1] == i
        del view, ref
        most_files = max(most_files, len(_segments(tag)))
        most_bytes = max(most_bytes, _segment_bytes(tag))
    # Each put frees the previous object first and reuses its segment.
    assert most_files <= 3, most_files
    assert most_bytes <= 3 * (2 * MIB + 64 * 1024), most_bytes
    stats = _store().statistics()
    assert stats["objects"] <= 3, stats
    _settle()
    assert _store().statistics()["bytes_shm"] == 0  # every object freed
    assert len(_segments(tag)) <= 3 and all("_pool" in n for n in _segments(tag))


@pytest.mark.parametrize("state", ["waiting for a dependency", "running"])
def test_task_argument_keeps_object_alive_after_driver_drops_its_ref(ray, state, tmp_path):
    """The tasks wait on a file the test creates after its check, so a loaded machine cannot
    let the task finish (and legitimately free the object) before the check."""
    arr = np.arange(MIB, dtype=np.int64)
    release = str(tmp_path / "release")

    def wait_for_release():
        deadline = time.monotonic() + GET_TIMEOUT
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)

    @ray.remote
    def gate():
        wait_for_release()
        return 1

    @ray.remote
    def slow_total(_gate, x, wait):
        if wait:
            wait_for_release()
        return int(x.sum())

    ref = ray.put(arr)
    path = _segment_path(ref)
    if state == "running":
        out = slow_total.remote(None, ref, True)
    else:
        out = slow_total.remote(gate.remote(), ref, False)
    del ref
    gc.collect()
    _settle()
    time.sleep(0.1)
    assert os.path.exists(path), "the object was freed while a task still needed it"
    open(release, "w").close()
    assert ray.get(out, timeout=GET_TIMEOUT) == int(arr.sum())
    # Once the task ran, nothing refers to it any more.
    _settle()
    assert wait_until(lambda: not os.path.exists(path), 30), f"{path} outlived its last reader"


def test_object_nested_in_a_stored_object_stays_alive_while_the_outer_ref_exists(ray):
    arr = np.arange(MIB, dtype=np.int64)
    inner = ray.put(arr)
    path = _segment_path(inner)
    outer = ray.put([inner])
    del inner
    gc.collect()
    _settle()
    time.sleep(0.1)
    assert os.path.exists(path)
    holder = ray.get(outer)
    assert isinstance(holder[0], miniray.ObjectRef)
    np.testing.assert_array_equal(ray.get(holder[0]), arr)

    @ray.remote
    def through_outer(wrapped):
        return int(ray.get(wrapped[0]).sum())

    assert ray.get(through_outer.remote(outer), timeout=GET_TIMEOUT) == int(arr.sum())


@pytest.mark.parametrize("where", ["inside a stored object", "nested in a task argument"])
def test_nested_object_is_freed_once_nothing_refers_to_it(ray, where):
    inner = ray.put(_big())
    path = _segment_path(inner)
    if where == "inside a stored object":
        outer = ray.put([inner])
        del outer
    else:

        @ray.remote
        def first_item(refs):
            return float(ray.get(refs[0])[0])

        assert ray.get(first_item.remote([inner]), timeout=GET_TIMEOUT) == 1.0
    del inner
    gc.collect()
    _settle()
    assert wait_until(lambda: not os.path.exists(path), timeout=30), (
        f"{path} still exists after every ObjectRef to it was dropped"
    )


def test_reader_view_outlives_the_freed_segment(ray):
    arr = np.arange(MIB, dtype=np.int64) * 3
    ref = ray.put(arr)
    path = _segment_path(ref)
    view = ray.get(ref)
    del ref
    gc.collect()
    _settle()
    # The owner unlinked it (a segment still mapped is never recycled) ...
    assert wait_until(lambda: not os.path.exists(path), 30), f"{path} was not unlinked"
    # ... and the mapping stays valid (POSIX): same values, still read-only.
    assert view.flags.writeable is False
    np.testing.assert_array_equal(view, arr)
    # New objects of the same size never land in the memory the reader still maps.
    others = [ray.put(np.full(MIB, -1, dtype=np.int64)) for _ in range(3)]
    assert [int(ray.get(r)[5]) for r in others] == [-1, -1, -1]
    np.testing.assert_array_equal(view, arr)


# ----------------------------------------------------------------------------- capacity, spilling
def test_spilling_over_the_cap_and_transparent_restore(ray_start):
    ray_start(num_cpus=1, object_store_memory=80 * MIB)  # Ray's minimum is 75 MiB
    store = _store()
    assert miniray.available_resources()["object_store_memory"] == 80 * MIB
    n = 20 * MIB // 8
    refs = [miniray.put(np.full(n, float(i))) for i in range(6)]  # 120 MiB under an 80 MiB cap
    stats = store.statistics()
    assert stats["bytes_spilled"] > 0, stats
    assert stats["bytes_in_memory"] <= 80 * MIB, stats
    assert len(_segments(store.session_tag)) <= 4
    spilled = [e for e in os.listdir(store.spill_dir) if e.startswith(f"mr_{store.session_tag}_")]
    assert spilled, "no spill file on disk"
    for i, ref in enumerate(refs):
        value = miniray.get(ref, timeout=GET_TIMEOUT)
        assert value.shape == (n,) and value[0] == i and value[-1] == i
        assert value.flags.writeable is False
        del value
    stats = store.statistics()
    assert stats["restores"] > 0
    # Ray's `ray memory` lines count what moved since start (its private memory_summary).
    report = miniray._private.internal_api.memory_summary(stats_only=True)
    assert f"Spilled {stats['bytes_spilled_total'] // MIB} MiB, {stats['spills']} objects, " \
        "avg write throughput " in report and stats["spills"] >= 2, report
    assert f"Restored {stats['bytes_restored_total'] // MIB} MiB, {stats['restores']} " \
        "objects, avg read throughput " in report, report

    @miniray.remote
    def first_and_last(x):
        return float(x[0]), float(x[-1])

    # A task reading an object that was spilled meanwhile gets it back too.
    assert miniray.get([first_and_last.remote(r) for r in refs], timeout=GET_TIMEOUT) == [
        (float(i), float(i)) for i in range(6)
    ]
    assert store.statistics()["bytes_in_memory"] <= 80 * MIB


def test_objects_larger_than_the_store_are_stored_on_disk(ray_start, caplog):
    """Compared with Ray 2.60: init(object_store_memory=100 MiB) then a 200 MB put, a 200 MB
    task result and a 200 MB put inside a task all succeed (Ray's fallback allocation). Here
    they go to the spill directory, nothing else is spilled for them, and one warning names
    both sizes. (miniray used to refuse the driver's put with ObjectStoreFullError.)"""
    ray_start(num_cpus=1, object_store_memory=80 * MIB)
    store = _store()
    keep = miniray.put(_big(4.0))
    with caplog.at_level("WARNING", logger="miniray"):
        ref = miniray.put(np.full(100 * MIB // 8, 7.0))

    @miniray.remote
    def result():
        return np.full(100 * MIB // 8, 8.0)

    @miniray.remote
    def put_inside():
        return [miniray.put(np.full(100 * MIB // 8, 9.0))]

    @miniray.remote
    def total(x):
        return float(x[0] + x[-1])

    with caplog.at_level("WARNING", logger="miniray"):
        from_task = result.remote()
        (from_worker_put,) = miniray.get(put_inside.remote(), timeout=GET_TIMEOUT)
        assert miniray.wait([from_task], timeout=GET_TIMEOUT)[0] == [from_task]
    warnings = [r.getMessage() for r in caplog.records if "larger than the whole" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "is 100.0 MiB, larger than the whole object store (80.0 MiB" in warnings[0]
    for value, expected in ((ref, 7.0), (from_task, 8.0), (from_worker_put, 9.0)):
        array = miniray.get(value, timeout=GET_TIMEOUT)
        assert array.shape == (100 * MIB // 8,) and array[0] == array[-1] == expected
        del array
        assert miniray.get(total.remote(value), timeout=GET_TIMEOUT) == 2 * expected
    stats = store.statistics()
    # Only the two workers' segments were moved to disk (the driver's put was written there).
    assert stats["oversized"] == 3 and stats["spills"] == 2, stats
    assert stats["bytes_in_memory"] <= 80 * MIB, stats
    assert miniray.get(keep)[0] == 4.0  # still in memory: nothing was spilled for them
    assert store.location(keep._id)[0] == "shm"


def test_store_full_when_every_object_is_being_read(ray_start):
    ray_start(num_cpus=1, object_store_memory=80 * MIB)
    refs = [miniray.put(_big(float(i), 25)) for i in range(3)]  # 75 MiB of 80
    views = [miniray.get(r) for r in refs]  # held: nothing can be spilled
    with pytest.raises(exceptions.ObjectStoreFullError) as info:
        miniray.put(_big(9.0, 25))
    assert "25.0 MiB" in str(info.value) and "80.0 MiB" in str(info.value)
    assert [v[0] for v in views] == [0.0, 1.0, 2.0]
    del views
    gc.collect()
    # Readers gone: the same put now spills the least recently used object and succeeds.
    fourth = miniray.put(_big(9.0, 25))
    assert _store().statistics()["bytes_spilled"] > 0
    assert [miniray.get(r)[-1] for r in refs + [fourth]] == [0.0, 1.0, 2.0, 9.0]


# ----------------------------------------------------------------------------- freed objects
@pytest.mark.parametrize("size", ["small", "large"])
def test_get_of_a_freed_object_raises_object_lost_error(ray, size):
    value = np.ones(10) if size == "small" else _big()
    ref = ray.put(value)
    ref_hex = ref.hex()
    path = _segment_path(ref)
    del ref
    gc.collect()
    _settle()
    assert wait_until(lambda: not os.path.exists(path), 30)
    assert wait_until(lambda: not runtime.current().knows(bytes.fromhex(ref_hex)), 30)
    again = miniray.ObjectRef.from_hex(ref_hex)
    with pytest.raises(exceptions.ObjectLostError) as info:
        ray.get(again, timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.ObjectFreedError)
    assert ref_hex in str(info.value)

    @ray.remote
    def identity(x):
        return x

    with pytest.raises(exceptions.ObjectFreedError):
        ray.get(identity.remote(again), timeout=GET_TIMEOUT)
    assert ray.get(ray.put(3)) == 3  # the session still works


def test_worker_get_of_a_freed_object_raises_object_lost_error(ray):
    ref = ray.put(_big())
    ref_hex = ref.hex()
    del ref
    gc.collect()
    _settle()
    assert wait_until(lambda: not runtime.current().knows(bytes.fromhex(ref_hex)), 30)

    @ray.remote
    def read(refs):
        try:
            ray.get(refs[0], timeout=15)  # raises at once; a wait would give GetTimeoutError
            return "a value"
        except Exception as error:  # noqa: BLE001 - reported to the test
            return type(error).__name__

    assert ray.get(read.remote([miniray.ObjectRef.from_hex(ref_hex)]), timeout=GET_TIMEOUT) == (
        "ObjectFreedError")


# ----------------------------------------------------------------------------- crashes, forks
_DEAD_OWNER = """
import time
import numpy as np
import miniray
from miniray._private import runtime

miniray.init(num_cpus=1)
refs = [miniray.put(np.full(5 << 17, i, dtype=np.float64)) for i in range(2)]  # 5 MiB each
rt = runtime.current()
print(rt.store.session_tag, rt.session_dir, *rt.pids(), flush=True)
time.sleep(120)
"""


def _killed_owner(drivers, session_root) -> tuple[str, str, list[int]]:
    """Start a driver holding two 5 MiB objects, SIGKILL it; returns (tag, session dir, pids
    of its fork server and workers).

    Any miniray session on the host sweeps dead sessions' segments when it starts, so the
    checks that the segments survived the kill run right after it, before anything slow.
    """
    proc = drivers.start(_DEAD_OWNER)
    tag, session_dir, *pids = drivers.read_line(proc, timeout=60).split()
    assert tag.startswith(session.root_tag(session_root))
    assert len(_segments(tag)) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    # Nobody unlinked them: the owner died without its teardown.
    left = _segments(tag)
    assert len(left) == 2, left
    assert os.path.isdir(session_dir)
    return tag, session_dir, [int(p) for p in pids]


def _wait_gone(pids) -> None:
    """The dead owner's fork server sees EOF and takes the workers with it."""
    assert wait_until(lambda: not any(procinfo.is_alive(p) for p in pids), timeout=30), pids


def test_owner_killed_segments_are_swept_by_the_next_init(drivers, session_root):
    tag, session_dir, pids = _killed_owner(drivers, session_root)
    _wait_gone(pids)
    result = drivers.run(
        "import miniray\n"
        "miniray.init(num_cpus=1)\n"
        "print('started', flush=True)\n"
        "miniray.shutdown()\n",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout
    assert _segments(tag) == []
    assert not os.path.exists(session_dir)
    assert not os.path.isdir(session_root) or not os.listdir(session_root)


def test_owner_killed_segments_are_swept_by_miniray_stop(drivers, session_root, capsys):
    from miniray._private import cli

    tag, session_dir, pids = _killed_owner(drivers, session_root)
    try:
        # `python -m miniray stop`, run in-process: the same cli.main, without the ~0.3 s of
        # interpreter start-up during which another session on the host could sweep first.
        if len(_segments(tag)) != 2:
            pytest.skip("another miniray session on this host swept the segments first")
        assert cli.main(["stop"]) == 0
        assert _segments(tag) == [], "miniray stop left the dead session's segments"
        assert not os.path.exists(session_dir)
    finally:
        _unlink_all(_segments(tag))
        _wait_gone(pids)


class _ExitWhilePickled:
    """A return value whose pickling kills the worker, after the earlier return values were
    already written to shared memory. Records which segments of the root existed then; with
    ``once``, only the first attempt dies."""

    def __init__(self, prefix: str, marker: str, once: bool):
        self.prefix, self.marker, self.once = prefix, marker, once

    def __reduce__(self):
        if self.once and os.path.exists(self.marker):
            return (str, ("survived",))
        with open(self.marker, "w") as f:
            f.write("\n".join(_shm_names(self.prefix)))
        os._exit(1)


def test_worker_crash_after_writing_a_result_segment_leaves_none(ray, session_root, tmp_path):
    prefix = f"mr_{session.root_tag(session_root)}"
    marker = str(tmp_path / "written")
    keep = ray.put(_big(7.0))  # a live object: its segment must stay

    @ray.remote(num_returns=2, max_retries=0)
    def crash_mid_results(prefix, marker):
        return np.ones(5 << 17), _ExitWhilePickled(prefix, marker, once=False)

    big, _second = crash_mid_results.remote(prefix, marker)
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(big, timeout=GET_TIMEOUT)
    with open(marker) as f:
        written = f.read().split()
    orphan = os.path.basename(_segment_path(big))
    assert orphan in written, f"the worker wrote no segment before dying: {written}"
    assert wait_until(lambda: not os.path.exists(os.path.join(SHM, orphan)), 30)
    assert _segments(_store().session_tag) == [os.path.basename(_segment_path(keep))]
    assert ray.get(keep)[0] == 7.0


def test_worker_crash_after_writing_a_result_segment_then_retry(ray, session_root, tmp_path):
    prefix = f"mr_{session.root_tag(session_root)}"
    marker = str(tmp_path / "written")

    @ray.remote(num_returns=2, max_retries=1)
    def crash_once(prefix, marker):
        return np.arange(5 << 17, dtype=np.float64), _ExitWhilePickled(prefix, marker, once=True)

    big, second = crash_once.remote(prefix, marker)
    value = ray.get(big, timeout=GET_TIMEOUT)
    assert os.path.exists(marker)  # the first attempt did die
    np.testing.assert_array_equal(value, np.arange(5 << 17, dtype=np.float64))
    assert ray.get(second) == "survived"
    assert _segments(_store().session_tag) == [os.path.basename(_segment_path(big))]


_FORKING_DRIVER = """
import os
import sys
import numpy as np
import miniray
from miniray._private import runtime

miniray.init(num_cpus=1)
tag = runtime.current().store.session_tag
ref = miniray.put(np.arange(1 << 20, dtype=np.int64))  # 8 MiB: a segment
arr = miniray.get(ref)
expected = int(arr.sum())
segment = f"mr_{tag}_{ref.hex()}"
for how in ("os._exit", "sys.exit"):
    pid = os.fork()
    if pid == 0:  # the child reads what it inherited and never calls miniray
        ok = int(arr.sum()) == expected and not arr.flags.writeable
        if how == "os._exit":
            os._exit(0 if ok else 3)
        sys.exit(0 if ok else 3)  # a normal exit: atexit hooks and finalizers run
    _, status = os.waitpid(pid, 0)
    print(how, os.waitstatus_to_exitcode(status), segment in os.listdir("/dev/shm"), flush=True)


@miniray.remote
def total(x):
    return int(x.sum())


print("task", miniray.get(total.remote(ref), timeout=30) == expected, flush=True)
print("put", float(miniray.get(miniray.put(np.ones(1 << 18))).sum()), flush=True)
print("tag", tag, flush=True)
miniray.shutdown()
"""


def test_forked_child_does_not_tear_down_the_parents_store(drivers, session_root):
    result = drivers.run(_FORKING_DRIVER, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "os._exit 0 True" in lines, result.stdout
    assert "sys.exit 0 True" in lines, result.stdout
    assert "task True" in lines and "put 262144.0" in lines, result.stdout
    tag = next(line.split()[1] for line in lines if line.startswith("tag "))
    assert _segments(tag) == []
    assert not os.path.isdir(session_root) or not os.listdir(session_root)


# ----------------------------------------------------------------------------- observability
def test_available_resources_and_store_statistics(ray):
    total = ray.available_resources()["object_store_memory"]
    assert total == ray.cluster_resources()["object_store_memory"] > 0
    st = os.statvfs(SHM)
    assert total <= st.f_blocks * st.f_frsize  # sized from what /dev/shm can hold
    store = _store()
    assert store.capacity == total
    before = store.statistics()
    assert {"objects", "bytes_in_memory", "bytes_spilled", "pinned"} <= set(before)
    refs = [ray.put(_big()), ray.put(b"small")]
    stats = store.statistics()
    assert stats["objects"] == before["objects"] + 2
    assert stats["bytes_in_memory"] >= before["bytes_in_memory"] + 2 * MIB
    assert stats["bytes_spilled"] == 0 and stats["pinned"] == 0
    del refs
