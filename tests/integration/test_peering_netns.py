"""Nodes joining a head across network namespaces (peering design 6.2, tier 2).

Each fake host is a network + mount + PID namespace (``netns_hosts``) with its own tmpfs
``/dev/shm`` and ``/proc``, joined to the others by a veth pair on a bridge, at 10.250.0.<n>
(head .1, member .2); nothing is routed outside the namespaces the test makes. Unlike tier 1
(tests/integration/test_cluster_join.py) pids, shared memory and network stacks are really
separate (a driver on each host sees both nodes and runs a task on its own node, with pids
that mean nothing on the other host), and the faults are whole-host ones:

* crash: the host's PID-namespace init is SIGKILLed, so every process of the host dies at
  once; the head must mark it dead from the link's EOF (the death message says so), not from
  missing heartbeats;
* partition: ``ip link set eth0 down`` in the member's namespace (and an nftables drop-all
  where ``nft`` exists); the head must mark it dead from missing heartbeats. The tests set
  ``MINIRAY_NODE_DEAD_AFTER_S=1`` (heartbeats every 0.2 s);
* hang: SIGSTOP of the member's node, the same bound as a partition;
* packet loss: both hosts drop what they send beyond 200 Mbit/s (``Host.lossy``: a tc token
  bucket, as this kernel has neither netem nor nftables); values of 16 MB each way still
  cross bit-exact (TCP resends), and the member stays alive throughout.

Remote leases across hosts (phase P2): a driver on a third host (10.250.0.3) cut off while
it holds leases on the member, freed there by TCP keepalive; and a member cut off from the
head while a driver holds leases on it, which fences them itself and answers the driver
with NodeDiedError once healed.

No time is asserted here: each wait is bounded (``WAIT_S``, far above any target, so a
loaded 2-core CI machine only makes it slower) and ends as soon as its condition holds; a
detection that comes by the wrong path is told by the death message ("connection" for the
link's EOF, "heartbeat" for missing heartbeats). The targets themselves (crash <= 1 s,
partition <= ``dead_after`` + 1 s: 6 s with the default 5 s) are measured by
``benchmarks/bench_peering.py`` beside Ray, and the times seen here go to ``TIMINGS``.

After each fault the host recovers (restarted, link back up, SIGCONT) and rejoins as a new
incarnation. After every test nothing may be left on any host: the lab's ``close()`` stops each
node inside its host and fails on a process, a ``/dev/shm`` entry or a session directory left
there, on a process left in any namespace the test made, and on a link that appeared in the
machine's own namespace. The tier is skipped, with the reason, where ``unshare -r -n true``
fails (unprivileged user namespaces off and not root). Marker: ``netns``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from . import netns_hosts
from .helpers import wait_until

pytestmark = pytest.mark.netns

FAST = {"MINIRAY_HEARTBEAT_S": "0.2", "MINIRAY_NODE_DEAD_AFTER_S": "1"}
WAIT_S = 30.0  # the bound of every wait for a state (targets: bench_peering.py)
PORT = "6380"  # the head's own network namespace: no other listener can hold it
TIMINGS: dict = {}
_REASON: list = []


@pytest.fixture(scope="module", autouse=True)
def _namespaces_or_skip():
    if not _REASON:
        _REASON.append(netns_hosts.probe())
    if _REASON[0]:
        pytest.skip(_REASON[0])
    yield
    if TIMINGS:  # shown with -s
        print("\nnetns peering timings (s):",
              {k: round(v, 3) for k, v in sorted(TIMINGS.items())})


@pytest.fixture
def lab(tmp_path):
    lab = netns_hosts.Lab(tmp_path, FAST)
    try:
        yield lab
    finally:
        lab.close()


DRIVER = """
import json, miniray as ray
ray.init(address={head!r})
@ray.remote
def f(x):
    return x + 1
print(json.dumps({{"value": ray.get(f.remote(1)), "cpus": ray.cluster_resources()["CPU"],
                  "nodes": sorted([n["NodeManagerAddress"], n["Alive"]] for n in ray.nodes())}}))
