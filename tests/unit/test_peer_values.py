"""A large value between hosts as 8 MiB frames checked on a thread pool (issue 16).

``PeerChannel.send_value`` / ``recv_value_into`` over a socketpair (``FrameWriter.value``,
``FrameReader.begin_value``, ``transport/mac_pool.py``): frames whose checks finish out of
order, a tampered frame in the middle or at the end (refused, nothing returned, no thread
left reading the buffer), short values, a value of exactly ``PIPELINE_MIN``, the peer
closing in the middle, frames already read when the value starts, a send broken off, and
the pool itself (its size 0, ``stop``, idle threads ending).
"""

from __future__ import annotations

import gc
import mmap
import os
import socket
import threading
import time

import pytest

from miniray._private.transport import framing, mac_pool, peer_wire
from miniray._private.transport import peer_channel as pc

KEY_AB, KEY_BA = b"a" * 32, b"b" * 32
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _own_pool(monkeypatch):
    """A pool of 3 threads for each test (whatever this machine's cores), stopped after."""
    pool = mac_pool.MacPool(3)
    monkeypatch.setattr(peer_wire, "MAC_POOL", pool)
    yield pool
    pool.stop()
    assert pool.statistics()["threads"] == 0


def _pair():
    a, b = socket.socketpair()
    return (pc.PeerChannel(a, (KEY_AB, KEY_BA), address="a"),
            pc.PeerChannel(b, (KEY_BA, KEY_AB), address="b"))


