"""``ray.util.state.common``: the row types the state API returns (Ray 2.60's names).

Each is a dict whose keys also read as attributes (``actor.state``, ``actor["state"]``), as
Ray's schema objects are read; ``asdict()`` gives a plain dict.
"""

from __future__ import annotations

from miniray._private.core.state_rows import (
    ActorState,
    JobState,
    NodeState,
    ObjectState,
    PlacementGroupState,
    TaskState,
    WorkerState,
)

__all__ = ["ActorState", "JobState", "NodeState", "ObjectState", "PlacementGroupState",
           "TaskState", "WorkerState"]
