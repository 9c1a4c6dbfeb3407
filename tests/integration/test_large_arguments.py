"""Large arguments passed by value travel by reference (compared with Ray 2.60).

As in Ray, an argument of a task, an actor call or an actor constructor whose serialized size
reaches the inline threshold (100 KiB) is put in the shared-memory store once by the caller
and passed as a ref: the task maps it without a copy and gets a read-only array (Ray 2.60:
``flags.writeable`` False for by-value numpy arguments), and the object is freed once the
call no longer needs it (finished, failed, cancelled; a retry reuses it). Keyword arguments
too, and calls submitted from inside a worker.

Segments are ``/dev/shm/mr_<session tag>_<object id hex>``; freed ones may be kept a moment
for reuse as ``mr_<tag>_pool<n>``, which hold no object.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray._private.host import session

from .helpers import wait_until

SHM = "/dev/shm"
MIB = 1 << 20
GET_TIMEOUT = 30


def _object_segments() -> list[str]:
    """The session's segments that hold an object (recycled ``pool`` files excluded)."""
    prefix = f"mr_{runtime.current().store.session_tag}_"
    try:
        names = os.listdir(SHM)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefix) and "_pool" not in n)


def _settle() -> None:
    """Make the owner apply queued ObjectRef drops now (every ``put`` does so first)."""
    miniray.put(None)


def _no_object_segment_left() -> bool:
    gc.collect()
    _settle()
    return wait_until(lambda: not _object_segments(), timeout=30)


def _created() -> int:
    stats = runtime.current().store.statistics()
    return stats["segments_created"] + stats["segments_recycled"]


@pytest.fixture(autouse=True)
def _no_segments_left(session_root):
    """After the test (and after ``ray_start`` shut down): nothing of this root in /dev/shm."""
    prefix = f"mr_{session.root_tag(session_root)}"
    yield
    assert wait_until(lambda: not [n for n in os.listdir(SHM) if n.startswith(prefix)],
                      timeout=30), "shared-memory segments left after shutdown"


def _backing(x) -> str:
    """What the array's memory belongs to: "mmap" for a view of a mapped segment."""
    base = x
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        return type(base.obj).__name__
    return type(base).__name__


def _describe(x) -> tuple:
    return x.flags.writeable, _backing(x), float(x.sum())


