"""Installs an import alias at interpreter start-up: the reverse one (``import miniray``
gives Ray) under ``miniray run --ray``, the forward one (``import ray`` gives miniray)
under ``miniray run``.

Owns: nothing but that step. Python imports ``sitecustomize`` at start-up from the first
``sys.path`` entry that has one; both commands put this folder first on ``PYTHONPATH``
(``alias.on_ray_environ``, ``alias.forward_environ``), so every Python process of the
program has the alias before any code of the program runs: Ray's workers (they inherit the
driver's environment when ``ray.init()`` starts the local cluster), and the processes a
program starts itself (Ray's documents recommend a ``spawn`` process pool next to Ray; its
children import the program's main module, with its ``import ray``, again). Called by:
Python's ``site`` module only.

Steps:

1. ``MINIRAY_ON_RAY=1``: load ``../alias.py`` by path under a private name and call
   ``become_ray()``, without importing miniray (that would load the real package, which
   the alias must answer for instead).
2. Else ``MINIRAY_RAY_ALIAS=1``: import miniray's alias module and install the forward
   alias; a Python without miniray (another environment's) is left as it is.
3. Neither: nothing (the folder may outlive the program on a ``PYTHONPATH`` someone
   copied).
4. Run the ``sitecustomize`` this one hides (the next one on ``sys.path``), if any, so a
   site's or a virtual environment's own start-up code still runs.
"""

import importlib.util
import os
import sys


def _install_reverse_alias() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "alias.py")
    spec = importlib.util.spec_from_file_location("_miniray_on_ray_alias", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.become_ray()


def _install_forward_alias() -> None:
    try:
        from miniray._private.core import alias  # lazy: only under `miniray run`
    except ImportError:  # a Python of another environment, started by the program
        return
    alias.install()


def _run_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    del sys.modules[__name__]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as error:
        if error.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules[__name__] = ours


# Only as Python's start-up hook: imported under its package name (a test importing every
# module), it does nothing.
if __name__ == "sitecustomize":
    if os.environ.get("MINIRAY_ON_RAY") == "1":
        _install_reverse_alias()
    elif os.environ.get("MINIRAY_RAY_ALIAS") == "1":
        _install_forward_alias()
    _run_hidden_sitecustomize()
