"""ActorHandle's method lookup (``miniray/actor.py``), without a runtime: the per-handle
method specs, the subclass with a property per method, and what keeps a handle alive."""

from __future__ import annotations

import gc
import pickle
import weakref

import pytest

import miniray
from miniray.actor import ActorHandle, ActorMethod


@miniray.remote
class Calls:
    def plain(self):
        return 1

    def pair(self):
        return 1, 2

    def _state(self):  # named like a field of the handle: hidden behind it, as before
        return None

    def _kill(self):  # named like a method of the handle: hidden behind it, as before
        return None


def _handle(methods=None) -> ActorHandle:
    return ActorHandle(b"\x01" * 16, ("Calls", methods or Calls._methods, 0, ()))


def test_a_lookup_binds_a_fresh_method_on_the_handle_s_cached_spec():
    handle = _handle()
    first, second = handle.plain, handle.plain
    assert isinstance(first, ActorMethod) and first is not second
    assert first._spec is second._spec and first._handle is handle
    assert (first._name, first._call_name, first._num_returns) == ("plain", "plain", 1)
    renamed = first.options(name="other")
    assert renamed._call_name == "other" and handle.plain._call_name == "plain"


def test_the_handle_class_looks_like_actor_handle():
    handle = _handle()
    assert isinstance(handle, ActorHandle)
    assert (type(handle).__name__, type(handle).__module__) == ("ActorHandle", "miniray.actor")
    assert type(handle) is type(_handle())  # one class per set of method names
    assert repr(handle) == f"Actor(Calls, {'01' * 16})"
    copy = pickle.loads(pickle.dumps(handle))
    assert type(copy) is type(handle) and copy == handle and copy.pair._name == "pair"
    method = pickle.loads(pickle.dumps(handle.pair))
    assert (method._name, method._handle) == ("pair", handle)


def test_names_of_the_handle_s_own_attributes_stay_the_handle_s():
    handle = _handle()
    assert handle._state[0] == "Calls"
    assert handle._kill.__func__ is ActorHandle._kill


def test_an_unknown_name_raises_attribute_error_alone():
    handle = _handle()
    with pytest.raises(AttributeError, match="no attribute 'missing'") as info:
        _ = handle.missing
    assert info.value.__context__ is None
    assert not hasattr(handle, "_private") and hasattr(handle, "plain")


def test_lookups_make_no_cycle_and_a_kept_method_keeps_its_handle():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        handle = _handle()
        handle.plain.options(name="x")
        _ = handle.pair, handle.__ray_ready__
        gone = weakref.ref(handle)
        del handle, _
        assert gone() is None  # freed by its reference count: no GC pass needed
        handle = _handle()
        kept = handle.plain
        alive = weakref.ref(handle)
        del handle
        assert alive() is not None and kept._handle is alive()
        del kept
        assert alive() is None
    finally:
        if was_enabled:
            gc.enable()
