"""Drivers on other hosts: the ``driver`` role on a node's TCP port, leasing this node's ledger.

Owns: the links of remote drivers (after the handshake), their leases on this node's ledger
(and, for physical GPUs, the host GPU ledger, both or neither: ``owner/leases.LeaseBook``),
which lease belongs to which link, releasing them all when a link closes, fencing (every
link closed and every lease released at once, when the head holds this node dead), and the
pure checks of what a remote driver sends (``check_request``, ``parse_message``,
``DriverLeases``), results kept for each link's driver (step 11, the book in
``kept_objects.py``). Does not own: the TCP listener, the handshake gate and the role check
(``peering.py``, which hands each authenticated ``driver`` channel to ``RemoteDrivers.add``
and calls ``fence`` when it is declared dead), the ledger's file (``ledger.py``), the
driver's side (``transport/remote_node.py``), or forking workers (the spawner hook: the
node's fork server, ``node.NodeServer._remote_spawn``; this module keeps which worker is
whose, kills them with their link and reports their exits).
Called by: ``peering.Peering`` on the node's selector loop (single-threaded: nothing here
locks, every ledger call is a short file transaction); step 11's pull threads only read
the book (one dict lookup) and map a segment.

Holder: every remote lease is taken with ``holder_pid`` = this node's pid (a remote pid
means nothing here) and a tag naming the driver (``remote driver <ip> pid <pid>: <tag>``),
so ``miniray status`` on this host lists them, and a node that dies leaves leases the next
writer reclaims as a dead holder's. Which link holds which lease is this module's book.

Protocol, driver D -> node N, role "driver" on N's port (after peer_channel's steps 1-7;
every message is a pickled tuple in one MAC'd frame, checked for shape before use)::

    1. D connects with role "driver", hello {"driver": {"host": str, "pid": int}}. N's
       handshake thread refuses a hello without that shape, naming it (PeerRefused at D).
    2. D -> N ("lease", req, request, tag): request {name: amount >= 0}, tag a short str.
       N checks it (``check_request``): a malformed request, a negative or non-finite
       amount, a resource N lacks or more of it than N has in total is answered
       ("error", req, kind, text), kind "malformed" or "infeasible"; the link stays.
       Otherwise N acquires on its ledger: ("grant", req, lease_id, gpu_ids), or
       ("deny", req, available) when it does not fit now.
    3. D -> N ("release", req, lease_id): ("released", req, lease_id); a lease id this
       link does not hold (unknown, released already, another driver's) is answered
       ("error", req, "unknown_lease", text).
    4. D -> N ("ping", req): ("pong", req, node_id): a round trip for liveness and tests.
    5. The link closes (EOF, a frame that fails its MAC, a send that cannot finish within
       SEND_TIMEOUT_S, or TCP keepalive: a driver's host that crashed or was cut off is
       noticed after ``MINIRAY_NODE_DEAD_AFTER_S`` of silence plus 3 probes 1 s apart,
       ``keepalive_settings``): N releases every lease of that link. Nothing else of D stays on
       N. N stopping sends ("fenced", "the node is stopping ...") first, as in step 6.
    6. Fencing: the head holds N dead (it missed heartbeats) or N went ``dead_after``
       without an answer from it. Before N rejoins as a new incarnation, N sends each
       driver ("fenced", reason), closes every link and releases every lease: work placed
       here may already run elsewhere, and must not run twice. Until N has rejoined
       (``resume``), a new driver link gets ("fenced", reason) at once and is closed: a
       driver with an old view cannot place work on a node the head holds dead.
    7. Anything else (an unknown tag, a message that is not a tuple) is answered
       ("error", req or None, "malformed", text); nothing a driver sends can stop N.
    8. Spawn tickets (the start of remote workers): D -> N ("spawn", req). Without a
       spawner (a node not wired to its fork server: tests) N answers
       ("error", req, "unsupported", text). With one: ("ticket", req, ticket, ttl_s), a
       random secret (``remote_tickets.TicketBook``; at most 16 open per link). D then
       opens four more connections to N, role "attach", hello {"ticket", "fd"}, fd one of
       data, control, stdout, stderr, each with its own handshake, from the driver link's
       host. When the fourth arrived, N hands the four channels (sockets and frame keys:
       never on the wire) to the spawner (with TLS on, each connection's session stays
       in N: the worker gets a socketpair's end that a thread of N relays to it,
       ``transport/tls_relay.py``) and answers on the driver link
       ("spawned", req, pid) or ("error", req, "spawn_failed", text). A ticket not
       complete within ttl_s: ("error", req, "attach_timeout", text), and its connections
       are closed; an attach that does not match a ticket is closed at once. The driver
       link closing closes its tickets' connections too.
    9. A spawned worker's exit (reaped by the node's fork server): N gives back what it
       reserved in the link's budget file for results it never wrote (step 11), then
       N -> D ("exited", pid, wait_status) on the link that asked for it. The link
       closing (step 5) or fencing (step 6) SIGKILLs every worker of that link: nothing
       of D keeps running on N.
       The worker speaks MAC'd frames on its data and control connections itself
       (``worker_main.run_forked``, ``remote``); stdout and stderr are plain bytes, which
       a relay thread of N copies to D, TLS or not, and into N's session's
       ``logs/worker-<pid>.out/.err`` (``tls_relay.py``, ``worker_logs.LogTee``).
   10. D -> N ("kill", req, pid) (``cancel(force=True)`` of the task it runs): N SIGKILLs
       that worker through its fork server and answers ("killed", req, pid); its exit
       follows as step 9. A pid that is not a worker of this link (another driver's, one
       that exited, any other process) is answered ("error", req, "unknown_worker", text)
       and nothing is signalled.
   11. Results kept for the link (``kept_objects.KeptObjects``; docs/remote-objects.md).
       Each link gets a segment tag when it is served (``new_session_tag`` with this
       node's pid and root). D -> N ("keeps", req): ("keeps", req, tag, cap), cap the
       bytes one link may keep (``MINIRAY_KEPT_BYTES_PER_DRIVER``, default a quarter of
       the shm dir's size); D hands both to its workers here in HELLO, which write a
       large result as ``mr_<tag>_<object id>`` in this node's shm dir once they
       reserved its bytes within the cap in the link's budget file
       (``object_store/kept_budget.py``, made here when the link is served, released
       here when an object is freed or refused; else the worker sends the value at once,
       as when the shm dir is full, and the book never passes the cap). D -> N
       ("keep", req, object_id, path, size): N books it for the link after
       ``check_adoptable`` (the link's tag, its shm dir, a regular file of this uid, the
       size): ("kept", req), else ("error", req, "bad_segment", text) and N unlinks it
       if it is the link's. D -> N ("free", req, [object_id]): unlinked, ("freed", req,
       n) (ids it does not keep are skipped). A connection with role "pull" (hello
       {"driver", "tag"}: the tag of a served link, else closed at once; at most
       ``kept_serving.MAX_PULLS_PER_LINK``, past which its ask is read and answered
       ("error", req, "busy", text), then it is closed) is served by a thread of its own, never the
       loop: ("pull", req, object_id) -> ("pulling", req, size) and the bytes in frames from the
       segment's read-only mapping, or ("error", req, "unknown_object", text) for an
       object this link does not keep. Step 5 and fencing unlink every object of the
       link, sweep its tag (a worker's segment not booked yet) and close its pulls: a
       driver that dies leaves nothing here.
   12. Node-to-node fetch (docs/remote-objects.md, "Tasks given a kept result"): D runs a
       task (or an actor call) on this node M whose argument N keeps for D, and M gets it
       from N directly:
       1. D -> N ("grant_key", req): ("grant_key", req, key), the random key
          (``pull_grants.new_key``) N made for D's link when it was served; it never
          leaves N but on that link.
       2. D -> M ("fetch", req, object_id, size, [N ip, N port], N's tag for D, grant),
          grant = ``pull_grants.grant(key, object_id, M's node id, M's ip)``, on one of
          D's step-11 pull connections to M (its thread hands the ask to the loop and
          waits for the answer, ``_fetch_on_pull``: D's link is never held for the
          transfer; a peer's granted connection may not ask), or on the link itself
          (answered there, on the loop).
       3. M answers at once ("fetched", req, path, size) when it keeps the object for D's
          link already; ("error", req, "fetch_failed", text) when its size would pass the
          link's cap (reserved in the link's budget file as a worker's keep is, given back
          on any failure below: D then sends the value itself); else a thread of M (never
          the loop; one per object and link, later fetches of it wait for its answer; at
          most ``kept_serving.MAX_PULLS_PER_LINK`` per link)
          connects to N's port as in step 11, role "pull", hello {"driver": {M's host,
          M's pid}, "tag": N's tag, "peer": {"node_id": M's id, "object_id": object_id,
          "grant": grant}}.
       4. N (``pull``, on its loop) checks the grant under that link's key against the
          hello's object and node id and the connection's source IP
          (``pull_grants.check_grant``) and closes the connection if it fails; such a
          connection pulls that object only (anything else: ("error", req,
          "unknown_object", text)).
       5. M -> N ("pull", 1, object_id): step 11's answer and frames, received straight
          into segment ``mr_<M's tag for D's link>_<object id>`` of M's shm dir (its pages
          reserved first: no room is an error, never a SIGBUS).
       6. On M's loop: M books it for D's link (``KeptObjects.add``) and answers
          ("fetched", req, path, size) where each ask came (the link, or the pull
          connection's thread); any failure (N unreachable or refusing, EOF, a
          frame late by ``kept_serving.PULL_SEND_TIMEOUT_S``, another size, no room, D's link gone
          meanwhile) unlinks the segment and answers ("error", req, "fetch_failed",
          text). M's copy is D's like any object kept for its link: D's ("free", ...)
          and the link's end free it.
       7. D records M's copy beside N's: freeing the object frees both. The task's (or
          the actor's) worker on M reads ("shm", path, size) there.
   13. Logs (``ray.util.state.list_logs``/``get_log`` with another host's node_id): D ->
       N ("logs", req, query), query ``{"what": "list", "glob"}``, ``{"what": "get",
       "filename" | "actor_id" | "pid", "suffix", "tail"}`` or ``{"what": "follow", ...,
       "state"}`` (one step of a follow, asked again on the same link every poll):
       ("logs", req, names by kind, text, or [text, next state]) from N's own session's
       ``logs/`` (``worker_logs.answer_query``: read-only,
       worker files only, at most ``MAX_ANSWER_CHARS`` of text), else ("error", req,
       "no_log" or "malformed", text). Its remote workers' files are there too (the
       node's relay tees their stdout and stderr: ``transport/tls_relay.py``).
   14. Placement groups reserved here (the actor service of another node holding
       actors in room a driver of N lent asks whether that driver's group lives:
       ``RemoteNodeClient.groups``, ``owner/placement_group_nodes._lenders_gone``; a
       driver on another host finds a driver's group: ``owner/far_groups.py``; a listing
       asks step 16):
       D -> N ("groups", req) -> ("groups", req, {hex: ledger record}): the groups
       reserved in N's ledger now (one lock-free read), else ("error", req, "node",
       text).
   15. Loans of room in a group of a driver of N to D (``loan_relay.py``; D found it
       by step 14, ``owner/far_groups.py``; ``remote_bundles`` step 10): D -> N
       ("pg_loan", req, what, fields), what "pg_lend" (fields: pg, index, base; an
       actor's: actor, held too), "pg_return" (pg, loan), "pg_kept" (pg, actor, kept:
       whether the actor service took the actor lent room) or "pg_remove" (pg: D's
       ``remove_placement_group``, which that driver runs as its own). N asks the driver
       of N holding group pg (its lease's holder here) on that driver's state socket,
       from a thread, naming the
       borrower by this link (``loan_relay.borrower``: never what D says of itself),
       and answers ("pg_loan", req, doc), doc that driver's answer (``{"loan": ...}``,
       ``{"removed": bool}``; ``{"loan": None}`` when no driver of N holds the group, or
       ``{"error": text}``; a removal whose driver does not listen there N does itself,
       releasing the group in its ledger); other requests in the meantime are answered
       as they come. The link closing (step 5, fencing) tells each driver asked on it
       ("pg_drop", the borrower): the loans it made to D come back.
   16. This node's placement groups for a listing on another host
       (``ray.util.state.list_placement_groups``, ``miniray list placement-groups``:
       ``state_api._far_groups`` asks every other alive node of its view):
       D -> N ("pg_listing", req, wait_s), wait_s the seconds D waits (a finite number
       > 0, else ("error", req, "malformed", text)). A thread of N (``group_listing.py``)
       asks each live driver of N's session for the rows of the groups it still waits to
       reserve, within half of wait_s; then, on the loop, N answers ("pg_listing", req,
       {"reserved": {hex: ledger record}, "pending": [row], "missing": [text]}): the
       groups reserved in N's ledger now (read after the drivers answered), the drivers'
       rows, and why a driver's rows are not there; else ("error", req, "node", text).
       Other requests in the meantime are answered as they come.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import socket
import time
from typing import TYPE_CHECKING, Any, Iterable

from miniray._private.core import config, pull_grants
from miniray._private.host import session, worker_logs
from miniray._private.node.group_listing import GroupListing, check_wait
from miniray._private.node.kept_objects import KeptObjects
from miniray._private.node.kept_serving import (
    KeptServing,
    fetch_shape,
    lazy_budget,
    lazy_segments,
    peer_ip,
)
from miniray._private.node.loan_relay import LoanRelay, check_fields
from miniray._private.node.remote_tickets import ATTACH_ROLES, TicketBook
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.remote_node import ROLE_ATTACH, ROLE_DRIVER

if TYPE_CHECKING:
    from miniray._private.owner.leases import LeaseBook

__all__ = [
    "ROLE_ATTACH", "ROLE_DRIVER", "DriverLeases", "RemoteDrivers", "check_attach_hello",
    "check_hello", "check_pull_hello", "check_request", "keepalive_settings", "parse_message",
]  # fmt: skip

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 4.0
MAX_LEASES_PER_DRIVER = 4096  # a bound on the book of one link (zero-resource leases)
MAX_TAG = 200
TICKET_TTL_S = 10.0
MAX_COMPLAINTS = 5  # malformed messages logged per link; all are answered


# ------------------------------------------------------------------------ pure decisions
def check_hello(hello: dict) -> str | None:
    """Step 1: None if the hello names a driver ``{"host": str, "pid": int}``, else the
    refusal text."""
    driver = hello.get("driver") if isinstance(hello, dict) else None
    if (not isinstance(driver, dict) or not isinstance(driver.get("host"), str)
            or not isinstance(driver.get("pid"), int) or isinstance(driver.get("pid"), bool)):
        return ("a driver's hello must carry {'driver': {'host': str, 'pid': int}}: "
                "connect with miniray's RemoteNodeClient of the same version")
    return None


def keepalive_settings(dead_after: float) -> dict[str, int]:
    """Step 5's TCP keepalive for a driver link: probes after ``dead_after`` seconds of
    silence (at least 1), 3 of them 1 s apart; unacknowledged data gives up at the same
    bound (TCP_USER_TIMEOUT, ms).

    >>> keepalive_settings(5.0)
    {'idle': 5, 'interval': 1, 'count': 3, 'user_timeout_ms': 8000}
    """
    idle = max(1, int(math.ceil(dead_after)))
    return {"idle": idle, "interval": 1, "count": 3, "user_timeout_ms": (idle + 3) * 1000}


def _set_keepalive(fd: int, settings: dict[str, int]) -> None:
    """Apply ``keepalive_settings`` to the TCP socket behind ``fd`` (a dup: options belong to
    the socket, not the descriptor). Options this kernel lacks are skipped."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a socketpair in tests
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, key in (("TCP_KEEPIDLE", "idle"), ("TCP_KEEPINTVL", "interval"),
                          ("TCP_KEEPCNT", "count"), ("TCP_USER_TIMEOUT", "user_timeout_ms")):
            option = getattr(socket, name, None)
            if option is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, option, settings[key])
    except OSError as error:
        logger.warning("could not set TCP keepalive on a driver link: %s", error)
    finally:
        sock.close()


