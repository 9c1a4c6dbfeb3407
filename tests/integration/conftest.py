"""Fixtures for the integration tests: real processes, and a leak check after every test.

Every test runs with its own session root (``MINIRAY_TMPDIR`` under ``tmp_path``). Tests that
start miniray use ``ray`` (``init(num_cpus=2)``) or the ``ray_start(**init_kwargs)`` factory;
on teardown the fixture shuts miniray down and then checks, polling for at most
``LEAK_WAIT_S`` seconds, that nothing the session created is left (house style, habit 12):

* none of the fork server and worker pids recorded just before ``shutdown()`` is alive,
* the test process has no descendant processes,
* no ``miniray-*`` thread is alive in the test process,
* no ``session_*`` directory is left under the session root (and the root is gone or empty),
* nothing in ``/dev/shm``, nor in the configured shared-memory directory
  (``MINIRAY_SHM_DIR``, ``shm_dirs()``), carries the session's name or the root's segment
  prefix (``mr_<root tag>``, ``session.root_tag``),
* no spill folder of the session is left under the shared spill root
  (``$TMPDIR/miniray-spill-<uid>/<session>``, used when the session root is memory-backed),
* no ledger left under the root holds a lease of a recorded pid or of the test process,
* ``miniray.is_initialized()`` is False.

"In this root and in no other": ``outside_snapshot()`` lists, before the test, the entries of
``/dev/shm``, of the spill root and of the user's default session root
(``/dev/shm/miniray-<uid>``); after it, ``find_leaks`` reports any new entry there that carries
this root's tag, one of the test's session names or the test process's pid (other engineers'
sessions on the same host are left alone).

On a leak the recorded pids (and the leftover descendants) are SIGKILLed, by pid, and the test
fails naming them. An autouse guard also fails a test that leaves miniray initialized or leaves
child processes behind without using the fixture.

An interrupted run: SIGTERM ends it as Ctrl-C does, so the running test's fixtures tear
down; at the run's end, any root of ``helpers.node_env_for`` whose teardown did not finish
has its nodes stopped and is removed, and a run that had passed fails naming it
(``test_interrupted_run.py``).

Subprocess drivers: the ``drivers`` fixture runs scripts with ``sys.executable``, the test's
environment (so the same ``MINIRAY_TMPDIR``) and the directory that holds the imported
``miniray`` package on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import miniray
from miniray._private import runtime
from miniray._private.core import config
from miniray._private.host import procinfo, session
from miniray._private.ledger.host_gpus import default_host_dir

from . import helpers
from .helpers import wait_until

LEAK_WAIT_S = 5.0
# The directory that holds the miniray package under test (the source tree or site-packages).
MINIRAY_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))


# ------------------------------------------------------------- an interrupted test run
_RUN_PID = os.getpid()


def _interrupt(signum, _frame):
    if os.getpid() != _RUN_PID:  # a child forked where the at-fork hook did not run (a C
        signal.signal(signum, signal.SIG_DFL)  # library's fork): it dies as by default
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def _default_sigterm_in_child() -> None:
    """A forked child dies of SIGTERM as by default from its first instruction, not when its
    handler gets to run: one wedged where no Python code runs (a lock some thread of the run
    held at the fork) never would, and ``Pool.terminate()`` joins it with no time limit."""
    if signal.getsignal(signal.SIGTERM) is _interrupt:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # pragma: no cover - forked from a thread Python has no main of
            pass


# SIGTERM (a CI time limit, `kill`) ends the run as Ctrl-C does: the running test's fixtures
# tear down (nodes started with `miniray start` live in sessions of their own, so the signal
# to the run's process group never reaches them; killed at once, the run left them running).
if (threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
    signal.signal(signal.SIGTERM, _interrupt)
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


def pytest_sessionfinish(session, exitstatus):
    """The run's last check: a node root whose teardown did not run to its end (an
    interrupt inside it, an error before its checks) has its nodes stopped and its files
    removed here; in a run that passed, that fails the run, naming the roots."""
    left = {}
    for root, env in list(helpers.OPEN_ROOTS.items()):
        pids, sessions, segments = helpers.stop_root(root, env)
        left[root] = pids + sessions + segments
    if left and exitstatus == 0:
        session.exitstatus = 1
        sys.stderr.write(f"node roots whose teardown did not finish, stopped now: {left}\n")


# ----------------------------------------------------------------------------- leak checks
def _live(pids) -> list[int]:
    return [pid for pid in pids if procinfo.is_alive(pid)]


def _miniray_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("miniray") and t.is_alive()]


def shm_dirs() -> list[str]:
    """Where segments may appear: the configured ``MINIRAY_SHM_DIR`` and ``/dev/shm``."""
    return list(dict.fromkeys([config.shm_dir(), config.DEFAULT_SHM_DIR]))


def _shm_entries(name: str) -> list[str]:
    found = []
    for place in shm_dirs():
        try:
            found += [os.path.join(place, e) for e in os.listdir(place) if name in e]
        except OSError:
            pass
    return found


def _session_dirs(root: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(root) if e.startswith("session_"))
    except FileNotFoundError:
        return []


def _root_leftovers(root: str) -> list[str]:
    try:
        return sorted(os.listdir(root))
    except FileNotFoundError:
        return []


def spill_root() -> str:
    """Where sessions whose root is memory-backed spill (``driver_session._spill_dir``)."""
    return os.path.join(tempfile.gettempdir(), f"miniray-spill-{os.getuid()}")


def default_root() -> str:
    """The user's own session root, which tests must never touch."""
    return f"/dev/shm/miniray-{os.getuid()}"


