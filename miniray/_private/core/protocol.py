"""The message vocabulary of every miniray channel: one numbered section per wire.

Owns: the integer tags, their names, the tuple layout of every message, and
``PROTOCOL_VERSION`` (what a node and its drivers must agree on). Does not own: framing (8-byte
length + pickle on the data, control and actor-service sockets, ``transport/framing.py``; one
pickled tuple per SOCK_SEQPACKET datagram on the fork-server and node sockets,
``transport/spawn.py``), the order of messages (numbered steps in ARCHITECTURE.md, "Wire
protocol"), or what a message makes happen.
Called by: owner/ (``owner.py``, ``actor_link.py``), worker/ (``worker_main.py``,
``worker_api.py``, ``forkserver.py``), transport/ (``spawn.py``, ``node_client.py``), node/
(``node.py``, ``actor_service.py``).

Every message is a tuple whose first item is its tag; a tag is unique within its channel
(``CHANNELS`` lists each channel's tags by name; ``tests/unit/test_protocol.py`` holds it).
Tags are ints, never strings, and so is the ``method`` of a worker's ``CALL`` (section 1a).

1. Driver ⇄ worker, on the worker's data socket (driver speaks first)::

    driver → worker                               worker → driver
    (HELLO, info)                                 (RESULT, task_id, results, app_retryable,
                                                          contained, times)
    (FUNC, fn_id, fn_bytes)                       (SUBMIT, spec, caller_task_id) nested task
    (TASK, task_id, fn_id, name, args_blob,       (PUT, object_id, kind, data, contained)
           dep_values, return_ids, extra)         (GET, req_id, ids, timeout, task_id)
    (REPLY, req_id, payload)                      (WAIT, req_id, ids, num_returns, timeout,
                                                         task_id)
    (UNMAP, path)                                 (CALL, req_id, method, args)
    (EXIT,)                                       (BORROW, added, dropped, escaped,
                                                          handles)
    (SERIALIZERS,) re-read serializers.pkl
    (NAMED, name)  the driver prefixes what
                   follows as ``name``'s output
                                                  (YIELD, task_id, index, kind, data,
                                                          contained)  a streamed value
                                                  (GIVE_BACK, task_ids)  tasks not started
                                                  (READY, pid)  HELLO applied, waiting for work

   Actors (a worker that received ACTOR_INIT hosts one actor for the rest of its life)::

    (ACTOR_INIT, actor_id, fn_id, class_name,     (ACTOR_READY, actor_id, ok, error, times,
                 args_blob, dep_values, ctx)                   repr_name)  repr_name "": none
                                                  (ACTOR_EXITING, why)  an intended exit
    (ACTOR_CALL, task_id, method, args_blob,      (ACTOR_SUBMIT, actor_id, call) nested call
                 dep_values, return_ids,          (ACTOR_CREATE, spec)   reserved: nested
                 num_returns, call_name,          creation is (CALL, req, CALL_CREATE_ACTOR, ...)
                 concurrency_group,
                 retry_exceptions)

   ``results`` is a list of ``(kind, data)``, kind being OK or ERR and data pickled bytes;
   ``times`` the worker's ``time_ns()`` when the call started, its arguments were loaded, it
   returned and the RESULT was made, packed as ``timeline_events.TIMES`` (None for a call
   that never ran): the timeline's span.
   ACTOR_INIT's ``ctx`` is ``(resources, gpu_ids, gpu_ids_are_ints, max_concurrency,
   is_async, name, namespace, handle_state, restarts, concurrency_groups)``; an ACTOR_CALL's
   ``concurrency_group`` is the name of the group it runs in, None for the default group;
   its ``retry_exceptions`` (False, True or pickled exception classes) says which exceptions
   it raises make its RESULT ``retryable`` (the owner runs it again while
   ``max_task_retries`` allows).
   A streaming generator call (``num_returns`` is ``task_spec.STREAMING``) sends one YIELD
   per value as it is yielded (``index`` from 0; an exception raised by the generator is
   the last value, kind ERR), then its RESULT: the completion object, None.
   The driver ends a worker by closing the socket (EOF); EXIT also ends its loop.
   A GET or WAIT marks the worker blocked (its CPU goes back to the ledger) until its REPLY.
   Its ``task_id`` is the call that waits (None where a cancel must not interrupt it: outside
   a call, in an async actor); once that call is cancelled, the REPLY of each of its waits,
   pending or later, is ``CANCELLED`` (the worker raises KeyboardInterrupt there, as Ray does).
   The driver may send a worker up to a key's depth of TASKs ahead (``core/pipelining.py``);
   they run in order. Before its GET, WAIT or ``CALL_STREAM_NEXT``, a worker sends
   ``GIVE_BACK`` with every TASK it received but did not start, and one for each TASK that
   arrives while it is blocked; the driver requeues them (no retry is used). A TASK cancelled
   before it started is answered by its RESULT (the cancel error) without running.

1a. The ``method`` of a worker's ``(CALL, req_id, method, args)``: what the public API asks of
   the driver from inside a task or actor (answered by ``(REPLY, req_id, (ok, value))``;
   dispatched by ``owner/requests.py``)::

    CALL_CREATE_ACTOR (spec,)                      CALL_KILL_ACTOR (actor_id, no_restart)
    CALL_GET_ACTOR (name, namespace)               CALL_LIST_NAMED_ACTORS (all, namespace)
    CALL_CANCEL (object_id, force, recursive)      CALL_CLUSTER_RESOURCES ()
    CALL_AVAILABLE_RESOURCES ()                    CALL_NODES ()
    CALL_STREAM_NEXT (task_id, index, timeout)     value ``index`` of a streaming call:
                                                   answered when it or the call's end is
                                                   there (the worker is blocked meanwhile)
    CALL_PLACEMENT_GROUP (op, *args)               a placement group call ("create",
                                                   "ready", "wait", "remove", "lookup",
                                                   "table", "bundles"), run by the driver
                                                   after its lock (ledger transactions)

2. Driver → worker, on the worker's control socket: ``(CANCEL, task_id)``; ``(RECALL,)``:
   give back (``GIVE_BACK`` on the data socket) the tasks received but not started, because
   another worker of their key is idle; ``(COLLECT,)``: run ``gc.collect()`` and report the
   refs it dropped (a BORROW), because the store is filling up (``owner/store_gc.py``).

3. Driver ⇄ fork server::

    (SPAWN, req_id) + 4 fds [data, control, stdout, stderr]   →   (SPAWNED, req_id, pid)
    (KILL, pid, signal)                                        →   (EXITED, pid, wait_status)
    (SHUTDOWN, grace_s)                                        →   (BYE,) then exit

4. Driver ⇄ node (``node/node.py``; the driver's half is ``transport/node_client.py``). The
   node relays the fork server's SPAWN/SPAWNED/KILL/EXITED/BYE with the same tags and
   layouts, so the owner reads a node exactly as it reads its own fork server::

    (NODE_HELLO, driver_pid, PROTOCOL_VERSION)  →  (NODE_WELCOME, info)
                                                   or (NODE_REFUSED, text) then close
    (SPAWN, req_id) + 4 fds                     →  (SPAWNED, req_id, pid)
    (KILL, pid, signal)                            (EXITED, pid, wait_status) any time
    (NODE_STORE, session_tag)                      (NODE_STOPPING, reason)  the node stops
    (NODE_GOODBYE, grace_s)                     →  (BYE,) then close

5. Driver ⇄ the node's actor service (``owner/actor_link.py`` ⇄ ``node/actor_service.py``),
   two framed stream sockets, each opened with ``(SVC_HELLO, role, pid, token, store_tag,
   shm_dir, sys_path, cwd, (node_id, node_ip))``, role ``"control"`` or ``"calls"`` (the
   last: the driver's node and IP, to which the service grants its kept results)::

    control socket, one request at a time      reply: (SVC_OK, value) or (SVC_ERR, error)
    (SVC_HELLO, "control", ...)                 →  (SVC_OK, None)
    (SVC_CREATE, spec, exported)                →  (SVC_OK, (actor_id, state, warning))
    (SVC_LOOKUP, name, namespace)               →  (SVC_OK, (actor_id, state))
    (SVC_LIST, namespace, all_namespaces)       →  (SVC_OK, [names])
    (SVC_ALIVE, [actor_id])                     →  (SVC_OK, [those not dead])
    (SVC_LENT_MOVED, actor_id, node_entry,      →  (SVC_OK, bool)  the room lent to this
                     gpu_ids, here)                actor is now in its bundle's new place
                                                   on that node (here: the lending driver's
                                                   own, whose ledger provides it): it
                                                   restarts there; False: it will not
                                                   (unknown, dead, no restart left)
    (SVC_KILL, actor_id, no_restart, group)     →  (SVC_OK, None)  group: "" (``ray.kill``),
                                                   or the hex of the removed placement
                                                   group it is killed for (it ends as an
                                                   actor of a removed group)
    (SVC_PG_CREATE, hex, bundles, strategy,     →  (SVC_OK, "CREATED" | "PENDING")  a
                    name)                          detached group in a cluster, held here;
                                                   asked again for the same hex (a broken
                                                   link): its state; "REMOVED" too when
                                                   removed while it was being created
    (SVC_PG_REMOVE, hex)                        →  (SVC_OK, held here: bool)
    (SVC_PG_LEND, hex, index, request)          →  (SVC_OK, (loan_id, index, node_entry,
                                                   gpu_ids) | None (no room now) | "here")
    (SVC_PG_RETURN, loan_id)                    →  (SVC_OK, None)
    (SVC_PG_STATE, hex)                         →  (SVC_OK, "CREATED" | "PENDING" | None
                                                   (not held here: never, or removed))
    (SVC_PG_FIND, name)                         →  (SVC_OK, (hex, bundles, strategy) of a
                                                   pending group of that name held here
                                                   | None)
    (SVC_PG_TABLE,)                             →  (SVC_OK, {hex: ledger record} of the
                                                   detached groups held and reserved here:
                                                   a driver on another host reads them
                                                   instead of its own node's ledger)

    calls socket, never waited on               service → driver
    (SVC_HELLO, "calls", ...)                   (SVC_RESULT, task_id, results, nested)
                                                (SVC_YIELD, task_id, index, kind, data,
                                                           nested)  a streamed value
    (SVC_CALL, actor_id, spec, exported)        (SVC_OUTPUT, "stdout"|"stderr", text)
    (SVC_OBJECT, object_id, kind, payload)      (SVC_IMPORTED, object_id)  after SVC_OBJECT
    (SVC_CANCEL, task_id, force, recursive)
    (SVC_HOLD, actor_id) / (SVC_RELEASE, actor_id)
    (SVC_FREE, [object_id])                     a result kept on its node, freed there

   A large result of an actor on another node stays there (``actor_service.py``, Results):
   its item in SVC_RESULT is ``(kind, ("kept", object_id, node_id, size, path, [ip, port],
   tag, grant))``, which the driver pulls with that grant and frees with SVC_FREE.

   The service is started by the node with the node's own code, so the version a driver's
   NODE_HELLO passed covers this channel too.
"""

