"""Remote leases between fake hosts (peering design 4.3 "Remote lease", tier 1).

A head on 127.0.0.1 and a member on 127.0.0.2, each with its own root (``FakeHosts`` of
test_cluster_join.py: separate MINIRAY_TMPDIR and host dir, fast heartbeats, every process,
session and segment checked on teardown). A ``RemoteNodeClient`` (in this process, bound to
127.0.0.1, or in a driver process) leases CPU on the member's ledger over the ``driver``
role; the member's own ledger file and ``miniray status`` are read to check it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from miniray._private.host import auth_token
from miniray._private.ledger.ledger import Ledger
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.remote_node import (
    RemoteDenial,
    RemoteGrant,
    RemoteLeaseError,
    RemoteNodeClient,
)
from miniray.exceptions import NodeDiedError

from .helpers import cli, driver, json_line, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`

MEMBER = "127.0.0.2"


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member's (host, port) with 2 CPUs."""
    yield hosts.start_member(MEMBER, "--num-cpus", "2")
    ledger = _ledger(hosts)
    assert wait_until(lambda: not ledger.snapshot().leases, 30.0), ledger.snapshot().leases


def _token(hosts) -> bytes:
    return auth_token.load_token(environ=hosts.env("127.0.0.1"))


def _ledger(hosts) -> Ledger:
    return Ledger(os.path.join(hosts.record(MEMBER).session_dir, "ledger.json"))


def _client(hosts, address, **kw) -> RemoteNodeClient:
    return RemoteNodeClient(address, kw.pop("token", None) or _token(hosts), timeout=5.0,
                            source_address=("127.0.0.1", 0), **kw)


def test_a_driver_leases_on_a_member_sees_it_in_status_and_is_denied_when_full(hosts, member):
    ledger = _ledger(hosts)
    with _client(hosts, member) as client:
        assert client.node_id == hosts.record(MEMBER).node_id
        first = client.lease({"CPU": 1}, tag="task f")
        assert isinstance(first, RemoteGrant)
        (lease,) = ledger.snapshot().leases.values()
        assert lease.lease_id == first.lease_id and lease.holder_pid == hosts.record(MEMBER).pid
        assert f"remote driver 127.0.0.1 pid {os.getpid()}: task f" == lease.tag
        status = cli(hosts.env(MEMBER), "status")
        assert status.returncode == 0, status.stderr
        assert f"remote driver 127.0.0.1 pid {os.getpid()}" in status.stdout, status.stdout
        second = client.lease({"CPU": 1})
        assert isinstance(second, RemoteGrant)
        denied = client.lease({"CPU": 1})
        assert isinstance(denied, RemoteDenial) and denied.available.get("CPU", 0) == 0
        with pytest.raises(RemoteLeaseError) as info:
            client.lease({"GPU": 1})
        assert info.value.kind == "infeasible" and MEMBER in str(info.value)
        client.release(first.lease_id)
        assert list(ledger.snapshot().leases) == [second.lease_id]
        # The member's available resources reach the head with its heartbeats.
        assert wait_until(lambda: hosts.cluster("127.0.0.1")[MEMBER]["available"]
                          .get("CPU") == 1.0, 30.0)
    # Closing the client released the lease it still held.
    assert wait_until(lambda: not ledger.snapshot().leases, 30.0)


def test_a_killed_driver_process_frees_its_leases_on_the_member(hosts, member):
    ledger = _ledger(hosts)
    proc = driver(f"""
        import json, os, sys
        from miniray._private.host import auth_token
        from miniray._private.transport.remote_node import RemoteNodeClient
        client = RemoteNodeClient({member!r}, auth_token.load_token(),
                                  source_address=("127.0.0.1", 0))
        grants = [client.lease({{"CPU": 1}}).lease_id for _ in range(2)]
        print(json.dumps({{"grants": grants, "pid": os.getpid()}}), flush=True)
        sys.stdin.readline()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        doc = json_line(proc)
        assert sorted(ledger.snapshot().leases) == sorted(doc["grants"])
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not ledger.snapshot().leases, 30.0)
        print(f"SIGKILL of a remote driver to its leases freed: {time.monotonic() - t0:.2f} s")
    finally:
        stop_driver(proc)


def test_a_wrong_token_is_refused_at_once(hosts, member):
    # At once: the node's answer, PeerAuthError; a client that waited for one in vain would
    # raise TimeoutError at its timeout (no bound on the seconds: a loaded runner takes any).
    with pytest.raises(pc.PeerAuthError, match="get-auth-token"):
        _client(hosts, member, token=b"another-token-" + b"1" * 32)
    assert not _ledger(hosts).snapshot().leases


def test_a_member_held_dead_fences_remote_leases_before_it_rejoins(hosts, member):
    """Fencing (design 4.3): the member is stopped past dead_after (the head retried its
    work elsewhere); when it runs again it drops every remote driver's lease and link
    before it rejoins as a new incarnation."""
    ledger = _ledger(hosts)
    record = hosts.record(MEMBER)
    incarnation = hosts.cluster("127.0.0.1")[MEMBER]["incarnation"]
    client = _client(hosts, member)
    try:
        assert isinstance(client.lease({"CPU": 2}), RemoteGrant)
        hosts.stopped.append(record.pid)
        os.kill(record.pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: not hosts.cluster("127.0.0.1")[MEMBER]["alive"], 30.0)
        finally:
            os.kill(record.pid, signal.SIGCONT)
        assert wait_until(lambda: not ledger.snapshot().leases, 30.0)
        assert wait_until(lambda: hosts.cluster("127.0.0.1")[MEMBER]["alive"], 30.0)
        assert hosts.cluster("127.0.0.1")[MEMBER]["incarnation"] > incarnation
        with pytest.raises(NodeDiedError, match=f"{MEMBER}.*(dead|heartbeat)"):
            client.lease({"CPU": 1})
        with open(os.path.join(record.session_dir, "node.log")) as f:
            assert "fenced 1 remote driver(s) and 1 lease(s)" in f.read()
    finally:
        client.close()
    # A new driver link is served by the new incarnation.
    with _client(hosts, member) as again:
        assert isinstance(again.lease({"CPU": 2}), RemoteGrant)


def test_a_lease_and_its_release_take_a_round_trip_each(hosts, member):
    """Shown with -s: the median of 50 lease + release pairs between fake hosts (each
    pair is two round trips and two ledger transactions on the member)."""
    import statistics

    with _client(hosts, member) as client:
        pings = [client.ping() for _ in range(50)]
        pairs = []
        for _ in range(50):
            t0 = time.perf_counter()
            grant = client.lease({"CPU": 1})
            client.release(grant.lease_id)
            pairs.append(time.perf_counter() - t0)
    ping_ms = statistics.median(pings) * 1e3
    pair_ms = statistics.median(pairs) * 1e3
    print(f"driver link 127.0.0.1 -> {MEMBER}: ping {ping_ms:.2f} ms, "
          f"lease + release {pair_ms:.2f} ms (medians of 50)")
    assert pair_ms < 500  # a bound for a busy CI machine, not a target
