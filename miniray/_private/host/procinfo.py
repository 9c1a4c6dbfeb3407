"""Small read-only process helpers over Linux ``/proc``.

Owns: reading a process's start time, liveness, children and memory from ``/proc``. Does not
own: signalling or reaping (the fork server does that). Called by the ledger (is a lease's
holder still the process that took it?), the owner and ``miniray status``.

A pid alone does not name a process: pids are reused. ``start_time`` (field 22 of
``/proc/<pid>/stat``, clock ticks since boot) together with the pid does, so callers that record
a pid record its start time too and pass both to ``is_alive``.

Nor does a pid mean anything outside its PID namespace and boot: a container sharing
``/dev/shm`` (or a session root) with the host sees other pids, so ``/proc`` here says nothing
about a process recorded there. Whoever records a pid records ``identity()`` (boot id and
PID namespace) with it, and ``is_provably_dead`` decides: dead only if the record is from an
earlier boot, or from this namespace and its pid no longer names the process. A record from
another namespace is never judged from here.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from typing import Callable

__all__ = ["Identity", "children", "descendants", "holder_start", "identity", "is_alive",
           "is_provably_dead", "ns_tag", "pss_bytes", "rss_bytes", "start_time"]


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat from field 3 (state) on, or None if the process is gone."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # gone (ENOENT/ESRCH), or not ours to read
        return None
    # The command name (field 2) is in parentheses and may itself contain ')' or spaces, so
    # split after the last ')'.
    end = data.rfind(b")")
    if end < 0:
        return None
    return data[end + 1 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])  # field 22; fields[0] is field 3


_own: tuple[int, int | None] | None = None


def holder_start(pid: int) -> int | None:
    """``start_time(pid)``, cached for this process's own pid (asked on every ledger
    transaction; keyed by pid, so a forked child looks its own up)."""
    global _own
    own = _own
    if own is not None and own[0] == pid:
        return own[1]
    start = start_time(pid)
    if pid == os.getpid():
        _own = (pid, start)
    return start


def is_alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` exists, is not a zombie, and (if ``start`` is given) started at ``start``."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return False
    if fields[0] in (b"Z", b"X", b"x"):
        return False
    return start is None or int(fields[19]) == start


def _ppids() -> dict[int, int]:
    """pid -> parent pid for every process visible in /proc."""
    ppid: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return ppid
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None and len(fields) > 1:
            ppid[int(name)] = int(fields[1])  # field 4
    return ppid


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (including zombies not yet reaped), sorted."""
    return sorted(p for p, parent in _ppids().items() if parent == pid)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the tree, parents before their children."""
    by_parent: dict[int, list[int]] = {}
    for p, parent in _ppids().items():
        by_parent.setdefault(parent, []).append(p)
    out: list[int] = []
    queue = sorted(by_parent.get(pid, ()))
    while queue:
        p = queue.pop(0)
        out.append(p)
        queue.extend(sorted(by_parent.get(p, ())))
    return out


def _kb_field(path: str, key: bytes) -> int | None:
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(key):
                    parts = line.split()
                    return int(parts[1]) * 1024  # values are in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size (VmRSS), or None if gone or unavailable (e.g. a zombie)."""
    return _kb_field(f"/proc/{pid}/status", b"VmRSS:")


def pss_bytes(pid: int) -> int | None:
    """Proportional set size (shared pages split among sharers), or None if unavailable."""
    return _kb_field(f"/proc/{pid}/smaps_rollup", b"Pss:")


# --- where a pid means something ---------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """Where pids mean what they say: this boot, this PID namespace (``""``: unknown)."""

    boot_id: str
    pid_ns: str  # readlink /proc/self/ns/pid, e.g. "pid:[4026531836]"


_identity: tuple[int, Identity] | None = None


def identity() -> Identity:
    """This process's boot id and PID namespace (cached per pid: a fork after ``unshare``
    would be in another namespace, so a child looks its own up)."""
    global _identity
    cached = _identity
    if cached is not None and cached[0] == os.getpid():
        return cached[1]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = ""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    here = Identity(boot_id, pid_ns)
    _identity = (os.getpid(), here)
    return here


_NS_INODE = re.compile(r"pid:\[(\d+)\]\Z")


def ns_tag(pid_ns: str | None = None) -> str:
    """Eight hex digits naming a PID namespace (its inode number, which the kernel keeps unique
    among live namespaces), for names that must say where their pid lives; ``"00000000"``
    when unknown. A reused inode means the old namespace, and every process in it, is gone."""
    match = _NS_INODE.match(identity().pid_ns if pid_ns is None else pid_ns)
    return f"{int(match.group(1)) & 0xFFFFFFFF:08x}" if match else "0" * 8


def is_provably_dead(pid: int, start: int | None, pid_ns: str, boot_id: str,
                     here: Identity,
                     alive: Callable[[int, int | None], bool] | None = None) -> bool:
    """Pure (given ``alive``): whether the process a record names is certainly gone.

    ``pid_ns`` and ``boot_id`` are what the record says (``""``: not recorded); ``pid_ns`` may
    be a full ``readlink`` or an ``ns_tag``. True if the record is from an earlier boot, or
    from this namespace and ``alive(pid, start)`` is False. A record from another namespace,
    or one that does not say its namespace, is never provably dead: leave it alone.
    """
    if boot_id and here.boot_id and boot_id != here.boot_id:
        return True
    if not pid_ns or not here.pid_ns:
        return False
    if pid_ns != here.pid_ns and pid_ns != ns_tag(here.pid_ns):
        return False
    return not (alive or is_alive)(pid, start)


def describe_wait_status(status: int) -> str:
    """How a child process ended, from its ``waitpid`` status, for error messages.

    >>> describe_wait_status(9), describe_wait_status(3 << 8)
    ('killed by signal 9 (SIGKILL)', 'exited with code 3')
    """
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {sig} ({name})"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"
