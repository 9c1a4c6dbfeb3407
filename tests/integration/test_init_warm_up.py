"""init()'s warm-up round trip: a no-op through the first lease's worker, never a task.

``Runtime._prestart_workers`` sends it ``WARM_UP_ROUNDS`` times once the first lease is taken
(``OwnerEvents.warm_up_round_trip``): FUNC and TASK written as for any task, the worker runs
it and answers RESULT, the driver's init() reads that itself. Nothing of it may show: no state
API row or count, no timeline event, no object, no lease beyond the prestart's, no output
marker, and init() waits for it at most ``WARM_UP_WAIT_S``.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
import time

import miniray
from miniray._private import runtime
from miniray._private.owner import owner as owner_mod
from miniray._private.owner import owner_events
from miniray.util import state

from .helpers import wait_until


def _record_trips(monkeypatch) -> list:
    """Each warm-up round trip's (answered in time, seconds it took)."""
    trips: list = []
    original = owner_events.OwnerEvents.warm_up_round_trip

    def timed(self, spec, fn_bytes, timeout):
        start = time.monotonic()
        answered = original(self, spec, fn_bytes, timeout)
        trips.append((answered, time.monotonic() - start))
        return answered

    monkeypatch.setattr(owner_events.OwnerEvents, "warm_up_round_trip", timed)
    return trips


def _late_spawned(monkeypatch, delay: float) -> list:
    """The fork server's SPAWNED handled ``delay`` s late, as when the fork server is
    descheduled after a fork while its child starts and answers READY: a ready worker's pid
    is None meanwhile. Returns the timers (join them before the checks)."""
    original = owner_events.OwnerEvents._on_spawned
    timers: list = []

    def late(self, worker, pid):
        def apply():
            with self._lock:
                original(self, worker, pid)
            if self._deferred:
                self._run_deferred()

        timer = threading.Timer(delay, apply)
        timers.append(timer)
        timer.start()

    monkeypatch.setattr(owner_events.OwnerEvents, "_on_spawned", late)
    return timers


def _worker_logs(owner) -> list:
    with owner.locked():
        log_dir = owner.workers.log_dir
    assert log_dir is not None
    return sorted(glob.glob(os.path.join(log_dir, "worker-*")))


def test_the_warm_up_round_trip_leaves_nothing(ray_start, monkeypatch):
    # long enough that a loaded machine still answers in time (the waits are bounds only):
    # the rounds run once the first worker is ready and its lease taken
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 30.0)
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2)
    owner = runtime.current().owner
    assert [answered for answered, _ in trips] == [True] * runtime.WARM_UP_ROUNDS
    with owner.locked():
        assert not owner._warm_ups
        slots = owner.leases.slots()
        assert len(slots) == 1  # the prestart's first lease, and no other
        worker = slots[0].worker
        assert not worker.inflight and worker.calls == 0 and worker.named is None
        assert worker.fn_calls == {}
        stats_tasks = owner.tasks.statistics()
        assert stats_tasks["tasks_pending"] == 0 and stats_tasks["queued"] == 0
        assert len(owner.objects) == 0
        assert not owner.tasks.by_id
    # init() read each warm-up RESULT itself
    assert owner.direct_reads.reads == runtime.WARM_UP_ROUNDS
    assert state.list_tasks() == []
    assert state.summarize_tasks()["cluster"]["summary"] == {}
    assert state.list_objects() == []
    assert miniray.timeline() == []
    stats = owner.statistics()
    assert stats["objects"] == 0 and stats["leases"] == 1
    for path in _worker_logs(owner):  # no output marker, nothing printed
        with open(path, "rb") as log:
            assert log.read() == b"", path

    @miniray.remote
    def add(a, b):
        return a + b

    assert miniray.get(add.remote(1, 2), timeout=60) == 3
    rows = state.list_tasks()
    assert [row["name"] for row in rows] == ["add"]
    spans = [e["cat"] for e in miniray.timeline() if e.get("cat", "").startswith("task::")]
    assert spans == ["task::add"]


def _in_warm_up_task(act):
    """A setup hook: the worker calls ``act()`` when it is sent init()'s warm-up TASK (its
    name is None; the local ``_send`` path is not init()'s), then runs it."""
    def hook():
        from miniray._private.worker import worker_main

        run_task = worker_main._Worker.run_task

        def run(self, message, _send=None):
            if message[3] is None and _send is None:
                act()
            return run_task(self, message, _send)

        worker_main._Worker.run_task = run

    return hook


