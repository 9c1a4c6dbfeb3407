"""The memory monitor's decisions (pure): when the host is running low on memory, which worker
to kill, what the error says, and when a task killed for it runs again.

Owns: the monitor's settings (``_system_config`` keys and ``RAY_*`` variables, as Ray 2.60
names them), the threshold test, the choice of the victim, the OutOfMemoryError text and the
retry delay. Does not own: reading the host's memory (``ledger/inventory.memory_usage``),
the timer, the kill or what a kill does to tasks and actors (``owner/owner_events.py``,
``owner/tasks.py``, ``owner/actors.py``).

As in Ray 2.60 (each compared with the same scripts there): the monitor looks every
``memory_monitor_refresh_ms`` (250; 0: off) at the host's used memory (its total less what is
available; a cgroup's limit and use where one is set) against ``memory_usage_threshold`` (0.95)
of its limit. Above it, one busy worker is killed: one whose task may be retried, or whose
actor may restart, before one that may not; among those, the one that started its work last.
A task killed so is retried without end when it may be retried at all (``max_retries`` not 0;
the wait doubles from 1 s up to 60 s between attempts), and otherwise fails with
``OutOfMemoryError``; an actor restarts while ``max_restarts`` allows, and otherwise dies with
``OutOfMemoryError`` as its calls' error. One kill at a time: the next choice waits until
the last victim has exited.

Example:
    >>> settings = monitor_settings({"memory_usage_threshold": 0.4}, {})
    >>> settings.threshold, settings.refresh_s
    (0.4, 0.25)
    >>> over_threshold(MemoryUse(used=5 << 30, limit=10 << 30), settings)
    True
    >>> pick_victim([Candidate("a", retriable=False, started=1.0),
    ...              Candidate("b", retriable=True, started=0.5),
    ...              Candidate("c", retriable=True, started=0.9)])
    'c'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

DEFAULT_THRESHOLD = 0.95
DEFAULT_REFRESH_MS = 250
THRESHOLD_KEY = "memory_usage_threshold"
REFRESH_KEY = "memory_monitor_refresh_ms"
MAX_RETRY_DELAY_S = 60.0


class MonitorSettings(NamedTuple):
    threshold: float  # a fraction of the limit
    refresh_s: float  # 0: the monitor is off


class MemoryUse(NamedTuple):
    used: int  # bytes
    limit: int  # bytes: the host's memory, or its cgroup's limit when lower


class Candidate(NamedTuple):
    key: Any  # whatever names the worker to the caller
    retriable: bool  # its task may be retried, or its actor may restart
    started: float  # when its current work started (any clock, the same for all)


def monitor_settings(system_config: Mapping | None, environ: Mapping) -> MonitorSettings:
    """The settings from ``init(_system_config=...)``, else ``RAY_memory_usage_threshold``
    and ``RAY_memory_monitor_refresh_ms``, else Ray's defaults. ValueError names a bad one."""
    system_config = system_config or {}

    def pick(key: str, default):
        if key in system_config:
            return system_config[key], f"_system_config[{key!r}]"
        name = f"RAY_{key}"
        if environ.get(name, "") != "":
            return environ[name], name
        return default, None

    raw, source = pick(THRESHOLD_KEY, DEFAULT_THRESHOLD)
    try:
        threshold = float(raw)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0 < threshold <= 1:
        raise ValueError(f"{source} must be a fraction of the host's memory in (0, 1], got "
                         f"{raw!r}.")
    raw, source = pick(REFRESH_KEY, DEFAULT_REFRESH_MS)
    try:
        refresh_ms = float(raw)
    except (TypeError, ValueError):
        refresh_ms = float("nan")
    if not refresh_ms >= 0:
        raise ValueError(f"{source} must be a number of milliseconds, 0 or more (0 turns the "
                         f"memory monitor off), got {raw!r}.")
    return MonitorSettings(threshold, refresh_ms / 1000.0)


def threshold_bytes(use: MemoryUse, settings: MonitorSettings) -> int:
    return int(use.limit * settings.threshold)


def over_threshold(use: MemoryUse | None, settings: MonitorSettings) -> bool:
    return use is not None and use.limit > 0 and use.used > threshold_bytes(use, settings)


def pick_victim(candidates: Sequence[Candidate]):
    """The key of the worker to kill: a retriable one first, then the latest started; None
    when there is none."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.retriable, c.started)).key


def retry_delay_s(oom_kills: int) -> float:
    """How long a task killed ``oom_kills`` times (1 or more) waits before it runs again."""
    return min(MAX_RETRY_DELAY_S, 2.0 ** min(max(0, oom_kills - 1), 16))


def _gb(n: int) -> str:
    return f"{n / 2 ** 30:.2f}GB"  # Ray's "GB" here are GiB


def oom_message(use: MemoryUse, settings: MonitorSettings, node_ip: str, node_id: str,
                what: str, pid: int, rss: int | None, retriable: bool) -> str:
    """The OutOfMemoryError text (Ray's first lines, then what was killed and how to go
    on): ``what`` names the task or actor the killed worker ran."""
    limit_bytes = threshold_bytes(use, settings)
    used_by = f", actual memory used={_gb(rss)}" if rss is not None else ""
    retry = ("" if retriable else
             "Set max_retries (tasks) or max_restarts (actors) to retry work killed for "
             "memory. ")
    return (
        f"1 worker(s) were killed due to the node running low on memory. Memory on the node "
        f"(IP: {node_ip}, ID: {node_id}) was {_gb(use.used)} used / {_gb(use.limit)} limit "
        f"({use.used / use.limit:.6f})\n"
        f"OOM kill reason: Memory usage {use.used}B exceeded threshold of {limit_bytes}B "
        f"({settings.threshold * 100:.1f}% of {use.limit}B limit)\n"
        f"Killed: {what}, pid={pid}{used_by}\n"
        "Consider provisioning more memory on this host or reducing task parallelism by "
        f"requesting more CPUs per task. {retry}To adjust the kill threshold, set the "
        "environment variable `RAY_memory_usage_threshold` (or init(_system_config="
        "{'memory_usage_threshold': ...})). To disable worker killing, set the environment "
        "variable `RAY_memory_monitor_refresh_ms` to zero.")


def oom_retry_line(name: str, message: str) -> str:
    """Ray's log line for a task killed for memory that will run again."""
    return (f"Task {name} failed due to oom. There are infinite oom retries remaining, so the "
            f"task will be retried. Error: {message.splitlines()[0]}")