from __future__ import annotations

import functools
import os
import sys

from miniray import _version

# A node refuses a driver whose NODE_HELLO carries another version (NODE_REFUSED says so).
# 2: the node and actor-service channels moved from string tags to the ints below.
# 3: ACTOR_INIT carries the actor's restart count, ACTOR_EXITING why it leaves, and the node's
#    hello its miniray and Python versions.
# 4: GET, WAIT and SUBMIT name the calling task (a node's workers speak to its drivers'
#    owners); SVC_CANCEL says whether it is recursive.
# 5: streaming generators (YIELD, CALL_STREAM_NEXT, SVC_YIELD).
# 6: pipelined tasks: a worker holds several TASKs and hands back (GIVE_BACK) those it did
#    not start when it blocks or is asked to (RECALL); placement groups
#    (CALL_PLACEMENT_GROUP, a TASK's group); concurrency groups (ACTOR_INIT's groups,
#    ACTOR_CALL's group).
# 7: RESULT and ACTOR_READY carry the worker's times (started, arguments loaded, returned,
#    sent) for ray.timeline().
# 8: the actor service holds detached placement groups of a cluster (SVC_PG_CREATE,
#    SVC_PG_REMOVE) and lends their room to drivers' tasks (SVC_PG_LEND, SVC_PG_RETURN).
# 9: an actor service's call results kept on their node (SVC_RESULT's "kept" items,
#    SVC_FREE; SVC_HELLO carries the driver's node id and IP); a driver asks the service
#    whether it holds a detached group (SVC_PG_STATE).
# 10: a driver finds a pending detached group the service holds by name (SVC_PG_FIND); a
#     pull connection past its link's limit is answered ("error", req, "busy", text).
# 11: READY carries the worker's pid (the owner may read it before the fork server's SPAWNED).
# 12: a driver asks the actor service which of the actors it lent room are alive (SVC_ALIVE).
# 13: a driver on another host than the service reads the detached groups it holds
#     (SVC_PG_TABLE).
# 14: SVC_KILL names the removed placement group an actor is killed for.
# 15: a driver tells the actor service where the room it lent an actor went when the
#     actor's bundle was placed again on another node (SVC_LENT_MOVED).
PROTOCOL_VERSION = 15
V1_NODE_HELLO = "HELLO"  # version 1's first message, ("HELLO", pid): recognised to refuse it

