"""Pure decisions taken when a helper process (fork server, node) dies: the restart budget and
the words that describe the death."""

from __future__ import annotations

import signal

from miniray._private.owner.owner_helper_loss import RestartBudget, fatal_message, restart_line
from miniray._private.transport.spawn import describe_returncode


def test_restart_budget_allows_limit_restarts_per_window():
    budget = RestartBudget(limit=2, window_s=60.0)
    assert budget.allow(0.0)
    assert budget.allow(10.0)
    assert not budget.allow(20.0)  # a third within 60 s
    assert not budget.allow(59.9)
    assert budget.allow(60.0)      # the first has left the window
    assert not budget.allow(65.0)
    assert budget.allow(70.0)


def test_restart_budget_of_zero_never_allows():
    assert not RestartBudget(limit=0, window_s=60.0).allow(0.0)


def test_describe_returncode_names_the_signal_or_the_code():
    assert describe_returncode(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    assert describe_returncode(-signal.SIGSEGV) == "was killed by signal 11 (SIGSEGV)"
    assert describe_returncode(3) == "exited with code 3"
    assert describe_returncode(-77) == "was killed by signal 77 (signal 77)"


def test_messages_say_what_died_and_what_to_do():
    death = "miniray's fork server (pid 42) was killed by signal 9 (SIGKILL)"
    budget = RestartBudget(limit=3, window_s=60.0)
    for now in (0.0, 1.0, 2.0):
        budget.allow(now)
    text = fatal_message(death, budget)
    assert text.startswith(death)
    assert "replaced 3 time(s) in the last 60 s" in text
    assert text.endswith("Call miniray.shutdown() and miniray.init() again to start a new "
                         "session.")
    assert "MINIRAY_FORK_SERVER_RESTARTS=0" in fatal_message(death, RestartBudget(0, 60.0))
    line = restart_line(death, 43, retried=2, failed=1, actors=1, budget=budget)
    assert line == (f"miniray: {death}; its workers died with it. Started a new fork server "
                    "(pid 43): 2 task(s) retried, 1 failed, 1 actor(s) affected (restart 3 of "
                    "at most 3 in 60 s).")


def _client(pid: int):
    import socket

    from miniray._private.host import procinfo
    from miniray._private.transport.node_client import NodeClient, NodeRecord

    mine, _theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    record = NodeRecord(pid=pid, start_time=procinfo.start_time(pid), address="127.0.0.1:6379",
                        port=6379, socket="", session_dir="", started_at=0.0)
    return NodeClient(mine, {"node_pid": pid, "address": "127.0.0.1:6379"}, record), _theirs


def test_a_node_that_is_gone_is_named_with_its_pid_and_an_unknown_status():
    import os

    client, other = _client(os.getpid())
    client.record.start_time = -1  # the pid names another process now: the node is gone
    try:
        assert client.describe_exit(timeout=0.05) == (
            f"the miniray node 127.0.0.1:6379 (pid {os.getpid()}) exited (status unknown: "
            "killed, or crashed)")
        assert client.describe_stopping("miniray stop, or SIGTERM") == (
            f"the miniray node 127.0.0.1:6379 (pid {os.getpid()}) was stopped (miniray stop, "
            "or SIGTERM)")
    finally:
        client.close()
        other.close()


def test_a_node_that_still_runs_closed_the_connection():
    import os

    client, other = _client(os.getpid())  # a live process stands in for the node
    try:
        assert "closed this driver's connection" in client.describe_exit(timeout=0.05)
    finally:
        client.close()
        other.close()
