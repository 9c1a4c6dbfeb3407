"""Named and detached actors on a node: they live in the node's actor service and every driver
of the node reaches them (Ray's lifetimes: detached outlives its creator; named dies with its
creator, or when no driver holds it any more).

Every test starts a node under its own MINIRAY_TMPDIR (the ``node_env`` fixture); its teardown
stops the node and fails if any process, session directory or shared-memory segment of that
root is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from miniray._private.host import procinfo, session
from miniray._private.node import daemon
from miniray._private.transport import node_client

from .helpers import CANCEL_REACHES_A_PYTHON_LOOP, FLAKY_ACTOR, cli, driver, json_line, wait_until

COUNTER = """
import json, os, sys
import numpy as np
import miniray as ray
ray.init(address="auto", namespace="team")

@ray.remote
class Counter:
    def __init__(self, start=0, weights=None):
        self.n = start
        self.weights = weights
    def inc(self, k=1):
        self.n += k
        return self.n
    def pid(self):
        return os.getpid()
    def weight_sum(self):
        return float(self.weights.sum())
    def ones(self, n):
        return np.ones(n)
    def total(self, a):
        return float(a.sum())
    def nested(self):
        return [ray.put(1)]

def say(**kw):
    print(json.dumps(kw), flush=True)
"""


def _program(code: str) -> str:
    return COUNTER + textwrap.dedent(code)


def _start(env) -> node_client.NodeRecord:
    started = cli(env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    return node_client.find_node("auto", env["MINIRAY_TMPDIR"])


def _run(env, code: str, timeout: float = 60) -> dict:
    """Run a driver to completion; its last JSON line."""
    proc = driver(_program(code), env)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no output; stderr: {err[-3000:]}"
    return json.loads(lines[-1])


def _service_pid(record) -> int | None:
    """The actor service's pid, from the file the node writes when it starts one (the one
    `miniray stop` reads too)."""
    return daemon.actor_service_of(record)[0]


def _service_segments(record, env) -> list[str]:
    """The actor service's shared-memory segments (``mr_<root tag><ns tag><pid>...``)."""
    prefix = f"mr_{session.root_tag(env['MINIRAY_TMPDIR'])}{procinfo.ns_tag()}"
    prefix += f"{_service_pid(record):08x}"
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


def _service_objects(record) -> int | None:
    """Objects in the actor service's store, from the statistics it publishes each second."""
    path = os.path.join(record.session_dir, "driver_stats", f"{_service_pid(record)}.json")
    try:
        with open(path) as f:
            return json.load(f)["objects"]
    except (OSError, ValueError):
        return None


def test_a_detached_actor_outlives_its_creator_and_serves_the_next_driver(node_env):
    record = _start(node_env)
    first = _run(node_env, """
        weights = ray.put(np.ones(300_000))
        c = Counter.options(name="keeper", lifetime="detached").remote(10, weights)
        say(n=ray.get(c.inc.remote()), names=ray.util.list_named_actors())
    """)
    assert first == {"n": 11, "names": ["keeper"]}
    status = cli(node_env, "status")
    assert status.returncode == 0, status.stderr
    row = [line for line in status.stdout.splitlines() if "actor Counter name=keeper" in line]
    assert row and str(_service_pid(record)) in row[0], status.stdout  # held by the service
    # The service keeps its own copy of the constructor's argument, for restarts.
    assert wait_until(lambda: _service_objects(record) == 1, 30.0), _service_objects(record)
    second = _run(node_env, """
        c = ray.get_actor("keeper")
        n, weights = ray.get([c.inc.remote(5), c.weight_sum.remote()])
        all_names = ray.util.list_named_actors(all_namespaces=True)
        ray.kill(c)
        try:
            ray.get(c.inc.remote())
            died = None
        except ray.exceptions.ActorDiedError as error:
            died = "killed by `ray.kill`" in str(error)
        say(n=n, weights=weights, all=all_names, died=died)
    """)
    assert second == {"n": 16, "weights": 300_000.0,
                      "all": [{"name": "keeper", "namespace": "team"}], "died": True}
    # The service's copy of the constructor's argument went with the actor.
    assert wait_until(lambda: _service_objects(record) == 0, 30.0)
    third = _run(node_env, """
        try:
            ray.get_actor("keeper")
            found = True
        except ValueError as error:
            found = str(error)
        say(found=found, names=ray.util.list_named_actors())
    """)
    assert third["found"].startswith("Failed to look up actor with name 'keeper'")
    assert third["names"] == []


