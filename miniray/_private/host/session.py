"""Session directories: one per ``init()`` (or per node started with ``miniray start``).

Owns: creating a session directory under the session root, recording its owner process, and
sweeping the directories of sessions whose owner died (killed with SIGKILL, say). Does not own
what lives inside (the ledger, sockets, spill files): their owners put them there, and removing
the directory removes them.
Called by: runtime.py at init() and shutdown(), and the CLI.

Layout::

    $MINIRAY_TMPDIR/                     (default <tmp>/miniray-<uid>, mode 0700)
      session_2026-11-21_08-40-01_123456_<pid>_<rand>/
        owner.pid                        "<pid> <start time ticks>"
        ledger.json, ledger.json.lock
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil

from miniray._private.core import config, ids
from miniray._private.host import procinfo

logger = logging.getLogger(__name__)

SESSION_PREFIX = "session_"
OWNER_FILE = "owner.pid"
STORE_STATS_DIR = "driver_stats"  # <session>/driver_stats/<pid>.json, written by drivers


def root_tag(root: str | None = None) -> str:
    """Six hex characters naming a session root. Every shared-memory name a session creates
    starts with ``mr_<root tag>``, so whoever set ``MINIRAY_TMPDIR`` (a test harness, a CI
    job) can tell its own segments from other sessions' on the same host."""
    import hashlib

    root = os.path.abspath(root or config.tmpdir_root())
    return hashlib.sha1(root.encode()).hexdigest()[:6]


def create_session_dir(root: str | None = None) -> str:
    root = root or config.tmpdir_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    sweep_dead_sessions(root)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    pid = os.getpid()
    path = os.path.join(root, f"{SESSION_PREFIX}{stamp}_{pid}_{ids.random_hex(4)}")
    os.mkdir(path, 0o700)
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(f"{pid} {procinfo.start_time(pid) or 0}\n")
    logger.debug("created session directory %s", path)
    return path


def session_owner(path: str) -> tuple[int, int] | None:
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            pid_text, start_text = f.read().split()
        return int(pid_text), int(start_text)
    except (OSError, ValueError):
        return None


def is_session_alive(path: str) -> bool:
    owner = session_owner(path)
    if owner is None:
        return False
    pid, start = owner
    return procinfo.is_alive(pid, start or None)


def sweep_dead_sessions(root: str | None = None) -> list[str]:
    """Remove session directories whose owner process is gone. Returns what was removed."""
    root = root or config.tmpdir_root()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(SESSION_PREFIX):
            continue
        path = os.path.join(root, name)
        if session_owner(path) is None:
            # Being created right now (owner.pid not yet written) or foreign: leave it unless old.
            try:
                age = datetime.datetime.now().timestamp() - os.stat(path).st_mtime
            except OSError:
                continue
            if age < 60:
                continue
        elif is_session_alive(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        logger.debug("swept dead session %s", path)
    return removed


def remove_session_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    try:  # the root too, once no session is left in it (another may be starting: that's fine)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def sweep_dead_spill_dirs(spill_root: str) -> None:
    """Remove spill folders (named like their session) whose owner process is gone."""
    try:
        names = os.listdir(spill_root)
    except OSError:
        return
    for name in names:
        parts = name.split("_")
        if not name.startswith(SESSION_PREFIX) or len(parts) < 3 or not parts[-2].isdigit():
            continue
        if not procinfo.is_alive(int(parts[-2])):
            shutil.rmtree(os.path.join(spill_root, name), ignore_errors=True)