ray.shutdown()
"""


def _alive(head, ip):
    node = head.cluster().get(ip)
    return bool(node and node["alive"])


def _dead(head, ip):
    node = head.cluster().get(ip)
    return node is not None and not node["alive"]


def _incarnation(head, ip):
    return head.cluster()[ip]["incarnation"]


def _cluster(lab):
    """A head on host a (10.250.0.1) and a member on host b (10.250.0.2), both alive."""
    head = lab.host("a", 1)
    head.cli("start", "--head", "--node-ip-address", head.ip, "--port", PORT, "--num-cpus", "1")
    member = lab.host("b", 2)
    _join(head, member)
    return head, member


def _join(head, member) -> float:
    t0 = time.monotonic()
    joined = member.cli("start", f"--address={head.ip}:{PORT}", "--node-ip-address", member.ip,
                        "--port", "0", "--num-cpus", "2")
    assert "joined the cluster" in joined.stdout, joined.stdout
    assert wait_until(lambda: _alive(head, member.ip), WAIT_S), head.cluster()
    return time.monotonic() - t0


def test_a_member_in_its_own_namespaces_joins_and_sees_the_head(lab):
    head, member = _cluster(lab)
    assert wait_until(lambda: _alive(member, head.ip), WAIT_S), member.cluster()
    assert set(head.cluster()) == {head.ip, member.ip}
    # Separate hosts: the member's pids and /dev/shm are its own.
    assert member.record()["pid"] != member.outer_pid(member.record()["pid"])
    assert member.record()["pid_ns"] != head.record()["pid_ns"]
    # A driver on each host sees both nodes and runs a task on its own node.
    for host in (head, member):
        done = host.run(sys.executable, "-c", DRIVER.format(head=f"{head.ip}:{PORT}"))
        doc = json.loads(done.stdout.strip().splitlines()[-1])
        assert doc == {"value": 2, "cpus": 3.0,
                       "nodes": [[head.ip, True], [member.ip, True]]}, (host.name, doc)
    status = head.cli("status").stdout
    active = status.split("Active:")[1].split("Dead:")[0]
    assert f"{head.ip}:" in active and f"{member.ip}:" in active, status
    member.run("touch", "/dev/shm/only-on-b")
    assert "only-on-b" not in head.run("ls", "-A", "/dev/shm").stdout
    member.run("rm", "/dev/shm/only-on-b")
    # A stopped member is an expected termination; started again, it joins again.
    member.cli("stop")
    assert wait_until(lambda: _dead(head, member.ip), WAIT_S)
    assert "stopped" in head.cluster()[member.ip]["death_message"]
    TIMINGS["rejoin_after_stop_s"] = _join(head, member)


def test_a_crashed_host_is_dead_from_its_links_eof_and_rejoins_when_restarted(lab):
    head, member = _cluster(lab)
    before = head.cluster()[member.ip]["node_id"]
    t0 = time.monotonic()
    member.crash()
    assert wait_until(lambda: _dead(head, member.ip), WAIT_S), head.cluster()
    TIMINGS["crash_dead_s"] = time.monotonic() - t0
    assert "connection" in head.cluster()[member.ip]["death_message"]
    # The machine comes back (new namespaces, same address and disk) and its node rejoins.
    member = lab.host("b", 2)
    TIMINGS["crash_rejoin_s"] = _join(head, member)
    # A new node (a new id) on the same address; the crashed one stays in the view, dead.
    assert head.cluster()[member.ip]["node_id"] != before
    old = [n for n in head.nodes() if n["node_id"] == before]
    assert len(old) == 1 and not old[0]["alive"], head.nodes()


def test_a_partitioned_host_is_dead_after_the_limit_and_rejoins_when_healed(lab):
    head, member = _cluster(lab)
    before = _incarnation(head, member.ip)
    t0 = time.monotonic()
    member.link(up=False)
    assert wait_until(lambda: _dead(head, member.ip), WAIT_S), head.cluster()
    TIMINGS["partition_dead_s"] = time.monotonic() - t0
    assert "heartbeat" in head.cluster()[member.ip]["death_message"]
    t1 = time.monotonic()
    member.link(up=True)
    assert wait_until(lambda: _alive(head, member.ip), WAIT_S), head.cluster()
    TIMINGS["partition_rejoin_s"] = time.monotonic() - t1
    assert _incarnation(head, member.ip) > before


def test_a_hung_node_is_dead_after_the_limit_and_rejoins_when_continued(lab):
    head, member = _cluster(lab)
    before = _incarnation(head, member.ip)
    t0 = time.monotonic()
    pid = member.stop_node(signal.SIGSTOP)
    try:
        assert wait_until(lambda: _dead(head, member.ip), WAIT_S), head.cluster()
        TIMINGS["hang_dead_s"] = time.monotonic() - t0
        assert "heartbeat" in head.cluster()[member.ip]["death_message"]
    finally:
        member.stopped.remove(pid)
        os.kill(pid, signal.SIGCONT)
    t1 = time.monotonic()
    assert wait_until(lambda: _alive(head, member.ip), WAIT_S), head.cluster()
    TIMINGS["hang_rejoin_s"] = time.monotonic() - t1
    assert _incarnation(head, member.ip) > before


# ---------------------------------------------------------------- remote leases (phase P2)
REMOTE_DRIVER = """
import json, sys
from miniray._private.host import auth_token
from miniray._private.transport.remote_node import RemoteNodeClient
client = RemoteNodeClient(({ip!r}, {port}), auth_token.load_token(), timeout=3.0)
for line in sys.stdin:
    try:
        got = client.lease({{"CPU": float(line)}})
        print(json.dumps({{"granted": getattr(got, "lease_id", None)}}), flush=True)
    except Exception as error:
        print(json.dumps({{"error": type(error).__name__, "text": str(error)}}), flush=True)
