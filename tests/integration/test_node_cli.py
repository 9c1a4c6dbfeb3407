"""``miniray start/stop/status`` and the node protocol, with real processes.

Every test gets its own short session root (``MINIRAY_TMPDIR`` under ``/tmp``, so socket paths
stay short) and host GPU directory. Every node a test starts is stopped on teardown, which then
fails the test if anything of the root is left: a process with that ``MINIRAY_TMPDIR`` in its
environment (node, fork server, workers), a session directory, a record, or a ``/dev/shm``
entry with the root's tag (house style, habit 12).

The protocol tests talk to the node with ``NodeClient`` and fds of their own (socketpairs and
pipes), without the runtime: spawn, kill, exit reports, a client's goodbye, and a client that
dies (its workers are killed and its leases released; other clients are unaffected).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import miniray
from miniray._private.core import protocol
from miniray._private.host import procinfo, session
from miniray._private.ledger.ledger import Ledger
from miniray._private.node import node
from miniray._private.transport import node_client

from . import helpers
from .helpers import FAKE_PYNVML, procs_with_root

MINIRAY_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))
START_TIMEOUT = 60


# ----------------------------------------------------------------------------- helpers
def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):
    return helpers.wait_until(predicate, timeout, interval)  # nodes get a longer default


def shm_of_root(root: str) -> list[str]:
    tag = f"mr_{session.root_tag(root)}"
    try:
        return [e for e in os.listdir("/dev/shm") if e.startswith(tag)]
    except OSError:
        return []


def need_default_port() -> None:
    """Skips the test when another program holds 127.0.0.1:6379 (Ray's default port, which
    ``miniray start --head`` binds without ``--port``): the test asserts that default."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", 6379))
    except OSError as error:
        pytest.skip(f"127.0.0.1:6379 is in use by another program ({error.strerror}); this "
                    f"test starts a node on that default port")
    finally:
        probe.close()


class Cli:
    """Runs ``python -m miniray ...`` with a session root of its own (or another one)."""

    def __init__(self, base: str):
        self.base = base
        self.root = os.path.join(base, "r")
        self.roots = [self.root]

    def new_root(self, name: str) -> str:
        root = os.path.join(self.base, name)
        self.roots.append(root)
        return root

    def env(self, root: str | None = None, **extra) -> dict:
        env = dict(os.environ)
        env["MINIRAY_TMPDIR"] = root or self.root
        paths = [extra.pop("PYTHONPATH", ""), MINIRAY_PARENT, env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(
            p for part in paths for p in part.split(os.pathsep) if p)
        env.update(extra)
        return env

    def run(self, *args, root: str | None = None, timeout: float = START_TIMEOUT,
            **extra) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "miniray", *args], env=self.env(root, **extra),
                              capture_output=True, text=True, timeout=timeout, cwd=self.base)

    def start(self, *args, root: str | None = None, **extra) -> node_client.NodeRecord:
        if "--port" not in args:
            need_default_port()
        result = self.run("start", "--head", *args, root=root, **extra)
        assert result.returncode == 0, result.stderr + result.stdout
        assert "miniray runtime started." in result.stdout
        records = node_client.list_records(root or self.root)
        assert records, "start succeeded but no live node record"
        return records[-1]


@pytest.fixture
def cli(session_root, monkeypatch):
    base = tempfile.mkdtemp(prefix="mrn-", dir="/tmp")
    c = Cli(base)
    monkeypatch.setenv("MINIRAY_TMPDIR", c.root)
    monkeypatch.setenv("MINIRAY_HOST_DIR", os.path.join(base, "host"))
    try:
        yield c
    finally:
        problems = []
        for root in c.roots:
            c.run("stop", "--force", root=root)
            left = wait_until(lambda root=root: not procs_with_root(root), 10.0) or \
                procs_with_root(root)
            if left is not True and left:
                problems.append(f"processes of {root} alive after stop: {left}")
                for pid in left:
                    os.kill(pid, signal.SIGKILL)
            if os.path.isdir(root) and os.listdir(root):
                problems.append(f"{root} not empty after stop: {sorted(os.listdir(root))}")
            if shm_of_root(root):
                problems.append(f"/dev/shm entries of {root}: {shm_of_root(root)}")
        shutil.rmtree(base, ignore_errors=True)
        if problems:
            pytest.fail("; ".join(problems))


