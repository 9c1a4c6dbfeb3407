"""Node workloads (issue 6) for one implementation: a node started from the shell, a second
driver, a detached named actor.

Owns: starting, measuring and stopping a node from the command line, and the way each figure
is measured. Does not own: running the implementations side by side or judging targets
(``compare.py --suite node``), the child process and the JSON (``harness.py``).

    python benchmarks/bench_node.py --impl {miniray,ray}

prints exactly one JSON object on stdout and exits 1 if a step failed. The same code runs for
both (``import miniray as ray`` / ``import ray``, in every process it starts). One workload,
``node``, runs in its own child (``harness.py``) and does, in order, on one node:

    node_start_s        miniray: ``python -m miniray start --head --num-cpus 2 --port <free
                        port>`` with ``MINIRAY_TMPDIR`` set to a fresh directory
                        (``/tmp/mrb-*/root``); the command returns once the node answered (it
                        waits for the node's HELLO), so the figure is perf_counter() before
                        ``Popen`` to the command's exit.
                        Ray: ``ray start --head --num-cpus=2 --port=<free port>
                        --temp-dir=<fresh dir> --include-dashboard=false --block
                        --dashboard-agent-listen-port=<free port>`` (``Popen``,
                        ``start_new_session=True``; the agent port only so that another Ray on
                        the host cannot clash with it). ``--block`` never returns, so right after
                        it a polling child is started (``import ray``; wait until the GCS port
                        accepts a TCP connection, polling every 10 ms; then ``ray.init(address=
                        "127.0.0.1:<port>")``, retried 50 ms after a failure, until one returns;
                        all within 60 s; it shares the 2 cores with the starting node). The
                        figure is the clock before the first ``Popen`` to the moment that
                        ``ray.init()`` returned (the child prints ``time.monotonic()``, the
                        parent's clock is the same one). It includes one driver's ``init()``,
                        which waits for the node to be ready; details give how long that
                        successful call took and when ``ray start`` printed "Ray runtime
                        started". A node that exits before it is ready is started again on
                        other ports (at most 3 tries; details count them).
    connect_s           a fresh process ``import <module> as ray; ray.init(address=
                        "127.0.0.1:<port>")``, prints ``time.monotonic()`` as soon as
                        ``init()`` returned, then ``ray.shutdown()`` and exits. The figure is the
                        parent's clock before ``Popen`` to that timestamp; best of 3 (every run,
                        with the child's own import and init times, in details).
    named_call_ms       driver 1, a fresh process: ``init(address=...)``, ``a = A.options(
                        name="a", namespace="bench", lifetime="detached").remote()`` with ``class
                        A: def f(self): return None``, ``get(a.f.remote())``, exits. Then this
                        process (driver 2): ``init(address=...)``, ``a = get_actor("a",
                        namespace="bench")``, 200 warm-up calls, 2,000 sequential
                        ``get(a.f.remote())``, each timed; mean (``named_call_p50_ms``; p99 and
                        min in details).
    named_calls_per_s   the same driver and handle: ``get([a.f.remote() for _ in
                        range(10_000)])``, wall time including submission; best of 3. Driver 2
                        then calls ``shutdown()``; the detached actor stays alive.
    node_stop_s         miniray: ``python -m miniray stop`` (same MINIRAY_TMPDIR), the command's
                        wall time until it returned; then every process whose environment holds
                        that MINIRAY_TMPDIR (or whose command line names it) must be gone, and
                        no ``/dev/shm/mr_<root tag>*`` segment of it left (a step error if not).
                        Ray: SIGTERM to the ``ray start --block`` process (by its pid, not its
                        group), the time until that process exited; the time until its whole
                        process group was gone, and whether the drain finished, are in details.
                        On SIGTERM, Ray 2.60's ``--block`` process first drains the node (it
                        waits until the raylet is idle and exits, at most
                        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, default 30 s), then stops every
                        child. The detached actor is still alive here, so the drain runs out its
                        30 s. Only that process is signalled because that is the path Ray
                        designed for SIGTERM: with SIGTERM to the whole group
                        (``MINIRAY_BENCH_RAY_SIGTERM_GROUP=1``) the GCS dies at once, the drain
                        RPC to it fails after the same 30 s (twice when the process has to open
                        its GCS client first) and the process exits after 33-60 s. ``ray
                        stop`` (it kills every Ray process on the host by name) is never run.

A step that fails after the start is recorded in ``errors`` (``node.<step>``) and the next
still runs; a failed start ends the workload (nothing to measure without a node). Every node is
cleaned up in a ``finally`` (and by a watchdog thread before the harness's limit): Ray gets
SIGTERM to its process group, SIGKILL 15 s later; miniray ``python -m miniray stop --force``
with the same MINIRAY_TMPDIR; then any process left of it (matched by process group,
environment or command line: only processes this workload started) gets SIGKILL by pid, the
segments of its session root are removed, and the temp directories too.

Ray's node and drivers get ``RAY_AUTH_MODE=token`` when a token exists (``~/.ray/auth_token``,
``RAY_AUTH_TOKEN[_PATH]``): ``ray start`` then enables token authentication by itself, and a
driver given an explicit address does not, so without it every ``ray.init(address=...)`` fails
after 20 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from bench_core import _child_env  # noqa: E402

NUM_CPUS = 2
NAMESPACE = "bench"
ACTOR_NAME = "a"
WARMUP = 200
SYNC_CALLS = 2_000
PIPELINED_CALLS = 10_000
PIPELINED_RUNS = 3
CONNECT_RUNS = 3
START_TRIES = 3
READY_TIMEOUT_S = 60.0  # the node ready (Ray's polling child), miniray start's own wait
CHILD_TIMEOUT_S = 60.0  # each driver child
STOP_TIMEOUT_S = 60.0  # the measured stop
KILL_AFTER_S = 15.0  # cleanup: SIGTERM, then SIGKILL after this
# Ray's measured stop signals the `ray start --block` process only;
# MINIRAY_BENCH_RAY_SIGTERM_GROUP=1 signals its whole process group instead (33-60 s with
# Ray 2.60: see the docstring).
RAY_SIGTERM_GROUP = os.environ.get("MINIRAY_BENCH_RAY_SIGTERM_GROUP") == "1"
NODE_LIMIT_S = 300.0  # the harness's limit for the whole workload
WATCHDOG_S = NODE_LIMIT_S - 40.0  # clean up the node before the harness gives up on us
SHM_DIR = "/dev/shm"

# Driver children, the same for both implementations ({module} is miniray or ray).
CONNECT_CHILD = (
    "import sys, time\n"
    "t0 = time.monotonic()\n"
    "import {module} as ray\n"
    "t1 = time.monotonic()\n"
    "ray.init(address=sys.argv[1])\n"
    "t2 = time.monotonic()\n"
    "print('READY', t2, t1 - t0, t2 - t1, flush=True)\n"
    "ray.shutdown()\n"
    "print('SHUTDOWN', time.monotonic() - t2, flush=True)\n"
)

CREATE_ACTOR_CHILD = (
    "import sys\n"
    "import {module} as ray\n"
    "class A:\n"
    "    def f(self):\n"
    "        return None\n"
    "ray.init(address=sys.argv[1])\n"
    "A = ray.remote(A)\n"
    f"a = A.options(name={ACTOR_NAME!r}, namespace={NAMESPACE!r}, lifetime='detached').remote()\n"
    "ray.get(a.f.remote())\n"
    "print('CREATED', flush=True)\n"
)

# Ray's readiness poller: started right after `ray start --block`.
POLL_CHILD = (
    "import socket, sys, time\n"
    "deadline = time.monotonic() + float(sys.argv[2])\n"
    "import {module} as ray\n"
    "host, port = sys.argv[1].rsplit(':', 1)\n"
    "polls = 0\n"
    "while time.monotonic() < deadline:\n"
    "    polls += 1\n"
    "    try:\n"
    "        socket.create_connection((host, int(port)), timeout=1.0).close()\n"
    "        break\n"
    "    except OSError:\n"
    "        time.sleep(0.01)\n"
    "t_tcp = time.monotonic()\n"
    "attempts = 0\n"
    "while time.monotonic() < deadline:\n"
    "    attempts += 1\n"
    "    t = time.monotonic()\n"
    "    try:\n"
    "        ray.init(address=sys.argv[1])\n"
    "    except Exception as error:\n"
    "        print('FAILED', attempts, repr(error)[:300], file=sys.stderr, flush=True)\n"
    "        try:\n"
    "            ray.shutdown()\n"
    "        except Exception:\n"
    "            pass\n"
    "        time.sleep(0.05)\n"
    "        continue\n"
    "    t_ready = time.monotonic()\n"
    "    print('READY', t_ready, t_tcp, t, attempts, polls, flush=True)\n"
    "    ray.shutdown()\n"
    "    sys.exit(0)\n"
    "sys.exit(1)\n"
)


# --------------------------------------------------------------------------------------------
# processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _proc_info(pid: int) -> tuple[str, int, bytes, bytes] | None:
    """(state, process group, cmdline, environ) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except OSError:
        environ = b""
    return fields[0], int(fields[2]), cmdline, environ


