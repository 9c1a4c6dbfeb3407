"""The fork server: a single-threaded, pre-imported process that forks workers.

Owns: forking worker processes, reaping them, reporting their exits, and signalling them (it is
the only process that signals workers, so a pid is never signalled after it was reaped and
possibly reused). Does not own: what a worker does (``worker_main.py``) or which workers exist
for what (the owner decides).
Called by: ``ForkServerClient`` in the driver (or node) process.

::

    driver (ForkServerClient)                         fork server (main)
      socketpair(SOCK_SEQPACKET) ───────────────────►  select([sock, sigchld pipe])
      (SPAWN, req) + fds[data, ctl, out, err]    ──►   fork() → child runs worker_main
                                                 ◄──   (SPAWNED, req, pid)
                                                 ◄──   (EXITED, pid, status)   on SIGCHLD
      (KILL, pid, sig)                           ──►   os.kill if pid is a live child
      (SHUTDOWN, grace)                          ──►   wait grace, SIGKILL the rest, reap,
                                                 ◄──   (BYE,) and exit
      EOF (driver exited or was killed)          ──►   SIGKILL every child, reap, exit

It is started as a fresh interpreter (never forked from the threaded driver), imports miniray
and cloudpickle once, and stays single-threaded, so forking it is safe and a worker costs a few
milliseconds. It ignores SIGINT: Ctrl-C is the driver's to handle.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from miniray._private.core import protocol

_MAX_FDS = 8
_BUFSIZE = 1 << 16


def send_message(sock: socket.socket, message: tuple, fds: list[int] | None = None) -> None:
    """One pickled tuple as one SOCK_SEQPACKET datagram, with ``fds`` (SCM_RIGHTS) if any.
    The fork server's channel and the node's (node_client.py) both speak this way."""
    data = pickle.dumps(message, protocol=5)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except Exception:  # not Linux: workers still exit on EOF from their data socket
        pass


class _ForkServer:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def run(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        try:
            while True:
                try:
                    readable, _, _ = select.select([self.sock, self.wake_r], [], [])
                except InterruptedError:
                    continue
                if self.wake_r in readable:
                    self._drain_wakeups()
                    self._reap()
                if self.sock in readable:
                    if not self._handle_request():
                        return
        finally:
            self._kill_all_and_reap(grace=0.0)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            try:
                send_message(self.sock, (protocol.EXITED, pid, status))
            except OSError:
                pass

    def _handle_request(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, _BUFSIZE, _MAX_FDS)
        except (ConnectionResetError, OSError):
            return False
        if not data:
            return False  # EOF: the driver is gone
        message = pickle.loads(data)
        tag = message[0]
        if tag == protocol.SPAWN:
            self._spawn(message[1], fds)
        elif tag == protocol.KILL:
            for fd in fds:
                os.close(fd)
            _, pid, sig = message
            if pid in self.children:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        elif tag == protocol.SHUTDOWN:
            self._kill_all_and_reap(grace=message[1])
            try:
                send_message(self.sock, (protocol.BYE,))
            except OSError:
                pass
            return False
        return True

    def _spawn(self, req_id: int, fds: list[int]) -> None:
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return
        parent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                set_pdeathsig()
                if os.getppid() != parent_pid:
                    os._exit(1)
                self.sock.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                from miniray._private.worker import worker_main

                data_fd, ctl_fd, out_fd, err_fd = fds
                worker_main.run_forked(data_fd, ctl_fd, out_fd, err_fd)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        send_message(self.sock, (protocol.SPAWNED, req_id, pid))

    def _kill_all_and_reap(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        while self.children and time.monotonic() < deadline:
            self._reap()
            if self.children:
                time.sleep(0.002)
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                self.children.clear()
                break
            self.children.discard(pid)
            try:
                send_message(self.sock, (protocol.EXITED, pid, status))
            except OSError:
                pass


def main() -> None:
    """Entry point:
    ``python -c 'from miniray._private.worker.forkserver import main; main()' FD``."""
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    # Pre-import what every worker needs, so a fork costs milliseconds.
    import cloudpickle  # noqa: F401

    import miniray  # noqa: F401
    from miniray._private.core import config
    from miniray._private.worker import worker_main  # noqa: F401

    if config.ray_alias_requested():
        from miniray._private.core import alias

        alias.install()
    _ForkServer(sock).run()
    os._exit(0)


class SpawnChannel:
    """The sending half shared by ``ForkServerClient`` and ``node_client.NodeClient``: one
    SEQPACKET socket, a lock for its writers, numbered SPAWN requests. Sends never raise once
    the peer is gone; the reader of ``fileno()`` sees the EOF. Subclasses name their tags."""

    SPAWN_TAG: object = protocol.SPAWN
    KILL_TAG: object = protocol.KILL

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._send_lock = threading.Lock()
        self._next_req = 0

    def fileno(self) -> int:
        return self._sock.fileno()

    def spawn(self, fds: list[int]) -> int:
        with self._send_lock:
            self._next_req += 1
            req = self._next_req
            send_message(self._sock, (self.SPAWN_TAG, req), fds)
        return req

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        self._send((self.KILL_TAG, pid, int(sig)))

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
        code = "from miniray._private.worker.forkserver import main; main()"
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
            data = self._sock.recv(_BUFSIZE)
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