# 1. data socket, driver -> worker
HELLO = 0
FUNC = 1
TASK = 2
REPLY = 3
EXIT = 4
ACTOR_INIT = 5
ACTOR_CALL = 6
UNMAP = 7   # (UNMAP, path): the object is freed; drop a cached mapping of that segment
SERIALIZERS = 8  # (SERIALIZERS,): the driver's custom serializers changed; re-read the file
# (NAMED, name): sent before a TASK to an idle worker whose output the driver now prefixes
# with that task's name itself: the worker writes no marker line for it (owner/output.py).
# Only to a worker of this host, forked from the driver's own code: no version change.
NAMED = 9

# 1. data socket, worker -> driver
RESULT = 10
SUBMIT = 11
PUT = 12
GET = 13
WAIT = 14
CALL = 15
ACTOR_READY = 16
ACTOR_EXITING = 17
ACTOR_CREATE = 18
ACTOR_SUBMIT = 19
BORROW = 21  # (BORROW, added_ids, dropped_ids, escaped_ids, handles): refs this worker holds
# now, and its actor handle events ((actor_id, +1 held / -1 none left / 0 pickled), in order)
YIELD = 22   # (YIELD, task_id, index, kind, data, contained): one value of a streaming call
GIVE_BACK = 23  # (GIVE_BACK, task_ids): tasks received but not started, for the owner to requeue
READY = 24  # (READY, pid): the worker applied HELLO and waits for work (init() waits for the first)

