"""The node's actor service: named and detached actors that every driver of the node shares.

Owns: the actors that drivers joined to a node create with a ``name`` or
``lifetime="detached"``, their names, and which driver created and which drivers hold each
(``Lifetimes``, pure). It is a miniray driver joined to the node like any other (its own owner,
store, leases and workers), started and stopped by the node process, listening on
``<session>/actors.sock`` (AF_UNIX stream, mode 0600, peers checked with SO_PEERCRED). Does not
own: the drivers' proxies and their sockets (``actor_link.py``), or anonymous actors (each
driver owns those itself).

Tags and layouts: ``core/protocol.py`` section 5 (``SVC_*``)::

    driver ── control: CREATE / LOOKUP / LIST / KILL ─► reply ─┐
              PG_CREATE / PG_REMOVE / PG_LEND / PG_RETURN /    │
              PG_STATE / PG_FIND ──────────────────────────────┤ (a detached group
                                                               │  of the cluster)
    driver ── calls:   CALL / OBJECT / CANCEL / HOLD / RELEASE ┼─► this process's owner
              ◄── RESULT (values, or segments renamed into ────┘   (ActorManager, I/O thread)
                  the caller's store: no copy)

* Arguments. The caller resolves top-level ObjectRefs and sends their payloads: small values as
  bytes; large ones as the path of its own segment, which the actor maps directly (the caller
  pins it until the result arrives). A constructor's arguments are copied into this store,
  because a restart needs them again after the caller has moved on; those not ready at
  creation follow in an OBJECT message when they are (the actor waits for them here, as any
  actor waits for its arguments), and the service answers IMPORTED so the caller lets go.
  The objects of refs nested inside a call's arguments are sent along (the call waits until
  they are ready) and imported here under their own ids, so the actor can keep the refs.
* Results. A small result travels as bytes. A large one is the segment the actor wrote (for
  an actor on another node, the segment its bytes were received into here:
  ``owner/remote_actors.py``); it is
  renamed into the caller's store (``mr_<caller tag>_<object id>``), which adopts it. Refs
  inside a result travel with their objects (copied into the caller's store, which owns them
  from then on; the result waits until they are ready). A large result of an actor on
  another node N stays on N (docs/remote-objects.md, "Results of the actor service's
  actors"): this process's link to N keeps it (``remote_actors`` step 4), the caller gets
  ``("kept", id, N's id, size, path, [ip, port], tag, grant)`` with this process's grant of
  that object to the node and IP its HELLO named (``_hand_on_kept``), pulls it from N when
  it needs it, and frees it with SVC_FREE; what is kept for a driver is freed when it
  leaves (``_drop``). A caller whose HELLO named no node gets the value instead, pulled here first
  (``_pull_here``), as before results were kept. A large result of an actor on this node, for a
  driver on another host, stays here the same way: this node keeps it for this process's own link
  to it (``_keep_here``). Both are done by the keeper's threads (``reply_keeper``), each driver's
  replies and streaming values (SVC_YIELD) in the order they came; at teardown the replies still
  queued are sent as plain values or failed (``_settle_queued``).
* Lifetimes (Ray's): a detached actor lives until ``kill`` or the node stops. A named,
  non-detached actor ends after its queued calls once no driver holds a handle to it, and is
  killed when the driver that created it disconnects (Ray ties it to its creator's job).
* Output. What an actor prints goes to the driver that created it while that driver is
  connected (prefixed ``(<name> pid=<pid>)`` as usual, ``ip=`` added for an actor on
  another node), else to the node's log (``<session>/node.log``); while that driver has
  replies queued in the keeper, behind them (``_route_output``).
* Other nodes. This process's owner places an actor whose request only another node can
  hold, or with a node affinity, there as any driver does (``owner/remote_actors.py``):
  its lease is this process's for the actor's life; ``kill``, restarts and the node's
  death behave as for a driver's actor.

Names are the cluster's: the head's service is their one authority. Steps, driver D joined
to member node M, head H (D's side: ``owner/actor_link.py``; H's relay:
``node/actor_relay.py``)::

    1. D's link reads M's ``cluster.json``: M is a member, H is at ``head``. D opens its
       control and calls connections to H's port with role "actors" (cluster token, MAC'd
       frames; ``CONNECT_TIMEOUT_S`` each). A head and its drivers use ``actors.sock`` as
       before; M's own service then serves no driver.
    2. H relays each connection to this service's socket unchanged; D's HELLO names no
       store directory ("" for ``shm_dir``): D is on another host.
    3. Requests are the same as a local driver's: names, CREATE (its duplicate raises
       ActorAlreadyExistsError as for any driver), LIST, KILL, calls; the actor is placed
       by the usual rules (here, or on M or another node where its resources are).
    4. Values cross as bytes: D sends each value of its shared memory as ``("copy", bytes,
       size)`` (``actor_link.pack_value``); this service writes it into a segment of its
       store (``unpack_value``: an imported object, or a call's argument removed once the
       call answered). Results and the objects of refs inside them go back the same way
       (a large result's segment is read and removed here) and D writes them into its
       store; a large result kept on its actor's node is D's to pull from there (Results).
    5. H unreachable: D's request raises ServiceUnavailable naming H within the connect
       timeout; a request without an answer fails after ``REQUEST_TIMEOUT_S``. D's link
       closing (D exits, H stops) is a local driver leaving: its non-detached actors end.

Teardown (the node sends SIGTERM): stop accepting, close every driver's sockets, then
``shutdown()`` as any driver (its actors are killed, its leases returned, GOODBYE to the node).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time

from miniray._private import runtime
from miniray._private.core import ids, protocol, serialization
from miniray._private.core.resources import format_infeasible, infeasible_reasons
from miniray._private.core.task_spec import STREAMING
from miniray._private.node.reply_keeper import LinkRetry, ReplyKeeper
from miniray._private.object_store import shm_segments as segs
from miniray._private.owner.actor_link import SOCKET_NAME, pack_value, unpack_value
from miniray._private.owner.actors import A_DEAD
from miniray._private.owner.object_table import PENDING
from miniray._private.owner.output import deliver
from miniray._private.transport import node_client
from miniray._private.transport.framing import FramedSocket
from miniray._private.transport.node_client import accept_same_uid
from miniray._private.transport.spawn import set_pdeathsig

__all__ = ["ActorService", "Lifetimes", "SOCKET_NAME", "main"]

logger = logging.getLogger(__name__)
OWN_LINK_TIMEOUT_S = 2.0  # the grant key of the link to its own node: asked this long at most
# At teardown: the replies still queued on the drivers' sockets are written this long at
# most in all, and the keeper's threads waited for this long (``close``).
CLOSE_FLUSH_S = 2.0
KEEPER_JOIN_S = 2.0
# A kept result pulled for a caller that named no node: waited this long at most, on one of
# the keeper's few threads (a driver's later replies wait behind it, and THREADS such pulls
# hold every thread). A pull of a healthy node ends in seconds; one that takes longer is
# failed so the threads go on (the caller gets ObjectLostError saying so).
PULL_WAIT_S = 30.0
# What a keeper job does (``_reply``, ``_keep_here``): keep its large results on this node,
# pull its kept results here (a caller that named no node), only pass it on in its turn,
# send a streaming call's value in its turn, or an actor's output in its turn.
KEEP, PULL, PASS, VALUE, OUTPUT = "keep", "pull", "pass", "value", "output"


class Lifetimes:
    """Pure bookkeeping: who created each service actor, who holds it, what must end.

    Example:
        >>> life = Lifetimes()
        >>> life.created(b"a", "driver1", detached=False)
        >>> life.hold(b"a", "driver1"); life.hold(b"a", "driver2")
        >>> life.release(b"a", "driver1")
        False
        >>> life.release(b"a", "driver2")  # nobody holds it: it ends after its calls
        True
        >>> life.created(b"d", "driver1", detached=True)
        >>> life.client_gone("driver1")  # (kill now, end after calls)
        ([], [])
        >>> life.created(b"t", "driver2", detached=True, tied=True)  # in driver2's group
        >>> life.hold(b"t", "driver3"); life.release(b"t", "driver3")
        False
        >>> life.client_gone("driver2")
        ([b't'], [])
    """

    def __init__(self):
        self.creator: dict[bytes, str] = {}
        self.detached: set[bytes] = set()
        # Detached actors whose placement group is their creator's own (not detached): no
        # handle's release ends them, their creator leaving does (the group ends with it).
        self.tied: set[bytes] = set()
        self.holders: dict[bytes, set[str]] = {}

    def created(self, actor_id: bytes, client: str, detached: bool,
                tied: bool = False) -> None:
        self.creator[actor_id] = client
        if detached:
            self.detached.add(actor_id)
            if tied:
                self.tied.add(actor_id)

    def hold(self, actor_id: bytes, client: str) -> None:
        if actor_id in self.creator:
            self.holders.setdefault(actor_id, set()).add(client)

    def release(self, actor_id: bytes, client: str) -> bool:
        """True when the actor must end after its queued calls: non-detached, and the last
        driver holding it let go."""
        holders = self.holders.get(actor_id)
        if not holders or client not in holders:
            return False
        holders.discard(client)
        if holders:
            return False
        del self.holders[actor_id]
        if actor_id in self.detached:
            return False
        self.forget(actor_id)  # it ends: nothing more to decide about it
        return True

    def client_gone(self, client: str) -> tuple[list[bytes], list[bytes]]:
        """``(kill now, end after queued calls)`` when ``client`` disconnects: what it created
        and did not detach, or detached in a group of its own, is killed; what only it held
        ends."""
        kill = sorted(a for a, c in self.creator.items()
                      if c == client and (a not in self.detached or a in self.tied))
        for actor_id in kill:
            self.forget(actor_id)
        end = sorted(a for a in list(self.holders) if self.release(a, client))
        return kill, end

    def forget(self, actor_id: bytes) -> None:
        self.creator.pop(actor_id, None)
        self.detached.discard(actor_id)
        self.tied.discard(actor_id)
        self.holders.pop(actor_id, None)


class _Client:
    """One driver: its two sockets (by role), where its store keeps segments, its node id
    and IP (to which the results kept for it are granted) and those results."""

    __slots__ = ("token", "pid", "conns", "tag", "shm_dir", "gone", "where", "kept")

    def __init__(self, token: str, pid: int, tag: str, shm_dir: str,
                 where: tuple[str, str] = ("", "")):
        self.token = token
        self.pid = pid
        self.conns: dict[str, FramedSocket] = {}
        self.tag = tag
        self.shm_dir = shm_dir  # "": a driver on another host (values go as bytes)
        self.gone = False
        self.where = where  # (node id, IP): "" when the driver named none
        # Results kept on other nodes for this driver (Results, below): object id -> the
        # ``RemoteCopy`` of this process's link, freed by SVC_FREE or the driver leaving.
        self.kept: dict[bytes, object] = {}

    def __repr__(self) -> str:
        return f"<driver pid={self.pid} {sorted(self.conns)}>"


class ActorService:
    """Serves drivers on ``<session>/actors.sock`` from the runtime's own I/O thread."""

    def __init__(self, rt, session_dir: str):
        self.rt = rt
        self.owner = rt.owner
        self.path = os.path.join(session_dir, SOCKET_NAME)
        self.life = Lifetimes()
        self._clients: dict[str, _Client] = {}
        self._conns: dict[int, tuple[FramedSocket, _Client | None, str]] = {}
        self._creators: dict[bytes, str] = {}  # actor id -> token of the driver that made it
        # This process's link to its own node, which keeps its actors' large results for
        # drivers on other hosts (``_here``): None until first needed or while it cannot
        # be had (asked for again once ``_link_retry`` allows), and the one thread that
        # keeps them (``reply_keeper``).
        self._own_link = None
        self._link_retry = LinkRetry()
        self._here_lock = threading.Lock()  # the keeper's threads decide to ask under it
        self._keeper = ReplyKeeper(self._keep_here)
        self._pulls: set[threading.Event] = set()  # ``_pull_here``'s waits: ``close`` ends them
        self.owner.actors.route_output = self._route_output
        self.owner.actors.unknown_actor_hint = (
            "it is probably an actor without a name that belongs to one of the node's drivers, "
            "and a named or detached actor cannot call it. Create that actor with a name "
            "(.options(name=...)) so that it lives in the node's actor service too.")
        segs.unlink_quiet(self.path)  # a crashed predecessor's socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            with node_client.sun_path(self.path) as name:
                listener.bind(name)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self.listener = listener
        self.owner.reactor.register(listener.fileno(), self._on_accept)

    # -- connections (I/O thread) --------------------------------------------------------------
    def _on_accept(self, _fd: int) -> None:
        for sock, _pid in accept_same_uid(self.listener, logger):
            conn = FramedSocket(sock)
            with self.owner.locked():
                self._conns[conn.fd] = (conn, None, "")
                self.owner.reactor.register(conn.fd, self._on_readable)

    def _on_readable(self, fd: int) -> None:
        item = self._conns.get(fd)
        if item is None:
            return
        conn = item[0]
        frames, closed = conn.recv_ready()
        with self.owner.locked():
            for frame in frames:
                conn, client, role = self._conns.get(fd, (conn, None, ""))
                try:
                    message = pickle.loads(frame)
                    if client is None:
                        self._hello(conn, message)
                    elif role == "control":
                        self._control(conn, client, message)
                    else:
                        self._calls(client, message)
                except Exception:
                    logger.exception("a driver sent %.200r; dropping it", frame[:200])
                    closed = True
                    break
            if closed:
                self._drop(fd)

    def _hello(self, conn: FramedSocket, message: tuple) -> None:
        tag, role, pid, token, store_tag, shm_dir, sys_path, cwd = message[:8]
        if tag != protocol.SVC_HELLO or role not in ("control", "calls"):
            raise ValueError(f"expected SVC_HELLO, got {protocol.tag_name('actor_service', tag)}")
        where = _where(message[8] if len(message) > 8 else None)
        client = self._clients.get(token)
        if client is None:
            client = self._clients[token] = _Client(
                token, pid, segs.check_tag(store_tag),
                os.path.abspath(shm_dir) if shm_dir else "", where)
            logger.info("driver pid %d connected%s", pid,
                        "" if shm_dir else " from another host")
        client.conns[role] = conn
        self._conns[conn.fd] = (conn, client, role)
        if not shm_dir:  # another host's paths: only those that exist here too
            sys_path = [path for path in sys_path if os.path.isdir(path)]
            cwd = cwd if cwd and os.path.isdir(cwd) else ""
        self._adopt_paths(sys_path, cwd)
        if role == "control":
            self._answer(conn, protocol.SVC_OK, None)

    def _adopt_paths(self, sys_path: list, cwd: str) -> None:
        """Actors import their classes' modules from where their creators run."""
        hello = self.owner.hello_info
        known = hello.setdefault("sys_path", [])
        for path in sys_path:
            if path not in known:
                known.append(path)
        if cwd:
            hello["cwd"] = cwd

    def _drop(self, fd: int) -> None:
        """*Locked.* A socket closed: the driver is gone (both its sockets are closed)."""
        conn, client, _role = self._conns.pop(fd, (None, None, ""))
        if conn is None:
            return
        self.owner.reactor.unregister(fd)
        conn.close()
        if client is None or client.gone:
            return
        client.gone = True
        self._clients.pop(client.token, None)
        for other in client.conns.values():
            if other.fd in self._conns:
                self._conns.pop(other.fd, None)
                self.owner.reactor.unregister(other.fd)
                other.close()
        self._free_kept(client, list(client.kept))  # its kept results go from their nodes
        kill, end = self.life.client_gone(client.token)
        if self.owner.remote_nodes is not None:  # the room lent to its tasks comes back
            self.owner.remote_nodes.bundles.drop_loans(client.token)
        actors = self.owner.actors
        for actor_id in kill:
            actors.kill(actor_id, True)
        for actor_id in end:
            self._end_when_idle(actor_id)
        logger.info("driver pid %d left: %d actor(s) killed, %d released", client.pid,
                    len(kill), len(end))

    # -- requests -------------------------------------------------------------------------------
    def _answer(self, conn: FramedSocket, status: int, value) -> None:
        conn.send(pickle.dumps((status, value), 5))  # the driver waits for it: never blocks long

    def _control(self, conn: FramedSocket, client: _Client, message: tuple) -> None:
        actors = self.owner.actors
        try:
            tag = message[0]
            if tag == protocol.SVC_CREATE:
                value = self._create(client, message[1], message[2])
            elif tag == protocol.SVC_LOOKUP:
                value = actors.lookup(message[1], message[2])
            elif tag == protocol.SVC_LIST:
                value = actors.named(message[1], message[2])
            elif tag == protocol.SVC_ALIVE:  # the actors a driver lent room to
                value = [a for a in message[1]
                         if (actor := actors.actors.get(a)) is not None and
                         actor.state != A_DEAD]
            elif tag == protocol.SVC_LENT_MOVED:  # its bundle's new place: restart there
                value = actors.lent_moved(message[1], message[2], message[3], message[4])
            elif tag == protocol.SVC_KILL:
                if message[3]:  # its group was removed: Ray's error for that
                    actors.end_in_removed_group(message[1], message[3])
                else:
                    actors.kill(message[1], message[2])
                value = None
            elif tag == protocol.SVC_PG_LEND:  # no round trip: answered here
                remote = self.owner.remote_nodes
                value = None if remote is None else remote.bundles.lend_room(
                    message[1], message[2], message[3], client.token,
                    far=not client.shm_dir)  # a driver on another host: any bundle here too
            elif tag == protocol.SVC_PG_RETURN:
                if self.owner.remote_nodes is not None:
                    self.owner.remote_nodes.bundles.return_room(message[1])
                value = None
            elif tag == protocol.SVC_PG_STATE:  # no round trip: this owner's record
                value = self.owner.pgs.served_state(message[1])
            elif tag == protocol.SVC_PG_FIND:  # no round trip: this owner's records
                value = self.owner.pgs.served_named(message[1])
            elif tag in (protocol.SVC_PG_CREATE, protocol.SVC_PG_REMOVE,
                         protocol.SVC_PG_TABLE):  # the last: a ledger read
                self._group_request(conn, message)
                return  # answered by its thread
            else:
                raise ValueError(
                    f"unknown request {protocol.tag_name('actor_service', tag)}")
        except Exception as error:
            self._answer(conn, protocol.SVC_ERR, _error_reply(error, message))
            return
        self._answer(conn, protocol.SVC_OK, value)

    def _group_request(self, conn: FramedSocket, message: tuple) -> None:
        """*Locked.* A detached placement group of the cluster, created or removed by this
        process's owner as its own (``placement_group_nodes.serve_create`` /
        ``serve_remove``), or the records of those reserved (``served_records``, a ledger
        read, for a driver on another host): round trips to other nodes, or file I/O, so on
        a thread, which answers the
        driver (it waits on its control socket, one request at a time). Every request is
        answered, whatever the thread meets (any ``BaseException``, an error that does not
        pickle): its error then names the request and what happened."""
        pgs = self.owner.pgs
        fd = conn.fd

        def run() -> None:
            status, value = protocol.SVC_ERR, None
            try:
                if message[0] == protocol.SVC_PG_CREATE:
                    status, value = protocol.SVC_OK, pgs.serve_create(*message[1:5])
                elif message[0] == protocol.SVC_PG_TABLE:
                    status, value = protocol.SVC_OK, pgs.served_records()
                else:
                    status, value = protocol.SVC_OK, pgs.serve_remove(message[1])
            except BaseException as error:  # noqa: BLE001 - the driver raises it
                if not isinstance(error, Exception):
                    logger.error("%s: %r", protocol.tag_name("actor_service", message[0]),
                                 error)
                status, value = protocol.SVC_ERR, _error_reply(error, message)
            finally:
                if value is None and status == protocol.SVC_ERR:  # raised past the handler
                    value = _error_reply(RuntimeError("the request's thread ended"), message)
                with self.owner.locked():
                    if self._conns.get(fd, (None,))[0] is conn:  # the driver is still there
                        with contextlib.suppress(OSError):
                            self._answer(conn, status, value)

        threading.Thread(target=run, daemon=True, name="miniray-svc-group").start()

    def _create(self, client: _Client, spec, exported) -> tuple[bytes, tuple, str | None]:
        """``(actor id, handle state, warning)``; the warning (the actor can never be placed
        on this node, and no other node takes it now) is printed by the driver, where Ray
        prints it."""
        owner = self.owner
        if spec.fn_bytes is not None:
            owner.export_function(spec.fn_id, spec.fn_bytes)
            spec.fn_bytes = None
        imported = self._import(exported or ())
        # A detached actor in a bundle of its driver's own group on another node (room the
        # driver lent, not a detached group's) ends with the group, at the latest when that
        # driver leaves, as in Ray, where the group's end kills it. One of another driver,
        # in room it borrowed from the group's (``lent[3]``), is not tied to its own
        # driver: it lives until the group ends (the group watch, ``remote_bundles`` step 9).
        tied = spec.detached and spec.lent is not None and not spec.lent[3]
        try:
            actor_id = owner.actors.create(spec)  # pins and holds what the actor uses
        finally:
            self._settle(imported)
        if actor_id == spec.actor_id:
            self.life.created(actor_id, client.token, spec.detached, tied)
            self._creators[actor_id] = client.token
        warning = None
        reasons = infeasible_reasons(owner.node_state, spec.placement)
        if reasons and owner.actors._other_node(spec) is None:
            warning = f"{format_infeasible(spec.placement, reasons)} (actor {spec.class_name})"
        return actor_id, owner.actors.actors[actor_id].spec.handle_state, warning

    def _import(self, items) -> list[bytes]:
        """Put a caller's objects (``[(id, kind, payload)]``) into this store, under their own
        ids, large ones copied: a constructor's arguments are read again by a restart, and
        refs nested in arguments may be kept by the actor, long after the caller moved on."""
        objects = self.owner.objects
        store = self.owner.store
        imported = []
        for object_id, kind, payload in items:
            entry = objects.get(object_id)
            if entry is not None and store.contains(object_id):
                continue  # the same object twice, or one of this process's own
            if kind is None:  # not ready at the caller: it follows (OBJECT) when it is
                if entry is None:
                    objects.ensure(object_id)
                    imported.append(object_id)
                continue
            if isinstance(payload, tuple):
                payload = _copy_segment(payload, store.shm_dir, store.session_tag)
            objects.set_ready(object_id, kind, payload)
            imported.append(object_id)
        return imported

    def _settle(self, imported: list[bytes]) -> None:
        """Imported objects that nothing pinned or held are freed now (a pending one, whose
        value will never be needed, is forgotten)."""
        objects = self.owner.objects
        for object_id in imported:
            entry = objects.get(object_id)
            if entry is not None and entry.holders <= 0:
                if entry.state == PENDING:
                    objects.forget_pending(object_id)
                else:
                    objects.maybe_free(object_id, entry)

    def _calls(self, client: _Client, message: tuple) -> None:
        tag = message[0]
        actors = self.owner.actors
        if tag == protocol.SVC_CALL:
            actor_id, spec, exported = message[1], message[2], message[3]
            imported = self._import(exported)
            spec.contained = tuple(object_id for object_id, _kind, _payload in exported)
            spec.reply = functools.partial(self._reply, client, spec.task_id, spec.return_ids)
            if not client.shm_dir and spec.payloads:  # values from another host
                spec.payloads, spec.reply = self._received_args(spec.payloads, spec.reply)
            if spec.num_returns == STREAMING:  # its values go to the caller as they come
                self.owner.streams.forward[spec.task_id] = functools.partial(
                    self._reply_value, client, spec.task_id)
            try:
                actors.submit(actor_id, spec, client)  # holds the nested refs' objects
            except Exception as error:  # e.g. PendingCallsLimitExceeded
                data = serialization.dumps(error)
                spec.reply([(protocol.ERR, data)] * max(1, spec.num_returns), None)
            self._settle(imported)
        elif tag == protocol.SVC_OBJECT:  # an argument of an actor created earlier is ready
            self._import([message[1:4]])
            self.send(client, (protocol.SVC_IMPORTED, message[1]))
        elif tag == protocol.SVC_CANCEL:
            with contextlib.suppress(ValueError):
                actors.cancel(message[1], message[2], message[3])
        elif tag == protocol.SVC_FREE:  # the driver freed results kept for it
            self._free_kept(client, message[1])
        elif tag == protocol.SVC_HOLD:
            self.life.hold(message[1], client.token)
        elif tag == protocol.SVC_RELEASE:
            if self.life.release(message[1], client.token):
                self._end_when_idle(message[1])
        else:
            raise ValueError(f"unknown message {protocol.tag_name('actor_service', tag)}")

    def _received_args(self, payloads: list, reply):
        """A call's argument values from a driver on another host, written into segments
        of this store for the actor to map; removed once the call has answered."""
        store = self.owner.store
        made = []
        out = []
        for position, kind, payload in payloads:
            value = unpack_value(payload, store.shm_dir, store.session_tag)
            if value is not payload:
                made.append(value[1])
            out.append((position, kind, value))
        if not made:
            return out, reply

        def reply_then_remove(*args, **kwargs):
            try:
                reply(*args, **kwargs)
            finally:
                for path in made:
                    segs.unlink_quiet(path)

        return out, reply_then_remove

    def _end_when_idle(self, actor_id: bytes) -> None:
        actors = self.owner.actors
        actor = actors.actors.get(actor_id)
        self.life.forget(actor_id)
        if actor is not None and actor.state != A_DEAD:
            actors._terminate_when_idle(actor)

    # -- output and results (I/O thread) ----------------------------------------------------------
    def _route_output(self, actor):
        """What an actor prints goes to the driver that created it while that driver is
        connected (as Ray shows an actor's output in its job's driver), else to node.log.
        While that driver has replies in the keeper, the lines queue behind them
        (``reply_keeper``), as its streaming values do: a later call's lines never come
        before an earlier call's result, which a driver on this host gets in the actor's
        order (its worker's pipes are read before each result is handled); with nothing
        queued they go at once. Called on the I/O thread, locked or not (``output``):
        ``put(behind=True)`` decides under the keeper's own lock."""
        actor_id = actor.spec.actor_id

        def route(target: str, text: str) -> bool:
            client = self._clients.get(self._creators.get(actor_id, ""))
            if client is None:
                return False
            message = (protocol.SVC_OUTPUT, target, text)
            if self._keeper.put(client.token, (client, None, None, message, None, OUTPUT),
                                behind=True):
                return True  # after this driver's replies queued before it
            return self.send(client, message)

        return route

    def _send_output(self, client: _Client, message: tuple) -> None:
        """*Locked.* An actor's output that waited in the keeper, sent in its turn; printed
        here (node.log) when its driver is gone, as unrouted output is."""
        if not self.send(client, message):
            deliver(message[1], message[2])

    def _reply(self, client: _Client, task_id: bytes, return_ids: list, results: list,
               contained, held: bool = False) -> None:
        """Send a call's results to the driver that made it. Refs inside a result travel with
        their objects (copied into the driver's store), which the driver then owns; a result
        waits for those objects to be ready (they are held meanwhile)."""
        self.owner.streams.forward.pop(task_id, None)
        objects = self.owner.objects
        inner = list(dict.fromkeys(i for ids in contained or () if ids for i in ids))
        pending = [i for i in inner if (e := objects.get(i)) is not None and e.state == PENDING]
        if pending and not held:
            objects.hold(inner)
            again = functools.partial(self._reply, client, task_id, return_ids, results,
                                      contained, True)
            objects.await_objects(pending, len(pending), False, lambda _timed_out: again(),
                                  None, self.owner.reactor.call_later)
            return
        nested = []
        if not client.gone:
            for index, ids in enumerate(contained or ()):
                if ids:
                    nested.append((index, [self._export(i, client) for i in ids
                                           if objects.get(i) is not None]))
        if held:
            objects.release(inner)
        if self._keeps_here(client, results):  # a driver on another host: kept here
            mode = KEEP
        elif not client.where[0] and any(type(data) is tuple and data[0] == "remote"
                                         for _kind, data in results):
            mode = PULL  # kept on its node for a driver that named none: its value goes
        else:
            mode = PASS
        if self._keeper.put(client.token, (client, task_id, return_ids, results, nested, mode),
                            behind=mode == PASS):
            return  # after the replies of this driver's queued before it (reply_keeper)
        self._send_reply(client, task_id, return_ids, results, nested)

    def _send_reply(self, client: _Client, task_id: bytes, return_ids: list, results: list,
                    nested: list) -> None:
        """*Locked.* ``_reply``'s end: each result's payload made the caller's, sent."""
        out = []
        for index, (kind, data) in enumerate(results):
            if type(data) is tuple and data[0] == "remote":  # kept on its node (Results)
                kind, data = self._hand_on_kept(kind, data[1], client, return_ids[index])
            elif isinstance(data, tuple):
                object_id = return_ids[index] if index < len(return_ids) else os.urandom(28)
                data = self._hand_over(data, client, object_id)
            out.append((kind, data))
        if not self.send(client, (protocol.SVC_RESULT, task_id, out, nested)):
            for index, (_kind, data) in enumerate(out):
                if type(data) is tuple and data[0] == "kept":  # never reached the driver
                    self._free_kept(client, [return_ids[index]])
                else:
                    self._discard(data)
            for _index, items in nested:
                for _id, _kind, payload in items:
                    self._discard(payload)

    def _reply_value(self, client: _Client, task_id: bytes, index: int, kind: int, data,
                     contained) -> None:
        """One value of a streaming call, to the driver that made the call (before its
        result, on the same socket). Refs inside it travel with their objects if ready."""
        objects = self.owner.objects
        nested = [] if client.gone else [
            self._export(i, client) for i in contained or ()
            if (e := objects.get(i)) is not None and e.state != PENDING]
        if isinstance(data, tuple):
            data = self._hand_over(data, client, ids.stream_item_id(task_id, index))
        message = (protocol.SVC_YIELD, task_id, index, kind, data, nested)
        if self._keeper.put(client.token, (client, task_id, None, message, None, VALUE),
                            behind=True):
            return  # after this driver's replies queued before it (reply_keeper)
        self._send_value(client, message)

    def _send_value(self, client: _Client, message: tuple) -> None:
        """*Locked.* A streaming call's value (SVC_YIELD) sent; its payloads, made the
        caller's, removed when it is gone."""
        if not self.send(client, message):
            self._discard(message[4])
            for _id, _kind, payload in message[5]:
                self._discard(payload)

    def send(self, client: _Client, message: tuple) -> bool:
        """Queue a message on the client's calls socket; False if it is gone (its socket's
        EOF, read by the I/O thread, then drops it). I/O thread only."""
        conn = client.conns.get("calls")
        if client.gone or conn is None:
            return False
        try:
            self.owner.reactor.send(conn, pickle.dumps(message, 5), self._on_writable)
        except OSError:
            return False
        return True

    def _on_writable(self, fd: int) -> None:
        with self.owner.locked():
            item = self._conns.get(fd)
            self.owner.reactor.flush(fd, item[0] if item is not None else None)

    def _export(self, object_id: bytes, client: _Client) -> tuple:
        """``(id, kind, payload)`` of an object of this process for ``client``; a large one is
        copied into a segment of the client's store, which adopts it."""
        kind, payload = self.owner.objects.read(object_id)
        if isinstance(payload, tuple) and not client.shm_dir:  # another host: its bytes
            payload = pack_value(payload, self.owner.store.shm_dir)
        elif isinstance(payload, tuple):
            payload = _copy_segment(payload, client.shm_dir, client.tag)
        return object_id, kind, payload

    def _hand_over(self, data: tuple, client: _Client, object_id: bytes) -> tuple:
        """A segment the actor wrote becomes the caller's: renamed into its store's name
        (copied when its store lives on another filesystem); for a driver on another host,
        its bytes (the segment is removed)."""
        _where, name, size = data
        src = segs.resolve_path(name, self.owner.store.shm_dir)
        if not client.shm_dir:  # a driver on another host: the bytes travel
            try:
                return pack_value(data, self.owner.store.shm_dir)
            finally:
                segs.unlink_quiet(src)
        dst = os.path.join(client.shm_dir, segs.segment_name(client.tag, object_id))
        try:
            os.rename(src, dst)
        except OSError:
            segs.copy_file(src, dst, size)
            segs.unlink_quiet(src)
        return ("shm", dst, size)

    def _keeps_here(self, client: _Client, results: list) -> bool:
        """*Locked.* Whether a call's large results that its actor wrote on this node are
        kept here for the caller (``_keep_here``): a driver on another host that named its
        node, keeping on (``MINIRAY_KEEP_REMOTE_RESULTS``), this process in a cluster (it
        has a view), and its link to its own node had or, after a failure, asked for
        again no more often than every ``reply_keeper.RETRY_S``."""
        if client.shm_dir or not client.where[0]:
            return False
        if self._own_link is None and not self._link_retry.may_try(time.monotonic()):
            return False
        if not any(type(data) is tuple and data[0] == "shm" for _kind, data in results):
            return False
        from miniray._private.owner import remote_nodes  # lazy: a cluster's service only

        return remote_nodes.keep_results() and bool(self.owner.hello_info.get("session_dir"))

    def _keep_here(self, job: tuple) -> None:
        """The keeper's thread (``reply_keeper``), not locked: the large results an actor of
        this process wrote on this node for a driver on another host stay here, kept by
        this node for this process's own link to it (``_here``), as a worker's kept result
        is: its bytes reserved in the link's budget file, the segment renamed
        ``mr_<link tag>_<object id>``, booked (``KeptResults.keep_segment``); the caller then
        gets them as any kept result (``_hand_on_kept``). Past the link's cap, or without
        the link: sent at once, as before. A job of mode PULL (a caller that named no node)
        has its kept results pulled here instead (``_pull_here``); one of mode PASS (a
        reply queued behind another of its driver's) is only passed on, one of mode
        VALUE is a streaming call's value and one of mode OUTPUT an actor's output, each
        sent in its turn. The reply then goes out on the
        I/O thread (``_send_reply``), in the order the driver's jobs were queued."""
        client, task_id, return_ids, results, nested, mode = job
        if mode in (VALUE, OUTPUT):  # a value or output queued behind a reply: its turn
            with self.owner.locked():
                self.owner.reactor.call_later(0, functools.partial(
                    self._send_queued_value, client, results, mode))
            return
        out = list(results)
        try:
            link = self._here() if mode == KEEP else None
            for index, (kind, data) in enumerate(results):
                if link is not None and type(data) is tuple and data[0] == "shm" and \
                        index < len(return_ids):
                    out[index] = self._keep_segment(link, return_ids[index], kind, data)
                elif mode == PULL and type(data) is tuple and data[0] == "remote" and \
                        index < len(return_ids) and not client.gone:
                    out[index] = self._pull_here(return_ids[index], kind, data[1])
        finally:  # whatever happened, the reply goes (what was not kept crosses at once)
            with self.owner.locked():
                self.owner.reactor.call_later(0, functools.partial(
                    self._send_kept_reply, client, task_id, return_ids, out, nested))

    def _send_queued_value(self, client: _Client, message: tuple, mode: str = VALUE) -> None:
        """*Locked.* A streaming value (or an actor's output) the keeper passed on: sent, no
        longer waiting."""
        self._keeper.done(client.token)
        if mode == OUTPUT:
            self._send_output(client, message)
        else:
            self._send_value(client, message)

    def _pull_here(self, object_id: bytes, kind: int, copy) -> tuple:
        """*Not locked*, a keeper thread. A result its node keeps for this process's link,
        for a caller that named no node to grant it to (``_hand_on_kept`` cannot hand it
        on): pulled into this store as this process's own kept result is (an entry under
        the caller's return id, PENDING with ``copy``, a waiter added: ``KeptResults``
        pulls it), copied into a segment of its own for ``_send_reply`` to hand over as
        an actor's segment, as before results were kept, then freed here and on its node.
        ``(kind, ("shm", path, size))``, or the pull's error (ObjectLostError naming the
        node, ObjectStoreFullError) for the caller; not pulled within PULL_WAIT_S, or the
        service stopping meanwhile (``close`` wakes the wait): an ObjectLostError saying
        so, and no segment left behind.

        Steps (decide under the owner's lock, act after it): 1. locked: the entry made,
        held, awaited (``PULL_WAIT_S``). 2. Not locked: wait. 3. Locked: its segment's
        path read (the entry stays held). 4. Not locked: the segment copied. 5. Locked:
        the entry released; the copy removed if the service stopped meanwhile."""
        objects = self.owner.objects
        pulled = threading.Event()
        with self.owner.locked():
            if self._keeper.closed:
                return protocol.ERR, serialization.dumps(_lost_kept(
                    object_id, copy, "the service stopped before it could pull it"))
            objects.set_ready(object_id, kind, ("remote", copy))
            objects.hold([object_id])
            self._pulls.add(pulled)
            abandon = objects.await_objects([object_id], 1, True,
                                            lambda _timed_out: pulled.set(), PULL_WAIT_S,
                                            self.owner.reactor.call_later)
        pulled.wait(PULL_WAIT_S)
        with self.owner.locked():
            self._pulls.discard(pulled)
            entry = objects.get(object_id)
            why = None
            if self._keeper.closed:
                why = "the service stopped before it could pull it"
            elif entry is None or entry.state == PENDING:
                why = (f"it was not pulled here within {PULL_WAIT_S:g} s for a caller that "
                       "named no node to pull it from")
            if why is not None:
                if abandon is not None:
                    abandon()
                objects.release([object_id])  # freed here, and on its node
                return protocol.ERR, serialization.dumps(_lost_kept(object_id, copy, why))
            kind, payload = objects.read(object_id)
            if not isinstance(payload, tuple):
                objects.release([object_id])
                return kind, payload
            shm_dir = self.owner.store.shm_dir
            src, size = segs.resolve_path(payload[1], shm_dir), payload[2]
            dst = os.path.join(shm_dir, segs.segment_name(self.owner.store.session_tag,
                                                          os.urandom(28)))
        try:
            segs.copy_file(src, dst, size)  # not locked: the entry is held meanwhile
            result = kind, ("shm", dst, size)
        except OSError as failed:
            segs.unlink_quiet(dst)
            result = protocol.ERR, serialization.dumps(_lost_kept(
                object_id, copy, f"copying it after its pull failed: {failed}"))
        with self.owner.locked():
            objects.release([object_id])  # freed here, and on its node
            if self._keeper.closed and result[0] != protocol.ERR:
                segs.unlink_quiet(dst)  # nobody would send or remove it now
                result = protocol.ERR, serialization.dumps(_lost_kept(
                    object_id, copy, "the service stopped before it could send it"))
        return result

    def _send_kept_reply(self, client: _Client, task_id: bytes, return_ids: list,
                         results: list, nested: list) -> None:
        """*Locked.* A reply the keeper passed on: sent, and no longer waiting."""
        self._keeper.done(client.token)
        self._send_reply(client, task_id, return_ids, results, nested)

    def _here(self):
        """*Not locked, the keeper's threads only.* This process's link to its own node, which
        keeps results for it (made when first needed: ``RemoteNodes.client`` of this node's
        entry in the view, its grant key asked); None when it cannot be had: results cross
        at once, and the link is asked for again once ``_link_retry`` allows (every
        ``reply_keeper.RETRY_S`` at most)."""
        link = self._own_link
        if link is not None and link.lost is None:
            return link
        with self._here_lock:  # one keeper thread asks; the others go on without it
            now = time.monotonic()
            if not self._link_retry.may_try(now):
                return None
            self._link_retry.trying(now)  # replies cross at once while it is asked
        with self.owner.locked():
            nodes = self.owner._remote_nodes()
        try:
            entry = next((e for e in nodes.view() if e.node_id == nodes.local), None)
            if entry is None:
                raise LookupError("this node is not in the cluster's view")
            link = nodes.client(entry)
            if link.kept is None:
                raise LookupError("this node keeps no results for its drivers")
            nodes.kept_results.grant_key(link, timeout=OWN_LINK_TIMEOUT_S)
        except Exception as failed:  # noqa: BLE001 - results cross at once, as before
            logger.info("results for drivers on other hosts cross at once for %.0f s: %s",
                        self._link_retry.every_s, failed)
            self._own_link = None
            self._link_retry.failed(time.monotonic())
            return None
        self._own_link = link
        self._link_retry.had()
        return link

    def _keep_segment(self, link, object_id: bytes, kind: int, data: tuple) -> tuple:
        """*Not locked.* ``_keep_here`` for one result: ``(kind, ("remote", RemoteCopy))``;
        unchanged when it cannot be kept (cap, rename); an error when the node refused
        the segment it was handed (it unlinked it)."""
        from miniray._private.object_store import kept_budget  # lazy: a cluster's only
        from miniray._private.owner.remote_objects import KeepRefused  # lazy: as above

        _where, name, size = data
        shm_dir = self.owner.store.shm_dir
        tag, cap = link.kept
        if not kept_budget.reserve(shm_dir, tag, size, cap, object_id):
            return kind, data  # past the cap of this process's link: sent at once
        src = segs.resolve_path(name, shm_dir)
        dst = os.path.join(shm_dir, segs.segment_name(tag, object_id))
        try:
            os.rename(src, dst)
        except OSError:
            kept_budget.unreserve(shm_dir, tag, object_id)
            return kind, data
        kept = self.owner.remote_nodes.kept_results
        try:
            return kind, ("remote", kept.keep_segment(link, link.node_id, object_id, dst,
                                                      size))
        except KeepRefused as refused:
            segs.unlink_quiet(dst)
            kept_budget.unreserve(shm_dir, tag, object_id)
            from miniray.exceptions import RaySystemError  # lazy: the public package

            logger.warning("%s", refused)
            return protocol.ERR, serialization.dumps(RaySystemError(
                f"the result could not stay on this node: {refused}"))

    def _hand_on_kept(self, kind: int, copy, client: _Client, object_id: bytes) -> tuple:
        """*Locked.* A result that the actor's node N keeps for this process's link
        (``remote_actors`` step 4): ``(kind, ("kept", object id, N's id, size, path on N,
        [N's ip, port], the link's tag, the grant of it to the caller's node and IP))``,
        which the caller pulls straight from N (``KeptResults.granted_copy``); held here
        for the caller (``client.kept``) until it frees it (SVC_FREE) or leaves. A caller
        that named no node gets the value instead (``_pull_here``, on the keeper's thread,
        before this). Not handed on: freed, and the caller gets ObjectLostError saying why
        (the link lost meanwhile, its grant key gone, as for any result kept on a node
        that was lost; the caller gone: nothing is sent; a caller that named no node:
        the service stopped before the keeper pulled it, or the keeper had no thread to
        pull it with and could start none)."""
        node_id, ip = client.where
        kept = self.owner.remote_nodes.kept_results
        handed = None if client.gone or not node_id else kept.hand_on(object_id, node_id, ip)
        if handed is None:
            copy.free()
            if client.gone:
                why = "the calling driver left before it was handed on"
            elif not node_id and self._keeper.closed:
                why = ("the calling driver named no node to pull it to, and the service "
                       "stopped before it could pull it for that driver")
            elif not node_id:  # ``_reply``: the keeper had no thread and could start none
                why = ("the calling driver named no node to pull it to, and the service "
                       "could not start a thread to pull it for that driver (its process "
                       "is at its limit of threads: see the node's log, "
                       "<session>/node.log); call again once the node runs fewer threads, "
                       "or raise the limit (ulimit -u) for the node")
            else:
                why = "the service's link to that node was lost"
            return protocol.ERR, serialization.dumps(_lost_kept(object_id, copy, why))
        client.kept[object_id] = copy
        address, tag, grant = handed
        return kind, ("kept", object_id, copy.node_id, copy.size, copy.path, address, tag,
                      grant)

    def _free_kept(self, client: _Client, object_ids) -> None:
        """*Locked.* These results kept for ``client`` are freed on their nodes (queued:
        ``KeptResults`` sends the frees after the lock); ids not kept for it are skipped."""
        for object_id in object_ids or ():
            copy = client.kept.pop(object_id, None)
            if copy is not None:
                copy.free()

    def _discard(self, data) -> None:
        """A payload that was not sent: its segment removed (a value packed for another
        host, ``("copy", bytes, size)``, has none)."""
        if isinstance(data, tuple) and isinstance(data[1], str):
            segs.unlink_quiet(segs.resolve_path(data[1], self.owner.store.shm_dir))

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting and close every driver's sockets (their proxies fail from now on);
        the keeper's threads end after the jobs they are in, and the replies still queued
        are sent at once as plain values, or failed (``_settle_queued``).

        Steps: 1. under the owner's lock, at once (no reply of the I/O thread comes
        between): the keeper stopped, its queued replies settled, its pulls woken (they
        fail), every driver marked gone
        (a reply posted later is not sent: its payloads are removed), the sockets taken
        from the reactor. 2. After the lock: what the sockets still have queued written,
        blocking, ``CLOSE_FLUSH_S`` at most in all (``_flush_out``), then they close.
        3. The keeper's threads waited for (``KEEPER_JOIN_S``; their jobs lock to post)."""
        with self.owner.locked():
            self._settle_queued(self._keeper.stop())
            for pulled in self._pulls:  # ``_pull_here`` gives up at once
                pulled.set()
            self.owner.reactor.unregister(self.listener.fileno())
            self.listener.close()
            conns = []
            for fd in list(self._conns):
                conns.append(self._conns.pop(fd)[0])
                self.owner.reactor.unregister(fd)
            for client in self._clients.values():
                client.gone = True
            self._clients.clear()
        unsent = _flush_out(conns, CLOSE_FLUSH_S)
        if unsent:
            logger.warning("stopping: %d driver connection(s) closed with replies not fully "
                           "written within %.0f s", unsent, CLOSE_FLUSH_S)
        for conn in conns:
            conn.close()
        self._keeper.join(KEEPER_JOIN_S)
        segs.unlink_quiet(self.path)

    def _settle_queued(self, jobs: list) -> None:
        """*Locked*, at teardown. The keeper's jobs not begun, each driver's in order: sent
        now, before the sockets close, as plain values (nothing kept: results cross as
        before) to a driver still connected whose earlier replies were all sent; else
        failed: their payloads removed and their kept copies freed, and the driver sees
        the service's link close (its proxies' calls fail with the service's loss) instead
        of a reply out of order. An actor's output queued there goes to its driver the
        same way, else is printed here (node.log). Logged, never silent."""
        queued: dict[str, int] = {}
        for job in jobs:
            queued[job[0].token] = queued.get(job[0].token, 0) + 1
        sent = failed = 0
        for client, task_id, return_ids, results, nested, mode in jobs:
            in_order = self._keeper.waiting.get(client.token, 0) <= queued[client.token]
            queued[client.token] -= 1
            self._keeper.done(client.token)
            if mode == OUTPUT:  # to its driver in order, else printed here: never lost
                if in_order:
                    self._send_output(client, results)
                else:
                    deliver(results[1], results[2])
                continue
            if in_order and not client.gone:
                sent += 1
                if mode == VALUE:
                    self._send_value(client, results)
                else:
                    self._send_reply(client, task_id, return_ids, results, nested)
                continue
            failed += 1
            if mode == VALUE:
                self._discard(results[4])
                nested = [(0, results[5])]
            else:
                for _kind, data in results:
                    if type(data) is tuple and data[0] == "remote":
                        data[1].free()
                    else:
                        self._discard(data)
            for _index, items in nested or ():
                for _id, _kind, payload in items:
                    self._discard(payload)
        if jobs:
            logger.info("stopping: %d queued repl(ies) sent as plain values, %d failed "
                        "(their drivers gone, or an earlier reply of theirs unsent)",
                        sent, failed)

    def __repr__(self) -> str:
        return f"<ActorService {self.path} drivers={len(self._clients)}>"


