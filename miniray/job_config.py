"""JobConfig: accepted by ``init(job_config=...)``.

Mirrors ``ray.job_config.JobConfig`` (Ray 2.60) as a holder of its arguments. Of them,
``runtime_env``, ``ray_namespace`` and ``py_logging_config`` take effect: ``init(job_config=
...)`` uses the first two when ``init()`` is given no ``runtime_env`` or ``namespace`` of its
own, and the third for the workers (not the driver) when it is given no
``logging_config``, as Ray does.
"""

from __future__ import annotations

__all__ = ["JobConfig"]


class JobConfig:
    def __init__(self, jvm_options=None, code_search_path=None, runtime_env=None,
                 _client_job=False, metadata=None, ray_namespace=None,
                 default_actor_lifetime="non_detached", _py_driver_sys_path=None):
        self.jvm_options = jvm_options or []
        self.code_search_path = code_search_path or []
        self.runtime_env = runtime_env or {}
        self.metadata = metadata or {}
        self.ray_namespace = ray_namespace
        self.default_actor_lifetime = default_actor_lifetime
        self.py_logging_config = None

    def set_runtime_env(self, runtime_env, validate: bool = False) -> None:
        self.runtime_env = runtime_env or {}

    def set_py_logging_config(self, logging_config=None) -> None:
        """The ``LoggingConfig`` of the job's task and actor processes."""
        self.py_logging_config = logging_config

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace
