"""Named and detached actors on another host, shared through the node's actor service.

A head on 127.0.0.1 (2 CPUs) and a member on 127.0.0.2 (4 CPUs and 2 "special", which only
it has), each with its own root (``FakeHosts`` of test_cluster_join.py; every process,
session and segment of each root is checked on teardown). Drivers on the head's host create
named or detached actors that only the member can hold: the head's actor service owns them
and places them on the member (``owner/remote_actors.py``), so other drivers of the head
find them by name: a detached one outlives its creator, restarts on the member (or on the
head, inside the service, when the member dies) and ends with ``ray.kill`` or the head's
stop; a named one ends with its creator. Each end releases the lease on the member.
Names are the cluster's: a driver on the member's host reaches the head's actor service
(over the head's port, role "actors", relayed to the service), finds, calls, lists, creates
and kills its actors there, and cannot take a name a head driver took.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import textwrap
import time

import pytest

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph

from .helpers import OUTCOME, cli, driver, finish_json, go_on, json_line, stop_driver, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_actors import TIMED, _member_leases
from .test_remote_tasks import MEMBER, _join_special

PRELUDE = """
    import json, os, sys, time
    import miniray as ray
    ray.init(address="auto", namespace="shared")
    member = next((n["NodeID"] for n in ray.nodes()
                   if n["NodeManagerAddress"] == "127.0.0.2" and n["Alive"]), None)

