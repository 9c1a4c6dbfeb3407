"""Whether anybody holds an flock(2) on a file, asked without keeping one.

Owns: the probe: open the file, try an exclusive lock without waiting, close it (which drops
the lock this probe may have taken, and no other). Does not own: who takes the locks being
asked about (a session's owner on ``owner.lock``, each reader of a store segment on the
segment) nor what a free lock means to the caller. Called by ``session.py`` (a dead session's
owner lock is free) and ``object_store/shm_segments.py`` (a segment nobody maps any more).

A lock on a file belongs to its open file description, so it is free only once every
process that shares the holder's descriptor (a forked child too) has closed it or ended, in
any PID namespace: the kernel answers this, not a record that could be stale.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["lock_free"]


def lock_free(path: str) -> bool:
    """True when nobody holds a lock on ``path`` now; False when somebody does, or when
    ``path`` is missing, a symbolic link or cannot be opened (nothing is proven free)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # never LOCK_UN: closing drops only this open file's lock
    return True
