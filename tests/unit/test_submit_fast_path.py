"""The per-task shortcuts of ``.remote()`` and ``get()``, against a fake runtime.

A function's pickle travels with its first submission in a session only (the runtime is not
asked again once one went through; a new session asks again); a call without arguments and a
one-return task get the same spec as before; ``owned_ref`` is what ``ObjectRef(id)`` makes;
``get_values`` reads small values and raises their load errors as ``materialize`` does.
"""

from __future__ import annotations

import pickle

import pytest

from miniray._private import runtime
from miniray._private.core import context, ids, object_ref, protocol
from miniray._private.core.object_ref import ObjectRef
from miniray._private.object_store import values
from miniray.exceptions import RaySystemError
from miniray.remote_function import RemoteFunction


class _FakeRuntime:
    runtime_env_key = ""

    def __init__(self):
        self.session_token = object()
        self.asked: list[bytes] = []
        self.specs: list = []
        self.created: list[bytes] = []
        self._sent: set = set()

    def current_placement(self):
        return None

    @property
    def large_arguments(self):
        return 1 << 30, None

    def needs_function(self, fn_id: bytes) -> bool:
        self.asked.append(fn_id)
        return fn_id not in self._sent

    def submit_task(self, spec) -> None:
        if spec.fn_bytes is not None:
            self._sent.add(spec.fn_id)
        self.specs.append(spec)

    def ref_created(self, object_id: bytes) -> None:
        self.created.append(object_id)

    def get_serialized(self, object_ids, timeout):
        return self.items


def _noop():
    return None


def _two():
    return 1, 2


@pytest.fixture
def fake(monkeypatch):
    rt = _FakeRuntime()
    monkeypatch.setattr(runtime, "auto_init", lambda: rt)
    monkeypatch.setattr(context, "auto_init", lambda: rt)  # what .remote() calls
    return rt


def test_function_pickle_goes_with_first_submission_only(fake):
    f = RemoteFunction(_noop, {})
    f.remote()
    f.remote()
    f.remote()
    assert fake.specs[0].fn_bytes is not None
    assert [spec.fn_bytes for spec in fake.specs[1:]] == [None, None]
    assert len(fake.asked) == 1  # not asked again once the first went through


def test_new_session_gets_the_pickle_again(fake, monkeypatch):
    f = RemoteFunction(_noop, {})
    f.remote()
    second = _FakeRuntime()
    monkeypatch.setattr(runtime, "auto_init", lambda: second)
    monkeypatch.setattr(context, "auto_init", lambda: second)
    f.remote()
    assert second.specs[0].fn_bytes is not None
    assert second.asked == [second.specs[0].fn_id]


def test_failed_submission_is_not_remembered(fake, monkeypatch):
    f = RemoteFunction(_noop, {})

    def refuse(spec):
        raise RuntimeError("closed")

    monkeypatch.setattr(fake, "submit_task", refuse)
    with pytest.raises(RuntimeError):
        f.remote()
    monkeypatch.undo()
    monkeypatch.setattr(runtime, "auto_init", lambda: fake)
    monkeypatch.setattr(context, "auto_init", lambda: fake)
    fake._sent.clear()
    f.remote()
    assert fake.specs[0].fn_bytes is not None


def test_spec_of_call_without_arguments_and_return_ids(fake):
    f = RemoteFunction(_noop, {})
    ref = f.remote()
    spec = fake.specs[0]
    from miniray._private.core import serialization

    blob, deps, contained, _stored = serialization.pack_arguments((), {}, "_noop", ObjectRef)
    assert (spec.args_blob, spec.deps, spec.contained) == (blob, deps, contained)
    assert spec.return_ids == [spec.task_id + (1).to_bytes(4, "big")]
    assert ref.binary() == spec.return_ids[0]
    assert fake.created == [ref.binary()]
    RemoteFunction(_two, {"num_returns": 2}).remote()
    two = fake.specs[1]
    assert two.return_ids == [two.task_id + i.to_bytes(4, "big") for i in (1, 2)]
    RemoteFunction(_noop, {"num_returns": 0}).remote()
    assert fake.specs[2].return_ids == []


def test_owned_ref_is_what_the_constructor_makes(fake):
    object_id = ids.new_task_id() + (1).to_bytes(4, "big")
    ref = object_ref.owned_ref(object_id, fake)
    assert type(ref) is ObjectRef
    assert ref == ObjectRef(object_id, fake.session_token)
    assert ref._token is fake.session_token
    assert fake.created == [object_id]


def test_get_values_small_values_and_load_errors(fake):
    refs = [ObjectRef(ids.new_task_id() + (1).to_bytes(4, "big"), False) for _ in range(3)]
    fake.items = [(protocol.OK, pickle.dumps(i)) for i in range(3)]
    assert values.get_values(fake, refs) == [0, 1, 2]
    fake.items = [(protocol.OK, pickle.dumps(1)), (protocol.OK, b"not a pickle")]
    with pytest.raises(RaySystemError, match="Could not deserialize an object") as info:
        values.get_values(fake, refs[:2])
    assert info.value.__cause__ is not None
    with pytest.raises(RaySystemError, match="Could not deserialize an object"):
        values.materialize(protocol.OK, b"not a pickle")


def test_caller_group_option_in_no_group_asks_nothing_more(fake, monkeypatch):
    from miniray._private.core import placement

    def resolve(placed, current):
        raise AssertionError("resolve_option() was called")

    f = RemoteFunction(_noop, {})
    monkeypatch.setattr(placement, "resolve_option", resolve)
    f.remote()  # no group named, and the caller is in none: no resolution
    assert fake.specs[0].placement is None
    monkeypatch.setattr(fake, "current_placement", lambda: ("a" * 36, [{"CPU": 1.0}], True))
    with pytest.raises(AssertionError, match="resolve_option"):
        f.remote()  # the caller is in a group: it is resolved as before


def test_functions_without_options_share_one_request(fake):
    from miniray import remote_function
    from miniray._private.core import options

    f, g = RemoteFunction(_noop, {}), RemoteFunction(_two, {})
    f.remote()
    g.remote()
    assert fake.specs[0].request is fake.specs[1].request  # one dict: the owner's key cache
    assert fake.specs[0].request == options.task_resource_request({}) == {"CPU": 1.0}
    template = remote_function._Template({}, 0, "x", False)
    assert (template.placement, template.affinity) == (
        options.placement_option({}), options.task_strategy({}))
    RemoteFunction(_noop, {"num_cpus": 2}).remote()
    assert fake.specs[2].request == {"CPU": 2.0}


def test_warm_up_submits_nothing_and_asks_nothing(fake):
    from miniray import remote_function

    remote_function.warm_up()
    assert fake.specs == [] and fake.asked == [] and fake.created == []
    assert remote_function.warm_up in runtime.WARM_UPS
