"""put / get / wait and ObjectRef.

Ray 2.60 behaviour: ray-api-surface.md §3.1 (get), §3.2 (put), §3.3 (wait), §4 (ObjectRef),
§1.3 (refs of a session that was shut down).
"""

from __future__ import annotations

import collections
import pickle
import time

import numpy as np
import pytest

import miniray
from miniray import exceptions

GET_TIMEOUT = 30
# A task that must still be pending when the test looks: it sleeps far longer than a stall
# of a loaded machine, so "did not wait for it" needs no tight wall-time bound (a 3 s task
# could finish first, e.g. while the other task's worker started, and a 2 s bound on a
# 0.3 s wait failed when the process was not scheduled for that long).
PENDING_S = 120


class Plain:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Plain) and other.value == self.value


Pair = collections.namedtuple("Pair", "left right")


@pytest.fixture
def sleeper(ray):
    @ray.remote(max_retries=0)
    def sleep_then(seconds, value=None):
        time.sleep(seconds)
        return value

    return sleep_then


# ----------------------------------------------------------------------------- put / get
@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -3,
        2**80,
        1.5,
        float("inf"),
        "text",
        "ünïcode",
        b"\x00bytes",
        bytearray(b"ba"),
        [1, [2, 3]],
        (1, "a"),
        {"k": {"n": [1]}},
        {1, 2},
        frozenset({3}),
        Pair(1, 2),
        Plain(5),
        b"x" * (4 << 20),
        range(3),
        complex(1, 2),
    ],
    ids=lambda v: type(v).__name__,
)
def test_put_get_roundtrip(ray, value):
    got = ray.get(ray.put(value), timeout=GET_TIMEOUT)
    assert got == value
    assert type(got) is type(value)


def test_put_get_numpy(ray):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = ray.get(ray.put(array), timeout=GET_TIMEOUT)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, array)


def test_task_result_values(ray):
    @ray.remote
    def make():
        return {"array": np.ones(3), "plain": Plain(1), "none": None}

    got = ray.get(make.remote(), timeout=GET_TIMEOUT)
    np.testing.assert_array_equal(got["array"], np.ones(3))
    assert got["plain"] == Plain(1) and got["none"] is None


def test_get_list_keeps_order(ray, sleeper):
    refs = [sleeper.remote(0.3, "slow"), ray.put("put"), sleeper.remote(0.0, "fast")]
    assert ray.get(refs, timeout=GET_TIMEOUT) == ["slow", "put", "fast"]


def test_get_same_ref_twice_in_list(ray):
    ref = ray.put(3)
    assert ray.get([ref, ref], timeout=GET_TIMEOUT) == [3, 3]


def test_get_empty_list(ray):
    assert ray.get([]) == []


@pytest.mark.parametrize("arg", [(), ("x",), 1, "ref", {"a": 1}], ids=repr)
def test_get_non_list_container_raises_value_error(ray, arg):
    with pytest.raises(ValueError) as info:
        ray.get(arg)
    assert str(info.value).startswith(
        f"Invalid type of object refs, {type(arg)}, is given. 'object_refs' must either be an "
        "ObjectRef or a list of ObjectRefs."
    )


def test_get_tuple_of_refs_raises_value_error(ray):
    with pytest.raises(ValueError, match="Invalid type of object refs"):
        ray.get((ray.put(1),))


def test_get_list_with_non_ref_raises_type_error(ray):
    with pytest.raises(TypeError) as info:
        ray.get([ray.put(1), 1])
    assert str(info.value) == (
        "Attempting to call `get` on the value 1, which is not an ray.ObjectRef."
    )


def test_put_ref_raises_type_error_but_list_of_ref_works(ray):
    ref = ray.put(1)
    with pytest.raises(TypeError) as info:
        ray.put(ref)
    assert str(info.value).startswith("Calling 'put' on an ray.ObjectRef is not allowed.")
    wrapped = ray.get(ray.put([ref]), timeout=GET_TIMEOUT)
    assert wrapped == [ref]
    assert ray.get(wrapped[0], timeout=GET_TIMEOUT) == 1


