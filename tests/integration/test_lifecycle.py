"""init / shutdown / is_initialized, auto-init, session directories, driver death.

Ray 2.60 behaviour: ray-api-surface.md §0 (auto-init), §1.1 (init), §1.3 (shutdown).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime
from miniray._private.host import procinfo

ADDRESS_INFO_KEYS = {
    "address",
    "gcs_address",
    "node_id",
    "node_ip_address",
    "object_store_address",
    "raylet_socket_name",
    "redis_address",
    "session_dir",
    "webui_url",
    "metrics_export_port",
    "dashboard_agent_listen_port",
}

REINIT_TEXT = (
    "Maybe you called ray.init twice by accident? This error can be suppressed by passing in "
    "'ignore_reinit_error=True' or by calling 'ray.shutdown()' prior to 'ray.init()'."
)


def _cpu_count() -> int:
    """The machine's CPUs as Ray counts them: affinity, capped by a cgroup v2 quota."""
    count = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            count = min(count, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return count


def _sessions(root: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(root) if e.startswith("session_"))
    except FileNotFoundError:
        return []


# ----------------------------------------------------------------------------- init's result
def test_init_returns_context_mapping_over_address_info(ray_start, session_root):
    ctx = ray_start(num_cpus=1)
    assert set(ctx.address_info) == ADDRESS_INFO_KEYS
    assert set(ctx.keys()) == ADDRESS_INFO_KEYS
    assert len(ctx) == len(ADDRESS_INFO_KEYS)
    assert sorted(iter(ctx)) == sorted(ADDRESS_INFO_KEYS)
    assert dict(ctx.items()) == ctx.address_info
    assert ctx["address"] == ctx["gcs_address"] == ctx.get("address")
    assert re.fullmatch(r"[0-9.]+:\d+", ctx["address"]), ctx["address"]
    assert ctx.get("no-such-key") is None
    session_dir = ctx["session_dir"]
    assert os.path.isdir(session_dir)
    assert os.path.dirname(session_dir) == session_root
    assert os.path.basename(session_dir).startswith("session_")
    assert ctx.dashboard_url == ""
    assert ctx.python_version.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert isinstance(ctx.ray_version, str) and ctx.ray_version
    assert miniray.is_initialized()


def test_context_manager_shuts_down(ray_start):
    with ray_start(num_cpus=1) as ctx:
        assert miniray.is_initialized()
        session_dir = ctx["session_dir"]
        assert miniray.get(miniray.put(5)) == 5
    assert not miniray.is_initialized()
    assert not os.path.exists(session_dir)


def test_is_initialized_follows_init_and_shutdown(ray_start):
    assert not miniray.is_initialized()
    ray_start(num_cpus=1)
    assert miniray.is_initialized()
    miniray.shutdown()
    assert not miniray.is_initialized()


def test_shutdown_twice_and_without_init_is_fine(ray_start):
    miniray.shutdown()  # never initialized
    ray_start(num_cpus=1)
    miniray.shutdown()
    miniray.shutdown()
    assert not miniray.is_initialized()


# ----------------------------------------------------------------------------- double init
def test_double_init_raises_rays_error(ray_start):
    ray_start(num_cpus=1)
    with pytest.raises(RuntimeError) as info:
        miniray.init(num_cpus=1)
    assert str(info.value) == REINIT_TEXT
    assert miniray.is_initialized()


def test_ignore_reinit_error_returns_context_of_existing_session(ray_start):
    first = ray_start(num_cpus=1)
    pids = runtime.current().pids()
    again = miniray.init(num_cpus=2, ignore_reinit_error=True)  # other arguments ignored
    assert again["session_dir"] == first["session_dir"]
    assert miniray.cluster_resources()["CPU"] == 1.0
    assert runtime.current().pids()[0] == pids[0]  # same fork server


def test_reinit_after_shutdown_runs_tasks_in_a_new_session(ray_start, session_root):
    @miniray.remote
    def pid():
        return os.getpid()

    first = ray_start(num_cpus=1)
    first_pid = miniray.get(pid.remote(), timeout=30)
    miniray.shutdown()
    assert not os.path.exists(first["session_dir"])
    second = ray_start(num_cpus=1)
    assert second["session_dir"] != first["session_dir"]
    # A remote function defined in the first session works in the second (Ray re-exports it).
    second_pid = miniray.get(pid.remote(), timeout=30)
    assert second_pid != first_pid
    assert _sessions(session_root) == [os.path.basename(second["session_dir"])]


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, exc_type, text",
    [
        ({"foo": 1}, RuntimeError, "Unknown keyword argument(s): foo"),
        ({"local_mode": True}, RuntimeError, "`local_mode` is no longer supported"),
        (
            {"num_gpus": 1.5},
            ValueError,
            "Resource quantities must all be whole numbers. Violated by resource 'GPU' in",
        ),
        (
            {"num_cpus": 1.5},
            ValueError,
            "Resource quantities must all be whole numbers. Violated by resource 'CPU' in",
        ),
        (
            {"resources": {"custom": 0.5}},
            ValueError,
            "Resource quantities must all be whole numbers. Violated by resource 'custom' in",
        ),
        ({"num_cpus": -1}, ValueError, ""),
        ({"resources": {"custom": -2}}, ValueError, ""),
        ({"resources": {"CPU": 1}}, AssertionError, "num_cpus"),
        ({"resources": {"GPU": 1}}, AssertionError, "num_gpus"),
        ({"resources": {"memory": 1}}, AssertionError, "memory"),
        ({"resources": {"object_store_memory": 1}}, AssertionError, "object_store_memory"),
    ],
    ids=[
        "unknown-kwarg",
        "local_mode",
        "fractional-gpus",
        "fractional-cpus",
        "fractional-custom",
        "negative-cpus",
        "negative-custom",
        "CPU-in-resources",
        "GPU-in-resources",
        "memory-in-resources",
        "osm-in-resources",
    ],
)
def test_invalid_init_arguments(session_root, kwargs, exc_type, text):
    with pytest.raises(exc_type) as info:
        miniray.init(**kwargs)
    assert type(info.value) is exc_type
    assert text in str(info.value)
    # A failed init leaves nothing behind.
    assert not miniray.is_initialized()
    assert _sessions(session_root) == []
    assert procinfo.descendants(os.getpid()) == []


