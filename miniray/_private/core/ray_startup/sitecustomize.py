"""Installs the reverse alias (``import miniray`` gives Ray) at interpreter start-up.

Owns: nothing but that step. Python imports ``sitecustomize`` at start-up from the first
``sys.path`` entry that has one; ``miniray run --ray`` puts this folder first on
``PYTHONPATH`` (``alias.on_ray_environ``), so every Python process of the program has the
alias before any code of the program runs, Ray's workers included (they inherit the driver's
environment when ``ray.init()`` starts the local cluster). Called by: Python's ``site``
module only.

Steps, each without importing miniray (that would load the real package, which the alias
must answer for instead):

1. Do nothing unless ``MINIRAY_ON_RAY=1``: the folder may outlive the program on a
   ``PYTHONPATH`` someone copied.
2. Load ``../alias.py`` by path under a private name and call ``become_ray()``.
3. Run the ``sitecustomize`` this one hides (the next one on ``sys.path``), if any, so a
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
    _run_hidden_sitecustomize()
