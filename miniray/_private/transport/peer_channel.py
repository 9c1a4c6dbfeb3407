"""The authenticated channel between miniray hosts: a token handshake, then MAC'd frames.

Owns: the handshake that proves the cluster token in both directions before anything else
is read (``ClientHandshake``, ``ServerHandshake``), the framing that authenticates and
orders every later frame (``FrameWriter``, ``FrameReader``), the blocking wrappers that
do both on a socket (``connect``, ``accept``, ``PeerChannel``), the bound on concurrent
handshakes of a listener (``HandshakeGate``), optional TLS contexts, and the errors
(``PeerAuthError``, ``PeerRefused``, ``PeerClosed``). Does not own: the token (``host/
auth_token.py``), the version rule (``core/protocol.version_policy``), listening sockets,
or what roles say to each other after the HELLO (the node's join and heartbeat code).
Called by: node/ (joining, heartbeats, pulls) and drivers that reach a remote node.

Threat: anyone who can reach the port (another local user, any host on the LAN). Nothing
is unpickled, and no role acts, before the peer has proven the token; until then every read
has a fixed size and the whole handshake a deadline. The token never travels.

Wire protocol (all integers big-endian; ``H(k, m)`` is HMAC-SHA256)::

    1. C -> S  MAGIC(8) | proto(u16) | cn(32)                   client nonce, fresh
    2. S -> C  OK(1) | sn(32) | H(token, "S"|cn|sn)(32)          the server proves first
               or BAD_VERSION(1) | proto(u16), then close
    3. C checks the server's proof (compare_digest). Wrong: C sends 32 zero bytes (it
       declines: the server can log why) and closes; C raises PeerAuthError.
       Right: C -> S  H(token, "C"|cn|sn)(32)
    4. S checks it. Wrong: S -> C BAD_TOKEN(1), close; S logs one line with the peer's
       address and raises PeerAuthError. Right: S -> C OK(1).
    5. Keys, one per direction (a frame cannot be reflected back to its sender):
       k_c2s = H(token, "K-c2s"|cn|sn), k_s2c = H(token, "K-s2c"|cn|sn).
    6. Every later frame, each direction with its own seq from 0:
           length(u64) | payload | H(k_dir, seq(u64) | payload)[:16]
       A length over the reader's limit, a wrong tag (tampered, replayed, reordered,
       reflected or truncated frame) -> PeerAuthError and the connection is closed. The tag
       is checked before the payload is handed to anyone, so before any unpickling.
    7. C -> S HELLO, the first frame: pickle {"role", "versions", **extra}.
       S -> C {"ok": True, "versions", **extra} or {"ok": False, "error": text}, then close.
       Versions follow ``protocol.version_policy`` on both sides: another miniray or Python
       major.minor is refused naming both sides' values; other differences warn.

With TLS (``ssl_context``) the socket is wrapped first and steps 1-7 run inside it: TLS adds
confidentiality and certificates; the token stays mandatory. Without TLS the channel gives
authentication and integrity, not confidentiality.

Large payloads: ``FrameWriter.stream`` MACs and sends a payload in chunks without copying it;
``FrameReader`` receives a large payload straight into its final buffer (``direct_buffer`` /
``advance``, used with ``recv_into``), MACing it as it arrives, and ``PeerChannel.
recv_bytes_into`` lets the caller name that buffer (an mmap of a segment, say).
"""

from __future__ import annotations

import collections
import hmac
import logging
import pickle
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from typing import Callable

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.host.auth_token import AuthTokenError
from miniray.exceptions import AuthenticationError

__all__ = [
    "ClientHandshake", "DEFAULT_MAX_FRAME", "FrameReader", "FrameWriter", "HandshakeGate",
    "MAGIC", "PROTO_VERSION", "PeerAuthError", "PeerChannel", "PeerClosed", "PeerRefused",
    "ServerHandshake", "accept", "client_ssl_context", "connect", "server_ssl_context",
    "tls_contexts",
]  # fmt: skip

