"""The bodies of ``ray.util.state`` and of ``miniray list/summary/get/memory``.

Owns: choosing which sessions a reader means (``address``: this process's own session, a
node's address, a session directory, or every live session of the user's root), asking
each live driver of those sessions for its snapshot over its state socket, and turning the
snapshots into Ray's rows for every resource (nodes and jobs are made here: a node is a
session, plus every other node of its cluster from the view it publishes, alive or dead; a
job is a driver), merged, filtered, limited and typed (``core/state_rows.py``).
A driver that does not answer is a missing part of the output: ``raise_on_missing_output``
decides, as in Ray, whether that raises or warns.
Worker logs are files read here, except another host's node's (``node_id``/``node_ip``),
asked over a short driver link to that node (``node/remote_drivers.py`` step 13).
Placement groups are the cluster's: every other alive node of the view is asked for its
own (step 16 there, all at once, within ``MINIRAY_STATE_NODE_TIMEOUT_S``; one that does
not answer is a missing part too).
Does not own: the snapshot (``owner/state_records.py``), the socket
(``transport/state_socket.py``), nor printing (``core/state_rows.py``).
Called by: ``miniray/util/state/``, ``cli.py``, ``node/node_status.py``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from miniray._private.core import (
    ask_all,
    cluster_view,
    config,
    context,
    state_rows,
    timeline_events,
)
from miniray._private.core.resources import from_units
from miniray._private.host import procinfo, session, worker_logs
from miniray._private.ledger.ledger import Ledger
from miniray._private.owner import placement_group_records
from miniray._private.transport import node_client, state_socket

DEFAULT_LIMIT = 100
DEFAULT_TIMEOUT = 30


class RayStateApiException(Exception):
    """Ray's error of the state API (``ray.util.state.exception.RayStateApiException``)."""


@dataclass
class SessionView:
    """One session as the state API sees it: its directory, its node record (None for an
    embedded ``init()`` session), and the snapshots of its live drivers."""

    session_dir: str
    record: object | None = None
    drivers: list = field(default_factory=list)
    missing: list = field(default_factory=list)  # (pid, why) of drivers that did not answer


def _own_session() -> str | None:
    runtime = context.current()
    if runtime is None:
        return None
    path = getattr(runtime, "session_dir", None)
    if path is None:  # a worker's runtime: its driver's session came in HELLO
        path = (getattr(runtime, "info", None) or {}).get("session_dir")
    return path or None


def session_dirs(address: str | None = None, root: str | None = None) -> list[str]:
    """The sessions ``address`` names. None or ``"auto"``: this process's own session when it
    has one, else ``RAY_ADDRESS``'s node when set, else every live session of ``root``. A
    node's ``"host:port"``, a session directory or its name: that one. ConnectionError when
    nothing matches."""
    root = root or config.tmpdir_root()
    if address in (None, "", "auto"):
        own = _own_session()
        if own is not None:
            return [own]
        address = os.environ.get("RAY_ADDRESS") or None
        if address in (None, "", "auto"):
            return live_sessions(root)
    candidate = address if os.path.isabs(address) else os.path.join(root, address)
    if os.path.basename(candidate).startswith(session.SESSION_PREFIX):
        if not os.path.isdir(candidate):
            raise ConnectionError(f"no miniray session {address!r} under {root}.")
        return [candidate]
    record = node_client.find_node(address, root)
    if record is None:
        raise ConnectionError(f"no miniray node at {address!r}.")
    return [record.session_dir]


