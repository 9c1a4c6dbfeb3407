"""Helpers the integration tests share: polling, finding a root's processes, running and
talking to driver processes, parts of driver scripts (KEPT_PROBES, OUTCOME, CANCEL_AND_GET),
a stand-in NVML.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import miniray
from miniray._private.host import procinfo, session

REPO = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))


TEST_TOKEN = "miniray-test-token-" + "0" * 32  # `miniray start --head` never writes ~/.miniray

# A test whose non-forced cancel must interrupt a task spinning in a pure-Python loop.
CANCEL_REACHES_A_PYTHON_LOOP = pytest.mark.xfail(
    sys.version_info[:2] == (3, 13), strict=False,
    reason="CPython 3.13 may not deliver PyThreadState_SetAsyncExc to a thread in a tight "
           "pure-Python loop (python/cpython#139622), which is how a non-forced cancel reaches "
           "a running task")


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy or ``timeout`` passes; returns its
    last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for_gate(path: str, timeout: float = 30.0) -> bool:
    """In a task or actor call held by the test: whether the file gate ``path`` was opened
    (``open_gate``) within ``timeout`` seconds. A gate, not a sleep, decides what a loaded
    machine sees while the call is held."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def open_gate(path: str) -> None:
    """Open the file gate ``path`` that calls wait for (``wait_for_gate``)."""
    with open(path, "w") as f:
        f.write("open")


def procs_with_root(root: str) -> list[int]:
    """Live processes (other than this one) whose environment has ``MINIRAY_TMPDIR=<root>``."""
    needle = f"MINIRAY_TMPDIR={root}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        if needle in entries and procinfo.is_alive(int(name)):
            found.append(int(name))
    return found


# -------------------------------------------------------- nodes started with `miniray start`
# root -> env of every node_env_for root whose teardown has not run to its end: the
# session's last check (conftest's pytest_sessionfinish) stops what they left.
OPEN_ROOTS: dict[str, dict] = {}


def node_env_for(tmp_path):
    """A generator for a ``node_env`` fixture: an environment with its own MINIRAY_TMPDIR (a
    short path) and MINIRAY_HOST_DIR. On teardown every node of that root is stopped, and no
    process, session directory or shared-memory segment of the root may be left."""
    root = tempfile.mkdtemp(prefix="mrd-", dir="/tmp")
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    env.update(MINIRAY_TMPDIR=root, MINIRAY_HOST_DIR=str(tmp_path / "host"),
               PYTHONUNBUFFERED="1", MINIRAY_AUTH_TOKEN=TEST_TOKEN,
               PYTHONPATH=os.pathsep.join([REPO, env.get("PYTHONPATH", "")]))
    OPEN_ROOTS[root] = env
    yield env
    leftovers, sessions, segments = stop_root(root, env)
    assert not leftovers, f"processes of the node outlived it: {leftovers}"
    assert not sessions, f"session directories left behind: {sessions}"
    assert not segments, f"shared-memory segments left behind: {segments}"


def stop_root(root: str, env: dict) -> tuple[list, list, list]:
    """Stop every node of ``root`` (``miniray stop --force``), SIGKILL by pid what is left of
    its processes, remove the root; returns what was left then: (pids, session directories,
    shared-memory segments). The root is no longer open (``OPEN_ROOTS``)."""
    subprocess.run([sys.executable, "-m", "miniray", "stop", "--force"], env=env,
                   capture_output=True, timeout=60)
    wait_until(lambda: not procs_with_root(root), 10.0)
    leftovers = procs_with_root(root)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sessions = [n for n in os.listdir(root) if n.startswith("session_")] if os.path.isdir(
        root) else []
    prefix = f"mr_{session.root_tag(root)}"
    # Segments may be in /dev/shm or in the shared-memory directory a test set (MINIRAY_SHM_DIR).
    segments = [os.path.join(place, n)
                for place in dict.fromkeys([env.get("MINIRAY_SHM_DIR") or "/dev/shm", "/dev/shm"])
                if os.path.isdir(place) for n in os.listdir(place) if n.startswith(prefix)]
    for segment in segments:
        try:
            os.unlink(segment)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)
    OPEN_ROOTS.pop(root, None)
    return leftovers, sessions, segments


