"""Tasks on another host between fake hosts (peering design 4.3 "Remote lease, spawn, task").

A head on 127.0.0.1 and a member on 127.0.0.2, each with its own root (``FakeHosts`` of
test_cluster_join.py: separate MINIRAY_TMPDIR and host dir, fast heartbeats; every process,
session and segment of each root is checked on teardown). First the node's half alone (a
``RemoteNodeClient`` in this process spawns a worker on the member and speaks to it), then
a driver on the head's host running ``NodeAffinitySchedulingStrategy(member, soft=False)``
tasks through its owner.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess

import pytest

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.remote_node import RemoteNodeClient

from .helpers import CANCEL_AND_GET, OUTCOME, driver, go_on, json_line, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`

MEMBER = "127.0.0.2"


@pytest.fixture
def member(hosts):
    """A cluster of two fake hosts; the member's (host, port) with 2 CPUs."""
    yield hosts.start_member(MEMBER, "--num-cpus", "2")


def _client(hosts, address) -> RemoteNodeClient:
    token = auth_token.load_token(environ=hosts.env("127.0.0.1"))
    return RemoteNodeClient(address, token, timeout=5.0, source_address=("127.0.0.1", 0))


def _hello(session_dir: str = "") -> tuple:
    return (protocol.HELLO, {
        "session_dir": session_dir, "node_id": "driver-node", "node_ip": "127.0.0.1",
        "store": {"session_tag": "mrtest", "shm_dir": "/dev/shm",
                  "inline_threshold": 100 * 1024, "capacity": 1 << 28},
        "job_id": None, "namespace": "", "sys_path": [], "cwd": "", "runtime_env": {},
        "setup_hook": None, "ray_alias": False, "nodes": [], "logging_config": None})


def _exited(client: RemoteNodeClient, pid: int, timeout: float = 30.0):
    """The link is read during calls only: ping until the worker's exit came back."""
    def seen():
        client.ping()
        return pid in client.exited
    assert wait_until(seen, timeout, 0.05), client.exited
    return client.exited[pid]


def test_a_spawned_remote_worker_speaks_macd_frames_and_its_exit_comes_back(hosts, member):
    with _client(hosts, member) as client:
        pid, channels = client.spawn()
        data, ctl, out, err = channels
        try:
            data.send(_hello())
            assert data.recv(timeout=10) == (protocol.READY, pid)
            # The worker is the member's: its process lives under the member's root.
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            root = hosts.env(MEMBER)["MINIRAY_TMPDIR"].encode()
            assert b"MINIRAY_TMPDIR=" + root in environ
            assert client.node_id == hosts.record(MEMBER).node_id
        finally:
            for channel in channels:
                channel.close()
        # Closing its data connection ends the worker; the member reports the exit.
        status = _exited(client, pid)
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_tampered_frame_ends_the_remote_worker_before_anything_is_unpickled(hosts, member):
    marker = f"/tmp/mr-tamper-{os.getpid()}"

    class Boom:
        def __reduce__(self):
            return (open, (marker, "w"))

    with _client(hosts, member) as client:
        pid, channels = client.spawn()
        data = channels[0]
        try:
            data.send(_hello())
            assert data.recv(timeout=10) == (protocol.READY, pid)
            header, payload, tag = data._writer.encode(pickle.dumps((protocol.FUNC, b"f",
                                                                     Boom())))
            pc._send_all(data._sock, header + payload + bytes(16))  # a wrong tag
            status = _exited(client, pid)
            assert os.waitstatus_to_exitcode(status) == 0  # it left on its own
            assert not os.path.exists(marker)
        finally:
            for channel in channels:
                channel.close()
            if os.path.exists(marker):
                os.unlink(marker)


def test_the_member_kills_a_remote_drivers_workers_when_its_link_closes(hosts, member):
    client = _client(hosts, member)
    pid, channels = client.spawn()
    try:
        channels[0].send(_hello())
        assert channels[0].recv(timeout=10) == (protocol.READY, pid)
        client.close()  # the data connection stays open: the member must end the worker
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30.0)
    finally:
        for channel in channels:
            channel.close()


