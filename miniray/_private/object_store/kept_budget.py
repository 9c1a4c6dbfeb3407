"""The bytes one remote driver's link keeps on a node, counted in a file that the link's
workers share with the node (issue 16, results kept on their node; docs/remote-objects.md,
"The cap per driver").

Owns: the budget file ``mr_<link tag>_budget`` in the node's shm dir, holding in ASCII the
bytes the link's workers reserved for the results they keep (booked by the node, or being
written), and its three changes, each a short read-modify-write under an exclusive flock:
``create`` (0), ``reserve`` (up to a cap) and ``release``. Does not own: the cap (the node's
``MINIRAY_KEPT_BYTES_PER_DRIVER``, told to the workers in HELLO as ``keep_max``), the book of
kept objects (``node/kept_objects.py``), or writing segments (``worker_api.payload_for``).
Called by: the node (``remote_drivers.RemoteDrivers``: ``create`` when it serves a link,
``release`` when it frees a booked object or refuses a worker's segment) and a remote
driver's worker (``reserve`` before it writes a result it keeps, ``release`` when that write
fails).

Lifetime: named with the link's tag, the file goes with every segment of the link (the tag
sweep when the link closes or is fenced, or a later sweeper's once the node is dead). A
worker never creates it: when it is missing the link is gone, and nothing is kept.

Why it holds: a worker reserves before it writes, so whatever the link's segments hold
(booked or not) was reserved first, and the node releases a booked object's bytes only
after its book dropped it: the book never holds more than the file, which never exceeds the
cap. A worker that dies between its reservation and the node's book leaves its bytes
reserved until the link closes (the cap errs on the safe side).
"""

from __future__ import annotations

import fcntl
import os

from miniray._private.host import same_uid
from miniray._private.object_store.shm_segments import SEGMENT_PREFIX, check_tag

__all__ = ["budget_path", "create", "release", "reserve", "used"]

_MAX_TEXT = 32  # an int of up to 20 digits and some slack


def budget_path(shm_dir: str, tag: str) -> str:
    """``<shm_dir>/mr_<tag>_budget``: swept with the tag's segments (``tag_of`` reads it)."""
    return os.path.join(shm_dir, f"{SEGMENT_PREFIX}{check_tag(tag)}_budget")


def create(shm_dir: str, tag: str) -> str:
    """The node serves a link: its budget file, at 0 (a stale one of the same tag reset).
    Returns its path; OSError when the shm dir cannot hold it, InsecurePathError when
    another user's file or a non-regular one has its name."""
    path = budget_path(shm_dir, tag)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        same_uid.check_owned_fd(fd, path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write(fd, 0)
    finally:
        os.close(fd)
    return path


def reserve(shm_dir: str, tag: str, size: int, cap: int) -> bool:
    """Count ``size`` more bytes for the link if that stays within ``cap``: True; False
    past it, or when the file is missing (the link is gone), unreadable or not this uid's."""
    if size < 0 or size > cap:
        return False
    try:
        fd = _open(shm_dir, tag)
    except (OSError, same_uid.InsecurePathError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = _read(fd)
        if now + size > cap:
            return False
        _write(fd, now + size)
        return True
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


def release(shm_dir: str, tag: str, size: int) -> None:
    """Count ``size`` bytes fewer (never below 0); nothing when the file is gone."""
    try:
        fd = _open(shm_dir, tag)
    except (OSError, same_uid.InsecurePathError):
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = _read(fd)
        except ValueError:
            now = 0
        _write(fd, max(0, now - max(0, size)))
    except OSError:
        pass
    finally:
        os.close(fd)


def used(shm_dir: str, tag: str) -> int | None:
    """The bytes reserved now; None when the file is missing or unreadable."""
    try:
        fd = _open(shm_dir, tag)
    except (OSError, same_uid.InsecurePathError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return _read(fd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _open(shm_dir: str, tag: str) -> int:
    """The budget file, opened; OSError (as a missing file) when ``tag`` is no tag: a
    dropped link's (None), whose file went with its sweep."""
    try:
        path = budget_path(shm_dir, tag)
    except (TypeError, ValueError) as error:
        raise FileNotFoundError(f"no budget file for tag {tag!r}: {error}") from None
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        same_uid.check_owned_fd(fd, path)  # another user's file is never trusted
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(fd: int) -> int:
    text = os.pread(fd, _MAX_TEXT, 0).strip()
    return int(text) if text else 0


def _write(fd: int, value: int) -> None:
    data = b"%d" % value
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
