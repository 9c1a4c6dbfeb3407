"""The authenticated channel between miniray hosts: blocking connect/accept and the channel.

Owns: running the handshake of ``peer_wire.py`` on a socket with one deadline
(``connect``, ``accept``), the HELLO that follows it (step 7 below), the channel that sends
and receives MAC'd frames afterwards (``PeerChannel``: blocking, with timeouts, or from a
selector loop; large payloads straight into the caller's buffer; a large value as frames
hashed on the MAC pool, ``send_value`` / ``recv_value_into``), the bound on concurrent
handshakes of a listener (``HandshakeGate``), handing a channel over to another process
(``PeerChannel.handover`` / ``from_state``: the fd plus both keys and sequence numbers,
for a node's remote worker; a TLS channel's through a relay, ``tls_relay.py``),
``FramedPeer`` (a channel behind ``framing.FramedSocket``'s interface, for that worker's
data and control), and the TLS contexts. Re-exports every name of
``peer_wire.py`` (errors, handshake and frame classes), so callers import this module only.
Does not own: the wire format (``peer_wire.py``), the token and TLS settings
(``host/auth_token.py``), the version rule (``core/protocol.version_policy``), listening
sockets, or what roles say to each other after the HELLO (the node's join and heartbeat
code).
Called by: node/ (joining, heartbeats, pulls) and drivers that reach a remote node.

Steps 1-6 (handshake, keys, frames) are in ``peer_wire.py``; then::

    7. C -> S HELLO, the first frame: pickle {"role", "versions", **extra}.
       S -> C {"ok": True, "versions", **extra} or {"ok": False, "error": text}, then close.
       Versions follow ``protocol.version_policy`` on both sides: another miniray or Python
       major.minor is refused naming both sides' values; other differences warn.
       The HELLO frame may not exceed ``HELLO_MAX_FRAME``; steps 1-7 share one deadline.

A failed check closes the socket and the side that detected it raises (``accept`` also logs
one WARNING line naming the peer's address). With TLS (``ssl_context``) the socket is
wrapped first and steps 1-7 run inside it: TLS adds confidentiality and certificates; the
token stays mandatory. Without TLS the channel gives authentication and integrity, not
confidentiality.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import select
import socket
import ssl
import threading
import time
from typing import Callable

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.host.auth_token import AuthTokenError
from miniray._private.transport import tls_relay
from miniray._private.transport.peer_wire import (  # noqa: F401 - re-exported for callers
    BAD_TOKEN,
    BAD_VERSION,
    DECLINE,
    DEFAULT_MAX_FRAME,
    DIRECT_MIN,
    HEADER,
    HELLO_MAX_FRAME,
    MAGIC,
    OK,
    PROTO_VERSION,
    TAG,
    VALUE_FRAME,
    ClientHandshake,
    FrameReader,
    FrameWriter,
    PeerAuthError,
    PeerClosed,
    PeerRefused,
    ServerHandshake,
    _mac,
    derive_keys,
    tag_of,
)

__all__ = [
    "ClientHandshake", "DEFAULT_MAX_FRAME", "FrameReader", "FrameWriter", "FramedPeer",
    "HandshakeGate", "MAGIC", "PROTO_VERSION", "PeerAuthError", "PeerChannel", "PeerClosed",
    "PeerRefused", "RefusalLog", "ServerHandshake", "accept", "client_ssl_context",
    "closed_by_peer", "connect", "derive_keys", "server_ssl_context", "tls_contexts",
]  # fmt: skip

logger = logging.getLogger(__name__)

_SCRATCH = 1 << 18
_SEND_CHUNK = 1 << 22
_JOIN_BELOW = 1 << 16         # a frame smaller than this is written with one system call
_TLS_PIECE = 1 << 16         # with a send deadline, TLS writes at most this much at once
_FEED_READS = 64              # reads per feed_nonblocking call: a fast peer cannot starve

ADVICE = ("Check that every node and driver has the same token: `miniray get-auth-token` on "
          "the head prints it; set MINIRAY_AUTH_TOKEN (or a 0600 file named by "
          "MINIRAY_AUTH_TOKEN_PATH) to it.")



# ----------------------------------------------------------------------------- blocking I/O
def _wait(sock, events: int, deadline: float | None) -> None:
    """Block until ``sock`` is ready for ``events`` (select.POLLIN/POLLOUT) or the deadline;
    TimeoutError at the deadline."""
    if isinstance(sock, ssl.SSLSocket) and events == select.POLLIN and sock.pending():
        return
    poller = select.poll()
    poller.register(sock.fileno(), events)
    while True:
        if deadline is None:
            wait_ms = None
        else:
            wait_ms = int(max(0.0, deadline - time.monotonic()) * 1000) + 1
        if poller.poll(wait_ms):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("timed out")


def _readable_now(sock) -> bool:
    """A read of ``sock`` would not block now: bytes, its EOF, or a socket that cannot be
    polled any more (closed: the read then says so)."""
    poller = select.poll()
    try:
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _send_all(sock, data, deadline: float | None = None) -> None:
    """``sendall`` that works on blocking and non-blocking (also TLS) sockets alike, and
    gives up with TimeoutError at ``deadline`` (None: never)."""
    view = memoryview(data).cast("B")
    tls = isinstance(sock, ssl.SSLSocket)
    while view.nbytes:
        try:
            if deadline is None:
                sent = sock.send(view)
            elif not tls:
                sent = sock.send(view, socket.MSG_DONTWAIT)
            else:  # no flags with TLS: wait for room, then write a bounded piece
                _wait(sock, select.POLLOUT, deadline)
                sent = sock.send(view[:_TLS_PIECE])
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError,
                ssl.SSLWantReadError):
            _wait(sock, select.POLLOUT, deadline)
            continue
        view = view[sent:]


def _recv_some(sock, buffer, deadline: float | None) -> int:
    """Receive into ``buffer`` whatever arrives first; 0 means EOF."""
    while True:
        _wait(sock, select.POLLIN, deadline)
        try:
            return sock.recv_into(buffer)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                ssl.SSLWantWriteError):
            continue


def _recv_exactly(sock, size: int, deadline: float) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        try:
            n = _recv_some(sock, view[got:], deadline)
        except ConnectionResetError:
            n = 0
        if n == 0:
            raise PeerClosed("the peer closed the connection during the handshake")
        got += n
    return bytes(buffer)


def _close(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _peer_name(sock, fallback=None) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, TypeError):
        if fallback:
            return f"{fallback[0]}:{fallback[1]}"
        return "an AF_UNIX peer" if sock.family == socket.AF_UNIX else "an unknown peer"


class PeerChannel:
    """One authenticated connection, after ``connect`` or ``accept``.

    ``send``/``send_bytes`` are thread-safe (one lock); one thread at a time receives
    (``recv``, ``recv_bytes``, ``recv_bytes_into``, ``feed_nonblocking``). ``setblocking
    (False)`` suits a selector loop: sends still complete (they wait for room), receives
    return what is there.

    Attributes:
        role: The client's role (from its HELLO).
        peer_hello: The other side's HELLO (the client's dict on the server, the server's
            answer on the client).
        remote_versions: The other side's versions (``protocol.peer_versions``).
        address: The other side's ``"host:port"``.
        version_warning: The version difference allowed, or None.
    """

    def __init__(self, sock, keys: tuple[bytes, bytes], *, address: str, role: str = "",
                 max_frame: int = DEFAULT_MAX_FRAME):
        self._sock = sock
        self._keys = (bytes(keys[0]), bytes(keys[1]))  # (send, receive): for ``handover``
        self._writer = FrameWriter(keys[0])
        self._reader = FrameReader(keys[1], max_frame)
        self._send_lock = threading.Lock()
        self._ready: collections.deque = collections.deque()
        self._scratch = bytearray(_SCRATCH)
        self._eof = False
        self._closed = False
        self._send_timeout: float | None = None
        self.address = address
        self.role = role
        self.peer_hello: dict = {}
        self.remote_versions: dict = {}
        self.version_warning: str | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"<PeerChannel {self.role or '?'} {self.address} {state} sent="
                f"{self._writer.seq} received={self._reader.seq}>")

    def statistics(self) -> dict:
        """A snapshot for status output and tests: frames each way, TLS, open or closed."""
        return {"address": self.address, "role": self.role, "tls": self.tls,
                "frames_sent": self._writer.seq, "frames_received": self._reader.seq,
                "closed": self._closed, "send_timeout": self._send_timeout}

    def fileno(self) -> int:
        return self._sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)

    @property
    def tls(self) -> bool:
        return isinstance(self._sock, ssl.SSLSocket)

    def readable_now(self) -> bool:
        """Something to read now, without blocking: a frame received and not taken, bytes
        (TLS's decrypted ones too), the peer's EOF, or a closed channel. An idle channel
        that is readable lost its peer or got a frame nobody asked for."""
        if self._ready or self._eof or self._closed:
            return True
        sock = self._sock
        return bool(isinstance(sock, ssl.SSLSocket) and sock.pending()) or _readable_now(sock)

    # ---------------------------------------------------------------- sending
    def send(self, obj) -> None:
        """Pickle (protocol 5) and send ``obj`` as one frame."""
        self.send_bytes(pickle.dumps(obj, protocol=5))

    def send_bytes(self, data) -> None:
        """Send ``data`` (bytes-like) as one frame; a large one is MAC'd and written in
        chunks, never copied. Thread-safe."""
        view = memoryview(data).cast("B")
        size = view.nbytes
        with self._send_lock:
            if self._closed:
                raise PeerClosed(f"the channel to {self.address} is closed")
            timeout = self._send_timeout
            deadline = None if timeout is None else time.monotonic() + timeout
            sock = self._sock
            frame = self._writer.stream(size, view)
            try:
                if size < _JOIN_BELOW:
                    frame.update(view)
                    _send_all(sock, frame.header + bytes(view) + frame.tag(), deadline)
                    return
                _send_all(sock, frame.header, deadline)
                for start in range(0, size, _SEND_CHUNK):
                    chunk = view[start:start + _SEND_CHUNK]
                    frame.update(chunk)
                    _send_all(sock, chunk, deadline)
                _send_all(sock, frame.tag(), deadline)
            except BaseException as error:
                # The frame's sequence number is spent and it may be half written: the
                # stream cannot be used any more, whatever went wrong.
                frame.abort()
                self._send_failed(error, size, timeout)

    def send_value(self, data, frame: int = VALUE_FRAME) -> None:
        """Send the bytes of ``data`` (a contiguous buffer, unchanged until this returns:
        a segment's mapping) as frames of at most ``frame`` bytes, back to back under one
        hold of the send lock; the receiver takes them with ``recv_value_into`` (or frame
        by frame). The tags of the frames ahead are computed on the MAC pool while earlier
        frames are written (``FrameWriter.value``); a send timeout bounds each frame.
        Thread-safe. Nothing is sent for an empty buffer."""
        view = memoryview(data).cast("B")
        with self._send_lock:
            if self._closed:
                raise PeerClosed(f"the channel to {self.address} is closed")
            timeout = self._send_timeout
            sock = self._sock
            frames = self._writer.value(view, frame)
            try:
                for header, payload, job in frames:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    if payload.nbytes < _JOIN_BELOW:
                        _send_all(sock, header + bytes(payload) + tag_of(job), deadline)
                        continue
                    _send_all(sock, header, deadline)
                    _send_all(sock, payload, deadline)
                    _send_all(sock, tag_of(job), deadline)
            except BaseException as error:
                frames.abort()  # no pool thread reads ``data`` after this returns
                self._send_failed(error, view.nbytes, timeout)

    def _send_failed(self, error: BaseException, size: int, timeout: float | None):
        """*Send lock held.* A send broke off: close the channel, raise what it means."""
        self.close()
        if isinstance(error, (TimeoutError, socket.timeout)):
            raise TimeoutError(f"sending {size} bytes to {self.address} did not "
                               f"finish within {timeout} s; the connection is "
                               "closed") from None
        if isinstance(error, (ConnectionError, ValueError)):
            raise PeerClosed(f"the connection to {self.address} broke while "
                             f"sending: {error}") from error
        raise error

    def set_send_timeout(self, seconds: float | None) -> None:
        """Bound every later send: one that cannot finish within ``seconds`` (the peer does
        not read) raises TimeoutError and closes the channel. None (the default): wait.
        Use this, never a timeout on the socket itself (that would make reads block)."""
        self._send_timeout = seconds

    # ---------------------------------------------------------------- receiving
    def _fail(self, error: BaseException):
        self.close()
        raise error

    def _oversize(self, size: int, where: str):
        """A frame longer than the room its receiver gave it (a peer of another version,
        or one that lies about a length): the stream cannot go on, so the channel closes
        and PeerAuthError (a ConnectionError, as every other broken stream) says so."""
        self._fail(PeerAuthError(
            f"the connection to {self.address} was closed: a frame of {size} bytes does "
            f"not fit {where} (the peer sent a wrong length: a miniray of another "
            "version, or not miniray)"))

    def _read_once(self, deadline: float | None) -> bool:
        """One receive into the reader; False on EOF."""
        direct = self._reader.direct_buffer()
        try:
            if direct is not None:
                n = _recv_some(self._sock, direct, deadline)
            else:
                n = _recv_some(self._sock, self._scratch, deadline)
        except TimeoutError:
            raise
        except (OSError, ValueError) as error:  # ValueError: closed by another thread
            self._fail(PeerClosed(f"the connection to {self.address} broke: {error}"))
        if n == 0:
            return False
        self._take_received(n, direct)
        return True

    def _take_received(self, n: int, direct) -> None:
        """The ``n`` bytes just received (into ``direct``, the reader's own buffer, or into
        the scratch buffer) go to the reader; its complete, verified frames to ``_ready``. A
        frame that fails its check closes the channel (PeerAuthError)."""
        try:
            if direct is not None:
                self._ready.extend(self._reader.advance(n))
            else:
                self._ready.extend(self._reader.feed(memoryview(self._scratch)[:n]))
        except PeerAuthError as error:
            logger.warning("closed the peer connection to %s: %s", self.address, str(error))
            self._fail(PeerAuthError(f"the connection to {self.address} was closed: {error}"))

    def recv_bytes(self, timeout: float | None = None):
        """The next verified payload (bytes-like). TimeoutError after ``timeout`` seconds
        (None: wait), PeerClosed on EOF, PeerAuthError on a frame that fails its check."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            try:
                more = not (self._eof or self._closed) and self._read_once(deadline)
            except TimeoutError:
                raise TimeoutError(f"no message from {self.address} within {timeout} s") \
                    from None
            if not more:
                self._eof = True
                self._reader.close()  # a frame cut short: stop its helper thread
                raise PeerClosed(f"{self.address} closed the connection")
        return self._ready.popleft()

    def recv(self, timeout: float | None = None):
        """The next message: verified first, then unpickled."""
        return pickle.loads(self.recv_bytes(timeout))

    def recv_bytes_into(self, buffer, timeout: float | None = None) -> int:
        """Receive the next frame's payload straight into ``buffer`` (bulk data: a
        segment's mmap); returns its size. The buffer holds unverified bytes until this
        returns: on PeerAuthError its contents must be thrown away (a frame longer than
        ``buffer`` is one: the channel is closed)."""
        target = memoryview(buffer).cast("B")
        if not self._ready:
            self._reader.expect_into(target)
        try:
            payload = self.recv_bytes(timeout)
        finally:
            self._reader.cancel_into()
        view = memoryview(payload).cast("B")
        if view.nbytes > target.nbytes:
            self._oversize(view.nbytes, f"the buffer of {target.nbytes} bytes given for it")
        if view.obj is not target.obj:  # small, or begun elsewhere: copy it over
            target[:view.nbytes] = view
        return view.nbytes

    def recv_value_into(self, buffer, timeout: float | None = None) -> None:
        """Receive one value that fills ``buffer`` exactly (a segment's mapping), sent with
        ``send_value`` (or as frames of any sizes that add up to it): frames already
        received are copied, the rest received straight into it, each frame's tag checked
        on the MAC pool while the next one arrives. Returns once every tag of the value
        was checked; before that the buffer holds unchecked bytes. TimeoutError when no
        frame of it completes within ``timeout`` seconds, PeerClosed on EOF, PeerAuthError
        on a bad tag anywhere or a frame past the value's end; each of them closes the
        channel (its stream stopped inside the value) and its contents must then be thrown
        away. On return or failure no
        thread of the pool uses ``buffer`` any more."""
        target = memoryview(buffer).cast("B")
        size = target.nbytes
        offset = 0
        while self._ready and offset < size:  # received and checked before this call
            view = memoryview(self._ready.popleft()).cast("B")
            if view.nbytes > size - offset:
                self._oversize(view.nbytes, f"the {size - offset} bytes left of a value")
            target[offset:offset + view.nbytes] = view
            offset += view.nbytes
        if offset == size:
            return
        reader = self._reader
        try:
            reader.begin_value(target[offset:])
        except PeerAuthError as error:
            self._fail(PeerAuthError(f"the connection to {self.address} was closed: "
                                     f"{error}"))
        ok = False
        try:
            frames = -1
            deadline = None
            while not reader.value_done():
                if reader.value_frames != frames:  # a frame arrived: a new frame's time
                    frames = reader.value_frames
                    deadline = None if timeout is None else time.monotonic() + timeout
                if self._closed or not self._read_once(deadline):
                    self._eof = True
                    raise PeerClosed(f"{self.address} closed the connection in the "
                                     "middle of a value")
            try:
                reader.end_value()
            except PeerAuthError as error:
                logger.warning("closed the peer connection to %s: %s", self.address, str(error))
                raise PeerAuthError(f"the connection to {self.address} was closed: "
                                    f"{error}") from None
            ok = True
        except TimeoutError:
            raise TimeoutError(f"no frame of a value from {self.address} within "
                               f"{timeout} s; the connection is closed") from None
        finally:
            reader.abort_value()
            if not ok:
                self.close()

    def feed_nonblocking(self) -> list:
        """For a selector loop: read what is available without blocking; the complete
        verified messages, unpickled. PeerClosed once the peer closed and every message
        before its EOF was returned."""
        tls = self.tls
        for _ in range(_FEED_READS):
            direct = self._reader.direct_buffer()
            buffer = direct if direct is not None else self._scratch
            try:
                if tls:
                    # A blocking TLS socket would wait for more: read only what is there.
                    if not self._sock.pending() and not _readable_now(self._sock):
                        break
                    n = self._sock.recv_into(buffer)
                else:
                    n = self._sock.recv_into(buffer, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                    ssl.SSLWantWriteError, TimeoutError, socket.timeout):
                break  # nothing more now (a timeout: someone set one on the socket)
            except (OSError, ValueError) as error:
                self._fail(PeerClosed(f"the connection to {self.address} broke: {error}"))
            if n == 0:
                self._eof = True
                self._reader.close()
                break
            self._take_received(n, direct)
        messages = [pickle.loads(payload) for payload in self._ready]
        self._ready.clear()
        if not messages and (self._eof or self._closed):
            raise PeerClosed(f"{self.address} closed the connection")
        return messages

    # ---------------------------------------------------------------- hand-over
    def handover(self, tee=None) -> tuple[int, dict]:
        """Give this connection to another process: ``(fd, state)``. The channel is closed
        here without shutting the connection down; the caller owns ``fd`` (pass it with
        SCM_RIGHTS, then close it) and passes ``state`` (both keys and both sequence
        numbers: secret, so only over a same-uid local socket, never on the wire) to
        ``from_state`` there. A TLS channel's session cannot move: its ``fd`` is then the
        local end of a socketpair whose other end a thread of this process relays to the
        TLS connection (``tls_relay.py``, which says why), and it keeps this process's
        TLS session while the other process uses the connection. ValueError for a
        channel with received bytes not yet taken (they would be lost). ``tee``: a plain
        byte stream (a remote worker's stdout or stderr) also copied to ``tee.write`` by
        that relay thread, TLS or not (``tls_relay.py``)."""
        with self._send_lock:
            if self._closed:
                raise ValueError(f"the channel to {self.address} is closed")
            if self._ready or self._reader._buffer or self._reader._size >= 0:
                raise ValueError(f"the channel to {self.address} has received bytes not "
                                 "taken yet; hand it over before the peer sends more")
            state = {"keys": self._keys, "seqs": (self._writer.seq, self._reader.seq),
                     "max_frame": self._reader.max_frame, "address": self.address,
                     "role": self.role}
            self._closed = True
            self._reader.close()
            if self.tls or tee is not None:
                fd, _relay = tls_relay.start(self._sock, f"{self.role} {self.address}", tee)
            else:
                fd = self._sock.detach()
        return fd, state

    @classmethod
    def from_state(cls, sock, state: dict) -> PeerChannel:
        """The channel ``handover`` gave away, rebuilt on ``sock`` (the passed fd) in this
        process: the next frame each way carries the sequence number the old end would
        have used."""
        channel = cls(sock, state["keys"], address=str(state.get("address", "")),
                      role=str(state.get("role", "")),
                      max_frame=int(state.get("max_frame", DEFAULT_MAX_FRAME)))
        channel._writer.seq, channel._reader.seq = (int(n) for n in state["seqs"])
        return channel

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Close the connection (idempotent); a blocked receiver gets PeerClosed."""
        if self._closed:
            return
        self._closed = True
        self._reader.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        except OSError:
            pass
        _close(self._sock)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _require_token(token) -> None:
    if not isinstance(token, (bytes, bytearray)) or not token:
        raise AuthTokenError(
            "No miniray cluster token was given for this peer connection: every connection "
            "between hosts proves one. `miniray get-auth-token --generate` on the head makes "
            "one; give it to every node and driver (MINIRAY_AUTH_TOKEN).")


def _run_handshake(sock, handshake, first: bytes, deadline: float) -> tuple[bytes, bytes]:
    """Steps 1-5 on ``sock``; returns the keys. Sends a failure's reply before raising."""
    if first:
        _send_all(sock, first, deadline)
    while not handshake.done:
        try:
            reply = handshake.feed(_recv_exactly(sock, handshake.wants, deadline))
        except (PeerAuthError, PeerRefused) as error:
            if getattr(error, "reply", b""):
                try:
                    _send_all(sock, error.reply, deadline)
                except (OSError, TimeoutError):
                    pass
            raise
        if reply:
            _send_all(sock, reply, deadline)
    return handshake.keys


def _hello_reply(channel: PeerChannel, deadline: float):
    """Step 7's frame, bounded in size and time, verified, then unpickled."""
    limit, channel._reader.max_frame = channel._reader.max_frame, HELLO_MAX_FRAME
    try:
        data = channel.recv_bytes(max(0.0, deadline - time.monotonic()))
    finally:
        channel._reader.max_frame = limit
    return pickle.loads(data)


def connect(address: tuple[str, int], token: bytes, role: str, *, hello: dict | None = None,
            timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None,
            source_address: tuple[str, int] | None = None,
            max_frame: int = DEFAULT_MAX_FRAME) -> PeerChannel:
    """Open an authenticated channel to the node at ``address`` (steps 1-7), in at most
    ``timeout`` seconds.

    Args:
        address: The node's ``(host, port)``.
        token: The cluster token (``auth_token.load_token()``).
        role: What this connection is for (the node dispatches on it).
        hello: Extra fields for the HELLO (must not be "role" or "versions").
        timeout: Seconds for the TCP connect, TLS, the handshake and the HELLO's answer.
        ssl_context: ``client_ssl_context(...)`` to run everything inside TLS.
        source_address: The local ``(host, port)`` to bind (fake hosts on 127.0.0.x).
        max_frame: The largest frame accepted from the node.

    Raises:
        PeerAuthError: The node did not prove the token, or refused ours (message says
            what to check). PeerRefused: the node refused the HELLO (versions, role).
        PeerClosed, OSError (ConnectionRefusedError, ...), TimeoutError.

    Example:
        >>> channel = connect(("127.0.0.1", 6380), token, "join")  # doctest: +SKIP
        >>> channel.send({"op": "ping"}); channel.recv(timeout=5)  # doctest: +SKIP
    """
    extra = dict(hello or {})
    if "role" in extra or "versions" in extra:
        raise ValueError("hello must not set 'role' or 'versions' (connect sets them)")
    _require_token(token)
    where = f"{address[0]}:{address[1]}"
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(address, timeout=timeout,
                                        source_address=source_address)
    except socket.timeout:  # TimeoutError from Python 3.10 on
        raise TimeoutError(f"The node at {where} did not accept a connection within "
                           f"{timeout} s.") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock = ssl_context.wrap_socket(
                    sock, server_hostname=address[0] if ssl_context.check_hostname else None)
            except socket.timeout:
                raise TimeoutError(f"The node at {where} did not finish the TLS handshake "
                                   f"within {timeout} s.") from None
            except ssl.SSLError as error:
                raise PeerAuthError(
                    f"TLS with the node at {where} failed: {error}. Check that both hosts "
                    "use certificates signed by the same CA (MINIRAY_TLS_SERVER_CERT, "
                    "MINIRAY_TLS_SERVER_KEY, MINIRAY_TLS_CA_CERT), or that TLS is on for "
                    "both or neither.") from None
            except ConnectionError as error:
                raise PeerClosed(
                    f"The node at {where} closed the connection during the TLS handshake "
                    f"({error}): is TLS on for both or neither (MINIRAY_USE_TLS)?") from None
        sock.settimeout(None)
        handshake = ClientHandshake(token)
        try:
            keys = _run_handshake(sock, handshake, handshake.start(), deadline)
        except PeerAuthError as error:
            raise PeerAuthError(f"miniray could not authenticate with the node at {where}: "
                                f"{error}. {ADVICE}") from None
        except PeerRefused as error:
            raise PeerRefused(f"The node at {where} refused this connection: {error}.") \
                from None
        except PeerClosed:
            raise PeerClosed(f"The node at {where} closed the connection during the "
                             "handshake: is it a miniray node of this version, with TLS on "
                             "for both or neither (MINIRAY_USE_TLS)?") from None
        except TimeoutError:
            raise TimeoutError(f"The node at {where} did not finish the authentication "
                               f"handshake within {timeout} s.") from None
        channel = PeerChannel(sock, keys, address=where, role=role, max_frame=max_frame)
        local = protocol.peer_versions()
        channel.send({**extra, "role": role, "versions": local})
        try:
            answer = _hello_reply(channel, deadline)
        except TimeoutError:
            raise TimeoutError(f"The node at {where} did not answer this process's hello "
                               f"within {timeout} s.") from None
        if not isinstance(answer, dict):
            raise PeerRefused(f"The node at {where} answered the hello with "
                              f"{type(answer).__name__}, not a dict: a miniray bug.")
        if not answer.get("ok"):
            raise PeerRefused(f"The node at {where} refused this connection: "
                              f"{answer.get('error') or 'no reason given'}")
        remote = answer.get("versions") or {}
        refusal, warning = protocol.version_policy(
            local, remote, local_name="this process", remote_name=f"the node at {where}")
        if refusal:
            raise PeerRefused(refusal)
        if warning:
            logger.warning("%s", warning)
        channel.peer_hello = answer
        channel.remote_versions = remote
        channel.version_warning = warning
        return channel
    except BaseException:
        _close(sock)
        raise


def accept(sock: socket.socket, token: bytes, *, timeout: float = 5.0,
           ssl_context: ssl.SSLContext | None = None,
           answer: Callable[[dict], dict | str] | None = None,
           max_frame: int = DEFAULT_MAX_FRAME) -> PeerChannel:
    """Authenticate the peer on an accepted socket (steps 1-7, server side) in at most
    ``timeout`` seconds, then answer its HELLO.

    ``answer(hello)`` (after the token and the versions passed) returns extra fields for the
    reply, or a string: the refusal sent to the peer. On any failure the socket is closed,
    ONE line is logged (WARNING) naming the peer's address, and the error is raised
    (PeerAuthError, PeerRefused, PeerClosed, TimeoutError): callers need not log it again.
    ``sock`` belongs to this function from the call on. Run it in a thread per connection,
    bounded by a ``HandshakeGate``.
    """
    try:
        _require_token(token)
    except AuthTokenError:
        _close(sock)
        raise
    where = _peer_name(sock)
    host = _host_of(sock)
    deadline = time.monotonic() + timeout
    try:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (socketpair in tests)
        if ssl_context is not None:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock = ssl_context.wrap_socket(sock, server_side=True)
        sock.settimeout(None)
        keys = _run_handshake(sock, ServerHandshake(token), b"", deadline)
        channel = PeerChannel(sock, keys, address=where, max_frame=max_frame)
        hello = _hello_reply(channel, deadline)
        if (not isinstance(hello, dict) or not isinstance(hello.get("role"), str)
                or not isinstance(hello.get("versions"), dict)):
            raise PeerRefused("its hello is not {'role': str, 'versions': dict}")
        channel.role = hello["role"]
        channel.peer_hello = hello
        channel.remote_versions = hello["versions"]
        local = protocol.peer_versions()
        refusal, warning = protocol.version_policy(
            local, hello["versions"], local_name=f"the node at {_local_name(sock)}",
            remote_name=f"the peer at {where}")
        extra: dict = {}
        if refusal is None and answer is not None:
            result = answer(hello)
            if isinstance(result, str):
                refusal = result
            else:
                extra = dict(result or {})
        if refusal is not None:
            try:
                channel.send({"ok": False, "error": refusal})
            except OSError:
                pass
            raise PeerRefused(refusal)
        if warning:
            logger.warning("peer %s (%s): %s", where, channel.role, warning)
        channel.version_warning = warning
        channel.send({**extra, "ok": True, "versions": local})
        return channel
    except (TimeoutError, socket.timeout):
        _refusals.warn(host, "refused peer %s: it did not finish the handshake within %s s",
                       where, timeout)
        _close(sock)
        raise TimeoutError(f"the peer at {where} did not finish the handshake within "
                           f"{timeout} s") from None
    except PeerAuthError as error:
        _refusals.warn(host, "refused peer %s: %s", where, error)
        _close(sock)
        raise PeerAuthError(f"refused the peer at {where}: {error}") from None
    except PeerRefused as error:
        _refusals.warn(host, "refused peer %s: %s", where, error)
        _close(sock)
        raise
    except PeerClosed:
        _refusals.warn(host, "peer %s closed the connection during the handshake", where)
        _close(sock)
        raise PeerClosed(f"the peer at {where} closed the connection during the "
                         "handshake") from None
    except ssl.SSLError as error:
        _refusals.warn(host, "refused peer %s: TLS failed (%s): a peer without TLS, or with a "
                       "certificate this node's CA did not sign", where, error)
        _close(sock)
        raise PeerAuthError(f"refused the peer at {where}: TLS failed: {error}") from None
    except BaseException:
        _close(sock)
        raise


class RefusalLog:
    """At most ``per_minute`` refusal lines per peer host a minute, so that a flood of bad
    connections cannot fill the node's log; the next line allowed says how many were
    left out. Thread-safe; ``clock`` is injectable for tests."""

    def __init__(self, per_minute: int = 20, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, list] = {}  # host -> [window start, lines, left out]

    def allow(self, host: str) -> tuple[bool, int]:
        """Pure decision (under the lock): ``(log this line?, lines left out before it)``."""
        now = self._clock()
        with self._lock:
            if len(self._hosts) > 4096:  # forget old windows: bounded memory under a scan
                self._hosts = {h: w for h, w in self._hosts.items() if now - w[0] < 60.0}
            window = self._hosts.get(host)
            if window is None or now - window[0] >= 60.0:
                left_out = window[2] if window else 0
                self._hosts[host] = [now, 1, 0]
                return True, left_out
            if window[1] < self.per_minute:
                window[1] += 1
                left_out, window[2] = window[2], 0
                return True, left_out
            window[2] += 1
            return False, 0

    def warn(self, host: str, text: str, *args) -> None:
        log, left_out = self.allow(host)
        if log:
            if left_out:
                text += f" ({left_out} more refusals of {host} were not logged)"
            logger.warning(text, *args)


_refusals = RefusalLog()


def _host_of(sock) -> str:
    try:
        return str(sock.getpeername()[0]) or "unknown"
    except (OSError, IndexError, TypeError):
        return "unknown"


def _local_name(sock) -> str:
    try:
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, TypeError):
        return "this host"


# ------------------------------------------------------------ framed-socket adapter
class FramedPeer:
    """A ``PeerChannel`` behind the interface of ``framing.FramedSocket`` (blocking side:
    ``send``, ``send_frames``, ``recv``, ``recv_ready``, ``recv_bytes``, ``fileno``,
    ``close``): a remote worker's data and control connections, whose every frame is
    MAC'd and checked before the caller unpickles it. A frame that fails its check closes
    the channel and raises PeerAuthError (an OSError: the worker's loop ends on it)."""

    __slots__ = ("channel", "fd")
    RECV_TIMEOUT_S: float | None = None  # ``recv``'s wait for its first frame (None: none)

    def __init__(self, channel: PeerChannel):
        channel.setblocking(True)
        self.channel = channel
        self.fd = channel.fileno()

    def fileno(self) -> int:
        return self.fd

    def send(self, data) -> None:
        self.channel.send_bytes(data)

    def send_frames(self, frames: list) -> None:
        for data in frames:
            self.channel.send_bytes(data)

    def send_value(self, data, frame: int = VALUE_FRAME) -> None:
        """A large value's bytes (``PeerChannel.send_value``)."""
        self.channel.send_value(data, frame)

    def recv(self) -> list:
        """Block for at least one verified frame, and take those read with it; EOFError
        when the peer closed."""
        frames = [self.recv_bytes()]
        ready = self.channel._ready
        while ready:
            frames.append(bytes(ready.popleft()))
        return frames

    def recv_bytes(self) -> bytes:
        """One verified frame (``multiprocessing.connection.Connection``'s call);
        TimeoutError after ``RECV_TIMEOUT_S``."""
        try:
            return bytes(self.channel.recv_bytes(timeout=self.RECV_TIMEOUT_S))
        except PeerClosed:
            raise EOFError("peer closed the socket") from None

    def recv_ready(self) -> tuple[list, bool]:
        """Every verified frame available now, and whether the peer closed."""
        frames = []
        try:
            while True:
                frames.append(bytes(self.channel.recv_bytes(timeout=0)))
        except TimeoutError:
            return frames, False
        except (PeerClosed, OSError):
            return frames, True

    def close(self) -> None:
        self.channel.close()


# ----------------------------------------------------------------------- listener support
class HandshakeGate:
    """Runs ``accept`` for each new connection in a short-lived thread, at most
    ``max_pending`` at a time and ``max_per_host`` from one peer host: past that a
    connection is closed at once (and logged), so a flood of slow clients cannot exhaust
    threads, and one host cannot keep the others out; each costs at most ``timeout``.

    ``on_channel(channel)`` is called in the handshake's thread with each authenticated
    channel (it owns the channel from then on; if it raises, the channel is closed).

    Example::

        gate = HandshakeGate(token, on_channel=serve, answer=check_role)
        while running:
            conn, _ = listener.accept()
            gate.submit(conn)
        gate.close()
    """

    def __init__(self, token: bytes, *, on_channel: Callable[[PeerChannel], None],
                 answer: Callable[[dict], dict | str] | None = None, max_pending: int = 16,
                 max_per_host: int = 4, timeout: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None,
                 name: str = "miniray-peer-handshake"):
        self._token = token
        self._on_channel = on_channel
        self._answer = answer
        self._max_pending = max_pending
        self._max_per_host = max_per_host
        self._per_host: dict[str, int] = {}
        self._timeout = timeout
        self._ssl_context = ssl_context
        self._name = name
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self.accepted = 0
        self.failed = 0
        self.shed = 0

    def __repr__(self) -> str:
        return (f"<HandshakeGate pending={len(self._threads)}/{self._max_pending} "
                f"accepted={self.accepted} failed={self.failed} shed={self.shed}>")

    def statistics(self) -> dict:
        with self._lock:
            return {"pending": len(self._threads), "max_pending": self._max_pending,
                    "hosts": dict(self._per_host), "accepted": self.accepted,
                    "failed": self.failed, "shed": self.shed}

    def submit(self, sock: socket.socket) -> bool:
        """Start the handshake of ``sock`` (which this gate now owns); False if it was shed
        (too many handshakes running, or the gate is closed)."""
        host = _host_of(sock)
        with self._lock:
            if self._closed:
                why = "the node is closing"
            elif len(self._threads) >= self._max_pending:
                why = f"{self._max_pending} handshakes are already running"
            elif self._per_host.get(host, 0) >= self._max_per_host:
                why = f"{self._max_per_host} handshakes from {host} are already running"
            else:
                why = None
                thread = threading.Thread(target=self._run, args=(sock, host), daemon=True,
                                          name=self._name)
                self._threads.add(thread)
                self._per_host[host] = self._per_host.get(host, 0) + 1
            if why:
                self.shed += 1
        if why:
            _refusals.warn(host, "refused peer %s: %s", _peer_name(sock), why)
            _close(sock)
            return False
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: shed it
            self._release(thread, host)
            with self._lock:
                self.shed += 1
            _refusals.warn(host, "refused peer %s: no thread for its handshake",
                           _peer_name(sock))
            _close(sock)
            return False
        return True

    def _release(self, thread, host: str) -> None:
        with self._lock:
            self._threads.discard(thread)
            left = self._per_host.get(host, 1) - 1
            if left > 0:
                self._per_host[host] = left
            else:
                self._per_host.pop(host, None)

    def _run(self, sock, host: str) -> None:
        try:
            try:
                channel = accept(sock, self._token, timeout=self._timeout,
                                 ssl_context=self._ssl_context, answer=self._answer)
            except (ConnectionError, TimeoutError, OSError):
                with self._lock:
                    self.failed += 1
                return  # accept logged it
            except Exception:
                with self._lock:
                    self.failed += 1
                logger.exception("the handshake of peer %s failed", _peer_name(sock))
                return
            with self._lock:
                self.accepted += 1
            try:
                self._on_channel(channel)
            except BaseException:
                logger.exception("the handler of peer %s failed", channel.address)
                channel.close()
        finally:
            self._release(threading.current_thread(), host)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new connections and wait for the running handshakes (each ends within its
        own timeout)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout if timeout is not None else self._timeout + 1.0)