logger = logging.getLogger(__name__)

MAGIC = b"\x93miniray"
PROTO_VERSION = 1
NONCE = 32
PROOF = 32
TAG = 16
OK = b"\x06"
BAD_VERSION = b"V"
BAD_TOKEN = b"T"
DECLINE = bytes(PROOF)  # step 3: "your proof was wrong", sent instead of ours
_CLIENT_HELLO = struct.Struct("!8sH32s")
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")
HEADER = _U64.size

DEFAULT_MAX_FRAME = 1 << 40   # after authentication: what a peer may send in one frame
HELLO_MAX_FRAME = 1 << 20     # step 7's frames
DIRECT_MIN = 1 << 20          # payloads this large are received straight into their buffer
_SCRATCH = 1 << 18
_SEND_CHUNK = 1 << 22
_JOIN_BELOW = 1 << 16         # a frame smaller than this is written with one system call
_FEED_READS = 64              # reads per feed_nonblocking call: a fast peer cannot starve

ADVICE = ("Check that every node and driver has the same token: `miniray get-auth-token` on "
          "the head prints it; set MINIRAY_AUTH_TOKEN (or a 0600 file named by "
          "MINIRAY_AUTH_TOKEN_PATH) to it.")


class PeerAuthError(AuthenticationError, ConnectionError):
    """A peer did not prove the cluster token, or a frame failed its check (tampered,
    replayed, reordered, reflected, oversize). The connection is closed; the message says
    which peer and what to check."""


class PeerRefused(ConnectionError):
    """The peer proved the token but refused this connection (another miniray or Python
    version, or a role its node does not accept); the message is the refusal's text."""


