"""The shared-memory object store, without a miniray runtime: segments, zero-copy reads,
spilling, fallback, sweeping, recycling, other processes, and no leaks.

Every test gets its own session tag; the ``tag`` fixture fails a test that leaves any
``/dev/shm/mr_<tag>_*`` behind (house style, habit 12).
"""

from __future__ import annotations

import gc
import logging
import mmap
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from miniray._private.core import oob
from miniray._private.host import procinfo
from miniray._private.object_store import shm_segments, store_policy
from miniray._private.object_store.shm_segments import session_tag_owner
from miniray._private.object_store.shm_store import (
    SharedMemoryStore,
    create_segment,
    new_session_tag,
    read_segment,
    read_spilled,
    segment_name,
    session_tag_pid,
    sweep_segments,
)
from miniray.exceptions import ObjectStoreFullError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHM = "/dev/shm"
MIB = 1 << 20


def leftovers(tag: str, directory: str = SHM) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(f"mr_{tag}_"))
    except FileNotFoundError:
        return []


@pytest.fixture
def tag():
    tag = new_session_tag()
    yield tag
    gc.collect()
    left = leftovers(tag)
    for name in left:  # clean up, then fail
        os.unlink(os.path.join(SHM, name))
    assert not left, f"segments left in {SHM}: {left}"


