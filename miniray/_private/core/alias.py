"""``import ray`` resolving to miniray: a meta-path finder mapping ``ray`` and ``ray.*``.

Owns: the alias finder and whether it is installed. Does not own: running programs
(``cli.py`` installs it for ``miniray run``; the fork server installs it in workers when the
driver had it).

``ray.X`` is the very module object ``miniray.X`` (not a copy), so ``ray.util is
miniray.util`` and state is shared. Only installed on request: importing miniray never
hijacks ``import ray``. ``ray.data`` and Ray's other libraries raise an ImportError
worded for ``miniray run`` (``out_of_scope.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from miniray._private.core import out_of_scope


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
    if not installed():
        sys.meta_path.insert(0, RayAliasFinder())
    out_of_scope.speak_of_ray()
