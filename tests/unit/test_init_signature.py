"""``init()`` and ``shutdown()`` have Ray 2.60's signatures: the same parameters, in the same
order, of the same kinds, with the same defaults (no processes are started here).

The tables were copied from ``inspect.signature(ray.init)`` and ``ray.shutdown`` in Ray 2.60;
the unknown-keyword errors were compared with Ray 2.60 too.
"""

from __future__ import annotations

import inspect

import pytest

import miniray

P = inspect.Parameter
RAY_INIT = [
    ("address", P.POSITIONAL_OR_KEYWORD, None),
    ("num_cpus", P.KEYWORD_ONLY, None),
    ("num_gpus", P.KEYWORD_ONLY, None),
    ("resources", P.KEYWORD_ONLY, None),
    ("labels", P.KEYWORD_ONLY, None),
    ("object_store_memory", P.KEYWORD_ONLY, None),
    ("local_mode", P.KEYWORD_ONLY, False),
    ("ignore_reinit_error", P.KEYWORD_ONLY, False),
    ("include_dashboard", P.KEYWORD_ONLY, None),
    ("dashboard_host", P.KEYWORD_ONLY, "127.0.0.1"),
    ("dashboard_port", P.KEYWORD_ONLY, None),
    ("job_config", P.KEYWORD_ONLY, None),
    ("configure_logging", P.KEYWORD_ONLY, True),
    ("logging_level", P.KEYWORD_ONLY, "info"),
    ("logging_format", P.KEYWORD_ONLY, None),
    ("logging_config", P.KEYWORD_ONLY, None),
    ("log_to_driver", P.KEYWORD_ONLY, None),
    ("namespace", P.KEYWORD_ONLY, None),
    ("runtime_env", P.KEYWORD_ONLY, None),
    ("enable_resource_isolation", P.KEYWORD_ONLY, False),
    ("cgroup_path", P.KEYWORD_ONLY, None),
    ("system_reserved_cpu", P.KEYWORD_ONLY, None),
    ("system_reserved_memory", P.KEYWORD_ONLY, None),
    ("proxy_server_url", P.KEYWORD_ONLY, None),
    ("kwargs", P.VAR_KEYWORD, P.empty),
]
RAY_SHUTDOWN = [
    ("wait_for_processes", P.KEYWORD_ONLY, False),
    ("_exiting_interpreter", P.KEYWORD_ONLY, False),
]


def _table(function) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("function, ray_table", [(miniray.init, RAY_INIT),
                                                 (miniray.shutdown, RAY_SHUTDOWN)])
def test_signature_is_rays(function, ray_table):
    assert _table(function) == ray_table


def test_init_takes_one_positional_argument_as_ray_does():
    with pytest.raises(TypeError, match=r"takes from 0 to 1 positional arguments but 2"):
        miniray.init("auto", 2)
    assert not miniray.is_initialized()


def test_shutdown_takes_keywords_only_as_ray_does():
    with pytest.raises(TypeError, match=r"takes 0 positional arguments but 1 was given"):
        miniray.shutdown(True)


def test_unknown_keywords_are_named_in_the_order_passed_as_ray_does():
    """Ray 2.60: ``ray.init(zeta=1, alpha=2)`` raises RuntimeError("Unknown keyword
    argument(s): zeta, alpha"); its hidden ``_`` options are not counted."""
    with pytest.raises(RuntimeError) as info:
        miniray.init(zeta=1, alpha=2, _temp_dir=None)
    assert str(info.value) == "Unknown keyword argument(s): zeta, alpha"
    assert not miniray.is_initialized()
