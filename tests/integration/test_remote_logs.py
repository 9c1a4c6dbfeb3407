"""A remote driver's worker's output kept on its own node (README "Worker logs").

A head on 127.0.0.1 and a member on 127.0.0.2 (``FakeHosts``), plain TCP and TLS: a task
and an actor the driver on the head's host runs on the member print to stdout and stderr.
The driver prints their lines as before; the member's session holds them as
``logs/worker-<pid>.out/.err`` (``worker_logs.LogTee`` fed by the member's relay thread),
and ``miniray logs`` on the member's host reads them by pid and by actor id. The fixture's
teardown checks that nothing is left on either host, the log files included (they go with
the member's session).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from .helpers import cli, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`
from .test_remote_tasks import MEMBER, _run_driver
from .test_remote_tls import _tls_on_hosts

# The task and the actor that print on the member.
SPEAKERS = """
    @ray.remote
    def speak(n):
        print(f"out line {n} from the member")
        print(f"err line {n} from the member", file=sys.stderr)
        return os.getpid()

    @ray.remote
    class Talker:
        def say(self):
            print("the actor speaks on the member")
            return os.getpid()

        def shout(self, i):
            print("shout", i, flush=True)
    """

BODY = SPEAKERS + """
    pids = [ray.get(speak.options(scheduling_strategy=there).remote(n), timeout=30)
            for n in range(2)]
    talker = Talker.options(scheduling_strategy=there).remote()
    actor_pid = ray.get(talker.say.remote(), timeout=30)
    from miniray.util import state

    def logged(**kw):
        try:
            return "".join(state.get_log(**kw))
        except ValueError as error:
            return f"ValueError: {error}"

    # The member's log files have what was printed (its relay writes them; nothing orders
    # that with the results), polled, not a fixed sleep.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
            "out line 1" in logged(node_id=member, pid=pids[0])
            and "err line 1" in logged(node_id=member, pid=pids[0], suffix="err")
            and "the actor speaks" in logged(node_id=member, actor_id=talker._actor_id.hex())):
        time.sleep(0.05)

    import threading
    followed = []

    def follow():  # over one link to the member, until "shout 2" came
        for chunk in state.get_log(node_id=member, actor_id=talker._actor_id.hex(),
                                   follow=True, _interval=0.05):
            followed.append(chunk)
            if "shout 2" in "".join(followed):
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    deadline = time.monotonic() + 20
    while not followed and time.monotonic() < deadline:
        time.sleep(0.02)
    for i in range(3):
        ray.get(talker.shout.remote(i), timeout=30)
        time.sleep(0.05)
    follower.join(20)
    task = [t for t in state.list_tasks() if t["name"] == "speak"][0]
    task_id = task["task_id"]
    print(json.dumps({
        "task_node": task["node_id"], "member": member,
        "pids": pids, "actor_pid": actor_pid, "actor_id": talker._actor_id.hex(),
        "listed": state.list_logs(node_id=member),
        "listed_by_ip": state.list_logs(node_ip="127.0.0.2", glob_filter="*.err"),
        "by_pid": logged(node_id=member, pid=pids[0]),
        "by_pid_err": logged(node_id=member, pid=pids[0], suffix="err"),
        "by_task": logged(task_id=task_id),
        "by_actor": logged(node_id=member, actor_id=talker._actor_id.hex()),
        "by_file": logged(node_id=member, filename=f"worker-{pids[0]}.err", tail=1),
        "missing": logged(node_id=member, pid=1),
        "not_there": logged(pid=pids[0]),
        "followed": "".join(followed), "follow_ended": not follower.is_alive()}),
        flush=True)
    ray.shutdown()
    """


@pytest.fixture(params=[False, True], ids=["plain", "tls"])
def member(request, hosts, tmp_path):
    if request.param:
        _tls_on_hosts(hosts, tmp_path)
    yield hosts.start_member(MEMBER, "--num-cpus", "2")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def test_a_remote_workers_output_is_kept_in_its_nodes_session(hosts, member):
    doc = _run_driver(hosts, BODY)
    pid, actor_pid = doc["pids"][0], doc["actor_pid"]
    assert doc["pids"] == [pid, pid], doc
    # The driver prints them as before, naming the member.
    assert f"(speak pid={pid}, ip={MEMBER}) out line 0 from the member" in doc["stdout"], doc
    assert f"(speak pid={pid}, ip={MEMBER}) err line 1 from the member" in doc["stderr"], doc
    assert f"pid={actor_pid}, ip={MEMBER}) the actor speaks" in doc["stdout"], doc
    # The member keeps them in its own session, under the pid it sees.
    logs = os.path.join(hosts.record(MEMBER).session_dir, "logs")
    out, err = (os.path.join(logs, f"worker-{pid}.{s}") for s in ("out", "err"))
    assert wait_until(lambda: "out line 1" in _read(out) and "err line 1" in _read(err), 30.0), \
        (os.listdir(logs), _read(out), _read(err))
    assert "err line" not in _read(out) and "out line" not in _read(err)
    env = hosts.env(MEMBER)
    shown = cli(env, "logs", "--pid", str(pid))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert ":task_name:speak" in lines and "out line 0 from the member" in lines, shown.stdout
    shown = cli(env, "logs", "--pid", str(pid), "--err")
    assert "err line 1 from the member" in shown.stdout.splitlines(), shown
    assert wait_until(lambda: "the actor speaks" in _read(
        os.path.join(logs, f"worker-{actor_pid}.out")), 30.0), os.listdir(logs)
    shown = cli(env, "logs", "--actor-id", doc["actor_id"])
    assert shown.returncode == 0, shown.stderr
    assert "the actor speaks on the member" in shown.stdout, shown.stdout
    # The state API on the driver's host reads them from the member (step 13).
    assert f"worker-{pid}.out" in doc["listed"]["worker_out"], doc["listed"]
    assert f"worker-{pid}.err" in doc["listed"]["worker_err"], doc["listed"]
    assert list(doc["listed_by_ip"]) == ["worker_err"], doc["listed_by_ip"]
    assert "out line 0 from the member\nout line 1" in doc["by_pid"].replace(
        ":task_name:speak\n", ""), doc["by_pid"]
    assert "err line 1 from the member" in doc["by_pid_err"], doc
    assert doc["task_node"] == doc["member"], doc  # its row names the node it ran on
    assert "out line" in doc["by_task"], doc  # read there
    assert "the actor speaks on the member" in doc["by_actor"], doc
    assert doc["by_file"] == "err line 1 from the member\n", doc
    assert doc["missing"].startswith("ValueError:") and "worker pid 1" in doc["missing"], doc
    assert doc["not_there"].startswith("ValueError:"), doc  # no node named: this host's
    # `miniray logs --node-ip` on the head's host asks the member too.
    head_env = hosts.env("127.0.0.1")
    shown = cli(head_env, "logs", "--pid", str(pid), "--node-ip", MEMBER, "--err")
    assert shown.returncode == 0, shown.stderr
    assert "err line 1 from the member" in shown.stdout.splitlines(), shown
    shown = cli(head_env, "logs", "--node-id", doc["member"])
    assert f"worker-{actor_pid}.out" in shown.stdout.splitlines(), shown
    shown = cli(head_env, "logs", "--pid", "1", "--node-ip", MEMBER)
    assert shown.returncode == 1 and "worker pid 1" in shown.stderr, shown
    # Followed from the driver's host: the tail, then each line as it came, once.
    assert doc["follow_ended"], doc
    assert [line for line in doc["followed"].splitlines() if line.startswith(
        ("shout", "the actor"))] == ["the actor speaks on the member", "shout 0",
                                     "shout 1", "shout 2"], doc["followed"]
    # `miniray logs -f --node-ip` too, until interrupted (the actor has ended: its file
    # stays in the member's session).
    follow = subprocess.Popen(
        [sys.executable, "-m", "miniray", "logs", "--actor-id", doc["actor_id"],
         "--node-ip", MEMBER, "-f"], env=head_env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        # Interrupted once "shout 2" came (the tail's last line), not a fixed 0.3 s after
        # its first output: a slow runner might not have written the rest by then.
        seen: list = []
        reader = threading.Thread(target=lambda: seen.extend(iter(follow.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        assert wait_until(lambda: "shout 2\n" in seen, 30.0), seen
        follow.send_signal(signal.SIGINT)
        follow.wait(20)
        reader.join(20)
        out, err = "".join(seen), follow.stderr.read()
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, err
    assert out.splitlines()[-1] == "shout 2", out
    # The driver's host keeps nothing of them: they ran on the member.
    head_logs = os.path.join(hosts.record("127.0.0.1").session_dir, "logs")
    assert not os.path.exists(os.path.join(head_logs, f"worker-{pid}.out"))


def test_no_log_files_on_the_member_when_they_are_turned_off(hosts):
    # Not BODY: its polls for the member's log files would wait out their 30 s and 20 s.
    hosts.env(MEMBER)["MINIRAY_WORKER_LOG_BYTES"] = "0"
    hosts.start_member(MEMBER, "--num-cpus", "2")
    doc = _run_driver(hosts, SPEAKERS + """
    pids = [ray.get(speak.options(scheduling_strategy=there).remote(n), timeout=30)
            for n in range(2)]
    talker = Talker.options(scheduling_strategy=there).remote()
    actor_pid = ray.get(talker.say.remote(), timeout=30)
    from miniray.util import state
    print(json.dumps({"pids": pids, "actor_pid": actor_pid,
                      "listed": state.list_logs(node_id=member)}), flush=True)
    ray.shutdown()
    """)
    pid, actor_pid = doc["pids"][0], doc["actor_pid"]
    # The driver prints them as before; the member keeps no file of them.
    assert f"(speak pid={pid}, ip={MEMBER}) out line 0 from the member" in doc["stdout"], doc
    assert f"pid={actor_pid}, ip={MEMBER}) the actor speaks" in doc["stdout"], doc
    logs = os.path.join(hosts.record(MEMBER).session_dir, "logs")
    names = os.listdir(logs) if os.path.isdir(logs) else []
    assert not [n for n in names if n.startswith("worker-")], names
    listed = [n for files in doc["listed"].values() for n in files]
    assert not [n for n in listed if n.startswith("worker-")], doc["listed"]


def test_what_a_remote_worker_printed_before_a_force_cancel_is_kept(hosts, tmp_path):
    """The node writes the file, not the worker: a SIGKILL (``cancel(force=True)``) right
    after a print loses nothing of it."""
    hosts.start_member(MEMBER, "--num-cpus", "2")
    doc = _run_driver(hosts, """
    @ray.remote
    def stuck(marker):
        print(f"last words of {os.getpid()}", flush=True)
        open(marker, "w").close()  # printed (a fixed sleep could end before a slow print)
        time.sleep(60)

    marker = os.environ["PRINTED_MARKER"]
    ref = stuck.options(scheduling_strategy=there).remote(marker)
    deadline = time.monotonic() + 30
    pid = None
    from miniray.util import state
    while pid is None and time.monotonic() < deadline:
        rows = [t for t in state.list_tasks() if t["name"] == "stuck" and t["worker_pid"]]
        pid = rows[0]["worker_pid"] if rows and rows[0]["state"] == "RUNNING" else None
        time.sleep(0.05)
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    ray.cancel(ref, force=True)
    try:
        ray.get(ref, timeout=30)
        outcome = "returned"
    except Exception as error:
        outcome = type(error).__name__
    print(json.dumps({"pid": pid, "outcome": outcome}), flush=True)
    ray.shutdown()
    """, PRINTED_MARKER=str(tmp_path / "printed"))
    pid = doc["pid"]
    assert pid and doc["outcome"] != "returned", doc
    path = os.path.join(hosts.record(MEMBER).session_dir, "logs", f"worker-{pid}.out")
    assert wait_until(lambda: f"last words of {pid}" in _read(path), 30.0), _read(path)
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30.0)