def worker_fds():
    """The four fds a worker is spawned with, and the ends the test keeps (the worker waits
    for HELLO on its data socket as long as the test holds the other end)."""
    data_parent, data_child = socket.socketpair()
    ctl_parent, ctl_child = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    child = [data_child.fileno(), ctl_child.fileno(), out_w, err_w]
    keep = [data_parent, ctl_parent, out_r, err_r]
    return child, keep, [data_child, ctl_child, out_w, err_w]


def close_all(objs) -> None:
    for obj in objs:
        try:
            obj.close() if hasattr(obj, "close") else os.close(obj)
        except OSError:
            pass


def spawn(client: node_client.NodeClient):
    fds, keep, child = worker_fds()
    req = client.spawn(fds)
    close_all(child)
    message = recv(client)
    assert message[:2] == (protocol.SPAWNED, req), message
    return message[2], keep


@contextlib.contextmanager
def node_with_a_worker(cli):
    """A node with one CPU started, a driver's connection to it, and one worker spawned
    for it: yields ``(record, client, the worker's pid)``; the connection and this side of
    the worker's descriptors are closed on leaving."""
    record = cli.start("--num-cpus", "1")
    client = node_client.connect(record)
    keeps = []
    try:
        pid, keeps = spawn(client)
        yield record, client, pid
    finally:
        client.close()
        close_all(keeps)


