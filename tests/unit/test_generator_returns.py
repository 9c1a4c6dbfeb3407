"""``core/generator_returns.py``: a generator's values for ``num_returns=N``, by the rules
Ray 2.60 follows (each row checked there with a task whose generator yields ``n`` values,
then raises when ``fail``)."""

from __future__ import annotations

import asyncio

import pytest

from miniray._private.core.generator_returns import GeneratorReturns, collect, take, take_async


def _gen(n, fail):
    yield from range(n)
    if fail:
        raise KeyError("boom")


async def _agen(n, fail):
    for i in range(n):
        yield i
    if fail:
        raise KeyError("boom")


# (n, fail, N) -> (values, the error of the missing returns, late error, more)
ROWS = [
    ((2, True, 4), ([0, 1], "KeyError", None, False)),
    ((4, True, 4), ([0, 1, 2, 3], None, "KeyError", False)),
    ((2, False, 4), ([0, 1], "ValueError", None, False)),
    ((5, False, 4), ([0, 1, 2, 3], None, None, True)),
    ((0, True, 2), ([], "KeyError", None, False)),
    ((1, False, 1), ([0], None, None, False)),
    ((0, False, 1), ([], "ValueError", None, False)),
]


def _shape(got: GeneratorReturns, num_returns: int) -> tuple:
    missing = got.missing_error(num_returns)
    late = got.late_error
    return (got.values, type(missing).__name__ if missing else None,
            type(late).__name__ if late else None, got.more)


@pytest.mark.parametrize("case, expected", ROWS)
def test_take_follows_rays_rules(case, expected):
    n, fail, num_returns = case
    assert _shape(take(_gen(n, fail), num_returns), num_returns) == expected
    assert _shape(asyncio.run(take_async(_agen(n, fail), num_returns)),
                  num_returns) == expected
    assert _shape(collect(num_returns, _gen, n, fail), num_returns) == expected


def test_the_missing_returns_error_is_rays_value_error():
    got = take(_gen(1, False), 3)
    assert str(got.missing_error(3)) == "Task returned 1 objects, but num_returns=3."


def test_a_cancel_or_an_exit_is_not_taken_as_the_generators_error():
    def interrupted():
        yield 1
        raise KeyboardInterrupt

    def exits():
        yield 1
        raise SystemExit(3)

    with pytest.raises(KeyboardInterrupt):
        take(interrupted(), 3)
    with pytest.raises(SystemExit):
        take(exits(), 3)
