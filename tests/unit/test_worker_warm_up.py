"""The worker's warm-up (``worker_main._Worker.warm_up``): a built-in no-op run once through
the task path after READY, so that the first task pays none of that path's first run in the
forked process. Nothing of it may be seen: nothing sent to the owner, no output (marker
lines included), no function, environment or task context left behind. A socketpair and a
pipe stand for the owner's data and control sockets; no processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import time

from miniray._private.core import protocol
from miniray._private.transport.framing import FramedSocket
from miniray._private.worker import worker_api, worker_main
from miniray._private.worker.worker_api import Channel


def _worker():
    data_a, data_b = socket.socketpair()
    ctl, owner_ctl = multiprocessing.Pipe()
    channel = Channel(FramedSocket(data_a))
    # None is sent inline, as with the store's default threshold
    worker = worker_main._Worker(channel, ctl, {"store": {"inline_threshold": 1 << 20}})
    return worker, data_b, (data_a, data_b, ctl, owner_ctl)


def test_the_warm_up_sends_nothing_and_leaves_nothing(monkeypatch, capfd):
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.delenv("OMP_NUM_THREADS")  # absent, as where the user did not set it
    worker, owner_end, ends = _worker()
    ran = []
    run_task = worker.run_task
    worker.run_task = lambda message, _send=None: ran.append(message[1]) or run_task(
        message, _send)
    try:
        before = (dict(worker.functions), worker.last_name, worker.env_for, worker.omp_now,
                  worker.current, set(worker.cancelled))
        worker.warm_up()
        assert ran, "the warm-up did not run the task path"
        assert (dict(worker.functions), worker.last_name, worker.env_for, worker.omp_now,
                worker.current, set(worker.cancelled)) == before
        assert "OMP_NUM_THREADS" not in os.environ
        assert worker_api._current_task.get() is None
        owner_end.setblocking(False)
        try:
            sent = owner_end.recv(1 << 16)
        except BlockingIOError:
            sent = b""
        assert sent == b"", "the warm-up wrote to the owner"
        out, err = capfd.readouterr()
        assert out == "" and err == "", "the warm-up wrote output (a marker line?)"
    finally:
        for end in ends:
            end.close()


def test_a_task_after_the_warm_up_runs_and_is_marked_as_usual(monkeypatch, capfd):
    """The first real task after the warm-up: its function is the owner's, its marker line
    is written (the warm-up did not take its name), its RESULT reaches the owner."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's value: left alone
    worker, owner_end, ends = _worker()
    owner = FramedSocket(owner_end)
    try:
        worker.warm_up()
        worker.functions[b"fn"] = lambda: None
        ctx = ({"CPU": 1.0}, None, True, False, "first", None)
        worker.run_task((protocol.TASK, b"t1".ljust(24, b"\0"), b"fn", "first",
                         worker_main._NO_ARGS_BLOB, None, [b"r" * 28], 1, ctx))
        [frame] = owner.recv()
        message = pickle.loads(frame)
        assert message[:2] == (protocol.RESULT, b"t1".ljust(24, b"\0"))
        assert message[2][0][0] == protocol.OK
        assert os.environ["OMP_NUM_THREADS"] == "3"
        out, err = capfd.readouterr()
        marker = (worker_main.MARKER + f"{os.getpid()}:first\n".encode()).decode()
        assert out == marker and err == marker
    finally:
        for end in ends:
            end.close()


def test_no_warm_up_where_a_returned_none_would_be_stored():
    """Below the inline threshold a None would go to a segment named after the warm-up's
    return id, which nobody frees: no warm-up then."""
    data_a, data_b = socket.socketpair()
    ctl, owner_ctl = multiprocessing.Pipe()
    try:
        worker = worker_main._Worker(Channel(FramedSocket(data_a)), ctl,
                                     {"store": {"inline_threshold": 0}})
        worker.run_task = lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran"))
        worker.warm_up()
    finally:
        for end in (data_a, data_b, ctl, owner_ctl):
            end.close()


def test_the_warm_up_function_is_pickled_by_value():
    """As a function of the driver's script is: the worker unpickles it through
    cloudpickle's by-value path, the one a first task takes."""
    data = worker_main.prepare_warm_up()
    assert b"_make_function" in data
    assert pickle.loads(data)() is None


def test_nothing_waiting_sees_a_message_in_the_socket_and_in_the_inbox():
    """A worker started for a task finds it waiting after READY: no warm-up then (it would
    only make that task wait)."""
    worker, owner_end, ends = _worker()
    owner = FramedSocket(owner_end)
    try:
        assert worker.channel.nothing_waiting()
        owner.send(pickle.dumps((protocol.EXIT,), protocol=5))
        deadline = time.monotonic() + 5
        while worker.channel.nothing_waiting():
            assert time.monotonic() < deadline
        assert worker.channel.next_message() == (protocol.EXIT,)
        assert worker.channel.nothing_waiting()
        worker.channel._incoming.append((protocol.EXIT,))
        assert not worker.channel.nothing_waiting()
    finally:
        for end in ends:
            end.close()