def test_get_timeout_raises_get_timeout_error(ray, sleeper):
    ref = sleeper.remote(PENDING_S)
    start = time.monotonic()
    with pytest.raises(exceptions.GetTimeoutError) as info:
        ray.get(ref, timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < PENDING_S / 2, elapsed
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, exceptions.RayError)
    assert str(info.value) == "Get timed out: some object(s) not ready."
    # A list with one pending ref times out too.
    with pytest.raises(TimeoutError):
        ray.get([ray.put(1), ref], timeout=0.05)
    ray.cancel(ref, force=True)


def test_get_timeout_zero(ray, sleeper):
    ready = ray.put("now")
    assert ray.get(ready, timeout=0) == "now"
    pending = sleeper.remote(PENDING_S)
    start = time.monotonic()
    with pytest.raises(exceptions.GetTimeoutError):
        ray.get(pending, timeout=0)
    assert time.monotonic() - start < PENDING_S / 2
    ray.cancel(pending, force=True)


def test_get_negative_timeout_blocks_like_none(ray, sleeper):
    assert ray.get(sleeper.remote(0.1, "v"), timeout=-1) == "v"


# ----------------------------------------------------------------------------- wait
def test_wait_default_returns_one(ray, sleeper):
    fast = [ray.put(i) for i in range(3)]
    ready, not_ready = ray.wait(fast)
    assert ready == fast[:1] and not_ready == fast[1:]


def test_wait_order_partition(ray, sleeper):
    slow = sleeper.remote(PENDING_S)
    a, b = ray.put("a"), ray.put("b")
    ready, not_ready = ray.wait([slow, a, b], num_returns=2, timeout=GET_TIMEOUT)
    assert ready == [a, b]
    assert not_ready == [slow]
    ray.cancel(slow, force=True)


def test_wait_ready_list_is_capped_at_num_returns(ray):
    refs = [ray.put(i) for i in range(3)]
    ready, not_ready = ray.wait(refs, num_returns=1)
    assert len(ready) == 1 and len(not_ready) == 2
    assert ready + not_ready == refs


def test_wait_timeout_returns_short_ready_list(ray, sleeper):
    slow = sleeper.remote(PENDING_S)
    done = ray.put(1)
    start = time.monotonic()
    ready, not_ready = ray.wait([slow, done], num_returns=2, timeout=0.3)
    elapsed = time.monotonic() - start
    assert ready == [done] and not_ready == [slow]
    assert 0.25 <= elapsed < PENDING_S / 2, elapsed
    start = time.monotonic()
    assert ray.wait([slow], timeout=0) == ([], [slow])
    assert time.monotonic() - start < PENDING_S / 2
    ray.cancel(slow, force=True)


def test_wait_without_timeout_waits_for_num_returns(ray, sleeper):
    refs = [sleeper.remote(0.05 * i, i) for i in range(3)]
    ready, not_ready = ray.wait(refs, num_returns=3)
    assert ready == refs and not_ready == []


def test_wait_empty_list(ray):
    assert ray.wait([]) == ([], [])


def test_failed_task_counts_as_ready(ray, sleeper):
    @ray.remote(max_retries=0)
    def fail():
        raise RuntimeError("x")

    slow = sleeper.remote(PENDING_S)
    failed = fail.remote()
    ready, not_ready = ray.wait([slow, failed], num_returns=1, timeout=GET_TIMEOUT)
    assert ready == [failed] and not_ready == [slow]
    ray.cancel(slow, force=True)


