"""``host/serializer_file.py``: a worker reads the custom serializers' file at its first call
and after the owner's notice only (no processes)."""

from __future__ import annotations

import os

from miniray._private.host import serializer_file


def test_the_file_is_looked_at_first_and_then_only_after_a_notice(tmp_path, monkeypatch):
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(serializer_file.os, "stat",
                        lambda path, *a, **k: stats.append(path) or real_stat(path, *a, **k))
    watch = serializer_file.SerializerFileWatch(str(tmp_path))
    assert watch.changed() is None  # no file yet: one look
    assert watch.changed() is None and watch.changed() is None
    assert len(stats) == 1  # a stat per call was a failed system call per task

    serializer_file.write(str(tmp_path), b"one")
    watch.notify()
    assert watch.changed() == b"one"
    assert watch.changed() is None
    assert len(stats) == 2

    watch.notify()  # a notice with no new write: looked at, nothing to apply
    assert watch.changed() is None
    serializer_file.write(str(tmp_path), b"two")
    watch.notify()
    assert watch.changed() == b"two"


def test_without_a_session_nothing_is_looked_at():
    watch = serializer_file.SerializerFileWatch("")
    assert watch.changed() is None
