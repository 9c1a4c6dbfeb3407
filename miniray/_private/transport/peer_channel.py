"""The authenticated channel between miniray hosts, once its handshake is done.

Owns: the channel that sends and receives MAC'd frames after the handshake and HELLO
(``PeerChannel``: blocking, with timeouts, or from a selector loop; large payloads straight
into the caller's buffer; a large value as frames hashed on the MAC pool, ``send_value`` /
``recv_value_into``), the blocking I/O helpers with one deadline that the handshake uses
too, handing a channel over to another process (``PeerChannel.handover`` / ``from_state``:
the fd plus both keys and sequence numbers, for a node's remote worker; a TLS channel's
through a relay, ``tls_relay.py``), ``FramedPeer`` (a channel behind
``framing.FramedSocket``'s interface, for that worker's data and control) and
``closed_by_peer``. Re-exports every name of ``peer_wire.py`` (errors, handshake and frame
classes).
Does not own: opening a channel (``peer_handshake.py``: ``connect``, ``accept``, step 7's
HELLO, a listener's ``HandshakeGate``, the TLS contexts), the wire format
(``peer_wire.py``), or what roles say to each other after the HELLO (the node's join and
heartbeat code).
Called by: ``peer_handshake.py`` (which makes the channels), node/ (joining, heartbeats,
pulls), drivers that reach a remote node, and a remote worker (``FramedPeer``).
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
    "MAGIC", "PROTO_VERSION", "PeerAuthError", "PeerChannel", "PeerClosed", "PeerRefused",
    "ServerHandshake", "closed_by_peer", "derive_keys",
]  # fmt: skip

logger = logging.getLogger(__name__)

_SCRATCH = 1 << 18
_SEND_CHUNK = 1 << 22
_JOIN_BELOW = 1 << 16         # a frame smaller than this is written with one system call
_TLS_PIECE = 1 << 16         # with a send deadline, TLS writes at most this much at once
_FEED_READS = 64              # reads per feed_nonblocking call: a fast peer cannot starve



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

