"""``actor_host.CallLimit``: the turns of an async actor's concurrency group. A call that finds
a free turn starts; the others wait as calls, in order, and each turn given back goes to the
next one; a call cancelled while it waits leaves the line and takes no turn."""

from __future__ import annotations

import asyncio

from miniray._private.worker.actor_host import CallLimit


def _run(limit: CallLimit, count: int, woken_first: bool = False) -> tuple:
    """``count`` calls run as ActorHost runs them: a task each once it holds a turn, the
    next one started (a new task) when a turn is given back. Returns (most at once, the
    order they started)."""
    order, running, most = [], [0], [0]

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        finished = [0]

        async def call(n):
            order.append(n)
            running[0] += 1
            most[0] = max(most[0], running[0])
            await asyncio.sleep(0.001)
            running[0] -= 1
            following = limit.release()
            if following is not None:
                loop.create_task(call(following))
            finished[0] += 1
            if finished[0] == count:
                done.set_result(None)

        for n in range(count):
            if limit.admit(n):
                loop.create_task(call(n))
        await asyncio.wait_for(done, 5)

    asyncio.run(main())
    return most[0], order


def test_turns_in_order_and_never_more_than_the_size():
    limit = CallLimit(2)
    most, order = _run(limit, 20)
    assert most == 2
    assert order == list(range(20))
    assert limit.free == 2 and not limit.waiting


def test_a_turn_given_back_starts_the_next_call_after_what_is_ready():
    """The ending call woke another (an Event): that one runs before the next call starts,
    as in Ray, which hands a call to the loop only when a turn is free."""
    steps = []

    async def main():
        loop = asyncio.get_running_loop()
        limit = CallLimit(1)
        event = asyncio.Event()

        async def sleeper():
            await event.wait()
            steps.append("woken")

        async def call(name):
            steps.append(name)
            if name == "first":
                event.set()
            following = limit.release()
            if following is not None:
                loop.create_task(call(following))

        waiting = loop.create_task(sleeper())
        await asyncio.sleep(0)
        for name in ("first", "second"):
            if limit.admit(name):
                loop.create_task(call(name))
        await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert steps == ["first", "woken", "second"]


def test_a_call_cancelled_while_it_waits_takes_no_turn():
    limit = CallLimit(1)
    assert limit.admit("a") is True
    assert limit.admit("b") is False and limit.admit("c") is False
    assert limit.remove(lambda call: call == "b") == "b"
    assert limit.remove(lambda call: call == "b") is None
    assert limit.release() == "c"  # the turn passes on to the one still waiting
    assert limit.release() is None
    assert limit.free == 1 and not limit.waiting
