"""Another local user must never run code as the miniray user (two real uids); a driver in
another PID namespace must never delete what is ours (``unshare``).

The test process (root in CI) is the victim. The attacker is a subprocess started with
``user=``/``group=`` (setgid, setuid) to an unused uid. The two share a world-writable sticky
directory the test makes (like /tmp), removed afterwards. The attacker pre-creates the
victim's directories, plants files and listens on socket paths, each time with a pickle
payload that would create a marker file when unpickled; the victim must refuse with a clear
error, and the marker must never exist. Skipped unless running as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types

import pytest

import miniray
from miniray._private.host import same_uid
from miniray._private.host.same_uid import InsecurePathError
from miniray._private.object_store import shm_segments

from .helpers import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run a second uid (os.setuid)")


def _unused_uid() -> int:
    used = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            used.update(int(u) for u in line.split()[1:])
            except OSError:
                pass
    for uid in range(54000, 55000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in used:
                return uid
    pytest.skip("no unused uid in 54000..54999")


def _others_can_run(path: str) -> bool:
    """Whether a user with no group in common can execute ``path`` (every directory above it
    searchable by others, the file executable by others)."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & 0o001:
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _attacker_python() -> str:
    """An interpreter of this Python version that another uid may run (the test's own may live
    under a private home directory, as with pyenv under /root)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, os.path.join(sys.base_prefix, "bin", version),
                      f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(candidate) and _others_can_run(candidate):
            return candidate
    pytest.skip(f"no {version} interpreter that another uid can run")


def _site_packages() -> str:
    import cloudpickle

    return os.path.dirname(os.path.dirname(os.path.abspath(cloudpickle.__file__)))


class Attacker:
    """Runs Python as another uid in a directory both users can write (mode 1777)."""

    def __init__(self, shared: str, uid: int):
        self.shared, self.uid = shared, uid
        self.python = _attacker_python()
        self.marker = os.path.join(shared, "PAYLOAD_RAN")
        self.procs: list[subprocess.Popen] = []

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIRAY_", "RAY_"))}
        env.update(PYTHONPATH=os.pathsep.join([REPO, _site_packages()]), PYTHONUNBUFFERED="1",
                   HOME=self.shared, TMPDIR=self.shared)
        env.update(extra)
        return env

    def start(self, source: str, *args: str, **env) -> subprocess.Popen:
        proc = subprocess.Popen(
            [self.python, "-c", source, *args], cwd=self.shared,
            env=self.env(**env), user=self.uid, group=self.uid, extra_groups=[],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def run(self, source: str, *args: str, timeout: float = 60, **env):
        proc = self.start(source, *args, **env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def cli(self, *argv: str, timeout: float = 60, **env):
        return subprocess.run([self.python, "-m", "miniray", *argv], cwd=self.shared,
                              env=self.env(**env), user=self.uid, group=self.uid,
                              extra_groups=[], capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for proc in self.procs:  # only the processes this test started, by pid
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


# The attacker's payload: unpickling it creates the marker file (as the victim).
PAYLOAD = """
import os, pickle, sys
MARKER = os.environ["MARKER"]
class Evil:
    def __reduce__(self):
        return (open, (MARKER, "w"))
