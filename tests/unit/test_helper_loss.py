"""Decisions taken when a helper process (fork server, node) dies: the restart budget, the
words that describe the death, and the ``HelperLoss`` component with fake parts."""

from __future__ import annotations

import signal

from miniray._private.core import protocol
from miniray._private.owner.object_table import PENDING, READY
from miniray._private.owner.owner_helper_loss import (
    HelperLoss,
    RestartBudget,
    fatal_message,
    restart_line,
)
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


# ------------------------------------------------------------------ the component
class _Entry:
    def __init__(self, state):
        self.state = state


class _Objects:
    def __init__(self, states: dict):
        self.entries = {oid: _Entry(state) for oid, state in states.items()}
        self.ready = []

    def set_ready(self, object_id, kind, data):
        self.ready.append((object_id, kind))
        self.entries[object_id].state = READY


class _Worker:
    def __init__(self, exited=False, actor=None):
        self.exited = exited
        self.actor = actor
        self.pid = 1


class _Helper:
    def describe_stopping(self, reason):
        return f"the node stopped ({reason})"


def _helper_loss(events: list, *, closed=False, workers=(), objects=None):
    import threading
    import types

    def worker_gone(worker, status, death):
        events.append(("worker_gone", status, death))
        return 1, 0

    return HelperLoss(
        lock=threading.Lock(), objects=objects or _Objects({}),
        workers=types.SimpleNamespace(by_req={i: w for i, w in enumerate(workers)}),
        actors=types.SimpleNamespace(
            fail_every_actor=lambda why: events.append(("actors", why))),
        restart_fork_server=None, fork_server=_Helper,
        replace_fork_server=lambda new: events.append(("replace", new)),
        unregister=lambda fd: events.append(("unregister", fd)),
        closed=lambda: closed, closing=lambda: closed, worker_gone=worker_gone,
        dispatch_all=lambda: events.append(("dispatch",)),
        unfinished_tasks=lambda: ["t1", "t2"],
        fail_task=lambda task, error: events.append(("fail", task, type(error).__name__)),
        drop_queues=lambda: events.append(("drop",)))


def test_a_node_stopping_fails_workers_tasks_actors_and_pending_objects_in_that_order():
    """The component is given its parts: the session's end touches only those."""
    events: list = []
    objects = _Objects({b"a": PENDING, b"b": READY})
    loss = _helper_loss(events, workers=[_Worker(), _Worker(exited=True)], objects=objects)
    loss.on_stopping("miniray stop")
    assert loss.fatal.startswith("the node stopped (miniray stop)")
    assert [e[0] for e in events] == ["worker_gone", "fail", "fail", "actors", "drop"]
    assert events[0][2] == "the node stopped (miniray stop)"
    assert events[1][2] == "RaySystemError"
    assert objects.ready == [(b"a", protocol.ERR)]
    loss.on_stopping("again")  # handled once
    assert len(events) == 5


def test_a_node_stopping_after_shutdown_began_changes_nothing():
    events: list = []
    loss = _helper_loss(events, closed=True, workers=[_Worker()])
    loss.on_stopping("miniray stop")
    assert loss.fatal is None and events == []


def test_losing_every_worker_counts_actors_and_skips_exited_workers():
    events: list = []
    loss = _helper_loss(events, workers=[_Worker(actor=object()), _Worker(), _Worker(True)])
    assert loss.lose_every_worker("it died") == (2, 0, 1)
    assert [e[0] for e in events] == ["worker_gone", "worker_gone"]
