"""Actor calls given a kept result (issue 16; docs/remote-objects.md, "Actor calls given a
kept result"): an actor on member B given A's kept 20 MB result gets it through B's node,
which fetches it from A with the driver's grant (bit-exact; the driver never pulls it);
an actor on A reads A's copy; an actor on the driver's node pulls it as before. A call
given a kept ref and the plain call after it run in submission order. A killed before
the fetch: the call fails with its argument's ObjectLostError; nothing is left on any
host (the ``hosts`` fixture's teardown checks every process, session and segment).

The scene is test_arg_locality.py's: head 127.0.0.1, member A 127.0.0.2, member B
127.0.0.3.
"""

from __future__ import annotations

import subprocess

from .helpers import driver, stop_driver, wait_until
from .test_arg_locality import (
    MEMBER_B,
    TWO,
    _env_b,
    _kept_b,
    member_fixture,  # noqa: F401 - the fixture `member`
    members_fixture,  # noqa: F401 - the fixture `members`
)
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_objects import _after_member_killed, _member_kept, _member_tag
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver

ACTORS = TWO + """
    @ray.remote
    class Reader:
        def __init__(self):
            self.log = []

        def digest(self, array):
            self.log.append("kept")
            return (hashlib.sha256(array).hexdigest(),
                    ray.get_runtime_context().get_node_id())

        def note(self, word):
            self.log.append(word)
            return word

        def calls(self):
            return self.log

    def reader(node):
        return Reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote()
"""


def test_an_actor_given_a_kept_result_reads_it_where_it_runs_in_call_order(hosts, members):
    doc = _run_driver(hosts, ACTORS + """
    out = {}
    here_id = ray.get_runtime_context().get_node_id()
    ref = made.options(**on).remote(21, M20)
    until(lambda: recorded(ref))
    on_b = reader(member_b)
    first = on_b.digest.remote(ref)  # B's node fetches it from A
    second = on_b.note.remote("plain")  # queued behind the fetch, never before it
    sha, node = ray.get(first, timeout=120)
    out["b"] = [sha == expected(21, M20), node == member_b, pulled(), fetched(), here(ref),
                ray.get(second, timeout=60), ray.get(on_b.calls.remote(), timeout=60)]
    on_a = reader(member)  # reads A's own copy
    sha, node = ray.get(on_a.digest.remote(ref), timeout=120)
    out["a"] = [sha == expected(21, M20), node == member, pulled(), fetched(), here(ref)]
    local = Reader.remote()  # on the driver's node: pulled here, as before
    sha, node = ray.get(local.digest.remote(ref), timeout=120)
    out["local"] = [sha == expected(21, M20), node == here_id, pulled(), fetched()]
    del ref
    out["freed"] = [until(lambda: not kept(), 30), until(lambda: not kept_b(), 30)]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts), **_env_b(hosts))
    assert doc["b"] == [True, True, 0, 1, False, "plain", ["kept", "plain"]], doc
    assert doc["a"] == [True, True, 0, 1, False], doc
    assert doc["local"] == [True, True, 1, 1], doc
    assert doc["freed"] == [True, True], doc
    assert _member_kept(hosts) == [] and _kept_b(hosts) == []


def test_member_a_killed_before_an_actor_on_b_fetches_fails_the_call_object_lost(
        hosts, members):
    """The call fails with its argument's ObjectLostError (a RayTaskError as a local
    call's); the actor lives on and runs the next call; nothing is left on B."""
    proc = driver(PRELUDE + ACTORS + """
    ref = made.options(**on).remote(22, M20)
    on_b = reader(member_b)
    ray.get(on_b.note.remote("up"), timeout=60)
    print(json.dumps({"kept": until(lambda: recorded(ref)) and len(kept()) == 1}),
          flush=True)
    sys.stdin.readline()  # A is dead now
    t0 = time.monotonic()
    try:
        ray.get(on_b.digest.remote(ref), timeout=90)
        out = {"error": None}
    except Exception as error:
        out = {"error": type(error).__name__, "text": str(error)[:2000],
               "lost": isinstance(error, ray.exceptions.ObjectLostError),
               "waited": time.monotonic() - t0}
    out["next"] = ray.get(on_b.note.remote("next"), timeout=60)
    out["pulled"], out["fetched"] = pulled(), fetched()
    del ref
    out["left_on_b"] = not until(lambda: not kept_b(), 30)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts),
                  **_env_b(hosts))
    try:
        doc = _after_member_killed(hosts, proc)
        assert doc["error"] is not None and doc["lost"], doc
        assert "All copies of" in doc["text"] and "lost due to node failure" in doc["text"], doc
        assert doc["waited"] < 60 and not doc["left_on_b"], doc
        assert doc["next"] == "next" and doc["fetched"] == 0, doc
        proc.wait(30)
    finally:
        stop_driver(proc)
    assert _kept_b(hosts) == []


def test_a_task_and_an_actor_in_a_bundle_on_b_get_a_kept_result_fetched_there(
        hosts, members):
    """A STRICT_SPREAD group with a bundle on every host: a task and an actor in B's
    bundle get A's kept result through B's node (one fetch, then B's copy); a task in
    A's bundle reads A's copy; the driver never pulls it."""
    doc = _run_driver(hosts, ACTORS + """
    from miniray.util.placement_group import placement_group, placement_group_table
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    index = {node: int(i) for i, node in placement_group_table(pg)["bundles_to_node_id"].items()}

    def in_bundle(node):
        return dict(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index[node]))

    out = {}
    ref = made.options(**on).remote(23, M20)
    until(lambda: recorded(ref))
    sha, node = ray.get(digest.options(**in_bundle(member_b)).remote(ref), timeout=120)
    out["task_b"] = [sha == expected(23, M20), node == member_b, pulled(), fetched()]
    actor = Reader.options(num_cpus=0, **in_bundle(member_b)).remote()
    sha, node = ray.get(actor.digest.remote(ref), timeout=120)
    out["actor_b"] = [sha == expected(23, M20), node == member_b, pulled(), fetched()]
    sha, node = ray.get(digest.options(**in_bundle(member)).remote(ref), timeout=120)
    out["task_a"] = [sha == expected(23, M20), node == member, pulled(), fetched(), here(ref)]
    del ref, actor
    out["freed"] = [until(lambda: not kept(), 30), until(lambda: not kept_b(), 30)]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts), **_env_b(hosts))
    assert doc["task_b"] == [True, True, 0, 1], doc
    assert doc["actor_b"] == [True, True, 0, 1], doc  # B's copy, fetched once
    assert doc["task_a"] == [True, True, 0, 1, False], doc
    assert doc["freed"] == [True, True], doc
    assert _member_kept(hosts) == [] and _kept_b(hosts) == []