def test_unknown_kwarg_message_is_exact(session_root):
    with pytest.raises(RuntimeError) as info:
        miniray.init(foo=1)
    assert str(info.value) == "Unknown keyword argument(s): foo"


@pytest.mark.parametrize(
    "args, kwargs, exc_type, text",
    [
        ((), {"object_store_memory": 10}, ValueError,
         "Attempting to cap object store memory usage at 10 bytes, but the minimum allowed "
         "is 78643200 bytes"),
        ((), {"object_store_memory": -5}, ValueError, "the minimum allowed is 78643200 bytes"),
        ((), {"object_store_memory": 10**15}, ValueError,
         "(1000000000000000 bytes, 931322.6 GiB) is greater than the total memory"),
        ((), {"object_store_memory": "1000000000"}, TypeError,
         "object_store_memory must be a number of bytes (an int, or a float such as 2e9), "
         "got str '1000000000'."),
        ((), {"object_store_memory": float("inf")}, ValueError, "must be a finite number"),
        ((), {"namespace": 123}, TypeError, "namespace must be None or a string, got int 123."),
        ((), {"namespace": ""}, ValueError, '"" is not a valid namespace.'),
        ((), {"runtime_env": "x"}, TypeError,
         "runtime_env must be a dict or a miniray.runtime_env.RuntimeEnv"),
        ((12345,), {}, TypeError,
         "The address passed to init() must be a string such as 'auto', 'local' or "
         "'127.0.0.1:6379' (or None), got int 12345."),
    ],
    ids=["osm-10", "osm-negative", "osm-huge", "osm-str", "osm-inf", "namespace-int",
         "namespace-empty", "runtime_env-str", "address-int"],
)
def test_init_refuses_what_ray_refuses(session_root, args, kwargs, exc_type, text):
    """Compared with Ray 2.60: the same exception types (ValueError below 75 MiB and above
    the host's memory, TypeError for a namespace that is not a string, for a string
    object_store_memory and for init(12345)). Ray's messages for an int address ("argument
    of type 'int' is not iterable") and a str runtime_env (an AttributeError from deep
    inside) name nothing; these name the argument. Nothing is started."""
    with pytest.raises(exc_type) as info:
        miniray.init(*args, **kwargs)
    assert type(info.value) is exc_type
    assert text in str(info.value)
    assert not miniray.is_initialized()
    assert _sessions(session_root) == []
    assert procinfo.descendants(os.getpid()) == []