def test_state_is_shared_between_drivers_in_one_namespace_only(node_env):
    _start(node_env)
    first = _run(node_env, """
        c = Counter.options(name="shared", lifetime="detached").remote()
        say(n=ray.get(c.inc.remote()))
    """)
    assert first == {"n": 1}
    other = _run(node_env, """
        ray.shutdown()
        ray.init(address="auto", namespace="elsewhere")
        try:
            ray.get_actor("shared")
            found = True
        except ValueError:
            found = False
        c = ray.get_actor("shared", namespace="team")
        say(found=found, n=ray.get(c.inc.remote()))
        ray.kill(c)
    """)
    assert other == {"found": False, "n": 2}


def test_a_named_actor_is_shared_while_its_creator_lives_and_dies_with_it(node_env):
    record = _start(node_env)
    creator = driver(_program("""
        c = Counter.options(name="mine").remote()
        say(n=ray.get(c.inc.remote()), pid=ray.get(c.pid.remote()))
        sys.stdin.readline()
    """), node_env, stdin=subprocess.PIPE)
    try:
        made = json_line(creator)
        assert made["n"] == 1
        user = _run(node_env, """
            c = ray.get_actor("mine")
            say(n=ray.get(c.inc.remote(2)))
        """)
        assert user == {"n": 3}
        creator.send_signal(signal.SIGKILL)
        creator.wait(10)
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.wait(10)
    assert wait_until(lambda: not procinfo.is_alive(made["pid"]), 30.0)
    after = _run(node_env, """
        say(names=ray.util.list_named_actors(all_namespaces=True))
    """)
    assert after == {"names": []}
    leases = json.load(open(os.path.join(record.session_dir, "ledger.json")))["leases"]
    assert not leases, leases


def test_names_are_unique_across_drivers_and_get_if_exists_returns_the_same_actor(node_env):
    _start(node_env)
    _run(node_env, """
        Counter.options(name="x", lifetime="detached").remote(100)
        say(ok=True)
    """)
    result = _run(node_env, """
        try:
            Counter.options(name="x").remote()
            error = None
        except ValueError as e:
            error = [type(e).__name__, str(e)]
        same = Counter.options(name="x", get_if_exists=True).remote()
        say(error=error, n=ray.get(same.inc.remote()),
            same=same._actor_id_hex() == ray.get_actor("x")._actor_id_hex())
        ray.kill(same)
    """)
    assert result["error"][0] == "ActorAlreadyExistsError"
    assert result["error"][1].startswith("The name x (namespace=team) is already taken.")
    assert result["n"] == 101 and result["same"]


def test_large_arguments_and_results_cross_drivers_and_nothing_is_left(node_env):
    _start(node_env)
    result = _run(node_env, """
        c = Counter.options(name="big", lifetime="detached").remote()
        arg = np.arange(1_000_000, dtype=np.float64)
        by_value = ray.get(c.total.remote(arg))
        by_ref = ray.get(c.total.remote(ray.put(arg)))
        out = ray.get(c.ones.remote(500_000))
        from miniray._private import runtime
        store = runtime.current().store
        say(by_value=by_value, by_ref=by_ref, out=[float(out.sum()), out.flags.writeable],
            adopted=store.statistics()["segments_adopted"])
        del out
        import gc; gc.collect()
        ray.kill(c)
    """)
    expected = float(sum(range(1_000_000)))
    assert result["by_value"] == expected and result["by_ref"] == expected
    assert result["out"] == [500_000.0, False]
    assert result["adopted"] >= 1  # the actor's segment became this driver's: no copy


