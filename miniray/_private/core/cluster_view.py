"""The cluster view: which nodes are members, what they have, and which are dead.

Owns: the membership records (``NodeEntry``), applying JOIN / HEARTBEAT / LEAVE / link-EOF
to them (``ClusterView``), the failure detector (``ClusterView.expire``, with the clock
passed in: heartbeat gap and EOF grace), the snapshot the head sends to members and a node
publishes for its drivers, the rows ``ray.nodes()`` and ``ray.util.state.list_nodes()``
return for them (Ray 2.60's keys), heartbeat ages and death times in wall time, and
cluster totals and available sums. Pure: no I/O, no clock of its own, no threads.
Does not own: sockets, heartbeats' timing or the file a node publishes
(``node/peering.py``), the local node's own row in a driver (``runtime.node_info``), or
the settings (``config.heartbeat_s``, ``config.node_dead_after_s``).
Called by: ``node/peering.py`` (head: authoritative; member: a copy), the runtime
(``nodes()``, ``cluster_resources()``, ``available_resources()``), ``node_status.py`` and
``state_api.py`` (``list_nodes``).

Rules:

1. JOIN of an unknown node id adds it alive. JOIN of a known id with an incarnation at least
   the recorded one replaces the record (a reconnect, or a rejoin after it was declared dead);
   an older incarnation is refused (a stale process).
2. HEARTBEAT of an alive node refreshes ``last_heartbeat`` and ``available``; of a dead or
   unknown node it is answered "dead" (the member rejoins with a new incarnation).
3. LEAVE (``miniray stop`` on the member) marks it dead at once with an expected-termination
   reason.
4. Link EOF starts a grace (``eof_grace``): a JOIN of the same id within it keeps the node
   alive; otherwise ``expire`` declares it dead (unexpected termination).
5. No heartbeat for ``dead_after`` seconds: ``expire`` declares it dead.
6. Dead nodes stay listed (Alive False, DeathReasonMessage) until the same id rejoins; at
   most ``MAX_DEAD`` of them, the oldest deaths forgotten first.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

__all__ = [
    "DEATH_EXPECTED", "DEATH_UNEXPECTED", "EOF_GRACE_S", "ClusterView", "NodeEntry",
    "available_sum", "heartbeat_age", "is_resource_map", "node_row", "state_row", "totals_sum",
    "wall_time",
]  # fmt: skip

# Ray's NodeDeathInfo.Reason values (ray.nodes()["DeathReason"]).
DEATH_EXPECTED = 1
DEATH_UNEXPECTED = 2
EOF_GRACE_S = 0.5  # a closed link: dead after this long unless the node reconnects
MAX_DEAD = 100  # dead nodes kept listed (the oldest deaths are forgotten first)


@dataclass
class NodeEntry:
    """One node as the cluster sees it (``totals`` include ``node:<ip>``)."""

    node_id: str
    ip: str
    port: int
    is_head: bool = False
    hostname: str = ""
    totals: dict = field(default_factory=dict)
    available: dict = field(default_factory=dict)  # from the last heartbeat
    gpu_ids: list = field(default_factory=list)
    accelerator_type: str | None = None
    labels: dict = field(default_factory=dict)
    alive: bool = True
    death_reason: int = 0
    death_message: str = ""
    incarnation: int = 0
    start_time: float = 0.0
    last_heartbeat: float = 0.0  # the view's clock (the head's monotonic time)
    eof_at: float | None = None  # the link closed at; None while linked
    died_seq: int = 0  # the view's version when it died (which dead nodes are oldest)
    died_at: float = 0.0  # the view's clock when it died (0: alive, or not known)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> NodeEntry:
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def problem(self) -> str | None:
        """What is wrong with a record a peer sent (None: it is well-formed)."""
        checks = (
            (self.node_id, str), (self.ip, str), (self.port, int), (self.hostname, str),
            (self.is_head, bool), (self.gpu_ids, list), (self.labels, dict),
            (self.incarnation, int), (self.start_time, (int, float)),
        )
        for value, kind in checks:
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"a field is {type(value).__name__}, not {kind}"
        if not self.node_id or not 0 <= self.port < 65536:
            return "no node id, or a port out of range"
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()):
            return "labels must map str to str"
        for name in ("totals", "available"):
            if not is_resource_map(getattr(self, name)):
                return f"{name} must map resource names to numbers >= 0"
        return None


def is_resource_map(value) -> bool:
    """A ``{name: number >= 0}`` dict (what heartbeats and records carry)."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
        and v >= 0 for k, v in value.items())