# ------------------------------------------------------------------------------------ TLS
def client_ssl_context(cert: str, key: str, ca: str, *,
                       check_hostname: bool = False) -> ssl.SSLContext:
    """A TLS context for ``connect``: presents ``cert``/``key`` and trusts only nodes whose
    certificate ``ca`` signed. Hostnames are not checked by default (nodes are named by
    IP; the certificate and the token already prove membership)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=ca)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_ssl_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """A TLS context for ``accept``: presents ``cert``/``key`` and requires a client
    certificate signed by ``ca`` (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def tls_contexts(environ=None) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """``(client_context, server_context)`` from the environment when TLS between hosts is
    on (``MINIRAY_USE_TLS=1`` or ``RAY_USE_TLS=1``, with ``*_TLS_SERVER_CERT``,
    ``*_TLS_SERVER_KEY`` and ``*_TLS_CA_CERT``: ``auth_token.tls_files``), else None. Pass
    them as ``connect(..., ssl_context=client)`` and ``accept(..., ssl_context=server)``."""
    files = auth_token.tls_files(environ)
    if files is None:
        return None
    cert, key, ca = files
    try:
        return client_ssl_context(cert, key, ca), server_ssl_context(cert, key, ca)
    except (OSError, ssl.SSLError) as error:
        raise AuthTokenError(f"The TLS files ({cert}, {key}, {ca}) cannot be used: "
                             f"{error}") from None


def closed_by_peer(channel) -> bool:
    """Whether the peer closed ``channel`` (its process is gone, or it gave up waiting):
    readable with nothing to read, or closed here. Peeks at the socket's bytes through a
    duplicate of its descriptor, so nothing is taken from the channel (a message the peer
    sent meanwhile is read by its reader as usual)."""
    try:
        fd = channel.fileno()
    except (OSError, ValueError):
        return True
    if fd < 0:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    if not readable:
        return False
    try:
        peek = socket.socket(fileno=os.dup(fd))
    except OSError:
        return True
    try:
        return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        peek.close()  # the duplicate only

