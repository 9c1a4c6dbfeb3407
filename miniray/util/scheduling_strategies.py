"""Scheduling strategies, as data: importable where Ray programs import them.

Mirrors ``ray.util.scheduling_strategies`` (Ray 2.60). Differs: on one host every strategy
places work on the only node; ``NodeAffinitySchedulingStrategy`` naming another node fails
only if ``soft=False`` and the id is not this node's (checked nowhere else, since there is no
other node). ``PlacementGroupSchedulingStrategy`` is read at ``.remote()``
(``core/options.placement_option``) and places the call in its group's bundle.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DoesNotExist", "Exists", "In", "NodeAffinitySchedulingStrategy",
    "NodeLabelSchedulingStrategy", "NotIn", "PlacementGroupSchedulingStrategy",
]


class PlacementGroupSchedulingStrategy:
    def __init__(self, placement_group: Any, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None):
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks


class NodeAffinitySchedulingStrategy:
    def __init__(self, node_id: str, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False):
        self.node_id = node_id
        self.soft = soft
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable


class _LabelOperator:
    def __init__(self, *values: str):
        self.values = list(values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.values))})"


class In(_LabelOperator):
    pass


class NotIn(_LabelOperator):
    pass


class Exists(_LabelOperator):
    def __init__(self):
        super().__init__()


class DoesNotExist(_LabelOperator):
    def __init__(self):
        super().__init__()


class NodeLabelSchedulingStrategy:
    def __init__(self, hard: dict, *, soft: dict | None = None):
        self.hard = hard
        self.soft = soft or {}
