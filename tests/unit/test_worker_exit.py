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
