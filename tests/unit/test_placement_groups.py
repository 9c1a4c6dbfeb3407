"""Placement groups' pure decisions (``core/placement.py``, ``resources.plan_group``) and
their reservation in the ledger. Wording compared with Ray 2.60."""

from __future__ import annotations

import types

import pytest

from miniray._private.core import placement
from miniray._private.core.resources import UNIT, NodeState, plan_allocation, plan_group
from miniray._private.ledger.ledger import Ledger

H = "ab" * 18  # a group id's hex (18 bytes)


# -- validation: Ray's types and wording --------------------------------------------------------

@pytest.mark.parametrize("bundles, text", [
    ([], "Bundles must be a non-empty list of resource dictionaries. For example: "
         '`[{"CPU": 1.0}, {"GPU": 1.0}]`. Got empty list instead.'),
    ([{"CPU": 0}], "Bundles cannot be an empty dictionary or resources with only 0 values. "
                   "Bundles: [{'CPU': 0}]"),
    ([{"CPU": 1}, {}], "Bundles cannot be an empty dictionary"),
    ([1], "Bundles must be a non-empty list of resource dictionaries."),
    ({"CPU": 1}, "Placement group bundles must be a list, got <class 'dict'>."),
])
def test_bad_bundles_raise_rays_value_error(bundles, text):
    with pytest.raises(ValueError) as info:
        placement.check_bundles(bundles)
    assert str(info.value).startswith(text)


def test_bundles_are_floats_without_zero_entries():
    assert placement.check_bundles([{"CPU": 1, "GPU": 0}]) == [{"CPU": 1.0}]


def test_strategy_and_lifetime_checks():
    for s in placement.STRATEGIES:
        assert placement.check_strategy(s) == s
    with pytest.raises(ValueError, match="Invalid placement group strategy FOO. Supported "
                                         "strategies are: {"):
        placement.check_strategy("FOO")
    assert placement.check_lifetime("detached") is True
    assert placement.check_lifetime(None) is False
    with pytest.raises(ValueError, match="must be either `None` or 'detached'. Got x."):
        placement.check_lifetime("x")


@pytest.mark.parametrize("index", [2, -2, 5, 1.0, True])
def test_bundle_index_out_of_range(index):
    with pytest.raises(ValueError, match=f"placement group bundle index {index} is invalid. "
                                         "Valid placement group indexes: 0-2"):
        placement.check_bundle_index(index, 2)


def test_bundle_index_in_range():
    for index in (-1, 0, 1):
        placement.check_bundle_index(index, 2)


