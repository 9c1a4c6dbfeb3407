"""Generator tasks and actor methods: streaming (``ObjectRefGenerator``), async iteration,
``num_returns="dynamic"`` (``DynamicObjectRefGenerator``), cancel and dropped generators.

Every behaviour here was compared side by side with Ray 2.60 (its venv, ``num_cpus=2``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pickle
import time
import warnings

import numpy as np
import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray.util.annotations import RayDeprecationWarning

from .helpers import cli, driver, open_gate, wait_for_gate, wait_until

GET_TIMEOUT = 30


def _owner():
    return runtime.current().owner


def _settled(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _completed_now(gen) -> bool:
    ready, _ = miniray.wait([gen.completed()], timeout=0)
    return bool(ready)


# ----------------------------------------------------------------------------- basics
def test_generator_returns_object_ref_generator(ray):
    """A generator function's ``.remote()`` is an ObjectRefGenerator of one ref per value;
    ``get`` of the generator returns it unchanged (Ray 2.60: the same)."""
    @ray.remote
    def count(n):
        for i in range(n):
            yield i * 10

    gen = count.remote(4)
    assert isinstance(gen, ray.ObjectRefGenerator)
    refs = list(gen)
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert [ray.get(r, timeout=GET_TIMEOUT) for r in refs] == [0, 10, 20, 30]
    assert ray.get(gen) is gen


def test_values_are_available_as_they_are_yielded(ray, tmp_path):
    """The first value is there while the task still waits before its second (Ray 2.60:
    ``next(gen)`` returned in 15 ms there, with ``is_finished()`` and ``next_ready()`` False;
    before streaming, ``next`` waited for the whole task)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    def slow():
        yield 1
        wait_for_gate(gate, 60)
        yield 2

    gen = slow.remote()
    first = next(gen)  # a next() that waited for the whole task would wait for the gate
    assert ray.get(first, timeout=GET_TIMEOUT) == 1
    assert not _completed_now(gen)  # the task is still running: this value was streamed
    assert gen.is_finished() is False and gen.next_ready() is False
    open_gate(gate)
    assert ray.get(next(gen), timeout=GET_TIMEOUT) == 2
    with pytest.raises(StopIteration):
        next(gen)
    assert ray.get(gen.completed(), timeout=GET_TIMEOUT) is None
    assert gen.is_finished() is True and gen.next_ready() is False
    with pytest.raises(StopIteration):
        next(gen)


def test_an_exception_is_the_last_value_then_stop_iteration(ray):
    """Yield 0, then raise: ``0``, then a ref whose get raises RayTaskError(ValueError), then
    StopIteration; ``completed()`` holds None (Ray 2.60: the same)."""
    @ray.remote
    def broken():
        yield 0
        raise ValueError("boom")

    gen = broken.remote()
    assert ray.get(next(gen), timeout=GET_TIMEOUT) == 0
    error_ref = next(gen)
    with pytest.raises(exceptions.RayTaskError) as info:
        ray.get(error_ref, timeout=GET_TIMEOUT)
    assert isinstance(info.value, ValueError)
    assert type(info.value).__name__ == "RayTaskError(ValueError)"
    assert "boom" in str(info.value)
    with pytest.raises(StopIteration):
        next(gen)
    assert ray.get(gen.completed(), timeout=GET_TIMEOUT) is None
    assert gen.is_finished()


def test_an_exception_before_the_first_value(ray):
    """Raising before any yield: the error is the only value (Ray 2.60: the same)."""
    @ray.remote
    def at_once():
        raise KeyError("gen-broke")
        yield 1

    refs = list(at_once.remote())
    assert len(refs) == 1
    with pytest.raises(KeyError):
        ray.get(refs[0], timeout=GET_TIMEOUT)


def test_unsupported_generator_methods_and_pickling(ray):
    """``send``/``throw``/``close`` raise NotImplementedError and pickling raises TypeError,
    with Ray 2.60's messages."""
    @ray.remote
    def one():
        yield 1

    gen = one.remote()
    for name, args in (("send", (1,)), ("throw", (ValueError,)), ("close", ())):
        with pytest.raises(NotImplementedError, match=f"^`gen.{name}` is not supported.$"):
            getattr(gen, name)(*args)
    with pytest.raises(TypeError, match="Serializing a ObjectRefGenerator is not allowed"):
        pickle.dumps(gen)
    assert [ray.get(r, timeout=GET_TIMEOUT) for r in gen] == [1]


