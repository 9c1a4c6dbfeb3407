"""core/node_pick.pick_node: one test per placement rule (peering design 4.3)."""

from __future__ import annotations

import pytest

from miniray._private.core.cluster_view import NodeEntry
from miniray._private.core.node_pick import (
    MOVE_MAX_ARG_BYTES,
    Placement,
    at_least_own,
    less_claims,
    pick_node,
    plan_bundles,
    utilization,
)
from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def node(node_id, cpu=4.0, free=None, gpu=0.0, gpu_free=None, alive=True, **extra):
    ip = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3", "g": "10.0.0.9"}.get(node_id,
                                                                               "10.0.0.8")
    totals = {"CPU": cpu, f"node:{ip}": 1.0, **extra}
    available = {"CPU": cpu if free is None else free, f"node:{ip}": 1.0, **extra}
    if gpu:
        totals["GPU"] = gpu
        available["GPU"] = gpu if gpu_free is None else gpu_free
    return NodeEntry(node_id, ip, 6379, totals=totals, available=available, alive=alive)


def test_local_first_when_it_has_room_now():
    assert pick_node({"CPU": 1}, "a", [node("a"), node("b")]) == Placement("node", "a")


def test_zero_amounts_and_an_empty_request_fit_anywhere():
    assert pick_node({"CPU": 0}, "a", [node("a", free=0)]).node_id == "a"


def test_remote_with_room_when_local_is_full_lowest_utilization_first():
    view = [node("a", free=0), node("b", cpu=4, free=1), node("c", cpu=4, free=3)]
    assert pick_node({"CPU": 1}, "a", view) == Placement("node", "c")


def test_ties_are_broken_by_node_id_for_a_stable_answer():
    view = [node("a", free=0), node("c"), node("b")]
    assert pick_node({"CPU": 1}, "a", view).node_id == "b"


def test_argument_bytes_already_there_come_before_utilization():
    view = [node("a", free=0), node("b", free=1), node("c", free=4)]
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"b": 10 << 20}).node_id == "b"


def test_cpu_only_work_avoids_gpu_nodes_while_others_have_room():
    view = [node("a", free=0), node("g", gpu=2), node("b", free=1)]
    assert pick_node({"CPU": 1}, "a", view).node_id == "b"
    view = [node("a", free=0), node("g", gpu=2), node("b", free=0)]
    assert pick_node({"CPU": 1}, "a", view).node_id == "g"  # none other has room


def test_gpu_work_goes_to_a_gpu_node():
    view = [node("a"), node("g", gpu=2, gpu_free=1)]
    assert pick_node({"CPU": 1, "GPU": 1}, "a", view).node_id == "g"
    assert pick_node({"GPU": 0.5}, "a", view).node_id == "g"


def test_a_node_ip_resource_decides_the_node():
    view = [node("a"), node("b"), node("c")]
    assert pick_node({"CPU": 1, "node:10.0.0.3": 0.001}, "a", view).node_id == "c"
    view[2] = node("c", free=0)
    assert pick_node({"CPU": 1, "node:10.0.0.3": 0.001}, "a", view) == Placement(
        "wait", "c", pick_node({"CPU": 1, "node:10.0.0.3": 0.001}, "a", view).reason)


@pytest.mark.parametrize("as_dict", [False, True])
def test_node_affinity_decides_first(as_dict):
    strategy = ({"node_id": "c", "soft": False} if as_dict
                else NodeAffinitySchedulingStrategy(node_id="c", soft=False))
    view = [node("a"), node("b"), node("c", free=1)]
    assert pick_node({"CPU": 1}, "a", view, strategy) == Placement("node", "c")
    view[2] = node("c", free=0)
    assert pick_node({"CPU": 1}, "a", view, strategy).action == "wait"
    assert pick_node({"CPU": 1}, "a", view, strategy).node_id == "c"


def test_hard_affinity_to_a_dead_or_unknown_or_small_node_is_infeasible():
    strategy = NodeAffinitySchedulingStrategy(node_id="c", soft=False)
    dead = pick_node({"CPU": 1}, "a", [node("a"), node("c", alive=False)], strategy)
    assert dead.action == "infeasible" and "not alive" in dead.reason
    small = pick_node({"CPU": 8}, "a", [node("a", cpu=16), node("c")], strategy)
    assert small.action == "infeasible" and "lacks 8 CPU" in small.reason


