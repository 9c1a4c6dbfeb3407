"""The owner: object table, dispatch and the I/O thread.

Owns: every object and task of the session (embedded mode: the driver owns them all, nested
tasks included), dispatching tasks to leased workers, a cancel's lookup, and the work decided
under its lock that runs after it (``defer``). ``Owner`` is one object in three modules, each
a seam of it: this one; taking and returning the leases tasks run under
(``owner_leases.py``); what workers and the fork server say, and workers' starts and deaths
(``owner_events.py``: results, retries after a worker's death). Those two are mixins of
``Owner``: their methods use its state, made in ``__init__`` here.
Does not own: the task records, argument waits, queues and cancellation (``tasks.py``), the
lease book (``leases.py``), the worker pool (``workers.py``), the fork server's death
(``owner_helper_loss.py``), the scheduling rules (``core/scheduling.py``), resource decisions
(``resources.py`` through ``ledger.py``), process creation (the fork server), validation
(``options.py``), or the public API's argument checks.
Called by: ``runtime.Runtime`` (driver-side API), and its own I/O thread.

::

    submit(spec) ──► deps ready? ──► queue[key] ──► lease with room? ──► TASK ──► worker
                        │ no                          │ no: decide how many leases (locked),
                        ▼                             ▼ then ledger + worker after the lock
                   waits on entries            infeasible? one stderr line, stays pending

    I/O thread (epoll): worker data fd ─► RESULT/SUBMIT/PUT/GET/WAIT/CALL
                        worker out/err ─► prefixed lines to the driver's stdout/stderr
                        fork server    ─► SPAWNED / EXITED (death → retry or WorkerCrashedError)
                                          EOF: its own death (owner_helper_loss.py)
                        timers         ─► worker get/wait timeouts, idle-lease release
                        after each turn ─► deferred work (ledger, fork requests)
    a get() of one running task's result reads that worker's socket itself meanwhile
    (``direct_reads.py``), handling its frames through the same ``_handle_frames``

All state is guarded by one lock, and no file lock, fork request or blocking write runs while
it is held (``defer``). ObjectRef creation and deletion only append to a deque (no lock, so
``__del__`` can never deadlock); the events are applied under the lock in batches.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
from typing import Any

from miniray._private.core import (
    config,
    oob,
    pipelining,
    placement,
    protocol,
    runtime_envs,
    scheduling,
    serialization,
)
from miniray._private.core.resources import float_request
from miniray._private.core.scheduling import (
    T_DONE,
    T_QUEUED,
    T_RUNNING,
)
from miniray._private.host import worker_logs
from miniray._private.owner.actors import ActorManager
from miniray._private.owner.deferred import DeferredWork
from miniray._private.owner.direct_reads import DirectReads
from miniray._private.owner.leases import LeaseBook, LeaseSlot
from miniray._private.owner.object_table import ObjectTable, Waiter
from miniray._private.owner.owner_events import OwnerEvents
from miniray._private.owner.owner_helper_loss import HelperLoss
from miniray._private.owner.owner_leases import OwnerLeases
from miniray._private.owner.requests import WorkerRequests
from miniray._private.owner.state_records import StateRecords
from miniray._private.owner.store_gc import StoreGc
from miniray._private.owner.streams import Streams
from miniray._private.owner.tasks import Task, TaskQueue
from miniray._private.owner.waiting import WaitWatch
from miniray._private.owner.workers import WorkerPool, WorkerSlot
from miniray._private.transport import node_client
from miniray._private.transport.reactor import Reactor

logger = logging.getLogger(__name__)
# Scheduling keys remembered by request dict (``submit_task``); emptied when full.
_KEY_CACHE = 64


def _logs_dir(session_dir: str | None) -> str | None:
    """The session's ``logs/`` for the workers' log files, or None without one."""
    if not session_dir or config.worker_log_bytes() <= 0:
        return None
    try:
        return worker_logs.ensure_logs_dir(session_dir)
    except (OSError, RuntimeError) as error:  # InsecurePathError: no log files either
        logger.debug("no worker log files in %s: %s", session_dir, error)
        return None


class Owner(OwnerLeases, OwnerEvents):
    """Objects, tasks and leased workers of one session. Its parts are given what they need
    at construction: the leases (``leases.py``), the worker pool (``workers.py``), workers'
    own requests (``requests.py``), the tasks and their queues (``tasks.py``), the fork
    server's or node's death (``owner_helper_loss.py``)."""

    POOL_IDLE_S = 0.5  # freed segments kept this long for reuse (memcpy-speed puts)
    # The I/O thread sleeping at most this long applies dropped refs when it wakes: a drop
    # does not wake it (a write, a wake-up and a sweep per dropped ref in a round-trip loop).
    PROMPT_FREE_S = 0.01
    WANT_CHECK_S = 0.01  # an idle lease kept past its linger: is another session waiting?
    # (no longer than PROMPT_FREE_S: a ref dropped meanwhile waits for that wake-up)
    WANTED_FOR_S = 0.5  # a session that found no room this recently is still waiting
    SWEEP_S = 0.001  # the I/O thread's sweeps run at most this often (_housekeeping)

    def __init__(self, *, ledger, store, fork_server, node_state, hello_info: dict,
                 num_cpus: float, log_to_driver: bool, gpu_keys: list | None = None,
                 restart_fork_server=None):
        self.ledger = ledger
        self.store = store
        self.fork_server = fork_server
        self.node_state = node_state  # totals only, for infeasibility checks
        self.hello_info = hello_info
        self.log_to_driver = log_to_driver
        # As in Ray, a job's LoggingConfig drops the "(name pid=N)" prefix: it would break
        # the structured lines the workers write.
        self.prefix_enabled = (config.worker_log_prefix_enabled()
                               and not hello_info.get("logging_config"))
        self.pid = os.getpid()
        self.session_token = object()
        # An idle lease is kept for this session's next task up to ``keep`` seconds, or up
        # to ``linger`` while another session of the node waits for resources (_idle_plan).
        self.linger = config.lease_linger_s()
        self.keep = config.lease_keep_s()
        self.pipeline_depth = config.pipeline_depth()  # tasks a worker may hold (pipelining.py)
        self.gpu_ids_are_ints = hello_info.get("gpu_ids_are_ints", True)
        # Why the job's runtime_env (init's) cannot be set up, if it cannot; then every
        # task or actor of it fails with RuntimeEnvSetupError, as in Ray.
        self._job_env_error = runtime_envs.setup_error(hello_info.get("runtime_env") or {})
        self._env_errors: dict = {}  # env_key -> RuntimeEnvSetupError or None

        # The lock and the work decided under it, done once it is free (deferred.py).
        self.deferred = DeferredWork()
        self._lock = self.deferred.lock
        self._run_deferred = self.deferred.run
        # Reading objects needs only an open session: what is stored stays readable after
        # the fork server or the node is lost for good (self.fatal).
        self.objects = ObjectTable(store, self._lock, self._check_open, self._wake_io, None)
        # ObjectRef bookkeeping goes straight to the table (lock-free appends).
        self.ref_created = self.objects.ref_created
        self.ref_dropped = self.objects.ref_dropped
        self.get_serialized = self.objects.get_serialized  # a get()'s call less
        self.ref_pickled = self.objects.ref_pickled
        self._functions: dict[bytes, bytes] = {}
        # init()'s warm-up round trips not answered yet: task id -> (Waiter, WorkerSlot)
        # (``warm_up_round_trip``; a late answer is dropped by its id, a dead worker's
        # entries by ``_worker_gone``).
        self._warm_ups: dict[bytes, tuple] = {}
        # The values of streaming generator calls, as they are yielded.
        self.streams = Streams(self.objects)
        self.actors = ActorManager(self)
        self.pgs = None  # the placement groups (placement_groups.py), set by the runtime
        self.remote_nodes = None  # tasks on other hosts (remote_nodes.py), at first use
        self._spill_quiet = 0.0  # no cluster view: _spill looks again after this time
        # Finished tasks and calls, kept (bounded) for ray.util.state and `miniray list`.
        self.state_records = self.actors.records = StateRecords()
        self._closed = False
        self._next_sweep = 0.0  # monotonic time of the I/O thread's next sweep
        self._stopping = False
        self._drained = None  # the worker whose output pipes were read for this batch
        self._retry_pending = False
        self._deferred = self.deferred.queue  # tested on the per-task path before running it
        self._acquiring: dict[Any, int] = {}  # leases being taken, by key
        self._acquiring_total = 0

        self.reactor = Reactor(self._lock, self._housekeeping, self._idle_hint,
                               after_unlock=self._run_deferred, pending=self._deferred)
        self.workers = WorkerPool(
            reactor=self.reactor, log_to_driver=log_to_driver,
            prefix_enabled=self.prefix_enabled, max_workers=config.max_workers(num_cpus),
            idle_keep=max(1, int(num_cpus)), on_data=self._on_worker_data,
            on_output=self._on_output, log_dir=_logs_dir(hello_info.get("session_dir")),
            log_cap=config.worker_log_bytes())
        # Set once the fork server named a worker: it is up and forking (``prestart_workers``).
        self.worker_forked = threading.Event()
        # Set once a worker answered its HELLO with READY (or one died before): it has
        # connected, applied the session's settings and waits in its loop, so the first task
        # pays neither its start-up nor its first page faults (``prestart_workers``).
        self.worker_ready = threading.Event()
        # Set once every prestarted worker answered READY or died: the rest of the prestart
        # no longer takes the CPU from the first tasks (``prestart_workers``).
        self.workers_ready = threading.Event()
        self._unready: set = set()  # prestarted workers that have not answered READY yet
        self._keys: dict = {}  # (id(request), max_calls, env) -> (request, scheduling key)
        # The one path by which tasks and actors take resources.
        self.leases = LeaseBook(
            ledger=ledger, pid=self.pid, gpu_keys=gpu_keys,
            host_gpu_timeout=config.host_gpu_timeout_s(),
            make_room=lambda: self._release_idle_leases(force=True),
            on_unschedulable=self._fail_unschedulable, call_later=self.reactor.call_later)
        # Workers' own requests: get, wait, calls, and the segments they map.
        self.requests = WorkerRequests(
            objects=self.objects, store=store, reactor=self.reactor, workers=self.workers,
            leases=self.leases, ledger=ledger, actors=self.actors, lock=self._lock,
            send=self.send, defer=self.defer, ledger_later=self._ledger_later,
            dispatch_all=self._dispatch_all, cancel=self._cancel_locked,
            release_idle_leases=self._release_idle_leases, hello_info=hello_info,
            streams=self.streams, on_unblock=self._on_unblock)
        self.objects.on_free = self._object_freed
        if config.report_unhandled_errors():
            self.objects.on_unhandled_error = self._unhandled_error
        self.requests.placement_groups = lambda: self.pgs
        # Tasks from submission to results: argument waits, queues per key, completion.
        self.tasks = TaskQueue(
            objects=self.objects, store=store, node_state=node_state,
            unpin_deps=self.requests.unpin_deps,
            # by_key is never rebound: its bound __contains__ costs no Python call
            has_lease=self.leases.by_key.__contains__, dispatch=self._dispatch,
            kill_worker=self._kill_for_cancel, signal_cancel=self.signal_cancel,
            records=self.state_records, skip_queued=self._skip_queued, leases=self.leases,
            offload=self._offload, locate=self._locate, requeue_later=self._requeue_later)
        # A get() of one running task's result reads its worker's socket itself.
        self.direct_reads = DirectReads(
            lock=self._lock, tasks_by_id=self.tasks.by_id, reactor=self.reactor,
            handle_frames=self._handle_frames, deferred=self._deferred,
            run_deferred=self._run_deferred, closed=lambda: self._closed or self._stopping,
            objects=self.objects, linger=self.linger, prompt=self.PROMPT_FREE_S)
        self.objects.direct_reads = self.direct_reads
        # The fork server's or the node's death: a restart, or the session's end (fatal).
        self.helper_loss = HelperLoss(
            lock=self._lock, objects=self.objects, workers=self.workers, actors=self.actors,
            restart_fork_server=restart_fork_server, fork_server=lambda: self.fork_server,
            replace_fork_server=self._replace_fork_server, unregister=self._unregister,
            closed=lambda: self._closed, closing=lambda: self._closed or self._stopping,
            worker_gone=self._worker_gone, dispatch_all=self._dispatch_all,
            unfinished_tasks=self.tasks.unfinished, fail_task=self.tasks.fail,
            drop_queues=self.tasks.drop_queues)
        # What waits for resources: a line on stderr past a few seconds, demands for status.
        self.waits = WaitWatch(
            tasks=self.tasks, actors=self.actors, reactor=self.reactor, defer=self.defer,
            ledger=ledger, pid=self.pid, closed=lambda: self._closed,
            threshold_s=config.wait_notice_s(), session_dir=hello_info.get("session_dir", ""))
        # Garbage collection here and in the workers when the store fills up (Ray's).
        self.store_gc = StoreGc(
            store=store, workers=self.workers, send_control=self.send_control,
            reactor=self.reactor, defer=self.defer, closed=lambda: self._closed)
        self.reactor.register(fork_server.fileno(), self._on_fork_server)
        self.reactor.start()
        with self._lock:
            self.waits.start()
            self.store_gc.start()

    # ------------------------------------------------------------------ objects
    def put_value(self, object_id: bytes, value, contained: tuple = ()) -> None:
        """The driver's put: serialized straight into the store (a segment for large values),
        outside the lock; then the object is ready. The store is this process's own: puts
        work even after the fork server or node was lost. ``value`` may be serialized
        already (a large call argument), with the ids of the refs inside it in
        ``contained``."""
        self._check_open()
        if self.objects.ref_events:  # objects just dropped: free them first, so their
            with self._lock:          # segments can be reused (memcpy-speed puts)
                self.objects.apply_ref_events()
            self.reactor.wake()  # and the I/O thread times the release of what was pooled
        serialization.start_collecting()  # refs pickled inside the value: the object holds them
        try:
            self.store.put_value(object_id, value)
        finally:
            contained = serialization.stop_collecting() + list(contained)
        with self._lock:
            self.objects.set_ready(object_id, protocol.OK, None, stored=True)
            if contained:
                self.objects.contain(object_id, contained)

    def _object_freed(self, object_id: bytes) -> None:
        """*Locked.* Workers unmap its segment; a stream whose completion object it was is
        forgotten."""
        if self.requests.mapped_by:  # tested here: most freed objects were never mapped
            self.requests.object_freed(object_id)
        if self.streams.by_task:
            self.streams.object_freed(object_id)

    def _unhandled_error(self, object_id: bytes) -> None:
        """*Locked.* An error object nobody read (a get, a wait, a call taking it) is being
        freed: it is logged, as Ray logs it, unless it is a cancelled task's or an actor's
        death (Ray 2.60 is silent for both: compared case by case), or the session is
        shutting down (everything is freed then)."""
        if self._closed or self._stopping:
            return
        data = self.store.inline_or_none(object_id)
        if data is None:  # errors are small (stored inline); a lost one says nothing more
            return

        def report() -> None:
            from miniray.exceptions import (  # lazy: the error path only
                RayActorError,
                TaskCancelledError,
            )

            try:
                error = oob.loads_inline(data)
            except Exception:  # its class cannot be loaded here: nothing to show
                return
            cause = getattr(error, "cause", None)  # a RayTaskError's (cancelled while running)
            if not isinstance(error, (TaskCancelledError, RayActorError)) and not isinstance(
                    cause, (TaskCancelledError, KeyboardInterrupt)):
                logger.error("Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'"
                             "): %s", error)

        self.defer(report)

    def stream_next(self, task_id: bytes, index: int, timeout: float | None) -> bool | None:
        """The driver's ``next()`` of a streaming call: True once value ``index`` is there,
        False if the call ended without it, None if ``timeout`` passed first
        (``streams.py``)."""
        with self._lock:
            self._check_open()
            state = self.streams.next(task_id, index)
            if state is not None:
                return state
            waiter = Waiter(1, on_error=False)
            self.streams.add_waiter(task_id, waiter)
        waiter.wait(timeout)
        with self._lock:
            self.streams.remove_waiter(task_id, waiter)
            self._check_open()
            return self.streams.next(task_id, index)

    def knows(self, object_id: bytes) -> bool:
        return object_id in self.objects.entries

    def get_serialized(self, object_ids: list[bytes], timeout: float | None):
        return self.objects.get_serialized(object_ids, timeout)

    def wait_ready(self, object_ids: list[bytes], num_returns: int, timeout: float | None):
        return self.objects.wait_ready(object_ids, num_returns, timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("miniray has been shut down; call miniray.init() again.")

    @property
    def fatal(self) -> str | None:
        """Why the session cannot run work any more (its fork server or node was lost for
        good), else None."""
        return self.helper_loss.fatal

    def check_usable(self) -> None:
        """For submissions: the session is open and can still run work."""
        if self._closed or self.helper_loss.fatal:  # one test on the per-task path
            self._check_open()
            from miniray.exceptions import RaySystemError

            raise RaySystemError(self.fatal)

    # ------------------------------------------------------------------ tasks
    def needs_function(self, fn_id: bytes) -> bool:
        return fn_id not in self._functions

    def export_function(self, fn_id: bytes, fn_bytes: bytes) -> None:
        """*Locked.* Keep a function's (or class's) pickle for the workers that will run it."""
        self._functions.setdefault(fn_id, fn_bytes)

    def function_bytes(self, fn_id: bytes) -> bytes:
        """*Locked.* The pickle of an exported function or class."""
        return self._functions[fn_id]

    @property
    def closed(self) -> bool:
        return self._closed

    def locked(self):
        """``with owner.locked():`` holds the owner's lock, then does what was decided under
        it (``defer``) once it is released: the way other modules take the lock."""
        return self.deferred.locked()

    def runtime_env_error(self, runtime_env: str):
        """*Locked.* The ``RuntimeEnvSetupError`` a task or actor of ``runtime_env`` (an
        ``env_key``; "" is the job's) fails with, or None: decided once per environment."""
        if not runtime_env and self._job_env_error is None:
            return None  # the common case: the job's environment, which can be set up
        error = self._env_errors.get(runtime_env, False)
        if error is False:
            from miniray.exceptions import RuntimeEnvSetupError

            env = runtime_envs.from_key(runtime_env) if runtime_env else None
            text = (runtime_envs.setup_error(env) if env is not None
                    else self._job_env_error)
            error = self._env_errors[runtime_env] = (
                None if text is None else RuntimeEnvSetupError(text))
        return error

    def count_actor_worker(self, delta: int) -> None:
        """*Locked.* A worker started (+1) or stopped (-1) hosting an actor: it does not count
        against the cap on task workers."""
        self.workers.actors += delta

    def submit_task(self, spec, parent: Task | None = None) -> None:
        # The key of a request already seen (a driver's template passes the same dict each
        # time): a lookup instead of sorting the request for every task.
        cache_key = (id(spec.request), spec.max_calls, spec.runtime_env)
        cached = self._keys.get(cache_key)
        if cached is not None and cached[0] is spec.request:
            key = cached[1]
        else:
            key = scheduling.scheduling_key(spec.request, spec.max_calls, spec.runtime_env)
            if len(self._keys) >= _KEY_CACHE:  # nested submissions bring new dicts each time
                self._keys.clear()
            self._keys[cache_key] = (spec.request, key)  # holds the dict: its id stays its
        with self._lock:
            if self._closed or self.helper_loss.fatal:  # check_usable(), inlined
                self.check_usable()
            if spec.fn_bytes is not None:
                self._functions.setdefault(spec.fn_id, spec.fn_bytes)
                spec.fn_bytes = None
            elif spec.fn_id not in self._functions:
                raise RuntimeError(f"miniray bug: function {spec.name} was never exported")
            env_error = None  # the per-task path tests two fields for the common case
            if spec.runtime_env or self._job_env_error is not None:
                env_error = self.runtime_env_error(spec.runtime_env)
            self.tasks.submit(spec, key, parent, env_error)
            if spec.placement is not None:
                self.note_placement_use()
            objects = self.objects
            if len(objects.ref_events) > 256:
                objects.apply_ref_events()
        if self._deferred:
            self._run_deferred()

    def _offload(self, task, local_feasible: bool):
        """*Locked.* ``TaskQueue``'s hook (``remote_nodes.RemoteNodes.offload``); a task in
        a placement group goes there only when its bundle is on another node
        (``remote_bundles.RemoteBundles.submit``), which a one-host program never asks."""
        spec = task.spec
        if spec.placement is not None:
            if self.remote_nodes is not None and self.remote_nodes.bundles.submit(task):
                return True
            if spec.affinity is None and local_feasible:
                return None
        return self._remote_nodes().offload(task, local_feasible)

    def _locate(self, task):
        """*Locked.* ``TaskQueue``'s hook for a task given results kept on other nodes
        (``remote_nodes.RemoteNodes.locate``): they exist only where remote_nodes does."""
        return None if self.remote_nodes is None else self.remote_nodes.locate(task)

    def _remote_nodes(self):
        """*Locked.* The tasks placed on other hosts (``remote_nodes.py``), made at first
        use: a one-host program never loads it."""
        if self.remote_nodes is None:
            from miniray._private.owner.remote_nodes import RemoteNodes  # lazy: multi-host

            self.remote_nodes = RemoteNodes(self)
        return self.remote_nodes

    def _dispatch(self, key) -> bool:
        """Send queued tasks of ``key`` to leased workers; False if some must keep waiting.

        When it finds no room at all (no idle lease, every pipeline full or blocked, and the
        retry window saying no to a new lease), ``key`` is marked stuck (``leases.stuck``)
        and later calls return at once, until an event that may make room drops the mark:
        a result or give-back of the key's worker (``_after_worker_progress``), a worker of
        the key unblocked (``_on_unblock``), a lease given (``_give_lease``), leases taken
        (``_taken``), anything that tries every key (``_dispatch_all``), and a release or
        the retry timer (``window.releases`` moves). A mark is only made while a retry is
        pending, so one missed event costs at most ``RETRY_S``, never a hang. Submitting
        more tasks does not drop it: none of the three answers depends on the queue's
        length then."""
        helper_loss = self.helper_loss  # may_dispatch(), inlined: this runs for every task
        if self._closed or helper_loss.restarting or helper_loss.fatal:
            return False
        queue = self.tasks.queues.get(key)
        leases = self.leases
        if queue:
            mark = leases.stuck.get(key)
            if mark is not None and mark[0] == leases.window.releases:
                return False  # nothing that could make room happened since
        by_key = leases.by_key
        while queue:
            lease = scheduling.lease_with_room(by_key.get(key))
            if lease is None:
                window_full = self._want_leases(key, queue)
                if window_full and self._spill(queue) and not queue:
                    break  # every queued task went to another node with room
                depth = pipelining.depth_for(key, self.pipeline_depth)
                pipes_full = depth <= 1 or self._fill_pipelines(key, queue, depth)
                if queue:
                    if window_full and pipes_full:
                        leases.stuck[key] = (leases.window.releases, depth)
                    return False
                break
            lease.idle_since = None
            self._send_task(lease, queue.popleft())
        if queue is not None and not queue:
            del self.tasks.queues[key]
        return True

    def _spill(self, queue) -> int:
        """*Locked.* The local ledger has no room now for ``queue``'s tasks (the retry
        window said no): tasks another node has room for go there (spill-over,
        ``RemoteNodes.spill``); how many went. Only where this session's node publishes a
        cluster view (it peers); without one, looked for at most once a second, so a
        one-host session never loads remote_nodes and pays one stat a second at most."""
        if self.remote_nodes is None:
            now = time.monotonic()
            if now < self._spill_quiet:
                return 0
            session_dir = self.hello_info.get("session_dir")
            if not session_dir or not os.path.exists(
                    os.path.join(session_dir, node_client.CLUSTER_FILE)):
                self._spill_quiet = now + 1.0
                return 0
        return self._remote_nodes().spill(queue)

    def _fill_pipelines(self, key, queue, depth: int) -> bool:
        """*Locked.* No idle worker has room for ``key``'s queue: queue tasks behind the
        running ones, up to the key's ``depth`` (``pipelining.py``), but only those no lease
        being taken will run: a worker that becomes free soon serves the rest. True if it
        stopped because no worker of the key can hold another task (more queued tasks
        would not change that)."""
        spare = len(queue) - self._acquiring.get(key, 0)
        if spare <= 0:
            return False
        leases = self.leases.by_key.get(key)
        while spare > 0 and queue:
            lease = pipelining.lease_to_fill(leases, depth)
            if lease is None:
                return True
            self._send_task(lease, queue.popleft())
            spare -= 1
        return False

    def may_dispatch(self) -> bool:
        """Nothing is sent once shutdown has started (the fork server may already be gone),
        nor while there is no usable fork server (being replaced, or lost for good)."""
        helper_loss = self.helper_loss
        return not (self._closed or helper_loss.restarting or helper_loss.fatal)

    def may_adopt(self, fork_server) -> bool:
        """*Locked.* Whether workers asked of ``fork_server`` (outside the lock) may be
        adopted now: dispatch is allowed and that fork server was not replaced or lost
        meanwhile (which took the requests with it)."""
        return self.may_dispatch() and fork_server is self.fork_server

    def _dispatch_all(self) -> None:
        self.leases.stuck.clear()  # called when something changed: every key is tried
        if not self.may_dispatch():
            return
        if self.actors.pending:
            self.actors.place_pending()
        for key in list(self.tasks.queues):
            self._dispatch(key)

    # -- placement groups (placement_groups.py decides; these act on this owner's work) -----
    def wake_dispatch(self) -> None:
        """*Locked.* Resources appeared (a group was reserved): queued work is tried now."""
        self.leases.window.note_release()
        self._dispatch_all()

    def _fail_group_queues(self, pg_hex: str) -> None:
        """*Locked.* The queued tasks of a removed group fail (Ray leaves them pending)."""
        from miniray.exceptions import TaskPlacementGroupRemoved

        error = TaskPlacementGroupRemoved(
            "The placement group corresponding to this task has been removed.")
        for table in (self.tasks.queues, self.tasks.infeasible):
            for key in [k for k in table if placement.key_in_group(k[0], pg_hex)]:
                for task in list(table.pop(key)):
                    self.tasks.fail(task, error)

    def _fail_queue(self, key, text: str) -> None:
        """*Locked.* The queued tasks of ``key`` can never run in this driver (``text``
        says why: ``placement_groups.elsewhere``): they fail with TaskUnschedulableError."""
        from miniray.exceptions import TaskUnschedulableError  # lazy: as above

        for table in (self.tasks.queues, self.tasks.infeasible):
            for task in list(table.pop(key, ())):
                self.tasks.fail(task, TaskUnschedulableError(text))

    def placement_group_removed(self, pg_hex: str) -> None:
        """*Locked.* A group is being removed: its queued tasks fail, its running tasks fail
        and their workers are killed, its actors die (``actors.kill_in_group``)."""
        from miniray.exceptions import TaskPlacementGroupRemoved

        self._fail_group_queues(pg_hex)
        error = TaskPlacementGroupRemoved(
            "The placement group corresponding to this task has been removed.")
        for slot in self.leases.slots():
            if placement.key_in_group(slot.key[0], pg_hex):
                worker = slot.worker
                for task in list(worker.inflight):
                    if task.state != T_DONE:
                        self.tasks.fail(task, error)
                self._kill_for_cancel(worker)
        self.actors.kill_in_group(pg_hex)

    def note_placement_use(self) -> None:
        """*Locked.* Work of this owner is in a placement group: watch for its removal by
        any driver of the node (``placement_groups.watch``)."""
        if self.pgs is not None:
            self.pgs.watch()

    def placement_group_gone(self, pg_hex: str, far: bool = False) -> bool:
        """*Not locked* (a ledger read; ``far``: a task's, round trips to other nodes for a
        group this node does not hold: ``PlacementGroups.gone``). Whether work for the
        group can never run."""
        return self.pgs is not None and self.pgs.gone(pg_hex, far)

    def holds_own_group(self, pg_hex: str) -> bool:
        """*Locked.* Whether group ``pg_hex`` is this driver's own, held in its node's
        ledger (not a detached one that the node's actor service holds for it)."""
        group = self.pgs.groups.get(pg_hex) if self.pgs is not None else None
        return group is not None and not group.served

    def serves_bundle(self, request: dict) -> bool:
        """*Locked.* Whether a (rewritten) placement request is in a bundle on another node
        of a detached group the node's actor service holds (``remote_bundles`` step 8), or
        of another driver's group of this node (step 9): an actor there is the service's,
        as a named one is."""
        return self.remote_nodes is not None and self.remote_nodes.bundles.serves(request)

    def in_remote_bundle(self, request: dict) -> bool:
        """*Locked.* Whether a (rewritten) placement request is in a placement group's
        bundle on another node (``remote_bundles``)."""
        return self.remote_nodes is not None and self.remote_nodes.bundles.holds(request)

    def groups_in_use(self) -> set:
        """*Locked.* The placement groups this owner's queued or running work is in."""
        used = set()
        for table in (self.tasks.queues, self.tasks.infeasible, self.leases.by_key):
            for key in table:
                if isinstance(key, tuple) and key and isinstance(key[0], tuple):
                    pg_hex = placement.group_of(dict(key[0]))
                    if pg_hex is not None:
                        used.add(pg_hex)
        for actor in self.actors.actors.values():
            spec = actor.spec
            if spec.pg is not None and not actor.remote and actor.worker is not None:
                used.add(spec.pg[0])
        return used

    def after_placement_removal(self) -> None:
        """*Not locked.* The kills decided under the lock are sent before this returns."""
        self._run_deferred(wait=True)

    def defer(self, action) -> None:
        """*Locked.* Run ``action`` once the lock is released (``deferred.py``)."""
        self._deferred.append(action)
        if not self.reactor.in_io_thread():
            self.reactor.wake()  # in case this thread's caller does not run it

    def _ledger_later(self, method, *args) -> None:
        """*Locked.* A ledger transaction (its file lock) after the owner's lock is released.
        A node's ledger may be gone with the node (the session then fails as a whole)."""
        def run():
            try:
                method(*args)
            except (OSError, KeyError) as error:  # KeyError: the lease went with the node
                logger.debug("ledger %s%s: %s", method.__name__, args, error)
        self.defer(run)

    def send(self, worker: WorkerSlot, message: tuple) -> None:
        """Write to a worker without ever blocking (the lock is held): what does not fit in
        the socket now is written by the I/O thread when it becomes writable."""
        self.reactor.send(worker.conn, pickle.dumps(message, 5), self._on_writable)

    def send_soon(self, worker: WorkerSlot, message: tuple) -> None:
        """*Locked.* ``send`` to a worker busy with earlier messages: written with those
        that follow it, by the I/O thread or once a batch is full (``Reactor.send_soon``)."""
        self.reactor.send_soon(worker.conn, pickle.dumps(message, 5), self._on_writable)

    def notify_serializers(self) -> None:
        """*Not locked.* Tell every worker that the custom serializers' file changed
        (``host/serializer_file.py``): on each data socket the notice precedes every call
        sent after it, and a worker started later reads the file at its first call."""
        with self.locked():
            for worker in list(self.workers.by_fd.values()):
                if not worker.dead:
                    self.send(worker, (protocol.SERIALIZERS,))

    def _on_writable(self, fd: int) -> None:
        with self._lock:
            worker = self.workers.by_fd.get(fd)
            self.reactor.flush(fd, None if worker is None or worker.dead else worker.conn)

    def send_control(self, worker: WorkerSlot, message: tuple) -> None:
        """*Locked.* A control message (CANCEL): a blocking write, so it is sent after the
        lock is released; a worker gone meanwhile does not need it."""
        data = pickle.dumps(message, 5)
        ctl = worker.ctl

        def send():
            try:
                ctl.send_bytes(data)
            except (OSError, ValueError):  # closed: the worker is gone or retired
                pass
        self.defer(send)

    def _send_task(self, slot: LeaseSlot, task: Task) -> None:
        worker = slot.worker
        spec = task.spec
        task.state = T_RUNNING
        task.worker = worker
        name = spec.name
        if name != worker.named:
            # A new name for this worker: named here (its pipes read, the prefix switched)
            # when it is idle, so it writes no marker line (two pipe writes, and the I/O
            # thread woken by them during the task; ``output.py``).
            if worker.name_output(name):
                worker.conn.queue(pickle.dumps((protocol.NAMED, name), 5))
            worker.named = name
        worker.inflight.append(task)
        try:
            if spec.fn_id not in worker.funcs:
                worker.funcs.add(spec.fn_id)
                # Queued only: the TASK's send below writes both in one system call, and
                # the worker reads both in one wake-up (a function's first task on a worker).
                worker.conn.queue(pickle.dumps(
                    (protocol.FUNC, spec.fn_id, self._functions[spec.fn_id]), 5))
            dep_values = None
            if spec.deps:
                dep_values = self.requests.dep_payloads(spec.deps, pin=not task.pinned,
                                                        worker=worker)
                task.pinned = True
            request = slot.float_request
            if request is None:
                request = slot.float_request = float_request(spec.request)
            ctx = (
                request,
                slot.gpu_ids,
                self.gpu_ids_are_ints,
                spec.retry_exceptions,
                spec.function_name,
                spec.placement,
            )
            # send(), inlined: one call less per task
            self.reactor.send(worker.conn, pickle.dumps(
                (protocol.TASK, spec.task_id, spec.fn_id, spec.name, spec.args_blob,
                 dep_values, spec.return_ids, spec.num_returns, ctx), 5), self._on_writable)
        except OSError:
            # The worker is dying; its EXITED report will requeue or fail the task.
            pass

    # ------------------------------------------------------------------ cancel
    def cancel(self, object_id: bytes, force: bool, recursive: bool) -> None:
        with self._lock:
            self._cancel_locked(object_id, force, recursive)
        self._run_deferred(wait=True)  # a forced cancel's kill is sent before this returns

    def _cancel_locked(self, object_id: bytes, force: bool, recursive: bool) -> None:
        """A driver's ``cancel()`` and a worker's (requests.py), with the lock held."""
        from miniray.exceptions import TaskCancelledError

        if self.actors.cancel(object_id[:24], force, recursive):
            return
        task = self.tasks.by_id.get(object_id[:24])
        if task is None or task.state == T_DONE:
            return
        self.tasks.cancel(task, force, recursive, TaskCancelledError)

    def _kill_for_cancel(self, worker: WorkerSlot) -> None:
        """*Locked.* A force-cancelled task's worker is killed (``tasks.py`` decided it)."""
        remote_kill = getattr(worker, "remote_kill", None)  # a task on another host
        if remote_kill is not None:
            self.defer(remote_kill)
        elif worker.pid is not None:
            self.kill_process_later(worker.pid)
        else:  # not spawned yet: killed as soon as the fork server names its pid
            worker.kill_on_spawn = True

    def cancel_call_tasks(self, call_id: bytes) -> None:
        """*Locked.* A recursive cancel of an actor call reaches the tasks it submitted."""
        self.tasks.cancel_children_of_call(call_id)

    def actor_call_ended(self, call_id: bytes) -> None:
        """*Locked.* The actor call is done: the tasks it submitted are no longer its."""
        self.tasks.call_ended(call_id)

    def _skip_queued(self, worker: WorkerSlot, task_id: bytes) -> None:
        """*Locked.* A task pipelined behind another on ``worker`` was cancelled: the worker
        answers it with the cancel error instead of running it (``worker_main.py``)."""
        self.send_control(worker, (protocol.CANCEL, task_id))

    def signal_cancel(self, worker: WorkerSlot, task_id: bytes) -> None:
        """*Locked.* Ask a worker to interrupt the call it runs, a task or an actor call
        (KeyboardInterrupt in a task; a flag in an actor), and end that call's waits."""
        self.requests.interrupt(worker, task_id)
        try:
            self.send_control(worker, (protocol.CANCEL, task_id))
        except OSError:
            pass

    # ------------------------------------------------------------------ I/O thread
    def _register(self, fd: int, handler) -> None:
        self.reactor.register(fd, handler)

    def _wake_io(self) -> None:
        reactor = getattr(self, "reactor", None)
        if reactor is not None:
            reactor.wake()

    def _replace_fork_server(self, new) -> None:
        """*Locked.* Use a new fork server (the old one died, ``owner_helper_loss.py``)."""
        self.fork_server = new
        self._register(new.fileno(), self._on_fork_server)

    def _unregister(self, fd: int) -> None:
        self.reactor.unregister(fd)

    def _housekeeping(self) -> None:
        """Run by the I/O thread with the lock held after every wake-up. Reference and
        handle events are applied every time; the sweeps (idle leases, mapped-object records,
        pooled segments) at most every ``SWEEP_S``: under a stream of results the loop wakes
        once per task, and a sweep is worth doing only on the scale of the linger."""
        objects = self.objects
        if objects.ref_events:
            objects.apply_ref_events()
        else:
            objects.wake_pending = False  # _idle_hint decides again before the next sleep
        if self.actors.handle_events:
            self.actors.apply_handle_events()
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.SWEEP_S
        if self.leases and not self._closed:
            if self._release_idle_leases():
                self._dispatch_all()
        self.requests.prune_mapped()
        if self.store.pooled_segments():
            self.store.trim_pool(max_idle_s=self.POOL_IDLE_S)

    def _idle_hint(self) -> float | None:
        """How soon the I/O thread should wake to return idle leases or recycled segments
        (None: no need). Run by the I/O thread just before it sleeps, after housekeeping:
        when it will sleep ``PROMPT_FREE_S`` at most, refs dropped meanwhile need not wake
        it (``ObjectTable.ref_dropped``): they are applied when it wakes. Recycled segments
        kept do not lengthen a lease's linger (nor make each dropped ref wake it)."""
        wait = self.leases.next_idle_check(time.monotonic(), self.linger, self.keep,
                                           self.WANT_CHECK_S)
        if wait is None and self.direct_reads.active:  # a read makes one idle
            wait = self.linger
        if wait is not None:
            wait = max(wait, self.SWEEP_S)  # sweeps run at most that often: no spinning
            if wait <= self.PROMPT_FREE_S:
                self.objects.wake_pending = True
        if self.store.pooled_segments():  # a little after the oldest becomes old enough
            pooled = self.POOL_IDLE_S + 0.05
            return pooled if wait is None else min(wait, pooled)
        return wait

    # ------------------------------------------------------------------ status
    def worker_pids(self) -> list[int]:
        with self._lock:
            return sorted(self.workers.by_pid)

    def statistics(self) -> dict:
        with self._lock:
            return {
                "objects": len(self.objects),
                **self.tasks.statistics(),
                "workers": self.workers.live,
                "idle_workers": len(self.workers.idle),
                "leases": len(self.leases),
                "fork_server_restarts": self.helper_loss.restarts,
                "store": self.store.statistics(),
                **self.actors.statistics(),
                **self.streams.statistics(),
                "placement_groups": self.pgs.statistics() if self.pgs is not None else {},
            }

    def __repr__(self) -> str:
        return (f"<Owner objects={len(self.objects)} tasks={len(self.tasks.by_id)} "
                f"workers={self.workers.live}>")

    # ------------------------------------------------------------------ shutdown
    def _requeue_later(self, task: Task, delay: float) -> None:
        """*Locked.* Queue ``task`` again after ``delay`` seconds (a task the memory monitor
        killed): unless it ended meanwhile (cancelled) or the session closed."""
        def again():  # on the I/O thread, locked
            if self._closed or task.state != T_QUEUED or task.worker is not None:
                return
            queue = self.tasks.queues.get(task.key)
            if queue is not None and task in queue:
                return
            self.tasks.requeue(task)
            self._dispatch_all()

        self.reactor.call_later(delay, again)

    def let_running_finish(self, grace: float) -> None:
        """Teardown step 0, at interpreter exit only: wait up to ``grace`` seconds, serving
        as usual, for the tasks and actor calls running now to end. A program that ends
        while a short task still runs sees it finish and print, as under Ray, whose slower
        exit lets it (Ray's ``obj_ref.py`` example ends so)."""
        deadline = time.monotonic() + grace
        while True:
            with self._lock:
                busy = not self._closed and any(
                    not worker.dead and worker.runs_work()
                    for worker in self.workers.by_req.values())
            if not busy or time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def shutdown(self, grace: float = 1.0) -> None:
        """Teardown steps 1-4 of ARCHITECTURE.md (the runtime does 5-6)."""
        if self.remote_nodes is not None and self.actors.link is not None:
            self.remote_nodes.bundles.return_loans()  # step 1, before the link closes
        doomed = []
        with self._lock:
            self._closed = self.objects.closed = True
            if self.actors.link is not None:  # the node's actor service ends our actors
                self.actors.link.close()
            workers = list(self.workers.by_req.values())
            # A worker still in init()'s warm-up has an empty in-flight list, but is busy.
            warming = [warming for _, warming in self._warm_ups.values()]
            for worker in workers:
                if worker.dead:
                    continue
                busy = worker.runs_work() or worker.blocked or any(
                    warming_worker is worker for warming_worker in warming)
                if busy and worker.pid is not None:
                    doomed.append(worker.pid)
                else:
                    self.workers.retire(worker)
            fork_server = self.fork_server
            for task_id in list(self._warm_ups):  # never answered now
                self._end_warm_up(task_id)
        if self.remote_nodes is not None:  # links and workers on other hosts
            self.remote_nodes.close()
        for pid in doomed:  # the fork server's socket is written after the lock
            fork_server.kill(pid, signal.SIGKILL)
        fork_server.request_shutdown(grace)
        fork_server.wait(timeout=grace + 4.0)
        self._stopping = True
        self.reactor.stop()
        self._run_deferred()  # leases given back, late starts discarded (the I/O thread is done)
        deadline = time.monotonic() + 0.5
        for worker in workers:
            for stream in (worker.out, worker.err):
                if stream is not None:
                    stream.drain_until_eof(deadline)
                    stream.close()
            for conn in (worker.conn, worker.ctl):
                try:
                    conn.close()
                except OSError:
                    pass
        self.workers.streams.clear()
        with self._lock:
            held = self.leases.take_all()
            self.objects.clear()
            self.tasks.clear()
        for slot in held:  # the ledger's file lock, after the owner's
            self.leases.release(slot.lease.lease_id, slot.host_lease, note=False)
        self.fork_server.close()
        self.reactor.close()
        self.store.close()
