"""Regressions in object lifetime: an object must live exactly as long as something can read it.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np

import miniray


def _shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_an_object_outlives_the_tasks_that_used_it_while_the_driver_holds_its_ref(ray_start):
    # Regression: a task's completion unpinned its argument and freed it while the ref's
    # creation was still queued (its count looked like 0), so the next task found it gone.
    ray_start(num_cpus=1)

    @miniray.remote
    def total(a):
        return float(a.sum())

    arr = np.arange(1_000_000, dtype=np.float64)
    refs = [miniray.put(arr)]
    for _ in range(5):
        assert miniray.get(total.remote(refs[0]), timeout=30) == float(arr.sum())
    assert miniray.get(refs[0], timeout=30)[-1] == arr[-1]


def test_memory_goes_back_after_del_even_when_a_worker_mapped_the_object(ray_start):
    ray_start(num_cpus=2)

    @miniray.remote
    def total(a):
        return float(a.sum())

    arr = np.arange(6_000_000, dtype=np.float64)  # 48 MB
    baseline = _shm_used()
    ref = miniray.put(arr)
    assert miniray.get(total.remote(ref), timeout=30) == float(arr.sum())
    view = miniray.get(ref, timeout=30)
    assert _shm_used() - baseline >= arr.nbytes * 0.9
    del view, ref
    gc.collect()
    deadline = time.monotonic() + 5
    while _shm_used() - baseline > (1 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _shm_used() - baseline <= (1 << 20), "the freed object's memory was not given back"


def test_a_dead_actors_constructor_argument_is_freed_with_its_last_ref(ray_start):
    # Regression: an actor pinned its constructor's argument objects for good, so a large
    # argument outlived both the actor and every ref to it.
    rt = ray_start(num_cpus=1)

    @miniray.remote
    class Holder:
        def __init__(self, weights):
            self.total = float(weights.sum())

        def get(self):
            return self.total

    from miniray._private import runtime

    store = runtime.current().store
    ref = miniray.put(np.ones(500_000))
    holder = Holder.remote(ref)
    assert miniray.get(holder.get.remote(), timeout=30) == 500_000.0
    miniray.kill(holder)
    del ref
    gc.collect()
    deadline = time.monotonic() + 5
    while store.statistics()["objects"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.statistics()["objects"] == 0, rt
