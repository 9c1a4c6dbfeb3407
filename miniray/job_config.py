"""JobConfig: accepted by ``init(job_config=...)``.

Mirrors ``ray.job_config.JobConfig`` (Ray 2.60) as a holder of its arguments. Of them, only
``runtime_env`` takes effect: ``init(job_config=...)`` uses it when ``init()`` is given no
``runtime_env`` of its own, as Ray does.
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

    def set_runtime_env(self, runtime_env, validate: bool = False) -> None:
        self.runtime_env = runtime_env or {}

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace
