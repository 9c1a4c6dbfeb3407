"""The owner's leases for tasks: how many to take, taking them, giving them back.

Owns: the decisions and acts of ``Owner`` (a mixin of it: the state is the owner's, made in
``Owner.__init__``) that turn queued tasks into leases: how many leases a queue wants, decided
under the lock (``_want_leases``), taken from the ledgers and given workers after it
(``_take_leases``, ``_give_lease``), the lease of the default shape taken at ``init()``
(``take_first_lease``), idle leases returned (past their linger, at once for another shape,
before ``available_resources()``), and the retry after a "no room" answer.
Does not own: the lease book and the ledger calls (``leases.py``), the workers
(``workers.py``), dispatching tasks to leases (``owner.py``), or the ledger (``ledger/``).
Called by: ``Owner`` (its dispatch and I/O thread), ``WorkerRequests`` (idle leases given back
for ``available_resources()``), the runtime (``take_first_lease``, ``flush_idle_leases``).

::

    queue without room ──► _want_leases (locked: how many; window, worker cap)
                               │ defer
                               ▼
                           _take_leases (not locked: ledger.acquire each)
                               │ idle worker of its kind? ── no ──► fork, adopt
                               ▼
                           _give_lease (locked) ──► the queue's next task
    idle past linger/keep ──► _release_idle_leases ──► _release_lease ──► ledger, after the lock
"""

from __future__ import annotations

import functools
import logging
import time

from miniray._private.core import options, placement, scheduling
from miniray._private.owner.leases import LeaseSlot

logger = logging.getLogger(__name__)

# The request of a task decorated without options, and its scheduling key:
# ``take_first_lease`` takes its lease at init (``OwnerEvents.warm_up_round_trip`` finds it
# by that key).
FIRST_REQUEST = options.task_resource_request({})
FIRST_KEY = scheduling.scheduling_key(dict(FIRST_REQUEST), 0, "")


