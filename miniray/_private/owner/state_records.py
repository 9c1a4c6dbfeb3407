"""What one driver shows of its work to ``ray.util.state`` and ``miniray list``: the finished
tasks it remembers, and the snapshot of everything it owns.

Owns: the bounded record of finished tasks and actor calls (``task_done`` and ``call_done``,
one call per completion, a tuple appended to a bounded deque: the task path pays nothing
more), and
``snapshot``, which reads the owner's own tables (tasks waiting or running, actors and their
calls, objects, workers) under the owner's lock when someone asks, and turns them into rows
with Ray 2.60's field names and value spellings (``ray.util.state.common``: TaskState,
ActorState, ObjectState, WorkerState). Live work is never recorded separately: it is read
where the owner already keeps it.
Does not own: serving the snapshot (``transport/state_socket.py``), nor filtering and
formatting rows for readers (``core/state_rows.py``).
Called by: ``tasks.TaskQueue.complete`` and ``actor_calls.ActorCalls._finish`` (the records),
``runtime.py`` (the snapshot and the pending groups, from the state socket's thread).
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from typing import Any

from miniray._private.core import config, protocol, serialization
from miniray._private.core.scheduling import T_QUEUED, T_RUNNING, T_WAITING
from miniray._private.core.timeline_events import unpack_times
from miniray._private.owner.object_table import PENDING
from miniray._private.owner.placement_group_records import state_row

# Ray's task states for the owner's (scheduling.T_*); infeasible tasks wait for a node.
_TASK_STATE = {T_WAITING: "PENDING_ARGS_AVAIL", T_QUEUED: "PENDING_NODE_ASSIGNMENT",
               T_RUNNING: "RUNNING"}
# Ray's ErrorType names for the errors a task's refs can hold (the rest: their own class).
_ERROR_TYPE = {
    "RayTaskError": "TASK_EXECUTION_EXCEPTION",
    "WorkerCrashedError": "WORKER_DIED",
    "TaskCancelledError": "TASK_CANCELLED",
    "ActorDiedError": "ACTOR_DIED",
    "ActorUnavailableError": "ACTOR_UNAVAILABLE",
    "RuntimeEnvSetupError": "RUNTIME_ENV_SETUP_FAILED",
    "OutOfMemoryError": "OUT_OF_MEMORY",
    "ObjectLostError": "OBJECT_UNRECONSTRUCTABLE",
    "OwnerDiedError": "OBJECT_UNRECONSTRUCTABLE_OWNER_DIED",
    "RaySystemError": "WORKER_DIED",
    "ActorUnschedulableError": "ACTOR_UNSCHEDULABLE_ERROR",
    "TaskUnschedulableError": "TASK_UNSCHEDULABLE_ERROR",
    "TaskPlacementGroupRemoved": "TASK_PLACEMENT_GROUP_REMOVED",
    "ActorPlacementGroupRemoved": "ACTOR_PLACEMENT_GROUP_REMOVED",
}
_TASK, _CREATION, _ACTOR_TASK = "NORMAL_TASK", "ACTOR_CREATION_TASK", "ACTOR_TASK"
_ERR = protocol.ERR
_NO_RESULT = (protocol.OK, None)
_now = time.time


class StateRecords:
    """The finished tasks and the finished actor calls of one driver, newest last, at most
    ``config.state_max_tasks()`` of each. Appended under the owner's lock; read under it."""

    def __init__(self, maxlen: int | None = None):
        maxlen = config.state_max_tasks() if maxlen is None else maxlen
        self.tasks: collections.deque = collections.deque(maxlen=maxlen)
        self.calls: collections.deque = collections.deque(maxlen=maxlen)
        # Constructors that ran, for the timeline only (their rows come from the actors).
        self.creations: collections.deque = collections.deque(maxlen=maxlen)
        self._append_task = self.tasks.append  # bound once: this runs for every task
        self.started_at = time.time()

    def task_done(self, task, results: list) -> None:
        """*Locked.* ``task`` (``tasks.Task``) completed with ``results``. The error bytes of a
        failure are kept as they are: they are read only when someone asks."""
        spec = task.spec
        worker = task.worker
        first = results[0] if results else _NO_RESULT
        self._append_task((spec.task_id, spec.name, spec.function_name, spec.request,
                           worker.pid if worker is not None else None,
                           first[1] if first[0] == _ERR else None, _now(), task.created,
                           task.times, getattr(worker, "node", None)))  # a remote one's node

    def call_done(self, actor, spec, results: list, times: tuple | None = None) -> None:
        """*Locked.* An actor call (``actor_records._Call``'s spec) of ``actor`` completed;
        ``times`` are its worker's RESULT times (None if it never ran)."""
        first = results[0] if results else _NO_RESULT
        worker = actor.worker
        self.calls.append((spec.task_id, f"{actor.spec.class_name}.{spec.call_name}",
                           actor.spec.actor_id,
                           actor.pid or (worker.pid if worker is not None else None),
                           first[1] if first[0] == _ERR else None, _now(), times,
                           spec.call_name, actor.node))


    def creation_done(self, actor, pid: int, failed: bool, times: bytes) -> None:
        """*Locked.* ``actor``'s constructor ran in ``pid`` (ACTOR_READY's times)."""
        spec = actor.spec
        self.creations.append((spec.actor_id + b"\x00" * 8, f"{spec.class_name}.__init__",
                               spec.actor_id, pid, failed, times))


