"""Actor concurrency groups, in threaded (sync) and async actors.

Each behaviour here was compared with Ray 2.60 in its own virtualenv (the same programs, with
``import ray``): a group's calls run beside the default group's and the other groups'; a group
is bounded by its size; the default group by ``max_concurrency`` (1 for a sync actor, 1000 for
an async one); ``.options(concurrency_group=...)`` on a call overrides the method's group; a
method naming an undefined group fails the actor's creation with AssertionError; a queued call
of a group is cancelled with TaskCancelledError; ``__ray_terminate__`` lets a threaded actor
finish the calls sent before it; restarts keep the groups. Where Ray crashes the actor (a call
naming a group its class lacks, a group of size 0) miniray raises at once instead.

Concurrency is proven with events and barriers inside the actor, each wait bounded: a call
that could not run beside another one would time out and report it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from miniray import exceptions

from .helpers import cli, driver, json_line

GET_TIMEOUT = 30
WAIT = 10.0  # how long a call waits for one that must run beside it


# ----------------------------------------------------------------------------- sync actors
@pytest.fixture
def Grouped(ray):
    @ray.remote(concurrency_groups={"io": 2, "compute": 4})
    class Grouped:
        def __init__(self):
            self.released = threading.Event()
            self.lock = threading.Lock()
            self.active: dict = {}
            self.peak: dict = {}
            self.barrier = threading.Barrier(2, timeout=WAIT)
            self.items: list = []

        def block(self):
            """Default group: waits until a call of another group releases it (the event is
            cleared for the next one)."""
            released = self.released.wait(WAIT)
            self.released.clear()
            return released

        def release(self):
            self.released.set()
            return os.getpid()

        @ray.method(concurrency_group="io")
        def release_io(self):
            self.released.set()
            return True

        @ray.method(concurrency_group="compute")
        def compute(self, x):
            return x * 2

        @ray.method(concurrency_group="io")
        def meet(self):
            """Two io calls meet at a barrier; the peak says how many ran at once."""
            with self.lock:
                self.active["io"] = self.active.get("io", 0) + 1
                self.peak["io"] = max(self.peak.get("io", 0), self.active["io"])
            try:
                self.barrier.wait()
                time.sleep(0.05)
            finally:
                with self.lock:
                    self.active["io"] -= 1
            return True

        def peaks(self):
            return dict(self.peak)

        def context(self):
            import miniray

            ctx = miniray.get_runtime_context()
            return ctx.get_actor_id(), ctx.get_task_id()

        @ray.method(concurrency_group="io")
        def context_io(self):
            import miniray

            ctx = miniray.get_runtime_context()
            return ctx.get_actor_id(), ctx.get_task_id()

    return Grouped


def test_sync_groups_run_while_the_default_group_is_busy(ray, Grouped):
    """Compared with Ray 2.60: a default-group call blocked on an event is released by a call
    of the "io" group, and a "compute" call runs meanwhile (Ray runs each group on its own
    threads). Without groups the default call would time out and return False."""
    actor = Grouped.remote()
    blocked = actor.block.remote()
    assert ray.get(actor.compute.remote(21), timeout=GET_TIMEOUT) == 42
    assert ray.get(actor.release_io.remote(), timeout=GET_TIMEOUT) is True
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_sync_group_is_bounded_by_its_size(ray, Grouped):
    """Compared with Ray 2.60: the "io" group (size 2) runs two calls at once and never
    more: pairs meet at a barrier of two (at least two ran together) and the peak is 2."""
    actor = Grouped.remote()
    assert ray.get([actor.meet.remote() for _ in range(6)], timeout=GET_TIMEOUT) == [True] * 6
    assert ray.get(actor.peaks.remote(), timeout=GET_TIMEOUT) == {"io": 2}


def test_default_group_of_a_sync_actor_serialises(ray):
    """Compared with Ray 2.60: with groups, a sync actor's default group still runs one call
    at a time (max_concurrency 1): a second default call cannot release the first."""
    @ray.remote(concurrency_groups={"io": 1})
    class Actor:
        def __init__(self):
            self.event = threading.Event()

        def wait(self, seconds):
            return self.event.wait(seconds)

        def release(self):
            self.event.set()

    actor = Actor.remote()
    first = actor.wait.remote(1.0)
    actor.release.remote()
    assert ray.get(first, timeout=GET_TIMEOUT) is False  # timed out: release ran after it


def test_max_concurrency_sizes_the_default_group(ray):
    """Compared with Ray 2.60: ``max_concurrency=2`` with groups: two default calls meet."""
    @ray.remote(concurrency_groups={"io": 1}, max_concurrency=2)
    class Actor:
        def __init__(self):
            self.barrier = threading.Barrier(2, timeout=WAIT)

        def meet(self):
            self.barrier.wait()
            return True

    actor = Actor.remote()
    assert ray.get([actor.meet.remote() for _ in range(2)], timeout=GET_TIMEOUT) == [True] * 2


def test_size_one_group_keeps_submission_order(ray):
    """Compared with Ray 2.60: 200 calls to a group of size 1 run in submission order."""
    @ray.remote(concurrency_groups={"one": 1})
    class Log:
        def __init__(self):
            self.items = []

        @ray.method(concurrency_group="one")
        def add(self, i):
            self.items.append(i)

        @ray.method(concurrency_group="one")
        def items_(self):
            return self.items

    log = Log.remote()
    for i in range(200):
        log.add.remote(i)
    assert ray.get(log.items_.remote(), timeout=GET_TIMEOUT) == list(range(200))


def test_call_option_overrides_the_method_group(ray, Grouped):
    """Compared with Ray 2.60: ``release`` is a default-group method; called with
    ``.options(concurrency_group="io")`` it runs while the default group is busy."""
    actor = Grouped.remote()
    blocked = actor.block.remote()
    ray.get(actor.release.options(concurrency_group="io").remote(), timeout=GET_TIMEOUT)
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_a_handle_passed_to_a_task_keeps_the_groups(ray, Grouped):
    """Compared with Ray 2.60: a task given the handle calls a method of the io group and a
    default method moved to io; both run while the default group is busy."""
    @ray.remote
    def release_from_task(actor, override):
        if override:
            return ray.get(actor.release.options(concurrency_group="io").remote(),
                           timeout=GET_TIMEOUT)
        return ray.get(actor.release_io.remote(), timeout=GET_TIMEOUT)

    actor = Grouped.remote()
    for override in (False, True):
        blocked = actor.block.remote()
        ray.get(release_from_task.remote(actor, override), timeout=GET_TIMEOUT)
        assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_a_dag_node_keeps_the_call_override(ray, Grouped):
    """Compared with Ray 2.60: ``handle.method.options(concurrency_group=...).bind()``
    records the group, and the executed call runs in it while the default group is busy."""
    actor = Grouped.remote()
    node = actor.release.options(concurrency_group="io").bind()
    assert node.get_options()["concurrency_group"] == "io"
    blocked = actor.block.remote()
    ray.get(node.execute(), timeout=GET_TIMEOUT)
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_runtime_context_in_a_group(ray, Grouped):
    """Compared with Ray 2.60: a group's call sees the same actor id and its own task id."""
    actor = Grouped.remote()
    actor_id, task_id = ray.get(actor.context.remote(), timeout=GET_TIMEOUT)
    io_actor_id, io_task_id = ray.get(actor.context_io.remote(), timeout=GET_TIMEOUT)
    assert actor_id == io_actor_id == actor._actor_id_hex()
    assert task_id and io_task_id and task_id != io_task_id


