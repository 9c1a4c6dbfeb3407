"""Actors: creation and calls, ordering, handles, methods, resources, names, concurrency, async,
output, cancel, the runtime context, handle counting, GPUs, infeasible actors and shutdown.

Failures (kill, exit, restarts, constructor errors) are in ``test_actor_failures.py``.
Ray 2.60 behaviour: ray-api-surface.md §2.3 (default resources), §2.7 (``ray.method``), §2.9
(actor specifics), §3.4 (cancel), §3.5 (``get_actor``), §3.8 (runtime context).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import pickle
import threading
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private.host import procinfo

from .helpers import open_gate, wait_until

GET_TIMEOUT = 30


@pytest.fixture
def Recorder(ray):
    @ray.remote
    class Recorder:
        def __init__(self, start=0):
            self.items = [] if start == 0 else [start]

        def add(self, item):
            self.items.append(item)
            return len(self.items)

        def items_(self):
            return list(self.items)

        def pid(self):
            return os.getpid()

        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

    return Recorder


# ----------------------------------------------------------------------------- basics
def test_create_and_call(ray, Recorder):
    actor = Recorder.remote()
    assert ray.get(actor.add.remote("a"), timeout=GET_TIMEOUT) == 1
    assert ray.get(actor.add.remote("b"), timeout=GET_TIMEOUT) == 2
    assert ray.get(actor.items_.remote(), timeout=GET_TIMEOUT) == ["a", "b"]
    # each actor is its own process, with its own state
    other = Recorder.remote(7)
    assert ray.get(other.items_.remote(), timeout=GET_TIMEOUT) == [7]
    pids = ray.get([actor.pid.remote(), other.pid.remote()], timeout=GET_TIMEOUT)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert repr(actor).startswith("Actor(Recorder, ") and len(actor._actor_id_hex()) == 32
    assert hash(actor) == hash(pickle.loads(pickle.dumps(actor)))
    with pytest.raises(TypeError, match="cannot be called directly"):
        actor.add("x")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        actor.nope  # noqa: B018


def test_calls_from_one_caller_run_in_submission_order(ray, Recorder):
    actor = Recorder.remote()
    for i in range(200):
        actor.add.remote(i)
    assert ray.get(actor.items_.remote(), timeout=GET_TIMEOUT) == list(range(200))


def test_order_holds_behind_a_call_waiting_on_a_pending_argument(ray, Recorder):
    @ray.remote
    def later(value):
        time.sleep(0.3)
        return value

    actor = Recorder.remote()
    actor.add.remote("first")
    actor.add.remote(later.remote("from a task"))  # its argument is not ready yet
    for i in range(20):
        actor.add.remote(i)
    assert ray.get(actor.items_.remote(), timeout=GET_TIMEOUT) == (
        ["first", "from a task"] + list(range(20))
    )


def test_handles_are_passed_to_tasks_and_actors_and_used_there(ray, Recorder):
    @ray.remote
    def use(handle, value):
        return ray.get(handle.add.remote(value))

    @ray.remote
    class Forwarder:
        def __init__(self, handle):
            self.handle = handle

        def forward(self, value):
            return ray.get(self.handle.add.remote(value))

        def forward_nested(self, handles):
            return ray.get(handles[0].add.remote("nested"))

    actor = Recorder.remote()
    assert ray.get(use.remote(actor, "task"), timeout=GET_TIMEOUT) == 1
    forwarder = Forwarder.remote(actor)
    assert ray.get(forwarder.forward.remote("actor"), timeout=GET_TIMEOUT) == 2
    assert ray.get(forwarder.forward_nested.remote([actor]), timeout=GET_TIMEOUT) == 3
    assert ray.get(actor.items_.remote(), timeout=GET_TIMEOUT) == ["task", "actor", "nested"]


def test_method_num_returns_two(ray):
    @ray.remote
    class Splitter:
        @ray.method(num_returns=2)
        def split(self, x):
            return x, -x

        def pair(self):
            return (1, 2)

    actor = Splitter.remote()
    refs = actor.split.remote(5)
    assert isinstance(refs, list) and len(refs) == 2
    assert ray.get(refs, timeout=GET_TIMEOUT) == [5, -5]
    first, second = actor.pair.options(num_returns=2).remote()
    assert ray.get([first, second], timeout=GET_TIMEOUT) == [1, 2]
    assert ray.get(actor.pair.remote(), timeout=GET_TIMEOUT) == (1, 2)


def test_methods_returning_object_refs(ray):
    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    class Maker:
        def put(self, value):
            return ray.put(value)

        def launch(self, x):
            return square.remote(x)

        def several(self):
            return [ray.put(1), ray.put(2)]

    actor = Maker.remote()
    inner = ray.get(actor.put.remote("payload"), timeout=GET_TIMEOUT)
    assert isinstance(inner, ray.ObjectRef)
    assert ray.get(inner, timeout=GET_TIMEOUT) == "payload"
    assert ray.get(ray.get(actor.launch.remote(7), timeout=GET_TIMEOUT), timeout=GET_TIMEOUT) == 49
    refs = ray.get(actor.several.remote(), timeout=GET_TIMEOUT)
    assert ray.get(refs, timeout=GET_TIMEOUT) == [1, 2]


def test_ray_ready(ray, Recorder):
    actor = Recorder.remote()
    ref = actor.__ray_ready__.remote()
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref, timeout=GET_TIMEOUT) is True


def test_ray_call_runs_a_function_on_the_actor(ray):
    """Ray 2.60's built-in ``__ray_call__``: ``fn(actor, *args, **kwargs)`` run on the
    actor, for sync, threaded and async actors; the function's error comes back as a task
    error; a call without ``fn`` raises TypeError at ``.remote()`` (checked side by side
    with Ray 2.60, same script). miniray had no such method (AttributeError)."""

    @ray.remote
    class Counter:
        def __init__(self):
            self.count = 1

    @ray.remote(max_concurrency=3)
    class Threaded:
        def __init__(self):
            self.count = 7

    @ray.remote
    class Async:
        def __init__(self):
            self.count = 5

        async def f(self):
            return 1

    counter = Counter.remote()
    get = functools.partial(ray.get, timeout=GET_TIMEOUT)
    assert get(counter.__ray_call__.remote(lambda self: self.count)) == 1
    assert get(counter.__ray_call__.remote(lambda self, x, y=0: self.count + x + y, 10,
                                           y=5)) == 16

    def bump(self, by):
        self.count += by
        return self.count

    assert get(counter.__ray_call__.remote(bump, 2)) == 3
    assert get(counter.__ray_call__.remote(lambda self: self.count)) == 3
    assert get(Threaded.remote().__ray_call__.remote(lambda self: self.count)) == 7
    assert get(Async.remote().__ray_call__.remote(lambda self: self.count)) == 5
    with pytest.raises(ZeroDivisionError):
        get(counter.__ray_call__.remote(lambda self: 1 / 0))
    with pytest.raises(TypeError, match="missing a required argument: 'fn'"):
        counter.__ray_call__.remote()


@miniray.remote
def _late(value, path):
    """``value``, once the file gate ``path`` is open (``open_gate``)."""
    deadline = time.monotonic() + GET_TIMEOUT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return value


@pytest.mark.parametrize("kind", ["sync", "async", "threaded", "allow_out_of_order"])
def test_calls_waiting_for_an_argument_and_the_order_they_run_in(ray, tmp_path, kind):
    """Ray 2.60's task-orders page, checked there with these actors: a sync actor runs one
    submitter's calls in submission order, so a call waiting for an argument holds back the
    calls after it; an async or threaded actor, or one with
    ``allow_out_of_order_execution=True``, runs each call once its arguments are ready
    (``1 3 6`` against ``6 2 5`` for add(x), add(2), add(3) with x=1 late). miniray kept
    submission order for all four."""
    gate = str(tmp_path / "gate")

    class Counter:
        def __init__(self):
            self.value = 0

        def add(self, addition):
            self.value += addition
            return self.value

    class AsyncCounter(Counter):
        async def add(self, addition):
            self.value += addition
            return self.value

    options = {"threaded": {"max_concurrency": 2},
               "allow_out_of_order": {"allow_out_of_order_execution": True}}.get(kind, {})
    cls = ray.remote(AsyncCounter if kind == "async" else Counter)
    counter = cls.options(**options).remote()
    first = counter.add.remote(_late.remote(1, gate))
    second, third = counter.add.remote(2), counter.add.remote(3)
    if kind == "sync":
        assert ray.wait([second], timeout=0.5)[0] == []  # held back behind the first
        open_gate(gate)
        assert ray.get([first, second, third], timeout=GET_TIMEOUT) == [1, 3, 6]
    else:
        assert ray.get([second, third], timeout=GET_TIMEOUT) == [2, 5]
        open_gate(gate)
        assert ray.get(first, timeout=GET_TIMEOUT) == 6


def test_a_sync_actor_orders_calls_per_caller_not_across_callers(ray, tmp_path):
    """Ray 2.60 (its test_actor_pass_by_ref_order_optimization; the same script run there:
    the second caller's call answers at once): a call waiting for an argument holds back
    its own caller's later calls only. A task's call with a ready argument runs while the
    driver's call waits, and the driver's next call still runs after its first."""
    gate = str(tmp_path / "gate")

    @ray.remote
    class Log:
        def __init__(self):
            self.seen = []

        def add(self, item):
            self.seen.append(item)
            return list(self.seen)

    log = Log.remote()

    @ray.remote
    def other_caller():
        return ray.get(log.add.remote("task"), timeout=GET_TIMEOUT)

    first = log.add.remote(_late.remote("driver 1", gate))
    second = log.add.remote("driver 2")
    assert ray.get(other_caller.remote(), timeout=GET_TIMEOUT) == ["task"]  # not held back
    assert ray.wait([second], timeout=0.3)[0] == []  # the driver's own order holds
    open_gate(gate)
    assert ray.get([first, second], timeout=GET_TIMEOUT) == [
        ["task", "driver 1"], ["task", "driver 1", "driver 2"]]


# ----------------------------------------------------------------------------- resources
def _available(name: str) -> float:
    return miniray.available_resources().get(name, 0.0)


def test_actor_without_resource_options_holds_no_cpu(ray, Recorder):
    actors = [Recorder.remote() for _ in range(3)]  # more than the node's 2 CPUs
    assert ray.get([a.__ray_ready__.remote() for a in actors], timeout=GET_TIMEOUT)
    assert _available("CPU") == 2.0
    # and ordinary tasks still run beside them
    assert ray.get(ray.remote(lambda: 1).remote(), timeout=GET_TIMEOUT) == 1


def test_actor_with_num_cpus_holds_it_until_killed(ray, Recorder):
    actor = Recorder.options(num_cpus=1).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    assert _available("CPU") == 1.0
    assert ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    ray.kill(actor)
    assert wait_until(lambda: _available("CPU") == 2.0, timeout=10)


def test_fractional_gpu_actor_holds_half_a_gpu_and_no_cpu(ray_start):
    # miniray's documented difference: Ray would also hold 1 CPU here (§2.3)
    ray_start(num_cpus=2, num_gpus=1)

    @miniray.remote(num_gpus=0.5)
    class Half:
        def assigned(self):
            return miniray.get_runtime_context().get_assigned_resources()

    actors = [Half.remote() for _ in range(2)]
    assigned = miniray.get([a.assigned.remote() for a in actors], timeout=GET_TIMEOUT)
    assert assigned == [{"GPU": 0.5}, {"GPU": 0.5}]
    assert _available("GPU") == 0.0 and _available("CPU") == 2.0
    for actor in actors:
        miniray.kill(actor)
    assert wait_until(lambda: _available("GPU") == 1.0 and _available("CPU") == 2.0, timeout=10)


# ----------------------------------------------------------------------------- named actors
def test_named_actors(ray, Recorder):
    first = Recorder.options(name="rec").remote()
    ray.get(first.add.remote("x"), timeout=GET_TIMEOUT)
    again = Recorder.options(name="rec", get_if_exists=True).remote()
    assert again == first
    assert ray.get(again.items_.remote(), timeout=GET_TIMEOUT) == ["x"]
    with pytest.raises(exceptions.ActorAlreadyExistsError) as info:
        Recorder.options(name="rec").remote()
    assert isinstance(info.value, ValueError) and "rec" in str(info.value)
    looked_up = ray.get_actor("rec")
    assert looked_up == first
    assert ray.get(looked_up.items_.remote(), timeout=GET_TIMEOUT) == ["x"]
    with pytest.raises(ValueError, match="Failed to look up actor with name 'missing'"):
        ray.get_actor("missing")
    with pytest.raises(ValueError, match="non-empty"):
        ray.get_actor("")
    # Ray 2.60 raises TypeError for a name or namespace that is not a str ("expected bytes,
    # int found"); these name the argument.
    with pytest.raises(TypeError) as info:
        ray.get_actor(123)
    assert type(info.value) is TypeError
    assert str(info.value) == (
        "get_actor() expects the actor's name as a str, got int 123. Pass the name given "
        "with .options(name=...)."
    )
    with pytest.raises(TypeError, match=r"^namespace must be None or a string, got int 5\.$"):
        ray.get_actor("rec", namespace=5)
    with pytest.raises(ValueError):
        Recorder.options(name="").remote()


def test_a_named_actors_name_is_free_once_its_last_handle_is_gone(ray):
    """The named-actors page: a named actor whose handles are all gone is not found any
    more. Ray 2.60 (the same script, 3 runs): ``list_named_actors()`` is ``[]`` right after
    ``del``, ``get_actor`` raises ValueError, and the name can be taken again. miniray kept
    the name until the actor had exited and handed out a handle to the exiting actor."""

    @ray.remote
    class Counter:
        def ping(self):
            return 1

    for _ in range(3):
        counter = Counter.options(name="some_name").remote()
        assert ray.get(counter.ping.remote(), timeout=30) == 1
        assert ray.util.list_named_actors() == ["some_name"]
        del counter
        assert ray.util.list_named_actors() == []
        with pytest.raises(ValueError, match="Failed to look up actor with name 'some_name'"):
            ray.get_actor("some_name")
    keep = Counter.options(name="kept").remote()
    again = ray.get_actor("kept")
    del keep  # another handle remains: the name stays
    assert ray.get(again.ping.remote(), timeout=30) == 1
    assert ray.util.list_named_actors() == ["kept"]


def test_named_actors_in_namespaces(ray, Recorder):
    from miniray.util import list_named_actors

    here = Recorder.options(name="a").remote()
    there = Recorder.options(name="a", namespace="elsewhere").remote()  # no clash: other ns
    kept_b = Recorder.options(name="b", namespace="elsewhere").remote()  # noqa: F841 (held)
    assert here != there
    assert ray.get_actor("a", namespace="elsewhere") == there
    assert ray.get_actor("a") == here
    with pytest.raises(ValueError):
        ray.get_actor("b")  # only in "elsewhere"
    assert sorted(list_named_actors()) == ["a"]
    namespace = ray.get_runtime_context().namespace
    assert sorted(
        list_named_actors(all_namespaces=True), key=lambda d: (d["namespace"], d["name"])
    ) == sorted(
        [
            {"name": "a", "namespace": namespace},
            {"name": "a", "namespace": "elsewhere"},
            {"name": "b", "namespace": "elsewhere"},
        ],
        key=lambda d: (d["namespace"], d["name"]),
    )
    ray.kill(there)
    assert ray.get_actor("a") == here
    with pytest.raises(ValueError):
        ray.get_actor("a", namespace="elsewhere")  # a dead actor's name is free
    assert {"name": "a", "namespace": "elsewhere"} not in list_named_actors(True)


# ----------------------------------------------------------------------------- concurrency
def test_max_concurrency_runs_calls_in_threads(ray):
    # Each call waits at a barrier for the other three: they end only if all four run at
    # once (a bound on their wall time, as before, failed on a loaded machine).
    @ray.remote
    class Meeting:
        def __init__(self, parties):
            self.barrier = threading.Barrier(parties, timeout=GET_TIMEOUT)

        def meet(self):
            return self.barrier.wait()

    actor = Meeting.options(max_concurrency=4).remote(4)
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    arrivals = ray.get([actor.meet.remote() for _ in range(4)], timeout=GET_TIMEOUT)
    assert sorted(arrivals) == [0, 1, 2, 3]


def test_async_actor_runs_calls_concurrently_and_awaits_refs(ray):
    @ray.remote
    def double(x):
        return 2 * x

    @ray.remote
    class AsyncActor:
        def __init__(self):
            self.arrived = 0

        async def nap(self, i):  # ends once all ten calls are in at once, or fails
            if self.arrived == 0:
                self.all_in = asyncio.Event()  # made on the actor's loop
            self.arrived += 1
            if self.arrived == 10:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), GET_TIMEOUT)
            return i

        async def await_task(self, x):
            return await double.remote(x)

        async def await_nested(self, refs):
            return [await ref for ref in refs]

        def sync_method(self):
            return "sync"

    actor = AsyncActor.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    # concurrent, shown without timing them: each call waits for the other nine
    assert ray.get([actor.nap.remote(i) for i in range(10)], timeout=GET_TIMEOUT) == list(range(10))
    assert ray.get(actor.await_task.remote(21), timeout=GET_TIMEOUT) == 42
    assert ray.get(
        actor.await_nested.remote([ray.put(1), double.remote(2)]), timeout=GET_TIMEOUT
    ) == [1, 4]
    assert ray.get(actor.sync_method.remote(), timeout=GET_TIMEOUT) == "sync"


def test_calls_to_a_busy_actor_arrive_while_the_driver_only_waits(ray):
    """Calls sent while earlier ones are unanswered wait in the owner's outbox for the I/O
    thread (``Reactor.send_soon``): the one a running call waits for still gets there,
    with the driver doing nothing but wait, and a burst keeps its order."""

    @ray.remote
    class Gate:
        def __init__(self):
            self.opened = asyncio.Event()
            self.seen = []

        async def wait_open(self):
            await asyncio.wait_for(self.opened.wait(), 20)
            return "through"

        async def open(self):
            self.opened.set()

        async def note(self, i):
            self.seen.append(i)

        async def seen_calls(self):
            return self.seen

    gate = Gate.remote()
    ray.get(gate.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    waiting = gate.wait_open.remote()  # the actor is busy from here on
    gate.open.remote()  # held for the I/O thread, which must write it on its own
    assert ray.get(waiting, timeout=GET_TIMEOUT) == "through"
    blocker = gate.wait_open.remote()  # opened already: returns, but after the burst is sent
    ray.get([gate.note.remote(i) for i in range(500)] + [blocker], timeout=GET_TIMEOUT)
    assert ray.get(gate.seen_calls.remote(), timeout=GET_TIMEOUT) == list(range(500))


def test_refs_are_awaitable_in_an_asyncio_driver(ray, Recorder):
    actor = Recorder.remote()

    async def main():
        first = await actor.add.remote("a")
        results = await asyncio.gather(*(actor.add.remote(i) for i in range(5)))
        return first, results

    assert asyncio.run(main()) == (1, [2, 3, 4, 5, 6])


# ----------------------------------------------------------------------------- cancel
def test_cancel_queued_actor_call(ray, Recorder):
    actor = Recorder.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    running = actor.sleep.remote(1.0)
    queued = actor.add.remote("never")
    ray.cancel(queued)
    with pytest.raises(exceptions.TaskCancelledError) as info:
        ray.get(queued, timeout=GET_TIMEOUT)
    assert "canceled" in str(info.value) or "cancelled" in str(info.value)
    assert ray.get(running, timeout=GET_TIMEOUT) == 1.0
    # the cancelled call never ran, and the actor goes on
    assert ray.get(actor.items_.remote(), timeout=GET_TIMEOUT) == []


def test_cancel_force_on_actor_call_raises_value_error(ray, Recorder):
    actor = Recorder.remote()
    running = actor.sleep.remote(0.5)
    with pytest.raises(ValueError, match="force=True is not supported for actor tasks"):
        ray.cancel(running, force=True)
    assert ray.get(running, timeout=GET_TIMEOUT) == 0.5


def test_cancel_running_async_call(ray):
    @ray.remote
    class AsyncSleeper:
        async def nap(self, seconds):
            await asyncio.sleep(seconds)
            return seconds

    actor = AsyncSleeper.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    ref = actor.nap.remote(30)
    time.sleep(0.2)
    start = time.monotonic()
    ray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 15  # well under the 30 s nap: it was interrupted
    assert ray.get(actor.nap.remote(0), timeout=GET_TIMEOUT) == 0


# ----------------------------------------------------------------------------- context
def test_runtime_context_inside_an_actor(ray):
    @ray.remote
    class Introspect:
        def ids(self):
            ctx = ray.get_runtime_context()
            return ctx.get_actor_id(), ctx.get_actor_name(), ctx.get_assigned_resources()

        def me(self):
            return ray.get_runtime_context().current_actor

    actor = Introspect.options(name="intro").remote()
    actor_id, name, assigned = ray.get(actor.ids.remote(), timeout=GET_TIMEOUT)
    assert actor_id == actor._actor_id_hex()
    assert name == "intro"
    assert assigned == {}  # no resource options: holds nothing (§2.3)
    me = ray.get(actor.me.remote(), timeout=GET_TIMEOUT)
    assert me == actor
    assert ray.get(me.ids.remote(), timeout=GET_TIMEOUT)[0] == actor_id
    assert ray.get_runtime_context().get_actor_id() is None  # the driver
    # an unnamed actor's name is "" (Ray 2.60's test_ids), not None as outside an actor
    assert ray.get(Introspect.remote().ids.remote(), timeout=GET_TIMEOUT)[1] == ""


def test_task_name_and_function_name_inside_an_actor(ray):
    @ray.remote
    class Introspect:
        def ids(self):
            ctx = ray.get_runtime_context()
            return ctx.get_task_name(), ctx.get_task_function_name()

    actor = Introspect.remote()
    module = Introspect.__module__
    assert ray.get(actor.ids.remote(), timeout=GET_TIMEOUT) == (
        "Introspect.ids",
        f"{module}.Introspect.ids",
    )
    assert ray.get(actor.ids.options(name="custom").remote(), timeout=GET_TIMEOUT) == (
        "custom",
        f"{module}.Introspect.ids",
    )


def test_the_constructor_runs_as_the_actors_creation_task(ray):
    """In ``__init__`` the runtime context names the creation task, as Ray 2.60's (compared
    with Ray): id ``ff..ff<actor id>``, name ``Class.__init__`` (``<name>:Class.__init__``
    for a named actor), function ``<module>.Class.__init__``; calls then name their own."""
    @ray.remote
    class Introspect:
        def __init__(self):
            ctx = ray.get_runtime_context()
            self.seen = (ctx.get_task_id(), ctx.get_task_name(), ctx.get_task_function_name())

        def ids(self):
            return self.seen, ray.get_runtime_context().get_task_name()

    module = Introspect.__module__
    for options, name in (({}, "Introspect.__init__"),
                          ({"name": "intro"}, "intro:Introspect.__init__")):
        actor = Introspect.options(**options).remote()
        seen, call_name = ray.get(actor.ids.remote(), timeout=GET_TIMEOUT)
        assert seen == ("f" * 16 + actor._actor_id_hex(), name,
                        f"{module}.Introspect.__init__")
        assert call_name == "Introspect.ids"


def test_an_async_actors_constructor_runs_on_its_loop(ray):
    """Compared with Ray 2.60: an async actor's ``__init__`` runs on the loop its methods
    run on, so it may start a background task there and make asyncio objects (which on
    Python 3.9 belong to the loop current where they are made), and the runtime context
    still names the creation task. miniray ran it on the main thread, with no running
    loop: ``create_task`` raised, and an ``asyncio.Event`` made there failed on 3.9."""
    @ray.remote
    class Background:
        def __init__(self):
            self.loop = asyncio.get_running_loop()
            self.ready = asyncio.Event()
            self.task = asyncio.create_task(self._set_soon())
            self.name = ray.get_runtime_context().get_task_name()

        async def _set_soon(self):
            await asyncio.sleep(0.05)
            self.ready.set()

        async def check(self):
            await asyncio.wait_for(self.ready.wait(), 20)
            return asyncio.get_running_loop() is self.loop, self.task.done(), self.name

    actor = Background.remote()
    assert ray.get(actor.check.remote(), timeout=GET_TIMEOUT) == (
        True, True, "Background.__init__")

    @ray.remote
    class Failing:
        def __init__(self):
            raise ValueError("no loop needed to fail")

        async def f(self):
            return 1

    with pytest.raises(exceptions.ActorDiedError, match="no loop needed to fail"):
        ray.get(Failing.remote().f.remote(), timeout=GET_TIMEOUT)


# ----------------------------------------------------------------------------- lifetime
def test_actor_exits_when_its_last_handle_is_dropped(ray, Recorder):
    actor = Recorder.remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    assert procinfo.is_alive(pid)
    del actor
    gc.collect()
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=30), (
        f"actor pid {pid} still alive after its last handle was dropped"
    )


@pytest.mark.parametrize("kind", ["sync", "threaded", "async"])
def test_calls_sent_before_the_last_handle_went_return_their_values(ray, kind):
    """Compared with Ray 2.60: ``get(Actor.remote().f.remote())`` returns, and so do calls
    still waiting for their turn when the handle goes (async, ``max_concurrency=1``: one
    runs, two wait); the actor ends after them. miniray's async actors skipped the calls
    not started yet (ActorDiedError)."""
    options = {"max_concurrency": 1 if kind != "threaded" else 2}

    if kind == "async":
        @ray.remote(**options)
        class Slow:
            async def work(self, i):
                await asyncio.sleep(0.2)
                return i

            async def pid(self):
                return os.getpid()
    else:
        @ray.remote(**options)
        class Slow:
            def work(self, i):
                time.sleep(0.2)
                return i

            def pid(self):
                return os.getpid()

    assert ray.get(Slow.remote().work.remote(7), timeout=GET_TIMEOUT) == 7
    actor = Slow.remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    refs = [actor.work.remote(i) for i in range(3)]
    del actor
    assert ray.get(refs, timeout=GET_TIMEOUT) == [0, 1, 2]
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=30)


def test_actor_exits_at_its_last_handle_without_a_gc_pass(ray, Recorder):
    """Methods looked up on a handle (cached per handle and name) make no cycle: with the
    collector off, dropping the last handle ends the actor. A method kept in a variable
    keeps its handle, as in Ray: the actor lives, and answers, until that goes too."""
    gc.disable()
    try:
        actor = Recorder.remote()
        pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
        for item in range(3):
            ray.get(actor.add.remote(item), timeout=GET_TIMEOUT)
        assert actor.add is not actor.add  # a fresh method each time, on a shared spec
        assert actor.add._spec is actor.add._spec
        assert ray.get(actor.add.options(name="named").remote(3), timeout=GET_TIMEOUT) == 4
        kept = actor.items_
        del actor
        time.sleep(0.3)
        assert procinfo.is_alive(pid)
        assert ray.get(kept.remote(), timeout=GET_TIMEOUT) == [0, 1, 2, 3]
        del kept
        assert wait_until(lambda: not procinfo.is_alive(pid), timeout=30), (
            f"actor pid {pid} still alive after its last handle was dropped, no GC pass")
    finally:
        gc.enable()


def test_actor_whose_handles_are_gone_exits_and_returns_its_resources(ray, Recorder):
    actor = Recorder.options(num_cpus=1).remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    queued = actor.sleep.remote(0.3)  # a queued call still runs: the actor exits after it
    del actor
    gc.collect()
    assert ray.get(queued, timeout=GET_TIMEOUT) == 0.3

    @ray.remote(num_cpus=0)
    def nudge():
        return 1

    def gone():
        ray.get(nudge.remote(), timeout=GET_TIMEOUT)  # activity applies drops too
        return not procinfo.is_alive(pid) and _available("CPU") == 2.0

    assert wait_until(gone, timeout=10, interval=0.1), f"actor pid {pid} still alive"


def test_a_pickled_method_calls_its_actor(ray, Recorder):
    actor = Recorder.remote()
    copied = pickle.loads(pickle.dumps(actor.add.options(name="renamed")))
    assert (copied._name, copied._call_name, copied._handle) == ("add", "renamed", actor)
    assert ray.get(copied.remote("x"), timeout=GET_TIMEOUT) == 1


def test_actor_whose_handle_was_passed_to_a_task_stays_alive(ray, Recorder):
    @ray.remote
    def keep(handle):
        return ray.get(handle.add.remote("from task"))

    actor = Recorder.remote()
    assert ray.get(keep.remote(actor), timeout=GET_TIMEOUT) == 1
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    copy = pickle.loads(pickle.dumps(actor))
    del actor
    gc.collect()
    time.sleep(0.2)
    assert ray.get(copy.add.remote("still here"), timeout=GET_TIMEOUT) == 2
    assert procinfo.is_alive(pid)


def test_an_actor_a_task_made_exits_when_the_task_drops_its_last_handle(ray, Recorder):
    # Ray's rule wherever the handle was made: a named (not detached) actor too; one whose
    # handle the task returned is kept (the driver now holds it).
    @ray.remote
    def make(name, give):
        handle = Recorder.options(name=name).remote() if name else Recorder.remote()
        pid = ray.get(handle.pid.remote())
        return (pid, handle) if give else (pid, None)

    made = ray.get([make.remote(None, False), make.remote("made-in-task", False)],
                   timeout=GET_TIMEOUT)
    pid_kept, kept = ray.get(make.remote(None, True), timeout=GET_TIMEOUT)
    for pid, _ in made:
        assert wait_until(lambda pid=pid: not procinfo.is_alive(pid), timeout=10), (
            f"actor pid {pid} still alive after the task that made it dropped its handle")
    assert ray.get(kept.add.remote("x"), timeout=GET_TIMEOUT) == 1
    assert procinfo.is_alive(pid_kept)
    with pytest.raises(ValueError):
        ray.get_actor("made-in-task")


def test_an_actor_held_by_an_actor_lives_while_that_actor_holds_it(ray, Recorder):
    @ray.remote
    class Keeper:
        def __init__(self):
            self.child = Recorder.remote()

        def child_pid(self):
            return ray.get(self.child.pid.remote())

        def drop(self):
            self.child = None

    keeper = Keeper.remote()
    pid = ray.get(keeper.child_pid.remote(), timeout=GET_TIMEOUT)
    time.sleep(0.3)
    assert procinfo.is_alive(pid)
    ray.get(keeper.drop.remote(), timeout=GET_TIMEOUT)
    assert wait_until(lambda: not procinfo.is_alive(pid), timeout=10)


# ----------------------------------------------------------------------------- GPUs
def test_gpu_actors_see_their_own_device(ray_start):
    ray_start(num_cpus=2, num_gpus=2)

    @miniray.remote(num_gpus=1)
    class GpuActor:
        def devices(self):
            return os.environ.get("CUDA_VISIBLE_DEVICES"), miniray.get_gpu_ids()

    actors = [GpuActor.remote() for _ in range(2)]
    seen = sorted(miniray.get([a.devices.remote() for a in actors], timeout=GET_TIMEOUT))
    assert seen == [("0", [0]), ("1", [1])]
    assert _available("GPU") == 0.0
    # the device stays the actor's for its life
    assert sorted(miniray.get([a.devices.remote() for a in actors], timeout=GET_TIMEOUT)) == seen


def test_infeasible_actor_warns_and_its_calls_stay_pending(ray, capfd):
    @ray.remote(resources={"unicorn": 2})
    class Impossible:
        def f(self):
            return 1

    capfd.readouterr()
    actor = Impossible.remote()
    ref = actor.f.remote()
    # Printed by the placement pass the creation starts (an event, no timer): polled with
    # a bound for a loaded machine, not timed (a 2 s bound measured only the load).
    seen = []
    assert wait_until(lambda: seen.append(capfd.readouterr().err)
                      or "unicorn" in "".join(seen), timeout=30), seen
    ready, not_ready = ray.wait([ref], timeout=0.5)
    assert ready == [] and not_ready == [ref]


# ----------------------------------------------------------------------------- output
ACTOR_OUTPUT_DRIVER = """
    import os, sys
    import miniray as ray

    ray.init(num_cpus=1)

    @ray.remote
    class Talker:
        def __init__(self):
            print("constructed")

        def speak(self, text):
            print(text)
            print("to stderr", file=sys.stderr)
            return os.getpid()

    @ray.remote
    class Returner:
        def __init__(self):
            return 42

        def ok(self):
            return "works"

    talker = Talker.remote()
    pid = ray.get(talker.speak.remote("hello from actor"), timeout=60)
    # Whole lines in one write each: print() writes its parts one by one, and the I/O
    # thread may forward the actor's lines (which can come after its result) in between.
    sys.stdout.write(f"PID {pid}\\n")
    sys.stdout.write(f"RETURNER {ray.get(Returner.remote().ok.remote(), timeout=60)}\\n")
    sys.stdout.flush()
    ray.shutdown()