# 1a. the method of a worker's CALL
CALL_CREATE_ACTOR = 80
CALL_KILL_ACTOR = 81
CALL_GET_ACTOR = 82
CALL_LIST_NAMED_ACTORS = 83
CALL_CANCEL = 84
CALL_CLUSTER_RESOURCES = 85
CALL_AVAILABLE_RESOURCES = 86
CALL_NODES = 87
CALL_STREAM_NEXT = 88
CALL_PLACEMENT_GROUP = 89

# 5, continued: the actor service's detached placement groups (``owner/placement_groups.py``)
SVC_PG_CREATE = 90
SVC_PG_REMOVE = 91
SVC_PG_LEND = 92
SVC_PG_RETURN = 93
SVC_PG_STATE = 94
SVC_PG_FIND = 95
SVC_PG_TABLE = 96

# 2. control socket
CANCEL = 20
RECALL = 25  # (RECALL,): give back the tasks not started (another worker is idle)
COLLECT = 26  # (COLLECT,): run Python's garbage collector (the store is filling up)

# 3. fork server (and relayed by a node: section 4)
SPAWN = 30
SPAWNED = 31
KILL = 32
EXITED = 33
SHUTDOWN = 34
BYE = 35

# 4. node socket (plus SPAWN, SPAWNED, KILL, EXITED, BYE of section 3)
NODE_HELLO = 40
NODE_WELCOME = 41
NODE_REFUSED = 42
NODE_STORE = 43
NODE_GOODBYE = 44
NODE_STOPPING = 45

# 5. actor-service sockets, control and calls
SVC_HELLO = 60
SVC_OK = 61
SVC_ERR = 62
SVC_CREATE = 63
SVC_LOOKUP = 64
SVC_LIST = 65
SVC_KILL = 66
SVC_CALL = 67
SVC_OBJECT = 68
SVC_CANCEL = 69
SVC_HOLD = 70
SVC_RELEASE = 71
SVC_RESULT = 72
SVC_OUTPUT = 73
SVC_IMPORTED = 74
SVC_YIELD = 75
SVC_FREE = 76
SVC_ALIVE = 77  # (SVC_ALIVE, [actor id]) -> those of them not dead
SVC_LENT_MOVED = 78

# result kinds (not tags: the ``kind`` inside RESULT, PUT and SVC_RESULT), and the REPLY of
# a GET that timed out (TIMEOUT) or of a GET or WAIT whose call was cancelled (CANCELLED)
OK = 0
ERR = 1
TIMEOUT = 2
CANCELLED = 3

