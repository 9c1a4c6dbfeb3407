"""The two import aliases between ``ray`` and ``miniray``: meta-path finders.

Owns: the forward alias (``import ray`` gives miniray, for ``miniray run``), the reverse alias
(``import miniray`` gives Ray, for ``miniray run --ray``), whether each is installed, and
the environment that carries either to the processes a program starts. Does not own:
running programs (``cli.py`` installs the forward alias for ``miniray run`` and the reverse
one for ``miniray run --ray``; the fork server installs the forward one in workers when the
driver had it; ``ray_startup/sitecustomize.py`` installs the reverse one in every Python
process started under ``miniray run --ray``, Ray's workers included, and the forward one in
every Python process a ``miniray run`` program or its workers start).

``ray.X`` is the very module object ``miniray.X`` (not a copy), so ``ray.util is
miniray.util`` and state is shared. Only installed on request: importing miniray never
hijacks ``import ray``. ``ray.data`` and Ray's other libraries raise an ImportError
worded for ``miniray run`` (``out_of_scope.py``).

The reverse alias is the same idea pointed the other way: ``miniray.X`` is the very module
object ``ray.X``, so a program written with ``import miniray as ray`` runs on real Ray.
Ray's workers get it without Ray's help: they inherit the driver's environment when
``ray.init()`` starts the local cluster (Ray 2.60 starts its raylet, and the raylet its
workers, with the driver's environment), and ``miniray run --ray`` puts
``ray_startup/`` first on ``PYTHONPATH``, whose ``sitecustomize.py`` installs the finder at
interpreter start-up when ``MINIRAY_ON_RAY=1``. A worker only needs it when it imports a module
of the program that says ``import miniray``: cloudpickle sends a module global by the module's
``__name__``, which is already ``ray``. The sitecustomize loads this file by path, so nothing
here may import miniray at module level (``out_of_scope`` is imported lazily).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

# ``miniray run --ray`` sets it (and ``ray_startup/`` on PYTHONPATH) for the program and every
# process it starts; the same name as ``config.ON_RAY_ENV``, repeated because this file must
# not import miniray (see the module docstring).
ON_RAY_ENV = "MINIRAY_ON_RAY"
RAY_ALIAS_ENV = "MINIRAY_RAY_ALIAS"  # ``miniray run``'s flag: ``config.RAY_ALIAS_ENV``
RAY_INSTALL_HINT = 'pip install "ray[default]==2.60.0"'
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_startup")


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class RayAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``ray`` and ``ray.<sub>`` as ``miniray`` and ``miniray.<sub>``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "ray" and not fullname.startswith("ray."):
            return None
        from miniray._private.core import out_of_scope  # lazy: this file loads by path too

        # Ray's libraries (ray.data, ...) raise an ImportError saying how to run on Ray.
        refusal = out_of_scope.refusal_spec(fullname, "ray")
        if refusal is not None:
            return refusal
        target_name = "miniray" + fullname[3:]
        if importlib.util.find_spec(target_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name))


def installed() -> bool:
    return any(isinstance(finder, RayAliasFinder) for finder in sys.meta_path)


def install() -> None:
    from miniray._private.core import out_of_scope  # lazy: this file loads by path too

    if not installed():
        sys.meta_path.insert(0, RayAliasFinder())
    out_of_scope.speak_of_ray()


# --------------------------------------------------------------------------- the reverse alias


def reverse_target(fullname: str) -> str | None:
    """The Ray module that ``fullname`` names under the reverse alias (``miniray.util`` ->
    ``ray.util``), or None when ``fullname`` is not ``miniray`` or inside it."""
    if fullname == "miniray" or fullname.startswith("miniray."):
        return "ray" + fullname[len("miniray"):]
    return None


class _ReverseLoader(_AliasLoader):
    """Hands out the Ray module itself, leaving its ``__spec__`` as Ray set it (the import
    system writes the alias's spec onto the module it is given; this puts Ray's back)."""

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = getattr(module, "__spec__", None)
        return module

    def exec_module(self, module):
        if getattr(self, "_spec", None) is not None:
            module.__spec__ = self._spec


class MinirayToRayFinder:
    """Finds ``miniray`` and ``miniray.<sub>`` as ``ray`` and ``ray.<sub>``.

    A name Ray does not have (``miniray._private...``) is not found: the import fails with
    ModuleNotFoundError naming it, here, rather than passing on to a later finder (an
    editable install's finder would otherwise hand out miniray's own module and mix it into
    a Ray program).
    """

    # Marks the finder whichever copy of this file defined it (cli.py's import or the
    # sitecustomize's load by path), so ``reverse_installed`` never installs it twice.
    miniray_on_ray = True

    def find_spec(self, fullname, path=None, target=None):
        target_name = reverse_target(fullname)
        if target_name is None:
            return None
        try:
            found = importlib.util.find_spec(target_name) is not None
        except ModuleNotFoundError:  # a parent Ray lacks
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: under `miniray run --ray` miniray's names are "
                f"Ray's, and Ray has no {target_name!r}.", name=fullname)
        return importlib.util.spec_from_loader(fullname, _ReverseLoader(target_name))


def reverse_installed(meta_path: list | None = None) -> bool:
    meta_path = sys.meta_path if meta_path is None else meta_path
    return any(getattr(finder, "miniray_on_ray", False) for finder in meta_path)


def ray_missing() -> str | None:
    """Why ``miniray run --ray`` cannot run here (Ray is not importable), or None."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return (f"miniray run --ray: Ray is not installed for {sys.executable}. Install it with "
            f"`{RAY_INSTALL_HINT}`, or drop --ray to run the program on miniray.")


def forward_environ(environ: dict) -> dict:
    """``environ`` with what every Python process a ``miniray run`` program starts needs for
    its own ``import ray`` to give miniray, as the driver's does (a ``spawn`` pool's children,
    a ``subprocess`` of ``sys.executable``): the flag, ``ray_startup/`` first on
    PYTHONPATH, and no reverse alias."""
    env = _with_startup_dir(environ)
    env[RAY_ALIAS_ENV] = "1"
    env.pop(ON_RAY_ENV, None)
    return env


def _with_startup_dir(environ: dict) -> dict:
    env = dict(environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != STARTUP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR] + parts)
    return env


def on_ray_environ(environ: dict) -> dict:
    """``environ`` with what every process of a ``miniray run --ray`` program needs: the flag,
    ``ray_startup/`` first on PYTHONPATH, and no forward alias."""
    env = _with_startup_dir(environ)
    env[ON_RAY_ENV] = "1"
    env.pop(RAY_ALIAS_ENV, None)
    return env


def become_ray(modules: dict | None = None, meta_path: list | None = None) -> list:
    """From now on ``import miniray`` gives Ray: installs the reverse finder first on
    ``meta_path``, removes miniray's own finders (the forward alias, the out-of-scope
    refusals) and forgets every ``miniray`` module already imported (``modules``), so the next
    import goes through the finder. Returns the names forgotten. The running caller keeps
    the module objects it already holds."""
    modules = sys.modules if modules is None else modules
    meta_path = sys.meta_path if meta_path is None else meta_path
    for finder in list(meta_path):
        if type(finder).__name__ in ("RayAliasFinder", "OutOfScopeFinder"):
            meta_path.remove(finder)
    if not reverse_installed(meta_path):
        meta_path.insert(0, MinirayToRayFinder())
    forgotten = [name for name in list(modules) if reverse_target(name) is not None]
    for name in forgotten:
        del modules[name]
    return forgotten
