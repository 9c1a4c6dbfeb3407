"""``miniray.util.register_serializer`` / ``deregister_serializer``.

Compared with Ray 2.60: a class that cannot be pickled (it holds a lock) travels as task
argument and through ``put`` once the driver registers a serializer; the deserializer rides
inside the pickle, so a worker that never registered the class still rebuilds it; a worker
that registers it itself can return instances; after ``deregister_serializer`` the class is
unpicklable again (TypeError naming the argument); deregistering an unknown class does nothing.
Beyond Ray (which leaves each worker to register for itself), what the driver registers holds
in every worker of its session, started before or after the registration, for results and
``put``; what a worker registers holds in that worker only, as in Ray.
"""

from __future__ import annotations

import threading

import pytest

import miniray
from miniray.util import deregister_serializer, register_serializer

GET_TIMEOUT = 30


class Locked:
    """Not picklable: holds a lock."""

    def __init__(self, value):
        self.value = value
        self.lock = threading.Lock()


def _serialize(obj):
    return {"value": obj.value}


def _deserialize(state):
    return Locked(state["value"])


@pytest.fixture
def registered():
    register_serializer(Locked, serializer=_serialize, deserializer=_deserialize)
    yield
    deregister_serializer(Locked)


def test_argument_and_put_use_the_registered_serializer(ray, registered):
    @ray.remote
    def read(obj):
        return type(obj).__name__, obj.value, type(obj.lock).__name__

    assert ray.get(read.remote(Locked(3)), timeout=GET_TIMEOUT) == ("Locked", 3, "lock")
    ref = ray.put(Locked(4))
    assert ray.get(ref, timeout=GET_TIMEOUT).value == 4
    assert ray.get(read.remote(ref), timeout=GET_TIMEOUT)[1] == 4
    # Nested inside a container too.
    assert ray.get(read.remote([Locked(5)][0]), timeout=GET_TIMEOUT)[1] == 5


def test_a_worker_that_registers_can_return_instances(ray, registered):
    @ray.remote
    def make(value):
        from miniray.util import register_serializer as register

        register(Locked, serializer=_serialize, deserializer=_deserialize)
        return Locked(value)

    result = ray.get(make.remote(7), timeout=GET_TIMEOUT)
    assert isinstance(result, Locked) and result.value == 7


def test_the_drivers_registration_holds_in_every_worker(ray):
    @ray.remote
    class Early:
        def make(self, value):
            return Locked(value)

        def put_one(self, value):
            return [miniray.put(Locked(value))]

        def ping(self):
            return True

    early = Early.remote()
    assert ray.get(early.ping.remote(), timeout=GET_TIMEOUT)  # started before registering
    with pytest.raises(miniray.exceptions.RayTaskError):
        ray.get(early.make.remote(1), timeout=GET_TIMEOUT)  # not registered yet: unpicklable

    register_serializer(Locked, serializer=_serialize, deserializer=_deserialize)
    try:
        @ray.remote
        def make(value):
            return Locked(value)

        assert ray.get(early.make.remote(2), timeout=GET_TIMEOUT).value == 2
        [inner] = ray.get(early.put_one.remote(3), timeout=GET_TIMEOUT)
        assert ray.get(inner, timeout=GET_TIMEOUT).value == 3
        assert [v.value for v in ray.get([make.remote(i) for i in range(4)],
                                         timeout=GET_TIMEOUT)] == [0, 1, 2, 3]
        late = Early.remote()  # a worker started after the registration
        assert ray.get(late.make.remote(4), timeout=GET_TIMEOUT).value == 4
    finally:
        deregister_serializer(Locked)
    with pytest.raises(miniray.exceptions.RayTaskError, match="lock"):
        ray.get(early.make.remote(5), timeout=GET_TIMEOUT)


def test_a_registration_before_init_reaches_the_workers(ray_start):
    register_serializer(Locked, serializer=_serialize, deserializer=_deserialize)
    try:
        ray_start(num_cpus=1)

        @miniray.remote
        def make(value):
            return Locked(value)

        assert miniray.get(make.remote(8), timeout=GET_TIMEOUT).value == 8
    finally:
        deregister_serializer(Locked)


def test_deregister_restores_plain_pickling(ray):
    register_serializer(Locked, serializer=_serialize, deserializer=_deserialize)
    deregister_serializer(Locked)
    deregister_serializer(Locked)  # no effect the second time, as in Ray

    @ray.remote
    def read(obj):
        return obj.value

    with pytest.raises(TypeError, match="lock"):
        read.remote(Locked(1))


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="class"):
        register_serializer(Locked(1), serializer=_serialize, deserializer=_deserialize)
    with pytest.raises(TypeError, match="callable"):
        register_serializer(Locked, serializer=None, deserializer=_deserialize)
    assert miniray.util.register_serializer is register_serializer
