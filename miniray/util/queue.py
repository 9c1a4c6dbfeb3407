"""A first-in, first-out queue shared by tasks and actors, held by an actor.

Mirrors ``ray.util.queue`` (Ray 2.60): ``Queue(maxsize=0, actor_options=None)`` with ``put``,
``get`` (``block``, ``timeout``), ``put_nowait``, ``get_nowait``, ``put_nowait_batch``,
``get_nowait_batch``, ``put_async``, ``get_async``, ``qsize``/``size``/``len``, ``empty``,
``full`` and ``shutdown``; and ``Empty``/``Full``, subclasses of ``queue.Empty``/``queue.Full``.
The ``*_nowait`` calls raise ``Empty``/``Full`` directly; a blocking call that times out raises
them from inside the actor, so the caller gets ``RayTaskError(Empty)``/``RayTaskError(Full)``,
still an instance of ``Empty``/``Full``. A ``Queue`` pickles with its actor handle, so it can be
passed to tasks and actors.
Differs: ``put``/``get`` with ``timeout=0`` succeed when a slot (an item) is already there, as
``queue.Queue`` does (Ray's ``asyncio.wait_for`` may time out before looking);
``put_nowait_batch`` accepts any iterable, generators included.

Owns nothing but its actor handle; the items live in ``_QueueActor``, an async actor holding an
``asyncio.Queue``, so a blocked ``get`` or ``put`` never holds up the other calls.

Example:
    >>> q = Queue(maxsize=2)
    >>> q.put(1)
    >>> q.get()
    1
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterable
from typing import Any

import miniray

__all__ = ["Empty", "Full", "Queue"]


class Empty(queue.Empty):
    """The queue had no item (``get_nowait``, or ``get`` past its timeout)."""


class Full(queue.Full):
    """The queue had no free slot (``put_nowait``, or ``put`` past its timeout)."""


class Queue:
    """A FIFO queue held by an actor; pass it to tasks and actors to share it.

    Args:
        maxsize: The most items it holds; 0 or less means no limit.
        actor_options: Options for the actor holding the items (as for ``.options()``).

    Example:
        >>> q = Queue()
        >>> q.put_nowait_batch([1, 2, 3])
        >>> q.get_nowait_batch(2)
        [1, 2]
    """

    def __init__(self, maxsize: int = 0, actor_options: dict | None = None) -> None:
        actor_options = actor_options or {}
        self.maxsize = maxsize
        self.actor = _queue_actor_class().options(**actor_options).remote(self.maxsize)

    def __len__(self) -> int:
        return self.size()

    def __repr__(self) -> str:
        return f"Queue(maxsize={self.maxsize}, actor={self.actor!r})"

    def size(self) -> int:
        """The number of items in the queue."""
        return miniray.get(self.actor.qsize.remote())

    def qsize(self) -> int:
        """The number of items in the queue (as ``queue.Queue.qsize``)."""
        return self.size()

    def empty(self) -> bool:
        """Whether the queue holds no item."""
        return miniray.get(self.actor.empty.remote())

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items."""
        return miniray.get(self.actor.full.remote())

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add an item, waiting up to ``timeout`` seconds (None: forever) for a free slot.

        Raises:
            Full: ``block`` is False and the queue is full, or no slot came within
                ``timeout`` (then as ``RayTaskError(Full)``).
            ValueError: ``timeout`` is negative.
        """
        if not block:
            try:
                miniray.get(self.actor.put_nowait.remote(item))
            except asyncio.QueueFull:
                raise Full from None
        else:
            _check_timeout(timeout)
            miniray.get(self.actor.put.remote(item, timeout))

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """``put`` for asyncio code: awaits the actor instead of blocking the thread."""
        if not block:
            try:
                await self.actor.put_nowait.remote(item)
            except asyncio.QueueFull:
                raise Full from None
        else:
            _check_timeout(timeout)
            await self.actor.put.remote(item, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the oldest item, waiting up to ``timeout`` seconds for one.

        Raises:
            Empty: ``block`` is False and the queue is empty, or no item came within
                ``timeout`` (then as ``RayTaskError(Empty)``).
            ValueError: ``timeout`` is negative.
        """
        if not block:
            try:
                return miniray.get(self.actor.get_nowait.remote())
            except asyncio.QueueEmpty:
                raise Empty from None
        _check_timeout(timeout)
        return miniray.get(self.actor.get.remote(timeout))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """``get`` for asyncio code: awaits the actor instead of blocking the thread."""
        if not block:
            try:
                return await self.actor.get_nowait.remote()
            except asyncio.QueueEmpty:
                raise Empty from None
        _check_timeout(timeout)
        return await self.actor.get.remote(timeout)

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``: raises ``Full`` at once if there is no free slot."""
        return self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable) -> None:
        """Add all of ``items`` at once, or none of them.

        Raises:
            TypeError: ``items`` is not iterable.
            Full: They do not all fit (as ``RayTaskError(Full)``).
        """
        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        miniray.get(self.actor.put_nowait_batch.remote(list(items)))

    def get_nowait(self) -> Any:
        """``get(block=False)``: raises ``Empty`` at once if there is no item."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list:
        """Remove and return ``num_items`` items at once, or none of them.

        Raises:
            TypeError: ``num_items`` is not an int.
            ValueError: ``num_items`` is negative.
            Empty: Fewer items are there (as ``RayTaskError(Empty)``).
        """
        if not isinstance(num_items, int):
            raise TypeError("Argument 'num_items' should be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        return miniray.get(self.actor.get_nowait_batch.remote(num_items))

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """End the queue's actor; the queue cannot be used afterwards.

        Args:
            force: Kill the actor at once instead of letting its calls finish.
            grace_period_s: How long a graceful exit may take before the actor is killed.
        """
        if self.actor:
            if force:
                miniray.kill(self.actor, no_restart=True)
            else:
                done_ref = self.actor.__ray_terminate__.remote()
                _done, not_done = miniray.wait([done_ref], timeout=grace_period_s)
                if not_done:
                    miniray.kill(self.actor, no_restart=True)
        self.actor = None


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


class _QueueActor:
    """The actor holding a Queue's items (async: blocked puts and gets wait on its loop)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._queue: asyncio.Queue | None = None

    @property
    def queue(self) -> asyncio.Queue:
        # Made at first use, on the actor's event loop thread: before Python 3.10 an
        # asyncio.Queue binds to the loop current when it is made, and __init__ runs before
        # the actor's loop exists.
        if self._queue is None:
            self._queue = asyncio.Queue(self.maxsize)
        return self._queue

    def qsize(self) -> int:
        return self.queue.qsize()

    def empty(self) -> bool:
        return self.queue.empty()

    def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: Any, timeout: float | None = None) -> None:
        if timeout is not None and not self.queue.full():
            self.queue.put_nowait(item)
            return
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except asyncio.TimeoutError:
            raise Full from None

    async def get(self, timeout: float | None = None) -> Any:
        if timeout is not None and not self.queue.empty():
            return self.queue.get_nowait()
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise Empty from None

    def put_nowait(self, item: Any) -> None:
        self.queue.put_nowait(item)

    def put_nowait_batch(self, items: list) -> None:
        if self.maxsize > 0 and len(items) + self.qsize() > self.maxsize:
            raise Full(
                f"Cannot add {len(items)} items to queue of size {self.qsize()} and "
                f"maxsize {self.maxsize}."
            )
        for item in items:
            self.queue.put_nowait(item)

    def get_nowait(self) -> Any:
        return self.queue.get_nowait()

    def get_nowait_batch(self, num_items: int) -> list:
        if num_items > self.qsize():
            raise Empty(f"Cannot get {num_items} items from queue of size {self.qsize()}.")
        return [self.queue.get_nowait() for _ in range(num_items)]


_ACTOR_CLASS = None


def _queue_actor_class():
    """The ActorClass of ``_QueueActor``, made once per process (it caches its export)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = miniray.remote(_QueueActor)
    return _ACTOR_CLASS
