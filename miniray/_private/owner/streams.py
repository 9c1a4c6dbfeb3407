"""The streams of streaming generator calls: the values a call has yielded so far, and who
waits for the next one.

Owns: one record per streaming call (task or actor call, by task id) that yielded a value or
has a consumer waiting: how many values arrived, which of them the stream still holds for its
consumer, the consumer's waiters, and letting go of all of it once nobody can iterate the
stream any more. Does not own: the objects (``object_table.py``), the call itself
(``tasks.py``, ``actors.py``), or blocking a consumer (the driver's ``Owner.stream_next``, a
worker's request in ``requests.py``).
Called by: ``owner.Owner`` (YIELD, on the I/O thread; the driver's ``stream_next``) and
``requests.py`` (a worker's ``CALL_STREAM_NEXT``), with the owner's lock held.

::

    YIELD(task, i) ──► value i ready (object ids.stream_item_id(task, i)), held by the stream
                   └─► the stream's waiters wake
    next(task, i)  ──► values < i are released: the consumer holds its own refs by now
                   └─► True: value i is there; False: the call ended without it (its
                       completion object is ready); None: neither yet (wait, then ask again)
    completion object freed (the ObjectRefGenerator and every ``completed()`` ref are gone)
                   ──► the stream releases what it still holds and is forgotten; values that
                       arrive while nobody holds the completion object are freed at once

The consumer's position is its own (``ObjectRefGenerator``); asking for value ``i`` tells the
stream that the values before it were taken. A driver's ``ObjectRef`` creation is applied
before the release (``ObjectTable.release`` syncs queued ref events); a worker's BORROW report
is sent before its request. So a value is never freed between the stream and its consumer.
"""

from __future__ import annotations

from typing import Callable

from miniray._private.core import ids
from miniray._private.owner.object_table import READY

_COMPLETION = (1).to_bytes(4, "big")  # the return index of a streaming call's completion


class _Stream:
    __slots__ = ("count", "held_from", "waiters")

    def __init__(self):
        self.count = 0        # values arrived: 0 .. count - 1
        self.held_from = 0    # the stream holds values held_from .. count - 1
        self.waiters: list | None = None


class Streams:
    """The streaming calls of one owner. Every method is *locked*."""

    def __init__(self, objects):
        self.objects = objects
        self.by_task: dict[bytes, _Stream] = {}
        # Streaming calls whose values belong to another process (the node's actor service
        # runs calls for drivers): ``forward[task_id](index, kind, data, contained)``.
        self.forward: dict[bytes, Callable] = {}

    def __len__(self) -> int:
        return len(self.by_task)

    def on_item(self, task_id: bytes, index: int, kind: int, data, contained) -> None:
        """Value ``index`` of ``task_id`` arrived (YIELD)."""
        if self.forward:
            forward = self.forward.get(task_id)
            if forward is not None:
                forward(index, kind, data, contained)
                return
        objects = self.objects
        stream = self.by_task.get(task_id)
        if stream is not None and index < stream.count:
            return  # a retried call yields again what already arrived: kept as it was
        item_id = ids.stream_item_id(task_id, index)
        objects.set_ready(item_id, kind, data)
        if contained:
            objects.contain(item_id, contained)
        completion = objects.get(task_id + _COMPLETION)
        if completion is None or completion.dropped:
            # The generator was dropped (or the call's results go elsewhere): nobody can take
            # this value, so it is freed now, with whatever the stream still held.
            if stream is not None:
                self._let_go(task_id, stream)
            entry = objects.get(item_id)
            if entry is not None:
                objects.maybe_free(item_id, entry)
            return
        if stream is None:
            stream = self.by_task[task_id] = _Stream()
        objects.hold((item_id,))
        stream.count = index + 1
        self._wake(stream)

    def next(self, task_id: bytes, index: int) -> bool | None:
        """The consumer asks for value ``index`` (so it took every value before it): True if
        it is there, False if the call ended without yielding it, None if neither yet."""
        stream = self.by_task.get(task_id)
        if stream is not None:
            upto = min(index, stream.count)
            if stream.held_from < upto:
                taken = [ids.stream_item_id(task_id, i) for i in range(stream.held_from, upto)]
                stream.held_from = upto
                self.objects.release(taken)
            if index < stream.count:
                return True
        completion = self.objects.get(task_id + _COMPLETION)
        if completion is None or completion.state == READY:
            return False
        return None

    def add_waiter(self, task_id: bytes, waiter) -> None:
        """Wake ``waiter`` (``notify(is_error, object_id)``) at the next value or at the
        call's end. Only after ``next`` answered None."""
        stream = self.by_task.get(task_id)
        if stream is None:
            stream = self.by_task[task_id] = _Stream()
        if stream.waiters is None:
            stream.waiters = [waiter]
        else:
            stream.waiters.append(waiter)
        completion = self.objects.get(task_id + _COMPLETION)
        if completion is not None:
            completion.add_waiter(waiter)

    def remove_waiter(self, task_id: bytes, waiter) -> None:
        stream = self.by_task.get(task_id)
        if stream is not None and stream.waiters and waiter in stream.waiters:
            stream.waiters.remove(waiter)
        completion = self.objects.get(task_id + _COMPLETION)
        if completion is not None:
            completion.remove_waiter(waiter)

    def next_item_id(self, task_id: bytes) -> bytes:
        """The id the call's next value will have (a dead worker may have written it)."""
        stream = self.by_task.get(task_id)
        return ids.stream_item_id(task_id, stream.count if stream is not None else 0)

    def object_freed(self, object_id: bytes) -> None:
        """An object was freed: if it is a stream's completion object, nobody can iterate
        that stream any more."""
        if object_id[ids.TASK_ID_SIZE:] != _COMPLETION:
            return
        task_id = object_id[:ids.TASK_ID_SIZE]
        stream = self.by_task.get(task_id)
        if stream is not None:
            self._let_go(task_id, stream)

    def _let_go(self, task_id: bytes, stream: _Stream) -> None:
        del self.by_task[task_id]
        held = [ids.stream_item_id(task_id, i) for i in range(stream.held_from, stream.count)]
        stream.held_from = stream.count
        self._wake(stream)
        if held:
            self.objects.release(held)

    @staticmethod
    def _wake(stream: _Stream) -> None:
        waiters = stream.waiters
        if waiters:
            stream.waiters = None
            for waiter in waiters:
                waiter.notify(False)

    def statistics(self) -> dict:
        return {"streams": len(self.by_task),
                "stream_values_held": sum(s.count - s.held_from for s in self.by_task.values())}

    def __repr__(self) -> str:
        return f"<Streams streams={len(self.by_task)}>"
