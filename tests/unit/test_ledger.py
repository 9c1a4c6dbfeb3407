"""The file-locked ledger: transactions, atomic files, dead holders, several processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from miniray._private.core.resources import UNIT
from miniray._private.host import procinfo
from miniray._private.ledger.ledger import Ledger

REPO_ROOT = Path(__file__).resolve().parents[2]
ME = os.getpid()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "ledger.json")


def make(path, cpu=2, gpu=0, ids=None, **custom) -> Ledger:
    totals = {"CPU": cpu, **custom}
    instance_ids = {}
    if gpu:
        totals["GPU"] = gpu
        instance_ids["GPU"] = ids or [str(i) for i in range(gpu)]
    return Ledger.create(path, totals, instance_ids)


def read_file(path) -> dict:
    with open(path) as f:
        return json.load(f)


def spawn_waiting_child() -> subprocess.Popen:
    """A child that lives until its stdin is closed."""
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )


def test_create_acquire_release(path):
    led = make(path, cpu=2, gpu=2, ids=["3", "5"])
    assert led.totals() == {"CPU": 2.0, "GPU": 2.0}
    a = led.acquire({"CPU": 1, "GPU": 0.5}, holder_pid=ME, worker_pid=123, tag="f")
    b = led.acquire({"CPU": 1, "GPU": 1}, holder_pid=ME)
    assert a is not None and b is not None
    assert (a.holder_pid, a.worker_pid, a.tag) == (ME, 123, "f")
    assert a.holder_start == procinfo.start_time(ME)
    assert a.resources == {"CPU": UNIT, "GPU": UNIT // 2}
    assert led.instance_ids_of(a) == ["3"] and led.instance_ids_of(b) == ["5"]
    assert led.instance_ids_of(a, "TPU") == []
    assert led.acquire({"CPU": 1}, holder_pid=ME) is None
    assert led.available() == {"GPU": 0.5}
    assert led.release(a.lease_id) is True
    assert led.release(a.lease_id) is False  # idempotent
    assert led.release("no-such-lease") is False
    assert led.available() == {"CPU": 1.0, "GPU": 1.0}
    c = led.acquire({"CPU": 1}, holder_pid=ME)
    assert led.release_many([b.lease_id, c.lease_id, "nope"]) == 2
    assert led.release_many([]) == 0
    assert led.snapshot().leases == {}
    assert led.available() == {"CPU": 2.0, "GPU": 2.0}


def test_returned_lease_is_the_callers_copy(path):
    led = make(path, cpu=2)
    lease = led.acquire({"CPU": 1}, holder_pid=ME)
    lease.resources["CPU"] = 0  # must not leak into the ledger or its cache
    assert led.acquire({"CPU": 1}, holder_pid=ME) is not None
    assert led.acquire({"CPU": 1}, holder_pid=ME) is None


def test_create_validates(path, tmp_path):
    with pytest.raises(ValueError, match="instance ids"):
        Ledger.create(path, {"CPU": 1, "GPU": 2}, {"GPU": ["0"]})
    with pytest.raises(ValueError, match="whole"):
        Ledger.create(path, {"GPU": 0.5}, {})
    with pytest.raises(ValueError, match="duplicate"):
        Ledger.create(path, {"GPU": 2}, {"GPU": ["1", "1"]})
    with pytest.raises(ValueError, match="no total"):
        Ledger.create(path, {"CPU": 1}, {"GPU": ["0"]})
    with pytest.raises(ValueError):
        Ledger.create(path, {"CPU": -1}, {})
    assert not os.path.exists(path)
    led = Ledger.create(path, {"CPU": 1, "GPU": 2, "neuron_cores": 2}, {})  # default ids
    assert led.snapshot().instance_ids == {"GPU": ["0", "1"], "neuron_cores": ["0", "1"]}
    with pytest.raises(FileExistsError):
        Ledger.create(path, {"CPU": 1}, {})
    with pytest.raises(FileNotFoundError, match="no resource ledger"):
        Ledger(str(tmp_path / "missing.json"))


def test_available_omits_zero_and_clamps(path):
    led = make(path, cpu=2, custom=1)
    lease = led.acquire({"CPU": 2, "custom": 1}, holder_pid=ME)
    assert "CPU" not in led.available() and "custom" not in led.available()
    led.adjust(lease.lease_id, {"CPU": 1})  # oversubscribed: -1 available
    assert "CPU" not in led.available()
    assert led.snapshot().available()["CPU"] == -UNIT


def test_file_is_replaced_atomically(path, tmp_path):
    led = make(path, cpu=4, gpu=1)
    leases = [led.acquire({"CPU": 1, "GPU": 0.25}, holder_pid=ME) for _ in range(4)]
    led.adjust(leases[0].lease_id, {"CPU": -1})
    led.set_worker(leases[1].lease_id, 42)
    led.release(leases[2].lease_id)
    assert sorted(os.listdir(tmp_path)) == ["ledger.json", "ledger.json.lock"]
    doc = read_file(path)
    assert set(doc["leases"]) == {leases[0].lease_id, leases[1].lease_id, leases[3].lease_id}
    assert doc["leases"][leases[1].lease_id]["worker_pid"] == 42


def test_adjust_gives_back_and_oversubscribes(path):
    led = make(path, cpu=1, gpu=1)
    lease = led.acquire({"CPU": 1, "GPU": 1}, holder_pid=ME)
    led.adjust(lease.lease_id, {"CPU": -1})  # blocked in get(): CPU back to the pool
    assert led.available() == {"CPU": 1.0}
    assert "CPU" not in led.snapshot().leases[lease.lease_id].resources
    other = led.acquire({"CPU": 1}, holder_pid=ME)
    assert other is not None
    led.adjust(lease.lease_id, {"CPU": 1})  # resumes: always succeeds, oversubscribing
    assert led.snapshot().available()["CPU"] == -UNIT
    assert led.acquire({"CPU": 0.5}, holder_pid=ME) is None
    led.adjust(lease.lease_id, {"CPU": 0})  # no-op
    with pytest.raises(ValueError, match="GPU"):
        led.adjust(lease.lease_id, {"GPU": -1})
    with pytest.raises(ValueError, match="give back"):
        led.adjust(lease.lease_id, {"CPU": -2})
    with pytest.raises(KeyError):
        led.adjust("nope", {"CPU": 1})
    with pytest.raises(KeyError):
        led.set_worker("nope", 1)
    assert led.snapshot().leases[lease.lease_id].resources["CPU"] == UNIT  # unchanged


def test_dead_holder_is_reclaimed_when_short(path):
    led = make(path, cpu=2, gpu=1)
    child = spawn_waiting_child()
    try:
        lease = led.acquire({"CPU": 2, "GPU": 1}, holder_pid=child.pid, tag="child's")
        assert lease is not None and lease.holder_start == procinfo.start_time(child.pid)
        assert led.acquire({"CPU": 1}, holder_pid=ME) is None  # holder alive: nothing reclaimed
        assert led.reclaim_dead() == []
    finally:
        child.stdin.close()
        child.wait()
    assert not procinfo.is_alive(child.pid, lease.holder_start)
    mine = led.acquire({"CPU": 1, "GPU": 1}, holder_pid=ME)
    assert mine is not None and led.instance_ids_of(mine) == ["0"]
    assert lease.lease_id not in led.snapshot().leases
    assert led.statistics()["holders"] == [ME]


def test_reclaim_dead_and_reused_pid(path):
    led = make(path, cpu=4)
    child = spawn_waiting_child()
    gone = led.acquire({"CPU": 1}, holder_pid=child.pid)
    child.stdin.close()
    child.wait()
    # A live pid whose start time does not match the lease's: the pid was reused.
    reused = led.acquire({"CPU": 1}, holder_pid=ME, tag="reused")
    mine = led.acquire({"CPU": 1}, holder_pid=ME, tag="mine")
    doc = read_file(path)
    doc["leases"][reused.lease_id]["holder_start"] = reused.holder_start - 1
    doc.pop("writer")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)
    assert not procinfo.is_alive(ME, reused.holder_start - 1)
    fresh = Ledger(path)
    dead = fresh.reclaim_dead()
    assert sorted(lease.lease_id for lease in dead) == sorted([gone.lease_id, reused.lease_id])
    assert list(fresh.snapshot().leases) == [mine.lease_id]
    assert led.available() == {"CPU": 3.0}  # the first instance sees it too


def test_release_holder(path):
    led = make(path, cpu=4)
    for _ in range(3):
        led.acquire({"CPU": 1}, holder_pid=ME)
    other = led.acquire({"CPU": 1}, holder_pid=1, tag="init holds this")
    assert led.release_holder(ME) == 3
    assert led.release_holder(ME) == 0
    assert list(led.snapshot().leases) == [other.lease_id]


def test_two_instances_see_the_same_truth(path):
    a = make(path, cpu=2, gpu=1)
    b = Ledger(path)
    la = a.acquire({"CPU": 1, "GPU": 0.5}, holder_pid=ME)
    assert la.lease_id in b.snapshot().leases
    lb = b.acquire({"CPU": 1, "GPU": 0.5}, holder_pid=ME)
    assert a.instance_ids_of(lb) == ["0"]
    # a's cached parse is stale now; it must not double-book.
    assert a.acquire({"CPU": 1}, holder_pid=ME) is None
    assert a.available() == b.available() == {}
    assert b.release(la.lease_id) and a.release(lb.lease_id)
    assert a.acquire({"CPU": 2, "GPU": 1}, holder_pid=ME) is not None
    assert b.acquire({"CPU": 0.0001}, holder_pid=ME) is None


def test_statistics_and_repr(path):
    led = make(path, cpu=2, gpu=2)
    led.acquire({"CPU": 1, "GPU": 0.5}, holder_pid=ME)
    stats = led.statistics()
    assert stats == {
        "leases": 1,
        "holders": [ME],
        "totals": {"CPU": 2.0, "GPU": 2.0},
        "available": {"CPU": 1.0, "GPU": 1.5},
        "instances": {"GPU": [0.5, 1.0]},
    }
    text = repr(led)
    assert "leases=1" in text and "ledger.json" in text


def test_threads_share_one_ledger(path):
    led = make(path, cpu=2)
    errors = []

    def hammer():
        try:
            for _ in range(200):
                lease = led.acquire({"CPU": 1}, holder_pid=ME)
                if lease is not None:
                    assert sum(led.snapshot().used().values()) <= 2 * UNIT
                    assert led.release(lease.lease_id)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert led.snapshot().leases == {}


def test_filelock_holder_excludes_ledger_writers(path):
    filelock = pytest.importorskip("filelock")
    led = make(path, cpu=2)
    done = threading.Event()

    def writer():
        led.acquire({"CPU": 1}, holder_pid=ME)
        done.set()

    with filelock.FileLock(path + ".lock"):
        t = threading.Thread(target=writer)
        t.start()
        assert not done.wait(0.3)  # blocked on the same lock
    t.join(10)
    assert done.is_set()


HAMMER = textwrap.dedent(
    """
    import json, os, sys, time
    from miniray._private.ledger.ledger import Ledger
    from miniray._private.core.resources import UNIT
    led = Ledger(sys.argv[1])
    me = os.getpid()
    got = short = 0
    deadline = time.monotonic() + 60
    while got < int(sys.argv[2]) and time.monotonic() < deadline:
        lease = led.acquire({"CPU": 1, "GPU": 0.5, "slot": 1}, holder_pid=me)
        if lease is None:
            short += 1
            continue
        got += 1
        state = led.snapshot()
        used = state.used()
        for name, total in state.totals.items():
            assert used.get(name, 0) <= total, (name, used, state.totals)
        assert all(0 <= f <= UNIT for f in state.instance_free("GPU")), state.to_json()
        if got % 3 == 0:
            led.adjust(lease.lease_id, {"CPU": -1})
            led.adjust(lease.lease_id, {"CPU": 1})
        assert led.release(lease.lease_id)
    print(json.dumps({"got": got, "short": short}))
    """
)


def test_processes_hammering_one_ledger_never_exceed_totals(path):
    make(path, cpu=2, gpu=1, slot=2)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    rounds = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, path, str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert [r["got"] for r in results] == [rounds] * 3
    mine = procinfo.children(ME)
    assert not any(p.pid in mine for p in procs)  # every child reaped
    doc = read_file(path)  # never a torn file
    assert doc["leases"] == {}
    # A process that found no room while the others held leases said so (``.wants``);
    # on a loaded machine the three may never overlap, and then none did.
    wanted = ["ledger.json.wants"] if any(r["short"] for r in results) else []
    assert sorted(os.listdir(os.path.dirname(path))) == ["ledger.json", "ledger.json.lock",
                                                         *wanted]
    assert Ledger(path).available() == {"CPU": 2.0, "GPU": 1.0, "slot": 2.0}


def test_lock_free_reader_never_sees_a_torn_file(path):
    led = make(path, cpu=64)
    stop = time.monotonic() + 0.5
    bad = []

    def reader():
        while time.monotonic() < stop:
            try:
                Ledger(path).snapshot()
            except ValueError as e:  # JSONDecodeError
                bad.append(e)

    t = threading.Thread(target=reader)
    t.start()
    while time.monotonic() < stop:
        leases = [led.acquire({"CPU": 1}, holder_pid=ME, tag="x" * 50) for _ in range(20)]
        led.release_many(lease.lease_id for lease in leases)
    t.join()
    assert bad == []


# -- procinfo, which the ledger relies on to tell a dead holder ----------------------------


def test_procinfo_helpers():
    start = procinfo.start_time(ME)
    assert isinstance(start, int) and procinfo.is_alive(ME) and procinfo.is_alive(ME, start)
    assert not procinfo.is_alive(ME, start + 1)
    pss = procinfo.pss_bytes(ME)
    assert procinfo.rss_bytes(ME) > 0 and (pss is None or pss > 0)
    # A child that runs a grandchild; both exit when our end of their stdin closes.
    script = "import subprocess, sys; subprocess.run([sys.executable, '-c', WAIT])".replace(
        "WAIT", repr("import sys; sys.stdin.read()")
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 30
    try:
        while not procinfo.children(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        (grandchild,) = procinfo.children(child.pid)
        assert child.pid in procinfo.children(ME)
        below = procinfo.descendants(ME)
        assert below.index(child.pid) < below.index(grandchild)
    finally:
        child.stdin.close()
    # Exited but not reaped yet: a zombie is not alive, yet its /proc entry is still there.
    while procinfo.is_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not procinfo.is_alive(child.pid)
    assert procinfo.start_time(child.pid) is not None
    assert procinfo.rss_bytes(child.pid) is None
    child.wait()
    assert procinfo.start_time(child.pid) is None and child.pid not in procinfo.children(ME)
    assert procinfo.start_time(0) is None and not procinfo.is_alive(-1)


def test_a_process_that_finds_no_room_held_by_others_is_seen_waiting(path):
    make(path, cpu=1)
    holder, waiter = Ledger(path), Ledger(path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lease = holder.acquire({"CPU": 1}, holder_pid=other.pid)
        assert lease is not None
        assert not holder.others_waiting(1.0)  # nobody asked yet
        # A request blocked only by its own process's leases says nothing.
        assert waiter.acquire({"CPU": 1}, holder_pid=other.pid) is None
        assert not holder.others_waiting(1.0)
        assert waiter.acquire({"CPU": 1}, holder_pid=ME) is None  # held by another process
        assert holder.others_waiting(1.0)
        assert not waiter.others_waiting(1.0)  # its own want is not another's
        time.sleep(0.05)
        assert not holder.others_waiting(0.01)  # old news
        assert holder.release(lease.lease_id)
    finally:
        other.kill()
        other.wait()


def test_a_lease_taken_ahead_of_need_that_finds_no_room_is_no_want(path):
    """``wanted=False`` (the first task's lease taken at init): its failure says nothing to
    the sessions holding idle leases, which keep them."""
    make(path, cpu=1)
    holder, early = Ledger(path), Ledger(path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lease = holder.acquire({"CPU": 1}, holder_pid=other.pid)
        assert early.acquire({"CPU": 1}, holder_pid=ME, wanted=False) is None
        assert not holder.others_waiting(1.0)
        assert early.acquire({"CPU": 1}, holder_pid=ME) is None  # a task's: a want
        assert holder.others_waiting(1.0)
        assert holder.release(lease.lease_id)
    finally:
        other.kill()
        other.wait()
