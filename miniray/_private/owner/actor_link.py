"""A driver's connection to the actor service, where named and detached actors live.

Owns: the two sockets to ``<session>/actors.sock`` and what travels on them (each checked
with SO_PEERCRED before anything is sent or read: the service must run as this uid); for a
driver of a member node, the two ``actors`` channels to the head's port instead (the head's
service holds the cluster's names: ``node/actor_service.py`` steps 1-5), and turning values
in shared memory into bytes and back for them (``pack_value``, ``unpack_value``). Does not
own: the proxies (``actors.ActorManager`` keeps one ``_Actor`` per service actor,
``actor_service_proxies.py``, and calls this link), or the service itself (``actor_service.py``).
Called by: ``actors.ActorManager``. Requests (create, lookup, list, kill) and connecting are
made *without* the owner's lock (they wait for the service); the calls socket is used with
it held (it never blocks: calls made before the link is connected wait in an outbox while a
deferred connect runs after the lock is released).

Tags and layouts: ``core/protocol.py`` section 5 (``SVC_*``)::

    control socket: request ─► reply, blocking, one at a time (CREATE, LOOKUP, LIST, KILL),
                    never with the owner's lock held
    calls socket:   CALL / OBJECT / CANCEL / HOLD / RELEASE ─► (never blocks: an outbox
                    flushed by the owner's I/O thread) ◄─ RESULT / OUTPUT / IMPORTED (read by
                    the I/O thread)

Two sockets, because a request can come from the I/O thread itself (a worker's ``get_actor``),
which must not wait for a reply only it could read. The service answers a request at once; it
never waits for this driver, so a blocking request cannot deadlock.

Both sockets are opened on first use. The node starts its actor service right after it starts
listening, so the first use waits up to ``CONNECT_TIMEOUT_S`` for the socket to appear. If the
service dies, every proxy's calls fail with ActorDiedError; the node starts a new service, and
the next creation or lookup connects to it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import threading
import time

from miniray._private.core import protocol, serialization
from miniray._private.host import auth_token, same_uid
from miniray._private.object_store.shm_segments import resolve_path, segment_name, unlink_quiet
from miniray._private.owner import output
from miniray._private.owner.object_table import PENDING
from miniray._private.transport import node_client, peer_channel, peer_handshake
from miniray._private.transport.framing import FramedSocket
from miniray._private.transport.node_client import sun_path

__all__ = ["ActorLink", "COPY", "ServiceUnavailable", "SOCKET_NAME", "pack_value",
           "unpack_value"]

SOCKET_NAME = "actors.sock"
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0  # Ray's GCS request timeout
SEND_TIMEOUT_S = 10.0  # a write to the head's relay that waits longer loses the link
ROLE_ACTORS = "actors"  # node/actor_relay.py's role on the head's port


COPY = "copy"  # a value in shared memory, as it crosses hosts: ("copy", bytes, size)


class ServiceUnavailable(RuntimeError):
    """The node's actor service cannot be reached."""


def pack_value(payload, shm_dir: str):
    """A payload as it goes to another host: a segment (or spilled file) of the store in
    ``shm_dir`` becomes ``("copy", its bytes, size)``; other payloads are unchanged."""
    if not isinstance(payload, tuple) or payload[0] == COPY:
        return payload
    _where, name, size = payload
    with open(resolve_path(name, shm_dir), "rb") as f:
        return (COPY, f.read(size), size)


def unpack_value(payload, shm_dir: str, tag: str):
    """A payload that came from another host: ``("copy", bytes, size)`` is written into a
    new segment of the store of session ``tag`` in ``shm_dir`` (which adopts it: the name
    is random) and becomes ``("shm", path, size)``; other payloads are unchanged."""
    if not (isinstance(payload, tuple) and payload[0] == COPY):
        return payload
    _copy, data, size = payload
    dst = os.path.join(shm_dir, segment_name(tag, os.urandom(28)))
    fd = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        unlink_quiet(dst)
        raise
    finally:
        os.close(fd)
    return ("shm", dst, size)


class _Forward:
    """Waits for an object the service needs (see ``ActorLink.forward_when_ready``)."""

    __slots__ = ("link",)

    def __init__(self, link):
        self.link = link

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.link._forward(object_id)