def recv(client: node_client.NodeClient, timeout: float = 15.0):
    """The next message (skipping ``()``), failing the test if none comes in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([client.fileno()], [], [], deadline - time.monotonic())[0]:
            message = client.read_message()
            if message != ():
                return message
    pytest.fail(f"no message from the node within {timeout} s")


# ----------------------------------------------------------------------------- CLI
def test_start_status_stop_leaves_nothing(cli):
    record = cli.start("--num-cpus", "3", "--num-gpus", "2", "--resources", '{"foo": 2}',
                       "--object-store-memory", "100000000")
    assert record.address == "127.0.0.1:6379" and record.port == 6379
    # layout: same as init()'s session dir, plus the node's files
    sdir = record.session_dir
    assert os.path.dirname(sdir) == cli.root
    assert os.path.basename(sdir).startswith("session_")
    for name in ("owner.pid", "ledger.json", "node.json", "node.sock", "node.log"):
        assert os.path.exists(os.path.join(sdir, name)), name
    mode = os.stat(os.path.join(sdir, "node.sock")).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert session.session_owner(sdir)[0] == record.pid
    with open(os.path.join(cli.root, "current_node")) as f:
        assert f.read().strip() == os.path.join(sdir, "node.json")
    totals = Ledger(os.path.join(sdir, "ledger.json")).totals()
    assert totals["CPU"] == 3 and totals["GPU"] == 2 and totals["foo"] == 2
    assert totals["object_store_memory"] == 100000000
    assert totals["node:127.0.0.1"] == 1 and "memory" in totals
    assert procinfo.is_alive(record.fork_server_pid, record.fork_server_start)
    # the daemon is not the CLI's: it runs in a session of its own
    assert os.getsid(record.pid) == record.pid

    result = cli.run("status")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "miniray status" in out and f"node_{record.node_id[:12]}" in out
    assert str(record.pid) in out and "127.0.0.1:6379" in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["CPU"] == ["0", "3", "3"]
    assert lines["GPU"] == ["0", "2", "2"]
    assert lines["foo"] == ["0", "2", "2"]
    assert lines["object_store_memory"] == ["0B", "95.37MiB", "95.37MiB"]
    assert "GPUs" in out and "(logical)" in out
    assert "Running tasks and actors" in out and "(none)" in out

    result = cli.run("stop")
    assert result.returncode == 0 and "Stopped 1 miniray node(s)." in result.stdout
    assert not procinfo.is_alive(record.pid, record.start_time)
    assert not procinfo.is_alive(record.fork_server_pid, record.fork_server_start)
    assert not os.path.exists(cli.root)
    result = cli.run("status")
    assert result.returncode == 1 and "No miniray node is running." in result.stderr


def test_block_stops_cleanly_on_sigterm(cli):
    proc = subprocess.Popen(
        [sys.executable, "-m", "miniray", "start", "--head", "--block", "--port", "0",
         "--num-cpus", "1"],
        env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cli.base)
    try:
        out = b""
        deadline = time.monotonic() + START_TIMEOUT
        while b"\n--block\n" not in out and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, proc.stderr.read()
                out += chunk
        assert b"miniray runtime started." in out, out
        (record,) = node_client.list_records(cli.root)
        assert record.pid == proc.pid and record.port != 6379
        assert cli.run("status").returncode == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert wait_until(lambda: not procinfo.is_alive(record.fork_server_pid))
        assert not os.path.exists(cli.root)
    finally:
        helpers.stop_driver(proc)


def test_second_start_on_same_port_fails(cli):
    first = cli.start("--num-cpus", "1")
    result = cli.run("start", "--head", "--num-cpus", "1")
    assert result.returncode == 1
    assert "already running at 127.0.0.1:6379" in result.stderr
    assert "--port" in result.stderr
    assert len(node_client.list_records(cli.root)) == 1
    second = cli.start("--port", "0", "--num-cpus", "1")
    assert second.port not in (0, 6379)
    out = cli.run("status").stdout
    assert first.address in out and second.address in out
    assert node_client.find_node(second.address).pid == second.pid
    result = cli.run("stop")
    assert "Stopped 2 miniray node(s)." in result.stdout


def test_stop_when_nothing_runs(cli):
    result = cli.run("stop")
    assert result.returncode == 0
    assert "Did not find any active miniray nodes." in result.stdout


def test_stop_leaves_other_roots_alone(cli):
    other = cli.new_root("other")
    mine = cli.start("--num-cpus", "1")
    theirs = cli.start("--num-cpus", "1", "--port", "0", root=other)  # 6379 is mine
    assert cli.run("stop").stdout.strip() == "Stopped 1 miniray node(s)."
    assert not procinfo.is_alive(mine.pid, mine.start_time)
    assert theirs.alive()
    assert procs_with_root(other)
    assert cli.run("status", root=other).returncode == 0
    assert cli.run("stop", root=other).stdout.strip() == "Stopped 1 miniray node(s)."


def test_sigkilled_node_takes_its_workers_and_is_swept(cli):
    record = cli.start("--num-cpus", "1")
    client = node_client.connect(record)
    try:
        worker, keep = spawn(client)
        os.kill(record.pid, signal.SIGKILL)
        # the fork server sees EOF and kills the worker, although the test still holds the
        # worker's data socket (it would otherwise wait for HELLO for ever)
        assert wait_until(lambda: not procinfo.is_alive(worker))
        assert wait_until(lambda: not procinfo.is_alive(record.fork_server_pid,
                                                        record.fork_server_start))
        assert recv(client) is None  # EOF: the node is gone
        close_all(keep)
    finally:
        client.close()
    assert os.path.isdir(record.session_dir)  # nobody removed it yet
    assert cli.run("status").returncode == 1
    again = cli.start("--num-cpus", "1")  # sweeps the dead node's session dir
    assert not os.path.exists(record.session_dir)
    assert again.port == 6379
    assert "Stopped 1" in cli.run("stop").stdout


def test_start_include_dashboard_and_stop_stops_it(cli):
    """``miniray start --include-dashboard true --dashboard-port 0`` prints the dashboard's
    URL (with its token), which serves the node; ``miniray stop`` stops the dashboard too
    (Ray's flags; Ray's dashboard has no token)."""
    import http.client
    import json
    import re

    need_default_port()
    result = cli.run("start", "--head", "--num-cpus", "1", "--include-dashboard", "true",
                     "--dashboard-port", "0")
    assert result.returncode == 0, result.stderr
    found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", result.stdout)
    assert found, result.stdout
    port, token = int(found.group(1)), found.group(2)
    record = node_client.list_records(cli.root)[-1]
    with open(os.path.join(record.session_dir, "dashboard.json")) as f:
        dash_pid = json.load(f)["pid"]
    assert procinfo.is_alive(dash_pid)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/state", headers={"Cookie": f"miniray_dashboard={token}"})
    response = conn.getresponse()
    model = json.loads(response.read())
    conn.close()
    assert response.status == 200
    assert [n["node_id"] for n in model["nodes"]] == [record.node_id]
    assert "Stopped 1" in cli.run("stop").stdout
    assert wait_until(lambda: not procinfo.is_alive(dash_pid), 10)


def test_stop_sweeps_a_dead_node(cli):
    record = cli.start("--num-cpus", "1")
    os.kill(record.pid, signal.SIGKILL)
    assert wait_until(lambda: not procinfo.is_alive(record.pid, record.start_time))
    result = cli.run("stop")
    assert "Did not find any active miniray nodes." in result.stdout
    assert not os.path.exists(cli.root)


def test_start_refuses_what_it_cannot_do(cli):
    need_default_port()
    result = cli.run("start")
    assert result.returncode == 1
    assert "`--address` is a required flag unless starting a head node with `--head`." in \
        result.stderr
    result = cli.run("start", "--address", "127.0.0.1:1")  # nobody listens there
    assert result.returncode == 1 and "cannot join the head at 127.0.0.1:1" in result.stderr
    result = cli.run("start", "--address", "127.0.0.1:6379", "--head")
    assert result.returncode == 1 and "give one of them" in result.stderr
    result = cli.run("start", "--head", "--resources", '{"CPU": 2}')
    assert result.returncode == 1 and "--num-cpus" in result.stderr
    result = cli.run("start", "--head", "--resources", "not json")
    assert result.returncode == 1 and "JSON" in result.stderr
    result = cli.run("start", "--head", "--object-store-memory", "10")  # as `ray start`
    assert result.returncode == 1 and "the minimum allowed is 78643200 bytes" in result.stderr
    result = cli.run("start", "--head", "--num-gpus", "3", CUDA_VISIBLE_DEVICES="1")
    assert result.returncode == 1 and "CUDA_VISIBLE_DEVICES" in result.stderr
    assert not node_client.list_records(cli.root)
    result = cli.run("start", "--head", "--num-cpus", "1", "--dashboard-port", "8265",
                     "--include-dashboard", "false", "--disable-usage-stats")
    assert result.returncode == 0, result.stderr
    # Honoured: told not to include the dashboard, none is started and nothing is ignored.
    assert "do not apply" not in result.stderr and "dashboard" not in result.stdout
    cli.run("stop")


def test_ray_start_stop_status_options_are_accepted_and_ignored_ones_named(cli):
    """Ray 2.60's other ``ray start``/``stop``/``status`` options (compared with its
    ``--help``, hidden ones included) do not abort: one stderr line names those ignored."""
    need_default_port()
    result = cli.run("start", "--head", "--num-cpus", "1", "--min-worker-port", "10002",
                     "--no-monitor", "--node-name", "n1", "--log-style", "record", "-v")
    assert result.returncode == 0, result.stderr
    ignored = [line for line in result.stderr.splitlines() if "ignored" in line]
    assert ignored == ["miniray: --node-name, --min-worker-port, --no-monitor, --log-style, "
                       "--verbose do not apply to a miniray node (it runs no Ray agents, "
                       "raylet, GCS or autoscaler and listens on --port only; other hosts "
                       "join it with `miniray start --address`; node names and labels are "
                       "not settable, and logs have one style); ignored."]
    record = node_client.list_records(cli.root)[-1]
    status = cli.run("status", "--address", record.address, "-v")
    assert status.returncode == 0 and "Resources" in status.stdout, status.stderr
    stop = cli.run("stop", "-g", "5", "--log-color", "false")
    assert stop.returncode == 0 and "Stopped 1 miniray node(s)." in stop.stdout
    assert "--log-color do not apply" in stop.stderr
    version = cli.run("--version")
    assert version.returncode == 0 and version.stdout.startswith("miniray, version ")


def test_cuda_visible_devices_name_the_gpus(cli):
    record = cli.start("--num-gpus", "2", "--num-cpus", "1", CUDA_VISIBLE_DEVICES="1,3")
    client = node_client.connect(record)
    try:
        assert client.info["gpu_ids"] == ["1", "3"]
        assert client.info["gpu_ids_are_ints"] is False
        assert client.info["totals"]["GPU"] == 2
    finally:
        client.close()


def test_long_session_root(cli):
    root = cli.new_root("x" * 120)  # node.sock's path exceeds sockaddr_un's 108 bytes
    record = cli.start("--num-cpus", "1", root=root)
    assert len(record.socket) > 108
    client = node_client.connect(record)
    client.close()
    assert cli.run("stop", root=root).stdout.strip() == "Stopped 1 miniray node(s)."


# ----------------------------------------------------------------------------- addresses
def test_another_driver_is_told_that_an_embedded_session_cannot_be_joined(ray_start):
    """init() without a node reports "127.0.0.1:0" (Ray: a joinable address). Another driver
    given it, or "auto" while only such sessions run, is told why it cannot join and what
    to start instead, after Ray's own words for "auto"."""
    address = ray_start(num_cpus=1)["address"]
    assert address == "127.0.0.1:0"
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:0: that is the address of a "
                                              r"session that init\(\) started inside its "
                                              r"driver.*miniray start --head"):
        node_client.find_node(address)
    with pytest.raises(ConnectionError, match=r"^Could not find any running Ray instance\..*"
                                              r"started by init\(\) inside their drivers"):
        node_client.find_node("auto")


