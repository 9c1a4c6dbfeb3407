"""``core/dependency_errors.py``: the error of a call whose argument failed (no processes).

Compared with Ray 2.60 (see tests/integration/test_task_errors.py for the end-to-end cases).
"""

from __future__ import annotations

import pickle

from miniray import exceptions
from miniray._private.core import serialization
from miniray._private.core.dependency_errors import (
    INPUTS_FAILED,
    dependency_error,
    dependency_error_bytes,
)


class Boom(Exception):
    pass


def _upstream() -> exceptions.RayTaskError:
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nBoom: no'
    return exceptions.RayTaskError("produce", tb, Boom("no"), pid=11)


def test_two_levels_keep_the_user_cause_and_nest_the_text():
    first = dependency_error(_upstream(), "middle")
    second = dependency_error(first, "last")
    assert type(second.cause) is Boom and second.function_name == "last"
    lines = str(second).splitlines()
    assert lines[0].startswith("ray::last() (pid=")
    assert lines[1] == f"  {INPUTS_FAILED}"
    assert lines[2].startswith("miniray.exceptions.RayTaskError: ray::middle() (pid=")
    assert lines[3] == f"  {INPUTS_FAILED}"
    assert lines[4] == "miniray.exceptions.RayTaskError: ray::produce() (pid=11, ip=127.0.0.1)"
    assert lines[5:] == ['  File "x.py", line 1, in f', "Boom: no"]
    dual = second.as_instanceof_cause()
    assert isinstance(dual, Boom) and type(dual).__name__ == "RayTaskError(Boom)"


def test_a_system_error_is_shown_by_its_type_and_becomes_the_cause():
    crashed = exceptions.WorkerCrashedError()
    error = dependency_error(crashed, "use")
    assert error.cause is crashed
    assert str(error).splitlines()[2] == f"miniray.exceptions.WorkerCrashedError: {crashed}"
    assert isinstance(error.as_instanceof_cause(), exceptions.WorkerCrashedError)


def test_bytes_round_trip_and_unreadable_bytes_pass_through():
    data = dependency_error_bytes(serialization.dumps(_upstream()), "use")
    error = pickle.loads(data)
    assert isinstance(error, exceptions.RayTaskError) and type(error.cause) is Boom
    assert error.function_name == "use"
    garbage = b"not a pickle"
    assert dependency_error_bytes(garbage, "use") is garbage
