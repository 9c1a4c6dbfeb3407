"""A worker's runtime environment, applied once when the process starts.

Owns: putting a runtime environment into effect in a new worker (``env_vars`` in
``os.environ``; ``py_modules`` and ``working_dir`` on ``sys.path`` and ``PYTHONPATH``;
``working_dir`` as the current directory), and running the job's
``worker_process_setup_hook`` before the worker's first task, with Ray's error text when it
fails. Does not own: which environment a worker gets (the owner starts one per
``runtime_envs.env_key`` and says which in HELLO), or the checks (``core/runtime_envs.py``).
Called by: ``worker_main.run_forked``, before the worker reads its first task.

A worker never changes environment: tasks of another environment go to other workers (as
Ray starts a worker per runtime environment), so nothing is restored after a task.

Directories are used in place, never copied: ``working_dir`` is the directory itself, and a
``local://`` entry of ``py_modules`` is put on ``sys.path`` as it is (its contents import), as
in Ray. A plain path given to ``init(py_modules=...)`` imports by its own name (Ray uploads
it with its parent folder): a link to it, in ``<session>/runtime_resources/py_modules/``, is
what goes on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import sys
import traceback

from miniray._private.core import runtime_envs
from miniray._private.host import same_uid


def apply(env: dict, session_dir: str) -> None:
    """Put ``env`` (a normalised runtime environment) into effect in this process."""
    env_vars = env.get("env_vars")
    if env_vars:  # ``${NAME}``: the variable's value here, as in Ray
        os.environ.update(runtime_envs.worker_env_vars(env_vars, dict(os.environ)))
    paths = [_module_root(entry, session_dir) for entry in env.get("py_modules") or ()]
    working_dir = env.get("working_dir")
    if working_dir:
        working_dir = _local(working_dir)
        os.chdir(working_dir)
        paths.insert(0, working_dir)
    for path in reversed(paths):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    if paths:  # child processes of a task import from there too, as under Ray
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))


def _local(value: str) -> str:
    return runtime_envs.local_uri_path(value) if runtime_envs.is_local_uri(value) else value


def _module_root(entry: str, session_dir: str) -> str:
    """The ``sys.path`` entry that makes a ``py_modules`` entry importable."""
    if runtime_envs.is_local_uri(entry):
        return runtime_envs.local_uri_path(entry)
    # A directory or .py file given to init(): importable by its own name, with nothing
    # else of its parent folder. Each path gets its own folder holding one link to it
    # (named from a hash of the path, so every worker finds the same and none races).
    entry = entry.rstrip(os.sep)
    top = os.path.join(session_dir, "runtime_resources")
    root = os.path.join(top, "py_modules", hashlib.sha1(entry.encode()).hexdigest()[:16])
    same_uid.ensure_private_dir(root, top=top)
    link = os.path.join(root, os.path.basename(entry))
    try:
        os.symlink(entry, link)
    except FileExistsError:
        pass
    return root


def run_setup_hook(hook) -> str | None:
    """Run the job's ``worker_process_setup_hook`` (a ``"module.function"`` string or a
    function's pickle); the error text Ray reports when it fails, or None."""
    if isinstance(hook, str):
        try:
            module_name, _, function_name = hook.rpartition(".")
            function = getattr(importlib.import_module(module_name), function_name)
            function()
        except Exception:
            return (
                f"Failed to execute the setup hook method, {hook} from "
                f"``ray.init(runtime_env={{'worker_process_setup_hook': {hook}}})``. Please "
                "make sure the given module exists and is available from ray workers. For "
                f"more details, see the error trace below.\n{traceback.format_exc()}"
            )
        return None
    try:
        function = pickle.loads(hook)
    except Exception:
        return f"Failed to deserialize the setup hook method.\n{traceback.format_exc()}"
    try:
        function()
    except Exception:
        return (
            "Failed to execute the setup hook method. Function name:"
            f"{getattr(function, '__name__', function)}\n{traceback.format_exc()}"
        )
    return None