def cli(env, *args, timeout=60) -> subprocess.CompletedProcess:
    """``python -m miniray ARGS``. A ``start`` that names no port gets ``--port 0``: a node
    really listens on its port, and these tests are about the node, not the default port
    (6379, which another program or test may hold; ``test_node_cli.py`` tests the default)."""
    if args and args[0] == "start" and "--address" not in args and not any(
            arg == "--port" or arg.startswith("--port=") for arg in args):
        args = (*args, "--port", "0")
    return subprocess.run([sys.executable, "-m", "miniray", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


# A driver script's actor class (no indentation; ``ray`` is the driver's import): ``named``
# fails twice in three with a ValueError its retry_exceptions names, ``unnamed`` always
# fails. The retry_exceptions tests of service actors and of actors on other hosts.
FLAKY_ACTOR = """
class Flaky:
    def __init__(self):
        self.n = 0
    def where(self):
        return ray.get_runtime_context().get_node_id()
    @ray.method(retry_exceptions=[ValueError])
    def named(self):
        self.n += 1
        if self.n % 3:
            raise ValueError(self.n)
        return self.n
    def unnamed(self):
        self.n += 1
        raise ValueError(self.n)
"""


def driver(code: str, env, stdin=subprocess.DEVNULL, **extra) -> subprocess.Popen:
    """A driver program (``code``, dedented) run in its own process with ``env``."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            env=dict(env, **extra), stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop_driver(proc: subprocess.Popen) -> None:
    """SIGKILL a ``driver()`` process, reap it and close its pipes."""
    proc.kill()
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _json_at_start(text: str) -> dict:
    """The JSON object at the start of ``text``, whatever follows it: print() writes its
    text, then the newline, and a worker's line forwarded meanwhile lands between them."""
    return json.JSONDecoder().raw_decode(text)[0]


def finish_json(proc: subprocess.Popen, timeout: float) -> dict:
    """Wait for a ``driver()`` process to end (killed and reaped after ``timeout``, or on
    any error): its first stdout line holding a JSON object, parsed, with its whole stdout
    and stderr added as "stdout" and "stderr"."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop_driver(proc)
    line = next((x for x in out.splitlines() if x.startswith("{")), None)
    assert line is not None, f"no JSON from the driver: {err[-3000:]}"
    doc = _json_at_start(line)
    doc["stdout"], doc["stderr"] = out, err
    return doc


def json_line(proc: subprocess.Popen, timeout: float = 30) -> dict:
    """The next line of ``proc``'s stdout that holds a JSON object."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "{" in line:
            return _json_at_start(line[line.index("{"):])
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no JSON from the driver; stderr: {proc.stderr.read()[-3000:]}")


def go_on(proc: subprocess.Popen, timeout: float = 30) -> dict:
    """Tell a ``driver()`` process waiting on a line of its stdin to go on; the next line of
    its stdout that holds a JSON object."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    return json_line(proc, timeout)


# A driver script's cancel_and_get(ref, **options): ``ray.cancel(ref, **options)``, then its
# get; the error's name (None if it returned) and the seconds from the cancel to the get's
# end (the text goes after a prelude that imports time and miniray as ray).
CANCEL_AND_GET = """
    def cancel_and_get(ref, **options):
        t0 = time.monotonic()
        ray.cancel(ref, **options)
        try:
            ray.get(ref, timeout=20)
            outcome = None
        except Exception as error:
            outcome = type(error).__name__
        return outcome, time.monotonic() - t0
"""


# A driver script's outcome(ref): its value, or "<error type>: <error>" if its get raised.
OUTCOME = """
    def outcome(ref, timeout=30):
        try:
            return ray.get(ref, timeout=timeout)
        except Exception as error:
            return f"{type(error).__name__}: {error}"
"""


# A driver script's probes of where a kept value is (the text goes after a prelude that
# imports os, time, runtime and shm_segments and sets SHM, the member's store folder, and
# TAG, "mr_" + its root's tag; indented as the scripts of the test files are):
# kept(): the member's kept segments (not the links' budget files); here(ref): a copy in
# this driver's store; recorded(ref): the call is done and this driver records where its
# value is; until(check, seconds): check() polled until true or the time is up.
KEPT_PROBES = """
    def kept():
        return sorted(n for n in os.listdir(SHM) if n.startswith(TAG)
                      and not n.endswith("_budget"))

    def here(ref):
        store = runtime.current().store
        return os.path.exists(os.path.join(store.shm_dir, shm_segments.segment_name(
            store.session_tag, ref.binary())))

    def recorded(ref):
        entry = runtime.current().owner.objects.get(ref.binary())
        return entry is not None and entry.remote is not None

    def until(check, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not check():
            time.sleep(0.02)
        return check()
"""


def ledger_leases(env) -> dict:
    from miniray._private.transport import node_client

    record = node_client.find_node("auto", env["MINIRAY_TMPDIR"])
    with open(os.path.join(record.session_dir, "ledger.json")) as f:
        return json.load(f)["leases"]


def tmpfs_namespace(mount_point: str, options: str) -> list[str]:
    """The command that runs what follows it in a mount namespace of its own with a tmpfs
    mounted at ``mount_point`` with ``options`` (``unshare -m``, or ``-r -m`` where user
    namespaces are allowed): nothing is mounted on the machine, and the mount goes when the
    command exits. Skips the test, saying why, where neither works."""
    import pytest  # lazy: only tests that mount ask for it

    mount = f"mount -t tmpfs -o {options},mode=0700 tmpfs {mount_point} && exec \"$@\""
    tried = []
    for flags in (["-m"], ["-r", "-m"]):
        prefix = ["unshare", *flags, "--propagation", "private", "sh", "-c", mount, "sh"]
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return prefix
        tried.append(f"unshare {' '.join(flags)}: {probe.stderr.strip() or probe.returncode}")
    pytest.skip("a tmpfs cannot be mounted in a mount namespace here (" + "; ".join(tried) + ")")


def run_on_own_tmpfs(drivers, tmp_path, name: str, options: str, script: str,
                     timeout: float) -> tuple:
    """Run the driver ``script`` (the ``drivers`` fixture's way) with its store on a tmpfs of
    its own (``tmpfs_namespace``: a folder ``name`` under ``tmp_path``, mounted with
    ``options``) as ``MINIRAY_SHM_DIR``; the mount point and the last JSON line printed."""
    mount_point = tmp_path / name
    mount_point.mkdir(mode=0o700)
    prefix = tmpfs_namespace(str(mount_point), options)
    env = drivers.env(MINIRAY_SHM_DIR=str(mount_point))
    inner = subprocess.run([*prefix, sys.executable, drivers.script(script)], env=env,
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert inner.returncode == 0, inner.stderr
    return mount_point, json.loads(inner.stdout.strip().splitlines()[-1])


# Written as pynvml.py into a folder put on the PYTHONPATH of the processes under test: they
# find it the way they would find the real one, so production code needs no test hook.
FAKE_PYNVML = '''
"""A stand-in for pynvml in tests: devices come from FAKE_NVML_DEVICES ("name|uuid,...")."""
import os

_DEVICES = [d.split("|") for d in os.environ.get("FAKE_NVML_DEVICES", "").split(",") if d]


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_DEVICES)


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return _DEVICES[handle][0]


def nvmlDeviceGetUUID(handle):
    return _DEVICES[handle][1]
'''
