"""``miniray.util.ActorPool`` and ``miniray.util.queue.Queue``: every method, ordering,
timeouts and errors, and a Queue shared with tasks and actors.

Ray 2.60 behaviour: ray-api-surface.md §7.2 (ActorPool), §7.3 (Queue).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import queue as std_queue
import threading
import time

import pytest

import miniray
from miniray import exceptions
from miniray.util import ActorPool
from miniray.util.queue import Empty, Full, Queue

from .helpers import open_gate

GET_TIMEOUT = 30


@pytest.fixture
def Doubler(ray):
    @ray.remote
    class Doubler:
        def double(self, value):
            if isinstance(value, tuple):  # (value, seconds to sleep first, or a gate file)
                value, wait = value
                if isinstance(wait, str):  # held until the test opens the gate (_gate)
                    deadline = time.monotonic() + 60
                    while not os.path.exists(wait) and time.monotonic() < deadline:
                        time.sleep(0.01)
                else:
                    time.sleep(wait)
            if value == "boom":
                raise ValueError("boom")
            return 2 * value

    return Doubler


def _double(actor, value):
    return actor.double.remote(value)


def _gate(tmp_path, name: str) -> str:
    """A file a Doubler call given ``(value, path)`` waits for: the test opens the gate
    (creates the file) once it has seen what must happen while the call is held, so no
    sleep's length decides which call ends first (a loaded machine outran 0.4 s ones)."""
    return str(tmp_path / name)


# ----------------------------------------------------------------------------- ActorPool
def test_exports():
    import miniray.util
    import miniray.util.actor_pool
    import miniray.util.queue

    assert "ActorPool" in miniray.util.__all__ and miniray.util.ActorPool is ActorPool
    assert set(miniray.util.actor_pool.__all__) == {"ActorPool"}
    assert set(miniray.util.queue.__all__) == {"Empty", "Full", "Queue"}
    assert issubclass(Empty, std_queue.Empty) and issubclass(Full, std_queue.Full)


def test_pool_map_is_ordered_and_map_unordered_is_not(ray, Doubler, tmp_path):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    # the first value is the slowest: map still yields it first
    values = [(1, 0.4), (2, 0), (3, 0), (4, 0)]
    assert list(pool.map(_double, values)) == [2, 4, 6, 8]
    gate = _gate(tmp_path, "first")
    results = pool.map_unordered(_double, [(1, gate), (2, 0), (3, 0), (4, 0)])
    unordered = [next(results) for _ in range(3)]  # while the first value is held
    open_gate(gate)
    unordered += list(results)
    assert sorted(unordered) == [2, 4, 6, 8]
    assert unordered[-1] == 2  # the slow one comes last
    assert not pool.has_next()
    assert list(pool.map(_double, [])) == []


def test_pool_map_drops_results_still_pending(ray, Doubler):
    pool = ActorPool([Doubler.remote()])
    pool.submit(_double, (100, 0.3))
    assert list(pool.map(_double, [1, 2])) == [2, 4]  # the 200 is not among them


def test_pool_submit_get_next_in_submission_order(ray, Doubler):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    assert not pool.has_next()
    with pytest.raises(StopIteration, match="No more results to get"):
        pool.get_next()
    with pytest.raises(StopIteration, match="No more results to get"):
        pool.get_next_unordered()
    for value in [(1, 0.3), 2, 3, 4, 5]:  # more values than actors: the rest wait
        pool.submit(_double, value)
    assert pool.has_next()
    assert not pool.has_free()
    assert pool.pop_idle() is None
    assert [pool.get_next() for _ in range(5)] == [2, 4, 6, 8, 10]
    assert not pool.has_next()
    assert pool.has_free()