def _in_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _payload(size: int) -> bytes:
    return (bytes(range(251)) * (size // 251 + 1))[:size]


def _mapping(size: int) -> mmap.mmap:
    return mmap.mmap(-1, max(size, 1))


class _ReversingPool:
    """A pool that runs its jobs three at a time, the latest first: every check of a
    value finishes out of the order of its frames (the receiver's own thread runs the
    ones left at the end)."""

    size = 3

    def __init__(self):
        self.pending = []
        self.finished = []  # seq of each job this pool ran, in the order it ran them

    def submit(self, job):
        self.pending.append(job)
        if len(self.pending) == 3:
            batch, self.pending = self.pending[::-1], []
            for job in batch:
                job.run()
                self.finished.append(job.seq)


@pytest.mark.parametrize("size", [3, 100_000, peer_wire.PIPELINE_MIN,
                                  5 * peer_wire.PIPELINE_MIN + 12345])
def test_a_value_arrives_whole_and_the_channel_goes_on(size):
    """A short value (checked as it arrives), exactly PIPELINE_MIN (one frame, on the
    pool) and several frames with a short last one: the bytes, then the next message."""
    sender, receiver = _pair()
    data = _payload(size)
    with sender, receiver:
        thread, errors = _in_thread(lambda: (sender.send_value(data),
                                             sender.send(("after", size))))
        target = _mapping(size)
        receiver.recv_value_into(memoryview(target)[:size], timeout=10)
        thread.join(10)
        assert not errors
        assert target[:size] == data
        assert receiver.recv(timeout=5) == ("after", size)
        assert sender.statistics()["frames_sent"] == -(-size // peer_wire.VALUE_FRAME) + 1
        target.close()  # no view of it is left anywhere (no BufferError)


def test_checks_that_finish_out_of_order(monkeypatch):
    pool = _ReversingPool()
    monkeypatch.setattr(peer_wire, "MAC_POOL", pool)
    size = 10 * MIB + 7
    data = _payload(size)
    sender, receiver = _pair()
    with sender, receiver:
        thread, errors = _in_thread(lambda: sender.send_value(data, frame=MIB))
        target = bytearray(size)
        receiver.recv_value_into(target, timeout=10)
        thread.join(10)
        assert not errors and target == data
    assert pool.finished and pool.finished != sorted(pool.finished)


def _send_raw(sock, data: bytes, frame: int, tamper=None) -> None:
    """The frames ``send_value`` sends, written on ``sock`` by hand; ``tamper(i, header,
    payload, tag)`` may change frame ``i``'s parts."""
    writer = peer_wire.FrameWriter(KEY_AB)
    parts = [[header, bytes(payload), peer_wire.tag_of(job)]  # every tag first: no job of
             for header, payload, job in writer.value(memoryview(data), frame)]  # the sender
    for i, item in enumerate(parts):  # is left on the pool when the receiver gives up
        if tamper is not None:
            item = tamper(i, *item)
        sock.sendall(b"".join(item))


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


@pytest.mark.parametrize("where", ["middle payload", "middle tag", "last payload",
                                   "last tag", "first payload"])
def test_a_tampered_frame_fails_the_value(where, caplog):
    """A wrong tag anywhere: PeerAuthError naming the frame, the channel closed, nothing
    returned; every check ended, so the buffer can be closed at once."""
    frame = MIB
    size = 9 * MIB + 100
    data = _payload(size)
    bad = {"middle": 4, "last": 9, "first": 0}[where.split()[0]]

    def tamper(i, header, payload, tag):
        if i == bad:
            if where.endswith("payload"):
                payload = _flip(payload, len(payload) // 2)
            else:
                tag = _flip(tag, 0)
        return [header, payload, tag]

    a, b = socket.socketpair()
    receiver = pc.PeerChannel(b, (KEY_BA, KEY_AB), address="peer")
    thread, _ = _in_thread(lambda: _send_raw(a, data, frame, tamper))
    target = _mapping(size)
    failed = None
    try:
        receiver.recv_value_into(target, timeout=10)
    except pc.PeerAuthError as error:
        failed = str(error)
    assert failed is not None and f"frame {bad} failed its integrity check" in failed
    assert receiver.closed
    assert peer_wire.MAC_POOL.statistics()["running"] == 0  # no check reads it any more
    gc.collect()  # the exceptions' tracebacks (a cycle) held views of the buffer
    target.close()
    a.close()
    thread.join(10)


def test_the_peer_closing_in_the_middle():
    size = 12 * MIB
    data = _payload(size)
    a, b = socket.socketpair()
    receiver = pc.PeerChannel(b, (KEY_BA, KEY_AB), address="peer")

    def half_then_close():
        frames = peer_wire.FrameWriter(KEY_AB).value(memoryview(data), MIB)
        for i, (header, payload, job) in enumerate(frames):
            if i == 5:  # its header and half its payload, then gone
                a.sendall(header + bytes(payload[:1000]))
                break
            a.sendall(header + bytes(payload) + peer_wire.tag_of(job))
        frames.abort()
        a.close()

    thread, _ = _in_thread(half_then_close)
    target = _mapping(size)
    closed = False
    try:
        receiver.recv_value_into(target, timeout=10)
    except pc.PeerClosed:
        closed = True
    thread.join(10)
    assert closed and receiver.closed
    assert peer_wire.MAC_POOL.statistics()["running"] == 0
    gc.collect()
    target.close()


def test_a_late_frame_times_out_and_closes_the_channel():
    a, b = socket.socketpair()
    receiver = pc.PeerChannel(b, (KEY_BA, KEY_AB), address="peer")
    writer = peer_wire.FrameWriter(KEY_AB)
    data = _payload(3 * MIB)
    (header, payload, job), *_ = list(writer.value(memoryview(data), MIB))
    frame = header + bytes(payload) + peer_wire.tag_of(job)
    thread, _ = _in_thread(lambda: a.sendall(frame))  # one frame of three
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no frame of a value"):
        receiver.recv_value_into(bytearray(len(data)), timeout=0.3)
    assert time.monotonic() - started < 5 and receiver.closed
    a.close()
    thread.join(10)


def test_frames_read_before_the_value_starts_are_part_of_it():
    """The message and the start of the value arrive in one read: a frame received whole
    and one begun in a buffer of its own both become the value's."""
    sender, receiver = _pair()
    small, large = _payload(1000), _payload(3 * MIB)
    with sender, receiver:
        sender.send(("value", 1000 + len(large)))
        sender.send_bytes(small)
        thread, errors = _in_thread(lambda: sender.send_value(large, frame=2 * MIB))
        time.sleep(0.2)  # the socket buffer holds the first frames now
        assert receiver.recv(timeout=5) == ("value", 1000 + len(large))
        target = bytearray(1000 + len(large))
        receiver.recv_value_into(target, timeout=10)
        thread.join(10)
        assert not errors and bytes(target) == small + large


def test_a_frame_past_the_value_is_refused():
    sender, receiver = _pair()
    with sender, receiver:
        thread, _ = _in_thread(lambda: sender.send_value(_payload(2 * MIB), frame=2 * MIB))
        with pytest.raises(pc.PeerAuthError, match="at most"):
            receiver.recv_value_into(bytearray(MIB), timeout=10)
        assert receiver.closed
        thread.join(10)


def test_a_value_read_frame_by_frame_and_send_in_frames_uses_send_value(monkeypatch):
    """Each frame of a value is an ordinary frame: a receiver may take them one by one.
    ``send_in_frames`` given a channel's send method sends one value of PEER_CHUNK
    frames."""
    monkeypatch.setattr(framing, "PEER_CHUNK", MIB)
    sender, receiver = _pair()
    data = _payload(5 * MIB + 3)
    with sender, receiver:
        thread, errors = _in_thread(lambda: framing.send_in_frames(sender.send_bytes, data))
        sizes = [len(receiver.recv_bytes(timeout=10)) for _ in range(6)]
        thread.join(10)
        assert not errors and sizes == [MIB] * 5 + [3]


def test_receive_segment_fills_a_new_file(tmp_path):
    sender, receiver = _pair()
    data = _payload(9 * MIB)
    path = str(tmp_path / "segment")
    with sender, receiver:
        thread, errors = _in_thread(lambda: framing.send_in_frames(sender.send_bytes, data))
        framing.receive_segment(receiver, path, len(data), 10, "a value")
        thread.join(10)
        assert not errors
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_send_broken_off_leaves_no_job_on_the_payload(_own_pool):
    """The receiver goes away mid-value: PeerClosed, and the payload (a mapping) can be
    closed at once: no pool thread still hashes it."""
    size = 64 * MIB
    source = _mapping(size)
    source.write(_payload(size))
    sender, receiver = _pair()
    receiver.close()
    with pytest.raises(pc.PeerClosed):
        sender.send_value(source, frame=MIB)
    assert sender.closed
    assert peer_wire.MAC_POOL.statistics()["running"] == 0
    gc.collect()
    source.close()


def test_the_pool_of_zero_and_stop(monkeypatch):
    """Size 0: no thread, every job run by its waiter. ``stop`` ends the threads; jobs
    still queued are run by whoever waits for them; the next job starts a thread again;
    an idle thread ends by itself."""
    hmac_new = peer_wire.hmac.new
    none = mac_pool.MacPool(0)
    job = mac_pool.MacJob(hmac_new(b"k", digestmod="sha256"), b"abc")
    none.submit(job)
    assert none.statistics()["threads"] == 0 and not job.done
    assert job.result() == hmac_new(b"k", b"abc", digestmod="sha256").digest()

    pool = mac_pool.MacPool(2)
    jobs = [mac_pool.MacJob(hmac_new(b"k", digestmod="sha256"), b"x" * MIB)
            for _ in range(6)]
    for job in jobs:
        pool.submit(job)
    pool.stop()
    assert pool.statistics()["threads"] == 0
    assert {job.result() for job in jobs} == {hmac_new(b"k", b"x" * MIB,
                                                       digestmod="sha256").digest()}
    monkeypatch.setattr(mac_pool.MacPool, "IDLE_EXIT_S", 0.1)
    again = mac_pool.MacJob(None, b"")
    pool.submit(again)
    assert again.result() is None
    deadline = time.monotonic() + 5
    while pool.statistics()["threads"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.statistics()["threads"] == 0
    assert not [t for t in threading.enumerate() if t.name == "miniray-peer-mac"
                and t.is_alive() and t in pool._threads]


def test_a_stop_between_a_threads_making_and_its_start_joins_nothing_unstarted(monkeypatch):
    """``submit`` makes a thread under the pool's lock and starts it after: a ``stop`` in
    between must not join it (RuntimeError), and the thread, once started, ends by itself
    (its generation is old)."""
    pool = mac_pool.MacPool(1)
    made: list = []
    real_start = threading.Thread.start

    def held_start(thread):  # the submitting thread is preempted before start()
        if thread.name == "miniray-peer-mac":
            made.append(thread)
            pool.stop()
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", held_start)
    job = mac_pool.MacJob(peer_wire.hmac.new(b"k", digestmod="sha256"), b"abc")
    pool.submit(job)
    assert job.result() == peer_wire.hmac.new(b"k", b"abc", digestmod="sha256").digest()
    made[0].join(5)
    assert not made[0].is_alive() and pool.statistics()["threads"] == 0


def test_a_cancelled_job_never_runs():
    job = mac_pool.MacJob(peer_wire.hmac.new(b"k", digestmod="sha256"), b"abc")
    job.cancel()
    assert job.done
    job.run()  # too late: nothing happens
    assert job._digest is None


def test_the_pool_size_setting(monkeypatch):
    from miniray._private.core import config

    monkeypatch.setenv("MINIRAY_PEER_MAC_THREADS", "0")
    assert config.peer_mac_threads() == 0
    monkeypatch.setenv("MINIRAY_PEER_MAC_THREADS", "7")
    assert config.peer_mac_threads() == 7
    monkeypatch.setenv("MINIRAY_PEER_MAC_THREADS", "many")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert config.peer_mac_threads() == 4
    monkeypatch.delenv("MINIRAY_PEER_MAC_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert config.peer_mac_threads() == 0


def test_a_remote_workers_bulk_value_crosses_as_one_value():
    """``worker_api.Channel``: ``send_bulk`` on a ``FramedPeer`` sends each piece of the
    value with ``send_value``; ``_receive_bulk`` takes the frames read with the message,
    then the rest with ``recv_value_into``."""
    import pickle

    import numpy as np

    from miniray._private.core import oob, protocol
    from miniray._private.worker import worker_api

    sender, receiver = _pair()
    ser = oob.serialize({"a": np.arange(2_500_000, dtype=np.float64), "b": b"x" * 100})
    writer = worker_api.Channel(pc.FramedPeer(sender))
    reader = worker_api.Channel(pc.FramedPeer(receiver))
    reader.remote = True
    with sender, receiver:
        thread, errors = _in_thread(lambda: writer.send_bulk((protocol.RESULT, 1), [ser]))
        frames = reader.conn.recv()
        assert pickle.loads(frames[0]) == (protocol.RESULT, 1)
        view = reader._receive_bulk(ser.total_size, iter(frames[1:]))
        thread.join(10)
        assert not errors
        value = oob.load_segment(view.toreadonly())
        assert value["a"][-1] == 2_499_999.0 and value["b"] == b"x" * 100


def test_a_frame_longer_than_its_buffer_closes_the_channel_as_a_connection_error():
    """A peer that sends a wrong length: ``recv_bytes_into`` and ``recv_value_into`` (a
    frame read before the value began) close the channel and raise PeerAuthError, an
    OSError as every other broken stream (a ValueError escaped every caller's handler)."""
    sender, receiver = _pair()
    with sender, receiver:
        sender.send_bytes(b"x" * 100)
        sender.send_bytes(b"y" * 100)
        receiver.recv_bytes_into(bytearray(100), timeout=5)
        assert receiver._ready  # the second frame, read already
        with pytest.raises(pc.PeerAuthError, match="does not fit the buffer") as raised:
            receiver.recv_bytes_into(bytearray(10), timeout=5)
        assert isinstance(raised.value, OSError) and receiver.closed
    sender, receiver = _pair()
    with sender, receiver:  # a frame not read yet: the reader's own check, the same error
        sender.send_bytes(b"y" * 100)
        with pytest.raises(pc.PeerAuthError, match="at most 10"):
            receiver.recv_bytes_into(bytearray(10), timeout=5)
        assert receiver.closed
    sender, receiver = _pair()
    with sender, receiver:
        sender.send_bytes(b"z" * 100)
        sender.send(("after",))
        receiver.recv_bytes_into(bytearray(100), timeout=5)  # reads the next frame too
        assert receiver._ready  # ("after",) waits, read already
        with pytest.raises(OSError, match="does not fit the 5 bytes left of a value"):
            receiver.recv_value_into(bytearray(5), timeout=5)
        assert receiver.closed


def test_a_remote_workers_reader_closes_its_link_on_a_wrong_length(monkeypatch, capsys):
    """``worker_api.Channel._receive_bulk``: a frame longer than the value it belongs to,
    read with its message or from the connection, ends the worker as EOF does (its link
    closes), saying why on stderr; no exception escapes the reading thread."""
    from miniray._private.worker import worker_api

    class _Exited(BaseException):
        pass

    def exit_now():
        raise _Exited

    monkeypatch.setattr(worker_api, "_exit_now", exit_now)
    sender, receiver = _pair()
    reader = worker_api.Channel(pc.FramedPeer(receiver))
    reader.remote = True
    with sender, receiver:
        with pytest.raises(_Exited):
            reader._receive_bulk(10, iter([b"x" * 4, b"x" * 100]))
        assert "a frame of 100 bytes does not fit the 6 bytes left" in capsys.readouterr().err
        sender.send_bytes(b"w" * 100)  # from the connection: recv_value_into's check
        with pytest.raises(_Exited):
            reader._receive_bulk(10, iter(()))
        err = capsys.readouterr().err
        assert "closing the connection to its driver" in err and "a frame of 100" in err
