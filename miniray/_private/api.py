"""The bodies of the public functions: argument checks as Ray makes them, then the runtime.

Owns: Ray's type and value checks of ``get``, ``put``, ``wait``, ``cancel``, ``kill`` and the
cluster-state calls, and ``ObjectRefGenerator`` (what ``.remote()`` of a generator function
returns: it iterates with ``get``/``put``/``wait``, which accept it in turn). Does not own:
where objects live or how tasks run (the runtime of this process: driver or worker).
Called by: ``miniray/__init__.py`` (which only re-exports) and ObjectRef futures.
"""

from __future__ import annotations

from typing import Any, Sequence, TypeVar, overload

from miniray._private import runtime
from miniray._private.core import ids
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.type_vars import T
from miniray._private.object_store.values import check_session, get_values


# ---------------------------------------------------------------------- generators
class ObjectRefGenerator:
    """Iterate to get one ObjectRef per value the generator task yielded.

    Mirrors ``ray.ObjectRefGenerator`` (Ray 2.60). Differs: the task runs to completion before
    the first ref is available (values are not streamed one by one while the task still runs);
    each value becomes its own object when the iteration reaches it.
    """

    def __init__(self, ref):
        self._ref = ref
        self._values: list | None = None
        self._index = 0

    def _wait_ref(self):
        return self._ref

    def _load(self) -> list:
        if self._values is None:
            self._values = get(self._ref)
        return self._values

    def __iter__(self):
        return self

    def __next__(self):
        values = self._load()
        if self._index >= len(values):
            raise StopIteration
        value = values[self._index]
        self._index += 1
        return put(value)

    def __aiter__(self):
        return self

    async def __anext__(self):
        import asyncio

        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.__next__)
        except StopIteration:
            raise StopAsyncIteration from None

    def completed(self):
        return self._ref

    def is_finished(self) -> bool:
        return self._values is not None and self._index >= len(self._values)

    def next_ready(self) -> bool:
        ready, _ = wait([self._ref], timeout=0)
        return bool(ready)

    def close(self) -> None:
        self._values = []

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._ref.hex()})"


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
        rt = runtime.auto_init()
        return get_values(rt, [object_refs], _check_timeout(timeout))[0]
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
        raise TypeError(
            f"Could not serialize the value passed to put(): {type(error).__name__}: {error}."
        ) from error
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
    """The node's total resources, e.g. ``{"CPU": 2.0, "GPU": 1.0, "memory": ...}``.

    Mirrors ``ray.cluster_resources``; needs ``init()`` first.

    Example:
        >>> ray.cluster_resources()["CPU"]
        2.0
    """
    return runtime.require_initialized("cluster_resources()").cluster_resources()


def available_resources() -> dict:
    """The node's resources not held by running tasks and actors right now.

    Mirrors ``ray.available_resources``; needs ``init()`` first. A resource that is fully used
    is left out, as in Ray.

    Example:
        >>> ray.available_resources()["CPU"] <= ray.cluster_resources()["CPU"]
        True
    """
    return runtime.require_initialized("available_resources()").available_resources()


def nodes() -> list:
    """One dict per node (on one host: one), with Ray's keys (``NodeID``, ``Alive``,
    ``Resources``, ...).

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
    """Not available yet: raises NotImplementedError (Ray writes a Chrome trace)."""
    raise NotImplementedError(
        "miniray does not record a task timeline (ray.timeline); use a profiler such as "
        "py-spy on the worker pids shown in the output prefixes."
    )
