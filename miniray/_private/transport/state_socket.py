"""The state socket: how any process of the user reads a driver's live state, and how
another driver of its node borrows room in its placement groups' bundles on other nodes.

Owns: the socket each driver listens on, ``<session>/state/<pid>-<start time>.sock``
(AF_UNIX stream, mode 0600, in a private folder), its server thread (``miniray-state``:
one request per connection, answered with one JSON document), the client's request, and
finding the live sockets of a session (a dead driver's socket is removed by whoever finds
it: its pid and start time say it is gone). Both ends check the peer's uid (SO_PEERCRED)
before anything is read. Nothing is written on the task path: a reader asks, the driver
builds its snapshot then (``owner/state_records.py``).
Does not own: what the snapshot holds, nor which sessions exist (``host/session.py``).
Called by: ``runtime.py`` (serve), ``state_api.py`` (ask, find), ``placement_group_loans``
(ask: a borrowing driver's loans, ``remote_bundles`` step 9), ``node/loan_relay.py`` (ask:
a driver of another host's loans and removals, step 10), ``node/group_listing.py`` (ask,
find: pending groups).

Frames: an 8-byte big-endian length, then UTF-8 JSON. The request is ``{"what":
"snapshot"}`` (the state API) or ``{"what": "timeline"}`` (``ray.timeline()``: the spans of
finished tasks) or ``{"what": "pending_groups"}`` (the rows of the placement groups it still
waits to reserve, ``{"placement_groups": [row]}``: its node answering another host's
listing, ``node/group_listing.py``), or a request about one of the driver's placement
groups: a loan of its room (``{"what": "pg_lend" | "pg_return" | "pg_kept" | "pg_drop",
...}``) or, from the driver's own node for a driver of another host, its removal
(``"pg_remove"``), answered by the driver's ``loans(request, peer pid)``, the peer's pid read
from the socket, never from the request (the driver's own node names a driver of another
host in the request: ``node/loan_relay.py``); the answer is that document, or ``{"error":
text}``.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import struct
import threading
from typing import Callable

from miniray._private.host import procinfo, same_uid
from miniray._private.transport.node_client import sun_path

logger = logging.getLogger(__name__)

STATE_DIR = "state"
_HEADER = struct.Struct("!Q")
_MAX_REQUEST = 1 << 16


def socket_path(session_dir: str, pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return os.path.join(session_dir, STATE_DIR, f"{pid}-{procinfo.start_time(pid) or 0}.sock")


def _send(sock: socket.socket, doc) -> None:
    data = json.dumps(doc).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the state socket mid-message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket, limit: int | None = None):
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if limit is not None and size > limit:
        raise ConnectionError(f"state request of {size} bytes refused")
    return json.loads(_recv_exact(sock, size))


class StateServer:
    """Listens on ``path`` and answers each request with ``snapshot()`` (a JSON-able dict),
    on its own thread, so a reader is served even while the driver's threads are busy or
    blocked in ``get()``. ``close()`` stops the thread and removes the socket."""

    GROUP_REQUESTS = ("pg_lend", "pg_return", "pg_kept", "pg_drop", "pg_remove")

    def __init__(self, path: str, snapshot: Callable[[], dict],
                 timeline: Callable[[], dict] | None = None,
                 loans: Callable[[dict, int], dict] | None = None,
                 pending_groups: Callable[[], dict] | None = None):
        self.path = path
        self._answers = {"snapshot": snapshot}
        if timeline is not None:
            self._answers["timeline"] = timeline
        if pending_groups is not None:
            self._answers["pending_groups"] = pending_groups
        self._loans = loans
        same_uid.ensure_private_dir(os.path.dirname(path))
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # 0600 from the start: no window where others may connect
        try:
            with sun_path(path) as name:
                self._listener.bind(name)
        finally:
            os.umask(old)
        self._listener.listen(8)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="miniray-state", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            except (OSError, ValueError):
                return
            if self._wake_r in ready:
                return
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    self._answer(conn)
                except Exception as error:  # one bad reader never stops the server
                    logger.debug("state request failed: %r", error)

    def _answer(self, conn: socket.socket) -> None:
        pid, uid = same_uid.peer_creds(conn)
        if uid != os.getuid():
            logger.warning("refused a state request from uid %d", uid)
            return
        conn.settimeout(10.0)
        request = _recv(conn, _MAX_REQUEST)
        what = request.get("what") if isinstance(request, dict) else None
        answer = self._answers.get(what)
        if what in self.GROUP_REQUESTS and self._loans is not None:
            loans = self._loans

            def answer() -> dict:
                return loans(request, pid)
        if answer is None:
            _send(conn, {"error": f"unknown request {request!r}"})
            return
        try:
            doc = answer()
        except Exception as error:
            doc = {"error": f"the driver could not build its state: {error!r}"}
        _send(conn, doc)

    def close(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=5.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def ask(path: str, timeout: float = 30.0, what: str = "snapshot", **fields) -> dict:
    """The snapshot (or the document ``what`` names, asked with ``fields``) of the driver
    listening on ``path``. ConnectionError (or OSError) if it is gone or does not answer
    within ``timeout`` seconds."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        with sun_path(path) as name:
            sock.connect(name)
        same_uid.require_same_uid_peer(sock, path)
        _send(sock, dict(fields, what=what))
        doc = _recv(sock)
    except socket.timeout:
        raise TimeoutError(f"the driver at {path} did not answer within {timeout:g}s") \
            from None
    finally:
        sock.close()
    if not isinstance(doc, dict):
        raise ConnectionError(f"unexpected answer from {path}")
    return doc


def live_sockets(session_dir: str) -> list[tuple[int, str]]:
    """``(pid, path)`` of each driver of ``session_dir`` that still runs; the sockets of
    drivers that are gone are removed (their pid and start time say so)."""
    folder = os.path.join(session_dir, STATE_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        stem, _, ext = name.partition(".")
        pid_text, _, start_text = stem.partition("-")
        if ext != "sock" or not pid_text.isdigit() or not start_text.isdigit():
            continue
        path = os.path.join(folder, name)
        pid, start = int(pid_text), int(start_text)
        if not procinfo.is_alive(pid, start or None):
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        out.append((pid, path))
    return out
