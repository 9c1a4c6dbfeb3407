"""Pure resource arithmetic and allocation decisions (no processes, no files)."""

from __future__ import annotations

import pytest

from miniray._private.core.resources import (
    UNIT,
    UNIT_INSTANCE_RESOURCES,
    Allocation,
    Lease,
    NodeState,
    format_infeasible,
    from_units,
    infeasible_reasons,
    node_totals,
    plan_allocation,
    to_units,
)


def make_state(cpu=2.0, gpus=0, ids=None, **custom) -> NodeState:
    totals = {"CPU": to_units(cpu)}
    instance_ids = {}
    if gpus:
        totals["GPU"] = gpus * UNIT
        instance_ids["GPU"] = ids or [str(i) for i in range(gpus)]
    for name, amount in custom.items():
        totals[name] = to_units(amount)
    return NodeState(totals=totals, instance_ids=instance_ids, leases={})


_next_id = [0]


def take(state: NodeState, request: dict) -> Allocation | None:
    """plan_allocation, then record the allocation in the state as the ledger would."""
    alloc = plan_allocation(state, request)
    if alloc is not None:
        _next_id[0] += 1
        lid = f"l{_next_id[0]}"
        state.leases[lid] = Lease(lid, 1, None, None, dict(alloc.resources), alloc.instances)
    return alloc


def gpu_indices(alloc: Allocation) -> list[int]:
    return [i for i, _ in alloc.instances.get("GPU", [])]


# -- fixed point ----------------------------------------------------------------------------


def test_fixed_point_has_no_residue():
    assert to_units(0.1) + to_units(0.2) == to_units(0.3) == 3000
    assert from_units(to_units(0.1) + to_units(0.2)) == 0.3
    assert to_units(1) == UNIT
    assert to_units(0.0001) == 1
    assert to_units(0.00004) == 0  # below the resolution
    assert from_units(to_units(1 / 3)) == 0.3333
    total = 0
    for _ in range(10):
        total += to_units(0.1)
    assert total == UNIT


def test_unit_instance_names():
    assert "GPU" in UNIT_INSTANCE_RESOURCES and "neuron_cores" in UNIT_INSTANCE_RESOURCES
    assert "CPU" not in UNIT_INSTANCE_RESOURCES


def test_state_used_available_and_json_roundtrip():
    state = make_state(cpu=4, gpus=2)
    take(state, {"CPU": 1.5, "GPU": 0.25})
    take(state, {"CPU": 1})
    assert state.used() == {"CPU": 25000, "GPU": 2500}
    assert state.available() == {"CPU": 15000, "GPU": 17500}
    assert state.instance_free("GPU") == [7500, UNIT]
    assert state.instance_free("TPU") == []
    again = NodeState.from_json(state.to_json())
    assert again == state
    lease = next(iter(state.leases.values()))
    assert Lease.from_json(lease.to_json()) == lease
    assert isinstance(Lease.from_json(lease.to_json()).instances["GPU"][0], tuple)


# -- packing --------------------------------------------------------------------------------


def test_three_halves_on_three_gpus_pack_first_gpu():
    state = make_state(cpu=8, gpus=3)
    got = [gpu_indices(take(state, {"CPU": 1, "GPU": 0.5})) for _ in range(3)]
    assert got == [[0], [0], [1]]


def test_four_halves_on_two_gpus():
    state = make_state(cpu=8, gpus=2)
    got = [gpu_indices(take(state, {"GPU": 0.5})) for _ in range(4)]
    assert got == [[0], [0], [1], [1]]
    assert plan_allocation(state, {"GPU": 0.5}) is None


def test_four_quarters_fit_one_gpu():
    state = make_state(cpu=8, gpus=1)
    got = [gpu_indices(take(state, {"GPU": 0.25})) for _ in range(4)]
    assert got == [[0]] * 4
    assert state.instance_free("GPU") == [0]
    assert plan_allocation(state, {"GPU": 0.0001}) is None


def test_best_fit_prefers_fullest_gpu_that_fits():
    state = make_state(cpu=8, gpus=3)
    take(state, {"GPU": 1})  # [0] full
    take(state, {"GPU": 0.3})  # -> [1]
    take(state, {"GPU": 0.6})  # [1] has 0.7 free, fits -> [1]
    assert state.instance_free("GPU") == [0, 1000, UNIT]
    assert gpu_indices(take(state, {"GPU": 0.5})) == [2]  # [1] has only 0.1
    assert gpu_indices(take(state, {"GPU": 0.1})) == [1]  # exact fit beats [2]'s 0.5


def test_whole_requests_take_completely_free_gpus_lowest_first():
    state = make_state(cpu=8, gpus=4)
    assert gpu_indices(take(state, {"GPU": 0.5})) == [0]
    alloc = take(state, {"GPU": 2})
    assert gpu_indices(alloc) == [1, 2]
    assert alloc.instances["GPU"] == [(1, UNIT), (2, UNIT)]
    assert alloc.resources["GPU"] == 2 * UNIT
    # Two GPUs are not completely free any more, though 1.5 GPU is available in total.
    assert state.available()["GPU"] == 15000
    assert plan_allocation(state, {"GPU": 2}) is None
    assert gpu_indices(take(state, {"GPU": 1})) == [3]


def test_mix_of_half_and_whole():
    state = make_state(cpu=8, gpus=2)
    assert gpu_indices(take(state, {"GPU": 0.5})) == [0]
    assert gpu_indices(take(state, {"GPU": 1})) == [1]
    assert plan_allocation(state, {"GPU": 1}) is None  # [0] is half taken
    assert gpu_indices(take(state, {"GPU": 0.5})) == [0]
    assert plan_allocation(state, {"GPU": 0.5}) is None


