"""Object payloads: what travels for one object, and turning it back into a value.

Owns: the two forms of a payload and reading them in any process. Does not own: where objects
are kept (``shm_store.py``), or who may read them (the owner pins what it hands out).
Called by: api.py (get), worker_main.py (task arguments), worker_api.py (get in a worker),
owner.py and actors.py (building payloads).

A payload is either ``bytes`` (an in-band pickle: small values and every error) or a location
tuple ``("shm", path, size)`` / ``("spilled", path, size)`` for a large object, which the reader
maps read-only: numpy arrays come back as read-only views of the shared memory, no copy.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

from miniray._private.core import oob
from miniray._private.object_store import shm_segments


def outgoing(location: tuple) -> Any:
    """A store location as a payload (inline objects travel as their bytes)."""
    return location[1] if location[0] == "inline" else location


def read(payload: Any, cache: MappingCache | None = None) -> Any:
    """The value of a payload in this process. FileNotFoundError if a segment is gone."""
    if isinstance(payload, (bytes, bytearray)):
        return oob.loads_inline(payload)
    kind, path, _size = payload
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
