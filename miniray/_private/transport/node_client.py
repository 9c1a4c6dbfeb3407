"""A driver's side of a node started with ``miniray start``: finding it, and talking to it.

Owns: the node records on disk (``<session>/node.json`` and ``<root>/current_node``), resolving
an address (``None``, ``"auto"``, ``"host:port"``) to a record, and ``NodeClient``, the
driver's connection to the node's socket. Does not own: the node process (``node.py``), what
the owner does with its workers (``owner.py``), or the wire protocol's definition (tags and
layouts in ``core/protocol.py`` section 4, steps in ``node.py``'s docstring; this module is its
client half).
What the CLI does to a node from outside (start it as a daemon, stop it) is
``node/daemon.py``'s.
Called by: the runtime at ``init(address=...)``, the CLI (``status``), ``node/daemon.py``,
``node.py`` (the record helpers), and tests.

``NodeClient`` has exactly the interface the owner uses on ``spawn.ForkServerClient``
(``pid``, ``fileno()``, ``spawn(fds)``, ``kill(pid, sig)``, ``request_shutdown(grace)``,
``read_message()``, ``wait(timeout)``, ``close()``, ``describe_exit(timeout)``), and the
node relays the fork server's own tags (``protocol.SPAWNED``/``EXITED``/``BYE``, plus
``NODE_STOPPING`` before the node stops), so the owner cannot tell a node from
its own fork server: it still talks to its workers directly, over the sockets it created and
the node passed on.

Records::

    $MINIRAY_TMPDIR/                    (the session root, config.tmpdir_root())
      current_node                      path of the node.json of the last node started
      session_<stamp>_<pid>_<rand>/     the node's session dir, same layout as init()'s
        owner.pid, ledger.json(.lock)
        node.json                       {pid, start_time, address, port, socket, ...}
        node.sock                       AF_UNIX SOCK_SEQPACKET, mode 0600
        node.log                        the daemon's stdout and stderr
        node_stats.json                 connected drivers and their workers (for status)
        cluster.json                    the cluster view: every node, alive or dead
                                        (written by node/peering.py, read by read_cluster)

Mirrors Ray's address resolution (``ray._private.services.canonicalize_bootstrap_address``,
Ray 2.60). Differs: ``"host:port"`` resolves to a node of this host's session root, never
to a TCP connection from the driver: the node listening at that address, or the node that
joined the cluster whose head it is (Ray's rule: a driver runs on a cluster node). "This
host" is the session root's records, not whether the IP is a loopback one, so fake hosts
(127.0.0.2, ... with their own roots) behave as separate hosts; records are per session
root, so one user's nodes and another root's nodes are never found.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import pickle
import shutil
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

from miniray._private.core import config, protocol, ray_client
from miniray._private.core.node_start import NodeStartError, parse_address
from miniray._private.host import procinfo, same_uid, session
from miniray._private.transport.spawn import SpawnChannel, send_message

__all__ = [
    "CURRENT_NODE",
    "NodeStartError",
    "NODE_LOG",
    "NODE_SOCKET",
    "NODE_STATS",
    "RECORD_FILE",
    "NodeClient",
    "NodeRecord",
    "connect",
    "current_record",
    "find_node",
    "list_records",
    "parse_address",
    "read_cluster",
    "read_record",
]

logger = logging.getLogger(__name__)

RECORD_FILE = "node.json"
NODE_SOCKET = "node.sock"
NODE_LOG = "node.log"
NODE_STATS = "node_stats.json"
CLUSTER_FILE = "cluster.json"  # the cluster view the node publishes (node/peering.py)
SERVICE_PID = "actor_service.pid"  # "<pid> <start time>" of the node's actor service
CURRENT_NODE = "current_node"
NODE_IP = "127.0.0.1"
DEFAULT_PORT = 6379
BUFSIZE = 1 << 16
MAX_FDS = 8

NOT_FOUND_AUTO = (
    "Could not find any running Ray instance. Please specify the one to connect to by setting "
    "`--address` flag or `RAY_ADDRESS` environment variable."
)


# A session init() starts inside its driver (no node) reports the address "127.0.0.1:0":
# no other driver can join it.
EMBEDDED = (
    "that is the address of a session that init() started inside its driver, which other "
    "drivers cannot join. Start a node they can join with `miniray start --head`, then call "
    "init(address='auto') (or init() with RAY_ADDRESS=auto) in every driver."
)
EMBEDDED_ONLY = (
    " The miniray sessions running here were started by init() inside their drivers, which "
    "other drivers cannot join: start a node with `miniray start --head` for that."
)


def _embedded_sessions(root: str) -> bool:
    """Whether a live session of this root runs (one without a node: ``find_node`` found
    none)."""
    try:
        names = os.listdir(root)
    except OSError:
        return False
    return any(name.startswith("session_") and session.is_session_alive(
        os.path.join(root, name)) for name in names)


@dataclass
class NodeRecord:
    """What ``<session>/node.json`` says about a node (``path`` is the file itself)."""

    pid: int
    start_time: int | None
    address: str
    port: int
    socket: str
    session_dir: str
    started_at: float
    node_id: str = ""
    fork_server_pid: int | None = None
    fork_server_start: int | None = None
    gpu_keys: list = field(default_factory=list)
    pid_ns: str = ""  # where ``pid`` means this process (procinfo.identity)
    boot_id: str = ""
    head_address: str = ""  # "ip:port" of the head this node joined ("" for a head)
    path: str = ""

    def here(self) -> bool:
        """Whether ``pid`` is a pid of this PID namespace (a record that does not say is
        taken to be, as before namespaces were recorded)."""
        mine = procinfo.identity().pid_ns
        return not self.pid_ns or not mine or self.pid_ns == mine

    def provably_dead(self) -> bool:
        if not self.pid_ns:  # an older record: judged by pid and start time alone
            return not procinfo.is_alive(self.pid, self.start_time)
        return procinfo.is_provably_dead(self.pid, self.start_time, self.pid_ns, self.boot_id,
                                         procinfo.identity())

    def alive(self) -> bool:
        """The recorded process still runs (same pid *and* start time; a node of another PID
        namespace unless provably dead) and its socket exists."""
        return not self.provably_dead() and os.path.exists(self.socket)

    def to_json(self) -> dict:
        doc = asdict(self)
        doc.pop("path")
        return doc


def read_record(path: str) -> NodeRecord | None:
    """The record at ``path``, or None if it is missing, unreadable, or not a regular file of
    this uid (a record names the socket a driver connects to and the directories ``stop``
    removes: only our own is believed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd) as f:
            same_uid.check_owned_fd(fd, path)
            doc = json.load(f)
        names = set(NodeRecord.__dataclass_fields__) - {"path"}
        return NodeRecord(**{k: v for k, v in doc.items() if k in names}, path=path)
    except (OSError, ValueError, TypeError, same_uid.InsecurePathError):
        return None


