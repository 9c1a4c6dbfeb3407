"""A large value's bytes between a driver and a worker on another host (``Channel.send_bulk``
over ``framing.send_in_frames``, and ``Channel._with_bulk``): the frames cover the value's
segment layout in order, none larger than PEER_CHUNK, after the borrow report and RESULT, and
a TASK or a GET's REPLY followed by them is rebuilt (``values.read`` loads such a value)."""

from __future__ import annotations

import pickle

import numpy as np

from miniray._private.core import oob, protocol
from miniray._private.object_store import values
from miniray._private.transport import framing
from miniray._private.worker import worker_api


def _segment_bytes(ser: oob.Serialized) -> bytes:
    buffer = bytearray(ser.total_size)
    ser.write_into(memoryview(buffer))
    return bytes(buffer)


class _Sink:
    """What ``Channel`` sends, frame by frame."""

    def __init__(self):
        self.frames = []

    def send(self, frame):
        self.frames.append(bytes(frame))


def _bulk_frames(ser: oob.Serialized) -> list:
    """The frames ``send_bulk`` sends after its message for ``ser``."""
    sink = _Sink()
    worker_api.Channel(sink).send_bulk((protocol.RESULT,), [ser])
    assert pickle.loads(sink.frames[0]) == (protocol.RESULT,)
    return sink.frames[1:]


def test_bulk_frames_cover_the_segment_in_slices_no_larger_than_a_chunk(monkeypatch):
    monkeypatch.setattr(framing, "PEER_CHUNK", 1000)
    ser = oob.serialize({"a": np.arange(1500, dtype=np.uint8), "b": np.ones(3)})
    frames = _bulk_frames(ser)
    assert all(0 < len(f) <= 1000 for f in frames)
    joined = b"".join(frames)
    assert joined == _segment_bytes(ser)
    value = oob.load_segment(memoryview(joined))
    assert value["a"].tolist() == list(range(256)) * 5 + list(range(220))
    assert value["b"].tolist() == [1.0, 1.0, 1.0]


class _Conn:
    """The rest of the frames, as ``FramedPeer.channel.recv_bytes_into`` hands them."""

    def __init__(self, frames):
        self.channel = self
        self.frames = list(frames)

    def recv_bytes_into(self, buffer, timeout=None):
        frame = self.frames.pop(0)
        memoryview(buffer)[:len(frame)] = frame
        return len(frame)


def test_the_borrow_report_goes_before_a_bulk_result_as_before_any_message():
    sink = _Sink()
    channel = worker_api.Channel(sink)
    reports = [("borrowed", 1), None]
    channel.before_send = lambda: reports.pop(0)
    channel.send_bulk((protocol.RESULT, 1), [oob.serialize(b"v" * 10)])
    channel.send((protocol.RESULT, 2))
    messages = [pickle.loads(f) for f in sink.frames[:2]] + [pickle.loads(sink.frames[-1])]
    assert messages == [("borrowed", 1), (protocol.RESULT, 1), (protocol.RESULT, 2)]
    channel.before_send_pending = []  # nothing pending: not even asked
    channel.before_send = lambda: 1 / 0
    channel.send((protocol.RESULT, 3))
    channel.flush()
    assert pickle.loads(sink.frames[-1]) == (protocol.RESULT, 3)


def test_a_mapping_can_be_closed_once_its_frames_are_sent(monkeypatch, tmp_path):
    import mmap

    monkeypatch.setattr(framing, "PEER_CHUNK", 4096)
    path = tmp_path / "segment"
    path.write_bytes(bytes(range(256)) * 40)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    frames = []
    framing.send_in_frames(lambda frame: frames.append(bytes(frame)), mapping)
    mapping.close()  # no view of it is left
    assert [len(f) for f in frames] == [4096, 4096, 2048]
    assert b"".join(frames) == path.read_bytes()


