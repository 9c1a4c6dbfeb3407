"""RuntimeEnv and RuntimeEnvConfig: the runtime environment of a job, task or actor.

Mirrors ``ray.runtime_env`` (Ray 2.60): both are dicts, checked when built with Ray's rules
and wording (``miniray/_private/core/runtime_envs.py``); ``RuntimeEnv`` has Ray's accessors,
``serialize``/``deserialize`` and ``to_dict``. What takes effect, per task and actor, merged
over the job's: ``env_vars``, ``working_dir`` and ``py_modules`` (used in place),
``worker_process_setup_hook`` (from ``init()``, as in Ray), ``config`` (checked).
Differs: ``pip``, ``uv``, ``conda``, ``container``, ``image_uri``, ``java_jars``, the
profilers, remote URIs and archives are not set up: the task or actor fails with
``RuntimeEnvSetupError`` at ``get()``, saying what to do instead (see README).

Example:
    >>> from miniray.runtime_env import RuntimeEnv
    >>> RuntimeEnv(env_vars={"OMP_NUM_THREADS": "4"})
    {'env_vars': {'OMP_NUM_THREADS': '4'}}
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

from miniray._private.core import runtime_envs

__all__ = ["RuntimeEnv", "RuntimeEnvConfig"]


class RuntimeEnvConfig(dict):
    """How a runtime environment is set up: ``setup_timeout_seconds`` (an int > 0, or -1 for
    none), ``eager_install`` (a bool) and ``log_files`` (a list of str). Checked as in Ray;
    miniray installs nothing, so they change nothing here.

    Example:
        >>> RuntimeEnvConfig(setup_timeout_seconds=30)
        {'setup_timeout_seconds': 30, 'eager_install': True, 'log_files': []}
    """

    known_fields = frozenset({"setup_timeout_seconds", "eager_install", "log_files"})

    def __init__(self, setup_timeout_seconds: int = runtime_envs.DEFAULT_SETUP_TIMEOUT_SECONDS,
                 eager_install: bool = True, log_files: list | None = None):
        super().__init__(runtime_envs.normalize_config({
            "setup_timeout_seconds": setup_timeout_seconds, "eager_install": eager_install,
            "log_files": log_files}))

    @staticmethod
    def parse_and_validate_runtime_env_config(config) -> RuntimeEnvConfig:
        if isinstance(config, RuntimeEnvConfig):
            return config
        if not isinstance(config, dict):
            raise TypeError(
                "runtime_env['config'] must be of type dict or RuntimeEnvConfig, "
                f"got: {type(config)}"
            )
        return RuntimeEnvConfig(**{k: v for k, v in config.items()
                                   if k in RuntimeEnvConfig.known_fields})

    @classmethod
    def default_config(cls) -> RuntimeEnvConfig:
        return cls()

    def to_dict(self) -> dict:
        return dict(copy.deepcopy(self))


class RuntimeEnv(dict):
    """A runtime environment for ``init()``, ``@remote`` or ``.options()``; a plain dict
    works the same.

    Args:
        py_modules: Directories or ``.py`` files put on ``sys.path`` (at ``init()``), or
            ``local://`` directories (any level).
        working_dir: The workers' current directory, first on ``sys.path``: a directory (at
            ``init()``) or a ``local://`` URI (any level). Used in place, never copied.
        env_vars: Environment variables (str to str), merged over the job's.
        worker_process_setup_hook: A callable or ``"module.function"``, run once in every new
            worker before its first task (set at ``init()``, as in Ray).
        config: A ``RuntimeEnvConfig`` or a dict of its fields.
        pip, uv, conda, container, image_uri, py_executable, nsight, rocprof_sys: Accepted
            and checked; a task or actor that needs them fails with ``RuntimeEnvSetupError``
            (``py_executable``: unless it is this interpreter).
        _validate: False skips the checks (as Ray's deserialization does).
        **kwargs: Other fields, kept as given (Ray passes them to plugins).

    Example:
        >>> RuntimeEnv(working_dir="local:///srv/app", env_vars={"MODE": "test"})
        {'working_dir': 'local:///srv/app', 'env_vars': {'MODE': 'test'}}
    """

    known_fields = runtime_envs.KNOWN_FIELDS

    def __init__(self, *, py_modules: list | None = None, py_executable: str | None = None,
                 working_dir: str | None = None, pip=None, conda=None, container=None,
                 env_vars: dict | None = None,
                 worker_process_setup_hook: Callable | str | None = None, nsight=None,
                 rocprof_sys=None, config: dict | RuntimeEnvConfig | None = None,
                 _validate: bool = True, image_uri: str | None = None, uv=None, **kwargs):
        super().__init__()
        fields = dict(kwargs)
        for name, value in (("py_modules", py_modules), ("py_executable", py_executable),
                            ("working_dir", working_dir), ("pip", pip), ("uv", uv),
                            ("conda", conda), ("_nsight", nsight),
                            ("_rocprof_sys", rocprof_sys), ("container", container),
                            ("env_vars", env_vars), ("config", config),
                            ("worker_process_setup_hook", worker_process_setup_hook),
                            ("image_uri", image_uri)):
            if value is not None:
                fields[name] = value
        if _validate:
            fields = runtime_envs.normalize(fields)
            if "config" in fields:
                fields["config"] = RuntimeEnvConfig(**fields["config"])
            if all(value is None for value in fields.values()):
                fields = {}
        dict.update(self, fields)

    def __setitem__(self, key: str, value: Any) -> None:
        checked = runtime_envs.normalize({key: value}) if key in self.known_fields else {
            key: value}
        if key not in checked:
            return  # Ray drops a value that normalises to nothing (an empty env_vars)
        value = checked[key]
        if key == "config":
            value = RuntimeEnvConfig(**value)
        super().__setitem__(key, value)

    def set(self, name: str, value: Any) -> None:
        self.__setitem__(name, value)

    def get(self, name: str, default: Any = None, data_class: Any = None) -> Any:
        if data_class is not None:
            raise NotImplementedError("RuntimeEnv.get(data_class=...) is not implemented by "
                                      "miniray; read the field as a dict.")
        return super().get(name, default)

    @classmethod
    def deserialize(cls, serialized_runtime_env: str) -> RuntimeEnv:
        return cls(_validate=False, **json.loads(serialized_runtime_env))

    def serialize(self) -> str:
        return json.dumps(type(self)(_validate=True, **self), sort_keys=True)

    def to_dict(self) -> dict:
        out = dict(copy.deepcopy(self))
        if out.get("config"):
            out["config"] = dict(out["config"])
        return out

    # -- accessors, as Ray's ---------------------------------------------------------------
    def has_working_dir(self) -> bool:
        return self.get("working_dir") is not None

    def working_dir_uri(self) -> str | None:
        return self.get("working_dir")

    def working_dir(self) -> str:
        return self.get("working_dir", "")

    def py_modules_uris(self) -> list:
        return list(self.get("py_modules") or [])

    def py_modules(self) -> list:
        return list(self.get("py_modules") or [])

    def py_executable(self) -> str | None:
        return self.get("py_executable")

    def java_jars(self) -> list:
        return list(self.get("java_jars") or [])

    def env_vars(self) -> dict:
        return self.get("env_vars", {})

    def nsight(self):
        return self.get("_nsight")

    def rocprof_sys(self):
        return self.get("_rocprof_sys")

    def has_conda(self) -> bool:
        return bool(self.get("conda"))

    def conda_env_name(self) -> str | None:
        conda = self.get("conda")
        return conda if isinstance(conda, str) else None

    def conda_config(self) -> str | None:
        conda = self.get("conda")
        return json.dumps(conda, sort_keys=True) if isinstance(conda, dict) else None

    def has_pip(self) -> bool:
        return bool(self.get("pip"))

    def has_uv(self) -> bool:
        return bool(self.get("uv"))

    def virtualenv_name(self) -> str | None:
        pip = self.get("pip")
        return pip if isinstance(pip, str) else None

    def pip_config(self) -> dict:
        pip = self.get("pip")
        return pip if isinstance(pip, dict) else {}

    def uv_config(self) -> dict:
        uv = self.get("uv")
        return uv if isinstance(uv, dict) else {}

    def has_py_container(self) -> bool:
        return bool(self.get("container"))

    def py_container_image(self) -> str | None:
        return self["container"].get("image", "") if self.has_py_container() else None

    def py_container_worker_path(self) -> str | None:
        return self["container"].get("worker_path", "") if self.has_py_container() else None

    def py_container_run_options(self) -> list | None:
        return self["container"].get("run_options", []) if self.has_py_container() else None

    def image_uri(self) -> str | None:
        return self.get("image_uri")

    def plugin_uris(self) -> list:
        return []

    def plugins(self) -> list:
        return [(key, value) for key, value in self.items() if key not in self.known_fields]

    def get_extension(self, key: str) -> str | None:
        extensions = {"_ray_release", "_ray_commit", "_inject_current_ray"}
        if key not in extensions:
            raise ValueError(f"Extension key must be one of {extensions}, got: {key}")
        return self.get(key)
