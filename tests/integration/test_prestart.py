"""Workers prestarted by ``init()``: the first task does not wait for the fork server's start.

Ray prestarts a worker per CPU when its node starts; miniray starts ``min(CPUs, 8)`` idle workers
(``MINIRAY_PRESTART_WORKERS``) and ``init()`` returns once the first is forked. Before this, the
first task waited for the fork server (a fresh interpreter importing miniray) and a fork:
50-200 ms on this machine, against a warm round trip of 0.2-0.5 ms.
"""

from __future__ import annotations

import os
import time

import miniray
from miniray._private import runtime
from miniray._private.core import config


def _owner():
    return runtime.current().owner


def test_init_returns_with_idle_workers_forked(ray_start):
    ray_start(num_cpus=3)
    owner = _owner()
    assert owner.worker_forked.is_set()
    with owner.locked():
        idle = list(owner.workers.idle)
    assert len(idle) == 3
    assert all(worker.lease is None and worker.kind is None for worker in idle)


def test_init_returns_once_a_prestarted_worker_is_ready(ray_start):
    """Forked is not enough: a worker just forked still connects, applies HELLO and takes
    its first page faults (2-3 ms here), which the first task paid. init() waits for READY."""
    ray_start(num_cpus=2)
    assert _owner().worker_ready.is_set()


def test_a_worker_that_dies_before_ready_does_not_hold_init(ray_start, monkeypatch):
    """A worker that exits before READY (here: its setup hook fails) releases init() at
    once instead of after ``PRESTART_WAIT_S``."""
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    started = time.monotonic()
    ray_start(num_cpus=1, runtime_env={"worker_process_setup_hook": "no_such_module.hook"})
    assert time.monotonic() - started < 30
    assert _owner().worker_ready.is_set()


def test_the_first_task_runs_on_a_prestarted_worker(ray_start):
    ray_start(num_cpus=2)
    owner = _owner()
    with owner.locked():
        prestarted = {worker.spawn_req for worker in owner.workers.idle}

    @miniray.remote
    def pid():
        return os.getpid()

    first = miniray.get(pid.remote(), timeout=30)
    with owner.locked():
        requests = {w.spawn_req for w in owner.workers.by_pid.values() if w.pid == first}
    assert requests and requests <= prestarted


def test_a_prestarted_worker_may_become_a_gpu_worker(ray_start):
    """An idle worker of no kind yet serves the first lease of any kind (then keeps it)."""
    ray_start(num_cpus=1, num_gpus=1)

    @miniray.remote(num_gpus=1)
    def gpus():
        return miniray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    assert miniray.get(gpus.remote(), timeout=30) == ([0], "0")


def test_prestart_can_be_turned_off(ray_start, monkeypatch):
    monkeypatch.setenv("MINIRAY_PRESTART_WORKERS", "0")
    ray_start(num_cpus=2)
    owner = _owner()
    with owner.locked():
        assert not owner.workers.idle and not owner.workers.live

    @miniray.remote
    def one():
        return 1

    assert miniray.get(one.remote(), timeout=30) == 1


def test_prestart_count(monkeypatch):
    monkeypatch.delenv("MINIRAY_PRESTART_WORKERS", raising=False)
    assert [config.prestart_workers(n) for n in (0, 1, 2, 8, 64)] == [1, 1, 2, 8, 8]
    monkeypatch.setenv("MINIRAY_PRESTART_WORKERS", "3")
    assert config.prestart_workers(64) == 3
    monkeypatch.setenv("MINIRAY_PRESTART_WORKERS", "junk")
    assert config.prestart_workers(2) == 2


def test_the_first_task_takes_one_ledger_transaction(ray_start, monkeypatch):
    """The lease of the first task records its idle worker in the same transaction: the
    submitting thread paid a second one (``set_worker``) before."""
    ray_start(num_cpus=2)
    owner = _owner()
    deadline = time.monotonic() + 10
    while True:  # every prestarted worker named by the fork server
        with owner.locked():
            if owner.workers.idle and all(w.pid for w in owner.workers.idle):
                break
        assert time.monotonic() < deadline, "prestarted workers were never named"
        time.sleep(0.01)
    ledger = owner.ledger
    calls = []
    for name in ("acquire", "set_worker"):
        real = getattr(ledger, name)
        monkeypatch.setattr(ledger, name,
                            lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))

    @miniray.remote
    def pid():
        return os.getpid()

    worker_pid = miniray.get(pid.remote(), timeout=30)
    assert calls == ["acquire"]
    leases = [lease for lease in ledger.snapshot().leases.values()
              if lease.holder_pid == os.getpid()]
    assert all(lease.worker_pid == worker_pid for lease in leases)  # if not yet returned
