"""The host-wide GPU ledger: pure packing decisions, two sessions on one directory, dead holders
(SIGKILL, zombie, reused pid, earlier boot, other pid namespace), waiting with a bound, files
(atomic, no temp files, corruption), and three processes hammering one ledger."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import miniray
from miniray._private.core.resources import UNIT
from miniray._private.host import procinfo
from miniray._private.host.same_uid import InsecurePathError
from miniray._private.ledger.host_gpus import (
    HOST_DIR_ENV,
    HostGpuLease,
    HostGpuLedger,
    _ensure_private_dir,
    _Identity,
    default_host_dir,
    exact_fits,
    free_units,
    holder_alive,
    plan_shares,
    used_units,
)

ME = os.getpid()
HALF, QUARTER = UNIT // 2, UNIT // 4
MINIRAY_PARENT = str(Path(miniray.__file__).resolve().parents[1])
KEYS = ["GPU-a", "GPU-b"]


def lease(shares, pid=ME, start=None, **kw) -> HostGpuLease:
    return HostGpuLease(os.urandom(4).hex(), pid, start, dict(shares), **kw)


def table(*leases) -> dict:
    return {le.lease_id: le for le in leases}


@pytest.fixture
def hostdir(tmp_path) -> str:
    return str(tmp_path / "host")


@pytest.fixture
def sessions(hostdir):
    """Two handles on one directory: two independent sessions on one host."""
    a, b = HostGpuLedger(hostdir), HostGpuLedger(hostdir)
    yield a, b
    a.close()
    b.close()


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"])


def kill_and_reap(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# ------------------------------------------------------------------ pure decisions


def test_fractions_fill_one_device_before_the_next():
    leases = {}
    got = []
    for _ in range(4):
        shares = plan_shares(leases, KEYS, HALF)
        got.append(list(shares))
        new = lease(shares)
        leases[new.lease_id] = new
    assert got == [["GPU-a"], ["GPU-a"], ["GPU-b"], ["GPU-b"]]
    assert plan_shares(leases, KEYS, QUARTER) is None


def test_three_half_gpu_requests_on_three_devices():
    keys = ["GPU-0", "GPU-1", "GPU-2"]
    leases: dict = {}
    picks = []
    for _ in range(3):
        shares = plan_shares(leases, keys, HALF)
        picks.append(next(iter(shares)))
        new = lease(shares)
        leases[new.lease_id] = new
    assert picks == ["GPU-0", "GPU-0", "GPU-1"]


def test_best_fit_takes_the_fullest_device_that_still_fits():
    leases = table(lease({"GPU-a": 3 * QUARTER}), lease({"GPU-b": HALF}))
    assert plan_shares(leases, KEYS, QUARTER) == {"GPU-a": QUARTER}
    assert plan_shares(leases, KEYS, 3000) == {"GPU-b": 3000}
    assert plan_shares(leases, ["GPU-b", "GPU-a", "GPU-c"], 6000) == {"GPU-c": 6000}


def test_whole_devices_are_completely_free_ones_in_caller_order():
    leases = table(lease({"GPU-a": 1}))  # the smallest share makes a device not whole
    keys = ["GPU-c", "GPU-a", "GPU-b"]
    assert plan_shares(leases, keys, 2 * UNIT) == {"GPU-c": UNIT, "GPU-b": UNIT}
    assert plan_shares(leases, keys, 3 * UNIT) is None
    assert plan_shares({}, keys, UNIT) == {"GPU-c": UNIT}


@pytest.mark.parametrize(
    "keys, units, match",
    [
        (KEYS, 0, "positive"),
        (KEYS, -1, "positive"),
        (KEYS, 0.5, "positive"),
        (KEYS, 15000, "fraction"),
        (KEYS, 3 * UNIT, "never be satisfied"),
        ([], QUARTER, "never be satisfied"),
        (["GPU-a", "GPU-a"], QUARTER, "duplicate"),
    ],
)
def test_plan_rejects_bad_requests(keys, units, match):
    with pytest.raises(ValueError, match=match):
        plan_shares({}, keys, units)


def test_used_and_free_units():
    leases = table(lease({"GPU-a": HALF, "GPU-b": UNIT}), lease({"GPU-a": QUARTER}))
    assert used_units(leases) == {"GPU-a": 3 * QUARTER, "GPU-b": UNIT}
    assert free_units(leases, ["GPU-b", "GPU-a", "GPU-z"]) == [0, QUARTER, UNIT]
    # A file damaged from outside may over-assign; free never goes below 0.
    assert free_units(table(lease({"GPU-a": UNIT}), lease({"GPU-a": UNIT})), ["GPU-a"]) == [0]


def test_exact_fits():
    leases = table(lease({"GPU-a": HALF}))
    assert exact_fits(leases, {"GPU-a": HALF, "GPU-b": UNIT})
    assert not exact_fits(leases, {"GPU-a": HALF + 1})
    with pytest.raises(ValueError):
        exact_fits(leases, {"GPU-a": UNIT + 1})


def test_holder_alive_rules():
    me = _Identity(boot_id="boot-1", pid_ns="pid:[1]")
    calls = []

    def alive(pid, start):
        calls.append((pid, start))
        return pid == 42

    mine = lease({"GPU-a": 1}, pid=42, start=7, boot_id="boot-1", pid_ns="pid:[1]")
    assert holder_alive(mine, me, alive) is True and calls == [(42, 7)]
    dead = lease({"GPU-a": 1}, pid=43, boot_id="boot-1", pid_ns="pid:[1]")
    assert holder_alive(dead, me, alive) is False
    old_boot = lease({"GPU-a": 1}, pid=42, boot_id="boot-0", pid_ns="pid:[1]")
    assert holder_alive(old_boot, me, alive) is False
    other_ns = lease({"GPU-a": 1}, pid=43, boot_id="boot-1", pid_ns="pid:[2]")
    assert holder_alive(other_ns, me, alive) is None  # cannot tell: never reclaimed
    legacy = lease({"GPU-a": 1}, pid=42)  # no identity recorded: judge by pid alone
    assert holder_alive(legacy, me, alive) is True


def test_lease_json_round_trip():
    le = lease({"GPU-a": HALF}, start=99, tag="s", pid_ns="pid:[1]", boot_id="b")
    back = HostGpuLease.from_json(le.lease_id, json.loads(json.dumps(le.to_json())))
    assert back == le


# ------------------------------------------------------------------ two sessions, one host


def test_second_session_cannot_take_the_gpus_the_first_holds(sessions):
    a, b = sessions
    got = a.acquire_whole(KEYS, 2, holder_pid=ME, tag="session-a")
    assert got is not None and got[1] == KEYS
    assert b.acquire_whole(KEYS, 2, holder_pid=ME) is None
    assert b.acquire_whole(KEYS, 1, holder_pid=ME) is None
    assert b.acquire_fraction(KEYS, QUARTER, holder_pid=ME) is None

    t0 = time.monotonic()
    assert b.wait_acquire_whole(KEYS, 2, holder_pid=ME, timeout=0.3, poll=0.02) is None
    waited = time.monotonic() - t0
    assert 0.3 <= waited < 1.0

    t0 = time.monotonic()
    assert b.wait_acquire_whole(KEYS, 2, holder_pid=ME, timeout=0) is None  # fail fast
    assert time.monotonic() - t0 < 0.2

    assert a.release(got[0]) is True
    again = b.wait_acquire_whole(KEYS, 2, holder_pid=ME, timeout=1)
    assert again is not None and again[1] == KEYS
    assert b.release(again[0])


def test_waiting_session_gets_the_gpus_when_released(sessions):
    a, b = sessions
    lease_id, _ = a.acquire_whole(KEYS, 2, holder_pid=ME)
    timer = threading.Timer(0.2, a.release, args=(lease_id,))
    timer.start()
    try:
        t0 = time.monotonic()
        got = b.wait_acquire_whole(KEYS, 2, holder_pid=ME, timeout=10, poll=0.01)
        assert got is not None and 0.15 < time.monotonic() - t0 < 5
    finally:
        timer.join()


def test_fractions_pack_across_sessions(sessions):
    a, b = sessions
    first = a.acquire_fraction(KEYS, HALF, holder_pid=ME, tag="a")
    second = b.acquire_fraction(KEYS, HALF, holder_pid=ME, tag="b")
    third = b.acquire_fraction(KEYS, HALF, holder_pid=ME, tag="b")
    assert [first[1], second[1], third[1]] == ["GPU-a", "GPU-a", "GPU-b"]
    assert a.acquire_whole(KEYS, 1, holder_pid=ME) is None  # GPU-b is no longer whole
    assert a.acquire_fraction(KEYS, HALF + 1, holder_pid=ME) is None  # never above 1.0
    assert a.free(KEYS) == {"GPU-a": 0, "GPU-b": HALF}
    a.release(second[0])
    b.acquire_fraction(KEYS, QUARTER, holder_pid=ME)  # GPU-a: 0.75 used, GPU-b: 0.5
    assert b.acquire_fraction(KEYS, QUARTER, holder_pid=ME)[1] == "GPU-a"  # best fit: fullest
    assert b.acquire_fraction(KEYS, QUARTER, holder_pid=ME)[1] == "GPU-b"


def test_generic_acquire_and_exact(sessions):
    a, b = sessions
    lid, keys = a.acquire(KEYS, QUARTER, holder_pid=ME)
    assert keys == ["GPU-a"]
    assert b.acquire(KEYS, UNIT, holder_pid=ME)[1] == ["GPU-b"]
    assert b.acquire_exact({"GPU-a": 3 * QUARTER + 1}, holder_pid=ME) is None
    exact = b.acquire_exact({"GPU-a": 3 * QUARTER}, holder_pid=ME, tag="pinned")
    assert exact is not None and a.free(KEYS) == {"GPU-a": 0, "GPU-b": 0}
    with pytest.raises(ValueError):
        a.acquire_exact({}, holder_pid=ME)
    with pytest.raises(ValueError):
        a.acquire_whole(KEYS, 0, holder_pid=ME)
    with pytest.raises(ValueError):
        a.acquire_fraction(KEYS, UNIT + 1, holder_pid=ME)
    with pytest.raises(ValueError):  # can never fit: refused instead of waiting forever
        a.wait_acquire_whole(KEYS, 3, holder_pid=ME, timeout=None)


def test_release_is_idempotent_and_release_holder(sessions):
    a, b = sessions
    child = sleeper()
    try:
        lid, _ = a.acquire_fraction(KEYS, QUARTER, holder_pid=ME)
        b.acquire_fraction(KEYS, QUARTER, holder_pid=child.pid)
        b.acquire_fraction(KEYS, QUARTER, holder_pid=child.pid)
        assert a.release(lid) is True and a.release(lid) is False
        assert a.release("no-such-lease") is False
        assert a.release_holder(child.pid) == 2 and a.release_holder(child.pid) == 0
        assert a.leases() == {}
    finally:
        kill_and_reap(child)


# ------------------------------------------------------------------ dead holders


def test_sigkilled_holder_is_reclaimed_on_the_next_acquire(sessions):
    a, b = sessions
    child = sleeper()
    got = a.acquire_whole(KEYS, 2, holder_pid=child.pid, tag="doomed")
    assert got is not None
    assert b.acquire_whole(KEYS, 2, holder_pid=ME) is None  # alive: not reclaimed
    kill_and_reap(child)
    assert not procinfo.is_alive(child.pid)
    taken = b.acquire_whole(KEYS, 2, holder_pid=ME, tag="survivor")
    assert taken is not None
    assert [le.tag for le in b.leases().values()] == ["survivor"]


def test_zombie_holder_counts_as_dead(sessions):
    a, b = sessions
    child = sleeper()
    try:
        a.acquire_fraction(KEYS, UNIT, holder_pid=child.pid)
        a.acquire_fraction(KEYS, UNIT, holder_pid=child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while procinfo.is_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # a zombie until reaped below
        dead = b.reclaim_dead()
        assert sorted(le.holder_pid for le in dead) == [child.pid, child.pid]
        assert b.reclaim_dead() == []
    finally:
        child.wait(timeout=10)


def test_reused_pid_and_earlier_boot_are_reclaimed_other_namespace_is_kept(hostdir):
    host = HostGpuLedger(hostdir)
    start = procinfo.start_time(ME)
    me = host._identity()
    stale = [
        lease({"GPU-a": UNIT}, pid=ME, start=start + 1, boot_id=me.boot_id, pid_ns=me.pid_ns),
        lease({"GPU-b": UNIT}, pid=ME, start=start, boot_id="an-earlier-boot"),
    ]
    foreign = lease({"GPU-c": UNIT}, pid=1, start=1, boot_id=me.boot_id, pid_ns="pid:[elsewhere]")
    host._write(table(*stale, foreign))
    got = host.acquire_whole(["GPU-a", "GPU-b", "GPU-c"], 2, holder_pid=ME)
    assert got is not None and got[1] == ["GPU-a", "GPU-b"]
    stats = host.statistics()
    assert stats["devices"]["GPU-c"]["holders"][0]["alive"] is None
    assert host.release_holder(1) == 0  # another namespace's pid 1 is not ours to drop
    host.close()


# ------------------------------------------------------------------ statistics and files


def test_statistics_and_repr(sessions):
    a, b = sessions
    child = sleeper()
    try:
        a.acquire_fraction(KEYS, HALF, holder_pid=ME, tag="session-a")
        b.acquire_fraction(KEYS, QUARTER, holder_pid=child.pid, tag="session-b")
        stats = a.statistics(["GPU-a", "GPU-b", "GPU-z"])
        assert stats["path"] == a.path and stats["leases"] == 2
        assert set(stats["devices"]) == {"GPU-a", "GPU-b", "GPU-z"}
        dev = stats["devices"]["GPU-a"]
        assert (dev["used"], dev["free"]) == (0.75, 0.25)
        assert [(h["pid"], h["tag"], h["fraction"], h["alive"]) for h in dev["holders"]] == [
            (ME, "session-a", 0.5, True),
            (child.pid, "session-b", 0.25, True),
        ]
        assert stats["devices"]["GPU-z"] == {"used": 0.0, "free": 1.0, "holders": []}
        assert "leases=2" in repr(a) and "'GPU-a': 0.75" in repr(a)
    finally:
        kill_and_reap(child)
    dead = a.statistics()["devices"]["GPU-a"]["holders"][1]
    assert dead["alive"] is False  # shown until reclaimed


def test_files_are_atomic_and_no_temp_files_are_left(sessions, hostdir):
    a, _ = sessions
    assert a.leases() == {}  # no file yet: empty
    lid, _ = a.acquire_whole(KEYS, 1, holder_pid=ME)
    a.release(lid)
    assert sorted(os.listdir(hostdir)) == ["gpus.json", "gpus.json.lock"]
    doc = json.loads(Path(a.path).read_text())
    assert doc == {"version": 1, "leases": {}}
    assert stat.S_IMODE(os.stat(a.path).st_mode) == 0o644


def test_corrupt_file_is_moved_aside(hostdir, caplog):
    host = HostGpuLedger(hostdir)
    Path(host.path).write_text('{"version": 1, "leases": {"x": ')
    with pytest.raises(ValueError):
        host.leases()  # lock-free readers report it
    assert host.acquire_whole(KEYS, 1, holder_pid=ME) is not None  # a writer recovers
    assert "unreadable" in caplog.text
    assert os.path.exists(host.path + ".corrupt")
    Path(host.path).write_text("")  # empty (e.g. after a crash on a disk): no leases
    assert host.leases() == {}
    host.close()


def test_newer_format_is_refused(hostdir):
    host = HostGpuLedger(hostdir)
    Path(host.path).write_text('{"version": 99, "leases": {}}')
    with pytest.raises(RuntimeError, match="newer miniray"):
        host.acquire_whole(KEYS, 1, holder_pid=ME)
    host.close()


def test_default_host_dir(monkeypatch, tmp_path):
    assert default_host_dir({HOST_DIR_ENV: str(tmp_path / "shared")}) == str(tmp_path / "shared")
    default = default_host_dir({})
    assert os.path.basename(default) == f"miniray-host-{os.getuid()}"
    # Not TMPDIR-relative: per-job TMPDIRs must not split the ledger.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert default_host_dir({}) == default
    monkeypatch.setenv(HOST_DIR_ENV, str(tmp_path / "env"))
    assert HostGpuLedger().path == str(tmp_path / "env" / "gpus.json")


def test_private_dir_is_checked(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    _ensure_private_dir(str(mine))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    with pytest.raises(InsecurePathError, match=HOST_DIR_ENV):  # refused, not repaired
        _ensure_private_dir(str(open_dir))
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(InsecurePathError, match=HOST_DIR_ENV):
        _ensure_private_dir(str(link))
    _ensure_private_dir(str(tmp_path / "new"))
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700


def test_threads_share_one_handle(hostdir):
    host = HostGpuLedger(hostdir)
    keys = [f"GPU-{i}" for i in range(4)]
    errors = []

    def work():
        try:
            for _ in range(50):
                got = host.acquire_fraction(keys, QUARTER, holder_pid=ME)
                if got is not None:
                    host.release(got[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and host.leases() == {}
    host.close()


# ------------------------------------------------------------------ processes


HAMMER = textwrap.dedent(
    """
    import os, random, sys
    from miniray._private.ledger.host_gpus import HostGpuLedger, used_units
    from miniray._private.core.resources import UNIT

    directory, rounds = sys.argv[1], int(sys.argv[2])
    keys = ["GPU-0", "GPU-1", "GPU-2"]
    host = HostGpuLedger(directory)
    me = os.getpid()
    rng = random.Random(me)
    got = 0
    for _ in range(rounds):
        if rng.random() < 0.5:
            res = host.acquire_whole(keys, rng.choice([1, 2]), holder_pid=me)
            lease_id, held = (res[0], res[1]) if res else (None, [])
        else:
            res = host.acquire_fraction(keys, rng.choice([2500, 5000, 7500]), holder_pid=me)
            lease_id, held = (res[0], [res[1]]) if res else (None, [])
        if lease_id is None:
            continue
        got += 1
        leases = host.leases()
        assert lease_id in leases, "lost update: my lease is not in the file"
        assert all(u <= UNIT for u in used_units(leases).values()), leases
        markers = []
        if len(held) > 1 or leases[lease_id].shares[held[0]] == UNIT:
            for key in held:  # a whole device: nobody else may hold any of it
                marker = os.path.join(directory, "held-" + key)
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))  # FileExistsError: double
                markers.append(marker)
        for marker in markers:
            os.unlink(marker)
        assert host.release(lease_id)
    print(got)
    """
)


def test_three_processes_hammering_one_ledger(hostdir):
    HostGpuLedger(hostdir).close()  # creates the directory
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [MINIRAY_PARENT, env.get("PYTHONPATH", "")] if p)
    rounds = 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, hostdir, str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    torn = []
    reads = 0
    reader = HostGpuLedger(hostdir)
    try:
        while any(p.poll() is None for p in procs):
            try:
                used = used_units(reader.leases())  # lock-free: must never see a torn file
                assert all(u <= UNIT for u in used.values()), used
                reads += 1
            except ValueError as e:
                torn.append(e)
    finally:
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            results.append((p.returncode, out.decode(), err.decode()))
    assert torn == []
    for code, out, err in results:
        assert code == 0, err
        assert int(out) > 0
    children = procinfo.children(ME)
    assert not any(p.pid in children for p in procs)  # every child reaped
    assert reads > 0
    assert reader.leases() == {}
    assert sorted(os.listdir(hostdir)) == ["gpus.json", "gpus.json.lock"]  # no temp files
    reader.close()
