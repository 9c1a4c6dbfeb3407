"""``miniray.util.multiprocessing.Pool``: the ``multiprocessing.Pool`` API on actors.

Each behaviour was compared side by side with Ray 2.60's ``ray.util.multiprocessing.Pool``
(same calls run in Ray's virtualenv with ``num_cpus=2``); where miniray differs on purpose the
test says so.
"""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from miniray.util.multiprocessing import Pool, TimeoutError


def square(x):
    return x * x


def fail_on_three(x):
    if x == 3:
        raise KeyError("three")
    return x


def worker_pid(_):
    return os.getpid()


def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


def after_gate(item):
    """``value`` of ``(gate, value)`` once the file ``gate`` exists (at most 60 s): pending for
    as long as a test needs."""
    gate, value = item
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def set_marker(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def wait_gone(pids, timeout=20.0):
    """Whether every pid has exited within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


# ----------------------------------------------------------------------------- with processes
def test_map_family_and_default_processes(ray):
    """``processes`` defaults to the cluster's CPUs (2 here, as in Ray); map, starmap, imap,
    imap_unordered, apply and their async forms give Ray 2.60's values."""
    with Pool() as pool:
        assert len(pool._actors) == 2
        assert pool.map(square, range(10)) == [x * x for x in range(10)]
        assert pool.map(square, range(7), chunksize=3) == [x * x for x in range(7)]
        assert pool.map(square, []) == []
        assert pool.map(square, (x for x in range(3))) == [0, 1, 4]
        assert pool.starmap(pow, [(2, 3), (3, 2)]) == [8, 9]
        assert pool.starmap_async(pow, [(2, 3)]).get(timeout=30) == [8]
        assert list(pool.imap(square, range(6), chunksize=2)) == [0, 1, 4, 9, 16, 25]
        assert sorted(pool.imap_unordered(square, iter(range(6)))) == [0, 1, 4, 9, 16, 25]
        assert pool.apply(divmod, (7, 2)) == (3, 1)
        assert pool.apply(sleep_for, kwargs={"seconds": 0}) == 0
        result = pool.map_async(square, range(4))
        assert result.get(timeout=30) == [0, 1, 4, 9]
        assert result.ready() and result.successful()


def test_errors_are_the_functions_own(ray, tmp_path):
    """A function's exception is re-raised as itself by ``map``/``get``/``apply`` (Ray 2.60
    gives ``KeyError``, not ``RayTaskError``); ``successful()`` is False once ready and raises
    ``ValueError`` before. Differs: ``imap`` raises it too (Ray 2.60 yields its internal
    wrapper object) and ``error_callback`` gets the exception itself (Ray passes the wrapper)."""
    with Pool(2) as pool:
        with pytest.raises(KeyError, match="three"):
            pool.map(fail_on_three, range(6))
        with pytest.raises(KeyError):
            pool.apply(fail_on_three, (3,))
        errors = []
        result = pool.map_async(fail_on_three, range(6), error_callback=errors.append)
        result.wait(30)
        assert result.ready() and not result.successful()
        with pytest.raises(KeyError):
            result.get()
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(errors) == 1 and isinstance(errors[0], KeyError)
        seen = []
        with pytest.raises(KeyError):
            for value in pool.imap(fail_on_three, range(6)):
                seen.append(value)
        assert seen == [0, 1, 2]
        gate = str(tmp_path / "gate")  # not a 1.5 s sleep: a stall that long let it finish
        slow = pool.apply_async(after_gate, ((gate, None),))
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        open(gate, "w").close()


def test_timeouts_and_callbacks(ray, tmp_path):
    """``get(timeout)`` and ``imap(...).next(timeout)`` raise ``multiprocessing.TimeoutError``
    as Ray 2.60 does (miniray's is also the built-in ``TimeoutError``); ``callback`` gets the
    values once, in order (Ray 2.60 passes them in completion order)."""
    # The pending calls wait for a gate the test opens after its timeouts, not for 2 s and
    # 1 s: a stall of that long (a loaded runner) let them finish before the timeouts.
    gate, second_gate = str(tmp_path / "gate"), str(tmp_path / "second_gate")
    with Pool(2) as pool:
        result = pool.apply_async(after_gate, ((gate, 2),))
        with pytest.raises(multiprocessing.TimeoutError):
            result.get(timeout=0.1)
        with pytest.raises(TimeoutError):
            result.get(timeout=0.1)
        assert not result.ready()
        open(gate, "w").close()
        assert result.get(timeout=30) == 2
        iterator = pool.imap(after_gate, [(second_gate, 1.0), (gate, 0)])
        with pytest.raises(multiprocessing.TimeoutError):
            iterator.next(timeout=0.05)
        open(second_gate, "w").close()
        assert iterator.next(timeout=30) == 1.0
        got = []
        pool.map_async(square, range(4), chunksize=1, callback=got.append).get(timeout=30)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [[0, 1, 4, 9]]


def test_initializer_and_maxtasksperchild(ray, tmp_path):
    """The initializer runs once in each actor with ``initargs``; ``maxtasksperchild=1``
    gives each batch a fresh process (Ray 2.60: 6 batches, 6 pids)."""
    marker = tmp_path / "inits"
    with Pool(2, initializer=set_marker, initargs=(str(marker),)) as pool:
        pids = set(pool.map(worker_pid, range(8), chunksize=1))
    assert sorted(marker.read_text().split()) == sorted(str(p) for p in pids)
    with Pool(2, maxtasksperchild=1) as pool:
        assert len(set(pool.map(worker_pid, range(6), chunksize=1))) == 6
    with pytest.raises(ValueError, match="maxtasksperchild must be a positive int"):
        Pool(2, maxtasksperchild=0)


def test_lifetime_closed_pool_and_no_leaked_process(ray):
    """``close`` refuses new work with Ray's "Pool not running", ``join`` on an open pool raises
    "Pool is still running"; ``close``+``join``, ``terminate`` and leaving ``with`` all end the
    pool's processes; too many processes is Ray's ValueError."""
    pool = Pool(2)
    with pytest.raises(ValueError, match="Pool is still running"):
        pool.join()
    pending = pool.map_async(sleep_for, [0.5, 0.5], chunksize=1)
    pids = set(pool.map(worker_pid, range(4), chunksize=1))
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])
    with pytest.raises(ValueError, match="Pool not running"):
        pool.imap(square, [1])
    pool.join(timeout=30)
    assert pending.get(timeout=30) == [0.5, 0.5]  # queued work finished before the exit
    assert wait_gone(pids)

    pool = Pool(2)
    pids = set(pool.map(worker_pid, range(4), chunksize=1))
    pool.apply_async(sleep_for, (60,))
    pool.terminate()
    assert wait_gone(pids)

    with Pool(1) as pool:
        pids = set(pool.map(worker_pid, range(2)))
    assert wait_gone(pids)

    with pytest.raises(ValueError, match="only 2 CPUs"):
        Pool(3)


