"""GPUs end to end: detection, assignment, worker reuse, and two sessions sharing physical GPUs.

Sessions here run as subprocess drivers. Those that need "physical" GPUs on a machine without
any get a stand-in ``pynvml`` module on their PYTHONPATH (written by ``fake_pynvml`` below):
the same way a real pynvml is found, so production code has no test hook. Each subprocess
gets its own MINIRAY_TMPDIR and the test's own MINIRAY_HOST_DIR, so nothing touches the real
host ledger.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import miniray
from miniray._private.host import procinfo

from .helpers import FAKE_PYNVML

TWO_V100 = "Tesla V100-SXM2-16GB|GPU-aaaa0000,Tesla V100-SXM2-16GB|GPU-bbbb1111"


@pytest.fixture
def fake_pynvml(tmp_path):
    folder = tmp_path / "fake_nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(FAKE_PYNVML)
    return folder


def _env(tmp_path, name: str, fake=None, devices: str = TWO_V100, **extra) -> dict:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("RAY_ADDRESS", None)
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))]
    if fake is not None:
        paths.insert(0, str(fake))
        env["FAKE_NVML_DEVICES"] = devices
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env["MINIRAY_TMPDIR"] = str(tmp_path / f"mr-{name}")
    env["MINIRAY_HOST_DIR"] = str(tmp_path / "host")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _run(code: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _start(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_json_key(proc: subprocess.Popen, key: str, timeout: float = 30):
    """The value of ``key`` in the JSON lines of ``proc``'s stdout, read until one holds it.
    By key, not by position: the driver's lines and its worker's (forwarded by the I/O
    thread) come in either order."""
    seen = proc.__dict__.setdefault("_json_seen", {})
    deadline = time.monotonic() + timeout
    while key not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "{" in line:  # a worker's line carries its "(name pid=N) " prefix
            seen.update(json.loads(line[line.index("{"):]))
        if not line and proc.poll() is not None:
            break
    if key not in seen:
        raise AssertionError(f"no {key!r} from the driver; stderr: {proc.stderr.read()[-2000:]}")
    return seen[key]


def meet(folder: str, parties: int) -> None:
    """In a task: meet the others of its batch. Each leaves a file in ``folder`` and waits
    (at most a minute) until ``parties`` are there, so they hold their devices at the same
    time whatever the machine's speed (a short sleep in each, as before, let a loaded
    machine run them one after another, in one worker or on one device)."""
    import os
    import time
    import uuid

    open(os.path.join(folder, uuid.uuid4().hex), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < parties and time.monotonic() < deadline:
        time.sleep(0.01)


# meet() for a driver script, put before its text (indented as the scripts here are)
MEET = textwrap.indent(textwrap.dedent(inspect.getsource(meet)), " " * 8)


def _meeting(tmp_path, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    return str(folder)


def _wait_dead(pids, timeout: float = 10) -> list:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if procinfo.is_alive(pid)]
        time.sleep(0.05)
    return alive


# --------------------------------------------------------------------- detection (one session)
def test_detection_through_nvml_names_devices_and_accelerator_type(tmp_path, fake_pynvml):
    proc = _run("""
        import json, os, miniray as ray
        ray.init(num_cpus=1)
        @ray.remote(num_gpus=1)
        def which():
            return ray.get_gpu_ids(), os.environ["CUDA_VISIBLE_DEVICES"]
        total = ray.cluster_resources()
        print(json.dumps({"GPU": total.get("GPU"),
                          "V100": total.get("accelerator_type:V100"),
                          "seen": ray.get(which.remote())}))
        ray.shutdown()
    """, _env(tmp_path, "a", fake_pynvml))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["GPU"] == 2.0 and result["V100"] == 1.0
    ids, cvd = result["seen"]
    assert ids in ([0], [1]) and cvd == str(ids[0])  # ints when CUDA_VISIBLE_DEVICES was unset


def test_cuda_visible_devices_at_start_restricts_and_names_gpus(tmp_path, fake_pynvml):
    four = ",".join(f"Tesla T4|GPU-{i}{i}{i}{i}" for i in range(4))
    proc = _run(MEET + """
        import json, os, miniray as ray
        ray.init(num_cpus=2)
        @ray.remote(num_gpus=1)
        def which(folder):
            meet(folder, 2)  # both at once: one device each
            return ray.get_gpu_ids(), os.environ["CUDA_VISIBLE_DEVICES"]
        seen = ray.get([which.remote(os.environ["MEET_DIR"]) for _ in range(2)])
        print(json.dumps({"GPU": ray.cluster_resources()["GPU"], "seen": seen}))
        ray.shutdown()
    """, _env(tmp_path, "a", fake_pynvml, devices=four, CUDA_VISIBLE_DEVICES="1,3",
                     MEET_DIR=_meeting(tmp_path, "meet")))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["GPU"] == 2.0
    assert sorted(ids[0] for ids, _ in result["seen"]) == ["1", "3"]  # strings, as Ray 2.60
    assert sorted(cvd for _, cvd in result["seen"]) == ["1", "3"]


def test_no_pynvml_means_no_gpus_and_num_gpus_beyond_cvd_is_refused(tmp_path):
    hidden = tmp_path / "no_nvml"  # hides a real pynvml, on a host that has one
    hidden.mkdir()
    (hidden / "pynvml.py").write_text("raise ImportError('no pynvml here')\n")
    proc = _run("""
        import miniray as ray
        ray.init(num_cpus=1)
        print("GPU", ray.cluster_resources().get("GPU"))
        ray.shutdown()
        try:
            ray.init(num_cpus=1, num_gpus=3)
        except ValueError as error:
            print("refused", error)
    """, _env(tmp_path, "a", hidden, CUDA_VISIBLE_DEVICES="3,5"))
    assert proc.returncode == 0, proc.stderr
    assert "GPU None" in proc.stdout
    assert "Attempting to start raylet with 3 GPU, but CUDA_VISIBLE_DEVICES contains" in (
        proc.stdout)


# ------------------------------------------------------------------ worker reuse (max_calls)
def test_gpu_tasks_get_a_fresh_worker_unless_max_calls_is_zero(ray_start):
    ray_start(num_cpus=2, num_gpus=1)

    @miniray.remote(num_gpus=1)
    def fresh():
        return os.getpid()

    @miniray.remote(num_gpus=1, max_calls=0)
    def reused():
        return os.getpid()

    @miniray.remote(num_gpus=0.5, max_calls=2)
    def twice():
        return os.getpid()

    assert len({miniray.get(fresh.remote()) for _ in range(3)}) == 3
    assert len({miniray.get(reused.remote()) for _ in range(3)}) == 1
    pids = [miniray.get(twice.remote()) for _ in range(4)]
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]


def _pid_and_cvd():
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_gpu_task_never_runs_in_a_worker_that_ran_a_cpu_task(ray_start):
    """Even with ``max_calls=0`` and idle CPU workers at hand, a GPU task gets a worker of its
    own (compared with Ray 2.60: its worker pool keeps GPU and non-GPU workers apart, the pids
    differ there too)."""
    ray_start(num_cpus=2, num_gpus=1)
    cpu = miniray.remote(_pid_and_cvd)
    gpu = miniray.remote(num_gpus=1, max_calls=0)(_pid_and_cvd)
    half_gpu = miniray.remote(num_gpus=0.5, max_calls=0)(_pid_and_cvd)

    cpu_pids = {miniray.get(cpu.remote(), timeout=30)[0] for _ in range(3)}
    miniray.available_resources()  # idle leases go back: their workers wait in the pool
    runs = [miniray.get(gpu.remote(), timeout=30) for _ in range(2)]
    miniray.available_resources()
    runs += [miniray.get(half_gpu.remote(), timeout=30) for _ in range(2)]
    assert not {pid for pid, _cvd in runs} & cpu_pids
    assert {cvd for _pid, cvd in runs} == {"0"}


def test_a_cpu_task_never_runs_in_a_worker_that_ran_a_gpu_task(ray_start):
    """A worker kept after GPU tasks (``max_calls=0``) never runs a CPU task, so no device
    setting or CUDA state leaks into it (compared with Ray 2.60: the pids differ there too)."""
    ray_start(num_cpus=2, num_gpus=1)
    cpu = miniray.remote(_pid_and_cvd)
    gpu = miniray.remote(num_gpus=1, max_calls=0)(_pid_and_cvd)

    gpu_pids = {miniray.get(gpu.remote(), timeout=30)[0] for _ in range(2)}
    miniray.available_resources()  # the GPU lease goes back: its worker waits in the pool
    runs = [miniray.get(cpu.remote(), timeout=30) for _ in range(3)]
    assert not {pid for pid, _cvd in runs} & gpu_pids
    assert {cvd for _pid, cvd in runs} == {None}


def test_at_the_cap_an_idle_cpu_worker_retires_for_a_gpu_task(ray_start, monkeypatch,
                                                              tmp_path):
    """At the cap on workers with only CPU workers idle, a GPU task still runs, in a worker
    of its own (one idle CPU worker retires to make room)."""
    monkeypatch.setenv("MINIRAY_MAX_WORKERS", "2")
    ray_start(num_cpus=2, num_gpus=1)

    @miniray.remote
    def cpu(folder):
        meet(folder, 2)  # both at once: two workers
        return os.getpid()

    gpu = miniray.remote(num_gpus=1, max_calls=0)(_pid_and_cvd)
    folder = _meeting(tmp_path, "meet")
    cpu_pids = set(miniray.get([cpu.remote(folder), cpu.remote(folder)], timeout=30))
    assert len(cpu_pids) == 2
    miniray.available_resources()  # both leases go back: two idle CPU workers, at the cap
    pid, cvd = miniray.get(gpu.remote(), timeout=30)
    assert pid not in cpu_pids and cvd == "0"


def test_fractional_gpus_pack_one_device_before_the_next(ray_start, tmp_path):
    ray_start(num_cpus=4, num_gpus=2)

    @miniray.remote(num_gpus=0.5)
    def which(folder):
        meet(folder, 4)  # all four hold their share at once
        return miniray.get_gpu_ids()

    folder = _meeting(tmp_path, "meet")
    ids = sorted(i for got in miniray.get([which.remote(folder) for _ in range(4)], timeout=90)
                 for i in got)
    assert ids == [0, 0, 1, 1]


def test_gpu_and_neuron_cores_in_one_request_are_refused(ray_start):
    ray_start(num_cpus=1)
    with pytest.raises(ValueError, match="Only one of 'num_gpus'"):
        miniray.remote(num_gpus=1, resources={"neuron_cores": 1})(lambda: 1)


# ---------------------------------------------------------- the host-wide GPU ledger
HOLDER = """
    import json, os, sys, time, miniray as ray
    ray.init(num_cpus=2)
    @ray.remote(num_gpus=2)
    def hold(seconds, gate):  # until the time is up or the test opens the gate
        print(json.dumps({"task_started": time.time()}), flush=True)
        end = time.time() + seconds
        while time.time() < end and not (gate and os.path.exists(gate)):
            time.sleep(0.01)
        return time.time()
    ref = hold.remote(HOLD_S, os.environ.get("HOLD_GATE"))
    rt = ray._private.runtime.current()
    deadline = time.time() + 20
    while len(rt.pids()) < 2 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the task is running and holds both GPUs
    # One write a line: the I/O thread may forward the task's line between print()'s text
    # and its newline.
    sys.stdout.write(json.dumps({"pids": rt.pids(), "session": rt.session_dir}) + "\\n")
    sys.stdout.write(json.dumps({"finished": ray.get(ref)}) + "\\n")
    ray.shutdown()
