"""The decisions and wording of the waiting notice (``core/wait_notice.py``), without
processes: when a shape is due, aggregation by shape, repeats, the backlog rule, demands.

Ray 2.60 prints nothing while a task waits for resources (compared: a task queued behind an
actor holding the only CPU stays silent); this notice is miniray's own."""

from __future__ import annotations

from miniray._private.core.wait_notice import (
    Entry,
    Holder,
    WaitTracker,
    demands,
    format_notice,
    only_own_backlog,
)

CPU1 = (("CPU", 1.0),)
GPU1 = (("CPU", 1.0), ("GPU", 1.0))


def entry(key, head, count=1, shape=CPU1, name="f"):
    return Entry(key, head, count, shape, name)


def test_due_once_past_the_threshold_then_at_most_every_repeat():
    tracker = WaitTracker(threshold_s=5.0, repeat_s=30.0)
    entries = [entry("k", "t1", 3)]
    tracker.observe(0.0, entries)
    assert tracker.due(4.9, entries) == []
    tracker.observe(5.0, entries)
    assert tracker.due(5.0, entries) == [(CPU1, 3, ["f"], 5.0)]
    tracker.observe(20.0, entries)
    assert tracker.due(20.0, entries) == []  # named 15 s ago
    tracker.observe(35.0, entries)
    assert tracker.due(35.0, entries) == [(CPU1, 3, ["f"], 35.0)]


def test_progress_restarts_the_wait_and_a_gone_entry_is_forgotten():
    tracker = WaitTracker(threshold_s=5.0)
    tracker.observe(0.0, [entry("k", "t1")])
    moved = [entry("k", "t2")]  # the head was dispatched: the queue moves
    tracker.observe(4.0, moved)
    assert tracker.due(8.0, moved) == []
    tracker.observe(9.0, [])
    again = [entry("k", "t2")]
    tracker.observe(10.0, again)
    assert tracker.due(14.0, again) == []


def test_one_line_per_shape_aggregates_keys_and_names():
    tracker = WaitTracker(threshold_s=1.0)
    entries = [entry("a", 1, 2, name="f"), entry("b", 2, 3, name="g"),
               entry(("actor", 9), 9, 1, name="actor A"), entry("c", 3, 1, GPU1, "h")]
    tracker.observe(0.0, entries)
    due = sorted(tracker.due(2.0, entries))
    assert due == [(CPU1, 6, ["f", "g", "actor A"], 2.0), (GPU1, 1, ["h"], 2.0)]


def test_zero_threshold_turns_it_off():
    tracker = WaitTracker(threshold_s=0)
    tracker.observe(0.0, [entry("k", 1)])
    assert tracker.due(100.0, [entry("k", 1)]) == []


def test_a_backlog_behind_own_leases_of_the_shape_is_no_news():
    own = [Holder(5, CPU1, "CPU=1"), Holder(5, CPU1, "CPU=1")]
    assert only_own_backlog(CPU1, own, 5)
    assert not only_own_backlog(CPU1, own + [Holder(7, CPU1, "CPU=1")], 5)  # another driver
    assert not only_own_backlog(CPU1, [Holder(5, CPU1, "actor A")], 5)  # an actor holds it
    assert not only_own_backlog(CPU1, [], 5)  # nothing holds it: worth a word
    assert only_own_backlog(CPU1, own + [Holder(7, (("GPU", 1.0),), "x")], 5)  # unrelated


def test_the_notice_names_shape_holders_and_whose_they_are():
    holders = [Holder(7, (("CPU", 2.0),), "CPU=2"), Holder(5, CPU1, "actor A"),
               Holder(7, (("CPU", 1.0),), "CPU=1"), Holder(7, (("GPU", 1.0),), "GPU=1"),
               Holder(7, (("CPU", 2.0),), "CPU=2")]
    line = format_notice(CPU1, 4, ["f", "g", "h", "i"], 6.4, holders, 5, "MINIRAY_WAIT_NOTICE_S")
    assert line.startswith("miniray: 4 task(s)/actor(s) (f, g, h and 1 more) have waited 6s "
                           "for {CPU=1}; CPU held by this driver (pid 5): 1 lease {CPU=1} "
                           "[actor A]; another driver (pid 7): 1 lease {CPU=1}, 2 leases "
                           "{CPU=2}. (MINIRAY_WAIT_NOTICE_S")
    assert "GPU=1" not in line  # holds nothing the shape needs
    assert "\n" not in line
    nothing = format_notice(GPU1, 1, ["h"], 5, [], 5, "E")
    assert "no lease holds CPU, GPU now" in nothing
    free = format_notice((), 2, ["z"], 5, holders, 5, "E")
    assert "for {(no resources)}; they need no resources: they wait for a worker" in free


def test_demands_count_per_name_and_shape():
    rows = demands([("f", CPU1, False, 2), ("f", CPU1, False, 1), ("g", GPU1, False, 1),
                    ("f", GPU1, False, 1), ("h", (("CPU", 64.0),), True, 1)])
    assert rows == [["f", "CPU=1", 3, False], ["f", "CPU=1, GPU=1", 1, False],
                    ["g", "CPU=1, GPU=1", 1, False], ["h", "CPU=64", 1, True]]


def test_the_nodes_actor_service_is_named_as_such():
    holders = [Holder(9, CPU1, "actor N name=nn")]
    line = format_notice(CPU1, 1, ["actor M"], 5, holders, 5, "E", service_pid=9)
    assert "CPU held by the node's actor service (pid 9): 1 lease {CPU=1} [actor N name=nn]" \
        in line
