"""Worker stdout/stderr reach the driver with Ray's ``(name pid=N) `` prefix.

Ray 2.60 behaviour: ray-api-surface.md §1.1 (``log_to_driver``). Each test runs a separate
driver process, so what reaches the driver's real stdout and stderr is what is checked.
"""

from __future__ import annotations

import json

import pytest

PRINTING_DRIVER = """
    import json, os, sys
    import miniray as ray

    ray.init(num_cpus=1, **json.loads(sys.argv[1] if len(sys.argv) > 1 else "{{}}"))

    @ray.remote
    def chatty(tag):
        print(f"hello {{tag}} from task")
        print(f"warning {{tag}} on stderr", file=sys.stderr)
        print("two\\nlines")
        return os.getpid()

    @ray.remote
    def other():
        print("from other")
        return os.getpid()

    pid = ray.get(chatty.remote("A"), timeout=60)
    print("driver: after get", flush=True)
    other_pid = ray.get(other.options(name="renamed").remote(), timeout=60)
    print("PIDS " + json.dumps([pid, other_pid]), flush=True)
    {tail}
"""


def _run(drivers, tail="ray.shutdown()", **env):
    result = drivers.run(PRINTING_DRIVER.format(tail=tail), timeout=60, **env)
    assert result.returncode == 0, result.stderr
    pids_line = [line for line in result.stdout.splitlines() if line.startswith("PIDS ")]
    assert pids_line, result.stdout
    pid, other_pid = json.loads(pids_line[0][5:])
    return result, pid, other_pid


def test_task_stdout_is_prefixed_and_comes_before_the_result(drivers):
    result, pid, other_pid = _run(drivers)
    out = result.stdout.splitlines()
    assert f"(chatty pid={pid}) hello A from task" in out
    assert f"(chatty pid={pid}) two" in out
    assert f"(chatty pid={pid}) lines" in out
    # The task's print was written before its result, so the driver prints it first.
    assert out.index(f"(chatty pid={pid}) hello A from task") < out.index("driver: after get")
    # The name option is the prefix, as in Ray.
    assert f"(renamed pid={other_pid}) from other" in out
    # Nothing of the worker's stdout goes to the driver's stderr, and no marker leaks.
    assert "hello A" not in result.stderr
    assert "\x00" not in result.stdout and "\x00" not in result.stderr


def test_task_stderr_goes_to_driver_stderr(drivers):
    result, pid, _ = _run(drivers)
    assert f"(chatty pid={pid}) warning A on stderr" in result.stderr.splitlines()
    assert "warning A" not in result.stdout


