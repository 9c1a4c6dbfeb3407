"""The worker's control thread before a pipelined task starts (``worker_main._Worker``):
every control message already arrived is handled first. A socketpair and a pipe stand for
the owner's data and control sockets; no processes."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import threading
import time

from miniray._private.core import protocol
from miniray._private.transport.framing import FramedSocket
from miniray._private.worker import worker_main
from miniray._private.worker.worker_api import Channel

T2 = b"t2".ljust(24, b"\0")


def _scene(late_read: bool = False, late_handling: bool = True) -> tuple[bool, list]:
    """RECALL then CANCEL(t2) on the control pipe, the control thread started, then t2 run:
    whether t2's body ran, and the first two messages the owner received. ``late_read``:
    the control thread is descheduled for 0.3 s right after it took the CANCEL out of the
    pipe; ``late_handling``: it handles the CANCEL 0.2 s late (within the main loop's
    0.5 s), as on a loaded machine."""
    data_a, data_b = socket.socketpair()
    data_a.settimeout(10)
    data_b.settimeout(10)
    owner_data = FramedSocket(data_b)
    ctl, owner_ctl = multiprocessing.Pipe()
    channel = Channel(FramedSocket(data_a))
    channel.conn.sock.settimeout(None)
    worker = worker_main._Worker(channel, ctl, {})
    ran = threading.Event()
    worker.functions[b"fn"] = ran.set
    handle = worker._on_control

    def on_control(message):
        if late_handling and message[0] == protocol.CANCEL:
            ran.wait(0.2)
        handle(message)

    worker._on_control = on_control
    if late_read:
        recv_bytes = ctl.recv_bytes

        def slow_recv_bytes():
            data = recv_bytes()
            if pickle.loads(data)[0] == protocol.CANCEL:
                time.sleep(0.3)
            return data

        ctl.recv_bytes = slow_recv_bytes
    try:
        owner_ctl.send_bytes(pickle.dumps((protocol.RECALL,)))
        owner_ctl.send_bytes(pickle.dumps((protocol.CANCEL, T2)))
        worker.start_control_thread()
        ctx = ({"CPU": 1.0}, None, True, False, "body", None)
        worker.run_task((protocol.TASK, T2, b"fn", "body", worker_main._NO_ARGS_BLOB, None,
                         [b"r" * 28], 1, ctx))
        messages: list = []
        while len(messages) < 2:
            messages.extend(pickle.loads(frame) for frame in owner_data.recv())
        return ran.is_set(), messages
    finally:
        owner_ctl.close()
        ctl.close()
        data_a.close()
        data_b.close()


def test_a_cancel_taken_from_the_pipe_but_not_yet_counted_still_stops_its_task():
    """The control thread may lose the CPU between taking a message out of the pipe and
    counting it: the main loop must not see "nothing waiting" then (it counts before it
    reads)."""
    for _ in range(3):
        ran, _messages = _scene(late_read=True, late_handling=False)
        assert not ran


def test_a_cancel_behind_a_recall_is_handled_before_the_task_it_names_starts():
    """RECALL then CANCEL(t2) are on the control socket when t2 is about to start. Before,
    the main loop waited for one control message only (the RECALL) and ran t2 although it
    was cancelled, the owner having failed it already. The CANCEL's handling is held (at
    most ``grace``) until t2 runs, if it does."""
    ran, messages = _scene(late_handling=True)
    assert not ran, "t2 ran although its CANCEL had arrived before it started"
    assert messages[0] == (protocol.GIVE_BACK, [])
    assert messages[1][:2] == (protocol.RESULT, T2)
    assert messages[1][2][0][0] == protocol.ERR  # TaskCancelledError