"""


@pytest.fixture
def attacker(tmp_path):
    shared = tempfile.mkdtemp(prefix="mr-shared-", dir="/tmp")
    os.chmod(shared, 0o1777)
    att = Attacker(shared, _unused_uid())
    try:
        yield att
    finally:
        att.close()
        shutil.rmtree(shared, ignore_errors=True)


def _refusal(error_text: str, path: str, uid: int) -> None:
    assert path in error_text and f"uid {uid}" in error_text, error_text
    assert "\n" not in error_text.strip(), error_text


# --- directories ------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["world-writable", "symlink"])
def test_init_refuses_a_session_root_another_user_made(attacker, monkeypatch, how):
    """The attacker makes the victim's session root (mode 0777, or a symlink to a directory
    of theirs) and plants a node record naming a socket of theirs that answers with the
    payload; the victim's init() refuses before reading anything there."""
    root = os.path.join(attacker.shared, "victim-root")
    sock = os.path.join(attacker.shared, "evil.sock")
    proc = attacker.start(PAYLOAD + textwrap.dedent("""
    import json, socket, struct, time
    root, sock_path, how = sys.argv[1:4]
    target = root if how == "world-writable" else root + "-real"
    os.mkdir(target); os.chmod(target, 0o777)
    if how == "symlink":
        os.symlink(target, root)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sock_path); os.chmod(sock_path, 0o777); listener.listen(8)
    session = os.path.join(target, "session_2026-01-01_00-00-00_000000_1_aaaaaaaa")
    os.mkdir(session, 0o777)
    record = {"pid": os.getpid(), "start_time": None, "address": "127.0.0.1:6379",
              "port": 6379, "socket": sock_path, "session_dir": session, "started_at": 0}
    with open(os.path.join(session, "node.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(target, "current_node"), "w") as f:
        f.write(os.path.join(session, "node.json"))
    print("ready", flush=True)
    listener.settimeout(30)
    try:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.send(pickle.dumps(("WELCOME", Evil())))
        time.sleep(1)
    except OSError:
        pass
    """), root, sock, how, MARKER=attacker.marker)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    monkeypatch.setenv("MINIRAY_TMPDIR", root)
    with pytest.raises(InsecurePathError) as info:
        miniray.init(num_cpus=1)
    text = str(info.value)
    _refusal(text, root, attacker.uid)
    assert ("symbolic link" if how == "symlink" else "mode 0777") in text
    assert "MINIRAY_TMPDIR" in text
    assert not miniray.is_initialized()
    assert not os.path.exists(attacker.marker)


def test_init_refuses_a_spill_root_another_user_made(attacker, monkeypatch):
    """A session root in /dev/shm spills under $TMPDIR/miniray-spill-<uid>: made by the
    attacker (mode 0777), it is refused at init(), and the session started is removed."""
    spill_root = os.path.join(attacker.shared, f"miniray-spill-{os.getuid()}")
    done = attacker.run("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)",
                        spill_root)
    assert done.returncode == 0, done.stderr
    root = tempfile.mkdtemp(prefix="mr-victim-", dir="/dev/shm")  # a tmpfs root: spills go out
    try:
        monkeypatch.setenv("MINIRAY_TMPDIR", root)
        monkeypatch.setenv("TMPDIR", attacker.shared)
        monkeypatch.setattr(tempfile, "tempdir", attacker.shared)  # gettempdir() caches
        with pytest.raises(InsecurePathError) as info:
            miniray.init(num_cpus=1)
        _refusal(str(info.value), spill_root, attacker.uid)
        assert "TMPDIR" in str(info.value)
        assert not os.path.exists(root) or not os.listdir(root)  # the session went with it
    finally:
        if miniray.is_initialized():  # only if the refusal failed: leave nothing running
            miniray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def test_a_segment_another_user_planted_is_never_unpickled(attacker):
    """/dev/shm is shared by every user: a reader maps a segment only if it is a regular file
    of its own uid (fstat of the opened descriptor), so a planted one never loads."""
    name = f"mr_{os.urandom(10).hex()}_{os.urandom(28).hex()}"
    path = os.path.join("/dev/shm", name)
    # A name of the same shape that differs from ``name`` (a random name may end in "ff").
    link = os.path.join("/dev/shm", name[:-2] + ("00" if name.endswith("ff") else "ff"))
    done = attacker.run(PAYLOAD + textwrap.dedent("""
    from miniray._private.core import oob
    from miniray._private.object_store import shm_segments
    shm_segments.write_segment(sys.argv[1], oob.serialize([Evil(), b"x" * 200_000]))
    os.chmod(sys.argv[1], 0o644)
    os.symlink(sys.argv[1], sys.argv[2])
    """), path, link, MARKER=attacker.marker)
    try:
        assert done.returncode == 0, done.stderr
        with pytest.raises(InsecurePathError) as info:
            shm_segments.read_segment(path)
        _refusal(str(info.value), path, attacker.uid)
        with pytest.raises(OSError):  # O_NOFOLLOW
            shm_segments.read_segment(link)
        assert not os.path.exists(attacker.marker)
    finally:
        for p in (path, link):
            shm_segments.unlink_quiet(p)


