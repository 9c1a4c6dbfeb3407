"""The owner's deferred work (``owner/deferred.py``): actions decided under the lock run after
it, in order, by one thread at a time; no process is started."""

from __future__ import annotations

import threading
import time

from miniray._private.owner.deferred import DeferredWork


def test_actions_run_in_order_after_the_lock_is_released():
    work = DeferredWork()
    seen = []
    with work.locked():
        work.defer(lambda: seen.append(("first", work.lock.locked())))
        work.defer(lambda: seen.append(("second", work.lock.locked())))
        assert seen == []  # nothing runs while the lock is held
    assert seen == [("first", False), ("second", False)]


def test_an_action_that_defers_more_has_it_run_by_the_same_loop():
    work = DeferredWork()
    seen = []

    def outer():
        with work.locked():  # takes the lock again and defers: no recursion, no deadlock
            work.defer(lambda: seen.append("inner"))
        seen.append("outer")

    with work.locked():
        work.defer(outer)
    assert seen == ["outer", "inner"]


def test_a_failing_action_is_logged_and_the_next_one_runs(caplog):
    work = DeferredWork()
    seen = []
    with work.locked():
        work.defer(lambda: 1 / 0)
        work.defer(lambda: seen.append("after"))
    assert seen == ["after"]
    assert "error in deferred owner work" in caplog.text


def test_wait_returns_only_once_another_threads_run_is_done():
    work = DeferredWork()
    started, release, seen = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(5)
        seen.append("slow")

    with work.lock:
        work.defer(slow)
    runner = threading.Thread(target=work.run)
    runner.start()
    assert started.wait(5)
    work.run()  # another thread runs the queue: returns at once, without waiting
    assert seen == []
    threading.Timer(0.2, release.set).start()
    begun = time.monotonic()
    work.run(wait=True)
    assert seen == ["slow"] and time.monotonic() - begun >= 0.1
    runner.join(5)


def test_work_added_while_another_thread_runs_is_run_by_that_thread():
    work = DeferredWork()
    started, release, seen = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(5)
        seen.append("slow")

    with work.lock:
        work.defer(slow)
    runner = threading.Thread(target=work.run)
    runner.start()
    assert started.wait(5)
    with work.locked():  # the runner is busy: this thread does not wait for it
        work.defer(lambda: seen.append("late"))
    assert seen == []
    release.set()
    runner.join(5)
    assert seen == ["slow", "late"]
