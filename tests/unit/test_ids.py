"""``core/ids.py``: id layouts and the public ``TaskID``/``ActorID``/``JobID`` (no processes).

Compared with Ray 2.60: the layouts (task = 8 unique bytes + actor id; a normal task's actor
part is ``ffffffffffffffffffffffff01000000``), reprs, nil rules and errors are Ray's.
"""

from __future__ import annotations

import pickle

import pytest

import miniray
from miniray._private.core import ids


def test_public_id_classes_are_exported_under_miniray():
    for cls in (miniray.TaskID, miniray.ActorID, miniray.JobID):
        assert cls.__module__ == "miniray" and cls.__name__ in miniray.__all__


def test_normal_task_id_layout():
    task = miniray.TaskID(ids.new_task_id())
    assert task.size() == 24 and len(task.hex()) == 48
    assert task.actor_id() == miniray.ActorID.from_hex("ff" * 12 + "01000000")
    assert not task.actor_id().is_nil() and not task.is_nil()
    assert task.job_id() == miniray.JobID.from_int(1) and task.job_id().hex() == "01000000"


def test_actor_task_id_names_its_actor():
    actor_id = ids.new_actor_id()
    assert len(actor_id) == 16 and actor_id.endswith(bytes.fromhex("01000000"))
    task = miniray.TaskID(ids.new_actor_task_id(actor_id))
    assert task.actor_id() == miniray.ActorID(actor_id)
    assert task.actor_id().job_id == miniray.JobID.from_int(1)  # a property, as in Ray


def test_value_semantics_repr_and_pickling():
    raw = ids.new_task_id()
    task = miniray.TaskID(raw)
    assert task == miniray.TaskID.from_binary(raw) == miniray.TaskID.from_hex(raw.hex())
    assert hash(task) == hash(miniray.TaskID(raw))
    assert task != raw and task != raw.hex() and task != miniray.TaskID.nil()
    assert repr(task) == str(task) == f"TaskID({raw.hex()})"
    assert pickle.loads(pickle.dumps(task)) == task
    assert miniray.JobID.from_int(1).int() == 1
    assert repr(miniray.ActorID.nil()) == "ActorID(" + "ff" * 16 + ")"


def test_nil_ids_and_bad_input():
    nil = miniray.TaskID.nil()
    assert nil.is_nil() and nil.actor_id().is_nil()
    with pytest.raises(ValueError, match="TaskID is nil"):
        nil.job_id()
    with pytest.raises(ValueError, match="ActorID is nil"):
        miniray.ActorID.nil().job_id  # noqa: B018 - a property
    with pytest.raises(ValueError, match="ID string needs to have length 24, got 3"):
        miniray.TaskID(b"abc")
    with pytest.raises(TypeError, match="expected bytes"):
        miniray.TaskID("ab" * 24)
    with pytest.raises(ValueError, match="48 hex digits"):
        miniray.TaskID.from_hex("zz")


def test_unique_part_never_repeats_across_a_new_prefix(monkeypatch):
    monkeypatch.setattr(ids, "_COUNTER_LIMIT", 4)
    made = [ids.new_task_id() for _ in range(50)]
    assert len(set(made)) == 50
    assert len({task[:5] for task in made}) > 1  # the prefix was drawn again


# Sizes, nil reprs and which classes have from_random() were compared with Ray 2.60.
@pytest.mark.parametrize("name,size,has_random", [
    ("NodeID", 28, True), ("JobID", 4, False), ("TaskID", 24, False), ("ActorID", 16, True),
    ("WorkerID", 28, True), ("PlacementGroupID", 18, True), ("UniqueID", 28, True),
    ("FunctionID", 28, True), ("ActorClassID", 28, True),
])
def test_top_level_id_classes_as_in_ray(name, size, has_random):
    cls = getattr(miniray, name)
    assert name in miniray.__all__ and cls.__module__ == "miniray"
    assert cls.size() == size
    nil = cls.nil()
    assert nil.is_nil() and nil.binary() == b"\xff" * size
    assert repr(nil) == f"{name}({'ff' * size})"
    assert cls.from_hex(nil.hex()) == nil and cls.from_binary(nil.binary()) == nil
    assert hasattr(cls, "from_random") == has_random
    if has_random:
        one, two = cls.from_random(), cls.from_random()
        assert type(one) is cls and len(one.binary()) == size and one != two
        assert not one.is_nil() and pickle.loads(pickle.dumps(one)) == one
        assert cls.from_hex(one.hex()) == one and hash(cls(one.binary())) == hash(one)


def test_object_id_is_object_ref_as_in_ray():
    assert miniray.ObjectID is miniray.ObjectRef and "ObjectID" in miniray.__all__
    assert miniray.ObjectID.nil().is_nil() and len(miniray.ObjectID.from_random().hex()) == 56


def test_worker_id_is_a_unique_id_but_never_equal_to_one():
    # As Ray: WorkerID subclasses UniqueID; ids of different classes never compare equal.
    assert issubclass(miniray.WorkerID, miniray.UniqueID)
    assert miniray.WorkerID.nil() != miniray.UniqueID.nil()


def test_object_ref_size_is_a_class_method_as_in_ray():
    assert miniray.ObjectRef.size() == 28 and miniray.ObjectID.size() == 28
    assert miniray.ObjectRef.nil().size() == 28


def test_task_ids_cost_no_system_call_and_a_forked_child_draws_its_own(monkeypatch):
    """Making a task id reads no pid (a ``getpid`` per task was measurable on the submission
    path); a forked child still never continues its parent's prefix and counter."""
    import os

    calls = []
    real_getpid = os.getpid
    monkeypatch.setattr(ids.os, "getpid", lambda: calls.append(1) or real_getpid())
    parent = [ids.new_task_id() for _ in range(100)]
    assert calls == []
    assert len(set(parent)) == 100

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first id, leave without running pytest's teardown
        try:
            os.write(write_end, ids.new_task_id()[:5])
        finally:
            os._exit(0)
    os.close(write_end)
    child_prefix = os.read(read_end, 5)
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child_prefix) == 5 and child_prefix != parent[-1][:5]


def test_a_nodes_later_drivers_make_ids_of_their_own_job():
    assert ids.job_id_for(1) == "01000000" and ids.job_id_for(2) == "02000000"
    assert ids.job_id_for(258) == "02010000"  # little-endian, as JobID.from_int
    assert ids.JobID.from_hex(ids.job_id_for(7)).int() == 7
    try:
        ids.set_job_id("02000000")
        assert ids.JOB_ID == "02000000"
        task = ids.TaskID(ids.new_task_id())
        assert task.job_id().hex() == "02000000"
        assert task.actor_id().hex() == "ff" * 12 + "02000000"
        assert ids.ActorID(ids.new_actor_id()).job_id.hex() == "02000000"
        with pytest.raises(ValueError, match="4 bytes"):
            ids.set_job_id("0200")
    finally:
        ids.set_job_id(ids.job_id_for(1))
    assert ids.TaskID(ids.new_task_id()).job_id().hex() == "01000000"
