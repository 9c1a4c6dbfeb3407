"""The owner's placement groups: reserving them, their ready objects, removal, the table.

Owns: the groups this driver created (pending until the ledger has room, created, removed),
each group's ``ready()`` objects, retrying pending groups when resources come back, and what
removal does to this driver's work in the group (queued tasks fail, running ones are killed,
actors in it die). Does not own: the reservation's accounting (a ledger lease that provides
the group's derived resources: ``ledger.acquire_group``, decisions in ``core/resources.py``
and ``core/placement.py``), the tasks and actors themselves (``tasks.py``, ``actors.py``).
Called by: the runtime (the driver's public calls, without the owner's lock), the owner's
requests (a worker's calls, from deferred work) and the owner (retries, after releases).
Split by seam: what concerns other nodes is a mixin, ``placement_group_nodes.py``; the
records, states and printed forms are ``placement_group_records.py``.

In a cluster (the node's view file exists), each attempt plans every bundle's node first
(``placement_group_nodes.py``), reserves the bundles planned on other nodes
(``remote_bundles.RemoteBundles.reserve``: a lease per bundle on this driver's link to that
node), then this node's subset in its ledger under the group's own bundle indexes, recorded
with every bundle's node (the table's ``bundles_to_node_id``). The ledger record comes last,
so ``ready()`` means every bundle is held. No room now: pending, tried again every RETRY_S.
A detached group in a cluster is held by the node's actor service, which lives as long as
the node (``placement_group_nodes._detached_home``): a driver asks the service to create it
(``_create_served``; its record here follows the ledger) and to remove it
(``_remove_in_service``), and the service creates it as its own group, across nodes; outside
a cluster it stays on this node. A driver on a member, whose service is the head's on
another host, reads the records of the groups it holds there beside this node's ledger
(``_reserved``). Bundles whose node died are placed again from the watch
(``placement_group_nodes.py``).

::

    create ──► validate ──► ledger.acquire_group ──► CREATED: ready objects set, dispatch
                              │ no room now                   (tasks waiting for the group)
                              ▼
                           PENDING ──► retried after each release of this owner and every
                                       RETRY_S (other drivers release too)
    remove ──► a group of a driver of another node: that driver removes it first
               (_remove_far, through its node)
           ──► (locked) fail queued tasks and ready objects, kill running workers and actors
                        (on other nodes too: remote_bundles.removed)
           ──► (unlocked) ledger.release_group, then each other node's bundle lease

The ledger is the table that every driver of a node shares: a group created by one driver is
found by name (``lookup``) and listed (``table``) by every other, and removing it from any of
them releases it (a driver of another host asks the creating driver, through its node, to
remove it: ``_remove_far``). A group's lease is held by the creating driver (released with
its leases when it leaves or dies, as Ray ends a job's groups), or by the node for a
detached group.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from miniray._private.core import ids, oob, placement, protocol, serialization
from miniray._private.core.ids import PlacementGroupID
from miniray._private.core.pg_handle import PlacementGroup
from miniray._private.core.resources import format_infeasible, infeasible_reasons, plan_group
from miniray._private.owner.placement_group_nodes import PlacementGroupNodes
from miniray._private.owner.placement_group_records import (
    CREATED,
    PENDING,
    REMOVED,
    RESCHEDULING,
    _Group,
    table_entry,
)
from miniray.exceptions import RaySystemError, TaskPlacementGroupRemoved


class PlacementGroups(PlacementGroupNodes):
    """Given at construction: the ``owner`` (its lock, ``defer``, objects, tasks, actors,
    leases and reactor), this driver's ``pid``, the ``holder_for_detached`` pid (the node's
    when joined to one, else this driver's: an embedded session ends with its driver), the
    ``node_id`` and the node's ``totals`` (floats). Its methods for other nodes are in
    its mixin (``placement_group_nodes.py``)."""

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
        self._serving: set[str] = set()  # the actor service: detached groups being created
        self._doomed: set[str] = set()  # of those, the ones removed meanwhile
        self._far_known: bool | None = None  # the service is the head's, on another host
        self._far_held: dict = {}  # then: the service's reserved groups, as last read
        self._far_groups = None  # in a cluster: the groups of other nodes' drivers

    # -- creation -----------------------------------------------------------------------
    def pending_records(self) -> list[dict[str, Any]]:
        """*Locked.* The groups this driver still waits to reserve (the ledger holds only
        reserved ones), as records for ``state_row``; not a served group's record (the
        node's actor service, which holds it, lists it once for every driver)."""
        return [dict(g.record(self.node_id), infeasible=g.infeasible or g.never)
                for g in self.groups.values() if g.state == PENDING and not g.served]

    def create(self, hex_: str, bundles, strategy: str, name: str, detached: bool) -> None:
        """*Not locked.* Validate and reserve now if the node (or, in a cluster, the nodes)
        have room, else keep pending. Raises ValueError for a group of several
        STRICT_SPREAD bundles on a node outside a cluster (it could never be placed); in a
        cluster such a group, or one no set of nodes can hold now, stays pending (as in
        Ray) with one stderr line, and is placed when nodes that can hold it join."""
        home = self._detached_home() if detached else ""
        if home == "service":
            return self._create_served(hex_, bundles, strategy, name)
        why = placement.group_infeasible(bundles, strategy, 1, self.totals)
        group = _Group(hex_, bundles, strategy, name, detached)
        group.spans = home == "span"
        in_cluster = (not detached or group.spans) and self._cluster() is not None
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
        if group.served:
            return self._follow_served(group)
        group.attempts += 1
        holder = self.holder_for_detached if group.detached else self.pid
        cluster = None if group.detached and not group.spans else self._cluster()
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
                if parts or group.host_lease:
                    # removed by another driver: its other nodes' part, and the host's
                    # GPU shares it holds for other sessions, are released too
                    self.watch()
                ready, group.ready_ids = group.ready_ids, []
                self._set_ready(ready, group)
                self.owner.wake_dispatch()
        if removed:
            self.ledger.release_group(group.hex)
            leases.release_host(group.host_lease)
            if parts:
                cluster.bundles.release_parts(parts)

    def try_pending(self) -> None:
        """*Not locked.* Retry the pending groups, oldest first (resources came back)."""
        with self.owner.locked():  # others add groups meanwhile (create, a name's lookup)
            pending = [g for g in self.groups.values() if g.state == PENDING]
        for group in pending:
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
        reserved = self._lease_anywhere(hex_) is not None
        with self.owner.locked():
            self.owner.objects.ensure(object_id)
            group = self.groups.get(hex_)
            if group is not None and group.state == PENDING:
                group.ready_ids.append(object_id)
                return object_id
            # CREATED here since the ledger was read (the retry thread reserved it between
            # the two reads): reserved, not removed
            if reserved or (group is not None and group.state == CREATED):
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
        group = self.groups.get(hex_)
        before = None if group is None else group.state  # read before the ledger: a group
        if self._lease_anywhere(hex_) is not None:  # reserved between the reads: not
            return CREATED  # "removed"
        if group is None:
            return None
        # released by its holder: CREATED here already before the ledger said otherwise
        return REMOVED if before == CREATED and group.state == CREATED else group.state

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
        its resources back. Removing a group twice, or one of another driver, works. A
        detached group the node's actor service holds is removed there first (its bundles
        on every node, its actors: ``_remove_in_service``), and so is one that a driver of
        another node holds, by that driver (``_remove_far``); RaySystemError when that
        driver's node could not be asked (this driver's own work in it ends anyway)."""
        self._remove_in_service(hex_)
        far_trouble = None
        if hex_ not in self.groups and self.ledger.groups().get(hex_) is None:
            far_trouble = self._remove_far(hex_)  # a driver of another node's, if any
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
                lent = [(actor_id, hex_) for actor_id, loan in remote.bundles.loans.items()
                        if loan[0].pg_hex == hex_]
                remote.bundles.removed(hex_)  # its tasks on other nodes: failed, killed
        self._kill_lent(lent)  # its named actors in them: the node's actor service's
        self.ledger.release_group(hex_)
        self.owner.leases.release_host(host_lease)
        self.owner.after_placement_removal()
        if remote is not None:
            # After the kills were asked: each node's part is back (a kill the service did
            # not take is asked again from a thread, which may land after this).
            remote.bundles.release(hex_)
        if far_trouble is not None:
            raise RaySystemError(f"Failed to remove placement group '{hex_}': "
                                 f"{far_trouble}.")

    def watch(self) -> None:
        """*Locked.* Every WATCH_S while this owner has work in a group, holds bundles of
        one on other nodes, or holds the host's GPU shares for one: a group removed by
        another driver (or whose holder died) ends that work as a removal here does, and
        its bundles on other nodes and its GPU shares are released."""
        if self._watch_armed:
            return
        self._watch_armed = True

        def tick() -> None:  # on the I/O thread, locked
            self._watch_armed = False
            if self.owner.closed:
                return
            used = self.owner.groups_in_use() | {
                h for h, group in self.groups.items() if group.host_lease}
            remote = self.owner.remote_nodes
            if remote is not None:
                bundles = remote.bundles
                used |= set(bundles.groups) | set(bundles.served_waiting) | set(
                    bundles.lender_watched) | {
                    h for h, tasks in bundles.running.items() if tasks}
            if used:
                self.owner.defer(lambda: self._start_check(used))

        self.owner.reactor.call_later(self.WATCH_S, tick)

    def _start_check(self, used: set) -> None:
        """*Not locked* (the I/O thread, after the tick). The watch's checks read ledgers,
        done here; when they may ask the node's actor service (a driver on a member, whose
        service is the head's on another host, or actors lent room in remote bundles),
        whose answer can take up to the link's request timeout, they run on a thread of
        their own: the I/O thread never waits for another process's answer. One at a
        time either way: the check arms the next tick when it ends."""
        remote = self.owner.remote_nodes
        if self._far() or (remote is not None and (remote.bundles.loans or
                                                   remote.bundles.lender_watched)) or (
                self._far_groups is not None and self._far_groups.known(used)):
            threading.Thread(target=self._check_used, args=(used,), daemon=True,
                             name="miniray-pg-watch").start()
        else:
            self._check_used(used)

    def _check_used(self, used: set) -> None:
        """*Not locked.* End this owner's work in the groups of ``used`` that are gone."""
        try:
            reserved = self._reserved(only=used)
        except (OSError, ValueError):  # the node's ledger went with the node
            return
        reserved.update(self._far_reserved(used))  # lent by drivers of other nodes
        remote = self.owner.remote_nodes
        far_gone = self._lenders_gone(remote) if remote is not None else set()
        gone = []
        lent = []
        host_leases = []
        with self.owner.locked():
            remote = self.owner.remote_nodes
            for hex_ in used:
                group = self.groups.get(hex_)
                if hex_ in reserved or (group is not None and group.state == PENDING):
                    continue
                if remote is not None and hex_ in remote.bundles.lender_watched and \
                        hex_ not in far_gone:
                    continue  # lent by a driver of another node, whose node holds it
                if group is not None:
                    group.state = REMOVED
                    host_leases.append(group.host_lease)
                    group.host_lease = None
                self.owner.placement_group_removed(hex_)
                if remote is not None:
                    lent += [(actor_id, hex_) for actor_id, loan in
                             remote.bundles.loans.items() if loan[0].pg_hex == hex_]
                    remote.bundles.removed(hex_)
                    gone.append(hex_)
            self.watch()
        for host_lease in host_leases:  # ledger writes: after the lock
            self.owner.leases.release_host(host_lease)
        if lent and self.owner.actors.link.on_another_host():
            self._kill_lent(lent)  # the service cannot see the group go: told here
        for hex_ in gone:  # round trips: after the lock
            remote.bundles.release(hex_)
        if remote is not None and remote.bundles.loans:
            self._check_loans(remote)
        if remote is not None and remote.bundles.lent_out:
            self._check_borrowers(remote)
        if remote is not None and remote.bundles.groups:
            self._check_bundle_nodes(remote)

    def gone(self, hex_: str, far: bool = False) -> bool:
        """*Not locked.* Whether work for this group can never run: it is neither reserved
        nor pending here (removed, by any driver, or its holder is gone). ``far``: for a
        task or an actor whose room a driver of another node may lend
        (``_lease_anywhere``)."""
        group = self.groups.get(hex_)
        if group is not None and group.state == PENDING:
            return False
        return (self._lease_anywhere(hex_) if far else self._lease_of(hex_)) is None

    # -- lookups --------------------------------------------------------------------------
    def lookup(self, name: str) -> tuple[str, list]:
        """*Not locked.* ``(hex, bundles)`` of the group called ``name`` (reserved by any
        driver of the node, pending here, a detached one pending in the node's actor
        service: ``_find_served``, or reserved by a driver of another node:
        ``_far_named``); ValueError as Ray's when there is none."""
        found = self._reserved_named(name)
        if found is not None:
            return found
        for group in list(self.groups.values()):
            if name and group.name == name and group.state == PENDING:
                return group.hex, group.bundles
        found = self._find_served(name) or self._far_named(name)
        if found is not None:
            return found
        raise ValueError(f"Failed to look up placement group with name: {name}")

    def _reserved_named(self, name: str) -> tuple[str, list] | None:
        """*Not locked.* ``lookup`` in the ledger (a served group found there is noted)."""
        for hex_, lease in self._reserved().items():
            if name and lease.group.get("name") == name:
                self._note_if_served(hex_, lease)
                return hex_, lease.group["bundles"]
        return None

    def table(self) -> dict[str, dict[str, Any]]:
        """*Not locked.* Every group known here: the reserved ones (any driver's of this
        node, then of the other nodes: ``_reserved_everywhere``), then this driver's pending
        and removed ones."""
        out = {}
        for hex_, lease in self._reserved_everywhere().items():
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
        lease = self._lease_anywhere(hex_)
        return None if lease is None else lease.group["bundles"]

    def statistics(self) -> dict[str, int]:
        counts = {PENDING: 0, CREATED: 0, REMOVED: 0}
        for group in self.groups.values():
            counts[group.state] += 1
        return {k.lower(): v for k, v in counts.items()}