@pytest.fixture
def make_store(tag, tmp_path):
    stores = []

    def make(capacity=256 * MIB, **kwargs):
        store = SharedMemoryStore(tag, capacity, str(tmp_path / "spill"), **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()
    assert not leftovers(tag, str(tmp_path / "spill"))


def oid(n: int, index: int = 0) -> bytes:
    """A 28-byte object id, laid out as miniray's: 24-byte task id, 4-byte return index."""
    return n.to_bytes(24, "big") + index.to_bytes(4, "big")


def array(nbytes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(nbytes // 8)


def pointer(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# --- serialization and layout ------------------------------------------------------------------


def test_serialize_keeps_numpy_buffers_out_of_band():
    a = array(MIB)
    ser = oob.serialize({"a": a, "b": [a[:10].copy(), "x"]})
    assert len(ser.buffers) == 2
    assert len(ser.metadata) < 1000  # the megabyte is not in the pickle stream
    assert all(off % oob.ALIGN == 0 for off in ser.offsets)
    assert ser.total_size >= MIB + 80
    value = oob.loads_inline(ser.inband())
    np.testing.assert_array_equal(value["a"], a)


def test_serialize_of_plain_data_is_an_ordinary_pickle():
    ser = oob.serialize({"x": 1})
    assert ser.buffers == [] and ser.inband() is ser.metadata
    assert pickle.loads(ser.metadata) == {"x": 1}


def test_load_segment_rejects_foreign_bytes():
    with pytest.raises(ValueError, match="not a miniray object segment"):
        oob.load_segment(memoryview(b"\0" * 64), "somefile")


def test_write_fd_and_write_into_give_the_same_bytes(tmp_path):
    ser = oob.serialize([array(3000, 1), np.arange(7, dtype=np.int16), b"raw"])
    path = tmp_path / "seg"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    ser.write_fd(fd)
    os.close(fd)
    view = bytearray(ser.total_size)
    ser.write_into(memoryview(view))
    on_disk = path.read_bytes()
    assert len(on_disk) == ser.total_size
    # Padding differs (write_into leaves it alone); every declared range is identical.
    for off, buf in zip(ser.offsets, ser.buffers):
        assert on_disk[off : off + buf.nbytes] == view[off : off + buf.nbytes] == buf.tobytes()
    loaded = oob.load_segment(memoryview(on_disk))
    np.testing.assert_array_equal(loaded[0], array(3000, 1))


# --- round trips ----------------------------------------------------------------------------------

VALUES = [
    0,
    -(10**30),
    "text",
    None,
    {"k": [1, 2.5, (3, "x")]},
    b"x" * (300 * 1024),  # bytes pickle in-band: a large metadata, no buffers
    np.arange(10),
    np.zeros((0, 4)),
    array(2 * MIB),
    np.asfortranarray(array(MIB).reshape(256, 512)),
    array(2 * MIB)[::2],  # not contiguous: numpy pickles it in-band
    np.arange(300_000, dtype=np.int32).reshape(3, -1),
    {"a": array(MIB, 1), "b": [array(512 * 1024, 2), "s"], "c": (np.ones(3), 7)},
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip(make_store, value):
    store = make_store()
    stored = store.put_value(oid(1), value)
    big = oob.serialize(value).total_size >= store.inline_threshold
    assert stored.kind == ("shm" if big else "inline")
    got = store.get_value(oid(1))
    if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(got, value)
        assert got.dtype == value.dtype and got.shape == value.shape
    elif isinstance(value, dict) and "a" in value:
        np.testing.assert_array_equal(got["a"], value["a"])
        np.testing.assert_array_equal(got["b"][0], value["b"][0])
        assert got["b"][1] == "s" and got["c"][1] == 7
    else:
        assert got == value
    store.free(oid(1))
    assert not store.contains(oid(1))


def test_inline_objects_keep_the_old_interface(make_store):
    """``inline_bytes`` is for inline objects only; the store has no ``get_serialized``, a
    name that means "any object's payload" everywhere else (object table, owner, runtime)."""
    store = make_store()
    assert not hasattr(store, "get_serialized")
    store.put_serialized(oid(1), pickle.dumps("error or small result"))
    assert store.location(oid(1)) == ("inline", store.inline_bytes(oid(1)))
    assert store.get_value(oid(1)) == "error or small result"
    store.put_value(oid(2), array(MIB))
    with pytest.raises(TypeError, match="shared memory"):
        store.inline_bytes(oid(2))
    with pytest.raises(KeyError):
        store.inline_bytes(oid(3))
    with pytest.raises(KeyError):
        store.get_value(oid(3))
    store.free(oid(3))  # idempotent, even for ids never seen
    store.free(oid(2))
    store.free(oid(2))


def test_inline_threshold_is_configurable(make_store):
    store = make_store(inline_threshold=1024)
    assert store.put_value(oid(1), np.arange(200)).kind == "shm"
    assert store.put_value(oid(2), np.arange(20)).kind == "inline"


def test_segment_names_use_the_whole_object_id(make_store, tag):
    # Two returns of one task differ only in the last 4 bytes of their ids.
    store = make_store()
    store.put_value(oid(5, 0), array(MIB, 1))
    store.put_value(oid(5, 1), array(MIB, 2))
    assert store.location(oid(5, 0))[1] != store.location(oid(5, 1))[1]
    np.testing.assert_array_equal(store.get_value(oid(5, 1)), array(MIB, 2))
    assert os.path.basename(store.location(oid(5, 0))[1]) == segment_name(tag, oid(5, 0))


# --- zero copy, read-only, lifetimes ------------------------------------------------------------


def test_get_is_zero_copy_and_read_only(make_store):
    store = make_store()
    store.put_value(oid(1), {"x": array(4 * MIB), "y": array(MIB, 1)})
    first, second = store.get_value(oid(1)), store.get_value(oid(1))
    assert first["x"].flags.writeable is False
    assert pointer(first["x"]) == pointer(second["x"])  # one mapping, the same buffer
    assert pointer(first["x"]) % 64 == 0
    with pytest.raises(ValueError, match="read-only"):
        first["x"][0] = 1.0


def test_readers_see_the_segment_itself(make_store):
    store = make_store()
    store.put_value(oid(1), np.zeros(MIB // 8))
    path = store.location(oid(1))[1]
    view_a, view_b = read_segment(path), read_segment(os.path.basename(path))
    assert view_a.flags.writeable is False
    # Write through a writable mapping of the file: both read views see it, so neither
    # holds a copy.
    fd = os.open(path, os.O_RDWR)
    writable = mmap.mmap(fd, 0)
    os.close(fd)
    ser = oob.serialize(np.zeros(MIB // 8))
    start = ser.offsets[0]
    writable[start : start + 8] = np.float64(42.0).tobytes()
    assert view_a[0] == view_b[0] == 42.0
    del writable


def test_a_mapped_segment_stays_readable_after_unlink(make_store):
    store = make_store()
    data = array(2 * MIB)
    store.put_value(oid(1), data)
    path = store.location(oid(1))[1]
    view = read_segment(path)
    held = store.get_value(oid(1))
    store.free(oid(1))
    assert not os.path.exists(path)
    gc.collect()
    np.testing.assert_array_equal(view, data)
    np.testing.assert_array_equal(held, data)
    # A segment someone maps is never reused while they do (it waits in the pool as
    # draining), so a new put cannot overwrite these views.
    assert store.statistics()["draining_segments"] == 1
    store.put_value(oid(2), array(2 * MIB, 9))
    assert store.statistics()["segments_recycled"] == 0
    np.testing.assert_array_equal(held, data)
    np.testing.assert_array_equal(view, data)


def test_freed_segments_nobody_maps_are_recycled(make_store):
    store = make_store()
    store.put_value(oid(1), array(2 * MIB))
    value = store.get_value(oid(1))
    del value  # the owner's own view is gone, so it may be reused
    store.free(oid(1))
    stats = store.statistics()
    assert stats["pooled_segments"] == 1 and stats["bytes_in_memory"] == 0
    store.put_value(oid(2), array(2 * MIB, 3))
    stats = store.statistics()
    assert stats["segments_recycled"] == 1 and stats["pooled_segments"] == 0
    np.testing.assert_array_equal(store.get_value(oid(2)), array(2 * MIB, 3))
    assert store.trim_pool() == 0
    store.free(oid(2))
    assert store.trim_pool() > 0
    assert store.statistics()["pooled_segments"] == 0


def test_bytes_from_elsewhere_go_into_a_recycled_segment_which_stays_warm(make_store):
    """``recycled_for``: a freed segment renamed to the new object, its writable mapping
    lent; ``put_segment_from`` adopts it and keeps the mapping for its next reuse;
    ``give_up_recycled`` unlinks one that will not be adopted."""
    store = make_store()
    assert store.recycled_for(oid(9), 2 * MIB) is None  # an empty pool: a new segment
    store.put_value(oid(1), array(2 * MIB))
    store.free(oid(1))
    source = oob.serialize(array(2 * MIB, 5))
    path, mapping = store.recycled_for(oid(2), source.total_size)
    assert path == os.path.join(store.shm_dir, shm_segments.segment_name(store.session_tag,
                                                                          oid(2)))
    assert store.statistics()["pooled_segments"] == 0
    with memoryview(mapping) as view:
        source.write_into(view[:source.total_size])
    store.put_segment_from(oid(2), path, source.total_size)
    np.testing.assert_array_equal(store.get_value(oid(2)), array(2 * MIB, 5))
    assert store._lent == {}
    assert any(entry.rw is mapping for entry in store._warm)  # kept for the next reuse
    store.free(oid(2))
    path, _mapping = store.recycled_for(oid(3), 2 * MIB)
    store.give_up_recycled(path)
    assert not os.path.exists(path) and store._lent == {}
    assert store.statistics()["pooled_segments"] == 0


def test_a_freed_segment_a_reader_still_maps_is_reused_once_it_lets_go(make_store):
    """A worker keeps its mapping of a task's argument until the owner's UNMAP arrives: the
    segment waits in the pool (draining) and is reused once nobody maps it, never while a
    reader's view could still see the new bytes."""
    store = make_store()
    store.put_value(oid(1), array(2 * MIB))
    path = store.location(oid(1))[1]
    reader = read_segment(path)  # another process's view: holds the shared flock
    store.free(oid(1))
    stats = store.statistics()
    assert stats["pooled_segments"] == 1 and stats["bytes_in_memory"] == 0
    store.put_value(oid(2), array(2 * MIB, 3))  # the reader still maps it: a new segment
    assert store.statistics()["segments_recycled"] == 0
    np.testing.assert_array_equal(reader, array(2 * MIB))
    del reader
    gc.collect()
    store.put_value(oid(3), array(2 * MIB, 4))  # let go: reused
    stats = store.statistics()
    assert stats["segments_recycled"] == 1 and stats["pooled_segments"] == 0
    np.testing.assert_array_equal(store.get_value(oid(3)), array(2 * MIB, 4))
    np.testing.assert_array_equal(store.get_value(oid(2)), array(2 * MIB, 3))
    store.free(oid(2))
    store.free(oid(3))


def test_a_put_waits_a_little_for_a_segment_about_to_be_let_go(make_store, monkeypatch):
    """A put right after a task's result often beats the worker's unmapping of the task's
    argument: it waits (at most ``drain_wait_s``) for that segment rather than write into
    fresh pages."""
    monkeypatch.setattr(store_policy, "drain_wait_s", lambda size: 5.0)
    store = make_store()
    store.put_value(oid(1), array(2 * MIB))
    readers = [read_segment(store.location(oid(1))[1])]
    store.free(oid(1))
    threading.Timer(0.05, readers.clear).start()  # the reader lets go 50 ms later
    started = time.monotonic()
    store.put_value(oid(2), array(2 * MIB, 3))
    assert time.monotonic() - started < 4.0
    assert store.statistics()["segments_recycled"] == 1
    np.testing.assert_array_equal(store.get_value(oid(2)), array(2 * MIB, 3))
    store.free(oid(2))


def test_a_put_waits_no_longer_than_drain_wait_s(make_store, monkeypatch):
    monkeypatch.setattr(store_policy, "drain_wait_s", lambda size: 0.05)
    store = make_store()
    store.put_value(oid(1), array(2 * MIB))
    reader = read_segment(store.location(oid(1))[1])
    store.free(oid(1))
    started = time.monotonic()
    store.put_value(oid(2), array(2 * MIB, 3))
    assert 0.04 <= time.monotonic() - started < 2.0
    assert store.statistics()["segments_recycled"] == 0  # a new segment: the reader holds on
    # A segment waited for in vain once is not waited for again (its reader kept its view).
    monkeypatch.setattr(store_policy, "drain_wait_s", lambda size: 5.0)
    started = time.monotonic()
    store.put_value(oid(3), array(2 * MIB, 4))
    assert time.monotonic() - started < 2.0
    assert store.statistics()["segments_recycled"] == 0
    np.testing.assert_array_equal(reader, array(2 * MIB))
    store.free(oid(2))
    store.free(oid(3))


def test_drain_wait_is_a_fraction_of_a_fresh_write_and_bounded():
    assert store_policy.drain_wait_s(0) == 0
    assert 0 < store_policy.drain_wait_s(2 * MIB) < 0.001
    assert store_policy.drain_wait_s(1024 * MIB) == store_policy.DRAIN_WAIT_MAX_S


def test_a_draining_segment_nobody_lets_go_of_is_unlinked_when_idle(make_store, tag):
    store = make_store()
    store.put_value(oid(1), array(2 * MIB))
    reader = read_segment(store.location(oid(1))[1])
    store.free(oid(1))
    assert store.trim_pool() > 0
    assert leftovers(tag) == []
    np.testing.assert_array_equal(reader, array(2 * MIB))  # its pages outlive the unlink


def test_recycling_can_be_turned_off(make_store, tag):
    store = make_store(recycle_bytes=0)
    store.put_value(oid(1), array(MIB))
    store.free(oid(1))
    assert leftovers(tag) == []


def test_pinned_objects_are_freed_at_the_last_unpin(make_store):
    store = make_store()
    store.put_value(oid(1), array(MIB))
    path = store.location(oid(1))[1]
    store.pin(oid(1))
    store.pin(oid(1))
    store.free(oid(1))
    assert os.path.exists(path) and store.contains(oid(1))
    store.unpin(oid(1))
    assert os.path.exists(path)
    store.unpin(oid(1))
    assert not os.path.exists(path) and not store.contains(oid(1))
    store.unpin(oid(1))  # gone: a no-op


# --- capacity, spilling, restoring ---------------------------------------------------------------


def test_lru_spill_and_restore(make_store, tmp_path):
    store = make_store(capacity=3 * MIB + 4096, recycle_bytes=0)
    values = {i: array(MIB, i) for i in range(4)}
    for i in range(3):
        store.put_value(oid(i), values[i])
    store.get_value(oid(0))  # 0 is now more recently used than 1 and 2
    store.put_value(oid(3), values[3])
    kinds = {i: store.location(oid(i))[0] for i in range(4)}
    assert kinds == {0: "shm", 1: "spilled", 2: "shm", 3: "shm"}
    spill_path = store.location(oid(1))[1]
    assert spill_path.startswith(str(tmp_path / "spill"))
    np.testing.assert_array_equal(read_spilled(spill_path), values[1])
    stats = store.statistics()
    assert stats["bytes_spilled"] > MIB and stats["spills"] == 1 and stats["segments"] == 3
    # Reading it restores it into shared memory, spilling the least recently used: the
    # location() calls above count as uses, in the order 0, 2, 3, so 0 goes.
    np.testing.assert_array_equal(store.get_value(oid(1)), values[1])
    assert store.location(oid(1))[0] == "shm"
    assert store.location(oid(0))[0] == "spilled"
    assert not os.path.exists(spill_path)
    assert store.statistics()["restores"] == 1
    for i in range(4):
        np.testing.assert_array_equal(store.get_value(oid(i)), values[i])
        store.free(oid(i))
    assert store.statistics()["bytes_spilled"] == 0
    assert os.listdir(tmp_path / "spill") == []


def test_objects_the_owner_still_views_are_not_spilled(make_store):
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(0), array(MIB, 0))
    store.put_value(oid(1), array(MIB, 1))
    held = store.get_value(oid(0))  # this process keeps viewing 0
    store.get_value(oid(1))  # 1 is now the most recently used, yet 0 is viewed: 1 goes
    store.put_value(oid(2), array(MIB, 2))
    assert store.location(oid(0))[0] == "shm" and store.location(oid(1))[0] == "spilled"
    np.testing.assert_array_equal(held, array(MIB, 0))


def test_make_room_spills_what_a_put_would_and_raises_when_it_cannot(make_store):
    """A value about to be received (a pull): room made as for a put, nothing reserved."""
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(0), array(MIB, 0))
    store.put_value(oid(1), array(MIB, 1))
    store.pin(oid(0))
    store.pin(oid(1))
    with pytest.raises(ObjectStoreFullError) as info:
        store.make_room(oid(2), MIB)
    assert "capacity" in str(info.value) and "object_store_memory" in str(info.value)
    assert store.location(oid(0))[0] == store.location(oid(1))[0] == "shm"
    store.make_room(oid(2), 4 * MIB)  # larger than the store: adopted onto disk, no room
    store.unpin(oid(1))
    store.make_room(oid(2), MIB)
    assert store.location(oid(1))[0] == "spilled" and store.location(oid(0))[0] == "shm"
    store.unpin(oid(0))


def test_store_full_when_everything_is_pinned(make_store):
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(0), array(MIB))
    store.put_value(oid(1), array(MIB))
    store.pin(oid(0))
    store.pin(oid(1))
    with pytest.raises(ObjectStoreFullError) as info:
        store.put_value(oid(2), array(MIB))
    message = str(info.value)
    assert "1.0 MiB" in message and "capacity" in message and "pinned" in message
    assert "object_store_memory" in message
    assert not store.contains(oid(2))
    store.unpin(oid(0))
    store.put_value(oid(2), array(MIB))  # now 0 can be spilled
    assert store.location(oid(0))[0] == "spilled"
    # Larger than the whole store: it goes to disk (as Ray's fallback allocation), so even
    # a store whose objects are all pinned takes it.
    assert store.put_value(oid(3), array(3 * MIB)).kind == "spilled"
    store.unpin(oid(1))


def test_spilled_pinned_object_is_read_from_its_spill_file(make_store):
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    for i in range(3):
        store.put_value(oid(i), array(MIB, i))
    assert store.location(oid(0))[0] == "spilled"
    store.pin(oid(1))
    store.pin(oid(2))
    # No room to restore 0 (1 and 2 are pinned): it is read from the spill file instead.
    np.testing.assert_array_equal(store.get_value(oid(0)), array(MIB, 0))
    assert store.location(oid(0))[0] == "spilled"
    store.unpin(oid(1))
    store.unpin(oid(2))


def test_reading_a_pinned_spilled_object_moves_nothing(make_store):
    store = make_store(capacity=3 * MIB + 4096, recycle_bytes=0)
    for i in range(3):
        store.put_value(oid(i), array(MIB, i))
    store.free(oid(2))  # room to restore 0 now, but 0 is pinned: it must stay where it is
    store.put_value(oid(3), array(MIB, 3))
    store.put_value(oid(4), array(MIB, 4))
    assert store.location(oid(0))[0] == "spilled"
    store.pin(oid(0))
    np.testing.assert_array_equal(store.get_value(oid(0)), array(MIB, 0))
    assert store.location(oid(0))[0] == "spilled"
    assert not any(e.busy for e in store._entries.values())  # nothing left half-moved
    for i in (1, 3, 4):
        np.testing.assert_array_equal(store.get_value(oid(i)), array(MIB, i))
    store.unpin(oid(0))


def test_a_full_spill_disk_is_out_of_disk_and_changes_nothing(make_store, monkeypatch):
    from miniray.exceptions import OutOfDiskError

    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(0), array(MIB, 0))
    store.put_value(oid(1), array(MIB, 1))
    before = store.statistics()

    def no_space(src, dst, size):
        raise OSError(28, "No space left on device")  # ENOSPC

    monkeypatch.setattr(shm_segments, "copy_file", no_space)
    with pytest.raises(OutOfDiskError, match="No space left"):
        store.put_value(oid(2), array(MIB, 2))
    assert store.statistics() == before and not store.contains(oid(2))
    monkeypatch.undo()
    store.put_value(oid(2), array(MIB, 2))
    for i in range(3):
        np.testing.assert_array_equal(store.get_value(oid(i)), array(MIB, i))


def test_an_object_larger_than_the_store_is_stored_on_disk(make_store, tmp_path, caplog):
    """Ray 2.60 stores a put larger than object_store_memory (fallback allocation, on disk)
    rather than refusing it; so does miniray, spilling nothing else for it, with one warning
    naming both sizes."""
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(0), array(MIB, 0))
    store.put_value(oid(1), array(MIB, 1))
    with caplog.at_level(logging.WARNING, logger="miniray"):
        stored = store.put_value(oid(2), array(3 * MIB, 2))
        store.put_value(oid(3), array(4 * MIB, 3))
    assert stored.kind == "spilled" and stored.size > 3 * MIB
    warnings = [r.getMessage() for r in caplog.records if "larger than the whole" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "is 3.0 MiB, larger than the whole object store (2.0 MiB" in warnings[0]
    assert "object_store_memory" in warnings[0]
    kind, path, size = store.location(oid(2))
    assert kind == "spilled" and path.startswith(str(tmp_path / "spill")) and size == stored.size
    # Nothing else was spilled for it, and it reads back (a read-only view of the file).
    assert [store.location(oid(i))[0] for i in (0, 1)] == ["shm", "shm"]
    value = store.get_value(oid(2))
    np.testing.assert_array_equal(value, array(3 * MIB, 2))
    assert value.flags.writeable is False
    np.testing.assert_array_equal(read_spilled(path), array(3 * MIB, 2))
    stats = store.statistics()
    assert stats["spills"] == 0 and stats["oversized"] == 2 and stats["restores"] == 0
    assert stats["bytes_spilled"] == stored.size + store.location(oid(3))[2]
    del value
    gc.collect()
    store.free(oid(2))
    store.free(oid(3))
    assert not os.path.exists(path) and store.statistics()["bytes_spilled"] == 0


def test_an_oversized_put_on_a_full_disk_is_out_of_disk(make_store, monkeypatch):
    from miniray._private.object_store import shm_store
    from miniray.exceptions import OutOfDiskError

    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    before = store.statistics()

    def no_space(path, ser):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shm_store, "write_segment", no_space)
    with pytest.raises(OutOfDiskError) as info:
        store.put_value(oid(1), array(3 * MIB))
    assert "3.0 MiB" in str(info.value) and "2.0 MiB" in str(info.value)
    assert store.statistics() == before and not store.contains(oid(1))


def test_adopting_a_segment_larger_than_the_store(make_store, tag, caplog):
    """A worker's result or put larger than the whole store follows the same rule: it is
    moved to disk at once, and nothing else is spilled for it."""
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    store.put_value(oid(1), array(MIB, 1))
    path, size = create_segment(tag, oid(9), array(3 * MIB, 9))
    with caplog.at_level(logging.WARNING, logger="miniray"):
        store.put_segment_from(oid(9), os.path.basename(path), size)
    assert any("is 3.0 MiB, larger than the whole object store (2.0 MiB" in r.getMessage()
               for r in caplog.records)
    kind, spill_path, spilled_size = store.location(oid(9))
    assert kind == "spilled" and spilled_size == size and not os.path.exists(path)
    assert store.location(oid(1))[0] == "shm"
    np.testing.assert_array_equal(store.get_value(oid(9)), array(3 * MIB, 9))
    stats = store.statistics()
    assert stats["segments_adopted"] == 1 and stats["oversized"] == 1
    assert stats["bytes_in_memory"] < 2 * MIB
    gc.collect()
    store.free(oid(9))
    assert not os.path.exists(spill_path)


def test_a_full_shm_dir_is_store_full(make_store, monkeypatch, tag):
    store = make_store(recycle_bytes=0)
    before = store.statistics()

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(oob.Serialized, "write_fd", lambda self, fd: no_space(fd))
    with pytest.raises(ObjectStoreFullError, match="shm-size"):
        store.put_value(oid(1), array(MIB))
    with pytest.raises(ObjectStoreFullError, match="No room"):
        create_segment(tag, oid(2), array(MIB))
    assert store.statistics() == before and leftovers(tag) == []


def test_warm_mappings_are_bounded(make_store):
    from miniray._private.object_store import shm_store

    store = make_store(capacity=512 * MIB, recycle_bytes=64 * MIB)
    for i in range(60):  # each put recycles the previous put's segment
        store.put_value(oid(1000 + i), array(256 * 1024))
        store.put_value(oid(i), array(256 * 1024))
        store.free(oid(1000 + i))
    assert store.statistics()["segments_recycled"] >= 50
    assert len(store._warm) <= shm_store._WARM_MAX


def test_an_object_being_read_cannot_be_replaced(make_store):
    store = make_store(recycle_bytes=0)
    store.put_value(oid(1), array(MIB, 1))
    store.pin(oid(1))
    store.free(oid(1))  # deferred: pinned
    with pytest.raises(RuntimeError, match="bug in miniray"):
        store.put_value(oid(1), array(MIB, 2))
    with pytest.raises(RuntimeError, match="bug in miniray"):
        store.put_serialized(oid(1), b"x")
    np.testing.assert_array_equal(store.get_value(oid(1)), array(MIB, 1))
    store.unpin(oid(1))
    assert not store.contains(oid(1))
    store.put_value(oid(1), array(MIB, 2))  # once gone, the id may be stored again
    store.put_value(oid(1), 7)  # and replaced while nobody reads it
    assert store.get_value(oid(1)) == 7


def test_adopting_a_worker_segment(make_store, tag):
    store = make_store(capacity=2 * MIB + 4096, recycle_bytes=0)
    assert create_segment(tag, oid(9), "small") is None
    path, size = create_segment(tag, oid(9), oob.serialize(array(MIB)))  # serialized once
    store.put_value(oid(1), array(MIB, 1))
    store.put_value(oid(2), array(MIB, 2))
    store.put_segment_from(oid(9), os.path.basename(path), size)  # over capacity: spills 1
    assert store.location(oid(9)) == ("shm", path, size)
    assert store.location(oid(1))[0] == "spilled"
    np.testing.assert_array_equal(store.get_value(oid(9)), array(MIB))
    assert store.statistics()["segments_adopted"] == 1
    with pytest.raises(ValueError, match="not a segment of session"):
        store.put_segment_from(oid(8), "/tmp/somefile", 10)
    store.free(oid(9))
    assert not os.path.exists(path)


def test_create_segment_replaces_a_stale_one_of_a_crashed_attempt(tag):
    path, _ = create_segment(tag, oid(1), array(MIB, 1))
    path2, _ = create_segment(tag, oid(1), array(MIB, 2))
    assert path2 == path
    np.testing.assert_array_equal(read_segment(path), array(MIB, 2))
    os.unlink(path)


# --- fallback, sweeping, finalizers ---------------------------------------------------------------


def test_fallback_to_files_when_shm_dir_is_missing(make_store, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="miniray")
    missing = str(tmp_path / "no-shm-here")
    store = make_store(shm_dir=missing, fallback_dir=str(tmp_path / "objects"))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert missing in warnings[0].getMessage() and "objects" in warnings[0].getMessage()
    stats = store.statistics()
    assert stats["fallback"] is True and stats["shm_dir"] == str(tmp_path / "objects")
    store.put_value(oid(1), array(MIB))
    kind, path, _ = store.location(oid(1))
    assert kind == "shm" and path.startswith(str(tmp_path / "objects"))
    np.testing.assert_array_equal(store.get_value(oid(1)), array(MIB))
    assert "fallback" in repr(store)
    store.close()
    assert os.listdir(tmp_path / "objects") == []


def test_sweep_removes_dead_tags_only(tag):
    dead = new_session_tag()
    live_path, _ = create_segment(tag, oid(1), array(MIB))
    dead_paths = [create_segment(dead, oid(i), array(MIB))[0] for i in range(3)]
    asked = []

    def is_dead(t):
        asked.append(t)
        return t == dead

    swept = sweep_segments(SHM, is_dead)
    assert sorted(swept) == sorted(os.path.basename(p) for p in dead_paths)
    assert asked.count(dead) == 1 and asked.count(tag) == 1
    assert os.path.exists(live_path) and not any(os.path.exists(p) for p in dead_paths)
    os.unlink(live_path)


def test_session_tags():
    tag = new_session_tag()
    assert len(tag) == 20 and session_tag_pid(tag) == os.getpid()
    assert session_tag_owner(tag) == (procinfo.ns_tag(), os.getpid())
    rooted = new_session_tag(root="abcdef")
    assert len(rooted) == 24 and rooted.startswith("abcdef")
    assert session_tag_owner(rooted) == (procinfo.ns_tag(), os.getpid())
    assert session_tag_owner("0123456789abcd") is None  # an older tag: no namespace in it
    assert new_session_tag() != tag
    assert session_tag_pid("short") is None
    with pytest.raises(ValueError):
        SharedMemoryStore("bad_tag!", MIB, "/tmp")


def test_close_unlinks_everything_including_orphans(make_store, tag, tmp_path):
    store = make_store(capacity=2 * MIB + 4096)
    for i in range(3):
        store.put_value(oid(i), array(MIB, i))
    store.free(oid(2))
    orphan, _ = create_segment(tag, oid(7), array(MIB))  # a crashed worker's, never adopted
    store.close()
    store.close()
    store.free(oid(0))  # free after close: a no-op
    assert leftovers(tag) == [] and leftovers(tag, str(tmp_path / "spill")) == []
    assert not os.path.exists(orphan)
    assert "closed" in repr(store) and store.statistics()["objects"] == 0
    with pytest.raises(RuntimeError, match="closed"):
        store.put_value(oid(3), 1)


def test_a_garbage_store_cleans_up(tag, tmp_path):
    store = SharedMemoryStore(tag, 64 * MIB, str(tmp_path / "spill"))
    store.put_value(oid(1), array(MIB))
    del store
    gc.collect()
    assert leftovers(tag) == []


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_never_runs_the_parents_cleanup(make_store, tag):
    store = make_store()
    store.put_value(oid(1), array(MIB))
    pid = os.fork()
    if pid == 0:  # the child runs the finalizer (as its interpreter exit would), then leaves
        try:
            store._finalizer()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert len(leftovers(tag)) == 1
    np.testing.assert_array_equal(store.get_value(oid(1)), array(MIB))


# --- other processes ----------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from miniray._private.object_store.shm_store import read_segment
    value = read_segment(sys.argv[1])
    print(value["a"].sum(), value["a"].flags.writeable, value["n"], flush=True)
    sys.stdin.readline()          # hold the mapping until the parent has freed the object
    print(value["a"].sum(), flush=True)
    """
)


def test_a_child_process_reads_a_segment_by_name(make_store):
    store = make_store()
    data = array(8 * MIB)
    store.put_value(oid(1), {"a": data, "n": 5})
    name = os.path.basename(store.location(oid(1))[1])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    try:
        total, writeable, n = child.stdout.readline().split()
        assert float(total) == pytest.approx(data.sum()) and writeable == "False" and n == "5"
        store.free(oid(1))  # the child still maps it: not reused while it does
        assert store.statistics()["draining_segments"] == 1
        store.put_value(oid(2), array(8 * MIB, 4))
        assert store.statistics()["segments_recycled"] == 0
        child.stdin.write("\n")
        child.stdin.flush()
        assert float(child.stdout.readline()) == pytest.approx(data.sum())
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
        child.stdout.close()


def test_put_get_free_loop_keeps_shm_usage_constant(make_store, tag):
    store = make_store()
    fds_before = len(os.listdir("/proc/self/fd"))
    sizes = []
    for i in range(2000):
        store.put_value(oid(i), {"a": np.full(30_000, i, dtype=np.float64), "i": i})
        assert store.get_value(oid(i))["a"][0] == i
        store.free(oid(i))
        if i % 250 == 0:
            gc.collect()
            sizes.append(sum(os.stat(os.path.join(SHM, n)).st_size for n in leftovers(tag)))
    assert len(set(sizes[1:])) == 1 and sizes[-1] <= 256 * 1024, sizes
    assert len(leftovers(tag)) <= 1
    stats = store.statistics()
    assert stats["objects"] == 0 and stats["bytes_in_memory"] == 0
    assert stats["segments_recycled"] >= 1990
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 1


def test_threads_share_one_store(make_store):
    store = make_store(capacity=6 * MIB, recycle_bytes=2 * MIB)
    errors = []

    def work(t):
        try:
            for i in range(60):
                key = oid(t * 1000 + i)
                store.put_value(key, np.full(MIB // 8, t * 1000 + i, dtype=np.float64))
                assert store.get_value(key)[-1] == t * 1000 + i
                if i % 3:
                    store.free(key)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    stats = store.statistics()
    assert stats["objects"] == 4 * 20 and stats["spills"] > 0
    for t in range(4):
        for i in range(0, 60, 3):
            assert store.get_value(oid(t * 1000 + i))[0] == t * 1000 + i


# --- pure policy ---------------------------------------------------------------------------------


def test_plan_room():
    plan = store_policy.plan_room
    assert plan(10, 100, 50, [], []) == ([], [])
    assert plan(60, 100, 80, [("p", 10)], [("a", 30), ("b", 30)]) == (["p"], ["a", "b"])
    assert plan(60, 100, 80, [], [("a", 30)]) is None
    assert plan(0, 100, 130, [], [("a", 20)], allow_over=True) == ([], ["a"])
    assert plan(200, 100, 0, [], []) is None


def test_oversized():
    assert store_policy.oversized(101, 100) and not store_policy.oversized(100, 100)
    message = store_policy.oversized_message("ab", 200 * MIB, 100 * MIB, "/spill")
    assert message.startswith(
        "Object ab is 200.0 MiB, larger than the whole object store (100.0 MiB, "
        "object_store_memory), so it is stored on disk in /spill")


def test_pick_reusable_and_may_recycle():
    pooled = [("big", 4 * MIB), ("exact", MIB), ("near", MIB + 100)]
    assert store_policy.pick_reusable(MIB, pooled) == "exact"
    assert store_policy.pick_reusable(3 * MIB, pooled) is None  # 4 MiB wastes too much
    assert store_policy.pick_reusable(5 * MIB, pooled) is None
    ok = dict(used=0, pooled=0, pooled_count=0, capacity=10 * MIB, recycle_bytes=2 * MIB)
    assert store_policy.may_recycle(MIB, **ok)
    assert not store_policy.may_recycle(3 * MIB, **ok)
    assert not store_policy.may_recycle(MIB, **{**ok, "used": 9 * MIB + 1})
    assert not store_policy.may_recycle(MIB, **{**ok, "pooled_count": 16})


def test_statistics_and_repr(make_store):
    store = make_store(capacity=64 * MIB)
    store.put_value(oid(1), 5)
    store.put_value(oid(2), array(MIB))
    store.pin(oid(2))
    stats = store.statistics()
    for key in ("objects", "bytes_in_memory", "bytes_spilled", "pinned", "capacity",
                "segments", "fallback", "shm_dir"):  # fmt: skip
        assert key in stats
    assert stats["objects"] == 2 and stats["pinned"] == 1 and stats["segments"] == 1
    assert stats["capacity"] == 64 * MIB and stats["fallback"] is False
    assert stats["bytes_in_memory"] > MIB
    assert "objects=2" in repr(store) and store.session_tag in repr(store)
    store.unpin(oid(2))
    with pytest.raises(RuntimeError, match="bug in miniray"):
        store.unpin(oid(2))


def test_segments_module_exports():
    for name in shm_segments.__all__:
        assert hasattr(shm_segments, name)