def test_init_accepts_what_ray_accepts(ray_start):
    """Compared with Ray 2.60: a float object_store_memory (700e6) is truncated to bytes,
    and a falsy runtime_env ([]) is ignored."""
    ray_start(num_cpus=1, object_store_memory=700e6, runtime_env=[])
    assert miniray.cluster_resources()["object_store_memory"] == 700_000_000.0


def test_object_store_memory_check_is_pure():
    assert runtime.check_object_store_memory(None, 1 << 30) is None
    assert runtime.check_object_store_memory(700e6, 8 << 30) == 700_000_000
    assert runtime.check_object_store_memory(75 << 20, None) == 75 << 20
    with pytest.raises(ValueError, match="minimum allowed"):
        runtime.check_object_store_memory((75 << 20) - 1, None)
    with pytest.raises(ValueError, match="greater than the total memory"):
        runtime.check_object_store_memory(2 << 30, 1 << 30)
    with pytest.raises(TypeError):
        runtime.check_object_store_memory(True, None)
    # Above 10 GB, more than /dev/shm holds is refused as Ray does, unless slow storage is
    # allowed (RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1); below, it is not checked.
    with pytest.raises(ValueError, match=r"exceeds /dev/shm size \(8\.0 GB\)"):
        runtime.check_object_store_memory(12 * 10**9, 64 << 30, 8 * 10**9)
    assert runtime.check_object_store_memory(12 * 10**9, 64 << 30, 8 * 10**9, True) == 12 * 10**9
    assert runtime.check_object_store_memory(9 * 10**9, 64 << 30, 8 * 10**9) == 9 * 10**9


def test_num_cpus_defaults_to_machine_cores(ray_start):
    ray_start()
    assert miniray.cluster_resources()["CPU"] == float(_cpu_count())


@pytest.mark.parametrize("call", ["cluster_resources", "available_resources", "nodes"])
def test_cluster_state_before_init_raises_ray_system_error(session_root, call):
    with pytest.raises(exceptions.RaySystemError) as info:
        getattr(miniray, call)()
    assert "has not been started yet" in str(info.value)
    assert not miniray.is_initialized()


# ----------------------------------------------------------------------------- auto-init
def _auto_put():
    return miniray.get(miniray.put("x"), timeout=30) == "x"


def _auto_remote():
    return miniray.get(miniray.remote(lambda: 7).remote(), timeout=30) == 7


def _auto_gpu_ids():
    return miniray.get_gpu_ids() == []


@pytest.mark.parametrize(
    "call", [_auto_put, _auto_remote, _auto_gpu_ids], ids=["put", "remote", "get_gpu_ids"]
)
def test_auto_init(ray_start, call):
    assert not miniray.is_initialized()
    assert call()
    assert miniray.is_initialized()
    # A plain init(): every CPU of the machine.
    assert miniray.cluster_resources()["CPU"] == float(_cpu_count())
    # ray_start's teardown shuts it down and checks for leaks.