def test_wait_on_a_generator_means_its_next_value(ray, tmp_path):
    """``wait([gen])`` is ready when ``next(gen)`` would return at once (Ray 2.60: ready
    while a value is there, not ready after it was taken and before the next one)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    def paced():
        yield 1
        wait_for_gate(gate, 60)
        yield 2

    gen = paced.remote()
    ready, not_ready = ray.wait([gen], timeout=GET_TIMEOUT)
    assert ready == [gen] and not_ready == []
    next(gen)
    ready, not_ready = ray.wait([gen], timeout=0)
    assert ready == [] and not_ready == [gen]
    open_gate(gate)
    ready, _ = ray.wait([gen], timeout=GET_TIMEOUT)
    assert ready == [gen]
    assert [ray.get(r, timeout=GET_TIMEOUT) for r in gen] == [2]
    ready, _ = ray.wait([gen], timeout=0)
    assert ready == [gen]  # finished: next() raises StopIteration at once


def test_large_values_stream_through_shared_memory_and_are_freed(ray):
    """Values of 800 KB each (segments) stream and are freed once their refs are gone."""
    @ray.remote
    def arrays(n):
        for i in range(n):
            yield np.full(100_000, i, dtype=np.float64)

    store = runtime.current().store
    gen = arrays.remote(4)
    sums = [float(ray.get(ref, timeout=GET_TIMEOUT).sum()) for ref in gen]
    assert sums == [0.0, 100_000.0, 200_000.0, 300_000.0]
    del gen
    assert _settled(lambda: store.statistics()["objects"] == 0), store.statistics()
    assert _owner().statistics()["streams"] == 0


# ----------------------------------------------------------------------------- async
def test_async_for_over_a_task_and_await_of_each_value(ray):
    """``async for ref in gen`` ends cleanly and ``await ref`` gives each value; the error
    value raises when awaited (Ray 2.60: ``[0, 1, 2]``, then ``[0, 'RayTaskError(ValueError)']``
    for a generator that raises)."""
    @ray.remote
    def count(n):
        yield from range(n)

    @ray.remote
    def broken():
        yield 0
        raise ValueError("x")

    async def main():
        values = [await ref async for ref in count.remote(3)]
        errors = []
        async for ref in broken.remote():
            try:
                errors.append(await ref)
            except ValueError as error:
                errors.append(type(error).__name__)
        return values, errors

    values, errors = asyncio.run(asyncio.wait_for(main(), GET_TIMEOUT))
    assert values == [0, 1, 2]
    assert errors == [0, "RayTaskError(ValueError)"]


# ----------------------------------------------------------------------------- actors
def test_sync_actor_generator_streams_and_its_error_names_the_actor(ray, tmp_path):
    """A generator method streams (first value while the method sleeps) and its exception is
    the last value, a RayTaskError naming the actor (Ray 2.60: ``[0, 1, RayTaskError(KeyError)
    ... ray::A.g() (pid=..., actor_id=..., repr=...)]``)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    class A:
        def g(self, n):
            for i in range(n):
                yield i
                wait_for_gate(gate, 60)
            raise KeyError("k")

    actor = A.remote()
    gen = actor.g.remote(2)
    assert isinstance(gen, ray.ObjectRefGenerator)
    assert ray.get(next(gen), timeout=GET_TIMEOUT) == 0
    assert not _completed_now(gen)
    open_gate(gate)
    values = []
    for ref in gen:
        try:
            values.append(ray.get(ref, timeout=GET_TIMEOUT))
        except KeyError as error:
            values.append(type(error).__name__)
            assert "A.g()" in str(error) and "actor_id=" in str(error)
    assert values == [1, "RayTaskError(KeyError)"]