def error_fields(data: bytes | None) -> tuple[str | None, str | None]:
    """``(error_type, error_message)`` for a failed task's error bytes (Ray's ErrorType
    names), ``(None, None)`` for a success."""
    if data is None:
        return None, None
    try:
        error = serialization.loads(data)
    except Exception as failure:  # a class the driver cannot import: still a failure
        return "TASK_EXECUTION_EXCEPTION", f"(error not readable here: {failure!r})"
    names = [cls.__name__ for cls in type(error).__mro__]
    for name in names:
        if name in _ERROR_TYPE:
            return _ERROR_TYPE[name], str(error)
    return type(error).__name__, str(error)


def _death_cause(error: tuple, pid: int | None, spec) -> tuple[dict, int | None]:
    """Pure. A dead actor's ``death_cause`` as Ray's state API gives it (one field of Ray's
    ActorDeathCause, by the error's ``error_fields``), and its pid: the one it had, else the
    one its death message names (its worker is gone; ``from_context`` writes it).

    >>> from types import SimpleNamespace as S
    >>> spec = S(class_name="A", actor_id=b"\\x01", name="a", namespace="n")
    >>> _death_cause(("ACTOR_UNSCHEDULABLE_ERROR", "no room"), None, spec)
    ({'actor_unschedulable_context': {'error_message': 'no room'}}, None)
    >>> cause, pid = _death_cause(("ACTOR_DIED", "gone\\n\\tpid: 12"), None, spec)
    >>> pid, sorted(cause["actor_died_error_context"])[:3]
    (12, ['actor_id', 'class_name', 'error_message'])
    """
    error_type, message = error[0], error[1] or ""
    if error_type == "ACTOR_UNSCHEDULABLE_ERROR":  # it never started: no worker, no pid
        return {"actor_unschedulable_context": {"error_message": message}}, pid
    found = re.search(r"^\tpid: (\d+)$", message, re.M)
    pid = pid or (int(found.group(1)) if found else None)
    return {"actor_died_error_context": {
        "error_message": message, "pid": pid, "class_name": spec.class_name,
        "actor_id": spec.actor_id.hex(), "name": spec.name or "",
        "ray_namespace": spec.namespace}}, pid


def _task_row(kind: str, task_id: bytes, name: str, func: str, actor_id, pid, request,
              state: str, ids: dict, error=(None, None), end: float | None = None,
              created: float | None = None, pg: tuple | None = None,
              times: tuple | None = None, node: str | None = None) -> dict:
    return {
        "task_id": task_id.hex(), "attempt_number": 0, "name": name, "state": state,
        "job_id": ids["job_id"], "actor_id": actor_id.hex() if actor_id else None,
        "type": kind, "func_or_class_name": func, "parent_task_id": None,
        "node_id": (node or ids["node_id"]) if pid else None, "worker_id": None,
        "worker_pid": pid,
        "error_type": error[0], "language": "PYTHON",
        "required_resources": ({k: float(v) for k, v in request.items()}
                               if request is not None else {}),
        "runtime_env_info": None, "placement_group_id": pg[0] if pg else None,
        "creation_time_ms": int(created * 1000) if created else None,
        "start_time_ms": times[0] // 1_000_000 if times else None,  # unpacked
        "end_time_ms": int(end * 1000) if end else None,
        "error_message": error[1], "call_site": None,
    }


def _short(function_name: str) -> str:
    return function_name.rsplit(".", 1)[-1]


