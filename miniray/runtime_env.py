"""RuntimeEnv: a runtime environment description (``env_vars`` is applied).

Mirrors ``ray.runtime_env.RuntimeEnv`` (Ray 2.60) as a dict. Differs: only ``env_vars`` takes
effect (set in every worker of the session); other fields are kept and ignored.
"""

from __future__ import annotations

__all__ = ["RuntimeEnv"]


class RuntimeEnv(dict):
    def __init__(self, *, py_modules=None, working_dir=None, pip=None, conda=None,
                 container=None, env_vars=None, worker_process_setup_hook=None, config=None,
                 **kwargs):
        super().__init__()
        fields = dict(py_modules=py_modules, working_dir=working_dir, pip=pip, conda=conda,
                      container=container, env_vars=env_vars,
                      worker_process_setup_hook=worker_process_setup_hook, config=config,
                      **kwargs)
        self.update({key: value for key, value in fields.items() if value is not None})
