"""Joining and failure detection on two loopback fake hosts: miniray beside Ray 2.60, one run.

The head is on 127.0.0.1, the member on 127.0.0.2; every node has a fresh temp directory
(miniray: ``MINIRAY_TMPDIR``; Ray: ``--temp-dir``) and free ports. A *watcher* driver on the
head's host (``ray.init(address="127.0.0.1:<port>")``, the same code for both, imported as
``miniray`` or ``ray``) polls ``ray.nodes()`` every 10 ms and prints, with
``time.monotonic()`` (one clock for every process of the machine), each change of the
member's ``Alive``. What it measures, in this order:

* the floor of the link, in this interpreter: ``tcp_rtt``, a 1-byte echo over TCP from
  127.0.0.1 to a process listening on 127.0.0.2 (TCP_NODELAY, 200 warm-up, 2,000 timed; p50,
  mean, min and p99 too); ``channel_rtt``, the same through miniray's authenticated peer channel
  (challenge-response handshake, HMAC on every frame: ``peer_handshake.connect``/``accept``),
  and the handshake's time (``handshake_ms``; ``handshake_first_ms``: the process's first one,
  which pays lazy imports);
* ``join_s``: from just before ``miniray start --address=127.0.0.1:P --node-ip-address
  127.0.0.2`` (Ray: ``ray start --address=127.0.0.1:P --node-ip-address=127.0.0.2 --block``)
  is launched until the watcher saw the member alive. miniray: ``--join-rounds`` joins (the
  member stopped with ``miniray stop`` between them), Ray: ``--ray-join-rounds``; the join
  after the crash below is one more sample. The median is the figure;
  miniray's details add ``start_command_returned_s`` (the ``start`` command's exit) and both
  give ``cli_floor_s``, the best of 3 ``miniray --version`` (``ray --version``): the cost of an
  interpreter starting and importing the package, which every join pays first;
* ``crash_dead_s``: SIGKILL of the member's node process (miniray: the node's pid from its
  record; Ray: the member's ``raylet``) until the watcher saw it dead;
* ``hang_dead_s``: the member joined again, then SIGSTOP of the same process (a stand-in for a
  partition: the peer's socket stays open) until the watcher saw it dead; SIGCONT after.

Default failure-detection settings for both (miniray: heartbeats every 1 s, dead after 5 s;
Ray: its GCS health checks). Authentication on for both: miniray with ``MINIRAY_AUTH_TOKEN``;
Ray with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` for every Ray process (peering design
1.5: ``ray start --address`` never turns it on by itself). Ray processes get ``HOME`` set to
a temp directory, so nothing is written to the user's ``~/.ray``.

miniray's processes read bytecode compiled once at the start into the run's temp directory
(``PYTHONPYCACHEPREFIX``), as an installed package has it and as Ray's virtualenv has Ray's;
``--no-bytecode`` measures the same with every process compiling miniray from source (what a
``PYTHONDONTWRITEBYTECODE=1`` environment gives a source checkout, as in this project's
earlier runs).

Ray runs from its own virtualenv (``--ray-python``; default: ``$MINIRAY_BENCH_RAY_VENV`` or
``~/.cache/miniray-bench/ray-2.60``, made by ``setup_ray_venv.sh``); ``--no-ray`` skips it.
Every process started here is in a process group of its own; at the end every group gets
SIGTERM, then SIGKILL 15 s later, and a process still marked with this run's temp directory
(``BENCH_PEERING_DIR`` in its environment) 5 s after that is a leak: killed by pid, reported,
and the script exits 1. Prints one JSON object: each implementation's
figures, the floor, ``ratios`` (miniray / Ray: below 1 means miniray is faster) and the issue's
targets.

    python benchmarks/bench_peering.py [--join-rounds 3] [--ray-join-rounds 1] [--no-ray]
                                       [--no-bytecode]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from miniray._private.transport import peer_handshake as ph

HEAD_IP, MEMBER_IP = "127.0.0.1", "127.0.0.2"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT_S = 120.0  # any one wait for the watcher; Ray's own detection takes tens of seconds
TOKEN = "bench-peering-token-" + "5" * 32
TARGETS = {"join_ratio": "<= 0.1 (miniray / Ray)", "crash_dead_s": "<= 1 s",
           "hang_dead_s": "<= 6 s (default dead-after 5 s + 1 s)"}

WATCHER = r"""
import importlib, json, sys, time
ray = importlib.import_module(sys.argv[1])
ray.init(address=sys.argv[2])
member = sys.argv[3]
print("READY", time.monotonic(), flush=True)
state = {}
deadline = time.monotonic() + float(sys.argv[4])
while time.monotonic() < deadline:
    for n in ray.nodes():
        if n["NodeManagerAddress"] != member:
            continue
        key = n["NodeID"]
        if state.get(key) != n["Alive"]:
            state[key] = n["Alive"]
            print("ALIVE" if n["Alive"] else "DEAD", time.monotonic(), key, flush=True)
    time.sleep(0.01)
