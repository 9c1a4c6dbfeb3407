"""``serialization.pack_arguments`` with a store for large arguments (no processes).

An argument passed by value whose serialized size reaches the threshold is stored once
(``put``) and passed as a top-level dependency, as Ray 2.60 does for arguments over 100 KiB;
smaller ones stay in the call's blob.
"""

from __future__ import annotations

import numpy as np

from miniray._private.core import oob, serialization

THRESHOLD = 100 * 1024


class _Ref:
    """Stands in for ObjectRef (``pack_arguments`` is given the type)."""

    def __init__(self, object_id: bytes):
        self._id = object_id

    def __reduce__(self):
        ids = serialization.collected_ids()
        if ids is not None:
            ids.append(self._id)
        return _Ref, (self._id,)


class _Store:
    def __init__(self):
        self.puts: list = []

    def put(self, ser, contained) -> bytes:
        assert isinstance(ser, oob.Serialized)
        object_id = bytes([len(self.puts) + 1]) * 28
        self.puts.append((object_id, ser, contained))
        return object_id

    @property
    def large(self) -> tuple:
        return THRESHOLD, self.put


def test_small_arguments_stay_in_the_blob():
    store = _Store()
    blob, deps, contained, stored = serialization.pack_arguments(
        (1, "x", np.zeros(10)), {"k": b"abc"}, "f", _Ref, store.large)
    assert store.puts == [] and deps is None and contained == () and stored == ()
    args, kwargs = serialization.loads_arguments(blob)
    assert args[:2] == (1, "x") and kwargs == {"k": b"abc"}


def test_large_positional_and_keyword_arguments_become_dependencies():
    store = _Store()
    big = np.ones(THRESHOLD // 8 + 16)
    blob, deps, _, stored = serialization.pack_arguments(
        (3, big), {"y": big * 2, "z": 4}, "f", _Ref, store.large)
    assert [p for p, _ in deps] == [1, "y"]
    assert [d for _, d in deps] == [p[0] for p in store.puts] == [r._id for r in stored]
    args, kwargs = serialization.loads_arguments(blob)
    assert args == (3, None) and kwargs == {"y": None, "z": 4}
    assert len(blob) < 1024  # the arrays are not in the call message
    stored_value = oob.loads_inline(oob.inline_blob(store.puts[1][1]))
    assert (stored_value == big * 2).all()


def test_existing_ref_dependencies_are_kept_in_place():
    store = _Store()
    ref = _Ref(b"\x09" * 28)
    _, deps, _, _ = serialization.pack_arguments(
        (ref, np.ones(THRESHOLD // 8 + 16)), {}, "f", _Ref, store.large)
    assert deps == [(0, b"\x09" * 28), (1, store.puts[0][0])]


def test_refs_inside_a_stored_argument_are_held_by_the_stored_object():
    store = _Store()
    inner = _Ref(b"\x07" * 28)
    small_inner = _Ref(b"\x08" * 28)
    _, _, contained, _ = serialization.pack_arguments(
        ([inner, np.ones(THRESHOLD // 8 + 16)], [small_inner]), {}, "f", _Ref, store.large)
    assert store.puts[0][2] == (b"\x07" * 28,)
    assert contained == (b"\x08" * 28,)  # the call itself holds only what stayed in it


def test_many_small_arguments_over_the_threshold_together_stay_inline():
    store = _Store()
    parts = [np.ones(THRESHOLD // 8 // 4) for _ in range(6)]
    blob, deps, _, stored = serialization.pack_arguments(
        tuple(parts), {}, "f", _Ref, store.large)
    assert store.puts == [] and deps is None and stored == ()
    assert len(serialization.loads_arguments(blob)[0]) == 6


def test_without_a_store_everything_stays_inline():
    blob, deps, _, stored = serialization.pack_arguments(
        (np.ones(THRESHOLD),), {}, "f", _Ref)
    assert deps is None and stored == ()
    assert serialization.loads_arguments(blob)[0][0].shape == (THRESHOLD,)
