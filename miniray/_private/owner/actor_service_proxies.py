"""The actor manager's proxies of the node's actor service's actors, and its requests there.

Owns: the methods of ``actors.ActorManager`` (a mixin of it: the state is the manager's,
made in ``ActorManager.__init__``) for a driver joined to a node, whose named and detached
actors live in the node's actor service: the requests made there without the owner's lock
(create, with room in a bundle on another node lent for it: of this driver's group, or
borrowed from another driver of this node that holds the group; lookup; list; kill;
a detached placement group's creation and removal, which the service holds in a cluster,
and the loans of its room for this driver's tasks),
the values of ObjectRef arguments that go with a request or a call (``export``,
``nested_ids``), a call's results the service keeps on their actor's node for this driver
(``kept_in_service``: pulled from there with the service's grant, freed through it with
SVC_FREE; ``free_in_service`` for a call nobody waits for), and the proxy record kept
here for each such actor (``proxy``), through
which calls keep their order and wait for their arguments (``actor_calls.py``).
Does not own: the sockets and the wire (``actor_link.py``), the calls themselves
(``actor_calls.py``), the room taken in a bundle on another node (``remote_bundles.py``),
or the service (``node/actor_service.py``).
Called by: the runtime and the owner's requests (``create_in_service``,
``lookup_in_service``, ``named_in_service``, ``kill_in_service``: not locked;
``lent_moved_in_service``: ``placement_group_nodes``, not locked;
``alive_in_service``: the group watch, not locked),
``placement_group_nodes`` (``create_group_in_service``, ``remove_group_in_service``,
``group_state_in_service``, ``find_group_in_service``, ``table_in_service``: not locked),
``remote_bundles``
(``borrow_room_in_service``, ``return_room_in_service``: its borrower's thread), the
manager (``proxy``, ``export``, ``nested_ids``, ``kept_in_service``, ``free_in_service``:
locked), the link (``export``, ``nested_ids``).
"""

from __future__ import annotations

import logging
import time

from miniray._private.core import placement, protocol, runtime_envs
from miniray._private.core.task_spec import ActorCreationSpec
from miniray._private.owner.actor_records import A_ALIVE, _Actor
from miniray._private.owner.object_table import PENDING, READY

logger = logging.getLogger(__name__)


def lender_watch(lender_node: str, service_node: str) -> str:
    """Pure. ``spec.lent``'s third field for an actor lent room by a driver of
    ``lender_node``, created in the actor service of ``service_node``: "" when they are
    one node (the service reads the group's lease in its own ledger), else the lender's
    node (the service asks that node whether the group lives: ``remote_bundles`` step 7).

    >>> lender_watch("a", "a"), lender_watch("a", "head")
    ('', 'a')
    """
    return "" if lender_node == service_node else lender_node