def test_a_task_with_bulk_arguments_is_rebuilt_from_read_and_unread_frames(monkeypatch):
    monkeypatch.setattr(framing, "PEER_CHUNK", 4096)
    ser = oob.serialize(np.arange(5000, dtype=np.float64))
    frames = _bulk_frames(ser)
    task = (protocol.TASK, b"t", b"f", "name", b"", [(0, protocol.OK, ("peer", ser.total_size)),
                                                     ("k", protocol.OK, b"small")],
            [b"r"], 1, None)
    channel = worker_api.Channel(_Conn(frames[3:]))  # 3 frames read with TASK, rest not
    rebuilt = channel._with_bulk(pickle.loads(pickle.dumps(task)), iter(frames[:3]))
    (position, _kind, (tag, buffer)), small = rebuilt[5]
    assert (position, tag, small) == (0, "peer", ("k", protocol.OK, b"small"))
    assert oob.load_segment(memoryview(buffer)).sum() == sum(range(5000))
    assert rebuilt[:5] == task[:5] and rebuilt[6:] == task[6:]


def test_a_get_reply_with_large_values_is_rebuilt_and_read(monkeypatch):
    monkeypatch.setattr(framing, "PEER_CHUNK", 4096)
    first = oob.serialize(np.arange(3000, dtype=np.int64))
    second = oob.serialize({"x": np.ones(2000)})
    frames = [f for ser in (first, second) for f in _bulk_frames(ser)]
    reply = (protocol.REPLY, 7, [(protocol.OK, ("peer", first.total_size)),
                                 (protocol.OK, b"inline"),
                                 (protocol.OK, ("peer", second.total_size))])
    channel = worker_api.Channel(_Conn(frames[2:]))
    rebuilt = channel._with_bulk(pickle.loads(pickle.dumps(reply)), iter(frames[:2]))
    assert rebuilt[:2] == (protocol.REPLY, 7) and rebuilt[2][1] == (protocol.OK, b"inline")
    a, b = (values.read(item[1]) for item in (rebuilt[2][0], rebuilt[2][2]))
    assert a.tolist() == list(range(3000)) and not a.flags.writeable
    assert b["x"].sum() == 2000.0
    # Anything else (a CALL's reply, a WAIT's ids) goes through as it is.
    for other in ((protocol.REPLY, 8, (True, None)), (protocol.REPLY, 9, [b"id"])):
        assert channel._with_bulk(other, iter(())) is other


def test_a_large_value_reuses_the_last_receive_buffer_once_nothing_refers_to_it(monkeypatch):
    """``_receive_bulk``: a value of SPARE_MIN bytes or more goes into an anonymous mapping,
    kept as the spare; the next value of about its size is received into it again only
    when no value still views it (the task that read it kept nothing), and never one
    much smaller or larger."""
    monkeypatch.setattr(framing, "PEER_CHUNK", 1 << 16)
    monkeypatch.setattr(worker_api, "SPARE_MIN", 1 << 16)
    first = oob.serialize(np.arange(40_000, dtype=np.float64))
    second = oob.serialize(np.arange(40_000, dtype=np.float64)[::-1].copy())
    channel = worker_api.Channel(_Conn(_bulk_frames(first) + _bulk_frames(second)))
    view = channel._receive_bulk(first.total_size, iter(()))
    spare = channel._spare
    assert spare is not None and view.obj is spare and view.nbytes == first.total_size
    kept = oob.load_segment(view.toreadonly())  # a task that kept its argument
    del view
    again = channel._receive_bulk(second.total_size, iter(()))
    assert again.obj is not spare  # still in use: a new buffer, the old value intact
    assert kept[0] == 0.0 and kept[-1] == 39_999.0
    assert oob.load_segment(again.toreadonly())[0] == 39_999.0
    newer = id(channel._spare)  # an id: a reference here would keep it in use
    del again, kept
    channel.conn = _Conn(_bulk_frames(first) + _bulk_frames(oob.serialize(np.ones(99_000))))
    third = channel._receive_bulk(first.total_size, iter(()))
    assert id(third.obj) == newer  # nothing refers to it: received into it again
    assert oob.load_segment(third.toreadonly()).tolist() == list(range(40_000))
    del third
    bigger = channel._receive_bulk(oob.serialize(np.ones(99_000)).total_size, iter(()))
    assert channel._spare is bigger.obj and len(bigger.obj) == bigger.nbytes  # replaced


# ------------------------------------------------- the driver's side: a result's bytes
class _Owner:
    """What ``RemoteNodes.adopt_results`` uses of the owner: its store, ref events, lock."""

    def __init__(self, store):
        import contextlib
        import types

        self.store = store
        self.objects = types.SimpleNamespace(ref_events=[], apply_ref_events=lambda: None)
        self.locked = contextlib.nullcontext
        self.reactor = types.SimpleNamespace(wake=lambda: None)


