"""The owner's worker pool: the worker processes of the session, as the driver sees them.

Owns: one ``WorkerSlot`` per worker (its sockets, output streams, pid, what it runs), the
lookups by data fd, spawn request and pid, the idle workers kept for reuse (a lease gets only
an idle worker of its kind, started in its runtime environment: ``scheduling.worker_serves``),
the counts the cap on workers is checked against (live, blocked in ``get()``, hosting an
actor), and workers named or gone before they were adopted (asked for outside the owner's
lock). Starting a worker
is two halves: ``start`` (the fork request, no lock) and ``adopt`` (watch it, under the lock).
Does not own: what a worker runs or why it died (tasks in ``owner.py``, actors in
``actors.py``), its lease (``leases.py``), or the fork server (``transport/spawn.py``).
Called by: ``owner.Owner`` with its lock held, except ``WorkerPool.start``.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import threading
from multiprocessing.connection import Connection
from typing import Callable

from miniray._private.core import scheduling
from miniray._private.host import worker_logs
from miniray._private.owner.output import OutputStream
from miniray._private.transport.framing import FramedSocket


class WorkerSlot:
    __slots__ = (
        "conn", "ctl", "pid", "spawn_req", "inflight", "lease", "funcs", "calls", "fn_calls",
        "spent", "read_pins", "borrowed", "kind",
        "blocked", "dead", "out", "err", "kill_on_spawn", "actor", "exited", "runtime_env",
        "waits", "interrupted", "recalled", "output_poll", "read_lock", "output_lock",
        "direct", "data_poll", "ready", "named", "oom",
    )

    def __init__(self, conn: Connection, ctl: Connection, spawn_req: int):
        self.conn = conn
        self.ctl = ctl
        self.pid: int | None = None
        self.spawn_req = spawn_req
        self.inflight: collections.deque = collections.deque()
        self.lease = None  # its LeaseSlot (leases.py) while it runs tasks
        self.funcs: set = set()
        self.calls = 0
        self.fn_calls: dict[bytes, int] = {}
        self.spent = False  # reached a function's max_calls: retire once idle
        self.kind: bool | None = None  # scheduling.worker_kind of its first lease
        self.borrowed: set[bytes] = set()  # ids it reported holding refs to (BORROW)
        self.read_pins: list[bytes] = []  # objects handed to its get(): pinned until it
        #                                   reports again (by then it has mapped them)
        self.blocked = 0
        # Its pending GET/WAIT requests: req_id -> (the waiting call's task id, abandon()),
        # and the calls cancelled while they run here, whose waits are answered CANCELLED.
        self.waits: dict[int, tuple] = {}
        self.interrupted: set[bytes] = set()
        self.dead = False
        self.out: OutputStream | None = None
        self.err: OutputStream | None = None
        # A poll set of both pipes (no OS resource: poll(2) takes the list at each call).
        self.output_poll = None
        # Held by the thread that reads the data socket and handles what it read: the I/O
        # thread (it only tries: while a waiting caller reads, it leaves the socket alone),
        # or a ``get()`` reading its own result (``Owner._read_direct``). Frames are handled
        # in the order they were sent, and no two threads read the socket at once.
        self.read_lock = threading.Lock()
        # Held while its output pipes are read and printed (the I/O thread's ``_on_output``,
        # ``drain_printed`` in whichever thread handles a result): lines keep their order.
        self.output_lock = threading.Lock()
        self.direct = False  # a get() reads its result from the data socket (owner's lock)
        self.data_poll = None  # that reader's poll set of the data socket, made at first use
        self.kill_on_spawn = False
        self.oom: str | None = None  # why the memory monitor killed it (memory_watch.py)
        self.actor = None  # the actor this worker hosts (actors.py), if any
        self.exited = False  # its process is gone and was handled (owner._worker_gone)
        self.runtime_env = ""  # the environment it was started in (runtime_envs.env_key)
        self.recalled = False  # asked to give back its pipelined tasks (RECALL), no answer yet
        self.ready = False  # it answered HELLO with READY: set up, waiting in its loop
        # The name of the last TASK sent to it: its output's prefix once it ran all it got
        # (may be stale after a give-back or a cancel: then only a NAMED is spared or sent
        # needlessly, never a prefix lost; see ``name_output``).
        self.named: str | None = None

    def runs_work(self) -> bool:
        """*Locked.* It runs a task (or holds tasks sent to it) or an actor call."""
        return bool(self.inflight) or (self.actor is not None and bool(self.actor.inflight))

    def drain_printed(self) -> None:
        """Print what this worker has written to its stdout/stderr pipes so far. Called
        before its results (and yielded items) are handled, after their frames were read:
        what it printed before sending them is in the pipes by then, so it comes first. One
        ``poll()`` of both pipes; a pipe is read only when it has data (or was closed)."""
        output_poll = self.output_poll
        if output_poll is None:
            return
        with self.output_lock:  # a drain by the I/O thread under way is printed first
            self._drain(output_poll)

    def _drain(self, output_poll) -> None:
        for fd, _ in output_poll.poll(0):
            stream = self.out if fd == self.out.fd else self.err
            if stream.closed:  # its number may be another file's by now
                output_poll.unregister(fd)
            else:
                stream.drain()

    def name_output(self, name: str) -> bool:
        """*Owner's lock held.* Prefix this worker's output with ``name`` from here on,
        instead of the marker line the worker would write before the task: only for an
        idle worker (nothing in flight: every result handled, so all it printed for earlier
        tasks is in its pipes, read here to the end first) that answered READY (what it
        printed while starting is read too) and whose pipes are on this host. The caller
        then sends ``(NAMED, name)`` before the TASK. False: not done, the worker marks."""
        output_poll = self.output_poll
        if output_poll is None or self.inflight or not self.ready or self.pid is None:
            return False
        out, err = self.out, self.err
        with self.output_lock:  # the I/O thread reads nothing between the drain and the name
            self._drain(output_poll)
            for stream in (out, err):
                if not stream.closed:
                    stream.name(self.pid, name)
        return True

    def __repr__(self) -> str:
        return f"<worker pid={self.pid} inflight={len(self.inflight)} calls={self.calls}>"


class WorkerPool:
    """``on_data(fd)`` and ``on_output(fd)`` are the I/O thread's handlers of a worker's
    data socket and of its stdout/stderr pipes."""

    def __init__(self, *, reactor, log_to_driver: bool, prefix_enabled: bool,
                 max_workers: int, idle_keep: int, on_data: Callable[[int], None],
                 on_output: Callable[[int], None], log_dir: str | None = None,
                 log_cap: int = 0):
        self.reactor = reactor
        # Workers' log files (host/worker_logs.py): <log_dir>/worker-<pid>.out/.err, each
        # capped at log_cap bytes; None: none are kept.
        self.log_dir = log_dir if log_cap > 0 else None
        self.log_cap = log_cap
        self.log_to_driver = log_to_driver
        self.prefix_enabled = prefix_enabled
        self.max_workers = max_workers
        self.idle_keep = idle_keep
        self._on_data = on_data
        self._on_output = on_output
        self.idle: list[WorkerSlot] = []
        self.by_fd: dict[int, WorkerSlot] = {}
        self.by_req: dict[int, WorkerSlot] = {}
        self.by_pid: dict[int, WorkerSlot] = {}
        self.streams: dict[int, OutputStream] = {}
        self.live = 0
        self.blocked = 0  # workers blocked in get()/wait()
        self.actors = 0  # workers hosting an actor
        # Workers asked for outside the lock may be named (SPAWNED) or even exit before they
        # are adopted: their pid and exit status wait here.
        self.early_spawned: dict[int, int] = {}
        self.early_exits: dict[int, int] = {}

    def busy(self) -> int:
        """Workers that count against the cap: not blocked in get(), not hosting an actor."""
        return self.live - self.blocked - self.actors

    def room(self, taking: int, request: dict | None = None, runtime_env: str = "") -> int:
        """How many more leases workers can serve now: the idle ones (those that may run
        ``request`` in ``runtime_env``), plus new ones up to the cap, less the ``taking``
        leases being taken."""
        idle = self.idle if request is None else [
            worker for worker in self.idle
            if scheduling.worker_serves(worker, request, runtime_env)]
        return len(idle) + max(0, self.max_workers - self.busy()) - taking

    def take_idle(self, request: dict, runtime_env: str = "") -> WorkerSlot | None:
        """An idle worker that may run tasks of ``request`` in ``runtime_env`` (no longer
        idle), or None."""
        index = scheduling.idle_worker_for(self.idle, request, runtime_env)
        return None if index is None else self.idle.pop(index)

    def ready_idle(self, request: dict, runtime_env: str = "") -> WorkerSlot | None:
        """The most recently idle worker that is ready (READY came) and may run tasks of
        ``request`` in ``runtime_env``; it stays idle. None if there is none."""
        for worker in reversed(self.idle):
            if worker.ready and scheduling.worker_serves(worker, request, runtime_env):
                return worker
        return None

    def idle_pids(self, request: dict, runtime_env: str, count: int) -> list:
        """The pids of the first ``count`` workers ``take_idle`` would give, in that order
        (None for one not named yet): a lease taken for one records its worker at once."""
        pids = []
        for worker in reversed(self.idle):
            if len(pids) == count:
                break
            if scheduling.worker_serves(worker, request, runtime_env):
                pids.append(worker.pid)
        return pids

    def retire_one_idle(self, request: dict | None = None, runtime_env: str = "") -> None:
        """Retire the oldest idle worker, one that may not run ``request`` in ``runtime_env``
        first (room for a new worker under the cap)."""
        unfit = [worker for worker in self.idle if request is not None
                 and not scheduling.worker_serves(worker, request, runtime_env)]
        self.retire((unfit or self.idle)[0])

    @staticmethod
    def start(fork_server) -> tuple:
        """*Not locked.* Ask ``fork_server`` for a worker; returns its request number and the
        parent ends of its sockets and pipes, for ``adopt`` or ``discard``."""
        data_parent, data_child = socket.socketpair()
        ctl_parent, ctl_child = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child_fds = [data_child.fileno(), ctl_child.fileno(), out_w, err_w]
        try:
            req = fork_server.spawn(child_fds)
        finally:
            data_child.close()
            ctl_child.close()
            os.close(out_w)
            os.close(err_w)
        return req, data_parent, ctl_parent, out_r, err_r

    def discard(self, parts: tuple) -> None:
        """Close a started worker's ends instead of adopting it (it exits on EOF)."""
        req, data_parent, ctl_parent, out_r, err_r = parts
        pid = self.early_spawned.pop(req, None)
        if pid is not None:
            self.early_exits.pop(pid, None)
        data_parent.close()
        ctl_parent.close()
        os.close(out_r)
        os.close(err_r)

    def adopt(self, parts: tuple) -> tuple[WorkerSlot, int | None]:
        """Watch a worker asked for by ``start``; returns it and its pid if the fork server
        named it already (then call ``named``)."""
        req, data_parent, ctl_parent, out_r, err_r = parts
        worker = WorkerSlot(FramedSocket(data_parent), Connection(ctl_parent.detach()), req)
        worker.out = OutputStream(out_r, "stdout", self.log_to_driver, self.prefix_enabled)
        worker.err = OutputStream(err_r, "stderr", self.log_to_driver, self.prefix_enabled)
        if self.log_dir is not None:  # what comes before the pid is kept for the log files
            worker.out.early = bytearray()
            worker.err.early = bytearray()
        worker.out.lock = worker.err.lock = worker.output_lock
        self.streams[out_r] = worker.out
        self.streams[err_r] = worker.err
        self.by_req[req] = worker
        self.live += 1
        fd = worker.conn.fileno()
        self.by_fd[fd] = worker
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        worker.output_poll = output_poll = select.poll()
        output_poll.register(out_r, select.POLLIN)
        output_poll.register(err_r, select.POLLIN)
        self.reactor.register(fd, self._on_data)
        self.reactor.register(out_r, self._on_output)
        self.reactor.register(err_r, self._on_output)
        return worker, self.early_spawned.pop(req, None)

    def spawned(self, req: int, pid: int) -> WorkerSlot | None:
        """The fork server named request ``req``'s pid: its worker, or None if it is not
        adopted yet (remembered for ``adopt``)."""
        worker = self.by_req.get(req)
        if worker is None:
            self.early_spawned[req] = pid
        return worker

    def named(self, worker: WorkerSlot, pid: int) -> int | None:
        """Record ``worker``'s pid; returns its exit status if it already exited."""
        worker.pid = pid
        self.by_pid[pid] = worker
        if self.log_dir is not None:
            self._open_logs(worker, pid)
        return self.early_exits.pop(pid, None)

    def _open_logs(self, worker: WorkerSlot, pid: int) -> None:
        """Its streams' log files from now on (two opens on the session's file system, as
        cheap as the pipe reads this thread does; a failure only means no log file)."""
        for stream, err in ((worker.out, False), (worker.err, True)):
            if stream is None or stream.closed:
                continue
            try:
                stream.open_log(worker_logs.CappedLog(
                    os.path.join(self.log_dir, f"worker-{pid}.{'err' if err else 'out'}"),
                    self.log_cap))
            except OSError:
                stream.early = None

    def exited(self, pid: int, status: int) -> WorkerSlot | None:
        """The fork server reported ``pid``'s exit: its worker, or None (remembered if the
        worker is not adopted yet)."""
        worker = self.by_pid.get(pid)
        if worker is None and pid in self.early_spawned.values():
            self.early_exits[pid] = status
        return worker

    def keep_idle(self, worker: WorkerSlot) -> None:
        """A worker whose lease went back: kept for reuse, or retired if enough are."""
        if len(self.idle) < self.idle_keep:
            self.idle.append(worker)
        else:
            self.retire(worker)

    def retire(self, worker: WorkerSlot) -> None:
        """Ask a worker with nothing in flight to exit (it exits on EOF)."""
        if worker in self.idle:
            self.idle.remove(worker)
        if worker.dead:
            return
        worker.dead = True
        self.reactor.unregister(worker.conn.fileno())
        self.by_fd.pop(worker.conn.fileno(), None)
        try:
            worker.conn.close()
        except OSError:
            pass
        try:
            worker.ctl.close()
        except OSError:
            pass

    def drain_output(self, worker: WorkerSlot) -> None:
        for stream in (worker.out, worker.err):
            if stream is not None and not stream.closed:
                stream.drain()
                if stream.eof:
                    self.close_stream(stream)

    def close_stream(self, stream: OutputStream) -> None:
        """Unregister, then close (under the lock, so the fd number cannot be reused between)."""
        self.streams.pop(stream.fd, None)
        self.reactor.unregister(stream.fd)
        stream.close()
