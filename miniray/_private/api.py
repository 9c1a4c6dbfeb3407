"""The bodies of the public functions: argument checks as Ray makes them, then the runtime.

Owns: Ray's type and value checks of ``get``, ``put``, ``wait``, ``cancel``, ``kill`` and the
cluster-state calls, and ``ObjectRefGenerator`` (what ``.remote()`` of a generator function
returns: the consumer's position in the call's stream, asked of the runtime's
``stream_next``; ``get``, ``wait`` and ``cancel`` accept it). Does not own: where objects
live, how tasks run or where a stream's values wait (the runtime of this process: driver or
worker; ``owner/streams.py``).
Called by: ``miniray/__init__.py`` (which only re-exports) and ObjectRef futures.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Sequence, TypeVar, overload

from miniray._private import runtime
from miniray._private.core import context, ids, progress_bars, serialization
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.type_vars import T
from miniray._private.object_store.values import check_session, get_values
from miniray.exceptions import GetTimeoutError


# ---------------------------------------------------------------------- generators
class ObjectRefGenerator:
    """Iterate to get one ObjectRef per value the generator task yields, as it yields it.

    Mirrors ``ray.ObjectRefGenerator`` (Ray 2.60): a sync and async iterator; ``next()``
    waits for the next value (not for the task's end). An exception raised by the generator
    comes as one more ref (its ``get`` raises the RayTaskError), then StopIteration; a system
    failure (the worker died, the task was cancelled) comes as the ``completed()`` ref, which
    holds that error, then StopIteration. ``completed()`` is ready when the task has ended
    (its value is None). ``send``/``throw``/``close`` are not supported (as in Ray), and a
    generator cannot be pickled. The values a task yields are kept by the owner until they
    are taken or the generator (and every ``completed()`` ref) is gone
    (``_private/owner/streams.py``).

    Example:
        >>> @ray.remote
        ... def count(n):
        ...     for i in range(n):
        ...         yield i
        >>> [ray.get(ref) for ref in count.remote(3)]
        [0, 1, 2]
    """

    def __init__(self, ref: ObjectRef):
        self._ref = ref  # the completion object (return index 1)
        self._task_id = ref.binary()[:ids.TASK_ID_SIZE]
        self._index = 0  # the next value to take
        self._raised = False  # the completion object's error was handed out

    def _wait_ref(self) -> ObjectRef:
        return self._ref

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        return self._next_sync()

    def _next_sync(self, timeout_s: float | None = None) -> ObjectRef:
        """The next value's ref, waiting at most ``timeout_s`` (None: for ever; then the nil
        ref if it is not there yet). Raises StopIteration at the end."""
        rt = runtime.auto_init()
        state = rt.stream_next(self._task_id, self._index, timeout_s)
        return self._take(state, timeout_s, StopIteration)

    def _take(self, state: bool | None, timeout_s: float | None, stop: type) -> ObjectRef:
        if state is None:
            return ObjectRef.nil()
        if state:
            ref = ObjectRef(ids.stream_item_id(self._task_id, self._index))
            self._index += 1
            return ref
        # The task ended without this value: its completion object says whether it failed
        # (a system error, handed out once as the last ref) or not (the end).
        if self._raised:
            raise stop
        try:
            get(self._ref, timeout=timeout_s)
        except GetTimeoutError:
            return ObjectRef.nil()
        except Exception:
            self._raised = True
            return self._ref
        raise stop

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        return await self._next_async()

    async def _next_async(self, timeout_s: float | None = None) -> ObjectRef:
        """As ``_next_sync``, without blocking the event loop: the wait runs on a thread of
        the loop's executor, in slices of at most a second, so a consumer that gives up
        leaves no thread waiting for long."""
        import asyncio  # lazy: only async consumers load asyncio

        rt = runtime.auto_init()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + max(0.0, timeout_s)
        while True:
            state = rt.stream_next(self._task_id, self._index, 0)
            if state is not None:
                break
            remaining = 1.0 if deadline is None else min(1.0, deadline - loop.time())
            if remaining <= 0:
                break
            state = await loop.run_in_executor(
                None, rt.stream_next, self._task_id, self._index, remaining)
            if state is not None:
                break
        return self._take(state, 0, StopAsyncIteration)

    # -- state -----------------------------------------------------------------------
    def completed(self) -> ObjectRef:
        """The ref that is ready when the task has ended: None, or its system error."""
        return self._ref

    def is_finished(self) -> bool:
        """True when every value was taken and ``next()`` would raise StopIteration."""
        rt = runtime.auto_init()
        if rt.stream_next(self._task_id, self._index, 0) is not False:
            return False
        if self._raised:
            return True
        try:
            get(self._ref, timeout=0)
        except Exception:  # the completion's error is still to be handed out
            return False
        return True

    def next_ready(self) -> bool:
        """True when ``next()`` would return at once (False once it would stop)."""
        if self.is_finished():
            return False
        rt = runtime.auto_init()
        return rt.stream_next(self._task_id, self._index, 0) is not None

    # -- what Ray's generator does not support ---------------------------------------
    def send(self, value):
        raise NotImplementedError("`gen.send` is not supported.")

    def throw(self, value):
        raise NotImplementedError("`gen.throw` is not supported.")

    def close(self):
        raise NotImplementedError("`gen.close` is not supported.")

    async def asend(self, value):
        raise NotImplementedError("`gen.asend` is not supported.")

    async def athrow(self, value):
        raise NotImplementedError("`gen.athrow` is not supported.")

    async def aclose(self):
        raise NotImplementedError("`gen.aclose` is not supported.")

    def __reduce__(self):
        raise TypeError(
            "You cannot return or pass a generator to other task. "
            "Serializing a ObjectRefGenerator is not allowed."
        )


ObjectRefGenerator.__module__ = "miniray"


# What wait() returns, of the kind it was given (ObjectRef or ObjectRefGenerator).
_W = TypeVar("_W")


@overload
def get(object_refs: ObjectRef[T], *, timeout: float | None = None) -> T: ...


@overload
def get(object_refs: Sequence[ObjectRef[T]], *, timeout: float | None = None) -> list[T]: ...


@overload
def get(object_refs: ObjectRefGenerator, *,
        timeout: float | None = None) -> ObjectRefGenerator: ...


def get(object_refs, *, timeout: float | None = None, _use_object_store: bool = False):
    """Returns the value of an ObjectRef, or the values of a list of them, waiting for them.

    Mirrors ``ray.get``. A large numpy array comes back as a read-only view of the shared
    object store, with no copy. Starts ``init()`` first if nothing is running.

    Args:
        object_refs: An ObjectRef, or a list of ObjectRefs (values come back in its order).
        timeout: Seconds to wait at most; ``None`` (or a negative number) waits for ever.

    Returns:
        The value, or a list of the values.

    Raises:
        GetTimeoutError: The timeout passed first.
        RayTaskError: The task that makes the object raised; the error is also an instance of
            the task's exception class, so ``except ValueError`` catches a ``ValueError``.
        WorkerCrashedError, RayActorError, TaskCancelledError: the task's worker died, its
            actor died, or it was cancelled.

    Example:
        >>> ray.get(ray.put(41)) + 1
        42
        >>> ray.get([ray.put("a"), ray.put("b")])
        ['a', 'b']
    """
    if isinstance(object_refs, ObjectRef):
        rt = context.auto_init()  # runtime.auto_init()'s hook, called only if none runs
        return get_values(rt, [object_refs],
                          None if timeout is None else _check_timeout(timeout))[0]
    if isinstance(object_refs, ObjectRefGenerator):
        return object_refs
    if not isinstance(object_refs, list):
        raise ValueError(
            f"Invalid type of object refs, {type(object_refs)}, is given. 'object_refs' must "
            "either be an ObjectRef or a list of ObjectRefs. "
        )
    for ref in object_refs:
        if not isinstance(ref, ObjectRef):
            raise TypeError(
                f"Attempting to call `get` on the value {ref}, which is not an ray.ObjectRef."
            )
    rt = runtime.auto_init()
    return get_values(rt, object_refs, _check_timeout(timeout))


def _check_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number or None, got {type(timeout).__name__}.")
    if timeout < 0:
        return None  # Ray: a negative timeout (e.g. -1) blocks like None
    return float(timeout)


def put(value: T, *, _owner: Any = None, _tensor_transport: str | None = None) -> ObjectRef[T]:
    """Stores a value in the object store and returns an ObjectRef to it.

    Mirrors ``ray.put``. Values of 100 KiB and more are written once into shared memory, where
    every task that receives the ref maps them without a copy.

    Args:
        value: Any value cloudpickle can pickle (not an ObjectRef itself: wrap it in a list).

    Returns:
        An ObjectRef; the object lives while a reference to it does.

    Raises:
        TypeError: The value cannot be pickled.
        ObjectStoreFullError: Nothing more can be stored or spilled.

    Example:
        >>> ref = ray.put([1, 2, 3])
        >>> ray.get(ref)
        [1, 2, 3]
    """
    if _owner is not None:
        raise ValueError("The _owner argument of put() was removed in Ray 2.56.")
    if isinstance(value, ObjectRef):
        raise TypeError(
            "Calling 'put' on an ray.ObjectRef is not allowed. If you really want to do this, "
            "you can wrap the ray.ObjectRef in a list and call 'put' on it."
        )
    from miniray.exceptions import RayError

    rt = runtime.auto_init()
    object_id = ids.new_put_id()
    try:
        rt.put_value(object_id, value)  # refs pickled inside the value: it holds them
    except (RayError, OSError):  # ObjectStoreFullError, OutOfDiskError, ...
        raise
    except Exception as error:
        raise TypeError(serialization.unpicklable_message(
            "put value", value, error,
            "A put value must be picklable (cloudpickle); put the data needed to rebuild "
            "it instead.")) from error
    return ObjectRef(object_id)


def wait(ray_waitables: list[_W], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True) -> tuple[list[_W], list[_W]]:
    """Waits until ``num_returns`` of the given objects are ready, or the timeout passes.

    Mirrors ``ray.wait``.

    Args:
        ray_waitables: A list of distinct ObjectRefs (or ObjectRefGenerators).
        num_returns: How many ready objects to wait for (at most ``len(ray_waitables)``).
        timeout: Seconds to wait at most; ``None`` waits until ``num_returns`` are ready.
        fetch_local: Accepted for Ray compatibility; every object is local on one host.

    Returns:
        ``(ready, not_ready)``: two lists that together hold every input, each in input order.

    Example:
        >>> ready, not_ready = ray.wait([ray.put(1), ray.put(2)], num_returns=2)
        >>> len(ready), len(not_ready)
        (2, 0)
    """
    if isinstance(ray_waitables, (ObjectRef, ObjectRefGenerator)):
        raise TypeError(
            "wait() expected a list of ray.ObjectRef or ray.ObjectRefGenerator, got a single "
            "ray.ObjectRef " + repr(ray_waitables)
        )
    if not isinstance(ray_waitables, list):
        raise TypeError(
            "wait() expected a list of ray.ObjectRef or ray.ObjectRefGenerator, got "
            f"{type(ray_waitables)}"
        )
    for item in ray_waitables:
        if not isinstance(item, (ObjectRef, ObjectRefGenerator)):
            raise TypeError(
                "wait() expected a list of ray.ObjectRef or ray.ObjectRefGenerator, got list "
                f"containing {type(item)}"
            )
    if timeout is not None and timeout < 0:
        raise ValueError(f"The 'timeout' argument must be nonnegative. Received {timeout}")
    if len(set(ray_waitables)) != len(ray_waitables):
        raise ValueError("Wait requires a list of unique ray_waitables.")
    if not ray_waitables:
        return [], []
    if isinstance(num_returns, bool) or not isinstance(num_returns, int):
        raise TypeError(f"num_returns must be an int, got {type(num_returns).__name__}.")
    if num_returns <= 0:
        raise ValueError(f"Invalid number of objects to return {num_returns}.")
    if num_returns > len(ray_waitables):
        raise ValueError(
            "num_returns cannot be greater than the number of ray_waitables provided to "
            "ray.wait."
        )
    rt = runtime.auto_init()
    waitables: list[Any] = ray_waitables
    refs = [w if isinstance(w, ObjectRef) else w._wait_ref() for w in waitables]
    check_session(rt, refs)
    if any(ref is not w for ref, w in zip(refs, waitables)):  # generators among them
        ready_ids = _wait_with_generators(rt, waitables, num_returns, timeout)
    else:
        ready_ids = rt.wait_ready([ref._id for ref in refs], num_returns,
                                  None if timeout is None else float(timeout))
    ready: list[_W] = []
    not_ready: list[_W] = []
    for waitable, ref in zip(ray_waitables, refs):
        if ref._id in ready_ids and len(ready) < num_returns:
            ready.append(waitable)
        else:
            not_ready.append(waitable)
    return ready, not_ready


def _wait_with_generators(rt, waitables: list, num_returns: int,
                          timeout: float | None) -> set[bytes]:
    """``wait`` of a list holding generators: a generator is ready when its ``next()``
    would return at once (its next value is there, or its task has ended), as in Ray. Polls
    every 5 ms: a generator's next value has no object to wait on until it is yielded."""
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    ref_ids = [w._id for w in waitables if isinstance(w, ObjectRef)]
    while True:
        ready_ids = set(rt.wait_ready(ref_ids, len(ref_ids), 0)) if ref_ids else set()
        for waitable in waitables:
            if isinstance(waitable, ObjectRefGenerator) and rt.stream_next(
                    waitable._task_id, waitable._index, 0) is not None:
                ready_ids.add(waitable._ref._id)
        if len(ready_ids) >= num_returns:
            return ready_ids
        if deadline is not None and time.monotonic() >= deadline:
            return ready_ids
        time.sleep(0.005 if deadline is None else max(0.0, min(0.005, deadline -
                                                              time.monotonic())))


