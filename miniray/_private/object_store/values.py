"""Object payloads: what travels for one object, and turning it back into a value.

Owns: the two forms of a payload and reading them in any process, and getting values through a
runtime (``get_values``, ``materialize``: a value, or the error it holds, raised; ``future_of``)
for ``get``, ``ObjectRef.future()`` and a worker's API alike. Does not own: where objects are
kept (``shm_store.py``), or who may read them (the owner pins what it hands out).
Called by: api.py (get), runtime.py and worker_api.py (futures), worker_main.py (task
arguments), owner.py and actors.py (building payloads).

A payload is either ``bytes`` (an in-band pickle: small values and every error) or a location
tuple ``("shm", path, size)`` / ``("spilled", path, size)`` for a large object, which the reader
maps read-only: numpy arrays come back as read-only views of the shared memory, no copy. A
worker for a driver on another host receives a large object's bytes instead: ``("peer",
buffer, size)``, loaded from that buffer the same way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from typing import Any

from miniray._private.core import oob, protocol
from miniray._private.object_store import shm_segments


def outgoing(location: tuple) -> Any:
    """A store location as a payload (inline objects travel as their bytes)."""
    return location[1] if location[0] == "inline" else location


def read(payload: Any, cache: MappingCache | None = None) -> Any:
    """The value of a payload in this process. FileNotFoundError if a segment is gone."""
    if isinstance(payload, (bytes, bytearray)):
        return oob.loads_inline(payload)
    kind, path, _size = payload
    if kind == "peer":  # a worker for a driver on another host: the bytes it received
        return oob.load_segment(memoryview(path).toreadonly(), "an object from the driver")
    if kind == "shm":
        if cache is not None:
            return cache.read(path, _size)
        return shm_segments.read_segment(path)
    if kind == "spilled":
        return shm_segments.read_spilled(path)
    raise ValueError(f"miniray bug: unknown object payload {kind!r}")


class MappingCache:
    """A worker's mappings of segments it read, kept for the next task that reads them.

    Mapping 200 MB costs ~15 ms of page-table work on every attach (no huge pages for shared
    memory here); a task that reads the same object again reuses the mapping and pays
    nothing. The *mapping* is cached, not the value: each read unpickles the small metadata
    again (the array buffers stay zero-copy views), so one task's changes to a container
    never show in the next. Keyed by (path, inode): a held mapping also holds the segment's
    shared lock, so the owner never recycles a cached segment, it only unlinks it, and
    ``prune`` (at every task start) drops mappings whose segment is gone. Bounded by bytes.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def read(self, path: str, size: int) -> Any:
        inode = os.stat(path).st_ino  # FileNotFoundError: freed or spilled meanwhile
        with self.lock:
            hit = self.entries.get(path)
            if hit is not None and hit[0] == inode:
                self.entries.move_to_end(path)
                mapping = hit[1]
            else:
                mapping = None
        if mapping is None:
            mapping = shm_segments.map_readonly(path)
            with self.lock:
                old = self.entries.pop(path, None)
                if old is not None:
                    self.bytes -= old[2]
                self.entries[path] = (inode, mapping, size)
                self.bytes += size
                while self.bytes > self.max_bytes and len(self.entries) > 1:
                    _path, (_inode, _mapping, old_size) = self.entries.popitem(last=False)
                    self.bytes -= old_size
        return shm_segments.load_mapping(mapping, path)

    def drop(self, path: str) -> None:
        """The owner freed this segment: unmap it (its memory goes back once no view of it
        is left in this process)."""
        with self.lock:
            old = self.entries.pop(path, None)
            if old is not None:
                self.bytes -= old[2]

    def prune(self) -> None:
        """Forget mappings whose segment was freed (the memory goes back once unmapped)."""
        if not self.entries:
            return
        with self.lock:
            for path, (inode, _mapping, size) in list(self.entries.items()):
                try:
                    alive = os.stat(path).st_ino == inode
                except OSError:
                    alive = False
                if not alive:
                    del self.entries[path]
                    self.bytes -= size


def materialize(kind: int, data, rt=None, object_id: bytes | None = None) -> Any:
    """A stored object's value, or raise the error it holds. ``data`` is a payload
    (see above): bytes, or where a large object lies in shared memory."""
    from miniray.exceptions import RayTaskError

    try:
        if kind == protocol.OK and not isinstance(data, (bytes, bytearray)):
            return _read_large(data, rt, object_id)
        value = oob.loads_inline(data)
    except Exception as error:
        _raise_load_error(error)
    if kind == protocol.ERR:
        try:
            if isinstance(value, RayTaskError):
                raise value.as_instanceof_cause()
            raise value
        finally:
            # The error's traceback holds this frame: without this, a cycle through
            # ``value`` keeps the caller's frames (the refs a failed get was given, and so
            # their objects) until the garbage collector runs.
            del value
    return value


def _raise_load_error(error: Exception):
    """Raise what a failed read of a value raises: miniray's own errors and a vanished
    segment as they are, anything else as a RaySystemError naming it."""
    from miniray.exceptions import RaySystemError

    if isinstance(error, (RaySystemError, FileNotFoundError)):
        raise error
    raise RaySystemError(
        f"Could not deserialize an object: {type(error).__name__}: {error}. If it refers "
        "to a module, that module must be importable in the driver too."
    ) from error


def _read_large(payload, rt, object_id):
    if rt is not None and rt.mode == "driver":
        return rt.read_value(object_id, payload)  # the store's own zero-copy view
    cache = getattr(rt, "mappings", None)
    try:
        return read(payload, cache)
    except FileNotFoundError:
        # Spilled (or moved) between the owner's reply and our mapping: ask once more.
        items = rt.get_serialized([object_id], None)
        return read(items[0][1], cache)


def future_of(rt, ref):
    """A ``concurrent.futures.Future`` for ``ref``'s value, resolved by a helper thread."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def resolve():
        try:
            value = get_values(rt, [ref])[0]
        except BaseException as error:  # delivered through the future
            _settle(future.set_exception, error)
        else:
            _settle(future.set_result, value)

    threading.Thread(target=resolve, daemon=True, name="miniray-future").start()
    return future


def _settle(setter, outcome) -> None:
    """Resolve a future, unless its waiter cancelled it meanwhile (an async actor's call
    that awaited the ref was cancelled): nobody reads it then."""
    try:
        setter(outcome)
    except concurrent.futures.InvalidStateError:
        pass


def check_session(rt, refs: list) -> None:
    token = rt.session_token
    for ref in refs:
        if ref._token is not token and ref._token is not None and ref._token is not False:
            raise ValueError(
                "You are trying to access Ray objects whose owner is unknown: "
                f"{ref!r} belongs to a session that was shut down. Objects do not survive "
                "shutdown(); create them again in this session."
            )


def get_values(rt, refs: list, timeout: float | None = None) -> list:
    if not refs:
        return []
    check_session(rt, refs)
    items = rt.get_serialized([ref._id for ref in refs], timeout)
    if items is None:
        from miniray.exceptions import GetTimeoutError

        raise GetTimeoutError("Get timed out: some object(s) not ready.")
    if len(items) == 1 and items[0][0] == protocol.ERR:
        materialize(*items[0])
    out = []
    ok, loads = protocol.OK, oob.loads_inline
    for (kind, data), ref in zip(items, refs):
        if kind == ok and type(data) is bytes:  # materialize(), inlined for a small value
            try:
                out.append(loads(data))
            except Exception as error:
                _raise_load_error(error)
        else:
            out.append(materialize(kind, data, rt, ref._id))
    return out