def snapshot(owner, records: StateRecords, ids: dict) -> dict:
    """Everything the driver owns, as Ray's rows: ``{"driver", "tasks", "actors", "objects",
    "workers", "placement_groups"}`` (the groups it still waits to reserve). ``ids``:
    ``job_id``, ``node_id``, ``worker_id`` and ``pid`` of the driver.
    Reads the owner's tables under its lock, then builds rows after it (errors unpickled
    there)."""
    with owner.locked():
        # Refs made or dropped since the I/O thread's last turn count too: a reader sees
        # what the program holds now.
        owner.objects.apply_ref_events()
        live = [(t.spec, t.state, t.worker.pid if t.worker is not None else None, t.created,
                 getattr(t.worker, "node", None)) for t in owner.tasks.by_id.values()]
        done_tasks = list(records.tasks)
        done_calls = list(records.calls)
        actors = []
        for actor in owner.actors.actors.values():
            calls = [(c.spec, True) for c in actor.inflight.values()]
            calls += [(c.spec, False) for c in actor.queue]
            pid = actor.pid or (actor.worker.pid if actor.worker is not None else None)
            actors.append((actor.spec, actor.state, pid, actor.death, actor.restarts,
                           actor.remote, calls, actor.init_failed, actor.node,
                           actor.repr_name))
        # A result kept on another node, not pulled: (that node, its size) (issue 16).
        objects = [(object_id, e.state, e.kind, e.refs, e.holders, e.borrows, e.escaped,
                    (e.remote.node_id, e.remote.size) if e.remote is not None
                    and e.state == PENDING else None)
                   for object_id, e in owner.objects.entries.items()]
        workers = [(w.pid, bool(w.inflight), w.actor is not None, w.blocked)
                   for w in owner.workers.by_pid.values() if not w.dead]
        demands = owner.waits.demands_now()
        pgs = getattr(owner, "pgs", None)
        pending_groups = pgs.pending_records() if pgs is not None else []
    sizes = owner.store.sizes()
    tasks = []
    for spec, state, pid, created, node in live:
        tasks.append(_task_row(_TASK, spec.task_id, spec.name, _short(spec.function_name),
                               None, pid if state == T_RUNNING else None, spec.request,
                               _TASK_STATE.get(state, "PENDING_NODE_ASSIGNMENT"), ids,
                               created=created, pg=getattr(spec, "placement", None),
                               node=node))
    actor_rows = []
    for spec, state, pid, death, restarts, remote, calls, init_failed, node, repr_name in \
            actors:
        creation = f"{spec.class_name}.__init__"
        c_state = {"ALIVE": "FINISHED", "DEAD": "FAILED" if init_failed else "FINISHED"}.get(
            state, "PENDING_NODE_ASSIGNMENT")
        tasks.append(_task_row(_CREATION, spec.actor_id + b"\x00" * 8, creation, creation,
                               spec.actor_id, pid, getattr(spec, "placement", None) or {},
                               c_state, ids, pg=getattr(spec, "pg", None), node=node))
        for call_spec, running in calls:
            name = f"{spec.class_name}.{call_spec.call_name}"
            tasks.append(_task_row(_ACTOR_TASK, call_spec.task_id, name, name, spec.actor_id,
                                   pid if running else None, None,
                                   "RUNNING" if running else "PENDING_ARGS_AVAIL", ids,
                                   node=node))
        death_cause = None
        if state == "DEAD" and death is not None:
            death_cause, pid = _death_cause(error_fields(death), pid, spec)
        actor_rows.append({
            "actor_id": spec.actor_id.hex(), "class_name": spec.class_name, "state": state,
            "job_id": ids["job_id"], "name": spec.name or "",
            "node_id": (node or ids["node_id"]) if pid else None, "pid": pid,
            "ray_namespace": spec.namespace, "serialized_runtime_env": None,
            "required_resources": {k: float(v) for k, v in
                                   (getattr(spec, "placement", None) or {}).items()},
            "death_cause": death_cause, "is_detached": bool(spec.detached),
            "placement_group_id": spec.pg[0] if getattr(spec, "pg", None) else None,
            "repr_name": repr_name, "num_restarts": restarts,
            "num_restarts_due_to_lineage_reconstruction": 0,
            "num_restarts_due_to_node_preemption": 0, "call_site": None,
            "owned_by_actor_service": bool(remote),
        })
    for task_id, name, func, request, pid, err, end, created, times, node in done_tasks:
        tasks.append(_task_row(_TASK, task_id, name, _short(func), None, pid, request,
                               "FAILED" if err is not None else "FINISHED", ids,
                               error_fields(err), end, created, times=unpack_times(times),
                               node=node))
    for task_id, name, actor_id, pid, err, end, times, _call, node in done_calls:
        tasks.append(_task_row(_ACTOR_TASK, task_id, name, name, actor_id, pid, None,
                               "FAILED" if err is not None else "FINISHED", ids,
                               error_fields(err), end, times=unpack_times(times), node=node))
    object_rows = []
    remote_nodes = getattr(owner, "remote_nodes", None)
    ips = {n.node_id: n.ip for n in remote_nodes.last_view()} if remote_nodes else {}
    for object_id, state, kind, refs, holders, borrows, escaped, kept in objects:
        if holders:
            reference = "USED_BY_PENDING_TASK"
        elif refs:
            reference = "LOCAL_REFERENCE"
        elif borrows or escaped:
            reference = "CAPTURED_IN_OBJECT" if escaped else "BORROWED"
        else:
            reference = "PINNED_IN_MEMORY"
        object_rows.append({
            "object_id": object_id.hex(), "object_size": sizes.get(object_id, -1)
            if state != PENDING else -1,
            "task_status": "FINISHED" if state != PENDING else "PENDING_NODE_ASSIGNMENT",
            "attempt_number": 0, "reference_type": reference, "call_site": "disabled",
            "type": "DRIVER", "pid": ids["pid"], "ip": "127.0.0.1",
            "error": kind == protocol.ERR,
            "node_id": ids["node_id"],  # where the value is (miniray's: Ray has none)
        })
        if kept is not None:  # its value is on that node until a get pulls it
            object_rows[-1].update(node_id=kept[0], object_size=kept[1],
                                   task_status="FINISHED", ip=ips.get(kept[0], "?"))
    worker_rows = [{
        "worker_id": ids["worker_id"], "is_alive": True, "worker_type": "DRIVER",
        "exit_type": None, "node_id": ids["node_id"], "ip": "127.0.0.1", "pid": ids["pid"],
        "exit_detail": None, "worker_launch_time_ms": int(records.started_at * 1000),
        "worker_launched_time_ms": int(records.started_at * 1000),
        "start_time_ms": int(records.started_at * 1000), "end_time_ms": None,
        "debugger_port": None, "num_paused_threads": None,
    }]
    for pid, _busy, _hosts_actor, _blocked in workers:
        worker_rows.append({
            "worker_id": f"{pid:056x}", "is_alive": True, "worker_type": "WORKER",
            "exit_type": None, "node_id": ids["node_id"], "ip": "127.0.0.1", "pid": pid,
            "exit_detail": None, "worker_launch_time_ms": None,
            "worker_launched_time_ms": None, "start_time_ms": None, "end_time_ms": None,
            "debugger_port": None, "num_paused_threads": None,
        })
    driver = dict(ids, started_at=records.started_at, entrypoint=" ".join(
        [os.path.basename(sys.executable)] + sys.argv),
        store=dict(owner.store.statistics(), demands=demands))
    return {"driver": driver, "tasks": tasks, "actors": actor_rows, "objects": object_rows,
            "workers": worker_rows,
            "placement_groups": [state_row(record, "PENDING") for record in pending_groups]}