def cancel(ray_waitable, *, force: bool = False, recursive: bool = True) -> None:
    """Cancels the task that makes an object; its ``get`` then raises TaskCancelledError.

    Mirrors ``ray.cancel``. A queued task is dropped. A running one gets a
    ``KeyboardInterrupt`` raised inside it, also in a ``get``/``wait`` it is blocked in (or,
    with ``force=True``, its worker is killed). An actor call that has not started is
    dropped; a running one is flagged (``get_runtime_context().is_canceled()``; its
    ``get``/``wait`` raise KeyboardInterrupt), or in an async actor its coroutine is
    cancelled; ``force=True`` raises ValueError for actor calls. A task that has already
    finished is left alone.

    Args:
        ray_waitable: The ObjectRef returned by the task's ``.remote()``.
        force: Kill the worker running the task instead of interrupting it.
        recursive: Also cancel the tasks this task submitted.

    Example:
        >>> import time
        >>> @ray.remote
        ... def slow():
        ...     time.sleep(60)
        >>> ref = slow.remote()
        >>> ray.cancel(ref, force=True)
        >>> try:
        ...     ray.get(ref, timeout=30)
        ... except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError):
        ...     print("cancelled")
        cancelled
    """
    if isinstance(ray_waitable, ObjectRefGenerator):
        ray_waitable = ray_waitable._wait_ref()
    if not isinstance(ray_waitable, ObjectRef):
        raise TypeError(
            "ray.cancel() only supported for object refs. For actors, try ray.kill(). "
            f"Got: {type(ray_waitable)}."
        )
    rt = runtime.auto_init()
    rt.cancel(ray_waitable._id, bool(force), bool(recursive))


