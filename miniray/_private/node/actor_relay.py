"""The head's relay from drivers on other hosts to its actor service (role ``actors``).

Owns: the ``actors`` channels that drivers joined to member nodes open on the head's port
(accepted by ``peering.py`` on a head only, after the token and versions passed), one AF_UNIX
connection to the head's ``<session>/actors.sock`` per channel, and the two threads that copy
frames between them unchanged (each frame is one pickled message of the actor service's
protocol, ``core/protocol.py`` section 5). Does not own: the handshake and MAC'd frames
(``transport/peer_channel.py``), what the messages mean (``actor_service.py``), or the
driver's side (``owner/actor_link.py``).
Called by: ``peering.Peering`` (``add`` from its loop, ``close`` when the node stops).

Steps, driver D on a member host, head H::

    1. D connects to H's port twice (control, calls) with role "actors" (peer_channel's
       steps 1-7: the cluster token, MAC'd frames). A member node refuses the role, naming
       its head.
    2. H connects each channel to its actor service's socket (waiting up to
       ``SERVICE_WAIT_S`` for it to appear); it cannot: the channel is closed (D's request
       fails, naming the head).
    3. Two threads per channel: frames from D go to the service as they are, frames from
       the service go to D, each MAC'd. D's HELLO names no store directory: the service
       then sends every large value as bytes, never as a segment path.
    4. Either side closing (EOF, a broken or forged frame, ``close``) closes both: the
       service sees the driver leave as if it were local (its non-detached actors end).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

from miniray._private.transport import node_client as nc
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.framing import FramedSocket

__all__ = ["ROLE_ACTORS", "ActorRelay"]

logger = logging.getLogger(__name__)

ROLE_ACTORS = "actors"
SERVICE_SOCKET = "actors.sock"  # owner/actor_link.py's SOCKET_NAME (a lower layer cannot import it)
SERVICE_WAIT_S = 10.0
SEND_TIMEOUT_S = 30.0  # a driver that stops reading for this long is dropped


class _Pipe:
    """One relayed channel: the driver's MAC'd channel and the service's socket."""

    def __init__(self, channel: pc.PeerChannel, sock: socket.socket, relay: ActorRelay):
        self.channel = channel
        self.conn = FramedSocket(sock)
        self.relay = relay
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        for target, name in ((self._up, "up"), (self._down, "down")):
            threading.Thread(target=target, daemon=True,
                             name=f"miniray-actor-relay-{name}").start()

    def _up(self) -> None:
        """Driver -> service."""
        try:
            while True:
                self.conn.send(bytes(self.channel.recv_bytes()))
        except (OSError, EOFError, ValueError):
            pass
        self.close()

    def _down(self) -> None:
        """Service -> driver."""
        try:
            while True:
                for frame in self.conn.recv():
                    self.channel.send_bytes(frame)
        except (OSError, EOFError, ValueError):
            pass
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.relay._forget(self)
        self.channel.close()
        with contextlib.suppress(OSError):
            self.conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread reading it
        with contextlib.suppress(OSError):
            self.conn.sock.close()


class ActorRelay:
    """The head's relays (see the module docstring)."""

    def __init__(self, session_dir: str):
        self.path = os.path.join(session_dir, SERVICE_SOCKET)
        self._lock = threading.Lock()
        self._pipes: set[_Pipe] = set()
        self._closed = False

    def add(self, channel: pc.PeerChannel) -> None:
        """Step 2, in a thread (the service may be starting): never blocks the loop."""
        threading.Thread(target=self._open, args=(channel,), daemon=True,
                         name="miniray-actor-relay-open").start()

    def _open(self, channel: pc.PeerChannel) -> None:
        deadline = time.monotonic() + SERVICE_WAIT_S
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with nc.sun_path(self.path) as name:
                    sock.connect(name)
                break
            except OSError as error:
                sock.close()
                if self._closed or time.monotonic() >= deadline:
                    logger.warning("a driver at %s asked for the actor service, which is "
                                   "not running (%s); closing its link", channel.address,
                                   error)
                    channel.close()
                    return
                time.sleep(0.05)
        channel.setblocking(True)
        channel.set_send_timeout(SEND_TIMEOUT_S)
        pipe = _Pipe(channel, sock, self)
        with self._lock:
            if self._closed:
                pipe.close()
                return
            self._pipes.add(pipe)
        pipe.start()

    def _forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self._pipes.discard(pipe)

    def close(self) -> None:
        """Close every relayed channel (their drivers' proxies fail: the head stops)."""
        with self._lock:
            self._closed = True
            pipes = list(self._pipes)
            self._pipes.clear()
        for pipe in pipes:
            pipe.close()

    def __len__(self) -> int:
        return len(self._pipes)
