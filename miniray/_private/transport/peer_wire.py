"""The wire of the host-to-host channel, sans I/O: the token handshake and MAC'd frames.

Owns: the handshake that proves the cluster token in both directions before anything else
is read (``ClientHandshake``, ``ServerHandshake``), the framing that authenticates and
orders every later frame (``FrameWriter``, ``FrameReader``, with a helper thread hashing
large frames beside their I/O, and a large value's frames hashed on the MAC pool), the
keys, and the errors (``PeerAuthError``,
``PeerRefused``, ``PeerClosed``). Nothing here touches a socket: bytes in, bytes out, so
the parsers are fuzzed directly. Does not own: sockets, deadlines, the HELLO and the
blocking API (``transport/peer_channel.py``, which re-exports every name here), the token
(``host/auth_token.py``).
Called by: ``transport/peer_channel.py``; tests.

Threat: anyone who can reach the port (another local user, any host on the LAN). Nothing
is unpickled, and no role acts, before the peer has proven the token; until then every
message has a fixed size. The token never travels.

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

Large payloads: ``FrameWriter.stream`` MACs a payload in step with the caller sending it in
chunks, without copying it; ``FrameReader`` receives a large payload straight into its final
buffer (``direct_buffer`` / ``advance``, used with ``recv_into``), MACing it as it arrives.
A frame of ``PIPELINE_MIN`` bytes or more is hashed by a helper thread (``_MacThread``;
hmac releases the GIL), so the frame costs about max(I/O, hashing), not their sum.

Large values: ``FrameWriter.value`` cuts a value into frames of ``VALUE_FRAME`` (8 MiB),
each an ordinary frame of step 6 (its own sequence number and tag), and has the tags of
the frames ahead computed on the process's MAC pool (``transport/mac_pool.py``) while the
caller sends earlier ones. ``FrameReader.begin_value`` .. ``end_value`` receives the next
frames back to back into one buffer and queues each frame's check on the pool while the
next arrives; ``end_value`` returns once every check passed (PeerAuthError naming the
first frame that failed), and ``abort_value`` leaves no check running on the buffer.
"""

from __future__ import annotations

import collections
import hmac
import secrets
import struct
import threading

from miniray._private.transport.mac_pool import MAC_POOL, MacJob
from miniray.exceptions import AuthenticationError

__all__ = [
    "BAD_TOKEN", "BAD_VERSION", "ClientHandshake", "DECLINE", "DEFAULT_MAX_FRAME",
    "DIRECT_MIN", "FrameReader", "FrameWriter", "HEADER", "HELLO_MAX_FRAME", "MAGIC", "OK",
    "PIPELINE_MIN", "POOL_MIN", "PROTO_VERSION", "PeerAuthError", "PeerClosed",
    "PeerRefused", "ServerHandshake", "TAG", "VALUE_FRAME", "derive_keys",
]  # fmt: skip

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

DEFAULT_MAX_FRAME = 1 << 31   # after authentication: what a peer may send in one frame
#                               (bulk data goes in chunks; pass max_frame for more)
HELLO_MAX_FRAME = 1 << 20     # step 7's frames
DIRECT_MIN = 1 << 20          # payloads this large are received straight into their buffer


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

    _NOT_RUNNING: tuple = ("done",)  # steps in which bytes may not be fed

    def feed(self, data: bytes) -> bytes:
        """Take ``data``; return the bytes to send (possibly none)."""
        if self._step in self._NOT_RUNNING:
            raise PeerAuthError("miniray bug: bytes fed to a handshake not running")
        self._buffer += data
        out = b""
        while not self.done:
            message = self._take()
            if message is None:
                break
            out += self._on_message(message)
        return out

    def _on_message(self, message: bytes) -> bytes:
        """One step's whole message in; the bytes it answers with out."""
        raise NotImplementedError

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

    def _on_message(self, message: bytes) -> bytes:
        if self._step == "hello":
            magic, version, cn = _CLIENT_HELLO.unpack(message)
            if magic != MAGIC:
                if message[:2] == b"\x16\x03":  # a TLS handshake record
                    raise self._fail("it speaks TLS and this node does not: turn TLS "
                                     "on for both or neither (MINIRAY_USE_TLS)")
                raise self._fail(f"it is not a miniray peer (its first bytes are "
                                 f"{message[:8]!r})")
            if version != PROTO_VERSION:
                raise self._fail(
                    f"it speaks peer protocol {version}, this node speaks "
                    f"{PROTO_VERSION}: run the same miniray version on every host",
                    BAD_VERSION + _U16.pack(PROTO_VERSION), PeerRefused)
            self._cn = cn
            self._step = "proof"
            return OK + self._nonce + _mac(self._token, b"S", cn, self._nonce)
        # "proof"
        if hmac.compare_digest(message, DECLINE):
            raise self._fail("it holds another token (it could not verify this "
                             "node's proof)")
        expected = _mac(self._token, b"C", self._cn, self._nonce)
        if not hmac.compare_digest(message, expected):
            raise self._fail("its token proof is wrong (it holds another token)", BAD_TOKEN)
        k_c2s, k_s2c = derive_keys(self._token, self._cn, self._nonce)
        self.keys = (k_s2c, k_c2s)
        self._step = "done"
        return OK