# ----------------------------------------------------------------------------- errors
def test_method_naming_an_undefined_group_fails_creation(ray):
    """Compared with Ray 2.60: the class is accepted, ``.remote()`` raises AssertionError
    (Ray's is bare; this one names the method and the groups), and no actor is made."""
    @ray.remote(concurrency_groups={"io": 2})
    class Actor:
        @ray.method(concurrency_group="nope")
        def f(self):
            return 1

    with pytest.raises(AssertionError, match=r"Actor\.f .*'nope'.*\['io'\]"):
        Actor.remote()


def test_call_naming_an_undefined_group_raises(ray, Grouped):
    """Ray 2.60 accepts the call and its actor process aborts on a failed check (the call gets
    ActorDiedError). miniray raises ValueError at ``.options()`` and the actor lives on."""
    actor = Grouped.remote()
    with pytest.raises(ValueError, match=r"'nope'.*no such concurrency group"):
        actor.compute.options(concurrency_group="nope")

    @ray.remote
    class Plain:
        def f(self):
            return 1

    plain = Plain.remote()
    with pytest.raises(ValueError, match=r"'io'.*its groups: \[\]"):
        plain.f.options(concurrency_group="io")
    assert ray.get(actor.compute.remote(1), timeout=GET_TIMEOUT) == 2
    assert ray.get(plain.f.remote(), timeout=GET_TIMEOUT) == 1