_slow_warm_up = _in_warm_up_task(lambda: time.sleep(3.0))  # sleeps 3 s in it
_exit_in_warm_up = _in_warm_up_task(lambda: os._exit(3))  # exits (status 3) in it
_stuck_warm_up = _in_warm_up_task(lambda: time.sleep(60))  # outlasts any bound below


def test_a_worker_that_does_not_answer_does_not_hold_init(ray_start, monkeypatch, caplog):
    """The worker sleeps 3 s in the warm-up (a setup hook slows the driver's warm-up TASK
    only: its name is None and it is really sent): init() goes on after the bound, the
    first task runs on that worker once the warm-up is done, and the late RESULT is
    dropped without a word."""
    # The bound covers making the no-op too: 5 ms (the default) let a loaded runner skip
    # the round before sending it; 0.5 s sends it, and the 3 s answer still comes late.
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 0.5)
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)  # a first lease, even loaded
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")  # the idle lease outlives the bound
    trips = _record_trips(monkeypatch)

    caplog.set_level(logging.ERROR)
    ray_start(num_cpus=2, runtime_env={"worker_process_setup_hook": _slow_warm_up})
    owner = runtime.current().owner
    assert len(trips) == 1  # no more rounds after one that was not answered
    answered, took = trips[0]
    assert not answered
    assert took < 2.5  # the bound (0.5 s) and a loaded machine's delays, never the 3 s
    with owner.locked():
        assert len(owner._warm_ups) == 1  # waiting for the late answer
        (slot,) = owner.leases.slots()
        warming = slot.worker

    @miniray.remote
    def where():
        return os.getpid()

    assert miniray.get(where.remote(), timeout=60) == warming.pid
    assert wait_until(lambda: not owner._warm_ups, timeout=10)
    assert miniray.get(where.remote(), timeout=60) == warming.pid  # still usable
    assert [row["name"] for row in state.list_tasks()] == ["where", "where"]
    assert not [r for r in caplog.records if "miniray bug" in r.getMessage()]


def test_no_warm_up_round_trip_when_turned_off(ray_start, monkeypatch):
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 0)
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2)
    assert trips == []
    assert runtime.current().owner.direct_reads.reads == 0


def test_no_warm_up_round_trip_without_prestarted_workers(ray_start, monkeypatch):
    monkeypatch.setenv("MINIRAY_PRESTART_WORKERS", "0")
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2)
    assert trips == []

    @miniray.remote
    def one():
        return 1

    assert miniray.get(one.remote(), timeout=60) == 1


def test_a_worker_that_dies_in_the_warm_up_does_not_hold_init(ray_start, monkeypatch):
    """Its exit ends init()'s wait at once (not the whole bound) and leaves no entry."""
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 20.0)
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2, runtime_env={"worker_process_setup_hook": _exit_in_warm_up})
    owner = runtime.current().owner
    assert len(trips) == 1
    answered, took = trips[0]
    assert not answered
    assert took < 10.0  # the exit's report, even on a loaded machine; never the 20 s bound
    assert owner.direct_reads.reads == 1  # it was sent, and init() read the socket
    with owner.locked():
        assert not owner._warm_ups

    @miniray.remote
    def one():
        return 1

    assert miniray.get(one.remote(), timeout=60) == 1


def test_shutdown_does_not_wait_for_a_late_warm_up(ray_start, monkeypatch):
    """A worker still in the warm-up is busy at shutdown: killed, not asked to exit (the
    fork server would wait ``grace`` for it), and no entry is left."""
    # A grace of 60 s, not the 1 s default, and a warm-up stuck for 60 s tell killed from
    # waited-for with a 30 s bound (a bound of 0.9 s against the 1 s grace was a wall-time
    # race on a loaded machine).
    monkeypatch.setattr(owner_mod.Owner.shutdown, "__defaults__", (60.0,))
    # Bound 0.5 s, not 5 ms: it covers making the no-op, and a loaded runner took longer
    # than 5 ms for that, so no round was sent (CI here: ``len(owner._warm_ups) == 1``).
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 0.5)
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)  # a first lease, even loaded
    ray_start(num_cpus=2, runtime_env={"worker_process_setup_hook": _stuck_warm_up})
    owner = runtime.current().owner
    with owner.locked():
        assert len(owner._warm_ups) == 1
    start = time.monotonic()
    miniray.shutdown()
    took = time.monotonic() - start
    assert took < 30, took  # 20-30 ms on an idle machine; waiting for it takes the grace
    assert not owner._warm_ups


