"""Ray's libraries that miniray does not provide, and the ImportError that names them.

Owns: the list of Ray 2.60 library packages outside Ray Core (``ray.data``, ``ray.train``,
...), the message an import of one of them raises, and the meta-path finder that raises it
for ``miniray.<library>``. Does not own: the ``ray`` alias (``alias.py`` asks
``refusal_spec`` for ``ray.<library>`` and says when it is installed).
Called by: ``miniray/__init__.py`` (installs the finder), ``alias.py``.

Without this, ``import ray.data`` under ``miniray run`` fails with a bare "No module named
'ray.data'", which reads as a broken Ray install; the message says instead that miniray covers
Ray Core only and how to run the program on Ray.
"""

from __future__ import annotations

import importlib.machinery
import sys

# The part after ``ray.`` of each library package of Ray 2.60 that miniray does not provide.
LIBRARIES = (
    "autoscaler", "cluster_utils", "data", "job_submission", "rllib", "serve", "train", "tune",
    "util.collective", "workflow",
)

# The libraries Ray's top-level module imports on attribute access (``ray.data`` without
# ``import ray.data``); ``miniray.__getattr__`` does the same, so the access raises the message.
LAZY_ATTRIBUTES = ("autoscaler", "data", "workflow")


def library_of(fullname: str, prefix: str) -> str | None:
    """The library (``"data"``) that module ``fullname`` belongs to, if it is one of
    ``LIBRARIES`` or inside one, under package ``prefix`` (``"miniray"`` or ``"ray"``)."""
    if not fullname.startswith(prefix + "."):
        return None
    rest = fullname[len(prefix) + 1:]
    for library in LIBRARIES:
        if rest == library or rest.startswith(library + "."):
            return library
    return None


# The pip extra that installs each library; the others come with ``ray[default]``.
_EXTRAS = {"data": "data", "rllib": "rllib", "serve": "serve", "train": "train", "tune": "tune"}

# Set by ``alias.install()`` (``speak_of_ray``): ``from ray import data`` reaches the finder as
# ``miniray.data`` (``ray`` is the miniray module), and the message should still say ``ray``.
_alias_installed = False


def speak_of_ray() -> None:
    """The ``ray`` alias is installed: messages name ``ray.<library>`` and ``miniray run``."""
    global _alias_installed
    _alias_installed = True


def message(library: str, under_alias: bool) -> str:
    """The ImportError message for importing Ray's ``library`` (``"data"``): the program is
    run by ``miniray run`` (``under_alias``) or imports miniray itself."""
    extra = _EXTRAS.get(library, "default")
    if under_alias:
        name, how = f"ray.{library}", "run it with python instead of `miniray run`"
    else:
        name, how = f"miniray.{library}", "import ray instead of miniray"
    return (f"{name} is not provided by miniray: miniray covers Ray Core only (tasks, actors, "
            f"objects, placement groups, runtime context). To run this program on Ray, install "
            f"Ray (pip install 'ray[{extra}]') and {how}.")


# The finder and loader follow the import protocol without subclassing ``importlib.abc``:
# importing that costs ~2.5 ms (it loads ``importlib.resources``) on every ``import miniray``.
class RefusingLoader:
    """Raises ImportError(``text``) when the module would be created."""

    def __init__(self, fullname: str, text: str):
        self.fullname = fullname
        self.text = text

    def create_module(self, spec):
        raise ImportError(self.text, name=self.fullname)

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise ImportError(self.text, name=self.fullname)


def refusal_spec(fullname: str, prefix: str):
    """A module spec whose loading raises the out-of-scope ImportError, or None when
    ``fullname`` is not one of Ray's libraries under ``prefix``."""
    library = library_of(fullname, prefix)
    if library is None:
        return None
    text = message(library, prefix == "ray" or _alias_installed)
    return importlib.machinery.ModuleSpec(fullname, RefusingLoader(fullname, text))


class OutOfScopeFinder:
    """Finds ``miniray.<library>`` for each out-of-scope library, as a module that raises."""

    def find_spec(self, fullname, path=None, target=None):
        return refusal_spec(fullname, "miniray")


def install() -> None:
    """Appends the finder (once): it answers only names no real miniray module has."""
    if not any(isinstance(finder, OutOfScopeFinder) for finder in sys.meta_path):
        sys.meta_path.append(OutOfScopeFinder())
