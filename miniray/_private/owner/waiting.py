"""The owner's view of what waits for resources: sampled once a second, never per task.

Owns: the I/O thread's once-a-second sample of the task queues (their heads and lengths) and
of the actors waiting for placement; the notice on stderr for a shape that has waited past
``MINIRAY_WAIT_NOTICE_S`` (read from the ledger's leases after the lock is released); and,
when the driver publishes for ``miniray status -v``, its demands (queued, infeasible and
pending work by function name and shape).
Does not own: the decisions and wording (``core/wait_notice.py``, pure), the queues
(``tasks.py``, ``actors.py``), the ledger (``ledger/ledger.py``).
Called by: ``owner.Owner`` (``start``, with its lock held) and ``runtime.Runtime`` (reads
``demands``).

Cost: one timer a second that walks the queues' heads (a few keys) under the owner's lock;
the per-task path does nothing for it. Demands (only in a driver joined to a node,
``want_demands``) count each queue's function names when its head or length changed.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import sys
import time

from miniray._private.core import wait_notice
from miniray._private.core.resources import from_units
from miniray._private.owner.actors import A_DEAD
from miniray._private.transport import node_client

logger = logging.getLogger(__name__)

ENV_NAME = "MINIRAY_WAIT_NOTICE_S"


def _shape(items) -> tuple:
    """A request or lease as sorted (name, amount) pairs without zero amounts."""
    return tuple(sorted((name, amount) for name, amount in items if amount))


class WaitWatch:
    """Given at construction: the ``tasks`` (queues, infeasible lists), the ``actors``
    (``pending``), the ``reactor`` (its timer runs with the owner's lock held), ``defer``
    (work after the lock), the ``ledger`` (read without its lock), this driver's ``pid``,
    ``closed()``, ``threshold_s`` (``MINIRAY_WAIT_NOTICE_S``; 0: no notice) and the
    ``session_dir``."""

    EVERY_S = 1.0

    def __init__(self, *, tasks, actors, reactor, defer, ledger, pid: int, closed,
                 threshold_s: float, session_dir: str = ""):
        self._tasks = tasks
        self._actors = actors
        self._reactor = reactor
        self._defer = defer
        self._ledger = ledger
        self._pid = pid
        self._closed = closed
        self._session_dir = session_dir  # a node's holds node_stats.json (its actor service)
        self.tracker = wait_notice.WaitTracker(threshold_s)
        self.want_demands = False  # set by a driver joined to a node
        self.demands: list = []  # the latest, when wanted (wait_notice.demands' rows)
        self._counts: dict = {}  # key -> (head task id, length, Counter of names)

    def start(self) -> None:
        """*Locked.* Sample once a second from now on."""
        self._reactor.call_later(self.EVERY_S, self._tick)

    def _entries(self) -> list:
        entries = []
        for key, queue in self._tasks.queues.items():
            if queue:
                head = queue[0]
                entries.append(wait_notice.Entry(key, head.spec.task_id, len(queue),
                                                 _shape(key[0]), head.spec.name))
        for actor in self._actors.pending:
            if actor.state != A_DEAD:
                spec = actor.spec
                entries.append(wait_notice.Entry(
                    ("actor", spec.actor_id), spec.actor_id, 1,
                    _shape(spec.placement.items()), f"actor {spec.class_name}"))
        return entries

    def _tick(self) -> None:
        """*Locked*, on the I/O thread."""
        if self._closed():
            return
        now = time.monotonic()
        entries = self._entries()
        self.tracker.observe(now, entries)
        due = self.tracker.due(now, entries)
        if due:
            self._defer(functools.partial(self._notice, due))
        if self.want_demands:
            self.demands = wait_notice.demands(self._demand_counts())
        self._reactor.call_later(self.EVERY_S, self._tick)

    def demands_now(self) -> list:
        """*Locked.* The demands as ``miniray status -v`` shows them: the latest sample where a
        driver publishes them once a second (joined to a node), else counted now (an
        embedded session, asked through its state socket)."""
        if self.want_demands:
            return self.demands
        return wait_notice.demands(self._demand_counts())

    def _demand_counts(self) -> list:
        """``(name, shape, infeasible, count)`` for what waits. A queue whose head and length
        did not change since the last sample keeps its counts: a long queue waiting for
        resources is walked once, not every second."""
        out = []
        counts_now = {}
        for key, queue in self._tasks.queues.items():
            if not queue:
                continue
            head, length = queue[0].spec.task_id, len(queue)
            old = self._counts.get(key)
            counts = old[2] if old is not None and old[:2] == (head, length) else \
                collections.Counter(task.spec.name for task in queue)
            counts_now[key] = (head, length, counts)
            shape = _shape(key[0])
            out += [(name, shape, False, n) for name, n in counts.items()]
        self._counts = counts_now
        for key, tasks in self._tasks.infeasible.items():
            out += [(task.spec.name, _shape(key[0]), True, 1) for task in tasks]
        for actor in self._actors.pending:
            if actor.state != A_DEAD:
                spec = actor.spec
                out.append((f"actor {spec.class_name}", _shape(spec.placement.items()), False,
                            1))
        return out

    def _notice(self, due: list) -> None:
        """*Not locked.* One line per due shape, naming the leases that hold what it needs;
        nothing for a backlog behind this driver's own leases of that shape."""
        try:
            leases = self._ledger.snapshot().leases.values()
        except (OSError, ValueError) as error:  # the node's ledger may be gone with it
            logger.debug("wait notice: ledger unreadable: %s", error)
            return
        holders = [wait_notice.Holder(
            lease.holder_pid,
            _shape((name, from_units(u)) for name, u in lease.resources.items()),
            lease.tag) for lease in leases]
        service_pid = self._service_pid()
        for shape, count, names, waited in due:
            if wait_notice.only_own_backlog(shape, holders, self._pid):
                continue
            print(wait_notice.format_notice(shape, count, names, waited, holders, self._pid,
                                            ENV_NAME, service_pid), file=sys.stderr, flush=True)

    def _service_pid(self) -> int | None:
        """The node's actor service's pid (it holds the named and detached actors' leases),
        from the node's ``node_stats.json``; None in an embedded session."""
        try:
            with open(os.path.join(self._session_dir, node_client.NODE_STATS)) as f:
                pid = json.load(f).get("actor_service_pid")
        except (OSError, ValueError, AttributeError):
            return None
        return pid if isinstance(pid, int) else None
