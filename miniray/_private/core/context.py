"""The one "current runtime" slot of this process.

Owns: which runtime this process talks to (the driver's ``Runtime``, a worker's
``WorkerRuntime``, or None) and the hook that starts one on first use. The same object tracks
the refs of the session, so ``ObjectRef`` reports to it too. Does not own: what a runtime is
(``runtime.py``, ``worker/worker_api.py``) or when it starts (``runtime.init``).
Called by: ``ObjectRef``, the public API, ``runtime.init``/``shutdown`` and a worker's startup.

One slot instead of two (the runtime and the ref tracker were always set together), in the
lowest layer, so that every layer can read it without importing the one that fills it.
Reading needs no lock: ``init``/``shutdown`` (under ``runtime``'s init lock) and a worker's
startup are the only writers, and a module attribute is swapped atomically.
"""

from __future__ import annotations

from typing import Any, Callable

from miniray.exceptions import RaySystemError

_current: Any = None
_auto_init: Callable[[], Any] | None = None


def current() -> Any:
    """The runtime of this process, or None."""
    return _current


def set_current(runtime: Any) -> None:
    global _current
    _current = runtime


def set_auto_init(hook: Callable[[], Any]) -> None:
    """Installed by ``runtime.py`` when it is imported: how a first use starts a runtime."""
    global _auto_init
    _auto_init = hook


def auto_init() -> Any:
    """The runtime, starting one through the installed hook if there is none yet."""
    runtime = _current
    if runtime is not None:
        return runtime
    if _auto_init is None:  # only a process that never imported miniray itself gets here
        raise RaySystemError("miniray has not been started yet; call miniray.init() first.")
    return _auto_init()
