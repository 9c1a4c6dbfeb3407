"""The parts of this driver's placement groups on other nodes: their leases and their tasks.

Owns: reserving a group's bundles that ``node_pick.plan_bundles`` put on other nodes (one
remote lease per bundle, of the bundle's resources, held on this driver's link to that
node for the group's life), releasing them, and the tasks scheduled into such a bundle:
what is free in each bundle (``placement.pick_bundle``, pure), the tasks waiting for room
in one, starting a task there (``RemoteNodes.run_in_bundle``: a worker of that node, no
lease of its own) and giving its room back when it ends, and failing and killing them
when the group is removed; and the loans of room in a group's bundles on other nodes to
another driver's tasks: a detached group's, which the node's actor service holds (step 8),
and a driver's own group's, which that driver lends to the other drivers of its node (step
9) and, through its node, to drivers of other hosts (step 10; both sides of each).
Does not own: the plan (``core/node_pick.plan_bundles``), the group's record, its local
bundles and its ready objects (``placement_groups.py``, the node's ledger), the link, its
leases and the remote workers (``remote_nodes.py``, ``transport/remote_node.py``).
Called by: ``placement_groups.PlacementGroups`` (``reserve``, ``release``, not locked;
``adopt``, ``removed``, locked), the owner's offload hook (``submit``, locked),
``RemoteNodes.spill`` (``spill``, locked), ``RemoteNodes._run`` (``done``, locked),
``actors.ActorManager`` (``lend``, ``end_loan``, ``borrow``: step 7, locked),
``RemoteNodes._retry`` (``requeue``, locked), ``PlacementGroups._check_bundle_nodes`` /
``_replace`` (``find_lost``, ``replace``, locked), ``remote_actors.RemoteActors``
(``holds``, ``take``, ``give_back``, ``lose_bundle``, locked), ``placement_group_nodes``
(``note_served``, ``end_loan``, ``forget_loan``, locked; ``drop_loans``: step 9), the
owner (``serves``, locked), the node's actor service (``lend_room``, ``return_room``,
``drop_loans``: step 8, locked) and the driver's state socket
(``placement_group_loans.answer_borrower``: step 9).

Steps for group G of driver D with bundle i planned on node N::

    1. reserve (not locked): D's client of N, ("lease", bundle i's resources) tagged
       "placement group <name> bundle i"; a denial (N full now) or a lost link releases
       what was taken for G and G stays pending (tried again by the caller).
    2. adopt (locked): G's remote bundles become usable; the caller then records G in
       the local ledger (every bundle's node), which is what ``ready()`` waits for.
    3. submit (locked): a task whose rewritten request names bundle i (or "any bundle"
       of a group with no local bundle; with some, it queues here, and ``spill`` takes it
       when this node's bundles have no room now and a remote one has) waits in G's
       queue; ``_pump`` starts each one
       whose bundle has room (``pick_bundle``), taking its request from the bundle's free
       amounts, and ``RemoteNodes.run_in_bundle`` runs it on N without a lease: the
       bundle's lease holds N's resources, and a task's end never releases it.
    4. done (locked): the task's request goes back to its bundle; ``_pump`` again.
       An actor in such a bundle (``remote_actors``: ``take`` when placed, ``give_back``
       when its worker ends) holds its ``held`` request of the bundle for its life.
    5. removed (locked) then release (not locked): waiting tasks fail with
       TaskPlacementGroupRemoved, running ones fail with it and their workers are killed
       (as for local bundles), then each bundle's lease is released on its node. A driver
       that ends closes its links: each node releases that link's leases itself.
    6. lose / find_lost (locked): bundle i's node died (dead in the view, its link lost,
       or a task's thread saw it die): i takes no task; a task that ran there and may be
       retried waits first in G's queue (``requeue``), and so does an actor's restart
       (``lose_bundle``; ``take`` finds no room in a lost bundle, or one whose link is
       lost). ``PlacementGroups._replace`` plans i again on any alive node with room
       (``node_pick.replan_bundles``): on another node it reserves it as in step 1; on D's
       own node D's ledger holds it under the group's number i (``ledger.grow_group``).
       ``replace`` (locked) adopts the new lease and starts the waiting tasks, or, for a
       bundle now on D's node, drops i from G's remote bundles and hands the tasks
       waiting for i (or for any bundle) to the owner's queue; a restarting actor is
       then placed by the ledger, as in a local bundle.

7. A named or detached actor of D in bundle i (the node's actor service S owns those, and
   does not hold D's leases): D takes the actor's room in i (``take``, as for its own
   actor), rewrites "any bundle" to i, and sends CREATE with ``spec.lent`` = (N's
   ``NodeEntry``, its GPU ids of i, D's node id when it is not S's (far) else "",
   borrowed: False, D's own actor). S (on D's node) ``borrow``s: a ``RemoteBundle`` of
   that actor's room only, with no lease (``lease_id`` None: D's lease holds N's room),
   and places the actor in it as in step 3's actor path, on S's own link to N. D keeps
   the room while S holds that actor alive (``lend``; the group watch asks S for all of
   them in one SVC_ALIVE, ``loans`` and ``end_loan``). S's own group watch ends the actor
   when the group is removed or D's group lease goes (D gone). N's death: a restart (per
   ``max_restarts``) goes where step 6 places the bundle again. On another node M, D
   lends the actor the same room there before any task takes it (``replace``:
   ``_move_loans``) and tells S (SVC_LENT_MOVED: M's entry, the GPU ids); S borrows it
   and places the restart there (``lent_moved``; told before S saw N die, it is kept
   for ``follow_ledger``); S answering False (it holds no lent room of that actor:
   dead, unknown, or no restart left), no room there, or no answer: D ends
   the loan and kills the actor in S (``_kill_lent``). On D's own node, S's ledger
   places it (``follow_ledger``). A bundle of D's own group on D's own node,
   with S the head's on another host (D on a member): S's ledger does not hold it, so D
   lends nothing and ``spec.lent`` says so (its fifth field, ``on_lender_node``: D's
   ``_lend_here``), and S leases the actor's room on D's node from the group's bundle
   there (``leased_there``), asking that node whether the group lives, as in step 9.
   A driver on another host than S (S is then
   the head's, D a member's driver: ``lent`` names D's node) lends the same way, but S
   cannot read D's node's ledger: S's watch asks D's node instead, on S's link there,
   whether its ledger holds G's live lease (``lender_watched``: group -> that node;
   ``PlacementGroupNodes._lenders_gone``, peering step 14 "groups"), and ends the actor
   when it does not (removed, or D gone) or when that node is dead; D also kills the
   actor in S when its watch finds the group removed by another driver (``_kill_lent``,
   as its own removal does), and D's end ends it as a named actor's creator leaving
   does. After N's death its restart waits out of S's placer queue (``awaits_lender``:
   S's ledger never holds the bundle) for D's SVC_LENT_MOVED: the bundle on another
   node, as above, or on D's own node (``here``: S leases the room there, as for
   ``_lend_here``). A
   detached actor of D there ends with D's group as a named one does: S ties it to D
   (``Lifetimes.tied``: D leaving kills it; no handle's release ends it before), as
   Ray's group removal at its job's end kills it.

8. A task of any driver E in a bundle on another node of a detached group that the node's
   actor service S holds (docs/detached-placement-groups.md): E knows the group as served
   (``note_served``: each bundle's node, from the ledger's record); ``submit`` (or
   ``spill``, for "any bundle" when this node's bundles are full) puts the task in
   ``served_waiting``, and E's borrower thread (``_borrow_loop``) asks S for room
   (``SVC_PG_LEND``); S's ``lend_room`` takes it from its bundle as for a task of its own
   and answers a loan (``(loan id, index, NodeEntry, GPU ids)``), None (no room now: asked
   again every LOAN_POLL_S) or "here" (the bundle is on this node now: the owner's queue).
   ``_lent`` runs the task on a lease-less ``RemoteBundle`` of the loan, on E's own link;
   ``done`` queues ``SVC_PG_RETURN`` (S: ``return_room``); ``requeue`` (the node died)
   makes it wait for a new loan; ``removed`` fails the waiting ones. S drops the loans of
   a driver whose link closed (``drop_loans``) and a removed group's. An actor of E
   there (``serves``) is created in S, as a named one is. A driver on a member, whose S
   is the head's on another host, borrows in every bundle of such a group, its own
   node's too (``served_everywhere``); S's "here" (a bundle on the head) runs its task
   on the head under a lease of its request there (``_run_on_head``). For "any bundle",
   such a driver's S answers "here" too when none off the head has room now and one on
   the head has (``lend_room`` with ``far``).

9. A task of another driver E of D's node (same host, same user) in a bundle on another
   node of D's own group (not detached): as step 8, with D as the lender. E finds the
   group in the ledger (by name, by a handle passed to it, or when a lease is refused:
   ``_note_if_served``), and D by the group lease's holder pid: D's state socket
   (``lenders``). E's borrower thread asks D (``pg_lend`` on that socket); D's
   ``answer_borrower`` runs the same ``lend_room`` on its own bundles (D's waiting tasks
   and E's loans share each bundle's room), the token being E's pid and start time as
   the socket's SO_PEERCRED says; ``pg_return`` gives a loan back, from that pid only.
   E keeps each loan as (lender, loan id). E's exit: D's group watch finds E's process
   gone and drops its loans (``gone_borrowers``). D removes the group, or D ends (its
   state socket closes first, then its group lease goes): E's watch no longer finds the
   group in the ledger and fails E's tasks in it with TaskPlacementGroupRemoved, killing
   those running (``removed``). An actor of E there (named or not) is created in S
   with room D lends for the actor's life, as step 7 does for D's own named actors:
   E's ``serves`` sends it to S, and E's ``_borrow_for_actor`` asks D (``pg_lend``
   with the actor's id: D's ``lend_actor_room`` is step 7's ``take`` and ``lend``), sets
   ``spec.lent`` (borrowed: True) and creates it in S, which ``borrow``s as in step 7;
   E then tells D whether S took it (``pg_kept``). D's "here" (the bundle is on D's
   node: no loan, that node's ledger provides it) leaves it to S's ledger when S is D's
   node's; else (S the head's, D on a member) ``spec.lent`` says so (its fifth field:
   ``on_lender_node``) and S leases the actor's room on D's node from the group's bundle
   there, as for an actor on another node (``leased_there``), watching the group as for
   a far lender (``lender_watched``). D keeps the room while S holds the
   actor alive (the watch's SVC_ALIVE, as for its own), from the moment E says S took
   it; until then the loan is E's (``actor_loans_unsent``: given back when S did not
   take it; when E goes before saying, S may hold the actor already: the room is kept
   while S holds it alive, as a kept loan, and given back once S does not after
   DROPPED_LOAN_GRACE_S, ``actor_loans_dropped``, a CREATE still on its way to S
   included). The actor ends as a step-7
   actor does: killed, out of scope or E's exit (S ends it; D's watch sees it gone),
   the group's removal (D kills it in S, S's watch too), D's end (S's watch: D's group
   lease is gone from D's node's ledger, S's own, or, S being the head's and D on a
   member, as D's node answers it: step 7's far watch, which serves this case whether E
   runs or not); after N's death it restarts per step 7. A detached one (borrowed) is
   not tied to E: E's exit leaves it, as Ray keeps such an actor until its group ends,
   and the group's end is S's watch's to see (which is why S asks D's node, and not
   E's watch kills it: E may be gone). An actor E creates while the group goes (D
   removes it, or D ends: D answers no room, or its socket is closed) does not wait
   out ``LEND_WAIT_S``: once E's node's ledger no longer holds the group, E creates it
   in S without a loan, and S's placer ends it as an actor of a removed group never
   started (ActorUnschedulableError on its calls, Ray's error for it). Why S and not
   E itself on a lease-less bundle of the loan (as its tasks): a named actor of E is
   S's in any case, so S serves both kinds with step 7's one path (``spec.lent``,
   ``borrow``, the SVC_ALIVE watch, the kill at removal, the restart after N's death),
   where E running them would add a second path for each. A driver on another host
   than D: step 10. E borrows nothing when D's state socket is missing (D could not
   serve it): its task fails at once (``placement_group_nodes.elsewhere``).
   Why D's state socket and not the actor service: S would have to ask D over D's link
   (a request from S to a driver, which that link does not carry) and wait for it on
   its I/O thread, or hold a copy of D's room; the state socket already answers each
   driver of the session, checks the peer's uid, and names the peer's pid, which is the
   borrower's token D needs to drop a dead borrower's loans. So ``lend_room``,
   ``return_room``, ``drop_loans`` and the borrower's thread serve both lenders, with one
   meaning each.

10. A task of a driver E on another host than D (E's node is B, D's is A) in any bundle
   of D's own group: as step 8 for a driver on a member, every bundle borrowed (B's
   ledger holds none of them: ``served_everywhere``), with D as the lender, reached
   through A. E finds the group in A's ledger (``far_groups.py``: ``groups`` on E's
   link to A, step 14 of ``node/remote_drivers.py``; by name, in the table, or by a
   handle when its task's lease is refused: ``_note_if_served`` with a ``FarLease``),
   and notes its lender as ``("node", A, G)``. E's borrower thread sends ``pg_lend`` and
   ``pg_return`` on that link (``pg_loan``, step 15 there); A's ``loan_relay`` asks the
   group's holder in A's ledger, D, on D's state socket from a thread, naming the
   borrower by E's link (``far_token``: the link's name, with E's IP and pid, and its
   serial on A), which D accepts only from A's pid; D's ``answer_borrower`` runs the
   same ``lend_room``. A loan in a bundle on another node (B included) runs on E's
   link to that node, as step 8's; "here" (the bundle is on A) runs the task on A
   under a lease of its rewritten request, which A's ledger provides from D's group
   (``_run_on_head``, on the lender's node). E's exit, or its host's death, closes its
   link to A (EOF, or TCP keepalive): A tells D (``pg_drop``), which drops E's loans.
   D removes the group, or D ends (its group lease goes from A's ledger): E's watch
   asks A for the groups it uses (``_far_reserved``) and fails E's tasks in G with
   TaskPlacementGroupRemoved, killing those running (``removed``); A's death drops
   A's groups from what E knows, with the same effect. E removes G
   (``remove_placement_group``) the same way: ``pg_remove`` on its link to A, which A
   carries to D (``_remove_far``, which says why this and not a request A answers
   itself; A releases G in its ledger itself when D does not listen), and D runs its
   own removal (``remove_asked``: its work in G ends, every node's part is released,
   the other borrowers see G gone as above), before E ends its own work in G. An actor
   of E there (named or not, detached or not) is step 9's, through A: E's ``serves``
   sends it to S (the head's: E's own node's service when E runs on the head), E's
   ``_borrow_for_actor`` asks D through A (``pg_lend`` with the actor's id and
   ``held``, ``ask_driver``; A's relay carries those fields and ``pg_kept``), D's
   ``lend_actor_room`` takes its room for the token A names, and E creates it in S with
   ``spec.lent`` (borrowed: True), then tells D through A whether S took it
   (``pg_kept``). ``spec.lent``'s third field names D's node A when A is not S's node
   (``lender_watch``): S's watch then asks A whether G lives (step 7's far watch,
   ``_lenders_gone``); when A is the head, S reads G's lease in its own ledger (step 9's
   watch on one node). D keeps the room while S holds the actor alive (its watch's
   SVC_ALIVE; D and E share S, the head's), and before ``pg_kept`` the loan is E's (A's
   ``pg_drop`` on E's link closing gives it back). The actor ends as step 9's: killed,
   out of scope, E's exit or its host's death (E's link to S closes: S ends it, a
   detached one excepted), the group's removal (D kills it in S; S's watch too), D's
   end (S's watch). D's "here" (the bundle is on A) is step 9's: S's ledger places it
   when A is S's node (the head), else S leases its room on A (``leased_there``).
   Why through A and not the head: A holds the group's record and D's socket, both are
   reached on the link E opens to A for its tasks anyway, and A sees that link close
   when E or its host dies, which D, on another host, cannot see itself.

A task or an actor takes its share of a bundle's GPUs (``pick_gpus`` on each GPU's free
units, as the node's ledger picks devices): a task's given back when it ends, an actor's
(its ``held`` GPUs) when its worker ends.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from miniray._private.core import placement
from miniray._private.owner.placement_group_loans import BundleLoans
from miniray._private.owner.tasks import T_DONE, T_WAITING

__all__ = ["RemoteBundle", "RemoteBundles"]


def on_lender_node(lent) -> bool:
    """Pure. Whether ``spec.lent`` places its actor in a bundle on the lending driver's
    own node (its fifth field, steps 9 and 10): the service leases its room there, from
    the group's bundle in that node's ledger, instead of a loan of a ``RemoteBundle``.

    >>> on_lender_node(("entry", [], "a", True)), on_lender_node(("entry", [], "a", True, True))
    (False, True)
    """
    return lent is not None and len(lent) > 4 and bool(lent[4])


class RemoteBundle:
    """One bundle of a group held on another node: its lease there and what is free in it."""

    __slots__ = ("pg_hex", "index", "resources", "entry", "client", "lease_id", "gpu_ids",
                 "free", "gpu_free", "gpus_taken", "loan")

    def __init__(self, pg_hex: str, index: int, resources: dict, entry, client,
                 lease_id: str, gpu_ids: list):
        self.pg_hex = pg_hex
        self.index = index
        self.resources = dict(resources)
        self.entry = entry  # the node's cluster_view.NodeEntry
        self.client = client  # the RemoteNodeClient whose link holds the lease
        self.lease_id = lease_id
        self.gpu_ids = [str(g) for g in gpu_ids]
        self.free = dict(resources)
        # Each of its GPUs' free units: a task takes its own share (``placement.pick_gpus``).
        self.gpu_free = [placement.INSTANCE_UNIT] * len(self.gpu_ids)
        self.gpus_taken: dict = {}  # task -> its (position, units) of gpu_free
        self.loan = None  # the service's loan id: one task's room lent by it (step 8)

    def take_gpus(self, task, amount: float) -> list[str]:
        """*Locked.* ``task``'s devices of this bundle for ``amount`` GPUs (the caller
        checked they are free: ``pick_bundle`` with ``gpus``); [] for none."""
        picked = placement.pick_gpus(self.gpu_free, amount) or []
        for position, units in picked:
            self.gpu_free[position] -= units
        if picked:
            self.gpus_taken[task] = picked
        return [self.gpu_ids[position] for position, _units in picked]

    def gpus_of(self, holder) -> list[str]:
        """*Locked.* The devices ``holder`` (a task, an actor's id) has of this bundle."""
        return [self.gpu_ids[position] for position, _units in self.gpus_taken.get(holder, ())]

    def give_gpus(self, task) -> None:
        """*Locked.* ``task`` left: its devices' units come back."""
        for position, units in self.gpus_taken.pop(task, ()):
            self.gpu_free[position] += units

    @property
    def node_id(self) -> str:
        return self.entry.node_id


class RemoteBundles(BundleLoans):
    """Given the ``owner`` and its ``RemoteNodes`` (``nodes``): see the module docstring.
    Step 8's methods are its mixin's (``placement_group_loans.py``)."""

    def __init__(self, owner, nodes):
        self.owner = owner
        self.nodes = nodes
        self.groups: dict[str, dict[int, RemoteBundle]] = {}  # hex -> index -> bundle
        self.has_local: dict[str, bool] = {}  # hex -> whether some bundle is local
        self.waiting: dict[str, collections.deque] = {}  # hex -> tasks waiting for room
        self.running: dict[str, set] = {}  # hex -> tasks running in its remote bundles
        self.lost: dict[str, set] = {}  # hex -> indexes of bundles whose node died (step 6)
        self.loans: dict[bytes, tuple] = {}  # actor id -> (bundle, held): lent (step 7)
        self.borrowed: dict[bytes, RemoteBundle] = {}  # actor id -> its lent room (step 7)
        # Step 6 for step 7's actors, S's side: a lent actor whose node died, waiting to
        # learn where its driver lends its room now (actor id -> (hex, its ``spec.lent``
        # before): ``follow_ledger``), and a new place told before S saw that death
        # (actor id -> (hex, its new ``spec.lent``): ``lent_moved``)
        self.followed: dict[bytes, tuple] = {}
        self.moved_to: dict[bytes, tuple] = {}
        # Steps 9 and 10, S's side: actors of another driver's group in a bundle on the
        # lending driver's own node, not S's: actor id -> (hex, that node's NodeEntry); S
        # leases each one's room there, from the group's bundle in that node's ledger
        self.on_lender_node: dict[bytes, tuple] = {}
        # Step 7, S's side: groups lent by a driver whose node is not S's, each with that
        # node's id (their ledger is not S's: S's watch asks that node whether the group
        # lives, ``PlacementGroupNodes._lenders_gone``; that driver's watch ends them too)
        self.lender_watched: dict[str, str] = {}
        # Step 8, a driver's side: detached groups the node's actor service holds, each
        # bundle's node (hex -> [node id]); the tasks waiting for a loan of room in one of
        # their bundles on another node; loans to give back; the thread that asks.
        self.served: dict[str, list] = {}
        self.served_pending: set[str] = set()  # served, not reserved yet: actors go to S
        # served by the head's service, on another host: every bundle's room is borrowed
        self.served_everywhere: set[str] = set()
        self.served_asked: dict[str, float] = {}  # hex -> when S last said it holds it
        self.served_waiting: dict[str, collections.deque] = {}
        # Step 9: served groups that another driver of this node lends (hex -> its state
        # socket); the others' lender is the service.
        self.lenders: dict[str, str] = {}
        self._returns: list = []
        self._borrower: threading.Thread | None = None
        self._wake = threading.Event()
        # Step 8, the service's side: loan id -> (bundle, the task's request, driver token).
        self.lent_out: dict[int, tuple] = {}
        # actor id -> borrower token: an actor's loan (``lend_actor_room``) the borrower has
        # not yet said the service took (``actor_kept``); the watch does not ask about it
        self.actor_loans_unsent: dict[bytes, tuple] = {}
        # actor id -> monotonic deadline: such a loan whose borrower went before saying
        # (``drop_loans``): kept while the service holds the actor alive, as a kept one,
        # and given back once it does not after the deadline (``loans_ended``)
        self.actor_loans_dropped: dict[bytes, float] = {}
        self._loan_seq = 0

    # -- steps 1, 2 and 5's release: the leases ----------------------------------------
    def reserve(self, pg_hex: str, name: str, bundles: list, plan: list[str]
                ) -> dict[int, RemoteBundle] | None:
        """*Not locked* (round trips to the nodes). Step 1: a lease on its node for every
        bundle of ``plan`` that is not on this node; None (nothing kept) when one is
        denied or its node cannot be reached."""
        from miniray._private.transport import peer_channel as pc  # lazy: multi-host only
        from miniray._private.transport.remote_node import (  # lazy: multi-host only
            RemoteDenial,
            RemoteLeaseError,
        )
        from miniray.exceptions import NodeDiedError  # lazy: as remote_nodes

        view = {e.node_id: e for e in self.nodes.view()}
        taken: dict[int, RemoteBundle] = {}
        try:
            for index, node_id in enumerate(plan):
                if node_id == self.nodes.local:
                    continue
                entry = view.get(node_id)
                if entry is None or not entry.alive:
                    raise LookupError(node_id)
                client = self.nodes.client(entry)
                answer = client.lease(bundles[index], tag=f"placement group "
                                      f"{name or pg_hex} bundle {index}")
                if isinstance(answer, RemoteDenial):
                    raise LookupError(node_id)
                taken[index] = RemoteBundle(pg_hex, index, bundles[index], entry, client,
                                            answer.lease_id, answer.gpu_ids)
        except (LookupError, RemoteLeaseError, NodeDiedError, OSError, TimeoutError,
                pc.PeerRefused, pc.PeerAuthError):
            self.release_parts(taken)
            return None
        except BaseException:
            self.release_parts(taken)
            raise
        return taken

    def release_parts(self, parts: dict[int, RemoteBundle]) -> None:
        """*Not locked.* Every bundle's lease back to its node (a lost link: the node
        released it already)."""
        for bundle in parts.values():
            if bundle.lease_id is not None:  # None: lent by another driver (step 7)
                self.nodes.release(bundle.client, bundle.lease_id)

    def adopt(self, pg_hex: str, parts: dict[int, RemoteBundle], has_local: bool) -> None:
        """*Locked.* Step 2: the group's remote bundles are held; tasks may use them."""
        self.groups[pg_hex] = parts
        self.has_local[pg_hex] = has_local

    def release(self, pg_hex: str) -> None:
        """*Not locked.* Step 5's second half: the group's leases are released."""
        with self.owner.locked():
            parts = self.groups.pop(pg_hex, None)
            self.has_local.pop(pg_hex, None)
            lost = self.lost.pop(pg_hex, set())
        if parts:
            self.release_parts({i: b for i, b in parts.items() if i not in lost})

    # -- steps 3 and 4: tasks in a remote bundle --------------------------------------
    def submit(self, task) -> bool:
        """*Locked.* Step 3: True when ``task`` is this module's (its bundle is on another
        node, or it asks for any bundle of a group with none here); False: it runs here."""
        if self._served_remote(task.spec.request, spill=False):
            return self._wait_for_loan(task)
        if self._bundle_of(task.spec.request) is None:
            return False  # a bundle of this node (the local ledger provides it), or none
        pg_hex = placement.bundle_request(task.spec.request)[0]
        self.waiting.setdefault(pg_hex, collections.deque()).append(task)
        self._pump(pg_hex)
        return True

    def _bundle_of(self, request) -> tuple | None:
        """*Locked.* ``(parts, index, base)`` when ``request`` (rewritten) goes to its
        group's remote bundles, else None: outside a group, a bundle of this node (the
        local ledger provides it), or "any bundle" of a group with bundles here (those
        first: README)."""
        parsed = placement.bundle_request(request)
        if parsed is None:
            return None
        pg_hex, index, base = parsed
        parts = self.groups.get(pg_hex)
        if not parts or (index >= 0 and index not in parts) or (
                index < 0 and self.has_local.get(pg_hex)):
            return None
        return parts, index, base

    def holds(self, request) -> bool:
        """*Locked.* Whether an actor of this placement ``request`` is placed in a remote
        bundle (step 3's rule, as for a task)."""
        return self._bundle_of(request) is not None

    def take(self, request, held, holder=None) -> RemoteBundle | None:
        """*Locked.* An actor's bundle: the first (or its) remote bundle with room for its
        placement ``request`` now, holding ``held`` of it for the actor's life (as a local
        actor's lease shrinks to what it holds), its share of the bundle's GPUs taken for
        ``holder`` (the actor's id: ``RemoteBundle.gpus_of``); None: none has room now (the
        placer asks again)."""
        lent = self.borrowed.get(holder) if holder is not None else None
        if lent is not None:  # an actor of another driver's bundle (step 7): its own room
            parts, index, base = {lent.index: lent}, lent.index, \
                placement.bundle_request(request)[2]
            usable = parts
        else:
            found = self._bundle_of(request)
            if found is None:
                return None
            parts, index, base = found
            usable = self._usable(placement.bundle_request(request)[0], parts)
        picked = self._pick(base, index, usable)
        if picked is None:
            return None
        bundle = parts[picked]
        kept = (placement.bundle_request(held) or ("", 0, {}))[2]
        for name, amount in kept.items():
            bundle.free[name] = bundle.free.get(name, 0.0) - float(amount)
        bundle.take_gpus(holder, float(kept.get("GPU", 0.0)))
        return bundle

    def give_back(self, bundle: RemoteBundle, held, holder=None) -> None:
        """*Locked.* An actor's worker in ``bundle`` ended: what it held goes back, its
        GPUs' share (``holder``: as given to ``take``) too."""
        for name, amount in (placement.bundle_request(held) or ("", 0, {}))[2].items():
            bundle.free[name] = bundle.free.get(name, 0.0) + float(amount)
        bundle.give_gpus(holder)
        self._pump(bundle.pg_hex)

    def _pump(self, pg_hex: str) -> None:
        """*Locked.* Start every waiting task of the group whose bundle has room, in order."""
        queue = self.waiting.get(pg_hex)
        parts = self._usable(pg_hex, self.groups.get(pg_hex) or {})
        if not queue:
            return
        kept = collections.deque()
        while queue:
            task = queue.popleft()
            if task.cancelled:
                continue
            _hex, index, base = placement.bundle_request(task.spec.request)
            picked = self._pick(base, index, parts)
            if picked is None:
                kept.append(task)
                continue
            self._start(task, parts[picked], base)
        if kept:
            self.waiting[pg_hex] = kept
        else:
            self.waiting.pop(pg_hex, None)

    def _start(self, task, bundle: RemoteBundle, base: dict) -> None:
        """*Locked.* ``task`` takes ``base`` of ``bundle``'s room and starts on its node."""
        for name, amount in base.items():
            bundle.free[name] = bundle.free.get(name, 0.0) - float(amount)
        gpu_ids = bundle.take_gpus(task, base.get("GPU", 0.0))
        self.running.setdefault(bundle.pg_hex, set()).add(task)
        self.nodes.run_in_bundle(task, bundle, gpu_ids)

    def spill(self, task) -> bool:
        """*Locked.* A task for "any bundle" (-1) of a group with bundles here and on other
        nodes, which waits in the local queue because this node's bundles have no room now
        (``RemoteNodes.spill``): True when it started in a remote bundle with room now;
        False: it stays (Ray's -1 is any bundle with room)."""
        if not task.cancelled and self._served_remote(task.spec.request, spill=True):
            return self._wait_for_loan(task)
        parsed = placement.bundle_request(task.spec.request)
        if parsed is None or parsed[1] >= 0 or task.cancelled:
            return False
        pg_hex, _index, base = parsed
        parts = self._usable(pg_hex, self.groups.get(pg_hex) or {})
        if not parts:
            return False
        picked = self._pick(base, -1, parts)
        if picked is None:
            return False
        self._start(task, parts[picked], base)
        return True

    @staticmethod
    def _pick(base: dict, index: int, parts: dict[int, RemoteBundle]) -> int | None:
        """Which of ``parts`` a request of ``base`` for bundle ``index`` (-1: any) takes
        now (``placement.pick_bundle`` on each bundle's free amounts and GPUs), or None."""
        return placement.pick_bundle(base, index, {i: b.free for i, b in parts.items()},
                                     {i: b.gpu_free for i, b in parts.items()})

    def _usable(self, pg_hex: str, parts: dict[int, RemoteBundle]) -> dict[int, RemoteBundle]:
        """*Locked.* The group's remote bundles less those whose node died (step 6) or
        whose link is lost (the watch marks them lost at its next turn)."""
        lost = self.lost.get(pg_hex) or ()
        return {i: b for i, b in parts.items()
                if i not in lost and getattr(b.client, "lost", None) is None}

    # -- step 6: a bundle's node died ---------------------------------------------------
    def lose(self, pg_hex: str, indexes) -> None:
        """*Locked.* These bundles' node died: no task starts in them until ``replace``."""
        if pg_hex in self.groups:
            self.lost.setdefault(pg_hex, set()).update(indexes)

    def lose_bundle(self, bundle: RemoteBundle) -> None:
        """*Locked.* ``bundle``'s node died under a task or an actor: it is lost (``lose``)
        unless it was placed again already (another bundle holds its number now)."""
        group = self.groups.get(bundle.pg_hex)
        if group is not None and group.get(bundle.index) is bundle:
            self.lose(bundle.pg_hex, [bundle.index])

    def find_lost(self, alive: set) -> dict[str, list[int]]:
        """*Locked.* Per group, its remote bundles whose node is not in ``alive`` (the
        view's alive node ids) or whose link was lost, marked lost (``lose``), with those
        marked before: every bundle waiting to be placed again."""
        out: dict[str, list[int]] = {}
        for pg_hex, parts in self.groups.items():
            gone = [i for i, b in parts.items()
                    if b.node_id not in alive or getattr(b.client, "lost", None) is not None]
            if gone:
                self.lose(pg_hex, gone)
            if self.lost.get(pg_hex):
                out[pg_hex] = sorted(self.lost[pg_hex])
        return out

    def requeue(self, task, bundle: RemoteBundle) -> None:
        """*Locked.* ``task`` failed because ``bundle``'s node died and may be retried:
        the bundle is lost, and the task waits (first) for the bundle to be placed again;
        if it was placed again already, the task goes to its new place (on this node: the
        owner's queue). ``done`` follows, as for any task that left the bundle."""
        pg_hex = bundle.pg_hex
        group = self.groups.get(pg_hex)
        task.state, task.worker = T_WAITING, None
        if bundle.loan is not None:  # lent room (step 8): a new loan, where S placed it
            self.served_waiting.setdefault(pg_hex, collections.deque()).appendleft(task)
            self._kick()
            return
        if group is not None and bundle.index not in group:  # held by this node now
            self.owner.tasks.resubmit(task)
            return
        self.lose_bundle(bundle)
        self.waiting.setdefault(pg_hex, collections.deque()).appendleft(task)

    def replace(self, pg_hex: str, parts: dict[int, RemoteBundle],
                here=()) -> list[tuple] | None:
        """*Locked.* Lost bundles were placed again (step 1 on other nodes: ``parts``;
        the bundles ``here``: in this node's ledger, ``PlacementGroups._grow``): the room
        lent to the service's actors in them follows them first (``_move_loans``, whose
        list this returns), then tasks start in them, those waiting for a bundle now here
        (or for any bundle) going to the owner's queue. None when the group was removed
        meanwhile (the caller releases ``parts``)."""
        group = self.groups.get(pg_hex)
        if group is None:
            return None
        group.update(parts)
        for index in here:
            group.pop(index, None)
        if here:
            self.has_local[pg_hex] = True
        lost = self.lost.get(pg_hex, set()) - set(parts) - set(here)
        if lost:
            self.lost[pg_hex] = lost
        else:
            self.lost.pop(pg_hex, None)
        if here:
            self._to_local(pg_hex, set(here))
        moved = self._move_loans(pg_hex, set(parts), set(here))  # before tasks take room
        self._pump(pg_hex)
        return moved

    def _to_local(self, pg_hex: str, here: set) -> None:
        """*Locked.* Tasks waiting for a bundle that this node holds now, or for any
        bundle of the group (this node's first: ``_bundle_of``), go to the owner's queue."""
        queue = self.waiting.get(pg_hex)
        if not queue:
            return
        kept = collections.deque()
        for task in queue:
            index = placement.bundle_request(task.spec.request)[1]
            if task.cancelled or not (index < 0 or index in here):
                kept.append(task)
                continue
            task.state, task.worker = T_WAITING, None
            self.owner.tasks.resubmit(task)
        if kept:
            self.waiting[pg_hex] = kept
        else:
            self.waiting.pop(pg_hex, None)

    def done(self, task, bundle: RemoteBundle) -> None:
        """*Locked.* Step 4: ``task`` left ``bundle``; its room goes back."""
        running = self.running.get(bundle.pg_hex)
        if running is None or task not in running:
            return
        running.discard(task)
        if bundle.loan is not None:  # lent room (step 8): back to the service
            self._returns.append(bundle.loan)
            self._kick()
            return
        base = placement.bundle_request(task.spec.request)[2]
        for name, amount in base.items():
            bundle.free[name] = bundle.free.get(name, 0.0) + float(amount)
        bundle.give_gpus(task)
        self._pump(bundle.pg_hex)

    def removed(self, pg_hex: str) -> None:
        """*Locked.* Step 5's first half: the group's waiting tasks fail, its running ones
        fail and their workers are killed (the local bundles' rule:
        ``Owner.placement_group_removed``)."""
        from miniray.exceptions import TaskPlacementGroupRemoved  # lazy: as remote_nodes

        error = TaskPlacementGroupRemoved(
            "The placement group corresponding to this task has been removed.")
        for task in list(self.waiting.pop(pg_hex, ())) + list(
                self.served_waiting.pop(pg_hex, ())):
            if task.state != T_DONE:
                self.owner.tasks.fail(task, error)
        for task in self.running.pop(pg_hex, ()):
            slot = task.worker
            if task.state != T_DONE:
                self.owner.tasks.fail(task, error)
            if slot is not None and getattr(slot, "remote_kill", None) is not None:
                self.owner.defer(slot.remote_kill)
        for actor_id in [a for a, loan in self.loans.items() if loan[0].pg_hex == pg_hex]:
            del self.loans[actor_id]  # the service's watch ends the actor
            self.actor_loans_unsent.pop(actor_id, None)
            self.actor_loans_dropped.pop(actor_id, None)
        for actor_id in [a for a, b in self.borrowed.items() if b.pg_hex == pg_hex]:
            del self.borrowed[actor_id]
        for actor_id in [a for a, (h, _e) in self.on_lender_node.items() if h == pg_hex]:
            del self.on_lender_node[actor_id]
        for kept in (self.followed, self.moved_to):
            for actor_id in [a for a, (h, _lent) in kept.items() if h == pg_hex]:
                del kept[actor_id]
        self.lender_watched.pop(pg_hex, None)
        self.served.pop(pg_hex, None)
        self.lenders.pop(pg_hex, None)
        self.served_everywhere.discard(pg_hex)
        self.served_pending.discard(pg_hex)
        self.served_asked.pop(pg_hex, None)
        for loan_id in [i for i, loan in self.lent_out.items() if loan[0].pg_hex == pg_hex]:
            del self.lent_out[loan_id]  # the service's side: the bundles are released

    # -- step 7: a named or detached actor in a remote bundle ---------------------------
    def lend(self, actor_id: bytes, bundle: RemoteBundle, held) -> None:
        """*Locked.* D's side: the room ``take`` gave actor ``actor_id`` is kept for the
        node's actor service while the actor is alive there."""
        self.loans[actor_id] = (bundle, held)

    def end_loan(self, actor_id: bytes) -> None:
        """*Locked.* The service's actor ended (or its creation failed): its room comes
        back (once)."""
        loan = self.forget_loan(actor_id)
        if loan is not None:
            self.give_back(loan[0], loan[1], actor_id)

    def forget_loan(self, actor_id: bytes) -> tuple | None:
        """*Locked.* Actor ``actor_id``'s loan ends, its room not given back here (its
        bundle is held by this node's ledger now: ``PlacementGroupNodes._move_lent``), and
        so does what was kept of it (not yet said kept, dropped); the loan, if any."""
        self.actor_loans_unsent.pop(actor_id, None)
        self.actor_loans_dropped.pop(actor_id, None)
        return self.loans.pop(actor_id, None)

    def borrow(self, spec) -> None:
        """*Locked.* S's side: actor ``spec`` of another driver's group (``spec.lent``: the
        node's entry and its GPU ids there) gets a ``RemoteBundle`` of its own room in
        that bundle, no lease (``take`` with its id as ``holder`` finds it); the group is
        watched as one of this owner's (its removal, or its holder's end, ends the actor).
        Its link to the node is opened by the actor's thread. One in a bundle on the
        lending driver's own node (``on_lender_node``: steps 9 and 10, that node is not
        S's) gets no ``RemoteBundle``: S leases its room there (``leased_there``)."""
        entry, gpu_ids, lender_node = spec.lent[:3]
        pg_hex, index, base = placement.bundle_request(spec.placement)
        if lender_node:  # its driver's node is another: asked whether the group lives
            self.lender_watched[pg_hex] = lender_node
        else:
            self.groups.setdefault(pg_hex, {})
            self.has_local.setdefault(pg_hex, False)
        if on_lender_node(spec.lent):
            self.on_lender_node[spec.actor_id] = (pg_hex, entry)
            return
        self.borrowed[spec.actor_id] = RemoteBundle(pg_hex, index, base, entry, None, None,
                                                    gpu_ids)

    def leased_there(self, actor_id: bytes):
        """*Locked.* S's side: the ``NodeEntry`` of the lending driver's node when actor
        ``actor_id`` is in a bundle there (``on_lender_node``): S's placer leases its room
        on that node, whose ledger provides it from the group's bundle; else None."""
        found = self.on_lender_node.get(actor_id)
        return found[1] if found is not None else None

    def unborrow(self, actor_id: bytes) -> None:
        """*Locked.* S's side: actor ``actor_id`` ended for good (no restart): its lent
        room is forgotten, and a group lent by a driver of another node is no longer
        watched once none of its actors is left here."""
        bundle = self.borrowed.pop(actor_id, None)
        there = self.on_lender_node.pop(actor_id, None)
        followed = self.followed.pop(actor_id, None)
        self.moved_to.pop(actor_id, None)
        pg_hex = bundle.pg_hex if bundle is not None else there[0] if there else \
            followed[0] if followed else None
        if pg_hex in self.lender_watched and not any(
                b.pg_hex == pg_hex for b in self.borrowed.values()) and not any(
                h == pg_hex for h, _e in self.on_lender_node.values()) and not any(
                h == pg_hex for h, _lent in self.followed.values()):
            self.lender_watched.pop(pg_hex, None)

    def follow_ledger(self, spec) -> None:
        """*Locked.* S's side: the node of actor ``spec``'s lent room died. Its restart
        goes where its driver lends its room next (step 6): in the bundle's new place on
        another node once the driver says so (``lent_moved``; said already: borrowed
        now), or, with no lent room meanwhile, where this node's ledger provides the
        bundle once its driver holds it here again."""
        self.borrowed.pop(spec.actor_id, None)
        pg_hex = placement.bundle_request(spec.placement)[0]
        moved = self.moved_to.pop(spec.actor_id, None)
        if moved is not None:
            spec.lent = moved[1]
            self.borrow(spec)
            return
        if spec.lent is not None:
            self.followed[spec.actor_id] = (pg_hex, spec.lent)
        spec.lent = None

    def lent_moved(self, spec, entry, gpu_ids, running: bool, here: bool = False) -> bool:
        """*Locked.* S's side: actor ``spec``'s driver lends its room in its bundle's new
        place, on ``entry``'s node with ``gpu_ids`` there (step 6), or (``here``) the
        bundle is on that driver's own node, another than S's, whose ledger provides it
        (``on_lender_node``). Its restart goes there: borrowed now when S saw its node die
        (``follow_ledger`` ran), else (``running``: its worker still counts as alive
        here) when ``follow_ledger`` runs. False when S has no lent room of it to move
        (its driver then ends the loan)."""
        followed = None if running else self.followed.get(spec.actor_id)
        before = spec.lent if running else followed[1] if followed is not None else None
        if before is None or (here and not before[2]):  # "here" only from another node
            return False
        lent = (entry, list(gpu_ids)) + tuple(before[2:4]) + ((True,) if here else ())
        if running:
            pg_hex = placement.bundle_request(spec.placement)[0]
            self.moved_to[spec.actor_id] = (pg_hex, lent)
            return True
        del self.followed[spec.actor_id]
        spec.lent = lent
        self.borrow(spec)
        return True

    def awaits_lender(self, actor_id: bytes) -> bool:
        """*Locked.* S's side: whether actor ``actor_id``'s restart waits for the word of
        its lending driver of another node on where its bundle went (``lent_moved``):
        this node's ledger never holds that group."""
        followed = self.followed.get(actor_id)
        return followed is not None and bool(followed[1][2])

    def _move_loans(self, pg_hex: str, indexes, here=()) -> list[tuple]:
        """*Locked.* D's side: the actors lent room in bundles ``indexes`` of the group,
        just placed again on other nodes, are lent the same room in the new bundles
        (``take``, as when first lent), each ``(actor id, the new bundle's NodeEntry, its
        GPU ids there, False)``, the entry None when it has no room there; the caller
        tells the service (``SVC_LENT_MOVED``), or ends the loan and kills the actor there
        when it has no room or the service will not move it. Those in bundles now
        ``here`` (this node's ledger holds them): ``(actor id, None, [], True)``, their
        loans kept until the caller knows whether the service reads this node's ledger
        (then it places them) or not (then it leases their room here: told so)."""
        moved = []
        for actor_id, (bundle, held) in list(self.loans.items()):
            if bundle.pg_hex != pg_hex:
                continue
            if bundle.index in here:
                moved.append((actor_id, None, [], True))
                continue
            if bundle.index not in indexes:
                continue
            del self.loans[actor_id]
            new = self.take(held, held, actor_id)
            if new is None:
                moved.append((actor_id, None, [], False))
                continue
            self.loans[actor_id] = (new, held)
            moved.append((actor_id, new.entry, new.gpus_of(actor_id), False))
        return moved

    def _loaned(self, pg_hex: str, index: int, base: dict, entry, client, gpu_ids: list,
                loan_id: int) -> RemoteBundle:
        """*Locked.* Step 8: a lease-less bundle of one task's room lent by the service."""
        bundle = RemoteBundle(pg_hex, index, base, entry, client, None, gpu_ids)
        bundle.loan = loan_id
        return bundle

    def node_of(self, pg_hex: str) -> dict[int, str]:
        """*Locked.* Bundle index -> node id of the group's remote bundles."""
        return {i: b.node_id for i, b in self.groups.get(pg_hex, {}).items()}

    def describe(self) -> dict[str, Any]:
        return {"groups": len(self.groups),
                "waiting": sum(len(q) for q in self.waiting.values()),
                "running": sum(len(s) for s in self.running.values())}
