"""The worker's end of its data socket (``worker/worker_api.Channel``) when tasks are
pipelined: what it gives back when a request may block, and a task that arrives while it is
blocked. A socketpair stands for the owner; no processes."""

from __future__ import annotations

import collections
import pickle
import socket
import threading

from miniray._private.core import protocol
from miniray._private.transport.framing import FramedSocket
from miniray._private.worker.worker_api import Channel


class _Owner:
    """The owner's end: reads and writes frames, blocking."""

    def __init__(self, sock):
        self.conn = FramedSocket(sock)
        self.pending: list = []

    def send(self, *messages) -> None:
        for message in messages:
            self.conn.send(pickle.dumps(message, 5))

    def read(self) -> tuple:
        while not self.pending:
            self.pending.extend(pickle.loads(frame) for frame in self.conn.recv())
        return self.pending.pop(0)


def _pair():
    a, b = socket.socketpair()
    channel, owner = Channel(FramedSocket(a)), _Owner(b)
    a.settimeout(10)  # after FramedSocket made them blocking: no test waits forever
    b.settimeout(10)
    return channel, owner


def _task(name: bytes) -> tuple:
    return (protocol.TASK, name, b"fn", "f", b"", None, [], 1, None)


def test_a_blocking_request_gives_back_the_tasks_not_started_and_those_arriving_meanwhile():
    channel, owner = _pair()
    owner.send((protocol.FUNC, b"fn", b"pickle"), _task(b"t1"), _task(b"t2"))
    assert channel.next_message()[0] == protocol.FUNC  # reads t1 and t2 into its inbox too
    replies = []
    thread = threading.Thread(target=lambda: replies.append(
        channel.request((protocol.GET, 7, [b"x"], None, b"t0"), 7, blocking=True)))
    thread.start()
    assert owner.read()[0] == protocol.GET  # the request first: the owner marks it blocked
    assert owner.read() == (protocol.GIVE_BACK, [b"t1", b"t2"])
    owner.send(_task(b"t3"))  # sent before the owner saw the GET
    assert owner.read() == (protocol.GIVE_BACK, [b"t3"])
    owner.send((protocol.REPLY, 7, "value"), _task(b"t4"))  # after the reply: kept
    thread.join(10)
    assert replies == ["value"]
    assert channel.next_message()[1] == b"t4"


def test_a_request_that_does_not_block_keeps_the_tasks():
    channel, owner = _pair()
    owner.send((protocol.FUNC, b"fn", b"pickle"), _task(b"t1"))
    assert channel.next_message()[0] == protocol.FUNC
    replies = []
    thread = threading.Thread(target=lambda: replies.append(
        channel.request((protocol.CALL, 3, protocol.CALL_NODES, ()), 3)))
    thread.start()
    assert owner.read()[0] == protocol.CALL
    owner.send(_task(b"t2"), (protocol.REPLY, 3, (True, [])))
    thread.join(10)
    assert replies == [(True, [])]
    assert [channel.next_message()[1] for _ in range(2)] == [b"t1", b"t2"]


def test_a_recall_gives_back_the_tasks_still_in_the_socket_and_in_the_inbox():
    """RECALL (another worker of the key is idle): while the main thread runs a task and
    nobody reads the socket, the tasks sent ahead are read and given back; others stay."""
    channel, owner = _pair()
    channel.conn.sock.settimeout(None)  # as in a worker: MSG_DONTWAIT reads return at once
    owner.send(_task(b"t1"))
    assert channel.next_message()[1] == b"t1"  # running now
    owner.send(_task(b"t2"), (protocol.UNMAP, "/seg"), _task(b"t3"))
    channel.give_back_waiting()
    assert owner.read() == (protocol.GIVE_BACK, [b"t2", b"t3"])
    assert channel.next_message() == (protocol.UNMAP, "/seg")
    channel.give_back_waiting()  # nothing left: answered all the same
    assert owner.read() == (protocol.GIVE_BACK, [])


class _RecallWhenLookedAt(collections.deque):
    """An inbox that, the first time the main loop asks whether it is empty, lets the
    control thread run a RECALL (``give_back_waiting``) for up to ``grace`` seconds: the
    interleaving in which a look and a take made apart would find the inbox emptied."""

    def __init__(self, items, channel, grace=0.5):
        super().__init__(items)
        self.channel, self.grace, self.armed, self.thread = channel, grace, True, None

    def __bool__(self):
        answer = len(self) > 0
        if self.armed:
            self.armed = False
            self.thread = threading.Thread(target=self.channel.give_back_waiting)
            self.thread.start()
            self.thread.join(self.grace)  # blocks for the grace only if the take is guarded
        return answer


def test_a_recall_between_the_main_loops_look_and_take_never_empties_its_take():
    """The main loop's look at its inbox and its take are one step under the channel's lock:
    a RECALL that runs in between either happens wholly before (the task goes back, the loop
    reads on) or after (the loop runs the task, the RECALL gives back the rest). Before, the
    RECALL could empty the inbox between the two, and the take raised IndexError, which ended
    the worker."""
    channel, owner = _pair()
    channel.conn.sock.settimeout(None)
    inbox = _RecallWhenLookedAt([_task(b"t1"), _task(b"t2")], channel)
    channel._incoming = inbox
    assert channel.next_message()[1] == b"t1"  # taken before the RECALL could act
    inbox.thread.join(10)
    assert not inbox.thread.is_alive()
    assert owner.read() == (protocol.GIVE_BACK, [b"t2"])