def test_pool_get_next_timeout(ray, Doubler, tmp_path):
    pool = ActorPool([Doubler.remote()])
    pool.submit(_double, 0)  # let the actor start
    assert pool.get_next(timeout=GET_TIMEOUT) == 0
    gate = _gate(tmp_path, "held")
    pool.submit(_double, (1, gate))
    with pytest.raises(TimeoutError) as info:  # at its timeout: the call is held until later
        pool.get_next(timeout=0.1)
    assert not isinstance(info.value, exceptions.RayError)  # the builtin TimeoutError
    assert pool.has_next()  # still pending: it can be taken later
    open_gate(gate)
    assert pool.get_next() == 2
    # ignore_if_timedout: the result is given up, and its actor goes back to the pool
    pool.submit(_double, (3, 0.5))
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.05, ignore_if_timedout=True)
    assert not pool.has_next()
    assert pool.has_free()
    pool.submit(_double, 4)
    assert pool.get_next(timeout=GET_TIMEOUT) == 8  # after the ignored call, on the same actor


def test_pool_get_next_unordered(ray, Doubler, tmp_path):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    first, second = _gate(tmp_path, "first"), _gate(tmp_path, "second")
    pool.submit(_double, (1, first))
    pool.submit(_double, 2)
    assert pool.get_next_unordered(timeout=GET_TIMEOUT) == 4
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.05)
    open_gate(first)
    assert pool.get_next_unordered() == 2
    # get_next after get_next_unordered took results out of order
    pool.submit(_double, (5, second))
    pool.submit(_double, 6)
    assert pool.get_next_unordered() == 12
    with pytest.raises(ValueError, match="get_next_unordered"):
        pool.get_next()
    open_gate(second)
    assert pool.get_next_unordered() == 10


def test_pool_get_next_unordered_ignore_if_timedout(ray, Doubler):
    pool = ActorPool([Doubler.remote()])
    pool.submit(_double, (1, 0.5))
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next_unordered(timeout=0.05, ignore_if_timedout=True)
    assert not pool.has_next() and pool.has_free()


def test_pool_errors_reach_the_caller_and_the_actor_returns(ray, Doubler):
    pool = ActorPool([Doubler.remote()])
    pool.submit(_double, "boom")
    pool.submit(_double, 1)
    with pytest.raises(ValueError, match="boom") as info:
        pool.get_next()
    assert isinstance(info.value, exceptions.RayTaskError)
    assert pool.get_next() == 2
    assert pool.has_free()


def test_pool_pop_idle_and_push(ray, Doubler):
    first, second = Doubler.remote(), Doubler.remote()
    pool = ActorPool([first, second])
    assert pool.has_free()
    popped = pool.pop_idle()
    assert popped in (first, second)
    other = pool.pop_idle()
    assert {popped, other} == {first, second}
    assert pool.pop_idle() is None and not pool.has_free()
    pool.submit(_double, 1)  # no actor: waits for one
    assert not pool.has_free()
    pool.push(popped)  # takes the waiting submission at once
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(popped)  # busy in the pool
    assert pool.get_next(timeout=GET_TIMEOUT) == 2
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(popped)  # idle in the pool
    pool.push(other)
    assert list(pool.map(_double, [1, 2, 3])) == [2, 4, 6]


def test_pool_with_multi_return_calls(ray):
    @ray.remote
    class Splitter:
        @ray.method(num_returns=2)
        def split(self, value):
            return value, -value

    pool = ActorPool([Splitter.remote()])
    pool.submit(lambda actor, value: actor.split.remote(value), 3)
    assert pool.get_next(timeout=GET_TIMEOUT) == [3, -3]
    assert list(pool.map(lambda a, v: a.split.remote(v), [1, 2])) == [[1, -1], [2, -2]]


def test_pool_drops_an_actor_that_died(ray):
    """An actor whose result is ``ActorDiedError`` leaves the pool, so later work goes to the
    others and never to it. Ray 2.60's ``ActorPool`` does this (read in its
    ``ray/util/actor_pool.py``: ``_get_result`` / ``_return_actor(is_alive=False)``); compared
    by running this scenario under Ray 2.60."""

    @ray.remote
    class Mortal:
        def work(self, value):
            if value == "leave":
                miniray.actor.exit_actor()
            return value * 10

    stays, leaves = Mortal.remote(), Mortal.remote()
    pool = ActorPool([stays, leaves])  # submissions take actors from the end
    pool.submit(lambda actor, value: actor.work.remote(value), "leave")  # on `leaves`
    pool.submit(lambda actor, value: actor.work.remote(value), 1)  # on `stays`
    with pytest.raises(exceptions.ActorDiedError):
        pool.get_next(timeout=GET_TIMEOUT)
    assert pool.get_next(timeout=GET_TIMEOUT) == 10
    assert pool._idle_actors == [stays]
    assert list(pool.map(lambda actor, value: actor.work.remote(value), [2, 3])) == [20, 30]
    assert pool.pop_idle() is stays and pool.pop_idle() is None
    # unordered too: the dead actor's result raises, and it is not taken back
    pool.push(stays)
    pool.submit(lambda actor, value: actor.work.remote(value), "leave")
    with pytest.raises(exceptions.ActorDiedError):
        pool.get_next_unordered(timeout=GET_TIMEOUT)
    assert not pool.has_free() and pool.pop_idle() is None


