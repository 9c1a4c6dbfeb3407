"""Which node a task's request goes to: the pure placement rule across the cluster's nodes.

Owns: ``pick_node`` (peering design 4.3 "Placement") and its answer (``Placement``): run
here, run on another node, wait (and where), or infeasible everywhere (with a message
naming every node's totals); a node's utilization (``utilization``), this driver's own
tasks on a node taken off a stale view (``less_claims``) and its own SPREAD actors counted
in one (``at_least_own``), and the locality cost
rule (``MOVE_MAX_ARG_BYTES``). Pure: the caller passes the request, the local node's id,
the nodes it knows (``cluster_view.NodeEntry``, with ``available`` from heartbeats), the
strategy, whether the local node has room now (its ledger's word, fresher than the view)
and, optionally, where the arguments' bytes are.
Does not own: the view (``cluster_view.py``), leases (the node's ledger decides in the end:
a DENY sends the caller back here with a fresher view), placement groups
(``placement.py``), or acting on an answer (``owner/remote_nodes.py``).
Called by: ``core/task_nodes.placement_for`` (every task that may leave this node:
node affinity, ``"SPREAD"``, one the local node can never hold, and spill-over of a
local node with no room now) and ``move_to``; ``owner/remote_nodes.RemoteNodes.locate``
(a task given results kept on other nodes: rule 2's exception weighs their bytes).
``plan_bundles`` (a placement group's bundles across nodes):
``owner/placement_group_nodes.PlacementGroupNodes._plan`` (a mixin of ``PlacementGroups``).

Rules, in order (``Placement.action`` is "node", "wait" or "infeasible"):

1. ``NodeAffinitySchedulingStrategy(node_id, soft)`` (an object or a dict with those keys):
   that node if it is alive and has the resources in total (now: "node"; else "wait" on
   it, or, soft with ``_spill_on_unavailable``, rules 2-5). Dead, unknown, or lacking them:
   infeasible if not ``soft`` (Ray's ``TaskUnschedulableError``); if ``soft``, rules 2-5
   decide. A ``node:<ip>`` resource in the request
   needs no rule of its own: only the node with that ip has it in its totals, so rules 2-5
   find it or wait for it.
2. The local node, if it has the resources available now (the unchanged fast path;
   ``"SPREAD"`` skips this rule; ``local_room=False``, the local ledger's "no room now",
   overrides the view's ``available``, and ``local_holds=False``, its "never", the view's
   totals), unless another node that has them available now holds more than
   ``MOVE_MAX_ARG_BYTES`` of the task's arguments and more of them than the local node
   (a result kept on the node that made it, issue 16): that node then, the most bytes
   first (the node id breaks ties). Moving that much costs more than a lease there;
   small arguments keep the task local.
3. Locality: the local node has the totals but no room now, and more than
   ``MOVE_MAX_ARG_BYTES`` of the task's arguments are in its store: "wait" here. Values
   travel to another node through this driver, once per task; waiting for a local slot is
   cheaper than moving that much (not for ``"SPREAD"``, which asks to spread).
4. Another alive node that has them available now: the most argument bytes already there
   first, then the lowest utilization (the largest used fraction of a requested resource),
   then the node id. Work that asks for no GPU avoids nodes with GPUs while a node without
   GPUs has room (Ray's ``scheduler_avoid_gpu_nodes``). ``"SPREAD"``: every node with room
   now, the local one included, by lowest utilization; ties rotate with ``turn`` (the
   caller counts its spread tasks).
5. No node has room now: "wait" on the local node if it has the totals, else "wait" on
   the least used other alive node that has them (its lease waits there; the node id
   breaks ties); else "infeasible".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

__all__ = ["MOVE_MAX_ARG_BYTES", "Placement", "at_least_own", "fits_in_total", "less_claims",
           "pick_node", "plan_bundles", "replan_bundles", "utilization"]

_EPS = 1e-9
MOVE_MAX_ARG_BYTES = 16 << 20  # rule 3: a task with more argument bytes here waits here


@dataclass(frozen=True)
class Placement:
    """``action``: "node" (run on ``node_id`` now), "wait" (on ``node_id``, or for a view
    change when it is None) or "infeasible" (``reason`` says why, naming the totals)."""

    action: str
    node_id: str | None = None
    reason: str = ""


def _needs(request: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in request.items() if v}


def _has(amounts: Mapping[str, float], needs: Mapping[str, float]) -> bool:
    return all(amounts.get(k, 0.0) + _EPS >= v for k, v in needs.items())


def fits_in_total(request: Mapping[str, float], entry) -> bool:
    """Whether ``entry`` (a ``NodeEntry``) has ``request`` in its totals (it could ever run it).

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> fits_in_total({"CPU": 2, "GPU": 0}, NodeEntry("a", "10.0.0.1", 1, totals={"CPU": 2}))
    True
    """
    return _has(entry.totals, _needs(request))


def at_least_own(view: Iterable[Any], own: Mapping[str, Mapping[str, float]]) -> list:
    """``view`` with each node's ``available`` at most its totals less ``own[node_id]``,
    what this driver's own placements there hold: the use it counts is at least the
    driver's own, so a view read before a heartbeat showed them counts them all the same;
    one that shows that much in use, or more, is left as it is. SPREAD's least used node
    then never lags the driver's own turns. Untouched entries are kept.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> b = NodeEntry("b", "", 1, totals={"CPU": 2}, available={"CPU": 2})
    >>> at_least_own([b], {"b": {"CPU": 0.5}})[0].available  # placed, not in the view yet
    {'CPU': 1.5}
    >>> b = NodeEntry("b", "", 1, totals={"CPU": 2}, available={"CPU": 1})
    >>> at_least_own([b], {"b": {"CPU": 0.5}})[0].available  # the view shows more in use
    {'CPU': 1}
    """
    out = []
    for entry in view:
        mine = {k: float(v) for k, v in (own.get(entry.node_id) or {}).items() if v}
        if mine:
            available = dict(entry.available)
            for name, amount in mine.items():
                most = max(0.0, float(entry.totals.get(name, 0.0)) - amount)
                if float(available.get(name, 0.0)) > most:
                    available[name] = most
            entry = replace(entry, available=available)
        out.append(entry)
    return out


def less_claims(view: Iterable[Any], claims: Mapping[str, Mapping[str, float]],
                seen: Mapping[str, Mapping[str, float]] | None = None) -> list:
    """``view`` with each node's ``available`` brought up to date for this driver's own
    use: ``claims[node_id]`` is what this driver's tasks there hold or wait for now,
    ``seen[node_id]`` what they did when the view was read (its heartbeat showed that
    much, or less). Other drivers' use stays as of the heartbeat (totals less available
    less ``seen``); the estimate is totals less that less ``claims``, floored at 0. With no
    ``seen``, every claim counts as not in the view yet. Untouched entries are kept.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> b = NodeEntry("b", "", 1, totals={"CPU": 4}, available={"CPU": 1})
    >>> less_claims([b], {"b": {"CPU": 1}})[0].available  # a new task, not in the view
    {'CPU': 0.0}
    >>> less_claims([b], {}, {"b": {"CPU": 3}})[0].available  # its 3 tasks there ended
    {'CPU': 4.0}
    """
    seen = seen or {}
    out = []
    for entry in view:
        claim, then = claims.get(entry.node_id) or {}, seen.get(entry.node_id) or {}
        if claim or then:
            available = dict(entry.available)
            for name in set(claim) | set(then):
                total = float(entry.totals.get(name, 0.0))
                others = max(0.0, total - float(available.get(name, 0.0))
                             - float(then.get(name, 0.0)))
                available[name] = max(0.0, total - others - float(claim.get(name, 0.0)))
            entry = replace(entry, available=available)
        out.append(entry)
    return out


def utilization(entry, request: Mapping[str, float]) -> float:
    """The largest used fraction, on ``entry``, of a resource ``request`` asks for (CPU for
    an empty request): 0.0 idle, 1.0 full.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> utilization(NodeEntry("a", "", 1, totals={"CPU": 4}, available={"CPU": 1}), {})
    0.75
    """
    names = [k for k, v in request.items() if v] or ["CPU"]
    used = 0.0
    for name in names:
        total = float(entry.totals.get(name, 0.0))
        if total > 0:
            used = max(used, 1.0 - float(entry.available.get(name, 0.0)) / total)
    return used


def _affinity(strategy) -> tuple[str, bool, bool] | None:
    if isinstance(strategy, Mapping):
        node_id, soft = strategy.get("node_id"), strategy.get("soft", False)
        spill = strategy.get("spill_on_unavailable", False)
    else:
        node_id, soft = getattr(strategy, "node_id", None), getattr(strategy, "soft", False)
        spill = getattr(strategy, "_spill_on_unavailable", False)
    if not isinstance(node_id, str) or not node_id:
        return None
    return node_id, bool(soft), bool(spill)


def _amount(name: str, value: float) -> str:
    """``2 CPU``; memory in GiB (``15.9 GiB memory``)."""
    if name in ("memory", "object_store_memory"):
        return f"{value / (1 << 30):.1f} GiB {name}"
    return f"{value:g} {name}"


def _totals_text(nodes) -> str:
    parts = []
    for entry in sorted(nodes, key=lambda e: e.node_id):
        shape = ", ".join(_amount(k, v) for k, v in sorted(entry.totals.items())
                          if not k.startswith("node:")) or "nothing"
        parts.append(f"{entry.ip or entry.node_id[:12]} has {shape}")
    return "; ".join(parts) or "no node is alive"


def _arg_node(located: Mapping[str, int], local: str | None, feasible: list,
              has_room) -> str | None:
    """Rule 2's exception: the node with room now holding the most (over
    ``MOVE_MAX_ARG_BYTES``, and over what the local node holds) of the task's arguments;
    None: none (the task stays local)."""
    here = located.get(local, 0) if local is not None else 0
    best = None
    for entry in feasible:
        count = located.get(entry.node_id, 0)
        if entry.node_id == local or count <= MOVE_MAX_ARG_BYTES or count <= here:
            continue
        if has_room(entry) and (best is None or (-count, entry.node_id) < best):
            best = (-count, entry.node_id)
    return None if best is None else best[1]


def pick_node(request: Mapping[str, float], local: str | None, view: Iterable[Any],
              strategy: Any = None, *, turn: int = 0,
              arg_bytes: Mapping[str, int] | None = None,
              local_room: bool | None = None, local_holds: bool | None = None) -> Placement:
    """Where ``request`` goes (the module docstring's rules 1-5).

    Args:
        request: ``{resource: amount}`` (zero amounts ignored).
        local: The local node's id (None: a driver without a node of its own).
        view: The nodes known (``NodeEntry``: node_id, ip, alive, totals, available).
        strategy: None/"DEFAULT", "SPREAD", or a node affinity (object or dict with
            ``node_id``, ``soft`` and optionally ``spill_on_unavailable``).
        turn: SPREAD's rotation among equally used nodes.
        arg_bytes: ``{node_id: bytes of the task's arguments already there}``.
        local_room: False when the local node's ledger just said it has no room now (the
            view's ``available`` for it is ignored then); None: the view decides.
        local_holds: the local ledger's word on whether it has the request in its totals
            (False: never here, whatever the view's totals say); None: the view decides.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> a = NodeEntry("a", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 0})
    >>> b = NodeEntry("b", "10.0.0.2", 1, totals={"CPU": 2}, available={"CPU": 2})
    >>> pick_node({"CPU": 1}, "a", [a, b])
    Placement(action='node', node_id='b', reason='')
    """
    needs = _needs(request)
    nodes = [e for e in view if getattr(e, "alive", True)]
    by_id = {e.node_id: e for e in nodes}

    def holds(entry) -> bool:
        if entry.node_id == local and local_holds is not None:
            return local_holds
        return _has(entry.totals, needs)

    feasible = [e for e in nodes if holds(e)]
    spread = isinstance(strategy, str) and strategy.upper() == "SPREAD"
    affinity = None if isinstance(strategy, str) or strategy is None else _affinity(strategy)
    located = arg_bytes or {}

    def has_room(entry) -> bool:
        if entry.node_id == local and local_room is not None:
            return local_room and holds(entry)
        return _has(entry.available, needs)

    # Rule 1.
    if affinity is not None:
        node_id, soft, spill = affinity
        target = by_id.get(node_id)
        if target is not None and _has(target.totals, needs):
            if has_room(target):
                return Placement("node", node_id)
            if not (soft and spill):
                return Placement("wait", node_id, f"node {node_id[:12]} has no room now")
        if not soft:
            why = ("is not alive or not known" if target is None else
                   "lacks " + ", ".join(f"{v:g} {k}" for k, v in needs.items()
                                        if target.totals.get(k, 0.0) + _EPS < v))
            return Placement("infeasible", None,
                             f"NodeAffinitySchedulingStrategy(node_id={node_id[:12]}..., "
                             f"soft=False): the node {why}.")

    # Rule 2.
    here = by_id.get(local) if local is not None else None
    here_holds = here is not None and holds(here)
    if not spread and here_holds and has_room(here):
        away = _arg_node(located, local, feasible, has_room)
        return Placement("node", here.node_id if away is None else away)

    # Rule 3.
    if not spread and here_holds and located.get(local, 0) > MOVE_MAX_ARG_BYTES:
        return Placement("wait", here.node_id, f"{located[local] / (1 << 20):.0f} MiB of "
                         "its arguments are on this node: it waits for room here")

    # Rule 4.
    room = [e for e in feasible if has_room(e) and (spread or e.node_id != local)]
    if room:
        if spread:
            ordered = sorted(room, key=lambda e: e.node_id)
            shift = turn % len(ordered)
            ordered = ordered[shift:] + ordered[:shift]
            return Placement("node", min(ordered, key=lambda e: round(
                utilization(e, needs), 6)).node_id)
        if not needs.get("GPU"):
            plain = [e for e in room if not e.totals.get("GPU")]
            room = plain or room
        best = min(room, key=lambda e: (-located.get(e.node_id, 0), utilization(e, needs),
                                        e.node_id))
        return Placement("node", best.node_id)

    # Rule 5.
    if here_holds:
        return Placement("wait", here.node_id, "no node has room now; this node has the "
                                               "resources in total")
    if feasible:
        best = min(feasible, key=lambda e: (utilization(e, needs), e.node_id))
        return Placement("wait", best.node_id, "no node has room now; "
                         + ", ".join(e.ip or e.node_id[:12] for e in feasible)
                         + " has the resources in total")
    shape = ", ".join(f"{v:g} {k}" for k, v in sorted(needs.items())) or "nothing"
    return Placement("infeasible", None, f"No node of the cluster has {shape} in total: "
                     f"{_totals_text(nodes)}.")


def plan_bundles(bundles: list, strategy: str, local: str | None,
                 view: Iterable[Any]) -> tuple[list[str] | None, str]:
    """The node of each of a placement group's ``bundles`` now (Ray's strategies), or
    ``(None, why)``: no room now, or (``why`` starting "never") no set of alive nodes can
    ever hold it. Each bundle must fit one node's ``available``; bundles planned on a node
    use up its room for the next ones. Nodes are tried local first, then least used, then
    by id.

    * ``STRICT_PACK``: every bundle on one node.
    * ``PACK``: on one node if one has room for all; else each bundle on the node the
      previous one went to while it fits, then on the next in order (few nodes).
    * ``SPREAD``: each bundle on a node no other bundle of the group is on yet, while one
      has room; then on any node with room.
    * ``STRICT_SPREAD``: each bundle on a node of its own.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> a = NodeEntry("a", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 2})
    >>> b = NodeEntry("b", "10.0.0.2", 1, totals={"CPU": 2}, available={"CPU": 2})
    >>> plan_bundles([{"CPU": 1}] * 2, "STRICT_SPREAD", "a", [a, b])
    (['a', 'b'], '')
    >>> plan_bundles([{"CPU": 1}] * 3, "STRICT_SPREAD", "a", [a, b])[1][:45]
    'never: STRICT_SPREAD puts each of its 3 bundl'
    """
    nodes = [e for e in view if getattr(e, "alive", True)]
    needs = [_needs(bundle) for bundle in bundles]
    total: dict[str, float] = {}
    for need in needs:
        for name, amount in need.items():
            total[name] = total.get(name, 0.0) + amount
    strict_spread, pack_all = strategy == "STRICT_SPREAD", strategy == "STRICT_PACK"
    if pack_all and not any(_has(e.totals, total) for e in nodes):
        return None, (f"never: STRICT_PACK puts all bundles ({_text(total)}) on one node; "
                      f"{_totals_text(nodes)}")
    for index, need in enumerate(needs):
        if not any(_has(e.totals, need) for e in nodes):
            return None, f"never: bundle {index} ({_text(need)}): {_totals_text(nodes)}"
    if strict_spread:
        able = [e for e in nodes if any(_has(e.totals, need) for need in needs)]
        if len(able) < len(needs):
            return None, (f"never: STRICT_SPREAD puts each of its {len(needs)} bundles on a "
                          f"node of its own; {len(able)} alive nodes can hold them")

    def order(room: dict) -> list:
        return sorted(nodes, key=lambda e: (e.node_id != local, _used(e, room), e.node_id))

    room = {e.node_id: dict(e.available) for e in nodes}
    if strategy in ("STRICT_PACK", "PACK"):
        for entry in order(room):
            if _has(room[entry.node_id], total):
                return [entry.node_id] * len(needs), ""
        if pack_all:
            return None, "no node has room for all bundles now"
    out: list[str] = []
    for need in needs:
        fits = [e for e in order(room) if _has(room[e.node_id], need)]
        if strategy in ("SPREAD", "STRICT_SPREAD"):
            fresh = [e for e in fits if e.node_id not in out]
            fits = fresh if fresh or strict_spread else fits
        elif out and out[-1] in {e.node_id for e in fits}:  # PACK: stay while it fits
            fits = [e for e in fits if e.node_id == out[-1]]
        if not fits:
            return None, "no room now for bundle " + str(len(out)) + f" ({_text(need)})"
        chosen = fits[0].node_id
        out.append(chosen)
        for name, amount in need.items():
            room[chosen][name] = float(room[chosen].get(name, 0.0)) - amount
    return out, ""


def _used(entry, room: Mapping[str, float]) -> float:
    """``utilization`` of ``entry`` with ``room`` as its available (CPU, or the largest)."""
    used = 0.0
    for name, total in entry.totals.items():
        if total and not name.startswith("node:"):
            used = max(used, 1.0 - float(room.get(name, 0.0)) / float(total))
    return used


def _text(amounts: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(amounts.items())) or "nothing"


def replan_bundles(bundles: list, strategy: str, local: str | None, view: Iterable[Any],
                   kept: dict[int, str], lost: list[int]) -> dict[int, str] | None:
    """New nodes for the bundles ``lost`` (index list: their node died) of a group whose
    other bundles stay where they are (``kept``: index -> node), as Ray reschedules a dead
    node's bundles; None: no alive node has room now (asked again later). Any alive node
    of ``view`` with room, ``local`` (the driver's, tried first as at creation) included:
    the caller gives its room as its ledger says, or leaves it out of ``view`` when it
    cannot hold them there. STRICT_SPREAD keeps off the nodes of the kept bundles,
    STRICT_PACK goes to theirs.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> nodes = [NodeEntry(n, "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": 2})
    ...          for n in "abc"]
    >>> replan_bundles([{"CPU": 1}] * 2, "STRICT_SPREAD", "a", nodes, {0: "a"}, [1])
    {1: 'b'}
    >>> replan_bundles([{"CPU": 1}] * 2, "STRICT_SPREAD", "a", nodes[:2], {0: "b"}, [1])
    {1: 'a'}
    >>> replan_bundles([{"CPU": 1}] * 2, "STRICT_SPREAD", "a", nodes[:2], {0: "a"}, [1])
    {1: 'b'}
    """
    if not lost:
        return {}
    taken = set(kept.values())
    nodes = [e for e in view if getattr(e, "alive", True)]
    if strategy == "STRICT_SPREAD":
        nodes = [e for e in nodes if e.node_id not in taken]
    elif strategy == "STRICT_PACK" and taken:
        nodes = [e for e in nodes if e.node_id in taken]
    plan, _why = plan_bundles([bundles[i] for i in lost], strategy, local, nodes)
    return None if plan is None else dict(zip(lost, plan))
