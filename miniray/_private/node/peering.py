"""A node's TCP side: its listener, joining a head, heartbeats and the published cluster view.

Owns: the node's TCP listener (``bind_listener``), the head's authoritative
``ClusterView`` and the member's copy of it, the member's link to the head (``join`` at
start, heartbeats, rejoining), accepting ``join`` links on the head, and publishing the view
for drivers and ``miniray status`` (``<session>/cluster.json``, atomic replace, on every
change; a head with members also every heartbeat period, with its clock, so that status
shows fresh heartbeat ages). Does not own: the token (``host/auth_token.py``), the handshake
and frames (``transport/peer_channel.py``), the view's rules and failure detector
(``core/cluster_view.py``), the selector loop and AF_UNIX drivers (``node.py``), remote
drivers' leases and spawns (``remote_drivers.py``: this module accepts the roles ``driver``
and ``attach`` on any node, hands each such channel to it, lets it ``tick``, and calls its
``fence`` at steps 3-4; it gives it ``post``, which runs a function on the loop from a
thread, and ``connect_pull``, a ``pull`` connection to another node with the token, TLS
and this node's address: its step 12, node-to-node fetches), the head's relay of the role
``actors`` to its actor service (``actor_relay.py``: this module accepts the role on a head
and hands it each channel), or remote tasks, actors and objects (a later phase).
Called by: ``node.py`` (``run_node`` binds, joins, and builds ``Peering``; ``NodeServer``
calls ``register``/``due``/``tick``/``close``).

Threads: the selector loop owns the view and every registered channel. Handshakes run in
``HandshakeGate`` threads (at most 16 at a time, 5 s each); a member's reconnects run in
one short thread at a time. Both hand their result to the loop through a queue and the
loop's wake pipe. Sends from the loop go through sockets with a ``SEND_TIMEOUT_S`` timeout:
a peer that stops reading for that long is dropped, the loop never blocks for longer.

Protocol, member B -> head H, role "join" on H's port (after peer_channel's steps 1-7;
every message is a pickled tuple in one MAC'd frame, checked for shape before use):

1. B binds its own listener (``--node-ip-address``:``--port``), then connects to H with
   role "join" and hello ``{"node": NodeEntry fields, "cluster": H's address}``. H's
   handshake thread accepts the roles "join" (on a head), "driver", "attach" and "pull" (on
   any node: ``remote_drivers.py``, whose hello it checks) and "actors" (on a head: drivers of
   member nodes reaching its actor service, relayed by ``actor_relay.py``); any other role
   is refused by name.
   A wrong token or another miniray/Python version fails here: ``miniray start`` exits 1
   with that message and nothing is left running.
2. H's loop applies the JOIN (``ClusterView.join``); a stale incarnation is answered
   ``("refused", text)`` and closed. Otherwise H sends ``("view", snapshot)`` to B and to
   every other member (a full snapshot: clusters here are small).
3. B -> H ``("hb", seq, incarnation, available)`` every ``MINIRAY_HEARTBEAT_S`` and, at most
   every ``HB_MIN_GAP_S``, sooner when its ledger's available resources changed.
   H -> B ``("hb_ack", seq, ok, snapshot)``. ``ok`` False: H holds B dead (it missed
   ``MINIRAY_NODE_DEAD_AFTER_S`` of heartbeats, e.g. SIGSTOP): B closes the link and rejoins
   with incarnation + 1. H also sends ``("dead", reason)`` when it declares B dead, then
   closes the link: a B that was stopped reads it first when it runs again, and rejoins the
   same way. Fencing: before it rejoins, B releases every lease it holds for remote drivers
   and closes their links (``RemoteDrivers.fence``; their workers too, once they exist),
   so nothing runs twice once the head had it retried elsewhere.
4. B without an ack for ``dead_after`` fences the same way, closes the link and rejoins.
   Each judgment (H's of a member, B's of H) first reads what arrived on the links since
   the loop's select (``_read_pending``): a loop that was busy is not a dead peer.
5. Link EOF at H: the node is dead after ``cluster_view.EOF_GRACE_S`` unless it rejoins
   with the same id. At B: B keeps serving its local drivers and reconnects (backoff
   ``RETRY_MIN_S`` doubling to ``RETRY_MAX_S``; one log line per state change, not per try).
   A new head at the same address is joined the same way.
6. ``miniray stop`` on B: B -> H ``("leave", reason)`` then close; H marks B dead with an
   expected-termination reason.
7. Anything else from a peer (an unknown tag, a bad shape) is logged once and the link
   closed. Nothing is unpickled before the peer proved the token (peer_channel).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
from dataclasses import asdict

from miniray._private.core import config
from miniray._private.core.cluster_view import ClusterView, NodeEntry
from miniray._private.node.actor_relay import ROLE_ACTORS, ActorRelay
from miniray._private.node.remote_drivers import (
    ROLE_ATTACH,
    ROLE_DRIVER,
    RemoteDrivers,
    check_attach_hello,
    check_hello,
    check_pull_hello,
)
from miniray._private.transport import node_client as nc
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.remote_node import ROLE_PULL

__all__ = ["JoinError", "Peering", "bind_listener", "join_head", "route_source"]

logger = logging.getLogger(__name__)

ROLE_JOIN = "join"
SEND_TIMEOUT_S = 4.0
HANDSHAKE_TIMEOUT_S = 5.0
HB_MIN_GAP_S = 0.05
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0


class JoinError(ConnectionError):
    """Joining the head failed (token, versions, refused, unreachable); the message is the
    user's."""