# ------------------------------------------------------------------ through the owner
PRELUDE = """
    import json, os, sys, time
    import miniray as ray
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray.init(address="auto")
    member = next(n["NodeID"] for n in ray.nodes()
                  if n["NodeManagerAddress"] == "127.0.0.2" and n["Alive"])
    there = NodeAffinitySchedulingStrategy(member, soft=False)
    """


def _run_driver(hosts, body: str, timeout: float = 60, **env) -> dict:
    """Run ``body`` after PRELUDE in a driver on the head's host: the JSON object it printed
    at the start of a line, with "stdout" (all else it printed, to its end: a remote worker's
    lines come over their own connection, unordered with the results, and may be printed
    after the JSON; ``ray.shutdown()`` prints them all before it returns) and "stderr"."""
    proc = driver(PRELUDE + body, hosts.env("127.0.0.1"), **env)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop_driver(proc)
    lines, doc = [], None
    for line in out.splitlines(keepends=True):
        if doc is None and line.startswith("{"):
            # print() writes the text, then its newline: a forwarded line may come between.
            doc, end = json.JSONDecoder().raw_decode(line)
            line = line[end:]
        lines.append(line)
    assert doc is not None, f"no JSON from the driver: {err[-3000:]}"
    doc["stdout"], doc["stderr"] = "".join(lines), err
    return doc


def test_a_driver_runs_a_task_on_the_member_and_gets_its_result(hosts, member):
    doc = _run_driver(hosts, """
    @ray.remote
    def where(x):
        print("printed on the member")
        return (x + 1, ray.get_runtime_context().get_node_id(), os.getpid(),
                ray.util.get_node_ip_address())

    remote = ray.get(where.options(scheduling_strategy=there).remote(41), timeout=30)
    again = ray.get(where.options(scheduling_strategy=there).remote(1), timeout=30)
    local = ray.get(where.remote(0), timeout=30)

    @ray.remote
    def big():
        return b"x" * (1 << 20)

    @ray.remote
    def takes(value):
        return len(value)

    sizes = [len(ray.get(big.options(scheduling_strategy=there).remote(), timeout=30)),
             ray.get(takes.options(scheduling_strategy=there).remote(b"y" * (1 << 20)),
                     timeout=30)]

    @ray.remote
    def noop():
        return None

    def timed(fn, n=200):
        ray.get([fn.remote() for _ in range(5)])
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(fn.remote())
        return (time.perf_counter() - t0) / n * 1e6

    remote_noop = noop.options(scheduling_strategy=there)
    us_remote, us_local = timed(remote_noop), timed(noop)
    print(json.dumps({"remote": remote, "again": again, "local": local, "member": member,
                      "here": ray.get_runtime_context().get_node_id(), "sizes": sizes,
                      "driver_ip": ray.util.get_node_ip_address(),
                      "us_remote": us_remote, "us_local": us_local}), flush=True)
    ray.shutdown()
    """)
    assert doc["remote"][0] == 42 and doc["again"][0] == 2
    assert doc["remote"][1] == doc["member"] == hosts.record(MEMBER).node_id
    assert doc["local"][1] == doc["here"] != doc["member"]
    # Each process names its own node's IP, as in Ray.
    assert doc["remote"][3] == MEMBER and doc["local"][3] == doc["driver_ip"] == "127.0.0.1", doc
    assert doc["remote"][2] == doc["again"][2]  # the idle worker served the second task
    # What it printed reaches the driver's stdout, with Ray's prefix naming the member.
    assert f"pid={doc['remote'][2]}, ip={MEMBER}) printed on the member" in doc["stdout"], doc
    assert doc["sizes"] == [1 << 20, 1 << 20]  # a large result and argument travel
    print(f"\nno-op round trip: remote {doc['us_remote']:.0f} us, "
          f"local {doc['us_local']:.0f} us")
    # The member holds no lease of the driver any more, and its worker is gone.
    ledger_path = os.path.join(hosts.record(MEMBER).session_dir, "ledger.json")
    from miniray._private.ledger.ledger import Ledger
    assert wait_until(lambda: not Ledger(ledger_path).snapshot().leases, 30.0)


