"""A driver's link to a node on another host: the ``driver`` role, lease, release, spawn.

Owns: one authenticated ``driver`` channel to one remote node (``RemoteNodeClient``), the
request/answer matching of ``node/remote_drivers.py``'s protocol (steps 1-7, 10, 13,
14 and 16 there) from the driver's side, its timeouts, and turning the node's loss into
``NodeDiedError`` naming the node (the link's EOF or a broken frame, a ``fenced`` message,
or ``node_dead`` called by whoever reads the cluster view), and a spawn's four ``attach``
connections (step 8 there).
Does not own: which node to ask (``core/node_pick.py``),
the handshake and frames (``peer_channel.py``), the token (``host/auth_token.py``), or what
a lease is used for (``owner/remote_nodes.py``). The node's unasked ("exited", pid,
status) reports (step 9 there) are kept in ``exited`` as the link is read.
Called by: ``owner/remote_nodes.py`` (tasks on other hosts), ``state_api.py`` (another
node's logs, step 13; every other node's placement groups, step 16) and tests.

Threads: every call is blocking and serialised by one lock: one request is in flight at a
time, and an answer is matched to it by its request number (an answer that arrives after
its request timed out is skipped).

Example::

    client = RemoteNodeClient(("127.0.0.2", 6379), token)
    grant = client.lease({"CPU": 1}, tag="f")      # RemoteGrant, or RemoteDenial
    client.release(grant.lease_id)
    client.close()                                  # the node releases what is left
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field

from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray.exceptions import NodeDiedError

__all__ = ["ROLE_ATTACH", "ROLE_DRIVER", "ROLE_PULL", "RemoteDenial", "RemoteGrant",
           "RemoteLeaseError", "RemoteNodeClient"]

ROLE_DRIVER = "driver"  # the role names on a node's port (node/remote_drivers.py serves them)
ROLE_ATTACH = "attach"
ROLE_PULL = "pull"  # a driver's connection that pulls the results its node keeps for it
ATTACH_ROLES = ("data", "control", "stdout", "stderr")  # node/remote_tickets.py's order
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RemoteGrant:
    """A lease on the remote node's ledger (step 2's GRANT)."""

    lease_id: str
    gpu_ids: list = field(default_factory=list)
    node: str = ""


@dataclass(frozen=True)
class RemoteDenial:
    """The request does not fit on the node now (step 2's DENY): what it had free."""

    available: dict
    node: str = ""


class RemoteLeaseError(ValueError):
    """The node refused a request as wrong (``kind`` "malformed", "unknown_lease",
    "unknown_worker"), as
    impossible there (``kind`` "infeasible": it lacks the resource or has too little in
    total), or could not do it (``kind`` "unsupported", "spawn_failed", "attach_timeout",
    "node"); the message is the node's, naming it."""

    def __init__(self, message: str, kind: str = "malformed"):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):
        return (type(self), (str(self), self.kind))


