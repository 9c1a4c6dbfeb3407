"""Placement groups' records: their states, this driver's record of a group, and the two
printed forms of a reserved group's ledger record.

Owns: the state names (PENDING, CREATED, REMOVED, RESCHEDULING, Ray's), ``_Group`` (a group
this driver created: bundles, strategy, each bundle's node, attempts, ready objects) and its
``record`` (what the ledger keeps of it, which every driver reads), ``table_entry`` (one
group in Ray's ``placement_group_table()`` layout) and ``state_row`` (one group as a row of
Ray's ``list_placement_groups``), and ``ServedLease`` (a record the head's actor service
sent, read as a ledger lease is). Pure: no lock, no I/O.
Does not own: reserving, retrying or removing groups (``placement_groups.py``), the ledger.
Called by: ``placement_groups.PlacementGroups`` and its mixin ``placement_group_nodes.py``,
``state_records.py`` (this driver's pending groups) and ``state_api.py`` (the ledger's).
"""

from __future__ import annotations

import time
from typing import Any

from miniray._private.core import ids

PENDING = "PENDING"
CREATED = "CREATED"
REMOVED = "REMOVED"
RESCHEDULING = "RESCHEDULING"  # created, and a bundle whose node died is placed again


class _Group:
    __slots__ = ("hex", "bundles", "strategy", "name", "detached", "state", "ready_ids",
                 "created_at", "scheduled_at", "attempts", "infeasible", "host_lease",
                 "nodes", "noted", "never", "trying", "replacing", "served", "spans",
                 "asked_at")

    def __init__(self, hex_: str, bundles, strategy: str, name: str, detached: bool):
        self.hex = hex_
        self.bundles = bundles
        self.strategy = strategy
        self.name = name
        self.detached = detached
        self.state = PENDING
        self.ready_ids: list[bytes] = []
        self.created_at = time.time()
        self.scheduled_at: float | None = None
        self.attempts = 0
        self.infeasible = False
        self.host_lease: str | None = None  # physical GPUs, in the host GPU ledger
        self.nodes: list[str] | None = None  # each bundle's node once planned (None: here)
        self.noted = False  # the "no node set can hold it" line was printed
        self.never = False  # the last plan found no set of alive nodes that can hold it
        self.trying = False  # an attempt runs (create's and a retry thread's never overlap)
        self.replacing = False  # a thread places bundles whose node died again
        # A detached group in a cluster is held by the node's actor service: ``served`` in
        # the driver that asked for it (its record here only follows the ledger), ``spans``
        # in the service (planned over the cluster's nodes like a driver's own group).
        self.served = False
        self.spans = False
        self.asked_at = 0.0  # served and pending: when the service was last asked about it

    def record(self, node_id: str) -> dict[str, Any]:
        """What the ledger keeps of a reserved group (every driver reads it)."""
        return {"id": self.hex, "name": self.name, "strategy": self.strategy,
                "bundles": self.bundles, "detached": self.detached,
                "nodes": list(self.nodes or [node_id] * len(self.bundles)),
                "created_at": self.created_at,
                "scheduled_at": self.scheduled_at, "attempts": self.attempts,
                "job_id": ids.JOB_ID}


class ServedLease:
    """A reserved group's ledger record as the head's actor service sends it to a driver on
    another host (``SVC_PG_TABLE``): read where a ledger lease is (its ``group``)."""

    __slots__ = ("group",)

    def __init__(self, record: dict[str, Any]):
        self.group = record


class FarLease:
    """A group of a driver of another node as that node's ledger records it
    (``far_groups.py``), read where a ledger lease is (its ``group``); ``node_id``: the
    node that holds the record."""

    __slots__ = ("group", "node_id")

    def __init__(self, record: dict[str, Any], node_id: str):
        self.group = record
        self.node_id = node_id


def table_entry(record: dict[str, Any], state: str) -> dict[str, Any]:
    """One group in Ray's ``placement_group_table()`` layout (keys compared with Ray 2.60)."""
    created, scheduled = record.get("created_at"), record.get("scheduled_at")
    latency = round((scheduled - created) * 1000, 3) if created and scheduled else 0.0
    return {
        "placement_group_id": record["id"],
        "name": record.get("name", ""),
        "bundles": {i: dict(b) for i, b in enumerate(record["bundles"])},
        "bundles_to_node_id": ({i: node for i, node in enumerate(record.get("nodes", []))}
                               if state in (CREATED, REMOVED, RESCHEDULING)
                               else {i: "" for i in range(len(record["bundles"]))}),
        "strategy": record["strategy"],
        "state": state,
        "stats": {
            "end_to_end_creation_latency_ms": latency if state != PENDING else 0.0,
            "scheduling_latency_ms": latency if state != PENDING else 0.0,
            "scheduling_attempt": record.get("attempts", 0),
            "highest_retry_delay_ms": 0.0,
            "scheduling_state": "FINISHED" if state != PENDING else (
                "INFEASIBLE" if record.get("infeasible") else "QUEUED"),
        },
    }


def state_row(record: dict[str, Any], state: str) -> dict[str, Any]:
    """One group as a row of Ray's ``list_placement_groups`` (``ray.util.state``), from the
    ledger's record of a reserved group or a driver's record of one it waits to reserve."""
    pg_hex, nodes = record["id"], record.get("nodes") or []
    placed = state != PENDING
    return {
        "placement_group_id": pg_hex, "name": record.get("name") or "",
        "creator_job_id": record.get("job_id") or ids.job_id_for(1), "state": state,
        "bundles": [{"bundle_id": {"placement_group_id": pg_hex, "bundle_index": index},
                     "node_id": nodes[index] if placed and index < len(nodes) else None,
                     "unit_resources": dict(bundle)}
                    for index, bundle in enumerate(record.get("bundles", []))],
        "is_detached": bool(record.get("detached")),
        "stats": {"scheduling_attempt": record.get("attempts", 0),
                  "scheduling_state": "FINISHED" if placed else (
                      "INFEASIBLE" if record.get("infeasible") else "QUEUED")},
    }
