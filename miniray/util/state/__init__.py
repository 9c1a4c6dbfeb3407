"""``ray.util.state``: what runs, from any process of the user (Ray 2.60's API).

Every function reads the live drivers of the sessions ``address`` names (this process's own
session by default, else ``RAY_ADDRESS``'s node, else every live session of the user on this
host), each over its state socket (``miniray/_private/state_api.py``). Lists take Ray's
``filters`` (``[("state", "=", "RUNNING")]``; ``=`` and ``!=``, strings without case),
``limit`` (default 100), ``detail``, ``timeout`` and ``raise_on_missing_output``, and
return Ray's row types (``ray.util.state.common``). Summaries return Ray's documents
(``{"cluster": {...}}``).

Differs from Ray: no dashboard server answers it (each driver does) and there is no event
history. Tasks are remembered per driver
(the last ``MINIRAY_STATE_MAX_TASKS``, default 10000, finished ones, and every unfinished
one) only while their driver runs; a task's ``start_time_ms`` is not recorded
(``creation_time_ms`` and ``end_time_ms`` are). ``get_log`` and ``list_logs`` read the
workers' log files of the session (``<session>/logs/``, as ``miniray logs``).
``list_cluster_events``, ``list_runtime_envs`` and ``StateApiClient`` raise
NotImplementedError saying what to use.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple, Union

from miniray._private import state_api
from miniray._private.state_api import DEFAULT_LIMIT, DEFAULT_TIMEOUT

__all__ = [
    "StateApiClient", "get_actor", "get_job", "get_log", "get_node", "get_objects",
    "get_placement_group", "get_task", "get_worker", "list_actors", "list_cluster_events",
    "list_jobs", "list_logs", "list_nodes", "list_objects", "list_placement_groups",
    "list_runtime_envs", "list_tasks", "list_workers", "summarize_actors",
    "summarize_objects", "summarize_tasks",
]

Filters = Optional[List[Tuple[str, str, Union[str, bool, int, float]]]]


def _lister(resource: str):
    def list_resource(address: str | None = None, filters: Filters = None,
                      limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_TIMEOUT,
                      detail: bool = False, raise_on_missing_output: bool = True,
                      _explain: bool = False) -> List[Any]:
        return state_api.list_resource(resource, address, filters, limit, timeout, detail,
                                       raise_on_missing_output)

    list_resource.__name__ = list_resource.__qualname__ = f"list_{resource}"
    list_resource.__doc__ = (
        f"The {resource.replace('_', ' ')} of the sessions ``address`` names, as Ray's "
        f"``list_{resource}``: at most ``limit`` rows passing every filter.")
    return list_resource


list_actors = _lister("actors")
list_tasks = _lister("tasks")
list_objects = _lister("objects")
list_nodes = _lister("nodes")
list_workers = _lister("workers")
list_jobs = _lister("jobs")
list_placement_groups = _lister("placement_groups")


def _getter(resource: str):
    def get_resource(id: str, address: str | None = None,
                     timeout: int = DEFAULT_TIMEOUT, _explain: bool = False) -> Any | None:
        return state_api.get_resource(resource, id, address, timeout)

    name = resource.rstrip("s") if resource != "placement_groups" else "placement_group"
    get_resource.__name__ = get_resource.__qualname__ = f"get_{name}"
    get_resource.__doc__ = f"The {name.replace('_', ' ')} whose id is ``id``, or None."
    return get_resource


get_actor = _getter("actors")
get_task = _getter("tasks")
get_node = _getter("nodes")
get_worker = _getter("workers")
get_job = _getter("jobs")
get_placement_group = _getter("placement_groups")


def get_objects(id: str, address: str | None = None, timeout: int = DEFAULT_TIMEOUT,
                _explain: bool = False) -> List[Any]:
    """Every reference to object ``id`` (one row per driver holding it), as Ray's."""
    return state_api.list_resource("objects", address, [("object_id", "=", id)], None,
                                   timeout, True, False)


def summarize_tasks(address: str | None = None, timeout: int = DEFAULT_TIMEOUT,
                    raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Tasks counted by function (or class) name and state."""
    return state_api.summarize("tasks", address, timeout, raise_on_missing_output)


def summarize_actors(address: str | None = None, timeout: int = DEFAULT_TIMEOUT,
                     raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Actors counted by class and state."""
    return state_api.summarize("actors", address, timeout, raise_on_missing_output)


def summarize_objects(address: str | None = None, timeout: int = DEFAULT_TIMEOUT,
                      raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Objects counted by call site (``disabled``: call sites are not recorded)."""
    return state_api.summarize("objects", address, timeout, raise_on_missing_output)


def _refused(name: str, instead: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(f"ray.util.state.{name} is not supported by miniray: "
                                  f"{instead}")

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not supported: {instead}"
    return refused


def list_logs(address: str | None = None, node_id: str | None = None,
              node_ip: str | None = None, glob_filter: str | None = None,
              timeout: int = DEFAULT_TIMEOUT) -> dict:
    """The workers' log files (``<session>/logs/``) by kind: ``{"worker_out": [...],
    "worker_err": [...]}``; ``glob_filter`` as Ray's (``"worker-*.err"``). ``node_id`` /
    ``node_ip`` of another host's node: asked over that node's port."""
    return state_api.list_logs(address, glob_filter, node_id, node_ip, timeout)


def get_log(address: str | None = None, node_id: str | None = None,
            node_ip: str | None = None, filename: str | None = None,
            actor_id: str | None = None, task_id: str | None = None, pid: int | None = None,
            follow: bool = False, tail: int = 1000, timeout: int = DEFAULT_TIMEOUT,
            suffix: str = "out", encoding: str | None = "utf-8", errors: str | None = "strict",
            submission_id: str | None = None, attempt_number: int = 0,
            _interval: float | None = None) -> Iterator[str]:
    """The log of a worker (``pid``), an actor (``actor_id``), the worker that ran a task
    (``task_id``) or a file (``filename``), as Ray yields it: chunks of text, here one
    (its last ``tail`` lines), read on another host's node when ``node_id`` / ``node_ip``
    (or the task's node) names one. ``follow``: then each piece appended to it, polled
    every ``_interval`` seconds (default 0.25), until the caller stops iterating."""
    if submission_id is not None:
        raise ValueError("miniray has no job submission: there is no submission_id log.")
    if follow:
        yield from state_api.follow_log(address, filename, actor_id, task_id, pid, tail,
                                        suffix, timeout, node_id, node_ip,
                                        0.25 if _interval is None else float(_interval))
        return
    text = state_api.get_log(address, filename, actor_id, task_id, pid, tail, suffix, timeout,
                             node_id, node_ip)
    yield text


list_cluster_events = _refused(
    "list_cluster_events", "miniray keeps no event history; list_tasks and list_actors show "
    "the current state.")
list_runtime_envs = _refused(
    "list_runtime_envs", "runtime environments are applied in each worker at its start; "
    "list_tasks(detail=True) and list_actors(detail=True) show what runs.")


class StateApiClient:
    """Not supported: call the module's functions (``list_tasks`` ...) instead."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "ray.util.state.StateApiClient is not supported by miniray: call "
            "ray.util.state.list_tasks(), list_actors(), summarize_tasks() ... instead.")
