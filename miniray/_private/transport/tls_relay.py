"""A TLS connection's plaintext on a local socket, so that another process can own it;
also a remote worker's output copied to its node's log file on the way.

Owns: relaying TLS connections (``TlsRelay``): per connection a socketpair, one end given
away (its fd: to the fork server and a remote driver's worker, or to a driver's output
reader), the other end and the TLS socket served by this process's one relay thread
(``_Loop``: one selector for every relay, started by the first relay, ending with the
last), which copies the decrypted bytes both ways until either side closes, then closes
both. A relay with a ``tee`` (a remote driver's worker's stdout or stderr on its node,
TLS or plain TCP alike) also hands each chunk it reads from the local end to the tee
(``worker_logs.LogTee``: the worker's log file in the node's session). Does not own: the
TLS and token handshakes, the frames, or the frame state that goes with the fd
(``peer_channel.PeerChannel.handover``, its only caller, for a TLS channel or a tee'd one),
nor the log file (``host/worker_logs.py``).
Called by: ``PeerChannel.handover`` (a node's ``NodeServer._remote_spawn``: a remote
worker's four attach connections, stdout and stderr with a tee; a driver's
``remote_nodes._Worker``: that worker's stdout and stderr).

Why the node tees a remote worker's output (and not the worker): the worker's fds 1 and 2
stay plain stream sockets as before, so everything written there (C extensions and
subprocesses too) is kept, the worker never waits on a file (the node's relay thread
writes it), and what a worker printed just before a SIGKILL is in the file. The worker
holds no secret for it: the node's TLS session, or nothing (plain TCP), is on the other
side. The cost is output only: one more copy per printed byte through the node's relay
thread when TLS is off (with TLS on the relay was there already); the data and control
connections, the task path, are untouched. Memory: a relay holds at most one CHUNK read
from the worker and not yet sent; a driver that reads slowly stops the relay's reads, and
the worker then blocks on a full socket buffer, as it did writing to the TCP socket
itself: nothing is dropped and nothing grows. A log file that cannot be written (full
disk, session removed) is turned off; the driver still gets everything.

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
   more copy per byte and one thread per process for all its relays (a node relays four
   connections per remote worker, a driver two); README's "Between hosts" has the
   measurement.

Steps of one relay::

    1. ``start(tls_sock)``: a SOCK_STREAM socketpair; the caller gets one end's fd (it
       owns it: pass it on, then close it); the relay thread takes the other end and the
       TLS socket, both non-blocking, and owns both from then on (it is started here if
       no relay was running, and woken through its wake socketpair otherwise).
    2. Whenever a socket of the relay is ready: decrypted bytes read from TLS are written
       to the local end, bytes read from the local end are written to TLS, at most
       BUFFER_BYTES held per direction (a side that does not read stops the other side's
       reads: back pressure on that relay only, no unbounded buffer). TLS specifics: a
       TLS read returns one record at most, so reads go on until OpenSSL wants more
       bytes or the buffer is full (``SSLSocket.pending()`` is drained: the selector
       cannot see bytes OpenSSL already holds; with a full buffer they wait for the local
       end to take some, and a relay left with pending bytes and room is stepped again
       without waiting); a read may want the socket writable and a write readable (a TLS
       1.3 key update), and the selector waits for what OpenSSL asked; a write that
       wanted more is retried with the same bytes object. One relay moves at most
       STEP_ROUNDS rounds per turn, then the others get theirs.
    3. EOF or an error on one side: what is held for the other side is still written (the
       worker's last frames before it exits), for at most DRAIN_S; then both sockets are
       closed, so the other side sees EOF. Nothing else ends a relay: on a node, a
       worker's exit (or the node's SIGKILL of it) closes the local side and a driver
       that leaves closes the TLS side; on a driver, the worker's node closes the TLS
       side when the worker is gone. The thread ends when its last relay has ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import ssl
import threading
import time

__all__ = ["BUFFER_BYTES", "TlsRelay", "live", "start"]

logger = logging.getLogger(__name__)

CHUNK = 1 << 18
BUFFER_BYTES = 1 << 20  # held per direction at most (step 2)
DRAIN_S = 10.0  # step 3: what is held is written within this, or dropped
STEP_ROUNDS = 8  # step 2: rounds one relay moves before the others get a turn
_WANT = (BlockingIOError, InterruptedError)
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE

_live: set = set()  # every relay of this process not yet ended
_live_lock = threading.Lock()  # guards _live, _loop and each loop's _pending
_loop: _Loop | None = None  # the running relay thread, if any


def live() -> int:
    """How many relays of this process are running (status and tests)."""
    with _live_lock:
        return len(_live)


class TlsRelay:
    """One relayed TLS connection (see the module docstring); made by ``start``, moved
    only by the relay thread."""

    def __init__(self, tls_sock: ssl.SSLSocket | socket.socket, local: socket.socket,
                 name: str = "", tee=None):
        self._tls = tls_sock  # TLS, or a plain TCP socket when the relay is for its tee
        self._local = local
        self.name = name
        self.tee = tee  # given each chunk read from the local end (``worker_logs.LogTee``)
        self.to_local = 0  # bytes relayed each way, for tests and status
        self.to_tls = 0
        self._to_local = bytearray()  # decrypted, not yet written to the local end
        self._to_tls = b""  # read from the local end, not yet written to TLS (kept as it
        # is until written: OpenSSL wants a retried write to carry the same bytes)
        self._tls_open = self._local_open = True
        self._read_wants = _R  # what the last TLS read waits for (_W: a key update)
        self._write_wants = _W  # what the last TLS write waits for
        self.drain_until: float | None = None
        self.events: dict = {}  # socket -> events registered with the loop's selector

    def __repr__(self) -> str:
        return f"<TlsRelay {self.name} to_local={self.to_local} to_tls={self.to_tls}>"

    def step(self) -> bool:
        """Step 2 for this relay: move what can move without waiting, STEP_ROUNDS rounds at
        most. True when it could go on at once (its turn ended, or OpenSSL holds readable
        bytes the selector cannot see)."""
        tls, local = self._tls, self._local
        for _ in range(STEP_ROUNDS):
            moved = False
            # A TLS read gives about one record (16 KiB at most): gather what is there
            # first, so that the local end gets it in few writes.
            while self._tls_open and self._local_open and len(self._to_local) < BUFFER_BYTES:
                try:
                    data = tls.recv(min(CHUNK, BUFFER_BYTES - len(self._to_local)))
                except ssl.SSLWantReadError:
                    self._read_wants = _R
                    break
                except ssl.SSLWantWriteError:
                    self._read_wants = _W
                    break
                except _WANT:
                    self._read_wants = _R
                    break
                except (OSError, ValueError):
                    self._tls_open = False
                    break
                if not data:
                    self._tls_open = False
                    break
                self._to_local += data
                moved = True
            if self._to_local and self._local_open:
                try:
                    n = local.send(self._to_local)
                except _WANT:
                    pass
                except (OSError, ValueError):
                    self._local_open = False
                else:
                    del self._to_local[:n]
                    self.to_local += n
                    moved = True
            if not self._to_tls and self._local_open and self._tls_open:
                try:
                    data = local.recv(CHUNK)
                except _WANT:
                    pass
                except (OSError, ValueError):
                    self._local_open = False
                else:
                    if data:
                        self._to_tls = data
                        moved = True
                        if self.tee is not None:
                            self.tee.write(data)
                    else:
                        self._local_open = False
            if self._to_tls and self._tls_open:
                try:
                    n = tls.send(self._to_tls)
                except ssl.SSLWantReadError:
                    self._write_wants = _R
                except ssl.SSLWantWriteError:
                    self._write_wants = _W
                except _WANT:
                    self._write_wants = _W
                except (OSError, ValueError):
                    self._tls_open = False
                else:
                    self._to_tls = self._to_tls[n:]
                    self.to_tls += n
                    moved = True
            if not moved:
                break
        else:
            return True
        return bool(self._tls_open and self._local_open
                    and len(self._to_local) < BUFFER_BYTES and self._tls_pending())

    def _tls_pending(self) -> int:
        try:
            return self._tls.pending()
        except (OSError, ValueError, AttributeError):  # AttributeError: a plain socket
            return 0

    def done(self, now: float) -> bool:
        """Step 3: whether this relay has ended (both sockets are then to be closed)."""
        if not self._tls_open:
            self._to_tls = b""  # nobody to write it to
        if not self._local_open:
            self._to_local.clear()
        if self._tls_open and self._local_open:
            return False
        if not self._to_local and not self._to_tls:
            return True  # one side is gone and the other has everything
        if self.drain_until is None:
            self.drain_until = now + DRAIN_S
            return False
        if now >= self.drain_until:
            logger.warning("the TLS relay of %s dropped %d byte(s) its peer did not read "
                           "within %g s of the other side's close", self.name,
                           len(self._to_local) + len(self._to_tls), DRAIN_S)
            return True
        return False

    def wanted(self) -> tuple[int, int]:
        """The selector events (TLS socket, local end) that let this relay go on."""
        tls_events = local_events = 0
        if self._tls_open:
            if self._local_open and len(self._to_local) < BUFFER_BYTES:
                tls_events |= self._read_wants
            if self._to_tls:
                tls_events |= self._write_wants
        if self._local_open:
            if self._tls_open and not self._to_tls:
                local_events |= _R
            if self._to_local:
                local_events |= _W
        return tls_events, local_events

    def close(self) -> None:
        if self.tee is not None:
            self.tee.close()
        for sock in (self._tls, self._local):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class _Loop:
    """The relay thread of this process: one selector over every relay's two sockets and a
    wake socketpair through which ``start`` hands it new relays."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._pending: list[TlsRelay] = []  # given by start, not yet registered
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        try:
            for sock in (self._wake_r, self._wake_w):
                sock.setblocking(False)
            self._selector.register(self._wake_r, _R, None)
            self.thread = threading.Thread(target=self._run, daemon=True,
                                           name="miniray-tls-relay")
        except BaseException:
            self._close_own()
            raise

    def add(self, relay: TlsRelay) -> None:
        """Called under ``_live_lock``."""
        self._pending.append(relay)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is already due) or closed (the
            self._wake_w.send(b"\0")       # loop took the relay and has ended since)

    def _close_own(self) -> None:
        with contextlib.suppress(OSError):
            self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        relays: set[TlsRelay] = set()
        try:
            self._serve(relays)
        except Exception:  # noqa: BLE001 - the loop's failure ends its relays, reported
            logger.exception("the TLS relay thread failed; its %d connection(s) are closed",
                             len(relays))
            with _live_lock:
                relays.update(self._pending)
                self._pending.clear()
                global _loop
                if _loop is self:
                    _loop = None
            for relay in relays:
                self._end(relay)
        finally:
            self._close_own()

    def _end(self, relay: TlsRelay) -> None:
        for sock in list(relay.events):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(sock)
        relay.events.clear()
        relay.close()
        with _live_lock:
            _live.discard(relay)

    def _serve(self, relays: set[TlsRelay]) -> None:
        global _loop
        ready: set[TlsRelay] = set()  # to step whatever the selector says
        while True:
            with _live_lock:
                new, self._pending = self._pending, []
                if not new and not relays:
                    if _loop is self:
                        _loop = None
                    return  # the last relay has ended
            for relay in new:
                relay._tls.setblocking(False)
                relay._local.setblocking(False)
                relays.add(relay)
                ready.add(relay)
            now = time.monotonic()
            again: set[TlsRelay] = set()
            for relay in ready:
                if relay.step():
                    again.add(relay)
                if relay.done(now):
                    again.discard(relay)
                    relays.discard(relay)
                    self._end(relay)
                    continue
                self._register(relay)
            if not relays:
                ready = set()
                continue  # the last one has ended: end the thread unless one is new
            deadlines = [r.drain_until for r in relays if r.drain_until is not None]
            if again:
                timeout = 0.0
            elif deadlines:
                timeout = max(0.001, min(deadlines) - now)
            else:
                timeout = None
            ready = again
            for key, _events in self._selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                else:
                    ready.add(key.data)
            now = time.monotonic()
            ready.update(r for r in relays
                         if r.drain_until is not None and now >= r.drain_until)

    def _register(self, relay: TlsRelay) -> None:
        for sock, events in zip((relay._tls, relay._local), relay.wanted()):
            old = relay.events.get(sock, 0)
            if events == old:
                continue
            if not events:
                self._selector.unregister(sock)
                del relay.events[sock]
            elif not old:
                self._selector.register(sock, events, relay)
                relay.events[sock] = events
            else:
                self._selector.modify(sock, events, relay)
                relay.events[sock] = events


def start(tls_sock: ssl.SSLSocket | socket.socket, name: str = "",
          tee=None) -> tuple[int, TlsRelay]:
    """Step 1: relay ``tls_sock`` (the relay owns it from now on; a plain socket only with a
    ``tee``, whose ``close`` the relay calls when it ends); returns the fd of the local end
    to give away (the caller owns it) and the relay."""
    global _loop
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    relay = TlsRelay(tls_sock, mine, name, tee)
    try:
        with _live_lock:
            loop = _loop
            fresh = loop is None or loop.pid != os.getpid()  # none, or a forked parent's
            if fresh:
                if loop is not None:  # a forked child: the parent's relays are not its own
                    _live.clear()
                loop = _Loop()
            loop.add(relay)
            _live.add(relay)
            if fresh:
                try:
                    loop.thread.start()
                except BaseException:
                    _live.discard(relay)
                    loop._close_own()
                    raise
                _loop = loop
    except BaseException:
        mine.close()
        theirs.close()
        raise
    if not fresh:
        loop.wake()
    return theirs.detach(), relay