class ClientHandshake(_Handshake):
    """Steps 1-5, the connecting side: send ``start()``, then feed what arrives (exactly
    ``wants`` bytes at a time) and send what ``feed`` returns, until ``done``."""

    _NOT_RUNNING = ("new", "done")

    def __init__(self, token: bytes, *, nonce: bytes | None = None):
        super().__init__(token, nonce)
        self._step = "new"

    def start(self) -> bytes:
        self._step = "status"
        return _CLIENT_HELLO.pack(MAGIC, PROTO_VERSION, self._nonce)

    def _need(self) -> int:
        return {"status": 1, "version": _U16.size, "proof": NONCE + PROOF,
                "verdict": 1}.get(self._step, 0)

    def _on_message(self, message: bytes) -> bytes:
        if self._step == "status":
            if message == OK:
                self._step = "proof"
            elif message == BAD_VERSION:
                self._step = "version"
            else:
                raise self._fail(f"it answered {message!r}, not a miniray node's handshake")
            return b""
        if self._step == "version":
            (version,) = _U16.unpack(message)
            raise self._fail(f"it speaks peer protocol {version}, this process speaks "
                             f"{PROTO_VERSION}: run the same miniray version on every "
                             "host", cls=PeerRefused)
        if self._step == "proof":
            sn, proof = message[:NONCE], message[NONCE:]
            expected = _mac(self._token, b"S", self._nonce, sn)
            if not hmac.compare_digest(proof, expected):
                raise self._fail("it did not prove this cluster's token (it holds "
                                 "another token, or it is not your node)", DECLINE)
            k_c2s, k_s2c = derive_keys(self._token, self._nonce, sn)
            self.keys = (k_c2s, k_s2c)
            self._step = "verdict"
            return _mac(self._token, b"C", self._nonce, sn)
        # "verdict"
        if message == OK:
            self._step = "done"
            return b""
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
        self._woken = 0      # _end when the thread was last woken
        self._stop = False   # no more advance_to: finish what was given, then exit
        self._abort = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="miniray-peer-mac")
        self._thread.start()

    def advance_to(self, end: int) -> None:
        with self._cond:
            self._end = end
            # Wake the thread once per _MAC_BATCH bytes, not per recv: fewer switches.
            if end - self._woken >= _MAC_BATCH:
                self._woken = end
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
                base = self._base
            self._mac.update(base[done:end])
            done = end

    def rebase(self, base: memoryview) -> None:
        """The payload moved to ``base`` (its bytes so far copied there): hash from it."""
        with self._cond:
            self._base = base

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


PIPELINE_MIN = 8 << 20  # a frame this large is hashed by a _MacThread; a value this large
#                         is hashed on MAC_POOL
_MAC_BATCH = 1 << 20    # bytes made final between two wake-ups of the _MacThread
VALUE_FRAME = 8 << 20   # a value's frames (``FrameWriter.value``), each with its own tag
POOL_MIN = 1 << 20      # a value's frame this large or more is hashed on MAC_POOL


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

    def value(self, view: memoryview, frame: int = VALUE_FRAME) -> _ValueOut:
        """The frames of one value, ``view`` (bytes, immutable while it is sent), of at most
        ``frame`` bytes each: iterate for ``(header, payload, job)``, send header and
        payload, then ``job.result()[:TAG]`` (or zero bytes without a MAC; ``tag_of``).
        The tags of the frames ahead are computed on ``MAC_POOL`` while earlier frames
        are sent (each frame consumes its sequence number as it is prepared); call
        ``abort()`` if the value is given up."""
        return _ValueOut(self, view, frame)

    def _job(self, payload: memoryview) -> MacJob:
        """The MAC of the next frame, ``payload``, as a job (consumes its sequence number)."""
        mac = None
        if self._base is not None:
            mac = self._base.copy()
            mac.update(_U64.pack(self.seq))
        job = MacJob(mac, payload, self.seq)
        self.seq += 1
        return job

    def encode(self, payload) -> list:
        """``[header, payload, tag]`` for one frame; ``payload`` itself is not copied."""
        frame = self.stream(len(payload) if not isinstance(payload, memoryview)
                            else payload.nbytes)
        view = payload if not isinstance(payload, memoryview) else payload.cast("B")
        frame.update(view)
        return [frame.header, payload, frame.tag()]


