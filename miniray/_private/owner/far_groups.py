"""Placement groups of drivers on other hosts: their records, read from their node.

Owns: which (not detached) group of a driver of another node is recorded where
(``FarGroups.held``: hex -> the node whose ledger holds its record, and that record, as
that node last answered), asking the nodes for them (``RemoteNodeClient.groups``: step 14
of ``node/remote_drivers.py``, on this driver's link to each node, opened as for a task,
all at once: ``core/ask_all.py``; a detached group left out: ``drivers_groups``), and the
pure merge of their answers into what was known (``merge``).
Why the creator's node answers, and not the head: a group's record is in the ledger of its
creator's node only (the other nodes hold plain leases of the creator's links for its
bundles there), a node tells the head nothing of its groups (a heartbeat carries its room),
and a copy at the head would be late by a heartbeat and lost with the head; the creator's
node answers from the record itself, on a link this driver opens to it for tasks anyway.
The cost is one round trip to every other node at once for a name or an id not seen yet
(``SCAN_GAP_S`` apart at most; ASK_TIMEOUT_S at most however many cannot answer), then one
to the group's node.
Does not own: the links (``remote_nodes.py``), this node's ledger, the detached groups that
the head's actor service holds (``placement_group_nodes.py``: ``_served_held``), what a
driver may do in such a group (``placement_group_nodes.py``).
Called by: ``placement_group_nodes.PlacementGroupNodes`` (``records``, ``record_of``, not
locked: round trips; ``forget``, once this driver removed a group through its node:
``_remove_far``).
"""

from __future__ import annotations

import logging
import math
import threading
import time

from miniray._private.core.ask_all import ask_all

logger = logging.getLogger(__name__)

SCAN_GAP_S = 0.5  # every other node is asked at most this often (a name or id not seen yet)
ASK_TIMEOUT_S = 5.0  # the nodes' answers, asked at once


def merge(held: dict, answers: dict, alive: set) -> dict:
    """Pure. What is known of the far groups (``{hex: (node id, record)}``) after the nodes
    in ``answers`` (``{node id: {hex: record}}``) answered: each such node's groups are its
    answer, a node that did not answer keeps its last one, and the groups of a node not in
    ``alive`` (dead in the view, or this node) are gone.

    >>> merge({"a": ("n1", {}), "b": ("n2", {})}, {"n1": {"c": {}}}, {"n1", "n2"})
    {'b': ('n2', {}), 'c': ('n1', {})}
    >>> merge({"b": ("n2", {})}, {}, {"n1"})
    {}
    """
    out = {hex_: (node, record) for hex_, (node, record) in held.items()
           if node in alive and node not in answers}
    for node, groups in answers.items():
        if node in alive:
            for hex_, record in groups.items():
                out.setdefault(hex_, (node, record))
    return out


def drivers_groups(groups: dict) -> dict:
    """Pure. Of a node's ledger records (``{hex: record}``), the groups its drivers hold:
    a detached one is the head's actor service's, read from it (``SVC_PG_TABLE``).

    >>> sorted(drivers_groups({"a": {"detached": True}, "b": {"detached": False}}))
    ['b']
    """
    return {h: r for h, r in groups.items() if not r.get("detached")}


class FarGroups:
    """Given the driver's ``RemoteNodes`` (``cluster``: its view, its links and this node's
    id): see the module docstring."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._lock = threading.Lock()  # ``held`` and ``_scanned``; never held over a request
        self.held: dict[str, tuple[str, dict]] = {}
        self._scanned = -math.inf

    def records(self, only=None) -> dict[str, tuple[str, dict]]:
        """*Not locked* (round trips). ``{hex: (node id, record)}`` of the groups the other
        alive nodes' drivers hold: every other node asked (``only`` None; at most every
        SCAN_GAP_S, else the last answers), or only the nodes that last held one of the
        groups ``only`` names (a group seen nowhere yet: every node, as for None)."""
        with self._lock:
            known = {self.held[h][0] for h in (only or ()) if h in self.held}
            scan = only is None or len(known) < len(set(only))
            if scan and time.monotonic() - self._scanned < SCAN_GAP_S:
                scan = False
                if not known:
                    return dict(self.held)
        self._ask(None if scan else known)
        with self._lock:
            return dict(self.held)

    def known(self, hexes) -> list[str]:
        """*Not locked*, no I/O. Those of ``hexes`` seen held by another node's driver."""
        with self._lock:
            return [h for h in hexes if h in self.held]

    def record_of(self, hex_: str):
        """*Not locked* (round trips). ``(node id, record)`` of group ``hex_`` as its node
        says now (a group not seen yet: as ``records`` finds it), or None."""
        return self.records([hex_]).get(hex_)

    def forget(self, hex_: str) -> None:
        """*Not locked*, no I/O. Group ``hex_`` is gone (this driver removed it through its
        node): no longer known until a node answers with it again."""
        with self._lock:
            self.held.pop(hex_, None)

    def named(self, name: str):
        """*Not locked* (round trips). ``(hex, node id, record)`` of the group called
        ``name`` that a driver of another node holds, or None."""
        for hex_, (node, record) in self.records().items():
            if name and record.get("name") == name:
                return hex_, node, record
        return None

    def _ask(self, node_ids) -> None:
        """*Not locked.* Ask the alive nodes ``node_ids`` (None: every other alive node)
        for their groups, all at once (``core/ask_all.py``: a node that cannot answer
        costs ASK_TIMEOUT_S in all, not that much per node); ``held`` becomes the merged
        answers of those that answered by then (``merge``)."""
        started = time.monotonic()
        view = [e for e in self.cluster.view(fresh=True) if e.alive]
        alive = {e.node_id for e in view if e.node_id != self.cluster.local}
        asked = {e.node_id: e for e in view if e.node_id in alive and (
            node_ids is None or e.node_id in node_ids)}
        answers, missing = ask_all(
            asked, lambda entry: drivers_groups(self.cluster.client(entry).groups(
                ASK_TIMEOUT_S)), ASK_TIMEOUT_S, "miniray-groups")
        for node_id, why in missing.items():  # a node that cannot answer now
            logger.debug("node %s did not list its placement groups: %s", node_id[:12], why)
        with self._lock:
            self.held = merge(self.held, answers, alive)
            if node_ids is None:
                self._scanned = started
