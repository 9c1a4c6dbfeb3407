"""Actors on other hosts: placing an actor on another node, its worker there, its death.

Owns: the decision which actor goes to another node (``where``: ``task_nodes.placement_for``
on the actor's placement request, unchanged), one thread per such actor that leases its
resources on that node for the actor's life, spawns its worker there (the ticket and attach
path of ``remote_nodes``, called, not copied), hands it to the actor manager, then reads
the worker's data connection until it ends; the ``RemoteActorWorker`` that stands in the
manager for a local worker (``actor.worker``, ``elsewhere`` True: messages go out through
its sender thread, in order); and what the end of that worker means (worker or node died,
the lease released). Does not own: the actor's state, queue, restarts and death
(``actors.ActorManager``, which calls ``where`` from its placer and at creation), the links
to other nodes and their workers' spawning and large-value transfers (``remote_nodes``), the
node's side (``node/remote_drivers.py``), or what runs in the actor (``actor_host.py``).
Called by: ``actors.ActorManager`` (``where``, locked), and the threads below.

Steps for actor A of owner D placed on node N (N's half: ``remote_drivers.py``)::

    1. Placement, under the owner's lock (``where``, from the manager's placer; D may be
       the node's actor service, which owns named and detached actors: its RESULTs then
       go on to the calling driver, and A's output to the creating one, as for its local
       actors): only an actor with a NodeAffinitySchedulingStrategy or
       ``scheduling_strategy="SPREAD"``, or a request this node can never hold, or one whose
       constructor is given a result kept on a node (``_near_args``: that node when it
       holds more than ``MOVE_MAX_ARG_BYTES`` of the arguments, with room now, as a
       task's rule 2 exception; docs/remote-objects.md; one this node can never hold goes
       to the node with room holding most of them), outside a placement group; or
       one in a placement group's bundle on another node
       (``remote_bundles.RemoteBundles``): it goes to that bundle's node when the bundle
       has room for it (``take``; else None, and the placer asks again), holds what it
       holds of the bundle for its life, its own share of the bundle's GPUs included (the
       ids its worker sees; ``give_back`` when its worker ends), and takes no
       lease of its own (step 2 skips "lease"; step 5 releases none); in the node's
       actor service, one of another driver's group in a bundle on that driver's own
       node, which is not this one (``RemoteBundles.leased_there``), goes to that node
       and leases its room there as step 2 says, that node's ledger providing it from
       the group's bundle. SPREAD actors take
       turns (``_spread_turn``) among equally used nodes, this one included, on a view
       that counts the driver's own live SPREAD actors, shown there yet or not
       (``_spread_view``).
       ``placement_for``'s rules: a hard affinity to an alive node with the totals runs
       there; to one dead, unknown or too small, A dies with ActorUnschedulableError
       (Ray's: calls raise it); soft, or none: as for tasks. None: placed on this node as
       before (one that no node can hold waits, and is placed again every
       INFEASIBLE_WATCH_S while it waits: a node may join). After N died under A, N is
       excluded from A's next placement (its restart).
    2. A thread, not locked: N's client (``RemoteNodes.client``); ("lease", A's held
       resources) until granted (``RemoteNodes.lease``: a denial waits and asks again, or
       moves to another node with room now); ("spawn") and the four attach connections;
       HELLO on the worker's MAC'd data connection. The lease is A's for its whole life.
    3. Under the lock: A killed meanwhile, or the driver closing: the worker is closed and
       the lease released. Else ``ActorManager._start`` with this ``RemoteActorWorker``:
       FUNC, ACTOR_INIT and every call (ACTOR_CALL, in submission order) go to the
       sender thread's queue and out in that order; an argument stored in this driver's
       shared memory travels by value (``("peer", bytes)``, read from its pinned segment
       by the sender, outside the lock). An argument kept on a node (a result there,
       never pulled here: ``actors.ActorManager._pump``, or ``_start`` for ACTOR_INIT)
       comes as ``("kept", id, RemoteCopy)`` and the sender resolves it before it sends
       the call (``_kept_args``): on N, N's copy (``("shm", path, size)``); on another
       node, N fetches it from there with this driver's grant (``KeptResults.fetch``);
       that failing, pulled here and sent by value; lost, the call fails with its
       argument's error and is not sent (a constructor's: the actor dies,
       ``_init_failed``). The calls after it wait in the queue meanwhile: none
       overtakes it.
    4. The thread reads the data connection: ACTOR_READY, RESULT (each large value's bytes
       follow it in frames, received straight into a segment of this driver's store:
       ``RemoteNodes.adopt_results``; one the worker kept on N, as a task's, since its
       HELLO carried the link's keep tag, is booked there: ``KeptResults.keep_results``)
       and ACTOR_EXITING go to the manager under the lock (the node's actor service's
       workers get the tag only once it holds the link's grant key, which lets it hand
       a kept result on to its caller: ``_keeps_for_callers``),
       as a local worker's (RESULT's contained refs too). What its methods and constructor
       ask the driver for is served as a remote task's is (``RemoteRequests``, one per
       worker, ``task`` None): a nested task's parent is the call that submits it
       (``tasks.call_parent``); PUT, BORROW, ACTOR_SUBMIT and CALL in this thread; GET and
       WAIT on helper threads (``_Blocking``: at most BLOCKING_THREADS, more wait their
       turn), so the results of its other calls are still read while one waits; so are
       the CALLs that may wait (``BLOCKING_CALLS``: a generator's next value, actor
       requests the node's actor service answers). A streaming method's values (YIELD)
       are taken in order in this thread. Their REPLYs and the calls out share
       ``send_lock``. Its borrows end with the worker. A request nobody serves ends the
       actor, never restarted, saying so.
       While the worker is silent, N is looked up in the view every WATCH_S: dead there,
       or a new incarnation, is N lost (a partition leaves the sockets open).
    5. The data connection ends (EOF, N lost): the worker is closed, the lease released
       (N alive), and ``on_worker_exit``: a restart while ``max_restarts`` allows (step 1
       again, N excluded when N died), else ActorDiedError with Ray's fields, naming N's
       IP, and Ray's "The actor died because its node has died. Node Id: ..." when N died.
       ``ray.kill`` asks N over the driver link to SIGKILL the worker (its EOF follows;
       asked again after a timeout, ``kill_on_node``, else its connections are closed); the
       handle going out of scope sends ``__ray_terminate__`` and the worker exits.
       A node lost before A started there places A again, N excluded (at most FREE_MOVES
       times), then A dies naming N. Every wait on N has a deadline or ends with its
       connection; the driver's shutdown closes the links, and N kills their workers.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time

from miniray._private.core import ids, node_pick, protocol, serialization, task_nodes
from miniray._private.core.dependency_errors import dependency_error, dependency_error_bytes
from miniray._private.core.resources import infeasible_reasons
from miniray._private.object_store import shm_segments
from miniray._private.owner import remote_nodes as rn
from miniray._private.owner import remote_worker
from miniray._private.owner.actor_records import A_DEAD
from miniray._private.owner.remote_objects import KeepRefused
from miniray._private.owner.remote_requests import BLOCKING_CALLS, RemoteRequests
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.remote_node import RemoteLeaseError

__all__ = ["KILL_PAUSE_S", "KILL_TRIES", "RemoteActorWorker", "RemoteActors", "kill_on_node"]

logger = logging.getLogger(__name__)

WATCH_S = rn.WATCH_S  # a silent actor's node is looked up in the view this often
FREE_MOVES = rn.FREE_MOVES  # an actor not started on a node that died is placed again
KILL_TIMEOUT_S = remote_worker.KILL_TIMEOUT_S
KILL_TRIES = 3  # a kill that timed out is asked again (``kill_on_node``)
KILL_PAUSE_S = 0.25  # before the second try; doubled before each later one
BLOCKING_THREADS = 32  # an actor's GETs and WAITs served at once; more wait their turn
PING_S = 1.0  # after its worker's EOF, whether the node still answers
EXIT_PINGS = 5  # then this many round trips for the worker's exit status, 20 ms apart


class _Ask:
    """What ``RemoteNodes.lease`` reads of a task's spec, for an actor's lease."""

    def __init__(self, spec):
        self.request = {k: float(v) for k, v in (spec.held or {}).items() if v}
        self.name = f"actor {spec.class_name}"
        self.affinity = spec.affinity
        self.task_id = ids.actor_creation_task_id(spec.actor_id)
        self.return_ids: list = []


class _Waiting:
    """What ``RemoteNodes.lease`` reads of a task's slot: a killed actor stops asking."""

    def __init__(self, actor):
        self.actor = actor

    @property
    def cancelled(self) -> bool:
        return self.actor.state == "DEAD"


