"""A generator's values as a fixed number of returns (``num_returns=N``), by Ray's rules.

Owns: taking a generator's values for a task or actor call whose ``num_returns`` is a
number N, as Ray 2.60 does (each case checked there): the first N values yielded are the
N returns, whatever follows; a generator that stops early, by raising or by returning,
leaves its remaining returns failing, with its error or with Ray's ValueError ("Task
returned 1 objects, but num_returns=3."), and the returns before stay good; once N values
are taken Ray asks for one more, and an error or a value then is only logged. Does not
own: serializing the values and errors (the worker's ``_serialize_returns``) or printing
the logged line.
Called by: the worker, inside the task (``collect``, which the driver wraps around a
generator function it exports with a number of returns) or the actor call (``take``,
``take_async``), so a cancel reaches the generator while it runs.
"""

from __future__ import annotations


class GeneratorReturns:
    """What a generator gave for N returns: ``values`` (at most N), ``error`` (what it
    raised before giving N, else None), ``late_error`` (what it raised when asked for one
    more after N), ``more`` (whether it gave an N+1th value)."""

    __slots__ = ("values", "error", "late_error", "more")

    def __init__(self, values: list, error: BaseException | None = None,
                 late_error: BaseException | None = None, more: bool = False):
        self.values = values
        self.error = error
        self.late_error = late_error
        self.more = more

    def missing_error(self, num_returns: int) -> BaseException | None:
        """The error of the returns it did not give: its own, or Ray's ValueError for a
        generator that returned early; None when it gave them all.

        >>> str(GeneratorReturns([0]).missing_error(3))
        'Task returned 1 objects, but num_returns=3.'
        >>> GeneratorReturns([0, 1]).missing_error(2) is None
        True
        """
        if len(self.values) >= num_returns:
            return None
        if self.error is not None:
            return self.error
        return ValueError(f"Task returned {len(self.values)} objects, but "
                          f"num_returns={num_returns}.")


def take(generator, num_returns: int) -> GeneratorReturns:
    """Run ``generator`` for ``num_returns`` values, then one more step (Ray's check).

    >>> def gen(n, fail):
    ...     yield from range(n)
    ...     if fail:
    ...         raise KeyError("k")
    >>> got = take(gen(1, True), 3)
    >>> got.values, repr(got.error)
    ([0], "KeyError('k')")
    >>> got = take(gen(3, True), 2)
    >>> got.values, got.error, got.more
    ([0, 1], None, True)
    >>> got = take(gen(2, True), 2)
    >>> got.values, got.error, repr(got.late_error)
    ([0, 1], None, "KeyError('k')")
    """
    values = []
    try:
        while len(values) < num_returns:
            values.append(next(generator))
    except StopIteration:
        return GeneratorReturns(values)
    except Exception as error:  # noqa: BLE001 - it fails the returns not given
        return GeneratorReturns(values, error)
    try:
        next(generator)
    except StopIteration:
        return GeneratorReturns(values)
    except Exception as error:  # noqa: BLE001 - logged, as Ray logs it
        return GeneratorReturns(values, late_error=error)
    return GeneratorReturns(values, more=True)


async def take_async(generator, num_returns: int) -> GeneratorReturns:
    """``take`` for an async generator (an async actor's method).

    >>> import asyncio
    >>> async def gen():
    ...     yield 1
    >>> asyncio.run(take_async(gen(), 2)).missing_error(2).args
    ('Task returned 1 objects, but num_returns=2.',)
    """
    values = []
    try:
        while len(values) < num_returns:
            values.append(await generator.__anext__())
    except StopAsyncIteration:
        return GeneratorReturns(values)
    except Exception as error:  # noqa: BLE001 - it fails the returns not given
        return GeneratorReturns(values, error)
    try:
        await generator.__anext__()
    except StopAsyncIteration:
        return GeneratorReturns(values)
    except Exception as error:  # noqa: BLE001 - logged, as Ray logs it
        return GeneratorReturns(values, late_error=error)
    return GeneratorReturns(values, more=True)


def collect(num_returns: int, function, *args, **kwargs) -> GeneratorReturns:
    """The task a generator function with ``num_returns`` N runs: ``take`` of its call."""
    return take(function(*args, **kwargs), num_returns)
