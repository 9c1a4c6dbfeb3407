"""Large results of the actor service's actors stay on their node (issue 16, "a result stays
on its node until needed"; docs/remote-objects.md, "Results of the actor service's actors").

A head on 127.0.0.1 (2 CPUs) and a member on 127.0.0.2 (4 CPUs and 2 "special", which only
it has), each with its own root and shm dir (``FakeHosts``). A detached named actor that
only the member can hold lives in the head's actor service and runs on the member. Its
20 MB result stays in the member's shm dir (the service's link keeps it) until the calling
driver gets it: the driver's store has no copy before; ``get`` pulls it with the service's
grant (zero-copy numpy after); ``del`` frees it on the member; so does the driver's exit; a
task on the member given it reads it there (never pulled to the driver); an error result
still raises the actor's error; the member killed first, ``get`` raises ObjectLostError.
Past the member's cap for the service's link a result crosses at once. A second driver on
the member's host, and a task calling the actor by name, get their own results. A driver
whose HELLO names no node gets the value (the service pulls it for it). The
member's kept segments are found by its root's tag (``mr_<tag>``, as the teardown's leak
check finds them).
"""

from __future__ import annotations

import os
import subprocess
import textwrap

from miniray._private.core import config
from miniray._private.host import session

from .helpers import KEPT_PROBES, driver, finish_json, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_objects import GET_AFTER_KILL, _after_member_killed
from .test_remote_tasks import MEMBER, _join_special

PRELUDE = """
    import json, os, sys, time
    import numpy as np
    import miniray as ray
    from miniray._private import runtime
    from miniray._private.object_store import shm_segments
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init(address="auto", namespace="shared")
    member = next(n["NodeID"] for n in ray.nodes()
                  if n["NodeManagerAddress"] == "127.0.0.2" and n["Alive"])
    there = NodeAffinitySchedulingStrategy(member, soft=False)
    SHM, TAG = os.environ["MEMBER_SHM"], "mr_" + os.environ["MEMBER_ROOT_TAG"]
    N = 20 * 1000 * 1000

""" + KEPT_PROBES + """
    def expected(seed):
        return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)
    """

KEEPER = """
    @ray.remote(resources={"special": 1})
    class Keeper:
        def array(self, seed):
            return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)

        def fail(self):
            raise ValueError("the keeper refuses")

        def node(self):
            return ray.get_runtime_context().get_node_id()
    """


def _member_tag(hosts) -> str:
    return session.root_tag(hosts.env(MEMBER)["MINIRAY_TMPDIR"])


def _member_shm(hosts) -> str:
    return hosts.env(MEMBER).get("MINIRAY_SHM_DIR") or config.DEFAULT_SHM_DIR


def _member_kept(hosts) -> list[str]:
    prefix = "mr_" + _member_tag(hosts)
    return [n for n in os.listdir(_member_shm(hosts))
            if n.startswith(prefix) and not n.endswith("_budget")]


def _run(hosts, body: str, ip: str = "127.0.0.1", timeout: float = 120, **env) -> dict:
    """Run a driver on host ``ip`` to its end; its JSON line, with its stdout and stderr."""
    proc = driver(textwrap.dedent(PRELUDE) + textwrap.dedent(body), hosts.env(ip),
                  MEMBER_SHM=_member_shm(hosts), MEMBER_ROOT_TAG=_member_tag(hosts), **env)
    return finish_json(proc, timeout)


