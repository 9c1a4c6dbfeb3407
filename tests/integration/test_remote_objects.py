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

Their limits and failures: the member's cap per driver (results past it sent at once;
``miniray status`` on the member, and on the head for a driver on the member's host, counts
what is kept; ``list_objects`` names the node), a pull into a full driver store (raised for
that get, pulled again by a later one), and a pull from a SIGSTOPped member (ended once the
view holds it dead, within a few seconds).

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

from .helpers import KEPT_PROBES, cli, driver, go_on, json_line, stop_driver, wait_until
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

""" + KEPT_PROBES + """
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
    return [n for n in os.listdir(shm) if n.startswith(prefix) and not n.endswith("_budget")]


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
        assert wait_until(lambda: not _member_kept(hosts), 30.0), _member_kept(hosts)
    finally:
        stop_driver(proc)


def _after_member_killed(hosts, proc, timeout: float = 120) -> dict:
    """The driver ``proc`` said its object is kept on the member: SIGKILL the member's node,
    let the driver go on (a line on its stdin), and return what it printed next."""
    assert json_line(proc, 120)["kept"]
    os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
    return go_on(proc, timeout)


# The end of a driver script whose ``ref`` is kept on the member (KEPT_PROBES): it says so,
# waits for a line on its stdin (``_after_member_killed``: the member's node is killed) and
# prints how its ``get`` of ``ref`` then ended.
GET_AFTER_KILL = """
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
    """


def test_the_member_killed_before_get_is_object_lost_error(hosts, member):
    proc = driver(PRELUDE + KEPT + """
    ref = make.options(**on).remote(3)
    """ + GET_AFTER_KILL, hosts.env("127.0.0.1"), stdin=subprocess.PIPE,
                  MEMBER_ROOT_TAG=_member_tag(hosts))
    try:
        doc = _after_member_killed(hosts, proc, 90)
        assert doc["error"] == "ObjectLostError", doc
        assert doc["hex"] == doc["ref"], doc
        assert doc["text"].startswith(f"Failed to retrieve object {doc['ref']}."), doc
        assert f"All copies of {doc['ref']} have been lost due to node failure" in doc["text"]
        assert doc["waited"] < 30, doc
        proc.wait(30)
    finally:
        stop_driver(proc)


# ------------------------------------------------ limits and failures of kept results
def _start_member(hosts, *head_args, **member_env) -> None:
    """The ``member`` fixture's scene, with the head's ``start`` arguments and settings of
    the member's node."""
    hosts.env(MEMBER).update(member_env)
    head = hosts.start_head(*head_args)
    joined = hosts.join(MEMBER, head, "--num-cpus", "2")
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.1").get(MEMBER) or {}).get("alive"),
                      30.0)