"""


# ------------------------------------------------------------------------------ the floor
def _echo_server(kind: str, port_w) -> None:
    listener = socket.socket()
    listener.bind((MEMBER_IP, 0))
    listener.listen(1)
    os.write(port_w, f"{listener.getsockname()[1]}\n".encode())
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if kind == "tcp":
        while True:
            data = conn.recv(1)
            if not data:
                break
            conn.sendall(data)
    else:
        channel = ph.accept(conn, TOKEN.encode(), timeout=30)
        try:
            while True:
                channel.send_bytes(channel.recv_bytes(timeout=60))
        except Exception:  # noqa: BLE001 - the client closed: done
            pass
    os._exit(0)


def _rtt(kind: str, warmup: int = 200, timed: int = 2000) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _echo_server(kind, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as pipe:
            port = int(pipe.readline())
        samples = []
        if kind == "tcp":
            sock = socket.socket()
            sock.bind((HEAD_IP, 0))
            sock.connect((MEMBER_IP, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with sock:
                for i in range(warmup + timed):
                    t0 = time.perf_counter()
                    sock.sendall(b"x")
                    assert sock.recv(1) == b"x"
                    if i >= warmup:
                        samples.append(time.perf_counter() - t0)
        else:
            t0 = time.perf_counter()
            channel = ph.connect((MEMBER_IP, port), TOKEN.encode(), "bench", timeout=30)
            handshake = time.perf_counter() - t0
            with channel:
                for i in range(warmup + timed):
                    t0 = time.perf_counter()
                    channel.send_bytes(b"x")
                    assert channel.recv_bytes(timeout=30) == b"x"
                    if i >= warmup:
                        samples.append(time.perf_counter() - t0)
    finally:
        os.waitpid(pid, 0)
    samples.sort()
    out = {"p50_us": samples[len(samples) // 2] * 1e6,
           "mean_us": statistics.fmean(samples) * 1e6, "min_us": samples[0] * 1e6,
           "p99_us": samples[int(len(samples) * 0.99)] * 1e6}
    if kind != "tcp":
        out["handshake_ms"] = handshake * 1e3
    return out


# ------------------------------------------------------------------------------ processes
def _free_port(ip: str = HEAD_IP) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except OSError:
        return None


class Run:
    """One implementation's processes, temp dirs and watcher; ``close()`` removes them all."""

    def __init__(self, impl: str, python: str, bytecode: bool = True):
        self.impl, self.python = impl, python
        self.tmp = tempfile.mkdtemp(prefix=f"bpeer-{impl[0]}-", dir="/tmp")
        # miniray's bytecode, as an installed package has it (pip compiles it; Ray's
        # virtualenv has Ray's): compiled once here into a cache every miniray process of
        # the run reads. Without it (--no-bytecode, or PYTHONDONTWRITEBYTECODE=1 and no
        # cache) every process compiles miniray from source, which no installed copy does.
        self.pycache = os.path.join(self.tmp, "pycache") if bytecode and impl == "miniray" \
            else None
        if self.pycache:
            subprocess.run([python, "-m", "compileall", "-q", os.path.join(_REPO, "miniray")],
                           env=self.env("compile"), check=True, stdout=subprocess.DEVNULL)
        self.groups: list[subprocess.Popen] = []
        self.watcher: subprocess.Popen | None = None
        self.head_port = _free_port()
        self.member_n = 0
        self.member_proc: subprocess.Popen | None = None
        self.cli_returned_s: list[float] = []

    def env(self, name: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "MINIRAY_")) and k != "CUDA_VISIBLE_DEVICES"}
        home = os.path.join(self.tmp, name)
        os.makedirs(home, exist_ok=True)
        env["BENCH_PEERING_DIR"] = self.tmp  # marks every process of this run
        env["PYTHONUNBUFFERED"] = "1"
        if self.impl == "miniray":
            env.update(MINIRAY_TMPDIR=os.path.join(home, "mr"),
                       MINIRAY_HOST_DIR=os.path.join(home, "host"), MINIRAY_AUTH_TOKEN=TOKEN)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, env.get("PYTHONPATH")) if p)
            if self.pycache:
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                env["PYTHONPYCACHEPREFIX"] = self.pycache
        else:
            env.update(HOME=home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN,
                       RAY_USAGE_STATS_ENABLED="0")
        return env

    def spawn(self, argv, env, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)
        self.groups.append(proc)
        return proc

    def cli(self, name: str, *args, timeout=60) -> subprocess.CompletedProcess:
        if self.impl == "miniray":
            argv = [self.python, "-m", "miniray", *args]
        else:
            argv = [os.path.join(os.path.dirname(self.python), "ray"), *args]
        proc = self.spawn(argv, self.env(name), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    # -- the head and its watcher
    def start_head(self) -> None:
        if self.impl == "miniray":
            done = self.cli("head", "start", "--head", "--node-ip-address", HEAD_IP, "--port",
                            str(self.head_port), "--num-cpus", "1")
            if done.returncode:
                raise RuntimeError(f"miniray start --head: {done.stderr[-2000:]}")
        else:
            ray = os.path.join(os.path.dirname(self.python), "ray")
            self.spawn([ray, "start", "--head", f"--node-ip-address={HEAD_IP}",
                        f"--port={self.head_port}", "--num-cpus=1",
                        f"--temp-dir={os.path.join(self.tmp, 'head', 'ray')}",
                        "--include-dashboard=false", "--block",
                        f"--dashboard-agent-listen-port={_free_port()}"],
                       self.env("head"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = f"{HEAD_IP}:{self.head_port}"
        for _ in range(60):  # Ray's GCS needs a few seconds before init() can connect
            self.watcher = self.spawn(
                [self.python, "-c", WATCHER, self.impl, address, MEMBER_IP, "900"],
                self.env("head"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            line = self._line(60.0, "READY")
            if line:
                return
            self.watcher.kill()
            self.watcher.wait(10)
            time.sleep(1.0)
        raise RuntimeError("the watcher could not connect to the head")

    def _line(self, timeout: float, *kinds) -> list | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.watcher.stdout], [], [],
                                       max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self.watcher.stdout.readline()
            if not line:
                return None
            words = line.split()
            if words and words[0] in kinds:
                return words
        return None

    # -- the member
    def member_name(self) -> str:
        return f"member{self.member_n}"

    def join(self) -> float:
        """Start a member on 127.0.0.2; seconds until the watcher saw it alive."""
        self.member_n += 1
        name = self.member_name()
        env = self.env(name)
        address = f"{HEAD_IP}:{self.head_port}"
        if self.impl == "miniray":
            argv = [self.python, "-m", "miniray", "start", f"--address={address}",
                    "--node-ip-address", MEMBER_IP, "--port", "0", "--num-cpus", "1"]
        else:
            argv = [os.path.join(os.path.dirname(self.python), "ray"), "start",
                    f"--address={address}", f"--node-ip-address={MEMBER_IP}", "--num-cpus=1",
                    f"--temp-dir={os.path.join(self.tmp, name, 'ray')}", "--block",
                    f"--dashboard-agent-listen-port={_free_port(MEMBER_IP)}"]
        t0 = time.monotonic()
        proc = self.member_proc = self.spawn(argv, env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE)
        seen = self._line(WAIT_S, "ALIVE")
        if self.impl == "miniray" and seen is not None:  # the CLI returns once it joined
            proc.wait(WAIT_S)
            self.cli_returned_s.append(time.monotonic() - t0)
        if seen is None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.poll() is not None \
                else ""
            raise RuntimeError(f"{self.impl}: the member was not seen alive: {err}")
        return float(seen[1]) - t0

    def member_pid(self) -> int:
        """The process whose death or stop is the fault: miniray's node, Ray's raylet."""
        name = self.member_name()
        if self.impl == "miniray":
            (path,) = glob.glob(os.path.join(self.tmp, name, "mr", "session_*", "node.json"))
            with open(path) as f:
                return int(json.load(f)["pid"])
        mark = os.path.join(self.tmp, name, "ray")
        for entry in os.listdir("/proc"):
            if entry.isdigit() and "raylet" in _cmdline(int(entry)).split(" ")[0] \
                    and mark in _cmdline(int(entry)):
                return int(entry)
        raise RuntimeError("the member's raylet was not found")

    def fault(self, sig: int) -> float:
        pid = self.member_pid()
        t0 = time.monotonic()
        os.kill(pid, sig)
        try:
            seen = self._line(WAIT_S, "DEAD")
        finally:
            if sig == signal.SIGSTOP:
                os.kill(pid, signal.SIGCONT)
        if seen is None:
            return float("nan")
        return float(seen[1]) - t0

    def leave(self) -> None:
        """Stop the member the ordinary way and wait until the head holds it dead."""
        if self.impl == "miniray":
            self.cli(self.member_name(), "stop")
        else:
            os.killpg(self.member_proc.pid, signal.SIGTERM)  # its `ray start --block`
        self._line(WAIT_S, "DEAD")

    def cli_floor(self) -> float:
        """The command line's own cost: the best of 3 ``miniray --version`` (``ray
        --version``), an interpreter starting and importing the package."""
        best = float("inf")
        for _ in range(3):
            t0 = time.monotonic()
            self.cli("head", "--version")
            best = min(best, time.monotonic() - t0)
        return best

    # -- cleaning up
    def _mine(self) -> list[int]:
        entry = f"BENCH_PEERING_DIR={self.tmp}".encode()
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
                and _state(int(p)) not in (None, "Z") and _environ_has(int(p), entry)]

    def close(self) -> list:
        if self.impl == "miniray":
            for name in sorted(os.listdir(self.tmp)):
                if os.path.isdir(os.path.join(self.tmp, name, "mr")):
                    self.cli(name, "stop", "--force")
        # SIGTERM to every group (Ray's `ray start --block` drains its node first), SIGKILL
        # to the groups 15 s later; what still carries this run's mark after that is a leak.
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for proc in reversed(self.groups):
                for one in (signal.SIGCONT, sig):
                    try:
                        os.killpg(proc.pid, one)
                    except OSError:
                        pass
            deadline = time.monotonic() + wait_s
            while self._mine() and time.monotonic() < deadline:
                time.sleep(0.2)
        left = [(p, _cmdline(p)[:120]) for p in self._mine()]
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for proc in self.groups:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if self.impl == "miniray":
            from miniray._private.host.session import root_tag

            prefixes = tuple(f"mr_{root_tag(r)}" for r in
                             glob.glob(os.path.join(self.tmp, "*", "mr")))
            segments = [s for s in os.listdir("/dev/shm") if prefixes and s.startswith(prefixes)]
            for s in segments:
                os.unlink(os.path.join("/dev/shm", s))
            left += [("segment", s) for s in segments]
        shutil.rmtree(self.tmp, ignore_errors=True)
        return left


def measure(impl: str, python: str, join_rounds: int, bytecode: bool = True) -> dict:
    run = Run(impl, python, bytecode)
    result: dict = {"joins_s": []}
    try:
        t0 = time.monotonic()
        run.start_head()
        result["head_and_watcher_s"] = time.monotonic() - t0
        for i in range(join_rounds):
            if i:
                run.leave()
            result["joins_s"].append(run.join())
        result["crash_dead_s"] = run.fault(signal.SIGKILL)
        result["joins_s"].append(run.join())
        result["hang_dead_s"] = run.fault(signal.SIGSTOP)
        result["join_s"] = statistics.median(result["joins_s"])
        if run.cli_returned_s:
            result["start_command_returned_s"] = run.cli_returned_s
        result["cli_floor_s"] = run.cli_floor()
    except Exception as error:  # noqa: BLE001 - reported, and the rest still cleaned up
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        left = run.close()
        if left:
            result["left_behind_killed"] = left
    return result


def _default_ray_python() -> str:
    venv = os.environ.get("MINIRAY_BENCH_RAY_VENV") or os.path.expanduser(
        "~/.cache/miniray-bench/ray-2.60")
    return os.path.join(venv, "bin", "python")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--join-rounds", type=int, default=3)
    parser.add_argument("--ray-join-rounds", type=int, default=1)
    parser.add_argument("--ray-python", default=_default_ray_python())
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="miniray's processes compile miniray from source each time (no "
                             "bytecode cache; what PYTHONDONTWRITEBYTECODE=1 alone gives)")
    args = parser.parse_args()
    import miniray

    out: dict = {"machine": {"loadavg_start": os.getloadavg()[0], "cpus": os.cpu_count(),
                             "python": sys.version.split()[0],
                             "miniray": miniray.__version__},
                 "settings": {"auth": "token (both)", "failure_detection": "defaults (both)"}}
    first = _rtt("channel", warmup=0, timed=10)  # the first handshake pays lazy imports
    out["floor"] = {"tcp_rtt": _rtt("tcp"), "channel_rtt": _rtt("channel")}
    out["floor"]["channel_rtt"]["handshake_first_ms"] = first["handshake_ms"]
    out["machine"]["miniray_bytecode"] = (
        "none: compiled from source in every process" if args.no_bytecode
        else "compiled once into the run's cache (as an installed package has it)")
    out["miniray"] = measure("miniray", sys.executable, args.join_rounds, not args.no_bytecode)
    if not args.no_ray:
        if not os.path.exists(args.ray_python):
            out["ray"] = {"error": f"no Ray interpreter at {args.ray_python}: run "
                                   "benchmarks/setup_ray_venv.sh or pass --ray-python"}
        else:
            out["ray"] = measure("ray", args.ray_python, args.ray_join_rounds)
            out["ray"]["version"] = subprocess.run(
                [args.ray_python, "-c", "import ray; print(ray.__version__)"],
                capture_output=True, text=True, timeout=120).stdout.strip()
    m, r = out["miniray"], out.get("ray", {})
    out["ratios"] = {key: m[key] / r[key] for key in ("join_s", "crash_dead_s", "hang_dead_s")
                     if m.get(key) and r.get(key)}
    out["floor"]["channel_over_tcp"] = (out["floor"]["channel_rtt"]["p50_us"]
                                        / out["floor"]["tcp_rtt"]["p50_us"])
    out["targets"] = TARGETS
    out["machine"]["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    failed = any("error" in out.get(k, {}) or "left_behind_killed" in out.get(k, {})
                 for k in ("miniray", "ray"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