def test_an_actors_large_result_stays_on_its_node_until_it_is_needed(hosts, members):
    """An actor on A returns 20 MB: kept on A as a task's result (recorded, nothing in
    the driver's store); a task on A reads it there, a task on B gets it from A (one
    fetch), ``get`` pulls it (bit-exact); ``del`` frees every copy. A small result comes
    inline as before."""
    doc = _run_driver(hosts, ACTORS + """
    @ray.remote
    class Maker:
        def make(self, seed, size):
            return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    maker = Maker.options(**on).remote()
    out = {}
    ref = maker.make.remote(24, M20)
    out["kept"] = [until(lambda: recorded(ref)), here(ref), len(kept())]
    sha, node = ray.get(digest.options(**on).remote(ref), timeout=120)
    out["task_a"] = [sha == expected(24, M20), node == member, pulled(), fetched()]
    sha, node = ray.get(digest.options(**on_b).remote(ref), timeout=120)
    out["task_b"] = [sha == expected(24, M20), node == member_b, pulled(), fetched()]
    value = ray.get(ref, timeout=120)
    out["get"] = [hashlib.sha256(value).hexdigest() == expected(24, M20), pulled(), here(ref)]
    del ref, value
    out["freed"] = [until(lambda: not kept(), 30), until(lambda: not kept_b(), 30)]
    small = ray.get(maker.make.remote(25, 100), timeout=60)
    out["small"] = [len(small), pulled()]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts), **_env_b(hosts))
    assert doc["kept"] == [True, False, 1], doc
    assert doc["task_a"] == [True, True, 0, 0], doc
    assert doc["task_b"] == [True, True, 0, 1], doc
    assert doc["get"] == [True, 1, True], doc
    assert doc["freed"] == [True, True], doc
    assert doc["small"] == [100, 1], doc
    assert _member_kept(hosts) == [] and _kept_b(hosts) == []


def test_an_actor_given_a_kept_result_in_its_constructor_is_created_where_it_is(
        hosts, members):
    """An actor without a strategy given A's kept 20 MB result is created on A and its
    constructor reads A's copy (bit-exact; the driver never pulls it); so is one given a
    result still running when it is created. One held to B gets it through B's node
    (one fetch); one held to the driver's node pulls it, as before."""
    doc = _run_driver(hosts, ACTORS + """
    import time as _time

    @ray.remote
    class Holder:
        def __init__(self, array):
            self.sha = hashlib.sha256(array).hexdigest()

        def where(self):
            return self.sha, ray.get_runtime_context().get_node_id()

    @ray.remote
    def slow_made(seed, size):
        _time.sleep(1.5)
        return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    out = {}
    here_id = ray.get_runtime_context().get_node_id()
    ref = made.options(**on).remote(26, M20)
    until(lambda: recorded(ref))
    sha, node = ray.get(Holder.remote(ref).where.remote(), timeout=120)
    out["a"] = [sha == expected(26, M20), node == member, pulled(), fetched(), here(ref)]
    running = slow_made.options(**on).remote(27, M20)
    sha, node = ray.get(Holder.remote(running).where.remote(), timeout=120)
    out["running"] = [sha == expected(27, M20), node == member, pulled(), fetched(),
                      here(running)]
    sha, node = ray.get(Holder.options(**on_b).remote(ref).where.remote(), timeout=120)
    out["b"] = [sha == expected(26, M20), node == member_b, pulled(), fetched()]
    to_here = dict(scheduling_strategy=NodeAffinitySchedulingStrategy(here_id, soft=False))
    sha, node = ray.get(Holder.options(**to_here).remote(ref).where.remote(), timeout=120)
    out["local"] = [sha == expected(26, M20), node == here_id, pulled()]
    del ref, running
    out["freed"] = [until(lambda: not kept(), 30), until(lambda: not kept_b(), 30)]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts), **_env_b(hosts))
    assert doc["a"] == [True, True, 0, 0, False], doc
    assert doc["running"] == [True, True, 0, 0, False], doc
    assert doc["b"] == [True, True, 0, 1], doc
    assert doc["local"] == [True, True, 1], doc
    assert doc["freed"] == [True, True], doc
    assert _member_kept(hosts) == [] and _kept_b(hosts) == []


def test_member_a_killed_before_an_actor_on_b_reads_its_constructor_argument(
        hosts, members):
    """A dies after keeping the result an actor's constructor is given: the actor held
    to B dies with the constructor's error naming the lost argument (ActorDiedError,
    whether the loss is known at creation or found by B's fetch: the unit test
    test_actor_kept_args.py covers the latter); nothing is left on B."""
    proc = driver(PRELUDE + ACTORS + """
    @ray.remote(max_restarts=1)
    class Holder:
        def __init__(self, array):
            self.size = len(array)

        def size_of(self):
            return self.size

    ref = made.options(**on).remote(28, M20)
    print(json.dumps({"kept": until(lambda: recorded(ref)) and len(kept()) == 1}),
          flush=True)
    sys.stdin.readline()  # A is dead now
    t0 = time.monotonic()
    holder = Holder.options(**on_b).remote(ref)
    try:
        ray.get(holder.size_of.remote(), timeout=90)
        out = {"error": None}
    except Exception as error:
        out = {"error": type(error).__name__, "text": str(error)[:3000],
               "died": isinstance(error, ray.exceptions.ActorDiedError),
               "waited": time.monotonic() - t0}
    out["pulled"] = pulled()
    del ref, holder
    out["left_on_b"] = not until(lambda: not kept_b(), 30)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts),
                  **_env_b(hosts))
    try:
        doc = _after_member_killed(hosts, proc)
        assert doc["died"], doc
        assert "lost" in doc["text"] and "__init__" in doc["text"], doc
        assert doc["waited"] < 60 and not doc["left_on_b"] and doc["pulled"] == 0, doc
        proc.wait(30)
    finally:
        stop_driver(proc)
    assert _kept_b(hosts) == []


