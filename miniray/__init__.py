"""miniray: Ray's core API on one host, in pure Python. ``import miniray as ray``.

Mirrors the top-level ``ray`` module (Ray 2.60). What differs is listed in README.md.
Importing this package starts nothing: ``init()`` (or the first call that needs a runtime)
does.
"""

from __future__ import annotations

import importlib

# Submodules are attributes after ``import miniray``, as in Ray (``ray.util...``).
from miniray import actor, exceptions, internal, util
from miniray import cloudpickle as cloudpickle  # an attribute, not in __all__, as in Ray
from miniray import job_config as job_config
from miniray import remote_function as remote_function
from miniray import runtime_context as runtime_context
from miniray import runtime_env as runtime_env
from miniray._private.api import (
    ObjectRefGenerator,
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_gpu_ids,
    nodes,
    put,
    timeline,
    wait,
)
from miniray._private.core import out_of_scope as _out_of_scope
from miniray._private.core.cross_language import Language, java_actor_class, java_function
from miniray._private.core.ids import (
    ActorClassID,
    ActorID,
    FunctionID,
    JobID,
    NodeID,
    PlacementGroupID,
    TaskID,
    UniqueID,
    WorkerID,
)
from miniray._private.core.logging_config import LoggingConfig
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.ray_client import ClientBuilder, client

# Imported from Ray's path, its ``__module__``: loaded in every process, so a worker pickles
# the instances it returns by reference.
from miniray._private.object_ref_generator import DynamicObjectRefGenerator
from miniray._private.runtime import init, is_initialized, shutdown
from miniray._private.surface import get_actor, kill, remote
from miniray._version import __version__
from miniray.actor import method
from miniray.runtime_context import get_runtime_context

# How the process runs Ray code, as Ray numbers it (``ray.SCRIPT_MODE``, ``ray.WORKER_MODE``).
SCRIPT_MODE = 0
WORKER_MODE = 1

# As in Ray, ``ObjectID`` is another name of ``ObjectRef`` (``ray.ObjectID is ray.ObjectRef``).
ObjectID = ObjectRef

# ``import miniray.data`` (and Ray's other libraries) raises an ImportError saying how to run the
# program on Ray, rather than a bare "No module named".
_out_of_scope.install()


def __getattr__(name: str):
    # Ray imports these three on first attribute access (``import ray; ray.data.range(3)``):
    # here the import raises the out-of-scope ImportError instead of an AttributeError.
    if name in _out_of_scope.LAZY_ATTRIBUTES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "__version__",
    "actor",
    "ActorClassID",
    "ActorID",
    "available_resources",
    "cancel",
    "client",
    "ClientBuilder",
    "cluster_resources",
    "DynamicObjectRefGenerator",
    "exceptions",
    "FunctionID",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "internal",
    "is_initialized",
    "java_actor_class",
    "java_function",
    "JobID",
    "kill",
    "Language",
    "LoggingConfig",
    "method",
    "NodeID",
    "nodes",
    "ObjectID",
    "ObjectRef",
    "ObjectRefGenerator",
    "PlacementGroupID",
    "put",
    "remote",
    "SCRIPT_MODE",
    "shutdown",
    "TaskID",
    "timeline",
    "UniqueID",
    "util",
    "wait",
    "WORKER_MODE",
    "WorkerID",
]