def check_attach_hello(hello: dict) -> str | None:
    """Step 8: None if an attach hello is ``{"ticket": str, "fd": one of ATTACH_ROLES}``,
    else the refusal text."""
    ticket = hello.get("ticket") if isinstance(hello, dict) else None
    fd = hello.get("fd") if isinstance(hello, dict) else None
    if not isinstance(ticket, str) or not 16 <= len(ticket) <= 128 or fd not in ATTACH_ROLES:
        return (f"an attach hello must carry {{'ticket': str, 'fd': one of {ATTACH_ROLES}}}: "
                "connect with miniray's RemoteNodeClient of the same version")
    return None


def check_request(request: Any, capacity: dict) -> tuple[dict | None, tuple[str, str] | None]:
    """Step 2's check: ``(request as floats, None)`` when it may be tried on the ledger,
    else ``(None, (kind, text))``. ``capacity``: what the node has in total (placement
    groups' derived resources included). Zero amounts are dropped.

    >>> check_request({"CPU": 1, "GPU": 0}, {"CPU": 2.0})
    ({'CPU': 1.0}, None)
    >>> check_request({"CPU": -1}, {"CPU": 2.0})[1][0]
    'malformed'
    >>> check_request({"TPU": 1}, {"CPU": 2.0})[1][0]
    'infeasible'
    """
    if not isinstance(request, dict):
        return None, ("malformed", f"a lease request must be a dict of resource amounts, not "
                                   f"{type(request).__name__}")
    clean: dict[str, float] = {}
    for name, amount in request.items():
        if not isinstance(name, str) or not name:
            return None, ("malformed", f"resource names must be non-empty str, got {name!r:.40}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return None, ("malformed", f"the amount of {name!r} must be a number, got "
                                       f"{type(amount).__name__}")
        if not math.isfinite(amount) or amount < 0:
            return None, ("malformed", f"the amount of {name!r} must be a finite number >= 0, "
                                       f"got {amount!r}")
        if amount:
            clean[name] = float(amount)
    lacking = sorted(n for n in clean if n not in capacity)
    if lacking:
        return None, ("infeasible", f"this node has no {', '.join(lacking)} (it has "
                                    f"{_shape(capacity)})")
    over = sorted(n for n, a in clean.items() if a > capacity[n] + 1e-9)
    if over:
        return None, ("infeasible", "this node has in total only " + ", ".join(
            f"{capacity[n]:g} {n} (asked {clean[n]:g})" for n in over))
    return clean, None