def test_each_init_gets_its_own_session_dir(ray_start, session_root):
    seen = set()
    for _ in range(3):
        ctx = ray_start(num_cpus=1)
        assert os.path.isdir(ctx["session_dir"])
        seen.add(ctx["session_dir"])
        miniray.shutdown()
        assert not os.path.exists(ctx["session_dir"])
    assert len(seen) == 3


# ----------------------------------------------------------------------------- driver death
KILLED_DRIVER = """
    import json, sys, time
    import miniray as ray
    from miniray._private import runtime

    ctx = ray.init(num_cpus=2)

    @ray.remote
    def sleeper():
        time.sleep(30)

    refs = [sleeper.remote() for _ in range(2)]
    deadline = time.time() + 30
    while len(runtime.current().pids()) < 3 and time.time() < deadline:
        time.sleep(0.01)
    while "CPU" in ray.available_resources() and time.time() < deadline:
        time.sleep(0.01)
    print(json.dumps({"pids": runtime.current().pids(), "session_dir": ctx["session_dir"]}),
          flush=True)
    time.sleep(60)
"""


def test_driver_killed_with_sigkill_leaves_no_process_and_is_swept(
    ray_start, drivers, session_root
):
    proc = drivers.start(KILLED_DRIVER)
    info = json.loads(drivers.read_line(proc, timeout=30))
    pids, session_dir = info["pids"], info["session_dir"]
    assert len(pids) == 3  # fork server + two busy workers
    assert all(procinfo.is_alive(pid) for pid in pids)
    assert os.path.isdir(session_dir)

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while any(procinfo.is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = [pid for pid in pids if procinfo.is_alive(pid)]
    if alive:
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"processes of the killed driver outlived it: {alive}")

    # The orphaned session directory stays until the next init() sweeps it.
    assert os.path.isdir(session_dir)
    ctx = ray_start(num_cpus=1)
    assert not os.path.exists(session_dir)
    assert _sessions(session_root) == [os.path.basename(ctx["session_dir"])]


EXITING_DRIVER = """
    import json, os
    import miniray as ray
    from miniray._private import runtime

    ctx = ray.init(num_cpus=2)

    @ray.remote
    def square(x):
        return x * x

    assert ray.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    print(json.dumps({"pids": runtime.current().pids(), "session_dir": ctx["session_dir"]}))
    # no shutdown(): the interpreter just ends
"""


def _run_exiting_driver(drivers):
    result = drivers.run(EXITING_DRIVER, timeout=60)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    return result, info