def live_sessions(root: str) -> list[str]:
    """Every session directory of ``root`` whose owner still runs, oldest first."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    here = procinfo.identity()
    out = []
    for name in names:
        if not name.startswith(session.SESSION_PREFIX):
            continue
        path = os.path.join(root, name)
        if session.owner_verdict(path, here) == "alive":
            out.append(path)
    return out


def gather(address: str | None = None, timeout: float = DEFAULT_TIMEOUT,
           root: str | None = None) -> list[SessionView]:
    """Each session ``address`` names, with the snapshot of each of its live drivers."""
    views = []
    for path in session_dirs(address, root):
        record = node_client.read_record(os.path.join(path, node_client.RECORD_FILE))
        view = SessionView(path, record)
        for pid, sock in state_socket.live_sockets(path):
            try:
                doc = state_socket.ask(sock, timeout)
            except (OSError, ValueError) as error:
                view.missing.append((pid, str(error)))
                continue
            if "error" in doc:
                view.missing.append((pid, doc["error"]))
                continue
            view.drivers.append(doc)
        views.append(view)
    return views


def memory(address: str | None = None, timeout: float = DEFAULT_TIMEOUT, *,
           group_by: str = "NODE_ADDRESS", sort_by: str = "OBJECT_SIZE", units: str = "B",
           stats_only: bool = False, num_entries: int | None = None) -> str | None:
    """``ray memory``'s report of the sessions ``address`` names (``miniray memory``,
    ``ray._private.internal_api.memory_summary``); None when no driver of theirs runs.
    ValueError names a bad option before anything is asked."""
    for name, value, allowed in (("group_by", group_by, state_rows.MEMORY_GROUPS),
                                 ("sort_by", sort_by, state_rows.MEMORY_SORTS),
                                 ("units", units, tuple(state_rows.MEMORY_UNITS))):
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}.")
    if num_entries is not None and (not isinstance(num_entries, int) or num_entries < 0):
        raise ValueError(f"num_entries={num_entries!r}: give a count of 0 or more, or None "
                         "for all.")
    order = {"PID": lambda r: r.get("pid") or 0,
             "OBJECT_SIZE": lambda r: -(r.get("object_size") or 0),
             "REFERENCE_TYPE": lambda r: r.get("reference_type") or ""}[sort_by]
    drivers = []
    objects: dict[int, list] = {}
    for view in gather(address, timeout):
        for doc in view.drivers:
            drivers.append(dict(doc["driver"], session=os.path.basename(view.session_dir)))
            objects[doc["driver"]["pid"]] = sorted(doc["objects"], key=order)
    if not drivers:
        return None
    return state_rows.format_memory(drivers, objects, sort_by=sort_by,
                                    num_entries=num_entries, units=units,
                                    stats_only=stats_only)


def timeline(address: str | None = None, timeout: float = DEFAULT_TIMEOUT,
             root: str | None = None) -> list[dict]:
    """The Chrome trace events of every live driver of the sessions ``address`` names
    (``ray.timeline``, ``miniray timeline``): each driver's finished tasks and actor calls,
    as many as it keeps (``MINIRAY_STATE_MAX_TASKS``). A driver that does not answer is
    left out with a warning."""
    docs = []
    for path in session_dirs(address, root):
        for pid, sock in state_socket.live_sockets(path):
            try:
                doc = state_socket.ask(sock, timeout, what="timeline")
            except (OSError, ValueError) as error:
                doc = {"error": str(error)}
            if "error" in doc:
                warnings.warn(f"the timeline leaves out driver {pid}: {doc['error']}",
                              stacklevel=2)
                continue
            docs.append(doc)
    return timeline_events.trace_events(docs)


def _ledger_groups(view: SessionView) -> dict:
    """``{hex: ledger record}`` of the groups reserved in ``view``'s ledger ({} when it
    cannot be read)."""
    ledger = None
    try:
        ledger = Ledger(os.path.join(view.session_dir, "ledger.json"))
        return {h: lease.group for h, lease in ledger.groups().items()}
    except (OSError, ValueError):
        return {}
    finally:
        if ledger is not None:
            ledger.close()


def group_rows(reserved: list[dict], pending: list[dict]) -> list[dict]:
    """Pure. Ray's rows of placement groups, each group once, in the order of their ids
    (the same rows in the same order from any host): ``reserved`` (each session's
    ledger's, then each other node's: ``{hex: ledger record}`` each), a group's first
    record winning; then ``pending`` (the drivers' rows of groups they still wait to
    reserve, of this host's and of the other nodes': ``_far_groups``), a group's first
    row winning, less the groups reserved anywhere meanwhile (a reserved record wins).

    >>> a, b = {"id": "a", "bundles": [{"CPU": 1}], "nodes": ["n"]}, {"id": "b", "bundles": []}
    >>> [(r["placement_group_id"], r["state"]) for r in group_rows(
    ...     [{"b": b, "a": dict(a, nodes=["m"])}, {"a": a}],
    ...     [placement_group_records.state_row({"id": "c", "bundles": []}, "PENDING"),
    ...      placement_group_records.state_row(b, "PENDING")])]
    [('a', 'CREATED'), ('b', 'CREATED'), ('c', 'PENDING')]
    """
    records: dict[str, dict] = {}
    for groups in reserved:
        for pg_hex, record in sorted(groups.items()):
            records.setdefault(pg_hex, record)
    found = {pg_hex: placement_group_records.state_row(record, "CREATED")
             for pg_hex, record in records.items()}
    for row in pending:
        found.setdefault(row["placement_group_id"], row)
    return [found[pg_hex] for pg_hex in sorted(found)]


def nodes_to_ask(clusters: list[tuple]) -> tuple[list, str | None, str | None]:
    """Pure. Which other nodes a placement-group listing of sessions whose clusters are
    ``clusters`` (each session's ``(local node id, {node id: NodeEntry})`` from its
    published view) asks for their groups (``_far_groups``): ``(every node alive in one
    of those views that is none of these sessions' own, by node id; this host's node IP;
    why the head's groups are left out: a member's view shows no alive head, else None)``.
    A view that does not show its own node (yet) says nothing.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> head, member = NodeEntry("h", "10.0.0.1", 1, True), NodeEntry("m", "10.0.0.2", 1)
    >>> other = NodeEntry("o", "10.0.0.3", 1)
    >>> nodes = {"h": head, "m": member, "o": other}
    >>> nodes_to_ask([]), nodes_to_ask([("h", nodes), ("m", nodes), ("o", nodes)])
    (([], None, None), ([], '10.0.0.1', None))
    >>> nodes_to_ask([("m", nodes)]) == ([head, other], "10.0.0.2", None)
    True
    >>> nodes_to_ask([("h", nodes)]) == ([member, other], "10.0.0.1", None)
    True
    """
    own_ids = {local for local, nodes in clusters if local in nodes}
    found: dict[str, object] = {}
    own_ip, headless = None, False
    for local, nodes in clusters:
        own = nodes.get(local)
        if own is None:
            continue
        own_ip = own_ip or own.ip
        headless = headless or not (own.is_head or any(
            e.is_head and e.alive for e in nodes.values()))
        for node_id, entry in nodes.items():
            if entry.alive and node_id not in own_ids:
                found.setdefault(node_id, entry)
    why = ("the cluster's head is not alive in this node's view: its placement groups "
           "are left out") if headless else None
    return [found[node_id] for node_id in sorted(found)], own_ip, why


@dataclass
class FarGroups:
    """The placement groups of the other nodes of these sessions' clusters
    (``_far_groups``): each node's reserved ``{hex: ledger record}``, their drivers'
    pending rows, and what is missing (one text each: a node, or a driver there)."""

    reserved: list = field(default_factory=list)
    pending: list = field(default_factory=list)
    missing: list = field(default_factory=list)


def _far_groups(views: list[SessionView], timeout: float) -> FarGroups:
    """Every other alive node of these sessions' clusters (``nodes_to_ask``) asked for its
    groups over a short driver link each, all at once (``core/ask_all.py``), one request
    per node (``remote_drivers.py`` step 16: the groups reserved in its ledger, among
    them the detached ones its actor service holds, and its drivers' pending rows),
    within ``MINIRAY_STATE_NODE_TIMEOUT_S`` (or ``timeout`` when shorter): a node that
    has not answered by then (the view shows it alive, it is unreachable) is missing,
    named, and its groups are left out; the others' are listed."""
    docs = [doc for doc in (node_client.read_cluster(v.session_dir) for v in views) if doc]
    entries, own_ip, why = nodes_to_ask([(doc.get("local"), cluster_view.nodes_of(doc))
                                         for doc in docs])
    far = FarGroups(missing=[why] if why else [])
    if not entries:
        return far
    wait_s = min(float(timeout or DEFAULT_TIMEOUT), config.state_node_timeout_s())

    def ask(entry) -> dict:
        with _link_to(entry, own_ip, wait_s) as client:
            return client.group_listing(wait_s)

    answers, missing = ask_all.ask_all({e.node_id: e for e in entries}, ask, wait_s,
                                       "miniray-list-groups")
    for entry in entries:
        doc = answers.get(entry.node_id)
        if doc is None:
            far.missing.append(f"node {entry.node_id} at {entry.address}: "
                               f"{missing.get(entry.node_id)}")
            continue
        far.reserved.append(doc["reserved"])
        far.pending.extend(doc["pending"])
        far.missing.extend(f"node {entry.node_id}: {text}" for text in doc["missing"])
    return far


def _node_row(view: SessionView) -> dict | None:
    record = view.record
    driver = view.drivers[0]["driver"] if view.drivers else None
    node_id = getattr(record, "node_id", None) or (driver or {}).get("node_id")
    if not node_id:
        return None
    started = getattr(record, "started_at", None) or (driver or {}).get("started_at")
    try:
        state = Ledger(os.path.join(view.session_dir, "ledger.json")).snapshot()
        totals = {name: from_units(units) for name, units in state.totals.items()}
    except (OSError, ValueError):
        totals = {}
    ip, is_head = "127.0.0.1", True
    cluster = node_client.read_cluster(view.session_dir)
    own = cluster_view.nodes_of(cluster).get(node_id)
    if own is not None:  # a node of a cluster: its address there, and whether it leads
        ip, is_head = own.ip, own.is_head
    return {
        "node_id": node_id, "node_ip": ip, "is_head_node": is_head, "state": "ALIVE",
        "state_message": None, "node_name": ip, "resources_total": totals,
        "labels": {"ray.io/node-id": node_id},
        "start_time_ms": int(started * 1000) if started else None, "end_time_ms": None,
        # Not Ray's: how to reach it, and where it lives.
        "address": getattr(record, "address", None) or "(embedded in its driver)",
        "session_dir": view.session_dir,
    }


def _node_rows(views: list[SessionView]) -> list[dict]:
    """Each session's node, then every other node of their clusters (alive, then dead),
    each once: a node's own session describes it first, a head's view is preferred over a
    member's copy."""
    out = [row for row in map(_node_row, views) if row is not None]
    seen = {row["node_id"] for row in out}
    docs = [doc for doc in (node_client.read_cluster(v.session_dir) for v in views) if doc]
    docs.sort(key=lambda doc: not doc.get("is_head"))
    others = []
    for doc in docs:
        for node_id, entry in cluster_view.nodes_of(doc).items():
            if node_id not in seen:
                seen.add(node_id)
                others.append(cluster_view.state_row(entry, doc))
    return out + sorted(others, key=lambda row: (row["state"] != "ALIVE",
                                                 not row["is_head_node"]))


def _job_row(driver: dict) -> dict:
    return {
        "job_id": driver["job_id"], "submission_id": None, "entrypoint": driver["entrypoint"],
        "type": "DRIVER", "status": "RUNNING", "message": None, "error_type": None,
        "driver_info": {"id": driver["worker_id"], "node_ip_address": "127.0.0.1",
                        "pid": str(driver["pid"])},
        "start_time": int(driver["started_at"] * 1000), "end_time": None, "metadata": {},
        "runtime_env": {}, "driver_exit_code": None,
    }


def rows(resource: str, views: list[SessionView], far: FarGroups | None = None
         ) -> list[dict]:
    """Every row of ``resource`` in ``views``, merged (full rows, before filtering);
    ``far``: the groups of the cluster's other nodes (``_far_groups``), for placement
    groups."""
    if resource not in state_rows.SCHEMAS:
        raise ValueError(f"Unknown resource {resource!r}; one of "
                         f"{', '.join(state_rows.RESOURCES)}.")
    out: list[dict] = []
    if resource == "nodes":
        return _node_rows(views)
    if resource == "placement_groups":  # reserved groups live in each session's ledger
        far = far or FarGroups()
        return group_rows([_ledger_groups(view) for view in views] + far.reserved,
                          [row for view in views for doc in view.drivers
                           for row in doc.get("placement_groups", ())] + far.pending)
    for view in views:
        for doc in view.drivers:
            driver = doc["driver"]
            if resource == "jobs":
                if not driver.get("actor_service"):
                    out.append(_job_row(driver))
            else:
                out.extend(doc[resource])
    if resource == "actors":  # a driver's proxy of a service actor: the service's row wins
        owned = {r["actor_id"] for r in out if not r.get("owned_by_actor_service")}
        out = [r for r in out if not (r.get("owned_by_actor_service")
                                      and r["actor_id"] in owned)]
    return out


def _missing(views: list[SessionView], raise_on_missing_output: bool,
             also: list | None = None) -> None:
    """Raise or warn (``raise_on_missing_output``) naming what did not answer: the
    drivers of ``views``, and ``also`` (other nodes, or their drivers, for placement
    groups)."""
    parts = [f"driver pid {pid} of {os.path.basename(v.session_dir)}: {why}"
             for v in views for pid, why in v.missing] + list(also or ())
    if not parts:
        return
    text = "; ".join(parts)
    if raise_on_missing_output:
        raise RayStateApiException(
            f"Failed to retrieve all data: {text}. Pass raise_on_missing_output=False to get "
            "the partial data.")
    warnings.warn(f"Some data is missing from the output: {text}", stacklevel=3)


def _cluster_part(resource: str, views: list[SessionView], timeout: float
                  ) -> FarGroups | None:
    """What ``resource``'s rows need from other hosts: the other nodes' placement groups
    (``_far_groups``), or None."""
    if resource != "placement_groups":
        return None
    return _far_groups(views, timeout)


def list_resource(resource: str, address: str | None = None, filters=None,
                  limit: int = DEFAULT_LIMIT, timeout: float = DEFAULT_TIMEOUT,
                  detail: bool = False, raise_on_missing_output: bool = True) -> list:
    """``ray.util.state.list_<resource>``: typed rows, filtered, at most ``limit``."""
    checked = state_rows.check_filters(resource, filters)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 0):
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}.")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}.")
    views = gather(address, timeout or DEFAULT_TIMEOUT)
    far = _cluster_part(resource, views, timeout or DEFAULT_TIMEOUT)
    _missing(views, raise_on_missing_output, far.missing if far else None)
    found = state_rows.apply_filters(rows(resource, views, far), checked)
    if limit is not None:
        found = found[:limit]
    return state_rows.shape(resource, found, detail)


