"""The custom serializers a driver registered, shared with its session's workers:
``<session>/serializers.pkl``.

Owns: writing the registrations atomically (a temporary file, then a rename) and noticing,
with one ``stat``, that they changed since a process last looked; a worker looks only at its
first call and after the owner's ``SERIALIZERS`` notice, not once per call. Does not own: what the
bytes hold or how they are applied (``core/serialization.py``).
Called by: ``api.py`` (the driver writes on register/deregister and at ``init()``),
``worker/worker_main.py`` (a worker looks before it loads a call's arguments when told to:
the owner sends the notice to every worker after the write, ahead of any later call on the
same socket, so a call submitted after ``register_serializer`` returns sees it, in workers
started before or after).
"""

from __future__ import annotations

import os

SERIALIZERS_FILE = "serializers.pkl"


def write(session_dir: str, blob: bytes) -> None:
    path = os.path.join(session_dir, SERIALIZERS_FILE)
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(path + ".tmp", path)


class SerializerFileWatch:
    """Reports the file's bytes when they changed since the last look (a rename makes a new
    inode, so the stat's identity changes with every write)."""

    def __init__(self, session_dir: str) -> None:
        self.path = os.path.join(session_dir, SERIALIZERS_FILE) if session_dir else ""
        self.seen: tuple | None = None
        # Look at the first call (registrations made before this worker started), then
        # only after a notice: a stat per call cost a failed system call per task.
        self.stale = True

    def notify(self) -> None:
        """The owner said the file changed: look again before the next call."""
        self.stale = True

    def changed(self) -> bytes | None:
        if not self.stale or not self.path:
            return None
        # Cleared before the stat: a notice arriving meanwhile is for a file already
        # written, so this look sees it, or the next one does.
        self.stale = False
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.seen:
            return None
        try:
            with open(self.path, "rb") as f:
                blob = f.read()
        except OSError:
            return None
        self.seen = key
        return blob