def test_a_service_actors_large_result_stays_on_the_member_until_get(hosts):
    _join_special(hosts)
    first = _run(hosts, KEEPER + """
    import hashlib

    @ray.remote
    def digest(array):
        return (hashlib.sha256(array).hexdigest(), ray.get_runtime_context().get_node_id())

    keeper = Keeper.options(name="keeper", lifetime="detached").remote()
    out = {"on_member": ray.get(keeper.node.remote(), timeout=60) == member}
    pulled = lambda: runtime.current().owner.remote_nodes.kept_results.pulled

    ref = keeper.array.remote(1)
    out["recorded"] = until(lambda: recorded(ref))
    time.sleep(0.3)  # done: still on the member, and not here
    out["kept_before_get"] = [len(kept()), here(ref)]
    value = ray.get(ref, timeout=60)
    out["get"] = [bool(np.array_equal(value, expected(1))), value.flags.writeable, here(ref),
                  pulled()]
    del value, ref
    out["freed_on_member"] = until(lambda: not kept())

    # Given to a task on the member, it is read there: never pulled to this driver.
    ref = keeper.array.remote(2)
    until(lambda: recorded(ref))
    sha, node = ray.get(digest.options(scheduling_strategy=there).remote(ref), timeout=60)
    out["task_there"] = [sha == hashlib.sha256(expected(2)).hexdigest(), node == member,
                         here(ref), pulled()]
    del ref
    out["freed_after_task"] = until(lambda: not kept())

    try:
        ray.get(keeper.fail.remote(), timeout=30)
        out["error"] = "no error"
    except ValueError as error:
        out["error"] = ["ValueError", "the keeper refuses" in str(error)]
    except Exception as error:
        out["error"] = f"{type(error).__name__}: {error}"

    # Left for the exit: this driver's leaving frees it on the member.
    ref = keeper.array.remote(3)
    out["kept_at_exit"] = until(lambda: recorded(ref)) and len(kept()) == 1
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert first["on_member"], first
    assert first["recorded"] and first["kept_before_get"] == [1, False], first
    assert first["get"] == [True, False, True, 1], first  # zero-copy, pulled once
    assert first["freed_on_member"], first
    assert first["task_there"] == [True, True, False, 1], first  # read on the member
    assert first["freed_after_task"], first
    assert first["error"] == ["ValueError", True], first
    assert first["kept_at_exit"], first
    assert wait_until(lambda: not _member_kept(hosts), 30.0), _member_kept(hosts)

    # A second driver, on the member's host, and a task of it calling the actor by name:
    # each its own result.
    second = _run(hosts, """
    keeper = ray.get_actor("keeper")

    @ray.remote
    def through_task(seed):
        value = ray.get(ray.get_actor("keeper").array.remote(seed))
        return bool(np.array_equal(value, expected(seed)))

    ref = keeper.array.remote(4)
    out = {"recorded": until(lambda: recorded(ref)), "kept": len(kept()),
           "here_before": here(ref)}
    value = ray.get(ref, timeout=60)
    out["get"] = [bool(np.array_equal(value, expected(4))), value.flags.writeable]
    del value, ref
    out["freed"] = until(lambda: not kept())
    out["task"] = ray.get(through_task.remote(5), timeout=60)
    out["freed_after_task"] = until(lambda: not kept())
    ray.kill(keeper)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, ip=MEMBER)
    assert second["recorded"] and second["kept"] == 1 and not second["here_before"], second
    assert second["get"] == [True, False], second
    assert second["freed"] and second["task"] and second["freed_after_task"], second
    assert _member_kept(hosts) == []