class _HoldFirstGiveBack:
    """Stands between the channel and its socket: the first GIVE_BACK it is about to write
    waits (at most ``grace`` seconds) until a RESULT has been written. That forces the
    interleaving in which the main loop runs a task that arrived after the tasks given back
    and writes its RESULT first, if nothing in the channel orders the two."""

    def __init__(self, channel, grace=0.5):
        self.at_give_back = threading.Event()
        self.result_written = threading.Event()
        self.armed = True
        self.grace = grace
        self.conn = channel.conn
        send = channel.send

        def channel_send(message):
            self._hold(message)
            send(message)
            if message[0] == protocol.RESULT:
                self.result_written.set()

        channel.send = channel_send
        channel.conn = self

    def _hold(self, message):
        if message[0] == protocol.GIVE_BACK and self.armed:
            self.armed = False
            self.at_give_back.set()
            self.result_written.wait(self.grace)

    def send(self, data):
        self._hold(pickle.loads(data))
        self.conn.send(data)

    def send_frames(self, frames):
        for data in frames:
            self._hold(pickle.loads(data))
        self.conn.send_frames(frames)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def _result(task_id: bytes) -> tuple:
    return (protocol.RESULT, task_id, [], False, (), None)


def _read_until_result(owner, task_id: bytes) -> list:
    seen = []
    while not seen or seen[-1][:2] != (protocol.RESULT, task_id):
        seen.append(owner.read())
    return seen


def test_a_recalls_give_back_is_written_before_the_result_of_a_task_that_arrived_after_it():
    """RECALL: the control thread takes t2 from the inbox; t3 arrives, the main loop runs
    it and writes its RESULT. The owner expects each RESULT of the task first in its
    in-flight list ([t2, t3] here): a RESULT t3 ahead of GIVE_BACK [t2] was dropped as
    unexpected and t3 stayed in flight for ever, the worker idle (the hang seen once in
    bench_pipeline). The split and the GIVE_BACK are one step under the send lock now."""
    channel, owner = _pair()
    channel.conn.sock.settimeout(None)
    hold = _HoldFirstGiveBack(channel)
    owner.send(_task(b"t1"), _task(b"t2"))
    assert channel.next_message()[1] == b"t1"  # running now; t2 waits
    control = threading.Thread(target=channel.give_back_waiting)
    control.start()
    assert hold.at_give_back.wait(10)  # t2 taken out of the inbox, not yet written
    owner.send(_task(b"t3"))

    def main_loop():
        message = channel.next_message()
        channel.send(_result(message[1]))

    main = threading.Thread(target=main_loop)
    main.start()
    main.join(10)
    control.join(10)
    assert not main.is_alive() and not control.is_alive()
    assert _read_until_result(owner, b"t3") == [(protocol.GIVE_BACK, [b"t2"]), _result(b"t3")]


def test_tasks_given_back_on_arrival_are_written_before_a_later_task_can_run():
    """The task t1 blocks in get(); another thread (the control thread, for a RECALL) reads
    t2 (sent before the owner saw the GET: given back), the reply, then t3 (sent after the
    reply: kept). The reply wakes t1, which ends; the main loop takes t3 and writes its
    RESULT. GIVE_BACK [t2] must come first, as above: it is written before t3 enters the
    inbox."""
    channel, owner = _pair()
    channel.conn.sock.settimeout(None)
    _hold = _HoldFirstGiveBack(channel)  # kept alive for the test
    owner.send(_task(b"t1"))
    assert channel.next_message()[1] == b"t1"
    channel._read_lock.acquire()  # another thread reads: the waiter only waits for its reply

    def task_then_main_loop():
        assert channel.request((protocol.GET, 7, [b"x"], None, b"t1"), 7,
                               blocking=True) == "value"
        channel.send(_result(b"t1"))
        message = channel.next_message()
        channel.send(_result(message[1]))

    main = threading.Thread(target=task_then_main_loop)
    main.start()
    try:
        assert owner.read()[0] == protocol.GET
        owner.send(_task(b"t2"), (protocol.REPLY, 7, "value"), _task(b"t3"))
        frames = []
        while len(frames) < 3:
            frames.extend(channel.conn.recv())
        channel._take_frames(frames)
    finally:
        channel._read_lock.release()
    main.join(10)
    assert not main.is_alive()
    seen = _read_until_result(owner, b"t3")
    assert (protocol.GIVE_BACK, [b"t2"]) in seen, seen
    assert seen.index((protocol.GIVE_BACK, [b"t2"])) < seen.index(_result(b"t3")), seen


def test_a_worker_whose_owner_left_before_ready_exits_quietly(monkeypatch, capsys):
    """READY is the prestarted worker's first word; an owner that shut down while the worker
    started has closed the socket. The worker then exits with 0 and prints no traceback."""
    from miniray._private.worker import worker_main

    a, b = socket.socketpair()
    b.close()
    exits = []

    class _Exit(BaseException):
        pass

    def fake_exit(code):
        exits.append(code)
        raise _Exit

    monkeypatch.setattr(worker_main.os, "_exit", fake_exit)
    channel = Channel(FramedSocket(a))
    try:
        worker_main.announce_ready(channel)
    except _Exit:
        pass
    finally:
        a.close()
    assert exits == [0]
    assert "Traceback" not in capsys.readouterr().err
