"""Where a task that may leave this node runs in a cluster: its scheduling strategy mapped
onto the node rules.

Owns: the pure decision for one task or actor (``placement_for``): a hard or soft
``NodeAffinitySchedulingStrategy``, ``"SPREAD"`` (``SPREAD``) or none, against the cluster's
view, answered as a node id, None (run locally, the unchanged fast path) or an
``Unschedulable`` text (Ray's ``TaskUnschedulableError``); where a task whose lease a node
denied goes instead (``move_to``); and which queued tasks spill-over may send elsewhere
(``may_spill``). Does not own: the rules themselves (``node_pick.py``), the view
(``cluster_view.py``), or acting on an answer (``owner/remote_nodes.py``,
``owner/remote_actors.py``).
Called by: ``owner/remote_nodes.RemoteNodes`` (``offload``, ``spill``, ``locate``, a denied
lease's move) and ``owner/remote_actors.RemoteActors.where``, under the owner's lock.
"""

from __future__ import annotations

from miniray._private.core import node_pick

__all__ = ["SPREAD", "Unschedulable", "decide", "may_spill", "move_to", "placement_for",
           "request_text"]


class Unschedulable(str):
    """``placement_for``'s answer for a task that can never run where its hard node affinity
    says (the text says why): Ray's ``TaskUnschedulableError``."""


SPREAD = "SPREAD"  # a spec's ``affinity`` for scheduling_strategy="SPREAD"


def placement_for(affinity, request: dict, local: str, view, local_feasible: bool = True,
                  exclude: str | None = None, *, local_room: bool | None = None,
                  turn: int = 0, arg_bytes: dict | None = None):
    """Step 1's pure decision: the node id to run on, None to run locally as before, or an
    ``Unschedulable`` text (``node_pick.pick_node`` decides; this only maps its answer).

    ``affinity``: the spec's ``(node_id, soft, on_unavailable)`` (``options.node_affinity``;
    a bare node id is a hard one), ``SPREAD``, or None; ``local_feasible``: whether the
    local node has the request in its totals (its ``infeasible_reasons`` are empty);
    ``exclude``: a node not to use (the one that just died under a retry), whatever the
    view says; ``local_room``: False when the local ledger has no room for it now
    (spill-over; None: not asked, the task stays local when it is feasible here);
    ``turn``: SPREAD's rotation; ``arg_bytes``: ``{node_id: bytes of its arguments
    there}`` (locality). The rules (``node_pick``'s; Ray's ``NodeAffinitySchedulingStrategy``
    docstring and hybrid policy):

    * an affinity to a node the view holds alive with the totals: that node (this one:
      locally), waiting there for room; with ``on_unavailable`` and no room now, a hard
      one is Unschedulable and a soft one goes on as without;
    * to a node dead, unknown or too small: hard, Unschedulable; soft, as without;
    * ``SPREAD``: the least used node with room now, the local one included, rotating
      among equals; none with room: locally when feasible here, else as without;
    * without: locally when the local node can ever hold it and ``local_room`` is not
      False; with no room here now, another node with room now (unless its arguments here
      are too large to move: ``node_pick`` rule 3), else locally (it waits here); a task
      this node can never hold: another alive node with room now, else the least used one
      with the totals (its lease waits), else locally (pending, the infeasible line on
      stderr, as before).

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> a = NodeEntry("a", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 2})
    >>> b = NodeEntry("b", "10.0.0.2", 1, totals={"CPU": 2}, available={"CPU": 0})
    >>> placement_for("b", {"CPU": 1}, "a", [a, b]), placement_for("a", {}, "a", [a, b])
    ('b', None)
    >>> placement_for(("b", True, True), {"CPU": 1}, "a", [a, b]) is None  # spills: full
    True
    """
    return decide(affinity, request, local, view, local_feasible, exclude, local_room,
                   turn, arg_bytes)[0]