# ----------------------------------------------------------------------------- addresses
def test_find_node_addresses(cli):
    assert node_client.find_node(None) is None
    assert node_client.find_node("local") is None
    with pytest.raises(ConnectionError, match="Could not find any running Ray instance"):
        node_client.find_node("auto")
    with pytest.raises(ValueError, match="Invalid address format: notanaddress"):
        node_client.find_node("notanaddress")
    with pytest.raises(ConnectionError, match="Failed to connect to Ray cluster at"):
        node_client.find_node("127.0.0.1:6379")
    record = cli.start("--num-cpus", "1")
    for address in (None, "auto", "127.0.0.1:6379", "localhost:6379",
                    f"{socket.gethostname()}:6379"):
        assert node.find_node(address).pid == record.pid, address
    with pytest.raises(ConnectionError, match="Failed to connect"):
        node.find_node("127.0.0.1:6380")
    with pytest.raises(ConnectionError, match="belong to another cluster"):
        node.find_node("203.0.113.7:6379")
    os.remove(os.path.join(cli.root, "current_node"))  # "auto" still finds it, None does not
    assert node.find_node(None) is None
    assert node.find_node("auto").pid == record.pid


# ----------------------------------------------------------------------------- protocol
def test_protocol_spawn_kill_exit_goodbye(cli):
    record = cli.start("--num-cpus", "2")
    client = node_client.connect(record)
    other = node_client.connect(record)
    keeps = []
    try:
        info = client.info
        assert info["node_pid"] == record.pid and client.pid == record.pid
        assert info["address"] == record.address and info["node_ip"] == "127.0.0.1"
        assert info["session_dir"] == record.session_dir
        assert info["ledger_path"] == os.path.join(record.session_dir, "ledger.json")
        assert info["totals"]["CPU"] == 2.0 and info["gpu_ids"] == []
        for key in ("node_id", "gpu_ids_are_ints", "gpu_keys", "accelerator_type",
                    "object_store_memory"):
            assert key in info

        pid, keep = spawn(client)
        keeps += keep
        assert procinfo.is_alive(pid)
        assert pid in procinfo.children(record.fork_server_pid)
        # another client cannot signal it
        other.kill(pid, signal.SIGKILL)
        client.kill(pid, 999)  # not a signal: ignored (it would end the fork server)
        time.sleep(0.3)
        assert procinfo.is_alive(pid)
        assert procinfo.is_alive(record.fork_server_pid, record.fork_server_start)
        client.kill(pid, signal.SIGTERM)
        message = recv(client)
        assert message[:2] == (protocol.EXITED, pid)
        assert os.WIFSIGNALED(message[2]) and os.WTERMSIG(message[2]) == signal.SIGTERM

        # goodbye: a worker still running is SIGKILLed after the grace, then BYE
        pid2, keep = spawn(client)
        keeps += keep
        client.request_shutdown(0.2)
        message = recv(client)
        assert message[:2] == (protocol.EXITED, pid2)
        assert os.WTERMSIG(message[2]) == signal.SIGKILL
        assert recv(client) == (protocol.BYE,)
        client.wait(1.0)
        assert recv(client) is None
        # the other client is unaffected
        pid3, keep = spawn(other)
        keeps += keep
        assert procinfo.is_alive(pid3)
    finally:
        client.close()
        other.close()
        close_all(keeps)