def _flush_out(conns: list, seconds: float) -> int:
    """*Not locked*, at teardown, sockets no longer in the reactor: what each of ``conns``
    has queued written, blocking ``seconds`` at most in all. Returns how many still had
    some left (their peer not reading, or gone)."""
    deadline = time.monotonic() + seconds
    pending = list(conns)
    while pending:
        waiting = []
        for conn in pending:
            try:
                if not conn.flush():
                    waiting.append(conn)
            except OSError:
                continue  # its peer is gone: nothing more to write
        pending = waiting
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        try:
            select.select([], pending, [], min(left, 0.1))
        except (OSError, ValueError):
            break
    return len(pending)


def _error_reply(error: BaseException, message: tuple) -> bytes:
    """The pickled error a driver raises for its request ``message``: ``error`` itself when
    it is an ``Exception`` that pickles, else a RuntimeError naming the request and it (a
    ``BaseException`` such as SystemExit must not end the driver that asked)."""
    if isinstance(error, Exception):
        with contextlib.suppress(Exception):
            return serialization.dumps(error)
    tag = message[0] if isinstance(message, tuple) and message else None
    what = protocol.tag_name("actor_service", tag)
    return serialization.dumps(RuntimeError(
        f"The node's actor service failed to serve {what}: {type(error).__name__}: "
        f"{error} (see the node's log, <session>/node.log, for more)."))