class _PeerConn(peer_channel.FramedPeer):
    """A MAC'd channel to the head (relayed to its actor service) behind the part of
    ``FramedSocket``'s interface this link and the reactor use (``FramedPeer``'s, a read
    waiting at most ``REQUEST_TIMEOUT_S``, and an outbox). ``flush`` writes at once,
    blocking at most ``SEND_TIMEOUT_S`` (messages here are small or, across hosts, values
    the caller already holds in memory)."""

    __slots__ = ("outbox",)
    RECV_TIMEOUT_S = REQUEST_TIMEOUT_S

    def __init__(self, channel):
        super().__init__(channel)
        channel.set_send_timeout(SEND_TIMEOUT_S)
        self.outbox: list = []

    def queue(self, data) -> None:
        self.outbox.append(data)

    def flush(self) -> bool:
        outbox, self.outbox = self.outbox, []
        for data in outbox:
            self.channel.send_bytes(data)
        return True


class ActorLink:
    """Given at construction: its owner (used only through ``actors.ActorsOwner``) and the
    service's socket path."""

    def __init__(self, owner, path: str):
        self.owner = owner
        self.path = path
        self.token = os.urandom(8).hex()
        self._control: FramedSocket | None = None
        self._calls: FramedSocket | None = None
        self._lost: str | None = None
        self._closed = False
        self.leaving = threading.Event()  # set by ``close``: this driver shuts down
        self._forwarding: dict[bytes, int] = {}  # objects sent later, held until imported
        # One request at a time on the control socket, and one connect: taken without the
        # owner's lock (never the other way round, so the two cannot deadlock).
        self._control_lock = threading.Lock()
        self._outbox: list = []  # (actor_id, spec, exported) of calls made before connecting
        self._remote: tuple[str, int] | None = None  # the head's address, when connected there
        self._connecting = False  # *Locked.* a deferred connect for the outbox is on its way

    # -- connecting ------------------------------------------------------------------------
    def _connect(self) -> None:
        """*Not locked*; ``_control_lock`` held. Connect both sockets (waiting up to
        ``CONNECT_TIMEOUT_S`` for the service) and send the calls made meanwhile. A driver
        of a member node connects to the head's service instead (``_connect_head``)."""
        if self._control is not None:
            return
        if self._closed:
            raise ServiceUnavailable("this driver's session was shut down")
        head = self._head_address()
        if head is not None:
            self._remote = head
            control, calls = self._connect_head(head)
        else:
            self._remote = None
            control, calls = self._connect_local()
        store = self.owner.store
        shm_dir = "" if head is not None else store.shm_dir  # "": send values, not paths
        info = self.owner.hello_info  # its node and IP: results kept elsewhere are
        where = (info.get("node_id") or "", info.get("node_ip") or "127.0.0.1")  # granted
        hello = (os.getpid(), self.token, store.session_tag, shm_dir,
                 info.get("sys_path", []), os.getcwd(), where)
        try:
            control.send(pickle.dumps((protocol.SVC_HELLO, "control") + hello, 5))
            calls.send(pickle.dumps((protocol.SVC_HELLO, "calls") + hello, 5))
            self._reply(control)
        except (OSError, EOFError) as error:
            control.close()
            calls.close()
            raise ServiceUnavailable(
                f"The {self._where()} actor service did not answer ({error}).") from None
        with self.owner.locked():
            if self._closed:  # the session shut down while this connected
                control.close()
                calls.close()
                raise ServiceUnavailable("this driver's session was shut down")
            self._control, self._calls = control, calls
            self.owner.reactor.register(calls.fd, self._on_readable)
            outbox, self._outbox = self._outbox, []
            for actor_id, spec, exported in outbox:
                self.send((protocol.SVC_CALL, actor_id, spec, exported))

    def _head_address(self) -> tuple[str, int] | None:
        """The head's ``(ip, port)`` when this driver's node is a member of a cluster (its
        published view says so), else None: the node's own service."""
        doc = node_client.read_cluster(os.path.dirname(self.path))
        if not doc or doc.get("is_head", True) or not doc.get("head"):
            return None
        host, _, port = str(doc["head"]).rpartition(":")
        return host, int(port)

    def on_another_host(self) -> bool:
        """*Not locked* (a file read). Whether the service is the head's, on another host."""
        return self._head_address() is not None

    def _where(self) -> str:
        return (f"head's ({self._remote[0]}:{self._remote[1]})" if self._remote
                else "node's")

    def _connect_local(self) -> tuple[FramedSocket, FramedSocket]:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            socks = []
            try:
                for _ in range(2):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    socks.append(sock)
                    sock.settimeout(REQUEST_TIMEOUT_S)
                    with sun_path(self.path) as name:
                        sock.connect(name)
                break
            except (FileNotFoundError, ConnectionRefusedError) as error:
                for sock in socks:
                    sock.close()
                if time.monotonic() >= deadline:
                    raise ServiceUnavailable(
                        f"The node's actor service is not running ({self.path}: {error}), so "
                        "named and detached actors are unavailable. Restart the node with "
                        "`miniray stop` and `miniray start --head`.") from None
                time.sleep(0.05)
        try:  # before a byte is sent or read: whoever listens there must be this user
            for sock in socks:
                same_uid.require_same_uid_peer(sock, self.path)
        except (ConnectionRefusedError, OSError) as error:
            for sock in socks:
                sock.close()
            raise ServiceUnavailable(f"The node's actor service cannot be trusted: {error}") \
                from None
        control, calls = (FramedSocket(s) for s in socks)
        for conn in (control, calls):
            conn.sock.settimeout(REQUEST_TIMEOUT_S)
        calls.sock.setblocking(True)
        return control, calls

    def _connect_head(self, head: tuple[str, int]) -> tuple[_PeerConn, _PeerConn]:
        """Two ``actors`` channels to the head's port (the cluster token, MAC'd frames),
        which the head relays to its actor service (``node/actor_relay.py``). Each connect
        waits at most ``CONNECT_TIMEOUT_S``."""
        contexts = peer_handshake.tls_contexts()
        source = self.owner.hello_info.get("node_ip") or None
        channels = []
        try:
            token = auth_token.load_token()
            for _ in range(2):
                channels.append(peer_handshake.connect(
                    head, token, ROLE_ACTORS, hello={"pid": os.getpid()},
                    timeout=CONNECT_TIMEOUT_S, ssl_context=contexts[0] if contexts else None,
                    source_address=(source, 0) if source else None))
        except (OSError, auth_token.AuthTokenError) as error:
            for channel in channels:
                channel.close()
            raise ServiceUnavailable(
                f"The head at {head[0]}:{head[1]}, whose actor service holds the cluster's "
                f"named and detached actors, cannot be reached ({error}). Check that the "
                "head runs (`miniray status`) and that this node is joined to it.") from None
        return _PeerConn(channels[0]), _PeerConn(channels[1])

    @staticmethod
    def _reply(conn: FramedSocket):
        frames = conn.recv()
        status, value = pickle.loads(frames[0])
        if status == protocol.SVC_ERR:
            raise serialization.loads(value)
        return value

    def _request(self, message: tuple, timeout: float | None = None):
        """*Not locked.* Send one request on the control socket and wait for its reply, at
        most ``REQUEST_TIMEOUT_S`` (the socket's timeout; ``timeout``, shorter, for a
        request made while this driver shuts down, on the node's own socket): past it,
        ServiceUnavailable names the request, and the link is closed (a late answer could
        not be told from the next request's); the next request opens a new one."""
        with self._control_lock:
            self._connect()
            control = self._control
            sock = getattr(control, "sock", None)  # the node's socket (not the head's)
            waited = REQUEST_TIMEOUT_S
            try:
                if control is None:
                    raise OSError("the link was closed")
                if timeout is not None and sock is not None:
                    waited = max(0.001, min(timeout, REQUEST_TIMEOUT_S))
                    sock.settimeout(waited)
                control.send(pickle.dumps(message, 5))
                return self._reply(control)
            except (TimeoutError, socket.timeout):  # one class from Python 3.10 on
                what = protocol.tag_name("actor_service", message[0])
                why = (f"the {self._where()} actor service did not answer {what} within "
                       f"{waited:g} s")
                with self.owner.locked():
                    if self._control is control:
                        self._gone(why)
                raise ServiceUnavailable(
                    f"{why}; this driver closed its link to it (the next request opens a "
                    "new one). Check that the node runs (`miniray status`) and its log "
                    "(<session>/node.log).") from None
            except (OSError, EOFError) as error:
                with self.owner.locked():
                    if self._control is control:
                        self._gone(f"the {self._where()} actor service stopped answering "
                                   f"({error})")
                raise ServiceUnavailable(self._lost or str(error)) from None
            finally:
                if waited != REQUEST_TIMEOUT_S and self._control is control:
                    with contextlib.suppress(OSError):
                        sock.settimeout(REQUEST_TIMEOUT_S)

    # -- requests (owner lock NOT held: each waits for the service's reply) ----------------
    def create(self, spec, exported) -> tuple[bytes, tuple]:
        """``exported``: ``[(id, kind, payload)]`` of the objects of every ObjectRef in the
        constructor's arguments; kind and payload None for one not ready yet, which
        ``forward_when_ready`` sends later."""
        actor_id, state, warning = self._request((protocol.SVC_CREATE, spec,
                                                   self._values(exported)))
        if warning:  # it can never be placed: say so here, as for an actor of this driver
            print(warning, file=sys.stderr, flush=True)
        return actor_id, state

    def lookup(self, name: str, namespace: str) -> tuple[bytes, tuple]:
        return self._request((protocol.SVC_LOOKUP, name, namespace))

    def named(self, namespace: str, all_namespaces: bool) -> list:
        return self._request((protocol.SVC_LIST, namespace, all_namespaces))

    def kill(self, actor_id: bytes, no_restart: bool, group: str = "") -> None:
        self._request((protocol.SVC_KILL, actor_id, no_restart, group))

    # -- the calls socket (owner lock held) ----------------------------------------------------
    def call(self, actor_id: bytes, spec, exported) -> None:
        """*Locked.* Send a call to a service actor; before the link is connected (a handle
        that came from elsewhere), it waits in the outbox for a connect that runs once the
        owner's lock is released."""
        if self._calls is not None:
            self.send((protocol.SVC_CALL, actor_id, spec, exported))
            return
        self._outbox.append((actor_id, spec, exported))
        if not self._connecting:
            self._connecting = True
            self.owner.defer(self._connect_for_calls)

    def _connect_for_calls(self) -> None:
        """*Not locked.* Connect for the calls in the outbox; if the service cannot be
        reached, they fail with ActorDiedError."""
        error = None
        try:
            with self._control_lock:
                self._connect()
        except ServiceUnavailable as unavailable:
            error = unavailable
        with self.owner.locked():
            self._connecting = False
            if error is None:
                return
            outbox, self._outbox = self._outbox, []
            from miniray.exceptions import ActorDiedError

            for actor_id, spec, _exported in outbox:
                data = serialization.dumps(ActorDiedError(actor_id=actor_id.hex(),
                                                          error_msg=str(error)))
                self.owner.actors.on_remote_result(
                    spec.task_id, [(protocol.ERR, data)] * max(1, spec.num_returns))

    def forward_when_ready(self, object_id: bytes) -> None:
        """*Locked.* Send this object to the service once it is ready (an argument of an
        actor created there); it stays held here until the service has it."""
        objects = self.owner.objects
        entry = objects.get(object_id)
        if entry is None:
            return  # lost: the service's actor fails when it reads it
        objects.hold([object_id])
        self._forwarding[object_id] = self._forwarding.get(object_id, 0) + 1
        if entry.state == PENDING:
            entry.add_waiter(_Forward(self))
        else:  # it became ready while the creation request was out (made without the lock)
            self._forward(object_id)

    def _forward(self, object_id: bytes) -> None:
        self.send((protocol.SVC_OBJECT,) + tuple(self.owner.actors.export([object_id])[0]))

    def _forwarded(self, object_id: bytes) -> None:
        """The service has it (or is gone): let it go here."""
        count = self._forwarding.pop(object_id, 0)
        if count > 1:
            self._forwarding[object_id] = count - 1
        if count:
            self.owner.requests.unpin_ids([object_id])
            self.owner.objects.release([object_id])

    def cancel(self, task_id: bytes, force: bool, recursive: bool) -> None:
        self.send((protocol.SVC_CANCEL, task_id, force, recursive))

    def hold(self, actor_id: bytes, held: bool) -> None:
        """This driver holds a handle to the actor (or no longer does): the service ends a
        non-detached actor when no driver holds it."""
        self.send((protocol.SVC_HOLD if held else protocol.SVC_RELEASE, actor_id))

    def _values(self, items):
        """``[(..., payload)]`` as sent: to the head's service (another host), a value in
        this driver's shared memory goes as its bytes (``pack_value``), not as a path."""
        if self._remote is None or not items:
            return items
        shm_dir = self.owner.store.shm_dir
        return [tuple(item[:-1]) + (pack_value(item[-1], shm_dir),) for item in items]

    def _received(self, payload):
        """*Locked.* A value from the head's service, in this driver's store."""
        store = self.owner.store
        return unpack_value(payload, store.shm_dir, store.session_tag)

    def send(self, message: tuple) -> None:
        calls = self._calls
        if calls is None:
            return
        if self._remote is not None:
            if message[0] == protocol.SVC_CALL:
                spec = message[2]
                spec.payloads = self._values(spec.payloads)
                message = message[:3] + (self._values(message[3]),)
            elif message[0] == protocol.SVC_OBJECT:
                message = (message[0],) + self._values([message[1:4]])[0]
        try:
            self.owner.reactor.send(calls, pickle.dumps(message, 5), self._on_writable)
        except OSError as error:
            self._gone(f"the {self._where()} actor service is gone ({error})")

    def _on_writable(self, fd: int) -> None:
        with self.owner.locked():
            calls = self._calls
            self.owner.reactor.flush(fd, calls if calls is not None and calls.fd == fd else None)

    def _on_readable(self, fd: int) -> None:
        calls = self._calls
        if calls is None or calls.fd != fd:
            return
        frames, closed = calls.recv_ready()
        with self.owner.locked():
            for frame in frames:
                message = pickle.loads(frame)
                if message[0] == protocol.SVC_RESULT:
                    results, nested = message[2], message[3]
                    if self._remote is not None:
                        results = [(kind, self._received(data)) for kind, data in results]
                        nested = [(index, [(i, k, self._received(p)) for i, k, p in items])
                                  for index, items in nested or ()]
                    self.owner.actors.on_remote_result(message[1], results, nested)
                elif message[0] == protocol.SVC_YIELD:
                    task_id, index, kind, data, nested = message[1:6]
                    if self._remote is not None:
                        data = self._received(data)
                        nested = [(i, k, self._received(p)) for i, k, p in nested]
                    self._yielded(task_id, index, kind, data, nested)
                elif message[0] == protocol.SVC_OUTPUT:
                    self._print(message[1], message[2])
                elif message[0] == protocol.SVC_IMPORTED:
                    self._forwarded(message[1])
            if closed and self._calls is calls:
                self._gone(f"the {self._where()} actor service exited")

    def _yielded(self, task_id: bytes, index: int, kind: int, data, nested) -> None:
        """*Locked.* A value of a streaming call of a proxy; the objects of refs inside it
        become this driver's and live as long as the value."""
        objects = self.owner.objects
        for object_id, inner_kind, payload in nested:
            if objects.get(object_id) is None:
                objects.set_ready(object_id, inner_kind, payload)
            else:
                self.discard(payload)  # already here (it came from this driver)
        self.owner.streams.on_item(task_id, index, kind, data, [i for i, _k, _p in nested])
        for object_id, _kind, _payload in nested:  # held by a value nobody kept: they go
            entry = objects.get(object_id)
            if entry is not None and entry.holders <= 0:
                objects.maybe_free(object_id, entry)

    @staticmethod
    def discard(payload) -> None:
        """A copy the service made in this driver's store that nobody will adopt."""
        if isinstance(payload, tuple):
            unlink_quiet(payload[1])

    def _print(self, target: str, text: str) -> None:
        """Output of an actor this driver created (already prefixed with its name and pid)."""
        if not self.owner.log_to_driver:
            return
        output.deliver(target, text)  # bars in it go to the progress display

    def _gone(self, why: str) -> None:
        """*Locked.* The service is unreachable: every proxy's pending calls fail."""
        if not self._closed:
            self._lost = f"{why}; the named and detached actors that lived there are gone."
        self._close_sockets()
        for object_id in list(self._forwarding):
            while object_id in self._forwarding:
                self._forwarded(object_id)
        if not self._closed:
            from miniray.exceptions import ActorDiedError

            self.owner.actors.on_link_lost(serialization.dumps(
                ActorDiedError(error_msg=f"The actor died: {self._lost}")))

    def _close_sockets(self) -> None:
        for conn in (self._calls, self._control):
            if conn is None:
                continue
            if conn is self._calls:
                self.owner.reactor.unregister(conn.fd)
            with contextlib.suppress(OSError):
                conn.close()
        self._calls = self._control = None

    def connected(self) -> bool:
        """Whether the link is up now (a request would not have to connect first)."""
        return self._control is not None

    def close(self) -> None:
        """*Locked.* This driver leaves: the service ends its non-detached actors; the
        threads that wait to ask the service again end (``leaving``)."""
        self._closed = True
        self.leaving.set()
        self._close_sockets()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "lost" if self._lost else (
            "connected" if self._control is not None else "idle")
        return f"<ActorLink {self.path} {state}>"
