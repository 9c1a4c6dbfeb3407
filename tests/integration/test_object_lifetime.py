"""Regressions in object lifetime: an object must live exactly as long as something can read it.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np

import miniray
from miniray._private import runtime

from .helpers import wait_until


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


def _mapped_by(path: str, pids) -> list[int]:
    """The processes among ``pids`` that still map ``path`` (deleted or not)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if path in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_memory_goes_back_after_del_even_when_a_worker_mapped_the_object(ray_start):
    # Per segment, not by /dev/shm usage: other sessions on the host (a parallel tox run)
    # change the totals. The memory is back once no file and no mapping of it is left.
    ray_start(num_cpus=2)
    from miniray._private import runtime

    rt = runtime.current()

    @miniray.remote
    def total(a):
        return (float(a.sum()), os.getpid())

    arr = np.arange(6_000_000, dtype=np.float64)  # 48 MB
    ref = miniray.put(arr)
    where, path, size = rt.store.location(ref._id)
    assert where == "shm" and size >= arr.nbytes
    value, worker = miniray.get(total.remote(ref), timeout=30)
    assert value == float(arr.sum())
    view = miniray.get(ref, timeout=30)
    assert _mapped_by(path, [os.getpid(), worker]) == [os.getpid(), worker]
    del view, ref
    gc.collect()
    deadline = time.monotonic() + 30
    while (os.path.exists(path) or _mapped_by(path, [os.getpid(), worker])) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path), "the freed object's segment is still there"
    assert not _mapped_by(path, [os.getpid(), worker]), "a freed segment is still mapped"

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
    deadline = time.monotonic() + 30
    while store.statistics()["objects"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.statistics()["objects"] == 0, rt


def test_a_filling_store_runs_gc_in_the_workers_and_frees_what_only_cycles_held(ray_start):
    """Ray's global GC (its test_auto_global_gc, run under Ray 2.60 with the same numbers):
    an actor that disabled ``gc`` keeps refs in reference cycles; at 60 MB of a 100 MB store
    nothing is collected, past 70 % its worker collects, and the objects are freed."""
    ray_start(num_cpus=1, object_store_memory=100 * 1024 * 1024)
    store = runtime.current().owner.store

    @miniray.remote
    class Cycles:
        def __init__(self):
            import gc as worker_gc

            worker_gc.disable()
            self.collected = False
            worker_gc.callbacks.append(lambda phase, info: setattr(self, "collected", True))

        def cycle(self):
            a, b = [], []
            a.append(b)
            b.append(a)
            a.append(miniray.put(b"0" * (10 << 20)))
            b.append(miniray.put(b"1" * (10 << 20)))
            return a

        def collected(self):
            return self.collected

    actor = Cycles.remote()
    for _ in range(3):  # 60 MB
        miniray.get(actor.cycle.remote(), timeout=30)
    time.sleep(1.5)
    assert not miniray.get(actor.collected.remote(), timeout=30)
    miniray.get(actor.cycle.remote(), timeout=30)  # 80 MB
    assert wait_until(lambda: miniray.get(actor.collected.remote(), timeout=30), 10)
    assert wait_until(lambda: store.usage()[0] < 10 << 20, 10), store.usage()
