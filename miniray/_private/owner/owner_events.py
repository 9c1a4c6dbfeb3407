"""What the owner's workers and fork server say, and the workers' starts and deaths.

Owns: the methods of ``Owner`` (a mixin of it: the state is the owner's, made in
``Owner.__init__``) that start and adopt workers (the prestart at ``init()``, a lease's new
worker), read what they and the fork server send on the I/O thread (or in a ``get()`` reading
its own result, ``direct_reads.py``) and act on it: RESULT, SUBMIT, PUT, BORROW, YIELD,
GIVE_BACK, GET, WAIT, CALL, READY and the actor messages from a worker; SPAWNED and EXITED from
the fork server; a worker's printed lines; a worker's death (its task retried or failed, its
actor restarted or dead), and what a worker's progress frees (the next queued task, an idle
lease).
Does not own: the requests' answers (``requests.py``), the actors (``actors.py``), the task
records (``tasks.py``), the worker pool (``workers.py``), the fork server's own death
(``owner_helper_loss.py``), or the leases (``owner_leases.py``).
Called by: ``Owner``'s I/O thread (``Reactor`` handlers registered in ``Owner.__init__``),
``DirectReads`` (``_handle_frames``), the runtime (``prestart_workers``, and
``warm_up_round_trip``: init()'s hidden no-op through the first lease's worker).
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import threading
import time

from miniray._private.core import pipelining, protocol, serialization
from miniray._private.core.scheduling import T_DONE
from miniray._private.core.task_spec import STREAMING
from miniray._private.host import procinfo
from miniray._private.object_store import shm_segments
from miniray._private.owner.leases import LeaseSlot
from miniray._private.owner.object_table import Waiter
from miniray._private.owner.owner_leases import FIRST_KEY
from miniray._private.owner.tasks import Task
from miniray._private.owner.workers import WorkerPool, WorkerSlot

logger = logging.getLogger(__name__)


class OwnerEvents:
    """``Owner``'s worker and fork-server event methods (see the module docstring); every
    attribute is the owner's."""

    start_worker = staticmethod(WorkerPool.start)  # *Not locked.* The fork request.

    def kill_process_later(self, pid: int) -> None:
        """*Locked.* SIGKILL a worker once the lock is released: the request goes to the fork
        server that started it (its parent), a socket write that is not made under the
        lock."""
        self.defer(functools.partial(self.fork_server.kill, pid, signal.SIGKILL))

    def discard_start(self, parts: tuple) -> None:
        """*Locked.* Close a started worker's ends instead of adopting it (it exits on EOF)."""
        self.workers.discard(parts)

    def adopt_worker(self, parts: tuple, runtime_env: str = "") -> WorkerSlot:
        """*Locked.* Watch a worker asked for by ``start_worker``; it runs in ``runtime_env``
        (a ``runtime_envs.env_key``; "" is the job's environment)."""
        worker, early = self.workers.adopt(parts)
        worker.runtime_env = runtime_env
        hello = self.hello_info
        if runtime_env:
            hello = {**hello, "runtime_env_key": runtime_env}
        self.send(worker, (protocol.HELLO, hello))
        if early is not None:  # the fork server answered before the worker was adopted
            self._on_spawned(worker, early)
        return worker

    def prestart_workers(self, count: int) -> threading.Event:
        """*Not locked.* Start ``count`` idle workers in the job's environment, so that the
        first tasks wait neither for forks nor for the fork server's own start (a fresh
        interpreter importing miniray, 50-100 ms). They hold no lease: a task's lease takes
        one as it takes any idle worker. Returns ``worker_ready``, set once the first of them
        answered its HELLO (READY): ``init()`` waits for it, then briefly for
        ``workers_ready`` (all of them)."""
        fork_server = self.fork_server
        started = [self.start_worker(fork_server) for _ in range(count)]
        with self._lock:
            usable = self.may_adopt(fork_server)
            for parts in started:
                if usable:
                    worker = self.adopt_worker(parts)
                    if not worker.exited and not worker.ready:
                        self._unready.add(worker)
                    self.workers.keep_idle(worker)
                else:
                    self.discard_start(parts)
            if not self._unready:
                self.workers_ready.set()
        return self.worker_ready

    def warm_up_round_trip(self, spec, fn_bytes: bytes, timeout: float) -> bool:
        """*Not locked.* ``init()``, once the first lease is taken: one round trip of a
        built-in no-op (``spec``, pickled by value as ``fn_bytes``) through that lease's
        worker, by the code a task takes (FUNC and TASK written by ``_send_task``; the
        worker reads, unpickles, runs and answers as for any task; this thread reads the
        RESULT itself, ``direct_reads.py``, and ``_on_result`` handles it), so that the
        program's first task is not the first run of any of it on either side.

        It is no task of the session: no record (``tasks``, ``state_records``: no state API
        row, timeline event or count), no object (``spec``'s return id has no entry), no
        output marker or prefix switch (``spec.name`` is None, the name neither side has
        yet), no lease of its own. Its task leaves the worker's in-flight list as soon as it
        is written, so the RESULT finds no task (``_on_result`` knows its id from
        ``_warm_ups``, with the worker) and the owner sees the worker idle throughout: a task
        submitted meanwhile is sent to it and runs after the warm-up. Waits at most
        ``timeout``; a later answer is dropped the same way, and a worker that dies first
        ends the wait at once (``_worker_gone`` drops its entry). True if it came in time."""
        key = FIRST_KEY
        waiter = Waiter(1, False)
        with self._lock:
            slots = self.leases.by_key.get(key)
            slot = slots[0] if slots and len(slots) == 1 else None
            worker = slot.worker if slot is not None else None
            if (worker is None or not worker.ready or worker.dead or worker.inflight
                    or worker.direct or worker.named is not None or self._closed
                    or not self.may_dispatch() or spec.fn_id in self._functions):
                return False
            self._functions[spec.fn_id] = fn_bytes
            task = Task(spec, key)
            self._send_task(slot, task)
            del self._functions[spec.fn_id]  # written: the worker keeps it (worker.funcs)
            if worker.inflight and worker.inflight[-1] is task:
                worker.inflight.pop()
            self._warm_ups[spec.task_id] = (waiter, worker)
            claimed = self.direct_reads.claim_worker(worker)
        if self._deferred:
            self._run_deferred()
        if claimed:
            answered = self.direct_reads.read(worker, waiter, timeout)
        else:
            answered = waiter.wait(timeout)
        return answered and not worker.exited and not self._closed  # else no answer

    def _end_warm_up(self, task_id: bytes) -> None:
        """*Locked.* A warm-up round trip ends (``warm_up_round_trip``): its RESULT came
        (nothing is kept), or it never will (its worker gone, shutdown): its entry goes and
        its waiter (init()) is woken; ``warm_up_round_trip`` tells the two apart."""
        waiter, _ = self._warm_ups.pop(task_id)
        waiter.notify(False)

    def _warm_ups_lost(self, worker: WorkerSlot) -> None:
        """*Locked.* ``worker`` is gone: its warm-ups will never be answered."""
        for task_id in [task_id for task_id, (_, warming) in self._warm_ups.items()
                        if warming is worker]:
            self._end_warm_up(task_id)

    def _now_ready(self, worker: WorkerSlot) -> None:
        """*Locked.* ``worker`` answered READY or is gone."""
        self.worker_ready.set()
        unready = self._unready
        if unready and worker in unready:
            unready.discard(worker)
            if not unready:
                self.workers_ready.set()

    def _on_spawned(self, worker: WorkerSlot, pid: int) -> None:
        """*Locked.* The fork server named ``worker``'s pid (its READY may have named it
        first: then nothing is left to do)."""
        if worker.pid is None:
            self._name_worker(worker, pid)

    def _name_worker(self, worker: WorkerSlot, pid: int) -> None:
        """*Locked.* Record ``worker``'s pid, from whichever comes first: the fork server's
        SPAWNED or the worker's own READY (two sockets: either may be read first). Its
        results' state rows and timeline spans read the pid when they are recorded."""
        self.worker_forked.set()
        status = self.workers.named(worker, pid)
        if worker.kill_on_spawn:
            self.kill_process_later(pid)
        if worker.lease is not None:
            self._ledger_later(self.ledger.set_worker, worker.lease.lease.lease_id, pid)
        if status is not None:  # it exited before it was adopted
            self._worker_gone(worker, status)

    def _on_worker_exit(self, pid: int, status: int) -> None:
        worker = self.workers.exited(pid, status)
        if worker is not None:
            self._worker_gone(worker, status)

    def _worker_gone(self, worker: WorkerSlot, status: int | None,
                     death: str | None = None) -> tuple[int, int]:
        """*Locked.* A worker's process is gone: its exit ``status`` (a wait status), or
        ``death`` when it died with the process that forked it (no status is reported then).
        Its running task is retried while ``max_retries`` allows, else fails; an actor
        restarts or dies (actors.py). Returns (tasks requeued, tasks failed)."""
        if worker.exited:
            return 0, 0
        worker.exited = True
        self._now_ready(worker)  # init() does not wait for a worker that will never be ready
        if self._warm_ups:  # nor for its answer to a warm-up round trip
            self._warm_ups_lost(worker)
        pid = worker.pid
        if pid is not None:
            self.workers.by_pid.pop(pid, None)
        self.workers.live -= 1
        self.requests.release_read_pins(worker)
        borrowed, worker.borrowed = worker.borrowed, set()
        for object_id in borrowed:  # its refs died with it
            self.objects.unborrow(object_id)
        if worker.inflight:  # results it wrote to shared memory but never handed over
            spec = worker.inflight[0].spec
            unsent = list(spec.return_ids)
            if spec.num_returns == STREAMING:  # and the value it was yielding
                unsent.append(self.streams.next_item_id(spec.task_id))
            for object_id in unsent:
                if not self.store.contains(object_id):
                    shm_segments.unlink_quiet(os.path.join(
                        self.store.shm_dir, shm_segments.segment_name(self.store.session_tag,
                                                                      object_id)))
        if worker.blocked:
            worker.blocked = 0
            self.workers.blocked -= 1
        self.workers.drain_output(worker)
        was_dead = worker.dead
        if not was_dead:
            self.workers.retire(worker)
        detail = (procinfo.describe_wait_status(status) if death is None
                  else f"was killed because {death}")
        if worker.oom is not None:
            detail += " by the memory monitor (the host ran low on memory)"
        if worker.actor is not None:
            self.actors.on_worker_exit(
                worker, detail if death is None else f"it was killed because {death}")
            self._dispatch_all()
            return 0, 0
        if self.actors.created_by and not self._closed:  # a task worker: its creations die
            if was_dead:  # with it unless this driver retired it (Ray keeps such a worker)
                self.actors.creator_retired(worker)
            else:
                running = worker.inflight[0].spec.name if worker.inflight else None
                self.actors.creator_gone(worker, f"the worker process (pid={pid})"
                                         + (f" of task {running}" if running else "")
                                         + f" {detail}")
        if worker.lease is not None:
            # Queued before its task's error is visible, given back once the lock is free:
            # available_resources() (which waits for deferred work) sees it back.
            self._release_lease(worker.lease, worker_reusable=False)
        if self._closed:
            return 0, 0
        inflight = list(worker.inflight)
        worker.inflight.clear()
        requeued, failed = self.tasks.worker_died(inflight, pid, detail, death, self.fatal,
                                                  worker.oom)
        self._dispatch_all()
        return requeued, failed

    def _on_output(self, fd: int) -> None:
        stream = self.workers.streams.get(fd)
        if stream is None:
            return
        lock = stream.lock
        if lock is None:
            stream.drain()
        else:
            with lock:  # a result handled by a reading get() prints what came before it
                stream.drain()
        if stream.eof:
            with self._lock:
                if self.workers.streams.get(fd) is stream:
                    self.workers.close_stream(stream)

    def _on_fork_server(self, fd: int) -> None:
        message = self.fork_server.read_message()
        if message == ():
            return
        if message is None:
            self.helper_loss.on_eof(fd)
            return
        tag = message[0]
        with self._lock:
            if tag == protocol.SPAWNED:
                worker = self.workers.spawned(message[1], message[2])
                if worker is not None:
                    self._on_spawned(worker, message[2])
            elif tag == protocol.EXITED:
                self._on_worker_exit(message[1], message[2])
            elif tag == protocol.NODE_STOPPING:
                self.helper_loss.on_stopping(message[1])
            elif tag == protocol.BYE:
                pass

    def _on_worker_data(self, fd: int) -> None:
        worker = self.workers.by_fd.get(fd)
        if worker is None:
            self._unregister(fd)
            return
        read_lock = worker.read_lock
        if not read_lock.acquire(False):
            return  # a get() reads this socket now (direct_reads.py): it handles the frames
        try:
            frames, closed = worker.conn.recv_ready()
            if closed:
                self._unregister(fd)
            if frames:
                self._handle_frames(worker, frames)
        finally:
            read_lock.release()

    def _handle_frames(self, worker: WorkerSlot, frames: list) -> None:
        """*Not locked; ``worker.read_lock`` held.* Handle the frames read from ``worker``'s
        data socket, in order, by the I/O thread or by a get() reading its own result
        (``direct_reads.py``). Each frame leaves ``frames`` as its handling starts."""
        loads = pickle.loads
        with self._lock:
            if len(frames) == 1:
                self._handle_worker_message(worker, loads(frames.pop()))
                return
            reactor = self.reactor
            reactor.cork()  # the tasks and replies these frames cause go out together
            # What the worker printed before the last of these frames was written before
            # they were read: one look at its pipes puts it before every result here.
            worker.drain_printed()
            self._drained = worker
            frames.reverse()
            pop = frames.pop
            try:
                while frames:
                    self._handle_worker_message(worker, loads(pop()))
            finally:
                frames.reverse()
                self._drained = None
                reactor.uncork()

    def _handle_worker_message(self, worker: WorkerSlot, message: tuple) -> None:
        tag = message[0]
        if worker.read_pins and tag in (protocol.RESULT, protocol.GET, protocol.WAIT):
            self.requests.release_read_pins(worker)
        if tag == protocol.RESULT:
            if worker.interrupted:
                self.requests.call_ended(worker, message[1])
            if worker.actor is not None:
                if self._drained is not worker:
                    worker.drain_printed()
                values = self.actors.on_result(worker, message[1], message[2], message[4],
                                               message[5], message[3])
            else:
                self._on_result(worker, message[1], message[2], message[3], message[5])
                values = True
            if message[4] and values:  # refs pickled inside the returned values: those
                self._contain_results(message[1], message[4])  # objects hold them
        elif tag == protocol.ACTOR_SUBMIT:
            try:
                self.actors.submit(message[1], message[2], worker)
            except Exception as error:  # e.g. PendingCallsLimitExceeded: the refs carry it
                data = serialization.dumps(error)
                for object_id in message[2].return_ids:
                    self.objects.set_ready(object_id, protocol.ERR, data)
        elif tag == protocol.ACTOR_READY:
            self.actors.on_ready(worker, message[2], message[3], message[4], message[5])
        elif tag == protocol.ACTOR_EXITING:
            self.actors.on_exiting(worker, message[1])
        elif tag == protocol.SUBMIT:
            parent = worker.inflight[0] if worker.inflight else None
            if worker.actor is not None and message[2] is not None:  # from an actor call
                parent = self.tasks.call_parent(message[2])
            spec = message[1]
            try:
                self._lock.release()
                try:
                    self.submit_task(spec, parent)
                finally:
                    self._lock.acquire()
            except Exception as error:
                self.tasks.fail(Task(spec, None), error)
        elif tag == protocol.PUT:
            # The worker keeps its ObjectRef: it reports it as a borrower like any other.
            self.objects.set_ready(message[1], message[2], message[3])
            if self.objects.borrow(message[1]):
                worker.borrowed.add(message[1])
            if len(message) > 4 and message[4]:
                self.objects.contain(message[1], message[4])
        elif tag == protocol.BORROW:
            self.requests.on_borrow(worker, *message[1:])
        elif tag == protocol.YIELD:
            # Lines printed before the value was yielded come first, as before a result.
            if self._drained is not worker:
                worker.drain_printed()
            self.streams.on_item(message[1], message[2], message[3], message[4], message[5])
        elif tag == protocol.GIVE_BACK:
            self._on_give_back(worker, message[1])
        elif tag == protocol.GET:
            self.requests.on_get(worker, message[1], message[2], message[3], message[4])
        elif tag == protocol.WAIT:
            self.requests.on_wait(worker, message[1], message[2], message[3], message[4],
                                  message[5])
        elif tag == protocol.CALL:
            self.requests.on_call(worker, message[1], message[2], message[3])
        elif tag == protocol.READY:
            worker.ready = True
            if worker.pid is None:  # before the fork server's SPAWNED was read
                self._name_worker(worker, message[1])
            self._now_ready(worker)

    def _on_result(self, worker: WorkerSlot, task_id: bytes, results: list,
                   retryable: bool, times: tuple | None = None) -> None:
        # Lines the task printed were written before its result: print them first.
        if self._drained is not worker:
            worker.drain_printed()
        task, in_order = pipelining.take_finished(worker.inflight, task_id)
        if not in_order:
            if task is None and task_id in self._warm_ups:  # init()'s, never a task
                self._end_warm_up(task_id)
                return
            logger.error("miniray bug: %s result for task %s", "out-of-order" if task
                         else "unexpected", task_id.hex())
            if task is None:
                return
        task.times = times  # the worker's own clock readings, for the timeline
        worker.calls += 1
        # max_calls counts the calls of one function on one worker, as in Ray.
        calls = worker.fn_calls[task.spec.fn_id] = worker.fn_calls.get(task.spec.fn_id, 0) + 1
        if task.spec.max_calls and calls >= task.spec.max_calls:
            worker.spent = True
        if retryable or task.state == T_DONE:
            self.tasks.finished(task, results, retryable)
        else:  # finished(), inlined for the common case: nothing to retry
            self.tasks.complete(task, results)
        self._after_worker_progress(worker)

    def _on_give_back(self, worker: WorkerSlot, task_ids: list) -> None:
        """*Locked.* ``worker`` blocked (or is about to) and gave back tasks it did not start:
        they go back to their queues (no retry used) and to other workers."""
        worker.recalled = False
        stuck = self.leases.stuck
        if worker.lease is not None:  # the worker has room again (the result path's
            stuck.pop(worker.lease.key, None)  # refill assumes one freed slot)
        for key in self.tasks.hand_back(worker, task_ids):
            stuck.pop(key, None)
            self._dispatch(key)
        self._after_worker_progress(worker)

    def _on_unblock(self, worker: WorkerSlot) -> None:
        """*Locked.* ``worker`` is no longer blocked in ``get()``/``wait()``: tasks of its key
        may be queued behind its running one again (``lease_to_fill`` skips blocked ones)."""
        slot = worker.lease
        if slot is not None:
            self.leases.stuck.pop(slot.key, None)
            if self.tasks.queues.get(slot.key):
                self._dispatch(slot.key)

    def _recall_for(self, slot: LeaseSlot) -> None:
        """*Locked.* ``slot``'s worker is idle and its key's queue empty: a worker of the key
        holding tasks behind a running one is asked to give them back (``pipelining.py``)."""
        other = pipelining.lease_to_recall(self.leases.by_key.get(slot.key))
        if other is not None:
            other.worker.recalled = True
            self.send_control(other.worker, (protocol.RECALL,))

    def _contain_results(self, task_id: bytes, contained: list) -> None:
        for index, inner in enumerate(contained, start=1):
            if inner:
                self.objects.contain(task_id + index.to_bytes(4, "big"), inner)

    def _after_worker_progress(self, worker: WorkerSlot) -> None:
        slot = worker.lease
        if slot is None:
            return
        if worker.spent and not worker.inflight:
            self._release_lease(slot, worker_reusable=False)
            self.workers.retire(worker)
            self._dispatch_all()
            return
        key = slot.key
        queue = self.tasks.queues.get(key)
        if queue:
            leases = self.leases
            mark = leases.stuck.get(key)
            if (mark is not None and mark[0] == leases.window.releases
                    and 0 < len(worker.inflight) < mark[1] and not worker.blocked
                    and len(queue) > self._acquiring.get(key, 0) and not self._closed
                    and not self.helper_loss.restarting and not self.helper_loss.fatal):
                # Nothing changed since ``_dispatch`` found no room for the key but this
                # worker's finished task: its pipeline slot is the only room, and the full
                # dispatch would give it the next task and end stuck again, as it is now.
                self._send_task(slot, queue.popleft())
                if not queue:
                    del self.tasks.queues[key]
            else:
                leases.stuck.pop(key, None)
                self._dispatch(key)
        else:  # this worker has room now: a task submitted next must not find the mark
            self.leases.stuck.pop(key, None)
        if not worker.inflight and slot.worker is worker:
            if (self.pipeline_depth > 1 and key not in self.tasks.queues
                    and len(self.leases.by_key.get(key, ())) > 1):  # another may hold some
                self._recall_for(slot)
            if self.tasks.queues:
                # Another shape is waiting: give the resources back now so it can run.
                self._release_lease(slot)
                self._dispatch_all()
            elif slot.idle_since is None:
                slot.idle_since = time.monotonic()
