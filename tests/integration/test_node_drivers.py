"""Drivers that join a node started with ``miniray start``: address forms, two drivers at once,
a driver killed with SIGKILL, refused arguments, and ``stop`` leaving nothing behind.

Each test has its own MINIRAY_TMPDIR (short path) and MINIRAY_HOST_DIR; every node started is
stopped in a ``finally``, and the teardown checks that nothing with that MINIRAY_TMPDIR in its
environment is alive and no session directory is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from miniray._private.core import protocol
from miniray._private.host import procinfo

from .helpers import cli, driver, json_line, ledger_leases, wait_until


@pytest.mark.parametrize("how", ["plain", "auto", "address", "RAY_ADDRESS"])
def test_a_driver_joins_the_node_however_it_names_it(node_env, how):
    started = cli(node_env, "start", "--head", "--num-cpus", "2", "--port", "6411")
    assert started.returncode == 0, started.stderr
    call = {"plain": "ray.init()", "auto": "ray.init(address='auto')",
            "address": "ray.init(address='127.0.0.1:6411')", "RAY_ADDRESS": "ray.init()"}[how]
    extra = {"RAY_ADDRESS": "127.0.0.1:6411"} if how == "RAY_ADDRESS" else {}
    proc = driver(f"""
        import json, miniray as ray
        ctx = {call}
        @ray.remote
        def f(x):
            return x + 1
        print(json.dumps({{"address": ctx["address"], "cpus": ray.cluster_resources()["CPU"],
                          "value": ray.get(f.remote(1))}}))
        ray.shutdown()
    """, node_env, **extra)
    result = json_line(proc)
    assert proc.wait(30) == 0, proc.stderr.read()
    assert result == {"address": "127.0.0.1:6411", "cpus": 2.0, "value": 2}


def test_connecting_with_num_cpus_is_refused_as_ray_does(node_env):
    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    proc = driver("""
        import miniray as ray
        try:
            ray.init(address="auto", num_cpus=2)
        except ValueError as error:
            print("refused:", error)
    """, node_env)
    out, err = proc.communicate(timeout=30)
    assert "When connecting to an existing cluster, num_cpus and num_gpus must not be " \
           "provided." in out, err


def test_auto_without_a_node_raises_connection_error(node_env):
    proc = driver("""
        import miniray as ray
        try:
            ray.init(address="auto")
        except ConnectionError as error:
            print("connection error:", error)
    """, node_env)
    out, err = proc.communicate(timeout=30)
    assert "Could not find any running Ray instance" in out, err


HOLDER = """
    import json, os, time, miniray as ray
    ray.init(address="auto")
    @ray.remote(num_cpus=1)
    def hold():
        time.sleep(60)
    ref = hold.remote()
    rt = ray._private.runtime.current()
    deadline = time.time() + 30
    while not rt.pids() and time.time() < deadline:
        time.sleep(0.02)
    # Until the node's ledger shows the task's CPU held and nothing else of this driver's
    # (a fixed 0.3 s stood in for that).
    while ray.available_resources().get("CPU", 0.0) != 1.0 and time.time() < deadline:
        time.sleep(0.02)
    print(json.dumps({"pids": rt.pids(), "pid": os.getpid()}), flush=True)
    ray.get(ref)