def user_host_dir() -> str:
    """The user's own host GPU directory (``MINIRAY_HOST_DIR`` unset), which tests must
    never touch: every test points MINIRAY_HOST_DIR at its own folder."""
    unset = {k: v for k, v in os.environ.items() if k != "MINIRAY_HOST_DIR"}
    return default_host_dir(unset)


def _listdir(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def outside_snapshot() -> dict:
    """The entries of the shared places a session may write outside its root."""
    return {place: _listdir(place)
            for place in (*shm_dirs(), spill_root(), default_root(), user_host_dir())}


def _root_segments(root: str) -> list[str]:
    prefix = "mr_" + session.root_tag(root)
    return sorted(os.path.join(place, e) for place in shm_dirs() for e in _listdir(place)
                  if e.startswith(prefix))


def _spill_leftovers(session_names) -> list[str]:
    return sorted(e for e in _listdir(spill_root()) if e in set(session_names))


def _ledger_leases(root: str, pids) -> list[str]:
    """Leases of ``pids`` in every ledger left under ``root`` (a node's session, say)."""
    from miniray._private.ledger.ledger import Ledger

    found = []
    for name in _session_dirs(root):
        path = os.path.join(root, name, "ledger.json")
        if not os.path.exists(path):
            continue
        try:
            ledger = Ledger(path)
            try:
                leases = ledger.snapshot().leases
            finally:
                ledger.close()
        except Exception as error:  # noqa: BLE001 - an unreadable ledger is worth a look
            found.append(f"{path}: unreadable ({type(error).__name__}: {error})")
            continue
        found += [f"{name}: lease {lease_id} of pid {lease.holder_pid}"
                  for lease_id, lease in leases.items()
                  if lease.holder_pid in pids or lease.worker_pid in pids]
    return found


def _new_outside(before: dict, root: str, session_names) -> list[str]:
    """Entries created since ``before`` outside the root that belong to this test (anything
    new in the user's host GPU directory does: its files carry no session's name)."""
    marks = ["mr_" + session.root_tag(root), f"_{os.getpid()}_", *session_names]
    host_dir = user_host_dir()
    found = []
    for place, entries in outside_snapshot().items():
        for entry in sorted(entries - before.get(place, set())):
            if place == host_dir or any(mark in entry for mark in marks):
                found.append(os.path.join(place, entry))
    return found


def snapshot_runtime() -> dict | None:
    """What the current driver runtime owns (pids, session), or None if none is running."""
    rt = runtime.current()
    if rt is None or getattr(rt, "mode", None) != "driver":
        return None
    return {
        "pids": list(rt.pids()),
        "session_dir": rt.session_dir,
        "session_name": os.path.basename(rt.session_dir),
    }


def find_leaks(recorded_pids, session_names, root: str, before: dict | None = None) -> list[str]:
    """The leaks left after a shutdown, waiting up to LEAK_WAIT_S for them to go away.
    ``before``: an ``outside_snapshot()`` taken before the test."""

    def leaks() -> list[str]:
        found = []
        if miniray.is_initialized():
            found.append("miniray.is_initialized() is still True")
        alive = _live(recorded_pids)
        if alive:
            found.append(f"recorded pids still alive: {alive}")
        desc = procinfo.descendants(os.getpid())
        if desc:
            found.append(f"descendant processes of the test: {desc}")
        threads = _miniray_threads()
        if threads:
            found.append(f"miniray threads still running: {threads}")
        dirs = _session_dirs(root)
        if dirs:
            found.append(f"session directories left under {root}: {dirs}")
        elif _root_leftovers(root):
            found.append(f"session root {root} not empty: {_root_leftovers(root)}")
        for name in session_names:
            shm = _shm_entries(name)
            if shm:
                found.append(f"/dev/shm entries of {name}: {shm}")
        segments = _root_segments(root)
        if segments:
            found.append(f"shared-memory segments of root {root}: {segments}")
        spilled = _spill_leftovers(session_names)
        if spilled:
            found.append(f"spill folders left under {spill_root()}: {spilled}")
        leases = _ledger_leases(root, set(recorded_pids) | {os.getpid()})
        if leases:
            found.append(f"ledger leases left: {leases}")
        if before is not None:
            outside = _new_outside(before, root, session_names)
            if outside:
                found.append(f"entries left outside the session root: {outside}")
        return found

    deadline = time.monotonic() + LEAK_WAIT_S
    while True:
        found = leaks()
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.02)