def test_async_actor_async_generator_streams(ray, tmp_path):
    """An async generator method of an async actor streams, also to ``async for`` (Ray
    2.60: the first value came in 7 ms; then ``[1, RayTaskError(ValueError)]``)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    class B:
        async def g(self, n, gate=None):
            for i in range(n):
                yield i
                while gate and not os.path.exists(gate):  # held until the test opens it
                    await asyncio.sleep(0.01)
            raise ValueError("v")

    actor = B.remote()
    gen = actor.g.remote(2, gate)
    assert ray.get(next(gen), timeout=GET_TIMEOUT) == 0
    assert not _completed_now(gen)
    open_gate(gate)
    values = []
    for ref in gen:
        try:
            values.append(ray.get(ref, timeout=GET_TIMEOUT))
        except ValueError as error:
            values.append(type(error).__name__)
    assert values == [1, "RayTaskError(ValueError)"]

    async def consume():
        return [await ref async for ref in actor.g.remote(0)]

    with pytest.raises(ValueError):  # the only value is the error
        asyncio.run(asyncio.wait_for(consume(), GET_TIMEOUT))


def test_generator_method_with_a_number_of_returns_is_not_streamed(ray):
    """``@method(num_returns=2)`` on a generator method: two plain refs (Ray 2.60: the
    same for tasks, ``num_returns=2`` gave ``[1, 2]``)."""
    @ray.remote
    class C:
        @ray.method(num_returns=2)
        def two(self):
            yield 1
            yield 2

    refs = C.remote().two.remote()
    assert isinstance(refs, list) and len(refs) == 2  # not an ObjectRefGenerator
    assert ray.get(refs, timeout=GET_TIMEOUT) == [1, 2]


def _outcomes(ray, refs) -> list:
    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=GET_TIMEOUT))
        except exceptions.RayTaskError as error:
            out.append(str(error).splitlines()[-1])
    return out


# Ray 2.60, each row run there with the same generator (a task and a sync actor method
# alike): what each of the N refs of ``g.options(num_returns=N).remote(n, fail)`` gives,
# ``g`` yielding 0..n-1, then raising ValueError("boom") when ``fail``. miniray failed every
# ref when the generator raised at any point, and for any count but N.
_BOOM = "ValueError: boom"
_STATIC_ROWS = [
    ((2, True), 4, [0, 1, _BOOM, _BOOM]),
    ((4, True), 4, [0, 1, 2, 3]),  # raised after the last return: only logged
    ((2, False), 4, [0, 1] + ["ValueError: Task returned 2 objects, but num_returns=4."] * 2),
    ((5, False), 4, [0, 1, 2, 3]),  # one value too many: only logged
    ((0, True), 2, [_BOOM, _BOOM]),
    ((1, True), 1, [0]),
    ((0, False), 1, ["ValueError: Task returned 0 objects, but num_returns=1."]),
    ((2, False), 1, [0]),
]


@pytest.mark.parametrize("where", ["task", "actor", "async actor"])
def test_a_generator_with_a_number_of_returns_gives_what_it_yielded(ray, capfd, where):
    def g(n, fail):
        yield from range(n)
        if fail:
            raise ValueError("boom")

    async def ag(self, n, fail):
        for i in range(n):
            yield i
        if fail:
            raise ValueError("boom")

    task = ray.remote(g)
    actor = ray.remote(type("Gen", (), {"g": lambda self, n, fail: g(n, fail)})).remote()
    async_actor = ray.remote(type("AGen", (), {"g": ag})).remote()
    for args, n, expected in _STATIC_ROWS:
        if where == "task":
            refs = task.options(num_returns=n).remote(*args)
        else:
            refs = (actor if where == "actor" else async_actor).g.options(
                num_returns=n).remote(*args)
        refs = [refs] if n == 1 else refs
        assert _outcomes(ray, refs) == expected, (args, n)
    # What came after the N returns is printed by the worker, as Ray logs it.
    err = []

    def printed() -> bool:
        err.append(capfd.readouterr().err)
        text = "".join(err)
        return ("the generator yields more than num_returns=4 values" in text
                and "the generator raised after its 4 returns were taken" in text
                and "ValueError: boom" in text)

    assert wait_until(printed, 10), "".join(err)


def test_a_generator_with_one_return_gives_its_first_value(ray):
    """``num_returns=1`` on a generator function is one return, its first value (Ray 2.60:
    0 and 5); miniray gave the list of all values."""

    @ray.remote(num_returns=1)
    def five():
        yield 5

    @ray.remote
    def count(n):
        yield from range(n)

    assert ray.get(five.remote(), timeout=GET_TIMEOUT) == 5
    assert ray.get(count.options(num_returns=1).remote(3), timeout=GET_TIMEOUT) == 0


def test_a_dynamic_generators_error_is_its_last_ref(ray):
    """Ray 2.60 (its generators page, checked there): with ``num_returns="dynamic"`` the
    values yielded before an exception are kept, and the exception is stored in one more
    ref after them; miniray failed the call's own ref."""

    @ray.remote
    def g():
        yield 0
        yield 1
        raise ValueError("late")

    with pytest.warns(RayDeprecationWarning):
        dynamic = g.options(num_returns="dynamic")
    refs = list(ray.get(dynamic.remote(), timeout=GET_TIMEOUT))
    assert len(refs) == 3
    assert ray.get(refs[:2], timeout=GET_TIMEOUT) == [0, 1]
    with pytest.raises(ValueError, match="late") as info:
        ray.get(refs[2], timeout=GET_TIMEOUT)
    assert isinstance(info.value, exceptions.RayTaskError)