def test_refs_nested_in_arguments_and_results_cross_drivers(node_env):
    record = _start(node_env)
    result = _run(node_env, """
        import gc
        from miniray._private import runtime

        @ray.remote
        class Keeper:
            def __init__(self, boxed):
                self.boxed = boxed  # a list holding a ref, kept by the actor
            def first(self):
                return float(ray.get(self.boxed[0]).sum())
            def keep(self, refs):
                self.kept = refs
                return len(refs)
            def kept_sum(self):
                return sum(float(ray.get(r).sum()) for r in self.kept)
            def make(self, n):
                return {"small": ray.put(n), "big": ray.put(np.full(200_000, float(n)))}

        @ray.remote
        def slow(x):
            import time
            time.sleep(0.3)
            return np.full(10, float(x))

        k = Keeper.options(name="keeper", lifetime="detached").remote(
            [ray.put(np.ones(300_000))])
        kept = ray.get(k.keep.remote([ray.put(np.ones(150_000)), slow.remote(2)]))
        gc.collect()  # this driver no longer holds those refs: the actor does
        made = ray.get(k.make.remote(3))
        out = dict(first=ray.get(k.first.remote()), kept=kept,
                   kept_sum=ray.get(k.kept_sum.remote()), small=ray.get(made["small"]),
                   big=float(ray.get(made["big"]).sum()))
        del made
        gc.collect()
        store = runtime.current().store
        import time
        deadline = time.monotonic() + 30  # refs dropped are applied by the I/O thread
        while store.statistics()["objects"] and time.monotonic() < deadline:
            time.sleep(0.02)
        out["objects_left"] = store.statistics()["objects"]
        say(**out)
    """)
    assert result == {"first": 300_000.0, "kept": 2, "kept_sum": 150_020.0, "small": 3,
                      "big": 600_000.0, "objects_left": 0}
    # The service holds its copies of the constructor's and the kept refs' large objects
    # while the actor keeps them, and frees them when it dies.
    held = [n for n in _service_segments(record, node_env) if "_pool" not in n]  # not reuse
    assert len(held) == 2, held
    _run(node_env, """
        ray.kill(ray.get_actor("keeper"))
        say(ok=True)
    """)
    assert wait_until(lambda: not _service_segments(record, node_env), 30.0)

def test_dropping_every_handle_ends_a_named_actor(node_env):
    _start(node_env)
    result = _run(node_env, """
        import time
        c = Counter.options(name="brief").remote()
        pid = ray.get(c.pid.remote())
        del c
        deadline = time.monotonic() + 30
        while ray.util.list_named_actors() and time.monotonic() < deadline:
            time.sleep(0.05)
        say(names=ray.util.list_named_actors(), pid=pid)
    """)
    assert result["names"] == []
    assert wait_until(lambda: not procinfo.is_alive(result["pid"]), 30.0)


def test_tasks_and_actors_of_a_driver_reach_named_actors_by_name(node_env):
    _start(node_env)
    result = _run(node_env, """
        Counter.options(name="hub", lifetime="detached").remote()

        @ray.remote
        def bump(k):
            hub = ray.get_actor("hub")
            return ray.get(hub.inc.remote(k))

        @ray.remote
        def make():
            Counter.options(name="made-in-task", lifetime="detached").remote(7)
            return sorted(ray.util.list_named_actors())

        values = sorted(ray.get([bump.remote(1), bump.remote(2)]))
        names = ray.get(make.remote())
        made = ray.get_actor("made-in-task")
        say(values=values, names=names, made=ray.get(made.inc.remote()))
        ray.kill(made)
        ray.kill(ray.get_actor("hub"))
    """)
    assert result["values"] in ([1, 3], [2, 3])
    assert result["names"] == ["hub", "made-in-task"]
    assert result["made"] == 8


def test_restart_of_a_service_actor_keeps_its_name(node_env):
    _start(node_env)
    result = _run(node_env, """
        c = Counter.options(name="phoenix", lifetime="detached", max_restarts=1).remote()
        first = ray.get(c.pid.remote())
        ray.get(c.inc.remote())
        ray.kill(c, no_restart=False)
        second = ray.get(ray.get_actor("phoenix").pid.remote())
        say(restarted=first != second, n=ray.get(c.inc.remote()))
        ray.kill(c)
    """)
    assert result == {"restarted": True, "n": 1}  # the constructor ran again


