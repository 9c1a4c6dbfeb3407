"""The dispatch's "nothing changed" marks (``Owner._dispatch``, ``LeaseBook.stuck``).

When the owner finds no room for a key's queued tasks (no idle lease, every pipeline full
or blocked, the retry window saying no), it marks the key and skips the search until an
event that may make room drops the mark. The retry timer (``LeaseBook.RETRY_S``) also drops
every mark, so a missed event would only cost its period: these tests set it to a minute, so
a missed wake-up shows as a task that does not move within the tests' bounds.
"""

from __future__ import annotations

import time

import pytest

import miniray
from miniray._private import runtime
from miniray._private.core.scheduling import T_RUNNING
from miniray._private.owner.leases import LeaseBook
from miniray._private.owner.store_gc import StoreGc
from miniray._private.owner.waiting import WaitWatch

from .helpers import wait_until
from .test_pipelining import _open, _wait_for  # the tasks' file gates


def _owner():
    return runtime.current().owner


def _record(ref):
    """``(state, worker)`` of the owner's record of ``ref``'s task (None once done)."""
    owner = _owner()
    with owner.locked():
        task = owner.tasks.by_id.get(ref.binary()[:24])
        return None if task is None else (task.state, task.worker)


def _stuck_keys() -> list:
    owner = _owner()
    with owner.locked():
        return list(owner.leases.stuck)


@pytest.fixture
def no_retry_timer(monkeypatch):
    """The retry timer fires only after a minute: only the events move queued work."""
    monkeypatch.setattr(LeaseBook, "RETRY_S", 60.0)


@miniray.remote(num_cpus=0)
class Gatekeeper:
    """Its calls end without any task's result (an actor's result dispatches nothing)."""

    def ping(self) -> bool:
        return True

    def wait_for(self, gate: str) -> bool:
        return _wait_for(gate)


@miniray.remote(max_retries=0)
def parent(keeper, started: str, inner_gate: str, gate: str) -> str:
    """Blocks in ``get()`` until ``inner_gate`` opens, then waits (unblocked) for ``gate``."""
    _open(started)
    if not miniray.get(keeper.wait_for.remote(inner_gate)):
        raise TimeoutError(inner_gate)
    if not _wait_for(gate):
        raise TimeoutError(gate)
    return "parent"


@miniray.remote(max_retries=0, max_calls=1000)  # another key: it holds the other CPU
def holder(started: str, gate: str) -> str:
    _open(started)
    if not _wait_for(gate):
        raise TimeoutError(gate)
    return "holder"


@miniray.remote(max_retries=0)
def quick(value):
    return value


def test_a_worker_unblocked_takes_the_queued_task_of_its_key(ray_start, tmp_path,
                                                             no_retry_timer):
    """P blocks in get() on an actor call (its CPU goes back), a task of another key takes
    that CPU, and Q, of P's key, finds no room: the key is marked. When P's get() returns
    (an actor's result: no task's result dispatches anything), Q is queued behind P at once
    (the unblock drops the mark and dispatches), not after the timer."""
    ray_start(num_cpus=1)
    keeper = Gatekeeper.remote()
    assert miniray.get(keeper.ping.remote(), timeout=30)
    p_started, inner, p_gate = (str(tmp_path / n) for n in ("p-started", "inner", "p-gate"))
    h_started, h_gate = str(tmp_path / "h-started"), str(tmp_path / "h-gate")
    p = parent.remote(keeper, p_started, inner, p_gate)
    assert _wait_for(p_started)
    assert wait_until(lambda: _record(p)[1].blocked, 20), "P did not block in get()"
    h = holder.remote(h_started, h_gate)
    assert _wait_for(h_started), "the holder did not get P's CPU"
    q = quick.remote("Q")
    assert wait_until(lambda: _stuck_keys(), 20), "Q's key was not marked stuck"
    assert _record(q)[0] != T_RUNNING
    _open(inner)
    assert wait_until(lambda: _record(q)[0] == T_RUNNING and _record(q)[1] is _record(p)[1],
                      10), "Q was not sent behind P when P's get() returned"
    _open(p_gate)
    assert miniray.get([p, q], timeout=30) == ["parent", "Q"]
    _open(h_gate)
    assert miniray.get(h, timeout=30) == "holder"


def _count_acquires(monkeypatch) -> list:
    """Counts the owner's lease requests to the ledger from now on."""
    leases = _owner().leases
    calls = []
    acquire = leases.acquire

    def counted(*args, **kwargs):
        calls.append(1)
        return acquire(*args, **kwargs)

    monkeypatch.setattr(leases, "acquire", counted)
    return calls


