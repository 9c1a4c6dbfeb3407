"""The leak check of conftest.py finds what it promises: segments of the root's tag, spill
folders of the session, ledger leases, and new entries outside the session root. No miniray
session is started; each test plants one leftover and removes it again."""

from __future__ import annotations

import os
import shutil

import pytest

from miniray._private.host import session
from miniray._private.ledger.ledger import Ledger

from . import conftest


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(conftest, "LEAK_WAIT_S", 0.05)


def _plant(path: str):
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_nothing_planted_nothing_found(quick, session_root):
    before = conftest.outside_snapshot()
    assert conftest.find_leaks([], ["session_x"], session_root, before) == []


def test_a_segment_of_the_roots_tag_is_found(quick, session_root):
    path = _plant(f"/dev/shm/mr_{session.root_tag(session_root)}deadbeef00_ab")
    try:
        found = conftest.find_leaks([], [], session_root)
    finally:
        os.unlink(path)
    assert any("shared-memory segments of root" in f and os.path.basename(path) in f
               for f in found), found


def test_a_spill_folder_of_the_session_is_found(quick, session_root):
    name = f"session_2000-01-01_00-00-00_000000_{os.getpid()}_leakcheck"
    folder = os.path.join(conftest.spill_root(), name)
    os.makedirs(folder)
    try:
        found = conftest.find_leaks([], [name], session_root)
    finally:
        shutil.rmtree(folder)
        try:
            os.rmdir(conftest.spill_root())
        except OSError:  # other sessions' folders are there: leave it
            pass
    assert any("spill folders left" in f and name in f for f in found), found


def test_a_lease_of_the_test_process_is_found(quick, session_root):
    folder = os.path.join(session_root, "session_2000-01-01_00-00-00_000000_1_leakcheck")
    os.makedirs(folder)
    ledger = Ledger.create(os.path.join(folder, "ledger.json"), {"CPU": 2}, {})
    try:
        assert ledger.acquire({"CPU": 1}, holder_pid=os.getpid()) is not None
        found = conftest.find_leaks([], [], session_root)
    finally:
        ledger.close()
        shutil.rmtree(session_root)
    assert any("ledger leases left" in f and f"pid {os.getpid()}" in f for f in found), found


def test_a_new_entry_outside_the_root_is_found_and_an_old_one_is_not(quick, session_root):
    old = _plant(f"/dev/shm/leakcheck_{os.getpid()}_old")
    try:
        before = conftest.outside_snapshot()
        new = _plant(f"/dev/shm/leakcheck_{os.getpid()}_new")
        try:
            found = conftest.find_leaks([], [], session_root, before)
        finally:
            os.unlink(new)
    finally:
        os.unlink(old)
    outside = [f for f in found if "outside the session root" in f]
    assert outside and new in outside[0] and old not in outside[0], found


def test_a_new_file_in_the_users_host_gpu_directory_is_found(quick, session_root):
    host_dir = conftest.user_host_dir()
    assert os.environ["MINIRAY_HOST_DIR"] != host_dir  # the test's own is elsewhere
    existed = os.path.isdir(host_dir)
    before = conftest.outside_snapshot()
    os.makedirs(host_dir, mode=0o700, exist_ok=True)
    planted = _plant(os.path.join(host_dir, f"leakcheck_{os.getpid()}"))
    try:
        found = conftest.find_leaks([], [], session_root, before)
    finally:
        os.unlink(planted)
        if not existed:
            os.rmdir(host_dir)
    outside = [f for f in found if "outside the session root" in f]
    assert outside and planted in outside[0], found


def test_drivers_read_line_returns_lines_that_arrived_together(drivers):
    # Both lines come in one write: the second must not wait for more bytes on the pipe.
    proc = drivers.start("""
        import sys, time
        sys.stdout.write("first\\nsecond\\n")
        sys.stdout.flush()
        time.sleep(30)
    """)
    assert drivers.read_line(proc, timeout=30) == "first\n"
    # Well under the writer's 30 s pause, so a wait for more bytes would still fail it, but
    # not a bound a loaded machine can miss (it was 2 s).
    assert drivers.read_line(proc, timeout=15) == "second\n"
    proc.kill()
    out, _err = drivers.communicate(proc, timeout=10)
    assert out == ""
