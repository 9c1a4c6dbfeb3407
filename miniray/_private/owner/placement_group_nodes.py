"""Placement groups across the nodes of a cluster: planning, lost bundles placed again, loans.

Owns: the methods of ``placement_groups.PlacementGroups`` (a mixin of it: the state is its
own, made in ``PlacementGroups.__init__``) that concern other nodes. In a cluster (the node's
view file exists), each attempt plans every bundle's node first (``_plan``:
``node_pick.plan_bundles`` on the view, this node's room as its ledger says; PACK and SPREAD
prefer this node, STRICT_PACK one node, STRICT_SPREAD a node per bundle); a group that no set
of alive nodes can hold gets one stderr line and stays pending, placed when nodes that can
hold it join. A bundle on another node whose node dies is placed again on any alive node
with room, this one included (``_check_bundle_nodes``, on the watch; ``_replace``, a thread;
here: ``ledger.grow_group`` adds it to the group's lease under its own bundle number): the
ledger's record says ``rescheduling`` (the table's RESCHEDULING) with no node for it until
then. This driver's named and detached actors in its bundles on other nodes (``remote_bundles``
step 7) are killed when their bundle goes (``_kill_lent``), and their room comes back once the
node's actor service no longer holds them alive (``_check_loans``); the service asks a lending
driver's node on another host whether such a group lives (``_lenders_gone``). A task of
another driver of this node in a bundle this driver holds on another node borrows room from
this driver
(``_note_if_served``, ``_lender_of``; ``remote_bundles`` step 9), which takes back a dead
borrower's loans (``_check_borrowers``); when it cannot, it fails (``elsewhere``). A
detached group in a cluster is held by the node's actor service (``_detached_home``): the
driver's side asks it (``_create_served``, ``_follow_served``, ``_remove_in_service``), the
service's side runs it as its own group (``serve_create``, ``serve_remove``;
docs/detached-placement-groups.md). A driver on a member (``_far``: its service is the
head's, on another host) reads the records of the groups that service holds from it
(``_reserved``, ``served_records``: ``SVC_PG_TABLE``), its node's ledger holding none of
them. Any driver reads the groups of other nodes' drivers from their node
(``far_groups.py``): ``_lease_anywhere`` (a group's state, ``ready()``, its bundles),
``_reserved_everywhere`` (the table), ``_far_named`` (``lookup``), and removes them
through their node, their driver running its own removal (``_remove_far``, and
``remove_asked`` in that driver); its work in them follows ``_lease_of``, which knows
only what this node's ledger and the head's actor service hold.
Does not own: the leases on other nodes (``remote_bundles.py``), the view and links
(``remote_nodes.py``), the planning rules (``core/node_pick.py``), this node's ledger.
Called by: ``PlacementGroups`` (``create``: ``_detached_home``, ``_create_served``;
``_attempt``: ``_cluster``, ``_plan``, ``_follow_served``; the watch: ``_check_loans``,
``_check_borrowers``, ``_check_bundle_nodes``, ``_lenders_gone``; ``remove``: ``_kill_lent``,
``_remove_in_service``, ``_remove_far``), the owner (``elsewhere``, not locked), the
node's actor service (``serve_create``, ``serve_remove``, ``served_records``, not locked,
on a thread of its own), the driver's state socket (``remove_asked``, not locked, on its
thread: ``placement_group_loans.answer_borrower``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import replace

from miniray._private.core import node_pick, placement
from miniray._private.host import procinfo
from miniray._private.owner.far_groups import FarGroups
from miniray._private.owner.placement_group_loans import gone_borrowers, loans_ended
from miniray._private.owner.placement_group_records import (
    CREATED,
    PENDING,
    REMOVED,
    FarLease,
    ServedLease,
    _Group,
)
from miniray._private.transport.node_client import CLUSTER_FILE

LENDER_ASK_S = 5.0  # at most this long for a lending driver's node's answer (step 14)
GONE = "gone"  # ``lenders_gone``: the lending driver's node is dead (its driver with it)


def lenders_gone(watched: dict, held: dict) -> list:
    """Pure. The groups of ``watched`` (``{hex: the lending driver's node id}``) that are
    gone: their node's ledger no longer holds them (``held[hex]`` False), or that node is
    dead (GONE). None (the node could not be asked now) keeps a group: asked again at the
    next turn.

    >>> lenders_gone({"a": "n1", "b": "n1", "c": "n2"}, {"a": True, "b": False, "c": GONE})
    ['b', 'c']
    >>> lenders_gone({"a": "n1"}, {"a": None})
    []
    """
    return sorted(h for h in watched if held.get(h) is False or held.get(h) == GONE)


def far_removable(group) -> bool:
    """Pure. Whether a driver of another host's removal (``remove_asked``) removes this
    driver's record ``group`` (a ``_Group``, or None: not this driver's): a reserved group
    of its own, not a served one (the node's actor service's, removed there).

    >>> from miniray._private.owner.placement_group_records import _Group
    >>> group = _Group("ab", [{"CPU": 1.0}], "PACK", "", False)
    >>> far_removable(group), far_removable(None)
    (False, False)
    >>> group.state = CREATED
    >>> far_removable(group)
    True
    >>> group.served = True
    >>> far_removable(group)
    False
    """
    return group is not None and group.state == CREATED and not group.served


KILL_LENT_TRIES = 4  # a lent actor's kill the actor service did not take: asked this often
KILL_LENT_PAUSE_S = 0.5  # before the second try; doubled before each later one


class PlacementGroupNodes:
    """``PlacementGroups``' methods for a cluster (see the module docstring); every attribute
    is the ``PlacementGroups``'."""

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

    # -- detached groups: held by the node's actor service ---------------------------------
    def _detached_home(self) -> str:
        """*Not locked* (a stat). Who holds a detached group this owner creates: "here"
        (this node's ledger only: not in a cluster), "service" (the actor service that
        serves this driver, a process as long-lived as its node: ``_create_served``; for a
        driver on a member, the head's, on another host: ``_far``), or "span" (this owner
        is that service: planned over the cluster like a driver's own group, its bundles on
        other nodes held by this owner's links)."""
        if self._cluster() is None:
            return "here"
        if self.owner.actors.link is None:
            return "span"  # only the node's actor service is joined to a node without one
        return "service"

    def _far(self) -> bool:
        """*Not locked* (a stat and a file read, once). Whether this driver's actor service
        is the head's, on another host (a driver on a member): the detached groups it
        holds are in the head's ledger, not in this node's, so this driver reads their
        records there (``_reserved``) and borrows room in every bundle of theirs, its own
        node's too (``RemoteBundles.note_served``, ``everywhere``)."""
        if self._far_known is None:
            link = self.owner.actors.link
            if link is None or self._cluster() is None:
                return False
            self._far_known = link.on_another_host()  # a member's head stays on its host
        return self._far_known

    def _reserved(self, only=None) -> dict:
        """*Not locked* (a ledger read; for a driver on a member, one request to the
        head's actor service too). The reserved groups this driver sees, ``{hex: lease}``
        (a lease's ``group`` is its record): its node's ledger's and, for a driver on a
        member (``_far``), the detached groups the head's service holds (``SVC_PG_TABLE``;
        the last answer when it cannot be asked now: a service that cannot answer does
        not make its groups look removed). ``only``: the groups the caller looks at (the
        watch's, every WATCH_S); the service is asked only when one of them was among its
        groups at the last answer."""
        groups = self.ledger.groups()
        if not self._far() or (only is not None and not any(
                hex_ in self._far_held for hex_ in only)):
            return groups
        out = dict(groups)
        for hex_, record in self._served_held().items():
            out.setdefault(hex_, ServedLease(record))
        return out

    def _lease_of(self, hex_: str):
        """*Not locked* (a ledger read; the head's service asked only for a group this
        node's ledger does not hold, by a driver on a member). Group ``hex_``'s lease as
        ``_reserved`` sees it, or None."""
        lease = self.ledger.groups().get(hex_)
        if lease is None and self._far():
            record = self._served_held().get(hex_)
            lease = None if record is None else ServedLease(record)
        return lease

    def _far_groups_of(self):
        """*Not locked* (a stat). In a cluster, this driver's ``FarGroups``: the groups of
        the other nodes' drivers (``far_groups.py``); else None."""
        cluster = self._cluster()
        if cluster is None:
            return None
        with self.owner.locked():
            if self._far_groups is None:
                self._far_groups = FarGroups(cluster)
            return self._far_groups

    def _lease_anywhere(self, hex_: str):
        """*Not locked* (``_lease_of``; for a group that is not this driver's and that it
        does not find so, round trips to the other nodes: ``FarGroups.record_of``). Group
        ``hex_``'s lease as ``_lease_of`` sees it, else a ``FarLease`` of the record that
        a driver of another node holds, or None. For what any driver may read of a group
        (its state, ``ready()``, its bundles) and its tasks (``elsewhere``, ``gone``:
        they borrow room through that node, ``remote_bundles`` step 10); its actors follow
        ``_lease_of`` (that driver lends them no room: README, Limits)."""
        lease = self._lease_of(hex_)
        if lease is not None or hex_ in self.groups:
            return lease
        far = self._far_groups_of()
        found = None if far is None else far.record_of(hex_)
        return None if found is None else FarLease(found[1], found[0])

    def _far_reserved(self, used) -> dict:
        """*Not locked* (round trips to their nodes only). The watch's view of the groups
        of ``used`` that drivers of other nodes hold, as those nodes say now (a
        ``FarLease`` each; a node that cannot answer: its last answer)."""
        far = self._far_groups
        if far is None:
            return {}
        known = far.known(used)
        if not known:
            return {}
        return {hex_: FarLease(record, node)
                for hex_, (node, record) in far.records(known).items() if hex_ in known}

    def _reserved_everywhere(self) -> dict:
        """*Not locked* (``_reserved``, and round trips to the other nodes at most every
        ``far_groups.SCAN_GAP_S``). ``_reserved``'s groups, then the other nodes' drivers'
        (a ``FarLease`` each): the table's groups."""
        out = dict(self._reserved())
        far = self._far_groups_of()
        for hex_, (node, record) in ({} if far is None else far.records()).items():
            out.setdefault(hex_, FarLease(record, node))
        return out

    def _far_named(self, name: str):
        """*Not locked* (round trips). ``lookup``'s last try: ``(hex, bundles)`` of the
        group called ``name`` that a driver of another node reserved (noted:
        ``_note_if_served``), or None."""
        far = self._far_groups_of() if name else None
        found = None if far is None else far.named(name)
        if found is None:
            return None
        hex_, node, record = found
        self._note_if_served(hex_, FarLease(record, node))  # its tasks borrow room there
        return hex_, record["bundles"]

    REMOVE_ASK_S = 12.0  # a far removal's answer (the node's relay waits 10 s for it)

    def _remove_far(self, hex_: str) -> str | None:
        """*Not locked* (round trips: the group's node, and, for a group not seen yet,
        every other node: ``FarGroups.record_of``). ``remove``'s first part for a group
        that a driver D of another node holds (``remote_bundles`` step 10): ``pg_remove``
        on this driver's link to D's node, whose relay asks D on its state socket
        (``node/loan_relay.py``, step 15 of ``node/remote_drivers.py``), and D runs its own
        removal (``remove_asked``): its work in the group ends, every node's part is
        released, its borrowers' watches see the group gone, as for D's own removal (a D
        that does not listen there: its node releases the group in its ledger, as a
        driver of that node removing it does, and D's watch sees it). Why that relay and
        not a new request of the node link, where the node would release the ledger's
        lease itself and D's watch see it: the relay, the state socket and D's removal
        exist, and a removal is one more kind of request on each; and D ends its work
        before this driver ends its own, so the room this driver's killed tasks give
        back is not taken by D's tasks waiting for it, which D's watch would fail only up
        to WATCH_S later. A node that is dead took the group with it. Why it could not be
        asked (then this driver's own part is done anyway), or None."""
        from miniray._private.transport import peer_channel as pc  # lazy: multi-host only
        from miniray._private.transport.remote_node import RemoteLeaseError  # lazy: as above
        from miniray.exceptions import NodeDiedError  # lazy: as remote_nodes

        far = self._far_groups_of()
        found = None if far is None else far.record_of(hex_)
        if found is None:
            return None
        node_id = found[0]
        cluster = self._cluster()
        entry = cluster.alive_entry(node_id)
        if entry is None:
            return None
        try:
            doc = cluster.client(entry).loan("pg_remove", {"pg": hex_}, self.REMOVE_ASK_S)
        except NodeDiedError:
            return None
        except (RemoteLeaseError, TimeoutError, OSError, pc.PeerRefused,
                pc.PeerAuthError) as error:
            return f"its node {node_id[:12]} did not answer ({error})"
        if "error" in doc:
            return f"its node {node_id[:12]} answered: {doc['error']}"
        far.forget(hex_)
        return None

    def remove_asked(self, hex_: str) -> bool:
        """*Not locked* (the state socket's thread: ``placement_group_loans
        .answer_borrower``). A driver of another host removes group ``hex_`` through this
        node (``_remove_far`` there): if it is this driver's own (``far_removable``), it
        is removed now as this driver's ``remove`` does; whether it was."""
        with self.owner.locked():
            removable = far_removable(self.groups.get(hex_))
        if removable:
            self.remove(hex_)
        return removable

    def _served_held(self) -> dict:
        """*Not locked* (one request to the head's actor service). ``{hex: record}`` of the
        groups it holds (``SVC_PG_TABLE``), or its last answer when it cannot be asked."""
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        try:
            self._far_held = self.owner.actors.table_in_service()
        except (ServiceUnavailable, OSError):
            pass
        return self._far_held

    def served_records(self) -> dict:
        """*Not locked* (a ledger read). In the node's actor service (``SVC_PG_TABLE``):
        ``{hex: ledger record}`` of the detached groups this owner holds reserved, for a
        driver on another host, whose node's ledger does not hold them."""
        with self.owner.locked():
            held = {h for h, g in self.groups.items() if g.detached and g.state != REMOVED}
        return {h: lease.group for h, lease in self.ledger.groups().items() if h in held}

    def _create_served(self, hex_: str, bundles, strategy: str, name: str) -> None:
        """*Not locked.* Ask the node's actor service to create and hold the detached group
        (``SVC_PG_CREATE``: it validates, checks the name, plans and reserves as for its own
        group); this driver keeps a record that follows the ledger (``_follow_served``) for
        ``ready()`` and the table. Raises what the service raised (a name taken).
        The link breaking (ServiceUnavailable: the service may or may not have the group
        now) is not the group's failure: the request is made once more on a new link, and
        the service answers for the group of that id (``serve_create`` is idempotent by
        id), so the handle stays usable, as Ray's does through a GCS reconnect. Only when
        that fails too is the record dropped, the error saying what may be left."""
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        group = _Group(hex_, bundles, strategy, name, True)
        group.served = True
        # Not asked about (SVC_PG_STATE) while its create is in flight: a state request
        # that reached the service first would find nothing and remove it here.
        group.asked_at = math.inf
        with self.owner.locked():
            self.owner.check_usable()
            self.groups[hex_] = group
        ask = self.owner.actors.create_group_in_service
        try:
            try:
                state = ask(hex_, bundles, strategy, name)
            except ServiceUnavailable as broken:
                try:
                    state = ask(hex_, bundles, strategy, name)  # a new link, the same id
                except ServiceUnavailable as again:
                    raise ServiceUnavailable(
                        f"The link to the node's actor service broke while it created "
                        f"detached placement group {name or hex_} ({broken}), and asking "
                        f"again failed ({again}). The service may hold the group: find it "
                        "with get_placement_group(name) or placement_group_table(), and "
                        "remove it with remove_placement_group.") from None
        except BaseException:
            with self.owner.locked():
                self.groups.pop(hex_, None)
            raise
        group.asked_at = time.monotonic()  # the service has it: asked about from now on
        if state == REMOVED:  # asked again after another driver removed it
            with self.owner.locked():
                group.state = REMOVED
                ready, group.ready_ids = group.ready_ids, []
                self._fail_ready(ready)
            return
        if state == CREATED:
            self._try(group)
        with self.owner.locked():
            if group.state == PENDING:
                self._arm_retry()

    STATE_ASK_S = 1.0  # how often a driver asks the service about its pending group

    def _follow_served(self, group: _Group) -> None:
        """*Not locked.* A served group that the service reserved (the ledger has it) is
        CREATED here: its ready objects are set, the work waiting for it is dispatched.
        Still pending: the service is asked every STATE_ASK_S whether it holds it yet
        (``SVC_PG_STATE``; another driver may have removed it with a handle passed to it,
        which the ledger cannot show of a group it never held): if not, it is removed
        here too (``_served_gone``)."""
        try:
            lease = self._lease_of(group.hex)
        except (OSError, ValueError):
            return
        if lease is None:  # still pending in the service: tried again every RETRY_S
            now = time.monotonic()
            if now - group.asked_at < self.STATE_ASK_S:
                return
            group.asked_at = now
            from miniray._private.owner.actor_link import ServiceUnavailable  # lazy

            try:
                held = self.owner.actors.group_state_in_service(group.hex)
            except (ServiceUnavailable, OSError):
                return  # asked again later
            if held is None and self._lease_of(group.hex) is None:
                self._served_gone(group)
            return
        far = self._far()
        with self.owner.locked():
            if group.state != PENDING:
                return
            group.state = CREATED
            group.nodes = list(lease.group.get("nodes") or ()) or None
            remote = self.owner.remote_nodes
            if remote is not None and group.nodes:  # its tasks there borrow room (step 8)
                remote.bundles.note_served(group.hex, group.nodes, everywhere=far)
            ready, group.ready_ids = group.ready_ids, []
            self._set_ready(ready, group)
            self.owner.wake_dispatch()

    def _served_gone(self, group: _Group) -> None:
        """*Not locked.* A served group the service no longer holds before it was
        reserved (removed by another driver): REMOVED here, as a removal here does it
        (ready objects fail, queued work in it fails), without asking the service."""
        with self.owner.locked():
            if group.state != PENDING:
                return
            group.state = REMOVED
            ready, group.ready_ids = group.ready_ids, []
            self._fail_ready(ready)
            self.owner.placement_group_removed(group.hex)
            remote = self.owner.remote_nodes
            if remote is not None:
                remote.bundles.removed(group.hex)
        self.owner.after_placement_removal()

    def served_state(self, hex_: str):
        """*Locked.* In the node's actor service (``SVC_PG_STATE``): CREATED or PENDING
        for a detached group this owner holds (or is creating), None otherwise."""
        group = self.groups.get(hex_)
        if group is None or group.state == REMOVED:
            return PENDING if hex_ in self._serving and hex_ not in self._doomed else None
        return group.state

    def served_named(self, name: str):
        """*Locked*, no I/O. In the node's actor service (``SVC_PG_FIND``): ``(hex, bundles,
        strategy)`` of the pending detached group called ``name`` that this owner holds,
        None otherwise (a reserved one is in the ledger, which the driver read first)."""
        for group in self.groups.values():
            if name and group.name == name and group.state == PENDING and \
                    group.hex not in self._doomed:
                return group.hex, group.bundles, group.strategy
        return None

    def _find_served(self, name: str):
        """*Not locked* (one request to the service). ``lookup``'s last try: a pending
        detached group called ``name`` that the node's actor service holds (Ray finds a
        pending group by name; ``ready()`` waits). This driver then keeps a record that
        follows it as its creator's does (``_follow_served``: ``ready()``, ``wait()``, the
        table, removal), and notes it ``served_pending`` (its actors go to the service
        until it is reserved). ``(hex, bundles)``, or None; the service holding none of
        that name pending, the ledger is read again (reserved meanwhile)."""
        if not name or self._cluster() is None or self._detached_home() != "service":
            return None
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        try:
            found = self.owner.actors.find_group_in_service(name)
        except (ServiceUnavailable, OSError):
            return None
        if found is None:
            return self._reserved_named(name)
        hex_, bundles, strategy = found
        cluster = self._cluster()
        with self.owner.locked():
            if hex_ not in self.groups:
                group = _Group(hex_, bundles, strategy, name, True)
                group.served = True
                self.groups[hex_] = group
                self._arm_retry()
            cluster.bundles.note_served(hex_, [])
        return hex_, bundles

    def needs_route(self, request) -> bool:
        """*Locked*, no I/O. Whether ``route_served`` has something to learn before an
        actor of placement ``request`` is created by a driver joined to a node: its group is
        neither this driver's own nor noted as served and reserved yet (one noted pending
        may be reserved since; a worker's request is then deferred off the lock to ask,
        ``requests.WorkerRequests.on_call``)."""
        parsed = placement.bundle_request(request)
        if parsed is None or self.owner.actors.link is None:
            return False
        group = self.groups.get(parsed[0])
        if group is not None and not group.served:
            return False
        remote = self.owner.remote_nodes
        return remote is None or parsed[0] not in remote.bundles.served

    def route_served(self, request) -> None:
        """*Not locked* (a ledger read, and one request to the service). Before an actor
        of placement ``request`` is created in a group that is not this driver's own: if
        the group is a detached one the node's actor service holds, it is noted (as
        ``lookup`` and ``elsewhere`` do), so that ``ActorManager.is_node_actor`` sends the
        actor there when it must go there: a bundle on another node, or a group not
        reserved yet (``served_pending``: the service places it once it is). A group
        noted pending is read again from the ledger at each actor: once reserved, it is
        routed by where the bundle is, as one reserved when first noted (a bundle of this
        node: created here). Not reserved, and not this driver's record: the service is
        asked again, at most every STATE_ASK_S, whether it still holds it; removed by
        another driver meanwhile, it is no longer noted (its actors stay here, where they
        fail as in a removed group, Ray's error, instead of going to the service). So a
        handle that came any way (an argument, a named actor's answer) routes alike."""
        parsed = placement.bundle_request(request)
        if parsed is None:
            return
        hex_ = parsed[0]
        group = self.groups.get(hex_)
        if group is not None and (not group.served or group.state == REMOVED):
            return  # this driver's own group, or one removed (not noted again)
        if self._cluster() is None or self._detached_home() != "service":
            return
        remote = self.owner.remote_nodes
        if remote is not None and hex_ in remote.bundles.served:
            return
        try:
            lease = self._lease_anywhere(hex_)  # a driver of another host's: noted as such
        except (OSError, ValueError):
            return
        if lease is not None:
            self._note_if_served(hex_, lease)
            return
        noted = remote is not None and hex_ in remote.bundles.served_pending
        if noted and (group is not None or time.monotonic() - remote.bundles.served_asked.get(
                hex_, -math.inf) < self.STATE_ASK_S):
            return  # still pending: the service places it once reserved (a group of
            #         this driver's record: ``_follow_served`` asks about it)
        cluster = self._cluster()
        if group is None:  # not this driver's: does the service hold it (pending)?
            from miniray._private.owner.actor_link import ServiceUnavailable  # lazy

            with self.owner.locked():  # stamped before asking: one creator thread asks,
                now = time.monotonic()  # and a service that cannot answer is asked
                asked = cluster.bundles.served_asked  # again only after STATE_ASK_S
                if now - asked.get(hex_, -math.inf) < self.STATE_ASK_S:
                    return
                asked[hex_] = now
            try:
                held = self.owner.actors.group_state_in_service(hex_)
            except (ServiceUnavailable, OSError):
                return
            if held is None:  # never, or removed by another driver since it was noted
                try:
                    gone = self._lease_of(hex_) is None
                except (OSError, ValueError):
                    return  # cannot tell now: asked again after STATE_ASK_S
                if gone or not noted:
                    with self.owner.locked():  # its actors stay here: Ray's error
                        if gone:
                            cluster.bundles.served_pending.discard(hex_)
                        cluster.bundles.served_asked.pop(hex_, None)
                return
        with self.owner.locked():
            cluster.bundles.note_served(hex_, [])
            cluster.bundles.served_asked[hex_] = time.monotonic()

    def _remove_in_service(self, hex_: str) -> None:
        """*Not locked.* Before a removal here: a group the node's actor service may hold
        (this driver's served one, or one it does not know) is removed there
        (``SVC_PG_REMOVE``: its actors die, its bundles on every node are released). A
        service that cannot be reached: the ledger release that follows is what other
        drivers see."""
        group = self.groups.get(hex_)
        if group is not None and not group.served:
            return
        link = self.owner.actors.link
        if link is None or self._cluster() is None:
            return
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        try:
            self.owner.actors.remove_group_in_service(hex_)
        except (ServiceUnavailable, OSError):
            pass

    def _note_if_served(self, hex_: str, lease) -> bool:
        """*Not locked.* Whether the group of this ledger ``lease`` has bundles on other
        nodes held by a lender this driver borrows from: a detached group that the node's
        actor service holds, or another driver's own group, that driver listening on its
        state socket (``_lender_of``, ``remote_bundles`` step 9); if so, noted
        (``RemoteBundles.note_served``): this driver's tasks there borrow room from the
        lender, its actors there are the service's (a detached group's only). For a
        driver on a member (``_far``), a group the head's service holds is noted whatever
        its bundles' nodes: its own node's ledger provides none of them, so its tasks
        borrow room in each."""
        if isinstance(lease, FarLease):  # a driver of another host: through its node
            nodes = list(lease.group.get("nodes") or ())
            cluster = self._cluster()
            if not nodes or cluster is None:
                return False
            with self.owner.locked():  # its every bundle borrowed: this ledger holds none
                cluster.bundles.note_served(hex_, nodes, ("node", lease.node_id, hex_),
                                            everywhere=True)
            return True
        record = lease.group
        nodes = list(record.get("nodes") or ())
        if self._far() and record.get("detached") and nodes and hex_ in self._far_held:
            cluster = self._cluster()
            with self.owner.locked():
                cluster.bundles.note_served(hex_, nodes, everywhere=True)
            return True
        lender = None
        if record.get("detached"):
            served = self._detached_home() == "service"
        else:
            lender = self._lender_of(lease)
            served = lender is not None
        if not served or all(n == self.node_id for n in nodes) or self._cluster() is None:
            remote = self.owner.remote_nodes
            if remote is not None and hex_ in remote.bundles.served_pending:
                with self.owner.locked():  # reserved here only: the ledger provides it
                    remote.bundles.served_pending.discard(hex_)
                    remote.bundles.served_asked.pop(hex_, None)
            return False
        cluster = self._cluster()
        with self.owner.locked():
            cluster.bundles.note_served(hex_, nodes, lender)
        return True

    def _lender_of(self, lease) -> str | None:
        """*Not locked* (a stat). The state socket of the driver of this node that holds
        the (not detached) group of ``lease``, another than this one, when it listens:
        it lends room in the group's bundles on other nodes (``remote_bundles`` step 9);
        None otherwise."""
        from miniray._private.transport import state_socket  # lazy: a borrower's only

        session_dir = self.owner.hello_info.get("session_dir")
        if not session_dir or lease.holder_pid == self.pid:
            return None
        path = state_socket.socket_path(session_dir, lease.holder_pid)
        return path if os.path.exists(path) else None

    def _check_borrowers(self, remote) -> None:
        """*Not locked* (reads ``/proc``). The loans this driver made to other drivers of
        its node whose process is gone come back (``remote_bundles`` step 9: a borrower
        that ended without giving them back, killed mid-task)."""
        with self.owner.locked():
            tokens = [loan[2] for loan in remote.bundles.lent_out.values()] + list(
                remote.bundles.actor_loans_unsent.values())
        gone = gone_borrowers(tokens, procinfo.is_alive)
        if gone:
            with self.owner.locked():
                for token in gone:
                    remote.bundles.drop_loans(token)

    def serve_create(self, hex_: str, bundles, strategy: str, name: str) -> str:
        """*Not locked.* In the node's actor service (``SVC_PG_CREATE``): create the
        detached group as this owner's own ("span"); CREATED or PENDING. Idempotent by
        id (a driver whose link broke asks again, ``_create_served``): a group of that id
        already asked for is not created twice; its state is the answer (REMOVED once
        removed). Which request creates it is decided under the lock."""
        with self.owner.locked():
            known = self.groups.get(hex_)
            first = known is None and hex_ not in self._serving
            if first:
                self._serving.add(hex_)
        if not first:
            if known is not None and known.state == REMOVED:
                return REMOVED
            return CREATED if self.state_of(hex_) == CREATED else PENDING
        try:
            self.create(hex_, bundles, strategy, name, True)
        finally:
            with self.owner.locked():
                self._serving.discard(hex_)
                doomed = hex_ in self._doomed  # removed while it was being created
                self._doomed.discard(hex_)
        if doomed:
            self.serve_remove(hex_)
            return REMOVED
        return CREATED if self.state_of(hex_) == CREATED else PENDING

    def serve_remove(self, hex_: str) -> bool:
        """*Not locked.* In the node's actor service (``SVC_PG_REMOVE``): remove the group
        if this owner holds it; whether it did. Two drivers may ask at once (each request
        on a thread of its own): which one removes it is decided under the lock (the first
        marks it REMOVED), and only that one acts, after it."""
        with self.owner.locked():
            group = self.groups.get(hex_)
            if group is None and hex_ in self._serving and hex_ not in self._doomed:
                self._doomed.add(hex_)  # being created: removed once it is (serve_create)
                return True
            if group is None or group.state == REMOVED:
                return False
            group.state = REMOVED  # a second request, now or later, finds it removed
        self.remove(hex_)
        return True

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

    def elsewhere(self, request) -> str | None:
        """*Not locked* (a ledger read). Why a task of this (rewritten) placement
        ``request`` can never run in this driver: its bundle (for -1, every bundle) of a
        group reserved by another driver is held on another node by that driver's link
        (``remote_bundles``), and that driver does not lend (no state socket); None: it
        may run here. The caller skips it for this driver's own groups, whose remote
        bundles run its tasks. A detached group that the node's actor service holds, or
        a group of a driver that lends, is noted instead (``_note_if_served``: its tasks
        there borrow room from the service or that driver) and None returned."""
        parsed = placement.bundle_request(request)
        if parsed is None:
            return None
        pg_hex, index, _base = parsed
        lease = self._lease_anywhere(pg_hex)
        if lease is None:
            return None
        record = lease.group
        if isinstance(lease, (ServedLease, FarLease)) and self._note_if_served(pg_hex, lease):
            return None  # the head's service or a driver of another host holds it: its
            #              tasks borrow room in each bundle
        nodes = list(record.get("nodes") or [])
        bound = placement.bundle_elsewhere(index, nodes, self.node_id)
        if not bound:
            return None
        name = record.get("name") or pg_hex
        what = f"bundle {index}" if index >= 0 else "any bundle (-1)"
        where = ", ".join(f"bundle {i} on node {nodes[i]}" for i in bound)
        local = [i for i, node in enumerate(nodes) if node == self.node_id]
        hint = (f", or schedule it into a bundle of this node ({local})" if local else "")
        if self._note_if_served(pg_hex, lease):
            return None  # its tasks there borrow room from its lender
        if record.get("detached"):
            return (f"The task asks for {what} of detached placement group '{name}' "
                    f"({where}); those bundles are held by an actor service this driver "
                    f"cannot borrow from. Run the work in an actor with a name or "
                    f"lifetime='detached' (the service runs those in any bundle of the "
                    f"group){hint}.")
        return (f"The task asks for {what} of placement group '{name}' ({where}); only the "
                f"driver that created the group (job {record.get('job_id') or '?'}) can run "
                "work in its bundles on other nodes, which it holds over its own links, or "
                "lend their room to the other drivers of its node, which it does not (its "
                f"state socket is not there). Create the group in this driver{hint}.")

    def _move_lent(self, remote, moved) -> None:
        """*Not locked.* The actors lent room in bundles just placed again
        (``remote_bundles.replace``: ``[(actor id, NodeEntry or None, GPU ids, here)]``):
        the node's actor service is told where each one's room is now, and restarts it
        there (``remote_bundles`` step 7). A bundle now on this node (``here``): when
        the service is the head's on another host, it leases the room here (told so with
        this node's entry; the loan ends: this node's ledger provides the room), else
        its own ledger places it (nothing to tell). One with no room there, one the
        service will not restart there, or a service that did not answer: its loan ends
        and it is killed there (``_kill_lent``), as an actor that cannot follow its
        bundle."""
        far = None
        dropped, ended = [], []
        for actor_id, entry, gpu_ids, here in moved:
            if here:
                if far is None:
                    far = self.owner.actors.link.on_another_host()
                if not far:
                    continue  # the service's ledger is this node's: it places it
                entry = remote.alive_entry(remote.local)
            told = False
            if entry is not None:
                try:
                    told = self.owner.actors.lent_moved_in_service(actor_id, entry, gpu_ids,
                                                                   here)
                except (ValueError, RuntimeError, OSError):  # refused, or the link blipped
                    told = False
            if not told:
                dropped.append(actor_id)
            elif here:
                ended.append(actor_id)
        with self.owner.locked():
            for actor_id in ended:  # no room of a remote bundle is lent any more
                remote.bundles.forget_loan(actor_id)
            for actor_id in dropped:
                remote.bundles.end_loan(actor_id)
        if dropped:
            self._kill_lent([(actor_id, "") for actor_id in dropped])

    def _kill_lent(self, lent) -> None:
        """*Not locked.* Kill these lent actors in the node's actor service, no restart
        (``remote_bundles`` step 7): ``lent`` is ``[(actor id, group)]``, group the hex of
        their removed group (they end there as actors of a removed group, with Ray's error
        for it), or "" when their bundle went to another node than this one after its node
        died (killed as by ``ray.kill``). A kill the service did not take
        (ServiceUnavailable, OSError: its link blipped) is asked again from a thread,
        KILL_LENT_TRIES in all, KILL_LENT_PAUSE_S apart and doubling: for a far lender
        the service learns of a removal only from this or its own ask of this node
        (``_lenders_gone``), and a killed actor's kill is a no-op there."""
        left = self._kill_lent_once(lent)
        if left:
            threading.Thread(target=self._kill_lent_again, args=(left,), daemon=True,
                             name="miniray-kill-lent").start()

    def _kill_lent_once(self, lent) -> list:
        """*Not locked.* The ones of ``lent`` the service could not be asked to kill."""
        left = []
        for actor_id, group in lent:
            try:
                self.owner.actors.kill_in_service(actor_id, True, group)
            except ValueError:  # refused as malformed: asking again would not help
                pass
            except (RuntimeError, OSError):  # ServiceUnavailable: the link blipped
                left.append((actor_id, group))
        return left

    def _kill_lent_again(self, lent) -> None:
        """*Not locked*, its own thread: ``_kill_lent_once`` again after pauses doubling
        from KILL_LENT_PAUSE_S. This driver's shutdown (its link to the service closed:
        ``ActorLink.leaving``) ends it at once: the service ends a leaving driver's named
        actors itself."""
        leaving = self.owner.actors.link.leaving
        pause = KILL_LENT_PAUSE_S
        for _ in range(KILL_LENT_TRIES - 1):
            if leaving.wait(pause) or self.owner.closed:
                return
            pause *= 2
            lent = self._kill_lent_once(lent)
            if not lent:
                return
        print(f"miniray: could not kill {len(lent)} named actor(s) of a removed or "
              f"moved placement group bundle in the actor service "
              f"({', '.join(a.hex()[:12] for a, _group in lent)}): it did not answer "
              f"{KILL_LENT_TRIES} times; kill them with ray.kill once it is back.",
              file=sys.stderr, flush=True)

    def _lenders_gone(self, remote) -> set:
        """*Not locked* (a view read; one request per lending driver's node, on this
        owner's link there). In the node's actor service: the groups it holds actors of in
        room lent by a driver of another node (``lender_watched``, ``remote_bundles`` step
        7) that are gone (``lenders_gone``): that node's ledger no longer holds the group
        (``RemoteNodeClient.groups``, step 14 of ``node/remote_drivers.py``; removed, or its
        driver ended), or that node is dead. Why the service asks, not the actor's own
        driver: a detached actor of another driver outlives that driver (step 9), and its
        end with the group is then the service's to see; the node's ledger answers for a
        driver that died too, whose own watch died with it."""
        from miniray._private.transport import peer_channel as pc  # lazy: multi-host only
        from miniray._private.transport.remote_node import RemoteLeaseError  # lazy: as above
        from miniray.exceptions import NodeDiedError  # lazy: as remote_nodes

        with self.owner.locked():
            watched = dict(remote.bundles.lender_watched)
        if not watched:
            return set()
        try:
            view = {e.node_id: e for e in remote.view(fresh=True)}
        except (OSError, ValueError):
            return set()
        if not view:  # no view file (the node stopping): it says nothing of any node
            return set()
        held: dict = {}
        for node_id in sorted(set(watched.values())):
            groups = [h for h, n in watched.items() if n == node_id]
            entry = view.get(node_id)
            if entry is None or not entry.alive:
                held.update(dict.fromkeys(groups, GONE))
                continue
            try:
                reserved = remote.client(entry).groups(timeout=LENDER_ASK_S)
            except NodeDiedError:
                held.update(dict.fromkeys(groups, GONE))
                continue
            except (RemoteLeaseError, TimeoutError, OSError, pc.PeerRefused,
                    pc.PeerAuthError):
                continue  # not known now (None): asked again at the next turn
            held.update({h: h in reserved for h in groups})
        return set(lenders_gone(watched, held))

    def _check_loans(self, remote) -> None:
        """*Not locked.* The room of this driver's named and detached actors in its remote
        bundles (``remote_bundles`` step 7), and of other drivers' actors there once the
        service took them, comes back once the node's actor service no longer holds the
        actor alive (killed, out of scope, its node died): one request for all of them
        (SVC_ALIVE; ``loans_ended``)."""
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        with self.owner.locked():  # an actor another driver is still creating: not yet
            unsent = remote.bundles.actor_loans_unsent
            asks = [actor_id for actor_id in remote.bundles.loans if actor_id not in unsent]
        if not asks:
            return
        try:
            alive = set(self.owner.actors.alive_in_service(asks))
        except (ServiceUnavailable, OSError):
            return  # asked again at the next turn
        with self.owner.locked():
            dropped = remote.bundles.actor_loans_dropped
            for actor_id in alive:  # the service holds it: a kept loan from now on
                dropped.pop(actor_id, None)
            for actor_id in loans_ended(asks, alive, dropped, time.monotonic()):
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
        if not view:  # no view file (the node stopping): it says nothing of any node
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
                moved = remote.bundles.replace(group.hex, parts, here) \
                    if group.state == CREATED else None
                if moved is not None:
                    for i, node in plan.items():
                        nodes[i] = node
                    group.nodes = nodes
            if moved is None:
                remote.bundles.release_parts(parts)
                return
            self._move_lent(remote, moved)
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