def parse_message(message: Any) -> tuple[str, Any, tuple] | tuple[None, Any, str]:
    """Steps 2-4 and 7: ``(op, req, args)`` for a well-formed message, else
    ``(None, req or None, text)``.

    >>> parse_message(("release", 3, "ab12"))
    ('release', 3, ('ab12',))
    >>> parse_message(("lease", 1))[0] is None
    True
    """
    if not isinstance(message, tuple) or not message:
        return None, None, f"a message must be a non-empty tuple, got {type(message).__name__}"
    op = message[0]
    req = message[1] if len(message) > 1 else None
    shapes = {"lease": 4, "release": 3, "ping": 2, "spawn": 2, "kill": 3, "keeps": 2,
              "keep": 5, "free": 3, "grant_key": 2, "fetch": 7, "logs": 3,
              "groups": 2, "pg_loan": 4, "pg_listing": 3}
    if not isinstance(op, str) or op not in shapes:
        return None, req, f"unknown message {op!r:.40}; this node knows {sorted(shapes)}"
    if len(message) != shapes[op]:
        return None, req, f"{op!r} takes {shapes[op]} fields, got {len(message)}"
    if op == "lease" and not isinstance(message[3], str):
        return None, req, "a lease's tag must be a str"
    if op == "release" and not isinstance(message[2], str):
        return None, req, "a lease id must be a str"
    if op == "kill" and (not isinstance(message[2], int) or isinstance(message[2], bool)):
        return None, req, "a worker pid must be an int"
    if op == "keep" and (not isinstance(message[2], bytes) or not isinstance(message[3], str)
                         or not isinstance(message[4], int) or isinstance(message[4], bool)):
        return None, req, "a keep names (object id: bytes, path: str, size: int)"
    if op == "free" and (not isinstance(message[2], (list, tuple)) or len(message[2]) > 4096
                         or not all(isinstance(i, bytes) for i in message[2])):
        return None, req, "a free names a list of at most 4096 object ids (bytes)"
    if op == "pg_listing" and check_wait(message[2]) is not None:
        return None, req, check_wait(message[2])
    if op == "fetch" and not fetch_shape(message[2:]):
        return None, req, ("a fetch names (object id: bytes, size: int > 0, [ip, port], "
                           "tag: str, grant: bytes)")
    return op, req, tuple(message[2:])