def kill_on_node(client, pid: int, tries: int = KILL_TRIES) -> str | None:
    """*Not locked* (round trips). Ask N over ``client`` to SIGKILL its worker ``pid``
    (``remote_drivers`` step 10): None once N killed it, or answered that it is no worker
    of this link (it exited: nothing is left to kill). A timeout (the link blipped, N was
    slow) is asked again, ``tries`` in all, KILL_PAUSE_S apart and doubling; the link
    lost (NodeDiedError: N kills every worker of a link that closes, step 5) or another
    refusal is not. Else the last error's text."""
    from miniray.exceptions import NodeDiedError  # lazy: the public package

    why = "not asked"
    for attempt in range(max(1, tries)):
        try:
            client.kill(pid, timeout=KILL_TIMEOUT_S)
            return None
        except RemoteLeaseError as error:
            return None if error.kind == "unknown_worker" else str(error)
        except NodeDiedError as error:
            return str(error)
        except (OSError, TimeoutError) as error:
            why = str(error) or type(error).__name__
            if attempt + 1 < tries:
                time.sleep(KILL_PAUSE_S * (2 ** attempt))
    return why


class RemoteActorWorker:
    """An actor's worker on another node, where the actor manager reads a local worker:
    ``send`` (never blocks: its sender thread writes), ``kill_later``, ``ctl`` (CANCEL),
    ``pid``, ``ip``, ``gpu_ids``, ``death_reason`` (set when its node died)."""

    elsewhere = True

    def __init__(self, inner, client, entry, lease_id: str, gpu_ids: list, store,
                 kept=None):
        self.inner = inner  # remote_worker.RemoteWorker: its channels and output readers
        self.client = client
        self.pid = inner.pid
        self.ctl = inner.ctl
        self.out, self.err = inner.out, inner.err  # the actor service routes their lines
        self.node = entry.node_id
        self.ip = entry.ip
        self.incarnation = entry.incarnation
        self.lease_id = lease_id
        self.gpu_ids = gpu_ids or None
        self.actor = None
        self.funcs: set = set()
        self.interrupted: set = set()  # what requests.interrupt reads of a worker
        self.waits: dict = {}
        self.kill_on_spawn = False
        self.dead = False
        self.death_reason: str | None = None
        self._store = store  # this driver's, for arguments in shared memory
        self._kept = kept  # RemoteActors._kept_args: arguments kept on a node, read there
        self.send_lock = threading.Lock()  # a message, or a REPLY and its frames, at a time
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="miniray-remote-actor-send")
        self._sender.start()

    def __repr__(self) -> str:
        return f"<RemoteActorWorker pid={self.pid} node={self.node[:12]} ip={self.ip}>"

    def send(self, message: tuple) -> None:
        """*Locked.* Queued; the sender writes it after those before it."""
        self._outbox.put(message)

    def _send_loop(self) -> None:
        data = self.inner.data
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                message = self._by_value(message)
                if message is None:
                    continue  # failed here (an argument lost), or the worker is lost
                with self.send_lock:
                    data.send(message)
            except (OSError, ValueError, pc.PeerClosed) as error:
                logger.debug("actor worker %s: %s", self.pid, error)
                self.dead = True  # the reader sees the end and reports it

    def _by_value(self, message: tuple) -> tuple | None:
        """ACTOR_INIT and ACTOR_CALL name their arguments' objects; one in this driver's
        shared memory goes by value, as ``("peer", bytes)`` (the worker loads it as a
        remote task's large argument). Its segment is pinned until the call ends. One
        kept on a node (``("kept", id, RemoteCopy)``, step 3): ``_kept`` says how the
        worker reads it (None: the call does not go)."""
        tag = message[0]
        index = 5 if tag == protocol.ACTOR_INIT else 4 if tag == protocol.ACTOR_CALL else None
        deps = message[index] if index is not None else None
        if not deps or not any(isinstance(d[2], tuple) for d in deps):
            return message
        if any(d[2][0] == "kept" for d in deps if isinstance(d[2], tuple)):
            deps = self._kept(self, message[1], deps)
            if deps is None:
                return None
        out = []
        for position, kind, payload in deps:
            if isinstance(payload, tuple) and payload[0] == "there":
                payload = payload[1]  # ("shm", path, size) of the copy on its node
            elif isinstance(payload, tuple) and payload[0] != "peer":
                path = shm_segments.resolve_path(payload[1], self._store.shm_dir)
                with open(path, "rb") as f:
                    payload = ("peer", f.read())
            out.append((position, kind, payload))
        return message[:index] + (out,) + message[index + 1:]

    def kill_later(self) -> None:
        """*Locked.* ``ray.kill``: N SIGKILLs the worker (asked from a thread: a round trip,
        ``kill_on_node``: tried again after a timeout); its EOF then reaches the reader.
        Not killed there: its connections are closed (it exits on their EOF once it reads)."""
        def kill():
            why = kill_on_node(self.client, self.pid)
            if why is not None:
                logger.warning("could not kill the actor worker pid=%s on node %s (%s); "
                               "closing its connections", self.pid, self.ip, why)
                self.inner.close()
        threading.Thread(target=kill, daemon=True, name="miniray-remote-actor-kill").start()

    def close(self) -> None:
        self._outbox.put(None)
        self.inner.close()


