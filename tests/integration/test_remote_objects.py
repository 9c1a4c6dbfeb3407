"""Large objects between fake hosts (issue 16): a task on the member's 200 MB result and
200 MB argument arrive bit-exact, also the second time, when the driver receives the
result into a recycled segment of its store and the worker receives the argument into its
kept buffer; nothing is left on either host (the ``hosts`` fixture's teardown checks every
process, session and segment of both roots).

Results kept on the member (docs/remote-objects.md): a 200 MB result stays in the member's
shm dir until ``get`` pulls it (two racing gets share one pull), bit-exact; ``del`` frees
the member's copy; a driver killed with SIGKILL leaves nothing there; the member killed
before ``get``: ObjectLostError. The member's kept segments are found by the member root's
tag (``mr_<tag>``, as the teardown's leak check finds them).

The scene is test_remote_tasks.py's: a head on 127.0.0.1, a member on 127.0.0.2, a driver
on the head's host placing tasks with ``NodeAffinitySchedulingStrategy(member)``.
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
from .test_remote_tasks import MEMBER, PRELUDE, _run_driver


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
    segment's mapping, and the segment is gone (the teardown checks every host). The
    result crosses at once here (``MINIRAY_KEEP_REMOTE_RESULTS=0``): the path kept for
    what the member cannot keep."""
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
    """, timeout=240, MINIRAY_KEEP_REMOTE_RESULTS="0")
    assert doc["error"] == "WorkerCrashedError", doc


KEPT = """
    import threading
    import numpy as np
    from miniray._private import runtime
    from miniray._private.object_store import shm_segments

    N = 200 * 1000 * 1000
    SHM = runtime.current().store.shm_dir
    TAG = "mr_" + os.environ["MEMBER_ROOT_TAG"]

    def kept():
        return sorted(n for n in os.listdir(SHM) if n.startswith(TAG))

    def here(ref):
        store = runtime.current().store
        return os.path.exists(os.path.join(store.shm_dir, shm_segments.segment_name(
            store.session_tag, ref.binary())))

    def recorded(ref):  # the task is done and its owner records where the value is
        entry = runtime.current().owner.objects.get(ref.binary())
        return entry is not None and entry.remote is not None

    def until(check, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not check():
            time.sleep(0.02)
        return check()

    @ray.remote
    def make(seed):
        return np.random.default_rng(seed).integers(0, 256, N, dtype=np.uint8)

    on = dict(scheduling_strategy=there)
"""


def _member_tag(hosts) -> str:
    return session.root_tag(hosts.env(MEMBER)["MINIRAY_TMPDIR"])


def _member_kept(hosts) -> list[str]:
    prefix = "mr_" + _member_tag(hosts)
    shm = hosts.env(MEMBER).get("MINIRAY_SHM_DIR") or config.DEFAULT_SHM_DIR
    return [n for n in os.listdir(shm) if n.startswith(prefix)]


def test_a_200_mb_result_stays_on_the_member_until_get_and_goes_with_del(hosts, member):
    doc = _run_driver(hosts, KEPT + """
    out = {}
    ref = make.options(**on).remote(1)
    out["kept_before_get"] = until(lambda: recorded(ref)) and len(kept()) == 1
    time.sleep(0.5)  # the task is done: still there, and not here
    out["still_kept"] = len(kept()) == 1 and not here(ref) and recorded(ref)
    expected = np.random.default_rng(1).integers(0, 256, N, dtype=np.uint8)
    values = [None, None]

    def get(i):
        values[i] = ray.get(ref, timeout=120)

    threads = [threading.Thread(target=get, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owner = runtime.current().owner
    out["equal"] = [bool(np.array_equal(v, expected)) for v in values]
    out["zero_copy"] = [v.flags.writeable for v in values] + [here(ref)]
    out["pulled"] = owner.remote_nodes.kept_results.pulled
    again = ray.get(ref, timeout=30)  # from this store now: no second pull
    out["pulled_again"] = owner.remote_nodes.kept_results.pulled
    del values, threads, again, ref
    out["freed_on_member"] = until(lambda: not kept(), 10)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert doc["kept_before_get"] and doc["still_kept"], doc
    assert doc["equal"] == [True, True], doc
    assert doc["zero_copy"] == [False, False, True], doc
    assert doc["pulled"] == doc["pulled_again"] == 1, doc  # two racing gets, one pull
    assert doc["freed_on_member"], doc
    assert _member_kept(hosts) == []


def test_a_kept_result_as_an_argument_of_tasks_there_and_here_and_of_a_nested_get(
        hosts, member):
    """A kept 20 MB result given to a task on the member, to a local task and read by
    ``get`` inside a member task: bit-exact each time (pulled once, then sent as any
    value of the driver's store); freed on the member after ``del``."""
    doc = _run_driver(hosts, KEPT + """
    import hashlib

    @ray.remote
    def small(seed):
        return np.random.default_rng(seed).integers(0, 256, 20 * 1000 * 1000, dtype=np.uint8)

    @ray.remote
    def digest(array):
        return hashlib.sha256(array).hexdigest()

    @ray.remote
    def nested(refs):
        return hashlib.sha256(ray.get(refs[0])).hexdigest()

    expected = hashlib.sha256(np.random.default_rng(4).integers(
        0, 256, 20 * 1000 * 1000, dtype=np.uint8)).hexdigest()
    out = {}
    for name, call in (("there", lambda ref: digest.options(**on).remote(ref)),
                       ("here", lambda ref: digest.options(  # placed here: pulled
                           scheduling_strategy=NodeAffinitySchedulingStrategy(
                               ray.get_runtime_context().get_node_id(), soft=False)).remote(ref)),
                       ("nested", lambda ref: nested.options(**on).remote([ref]))):
        ref = small.options(**on).remote(4)
        until(lambda: recorded(ref))
        out[name] = [ray.get(call(ref), timeout=60) == expected]
        del ref
        out[name].append(until(lambda: not kept(), 10))
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert doc["there"] == doc["here"] == doc["nested"] == [True, True], doc


def test_a_kept_result_given_to_a_task_on_the_same_member_is_read_there_never_pulled(
        hosts, member):
    """The task (a hard affinity to the member) maps the member's copy: no pull, nothing
    in the driver's store; bit-exact; the copy freed after ``del``."""
    doc = _run_driver(hosts, KEPT + """
    import hashlib

    @ray.remote
    def digest(array):
        return (hashlib.sha256(array).hexdigest(), array.flags.writeable,
                ray.get_runtime_context().get_node_id())

    ref = make.options(**on).remote(5)
    until(lambda: recorded(ref))
    sha, writeable, node = ray.get(digest.options(**on).remote(ref), timeout=120)
    expected = hashlib.sha256(np.random.default_rng(5).integers(
        0, 256, N, dtype=np.uint8)).hexdigest()
    out = {"equal": sha == expected, "writeable": writeable, "there": node == member,
           "pulled": runtime.current().owner.remote_nodes.kept_results.pulled, "here": here(ref)}
    del ref
    out["freed"] = until(lambda: not kept(), 10)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=240, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert doc == {**doc, "equal": True, "writeable": False, "there": True, "pulled": 0,
                   "here": False, "freed": True}, doc


def test_many_kept_results_got_at_once_are_pulled_a_few_at_a_time_all_bit_exact(hosts,
                                                                                 member):
    doc = _run_driver(hosts, KEPT + """
    @ray.remote
    def block(seed):
        return np.full(1 << 20, seed, dtype=np.uint8)

    refs = [block.options(**on).remote(seed) for seed in range(12)]
    until(lambda: all(recorded(ref) for ref in refs))
    values = ray.get(refs, timeout=60)
    out = {"equal": all(bool((v == seed).all()) for seed, v in enumerate(values)),
           "pulled": runtime.current().owner.remote_nodes.kept_results.pulled}
    del values, refs
    out["freed"] = until(lambda: not kept(), 10)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=120, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert doc == {**doc, "equal": True, "pulled": 12, "freed": True}, doc


def test_a_driver_killed_with_sigkill_leaves_nothing_kept_on_the_member(hosts, member):
    proc = driver(PRELUDE + KEPT + """
    ref = make.options(**on).remote(2)
    print(json.dumps({"kept": until(lambda: recorded(ref)) and len(kept()) == 1}),
          flush=True)
    sys.stdin.readline()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts))
    try:
        assert json_line(proc, 120)["kept"]
        assert len(_member_kept(hosts)) == 1
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not _member_kept(hosts), 10.0), _member_kept(hosts)
    finally:
        stop_driver(proc)


def test_the_member_killed_before_get_is_object_lost_error(hosts, member):
    proc = driver(PRELUDE + KEPT + """
    ref = make.options(**on).remote(3)
    print(json.dumps({"kept": until(lambda: recorded(ref)) and len(kept()) == 1}),
          flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    try:
        ray.get(ref, timeout=60)
        out = {"error": None}
    except Exception as error:
        out = {"error": type(error).__name__, "text": str(error),
               "hex": getattr(error, "object_ref_hex", None), "ref": ref.hex(),
               "waited": time.monotonic() - t0}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts))
    try:
        assert json_line(proc, 120)["kept"]
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        proc.stdin.write("\n")
        proc.stdin.flush()
        doc = json_line(proc, 90)
        assert doc["error"] == "ObjectLostError", doc
        assert doc["hex"] == doc["ref"], doc
        assert doc["text"].startswith(f"Failed to retrieve object {doc['ref']}."), doc
        assert f"All copies of {doc['ref']} have been lost due to node failure" in doc["text"]
        assert doc["waited"] < 30, doc
        proc.wait(30)
    finally:
        stop_driver(proc)
