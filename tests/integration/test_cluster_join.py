"""Nodes joining a head over TCP, on fake hosts of one machine (peering design 6.2, tier 1).

Each fake host is a loopback address (127.0.0.1 head, 127.0.0.2 and 127.0.0.3 members) with
its own MINIRAY_TMPDIR and MINIRAY_HOST_DIR, so its node records, sessions and ledgers are
its own; the token comes from MINIRAY_AUTH_TOKEN (never ~/.miniray) and the heartbeat
settings are fast (0.2 s, dead after 1 s). The ``hosts`` fixture stops every node of every
host on teardown (SIGCONT first) and checks that no process, session directory or segment
of any host is left (``helpers.node_env_for``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from miniray._private.node import dashboard
from miniray._private.transport import node_client

from .helpers import cli, driver, json_line, node_env_for, stop_driver, wait_until

FAST = {"MINIRAY_HEARTBEAT_S": "0.2", "MINIRAY_NODE_DEAD_AFTER_S": "1"}
TIMINGS: dict = {}


class FakeHosts:
    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self._teardowns = []
        self.envs: dict[str, dict] = {}
        self.stopped: list[int] = []

    def env(self, ip: str) -> dict:
        if ip not in self.envs:
            path = self.tmp_path / ip.replace(".", "_")
            path.mkdir()
            gen = node_env_for(path)
            env = next(gen)
            env.update(FAST)
            self._teardowns.append(gen)
            self.envs[ip] = env
        return self.envs[ip]

    def start_head(self, *args, port: str = "0") -> str:
        env = self.env("127.0.0.1")
        started = cli(env, "start", "--head", "--port", port, "--num-cpus", "2", *args)
        assert started.returncode == 0, started.stderr
        return self.record("127.0.0.1").address

    def join(self, ip: str, head: str, *args, **extra) -> subprocess.CompletedProcess:
        env = {k: v for k, v in dict(self.env(ip), **extra).items() if v is not None}
        return cli(env, "start", f"--address={head}", "--node-ip-address", ip, "--port", "0",
                   *args)

    def record(self, ip: str):
        (record,) = node_client.list_records(self.env(ip)["MINIRAY_TMPDIR"])
        return record

    def start_member(self, ip: str, *args: str) -> tuple[str, int]:
        """A head on 127.0.0.1 and a member on ``ip`` (``args`` for its ``start``) that the
        head holds alive; returns the member's (host, port)."""
        self.join_alive(ip, self.start_head(), *args)
        return node_client.parse_address(self.record(ip).address)

    def join_alive(self, ip: str, head: str, *args: str, within: float = 30.0) -> None:
        """A member on ``ip`` (``args`` for its ``start``) joins ``head``; returns once the
        head holds it alive (asserted ``within`` seconds)."""
        joined = self.join(ip, head, *args)
        assert joined.returncode == 0, joined.stderr
        assert wait_until(lambda: (self.cluster("127.0.0.1").get(ip) or {}).get("alive"),
                          within)

    def cluster(self, ip: str) -> dict:
        doc = node_client.read_cluster(self.record(ip).session_dir)
        assert doc is not None
        return {n["ip"]: n for n in doc["view"]["nodes"]}

    def close(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        errors = []
        for gen in self._teardowns:
            try:
                next(gen, None)
            except AssertionError as error:
                errors.append(str(error))
        assert not errors, errors


@pytest.fixture(scope="module", autouse=True)
def _report_timings():
    yield
    if TIMINGS:  # shown with -s: the measured times of this run
        print("\ncluster join timings (s):",
              {k: round(v, 2) for k, v in sorted(TIMINGS.items())})


@pytest.fixture(name="hosts")
def hosts_fixture(tmp_path):
    """Fake hosts for one test (other modules import this fixture as ``hosts_fixture``)."""
    h = FakeHosts(tmp_path)
    yield h
    h.close()


def _alive(hosts, ip, seen_from="127.0.0.1"):
    try:
        node = hosts.cluster(seen_from).get(ip)
    except (ValueError, AssertionError):
        return None
    return node and node["alive"]


def _dead(hosts, ip, seen_from="127.0.0.1"):
    node = hosts.cluster(seen_from).get(ip)
    return node is not None and not node["alive"]


DRIVER = """
    import json, miniray as ray
    ray.init(address={head!r})
    @ray.remote
    def f(x):
        return x + 1
    nodes = ray.nodes()
    print(json.dumps({{"value": ray.get(f.remote(1)), "cpus": ray.cluster_resources()["CPU"],
                      "avail": ray.available_resources().get("CPU"),
                      "nodes": sorted((n["NodeManagerAddress"], n["Alive"]) for n in nodes),
                      "keys": sorted(nodes[0]), "keys_other": sorted(nodes[-1])}}))
    ray.shutdown()
"""


def test_a_member_joins_and_every_host_sees_every_node(hosts):
    head = hosts.start_head()
    t0 = time.monotonic()
    joined = hosts.join("127.0.0.2", head, "--num-cpus", "3")
    assert joined.returncode == 0, joined.stderr
    # How fast is bench_peering.py's (join_s); a loaded runner only makes it slower.
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    TIMINGS["join_visible_s"] = time.monotonic() - t0
    print(f"start --address until visible at the head: {TIMINGS['join_visible_s']:.2f} s")
    assert "joined the cluster of the head at" in joined.stdout
    assert hosts.record("127.0.0.2").address.startswith("127.0.0.2:")
    # The member's copy arrives with its heartbeats.
    assert wait_until(lambda: _alive(hosts, "127.0.0.1", seen_from="127.0.0.2"), 30.0)
    for ip in ("127.0.0.1", "127.0.0.2"):
        proc = driver(DRIVER.format(head=head), hosts.env(ip))
        doc = json_line(proc)
        stop_driver(proc)
        assert doc["value"] == 2 and doc["cpus"] == 5.0, (ip, doc)
        assert doc["avail"] == 5.0
        assert doc["nodes"] == [["127.0.0.1", True], ["127.0.0.2", True]]
        assert doc["keys"] == doc["keys_other"]
        status = cli(hosts.env(ip), "status")
        assert status.returncode == 0, status.stderr
        assert "Active:" in status.stdout and "Dead:" in status.stdout
        active = status.stdout.split("Active:")[1].split("Dead:")[0]
        assert "127.0.0.1:" in active and "127.0.0.2:" in active and "(head)" in active
        assert "3/3 CPU" in active or "0/3 CPU" in active


def test_a_driver_on_a_host_without_a_member_node_is_told_to_start_one(hosts):
    head = hosts.start_head()
    env = hosts.env("127.0.0.3")
    t0 = time.monotonic()
    proc = driver(f"""
        import miniray as ray
        try:
            ray.init(address={head!r})
        except ConnectionError as error:
            print(error)
    """, env)
    out, _err = proc.communicate(timeout=30)  # told, not left waiting for a node
    TIMINGS["told_to_start_s"] = time.monotonic() - t0
    assert f"miniray start --address={head}" in out


@pytest.mark.parametrize("token", ["wrong", "missing"])
def test_a_wrong_or_missing_token_is_refused_at_once(hosts, tmp_path, token):
    head = hosts.start_head()
    extra = {"MINIRAY_AUTH_TOKEN": "another-token-" + "1" * 32} if token == "wrong" else {
        "MINIRAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN": None, "HOME": str(tmp_path)}
    t0 = time.monotonic()
    joined = hosts.join("127.0.0.2", head, **extra)
    took = time.monotonic() - t0
    assert joined.returncode != 0
    TIMINGS[f"refused_{token}_s"] = took
    assert "miniray get-auth-token" in joined.stderr
    # At once: refused by the head's answer (or, without a token, before a node is
    # started), not after the handshake's or the start's timeout ("... within N s").
    assert "within" not in joined.stderr, joined.stderr
    if token == "wrong":
        assert "could not authenticate" in joined.stderr
    else:
        assert "No miniray cluster token" in joined.stderr
    assert node_client.list_records(hosts.env("127.0.0.2")["MINIRAY_TMPDIR"]) == []
    assert set(hosts.cluster("127.0.0.1")) == {"127.0.0.1"}


def test_a_version_mismatch_is_refused_naming_both_versions(hosts, tmp_path):
    head = hosts.start_head()
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "import miniray._version as v\nv.__version__ = '0.0.0-other'\n")
    env = hosts.env("127.0.0.2")
    joined = hosts.join("127.0.0.2", head,
                        PYTHONPATH=os.pathsep.join([str(patch), env["PYTHONPATH"]]))
    assert joined.returncode != 0
    import miniray

    assert "0.0.0-other" in joined.stderr and miniray.__version__ in joined.stderr, \
        joined.stderr
    assert node_client.list_records(env["MINIRAY_TMPDIR"]) == []


