"""Loans of room in a placement group's bundles on other nodes (``remote_bundles`` steps 8
to 10), both sides: the lender (the node's actor service for a detached group, the creating
driver for its own group) lends, any other driver of the node borrows, and so does a driver
of another host from a creating driver, through that driver's node (step 7 below).

Owns: the methods of ``remote_bundles.RemoteBundles`` (a mixin of it: the state is its own,
made in ``RemoteBundles.__init__``) for a group whose bundles on other nodes another
process holds: a detached group that the node's actor service S holds
(docs/detached-placement-groups.md), or a driver D's own group (``lenders``: D's state
socket). A borrowing driver's side: which groups are served and where their bundles are
(``note_served``), whether a task or an actor of a placement request is the service's
business (``_served_remote``, ``serves``), the tasks waiting for a loan and the thread that
asks its lender for them and gives them back (``_borrow_loop``, ``_ask_lender``, ``_lent``).
A lender's side (S, or D): the loans it made, each of one task's request of one bundle, to
which driver (``lend_room``, ``return_room``, ``drop_loans``; D: ``answer_borrower`` on its
state socket, and ``gone_borrowers``: the borrowers that died), and D's loans for another
driver's actors until the service holds them (``lend_actor_room``, ``actor_kept``).
Does not own: the bundles' leases, their room and the tasks once started
(``remote_bundles.py``), the requests' wire (``actor_service_proxies.py``,
``node/actor_service.py``, ``transport/state_socket.py``), the group's record
(``placement_groups.py``).
Called by: ``RemoteBundles`` (``submit``, ``spill``, ``requeue``, ``done``, ``removed``:
locked), ``placement_group_nodes`` (``note_served``, locked; ``gone_borrowers``), the owner
(``serves``, locked; ``return_loans``: the owner's shutdown, not locked), the node's actor
service (``lend_room``, ``return_room``, ``drop_loans``, locked, on its I/O thread), the
driver's state socket (``answer_borrower``, not locked, on its thread; it also answers
a removal by a driver of another host, ``pg_remove``, with ``PlacementGroups.remove_asked``).

Steps (driver E, lender S or D, member N; the service's loan protocol is numbered in
``core/protocol.py`` section 5, D's is its state socket's ``pg_lend`` and ``pg_return``)::

    1. E: a task for bundle i of served group G on N waits in ``served_waiting``.
    2. E's thread: SVC_PG_LEND(G, i, request) -> S ``lend_room`` (D: ``pg_lend``, the
       same ``lend_room`` in D): its bundle's room less the request, a loan id; or None
       (no room now: E asks again in LOAN_POLL_S); or "here" (i is the lender's node's
       now: the task goes to E's own queue). E keeps the loan as (lender, loan id).
    3. E: ``_lent`` starts the task on a lease-less bundle of the loan (E's link to N).
    4. The task ends however it ends (``done``; ``requeue`` after N died: it waits for a
       new loan first): SVC_PG_RETURN(loan id) from E's thread -> S ``return_room`` (D:
       ``pg_return``, only from the driver it lent to).
    5. E shuts down: the loans of its ended tasks not given back yet are sent first
       (``return_loans``, teardown step 1, RETURN_AT_EXIT_S at most), then its link to S
       closes: S ``drop_loans`` (the rest); D drops them when its group watch finds E's
       process gone (``gone_borrowers``: E's pid and start time, read from D's socket).
       G removed (by any driver, or D ended): the lender forgets G's loans, E's watch
       fails E's tasks in G (``RemoteBundles.removed``: the ledger no longer holds G).
    6. An actor of E in D's bundle on N (``remote_bundles`` step 9): E asks D
       (``pg_lend`` with the actor's id and ``held``; ``actor_lender``,
       ``ActorManager._borrow_for_actor``), D takes its room as for a named actor of its
       own (``lend_actor_room``: ``take``, ``lend``) and answers ``(index, node id, GPU
       ids)``; E creates it in S with ``spec.lent`` and says whether S took it
       (``pg_kept``: ``actor_kept``). D's watch then keeps the room while S holds the
       actor alive; before that it is E's (``actor_loans_unsent``), except that E going
       before it says keeps it lent while S holds the actor alive, S may have taken it
       (``drop_loans``, ``actor_loans_dropped``).
    7. E on another host than D (``remote_bundles`` step 10): E's lender is
       ``("node", D's node, G)``; steps 2 and 4 go on E's link to that node
       (``ask_driver``: ``RemoteNodeClient.loan``), which asks D on its state socket
       naming E (``far_token``, accepted from the node's pid only), and tells D
       ``pg_drop`` when E's link closes (E's exit or its host's death: ``drop_loans``).
       E's watch follows G in that node's ledger (``placement_group_nodes._far_reserved``).
       E's removal of G goes the same way (``pg_remove``): D runs its own removal
       (``remove_asked``) before E ends its own work in G.
       E's actors there: step 6 through that node (``pg_lend`` with the actor's id, then
       ``pg_kept``, ``ask_driver``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from miniray._private.core import placement
from miniray._private.host import procinfo
from miniray._private.owner.placement_group_records import CREATED
from miniray._private.owner.tasks import T_DONE, T_WAITING

logger = logging.getLogger(__name__)

LEND_ASK_S = 10.0  # at most this long for a driver lender's answer on its state socket
# An actor's loan whose borrower went before saying whether the service took the actor is
# given back only once the service does not hold it this long after (``drop_loans``)
DROPPED_LOAN_GRACE_S = 2.0


def loans_ended(asked, alive, dropped: dict, now: float) -> list:
    """Pure. The actors of ``asked`` whose lent room comes back: those the service does
    not hold alive (``alive``), except a dropped loan's before its deadline
    (``dropped``: actor id -> deadline; a creation may still be on its way).

    >>> loans_ended(["a", "b", "c"], {"a"}, {"c": 10.0}, now=5.0)
    ['b']
    >>> loans_ended(["a", "b", "c"], {"a"}, {"c": 10.0}, now=10.0)
    ['b', 'c']
    """
    return [a for a in asked if a not in alive and now >= dropped.get(a, now)]


def borrower_token(pid: int) -> tuple:
    """A driver lender's name for the borrowing driver ``pid`` (its start time too: a
    pid used again is another borrower): the token of its loans."""
    return ("driver", pid, procinfo.start_time(pid) or 0)


def far_token(name) -> tuple:
    """Pure. A driver lender's name for a borrowing driver of another host, as its node
    names it (``node/loan_relay.borrower``: the link's name and serial there): the token
    of its loans, dropped when the node says its link closed (``pg_drop``).

    >>> far_token(["remote driver 127.0.0.2 pid 7", 3])
    ('far', 'remote driver 127.0.0.2 pid 7', 3)
    """
    return ("far",) + tuple(name)


def gone_borrowers(tokens, alive) -> list:
    """Pure. The borrowing drivers among ``tokens`` (``borrower_token``'s; the actor
    service's own tokens are left out: a closed link tells it) that ``alive(pid, start)``
    says are gone, each once, in the order first seen."""
    out = []
    for token in tokens:
        if isinstance(token, tuple) and len(token) == 3 and token[0] == "driver" and \
                token not in out and not alive(token[1], token[2] or None):
            out.append(token)
    return out


def answer_borrower(owner, request: dict, pid: int, node_pid: int | None = None) -> dict:
    """*Not locked* (the state socket's thread, ``transport/state_socket.py``). A driver
    lender's side of step 2 and 4 for the driver ``pid`` of this node: ``pg_lend`` (``pg``,
    ``index``, ``base``) answers ``{"loan": [loan id, index, node id, GPU ids]}``, None or
    "here", as ``lend_room``; ``pg_return`` (``loan``) gives back a loan made to ``pid``.
    An actor's loan (step 6): ``pg_lend`` with ``actor`` (its id, hex) and ``held``
    answers ``{"loan": [index, node id, GPU ids]}``, None or "here" (``lend_actor_room``);
    ``pg_kept`` (``actor``, ``kept``) says whether the service took the actor.
    A driver of another host (step 7), through this node (``pid`` is ``node_pid``): the
    node names it (``borrower``: ``far_token``); ``pg_drop`` drops its loans (its link to
    the node closed); ``pg_remove`` (``pg``) removes the group as this driver's own
    removal does (``PlacementGroups.remove_asked``), answering ``{"removed": bool}``."""
    token = borrower_token(pid)
    far = request.get("borrower")
    if far is not None:  # a driver of another host, through this node (step 7)
        if node_pid is None or pid != node_pid or not isinstance(far, list):
            return {"error": "only this driver's node names a borrower of another host"}
        token = far_token(far)
    what = request.get("what")
    if what == "pg_remove":  # a driver of another host removes the group (step 7)
        if far is None:
            return {"error": "pg_remove comes from this driver's node only"}
        return {"removed": owner.pgs.remove_asked(str(request["pg"]))}
    if what == "pg_drop":  # that borrower's link to this node closed
        if far is None:
            return {"error": "pg_drop names a borrower of another host"}
        with owner.locked():
            remote = owner.remote_nodes
            if remote is not None:
                remote.bundles.drop_loans(token)
        return {"loan": None}
    with owner.locked():
        remote = owner.remote_nodes
        if remote is None:
            return {"loan": None}
        bundles = remote.bundles
        if what == "pg_return":
            loan_id = int(request["loan"])
            loan = bundles.lent_out.get(loan_id)
            if loan is not None and loan[2] == token:
                bundles.return_room(loan_id)
            return {"loan": None}
        if what == "pg_kept":
            bundles.actor_kept(bytes.fromhex(str(request["actor"])), bool(request["kept"]),
                               token)
            if request["kept"]:
                owner.note_placement_use()  # the group watch follows the loan
            return {"loan": None}
        base = {str(k): float(v) for k, v in dict(request["base"]).items()}
        if request.get("actor"):
            held = {str(k): float(v) for k, v in dict(request.get("held") or {}).items()}
            answer = bundles.lend_actor_room(
                str(request["pg"]), int(request["index"]), base, held,
                bytes.fromhex(str(request["actor"])), token)
            if isinstance(answer, tuple):
                index, entry, gpu_ids = answer
                answer = [index, entry.node_id, list(gpu_ids)]
            return {"loan": answer}
        answer = bundles.lend_room(str(request["pg"]), int(request["index"]), base, token)
    if isinstance(answer, tuple):
        loan_id, index, entry, gpu_ids = answer
        answer = [loan_id, index, entry.node_id, list(gpu_ids)]
    return {"loan": answer}


class BundleLoans:
    """``RemoteBundles``' steps 8 and 9 (see the module docstring); every attribute is the
    ``RemoteBundles``'."""

    def note_served(self, pg_hex: str, nodes: list, lender: str | tuple | None = None,
                    everywhere: bool = False) -> None:
        """*Locked.* A driver's side: ``pg_hex`` is a detached group the node's actor
        service holds (``lender`` None), or another driver's own group (``lender``: that
        driver's state socket; a driver of another host: ``("node", its node id,
        pg_hex)``), its bundles on ``nodes`` (the ledger's record): its tasks in a bundle
        on another node borrow room from the lender. ``nodes`` empty: the group is not
        reserved yet (``served_pending``): its actors are the service's, which places
        them once it is. ``everywhere``: the lender is on another host (the head's
        service for a driver on a member, or a driver of another host): its tasks in any
        bundle borrow room, this node's ledger providing none (``served_everywhere``)."""
        if lender is not None:
            self.lenders[pg_hex] = lender
        else:
            self.lenders.pop(pg_hex, None)
        if nodes:
            self.served[pg_hex] = list(nodes)
            if everywhere:
                self.served_everywhere.add(pg_hex)
            self.served_pending.discard(pg_hex)
            self.served_asked.pop(pg_hex, None)
        else:
            self.served_pending.add(pg_hex)

    def serves(self, request) -> bool:
        """*Locked.* Whether an actor of this placement ``request`` is in a served group's
        bundle on another node (or "any bundle" of one with none here), or in any bundle
        of a served group not reserved yet: the node's actor service creates it, as its
        own (``ActorManager.is_node_actor``; in another driver's group, in room that
        driver lends: ``actor_lender``)."""
        parsed = placement.bundle_request(request)
        if parsed is not None and parsed[0] in self.served_pending:
            return True
        return self._served_remote(request, spill=False)  # a driver's group: room it lends

    def actor_lender(self, request) -> str | tuple | None:
        """*Locked.* The driver that lends room for an actor of this placement ``request``
        (step 6: a bundle on another node of that driver's group; step 7: any bundle of a
        group of a driver of another host), as ``lenders`` names it (its state socket, or
        ``("node", its node id, hex)``), or None."""
        parsed = placement.bundle_request(request)
        lender = self.lenders.get(parsed[0]) if parsed is not None else None
        if lender is None or not self._served_remote(request, spill=False):
            return None
        return lender

    def _served_remote(self, request, spill: bool) -> bool:
        """*Locked.* Whether a task of this placement ``request`` borrows room in a bundle
        on another node of a served group: its bundle is on another node, or it asks for
        any bundle (-1) and the group has none here (``spill``: none here with room now,
        the local queue says so, and some on another node)."""
        parsed = placement.bundle_request(request)
        nodes = self.served.get(parsed[0]) if parsed is not None else None
        if not nodes:
            return False
        if parsed[0] in self.served_everywhere:
            return True  # this node's ledger provides none of its bundles
        index, local = parsed[1], self.nodes.local
        if index >= 0:
            return index < len(nodes) and nodes[index] != local
        if spill:
            return any(node != local for node in nodes)
        return all(node != local for node in nodes)

    def _wait_for_loan(self, task) -> bool:
        """*Locked.* ``task`` waits for the service to lend room (the borrower's thread)."""
        pg_hex = placement.bundle_request(task.spec.request)[0]
        self.served_waiting.setdefault(pg_hex, collections.deque()).append(task)
        self._kick()
        return True

    def _kick(self) -> None:
        """*Locked.* The borrower's thread asks now (started when none runs)."""
        self._wake.set()
        if self._borrower is None and not self.owner.closed:
            self._borrower = threading.Thread(target=self._borrow_loop, daemon=True,
                                              name="miniray-pg-borrow")
            self._borrower.start()

    LOAN_POLL_S = 0.1  # how often tasks waiting for room in a served bundle ask again

    def _borrow_loop(self) -> None:
        """*Not locked*, its own thread: ``_borrow_turns`` until it ends; an error it did
        not expect ends the thread too, logged, and the next kick starts another (a thread
        that died with ``_borrower`` still set would leave every waiting task waiting)."""
        try:
            self._borrow_turns()
        except Exception:  # noqa: BLE001 - logged; the owner's next kick starts another
            logger.warning("the placement-group borrower thread failed", exc_info=True)
            with self.owner.locked():
                if self._borrower is threading.current_thread():
                    self._borrower = None

    def _borrow_turns(self) -> None:
        """Give back the loans of tasks that ended
        (``SVC_PG_RETURN``), then ask the service for room for each waiting task
        (``SVC_PG_LEND``, once per bundle and request shape a turn), start those it lends
        room to (``RemoteNodes.run_in_bundle`` on a lease-less bundle of that room, on
        this driver's own link to the node), and wait LOAN_POLL_S (or a kick) while some
        still wait. Ends when nothing is left to give back or ask."""
        owner = self.owner
        while True:
            self._wake.clear()
            with owner.locked():
                returns, self._returns = self._returns, []
                for pg_hex, queue in list(self.served_waiting.items()):  # cancelled: out
                    kept = collections.deque(t for t in queue
                                             if not t.cancelled and t.state != T_DONE)
                    if kept:
                        self.served_waiting[pg_hex] = kept
                    else:
                        del self.served_waiting[pg_hex]
                asks = [task for queue in self.served_waiting.values() for task in queue]
                last = owner.closed or (not returns and not asks)
                if last:
                    self._borrower = None
            self._give_back(returns)  # taken: sent even when closing (no one else will)
            if last:
                return
            denied = set()
            for task in asks:
                pg_hex, index, base = placement.bundle_request(task.spec.request)
                shape = (pg_hex, index, tuple(sorted(base.items())))
                if shape in denied:
                    continue
                client = answer = None
                try:
                    answer = self._ask_lender(pg_hex, index, base)
                    if isinstance(answer, tuple):  # the link to its node (opened once)
                        client = self.nodes.client(answer[2])
                except Exception:  # noqa: BLE001 - the service or the node is gone: the
                    if isinstance(answer, tuple):  # watch ends the work of a removed group
                        with owner.locked():
                            self._returns.append(answer[0])  # given back next turn
                    answer = None
                if answer is None:
                    denied.add(shape)
                with owner.locked():
                    self._lent(task, pg_hex, base, answer, client)
            if asks and not returns:
                self._wake.wait(self.LOAN_POLL_S)

    def _ask_lender(self, pg_hex: str, index: int, base: dict):
        """*Not locked* (one request to the group's lender). Step 2: ``(loan key, index,
        NodeEntry, GPU ids)`` (the key: ``(lender, loan id)``, the lender None for the
        service), None or "here". A loan on a node this driver's view does not show
        alive goes back (next turn) and None is the answer."""
        with self.owner.locked():
            lender = self.lenders.get(pg_hex)
        if lender is None:
            answer = self.owner.actors.borrow_room_in_service(pg_hex, index, base)
            if isinstance(answer, tuple):
                return ((None, answer[0]),) + tuple(answer[1:])
            return answer
        doc = self.ask_driver(lender, LEND_ASK_S, "pg_lend", pg=pg_hex, index=index,
                               base=base)
        if "error" in doc:
            raise RuntimeError(doc["error"])
        loan = doc.get("loan")
        if not isinstance(loan, list):
            return loan
        loan_id, picked, node_id, gpu_ids = loan
        entry = self.nodes.alive_entry(node_id)
        if entry is None:
            with self.owner.locked():
                self._returns.append((lender, loan_id))
            return None
        return (lender, loan_id), picked, entry, gpu_ids

    def ask_driver(self, lender, timeout: float, what: str, **fields) -> dict:
        """*Not locked* (one request). A loan request to a lending driver: on its state
        socket (``lender`` its path: a driver of this node), or through its node
        (``lender`` ``("node", node id, hex)``: a driver of another host, ``remote_bundles``
        step 10, the group named in ``fields``: ``pg``; that node's trouble is an OSError,
        as the socket's). Also the actor manager's, for an actor's loan (step 6)."""
        from miniray._private.transport import state_socket  # lazy: a borrower's only

        if not isinstance(lender, tuple):
            return state_socket.ask(lender, timeout, what, **fields)
        from miniray._private.transport.remote_node import RemoteLeaseError  # lazy
        from miniray.exceptions import NodeDiedError  # lazy: as remote_nodes

        entry = self.nodes.alive_entry(lender[1])
        if entry is None:
            raise OSError(f"the lending driver's node {lender[1][:12]} is not alive")
        try:
            return self.nodes.client(entry).loan(what, fields, timeout + 2.0)
        except (NodeDiedError, RemoteLeaseError) as error:
            raise OSError(str(error)) from None

    RETURN_AT_EXIT_S = 2.0  # at most this long for the loans of ended tasks at shutdown

    def return_loans(self, timeout_s: float | None = None) -> int:
        """*Not locked.* Teardown step 1 (ARCHITECTURE.md), before the driver closes its link
        to the service: the loans of tasks that ended and that the borrower thread has not
        given back yet are sent now, within ``timeout_s`` (RETURN_AT_EXIT_S) in all; those
        left (no time, or the service does not answer) come back when the link closes
        (``drop_loans``). How many were sent. Nothing is sent when the link is down: the
        loans were its, and the service gave them back when it closed (a new link would
        cost a connect, up to seconds, at every shutdown after a lost node)."""
        deadline = time.monotonic() + (self.RETURN_AT_EXIT_S if timeout_s is None
                                       else timeout_s)
        with self.owner.locked():
            returns, self._returns = self._returns, []
        link = getattr(self.owner.actors, "link", None)
        if link is not None and not link.connected():
            returns = [key for key in returns if key[0] is not None]  # a driver's: sent
        return self._give_back(returns, deadline)

    def _give_back(self, returns: list, deadline: float | None = None) -> int:
        """*Not locked.* ``SVC_PG_RETURN`` (a driver lender: ``pg_return``) for each loan
        key of ``returns``, each request waiting at most until ``deadline`` (None: the
        link's own timeout); how many the lenders took back."""
        from miniray._private.owner.actor_link import ServiceUnavailable  # lazy: as actors

        sent = 0
        service_gone = False
        for lender, loan_id in returns:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break  # the link's closing gives the rest back (drop_loans)
            if lender is not None:  # a driver: it drops them itself once this one is gone
                try:
                    fields = {"pg": lender[2]} if isinstance(lender, tuple) else {}
                    self.ask_driver(lender, LEND_ASK_S if left is None else left,
                                     "pg_return", loan=loan_id, **fields)
                    sent += 1
                except (OSError, TimeoutError):
                    logger.warning("loan %s: the lending driver did not take it back",
                                   loan_id, exc_info=True)
                continue
            if service_gone:
                continue
            try:
                self.owner.actors.return_room_in_service(loan_id, left)
                sent += 1
            except (ServiceUnavailable, OSError):
                service_gone = True  # the service is gone: its loans went with it
                continue
            except Exception:  # noqa: BLE001 - its answer was an error (SVC_ERR)
                logger.warning("loan %s: the node's actor service refused it back",
                               loan_id, exc_info=True)
        return sent

    def _lent(self, task, pg_hex: str, base: dict, answer, client=None) -> None:
        """*Locked.* The service's answer for ``task``: None (no room now: it waits),
        "here" (its bundle is on this node now: the owner's queue), or a loan: the task
        starts in it, unless it left its queue meanwhile (the loan goes back)."""
        queue = self.served_waiting.get(pg_hex)
        waiting = queue is not None and task in queue and not task.cancelled
        if answer is None:
            return
        if answer == "here" and pg_hex in self.served_everywhere:
            if waiting:  # on the lender's node (the head's service, or a driver of another
                queue.remove(task)  # host: its node), whose ledger provides it
                self._run_on_head(task, pg_hex)
            return
        if answer == "here":
            self.served.pop(pg_hex, None)  # read again from the ledger when it is needed
            self.lenders.pop(pg_hex, None)
            if waiting:
                queue.remove(task)
                task.state, task.worker = T_WAITING, None
                self.owner.tasks.resubmit(task)
            return
        loan_id, index, entry, gpu_ids = answer
        if not waiting or self.owner.closed:
            self._returns.append(loan_id)
            return
        queue.remove(task)
        if not queue:
            self.served_waiting.pop(pg_hex, None)
        bundle = self._loaned(pg_hex, index, base, entry, client, gpu_ids, loan_id)
        self.running.setdefault(pg_hex, set()).add(task)
        self.nodes.run_in_bundle(task, bundle, gpu_ids)

    def _run_on_head(self, task, pg_hex: str) -> None:
        """*Locked.* A driver on a member: ``task`` asks for a bundle of a group the head's
        service holds on the head itself (or a driver of another host holds on its node:
        that node): it runs there under a lease of its (rewritten)
        request, which the head's ledger provides from the group's bundle, as a task of
        another node with custom resources does (a denial: asked again until room). It is
        among the group's ``running`` until it ends (``ended_on_head``): the group's
        removal fails it and kills its worker (or keeps it from being sent), as for a task
        in a remote bundle."""
        lender = self.lenders.get(pg_hex)
        if isinstance(lender, tuple):  # a driver of another host: its node
            head = self.nodes.alive_entry(lender[1])
        else:
            head = next((e for e in self.nodes.view() if e.is_head and e.alive), None)
        if head is None:
            from miniray.exceptions import TaskUnschedulableError  # lazy: as remote_nodes

            self.owner.tasks.fail(task, TaskUnschedulableError(
                f"task {task.spec.name}: its placement group bundle is on the lending "
                "node, which is not in the cluster's view now"))
            return
        task.state, task.worker = T_WAITING, None
        self.running.setdefault(pg_hex, set()).add(task)
        self.nodes._begin(task, head.node_id)

    def ended_on_head(self, task) -> None:
        """*Locked.* A task of a placement group run without a bundle of this module
        (``_run_on_head``) ended, however it ended: no longer among its group's running."""
        parsed = placement.bundle_request(task.spec.request)
        running = self.running.get(parsed[0]) if parsed is not None else None
        if running is not None:
            running.discard(task)

    def lend_room(self, pg_hex: str, index: int, base: dict, token, far: bool = False):
        """*Locked* (for ``far``, one lock-free read of this node's ledger at most). A
        lender's side (the service: ``SVC_PG_LEND``; a driver: ``answer_borrower``): room
        for a task of the driver ``token`` (the service's client token, or
        ``borrower_token``) in bundle ``index`` (-1: any) of a group this owner holds on
        other nodes, taken from the bundle as for a task of its own: ``(loan id, bundle
        index, NodeEntry, GPU ids)``; None: no room now (or the bundle is lost); "here":
        the bundle is on this node now (the ledger provides it; a group of this owner with
        no bundle on other nodes too: asked by a driver on another host). ``far``: the
        driver is on another host (it runs a task answered "here" on this node under a
        lease: ``_run_on_head``), so "any bundle" is every bundle of the group: one on
        another node with room now first, else "here" when a bundle of this node has room
        now (``_room_here``)."""
        parts = self.groups.get(pg_hex)
        if parts is None:
            group = self.owner.pgs.groups.get(pg_hex)
            return "here" if group is not None and group.state == CREATED else None
        if (index >= 0 and index not in parts) or (index < 0 and not parts):
            return "here"  # placed again on this node (a lost one stays in parts till then)
        usable = self._usable(pg_hex, parts)
        picked = self._pick(base, index, usable)
        if picked is None:
            return "here" if far and index < 0 and self._room_here(pg_hex, base) else None
        bundle = usable[picked]
        self._loan_seq += 1
        loan_id = self._loan_seq
        for name, amount in base.items():
            bundle.free[name] = bundle.free.get(name, 0.0) - float(amount)
        gpu_ids = bundle.take_gpus(("loan", loan_id), float(base.get("GPU", 0.0)))
        self.lent_out[loan_id] = (bundle, dict(base), token)
        return loan_id, picked, bundle.entry, gpu_ids

    def _room_here(self, pg_hex: str, base: dict) -> bool:
        """*Locked* (one lock-free read of this node's ledger). Whether a bundle of the
        group on this node has room now for a task of ``base`` (``placement.bundles_free``:
        as the ledger resolves "any bundle"; it decides when the task's lease is asked,
        and a denial there is asked again as for any task of another node)."""
        if not self.has_local.get(pg_hex):
            return False
        try:
            available = self.owner.ledger.available()
        except (OSError, ValueError):  # the node's ledger went with the node
            return False
        return placement.pick_bundle(base, -1, placement.bundles_free(available, pg_hex)) \
            is not None

    def return_room(self, loan_id: int) -> None:
        """*Locked.* A lender's side (``SVC_PG_RETURN``, ``pg_return``): a loan's room
        comes back."""
        loan = self.lent_out.pop(loan_id, None)
        if loan is None:
            return
        bundle, base, _token = loan
        for name, amount in base.items():
            bundle.free[name] = bundle.free.get(name, 0.0) + float(amount)
        bundle.give_gpus(("loan", loan_id))
        self._pump(bundle.pg_hex)

    def drop_loans(self, token) -> int:
        """*Locked.* A lender's side: the driver ``token`` left (the service: its link
        closed; a driver: ``gone_borrowers``); its loans come back. The room of its actors
        the service was not known to hold yet (``lend_actor_room``: it went before saying,
        ``actor_kept``) stays lent while the service holds the actor alive, as a kept
        loan, since the service may have taken it already; the watch gives it back once
        the service does not, DROPPED_LOAN_GRACE_S from now at the earliest (a creation
        still on its way to the service: ``loans_ended``)."""
        ended = [i for i, loan in self.lent_out.items() if loan[2] == token]
        for loan_id in ended:
            self.return_room(loan_id)
        unsent = [a for a, t in self.actor_loans_unsent.items() if t == token]
        deadline = time.monotonic() + DROPPED_LOAN_GRACE_S
        for actor_id in unsent:
            del self.actor_loans_unsent[actor_id]
            self.actor_loans_dropped[actor_id] = deadline
        return len(ended) + len(unsent)

    # -- step 6: another driver's actor in this driver's bundle --------------------------
    def lend_actor_room(self, pg_hex: str, index: int, base: dict, held: dict,
                        actor_id: bytes, token):
        """*Locked.* A driver lender's side of an actor's loan (the module docstring's
        step 6): room for actor ``actor_id`` of the driver ``token`` in bundle ``index``
        (-1: any) of this driver's group, taken as for a named actor of its own (``take``,
        ``lend``: kept while the node's actor service holds the actor alive), ``held`` of
        it kept for the actor's life: ``(bundle index, NodeEntry, GPU ids)``; None (no room
        now), or "here" (as ``lend_room``). Until the borrower says the service took the
        actor (``actor_kept``) the loan is the borrower's: its end gives it back."""
        parts = self.groups.get(pg_hex)
        if parts is None or (index >= 0 and index not in parts) or (index < 0 and not parts):
            return self.lend_room(pg_hex, index, base, token)  # "here" or None, no loan
        if actor_id in self.loans:  # asked again (its answer was lost): the same room
            bundle = self.loans[actor_id][0]
            return bundle.index, bundle.entry, bundle.gpus_of(actor_id)
        usable = self._usable(pg_hex, parts)  # "any bundle": one of these, with room
        picked = self._pick(base, index, usable)
        bundle = None if picked is None else self.take(
            placement.rewrite_request(base, pg_hex, picked),
            placement.rewrite_request(held, pg_hex, picked), actor_id)
        if bundle is None:
            return None
        self.lend(actor_id, bundle, placement.rewrite_request(held, pg_hex, bundle.index))
        self.actor_loans_unsent[actor_id] = token
        return bundle.index, bundle.entry, bundle.gpus_of(actor_id)

    def actor_kept(self, actor_id: bytes, kept: bool, token) -> None:
        """*Locked.* A driver lender's side: the borrower ``token`` created actor
        ``actor_id`` in the node's actor service in the room lent (``kept``: from now on
        the group watch keeps it while the service holds the actor alive), or could not
        (its room comes back). Only from the borrower it was lent to."""
        if self.actor_loans_unsent.get(actor_id) != token:
            return
        del self.actor_loans_unsent[actor_id]
        if not kept:
            self.end_loan(actor_id)