def test_a_service_actors_method_retries_the_exceptions_its_retry_exceptions_names(node_env):
    _start(node_env)
    result = _run(node_env, FLAKY_ACTOR + textwrap.dedent("""
        Retrying = ray.remote(max_task_retries=3)(Flaky)
        f = Retrying.options(name="flaky", lifetime="detached").remote()
        named = ray.get(f.named.remote())  # two failures retried, the third try returns
        last = []
        for options in ({}, {"retry_exceptions": [KeyError]}, {"retry_exceptions": True}):
            try:
                ray.get(f.unnamed.options(**options).remote())
            except ValueError as error:
                last.append(str(error).splitlines()[-1])
        say(named=named, last=last)
        ray.kill(f)
    """))
    # not retried, not retried (another class named), retried max_task_retries times
    assert result == {"named": 3, "last": ["ValueError: 4", "ValueError: 5", "ValueError: 9"]}


def test_a_crashed_actor_service_fails_calls_clearly_and_is_replaced(node_env):
    record = _start(node_env)
    service = _service_pid(record)
    proc = driver(_program("""
        c = Counter.options(name="doomed", lifetime="detached").remote()
        say(n=ray.get(c.inc.remote()))
        sys.stdin.readline()
        try:
            ray.get(c.inc.remote())
            error = None
        except ray.exceptions.ActorDiedError as e:
            error = str(e)
        say(error=error)
        c2 = Counter.options(name="reborn", lifetime="detached").remote()
        say(error=error, n=ray.get(c2.inc.remote()))
        ray.kill(c2)
    """), node_env, stdin=subprocess.PIPE)
    try:
        assert json_line(proc) == {"n": 1}
        os.kill(service, signal.SIGKILL)
        assert wait_until(lambda: _service_pid(record) not in (None, service), 30.0)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert "actor service" in (json_line(proc)["error"] or "")
        assert json_line(proc)["n"] == 1  # a new link to the new service
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_an_actor_class_from_the_drivers_own_module_is_importable_in_the_service(
        node_env, tmp_path):
    _start(node_env)
    (tmp_path / "tallies.py").write_text(textwrap.dedent("""
        import miniray as ray

        @ray.remote
        class Tally:
            def __init__(self):
                self.items = []
            def add(self, item):
                self.items.append(item)
                return len(self.items)
    """))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            import json, miniray as ray
            from tallies import Tally
            ray.init(address="auto")
            t = Tally.options(name="tally", lifetime="detached").remote()
            print(json.dumps({"n": ray.get(t.add.remote("x"))}))
            ray.kill(t)
        """)], cwd=tmp_path, env=node_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"n": 1}


def test_an_actors_output_goes_to_the_driver_that_created_it(node_env):
    _start(node_env)
    creator = driver(_program("""
        @ray.remote
        class Talker:
            def say(self, text):
                print(text)
                return text
        t = Talker.options(name="talker", lifetime="detached").remote()
        ray.get(t.say.remote("from-the-creator"))
        say(ok=True)
        sys.stdin.readline()
        ray.kill(t)
    """), node_env, stdin=subprocess.PIPE)
    try:
        before = []  # the creator's lines up to its JSON line
        while not before or not before[-1].startswith("{"):
            line = creator.stdout.readline()
            assert line, creator.stderr.read()[-3000:]
            before.append(line)
        # The actor prints before it returns, and its output travels ahead of the result.
        assert any(line.startswith("(Talker pid=") and "from-the-creator" in line
                   for line in before), before
        other = driver(_program("""
            t = ray.get_actor("talker")
            say(text=ray.get(t.say.remote("from-another-driver")))
        """), node_env)
        out, err = other.communicate(timeout=60)
        assert other.returncode == 0, err[-3000:]
        assert "from-another-driver" in out and "(Talker pid=" not in out
        creator.stdin.write("\n")
        creator.stdin.flush()
        out, err = creator.communicate(timeout=60)
        assert creator.returncode == 0, err[-3000:]
        assert "(Talker pid=" in out and "from-another-driver" in out  # printed where made
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.wait(10)


def test_an_actor_the_node_can_never_place_is_reported_to_its_creator(node_env):
    _start(node_env)
    proc = driver(_program("""
        c = Counter.options(name="greedy", lifetime="detached", num_cpus=64).remote()
        ready, _ = ray.wait([c.inc.remote()], timeout=0.5)
        say(ready=len(ready))
        ray.kill(c)
    """), node_env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"ready": 0}
    assert "CPU" in err and "actor Counter" in err, err


def test_stop_returns_only_once_the_actor_service_is_gone(node_env):
    for force in (False, True):
        record = _start(node_env)
        service = _service_pid(record)
        assert procinfo.is_alive(service)
        _run(node_env, """
            Counter.options(name="left", lifetime="detached").remote()
            say(ok=True)
        """)
        stopped = cli(node_env, "stop", *(["--force"] if force else []))
        assert stopped.returncode == 0, stopped.stderr
        # No waiting here: stop itself waited for the service (SIGTERM on the node's death).
        assert not procinfo.is_alive(service), force
        assert not os.path.exists(record.session_dir), force


def test_a_handle_an_actor_looked_up_keeps_the_named_actor_when_its_creator_lets_go(
        node_env):
    _start(node_env)
    creator = driver(_program("""
        import gc
        c = Counter.options(name="kept").remote()
        say(n=ray.get(c.inc.remote()))
        sys.stdin.readline()
        del c  # the creator lets go, but stays connected
        gc.collect()
        say(dropped=True)
        sys.stdin.readline()
    """), node_env, stdin=subprocess.PIPE)
    user = driver(_program("""
        import time

        @ray.remote
        class User:
            def __init__(self):
                self.c = ray.get_actor("kept")  # looked up inside an actor of this driver
            def bump(self):
                return ray.get(self.c.inc.remote())

        sys.stdin.readline()
        u = User.remote()
        say(first=ray.get(u.bump.remote()))
        sys.stdin.readline()
        time.sleep(0.5)
        say(second=ray.get(u.bump.remote()))
    """), node_env, stdin=subprocess.PIPE)
    try:
        assert json_line(creator) == {"n": 1}

        def go(proc):
            proc.stdin.write("\n")
            proc.stdin.flush()

        go(user)
        assert json_line(user) == {"first": 2}
        go(creator)
        assert json_line(creator) == {"dropped": True}
        go(user)
        assert json_line(user) == {"second": 3}  # still alive: the user driver holds it
        assert user.wait(30) == 0, user.stderr.read()[-3000:]
    finally:
        for proc in (creator, user):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_a_named_gpu_actor_gets_its_device_from_the_nodes_ledger(node_env):
    started = cli(node_env, "start", "--head", "--num-cpus", "2", "--num-gpus", "2")
    assert started.returncode == 0, started.stderr
    result = _run(node_env, """
        @ray.remote(num_gpus=1)
        class Gpu:
            def ids(self):
                return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

        a = Gpu.options(name="gpu-a", lifetime="detached").remote()
        b = Gpu.options(name="gpu-b", lifetime="detached").remote()
        ids = sorted([ray.get(a.ids.remote()), ray.get(b.ids.remote())])
        say(ids=ids, available=ray.available_resources().get("GPU", 0.0))
    """)
    assert result == {"ids": [[[0], "0"], [[1], "1"]], "available": 0.0}
    status = cli(node_env, "status").stdout
    assert "actor Gpu name=gpu-a" in status and "actor Gpu name=gpu-b" in status
    freed = _run(node_env, """
        for name in ("gpu-a", "gpu-b"):
            ray.kill(ray.get_actor(name))
        import time
        deadline = time.monotonic() + 30
        while ray.available_resources().get("GPU", 0.0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        say(available=ray.available_resources().get("GPU", 0.0))
    """)
    assert freed == {"available": 2.0}


def test_cancelling_a_queued_call_to_a_node_actor(node_env, tmp_path):
    # The running call holds the actor until the driver opens a gate after the cancel: with a
    # 0.5 s nap, a stall that long let the queued call run before it was cancelled.
    _start(node_env)
    result = _run(node_env, f"""
        import os, time

        @ray.remote
        class Slow:
            def nap(self, s, gate=None):
                deadline = time.monotonic() + 30
                while gate and not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.01)
                return s

        gate = {str(tmp_path / "gate")!r}
        a = Slow.options(name="slow", lifetime="detached").remote()
        ray.get(a.nap.remote(0))
        running = a.nap.remote(0.5, gate)
        queued = a.nap.remote(0)
        time.sleep(0.1)
        ray.cancel(queued)
        open(gate, "w").close()
        try:
            ray.get(queued)
            cancelled = False
        except ray.exceptions.TaskCancelledError:
            cancelled = True
        say(cancelled=cancelled, running=ray.get(running))
        ray.kill(a)
    """)
    assert result == {"cancelled": True, "running": 0.5}


@CANCEL_REACHES_A_PYTHON_LOOP
def test_cancelling_a_node_actor_call_blocked_in_get(node_env, tmp_path):
    """A call of a named actor of the node, blocked in ``get``, is interrupted by a
    non-forced cancel (KeyboardInterrupt there, ``is_canceled()`` true), its result is
    TaskCancelledError and the task it submitted is cancelled too (recursive), as for an
    actor of the driver's own and as in Ray 2.60 (compared)."""
    _start(node_env)
    result = _run(node_env, f"""
        import os, time

        @ray.remote(max_retries=0)
        def child(started, caught):
            open(started, "w").close()
            try:
                end = time.time() + 30
                while time.time() < end:
                    pass
            except BaseException as error:
                with open(caught + ".part", "w") as f:  # renamed whole: never read half
                    f.write(type(error).__name__)
                os.rename(caught + ".part", caught)
                raise

        @ray.remote
        class Waiter:
            def __init__(self):
                self.seen = []

            def wait(self, started, caught):
                try:
                    ray.get(child.remote(started, caught))
                except KeyboardInterrupt:
                    self.seen.append(ray.get_runtime_context().is_canceled())
                    raise

            def items(self):
                return self.seen

        started, caught = {str(tmp_path / "started")!r}, {str(tmp_path / "caught")!r}
        a = Waiter.options(name="waiter", lifetime="detached").remote()
        ref = a.wait.remote(started, caught)
        deadline = time.monotonic() + 30
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.01)
        start = time.monotonic()
        ray.cancel(ref)
        try:
            ray.get(ref, timeout=15)
            error = None
        except Exception as e:
            error = type(e).__name__
        fast = time.monotonic() - start < 8
        while not os.path.exists(caught) and time.monotonic() < deadline:
            time.sleep(0.01)
        child_saw = open(caught).read() if os.path.exists(caught) else None
        say(error=error, fast=fast, seen=ray.get(a.items.remote()), child=child_saw)
        ray.kill(a)
    """)
    assert result == {"error": "TaskCancelledError", "fast": True, "seen": [True],
                      "child": "KeyboardInterrupt"}