def test_a_killed_member_is_dead_from_its_links_eof(hosts):
    """Dead from the link's EOF (the death reason and message), not from missing heartbeats;
    how fast (the target, <= 1 s) is bench_peering.py's crash_dead_s."""
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    record = hosts.record("127.0.0.2")
    t0 = time.monotonic()
    os.kill(record.pid, signal.SIGKILL)
    assert wait_until(lambda: _dead(hosts, "127.0.0.2"), 30.0)
    TIMINGS["sigkill_dead_s"] = time.monotonic() - t0
    # The reason, not the time, tells the EOF from missing heartbeats (reason 2 with
    # "connection"; a heartbeat death says "heartbeat").
    node = hosts.cluster("127.0.0.1")["127.0.0.2"]
    assert node["death_reason"] == 2 and "connection" in node["death_message"]
    status = cli(hosts.env("127.0.0.1"), "status").stdout
    assert "127.0.0.2:" in status.split("Dead:")[1]


def test_a_stopped_member_is_dead_after_the_limit_and_rejoins_when_continued(hosts):
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    record = hosts.record("127.0.0.2")
    incarnation = hosts.cluster("127.0.0.1")["127.0.0.2"]["incarnation"]
    hosts.stopped.append(record.pid)
    t0 = time.monotonic()
    os.kill(record.pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: _dead(hosts, "127.0.0.2"), 30.0)
        TIMINGS["sigstop_dead_s"] = time.monotonic() - t0  # bench_peering.py: hang_dead_s
        assert "heartbeat" in hosts.cluster("127.0.0.1")["127.0.0.2"]["death_message"]
    finally:
        os.kill(record.pid, signal.SIGCONT)
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    assert hosts.cluster("127.0.0.1")["127.0.0.2"]["incarnation"] > incarnation