def get_resource(resource: str, ident: str, address: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> object | None:
    """``ray.util.state.get_<resource>``: the row whose id is ``ident`` (detail), or None."""
    if not isinstance(ident, str):
        ident = getattr(ident, "hex", lambda: str(ident))()
    column = state_rows.ID_COLUMN[resource]
    views = gather(address, timeout or DEFAULT_TIMEOUT)
    far = _cluster_part(resource, views, timeout or DEFAULT_TIMEOUT)
    found = [r for r in rows(resource, views, far) if str(r.get(column)) == ident]
    if not found:
        return None
    return state_rows.shape(resource, found, True)[0]


def summarize(resource: str, address: str | None = None, timeout: float = DEFAULT_TIMEOUT,
              raise_on_missing_output: bool = True) -> dict:
    """``ray.util.state.summarize_<resource>``: Ray's summary document."""
    views = gather(address, timeout or DEFAULT_TIMEOUT)
    _missing(views, raise_on_missing_output)
    found = rows(resource, views)
    return {"tasks": state_rows.summarize_tasks, "actors": state_rows.summarize_actors,
            "objects": state_rows.summarize_objects}[resource](found)


def list_logs(address: str | None = None, glob_filter: str | None = None,
              node_id: str | None = None, node_ip: str | None = None,
              timeout: float = DEFAULT_TIMEOUT) -> dict:
    """``ray.util.state.list_logs``: the workers' log files of the sessions ``address``
    names, by kind (``worker_out``, ``worker_err``), as Ray groups a node's files; of the
    node ``node_id`` / ``node_ip`` names where that is another host's (``_log_source``)."""
    sessions, entry, own_ip = _log_source(address, node_id, node_ip)
    if entry is not None:
        return _ask_node(entry, own_ip, {"what": "list", "glob": glob_filter}, timeout)
    return worker_logs.names_by_kind(sessions, glob_filter)


def get_log(address: str | None = None, filename: str | None = None,
            actor_id: str | None = None, task_id: str | None = None, pid: int | None = None,
            tail: int = 1000, suffix: str = "out", timeout: float = DEFAULT_TIMEOUT,
            node_id: str | None = None, node_ip: str | None = None) -> str:
    """``ray.util.state.get_log``'s text: the log of a worker (``pid``), of an actor's
    processes (``actor_id``), of the worker that ran a task (``task_id``: on the node it
    ran on), or a file (``filename``), its last ``tail`` lines; read on the node
    ``node_id`` / ``node_ip`` names where that is another host's. ValueError naming what
    was not found."""
    entry, own_ip, query, paths = _log_query(address, filename, actor_id, task_id, pid,
                                             tail, suffix, timeout, node_id, node_ip)
    if entry is not None:
        return _ask_node(entry, own_ip, dict(query, what="get"), timeout)
    return worker_logs.read_text(paths(), tail)


def follow_log(address: str | None = None, filename: str | None = None,
               actor_id: str | None = None, task_id: str | None = None,
               pid: int | None = None, tail: int = 1000, suffix: str = "out",
               timeout: float = DEFAULT_TIMEOUT, node_id: str | None = None,
               node_ip: str | None = None, interval: float = 0.25) -> Iterator[str]:
    """``get_log(follow=True)``: yields the log's last ``tail`` lines (as ``get_log``),
    then what is written to it later (``worker_logs.follow_step``: across its rotations
    and an actor's restarts), every ``interval`` seconds when there is some, until the
    caller stops iterating (Ray's follow too streams until then). Another host's node is
    asked over one link kept open meanwhile (``remote_drivers.py`` step 13, ``follow``);
    a node that goes away ends the iteration with RayStateApiException naming it."""
    import time  # lazy: following only

    entry, own_ip, query, paths = _log_query(address, filename, actor_id, task_id, pid,
                                             tail, suffix, timeout, node_id, node_ip)
    if entry is None:
        yield from worker_logs.follow(paths, tail, interval)
        return
    state = None
    with _node_link(entry, own_ip, timeout) as client:
        while True:
            try:
                text, state = client.logs(dict(query, what="follow", state=state))
            except Exception as error:  # noqa: BLE001 - refused, lost: named
                raise _node_error(entry, error) from None
            if text:
                yield text
            time.sleep(interval)


def _log_query(address, filename, actor_id, task_id, pid, tail, suffix, timeout, node_id,
               node_ip):
    """Where a log is read: ``(entry, own ip, query, paths)``: another host's node
    ``entry`` (None: this host's files), step 13's query for it (its ``what`` left to the
    caller), and ``paths()``: the files on this host now (its first answer found here
    already), ValueError naming what was not found. ValueError naming what is wrong with
    the arguments."""
    if suffix not in ("out", "err"):
        raise ValueError(f"suffix must be 'out' or 'err', got {suffix!r}.")
    what = None
    if task_id is not None and filename is None and actor_id is None:
        task = get_resource("tasks", task_id, address, timeout)
        if task is None or not task.get("worker_pid"):
            raise ValueError(f"task {task_id} is not known, or has not run on a worker.")
        pid = int(task["worker_pid"])
        node_id = node_id or task.get("node_id")
        what = f"task {task_id} (worker pid {pid})"
    sessions, entry, own_ip = _log_source(address, node_id, node_ip)
    query = {"filename": filename, "actor_id": actor_id,
             "pid": None if pid is None else int(pid), "suffix": suffix, "tail": tail}

    def paths() -> list[str]:
        if first:  # found below, before anything is yielded
            return first.pop()
        found, named = worker_logs.find_log(sessions, filename, actor_id, query["pid"],
                                            suffix == "err")
        if not found:
            raise ValueError(f"no log of {what or named} in the live sessions: it printed "
                             "nothing, its session ended, or MINIRAY_WORKER_LOG_BYTES=0.")
        return found

    first: list = []
    if entry is None:  # the arguments checked and the log found now, once
        first.append(paths())
    return entry, own_ip, query, paths


def _log_source(address: str | None, node_id: str | None, node_ip: str | None):
    """Where a logs call reads: ``(sessions, None, _)`` to read files on this host (no node
    named, a node of these sessions, or one no view here knows: as before, every session),
    or ``(_, entry, own ip)``: another host's node, alive in a cluster view of these
    sessions, asked over its port (``remote_drivers.py`` step 13)."""
    sessions = session_dirs(address)
    if node_id is None and node_ip is None:
        return sessions, None, None
    docs = [(path, node_client.read_cluster(path)) for path in sessions]

    def named(entry) -> bool:
        return ((node_id is None or entry.node_id == node_id)
                and (node_ip is None or entry.ip == node_ip))

    own_ip = None
    for path, doc in docs:
        own = cluster_view.nodes_of(doc).get((doc or {}).get("local"))
        if own is not None:
            own_ip = own_ip or own.ip
            if named(own):
                return [path], None, own.ip
    for _path, doc in docs:
        for entry in cluster_view.nodes_of(doc).values():
            if entry.alive and named(entry):
                return sessions, entry, own_ip
    return sessions, None, None


def _ask_node(entry, own_ip: str | None, query: dict, timeout: float):
    """Step 13 of ``remote_drivers.py`` on a short driver link to ``entry``'s node."""
    with _node_link(entry, own_ip, timeout) as client:
        try:
            return client.logs(query)
        except Exception as error:  # noqa: BLE001 - refused, lost: named
            raise _node_error(entry, error) from None


def _node_link(entry, own_ip: str | None, timeout: float):
    """A driver link to ``entry``'s node for step 13 (``_link_to``), to use in a
    ``with``; RayStateApiException naming the node when it cannot be made."""
    try:
        return _link_to(entry, own_ip, timeout)
    except Exception as error:  # noqa: BLE001 - unreachable, refused: named
        raise _node_error(entry, error) from None


def _link_to(entry, own_ip: str | None, timeout: float):
    """A driver link to ``entry``'s node for step 13 or 16 (the cluster token, TLS where
    it is on, from this host's node address), to use in a ``with``; the error when it
    cannot be made."""
    from miniray._private.host import auth_token  # lazy: other hosts' nodes only
    from miniray._private.transport import peer_handshake as ph  # lazy: as above
    from miniray._private.transport.remote_node import RemoteNodeClient  # lazy: as above

    contexts = ph.tls_contexts()
    return RemoteNodeClient((entry.ip, entry.port), auth_token.load_token(),
                            timeout=min(float(timeout or DEFAULT_TIMEOUT), 60.0),
                            ssl_context=contexts[0] if contexts else None,
                            source_address=(own_ip, 0) if own_ip else None)


def _node_error(entry, error: Exception) -> Exception:
    """A step-13 failure as the state API raises it: the node's refusal (nothing found, a
    malformed query) as ValueError, anything else as RayStateApiException naming it."""
    from miniray._private.transport.remote_node import RemoteLeaseError  # lazy: as above

    if isinstance(error, RemoteLeaseError):
        return ValueError(str(error))
    return RayStateApiException(f"could not read the logs of node {entry.node_id} at "
                                f"{entry.address}: {error}")
