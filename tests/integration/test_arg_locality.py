"""Tasks go where their kept arguments are (issue 16; docs/remote-objects.md, "Tasks given a
kept result"): a result kept on member A given to a task without an affinity runs on A and
reads A's copy there (the driver never pulls it), by default placement (``node_pick``'s rule
2: over MOVE_MAX_ARG_BYTES there) and for a resource only A has; a small one keeps the task
local-first (pulled, as before). ``del`` frees every copy; nothing is left on any host (the
``hosts`` fixture's teardown checks every process, session and segment of every root).

The scene is test_remote_objects.py's: a head on 127.0.0.1 (2 CPUs), member A on 127.0.0.2
(2 CPUs and one ``a_only``), each with its own root and shm dir.
"""

from __future__ import annotations

import pytest

from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_objects import KEPT, _member_kept, _member_tag
from .test_remote_tasks import MEMBER, _run_driver


@pytest.fixture
def member(hosts):
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
        out[name].append(until(lambda: not kept(), 10))
    # A small kept result (1 MB): the task stays local-first and the value is pulled.
    ref = made.options(**on).remote(7, 1 << 20)
    until(lambda: recorded(ref))
    sha, node = ray.get(digest.remote(ref), timeout=60)
    out["small"] = [sha == expected(7, 1 << 20), node == here_id, pulled(), here(ref)]
    del ref
    out["small"].append(until(lambda: not kept(), 10))
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts))
    for name in ("default", "only_a", "before_kept"):
        assert doc[name] == [True, True, 0, False, True], (name, doc)
    assert doc["small"] == [True, True, 1, True, True], doc
    assert _member_kept(hosts) == []