def test_soft_affinity_falls_back_to_the_other_rules():
    strategy = NodeAffinitySchedulingStrategy(node_id="zz", soft=True)
    assert pick_node({"CPU": 1}, "a", [node("a"), node("b")], strategy).node_id == "a"
    # Alive with the totals but no room now: Ray's soft rule waits there, unless it may
    # spill (_spill_on_unavailable).
    strategy = NodeAffinitySchedulingStrategy(node_id="b", soft=True)
    full = [node("a"), node("b", free=0)]
    assert pick_node({"CPU": 1}, "a", full, strategy).action == "wait"
    assert pick_node({"CPU": 1}, "a", full, strategy).node_id == "b"
    spill = NodeAffinitySchedulingStrategy("b", soft=True, _spill_on_unavailable=True)
    assert pick_node({"CPU": 1}, "a", full, spill) == Placement("node", "a")
    assert pick_node({"CPU": 1}, "a", [node("a"), node("b")], spill) == Placement("node", "b")
    as_dict = {"node_id": "b", "soft": True, "spill_on_unavailable": True}
    assert pick_node({"CPU": 1}, "a", full, as_dict) == Placement("node", "a")


def test_spread_rotates_among_equally_used_nodes_local_included():
    view = [node("a"), node("b"), node("c")]
    picked = [pick_node({"CPU": 1}, "a", view, "SPREAD", turn=t).node_id for t in range(6)]
    assert picked == ["a", "b", "c", "a", "b", "c"]


def test_spread_prefers_the_least_used_node():
    view = [node("a", free=1), node("b", free=2), node("c", free=4)]
    assert {pick_node({"CPU": 1}, "a", view, "SPREAD", turn=t).node_id
            for t in range(3)} == {"c"}


def test_the_drivers_own_use_counts_in_a_view_that_does_not_show_it_yet():
    view = [node("a", free=3.5), node("b")]  # a shows the driver's first 0.5, b not yet
    own = {"a": {"CPU": 0.5}, "b": {"CPU": 0.5}}
    assert [e.available["CPU"] for e in at_least_own(view, own)] == [3.5, 3.5]
    assert at_least_own([node("a", free=1)], own)[0].available["CPU"] == 1  # shows more
    assert at_least_own(view, {})[1] is view[1]  # untouched
    # SPREAD on it: equal use again, so the turns go round (b took the least used
    # node's turn twice more on the view alone).
    assert [pick_node({"CPU": 0.5}, "a", at_least_own(view, own), "SPREAD", turn=t).node_id
            for t in (2, 3)] == ["a", "b"]
    assert [pick_node({"CPU": 0.5}, "a", view, "SPREAD", turn=t).node_id
            for t in (2, 3)] == ["b", "b"]


def test_wait_locally_when_the_local_node_has_the_totals():
    view = [node("a", free=0), node("b", free=0)]
    assert pick_node({"CPU": 1}, "a", view) == Placement("wait", "a", pick_node(
        {"CPU": 1}, "a", view).reason)


def test_wait_on_the_least_used_remote_node_when_only_remote_nodes_have_the_totals():
    view = [node("a", cpu=1), node("b", cpu=8, free=0)]
    placed = pick_node({"CPU": 4}, "a", view)
    assert placed.action == "wait" and placed.node_id == "b" and "10.0.0.2" in placed.reason
    view = [node("a", cpu=1), node("c", cpu=8, free=3), node("b", cpu=8, free=2)]
    assert pick_node({"CPU": 4}, "a", view).node_id == "c"  # more free there
    view = [node("a", cpu=1), node("c", cpu=8, free=2), node("b", cpu=8, free=2)]
    assert pick_node({"CPU": 4}, "a", view).node_id == "b"  # a tie: the node id


def test_the_local_ledgers_no_room_overrides_the_views_available():
    # The view says the local node is idle (a heartbeat ago); its ledger said "no room".
    view = [node("a"), node("b", free=1)]
    assert pick_node({"CPU": 1}, "a", view) == Placement("node", "a")
    assert pick_node({"CPU": 1}, "a", view, local_room=False) == Placement("node", "b")
    full = [node("a"), node("b", free=0)]
    assert pick_node({"CPU": 1}, "a", full, local_room=False).action == "wait"
    assert pick_node({"CPU": 1}, "a", full, local_room=False).node_id == "a"
    # And the other way: the view is behind a release, the ledger has room.
    assert pick_node({"CPU": 1}, "a", [node("a", free=0), node("b")],
                     local_room=True) == Placement("node", "a")


