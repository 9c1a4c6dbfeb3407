"""Session directories: one per ``init()`` (or per node started with ``miniray start``).

Owns: creating a session directory under the session root, recording its owner process, and
sweeping the directories of sessions whose owner is provably dead (killed with SIGKILL, say:
``procinfo.is_provably_dead``). A session of another PID namespace sharing the root (a
container's, on a shared volume) cannot be judged by its pid; its owner holds an exclusive
``flock`` on ``owner.lock`` for its life, which the kernel drops when the owner and every
process it forked are gone, whatever namespace they were in: a lock that can be taken proves
that session dead (``_lock_released``); one still held, or a record that does not say it
holds one, is left alone. The root is a private directory (``same_uid.ensure_private_dir``).
Does not own what lives inside (the ledger, sockets, spill files): their owners put them
there, and removing the directory removes them.
Called by: runtime.py at init() and shutdown(), and the CLI.

Layout::

    $MINIRAY_TMPDIR/                     (default /dev/shm/miniray-<uid>, mode 0700, checked)
      session_2026-11-21_08-40-01_123456_<pid>_<rand>_p<ns tag>/
        owner.pid                        "<pid> <start time ticks> <pid namespace> <boot id> flock"
        owner.lock                       flock'ed (exclusive) by the owner for its life
        ledger.json, ledger.json.lock
"""

from __future__ import annotations

import datetime
import fcntl
import logging
import os
import shutil

from miniray._private.core import config, ids
from miniray._private.host import lock_probe, procinfo, same_uid

logger = logging.getLogger(__name__)

SESSION_PREFIX = "session_"
OWNER_FILE = "owner.pid"
LOCK_FILE = "owner.lock"
LOCKED = "flock"  # owner.pid's fifth field: the owner holds LOCK_FILE's lock
# Session directory -> the fd of its lock, in the process that created it (closed at its
# removal; a forked child's copy keeps the lock held while that child lives).
_held: dict[str, int] = {}
STORE_STATS_DIR = "driver_stats"  # <session>/driver_stats/<pid>.json, written by drivers


def root_tag(root: str | None = None) -> str:
    """Six hex characters naming a session root. Every shared-memory name a session creates
    starts with ``mr_<root tag>``, so whoever set ``MINIRAY_TMPDIR`` (a test harness, a CI
    job) can tell its own segments from other sessions' on the same host."""
    import hashlib

    root = os.path.abspath(root or config.tmpdir_root())
    return hashlib.sha1(root.encode()).hexdigest()[:6]


def ensure_root(root: str | None = None) -> str:
    """Create or check the session root as a private directory (InsecurePathError naming
    its owner and mode otherwise); returns it."""
    return same_uid.ensure_private_dir(root or config.tmpdir_root())


def create_session_dir(root: str | None = None) -> str:
    root = ensure_root(root)
    sweep_dead_sessions(root)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    pid = os.getpid()
    path = os.path.join(root, f"{SESSION_PREFIX}{stamp}_{pid}_{ids.random_hex(4)}_"
                              f"p{procinfo.ns_tag()}")
    os.mkdir(path, 0o700)
    _hold_lock(path)  # before owner.pid says so: a record that says it is never early
    here = procinfo.identity()
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(f"{pid} {procinfo.start_time(pid) or 0} {here.pid_ns or '-'} "
                f"{here.boot_id or '-'} {LOCKED}\n")
    logger.debug("created session directory %s", path)
    return path


