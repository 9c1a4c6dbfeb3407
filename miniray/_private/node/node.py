"""The node process of ``miniray start``: a ledger and a fork server that drivers connect to.

Owns: the node's session directory (same layout as ``init()``'s), its ledger, its fork server,
its actor service process (started, restarted when it dies, stopped first),
the socket drivers connect to, the node records (``node.json``, ``current_node``; their format
and lookup are in ``node_client.py``), which worker belongs to which driver, and the selector
loop that also serves the node's TCP listener. Does not own: tasks, objects or leases (each
driver's owner takes leases in the shared ledger and talks to its workers directly), joining,
heartbeats and the cluster view (``peering.py``: this loop only calls ``register``, ``due``,
``tick`` and ``close`` on it), or the CLI's output (``cli.py``).
Called by: ``miniray start`` (``spawn_daemon``, or ``run_node`` in the foreground for
``--block``), ``miniray stop`` (``stop_nodes``); drivers reach it through ``NodeClient``.

::

    driver A: owner + NodeClient ──┐  <session>/node.sock: AF_UNIX SOCK_SEQPACKET, mode 0600,
    driver B: owner + NodeClient ──┤  peers checked with SO_PEERCRED (same uid)
                                   ▼
      node (one thread, one selector) ── socketpair ──► fork server ── fork() ──► workers
                                                                                    ▲
    driver ◄──── data + control sockets, stdout/stderr pipes (its own fds) ────────┘
    (the task path stays driver ⇄ worker, exactly as in embedded mode)

Protocol, driver ⇄ node. Each message is one pickled tuple in one SEQPACKET datagram (at most
64 KiB); file descriptors travel with it as SCM_RIGHTS. Tags and layouts are
``core/protocol.py``'s section 4 (the fork server's SPAWN, SPAWNED, KILL, EXITED and BYE are
relayed unchanged).

1. The driver connects. Before reading anything the node checks the peer's uid with
   SO_PEERCRED; a peer of another uid is closed unread (the socket is 0600 inside a 0700
   root as well).
2. driver → node ``(NODE_HELLO, driver_pid, PROTOCOL_VERSION[, {"probe": True}])`` (a probe:
   ``miniray start`` checking the node answers, no job); node → driver
   ``(NODE_WELCOME, info)``, info = ``{"protocol", "session_dir", "session_name",
   "ledger_path", "node_id", "node_ip", "totals" (floats), "gpu_ids", "gpu_ids_are_ints",
   "gpu_keys", "accelerator_type", "object_store_memory", "address", "port", "node_pid",
   "miniray_version", "python_version", "job_id"}``; ``job_id`` numbers the node's drivers
   01000000, 02000000, ... in the order they connect (the actor service and probes get
   ffffffff). The driver leaves (RuntimeError, as Ray's) if
   the versions are not its own (``protocol.version_mismatch``).
   A HELLO of another protocol version (version 1 sent the string ``"HELLO"``) is answered
   ``(NODE_REFUSED, text)``, which says what to do; any other first message closes the
   connection unanswered.
3. ``(SPAWN, req)`` + fds [data, control, stdout, stderr]: the node sends them to its fork
   server under its own request id, closes its copies and remembers (driver, req). Fork server
   ``SPAWNED(id, pid)`` → node → driver ``(SPAWNED, req, pid)``: the pid is that driver's.
4. Fork server ``EXITED(pid, wait_status)`` → node → ``(EXITED, pid, wait_status)`` to the
   driver that owns the pid (dropped when that driver has gone).
   Then driver → node ``(NODE_STORE, session tag)``: the tag of the driver's object store
   (``shm_segments.new_session_tag``), so that step 7 can remove what the driver leaves.
5. ``(KILL, pid, sig)`` is forwarded to the fork server only if the pid is the sender's.
6. ``(NODE_GOODBYE, grace)`` (the driver's shutdown): the node waits up to ``grace`` seconds for the
   driver's workers to exit, SIGKILLs the rest, waits for their EXITED, releases the driver's
   leases (``ledger.release_holder(driver_pid)``, and its host GPU leases), then answers
   ``(BYE,)`` and closes. The driver's shutdown returns only then, so nothing of it is left
   on the node when the same process connects again.
7. EOF without NODE_GOODBYE (the driver exited or was SIGKILLed): as 6 with no grace and no BYE.
   Other drivers are unaffected. Once the driver's process (the SO_PEERCRED pid, with its start
   time) is gone, the node removes what its store left: the segments named with its NODE_STORE
   tag, and its folders ``<session>/objects/driver_<pid>`` and ``<spill>/driver_<pid>``
   (``_sweep_dead_stores``). A driver still alive after ``STORE_SWEEP_WAIT_S`` keeps them.
8. Node shutdown (SIGTERM, SIGINT, ``miniray stop``): first SIGTERM to the actor service (a
   driver of this node, started by it: ``actor_service.py``), served until it has said
   NODE_GOODBYE and exited (SIGKILL after ``SERVICE_STOP_S``); then stop accepting, remove the
   records; a member tells the head it leaves and closes its TCP side (``peering.py`` step
   6; a head closes its members' links); ``(NODE_STOPPING, reason)`` to every driver (it
   fails its pending work with that reason); fork server SHUTDOWN (it kills every worker;
   EXITED is forwarded); close every driver's socket (drivers see EOF); remove the session
   directory. A node killed with SIGKILL: its
   fork server sees EOF and kills the workers; the next ``miniray start``/``stop``/``init()``
   sweeps the session directory (its ``owner.pid`` is dead).

A driver that lets 4 seconds pass without reading while the node must send to it is dropped
as in 7: the node never blocks on one driver for long.

Workers of drivers on other hosts (``remote_drivers.py`` step 8, wired in
``attach_peering``): the four attach connections are handed over
(``PeerChannel.handover``; a TLS one as a socketpair's end relayed by a thread of this
process, ``transport/tls_relay.py``: its session cannot move) and sent to the fork
server as ``(SPAWN, req, remote)``, where
``remote`` holds the data and control connections' frame state (keys and sequence numbers:
over the fork server's AF_UNIX socket only) and this node's session dir, node id, ip and
shm dir; its SPAWNED calls the spawner's ``done(pid)``, its EXITED of such a pid goes to
``RemoteDrivers.worker_exited`` (the driver link). Local spawns stay ``(SPAWN, req)``.

Start-up (``run_node``), in order: sweep stale sessions; bind the TCP listener on
``--node-ip-address:--port`` (a taken port is an error naming it); create the session dir,
ledger and node socket; a member joins the head (a refusal: ``NodeStartError``, and
everything above is undone; no process was started yet); then the fork server, the records,
the actor service, ``on_ready``, and the loop. The join comes before any process is started
so that the head lists the node sooner (a fork server's start costs the node milliseconds
and competes for a core while it imports); the node returns from ``miniray start`` only
once all of it exists. The process imports only what a node uses (no runtime, owner, worker
or public API: ``tests/unit/test_light_import.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import selectors
import shutil
import signal
import socket
import sys
import time
import weakref
from typing import Any, Callable

import miniray
from miniray._private.core import config, ids, protocol
from miniray._private.core.cluster_view import NodeEntry
from miniray._private.host import auth_token, procinfo, session, worker_logs
from miniray._private.ledger.inventory import node_resources
from miniray._private.ledger.ledger import Ledger
from miniray._private.node import peering
from miniray._private.transport import node_client as nc
from miniray._private.transport import peer_handshake
from miniray._private.transport.node_client import NodeRecord, NodeStartError, find_node
from miniray._private.transport.spawn import ForkServerClient

__all__ = ["NodeServer", "NodeStartError", "find_node", "main", "run_node"]

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 4.0
STATS_INTERVAL_S = 0.25
SERVICE_STOP_S = 5.0  # SIGTERM, then SIGKILL after this long
SERVICE_RESTARTS = 5
STORE_SWEEP_WAIT_S = 30.0  # how long a dropped driver's process may take to exit


class _Driver:
    __slots__ = ("sock", "pid", "workers", "spawning", "leaving", "deadline", "killed",
                 "peer", "store_tag", "said_goodbye")

    def __init__(self, sock: socket.socket, peer: tuple[int, int | None] = (0, None)):
        self.sock: socket.socket | None = sock
        self.pid: int | None = None  # from NODE_HELLO (the pid the driver's leases carry)
        self.peer = peer  # (pid, start time) from SO_PEERCRED: a pid of this node's namespace
        self.store_tag: str | None = None  # from NODE_STORE
        self.said_goodbye = False
        self.workers: set[int] = set()
        self.spawning = 0
        self.leaving = False
        self.deadline = 0.0
        self.killed = False


class NodeServer:
    """The node's event loop: drivers, the fork server, signals. Single-threaded."""

    def __init__(self, *, info: dict, ledger, fork_server, listener: socket.socket,
                 gpu_keys: list, stats_path: str):
        self.info = info
        self.ledger = ledger
        self.fork_server = fork_server
        self.listener = listener
        self.gpu_keys = gpu_keys
        self.stats_path = stats_path
        self._sel = selectors.DefaultSelector()
        self._drivers: dict[int, _Driver] = {}  # by socket fd
        self._leaving: list[_Driver] = []
        self._spawns: dict[int, tuple[_Driver, int]] = {}  # fork-server req -> (driver, req)
        self._owners: dict[int, _Driver] = {}  # worker pid -> driver
        self._remote_spawns: dict[int, Callable] = {}  # fork-server req -> done(pid)
        # Remote workers' output log files (``_remote_spawn``), closed before the session
        # directory goes (``close``): a relay draining then writes nowhere.
        self._tees: weakref.WeakSet = weakref.WeakSet()
        self._stop = False
        self.stop_reason: str | None = None  # told to the drivers (NODE_STOPPING) at close()
        self.fatal: str | None = None
        self._spawned_total = 0
        self._stats_due: float | None = 0.0
        self._stats_written = 0.0
        self._service = None  # the actor service (a subprocess.Popen), see start_actor_service
        self._jobs = 0  # drivers numbered so far (their job ids)
        self._service_fd = -1  # its pidfd, watched for its exit
        self._service_args: tuple | None = None
        self._service_restarts = 0
        self._service_deadline: float | None = None  # set once it was asked to stop
        self._dead_stores: list[tuple[_Driver, float]] = []  # (driver, give up at)
        self.peering = None  # peering.Peering: the TCP listener and membership
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, self._on_accept)
        self._sel.register(fork_server.fileno(), selectors.EVENT_READ, self._on_fork_server)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._on_wake)

    # -- lifecycle -------------------------------------------------------------------------
    def install_signals(self, stop_on_hup: bool) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        stops = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if stop_on_hup else [])
        for sig in stops:
            signal.signal(sig, self._on_signal)
        if not stop_on_hup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _on_signal(self, signum, _frame) -> None:
        self._stop = True
        if self.stop_reason is None:
            name = signal.Signals(signum).name
            self.stop_reason = ("miniray stop, or SIGTERM" if signum == signal.SIGTERM
                                else f"it received {name}")

    def request_stop(self) -> None:
        self._stop = True
        self.wake()

    def wake(self) -> None:
        """Wake the loop (thread-safe): another thread queued work for it."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def attach_peering(self, peering) -> None:
        """Serve ``peering`` (the TCP listener, joins, heartbeats) in this loop; remote
        drivers' workers are forked by this node's fork server (``_remote_spawn``; with
        TLS each connection through a relay of this process: ``transport/tls_relay.py``)."""
        self.peering = peering
        drivers = getattr(peering, "drivers", None)
        if drivers is not None:
            drivers.spawner = self._remote_spawn
            drivers.session_dir = self.info.get("session_dir")  # steps 13, 16: its logs, drivers
            drivers.kill_worker = lambda pid: self.fork_server.kill(pid, signal.SIGKILL)
            drivers.on_change = self._stats_changed  # what it keeps: ``miniray status``
        peering.register(self._sel, self.wake)

    def _remote_spawn(self, channels: list, name: str, done) -> None:
        """``RemoteDrivers``' spawner: the four attach connections' fds, and the frame state
        of the data and control ones (their keys: over the fork server's AF_UNIX socket
        only), go to the fork server as ``(SPAWN, req, remote)``; ``done(pid)`` follows
        its SPAWNED (``_on_fork_server``). The worker is this node's: its session, node id
        and shared memory, not the driver's. Its stdout and stderr go through a relay of
        this process that keeps them in this session's logs (``worker-<pid>.out/.err``,
        ``worker_logs.LogTee``, opened when the pid is known; ``tls_relay.py`` says why
        here), unless ``MINIRAY_WORKER_LOG_BYTES=0``."""
        session_dir = self.info.get("session_dir") or ""
        cap = config.worker_log_bytes() if session_dir else 0
        tees = [worker_logs.LogTee(), worker_logs.LogTee()] if cap > 0 else [None, None]
        self._tees.update(tee for tee in tees if tee is not None)
        fds, states = [], []
        try:
            for channel, tee in zip(channels, [None, None] + tees):
                fd, state = channel.handover(tee)
                fds.append(fd)
                states.append(state)
        except BaseException:
            for fd in fds:
                os.close(fd)
            for channel in channels:
                channel.close()
            for tee in tees:
                if tee is not None:
                    tee.close()
            raise
        if cap > 0:
            def spawned(pid, done=done):
                if isinstance(pid, int):
                    for err, tee in enumerate(tees):
                        tee.open(session_dir, pid, bool(err), cap)
                done(pid)
        else:
            spawned = done
        remote = {"frames": [states[0], states[1]],
                  "node": {"session_dir": self.info.get("session_dir"),
                           "node_id": self.info.get("node_id"),
                           "node_ip": self.info.get("node_ip"),
                           "shm_dir": config.shm_dir()}}
        try:
            req = self.fork_server.spawn(fds, remote)
        finally:
            for fd in fds:
                os.close(fd)
        self._remote_spawns[req] = spawned

    # -- the actor service ---------------------------------------------------------------------
    def start_actor_service(self, env: dict, root: str) -> None:
        """Start the process where named and detached actors live (``actor_service.py``): a
        driver of this node, child of this process, stopped before the node stops."""
        self._service_args = (env, root)
        self._spawn_service()

    def _spawn_service(self) -> None:
        import subprocess

        env, root = self._service_args
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(miniray.__file__)))
        env = dict(env, PYTHONPATH=os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self._service = subprocess.Popen(
            [sys.executable, "-m", "miniray._private.node.actor_service", self.info["address"],
             root, self.info["session_dir"], str(os.getpid())],
            stdin=subprocess.DEVNULL, cwd="/", env=env)
        with contextlib.suppress(OSError):  # `miniray stop` waits for it (node_client.py)
            pid = self._service.pid
            path = os.path.join(self.info["session_dir"], nc.SERVICE_PID)
            with open(f"{path}.tmp", "w") as f:
                f.write(f"{pid} {procinfo.start_time(pid)}\n")
            os.replace(f"{path}.tmp", path)
        try:
            self._service_fd = os.pidfd_open(self._service.pid)
            self._sel.register(self._service_fd, selectors.EVENT_READ, self._on_service_exit)
        except (AttributeError, OSError):  # no pidfd: polled by serve()
            self._service_fd = -1
        logger.info("actor service started (pid %d)", self._service.pid)

    def _on_service_exit(self, _fd=None) -> None:
        proc = self._service
        if proc is None or proc.poll() is None:
            return
        if self._service_fd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self._service_fd)
            os.close(self._service_fd)
            self._service_fd = -1
        self._service = None
        if self._stop:
            return
        logger.error("the actor service (pid %d) exited with %s; named and detached actors "
                     "that lived there are gone", proc.pid, proc.returncode)
        if self._service_restarts < SERVICE_RESTARTS:
            self._service_restarts += 1
            self._spawn_service()

    def _stop_service(self) -> bool:
        """Called while stopping: SIGTERM, then SIGKILL after SERVICE_STOP_S; True once the
        service has exited (the node keeps serving it meanwhile: it says NODE_GOODBYE)."""
        proc = self._service
        if proc is None:
            return True
        if self._service_fd < 0:
            self._on_service_exit()
            if self._service is None:
                return True
        now = time.monotonic()
        if self._service_deadline is None:
            self._service_deadline = now + SERVICE_STOP_S
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)
        elif now >= self._service_deadline and proc.returncode is None:
            logger.warning("the actor service did not stop in %.0f s; killing it",
                           SERVICE_STOP_S)
            with contextlib.suppress(OSError):
                proc.kill()
            self._service_deadline = now + 3600
        return False

    def serve(self) -> None:
        """Runs until a stop signal, ``request_stop()`` or the fork server's death; the actor
        service is stopped first, while the node still serves it."""
        while not (self._stop and self._stop_service()):
            now = time.monotonic()
            due = [d.deadline for d in self._leaving if not d.killed]
            if self._stats_due is not None:
                due.append(self._stats_due)
            if self._dead_stores:  # poll /proc until the dropped drivers have exited
                due.append(now + 0.05)
            if self._service is not None and (self._service_fd < 0 or self._stop):
                due.append(now + 0.5 if self._service_fd < 0 else
                           min(self._service_deadline or now, now + 0.5))
            if self.peering is not None:
                due.append(self.peering.due(now))
            timeout = max(0.0, min(due) - now) if due else None
            for key, _ in self._sel.select(timeout):
                key.data(key.fileobj)
            if self.peering is not None:
                self.peering.tick(time.monotonic())
            self._progress_leaving()
            if self._dead_stores:
                self._sweep_dead_stores()
            if self._stats_due is not None and time.monotonic() >= self._stats_due:
                self._write_stats()
        if self.fatal:
            logger.error("%s", self.fatal)

    def close(self) -> None:
        """Protocol step 8 from the socket on (the caller removes records and the dir)."""
        if self._service is not None:  # serve() did not get to stop it
            with contextlib.suppress(OSError):
                self._service.kill()
            with contextlib.suppress(Exception):
                self._service.wait(timeout=5.0)
            if self._service_fd >= 0:
                os.close(self._service_fd)
            self._service = None
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self.listener)
        self.listener.close()
        if self.peering is not None:  # a member tells the head it leaves (expected)
            self.peering.close(self.stop_reason or "it was asked to stop")
        # Drivers hear why before their workers' exits arrive, so no task is blamed for them.
        for driver in list(self._drivers.values()):
            if driver.sock is not None and not driver.leaving and driver.pid is not None:
                self._send(driver, (protocol.NODE_STOPPING,
                                    self.stop_reason or "it was asked to stop"))
        self.fork_server.request_shutdown(0.2)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            fd = self.fork_server.fileno()
            if fd < 0 or not select.select([fd], [], [], deadline - time.monotonic())[0]:
                break
            message = self.fork_server.read_message()
            if message is None or (message and message[0] == protocol.BYE):
                break
            if message and message[0] == protocol.EXITED:
                self._on_exited(message[1], message[2])
        self.fork_server.wait(timeout=5.0)
        self.fork_server.close()
        for tee in list(self._tees):  # the workers are gone; their relays may still drain
            tee.close()
        for driver in list(self._drivers.values()) + self._leaving:
            self._close_socket(driver)
        self._drivers.clear()
        self._leaving.clear()
        self._sel.close()
        signal.set_wakeup_fd(-1)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self.ledger.close()

    # -- events ----------------------------------------------------------------------------
    def _on_wake(self, _fd) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 512):
                pass

    def _on_accept(self, _sock) -> None:
        for conn, pid in nc.accept_same_uid(self.listener, logger):
            conn.settimeout(SEND_TIMEOUT_S)
            driver = _Driver(conn, (pid, procinfo.start_time(pid)))
            self._drivers[conn.fileno()] = driver
            self._sel.register(conn, selectors.EVENT_READ, self._on_driver)

    def _on_driver(self, sock: socket.socket) -> None:
        driver = self._drivers.get(sock.fileno())
        if driver is None:
            return
        fds: list[int] = []
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, nc.BUFSIZE, nc.MAX_FDS)
            message = pickle.loads(data) if data else None
        except Exception:  # OSError, or a datagram that is no pickle: drop the driver
            message = None
        if not message or not isinstance(message, tuple):
            for fd in fds:
                os.close(fd)
            self._driver_gone(driver, grace=0.0, bye=False)
            return
        try:
            self._dispatch(driver, message, fds)
        except Exception:
            logger.exception("driver pid %s sent %.200r; dropping it", driver.pid, message)
            self._driver_gone(driver, grace=0.0, bye=False)

    def _job_for(self, pid: int) -> str:
        """The job id of a driver saying HELLO: the node's drivers are jobs 1, 2, ... in the
        order they connect, as Ray numbers a cluster's jobs; the actor service (a driver the
        node runs for them) is no job of its own."""
        if self._service is not None and pid == self._service.pid:
            return ids.NIL_JOB_ID
        self._jobs += 1
        return ids.job_id_for(self._jobs)

    def _dispatch(self, driver: _Driver, message: tuple, fds: list[int]) -> None:
        tag = message[0]
        if (tag == protocol.SPAWN and driver.pid is not None and not driver.leaving
                and len(fds) == 4):
            try:
                req = self.fork_server.spawn(fds)
            finally:
                for fd in fds:
                    os.close(fd)
            self._spawns[req] = (driver, message[1])
            driver.spawning += 1
            return
        for fd in fds:
            os.close(fd)
        if driver.pid is None:
            pid, refusal = check_hello(message)
            if pid is not None:
                driver.pid = pid
                probe = len(message) == 4 and bool(message[3].get("probe"))
                job = ids.NIL_JOB_ID if probe else self._job_for(pid)
                self._send(driver, (protocol.NODE_WELCOME, dict(self.info, job_id=job)))
                logger.info("driver pid %d connected", driver.pid)
                self._stats_changed()
            else:
                if refusal is not None:  # queued before the close: the driver reads it
                    logger.warning("refused driver pid %s: %s", driver.peer[0], refusal)
                    self._send(driver, (protocol.NODE_REFUSED, refusal))
                self._driver_gone(driver, grace=0.0, bye=False)
        elif tag == protocol.KILL:
            _, pid, sig = message
            if pid in driver.workers and sig in signal.valid_signals():  # bad ones would
                self.fork_server.kill(pid, sig)  # raise in the fork server and end it
        elif tag == protocol.NODE_STORE and len(message) == 2:
            from miniray._private.object_store import shm_segments  # lazy: see _remove_store

            driver.store_tag = shm_segments.check_tag(message[1])
        elif tag == protocol.NODE_GOODBYE:
            driver.said_goodbye = True  # its own store cleans up after itself
            self._driver_gone(driver, grace=float(message[1]), bye=True)

    def _on_fork_server(self, _fd) -> None:
        message = self.fork_server.read_message()
        if message == ():
            return
        if message is None:
            self.fatal = ("the node's fork server exited unexpectedly; its workers are gone. "
                          "Stopping the node.")
            self.stop_reason = f"its fork server (pid {self.fork_server.pid}) exited"
            self._stop = True
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self.fork_server.fileno())
            return
        if message[0] == protocol.SPAWNED:
            _, req, pid = message
            done = self._remote_spawns.pop(req, None)
            if done is not None:  # a remote driver's worker (``_remote_spawn``)
                self._spawned_total += 1
                done(pid)
                return
            driver, driver_req = self._spawns.pop(req, (None, 0))
            if driver is None:
                self.fork_server.kill(pid, signal.SIGKILL)
                return
            driver.spawning -= 1
            driver.workers.add(pid)
            self._owners[pid] = driver
            self._spawned_total += 1
            if driver.killed:
                self.fork_server.kill(pid, signal.SIGKILL)
            elif driver.sock is not None:
                self._send(driver, (protocol.SPAWNED, driver_req, pid))
            self._stats_changed()
        elif message[0] == protocol.EXITED:
            self._on_exited(message[1], message[2])

    def _on_exited(self, pid: int, status: int) -> None:
        driver = self._owners.pop(pid, None)
        if driver is None:
            if self.peering is not None and getattr(self.peering, "drivers", None):
                self.peering.drivers.worker_exited(pid, status)
            return
        driver.workers.discard(pid)
        if driver.sock is not None:
            self._send(driver, (protocol.EXITED, pid, status))
        self._stats_changed()

    # -- drivers leaving -------------------------------------------------------------------
    def _send(self, driver: _Driver, message: tuple) -> None:
        try:
            nc.send_message(driver.sock, message)
        except OSError as error:  # gone, or not reading for SEND_TIMEOUT_S: drop it
            if driver.pid is not None:
                logger.warning("driver pid %s: send failed (%s); dropping it", driver.pid, error)
            self._close_socket(driver)
            if not driver.leaving:
                self._driver_gone(driver, grace=0.0, bye=False)

    def _close_socket(self, driver: _Driver) -> None:
        sock, driver.sock = driver.sock, None
        if sock is None:
            return
        self._drivers.pop(sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        sock.close()

    def _driver_gone(self, driver: _Driver, grace: float, bye: bool) -> None:
        """Protocol steps 6 and 7: from now on the driver only waits for its workers."""
        if driver.leaving:
            return
        driver.leaving = True
        driver.deadline = time.monotonic() + max(0.0, grace)
        if not bye:
            self._close_socket(driver)
        else:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(driver.sock)  # nothing more is read from it
        if driver.pid is None:  # never said HELLO: nothing to clean
            self._close_socket(driver)
            driver.leaving = False
            return
        self._leaving.append(driver)
        self._stats_changed()

    def _progress_leaving(self) -> None:
        now = time.monotonic()
        for driver in list(self._leaving):
            if not driver.killed and now >= driver.deadline:
                driver.killed = True
                for pid in sorted(driver.workers):
                    self.fork_server.kill(pid, signal.SIGKILL)
            if driver.workers or driver.spawning:
                continue
            self._leaving.remove(driver)
            self._release(driver)
            if not driver.said_goodbye and driver.pid is not None:
                self._dead_stores.append((driver, now + STORE_SWEEP_WAIT_S))
            if driver.sock is not None:
                with contextlib.suppress(OSError):
                    nc.send_message(driver.sock, (protocol.BYE,))
                self._close_socket(driver)

    def _release(self, driver: _Driver) -> None:
        pid = driver.pid
        if any(d.pid == pid for d in self._drivers.values() if not d.leaving):
            return  # the same process is connected again: the leases are that connection's
        released = host = 0
        try:
            released = self.ledger.release_holder(pid)
            if any(self.gpu_keys):
                # lazy: not on the join's path, as in _remove_store
                from miniray._private.ledger.host_gpus import HostGpuLedger

                host = HostGpuLedger().release_holder(pid)
        except Exception:
            logger.exception("releasing the leases of driver pid %d failed", pid)
        logger.info("driver pid %d left; released %d lease(s), %d host GPU lease(s)",
                    pid, released, host)

    def _sweep_dead_stores(self) -> None:
        """Protocol step 7, end: remove the store of each dropped driver whose process is
        gone (decided here, acted on after: the node is single-threaded, nothing to lock)."""
        now = time.monotonic()
        ready = []
        for item in list(self._dead_stores):
            driver, give_up = item
            if not procinfo.is_alive(*driver.peer):
                ready.append(driver)
            elif now < give_up:
                continue
            self._dead_stores.remove(item)
        for driver in ready:
            _remove_store(self.info["session_dir"], driver.pid, driver.store_tag)

    # -- observability ---------------------------------------------------------------------
    def _stats_changed(self) -> None:
        # At once after a quiet spell, else at most every STATS_INTERVAL_S (a burst of spawns
        # costs one write).
        if self._stats_due is None:
            self._stats_due = max(time.monotonic(), self._stats_written + STATS_INTERVAL_S)

    def statistics(self) -> dict[str, Any]:
        """Connected drivers and their workers (written to ``node_stats.json`` for status)."""
        drivers = [d for d in self._drivers.values() if d.pid is not None] + self._leaving
        service = self._service.pid if self._service is not None else None
        return {
            "updated_at": time.time(),
            "drivers": [{"pid": d.pid, "workers": len(d.workers), "leaving": d.leaving,
                         "actor_service": d.pid == service}
                        for d in sorted(drivers, key=lambda d: d.pid or 0)],
            "actor_service_pid": service,
            "workers": len(self._owners),
            "spawning": len(self._spawns),
            "spawned_total": self._spawned_total,
            # Results kept for drivers on other hosts, per link (``RemoteDrivers``); None
            # without peering (a node no other host reaches).
            "kept": drivers.kept_rows() if (drivers := getattr(self.peering, "drivers",
                                                               None)) else None,
        }

    def _write_stats(self) -> None:
        self._stats_due = None
        self._stats_written = time.monotonic()
        with contextlib.suppress(OSError):
            nc.write_json(self.stats_path, self.statistics())

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"<NodeServer {self.info['address']} drivers={len(s['drivers'])} "
                f"workers={s['workers']}>")


def check_hello(message: tuple) -> tuple[int | None, str | None]:
    """A driver's first message: ``(driver pid, None)`` for a NODE_HELLO of this protocol
    version; ``(None, why)`` for a HELLO of another version (the driver is told ``why``);
    ``(None, None)`` for anything else (closed unanswered).

    Example:
        >>> check_hello((protocol.NODE_HELLO, 4242, protocol.PROTOCOL_VERSION))
        (4242, None)
        >>> why = check_hello((protocol.V1_NODE_HELLO, 4242))[1]
        >>> version = protocol.PROTOCOL_VERSION
        >>> why.startswith(f"this node speaks miniray protocol version {version},")
        True
    """
    tag = message[0]
    if tag == protocol.V1_NODE_HELLO:
        version = 1
    elif (tag == protocol.NODE_HELLO and len(message) in (3, 4) and isinstance(message[1], int)
          and (len(message) == 3 or isinstance(message[3], dict))):
        version = message[2]
        if version == protocol.PROTOCOL_VERSION:
            return message[1], None
    else:
        return None, None
    return None, (
        f"this node speaks miniray protocol version {protocol.PROTOCOL_VERSION}, the driver "
        f"version {version!r}. Run the driver with the miniray the node was started with, or "
        "restart the node with that of the driver (`miniray stop`, then `miniray start --head`)."
    )


def _remove_store(session_dir: str, driver_pid: int, tag: str | None) -> None:
    """What the store of a dead driver of this node left: its segments, its folders."""
    # lazy: the store's module (and cloudpickle with it) is not on the join's path; the node
    # loads it when a driver first names its store
    from miniray._private.object_store import shm_segments

    swept = []
    if tag:
        swept = shm_segments.sweep_segments(config.shm_dir(), lambda t: t == tag)
    name = f"driver_{driver_pid}"
    for folder in (os.path.join(session_dir, "objects", name),
                   os.path.join(session.spill_dir(session_dir), name)):
        shutil.rmtree(folder, ignore_errors=True)
    nc.unlink_quiet(os.path.join(session_dir, session.STORE_STATS_DIR, f"{driver_pid}.json"))
    logger.info("driver pid %d died; removed %d segment(s) of its store %s", driver_pid,
                len(swept), tag)


# ------------------------------------------------------------------------- starting a node
def _bind_port(roots: list[str], ip: str, port: int | None) -> socket.socket:
    """The node's TCP listener on ``ip:port`` (default ``DEFAULT_PORT``; 0: a free one);
    NodeStartError naming the node that has the port, or the address that is taken."""
    used = {r.address: r for root in roots for r in nc.list_records(root)}
    if port is None:
        port = nc.DEFAULT_PORT
    other = used.get(f"{ip}:{port}") if port else None
    if other is not None:
        raise NodeStartError(
            f"miniray is trying to start at {ip}:{port}, but is already running at "
            f"{other.address} (pid {other.pid}, {other.session_dir}). Please specify a "
            "different port using the `--port` flag of `miniray start` command "
            "(`--port 0` picks a free one)."
        )
    return peering.bind_listener(ip, port)


def _fork_server_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = []
    for path in sys.path:
        path = os.path.abspath(path) if path else ""
        if path and path not in paths:  # not "" (the daemon's cwd is /): drivers send theirs
            paths.append(path)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_node(options: dict, on_ready: Callable[[NodeRecord, dict], None], *,
             daemon: bool) -> int:
    """Runs a node in this process until it is stopped; returns 0, or 1 if it stopped because
    its fork server died. ``options``: port, num_cpus, num_gpus, resources,
    object_store_memory, memory, temp_dir, node_ip (the address to listen on),
    head_address (``"ip:port"``: join that head; absent: this node is a head), all
    optional. ``on_ready(record, info)`` is called once drivers can connect. NodeStartError
    (before ready) when the node cannot start; ValueError for resources Ray refuses. Call it
    from the main thread (signal handlers)."""
    default_root = config.tmpdir_root()
    root = os.path.abspath(options.get("temp_dir") or default_root)
    roots = [root] if root == default_root else [root, default_root]
    head = nc.parse_address(options["head_address"]) if options.get("head_address") else None
    node_ip = options.get("node_ip") or (peering.route_source(head[0]) if head else nc.NODE_IP)
    try:  # the token: a head may create it (`miniray start --head` did already), a member not
        token = auth_token.load_token(create=head is None)
        tls = peer_handshake.tls_contexts()  # MINIRAY_USE_TLS=1 and its files, else None
    except auth_token.AuthTokenError as error:
        raise NodeStartError(str(error) + (
            " A node joins with the head's token: copy it from `miniray get-auth-token` on "
            "the head." if head else "")) from None
    spec = node_resources(options.get("num_cpus"), options.get("num_gpus"),
                          options.get("resources"), options.get("object_store_memory"), node_ip)
    totals = dict(spec["totals"])
    if head is not None:  # Ray gives this resource to the head node only
        totals.pop("node:__internal_head__", None)
    if options.get("memory"):
        totals["memory"] = float(options["memory"])
    with nc.root_locked(root):
        for r in roots:
            nc.sweep_stale(r)
        tcp = _bind_port(roots, node_ip, options.get("port"))
        port = tcp.getsockname()[1]
        try:
            session_dir = session.create_session_dir(root)
        except BaseException:
            tcp.close()
            raise
    stack = contextlib.ExitStack()
    stack.callback(session.remove_session_dir, session_dir)
    stack.callback(tcp.close)
    log_path = os.path.join(session_dir, nc.NODE_LOG)
    if daemon:  # from here on, everything the node prints goes to node.log
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    else:
        handler = logging.FileHandler(log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        stack.callback(logger.removeHandler, handler)
        stack.callback(handler.close)
    with stack:
        gpu_ids = spec["gpu_ids"]
        ledger_path = os.path.join(session_dir, "ledger.json")
        ledger = Ledger.create(ledger_path, totals, {"GPU": gpu_ids} if gpu_ids else {})
        sock_path = os.path.join(session_dir, nc.NODE_SOCKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stack.callback(listener.close)
        old_umask = os.umask(0o177)
        try:
            with nc.sun_path(sock_path) as name:
                listener.bind(name)
        finally:
            os.umask(old_umask)
        os.chmod(sock_path, 0o600)
        listener.listen(64)
        node_id = ids.random_hex(ids.NODE_ID_SIZE)
        address = f"{node_ip}:{port}"
        entry = NodeEntry(
            node_id=node_id, ip=node_ip, port=port, is_head=head is None,
            hostname=socket.gethostname(), totals=ledger.totals(), gpu_ids=list(gpu_ids),
            accelerator_type=spec["accelerator_type"], incarnation=1, start_time=time.time())
        link = snapshot = None
        if head is not None:  # join steps 1-2, before any process is started: the head
            # lists this node without waiting for them, and a refusal leaves nothing running
            link, snapshot = _join(head, token, entry, tls)
            stack.callback(link.close)  # if a later step fails (idempotent)
        fork_server = ForkServerClient(_fork_server_env())
        info = {
            "protocol": protocol.PROTOCOL_VERSION, "session_dir": session_dir,
            "session_name": os.path.basename(session_dir), "ledger_path": ledger_path,
            "node_id": node_id, "node_ip": node_ip,
            "totals": ledger.totals(), "gpu_ids": gpu_ids,
            "gpu_ids_are_ints": spec["gpu_ids_are_ints"], "gpu_keys": spec["gpu_keys"],
            "accelerator_type": spec["accelerator_type"],
            "object_store_memory": spec["object_store_memory"], "address": address,
            "port": port, "node_pid": os.getpid(), **protocol.local_versions(),
        }
        record = NodeRecord(
            pid=os.getpid(), start_time=procinfo.start_time(os.getpid()), address=address,
            port=port, socket=sock_path, session_dir=session_dir, started_at=time.time(),
            node_id=node_id, fork_server_pid=fork_server.pid,
            fork_server_start=procinfo.start_time(fork_server.pid),
            gpu_keys=spec["gpu_keys"], pid_ns=procinfo.identity().pid_ns,
            boot_id=procinfo.identity().boot_id, path=os.path.join(session_dir, nc.RECORD_FILE),
            head_address=f"{head[0]}:{head[1]}" if head else "",
        )
        try:
            server = NodeServer(info=info, ledger=ledger, fork_server=fork_server,
                                listener=listener, gpu_keys=spec["gpu_keys"],
                                stats_path=os.path.join(session_dir, nc.NODE_STATS))
        except BaseException:
            fork_server.close()
            fork_server.wait(timeout=5.0)
            raise
        try:
            server.install_signals(stop_on_hup=not daemon)
            with nc.root_locked(root):
                nc.write_json(record.path, record.to_json())
            with nc.root_locked(default_root):
                current = os.path.join(default_root, nc.CURRENT_NODE)
                with open(f"{current}.{os.getpid()}.tmp", "w") as f:
                    f.write(record.path + "\n")
                os.replace(f"{current}.{os.getpid()}.tmp", current)
            server.attach_peering(peering.Peering(
                entry=entry, listener=tcp, token=token, session_dir=session_dir,
                ledger=ledger, head=head, channel=link, snapshot=snapshot, tls=tls,
                gpu_keys=spec["gpu_keys"]))
            logger.info("node %s started at %s%s: %s", info["node_id"][:12], address,
                        f", joined {head[0]}:{head[1]}" if head else " (head)", totals)
            server.start_actor_service(_fork_server_env(), root)
            on_ready(record, info)
            server.serve()
            return 1 if server.fatal else 0
        finally:
            logger.info("node %s stopping", info["node_id"][:12])
            _remove_records(record, default_root)
            server.close()


def _join(head: tuple[str, int], token: bytes, entry: NodeEntry, tls) -> tuple:
    """Join steps 1-2 (``peering.join_head``): the link and the head's first view, or
    NodeStartError with the message to show."""
    try:
        return peering.join_head(head, token, entry, ssl_context=tls[0] if tls else None)
    except peering.JoinError as error:
        raise NodeStartError(str(error)) from None
    except (OSError, TimeoutError) as error:
        raise NodeStartError(
            f"cannot join the head at {head[0]}:{head[1]}: {error}. Check the "
            "address, and that `miniray start --head` runs there.") from None


def _remove_records(record: NodeRecord, default_root: str) -> None:
    nc.unlink_quiet(record.path)
    current = os.path.join(default_root, nc.CURRENT_NODE)
    with contextlib.suppress(OSError), nc.root_locked(default_root):
        with open(current) as f:
            if f.read().strip() == record.path:
                nc.unlink_quiet(current)
    with contextlib.suppress(OSError):
        os.rmdir(default_root)


def main() -> None:
    """The daemon, run in the process ``daemon.spawn_daemon`` forks, with ``sys.argv`` set
    to ``[-c, FD, OPTIONS]`` (as ``python -c 'from miniray._private.node.node import main;
    main()' FD OPTIONS`` would run it).

    Reports ``{"ok": true, "record": path}`` or ``{"ok": false, "error": text}`` as one JSON
    line on FD (a pipe ``spawn_daemon`` reads), then serves until stopped."""
    ready_fd = int(sys.argv[1])
    options = json.loads(sys.argv[2])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def report(doc: dict) -> None:
        nonlocal ready_fd
        if ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (json.dumps(doc) + "\n").encode())
                os.close(ready_fd)
            ready_fd = -1

    try:
        code = run_node(options, lambda record, _info: report({"ok": True, "record": record.path}),
                        daemon=True)
    except (NodeStartError, ValueError) as error:
        report({"ok": False, "error": str(error)})
        raise SystemExit(1) from None
    except BaseException as error:
        logger.exception("the node failed")
        report({"ok": False, "error": f"{type(error).__name__}: {error}"})
        raise SystemExit(1) from None
    raise SystemExit(code)