class OwnerLeases:
    """``Owner``'s lease methods (see the module docstring); every attribute is the owner's."""

    def _want_leases(self, key, queue) -> bool:
        """*Locked.* ``key``'s queue has tasks no lease has room for: decide how many leases
        to take (``_take_leases`` takes them once the lock is released). True if the retry
        window said no (a retry is pending then): more queued tasks would not change that."""
        wanted = len(queue) - self._acquiring.get(key, 0)
        if wanted <= 0:
            return False  # enough are being taken
        now = time.monotonic()
        request = queue[0].spec.request
        # Not if it (or less) did not fit a moment ago and nothing was released since; a
        # request of another shape is still tried (a GPU task waiting for the GPU must not
        # hold back the CPU task its holder waits for).
        if not self.leases.window.may_try(now, request):
            if not self._retry_pending:  # the failure was marked when nothing was queued
                self._schedule_retry()
            return True
        # Each new lease gets an idle worker or a new one. Workers blocked in get() do not
        # count against the cap: their parents wait on the very tasks that need a fresh
        # worker (a recursive fib would deadlock otherwise).
        env = key[2]
        room = self._worker_room(request, env)
        if room <= 0:
            if self._acquiring_total or not self._release_idle_leases(
                    force=True, request=request, runtime_env=env):
                if not self._acquiring_total:
                    self._mark_full(now)
                return False
            room = self._worker_room(request, env)
        count = min(wanted, max(1, room))
        self._acquiring[key] = self._acquiring.get(key, 0) + count
        self._acquiring_total += count
        # The idle workers that will get these leases: each is recorded in its lease's own
        # transaction, not in a second one (the first task after init() paid both).
        pids = self.workers.idle_pids(request, env, count)
        self.defer(functools.partial(self._take_leases, key, request, count, pids))
        return False

    def _worker_room(self, request: dict, runtime_env: str = "") -> int:
        """*Locked.* How many more leases of ``request`` in ``runtime_env`` workers can serve
        now: the idle ones of its kind and environment, plus new ones up to the cap, less the
        leases being taken."""
        return self.workers.room(self._acquiring_total, request, runtime_env)

    def _take_leases(self, key, request: dict, count: int, pids: list = ()) -> None:
        """*Not locked.* Take up to ``count`` leases for ``key`` from the ledgers, start the
        workers they need, then give each a queued task (re-checked under the lock).
        ``pids``: the idle workers expected to take the first leases, recorded with them."""
        now = time.monotonic()
        got = []
        for index in range(count):
            pid = pids[index] if index < len(pids) else None
            lease, host_lease = self.leases.acquire(request, scheduling.key_tag(key), key,
                                                    make_room=self.make_room, worker_pid=pid)
            if lease is None:
                break
            got.append((lease, host_lease))
        unused: list = []
        to_spawn: list = []
        group_gone = elsewhere = None
        if len(got) < count and self.pgs is not None:
            pg_hex = placement.group_of(request)
            if pg_hex is not None and self.placement_group_gone(pg_hex, far=True):
                group_gone = pg_hex
            elif pg_hex is not None:  # another driver's bundle on another node (a read)
                elsewhere = self.pgs.elsewhere(request)
        with self._lock:
            if group_gone is not None:
                self._fail_group_queues(group_gone)
            elif elsewhere is not None and not self.in_remote_bundle(request):
                self._fail_queue(key, elsewhere)
            if len(got) < count:
                self._mark_full(now, request)
            if not self.may_dispatch():
                unused, got = got, []
            for lease, host_lease in got:
                worker = self.workers.take_idle(request, key[2])  # its kind, its env
                if worker is not None:
                    self._give_lease(key, request, lease, host_lease, worker)
                else:
                    to_spawn.append((lease, host_lease))
            self._taken(key, count - len(to_spawn))
            if not to_spawn:
                self._dispatch_all()  # other keys may have waited for these to be taken
        for lease, host_lease in unused:
            self.leases.release(lease.lease_id, host_lease)
        if not to_spawn:
            return
        fork_server = self.fork_server
        started = [(lease, host_lease, self.start_worker(fork_server))
                   for lease, host_lease in to_spawn]
        with self._lock:
            self._taken(key, len(to_spawn))
            usable = self.may_adopt(fork_server)
            for lease, host_lease, parts in started:
                if usable:
                    worker = self.adopt_worker(parts, key[2])
                    self._give_lease(key, request, lease, host_lease, worker)
                else:
                    self.discard_start(parts)
            self._dispatch_all()
        if not usable:
            for lease, host_lease, _parts in started:
                self.leases.release(lease.lease_id, host_lease)

    def _taken(self, key, count: int) -> None:
        self.leases.stuck.clear()  # fewer leases being taken: a queue may fill pipelines
        if count:
            self._acquiring[key] -= count
            if not self._acquiring[key]:
                del self._acquiring[key]
            self._acquiring_total -= count

    def _give_lease(self, key, request: dict, lease, host_lease, worker) -> None:
        """*Locked.* Book a new lease for ``worker`` and send it ``key``'s next task; with
        none left (done or cancelled meanwhile), the lease is idle from now."""
        gpu_ids = self.leases.gpu_ids(lease) if scheduling.worker_kind(request) else None
        slot = LeaseSlot(lease, key, worker, gpu_ids, host_lease)
        worker.lease = slot
        if worker.kind is None:  # from now on it runs tasks of this kind only
            worker.kind = scheduling.worker_kind(request)
        if worker.pid is not None and worker.pid != lease.worker_pid:  # else recorded
            self._ledger_later(self.ledger.set_worker, lease.lease_id, worker.pid)
        self.leases.add(slot)
        self.leases.stuck.pop(key, None)  # a new worker for the key
        queue = self.tasks.queues.get(key)
        if queue:
            self._send_task(slot, queue.popleft())
            if not queue:
                del self.tasks.queues[key]
        else:
            slot.idle_since = time.monotonic()

    def take_first_lease(self) -> None:
        """*Not locked.* ``init()``, once a prestarted worker is ready: the lease of the
        default task shape (one CPU: ``@remote`` without options) is taken for that worker
        now, so the first such task finds a lease with room and is sent at once, without a
        ledger transaction (the session's first: 0.3-0.8 ms on that task's path before).

        The lease is idle from now on and goes back as any idle lease does: after ``keep``
        (``MINIRAY_LEASE_KEEP_MS``) with no task, after ``linger`` once another session
        waits for resources, at once when another shape needs the room or
        ``available_resources()`` is asked. Its worker takes no kind until a task runs
        there (``_release_lease``). Nothing is taken when the CPU is not free, and that
        failure is not noted as a want (``Ledger.acquire(wanted=False)``): other sessions
        keep their idle leases."""
        request, key = dict(FIRST_REQUEST), FIRST_KEY
        with self._lock:
            if (not self.may_dispatch() or key in self.leases.by_key
                    or self.tasks.queues.get(key) or self._acquiring_total):
                return
            worker = self.workers.ready_idle(request)
            if worker is None:
                return
            pid = worker.pid  # known: a ready worker's READY named it, if SPAWNED had not
        lease = self.ledger.acquire(request, holder_pid=self.pid, tag=scheduling.key_tag(key),
                                    worker_pid=pid, wanted=False)
        if lease is None:
            return
        with self._lock:
            given = (self.may_dispatch() and key not in self.leases.by_key
                     and worker in self.workers.idle and not worker.dead)
            if given:
                self.workers.idle.remove(worker)
                self._give_lease(key, request, lease, None, worker)
        if not given:
            self.leases.release(lease.lease_id, None)
        self._wake_io()  # its keep is counted from now: the I/O thread's next sleep knows

    def make_room(self) -> bool:
        """*Not locked.* Return idle leases so a new one may fit (given back before this
        returns, without the lock)."""
        returned: list = []
        with self._lock:
            released = self._release_idle_leases(force=True, returned=returned)
        for slot in returned:
            self.leases.release(slot.lease.lease_id, slot.host_lease, note=False)
        return released

    def release_lease_later(self, lease_id: str, host_lease: str | None) -> None:
        """*Locked.* Give a lease back to the ledgers once the lock is released; work waiting
        for room is dispatched again then."""
        self.leases.window.note_release()
        self.defer(functools.partial(self._give_back, lease_id, host_lease))

    def _give_back(self, lease_id: str, host_lease: str | None) -> None:
        try:
            self.leases.release(lease_id, host_lease, note=False)
        except (OSError, KeyError) as error:
            logger.debug("lease %s: %s", lease_id, error)
            return
        if self.tasks.queues or self.actors.pending:  # what waited for room may fit now
            with self._lock:
                self.leases.window.note_release()
                self._dispatch_all()
        if self.pgs is not None and self.pgs.has_pending():
            self.pgs.try_pending()

    def _mark_full(self, now: float, request: dict | None = None) -> None:
        """``request`` did not fit the ledgers (None: the cap on workers, for every request);
        queued work is tried again in ``RETRY_S`` at the latest."""
        self.leases.window.mark_full(now, request)
        if self.tasks.queues:
            self._schedule_retry()

    def retry_soon(self) -> None:
        """*Locked.* Queued tasks and pending actors are tried again in ``RETRY_S`` at the
        latest (for what only another session's release can make room for)."""
        self._schedule_retry()

    def _schedule_retry(self) -> None:
        if not self._retry_pending:
            self._retry_pending = True

            def retry():
                self._retry_pending = False
                self.leases.window.note_release()  # forget the failure: ask the ledger again
                self._dispatch_all()

            self.reactor.call_later(self.leases.RETRY_S, retry)

    def _release_lease(self, slot: LeaseSlot, worker_reusable: bool = True,
                       returned: list | None = None) -> None:
        """*Locked.* Take a lease off the book; the ledgers get it back by the caller after
        the lock (appended to ``returned``), or as deferred work."""
        self.leases.remove(slot)
        if returned is not None:
            self.leases.window.note_release()
            returned.append(slot)
        else:
            self.release_lease_later(slot.lease.lease_id, slot.host_lease)
        worker = slot.worker
        worker.lease = None
        if worker_reusable and not worker.dead:
            if not worker.calls:  # no task ran there (a lease taken at init): no kind yet
                worker.kind = None
            self.workers.keep_idle(worker)

    def _release_idle_leases(self, force: bool = False, returned: list | None = None,
                             request: dict | None = None, runtime_env: str = "") -> bool:
        """Return idle leases to the ledger (all if ``force``, else those past the linger);
        with ``force`` at the cap on workers, an idle worker retires too (one that may not
        run ``request`` in ``runtime_env`` first)."""
        released = False
        now = time.monotonic()
        slots = self.leases.idle_slots(now, self.linger, force)
        if slots and not force and self.keep > self.linger and not \
                self.leases.ledger.others_waiting(self.WANTED_FOR_S):
            slots = [slot for slot in slots if now - slot.idle_since >= self.keep]
        for slot in slots:
            self._release_lease(slot, returned=returned)
            released = True
        if force and self.workers.idle and self.workers.busy() >= self.workers.max_workers:
            self.workers.retire_one_idle(request, runtime_env)
        return released

    def flush_idle_leases(self) -> None:
        """Every idle lease goes back to the ledgers before this returns (the caller reads
        ``available_resources()`` next)."""
        returned: list = []
        with self._lock:
            self._release_idle_leases(force=True, returned=returned)
        for slot in returned:
            self.leases.release(slot.lease.lease_id, slot.host_lease, note=False)
        # Leases released just before (e.g. past their linger, by the I/O thread) may still
        # be on their way back: wait for them.
        self._run_deferred(wait=True)

    def _fail_unschedulable(self, key, message: str) -> None:
        """Other sessions held the GPUs ``key`` needs past MINIRAY_HOST_GPU_TIMEOUT
        (``leases.py``): its queued tasks, or the actor being placed, fail."""
        from miniray.exceptions import ActorUnschedulableError, TaskUnschedulableError

        if isinstance(key, tuple) and key and key[0] == "actor":
            self.actors.fail_placement(key[1], ActorUnschedulableError(message))
            return
        queue = self.tasks.queues.pop(key, None)
        for task in list(queue or ()):
            self.tasks.fail(task, TaskUnschedulableError(message))
