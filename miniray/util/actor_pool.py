"""ActorPool: spread work over a fixed set of actors, one call per idle actor at a time.

Mirrors ``ray.util.actor_pool`` (Ray 2.60): ``ActorPool(actors)`` with ``map``,
``map_unordered``, ``submit``, ``has_next``, ``get_next``, ``get_next_unordered``, ``has_free``,
``pop_idle`` and ``push``, with Ray's bookkeeping (results by submission index, submissions
queued while every actor is busy, an actor returned to the pool when its result is taken,
an actor whose result is ``ActorDiedError`` dropped from the pool).
Differs: ``get_next_unordered(timeout=..., ignore_if_timedout=True)`` gives up on the oldest
pending call and raises ``TimeoutError`` (Ray 2.60 fails there with ``UnboundLocalError``); a
call returning a list of refs (``num_returns`` > 1) can be waited on with a timeout (Ray 2.60
passes the list to ``wait`` and fails).

Owns only in-process bookkeeping; it is built on the public API (``miniray.wait``,
``miniray.get``) and called by user code.

Example:
    >>> @ray.remote
    ... class Doubler:
    ...     def double(self, v):
    ...         return 2 * v
    >>> pool = ActorPool([Doubler.remote(), Doubler.remote()])
    >>> list(pool.map(lambda a, v: a.double.remote(v), [1, 2, 3, 4]))
    [2, 4, 6, 8]
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from miniray._private import api
from miniray.exceptions import ActorDiedError

__all__ = ["ActorPool"]

_TIMEOUT_MSG = "Timed out waiting for result"


class ActorPool:
    """A pool of actors that takes work as actors become free.

    Args:
        actors: The actors to use. They must not be used elsewhere while in the pool.

    Example:
        >>> @ray.remote
        ... class Doubler:
        ...     def double(self, v):
        ...         return 2 * v
        >>> pool = ActorPool([Doubler.remote(), Doubler.remote()])
        >>> pool.submit(lambda a, v: a.double.remote(v), 1)
        >>> pool.get_next()
        2
        >>> sorted(pool.map_unordered(lambda a, v: a.double.remote(v), [1, 2]))
        [2, 4]
    """

    def __init__(self, actors: list):
        self._idle_actors = list(actors)
        # ObjectRef (or tuple of refs) -> (submission index, actor)
        self._future_to_actor: dict = {}
        # submission index -> ObjectRef (or list of refs)
        self._index_to_future: dict = {}
        self._next_task_index = 0
        self._next_return_index = 0
        # (fn, value) submitted while every actor was busy, oldest first
        self._pending_submits: list = []

    def __repr__(self) -> str:
        return (
            f"ActorPool(idle={len(self._idle_actors)}, busy={len(self._future_to_actor)}, "
            f"queued={len(self._pending_submits)})"
        )

    def map(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Apply ``fn(actor, value)`` to every value; yield the results in order.

        Results still pending from earlier submissions are dropped first, as in Ray.
        """
        return self._map(fn, values, ordered=True)

    def map_unordered(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Like ``map``, but yield each result as soon as it is ready.
        """
        return self._map(fn, values, ordered=False)

    def _map(self, fn: Callable[[Any, Any], Any], values: Iterable, ordered: bool) -> Iterator:
        """Drop what earlier submissions left pending, submit every value now (as Ray does:
        not lazily), and return a generator of the results, in order or as they come."""
        self._discard_pending(ordered=ordered)
        for value in values:
            self.submit(fn, value)
        get_next = self.get_next if ordered else self.get_next_unordered

        def get_generator():
            while self.has_next():
                yield get_next()

        return get_generator()

    def _discard_pending(self, ordered: bool) -> None:
        while self.has_next():
            try:
                if ordered:
                    self.get_next(timeout=0, ignore_if_timedout=True)
                else:
                    self.get_next_unordered(timeout=0, ignore_if_timedout=True)
            except TimeoutError:
                pass

    def submit(self, fn: Callable[[Any, Any], Any], value: Any) -> None:
        """Run ``fn(actor, value)`` on an idle actor, or once one is free.

        ``fn`` must return the ObjectRef (or list of refs) of the call it makes.
        """
        if self._idle_actors:
            actor = self._idle_actors.pop()
            future = fn(actor, value)
            key = tuple(future) if isinstance(future, list) else future
            self._future_to_actor[key] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = future
            self._next_task_index += 1
        else:
            self._pending_submits.append((fn, value))

    def has_next(self) -> bool:
        """Whether any submitted result has not been taken yet."""
        return bool(self._future_to_actor)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order.

        Args:
            timeout: Seconds to wait; on expiry ``TimeoutError`` is raised.
            ignore_if_timedout: On a timeout, give up on that result (the actor returns to
                the pool) before raising ``TimeoutError``.

        Raises:
            StopIteration: Nothing is pending.
            TimeoutError: The result was not ready within ``timeout``.
            ValueError: ``get_next_unordered`` already took results out of order.
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        future = self._index_to_future[self._next_return_index]
        timed_out = False
        if timeout is not None:
            ready, _ = api.wait(
                _as_list(future), num_returns=len(_as_list(future)), timeout=timeout
            )
            if not ready or len(ready) < len(_as_list(future)):
                if not ignore_if_timedout:
                    raise TimeoutError(_TIMEOUT_MSG)
                timed_out = True
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        key = tuple(future) if isinstance(future, list) else future
        _index, actor = self._future_to_actor.pop(key)
        if timed_out:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._get_result(future, actor)

    def get_next_unordered(
        self, timeout: float | None = None, ignore_if_timedout: bool = False
    ) -> Any:
        """Any next result, whichever finishes first.

        Args:
            timeout: Seconds to wait; on expiry ``TimeoutError`` is raised.
            ignore_if_timedout: On a timeout, give up on the oldest pending result (its actor
                returns to the pool) before raising ``TimeoutError``.

        Raises:
            StopIteration: Nothing is pending.
            TimeoutError: No result was ready within ``timeout``.
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        keys = list(self._future_to_actor)
        waitable = {}
        for key in keys:
            # a multi-return call is ready when its first ref is; Ray waits on the key itself
            waitable[key[0] if isinstance(key, tuple) else key] = key
        ready, _ = api.wait(list(waitable), num_returns=1, timeout=timeout)
        if ready:
            key = waitable[ready[0]]
        elif not ignore_if_timedout:
            raise TimeoutError(_TIMEOUT_MSG)
        else:
            key = min(keys, key=lambda k: self._future_to_actor[k][0])
        index, actor = self._future_to_actor.pop(key)
        future = self._index_to_future.pop(index)
        self._next_return_index = max(self._next_return_index, index + 1)
        if not ready:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._get_result(future, actor)

    def _get_result(self, future, actor) -> Any:
        """The result, the actor going back to the pool once it is taken; an actor whose
        result says it died (``ActorDiedError``) leaves the pool, as in Ray."""
        alive = True
        try:
            return api.get(future)
        except ActorDiedError:
            alive = False
            raise
        finally:
            self._return_actor(actor, alive)

    def _return_actor(self, actor, alive: bool = True) -> None:
        if alive:
            self._idle_actors.append(actor)
        if self._pending_submits and self._idle_actors:
            self.submit(*self._pending_submits.pop(0))

    def has_free(self) -> bool:
        """Whether an actor is idle and no submission is waiting for one."""
        return len(self._idle_actors) > 0 and len(self._pending_submits) == 0

    def pop_idle(self):
        """Remove and return an idle actor, or None if none is free."""
        if self.has_free():
            return self._idle_actors.pop()
        return None

    def push(self, actor) -> None:
        """Add an actor to the pool (it takes a waiting submission at once, if any).

        Raises:
            ValueError: The actor is already in the pool.
        """
        busy_actors = [actor for _index, actor in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy_actors:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)


def _as_list(future) -> list:
    return list(future) if isinstance(future, list) else [future]
