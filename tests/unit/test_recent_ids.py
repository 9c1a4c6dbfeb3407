"""``core/recent_ids.RecentIds``: the cancelled call ids a worker keeps, newest ``limit``."""

from __future__ import annotations

from miniray._private.core.recent_ids import DEFAULT_LIMIT, RecentIds


def test_past_the_limit_the_oldest_goes_and_an_id_added_again_is_the_newest():
    marks = RecentIds(limit=3)
    for task_id in (b"1", b"2", b"3"):
        marks.add(task_id)
    marks.add(b"1")  # again: now the newest, so 2 is the oldest
    marks.add(b"4")
    assert list(marks) == [b"3", b"1", b"4"] and len(marks) == 3
    assert b"2" not in marks and b"1" in marks


def test_late_cancels_never_grow_it_past_the_limit():
    marks = RecentIds()
    for n in range(DEFAULT_LIMIT * 3):  # every CANCEL came after its call had ended
        marks.add(n.to_bytes(28, "big"))
    assert len(marks) == DEFAULT_LIMIT
    assert (DEFAULT_LIMIT * 3 - 1).to_bytes(28, "big") in marks


def test_discard_clear_update_and_truth():
    marks = RecentIds(limit=4)
    assert not marks
    marks.update([b"a", b"b"])
    marks.discard(b"a")
    marks.discard(b"never")  # unknown: nothing happens
    assert list(marks) == [b"b"] and marks
    other = RecentIds(limit=4)
    other.update(marks)  # an actor host takes over its worker's marks
    marks.clear()
    assert not marks and list(other) == [b"b"]
