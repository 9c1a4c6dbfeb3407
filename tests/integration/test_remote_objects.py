"""Large objects between fake hosts (issue 16): a task on the member's 200 MB result and
200 MB argument arrive bit-exact, also the second time, when the driver receives the
result into a recycled segment of its store and the worker receives the argument into its
kept buffer; nothing is left on either host (the ``hosts`` fixture's teardown checks every
process, session and segment of both roots).

The scene is test_remote_tasks.py's: a head on 127.0.0.1, a member on 127.0.0.2, a driver
on the head's host placing tasks with ``NodeAffinitySchedulingStrategy(member)``.
"""

from __future__ import annotations

import pytest

from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_tasks import MEMBER, _run_driver


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member's (host, port) with 2 CPUs."""
    yield hosts.start_member(MEMBER, "--num-cpus", "2")


def test_200_mb_results_and_arguments_cross_bit_exact_and_again_into_reused_memory(hosts,
                                                                                  member):
    doc = _run_driver(hosts, """
    import hashlib
    import numpy as np

    N = 200 * 1000 * 1000

    @ray.remote
    def make(seed):
        return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)

    @ray.remote
    def digest(array):
        return (hashlib.sha256(array).hexdigest(), array.flags.writeable,
                ray.get_runtime_context().get_node_id())

    on = dict(scheduling_strategy=there)
    out = {}
    for seed in (1, 2):
        expected = np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)
        value = ray.get(make.options(**on).remote(seed), timeout=120)
        out[f"result{seed}"] = [bool(np.array_equal(value, expected)), value.flags.writeable]
        del value  # freed: the next result may reuse its segment
        ref = ray.put(expected)
        sha, writeable, node = ray.get(digest.options(**on).remote(ref), timeout=120)
        out[f"argument{seed}"] = [sha == hashlib.sha256(expected).hexdigest(), writeable,
                                  node == member]
        del ref, expected
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240)
    assert doc["result1"] == doc["result2"] == [True, False], doc
    assert doc["argument1"] == doc["argument2"] == [True, False, True], doc


def test_a_worker_dying_while_its_large_result_crosses_is_a_worker_crash(hosts, member):
    """The worker is killed while the driver receives its 400 MB result (it kills itself
    once the segment that receives it appears in the driver's shm dir): the task fails
    with WorkerCrashedError (its node is alive), not a "miniray bug" of the half-received
    segment's mapping, and the segment is gone (the teardown checks every host)."""
    doc = _run_driver(hosts, """
    import threading
    import numpy as np
    from miniray._private import runtime

    @ray.remote(max_retries=0)
    def dies_while_sending(shm_dir):
        before = set(os.listdir(shm_dir))

        def kill_once_the_driver_receives():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not set(os.listdir(shm_dir)) - before:
                time.sleep(0.0005)
            os.kill(os.getpid(), 9)

        value = np.ones(400 * 1000 * 1000 // 8)
        threading.Thread(target=kill_once_the_driver_receives, daemon=True).start()
        return value

    shm_dir = runtime.current().store.shm_dir
    try:
        ray.get(dies_while_sending.options(scheduling_strategy=there).remote(shm_dir),
                timeout=120)
        out = {"error": None}
    except Exception as error:
        out = {"error": type(error).__name__, "text": str(error)[:300]}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240)
    assert doc["error"] == "WorkerCrashedError", doc