def read_cluster(session_dir: str) -> dict | None:
    """The cluster view a node published in its ``session_dir`` (None: no file, or not
    readable): ``{"view": ClusterView snapshot, "local": its node id, "head": the head's
    address, "is_head", "linked" (a member's link to the head is up), "updated_at", and on
    a head "clock": its monotonic time at writing, the clock of ``last_heartbeat``}``."""
    try:
        with open(os.path.join(session_dir, CLUSTER_FILE)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("view"), dict) else None


def _current_path(root: str) -> str | None:
    try:
        with open(os.path.join(root, CURRENT_NODE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def current_record(root: str | None = None) -> NodeRecord | None:
    """The record ``<root>/current_node`` names, alive or not (None if there is none)."""
    path = _current_path(root or config.tmpdir_root())
    return read_record(path) if path else None


def list_records(root: str | None = None, *, alive_only: bool = True) -> list[NodeRecord]:
    """Every node record of this session root (and the one ``current_node`` names, which may
    live under another ``--temp-dir``), oldest first."""
    root = root or config.tmpdir_root()
    same_uid.ensure_private_dir(root, create=False)  # records are trusted only from our own
    paths = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        if name.startswith("session_"):
            paths.append(os.path.join(root, name, RECORD_FILE))
    current = _current_path(root)
    if current and current not in paths:
        paths.append(current)
    records = [r for r in map(read_record, paths) if r is not None]
    if alive_only:
        records = [r for r in records if r.alive()]
    return sorted(records, key=lambda r: r.started_at)


def _is_this_host(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain", socket.gethostname()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == socket.getfqdn()  # a name other than ours: not resolved (no DNS wait)
    if ip.is_loopback or ip.is_unspecified:
        return True
    try:
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return str(ip) in mine


def find_node(address: str | None = None, root: str | None = None) -> NodeRecord | None:
    """The live node ``address`` names, under session root ``root`` (default: this user's).

    * ``None``: the node ``current_node`` names if it is alive, else None (start a new one).
    * ``"auto"``: that node, else any live node of the root (the newest); ConnectionError with
      Ray's message when there is none.
    * ``"local"``: None (always start a new one).
    * ``"host:port"``: a live node of this root that listens there or joined the cluster
      whose head listens there (a member node: the driver runs on its own host's node, as
      Ray's); else, when ``host`` names this host, the node of this root on that port.
      ValueError when malformed, ConnectionError (saying to run ``miniray start
      --address=host:port`` here) when there is none.

    The caller applies ``RAY_ADDRESS`` first (Ray's order, ray-api-surface §1.2).

    Example:
        >>> rec = find_node("auto")  # doctest: +SKIP
        >>> rec.address, rec.socket  # doctest: +SKIP
        ('127.0.0.1:6379', '/dev/shm/miniray-1000/session_.../node.sock')
    """
    root = root or config.tmpdir_root()
    same_uid.ensure_private_dir(root, create=False)  # records are trusted only from our own
    if address in (None, "", "auto"):
        current = current_record(root)
        if current is not None and current.alive():
            return current
        if address != "auto":
            return None
        live = list_records(root)
        if live:
            return live[-1]
        raise ConnectionError(NOT_FOUND_AUTO + (EMBEDDED_ONLY if _embedded_sessions(root)
                                                else ""))
    if address == "local":
        return None
    if "://" in address:
        raise NotImplementedError(ray_client.ray_url_refusal(address))
    if address.strip().rpartition(":")[2] == "0":  # what init()'s embedded session reports
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}: {EMBEDDED}")
    host, port = parse_address(address)
    wanted = f"{host}:{port}"
    live = list(reversed(list_records(root)))
    # A node of this host's session root that listens at that address, or joined the
    # cluster whose head it is: the driver connects to its local node (Ray's rule).
    for record in live:
        if record.address == wanted or record.head_address == wanted:
            return record
    if _is_this_host(host):  # "localhost:P" and the like: the node of this root on port P
        for record in live:
            if record.port == port:
                return record
    if live and not _is_this_host(host):
        joined = ", ".join(r.head_address or r.address for r in live)
        raise ConnectionError(
            f"Failed to connect to Ray cluster at {address}: the miniray nodes of this host "
            f"belong to another cluster ({joined}). A driver connects to its own host's node: "
            f"run `miniray start --address={wanted}` here first, or use that address.")
    if not live and not _is_this_host(host):
        raise ConnectionError(
            f"Failed to connect to Ray cluster at {address}: no miniray node runs on this "
            f"host (session root {root}). A driver runs on a node of the cluster: run "
            f"`miniray start --address={wanted}` on this host first, then init() again.")
    raise ConnectionError(
        f"Failed to connect to Ray cluster at {address}: no miniray node of this host (session "
        f"root {root}) listens there or joined that cluster. A driver runs on a node of the "
        f"cluster: start one here first, with `miniray start --address={wanted}` (or `miniray "
        f"start --head --port {port}` for a new cluster)."
    )


@contextlib.contextmanager
def sun_path(path: str) -> Iterator[str]:
    """A name for ``path`` that fits ``sockaddr_un`` (108 bytes): the path itself when short,
    else ``/proc/self/fd/<dir fd>/<name>`` (Linux), valid inside the ``with`` block."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


# The peer checks live in same_uid.py; these names stay for the node and the actor service.
peer_uid = same_uid.peer_creds
accept_same_uid = same_uid.accept_same_uid


# What a node sends a driver after NODE_WELCOME; the layouts are the fork server's.
_RELAYED = frozenset({protocol.SPAWNED, protocol.EXITED, protocol.BYE, protocol.NODE_STOPPING})


class NodeClient(SpawnChannel):
    """A driver's connection to a node; what the owner uses in place of a fork server.

    ``spawn()`` and ``kill()`` only send; replies are read by the owner's I/O thread through
    ``read_message()`` when ``fileno()`` is readable. ``info`` is the node's NODE_WELCOME
    dict.

    Example:
        >>> client = connect(find_node("auto"))  # doctest: +SKIP
        >>> req = client.spawn([data_fd, ctl_fd, out_w, err_w])  # doctest: +SKIP
        >>> client.read_message()  # doctest: +SKIP
        (31, 1, 4242)
    """

    def __init__(self, sock: socket.socket, info: dict, record: NodeRecord | None = None):
        super().__init__(sock)
        self._goodbye_sent = False
        self._bye = threading.Event()
        self.info = info
        self.record = record
        self.pid = int(info["node_pid"])  # the node's pid: it outlives this client

    def announce_store(self, session_tag: str) -> None:
        """Tell the node the tag of this driver's object store: if this process dies, the
        node removes the segments it left (protocol step 7)."""
        self._send((protocol.NODE_STORE, session_tag))

    def request_shutdown(self, grace: float) -> None:
        """Leave the node: it waits ``grace`` seconds for this driver's workers to exit,
        SIGKILLs the rest, releases this driver's leases, then answers BYE (``wait``)."""
        self._goodbye_sent = True
        self._send((protocol.NODE_GOODBYE, float(grace)))

    def read_message(self) -> tuple | None:
        """One message (the fork server's tags, or NODE_STOPPING), ``()`` for nothing or an
        unknown tag, or None at EOF (the node is gone). Call only when ``fileno()`` is
        readable."""
        try:
            data = self._sock.recv(BUFSIZE)
        except (BlockingIOError, InterruptedError):
            return ()
        except OSError:
            self._bye.set()
            return None
        if not data:
            self._bye.set()
            return None
        message = pickle.loads(data)
        tag = message[0]
        if tag == protocol.BYE:
            self._bye.set()
        return message if tag in _RELAYED else ()

    def wait(self, timeout: float) -> None:
        """After ``request_shutdown``: until the node said BYE (or went away), at most
        ``timeout`` seconds. The owner's I/O thread reads the BYE; otherwise a no-op."""
        if self._goodbye_sent and self._sock.fileno() >= 0:
            self._bye.wait(timeout)

    def _name(self) -> str:
        return f"the miniray node {self.info.get('address')} (pid {self.pid})"

    def describe_stopping(self, reason: str) -> str:
        """The node's NODE_STOPPING announcement in words, for errors."""
        return f"{self._name()} was stopped ({reason})"

    def describe_exit(self, timeout: float) -> str:
        """After EOF on the node's socket, without NODE_STOPPING first. The node is not this
        process's child, so its exit status cannot be read; whether it still runs can."""
        record = self.record
        deadline = time.monotonic() + timeout
        # The socket closes while the process exits: give the exit a moment to complete.
        while (record is not None and procinfo.is_alive(record.pid, record.start_time)
               and time.monotonic() < deadline):
            time.sleep(0.01)
        if record is not None and procinfo.is_alive(record.pid, record.start_time):
            return (f"{self._name()} closed this driver's connection (it drops a driver "
                    "that does not read its messages for a few seconds)")
        return f"{self._name()} exited (status unknown: killed, or crashed)"

    def __repr__(self) -> str:
        return f"<NodeClient {self.info.get('address')} node pid={self.pid}>"


def connect(record: NodeRecord, timeout: float = 10.0, *, probe: bool = False) -> NodeClient:
    """NODE_HELLO/NODE_WELCOME with the node ``record`` names; ConnectionError if it does not
    answer, or refuses (NODE_REFUSED: another protocol version); RuntimeError if it runs
    another miniray or another Python (major.minor). ``probe``: only checking that the node
    answers (no driver, so no job of the node's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        with sun_path(record.socket) as name:
            sock.connect(name)
        same_uid.require_same_uid_peer(sock, record.socket)  # before a byte is read
        hello = (protocol.NODE_HELLO, os.getpid(), protocol.PROTOCOL_VERSION)
        send_message(sock, hello + ({"probe": True},) if probe else hello)
        data = sock.recv(BUFSIZE)
        if not data:  # a node of protocol version 1 closes on a HELLO it cannot read
            raise ConnectionError(
                "the node closed the connection during HELLO (a node of another miniray "
                "version does this: restart it with `miniray stop` and `miniray start --head`)")
        reply = pickle.loads(data)
        if reply[0] != protocol.NODE_WELCOME:
            why = reply[1] if reply[0] == protocol.NODE_REFUSED and len(reply) > 1 else reply[1:]
            raise ConnectionError(f"the node refused the connection: {why}")
        # Ray refuses another Ray or Python version with a RuntimeError naming both; closing
        # the socket tells the node this driver has gone.
        refusal, warning = protocol.version_mismatch(reply[1], f"node {NODE_IP}")
        if refusal is not None:
            raise RuntimeError(refusal)
        if warning is not None:
            logger.warning("%s", warning)
        sock.settimeout(None)
    except RuntimeError:
        sock.close()
        raise
    except ConnectionError as error:
        sock.close()
        raise ConnectionError(f"Failed to connect to Ray cluster at {record.address}: "
                              f"{error}") from None
    except OSError as error:
        sock.close()
        raise ConnectionError(f"Failed to connect to Ray cluster at {record.address}: the node "
                              f"(pid {record.pid}) did not answer on {record.socket}: "
                              f"{error}") from None
    return NodeClient(sock, reply[1], record)


# ------------------------------------------------------------- starting and stopping nodes
def write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def unlink_quiet(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def root_locked(root: str) -> Iterator[None]:
    """flock on the session root itself: choosing a port and writing records is atomic
    between concurrent ``miniray start``/``stop`` (no lock file is left in the root). The root
    is created or checked as a private directory first (InsecurePathError otherwise)."""
    same_uid.ensure_private_dir(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def sweep_stale(root: str) -> None:
    """Session dirs of dead owners, and a ``current_node`` naming a dead node."""
    session.sweep_dead_sessions(root)
    current = os.path.join(root, CURRENT_NODE)
    try:
        with open(current) as f:
            target = f.read().strip()
    except OSError:
        return
    record = read_record(target)
    if record is None or record.provably_dead():
        if record is not None and not session.is_session_alive(record.session_dir):
            shutil.rmtree(record.session_dir, ignore_errors=True)
        unlink_quiet(current)
