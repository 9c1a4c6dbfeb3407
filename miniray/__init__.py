"""miniray: Ray's core API on one host, in pure Python. ``import miniray as ray``.

Mirrors the top-level ``ray`` module (Ray 2.60). What differs is listed in README.md.
Importing this package starts nothing: ``init()`` (or the first call that needs a runtime)
does. It loads almost nothing either: the public names are imported on first use (module
``__getattr__``, below), so the command line, the node process and ``python -c "import
miniray"`` pay only for what they use; the first name that needs the engine loads the whole
API. ``tests/unit/test_light_import.py`` keeps it that way.
"""

from __future__ import annotations

import importlib

from miniray._private.core import out_of_scope as _out_of_scope
from miniray._version import __version__

# What type checkers see (they read the name TYPE_CHECKING as true); at run time each name
# loads on first use, below. Not typing's constant: importing typing alone costs milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from miniray import actor, exceptions, internal, util
    from miniray import cloudpickle as cloudpickle
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
    from miniray._private.core.object_ref import ObjectRef as ObjectID
    from miniray._private.core.ray_client import ClientBuilder, client
    from miniray._private.object_ref_generator import DynamicObjectRefGenerator
    from miniray._private.runtime import init, is_initialized, shutdown
    from miniray._private.surface import get_actor, kill, remote
    from miniray.actor import method
    from miniray.runtime_context import get_runtime_context
del TYPE_CHECKING

# How the process runs Ray code, as Ray numbers it (``ray.SCRIPT_MODE``, ``ray.WORKER_MODE``).
SCRIPT_MODE = 0
WORKER_MODE = 1

# Every other public name is loaded on first use (PEP 562), so that ``import miniray`` (and
# with it the ``miniray`` command line and the node process, which import a submodule) costs
# about a millisecond instead of loading the engine. Name -> (module, attribute in it; None:
# the module itself). After the first access the value is a plain module global.
_SUBMODULES = ("actor", "cloudpickle", "exceptions", "internal", "job_config",
               "remote_function", "runtime_context", "runtime_env", "util")
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: (f"miniray.{name}", None) for name in _SUBMODULES},
    **{name: ("miniray._private.api", name) for name in (
        "ObjectRefGenerator", "available_resources", "cancel", "cluster_resources", "get",
        "get_gpu_ids", "nodes", "put", "timeline", "wait")},
    **{name: ("miniray._private.core.cross_language", name) for name in (
        "Language", "java_actor_class", "java_function")},
    **{name: ("miniray._private.core.ids", name) for name in (
        "ActorClassID", "ActorID", "FunctionID", "JobID", "NodeID", "PlacementGroupID",
        "TaskID", "UniqueID", "WorkerID")},
    "LoggingConfig": ("miniray._private.core.logging_config", "LoggingConfig"),
    "ObjectRef": ("miniray._private.core.object_ref", "ObjectRef"),
    # As in Ray, ``ObjectID`` is another name of ``ObjectRef`` (``ray.ObjectID is ray.ObjectRef``).
    "ObjectID": ("miniray._private.core.object_ref", "ObjectRef"),
    "ClientBuilder": ("miniray._private.core.ray_client", "ClientBuilder"),
    "client": ("miniray._private.core.ray_client", "client"),
    # From Ray's path, its ``__module__``; a worker pickles the instances it returns by
    # reference (the fork server loads it with the rest: ``_load_all``).
    "DynamicObjectRefGenerator": ("miniray._private.object_ref_generator",
                                  "DynamicObjectRefGenerator"),
    **{name: ("miniray._private.runtime", name) for name in (
        "init", "is_initialized", "shutdown")},
    **{name: ("miniray._private.surface", name) for name in ("get_actor", "kill", "remote")},
    "method": ("miniray.actor", "method"),
    "get_runtime_context": ("miniray.runtime_context", "get_runtime_context"),
}

# ``import miniray.data`` (and Ray's other libraries) raises an ImportError saying how to run the
# program on Ray, rather than a bare "No module named".
_out_of_scope.install()


# Modules that load the engine (the runtime and what it imports). The first use of a name
# from one of them loads the whole public API at once, as an eager import did, so that a
# program's first task pays no import: ``import miniray as ray; ray.init(); f.remote()``
# loads what it always loaded, only later. The other names (ids, exceptions, ...) load alone.
_ENGINE = frozenset({
    "miniray._private.api", "miniray._private.object_ref_generator", "miniray._private.runtime",
    "miniray._private.surface", "miniray.actor", "miniray.remote_function",
    "miniray.runtime_context", "miniray.util",
})


def _resolve(name: str):
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # from now on a plain attribute
    return value


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is not None:
        if where[0] in _ENGINE:
            _load_all()
            return globals()[name]
        return _resolve(name)
    # Ray imports these three on first attribute access (``import ray; ray.data.range(3)``):
    # here the import raises the out-of-scope ImportError instead of an AttributeError.
    if name in _out_of_scope.LAZY_ATTRIBUTES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _load_all() -> None:
    """Loads every lazily loaded name now, as an eager ``import miniray`` did: on the first use
    of the API, and in the fork server before it forks workers (its command line calls it),
    so that no worker pays the imports on its first task."""
    for name in _LAZY:
        if name not in globals():
            _resolve(name)


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