ALIAS_DRIVER = """
from miniray._private.core import alias
alias.install()
import ray
from ray.util.multiprocessing import Pool

def cube(x):
    return x ** 3

with Pool(processes=2) as pool:
    print("CPUS", int(ray.cluster_resources()["CPU"]))
    print("VALUES", pool.map(cube, range(5)))
ray.shutdown()
"""


def test_alias_import_and_pool_starts_the_runtime(drivers):
    """``from ray.util.multiprocessing import Pool`` works under the ``import ray`` alias, and a
    pool made before ``init`` starts the runtime with ``num_cpus=processes`` (Ray 2.60 does the
    same when no cluster is running)."""
    result = drivers.run(ALIAS_DRIVER, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "CPUS 2" in result.stdout.splitlines()
    assert "VALUES [0, 1, 8, 27, 64]" in result.stdout.splitlines()


def test_threads_share_a_pool(ray):
    """Calls from several threads on one pool all complete with their own values, and with
    ``maxtasksperchild`` every batch still runs (stdlib's pool is shared by threads the same way;
    Ray 2.60 gives the same values)."""
    import threading

    results = {}
    with Pool(2, maxtasksperchild=2) as pool:
        def submit(start):
            results[start] = [pool.apply_async(square, (start + i,)) for i in range(10)]

        threads = [threading.Thread(target=submit, args=(start,)) for start in (0, 100, 200)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        for start, pending in results.items():
            assert [r.get(timeout=30) for r in pending] == [
                (start + i) ** 2 for i in range(10)]