class ServiceProxies:
    """``ActorManager``'s actor-service methods (see the module docstring); every attribute
    is the manager's."""

    def create_in_service(self, spec: ActorCreationSpec) -> bytes:
        """*Not locked.* Create the actor in the node's actor service and keep a proxy;
        raises what the service raised (e.g. ActorAlreadyExistsError). The values of its
        ObjectRef arguments go along (pinned while the request is out); those not ready yet
        follow when they are (the actor waits for them there, as any actor waits for its
        arguments)."""
        owner = self.owner
        lent = self._lend(spec) if spec.pg is not None else None
        try:
            return self._create_in_service(spec, lent)
        finally:
            if lent is not None and "lender" in lent:  # lent by another driver: told
                self._tell_lender(spec, lent)
            elif lent is not None:
                with owner.locked():
                    bundles = self._remote_actors().nodes.bundles
                    if lent.get("kept"):
                        bundles.lend(spec.actor_id, lent["bundle"], spec.held)
                        owner.note_placement_use()  # the watch follows the loan
                    else:
                        bundles.give_back(lent["bundle"], spec.held, spec.actor_id)

    LEND_WAIT_S = 30.0  # a named actor waits this long for room in a remote bundle

    def _lend(self, spec: ActorCreationSpec) -> dict | None:
        """*Not locked.* A named or detached actor in a bundle this driver holds on another
        node (``remote_bundles`` step 7): its room taken there (waiting up to LEND_WAIT_S
        for it), "any bundle" made the bundle picked, and ``spec.lent`` set for the
        service; None when the bundle is not remote. Raises, naming why, when no room comes
        in time. A driver on another host than the service (``far``) lends too: the
        service leaves the group's watch to it (``remote_bundles`` step 7). A detached one
        ends with the group all the same (the service ties it to this driver)."""
        owner = self.owner
        deadline = time.monotonic() + self.LEND_WAIT_S
        with owner.locked():
            remote = owner.remote_nodes
            lender = remote.bundles.actor_lender(spec.placement) if remote else None
        if lender is not None:
            return self._borrow_for_actor(spec, lender, deadline)
        far = None
        while True:
            with owner.locked():
                remote_bundle = owner.in_remote_bundle(spec.placement)
            if not remote_bundle:
                return self._lend_here(spec)
            if far is None:
                far = self.link.on_another_host()
            with owner.locked():
                remote_bundle = owner.in_remote_bundle(spec.placement)
                bundles = self._remote_actors().nodes.bundles
                bundle = bundles.take(spec.placement, spec.held, spec.actor_id) \
                    if remote_bundle else None
                if bundle is not None:
                    pg_hex, index, base = placement.bundle_request(spec.placement)
                    if index < 0:  # the service borrows the very bundle picked here
                        spec.placement = placement.rewrite_request(base, pg_hex, bundle.index)
                        held = (placement.bundle_request(spec.held) or ("", 0, {}))[2]
                        spec.held = placement.rewrite_request(held, pg_hex, bundle.index)
                    # far: the service's node does not hold the group (remote_bundles
                    # step 7): it asks this node whether the group lives
                    spec.lent = (bundle.entry, bundle.gpus_of(spec.actor_id),
                                 self.owner.remote_nodes.local if far else "", False)
                    return {"bundle": bundle, "kept": False}
            if not remote_bundle:
                return self._lend_here(spec)  # not locked: it reads a file
            if time.monotonic() >= deadline:
                raise self._no_room(spec)
            time.sleep(0.05)

    def _lend_here(self, spec: ActorCreationSpec) -> None:
        """*Not locked* (a file read, and the view). A named or detached actor in a bundle
        of this driver's own group on this node, when the service is the head's on
        another host (this driver runs on a member): the service's ledger does not hold
        the group, so ``spec.lent`` says that the bundle is on this node (its fifth field,
        ``remote_bundles.on_lender_node``), and the service leases the actor's room here,
        which this node's ledger provides from the group's bundle, and asks this node
        whether the group lives, as for another driver's actor in such a bundle
        (``_borrow_for_actor``'s "here"). Nothing to do otherwise: the service's own
        ledger places it. Always None: no room is lent."""
        owner = self.owner
        remote = owner.remote_nodes
        found = placement.bundle_request(spec.placement) if spec.placement else None
        if remote is None or found is None:
            return None
        with owner.locked():
            own = owner.holds_own_group(found[0])
        if not own or not self.link.on_another_host():
            return None
        entry = remote.alive_entry(remote.local)
        if entry is None:
            raise RuntimeError(f"actor {spec.class_name}: this driver's node is not in its "
                               "view of the cluster")
        spec.lent = (entry, [], remote.local, False, True)
        return None

    def _no_room(self, spec: ActorCreationSpec) -> RuntimeError:
        """The error of an actor whose bundle on another node had no room in time."""
        return RuntimeError(
            f"actor {spec.class_name}: its placement group bundle on another node had no "
            f"room for it within {self.LEND_WAIT_S:g} s; end the actors there, or create it "
            "once a task in that bundle ended")

    def _borrow_for_actor(self, spec: ActorCreationSpec, lender,
                          deadline: float) -> dict | None:
        """*Not locked.* An actor in a bundle of another driver D's group that D lends room
        in (``placement_group_loans`` step 6: on another node, D of this node; step 7: any
        bundle, D of another host): its room borrowed from D (``pg_lend`` with the actor's
        id, ``ask_driver``: on D's state socket, or through D's node; waiting up to
        LEND_WAIT_S for room), "any bundle" made the bundle picked, and ``spec.lent`` set
        for the service, as ``_lend`` does with a bundle of this driver's own; None when D
        says the bundle is on D's node ("here", no loan: that node's ledger provides it;
        the service places it from its own ledger when that node is the service's, else
        leases its room there, ``spec.lent``'s fifth field), or when the group is gone (D
        removed it, or D ended: no longer in its node's ledger) while the actor waits: the
        service, whose ledger has no room of the group, ends it as an actor of a removed
        group never started (Ray's ActorUnschedulableError: its creation does not wait).
        Raises, naming why, when no room comes in time or D does not answer while its
        group lives."""
        from miniray._private.owner.placement_group_loans import LEND_ASK_S  # lazy: as below

        bundles = self.owner.remote_nodes.bundles
        pg_hex, index, base = placement.bundle_request(spec.placement)
        held = (placement.bundle_request(spec.held) or ("", 0, {}))[2]
        afar = isinstance(lender, tuple)  # a driver of another host: its node is lender[1]
        while True:
            try:
                doc = bundles.ask_driver(lender, LEND_ASK_S, "pg_lend", pg=pg_hex,
                                         index=index, base=base, held=held,
                                         actor=spec.actor_id.hex())
            except (OSError, TimeoutError) as error:
                if self.owner.placement_group_gone(pg_hex, afar):
                    return None  # D ended (its socket closed first, then its group lease)
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise RuntimeError(
                    f"actor {spec.class_name}: the driver that holds its placement group "
                    f"did not answer for room in its bundle ({error}); the group may have "
                    "been removed") from None
            if "error" in doc:
                raise RuntimeError(doc["error"])
            loan = doc.get("loan")
            if loan == "here":  # the bundle is on D's node, whose ledger provides it
                service_node, lender_node = self._service_node(), self._lender_node(lender)
                if service_node is not None and lender_node == service_node:
                    return None  # the service's own ledger places it
                entry = self.owner.remote_nodes.alive_entry(lender_node)
                if service_node is None or entry is None:
                    raise RuntimeError(f"actor {spec.class_name}: the node of the driver "
                                       "that holds its placement group, or the head, is "
                                       "not in this driver's view of the cluster")
                # the service leases its room on D's node (RemoteBundles.leased_there),
                # and asks that node whether the group lives
                spec.lent = (entry, [], lender_node, True, True)
                return None
            if isinstance(loan, list):
                picked, node_id, gpu_ids = loan
                entry = self.owner.remote_nodes.alive_entry(node_id)
                service_node = self._service_node() if entry is not None else None
                if service_node is not None:
                    if index < 0:  # the service borrows the very bundle picked there
                        spec.placement = placement.rewrite_request(base, pg_hex, picked)
                        spec.held = placement.rewrite_request(held, pg_hex, picked)
                    # borrowed: the actor is not tied to this driver (the group's is D)
                    spec.lent = (entry, list(gpu_ids), lender_watch(
                        self._lender_node(lender), service_node), True)
                    return {"lender": lender, "kept": False}
                self._tell_lender(spec, {"lender": lender, "kept": False})
                raise RuntimeError(f"actor {spec.class_name}: its placement group bundle's "
                                   "node, or the head, is not in this driver's view of the "
                                   "cluster")
            if self.owner.placement_group_gone(pg_hex, afar):
                return None  # removed while the actor waited for room
            if time.monotonic() >= deadline:
                raise self._no_room(spec)
            time.sleep(0.05)

    def _lender_node(self, lender) -> str:
        """The node of the driver that lends room (``lenders``' name of it): this node for
        a state socket, else the node named (a driver of another host)."""
        return lender[1] if isinstance(lender, tuple) else self.owner.remote_nodes.local

    def _service_node(self) -> str | None:
        """*Not locked* (a file read, and the view). The node of the actor service this
        driver creates its actors in: this one, or the head (a driver on a member); None
        when the head is not in the view."""
        remote = self.owner.remote_nodes
        if not self.link.on_another_host():
            return remote.local
        return next((e.node_id for e in remote.view() if e.is_head and e.alive), None)

    def _tell_lender(self, spec: ActorCreationSpec, lent: dict) -> None:
        """*Not locked.* Tell the driver that lent an actor's room whether the service took
        the actor (it keeps the room while the service holds it alive) or not (the room
        goes back); one that does not answer gives it back itself when this driver ends
        (its link to the lender's node closing, for a driver of another host)."""
        from miniray._private.owner.placement_group_loans import LEND_ASK_S  # lazy: as below

        pg_hex = placement.bundle_request(spec.placement)[0]
        try:
            self.owner.remote_nodes.bundles.ask_driver(
                lent["lender"], LEND_ASK_S, "pg_kept", pg=pg_hex, actor=spec.actor_id.hex(),
                kept=bool(lent.get("kept")))
        except (OSError, TimeoutError):
            logger.warning("actor %s: the lending driver was not told of it",
                           spec.actor_id.hex()[:12], exc_info=True)

    def _create_in_service(self, spec: ActorCreationSpec, lent: dict | None) -> bytes:
        owner = self.owner
        with owner.locked():
            if spec.fn_bytes is None:
                spec.fn_bytes = owner.function_bytes(spec.fn_id)
            job_env = owner.hello_info.get("runtime_env")
            if not spec.runtime_env and job_env:  # the service's own job is not this driver's
                spec.runtime_env = runtime_envs.env_key(job_env)
            objects = owner.objects
            needed = self.nested_ids(spec)
            later = [i for i in needed
                     if (e := objects.get(i)) is not None and e.state == PENDING]
            exported = self.export([i for i in needed if i not in later])
            objects.hold(later)  # not freed while the request is out, whoever drops its refs
        reply = None
        try:
            reply = self.link.create(spec, exported + [(i, None, None) for i in later])
        finally:
            with owner.locked():
                owner.requests.unpin_ids(object_id for object_id, _k, _p in exported)
                if reply is not None:
                    actor_id, state = reply
                    self.proxy(actor_id, state, spec)
                    if lent is not None:  # the service placed it in the room taken
                        lent["kept"] = actor_id == spec.actor_id
                    if actor_id == spec.actor_id:
                        for object_id in later:  # some may be ready by now: sent at once
                            self.link.forward_when_ready(object_id)
                objects.release(later)
        return reply[0]

    def lookup_in_service(self, name: str, namespace: str) -> tuple[bytes, object]:
        """*Not locked.* ``(actor id, handle state)`` of a named actor of the node's actor
        service; a proxy is kept for it."""
        actor_id, state = self.link.lookup(name, namespace)
        with self.owner.locked():
            self.proxy(actor_id, state)
        return actor_id, state

    def named_in_service(self, namespace: str, all_namespaces: bool) -> list:
        """*Not locked.* The named actors of the node's actor service."""
        return self.link.named(namespace, all_namespaces)

    def alive_in_service(self, actor_ids) -> list:
        """*Not locked.* Those of ``actor_ids`` the node's actor service holds and that are
        not dead (restarting counts as alive)."""
        return self.link._request((protocol.SVC_ALIVE, list(actor_ids)))

    def lent_moved_in_service(self, actor_id: bytes, entry, gpu_ids: list,
                              here: bool = False) -> bool:
        """*Not locked.* Tell the node's actor service that the room this driver lends
        actor ``actor_id`` is now in its bundle's new place on ``entry``'s node, with
        ``gpu_ids`` there, or (``here``) on this driver's node, another than the
        service's, whose ledger provides it (``remote_bundles`` step 7): whether it
        restarts there."""
        return bool(self.link._request((protocol.SVC_LENT_MOVED, actor_id, entry,
                                        list(gpu_ids), bool(here))))

    def kill_in_service(self, actor_id: bytes, no_restart: bool, group: str = "") -> None:
        """*Not locked.* Ask the node's actor service to kill one of its actors (``kill``
        said that it lives there); ``group``: the hex of the removed placement group it is
        killed for (it ends there as an actor of a removed group, never restarting:
        ``ActorManager.end_in_removed_group``)."""
        self.link.kill(actor_id, no_restart, group)

    def create_group_in_service(self, hex_: str, bundles, strategy: str, name: str) -> str:
        """*Not locked.* A detached placement group in a cluster is created and held by the
        node's actor service (``placement_group_nodes._create_served``): CREATED or
        PENDING there; raises what the service raised (a name taken)."""
        return self.link._request((protocol.SVC_PG_CREATE, hex_, bundles, strategy, name))

    def remove_group_in_service(self, hex_: str) -> bool:
        """*Not locked.* Remove a group the node's actor service holds (its bundles on
        every node, its actors); False when the service does not hold it."""
        return self.link._request((protocol.SVC_PG_REMOVE, hex_))

    def group_state_in_service(self, hex_: str):
        """*Not locked.* Whether the node's actor service holds detached group ``hex_``:
        "CREATED", "PENDING", or None (it never did, or it was removed)."""
        return self.link._request((protocol.SVC_PG_STATE, hex_))

    def find_group_in_service(self, name: str):
        """*Not locked.* ``(hex, bundles, strategy)`` of the pending detached group called
        ``name`` that the node's actor service holds, or None (``SVC_PG_FIND``)."""
        return self.link._request((protocol.SVC_PG_FIND, name))

    def table_in_service(self) -> dict:
        """*Not locked.* ``{hex: ledger record}`` of the reserved detached groups the
        service holds (``SVC_PG_TABLE``): a driver on another host than the service reads
        them there, its own node's ledger not holding them."""
        return self.link._request((protocol.SVC_PG_TABLE,))

    def borrow_room_in_service(self, hex_: str, index: int, base: dict):
        """*Not locked.* Room for one task in bundle ``index`` of a detached group the
        service holds on another node (``remote_bundles`` step 8): a loan, None (no room
        now) or "here"."""
        return self.link._request((protocol.SVC_PG_LEND, hex_, index, base))

    def return_room_in_service(self, loan_id: int, timeout: float | None = None) -> None:
        """*Not locked.* A loan's task ended: its room goes back to the service, waiting
        at most ``timeout`` seconds for its answer (None: the link's own timeout)."""
        self.link._request((protocol.SVC_PG_RETURN, loan_id), timeout)

    def export(self, object_ids) -> list:
        """*Locked.* ``[(id, kind, payload)]`` of the ready ones of these objects, for the
        actor service, pinned (the caller unpins them once the service has them)."""
        objects = self.owner.objects
        out = []
        for object_id in dict.fromkeys(object_ids or ()):
            entry = objects.get(object_id)
            if entry is None or entry.state != READY:
                continue  # freed: reading it in the actor raises its loss
            self.owner.store.pin(object_id)
            out.append((object_id,) + objects.read(object_id))
        return out

    def nested_ids(self, spec) -> list[bytes]:
        """Every object a call to the actor service needs the value of before it is sent."""
        ids = [object_id for _position, object_id in spec.deps or ()]
        return list(dict.fromkeys(ids + list(spec.contained or ())))

    def kept_in_service(self, results: list) -> list:
        """*Locked.* A call's results from the node's actor service, each one kept on the
        actor's node (``("kept", id, node id, size, path, [ip, port], tag, grant)``:
        ``node/actor_service.py``, Results) made ``("remote", RemoteCopy)``: pulled straight
        from that node with the service's grant when someone needs it
        (``KeptResults.granted_copy``), as this driver's own kept results are, and freed
        there through the service (SVC_FREE) when this driver frees it."""
        if not any(_kept_item(data) for _kind, data in results):
            return results
        kept = self._remote_actors().nodes.kept_results
        link = self.link
        out = []
        for kind, data in results:
            if _kept_item(data):
                _tag, object_id, node_id, size, path, address, tag, grant = data

                def free(object_id=object_id):  # locked: never waits (the link's outbox)
                    link.send((protocol.SVC_FREE, [object_id]))

                data = ("remote", kept.granted_copy(object_id, node_id, size, path, address,
                                                    tag, grant, free))
            out.append((kind, data))
        return out

    def free_in_service(self, results: list) -> None:
        """*Locked.* Results kept for a call nobody waits for any more: freed at once."""
        ids = [data[1] for _kind, data in results if _kept_item(data)]
        if ids:
            self.link.send((protocol.SVC_FREE, ids))

    def proxy(self, actor_id: bytes, state, spec: ActorCreationSpec | None = None) -> _Actor:
        """*Locked.* The proxy of an actor the node's actor service owns (made on first use)."""
        actor = self.actors.get(actor_id)
        if actor is None:
            if spec is None:
                spec = ActorCreationSpec(actor_id=actor_id, class_name="Actor",
                                         handle_state=state)
            actor = _Actor(ActorCreationSpec(
                actor_id=actor_id, class_name=spec.class_name, name=spec.name,
                namespace=spec.namespace, detached=spec.detached, handle_state=state,
                max_pending_calls=spec.max_pending_calls))
            actor.remote = True
            actor.state = A_ALIVE
            self.actors[actor_id] = actor
        return actor


def _kept_item(data) -> bool:
    """Whether a result's payload from the actor service is one kept on its node.

    >>> _kept_item(("kept", b"i", "n", 8, "/p", ["127.0.0.2", 1], "t", b"g")), _kept_item(b"x")
    (True, False)
    """
    return type(data) is tuple and len(data) == 8 and data[0] == "kept"