@pytest.mark.parametrize(("groups", "error"), [
    ({"io": 0}, ValueError), ({"io": -1}, ValueError), ({"io": "2"}, TypeError),
    ({"io": 1.5}, TypeError), ({1: 2}, TypeError), (["io"], TypeError),
])
def test_bad_group_values_fail_at_creation(ray, groups, error):
    """Compared with Ray 2.60, which refuses these at ``.remote()`` too, with TypeError for a
    str size, a non-str name or a list, OverflowError for -1, and a crashing actor for 0
    (it takes 1.5 as 1): miniray refuses every one with TypeError or ValueError."""
    @ray.remote(concurrency_groups=groups)
    class Actor:
        def f(self):
            return 1

    with pytest.raises(error, match="concurrency_groups of actor class Actor"):
        Actor.remote()


def test_concurrency_groups_in_options_is_refused(ray, Grouped):
    """Compared with Ray 2.60: the same ValueError and message."""
    with pytest.raises(ValueError, match=r"Setting 'concurrency_groups' is not supported"):
        Grouped.options(concurrency_groups={"x": 1})


# ----------------------------------------------------------------------------- interplay
@pytest.mark.parametrize("is_async", [False, True])
def test_cancel_a_queued_call_of_a_group(ray, is_async):
    """Compared with Ray 2.60: a call queued behind a running one in a group of size 1 is
    cancelled before it runs (TaskCancelledError); the running one, released by a
    default-group call, finishes. (A sync actor answers the cancel when the call's turn
    comes, as Ray does: 2 s later for a call queued behind one of 2 s.)"""
    if is_async:
        @ray.remote(concurrency_groups={"one": 1})
        class Actor:
            def __init__(self):
                self.started = threading.Event()
                self.released = threading.Event()

            @ray.method(concurrency_group="one")
            async def slow(self):
                self.started.set()
                deadline = time.monotonic() + WAIT
                while not self.released.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                return self.released.is_set()

            @ray.method(concurrency_group="one")
            async def quick(self):
                return "quick"

            def started_(self):
                return self.started.wait(WAIT)

            def release(self):
                self.released.set()
    else:
        @ray.remote(concurrency_groups={"one": 1})
        class Actor:
            def __init__(self):
                self.started = threading.Event()
                self.released = threading.Event()

            @ray.method(concurrency_group="one")
            def slow(self):
                self.started.set()
                return self.released.wait(WAIT)

            @ray.method(concurrency_group="one")
            def quick(self):
                return "quick"

            def started_(self):
                return self.started.wait(WAIT)

            def release(self):
                self.released.set()

    actor = Actor.remote()
    slow = actor.slow.remote()
    assert ray.get(actor.started_.remote(), timeout=GET_TIMEOUT) is True
    quick = actor.quick.remote()
    ray.cancel(quick)
    actor.release.remote()
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(quick, timeout=GET_TIMEOUT)
    assert ray.get(slow, timeout=GET_TIMEOUT) is True