def _fs_size(path: str) -> int:
    """The size of the file system holding ``path`` (0 when it cannot be read): the default
    cap of what one link keeps is a fraction of it (``config.kept_bytes_per_driver``)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


def check_pull_hello(hello: dict) -> str | None:
    """Step 11: None if a pull hello is ``{"driver": {...}, "tag": str}``, else the
    refusal text."""
    tag = hello.get("tag") if isinstance(hello, dict) else None
    peer = hello.get("peer") if isinstance(hello, dict) else None
    if check_hello(hello) is not None or not isinstance(tag, str) or not 8 <= len(tag) <= 24 \
            or not (peer is None or isinstance(peer, dict)):
        return ("a pull hello must carry {'driver': {'host': str, 'pid': int}, 'tag': str} "
                "(and, from another node, 'peer': {'node_id', 'object_id', 'grant'}): "
                "connect with miniray's RemoteNodeClient of the same version")
    return None


class DriverLeases:
    """Which link holds which lease (pure bookkeeping: no ledger, no sockets).

    >>> book = DriverLeases(limit=2)
    >>> book.add(7, "a"); book.holds(7, "a"), book.holds(8, "a")
    (True, False)
    >>> book.take(7)
    ['a']
    """

    def __init__(self, limit: int = MAX_LEASES_PER_DRIVER):
        self.limit = limit
        self._by_link: dict[Any, dict[str, Any]] = {}

    def room(self, link) -> bool:
        return len(self._by_link.get(link, ())) < self.limit

    def add(self, link, lease_id: str, extra: Any = None) -> None:
        self._by_link.setdefault(link, {})[lease_id] = extra

    def holds(self, link, lease_id: str) -> bool:
        return lease_id in self._by_link.get(link, ())

    def remove(self, link, lease_id: str) -> tuple[bool, Any]:
        """``(held, extra)``; only the link's own lease is removed."""
        leases = self._by_link.get(link)
        if leases is None or lease_id not in leases:
            return False, None
        return True, leases.pop(lease_id)

    def ids(self, link) -> list[str]:
        return list(self._by_link.get(link, ()))

    def take(self, link) -> list[str]:
        """Every lease id of ``link``, forgotten here (the caller releases them)."""
        return list(self._by_link.pop(link, {}))

    def take_items(self, link) -> list[tuple[str, Any]]:
        return list(self._by_link.pop(link, {}).items())

    def links(self) -> list:
        return list(self._by_link)

    def count(self, link=None) -> int:
        if link is not None:
            return len(self._by_link.get(link, ()))
        return sum(len(v) for v in self._by_link.values())


