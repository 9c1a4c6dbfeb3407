"""A get() that reads its own result from the worker's socket (``owner/direct_reads.py``),
with real workers: round trips go that way and give the socket back; the worker's other
messages (a nested submission and get) are handled on the way; a worker that dies during
the read, a task longer than the read's window, a timeout, and several threads at once all
end as before."""

from __future__ import annotations

import os
import threading
import time

import pytest

from miniray._private import runtime

from .helpers import wait_until


def _owner():
    return runtime.current().owner


def _quiet(owner) -> None:
    with owner.locked():
        assert owner.reactor._paused == set()
        assert owner.direct_reads.active == 0
        assert not any(w.direct for w in owner.workers.by_fd.values())


def test_round_trips_read_their_results_and_give_the_socket_back(ray):
    f = ray.remote(lambda x: x + 1)
    assert ray.get(f.remote(0)) == 1
    owner = _owner()
    before = owner.direct_reads.reads
    for i in range(200):
        assert ray.get(f.remote(i)) == i + 1
    assert owner.direct_reads.reads > before
    _quiet(owner)
    # the I/O thread reads the socket again: a result nobody waits for arrives
    ref = f.remote(41)

    def arrived():
        with owner.locked():
            return owner.objects.ready_ids([ref.binary()]) == [ref.binary()]

    # Polled, not looked at after a fixed sleep: a loaded machine may take longer to run
    # the task and send its result.
    assert wait_until(arrived, timeout=30)
    assert ray.get(ref) == 42


def test_the_workers_other_messages_are_handled_on_the_way(ray):
    @ray.remote
    def leaf(x):
        return x * 2

    @ray.remote
    def parent(x):
        ref = ray.put(x)
        return ray.get(leaf.remote(ray.get(ref))) + 1

    for i in range(20):
        assert ray.get(parent.remote(i)) == 2 * i + 1
    _quiet(_owner())


def test_a_worker_that_dies_during_the_read_is_retried(ray, tmp_path):
    flag = str(tmp_path / "died-once")

    @ray.remote(max_retries=1)
    def dies_once():
        if not os.path.exists(flag):
            open(flag, "w").close()
            time.sleep(0.01)
            os._exit(1)
        return "second run"

    assert ray.get(dies_once.remote(), timeout=60) == "second run"
    _quiet(_owner())

    @ray.remote(max_retries=0)
    def dies():
        os._exit(1)

    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(dies.remote(), timeout=60)
    _quiet(_owner())


def test_longer_than_the_window_and_timeouts(ray):
    @ray.remote
    def sleepy(s):
        time.sleep(s)
        return s

    assert ray.get(sleepy.remote(0.3), timeout=60) == 0.3
    ref = sleepy.remote(1.0)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(ref, timeout=0.02)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(ref, timeout=0.1)  # longer than nothing, shorter than the task
    assert ray.get(ref, timeout=60) == 1.0
    _quiet(_owner())


def test_threads_at_once(ray):
    f = ray.remote(lambda x: x)
    errors: list = []

    def loop(base):
        try:
            for i in range(100):
                assert ray.get(f.remote(base + i), timeout=60) == base + i
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=loop, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    _quiet(_owner())


def test_a_cancelled_task_under_a_read(ray):
    @ray.remote
    def forever():  # Python code: the cancel's KeyboardInterrupt lands between bytecodes
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass

    ref = forever.remote()
    time.sleep(0.5)  # running
    threading.Timer(0.02, ray.cancel, (ref,)).start()  # during the read's window
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=60)
    _quiet(_owner())
