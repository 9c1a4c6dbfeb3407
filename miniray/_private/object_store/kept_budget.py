"""The bytes one remote driver's link keeps on a node, counted in a file that the link's
workers share with the node (issue 16, results kept on their node; docs/remote-objects.md,
"The cap per driver").

Owns: the budget file ``mr_<link tag>_budget`` in the node's shm dir and its changes, each
a short read-modify-write under an exclusive flock: ``create`` (empty), ``reserve`` (a
worker's result, up to a cap), ``unreserve`` (that write failed, or the node refused the
segment), ``book`` (the node's book took it), ``release`` (the node freed booked bytes)
and ``reconcile`` (reservations of dead workers given back), each of the last four also an
op (a tuple) that ``change`` applies, several under one hold of the lock, and the pure
arithmetic of them (``apply_ops``, ``settle``). Does not own: the cap (the node's
``MINIRAY_KEPT_BYTES_PER_DRIVER``, told to the workers in HELLO as ``keep_max``), the book
of kept objects (``node/kept_objects.py``), or writing segments
(``worker_api.payload_for``).
Called by: the node (``remote_drivers.RemoteDrivers``, ``kept_serving``: ``create`` when
it serves a link; ``change`` with a bounded wait, ``wait_s``, for the ops of a book, a
free, a refusal or a worker's exit, so that a worker stopped (SIGSTOP) inside its short
hold of the lock never stalls the node's loop: ``BudgetBusy``, and the node keeps the ops
in order and tries again; its own fetches reserve as a worker does, with the same bound,
and a busy file counts as a refusal) and a remote driver's worker (``reserve`` before it
writes a result it keeps, ``unreserve`` when that write fails; both wait for the lock).

The file, ASCII::

    <booked bytes>\\n                       what the node's book holds for the link
    <pid> <object id hex> <size>\\n         one line per reservation not booked yet
    end\\n                                  the end: what may follow is ignored

A change writes the whole file from its start, then truncates it: a writer killed
between the two leaves the new text, its ``end`` line, and a tail of the old, which the
``end`` line keeps out.

The link's total is the booked bytes plus every reservation; a reservation names its
worker, so that one which died before its result reached the book (SIGKILL, OOM) is given
back exactly (``settle``): when the node hears of its exit (``reconcile``), or when a
worker's reservation is refused for the cap (each reservation's pid checked with
``kill(pid, 0)``; a zombie or a reused pid counts as alive: the safe side). A dead
worker's reservation whose segment file exists stays counted (the bytes are in the shm
dir, and the driver may still book it) until the node books it or the link closes.

Lifetime: named with the link's tag, the file goes with every segment of the link (the tag
sweep when the link closes or is fenced, or a later sweeper's once the node is dead). A
worker never creates it: when it is missing the link is gone, and nothing is kept.

A change the node could not make yet (``BudgetBusy``) only ever leaves the file counting
more than the book holds (a reservation not yet booked or given back, bytes not yet
released), never less: a late change errs on the side of sending a value instead of
keeping it.

Why it holds: a worker reserves before it writes, so whatever the link's segments hold
(booked or not) was reserved first, and the node takes an object's bytes off the booked
count only after its book dropped it: the book never holds more than the file, which never
exceeds the cap.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Callable, Iterable, NamedTuple, Sequence

from miniray._private.host import same_uid
from miniray._private.object_store.shm_segments import SEGMENT_PREFIX, check_tag

__all__ = ["BudgetBusy", "Reservation", "apply_ops", "book", "budget_path", "change",
           "create", "reconcile", "release", "reserve", "reservations", "settle",
           "unreserve", "used"]

_READ = 1 << 16  # one read holds the booked count and some 700 reservations; more: loop
_POLL_S = 0.0005  # a bounded wait tries the lock this often


class BudgetBusy(TimeoutError):
    """The budget file's lock was not free within the wait given (a worker stopped, or
    very slow, inside its hold of it): nothing was changed; try again later."""


class Reservation(NamedTuple):
    """A worker's reservation not booked yet: its pid, the object id (hex) and the bytes."""

    pid: int
    object_hex: str
    size: int


def budget_path(shm_dir: str, tag: str) -> str:
    """``<shm_dir>/mr_<tag>_budget``: swept with the tag's segments (``tag_of`` reads it)."""
    return os.path.join(shm_dir, f"{SEGMENT_PREFIX}{check_tag(tag)}_budget")


