"""Actors on another host between fake hosts (``owner/remote_actors.py``).

A head on 127.0.0.1 (2 CPUs) and a member on 127.0.0.2 (4 CPUs and 2 "special", which only
it has), each with its own root (``FakeHosts`` of test_cluster_join.py; every process,
session and segment of each root is checked on teardown). A driver on the head's host
creates actors the head can never hold, or with a node affinity to the member.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest

from miniray._private.ledger.ledger import Ledger

from .helpers import FLAKY_ACTOR, OUTCOME, driver, go_on, json_line, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_kept_actor_results import _run as _run_kept
from .test_remote_tasks import (
    MEMBER,
    PRELUDE,
    _join_special,
    _run_driver,
    _runs_once_a_special_member_joins,
)

# A driver script's timed(actor): the mean time of one ``actor.add.remote(0)`` call, in µs.
TIMED = """
    def timed(actor, n=200):
        ray.get([actor.add.remote(0) for _ in range(5)])
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(actor.add.remote(0))
        return (time.perf_counter() - t0) / n * 1e6
    """


def _member_leases(hosts) -> dict:
    path = os.path.join(hosts.record(MEMBER).session_dir, "ledger.json")
    return Ledger(path).snapshot().leases


def test_an_actor_only_a_member_can_hold_lives_there_and_ends_with_kill(hosts):
    _join_special(hosts)
    doc = _run_driver(hosts, """
    import numpy as np
    here = ray.get_runtime_context().get_node_id()

    @ray.remote
    class Counter:
        def __init__(self, start):
            self.n = start
            print("constructed on the member")

        def add(self, k):
            self.n += k
            return self.n

        def where(self):
            import socket
            ctx = ray.get_runtime_context()
            return ctx.get_node_id(), os.getpid(), ctx.get_actor_id()

        def array(self, nbytes):
            return np.ones(nbytes // 8)

        def total(self, array):
            return float(array.sum())

    """ + OUTCOME + """

    out = {"member": member, "here": here}
    counter = Counter.options(resources={"special": 1}, name="counter").remote(100)
    out["where"] = ray.get(counter.where.remote(), timeout=60)
    out["sums"] = [ray.get(counter.add.remote(1), timeout=30) for _ in range(20)]
    t0 = time.monotonic()
    big = ray.get(counter.array.remote(20 * 1024 * 1024), timeout=60)
    out["big"] = [big.nbytes, float(big.sum()), time.monotonic() - t0]
    out["arg"] = ray.get(counter.total.remote(np.ones(4 * 1024 * 1024)), timeout=60)
    out["by_name"] = ray.get(ray.get_actor("counter").add.remote(0), timeout=30)
    out["names"] = ray.util.list_named_actors()

    """ + TIMED + """

    local = Counter.remote(0)
    out["us"] = [timed(counter), timed(local)]
    del local
    t0 = time.monotonic()  # the member's "special" is held once its heartbeat says so
    while (ray.available_resources().get("special", 0) == 2
           and time.monotonic() - t0 < 30):
        time.sleep(0.05)
    out["special_held"] = ray.available_resources().get("special", 0)

    pinned = Counter.options(scheduling_strategy=there, resources={"special": 1}).remote(0)
    out["pinned"] = ray.get(pinned.where.remote(), timeout=60)[0]
    unknown = Counter.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy("ff" * 28, soft=False)).remote(0)
    out["unknown"] = outcome(unknown.add.remote(1))

    ray.kill(counter)
    out["after_kill"] = outcome(counter.add.remote(1))
    del pinned  # out of scope: it ends, and its lease on the member with it
    t0 = time.monotonic()
    while (ray.available_resources().get("special", 0) != 2
           and time.monotonic() - t0 < 30):
        time.sleep(0.1)
    out["special_back"] = [ray.available_resources().get("special", 0),
                           time.monotonic() - t0]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    member, here = doc["member"], doc["here"]
    assert doc["where"][0] == member != here, doc
    assert doc["sums"] == list(range(101, 121)), doc
    assert doc["big"][:2] == [20 * 1024 * 1024, 20 * 1024 * 1024 // 8], doc
    assert doc["arg"] == 4 * 1024 * 1024, doc
    assert doc["by_name"] == 120 and doc["names"] == ["counter"], doc
    assert doc["special_held"] == 1, doc
    assert doc["pinned"] == member, doc
    assert doc["unknown"].startswith("ActorUnschedulableError"), doc
    assert "ff" * 28 in doc["unknown"], doc
    assert doc["after_kill"].startswith("ActorDiedError"), doc
    assert "ray.kill" in doc["after_kill"], doc
    assert f"pid={doc['where'][1]}, ip={MEMBER}) constructed on the member" in doc["stdout"]
    # Killed: its lease on the member is released (seen in the member's heartbeat).
    assert doc["special_back"][0] == 2, doc
    print(f"\nactor call round trip: on the member {doc['us'][0]:.0f} us, here "
          f"{doc['us'][1]:.0f} us")
    print(f"20 MB result from an actor on the member in {doc['big'][2]:.2f} s; "
          f"'special' back {doc['special_back'][1]:.2f} s after ray.kill")
    assert wait_until(lambda: not _member_leases(hosts), 30.0), _member_leases(hosts)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_an_actor_whose_node_dies_restarts_elsewhere_or_dies_naming_it(hosts, sig):
    """SIGKILL of the member's node: its links close. SIGSTOP stands in for a partition:
    the sockets stay open, the worker runs on, and only the head's view says it is dead."""
    _join_special(hosts)
    proc = driver(PRELUDE + """
    here = ray.get_runtime_context().get_node_id()
    soft = NodeAffinitySchedulingStrategy(member, soft=True)

    @ray.remote
    class Where:
        def node(self, sleep=0):
            time.sleep(sleep)
            return ray.get_runtime_context().get_node_id()

    """ + OUTCOME + """

    once = Where.options(scheduling_strategy=soft, max_restarts=0).remote()
    again = Where.options(scheduling_strategy=soft, max_restarts=1,
                          max_task_retries=1).remote()
    before = [ray.get(once.node.remote(), timeout=60), ray.get(again.node.remote(), timeout=60)]
    running = [once.node.remote(3), again.node.remote(3)]  # on the member when it dies
    time.sleep(0.5)
    print(json.dumps({"before": before, "member": member}), flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    out = {"here": here, "running": [outcome(r) for r in running],
           "once": outcome(once.node.remote()),
           "again": outcome(again.node.remote()), "waited": time.monotonic() - t0}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        first = json_line(proc, 90)
        assert first["before"] == [first["member"]] * 2, first
        pid = hosts.record(MEMBER).pid
        if sig == signal.SIGSTOP:
            hosts.stopped.append(pid)
        os.kill(pid, sig)
        time.sleep(1.0)
        doc = go_on(proc, 60)
        assert doc["once"].startswith("ActorDiedError"), doc
        assert f"ip: {MEMBER}" in doc["once"] and "its node has died" in doc["once"], doc
        assert doc["again"] == doc["here"], doc  # restarted on the head
        # A call running there when it died: ActorDiedError without a restart; retried
        # on the restarted actor with max_task_retries=1.
        if sig == signal.SIGKILL:  # stopped, the worker may finish its call first
            assert doc["running"][0].startswith("ActorDiedError"), doc
            assert doc["running"][1] == doc["here"], doc
        assert doc["waited"] < 20, doc
        print(f"\nmember killed: {doc['once']}\nrestarted here in {doc['waited']:.2f} s")
        proc.wait(30)
    finally:
        stop_driver(proc)


def test_a_remote_actors_worker_dies_and_restarts_there_async_and_threaded_actors(hosts):
    _join_special(hosts)
    doc = _run_driver(hosts, """
    import asyncio
    import numpy as np

    @ray.remote(resources={"special": 1}, max_restarts=1, max_task_retries=0)
    class Fragile:
        def pid(self):
            return os.getpid(), ray.get_runtime_context().get_node_id()

        def crash(self):
            os._exit(3)

        def sleep(self, s):
            time.sleep(s)
            return s

        def put(self):
            return ray.get(ray.put(1))

    @ray.remote(resources={"special": 0.5})
    class Async:
        async def array(self, n):
            await asyncio.sleep(0.01)
            return np.full(n // 8, 2.0)

    @ray.remote(resources={"special": 0.5}, max_concurrency=4)
    class Threaded:
        def array(self, n):
            time.sleep(0.05)
            return np.full(n // 8, 3.0)

    """ + OUTCOME + """

    fragile = Fragile.remote()
    out = {"first": ray.get(fragile.pid.remote(), timeout=60)}
    out["crash"] = outcome(fragile.crash.remote())
    out["second"] = outcome(fragile.pid.remote(), timeout=60)
    out["crash2"] = outcome(fragile.crash.remote())
    out["third"] = outcome(fragile.pid.remote())

    slow = Fragile.remote()
    running = slow.sleep.remote(2)
    queued = slow.sleep.remote(0)  # sent to the worker behind it: its CANCEL skips it
    time.sleep(0.5)
    ray.cancel(queued)
    out["cancel"] = [outcome(queued), outcome(running)]
    out["after_cancel"] = outcome(slow.sleep.remote(0))
    out["nested"] = outcome(slow.put.remote())
    out["after_nested"] = outcome(slow.sleep.remote(0))

    a, t = Async.remote(), Threaded.remote()
    n = 8 * 1024 * 1024
    sums = ray.get([a.array.remote(n) for _ in range(4)] + [t.array.remote(n) for _ in range(4)],
                   timeout=60)
    out["sums"] = [float(x.sum()) for x in sums]
    out["member"] = member
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=120)
    member = doc["member"]
    assert doc["first"][1] == member, doc
    assert doc["crash"].startswith("ActorUnavailableError") or doc["crash"].startswith(
        "ActorDiedError"), doc
    assert doc["second"][1] == member and doc["second"][0] != doc["first"][0], doc
    assert doc["crash2"].startswith("ActorDiedError"), doc
    assert doc["third"].startswith("ActorDiedError"), doc
    assert "exit code 3" in doc["third"] or "died unexpectedly" in doc["third"], doc
    assert doc["cancel"][0].startswith("TaskCancelledError") and doc["cancel"][1] == 2, doc
    assert doc["after_cancel"] == 0, doc
    assert doc["nested"] == 1 and doc["after_nested"] == 0, doc  # a put and get served
    print("\n" + doc["third"])
    n = 1024 * 1024
    assert doc["sums"] == [2.0 * n] * 4 + [3.0 * n] * 4, doc


@pytest.mark.parametrize("whose", ["driver", "service"])
def test_a_cancel_that_reaches_an_actor_on_the_member_too_late_fails_its_value(hosts, tmp_path,
                                                                                whose):
    """A call queued behind another on an actor on the member (the driver's own, or a
    detached one of the head's actor service) when ``ray.cancel()`` returned runs once the
    call ahead ends, and returns before its process handles the cancel (which waits for a
    file, ``MINIRAY_TEST_ACTOR_CANCEL_GATE``): ``get`` raises the cancel error, as in Ray
    2.60, and its 20 MB value, kept on the member, is freed there."""
    _join_special(hosts)
    doc = _run_kept(hosts, OUTCOME + """
    @ray.remote(resources={"special": 1})
    class Gated:
        def wait_for(self, path):
            while not os.path.exists(path):
                time.sleep(0.01)
            return "ahead"

        def array(self, seed):
            return expected(seed)

    gate, cancel_gate = os.environ["GATE"], os.environ["CANCEL_GATE"]
    options = {"runtime_env": {"env_vars": {"MINIRAY_TEST_ACTOR_CANCEL_GATE": cancel_gate}}}
    if os.environ["WHOSE"] == "service":
        options.update(name="gated", lifetime="detached")
    actor = Gated.options(**options).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=60)
    ahead = actor.wait_for.remote(gate)
    queued = actor.array.remote(1)
    ray.cancel(queued)
    open(gate, "w").close()  # the queued call runs now; its process has not seen the cancel
    got = outcome(queued, timeout=60)
    out = {"queued": got if isinstance(got, str) else "a value",
           "text": f"TaskCancelledError: Task: {queued.hex()[:48]} was cancelled.",
           "ahead": outcome(ahead, timeout=60)}
    out["freed_on_member"] = until(lambda: not kept())
    open(cancel_gate, "w").close()
    out["later"] = outcome(actor.wait_for.remote(gate), timeout=60)
    if os.environ["WHOSE"] == "service":
        ray.kill(actor)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, GATE=str(tmp_path / "gate"), CANCEL_GATE=str(tmp_path / "cancel-gate"), WHOSE=whose)
    assert doc["queued"] == doc["text"], doc
    assert doc["ahead"] == "ahead" and doc["later"] == "ahead", doc
    assert doc["freed_on_member"], doc


def test_an_actor_on_the_member_submits_gets_puts_waits_and_calls_actors(hosts):
    _join_special(hosts)
    doc = _run_driver(hosts, """
    import asyncio
    import numpy as np

    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    def sleeper(s):
        time.sleep(s)
        return s

    @ray.remote
    def fail():
        raise ValueError("the child failed")

    @ray.remote
    class Local:
        def echo(self, x):
            return ("local", x, ray.get_runtime_context().get_node_id())

    @ray.remote(resources={"special": 1}, max_concurrency=4)
    class Nested:
        def __init__(self):
            self.first = ray.get(square.remote(3))  # in the constructor too

        def where(self):
            return ray.get_runtime_context().get_node_id()

        def tasks(self):
            return self.first, ray.get([square.remote(i) for i in range(1, 4)], timeout=30)

        def big(self, n):
            got = ray.get(ray.put(np.ones(n // 8)), timeout=30)
            return got.nbytes, float(got.sum())

        def call(self, other):
            return ray.get(other.echo.remote(5), timeout=30)

        def wait(self):
            refs = [square.remote(2), square.remote(4)]
            ready, rest = ray.wait(refs, num_returns=2, timeout=30)
            return len(ready), len(rest), ray.get(ready)

        def child_error(self):
            ray.get(fail.remote())

        def a_child(self):
            return [square.remote(7)]  # a ref the driver reads after the call ended

        def slow(self, s):
            time.sleep(s)
            return "slow done"

        def get_own(self, refs):  # waits on another call of this actor
            return ray.get(refs[0], timeout=30)

        def waits_long(self):
            return ray.get(sleeper.remote(20))

    @ray.remote(resources={"special": 0.5})
    class AsyncNested:
        async def fan(self, n):  # n GETs at once, from the worker's future threads
            return sum(await asyncio.gather(*[square.remote(i) for i in range(n)]))

        async def slow(self):
            await asyncio.sleep(1.0)
            return "async slow done"

        async def own(self, refs):
            return await refs[0]

    def outcome(ref, timeout=30):
        try:
            return ray.get(ref, timeout=timeout)
        except Exception as error:
            return [type(error).__name__, isinstance(error, ValueError), str(error)]

    here = ray.get_runtime_context().get_node_id()
    actor = Nested.remote()
    out = {"member": member, "here": here, "where": ray.get(actor.where.remote(), timeout=60)}
    out["tasks"] = outcome(actor.tasks.remote())
    t0 = time.monotonic()
    out["big"] = outcome(actor.big.remote(20 * 1024 * 1024), timeout=60)
    out["big_s"] = time.monotonic() - t0
    out["call"] = outcome(actor.call.remote(Local.remote()))
    out["wait"] = outcome(actor.wait.remote())
    out["error"] = outcome(actor.child_error.remote())
    out["child"] = ray.get(ray.get(actor.a_child.remote(), timeout=30)[0], timeout=30)
    slow = actor.slow.remote(1.0)
    out["own"] = outcome(actor.get_own.remote([slow]))
    waiting = actor.waits_long.remote()
    time.sleep(1.0)
    ray.cancel(waiting)  # its get, served on a helper thread, answers CANCELLED
    out["cancelled"] = outcome(waiting)
    out["after"] = outcome(actor.where.remote())
    asynchronous = AsyncNested.remote()
    out["fan"] = outcome(asynchronous.fan.remote(40), timeout=60)
    out["async_own"] = outcome(asynchronous.own.remote([asynchronous.slow.remote()]))
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=120)
    member, here = doc["member"], doc["here"]
    assert doc["where"] == member != here, doc
    assert doc["tasks"] == [9, [1, 4, 9]], doc
    assert doc["big"] == [20 * 1024 * 1024, 20 * 1024 * 1024 / 8], doc
    assert doc["call"] == ["local", 5, here], doc
    assert doc["wait"] == [2, 0, [4, 16]], doc
    name, is_value_error, text = doc["error"]
    assert is_value_error and "the child failed" in text, doc
    assert doc["child"] == 49, doc
    assert doc["own"] == "slow done", doc
    assert doc["cancelled"][0] == "TaskCancelledError", doc
    assert doc["after"] == member, doc
    assert doc["fan"] == sum(i * i for i in range(40)), doc
    assert doc["async_own"] == "async slow done", doc
    print(f"\nan actor on the member puts and gets 20 MB in {doc['big_s']:.2f} s")


def test_spread_actors_land_two_and_two_over_two_nodes(hosts):
    hosts.start_member(MEMBER, "--num-cpus", "2")
    doc = _run_driver(hosts, """
    import collections

    @ray.remote(num_cpus=0.5)
    class Where:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    import subprocess
    from miniray.util.state import list_actors, list_tasks

    actors = [Where.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]
    nodes = ray.get([a.node.remote() for a in actors], timeout=60)
    here = ray.get_runtime_context().get_node_id()
    ran = {a._actor_id.hex(): n for a, n in zip(actors, nodes)}
    listed = {r.actor_id: r.node_id for r in list_actors()}
    calls = {r.actor_id: r.node_id for r in list_tasks() if r.type == "ACTOR_TASK"}
    creations = {r.actor_id: r.node_id for r in list_tasks()
                 if r.type == "ACTOR_CREATION_TASK"}
    cli = subprocess.run([sys.executable, "-m", "miniray", "list", "actors", "--format",
                          "json"], capture_output=True, text=True, timeout=60)
    by_cli = {r["actor_id"]: r["node_id"] for r in json.loads(cli.stdout or "[]")}
    print(json.dumps({"counts": collections.Counter(nodes), "member": member, "here": here,
                      "ran": ran, "listed": listed, "cli": by_cli, "err": cli.stderr,
                      "calls": calls, "creations": creations}),
          flush=True)
    ray.shutdown()
    """)
    # Ray 2.60 (ray.cluster_utils.Cluster, 2 and 4 CPUs, num_cpus=0.5): 2 and 2 as well.
    assert doc["counts"] == {doc["member"]: 2, doc["here"]: 2}, doc
    # The state API and `miniray list actors` name the node each actor lives on.
    assert doc["listed"] == doc["ran"] == doc["cli"], doc
    assert doc["calls"] == doc["ran"] == doc["creations"], doc  # their tasks' rows too


def test_an_actor_no_node_can_hold_lives_on_a_member_that_joins_later(hosts):
    _runs_once_a_special_member_joins(hosts, """
    @ray.remote(resources={"special": 1})
    class Where:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    actor = Where.remote()
    ref = actor.node.remote()
    """)


def test_a_gpu_actor_on_the_member_sees_its_gpu_and_its_runtime_env(hosts):
    # The head is told it has no GPU: on a machine with one, it would hold the actor itself.
    hosts.join_alive(MEMBER, hosts.start_head("--num-gpus", "0"), "--num-cpus", "2",
                     "--num-gpus", "1")
    doc = _run_driver(hosts, """
    @ray.remote(num_gpus=1)
    class Gpu:
        def seen(self):
            return (ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                    os.environ.get("MR_REMOTE_ENV"), ray.get_runtime_context().get_node_id())

    actor = Gpu.options(runtime_env={"env_vars": {"MR_REMOTE_ENV": "yes"}}).remote()
    seen = ray.get(actor.seen.remote(), timeout=60)
    print(json.dumps({"seen": seen, "member": member}), flush=True)
    ray.shutdown()
    """)
    gpu_ids, visible, env, node = doc["seen"]
    assert gpu_ids == [0] and visible == "0" and env == "yes", doc
    assert node == doc["member"], doc


def test_a_method_of_an_actor_on_the_member_retries_what_its_retry_exceptions_names(hosts):
    _join_special(hosts)
    doc = _run_driver(hosts, textwrap.indent(FLAKY_ACTOR, "    ") + """
    Retrying = ray.remote(max_task_retries=3, resources={"special": 1})(Flaky)
    out = {"member": member}
    for how, actor in (("driver's", Retrying.remote()),
                       ("service's", Retrying.options(name="f", lifetime="detached").remote())):
        got = [ray.get(actor.where.remote(), timeout=60), ray.get(actor.named.remote(),
                                                                  timeout=60)]
        for options in ({}, {"retry_exceptions": [KeyError]}, {"retry_exceptions": True}):
            try:
                ray.get(actor.unnamed.options(**options).remote(), timeout=60)
            except ValueError as error:
                got.append(str(error).splitlines()[-1])
        out[how] = got
        ray.kill(actor)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    # on the member; two failures retried; then: not retried, not retried (another class
    # named), retried max_task_retries times
    expected = [doc["member"], 3, "ValueError: 4", "ValueError: 5", "ValueError: 9"]
    assert doc["driver's"] == doc["service's"] == expected, doc
