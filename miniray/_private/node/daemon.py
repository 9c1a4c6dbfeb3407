"""What the CLI does to a node from outside: start it as a daemon, stop the recorded nodes.

Owns: ``spawn_daemon`` (it returns once the node answered a HELLO), ``spawn_dashboard`` (a
node's ``miniray dashboard``, recorded in its session) and ``stop_nodes`` (by
recorded pid and start time, never by name), and sweeping what stopped nodes leave.
Does not own: the node records and the connection (``transport/node_client.py``) or the node
process (``node.py``).
Called by: the CLI (``start``, ``stop``) and tests. ``spawn_daemon`` is for the short-lived CLI
process: the daemon is its child until the CLI exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import miniray
from miniray._private.core import config
from miniray._private.core.node_start import READY_TIMEOUT_S, NodeStartError

TYPE_CHECKING = False  # typing's constant, without importing typing (see the imports below)
if TYPE_CHECKING:
    from miniray._private.transport.node_client import NodeRecord

# The records, the connection and the process probes (node_client, session, procinfo), and
# logging, are imported inside the functions, lazily: `miniray start` launches the node
# process first and loads them once the node answered, not before.

# In a node's session: the pid and start time of the dashboard `miniray start` started.
DASHBOARD_RECORD = "dashboard.json"
DASHBOARD_LOG = "dashboard.log"


def _child_env() -> dict:
    """This environment, with the miniray package in use first on PYTHONPATH."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [parent] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


class _Forked:
    """The node process ``spawn_daemon`` forked: its pid and the read end of its stderr."""

    def __init__(self, pid: int, stderr):
        self.pid = pid
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _fork_node(options: dict, ready_w: int, ready_r: int) -> _Forked:
    """The node process, forked from this one (the CLI, single-threaded, with its light
    imports: a new interpreter would pay its start and ``site`` again on the join's path)
    in a new session, cwd ``/``, stdin and stdout on /dev/null, stderr on a pipe this
    process reads until the node is ready; it runs ``node.main`` as the daemon entry
    point does and never returns. Not for a process with threads (this CLI has none)."""
    env = _child_env()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the node
        code = 1
        try:
            os.close(ready_r)
            os.close(err_r)
            os.setsid()
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err_w, 2)
            os.close(null)
            os.close(err_w)
            os.environ.clear()
            os.environ.update(env)  # what the node's own children inherit
            sys.argv = ["-c", str(ready_w), json.dumps(options)]
            from miniray._private.node.node import main  # lazy: the node's, in it only

            main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        except BaseException:  # noqa: BLE001 - reported on stderr, which the CLI reads
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(err_w)
    return _Forked(pid, os.fdopen(err_r, "rb"))


def spawn_daemon(options: dict, timeout: float = READY_TIMEOUT_S) -> tuple[NodeRecord, dict]:
    """Starts a node in the background (forked: ``_fork_node``; a new session, stdin
    /dev/null, output to its ``node.log``), waits until it answers a HELLO, and returns its
    record and WELCOME info. NodeStartError if it fails or is not ready within
    ``timeout`` seconds."""
    read_fd, write_fd = os.pipe()
    try:
        proc = _fork_node(options, write_fd, read_fd)
    finally:
        os.close(write_fd)
    deadline = time.monotonic() + timeout
    chunks = []
    with os.fdopen(read_fd, "rb") as ready:
        while time.monotonic() < deadline:
            if not select.select([ready], [], [], max(0.0, deadline - time.monotonic()))[0]:
                continue
            chunk = os.read(ready.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
    line = b"".join(chunks).decode(errors="replace").strip()
    doc = json.loads(line) if line.startswith("{") else None
    # lazy: loaded once the node answered, not while it starts (on a busy machine, this
    # process importing beside it would take CPU time from it)
    from miniray._private.host import session
    from miniray._private.transport import node_client

    if doc is None or not doc.get("ok"):
        if doc is None and proc.poll() is None:  # not ready in time: it is ours to kill
            proc.kill()
        proc.wait(10)
        err = proc.stderr.read().decode(errors="replace").strip() if proc.poll() is not None \
            else ""
        proc.stderr.close()
        session.sweep_dead_sessions(os.path.abspath(options.get("temp_dir")
                                                    or config.tmpdir_root()))
        if doc is not None:
            raise NodeStartError(doc["error"])
        what = (f"exited with code {proc.returncode}" if proc.returncode is not None
                else f"was not ready within {timeout:g} s")
        raise NodeStartError(f"the miniray node {what}." + (f"\n{err[-3000:]}" if err else ""))
    proc.stderr.close()
    record = node_client.read_record(doc["record"])
    if record is None:
        raise NodeStartError(f"the node reported {doc['record']}, which cannot be read")
    client = node_client.connect(record, timeout=max(1.0, deadline - time.monotonic()),
                                 probe=True)
    info = client.info
    client.close()
    return record, info


def spawn_dashboard(record: NodeRecord, host: str, port: int, timeout: float = 30.0) -> str:
    """Starts ``miniray dashboard`` for a node's session in the background (its own
    session, output in the node's ``dashboard.log``); it records its pid there for
    ``stop_nodes``. Returns the URL it printed; NodeStartError if it printed none in time."""
    log_path = os.path.join(record.session_dir, DASHBOARD_LOG)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "miniray", "dashboard", "--address", record.session_dir,
             "--host", host, "--port", str(port), "--record-dir", record.session_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True, cwd="/", env=_child_env())
    line = b""
    with proc.stdout:
        if select.select([proc.stdout], [], [], timeout)[0]:
            line = proc.stdout.readline()
    url = line.decode(errors="replace").strip().rpartition(" ")[2]
    if url.startswith("http://"):
        return url
    if proc.poll() is None:  # not ready in time: it is ours to kill
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    try:
        with open(log_path, errors="replace") as f:
            why = f.read().strip().splitlines()[-1:]
    except OSError:
        why = []
    raise NodeStartError("the dashboard did not start" + (f": {why[0]}" if why else "."))


