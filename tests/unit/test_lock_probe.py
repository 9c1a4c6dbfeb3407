"""``host/lock_probe.lock_free``: the kernel's answer, whoever holds the lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from miniray._private.host.lock_probe import lock_free


def test_free_file_is_free_and_the_probe_keeps_no_lock(tmp_path):
    path = tmp_path / "f.lock"
    path.write_bytes(b"")
    assert lock_free(str(path))
    assert lock_free(str(path))  # the first probe left nothing behind


def test_a_lock_held_here_or_shared_or_by_another_process_is_not_free(tmp_path):
    path = str(tmp_path / "f.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert not lock_free(path)  # a reader's shared lock, in this very process
    finally:
        os.close(fd)
    assert lock_free(path)
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({path!r}, os.O_RDONLY)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        assert not lock_free(path)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert lock_free(path)  # the kernel dropped it with the process


def test_missing_file_or_symbolic_link_is_not_proven_free(tmp_path):
    assert not lock_free(str(tmp_path / "missing"))
    target = tmp_path / "target"
    target.write_bytes(b"")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert lock_free(str(target))
    assert not lock_free(str(link))