"""


def test_two_drivers_share_the_node_and_a_killed_one_gives_its_share_back(node_env):
    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    first = driver(HOLDER, node_env)
    second = None
    try:
        held = json_line(first)  # its task runs and holds one CPU
        second = driver("""
            import json, sys, time, miniray as ray
            ray.init(address="auto")
            @ray.remote(num_cpus=1)
            def ping(x):
                return x
            print(json.dumps({"cpus_free": ray.available_resources().get("CPU", 0.0)}),
                  flush=True)
            sys.stdin.readline()  # wait until the test has killed the other driver
            deadline = time.time() + 10
            while ray.available_resources().get("CPU", 0.0) < 2.0 and time.time() < deadline:
                time.sleep(0.05)
            print(json.dumps({"cpus_free": ray.available_resources().get("CPU", 0.0),
                              "values": ray.get([ping.remote(i) for i in range(20)])}),
                  flush=True)
            ray.shutdown()
        """, node_env, stdin=subprocess.PIPE)
        before = json_line(second)
        assert before["cpus_free"] == 1.0  # the other driver's task holds one CPU
        leases = ledger_leases(node_env)
        assert any(lease["holder_pid"] == held["pid"] for lease in leases.values())
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        gone = [p for p in held["pids"] if procinfo.is_alive(p)]
        deadline = time.monotonic() + 10
        while gone and time.monotonic() < deadline:
            time.sleep(0.05)
            gone = [p for p in held["pids"] if procinfo.is_alive(p)]
        assert not gone, f"the killed driver's workers outlived it: {gone}"
        second.stdin.write("go\n")  # the second driver goes on
        second.stdin.flush()
        after = json_line(second)
        assert second.wait(30) == 0, second.stderr.read()
        assert after["cpus_free"] == 2.0
        assert after["values"] == list(range(20))
        assert not [lease for lease in ledger_leases(node_env).values()
                    if lease["holder_pid"] == held["pid"]]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_status_shows_a_running_task_and_stop_leaves_nothing(node_env):
    assert cli(node_env, "start", "--head", "--num-cpus", "2", "--num-gpus", "1").returncode == 0
    proc = driver(HOLDER, node_env)
    try:
        json_line(proc)
        status = cli(node_env, "status")
        assert status.returncode == 0, status.stderr
        text = status.stdout
        assert "CPU" in text and "GPU" in text
        assert "CPU=1" in text  # the running task's lease, by its resource shape
        assert "Object stores (one per driver)" in text  # the connected driver's store
    finally:
        proc.kill()
        proc.wait(10)
    stopped = cli(node_env, "stop")
    assert stopped.returncode == 0 and "Stopped 1 miniray node(s)." in stopped.stdout
    root = node_env["MINIRAY_TMPDIR"]
    assert not os.path.isdir(root) or not [n for n in os.listdir(root)
                                           if n.startswith("session_")]


def test_the_node_removes_the_store_of_a_driver_killed_with_sigkill(node_env):
    """A driver of a node puts large objects (segments in /dev/shm, and a spilled one on disk)
    and is SIGKILLed: the node sees its EOF and, once the process is gone, removes every
    segment named with its store's tag and its spill folder, within a few seconds, without
    waiting for the next init() or `miniray stop`; the node keeps running."""
    started = cli(node_env, "start", "--head", "--num-cpus", "1",
                  "--object-store-memory", str(80 << 20))
    assert started.returncode == 0, started.stderr
    proc = driver("""
        import json, os, sys, numpy as np, miniray as ray
        ray.init(address="auto")
        refs = [ray.put(np.full(25 << 20, i, dtype=np.uint8)) for i in range(4)]  # one spills
        store = ray._private.runtime.current().store
        print(json.dumps({"tag": store.session_tag, "pid": os.getpid(),
                          "spill_dir": store.spill_dir, "stats": store.statistics()}),
              flush=True)
        sys.stdin.readline()
    """, node_env, stdin=subprocess.PIPE)
    try:
        info = json_line(proc)
        tag = info["tag"]

        def segments():
            return [n for n in os.listdir("/dev/shm") if n.startswith(f"mr_{tag}_")]

        assert segments(), "the driver's objects should be in /dev/shm"
        assert info["stats"]["spilled_objects"] >= 1 and os.listdir(info["spill_dir"])
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while (segments() or os.path.exists(info["spill_dir"])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not segments(), f"segments of the killed driver left: {segments()}"
        assert not os.path.exists(info["spill_dir"])
        status = cli(node_env, "status")
        assert status.returncode == 0, status.stderr  # the node still runs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_driver_of_another_miniray_or_python_version_is_refused_naming_both(node_env):
    """A driver whose miniray version, or whose Python major.minor, is not the node's gets a
    RuntimeError from ``init`` worded as Ray 2.60's ("Version mismatch: The cluster was
    started with: ... This process on node ... was started with: ...", compared with Ray's
    ``check_version_info``), naming both versions and what to do; nothing of it is left on
    the node. A Python patch difference only warns (Ray does so at its "minor" level; its
    default refuses it too). The versions are the driver's own, patched in its process."""
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    proc = driver("""
        import json, logging, sys
        import miniray as ray
        from miniray import _version
        from miniray._private.core import protocol

        def refusal():
            try:
                ray.init(address="auto")
            except RuntimeError as error:
                return str(error)
            ray.shutdown()
            return None

        real_version, real_python = _version.__version__, protocol.PYTHON_VERSION
        _version.__version__ = "9.9.9"
        other_miniray = refusal()
        _version.__version__ = real_version
        major, minor, _patch = real_python.split(".")
        protocol.PYTHON_VERSION = f"{major}.{int(minor) + 1}.0"
        other_python = refusal()
        protocol.PYTHON_VERSION = f"{major}.{minor}.999"
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings.append(record.getMessage())
        logging.getLogger("miniray").addHandler(handler)
        ray.init(address="auto")
        protocol.PYTHON_VERSION = real_python

        @ray.remote
        def f():
            return 7

        value = ray.get(f.remote())
        ray.shutdown()
        print(json.dumps({"miniray": other_miniray, "python": other_python, "value": value,
                          "warnings": warnings, "real": [real_version, real_python],
                          "initialized": ray.is_initialized()}))
    """, node_env)
    result = json_line(proc)
    assert proc.wait(30) == 0, proc.stderr.read()
    version, python = result["real"]
    major, minor, _patch = python.split(".")
    assert result["miniray"] == (
        "Version mismatch: The cluster was started with:\n"
        f"    miniray: {version}\n"
        f"    Python: {python}\n"
        "This process on node 127.0.0.1 was started with:\n"
        "    miniray: 9.9.9\n"
        f"    Python: {python}\n"
        "Run this driver with the Python and miniray the node was started with, or restart "
        "the node with this driver's (`miniray stop`, then `miniray start --head`).")
    assert f"    Python: {python}\nThis process on node" in result["python"]
    assert result["python"].endswith(f"    Python: {major}.{int(minor) + 1}.0\nRun this "
                                     "driver with the Python and miniray the node was "
                                     "started with, or restart the node with this driver's "
                                     "(`miniray stop`, then `miniray start --head`).")
    assert [w for w in result["warnings"] if w.startswith("Python patch version mismatch")]
    assert result["value"] == 7 and result["initialized"] is False
    assert wait_until(lambda: ledger_leases(node_env) == {}, 10)