def test_creating_a_node_actor_does_not_wait_for_its_arguments(node_env, tmp_path):
    # The argument's task waits for a gate opened after the creation call returns, so
    # "returned before the argument was made" needs no wall-time bound (one of 0.5 s failed
    # when the driver was not scheduled for that long); had the call waited, the task would
    # end only after its 30 s and leave its mark.
    _start(node_env)
    gate, made = str(tmp_path / "gate"), str(tmp_path / "made")
    result = _run(node_env, f"""
        import os, time

        @ray.remote
        def slow(x):
            deadline = time.monotonic() + 30
            while not os.path.exists({gate!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            open({made!r}, "w").close()
            return np.full(200_000, float(x))

        @ray.remote
        def fails():
            raise KeyError("no such weights")

        c = Counter.options(name="patient", lifetime="detached").remote(0, slow.remote(2))
        fast = not os.path.exists({made!r})
        open({gate!r}, "w").close()
        weights = ray.get(c.weight_sum.remote())  # runs once the argument has arrived
        broken = Counter.options(name="broken", lifetime="detached").remote(0, fails.remote())
        try:
            ray.get(broken.inc.remote())
            died = None
        except ray.exceptions.ActorDiedError as error:
            died = "no such weights" in str(error)
        say(fast=fast, weights=weights, died=died,
            names=ray.util.list_named_actors())
        ray.kill(c)
    """)
    assert result == {"fast": True, "weights": 400_000.0, "died": True, "names": ["patient"]}