# ----------------------------------------------------------------------------- Queue
def test_queue_put_get_and_sizes(ray):
    q = Queue(maxsize=3)
    assert q.empty() and not q.full()
    assert q.qsize() == q.size() == len(q) == 0
    q.put("a")
    q.put("b", block=False)
    q.put_nowait("c")
    assert q.full() and not q.empty()
    assert q.qsize() == q.size() == len(q) == 3
    assert [q.get(), q.get(block=False), q.get_nowait()] == ["a", "b", "c"]
    assert q.empty()
    unbounded = Queue()
    for i in range(50):
        unbounded.put_nowait(i)
    assert not unbounded.full() and len(unbounded) == 50
    assert [unbounded.get(timeout=1) for _ in range(50)] == list(range(50))


def test_queue_nowait_raises_empty_and_full_directly(ray):
    q = Queue(maxsize=1)
    with pytest.raises(Empty) as info:
        q.get_nowait()
    assert type(info.value) is Empty and isinstance(info.value, std_queue.Empty)
    with pytest.raises(Empty):
        q.get(block=False)
    q.put_nowait(1)
    with pytest.raises(Full) as info:
        q.put_nowait(2)
    assert type(info.value) is Full and isinstance(info.value, std_queue.Full)
    with pytest.raises(Full):
        q.put(2, block=False)
    assert q.get_nowait() == 1