def test_the_first_lease_is_taken_when_ready_comes_before_spawned(ray_start, monkeypatch):
    """READY (the worker's socket) may be read before the fork server's SPAWNED: the first
    lease is taken for the ready worker all the same, its pid recorded in the ledger once
    known, and every warm-up round runs."""
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 30.0)
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")  # the lease outlives the checks
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    timers = _late_spawned(monkeypatch, 0.5)
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2)
    owner = runtime.current().owner
    assert [answered for answered, _ in trips] == [True] * runtime.WARM_UP_ROUNDS
    for timer in timers:
        timer.join()
    with owner.locked():
        (slot,) = owner.leases.slots()
        lease_id, pid = slot.lease.lease_id, slot.worker.pid
    assert pid is not None
    assert wait_until(
        lambda: owner.ledger.snapshot().leases[lease_id].worker_pid == pid, timeout=10)


def test_a_worker_is_named_by_its_ready_when_spawned_comes_late(ray_start, monkeypatch):
    """The worker's READY carries its pid. Defect: a task or an actor call that ran and
    finished before the fork server's SPAWNED was read had no pid in its state row (so no
    node either) and no timeline span: the pid was read when its result was recorded."""
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    release = threading.Event()
    original = owner_events.OwnerEvents._on_spawned
    threads: list = []

    def held(self, worker, pid):  # every SPAWNED waits until the checks are done
        def apply():
            release.wait(60)
            with self._lock:
                original(self, worker, pid)
            if self._deferred:
                self._run_deferred()

        thread = threading.Thread(target=apply, daemon=True)
        threads.append(thread)
        thread.start()

    monkeypatch.setattr(owner_events.OwnerEvents, "_on_spawned", held)
    try:
        ray_start(num_cpus=2)

        @miniray.remote
        def where():
            return os.getpid()

        @miniray.remote(num_cpus=0)
        class Where:
            def pid(self):
                return os.getpid()

        task_pid = miniray.get(where.remote(), timeout=60)
        actor = Where.remote()
        actor_pid = miniray.get(actor.pid.remote(), timeout=60)
        assert threads and not release.is_set()  # no SPAWNED applied so far
        node_id = miniray.get_runtime_context().get_node_id()
        rows = {row.type: row for row in state.list_tasks()
                if row.type in ("NORMAL_TASK", "ACTOR_TASK")}
        assert (rows["NORMAL_TASK"].worker_pid, rows["NORMAL_TASK"].node_id) == (
            task_pid, node_id)
        assert (rows["ACTOR_TASK"].worker_pid, rows["ACTOR_TASK"].node_id) == (
            actor_pid, node_id)
        spans = {e["args"]["task_id"]: e for e in miniray.timeline() if "args" in e
                 and e.get("ph") == "X" and e["args"].get("task_id")}
        assert rows["NORMAL_TASK"].task_id in spans and rows["ACTOR_TASK"].task_id in spans
    finally:
        release.set()
        for thread in threads:
            thread.join(10)


class _Clock:
    """The runtime's ``time`` module with ``monotonic()`` moved ahead by hand: a slow step
    is made to take its time on this clock, not by sleeping, so the rounds the bound lets run
    do not depend on how loaded the machine is."""

    def __init__(self):
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def __getattr__(self, name):
        return getattr(time, name)


def test_one_bound_for_all_rounds_and_their_making(ray_start, monkeypatch):
    """``WARM_UP_WAIT_S`` bounds the whole warm-up from before the first round's
    ``warm_up()`` (the no-op made again each round) to the last round trip's end."""
    # Each making takes 30 s of the runtime's clock (real sleeps of 0.15 s against a 0.45 s
    # bound failed when a round trip or a sleep ran long on a loaded machine): rounds are
    # made at 0, 30 and 60 s, none after the 90 s bound, and each trip is given what is left
    # (60 s, 30 s: ample to answer in).
    clock = _Clock()
    monkeypatch.setattr(runtime, "time", clock)
    monkeypatch.setattr(runtime, "WARM_UP_WAIT_S", 90.0)
    monkeypatch.setattr(runtime, "PRESTART_WAIT_S", 60.0)
    monkeypatch.setenv("MINIRAY_LEASE_KEEP_MS", "60000")  # kept through the slow rounds
    spans: list = []

    def slow(make):
        def made():
            start = clock.monotonic()
            clock.ahead += 30.0
            trip = make()
            spans.append((start, clock.monotonic()))
            return trip

        return made

    monkeypatch.setattr(runtime, "WARM_UPS", [slow(make) for make in runtime.WARM_UPS])
    trips = _record_trips(monkeypatch)
    ray_start(num_cpus=2)
    assert [answered for answered, _ in trips] == [True] * len(trips)
    assert len(spans) == 3 and len(trips) == 2
    took = spans[-1][1] - spans[0][0]
    assert took < 120, took  # the bound (90 s), less than one more making
