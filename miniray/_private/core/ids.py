"""Identifiers: task, object, node, job and worker ids.

Owns: id generation and their hex forms, sized as Ray's (object 28 bytes / 56 hex, task 24 bytes
/ 48 hex, node 28 bytes / 56 hex, actor 16 bytes / 32 hex, job 4 bytes / 8 hex).
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