def test_queue_blocking_timeouts_raise_ray_task_errors(ray):
    q = Queue(maxsize=1)
    start = time.monotonic()
    with pytest.raises(Empty) as info:
        q.get(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 20  # at its timeout, not hung (room for load)
    assert isinstance(info.value, exceptions.RayTaskError)
    assert isinstance(info.value, std_queue.Empty)
    q.put(1)
    start = time.monotonic()
    with pytest.raises(Full) as info:
        q.put(2, timeout=0.2)
    assert 0.15 < time.monotonic() - start < 20  # at its timeout, not hung (room for load)
    assert isinstance(info.value, exceptions.RayTaskError)
    assert isinstance(info.value, std_queue.Full)
    # timeout=0 succeeds when there is room (an item)
    assert q.get(timeout=0) == 1
    q.put(3, timeout=0)
    assert q.get_nowait() == 3
    for call in (lambda: q.get(timeout=-1), lambda: q.put(1, timeout=-0.5)):
        with pytest.raises(ValueError, match="non-negative"):
            call()


def test_queue_batches(ray):
    q = Queue(maxsize=4)
    q.put_nowait_batch([1, 2, 3])
    with pytest.raises(Full) as info:
        q.put_nowait_batch([4, 5])  # all or nothing
    assert "Cannot add 2 items" in str(info.value)
    assert len(q) == 3
    q.put_nowait_batch(x for x in [4])
    with pytest.raises(Empty) as info:
        q.get_nowait_batch(5)
    assert "Cannot get 5 items" in str(info.value)
    assert q.get_nowait_batch(0) == []
    assert q.get_nowait_batch(4) == [1, 2, 3, 4]
    with pytest.raises(TypeError):
        q.put_nowait_batch(5)
    with pytest.raises(TypeError):
        q.get_nowait_batch("2")
    with pytest.raises(ValueError):
        q.get_nowait_batch(-1)


def test_queue_async_put_and_get(ray):
    q = Queue(maxsize=1)

    async def main():
        await q.put_async("x")
        with pytest.raises(Full):
            await q.put_async("y", block=False)
        with pytest.raises(Full):
            await q.put_async("y", timeout=0.1)
        first = await q.get_async()
        with pytest.raises(Empty):
            await q.get_async(block=False)
        with pytest.raises(Empty):
            await q.get_async(timeout=0.1)
        with pytest.raises(ValueError):
            await q.get_async(timeout=-1)
        # a blocked get_async is woken by a put from elsewhere
        waiter = asyncio.ensure_future(q.get_async(timeout=GET_TIMEOUT))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await q.put_async("z")
        return first, await waiter

    assert asyncio.run(main()) == ("x", "z")


def test_queue_shared_with_a_task_that_puts_while_the_driver_gets(ray):
    @ray.remote
    def producer(q, count):
        for i in range(count):
            q.put(i, timeout=GET_TIMEOUT)  # blocks while the small queue is full
        return "produced"

    q = Queue(maxsize=2)
    done = producer.remote(q, 20)
    assert [q.get(timeout=GET_TIMEOUT) for _ in range(20)] == list(range(20))
    assert ray.get(done, timeout=GET_TIMEOUT) == "produced"
    assert q.empty()


def test_queue_shared_with_an_actor(ray):
    @ray.remote
    class Consumer:
        def __init__(self, q):
            self.q = q

        def take(self, count):
            return [self.q.get(timeout=GET_TIMEOUT) for _ in range(count)]

    q = Queue()
    consumer = Consumer.remote(q)
    taken = consumer.take.remote(3)  # blocks inside the queue's actor, not in the driver
    time.sleep(0.1)
    assert q.qsize() == 0 and q.empty()  # other calls still get through
    for item in "abc":
        q.put(item)
    assert ray.get(taken, timeout=GET_TIMEOUT) == ["a", "b", "c"]
    copy = pickle.loads(pickle.dumps(q))
    copy.put("same queue")
    assert q.get(timeout=GET_TIMEOUT) == "same queue"


def test_queue_made_in_a_task_is_returned_and_used_by_the_driver(ray):
    @ray.remote
    def make():
        q = Queue(maxsize=2)
        q.put("made in a task")
        return q

    q = ray.get(make.remote(), timeout=GET_TIMEOUT)
    assert q.maxsize == 2 and len(q) == 1
    assert q.get(timeout=GET_TIMEOUT) == "made in a task"


def test_queue_blocked_get_in_a_thread_does_not_block_other_calls(ray):
    q = Queue()
    got = []
    thread = threading.Thread(target=lambda: got.append(q.get(timeout=GET_TIMEOUT)))
    thread.start()
    time.sleep(0.1)
    assert len(q) == 0
    q.put("wake")
    thread.join(GET_TIMEOUT)
    assert got == ["wake"]


def test_queue_actor_options_and_shutdown(ray):
    q = Queue(actor_options={"name": "shared-queue"})
    q.put(1)
    same = ray.get_actor("shared-queue")
    assert ray.get(same.qsize.remote(), timeout=GET_TIMEOUT) == 1
    actor = q.actor
    q.shutdown()
    assert q.actor is None
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(actor.qsize.remote(), timeout=GET_TIMEOUT)
    q.shutdown()  # twice is fine

    forced = Queue()
    forced_actor = forced.actor
    forced.shutdown(force=True)
    with pytest.raises(exceptions.ActorDiedError, match="ray.kill"):
        ray.get(forced_actor.qsize.remote(), timeout=GET_TIMEOUT)


def test_queue_shutdown_kills_after_the_grace_period(ray):
    @ray.remote
    def blocked_get(q):
        return q.get()

    q = Queue()
    q.put("warm")
    assert q.get() == "warm"
    stuck = blocked_get.remote(q)  # a get that never ends holds off a graceful exit
    time.sleep(0.2)
    actor = q.actor
    start = time.monotonic()
    q.shutdown(grace_period_s=0.3)
    assert time.monotonic() - start < 20  # killed after the grace, not hung (room for load)
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(actor.qsize.remote(), timeout=GET_TIMEOUT)
    with pytest.raises(exceptions.ActorDiedError):  # the task's get failed with the actor
        ray.get(stuck, timeout=GET_TIMEOUT)