def test_large_values_and_refs_travel_to_and_from_a_task_on_the_member(hosts, member):
    """50 MB numpy arguments by value and by ref, a 50 MB result (zero-copy in the driver's
    store afterwards), a ref from one remote task passed to another, the argument's error
    passed on, a streaming generator's first value (test_remote_streaming.py has more);
    nothing left on either host (the fixture's teardown checks both roots)."""
    doc = _run_driver(hosts, """
    import numpy as np

    @ray.remote
    def total(array):
        return float(array.sum()), array.nbytes, ray.get_runtime_context().get_node_id()

    @ray.remote
    def make(n):
        return np.ones(n // 8)

    @ray.remote
    def fails():
        raise ValueError("no luck")

    @ray.remote
    def nested(x):
        return ray.get(ray.put(x))

    @ray.remote(num_returns="streaming")
    def streamed():
        yield 1

    on = dict(scheduling_strategy=there)
    array = np.arange(50 * 1024 * 1024 // 8, dtype=np.float64)
    by_value = ray.get(total.options(**on).remote(array), timeout=60)
    by_ref = ray.get(total.options(**on).remote(ray.put(array)), timeout=60)
    made = make.options(**on).remote(50 * 1024 * 1024)
    result = ray.get(made, timeout=60)
    chained = ray.get(total.options(**on).remote(made), timeout=60)
    errors = []
    for ref in (total.options(**on).remote(fails.options(**on).remote()),
                nested.options(**on).remote(1), streamed.options(**on).remote()):
        try:
            if not isinstance(ref, ray.ObjectRef):  # the generator: its first value
                ref = next(ref)
            errors.append(ray.get(ref, timeout=30))
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")
    print(json.dumps({"by_value": by_value, "by_ref": by_ref, "chained": chained,
                      "result": [result.nbytes, float(result.sum()), result.flags.writeable],
                      "expected": float(array.sum()), "errors": errors}), flush=True)
    del result, made, array
    ray.shutdown()
    """, timeout=120)
    member_id = hosts.record(MEMBER).node_id
    for key in ("by_value", "by_ref"):
        assert doc[key] == [doc["expected"], 50 * 1024 * 1024, member_id], doc[key]
    assert doc["result"] == [50 * 1024 * 1024, 50 * 1024 * 1024 // 8, False], doc["result"]
    assert doc["chained"] == [50 * 1024 * 1024 // 8, 50 * 1024 * 1024, member_id]
    upstream, nested, streamed = doc["errors"]
    assert upstream and "no luck" in upstream, upstream
    assert nested == 1, nested  # put and get inside it: test_remote_nested.py
    assert streamed == 1, streamed



RUNNING_ON_MEMBER = """
    def running(*names):  # each task named runs on the member (state API), else waits
        from miniray.util import state
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = [t for t in state.list_tasks() if t["state"] == "RUNNING"
                    and t["node_id"] == member]
            if sorted(t["name"] for t in rows) == sorted(names):
                return
            time.sleep(0.05)
"""

MID_TASK = PRELUDE + RUNNING_ON_MEMBER + """
    @ray.remote(max_retries=0)
    def slow():
        for _ in range(600):
            time.sleep(0.1)

    ref = slow.options(scheduling_strategy=there).remote()
    running("slow")  # sent and running there: not placed again when the node goes
    print(json.dumps({"started": True}), flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    try:
        ray.get(ref, timeout=30)
        outcome = None
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    print(json.dumps({"outcome": outcome, "waited": time.monotonic() - t0}), flush=True)
    ray.shutdown()
"""


def _member_fails_mid_task(hosts, sig: int, bound_s: float) -> dict:
    """A task runs on the member; the member's node gets ``sig``; what ``get`` raised and
    how long it waited."""
    proc = driver(MID_TASK, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    pid = None
    try:
        json_line(proc)  # the worker runs on the member now
        pid = hosts.record(MEMBER).pid
        if sig == signal.SIGSTOP:
            hosts.stopped.append(pid)
        os.kill(pid, sig)
        doc = go_on(proc, 40)
        assert doc["outcome"] and doc["outcome"].startswith("NodeDiedError"), doc
        assert doc["waited"] < bound_s, doc
        proc.wait(30)
        return doc
    finally:
        stop_driver(proc)
        if sig == signal.SIGSTOP and pid is not None:
            os.kill(pid, signal.SIGCONT)


def test_killing_the_member_mid_task_gives_node_died_error_not_a_hang(hosts, member):
    doc = _member_fails_mid_task(hosts, signal.SIGKILL, 10)
    print(f"\nmember killed mid-task: {doc['outcome'][:160]} after {doc['waited']:.2f} s")


def test_a_driver_with_the_wrong_token_never_runs_code_on_the_member(hosts, member):
    marker = f"/tmp/mr-wrong-token-{os.getpid()}"
    doc = _run_driver(hosts, f"""
    @ray.remote
    def touch():
        open({marker!r}, "w").close()

    t0 = time.monotonic()
    try:
        ray.get(touch.options(scheduling_strategy=there).remote(), timeout=30)
        outcome = None
    except Exception as error:
        outcome = f"{{type(error).__name__}}: {{error}}"
    print(json.dumps({{"outcome": outcome, "waited": time.monotonic() - t0}}), flush=True)
    ray.shutdown()
    """, MINIRAY_AUTH_TOKEN="another-token-" + "1" * 32)
    try:
        assert doc["outcome"] and doc["outcome"].startswith("AuthenticationError"), doc
        assert "token" in doc["outcome"] and doc["waited"] < 15, doc  # not the get's 30 s
        assert not os.path.exists(marker)
    finally:
        if os.path.exists(marker):
            os.unlink(marker)


def test_cancel_reaches_a_remote_task_and_a_dead_idle_worker_is_replaced(hosts, member):
    doc = _run_driver(hosts, CANCEL_AND_GET + """
    @ray.remote(max_retries=0)
    def slow():
        for _ in range(300):  # a cancel is raised between bytecodes, as in Ray
            time.sleep(0.1)

    @ray.remote
    def pid():
        return os.getpid()

    ref = slow.options(scheduling_strategy=there).remote()
    time.sleep(1.5)
    outcome, waited = cancel_and_get(ref)
    first = ray.get(pid.options(scheduling_strategy=there).remote(), timeout=20)
    os.kill(first, 9)  # the member's idle worker dies (same machine: a stand-in)
    time.sleep(0.5)
    second = ray.get(pid.options(scheduling_strategy=there).remote(), timeout=20)
    print(json.dumps({"outcome": outcome, "waited": waited, "first": first,
                      "second": second}), flush=True)
    ray.shutdown()
    """)
    # Short of the get's 20 s timeout (no cancel), with room for a loaded runner.
    assert "TaskCancelledError" in doc["outcome"] and doc["waited"] < 15, doc
    assert doc["second"] != doc["first"], doc


def test_a_gpu_task_on_the_member_sees_its_gpu_and_its_runtime_env(hosts):
    hosts.start_member(MEMBER, "--num-cpus", "2", "--num-gpus", "1")
    doc = _run_driver(hosts, """
    @ray.remote(num_gpus=1)
    def gpu():
        return (ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                os.environ.get("MR_REMOTE_ENV"))

    plain = ray.get(gpu.options(scheduling_strategy=there).remote(), timeout=30)
    with_env = ray.get(gpu.options(scheduling_strategy=there, runtime_env={
        "env_vars": {"MR_REMOTE_ENV": "yes"}}).remote(), timeout=30)
    print(json.dumps({"plain": plain, "with_env": with_env}), flush=True)
    ray.shutdown()
    """)
    assert doc["plain"][0] == [0] and doc["plain"][1] == "0" and doc["plain"][2] is None, doc
    assert doc["with_env"][2] == "yes" and doc["with_env"][1] == "0", doc


def test_a_member_held_dead_fails_its_running_task_with_node_died_error(hosts, member):
    """SIGSTOP of the member's node stands in for a partition: its sockets stay open, the
    worker goes on running, and only the head's missed heartbeats say it is gone."""
    doc = _member_fails_mid_task(hosts, signal.SIGSTOP, 8)  # dead after 1 s here
    print(f"\nmember stopped mid-task: NodeDiedError after {doc['waited']:.2f} s")


def _join_special(hosts):
    """Head: 2 CPUs; member: 4 CPUs and 2 "special" (only it has them)."""
    hosts.start_member(MEMBER, "--num-cpus", "4", "--resources", '{"special": 2}')


def test_placement_affinity_resources_only_a_member_has_and_force_cancel(hosts):
    _join_special(hosts)
    doc = _run_driver(hosts, """
    here = ray.get_runtime_context().get_node_id()

    @ray.remote
    def node():
        return ray.get_runtime_context().get_node_id()

    """ + OUTCOME + """

    soft = NodeAffinitySchedulingStrategy(member, soft=True)
    unknown = NodeAffinitySchedulingStrategy("ff" * 28, soft=False)
    out = {
        "unknown": outcome(node.options(scheduling_strategy=unknown).remote()),
        "here_too_small": outcome(node.options(
            num_cpus=3, scheduling_strategy=NodeAffinitySchedulingStrategy(here, False)
        ).remote()),
        "soft": outcome(node.options(scheduling_strategy=soft).remote()),
        "special": outcome(node.options(resources={"special": 1}).remote()),
        "cpus": outcome(node.options(num_cpus=3).remote()),
        "node_ip": outcome(node.options(resources={"node:127.0.0.2": 0.01}).remote()),
        "local": outcome(node.remote()),
        "nowhere": outcome(node.options(resources={"TPU": 1}).remote(), timeout=1.5),
    }

    @ray.remote(max_retries=3)
    def slow():
        time.sleep(60)

    ref = slow.options(scheduling_strategy=there).remote()
    time.sleep(2.0)
    t0 = time.monotonic()
    ray.cancel(ref, force=True)
    out["force"] = outcome(ref, timeout=20)
    out["force_waited"] = time.monotonic() - t0
    out["after"] = outcome(node.options(scheduling_strategy=there).remote())
    out.update(member=member, here=here)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    member, here = doc["member"], doc["here"]
    assert doc["unknown"].startswith("TaskUnschedulableError"), doc
    assert "ff" * 28 in doc["unknown"] and "soft=False" in doc["unknown"], doc
    assert doc["here_too_small"].startswith("TaskUnschedulableError"), doc
    assert doc["soft"] == member, doc
    assert doc["special"] == member and doc["cpus"] == member, doc
    assert doc["node_ip"] == member and doc["local"] == here, doc
    assert doc["nowhere"].startswith("GetTimeoutError"), doc  # pending, as before
    # One line names every node's totals (the member's "special" too).
    line = next(x for x in doc["stderr"].splitlines() if "TPU" in x)
    assert "any node of the cluster" in line and "4 special" not in line, line
    assert "2 special" in line and "127.0.0.2" in line and "127.0.0.1" in line, line
    print(f"\n{line}")
    assert doc["force"].startswith("TaskCancelledError"), doc
    assert doc["force_waited"] < 15, doc  # short of the get's 20 s
    assert doc["after"] == member, doc  # the member still serves this driver


def test_a_task_whose_node_dies_is_retried_elsewhere_while_max_retries_allows(hosts, member):
    proc = driver(PRELUDE + RUNNING_ON_MEMBER + """
    soft = NodeAffinitySchedulingStrategy(member, soft=True)

    @ray.remote(max_retries=1, num_cpus=0.5)
    def slow():
        time.sleep(float(os.environ.get("MR_SLEEP", "4")))
        return ray.get_runtime_context().get_node_id()

    @ray.remote(max_retries=0, num_cpus=0.5)
    def slow_once():
        time.sleep(60)

    @ray.remote(max_retries=0, num_cpus=2)
    def whole():
        return ray.get_runtime_context().get_node_id()

    retried = slow.options(scheduling_strategy=soft).remote()
    hard = slow.options(scheduling_strategy=there).remote()
    once = slow_once.options(scheduling_strategy=soft).remote()
    running("slow", "slow", "slow_once")  # not a fixed sleep: a slow start is fine
    # The member has 0.5 of its 2 CPUs free: this one waits there for a lease, never sent.
    queued = whole.options(scheduling_strategy=soft).remote()
    print(json.dumps({"started": True}), flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    out = {}
    for name, ref in (("retried", retried), ("hard", hard), ("once", once),
                      ("queued", queued)):
        try:
            out[name] = ray.get(ref, timeout=30)
        except Exception as error:
            out[name] = f"{type(error).__name__}: {error}"
        out[name + "_s"] = time.monotonic() - t0
    out["here"] = ray.get_runtime_context().get_node_id()
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE, MR_SLEEP="4")
    try:
        json_line(proc)  # the three run on the member now (the queued one: either way)
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        doc = go_on(proc, 60)
        # Soft affinity, one retry: it ran again on the driver's node.
        assert doc["retried"] == doc["here"], doc
        # Hard affinity to the dead node: the retry cannot be placed (Ray's error).
        assert doc["hard"].startswith("TaskUnschedulableError"), doc
        # No retry left: the node's death reaches get, naming the node as Ray does.
        assert doc["once"].startswith("NodeDiedError"), doc
        assert f"Node IP: {MEMBER}, node ID: " in doc["once"], doc
        # Never sent to the member: placed again without a retry (it has none), here.
        assert doc["queued"] == doc["here"], doc
        print(f"\nmember killed: retried locally, done after {doc['retried_s']:.2f} s "
              f"(4 s of work); {doc['once'][:90]}...")
        proc.wait(30)
    finally:
        stop_driver(proc)


def _runs_once_a_special_member_joins(hosts, code: str) -> None:
    """A driver's call ``ref`` (made by ``code``) that needs "special", which no node has,
    waits (saying so on stderr) until a member with it joins, then runs there."""
    head = hosts.start_head()
    proc = driver("""
    import json, sys
    import miniray as ray
    ray.init(address="auto")
    """ + code + """
    ready, _ = ray.wait([ref], timeout=1.0)
    print(json.dumps({"pending": not ready}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"ran_on": ray.get(ref, timeout=30)}), flush=True)
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        assert json_line(proc)["pending"]
        joined = hosts.join(MEMBER, head, "--num-cpus", "1", "--resources", '{"special": 1}')
        assert joined.returncode == 0, joined.stderr
        assert go_on(proc, 40)["ran_on"] == hosts.record(MEMBER).node_id
        proc.wait(30)
        assert "special" in proc.stderr.read()  # the infeasible line, while it waited
    finally:
        stop_driver(proc)


def test_a_task_no_node_can_hold_runs_on_a_member_that_joins_later(hosts):
    _runs_once_a_special_member_joins(hosts, """
    @ray.remote(resources={"special": 1})
    def node():
        return ray.get_runtime_context().get_node_id()

    ref = node.remote()
    """)


def test_a_denied_task_moves_to_another_member_with_room(hosts):
    head = hosts.start_head()
    for ip in (MEMBER, "127.0.0.3"):
        joined = hosts.join(ip, head, "--num-cpus", "1", "--resources", '{"special": 1}')
        assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: all((hosts.cluster("127.0.0.1").get(ip) or {}).get("alive")
                                  for ip in (MEMBER, "127.0.0.3")), 30.0)
    doc = _run_driver(hosts, """
    import shutil, tempfile

    @ray.remote(resources={"special": 1})
    def node(folder):
        # A mark of this task, then whether the other's came while it ran: side by side
        # (one after the other, the first would wait in vain), however slowly they start.
        os.close(tempfile.mkstemp(dir=folder)[0])
        deadline = time.monotonic() + 20
        while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return ray.get_runtime_context().get_node_id(), len(os.listdir(folder)) == 2

    folder = tempfile.mkdtemp()
    # Both members look free in the view: the same one is picked for both, which denies
    # the second; it moves to the other member instead of waiting.
    done = ray.get([node.remote(folder), node.remote(folder)], timeout=60)
    shutil.rmtree(folder)
    print(json.dumps({"nodes": [n for n, _ in done], "met": [m for _, m in done]}),
          flush=True)
    ray.shutdown()
    """)
    assert len(set(doc["nodes"])) == 2, doc
    assert doc["met"] == [True, True], doc  # not one after the other


# ------------------------------------------- a task on another host is submitted as any task
def test_a_remote_child_is_cancelled_recursively_with_its_parent(hosts, member, tmp_path):
    """A local task submits a child that runs on the member; ``cancel(parent,
    recursive=True)`` reaches the child as it reaches a local one."""
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    doc = _run_driver(hosts, CANCEL_AND_GET + f"""
    @ray.remote(max_retries=0)
    def child():
        open({str(started)!r}, "w").close()
        try:
            for _ in range(300):
                time.sleep(0.1)
        finally:
            open({str(stopped)!r}, "w").close()

    @ray.remote(max_retries=0)
    def parent(node):
        import miniray as inner

        return inner.get(child.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote())

    def wait_for(path, timeout):
        deadline = time.monotonic() + timeout
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.path.exists(path)

    ref = parent.remote(member)
    began = wait_for({str(started)!r}, 20)
    outcome, _ = cancel_and_get(ref, recursive=True)
    print(json.dumps({{"began": began, "outcome": outcome,
                      "child_stopped": wait_for({str(stopped)!r}, 10)}}), flush=True)
    ray.shutdown()
    """)
    assert doc["began"] and "TaskCancelledError" in doc["outcome"], doc  # blocked in get
    assert doc["child_stopped"], doc  # the member's child was cancelled too


def test_a_remote_tasks_failed_argument_fails_it_as_a_local_tasks_does(hosts, member):
    """Ray raises the argument's error as the task's own (``RayTaskError`` naming the task,
    "could not be computed", the user's exception as its cause), wherever the task was to
    run."""
    doc = _run_driver(hosts, """
    @ray.remote
    def fails():
        raise ValueError("no luck")

    @ray.remote
    def consume(x):
        return x

    out = {}
    for where, options in (("local", {}), ("remote", {"scheduling_strategy": there})):
        try:
            ray.get(consume.options(**options).remote(fails.remote()), timeout=30)
            out[where] = None
        except Exception as error:
            out[where] = [type(error).__name__, isinstance(error, ValueError),
                          type(error.cause).__name__, str(error).splitlines()[1:3]]
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert doc["local"] and doc["local"][1] and doc["local"][2] == "ValueError", doc
    assert "could not be computed" in doc["local"][3][0], doc
    assert doc["remote"] == doc["local"], doc


def test_a_remote_task_on_a_freed_ref_fails_with_object_freed_error(hosts, member):
    doc = _run_driver(hosts, """
    import gc
    from miniray._private import runtime

    @ray.remote
    def identity(x):
        return x

    ref = ray.put(b"x" * 100)
    ref_hex = ref.hex()
    del ref
    gc.collect()
    ray.put(None)  # applies the queued drop now
    deadline = time.monotonic() + 10
    while runtime.current().knows(bytes.fromhex(ref_hex)) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = ray.ObjectRef.from_hex(ref_hex)
    out = {}
    for where, options in (("local", {}), ("remote", {"scheduling_strategy": there})):
        try:
            ray.get(identity.options(**options).remote(again), timeout=30)
            out[where] = None
        except Exception as error:
            out[where] = type(error).__name__
    out["after"] = ray.get(identity.options(scheduling_strategy=there).remote(3), timeout=30)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert doc["local"] == doc["remote"] == "ObjectFreedError", doc
    assert doc["after"] == 3, doc


def test_a_remote_workers_output_prints_as_a_local_workers(hosts, member):
    """The same forwarding as a local worker's (``OutputStream``): the next task's marker
    after a line without its newline never shows, each task's lines carry its own name,
    and ``RAY_DISABLE_WORKER_LOG_PREFIX=1`` drops the prefix; Ray's ``ip=`` for a worker on
    another node."""
    body = """
    @ray.remote
    def first():
        print("no newline", end="")
        return os.getpid()

    @ray.remote
    def second():
        print("hello from second")
        return os.getpid()

    pids = [ray.get(f.options(scheduling_strategy=there).remote(), timeout=30)
            for f in (first, second)]
    print(json.dumps({"pids": pids}), flush=True)
    ray.shutdown()
    """
    doc = _run_driver(hosts, body)
    pid = doc["pids"][0]
    assert doc["pids"] == [pid, pid], doc  # the idle worker ran both
    lines = doc["stdout"].splitlines()
    assert "\x00" not in doc["stdout"], doc
    assert f"(first pid={pid}, ip={MEMBER}) no newline" in lines, doc
    assert f"(second pid={pid}, ip={MEMBER}) hello from second" in lines, doc
    plain = _run_driver(hosts, body, RAY_DISABLE_WORKER_LOG_PREFIX="1")
    assert "hello from second" in plain["stdout"].splitlines(), plain
    assert "pid=" not in plain["stdout"], plain
