"""``core/serialization.py``'s custom serializers and how a worker takes the driver's, with
no process started."""

from __future__ import annotations

import pickle
import threading

import pytest

from miniray._private.core import serialization


class Guarded:
    def __init__(self, value):
        self.value = value
        self.lock = threading.Lock()


def _state(obj):
    return obj.value


def _own_state(obj):
    return -obj.value


@pytest.fixture(autouse=True)
def _clean():
    yield
    serialization.apply_registrations(pickle.dumps([]))
    serialization.deregister_serializer(Guarded)


def test_registered_values_pickle_and_others_are_untouched():
    serialization.register_serializer(Guarded, _state, Guarded)
    assert serialization.loads(serialization.dumps(Guarded(3))).value == 3
    assert serialization.loads(serialization.dumps([1, "a"])) == [1, "a"]
    serialization.deregister_serializer(Guarded)
    with pytest.raises(TypeError):
        serialization.dumps(Guarded(3))


def test_the_drivers_registrations_follow_the_driver_but_leave_a_process_own_alone():
    serialization.register_serializer(Guarded, _state, Guarded)
    blob = serialization.registrations_blob()
    serialization.deregister_serializer(Guarded)

    serialization.apply_registrations(blob)  # as a worker does
    assert serialization.loads(serialization.dumps(Guarded(4))).value == 4
    serialization.apply_registrations(pickle.dumps([]))  # the driver deregistered
    with pytest.raises(TypeError):
        serialization.dumps(Guarded(4))

    serialization.register_serializer(Guarded, _own_state, Guarded)  # the process's own
    serialization.apply_registrations(blob)
    assert serialization.loads(serialization.dumps(Guarded(5))).value == -5
    serialization.apply_registrations(pickle.dumps([]))
    assert serialization.loads(serialization.dumps(Guarded(5))).value == -5