def test_group_infeasible():
    totals = {"CPU": 4.0, "GPU": 1.0}
    assert placement.group_infeasible([{"CPU": 2}, {"CPU": 2}], "PACK", 1, totals) is None
    why = placement.group_infeasible([{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD", 1, totals)
    assert "STRICT_SPREAD" in why and "2 bundles" in why and "1 node" in why
    assert placement.group_infeasible([{"CPU": 1}], "STRICT_SPREAD", 1, totals) is None
    why = placement.group_infeasible([{"CPU": 3}, {"CPU": 3, "x": 1}], "PACK", 1, totals)
    assert why == "its bundles need CPU 6 but the node has 4; x 1 but the node has 0"


# -- derived names and rewriting ------------------------------------------------------------------

def test_bundle_provides_as_ray_names_them():
    provides = placement.bundle_provides(H, [{"CPU": 1}, {"CPU": 2, "GPU": 1}])
    assert provides == {
        f"CPU_group_0_{H}": 1.0, f"CPU_group_1_{H}": 2.0, f"CPU_group_{H}": 3.0,
        f"GPU_group_1_{H}": 1.0, f"GPU_group_{H}": 1.0,
        f"bundle_group_0_{H}": 1000.0, f"bundle_group_1_{H}": 1000.0,
        f"bundle_group_{H}": 2000.0,
    }


def test_rewrite_request_indexed_and_wildcard():
    assert placement.rewrite_request({"CPU": 1, "GPU": 0.5}, H, 1) == {
        f"CPU_group_{H}": 1, f"CPU_group_1_{H}": 1, f"GPU_group_{H}": 0.5,
        f"GPU_group_1_{H}": 0.5, f"bundle_group_{H}": 0.001, f"bundle_group_1_{H}": 0.001}
    wild = placement.rewrite_request({"CPU": 1}, H, -1)
    assert wild == {f"CPU_group_{H}": 1, f"bundle_group_{H}": 0.001}
    assert placement.wildcard_group(wild) == H
    assert placement.resolve_wildcard(wild, H, 3) == {**wild, f"CPU_group_3_{H}": 1,
                                                      f"bundle_group_3_{H}": 0.001}
    # a zero-CPU task still takes its share of the bundle
    assert placement.rewrite_request({}, H, 0) == {f"bundle_group_{H}": 0.001,
                                                   f"bundle_group_0_{H}": 0.001}


def test_parse_derived():
    assert placement.parse_derived(f"GPU_group_12_{H}") == ("GPU", 12, H)
    assert placement.parse_derived(f"my_res_group_{H}") == ("my_res", None, H)
    assert placement.parse_derived("CPU_group_x") is None
    assert not placement.is_derived("CPU")


def test_fits_bundle_and_rays_message():
    bundles = [{"CPU": 1.0}, {"CPU": 2.0, "x": 1.0}]
    assert placement.fits_bundle({"CPU": 2}, bundles, -1)
    assert not placement.fits_bundle({"CPU": 2}, bundles, 0)
    assert placement.fits_bundle({"CPU": 1, "x": 1}, bundles, 1)
    assert not placement.fits_bundle({"CPU": 3}, bundles, -1)
    assert placement.cannot_fit_message("f", {"CPU": 2.0}, [{"CPU": 1.0}]) == (
        "Cannot schedule f with the placement group because the resource request "
        "{'CPU': 2} cannot fit into any bundles for the placement group, [{'CPU': 1.0}].")


# -- planning -------------------------------------------------------------------------------------

def test_plan_group_packs_gpu_bundles_as_tasks():
    s = NodeState(totals={"CPU": 4 * UNIT, "GPU": 2 * UNIT}, instance_ids={"GPU": ["0", "1"]})
    alloc, per_bundle = plan_group(s, [{"GPU": 0.5}, {"GPU": 0.5}, {"GPU": 1}])
    assert per_bundle == [{"GPU": [(0, 5000)]}, {"GPU": [(0, 5000)]}, {"GPU": [(1, UNIT)]}]
    assert alloc.resources == {"GPU": 2 * UNIT}
    assert plan_group(s, [{"GPU": 1}, {"GPU": 1}, {"GPU": 0.5}]) is None
    assert plan_group(s, [{"CPU": 5}]) is None


def _state_with_group(bundles, gpus=2):
    s = NodeState(totals={"CPU": 4 * UNIT, "GPU": gpus * UNIT},
                  instance_ids={"GPU": [str(i) for i in range(gpus)]})
    return s


def test_ledger_reserves_a_group_and_tasks_take_its_bundles(tmp_path):
    ledger = Ledger.create(str(tmp_path / "l.json"), {"CPU": 4, "GPU": 3},
                           {"GPU": ["3", "5", "7"]})
    bundles = [{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}]
    lease = ledger.acquire_group(bundles, {"id": H, "bundles": bundles},
                                 placement.bundle_provides(H, bundles), holder_pid=1)
    assert lease is not None
    avail = ledger.available()
    assert avail["CPU"] == 2 and avail["GPU"] == 1
    assert avail[f"CPU_group_{H}"] == 2 and avail[f"GPU_group_1_{H}"] == 1
    assert ledger.capacity()[f"bundle_group_{H}"] == 2000
    # a task in bundle 1 gets that bundle's device, by its id
    t1 = ledger.acquire(placement.rewrite_request({"CPU": 1, "GPU": 1}, H, 1), holder_pid=1)
    assert ledger.instance_ids_of(t1, "GPU") == ["5"]
    # the wildcard goes to the bundle with room: bundle 0 (bundle 1 is full)
    t2 = ledger.acquire(placement.rewrite_request({"CPU": 1, "GPU": 1}, H, -1), holder_pid=1)
    assert ledger.instance_ids_of(t2, "GPU") == ["3"]
    assert ledger.acquire(placement.rewrite_request({"CPU": 1}, H, -1), holder_pid=1) is None
    # the group's devices are not given to plain tasks
    plain = ledger.acquire({"GPU": 1}, holder_pid=1)
    assert ledger.instance_ids_of(plain, "GPU") == ["7"]
    assert ledger.acquire({"GPU": 1}, holder_pid=1) is None
    # removing the group gives back its CPU and GPUs; nothing is scheduled into it after
    assert ledger.release_group(H) is not None
    assert ledger.release_group(H) is None
    assert ledger.acquire(placement.rewrite_request({}, H, -1), holder_pid=1) is None
    for t in (t1, t2, plain):
        ledger.release(t.lease_id)
    assert ledger.available() == {"CPU": 4, "GPU": 3}


def test_ledger_group_does_not_fit_and_dead_holders_groups_are_reclaimed(tmp_path):
    ledger = Ledger.create(str(tmp_path / "l.json"), {"CPU": 2}, {})
    big = [{"CPU": 3}]
    assert ledger.acquire_group(big, {"id": H, "bundles": big},
                                placement.bundle_provides(H, big), holder_pid=1) is None
    dead_pid = 2 ** 22 + 12345  # above pid_max's default: never alive
    b = [{"CPU": 2}]
    ledger.acquire_group(b, {"id": H, "bundles": b}, placement.bundle_provides(H, b),
                         holder_pid=dead_pid)
    assert ledger.groups() == {}  # a dead holder's group is not listed
    other = "cd" * 18
    assert ledger.acquire_group(b, {"id": other, "bundles": b},
                                placement.bundle_provides(other, b), holder_pid=1)
    assert list(ledger.groups()) == [other]


def test_a_subset_of_a_groups_bundles_keeps_the_groups_bundle_numbers(tmp_path):
    # Bundles 1 and 3 of a group are on this node (0 and 2 on others): the names it
    # provides, and the devices of its GPU bundles, are numbered 1 and 3, not 0 and 1.
    ledger = Ledger.create(str(tmp_path / "l.json"), {"CPU": 4, "GPU": 2}, {"GPU": ["4", "6"]})
    group = [{"CPU": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 2}, {"GPU": 1}]
    here = [1, 3]
    subset = [group[i] for i in here]
    provides = placement.bundle_provides(H, subset, here)
    assert sorted(n[:-37] for n in provides if n.startswith("CPU")) == [
        "CPU_group", "CPU_group_1"]
    assert provides[f"GPU_group_{H}"] == 2 and provides[f"GPU_group_3_{H}"] == 1
    assert f"CPU_group_0_{H}" not in provides
    lease = ledger.acquire_group(subset, {"id": H, "bundles": group}, provides, holder_pid=1,
                                 indexes=here)
    assert sorted(lease.provides_instances) == [f"GPU_group_1_{H}", f"GPU_group_3_{H}"]
    t3 = ledger.acquire(placement.rewrite_request({"GPU": 1}, H, 3), holder_pid=1)
    t1 = ledger.acquire(placement.rewrite_request({"GPU": 1}, H, 1), holder_pid=1)
    assert {ledger.instance_ids_of(t1, "GPU")[0], ledger.instance_ids_of(t3, "GPU")[0]} == {
        "4", "6"}
    assert ledger.acquire(placement.rewrite_request({"CPU": 1}, H, 0), holder_pid=1) is None
    with pytest.raises(ValueError, match="2 bundles but 1 indexes"):
        placement.bundle_provides(H, subset, [1])
    # An empty subset (every bundle on other nodes) is still the group's record here.
    other = "cd" * 18
    empty = ledger.acquire_group([], {"id": other, "bundles": group}, {}, holder_pid=1,
                                 indexes=[])
    assert empty is not None and other in ledger.groups() and empty.resources == {}


def test_a_group_grows_by_a_bundle_whose_node_died_under_its_own_number(tmp_path):
    # Bundle 1 of a group (0 here, 1 on a node that died) is held here now: the group's
    # lease takes its room and device, provides bundle 1's names, and its record changes
    # in the same write; removing the group gives all of it back.
    ledger = Ledger.create(str(tmp_path / "l.json"), {"CPU": 4, "GPU": 2}, {"GPU": ["4", "6"]})
    group = [{"CPU": 1, "GPU": 1}, {"CPU": 2, "GPU": 1}]
    ledger.acquire_group(group[:1], {"id": H, "bundles": group, "nodes": ["a", "b"]},
                         placement.bundle_provides(H, group[:1], [0]), holder_pid=1,
                         indexes=[0])
    assert ledger.acquire(placement.rewrite_request({"CPU": 1}, H, 1), holder_pid=1) is None
    assert not ledger.grow_group("cd" * 18, group[1:], {}, indexes=[1])  # not reserved
    assert not ledger.grow_group(H, [{"CPU": 9}], {}, indexes=[1])  # no room: unchanged
    assert ledger.available()["CPU"] == 3
    assert ledger.grow_group(H, group[1:], placement.bundle_provides(H, group[1:], [1]),
                             indexes=[1], fields={"nodes": ["a", "a"]})
    avail = ledger.available()
    assert avail["CPU"] == 1 and avail.get("GPU", 0) == 0
    assert avail[f"CPU_group_1_{H}"] == 2 and avail[f"CPU_group_{H}"] == 3
    assert ledger.groups()[H].group["nodes"] == ["a", "a"]
    t0 = ledger.acquire(placement.rewrite_request({"GPU": 1}, H, 0), holder_pid=1)
    t1 = ledger.acquire(placement.rewrite_request({"CPU": 2, "GPU": 1}, H, 1), holder_pid=1)
    assert {ledger.instance_ids_of(t0, "GPU")[0], ledger.instance_ids_of(t1, "GPU")[0]} == {
        "4", "6"}
    ledger.release_many([t0.lease_id, t1.lease_id])
    assert ledger.release_group(H) is not None
    assert ledger.available() == {"CPU": 4, "GPU": 2}


def test_a_rewritten_request_names_its_bundle_and_a_remote_bundle_is_picked_by_room():
    request = placement.rewrite_request({"CPU": 1, "GPU": 0.5}, H, 2)
    assert placement.bundle_request(request) == (H, 2, {"CPU": 1, "GPU": 0.5})
    assert placement.bundle_request(placement.rewrite_request({"CPU": 1}, H, -1)) == (
        H, -1, {"CPU": 1})
    assert placement.bundle_request({"CPU": 1}) is None
    free = {1: {"CPU": 1.0}, 2: {"CPU": 0.0, "GPU": 1.0}}
    assert placement.pick_bundle({"CPU": 1}, 2, free) is None  # bundle 2 is full: waits
    assert placement.pick_bundle({"CPU": 1}, 1, free) == 1
    assert placement.pick_bundle({"CPU": 1}, -1, free) == 1
    assert placement.pick_bundle({"CPU": 1}, 0, free) is None  # not this caller's bundle
    assert placement.pick_bundle({"GPU": 1}, -1, free) == 2


def test_plain_requests_unchanged_by_groups():
    s = _state_with_group([])
    assert plan_allocation(s, {"CPU": 1, "GPU": 0.5}).instances == {"GPU": [(0, 5000)]}


# -- the rest of Ray's module: constants, validate_placement_group, check_placement_group_index ---

def test_rays_constants_and_validation_helpers():
    import importlib

    from miniray.util.placement_group import (
        PlacementGroup,
        check_placement_group_index,
        validate_placement_group,
    )

    # as in Ray, ``miniray.util.placement_group`` is the function; the module is imported
    module = importlib.import_module("miniray.util.placement_group")
    assert module.VALID_PLACEMENT_GROUP_STRATEGIES == {"PACK", "SPREAD", "STRICT_PACK",
                                                       "STRICT_SPREAD"}
    assert module.NODE_ID_LABEL_KEY == "ray.io/node-id"
    assert module.PLACEMENT_GROUP_BUNDLE_RESOURCE_NAME == "bundle"
    assert validate_placement_group([{"CPU": 1}]) is True
    with pytest.raises(ValueError, match="`strategy` and `topology_strategy` cannot both"):
        validate_placement_group([{"CPU": 1}], "PACK", topology_strategy={})
    with pytest.raises(ValueError, match="_soft_target_node_id currently only works with "
                                         "STRICT_PACK but got PACK"):
        validate_placement_group([{"CPU": 1}], _soft_target_node_id="ab" * 28)
    with pytest.raises(ValueError, match="Invalid hex ID of _soft_target_node_id"):
        validate_placement_group([{"CPU": 1}], "STRICT_PACK", _soft_target_node_id="zz")
    with pytest.raises(ValueError, match="The length of `bundle_label_selector` should equal"):
        validate_placement_group([{"CPU": 1}], bundle_label_selector=[{}, {}])
    with pytest.raises(ValueError, match="Invalid topology strategy 'X' for label"):
        validate_placement_group([{"CPU": 1}], topology_strategy={"ray.io/node-id": "X"})
    with pytest.raises(ValueError, match="only 'STRICT_PACK' is supported for topology"):
        validate_placement_group([{"CPU": 1}], topology_strategy={"rack": "PACK"})
    assert placement.check_topology_strategy(None, {"ray.io/node-id": "SPREAD"}) == "SPREAD"
    group = PlacementGroup(PlacementGroup.empty().id.from_random(), [{"CPU": 1.0}] * 2)
    check_placement_group_index(group, 1)
    with pytest.raises(ValueError, match="bundle index 2 is invalid"):
        check_placement_group_index(group, 2)
    with pytest.raises(ValueError, match="If placement group is not set, the value of bundle "
                                         "index must be -1."):
        check_placement_group_index(PlacementGroup.empty(), 0)
    assert PlacementGroup.empty().is_empty() and not group.is_empty()


def test_which_group_a_call_goes_to_as_ray_decides():
    """Compared with Ray 2.60's ``_configure_placement_group_based_on_context``: an unset
    capture is the caller's; a call naming no group joins the caller's only if it captures;
    ``placement_group_capture_child_tasks=False`` opts out."""
    from miniray._private.core.ids import PlacementGroupID
    from miniray._private.core.pg_handle import PlacementGroup

    mine = PlacementGroup(PlacementGroupID.from_random(), [{"CPU": 1.0}])
    capturing = (H, [{"CPU": 2.0}], True)
    plain = (H, [{"CPU": 2.0}], False)
    assert placement.resolve_option(None, capturing) is None
    assert placement.resolve_option(("default", -1, None), None) is None
    assert placement.resolve_option(("default", -1, None), plain) is None
    assert placement.resolve_option(("default", -1, None), capturing) == (
        H, [{"CPU": 2.0}], -1, True)
    assert placement.resolve_option(("default", 0, False), capturing) is None
    assert placement.resolve_option((mine, 0, None), None) == (
        mine.id.hex(), [{"CPU": 1.0}], 0, False)
    assert placement.resolve_option((mine, 0, None), capturing)[3] is True  # inherited
    assert placement.resolve_option((PlacementGroup.empty(), -1, None), capturing) is None


# -- bundles on other nodes: whose they are, their GPUs ----------------------------------------

def test_doctests_of_placement():
    import doctest

    assert doctest.testmod(placement).failed == 0


@pytest.mark.parametrize("index, nodes, bound", [
    (1, ["here", "m"], [1]),
    (0, ["here", "m"], []),
    (-1, ["here", "m"], []),  # any bundle: this node's first
    (-1, ["m", "n"], [0, 1]),
    (2, ["here", "m"], []),  # an index the record lacks: the ledger says no room
    (0, [], []),  # a record without nodes (one host)
])
def test_a_bundle_elsewhere_is_one_no_bundle_of_this_node_can_stand_for(index, nodes, bound):
    assert placement.bundle_elsewhere(index, nodes, "here") == bound


def test_tasks_in_a_gpu_bundle_take_devices_as_the_ledger_does():
    assert placement.pick_gpus([UNIT, UNIT], 0) == []
    assert placement.pick_gpus([UNIT, UNIT], 1) == [(0, UNIT)]
    assert placement.pick_gpus([0, UNIT], 1) == [(1, UNIT)]
    assert placement.pick_gpus([UNIT, UNIT], 2) == [(0, UNIT), (1, UNIT)]
    assert placement.pick_gpus([UNIT // 2, UNIT], 0.5) == [(0, UNIT // 2)]  # fills one first
    assert placement.pick_gpus([UNIT // 2, UNIT // 2], 1) is None
    # The amounts fit (0.8 free), the devices do not (0.4 on each): the task waits.
    free = {0: {"GPU": 0.8}}
    assert placement.pick_bundle({"GPU": 0.6}, 0, free) == 0
    assert placement.pick_bundle({"GPU": 0.6}, 0, free, {0: [UNIT * 4 // 10] * 2}) is None
    assert placement.pick_bundle({"GPU": 0.6}, -1, {**free, 1: {"GPU": 1.0}},
                                 {0: [UNIT * 4 // 10] * 2, 1: [UNIT]}) == 1


def test_a_device_is_as_many_units_in_both_modules():
    assert placement.INSTANCE_UNIT == UNIT


# -- who holds a detached group (placement_group_nodes._detached_home) --------------------------

def test_a_detached_group_is_held_by_the_actor_service_only_in_a_cluster():
    import types

    from miniray._private.owner.placement_group_nodes import PlacementGroupNodes

    class _Pgs(PlacementGroupNodes):
        def __init__(self, cluster, link):
            self.cluster = cluster
            self.owner = types.SimpleNamespace(actors=types.SimpleNamespace(link=link))

        def _cluster(self):
            return self.cluster

    near = types.SimpleNamespace(on_another_host=lambda: False)
    far = types.SimpleNamespace(on_another_host=lambda: True)
    assert _Pgs(None, near)._detached_home() == "here"  # a node outside a cluster
    assert _Pgs(object(), near)._detached_home() == "service"  # a head's driver
    assert _Pgs(object(), far)._detached_home() == "service"  # a member's: the head's
    assert _Pgs(object(), None)._detached_home() == "span"  # the service itself


# -- the node's actor service's side of a detached group ----------------------------------------

def _service_pgs(states: dict):
    """A ``PlacementGroups`` of the actor service, without an owner's processes: its groups
    in ``states`` (hex -> state), ``remove`` counted (each call once per group)."""
    import threading
    import types

    from miniray._private.owner.placement_group_records import _Group
    from miniray._private.owner.placement_groups import PlacementGroups

    lock = threading.RLock()
    owner = types.SimpleNamespace(locked=lambda: lock, ledger=None,
                                  actors=types.SimpleNamespace(link=None))  # the service

    class _Pgs(PlacementGroups):
        def remove(self, hex_):
            with lock:
                self.removed.append(hex_)
                self.groups[hex_].state = "REMOVED"

    pgs = _Pgs(owner=owner, pid=1, holder_for_detached=1, node_id="head", totals={})
    pgs.removed = []
    for hex_, state in states.items():
        group = _Group(hex_, [{"CPU": 1.0}], "PACK", "", True)
        group.state = state
        pgs.groups[hex_] = group
    return pgs


def test_the_service_sends_the_ledger_records_of_the_groups_it_holds_reserved():
    """``SVC_PG_TABLE`` (a member's driver reads the head's groups there): the ledger's
    record of each detached group the service holds, not a removed one's, nor a group of
    another driver of the node."""
    import types

    pgs = _service_pgs({"aa": "CREATED", "bb": "PENDING", "cc": "REMOVED"})
    records = {h: {"id": h, "nodes": ["head", "member"]} for h in ("aa", "cc", "dd")}
    pgs.ledger = types.SimpleNamespace(groups=lambda: {
        h: types.SimpleNamespace(group=r) for h, r in records.items()})
    assert pgs.served_records() == {"aa": records["aa"]}


def test_two_removals_of_a_served_group_at_once_remove_it_once():
    import threading

    pgs = _service_pgs({"aa": "CREATED", "bb": "PENDING"})
    assert pgs.serve_remove("aa") is True
    assert pgs.serve_remove("aa") is False  # already removed: the second does nothing
    assert pgs.serve_remove("cc") is False  # never held here
    results = []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        results.append(pgs.serve_remove("bb"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert sorted(results) == [False] * 7 + [True]
    assert pgs.removed == ["aa", "bb"]


def test_a_served_group_asked_for_again_by_id_is_created_once():
    """``serve_create`` is idempotent by id: a driver whose link broke asks again and gets
    the group's state, never a second group (nor "name taken" for its own name)."""
    import types

    pgs = _service_pgs({"aa": "PENDING", "gone": "REMOVED"})
    pgs.ledger = types.SimpleNamespace(groups=lambda: {"bb": object()})
    made = []

    def create(hex_, bundles, strategy, name, detached):
        made.append(hex_)
        pgs.groups[hex_] = _service_pgs({hex_: "CREATED"}).groups[hex_]

    pgs.create = create
    assert pgs.serve_create("aa", [{"CPU": 1.0}], "PACK", "n") == "PENDING"
    assert pgs.serve_create("gone", [{"CPU": 1.0}], "PACK", "") == "REMOVED"
    assert pgs.serve_create("bb", [{"CPU": 1.0}], "PACK", "") == "CREATED"
    assert pgs.serve_create("bb", [{"CPU": 1.0}], "PACK", "") == "CREATED"
    assert made == ["bb"] and not pgs._serving


def test_a_drivers_handle_survives_its_link_breaking_while_the_service_creates_the_group():
    """The link to the actor service breaks once (the service may have the group): the
    driver asks again on a new link and keeps its record; twice: the record goes and the
    error says what may be left."""
    import threading
    import types

    from miniray._private.owner.actor_link import ServiceUnavailable
    from miniray._private.owner.placement_groups import PlacementGroups

    answers: list = []

    def ask(hex_, bundles, strategy, name):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    lock = threading.RLock()
    owner = types.SimpleNamespace(locked=lambda: lock, ledger=None, check_usable=lambda: None,
                                  actors=types.SimpleNamespace(create_group_in_service=ask))
    tried = []

    class _Pgs(PlacementGroups):
        def _try(self, group):
            tried.append(group.hex)

        def _arm_retry(self):
            pass

    pgs = _Pgs(owner=owner, pid=1, holder_for_detached=1, node_id="head", totals={})
    answers[:] = [ServiceUnavailable("the node's actor service stopped answering"), "CREATED"]
    pgs._create_served("aa", [{"CPU": 1.0}], "PACK", "kept")
    assert pgs.groups["aa"].served and tried == ["aa"] and not answers
    answers[:] = [ServiceUnavailable("broken"), ServiceUnavailable("still broken")]
    try:
        pgs._create_served("bb", [{"CPU": 1.0}], "PACK", "lost")
        raise AssertionError("no error")
    except ServiceUnavailable as error:
        assert "broke while it created detached placement group lost" in str(error)
        assert "get_placement_group" in str(error)
    assert "bb" not in pgs.groups
    answers[:] = [ServiceUnavailable("broken"), "REMOVED"]  # removed meanwhile, elsewhere
    pgs._create_served("cc", [{"CPU": 1.0}], "PACK", "")
    assert pgs.groups["cc"].state == "REMOVED"


A, B = "aa" * 18, "bb" * 18  # group ids as the placement requests name them


def _driver_pgs(ledger: dict, held):
    """A driver's ``PlacementGroups`` in a cluster whose node's actor service holds
    detached groups: ``ledger`` its reserved groups (hex -> record), ``held`` what the
    service answers ``SVC_PG_STATE``; the owner's removal calls recorded."""
    import threading
    import types

    from miniray._private.owner.placement_groups import PlacementGroups
    from miniray._private.owner.remote_bundles import RemoteBundles

    lock = threading.RLock()
    asked: list = []

    def state(hex_):
        asked.append(hex_)
        return held

    owner = types.SimpleNamespace(
        locked=lambda: lock, closed=False, removed=[], failed=[], after=[],
        ledger=types.SimpleNamespace(groups=lambda: {
            h: types.SimpleNamespace(group=r) for h, r in ledger.items()}),
        actors=types.SimpleNamespace(group_state_in_service=state, link=types.SimpleNamespace(
            on_another_host=lambda: False)),
        objects=types.SimpleNamespace(set_ready=lambda i, kind, data: owner.failed.append(i)))
    owner.placement_group_removed = owner.removed.append
    owner.after_placement_removal = lambda: owner.after.append(True)
    # a cluster of this node alone: no other node's drivers hold groups (far_groups.py)
    owner.remote_nodes = types.SimpleNamespace(bundles=RemoteBundles(
        owner, types.SimpleNamespace(local="head")), local="head", view=lambda fresh=False: [])

    class _Pgs(PlacementGroups):
        def _cluster(self):
            return owner.remote_nodes

        def _detached_home(self):
            return "service"

    pgs = _Pgs(owner=owner, pid=1, holder_for_detached=1, node_id="head", totals={})
    return pgs, owner, asked


def test_an_actor_in_a_served_group_got_by_handle_is_routed_to_the_service():
    """A handle that came any way (an argument, a named actor's answer): the group's
    ledger record says it is the service's, with bundle 1 on a member."""
    record = {"detached": True, "nodes": ["head", "member"]}
    pgs, owner, asked = _driver_pgs({A: record}, held="CREATED")
    bundles = owner.remote_nodes.bundles
    one = placement.rewrite_request({"CPU": 1}, A, 1)
    assert not bundles.serves(one)  # before: nothing noted, the actor stayed here
    pgs.route_served(one)
    assert bundles.serves(one) and asked == []  # the ledger said it: no request
    assert not bundles.serves(placement.rewrite_request({"CPU": 1}, A, 0))  # the head's


def test_an_actor_in_a_pending_served_group_got_by_handle_goes_to_the_service():
    pgs, owner, asked = _driver_pgs({}, held="PENDING")
    bundles = owner.remote_nodes.bundles
    zero = placement.rewrite_request({"CPU": 1}, B, 0)
    pgs.route_served(zero)
    assert bundles.serves(zero) and asked == [B]  # the service places it once reserved
    bundles.note_served(B, ["head", "member"])  # reserved: the bundles' nodes decide
    assert not bundles.serves(zero)
    other, _owner, asked = _driver_pgs({}, held=None)  # not the service's: stays here
    other.route_served(zero)
    assert not _owner.remote_nodes.bundles.serves(zero) and asked == [B]


def test_a_pending_served_group_once_reserved_routes_by_where_its_bundle_is():
    """A handle's group noted pending sent every later actor to the service, even in a
    bundle on the head once reserved; now the ledger is read again at each actor."""
    ledger: dict = {}
    pgs, owner, asked = _driver_pgs(ledger, held="PENDING")
    bundles = owner.remote_nodes.bundles
    zero, one = (placement.rewrite_request({"CPU": 1}, B, i) for i in (0, 1))
    pgs.route_served(zero)
    assert bundles.serves(zero) and asked == [B]
    assert pgs.needs_route(zero)  # a worker's actor looks it up again
    pgs.route_served(zero)  # still not in the ledger: pending, not asked again so soon
    assert bundles.serves(zero) and asked == [B]
    ledger[B] = {"detached": True, "nodes": ["head", "member"]}  # reserved
    pgs.route_served(zero)
    assert not bundles.serves(zero)  # the head's bundle: this driver creates it
    assert bundles.serves(one)  # the member's: the service
    assert not pgs.needs_route(one) and asked == [B]
    alone, owner, asked = _driver_pgs({}, held="PENDING")
    alone.route_served(zero)
    assert owner.remote_nodes.bundles.serves(zero)
    owner.ledger.groups = lambda: {B: types.SimpleNamespace(
        group={"detached": True, "nodes": ["head"]})}  # reserved on the head only
    alone.route_served(zero)
    assert not owner.remote_nodes.bundles.serves(zero)
    assert B not in owner.remote_nodes.bundles.served_pending


def test_the_service_finds_a_pending_group_it_holds_by_name():
    pgs = _service_pgs({"aa": "PENDING", "bb": "CREATED", "cc": "PENDING"})
    pgs.groups["aa"].name, pgs.groups["bb"].name = "late", "done"
    pgs.groups["cc"].name = "doomed"
    pgs._doomed.add("cc")  # removed while the service creates it
    assert pgs.served_named("late") == ("aa", [{"CPU": 1.0}], "PACK")
    assert [pgs.served_named(n) for n in ("done", "doomed", "none", "")] == [None] * 4


def test_another_driver_finds_a_pending_served_group_by_name_and_follows_it():
    """Ray finds a pending group by name and its ready() waits: the driver asks the
    service after the ledger and keeps a record that follows the group."""
    ledger: dict = {}
    pgs, owner, asked = _driver_pgs(ledger, held="PENDING")
    timers: list = []
    owner.reactor = types.SimpleNamespace(call_later=lambda delay, cb: timers.append(cb))
    owner.wake_dispatch = lambda: None
    owner.objects.ensure = lambda object_id: None
    owner.check_usable = lambda: None
    found: list = []

    def find(name):
        found.append(name)
        return (B, [{"CPU": 1.0}, {"CPU": 1.0}], "STRICT_SPREAD") if name == "late" else None

    owner.actors.find_group_in_service = find
    assert pgs.lookup("late") == (B, [{"CPU": 1.0}, {"CPU": 1.0}]) and found == ["late"]
    with pytest.raises(ValueError, match="with name: other"):
        pgs.lookup("other")
    group = pgs.groups[B]
    assert group.served and group.state == "PENDING" and timers  # followed on the retry
    assert pgs.state_of(B) == "PENDING" and not pgs.wait(B, 0.0)
    bundles = owner.remote_nodes.bundles
    zero = placement.rewrite_request({"CPU": 1}, B, 0)
    assert bundles.serves(zero)  # its actors go to the service meanwhile
    assert pgs.pending_records() == []  # the service lists it, once for every driver
    ready = pgs.ready_object(B, "handle")
    assert group.ready_ids == [ready]
    assert pgs.lookup("late")[0] == B and found == ["late", "other"]  # its own record now
    ledger[B] = {"detached": True, "nodes": ["head", "member"], "name": "late",
                 "bundles": [{"CPU": 1.0}, {"CPU": 1.0}]}  # reserved
    pgs._follow_served(group)
    assert group.state == "CREATED" and owner.failed == [ready]  # set_ready'd
    assert not bundles.serves(zero) and bundles.serves(
        placement.rewrite_request({"CPU": 1}, B, 1))
    assert pgs.wait(B, 0.0)
    # reserved between the driver's ledger read and the service's answer: found anyway
    racing, owner, _asked = _driver_pgs({}, held=None)
    record = {"detached": True, "nodes": ["head"], "name": "raced", "bundles": [{"CPU": 1}]}

    def reserved_meanwhile(name):
        owner.ledger.groups = lambda: {A: types.SimpleNamespace(group=record)}
        return None

    owner.actors.find_group_in_service = reserved_meanwhile
    assert racing.lookup("raced") == (A, [{"CPU": 1}])


def test_a_pending_served_group_removed_by_another_driver_ends_in_its_creator():
    from miniray._private.owner.placement_group_records import _Group

    pgs, owner, asked = _driver_pgs({}, held=None)
    group = _Group("cc", [{"CPU": 1.0}], "PACK", "", True)
    group.served = True
    group.ready_ids = [b"ready"]
    pgs.groups["cc"] = group
    pgs._follow_served(group)
    assert group.state == "REMOVED" and asked == ["cc"]
    assert owner.failed == [b"ready"] and owner.removed == ["cc"] and owner.after
    kept, owner, asked = _driver_pgs({}, held="PENDING")
    group = _Group("dd", [{"CPU": 1.0}], "PACK", "", True)
    group.served = True
    kept.groups["dd"] = group
    kept._follow_served(group)
    kept._follow_served(group)  # within STATE_ASK_S: not asked again
    assert group.state == "PENDING" and asked == ["dd"] and owner.removed == []


def test_a_served_group_is_not_asked_about_while_its_create_is_in_flight():
    """Defect: a driver's new detached group was PENDING in its book before its create
    reached the service; a state ask of another thread (the retry of a pending group)
    that reached the service first found nothing and marked it REMOVED, while the service
    then created it. Now it is asked about only once its create was answered."""
    pgs, owner, asked = _driver_pgs({}, held=None)
    service: dict = {}
    owner.check_usable = lambda: None
    owner.actors.group_state_in_service = lambda hex_: asked.append(hex_) or service.get(hex_)

    def create(hex_, bundles, strategy, name):
        pgs.try_pending()  # another thread's state asks come first ...
        service[hex_] = "PENDING"  # ... then this create reaches the service
        return "PENDING"

    owner.actors.create_group_in_service = create
    pgs._arm_retry = lambda: None
    pgs._create_served("ff" * 18, [{"CPU": 1.0}], "PACK", "g")
    group = pgs.groups["ff" * 18]
    assert group.state == "PENDING" and asked == [], (group.state, asked)
    group.asked_at -= pgs.STATE_ASK_S  # later: asked, and held there
    pgs.try_pending()
    assert asked == ["ff" * 18] and group.state == "PENDING"


def test_the_service_says_which_groups_it_holds():
    pgs = _service_pgs({"aa": "CREATED", "bb": "PENDING", "gone": "REMOVED"})
    pgs._serving.add("new")
    assert [pgs.served_state(h) for h in ("aa", "bb", "gone", "new", "zz")] == [
        "CREATED", "PENDING", None, "PENDING", None]


def test_a_workers_actor_waits_for_the_lookup_only_in_a_group_not_known_yet():
    from miniray._private.owner.placement_group_records import _Group

    pgs, owner, _asked = _driver_pgs({}, held="PENDING")
    own = _Group("cc" * 18, [{"CPU": 1.0}], "PACK", "", False)
    pgs.groups[own.hex] = own
    assert not pgs.needs_route(placement.rewrite_request({"CPU": 1}, own.hex, 0))
    assert not pgs.needs_route({"CPU": 1})  # no group
    assert pgs.needs_route(placement.rewrite_request({"CPU": 1}, A, 1))
    owner.remote_nodes.bundles.note_served(A, ["head", "member"])
    assert not pgs.needs_route(placement.rewrite_request({"CPU": 1}, A, 1))  # noted
    owner.actors.link = None  # a driver not joined to a node: nothing to ask
    assert not pgs.needs_route(placement.rewrite_request({"CPU": 1}, B, 1))


def test_a_served_group_removed_while_the_service_creates_it_is_removed_once_created():
    import types

    pgs = _service_pgs({})
    pgs.ledger = types.SimpleNamespace(groups=lambda: {})
    seen = []

    def create(hex_, bundles, strategy, name, detached):
        # another driver's removal arrives while this request creates the group
        seen.append((pgs.serve_remove(hex_), pgs.serve_remove(hex_), pgs.served_state(hex_)))
        pgs.groups[hex_] = _service_pgs({hex_: "PENDING"}).groups[hex_]

    pgs.create = create
    assert pgs.serve_create("ee", [{"CPU": 1.0}], "PACK", "") == "REMOVED"
    assert seen == [(True, False, None)]  # the first removal took it, the second did not
    assert pgs.removed == ["ee"] and not pgs._serving and not pgs._doomed


def test_no_cluster_view_marks_no_bundle_lost():
    """The view file gone (the node stopping) or unreadable says nothing of the members:
    no bundle is taken for lost (every one was, and placed again)."""
    import types

    pgs, _owner, _asked = _driver_pgs({}, held=None)
    asked = []
    remote = types.SimpleNamespace(view=lambda fresh=False: [], bundles=types.SimpleNamespace(
        find_lost=lambda alive: asked.append(alive) or {}))
    pgs._check_bundle_nodes(remote)
    assert asked == []
    entry = types.SimpleNamespace(node_id="member", alive=True)
    remote.view = lambda fresh=False: [entry]
    pgs._check_bundle_nodes(remote)
    assert asked == [{"member"}]


def test_the_service_asks_each_lenders_node_whether_its_group_lives():
    """The actor service's watch of groups lent by a driver of another node: that node's
    ledger says whether each lives (removed, or its driver gone: no); a dead node's are
    gone; one that cannot be asked now keeps its group; no view says nothing."""
    import types

    from miniray._private.transport.remote_node import RemoteLeaseError
    from miniray.exceptions import NodeDiedError

    pgs, _owner, _asked = _driver_pgs({}, held=None)
    # One request per lending node: its ledger's groups, or the trouble asking it.
    answers = {"m1": {"live": {}}, "m3": TimeoutError("slow"),
               "m4": RemoteLeaseError("no such request", kind="malformed"),
               "m5": NodeDiedError("fenced")}
    asked = []

    def client_of(entry):
        def groups(timeout=None):
            asked.append(entry.node_id)
            answer = answers[entry.node_id]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return types.SimpleNamespace(groups=groups)

    nodes = [types.SimpleNamespace(node_id=n, alive=True) for n in answers]
    dead = types.SimpleNamespace(node_id="m2", alive=False)
    watched = {"live": "m1", "removed": "m1", "blip": "m3", "older": "m4", "fenced": "m5",
               "on_dead": "m2"}
    remote = types.SimpleNamespace(view=lambda fresh=False: [*nodes, dead],
                                   client=client_of,
                                   bundles=types.SimpleNamespace(lender_watched=watched))
    assert pgs._lenders_gone(remote) == {"removed", "fenced", "on_dead"}
    assert sorted(asked) == sorted(answers)  # each alive node once; the dead one: not asked
    remote.view = lambda fresh=False: []
    assert pgs._lenders_gone(remote) == set()
    remote.bundles.lender_watched = {}
    assert pgs._lenders_gone(remote) == set()


def _far_remover(answer):
    """A driver (``_driver_pgs``) that sees group A held by a driver of node m1: its calls
    in order, m1's ``pg_remove`` (answered ``answer``, or raising it) and its own part
    (``placement_group_removed``), and the groups it forgot."""
    import types

    pgs, owner, _asked = _driver_pgs({}, held=None)
    calls: list = []
    owner.actors.remove_group_in_service = lambda hex_: None
    owner.leases = types.SimpleNamespace(release_host=lambda lease: None)
    owner.placement_group_removed = lambda hex_: calls.append(("own part", hex_))
    pgs.ledger = types.SimpleNamespace(groups=lambda: {}, release_group=lambda hex_: None)
    entry = types.SimpleNamespace(node_id="m1", alive=True)

    def loan(what, fields, timeout):
        calls.append((what, fields))
        if isinstance(answer, Exception):
            raise answer
        return answer

    owner.remote_nodes.alive_entry = lambda node_id: entry if node_id == "m1" else None
    owner.remote_nodes.client = lambda e: types.SimpleNamespace(loan=loan)
    forgot: list = []
    pgs._far_groups = types.SimpleNamespace(
        record_of=lambda hex_: ("m1", {"name": "x"}) if hex_ == A else None,
        forget=forgot.append)
    return pgs, calls, forgot


def test_a_group_of_a_driver_of_another_host_is_removed_by_that_driver_first():
    """``remove`` of a group that a driver of another node holds (``remote_bundles`` step
    10) asks that driver through its node (``pg_remove``) before this driver ends its own
    work in it: the room its killed tasks give back is never the holder's waiting tasks'
    meanwhile. A group no other node's driver holds, or one this node's ledger holds,
    asks nobody; trouble asking is RaySystemError once this driver's own part is done; a
    dead node took the group with it."""
    import types

    from miniray.exceptions import NodeDiedError, RaySystemError

    pgs, calls, forgot = _far_remover({"removed": True})
    pgs.remove(A)
    assert calls == [("pg_remove", {"pg": A}), ("own part", A)] and forgot == [A]
    calls.clear()
    pgs.remove(B)  # no driver of another node holds it
    assert calls == [("own part", B)]
    calls.clear()
    lease = types.SimpleNamespace(group={})
    pgs.ledger.groups = lambda: {A: lease}  # a driver of this node's: the ledger's
    pgs.remove(A)
    assert calls == [("own part", A)]
    for trouble in ({"error": "the lending driver did not answer"}, TimeoutError("slow")):
        pgs, calls, forgot = _far_remover(trouble)
        with pytest.raises(RaySystemError, match="did not answer|slow"):
            pgs.remove(A)
        assert calls == [("pg_remove", {"pg": A}), ("own part", A)] and forgot == []
    pgs, calls, _forgot = _far_remover(NodeDiedError("fenced"))
    pgs.remove(A)
    assert calls == [("pg_remove", {"pg": A}), ("own part", A)]


def test_doctests_of_placement_group_nodes():
    import doctest

    from miniray._private.owner import placement_group_nodes

    assert doctest.testmod(placement_group_nodes, raise_on_error=False).failed == 0


def test_a_removal_from_another_host_removes_a_reserved_group_of_this_driver_once():
    """``remove_asked`` (``pg_remove`` on the state socket, through this node): this
    driver's reserved group is removed as its own ``remove`` does, once; a pending, removed,
    served or unknown group is not."""
    pgs = _service_pgs({"cc": "CREATED", "pp": "PENDING", "rr": "REMOVED", "ss": "CREATED"})
    pgs.groups["ss"].served = True
    assert [pgs.remove_asked(h) for h in ("cc", "cc", "pp", "rr", "ss", "zz")] == [
        True, False, False, False, False, False]
    assert pgs.removed == ["cc"]


def _found_pending():
    """A driver that found another driver's pending detached group by name (``lookup``)."""
    import types

    pgs, owner, _asked = _driver_pgs({}, held="PENDING")
    owner.reactor = types.SimpleNamespace(call_later=lambda delay, callback: None)
    owner.wake_dispatch = lambda: None
    owner.objects.ensure = lambda object_id: None
    owner.check_usable = lambda: None
    owner.actors.find_group_in_service = lambda name: (B, [{"CPU": 1.0}], "PACK")
    pgs.lookup("late")
    return pgs, owner


def _reserved_between_the_reads(pgs, owner) -> None:
    """The retry thread reserves the group between a caller's ledger read and its read of
    the record: the first ledger read says "not there", the record then says CREATED."""
    import types

    real = owner.ledger.groups

    def groups():
        out = dict(real())
        pgs.groups[B].state = "CREATED"  # _follow_served ran meanwhile
        owner.ledger.groups = lambda: {B: types.SimpleNamespace(group={"detached": True})}
        return out

    owner.ledger.groups = groups


def test_a_group_reserved_between_the_ledger_and_its_record_is_created_not_removed():
    """Defect: ``state_of`` and ``ready_object`` read the ledger, then the record; a group
    the retry thread reserved between the two read as REMOVED: ``wait()`` raised that it
    does not exist and ``ready()`` held TaskPlacementGroupRemoved."""
    from miniray._private.core import protocol

    pgs, owner = _found_pending()
    _reserved_between_the_reads(pgs, owner)
    assert pgs.state_of(B) == "CREATED"
    pgs, owner = _found_pending()
    _reserved_between_the_reads(pgs, owner)
    kinds = []
    owner.objects.set_ready = lambda object_id, kind, data: kinds.append(kind)
    pgs.ready_object(B, "handle")
    assert kinds == [protocol.OK]


def test_a_removed_served_group_is_not_noted_pending_again():
    """A served group this driver knows as REMOVED (its creator, or a finder) is not noted
    again as pending in the service (``served_pending``): an actor asked in it is not sent
    to the service for good."""
    from miniray._private.owner.placement_group_records import _Group

    pgs, owner, asked = _driver_pgs({}, held="PENDING")
    group = _Group(B, [{"CPU": 1.0}], "PACK", "", True)
    group.served = True
    group.state = "REMOVED"
    pgs.groups[B] = group
    zero = placement.rewrite_request({"CPU": 1}, B, 0)
    pgs.route_served(zero)
    assert not owner.remote_nodes.bundles.serves(zero) and asked == []
    assert B not in owner.remote_nodes.bundles.served_pending


def test_a_pending_served_group_removed_by_another_driver_is_no_longer_noted():
    """Defect: a group got by handle and noted pending in the service (``served_pending``)
    stayed noted once another driver removed it: every later actor in it went to the
    service. Now a later actor asks the service again (at most every STATE_ASK_S); the
    service holding it no more and the ledger not having it, it is no longer noted, and
    the actor stays here, where it fails as in a removed group (Ray's error)."""
    pgs, owner, asked = _driver_pgs({}, held="PENDING")
    bundles = owner.remote_nodes.bundles
    zero = placement.rewrite_request({"CPU": 1}, B, 0)
    pgs.route_served(zero)
    assert bundles.serves(zero) and asked == [B]
    owner.actors.group_state_in_service = lambda hex_: asked.append(hex_)  # removed: None
    pgs.route_served(zero)  # within STATE_ASK_S of the answer: not asked again
    assert bundles.serves(zero) and asked == [B]
    bundles.served_asked[B] -= pgs.STATE_ASK_S  # later
    pgs.route_served(zero)
    assert asked == [B, B] and not bundles.serves(zero)
    assert B not in bundles.served_pending and B not in bundles.served_asked
    pgs.route_served(zero)  # not noted again while the service does not hold it
    assert not bundles.serves(zero) and asked == [B, B, B]
    still, owner, asked = _driver_pgs({}, held="PENDING")  # still held: still noted
    still.route_served(zero)
    owner.remote_nodes.bundles.served_asked[B] -= still.STATE_ASK_S
    still.route_served(zero)
    assert owner.remote_nodes.bundles.serves(zero) and asked == [B, B]


def test_a_served_group_asked_about_while_the_service_cannot_answer_is_not_asked_per_actor():
    """Defect: ``served_asked`` was stamped only after the service answered, so while it
    could not answer (ServiceUnavailable) every actor creation asked again, and several
    creating threads all passed the check at once; and the second ledger read was not
    guarded (an OSError raised out of the actor's creation). Now the time is stamped
    before asking (under the lock), and a ledger that cannot be read leaves things as
    they are."""
    from miniray._private.owner.actor_link import ServiceUnavailable

    pgs, owner, asked = _driver_pgs({}, held="PENDING")
    bundles = owner.remote_nodes.bundles
    zero = placement.rewrite_request({"CPU": 1}, B, 0)

    def unavailable(hex_):
        asked.append(hex_)
        raise ServiceUnavailable("the node's actor service is not reachable")

    owner.actors.group_state_in_service = unavailable
    pgs.route_served(zero)
    pgs.route_served(zero)  # within STATE_ASK_S: not asked again
    assert asked == [B] and not bundles.serves(zero)
    bundles.served_asked[B] -= pgs.STATE_ASK_S
    owner.actors.group_state_in_service = lambda hex_: asked.append(hex_)  # None
    reads = [{}]

    def groups():
        if reads:
            return reads.pop()
        raise OSError("ledger unreadable")

    owner.ledger.groups = groups
    pgs.route_served(zero)  # the second read fails: no error, asked again later
    assert asked == [B, B] and not bundles.serves(zero) and B in bundles.served_asked


def test_an_actor_never_started_in_a_removed_group_is_unschedulable_as_in_ray():
    """Ray 2.60: an actor still waiting to be created when its group is removed raises
    ActorUnschedulableError on its calls; one that had started (alive, or restarting after
    a death) dies with ActorDiedError (None here: it is killed with ``_group_removed``)."""
    from miniray._private.owner.actor_records import A_ALIVE, A_PENDING, A_RESTARTING
    from miniray._private.owner.actors import never_created_in_removed_group
    from miniray.exceptions import ActorUnschedulableError, RayActorError

    error = never_created_in_removed_group(A_PENDING, "ab12")
    assert isinstance(error, ActorUnschedulableError)
    assert not isinstance(error, RayActorError)  # as in Ray: not an actor death
    assert str(error) == ("The actor is not schedulable: Could not create the actor because "
                          "its associated placement group was removed.\n"
                          "Required placement group ab12 is removed.")
    assert never_created_in_removed_group(A_ALIVE, "ab12") is None
    assert never_created_in_removed_group(A_RESTARTING, "ab12") is None
