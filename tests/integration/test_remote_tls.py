"""Work on another host with TLS on every host (README "Between hosts", Security).

A head on 127.0.0.1 and a member on 127.0.0.2 (``FakeHosts``), both with
``MINIRAY_USE_TLS=1`` and certificates signed by one CA made in ``tmp_path``. The member
forks workers for the driver on the head's host; their attach connections are TLS-wrapped
and token-authenticated, and the member relays each one's plaintext to the worker
(``transport/tls_relay.py``). Tasks, an actor, a nested request and 20 MB values both
ways; a peer whose certificate the CA did not sign is refused; the fixture's teardown
checks that nothing is left on either host. The same driver also runs without TLS, to
measure what the relay costs (printed with ``-s``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from miniray._private.host import auth_token
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.remote_node import RemoteNodeClient
from miniray.exceptions import NodeDiedError

from .helpers import wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_tasks import MEMBER, _run_driver

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _certificates(root) -> dict:
    """A CA, a host certificate it signed, and a self-signed ("rogue") one, in ``root``."""
    if not shutil.which("openssl"):
        pytest.skip("the openssl command is not installed: cannot make test certificates")
    root.mkdir()

    def run(*args):
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True,
                       timeout=60)

    run("req", "-x509", *KEY, "-days", "1", "-subj", "/CN=ca", "-keyout", "ca.key",
        "-out", "ca.pem")
    run("req", *KEY, "-subj", "/CN=node", "-keyout", "node.key", "-out", "node.csr")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-out", "node.pem")
    run("req", "-x509", *KEY, "-days", "1", "-subj", "/CN=rogue", "-keyout", "rogue.key",
        "-out", "rogue.pem")
    return {"node": (str(root / "node.pem"), str(root / "node.key")),
            "rogue": (str(root / "rogue.pem"), str(root / "rogue.key")),
            "ca": str(root / "ca.pem")}


def _tls_on_hosts(hosts, tmp_path, ips=("127.0.0.1", MEMBER)) -> dict:
    """TLS turned on for the hosts ``ips`` (before their nodes start), with certificates
    made under ``tmp_path``; returns them (``_certificates``)."""
    certs = _certificates(tmp_path / "certs")
    tls = {"MINIRAY_USE_TLS": "1", "MINIRAY_TLS_SERVER_CERT": certs["node"][0],
           "MINIRAY_TLS_SERVER_KEY": certs["node"][1], "MINIRAY_TLS_CA_CERT": certs["ca"]}
    for ip in ips:
        hosts.env(ip).update(tls)
    return certs


@pytest.fixture(params=[True, False], ids=["tls", "plain"])
def member(request, hosts, tmp_path):
    """Two fake hosts, with TLS on both (``tls``) or on neither (``plain``: the baseline
    of the measurement); yields ``(certificates or None, the member's (host, port))``."""
    certs = _tls_on_hosts(hosts, tmp_path) if request.param else None
    yield certs, hosts.start_member(MEMBER, "--num-cpus", "2")


BODY = """
    import numpy as np

    on = dict(scheduling_strategy=there)

    @ray.remote
    def where(x):
        print("printed on the member")
        return x + 1, ray.get_runtime_context().get_node_id()

    @ray.remote
    def child(x):
        return x * 2

    @ray.remote
    def parent(x):
        # nested: a task of the member's worker, and a get of its value, through the driver
        return ray.get(child.options(scheduling_strategy=there).remote(x)) + 1

    @ray.remote
    def total(array):
        return float(array.sum()), array.nbytes

    @ray.remote
    def make(n):
        return np.ones(n // 8)

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k
            return self.n, ray.get_runtime_context().get_node_id()

    @ray.remote
    def noop():
        return None

    value = ray.get(where.options(**on).remote(41), timeout=60)
    nested = ray.get(parent.options(**on).remote(20), timeout=60)
    counter = Counter.options(**on).remote()
    ray.get(counter.add.remote(1), timeout=60)
    actor = ray.get(counter.add.remote(2), timeout=60)
    array = np.arange(20 * 1024 * 1024 // 8, dtype=np.float64)
    sent = ray.get(total.options(**on).remote(array), timeout=60)
    got = ray.get(make.options(**on).remote(20 * 1024 * 1024), timeout=60)
    ray.kill(counter)

    def timed(fn, n):
        ray.get([fn() for _ in range(3)], timeout=60)
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(fn(), timeout=60)
        return (time.perf_counter() - t0) / n * 1e3

    ms_noop = timed(lambda: noop.options(**on).remote(), 200)
    ms_20mb = timed(lambda: total.options(**on).remote(array), 10)
    print(json.dumps({"value": value, "nested": nested, "actor": actor, "member": member,
                      "sent": sent, "expected": float(array.sum()),
                      "got": [got.nbytes, float(got.sum())],
                      "ms_noop": ms_noop, "ms_20mb": ms_20mb}), flush=True)
    del got, array
    ray.shutdown()
"""


def test_tasks_an_actor_nested_requests_and_20_mb_values_work_across_hosts(hosts, member):
    certs, _address = member
    doc = _run_driver(hosts, BODY, timeout=180)
    member_id = hosts.record(MEMBER).node_id
    assert doc["member"] == member_id
    assert doc["value"] == [42, member_id]
    assert f"ip={MEMBER}) printed on the member" in doc["stdout"], doc["stdout"][-2000:]
    assert doc["nested"] == 41
    assert doc["actor"] == [3, member_id]
    assert doc["sent"] == [doc["expected"], 20 * 1024 * 1024]
    assert doc["got"] == [20 * 1024 * 1024, 20 * 1024 * 1024 // 8]
    print(f"\n{'TLS' if certs else 'no TLS'}: warm remote no-op {doc['ms_noop']:.2f} ms, "
          f"20 MB argument {doc['ms_20mb']:.1f} ms")
    from miniray._private.ledger.ledger import Ledger

    ledger_path = os.path.join(hosts.record(MEMBER).session_dir, "ledger.json")
    assert wait_until(lambda: not Ledger(ledger_path).snapshot().leases, 30.0)


def test_a_peer_without_the_cas_certificate_or_without_tls_is_refused(hosts, member):
    certs, address = member
    if certs is None:
        pytest.skip("TLS only")
    token = auth_token.load_token(environ=hosts.env("127.0.0.1"))
    rogue = ph.client_ssl_context(*certs["rogue"], certs["ca"])
    for context in (rogue, None):
        with pytest.raises((pc.PeerAuthError, pc.PeerClosed, OSError, NodeDiedError)):
            client = RemoteNodeClient(address, token, timeout=5.0, ssl_context=context,
                                      source_address=("127.0.0.1", 0))
            try:  # TLS 1.3: the server's refusal may come after the client's handshake
                client.ping()
            finally:
                client.close()
    # A peer with the CA's certificate and the token gets a worker there (the relay).
    # Its four connections are relayed by the member's one relay thread, which ends with
    # the worker (the last relay). Threads are told apart by id, not counted: a thread that
    # was already there (the refused peers' handshakes may still be ending, however late a
    # loaded runner lets them) neither counts as the relay nor hides it.
    node_pid = hosts.record(MEMBER).pid

    def threads() -> set:
        return set(os.listdir(f"/proc/{node_pid}/task"))

    good = ph.client_ssl_context(*certs["node"], certs["ca"])
    with RemoteNodeClient(address, token, timeout=5.0, ssl_context=good,
                          source_address=("127.0.0.1", 0)) as client:
        client.ping()
        before = threads()
        pid, channels = client.spawn()
        try:
            assert all(channel.tls for channel in channels)
            assert os.path.exists(f"/proc/{pid}")
            # The spawn's own handshake threads end; the one relay thread stays.
            assert wait_until(lambda: len(threads() - before) == 1, 30.0), (before, threads())
        finally:
            for channel in channels:
                channel.close()
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30.0)
        assert wait_until(lambda: not threads() - before, 30.0), (before, threads())
