"""``miniray._raylet``: the names Ray programs import from ``ray._raylet``.

Ray's compiled core module is private, but Ray's own documents import from it (the
streaming-generator page: ``from ray._raylet import ObjectRefGenerator``), so programs do
too. Each name here is the very object the public package gives (``_raylet.ObjectRef is
miniray.ObjectRef``), as in Ray 2.60, where ``ray.ObjectRef is ray._raylet.ObjectRef``;
nothing else of Ray's core module exists here.

Example:
    >>> from miniray._raylet import ObjectRef, ObjectRefGenerator
    >>> ObjectRef is ray.ObjectRef and ObjectRefGenerator is ray.ObjectRefGenerator
    True
"""

from __future__ import annotations

from miniray import (  # the package's own names (loaded on first use, as there)
    ActorClassID,
    ActorID,
    DynamicObjectRefGenerator,
    FunctionID,
    JobID,
    NodeID,
    ObjectID,
    ObjectRef,
    ObjectRefGenerator,
    PlacementGroupID,
    TaskID,
    UniqueID,
    WorkerID,
)

StreamingObjectRefGenerator = ObjectRefGenerator  # Ray 2.60's alias

__all__ = [
    "ActorClassID", "ActorID", "DynamicObjectRefGenerator", "FunctionID", "JobID", "NodeID",
    "ObjectID", "ObjectRef", "ObjectRefGenerator", "PlacementGroupID",
    "StreamingObjectRefGenerator", "TaskID", "UniqueID", "WorkerID",
]
