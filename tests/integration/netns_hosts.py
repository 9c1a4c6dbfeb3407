"""Fake hosts in Linux namespaces, for the tier-2 peering tests (peering design 6.2).

Owns: a *lab* (a user + network namespace made with ``unshare -r -n``, holding a bridge
``br0``) and the *hosts* inside it. Each host is a network + mount + PID namespace nested in
the lab's user namespace (``unshare -n -m -p --fork --mount-proc --kill-child``), with its own
tmpfs ``/dev/shm``, its own ``/proc``, loopback up, and a veth pair whose outer end is on the
lab's bridge and whose inner end is ``eth0`` with an address in 10.250.0.0/24. Nothing is ever
created in the namespaces of the machine itself: no route, address or link leaves the lab.
Does not own: the miniray nodes (the tests start and stop them with ``Host.cli``), nor the
checks of a node's view (the tests read ``cluster.json`` with ``Host.cluster``).
Called by: tests/integration/test_peering_netns.py.

A host's init (PID 1 of its PID namespace) is a small Python reaper that exits when its stdin
closes, so a host dies with the test process even if the test is killed; the lab's shell does
the same. Killing the init (``Host.crash``) kills every process of the host at once, which is
a whole-machine crash as its peers see it.

Pids: a node's record holds pids of its host's PID namespace. ``Host.outer_pid`` maps one to
this namespace (``NSpid`` in ``/proc/<pid>/status``); commands run inside the host see the
host's own pids, so ``miniray stop`` is always run there, never from outside.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

from miniray._private.host import procinfo

from .helpers import REPO, TEST_TOKEN, wait_until

SUBNET = "10.250.0"  # only ever on veths inside the lab

_INIT = r"""
import os, subprocess, sys, threading, time
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", "/dev/shm"],
               check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
