"""Tasks on another host between fake hosts (peering design 4.3 "Remote lease, spawn, task").

A head on 127.0.0.1 and a member on 127.0.0.2, each with its own root (``FakeHosts`` of
test_cluster_join.py: separate MINIRAY_TMPDIR and host dir, fast heartbeats; every process,
session and segment of each root is checked on teardown). First the node's half alone (a
``RemoteNodeClient`` in this process spawns a worker on the member and speaks to it), then
a driver on the head's host running ``NodeAffinitySchedulingStrategy(member, soft=False)``
tasks through its owner.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import time

import pytest

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.transport import node_client
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.remote_node import RemoteNodeClient

from .helpers import driver, json_line, stop_driver, wait_until
from .test_cluster_join import FakeHosts

MEMBER = "127.0.0.2"


@pytest.fixture
def hosts(tmp_path):
    h = FakeHosts(tmp_path)
    yield h
    h.close()


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member's (host, port) with 2 CPUs."""
    head = hosts.start_head()
    joined = hosts.join(MEMBER, head, "--num-cpus", "2")
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.1").get(MEMBER) or {}).get("alive"), 5.0)
    yield node_client.parse_address(hosts.record(MEMBER).address)


def _client(hosts, address) -> RemoteNodeClient:
    token = auth_token.load_token(environ=hosts.env("127.0.0.1"))
    return RemoteNodeClient(address, token, timeout=5.0, source_address=("127.0.0.1", 0))


def _hello(session_dir: str = "") -> tuple:
    return (protocol.HELLO, {
        "session_dir": session_dir, "node_id": "driver-node", "node_ip": "127.0.0.1",
        "store": {"session_tag": "mrtest", "shm_dir": "/dev/shm",
                  "inline_threshold": 100 * 1024, "capacity": 1 << 28},
        "job_id": None, "namespace": "", "sys_path": [], "cwd": "", "runtime_env": {},
        "setup_hook": None, "ray_alias": False, "nodes": [], "logging_config": None})


def _exited(client: RemoteNodeClient, pid: int, timeout: float = 5.0):
    """The link is read during calls only: ping until the worker's exit came back."""
    def seen():
        client.ping()
        return pid in client.exited
    assert wait_until(seen, timeout, 0.05), client.exited
    return client.exited[pid]


def test_a_spawned_remote_worker_speaks_macd_frames_and_its_exit_comes_back(hosts, member):
    with _client(hosts, member) as client:
        pid, channels = client.spawn()
        data, ctl, out, err = channels
        try:
            data.send(_hello())
            assert data.recv(timeout=10) == (protocol.READY,)
            # The worker is the member's: its process lives under the member's root.
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            root = hosts.env(MEMBER)["MINIRAY_TMPDIR"].encode()
            assert b"MINIRAY_TMPDIR=" + root in environ
            assert client.node_id == hosts.record(MEMBER).node_id
        finally:
            for channel in channels:
                channel.close()
        # Closing its data connection ends the worker; the member reports the exit.
        status = _exited(client, pid)
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_tampered_frame_ends_the_remote_worker_before_anything_is_unpickled(hosts, member):
    marker = f"/tmp/mr-tamper-{os.getpid()}"

    class Boom:
        def __reduce__(self):
            return (open, (marker, "w"))

    with _client(hosts, member) as client:
        pid, channels = client.spawn()
        data = channels[0]
        try:
            data.send(_hello())
            assert data.recv(timeout=10) == (protocol.READY,)
            header, payload, tag = data._writer.encode(pickle.dumps((protocol.FUNC, b"f",
                                                                     Boom())))
            pc._send_all(data._sock, header + payload + bytes(16))  # a wrong tag
            status = _exited(client, pid)
            assert os.waitstatus_to_exitcode(status) == 0  # it left on its own
            assert not os.path.exists(marker)
        finally:
            for channel in channels:
                channel.close()
            if os.path.exists(marker):
                os.unlink(marker)


def test_the_member_kills_a_remote_drivers_workers_when_its_link_closes(hosts, member):
    client = _client(hosts, member)
    pid, channels = client.spawn()
    try:
        channels[0].send(_hello())
        assert channels[0].recv(timeout=10) == (protocol.READY,)
        client.close()  # the data connection stays open: the member must end the worker
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5.0)
    finally:
        for channel in channels:
            channel.close()