def tag_of(job: MacJob) -> bytes:
    """A frame's tag from its finished job: the MAC's first ``TAG`` bytes, or zero bytes
    for a writer or reader without a MAC."""
    digest = job.result()
    return digest[:TAG] if digest is not None else bytes(TAG)


class _ValueOut:
    """``FrameWriter.value``'s frames. At most ``ahead`` frames beyond the one being sent
    are prepared (and their jobs queued on the pool) at any time: enough to keep the pool
    busy, few enough that a failed send wastes little hashing."""

    def __init__(self, writer: FrameWriter, view: memoryview, frame: int):
        self._writer = writer
        self._view = view
        self._frame = max(1, int(frame))
        self._next = 0
        self._ahead: collections.deque = collections.deque()
        self._current: MacJob | None = None
        self._pooled = writer._base is not None and view.nbytes >= PIPELINE_MIN
        self._depth = 2 * MAC_POOL.size if self._pooled else 0

    def _prepare(self) -> None:
        start = self._next
        end = self._next = min(start + self._frame, self._view.nbytes)
        payload = self._view[start:end]
        job = self._writer._job(payload)
        if self._pooled and payload.nbytes >= POOL_MIN:
            MAC_POOL.submit(job)
        self._ahead.append((_U64.pack(payload.nbytes), payload, job))

    def __iter__(self):
        size = self._view.nbytes
        ahead = self._ahead
        while self._next < size or ahead:
            while self._next < size and len(ahead) <= self._depth:
                self._prepare()
            item = ahead.popleft()
            self._current = item[2]
            yield item
            self._current = None

    def abort(self) -> None:
        """Give the rest up: no job of this value runs or holds its view after this."""
        jobs = [job for _, _, job in self._ahead]
        if self._current is not None:
            jobs.append(self._current)
        self._ahead.clear()
        self._current = None
        for job in jobs:
            job.cancel()


