"""Pool: the ``multiprocessing.Pool`` API on a fixed set of actors, one per pool process.

Mirrors ``ray.util.multiprocessing.Pool`` (Ray 2.60): ``processes`` defaults to the cluster's
CPUs (and may not exceed them), ``initializer``/``initargs`` run in each actor's constructor,
``maxtasksperchild`` replaces an actor after that many batches, work is sent in chunks
round-robin (``map`` picks ``ceil(len / (4 * processes))`` items per chunk, ``imap`` one item
unless told), a function's exception is re-raised as itself by ``get``/``map``/``next``, and
``close`` + ``join`` let queued work finish while ``terminate`` (and leaving ``with``) kills
the actors. Differs: ``get(timeout)`` and ``next(timeout)`` raise a ``TimeoutError`` that is
both the built-in one (what Ray raises) and ``multiprocessing.TimeoutError`` (what Ray
exports), so either ``except`` catches it; ``imap`` raises a failed call's exception and the
callbacks get the values in order and the exception itself (Ray 2.60 hands out its internal
wrappers, in completion order).

Owns the pool's in-process bookkeeping (actors, per-actor batch counts, closed state) and the
pure chunking decisions; built on the public API (``remote``, ``get``, ``wait``, ``kill``).

Example:
    >>> with Pool(2) as pool:
    ...     pool.map(abs, [-1, 2, -3])
    [1, 2, 3]
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import miniray as api

logger = logging.getLogger(__name__)

class TimeoutError(multiprocessing.TimeoutError, TimeoutError):  # noqa: A001
    """A result was not ready within the timeout given to ``get`` or ``next``."""


# ----------------------------------------------------------------------------- pure decisions
def default_chunksize(num_items: int, processes: int) -> int:
    """Ray's ``map`` chunk size: the items spread over four chunks per process, rounded up."""
    chunksize, extra = divmod(num_items, processes * 4)
    return chunksize + 1 if extra else chunksize


def make_chunks(items: Iterable, chunksize: int, unpack_args: bool) -> list[list]:
    """Split ``items`` into batches of ``(args, kwargs)`` pairs, ``chunksize`` per batch."""
    if chunksize < 1:
        raise ValueError(f"chunksize must be a positive integer, got {chunksize!r}")
    iterator = iter(items)
    chunks = []
    while True:
        chunk = [(tuple(item) if unpack_args else (item,), {})
                 for item in itertools.islice(iterator, chunksize)]
        if not chunk:
            return chunks
        chunks.append(chunk)


def check_processes(processes: int | None, cluster_cpus: int) -> int:
    """The pool size: ``processes``, or the cluster's CPUs; Ray's errors for a bad value."""
    if processes is None:
        processes = cluster_cpus
    if processes <= 0:
        raise ValueError("Processes in the pool must be >0.")
    if cluster_cpus < processes:
        raise ValueError(f"Tried to start a pool with {processes} processes on an existing "
                         f"ray cluster, but there are only {cluster_cpus} CPUs in the ray "
                         "cluster.")
    return processes


class _TaskFailed:
    """A function's exception, carried back as a value so the rest of its batch still runs."""

    def __init__(self, error: BaseException):
        self.error = error


class _PoolActor:
    """One pool process: runs the initializer once, then batches of calls."""

    def __init__(self, initializer=None, initargs=None):
        if initializer is not None:
            initializer(*(initargs or ()))

    def ping(self):
        return None

    def run_batch(self, func, batch):
        results = []
        for args, kwargs in batch:
            try:
                results.append(func(*(args or ()), **(kwargs or {})))
            except Exception as error:
                results.append(_TaskFailed(error))
        return results


def _unwrap(batch) -> list:
    """A batch's values; raises the first failed call's own exception."""
    for value in batch:
        if isinstance(value, _TaskFailed):
            raise value.error
    return list(batch)


def _first_error(batches) -> BaseException | None:
    for batch in batches:
        for value in batch:
            if isinstance(value, _TaskFailed):
                return value.error
    return None


class AsyncResult:
    """The result of ``apply_async``/``map_async``/``starmap_async``; a thread collects it and
    runs the callback (all values) or the error callback (the first exception) once."""

    def __init__(self, refs: list, callback=None, error_callback=None,
                 single_result: bool = False):
        self._refs = refs
        self._single = single_result
        self._callback = callback
        self._error_callback = error_callback
        self._batches: list | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True,
                                        name="miniray-pool-result")
        self._thread.start()

    def _collect(self) -> None:
        try:
            batches = api.get(self._refs)
        except Exception as error:  # the actor died: its error stands for the batch
            batches = [[_TaskFailed(error)]]
        self._batches = batches
        self._error = _first_error(batches)
        self._done.set()
        # Callbacks run after ready() turns true, as the standard library's do.
        if self._error is not None:
            if self._error_callback is not None:
                self._error_callback(self._error)
        elif self._callback is not None:
            values = [v for batch in batches for v in batch]
            self._callback(values[0] if self._single else values)

    def wait(self, timeout: float | None = None) -> None:
        """Return once the result is ready or ``timeout`` seconds have passed."""
        self._done.wait(timeout)

    def ready(self) -> bool:
        return self._done.is_set()

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._error is None

    def get(self, timeout: float | None = None):
        """The value(s); re-raises the function's exception; ``TimeoutError`` if not ready."""
        if not self._done.wait(timeout):
            raise TimeoutError
        values = [v for batch in self._batches for v in _unwrap(batch)]
        return values[0] if self._single else values