# ----------------------------------------------------------------------------- failures
def test_a_streaming_task_retried_after_a_crash_gives_each_value_once(ray, tmp_path):
    """The worker dies after two values; the retry yields them again and the consumer gets
    each once (Ray 2.60: ``[0, 1, 2]``). Without retries the crash is the last value (Ray
    2.60: ``[0, 'WorkerCrashedError']``)."""
    marker = str(tmp_path / "crashed")

    @ray.remote(max_retries=1)
    def flaky(path):
        yield 0
        yield np.full(20_000, 1)  # a segment: the retry writes the same name again
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        yield 2

    values = [ray.get(r, timeout=GET_TIMEOUT) for r in flaky.remote(marker)]
    assert values[0] == 0 and values[1][0] == 1 and values[2] == 2 and len(values) == 3

    @ray.remote(max_retries=0)
    def dies():
        yield 0
        os._exit(1)

    outcome = []
    for ref in dies.remote():
        try:
            outcome.append(ray.get(ref, timeout=GET_TIMEOUT))
        except exceptions.WorkerCrashedError as error:
            outcome.append(type(error).__name__)
    assert outcome == [0, "WorkerCrashedError"]


# ----------------------------------------------------------------------------- nesting
def test_a_task_iterates_a_nested_generator_on_one_cpu(ray_start):
    """A task consuming its child's stream blocks like a ``get()`` (its CPU goes back), so
    the child can run even with one CPU."""
    ray_start(num_cpus=1)

    @miniray.remote
    def child(n):
        for i in range(n):
            yield i
            time.sleep(0.05)

    @miniray.remote
    def parent(n):
        return [miniray.get(ref) * 2 for ref in child.remote(n)]

    assert miniray.get(parent.remote(4), timeout=GET_TIMEOUT) == [0, 2, 4, 6]


# ----------------------------------------------------------------------------- lifetimes
def test_cancel_of_a_streaming_generator_leaks_nothing(ray):
    """Cancelled after its first value: the next ref raises TaskCancelledError, then
    StopIteration; ``completed()`` raises it too (Ray 2.60: ``RayTaskError(TaskCancelledError)``
    on both). Nothing is left in the store or the streams."""
    @ray.remote
    def endless():
        i = 0
        while True:
            yield i
            i += 1
            time.sleep(0.2)

    store = runtime.current().store
    gen = endless.remote()
    assert ray.get(next(gen), timeout=GET_TIMEOUT) == 0
    ray.cancel(gen)
    outcome = []
    for ref in gen:
        try:
            outcome.append(ray.get(ref, timeout=GET_TIMEOUT))
        except exceptions.TaskCancelledError:
            outcome.append("cancelled")
    assert outcome[-1] == "cancelled" and all(isinstance(v, int) for v in outcome[:-1])
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(gen.completed(), timeout=GET_TIMEOUT)
    del gen, ref
    assert _settled(lambda: store.statistics()["objects"] == 0), store.statistics()
    assert _owner().statistics()["streams"] == 0


def test_a_dropped_generator_runs_on_and_its_values_are_freed(ray, tmp_path):
    """The consumer drops the generator after one value: the task runs to its end, as in Ray
    2.60 (all five lines written), and every value it yielded is freed."""
    path = tmp_path / "side.txt"

    @ray.remote
    def side(path):
        for i in range(5):
            with open(path, "a") as f:
                f.write(f"{i}\n")
            yield np.full(20_000, i)  # 160 KB: segments, so a leak would show in /dev/shm
            time.sleep(0.1)

    store = runtime.current().store
    gen = side.remote(str(path))
    assert ray.get(next(gen), timeout=GET_TIMEOUT)[0] == 0
    done = gen.completed()
    del gen
    gc.collect()
    assert ray.get(done, timeout=GET_TIMEOUT) is None
    assert path.read_text().split() == ["0", "1", "2", "3", "4"]
    del done
    assert _settled(lambda: store.statistics()["objects"] == 0), store.statistics()
    assert _owner().statistics()["streams"] == 0


def test_a_generator_dropped_before_its_first_value(ray):
    """Nothing is held for a generator nobody can iterate any more."""
    @ray.remote
    def few():
        time.sleep(0.3)
        yield from range(3)

    store = runtime.current().store
    done = few.remote().completed()
    assert ray.get(done, timeout=GET_TIMEOUT) is None
    del done
    assert _settled(lambda: store.statistics()["objects"] == 0), store.statistics()
    assert _owner().statistics()["streams"] == 0


