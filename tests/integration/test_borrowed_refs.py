"""Refs that travel inside other values: the object lives exactly as long as a holder exists.

A ref nested in a task's arguments, kept by the worker (a global, actor state), returned by a
task or stored inside another object must keep its object alive after the driver dropped its
own ref; once every holder is gone, the object is freed.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np

import miniray

SHM = "/dev/shm"


def _segment(ref) -> str:
    store = miniray._private.runtime.current().store
    return os.path.join(SHM, f"mr_{store.session_tag}_{ref.hex()}")


def _gone(path: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        miniray.put(None)  # applies queued drops now
        if not os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def test_a_worker_that_keeps_a_nested_ref_keeps_the_object(ray_start):
    ray_start(num_cpus=1)

    # Functions travel by value (each with its own globals, as in Ray): keep the ref where
    # every task of the worker sees it.
    @miniray.remote(max_calls=0)
    def keep(holder):
        import sys

        sys.kept_ref = holder[0]
        return os.getpid()

    @miniray.remote(max_calls=0)
    def use():
        import sys

        return os.getpid(), float(miniray.get(sys.kept_ref).sum())

    @miniray.remote(max_calls=0)
    def forget():
        import sys

        del sys.kept_ref
        return True

    arr = np.ones(200_000)
    ref = miniray.put(arr)
    path = _segment(ref)
    pid = miniray.get(keep.remote([ref]), timeout=30)
    del ref
    gc.collect()
    miniray.put(None)
    time.sleep(0.3)
    assert os.path.exists(path), "freed while a worker still held a ref to it"
    assert miniray.get(use.remote(), timeout=30) == (pid, 200_000.0)
    assert miniray.get(forget.remote(), timeout=30)
    assert _gone(path), "not freed once the last holder (the worker) let go"


def test_an_actor_that_keeps_a_ref_in_its_state(ray_start):
    ray_start(num_cpus=1)

    @miniray.remote
    class Keeper:
        def __init__(self):
            self.refs = []

        def keep(self, holder):
            self.refs.append(holder[0])

        def total(self):
            return float(miniray.get(self.refs[0]).sum())

    keeper = Keeper.remote()
    ref = miniray.put(np.ones(150_000))
    path = _segment(ref)
    miniray.get(keeper.keep.remote([ref]), timeout=30)
    del ref
    assert not _gone(path, timeout=0.5)
    assert miniray.get(keeper.total.remote(), timeout=30) == 150_000.0
    miniray.kill(keeper)
    assert _gone(path), "not freed after the actor holding the ref died"


def test_refs_returned_inside_results_and_puts_from_workers_stay_usable(ray_start):
    ray_start(num_cpus=2)

    @miniray.remote
    def make():
        inner = miniray.put(np.arange(100_000.0))
        return [inner]

    @miniray.remote
    def echo(holder):
        return holder  # the ref it received, nested, straight back

    holder = miniray.get(make.remote(), timeout=30)
    assert float(miniray.get(holder[0], timeout=30).sum()) == float(np.arange(100_000.0).sum())
    ref = miniray.put(np.ones(130_000))
    back = miniray.get(echo.remote([ref]), timeout=30)
    del ref
    gc.collect()
    assert float(miniray.get(back[0], timeout=30).sum()) == 130_000.0


def test_an_object_inside_a_stored_object_is_freed_with_it(ray_start):
    ray_start(num_cpus=1)
    inner = miniray.put(np.ones(120_000))
    path = _segment(inner)
    outer = miniray.put({"inner": inner})
    del inner
    assert not _gone(path, timeout=0.5), "freed while the outer object still held it"
    got = miniray.get(outer, timeout=30)["inner"]
    assert float(miniray.get(got, timeout=30).sum()) == 120_000.0
    del got, outer
    assert _gone(path), "not freed with the object that contained it"


def test_a_borrowing_worker_that_dies_releases_its_borrow(ray_start):
    ray_start(num_cpus=1)

    @miniray.remote(max_calls=0, max_retries=0)
    def keep(holder):
        import sys

        sys.kept_ref = holder[0]

    @miniray.remote(max_calls=0, max_retries=0)
    def die():
        os._exit(1)

    ref = miniray.put(np.ones(110_000))
    path = _segment(ref)
    miniray.get(keep.remote([ref]), timeout=30)
    del ref
    assert not _gone(path, timeout=0.5)
    try:
        miniray.get(die.remote(), timeout=30)
    except miniray.exceptions.WorkerCrashedError:
        pass
    assert _gone(path), "not freed after the borrowing worker died"


def test_an_object_a_worker_returned_inside_a_result_is_freed_with_it(ray_start):
    ray_start(num_cpus=1)

    @miniray.remote
    def make():
        return {"inner": miniray.put(np.ones(140_000))}

    outer = make.remote()
    inner = miniray.get(outer, timeout=30)["inner"]
    path = _segment(inner)
    assert float(miniray.get(inner, timeout=30).sum()) == 140_000.0
    del inner
    assert not _gone(path, timeout=0.5), "freed while the result holding it still existed"
    del outer
    assert _gone(path), "not freed with the result that contained it"