# Each channel's tags by name, in section order: what a reader of that channel may receive
# from either side. A name may serve two channels (the node relays the fork server's).
CHANNELS: dict[str, tuple[str, ...]] = {
    "data": ("HELLO", "FUNC", "TASK", "REPLY", "EXIT", "ACTOR_INIT", "ACTOR_CALL", "UNMAP",
             "SERIALIZERS", "NAMED",
             "RESULT", "SUBMIT", "PUT", "GET", "WAIT", "CALL", "ACTOR_READY", "ACTOR_EXITING",
             "ACTOR_CREATE", "ACTOR_SUBMIT", "BORROW", "YIELD", "GIVE_BACK", "READY"),
    "call": ("CALL_CREATE_ACTOR", "CALL_KILL_ACTOR", "CALL_GET_ACTOR", "CALL_LIST_NAMED_ACTORS",
             "CALL_CANCEL", "CALL_CLUSTER_RESOURCES", "CALL_AVAILABLE_RESOURCES", "CALL_NODES",
             "CALL_STREAM_NEXT", "CALL_PLACEMENT_GROUP"),
    "control": ("CANCEL", "RECALL", "COLLECT"),
    "fork_server": ("SPAWN", "SPAWNED", "KILL", "EXITED", "SHUTDOWN", "BYE"),
    "node": ("NODE_HELLO", "NODE_WELCOME", "NODE_REFUSED", "SPAWN", "SPAWNED", "KILL",
             "EXITED", "NODE_STORE", "NODE_GOODBYE", "BYE", "NODE_STOPPING"),
    "actor_service": ("SVC_HELLO", "SVC_OK", "SVC_ERR", "SVC_CREATE", "SVC_LOOKUP",
                      "SVC_LIST", "SVC_KILL", "SVC_CALL", "SVC_OBJECT", "SVC_CANCEL",
                      "SVC_HOLD", "SVC_RELEASE", "SVC_RESULT", "SVC_OUTPUT", "SVC_IMPORTED",
                      "SVC_YIELD", "SVC_FREE", "SVC_ALIVE", "SVC_LENT_MOVED",
                      "SVC_PG_CREATE", "SVC_PG_REMOVE", "SVC_PG_LEND", "SVC_PG_RETURN",
                      "SVC_PG_STATE", "SVC_PG_FIND", "SVC_PG_TABLE"),
}


def tag_name(channel: str, tag: object) -> str:
    """The name of ``tag`` on ``channel``, for logs and errors (``repr`` if it has none).

    Example:
        >>> tag_name("node", 40), tag_name("node", "HELLO")
        ('NODE_HELLO', "'HELLO'")
    """
    for name in CHANNELS[channel]:
        if globals()[name] == tag and type(tag) is int:
            return name
    return repr(tag)


# ----------------------------------------------------------------------------- versions
# What a node reports in NODE_WELCOME's info ("miniray_version", "python_version") and a
# joining driver compares with its own (``version_mismatch``): the node's fork server runs
# the driver's pickled functions, whose bytecode only another Python of the same major.minor
# reads, and only the same miniray speaks the same wire.
PYTHON_VERSION = ".".join(map(str, sys.version_info[:3]))


def local_versions() -> dict:
    """This process's versions, as a node reports them in NODE_WELCOME's info."""
    return {"miniray_version": _version.__version__, "python_version": PYTHON_VERSION}


@functools.cache
def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None if missing), without importing
    it when it is not loaded yet (numpy is heavy). Cached: every peer connection asks.

    Read from the name of its ``<name>-<version>.dist-info`` (or ``.egg-info``) folder on
    ``sys.path``, as ``importlib.metadata`` finds it, without importing ``importlib.metadata``
    (30 ms, paid by a node's first handshake, on the join's path); that module answers only
    when no such folder is found for a package that is importable."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    found = dist_version_from_path(name, sys.path, _listdir)
    if found is not None:
        return found
    import importlib.util  # lazy: only a peer's hello asks, and only when the folder is not

    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None
    import importlib.metadata  # lazy: as above

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path or ".")
    except OSError:  # a missing folder, a zip file on sys.path
        return []


