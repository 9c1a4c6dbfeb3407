"""The reverse alias of ``miniray run --ray``: ``miniray`` and ``miniray.X`` give ``ray``
and ``ray.X`` (``core/alias.py``). A fake ``ray`` package in tmp_path stands in for Ray; the
finder and ``become_ray`` work on a private meta-path list and modules dict, so the test
process's own imports are never redirected."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from miniray._private.core import alias, config


@pytest.fixture
def fake_ray(tmp_path, monkeypatch):
    """A tiny ``ray`` package (``ray``, ``ray.util``, ``ray.util.queue``) first on sys.path;
    every ``ray*`` module it loads is forgotten again afterwards."""
    package = tmp_path / "ray"
    (package / "util").mkdir(parents=True)
    (package / "__init__.py").write_text("FAKE = True\n__version__ = '2.60.0'\n")
    (package / "util" / "__init__.py").write_text("WHO = 'ray.util'\n")
    (package / "util" / "queue.py").write_text("WHO = 'ray.util.queue'\n")
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "ray"}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] == "ray"]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.mark.parametrize("name,target", [
    ("miniray", "ray"),
    ("miniray.util", "ray.util"),
    ("miniray.util.queue", "ray.util.queue"),
    ("minirayx", None),
    ("ray", None),
    ("numpy", None),
    ("my.miniray", None),
])
def test_reverse_target(name, target):
    assert alias.reverse_target(name) == target


def test_finder_gives_the_ray_module_itself(fake_ray):
    finder = alias.MinirayToRayFinder()
    for name, target in (("miniray", "ray"), ("miniray.util", "ray.util"),
                         ("miniray.util.queue", "ray.util.queue")):
        spec = finder.find_spec(name)
        assert spec is not None and spec.name == name
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module is sys.modules[target]
        # The import system wrote the alias's spec onto the module; Ray's own is back.
        assert module.__spec__.name == target
    assert sys.modules["ray"].FAKE is True


def test_finder_refuses_names_ray_lacks_and_leaves_other_packages(fake_ray):
    """A miniray name Ray lacks fails in the finder itself, naming it: returning None would
    let a later finder (an editable install's) hand out miniray's own module."""
    finder = alias.MinirayToRayFinder()
    for name in ("miniray._private", "miniray.no_such_module", "miniray.util.no.such"):
        with pytest.raises(ModuleNotFoundError) as caught:
            finder.find_spec(name)
        assert caught.value.name == name
    assert finder.find_spec("numpy") is None
    assert finder.find_spec("ray.util") is None


def test_become_ray_installs_first_and_forgets_miniray_modules():
    class RayAliasFinder:  # stands in for the forward alias (matched by class name)
        pass

    class OutOfScopeFinder:
        pass

    class Other:
        pass

    other = Other()
    meta_path = [RayAliasFinder(), other, OutOfScopeFinder()]
    modules = {"miniray": 1, "miniray.util": 2, "miniray._private.cli": 3, "numpy": 4,
               "ray": 5, "minirayx": 6}
    forgotten = alias.become_ray(modules=modules, meta_path=meta_path)
    assert sorted(forgotten) == ["miniray", "miniray._private.cli", "miniray.util"]
    assert modules == {"numpy": 4, "ray": 5, "minirayx": 6}
    assert isinstance(meta_path[0], alias.MinirayToRayFinder)
    assert meta_path[1:] == [other]
    # Idempotent: a second call (the sitecustomize after cli.py, say) adds no second finder.
    alias.become_ray(modules=modules, meta_path=meta_path)
    assert len(meta_path) == 2 and alias.reverse_installed(meta_path)


def test_reverse_installed_knows_a_copy_loaded_by_path():
    class Copy:  # the same class from the sitecustomize's by-path load of alias.py
        miniray_on_ray = True

    assert alias.reverse_installed([Copy()])
    assert not alias.reverse_installed([object()])


def test_on_ray_environ_sets_the_flag_and_startup_dir_first():
    env = alias.on_ray_environ({"PYTHONPATH": os.pathsep.join(["/a", alias.STARTUP_DIR, "/b"]),
                                "MINIRAY_RAY_ALIAS": "1", "KEEP": "x"})
    assert env["MINIRAY_ON_RAY"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [alias.STARTUP_DIR, "/a", "/b"]
    assert "MINIRAY_RAY_ALIAS" not in env and env["KEEP"] == "x"
    assert alias.on_ray_environ({})["PYTHONPATH"] == alias.STARTUP_DIR
    assert os.path.isfile(os.path.join(alias.STARTUP_DIR, "sitecustomize.py"))
    assert alias.ON_RAY_ENV == config.ON_RAY_ENV


def test_forward_environ_sets_its_flag_and_startup_dir_first():
    env = alias.forward_environ({"PYTHONPATH": os.pathsep.join([alias.STARTUP_DIR, "/a"]),
                                 "MINIRAY_ON_RAY": "1", "KEEP": "x"})
    assert env["MINIRAY_RAY_ALIAS"] == "1" and "MINIRAY_ON_RAY" not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [alias.STARTUP_DIR, "/a"]
    assert env["KEEP"] == "x" and alias.RAY_ALIAS_ENV == config.RAY_ALIAS_ENV


def test_ray_missing_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    text = alias.ray_missing()
    assert 'pip install "ray[default]==2.60.0"' in text and "--ray" in text


def test_ray_missing_is_none_when_ray_is_importable(fake_ray):
    assert alias.ray_missing() is None


def test_ray_url_refusal_names_both_commands():
    from miniray._private.core import ray_client

    text = ray_client.ray_url_refusal("ray://head:10001")
    assert "ray://head:10001" in text
    assert "miniray run --ray" in text
    assert "ray job submit --address http://HEAD:8265 --working-dir . -- python script.py" in text