class ClusterView:
    """The nodes of one cluster, keyed by node id. Methods return whether anything a
    member or a driver would see changed (the caller then publishes a snapshot)."""

    def __init__(self, entries: list[NodeEntry] | None = None, version: int = 0):
        self.nodes: dict[str, NodeEntry] = {e.node_id: e for e in entries or ()}
        self.version = version

    def _changed(self) -> bool:
        self.version += 1
        return True

    # -- rule 1 --------------------------------------------------------------------------
    def join(self, entry: NodeEntry, now: float) -> str | None:
        """Add or replace ``entry`` (alive, heartbeat now); a refusal text for a stale
        incarnation, else None."""
        old = self.nodes.get(entry.node_id)
        if old is not None and entry.incarnation < old.incarnation:
            return (f"node {entry.node_id[:12]} joined with incarnation {entry.incarnation}, "
                    f"older than its incarnation {old.incarnation} already known: a stale "
                    "process of that node; stop it (`miniray stop` on its host).")
        entry = copy.deepcopy(entry)
        entry.alive, entry.death_reason, entry.death_message = True, 0, ""
        entry.died_at = 0.0
        entry.last_heartbeat, entry.eof_at = now, None
        if not entry.available:
            entry.available = dict(entry.totals)
        self.nodes[entry.node_id] = entry
        self._changed()
        return None

    # -- rule 2 --------------------------------------------------------------------------
    def heartbeat(self, node_id: str, available: dict | None, now: float,
                  incarnation: int | None = None) -> bool:
        """Record a heartbeat; False if the node is not (or no longer) an alive member of
        this incarnation: it must rejoin."""
        entry = self.nodes.get(node_id)
        if entry is None or not entry.alive or (
                incarnation is not None and incarnation != entry.incarnation):
            return False
        entry.last_heartbeat = now
        entry.eof_at = None
        if available is not None and not is_resource_map(available):
            available = None  # a malformed report: keep the last good one
        if available is not None and available != entry.available:
            entry.available = dict(available)
            self._changed()
        return True

    # -- rules 3 and 4 -------------------------------------------------------------------
    def leave(self, node_id: str, reason: str, now: float = 0.0) -> bool:
        entry = self.nodes.get(node_id)
        if entry is None or not entry.alive:
            return False
        self._kill(entry, DEATH_EXPECTED, reason, now)
        return True

    def link_lost(self, node_id: str, now: float) -> bool:
        """The node's link closed (EOF): start its grace. Returns False (nothing visible
        changes until ``expire``)."""
        entry = self.nodes.get(node_id)
        if entry is not None and entry.alive and entry.eof_at is None:
            entry.eof_at = now
        return False

    # -- rule 5 --------------------------------------------------------------------------
    def expire(self, now: float, dead_after: float, eof_grace: float = EOF_GRACE_S,
               exempt: str | None = None) -> list[str]:
        """Declare dead every alive node past its heartbeat deadline or its EOF grace
        (``exempt``: the head itself, which sends no heartbeats); their ids."""
        dead = []
        grace = min(eof_grace, dead_after)
        for entry in self.nodes.values():
            if not entry.alive or entry.node_id == exempt:
                continue
            if entry.eof_at is not None and now - entry.eof_at >= grace:
                self._kill(entry, DEATH_UNEXPECTED,
                           "The node's connection to the head closed (its process died or "
                           "was killed).", now)
                dead.append(entry.node_id)
            elif now - entry.last_heartbeat >= dead_after:
                self._kill(entry, DEATH_UNEXPECTED,
                           f"No heartbeat from the node for {now - entry.last_heartbeat:.1f} "
                           f"s (limit {dead_after:g} s, MINIRAY_NODE_DEAD_AFTER_S): it hung "
                           "or the network to it failed.", now)
                dead.append(entry.node_id)
        return dead

    def next_deadline(self, dead_after: float, eof_grace: float = EOF_GRACE_S,
                      exempt: str | None = None) -> float | None:
        """The earliest time ``expire`` could declare a node dead (None: no candidate)."""
        grace = min(eof_grace, dead_after)
        times = []
        for entry in self.nodes.values():
            if entry.alive and entry.node_id != exempt:
                times.append(entry.last_heartbeat + dead_after)
                if entry.eof_at is not None:
                    times.append(entry.eof_at + grace)
        return min(times) if times else None

    def _kill(self, entry: NodeEntry, reason: int, message: str, now: float = 0.0) -> None:
        entry.alive, entry.death_reason, entry.death_message = False, reason, message
        entry.died_at = now
        entry.available = {}
        entry.eof_at = None
        self._changed()
        entry.died_seq = self.version
        dead = sorted(self.dead(), key=lambda e: e.died_seq)
        for old in dead[:max(0, len(dead) - MAX_DEAD)]:  # rule 6's bound
            del self.nodes[old.node_id]

    # -- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """A plain-data copy (pickle/JSON safe) for members and for the published file."""
        return {"version": self.version,
                "nodes": [e.to_json() for e in sorted(self.nodes.values(),
                                                      key=lambda e: (not e.is_head,
                                                                     e.start_time))]}

    @classmethod
    def from_snapshot(cls, doc: dict) -> ClusterView:
        """The view a snapshot describes; ValueError when it is not one."""
        if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
            raise ValueError("not a cluster view snapshot")
        return cls([NodeEntry.from_json(d) for d in doc["nodes"] if isinstance(d, dict)],
                   int(doc.get("version", 0)))

    def alive(self) -> list[NodeEntry]:
        return [e for e in self.nodes.values() if e.alive]

    def dead(self) -> list[NodeEntry]:
        return [e for e in self.nodes.values() if not e.alive]


