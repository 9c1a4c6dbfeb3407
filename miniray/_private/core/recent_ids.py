"""``RecentIds``: a set of ids that keeps only the newest ``limit`` of them (pure).

Owns: the bound. A worker records the id of every call it is told to cancel, because the
CANCEL (control socket) may come before the call itself (data socket); the ids it never sees
again (each CANCEL that came after its call had ended) would otherwise pile up for the
worker's whole life. Past ``limit`` ids the oldest is dropped: a worker has at most a handful
of calls sent ahead of it, so an id that old names a call that has long ended. Called by
``worker/worker_main.py`` and ``worker/actor_host.py``, under their own locks.

Example:
    >>> marks = RecentIds(limit=2)
    >>> for task_id in (b"a", b"b", b"c"):
    ...     marks.add(task_id)
    >>> b"a" in marks, b"c" in marks, len(marks)
    (False, True, 2)
    >>> marks.discard(b"c"); marks.discard(b"zz")
    >>> sorted(marks)
    [b'b']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

DEFAULT_LIMIT = 1024


class RecentIds:
    __slots__ = ("_ids", "limit")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._ids: dict[bytes, None] = {}  # insertion order: oldest first
        self.limit = limit

    def add(self, task_id: bytes) -> None:
        ids = self._ids
        ids.pop(task_id, None)  # added again: now the newest
        ids[task_id] = None
        if len(ids) > self.limit:
            del ids[next(iter(ids))]

    def update(self, task_ids: Iterable[bytes]) -> None:
        for task_id in task_ids:
            self.add(task_id)

    def discard(self, task_id: bytes) -> None:
        self._ids.pop(task_id, None)

    def clear(self) -> None:
        self._ids.clear()

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._ids)