# --- sockets -----------------------------------------------------------------------------------
LISTENER = PAYLOAD + """
import socket, struct, time
kind = socket.SOCK_STREAM if sys.argv[2] == "stream" else socket.SOCK_SEQPACKET
listener = socket.socket(socket.AF_UNIX, kind)
listener.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); listener.listen(8)
print("ready", flush=True)
listener.settimeout(30)
blob = pickle.dumps(("OK", Evil()))
try:
    while True:
        conn, _ = listener.accept()
        # Speak first, so a client that reads before checking its peer would unpickle this.
        conn.send(struct.pack("!Q", len(blob)) + blob if kind == socket.SOCK_STREAM else blob)
except OSError:
    pass
"""


def test_actor_link_refuses_a_service_socket_of_another_user(attacker):
    """A driver connecting to the actor service checks SO_PEERCRED before sending or reading:
    the attacker's listener at the path is refused, its reply never unpickled."""
    from miniray._private.owner.actor_link import ActorLink, ServiceUnavailable

    path = os.path.join(attacker.shared, "actors.sock")
    proc = attacker.start(LISTENER, path, "stream", MARKER=attacker.marker)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    store = types.SimpleNamespace(session_tag="0" * 20, shm_dir="/dev/shm")
    owner = types.SimpleNamespace(store=store, hello_info={}, reactor=None)
    link = ActorLink(owner, path)
    with pytest.raises(ServiceUnavailable) as info:
        link._connect()
    _refusal(str(info.value), path, attacker.uid)
    assert not os.path.exists(attacker.marker)


def test_node_client_refuses_a_node_socket_of_another_user(attacker):
    from miniray._private.transport import node_client

    path = os.path.join(attacker.shared, "node.sock")
    proc = attacker.start(LISTENER, path, "seqpacket", MARKER=attacker.marker)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    record = node_client.NodeRecord(pid=proc.pid, start_time=None, address="127.0.0.1:1",
                                    port=1, socket=path, session_dir=attacker.shared,
                                    started_at=0.0)
    with pytest.raises(ConnectionError) as info:
        node_client.connect(record, timeout=5)
    _refusal(str(info.value), path, attacker.uid)
    assert not os.path.exists(attacker.marker)


def test_a_node_record_of_another_user_is_not_believed(attacker):
    """``current_node`` may name a record under another root (``--temp-dir``): a record file
    another user owns is ignored, so its socket is never connected to."""
    from miniray._private.transport import node_client

    root = os.path.join(attacker.shared, "victim-root")
    same_uid.ensure_private_dir(root)
    record_path = os.path.join(attacker.shared, "node.json")
    proc = attacker.start(textwrap.dedent("""
    import json, os, sys, time
    with open(sys.argv[1], "w") as f:
        json.dump({"pid": os.getpid(), "start_time": None, "address": "127.0.0.1:6379",
                   "port": 6379, "socket": sys.argv[1], "session_dir": "/",
                   "started_at": 0}, f)
    print("ready", flush=True)
    time.sleep(30)
    """), record_path)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    with open(os.path.join(root, node_client.CURRENT_NODE), "w") as f:
        f.write(record_path + "\n")
    assert node_client.read_record(record_path) is None
    assert node_client.find_node(None, root) is None
    assert node_client.list_records(root, alive_only=False) == []


# --- another user's commands on the victim's root ---------------------------------------------
def test_another_users_commands_on_a_root_they_cannot_read(attacker):
    """``miniray stop``/``status``/``start`` and a program calling init() (under ``miniray
    run``), run by another user with MINIRAY_TMPDIR at the victim's root: exit code 1, one
    line naming the path and its owner, no traceback; the victim's root is untouched."""
    root = os.path.join(attacker.shared, "victim-root")
    same_uid.ensure_private_dir(root)
    with open(os.path.join(root, "keep"), "w"):
        pass
    script = os.path.join(attacker.shared, "prog.py")
    with open(script, "w") as f:
        f.write("import ray\nray.init(num_cpus=1)\nprint('initialized')\n")
    os.chmod(script, 0o644)
    for argv in (["stop"], ["status"], ["start", "--head", "--num-cpus", "1"],
                 ["run", script]):
        done = attacker.cli(*argv, MINIRAY_TMPDIR=root)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (argv, done.stdout, done.stderr)
        assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
        assert root in lines[0] and "root (uid 0)" in lines[0], (argv, lines)
        assert "initialized" not in done.stdout
    # A plain program: init() raises the same one-line error.
    done = attacker.run("import miniray\nminiray.init(num_cpus=1)", MINIRAY_TMPDIR=root)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("miniray._private.host.same_uid.InsecurePathError: ") and root in last
    assert sorted(os.listdir(root)) == ["keep"]
    assert os.stat(root).st_uid == 0