def dist_version_from_path(name: str, paths, listdir) -> str | None:
    """Pure: the version in the first ``<name>-<version>.dist-info`` or ``.egg-info`` entry
    that ``listdir(path)`` lists, over ``paths`` in order; None if there is none. Names
    compare as the packaging spec normalizes them (case, ``-``/``.``/``_``)."""
    want = _normalize(name)
    for path in paths:
        for entry in listdir(path):
            stem, dot, suffix = entry.rpartition(".")
            if not dot or suffix not in ("dist-info", "egg-info"):
                continue
            dist, sep, version = stem.partition("-")
            if sep and version and _normalize(dist) == want:
                return version.split("-")[0]  # an egg-info's "1.2-py3.11" names 1.2
    return None


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def peer_versions() -> dict:
    """What a peer connection's HELLO carries (``transport/peer_channel.py``): miniray,
    Python (major.minor.micro), cloudpickle and numpy (None where not installed)."""
    return {"miniray": _version.__version__, "python": PYTHON_VERSION,
            "cloudpickle": _dist_version("cloudpickle"), "numpy": _dist_version("numpy")}


def _version_rule(local: dict, remote: dict) -> tuple[bool, list[str]]:
    """Pure, the one rule for every channel: ``(refuse, warn_keys)``. Refuse when miniray
    differs, or Python's major.minor (cloudpickle'd bytecode is only read by the same minor);
    a different Python patch level or library version (cloudpickle, numpy) only warns."""
    python_l = str(local.get("python") or "").split(".")[:2]
    python_r = str(remote.get("python") or "").split(".")[:2]
    refuse = local.get("miniray") != remote.get("miniray") or python_l != python_r
    warn = [key for key in ("python", "cloudpickle", "numpy")
            if local.get(key) != remote.get(key)]
    return refuse, warn


def _describe(versions: dict, keys) -> str:
    return ", ".join(f"{key} {versions.get(key) or 'unknown'}" for key in keys)


def version_policy(local: dict, remote: dict, *, local_name: str = "this process",
                   remote_name: str = "the peer") -> tuple[str | None, str | None]:
    """Pure: ``(refusal, warning)`` for two ``peer_versions()`` dicts (``_version_rule``);
    each text names both sides' values. ``(None, None)`` when they match.

    Example:
        >>> here = peer_versions()
        >>> version_policy(here, dict(here))
        (None, None)
        >>> version_policy(here, dict(here, miniray="0.0.1"))[0].split(";")[0]  # doctest: +ELLIPSIS
        'Version mismatch: this process runs miniray ...'
    """
    refuse, warn = _version_rule(local, remote)
    if refuse:
        keys = ("miniray", "python")
        return (f"Version mismatch: {local_name} runs {_describe(local, keys)}; {remote_name} "
                f"runs {_describe(remote, keys)}. Every host of a cluster needs the same miniray "
                "and the same Python major.minor: install the same versions on both, then "
                "restart the node (`miniray stop`, `miniray start ...`)."), None
    if warn:
        return None, (f"Version difference (allowed): {local_name} runs "
                      f"{_describe(local, warn)}; {remote_name} runs {_describe(remote, warn)}.")
    return None, None


def version_mismatch(node_info: dict, where: str) -> tuple[str | None, str | None]:
    """``(refusal, warning)`` for a driver joining the node whose NODE_WELCOME info is
    ``node_info``: a refusal (the text of Ray's RuntimeError, both versions, what to do)
    when miniray or Python's major.minor differ; a warning when only Python's patch level
    does; ``(None, None)`` when they match (``_version_rule``, the rule peers use too). A
    node that reports no versions is older than this check, so it is another miniray.
    ``where`` names this process ("node 127.0.0.1").

    Example:
        >>> here = local_versions()
        >>> version_mismatch(dict(here), "node 127.0.0.1")
        (None, None)
        >>> refusal, _ = version_mismatch(dict(here, miniray_version="0.0.1"), "node x")
        >>> refusal.splitlines()[:2]
        ['Version mismatch: The cluster was started with:', '    miniray: 0.0.1']
    """
    here = local_versions()
    node_miniray = node_info.get("miniray_version") or "unknown (a miniray older than this one)"
    node_python = node_info.get("python_version") or "unknown"
    text = (
        "The cluster was started with:\n"
        f"    miniray: {node_miniray}\n"
        f"    Python: {node_python}\n"
        f"This process on {where} was started with:\n"
        f"    miniray: {here['miniray_version']}\n"
        f"    Python: {here['python_version']}\n"
    )
    refuse, warn = _version_rule(
        {"miniray": here["miniray_version"], "python": here["python_version"]},
        {"miniray": node_miniray, "python": node_python})
    if refuse:
        return (
            f"Version mismatch: {text}Run this driver with the Python and miniray the node "
            "was started with, or restart the node with this driver's (`miniray stop`, then "
            "`miniray start --head`).",
            None,
        )
    if warn:
        return None, f"Python patch version mismatch: {text}"
    return None, None