def test_a_burst_after_a_drained_one_runs_without_the_timer(ray_start, no_retry_timer,
                                                            monkeypatch):
    """A burst marks its key and drains; the results that found the queue empty must drop
    the mark, since their workers have room. Kept, it left the next burst (submitted after
    the first was read) to the retry timer, a minute here, with both workers idle on leases
    kept a minute too, so no release moved the window either: it timed out."""
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")
    ray_start(num_cpus=2)
    for _burst in range(10):  # whether a drain keeps the mark depends on the order of events
        refs = [quick.remote(i) for i in range(300)]
        assert miniray.get(refs, timeout=30) == list(range(300))


@pytest.mark.parametrize("depth", ["8", "1"])
def test_results_move_a_marked_queue_without_the_timer(ray_start, no_retry_timer,
                                                       monkeypatch, depth):
    """Thousands of tasks on two workers: the key is marked on almost every submission,
    and every result must still hand its worker the next task (a pipelined worker through
    the result's fast path, an idle one through the full dispatch). A result that left the
    mark in place would leave the worker to drain, give its lease back and take a new one
    (the same tasks would finish, with a lease request per drain)."""
    monkeypatch.setenv("MINIRAY_PIPELINE_DEPTH", depth)
    ray_start(num_cpus=2)
    miniray.get([quick.remote(i) for i in range(4)])
    time.sleep(0.1)  # the warm-up's leases went back (5 ms linger): the burst takes its own
    calls = _count_acquires(monkeypatch)
    count = 3000 if depth != "1" else 600
    refs = [quick.remote(i) for i in range(count)]
    assert miniray.get(refs, timeout=60) == list(range(count))
    assert not _owner().tasks.queues
    assert len(calls) <= 10, f"{len(calls)} lease requests for one burst"


def test_nested_tasks_with_blocking_parents_finish_without_the_timer(ray_start,
                                                                     no_retry_timer):
    """Parents block in get() on children of their own key (give-backs, blocks, unblocks,
    new leases): every step must be moved by its event."""
    ray_start(num_cpus=2)

    @miniray.remote
    def child(i):
        return i

    @miniray.remote
    def outer(n):
        return sum(miniray.get([child.remote(i) for i in range(n)]))

    refs = [outer.remote(20) for _ in range(6)]
    assert miniray.get(refs, timeout=60) == [sum(range(20))] * 6


def _entry_gone(object_id: bytes) -> bool:
    owner = _owner()
    with owner.locked():
        return object_id not in owner.objects.entries


def test_a_dropped_ref_is_freed_without_a_wake_up_while_the_io_thread_naps(ray_start,
                                                                           monkeypatch):
    """Right after a result the lease lingers (5 ms), so the I/O thread sleeps at most that
    long: a ref dropped then is applied when it wakes, without a wake-up of its own. Once
    nothing lingers it sleeps until its next timer, and a drop wakes it: the object is freed
    either way. The periodic timers (the wait watch's and the store's garbage check, each
    every second) are set to two minutes here, so the last free can come only from the
    drop's wake-up, however slowly a loaded runner lets the I/O thread run."""
    monkeypatch.setattr(WaitWatch, "EVERY_S", 120.0)
    monkeypatch.setattr(StoreGc, "EVERY_S", 120.0)
    ray_start(num_cpus=2)
    owner = _owner()
    wakes = []
    wake = owner.reactor.wake
    monkeypatch.setattr(owner.reactor, "wake", lambda: (wakes.append(1), wake()))
    freed_while_napping = 0
    for _ in range(20):
        ref = quick.remote(1)
        assert miniray.get(ref) == 1
        object_id = ref.binary()
        before = len(wakes)
        del ref
        assert wait_until(lambda oid=object_id: _entry_gone(oid), 30), \
            "not freed after a result"
        freed_while_napping += len(wakes) == before
    assert freed_while_napping >= 10, f"{freed_while_napping} of 20 drops needed no wake-up"
    ref = quick.remote(2)
    assert miniray.get(ref) == 2
    object_id = ref.binary()
    assert wait_until(lambda: not owner.leases.any_idle(), 30)  # no lease lingers now
    time.sleep(0.05)  # the I/O thread asleep without a timeout
    before = len(wakes)
    del ref
    assert len(wakes) > before, "a drop did not wake the sleeping I/O thread"
    assert wait_until(lambda: _entry_gone(object_id), 30), "a drop was not applied"