def test_log_to_driver_false_suppresses_worker_output(drivers):
    quiet = drivers.run(
        PRINTING_DRIVER.format(tail="ray.shutdown()"),
        timeout=60,
        args=[json.dumps({"log_to_driver": False})],
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "driver: after get" in quiet.stdout
    for text in ("hello A", "two", "from other", "pid="):
        assert text not in quiet.stdout
    assert "warning A" not in quiet.stderr


def test_ray_log_to_driver_env_off_suppresses_worker_output(drivers):
    result = drivers.run(
        PRINTING_DRIVER.format(tail="ray.shutdown()"), timeout=60, RAY_LOG_TO_DRIVER="0"
    )
    assert result.returncode == 0, result.stderr
    assert "hello A" not in result.stdout and "warning A" not in result.stderr


def test_disable_worker_log_prefix(drivers):
    result, pid, _ = _run(drivers, RAY_DISABLE_WORKER_LOG_PREFIX="1")
    assert "hello A from task" in result.stdout.splitlines()
    assert f"pid={pid}" not in result.stdout


@pytest.mark.parametrize("tail", ["", "import os; os._exit(0)"], ids=["atexit", "os._exit"])
def test_output_printed_before_exit_is_not_lost(drivers, tail):
    # Output of a finished task was printed before get() returned: it is there whatever way
    # the driver ends.
    result, pid, _ = _run(drivers, tail=tail)
    assert f"(chatty pid={pid}) hello A from task" in result.stdout.splitlines()


PARTIAL_LINE_DRIVER = """
    import os, sys
    import miniray as ray

    ray.init(num_cpus=1)

    @ray.remote
    def first():
        sys.stdout.write("no newline")
        sys.stdout.flush()
        return os.getpid()

    @ray.remote
    def second():
        print("hello from second")
        return os.getpid()

    pid = ray.get(first.remote(), timeout=60)
    assert ray.get(second.remote(), timeout=60) == pid  # the same worker runs both
    print("PID", pid, flush=True)
    ray.shutdown()
"""


def test_output_after_a_partial_line_gets_the_right_prefix(drivers):
    # Regression: the next task's marker used to land mid-line and leak into the output.
    result = drivers.run(PARTIAL_LINE_DRIVER, timeout=60)
    assert result.returncode == 0, result.stderr
    pid = [line for line in result.stdout.splitlines() if line.startswith("PID ")][0].split()[1]
    assert "\x00" not in result.stdout
    assert f"(second pid={pid}) hello from second" in result.stdout.splitlines()
    assert f"(first pid={pid}) no newline" in result.stdout.splitlines()


ROUND_TRIP_DRIVER = """
    import sys
    import miniray as ray

    ray.init(num_cpus=1)

    def line(stream, text):  # one write: a line printed by the I/O thread meanwhile
        stream.write(text + "\\n")  # cannot land between the text and its newline
        stream.flush()

    @ray.remote
    def say(i):
        print(f"out {i}")
        print(f"err {i}", file=sys.stderr)
        return i

    @ray.remote
    def quiet(i):
        return i

    @ray.remote
    def items(n):
        for i in range(n):
            print(f"item {i}")
            yield i

    for i in range(150):  # lines only now and then: the quiet results between read nothing
        if i % 3 == 0:
            assert ray.get(say.remote(i), timeout=60) == i
            line(sys.stdout, f"got {i}")
            line(sys.stderr, f"got {i}")
        else:
            assert ray.get(quiet.remote(i), timeout=60) == i
    refs = [say.remote(i) for i in range(1000, 1040)]  # results that arrive in batches
    assert ray.get(refs, timeout=60) == list(range(1000, 1040))
    line(sys.stdout, "got batch")
    for i in items.remote(20):
        line(sys.stdout, f"yielded {ray.get(i, timeout=60)}")
"""


def test_lines_printed_before_each_result_come_before_it(drivers):
    # Every round trip of a printing task: its lines (stdout and stderr) are printed before
    # get() returns; results that come in a batch and yielded items likewise.
    result = drivers.run(ROUND_TRIP_DRIVER, timeout=120)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout.splitlines(), result.stderr.splitlines()

    def index(lines, suffix):
        found = [n for n, line in enumerate(lines) if line.endswith(suffix)]
        assert found, (suffix, lines[-20:])
        return found[0]

    for i in range(0, 150, 3):
        assert index(out, f") out {i}") < index(out, f"got {i}")
        assert index(err, f") err {i}") < index(err, f"got {i}")
    for i in range(1000, 1040):
        assert index(out, f") out {i}") < index(out, "got batch")
    for i in range(20):
        assert index(out, f") item {i}") < index(out, f"yielded {i}")


NAMED_DRIVER = """
    import json, os, subprocess, sys
    import miniray as ray

    ray.init(num_cpus=1)

    @ray.remote
    def c_level():  # fd-level writes, as C code makes them: no sys.stdout involved
        os.write(1, b"c-level out\\n")
        os.write(2, b"c-level err\\n")
        return os.getpid()

    @ray.remote
    def silent():
        return os.getpid()

    @ray.remote
    def py():
        print("python print")
        return os.getpid()

    @ray.remote
    def child():
        subprocess.run([sys.executable, "-c", "print('from a subprocess')"], check=True)
        return os.getpid()

    # The worker's first task, then a task after a silent one, a subprocess, and the first
    # name again: each new name on an idle worker is named by the driver, not by a marker.
    pids = [ray.get(f.remote(), timeout=60) for f in (c_level, silent, py, child, c_level)]
    done = subprocess.run([sys.executable, "-m", "miniray", "logs", "--pid", str(pids[0])],
                          capture_output=True, text=True, timeout=60)
    print("PIDS " + json.dumps(pids), flush=True)
    print("LOG " + json.dumps(done.stdout), flush=True)
    ray.shutdown()
"""


def test_output_of_each_new_name_on_an_idle_worker_gets_its_prefix(drivers):
    # The driver names a new task on an idle worker itself (NAMED, no marker line): lines
    # written at the fd level, by a subprocess, or after a silent task keep their task's
    # prefix, and the worker's log file still has every task's ":task_name:" line in order.
    result = drivers.run(NAMED_DRIVER, timeout=120)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    pids = json.loads([line for line in out if line.startswith("PIDS ")][0][5:])
    pid = pids[0]
    assert pids == [pid] * 5  # one worker ran them all
    assert out.count(f"(c_level pid={pid}) c-level out") == 2
    assert err.count(f"(c_level pid={pid}) c-level err") == 2
    assert f"(py pid={pid}) python print" in out
    assert f"(child pid={pid}) from a subprocess" in out
    assert not [line for line in out + err if line.startswith("(silent")]
    assert "\x00" not in result.stdout and "\x00" not in result.stderr
    log = json.loads([line for line in out if line.startswith("LOG ")][0][4:])
    assert log == (":task_name:c_level\nc-level out\n:task_name:silent\n:task_name:py\n"
                   "python print\n:task_name:child\nfrom a subprocess\n"
                   ":task_name:c_level\nc-level out\n")


def test_an_actor_with_its_own_repr_is_named_by_it(drivers):
    """Ray 2.60 (checked with this driver's classes): once the constructor has run, an actor
    whose class or a base class defines ``__repr__`` is named by ``repr(actor)`` in its
    output's prefix and in the state API's ``repr_name``, computed once (a later change of
    the state it shows does not rename it); lines printed in the constructor carry the
    class name; other actors keep their class name and ``repr_name`` "". A ``__repr__``
    that raises kills Ray's actor; miniray keeps the class name (README)."""
    result = drivers.run("""
        import json, os
        import miniray as ray
        from miniray.util import state

        ray.init(num_cpus=1)

        class Base:
            def __repr__(self):
                return f"Base-{self.i}"

        @ray.remote
        class Sub(Base):
            def __init__(self):
                self.i = 1
                print("in init")

            def bump(self):
                self.i += 1
                print("after bump")
                return self.i

        @ray.remote
        class Plain:
            def hi(self):
                print("plain hi")

        @ray.remote
        class Broken:
            def __repr__(self):
                raise ValueError("no repr")

            def hi(self):
                print("broken hi")

        sub, plain, broken = Sub.remote(), Plain.remote(), Broken.remote()
        assert ray.get([sub.bump.remote(), sub.bump.remote()], timeout=60) == [2, 3]
        ray.get([plain.hi.remote(), broken.hi.remote()], timeout=60)
        names = {row["class_name"]: row["repr_name"] for row in state.list_actors(detail=True)}
        pids = [ray.get(a.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
                for a in (sub, plain, broken)]
        print("PIDS " + json.dumps(pids + [names]), flush=True)
        ray.shutdown()
    """, timeout=120)
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("PIDS ")]
    sub, plain, broken, names = json.loads(line[5:])
    out = result.stdout.splitlines()
    assert f"(Sub pid={sub}) in init" in out
    assert out.count(f"(Base-1 pid={sub}) after bump") == 2, out
    assert f"(Plain pid={plain}) plain hi" in out
    assert f"(Broken pid={broken}) broken hi" in out
    assert names == {"Sub": "Base-1", "Plain": "", "Broken": ""}, names