def test_interpreter_exit_without_shutdown_cleans_up(drivers, session_root):
    _result, info = _run_exiting_driver(drivers)
    deadline = time.monotonic() + 30
    while any(procinfo.is_alive(p) for p in info["pids"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in info["pids"] if procinfo.is_alive(p)]
    assert not os.path.exists(info["session_dir"])
    assert _sessions(session_root) == []


def test_interpreter_exit_without_shutdown_prints_no_error(drivers):
    # Regression: weakref.finalize's atexit hook used to close the ledger's lock fd before
    # miniray's own atexit shutdown ran, which then failed in the I/O thread (EBADF).
    result, _info = _run_exiting_driver(drivers)
    assert "Traceback" not in result.stderr, result.stderr
    assert "miniray bug" not in result.stderr, result.stderr


def test_a_short_task_running_at_exit_finishes_and_prints(drivers):
    """Ray's ``obj_ref.py`` example ends right after submitting a task that prints, calls a
    nested ``get`` and prints again; under Ray 2.60 both lines appear every time (11 runs
    of 11). Here the second one was missing in about half the runs: the exit killed the
    worker during its nested get. At interpreter exit, running work now gets a grace
    (``MINIRAY_EXIT_GRACE_S``); a task that outlives it is still killed, and nothing is
    left."""
    for _ in range(3):
        result = drivers.run("""
            import miniray as ray

            @ray.remote
            def echo_and_get(x_list):
                print("args:", len(x_list))
                print("values:", ray.get(x_list))

            a, b = ray.put(1), ray.put(2)
            echo_and_get.remote([a, b])
        """, timeout=60)
        assert result.returncode == 0, result.stderr
        lines = [line.split(") ", 1)[-1] for line in result.stdout.splitlines()]
        assert lines == ["args: 2", "values: [1, 2]"], result.stdout
    outlived = drivers.run("""
        import json, time
        import miniray as ray
        from miniray._private import runtime

        @ray.remote
        def forever():
            time.sleep(60)

        ref = forever.remote()
        ray.wait([ref], timeout=0.5)
        print(json.dumps(runtime.current().pids()), flush=True)
    """, timeout=60)
    assert outlived.returncode == 0, outlived.stderr
    pids = json.loads(outlived.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 30
    while any(procinfo.is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if procinfo.is_alive(p)]


INTERRUPTED_DRIVER = """
    import json, time
    import miniray as ray
    from miniray._private import runtime

    ctx = ray.init(num_cpus=2)

    @ray.remote
    def sleeper():
        time.sleep(30)

    refs = [sleeper.remote() for _ in range(2)]
    deadline = time.time() + 30
    while len(runtime.current().pids()) < 3 and time.time() < deadline:
        time.sleep(0.01)
    print(json.dumps({"pids": runtime.current().pids(), "session_dir": ctx["session_dir"]}),
          flush=True)
    ray.get(refs)
"""


def test_ctrl_c_in_get_tears_the_session_down(drivers, session_root):
    proc = drivers.start(INTERRUPTED_DRIVER)
    info = json.loads(drivers.read_line(proc, timeout=30))
    time.sleep(0.2)  # let the driver enter get()
    proc.send_signal(signal.SIGINT)
    _out, err = drivers.communicate(proc, timeout=20)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 30
    while any(procinfo.is_alive(p) for p in info["pids"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in info["pids"] if procinfo.is_alive(p)]
    assert not os.path.exists(info["session_dir"])


EXIT_WITH_WORK_DRIVER = """
    import os, sys, time
    import miniray as ray

    ray.init(num_cpus=11)
    marks = sys.argv[1]

    @ray.remote(num_cpus=1)
    class Holder:
        def ping(self):
            return 1

    @ray.remote
    def chatty(i):
        print(f"chatty line {i}")
        open(os.path.join(marks, f"printed_{i}"), "w").close()
        time.sleep(60)

    holder = Holder.remote()
    ray.get(holder.ping.remote(), timeout=60)
    refs = [chatty.remote(i) for i in range(15)]  # 10 run, 5 stay queued
    deadline = time.time() + 60
    while len(os.listdir(marks)) < 10 and time.time() < deadline:
        time.sleep(0.01)
    sys.exit(0)
"""


def test_sys_exit_with_tasks_running_and_queued_is_clean(drivers, tmp_path):
    """sys.exit() with tasks running (each has printed) and queued, and an actor: the
    teardown dispatches nothing more and prints no internal error, and every line the running
    tasks printed reaches the driver's stdout (as in Ray 2.60). Regression: the actor's exit
    during shutdown dispatched a queued task to the fork server that had just exited, and the
    I/O thread reported a BrokenPipeError as a miniray bug."""
    for run in range(10):
        marks = tmp_path / f"marks_{run}"
        marks.mkdir()
        result = drivers.run(EXIT_WITH_WORK_DRIVER, timeout=90, args=[str(marks)])
        assert result.returncode == 0, result.stderr
        assert "miniray bug" not in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        printed = sorted(int(name.split("_")[1]) for name in os.listdir(marks))
        assert len(printed) == 10
        lines = result.stdout.splitlines()
        for i in printed:
            assert any(line.endswith(f"chatty line {i}") for line in lines), result.stdout
