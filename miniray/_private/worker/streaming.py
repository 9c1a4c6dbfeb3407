"""Running a generator call in the worker: each value is sent as it is yielded (streaming), or
stored as its own object (dynamic).

Owns: iterating a generator or async generator returned by a task or an actor method whose
``num_returns`` is ``task_spec.STREAMING`` or ``DYNAMIC``; one YIELD per value, an exception
raised by the generator sent as the last value (Ray's RayTaskError wrapping it), a value that
cannot be pickled ending the stream the same way; a dynamic call's values put one by one and
returned as a ``DynamicObjectRefGenerator``. Does not own: running the call or reporting its
RESULT (``worker_main.py``, ``actor_host.py``; the RESULT of a streaming call is its completion
object, None), or what the owner does with a value (``owner/streams.py``).
Called by: ``worker_main._Worker.run_task`` and ``actor_host.ActorHost``.

::

    generator ──► value i ──► (YIELD, task_id, i, OK, payload, contained) ──► owner
              └─► raises  ──► (YIELD, task_id, i, ERR, RayTaskError)        then the RESULT

For a driver on another host a large value's payload is ``("peer", size, 0)`` and its bytes
follow the YIELD in frames (``Channel.send_bulk``, as a RESULT's do); a value is never kept
on this host for such a driver (``result_route``'s ``may_keep``): the driver takes each one
as it comes. ``runtime.peer_lock`` is held from the value's serialization to its send, so
calls running at once (a threaded or async actor's) do not take each other's bytes.

A cancellation (``TaskCancelledError`` or ``KeyboardInterrupt`` injected by the cancel thread,
``asyncio.CancelledError`` in an async actor), ``sys.exit()`` and ``exit_actor()`` are not the
generator's values: they propagate, and the call's completion object carries them, as the
RESULT of any call does.
"""

from __future__ import annotations

import inspect

from miniray._private.core import ids, protocol
from miniray._private.core.object_ref import DynamicObjectRefGenerator, ObjectRef
from miniray._private.worker.execute import (
    _dumps_error,
    _flush_std,
    _user_traceback,
    task_error_for,
)


def _passes_through(error: BaseException) -> bool:
    """A cancellation or an exit: the call's outcome, never one of its values."""
    from miniray.exceptions import TaskCancelledError

    return isinstance(error, TaskCancelledError) or not isinstance(error, Exception)


def _error_payload(worker, task_id: bytes, name: str, error: BaseException,
                   error_fields) -> bytes:
    """The ERR payload of a generator's own error, raised at one of its values: the task
    error naming the call (and, for an actor's, ``error_fields()``: its id and repr)."""
    fields = error_fields() if error_fields is not None else {}
    return _dumps_error(task_error_for(
        error, name, pid=worker.pid, ip=worker.info.get("node_ip", "127.0.0.1"),
        traceback_str=_user_traceback(error), task_id=task_id, **fields))


def _not_a_generator(value) -> TypeError:
    return TypeError(
        f"A streaming call must return a generator, got {type(value).__name__}; "
        "num_returns='streaming' needs a function that uses 'yield'.")


class _Sender:
    """Sends the values of one call, in order."""

    def __init__(self, worker, task_id: bytes, name: str, error_fields):
        self.worker = worker
        self.task_id = task_id
        self.name = name
        self.error_fields = error_fields  # () -> dict of actor_id/actor_repr, or None
        self.index = 0

    def value(self, value) -> bool:
        """Send one value; False if it could not be pickled (an error was sent instead)."""
        worker = self.worker
        item_id = ids.stream_item_id(self.task_id, self.index)
        if not getattr(worker.channel, "remote", False):
            result = worker._serialize_returns(value, 1, self.name, [item_id],
                                               error_fields=self.error_fields)[0]
            self._send(result[0], result[1], result[2] if len(result) > 2 else ())
            return result[0] == protocol.OK
        runtime = worker.runtime
        with runtime.peer_lock:  # a driver on another host: a large value's bytes follow
            result = worker._serialize_returns(value, 1, self.name, [item_id],
                                               error_fields=self.error_fields,
                                               may_keep=False)[0]
            payload = result[1]
            sers = []
            if type(payload) is tuple and payload[0] == "peer":
                sers.append(runtime.peer_out[payload[2]])
                payload = ("peer", payload[1], 0)
            runtime.peer_out.clear()
            self._send(result[0], payload, result[2] if len(result) > 2 else (), sers)
        return result[0] == protocol.OK

    def error(self, error: BaseException) -> None:
        self._send(protocol.ERR, _error_payload(self.worker, self.task_id, self.name, error,
                                                self.error_fields), ())

    def _send(self, kind: int, payload, contained, sers=()) -> None:
        _flush_std()  # what the generator printed comes before its value
        message = (protocol.YIELD, self.task_id, self.index, kind, payload, tuple(contained))
        if sers:
            self.worker.channel.send_bulk(message, sers)
        else:
            self.worker.channel.send(message)
        self.index += 1


def stream(worker, task_id: bytes, generator, name: str, error_fields=None) -> None:
    """Send every value of ``generator`` as it is yielded; its exception ends the stream as
    one more value. Cancellations and exits propagate."""
    sender = _Sender(worker, task_id, name, error_fields)
    if not inspect.isgenerator(generator):
        sender.error(_not_a_generator(generator))
        return
    while True:
        try:
            value = next(generator)
        except StopIteration:
            return
        except BaseException as error:
            if _passes_through(error):
                raise
            sender.error(error)
            return
        if not sender.value(value):
            generator.close()
            return


async def stream_async(worker, task_id: bytes, generator, name: str,
                       error_fields=None) -> None:
    """``stream`` for an async generator (an async actor's method)."""
    sender = _Sender(worker, task_id, name, error_fields)
    while True:
        try:
            value = await generator.__anext__()
        except StopAsyncIteration:
            return
        except BaseException as error:
            if _passes_through(error):
                raise
            sender.error(error)
            return
        if not sender.value(value):
            await generator.aclose()
            return


def dynamic(worker, task_id: bytes, generator, name: str = "",
            error_fields=None) -> DynamicObjectRefGenerator:
    """Store each value of ``generator`` as its own object; the call returns their refs
    (the owner then holds them through the returned value). An exception it raises is
    stored as one more object after its values, as Ray 2.60 stores it (its generator's
    last ref raises it); a cancel or an exit still ends the call."""
    if not inspect.isgenerator(generator):
        raise _not_a_generator(generator)
    refs = []
    try:
        for value in generator:
            object_id = ids.stream_item_id(task_id, len(refs))
            worker.runtime.put_value(object_id, value)
            refs.append(ObjectRef(object_id))
    except BaseException as error:  # the generator's own error: its last ref
        if _passes_through(error):
            raise
        object_id = ids.stream_item_id(task_id, len(refs))
        worker.channel.send((protocol.PUT, object_id, protocol.ERR,
                             _error_payload(worker, task_id, name, error, error_fields), ()))
        refs.append(ObjectRef(object_id))
    return DynamicObjectRefGenerator(refs)
