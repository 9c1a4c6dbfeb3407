"""The object store interface, and the in-memory store of the foundation.

Owns: keeping serialized objects by id and freeing them. Does not own: when an object may be
freed (the owner decides, from reference counts) or what an object means.
Called by: owner.py only.

The interface is deliberately narrow so that the shared-memory store (POSIX segments, zero-copy
numpy, spilling) can replace this one without touching callers::

    put_serialized(object_id, data: bytes) -> None
    get_serialized(object_id) -> bytes          KeyError if absent
    contains(object_id) -> bool
    free(object_id) -> None                     idempotent
    statistics() -> dict
    close() -> None                             frees everything
"""

from __future__ import annotations

import threading


class InMemoryObjectStore:
    """Serialized objects kept in the owner's memory."""

    def __init__(self, capacity_bytes: int):
        self._objects: dict[bytes, bytes] = {}
        self._bytes = 0
        self._capacity = capacity_bytes
        self._lock = threading.Lock()

    def put_serialized(self, object_id: bytes, data: bytes) -> None:
        with self._lock:
            old = self._objects.get(object_id)
            if old is not None:
                self._bytes -= len(old)
            self._objects[object_id] = data
            self._bytes += len(data)

    def get_serialized(self, object_id: bytes) -> bytes:
        return self._objects[object_id]

    def contains(self, object_id: bytes) -> bool:
        return object_id in self._objects

    def free(self, object_id: bytes) -> None:
        with self._lock:
            data = self._objects.pop(object_id, None)
            if data is not None:
                self._bytes -= len(data)

    def statistics(self) -> dict:
        return {
            "objects": len(self._objects),
            "bytes_in_memory": self._bytes,
            "bytes_spilled": 0,
            "pinned": 0,
            "capacity": self._capacity,
        }

    def close(self) -> None:
        with self._lock:
            self._objects.clear()
            self._bytes = 0

    def __repr__(self) -> str:
        return f"<InMemoryObjectStore objects={len(self._objects)} bytes={self._bytes}>"