def test_a_driver_of_another_protocol_version_is_refused_and_told_what_to_do(node_env):
    """A driver of protocol version 1 (string tags) gets NODE_REFUSED, which its own
    ``connect`` shows as "the node refused the connection: ..."; a driver of a newer version
    gets the same words from ``connect``. The node keeps serving drivers of its version."""
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    proc = driver("""
        import json, os, pickle, socket
        import miniray as ray
        from miniray._private.core import protocol
        from miniray._private.transport import node_client as nc
        from miniray._private.transport.spawn import send_message

        record = nc.find_node("auto")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(10)
        with nc.sun_path(record.socket) as name:
            sock.connect(name)
        send_message(sock, ("HELLO", os.getpid()))  # what a version-1 driver sends
        reply = pickle.loads(sock.recv(65536))
        closed = sock.recv(65536) == b""
        sock.close()
        current = protocol.PROTOCOL_VERSION
        protocol.PROTOCOL_VERSION = current + 1
        try:
            nc.connect(record)
            newer = "connected"
        except ConnectionError as error:
            newer = str(error)
        protocol.PROTOCOL_VERSION = current
        ray.init(address="auto")

        @ray.remote
        def f():
            return 7

        print(json.dumps({"tag": reply[0], "why": reply[1], "closed": closed, "newer": newer,
                          "value": ray.get(f.remote())}))
        ray.shutdown()
    """, node_env)
    result = json_line(proc)
    assert proc.wait(30) == 0, proc.stderr.read()
    assert result["tag"] == 42 and result["closed"]  # protocol.NODE_REFUSED, then EOF
    version = protocol.PROTOCOL_VERSION
    assert result["why"].startswith(f"this node speaks miniray protocol version {version}, "
                                    "the driver version 1.")
    assert "miniray stop" in result["why"]
    assert result["newer"].startswith("Failed to connect to Ray cluster at 127.0.0.1:")
    assert ("the node refused the connection: this node speaks miniray protocol version "
            f"{version}, the driver version {version + 1}.") in result["newer"]
    assert result["value"] == 7


def test_idle_leases_are_kept_for_reuse_until_another_driver_waits_for_them(node_env):
    """A driver keeps its idle workers' leases (here up to 60 s: MINIRAY_LEASE_KEEP_MS) while
    nobody else asks; a second driver whose task does not fit says so in the ledger, and
    the first gives them back long before its keep ends."""
    assert cli(node_env, "start", "--head", "--num-cpus", "2").returncode == 0
    first = driver("""
        import json, os, sys, miniray as ray
        ray.init(address="auto")
        @ray.remote(num_cpus=1)
        def one(x):
            import time
            time.sleep(0.3)
            return x
        print(json.dumps({"values": ray.get([one.remote(i) for i in range(2)]),
                          "pid": os.getpid()}), flush=True)
        sys.stdin.readline()
        ray.shutdown()
    """, node_env, stdin=subprocess.PIPE, MINIRAY_LEASE_KEEP_MS="60000")
    second = None
    try:
        held = json_line(first)
        assert held["values"] == [0, 1]
        time.sleep(0.3)  # far past the 5 ms linger: still kept, nobody waits
        mine = [lease for lease in ledger_leases(node_env).values()
                if lease["holder_pid"] == held["pid"]]
        assert len(mine) == 2, mine
        t0 = time.monotonic()
        second = driver("""
            import json, miniray as ray
            ray.init(address="auto")
            @ray.remote(num_cpus=2)
            def both():
                return "ran"
            print(json.dumps({"value": ray.get(both.remote(), timeout=20)}), flush=True)
            ray.shutdown()
        """, node_env)
        assert json_line(second) == {"value": "ran"}
        assert time.monotonic() - t0 < 20  # not the 60 s keep: the want was seen
        assert second.wait(30) == 0, second.stderr.read()
        first.stdin.write("done\n")
        first.stdin.flush()
        assert first.wait(30) == 0, first.stderr.read()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
