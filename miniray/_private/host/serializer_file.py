"""The custom serializers a driver registered, shared with its session's workers:
``<session>/serializers.pkl``.

Owns: writing the registrations atomically (a temporary file, then a rename) and noticing,
with one ``stat``, that they changed since a process last looked. Does not own: what the
bytes hold or how they are applied (``core/serialization.py``).
Called by: ``api.py`` (the driver writes on register/deregister and at ``init()``),
``worker/worker_main.py`` (a worker looks before it loads each call's arguments, so a call
submitted after ``register_serializer`` returns sees it, in workers started before or after).
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

    def changed(self) -> bytes | None:
        if not self.path:
            return None
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
