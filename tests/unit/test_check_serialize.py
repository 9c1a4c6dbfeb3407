"""``miniray.util.check_serialize.inspect_serializability``: the culprit's path, the return
value and the report's lines.

Each case was run under Ray 2.60 (its venv, ``ray.util.check_serialize``) with a StringIO as
``print_file``; the expected lines below are Ray's, with object addresses and colour codes left
out. miniray words its closing advice and its "no member failed" warning differently, so those
lines are only checked to exist.
"""

from __future__ import annotations

import io
import re
import threading

from miniray.util import check_serialize, inspect_serializability

LOCK = threading.Lock()


class Holder:
    def __init__(self):
        self.ok = 1
        self.lock = threading.Lock()


class Outer:
    def __init__(self):
        self.inner = Holder()
        self.name = "x"


def _run(obj, **kwargs):
    out = io.StringIO()
    ok, failures = inspect_serializability(obj, print_file=out, **kwargs)
    text = re.sub(r"0x[0-9a-f]+", "0xADDR", out.getvalue())
    return ok, failures, text.splitlines()


def _only(failures):
    assert len(failures) == 1, failures
    return next(iter(failures))


def test_a_serializable_object_prints_the_header_only():
    ok, failures, lines = _run([1, 2])
    assert (ok, failures) == (True, set())
    assert lines == ["=" * 34, "Checking Serializability of [1, 2]", "=" * 34]


def test_a_closure_capturing_a_lock_names_the_global():
    def uses_global_lock():  # local, so cloudpickle pickles it by value, as for __main__
        return LOCK

    ok, failures, lines = _run(uses_global_lock)
    failure = _only(failures)
    assert ok is False
    assert failure.path == ("LOCK",) and failure.obj is LOCK
    assert failure.parent is uses_global_lock
    assert repr(failure) == (f"FailTuple(LOCK [path=LOCK, obj={LOCK}, "
                             f"parent={uses_global_lock}])")
    assert lines[1].startswith("Checking Serializability of <function "
                               "test_a_closure_capturing_a_lock_names_the_global.<locals>.")
    assert lines[3:8] == [
        "!!! FAIL serialization: cannot pickle '_thread.lock' object",
        "Inspecting closure of 'test_a_closure_capturing_a_lock_names_the_global.<locals>"
        ".uses_global_lock':",
        "Detected 1 global variables. Checking serializability...",
        "    Serializing 'LOCK' <unlocked _thread.lock object at 0xADDR>...",
        "    !!! FAIL serialization: cannot pickle '_thread.lock' object",
    ]
    assert lines[8].startswith("    WARNING: ")
    assert lines[9] == lines[0] and lines[10] == "Variable: "
    assert re.sub(r"0x[0-9a-f]+", "0xADDR", repr(failure)) in lines[12]
    assert lines[14].startswith("was found to be non-serializable.")
    assert lines[-1] == lines[0]


def test_a_nonlocal_lock_in_a_lambda_is_found_under_the_given_name():
    lock = threading.Lock()
    ok, failures, _lines = _run(lambda: lock, name="job")
    failure = _only(failures)
    assert ok is False and failure.path == ("job", "lock") and failure.obj is lock


def test_an_unpicklable_attribute_is_named():
    holder = Holder()
    ok, failures, lines = _run(holder)
    failure = _only(failures)
    assert ok is False
    assert (failure.path, failure.obj, failure.parent) == (("lock",), holder.lock, holder)
    assert lines[3:5] == [
        "!!! FAIL serialization: cannot pickle '_thread.lock' object",
        "    Serializing 'lock' <unlocked _thread.lock object at 0xADDR>...",
    ]
    # Names given by the caller start the path, as in Ray ("h -> lock").
    _ok, failures, _lines = _run(holder, name="h")
    assert "[path=h -> lock, " in repr(_only(failures))


def test_a_nested_attribute_is_named_with_its_whole_path():
    outer = Outer()
    ok, failures, lines = _run(outer)
    failure = _only(failures)
    assert ok is False
    assert failure.path == ("inner", "lock")
    assert failure.obj is outer.inner.lock and failure.parent is outer.inner
    assert repr(failure).startswith("FailTuple(lock [path=inner -> lock, obj=<unlocked")
    assert lines[3:7] == [
        "!!! FAIL serialization: cannot pickle '_thread.lock' object",
        "    Serializing 'inner' <tests.unit.test_check_serialize.Holder object at 0xADDR>...",
        "    !!! FAIL serialization: cannot pickle '_thread.lock' object",
        "        Serializing 'lock' <unlocked _thread.lock object at 0xADDR>...",
    ]


def test_depth_bounds_the_search():
    outer = Outer()
    ok, failures, lines = _run(outer, depth=1)
    failure = _only(failures)
    assert ok is False and failure.path == ("inner",) and failure.obj is outer.inner
    assert not any("Serializing 'lock'" in line for line in lines)
    _ok, failures, _lines = _run(LOCK, depth=0)
    assert repr(_only(failures)) == f"FailTuple(unknown [path=, obj={LOCK}, parent=None])"


def test_colours_only_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    inspect_serializability(LOCK, print_file=out)
    assert "\x1b[31m!!! FAIL\x1b[39m" in out.getvalue()
    out = io.StringIO()
    inspect_serializability(LOCK, print_file=out)
    assert "\x1b" not in out.getvalue()


def test_the_module_is_at_rays_path():
    assert check_serialize.inspect_serializability is inspect_serializability
    assert "FailureTuple" in check_serialize.__all__
