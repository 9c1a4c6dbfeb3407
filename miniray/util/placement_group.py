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
group, where they stay pending); ``_soft_target_node_id`` and ``bundle_label_selector``
are accepted only as None.
"""

from __future__ import annotations

from typing import Any

from miniray._private.core import context, placement
from miniray._private.core.ids import PlacementGroupID
from miniray._private.core.pg_handle import PlacementGroup

__all__ = ["PlacementGroup", "get_current_placement_group", "get_placement_group",
           "placement_group", "placement_group_table", "remove_placement_group"]


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None, _soft_target_node_id: str | None = None,
                    bundle_label_selector: list[dict[str, str]] | None = None,
                    ) -> PlacementGroup:
    """Reserves ``bundles`` of resources together and returns the group's handle at once.

    Args:
        bundles: One dict of resources per bundle, e.g. ``[{"CPU": 1}, {"GPU": 1}]``.
        strategy: ``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"``.
        name: A name other drivers of the node can find it by (``get_placement_group``).
        lifetime: None (released when this driver exits) or ``"detached"`` (kept by the
            node until removed).

    Returns:
        The group's handle; ``ready()`` and ``wait()`` tell when it is reserved.

    Raises:
        ValueError: bad bundles, strategy or lifetime (Ray's messages), or a STRICT_SPREAD
            group of more than one bundle (one node).

    Example:
        >>> pg = placement_group([{"CPU": 1}] * 2)  # doctest: +SKIP
        >>> ray.get(pg.ready())  # doctest: +SKIP
    """
    bundles = placement.check_bundles(bundles)
    placement.check_strategy(strategy)
    detached = placement.check_lifetime(lifetime)
    if _soft_target_node_id is not None:
        raise NotImplementedError("_soft_target_node_id is not supported by miniray "
                                  "(one node: every bundle is on it).")
    if bundle_label_selector is not None:
        raise NotImplementedError("bundle_label_selector is not supported by miniray "
                                  "(nodes have no labels to select).")
    if not isinstance(name, str):
        raise TypeError(f"The name of a placement group must be a str, got {type(name)}.")
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