@pytest.mark.parametrize(
    "make_arg, text",
    [
        (
            lambda r: r,
            "wait() expected a list of ray.ObjectRef or ray.ObjectRefGenerator, got "
            "a single ray.ObjectRef",
        ),
        (
            lambda r: (r,),
            "wait() expected a list of ray.ObjectRef or "
            "ray.ObjectRefGenerator, got <class 'tuple'>",
        ),
        (
            lambda r: [r, 1],
            "wait() expected a list of ray.ObjectRef or "
            "ray.ObjectRefGenerator, got list containing <class 'int'>",
        ),
    ],
    ids=["single-ref", "tuple", "non-ref-in-list"],
)
def test_wait_type_errors(ray, make_arg, text):
    with pytest.raises(TypeError) as info:
        ray.wait(make_arg(ray.put(1)))
    assert str(info.value).startswith(text)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"num_returns": 0}, "Invalid number of objects to return 0."),
        ({"num_returns": -1}, "Invalid number of objects to return -1."),
        (
            {"num_returns": 3},
            "num_returns cannot be greater than the number of ray_waitables provided to ray.wait.",
        ),
        ({"timeout": -1}, "The 'timeout' argument must be nonnegative. Received -1"),
    ],
    ids=["num_returns-0", "num_returns-negative", "num_returns-too-many", "negative-timeout"],
)
def test_wait_value_errors(ray, kwargs, text):
    refs = [ray.put(1), ray.put(2)]
    with pytest.raises(ValueError) as info:
        ray.wait(refs, **kwargs)
    assert str(info.value) == text


def test_wait_duplicates_raise_value_error(ray):
    ref = ray.put(1)
    with pytest.raises(ValueError) as info:
        ray.wait([ref, ref])
    assert str(info.value) == "Wait requires a list of unique ray_waitables."


# ----------------------------------------------------------------------------- ObjectRef
def test_object_ref_identity_and_pickling(ray):
    ref = ray.put("v")
    assert isinstance(ref, ray.ObjectRef)
    assert len(ref.hex()) == 56
    int(ref.hex(), 16)
    assert repr(ref) == f"ObjectRef({ref.hex()})"
    assert ref.binary() == bytes.fromhex(ref.hex())
    same = ray.ObjectRef.from_hex(ref.hex())
    assert same == ref and hash(same) == hash(ref) and not (same != ref)
    other = ray.put("v")
    assert other != ref
    assert len({ref, same, other}) == 2
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref
    assert ray.get(copy, timeout=GET_TIMEOUT) == "v"


def test_task_return_refs_have_56_hex_chars(ray):
    @ray.remote(num_returns=2)
    def two():
        return 1, 2

    refs = two.remote()
    assert [len(r.hex()) for r in refs] == [56, 56]
    assert refs[0] != refs[1]
    assert refs[0].task_id() == refs[1].task_id()


def test_object_ref_task_id_is_a_task_id_naming_the_task_and_its_actor(ray):
    """``ObjectRef.task_id()`` is a ``TaskID`` whose ``hex()`` is the task's
    ``get_task_id()``; for an actor call its ``actor_id()`` is the actor's id, for a task the
    job's nil actor; ``job_id()`` is a ``JobID`` (``get_job_id()``). ``owner_address()`` is
    bytes. Compared with Ray 2.60 (same types, reprs and layouts)."""

    @ray.remote
    def task_id():
        return ray.get_runtime_context().get_task_id()

    @ray.remote
    class Ids:
        def ids(self):
            ctx = ray.get_runtime_context()
            return ctx.get_task_id(), ctx.get_actor_id()

    ref = task_id.remote()
    task = ref.task_id()
    assert type(task) is ray.TaskID and repr(task) == f"TaskID({task.hex()})"
    assert ray.get(ref, timeout=GET_TIMEOUT) == task.hex()
    assert task.actor_id() == ray.ActorID.from_hex("ff" * 12 + "01000000")
    assert ref.job_id() == task.job_id() == ray.JobID.from_hex(
        ray.get_runtime_context().get_job_id())
    actor = Ids.remote()
    call = actor.ids.remote()
    inside_task, inside_actor = ray.get(call, timeout=GET_TIMEOUT)
    assert call.task_id().hex() == inside_task
    assert call.task_id().actor_id() == ray.ActorID.from_hex(inside_actor)
    put = ray.put(1)
    assert type(put.task_id()) is ray.TaskID and not put.task_id().is_nil()
    assert type(put.owner_address()) is bytes and put.call_site() == ""
    assert ray.ObjectRef.nil().is_nil() and ray.ObjectRef.nil().task_id().is_nil()
    with pytest.raises(ValueError, match="TaskID is nil"):
        ray.ObjectRef.nil().job_id()
    ray.kill(actor)


