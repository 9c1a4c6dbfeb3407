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
from miniray._private.core.resources import UNIT


def _owner():
    return runtime.current().owner


def _prestarted(owner) -> list:
    """*Locked.* The prestarted workers: the idle ones and the one given the first lease."""
    return list(owner.workers.idle) + [slot.worker for slot in owner.leases.slots()]


def test_init_returns_with_idle_workers_forked(ray_start):
    ray_start(num_cpus=3)
    owner = _owner()
    assert owner.worker_forked.is_set()
    with owner.locked():
        idle = list(owner.workers.idle)
        leased = [slot.worker for slot in owner.leases.slots()]
    assert len(idle) + len(leased) == 3 and len(leased) <= 1
    assert all(worker.lease is None and worker.kind is None for worker in idle)


def test_init_returns_once_a_prestarted_worker_is_ready(ray_start):
    """Forked is not enough: a worker just forked still connects, applies HELLO and takes
    its first page faults (2-3 ms here), which the first task paid. init() waits for READY."""
    ray_start(num_cpus=2)
    assert _owner().worker_ready.is_set()


def test_init_waits_briefly_for_the_other_prestarted_workers(ray_start, monkeypatch):
    """On a small machine the others are a few ms behind the first: init() waits for them
    (at most ``PRESTART_REST_S``, here made long so a loaded machine cannot fail it), so
    the first task does not share the CPU with their start-up."""
    monkeypatch.setattr(runtime, "PRESTART_REST_S", 30.0)
    ray_start(num_cpus=3)
    owner = _owner()
    assert owner.workers_ready.is_set()
    with owner.locked():
        workers = _prestarted(owner)
        assert len(workers) == 3 and all(w.ready for w in workers)
        assert not owner._unready


def test_a_worker_that_dies_before_ready_does_not_hold_init(ray_start, monkeypatch):
    """A worker that exits before READY (here: its setup hook fails) releases init() at
    once instead of after ``PRESTART_WAIT_S``."""
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    started = time.monotonic()
    monkeypatch.setattr(runtime, "PRESTART_REST_S", 60.0)
    ray_start(num_cpus=2, runtime_env={"worker_process_setup_hook": "no_such_module.hook"})
    assert time.monotonic() - started < 30
    assert _owner().worker_ready.is_set() and _owner().workers_ready.is_set()


def test_the_first_task_runs_on_a_prestarted_worker(ray_start):
    ray_start(num_cpus=2)
    owner = _owner()
    with owner.locked():
        prestarted = {worker.spawn_req for worker in _prestarted(owner)}

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


def _watch_ledger(owner, monkeypatch) -> list:
    """Once every prestarted worker is named: the names of the ledger's transactions from
    now on, in order."""
    deadline = time.monotonic() + 10
    while True:  # every prestarted worker named by the fork server
        with owner.locked():
            workers = _prestarted(owner)
            if workers and all(w.pid for w in workers):
                break
        assert time.monotonic() < deadline, "prestarted workers were never named"
        time.sleep(0.01)
    ledger = owner.ledger
    calls: list = []
    for name in ("acquire", "set_worker", "release"):
        real = getattr(ledger, name)
        monkeypatch.setattr(ledger, name,
                            lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))
    return calls


def _my_leases(ledger) -> list:
    return [lease for lease in ledger.snapshot().leases.values()
            if lease.holder_pid == os.getpid()]


def test_init_takes_the_first_tasks_lease_for_a_ready_worker(ray_start, monkeypatch):
    """The lease of the default shape (one CPU) is taken at init for a worker that is
    ready, so the first task of that shape takes no ledger transaction at all (it took one,
    0.3-0.8 ms, the session's first, on its path before)."""
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")  # kept, however slow the machine
    ray_start(num_cpus=2)
    owner = _owner()
    with owner.locked():
        slots = owner.leases.slots()
        assert len(slots) == 1
        slot = slots[0]
        assert slot.worker.ready and slot.worker.lease is slot
        assert slot.idle_since is not None and not slot.worker.inflight
        lease_worker = slot.worker.pid
    [lease] = _my_leases(owner.ledger)
    assert lease.resources == {"CPU": UNIT} and lease.worker_pid == lease_worker
    calls = _watch_ledger(owner, monkeypatch)

    @miniray.remote
    def pid():
        return os.getpid()

    assert miniray.get(pid.remote(), timeout=30) == lease_worker
    assert calls == []


def test_the_init_lease_goes_back_after_the_keep(ray_start, monkeypatch):
    """No task came: the lease taken at init is an idle lease like any other, given back
    after ``MINIRAY_LEASE_KEEP_MS``; its worker is idle again, of no kind yet."""
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "50")
    ray_start(num_cpus=2)
    owner = _owner()
    deadline = time.monotonic() + 10
    while _my_leases(owner.ledger):
        assert time.monotonic() < deadline, "the init lease was never given back"
        time.sleep(0.02)
    with owner.locked():
        assert not owner.leases
        assert len(owner.workers.idle) == 2
        assert all(w.lease is None and w.kind is None for w in owner.workers.idle)


def test_the_init_lease_never_shows_in_available_resources(ray_start, monkeypatch):
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")
    ray_start(num_cpus=2)
    assert miniray.available_resources().get("CPU") == 2.0
    assert miniray.cluster_resources().get("CPU") == 2.0


def test_the_init_lease_gives_way_to_other_shapes_and_groups(ray_start, monkeypatch):
    """A task that needs every CPU, and a placement group of every CPU, get them at once
    (the init lease is released to make room), not after the keep."""
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")
    ray_start(num_cpus=2)

    @miniray.remote(num_cpus=2)
    def both():
        return "ran"

    started = time.monotonic()
    assert miniray.get(both.remote(), timeout=30) == "ran"
    assert time.monotonic() - started < 20
    miniray.shutdown()

    ray_start(num_cpus=2)
    from miniray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}, {"CPU": 1}])
    assert group.wait(20)
    remove_placement_group(group)


def test_no_init_lease_without_a_free_cpu(ray_start):
    """``num_cpus=0``: the default shape never fits; init takes nothing and says nothing."""
    ray_start(num_cpus=0)
    owner = _owner()
    with owner.locked():
        assert not owner.leases
    assert not _my_leases(owner.ledger)
    assert not os.path.exists(owner.ledger._wants_path)


def test_a_lease_of_another_shape_records_its_idle_worker(ray_start, monkeypatch):
    """The lease of a task of another shape than the one taken at init records its idle
    worker in the same transaction: the submitting thread paid a second one
    (``set_worker``) before."""
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")
    ray_start(num_cpus=2)
    owner = _owner()
    calls = _watch_ledger(owner, monkeypatch)

    @miniray.remote(num_cpus=0.5)
    def pid():
        return os.getpid()

    worker_pid = miniray.get(pid.remote(), timeout=30)
    assert calls == ["acquire"]
    leases = [lease for lease in _my_leases(owner.ledger)
              if lease.resources == {"CPU": UNIT // 2}]
    assert all(lease.worker_pid == worker_pid for lease in leases)  # if not yet returned