def _big(mib: int = 2) -> np.ndarray:
    return np.arange(mib * MIB // 8, dtype=np.float64)


def test_large_positional_and_keyword_arguments_arrive_as_read_only_mapped_views(ray):
    """Ray 2.60 gives a by-value numpy argument above 100 KiB as a read-only array of its
    store; here too it is a view of the segment the caller wrote, never a copy."""
    arr = _big()

    @ray.remote
    def inspect(x, *, y):
        return _describe(x), _describe(y)

    got = ray.get(inspect.remote(arr, y=arr + 1), timeout=GET_TIMEOUT)
    assert got == ((False, "mmap", float(arr.sum())), (False, "mmap", float((arr + 1).sum())))


def test_small_arguments_stay_in_the_call_message(ray):
    @ray.remote
    def inspect(x):
        return _describe(x)

    before = _created()
    small = np.arange(100, dtype=np.float64)
    writeable, backing, total = ray.get(inspect.remote(small), timeout=GET_TIMEOUT)
    assert writeable is False and backing != "mmap" and total == float(small.sum())
    assert _created() == before


def test_argument_is_stored_while_the_task_runs_and_freed_after(ray, tmp_path):
    arr = _big()
    started, gate = tmp_path / "started", tmp_path / "gate"

    # The task runs until the test has looked (a gate, not a 0.5 s sleep: a stall that long
    # let it end and its argument go first).
    @ray.remote
    def slow(x, path, gate):
        open(path, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return float(x.sum())

    out = slow.remote(arr, str(started), str(gate))
    assert wait_until(started.exists, timeout=GET_TIMEOUT)
    assert len(_object_segments()) == 1, "the argument was not passed through the store"
    gate.touch()
    assert ray.get(out, timeout=GET_TIMEOUT) == float(arr.sum())
    del out
    assert _no_object_segment_left(), f"{_object_segments()} outlived the task"


def test_argument_of_a_dropped_result_is_freed_once_the_task_ends(ray):
    @ray.remote
    def slow(x):
        time.sleep(0.3)
        return float(x.sum())

    before = _created()
    out = slow.remote(_big())
    del out
    assert _created() - before == 1  # it went through the store
    assert _no_object_segment_left(), f"{_object_segments()} outlived the task"


def test_argument_is_freed_after_the_task_raises(ray):
    @ray.remote
    def fails(x):
        raise ValueError(f"bad {x.shape}")

    before = _created()
    with pytest.raises(ValueError, match="bad"):
        ray.get(fails.remote(_big()), timeout=GET_TIMEOUT)
    assert _created() - before == 1  # it went through the store
    assert _no_object_segment_left(), f"{_object_segments()} outlived the failed task"


def test_argument_of_a_cancelled_task_is_freed(ray):
    @ray.remote
    def gate():
        time.sleep(30)

    @ray.remote
    def use(_gate, x):
        return float(x.sum())

    blocker = gate.remote()
    out = use.remote(blocker, _big())  # waits for its dependency: never runs
    assert len(_object_segments()) == 1
    ray.cancel(out)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(out, timeout=GET_TIMEOUT)
    ray.cancel(blocker, force=True)
    del out, blocker
    assert _no_object_segment_left(), f"{_object_segments()} outlived the cancelled task"


def test_a_retry_reuses_the_stored_argument(ray, tmp_path):
    marker = tmp_path / "attempted"
    arr = _big()

    @ray.remote(max_retries=1)
    def crash_once(x, path):
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(str(float(x.sum())))
            os._exit(1)
        return _describe(x)

    before = _created()
    got = ray.get(crash_once.remote(arr, str(marker)), timeout=GET_TIMEOUT)
    assert marker.read_text() == str(float(arr.sum()))  # the first attempt read it too
    assert got == (False, "mmap", float(arr.sum()))
    assert _created() - before == 1, "the argument was stored again for the retry"
    assert _no_object_segment_left(), f"{_object_segments()} outlived the retried task"


def test_actor_constructor_and_call_arguments_go_through_the_store(ray):
    @ray.remote
    class Holder:
        def __init__(self, x):
            self.x = x

        def inspect(self, y):
            return _describe(self.x), _describe(y)

    arr = _big()
    holder = Holder.remote(arr)
    got = ray.get(holder.inspect.remote(arr * 2), timeout=GET_TIMEOUT)
    assert got == ((False, "mmap", float(arr.sum())), (False, "mmap", float(arr.sum() * 2)))
    _settle()
    # The call's argument is freed; the constructor's lives as long as the actor.
    assert wait_until(lambda: len(_object_segments()) == 1, timeout=30), _object_segments()
    ray.kill(holder)
    del holder
    assert _no_object_segment_left(), f"{_object_segments()} outlived the actor"


def test_calls_submitted_from_a_worker_pass_large_arguments_by_reference(ray):
    @ray.remote
    def child(x):
        return _describe(x)

    @ray.remote
    def parent(n):
        return ray.get(child.remote(np.arange(n, dtype=np.float64)), timeout=GET_TIMEOUT)

    n = MIB // 8
    assert ray.get(parent.remote(n), timeout=GET_TIMEOUT) == (
        False, "mmap", float(np.arange(n, dtype=np.float64).sum()))
    assert _no_object_segment_left(), f"{_object_segments()} outlived the nested call"


def test_a_large_argument_containing_a_ref_keeps_that_object_alive(ray):
    inner = ray.put(_big(1))

    @ray.remote
    def read(pair):
        ref, arr = pair
        return float(ray.get(ref).sum()) + float(arr.sum())

    before = _created()
    out = read.remote([inner, _big()])
    assert _created() - before == 1  # the list went through the store
    expected = float(_big(1).sum()) + float(_big().sum())
    del inner
    gc.collect()
    assert ray.get(out, timeout=GET_TIMEOUT) == expected
    del out
    assert _no_object_segment_left(), f"{_object_segments()} outlived the call"


def test_a_loop_of_calls_with_a_large_argument_reuses_the_argument_segment(ray):
    """The worker that read the argument lets go of its mapping once the owner's UNMAP
    reaches it; the next call's argument is then written into that segment's pages (memcpy
    speed) instead of a new segment's (page faults)."""
    arr = _big(8)

    @ray.remote
    def total(x):
        return float(x.sum())

    before = runtime.current().store.statistics()
    for _ in range(6):
        assert ray.get(total.remote(arr), timeout=GET_TIMEOUT) == float(arr.sum())
    after = runtime.current().store.statistics()
    assert after["segments_recycled"] - before["segments_recycled"] >= 3, after
    assert _no_object_segment_left(), f"{_object_segments()} outlived the calls"