print("ready", flush=True)
def watch():  # the test process is gone: the host goes, and its PID namespace with it
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
deadline = time.monotonic() + 600  # a bound, whatever happens to the test
while time.monotonic() < deadline:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.05)
"""


def probe() -> str | None:
    """None when namespace hosts can be made here, else the reason they cannot."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"the {tool} command is not installed"
    try:
        done = subprocess.run(["unshare", "-r", "-n", "true"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare -r -n true` failed: {error}"
    if done.returncode != 0:
        return ("user + network namespaces cannot be made here (`unshare -r -n true`: "
                f"{done.stderr.strip() or done.returncode}); run as root or allow "
                "unprivileged user namespaces")
    # What a host needs beyond that: PID and mount namespaces, a tmpfs, a bridge and a veth.
    steps = ("mount -t tmpfs tmpfs /dev/shm && ip link add br0 type bridge"
             " && ip link add va type veth peer name vb")
    try:
        done = subprocess.run(["unshare", "-r", "-n", "-m", "-p", "--fork", "--mount-proc",
                               "sh", "-c", steps], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"a namespace host cannot be made: {error}"
    if done.returncode != 0:
        return f"a namespace host cannot be made (`{steps}`: {done.stderr.strip()})"
    return None


def _ns(pid: int, kind: str = "net") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _processes_in(namespaces: set[str]) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _ns(int(name)) in namespaces:
            found.append(int(name))
    return found


def _root_links() -> set[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                          timeout=10)
    return {line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()
            if ":" in line}


def _close(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


class Lab:
    """The lab namespace and its hosts; ``close()`` removes all of it and checks that."""

    def __init__(self, tmp_path, settings: dict):
        self.tmp_path = tmp_path
        self.settings = dict(settings)
        self.hosts: dict[str, Host] = {}
        self.namespaces: set[str] = set()
        self.links_before = _root_links()
        self.proc = subprocess.Popen(["unshare", "-r", "-n", "--", "sh", "-c", "read _"],
                                     stdin=subprocess.PIPE)
        assert wait_until(lambda: _ns(self.proc.pid) not in (None, _ns(os.getpid())), 5.0), \
            "the lab namespace did not come up"
        self.namespaces.add(_ns(self.proc.pid))
        try:
            self.run("ip", "link", "add", "br0", "type", "bridge")
            self.run("ip", "link", "set", "br0", "up")
        except BaseException:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def run(self, *cmd, check=True) -> subprocess.CompletedProcess:
        """A command in the lab's user and network namespaces."""
        done = subprocess.run(["nsenter", "-t", str(self.proc.pid), "-U", "-n",
                               "--preserve-credentials", "--", *cmd],
                              capture_output=True, text=True, timeout=30)
        if check:
            assert done.returncode == 0, (cmd, done.stderr)
        return done

    def host(self, name: str, index: int) -> Host:
        """Start host ``name`` with address 10.250.0.<index> (again, after a crash)."""
        old = self.hosts.get(name)
        root = old.root if old else tempfile.mkdtemp(prefix=f"mrn{index}-", dir="/tmp")
        # A crashed host's sessions: their owners were in a PID namespace that is gone, and
        # the restarted node sweeps them (their owners' locks went with it).
        host = Host(self, name, index, root)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Stop every node, kill every host and the lab, then fail on anything left."""
        errors = []
        for host in self.hosts.values():
            errors += host.close()
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        wait_until(lambda: not _processes_in(self.namespaces), 5.0)
        left = _processes_in(self.namespaces)
        if left:
            errors.append(f"processes left in the lab's namespaces: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        new_links = _root_links() - self.links_before
        if new_links:
            errors.append(f"links appeared in the machine's own namespace: {sorted(new_links)}")
        for host in self.hosts.values():
            shutil.rmtree(host.root, ignore_errors=True)
        assert not errors, errors


class Host:
    """One fake host: its namespaces, its veth ``eth0`` (10.250.0.<index>), its session root."""

    def __init__(self, lab: Lab, name: str, index: int, root: str):
        self.lab, self.name, self.index, self.root = lab, name, index, root
        self.ip = f"{SUBNET}.{index}"
        self.veth = f"v{name}"
        self.crashed = False
        self.stopped: list[int] = []
        self.env = dict(os.environ)
        for key in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES"):
            self.env.pop(key, None)
        self.env.update(MINIRAY_TMPDIR=root, MINIRAY_HOST_DIR=os.path.join(root, "host"),
                        MINIRAY_AUTH_TOKEN=TEST_TOKEN, PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join([REPO, self.env.get("PYTHONPATH", "")]),
                        **lab.settings)
        self.proc = subprocess.Popen(
            ["nsenter", "-t", str(lab.proc.pid), "-U", "-n", "--preserve-credentials", "--",
             "unshare", "-n", "-m", "-p", "--fork", "--mount-proc", "--kill-child", "--",
             sys.executable, "-c", _INIT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"host {name} did not start: {self.proc.stderr.read()}")
        try:
            (self.init,) = wait_until(lambda: self._children(self.proc.pid), 5.0)
            lab.namespaces.add(_ns(self.init))
            lab.run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
                    "netns", str(self.init))
            lab.run("ip", "link", "set", self.veth, "master", "br0", "up")
            self.run("ip", "addr", "add", f"{self.ip}/24", "dev", "eth0")
            self.run("ip", "link", "set", "eth0", "up")
        except BaseException:  # the host goes with its PID namespace (--kill-child)
            self.proc.kill()
            self._reap()
            raise

    @staticmethod
    def _children(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def run(self, *cmd, timeout=60, check=True, env=None) -> subprocess.CompletedProcess:
        """A command inside the host (its user, network, mount and PID namespaces)."""
        done = subprocess.run(["nsenter", "-t", str(self.init), "-U", "-n", "-m", "-p",
                               "--preserve-credentials", "--", *cmd],
                              capture_output=True, text=True, timeout=timeout,
                              env=env or self.env)
        if check:
            assert done.returncode == 0, (self.name, cmd, done.stdout, done.stderr)
        return done

    def cli(self, *args, timeout=60, check=True) -> subprocess.CompletedProcess:
        """``miniray <args>`` run on this host."""
        return self.run(sys.executable, "-m", "miniray", *args, timeout=timeout, check=check)

    def record(self) -> dict:
        (path,) = glob.glob(os.path.join(self.root, "session_*", "node.json"))
        with open(path) as f:
            return json.load(f)

    def nodes(self) -> list[dict]:
        """The nodes of the view this host's node published (empty when none yet)."""
        for path in glob.glob(os.path.join(self.root, "session_*", "cluster.json")):
            try:
                with open(path) as f:
                    return json.load(f)["view"]["nodes"]
            except (OSError, ValueError, KeyError):
                continue
        return []

    def cluster(self) -> dict:
        """``{ip: node}`` of the published view; of several nodes on one address (a host that
        crashed and came back) the one started last."""
        return {n["ip"]: n for n in sorted(self.nodes(), key=lambda n: n["start_time"])}

    def outer_pid(self, inner: int) -> int:
        """The pid, in this namespace, of the host's process ``inner``."""
        for pid in procinfo.descendants(self.init):
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:") and int(line.split()[-1]) == inner:
                            return pid
            except OSError:
                continue
        raise AssertionError(f"no process {inner} on host {self.name}")

    def stop_node(self, sig: int) -> int:
        """Send ``sig`` to the host's node; returns its pid here."""
        pid = self.outer_pid(self.record()["pid"])
        if sig == signal.SIGSTOP:
            self.stopped.append(pid)
        os.kill(pid, sig)
        return pid

    def link(self, up: bool) -> None:
        """Partition (down) or heal (up) the host's only link."""
        self.run("ip", "link", "set", "eth0", "up" if up else "down")
        if shutil.which("nft") and not up:  # where nftables exists, drop everything as well
            self.run("nft", "add table inet cut; add chain inet cut c "
                     "{ type filter hook output priority 0; policy drop; }", check=False)
        if shutil.which("nft") and up:
            self.run("nft", "delete table inet cut", check=False)

    def lossy(self, rate: str = "200mbit") -> None:
        """Packets the host sends beyond ``rate`` are dropped: a token bucket with a queue
        of one burst on ``eth0`` (``tc`` tbf; the kernel here has no netem or nftables for
        random loss), so every burst of a large transfer loses packets and TCP resends
        them. ``dropped()`` counts them."""
        self.run("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                 "burst", "32kb", "limit", "32kb")

    def dropped(self) -> int:
        """Packets ``lossy`` dropped so far."""
        shown = self.run("tc", "-s", "qdisc", "show", "dev", "eth0").stdout
        return int(shown.split("dropped", 1)[1].split(",", 1)[0])

    def crash(self) -> None:
        """Kill the host's init: every process of the host dies at once, like a power cut."""
        os.kill(self.init, signal.SIGKILL)
        self.crashed = True
        self._reap()

    def _reap(self) -> None:
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        _close(self.proc)

    def close(self) -> list[str]:
        """Stop the node (inside the host), check the host is empty, then kill the host."""
        errors = []
        if self.proc.poll() is None:
            for pid in self.stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.cli("stop", "--force", check=False)
            rest = wait_until(lambda: procinfo.descendants(self.init) == [], 10.0)
            if not rest:
                errors.append(f"host {self.name}: processes left after stop: "
                              f"{procinfo.descendants(self.init)}")
            shm = self.run("ls", "-A", "/dev/shm", check=False).stdout.split()
            if shm:
                errors.append(f"host {self.name}: /dev/shm not empty after stop: {shm}")
            sessions = glob.glob(os.path.join(self.root, "session_*"))
            if sessions:
                errors.append(f"host {self.name}: session directories left: {sessions}")
            os.kill(self.init, signal.SIGKILL)
            self._reap()
        return errors