@pytest.mark.parametrize("groups", [{"io": 1}, None])
def test_terminate_lets_a_threaded_actor_finish_the_calls_sent_before_it(ray, groups):
    """Compared with Ray 2.60: ``__ray_terminate__`` sent after calls queued in every group
    (or, without groups, in a pool of ``max_concurrency=2``) runs after them all: each
    returns its value, and the terminate call itself gets ActorDiedError."""
    options = {"concurrency_groups": groups} if groups else {"max_concurrency": 2}

    @ray.remote(**options)
    class Actor:
        def work(self, i):
            time.sleep(0.1)
            return i

        @ray.method(concurrency_group="io" if groups else None)
        def io(self, i):
            time.sleep(0.1)
            return -i

    actor = Actor.remote()
    ray.get(actor.__ray_ready__.remote(), timeout=GET_TIMEOUT)
    refs = [actor.work.remote(i) for i in range(1, 4)] + [actor.io.remote(i) for i in (1, 2)]
    done = actor.__ray_terminate__.remote()
    assert ray.get(refs, timeout=GET_TIMEOUT) == [1, 2, 3, -1, -2]
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(done, timeout=GET_TIMEOUT)


def test_exit_actor_in_a_group_lets_running_calls_finish(ray):
    """Compared with Ray 2.60: ``exit_actor()`` in an io call while a default call runs: the
    default call finishes with its value, the exiting call gets ActorDiedError."""
    @ray.remote(concurrency_groups={"io": 1})
    class Actor:
        def __init__(self):
            self.started = threading.Event()

        def slow(self):
            self.started.set()
            time.sleep(0.5)
            return "done"

        @ray.method(concurrency_group="io")
        def bye(self):
            import miniray

            assert self.started.wait(WAIT)
            miniray.actor.exit_actor()

    actor = Actor.remote()
    slow = actor.slow.remote()
    bye = actor.bye.remote()
    assert ray.get(slow, timeout=GET_TIMEOUT) == "done"
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(bye, timeout=GET_TIMEOUT)


def test_restarted_actor_keeps_its_groups(ray):
    """Compared with Ray 2.60: after a crash and a restart, a default call blocked on an
    event is still released by an io call."""
    @ray.remote(concurrency_groups={"io": 1}, max_restarts=1)
    class Actor:
        def __init__(self):
            self.event = threading.Event()

        def block(self):
            return self.event.wait(WAIT)

        @ray.method(concurrency_group="io")
        def release(self):
            self.event.set()
            return os.getpid()

        def die(self):
            os._exit(1)

    actor = Actor.remote()
    first_pid = ray.get(actor.release.remote(), timeout=GET_TIMEOUT)
    with pytest.raises(exceptions.RayActorError):
        ray.get(actor.die.remote(), timeout=GET_TIMEOUT)
    blocked = actor.block.remote()
    assert ray.get(actor.release.remote(), timeout=GET_TIMEOUT) != first_pid
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


# ----------------------------------------------------------------------------- async actors
@pytest.fixture
def AsyncGrouped(ray):
    @ray.remote(concurrency_groups={"io": 2, "compute": 3})
    class AsyncGrouped:
        def __init__(self):
            self.released = threading.Event()
            self.active: dict = {}
            self.peak: dict = {}

        async def block_loop(self):
            """Blocks the default group's event loop thread itself (no await) until a call of
            another group releases it (the event is cleared for the next one)."""
            released = self.released.wait(WAIT)
            self.released.clear()
            return released

        @ray.method(concurrency_group="io")
        async def release_io(self):
            self.released.set()
            return id(asyncio.get_running_loop())

        @ray.method(concurrency_group="io")
        def release_io_sync(self):
            self.released.set()
            return True

        async def release(self):
            self.released.set()
            return id(asyncio.get_running_loop())

        @ray.method(concurrency_group="compute")
        async def loop_id(self):
            return id(asyncio.get_running_loop())

        async def default_loop_id(self):
            return id(asyncio.get_running_loop())

        async def _probe(self, group, meet):
            """Counts the group's calls running at once; waits (bounded) until ``meet`` of
            them run together, so a peak below ``meet`` shows as a timeout."""
            self.active[group] = self.active.get(group, 0) + 1
            self.peak[group] = max(self.peak.get(group, 0), self.active[group])
            deadline = time.monotonic() + WAIT
            while self.peak[group] < meet and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            self.active[group] -= 1

        @ray.method(concurrency_group="io")
        async def io(self):
            await self._probe("io", 2)

        @ray.method(concurrency_group="compute")
        async def compute(self):
            await self._probe("compute", 3)

        async def default(self, meet):
            await self._probe("default", meet)

        async def peaks(self):
            return dict(self.peak)

    return AsyncGrouped