class PeerClosed(ConnectionError):
    """The peer closed the connection (EOF), in the handshake or between frames."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod="sha256")
    for part in parts:
        mac.update(part)
    return mac.digest()


def derive_keys(token: bytes, cn: bytes, sn: bytes) -> tuple[bytes, bytes]:
    """Step 5: ``(k_c2s, k_s2c)``."""
    return _mac(token, b"K-c2s", cn, sn), _mac(token, b"K-s2c", cn, sn)


# ---------------------------------------------------------------------------- handshake
class _Handshake:
    """Shared buffering: ``feed`` bytes in any pieces, get back what to send. ``wants`` is
    how many bytes the next step needs (read exactly that many: nothing past the handshake
    is consumed). On failure ``feed`` raises PeerAuthError (or PeerRefused) whose ``reply``
    attribute holds the bytes to send before closing."""

    def __init__(self, token: bytes, nonce: bytes | None):
        if not isinstance(token, (bytes, bytearray)) or not token:
            raise PeerAuthError("miniray bug: the handshake needs the cluster token as bytes")
        self._token = bytes(token)
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE)
        self._buffer = bytearray()
        self._step = ""
        self.keys: tuple[bytes, bytes] | None = None  # (send key, receive key) when done

    @property
    def done(self) -> bool:
        return self._step == "done"

    @property
    def wants(self) -> int:
        return max(0, self._need() - len(self._buffer))

    def _need(self) -> int:
        raise NotImplementedError

    def _take(self) -> bytes | None:
        need = self._need()
        if need == 0 or len(self._buffer) < need:
            return None
        data = bytes(self._buffer[:need])
        del self._buffer[:need]
        return data

    @staticmethod
    def _fail(text: str, reply: bytes = b"", cls=None) -> Exception:
        error = (cls or PeerAuthError)(text)
        error.reply = reply
        return error


class ServerHandshake(_Handshake):
    """Steps 1-5, the listening side. Example::

        hs = ServerHandshake(token)
        while not hs.done:
            sock.sendall(hs.feed(recv_exactly(sock, hs.wants)))
        send_key, recv_key = hs.keys   # k_s2c, k_c2s
    """

    def __init__(self, token: bytes, *, nonce: bytes | None = None):
        super().__init__(token, nonce)
        self._step = "hello"
        self._cn = b""

    def _need(self) -> int:
        return {"hello": _CLIENT_HELLO.size, "proof": PROOF}.get(self._step, 0)

    def feed(self, data: bytes) -> bytes:
        if self._step == "done":
            raise PeerAuthError("miniray bug: bytes fed to a finished handshake")
        self._buffer += data
        out = b""
        while True:
            message = self._take()
            if message is None:
                return out
            if self._step == "hello":
                magic, version, cn = _CLIENT_HELLO.unpack(message)
                if magic != MAGIC:
                    raise self._fail(f"it is not a miniray peer (its first bytes are "
                                     f"{message[:8]!r})")
                if version != PROTO_VERSION:
                    raise self._fail(
                        f"it speaks peer protocol {version}, this node speaks "
                        f"{PROTO_VERSION}: run the same miniray version on every host",
                        BAD_VERSION + _U16.pack(PROTO_VERSION), PeerRefused)
                self._cn = cn
                out += OK + self._nonce + _mac(self._token, b"S", cn, self._nonce)
                self._step = "proof"
            else:  # "proof"
                if hmac.compare_digest(message, DECLINE):
                    raise self._fail("it holds another token (it could not verify this "
                                     "node's proof)")
                expected = _mac(self._token, b"C", self._cn, self._nonce)
                if not hmac.compare_digest(message, expected):
                    raise self._fail("its token proof is wrong (it holds another token)",
                                     BAD_TOKEN)
                k_c2s, k_s2c = derive_keys(self._token, self._cn, self._nonce)
                self.keys = (k_s2c, k_c2s)
                self._step = "done"
                return out + OK


class ClientHandshake(_Handshake):
    """Steps 1-5, the connecting side: send ``start()``, then feed what arrives (exactly
    ``wants`` bytes at a time) and send what ``feed`` returns, until ``done``."""

    def __init__(self, token: bytes, *, nonce: bytes | None = None):
        super().__init__(token, nonce)
        self._step = "new"

    def start(self) -> bytes:
        self._step = "status"
        return _CLIENT_HELLO.pack(MAGIC, PROTO_VERSION, self._nonce)

    def _need(self) -> int:
        return {"status": 1, "version": _U16.size, "proof": NONCE + PROOF,
                "verdict": 1}.get(self._step, 0)

    def feed(self, data: bytes) -> bytes:
        if self._step in ("new", "done"):
            raise PeerAuthError("miniray bug: bytes fed to a handshake not running")
        self._buffer += data
        out = b""
        while True:
            message = self._take()
            if message is None:
                return out
            if self._step == "status":
                if message == OK:
                    self._step = "proof"
                elif message == BAD_VERSION:
                    self._step = "version"
                else:
                    raise self._fail(f"it answered {message!r}, not a miniray node's "
                                     "handshake")
            elif self._step == "version":
                (version,) = _U16.unpack(message)
                raise self._fail(f"it speaks peer protocol {version}, this process speaks "
                                 f"{PROTO_VERSION}: run the same miniray version on every "
                                 "host", cls=PeerRefused)
            elif self._step == "proof":
                sn, proof = message[:NONCE], message[NONCE:]
                expected = _mac(self._token, b"S", self._nonce, sn)
                if not hmac.compare_digest(proof, expected):
                    raise self._fail("it did not prove this cluster's token (it holds "
                                     "another token, or it is not your node)", DECLINE)
                k_c2s, k_s2c = derive_keys(self._token, self._nonce, sn)
                self.keys = (k_c2s, k_s2c)
                self._step = "verdict"
                out += _mac(self._token, b"C", self._nonce, sn)
            else:  # "verdict"
                if message == OK:
                    self._step = "done"
                    return out
                if message == BAD_TOKEN:
                    raise self._fail("it refused this process's token")
                raise self._fail(f"it answered {message!r} to this process's proof")


# ------------------------------------------------------------------------------- frames
class _MacThread:
    """Feeds one large frame's MAC from a helper thread, so that hashing the payload
    overlaps sending or receiving it (hmac releases the GIL): the frame then costs about
    max(I/O, hashing) instead of their sum. ``advance_to(end)`` says ``base[:end]`` is
    final; ``digest()`` waits for the rest; ``abort()`` stops the thread (on any failure)."""

    def __init__(self, mac, base: memoryview):
        self._mac = mac
        self._base = base
        self._cond = threading.Condition()
        self._end = 0
        self._stop = False   # no more advance_to: finish what was given, then exit
        self._abort = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="miniray-peer-mac")
        self._thread.start()

    def advance_to(self, end: int) -> None:
        with self._cond:
            self._end = end
            self._cond.notify()

    def _run(self) -> None:
        done = 0
        while True:
            with self._cond:
                while self._end == done and not self._stop and not self._abort:
                    self._cond.wait()
                if self._abort or (self._stop and self._end == done):
                    return
                end = self._end
            self._mac.update(self._base[done:end])
            done = end

    def digest(self) -> bytes:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()
        return self._mac.digest()

    def abort(self) -> None:
        with self._cond:
            self._abort = True
            self._cond.notify()
        self._thread.join()


PIPELINE_MIN = 8 << 20  # a frame this large is hashed by a _MacThread


class _FrameStream:
    """One outgoing frame written in pieces: ``header``, then ``update`` each chunk just
    before it is sent, then ``tag()`` (or ``abort()`` if the frame is given up)."""

    __slots__ = ("header", "_mac", "_left", "_pos")

    def __init__(self, header: bytes, mac, size: int):
        self.header = header
        self._mac = mac
        self._left = size
        self._pos = 0

    def update(self, chunk) -> None:
        n = chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)
        self._left -= n
        self._pos += n
        if isinstance(self._mac, _MacThread):
            self._mac.advance_to(self._pos)
        elif self._mac is not None:
            self._mac.update(chunk)

    def tag(self) -> bytes:
        if self._left:
            self.abort()
            raise ValueError(f"miniray bug: {self._left} bytes of the frame were not given")
        return self._mac.digest()[:TAG] if self._mac is not None else bytes(TAG)

    def abort(self) -> None:
        if isinstance(self._mac, _MacThread):
            self._mac.abort()
        self._mac = None


class FrameWriter:
    """Step 6, sending. Not thread-safe: one writer per direction, used under a lock.

    ``mac=False`` (benchmarks only) sends zero tags that a ``FrameReader(mac=False)``
    accepts: the same framing, without the MAC's cost.
    """

    def __init__(self, key: bytes, *, mac: bool = True):
        self._base = hmac.new(key, digestmod="sha256") if mac else None
        self.seq = 0

    def stream(self, size: int, payload: memoryview | None = None) -> _FrameStream:
        """Start a frame of ``size`` payload bytes (consumes its sequence number). Given
        the ``payload`` (immutable while it is sent) of a large frame, it is hashed by a
        helper thread, in step with the ``update`` calls."""
        mac = None
        if self._base is not None:
            mac = self._base.copy()
            mac.update(_U64.pack(self.seq))
            if payload is not None and size >= PIPELINE_MIN:
                mac = _MacThread(mac, payload)
        self.seq += 1
        return _FrameStream(_U64.pack(size), mac, size)

    def encode(self, payload) -> list:
        """``[header, payload, tag]`` for one frame; ``payload`` itself is not copied."""
        frame = self.stream(len(payload) if not isinstance(payload, memoryview)
                            else payload.nbytes)
        view = payload if not isinstance(payload, memoryview) else payload.cast("B")
        frame.update(view)
        return [frame.header, payload, frame.tag()]


class FrameReader:
    """Step 6, receiving, sans-IO: ``feed(data)`` returns the payloads completed and
    verified by it, in order (bytes, or a bytearray/memoryview for a large one).

    A large payload (``DIRECT_MIN`` or more) goes into a buffer of its own: while
    ``direct_buffer()`` is not None, ``recv_into`` it and call ``advance(n)``; that avoids a
    copy. Raises PeerAuthError on an oversize length or a wrong tag; after that the reader
    is dead (every later call raises it again).
    """

    def __init__(self, key: bytes, max_frame: int = DEFAULT_MAX_FRAME, *, mac: bool = True):
        self._base = hmac.new(key, digestmod="sha256") if mac else None
        self.max_frame = max_frame
        self.seq = 0
        self._buffer = bytearray()
        self._size = -1          # payload size of the frame being read; -1: reading a header
        self._target = None      # a large payload's buffer (memoryview), or None
        self._own_target = False  # True: _target views a whole bytearray of ours
        self._filled = 0
        self._mac = None
        self._into = None        # the caller's buffer for the next large frame
        self._error: PeerAuthError | None = None
        self.pipeline = True     # hash frames of PIPELINE_MIN or more in a helper thread

    def expect_into(self, buffer) -> None:
        """Receive the next frame's payload into ``buffer`` (a writable buffer at least that
        large); the payload returned is then a memoryview of it."""
        into = memoryview(buffer).cast("B")
        if self._size < 0:
            self._into = into
        elif self._target is not None and self._size <= into.nbytes:  # begun: move it
            into[:self._filled] = self._target[:self._filled]
            self._target = into[:self._size]
            self._own_target = False

    def cancel_into(self) -> None:
        """Forget ``expect_into``'s buffer if no frame went into it."""
        self._into = None

    def _raise(self, text: str):
        self.close()
        self._error = PeerAuthError(text)
        raise self._error

    def _begin_mac(self, base: memoryview | None = None):
        if self._base is None:
            return None
        mac = self._base.copy()
        mac.update(_U64.pack(self.seq))
        if base is not None and base.nbytes >= PIPELINE_MIN and self.pipeline:
            return _MacThread(mac, base)
        return mac

    def _mac_region(self, region) -> None:
        """``region`` of the large payload, ending at ``_filled``, is in place."""
        if isinstance(self._mac, _MacThread):
            self._mac.advance_to(self._filled)
        elif self._mac is not None:
            self._mac.update(region)

    def close(self) -> None:
        """Stop a frame's helper thread, if one runs (the connection is gone)."""
        if isinstance(self._mac, _MacThread):
            self._mac.abort()
        self._mac = None

    def _check(self, mac, tag: bytes) -> None:
        if mac is None:
            ok = tag == bytes(TAG)
        else:
            ok = hmac.compare_digest(mac.digest()[:TAG], tag)
        if not ok:
            self._raise(f"frame {self.seq} failed its integrity check (tampered, replayed, "
                        "reordered or reflected, or the peer's key differs)")
        self.seq += 1

    def direct_buffer(self) -> memoryview | None:
        """Where the next bytes of a large payload go (``recv_into`` it), or None."""
        if self._target is None or self._buffer or self._filled >= self._size:
            return None
        return self._target[self._filled:]

    def advance(self, n: int) -> list:
        """``n`` bytes were received into ``direct_buffer()``; returns completed payloads."""
        if self._error:
            raise self._error
        region = self._target[self._filled:self._filled + n]
        self._filled += n
        self._mac_region(region)
        return self.feed(b"") if self._filled == self._size else []

    def feed(self, data) -> list:
        if self._error:
            raise self._error
        buffer = self._buffer
        if data:
            buffer += data
        out = []
        offset = 0
        end = len(buffer)
        while True:
            if self._size < 0:
                if end - offset < HEADER:
                    break
                (size,) = _U64.unpack_from(buffer, offset)
                if size > self.max_frame:
                    self._raise(f"a frame of {size} bytes was announced; the limit here is "
                                f"{self.max_frame}")
                offset += HEADER
                self._size = size
                if size >= DIRECT_MIN or (self._into is not None and size > 0):
                    if self._into is not None:
                        if self._into.nbytes < size:
                            self._raise(f"a frame of {size} bytes arrived where at most "
                                        f"{self._into.nbytes} were expected")
                        self._target, self._into = self._into[:size], None
                        self._own_target = False
                    else:
                        self._target = memoryview(bytearray(size))
                        self._own_target = True
                    self._filled = 0
                    self._mac = self._begin_mac(self._target)
            if self._target is not None:
                if self._filled < self._size:
                    take = min(self._size - self._filled, end - offset)
                    if take:
                        region = self._target[self._filled:self._filled + take]
                        region[:] = buffer[offset:offset + take]
                        self._filled += take
                        self._mac_region(region)
                        offset += take
                    if self._filled < self._size:
                        break
                if end - offset < TAG:
                    break
                mac, self._mac = self._mac, None
                self._check(mac, bytes(buffer[offset:offset + TAG]))
                offset += TAG
                out.append(self._target.obj if self._own_target else self._target)
                self._target = self._mac = None
                self._size = -1
                continue
            size = self._size
            if end - offset < size + TAG:
                break
            payload = bytes(buffer[offset:offset + size])
            mac = self._begin_mac()
            if mac is not None:
                mac.update(payload)
            self._check(mac, bytes(buffer[offset + size:offset + size + TAG]))
            out.append(payload)
            offset += size + TAG
            self._size = -1
        if offset:
            del buffer[:offset]
        return out


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
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _send_all(sock, data, deadline: float | None = None) -> None:
    """``sendall`` that works on blocking and non-blocking (also TLS) sockets alike."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        try:
            sent = sock.send(view)
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
        n = _recv_some(sock, view[got:], deadline)
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
        self._writer = FrameWriter(keys[0])
        self._reader = FrameReader(keys[1], max_frame)
        self._send_lock = threading.Lock()
        self._ready: collections.deque = collections.deque()
        self._scratch = bytearray(_SCRATCH)
        self._eof = False
        self._closed = False
        self.address = address
        self.role = role
        self.peer_hello: dict = {}
        self.remote_versions: dict = {}
        self.version_warning: str | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"<PeerChannel {self.role or '?'} {self.address} {state} sent="
                f"{self._writer.seq} received={self._reader.seq}>")

    def fileno(self) -> int:
        return self._sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)

    @property
    def tls(self) -> bool:
        return isinstance(self._sock, ssl.SSLSocket)

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
            frame = self._writer.stream(size, view)
            try:
                if size < _JOIN_BELOW:
                    frame.update(view)
                    _send_all(self._sock, frame.header + bytes(view) + frame.tag())
                    return
                _send_all(self._sock, frame.header)
                for start in range(0, size, _SEND_CHUNK):
                    chunk = view[start:start + _SEND_CHUNK]
                    frame.update(chunk)
                    _send_all(self._sock, chunk)
                _send_all(self._sock, frame.tag())
            except BaseException as error:
                frame.abort()
                if not isinstance(error, OSError):
                    raise
                # The frame is half written: the stream cannot be used any more.
                self._close_locked()
                if isinstance(error, ConnectionError):
                    raise PeerClosed(f"the connection to {self.address} broke while "
                                     f"sending: {error}") from error
                raise

    # ---------------------------------------------------------------- receiving
    def _fail(self, error: BaseException):
        self.close()
        raise error

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
        try:
            if direct is not None:
                self._ready.extend(self._reader.advance(n))
            else:
                self._ready.extend(self._reader.feed(memoryview(self._scratch)[:n]))
        except PeerAuthError as error:
            logger.warning("closed the peer connection to %s: %s", self.address, error)
            self._fail(PeerAuthError(f"the connection to {self.address} was closed: {error}"))
        return True

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
        returns: on PeerAuthError its contents must be thrown away."""
        target = memoryview(buffer).cast("B")
        if not self._ready:
            self._reader.expect_into(target)
        try:
            payload = self.recv_bytes(timeout)
        finally:
            self._reader.cancel_into()
        view = memoryview(payload).cast("B")
        if view.nbytes > target.nbytes:
            raise ValueError(f"a frame of {view.nbytes} bytes from {self.address} does not "
                             f"fit the buffer of {target.nbytes} bytes given for it")
        if view.obj is not target.obj:  # small, or begun elsewhere: copy it over
            target[:view.nbytes] = view
        return view.nbytes

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
                    ssl.SSLWantWriteError):
                break
            except OSError as error:
                self._fail(PeerClosed(f"the connection to {self.address} broke: {error}"))
            if n == 0:
                self._eof = True
                self._reader.close()
                break
            try:
                if direct is not None:
                    self._ready.extend(self._reader.advance(n))
                else:
                    self._ready.extend(self._reader.feed(memoryview(self._scratch)[:n]))
            except PeerAuthError as error:
                logger.warning("closed the peer connection to %s: %s", self.address, error)
                self._fail(PeerAuthError(
                    f"the connection to {self.address} was closed: {error}"))
        messages = [pickle.loads(payload) for payload in self._ready]
        self._ready.clear()
        if not messages and (self._eof or self._closed):
            raise PeerClosed(f"{self.address} closed the connection")
        return messages

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

    _close_locked = close

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
                             "handshake (is it a miniray node of this version?).") from None
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
        logger.warning("refused peer %s: it did not finish the handshake within %s s",
                       where, timeout)
        _close(sock)
        raise TimeoutError(f"the peer at {where} did not finish the handshake within "
                           f"{timeout} s") from None
    except PeerAuthError as error:
        logger.warning("refused peer %s: %s", where, error)
        _close(sock)
        raise PeerAuthError(f"refused the peer at {where}: {error}") from None
    except PeerRefused as error:
        logger.warning("refused peer %s: %s", where, error)
        _close(sock)
        raise
    except PeerClosed:
        logger.warning("peer %s closed the connection during the handshake", where)
        _close(sock)
        raise PeerClosed(f"the peer at {where} closed the connection during the "
                         "handshake") from None
    except ssl.SSLError as error:
        logger.warning("refused peer %s: TLS failed: %s", where, error)
        _close(sock)
        raise PeerAuthError(f"refused the peer at {where}: TLS failed: {error}") from None
    except BaseException:
        _close(sock)
        raise