def kill_pids(pids) -> list[int]:
    killed = []
    for pid in pids:
        if procinfo.is_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def shutdown_and_check(root: str, extra_sessions=(), before: dict | None = None) -> None:
    """shutdown() the current session, then fail the test if anything is left behind.
    ``before``: an ``outside_snapshot()`` taken before the session started."""
    snap = snapshot_runtime()
    pids = list(snap["pids"]) if snap else []
    names = [snap["session_name"]] if snap else []
    names += [os.path.basename(s) for s in extra_sessions if s]
    miniray.shutdown()
    found = find_leaks(pids, names, root, before)
    if found:
        leftover = procinfo.descendants(os.getpid())
        killed = kill_pids(pids + [p for p in leftover if p not in pids])
        pytest.fail(
            "miniray leaked after shutdown(): " + "; ".join(found) + f" (SIGKILLed {killed})"
        )


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
def session_root(tmp_path, monkeypatch) -> str:
    root = str(tmp_path / "mr")
    monkeypatch.setenv("MINIRAY_TMPDIR", root)
    # The host-wide GPU ledger too: logical GPUs of a test must not meet another session's.
    monkeypatch.setenv("MINIRAY_HOST_DIR", str(tmp_path / "host"))
    # The cluster token: a node started by a test never creates ~/.miniray/auth_token.
    monkeypatch.setenv("MINIRAY_AUTH_TOKEN", "miniray-test-token-" + "0" * 32)
    # Settings a developer may have exported must not change what the tests see.
    for name in (
        "RAY_ADDRESS",
        "RAY_ENABLE_AUTO_CONNECT",
        "RAY_LOG_TO_DRIVER",
        "RAY_DISABLE_WORKER_LOG_PREFIX",
        "RAY_TASK_MAX_RETRIES",
        "CUDA_VISIBLE_DEVICES",
        "MINIRAY_PIPELINE_DEPTH",
        "MINIRAY_MAX_WORKERS",
    ):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture(autouse=True)
def _leak_guard(session_root, request):
    """Fails a test that leaves miniray initialized or leaves child processes behind."""
    if miniray.is_initialized():  # a previous test leaked; do not blame this one silently
        miniray.shutdown()
        pytest.fail("miniray was still initialized when this test started")
    yield
    problems = []
    snap = snapshot_runtime()
    if miniray.is_initialized() or snap is not None:
        problems.append("the test left miniray initialized")
        pids = snap["pids"] if snap else []
        miniray.shutdown()
        if not wait_until(lambda: not _live(pids)):
            problems.append(f"and its processes outlived shutdown: {kill_pids(pids)}")
    wait_until(lambda: not procinfo.descendants(os.getpid()))
    leftover = procinfo.descendants(os.getpid())
    if leftover:
        problems.append(f"descendant processes left: {leftover} (SIGKILLed {kill_pids(leftover)})")
    if problems:
        pytest.fail("; ".join(problems))


@pytest.fixture
def ray_start(session_root):
    """A factory: ``ray_start(**init_kwargs)`` runs ``miniray.init`` and returns its context.

    Teardown shuts down and checks for leaks (see the module docstring). A test may shut down
    and start again itself; every session directory it started is checked at the end.
    """
    contexts = []
    before = outside_snapshot()

    def start(*args, **kwargs):
        ctx = miniray.init(*args, **kwargs)
        contexts.append(ctx)
        return ctx

    yield start
    shutdown_and_check(session_root, extra_sessions=[c.get("session_dir") for c in contexts],
                       before=before)