def test_never_more_than_one_instance():
    state = make_state(cpu=100, gpus=3)
    for amount in (0.3, 0.7, 0.45, 0.2, 1, 0.55, 0.1, 0.9, 0.35, 0.05) * 3:
        take(state, {"GPU": amount})
        for free in state.instance_free("GPU"):
            assert 0 <= free <= UNIT
    per_instance = [0, 0, 0]
    for lease in state.leases.values():
        for index, u in lease.instances["GPU"]:
            per_instance[index] += u
    assert all(u <= UNIT for u in per_instance)
    assert sum(per_instance) == state.used()["GPU"] <= state.totals["GPU"]


def test_fraction_above_one_is_an_error():
    state = make_state(cpu=8, gpus=4)
    with pytest.raises(ValueError, match="fraction above 1"):
        plan_allocation(state, {"GPU": 1.5})
    with pytest.raises(ValueError):
        infeasible_reasons(state, {"GPU": 2.25})
    with pytest.raises(ValueError):
        plan_allocation(state, {"CPU": -1})


def test_non_instance_resources_and_zero_entries():
    state = make_state(cpu=2, custom_thing=1)
    assert plan_allocation(state, {"CPU": 0, "GPU": 0, "nope": 0}) == Allocation({}, {})
    alloc = take(state, {"CPU": 1.5, "custom_thing": 0.5})
    assert alloc.resources == {"CPU": 15000, "custom_thing": 5000}
    assert alloc.instances == {}
    assert plan_allocation(state, {"CPU": 1}) is None
    assert plan_allocation(state, {"CPU": 0.5, "custom_thing": 0.5}) is not None
    assert plan_allocation(state, {"missing": 1}) is None
    assert plan_allocation(state, {"GPU": 0.5}) is None  # node has no GPUs


def test_oversubscribed_cpu_blocks_new_requests():
    state = make_state(cpu=1)
    take(state, {"CPU": 1})
    next(iter(state.leases.values())).resources["CPU"] = 2 * UNIT  # grown by adjust()
    assert state.available()["CPU"] == -UNIT
    assert plan_allocation(state, {"CPU": 0.5}) is None
    assert plan_allocation(state, {}) == Allocation({}, {})


# -- infeasibility --------------------------------------------------------------------------


def test_infeasible_reasons():
    state = make_state(cpu=2, gpus=2)
    take(state, {"CPU": 2, "GPU": 2})  # busy does not matter: reasons are about an idle node
    assert infeasible_reasons(state, {"CPU": 1, "GPU": 2}) == []
    assert infeasible_reasons(state, {"CPU": 1, "GPU": 0.5}) == []
    assert infeasible_reasons(state, {"CPU": 1, "GPU": 3}) == [("GPU", 3.0, 2.0)]
    assert infeasible_reasons(state, {"custom": 1}) == [("custom", 1.0, 0.0)]
    assert infeasible_reasons(state, {"CPU": 1, "accelerator_type:V100": 0.001}) == [
        ("accelerator_type:V100", 0.001, 0.0)
    ]
    assert infeasible_reasons(state, {"CPU": 2.5}) == [("CPU", 2.5, 2.0)]
    assert infeasible_reasons(state, {"CPU": 2.0001}) == [("CPU", 2.0001, 2.0)]
    assert infeasible_reasons(make_state(cpu=0), {"CPU": 0.5}) == [("CPU", 0.5, 0.0)]
    assert infeasible_reasons(make_state(cpu=2), {"GPU": 0.5}) == [("GPU", 0.5, 0.0)]
    assert infeasible_reasons(make_state(cpu=0), {"CPU": 0}) == []


def test_format_infeasible_names_resources_and_amounts():
    request = {"CPU": 1, "GPU": 3, "accelerator_type:V100": 0.001}
    reasons = infeasible_reasons(make_state(cpu=2, gpus=2), request)
    line = format_infeasible(request, reasons)
    assert "\n" not in line
    assert line.startswith(
        "miniray: this request can never run on this node: needs GPU 3.0 but the node has 2.0; "
        "accelerator_type:V100 0.001 but the node has none (0.0). Start the node with more "
        "resources (init(num_gpus=..., resources={...})) or lower the request; the task stays "
        "pending."
    )
    assert "'CPU': 1.0" in line  # the full request is named too
    cpu_line = format_infeasible({"CPU": 4}, [("CPU", 4.0, 2.0)])
    assert "CPU 4.0 but the node has 2.0" in cpu_line and "num_cpus=..." in cpu_line


# -- node totals ----------------------------------------------------------------------------


def test_node_totals_keys():
    totals = node_totals(
        4, 2, {"custom": 3, "accelerator_type:A100": 1}, 1 << 30, 1 << 29, "10.0.0.5"
    )
    assert totals == {
        "CPU": 4.0,
        "GPU": 2.0,
        "custom": 3.0,
        "accelerator_type:A100": 1.0,
        "memory": float(1 << 30),
        "object_store_memory": float(1 << 29),
        "node:10.0.0.5": 1.0,
        "node:__internal_head__": 1.0,
    }
    assert all(isinstance(v, float) for v in totals.values())


def test_node_totals_omits_zero_gpu_and_rounds():
    totals = node_totals(2, 0, None, 100, 50, "127.0.0.1")
    assert "GPU" not in totals
    assert set(totals) == {
        "CPU",
        "memory",
        "object_store_memory",
        "node:127.0.0.1",
        "node:__internal_head__",
    }
    assert node_totals(0.123456, 0, {}, 1, 1, "h")["CPU"] == 0.1235
    with pytest.raises(ValueError, match="num_gpus"):
        node_totals(2, 0, {"GPU": 1}, 1, 1, "h")
    with pytest.raises(ValueError):
        node_totals(-1, 0, {}, 1, 1, "h")