def cluster_resources() -> dict:
    """The total resources, e.g. ``{"CPU": 2.0, "GPU": 1.0, "memory": ...}``: this node's,
    plus every alive node's of its cluster when the driver's node joined one.

    Mirrors ``ray.cluster_resources``; needs ``init()`` first.

    Example:
        >>> ray.cluster_resources()["CPU"]
        2.0
    """
    return runtime.require_initialized("cluster_resources()").cluster_resources()


def available_resources() -> dict:
    """The resources not held by running tasks and actors right now: this node's, plus
    every alive node's of its cluster as of that node's last heartbeat.

    Mirrors ``ray.available_resources``; needs ``init()`` first. A resource that is fully used
    is left out, as in Ray.

    Example:
        >>> ray.available_resources()["CPU"] <= ray.cluster_resources()["CPU"]
        True
    """
    return runtime.require_initialized("available_resources()").available_resources()


def nodes() -> list:
    """One dict per node, with Ray's keys (``NodeID``, ``Alive``, ``Resources``, ...): this
    node first, then the other nodes of its cluster, dead ones included (``Alive`` False,
    ``DeathReasonMessage``). Without a cluster: one.

    Mirrors ``ray.nodes``; needs ``init()`` first.

    Example:
        >>> [node["Alive"] for node in ray.nodes()]
        [True]
    """
    return runtime.require_initialized("nodes()").nodes()


