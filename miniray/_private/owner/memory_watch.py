"""The driver's memory monitor: Ray's out-of-memory prevention for the workers it started.

Owns: the timer (every ``refresh_s`` on the I/O thread, with the owner's lock held, as every
timer there), when each busy worker's current work started (as the monitor first saw it),
and the kill: the chosen worker's ``oom`` (the error text) is set, then it is SIGKILLed
through its fork server once the lock is free. What its death does (a task queued again
after a wait, or failed with OutOfMemoryError; an actor restarted or dead) is
``owner_events._worker_gone``'s, ``tasks.worker_died``'s and ``actors.on_worker_exit``'s.
The decisions are ``core/memory_policy.py``'s; the host's memory is read by
``ledger/inventory.memory_usage``.

Each driver watches its own workers (a node's other drivers watch theirs): a worker another
driver started is never killed here. Workers on other hosts are left to their host.
"""

from __future__ import annotations

import logging
import time

from miniray._private.core import memory_policy
from miniray._private.core.memory_policy import Candidate, MonitorSettings
from miniray._private.core.scheduling import T_DONE
from miniray._private.host import procinfo
from miniray._private.ledger import inventory

logger = logging.getLogger(__name__)


class MemoryWatch:
    """Started by ``start()`` (locked); stops by itself once the owner has closed."""

    def __init__(self, owner, settings: MonitorSettings, node_ip: str, node_id: str,
                 read=inventory.memory_usage):
        self.owner = owner
        self.settings = settings
        self.node_ip = node_ip
        self.node_id = node_id
        self._read = read
        self._since: dict = {}  # pid -> (its current work, when the monitor first saw it)
        self._victim = None  # the worker killed last, until its exit is seen
        self.kills = 0

    def start(self) -> None:
        """*Locked.*"""
        if self.settings.refresh_s > 0:
            self.owner.reactor.call_later(self.settings.refresh_s, self._tick)

    def _tick(self) -> None:
        """*Locked* (a reactor timer)."""
        if self.owner.closed:
            return
        try:
            self.look()
        finally:
            self.owner.reactor.call_later(self.settings.refresh_s, self._tick)

    def look(self) -> bool:
        """*Locked.* One look: kill one busy worker when the host is over the threshold and
        the last victim is gone. True when it killed one."""
        busy = self._busy()
        now = time.monotonic()
        since = {}
        for worker, work, _retriable, _what in busy:
            seen = self._since.get(worker.pid)
            since[worker.pid] = seen if seen is not None and seen[0] == work else (work, now)
        self._since = since
        if self._victim is not None and not self._victim.exited:
            return False  # one kill at a time: wait until it is gone
        self._victim = None
        if not busy:  # nothing to kill: the host is not even read
            return False
        read = self._read()
        use = memory_policy.MemoryUse(*read) if read is not None else None
        if not memory_policy.over_threshold(use, self.settings):
            return False
        pick = memory_policy.pick_victim(
            [Candidate(i, retriable, since[worker.pid][1])
             for i, (worker, _work, retriable, _what) in enumerate(busy)])
        if pick is None:
            return False
        worker, _work, retriable, what = busy[pick]
        worker.oom = memory_policy.oom_message(
            use, self.settings, self.node_ip, self.node_id, what, worker.pid,
            procinfo.rss_bytes(worker.pid), retriable)
        logger.warning("%s", " ".join(worker.oom.splitlines()[:3]))
        self._victim = worker
        self.kills += 1
        self.owner.kill_process_later(worker.pid)
        return True

    def _busy(self) -> list:
        """(worker, its current work, retriable, what it runs) of each live local worker
        that runs a task or hosts an actor."""
        out = []
        for worker in list(self.owner.workers.by_req.values()):
            if (worker.exited or worker.pid is None or worker.oom is not None
                    or getattr(worker, "elsewhere", False)):
                continue
            actor = worker.actor
            if actor is not None:
                work = (actor.spec.actor_id, tuple(actor.inflight))
                retriable = actor.restarts_left != 0 and not actor.no_restart
                what = f"actor {actor.spec.class_name} (id {actor.spec.actor_id.hex()})"
            elif worker.inflight and worker.inflight[0].state != T_DONE:
                task = worker.inflight[0]
                work = task.spec.task_id
                retriable = task.retries_left != 0 and not task.cancelled
                what = f"task {task.spec.name}"
            else:
                continue
            out.append((worker, work, retriable, what))
        return out
