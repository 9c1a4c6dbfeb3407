"""Identifiers: task, object, node, job and worker ids.

Owns: id generation and their hex forms, sized as Ray's (object 28 bytes / 56 hex, task 24 bytes
/ 48 hex, node 28 bytes / 56 hex, actor 16 bytes / 32 hex, job 4 bytes / 8 hex), and the id
objects (``JobID``, ``NodeID``, ``TaskID``, ``ActorID``, ``PlacementGroupID``) that Ray's
deprecated ``RuntimeContext`` properties return.
Does not own: the ObjectRef class (``object_ref.py``).
Called by: the owner, the worker, the runtime.

Ids are a per-process random prefix plus a counter, so making one costs no system call and two
processes never collide.
"""

from __future__ import annotations

import itertools
import os
import threading

_lock = threading.Lock()
_prefix = b""
_prefix_pid = -1
_counter = itertools.count(1)

TASK_ID_SIZE = 24
OBJECT_ID_SIZE = 28
NODE_ID_SIZE = 28
ACTOR_ID_SIZE = 16
JOB_ID = "01000000"


def _process_prefix() -> bytes:
    global _prefix, _prefix_pid, _counter
    pid = os.getpid()
    if _prefix_pid != pid:  # first use, or a forked child: never reuse the parent's ids
        with _lock:
            if _prefix_pid != pid:
                _prefix = os.urandom(14)
                _counter = itertools.count(1)
                _prefix_pid = pid
    return _prefix


def new_task_id() -> bytes:
    """A fresh 24-byte task id: 14 random bytes of this process, then a 10-byte counter."""
    prefix = _process_prefix()
    return prefix + next(_counter).to_bytes(10, "big")


def object_id_for(task_id: bytes, index: int) -> bytes:
    """The id of return value ``index`` (1-based) of ``task_id``; puts use index 0."""
    return task_id + index.to_bytes(4, "big")


def new_put_id() -> bytes:
    return object_id_for(new_task_id(), 0)


def random_hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()


class BaseID:
    """An id as an object, as the deprecated ``RuntimeContext`` properties return them
    (Ray's ``JobID``, ``NodeID``, ...): ``hex()``, ``binary()``, ``is_nil()``, and a repr
    ``JobID(01000000)``. Equal when of one class with the same bytes."""

    __slots__ = ("_id",)
    SIZE = 0

    def __init__(self, id_bytes: bytes):
        if len(id_bytes) != self.SIZE:
            raise ValueError(f"{type(self).__name__} must be {self.SIZE} bytes, "
                             f"got {len(id_bytes)}.")
        self._id = bytes(id_bytes)

    @classmethod
    def from_hex(cls, hex_id: str):
        return cls(bytes.fromhex(hex_id))

    @classmethod
    def nil(cls):
        return cls(b"\xff" * cls.SIZE)

    @classmethod
    def size(cls) -> int:
        return cls.SIZE

    def binary(self) -> bytes:
        return self._id

    def hex(self) -> str:
        return self._id.hex()

    def is_nil(self) -> bool:
        return self._id == b"\xff" * self.SIZE

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._id == self._id

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.hex()})"

    def __reduce__(self):
        return (type(self), (self._id,))


class JobID(BaseID):
    __slots__ = ()
    SIZE = 4


class NodeID(BaseID):
    __slots__ = ()
    SIZE = NODE_ID_SIZE


class TaskID(BaseID):
    __slots__ = ()
    SIZE = TASK_ID_SIZE


class ActorID(BaseID):
    __slots__ = ()
    SIZE = ACTOR_ID_SIZE


class PlacementGroupID(BaseID):
    __slots__ = ()
    SIZE = 18
