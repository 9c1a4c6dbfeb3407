"""Garbage collection when the object store fills up: Ray's "global GC".

Owns: a timer on the owner's I/O thread that samples the store's use every ``EVERY_S``;
when ``store_policy.global_gc_due`` says so, every live worker of this owner is sent
``(COLLECT,)`` on its control socket (it runs ``gc.collect()`` and reports the refs that
dropped) and this process collects too, after the lock is released. Refs held only by
reference cycles (a worker that disabled ``gc``, garbage between automatic passes) then let
their objects go before the store has to spill them. Does not own: the threshold and the
minimum interval (``object_store/store_policy.py``, Ray's ``high_plasma_storage_usage`` 0.7
and ``global_gc_min_interval_s`` 30 s), the workers' side (``worker_main._on_control``).
Called by: ``owner.Owner`` (``start``, with its lock held).

Cost: one timer a second reading two integers of the store, under the owner's lock; nothing
per task.
"""

from __future__ import annotations

import gc
import logging
import time

from miniray._private.core import protocol
from miniray._private.object_store import store_policy

logger = logging.getLogger(__name__)


class StoreGc:
    """Given at construction: the ``store`` (``usage()``), the ``workers`` (their
    ``by_fd`` table), ``send_control(worker, message)`` (locked; sent after the lock),
    the ``reactor`` (its timer runs with the owner's lock held), ``defer`` (work after the
    lock) and ``closed()``."""

    EVERY_S = 1.0

    def __init__(self, *, store, workers, send_control, reactor, defer, closed):
        self._store = store
        self._workers = workers
        self._send_control = send_control
        self._reactor = reactor
        self._defer = defer
        self._closed = closed
        self.last: float | None = None  # when the last collection was asked

    def start(self) -> None:
        """*Locked.* Sample the store once a second from now on."""
        self._reactor.call_later(self.EVERY_S, self._tick)

    def _tick(self) -> None:
        """*Locked* (the reactor's timer)."""
        if self._closed():
            return
        used, capacity = self._store.usage()
        now = time.monotonic()
        if store_policy.global_gc_due(used, capacity, now, self.last):
            self.last = now
            logger.debug("object store %d of %d bytes: collecting garbage in the driver and "
                         "its workers", used, capacity)
            for worker in list(self._workers.by_fd.values()):
                if not worker.dead and worker.ctl is not None:
                    self._send_control(worker, (protocol.COLLECT,))
            self._defer(gc.collect)
        self._reactor.call_later(self.EVERY_S, self._tick)
