"""``miniray logs``: a worker's or actor's output, kept in the session's ``logs/`` (capped),
read by pid, by actor id, by Ray's ``worker``/``actor`` subcommands and by file name, in an
embedded session and from a node's session after its driver left.

Ray 2.60's ``ray logs worker --pid N`` / ``ray logs actor --id HEX`` / ``ray logs <file>``
print the worker's ``.out`` (``--err``: ``.err``) file; compared for the command forms, the
``--tail`` default (1000) and ``:task_name:`` lines.
"""

from __future__ import annotations

import json

from .helpers import cli, driver, json_line

PROGRAM = """
    import json, os, subprocess, sys, miniray as ray
    ray.init(num_cpus=2)
    @ray.remote
    def talk(n):
        for i in range(n):
            print("task line", i)
        print("to stderr", file=sys.stderr)
        return os.getpid()
    @ray.remote
    class Talker:
        def __init__(self):
            print("actor born")
        def hi(self):
            print("actor says hi")
            return os.getpid()
    pid = ray.get(talk.remote(int(sys.argv[1])))
    actor = Talker.remote()
    actor_pid = ray.get(actor.hi.remote())
    def logs(*args):
        done = subprocess.run([sys.executable, "-m", "miniray", "logs", *args],
                              capture_output=True, text=True, timeout=60)
        return [done.returncode, done.stdout, done.stderr]
    out = {"pid": pid, "actor_pid": actor_pid, "runs": [
        logs("--pid", str(pid)), logs("worker", "--pid", str(pid), "--err"),
        logs("--actor-id", actor._actor_id.hex()), logs("actor", "--id", actor._actor_id.hex()),
        logs(f"worker-{pid}.out", "--tail", "1"), logs("--pid", "1"), logs(),
        logs("cluster", "worker-*.out")]}
    print(json.dumps(out))
    ray.shutdown()
"""


def test_logs_by_pid_actor_id_and_file_in_an_embedded_session(drivers):
    result = drivers.run(PROGRAM, args=["3"])
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    by_pid, err, by_actor, ray_actor, by_file, unknown, listing, glob = out["runs"]
    assert by_pid[:2] == [0, ":task_name:talk\ntask line 0\ntask line 1\ntask line 2\n"]
    assert err[:2] == [0, ":task_name:talk\nto stderr\n"]
    assert by_actor[:2] == [0, ":task_name:Talker\nactor born\nactor says hi\n"]
    assert ray_actor[:2] == by_actor[:2]
    assert by_file[:2] == [0, "task line 2\n"]
    assert unknown[0] == 1 and "no log of worker pid 1" in unknown[2]
    assert listing[0] == 0 and f"worker-{out['pid']}.out" in listing[1]
    assert f"worker-{out['actor_pid']}.err" in listing[1]
    assert glob[0] == 0  # several files match: listed, as `ray logs cluster <glob>` does
    assert f"logs/worker-{out['pid']}.out\n" in glob[1]
    assert f"logs/worker-{out['actor_pid']}.out\n" in glob[1]


def test_a_log_is_capped_and_the_last_lines_are_kept(drivers):
    result = drivers.run(PROGRAM, args=["3000"], MINIRAY_WORKER_LOG_BYTES="4096")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    code, text, _err = out["runs"][0]
    assert code == 0 and text.endswith("task line 2999\n")
    assert "task line 0\n" not in text  # 3000 lines are ~45 KB: the oldest were dropped
    assert len(text) < 2 * 4096 + 65536  # two generations, each at most cap + one chunk


def test_a_nodes_worker_logs_outlive_the_driver(node_env):
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    proc = driver("""
        import json, os, miniray as ray
        ray.init(address="auto")
        @ray.remote
        def hello():
            print("hello from the node")
            return os.getpid()
        print(json.dumps({"pid": ray.get(hello.remote())}))
        ray.shutdown()
    """, node_env)
    pid = json_line(proc)["pid"]
    assert proc.wait(30) == 0, proc.stderr.read()
    result = cli(node_env, "logs", "worker", "--pid", str(pid), "--timeout", "5")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ":task_name:hello\nhello from the node\n"
    assert "--timeout do not apply on one host" in result.stderr
    # A node no cluster view here knows: this host's sessions, as without --node-id.
    result = cli(node_env, "logs", "worker", "--pid", str(pid), "--node-id", "x")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ":task_name:hello\nhello from the node\n"


def test_follow_prints_what_an_actor_writes_until_interrupted(drivers):
    result = drivers.run("""
        import json, os, signal, subprocess, sys, threading, time, miniray as ray
        ray.init(num_cpus=1)
        @ray.remote
        class Ticker:
            def run(self):
                for i in range(12):
                    print("tick", i, flush=True)
                    time.sleep(0.15)
        ticker = Ticker.remote()
        ref = ticker.run.remote()
        from miniray.util import state
        def logged():
            try:
                return "".join(state.get_log(actor_id=ticker._actor_id.hex()))
            except ValueError:  # no log file yet
                return ""
        deadline = time.monotonic() + 60  # followed once it has printed
        while "tick 0" not in logged() and time.monotonic() < deadline:
            time.sleep(0.02)
        follow = subprocess.Popen([sys.executable, "-m", "miniray", "logs", "--actor-id",
                                   ticker._actor_id.hex(), "--follow"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ray.get(ref)
        # Interrupted once the last tick came, not a fixed time after the run: a loaded
        # runner may not have started the follower, or printed the rest, by then.
        seen = []
        reader = threading.Thread(target=lambda: seen.extend(iter(follow.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while "tick 11\\n" not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
        reader.join(30)
        print(json.dumps([follow.returncode, "".join(seen), err]))
        ray.shutdown()
    """)
    assert result.returncode == 0, result.stderr
    code, out, err = json.loads(result.stdout.strip().splitlines()[-1])
    assert code == 0, err
    assert out.endswith("".join(f"tick {i}\n" for i in range(5, 12)))