class RemoteActors:
    """The owner's actors on other nodes (see the module docstring). Made under the owner's
    lock by the actor manager, at the first actor that may go elsewhere."""

    def __init__(self, owner, manager):
        self.owner = owner
        self.manager = manager
        self.nodes = owner._remote_nodes()  # the links and workers of remote tasks
        self.excluded: dict[bytes, str] = {}  # actor id -> the node that died under it
        self.moves: dict[bytes, int] = {}  # actor id -> free placements after a node loss
        self.started = 0
        self.spread_turns = 0  # SPREAD actors placed so far (_spread_turn)
        self.spread_on: dict[bytes, str] = {}  # SPREAD actor id -> its node (_spread_view)
        self.in_bundle: dict = {}  # actor id -> the RemoteBundle its worker holds room in

    def __repr__(self) -> str:
        return f"<RemoteActors started={self.started}>"

    # -- step 1 ----------------------------------------------------------------------------
    def where(self, spec, actor=None):
        """*Locked.* Step 1: None (this node, as before), a node id, or an ``Unschedulable``
        text. With ``actor`` (the placer's), a node id starts step 2 and an Unschedulable
        one ends the actor with ActorUnschedulableError."""
        nodes = self.nodes
        if nodes.closed:
            return None
        if spec.pg is not None:
            return self._in_bundle(spec, actor)
        local_feasible = not infeasible_reasons(self.owner.node_state, spec.placement)
        exclude = self.excluded.get(spec.actor_id)
        turn = self._spread_turn(spec, actor)
        # One this node can never hold goes to a node with room, the one holding most of
        # its constructor's kept arguments first (rule 4); one it can: ``_near_args``.
        arg_bytes = None if local_feasible or spec.affinity is not None else \
            nodes._arg_bytes(spec)
        placed = task_nodes.placement_for(spec.affinity, spec.placement, nodes.local,
                                          self._spread_view(spec, nodes.view()),
                                          local_feasible, exclude, turn=turn,
                                          arg_bytes=arg_bytes)
        if isinstance(placed, task_nodes.Unschedulable):  # it may have joined since the last read
            placed = task_nodes.placement_for(spec.affinity, spec.placement, nodes.local,
                                              self._spread_view(spec, nodes.view(fresh=True)),
                                              local_feasible, exclude, turn=turn,
                                              arg_bytes=arg_bytes)
        if actor is not None and spec.affinity == task_nodes.SPREAD and (
                placed is None or isinstance(placed, str)):
            self.spread_on[spec.actor_id] = placed or nodes.local
        if placed is None and spec.affinity is None and local_feasible:
            placed = self._near_args(spec, exclude)
        if placed is None and actor is not None and not local_feasible and nodes.last_view():
            self._watch()  # no node can hold it now: one may join
        if placed is None or actor is None:
            return placed
        from miniray.exceptions import ActorUnschedulableError  # lazy: the public package

        entry = next((e for e in nodes.last_view() if e.node_id == placed), None)
        if isinstance(placed, task_nodes.Unschedulable) or entry is None:
            why = (str(placed).replace("the task run", "the actor run")
                   if isinstance(placed, task_nodes.Unschedulable)
                   else f"the node {placed} chosen for it left the cluster's view")
            self.manager._die(actor, serialization.dumps(ActorUnschedulableError(
                f"actor {spec.class_name} ({spec.actor_id.hex()}): {why}")), init=True)
            return placed
        threading.Thread(target=self._run, args=(actor, entry), daemon=True,
                         name="miniray-remote-actor").start()
        return placed

    def _near_args(self, spec, exclude) -> str | None:
        """*Locked.* Step 1 for an actor without a strategy that this node can hold: the
        node holding more than ``MOVE_MAX_ARG_BYTES`` of its constructor's arguments (more
        than this node holds) with room now for it (``node_pick`` rule 2's exception, as
        for a task: ``RemoteNodes.locate``), else None (this node)."""
        nodes = self.nodes
        arg_bytes = nodes._arg_bytes(spec)
        if not any(n != nodes.local and size > node_pick.MOVE_MAX_ARG_BYTES
                   for n, size in arg_bytes.items()):
            return None
        view = [e for e in nodes.view() if e.node_id != exclude]
        placed = node_pick.pick_node(spec.placement, nodes.local, view, arg_bytes=arg_bytes,
                                     local_holds=True)
        if placed.action != "node" or placed.node_id in (None, nodes.local) or \
                arg_bytes.get(placed.node_id, 0) <= node_pick.MOVE_MAX_ARG_BYTES:
            return None  # rule 2 kept it here, or no room there now: here, as before
        return placed.node_id

    def _in_bundle(self, spec, actor):
        """*Locked.* Step 1 for an actor in a placement group's bundle on another node: that
        node once the bundle has room (the thread starts), else None (it waits). One of
        another driver's group in a bundle on that driver's own node (not this one's,
        ``RemoteBundles.leased_there``): that node, under a lease of its request there,
        which the node's ledger provides from the group's bundle (a denial: asked again,
        as for any actor on another node)."""
        if actor is None:
            return None
        there = self.nodes.bundles.leased_there(spec.actor_id)
        if there is not None:
            threading.Thread(target=self._run, args=(actor, there), daemon=True,
                             name="miniray-remote-actor").start()
            return there.node_id
        bundle = self.nodes.bundles.take(spec.placement, spec.held, spec.actor_id)
        if bundle is None:
            self.owner.retry_soon()  # the placer asks again: room comes back in a bundle
            return None
        self.in_bundle[spec.actor_id] = bundle
        threading.Thread(target=self._run, args=(actor, bundle.entry, bundle), daemon=True,
                         name="miniray-remote-actor").start()
        return bundle.node_id

    def lent_moved(self, actor, entry, gpu_ids, here: bool = False) -> bool:
        """*Locked.* The node's actor service: ``actor``'s lending driver placed its bundle
        again on ``entry``'s node after its node died, and lends its room there, or
        (``here``) on its own node, another than this one, whose ledger provides it
        (``remote_bundles`` step 7): its restart is placed there. False (the driver ends
        the loan and kills it): no restart is left to it, or it has no lent room here."""
        spec = actor.spec
        bundles = self.nodes.bundles
        running = spec.actor_id in self.in_bundle  # its node's death not seen here yet
        if spec.pg is None or (running and actor.restarts_left == 0):
            return False
        if not bundles.lent_moved(spec, entry, gpu_ids, running, here):
            return False
        if not running:  # out of the placer's queue while it waited (AWAITS_LENDER), or
            self.manager.place_again(actor)  # in it: the placer finds its room now
        return True

    def _give_back(self, actor) -> None:
        """*Locked.* The actor's worker in a remote bundle ended (or never started): what
        it held goes back to the bundle (once)."""
        bundle = self.in_bundle.pop(actor.spec.actor_id, None)
        if bundle is not None:
            self.nodes.bundles.give_back(bundle, actor.spec.held, actor.spec.actor_id)

    def _spread_turn(self, spec, actor) -> int:
        """*Locked.* SPREAD's rotation among equally used nodes (``node_pick`` rule 4): one
        turn per SPREAD actor placed (``actor`` given: the placer's), so actors created
        back to back, before a heartbeat shows the first one's use, take the nodes in turn
        (Ray's spread policy goes round the nodes too). 0 for any other actor."""
        if spec.affinity != task_nodes.SPREAD:
            return 0
        turn = self.spread_turns
        if actor is not None:
            self.spread_turns += 1
        return turn

    def _spread_view(self, spec, view: list) -> list:
        """*Locked.* ``view`` for a SPREAD actor: each node's room at most its totals less
        what this driver's live SPREAD actors placed there hold (``node_pick.at_least_own``).
        The view lags them: read while the first one's worker started here, it showed that
        one and not the next, placed elsewhere a moment later, and the least used node then
        took the two after it as well (3 and 1 over two nodes, not 2 and 2)."""
        if spec.affinity != task_nodes.SPREAD or not self.spread_on:
            return view
        own: dict[str, dict[str, float]] = {}
        for actor_id, node_id in list(self.spread_on.items()):
            actor = self.manager.actors.get(actor_id)
            if actor is None or actor.state == A_DEAD:
                del self.spread_on[actor_id]  # gone: its node's view shows it no more
                continue
            if actor_id == spec.actor_id:
                continue  # placed again (a restart): where it was counts no more
            use = own.setdefault(node_id, {})
            for name, amount in (actor.spec.held or {}).items():
                if amount:
                    use[name] = use.get(name, 0.0) + float(amount)
        return node_pick.at_least_own(view, own)

    def _watch(self) -> None:
        """*Locked.* Step 1 again every INFEASIBLE_WATCH_S for the pending actors this node
        can never hold, while there are any: a node that can may join, as Ray's pending
        actors wait for one. The remote nodes' one watcher reads the view outside the lock
        and calls ``_recheck``; the placer does the rest."""
        self.nodes.watch(self._recheck)

    def _recheck(self, nodes: list) -> bool:
        """*Locked.* ``_watch``'s turn: the pending actors this node can never hold are
        offered to the placer again (``nodes`` is the fresh view ``where`` reads); whether
        any was waiting."""
        owner, manager = self.owner, self.manager
        waiting = [a for a in manager.pending if a.state != "DEAD" and a.spec.pg is None
                   and infeasible_reasons(owner.node_state, a.spec.placement)]
        if waiting:
            manager.place_pending()
        return bool(waiting)

    # -- steps 2-5 -------------------------------------------------------------------------
    def _run(self, actor, entry, bundle=None) -> None:
        try:
            while entry is not None:
                entry = self._run_on(actor, entry, bundle)
        except BaseException:  # noqa: BLE001 - never leave the actor pending in silence
            logger.exception("actor %s on node %s", actor.spec.class_name, entry and entry.ip)
            from miniray.exceptions import ActorDiedError  # lazy: as above

            with self.owner.locked():
                self._give_back(actor)
                if actor.state != "DEAD" and actor.worker is None:
                    self.manager._die(actor, serialization.dumps(ActorDiedError(
                        actor_id=actor.spec.actor_id.hex(),
                        error_msg=f"miniray bug placing the actor on {entry and entry.ip}")))

    def _run_on(self, actor, entry, bundle=None):
        """Steps 2-5 on node ``entry``; returns another node's entry to try instead, or
        None when done. In a remote ``bundle``: its link, no lease of its own."""
        from miniray.exceptions import ActorUnschedulableError, NodeDiedError  # lazy: as above

        owner, nodes, spec = self.owner, self.nodes, actor.spec
        client = grant = inner = None
        try:
            if bundle is None:
                client = nodes.client(entry)
                grant = nodes.lease(client, _Ask(spec), _Waiting(actor), entry.node_id)
            else:
                client = bundle.client
                if client is None:  # a bundle lent by another driver: this owner's link
                    client = nodes.client(entry)
                    with owner.locked():
                        bundle.client = client
                if client.lost is not None:
                    raise NodeDiedError(f"the link that held bundle {bundle.index} of "
                                        f"placement group {bundle.pg_hex} was lost")
            pid, channels = client.spawn()
            inner = remote_worker.RemoteWorker(pid, channels, entry.node_id, entry.ip,
                                               owner.log_to_driver, owner.prefix_enabled)
            hello = owner.hello_info
            if spec.runtime_env:
                hello = {**hello, "runtime_env_key": spec.runtime_env}
            if client.kept is not None and self._keeps_for_callers(client):
                # Step 4: its large results stay on N, as a task's.
                hello = {**hello, "store": {**hello["store"], "keep_tag": client.kept[0],
                                            "keep_max": client.kept[1]}}
            inner.data.send((protocol.HELLO, hello))
        except remote_worker.Move as move:
            if grant is not None:
                nodes.release(client, grant.lease_id)
            return move.entry
        except remote_worker.Failed:  # killed while it waited for room, or the driver is closing
            self._abandon(actor, client, grant, inner)
            return None
        except RemoteLeaseError as error:  # N can never hold it
            self._abandon(actor, client, grant, inner)
            with owner.locked():
                if actor.state != "DEAD":
                    self.manager._die(actor, serialization.dumps(ActorUnschedulableError(
                        f"actor {spec.class_name}: node {entry.ip} refused its lease: "
                        f"{error}")), init=True)
            return None
        except (NodeDiedError, OSError, TimeoutError, pc.PeerRefused, pc.PeerAuthError) as error:
            if bundle is not None:  # the restart waits for the bundle's new place
                with owner.locked():
                    nodes.bundles.lose_bundle(bundle)
            self._abandon(actor, client, grant, inner)
            self._lost_before_start(actor, entry, str(error))
            return None
        if grant is not None:
            gpu_ids = [str(g) for g in grant.gpu_ids]
        else:  # its own share of the bundle's devices (``RemoteBundles.take``)
            with owner.locked():
                gpu_ids = bundle.gpus_of(spec.actor_id)
        worker = RemoteActorWorker(inner, client, entry, grant and grant.lease_id, gpu_ids,
                                   owner.store, kept=self._kept_args)
        with owner.locked():
            if actor.state == "DEAD" or owner.closed or actor.worker is not None:
                worker.close()
                self._give_back(actor)
                if grant is not None:
                    nodes.release(client, grant.lease_id)  # a round trip: only on this path
                return None
            self.started += 1
            self.moves.pop(spec.actor_id, None)
            self.manager._start(actor, None, None, worker)
            actor.pid = worker.pid
        self._read(actor, worker)
        return None

    def _keeps_for_callers(self, client) -> bool:
        """*Not locked.* Step 4: whether an actor's results may stay on N. Yes for this
        driver's own actors; for the node's actor service's (``route_output`` set), which
        hands each result on to the calling driver, only with N's grant key for its link
        (a round trip, once per link): the caller pulls with the service's grant of that
        result (``KeptResults.hand_on``). Without it they cross at once, as before."""
        if self.manager.route_output is None:
            return True
        try:
            self.nodes.kept_results.grant_key(client)
        except LookupError as failed:
            logger.info("results of the actors on %s cross at once: %s", client.name, failed)
            return False
        return True

    def _kept_args(self, worker: RemoteActorWorker, task_id: bytes, deps: list) -> list | None:
        """Step 3's arguments kept on a node (``("kept", id, RemoteCopy)``), on the
        worker's sender thread, not locked: the calls after this one wait behind it, so
        none overtakes it. Kept on the actor's node N: N's copy (the worker maps it).
        On another node: N fetches it from there with this driver's grant
        (``KeptResults.fetch``, once per object and node) and the worker maps N's copy.
        The fetch failing (or off): pulled into this driver's store and sent by value,
        as before. The argument lost: the call fails here with its error, as a local
        call's (None: it is not sent); the worker or the driver gone: None."""
        out = []
        for position, kind, payload in deps:
            if not (isinstance(payload, tuple) and payload[0] == "kept"):
                out.append((position, kind, payload))
                continue
            _tag, object_id, copy = payload
            if copy.node_id == worker.node and copy.path:
                out.append((position, kind, ("there", ("shm", copy.path, copy.size))))
                continue
            if rn.fetch_between_nodes():
                try:
                    path = self.nodes.kept_results.fetch(object_id, copy, worker.client,
                                                         _At(worker.node, worker.ip))
                except Exception as failed:  # noqa: BLE001 - any failure: through here
                    logger.info("node %s could not fetch object %s from node %s (%s); it "
                                "comes through this driver", worker.ip, object_id.hex()[:16],
                                copy.node_id[:12], failed)
                else:
                    out.append((position, kind, ("there", ("shm", path, copy.size))))
                    continue
            value = self._pulled(worker, task_id, object_id)
            if value is None:
                return None
            out.append((position, kind, value))
        return out

    def _pulled(self, worker: RemoteActorWorker, task_id: bytes, object_id: bytes):
        """``_kept_args``' fallback: the value pulled here, as ``("peer", bytes)`` or inline
        bytes; None when the call failed here (its argument's error) or nobody waits."""
        owner = self.owner
        items = None
        try:
            while items is None:
                if self.nodes.closed or worker.dead:
                    return None
                items = owner.get_serialized([object_id], WATCH_S)
            kind, data = items[0]
            if kind != protocol.ERR and not isinstance(data, (bytes, bytearray)):
                owner.store.pin(object_id)
                try:
                    path = shm_segments.resolve_path(data[1], owner.store.shm_dir)
                    with open(path, "rb") as f:
                        data = ("peer", f.read())
                finally:
                    owner.requests.unpin_ids([object_id])
        except Exception as error:  # noqa: BLE001 - freed, lost, or the driver closing
            kind, data = protocol.ERR, serialization.dumps(error)
        if kind != protocol.ERR:
            return data
        with owner.locked():
            actor = worker.actor
            if actor is not None and actor.spec.actor_id == task_id:  # its constructor's
                self._init_failed(actor, worker, data)
                return None
            call = self.manager.calls.get(task_id)
            if call is not None:
                failed = dependency_error_bytes(
                    data, f"{call.actor.spec.class_name}.{call.spec.call_name}")
                self.manager.on_result(worker, task_id,
                                       [(protocol.ERR, failed)] * max(1, call.spec.num_returns))
        return None

    def _init_failed(self, actor, worker: RemoteActorWorker, error: bytes) -> None:
        """*Locked.* A constructor's kept argument was lost before ACTOR_INIT went: the
        actor dies with the constructor's error naming its argument's (as a local
        actor's, ``ActorManager._init_error_from_dep``), never restarted; its worker is
        killed."""
        from miniray.exceptions import ActorDiedError  # lazy: the public package

        if actor.state == "DEAD":
            return
        failed = dependency_error(serialization.loads(error),
                                  f"{actor.spec.class_name}.__init__")
        actor.init_failed = True
        actor.restarts_left = 0
        self.manager._die(actor, serialization.dumps(ActorDiedError(failed)))
        worker.kill_later()

    def _abandon(self, actor, client, grant, inner) -> None:
        """Not started: its worker closed, its lease or its bundle's room given back."""
        with self.owner.locked():
            self._give_back(actor)
        if inner is not None:
            inner.close()
        if grant is not None and client is not None:
            self.nodes.release(client, grant.lease_id)

    def _lost_before_start(self, actor, entry, detail: str) -> None:
        """Step 5's node lost before A started there: placed again, N excluded, at most
        FREE_MOVES times; then A dies naming N."""
        from miniray.exceptions import ActorDiedError  # lazy: as above

        spec = actor.spec
        with self.owner.locked():
            if actor.state == "DEAD" or self.owner.closed:
                return
            moves = self.moves.get(spec.actor_id, 0)
            if moves < FREE_MOVES:
                self.moves[spec.actor_id] = moves + 1
                self.excluded[spec.actor_id] = entry.node_id
                logger.info("actor %s had not started on node %s (%s), which could not be "
                            "reached (%s); placing it again.", spec.class_name,
                            entry.node_id[:12], entry.ip, detail)
                self.manager._place(actor)
                return
            self.manager._die(actor, serialization.dumps(ActorDiedError.from_context(
                spec.class_name, spec.actor_id.hex(), name=spec.name,
                namespace=spec.namespace, ip=entry.ip,
                reason=f"The actor died because its node has died. Node Id: "
                       f"{entry.node_id} ({detail})")))

    def _read(self, actor, worker: RemoteActorWorker) -> None:
        """Step 4, then step 5 once the data connection ends."""
        owner, manager = self.owner, self.manager
        data = worker.inner.data
        lost = None  # why N is lost, when the view says so
        unsupported = None

        def check_node() -> None:
            why = self._node_gone(worker)
            if why is not None:
                from miniray.exceptions import NodeDiedError  # lazy: the public package

                raise NodeDiedError(f"node {worker.node[:12]} ({worker.ip}) died: {why}")

        asks = RemoteRequests(owner, None, data, check_node, remote_worker.receive_segment,
                              slot=worker, send_lock=worker.send_lock)
        blocking = _Blocking(asks, worker)
        while True:
            try:
                message = data.recv(timeout=WATCH_S)
            except TimeoutError:
                lost = self._node_gone(worker)
                if lost is not None:
                    break
                continue
            except (pc.PeerClosed, OSError, EOFError, ValueError):
                break
            tag = message[0]
            if tag == protocol.RESULT:
                results = message[2]
                if any(type(item[1]) is tuple for item in results):
                    try:
                        results = self._adopt(worker, message[1], results)
                    except remote_worker.Failed as failed:  # no room here: the call fails with it
                        error = serialization.dumps(failed.error)
                        results = [(protocol.ERR, error)] * max(1, len(results))
                    except (pc.PeerClosed, OSError, EOFError):
                        break
                with owner.locked():
                    if worker.interrupted:
                        owner.requests.call_ended(worker, message[1])
                    if message[1] not in actor.inflight:  # failed meanwhile: nobody's
                        self.nodes.kept_results.drop_kept(results)
                    manager.on_result(worker, message[1], results, message[4] or None,
                                      message[5], message[3])
            elif tag == protocol.ACTOR_READY:
                with owner.locked():
                    manager.on_ready(worker, message[2], message[3], message[4], message[5])
            elif tag == protocol.ACTOR_EXITING:
                with owner.locked():
                    manager.on_exiting(worker, message[1])
            elif tag in (protocol.GET, protocol.WAIT) or (
                    tag == protocol.CALL and message[2] in BLOCKING_CALLS):
                blocking.submit(message)  # may wait on this actor's other calls
            elif tag == protocol.READY:
                continue
            else:
                try:
                    served = asks.serve(message)
                except (pc.PeerClosed, OSError, EOFError):
                    break
                if not served:
                    unsupported = tag
                    break
        asks.end()  # its borrows: the worker is gone
        self._ended(actor, worker, lost, unsupported)

    def _adopt(self, worker, task_id: bytes, results: list) -> list:
        """Step 4's large values: into this driver's store, named as the call's returns
        (a call no longer known here: received and thrown away); one the worker kept on
        N (``("kept", path, size)``): booked there for this link, the owner gets a
        ``RemoteCopy`` of it (``KeptResults.keep_results``, as a task's result; a call no
        longer known: freed there). KeepRefused: the call fails (``remote_worker.Failed``)."""
        with self.owner.locked():
            call = self.manager.calls.get(task_id)
            return_ids = list(call.spec.return_ids) if call is not None else None
        known = return_ids is not None
        if not known:
            return_ids = [ids.new_put_id() for _ in results]
        returns = _Returns(task_id, return_ids)
        adopted = self.nodes.adopt_results(worker.inner.data, returns, results)
        if any(type(item[1]) is tuple and item[1][0] == "kept" for item in adopted):
            try:
                adopted = self.nodes.kept_results.keep_results(worker.client, worker.node,
                                                               returns, adopted)
            except KeepRefused as refused:
                from miniray.exceptions import RaySystemError  # lazy: the public package

                self.nodes.kept_results.drop_results(
                    [item for item in adopted if type(item[1]) is tuple
                     and item[1][0] == "shm"])
                raise remote_worker.Failed(RaySystemError(str(refused))) from None
        if not known:
            with self.owner.locked():
                self.nodes.kept_results.drop_kept(adopted)
            for item in adopted:
                if type(item[1]) is tuple and item[1][0] == "shm":
                    shm_segments.unlink_quiet(item[1][1])
        return adopted

    def _node_gone(self, worker) -> str | None:
        """Step 4's partition check: why N is lost, or None while the view holds it alive
        (or has no entry to go by)."""
        return self.nodes.node_lost(worker, worker.client)

    def _ended(self, actor, worker: RemoteActorWorker, lost: str | None, unsupported) -> None:
        """Step 5."""
        from miniray.exceptions import NodeDiedError  # lazy: as above

        client = worker.client
        if lost is None and unsupported is None:
            try:
                client.ping(timeout=PING_S)
            except (NodeDiedError, TimeoutError, OSError) as error:
                lost = client.lost or str(error) or "it stopped answering"
        worker.close()
        if lost is None and worker.lease_id is not None:  # None: in a bundle, which holds it
            self.nodes.release(client, worker.lease_id)
        worker.inner.join_output(1.0)
        status = client.exited.get(worker.pid)
        for _ in range(EXIT_PINGS if lost is None else 0):  # its exit status, if it comes
            if status is not None:
                break
            try:
                client.ping(timeout=PING_S)
            except (NodeDiedError, TimeoutError, OSError):
                break
            status = client.exited.get(worker.pid)
            if status is None:
                time.sleep(0.02)
        detail = (f"the worker pid={worker.pid} on node {worker.ip} ended"
                  + (f" (exit code {os.waitstatus_to_exitcode(status)})"
                     if status is not None else ""))
        with self.owner.locked():
            if lost is not None:
                worker.death_reason = (f"The actor died because its node has died. Node Id: "
                                       f"{worker.node} (IP {worker.ip}: {lost})")
                self.excluded[actor.spec.actor_id] = worker.node
                bundle = self.in_bundle.get(actor.spec.actor_id)
                if bundle is not None:  # its restart waits for the bundle's new place
                    self.nodes.bundles.lose_bundle(bundle)
                    if bundle.lease_id is None:  # lent (remote_bundles step 7): a restart
                        self.nodes.bundles.follow_ledger(actor.spec)  # waits for its
                        # driver's word on the bundle's new place (``lent_moved``), or
                        # for the bundle in this node's ledger
            elif unsupported is not None:
                worker.death_reason = (
                    f"The actor is dead because it asked its driver for something "
                    f"({protocol.tag_name('data', unsupported)}) that an actor on another "
                    f"host cannot ask for yet; place the actor on the driver's node for "
                    f"that.")
                actor.restarts_left = 0  # it would ask again
            self._give_back(actor)  # before a restart asks its bundle for room
            self.manager.on_worker_exit(worker, detail)
            if actor.state == "DEAD":  # no restart will be placed
                self.excluded.pop(actor.spec.actor_id, None)
                self.moves.pop(actor.spec.actor_id, None)
                self.nodes.bundles.unborrow(actor.spec.actor_id)  # lent room: forgotten
        logger.debug("actor %s: worker pid=%s on %s ended (%s)", actor.spec.class_name,
                     worker.pid, worker.ip, lost or unsupported or "exit")