def get_gpu_ids() -> list:
    """The GPU ids this task or actor may use (those in its ``CUDA_VISIBLE_DEVICES``).

    Mirrors ``ray.get_gpu_ids``. In the driver: every GPU of the node.

    Example:
        >>> @ray.remote(num_gpus=0)
        ... def gpus():
        ...     return ray.get_gpu_ids()
        >>> ray.get(gpus.remote())
        []
    """
    return runtime.auto_init().get_gpu_ids()


def timeline(filename: str | None = None):
    """The finished tasks and actor calls of this session as Chrome trace events.

    Mirrors ``ray.timeline`` (Ray 2.60): a list of event dicts, or, given ``filename``, that
    list written there as JSON (open it in Perfetto or ``chrome://tracing``); callable from
    the driver and from a task. Every live driver of the session contributes the calls it
    still keeps (``MINIRAY_STATE_MAX_TASKS`` each). Differs: no profiling flag is needed,
    and miniray's events are the task spans only (no ``submit_task`` or ``ray.get`` events).

    Example:
        >>> events = ray.timeline()
        >>> sorted({e["ph"] for e in events}) in ([], ["M", "X"])
        True
    """
    import json  # lazy: only timeline readers need it

    from miniray._private import state_api  # lazy: only timeline readers load the reader

    if not runtime.is_initialized():
        raise RuntimeError("Ray has not been started yet. Timeline requires Ray to be "
                           "initialized first.")
    events = state_api.timeline()
    if filename is None:
        return events
    with open(filename, "w") as out:
        json.dump(events, out)
    return None