"""


def test_actor_output_is_prefixed_and_init_returning_a_value_warns(drivers):
    result = drivers.run(ACTOR_OUTPUT_DRIVER, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    pid = int(next(line for line in out if line.startswith("PID "))[4:])
    assert f"(Talker pid={pid}) constructed" in out
    assert f"(Talker pid={pid}) hello from actor" in out
    assert f"(Talker pid={pid}) to stderr" in result.stderr.splitlines()
    # __init__ returning a value: the actor works and the driver is warned, as in Ray
    assert "RETURNER works" in out
    assert any("Returner" in line and "__init__" in line for line in result.stderr.splitlines())


# ----------------------------------------------------------------------------- shutdown
def test_shutdown_with_live_actors_leaves_nothing_behind(ray, Recorder):
    @ray.remote
    class Napper:
        async def nap(self, seconds):
            await asyncio.sleep(seconds)

    idle = Recorder.remote()
    busy = Recorder.options(num_cpus=1).remote()
    napper = Napper.remote()
    ray.get(
        [idle.__ray_ready__.remote(), busy.__ray_ready__.remote(), napper.__ray_ready__.remote()],
        timeout=GET_TIMEOUT,
    )
    busy.sleep.remote(60)
    napper.nap.remote(60)
    time.sleep(0.2)
    start = time.monotonic()
    ray.shutdown()  # the ray fixture then checks that no process or file is left
    assert time.monotonic() - start < 10


# ----------------------------------------------------------------------------- call signatures
def test_bad_constructor_and_method_calls_raise_type_error_at_remote(ray):
    """Compared with Ray 2.60: actor creation and method calls bind the arguments to the
    signature at ``.remote()`` and raise TypeError at once (Ray: bind's text alone; miniray
    adds the call and the signature). A class without ``__init__`` takes no arguments."""

    @ray.remote
    class Acc:
        def __init__(self, start, *, step=1):
            self.value = start

        def add(self, a, b=0):
            self.value += a + b
            return self.value

    @ray.remote
    class Bare:
        def ping(self):
            return "pong"

    with pytest.raises(TypeError) as info:
        Acc.remote()
    assert str(info.value) == (
        "Acc.remote() got invalid arguments: missing a required argument: 'start'. "
        "The signature is Acc(start, *, step=1)."
    )
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'stride'"):
        Acc.options(name="acc-bad").remote(1, stride=2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        Bare.remote(1)
    assert ray.util.list_named_actors() == []

    acc = Acc.remote(10, step=2)
    with pytest.raises(TypeError) as info:
        acc.add.remote(1, 2, 3)
    assert str(info.value) == (
        "Acc.add.remote() got invalid arguments: too many positional arguments. "
        "The signature is Acc.add(a, b=0)."
    )
    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        acc.add.options(name="named-call").remote(b=1)
    with pytest.raises(TypeError, match="too many positional arguments"):
        acc.__ray_ready__.remote(1)
    # Nothing was submitted by the refused calls: the first call sees the initial value.
    assert ray.get(acc.add.remote(1, b=1), timeout=GET_TIMEOUT) == 12


def test_handles_that_travel_check_calls_too(ray):
    """A handle pickled into a task, or looked up by name, carries the signatures."""

    @ray.remote
    class Echo:
        def say(self, word):
            return word

    echo = Echo.options(name="echo").remote()

    @ray.remote
    def misuse(handle):
        try:
            handle.say.remote()
        except TypeError as error:
            return str(error)

    assert ray.get(misuse.remote(echo), timeout=GET_TIMEOUT).startswith(
        "Echo.say.remote() got invalid arguments: missing a required argument: 'word'."
    )
    with pytest.raises(TypeError, match="too many positional arguments"):
        ray.get_actor("echo").say.remote(1, 2)
    assert ray.get(ray.get_actor("echo").say.remote("hi"), timeout=GET_TIMEOUT) == "hi"


def test_method_num_returns_mismatch_names_what_was_returned(ray):
    """Compared with Ray 2.60: RayTaskError(TypeError) in every ref, as for a task."""

    @ray.remote
    class Pair:
        @ray.method(num_returns=2)
        def split(self):
            return 5

    first, second = Pair.remote().split.remote()
    for ref in (first, second):
        with pytest.raises(TypeError) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        assert isinstance(info.value, exceptions.RayTaskError)
        assert "Task returned int 5, but num_returns=2 expects a sequence of 2 values" in str(
            info.value)


def test_async_call_task_names_follow_each_calls_name(ray):
    # The actor works out a call's task and function names once per (method, call name)
    # and forgets them after 256 pairs: a name given per call is still the one it sees.
    @ray.remote
    class Named:
        async def name(self):
            ctx = miniray.get_runtime_context()
            return ctx.get_task_name(), ctx.get_task_function_name()

    actor = Named.remote()
    plain = ray.get(actor.name.remote(), timeout=GET_TIMEOUT)
    assert plain[0] == "Named.name" and plain[1].endswith("Named.name")
    names = ray.get([actor.name.options(name=f"call-{i}").remote() for i in range(300)],
                    timeout=GET_TIMEOUT)
    assert [n for n, _f in names] == [f"call-{i}" for i in range(300)]
    assert {f for _n, f in names} == {plain[1]}
    assert ray.get(actor.name.remote(), timeout=GET_TIMEOUT) == plain


def test_an_actors_methods_read_its_class_attributes_through_the_actor_class(ray):
    """Inside the actor, the module's name of the class is the actor class: its constants
    and static methods are read through it, as in Ray 2.60 (``(3, 2, 5)``)."""

    class Base:
        BASE = 2

    @ray.remote
    class Limits(Base):
        LIMIT = 3

        @staticmethod
        def five():
            return 5

        def read(self):
            return Limits.LIMIT, Limits.BASE, Limits.five()

    assert Limits.LIMIT == 3
    assert ray.get(Limits.remote().read.remote(), timeout=GET_TIMEOUT) == (3, 2, 5)


def test_a_thread_a_task_started_sees_the_tasks_runtime_context(ray):
    """README, "Differences": the task's id, name and function in its threads (Ray 2.60
    gives such a thread a random task id of the job); None in an actor method's thread."""

    @ray.remote
    def in_a_thread():
        ctx = ray.get_runtime_context()
        seen = {}

        def look():
            seen.update(task=ctx.get_task_id(), name=ctx.get_task_name(),
                        job=ctx.task_id.job_id().hex())

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        return ctx.get_task_id(), ctx.get_task_name(), seen

    @ray.remote
    class Threads:
        def look(self):
            seen = []
            thread = threading.Thread(
                target=lambda: seen.append(ray.get_runtime_context().get_task_id()))
            thread.start()
            thread.join()
            return seen[0]

    task_id, name, seen = ray.get(in_a_thread.remote(), timeout=GET_TIMEOUT)
    assert seen == {"task": task_id, "name": name, "job": ray.get_runtime_context().get_job_id()}
    assert ray.get(Threads.remote().look.remote(), timeout=GET_TIMEOUT) is None