def test_async_groups_have_their_own_event_loops(ray, AsyncGrouped):
    """Compared with Ray 2.60 (one event loop thread per group): a default call that blocks
    its loop's thread is released by an io call (async or sync method), and each group's
    calls see their own loop."""
    actor = AsyncGrouped.remote()
    blocked = actor.block_loop.remote()
    io_loop = ray.get(actor.release_io.remote(), timeout=GET_TIMEOUT)
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True
    compute_loop = ray.get(actor.loop_id.remote(), timeout=GET_TIMEOUT)
    default_loop = ray.get(actor.default_loop_id.remote(), timeout=GET_TIMEOUT)
    assert len({io_loop, compute_loop, default_loop}) == 3

    blocked = actor.block_loop.remote()
    assert ray.get(actor.release_io_sync.remote(), timeout=GET_TIMEOUT) is True
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_async_groups_are_bounded_by_their_sizes(ray, AsyncGrouped):
    """Compared with Ray 2.60: io (size 2) and compute (size 3) peak at their sizes, and the
    default group (max_concurrency 1000) runs 50 calls at once."""
    actor = AsyncGrouped.remote()
    refs = ([actor.io.remote() for _ in range(6)] + [actor.compute.remote() for _ in range(6)]
            + [actor.default.remote(50) for _ in range(50)])
    ray.get(refs, timeout=GET_TIMEOUT)
    assert ray.get(actor.peaks.remote(), timeout=GET_TIMEOUT) == {
        "io": 2, "compute": 3, "default": 50}


def test_async_call_option_overrides_the_method_group(ray, AsyncGrouped):
    """Compared with Ray 2.60: a default-group coroutine called with
    ``.options(concurrency_group="io")`` runs on the io loop, beside a blocked default loop."""
    actor = AsyncGrouped.remote()
    io_loop = ray.get(actor.release_io.remote(), timeout=GET_TIMEOUT)
    blocked = actor.block_loop.remote()
    moved = actor.release.options(concurrency_group="io").remote()
    assert ray.get(moved, timeout=GET_TIMEOUT) == io_loop
    assert ray.get(blocked, timeout=GET_TIMEOUT) is True


def test_async_default_group_is_sized_by_max_concurrency(ray):
    """Compared with Ray 2.60: ``max_concurrency=2`` with groups: the default group's peak is
    two of six calls."""
    @ray.remote(concurrency_groups={"io": 1}, max_concurrency=2)
    class Actor:
        def __init__(self):
            self.active = self.peak = 0

        async def work(self):
            self.active += 1
            self.peak = max(self.peak, self.active)
            deadline = time.monotonic() + WAIT
            while self.peak < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            self.active -= 1

        async def peak_(self):
            return self.peak

    actor = Actor.remote()
    ray.get([actor.work.remote() for _ in range(6)], timeout=GET_TIMEOUT)
    assert ray.get(actor.peak_.remote(), timeout=GET_TIMEOUT) == 2


def test_a_woken_call_runs_before_the_next_call_takes_the_free_turn(ray):
    """The actor-concurrency page's example: ``max_concurrency=2``, each pair of calls
    meets on an Event, the second sets it, the first clears it. Ray 2.60 runs them in
    pairs (it hands a call to the loop only when a turn is free, after the woken first
    call); miniray started the third call in the turn the second gave back, before the
    first woke, so a later call waited for a partner forever."""

    @ray.remote
    class Batches:
        def __init__(self, batch_size):
            self.event = asyncio.Event()
            self.current = 0
            self.batch_size = batch_size
            self.log = []

        async def run_task(self, i):
            self.log.append(("start", i))
            self.current += 1
            if self.current == self.batch_size:
                self.event.set()
            else:
                await self.event.wait()
                self.event.clear()
                self.current = 0
            self.log.append(("end", i))

        def log_(self):
            return self.log

    actor = Batches.options(max_concurrency=2).remote(2)
    ray.get([actor.run_task.remote(i) for i in range(8)], timeout=GET_TIMEOUT)
    log = ray.get(actor.log_.remote(), timeout=GET_TIMEOUT)
    kinds = [kind for kind, _ in log]
    assert kinds == ["start", "start", "end", "end"] * 4, log


