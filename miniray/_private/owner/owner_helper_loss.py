"""What the owner does when the process that forks its workers dies: its fork server
(embedded mode) or the node it joined (``miniray start``).

Owns: telling such a death apart from a shutdown, the decision to start a new fork server
(``RestartBudget``: at most ``MINIRAY_FORK_SERVER_RESTARTS``, default 3, a minute), the one
stderr line that says so, and failing everything that can no longer complete when the
session cannot go on. Does not own: how a death is noticed (EOF on the helper's socket, read
by the I/O thread in ``owner.py``), how its exit is described
(``ForkServerClient.describe_exit``, ``NodeClient.describe_exit``), or what happens to one
worker's tasks and actor (the owner's worker-exit path, reused here for every worker the
helper took with it).
Called by: ``owner.Owner``, which holds one as ``owner.helper_loss`` and gives it its parts
at construction; on the I/O thread.

::

    EOF on the helper's socket ──► closed/stopping? ── yes ──► nothing (shutdown's own EOF)
                  │ no
                  ▼
      embedded and RestartBudget.allow()? ── yes ──► pause dispatch; start a new fork server
                  │ no                                (outside the lock); every worker is gone:
                  ▼                                   tasks retried per max_retries, actors
      fatal: every pending task fails with            restarted per max_restarts; one stderr
      RaySystemError naming the helper, its pid       line; dispatch resumes
      and how it ended; actors die (ActorDiedError);
      later submissions fail; objects already stored stay readable; shutdown() still cleans

A node does not die unannounced when it is stopped (``miniray stop``, a signal, its fork
server's death): it first sends STOPPING with the reason, and the owner fails the pending
work at once with that reason, before the workers' exits arrive, so no task is blamed for a
crash that was the node's shutdown.
"""

from __future__ import annotations

import logging
import sys
import time

from miniray._private.core import config, protocol, serialization
from miniray._private.owner.object_table import PENDING

logger = logging.getLogger(__name__)

AGAIN = "Call miniray.shutdown() and miniray.init() again to start a new session."


class RestartBudget:
    """At most ``limit`` restarts within any ``window_s`` seconds (pure; times are given)."""

    def __init__(self, limit: int, window_s: float):
        self.limit = limit
        self.window_s = window_s
        self.times: list[float] = []

    def allow(self, now: float) -> bool:
        """Whether a restart at ``now`` is within the budget; if so it is counted."""
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.limit:
            return False
        self.times.append(now)
        return True

    def __repr__(self) -> str:
        return f"<RestartBudget {len(self.times)}/{self.limit} in {self.window_s:g} s>"


def restart_line(death: str, new_pid: int, retried: int, failed: int, actors: int,
                 budget: RestartBudget) -> str:
    """The one stderr line printed when a new fork server replaces a dead one."""
    return (f"miniray: {death}; its workers died with it. Started a new fork server (pid "
            f"{new_pid}): {retried} task(s) retried, {failed} failed, {actors} actor(s) "
            f"affected (restart {len(budget.times)} of at most {budget.limit} in "
            f"{budget.window_s:g} s).")


def fatal_message(death: str, restarts_exhausted: RestartBudget | None = None) -> str:
    """Why the session cannot go on, and what to do."""
    text = death
    if restarts_exhausted is not None and restarts_exhausted.limit == 0:
        text += " (MINIRAY_FORK_SERVER_RESTARTS=0: it is not replaced)"
    elif restarts_exhausted is not None:
        text += (f"; it was replaced {restarts_exhausted.limit} time(s) in the last "
                 f"{restarts_exhausted.window_s:g} s already, so miniray gives up")
    return f"{text}. The session cannot run tasks or actors any more. {AGAIN}"


