"""``import miniray``, the command line and the node process stay light.

``miniray/__init__.py`` loads each public name on first use (module ``__getattr__``), so the
``miniray`` command (which imports ``miniray._private.cli``, and with it the package) and the
node process pay only for what they use; the fork server loads everything
(``miniray._load_all()``) before it forks workers. Each check runs in a fresh interpreter, where
``sys.modules`` says what an import really loaded.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import miniray
from miniray._private.core import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))

# What none of the light paths may load: the engine, the store, the public API's heavy
# modules, and the libraries they pull in.
HEAVY = ("miniray._private.runtime", "miniray._private.api", "miniray._private.surface",
         "miniray._private.owner", "miniray._private.worker",
         "miniray._private.object_store.values", "miniray.actor", "miniray.remote_function",
         "miniray.util", "numpy", "asyncio", "cloudpickle", "importlib.metadata")


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running ``statement``."""
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_import_miniray_loads_nothing_heavy():
    modules = _loaded_after("import miniray")
    assert _heavy(modules) == []
    # The out-of-scope refusals are installed at import, as before.
    assert "miniray._private.core.out_of_scope" in modules


def test_the_command_line_loads_nothing_heavy_before_a_command_runs():
    modules = _loaded_after("from miniray._private import cli; cli._parser()")
    assert _heavy(modules) == []


def test_the_node_process_loads_no_engine():
    # The node keeps a ledger and relays to its fork server: no runtime, owner, worker or
    # public API, and not the store's module (with cloudpickle) before a driver names one.
    modules = _loaded_after("from miniray._private.node.node import main")
    assert _heavy(modules) == []
    assert "miniray._private.object_store.shm_segments" not in modules


def test_the_start_command_loads_no_node_before_it_spawns_one():
    modules = _loaded_after(textwrap.dedent("""
        from miniray._private import cli
        from miniray._private.node import daemon
        def stop(options, *a, **k):
            raise SystemExit(0)
        daemon.spawn_daemon = stop
        try:
            cli.main(["start", "--head", "--port", "0"])
        except SystemExit:
            pass
    """))
    assert _heavy(modules) == []
    assert "miniray._private.node.node" not in modules


def test_load_all_loads_what_an_eager_import_did():
    modules = _loaded_after("import miniray; miniray._load_all()")
    for name in ("miniray._private.runtime", "miniray._private.api", "miniray.actor",
                 "miniray.util", "miniray.runtime_context", "miniray._private.surface",
                 "miniray._private.object_ref_generator", "cloudpickle"):
        assert name in modules, name


def test_the_first_use_of_the_api_loads_all_of_it():
    # As the eager import did, only later: the first task then pays no import.
    eager = set(_loaded_after("import miniray; miniray._load_all()"))
    for statement in ("miniray.init", "miniray.remote", "miniray.util", "miniray.get"):
        modules = set(_loaded_after(f"import miniray; {statement}"))
        assert modules >= {m for m in eager if m.startswith("miniray")}, statement


def test_ids_and_exceptions_load_without_the_engine():
    modules = _loaded_after("import miniray; from miniray import ActorID, exceptions, "
                            "runtime_env, job_config; miniray.TaskID; miniray.LoggingConfig")
    assert _heavy(modules) == []


def test_every_public_name_resolves_in_a_fresh_interpreter():
    modules = _loaded_after(textwrap.dedent("""
        import importlib, miniray
        assert "remote" in dir(miniray) and set(miniray.__all__) <= set(dir(miniray))
        from miniray import ObjectRef, remote, get
        assert miniray.ObjectID is ObjectRef and miniray.remote is remote
        for name in miniray.__all__:
            assert getattr(miniray, name) is not None, name
        assert miniray.util.ActorPool is importlib.import_module("miniray.util").ActorPool
        assert miniray.actor is importlib.import_module("miniray.actor")
        assert miniray.cloudpickle is importlib.import_module("miniray.cloudpickle")
        try:
            miniray.no_such_name
        except AttributeError as error:
            assert "no_such_name" in str(error)
        else:
            raise AssertionError("no AttributeError")
    """))
    assert "miniray._private.runtime" in modules


def test_a_lazily_loaded_class_pickles_by_reference():
    # ObjectRef's __module__ is "miniray": unpickling looks it up through the package.
    data = pickle.dumps(miniray.ObjectRef)
    assert pickle.loads(data) is miniray.ObjectRef
    modules = _loaded_after(textwrap.dedent(f"""
        import pickle
        assert pickle.loads({data!r}).__name__ == "ObjectRef"
    """))
    assert "miniray._private.core.object_ref" in modules


@pytest.mark.parametrize("listing, expected", [
    ({"a": ["numpy-2.4.6.dist-info", "numpy"]}, "2.4.6"),
    ({"a": ["NumPy-1.2.egg-info"]}, "1.2"),
    ({"a": ["numpy-1.26.4-py3.11.egg-info"]}, "1.26.4"),
    ({"a": ["numpy_extra-1.0.dist-info", "numpy"], "b": ["numpy-3.0.dist-info"]}, "3.0"),
    ({"a": ["numpy-1.0.dist-info"], "b": ["numpy-2.0.dist-info"]}, "1.0"),  # first on the path
    ({"a": ["numpy.dist-info", "numpy-.dist-info", "numpy-1.0.txt"]}, None),
    ({}, None),
])
def test_a_distributions_version_is_read_from_its_metadata_folder_name(listing, expected):
    paths = ["a", "b", "missing"]
    assert protocol.dist_version_from_path(
        "numpy", paths, lambda path: listing.get(path, [])) == expected


def test_a_dash_or_dot_in_a_distribution_name_compares_normalized():
    listing = {"p": ["typing_extensions-4.16.0.dist-info"]}
    assert protocol.dist_version_from_path("typing-extensions", ["p"], listing.get) == "4.16.0"


def test_dist_version_agrees_with_importlib_metadata_for_installed_packages():
    import importlib.metadata

    for name in ("pytest", "cloudpickle"):
        assert protocol.dist_version_from_path(name, sys.path, protocol._listdir) \
            == importlib.metadata.version(name)