""" + OUTCOME + """

    def special(expected, within=10):
        t0 = time.monotonic()
        while (ray.available_resources().get("special", 0) != expected
               and time.monotonic() - t0 < within):
            time.sleep(0.1)
        return ray.available_resources().get("special", 0)
    """


def _run(hosts, body: str, ip: str = "127.0.0.1", timeout: float = 90) -> dict:
    """Run a driver to its end; its JSON line, with its stdout and stderr."""
    proc = driver(textwrap.dedent(PRELUDE) + textwrap.dedent(body), hosts.env(ip))
    return finish_json(proc, timeout)


def test_a_detached_actor_on_the_member_outlives_its_creator_and_ends_with_kill(hosts):
    _join_special(hosts)
    first = _run(hosts, """
    import numpy as np

    @ray.remote(resources={"special": 1})
    class Keeper:
        def __init__(self, start):
            self.n = start
            print("keeper constructed")

        def add(self, k):
            self.n += k
            return self.n

        def where(self):
            return ray.get_runtime_context().get_node_id(), os.getpid()

        def array(self, nbytes):
            return np.ones(nbytes // 8)

    keeper = Keeper.options(name="keeper", lifetime="detached").remote(100)
    Keeper.options(name="local_keeper", lifetime="detached", resources={}).remote(0)
    out = {"member": member, "where": ray.get(keeper.where.remote(), timeout=60),
           "add": ray.get(keeper.add.remote(1), timeout=30),
           "big": float(ray.get(keeper.array.remote(8 * 1024 * 1024), timeout=60).sum()),
           "held": special(1)}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    member = first["member"]
    assert first["where"][0] == member, first
    assert first["add"] == 101 and first["big"] == 1024 * 1024, first
    assert first["held"] == 1, first
    assert "special" not in first["stderr"], first["stderr"]  # no "can never be placed"
    assert f"ip={MEMBER}) keeper constructed" in first["stdout"], first["stdout"]

    second = _run(hosts, """
    keeper = ray.get_actor("keeper")
    out = {"add": ray.get(keeper.add.remote(1), timeout=30),
           "where": ray.get(keeper.where.remote(), timeout=30),
           "names": ray.util.list_named_actors(), "held": special(1)}

    """ + TIMED + """

    local = ray.get_actor("local_keeper")
    out["us"] = [timed(keeper), timed(local)]
    ray.kill(local)
    ray.kill(keeper)
    out["after_kill"] = outcome(keeper.add.remote(1))
    out["back"] = special(2)
    try:
        ray.get_actor("keeper")
        out["lookup"] = "found"
    except ValueError as error:
        out["lookup"] = str(error)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert second["add"] == 102, second  # the same actor, its state kept
    assert second["where"] == first["where"], second
    assert sorted(second["names"]) == ["keeper", "local_keeper"], second
    assert second["held"] == 1, second
    assert second["after_kill"].startswith("ActorDiedError"), second
    assert second["back"] == 2, second  # its lease on the member is released
    assert second["lookup"].startswith("Failed to look up"), second
    print(f"\ncall round trip through the head's actor service: to an actor on the member "
          f"{second['us'][0]:.0f} us, on the head {second['us'][1]:.0f} us")
    assert wait_until(lambda: not _member_leases(hosts), 30.0), _member_leases(hosts)


def test_a_named_actor_on_the_member_is_found_by_another_driver_until_its_creator_leaves(
        hosts):
    _join_special(hosts)
    creator = driver(PRELUDE + """
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Box:
        def __init__(self):
            self.items = []

        def put(self, x):
            self.items.append(x)
            return len(self.items)

        def where(self):
            return ray.get_runtime_context().get_node_id()

    box = Box.options(name="box", resources={"special": 1}).remote()
    pinned = Box.options(name="pinned", scheduling_strategy=NodeAffinitySchedulingStrategy(
        member, soft=False)).remote()
    unknown = Box.options(name="unknown", scheduling_strategy=NodeAffinitySchedulingStrategy(
        "ff" * 28, soft=False)).remote()
    out = {"member": member, "box": ray.get(box.where.remote(), timeout=60),
           "pinned": ray.get(pinned.where.remote(), timeout=60),
           "put": ray.get(box.put.remote("a"), timeout=30),
           "unknown": outcome(unknown.where.remote())}
    print(json.dumps(out), flush=True)
    sys.stdin.readline()  # the other drivers look them up meanwhile
    ray.shutdown()
    """, hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        first = json_line(creator, 90)
        member = first["member"]
        assert first["box"] == member and first["pinned"] == member, first
        assert first["unknown"].startswith("ActorUnschedulableError"), first
        assert "ff" * 28 in first["unknown"], first
        other = _run(hosts, """
        box = ray.get_actor("box")
        out = {"put": ray.get(box.put.remote("b"), timeout=30),
               "pinned": ray.get(ray.get_actor("pinned").where.remote(), timeout=30),
               "names": sorted(ray.util.list_named_actors())}
        print(json.dumps(out), flush=True)
        ray.shutdown()
        """)
        assert other["put"] == 2 and other["pinned"] == member, other
        assert other["names"] == ["box", "pinned"], other
        # A driver on the member's host reaches the head's actor service: names are the
        # cluster's.
        there = _run(hosts, """
        box = ray.get_actor("box")
        out = {"put": ray.get(box.put.remote("c"), timeout=30),
               "names": sorted(ray.util.list_named_actors())}
        print(json.dumps(out), flush=True)
        ray.shutdown()
        """, ip=MEMBER)
        assert there["put"] == 3 and there["names"] == ["box", "pinned"], there
        creator.stdin.write("\n")
        creator.stdin.flush()
        assert creator.wait(30) == 0, creator.stderr.read()[-3000:]
    finally:
        stop_driver(creator)
    # Its creator gone, a named actor that is not detached is killed: its lease is released.
    assert wait_until(lambda: not _member_leases(hosts), 30.0), _member_leases(hosts)
    after = _run(hosts, """
    try:
        ray.get_actor("box")
        out = {"lookup": "found"}
    except ValueError as error:
        out = {"lookup": str(error)}
    out["special"] = special(2)
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert after["lookup"].startswith("Failed to look up") and after["special"] == 2, after


def test_a_detached_actor_on_the_member_restarts_there_and_ends_with_the_head(hosts):
    _join_special(hosts)
    first = _run(hosts, """
    @ray.remote(resources={"special": 1}, max_restarts=1)
    class Fragile:
        def pid(self):
            return os.getpid(), ray.get_runtime_context().get_node_id()

        def crash(self):
            os._exit(3)

        def shout(self, text):
            print(text, flush=True)
            return text

    fragile = Fragile.options(name="fragile", lifetime="detached").remote()
    out = {"member": member, "first": ray.get(fragile.pid.remote(), timeout=60)}
    out["crash"] = outcome(fragile.crash.remote())
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert first["first"][1] == first["member"], first
    assert first["crash"].startswith(("ActorDiedError", "ActorUnavailableError")), first
    second = _run(hosts, """
    fragile = ray.get_actor("fragile")
    out = {"second": outcome(fragile.pid.remote(), timeout=60),
           "shout": outcome(fragile.shout.remote("printed after its creator left")),
           "held": special(1)}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    # Restarted on the member (the only node with "special"), as a new process.
    assert second["second"][1] == first["member"], second
    assert second["second"][0] != first["first"][0], second
    assert second["shout"] == "printed after its creator left" and second["held"] == 1, second
    # Printed after its creator left: in the head's node.log, where the service writes.
    log = os.path.join(hosts.record("127.0.0.1").session_dir, "node.log")
    assert wait_until(lambda: "printed after its creator left" in open(log).read(), 30.0)
    assert f"ip={MEMBER})" in open(log).read()
    # The head stops: its actor service's links to the member close, the member ends the
    # actor's worker and releases its lease (the member keeps running).
    stopped = cli(hosts.env("127.0.0.1"), "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert wait_until(lambda: not _member_leases(hosts), 30.0), _member_leases(hosts)


def test_a_detached_actor_whose_member_dies_restarts_on_the_head_in_the_service(hosts):
    _join_special(hosts)
    creator = driver(textwrap.dedent(PRELUDE) + textwrap.dedent("""
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Where:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    soft = NodeAffinitySchedulingStrategy(member, soft=True)
    mover = Where.options(name="mover", lifetime="detached", scheduling_strategy=soft,
                          max_restarts=1).remote()
    stays = Where.options(name="stays", lifetime="detached", scheduling_strategy=soft,
                          max_restarts=0).remote()
    out = {"member": member, "here": ray.get_runtime_context().get_node_id(),
           "before": [ray.get(a.node.remote(), timeout=60) for a in (mover, stays)]}
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    out = {"mover": outcome(mover.node.remote()), "stays": outcome(stays.node.remote())}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """), hosts.env("127.0.0.1"), stdin=subprocess.PIPE)
    try:
        first = json_line(creator, 90)
        assert first["before"] == [first["member"]] * 2, first
        os.kill(hosts.record(MEMBER).pid, signal.SIGKILL)
        time.sleep(1.0)
        after = go_on(creator, 60)
        assert creator.wait(30) == 0, creator.stderr.read()[-3000:]
    finally:
        stop_driver(creator)
    assert after["mover"] == first["here"], after  # restarted on the head, in the service
    assert after["stays"].startswith("ActorDiedError"), after
    assert "its node has died" in after["stays"] and f"ip: {MEMBER}" in after["stays"], after
    other = _run(hosts, """
    out = {"mover": outcome(ray.get_actor("mover").node.remote())}
    try:
        ray.get_actor("stays")
        out["stays"] = "found"
    except ValueError as error:
        out["stays"] = str(error)
    ray.kill(ray.get_actor("mover"))
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert other["mover"] == first["here"], other
    assert other["stays"].startswith("Failed to look up"), other  # dead: its name is free


def test_names_are_the_clusters_from_either_host(hosts):
    _join_special(hosts)
    first = _run(hosts, """
    @ray.remote
    class Counter:
        def __init__(self, start):
            self.n = start

        def add(self, k):
            self.n += k
            return self.n

        def echo(self, value):
            return value

        def node(self):
            return ray.get_runtime_context().get_node_id()

        def gen(self, nbytes):
            yield 1
            yield b"y" * nbytes

    counter = Counter.options(name="counter", lifetime="detached").remote(10)
    out = {"add": ray.get(counter.add.remote(1), timeout=60),
           "here": ray.get_runtime_context().get_node_id()}
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert first["add"] == 11, first
    member = _run(hosts, """
    import numpy as np

    counter = ray.get_actor("counter")
    out = {"member": member, "add": ray.get(counter.add.remote(1), timeout=30),
           "node": ray.get(counter.node.remote(), timeout=30),
           "names": sorted(ray.util.list_named_actors()),
           "all": sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True))}
    big = np.arange(1 << 20, dtype=np.int64)  # 8 MiB each way: bytes, not segment paths
    back = ray.get(counter.echo.remote(big), timeout=60)
    out["big"] = bool((back == big).all())
    back = ray.get(counter.echo.remote(ray.put(big)), timeout=60)
    out["big_ref"] = bool((back == big).all())
    values = [ray.get(r, timeout=30) for r in
              counter.gen.options(num_returns="streaming").remote(4 << 20)]
    out["stream"] = [values[0], len(values[1])]
    ray.get([counter.add.remote(0) for _ in range(5)], timeout=30)
    t0 = time.perf_counter()
    for _ in range(200):
        ray.get(counter.add.remote(0), timeout=30)
    out["us"] = (time.perf_counter() - t0) / 200 * 1e6

    @ray.remote
    class Other:
        def __init__(self):
            print("other constructed", flush=True)

        def node(self):
            return ray.get_runtime_context().get_node_id()

    try:
        Other.options(name="counter").remote()
        out["dup"] = "created"
    except ValueError as error:
        out["dup"] = f"{type(error).__name__}: {error}"
    made = Other.options(name="from_member", lifetime="detached").remote()
    out["made"] = ray.get(made.node.remote(), timeout=60)
    special_one = Other.options(name="special_one", resources={"special": 1}).remote()
    out["special_one"] = ray.get(special_one.node.remote(), timeout=60)
    out["held"] = special(1)
    ray.kill(special_one)
    out["back"] = special(2)
    Other.options(name="ephemeral").remote()  # named, not detached: ends with this driver
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, ip=MEMBER)
    assert member["add"] == 12, member  # the head driver's actor, its state kept
    assert member["node"] == first["here"], member
    assert member["names"] == ["counter"], member
    assert member["all"] == ["counter"], member
    assert member["big"] and member["big_ref"], member
    assert member["stream"] == [1, 4 << 20], member
    print(f"\ncall round trip from the member's host to an actor of the head's service "
          f"(relayed by the head): {member['us']:.0f} us")
    assert member["dup"].startswith("ActorAlreadyExistsError"), member
    assert "counter" in member["dup"], member
    assert member["made"] == first["here"], member  # placed by the head's usual rules
    assert member["special_one"] == member["member"], member  # where its resources are
    assert member["held"] == 1 and member["back"] == 2, member
    assert "other constructed" in member["stdout"], member["stdout"]  # its creator's output
    back = _run(hosts, """
    def missing(name, within=10):
        t0 = time.monotonic()
        while time.monotonic() - t0 < within:
            try:
                ray.get_actor(name)
            except ValueError:
                return True
            time.sleep(0.1)
        return False

    made = ray.get_actor("from_member")
    out = {"made": ray.get(made.node.remote(), timeout=30), "gone": missing("ephemeral")}
    out["names"] = sorted(ray.util.list_named_actors())
    ray.kill(made)
    ray.kill(ray.get_actor("counter"))
    out["after"] = sorted(ray.util.list_named_actors())
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """)
    assert back["made"] == first["here"], back
    assert back["gone"], back  # its creator on the member left: it ended
    assert back["names"] == ["counter", "from_member"], back
    assert back["after"] == [], back


def test_a_named_actor_request_from_the_member_fails_clearly_without_the_head(hosts):
    _join_special(hosts)
    stopped = cli(hosts.env("127.0.0.1"), "stop")
    assert stopped.returncode == 0, stopped.stderr
    t0 = time.monotonic()
    doc = _run(hosts, """
    @ray.remote
    class A:
        pass

    out = {}
    for what, call in (("lookup", lambda: ray.get_actor("x")),
                       ("create", lambda: A.options(name="x").remote())):
        try:
            call()
            out[what] = "ok"
        except Exception as error:
            out[what] = f"{type(error).__name__}: {error}"
    print(json.dumps(out), flush=True)
    ray.shutdown()
    """, ip=MEMBER, timeout=60)
    assert time.monotonic() - t0 < 50, doc
    for what in ("lookup", "create"):
        assert "127.0.0.1" in doc[what] and "cannot be reached" in doc[what], doc


def test_a_frozen_head_fails_the_members_named_actor_request_in_bounded_time(hosts):
    _join_special(hosts)
    head = hosts.record("127.0.0.1").pid
    os.kill(head, signal.SIGSTOP)  # its port accepts (the kernel), nobody answers
    try:
        t0 = time.monotonic()
        doc = _run(hosts, """
        t0 = time.monotonic()
        try:
            ray.get_actor("x")
            out = {"lookup": "found"}
        except Exception as error:
            out = {"lookup": f"{type(error).__name__}: {error}"}
        out["s"] = time.monotonic() - t0
        print(json.dumps(out), flush=True)
        ray.shutdown()
        """, ip=MEMBER, timeout=60)
    finally:
        os.kill(head, signal.SIGCONT)
    assert "cannot be reached" in doc["lookup"] and "127.0.0.1" in doc["lookup"], doc
    assert doc["s"] < 15 and time.monotonic() - t0 < 50, doc  # the connect timeout (10 s)


def test_the_actors_role_is_the_heads_only_and_needs_the_token(hosts):
    _join_special(hosts)
    token = auth_token.load_token(environ=hosts.env("127.0.0.1"))
    head, member = hosts.record("127.0.0.1"), hosts.record(MEMBER)
    with pytest.raises(pc.PeerRefused, match="not a head.*127.0.0.1"):
        ph.connect((MEMBER, member.port), token, "actors", timeout=5.0,
                   source_address=("127.0.0.1", 0))
    with pytest.raises(pc.PeerAuthError):
        ph.connect(("127.0.0.1", head.port), b"x" * len(token), "actors", timeout=5.0)
    # The head relays frames to its actor service unchanged: a HELLO, then a LIST.
    channel = ph.connect(("127.0.0.1", head.port), token, "actors", timeout=5.0)
    try:
        channel.send_bytes(pickle.dumps((protocol.SVC_HELLO, "control", os.getpid(),
                                         "ab" * 8, "mrtest01", "", [], ""), 5))
        assert pickle.loads(channel.recv_bytes(timeout=15.0)) == (protocol.SVC_OK, None)
        channel.send_bytes(pickle.dumps((protocol.SVC_LIST, "", True), 5))
        assert pickle.loads(channel.recv_bytes(timeout=15.0)) == (protocol.SVC_OK, [])
    finally:
        channel.close()


def test_a_member_drivers_proxies_fail_when_the_head_stops(hosts):
    _join_special(hosts)
    member_driver = driver(textwrap.dedent(PRELUDE) + textwrap.dedent("""
    @ray.remote
    class Box:
        def ping(self):
            return "pong"

    box = Box.options(name="box", lifetime="detached").remote()
    print(json.dumps({"ping": ray.get(box.ping.remote(), timeout=60)}), flush=True)
    sys.stdin.readline()  # the head stops meanwhile
    print(json.dumps({"after": outcome(box.ping.remote(), timeout=30)}), flush=True)
    ray.shutdown()
    """), hosts.env(MEMBER), stdin=subprocess.PIPE)
    try:
        assert json_line(member_driver, 90) == {"ping": "pong"}
        stopped = cli(hosts.env("127.0.0.1"), "stop")
        assert stopped.returncode == 0, stopped.stderr
        after = go_on(member_driver, 60)
        assert member_driver.wait(30) == 0, member_driver.stderr.read()[-3000:]
    finally:
        stop_driver(member_driver)
    assert after["after"].startswith("ActorDiedError"), after
    assert "head's" in after["after"] and "127.0.0.1" in after["after"], after
