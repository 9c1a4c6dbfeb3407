"""A TLS connection's plaintext on a local socket, so that another process can own it.

Owns: relaying one TLS connection (``TlsRelay``): a socketpair, one end given away (its
fd: to the fork server and a remote driver's worker, or to a driver's output reader), the
other end and the TLS socket served by one thread of this process that copies the
decrypted bytes both ways until either side closes, then closes both. Does not own: the
TLS and token handshakes, the frames, or the frame state that goes with the fd
(``peer_channel.PeerChannel.handover``, its only caller, for a TLS channel).
Called by: ``PeerChannel.handover`` (a node's ``NodeServer._remote_spawn``: a remote
worker's four attach connections; a driver's ``remote_nodes._Worker``: that worker's
stdout and stderr).

Why a relay: a TLS session (its keys, record sequence numbers and buffered records) lives
in the OpenSSL object of the process that made the handshake; the fd of an
``ssl.SSLSocket`` handed to another process carries ciphertext that process cannot read
or write. Two ways were weighed:

a) the worker makes the TLS handshake itself on a raw fd its node hands it before any TLS
   byte is read (a plaintext ticket first on the node's port, then TLS and the token
   handshake in the worker). Every worker would then need this host's private key and the
   cluster token, the node's port would speak a second protocol before TLS, and the ticket
   would cross the network in the clear.
b) (this module) the process that made the handshake keeps the session and relays the
   plaintext over a socketpair: nothing changes on the wire or in the worker (its frames,
   MAC'd with the keys ``handover`` gives it, cross the socketpair as they would cross the
   TCP socket), every connection stays TLS-wrapped and token-authenticated by the node's
   handshake gate, and the same code serves the driver's output streams. The cost is one
   more copy and a thread per relayed connection (four per remote worker on its node, two
   on its driver); README's "Between hosts" has the measurement.

Steps of one relay::

    1. ``start(tls_sock)``: a SOCK_STREAM socketpair; the caller gets one end's fd (it
       owns it: pass it on, then close it); the thread takes the other end and the TLS
       socket, both non-blocking, and owns both from then on.
    2. Loop: decrypted bytes read from TLS are written to the local end, bytes read from
       the local end are written to TLS, at most BUFFER_BYTES held per direction (a side
       that does not read stops the other side's reads: back pressure, no unbounded
       buffer). One poll waits for whatever lets either direction go on.
    3. EOF or an error on one side: what is held for the other side is still written (the
       worker's last frames before it exits), for at most DRAIN_S; then both sockets are
       closed, so the other side sees EOF. Nothing else ends a relay: on a node, a
       worker's exit (or the node's SIGKILL of it) closes the local side and a driver
       that leaves closes the TLS side; on a driver, the worker's node closes the TLS
       side when the worker is gone.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import threading
import time

__all__ = ["BUFFER_BYTES", "TlsRelay", "live", "start"]

logger = logging.getLogger(__name__)

CHUNK = 1 << 18
BUFFER_BYTES = 1 << 20  # held per direction at most (step 2)
DRAIN_S = 10.0  # step 3: what is held is written within this, or dropped
_WANT = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

_live: set = set()
_live_lock = threading.Lock()


def live() -> int:
    """How many relays of this process are running (status and tests)."""
    with _live_lock:
        return len(_live)


class TlsRelay:
    """One relayed TLS connection (see the module docstring); made by ``start``."""

    def __init__(self, tls_sock: ssl.SSLSocket, local: socket.socket, name: str = ""):
        self._tls = tls_sock
        self._local = local
        self.name = name
        self.to_local = 0  # bytes relayed each way, for tests and status
        self.to_tls = 0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"miniray-tls-relay {name}")

    def __repr__(self) -> str:
        return f"<TlsRelay {self.name} to_local={self.to_local} to_tls={self.to_tls}>"

    def _run(self) -> None:
        try:
            self._relay()
        except Exception:  # noqa: BLE001 - a relay's failure closes its connection only
            logger.exception("the TLS relay of %s failed; its connection is closed", self.name)
        finally:
            for sock in (self._tls, self._local):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            with _live_lock:
                _live.discard(self)

    def _relay(self) -> None:
        """Steps 2-3."""
        tls, local = self._tls, self._local
        tls.setblocking(False)
        local.setblocking(False)
        to_local = bytearray()  # decrypted, not yet written to the local end
        to_tls = b""  # read from the local end, not yet written to TLS (kept as it is
        # until written: OpenSSL wants a retried write to carry the same bytes)
        tls_open = local_open = True
        drain_until: float | None = None
        poller = select.poll()
        while True:
            moved = True
            while moved:
                moved = False
                # A TLS read gives about one record (16 KiB at most): gather what is there
                # first, so that the local end gets it in few writes.
                while tls_open and local_open and len(to_local) < BUFFER_BYTES:
                    try:
                        data = tls.recv(CHUNK)
                    except _WANT:
                        break
                    except (OSError, ValueError):
                        tls_open = False
                        break
                    if not data:
                        tls_open = False
                        break
                    to_local += data
                    moved = True
                if to_local and local_open:
                    try:
                        n = local.send(to_local)
                    except _WANT:
                        pass
                    except (OSError, ValueError):
                        local_open = False
                    else:
                        del to_local[:n]
                        self.to_local += n
                        moved = True
                if not to_tls and local_open and tls_open:
                    try:
                        data = local.recv(CHUNK)
                    except _WANT:
                        pass
                    except (OSError, ValueError):
                        local_open = False
                    else:
                        if data:
                            to_tls = data
                            moved = True
                        else:
                            local_open = False
                if to_tls and tls_open:
                    try:
                        n = tls.send(to_tls)
                    except _WANT:
                        pass
                    except (OSError, ValueError):
                        tls_open = False
                    else:
                        to_tls = to_tls[n:]
                        self.to_tls += n
                        moved = True
            if not tls_open:
                to_tls = b""  # nobody to write it to
            if not local_open:
                to_local.clear()
            if (not tls_open or not local_open) and not to_local and not to_tls:
                return  # step 3: one side is gone and the other has everything
            now = time.monotonic()
            if not tls_open or not local_open:
                if drain_until is None:
                    drain_until = now + DRAIN_S
                elif now >= drain_until:
                    logger.warning("the TLS relay of %s dropped %d byte(s) its peer did "
                                   "not read within %g s of the other side's close",
                                   self.name, len(to_local) + len(to_tls), DRAIN_S)
                    return
            tls_events = local_events = 0
            if tls_open:
                if local_open and len(to_local) < BUFFER_BYTES:
                    tls_events |= select.POLLIN
                if to_tls:
                    tls_events |= select.POLLOUT
            if local_open:
                if tls_open and not to_tls:
                    local_events |= select.POLLIN
                if to_local:
                    local_events |= select.POLLOUT
            for sock, events in ((tls, tls_events), (local, local_events)):
                try:
                    poller.unregister(sock)
                except (KeyError, ValueError):
                    pass
                if events:
                    poller.register(sock, events)
            wait_ms = None if drain_until is None else max(1, int((drain_until - now) * 1000))
            poller.poll(wait_ms)


def start(tls_sock: ssl.SSLSocket, name: str = "") -> tuple[int, TlsRelay]:
    """Step 1: relay ``tls_sock`` (the relay owns it from now on); returns the fd of the
    local end to give away (the caller owns it) and the relay."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    relay = TlsRelay(tls_sock, mine, name)
    with _live_lock:
        _live.add(relay)
    try:
        relay._thread.start()
    except BaseException:
        with _live_lock:
            _live.discard(relay)
        mine.close()
        theirs.close()
        raise
    return theirs.detach(), relay