def test_refs_of_a_previous_session_raise_value_error(ray_start):
    ray_start(num_cpus=1)
    old = miniray.put("old")

    @miniray.remote
    def f():
        return 1

    old_task = f.remote()
    miniray.get(old_task, timeout=GET_TIMEOUT)
    miniray.shutdown()
    ray_start(num_cpus=1)
    for ref in (old, old_task):
        with pytest.raises(ValueError) as info:
            miniray.get(ref, timeout=5)
        assert "You are trying to access Ray objects whose owner is unknown" in str(info.value)


# ----------------------------------------------------------------------------- futures
def test_object_ref_future(ray):
    # Regression: future() used to import a module that did not exist.
    @ray.remote
    def f():
        time.sleep(0.1)
        return "via future"

    assert f.remote().future().result(timeout=GET_TIMEOUT) == "via future"
    assert ray.put(1).future().result(timeout=GET_TIMEOUT) == 1


def test_await_object_ref(ray):
    # Regression: `await ref` used to fail with ImportError (see test_object_ref_future).
    import asyncio

    async def main():
        return await ray.put("awaited")

    assert asyncio.run(main()) == "awaited"


def test_numpy_arrays_from_get_are_read_only(ray):
    array = ray.get(ray.put(np.zeros(4)), timeout=GET_TIMEOUT)
    assert array.flags.writeable is False
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 1


class _HoldsArray:
    def __init__(self):
        self.array = np.zeros(3)


# Sizes on both sides of the 100 KiB inline threshold: Ray 2.60 makes every array read-only.
@pytest.mark.parametrize("size", [0, 10, 12_800, 200_000])
def test_numpy_arguments_by_value_arrive_read_only(ray, size):
    """Arrays passed by value reach the task read-only, whatever their size, alone or inside
    containers and objects, for tasks and actor methods. Compared with Ray 2.60, which gives
    ``writeable False`` for each of these, and ``True`` for an object-dtype array and for a
    non-contiguous one (both pickled in-band there and here)."""

    @ray.remote
    def flags(value):
        if isinstance(value, np.ndarray):
            return value.flags.writeable
        if isinstance(value, dict):
            return {key: item.flags.writeable for key, item in value.items()}
        if isinstance(value, _HoldsArray):
            return value.array.flags.writeable
        return [item.flags.writeable for item in value]

    @ray.remote
    class Reader:
        def flags(self, value, *, other):
            return value.flags.writeable, other.flags.writeable

    array = np.arange(size, dtype=np.float64)
    assert ray.get(flags.remote(array), timeout=GET_TIMEOUT) is False
    assert ray.get(flags.remote([array, array]), timeout=GET_TIMEOUT) == [False, False]
    assert ray.get(flags.remote({"k": array}), timeout=GET_TIMEOUT) == {"k": False}
    assert ray.get(flags.remote(_HoldsArray()), timeout=GET_TIMEOUT) is False
    assert ray.get(flags.remote(ray.put(array)), timeout=GET_TIMEOUT) is False
    assert ray.get(ray.put(array), timeout=GET_TIMEOUT).flags.writeable is False
    reader = Reader.remote()
    assert ray.get(reader.flags.remote(array, other=array), timeout=GET_TIMEOUT) == (False, False)
    # In-band pickles make fresh arrays, writeable in Ray too.
    assert ray.get(flags.remote(np.array([1, "x"], dtype=object)), timeout=GET_TIMEOUT) is True
    assert ray.get(flags.remote(np.zeros((4, 4))[:, ::2]), timeout=GET_TIMEOUT) is True
    ray.kill(reader)
