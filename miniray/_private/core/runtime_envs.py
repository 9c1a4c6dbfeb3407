"""Runtime environments as rules: validation, merging, the worker key, what cannot be set up.

Owns: Ray 2.60's checks of a ``runtime_env`` (at ``@remote``/``.options()`` for tasks and
actors, at ``init()`` for the job), its normalised form (a plain dict: ``env_vars`` of
strings, ``config`` with its defaults, an empty ``pip`` dropped, ...), the merge of a
task's or actor's environment over its parent's, the canonical text that keys the workers
of one environment, and the ``RuntimeEnvSetupError`` text for the fields miniray does not set
up (``pip``, ``uv``, ``conda``, ``container``, ``image_uri``, ...). Does not own: applying an
environment in a worker (``worker/runtime_env_setup.py``), the public ``RuntimeEnv`` and
``RuntimeEnvConfig`` classes (``miniray/runtime_env.py``), or which worker runs what (the
owner keys its leases and idle workers by ``env_key``).
Called by: ``options.py`` (option checks), ``remote_function.py`` and ``actor.py`` (the
environment of a submission), ``runtime.py`` (``init``), the owner and the worker.

Mirrors ``ray.runtime_env.RuntimeEnv`` validation, ``_merge_runtime_env`` and
``ray._private.utils.parse_runtime_env_for_task_or_actor`` (Ray 2.60)::

    @remote / .options(runtime_env=E)  --parse_for_task(E)-->  normalised E (or Ray's error)
    init(runtime_env=J)                --parse_for_job(J)--->  normalised J (paths absolute)
    .remote()                          --effective(parent, E)-->  merge(parent, E), env_key
    owner                              --setup_error(env)---->  RuntimeEnvSetupError text

Differs: ``working_dir`` and ``py_modules`` are used in place, never packed or uploaded (a
job's local path stays a local path; Ray reports a ``gcs://`` URI); remote URIs, archives
and wheels cannot be set up here. Unknown fields are accepted and ignored as in Ray (Ray
looks for a plugin of that name); ``unknown_fields`` names them so the caller can warn.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import types
import urllib.parse
from typing import Any

__all__ = [
    "KNOWN_FIELDS",
    "UNSUPPORTED_FIELDS",
    "env_key",
    "from_key",
    "is_local_uri",
    "local_uri_path",
    "merge",
    "normalize",
    "normalize_config",
    "parse_for_job",
    "parse_for_task",
    "setup_error",
    "string_of",
    "submission_key",
    "note_ignored",
    "unknown_fields",
]

logger = logging.getLogger(__name__)
_noted: set = set()  # (level, field) already named in a warning by this process

# Ray 2.60's RuntimeEnv.known_fields.
KNOWN_FIELDS = frozenset({
    "py_modules", "py_executable", "java_jars", "working_dir", "conda", "pip", "uv",
    "container", "excludes", "env_vars", "_ray_release", "_ray_commit", "_inject_current_ray",
    "config", "worker_process_setup_hook", "_nsight", "_rocprof_sys", "image_uri",
})
# Fields Ray sets up by installing or starting something; miniray runs every worker in this
# interpreter and this environment, so a task or actor that needs one fails as in Ray when
# the setup fails: RuntimeEnvSetupError at get().
UNSUPPORTED_FIELDS = ("pip", "uv", "conda", "container", "image_uri", "java_jars", "nsight",
                      "_nsight", "rocprof_sys", "_rocprof_sys")

_CONFIG_FIELDS = ("setup_timeout_seconds", "eager_install", "log_files")
DEFAULT_SETUP_TIMEOUT_SECONDS = 600
_URI_PROTOCOLS = ("gcs", "conda", "pip", "uv", "http", "https", "s3", "gs", "azure", "abfss",
                  "file", "local")
_ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar.xz")


# --- Field checks (Ray's wording) --------------------------------------------------------------


def normalize_config(config: Any) -> dict:
    """``config`` as Ray's ``RuntimeEnvConfig`` holds it: every field, defaults filled in.

    Raises:
        TypeError / ValueError: as Ray's ``RuntimeEnvConfig`` (a non-int timeout, one <= 0
            other than -1, a non-bool ``eager_install``, a non-list ``log_files``).

    Example:
        >>> normalize_config({"eager_install": False})
        {'setup_timeout_seconds': 600, 'eager_install': False, 'log_files': []}
    """
    if not isinstance(config, dict):
        raise TypeError(
            "runtime_env['config'] must be of type dict or RuntimeEnvConfig, "
            f"got: {type(config)}"
        )
    unknown = set(config) - set(_CONFIG_FIELDS)
    if unknown:
        logger.warning("The following unknown entries in the runtime_env_config dictionary "
                       "will be ignored: %s.", unknown)
    timeout = config.get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise TypeError(f"setup_timeout_seconds must be of type int, got: {type(timeout)}")
    if timeout <= 0 and timeout != -1:
        raise ValueError(
            f"setup_timeout_seconds must be greater than zero or equals to -1, got: {timeout}"
        )
    eager = config.get("eager_install", True)
    if not isinstance(eager, bool):
        raise TypeError(f"eager_install must be a boolean. got {type(eager)}")
    log_files = config.get("log_files")
    if log_files is None:
        log_files = []
    elif not isinstance(log_files, list):
        raise TypeError(
            f"log_files must be a list of strings or None, got {log_files} with type "
            f"{type(log_files)}."
        )
    elif not all(isinstance(name, str) for name in log_files):
        raise TypeError("Each item in log_files must be a string.")
    return {"setup_timeout_seconds": timeout, "eager_install": eager,
            "log_files": list(log_files)}


def _env_vars(value: Any) -> dict | None:
    if not isinstance(value, dict):
        raise TypeError(
            f"runtime_env['env_vars'] must be of type Dict[str, str], got {type(value)}"
        )
    if not value:
        return None
    for key, val in value.items():
        if not isinstance(key, str):
            raise TypeError(
                "runtime_env['env_vars'] must be of type Dict[str, str], but the key "
                f"{key} is of type {type(key)}"
            )
        if not isinstance(val, str):
            raise TypeError(
                "runtime_env['env_vars'] must be of type Dict[str, str], but the value "
                f"{val} is of type {type(val)}"
            )
    return dict(value)


def _is_path(text: str) -> bool:
    """A path, not a URI (Ray's ``is_path`` on POSIX: no scheme)."""
    return not urllib.parse.urlparse(text).scheme


def is_local_uri(text: str) -> bool:
    return isinstance(text, str) and text[:8].lower() == "local://"


def local_uri_path(uri: str) -> str:
    """The absolute path a ``local://`` URI names.

    Raises:
        ValueError: a relative path (Ray's wording).

    Example:
        >>> local_uri_path("local:///opt/app")
        '/opt/app'
    """
    path = uri[len("local://"):]
    if not path.startswith("/"):
        raise ValueError(
            f'Invalid "local://" runtime_env URI "{uri}": the path must be absolute. Write '
            "local:///path/in/image, or local://C:/path/in/image on Windows."
        )
    return path


def _check_uri(uri: str) -> None:
    """A URI a task or actor may name (Ray's ``validate_uri``): ``local://`` with an absolute
    path, or a known protocol."""
    if is_local_uri(uri):
        local_uri_path(uri)
        return
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if _is_path(uri) or scheme not in _URI_PROTOCOLS:
        raise ValueError(
            f"{uri} is not a valid URI. Passing directories or modules to be dynamically "
            "uploaded is only supported at the job level (i.e., passed to `ray.init`). "
            "To use a directory of this host in place, name it as local:///absolute/path."
        )


def _path_exists(path: str) -> None:
    if not os.path.exists(path):
        raise ValueError(f"{path} is not a valid path.")


def _working_dir(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"`working_dir` must be a string, got {type(value)}.")
    if _is_path(value):
        _path_exists(value)
    else:
        _check_uri(value)
    return value


def _py_modules(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"`py_modules` must be a list of strings, got {type(value)}.")
    for module in value:
        if not isinstance(module, str):
            raise TypeError(f"`py_module` must be a string, got {type(module)}.")
        if _is_path(module):
            _path_exists(module)
        else:
            _check_uri(module)
    return value


def _requirements(path: str) -> list:
    """The lines of a requirements file (Ray reads it when the runtime_env is built)."""
    try:
        with open(path, encoding="utf-8") as requirements:
            return requirements.read().strip().split("\n")
    except OSError:
        raise ValueError(f"{path} is not a valid file") from None


def _packages(value: Any, field: str, extra: tuple) -> dict | None:
    """``pip`` / ``uv``: Ray's accepted shapes, normalised to a dict (None if empty)."""
    if isinstance(value, str):
        result: dict = {"packages": _requirements(value), f"{field}_check": False}
    elif isinstance(value, list) and all(isinstance(dep, str) for dep in value):
        result = {"packages": list(value), f"{field}_check": False}
    elif isinstance(value, dict):
        allowed = ("packages", f"{field}_check", *extra)
        if set(value) - set(allowed):
            raise ValueError(
                f"runtime_env['{field}'] can only have these fields: "
                f"{', '.join(allowed[:-1])} and {allowed[-1]}, but got: {list(value)}"
            )
        if "packages" not in value:
            raise ValueError(
                f"runtime_env['{field}'] must include field 'packages', but got {value}"
            )
        if field == "pip" and isinstance(value["packages"], str):
            value = {**value, "packages": _requirements(value["packages"])}
        if not isinstance(value["packages"], list):
            raise ValueError(
                f"runtime_env['{field}']['packages'] must be of type list, "
                f"got: {type(value['packages'])}"
            )
        result = dict(value)
        result[f"{field}_check"] = value.get(f"{field}_check", False)
    else:
        raise TypeError(
            f"runtime_env['{field}'] must be of type str or List[str], got {type(value)}"
        )
    result["packages"] = list(dict.fromkeys(result["packages"]))
    return result if result["packages"] else None


def _conda(value: Any):
    if not isinstance(value, (str, dict)):
        raise TypeError(f"runtime_env['conda'] must be of type str or dict, got {type(value)}.")
    return value


def _excludes(value: Any) -> list | None:
    if isinstance(value, list) and all(isinstance(path, str) for path in value):
        return value or None
    raise TypeError(f"runtime_env['excludes'] must be of type List[str], got {type(value)}")


_FIELD_CHECKS = {
    "py_modules": _py_modules,
    "working_dir": _working_dir,
    "excludes": _excludes,
    "conda": _conda,
    "pip": lambda v: _packages(v, "pip", ("pip_install_options", "pip_version")),
    "uv": lambda v: _packages(v, "uv", ("uv_version", "uv_pip_install_options")),
    "env_vars": _env_vars,
    "container": lambda v: v,
    "config": normalize_config,
}


# --- Whole environments ------------------------------------------------------------------------


def normalize(runtime_env: dict, *, job: bool = False) -> dict:
    """A ``runtime_env`` checked and normalised as Ray's ``RuntimeEnv(**runtime_env)`` does.

    Fields whose value is None are dropped, ``env_vars`` must map str to str (an empty one
    is dropped), ``pip``/``uv`` become ``{"packages": [...], ...}``, ``config`` gets its
    defaults. ``job``: the paths of ``working_dir`` and ``py_modules`` may be ``Path``
    objects or (``py_modules``) imported modules, as ``init()`` accepts them.

    Raises:
        TypeError / ValueError: Ray's, for the same input.

    Example:
        >>> normalize({"env_vars": {"A": "1"}, "pip": []})
        {'env_vars': {'A': '1'}}
    """
    env = {key: value for key, value in runtime_env.items() if value is not None}
    if job:
        env = _job_paths(env)
    if sum(env.get(field) is not None for field in ("conda", "pip", "uv")) > 1:
        raise ValueError(
            "The 'pip' field, 'uv' field, and 'conda' field of runtime_env cannot be "
            "specified at the same time.\n"
            f"specified pip field: {env.get('pip')}\n"
            f"specified conda field: {env.get('conda')}\n"
            f"specified uv field: {env.get('uv')}\n"
            "To use pip with conda, please only set the 'conda' field, and specify your pip "
            "dependencies within the conda YAML config dict."
        )
    for field, allowed in (("container", {"container", "config", "env_vars"}),
                           ("image_uri", {"image_uri", "config", "env_vars"})):
        if env.get(field) and set(env) - allowed:
            raise ValueError(
                f"The '{field}' field currently cannot be used together with other fields "
                f"of runtime_env. Specified fields: {set(env) - allowed}"
            )
    # Ray's order: the fields it does not check as given, then the checked ones in its order.
    out = {key: value for key, value in env.items() if key not in _FIELD_CHECKS}
    for key, check in _FIELD_CHECKS.items():
        if key in env:
            value = check(env[key])
            if value is not None:
                out[key] = value
    return out


def _job_paths(env: dict) -> dict:
    """``init()``'s ``working_dir`` and ``py_modules``: Paths and modules become absolute
    path strings; a missing directory is refused as Ray refuses it."""
    env = dict(env)
    working_dir = env.get("working_dir")
    if isinstance(working_dir, os.PathLike):
        working_dir = os.fspath(working_dir)
    if isinstance(working_dir, str) and _is_path(working_dir):
        if not (os.path.isdir(working_dir)
                or (os.path.isfile(working_dir) and working_dir.endswith(_ARCHIVES))):
            raise ValueError(
                f"directory {working_dir} must be an existing directory or a supported "
                "archive (.zip, .tar.gz, .tgz, .tar.xz)"
            )
        working_dir = os.path.abspath(working_dir)
    if working_dir is not None:
        env["working_dir"] = working_dir
    modules = env.get("py_modules")
    if modules is not None:
        if not isinstance(modules, list):
            raise TypeError(
                "py_modules must be a List of local paths, imported modules, or URIs, "
                f"got {type(modules)}."
            )
        paths = []
        for module in modules:
            if isinstance(module, types.ModuleType):
                module = _module_path(module)
            elif isinstance(module, os.PathLike):
                module = os.fspath(module)
            elif not isinstance(module, str):
                raise TypeError(
                    "py_modules must be a list of file paths, URIs, or imported modules, "
                    f"got {type(module)}."
                )
            if _is_path(module):
                if not (os.path.isdir(module) or module.endswith((".py", ".whl"))):
                    raise ValueError(
                        "py_modules entry must be a .py file, a directory, or a .whl file; "
                        f"got {module}"
                    )
                module = os.path.abspath(module)
            paths.append(module)
        env["py_modules"] = paths
    hook = env.get("worker_process_setup_hook")
    if hook is not None and not (callable(hook) or isinstance(hook, str)):
        raise TypeError(f"worker_process_setup_hook must be a function, got {type(hook)}.")
    return env


def _module_path(module: types.ModuleType) -> str:
    paths = getattr(module, "__path__", None)
    if paths is None:
        return module.__file__
    paths = list(paths)
    if len(paths) > 1:
        raise ValueError(
            "py_modules only supports modules whose __path__ has length 1 or those who are "
            "single-file."
        )
    return paths[0]


def parse_for_task(runtime_env: Any) -> dict | None:
    """A task's or actor's ``runtime_env`` option, checked as Ray checks it at ``@remote`` and
    ``.options()``: None when empty (the parent's environment applies unchanged).

    Raises:
        TypeError / ValueError: Ray's. A local path in ``working_dir`` or ``py_modules`` is
            refused as in Ray (only ``init()`` takes paths; ``local:///abs/path`` names a
            directory of this host); a value that JSON cannot hold (a function as
            ``worker_process_setup_hook``) raises TypeError, as Ray's serialization does.

    Example:
        >>> parse_for_task({"env_vars": {"A": "1"}})
        {'env_vars': {'A': '1'}}
    """
    if not runtime_env:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be dict or RuntimeEnv, but got: {type(runtime_env)}")
    env = normalize(runtime_env)
    for field in ("working_dir", "py_modules"):
        value = env.get(field)
        for uri in ([value] if isinstance(value, str) else value or ()):
            if _is_path(uri):
                _check_uri(uri)
    json.dumps(env, sort_keys=True)  # TypeError for what cannot travel, as Ray's serialize
    return env


def parse_for_job(runtime_env: Any) -> tuple[dict, Any]:
    """``init(runtime_env=...)``: ``(env, setup_hook)``. ``env`` is normalised with absolute
    paths; a callable ``worker_process_setup_hook`` is taken out (returned as
    ``setup_hook``) and ``env`` names it by its ``__name__``, as Ray reports it.

    Raises:
        TypeError / ValueError: Ray's (a missing ``working_dir`` directory, a bad field).

    Example:
        >>> parse_for_job({"env_vars": {"A": "1"}})
        ({'env_vars': {'A': '1'}}, None)
    """
    if not runtime_env:
        return {}, None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be dict or RuntimeEnv, but got: {type(runtime_env)}")
    env = normalize(runtime_env, job=True)
    env.pop("excludes", None)  # it only tells Ray what not to upload (Ray drops it too)
    hook = env.get("worker_process_setup_hook")
    if callable(hook):
        env["worker_process_setup_hook"] = getattr(hook, "__name__", repr(hook))
    json.dumps(env, sort_keys=True)
    return env, hook


def merge(parent: dict | None, child: dict | None) -> dict:
    """``child`` over ``parent`` as Ray merges a task's environment over its parent's: field
    by field (a child's ``working_dir`` replaces the parent's), except ``env_vars``, merged
    variable by variable.

    Example:
        >>> merge({"env_vars": {"A": "1", "B": "1"}, "working_dir": "/a"},
        ...       {"env_vars": {"B": "2"}, "working_dir": "local:///b"})
        {'working_dir': 'local:///b', 'env_vars': {'A': '1', 'B': '2'}}
    """
    parent = dict(parent or {})
    child = dict(child or {})
    env_vars = dict(parent.pop("env_vars", None) or {})
    env_vars.update(child.pop("env_vars", None) or {})
    parent.update(child)
    if env_vars:
        parent["env_vars"] = env_vars
    return parent


def submission_key(rt, task_env: dict | None) -> str:
    """The ``env_key`` a task or actor submitted now runs in: its parent's environment (the
    driver's is the job's; a worker's is its own), with ``task_env`` (its option, from
    ``parse_for_task``) merged over it. "" is the job's environment.

    ``rt`` is the current runtime: its ``job_runtime_env``, ``runtime_env`` and
    ``runtime_env_key``.
    """
    if not task_env:
        return rt.runtime_env_key
    merged = merge(rt.runtime_env, task_env)
    return "" if merged == rt.job_runtime_env else env_key(merged)


def env_key(env: dict) -> str:
    """The canonical text of an environment: equal environments, equal keys. Workers are
    kept per key, as Ray keeps a worker per runtime environment.

    Example:
        >>> env_key({"env_vars": {"B": "2", "A": "1"}})
        '{"env_vars":{"A":"1","B":"2"}}'
    """
    return json.dumps(env, sort_keys=True, separators=(",", ":")) if env else ""


def from_key(key: str) -> dict:
    return json.loads(key) if key else {}


def string_of(env: dict, *, job: bool) -> str:
    """What ``get_runtime_env_string()`` returns: Ray prints the job's environment with
    spaces after separators and a task's own (merged by its core worker) without."""
    if not env:
        return "{}"
    if job:
        return json.dumps(env, sort_keys=True)
    return env_key(env)


def unknown_fields(env: dict) -> list:
    """Fields no runtime-env part of Ray knows (Ray would look for a plugin of that name)."""
    return sorted(key for key in env if key not in KNOWN_FIELDS and key not in
                  UNSUPPORTED_FIELDS)


def note_ignored(env: dict, *, level: str) -> None:
    """Name, once per process and field, what ``env`` holds that takes no effect, as Ray
    accepts it: unknown fields (Ray would look for a plugin of that name) and, on a task or
    actor (``level="task"``), ``worker_process_setup_hook`` (Ray runs only the job's)."""
    notes = [(field, f"runtime_env field {field!r} is not one miniray (or Ray without a "
                     "plugin of that name) knows; it is ignored.")
             for field in unknown_fields(env)]
    if level == "task" and "worker_process_setup_hook" in env:
        notes.append(("worker_process_setup_hook",
                      "runtime_env['worker_process_setup_hook'] of a task or actor is ignored, "
                      "as in Ray: only init(runtime_env=...)'s hook runs in each new worker."))
    for field, text in notes:
        if (level, field) not in _noted:
            _noted.add((level, field))
            logger.warning(text)


# --- What miniray cannot set up ----------------------------------------------------------------

_HINTS = {
    "pip": "install the packages into this environment ({prefix}) with pip, then drop 'pip'",
    "uv": "install the packages into this environment ({prefix}) with uv pip, then drop 'uv'",
    "conda": "start the program from the conda environment it needs, then drop 'conda'",
    "container": "start the program inside that container, then drop 'container'",
    "image_uri": "start the program inside that image, then drop 'image_uri'",
    "java_jars": "miniray runs Python only; drop 'java_jars'",
    "nsight": "run the whole program under the profiler instead",
    "rocprof_sys": "run the whole program under the profiler instead",
}


def setup_error(env: dict, executable: str | None = None) -> str | None:
    """Why ``env`` cannot be set up here, as the text of a ``RuntimeEnvSetupError``, or None.

    miniray starts every worker from this interpreter in this environment and uses
    directories in place: packages to install (``pip``, ``uv``, ``conda``), an image to run
    (``container``, ``image_uri``), another interpreter (``py_executable``), Java jars,
    profilers, and ``working_dir``/``py_modules`` that are remote URIs, archives or wheels
    cannot be set up.

    Example:
        >>> setup_error({"env_vars": {"A": "1"}}) is None
        True
    """
    executable = executable or sys.executable
    problems = []
    for field in UNSUPPORTED_FIELDS:
        if field in env:
            hint = _HINTS[field.lstrip("_")].format(prefix=sys.prefix)
            problems.append(f"'{field}' ({env[field]!r}): {hint}")
    py_executable = env.get("py_executable")
    if py_executable is not None and not _same_file(py_executable, executable):
        problems.append(
            f"'py_executable' ({py_executable!r}): workers run {executable}; start the "
            "program with that interpreter instead"
        )
    working_dir = env.get("working_dir")
    if isinstance(working_dir, str) and not _usable_in_place(working_dir, directory=True):
        problems.append(
            f"'working_dir' ({working_dir!r}): miniray uses a directory of this host in "
            "place and downloads or unpacks nothing; unpack it and pass the directory"
        )
    for module in env.get("py_modules") or ():
        if isinstance(module, str) and not _usable_in_place(module, directory=False):
            problems.append(
                f"'py_modules' entry {module!r}: miniray uses directories and .py files of "
                "this host in place and downloads, unpacks or installs nothing; install it "
                "into this environment, or pass a directory"
            )
    if not problems:
        return None
    return (
        "miniray runs every task and actor in the current Python environment and cannot set "
        "up this runtime_env:\n  " + "\n  ".join(problems) +
        "\nOr run the program on Ray, which sets these up."
    )


def _usable_in_place(value: str, *, directory: bool) -> bool:
    if is_local_uri(value):
        return os.path.isdir(local_uri_path(value))
    if not _is_path(value):
        return False  # gcs://, s3://, https://, ...: nothing is downloaded here
    if directory:
        return os.path.isdir(value)
    return os.path.isdir(value) or value.endswith(".py")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# --------------------------------------------------------------------- env_vars' ${NAME}
# The job's env_vars as given (JSON), set by the driver in its fork server's environment, where
# they are already in effect, expanded: a worker does not expand them again when they come
# back merged into a task's or actor's env_vars.
JOB_ENV_VARS = "MINIRAY_JOB_ENV_VARS"
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env_vars(env_vars: dict, environ: dict) -> dict:
    """Ray's ``env_vars`` values with each ``${NAME}`` replaced by NAME's value in
    ``environ``, or by nothing when it is unset.

    Example:
        >>> expand_env_vars({"P": "${P}:/extra", "Q": "${NONE}:/x", "R": "$P"}, {"P": "/b"})
        {'P': '/b:/extra', 'Q': ':/x', 'R': '$P'}
    """
    return {name: _REFERENCE.sub(lambda m: environ.get(m.group(1), ""), value)
            for name, value in env_vars.items()}


def worker_env_vars(env_vars: dict, environ: dict) -> dict:
    """What a worker sets for ``env_vars`` (a task's or actor's, the job's merged in), as Ray
    2.60 does: each ``${NAME}`` read in the worker's environment, the job's variables
    included (already expanded there: ``JOB_ENV_VARS``, left as they are).

    Example:
        >>> environ = {"P": "/b:/x", JOB_ENV_VARS: '{"P": "${P}:/x"}'}
        >>> worker_env_vars({"P": "${P}:/x", "T": "${P}-t"}, environ)
        {'T': '/b:/x-t'}
    """
    try:
        job = json.loads(environ.get(JOB_ENV_VARS) or "{}")
    except ValueError:
        job = {}
    mine = {name: value for name, value in env_vars.items()
            if not (isinstance(job, dict) and job.get(name) == value and name in environ)}
    return expand_env_vars(mine, environ)
