"""Tasks go where their kept arguments are (issue 16; docs/remote-objects.md, "Tasks given a
kept result"): a result kept on member A given to a task without an affinity runs on A and
reads A's copy there (the driver never pulls it), by default placement (``node_pick``'s rule
2: over MOVE_MAX_ARG_BYTES there) and for a resource only A has; a small one keeps the task
local-first (pulled, as before); with a ``put`` here as well, the larger side wins.
``del`` frees every copy; nothing is left on any host (the
``hosts`` fixture's teardown checks every process, session and segment of every root).

Members fetch from each other (``remote_drivers`` step 12): a task on member B given A's
kept result gets it from A with the driver's grant (bit-exact; the driver never pulls
it), B's copy serves B's next task, ``del`` frees both copies; also with TLS on every
host. A killed before or during B's fetch: the task fails with its argument's
ObjectLostError, nothing is left on B.

The scene is test_remote_objects.py's: a head on 127.0.0.1 (2 CPUs), member A on 127.0.0.2
(2 CPUs and one ``a_only``), member B on 127.0.0.3 (2 CPUs), each with its own root and
shm dir.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from miniray._private.core import config
from miniray._private.host import session

from .helpers import driver, json_line, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_objects import KEPT, _member_kept, _member_tag
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver


@pytest.fixture(name="member")
def member_fixture(hosts):
    """Head and member A (2 CPUs, ``a_only``: 1)."""
    yield hosts.start_member(MEMBER, "--num-cpus", "2", "--resources", '{"a_only": 1}')


LOCALITY = KEPT + """
    import hashlib

    M20 = 20 * 1000 * 1000

    @ray.remote
    def made(seed, size):
        return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    @ray.remote
    def digest(array):
        return (hashlib.sha256(array).hexdigest(), ray.get_runtime_context().get_node_id())

    def expected(seed, size):
        return hashlib.sha256(np.random.default_rng(seed).integers(
            0, 256, size, dtype=np.uint8)).hexdigest()

    def pulled():
        return runtime.current().owner.remote_nodes.kept_results.pulled
"""


def test_a_task_given_a_large_kept_result_runs_where_it_is_kept_and_reads_it_there(
        hosts, member):
    doc = _run_driver(hosts, LOCALITY + """
    out = {}
    here_id = ray.get_runtime_context().get_node_id()
    cases = (("default", lambda ref: digest.remote(ref), True),
             ("only_a", lambda ref: digest.options(resources={"a_only": 1}).remote(ref), True),
             ("before_kept", lambda ref: digest.remote(ref), False))
    for seed, (name, call, settled) in enumerate(cases):
        ref = made.options(**on).remote(seed, M20)
        if settled:  # kept already when the task is submitted; else placed once it is
            until(lambda: recorded(ref))
        sha, node = ray.get(call(ref), timeout=120)
        out[name] = [sha == expected(seed, M20), node == member, pulled(), here(ref)]
        del ref
        out[name].append(until(lambda: not kept(), 30))
    # A small kept result (1 MB): the task stays local-first and the value is pulled.
    ref = made.options(**on).remote(7, 1 << 20)
    until(lambda: recorded(ref))
    sha, node = ray.get(digest.remote(ref), timeout=60)
    out["small"] = [sha == expected(7, 1 << 20), node == here_id, pulled(), here(ref)]
    del ref
    out["small"].append(until(lambda: not kept(), 30))

    @ray.remote
    def both(array, other):
        return (hashlib.sha256(array).hexdigest(), ray.get_runtime_context().get_node_id())

    # Mixed: 20 MB kept on A and a ``put`` here; the bytes weigh (rule 2's exception).
    for name, here_size in (("mixed_more_here", 30 * 1000 * 1000), ("mixed_less_here", 1 << 20)):
        before = pulled()
        ref = made.options(**on).remote(8, M20)
        until(lambda: recorded(ref))
        local = ray.put(np.zeros(here_size, dtype=np.uint8))
        sha, node = ray.get(both.remote(ref, local), timeout=120)
        out[name] = [sha == expected(8, M20), node == (here_id if here_size > M20 else member),
                     pulled() - before]
        del ref, local
        out[name].append(until(lambda: not kept(), 30))
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts))
    for name in ("default", "only_a", "before_kept"):
        assert doc[name] == [True, True, 0, False, True], (name, doc)
    assert doc["small"] == [True, True, 1, True, True], doc
    assert doc["mixed_more_here"] == [True, True, 1, True], doc  # pulled here
    assert doc["mixed_less_here"] == [True, True, 0, True], doc  # read on A
    assert _member_kept(hosts) == []


MEMBER_B = "127.0.0.3"


@pytest.fixture(name="members")
def members_fixture(hosts, member):
    """Head, member A and member B (127.0.0.3, 2 CPUs)."""
    hosts.join_alive(MEMBER_B, hosts.record("127.0.0.1").address, "--num-cpus", "2",
                     within=10.0)
    yield member


