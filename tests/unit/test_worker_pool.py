"""The owner's worker pool (``owner/workers.py``) picking idle workers, without any process."""

from __future__ import annotations

from types import SimpleNamespace

from miniray._private.owner.workers import WorkerPool


def _pool(max_workers: int = 8) -> WorkerPool:
    return WorkerPool(reactor=None, log_to_driver=False, prefix_enabled=False,
                      max_workers=max_workers, idle_keep=4, on_data=None, on_output=None)


def _worker(kind: bool) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, runtime_env="")


def test_a_lease_gets_only_an_idle_worker_of_its_kind():
    pool = _pool()
    cpu, gpu = _worker(False), _worker(True)
    pool.idle = [gpu, cpu]
    assert pool.take_idle({"CPU": 1, "GPU": 1}) is gpu
    assert pool.take_idle({"CPU": 1, "GPU": 1}) is None  # the CPU worker is not used
    assert pool.idle == [cpu]
    assert pool.take_idle({"CPU": 1}) is cpu and pool.idle == []


def test_room_counts_idle_workers_of_the_request_kind_only():
    pool = _pool(max_workers=2)
    pool.live = 2  # both idle, both count against the cap
    pool.idle = [_worker(False), _worker(False)]
    assert pool.room(0, {"CPU": 1}) == 2
    assert pool.room(0, {"GPU": 1}) == 0  # a GPU task needs a new worker: none under the cap
    assert pool.room(0) == 2