def metrics_text() -> str:
    """The body of ``miniray.util.metrics.prometheus_text``: this process's metric values and
    those every other process of the current session wrote (``host/metric_files.py``)."""
    from miniray._private.core import metric_values  # lazy: only readers of metrics load it
    from miniray._private.host import metric_files  # lazy: as above

    snapshots = [metric_values.RECORDER.snapshot()]
    current = runtime.current()
    session_dir = getattr(current, "session_dir", None)
    if session_dir:
        snapshots += metric_files.read_snapshots(session_dir, skip_pid=getattr(current, "pid",
                                                                                None))
    return metric_values.render(metric_values.merge(snapshots))


def register_serializer(cls: type, serializer, deserializer) -> None:
    """The body of ``miniray.util.register_serializer``."""
    serialization.register_serializer(cls, serializer, deserializer)
    runtime.share_serializers()


def deregister_serializer(cls: type) -> None:
    """The body of ``miniray.util.deregister_serializer``."""
    serialization.deregister_serializer(cls)
    runtime.share_serializers()


def show_progress_bar(state: dict) -> None:
    """The body of ``tqdm_ray``'s updates. In a worker the bar's state goes out as one line on
    its stdout, which the driver's output reader hands to its display; in the driver (or a
    program that never started miniray) the display shows it at once."""
    if getattr(runtime.current(), "mode", None) == "worker":
        try:
            sys.stdout.flush()  # the task's own prints first, and never mid-line
            os.write(1, progress_bars.encode(state))
        except (OSError, ValueError):  # stdout closed by the program: the bar is not shown
            pass
        return
    from miniray._private.owner import progress_display  # lazy: only bars need the display

    progress_display.display().apply(str(state["pid"]), "", state)


def safe_print(*args, **kwargs) -> None:
    """The body of ``tqdm_ray.safe_print``: in the driver, ``print`` above the bars drawn in
    place; in a worker, ``print`` (its lines reach the driver, which does the same)."""
    if getattr(runtime.current(), "mode", None) == "worker":
        print(*args, **kwargs)
        return
    from miniray._private.owner import progress_display  # lazy: only bars need the display

    progress_display.safe_print(*args, **kwargs)
