"""``init()``'s argument checks: what Ray 2.60 refuses before anything starts.

Owns: the hidden keywords ``init()`` accepts (``HIDDEN_INIT_KWARGS``), the type and value
checks of its ``address``, ``namespace`` and ``runtime_env`` (``check_init_arguments``), of
its ``logging_config`` (``job_logging_config``) and of its resource amounts
(``_check_whole``). Pure: nothing is started, read or written here but the environment
variable of the logging encoding (``core/config.py``).
Does not own: ``init()`` itself, joining or starting a node, or the order of the checks
(``runtime.py``, which calls these and re-exports them under its own name).
Called by: ``runtime.init`` (and tests, as ``runtime.job_logging_config``).
"""

from __future__ import annotations

from typing import Any

from miniray._private.core import config
from miniray._private.core import logging_config as logging_configs  # init() has that argument

__all__ = ["HIDDEN_INIT_KWARGS", "check_init_arguments", "job_logging_config"]

# Ray's hidden init() options, which it takes through ``**kwargs``: ``_temp_dir`` is applied;
# the others configure parts of Ray that miniray does not have (documented in README) and are
# accepted. Any other keyword is refused, as Ray refuses it.
HIDDEN_INIT_KWARGS = frozenset({
    "_temp_dir", "_node_ip_address", "_system_config", "_memory", "_plasma_directory",
    "object_spilling_directory", "_enable_object_reconstruction", "_redis_username",
    "_redis_password", "_metrics_export_port", "_tracing_startup_hook", "_node_name",
    "_driver_object_store_memory", "_skip_env_hook",
})


def check_init_arguments(address, namespace=None, runtime_env=None) -> None:
    """The type and value checks of ``init()``'s ``address``, ``namespace`` and
    ``runtime_env`` (Ray 2.60 refuses the same values; its errors for a bad address or
    runtime_env come from deep inside and say little, these name the argument).

    Example:
        >>> check_init_arguments("auto", namespace="jobs")
    """
    if address is not None and not isinstance(address, str):
        raise TypeError(
            "The address passed to init() must be a string such as 'auto', 'local' or "
            f"'127.0.0.1:6379' (or None), got {type(address).__name__} {address!r}. Pass "
            "other settings by keyword, e.g. init(num_cpus=4)."
        )
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError(
            f"namespace must be None or a string, got {type(namespace).__name__} {namespace!r}."
        )
    if namespace == "":
        raise ValueError('"" is not a valid namespace. Pass None to not specify a namespace.')
    if runtime_env and not isinstance(runtime_env, dict):  # Ray ignores falsy values
        raise TypeError(
            "runtime_env must be a dict or a miniray.runtime_env.RuntimeEnv (e.g. "
            f"{{'env_vars': {{'KEY': 'value'}}}}), got {type(runtime_env).__name__} "
            f"{runtime_env!r}."
        )


def job_logging_config(logging_config: Any) -> logging_configs.LoggingConfig | None:
    """The LoggingConfig ``init()`` applies: the one given, else one of the encoding
    ``RAY_LOGGING_CONFIG_ENCODING`` names (as Ray), else None (logging is left alone).

    Raises:
        TypeError: not a LoggingConfig.
        ValueError: an unknown level (Ray 2.60 raises it from ``init()`` too, before
            anything starts) or an unknown encoding in the environment variable.
    """
    if logging_config is None:
        encoding = config.logging_config_encoding()
        if encoding is None:
            return None
        logging_config = logging_configs.LoggingConfig(encoding=encoding)
    if not isinstance(logging_config, logging_configs.LoggingConfig):
        raise TypeError(
            "logging_config must be a ray.LoggingConfig, e.g. "
            "ray.LoggingConfig(encoding='JSON', log_level='INFO'), got "
            f"{type(logging_config).__name__} {logging_config!r}.")
    logging_configs.check_level(logging_config.log_level)
    return logging_config


def _check_whole(name: str, value, resources_repr: dict) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"The value of {name} must be a number, got {value!r}.")
    if value < 0:
        raise ValueError(f"Resource quantities must be nonnegative; {name}={value}.")
    if value > 1e14:
        raise ValueError(f"Resource quantity {name}={value} exceeds the maximum of 1e14.")
    if float(value) != int(value):
        raise ValueError(
            "Resource quantities must all be whole numbers. "
            f"Violated by resource '{name}' in {resources_repr}."
        )
