"""Unit tests for same_uid.py (private directories, owned files, socket peers) and for the
liveness rules that decide what may be swept (procinfo.is_provably_dead and its users).
No miniray processes; run as any user."""

from __future__ import annotations

import os
import pickle
import socket
import stat
import subprocess
import sys

import pytest

from miniray._private.host import procinfo, same_uid, session
from miniray._private.host.procinfo import Identity, is_provably_dead
from miniray._private.host.same_uid import InsecurePathError, dir_problem, ensure_private_dir
from miniray._private.object_store import shm_segments


# --- directories ------------------------------------------------------------------------------
def test_creates_private_dirs_down_from_top(tmp_path):
    top = tmp_path / "top"
    leaf = top / "a" / "b"
    assert ensure_private_dir(str(leaf), top=str(top)) == str(leaf)
    for d in (top, top / "a", leaf):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    ensure_private_dir(str(leaf), top=str(top))  # reusing our own: fine


def test_parents_above_top_are_made_but_not_checked(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o1777)
    ensure_private_dir(str(parent / "deep" / "root"))
    assert stat.S_IMODE(os.lstat(parent / "deep" / "root").st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o750, 0o701, 0o1777])
def test_refuses_group_or_other_bits(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(InsecurePathError) as info:
        ensure_private_dir(str(d))
    text = str(info.value)
    assert str(d) in text and f"mode {stat.S_IMODE(mode):04o}" in text
    assert f"uid {os.getuid()}" in text and "MINIRAY_TMPDIR" in text and "\n" not in text
    assert stat.S_IMODE(os.lstat(d).st_mode) == stat.S_IMODE(mode)  # refused, never "fixed"


def test_refuses_a_symlink_even_to_a_private_dir(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(InsecurePathError, match="symbolic link"):
        ensure_private_dir(str(link))
    with pytest.raises(InsecurePathError, match="symbolic link"):  # inside the chain too
        ensure_private_dir(str(link / "x"), top=str(tmp_path / "real" / ".."))


def test_refuses_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(InsecurePathError, match="not a directory"):
        ensure_private_dir(str(f))


def test_create_false_creates_nothing_but_checks(tmp_path):
    missing = tmp_path / "missing"
    ensure_private_dir(str(missing), create=False)
    assert not missing.exists()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(InsecurePathError):
        ensure_private_dir(str(open_dir), create=False)


def test_dir_problem_is_pure():
    def st(mode, uid=1000):
        return os.stat_result((mode, 0, 0, 0, uid, 0, 0, 0, 0, 0))

    assert dir_problem(st(stat.S_IFDIR | 0o700), 1000) is None
    assert "symbolic link" in dir_problem(st(stat.S_IFLNK | 0o777), 1000)
    assert "not a directory" in dir_problem(st(stat.S_IFREG | 0o600), 1000)
    assert "uid 54001" in dir_problem(st(stat.S_IFDIR | 0o700, 54001), 1000)
    assert "0770" in dir_problem(st(stat.S_IFDIR | 0o770), 1000)


def test_error_survives_pickling():
    error = InsecurePathError("miniray refuses to use /x")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is InsecurePathError and str(again) == str(error)
    assert isinstance(again, RuntimeError)


# --- files -------------------------------------------------------------------------------------
def test_segments_are_mapped_only_if_owned_regular_files(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"x" * 64)
    link = tmp_path / "mr_link"
    link.symlink_to(target)
    with pytest.raises(OSError):  # O_NOFOLLOW: ELOOP, never the target's bytes
        shm_segments.map_readonly(str(link))
    fd = os.open(str(target), os.O_RDONLY)
    try:
        assert same_uid.check_owned_fd(fd, str(target)).st_size == 64
    finally:
        os.close(fd)
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        with pytest.raises(InsecurePathError, match="not a regular file"):
            same_uid.check_owned_fd(fd, str(tmp_path))
    finally:
        os.close(fd)


# --- sockets -----------------------------------------------------------------------------------
def test_peer_of_a_socketpair_is_this_uid():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert same_uid.peer_creds(a) == (os.getpid(), os.getuid())
        assert same_uid.require_same_uid_peer(a, "pair") == os.getpid()


# --- liveness --------------------------------------------------------------------------------
HERE = Identity(boot_id="boot-1", pid_ns="pid:[4026531836]")


def always(result):
    return lambda pid, start: result


def test_provably_dead_only_in_this_namespace_on_this_boot():
    ns = HERE.pid_ns
    assert is_provably_dead(10, None, ns, "boot-1", HERE, always(False))
    assert not is_provably_dead(10, None, ns, "boot-1", HERE, always(True))
    # Another PID namespace (a container sharing /dev/shm): never judged from here.
    assert not is_provably_dead(10, None, "pid:[4026532000]", "boot-1", HERE, always(False))
    # A record that does not say where its pid lives: never provably dead either.
    assert not is_provably_dead(10, None, "", "", HERE, always(False))
    # From an earlier boot: dead whatever the namespace says.
    assert is_provably_dead(10, None, "pid:[4026532000]", "boot-0", HERE, always(True))
    # The short namespace tag of segment names counts as this namespace.
    assert procinfo.ns_tag(ns) == f"{4026531836:08x}"
    assert is_provably_dead(10, None, procinfo.ns_tag(ns), "", HERE, always(False))
    assert not is_provably_dead(10, None, "f0000abc", "", HERE, always(False))
    # Where this process cannot tell its own namespace, nothing is provable.
    assert not is_provably_dead(10, None, ns, "", Identity("", ""), always(False))


def test_identity_is_this_process():
    here = procinfo.identity()
    assert here.pid_ns == os.readlink("/proc/self/ns/pid")
    assert len(procinfo.ns_tag()) == 8 and procinfo.ns_tag() != "0" * 8


def test_segment_tags_say_their_namespace():
    mine = shm_segments.new_session_tag(pid=999_999_999)
    assert shm_segments.tag_verdict(mine) == "dead"  # no such pid here
    assert shm_segments.tag_verdict(shm_segments.new_session_tag()) == "alive"
    foreign = "abcdef" + "f0000abc" + f"{999_999_999:08x}" + "00"
    assert shm_segments.tag_verdict(foreign) == "foreign"
    assert shm_segments.tag_verdict("0123456789abcd") == "foreign"  # older: no namespace


def test_session_verdicts(tmp_path):
    root = tmp_path / "root"
    path = session.create_session_dir(str(root))
    assert session.owner_verdict(path) == "alive"
    assert session.name_owner(os.path.basename(path)) == (os.getpid(), procinfo.ns_tag())
    here = procinfo.identity()
    for pid_ns, verdict in ((here.pid_ns, "dead"), ("pid:[4026532000]", "foreign")):
        with open(os.path.join(path, session.OWNER_FILE), "w") as f:
            f.write(f"999999999 1 {pid_ns} {here.boot_id}\n")
        assert session.owner_verdict(path) == verdict
    with open(os.path.join(path, session.OWNER_FILE), "w") as f:
        f.write("999999999 1 pid:[4026532000] an-earlier-boot\n")
    assert session.owner_verdict(path) == "dead"
    with open(os.path.join(path, session.OWNER_FILE), "w") as f:
        f.write(f"999999999 1 pid:[4026532000] {here.boot_id}\n")
    assert session.foreign_sessions(str(root)) == [path]
    assert session.sweep_dead_sessions(str(root)) == [] and os.path.isdir(path)
    with open(os.path.join(path, session.OWNER_FILE), "w") as f:
        f.write(f"999999999 1 {here.pid_ns} {here.boot_id}\n")
    assert session.sweep_dead_sessions(str(root)) == [path] and not os.path.exists(path)


def test_a_foreign_session_is_dead_once_its_owners_lock_is_released(tmp_path):
    """A session of another PID namespace (a container's, on a shared root) cannot be judged
    by its pid; the lock its owner holds for its life can: the kernel drops it when the
    owner is gone, whatever namespace it was in. Here the owner is a child process whose
    record is rewritten to name another namespace."""
    root = str(tmp_path / "root")
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom miniray._private.host import session\n"
         f"print(session.create_session_dir({root!r}), flush=True)\nsys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        path = owner.stdout.readline().strip()
        record = os.path.join(path, session.OWNER_FILE)
        with open(record) as f:
            pid, start, _ns, boot_id, locked = f.read().split()
        assert (int(pid), locked) == (owner.pid, session.LOCKED)
        with open(record, "w") as f:
            f.write(f"{pid} {start} pid:[4026532000] {boot_id} {locked}\n")
        assert session.owner_verdict(path) == "foreign"  # its lock is held
        assert session.sweep_dead_sessions(root) == [] and os.path.isdir(path)
    finally:
        owner.kill()  # SIGKILL: nothing of its own cleans up
        owner.wait(30)
    assert session.owner_verdict(path) == "dead"
    assert session.foreign_sessions(root) == []
    with open(record, "w") as f:  # a record that does not say it holds the lock
        f.write(f"{pid} {start} pid:[4026532000] {boot_id}\n")
    assert session.owner_verdict(path) == "foreign"
    with open(record, "w") as f:
        f.write(f"{pid} {start} pid:[4026532000] {boot_id} {locked}\n")
    assert session.sweep_dead_sessions(root) == [path] and not os.path.exists(path)


def test_a_session_holds_its_lock_until_it_is_removed(tmp_path):
    path = session.create_session_dir(str(tmp_path / "root"))
    lock = os.path.join(path, session.LOCK_FILE)
    assert not session._lock_released(path)  # another open file of this process: refused
    session.remove_session_dir(path)
    assert not os.path.exists(lock) and path not in session._held


def test_spill_folders_are_swept_only_when_provably_dead(tmp_path):
    """Spill folders are named like their session, namespace tag included: only a folder of
    this namespace whose pid is gone is removed; another namespace's, or an older name
    without a tag, is left alone."""
    spill_root = tmp_path / "spill"
    ours = procinfo.ns_tag()
    names = {
        "dead": f"session_2026-01-01_00-00-00_000000_999999999_aaaaaaaa_p{ours}",
        "alive": f"session_2026-01-01_00-00-00_000000_{os.getpid()}_aaaaaaaa_p{ours}",
        "foreign": "session_2026-01-01_00-00-00_000000_999999999_aaaaaaaa_pf0000abc",
        "legacy": "session_2026-01-01_00-00-00_000000_999999999_aaaaaaaa",
    }
    for name in names.values():
        (spill_root / name).mkdir(parents=True)
    session.sweep_dead_spill_dirs(str(spill_root))
    assert sorted(os.listdir(spill_root)) == sorted(
        names[k] for k in ("alive", "foreign", "legacy"))
