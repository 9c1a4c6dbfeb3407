"""The fork server: a single-threaded, pre-imported process that forks workers.

Owns: forking worker processes, reaping them, reporting their exits, and signalling them (it is
the only process that signals workers, so a pid is never signalled after it was reaped and
possibly reused). Does not own: what a worker does (``worker_main.py``) or which workers exist
for what (the owner decides).
Called by: ``ForkServerClient`` (``transport/spawn.py``) in the driver or node process, which
starts it with ``main()``; this module is imported only in the fork server process.

::

    driver (ForkServerClient)                         fork server (main)
      socketpair(SOCK_SEQPACKET) ───────────────────►  select([sock, sigchld pipe])
      (SPAWN, req) + fds[data, ctl, out, err]    ──►   fork() → child runs worker_main
      (SPAWN, req, remote) + fds                 ──►   the same, for a remote driver's worker
                                                       (a node only: MAC'd data and control)
                                                 ◄──   (SPAWNED, req, pid)
                                                 ◄──   (EXITED, pid, status)   on SIGCHLD
      (KILL, pid, sig)                           ──►   os.kill if pid is a live child
      (SHUTDOWN, grace)                          ──►   wait grace, SIGKILL the rest, reap,
                                                 ◄──   (BYE,) and exit
      EOF (driver exited or was killed)          ──►   SIGKILL every child, reap, exit

It is started as a fresh interpreter (never forked from the threaded driver), imports the
worker's modules, the public API (``miniray._load_all()``, on its command line, as
``ForkServerClient`` writes it) and cloudpickle once, and stays
single-threaded, so forking it is safe and a worker costs a few milliseconds. It
ignores SIGINT: Ctrl-C is the driver's to handle.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import time

# Imported here, before any fork, so that a fork costs milliseconds: the worker's task loop
# (and, loaded by the command line that starts this process, the public API a task uses).
import cloudpickle  # noqa: F401

from miniray._private.core import alias, config, protocol
from miniray._private.transport.spawn import MAX_FDS, RECV_BUFSIZE, send_message, set_pdeathsig
from miniray._private.worker import worker_main


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
            data, fds, _flags, _addr = socket.recv_fds(self.sock, RECV_BUFSIZE, MAX_FDS)
        except (ConnectionResetError, OSError):
            return False
        if not data:
            return False  # EOF: the driver is gone
        message = pickle.loads(data)
        tag = message[0]
        if tag == protocol.SPAWN:
            self._spawn(message[1], fds, message[2] if len(message) > 2 else None)
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

    def _spawn(self, req_id: int, fds: list[int], remote: dict | None = None) -> None:
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
                data_fd, ctl_fd, out_fd, err_fd = fds
                worker_main.run_forked(data_fd, ctl_fd, out_fd, err_fd, remote)
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
    ``python -c 'import miniray; miniray._load_all();
    from miniray._private.worker.forkserver import main; main()' FD``."""
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    if config.ray_alias_requested():
        alias.install()
    worker_main.prepare_warm_up()  # before any fork: each worker inherits it
    _ForkServer(sock).run()
    os._exit(0)
