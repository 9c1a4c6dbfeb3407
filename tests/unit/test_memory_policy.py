"""The memory monitor's decisions (``core/memory_policy.py``), each checked against what Ray
2.60 did with the same settings: a max_retries=0 task killed for memory raises
OutOfMemoryError, a retriable one runs again without end ("There are infinite oom retries
remaining"), ``_system_config={"memory_usage_threshold": 0.2}`` is a fifth of the host's
memory."""

from __future__ import annotations

import math

import pytest

from miniray._private.core import memory_policy as mp


def test_settings_from_system_config_then_environment_then_rays_defaults():
    assert mp.monitor_settings(None, {}) == (0.95, 0.25)
    env = {"RAY_memory_usage_threshold": "0.5", "RAY_memory_monitor_refresh_ms": "100"}
    assert mp.monitor_settings(None, env) == (0.5, 0.1)
    assert mp.monitor_settings({"memory_usage_threshold": 0.2}, env) == (0.2, 0.1)
    assert mp.monitor_settings({"memory_monitor_refresh_ms": 0}, {}).refresh_s == 0  # off
    assert mp.monitor_settings({"other_key": 1}, {"RAY_memory_usage_threshold": ""}) == \
        (0.95, 0.25)


@pytest.mark.parametrize("config, env, words", [
    ({"memory_usage_threshold": 1.5}, {}, "_system_config['memory_usage_threshold'] must be"),
    ({"memory_usage_threshold": 0}, {}, "in (0, 1], got 0"),
    ({}, {"RAY_memory_usage_threshold": "most"}, "RAY_memory_usage_threshold must be"),
    ({"memory_monitor_refresh_ms": -5}, {}, "0 turns the memory monitor off), got -5"),
    ({}, {"RAY_memory_monitor_refresh_ms": "nan"}, "RAY_memory_monitor_refresh_ms must be"),
])
def test_bad_settings_are_named(config, env, words):
    with pytest.raises(ValueError) as error:
        mp.monitor_settings(config, env)
    assert words in str(error.value)


def test_over_the_threshold_is_strictly_above_a_fraction_of_the_limit():
    settings = mp.MonitorSettings(0.5, 0.25)
    assert not mp.over_threshold(mp.MemoryUse(50, 100), settings)
    assert mp.over_threshold(mp.MemoryUse(51, 100), settings)
    assert not mp.over_threshold(None, settings) and not mp.over_threshold(
        mp.MemoryUse(5, 0), settings)


def test_the_victim_is_retriable_first_then_the_latest_started():
    c = mp.Candidate
    assert mp.pick_victim([]) is None
    assert mp.pick_victim([c("old", False, 1.0), c("new", False, 2.0)]) == "new"
    assert mp.pick_victim([c("late", False, 9.0), c("retriable", True, 1.0)]) == "retriable"
    assert mp.pick_victim([c("a", True, 1.0), c("b", True, 3.0), c("x", False, 5.0)]) == "b"


def test_retry_waits_double_up_to_a_minute():
    assert [mp.retry_delay_s(n) for n in (1, 2, 3, 6, 7, 50)] == [1, 2, 4, 32, 60, 60]
    assert math.isfinite(mp.retry_delay_s(10_000))


def test_the_error_says_what_was_killed_and_how_to_go_on():
    use = mp.MemoryUse(used=5 << 30, limit=20 << 30)
    text = mp.oom_message(use, mp.MonitorSettings(0.2, 0.25), "127.0.0.1", "ab" * 28,
                          "task hog", 42, 3 << 30, retriable=False)
    lines = text.splitlines()
    assert lines[0] == ("1 worker(s) were killed due to the node running low on memory. "
                        f"Memory on the node (IP: 127.0.0.1, ID: {'ab' * 28}) was 5.00GB "
                        "used / 20.00GB limit (0.250000)")
    assert lines[1] == (f"OOM kill reason: Memory usage {5 << 30}B exceeded threshold of "
                        f"{int((20 << 30) * 0.2)}B (20.0% of {20 << 30}B limit)")
    assert lines[2] == "Killed: task hog, pid=42, actual memory used=3.00GB"
    assert "Set max_retries (tasks) or max_restarts (actors)" in lines[3]
    assert "RAY_memory_monitor_refresh_ms` to zero" in lines[3]
    retriable = mp.oom_message(use, mp.MonitorSettings(0.2, 0.25), "127.0.0.1", "n",
                               "actor A (id 01)", 7, None, retriable=True)
    assert "Set max_retries" not in retriable and "pid=7\n" in retriable
    assert mp.oom_retry_line("hog", text) == (
        "Task hog failed due to oom. There are infinite oom retries remaining, so the task "
        "will be retried. Error: " + lines[0])
