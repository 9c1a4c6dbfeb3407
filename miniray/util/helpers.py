"""``as_completed`` and ``map_unordered``: results of many refs in the order they finish.

Mirrors ``ray.util.helpers`` (Ray 2.60). Both are generators over ``wait``: each step asks
``wait`` for up to ``chunk_size`` ready refs (``num_returns`` is never more than the refs
left, so the last batch is not waited for forever) and yields their values (``get``) or, with
``yield_obj_refs``, the refs themselves. Within a batch the order is ``wait``'s, which keeps
submission order among the ready refs. A failed task's error is raised by the ``get`` of the
batch that holds it, when the consumer reaches that batch. Extra keyword arguments go to
``wait`` (``timeout``, ``fetch_local``); a ``timeout`` bounds each ``wait``, not the whole
iteration, which goes on until every ref has been yielded, as in Ray.

``map_unordered`` submits ``fn.remote(item)`` for each item and, once ``backpressure_size``
calls are in flight, yields a batch before submitting more; at the end of the items it
yields the rest as ``as_completed`` does.

Arguments are checked when the iteration starts (the first ``next``), as in Ray, whose
functions are generators too.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from miniray._private import api

__all__ = ["as_completed", "map_unordered"]

# As Ray 2.60: a batch of ten per wait(), a hundred calls in flight.
DEFAULT_CHUNK_SIZE = 10
DEFAULT_BACKPRESSURE_SIZE = 100


def _check_chunk_size(chunk_size: int, kwargs: dict) -> None:
    if chunk_size < 1:
        raise ValueError("`chunk_size` must be >= 1")
    if "num_returns" in kwargs:
        raise ValueError("Use the `chunk_size` argument instead of `num_returns`; "
                         "it is what is passed to wait() as num_returns.")


def _next_batch(refs: list, chunk_size: int, yield_obj_refs: bool, kwargs: dict):
    """One ``wait`` for up to ``chunk_size`` refs: (their values or refs, the refs left)."""
    ready, rest = api.wait(refs, num_returns=min(chunk_size, len(refs)), **kwargs)
    if yield_obj_refs:
        return ready, rest
    return (api.get(ready) if ready else []), rest


def as_completed(refs: Sequence[Any], *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 yield_obj_refs: bool = False, **kwargs) -> Iterator[Any]:
    """Yield the values of ``refs`` as they become ready, ``chunk_size`` at a time at most.

    Args:
        refs: ObjectRefs (e.g. of tasks just submitted).
        chunk_size: how many ready refs one ``wait`` asks for (its ``num_returns``).
        yield_obj_refs: yield the ready refs instead of their values.
        **kwargs: passed to ``wait`` (``timeout``, ``fetch_local``).

    Example:
        >>> @ray.remote
        ... def square(x):
        ...     return x * x
        >>> sorted(ray.util.as_completed([square.remote(i) for i in range(4)], chunk_size=2))
        [0, 1, 4, 9]
    """
    _check_chunk_size(chunk_size, kwargs)
    refs = list(refs)
    while refs:
        batch, refs = _next_batch(refs, chunk_size, yield_obj_refs, kwargs)
        yield from batch


def map_unordered(fn: Any, items: Iterable[Any], *,
                  backpressure_size: int | None = DEFAULT_BACKPRESSURE_SIZE,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, yield_obj_refs: bool = False,
                  **kwargs) -> Iterator[Any]:
    """Yield ``fn.remote(item)``'s results for every item, in the order they finish.

    Args:
        fn: a remote function taking one argument.
        items: the arguments, one call each; read lazily as calls complete.
        backpressure_size: at most this many calls in flight before a batch is waited for
            (None: no limit).
        chunk_size: how many ready refs one ``wait`` asks for.
        yield_obj_refs: yield refs instead of values.
        **kwargs: passed to ``wait``.

    Example:
        >>> @ray.remote
        ... def square(x):
        ...     return x * x
        >>> sorted(ray.util.map_unordered(square, range(6), backpressure_size=4))
        [0, 1, 4, 9, 16, 25]
    """
    if backpressure_size is None:
        limit: float = float("inf")
    elif backpressure_size <= 0:
        raise ValueError("backpressure_size must be positive.")
    else:
        limit = backpressure_size
    _check_chunk_size(chunk_size, kwargs)
    in_flight: list = []
    for item in items:
        in_flight.append(fn.remote(item))
        if len(in_flight) >= limit:
            batch, in_flight = _next_batch(in_flight, chunk_size, yield_obj_refs, kwargs)
            yield from batch
    yield from as_completed(in_flight, chunk_size=chunk_size, yield_obj_refs=yield_obj_refs,
                            **kwargs)
