"""Opening an authenticated channel between miniray hosts: connect, accept, and a listener's
bound on handshakes.

Owns: running the handshake of ``peer_wire.py`` on a socket with one deadline (``connect``,
``accept``) and the HELLO that follows it (step 7 below), the bound on concurrent handshakes
of a listener (``HandshakeGate``), the rate of refusal lines per peer host (``RefusalLog``),
and the TLS contexts (``client_ssl_context``, ``server_ssl_context``, ``tls_contexts``).
Does not own: the channel those return (``peer_channel.PeerChannel``, its blocking I/O
helpers), the wire format (``peer_wire.py``), the token and TLS settings
(``host/auth_token.py``), the version rule (``core/protocol.version_policy``), listening
sockets, or what roles say to each other after the HELLO (the node's join and heartbeat
code).
Called by: node/ (its listener's gate, joining, pulls) and drivers that reach a remote node
(``transport/remote_node.py``, ``owner/actor_link.py``).

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

import logging
import pickle
import socket
import ssl
import threading
import time
from typing import Callable

from miniray._private.core import protocol
from miniray._private.host import auth_token
from miniray._private.host.auth_token import AuthTokenError
from miniray._private.transport.peer_channel import (
    PeerChannel,
    _close,
    _peer_name,
    _recv_exactly,
    _send_all,
)
from miniray._private.transport.peer_wire import (
    DEFAULT_MAX_FRAME,
    HELLO_MAX_FRAME,
    ClientHandshake,
    PeerAuthError,
    PeerClosed,
    PeerRefused,
    ServerHandshake,
)

__all__ = ["ADVICE", "HandshakeGate", "RefusalLog", "accept", "client_ssl_context", "connect",
           "server_ssl_context", "tls_contexts"]

logger = logging.getLogger(__name__)

ADVICE = ("Check that every node and driver has the same token: `miniray get-auth-token` on "
          "the head prints it; set MINIRAY_AUTH_TOKEN (or a 0600 file named by "
          "MINIRAY_AUTH_TOKEN_PATH) to it.")


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