class _Broken(_Conn):
    """Hands over ``good`` frames, then fails as a frame with a wrong MAC does."""

    def __init__(self, frames, good):
        super().__init__(frames)
        self.good = good

    def recv_bytes_into(self, buffer, timeout=None):
        if not self.good:
            raise OSError("the frame failed its check")
        self.good -= 1
        return super().recv_bytes_into(buffer, timeout)


def _adopt(store, conn, ser, return_id, recycle=True):
    import types

    from miniray._private.owner.remote_nodes import RemoteNodes

    spec = types.SimpleNamespace(return_ids=[return_id])
    nodes = types.SimpleNamespace(owner=_Owner(store))
    return RemoteNodes.adopt_results(nodes, conn, spec,
                                      [(protocol.OK, ("peer", ser.total_size, 0))], recycle)


def test_a_remote_result_goes_into_a_recycled_segment_or_a_new_one_and_fails_clean(
        monkeypatch, tmp_path):
    """``adopt_results``: with a freed segment in the pool the bytes go into it (renamed
    to the result's name, adopted with its warm mapping); without one, or without
    ``recycle`` (an actor's results, which the actor service renames into another store),
    into a new segment; a receive that fails leaves no segment, lent or new."""
    import os

    from miniray._private.object_store.shm_store import SharedMemoryStore, new_session_tag

    monkeypatch.setattr(framing, "PEER_CHUNK", 1 << 16)
    store = SharedMemoryStore(new_session_tag(), 64 << 20, str(tmp_path / "spill"))
    try:
        ser = oob.serialize(np.arange(100_000, dtype=np.float64))
        rid = [bytes([i]) * 28 for i in range(4)]
        store.put_value(rid[0], np.ones(100_000))
        store.free(rid[0])  # now in the pool
        ((_kind, (_shm, plain, _size)),) = _adopt(store, _Conn(_bulk_frames(ser)), ser,
                                                  bytes(28), recycle=False)
        assert store.statistics()["segments_recycled"] == 0 and store._lent == {}
        os.unlink(plain)
        ((_kind, (shm, path, size)),) = _adopt(store, _Conn(_bulk_frames(ser)), ser, rid[1])
        assert shm == "shm" and os.path.basename(path).endswith(rid[1].hex())
        assert store.statistics()["segments_recycled"] == 1
        store.put_segment_from(rid[1], path, size)
        assert store.get_value(rid[1]).tolist() == list(range(100_000))
        assert store._lent == {} and len(store._warm) == 1
        # No pool: a new segment. Failing half-way: nothing left, recycled or new.
        ((_kind, (_shm, fresh, _size)),) = _adopt(store, _Conn(_bulk_frames(ser)), ser,
                                                  rid[2])
        assert os.path.exists(fresh) and store.statistics()["segments_recycled"] == 1
        store.put_segment_from(rid[2], fresh, ser.total_size)
        store.free(rid[1])  # into the pool again
        before = set(os.listdir(store.shm_dir))
        for good in (1, 3):
            try:
                _adopt(store, _Broken(_bulk_frames(ser), good), ser, rid[3])
            except OSError:
                pass
            else:
                raise AssertionError("a failed receive was adopted")
        assert store._lent == {}
        left = set(os.listdir(store.shm_dir)) - before
        assert not [n for n in left if store.session_tag in n], left
    finally:
        store.close()


def test_raising_a_stored_error_leaves_no_reference_cycle_holding_the_callers_frame():
    """A failed get must not keep what its caller holds (the refs it was given, and so
    their objects, here and on the nodes that keep them) until a garbage collection."""
    import gc
    import weakref

    from miniray._private.core import serialization
    from miniray._private.object_store import values

    class Held:
        pass

    def get(held):  # a caller whose frame holds something
        values.materialize(protocol.ERR, serialization.dumps(ValueError("stored")))

    held = Held()
    gone = weakref.ref(held)
    gc.disable()
    try:
        try:
            get(held)
        except ValueError:
            pass
        del held
        assert gone() is None
    finally:
        gc.enable()
