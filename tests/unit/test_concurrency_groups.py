"""The pure decisions of actor concurrency groups (``_private/core/concurrency_groups.py``) and
what the handle carries, without processes. Behaviours compared with Ray 2.60 are said so."""

from __future__ import annotations

import pickle

import pytest

import miniray
from miniray._private.core import concurrency_groups as cg
from miniray._private.core.task_spec import ActorCallSpec, ActorCreationSpec


def test_check_groups_accepts_a_dict_of_sizes_and_none():
    """Compared with Ray 2.60: None, {} and [] mean no groups; True is a size of 1 there
    (a bool is refused here, as a size that is not an int)."""
    assert cg.check_groups({"io": 2, "compute": 4}, "A") == {"io": 2, "compute": 4}
    assert cg.check_groups(None, "A") == {}
    assert cg.check_groups({}, "A") == {}
    assert cg.check_groups([], "A") == {}


@pytest.mark.parametrize(("value", "error", "match"), [
    ({"io": 0}, ValueError, r"group 'io' must be at least 1, got 0"),
    ({"io": -3}, ValueError, r"at least 1, got -3"),
    ({"io": "2"}, TypeError, r"group 'io' must be an int, got str '2'"),
    ({"io": 2.0}, TypeError, r"must be an int, got float"),
    ({"io": True}, TypeError, r"must be an int, got bool"),
    ({3: 1}, TypeError, r"a group's name must be a str, got int 3"),
    (["io"], TypeError, r"must be a dict mapping each group's name"),
    ("io", TypeError, r"must be a dict"),
])
def test_check_groups_refuses_bad_values(value, error, match):
    with pytest.raises(error, match=match):
        cg.check_groups(value, "Reader")


def test_check_method_groups_names_the_method_and_the_groups():
    cg.check_method_groups({"read": "io", "other": None}, {"io": 1}, "Reader")
    with pytest.raises(AssertionError, match=r"Reader\.read is in concurrency group 'disk', "
                                             r"which Reader does not define \(its groups: "
                                             r"\['io'\]\)"):
        cg.check_method_groups({"read": "disk"}, {"io": 1}, "Reader")


def test_call_group_override_then_method_then_default():
    groups = ("io", "compute")
    assert cg.call_group(None, None, groups, "A", "f") is cg.DEFAULT
    assert cg.call_group("io", None, groups, "A", "f") == "io"
    assert cg.call_group("io", "compute", groups, "A", "f") == "compute"
    assert cg.call_group(None, "io", groups, "A", "f") == "io"
    assert cg.call_group("io", "", groups, "A", "f") == "io"  # empty: unset, as Ray's wire


def test_call_group_refuses_an_undefined_group():
    with pytest.raises(ValueError, match=r"A\.f\.options\(concurrency_group='disk'\): A "
                                         r"defines no such concurrency group"):
        cg.call_group(None, "disk", ("io",), "A", "f")


def test_executor_sizes_put_the_default_group_first():
    assert cg.executor_sizes({"io": 2}, 3) == {None: 3, "io": 2}
    assert cg.executor_sizes(None, 1000) == {None: 1000}


def test_specs_carry_groups_through_pickling():
    call = ActorCallSpec(b"t", "f", b"", None, [b"r"], 1, "f", 0, concurrency_group="io")
    assert pickle.loads(pickle.dumps(call)).concurrency_group == "io"
    plain = pickle.loads(pickle.dumps(ActorCallSpec(b"t", "f", b"", None, [b"r"], 1, "f", 0)))
    assert plain.concurrency_group is None and plain.payloads is None
    spec = ActorCreationSpec(actor_id=b"a", concurrency_groups={"io": 2})
    assert pickle.loads(pickle.dumps(spec)).concurrency_groups == {"io": 2}


def test_bad_groups_fail_before_anything_starts():
    """Compared with Ray 2.60, which refuses these at ``.remote()``, not at ``@remote``: no
    session is started for a class that cannot be created."""
    assert not miniray.is_initialized()

    @miniray.remote(concurrency_groups={"io": 0})
    class Bad:
        def f(self):
            return 1

    @miniray.remote(concurrency_groups={"io": 1})
    class Undefined:
        @miniray.method(concurrency_group="disk")
        def f(self):
            return 1

    with pytest.raises(ValueError, match="at least 1"):
        Bad.remote()
    with pytest.raises(AssertionError, match="'disk'"):
        Undefined.remote()
    assert not miniray.is_initialized()
