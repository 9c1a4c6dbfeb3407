"""Ray's libraries outside Ray Core: which names are refused, and what the ImportError says."""

from __future__ import annotations

import importlib
import sys

import pytest

from miniray._private.core import out_of_scope


@pytest.mark.parametrize("fullname,library", [
    ("ray.data", "data"), ("ray.data.dataset", "data"), ("ray.util.collective", "util.collective"),
    ("ray.util.collective.types", "util.collective"), ("ray.job_submission", "job_submission"),
    ("ray.cluster_utils", "cluster_utils"),
    ("ray.util", None), ("ray.dataclasses", None), ("ray.util.queue", None), ("ray", None),
    ("miniray.data", None), ("raydata", None),
])
def test_library_of_names_only_the_libraries_under_the_prefix(fullname, library):
    assert out_of_scope.library_of(fullname, "ray") == library


def test_message_says_core_only_and_how_to_run_on_ray():
    under_run = out_of_scope.message("tune", under_alias=True)
    assert under_run.startswith("ray.tune is not provided by miniray")
    assert "Ray Core only" in under_run and "pip install 'ray[tune]'" in under_run
    assert "instead of `miniray run`" in under_run
    direct = out_of_scope.message("autoscaler", under_alias=False)
    assert direct.startswith("miniray.autoscaler is not provided")
    assert "pip install 'ray[default]'" in direct and "import ray instead of miniray" in direct


@pytest.mark.parametrize("module", ["miniray.data", "miniray.train", "miniray.tune",
                                    "miniray.serve", "miniray.rllib", "miniray.workflow",
                                    "miniray.autoscaler", "miniray.job_submission",
                                    "miniray.util.collective", "miniray.data.preprocessors"])
def test_importing_a_library_raises_import_error_with_the_message(module, monkeypatch):
    monkeypatch.setattr(out_of_scope, "_alias_installed", False)
    with pytest.raises(ImportError, match="is not provided by miniray: miniray covers Ray Core"
                       ) as info:
        importlib.import_module(module)
    assert not isinstance(info.value, ModuleNotFoundError)
    assert module not in sys.modules


def test_from_import_raises_the_same_error(monkeypatch):
    monkeypatch.setattr(out_of_scope, "_alias_installed", False)
    with pytest.raises(ImportError, match=r"miniray\.data is not provided by miniray"):
        from miniray import data  # noqa: F401


def test_a_missing_name_that_is_no_library_is_still_a_plain_module_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("miniray.no_such_module")


def test_attribute_access_imports_the_lazy_libraries_as_ray_does(monkeypatch):
    # Ray 2.60's top-level __getattr__ imports data, workflow and autoscaler on first access.
    import miniray

    monkeypatch.setattr(out_of_scope, "_alias_installed", False)
    for name in ("data", "workflow", "autoscaler"):
        with pytest.raises(ImportError, match=f"miniray.{name} is not provided by miniray"):
            getattr(miniray, name)
    with pytest.raises(AttributeError, match="has no attribute 'tune'"):
        miniray.tune  # noqa: B018
    assert not hasattr(miniray, "no_such_name")