class HelperLoss:
    """The fork server's or the node's death, for one owner. It holds why the session
    cannot go on (``fatal``) and whether a new fork server is being started
    (``restarting``: the owner dispatches nothing meanwhile).

    Given at construction: the owner's ``lock``, ``objects``, ``workers`` and ``actors``;
    ``restart_fork_server()`` (a new ForkServerClient; None when joined to a node, which
    this driver cannot restart); ``fork_server()`` the helper in use and
    ``replace_fork_server(new)`` to use another; ``unregister(fd)``; ``closed()`` (shutdown
    began) and ``closing()`` (or its helper is being stopped); ``worker_gone(worker, status,
    death)``, ``dispatch_all()``, ``unfinished_tasks()``, ``fail_task(task, error)`` and
    ``drop_queues()`` are the owner's task paths."""

    WINDOW_S = 60.0

    def __init__(self, *, lock, objects, workers, actors, restart_fork_server, fork_server,
                 replace_fork_server, unregister, closed, closing, worker_gone, dispatch_all,
                 unfinished_tasks, fail_task, drop_queues):
        self._lock = lock
        self.objects = objects
        self.workers = workers
        self.actors = actors
        self.restart_fork_server = restart_fork_server
        self._fork_server = fork_server
        self._replace_fork_server = replace_fork_server
        self._unregister = unregister
        self._closed = closed
        self._closing = closing
        self._worker_gone = worker_gone
        self._dispatch_all = dispatch_all
        self._unfinished_tasks = unfinished_tasks
        self._fail_task = fail_task
        self._drop_queues = drop_queues
        self.restart_budget = RestartBudget(config.fork_server_restarts(), self.WINDOW_S)
        self.restarts = 0
        self.restarting = False  # a new fork server is being started: dispatch waits
        self.fatal: str | None = None  # why the session cannot run work any more

    def on_eof(self, fd: int) -> None:
        """I/O thread, lock not held: the helper's socket reached EOF."""
        self._unregister(fd)
        if self._closing() or self.fatal:
            return  # shutdown's own goodbye, or already handled (STOPPING)
        helper = self._fork_server()
        death = helper.describe_exit(timeout=2.0)  # waits for the exit status: no lock
        with self._lock:
            if self._closed() or self.fatal or helper is not self._fork_server():
                return
            restart = (self.restart_fork_server is not None
                       and self.restart_budget.allow(time.monotonic()))
            if not restart:
                budget = self.restart_budget if self.restart_fork_server is not None else None
                self.fail_session(death, fatal_message(death, budget))
                return
            self.restarting = True  # nothing is sent until the new one is there
        try:
            new = self.restart_fork_server()
        except Exception as error:  # e.g. out of memory or pids: give up like a node
            with self._lock:
                self.restarting = False
                self.fail_session(death, fatal_message(
                    f"{death}, and a new fork server could not be started ({error})"))
            return
        with self._lock:
            self.restarting = False
            closed = self._closed()  # shutdown began meanwhile: it knows only the old one
            if not closed:
                new.continue_numbering(helper)
                self._replace_fork_server(new)
                retried, failed, actors = self.lose_every_worker(death)
                self.restarts += 1
                print(restart_line(death, new.pid, retried, failed, actors,
                                   self.restart_budget), file=sys.stderr, flush=True)
                self._dispatch_all()
        if closed:
            new.request_shutdown(0.0)
            new.wait(timeout=5.0)
            new.close()
        helper.close()

    def on_stopping(self, reason: str) -> None:
        """*Locked.* The node announced that it stops: fail the pending work now."""
        if self._closed() or self.fatal:
            return
        death = self._fork_server().describe_stopping(reason)
        self.fail_session(death, fatal_message(death))

    def fail_session(self, death: str, message: str) -> None:
        """*Locked.* The session cannot go on: fail every pending task (RaySystemError) and
        actor (ActorDiedError), and every object still pending; refuse later submissions."""
        from miniray.exceptions import RaySystemError

        self.fatal = message
        logger.error("%s", message)
        self.lose_every_worker(death)  # running tasks fail (self.fatal), actors die
        error = RaySystemError(message)
        for task in self._unfinished_tasks():  # queued, waiting for arguments, infeasible
            self._fail_task(task, error)
        self.actors.fail_every_actor(f"The actor is dead because {death}.")
        data = serialization.dumps(error)
        for object_id, entry in list(self.objects.entries.items()):
            if entry.state == PENDING:
                self.objects.set_ready(object_id, protocol.ERR, data)
        self._drop_queues()

    def lose_every_worker(self, death: str) -> tuple[int, int, int]:
        """*Locked.* Every worker died with the helper (PR_SET_PDEATHSIG, or the node's fork
        server killed them) and no EXITED report will come: handle each as exited. Returns
        (tasks retried, tasks failed, actors affected)."""
        retried = failed = actors = 0
        for worker in list(self.workers.by_req.values()):
            if worker.exited:
                continue
            if worker.actor is not None:
                actors += 1
            try:
                r, f = self._worker_gone(worker, None, death)
            except OSError as error:
                if not self.fatal:
                    raise
                # A dead node's ledger may be swept already: its leases went with it. The
                # worker's tasks fail below with the others.
                logger.debug("worker pid %s: %s", worker.pid, error)
                continue
            retried += r
            failed += f
        return retried, failed, actors

    def __repr__(self) -> str:
        state = "fatal" if self.fatal else "restarting" if self.restarting else "ok"
        return f"<HelperLoss {state} restarts={self.restarts} {self.restart_budget!r}>"