TWO = LOCALITY + """
    member_b = next(n["NodeID"] for n in ray.nodes()
                    if n["NodeManagerAddress"] == "127.0.0.3" and n["Alive"])
    on_b = dict(scheduling_strategy=NodeAffinitySchedulingStrategy(member_b, soft=False))
    TAG_B = "mr_" + os.environ["MEMBER_B_ROOT_TAG"]
    SHM_B = os.environ["MEMBER_B_SHM"]

    def kept_b():  # B's kept segments (not the link's budget file)
        return sorted(n for n in os.listdir(SHM_B) if n.startswith(TAG_B)
                      and not n.endswith("_budget"))

    def fetched():
        return runtime.current().owner.remote_nodes.kept_results.fetched
"""


def _env_b(hosts) -> dict:
    env = hosts.env(MEMBER_B)
    return {"MEMBER_B_ROOT_TAG": session.root_tag(env["MINIRAY_TMPDIR"]),
            "MEMBER_B_SHM": env.get("MINIRAY_SHM_DIR") or config.DEFAULT_SHM_DIR}


def _kept_b(hosts) -> list:
    env = _env_b(hosts)
    return [n for n in os.listdir(env["MEMBER_B_SHM"])
            if n.startswith("mr_" + env["MEMBER_B_ROOT_TAG"]) and not n.endswith("_budget")]


FETCH = TWO + """
    out = {}
    ref = made.options(**on).remote(11, M20)
    until(lambda: recorded(ref))
    sha, node = ray.get(digest.options(**on_b).remote(ref), timeout=120)
    out["first"] = [sha == expected(11, M20), node == member_b, pulled(), fetched(), here(ref),
                    len(kept()), len(kept_b())]
    sha, node = ray.get(digest.options(**on_b).remote(ref), timeout=120)  # B's copy again
    out["again"] = [sha == expected(11, M20), node == member_b, pulled(), fetched(),
                    len(kept_b())]
    del ref
    out["freed"] = [until(lambda: not kept(), 30), until(lambda: not kept_b(), 30)]
    print(json.dumps(out), flush=True)
    ray.shutdown()
"""


def _fetched_directly(hosts) -> None:
    doc = _run_driver(hosts, FETCH, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts),
                      **_env_b(hosts))
    assert doc["first"] == [True, True, 0, 1, False, 1, 1], doc
    assert doc["again"] == [True, True, 0, 1, 1], doc
    assert doc["freed"] == [True, True], doc
    assert _member_kept(hosts) == [] and _kept_b(hosts) == []


def test_a_task_on_member_b_gets_member_as_kept_result_from_a_never_through_the_driver(
        hosts, members):
    """Bit-exact, the driver never holds it (no pull, nothing in its store), B's copy
    serves B's next task, ``del`` frees both copies."""
    _fetched_directly(hosts)


def test_the_fetch_between_members_works_with_tls_on_every_host(hosts, tmp_path):
    from .test_remote_tls import _tls_on_hosts

    _tls_on_hosts(hosts, tmp_path, ("127.0.0.1", MEMBER, MEMBER_B))
    hosts.start_member(MEMBER, "--num-cpus", "2")
    hosts.join_alive(MEMBER_B, hosts.record("127.0.0.1").address, "--num-cpus", "2",
                     within=10.0)
    _fetched_directly(hosts)


@pytest.mark.parametrize("when", ["before", "during", "before_through_driver"])
def test_member_a_killed_before_or_while_b_fetches_is_object_lost_error(hosts, members,
                                                                        when):
    """A's node is SIGKILLed before the task on B starts, or once B's copy appears in B's
    shm dir (the fetch runs): the task fails with the ObjectLostError of its argument, as
    a local task's pull would; nothing is left on B. ``before_through_driver``: the same
    with ``MINIRAY_FETCH_BETWEEN_NODES=0`` (the driver's own pull fails)."""
    proc = driver(PRELUDE + TWO + """
    ref = made.options(**on).remote(12, 200 * 1000 * 1000)
    print(json.dumps({"kept": until(lambda: recorded(ref)) and len(kept()) == 1}),
          flush=True)
    if sys.stdin.readline().strip().startswith("before"):
        sys.stdin.readline()  # A is dead now
    t0 = time.monotonic()
    try:
        ray.get(digest.options(**on_b).remote(ref), timeout=90)
        out = {"error": None}
    except Exception as error:
        out = {"error": type(error).__name__, "text": str(error)[:2000],
               "lost": isinstance(error, ray.exceptions.ObjectLostError),
               "waited": time.monotonic() - t0}
    out["pulled"], out["fetched"] = pulled(), fetched()
    del ref
    out["left_on_b"] = not until(lambda: not kept_b(), 30)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts),
                  MINIRAY_FETCH_BETWEEN_NODES="0" if when == "before_through_driver" else "1",
                  **_env_b(hosts))
    try:
        assert json_line(proc, 120)["kept"]
        proc.stdin.write(when + "\n")
        proc.stdin.flush()
        if when == "during":
            assert wait_until(lambda: _kept_b(hosts), 30.0, interval=0.001)
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        if when != "during":
            proc.stdin.write("\n")
            proc.stdin.flush()
        doc = json_line(proc, 120)
        assert doc["error"] is not None and doc["lost"], doc
        assert "All copies of" in doc["text"] and "lost due to node failure" in doc["text"], doc
        assert doc["waited"] < 60 and not doc["left_on_b"], doc
        assert doc["fetched"] == 0, doc
        proc.wait(30)
    finally:
        stop_driver(proc)
    assert _kept_b(hosts) == []