def _local_name(sock) -> str:
    try:
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, TypeError):
        return "this host"


# ----------------------------------------------------------------------- listener support
class HandshakeGate:
    """Runs ``accept`` for each new connection in a short-lived thread, at most
    ``max_pending`` at a time: past that a connection is closed at once (and logged), so
    a flood of slow clients cannot exhaust threads; each one costs at most ``timeout``.

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
                 timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None,
                 name: str = "miniray-peer-handshake"):
        self._token = token
        self._on_channel = on_channel
        self._answer = answer
        self._max_pending = max_pending
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
                    "accepted": self.accepted, "failed": self.failed, "shed": self.shed}

    def submit(self, sock: socket.socket) -> bool:
        """Start the handshake of ``sock`` (which this gate now owns); False if it was shed
        (too many handshakes running, or the gate is closed)."""
        with self._lock:
            admit = not self._closed and len(self._threads) < self._max_pending
            if admit:
                thread = threading.Thread(target=self._run, args=(sock,), daemon=True,
                                          name=self._name)
                self._threads.add(thread)
            else:
                self.shed += 1
        if not admit:
            logger.warning("refused peer %s: %d handshakes are already running",
                           _peer_name(sock), self._max_pending)
            _close(sock)
            return False
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: shed it
            with self._lock:
                self._threads.discard(thread)
                self.shed += 1
            logger.warning("refused peer %s: no thread for its handshake", _peer_name(sock))
            _close(sock)
            return False
        return True

    def _run(self, sock) -> None:
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
            with self._lock:
                self._threads.discard(threading.current_thread())

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
