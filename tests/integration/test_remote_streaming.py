"""Generators across fake hosts: a task's or an actor's values stream back from another host.

A head on 127.0.0.1 and a member on 127.0.0.2 (``FakeHosts`` of test_cluster_join.py, each
with its own root, checked on teardown). A streaming task on the member (by affinity, and
spilled there when the head is full), a large value among its items (its bytes follow the
YIELD into the driver's store), an error raised mid-stream, a dynamic generator, a task on
the member iterating a generator it made (stream next served by the driver), and sync,
async and threaded actors on the member with streaming methods.
"""

from __future__ import annotations

import pytest

from .helpers import wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_tasks import MEMBER, _run_driver


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member has 2 CPUs, the head none (what runs
    without an affinity spills to the member)."""
    head = hosts.start_head("--num-cpus", "0")
    joined = hosts.join(MEMBER, head, "--num-cpus", "2")
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.1").get(MEMBER) or {}).get("alive"), 30.0)


STREAMS = """
    import numpy as np

    @ray.remote(num_returns="streaming")
    def items(n, big):
        node = ray.get_runtime_context().get_node_id()
        for i in range(n):
            yield (i, node)
        yield np.full(big // 8, 7, dtype=np.int64)  # its bytes follow the YIELD
        raise ValueError("stream ended badly")

    @ray.remote
    def dynamic(n):
        for i in range(n):
            yield np.full(1 << 15, i, dtype=np.int64)  # 256 KiB each: put by the worker

    @ray.remote
    def consume(n):  # a generator made and iterated on the member: the driver's values
        gen = items.remote(n, 1 << 20)
        return [ray.get(next(gen)) for _ in range(3)]
"""


def test_a_streaming_task_on_the_member_yields_values_large_ones_and_its_error(hosts,
                                                                               member):
    doc = _run_driver(hosts, STREAMS + """
    out = {"member": member}
    values, error = [], None
    gen = items.options(scheduling_strategy=there).remote(3, 20 << 20)
    try:
        for ref in gen:
            values.append(ray.get(ref, timeout=60))
    except ValueError as caught:  # the generator's own error, raised at its place
        error = str(caught)
    out["small"] = [list(v) for v in values[:3]]
    big = values[3]
    out["big"] = [int(big.nbytes), int(big[0]), int(big[-1]), bool(big.flags.writeable)]
    out["error"] = error
    del big, values, gen
    # Spilled: the head has no CPU, so the generator runs on the member without affinity.
    gen = items.remote(2, 1 << 20)
    out["spilled"] = [list(ray.get(next(gen), timeout=60)) for _ in range(2)]
    refs = ray.get(dynamic.options(num_returns="dynamic").remote(3), timeout=60)
    out["dynamic"] = [int(ray.get(ref, timeout=60)[0]) for ref in refs]
    out["consumed"] = ray.get(consume.options(scheduling_strategy=there).remote(5),
                              timeout=60)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=150)
    node = doc["member"]
    assert doc["small"] == [[0, node], [1, node], [2, node]], doc
    assert doc["big"] == [20 << 20, 7, 7, False], doc  # zero-copy in the driver's store
    assert doc["error"] and "stream ended badly" in doc["error"], doc
    assert doc["spilled"] == [[0, node], [1, node]], doc
    assert doc["dynamic"] == [0, 1, 2], doc
    assert doc["consumed"] == [[0, node], [1, node], [2, node]], doc


def test_streaming_methods_of_actors_on_the_member(hosts, member):
    doc = _run_driver(hosts, """
    import asyncio
    import numpy as np

    @ray.remote
    class Sync:
        def count(self, n, big):
            for i in range(n):
                yield i
            yield np.ones(big // 8)

    @ray.remote
    class Async:
        async def count(self, n):
            for i in range(n):
                await asyncio.sleep(0.01)
                yield ("async", i)

    @ray.remote(max_concurrency=3)
    class Threaded:
        def count(self, n, big):
            for i in range(n):
                yield np.full(big // 8, i, dtype=np.int64)

        def node(self):
            return ray.get_runtime_context().get_node_id()

    on = dict(scheduling_strategy=there)
    out = {"member": member}
    sync = Sync.options(**on).remote()
    values = [ray.get(ref, timeout=60)
              for ref in sync.count.options(num_returns="streaming").remote(3, 8 << 20)]
    out["sync"] = values[:3] + [float(values[3].sum())]
    del values
    actor = Async.options(**on).remote()
    out["async"] = [list(ray.get(ref, timeout=60)) for ref in actor.count.remote(3)]
    threaded = Threaded.options(**on).remote()
    gens = [threaded.count.options(num_returns="streaming").remote(3, 1 << 20)
            for _ in range(3)]  # three at once, each with large values
    out["threaded"] = [[int(ray.get(ref, timeout=60)[-1]) for ref in gen] for gen in gens]
    out["node"] = ray.get(threaded.node.remote(), timeout=30)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=150)
    assert doc["sync"] == [0, 1, 2, float((8 << 20) // 8)], doc
    assert doc["async"] == [["async", 0], ["async", 1], ["async", 2]], doc
    assert doc["threaded"] == [[0, 1, 2]] * 3, doc
    assert doc["node"] == doc["member"], doc