class _ValueIn:
    """A value being received by ``FrameReader.begin_value``: its buffer, how many bytes
    its frames announced so far and how many arrived whole, and the pool's jobs that
    check them, in order (``checked``: how many of them were found good)."""

    __slots__ = ("view", "size", "announced", "received", "jobs", "checked", "pooled",
                 "frames")

    def __init__(self, view: memoryview, pooled: bool):
        self.view = view
        self.size = view.nbytes
        self.announced = 0
        self.received = 0
        self.frames = 0
        self.jobs: list[MacJob] = []
        self.checked = 0
        self.pooled = pooled


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
        self._error = ""         # why the reader is dead ("" while it is not)
        self.pipeline = True     # hash frames of PIPELINE_MIN or more in a helper thread,
        #                          and a value's frames on MAC_POOL
        self._value: _ValueIn | None = None  # the value ``begin_value`` receives
        self._in_value = False   # the frame being read is one of the value's
        self._pooled = False     # ... and its tag is checked on MAC_POOL

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
            if isinstance(self._mac, _MacThread):
                self._mac.rebase(self._target)

    def cancel_into(self) -> None:
        """Forget ``expect_into``'s buffer if no frame went into it."""
        self._into = None

    # A value (``begin_value`` .. ``end_value``): the frames that follow, whatever their
    # sizes, fill ``buffer`` back to back. Each frame's tag is checked on MAC_POOL while
    # the next frame is received (frames of POOL_MIN or more of a value of PIPELINE_MIN or
    # more; others here, as they arrive); ``end_value`` waits for every check. Nothing in
    # the buffer may be used before ``end_value`` returned: until then it holds unchecked
    # bytes. One thread calls these (the receiving one), never ``close`` meanwhile from
    # another (``abort_value`` is that thread's, in its ``finally``).
    def begin_value(self, buffer) -> None:
        """Receive the next frames into ``buffer`` (writable; exactly filled: a frame
        past its end is refused) instead of returning them. A frame already begun
        becomes the value's first (its bytes so far moved into ``buffer``)."""
        if self._error:
            raise PeerAuthError(self._error)
        view = memoryview(buffer).cast("B")
        pooled = (self._base is not None and self.pipeline and view.nbytes >= PIPELINE_MIN
                  and MAC_POOL.size > 0)
        value = self._value = _ValueIn(view, pooled)
        if self._size < 0:
            return
        size = self._size
        if size > value.size:
            self._raise(f"a frame of {size} bytes arrived where at most {value.size} "
                        "bytes of a value were expected")
        region = view[:size]
        if self._target is not None:  # a large frame begun in a buffer of its own
            region[:self._filled] = self._target[:self._filled]
            if isinstance(self._mac, _MacThread):
                self._mac.rebase(region)
        else:  # a small frame's bytes so far wait in the buffer: copied as fed
            self._filled = 0
            self._mac = self._begin_mac()
        self._target, self._own_target = region, False
        value.announced = size
        self._in_value, self._pooled = True, False

    def value_done(self) -> bool:
        """Every frame of the value arrived whole (their checks may still run)."""
        value = self._value
        return value is None or value.received >= value.size

    @property
    def value_frames(self) -> int:
        """How many frames of the value arrived whole so far."""
        return self._value.frames if self._value is not None else 0

    def end_value(self) -> None:
        """Wait for every check of the value (running a queued one here); PeerAuthError
        naming the first frame that failed (the reader is dead then). On return the buffer
        holds the value's bytes, each checked."""
        value = self._value
        if value is None:
            return
        if value.received < value.size:
            raise ValueError("miniray bug: end_value before the value's last frame")
        try:
            for job in value.jobs[value.checked:]:
                job.result()
            self._check_value(value)
        finally:
            self.abort_value()

    def abort_value(self) -> None:
        """Forget the value: its queued checks never run, running ones are waited for, so
        no thread uses its buffer after this. Idempotent."""
        value, self._value = self._value, None
        if value is None:
            return
        for job in value.jobs[value.checked:]:
            job.cancel()
        value.jobs.clear()
        if self._in_value:  # cut short within a frame: the reader cannot go on
            self._in_value = False
            self._target = None
            if isinstance(self._mac, _MacThread):
                self._mac.abort()
            self._mac = None

    def _check_value(self, value: _ValueIn) -> None:
        """Look at the value's checks that finished, in order; raise on the first bad."""
        jobs = value.jobs
        while value.checked < len(jobs) and jobs[value.checked].done:
            job = jobs[value.checked]
            if not hmac.compare_digest(job.result()[:TAG], job.tag):
                self._raise(f"frame {job.seq} failed its integrity check (tampered, "
                            "replayed, reordered or reflected, or the peer's key differs)")
            value.checked += 1

    def _value_frame_done(self, tag: bytes) -> None:
        """The value's current frame and its tag arrived: check it, or queue its check."""
        value = self._value
        if self._pooled:
            mac = self._base.copy()
            mac.update(_U64.pack(self.seq))
            job = MacJob(mac, self._target, self.seq, tag)
            value.jobs.append(job)
            MAC_POOL.submit(job)
            self.seq += 1
            self._check_value(value)  # an earlier frame found bad: stop now, not at the end
        else:
            mac, self._mac = self._mac, None
            self._check(mac, tag)
        value.received += self._size
        value.frames += 1

    def _raise(self, text: str):
        self.close()
        self._error = text  # the text only: a kept exception's traceback would keep the
        raise PeerAuthError(text)  # frames' buffers (a segment's mapping) alive

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
            raise PeerAuthError(self._error)
        region = self._target[self._filled:self._filled + n]
        self._filled += n
        self._mac_region(region)
        return self.feed(b"") if self._filled == self._size else []

    def feed(self, data) -> list:
        if self._error:
            raise PeerAuthError(self._error)
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
                value = self._value
                if value is not None and value.announced < value.size:
                    left = value.size - value.announced
                    if size > left:
                        self._raise(f"a frame of {size} bytes arrived where at most {left} "
                                    "bytes of a value were left")
                    self._target = value.view[value.announced:value.announced + size]
                    self._own_target = False
                    value.announced += size
                    self._filled = 0
                    self._in_value = True
                    self._pooled = value.pooled and size >= POOL_MIN
                    self._mac = None if self._pooled else self._begin_mac()
                elif size >= DIRECT_MIN or (self._into is not None and size > 0):
                    if self._into is not None:
                        if self._into.nbytes < size:
                            self._raise(f"a frame of {size} bytes arrived where at most "
                                        f"{self._into.nbytes} were expected")
                        self._target, self._into = self._into[:size], None
                        self._own_target = False
                    else:
                        try:
                            self._target = memoryview(bytearray(size))
                        except MemoryError:
                            self._raise(f"a frame of {size} bytes was announced; there is "
                                        "not enough memory here to receive it")
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
                tag = bytes(buffer[offset:offset + TAG])
                offset += TAG
                if self._in_value:
                    self._value_frame_done(tag)
                    self._in_value = False
                else:
                    mac, self._mac = self._mac, None
                    self._check(mac, tag)
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
