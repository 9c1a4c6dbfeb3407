"""Cluster resources, accounting of running tasks, logical GPUs, custom resources, infeasible
requests, and the ledger's leases.

Ray 2.60 behaviour: ray-api-surface.md §2.3 (defaults), §3.6 (get_gpu_ids), §3.7 (cluster
state), §6.2-6.4 (CUDA_VISIBLE_DEVICES, fractional packing), §6.6 (infeasible requests).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private import runtime

GET_TIMEOUT = 30


def _wait_for_files(paths, timeout=GET_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            pytest.fail(f"tasks did not start within {timeout} s: {paths}")
        time.sleep(0.01)


def _poll(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


# ----------------------------------------------------------------------------- totals
def test_cluster_resources_keys_and_values(ray_start):
    ray_start(num_cpus=2, num_gpus=1, resources={"custom": 3})
    totals = miniray.cluster_resources()
    assert {
        "CPU",
        "GPU",
        "memory",
        "object_store_memory",
        "node:127.0.0.1",
        "node:__internal_head__",
        "custom",
    } <= set(totals)
    assert all(isinstance(v, float) for v in totals.values())
    assert totals["CPU"] == 2.0 and totals["GPU"] == 1.0 and totals["custom"] == 3.0
    assert totals["node:127.0.0.1"] == 1.0 and totals["node:__internal_head__"] == 1.0
    assert totals["memory"] > 0 and totals["object_store_memory"] > 0
    assert miniray.available_resources() == totals


def test_no_gpu_key_without_gpus(ray_start):
    ray_start(num_cpus=2, num_gpus=0)
    assert "GPU" not in miniray.cluster_resources()
    assert "GPU" not in miniray.available_resources()


def test_object_store_memory_is_reported(ray_start):
    ray_start(num_cpus=1, object_store_memory=200 * 1024 * 1024)
    assert miniray.cluster_resources()["object_store_memory"] == 200.0 * 1024 * 1024


def test_nodes_lists_this_node(ray_start):
    ray_start(num_cpus=2, resources={"custom": 1})
    nodes = miniray.nodes()
    assert len(nodes) == 1
    node = nodes[0]
    assert node["Alive"] is True and node["alive"] is True
    assert len(node["NodeID"]) == 56
    assert node["Resources"] == miniray.cluster_resources()
    assert node["NodeManagerAddress"] == "127.0.0.1"


# ----------------------------------------------------------------------------- accounting
def test_available_resources_reflect_running_tasks(ray, tmp_path):
    @ray.remote(max_retries=0)
    def hold(path, release):
        open(path, "w").close()
        deadline = time.time() + 30
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.01)
        return "done"

    release = str(tmp_path / "release")
    started = str(tmp_path / "started")
    ref = hold.remote(started, release)
    _wait_for_files([started])
    assert ray.available_resources()["CPU"] == 1.0
    open(release, "w").close()
    assert ray.get(ref, timeout=GET_TIMEOUT) == "done"
    # Consistent immediately after get() returns: the CPU is back.
    assert ray.available_resources()["CPU"] == 2.0


def test_available_resources_omit_exhausted_resources(ray, tmp_path):
    @ray.remote(max_retries=0)
    def hold(path, release):
        open(path, "w").close()
        deadline = time.time() + 30
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.01)

    release = str(tmp_path / "release")
    started = [str(tmp_path / f"s{i}") for i in range(2)]
    refs = [hold.remote(p, release) for p in started]
    _wait_for_files(started)
    available = ray.available_resources()
    assert "CPU" not in available
    assert available["memory"] == ray.cluster_resources()["memory"]
    open(release, "w").close()
    ray.get(refs, timeout=GET_TIMEOUT)
    assert ray.available_resources()["CPU"] == 2.0


def test_available_resources_back_after_each_of_many_tasks(ray):
    @ray.remote
    def f(i):
        return i

    for i in range(20):
        assert ray.get(f.remote(i), timeout=GET_TIMEOUT) == i
        assert ray.available_resources()["CPU"] == 2.0


def test_zero_cpu_tasks_do_not_use_cpu(ray, tmp_path):
    @ray.remote(num_cpus=0, max_retries=0)
    def hold(path, release):
        open(path, "w").close()
        deadline = time.time() + 30
        while not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.01)
        return os.environ.get("OMP_NUM_THREADS")

    release = str(tmp_path / "release")
    started = [str(tmp_path / f"s{i}") for i in range(3)]
    refs = [hold.remote(p, release) for p in started]  # 3 tasks on 2 CPUs, all at once
    _wait_for_files(started)
    assert ray.available_resources()["CPU"] == 2.0
    open(release, "w").close()
    ray.get(refs, timeout=GET_TIMEOUT)


@pytest.mark.parametrize("num_cpus, expected", [(None, "1"), (1, "1"), (2, "2"), (0.5, "1")])
def test_omp_num_threads_follows_assigned_cpus(ray, num_cpus, expected):
    @ray.remote
    def omp():
        return os.environ.get("OMP_NUM_THREADS")

    f = omp if num_cpus is None else omp.options(num_cpus=num_cpus)
    assert ray.get(f.remote(), timeout=GET_TIMEOUT) == expected


def test_omp_num_threads_is_set_again_after_a_task_changed_it(ray):
    @ray.remote
    def change(value):
        before = os.environ.get("OMP_NUM_THREADS")
        if value is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = value
        return before

    # one after another: a worker's next task sees the value set for it, whatever the last
    # task left (changed, removed, or left alone)
    seen = [ray.get(change.remote(value), timeout=GET_TIMEOUT)
            for value in ("7", "7", None, "1", "1", "3")]
    assert seen == ["1"] * 6


def test_task_running_inside_task_sees_cluster_state(ray):
    @ray.remote
    def inside():
        import miniray as inner

        return inner.cluster_resources()["CPU"], inner.available_resources().get("CPU", 0.0)

    total, available = ray.get(inside.remote(), timeout=GET_TIMEOUT)
    assert total == 2.0 and available == 1.0


# ----------------------------------------------------------------------------- GPUs
def test_gpu_task_gets_one_logical_gpu(ray_start):
    ray_start(num_cpus=2, num_gpus=2)

    @miniray.remote(num_gpus=1)
    def gpu_task():
        import miniray as inner

        return inner.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    ids, cvd = miniray.get(gpu_task.remote(), timeout=GET_TIMEOUT)
    assert ids in ([0], [1])
    assert all(type(i) is int for i in ids)
    assert cvd == str(ids[0])
    assert miniray.get_gpu_ids() == []  # the driver has none
    assert miniray.available_resources()["GPU"] == 2.0


def test_two_gpu_task_gets_both(ray_start):
    ray_start(num_cpus=2, num_gpus=2)

    @miniray.remote(num_gpus=2)
    def both():
        import miniray as inner

        return sorted(inner.get_gpu_ids()), os.environ.get("CUDA_VISIBLE_DEVICES")

    ids, cvd = miniray.get(both.remote(), timeout=GET_TIMEOUT)
    assert ids == [0, 1]
    assert sorted(cvd.split(",")) == ["0", "1"]


def test_cpu_task_leaves_cuda_visible_devices_alone(ray_start):
    ray_start(num_cpus=2, num_gpus=2)

    @miniray.remote
    def cpu_task():
        import miniray as inner

        return inner.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")

    assert miniray.get(cpu_task.remote(), timeout=GET_TIMEOUT) == ([], "<unset>")


def test_fractional_gpus_pack_on_one_gpu(ray_start, tmp_path):
    ray_start(num_cpus=2, num_gpus=2)

    @miniray.remote(num_gpus=0.5, max_retries=0)
    def half(me, other):
        import miniray as inner

        open(me, "w").close()
        deadline = time.time() + 20
        while not os.path.exists(other) and time.time() < deadline:
            time.sleep(0.01)
        # Both tasks are running at this point (each waited for the other).
        return inner.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"), os.path.exists(other)

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    first, second = miniray.get([half.remote(a, b), half.remote(b, a)], timeout=GET_TIMEOUT)
    assert first[2] and second[2], "the two half-GPU tasks did not run at the same time"
    assert first[0] == second[0] and len(first[0]) == 1
    assert first[1] == second[1] == str(first[0][0])


def test_gpu_tasks_reuse_no_worker_by_default(ray_start):
    ray_start(num_cpus=2, num_gpus=1)

    @miniray.remote(num_gpus=1)
    def pid():
        return os.getpid()

    pids = [miniray.get(pid.remote(), timeout=GET_TIMEOUT) for _ in range(3)]
    assert len(set(pids)) == 3  # max_calls=1 is the default for GPU functions


# ----------------------------------------------------------------------------- nested
@pytest.mark.parametrize("num_cpus,num_gpus", [(2, 1), (2, 0.5), (1, 1)])
def test_gpu_tasks_blocked_in_get_lend_their_cpu_to_nested_tasks(ray_start, num_cpus, num_gpus):
    """Two GPU tasks (1 CPU each by default) that each wait for a nested CPU task finish:
    a task blocked in ``get()``/``wait()`` gives its CPU back while it waits (compared with
    Ray 2.60: about 0.6 s there for ``num_cpus=2, num_gpus=1``; with ``num_gpus=0.5`` both
    parents hold every CPU, with ``num_cpus=1`` one parent does)."""
    ray_start(num_cpus=num_cpus, num_gpus=1)

    @miniray.remote
    def child():
        return os.getpid()

    @miniray.remote(num_gpus=num_gpus)
    def parent(use_wait):
        ref = child.remote()
        if use_wait:
            miniray.wait([ref], timeout=GET_TIMEOUT)
        return os.getpid(), miniray.get(ref), miniray.get_gpu_ids()

    results = miniray.get([parent.remote(False), parent.remote(True)], timeout=GET_TIMEOUT)
    for parent_pid, child_pid, gpu_ids in results:
        assert gpu_ids == [0] and child_pid != parent_pid


def test_a_blocked_task_gives_back_its_cpu_only(ray_start):
    """While a task waits in ``get()``, its CPUs are free for others, its GPU share and custom
    resources are not; it takes its CPUs back when it resumes (compared with Ray 2.60, same
    figures once Ray's resource view has settled). The child may start before its parent
    blocks (it is submitted first, and a prestarted worker runs it at once), so it reads the
    view once it has settled: the CPUs come back, the GPU share and ``R`` never do."""
    ray_start(num_cpus=4, num_gpus=1, resources={"R": 2})

    @miniray.remote(num_cpus=0)
    def seen():
        deadline = time.monotonic() + 10
        while True:
            available = miniray.available_resources()
            view = {name: available.get(name, 0.0) for name in ("CPU", "GPU", "R")}
            if view["CPU"] == 4.0 or time.monotonic() > deadline:
                return view
            time.sleep(0.01)

    @miniray.remote(num_cpus=2, num_gpus=0.5, resources={"R": 1})
    def parent():
        while_blocked = miniray.get(seen.remote())
        return while_blocked, miniray.get_runtime_context().get_assigned_resources()

    while_blocked, assigned = miniray.get(parent.remote(), timeout=GET_TIMEOUT)
    assert while_blocked == {"CPU": 4.0, "GPU": 0.5, "R": 1.0}
    assert assigned["CPU"] == 2.0
    totals = {"CPU": 4.0, "GPU": 1.0, "R": 2.0}
    assert _poll(lambda: {k: miniray.available_resources().get(k) for k in totals} == totals)


def test_work_of_every_shape_runs_on_the_cpu_of_blocked_tasks(ray_start, tmp_path):
    """Two tasks hold both CPUs and block in ``get()``: a GPU task, a CPU task and an actor
    submitted then all run before the blocked tasks resume (compared with Ray 2.60)."""
    ray_start(num_cpus=2, num_gpus=1)
    gate = str(tmp_path / "gate")

    @miniray.remote(num_cpus=0, max_retries=0)
    def held(started):
        open(started, "w").close()
        deadline = time.time() + GET_TIMEOUT
        while not os.path.exists(gate) and time.time() < deadline:
            time.sleep(0.01)
        return os.path.exists(gate)

    @miniray.remote(max_retries=0)
    def parent(started):
        return miniray.get(held.remote(started))

    @miniray.remote(num_gpus=1)
    def gpu_task():
        return miniray.get_gpu_ids()

    @miniray.remote
    def cpu_task():
        return "cpu"

    @miniray.remote(num_cpus=1)
    class Actor:
        def ping(self):
            return "actor"

    started = [str(tmp_path / "a"), str(tmp_path / "b")]
    parents = [parent.remote(path) for path in started]
    try:
        _wait_for_files(started)
        actor = Actor.remote()
        assert miniray.get([gpu_task.remote(), cpu_task.remote(), actor.ping.remote()],
                           timeout=GET_TIMEOUT) == [[0], "cpu", "actor"]
        assert not miniray.wait(parents, timeout=0)[0]  # still blocked meanwhile
    finally:
        open(gate, "w").close()
    assert miniray.get(parents, timeout=GET_TIMEOUT) == [True, True]


def test_an_actor_waiting_for_the_gpu_does_not_hold_back_a_cpu_actor(ray_start, tmp_path):
    """A GPU task creates a CPU actor and waits on it while a GPU actor created before waits
    for the task's GPU: the CPU actor is placed first, on the CPU the blocked task gave back,
    and the GPU actor once the task is done (compared with Ray 2.60: about 1 s there; a
    placement queue served strictly in order deadlocked)."""
    ray_start(num_cpus=2, num_gpus=1)
    started, go = str(tmp_path / "started"), str(tmp_path / "go")

    @miniray.remote(num_gpus=1)
    class GpuActor:
        def ping(self):
            return miniray.get_gpu_ids()

    @miniray.remote(num_cpus=1)
    class CpuActor:
        def ping(self):
            return "cpu"

    @miniray.remote(num_gpus=1, max_retries=0)
    def parent():
        open(started, "w").close()
        deadline = time.time() + GET_TIMEOUT
        while not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.01)
        return miniray.get(CpuActor.remote().ping.remote())

    task = parent.remote()
    _wait_for_files([started])
    gpu_actor = GpuActor.remote()  # waits for the GPU the task holds
    open(go, "w").close()
    assert miniray.get(task, timeout=GET_TIMEOUT) == "cpu"
    assert miniray.get(gpu_actor.ping.remote(), timeout=GET_TIMEOUT) == [0]


# ----------------------------------------------------------------------------- custom
def test_custom_resource_gates_concurrency(ray_start, tmp_path):
    ray_start(num_cpus=2, resources={"r": 1})

    @miniray.remote(resources={"r": 1}, max_retries=0)
    def span():
        start = time.monotonic()
        time.sleep(0.3)
        return start, time.monotonic()

    (s1, e1), (s2, e2) = miniray.get([span.remote(), span.remote()], timeout=GET_TIMEOUT)
    assert e1 <= s2 or e2 <= s1, "two tasks needing r:1 ran at the same time"


def test_fractional_custom_resource_allows_two(ray_start, tmp_path):
    ray_start(num_cpus=2, resources={"r": 1})

    @miniray.remote(resources={"r": 0.5}, max_retries=0)
    def meet(me, other):
        open(me, "w").close()
        deadline = time.time() + 20
        while not os.path.exists(other) and time.time() < deadline:
            time.sleep(0.01)
        return os.path.exists(other)

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert miniray.get([meet.remote(a, b), meet.remote(b, a)], timeout=GET_TIMEOUT) == [True, True]


# ----------------------------------------------------------------------------- infeasible
@pytest.mark.parametrize(
    "init_kwargs, options, texts",
    [
        ({"num_cpus": 2, "num_gpus": 2}, {"num_gpus": 3}, ["GPU", "3", "2"]),
        ({"num_cpus": 2}, {"resources": {"missing": 1}}, ["missing", "1"]),
        ({"num_cpus": 2}, {"num_cpus": 4}, ["CPU", "4", "2"]),
    ],
    ids=["too-many-gpus", "missing-custom", "too-many-cpus"],
)
def test_infeasible_request_warns_and_stays_pending(ray_start, capfd, init_kwargs, options, texts):
    ray_start(**init_kwargs)

    @miniray.remote
    def f():
        return 1

    capfd.readouterr()
    ref = f.options(**options).remote()
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for text in texts:
        assert text in lines[0], lines[0]
    start = time.monotonic()
    assert miniray.wait([ref], timeout=1) == ([], [ref])
    # It waited its timeout and then returned (the upper bound only catches a wait that
    # ignores it: a loaded runner may take seconds more to wake this thread).
    assert 0.9 <= time.monotonic() - start < GET_TIMEOUT
    # Feasible work still runs.
    assert miniray.get(f.remote(), timeout=GET_TIMEOUT) == 1
    miniray.cancel(ref)
    with pytest.raises(exceptions.TaskCancelledError):
        miniray.get(ref, timeout=GET_TIMEOUT)


def test_infeasible_warning_is_printed_once_per_shape(ray_start, capfd):
    ray_start(num_cpus=2)

    @miniray.remote(resources={"missing": 1})
    def f():
        return 1

    capfd.readouterr()
    refs = [f.remote() for _ in range(3)]
    err = capfd.readouterr().err
    assert len([line for line in err.splitlines() if "missing" in line]) == 1
    for ref in refs:
        miniray.cancel(ref)


# ----------------------------------------------------------------------------- leases
def test_ledger_holds_no_lease_once_tasks_are_done(ray):
    from miniray._private import runtime

    @ray.remote
    def f(i):
        return i

    @ray.remote(num_cpus=0.5)
    def g(i):
        return -i

    assert ray.get([f.remote(i) for i in range(10)] + [g.remote(1)], timeout=GET_TIMEOUT) == (
        list(range(10)) + [-1]
    )
    rt = runtime.current()
    available = ray.available_resources()  # returns idle leases first
    assert available["CPU"] == 2.0
    stats = rt.ledger.statistics()
    assert stats["leases"] == 0, stats
    assert stats["holders"] == []
    assert stats["available"] == stats["totals"]
    owner = rt.owner.statistics()
    assert owner["leases"] == 0 and owner["tasks_pending"] == 0 and owner["queued"] == 0


def test_idle_leases_are_returned_without_asking(ray):
    from miniray._private import runtime

    @ray.remote
    def f():
        return 1

    ray.get(f.remote(), timeout=GET_TIMEOUT)
    ledger = runtime.current().ledger
    # Without calling available_resources(): the owner returns an idle lease by itself soon.
    assert _poll(lambda: ledger.statistics()["leases"] == 0, timeout=2.0), ledger.statistics()


def test_leases_of_crashed_and_cancelled_tasks_are_returned(ray, tmp_path):
    from miniray._private import runtime

    @ray.remote(max_retries=0)
    def crash():
        os._exit(2)

    @ray.remote(max_retries=0)
    def sleep(path):
        open(path, "w").close()
        time.sleep(30)

    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(crash.remote(), timeout=GET_TIMEOUT)
    marker = str(tmp_path / "started")
    ref = sleep.remote(marker)
    _wait_for_files([marker])
    ray.cancel(ref, force=True)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=GET_TIMEOUT)
    ledger = runtime.current().ledger
    assert _poll(lambda: ray.available_resources().get("CPU") == 2.0)
    assert ledger.statistics()["leases"] == 0


def test_a_request_held_back_by_a_failure_marked_with_nothing_queued_is_retried(ray):
    """A lease request that failed when nothing was queued any more (its task was cancelled
    meanwhile) leaves the retry window closed with no retry scheduled; a task submitted next,
    of a shape the window holds back, must still be tried again once the window has passed
    (other processes may have released resources), not wait for an unrelated event."""
    import time as _time

    from miniray._private import runtime

    owner = runtime.current().owner

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote(), timeout=30) == 1
    ray.available_resources()  # the idle lease goes back: no later release wakes anyone
    with owner.locked():
        assert not owner.tasks.queues
        owner.leases.window.mark_full(_time.monotonic(), {"CPU": 1})
    assert ray.get(one.remote(), timeout=10) == 1


# Nested work: about this many workers per CPU at most (README, "What works"). An aim of
# the scheduler, not a hard cap: a cap on processes could deadlock gets that wait for
# children no worker is left to run (Ray starts as many as it takes). Three levels of
# nesting (test_deeper_nesting_stays_within_the_bound) peak at 11-17 workers on 2 CPUs here
# (17 in one run of thirty, before and after this session's changes): ``NESTED_SLACK``.
NESTED_WORKERS_PER_CPU = 8
NESTED_SLACK = 2


def _peak_workers(run) -> tuple:
    """``run()``'s result and the most workers alive at once while it ran."""
    owner = runtime.current().owner
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], owner.workers.live)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, name="test-watch", daemon=True)
    watcher.start()
    try:
        return run(), peak[0]
    finally:
        done.set()
        watcher.join(timeout=5)