class RemoteNodeClient:
    """One driver link to the node at ``address`` (see the module docstring).

    Args:
        address: The node's ``(host, port)`` (its ``NodeEntry.ip``/``port``).
        token: The cluster token (``auth_token.load_token()``).
        timeout: Seconds for connecting and for each answer (``TimeoutError`` past it).
        ssl_context: The client TLS context where TLS is on (``peer_handshake.tls_contexts``).
        source_address: The local address to bind (fake hosts on 127.0.0.x).

    Raises (from the constructor): ``peer_channel.PeerAuthError`` (a wrong token, at
    once), ``PeerRefused`` (versions, role), ``OSError``/``TimeoutError`` (unreachable).
    """

    def __init__(self, address: tuple[str, int], token: bytes, *,
                 timeout: float = DEFAULT_TIMEOUT_S, ssl_context=None,
                 source_address: tuple[str, int] | None = None):
        self.address = (address[0], int(address[1]))
        self.name = f"{address[0]}:{address[1]}"
        self.timeout = timeout
        hello = {"driver": {"host": socket.gethostname(), "pid": os.getpid()}}
        self._channel = ph.connect(self.address, token, ROLE_DRIVER, hello=hello,
                                   timeout=timeout, ssl_context=ssl_context,
                                   source_address=source_address)
        self._channel.set_send_timeout(timeout)
        self._connect_args = (token, ssl_context, source_address)
        self.node_id: str = str(self._channel.peer_hello.get("node_id", ""))
        self._lock = threading.Lock()
        self._req = 0
        self._lost: str | None = None  # why the node is gone, once it is
        self.leases: set[str] = set()  # granted here and not released yet
        # Step 9: pid -> wait status of this link's workers that exited, as read so far
        # (the link is read only during calls).
        self.exited: dict[int, int] = {}
        # Step 11: ``(the link's tag, room)`` once the caller asked ``keeps``; None: this
        # link keeps no results (not asked, or a node that keeps none).
        self.kept: tuple[str, int] | None = None

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("closed" if self._channel.closed else "open")
        return f"<RemoteNodeClient {self.name} {state} leases={len(self.leases)}>"

    # -- requests -------------------------------------------------------------------------
    def lease(self, request: dict, tag: str = "", timeout: float | None = None
              ) -> RemoteGrant | RemoteDenial:
        """Step 2: a lease of ``request`` on the node, or a denial with what it has free.
        RemoteLeaseError (malformed, infeasible there), NodeDiedError, TimeoutError."""
        answer = self._call("lease", (dict(request), str(tag)), timeout)
        if answer[0] == "grant" and len(answer) == 4:
            self.leases.add(answer[2])
            return RemoteGrant(lease_id=answer[2], gpu_ids=list(answer[3]), node=self.name)
        if answer[0] == "deny" and len(answer) == 3:
            return RemoteDenial(available=dict(answer[2]), node=self.name)
        raise self._unexpected(answer)

    def release(self, lease_id: str, timeout: float | None = None) -> None:
        """Step 3. RemoteLeaseError (kind "unknown_lease") if the node holds no such lease
        for this link; NodeDiedError, TimeoutError."""
        self.leases.discard(lease_id)
        answer = self._call("release", (lease_id,), timeout)
        if answer[0] != "released":
            raise self._unexpected(answer)

    def ping(self, timeout: float | None = None) -> float:
        """Step 4: the round trip's seconds."""
        t0 = time.perf_counter()
        answer = self._call("ping", (), timeout)
        if answer[0] != "pong":
            raise self._unexpected(answer)
        return time.perf_counter() - t0

    def kill(self, pid: int, timeout: float | None = None) -> None:
        """Step 10: SIGKILL this link's worker ``pid`` on the node (``cancel(force=True)``).
        RemoteLeaseError kind "unknown_worker" if it is not (or no longer) this link's;
        NodeDiedError, TimeoutError."""
        answer = self._call("kill", (int(pid),), timeout)
        if answer[0] != "killed":
            raise self._unexpected(answer)

    def logs(self, query: dict, timeout: float | None = None):
        """Step 13: the node's answer to a logs query about its own session (names by
        kind, or a log's text). RemoteLeaseError kind "no_log" (nothing found) or
        "malformed"; NodeDiedError, TimeoutError."""
        answer = self._call("logs", (dict(query),), timeout)
        if answer[0] != "logs" or len(answer) != 3:
            raise self._unexpected(answer)
        return answer[2]

    def groups(self, timeout: float | None = None) -> dict:
        """Step 14: ``{hex: ledger record}`` of the placement groups reserved in the node's
        ledger now. RemoteLeaseError kind "node" (it cannot read its ledger);
        NodeDiedError, TimeoutError."""
        answer = self._call("groups", (), timeout)
        if answer[0] != "groups" or len(answer) != 3 or not isinstance(answer[2], dict):
            raise self._unexpected(answer)
        return answer[2]

    def group_listing(self, wait_s: float, timeout: float | None = None) -> dict:
        """Step 16: the node's placement groups for a listing here, ``{"reserved": {hex:
        ledger record}, "pending": [row], "missing": [text]}``, the node answering within
        about ``wait_s``. RemoteLeaseError kind "node" or "malformed" (an older node);
        NodeDiedError, TimeoutError."""
        answer = self._call("pg_listing", (float(wait_s),), timeout)
        doc = answer[2] if answer[0] == "pg_listing" and len(answer) == 3 else None
        if (not isinstance(doc, dict) or not isinstance(doc.get("reserved"), dict)
                or not isinstance(doc.get("pending"), list)
                or not isinstance(doc.get("missing"), list)):
            raise self._unexpected(answer)
        return doc

    def spawn(self, timeout: float | None = None) -> tuple[int, list[pc.PeerChannel]]:
        """Step 8: a worker on the node; ``(pid, [data, control, stdout, stderr] channels)``
        (the caller owns the channels). RemoteLeaseError kind "unsupported" from a node that
        runs no workers for remote drivers; NodeDiedError, TimeoutError."""
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            req = self._send("spawn", ())
            answer = self._await(req, "spawn", timeout)
            if answer[0] != "ticket" or len(answer) != 4:
                raise self._unexpected(answer)
            token, ssl_context, source = self._connect_args
            channels: list[pc.PeerChannel] = []
            try:
                for role in ATTACH_ROLES:
                    channels.append(ph.connect(
                        self.address, token, ROLE_ATTACH, hello={"ticket": answer[2],
                                                                 "fd": role},
                        timeout=timeout, ssl_context=ssl_context, source_address=source))
                answer = self._await(req, "spawn", timeout)
            except BaseException:
                for channel in channels:
                    channel.close()
                raise
            if answer[0] != "spawned" or len(answer) != 3:
                for channel in channels:
                    channel.close()
                raise self._unexpected(answer)
            return answer[2], channels

    # -- step 11: results the node keeps for this driver ----------------------------------
    def keeps(self, timeout: float | None = None) -> tuple[str, int] | None:
        """``(the link's tag, its cap)``: its workers may keep large results there under
        that tag while the link's segments stay within the cap (bytes); None from a node of
        a version that keeps none."""
        try:
            answer = self._call("keeps", (), timeout)
        except RemoteLeaseError:
            return None
        if answer[0] != "keeps" or len(answer) != 4 or not isinstance(answer[2], str):
            raise self._unexpected(answer)
        return answer[2], int(answer[3])

    def keep(self, object_id: bytes, path: str, size: int,
             timeout: float | None = None) -> None:
        """The node keeps ``path`` (a worker of this link wrote it) as ``object_id`` for
        this driver; RemoteLeaseError kind "bad_segment" when it does not (it unlinked
        it)."""
        answer = self._call("keep", (object_id, path, int(size)), timeout)
        if answer[0] != "kept":
            raise self._unexpected(answer)

    def free(self, object_ids: list, timeout: float | None = None) -> int:
        """The node unlinks these kept objects (ids it does not keep are skipped)."""
        answer = self._call("free", (list(object_ids),), timeout)
        if answer[0] != "freed" or len(answer) != 3:
            raise self._unexpected(answer)
        return answer[2]

    def grant_key(self, timeout: float | None = None) -> bytes:
        """Step 12: the key of this link's pull grants (``core/pull_grants.py``)."""
        answer = self._call("grant_key", (), timeout)
        if answer[0] != "grant_key" or len(answer) != 3 or not isinstance(answer[2], bytes):
            raise self._unexpected(answer)
        return answer[2]

    def fetch(self, object_id: bytes, size: int, address: tuple, tag: str, grant: bytes,
              timeout: float | None = None) -> str:
        """Step 12: the node gets ``object_id`` (``size`` bytes) from the node at
        ``address``, which keeps it for this driver under ``tag``, with the driver's
        ``grant``; the path of its copy there. RemoteLeaseError kind "fetch_failed"."""
        answer = self._call("fetch", (object_id, int(size), [address[0], int(address[1])],
                                      tag, grant), timeout)
        if answer[0] != "fetched" or len(answer) != 4 or answer[3] != size:
            raise self._unexpected(answer)
        return answer[2]

    def loan(self, what: str, fields: dict, timeout: float | None = None) -> dict:
        """Step 15 there (``owner/placement_group_loans.py``, ``node/loan_relay.py``): a
        loan request (``pg_lend``, ``pg_return``) to the driver of the node
        that holds the group; that driver's answer (a dict)."""
        answer = self._call("pg_loan", (what, dict(fields)), timeout)
        if answer[0] != "pg_loan" or len(answer) != 3 or not isinstance(answer[2], dict):
            raise self._unexpected(answer)
        return answer[2]

    def open_pull(self, tag: str, timeout: float | None = None) -> pc.PeerChannel:
        """A new pull connection for this link (the caller owns and closes it)."""
        self._check()
        token, ssl_context, source = self._connect_args
        channel = ph.connect(
            self.address, token, ROLE_PULL,
            hello={"driver": {"host": socket.gethostname(), "pid": os.getpid()}, "tag": tag},
            timeout=self.timeout if timeout is None else timeout, ssl_context=ssl_context,
            source_address=source)
        channel.set_send_timeout(self.timeout)
        return channel

    def _send(self, op: str, args: tuple) -> int:
        """Under the lock: send a request; its number."""
        self._check()
        self._req += 1
        req = self._req
        try:
            self._channel.send((op, req, *args))
        except (pc.PeerClosed, OSError, TimeoutError) as error:
            raise self._lose(f"sending to it failed ({error})") from None
        return req

    def _call(self, op: str, args: tuple, timeout: float | None) -> tuple:
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            return self._await(self._send(op, args), op, timeout)

    def _await(self, req: int, op: str, timeout: float) -> tuple:
        """Under the lock: the next answer to request ``req``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the node at {self.name} did not answer {op!r} "
                                   f"within {timeout:g} s")
            try:
                answer = self._channel.recv(timeout=left)
            except TimeoutError:
                raise TimeoutError(f"the node at {self.name} did not answer {op!r} "
                                   f"within {timeout:g} s") from None
            except (pc.PeerClosed, pc.PeerAuthError, OSError) as error:
                raise self._lose(f"its link closed ({error})") from None
            if not isinstance(answer, tuple) or len(answer) < 2:
                raise self._unexpected(answer)
            if answer[0] == "fenced":
                raise self._lose(f"it dropped this driver's link: {answer[1]}")
            if answer[0] == "exited" and len(answer) == 3:  # step 9, unasked
                self.exited[answer[1]] = answer[2]
                continue
            if answer[1] != req:
                continue  # the late answer of a request that timed out
            if answer[0] == "error" and len(answer) == 4:
                raise RemoteLeaseError(f"the node at {self.name} refused {op!r}: "
                                       f"{answer[3]}", kind=str(answer[2]))
            return answer

    # -- loss -----------------------------------------------------------------------------
    def _check(self) -> None:
        if self._lost is not None:
            raise NodeDiedError(self._lost)
        if self._channel.closed:
            raise NodeDiedError(f"the link to the node at {self.name} was closed by this "
                                "driver")

    def _lose(self, why: str) -> NodeDiedError:
        if self._lost is None:
            self._lost = (f"The node at {self.name} (node id {self.node_id[:12] or '?'}) is "
                          f"lost: {why}. Its leases for this driver are gone.")
            self.leases.clear()
            self._channel.close()
        return NodeDiedError(self._lost)

    def node_dead(self, reason: str) -> None:
        """The cluster view says the node is dead (NODE_DEAD): later calls raise
        NodeDiedError with ``reason``; the link is closed."""
        self._lose(f"the cluster holds it dead: {reason}")

    @property
    def lost(self) -> str | None:
        return self._lost

    def _unexpected(self, answer) -> Exception:
        return self._lose(f"it answered with {answer!r:.80}, not a miniray node's answer")

    def close(self) -> None:
        """Close the link; the node releases every lease still held (step 5)."""
        self.leases.clear()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
