"""The pure decisions of tasks on other hosts: which tasks go to another node
(``owner/remote_nodes.placement_for``) and which options name one (``options.hard_affinity``)."""

from __future__ import annotations

import doctest

from miniray._private.core import options
from miniray._private.core.cluster_view import NodeEntry
from miniray._private.core.task_spec import TaskSpec
from miniray._private.owner import remote_nodes
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

HERE = NodeEntry("here", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 2})
THERE = NodeEntry("there", "10.0.0.2", 1, totals={"CPU": 2, "GPU": 1},
                  available={"CPU": 0, "GPU": 1})
DEAD = NodeEntry("dead", "10.0.0.3", 1, totals={"CPU": 2}, available={"CPU": 2},
                 alive=False)
VIEW = [HERE, THERE, DEAD]


def test_doctests():
    assert doctest.testmod(remote_nodes).failed == 0


def test_another_alive_node_with_the_totals_is_taken_even_when_full_now():
    assert remote_nodes.placement_for("there", {"CPU": 1}, "here", VIEW) == "there"
    assert remote_nodes.placement_for("there", {"GPU": 1}, "here", VIEW) == "there"


def test_everything_else_goes_the_local_way_as_before():
    place = remote_nodes.placement_for
    assert place("here", {"CPU": 1}, "here", VIEW) is None  # the driver's own node
    assert place("dead", {"CPU": 1}, "here", VIEW) is None
    assert place("unknown", {"CPU": 1}, "here", VIEW) is None
    assert place("there", {"CPU": 4}, "here", VIEW) is None  # lacks the totals
    assert place(None, {"CPU": 1}, "here", VIEW) is None
    assert place("there", {"CPU": 1}, "here", []) is None  # no view (a one-host driver)


def test_hard_affinity_reads_only_a_hard_node_affinity():
    assert options.hard_affinity({}) is None
    assert options.hard_affinity({"scheduling_strategy": "SPREAD"}) is None
    soft = NodeAffinitySchedulingStrategy("ab" * 28, soft=True)
    hard = NodeAffinitySchedulingStrategy("ab" * 28, soft=False)
    assert options.hard_affinity({"scheduling_strategy": soft}) is None
    assert options.hard_affinity({"scheduling_strategy": hard}) == "ab" * 28
    assert options.hard_affinity({"scheduling_strategy": NodeAffinitySchedulingStrategy(
        "", soft=False)}) is None


def test_a_task_spec_carries_its_affinity_through_pickling():
    import pickle

    spec = TaskSpec(b"t", b"f", None, "f", "f", b"", [], [b"r"], 1, {"CPU": 1.0}, 3, False,
                    0)
    assert spec.affinity is None
    spec.affinity = "there"
    assert pickle.loads(pickle.dumps(spec)).affinity == "there"