def test_nested_work_starts_a_bounded_number_of_workers(ray_start):
    """50 parents that each submit 10 children and get them, on 2 CPUs: children are
    dispatched before parents not yet started (``scheduling.queue_index``), so they run on
    the CPUs their blocked parents gave back instead of a new worker per parent. Compared
    with Ray 2.60 (6 ``ray::`` worker processes at the peak in one run, 2.0 s) and miniray
    with one FIFO queue (50-52: every parent started, blocked, and the children needed
    workers beside them); now 9-12, in 0.25 s."""
    ray_start(num_cpus=2)

    @miniray.remote
    def child(i):
        return i

    @miniray.remote
    def parent(j):
        return sum(miniray.get([child.remote(i) for i in range(10)], timeout=GET_TIMEOUT))

    results, peak = _peak_workers(
        lambda: miniray.get([parent.remote(j) for j in range(50)], timeout=GET_TIMEOUT))
    assert results == [45] * 50
    assert 2 <= peak <= 2 * NESTED_WORKERS_PER_CPU, peak


def test_deeper_nesting_stays_within_the_bound(ray_start):
    """Three levels under 8 top-level tasks (a recursive count): each level's tasks wait
    on the next one's, and the deepest run first."""
    ray_start(num_cpus=2)

    @miniray.remote
    def total(depth, width):
        if depth == 0:
            return 1
        return sum(miniray.get([total.remote(depth - 1, width) for _ in range(width)],
                               timeout=GET_TIMEOUT))

    results, peak = _peak_workers(
        lambda: miniray.get([total.remote(2, 4) for _ in range(8)], timeout=GET_TIMEOUT))
    assert results == [16] * 8
    assert peak <= 2 * NESTED_WORKERS_PER_CPU + NESTED_SLACK, peak


def test_a_get_of_ready_objects_in_tasks_starts_no_extra_worker(ray_start):
    """Ray's test_release_resources_race (the same script run under Ray 2.60: 2 workers):
    a task whose get() finds its objects ready gives no CPU back, so no third worker is
    started for 2 CPUs. miniray blocked the worker for every get, and started one."""
    ray_start(num_cpus=2)
    refs = [miniray.put(bytearray(200 * 1024)) for _ in range(10)]

    @miniray.remote
    def consume(refs):
        miniray.get(refs)
        return os.getpid()

    pids = miniray.get([consume.remote(refs) for _ in range(300)], timeout=60)
    assert len(set(pids)) <= 2, len(set(pids))
