"""Identifiers: task, object, node, job and worker ids, and Ray's id classes.

Owns: id generation and their hex forms, sized and laid out as Ray's (object 28 bytes / 56
hex, task 24 bytes / 48 hex, node 28 bytes / 56 hex, actor 16 bytes / 32 hex, job 4 bytes / 8
hex), and the public id classes of Ray's top level (``miniray.TaskID``, ``ActorID``, ``JobID``,
``NodeID``, ``WorkerID``, ``PlacementGroupID``, ``UniqueID``, ``FunctionID``,
``ActorClassID``; ``ObjectID`` is ``ObjectRef``, as in Ray).
Does not own: the ObjectRef class (``object_ref.py``).
Called by: the owner, the worker, the runtime, ObjectRef.

Layouts, as in Ray 2.60::

    job id     4 bytes                        01000000: the first driver of a node, then
                                              02000000... (the node numbers them)
    actor id   12 unique bytes | job id       random
    task id    8 unique bytes  | actor id     normal tasks: the nil actor of the job,
                                              ffffffffffffffffffffffff01000000
    object id  task id | 4-byte index         1.. for returns, 0 for a put

The unique part of a task id is a per-process random prefix (5 bytes) plus a counter (3
bytes), so making one costs no system call, a process never repeats one, and the prefix is
drawn again every 16M ids. Two processes collide only if they draw the same prefix: with 1,000
prefixes drawn in a session, about once in 2,000,000 sessions (Ray's own 8 bytes are a hash).
"""

from __future__ import annotations

import itertools
import os
import threading

__all__ = ["ActorClassID", "ActorID", "FunctionID", "JobID", "NodeID", "PlacementGroupID",
           "TaskID", "UniqueID", "WorkerID"]

TASK_ID_SIZE = 24
OBJECT_ID_SIZE = 28
NODE_ID_SIZE = 28
UNIQUE_ID_SIZE = 28  # Ray's UniqueID, WorkerID, FunctionID, ActorClassID
PLACEMENT_GROUP_ID_SIZE = 18
ACTOR_ID_SIZE = 16
JOB_ID = "01000000"  # this process's job: set_job_id() changes it (a node's later drivers)
NIL_JOB_ID = "ffffffff"

_UNIQUE_SIZE = 8
_PREFIX_SIZE = 5
_COUNTER_LIMIT = 1 << (8 * (_UNIQUE_SIZE - _PREFIX_SIZE))
_JOB = bytes.fromhex(JOB_ID)
_NIL_ACTOR = b"\xff" * (ACTOR_ID_SIZE - len(_JOB)) + _JOB



def job_id_for(number: int) -> str:
    """The hex job id of a node's ``number``-th driver (1, 2, ...), as Ray numbers jobs
    (``JobID.from_int``: little-endian)."""
    return number.to_bytes(len(_JOB), "little").hex()


def set_job_id(job_hex: str) -> None:
    """Make ``job_hex`` this process's job: the ids it makes from now on carry it. Called
    before any id is made: by a driver that joins a node, by a worker from HELLO."""
    global JOB_ID, _JOB, _NIL_ACTOR
    job = bytes.fromhex(job_hex)
    if len(job) != 4:
        raise ValueError(f"a job id is 4 bytes (8 hex digits), got {job_hex!r}")
    JOB_ID, _JOB = job.hex(), job
    _NIL_ACTOR = b"\xff" * (ACTOR_ID_SIZE - len(_JOB)) + _JOB


_lock = threading.Lock()
# (prefix, counter), replaced as one tuple: a thread never pairs a prefix with another
# prefix's counter. A forked child starts with none (``_forget_after_fork``), so it never
# reuses its parent's; checking the pid per id instead cost a system call per task.
_state: tuple = (b"", None)


def _forget_after_fork() -> None:
    global _state, _lock
    _state = (b"", None)
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_forget_after_fork)


def _unique() -> bytes:
    """8 bytes no other call in this session returns (see the module docstring)."""
    global _state
    while True:
        state = _state
        prefix, counter = state
        if counter is not None:  # else first use, or a forked child
            n = next(counter)
            if n < _COUNTER_LIMIT:
                return prefix + n.to_bytes(_UNIQUE_SIZE - _PREFIX_SIZE, "big")
        with _lock:
            if _state is state:
                _state = (os.urandom(_PREFIX_SIZE), itertools.count(1))


def new_task_id() -> bytes:
    """A fresh 24-byte id of a normal task (or a put): unique bytes, then the nil actor."""
    return _unique() + _NIL_ACTOR


def new_actor_task_id(actor_id: bytes) -> bytes:
    """A fresh 24-byte id of a call of actor ``actor_id``: unique bytes, then the actor id."""
    return _unique() + actor_id


def actor_creation_task_id(actor_id: bytes) -> bytes:
    """The id of the task that constructs actor ``actor_id``: nil unique bytes, then the
    actor id, as Ray's (its errors show it)."""
    return b"\xff" * _UNIQUE_SIZE + actor_id


def new_actor_id() -> bytes:
    """A fresh 16-byte actor id: 12 random bytes, then the job id."""
    return os.urandom(ACTOR_ID_SIZE - len(_JOB)) + _JOB


def object_id_for(task_id: bytes, index: int) -> bytes:
    """The id of return value ``index`` (1-based) of ``task_id``; puts use index 0."""
    return task_id + index.to_bytes(4, "big")


def stream_item_id(task_id: bytes, index: int) -> bytes:
    """The id of the ``index``-th (0-based) value a streaming generator task yields: return
    index ``index + 2``, after the completion object (index 1), as Ray numbers them."""
    return task_id + (index + 2).to_bytes(4, "big")


