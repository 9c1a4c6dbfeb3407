"""A test run that is stopped, or a test that never tears its nodes down, leaves no node
running: SIGTERM ends the run as Ctrl-C does (the running test's fixtures tear down), and
the run's last check (conftest's ``pytest_sessionfinish``) stops the nodes of every root
whose teardown did not finish, failing a run that had passed; a test phase past its time
limit (``tests/conftest.py``) fails alone and the run goes on; a child a test forks dies of
``SIGTERM`` and ``SIGALRM`` as by default. Each run case runs pytest on a small test file in
a process of its own, with this directory's conftest (or ``tests``') as a plugin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .helpers import REPO, procs_with_root

# The folder that holds this ``tests`` package (``REPO`` holds the miniray under test).
TESTS_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

INNER = '''
import time

import pytest

from tests.integration.helpers import cli, node_env_for


@pytest.fixture
def node_env(tmp_path):
    yield from node_env_for(tmp_path)


def test_stopped_while_its_node_runs(node_env):
    assert cli(node_env, "start", "--head", "--num-cpus", "1").returncode == 0
    print("ROOT", node_env["MINIRAY_TMPDIR"], flush=True)
    time.sleep(120)


def test_never_tears_its_node_down(tmp_path):
    env = next(node_env_for(tmp_path))  # its teardown is never run
    assert cli(env, "start", "--head", "--num-cpus", "1").returncode == 0
    print("ROOT", env["MINIRAY_TMPDIR"], flush=True)
'''


WEDGED = '''
import time


def test_wedged():
    time.sleep(120)


def test_after_it():
    pass
'''


def _inner_run(tmp_path, name: str, source: str = INNER,
               plugin: str = "tests.integration.conftest", **env) -> subprocess.Popen:
    path = tmp_path / "test_inner.py"
    path.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO, TESTS_PARENT, os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "-p", plugin, "--rootdir", str(tmp_path), "-k", name,
         str(path)], cwd=TESTS_PARENT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def _root_of(proc: subprocess.Popen) -> str:
    for _ in range(200):  # bounded: the inner run prints a few lines before ROOT
        line = proc.stdout.readline()
        if line.startswith("ROOT "):
            return line.split()[1]
        assert line, "the inner run ended before its node started"
    raise AssertionError("no ROOT line from the inner run")


def test_a_stopped_run_stops_the_nodes_its_running_test_started(tmp_path):
    proc = _inner_run(tmp_path, "stopped_while")
    try:
        root = _root_of(proc)
        assert procs_with_root(root)  # the node runs
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, output  # interrupted, as by Ctrl-C
    assert not procs_with_root(root), output
    assert not os.path.exists(root), output


def test_a_root_left_open_is_stopped_and_fails_the_run(tmp_path):
    proc = _inner_run(tmp_path, "never_tears")
    try:
        root = _root_of(proc)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, output  # its only test passed
    assert "node roots whose teardown did not finish" in output and root in output, output
    assert not procs_with_root(root), output
    assert not os.path.exists(root), output


def test_a_test_past_its_phase_limit_fails_alone_and_the_run_goes_on(tmp_path):
    proc = _inner_run(tmp_path, "wedged or after_it", WEDGED, "tests.conftest",
                      MINIRAY_TEST_PHASE_LIMIT_S="1")
    try:
        output = proc.communicate(timeout=60)[0]  # not the 120 s its test sleeps
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, output
    assert "PhaseTimeLimit: still running after 1 s" in output, output
    assert "in test_wedged" in output, output  # the stacks written out name where it was
    assert "1 failed, 1 passed" in output, output


def test_a_forked_child_dies_of_sigterm_and_sigalrm_as_by_default():
    """The run's own handlers (SIGTERM: stop as Ctrl-C does; SIGALRM: the phase limit) are
    never a forked child's: one wedged where Python code cannot run would outlive both."""
    from . import conftest

    if signal.getsignal(signal.SIGTERM) is not conftest._interrupt:
        pytest.skip("this run's SIGTERM is not conftest's (another handler was set before it)")
    assert callable(signal.getsignal(signal.SIGALRM))  # the phase limit's, in this process
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if (signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
                    and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL):
                os.write(write_end, b"1")  # checked: SIGTERM may come now
                signal.pause()
        finally:
            os._exit(3)
    os.close(write_end)
    status = None
    try:
        ready = os.read(read_end, 1)  # b"" when the child left without the check passing
        if ready:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while status is None and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            status = status if done else time.sleep(0.01)
    finally:
        os.close(read_end)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert ready and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