def test_past_the_members_cap_an_actor_services_results_cross_at_once(hosts):
    """MINIRAY_KEPT_BYTES_PER_DRIVER of 3.5 MiB on the member (the cap of the service's
    link there): of eight 1 MiB results of the service's actor at most three stay there,
    the others cross at once, as before; all bit-exact, nothing left after ``del``."""
    hosts.env(MEMBER).update(MINIRAY_KEPT_BYTES_PER_DRIVER=str(7 << 19))
    _join_special(hosts)
    doc = _run(hosts, """
    from miniray._private.owner.object_table import READY

    @ray.remote(resources={"special": 1})
    class Blocks:
        def block(self, seed):
            return np.full(1 << 20, seed, dtype=np.uint8)

    def done(ref):  # here (READY) or kept there (recorded): not pulled by a wait
        entry = runtime.current().owner.objects.get(ref.binary())
        return entry is not None and (entry.state == READY or entry.remote is not None)

    blocks = Blocks.options(name="blocks", lifetime="detached").remote()
    refs = [blocks.block.remote(seed) for seed in range(8)]
    until(lambda: all(done(r) for r in refs), 60)
    out = {"kept": len(kept()), "remote": sum(recorded(r) for r in refs)}
    values = ray.get(refs, timeout=60)
    out["equal"] = all(bool((v == seed).all()) for seed, v in enumerate(values))
    del values, refs
    out["freed"] = until(lambda: not kept())
    ray.kill(blocks)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert 1 <= doc["remote"] <= 3 and doc["kept"] == doc["remote"], doc
    assert doc["equal"] and doc["freed"], doc
    assert _member_kept(hosts) == []


def test_the_member_killed_before_get_is_object_lost_error(hosts):
    """The member's node SIGKILLed while it keeps the service actor's result: the caller's
    ``get`` raises ObjectLostError naming the object, within seconds."""
    _join_special(hosts)
    proc = driver(textwrap.dedent(PRELUDE) + textwrap.dedent(KEEPER + """
    keeper = Keeper.options(name="keeper", lifetime="detached").remote()
    ref = keeper.array.remote(1)
    """ + GET_AFTER_KILL), hosts.env("127.0.0.1"), stdin=subprocess.PIPE,
                  MEMBER_SHM=_member_shm(hosts), MEMBER_ROOT_TAG=_member_tag(hosts))
    try:
        doc = _after_member_killed(hosts, proc, 90)
        assert doc["error"] == "ObjectLostError" and doc["hex"] == doc["ref"], doc
        assert doc["waited"] < 30, doc
        proc.wait(30)
    finally:
        stop_driver(proc)


def test_a_service_actor_on_the_head_keeps_its_result_there_for_a_member_driver(hosts):
    """A named actor the head's actor service runs on the head itself, called by a driver
    on the member's host: its 20 MB result stays in the head's shm dir (the service's own
    link to its node keeps it) until that driver's ``get`` pulls it; ``del`` frees it
    there. A driver on the head's host gets it in its store at once, as before."""
    _join_special(hosts)
    head_shm = hosts.env("127.0.0.1").get("MINIRAY_SHM_DIR") or config.DEFAULT_SHM_DIR
    head_tag = session.root_tag(hosts.env("127.0.0.1")["MINIRAY_TMPDIR"])
    doc = _run(hosts, """
    SHM, TAG = os.environ["HEAD_SHM"], "mr_" + os.environ["HEAD_ROOT_TAG"]
    head = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.1")

    def kept_on_head():  # the head's kept segments (its links' files, not the budget)
        return sorted(n for n in os.listdir(SHM) if n.startswith(TAG)
                      and not n.endswith("_budget") and os.stat(os.path.join(SHM, n)).st_size
                      >= N)

    @ray.remote
    class Local:
        def array(self, seed):
            return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)

        def node(self):
            return ray.get_runtime_context().get_node_id()

    local = Local.options(name="local", lifetime="detached").remote()
    out = {"on_head": ray.get(local.node.remote(), timeout=60) == head}
    ref = local.array.remote(6)
    out["recorded"] = until(lambda: recorded(ref))
    out["kept"] = [len(kept_on_head()), here(ref)]
    value = ray.get(ref, timeout=60)
    out["get"] = [bool(np.array_equal(value, expected(6))), value.flags.writeable, here(ref)]
    del value, ref
    out["freed"] = until(lambda: not kept_on_head())
    ray.kill(local)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, ip=MEMBER, HEAD_SHM=head_shm, HEAD_ROOT_TAG=head_tag)
    assert doc["on_head"] and doc["recorded"] and doc["kept"] == [1, False], doc
    assert doc["get"] == [True, False, True] and doc["freed"], doc


def test_a_driver_that_names_no_node_gets_a_kept_result_as_a_value(hosts):
    """A driver whose SVC_HELLO names no node (every driver of this version names it; an
    older one did not) cannot be granted a result kept on the member: the service pulls
    it for that driver and sends it as a value, as before results were kept (it got
    ObjectLostError "link lost"); the member keeps nothing afterwards."""
    _join_special(hosts)
    doc = _run(hosts, KEEPER + """
    owner = runtime.current().owner
    node_id = owner.hello_info["node_id"]
    owner.hello_info["node_id"] = ""  # the link's HELLO names no node
    keeper = Keeper.options(name="nameless", lifetime="detached").remote()
    out = {"on_member": ray.get(keeper.node.remote(), timeout=60) == member}
    owner.hello_info["node_id"] = node_id
    ref = keeper.array.remote(6)
    try:
        value = ray.get(ref, timeout=60)
        out["get"] = [bool(np.array_equal(value, expected(6))), recorded(ref)]
    except Exception as error:
        out["get"] = f"{type(error).__name__}: {error}"
    out["member_kept"] = until(lambda: not kept())
    ray.kill(keeper)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert doc["on_member"], doc
    assert doc["get"] == [True, False], doc  # a value, not a kept reference
    assert doc["member_kept"], doc
    assert wait_until(lambda: not _member_kept(hosts), 30.0), _member_kept(hosts)
