"""The public surface: what miniray exports matches the Ray names it claims (Ray 2.60)."""

from __future__ import annotations

import importlib

import pytest

import miniray

# Names of ray.__all__ (Ray 2.60) that miniray provides.
RAY_TOP_LEVEL = [
    "available_resources", "cancel", "cluster_resources", "get", "get_actor", "get_gpu_ids",
    "get_runtime_context", "init", "is_initialized", "kill", "method", "nodes", "put",
    "remote", "shutdown", "timeline", "wait", "ObjectRef", "ObjectRefGenerator",
    "DynamicObjectRefGenerator", "actor", "util", "ActorClassID", "ActorID", "NodeID", "JobID",
    "WorkerID", "FunctionID", "ObjectID", "TaskID", "UniqueID", "PlacementGroupID",
]
# Modules Ray programs import (ray-api-surface §0).
RAY_MODULES = [
    "exceptions", "util", "util.accelerators", "util.queue", "util.placement_group",
    "util.scheduling_strategies", "util.actor_pool", "runtime_context", "actor",
    "remote_function", "runtime_env", "job_config", "types", "cloudpickle", "util.debug",
]


@pytest.mark.parametrize("name", RAY_TOP_LEVEL)
def test_top_level_name_is_exported(name):
    assert name in miniray.__all__
    assert getattr(miniray, name) is not None


@pytest.mark.parametrize("module", ["actor", "exceptions", "job_config", "remote_function",
                                    "runtime_context", "runtime_env", "util"])
def test_submodule_is_an_attribute_after_import(module):
    # `import ray; ray.util.list_named_actors()` works without importing ray.util.
    assert getattr(miniray, module) is importlib.import_module(f"miniray.{module}")


def test_everything_in_all_exists():
    for name in miniray.__all__:
        assert hasattr(miniray, name), name


@pytest.mark.parametrize("module", RAY_MODULES)
def test_module_imports_and_its_all_is_true(module):
    mod = importlib.import_module(f"miniray.{module}")
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"miniray.{module}.{name}"


@pytest.mark.parametrize("obj,module", [
    (miniray.ObjectRef, "miniray"),
    (miniray.ObjectRefGenerator, "miniray"),
    (miniray.DynamicObjectRefGenerator, "miniray._private.object_ref_generator"),
    (importlib.import_module("miniray.actor").ActorHandle, "miniray.actor"),
    (miniray.exceptions.RayTaskError, "miniray.exceptions"),
])
def test_public_classes_report_their_public_module(obj, module):
    assert obj.__module__ == module


def test_generator_types_are_at_rays_import_paths():
    """Ray 2.60 has both at ``ray._private.object_ref_generator`` (and ``ray._raylet``)."""
    from miniray._private import object_ref_generator

    assert object_ref_generator.ObjectRefGenerator is miniray.ObjectRefGenerator
    assert object_ref_generator.DynamicObjectRefGenerator is miniray.DynamicObjectRefGenerator


def test_util_exports():
    from miniray.util import ActorPool, list_named_actors  # noqa: F401
    from miniray.util.queue import Empty, Full, Queue  # noqa: F401
    from miniray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    assert NodeAffinitySchedulingStrategy("x", soft=True).soft is True


def test_placement_groups_validate_before_starting_anything():
    import miniray
    from miniray.util.placement_group import PlacementGroup, placement_group

    with pytest.raises(ValueError, match="Bundles must be a non-empty list"):
        placement_group([])
    assert not miniray.is_initialized()
    assert PlacementGroup.__module__ == "miniray.util.placement_group"