def test_locality_a_task_with_large_arguments_here_waits_here_for_room():
    view = [node("a", free=0), node("b")]
    big = {"a": MOVE_MAX_ARG_BYTES + 1}
    placed = pick_node({"CPU": 1}, "a", view, arg_bytes=big)
    assert placed.action == "wait" and placed.node_id == "a" and "MiB" in placed.reason
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"a": MOVE_MAX_ARG_BYTES}) == Placement(
        "node", "b")
    # Not for SPREAD, and not when this node could never hold it.
    assert pick_node({"CPU": 1}, "a", view, "SPREAD", arg_bytes=big).node_id == "b"
    assert pick_node({"CPU": 8}, "a", [node("a", free=0), node("b", cpu=8)],
                     arg_bytes=big) == Placement("node", "b")


def test_locality_large_arguments_kept_on_another_node_take_the_task_there():
    """Rule 2's exception (issue 16): a result kept on the node that made it."""
    view = [node("a"), node("b"), node("c")]
    big = MOVE_MAX_ARG_BYTES + 1
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"b": big}) == Placement("node", "b")
    # Small arguments elsewhere, or at most as many as here: local first, as before.
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"b": MOVE_MAX_ARG_BYTES}).node_id == "a"
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"a": big, "b": big}).node_id == "a"
    # Mixed: the bytes weigh; the most bytes first, the node id breaks ties.
    assert pick_node({"CPU": 1}, "a", view,
                     arg_bytes={"a": big, "b": 2 * big, "c": 3 * big}).node_id == "c"
    assert pick_node({"CPU": 1}, "a", view, arg_bytes={"c": big, "b": big}).node_id == "b"
    # That node has no room now: local (the argument comes here), not a wait there.
    full = [node("a"), node("b", free=0)]
    assert pick_node({"CPU": 1}, "a", full, arg_bytes={"b": big}).node_id == "a"
    # SPREAD and a hard affinity keep their own rules.
    assert pick_node({"CPU": 1}, "a", view, "SPREAD", arg_bytes={"b": big}).node_id == "a"
    strategy = NodeAffinitySchedulingStrategy("c", soft=False)
    assert pick_node({"CPU": 1}, "a", view, strategy, arg_bytes={"b": big}).node_id == "c"
    # A node that can never hold the request is never chosen for its bytes.
    small = [node("a"), node("b", cpu=0.5)]
    assert pick_node({"CPU": 1}, "a", small, arg_bytes={"b": big}).node_id == "a"


def test_less_claims_brings_this_drivers_own_use_up_to_date_in_a_stale_view():
    view = [node("a"), node("b", free=2)]  # b: 4 CPUs, 2 free as of its heartbeat
    # 1.5 CPUs of its own tasks there since that heartbeat: 0.5 free.
    claimed = less_claims(view, {"b": {"CPU": 1.5}})
    assert claimed[0] is view[0] and claimed[1].available["CPU"] == 0.5
    assert view[1].available["CPU"] == 2  # the view itself is left as it was
    assert less_claims(view, {"b": {"CPU": 5}})[1].available["CPU"] == 0.0
    # The heartbeat showed its 2 tasks (seen): as the view says while they run, all 4
    # CPUs once they ended (the 2 others used are this driver's, not another's).
    assert less_claims(view, {"b": {"CPU": 2}}, {"b": {"CPU": 2}})[1].available["CPU"] == 2
    assert less_claims(view, {}, {"b": {"CPU": 2}})[1].available["CPU"] == 4
    # One of its 2 ended, and another driver's use shows: 2 used by others, 1 by it.
    assert less_claims(view, {"b": {"CPU": 1}}, {"b": {"CPU": 0}})[1].available[
        "CPU"] == 1
    assert pick_node({"CPU": 1}, "a", less_claims(view, {"b": {"CPU": 2}}),
                     local_room=False).action == "wait"


def test_utilization_is_the_largest_used_fraction_of_what_is_asked():
    entry = node("g", cpu=4, free=3, gpu=2, gpu_free=0)
    assert utilization(entry, {"CPU": 1}) == 0.25
    assert utilization(entry, {"CPU": 1, "GPU": 1}) == 1.0
    assert utilization(entry, {}) == 0.25