def test_an_actor_only_the_members_can_hold_goes_where_its_constructor_argument_is(hosts):
    """Both members have ``box``, the driver's node none: the actor goes to the one that
    keeps its constructor's 20 MB argument (the one a tie between them would not pick)
    and reads that copy there, never pulled or fetched."""
    hosts.start_member(MEMBER, "--num-cpus", "2", "--resources", '{"box": 1}')
    joined = hosts.join(MEMBER_B, hosts.record("127.0.0.1").address, "--num-cpus", "2",
                        "--resources", '{"box": 1}')
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.1").get(MEMBER_B) or {}).get("alive"),
                      10.0)
    doc = _run_driver(hosts, TWO + """
    @ray.remote(resources={"box": 1})
    class Boxed:
        def __init__(self, array):
            self.sha = hashlib.sha256(array).hexdigest()

        def where(self):
            return self.sha, ray.get_runtime_context().get_node_id()

    target = max(member, member_b)  # without locality the tie goes to the smaller id
    keep = dict(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=False))
    ref = made.options(**keep).remote(31, M20)
    until(lambda: recorded(ref))
    sha, node = ray.get(Boxed.remote(ref).where.remote(), timeout=120)
    out = {"boxed": [sha == expected(31, M20), node == target, pulled(), fetched()]}
    del ref
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=180, MEMBER_ROOT_TAG=_member_tag(hosts), **_env_b(hosts))
    assert doc["boxed"] == [True, True, 0, 0], doc