def _free_port(ip="127.0.0.1") -> int:
    """A free port below the ephemeral range (32768-60999 by default), so no outgoing
    connection of another test takes it between the two heads of a test."""
    import random

    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as probe:
            try:
                probe.bind((ip, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def _log(hosts, ip) -> str:
    try:
        with open(os.path.join(hosts.record(ip).session_dir, "node.log")) as f:
            return f.read()[-3000:]
    except (OSError, ValueError):
        return "(no log)"


def test_the_member_serves_its_drivers_without_the_head_and_rejoins_a_new_one(hosts):
    port = str(_free_port())
    head = hosts.start_head(port=port)
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    env_b = hosts.env("127.0.0.2")
    assert cli(hosts.env("127.0.0.1"), "stop").returncode == 0
    assert wait_until(lambda: not node_client.read_cluster(
        hosts.record("127.0.0.2").session_dir)["linked"], 30.0), _log(hosts, "127.0.0.2")
    proc = driver(DRIVER.format(head=head), env_b)
    doc = json_line(proc)
    stop_driver(proc)
    assert doc["value"] == 2
    status = cli(env_b, "status").stdout
    assert "link to the head is down" in status, status + _log(hosts, "127.0.0.2")
    hosts.start_head(port=port)
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0), _log(hosts, "127.0.0.2")
    # The head holds it alive once its join is read; the member's own view file says linked
    # at its next write, a moment later.
    assert wait_until(lambda: node_client.read_cluster(
        hosts.record("127.0.0.2").session_dir)["linked"], 30.0), _log(hosts, "127.0.0.2")


def test_stop_on_a_member_is_an_expected_termination_at_the_head(hosts):
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert hosts.join("127.0.0.3", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.3"), 30.0)
    assert cli(hosts.env("127.0.0.2"), "stop").returncode == 0
    assert wait_until(lambda: _dead(hosts, "127.0.0.2"), 30.0)
    node = hosts.cluster("127.0.0.1")["127.0.0.2"]
    assert node["death_reason"] == 1 and "stopped" in node["death_message"]
    assert _alive(hosts, "127.0.0.3")
    proc = driver(DRIVER.format(head=head), hosts.env("127.0.0.3"))
    doc = json_line(proc)
    stop_driver(proc)
    assert doc["cpus"] == 4.0
    assert doc["nodes"] == [["127.0.0.1", True], ["127.0.0.2", False], ["127.0.0.3", True]]


class _Boom:
    def __reduce__(self):
        return (os.mkdir, (MARKER[0],))


MARKER = [""]


def test_an_unauthenticated_client_cannot_make_the_head_do_anything(hosts, tmp_path):
    import pickle

    head = hosts.start_head()
    host, port = node_client.parse_address(head)
    MARKER[0] = str(tmp_path / "unpickled")
    payloads = [b"", b"GET / HTTP/1.0\r\n\r\n", os.urandom(4096), pickle.dumps(_Boom()),
                b"\x93miniray\x00\x01" + bytes(32) + pickle.dumps(_Boom()) * 50]
    for payload in payloads:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.settimeout(6)
            try:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except OSError:
                pass
    assert not os.path.exists(MARKER[0])
    # The head still serves, and its view did not change.
    assert set(hosts.cluster("127.0.0.1")) == {"127.0.0.1"}
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)


def test_a_busy_port_is_an_error_naming_it(hosts):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = cli(hosts.env("127.0.0.1"), "start", "--head", "--port", str(port))
    assert started.returncode != 0
    assert f"127.0.0.1:{port}" in started.stderr and "--port 0" in started.stderr


def test_a_member_joins_over_tls_when_every_host_turns_it_on(hosts, tmp_path):
    from .test_remote_tls import _tls_on_hosts  # lazy: that module imports this one

    _tls_on_hosts(hosts, tmp_path, ("127.0.0.1", "127.0.0.2"))
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    # A member without TLS cannot join a head that requires it.
    plain = hosts.join("127.0.0.3", head)
    assert plain.returncode != 0
    assert node_client.list_records(hosts.env("127.0.0.3")["MINIRAY_TMPDIR"]) == []


def test_a_members_available_resources_reach_the_head_soon_after_they_change(hosts):
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head, "--num-cpus", "3").returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.2"), 30.0)
    proc = driver("""
        import json, sys, miniray as ray
        ray.init(address=sys.argv[1] if len(sys.argv) > 1 else "auto")
        @ray.remote(num_cpus=2)
        class Holder:
            def ping(self):
                return 1
        h = Holder.remote()
        ray.get(h.ping.remote())
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        ray.shutdown()
    """, hosts.env("127.0.0.2"), stdin=subprocess.PIPE)
    try:
        assert json_line(proc)["ready"]
        assert wait_until(lambda: hosts.cluster("127.0.0.1")["127.0.0.2"]["available"]
                          .get("CPU") == 1.0, 30.0)
    finally:
        proc.stdin.close()
        stop_driver(proc)
    assert wait_until(lambda: hosts.cluster("127.0.0.1")["127.0.0.2"]["available"]
                      .get("CPU") == 3.0, 30.0)


