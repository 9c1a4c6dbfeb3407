"""Placement groups: resources reserved together, for tasks and actors to run in.

Mirrors ``ray.util.placement_group`` (Ray 2.60): the same functions, signatures, defaults
and errors. A group's bundles are reserved in the node's ledger (all or nothing) and show in
``cluster_resources()``/``available_resources()`` under Ray's derived names
(``CPU_group_<hex>``, ``CPU_group_0_<hex>``, ``bundle_group_...``); a task or actor
scheduled into a group takes its resources from a bundle (``core/placement.py`` holds the
design). Differs: every bundle is on this one node; a STRICT_SPREAD group of more than one
bundle raises ValueError at once (Ray keeps it pending); a group larger than the node is
reported on stderr at once (it stays pending, as in Ray); tasks queued or running in a
removed group fail with ``TaskPlacementGroupRemoved`` (Ray retries them into the removed
group, where they stay pending); ``bundle_label_selector`` and ``topology_strategy`` work
only without labels (the node has none); ``_soft_target_node_id`` is checked as Ray checks
it, then has nothing to choose between.
"""

from __future__ import annotations

from typing import Any

from miniray._private.core import context, placement
from miniray._private.core.ids import NodeID, PlacementGroupID
from miniray._private.core.pg_handle import PlacementGroup

__all__ = ["NODE_ID_LABEL_KEY", "PLACEMENT_GROUP_BUNDLE_RESOURCE_NAME", "PlacementGroup",
           "VALID_PLACEMENT_GROUP_STRATEGIES", "check_placement_group_index",
           "get_current_placement_group", "get_placement_group", "placement_group",
           "placement_group_table", "remove_placement_group", "validate_placement_group"]

VALID_PLACEMENT_GROUP_STRATEGIES = set(placement.STRATEGIES)
NODE_ID_LABEL_KEY = placement.NODE_ID_LABEL_KEY
PLACEMENT_GROUP_BUNDLE_RESOURCE_NAME = "bundle"  # bundle_group_<i>_<id>: Ray's name


def validate_placement_group(bundles: list[dict[str, float]], strategy: str | None = None,
                             lifetime: str | None = None,
                             _soft_target_node_id: str | None = None,
                             bundle_label_selector: list[dict[str, str]] | None = None,
                             topology_strategy: dict[str, str] | None = None) -> bool:
    """Ray's checks of ``placement_group()``'s arguments; raises ValueError as Ray does.

    Example:
        >>> validate_placement_group([{"CPU": 1}], "PACK")
        True
    """
    level = placement.check_topology_strategy(strategy, topology_strategy)
    if _soft_target_node_id and level != "STRICT_PACK":
        raise ValueError("_soft_target_node_id currently only works with STRICT_PACK but got "
                         f"{level}")
    if _soft_target_node_id:
        try:
            nil = NodeID(bytes.fromhex(_soft_target_node_id)).is_nil()
        except (TypeError, ValueError):
            nil = True
        if nil:
            raise ValueError(
                f"Invalid hex ID of _soft_target_node_id, got {_soft_target_node_id}")
    placement.check_bundles(bundles)
    if bundle_label_selector is not None and len(bundles) != len(bundle_label_selector):
        raise ValueError(
            f"Invalid bundle label selector {bundle_label_selector}. The length of "
            "`bundle_label_selector` should equal the length of `bundles`.")
    placement.check_lifetime(lifetime)
    return True


def check_placement_group_index(placement_group: PlacementGroup, bundle_index: int) -> None:
    """Ray's check of a bundle index against a group (-1: any bundle)."""
    assert placement_group is not None
    if placement_group.id.is_nil():
        if bundle_index != -1:
            raise ValueError(
                "If placement group is not set, the value of bundle index must be -1.")
        return
    placement.check_bundle_index(bundle_index, placement_group.bundle_count)