class _Blocking:
    """Step 4's GET and WAIT of one actor's worker, each served on a helper thread (at most
    BLOCKING_THREADS at once; more wait their turn, in order): the reader thread goes on
    reading, so a call that waits on another call of the same actor (async, threaded)
    sees its result. A helper ends when none is waiting; one whose wait ends with the
    worker or its node (the reader sees that end too) just ends."""

    def __init__(self, asks: RemoteRequests, worker):
        self.asks = asks
        self.worker = worker
        self.lock = threading.Lock()
        self.waiting: collections.deque = collections.deque()
        self.threads = 0

    def submit(self, message: tuple) -> None:
        with self.lock:
            self.waiting.append(message)
            if self.threads >= BLOCKING_THREADS:
                return
            self.threads += 1
        threading.Thread(target=self._loop, daemon=True,
                         name="miniray-remote-actor-get").start()

    def _loop(self) -> None:
        from miniray.exceptions import NodeDiedError  # lazy: the public package

        while True:
            with self.lock:
                if not self.waiting:
                    self.threads -= 1
                    return
                message = self.waiting.popleft()
            try:
                self.asks.serve(message)
            except (pc.PeerClosed, OSError, EOFError, NodeDiedError) as error:
                logger.debug("actor worker %s: a wait ended with it: %s", self.worker, error)
            except Exception:  # noqa: BLE001 - the thread ends; the worker's call waits on
                logger.exception("actor worker %s: serving %s", self.worker,
                                 protocol.tag_name("data", message[0]))


class _At(collections.namedtuple("_At", "node_id ip")):
    """What ``KeptResults.fetch`` reads of the fetching node's view entry."""


class _Returns:
    """What ``RemoteNodes.adopt_results`` reads of a spec."""

    def __init__(self, task_id: bytes, return_ids: list):
        self.task_id = task_id
        self.return_ids = return_ids
        self.name = "actor call"

