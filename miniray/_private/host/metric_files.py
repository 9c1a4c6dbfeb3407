"""Where the metric values of a session's processes meet: one file per process,
``<session>/metrics/<pid>.pkl``, holding that process's whole snapshot
(``core/metric_values.py``).

Owns: writing a snapshot atomically (a temporary file, then a rename, so a reader never sees
half of one) and reading every process's snapshot back. Does not own: what a snapshot holds.
Called by: ``worker/execute.py`` (a worker flushes before a call's result goes out, so the
caller that got the result reads what the call recorded), ``miniray/util/metrics.py`` (the
driver reads them all when it renders).

Why files and not the worker channel: a process that never records writes nothing and sends
nothing, the owner's lock and wire protocol are left alone, and a worker that has exited still
counts (its file stays until the session directory is removed at shutdown).
"""

from __future__ import annotations

import os
import pickle

METRICS_DIR = "metrics"


def write_snapshot(session_dir: str, pid: int, snapshot: dict) -> None:
    """Replace ``pid``'s file; does nothing once the session directory is gone."""
    if not session_dir or not os.path.isdir(session_dir):
        return
    folder = os.path.join(session_dir, METRICS_DIR)
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass
    path = os.path.join(folder, f"{pid}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(path + ".tmp", path)


def read_snapshots(session_dir: str, skip_pid: int | None = None) -> list:
    """Every process's last snapshot but ``skip_pid``'s; unreadable files are skipped."""
    folder = os.path.join(session_dir, METRICS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    snapshots = []
    for name in names:
        if not name.endswith(".pkl") or name == f"{skip_pid}.pkl":
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                snapshots.append(pickle.load(f))
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
    return snapshots
