"""A worker on another host as the driver holds it, and what a call there can end with.

Owns: ``RemoteWorker`` (one spawned worker: its MAC'd data and control connections, its
stdout and stderr forwarded by a thread each as a local worker's output, what it was sent,
its lease on its node while idle); ``RemoteTaskSlot`` (a remote task's stand-in for the
owner's ``WorkerSlot``: cancel before and after it was sent, ``force``'s kill through the
node); receiving a large value's frames straight into a segment (``receive_segment``,
``receive_frames``); and the outcomes a call there raises to its runner (``Move``: to
another node; ``Failed``: with this error; ``node_died_error`` and the other errors, in
Ray's classes and words). Does not own: placing or running the task (``remote_nodes.py``),
an actor's worker (``remote_actors.RemoteActorWorker`` wraps a ``RemoteWorker``), the
output's printing (``output.OutputStream``) or the wire (``transport/peer_channel.py``).
Called by: ``remote_nodes.RemoteNodes``, ``remote_actors.RemoteActors``,
``remote_bundles.RemoteBundles``, ``remote_requests.RemoteRequests`` (``receive_segment``),
and the owner (``RemoteTaskSlot``'s ``send_bytes`` and ``remote_kill``, deferred).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

from miniray._private.core import protocol
from miniray._private.owner.output import OutputStream
from miniray._private.transport import framing
from miniray._private.transport.remote_node import RemoteLeaseError

__all__ = ["BULK_FRAME_S", "KILL_TIMEOUT_S", "Failed", "Move", "RemoteTaskSlot",
           "RemoteWorker", "cancelled_failure", "dependency_failure", "node_died_error",
           "receive_frames", "receive_segment", "system_error"]

logger = logging.getLogger(__name__)

KILL_TIMEOUT_S = 2.0  # cancel(force=True) waits at most this long for the node's answer
BULK_FRAME_S = 60.0  # one frame of a large value's bytes comes within this


class RemoteWorker:
    """One worker on a remote node: its four channels, what it was sent."""

    def __init__(self, pid: int, channels: list, node: str, ip: str, log_to_driver: bool,
                 prefix_enabled: bool = True):
        self.pid = pid
        self.data, self.ctl = channels[0], channels[1]
        self.funcs: set = set()
        self.said_hello = False
        self.lease_id: str | None = None  # the lease on N it runs under (kept while idle)
        self.shape: tuple = ()  # that lease's request
        self.gpu_ids: list = []  # that lease's GPUs on N (CUDA_VISIBLE_DEVICES there)
        self.env = ""  # the runtime_env key its HELLO named ("": the job's)
        self.incarnation = 0  # N's, in the view, when it was spawned
        self.idle_since = 0.0
        self.client = None  # N's client, while idle
        self.broken = False  # not to be used again (it asked for what is not supported)
        self.node = node
        self._outputs = []
        streams = []  # out, err: an actor's route is set on them before it prints
        for channel, target in ((channels[2], "stdout"), (channels[3], "stderr")):
            fd, _state = channel.handover()  # plain bytes from here on (ARCHITECTURE.md)
            stream = OutputStream(fd, target, log_to_driver, prefix_enabled, ip=ip)
            streams.append(stream)
            reader = threading.Thread(target=_forward_output, args=(stream,), daemon=True,
                                      name="miniray-remote-output")
            reader.start()
            self._outputs.append(reader)
        self.out, self.err = streams

    def stale(self) -> bool:
        """Idle, yet its data connection is readable: EOF (it is gone) or a stray frame.
        A BORROW (the refs its last task dropped, sent after RESULT) is read and dropped:
        that task's borrows were all released when it ended (``remote_requests.py``)."""
        data = self.data
        try:
            while data.readable_now():
                if data.recv(timeout=0)[0] != protocol.BORROW:
                    return True
        except TimeoutError:  # part of a frame so far: the rest comes with the next read
            return False
        except (OSError, ValueError):  # EOF (PeerClosed), a bad frame (PeerAuthError)
            return True
        return False

    def close(self) -> None:
        self.data.close()
        self.ctl.close()

    def join_output(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for reader in self._outputs:
            reader.join(max(0.0, deadline - time.monotonic()))


def _forward_output(stream: OutputStream) -> None:
    """A remote worker's stdout or stderr until EOF, printed as a local worker's is
    (``output.OutputStream``: its markers, prefix and bar lines), Ray's ``ip=`` added."""
    try:
        os.set_blocking(stream.fd, False)
        poller = select.poll()
        poller.register(stream.fd, select.POLLIN)
        while not stream.eof:
            poller.poll()
            stream.drain()
    except OSError:
        pass
    finally:
        stream.close()


class RemoteTaskSlot:
    """A remote task's stand-in for the owner's ``WorkerSlot`` where the owner reads one:
    ``tasks.cancel`` (``inflight``, ``pid``, ``kill_on_spawn``), ``requests.interrupt``
    (``interrupted``, ``waits``), ``Owner.send_control`` (``ctl.send_bytes``) and the
    state rows (``pid``), ``Owner._kill_for_cancel`` (``remote_kill``). A cancel before the
    task was sent keeps it from being sent; one after goes to the worker's MAC'd control
    connection; ``force`` asks the node to SIGKILL the worker (its driver link's ``kill``):
    the task then fails with TaskCancelledError, never retried."""

    def __init__(self, task, moves: int = 0):
        self.inflight = [task]
        self.moves = moves  # times it was placed again without having been sent
        self.claim: str | None = None  # the node whose lease it waits for (RemoteNodes._claim)
        self.sent = False  # bound to a worker: the task was (or is being) sent
        self.interrupted: set = set()
        self.waits: dict = {}
        self.pid = None
        self.kill_on_spawn = False
        self.ctl = self
        self._lock = threading.Lock()
        self._worker: RemoteWorker | None = None
        self._client = None  # the node's client, once the task was sent
        self._cancelled = False
        self.killed = False  # force-cancelled: the worker's death is the cancel's
        self.bundle = None  # a placement group's RemoteBundle it runs in (no lease of its own)
        self.gpu_ids: list = []  # in a bundle: its share of the bundle's GPUs

    def send_bytes(self, data) -> None:
        """A control message (CANCEL) from the owner, sent after its lock."""
        with self._lock:
            worker = self._worker
            if worker is None:
                self._cancelled = True
                return
        try:
            worker.ctl.send_bytes(data)
        except (OSError, TimeoutError):
            pass

    def remote_kill(self) -> None:
        """*Not locked* (deferred by the owner). ``cancel(force=True)``: the node kills the
        worker; before the task was sent, it is kept from being sent."""
        from miniray.exceptions import NodeDiedError  # lazy: as above

        with self._lock:
            worker, client = self._worker, self._client
            if worker is None:
                self._cancelled = True
                return
            self.killed = True
        try:
            client.kill(worker.pid, timeout=KILL_TIMEOUT_S)
        except (RemoteLeaseError, NodeDiedError, OSError, TimeoutError) as error:
            logger.warning("could not kill the worker pid=%s on node %s: %s", worker.pid,
                           client.name, error)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def node(self) -> str | None:
        """The node id of the worker it was sent to (its state row's node_id)."""
        worker = self._worker
        return worker.node if worker is not None else None

    def bind(self, worker: RemoteWorker, client=None) -> bool:
        """The task goes to ``worker`` now; False if it was cancelled before."""
        with self._lock:
            if self._cancelled:
                return False
            self._worker = worker
            self._client = client
            self.pid = worker.pid
            self.sent = True
            return True


class Move(Exception):
    """Step 2: a denied lease's task goes to ``entry`` instead (``move_to``)."""

    def __init__(self, entry):
        super().__init__(entry.node_id)
        self.entry = entry


class Failed(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def node_died_error(name: str, entry, detail: str):
    """The ``NodeDiedError`` of a task whose node died, with Ray's fields (the node's IP and
    id) and what this driver saw.

    >>> from miniray._private.core.cluster_view import NodeEntry
    >>> text = str(node_died_error("f", NodeEntry("ab" * 28, "10.0.0.2", 1), "EOF."))
    >>> "Node IP: 10.0.0.2, node ID: abab" in text
    True
    """
    from miniray.exceptions import NodeDiedError  # lazy: the public package

    return NodeDiedError(
        f"Task {name} failed: the node it ran on is dead or unreachable. Node IP: "
        f"{entry.ip}, node ID: {entry.node_id}. What this driver saw: {detail} The node "
        f"may have crashed, been stopped, or been cut off from this host; `miniray list "
        f"nodes -f node_id={entry.node_id}` shows what the cluster knows of its death. "
        f"max_retries controls retries on another node.")


def receive_segment(data, path: str, size: int) -> None:
    """A large value's frames from ``data`` into new segment ``path`` (``framing``'s
    ``receive_segment``; a frame late by BULK_FRAME_S: OSError)."""
    framing.receive_segment(data, path, size, BULK_FRAME_S, "a value")


def receive_frames(data, mapping, size: int) -> None:
    """A large value's frames from ``data`` into the writable ``mapping`` (a recycled
    segment's; ``framing.receive_frames``)."""
    framing.receive_frames(data, mapping, size, BULK_FRAME_S, "a value")


def cancelled_failure(spec) -> Failed:
    """The failure of a task cancelled before or while it ran on another host."""
    from miniray._private.core import ids  # lazy: this path only
    from miniray.exceptions import TaskCancelledError  # lazy: as above

    return Failed(TaskCancelledError(ids.TaskID(spec.task_id)))


def dependency_failure(data: bytes, name: str):
    """The error of task ``name`` whose argument kept on a node holds the error ``data``
    (its pull failed: ObjectLostError), as ``TaskQueue`` fails a task with a failed
    argument."""
    from miniray._private.core import serialization  # lazy: this path only
    from miniray._private.core.dependency_errors import dependency_error  # lazy: as above

    try:
        upstream = serialization.loads(data)
    except Exception as error:  # noqa: BLE001 - said as a system error instead
        return system_error(f"Task {name}: an argument's error could not be read: {error}")
    return dependency_error(upstream, name)


def system_error(text: str):
    from miniray.exceptions import RaySystemError  # lazy: the public package

    return RaySystemError(text)