def _find_processes(pgid: int | None = None, env_entry: str | None = None, text: str = ""):
    """Live processes (not zombies, not this one) in process group ``pgid``, or whose
    environment holds ``env_entry`` ("NAME=value"), or whose command line contains ``text``.
    Returns [(pid, command line)]."""
    found = []
    entry = env_entry.encode() + b"\0" if env_entry else None
    needle = text.encode() if text else None
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        info = _proc_info(int(name))
        if info is None or info[0] == "Z":
            continue
        state, group, cmdline, environ = info
        if (
            (pgid is not None and group == pgid)
            or (entry is not None and (environ.startswith(entry) or b"\0" + entry in environ))
            or (needle is not None and needle in cmdline)
        ):
            words = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append((int(name), words[:160]))
    return found


def _kill_pids(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _wait_for(predicate, timeout: float, step: float = 0.02) -> float | None:
    """Seconds until ``predicate()`` was true, or None if it was not within ``timeout``."""
    t0 = time.perf_counter()
    while True:
        if predicate():
            return time.perf_counter() - t0
        if time.perf_counter() - t0 >= timeout:
            return None
        time.sleep(step)


def _run_child(argv: list[str], env: dict, timeout: float = CHILD_TIMEOUT_S):
    """Run a driver child in its own process group; return (t0 before Popen, stdout, exit
    time). RuntimeError with its stderr tail when it fails or passes ``timeout``."""
    with tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            out, _ = proc.communicate()
        t_exit = time.monotonic()
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-3000:].decode(errors="replace")
            raise RuntimeError(
                f"{argv[1:3]} exited with {proc.returncode} (killed after {timeout:g} s if "
                f"negative); stdout {text[-500:]!r}; stderr tail:\n{tail}"
            )
        err.seek(0)
        warnings = [
            line
            for line in err.read().decode(errors="replace").splitlines()
            if " W " in line or "WARN" in line or "Error" in line
        ]
    return t0, text, t_exit, warnings[:5]