"""


class _RemoteDriver:
    """A RemoteNodeClient in a process of ``host``, leasing on ``member`` line by line."""

    def __init__(self, host, member):
        import subprocess

        port = int(member.record()["address"].rsplit(":", 1)[1])
        self.proc = subprocess.Popen(
            ["nsenter", "-t", str(host.init), "-U", "-n", "-m", "-p", "--preserve-credentials",
             "--", sys.executable, "-c", REMOTE_DRIVER.format(ip=member.ip, port=port)],
            env=host.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def lease(self, cpus: float) -> dict:
        self.proc.stdin.write(f"{cpus}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()  # the driver exits at EOF
        try:
            self.proc.wait(15)
        except Exception:  # noqa: BLE001 - never leave it behind
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()


def _remote_leases(member) -> dict:
    path = os.path.join(member.record()["session_dir"], "ledger.json")
    with open(path) as f:
        return {k: v for k, v in json.load(f)["leases"].items()
                if v["tag"].startswith("remote driver")}


def test_a_partitioned_drivers_leases_are_freed_by_keepalive(lab):
    """The driver's host is cut off: no EOF ever reaches the member; TCP keepalive does
    (idle = MINIRAY_NODE_DEAD_AFTER_S, then 3 probes 1 s apart)."""
    head, member = _cluster(lab)
    other = lab.host("c", 3)
    driver = _RemoteDriver(other, member)
    try:
        assert driver.lease(2)["granted"]
        assert len(_remote_leases(member)) == 1
        t0 = time.monotonic()
        other.link(up=False)
        assert wait_until(lambda: not _remote_leases(member), WAIT_S)
        TIMINGS["remote_driver_partition_freed_s"] = time.monotonic() - t0
        other.link(up=True)
    finally:
        driver.close()


def test_a_partitioned_member_fences_remote_leases_and_the_driver_hears_it(lab):
    head, member = _cluster(lab)
    driver = _RemoteDriver(head, member)
    try:
        assert driver.lease(2)["granted"]
        t0 = time.monotonic()
        member.link(up=False)
        # The member fences itself once it goes dead_after without an answer from the head.
        assert wait_until(lambda: not _remote_leases(member), WAIT_S)
        TIMINGS["member_partition_fenced_s"] = time.monotonic() - t0
        member.link(up=True)
        assert wait_until(lambda: _alive(head, member.ip), WAIT_S), head.cluster()
        answer = driver.lease(1)
        assert answer.get("error") == "NodeDiedError" and member.ip in answer["text"], answer
    finally:
        driver.close()


# ---------------------------------------------------------------- packet loss
LOSSY_DRIVER = """
import hashlib, json, time
import numpy as np
import miniray as ray
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address={head!r})
member = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == {member!r})

@ray.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(member, soft=False))
def echo(array):
    return array[::-1].copy(), hashlib.sha256(array.tobytes()).hexdigest()

out = []
for seed in range(3):
    array = np.random.default_rng(seed).integers(0, 255, 16 << 20, dtype=np.uint8)
    t0 = time.monotonic()
    back, seen = ray.get(echo.remote(array), timeout=120)
    out.append([seen == hashlib.sha256(array.tobytes()).hexdigest(),
                bool((back[::-1] == array).all()), round(time.monotonic() - t0, 3)])
print(json.dumps(out))
ray.shutdown()
"""


def test_values_cross_a_lossy_link_intact_and_the_member_stays_alive(tmp_path):
    lab = netns_hosts.Lab(tmp_path, {"MINIRAY_HEARTBEAT_S": "0.2",
                                     "MINIRAY_NODE_DEAD_AFTER_S": "5"})
    try:
        head, member = _cluster(lab)
        try:
            for host in (head, member):
                host.lossy()
        except AssertionError as error:
            pytest.skip(f"no tc token bucket on this kernel: {error}")
        before = _incarnation(head, member.ip)
        done = head.run(sys.executable, "-c", LOSSY_DRIVER.format(
            head=f"{head.ip}:{PORT}", member=member.ip), timeout=300)
        rounds = json.loads(done.stdout.strip().splitlines()[-1])
        assert all(sent and back for sent, back, _s in rounds), rounds
        dropped = head.dropped() + member.dropped()
        TIMINGS["lossy_16mb_round_trips_s"] = max(s for _a, _b, s in rounds)
        TIMINGS["lossy_dropped_packets"] = dropped
        assert dropped > 0, "the link dropped nothing: the fault was not there"
        assert _alive(head, member.ip) and _incarnation(head, member.ip) == before
    finally:
        lab.close()