"""

WANTER = """
    import json, os, time, miniray as ray
    ray.init(num_cpus=2)
    @ray.remote(num_gpus=2)
    def want():
        return time.time()
    try:
        print(json.dumps({"started": ray.get(want.remote(), timeout=30)}), flush=True)
    except Exception as error:
        print(json.dumps({"error": type(error).__name__, "text": str(error)}), flush=True)
    ray.shutdown()
"""


def test_two_sessions_do_not_both_get_the_same_physical_gpus(tmp_path, fake_pynvml):
    # The holder keeps the GPUs until the wanter says it waits for them (a 2 s hold, as
    # before, was over before a loaded machine had started the wanter).
    gate = str(tmp_path / "let-go")
    holder = _start(HOLDER.replace("HOLD_S", "60.0"),
                    _env(tmp_path, "a", fake_pynvml, HOLD_GATE=gate))
    wanter = None
    try:
        task_started = _read_json_key(holder, "task_started")
        _read_json_key(holder, "pids")  # once the task runs
        wanter = _start(WANTER, _env(tmp_path, "b", fake_pynvml))
        said = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = wanter.stderr.readline()
            said.append(line)
            if not line or "other miniray sessions on this host hold" in line:
                break
        open(gate, "w").close()
        finished = _read_json_key(holder, "finished")
        assert holder.wait(30) == 0
        out, err = wanter.communicate(timeout=60)
    finally:
        holder.kill()
        if wanter is not None:
            wanter.kill()
    err = "".join(said) + err
    assert wanter.returncode == 0, err
    started = json.loads(out.splitlines()[-1])["started"]
    assert started >= finished - 0.05, "the second session ran while the first held the GPUs"
    assert task_started < finished
    assert "other miniray sessions on this host hold" in err
    assert "pid" in err


def test_a_session_can_fail_fast_instead_of_waiting(tmp_path, fake_pynvml):
    holder = _start(HOLDER.replace("HOLD_S", "60.0"), _env(tmp_path, "a", fake_pynvml))
    try:
        _read_json_key(holder, "task_started")
        _read_json_key(holder, "pids")
        began = time.monotonic()
        wanter = _run(WANTER, _env(tmp_path, "b", fake_pynvml, MINIRAY_HOST_GPU_TIMEOUT="0.5"))
        waited = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait(10)
    assert wanter.returncode == 0, wanter.stderr
    result = json.loads(wanter.stdout.splitlines()[-1])
    assert result["error"] == "TaskUnschedulableError", result
    assert "MINIRAY_HOST_GPU_TIMEOUT" in result["text"]
    assert waited < 30  # well before the holder's 60 s: it did not wait for the GPUs


def test_leases_of_a_session_killed_with_sigkill_come_back(tmp_path, fake_pynvml):
    holder = _start(HOLDER.replace("HOLD_S", "60.0"), _env(tmp_path, "a", fake_pynvml))
    try:
        _read_json_key(holder, "task_started")
        pids = _read_json_key(holder, "pids")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert _wait_dead(pids) == [], "the killed session's processes outlived it"
        began = time.monotonic()
        wanter = _run(WANTER, _env(tmp_path, "b", fake_pynvml))
    finally:
        holder.kill()
    assert wanter.returncode == 0, wanter.stderr
    assert "started" in json.loads(wanter.stdout.splitlines()[-1])
    assert time.monotonic() - began < 20
    ledger = json.loads((tmp_path / "host" / "gpus.json").read_text())
    assert not ledger.get("leases"), "leases were left in the host ledger"


def test_logical_gpus_beyond_the_physical_ones_stay_per_session(tmp_path, fake_pynvml):
    one = "Tesla V100-SXM2-16GB|GPU-aaaa0000"
    code = """
        import json, os, miniray as ray
        ray.init(num_cpus=3, num_gpus=3)
        @ray.remote(num_gpus=1)
        def which(folder):
            meet(folder, 3)  # all three at once: one logical GPU each
            return ray.get_gpu_ids()
        folder = os.environ["MEET_DIR"]
        print(json.dumps(sorted(i for ids in ray.get([which.remote(folder) for _ in range(3)])
                                for i in ids)))
        ray.shutdown()
    """
    proc = _run(MEET + code, _env(tmp_path, "a", fake_pynvml, devices=one,
                           MEET_DIR=_meeting(tmp_path, "meet")))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, 1, 2]


DEAD_SHARE = """
    import os
    from miniray._private.ledger.gpu_detect import detect_gpus
    from miniray._private.ledger.host_gpus import HostGpuLedger
    key = detect_gpus(cuda_visible_devices=None).device_keys[0]
    HostGpuLedger().acquire_fraction([key], 5000, holder_pid=os.getpid(), tag="dead session")
    os._exit(0)  # dies holding half of device 0, as a killed session would
"""

PACKING = """
    import miniray as ray
    ray.init(num_cpus=3, num_gpus=3)
    @ray.remote(num_gpus=0.5)
    class Share:
        def ids(self):
            return ray.get_gpu_ids()
    actors = [Share.remote() for _ in range(3)]
    print([ray.get(actor.ids.remote()) for actor in actors])
    ray.shutdown()
"""


def test_a_dead_sessions_share_is_reclaimed_before_it_breaks_packing(tmp_path, fake_pynvml):
    # One physical device and two logical ones: a dead session's half of device 0 must not
    # push the second fraction onto logical GPU 1 (it fits there, so no fit ever failed).
    env = _env(tmp_path, "a", fake_pynvml, devices="Tesla V100-SXM2-16GB|GPU-aaaa0000")
    dead = _run(DEAD_SHARE, env)
    assert dead.returncode == 0, dead.stderr
    assert '"dead session"' in (tmp_path / "host" / "gpus.json").read_text()
    run = _run(PACKING, env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[[0], [0], [1]]", run.stdout
    assert '"dead session"' not in (tmp_path / "host" / "gpus.json").read_text()