# ------------------------------------------------------------------------------ listener
def bind_listener(ip: str, port: int) -> socket.socket:
    """A listening TCP socket on ``ip:port`` (``port`` 0: a free one). NodeStartError naming
    the address when it is taken or not an address of this host."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise nc.NodeStartError(f"cannot listen on {ip}:{port}: {error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ip, port))
        sock.listen(64)
    except OSError as error:
        sock.close()
        if port and error.errno in (98, 13):  # EADDRINUSE, EACCES
            raise nc.NodeStartError(
                f"miniray cannot listen on {ip}:{port}: {error.strerror}. Another process "
                "uses that port: choose another with `--port`, or `--port 0` for a free "
                "one.") from None
        raise nc.NodeStartError(
            f"miniray cannot listen on {ip}:{port}: {error.strerror or error}. Check "
            "`--node-ip-address` (it must be an address of this host).") from None
    return sock


def route_source(host: str) -> str:
    """The address of this host that reaches ``host`` (a member's default
    ``--node-ip-address``, as Ray's); 127.0.0.1 when there is no route."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: no packet is sent
            return probe.getsockname()[0]
    except OSError:
        return nc.NODE_IP


def _send(channel: pc.PeerChannel, message) -> None:
    """Send from the loop: the channel waits at most ``SEND_TIMEOUT_S`` for room
    (``set_send_timeout``: TimeoutError, and the channel closed, past that)."""
    channel.set_send_timeout(SEND_TIMEOUT_S)
    channel.send(message)


# ------------------------------------------------------------------------------ joining
def join_head(head: tuple[str, int], token: bytes, entry: NodeEntry,
              timeout: float = HANDSHAKE_TIMEOUT_S,
              ssl_context=None) -> tuple[pc.PeerChannel, dict]:
    """Steps 1-2 from the member's side, blocking: the channel and the head's first view
    snapshot. JoinError with the message to show (token, versions, refusal), or OSError /
    TimeoutError when the head cannot be reached."""
    where = f"{head[0]}:{head[1]}"
    # Fake hosts on 127.0.0.x: connect from the node's own address (the head logs it).
    source = (entry.ip, 0) if entry.ip.startswith("127.") and head[0].startswith("127.") \
        else None
    try:
        channel = ph.connect(head, token, ROLE_JOIN, hello={"node": entry.to_json()},
                             timeout=timeout, source_address=source,
                             ssl_context=ssl_context)
    except (pc.PeerAuthError, pc.PeerRefused) as error:
        raise JoinError(str(error)) from None
    try:
        first = channel.recv(timeout=timeout)
    except TimeoutError:
        channel.close()
        raise TimeoutError(f"the head at {where} did not answer the join within "
                           f"{timeout} s") from None
    except pc.PeerClosed:
        channel.close()
        raise ConnectionError(f"the head at {where} closed the connection") from None
    if isinstance(first, tuple) and len(first) == 2 and first[0] == "refused":
        channel.close()
        raise JoinError(f"the head at {where} refused this node: {first[1]}")
    if not (isinstance(first, tuple) and len(first) == 2 and first[0] == "view"):
        channel.close()
        raise JoinError(f"the head at {where} answered the join with {first!r:.80}")
    return channel, first[1]


# ---------------------------------------------------------------------------- publishing
def _write_cluster(path: str, doc: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ the node
class _Member:
    __slots__ = ("channel", "node_id")

    def __init__(self, channel: pc.PeerChannel):
        self.channel = channel
        self.node_id: str | None = None


class Peering:
    """The node's membership, run by ``NodeServer``'s loop (see the module docstring)."""

    def __init__(self, *, entry: NodeEntry, listener: socket.socket, token: bytes,
                 session_dir: str, ledger, head: tuple[str, int] | None = None,
                 channel: pc.PeerChannel | None = None, snapshot: dict | None = None,
                 tls: tuple | None = None, gpu_keys: list | None = None):
        self.entry = entry  # this node (is_head when head is None)
        self.listener = listener
        self.token = token
        self.ledger = ledger
        self.head = head
        self.drivers = RemoteDrivers(ledger, node_id=entry.node_id, gpu_keys=gpu_keys)
        self.is_head = head is None
        self.cluster_path = os.path.join(session_dir, nc.CLUSTER_FILE)
        self.actor_relay = ActorRelay(session_dir) if head is None else None
        self.heartbeat_s = config.heartbeat_s()
        self.dead_after = config.node_dead_after_s()
        self._sel: selectors.BaseSelector | None = None
        self._wake = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # from threads to the loop
        self._members: dict[int, _Member] = {}  # head: by fd
        self._tls = tls  # (client, server) contexts, ph.tls_contexts(); None: no TLS
        self._gate = ph.HandshakeGate(token, on_channel=self._from_thread, answer=self._answer,
                                      timeout=HANDSHAKE_TIMEOUT_S, name="miniray-join",
                                      ssl_context=tls[1] if tls else None)
        self._published = -1
        self._published_at = 0.0  # monotonic time of the last publish
        self._head_version = -1  # member: the version of the head's last snapshot
        self._broadcasted = -1
        self._closed = False
        now = time.monotonic()
        if self.is_head:
            self.view = ClusterView()
            self.view.join(entry, now)
        else:
            self.view = ClusterView.from_snapshot(snapshot or {"nodes": []})
            self._head_version = self.view.version
        # member state
        self._link = channel
        self._state = "linked" if channel is not None else "disconnected"
        self._hb_seq = 0
        self._hb_next = now
        self._hb_last_sent = 0.0
        self._last_ack = now
        self._sent_available: dict | None = None
        self._retry_at: float | None = None
        self._retry_wait = RETRY_MIN_S
        self._connecting = False
        self._ledger_check = now
        self._ledger_stamp: tuple | None = None

    @property
    def tls(self) -> bool:
        """This node's links use TLS (a TLS session cannot be handed to another process:
        ``node.NodeServer`` forks no worker for a remote driver then)."""
        return bool(self._tls)

    # -- wiring into the loop --------------------------------------------------------------
    def register(self, sel: selectors.BaseSelector, wake) -> None:
        self._sel = sel
        self._wake = wake
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, self._on_accept)
        self.drivers.post = self._post  # step 12 of remote_drivers: node-to-node fetches
        self.drivers.connect_pull = self._connect_pull
        self.drivers.register(sel)
        if self._link is not None:
            self._watch_link(self._link)
        self._publish()

    def due(self, now: float) -> float:
        """When ``tick`` wants to run next."""
        times = [now + self.heartbeat_s]
        ticket_deadline = self.drivers.next_deadline()
        if ticket_deadline is not None:
            times.append(ticket_deadline)
        if self.is_head or self._state == "linked":
            times.append(self._ledger_check)
        if self.is_head:
            deadline = self.view.next_deadline(self.dead_after, exempt=self.entry.node_id)
            if deadline is not None:
                times.append(deadline)
        else:
            if self._state == "linked":
                times += [self._hb_next, self._last_ack + self.dead_after]
            elif self._retry_at is not None and not self._connecting:
                times.append(self._retry_at)
        return max(now, min(times))

    def tick(self, now: float) -> None:
        """Everything due: the inbox, heartbeats, the failure detector, publishing."""
        self._drain_inbox(now)
        self._read_pending()
        self.drivers.tick(now)
        if self.is_head:
            self._head_tick(now)
        else:
            self._member_tick(now)
        if self.view.version != self._published or (
                self.is_head and len(self.view.alive()) > 1
                and now - self._published_at >= self.heartbeat_s):
            self._publish()  # a head with members: also every heartbeat, for their ages

    def _read_pending(self) -> None:
        """Heartbeats (at the head) and acks (at a member) that arrived after the loop's
        select are read before the failure detector judges: a loop busy in a handler, or
        not scheduled, for longer than dead_after would otherwise hold a peer dead whose
        message waits unread on its socket (a false death: the actors on it die)."""
        if self.is_head:
            for fd in list(self._members):
                self._on_member(fd)
        elif self._link is not None and self._state == "linked":
            self._on_link(None)

    def close(self, reason: str) -> None:
        """Step 6 for a member; a head closes every member's link (they see EOF)."""
        if self._closed:
            return
        self._closed = True
        if self._link is not None:
            with contextlib.suppress(OSError, pc.PeerClosed):
                _send(self._link, ("leave", reason))
            self._drop_link()
        for member in list(self._members.values()):
            self._close_member(member)
        self.drivers.close(f"the node is stopping ({reason})")
        if self.actor_relay is not None:
            self.actor_relay.close()
        if self._sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self.listener)
        self.listener.close()
        self._gate.close(timeout=1.0)
        while True:  # channels handed over after the loop stopped
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "joined":
                item = item[0]
            if isinstance(item, pc.PeerChannel):
                item.close()
        nc.unlink_quiet(self.cluster_path)

    # -- from threads ------------------------------------------------------------------------
    def _answer(self, hello: dict):
        """In a handshake thread, after the token and versions passed: the role check."""
        if hello.get("role") == ROLE_DRIVER:
            return check_hello(hello) or {"node_id": self.entry.node_id}
        if hello.get("role") == ROLE_ATTACH:
            return check_attach_hello(hello) or {}
        if hello.get("role") == ROLE_PULL:
            return check_pull_hello(hello) or {}
        if hello.get("role") == ROLE_ACTORS and not self.is_head:
            return (f"the node at {self.entry.address} is not a head: named and detached "
                    f"actors live in its head's actor service ({self.head[0]}:{self.head[1]})")
        if hello.get("role") == ROLE_ACTORS:
            return {"node_id": self.entry.node_id}
        if hello.get("role") != ROLE_JOIN:
            return (f"this port accepts only the roles {ROLE_JOIN!r}, {ROLE_DRIVER!r}, "
                    f"{ROLE_ATTACH!r}, {ROLE_PULL!r} and {ROLE_ACTORS!r} in this miniray "
                    "version")
        if not self.is_head:
            return (f"the node at {self.entry.address} is not a head: join the head of its "
                    f"cluster ({self.head[0]}:{self.head[1]})")
        return {}

    def _post(self, fn) -> None:
        """From a thread: ``fn()`` runs on the loop (``remote_drivers``' fetch ends)."""
        self._inbox.put(("call", fn))
        self._wake()

    def _connect_pull(self, address: tuple, hello: dict) -> pc.PeerChannel:
        """From a thread: a ``pull`` connection to another node's port (the cluster token,
        TLS where on, from this node's address): ``remote_drivers`` step 12."""
        channel = ph.connect((address[0], int(address[1])), self.token, ROLE_PULL,
                             hello=hello, timeout=HANDSHAKE_TIMEOUT_S,
                             ssl_context=self._tls[0] if self._tls else None,
                             source_address=(self.entry.ip, 0))
        channel.set_send_timeout(HANDSHAKE_TIMEOUT_S)
        return channel

    def _from_thread(self, channel: pc.PeerChannel) -> None:
        self._inbox.put(("accepted", channel))
        self._wake()

    def _on_accept(self, _sock) -> None:
        for _ in range(64):
            try:
                conn, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                logger.warning("accepting a peer connection failed: %s", error)
                return
            self._gate.submit(conn)

    def _drain_inbox(self, now: float) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "call":  # even when closing: a fetch's end unlinks what it wrote
                try:
                    item()
                except Exception:  # noqa: BLE001 - one posted action failing never stops the node
                    logger.exception("a posted action failed on the node's loop")
            elif kind == "accepted" and item.role in (ROLE_DRIVER, ROLE_ATTACH, ROLE_PULL):
                if self._closed:
                    item.close()
                elif item.role == ROLE_DRIVER:
                    self.drivers.add(item)
                elif item.role == ROLE_PULL:
                    self.drivers.pull(item)
                else:
                    self.drivers.attach(item)
            elif kind == "accepted" and item.role == ROLE_ACTORS:
                if self._closed or self.actor_relay is None:
                    item.close()
                else:
                    self.actor_relay.add(item)
            elif kind == "accepted":
                self._on_join(item, now)
            elif kind == "joined":
                self._on_rejoined(item, now)
            elif kind == "join_failed":
                self._connecting = False
                self._retry_at = now + self._retry_wait
                self._retry_wait = min(RETRY_MAX_S, self._retry_wait * 2)
                if self._state != "retrying":
                    self._state = "retrying"
                    logger.warning("cannot rejoin the head at %s yet (%s); retrying with "
                                   "backoff up to %s s", self._head_name(), item, RETRY_MAX_S)

    # -- head ------------------------------------------------------------------------------
    def _on_join(self, channel: pc.PeerChannel, now: float) -> None:
        """Step 2."""
        if self._closed or not self.is_head:
            channel.close()
            return
        try:
            entry = NodeEntry.from_json(channel.peer_hello.get("node"))
            problem = entry.problem()
            if problem:
                raise TypeError(problem)
        except (TypeError, ValueError, AttributeError) as error:
            logger.warning("refused the join of %s: malformed record (%s)", channel.address,
                           error)
            channel.close()
            return
        channel.setblocking(False)
        if entry.node_id == self.entry.node_id:
            self._refuse(channel, "it has the head's own node id")
            return
        refusal = self.view.join(entry, now)
        if refusal is not None:
            self._refuse(channel, refusal)
            return
        for member in list(self._members.values()):  # a reconnect replaces the old link
            if member.node_id == entry.node_id:
                self._close_member(member)
        member = _Member(channel)
        member.node_id = entry.node_id
        self._members[channel.fileno()] = member
        self._sel.register(channel.fileno(), selectors.EVENT_READ, self._on_member)
        logger.info("node %s joined from %s (incarnation %d): %s", entry.node_id[:12],
                    channel.address, entry.incarnation, entry.totals)
        self._broadcast()

    def _refuse(self, channel: pc.PeerChannel, text: str) -> None:
        logger.warning("refused the join of %s: %s", channel.address, text)
        with contextlib.suppress(OSError, pc.PeerClosed):
            _send(channel, ("refused", text))
        channel.close()

    def _on_member(self, fd: int) -> None:
        member = self._members.get(fd)
        if member is None:
            return
        now = time.monotonic()
        try:
            messages = member.channel.feed_nonblocking()
        except (pc.PeerClosed, pc.PeerAuthError, OSError) as error:
            logger.info("the link of node %s closed: %s", (member.node_id or "?")[:12], error)
            self._member_gone(member, now)
            return
        for message in messages:
            if not self._member_message(member, message, now):
                self._member_gone(member, now)
                return

    def _member_message(self, member: _Member, message, now: float) -> bool:
        """Steps 3 and 6 at the head; False closes the link (step 7)."""
        tag = message[0] if isinstance(message, tuple) and message else None
        if tag == "hb" and len(message) == 4 and isinstance(message[3], (dict, type(None))):
            _tag, seq, incarnation, available = message
            ok = self.view.heartbeat(member.node_id, available, now, incarnation)
            return self._send_member(member, ("hb_ack", seq, ok, self.view.snapshot()))
        if tag == "leave" and len(message) == 2:
            entry = self.view.nodes.get(member.node_id)
            if entry is not None and entry.alive:
                self.view.leave(member.node_id, f"The node was stopped ({message[1]}).", now)
                logger.info("node %s left: %s", member.node_id[:12], message[1])
            self._close_member(member)
            self._broadcast()
            return True
        logger.warning("closed the link of node %s: unexpected message %r",
                       (member.node_id or "?")[:12], tag)
        return False

    def _send_member(self, member: _Member, message) -> bool:
        try:
            _send(member.channel, message)
            return True
        except (OSError, pc.PeerClosed) as error:
            logger.warning("dropped the link of node %s: sending failed (%s)",
                           (member.node_id or "?")[:12], error)
            return False

    def _member_gone(self, member: _Member, now: float) -> None:
        self._close_member(member)
        if member.node_id:
            self.view.link_lost(member.node_id, now)

    def _close_member(self, member: _Member) -> None:
        for fd, m in list(self._members.items()):
            if m is member:
                del self._members[fd]
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(fd)
        member.channel.close()

    def _head_tick(self, now: float) -> None:
        self._refresh_own(now)
        dead = self.view.expire(now, self.dead_after, exempt=self.entry.node_id)
        for node_id in dead:
            entry = self.view.nodes[node_id]
            logger.warning("node %s (%s) is dead: %s", node_id[:12], entry.address,
                           entry.death_message)
            for member in list(self._members.values()):
                if member.node_id == node_id:  # it reads this first if it ever runs again
                    with contextlib.suppress(OSError, pc.PeerClosed):
                        _send(member.channel, ("dead", entry.death_message))
                    self._close_member(member)
        if self.view.version != self._broadcasted:
            self._broadcast()

    def _broadcast(self) -> None:
        self._broadcasted = self.view.version
        snapshot = self.view.snapshot()
        for member in list(self._members.values()):
            if not self._send_member(member, ("view", snapshot)):
                self._member_gone(member, time.monotonic())

    def _refresh_own(self, now: float) -> None:
        """The head's own entry: alive, its ledger's available resources."""
        if now < self._ledger_check:
            return
        self._ledger_check = now + HB_MIN_GAP_S
        if not self._ledger_changed():
            return
        available = self._available()
        own = self.view.nodes.get(self.entry.node_id)
        if own is not None and available is not None:
            self.view.heartbeat(own.node_id, available, now)

    def _ledger_changed(self) -> bool:
        """Whether the ledger file was replaced since the last look (every write replaces
        it: a new inode, a new mtime)."""
        try:
            st = os.stat(self.ledger.path)
        except (OSError, AttributeError):
            return True
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        changed, self._ledger_stamp = stamp != self._ledger_stamp, stamp
        return changed

    def _available(self) -> dict | None:
        try:
            return dict(self.ledger.available())
        except Exception as error:  # noqa: BLE001 - a ledger problem must not stop the loop
            logger.warning("reading the ledger for the heartbeat failed: %s", error)
            return None

    # -- member ----------------------------------------------------------------------------
    def _head_name(self) -> str:
        return f"{self.head[0]}:{self.head[1]}" if self.head else "?"

    def _watch_link(self, channel: pc.PeerChannel) -> None:
        channel.setblocking(False)
        self._link = channel
        self._sel.register(channel.fileno(), selectors.EVENT_READ, self._on_link)
        now = time.monotonic()
        self._last_ack = now
        self._hb_next = now

    def _on_link(self, _fd) -> None:
        now = time.monotonic()
        try:
            messages = self._link.feed_nonblocking()
        except (pc.PeerClosed, pc.PeerAuthError, OSError):
            self._lost_head("the head closed the link")
            return
        for message in messages:
            tag = message[0] if isinstance(message, tuple) and message else None
            if tag == "view" and len(message) == 2:
                self._take_view(message[1])
            elif tag == "hb_ack" and len(message) == 4:
                self._last_ack = now
                if not message[2]:
                    self._declared_dead()
                    return
                self._take_view(message[3])
            elif tag in ("refused", "dead") and len(message) == 2:
                logger.warning("the head %s this node: %s",
                               "refused" if tag == "refused" else "declared dead", message[1])
                self._declared_dead()
                return
            else:
                logger.warning("closed the link to the head: unexpected message %r", tag)
                self._lost_head("unexpected message")
                return

    def _take_view(self, snapshot) -> None:
        try:
            view = ClusterView.from_snapshot(snapshot)
        except (ValueError, TypeError):
            return
        if view.version != self._head_version:
            self._head_version = view.version
            view.version = self.view.version + 1  # our own counter: publish on change
            self.view = view

    def _declared_dead(self) -> None:
        """Step 3's ``ok`` False or a refusal: rejoin as a new incarnation."""
        self.entry.incarnation += 1
        released = self.drivers.fence("the head holds this node dead")
        logger.warning("the head holds this node dead; fenced (%d remote lease(s) released), "
                       "rejoining as incarnation %d", released, self.entry.incarnation)
        self._drop_link()
        self._state = "disconnected"
        self._retry_at = time.monotonic()
        self._retry_wait = RETRY_MIN_S

    def _lost_head(self, why: str) -> None:
        if self._state == "linked":
            logger.warning("lost the head at %s (%s); serving local drivers and rejoining",
                           self._head_name(), why)
        self._drop_link()
        self._state = "disconnected"
        self._retry_at = time.monotonic()
        self._retry_wait = RETRY_MIN_S
        self.view.version += 1  # republish: linked is now False

    def _drop_link(self) -> None:
        if self._link is None:
            return
        if self._sel is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(self._link.fileno())
        self._link.close()
        self._link = None

    def _member_tick(self, now: float) -> None:
        if self._state == "linked":
            if now - self._last_ack >= self.dead_after:
                self.entry.incarnation += 1  # step 4: the head must hold us dead by now
                self.drivers.fence(f"no heartbeat answer from the head for "
                                   f"{self.dead_after:g} s")
                self._lost_head(f"no heartbeat answer for {self.dead_after:g} s")
                return
            send = now >= self._hb_next
            if now >= self._ledger_check:
                self._ledger_check = now + HB_MIN_GAP_S
                if self._ledger_changed():  # a stat; the ledger is read only if it changed
                    available = self._available()
                    if available is not None and available != self._sent_available:
                        send = send or now - self._hb_last_sent >= HB_MIN_GAP_S
            if send:
                self._send_heartbeat(now)
        elif (self._retry_at is not None and now >= self._retry_at and not self._connecting
              and not self._closed):
            self._connecting = True
            entry = NodeEntry(**asdict(self.entry))
            threading.Thread(target=self._rejoin_thread, args=(entry,), daemon=True,
                             name="miniray-rejoin").start()

    def _send_heartbeat(self, now: float) -> None:
        available = self._available()
        self._hb_seq += 1
        try:
            _send(self._link, ("hb", self._hb_seq, self.entry.incarnation, available))
        except (OSError, pc.PeerClosed) as error:
            self._lost_head(f"sending failed: {error}")
            return
        self._sent_available = available
        self._hb_last_sent = now
        self._hb_next = now + self.heartbeat_s

    def _rejoin_thread(self, entry: NodeEntry) -> None:
        try:
            channel, snapshot = join_head(self.head, self.token, entry,
                                          ssl_context=self._tls[0] if self._tls else None)
        except (OSError, TimeoutError, ConnectionError) as error:
            self._inbox.put(("join_failed", str(error)))
        else:
            self._inbox.put(("joined", (channel, snapshot, entry.incarnation)))
        self._wake()

    def _on_rejoined(self, item, now: float) -> None:
        channel, snapshot, incarnation = item
        self._connecting = False
        if self._closed or incarnation != self.entry.incarnation:
            channel.close()  # stale attempt (we were declared dead meanwhile)
            self._retry_at = now
            return
        self._head_version = -1  # perhaps a new head: its versions start again
        self._take_view(snapshot)
        self._watch_link(channel)
        self._state = "linked"
        self.drivers.resume()  # fenced (if it was) and rejoined: remote drivers again
        self._retry_at = None
        self._retry_wait = RETRY_MIN_S
        self.view.version += 1
        logger.info("rejoined the head at %s (incarnation %d)", self._head_name(), incarnation)

    # -- publishing ------------------------------------------------------------------------
    def _publish(self) -> None:
        self._published = self.view.version
        self._published_at = time.monotonic()
        doc = {"view": self.view.snapshot(), "local": self.entry.node_id,
               "head": (self.entry.address if self.is_head else self._head_name()),
               "is_head": self.is_head, "linked": self.is_head or self._state == "linked",
               "updated_at": time.time()}
        if self.is_head:  # the view's clock now: last_heartbeat ages (miniray status)
            doc["clock"] = self._published_at
        try:
            _write_cluster(self.cluster_path, doc)
        except OSError as error:
            logger.warning("publishing the cluster view to %s failed: %s", self.cluster_path,
                           error)

    def statistics(self) -> dict:
        return {"is_head": self.is_head, "state": "head" if self.is_head else self._state,
                "members": len(self._members), "alive": len(self.view.alive()),
                "dead": len(self.view.dead()), "handshakes": self._gate.statistics(),
                "remote_drivers": self.drivers.statistics()}