def test_an_async_call_cancelled_while_it_waits_for_a_turn_is_answered_at_once(ray):
    """A call waiting for a turn (max_concurrency=1, the turn held by a call that waits
    for a release in another group) is cancelled: TaskCancelledError at once, while the
    holder still runs; the holder then finishes, and a later call runs."""

    @ray.remote(max_concurrency=1, concurrency_groups={"control": 1})
    class Holder:
        def __init__(self):
            self.released = threading.Event()  # set from the control group's thread

        async def hold(self):
            deadline = time.monotonic() + WAIT
            while not self.released.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return self.released.is_set()

        async def quick(self):
            return "quick"

        @ray.method(concurrency_group="control")
        def release(self):
            self.released.set()

    actor = Holder.remote()
    holding = actor.hold.remote()
    queued = actor.quick.remote()
    time.sleep(0.3)  # both reached the actor; the second waits for the turn
    ray.cancel(queued)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(queued, timeout=WAIT / 2)  # the holder keeps its turn until released
    assert ray.wait([holding], timeout=0)[0] == []
    ray.get(actor.release.remote(), timeout=GET_TIMEOUT)
    assert ray.get(holding, timeout=GET_TIMEOUT) is True
    assert ray.get(actor.quick.remote(), timeout=GET_TIMEOUT) == "quick"


def test_async_terminate_waits_for_running_calls_of_other_groups(ray):
    """Compared with Ray 2.60: ``__ray_terminate__`` while an io coroutine runs: it finishes
    with its value; the terminate call gets ActorDiedError."""
    @ray.remote(concurrency_groups={"io": 1})
    class Actor:
        def __init__(self):
            self.started = threading.Event()

        @ray.method(concurrency_group="io")
        async def slow(self):
            self.started.set()
            await asyncio.sleep(0.5)
            return "done"

        def started_(self):
            return self.started.wait(WAIT)

    actor = Actor.remote()
    slow = actor.slow.remote()
    assert ray.get(actor.started_.remote(), timeout=GET_TIMEOUT) is True
    done = actor.__ray_terminate__.remote()
    assert ray.get(slow, timeout=GET_TIMEOUT) == "done"
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(done, timeout=GET_TIMEOUT)


# ----------------------------------------------------------------------------- on a node
def test_groups_of_a_named_actor_in_the_node_actor_service(node_env):
    """A named actor lives in the node's actor service: its groups travel with its creation,
    and each call's group (the method's, or the call's override) with the call."""
    started = cli(node_env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    proc = driver("""
        import json, threading
        import miniray as ray
        ray.init(address="auto")

        @ray.remote(concurrency_groups={"io": 1})
        class Actor:
            def __init__(self):
                # A semaphore, not an Event: a release that comes before the blocked call
                # has cleared an Event would be lost (it did on a loaded machine).
                self.gate = threading.Semaphore(0)
            def block(self):
                return self.gate.acquire(timeout=10)
            @ray.method(concurrency_group="io")
            def release_io(self):
                self.gate.release()
            def release(self):
                self.gate.release()

        actor = Actor.options(name="grouped").remote()
        first = actor.block.remote()
        ray.get(actor.release_io.remote(), timeout=30)
        second = actor.block.remote()
        ray.get(actor.release.options(concurrency_group="io").remote(), timeout=30)
        print(json.dumps({"released": ray.get([first, second], timeout=30)}), flush=True)
        ray.shutdown()
    """, node_env)
    try:
        assert json_line(proc, timeout=60) == {"released": [True, True]}
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
