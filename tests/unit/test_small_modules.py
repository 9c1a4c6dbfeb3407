"""Small public modules Ray programs import: ``util.log_once``, ``cloudpickle``, ``types``,
``util.get_node_instance_id``, ``actor.method`` (no processes).

What each returns was compared with Ray 2.60 (``ray.util.debug``, ``ray.cloudpickle``,
``ray.types``, ``ray.util.get_node_instance_id``, ``ray.actor.method``).
"""

from __future__ import annotations

import importlib
import threading
from typing import Generic

import pytest

import miniray
from miniray.util import debug


@pytest.fixture
def fresh_log_once(monkeypatch):
    monkeypatch.setattr(debug, "_seen", set())
    monkeypatch.setattr(debug, "_disabled", False)
    monkeypatch.setattr(debug, "_periodic", False)
    monkeypatch.setattr(debug, "_last_true", 0.0)
    return debug


def test_log_once_is_true_once_per_key(fresh_log_once):
    log_once = miniray.util.log_once
    assert log_once is debug.log_once and "log_once" in miniray.util.__all__
    assert log_once("a") is True
    assert log_once("a") is False and log_once("a") is False
    assert log_once("b") is True


def test_log_once_reset_and_disable(fresh_log_once):
    debug.log_once("a"), debug.log_once("b")
    debug.reset_log_once("a")
    assert debug.log_once("a") is True and debug.log_once("b") is False
    debug.reset_log_once()
    assert debug.log_once("b") is True
    miniray.util.disable_log_once_globally()
    assert debug.log_once("never-seen") is False


def test_periodic_logging_forgets_keys_after_the_period(fresh_log_once, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(debug.time, "monotonic", lambda: clock[0])
    miniray.util.enable_periodic_logging()
    assert debug.log_once("a") is True
    clock[0] += debug.PERIOD_S / 2
    assert debug.log_once("a") is False
    clock[0] += debug.PERIOD_S
    # As Ray: the call that notices the period is over is still False, the next is True.
    assert debug.log_once("a") is False
    assert debug.log_once("a") is True


def test_log_once_gives_one_true_among_threads(fresh_log_once):
    results = []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait(timeout=10)
        results.append(debug.log_once("shared"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(results) == [False] * 7 + [True]


def test_cloudpickle_is_an_attribute_and_a_module():
    module = importlib.import_module("miniray.cloudpickle")
    assert miniray.cloudpickle is module
    assert module.loads(module.dumps(lambda x: x * 2))(21) == 42
    for name in module.__all__:
        assert hasattr(module, name), name


def test_types_object_ref_is_a_generic_placeholder_as_in_ray():
    types = importlib.import_module("miniray.types")
    assert issubclass(types.ObjectRef, Generic)
    assert types.ObjectRef[int].__origin__ is types.ObjectRef
    assert types.ObjectRef is not miniray.ObjectRef


def test_get_node_instance_id_reads_ray_cloud_instance_id(monkeypatch):
    monkeypatch.delenv("RAY_CLOUD_INSTANCE_ID", raising=False)
    assert miniray.util.get_node_instance_id() == ""
    monkeypatch.setenv("RAY_CLOUD_INSTANCE_ID", "i-0123")
    assert miniray.util.get_node_instance_id() == "i-0123"
    assert not miniray.is_initialized()


def test_actor_method_is_ray_method():
    assert miniray.actor.method is miniray.method and "method" in miniray.actor.__all__