def new_put_id() -> bytes:
    return object_id_for(new_task_id(), 0)


def random_hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()


# ----------------------------------------------------------------------------- public classes
class _BaseID:
    """Mirrors Ray 2.60's id classes (``ray.TaskID`` ...): bytes of a fixed size, compared and
    hashed by value, pickled, shown as ``TaskID(<hex>)``; nil is every byte 0xff."""

    __slots__ = ("_binary",)
    _SIZE = 0

    def __init__(self, binary: bytes):
        if not isinstance(binary, bytes):
            raise TypeError(f"Unsupported type: {type(binary)}, expected bytes")
        if len(binary) != self._SIZE:
            raise ValueError(f"ID string needs to have length {self._SIZE}, got {len(binary)}")
        self._binary = binary

    @classmethod
    def size(cls) -> int:
        return cls._SIZE

    @classmethod
    def nil(cls):
        return cls(b"\xff" * cls._SIZE)

    @classmethod
    def from_binary(cls, binary: bytes):
        return cls(binary)

    @classmethod
    def from_hex(cls, hex_id: str):
        """Raises ValueError for a string that is not ``2 * size()`` hex digits (Ray logs an
        error and returns the nil id)."""
        if not isinstance(hex_id, str) or len(hex_id) != 2 * cls._SIZE:
            raise ValueError(
                f"{cls.__name__}.from_hex needs {2 * cls._SIZE} hex digits, got {hex_id!r}")
        return cls(bytes.fromhex(hex_id))

    def binary(self) -> bytes:
        return self._binary

    def hex(self) -> str:
        return self._binary.hex()

    def is_nil(self) -> bool:
        return self._binary == b"\xff" * self._SIZE

    def _check_not_nil(self) -> None:
        if self.is_nil():
            raise ValueError(f"{type(self).__name__} is nil")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._binary == self._binary

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._binary))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._binary.hex()})"

    __str__ = __repr__

    def __reduce__(self):
        return (type(self), (self._binary,))


class JobID(_BaseID):
    """A job's id (4 bytes). Mirrors ``ray.JobID``."""

    __slots__ = ()
    _SIZE = len(_JOB)

    @classmethod
    def from_int(cls, value: int) -> JobID:
        return cls(value.to_bytes(cls._SIZE, "little"))

    def int(self) -> int:
        return int.from_bytes(self._binary, "little")


class ActorID(_BaseID):
    """An actor's id (16 bytes: 12 unique, then its job's). Mirrors ``ray.ActorID``."""

    __slots__ = ()
    _SIZE = ACTOR_ID_SIZE

    @classmethod
    def from_random(cls) -> ActorID:
        """12 random bytes, then this job's id (Ray's draws all 16 bytes at random)."""
        return cls(new_actor_id())

    @property
    def job_id(self) -> JobID:
        """The job that created the actor (a property, as in Ray); ValueError when nil."""
        self._check_not_nil()
        return JobID(self._binary[-JobID._SIZE:])


class TaskID(_BaseID):
    """A task's id (24 bytes: 8 unique, then the actor's id, the nil actor of the job for a
    normal task). Mirrors ``ray.TaskID``; ``ObjectRef.task_id()`` returns one.

    Example:
        >>> task = TaskID.from_hex("01" * 8 + "ff" * 12 + "01000000")
        >>> task.job_id(), task.actor_id().is_nil()
        (JobID(01000000), False)
    """

    __slots__ = ()
    _SIZE = TASK_ID_SIZE

    def actor_id(self) -> ActorID:
        """The actor whose method this task runs; for a normal task the job's nil actor
        (``ffffffffffffffffffffffff01000000``, not ``is_nil()``), as in Ray."""
        return ActorID(self._binary[_UNIQUE_SIZE:])

    def job_id(self) -> JobID:
        """The job that submitted the task; ValueError for the nil TaskID, as in Ray."""
        self._check_not_nil()
        return JobID(self._binary[-JobID._SIZE:])


class _Random:
    """``from_random()``: all bytes random, as Ray's classes that have it (not JobID, TaskID)."""

    __slots__ = ()

    @classmethod
    def from_random(cls):
        return cls(os.urandom(cls._SIZE))


class NodeID(_Random, _BaseID):
    """A node's id (28 bytes). Mirrors ``ray.NodeID``; the deprecated
    ``RuntimeContext.node_id`` returns one."""

    __slots__ = ()
    _SIZE = NODE_ID_SIZE


class PlacementGroupID(_Random, _BaseID):
    """A placement group's id (18 bytes). Mirrors ``ray.PlacementGroupID``."""

    __slots__ = ()
    _SIZE = PLACEMENT_GROUP_ID_SIZE


class UniqueID(_Random, _BaseID):
    """28 random bytes. Mirrors ``ray.UniqueID``."""

    __slots__ = ()
    _SIZE = UNIQUE_ID_SIZE


class WorkerID(UniqueID):
    """A worker's id (28 bytes). Mirrors ``ray.WorkerID``."""

    __slots__ = ()


class FunctionID(UniqueID):
    """A remote function's id (28 bytes). Mirrors ``ray.FunctionID``."""

    __slots__ = ()


class ActorClassID(UniqueID):
    """An actor class's id (28 bytes). Mirrors ``ray.ActorClassID``."""

    __slots__ = ()


for _cls in (JobID, ActorID, TaskID, NodeID, PlacementGroupID, UniqueID, WorkerID, FunctionID,
             ActorClassID):
    _cls.__module__ = "miniray"
