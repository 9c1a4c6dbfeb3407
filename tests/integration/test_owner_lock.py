"""The owner decides under its lock and acts after it: the ledger's file lock (acquire,
release, adjust, set_worker) and fork requests of task dispatch are taken with the owner's lock
free (house style: decide under a lock, act after it), so a slow ledger or fork server never
stalls the I/O thread or submissions."""

from __future__ import annotations

import threading
import time

import miniray
from miniray._private import runtime


class _LockProbe:
    """Wraps a method of a live object; records, for each call, whether the calling thread
    could take the owner's lock (a thread that holds it waits out the timeout)."""

    def __init__(self, owner, target, name):
        self.lock = owner._lock
        self.target = target
        self.name = name
        self.original = getattr(target, name)
        self.calls: list[tuple[str, bool]] = []
        setattr(target, name, self)

    def __call__(self, *args, **kwargs):
        free = self.lock.acquire(timeout=1.0)
        if free:
            self.lock.release()
        self.calls.append((threading.current_thread().name, free))
        return self.original(*args, **kwargs)

    def restore(self):
        setattr(self.target, self.name, self.original)


def _assert_exercised_and_free(probes) -> None:
    """Each probed method was called, and never by a thread holding the owner's lock."""
    calls = {probe.name: probe.calls for probe in probes}
    assert all(calls.values()), calls  # each was exercised
    held = {name: [c for c in made if not c[1]] for name, made in calls.items()}
    assert not any(held.values()), f"called with the owner's lock held: {held}"


def test_task_leases_and_workers_are_handled_outside_the_owner_lock(ray_start, monkeypatch):
    # No pipelining: three half-CPU tasks at once then need three workers, so a worker is
    # spawned beside the two init() starts, whatever the order the tasks end in.
    monkeypatch.setenv("MINIRAY_PIPELINE_DEPTH", "1")
    ray_start(num_cpus=2)
    ray = miniray
    owner = runtime.current().owner

    @ray.remote
    def nap(seconds):
        time.sleep(seconds)
        return seconds

    @ray.remote(num_cpus=0.5)
    def half():  # three at once on 2 CPUs: more workers than the two started with init()
        time.sleep(0.3)
        return "half"

    @ray.remote
    def parent():  # blocks in get(): its CPU goes back to the ledger meanwhile (adjust)
        return ray.get(nap.remote(0.1))

    names = ("acquire", "release", "adjust", "set_worker")
    probes = [_LockProbe(owner, owner.ledger, name) for name in names]
    probes.append(_LockProbe(owner, owner.fork_server, "spawn"))
    try:
        # More tasks than CPUs, and a second shape: leases are taken, workers started,
        # leases given back to make room for the other shape.
        refs = [nap.remote(0.2) for _ in range(4)] + [half.remote() for _ in range(3)]
        assert ray.get(refs, timeout=60) == [0.2] * 4 + ["half"] * 3
        assert ray.get(parent.remote(), timeout=60) == 0.1
    finally:
        for probe in probes:
            probe.restore()
    _assert_exercised_and_free(probes)


def test_actor_placement_takes_its_lease_and_worker_outside_the_owner_lock(ray):
    """An actor with no resource options needs 1 CPU to be placed and holds none while alive
    (acquire, then adjust); its worker is asked for (spawn); killing it gives the lease back."""
    owner = runtime.current().owner

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self):
            self.n += 1
            return self.n

    probes = [_LockProbe(owner, owner.ledger, name) for name in ("acquire", "adjust")]
    probes.append(_LockProbe(owner, owner.fork_server, "spawn"))
    try:
        counters = [Counter.remote() for _ in range(3)]
        assert ray.get([c.add.remote() for c in counters], timeout=60) == [1, 1, 1]
    finally:
        for probe in probes:
            probe.restore()
    _assert_exercised_and_free(probes)


def test_available_resources_sees_leases_released_just_before(ray_start):
    """Leases given back after the lock (an idle lease past its 5 ms linger, released by the
    I/O thread) are back in the ledger when ``available_resources()`` answers, as when they
    were released under the lock (compared with Ray 2.60: a finished task's resources show
    as available)."""
    ray_start(num_cpus=2, num_gpus=2)
    ray = miniray

    @ray.remote(num_gpus=1)
    def gpu_task():
        return "done"

    for attempt in range(20):
        assert ray.get(gpu_task.remote(), timeout=60) == "done"
        available = ray.available_resources()
        assert available.get("GPU") == 2.0, (attempt, available)
        time.sleep(0.004)  # around the linger: the I/O thread releases it meanwhile


def test_deaths_and_kills_give_leases_back_outside_the_owner_lock(ray):
    """A killed actor's lease, a crashed task worker's lease (its retry runs on a new one)
    and the SIGKILLs sent to the fork server (``ray.kill``, a forced cancel) are all handled
    with the owner's lock free; the resources are back when ``available_resources()``
    answers."""
    owner = runtime.current().owner

    @ray.remote
    class Sleeper:
        def ping(self):
            return "pong"

    @ray.remote(max_retries=1)
    def crash_once(marker):
        import os

        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        return "retried"

    @ray.remote
    def forever():
        time.sleep(60)

    probes = [_LockProbe(owner, owner.ledger, "release"),
              _LockProbe(owner, owner.fork_server, "kill")]
    try:
        actor = Sleeper.remote()
        assert ray.get(actor.ping.remote(), timeout=60) == "pong"
        ray.kill(actor)
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            assert ray.get(crash_once.remote(f"{folder}/m"), timeout=60) == "retried"
        stuck = forever.remote()
        deadline = time.monotonic() + 30
        while not owner.statistics()["leases"] and time.monotonic() < deadline:
            time.sleep(0.01)
        ray.cancel(stuck, force=True)
        try:
            ray.get(stuck, timeout=60)
        except miniray.exceptions.TaskCancelledError:
            pass
        deadline = time.monotonic() + 30
        while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ray.available_resources().get("CPU") == 2.0
    finally:
        for probe in probes:
            probe.restore()
    _assert_exercised_and_free(probes)