@pytest.fixture
def ray(ray_start):
    """miniray, initialized with ``num_cpus=2``."""
    ray_start(num_cpus=2)
    return miniray


# ----------------------------------------------------------------------------- drivers
class Drivers:
    """Runs Python scripts as separate driver processes (``sys.executable``), in ``tmp_path``.

    The child inherits the test's environment (so the same ``MINIRAY_TMPDIR``) with the
    directory holding the miniray under test prepended to ``PYTHONPATH``. Scripts need no
    ``if __name__ == "__main__"`` guard.
    """

    def __init__(self, tmp_path):
        self.tmp_path = str(tmp_path)
        self.started: list[subprocess.Popen] = []

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [MINIRAY_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT on a hang dumps every thread's stack
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def script(self, source: str) -> str:
        path = os.path.join(self.tmp_path, f"driver_{time.monotonic_ns()}.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(source))
        return path

    def run(self, source: str, timeout: float = 60, args=(), **env) -> subprocess.CompletedProcess:
        """Run ``source`` to completion; stdout and stderr are captured as text."""
        proc = self.start(source, args=args, **env)
        out, err = self.communicate(proc, timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def start(self, source: str, args=(), **env) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, self.script(source), *args],
            cwd=self.tmp_path,
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    @staticmethod
    def _lines(proc: subprocess.Popen) -> queue.Queue:
        """The queue a thread fills with ``proc``'s stdout lines (None at EOF), started on
        first use. select() on the pipe cannot say whether a line waits: readline() may
        have buffered the next lines already, and a select() then waits for bytes that
        have arrived."""
        lines = getattr(proc, "_test_lines", None)
        if lines is None:
            lines = proc._test_lines = queue.Queue()

            def pump():
                try:
                    for line in proc.stdout:
                        lines.put(line)
                except (OSError, ValueError):  # closed by close() at teardown
                    pass
                lines.put(None)

            proc._test_pump = threading.Thread(target=pump, daemon=True)
            proc._test_pump.start()
        return lines

    @classmethod
    def read_line(cls, proc: subprocess.Popen, timeout: float = 30) -> str:
        """The next line of ``proc``'s stdout; fails the test if none comes within timeout."""
        try:
            line = cls._lines(proc).get(timeout=timeout)
        except queue.Empty:
            proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack on stderr
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            pytest.fail(f"driver printed nothing within {timeout} s; the lines read before: "
                        f"{getattr(proc, '_test_read', [])[-20:]!r}; its stderr and stacks:\n"
                        f"{proc.stderr.read()[-8000:]}")
        if line is None:
            proc.wait(timeout=10)
            pytest.fail(f"driver exited ({proc.returncode}) before printing: {proc.stderr.read()}")
        if not hasattr(proc, "_test_read"):
            proc._test_read = []
        proc._test_read.append(line)
        return line

    @classmethod
    def communicate(cls, proc: subprocess.Popen, timeout: float = 30) -> tuple[str, str]:
        """Wait for ``proc``; if it hangs, fail with every thread's stack (faulthandler).
        Its stdout is what ``read_line`` has not returned yet."""
        if getattr(proc, "_test_lines", None) is None:
            try:
                return proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                try:
                    _out, err = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _out, err = proc.communicate()
                pytest.fail(f"driver did not exit within {timeout} s; its stacks:\n"
                            f"{err[-6000:]}")
        # stdout is pumped by read_line's thread: read stderr in another while waiting, so
        # a chatty process cannot block on a full pipe.
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stderr.read()), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
        proc._test_pump.join(timeout=10)
        err = "".join(chunks)
        if hung:
            pytest.fail(f"driver did not exit within {timeout} s; its stacks:\n{err[-6000:]}")
        rest = []
        while True:
            try:
                line = proc._test_lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                rest.append(line)
        return "".join(rest), err

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            pump = getattr(proc, "_test_pump", None)
            if pump is not None:
                pump.join(timeout=5)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def drivers(tmp_path):
    d = Drivers(tmp_path)
    yield d
    d.close()


@pytest.fixture
def node_env(tmp_path):
    """An environment for nodes started with ``miniray start`` (see helpers.node_env_for)."""
    from .helpers import node_env_for

    yield from node_env_for(tmp_path)