class IMapIterator:
    """``imap``/``imap_unordered`` results: one chunk in flight per actor, the next chunk
    submitted as each result is taken; ``next(timeout)`` bounds the wait."""

    def __init__(self, pool: Pool, func: Callable, iterable: Iterable, chunksize: int | None,
                 ordered: bool):
        self._pool = pool
        self._func = func
        self._ordered = ordered
        self._chunksize = chunksize or 1
        if self._chunksize < 1:
            raise ValueError(f"chunksize must be a positive integer, got {chunksize!r}")
        self._items = iter(iterable)
        self._in_flight: list = []  # refs in submission order
        self._ready: list = []
        for _ in range(pool._processes):
            self._submit_next()

    def _submit_next(self) -> None:
        chunk = make_chunks(itertools.islice(self._items, self._chunksize), self._chunksize,
                            unpack_args=False)
        if chunk:
            self._in_flight.append(self._pool._run_batch(self._func, chunk[0]))

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        return self.next()

    def next(self, timeout: float | None = None):
        while not self._ready:
            if not self._in_flight:
                raise StopIteration
            if self._ordered:
                ready, _ = api.wait(self._in_flight[:1], timeout=timeout)
            else:
                ready, _ = api.wait(self._in_flight, num_returns=1, timeout=timeout)
            if not ready:
                raise TimeoutError
            self._in_flight.remove(ready[0])
            self._submit_next()
            self._ready.extend(api.get(ready[0]))
        value = self._ready.pop(0)
        if isinstance(value, _TaskFailed):
            raise value.error
        return value


