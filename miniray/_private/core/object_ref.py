"""ObjectRef: the handle to a value that exists, or will exist, in the object store.

Owns: the ObjectRef class (public as ``miniray.ObjectRef``; ``owned_ref()`` makes a new id's
ref without the checks), its hashing, equality, pickling and
awaiting; and ``DynamicObjectRefGenerator``, the refs a ``num_returns="dynamic"`` task
returns (built in the worker, so it lives in this lowest layer). Does not own: the values
(``owner.py`` / ``object_store.py``) or reference counting decisions (the owner decides; an
ObjectRef only reports that it was created, pickled or dropped).
Called by: everything that creates or passes refs.

Mirrors ``ray.ObjectRef`` (Ray 2.60). Differs: ``owner_address()`` and ``call_site()`` return
empty values (``b""``, ``""``); ``tensor_transport()`` returns None.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from typing import Any, Generic

from miniray._private.core import context, ids, serialization
from miniray._private.core.type_vars import T


class ObjectRef(Generic[T]):
    """A reference to an object in miniray's object store.

    ``ObjectRef[T]`` is what a type checker sees for a value of type ``T``: ``put`` of a ``T``
    returns one, and ``get`` of one returns a ``T``.

    Example:
        >>> ref = ray.put(1)
        >>> ray.get(ref)
        1
    """

    __slots__ = ("_id", "_token", "__weakref__")

    def __init__(self, binary: bytes, _token: Any = None):
        if not isinstance(binary, bytes) or len(binary) != ids.OBJECT_ID_SIZE:
            raise ValueError(f"ObjectRef needs {ids.OBJECT_ID_SIZE} bytes, got {binary!r}")
        self._id = binary
        tracker = context.current()
        if _token is None and tracker is not None:
            _token = tracker.session_token
        self._token = _token
        if tracker is not None and _token is tracker.session_token:
            tracker.ref_created(binary)

    def __del__(self):
        tracker = context.current()
        if tracker is not None and self._token is tracker.session_token:
            try:
                tracker.ref_dropped(self._id)
            except Exception:  # interpreter shutdown: nothing left to free
                pass

    # -- identity -------------------------------------------------------------------
    def binary(self) -> bytes:
        return self._id

    def hex(self) -> str:
        return self._id.hex()

    def redis_shard_hash(self) -> int:
        """A stable 64-bit hash of the id (Ray's shard key; the same in every process)."""
        return int.from_bytes(self._id[:8], "little") ^ int.from_bytes(self._id[-8:], "little")

    def task_id(self) -> ids.TaskID:
        """The task that creates the object (for a put, an id of its own), as a ``TaskID``:
        its ``hex()`` is what ``get_task_id()`` returns inside that task."""
        return ids.TaskID(self._id[: ids.TASK_ID_SIZE])

    def job_id(self) -> ids.JobID:
        """The job of the task that creates the object; ValueError for the nil ref."""
        return self.task_id().job_id()

    def is_nil(self) -> bool:
        return self._id == b"\xff" * ids.OBJECT_ID_SIZE

    @classmethod
    def nil(cls) -> ObjectRef:
        return cls(b"\xff" * ids.OBJECT_ID_SIZE, _token=False)

    @classmethod
    def from_binary(cls, binary: bytes) -> ObjectRef:
        return cls(binary)

    @classmethod
    def from_hex(cls, hex_id: str) -> ObjectRef:
        return cls(bytes.fromhex(hex_id))

    @classmethod
    def from_random(cls) -> ObjectRef:
        return cls(ids.new_put_id(), _token=False)

    def owner_address(self) -> bytes:
        return b""  # Ray: the owner's serialized address (bytes); one host has no addresses

    def call_site(self) -> str:
        return ""

    @classmethod
    def size(cls) -> int:
        """28, the size of an object id in bytes; a class method, as Ray's (``ObjectID.size()``)."""
        return ids.OBJECT_ID_SIZE

    def tensor_transport(self):
        return None

    def __hash__(self) -> int:
        return hash(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"ObjectRef({self._id.hex()})"

    # -- pickling -------------------------------------------------------------------
    def __reduce__(self):
        collected = serialization.collected_ids()
        if collected is not None:
            collected.append(self._id)
        else:
            tracker = context.current()
            if tracker is not None and self._token is tracker.session_token:
                tracker.ref_pickled(self._id)  # who reads it is unknown: kept until shutdown
        return (_rebuild_ref, (self._id,))

    # -- futures --------------------------------------------------------------------
    def future(self) -> concurrent.futures.Future:
        """A ``concurrent.futures.Future`` resolving to the value (or raising its error)."""
        return context.auto_init().as_future(self)

    def as_future(self) -> asyncio.Future:
        """An ``asyncio.Future`` for the running loop, resolving to the value."""
        return asyncio.wrap_future(self.future())

    def __await__(self):
        return self.as_future().__await__()


def owned_ref(binary: bytes, tracker) -> ObjectRef:
    """What ``ObjectRef(binary)`` makes, for an id that ``tracker`` (the current runtime)
    has just made: a submission's return ref, built without the constructor's checks and
    look-up of the runtime (one task's submission pays this once per return)."""
    ref = _new_ref(ObjectRef)
    ref._id = binary
    ref._token = tracker.session_token
    tracker.ref_created(binary)
    return ref


_new_ref = object.__new__


def _rebuild_ref(binary: bytes) -> ObjectRef:
    return ObjectRef(binary)


ObjectRef.__module__ = "miniray"


class DynamicObjectRefGenerator:
    """The value of a ``num_returns="dynamic"`` task's ref: one ObjectRef per value the
    generator yielded. Iterating it hands each ref out once.

    Mirrors ``ray.DynamicObjectRefGenerator`` (Ray 2.60; ``num_returns="dynamic"`` is
    deprecated there in favour of ``"streaming"``).

    Example:
        >>> @ray.remote(num_returns="dynamic")
        ... def count(n):
        ...     for i in range(n):
        ...         yield i
        >>> [ray.get(ref) for ref in ray.get(count.remote(3))]
        [0, 1, 2]
    """

    def __init__(self, refs):
        self._refs = collections.deque(refs)

    def __iter__(self):
        while self._refs:
            yield self._refs.popleft()

    def __len__(self) -> int:
        return len(self._refs)


# Where Ray defines it; that module re-exports this class.
DynamicObjectRefGenerator.__module__ = "miniray._private.object_ref_generator"