def settle(booked: int, entries: list[Reservation], dead: Callable[[int], bool],
           has_file: Callable[[str], bool], book_bytes: int | None = None
           ) -> tuple[int, list[Reservation], int]:
    """The pure reconcile: ``(booked, reservations kept, bytes given back)``. A reservation
    goes when its worker is ``dead`` and its segment never came (``has_file`` of its object
    id hex is false); ``book_bytes`` (the node's book, when the node reconciles) replaces the
    booked count.

    >>> entries = [Reservation(7, "aa", 10), Reservation(8, "bb", 20), Reservation(7, "cc", 5)]
    >>> booked, kept, back = settle(100, entries, dead=lambda pid: pid == 7,
    ...                             has_file=lambda oid: oid == "cc")
    >>> booked, [entry.object_hex for entry in kept], back
    (100, ['bb', 'cc'], 10)
    >>> settle(100, [], dead=lambda pid: True, has_file=lambda oid: False, book_bytes=60)
    (60, [], 40)
    """
    kept = [e for e in entries if not (dead(e.pid) and not has_file(e.object_hex))]
    new_booked = booked if book_bytes is None else max(0, book_bytes)
    before = booked + sum(e.size for e in entries)
    after = new_booked + sum(e.size for e in kept)
    return new_booked, kept, max(0, before - after)


def apply_ops(booked: int, entries: list[Reservation], ops: Sequence[tuple],
              dead: Callable[[int], bool], has_file: Callable[[str], bool]
              ) -> tuple[int, list[Reservation]]:
    """The pure change of ``ops``, in order, to ``(booked, entries)``. An op is
    ``("book", object hex, size)``: its reservations become booked bytes; ``("release",
    size)``: booked bytes freed (never below 0); ``("unreserve", object hex, pid or
    None)``: its reservations (that pid's only) go; ``("reconcile", book bytes or None,
    dead pids)``: ``settle`` (``dead``, or one of those pids).

    >>> ops = [("book", "aa", 10), ("release", 4), ("unreserve", "bb", None),
    ...        ("reconcile", None, (9,))]
    >>> entries = [Reservation(7, "aa", 10), Reservation(8, "bb", 20),
    ...            Reservation(9, "cc", 5), Reservation(7, "dd", 1)]
    >>> apply_ops(0, entries, ops, dead=lambda pid: False, has_file=lambda oid: False)
    (6, [Reservation(pid=7, object_hex='dd', size=1)])
    """
    for op in ops:
        kind = op[0]
        if kind == "book":
            booked += max(0, op[2])
            entries = [e for e in entries if e.object_hex != op[1]]
        elif kind == "release":
            booked = max(0, booked - max(0, op[1]))
        elif kind == "unreserve":
            entries = [e for e in entries
                       if not (e.object_hex == op[1] and op[2] in (None, e.pid))]
        elif kind == "reconcile":
            gone = set(op[2])
            booked, entries, _back = settle(booked, entries,
                                            lambda pid, gone=gone: pid in gone or dead(pid),
                                            has_file, op[1])
        else:
            raise ValueError(f"miniray bug: no budget op {kind!r}")
    return booked, entries