def _hold_lock(path: str) -> None:
    """Take the session's liveness lock, kept until ``remove_session_dir`` (or the end of
    this process and of every process forked from it)."""
    fd = os.open(os.path.join(path, LOCK_FILE),
                 os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
    except OSError:
        os.close(fd)
        raise
    _held[path] = fd


def _lock_released(path: str) -> bool:
    """Whether ``path``'s liveness lock can be taken now: its owner, and every process
    that shares the lock, is gone. False when the lock is held or the file is missing."""
    return lock_probe.lock_free(os.path.join(path, LOCK_FILE))


def _says_locked(path: str) -> bool:
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            parts = f.read().split()
    except OSError:
        return False
    return len(parts) > 4 and parts[4] == LOCKED


def read_owner(path: str) -> tuple[int, int, str, str] | None:
    """``(pid, start time, pid namespace, boot id)`` from a session's ``owner.pid`` (the last
    two ``""`` in a record that does not say), or None when it is missing or unreadable."""
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            parts = f.read().split()
        pid, start = int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None
    extra = [p if p != "-" else "" for p in parts[2:4]] + ["", ""]
    return pid, start, extra[0], extra[1]


def session_owner(path: str) -> tuple[int, int] | None:
    owner = read_owner(path)
    return None if owner is None else owner[:2]


def owner_verdict(path: str, here: procinfo.Identity | None = None) -> str:
    """``"alive"``, ``"dead"`` (provably), ``"foreign"`` (another PID namespace or boot-less
    record, alive or not proven dead) or ``"unknown"`` (no readable ``owner.pid``). A
    foreign one whose record says its owner holds the liveness lock is dead once that lock
    can be taken."""
    owner = read_owner(path)
    if owner is None:
        return "unknown"
    pid, start, pid_ns, boot_id = owner
    here = here or procinfo.identity()
    if procinfo.is_provably_dead(pid, start or None, pid_ns, boot_id, here):
        return "dead"
    if not pid_ns or (here.pid_ns and pid_ns != here.pid_ns):
        if _says_locked(path) and _lock_released(path):
            return "dead"
        return "foreign"
    return "alive"


def is_session_alive(path: str) -> bool:
    """False only when the owner is provably dead, or nothing says who owns it."""
    return owner_verdict(path) not in ("dead", "unknown")


def sweep_dead_sessions(root: str | None = None) -> list[str]:
    """Remove session directories whose owner process is provably dead. Returns what was
    removed; sessions of other PID namespaces are left alone (``foreign_sessions``)."""
    root = root or config.tmpdir_root()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    here = procinfo.identity()
    for name in names:
        if not name.startswith(SESSION_PREFIX):
            continue
        path = os.path.join(root, name)
        verdict = owner_verdict(path, here)
        if verdict == "unknown":
            # Being created right now (owner.pid not yet written): leave it unless it is old
            # and its name says it was made in this namespace by a pid that is gone.
            try:
                age = datetime.datetime.now().timestamp() - os.lstat(path).st_mtime
            except OSError:
                continue
            named = name_owner(name)
            if age < 60 or named is None or not procinfo.is_provably_dead(
                    named[0], None, named[1], "", here):
                continue
        elif verdict != "dead":
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        logger.debug("swept dead session %s", path)
    return removed


def foreign_sessions(root: str | None = None) -> list[str]:
    """Session directories of ``root`` owned by another PID namespace: never swept from here."""
    root = root or config.tmpdir_root()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    here = procinfo.identity()
    return [os.path.join(root, n) for n in sorted(names) if n.startswith(SESSION_PREFIX)
            and owner_verdict(os.path.join(root, n), here) == "foreign"]


def name_owner(name: str) -> tuple[int, str] | None:
    """``(pid, ns tag)`` from a session (or spill folder) name ``create_session_dir`` made, or
    None for a name without a namespace tag (older miniray, or not one of ours)."""
    parts = name.split("_")
    if (not name.startswith(SESSION_PREFIX) or len(parts) < 4 or len(parts[-1]) != 9
            or not parts[-1].startswith("p") or not parts[-3].isdigit()):
        return None
    return int(parts[-3]), parts[-1][1:]


def remove_session_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:  # after the removal: a sweeper never sees it released while it stands
        os.close(fd)
    try:  # the root too, once no session is left in it (another may be starting: that's fine)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def spill_dir(session_dir: str) -> str:
    """Where a session's spilled objects go: beside the session when that is on disk, else
    under the temp dir (a session root in /dev/shm would spill memory into memory)."""
    import tempfile  # lazy: only a session that spills, or sweeps, needs it

    try:
        on_tmpfs = os.statvfs(session_dir).f_fsid == os.statvfs("/dev/shm").f_fsid
    except OSError:
        on_tmpfs = False
    if not on_tmpfs:
        return os.path.join(session_dir, "spill")
    return os.path.join(tempfile.gettempdir(), f"miniray-spill-{os.getuid()}",
                        os.path.basename(session_dir))


def sweep_dead_spill_dirs(spill_root: str) -> None:
    """Remove spill folders (named like their session) whose owner is provably dead; the
    namespace tag in the name says where its pid lives. Other users' folders are left."""
    try:
        names = os.listdir(spill_root)
    except OSError:
        return
    here = procinfo.identity()
    for name in names:
        owner = name_owner(name)
        if owner is None or not procinfo.is_provably_dead(owner[0], None, owner[1], "", here):
            continue
        path = os.path.join(spill_root, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
