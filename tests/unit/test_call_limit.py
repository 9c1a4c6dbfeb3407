"""``actor_host.CallLimit``: the turns of an async actor's concurrency group. A free turn is
taken inline, the others wait in order; a call cancelled while it waits never runs and takes
no turn, and one cancelled just after it was given a turn passes it on."""

from __future__ import annotations

import asyncio

import pytest

from miniray._private.worker.actor_host import CallLimit


async def _take(limit: CallLimit) -> None:  # as ActorHost._run_async does
    if limit.free > 0 and not limit.waiting:
        limit.free -= 1
    else:
        await limit.wait()


def test_turns_in_order_and_never_more_than_the_size():
    async def main():
        limit = CallLimit(2)
        running, most, order = [0], [0], []

        async def call(n):
            await _take(limit)
            try:
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(n)
                await asyncio.sleep(0.001)
            finally:
                running[0] -= 1
                limit.release()

        await asyncio.gather(*(call(n) for n in range(20)))
        return limit, most[0], order

    limit, most, order = asyncio.run(main())
    assert most == 2
    assert order == list(range(20))
    assert limit.free == 2 and not limit.waiting


def test_a_call_cancelled_while_it_waits_takes_no_turn():
    async def main():
        limit = CallLimit(1)
        await _take(limit)
        waiter = asyncio.ensure_future(_take(limit))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not limit.waiting
        limit.release()
        return limit

    assert asyncio.run(main()).free == 1


def test_a_turn_given_just_before_a_cancel_passes_on():
    async def main():
        limit = CallLimit(1)
        await _take(limit)
        first = asyncio.ensure_future(_take(limit))
        second = asyncio.ensure_future(_take(limit))
        await asyncio.sleep(0)
        limit.release()  # the turn goes to ``first`` ...
        first.cancel()  # ... which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(second, 5)  # ``second`` got the turn
        limit.release()
        return limit

    limit = asyncio.run(main())
    assert limit.free == 1 and not limit.waiting
