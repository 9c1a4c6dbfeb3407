"""The worker's per-task shortcuts give what the general path gives.

A returned None skips the pickler (``worker_main._NONE_PAYLOAD``) only where the general path
would have sent it inline; ``OMP_NUM_THREADS`` is written only when it differs, and still
reset when a task changed it.
"""

from __future__ import annotations

import os
import types

from miniray._private.core import oob, protocol
from miniray._private.worker import worker_main


def _general_payload(object_id, value, may_keep=True):
    return oob.inline_blob(oob.serialize(value))


def _stub(none_inline: bool):
    runtime = types.SimpleNamespace(payload_for=_general_payload)
    return types.SimpleNamespace(none_inline=none_inline, runtime=runtime, pid=1,
                                 info={}, user_set_omp=False, noset_cvd=True)


def test_none_payload_is_the_general_paths_and_loads_as_none():
    assert worker_main._NONE_PAYLOAD == _general_payload(b"x", None)
    assert oob.loads_inline(worker_main._NONE_PAYLOAD) is None


def test_returned_none_gives_the_same_result_items_with_and_without_the_shortcut():
    ids = [b"a" * 28, b"b" * 28]
    for value, count in ((None, 1), ((None, 3), 2), ([1, None], 2)):
        fast = worker_main._Worker._serialize_returns(_stub(True), value, count, "f", ids)
        slow = worker_main._Worker._serialize_returns(_stub(False), value, count, "f", ids)
        assert fast == slow
        assert all(item[0] == protocol.OK for item in fast)


def test_no_shortcut_below_the_inline_threshold():
    calls = []
    stub = _stub(False)
    stub.runtime.payload_for = lambda object_id, value, may_keep: calls.append(value) or b"p"
    worker_main._Worker._serialize_returns(stub, None, 1, "f", [b"a" * 28])
    assert calls == [None]


def test_omp_threads_is_reset_for_each_task_when_a_task_changed_it(monkeypatch):
    # setenv first: it records the variable's absence, so the test's writes are undone
    # (a delenv of an unset variable records nothing, and a later test's workers would
    # inherit OMP_NUM_THREADS as if the user had set it)
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.delenv("OMP_NUM_THREADS")
    stub = _stub(True)
    worker_main._Worker._set_env(stub, {"CPU": 2.0}, None)
    assert os.environ["OMP_NUM_THREADS"] == "2"
    os.environ["OMP_NUM_THREADS"] = "7"  # what a task may do
    worker_main._Worker._set_env(stub, {"CPU": 2.0}, None)
    assert os.environ["OMP_NUM_THREADS"] == "2"
    worker_main._Worker._set_env(stub, {"CPU": 0.5}, None)
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_set_env_records_when_the_next_task_may_skip_it(monkeypatch):
    # run_task skips _set_env while the request equals env_for and OMP_NUM_THREADS is still
    # omp_now; a GPU task (its ids set per task) leaves nothing to compare with
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.delenv("OMP_NUM_THREADS")
    stub = _stub(True)
    worker_main._Worker._set_env(stub, {"CPU": 2.0}, None)
    assert stub.env_for == {"CPU": 2.0} and stub.omp_now == b"2"
    worker_main._Worker._set_env(stub, {"CPU": 1.0, "GPU": 1.0}, ["0"])
    assert stub.env_for is None
    user = types.SimpleNamespace(user_set_omp=True, noset_cvd=True)
    worker_main._Worker._set_env(user, {"CPU": 1.0}, None)
    assert user.env_for == {"CPU": 1.0} and user.omp_now is None  # the user's value stays


def test_the_no_argument_blob_is_what_a_call_without_arguments_sends():
    from miniray._private.core import serialization

    blob = serialization.pack_arguments((), {}, "f", type(None))[0]
    assert blob == worker_main._NO_ARGS_BLOB
    assert serialization.loads_arguments(blob) == ((), {})
    serializers = types.SimpleNamespace(stale=False, changed=lambda: None)
    stub = types.SimpleNamespace(serializers=serializers)
    args, kwargs = worker_main._Worker._load_args(stub, blob, None)
    assert (args, kwargs) == ((), {})
    kwargs["x"] = 1  # each call gets its own kwargs
    assert worker_main._Worker._load_args(stub, blob, None)[1] == {}


def test_result_message_of_one_and_of_several_results():
    from miniray._private.worker.execute import result_message

    one = result_message(b"t", [(protocol.OK, b"v", ())], False)
    assert one == (protocol.RESULT, b"t", [(protocol.OK, b"v")], False, None, None)
    held = result_message(b"t", [(protocol.OK, b"v", (b"r",))], True)
    assert held[2] == [(protocol.OK, b"v")] and held[4] == [(b"r",)]
    error = result_message(b"t", [(protocol.ERR, b"e")], False)  # an error has no third item
    assert error[2] == [(protocol.ERR, b"e")] and error[4] is None
    several = result_message(b"t", [(protocol.OK, b"a", ()), (protocol.OK, b"b", (b"r",))],
                             False)
    assert several[2] == [(protocol.OK, b"a"), (protocol.OK, b"b")]
    assert several[4] == [(), (b"r",)]
