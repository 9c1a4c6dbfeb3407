"""A test run that is stopped, or a test that never tears its nodes down, leaves no node
running: SIGTERM ends the run as Ctrl-C does (the running test's fixtures tear down), and
the run's last check (conftest's ``pytest_sessionfinish``) stops the nodes of every root
whose teardown did not finish, failing a run that had passed. Each case runs pytest on a
small test file in a process of its own, with this directory's conftest as a plugin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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


def _inner_run(tmp_path, name: str) -> subprocess.Popen:
    path = tmp_path / "test_inner.py"
    path.write_text(textwrap.dedent(INNER))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO, TESTS_PARENT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "-p", "tests.integration.conftest", "--rootdir", str(tmp_path), "-k", name,
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