def test_a_node_actor_given_an_anonymous_actors_handle_says_what_to_do(node_env):
    _start(node_env)
    result = _run(node_env, """
        @ray.remote
        class Caller:
            def call(self, handle):
                return ray.get(handle.inc.remote())

        plain = Counter.remote()
        named = Counter.options(name="named-counter").remote()
        caller = Caller.options(name="caller").remote()
        try:
            ray.get(caller.call.remote(plain))
            error = None
        except ray.exceptions.RayError as e:
            error = str(e)
        say(error=error, named=ray.get(caller.call.remote(named)))
    """)
    assert "Create that actor with a name" in result["error"]
    assert result["named"] == 1


def test_actor_service_requests_are_made_without_the_owner_lock(node_env):
    """Requests to the actor service (create, lookup, list, kill) wait for its reply: neither
    the driver's own nor those a worker asks for run with the owner's lock held (a slow
    service would stall every task), and kills go to the fork server after the lock too."""
    _start(node_env)
    result = _run(node_env, """
        import threading
        from miniray._private import runtime

        owner = runtime.current().owner
        link = owner.actors.link
        seen = []

        def probe(target, name):
            original = getattr(target, name)
            def wrapped(*args, **kwargs):
                free = owner._lock.acquire(timeout=1.0)  # held by this very thread: times out
                if free:
                    owner._lock.release()
                seen.append((name, free))
                return original(*args, **kwargs)
            setattr(target, name, wrapped)

        probe(link, "_request")
        probe(owner.fork_server, "kill")

        @ray.remote
        def from_worker():
            a = Counter.options(name="w", lifetime="detached").remote()
            ray.get(a.inc.remote())
            names = sorted(ray.util.list_named_actors())
            again = ray.get_actor("w")
            ray.kill(again)
            return names

        c = Counter.options(name="d").remote()
        ray.get(c.inc.remote())
        h = ray.get_actor("d")
        names = ray.util.list_named_actors()
        ray.kill(h)
        worker_names = ray.get(from_worker.remote())
        local = Counter.remote()
        ray.get(local.inc.remote())
        ray.kill(local)
        say(names=names, worker_names=worker_names, seen=sorted(set(seen)),
            requests=sum(1 for name, _ in seen if name == "_request"))
    """)
    assert result["names"] == ["d"] and result["worker_names"] == ["w"]
    assert result["requests"] >= 8  # four from the driver, four from the worker
    assert result["seen"] == [["_request", True], ["kill", True]], result


def test_an_argument_that_becomes_ready_during_the_creation_request_is_sent(node_env):
    """The creation request to the actor service is made without the owner's lock; an
    argument still pending when it was prepared, and ready by the time the reply came, is
    sent at once (its readiness was already announced, so waiting for it would hang the
    actor), and is not freed meanwhile though the program dropped its ref."""
    _start(node_env)
    result = _run(node_env, """
        import time
        from miniray._private import runtime

        link = runtime.current().owner.actors.link
        original = link.create

        def slow_create(spec, exported):
            time.sleep(1.0)  # the argument's task finishes meanwhile
            return original(spec, exported)

        link.create = slow_create

        @ray.remote
        def weights():
            time.sleep(0.2)
            return np.ones(1000)

        c = Counter.options(name="late", lifetime="detached").remote(0, weights.remote())
        total = ray.get(c.weight_sum.remote(), timeout=20)
        ray.kill(c)
        say(total=total)
    """)
    assert result == {"total": 1000.0}