# ----------------------------------------------------------------------------- dynamic
def test_dynamic_returns_one_ref_holding_a_dynamic_generator(ray):
    """``num_returns="dynamic"``: Ray 2.60's RayDeprecationWarning (exact text, at the
    decorator's line), one ObjectRef whose value is a DynamicObjectRefGenerator of refs,
    iterable once, with ``len``; the class is at Ray's import paths."""
    from miniray._private.object_ref_generator import DynamicObjectRefGenerator

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @ray.remote(num_returns="dynamic")
        def dyn(n):
            yield from range(n)
        line = dyn.__wrapped__.__code__.co_firstlineno  # a decorated def starts there

    # Python 3.9 reports a decorator call at the ``def`` line, later versions at the
    # decorator's own line: either is the user's line.
    assert [(w.category, str(w.message), w.filename) for w in caught] == [(
        RayDeprecationWarning,
        "num_returns='dynamic' is deprecated and will be removed in a future Ray release. "
        "Use num_returns='streaming' instead.", __file__)]
    assert caught[0].lineno in (line, line + 1)
    ref = dyn.remote(3)
    assert isinstance(ref, ray.ObjectRef)
    value = ray.get(ref, timeout=GET_TIMEOUT)
    assert isinstance(value, ray.DynamicObjectRefGenerator)
    assert ray.DynamicObjectRefGenerator is DynamicObjectRefGenerator
    assert len(value) == 3
    refs = list(value)
    assert [ray.get(r, timeout=GET_TIMEOUT) for r in refs] == [0, 1, 2]
    assert list(value) == []  # handed out once, as Ray's

    @ray.remote
    def plain(n):
        yield from range(n)

    with pytest.warns(RayDeprecationWarning):
        options = plain.options(num_returns="dynamic")
    assert [ray.get(r, timeout=GET_TIMEOUT)
            for r in ray.get(options.remote(2), timeout=GET_TIMEOUT)] == [0, 1]


def test_dynamic_values_live_as_long_as_the_generator_value(ray):
    """The values are held by the object that holds their refs, then freed with it."""
    with pytest.warns(RayDeprecationWarning):
        @ray.remote(num_returns="dynamic")
        def dyn():
            yield np.ones(50_000)
            yield 2

    store = runtime.current().store
    ref = dyn.remote()
    refs = list(ray.get(ref, timeout=GET_TIMEOUT))
    del ref
    gc.collect()
    assert ray.get(refs[0], timeout=GET_TIMEOUT).sum() == 50_000
    del refs
    assert _settled(lambda: store.statistics()["objects"] == 0), store.statistics()


# ----------------------------------------------------------------------------- node actors
def test_a_named_actor_on_a_node_streams_to_the_driver(node_env, tmp_path):
    """A named actor lives in the node's actor service: its generator method's values still
    reach the calling driver as they are yielded (SVC_YIELD), large ones through shared
    memory, its exception last; nothing is left in the driver's store."""
    started = cli(node_env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    proc = driver("""
        import gc, json, os, time
        import numpy as np
        import miniray as ray
        from miniray._private import runtime
        ray.init(address="auto")

        @ray.remote
        class Streamer:
            def values(self, gate):
                yield 1
                deadline = time.monotonic() + 60  # held until the driver opens the gate
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.01)
                yield np.ones(200_000)
                raise ValueError("last")

        actor = Streamer.options(name="streamer").remote()
        gate = os.environ["GATE"]
        gen = actor.values.remote(gate)
        first = ray.get(next(gen), timeout=30)
        early = not ray.wait([gen.completed()], timeout=0)[0]
        open(gate, "w").close()
        rest = []
        for ref in gen:
            try:
                rest.append(float(ray.get(ref, timeout=30).sum()))
            except ValueError as error:
                rest.append(type(error).__name__)
        del gen, ref
        gc.collect()
        store = runtime.current().store
        deadline = time.monotonic() + 10
        while store.statistics()["objects"] and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"first": first, "early": early, "rest": rest,
                          "left": store.statistics()["objects"]}), flush=True)
        ray.kill(actor)
        ray.shutdown()
    """, node_env, GATE=str(tmp_path / "gate"))
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    result = json.loads(lines[-1])
    assert result == {"first": 1, "early": True,
                      "rest": [200_000.0, "RayTaskError(ValueError)"], "left": 0}, err[-3000:]