# --- PID namespaces ----------------------------------------------------------------------------
INNER = """
import json, miniray
ctx = miniray.init(num_cpus=1)
print(json.dumps({"session_dir": ctx["session_dir"]}), flush=True)
miniray.shutdown()
"""


def test_a_driver_in_another_pid_namespace_sweeps_nothing_of_ours(ray, drivers, session_root):
    """A driver in a new PID namespace (``unshare -p -f --mount-proc``) sharing the session
    root and /dev/shm sees none of our pids; its init() must still leave our live session and
    segments alone (it cannot prove them dead), and its ``miniray status`` says it left them.
    Our ``get`` and a task reading the object still work afterwards."""
    import json

    import numpy as np

    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare -p -f --mount-proc fails here: {probe.stderr.strip()}")
    ref = ray.put(np.arange(1 << 18, dtype=np.int64))  # 2 MiB: a segment in /dev/shm
    rt = miniray._private.runtime.current()
    tag = rt.store.session_tag
    ours = [n for n in os.listdir("/dev/shm") if n.startswith(f"mr_{tag}_")]
    assert ours
    env = drivers.env()
    script = drivers.script(INNER)
    inner = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", "sh", "-c",
         f'"{sys.executable}" "{script}" && "{sys.executable}" -m miniray status'],
        env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(inner.stdout.splitlines()[0])["session_dir"].startswith(session_root), \
        inner.stderr
    assert os.path.isdir(rt.session_dir), "the inner init() swept our live session"
    assert all(os.path.exists(os.path.join("/dev/shm", n)) for n in ours), \
        "the inner init() swept our live segments"
    assert "1 session(s) / 1 segment(s) of other PID namespaces left alone" in inner.stderr, \
        inner.stderr

    @ray.remote
    def total(a):
        return int(a.sum())

    assert int(ray.get(ref).sum()) == ray.get(total.remote(ref)) == sum(range(1 << 18))


def test_stop_leaves_a_node_of_another_pid_namespace_alone(session_root):
    """A node record written in another PID namespace (a container sharing the root): its pid
    means another process here, so ``miniray stop`` neither signals that pid nor removes the
    node's session."""
    import json
    import signal as _signal

    from miniray._private.host import procinfo
    from miniray._private.node import daemon
    from miniray._private.transport import node_client

    here = procinfo.identity()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        same_uid.ensure_private_dir(session_root)
        session_dir = os.path.join(session_root, "session_2026-01-01_00-00-00_000000_7_"
                                                 "aaaaaaaa_pf0000abc")
        os.mkdir(session_dir, 0o700)
        with open(os.path.join(session_dir, "owner.pid"), "w") as f:
            f.write(f"{bystander.pid} {procinfo.start_time(bystander.pid)} "
                    f"pid:[4026599999] {here.boot_id}\n")
        record = {"pid": bystander.pid, "start_time": procinfo.start_time(bystander.pid),
                  "address": "127.0.0.1:6379", "port": 6379,
                  "socket": os.path.join(session_dir, "node.sock"),
                  "session_dir": session_dir, "started_at": 0.0,
                  "pid_ns": "pid:[4026599999]", "boot_id": here.boot_id}
        with open(os.path.join(session_dir, node_client.RECORD_FILE), "w") as f:
            json.dump(record, f)
        daemon.stop_nodes(session_root, force=True)
        assert bystander.poll() is None, "stop signalled a pid of another namespace"
        assert os.path.isdir(session_dir)
    finally:
        bystander.send_signal(_signal.SIGKILL)
        bystander.wait(10)
        shutil.rmtree(session_root, ignore_errors=True)