CLIENT_SCRIPT = textwrap.dedent("""
    import os, socket, sys, time
    from miniray._private.transport import node_client
    from miniray._private.ledger.ledger import Ledger

    data_fd = int(sys.argv[1])
    client = node_client.connect(node_client.find_node("auto"))
    ctl_a, ctl_b = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    req = client.spawn([data_fd, ctl_b.fileno(), out_w, err_w])
    message = client.read_message()
    ledger = Ledger(client.info["ledger_path"])
    lease = ledger.acquire({"CPU": 1}, holder_pid=os.getpid(), tag="actor Held")
    print(message[2], lease.lease_id, flush=True)
    time.sleep(600)
""")


def test_dead_client_loses_its_workers_and_leases(cli):
    record = cli.start("--num-cpus", "2")
    ledger = Ledger(os.path.join(record.session_dir, "ledger.json"))
    survivor = node_client.connect(record)
    keeps = []
    data_keep, data_child = socket.socketpair()
    script = os.path.join(cli.base, "client.py")
    with open(script, "w") as f:
        f.write(CLIENT_SCRIPT)
    proc = subprocess.Popen([sys.executable, script, str(data_child.fileno())],
                            pass_fds=[data_child.fileno()], env=cli.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    data_child.close()
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        worker, lease_id = int(line.split()[0]), line.split()[1]
        assert procinfo.is_alive(worker)
        assert lease_id in ledger.snapshot().leases
        out = cli.run("status").stdout
        assert "actor Held" in out and str(proc.pid) in out
        mine, keep = spawn(survivor)
        keeps += keep
        mine_lease = ledger.acquire({"CPU": 1}, holder_pid=os.getpid(), tag="survivor")

        proc.kill()  # SIGKILL: no goodbye
        proc.wait(timeout=10)
        # killed by the node: the test still holds the worker's data socket
        assert wait_until(lambda: not procinfo.is_alive(worker))
        assert wait_until(lambda: lease_id not in ledger.snapshot().leases)
        leases = ledger.snapshot().leases
        assert list(leases) == [mine_lease.lease_id]  # released, not just reclaimable
        assert procinfo.is_alive(mine)
        pid2, keep = spawn(survivor)
        keeps += keep
        ledger.release(mine_lease.lease_id)
    finally:
        helpers.stop_driver(proc)
        survivor.close()
        data_keep.close()
        close_all(keeps)


def test_node_stats_and_status_show_drivers(cli):
    with node_with_a_worker(cli) as (record, client, pid):
        stats_path = os.path.join(record.session_dir, "node_stats.json")

        def stats():
            with open(stats_path) as f:
                doc = json.load(f)
            # The actor service joins in the background: wait for it as well.
            return doc if doc["workers"] == 1 and len(doc["drivers"]) == 2 else None

        doc = wait_until(stats, 10.0)
        service = doc["actor_service_pid"]
        assert service and procinfo.is_alive(service)
        assert sorted(doc["drivers"], key=lambda d: d["pid"] != service) == [
            {"pid": service, "workers": 0, "leaving": False, "actor_service": True},
            {"pid": os.getpid(), "workers": 1, "leaving": False, "actor_service": False}]
        out = cli.run("status").stdout
        assert f"pid {os.getpid()}: 1 worker(s)\n" in out
        assert f"pid {service}: 0 worker(s) (actor service: named and detached actors)" in out


def test_stop_with_a_connected_driver(cli):
    with node_with_a_worker(cli) as (record, client, pid):
        result = cli.run("stop")
        assert "Stopped 1 miniray node(s)." in result.stdout
        # First why (so a driver blames the stop, not its task), then the worker's exit,
        # both before the node goes.
        assert recv(client) == (protocol.NODE_STOPPING, "miniray stop, or SIGTERM")
        message = recv(client)
        assert message[:2] == (protocol.EXITED, pid)
        assert recv(client) is None
        assert not procinfo.is_alive(pid)
        assert not os.path.exists(cli.root)


def test_node_stops_when_its_fork_server_dies(cli):
    record = cli.start("--num-cpus", "1")
    client = node_client.connect(record)
    try:
        os.kill(record.fork_server_pid, signal.SIGKILL)
        assert recv(client) == (protocol.NODE_STOPPING,
                                f"its fork server (pid {record.fork_server_pid}) exited")
        assert recv(client) is None
        assert wait_until(lambda: not procinfo.is_alive(record.pid, record.start_time))
        assert not os.path.exists(cli.root)
    finally:
        client.close()


def test_temp_dir_holds_the_session_and_the_default_root_points_to_it(cli):
    temp = cli.new_root("t")
    record = cli.start("--num-cpus", "1", "--temp-dir", temp)
    assert os.path.dirname(record.session_dir) == temp
    with open(os.path.join(cli.root, "current_node")) as f:
        assert f.read().strip() == record.path
    assert node.find_node("auto").pid == record.pid
    assert record.address in cli.run("status").stdout
    assert "Stopped 1 miniray node(s)." in cli.run("stop").stdout
    assert not os.path.exists(temp) and not os.path.exists(cli.root)


GPU_CLIENT_SCRIPT = textwrap.dedent("""
    import os, time
    from miniray._private.transport import node_client
    from miniray._private.ledger.host_gpus import HostGpuLedger
    from miniray._private.ledger.ledger import Ledger

    client = node_client.connect(node_client.find_node("auto"))
    ledger = Ledger(client.info["ledger_path"])
    lease = ledger.acquire({"GPU": 0.5}, holder_pid=os.getpid(), tag="GPU=0.5")
    (index, units), = lease.instances["GPU"]
    key = client.info["gpu_keys"][index]
    host = HostGpuLedger().acquire_exact({key: units}, holder_pid=os.getpid(), tag="GPU=0.5")
    print(lease.lease_id, host, key, flush=True)
    time.sleep(600)
""")


def test_physical_gpus_detected_and_a_dead_clients_host_leases_released(cli):
    fake = os.path.join(cli.base, "fake_nvml")
    os.mkdir(fake)
    with open(os.path.join(fake, "pynvml.py"), "w") as f:
        f.write(FAKE_PYNVML)
    devices = "Tesla V100-SXM2-16GB|GPU-aaaa0000,Tesla V100-SXM2-16GB|GPU-bbbb1111"
    env = {"FAKE_NVML_DEVICES": devices, "PYTHONPATH": fake}
    record = cli.start("--num-cpus", "1", **env)
    client = node_client.connect(record)
    client.close()
    info = client.info
    assert info["totals"]["GPU"] == 2 and info["totals"]["accelerator_type:V100"] == 1
    assert info["gpu_keys"] == ["GPU-aaaa0000", "GPU-bbbb1111"]
    assert info["gpu_ids"] == ["0", "1"] and info["gpu_ids_are_ints"] is True
    assert info["accelerator_type"] == "V100"

    script = os.path.join(cli.base, "gpu_client.py")
    with open(script, "w") as f:
        f.write(GPU_CLIENT_SCRIPT)
    proc = subprocess.Popen([sys.executable, script], env=cli.env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        lease_id, host_lease, key = line.split()
        out = cli.run("status").stdout
        assert "Host GPU ledger" in out and f"pid {proc.pid} 0.5 [GPU=0.5]" in out
        assert "GPU-aaaa0000" in out
        from miniray._private.ledger.host_gpus import HostGpuLedger

        host = HostGpuLedger(os.environ["MINIRAY_HOST_DIR"])
        assert host_lease in host.leases()
        proc.kill()
        proc.wait(timeout=10)
        assert wait_until(lambda: host_lease not in host.leases())  # released, not reclaimed
        ledger = Ledger(info["ledger_path"])
        assert lease_id not in ledger.snapshot().leases
    finally:
        helpers.stop_driver(proc)
