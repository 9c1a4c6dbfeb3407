"""Placement groups: importable, not implemented.

Mirrors the names of ``ray.util.placement_group`` (Ray 2.60) so that programs that import
them load; creating a placement group raises NotImplementedError naming what to do instead
(on one host, ask for the resources on the tasks and actors themselves).
"""

from __future__ import annotations

__all__ = ["PlacementGroup", "get_current_placement_group", "get_placement_group",
           "placement_group", "placement_group_table", "remove_placement_group"]

_NOT_IMPLEMENTED = (
    "Placement groups are not implemented by miniray (one host: every bundle would land on "
    "the same node). Give the tasks and actors their resources directly instead."
)


class PlacementGroup:
    """Never constructed by miniray; present for isinstance checks and type hints."""


def placement_group(bundles, strategy=None, name="", lifetime=None, _soft_target_node_id=None,
                    bundle_label_selector=None, topology_strategy=None):
    raise NotImplementedError(_NOT_IMPLEMENTED)


def remove_placement_group(placement_group):
    raise NotImplementedError(_NOT_IMPLEMENTED)


def get_placement_group(placement_group_name: str):
    raise NotImplementedError(_NOT_IMPLEMENTED)


def placement_group_table(placement_group=None):
    return {}


def get_current_placement_group():
    return None