def create(shm_dir: str, tag: str) -> str:
    """The node serves a link: its budget file, at 0 (a stale one of the same tag reset).
    Returns its path; OSError when the shm dir cannot hold it, InsecurePathError when
    another user's file or a non-regular one has its name."""
    path = budget_path(shm_dir, tag)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        same_uid.check_owned_fd(fd, path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write(fd, 0, [])
    finally:
        os.close(fd)
    return path


def reserve(shm_dir: str, tag: str, size: int, cap: int, object_id: bytes = b"",
            pid: int | None = None, wait_s: float | None = None) -> bool:
    """Count ``size`` more bytes for the link, as ``object_id``'s reservation by ``pid``
    (this process by default), if that stays within ``cap``: True. Past it, dead workers'
    reservations are given back first (``settle``) and it is tried once more. False past
    the cap, or when the file is missing (the link is gone), unreadable or not this uid's,
    or its lock is not free within ``wait_s`` seconds (None: wait for it)."""
    if size < 0 or size > cap:
        return False
    try:
        fd = _open(shm_dir, tag)
    except (OSError, same_uid.InsecurePathError):
        return False
    try:
        _lock(fd, wait_s)
        data = _read_bytes(fd)
        mine = Reservation(os.getpid() if pid is None else pid, object_id.hex(), size)
        # The fast path, on a whole file (its one ``end`` line last): the last field of
        # every line before it is a byte count; the new line written over ``end``.
        body = len(data) - 4
        if body >= 0 and data.find(b"end") == body and sum(
                int(item.rsplit(b" ", 1)[-1]) for item in data[:body].split(b"\n")
                if item) + size <= cap:
            os.pwrite(fd, b"%d %s %d\nend\n" % (mine.pid, mine.object_hex.encode("ascii"),
                                                size), body)
            return True
        booked, entries = _parse(data)
        booked, entries, back = settle(booked, entries, _dead, _has_file(shm_dir, tag))
        if booked + sum(e.size for e in entries) + size > cap:
            if back:
                _write(fd, booked, entries)
            return False
        _write(fd, booked, [*entries, mine])
        return True
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


def unreserve(shm_dir: str, tag: str, object_id: bytes, pid: int | None = None) -> int:
    """``object_id``'s reservation goes (``pid``'s only, or every one when None): its
    write failed, or the node refused or unlinked the segment. Returns the bytes given
    back; 0 when the file is gone."""
    return change(shm_dir, tag, [("unreserve", object_id.hex(), pid)])


def book(shm_dir: str, tag: str, object_id: bytes, size: int) -> None:
    """The node's book took ``object_id`` (``size`` bytes): its reservations become booked
    bytes (one file, whoever reserved it)."""
    change(shm_dir, tag, [("book", object_id.hex(), size)])


def release(shm_dir: str, tag: str, size: int) -> None:
    """The node freed ``size`` booked bytes (never below 0); nothing when the file is gone."""
    change(shm_dir, tag, [("release", size)])


def reconcile(shm_dir: str, tag: str, book_bytes: int | None = None,
              dead: Iterable[int] = ()) -> int:
    """Give back the reservations of dead workers whose segments never came (``settle``;
    ``dead``: pids known dead, the others are checked with ``kill(pid, 0)``) and, from the
    node, set the booked count to its book's ``book_bytes``. Returns the bytes given back."""
    return change(shm_dir, tag, [("reconcile", book_bytes, tuple(dead))])


def change(shm_dir: str, tag: str, ops: Sequence[tuple], wait_s: float | None = None) -> int:
    """``ops`` (``apply_ops``) under one hold of the lock, decided on what the file holds
    then; the bytes the total went down by. Nothing when the file is gone or unreadable
    (0). ``wait_s``: at most this long for the lock, then BudgetBusy and nothing changed
    (None: wait for it)."""
    has_file = _has_file(shm_dir, tag)
    return _change(shm_dir, tag, lambda booked, entries: apply_ops(
        booked, entries, ops, _dead, has_file), wait_s)


def used(shm_dir: str, tag: str) -> int | None:
    """The bytes counted now (booked and reserved); None when the file is missing or
    unreadable."""
    state = reservations(shm_dir, tag)
    return None if state is None else state[0] + sum(e.size for e in state[1])


def reservations(shm_dir: str, tag: str) -> tuple[int, list[Reservation]] | None:
    """``(booked bytes, reservations)``; None when the file is missing or unreadable."""
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


def _change(shm_dir: str, tag: str, decide, wait_s: float | None = None) -> int:
    """``decide(booked, entries) -> (booked, entries)`` under the lock; the bytes the total
    went down by. Nothing when the file is gone or unreadable; BudgetBusy (nothing changed)
    when the lock is not free within ``wait_s``."""
    try:
        fd = _open(shm_dir, tag)
    except (OSError, same_uid.InsecurePathError):
        return 0
    try:
        _lock(fd, wait_s)
        try:
            booked, entries = _read(fd)
        except ValueError:
            booked, entries = 0, []
        new_booked, new_entries = decide(booked, entries)
        _write(fd, new_booked, new_entries)
        before = booked + sum(e.size for e in entries)
        return max(0, before - new_booked - sum(e.size for e in new_entries))
    except BudgetBusy:
        raise
    except OSError:
        return 0
    finally:
        os.close(fd)


def _lock(fd: int, wait_s: float | None) -> None:
    """The exclusive lock of the budget file ``fd``: waited for (``wait_s`` None), else
    tried every ``_POLL_S`` until ``wait_s`` passed: BudgetBusy. Closing ``fd`` drops it."""
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise BudgetBusy(f"the budget file's lock was not free within {wait_s:g} s "
                             "(a worker of the link holds it: stopped, or very slow)")
        time.sleep(_POLL_S)


def _dead(pid: int) -> bool:
    """No process ``pid`` (a zombie, a reused pid or another user's counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _has_file(shm_dir: str, tag: str) -> Callable[[str], bool]:
    prefix = os.path.join(shm_dir, f"{SEGMENT_PREFIX}{tag}_")
    return lambda object_hex: os.path.lexists(prefix + object_hex)


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


def _read(fd: int) -> tuple[int, list[Reservation]]:
    return _parse(_read_bytes(fd))


def _read_bytes(fd: int) -> bytes:
    data = os.pread(fd, _READ, 0)
    while len(data) % _READ == 0 and data:
        more = os.pread(fd, _READ, len(data))
        if not more:
            break
        data += more
    return data


def _parse(data: bytes) -> tuple[int, list[Reservation]]:
    """``(booked, reservations)`` up to the ``end`` line (a torn write's old tail after it
    is ignored); ValueError for a file that is not this format (an earlier version's
    single number, without ``end``, reads as booked bytes).

    >>> _parse(b"10\\n7 ab 5\\nend\\n9 cd 4\\nen")
    (10, [Reservation(pid=7, object_hex='ab', size=5)])
    """
    lines = data.split(b"\n")
    head = lines[0].strip()
    booked = int(head) if head else 0
    entries = []
    for line in lines[1:]:
        if line == b"end":
            break
        if line:
            pid, object_hex, size = line.split(b" ")
            entries.append(Reservation(int(pid), object_hex.decode("ascii"), int(size)))
    return booked, entries


def _write(fd: int, booked: int, entries: list[Reservation]) -> None:
    data = b"%d\n" % booked + b"".join(
        b"%d %s %d\n" % (e.pid, e.object_hex.encode("ascii"), e.size) for e in entries
    ) + b"end\n"
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