def _shape(resources: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items())) or "nothing"


# ------------------------------------------------------------------------------ the links
def _close_parts(ticket) -> None:
    for part in ticket.parts.values():
        part.close()
    ticket.parts.clear()


class _Link:
    __slots__ = ("channel", "fd", "name", "host", "pid", "ip", "complaints", "pulls",
                 "grant_key")

    def __init__(self, channel: pc.PeerChannel):
        self.channel = channel
        self.fd = channel.fileno()  # its key in ``RemoteDrivers._links`` while it is served
        driver = channel.peer_hello.get("driver") or {}
        self.host = str(driver.get("host", "?"))[:64]
        self.pid = driver.get("pid", 0)
        self.ip = ip = peer_ip(channel)
        self.name = f"remote driver {ip} pid {self.pid}"
        self.complaints = 0  # malformed messages logged (at most MAX_COMPLAINTS)
        self.pulls: set = set()  # step 11's pull connections (closed with the link)
        self.grant_key = pull_grants.new_key()  # step 12: its driver's grants' key


class RemoteDrivers(KeptServing):
    """Every remote driver's link and leases on this node (see the module docstring).

    ``ledger``: this node's ``Ledger``; ``gpu_keys``: its GPUs' host keys (physical GPUs are
    leased on the host GPU ledger too); ``node_id``: answered to pings. ``spawner``: step
    8's hand-off, ``spawner(channels, driver_name, done)`` with the four attach channels in
    ``ATTACH_ROLES`` order (it owns them from then on); it calls ``done(pid)`` or
    ``done(error_text)`` on the loop later. None (the default): spawns are unsupported.
    """

    def __init__(self, ledger, *, node_id: str = "", gpu_keys: list | None = None,
                 node_pid: int | None = None, spawner=None, ticket_ttl: float = TICKET_TTL_S,
                 shm_dir: str | None = None):
        self.ledger = ledger
        self._shm_dir = shm_dir  # where workers of remote drivers write (config's default)
        # Step 11: results kept per link, each link's bytes bounded by the cap.
        self.kept = KeptObjects(cap_bytes=config.kept_bytes_per_driver(
            _fs_size(self.shm_dir)))
        self.on_change = None  # called (on the loop) when what is kept changed: status
        self.session_dir: str | None = None  # step 13: whose logs/ it reads (the node's)
        self._by_tag: dict[str, _Link] = {}
        # Step 12, set by ``peering.Peering.register``: ``post(fn)`` runs fn on the loop
        # (from a thread); ``connect_pull(address, hello)`` a pull connection to another
        # node (the cluster token, TLS and this node's source address).
        self.post = None
        self.connect_pull = None
        self._fetching: dict[tuple, list] = {}  # (link, object id) -> [(req, answer)] waiting
        # Budget ops that found their file's lock busy, per link tag, in order, and when
        # they are tried again (``kept_serving._budget``).
        self._budget_ops: dict[str, list] = {}
        self._budget_retry: dict[str, float] = {}
        self.fetched = 0  # step 12: objects fetched from other nodes
        # Step 15: loans of this node's drivers' groups to remote drivers (its threads
        # post their answers to the loop through ``post``, set later).
        self.loans = LoanRelay(ledger, lambda: self.session_dir, lambda fn: self.post(fn))
        # Step 16: this node's groups for another host's listing (answered as step 15's).
        self.listings = GroupListing(ledger, lambda: self.session_dir,
                                     lambda fn: self.post(fn))
        self.node_id = node_id
        self.node_pid = node_pid if node_pid is not None else os.getpid()
        self._gpu_keys = list(gpu_keys or [])
        self._book: LeaseBook | None = None  # made at the first lease
        self._sel: selectors.BaseSelector | None = None
        self._links: dict[int, _Link] = {}  # by fd
        self._leases = DriverLeases()
        self._pending: list[pc.PeerChannel] = []  # added before register()
        self.spawner = spawner
        self.kill_worker = None  # kill_worker(pid): set with the spawner (the fork server)
        self._workers: dict[int, _Link] = {}  # pid -> the link whose worker it is
        self._tickets = TicketBook(ttl=ticket_ttl)
        self._keepalive = keepalive_settings(config.node_dead_after_s())
        self.refusing: str | None = None  # fenced and not rejoined yet: why
        self.spawned = 0
        self.granted = 0
        self.denied = 0
        self.released = 0
        self.fenced = 0
        self.errors = 0

    def __repr__(self) -> str:
        return (f"<RemoteDrivers links={len(self._links)} leases={self._leases.count()} "
                f"granted={self.granted} denied={self.denied} fenced={self.fenced}>")

    def statistics(self) -> dict:
        return {"links": len(self._links), "leases": self._leases.count(),
                "granted": self.granted, "denied": self.denied, "released": self.released,
                "fenced": self.fenced, "errors": self.errors, "spawned": self.spawned,
                "tickets": len(self._tickets), "refusing": self.refusing,
                "listings": self.listings.answered,  # step 16's answers
                # step 11's budget changes waiting for a busy budget file's lock
                "budget_waiting": sum(len(ops) for ops in self._budget_ops.values()),
                "drivers": sorted(link.name for link in self._links.values())}

    def leases_of(self) -> dict[str, list[str]]:
        """For status and tests: each link's name and its lease ids."""
        out: dict[str, list[str]] = {}
        for link in self._links.values():
            out.setdefault(link.name, []).extend(self._leases.ids(link))
        return out

    # -- wiring -------------------------------------------------------------------------
    def register(self, sel: selectors.BaseSelector) -> None:
        self._sel = sel
        pending, self._pending = self._pending, []
        for channel in pending:
            self.add(channel)

    def add(self, channel: pc.PeerChannel) -> None:
        """Step 1 done (a handshake thread accepted it; called on the loop): serve it."""
        if self._sel is None:
            self._pending.append(channel)
            return
        if self.refusing is not None:  # step 6: not until the node has rejoined
            with contextlib.suppress(OSError, pc.PeerClosed, TimeoutError):
                channel.set_send_timeout(SEND_TIMEOUT_S)
                channel.send(("fenced", f"{self.refusing}; it has not rejoined yet"))
            channel.close()
            return
        link = _Link(channel)
        # The node's pid and its root's tag in it (``new_session_tag``): a sweeper tells a
        # dead node's leftovers, and a test harness its own.
        tag = lazy_segments().new_session_tag(self.node_pid, root=session.root_tag())
        while tag in self._by_tag:  # two links never share a tag: it names their segments
            tag = lazy_segments().new_session_tag(self.node_pid, root=session.root_tag())
        self.kept.add_link(link, tag)
        self._by_tag[tag] = link
        try:  # what the link's workers reserve against the cap (gone with the tag's sweep)
            lazy_budget().create(self.shm_dir, tag)
        except (OSError, RuntimeError) as error:  # its workers then keep nothing
            logger.warning("%s: its results are sent at once, not kept here: the budget "
                           "file in %s could not be made (%s)", link.name, self.shm_dir, error)
        # Registered at creation: whatever a worker of this link writes under its tag goes
        # when the link closes or is fenced (``_drop``), adopted by the book or not.
        channel.setblocking(False)
        channel.set_send_timeout(SEND_TIMEOUT_S)
        _set_keepalive(link.fd, self._keepalive)
        self._links[link.fd] = link
        self._sel.register(link.fd, selectors.EVENT_READ, self._on_link)
        logger.info("%s connected from %s (host %s)", link.name, channel.address, link.host)

    def _served(self, link: _Link) -> bool:
        """``link`` is still served (not dropped: its fd may belong to a newer link)."""
        return self._links.get(link.fd) is link

    # -- the loop -----------------------------------------------------------------------
    def _on_link(self, fd: int) -> None:
        link = self._links.get(fd)
        if link is None:
            return
        try:
            messages = link.channel.feed_nonblocking()
        except (pc.PeerClosed, pc.PeerAuthError, OSError) as error:
            self._drop(link, f"its link closed ({error})")
            return
        for message in messages:
            reply = self._handle(link, message)
            if reply is not None and not self._reply(link, reply):
                return

    def _reply(self, link: _Link, message) -> bool:
        try:
            link.channel.send(message)
            return True
        except (OSError, pc.PeerClosed, TimeoutError) as error:
            self._drop(link, f"sending to it failed ({error})")
            return False

    def _handle(self, link: _Link, message):
        """Steps 2-4 and 7: the reply to one message."""
        op, req, args = parse_message(message)
        if op is None:
            self.errors += 1
            link.complaints += 1
            if link.complaints <= MAX_COMPLAINTS:  # answered always, logged a few times
                logger.warning("%s sent a malformed message: %s", link.name, args)
            return ("error", req, "malformed", args)
        if op == "ping":
            return ("pong", req, self.node_id)
        if op == "spawn":
            return self._issue(link, req)
        if op in ("keeps", "keep", "free"):
            return self._keeping(link, op, req, args)
        if op == "grant_key":
            return ("grant_key", req, link.grant_key)
        if op == "logs":  # step 13: a few file reads, bounded
            kind, answer = worker_logs.answer_query(self.session_dir or "", args[0])
            return ("logs", req, answer) if kind == "logs" else ("error", req, kind, answer)
        if op == "groups":  # step 14: one lock-free ledger read
            try:
                groups = {h: dict(lease.group) for h, lease in self.ledger.groups().items()}
            except (OSError, ValueError) as error:
                return ("error", req, "node", f"this node cannot read its ledger: {error}")
            return ("groups", req, groups)
        if op == "fetch":
            return self._fetch(link, req, *args)
        if op == "pg_listing":  # step 16: answered later, from a thread (group_listing.py)

            def answer(reply, link=link):
                if self._served(link):
                    self._reply(link, reply)

            self.listings.answer(req, float(args[0]), answer)
            return None
        if op == "pg_loan":  # step 15: answered later, from a thread (loan_relay.py)
            what, fields = args
            problem = check_fields(what, fields)
            if problem is not None:
                self.errors += 1
                return ("error", req, "malformed", problem)

            def reply(answer, link=link):
                if self._served(link):
                    self._reply(link, answer)

            self.loans.forward(link, req, what, fields, reply)
            return None
        if op == "kill":
            (pid,) = args
            if self._workers.get(pid) is not link or self.kill_worker is None:
                self.errors += 1
                return ("error", req, "unknown_worker",
                        f"pid {pid} is not a worker of this driver on this node (another's, "
                        "one that exited already, or no worker)")
            self.kill_worker(pid)
            return ("killed", req, pid)
        if op == "release":
            (lease_id,) = args
            held, host_lease = self._leases.remove(link, lease_id)
            if not held:
                self.errors += 1
                return ("error", req, "unknown_lease",
                        f"this node holds no lease {lease_id!r:.40} for this driver (unknown, "
                        "released already, or its link was fenced)")
            self._release([(lease_id, host_lease)])
            return ("released", req, lease_id)
        request, tag = args
        return self._lease(link, req, request, tag)

    def _lease(self, link: _Link, req, request, tag: str):
        try:
            capacity = self.ledger.capacity()
        except Exception as error:  # noqa: BLE001 - the ledger's trouble is the driver's answer
            logger.warning("reading the ledger failed: %s", error)
            return ("error", req, "node", f"this node cannot read its ledger: {error}")
        clean, problem = check_request(request, capacity)
        if problem is not None:
            self.errors += 1
            return ("error", req, *problem)
        if not self._leases.room(link):
            self.errors += 1
            return ("error", req, "malformed",
                    f"this driver holds {MAX_LEASES_PER_DRIVER} leases here already: release "
                    "some first")
        full_tag = f"{link.name}: {tag[:MAX_TAG]}" if tag else link.name
        try:
            lease, host_lease = self._lease_book().acquire(clean, full_tag)
        except ValueError as error:  # the ledger's own check (say, GPU 1.5)
            self.errors += 1
            return ("error", req, "malformed", str(error))
        except Exception as error:  # noqa: BLE001 - never let one request stop the node
            logger.exception("a remote lease failed")
            return ("error", req, "node", f"this node could not take the lease: {error}")
        if lease is None:
            self.denied += 1
            return ("deny", req, self._available())
        self._leases.add(link, lease.lease_id, host_lease)
        self.granted += 1
        try:
            gpu_ids = [str(g) for g in self.ledger.instance_ids_of(lease, "GPU")]
        except Exception:  # noqa: BLE001
            gpu_ids = []
        return ("grant", req, lease.lease_id, gpu_ids)

    def _lease_book(self) -> LeaseBook:
        if self._book is None:
            # lazy: a node loads the owner's lease book only once a remote driver leases
            from miniray._private.owner.leases import LeaseBook

            self._book = LeaseBook(
                ledger=self.ledger, pid=self.node_pid, gpu_keys=self._gpu_keys,
                host_gpu_timeout=None, make_room=lambda: False,
                on_unschedulable=lambda _key, _message: None,
                call_later=lambda _delay, _fn: None)
        return self._book

    def _available(self) -> dict:
        try:
            return dict(self.ledger.available())
        except Exception:  # noqa: BLE001
            return {}

    def _release(self, items: Iterable[tuple[str, Any]]) -> int:
        items = list(items)
        if not items:
            return 0
        try:
            done = self.ledger.release_many([lid for lid, _ in items])
            book = self._book
            for _lid, host_lease in items:
                if host_lease is not None and book is not None:
                    book.release_host(host_lease)
        except Exception:  # noqa: BLE001 - a ledger problem must not stop the loop
            logger.exception("releasing %d remote lease(s) failed", len(items))
            return 0
        self.released += len(items)
        return done

    def _drop(self, link: _Link, why: str) -> None:
        """Step 5: the link is gone; so is every lease it held."""
        if self._served(link):
            del self._links[link.fd]
            if self._sel is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(link.fd)
        link.channel.close()
        for ticket in self._tickets.drop_link(link):
            _close_parts(ticket)
        for pid in [p for p, owner in self._workers.items() if owner is link]:
            if self.kill_worker is not None:  # its EXITED then finds no link
                self.kill_worker(pid)
        released = self._release(self._leases.take_items(link))
        self.loans.drop_link(link)  # step 15: its loans come back to their drivers
        for pull in list(link.pulls):  # their threads end on the closed channel
            pull.close()
        tag, paths = self.kept.drop_link(link)
        if tag is not None:
            self._by_tag.pop(tag, None)
            self._forget_budget(tag)
            for path in paths:
                lazy_segments().unlink_quiet(path)
            lazy_segments().sweep_segments(self.shm_dir, lambda t: t == tag)
        if paths:
            self._changed()
        logger.info("%s left (%s); released %d lease(s), freed %d kept object(s)", link.name,
                    why, released, len(paths))

    # -- step 8: spawn tickets and attach connections ------------------------------------
    def _issue(self, link: _Link, req):
        if self.spawner is None:
            return ("error", req, "unsupported",
                    "this node does not run workers for remote drivers yet")
        ticket = self._tickets.issue(link, req, link.ip, time.monotonic(),
                                     os.urandom(16).hex())
        if ticket is None:
            self.errors += 1
            return ("error", req, "malformed",
                    f"this driver has {self._tickets.per_link} spawns waiting for their "
                    "attach connections already")
        return ("ticket", req, ticket.ticket, self._tickets.ttl)

    def attach(self, channel: pc.PeerChannel) -> None:
        """Step 8: one of a ticket's four connections (from the handshake gate)."""
        hello = channel.peer_hello
        outcome, ticket, why = self._tickets.attach(hello.get("ticket", ""), hello.get("fd"),
                                                    peer_ip(channel), time.monotonic(),
                                                    channel)
        if outcome in ("unknown", "refused"):
            self.errors += 1
            logger.warning("refused an attach connection from %s: %s", channel.address, why)
            channel.close()
            return
        if outcome == "waiting":
            return
        link = ticket.link
        channels = ticket.ordered()

        def done(result, link=link, req=ticket.req):
            if not self._served(link) and not isinstance(result, int):
                return  # the driver is gone; its worker's sockets went with the spawner
            if isinstance(result, int) and not isinstance(result, bool):
                self.spawned += 1
                self._workers[result] = link
                if not self._served(link):
                    if self.kill_worker is not None:  # the driver left meanwhile
                        self.kill_worker(result)
                    return
                self._reply(link, ("spawned", req, result))
            else:
                self._reply(link, ("error", req, "spawn_failed", str(result)))

        try:
            self.spawner(channels, link.name, done)
        except Exception as error:  # noqa: BLE001 - a failed spawn is the driver's answer
            logger.exception("spawning a worker for %s failed", link.name)
            for part in channels:
                part.close()
            done(f"this node could not start the worker: {error}")

    def worker_exited(self, pid: int, status: int) -> None:
        """Step 9: a worker forked for a link exited (the fork server reaped it): the
        driver hears ("exited", pid, wait_status) on its link, if it is still there."""
        link = self._workers.pop(pid, None)
        if link is not None and self._served(link):
            self._worker_gone(link, pid)  # its reservations in the link's budget file
            self._reply(link, ("exited", pid, status))

    def next_deadline(self) -> float | None:
        """When ``tick`` has a ticket to expire, or budget ops to try again."""
        times = [t for t in (self._tickets.next_deadline(), self._budget_deadline())
                 if t is not None]
        return min(times, default=None)

    def tick(self, now: float) -> None:
        """Step 8's deadline: expired tickets close their connections and tell the driver;
        step 11's budget ops that found their file's lock busy are tried again."""
        self._retry_budgets(now)
        for ticket in self._tickets.expired(now):
            _close_parts(ticket)
            link = ticket.link
            if self._served(link):
                self._reply(link, ("error", ticket.req, "attach_timeout",
                                   f"the four attach connections of ticket "
                                   f"{ticket.ticket[:8]}... did not all arrive within "
                                   f"{self._tickets.ttl:g} s"))

    # -- fencing and closing --------------------------------------------------------------
    def fence(self, reason: str) -> int:
        """Step 6: tell every driver, close every link, release every lease; returns how
        many leases were released. Called before the node rejoins as a new incarnation."""
        self.refusing = reason
        count = self._leases.count()
        links = self._close_links(reason, f"fenced: {reason}")
        if links:
            self.fenced += 1
            logger.warning("fenced %d remote driver(s) and %d lease(s): %s", len(links),
                           count, reason)
        return count

    def resume(self) -> None:
        """The node rejoined as a new incarnation: serve new driver links again."""
        self.refusing = None

    def close(self, reason: str = "the node is stopping") -> None:
        """Node stop: every link closed, every lease released (step 5 for each)."""
        self._close_links(reason, reason)

    def _close_links(self, reason: str, why: str) -> list:
        """Every driver hears ("fenced", ``reason``), then its link is dropped (step 5,
        logged with ``why``); links not served yet are closed. Returns the links."""
        links = list(self._links.values())
        for link in links:
            with contextlib.suppress(OSError, pc.PeerClosed, TimeoutError):
                link.channel.send(("fenced", reason))
            self._drop(link, why)
        for channel in self._pending:
            channel.close()
        self._pending.clear()
        return links