def pending_groups(owner) -> dict:
    """What a driver's node reads of it for another host's placement-group listing:
    ``{"placement_groups": [row]}``, the groups it still waits to reserve (as in
    ``snapshot``), read under the owner's lock."""
    pgs = getattr(owner, "pgs", None)
    with owner.locked():
        pending = pgs.pending_records() if pgs is not None else []
    return {"placement_groups": [state_row(record, "PENDING") for record in pending]}


def spans(owner, records: StateRecords, ids: dict) -> dict:
    """What ``ray.timeline()`` reads of this driver: ``{"driver": ids, "spans": [...]}``,
    one span per finished task or actor call that ran (``core/timeline_events.Span``'s
    fields, as a list: JSON). Copied under the owner's lock; nothing is recorded for it
    beyond the records ``ray.util.state`` keeps."""
    with owner.locked():
        done_tasks = list(records.tasks)
        done_calls = list(records.calls)
        creations = list(records.creations)
    out = []
    for task_id, name, actor_id, pid, failed, raw in creations:
        times = unpack_times(raw)
        if times and pid:
            out.append([task_id.hex(), "__init__", name, actor_id.hex(), pid, None,
                        list(times), failed])
    for task_id, name, func, _request, pid, err, _end, created, raw, _node in done_tasks:
        times = unpack_times(raw)
        if times and pid:
            out.append([task_id.hex(), func, name, None, pid, created, list(times),
                        err is not None])
    for task_id, name, actor_id, pid, err, _end, raw, call, _node in done_calls:
        times = unpack_times(raw)
        if times and pid:
            out.append([task_id.hex(), call, name, actor_id.hex(), pid, None, list(times),
                        err is not None])
    return {"driver": dict(ids), "spans": out}


def dumpable(doc: Any) -> Any:
    """``doc`` with every value JSON can write (bytes as hex)."""
    if isinstance(doc, dict):
        return {str(k): dumpable(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [dumpable(v) for v in doc]
    if isinstance(doc, bytes):
        return doc.hex()
    if doc is None or isinstance(doc, (str, int, float, bool)):
        return doc
    return str(doc)