def _list_nodes(env, *args):
    result = cli(env, "list", "nodes", "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_list_and_get_nodes_show_every_node_alive_or_dead_and_filter(hosts):
    head = hosts.start_head()
    assert hosts.join("127.0.0.2", head, "--num-cpus", "3").returncode == 0
    assert hosts.join("127.0.0.3", head).returncode == 0
    assert wait_until(lambda: _alive(hosts, "127.0.0.3"), 30.0)
    assert cli(hosts.env("127.0.0.3"), "stop").returncode == 0
    assert wait_until(lambda: _dead(hosts, "127.0.0.3"), 30.0)
    assert wait_until(lambda: _dead(hosts, "127.0.0.3", seen_from="127.0.0.2"), 30.0)
    for ip in ("127.0.0.1", "127.0.0.2"):
        nodes = _list_nodes(hosts.env(ip), "--detail")
        by_ip = {n["node_ip"]: n for n in nodes}
        assert sorted(by_ip) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"], (ip, nodes)
        assert [n["node_ip"] for n in nodes][0] == ip  # this host's own node first
        assert by_ip["127.0.0.1"]["is_head_node"] and not by_ip["127.0.0.2"]["is_head_node"]
        assert by_ip["127.0.0.2"]["resources_total"]["CPU"] == 3.0
        dead = by_ip["127.0.0.3"]
        assert dead["state"] == "DEAD" and "stopped" in dead["state_message"]
        assert by_ip["127.0.0.2"]["state"] == "ALIVE" and by_ip["127.0.0.2"]["start_time_ms"]
        assert set(nodes[0]) == set(dead)  # the local row and a remote one: the same fields
        if ip == "127.0.0.1":  # the head's view dates the death
            assert dead["end_time_ms"] >= dead["start_time_ms"]
        assert [n["node_ip"] for n in _list_nodes(hosts.env(ip), "-f", "state=DEAD")] == \
            ["127.0.0.3"]
        assert [n["node_ip"] for n in _list_nodes(hosts.env(ip), "-f", "is_head_node=True")] \
            == ["127.0.0.1"]
        got = cli(hosts.env(ip), "get", "nodes", dead["node_id"])
        assert got.returncode == 0 and "127.0.0.3" in got.stdout, got.stderr
    # The dashboard's node table is made from the same rows.
    model = dashboard.collect_model(hosts.record("127.0.0.1").session_dir)
    assert sorted((n["address"].split(":")[0], n["state"]) for n in model["nodes"]) == [
        ("127.0.0.1", "ALIVE"), ("127.0.0.2", "ALIVE"), ("127.0.0.3", "DEAD")]
    status = cli(hosts.env("127.0.0.1"), "status")
    active = status.stdout.split("Active:")[1].split("Dead:")[0]
    (member,) = [line for line in active.splitlines() if "127.0.0.2:" in line]
    assert "s ago" in member.split("heartbeat")[1], status.stdout