def test_past_the_members_cap_per_driver_results_are_sent_at_once_never_lost(hosts):
    """MINIRAY_KEPT_BYTES_PER_DRIVER of 3.5 MiB on the member: of eight 1 MiB results at
    most three stay there, the others come at once; all bit-exact, no error. The member's
    ``miniray status`` counts what it keeps for the driver; ``list_objects`` shows where
    they are (the member's node id and IP)."""
    _start_member(hosts, MINIRAY_KEPT_BYTES_PER_DRIVER=str(7 << 19))
    proc = driver(PRELUDE + KEPT + """
    @ray.remote
    def block(seed):
        return np.full(1 << 20, seed, dtype=np.uint8)

    from miniray._private.owner.object_table import READY

    def done(ref):  # sent (READY here) or kept there (recorded): not pulled by a wait
        entry = runtime.current().owner.objects.get(ref.binary())
        return entry is not None and (entry.state == READY or entry.remote is not None)

    refs = [block.options(**on).remote(seed) for seed in range(8)]
    until(lambda: all(done(r) for r in refs))
    remote = sum(recorded(r) for r in refs)
    from miniray.util.state import list_objects

    rows = {row.object_id: row for row in list_objects(detail=True, limit=1000)}
    where = sorted({(rows[r.hex()].node_id == member, rows[r.hex()].ip,
                     rows[r.hex()].object_size > 1 << 20) for r in refs if recorded(r)})
    print(json.dumps({"kept": len(kept()), "remote": remote, "where": where}), flush=True)
    sys.stdin.readline()
    values = ray.get(refs, timeout=60)
    out = {"equal": all(bool((v == seed).all()) for seed, v in enumerate(values))}
    del values, refs
    out["freed"] = until(lambda: not kept(), 10)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts))
    try:
        doc = json_line(proc, 120)
        assert 1 <= doc["kept"] <= 3 and doc["remote"] == doc["kept"], doc
        assert doc["where"] == [[True, MEMBER, True]], doc  # list_objects: on the member
        status = wait_until(lambda: _kept_line(hosts) == (
            f"Objects kept for remote drivers: {doc['kept']}, "), 30.0)
        assert status, cli(hosts.env(MEMBER), "status").stdout
        proc.stdin.write("\n")
        proc.stdin.flush()
        doc = json_line(proc, 120)
        assert doc == {"equal": True, "freed": True}, doc
        proc.wait(30)
        assert wait_until(lambda: _kept_line(hosts) == "Objects kept for remote drivers: 0, ",
                          30.0)
    finally:
        stop_driver(proc)


def test_a_worker_killed_between_its_reservation_and_the_book_gives_its_room_back(
        hosts, tmp_path):
    """A cap of 1.5 MiB on the member, whose first remote worker to reserve room for a
    kept result dies by SIGKILL before writing it (MINIRAY_TEST_DIE_AFTER_KEEP_RESERVE):
    that task fails as a worker crash, the member gives the dead worker's 1 MiB back when
    it reaps it (the link's budget file reconciled), and the next 1 MiB result is kept
    there again, not sent at once as when the bytes stayed counted until the link closed."""
    marker = tmp_path / "die-once"
    marker.touch()
    _start_member(hosts, MINIRAY_KEPT_BYTES_PER_DRIVER=str(3 << 19),
                  MINIRAY_TEST_DIE_AFTER_KEEP_RESERVE=str(marker))
    doc = _run_driver(hosts, KEPT + """
    from miniray._private.object_store import kept_budget

    @ray.remote(max_retries=0)
    def block(seed):
        return np.full(1 << 20, seed, dtype=np.uint8)

    def budget():  # the bytes the link's budget file counts on the member
        names = [n for n in os.listdir(SHM) if n.startswith(TAG) and n.endswith("_budget")]
        return [kept_budget.used(SHM, n[3:-len("_budget")]) for n in names]

    try:
        ray.get(block.options(**on).remote(1), timeout=60)
        first = "no error"
    except Exception as error:
        first = type(error).__name__
    out = {"first": first, "given_back": until(lambda: budget() == [0], 20),
           "budget": budget()}
    ref = block.options(**on).remote(2)
    from miniray._private.owner.object_table import READY

    def done(ref):  # sent (READY here) or kept there (recorded): not pulled by a wait
        entry = runtime.current().owner.objects.get(ref.binary())
        return entry is not None and (entry.state == READY or entry.remote is not None)

    until(lambda: done(ref), 60)
    out["kept"] = recorded(ref)
    out["equal"] = bool((ray.get(ref, timeout=60) == 2).all())
    print(json.dumps(out), flush=True)
    del ref
    ray.shutdown()
    """, timeout=120, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert not marker.exists(), doc  # a worker did die after its reservation
    assert doc["first"] == "WorkerCrashedError", doc
    assert doc["given_back"] and doc["kept"] and doc["equal"], doc


def _kept_line(hosts, ip: str = MEMBER) -> str | None:
    """The status line of kept results of the node on ``ip``, up to its byte count."""
    out = cli(hosts.env(ip), "status").stdout
    line = next((n for n in out.splitlines() if n.startswith("Objects kept for remote")), None)
    return line and line[:line.rindex(" ") + 1]


def test_a_pull_into_a_full_store_raises_for_that_get_and_a_later_get_pulls_again(hosts):
    """A driver store of 100 MiB and two kept 60 MiB results: while the first one's value
    is held (read zero-copy: nothing can spill it), ``get`` of the second raises
    ObjectStoreFullError; once the value is dropped, ``get`` pulls it again, bit-exact
    (the member kept its copy meanwhile). Its copy is freed with the ref."""
    _start_member(hosts, "--object-store-memory", str(100 << 20))
    doc = _run_driver(hosts, KEPT + """
    import gc
    from miniray.exceptions import ObjectStoreFullError

    gc.disable()  # the copy must go with the refs, not with a collection of cycles
    M = 60 << 20

    @ray.remote
    def big(seed):
        return np.full(M, seed, dtype=np.uint8)

    refs = [big.options(**on).remote(seed) for seed in (1, 2)]
    until(lambda: all(recorded(r) for r in refs))
    out = {"kept": len(kept())}
    first = ray.get(refs[0], timeout=60)
    try:
        ray.get(refs[1], timeout=60)
        out["error"] = None
    except ObjectStoreFullError as error:
        out["error"] = type(error).__name__
        out["text"] = str(error)
    out["still_kept"] = len(kept())
    out["first"] = bool((first == 1).all())
    del first
    second = ray.get(refs[1], timeout=60)
    out["second"] = bool((second == 2).all()) and second.size == M
    out["pulled"] = runtime.current().owner.remote_nodes.kept_results.pulled
    del second, refs  # (no garbage collection needed: the failed get left no cycle)
    out["freed"] = until(lambda: not kept(), 10)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, timeout=180, MEMBER_ROOT_TAG=_member_tag(hosts))
    assert doc["kept"] == 2 and doc["error"] == "ObjectStoreFullError", doc
    assert "object store capacity is in use" in doc["text"], doc["text"]
    # The first one's copy stays there too while its ref lives (freed with it).
    assert doc == {**doc, "still_kept": 2, "first": True, "second": True, "pulled": 2,
                   "freed": True}, doc


def test_a_pull_from_a_stopped_member_ends_once_the_view_holds_it_dead(hosts, member):
    """The member's node is SIGSTOPped (cut off: its sockets stay open, nothing answers)
    while two kept results are got at once, one on an idle pull connection (waiting for
    its first frame), one on a new connection (its handshake unanswered): both end with
    ObjectLostError naming the node within a few seconds (dead after 1 s here), not the
    60 s a frame may take."""
    proc = driver(PRELUDE + KEPT + """
    import threading

    @ray.remote
    def block(seed):
        return np.full(1 << 20, seed, dtype=np.uint8)

    first, *refs = [block.options(**on).remote(seed) for seed in range(3)]
    recorded_all = until(lambda: all(recorded(r) for r in refs))
    ray.get(first, timeout=60)  # its pull connection stays idle for the next
    objects = runtime.current().owner.objects

    def where(ref):  # kept on the member, not here, never asked for: what the gets test
        entry = objects.get(ref.binary())
        return {"recorded": recorded(ref), "here": here(ref),
                "pending": entry is not None and entry.state == 0,
                "pulling": entry is not None and entry.remote is not None
                and entry.remote.pulling,
                "segment": any(name.endswith(ref.binary().hex()) for name in kept())}

    print(json.dumps({"kept": len(kept()), "recorded_all": recorded_all,
                      "refs": [where(r) for r in refs]}), flush=True)
    sys.stdin.readline()
    out = [None, None]

    def get(i):
        t0 = time.monotonic()
        try:
            ray.get(refs[i], timeout=60)
            out[i] = {"error": None, "value": "returned", "waited": time.monotonic() - t0,
                      "was": where(refs[i])}
        except Exception as error:
            out[i] = {"error": type(error).__name__, "text": str(error),
                      "waited": time.monotonic() - t0}

    threads = [threading.Thread(target=get, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"gets": out, "member": member}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MEMBER_ROOT_TAG=_member_tag(hosts))
    pid = hosts.record(MEMBER).pid
    try:
        before = json_line(proc, 120)
        assert before["kept"] == 3, before  # the first one too, until its ref goes
        # What the gets below test: both values only on the member, neither asked for
        # yet; a value already here (sent instead of kept, pulled early) would be got
        # whatever the member does.
        assert before["recorded_all"], before
        for ref in before["refs"]:
            assert ref == {"recorded": True, "here": False, "pending": True,
                           "pulling": False, "segment": True}, before
        hosts.stopped.append(pid)
        os.kill(pid, signal.SIGSTOP)
        # kill() returns before every thread of the member stopped: none of them may
        # answer a pull from here on.
        assert wait_until(lambda: _all_stopped(pid), 30.0), "the member did not stop"
        proc.stdin.write("\n")
        proc.stdin.flush()
        doc = json_line(proc, 90)
        for got in doc["gets"]:
            assert got is not None and got["error"] == "ObjectLostError", doc
            assert f"kept on node {doc['member'][:12]}" in got["text"], got["text"]
            assert "No heartbeat from the node" in got["text"], got["text"]
            assert got["waited"] < 30, doc  # not the get's 60 s (a loaded runner's room)
        print(f"\npulls from a stopped member ended after "
              f"{[round(g['waited'], 2) for g in doc['gets']]} s")
        proc.wait(30)
    finally:
        stop_driver(proc)
        os.kill(pid, signal.SIGCONT)


def _all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (state T in ``/proc/<pid>/task/*/stat``)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except OSError:
        return False
    return bool(states) and all(state == "T" for state in states)


def test_the_heads_status_counts_what_it_keeps_for_a_driver_on_a_member(hosts, member):
    """A driver on the member's host runs a task on the head: its result stays on the head,
    whose ``miniray status`` shows it; nothing is left there once the driver exits."""
    proc = driver("""
    import json, sys
    import numpy as np
    import miniray as ray
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init(address="auto")
    head = next(n["NodeID"] for n in ray.nodes()
                if n["NodeManagerAddress"] == "127.0.0.1" and n["Alive"])

    @ray.remote
    def block():
        return np.ones(1 << 20, dtype=np.uint8)

    ref = block.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        head, soft=False)).remote()
    ray.wait([ref], timeout=0)  # the task runs; nothing waits for its value
    print(json.dumps({"started": True}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"sum": int(ray.get(ref, timeout=60).sum())}), flush=True)
    ray.shutdown()
    """, hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        assert json_line(proc, 60)["started"]
        line = "Objects kept for remote drivers: 1, "
        assert wait_until(lambda: _kept_line(hosts, "127.0.0.1") == line, 30.0), cli(
            hosts.env("127.0.0.1"), "status").stdout
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert json_line(proc, 60)["sum"] == 1 << 20
        proc.wait(30)
        assert wait_until(lambda: _kept_line(hosts, "127.0.0.1") == (
            "Objects kept for remote drivers: 0, "), 30.0)
    finally:
        stop_driver(proc)
