"""The worker's control thread before a pipelined task starts (``worker_main._Worker``):
every control message already arrived is handled first. A socketpair and a pipe stand for
the owner's data and control sockets; no processes."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import threading

from miniray._private.core import protocol
from miniray._private.transport.framing import FramedSocket
from miniray._private.worker import worker_main
from miniray._private.worker.worker_api import Channel

T2 = b"t2".ljust(24, b"\0")


def test_a_cancel_behind_a_recall_is_handled_before_the_task_it_names_starts():
    """RECALL then CANCEL(t2) are on the control socket when t2 is about to start. Before,
    the main loop waited for one control message only (the RECALL) and ran t2 although it
    was cancelled, the owner having failed it already. The CANCEL's handling is held (at
    most ``grace``) until t2 runs, if it does."""
    data_a, data_b = socket.socketpair()
    data_a.settimeout(10)
    data_b.settimeout(10)
    owner_data = FramedSocket(data_b)
    ctl, owner_ctl = multiprocessing.Pipe()
    channel = Channel(FramedSocket(data_a))
    channel.conn.sock.settimeout(None)
    worker = worker_main._Worker(channel, ctl, {})
    ran = threading.Event()

    def body():
        ran.set()

    worker.functions[b"fn"] = body
    handle = worker._on_control

    def on_control(message):
        if message[0] == protocol.CANCEL:
            ran.wait(0.2)  # late (within the main loop's 0.5 s), as on a loaded machine
        handle(message)

    worker._on_control = on_control
    try:
        owner_ctl.send_bytes(pickle.dumps((protocol.RECALL,)))
        owner_ctl.send_bytes(pickle.dumps((protocol.CANCEL, T2)))
        worker.start_control_thread()
        ctx = ({"CPU": 1.0}, None, True, False, "body", None)
        worker.run_task((protocol.TASK, T2, b"fn", "body", worker_main._NO_ARGS_BLOB, None,
                         [b"r" * 28], 1, ctx))
        assert not ran.is_set(), "t2 ran although its CANCEL had arrived before it started"
        messages = []
        while len(messages) < 2:
            messages.extend(pickle.loads(frame) for frame in owner_data.recv())
        assert messages[0] == (protocol.GIVE_BACK, [])
        assert messages[1][:2] == (protocol.RESULT, T2)
        assert messages[1][2][0][0] == protocol.ERR  # TaskCancelledError
    finally:
        owner_ctl.close()
        ctl.close()
        data_a.close()
        data_b.close()
