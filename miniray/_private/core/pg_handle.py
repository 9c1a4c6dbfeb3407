"""The ``PlacementGroup`` handle (public as ``miniray.util.placement_group.PlacementGroup``).

Owns: the handle's data (the group's id and its bundles) and its methods, which ask the
current runtime (``context.py``): the driver's owner, or a worker's, which asks its driver.
Does not own: reserving or removing groups (``owner/placement_groups.py``) or validation
(``placement.py``). Here, in the lowest layer, so that the owner can build the value that a
group's ``ready()`` object holds, and a handle pickled into a task works there.

Mirrors ``ray.util.placement_group.PlacementGroup`` (Ray 2.60).
"""

from __future__ import annotations

from typing import Any

from miniray._private.core import context
from miniray._private.core.ids import PlacementGroupID

__all__ = ["PlacementGroup"]


class PlacementGroup:
    """A handle to a placement group: its ``id`` and its bundles.

    Example:
        >>> pg = placement_group([{"CPU": 1}])  # doctest: +SKIP
        >>> ray.get(pg.ready())  # doctest: +SKIP
    """

    def __init__(self, id: PlacementGroupID, bundle_cache: list[dict] | None = None):
        self.id = id
        self.bundle_cache = bundle_cache

    @staticmethod
    def empty() -> PlacementGroup:
        return PlacementGroup(PlacementGroupID.nil())

    def is_empty(self) -> bool:
        return self.id.is_nil()

    def ready(self) -> Any:
        """An ObjectRef that becomes this handle once the group is reserved (usable in
        ``get`` and ``wait``); it holds ``TaskPlacementGroupRemoved`` if the group is
        removed first."""
        return context.auto_init().placement_group_ready(self)

    def wait(self, timeout_seconds: float | int = 30) -> bool:
        """Waits until the group is reserved: True, or False after ``timeout_seconds``."""
        return context.auto_init().placement_group_wait(self.id.hex(), timeout_seconds)

    @property
    def bundle_specs(self) -> list[dict]:
        """The bundles, as given to ``placement_group()`` (amounts as floats)."""
        if self.bundle_cache is None:
            self.bundle_cache = context.auto_init().placement_group_bundles(self.id.hex())
        return [dict(b) for b in self.bundle_cache]

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __reduce__(self):
        return (PlacementGroup, (self.id, self.bundle_cache))


PlacementGroup.__module__ = "miniray.util.placement_group"