def placement_group(bundles: list[dict[str, float]], strategy: str | None = None,
                    name: str = "", lifetime: str | None = None,
                    _soft_target_node_id: str | None = None,
                    bundle_label_selector: list[dict[str, str]] | None = None,
                    topology_strategy: dict[str, str] | None = None) -> PlacementGroup:
    """Reserves ``bundles`` of resources together and returns the group's handle at once.

    Args:
        bundles: One dict of resources per bundle, e.g. ``[{"CPU": 1}, {"GPU": 1}]``.
        strategy: ``"PACK"`` (None means PACK), ``"SPREAD"``, ``"STRICT_PACK"`` or
            ``"STRICT_SPREAD"``.
        name: A name other drivers of the node can find it by (``get_placement_group``).
        lifetime: None (released when this driver exits) or ``"detached"`` (kept by the
            node until removed).
        _soft_target_node_id: A preferred node (STRICT_PACK only); there is one node.
        bundle_label_selector: Labels each bundle's node must have: only empty selectors
            are supported (nodes have no labels to select on).
        topology_strategy: ``{"ray.io/node-id": <strategy>}`` in place of ``strategy``;
            other topology labels are not supported (nodes have no labels).

    Returns:
        The group's handle; ``ready()`` and ``wait()`` tell when it is reserved.

    Raises:
        ValueError: bad bundles, strategy or lifetime (Ray's messages), or a STRICT_SPREAD
            group of more than one bundle (one node).

    Example:
        >>> pg = placement_group([{"CPU": 1}] * 2)  # doctest: +SKIP
        >>> ray.get(pg.ready())  # doctest: +SKIP
    """
    validate_placement_group(bundles, strategy, lifetime, _soft_target_node_id,
                             bundle_label_selector, topology_strategy)
    strategy = placement.check_topology_strategy(strategy, topology_strategy)
    if topology_strategy and set(topology_strategy) - {NODE_ID_LABEL_KEY}:
        raise NotImplementedError(
            "topology_strategy labels other than 'ray.io/node-id' are not supported by "
            "miniray: its node has no topology labels.")
    if bundle_label_selector and any(bundle_label_selector):
        raise NotImplementedError("bundle_label_selector is not supported by miniray: its node "
                                  "has no labels to select on (empty selectors are accepted).")
    if not isinstance(name, str):
        raise TypeError(f"The name of a placement group must be a str, got {type(name)}.")
    bundles = placement.check_bundles(bundles)
    detached = placement.check_lifetime(lifetime)
    group_id = PlacementGroupID.from_random()
    context.auto_init().placement_group_create(group_id.hex(), bundles, strategy, name,
                                               detached)
    return PlacementGroup(group_id, bundles)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Releases the group's reservation. Tasks running in it are killed and fail, queued
    ones fail (``TaskPlacementGroupRemoved``), and actors in it die (``ActorDiedError``)."""
    group_id = placement_group.id  # AttributeError for a non-group, as in Ray
    context.auto_init().placement_group_remove(group_id.hex())


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The group called ``placement_group_name`` (created by any driver of the node).

    Raises:
        ValueError: there is none (Ray's message).
    """
    if not placement_group_name:
        raise ValueError("Please supply a non-empty value to get_placement_group")
    hex_, bundles = context.auto_init().placement_group_lookup(placement_group_name)
    return PlacementGroup(PlacementGroupID(bytes.fromhex(hex_)), bundles)


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """Ray's table of groups, by id hex, or one group's entry: ``placement_group_id``,
    ``name``, ``bundles``, ``bundles_to_node_id``, ``strategy``, ``state`` (PENDING,
    CREATED, REMOVED) and ``stats``."""
    table = context.auto_init().placement_group_table()
    if placement_group is None:
        return table
    return table.get(placement_group.id.hex(), {})


def get_current_placement_group() -> PlacementGroup | None:
    """The group the calling task or actor runs in; None in the driver, or when the task
    was not scheduled into a group."""
    runtime = context.current()
    if runtime is None:
        return None
    current = runtime.current_placement()
    if current is None:
        return None
    return PlacementGroup(PlacementGroupID(bytes.fromhex(current[0])), current[1])