def _lost_kept(object_id: bytes, copy, why: str) -> Exception:
    """The ObjectLostError of a result kept on node ``copy.node_id`` for this service that
    its caller cannot have, saying ``why``."""
    from miniray.exceptions import ObjectLostError  # lazy: the public package

    error = ObjectLostError(object_id.hex(), "", "")
    error.lost_on = f"It was kept on node {copy.node_id[:12]} for the actor service; {why}"
    return error


def _where(value) -> tuple[str, str]:
    """A driver's ``(node id, IP)`` from its SVC_HELLO; ``("", "")`` when it named none.

    >>> _where(("ab" * 28, "127.0.0.2")), _where(None), _where((1, 2))
    (('abababababababababababababababababababababababababababab', '127.0.0.2'), ('', ''), ('', ''))
    """
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, str) for v in value)):
        return str(value[0]), str(value[1])
    return "", ""


def _copy_segment(payload: tuple, shm_dir: str, tag: str) -> tuple:
    """A copy of a segment (or spilled file) under a fresh name of session ``tag``: a store of
    that session adopts it. The name is random, so it never meets a segment the store has.
    A value from another host (``("copy", bytes, size)``) is written there the same way."""
    if isinstance(payload[1], (bytes, bytearray, memoryview)):
        return unpack_value(payload, shm_dir, tag)
    _where, src, size = payload
    dst = os.path.join(shm_dir, segs.segment_name(tag, os.urandom(28)))
    segs.copy_file(src, dst, size)
    return ("shm", dst, size)


def main() -> None:
    """``python -m miniray._private.node.actor_service ADDRESS TEMP_ROOT SESSION_DIR NODE_PID``,
    started by the node; runs until SIGTERM, the node's death, or the node dropping it."""
    address, root, session_dir, node_pid = sys.argv[1:5]
    set_pdeathsig(signal.SIGTERM)  # the node died without stopping us: leave too
    if os.getppid() != int(node_pid):
        return
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    runtime.AS_ACTOR_SERVICE = True
    runtime.init(address=address, _temp_dir=root, log_to_driver=True,
                 namespace="_miniray_actor_service")
    rt = runtime.current()
    service = None
    try:
        service = ActorService(rt, session_dir)
        logger.info("actor service ready on %s", service.path)
        while not stop.wait(0.5):
            if rt._shut or rt.owner.fatal:
                break
    finally:
        if service is not None:
            service.close()
        runtime.shutdown()


if __name__ == "__main__":
    main()
