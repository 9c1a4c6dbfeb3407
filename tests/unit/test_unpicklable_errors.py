"""The TypeError of what cannot be pickled (``core/serialization.py``): Ray's first line,
seen under Ray 2.60 for a lock ("Could not serialize the argument <lock> for a task or actor
job.f:", "... the function job.g:", "... the actor class job.A.__init__:", "... the put
value <lock>:"), then ``inspect_serializability``'s report on the culprit, then what to do.
"""

from __future__ import annotations

import sys
import threading
import types

import pytest

from miniray._private.core import serialization
from miniray._private.core.object_ref import ObjectRef

LOCK = threading.Lock()


@pytest.fixture
def script(monkeypatch):
    """``__main__`` is a script ``/work/job.py``, as under ``python job.py``."""
    main = types.ModuleType("__main__")
    main.__file__ = "/work/job.py"
    monkeypatch.setitem(sys.modules, "__main__", main)


def _lines(error: pytest.ExceptionInfo) -> list[str]:
    return str(error.value).splitlines()


def test_an_argument_names_itself_and_its_task_and_carries_the_report(script):
    with pytest.raises(TypeError) as error:
        serialization.pack_arguments((1, LOCK), {}, "__main__.f", ObjectRef)
    lines = _lines(error)
    assert lines[0] == f"Could not serialize the argument {LOCK!r} for a task or actor job.f:"
    assert lines[2] == f"Checking Serializability of {LOCK!r}"
    assert "!!! FAIL serialization: cannot pickle '_thread.lock' object" in lines
    assert any(line.startswith("\tFailTuple(unknown [path=, obj=<unlocked _thread.lock")
               for line in lines)
    assert lines[-1].startswith("Arguments of remote calls must be picklable")
    assert isinstance(error.value.__cause__, TypeError)  # the pickling error, chained
    with pytest.raises(TypeError) as error:  # a keyword argument too; a module's name stays
        serialization.pack_arguments((), {"x": [LOCK]}, "jobs.tasks.f", ObjectRef)
    assert _lines(error)[0] == (f"Could not serialize the argument {[LOCK]!r} for a task or "
                                "actor jobs.tasks.f:")


def test_a_function_names_what_it_captures(script):
    def g():
        return LOCK

    with pytest.raises(TypeError) as error:
        serialization.dumps_function(g, "__main__.g")
    lines = _lines(error)
    assert lines[0] == "Could not serialize the function job.g:"
    assert "Detected 1 global variables. Checking serializability..." in lines
    assert any(line.startswith("\tFailTuple(LOCK [path=LOCK, obj=<unlocked _thread.lock")
               for line in lines)
    assert lines[-1].startswith("Check what it captures from its enclosing scope")


def test_an_actor_class_is_named_as_ray_names_it(script):
    class A:
        def f(self):
            return LOCK

    with pytest.raises(TypeError) as error:
        serialization.dumps_function(A, "__main__.A.__init__", "actor class")
    lines = _lines(error)
    assert lines[0] == "Could not serialize the actor class job.A.__init__:"
    assert "Checking Serializability of" in lines[2]


def test_a_put_value_and_a_long_repr():
    value = [LOCK] + list(range(1000))
    message = serialization.unpicklable_message(
        "put value", value, TypeError("cannot pickle"), "Put something else.")
    first = message.splitlines()[0]
    assert first.startswith(f"Could not serialize the put value [{LOCK!r}, 0, 1, 2")
    assert first.endswith("...>:") and len(first) < 600  # cut: the report shows the culprit
    assert message.splitlines()[-1] == "Put something else."


def test_a_value_whose_repr_fails_still_gets_the_pickling_error():
    class Bad:
        def __reduce__(self):
            raise RuntimeError("no reduce")

        def __repr__(self):
            raise ValueError("no repr")

    message = serialization.unpicklable_message(
        "put value", Bad(), RuntimeError("no reduce"), "Do X.")
    assert message.splitlines() == [
        "Could not serialize the put value <test_a_value_whose_repr_fails_still_gets_the_"
        "pickling_error.<locals>.Bad object>:", "RuntimeError: no reduce", "Do X."]


@pytest.mark.parametrize("main_file, shown", [
    ("/work/job.py", "job.f"),  # a script: its file's name, as Ray
    (None, "__main__.f"),  # python -c, a notebook: no file
    ("/work/my-job.py", "__main__.f"),  # not a module name
])
def test_main_is_named_after_the_script(monkeypatch, main_file, shown):
    main = types.ModuleType("__main__")
    if main_file:
        main.__file__ = main_file
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert serialization.display_name("__main__.f") == shown
    assert serialization.display_name("pkg.__main__.f") == "pkg.__main__.f"