# --------------------------------------------------------------------------------------------
# the two nodes


class _Node:
    """One node started from the shell: start (measured), stop (measured), cleanup."""

    impl = ""
    module = ""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="mrb-", dir="/tmp")
        self.port = _free_port()
        self.env = _child_env()
        self.lock = threading.Lock()
        self.cleaned = False
        self.left: list = []  # processes found (and killed) by cleanup

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def python_child(self, code: str) -> list[str]:
        return [sys.executable, "-c", code.format(module=self.module), self.address]


class MinirayNode(_Node):
    impl = "miniray"
    module = "miniray"

    def __init__(self) -> None:
        super().__init__()
        self.root = os.path.join(self.tmp, "root")
        self.env["MINIRAY_TMPDIR"] = self.root
        os.environ["MINIRAY_TMPDIR"] = self.root  # this process is driver 2
        self.tag = _root_tag(self.root)

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "miniray", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=self.env,
            text=True,
            timeout=timeout,
        )

    def start(self) -> dict:
        argv = ["start", "--head", "--num-cpus", str(NUM_CPUS), "--port", str(self.port)]
        t0 = time.perf_counter()
        proc = self._cli(*argv, timeout=READY_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or self.address not in proc.stdout:
            raise RuntimeError(
                f"miniray start exited with {proc.returncode}; stdout {proc.stdout[-1000:]!r}; "
                f"stderr {proc.stderr[-2000:]!r}"
            )
        return {
            "node_start_s": elapsed,
            "details": {
                "command": "python -m miniray " + " ".join(argv),
                "stderr": proc.stderr.strip()[-500:],
            },
        }

    def leftovers(self) -> list:
        return _find_processes(env_entry=f"MINIRAY_TMPDIR={self.root}", text=self.root)

    def segments(self) -> list[str]:
        prefix = f"mr_{self.tag}"
        try:
            return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
        except OSError:
            return []

    def stop(self) -> dict:
        t0 = time.perf_counter()
        proc = self._cli("stop", timeout=STOP_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"miniray stop exited with {proc.returncode}: {proc.stderr}")
        # Give a straggler a moment, so "left" means left, not "exiting".
        gone_s = _wait_for(lambda: not self.leftovers(), 5.0)
        left, segments = self.leftovers(), self.segments()
        details = {
            "command": "python -m miniray stop",
            "stdout": proc.stdout.strip(),
            "stderr": proc.stderr.strip()[-500:],
            "processes_gone_after_return_s": gone_s,
            "processes_left": left,
            "segments_left": segments,
            "root_left": os.path.exists(self.root),
        }
        result = {"node_stop_s": elapsed, "details": details}
        if left or segments:
            result["error"] = f"left after miniray stop: processes {left}, segments {segments}"
        return result

    def cleanup(self) -> None:
        with self.lock:
            if self.cleaned:
                return
            self.cleaned = True
            try:
                self._cli("stop", "--force", timeout=30)
            except (OSError, subprocess.SubprocessError) as error:
                print(f"bench_node: miniray stop --force: {error}", file=sys.stderr)
            left = self.leftovers()
            if left:
                _wait_for(lambda: not self.leftovers(), 5.0)
                left = self.leftovers()
                _kill_pids(pid for pid, _ in left)
            self.left = left
            for name in self.segments():
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except OSError:
                    pass
            shutil.rmtree(self.tmp, ignore_errors=True)


def _root_tag(root: str) -> str:
    """The 6-hex tag that starts every /dev/shm segment name of a session root."""
    try:
        from miniray._private.host.session import root_tag

        return root_tag(root)
    except ImportError:  # same rule: sha1 of the absolute root path
        return hashlib.sha1(os.path.abspath(root).encode()).hexdigest()[:6]


def _set_ray_auth_mode() -> None:
    """``RAY_AUTH_MODE=token`` for the node and every driver when a token exists (unless it is
    set already): ``ray start`` turns token authentication on by itself when it finds one, a
    driver given an explicit address does not. Must run before ``import ray``."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or os.path.exists(token_file)
    ):
        os.environ["RAY_AUTH_MODE"] = "token"


class RayNode(_Node):
    impl = "ray"
    module = "ray"

    def __init__(self) -> None:
        super().__init__()
        self.proc: subprocess.Popen | None = None
        self.poller: subprocess.Popen | None = None
        self.out_lines: list[tuple[float, str]] = []
        # node_workload set RAY_AUTH_MODE (before `import ray`, which reads it) when needed.
        self.auth_mode = os.environ.get("RAY_AUTH_MODE")
        cli = os.path.join(os.path.dirname(sys.executable), "ray")
        self.cli = (
            [cli]
            if os.path.exists(cli)
            else [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
        )

    def _read_output(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.out_lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))
        stream.close()

    def _launch(self) -> tuple[float, list[str]]:
        argv = [
            *self.cli,
            "start",
            "--head",
            f"--num-cpus={NUM_CPUS}",
            f"--port={self.port}",
            f"--temp-dir={self.tmp}",
            "--include-dashboard=false",
            "--block",
            f"--dashboard-agent-listen-port={_free_port()}",
        ]
        self.out_lines = []
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        self.poller = subprocess.Popen(
            [*self.python_child(POLL_CHILD), str(READY_TIMEOUT_S)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        threading.Thread(target=self._read_output, args=(self.proc.stdout,), daemon=True).start()
        return t0, argv

    def _wait_poller(self) -> tuple[bytes, bytes]:
        """The poller's output once it exits, or is killed when the node died first."""
        deadline = time.monotonic() + READY_TIMEOUT_S + 10
        while time.monotonic() < deadline:
            if self.poller.poll() is not None:
                break
            if self.proc.poll() is not None:  # the node is gone: no point polling it
                time.sleep(1.0)
                _killpg(self.poller, signal.SIGKILL)
                break
            time.sleep(0.02)
        else:
            _killpg(self.poller, signal.SIGKILL)
        return self.poller.communicate()

    def start(self) -> dict:
        tries = []
        for attempt in range(START_TRIES):
            if attempt:
                self._kill_node()
                self.port = _free_port()
            t0, argv = self._launch()
            out, err = self._wait_poller()
            lines = out.decode(errors="replace").splitlines()
            ready = [ln for ln in lines if ln.startswith("READY")]
            if ready and self.proc.poll() is None:
                _, t_ready, t_tcp, t_attempt, attempts, polls = ready[0].split()
                started = [t for t, line in self.out_lines if "Ray runtime started" in line]
                err_lines = err.decode(errors="replace").splitlines()
                failures = [ln for ln in err_lines if ln.startswith("FAILED")]
                return {
                    "node_start_s": float(t_ready) - t0,
                    "details": {
                        "command": " ".join([os.path.basename(argv[0]), *argv[1:]]),
                        "auth_mode": self.auth_mode,
                        "tries": tries + [{"port": self.port, "ok": True}],
                        "gcs_port_open_s": float(t_tcp) - t0,
                        "successful_init_started_s": float(t_attempt) - t0,
                        "successful_init_call_s": float(t_ready) - float(t_attempt),
                        "init_attempts": int(attempts),
                        "tcp_polls": int(polls),
                        "failed_attempts": failures[:5],
                        "cli_printed_started_s": (started[0] - t0) if started else None,
                    },
                }
            tries.append(
                {
                    "port": self.port,
                    "ok": False,
                    "node_exit": self.proc.poll(),
                    "output_tail": [line for _, line in self.out_lines[-15:]],
                    "poller_stderr_tail": err.decode(errors="replace")[-1500:],
                }
            )
        raise RuntimeError(f"ray start did not become ready in {START_TRIES} tries: {tries}")

    def stop(self) -> dict:
        pgid = self.proc.pid
        t0 = time.perf_counter()
        if RAY_SIGTERM_GROUP:
            os.killpg(pgid, signal.SIGTERM)
        else:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {
                "error": f"ray start --block still running {STOP_TIMEOUT_S:g} s after SIGTERM",
                "details": {"output_tail": [line for _, line in self.out_lines[-15:]]},
            }
        elapsed = time.perf_counter() - t0
        group_s = _wait_for(lambda: not _find_processes(pgid=pgid), KILL_AFTER_S)
        group_left = _find_processes(pgid=pgid, text=self.tmp)
        details = {
            "signal": "SIGTERM to the ray start --block "
            + ("process group" if RAY_SIGTERM_GROUP else "process (pid)"),
            "exit_code": self.proc.returncode,
            "group_gone_s": None if group_s is None else elapsed + group_s,
            # What ray start said about draining after the SIGTERM ("did not finish draining",
            # "finished draining", "Failed to mark the local node as draining").
            "drain": [
                line.split(" -- ", 1)[-1]
                for _, line in self.out_lines
                if " -- " in line and "draining" in line and "received SIGTERM" not in line
            ][:3],
            "processes_left": group_left,
            "output_tail": [line for _, line in self.out_lines[-6:]],
        }
        result = {"node_stop_s": elapsed, "details": details}
        if group_left:
            result["error"] = f"left {KILL_AFTER_S:g} s after ray start exited: {group_left}"
        return result

    def _kill_node(self) -> None:
        """SIGTERM to the node's process group, SIGKILL after KILL_AFTER_S; then anything
        still in the group or naming the temp dir."""
        for proc in (self.poller, self.proc):
            if proc is None:
                continue
            pgid = proc.pid
            if proc.poll() is None or _find_processes(pgid=pgid):
                _killpg(proc, signal.SIGTERM)
                gone = _wait_for(lambda pgid=pgid: not _find_processes(pgid=pgid), KILL_AFTER_S)
                if gone is None:
                    _killpg(proc, signal.SIGKILL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        left = _find_processes(pgid=self.proc.pid if self.proc else None, text=self.tmp)
        if left:
            _kill_pids(pid for pid, _ in left)
        self.left += left

    def cleanup(self) -> None:
        with self.lock:
            if self.cleaned:
                return
            self.cleaned = True
            self._kill_node()
            shutil.rmtree(self.tmp, ignore_errors=True)


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group of a child this workload started (its own session)."""
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# the steps


def _connect(node: _Node) -> dict:
    runs = []
    for _ in range(CONNECT_RUNS):
        t0, out, t_exit, warnings = _run_child(node.python_child(CONNECT_CHILD), node.env)
        ready = [ln.split() for ln in out.splitlines() if ln.startswith("READY")][0]
        shutdown = [ln.split() for ln in out.splitlines() if ln.startswith("SHUTDOWN")]
        runs.append(
            {
                "connect_s": float(ready[1]) - t0,
                "child_import_s": float(ready[2]),
                "child_init_call_s": float(ready[3]),
                "child_shutdown_s": float(shutdown[0][1]) if shutdown else None,
                "process_exit_s": t_exit - t0,
                "stderr_warnings": warnings,
            }
        )
    return {"connect_s": min(r["connect_s"] for r in runs), "details": {"runs": runs}}


def _named_actor(ray, node: _Node) -> dict:
    t0, _out, t_exit, warnings = _run_child(node.python_child(CREATE_ACTOR_CHILD), node.env)
    details = {"driver1_s": t_exit - t0, "driver1_warnings": warnings}
    t_init = time.perf_counter()
    ray.init(address=node.address)
    details["driver2_init_s"] = time.perf_counter() - t_init
    try:
        t_get = time.perf_counter()
        a = ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
        details["get_actor_s"] = time.perf_counter() - t_get
        t_first = time.perf_counter()
        ray.get(a.f.remote())
        details["first_call_s"] = time.perf_counter() - t_first
        samples = harness.time_calls(lambda: ray.get(a.f.remote()), SYNC_CALLS, WARMUP)
        runs = harness.time_batches(lambda: [a.f.remote() for _ in range(PIPELINED_CALLS)],
                                    ray.get, PIPELINED_RUNS, PIPELINED_CALLS, "calls_per_s")
    finally:
        t_shutdown = time.perf_counter()
        ray.shutdown()
        details["driver2_shutdown_s"] = time.perf_counter() - t_shutdown
    rt = harness.summary(samples)
    details.update({"named_call": rt, "pipelined_runs": runs, "calls_per_run": PIPELINED_CALLS})
    return {
        "named_call_ms": rt["mean_ms"],
        "named_call_p50_ms": rt["p50_ms"],
        "named_calls_per_s": max(r["calls_per_s"] for r in runs),
        "details": details,
    }


def node_workload(impl: str) -> dict:
    if impl == "ray":
        _set_ray_auth_mode()
    ray = harness.import_impl(impl)
    node = MinirayNode() if impl == "miniray" else RayNode()
    watchdog = threading.Timer(WATCHDOG_S, node.cleanup)
    watchdog.daemon = True
    watchdog.start()
    measured: dict = {}
    details: dict = {"address": node.address, "temp_dir": node.tmp}
    errors: dict = {}

    def step(name: str, fn) -> None:
        try:
            result = fn()
        except Exception:
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr)
            return
        details[name] = result.pop("details", {})
        if "error" in result:
            errors[name] = result.pop("error")
        measured.update(result)

    try:
        started = node.start()  # nothing to measure without a node: a failure ends the workload
        details["start"] = started.pop("details")
        measured.update(started)
        step("connect", lambda: _connect(node))
        step("named_actor", lambda: _named_actor(ray, node))
        step("stop", node.stop)
    finally:
        watchdog.cancel()
        node.cleanup()
    details["killed_by_cleanup"] = node.left
    if node.left and "stop" in details:
        errors["cleanup"] = f"cleanup had to SIGKILL processes the stop left: {node.left}"
    measured["details"] = details
    if errors:
        measured["errors"] = errors
    return measured


WORKLOADS = {"node": (node_workload, NODE_LIMIT_S)}

if __name__ == "__main__":
    sys.exit(harness.main("bench_node", WORKLOADS, __doc__))
