"""The owner's placement groups: reserving them, their ready objects, removal, the table.

Owns: the groups this driver created (pending until the ledger has room, created, removed),
each group's ``ready()`` objects, retrying pending groups when resources come back, and what
removal does to this driver's work in the group (queued tasks fail, running ones are killed,
actors in it die). Does not own: the reservation's accounting (a ledger lease that provides
the group's derived resources: ``ledger.acquire_group``, decisions in ``core/resources.py``
and ``core/placement.py``), the tasks and actors themselves (``tasks.py``, ``actors.py``).
Called by: the runtime (the driver's public calls, without the owner's lock), the owner's
requests (a worker's calls, from deferred work) and the owner (retries, after releases).

In a cluster (the node's view file exists), each attempt plans every bundle's node first
(``node_pick.plan_bundles`` on the view, this node's room as its ledger says; PACK and
SPREAD prefer this node, STRICT_PACK one node, STRICT_SPREAD a node per bundle), reserves
the bundles planned on other nodes (``remote_bundles.RemoteBundles.reserve``: a lease per
bundle on this driver's link to that node), then this node's subset in its ledger under the
group's own bundle indexes, recorded with every bundle's node (the table's
``bundles_to_node_id``). The ledger record comes last, so ``ready()`` means every bundle is
held. No room now: pending, tried again every RETRY_S; a group that no set of alive nodes
can hold gets one stderr line and stays pending, placed when nodes that can hold it join.
A detached group stays on this node (its bundles on other nodes would be held by this
driver's links, which end with it).
A bundle on another node whose node dies is placed again on any alive node with room,
this one included (``_check_bundle_nodes``, on the watch; ``_replace``, a thread; here:
``ledger.grow_group`` adds it to the group's lease under its own bundle number): the
ledger's record says ``rescheduling`` (the table's RESCHEDULING) with no node for it until
then. A task of
another driver in a bundle this driver holds on another node fails (``elsewhere``).

::

    create ──► validate ──► ledger.acquire_group ──► CREATED: ready objects set, dispatch
                              │ no room now                   (tasks waiting for the group)
                              ▼
                           PENDING ──► retried after each release of this owner and every
                                       RETRY_S (other drivers release too)
    remove ──► (locked) fail queued tasks and ready objects, kill running workers and actors
                        (on other nodes too: remote_bundles.removed)
           ──► (unlocked) ledger.release_group, then each other node's bundle lease

The ledger is the table that every driver of a node shares: a group created by one driver is
found by name (``lookup``) and listed (``table``) by every other, and removing it from any of
them releases it. A group's lease is held by the creating driver (released with its leases
when it leaves or dies, as Ray ends a job's groups), or by the node for a detached group.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from miniray._private.core import ids, node_pick, oob, placement, protocol, serialization
from miniray._private.core.ids import PlacementGroupID
from miniray._private.core.pg_handle import PlacementGroup
from miniray._private.core.resources import format_infeasible, infeasible_reasons, plan_group
from miniray._private.transport.node_client import CLUSTER_FILE
from miniray.exceptions import RaySystemError, TaskPlacementGroupRemoved

PENDING = "PENDING"
CREATED = "CREATED"
REMOVED = "REMOVED"
RESCHEDULING = "RESCHEDULING"  # created, and a bundle whose node died is placed again


class _Group:
    __slots__ = ("hex", "bundles", "strategy", "name", "detached", "state", "ready_ids",
                 "created_at", "scheduled_at", "attempts", "infeasible", "host_lease",
                 "nodes", "noted", "never", "trying", "replacing")

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

    def record(self, node_id: str) -> dict[str, Any]:
        """What the ledger keeps of a reserved group (every driver reads it)."""
        return {"id": self.hex, "name": self.name, "strategy": self.strategy,
                "bundles": self.bundles, "detached": self.detached,
                "nodes": list(self.nodes or [node_id] * len(self.bundles)),
                "created_at": self.created_at,
                "scheduled_at": self.scheduled_at, "attempts": self.attempts,
                "job_id": ids.JOB_ID}


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


class PlacementGroups:
    """Given at construction: the ``owner`` (its lock, ``defer``, objects, tasks, actors,
    leases and reactor), this driver's ``pid``, the ``holder_for_detached`` pid (the node's
    when joined to one, else this driver's: an embedded session ends with its driver), the
    ``node_id`` and the node's ``totals`` (floats)."""

    RETRY_S = 0.1
    WATCH_S = 0.5  # how soon work in a group that another driver removed is ended

    def __init__(self, *, owner, pid: int, holder_for_detached: int, node_id: str,
                 totals: dict[str, float]):
        self.owner = owner
        self.ledger = owner.ledger
        self.pid = pid
        self.holder_for_detached = holder_for_detached
        self.node_id = node_id
        self.totals = totals
        self.groups: dict[str, _Group] = {}  # this driver's, in creation order
        self._retry_armed = False
        self._watch_armed = False

    # -- creation -----------------------------------------------------------------------
    def pending_records(self) -> list[dict[str, Any]]:
        """*Locked.* The groups this driver still waits to reserve (the ledger holds only
        reserved ones), as records for ``state_row``."""
        return [dict(g.record(self.node_id), infeasible=g.infeasible or g.never)
                for g in self.groups.values() if g.state == PENDING]

    def create(self, hex_: str, bundles, strategy: str, name: str, detached: bool) -> None:
        """*Not locked.* Validate and reserve now if the node (or, in a cluster, the nodes)
        have room, else keep pending. Raises ValueError for a group of several
        STRICT_SPREAD bundles on a node outside a cluster (it could never be placed); in a
        cluster such a group, or one no set of nodes can hold now, stays pending (as in
        Ray) with one stderr line, and is placed when nodes that can hold it join."""
        why = placement.group_infeasible(bundles, strategy, 1, self.totals)
        group = _Group(hex_, bundles, strategy, name, detached)
        in_cluster = not detached and self._cluster() is not None
        if (why is not None and strategy == "STRICT_SPREAD" and len(bundles) > 1
                and not in_cluster):
            raise ValueError(f"Placement group {name or hex_} cannot be created: {why}.")
        idle = self.owner.node_state  # the node's totals and devices, nothing leased
        if in_cluster:
            pass  # the plan over the cluster's nodes decides, in _try
        elif why is not None or plan_group(idle, bundles) is None:
            group.infeasible = True
            need: dict[str, float] = {}
            for bundle in bundles:
                for k, v in bundle.items():
                    need[k] = need.get(k, 0.0) + v
            line = format_infeasible(need, infeasible_reasons(idle, need))
            if why is None:  # the sums fit, the devices do not (two 1-GPU bundles, 1 GPU)
                line = line.replace("it exceeds the node's resources",
                                    "its bundles cannot be packed on the node's devices")
            print(f"{line.replace('the task stays pending', 'the group stays pending')} "
                  f"(placement group {name or hex_}, strategy {strategy})",
                  file=sys.stderr, flush=True)
        taken = name and any(lease.group.get("name") == name
                             for lease in self.ledger.groups().values())
        with self.owner.locked():
            self.owner.check_usable()
            taken = taken or (name and any(g.name == name and g.state == PENDING
                                           for g in self.groups.values()))
            if not taken:
                self.groups[hex_] = group
        if taken:
            raise RaySystemError(f"Failed to create placement group '{hex_}' because name "
                                 f"'{name}' already exists.")
        if not group.infeasible:
            self._try(group)
        if group.state == PENDING:
            with self.owner.locked():
                self._arm_retry()

    def _try(self, group: _Group) -> None:
        """*Not locked.* One attempt at the ledger (and the other nodes); on success the
        group's ready objects are set and the work waiting for it is dispatched. Skipped
        while another attempt at the same group runs."""
        with self.owner.locked():
            if group.trying or group.state != PENDING:
                return
            group.trying = True
        try:
            self._attempt(group)
        finally:
            with self.owner.locked():
                group.trying = False

    def _attempt(self, group: _Group) -> None:
        group.attempts += 1
        holder = self.holder_for_detached if group.detached else self.pid
        cluster = None if group.detached else self._cluster()
        plan = self._plan(group, cluster) if cluster is not None else None
        if cluster is not None and plan is None:
            return  # no set of nodes has room now: pending
        here = [i for i, node in enumerate(plan or []) if node == self.node_id] \
            if plan is not None else list(range(len(group.bundles)))
        parts: dict = {}
        if len(here) < len(group.bundles):  # step 1 of remote_bundles: their leases first
            parts = cluster.bundles.reserve(group.hex, group.name, group.bundles, plan)
            if parts is None:
                return
        group.nodes = plan
        bundles = [group.bundles[i] for i in here]
        provides = placement.bundle_provides(group.hex, bundles, here)
        group.scheduled_at = time.time()
        leases = self.owner.leases
        caps = leases.host_caps_for(bundles)  # physical GPUs other sessions hold
        try:
            lease = self.ledger.acquire_group(bundles, group.record(self.node_id),
                                              provides, holder_pid=holder, instance_caps=caps,
                                              indexes=here)
            # This session's idle leases (kept for its next task, or taken at init for
            # the first) give way to the group, as they do to a task of another shape.
            if lease is None and self.owner.make_room():
                lease = self.ledger.acquire_group(bundles, group.record(self.node_id),
                                                  provides, holder_pid=holder,
                                                  instance_caps=caps, indexes=here)
        except (OSError, KeyError):  # the node's ledger went with the node
            lease = None
        if lease is None:
            if parts:
                cluster.bundles.release_parts(parts)
            return
        if caps is not None:
            host_lease = leases.take_host_shares(lease, holder, lease.tag)
            if host_lease is False:  # another session took them in between: next time
                self.ledger.release_group(group.hex)
                if parts:
                    cluster.bundles.release_parts(parts)
                return
            group.host_lease = host_lease
        with self.owner.locked():
            if group.state == REMOVED:  # removed while being reserved
                removed = True
            else:
                removed = False
                group.state = CREATED
                if parts:
                    cluster.bundles.adopt(group.hex, parts, bool(here))
                    self.watch()  # removed by another driver: its other nodes' part too
                ready, group.ready_ids = group.ready_ids, []
                self._set_ready(ready, group)
                self.owner.wake_dispatch()
        if removed:
            self.ledger.release_group(group.hex)
            leases.release_host(group.host_lease)
            if parts:
                cluster.bundles.release_parts(parts)

    def _cluster(self):
        """*Not locked.* The owner's ``RemoteNodes`` when this node is in a cluster (its
        view file exists: a node started with ``miniray start``), else None (one stat)."""
        owner = self.owner
        if owner.remote_nodes is None:
            session_dir = owner.hello_info.get("session_dir")
            if not session_dir or not os.path.exists(os.path.join(session_dir,
                                                                  CLUSTER_FILE)):
                return None
            with owner.locked():
                return owner._remote_nodes()
        return owner.remote_nodes

    def _plan(self, group: _Group, cluster) -> list[str] | None:
        """*Not locked.* Each bundle's node now (``node_pick.plan_bundles`` on the view,
        this node's room as its ledger says), or None: no room now (a group that no set of
        alive nodes can ever hold gets one stderr line and stays pending)."""
        nodes = cluster.view(fresh=True)  # one file read: a plan on the newest room
        if not nodes:
            return None
        nodes = self._local_room(nodes)
        plan, why = node_pick.plan_bundles(group.bundles, group.strategy, self.node_id, nodes)
        group.never = plan is None and why.startswith("never")  # Ray's INFEASIBLE state
        if plan is None and why.startswith("never") and not group.noted:
            group.noted = True
            print(f"miniray: placement group {group.name or group.hex} (strategy "
                  f"{group.strategy}) cannot be placed on the alive nodes of the cluster "
                  f"({why[len('never: '):]}); it stays pending until nodes that can hold "
                  "it join (miniray start --address=HEAD:PORT).", file=sys.stderr, flush=True)
        return plan

    def _local_room(self, nodes: list) -> list:
        """*Not locked.* The view ``nodes`` with this node's room as its ledger says now
        (fresher than its heartbeat)."""
        try:
            here = self.ledger.available()
        except (OSError, ValueError):
            return nodes
        return [replace(e, available=dict(here)) if e.node_id == self.node_id else e
                for e in nodes]

    def try_pending(self) -> None:
        """*Not locked.* Retry the pending groups, oldest first (resources came back)."""
        for group in [g for g in self.groups.values() if g.state == PENDING]:
            if not group.infeasible:
                self._try(group)

    def _arm_retry(self) -> None:
        """*Locked.* Retry pending groups in RETRY_S while any is pending."""
        if self._retry_armed or not any(g.state == PENDING and not g.infeasible
                                        for g in self.groups.values()):
            return
        self._retry_armed = True

        def retry() -> None:  # on the I/O thread, locked
            self._retry_armed = False
            if self.owner.closed:
                return

            def attempt() -> None:
                self.try_pending()
                with self.owner.locked():
                    self._arm_retry()
            if self.owner.remote_nodes is not None:  # round trips to other nodes: not on
                threading.Thread(target=attempt, daemon=True,  # the I/O thread
                                 name="miniray-pg-retry").start()
            else:
                self.owner.defer(attempt)

        self.owner.reactor.call_later(self.RETRY_S, retry)

    def has_pending(self) -> bool:
        return any(g.state == PENDING and not g.infeasible for g in self.groups.values())

    # -- ready() and wait() --------------------------------------------------------------
    def ready_object(self, hex_: str, handle) -> bytes:
        """*Not locked.* The id of an object that becomes ``handle`` once the group is
        reserved (at once if it is), or holds TaskPlacementGroupRemoved."""
        object_id = ids.new_put_id()
        reserved = hex_ in self.ledger.groups()
        with self.owner.locked():
            self.owner.objects.ensure(object_id)
            group = self.groups.get(hex_)
            if group is not None and group.state == PENDING:
                group.ready_ids.append(object_id)
                return object_id
            if reserved:
                self._set_ready([object_id], None, handle)
            else:
                self._fail_ready([object_id])
        return object_id

    def _set_ready(self, object_ids, group, handle=None) -> None:
        """*Locked.*"""
        if not object_ids:
            return
        if handle is None:
            handle = PlacementGroup(PlacementGroupID(bytes.fromhex(group.hex)), group.bundles)
        data = oob.inline_blob(oob.serialize(handle))
        for object_id in object_ids:
            self.owner.objects.set_ready(object_id, protocol.OK, data)

    def _fail_ready(self, object_ids) -> None:
        """*Locked.*"""
        if not object_ids:
            return
        data = serialization.dumps(TaskPlacementGroupRemoved(
            "The placement group corresponding to this task has been removed."))
        for object_id in object_ids:
            self.owner.objects.set_ready(object_id, protocol.ERR, data)

    def state_of(self, hex_: str) -> str | None:
        """*Not locked.* CREATED, PENDING, REMOVED, or None (never known here)."""
        if hex_ in self.ledger.groups():
            return CREATED
        group = self.groups.get(hex_)
        if group is None:
            return None
        return REMOVED if group.state == CREATED else group.state  # released by its holder

    def wait(self, hex_: str, timeout: float) -> bool:
        """*Not locked.* True once reserved, False after ``timeout`` seconds; raises if the
        group was removed or is unknown (Ray's message)."""
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.005
        while True:
            state = self.state_of(hex_)
            if state == CREATED:
                return True
            if state in (REMOVED, None):
                raise Exception(  # Ray raises a bare Exception here
                    f"Placement group {PlacementGroupID(bytes.fromhex(hex_))!r} does not "
                    "exist.")
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    # -- removal --------------------------------------------------------------------------
    def remove(self, hex_: str) -> None:
        """*Not locked.* Release the group: this driver's work in it fails (queued tasks,
        ready objects), running tasks and actors in it are killed, then the ledger gets
        its resources back. Removing a group twice, or one of another driver, works."""
        host_lease = None
        with self.owner.locked():
            group = self.groups.get(hex_)
            if group is not None:
                group.state = REMOVED
                ready, group.ready_ids = group.ready_ids, []
                self._fail_ready(ready)
                host_lease, group.host_lease = group.host_lease, None
            self.owner.placement_group_removed(hex_)
            remote = self.owner.remote_nodes
            lent = []
            if remote is not None:
                lent = [actor_id for actor_id, loan in remote.bundles.loans.items()
                        if loan[0].pg_hex == hex_]
                remote.bundles.removed(hex_)  # its tasks on other nodes: failed, killed
        self._kill_lent(lent)  # its named actors in them: the node's actor service's
        self.ledger.release_group(hex_)
        self.owner.leases.release_host(host_lease)
        self.owner.after_placement_removal()
        if remote is not None:
            remote.bundles.release(hex_)  # after the kills: each node's part is back

    def watch(self) -> None:
        """*Locked.* Every WATCH_S while this owner has work in a group, or holds bundles of
        one on other nodes: a group removed by another driver (or whose holder died) ends
        that work as a removal here does, and its bundles on other nodes are released."""
        if self._watch_armed:
            return
        self._watch_armed = True

        def tick() -> None:  # on the I/O thread, locked
            self._watch_armed = False
            if self.owner.closed:
                return
            used = self.owner.groups_in_use()
            remote = self.owner.remote_nodes
            if remote is not None:
                used |= set(remote.bundles.groups)
            if used:
                self.owner.defer(lambda: self._check_used(used))

        self.owner.reactor.call_later(self.WATCH_S, tick)

    def _check_used(self, used: set) -> None:
        """*Not locked.* End this owner's work in the groups of ``used`` that are gone."""
        try:
            reserved = self.ledger.groups()
        except (OSError, ValueError):  # the node's ledger went with the node
            return
        gone = []
        with self.owner.locked():
            remote = self.owner.remote_nodes
            for hex_ in used:
                group = self.groups.get(hex_)
                if hex_ in reserved or (group is not None and group.state == PENDING):
                    continue
                if group is not None:
                    group.state = REMOVED
                self.owner.placement_group_removed(hex_)
                if remote is not None:
                    remote.bundles.removed(hex_)
                    gone.append(hex_)
            self.watch()
        for hex_ in gone:  # round trips: after the lock
            remote.bundles.release(hex_)
        if remote is not None and remote.bundles.loans:
            self._check_loans(remote)
        if remote is not None and remote.bundles.groups:
            self._check_bundle_nodes(remote)

    def _kill_lent(self, actor_ids) -> None:
        """*Not locked.* Kill these named actors in the node's actor service, no restart
        (``remote_bundles`` step 7: their group was removed, or their bundle went to
        another node than this one after its node died)."""
        for actor_id in actor_ids:
            try:
                self.owner.actors.kill_in_service(actor_id, True)
            except (RuntimeError, OSError, ValueError):  # the service is gone (its
                pass  # ServiceUnavailable): its group watch, if any, ends them

    def _check_loans(self, remote) -> None:
        """*Not locked.* The room of this driver's named actors in its remote bundles
        (``remote_bundles`` step 7) comes back once the node's actor service no longer
        knows the name as that actor (it ended: killed, out of scope, its node died)."""
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        with self.owner.locked():
            asks = [(actor_id, name, namespace) for actor_id, (_b, name, namespace, _h)
                    in remote.bundles.loans.items()]
        link = self.owner.actors.link
        ended = []
        for actor_id, name, namespace in asks:
            try:
                found = link.lookup(name, namespace)[0]
            except ValueError:  # no actor of that name now
                found = None
            except (ServiceUnavailable, OSError):
                continue  # asked again at the next turn
            if found != actor_id:
                ended.append(actor_id)
        if ended:
            with self.owner.locked():
                for actor_id in ended:
                    remote.bundles.end_loan(actor_id)

    # -- bundles whose node died (remote_bundles step 6) ----------------------------------
    def _check_bundle_nodes(self, remote) -> None:
        """*Not locked.* Bundles of this driver's groups whose node died (dead in the view,
        or the link to it lost) are placed again on alive nodes, the others staying where
        they are (as Ray reschedules a dead node's bundles): the group shows RESCHEDULING
        with no node for them until then, and tasks that ran in them wait for them there
        (``RemoteNodes._retry``, per ``max_retries``). One thread per group at a time."""
        try:
            view = remote.view(fresh=True)
        except (OSError, ValueError):
            return
        alive = {e.node_id for e in view if e.alive}
        start = []
        with self.owner.locked():
            for hex_, lost in remote.bundles.find_lost(alive).items():
                group = self.groups.get(hex_)
                if group is None or group.state != CREATED or group.replacing:
                    continue
                group.replacing = True
                start.append((group, lost))
        for group, lost in start:
            threading.Thread(target=self._replace, args=(remote, group, lost, view),
                             daemon=True, name="miniray-pg-replace").start()

    def _replace(self, remote, group: _Group, lost: list[int], view) -> None:
        """*Not locked*, its own thread. Plan ``lost`` on the alive nodes (``_replan``),
        take the other nodes' leases (``remote_bundles.reserve``), then this node's part
        (``_grow``), then adopt them (``remote_bundles.replace``); the ledger's record
        says RESCHEDULING until then."""
        try:
            nodes = list(group.nodes or [])
            shown = [("" if i in lost else node) for i, node in enumerate(nodes)]
            try:
                lease = self.ledger.groups().get(group.hex)
                if lease is None:
                    return  # removed, by any driver: the watch ends its work
                if lease.group.get("nodes") != shown or not lease.group.get("rescheduling"):
                    self.ledger.update_group(group.hex, {"nodes": shown,
                                                         "rescheduling": True})
            except (OSError, ValueError):
                return
            kept = {i: node for i, node in enumerate(nodes) if i not in lost}
            plan = self._replan(group, view, kept, lost)
            if plan is None:
                return  # no room now: the next watch tick (WATCH_S) tries again
            here = sorted(i for i, node in plan.items() if node == self.node_id)
            full = [plan.get(i, self.node_id) for i in range(len(group.bundles))]
            parts: dict = {}
            if len(here) < len(plan):  # step 1 of remote_bundles for the other nodes' part
                try:
                    parts = remote.bundles.reserve(group.hex, group.name, group.bundles,
                                                   full)
                except Exception:  # noqa: BLE001 - shutting down: the links are closing
                    return
                if parts is None:
                    return
            if here and not self._grow(group, here):
                remote.bundles.release_parts(parts)
                return
            with self.owner.locked():
                adopted = group.state == CREATED and remote.bundles.replace(group.hex, parts,
                                                                            here)
                moved = []
                if adopted:
                    for i, node in plan.items():
                        nodes[i] = node
                    group.nodes = nodes
                    moved = remote.bundles.moved_loans(group.hex, set(parts))
            if not adopted:
                remote.bundles.release_parts(parts)
                return
            self._kill_lent(moved)
            try:
                self.ledger.update_group(group.hex, {"nodes": nodes, "rescheduling": False})
            except (OSError, ValueError):
                pass
        finally:
            with self.owner.locked():
                group.replacing = False

    def _replan(self, group: _Group, view, kept: dict, lost: list[int]) -> dict | None:
        """*Not locked.* ``node_pick.replan_bundles`` for ``lost`` on the alive nodes, this
        one with its ledger's room (this driver's idle leases given back first when no
        node has room now and this node, idle, would hold some of them), or left out when
        the bundles ask for GPUs that other sessions on this host share
        (``leases.host_caps_for``: the group's host lease is taken once, at creation)."""
        if self.owner.leases.host_caps_for([group.bundles[i] for i in lost]) is not None:
            view = [e for e in view if e.node_id != self.node_id]
        else:
            view = self._local_room(view)

        def replan(nodes):
            return node_pick.replan_bundles(group.bundles, group.strategy, self.node_id,
                                            nodes, kept, lost)

        plan = replan(view)
        if plan is None:  # would this node's whole room do? Then idle leases give way
            idle = [replace(e, available=dict(e.totals)) if e.node_id == self.node_id else e
                    for e in view]
            hoped = replan(idle)
            if hoped and self.node_id in hoped.values() and self.owner.make_room():
                plan = replan(self._local_room(view))
        return plan

    def _grow(self, group: _Group, here: list[int]) -> bool:
        """*Not locked.* Bundles ``here`` (their node died) held by this node's ledger now,
        under the group's own bundle numbers (``ledger.grow_group``), as at creation."""
        bundles = [group.bundles[i] for i in here]
        try:
            return self.ledger.grow_group(group.hex, bundles,
                                          placement.bundle_provides(group.hex, bundles, here),
                                          indexes=here)
        except (OSError, ValueError):  # the node's ledger went with the node
            return False

    def gone(self, hex_: str) -> bool:
        """*Not locked.* Whether work for this group can never run: it is neither reserved
        nor pending here (removed, by any driver, or its holder is gone)."""
        group = self.groups.get(hex_)
        if group is not None and group.state == PENDING:
            return False
        return hex_ not in self.ledger.groups()

    def elsewhere(self, request) -> str | None:
        """*Not locked* (a ledger read). Why a task of this (rewritten) placement
        ``request`` can never run in this driver: its bundle (for -1, every bundle) of a
        group reserved by another driver is held on another node by that driver's link
        (``remote_bundles``); None: it may run here. The caller skips it for this driver's
        own groups, whose remote bundles run its tasks."""
        parsed = placement.bundle_request(request)
        if parsed is None:
            return None
        pg_hex, index, _base = parsed
        lease = self.ledger.groups().get(pg_hex)
        if lease is None:
            return None
        record = lease.group
        nodes = list(record.get("nodes") or [])
        bound = placement.bundle_elsewhere(index, nodes, self.node_id)
        if not bound:
            return None
        name = record.get("name") or pg_hex
        what = f"bundle {index}" if index >= 0 else "any bundle (-1)"
        where = ", ".join(f"bundle {i} on node {nodes[i]}" for i in bound)
        local = [i for i, node in enumerate(nodes) if node == self.node_id]
        hint = (f", or schedule it into a bundle of this node ({local})" if local else "")
        return (f"The task asks for {what} of placement group '{name}' ({where}); only the "
                f"driver that created the group (job {record.get('job_id') or '?'}) can run "
                "work in its bundles on other nodes, which it holds over its own links. "
                f"Create the group in this driver{hint}.")

    # -- lookups --------------------------------------------------------------------------
    def lookup(self, name: str) -> tuple[str, list]:
        """*Not locked.* ``(hex, bundles)`` of the group called ``name`` (reserved by any
        driver of the node, or pending here); ValueError as Ray's when there is none."""
        for hex_, lease in self.ledger.groups().items():
            if name and lease.group.get("name") == name:
                return hex_, lease.group["bundles"]
        for group in self.groups.values():
            if name and group.name == name and group.state == PENDING:
                return group.hex, group.bundles
        raise ValueError(f"Failed to look up placement group with name: {name}")

    def table(self) -> dict[str, dict[str, Any]]:
        """*Not locked.* Every group known here: the node's reserved ones (any driver's),
        then this driver's pending and removed ones."""
        out = {}
        for hex_, lease in self.ledger.groups().items():
            out[hex_] = table_entry(lease.group, RESCHEDULING if lease.group.get(
                "rescheduling") else CREATED)
        for group in list(self.groups.values()):
            if group.hex in out:
                continue
            state = PENDING if group.state == PENDING else REMOVED
            record = group.record(self.node_id)
            record["infeasible"] = group.infeasible or group.never
            out[group.hex] = table_entry(record, state)
        return out

    def bundles_of(self, hex_: str) -> list | None:
        group = self.groups.get(hex_)
        if group is not None:
            return group.bundles
        lease = self.ledger.groups().get(hex_)
        return None if lease is None else lease.group["bundles"]

    def statistics(self) -> dict[str, int]:
        counts = {PENDING: 0, CREATED: 0, REMOVED: 0}
        for group in self.groups.values():
            counts[group.state] += 1
        return {k.lower(): v for k, v in counts.items()}
