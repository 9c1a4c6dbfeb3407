"""``sys.exit(code)`` in user code: the exit status the worker leaves with is the one a plain
interpreter gives for the same code (compared by running one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from miniray._private.worker.execute import exit_status


@pytest.mark.parametrize("code", ["None", "0", "3", "255", "256", "-1", "True", "False",
                                  "'a message'", "2.5"])
def test_exit_status_is_the_interpreters(code):
    result = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code})"],
                            capture_output=True, timeout=30)
    assert exit_status(eval(code)) == result.returncode  # noqa: S307 - literals above


@pytest.mark.parametrize("code, intended", [(0, True), (False, True), (None, False),
                                            (3, False), (True, False),
                                            ("a message", False)])
def test_only_sys_exit_zero_is_an_intended_actor_exit(code, intended):
    """Ray 2.60's rule, compared by running each code in an actor with ``max_restarts=1``:
    0 and False end it on purpose (no restart); None, 3, True and strings are crashes."""
    from miniray._private.worker.actor_host import is_intended_exit

    assert is_intended_exit(SystemExit(code)) is intended