def decide(affinity, request: dict, local: str, view, local_feasible: bool,
           exclude: str | None, local_room: bool | None = None, turn: int = 0,
           arg_bytes: dict | None = None):
    """``placement_for``'s answer and the ``node_pick.Placement`` behind it (None where no
    rule was asked: the local fast path)."""
    spread = affinity == SPREAD
    if isinstance(affinity, str) and not spread:
        affinity = (affinity, False, False)
    nodes = [e for e in view if e.node_id != exclude] if exclude else list(view)
    if affinity is not None and not spread:
        node_id, soft, on_unavailable = (tuple(affinity) + (False,))[:3]
        if not soft:
            if node_id == local and local_feasible:
                return None, None
            placed = node_pick.pick_node(request, local, nodes,
                                         {"node_id": node_id, "soft": False})
            if placed.action == "wait" and placed.node_id == node_id and on_unavailable:
                return Unschedulable(
                    f"the node {node_id} named by NodeAffinitySchedulingStrategy(soft=False, "
                    f"_fail_on_unavailable=True) has no room for {request_text(request)} "
                    "now"), placed
            if placed.action in ("node", "wait") and placed.node_id == node_id:
                return (None if node_id == local else node_id), placed
            why = ("this node lacks the resources in total" if node_id == local else
                   "no alive node of the cluster has that id" if not any(
                       e.node_id == node_id and e.alive for e in nodes)
                   else placed.reason or "it lacks the resources")
            return Unschedulable(
                f"the node {node_id} named by NodeAffinitySchedulingStrategy(soft=False) is "
                f"dead, unknown or cannot hold {request_text(request)} ({why}); soft=True lets the "
                "task run elsewhere"), placed
        if node_id != local:
            placed = node_pick.pick_node(
                request, local, [e for e in nodes if e.node_id == node_id],
                {"node_id": node_id, "soft": True, "spill_on_unavailable": on_unavailable})
            if placed.node_id == node_id and (placed.action == "node" or (
                    placed.action == "wait" and not on_unavailable)):
                return node_id, placed
    if local_feasible and local_room is not False and not spread:
        return None, None  # the unchanged fast path: it waits here for room
    placed = node_pick.pick_node(request, local, nodes, SPREAD if spread else None,
                                 turn=turn, arg_bytes=arg_bytes, local_room=local_room,
                                 local_holds=local_feasible)
    if placed.node_id in (None, local) or (placed.action == "wait" and local_feasible):
        return None, placed
    return placed.node_id, placed


def move_to(affinity, request: dict, local: str, view, current: str,
            local_feasible: bool) -> str | None:
    """A task waits for room on node ``current`` (its lease was denied): another node to
    ask instead, or None. Only where step 1 would place it now with no room here, and only
    a node with room now (as of its last heartbeat): never away from the node an affinity
    holds it to, never to this node (its own queue is not this module's), never back and
    forth between two full nodes.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> b = NodeEntry("b", "10.0.0.2", 1, totals={"X": 1}, available={"X": 0})
    >>> c = NodeEntry("c", "10.0.0.3", 1, totals={"X": 1}, available={"X": 1})
    >>> move_to(None, {"X": 1}, "a", [b, c], "b", False), move_to("b", {"X": 1}, "a", [b, c],
    ...                                                          "b", False)
    ('c', None)
    """
    placed, why = decide(affinity, request, local, view, local_feasible, None, False)
    if type(placed) is not str or placed == current or why is None or why.action != "node":
        return None
    return placed


def may_spill(task) -> bool:
    """Whether spill-over may send ``task`` to another node: not one with a strategy
    of its own (an affinity, SPREAD: placed already) or a placement group's bundle (on
    this node), nor a cancelled one."""
    spec = task.spec
    return spec.affinity is None and spec.placement is None and not task.cancelled


def request_text(request: dict) -> str:
    """A request as errors name it: ``{CPU: 1, GPU: 2}`` (zero amounts left out)."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(request.items()) if v) + "}"