def test_infeasible_everywhere_names_every_nodes_totals():
    view = [node("a", cpu=2), node("b", cpu=4), node("c", cpu=64, alive=False)]
    placed = pick_node({"CPU": 8}, "a", view)
    assert placed.action == "infeasible"
    assert "8 CPU" in placed.reason
    assert "10.0.0.1 has 2 CPU" in placed.reason and "10.0.0.2 has 4 CPU" in placed.reason
    assert "10.0.0.3" not in placed.reason  # dead nodes do not count
    assert "node:" not in placed.reason
    view = [node("a", memory=3 * (1 << 30))]
    assert "3.0 GiB memory" in pick_node({"CPU": 8}, "a", view).reason


def test_a_dead_node_is_never_picked():
    view = [node("a", free=0), node("b", alive=False)]
    assert pick_node({"CPU": 1}, "a", view).action == "wait"


def test_a_driver_without_a_local_node():
    assert pick_node({"CPU": 1}, None, [node("b", free=0), node("c")]).node_id == "c"
    assert pick_node({"CPU": 1}, None, [node("b", free=0)]).action == "wait"


# -- plan_bundles: a placement group's bundles across nodes --------------
ONE = {"CPU": 1}


def test_strict_pack_puts_every_bundle_on_one_node_local_first():
    view = [node("b"), node("a")]
    assert plan_bundles([ONE, ONE], "STRICT_PACK", "a", view) == (["a", "a"], "")
    view = [node("a", free=1), node("b", free=3)]
    assert plan_bundles([ONE, ONE], "STRICT_PACK", "a", view) == (["b", "b"], "")
    nodes, why = plan_bundles([ONE, ONE], "STRICT_PACK", "a", [node("a", free=1),
                                                              node("b", free=1)])
    assert nodes is None and "no node has room" in why
    nodes, why = plan_bundles([{"CPU": 3}] * 2, "STRICT_PACK", "a", [node("a"), node("b")])
    assert nodes is None and why.startswith("never: STRICT_PACK")


def test_pack_stays_on_one_node_while_it_fits_then_spills_to_few_nodes():
    view = [node("a", free=2), node("b", free=1), node("c", free=4)]
    assert plan_bundles([ONE] * 3, "PACK", "a", view) == (["c", "c", "c"], "")
    assert plan_bundles([ONE] * 2, "PACK", "a", view) == (["a", "a"], "")
    view = [node("a", free=2), node("b", free=2), node("c", free=1)]
    assert plan_bundles([ONE] * 4, "PACK", "a", view) == (["a", "a", "b", "b"], "")
    assert plan_bundles([ONE] * 6, "PACK", "a", view)[0] is None


def test_spread_prefers_a_node_of_its_own_and_shares_when_it_must():
    view = [node("a"), node("b"), node("c", free=0)]
    assert plan_bundles([ONE] * 2, "SPREAD", "a", view) == (["a", "b"], "")
    assert plan_bundles([ONE] * 3, "SPREAD", "a", view) == (["a", "b", "a"], "")


def test_strict_spread_needs_a_node_per_bundle():
    view = [node("a"), node("b"), node("c")]
    assert plan_bundles([ONE] * 3, "STRICT_SPREAD", "a", view) == (["a", "b", "c"], "")
    busy = [node("a"), node("b"), node("c", free=0)]
    nodes, why = plan_bundles([ONE] * 3, "STRICT_SPREAD", "a", busy)
    assert nodes is None and why.startswith("no room now")  # c may free up: it waits
    nodes, why = plan_bundles([ONE] * 4, "STRICT_SPREAD", "a", view)
    assert nodes is None and why.startswith("never: STRICT_SPREAD")
    dead = [node("a"), node("b", alive=False)]
    assert plan_bundles([ONE] * 2, "STRICT_SPREAD", "a", dead)[1].startswith("never")


def test_a_bundle_no_node_can_ever_hold_is_never():
    nodes, why = plan_bundles([ONE, {"GPU": 1}], "PACK", "a", [node("a"), node("b")])
    assert nodes is None and why.startswith("never: bundle 1 (1 GPU)")
    assert plan_bundles([ONE, {"GPU": 1}], "SPREAD", "a", [node("a"), node("g", gpu=1)]) == (
        ["a", "g"], "")
