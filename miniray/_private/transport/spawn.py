"""The client halves of the spawn channels: how a driver (or the node) asks for workers.

Owns: the SEQPACKET message format (one pickled tuple per datagram, fds by SCM_RIGHTS),
``SpawnChannel`` (numbered SPAWN requests, KILL) shared with ``node_client.NodeClient``, and
``ForkServerClient``, which starts the fork server and reads its replies. Does not own: the
fork server itself (``worker/forkserver.py``, started by a module path written as a string, so
this layer never imports the worker's) or what the owner does with the replies.
Called by: ``runtime.py`` (embedded driver), ``node/node.py``, ``transport/node_client.py``.
See ``worker/forkserver.py`` for the message diagram.
"""

from __future__ import annotations

import pickle
import signal
import socket
import subprocess
import sys
import threading

from miniray._private.core import protocol

MAX_FDS = 8
RECV_BUFSIZE = 1 << 16


def send_message(sock: socket.socket, message: tuple, fds: list[int] | None = None) -> None:
    """One pickled tuple as one SOCK_SEQPACKET datagram, with ``fds`` (SCM_RIGHTS) if any.
    The fork server's channel and the node's (node_client.py) both speak this way."""
    data = pickle.dumps(message, protocol=5)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def describe_returncode(code: int) -> str:
    """A child's ``Popen.returncode`` in words: "was killed by signal 9 (SIGKILL)"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except Exception:  # not Linux: workers still exit on EOF from their data socket
        pass


class SpawnChannel:
    """The sending half shared by ``ForkServerClient`` and ``node_client.NodeClient``: one
    SEQPACKET socket, a lock for its writers, numbered SPAWN requests. Sends never raise once
    the peer is gone; the reader of ``fileno()`` sees the EOF. A node takes SPAWN and KILL
    with the fork server's tags and layouts (``protocol`` section 4)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._send_lock = threading.Lock()
        self._next_req = 0

    def fileno(self) -> int:
        return self._sock.fileno()

    def spawn(self, fds: list[int], remote: dict | None = None) -> int:
        """Ask for a worker; the request number comes back with its pid (SPAWNED). If the peer
        is gone the request is lost with it: the owner handles that worker with the others
        when it reads the EOF. ``remote`` (a node's worker for a driver on another host:
        the frame state of its data and control connections and the node's own settings)
        makes the message ``(SPAWN, req, remote)``; without it the message is unchanged."""
        with self._send_lock:
            self._next_req += 1
            req = self._next_req
            message = (protocol.SPAWN, req) if remote is None else (protocol.SPAWN, req, remote)
            try:
                send_message(self._sock, message, fds)
            except OSError:
                pass
        return req

    def continue_numbering(self, previous: SpawnChannel) -> None:
        """Number requests after ``previous``'s (this channel replaces it), so a late reply
        of the old channel can never be taken for one of this channel's."""
        self._next_req = max(self._next_req, previous._next_req)

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        self._send((protocol.KILL, pid, int(sig)))

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                send_message(self._sock, message)
        except OSError:
            pass  # the peer is gone: read_message reports EOF

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class ForkServerClient(SpawnChannel):
    """The driver's end of the fork server.

    ``spawn()`` and ``kill()`` only send; replies (SPAWNED, EXITED, BYE) are read by the
    owner's I/O thread through ``read_message()`` on ``fileno()``.
    """

    def __init__(self, env: dict[str, str]):
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        super().__init__(parent_sock)
        # The whole public API first (``import miniray`` alone loads it lazily): a task uses
        # it, and a worker forked after this pays no import for it.
        code = ("import miniray; miniray._load_all(); "
                "from miniray._private.worker.forkserver import main; main()")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, str(child_sock.fileno())],
                pass_fds=[child_sock.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            child_sock.close()
        self.pid = self.process.pid

    def request_shutdown(self, grace: float) -> None:
        self._send((protocol.SHUTDOWN, grace))

    def read_message(self) -> tuple | None:
        """One message, or None at EOF. Call only when ``fileno()`` is readable."""
        try:
            data = self._sock.recv(RECV_BUFSIZE)
        except (BlockingIOError, InterruptedError):
            return ()
        except OSError:
            return None
        if not data:
            return None
        return pickle.loads(data)

    def wait(self, timeout: float) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def describe_exit(self, timeout: float) -> str:
        """After EOF on its socket: how the fork server ended, from its wait status (it is
        this process's child). One that closed its socket but does not exit within
        ``timeout`` seconds is killed."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return (f"miniray's fork server (pid {self.pid}) closed its socket and did not "
                    "exit; it was killed")
        return f"miniray's fork server (pid {self.pid}) {describe_returncode(code)}"
