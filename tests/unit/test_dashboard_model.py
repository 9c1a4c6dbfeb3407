"""The dashboard's pure parts: token, cookie and Host checks, the page's model, per-GPU bars,
and the ``/proc/net/tcp`` parsing behind the peer's uid."""

from __future__ import annotations

import socket

from miniray._private.core import dashboard_model as dm
from miniray._private.host import tcp_peer


def test_token_checks():
    token = dm.new_token()
    assert len(token) >= 40 and token != dm.new_token()
    assert dm.token_ok(token, token)
    assert not dm.token_ok(token[:-1], token)
    assert not dm.token_ok(None, token)
    assert not dm.token_ok("", "")
    assert dm.query_token(f"token={token}&x=1") == token
    assert dm.query_token("x=1") is None
    assert dm.cookie_token(f"a=b; {dm.COOKIE}={token}; c=d") == token
    assert dm.cookie_token("a=b") is None
    assert dm.cookie_token(None) is None


def test_host_header_check_refuses_other_names():
    assert dm.host_ok("127.0.0.1:8265", "127.0.0.1", 8265)
    assert dm.host_ok("localhost:8265", "127.0.0.1", 8265)
    assert not dm.host_ok("127.0.0.1:8266", "127.0.0.1", 8265)
    assert not dm.host_ok("127.0.0.1", "127.0.0.1", 8265)  # no port: not a browser's
    assert not dm.host_ok("evil.example:8265", "127.0.0.1", 8265)  # DNS rebinding
    assert not dm.host_ok(None, "127.0.0.1", 8265)
    assert dm.host_ok("[::1]:80", "::1", 80)
    assert dm.host_ok("10.1.2.3:80", "0.0.0.0", 80)
    assert not dm.host_ok("attacker.example:80", "0.0.0.0", 80)
    assert dm.is_loopback("127.0.0.2") and dm.is_loopback("::1")
    assert dm.is_loopback("::ffff:127.0.0.1")
    assert not dm.is_loopback("10.0.0.1") and not dm.is_loopback("example.com")


def test_gpu_bars():
    unit = 10000
    bars = dm.gpu_bars(["0", "1", "2"], [unit, 2500, 0], unit, ["GPU-abc"])
    assert [b["percent"] for b in bars] == [0.0, 75.0, 100.0]
    assert [b["used"] for b in bars] == [0.0, 0.75, 1.0]
    assert bars[1]["free"] == 0.25
    assert bars[0]["device"] == "GPU-abc" and bars[2]["device"] == "(logical)"


def _task(name, state, pid=None, created=None, end=None, kind="NORMAL_TASK"):
    return {"func_or_class_name": name, "name": name, "state": state, "worker_pid": pid,
            "creation_time_ms": created, "start_time_ms": None, "end_time_ms": end,
            "type": kind}


def test_model_groups_tasks_and_draws_the_timeline():
    tasks = [_task("slow", "RUNNING", 11, 1000), _task("slow", "RUNNING", 12, 1500),
             _task("slow", "PENDING_NODE_ASSIGNMENT"), _task("fast", "FINISHED", 11, 100, 400),
             _task("Counter.__init__", "FINISHED", 13, kind="ACTOR_CREATION_TASK"),
             _task("Counter.ping", "RUNNING", 13, None)]
    actors = [{"actor_id": "ab", "class_name": "Counter", "state": "ALIVE", "pid": 13,
               "name": "c"}]
    drivers = [{"pid": 5, "store": {"objects": 2, "bytes_in_memory": 10},
                "demands": [["slow", {"CPU": 1.0}, 1, False]]}]
    resources = [{"name": "CPU", "used": 2.0, "total": 4.0},
                 {"name": "object_store_memory", "used": 0, "total": 100}]
    model = dm.build_model([{"node_id": "n1", "address": "x", "state": "ALIVE"}], tasks,
                           actors, drivers, resources, [], ["driver pid 9: gone"], 2000)
    groups = {g["name"]: g for g in model["task_groups"]}
    assert groups["slow"] == {"name": "slow", "running": 2, "queued": 1}
    assert groups["Counter.ping"]["running"] == 1
    assert "fast" not in groups and "Counter.__init__" not in groups
    assert model["actors"] == [{"actor_id": "ab", "class_name": "Counter", "state": "ALIVE",
                                "pid": 13, "name": "c"}]
    assert model["resources"][0]["percent"] == 50.0
    # The store is not leased: its use is what the drivers' stores hold.
    assert model["resources"][1] == {"name": "object_store_memory", "used": 10, "total": 100,
                                     "percent": 10.0}
    assert model["stores"] == [{"pid": 5, "objects": 2, "bytes_in_memory": 10}]
    assert model["demands"][0]["name"] == "slow" and model["demands"][0]["count"] == 1
    timeline = model["timeline"]
    assert timeline["pids"] == [11, 12]
    assert timeline["start_ms"] == 100 and timeline["end_ms"] == 2000
    by_end = {(b["pid"], b["name"]): (b["start_ms"], b["end_ms"]) for b in timeline["bars"]}
    assert by_end[(11, "fast")] == (100, 400)
    assert by_end[(11, "slow")] == (1000, 2000)  # running: drawn up to now
    assert model["missing"] == ["driver pid 9: gone"]


_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2049 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1
   1: 0100007F:D431 0100007F:2049 01 00000000:00000000 00:00000000 00000000  1001        0 2
   2: 0100007F:2049 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 3
   3: garbage
"""


def test_proc_net_tcp_parsing_finds_the_peer_socket_owner():
    rows = tcp_peer.parse_table(_TABLE)
    assert rows[0] == ("127.0.0.1", 8265, "0.0.0.0", 0, 1000)
    # The client's socket (port 54321 -> 8265) belongs to uid 1001, not the server's row.
    assert tcp_peer.find_uid(rows, ("127.0.0.1", 54321), ("127.0.0.1", 8265)) == 1001
    assert tcp_peer.find_uid(rows, ("127.0.0.1", 1), ("127.0.0.1", 8265)) is None


def test_proc_net_tcp6_mapped_addresses():
    line = ("   0: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:2049"
            " 01 00000000:00000000 00:00000000 00000000  42 0 1\n")
    rows = tcp_peer.parse_table("header\n" + line)
    assert rows == [("127.0.0.1", 54321, "127.0.0.1", 8265, 42)]


def test_peer_uid_of_a_real_loopback_connection(tmp_path):
    """This process's own connection is found with this uid; no table: UNKNOWN."""
    import os

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, peer = server.accept()
    try:
        if os.path.exists("/proc/net/tcp"):
            assert tcp_peer.peer_uid(peer, conn.getsockname()) == os.getuid()
        missing = (str(tmp_path / "none"),)
        assert tcp_peer.peer_uid(peer, conn.getsockname(), missing) == tcp_peer.UNKNOWN
        # A table that does not list the connection: None (the dashboard refuses it).
        other = tmp_path / "tcp"
        other.write_text(_TABLE)
        assert tcp_peer.peer_uid(peer, conn.getsockname(), (str(other),)) is None
    finally:
        for s in (conn, client, server):
            s.close()