def _recorded_dashboard(session_dir: str) -> tuple[int | None, int | None]:
    try:
        with open(os.path.join(session_dir, DASHBOARD_RECORD)) as f:
            doc = json.load(f)
        return int(doc["pid"]), doc.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


# ------------------------------------------------------------------------- stopping nodes
def _signal(pid: int | None, start: int | None, sig: int) -> bool:
    """Signals ``pid`` only while it is still the recorded process (pid and start time)."""
    from miniray._private.host import procinfo  # lazy: see the imports

    if not pid or not procinfo.is_alive(pid, start):
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_gone(procs: list[tuple[int | None, int | None]], timeout: float) -> list:
    from miniray._private.host import procinfo  # lazy: see the imports

    deadline = time.monotonic() + timeout
    while True:
        alive = [(p, s) for p, s in procs if p and procinfo.is_alive(p, s)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def actor_service_of(record: NodeRecord) -> tuple[int | None, int | None]:
    """``(pid, start time)`` of a node's actor service, from the file the node writes."""
    from miniray._private.transport.node_client import SERVICE_PID  # lazy: see the imports

    try:
        with open(os.path.join(record.session_dir, SERVICE_PID)) as f:
            pid, start = f.read().split()
        return int(pid), int(start)
    except (OSError, ValueError):
        return None, None


def stop_nodes(root: str | None = None, *, force: bool = False, grace: float = 16.0) -> int:
    """Stops the nodes recorded under session root ``root`` (and the one its ``current_node``
    names), by recorded pid and start time, never by name: SIGTERM, SIGKILL after ``grace``
    seconds (at once with ``force``). Waits for each node, its fork server and its actor
    service to be gone, then sweeps their session directories and stale records. Returns how
    many were running."""
    import logging

    # lazy: see the imports
    from miniray._private.host import procinfo, session
    from miniray._private.transport.node_client import list_records, root_locked, sweep_stale

    logger = logging.getLogger(__name__)
    root = os.path.abspath(root or config.tmpdir_root())
    records = list_records(root, alive_only=False)
    # A node of another PID namespace sharing the root: its pid means nothing here, so it is
    # neither signalled nor swept (stop it from its own namespace).
    foreign = [r for r in records if not r.here() and not r.provably_dead()]
    for record in foreign:
        logger.warning("node pid %d runs in another PID namespace (%s); left alone",
                       record.pid, record.pid_ns)
    records = [r for r in records if r not in foreign]
    # Each node's dashboard first: it only reads the session.
    dashboards = [_recorded_dashboard(r.session_dir) for r in records]
    for pid, start in dashboards:
        _signal(pid, start, signal.SIGTERM)
    for pid, start in _wait_gone(dashboards, 5.0):
        _signal(pid, start, signal.SIGKILL)
    live = [r for r in records if procinfo.is_alive(r.pid, r.start_time)]
    for record in live:
        _signal(record.pid, record.start_time, signal.SIGKILL if force else signal.SIGTERM)
    left = _wait_gone([(r.pid, r.start_time) for r in live], 0.0 if force else grace)
    for pid, start in left:
        if not force:
            logger.warning("node pid %d still running after %g s: SIGKILL", pid, grace)
        _signal(pid, start, signal.SIGKILL)
    _wait_gone(left, 10.0)
    # A node that died without its shutdown: its fork server sees EOF, kills the workers and
    # exits. Wait for that, so nothing of the node is left when this returns.
    forks = [(r.fork_server_pid, r.fork_server_start) for r in records]
    # So does its actor service (it gets SIGTERM when the node dies, and shuts down as a
    # driver, writing to the session): wait for it before the session directory goes.
    children = forks + [actor_service_of(r) for r in records]
    for pid, start in _wait_gone(children, 5.0):
        _signal(pid, start, signal.SIGKILL)
    _wait_gone(children, 5.0)
    roots = {root} | {os.path.dirname(r.session_dir) for r in records}
    for r in records:
        if os.path.isdir(r.session_dir) and not session.is_session_alive(r.session_dir):
            shutil.rmtree(r.session_dir, ignore_errors=True)
    for r in sorted(roots):
        with root_locked(r):
            sweep_stale(r)
        with contextlib.suppress(OSError):
            os.rmdir(r)
    _sweep_dead_segments()
    return len(live)


def _sweep_dead_segments() -> None:
    """Shared-memory segments of drivers that died (SIGKILL) go too, as at init()."""
    from miniray._private.object_store import shm_segments  # lazy: `start` does not need it

    shm_segments.sweep_dead_segments(config.shm_dir())
