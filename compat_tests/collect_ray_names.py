"""Writes ``ray_2_60_names.json``: the public names of Ray that a Ray Core program reaches for.

Run it with Ray's own interpreter (never a miniray dependency)::

    <ray-venv>/bin/python compat_tests/collect_ray_names.py > compat_tests/ray_2_60_names.json

What counts as a public name: each module's ``__all__`` where it has one, else the names the
module itself defines (not imported helpers, not typing variables); the public methods and
properties of the classes programs call methods on; and Ray's library packages, which a
program reaches as modules. ``test_ray_surface.py`` checks every name against miniray.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import warnings

# Modules a Ray Core program imports from (section 0 of the API surface, plus what real
# programs import: types, metrics, state, DAGs, tqdm_ray, joblib, multiprocessing).
MODULES = (
    "ray", "ray.actor", "ray.remote_function", "ray.runtime_context", "ray.runtime_env",
    "ray.job_config", "ray.exceptions", "ray.types", "ray.util", "ray.util.accelerators",
    "ray.util.queue", "ray.util.actor_pool", "ray.util.placement_group",
    "ray.util.scheduling_strategies", "ray.util.metrics", "ray.util.annotations",
    "ray.util.check_serialize", "ray.util.debug", "ray.util.state", "ray.util.multiprocessing",
    "ray.util.joblib", "ray.dag", "ray.experimental.tqdm_ray",
)

# Classes whose methods programs call: (module, class).
CLASSES = (
    ("ray", "ObjectRef"), ("ray", "ObjectRefGenerator"), ("ray.actor", "ActorClass"),
    ("ray.actor", "ActorMethod"), ("ray.remote_function", "RemoteFunction"),
    ("ray.runtime_context", "RuntimeContext"), ("ray.util.placement_group", "PlacementGroup"),
    ("ray.util.actor_pool", "ActorPool"), ("ray.util.queue", "Queue"),
)

# Ray's library packages: a program reaches them as modules.
LIBRARIES = (
    "ray.data", "ray.train", "ray.tune", "ray.serve", "ray.rllib", "ray.workflow",
    "ray.autoscaler", "ray.job_submission", "ray.util.collective",
)

# ``ray.cloudpickle`` is cloudpickle itself; its public functions are the ones programs use.
CLOUDPICKLE = ("dumps", "loads", "dump", "load", "Pickler", "register_pickle_by_value",
               "unregister_pickle_by_value")

# Module-level names that are typing or import plumbing, not API.
_NOT_API = {"T", "F", "V", "TYPE_CHECKING"}

# Modules that need a third-party package Ray's environment may lack: their names, as
# Ray 2.60 documents them.
_DOCUMENTED = {"ray.util.joblib": ["register_ray"]}


def module_names(name: str) -> list[str]:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return list(_DOCUMENTED[name])
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and not inspect.ismodule(v)
                 and getattr(v, "__module__", name) == name]
    return sorted(set(names) - _NOT_API - set(LIBRARIES_SHORT.get(name, ())))


# ``ray.__all__`` lists some library packages: they are reported once, as libraries.
LIBRARIES_SHORT = {"ray": ("autoscaler", "data", "workflow"), "ray.util": ("collective",)}


# Members set on each instance, which ``dir`` of the class does not show.
_INSTANCE_MEMBERS = {"RemoteFunction": ["remote"]}


def is_module(module: str, name: str) -> bool:
    """Whether Ray's ``module.name`` is a module (``ray.util.accelerators``) rather than a
    function, class or value (``ray.util.placement_group`` is the function)."""
    try:
        return inspect.ismodule(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError):
        return False


def class_members(module: str, cls_name: str) -> list[str]:
    cls = getattr(importlib.import_module(module), cls_name)
    members = [n for n in dir(cls) if not n.startswith("_")]
    return sorted(set(members) | set(_INSTANCE_MEMBERS.get(cls_name, ())))


def main() -> None:
    import ray

    warnings.simplefilter("ignore")  # deprecated names are still names
    rows = []
    for module in MODULES:
        rows += [{"module": module, "name": n, "kind": "name", "is_module": is_module(module, n)}
                 for n in module_names(module)]
    rows += [{"module": "ray.cloudpickle", "name": n, "kind": "name"} for n in CLOUDPICKLE]
    for module, cls in CLASSES:
        rows += [{"module": module, "name": f"{cls}.{m}", "kind": "member"}
                 for m in class_members(module, cls)]
    rows += [{"module": lib, "name": "", "kind": "library"} for lib in LIBRARIES]
    # One row per line, so that a new Ray version's changes read as a short diff.
    version = json.dumps(ray.__version__)
    sys.stdout.write('{"ray_version": ' + version + ', "names": [\n')
    sys.stdout.write(",\n".join(json.dumps(row) for row in rows))
    sys.stdout.write("\n]}\n")


if __name__ == "__main__":
    main()