class Pool:
    """A pool of actor processes with the ``multiprocessing.Pool`` API (see the module
    docstring). Starts miniray with ``num_cpus=processes`` if it is not running."""

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable | None = None, maxtasksperchild: int | None = None,
                 context: Any = None, ray_address: str | None = None,
                 ray_remote_args: dict | None = None):
        if processes is not None and not isinstance(processes, int):
            raise TypeError(f"processes must be an int or None, got {processes!r}")
        if maxtasksperchild is not None and (not isinstance(maxtasksperchild, int)
                                             or maxtasksperchild < 1):
            raise ValueError("maxtasksperchild must be a positive int or None, got "
                             f"{maxtasksperchild!r}")
        self._initializer = initializer
        self._initargs = tuple(initargs or ())
        self._maxtasks = maxtasksperchild
        self._closed = False
        # Guards _closed, _actors, _next_index, _stopping, _retiring.
        self._lock = threading.Lock()
        self._stopping: list = []  # __ray_terminate__ refs join() waits on
        self._actors: list = []  # [handle, batches run, its last batch's ref]
        self._retiring: list = []  # (handle, last ref): told to exit once that ref is ready
        self._next_index = 0
        if context is not None:
            # Ray 2.60 warns the same way: actors, not a start method, make the processes.
            logger.warning("The 'context' argument is not supported by miniray's Pool and is "
                           "ignored.")
        if not api.is_initialized():
            if ray_address in (None, "local"):
                api.init(num_cpus=processes)
            else:
                api.init(address=ray_address)
        self._processes = check_processes(processes, int(api.cluster_resources()["CPU"]))
        # num_cpus=0 as in Ray: the pool's size, not the scheduler, bounds its parallelism.
        self._actor_class = api.remote(num_cpus=0, **(ray_remote_args or {}))(_PoolActor)
        self._actors = [[self._new_actor(), 0, None] for _ in range(self._processes)]
        api.get([entry[0].ping.remote() for entry in self._actors])

    def _new_actor(self):
        return self._actor_class.remote(self._initializer, self._initargs)

    def _run_batch(self, func: Callable, batch: list):
        """Send ``batch`` to the next actor round-robin; replace it after ``maxtasksperchild``."""
        # Held across the submissions (which only queue): threads sharing a pool must not pick
        # the same slot, and a batch must reach its actor before that actor's __ray_terminate__.
        with self._lock:
            self._check_running()
            index = self._next_index
            self._next_index = (index + 1) % self._processes
            entry = self._actors[index]
            ref = entry[0].run_batch.remote(func, batch)
            entry[1] += 1
            entry[2] = ref
            if self._maxtasks is not None and entry[1] >= self._maxtasks:
                self._retire_locked(entry[0], ref)
                self._actors[index] = [self._new_actor(), 0, None]
        return ref

    def _retire_locked(self, actor, last_ref) -> None:
        """Have ``actor`` exit once ``last_ref`` is ready (caller holds the lock).

        __ray_terminate__ is sent only once the last batch's result is in: sent at once, the
        exit can race the batch's reply and fail a batch that ran.
        """
        self._retiring.append((actor, last_ref))
        self._reap_locked()

    def _reap_locked(self) -> None:
        """Send __ray_terminate__ to each retiring actor whose last batch is done."""
        pending = [ref for _, ref in self._retiring if ref is not None]
        ready = set(api.wait(pending, num_returns=len(pending), timeout=0)[0]) if pending else ()
        still = []
        for actor, ref in self._retiring:
            if ref is None or ref in ready:
                self._stopping.append(actor.__ray_terminate__.remote())
            else:
                still.append((actor, ref))
        self._retiring = still

    def _check_running(self) -> None:
        if self._closed:
            raise ValueError("Pool not running")

    # ------------------------------------------------------------------------- the API
    def apply(self, func: Callable, args: tuple | None = None, kwargs: dict | None = None):
        """``func(*args, **kwargs)`` on one pool process; its value or its exception."""
        return self.apply_async(func, args, kwargs).get()

    def apply_async(self, func: Callable, args: tuple | None = None,
                    kwargs: dict | None = None, callback: Callable | None = None,
                    error_callback: Callable | None = None) -> AsyncResult:
        """``apply`` without waiting: an ``AsyncResult``; a callback gets the value, an
        error callback the exception."""
        self._check_running()
        ref = self._run_batch(func, [(args, kwargs)])
        return AsyncResult([ref], callback, error_callback, single_result=True)

    def _map_async(self, func, iterable, chunksize, unpack_args, callback=None,
                   error_callback=None) -> AsyncResult:
        self._check_running()
        items = iterable if hasattr(iterable, "__len__") else list(iterable)
        if chunksize is None:
            chunksize = default_chunksize(len(items), self._processes)
        refs = [self._run_batch(func, chunk)
                for chunk in make_chunks(items, chunksize or 1, unpack_args)]
        return AsyncResult(refs, callback, error_callback)

    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``[func(x) for x in iterable]`` in chunks over the pool, in order."""
        return self._map_async(func, iterable, chunksize, unpack_args=False).get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None,
                  error_callback: Callable | None = None) -> AsyncResult:
        """``map`` without waiting: an ``AsyncResult`` of the list."""
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``[func(*args) for args in iterable]`` in chunks over the pool, in order."""
        return self._map_async(func, iterable, chunksize, unpack_args=True).get()

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None,
                      error_callback: Callable | None = None) -> AsyncResult:
        """``starmap`` without waiting: an ``AsyncResult`` of the list."""
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def imap(self, func: Callable, iterable: Iterable, chunksize: int | None = 1):
        """An iterator of ``func(x)`` in order, one chunk in flight per process."""
        self._check_running()
        return IMapIterator(self, func, iterable, chunksize, ordered=True)

    def imap_unordered(self, func: Callable, iterable: Iterable, chunksize: int | None = 1):
        """An iterator of ``func(x)`` as they finish, one chunk in flight per process."""
        self._check_running()
        return IMapIterator(self, func, iterable, chunksize, ordered=False)

    # ------------------------------------------------------------------------- lifetime
    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.terminate()

    def close(self) -> None:
        """Accept no more work; queued work finishes, then each actor exits (told to when its
        last batch is done: here, or in ``join``; dropping the pool also ends them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for actor, _, last_ref in self._actors:
                self._retire_locked(actor, last_ref)

    def terminate(self) -> None:
        """Accept no more work and kill every actor now."""
        self.close()
        with self._lock:
            actors = [entry[0] for entry in self._actors]
            actors += [actor for actor, _ in self._retiring]
        for actor in actors:
            api.kill(actor)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the actors of a closed pool to exit."""
        if not self._closed:
            raise ValueError("Pool is still running")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                self._reap_locked()
                pending = [ref for _, ref in self._retiring]
                if not pending:
                    stopping, self._stopping = self._stopping, []
                    break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            # Outside the lock: other threads may still use the pool's bookkeeping meanwhile.
            api.wait(pending, num_returns=len(pending), timeout=left)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if stopping:
            _, rest = api.wait(stopping, num_returns=len(stopping), timeout=left)
            with self._lock:
                self._stopping += rest