# -------------------------------------------------------------------------------- rows
def nodes_of(doc: dict | None) -> dict[str, NodeEntry]:
    """The nodes, by id, of a published cluster file (``node_client.read_cluster``): none
    when there is no file or it holds no view.

    Example:
        >>> nodes_of(None), nodes_of({"view": "junk"})
        ({}, {})
    """
    if doc is None:
        return {}
    try:
        return dict(ClusterView.from_snapshot(doc["view"]).nodes)
    except (ValueError, TypeError, KeyError):
        return {}


def node_row(entry: NodeEntry) -> dict:
    """``entry`` as one ``ray.nodes()`` row (the keys and shapes ``runtime.node_info``
    returns for the local node)."""
    return {
        "NodeID": entry.node_id,
        "Alive": entry.alive,
        "alive": entry.alive,
        "NodeManagerAddress": entry.ip,
        "NodeManagerHostname": entry.hostname or entry.ip,
        "NodeManagerPort": entry.port,
        "NodeName": entry.ip,
        "ObjectManagerPort": 0,
        "ObjectStoreSocketName": "",
        "RayletSocketName": "",
        "Resources": dict(entry.totals) if entry.alive else {},
        "Labels": {"ray.io/node-id": entry.node_id, **entry.labels},
        "MetricsExportPort": 0,
        "MetricsAgentPort": 0,
        "DashboardAgentListenPort": 0,
        "RuntimeEnvAgentPort": 0,
        "DeathReason": entry.death_reason,
        "DeathReasonMessage": entry.death_message,
    }


def wall_time(doc: dict, clock_time: float) -> float | None:
    """The wall-clock time of ``clock_time`` (the view's clock) in a published view ``doc``
    (``node_client.read_cluster``); None when the doc has no clock (a member's copy)."""
    clock, written = doc.get("clock"), doc.get("updated_at")
    if not isinstance(clock, (int, float)) or not isinstance(written, (int, float)):
        return None
    return written - (clock - clock_time)


def heartbeat_age(doc: dict, entry: NodeEntry, now: float) -> float | None:
    """Seconds since the head last heard from ``entry`` at wall time ``now``; None when
    ``doc`` has no clock, or for the head itself (it sends no heartbeats) or a dead node."""
    if entry.is_head or not entry.alive:
        return None
    at = wall_time(doc, entry.last_heartbeat)
    return None if at is None else max(0.0, now - at)


def state_row(entry: NodeEntry, doc: dict | None = None) -> dict:
    """``entry`` as one ``ray.util.state`` NodeState row (the local node's row in
    ``state_api`` has the same keys); ``doc``, the published view it came from, dates a
    death (``end_time_ms``: None when it has no clock)."""
    end = wall_time(doc or {}, entry.died_at) if not entry.alive and entry.died_at else None
    return {
        "node_id": entry.node_id, "node_ip": entry.ip, "is_head_node": entry.is_head,
        "state": "ALIVE" if entry.alive else "DEAD",
        "state_message": None if entry.alive else entry.death_message,
        "node_name": entry.ip, "resources_total": dict(entry.totals),
        "labels": {"ray.io/node-id": entry.node_id, **entry.labels},
        "start_time_ms": int(entry.start_time * 1000) if entry.start_time else None,
        "end_time_ms": int(end * 1000) if end is not None else None,
        # Not Ray's: how to reach it (its TCP address), as for the local node.
        "address": entry.address,
    }


def _add(into: dict, values: dict) -> None:
    for key, value in values.items():
        into[key] = into.get(key, 0.0) + float(value)


def totals_sum(entries) -> dict:
    """The sum of the totals of ``entries`` (``cluster_resources()`` over alive nodes)."""
    out: dict = {}
    for entry in entries:
        _add(out, entry.totals)
    return out


def available_sum(entries) -> dict:
    """The sum of the available resources of ``entries``, leaving out zeros (as
    ``available_resources()`` leaves out a resource that is fully used)."""
    out: dict = {}
    for entry in entries:
        _add(out, entry.available)
    return {k: v for k, v in out.items() if v > 0}
