"""The owner's tasks: each task's record, the queues per scheduling key, and the waits on
arguments.

Owns: a task from submission to its results (``Task``, by task id), the wait on each
argument object still pending (a task is queued once all are ready, or completes with the
first argument's error; one kept on another node is not waited for: the task is offered
to ``locate`` first, and waits for it only if it stays here), the infeasibility decision
at enqueue time (one stderr line per
scheduling key), the queues and the infeasible lists per key, what becomes of a task after
a failed result or its worker's death (retried at the front of its queue, or failed),
cancellation (``scheduling.cancel_action``; killing or interrupting a worker is the
owner's), and completing or failing a task (its return objects are set, its arguments
released, its parent forgets it). Does not own: dispatch (the owner sends queued tasks to
leased workers: ``dispatch(key)``), leases (``leases.py``), the functions' pickles, the
workers (``owner.py`` tells which task a result or a dead worker's tasks belong to), or the
objects (``object_table.py``).
Called by: ``owner.Owner``, with the owner's lock held (every method is *Locked*).
"""

from __future__ import annotations

import collections
import itertools
import logging
import sys
import time
from typing import Any

from miniray._private.core import ids, memory_policy, protocol, scheduling, serialization
from miniray._private.core.dependency_errors import dependency_error_bytes
from miniray._private.core.resources import format_infeasible, infeasible_reasons
from miniray._private.core.scheduling import (
    T_DONE,
    T_INFEASIBLE,
    T_QUEUED,
    T_RUNNING,
    T_WAITING,
)
from miniray._private.owner.object_table import PENDING, Entry

logger = logging.getLogger(__name__)


def retry_line(name: str, retries_left: int, error: str) -> str:
    """The line a task's retry prints, in Ray's words: ``retries_left`` counts this retry
    (negative: no bound).

    >>> print(retry_line("f", 1, "the worker (pid=7) running it died: exited with code 3."))
    Task f failed. There are 1 retries remaining, so the task will be retried. Error: the ...
    >>> retry_line("f", -1, "x").split(". ")[1]
    'There are infinite retries remaining, so the task will be retried'
    """
    left = "infinite" if retries_left < 0 else retries_left
    return (f"Task {name} failed. There are {left} retries remaining, so the task will be "
            f"retried. Error: {error}")


def error_text(results: list) -> str:
    """The text of the error a failed task's first result holds (its traceback), for the
    retry line; "" when it cannot be read here."""
    try:
        return str(serialization.loads(results[0][1]))
    except Exception:  # noqa: BLE001 - only the retry line's text is missing
        return ""


class Task:
    __slots__ = (
        "spec", "key", "state", "worker", "waiting", "retries_left", "cancelled",
        "children", "parent", "pinned", "created", "seq", "times", "depth", "kept",
        "oom_kills",
    )

    def __init__(self, spec, key, seq: int = 0):
        self.spec = spec
        self.seq = seq  # submission order: a task handed back keeps its place (pipelining)
        self.depth = 0  # nesting: 0 for the driver's tasks, its parent's plus one otherwise
        self.key = key
        self.state = T_WAITING
        self.worker = None
        self.waiting = 0
        self.retries_left = spec.max_retries
        self.cancelled = False
        self.children: list | None = None
        self.parent = None
        self.pinned = False  # its argument objects are pinned in the store while it runs
        self.created = time.time()  # its creation_time_ms in ray.util.state
        self.times = None  # its worker's RESULT times (``state_records``): when it ran
        self.oom_kills = 0  # times the memory monitor killed its worker while it ran
        self.kept = 0  # arguments kept on another node, not waited for: placed first
        #                (-1: placed here by ``locate``, they are pulled: not placed again)


class _DepWaiter:
    """Waits, for a task, on one of its arguments."""

    __slots__ = ("tasks", "task")

    def __init__(self, tasks: TaskQueue, task: Task):
        self.tasks = tasks
        self.task = task

    def notify(self, is_error: bool, object_id: bytes) -> None:
        self.tasks.dep_ready(self.task, is_error, object_id)


class _PlacingWaiter(_DepWaiter):
    """A waiter of a task placed before its arguments kept on other nodes come here
    (``object_table.set_ready`` calls ``kept`` instead of pulling the value for it)."""

    __slots__ = ()
    places_first = True

    def kept(self, object_id: bytes) -> None:
        self.tasks.dep_kept(self.task)


class _CallParent:
    """Stands for an actor call as the parent of the tasks it submits (a ``Task`` parent
    has the same ``children``), so that a recursive cancel of the call reaches them."""

    __slots__ = ("children",)

    def __init__(self):
        self.children: list | None = None


class TaskQueue:
    """Given at construction: the ``objects`` table, the ``store`` (an argument's error
    bytes), ``node_state`` (totals, for infeasibility), ``unpin_deps(deps)`` (store pins of
    a finished task's arguments, ``requests.py``), ``has_lease(key)`` (a lease of that
    key is held: its tasks are feasible), and the owner's ``dispatch(key)``,
    ``kill_worker(worker)``, ``signal_cancel(worker, task_id)`` and ``skip_queued(worker,
    task_id)`` (cancellation's acts). ``leases``: the lease book, whose ``stuck`` marks say
    that ``dispatch(key)`` would find no room (``Owner._dispatch``): not called then.
    ``offload(task, local_feasible)``: offered, once its arguments are ready, a task with a
    node affinity and a task the local node can never hold (before it is held infeasible);
    True when it took it (another node runs it, or it failed unschedulable:
    ``remote_nodes.RemoteNodes.offload``), else None (it stays here), or the stderr line to
    print instead of this node's infeasible one (one naming every node of the cluster).
    ``locate(task)``: offered, once its other arguments are ready, a task with arguments
    kept on other nodes (issue 16) that it did not wait for: True when it placed it on
    another node (where they are, by ``node_pick``'s weighing), else None: it waits for
    them here (they are pulled) and goes on as any task."""

    def __init__(self, *, objects, store, node_state, unpin_deps, has_lease, dispatch,
                 kill_worker, signal_cancel, skip_queued, records=None, leases=None,
                 offload=None, locate=None, requeue_later=None):
        self.objects = objects
        # requeue_later(task, delay): queue ``task`` again after ``delay`` seconds (a task
        # the memory monitor killed); None: at once.
        self._requeue_later = requeue_later
        self.records = records  # state_records.StateRecords: each completion, for the state API
        self.store = store
        self.node_state = node_state
        self._unpin_deps = unpin_deps
        self._has_lease = has_lease
        self._dispatch = dispatch
        self._leases = leases
        self._kill_worker = kill_worker
        self._signal_cancel = signal_cancel
        self._skip_queued = skip_queued
        self._offload = offload
        self._locate = locate
        self.by_id: dict[bytes, Task] = {}
        self.call_parents: dict[bytes, _CallParent] = {}  # running actor calls' children
        self.queues: dict[Any, collections.deque] = {}
        self.infeasible: dict[Any, list[Task]] = {}
        self._reported_infeasible: set = set()
        self._seq = itertools.count()
        self.handed_back = 0  # tasks workers gave back unstarted when they blocked

    def submit(self, spec, key, parent: Task | None = None,
               setup_error: BaseException | None = None) -> None:
        """A new task: its return objects exist from now on; it waits for its arguments,
        then is queued (or infeasible). With ``setup_error`` (its runtime_env cannot be set
        up) it fails at once with that error, as Ray fails it before leasing a worker."""
        task = Task(spec, key, next(self._seq))
        self.by_id[spec.task_id] = task
        objects = self.objects
        entries = objects.entries
        for object_id in spec.return_ids:
            if object_id not in entries:  # ensure(), inlined: a new task's are new
                entries[object_id] = Entry()
        if spec.contained:
            objects.hold(spec.contained)
        if parent is not None:
            task.parent = parent
            task.depth = getattr(parent, "depth", 0) + 1  # an actor call counts as depth 0
            if parent.children is None:
                parent.children = []
            parent.children.append(task)
        if setup_error is not None:
            self.fail(task, setup_error)
            return
        if spec.deps:
            places = self._locate is not None and _places_first(spec)
            for _position, object_id in spec.deps:
                entry = objects.get(object_id)
                if entry is None:
                    self.fail(task, objects.lost(object_id))
                    return
                entry.holders += 1  # held until the task is done
                if entry.state == PENDING:
                    if entry.remote is not None and _reads_there(spec, entry.remote.node_id):
                        continue  # kept on the node it must run on: read there, not pulled
                    if entry.remote is not None and places:
                        task.kept += 1  # placed first (``_kept_first``), then read or pulled
                        continue
                    task.waiting += 1
                    entry.add_waiter(_PlacingWaiter(self, task) if places
                                     else _DepWaiter(self, task))
                elif entry.kind == protocol.ERR:
                    self._complete_with_dep_error(task, object_id)
                    return
        if task.waiting == 0:
            self._enqueue(task)

    def dep_ready(self, task: Task, is_error: bool, object_id: bytes) -> None:
        if task.state != T_WAITING:
            return
        if is_error:
            self._complete_with_dep_error(task, object_id)
            return
        task.waiting -= 1
        if task.waiting == 0:
            self._enqueue(task)

    def dep_kept(self, task: Task) -> None:
        """An argument ``task`` waited for is a result kept on its node: placed first."""
        if task.state != T_WAITING:
            return
        task.kept += 1
        task.waiting -= 1
        if task.waiting == 0:
            self._enqueue(task)

    def _kept_first(self, task: Task) -> bool:
        """Its other arguments are ready; some are kept on other nodes and not waited for
        (``task.kept``). True when ``locate`` placed it on another node, or when it now
        waits for those arguments here (their waiters pull them); False: none is left to
        wait for (pulled meanwhile, or read where it must run)."""
        task.kept = 0
        spec = task.spec
        objects = self.objects
        kept = []
        for _position, object_id in spec.deps:
            entry = objects.get(object_id)
            if entry is not None and entry.state == PENDING and entry.remote is not None \
                    and not _reads_there(spec, entry.remote.node_id):
                kept.append(entry)
        if not kept:
            return False
        if self._locate is not None and self._locate(task) is True:
            return True  # another node's from now on (its arguments read or fetched there)
        task.kept = -1  # placed here: once they are pulled, ``_enqueue`` places it no more
        for entry in kept:
            task.waiting += 1
            entry.add_waiter(_DepWaiter(self, task))  # pulled here now
        return True

    def _complete_with_dep_error(self, task: Task, object_id: bytes) -> None:
        # Ray's error for it: this task's own, naming the argument's error (and its cause).
        data = dependency_error_bytes(self.objects.error_bytes(object_id), task.spec.name)
        self.complete(task, [(protocol.ERR, data)] * max(1, len(task.spec.return_ids)))

    def _enqueue(self, task: Task, placed: bool = False) -> None:
        """Its arguments are ready: queued (and dispatched), held infeasible, or handed to
        ``offload`` (a node affinity, unless ``placed`` says where it runs was decided)."""
        if task.kept > 0 and self._kept_first(task):
            return  # placed on another node, or waiting for its kept arguments
        if task.kept < 0:  # ``locate`` kept it here (a SPREAD turn taken): not offered again
            task.kept = 0
            placed = True
        key = task.key
        spec = task.spec  # a placement group's task is offered too: its bundle may be remote
        affinity = (spec.affinity is not None or spec.placement is not None) and not placed
        if affinity or (key not in self.queues and not self._has_lease(key)):
            reasons = infeasible_reasons(self.node_state, task.spec.request)
            offloaded = None
            if (reasons or affinity) and self._offload is not None:
                offloaded = self._offload(task, not reasons)
                if offloaded is True:
                    return  # another node's from now on (or failed unschedulable)
            if reasons:
                task.state = T_INFEASIBLE
                self.infeasible.setdefault(key, []).append(task)
                if key not in self._reported_infeasible:
                    self._reported_infeasible.add(key)
                    line = (offloaded if isinstance(offloaded, str)
                            else format_infeasible(task.spec.request, reasons))
                    print(f"{line} (task {task.spec.name})", file=sys.stderr, flush=True)
                return
        task.state = T_QUEUED
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = collections.deque()
        if not queue or queue[-1].depth >= task.depth:
            queue.append(task)  # the common case, a driver's task: no scan
        else:  # nested deeper than the last: before the shallower ones (queue_index)
            queue.insert(scheduling.queue_index(((t.depth, t.seq) for t in queue), task.depth),
                         task)
        leases = self._leases  # the dispatch's own first test, inlined: a burst skips it
        if leases is not None:
            mark = leases.stuck.get(key)
            if mark is not None and mark[0] == leases.window.releases:
                return
        self._dispatch(key)

    def resubmit(self, task: Task) -> None:
        """A task placed on another node comes back to be placed here (a retry after that
        node died, placed here by the caller): queued, or infeasible, as a new one whose
        arguments are ready."""
        task.state = T_WAITING
        task.kept = 1 if task.spec.deps else 0  # an argument kept on a node: placed again
        self._enqueue(task, placed=True)

    def requeue(self, task: Task) -> None:
        """Back at the front of its queue (a retry, or never started on a worker that died)."""
        task.state = T_QUEUED
        task.worker = None
        self.queues.setdefault(task.key, collections.deque()).appendleft(task)

    def hand_back(self, worker, task_ids) -> set:
        """``worker`` blocked in ``get()``/``wait()`` and gave back ``task_ids``, which it
        received but did not start: each leaves its in-flight list and goes back into its
        queue in its place (``scheduling.queue_index``), no retry used; one
        cancelled meanwhile (done) is dropped. Returns the keys of the queues they went to."""
        wanted = set(task_ids)
        returned = [task for task in worker.inflight if task.spec.task_id in wanted]
        keys = set()
        for task in returned:
            worker.inflight.remove(task)
            if task.state == T_DONE:
                continue
            task.state = T_QUEUED
            task.worker = None
            queue = self.queues.get(task.key)
            if queue is None:
                queue = self.queues[task.key] = collections.deque()
            queue.insert(scheduling.queue_index(((t.depth, t.seq) for t in queue), task.depth,
                                                task.seq), task)
            keys.add(task.key)
            self.handed_back += 1
        return keys

    def remove_waiting(self, task: Task) -> None:
        """A queued or infeasible task leaves its queue (cancelled before it ran)."""
        if task.state == T_QUEUED:
            queue = self.queues.get(task.key)
            if queue is not None and task in queue:
                queue.remove(task)
        elif task.state == T_INFEASIBLE:
            pending = self.infeasible.get(task.key)
            if pending and task in pending:
                pending.remove(task)

    def cancel(self, task: Task, force: bool, recursive: bool, error_cls) -> None:
        """Cancel ``task`` (and its unfinished children with ``recursive``): fail it if it
        has not started, else kill or interrupt its worker (``scheduling.cancel_action``)."""
        task.cancelled = True
        if recursive and task.children:
            for child in list(task.children):
                if child.state != T_DONE:
                    self.cancel(child, force, recursive, error_cls)
        state = task.state
        worker = task.worker
        running_now = state == T_RUNNING and bool(worker.inflight) and worker.inflight[0] is task
        action = scheduling.cancel_action(state, force, running_now)
        if action == scheduling.CANCEL_FAIL:
            self.remove_waiting(task)
            self.fail(task, error_cls(ids.TaskID(task.spec.task_id)))
        elif action == scheduling.CANCEL_KILL:
            self._kill_worker(worker)
        elif action == scheduling.CANCEL_REMOVE_QUEUED:  # sent behind the running task
            # It fails now; the worker is told to skip it (its RESULT, the cancel error, is
            # then ignored) and stays in the in-flight list, which follows the worker's order.
            self.fail(task, error_cls(ids.TaskID(task.spec.task_id)))
            self._skip_queued(worker, task.spec.task_id)
        elif action == scheduling.CANCEL_SIGNAL:
            self._signal_cancel(worker, task.spec.task_id)

    # -- the tasks an actor call submits ------------------------------------------------
    def call_parent(self, call_id: bytes) -> _CallParent:
        """The parent to submit a task of the running actor call ``call_id`` under."""
        parent = self.call_parents.get(call_id)
        if parent is None:
            parent = self.call_parents[call_id] = _CallParent()
        return parent

    def call_ended(self, call_id: bytes) -> None:
        """The actor call is done (result, failure or cancel): its tasks run on unparented."""
        if self.call_parents:
            self.call_parents.pop(call_id, None)

    def cancel_children_of_call(self, call_id: bytes) -> None:
        """A recursive cancel of an actor call: its unfinished tasks are cancelled too (not
        forced: ``force=True`` is refused for actor calls before this)."""
        from miniray.exceptions import TaskCancelledError

        parent = self.call_parents.get(call_id)
        for child in list(parent.children or ()) if parent is not None else ():
            if child.state != T_DONE:
                self.cancel(child, False, True, TaskCancelledError)

    def finished(self, task: Task, results: list, retryable: bool) -> None:
        """A worker returned ``task``'s results: complete it, or queue it again when it
        raised and ``retry_exceptions`` and ``max_retries`` allow."""
        if not retryable:  # the common case, decided without the rule: nothing to retry
            if task.state != T_DONE:
                self.complete(task, results)
            return
        before = task.retries_left
        retry, task.retries_left = scheduling.retry_failed_result(
            retryable, before, task.cancelled, task.state == T_DONE)
        if retry:
            logger.warning("%s", retry_line(task.spec.name, before,
                                            "User exception:\n" + error_text(results)))
            self.requeue(task)
        elif task.state != T_DONE:
            self.complete(task, results)

    def worker_died(self, inflight: list, pid, detail: str, death: str | None,
                    fatal: str | None, oom: str | None = None) -> tuple[int, int]:
        """The worker running ``inflight`` (its running task first) is gone: ``detail`` says
        how, ``death`` names the helper it died with (None: it died alone), ``fatal`` why
        the session cannot go on, ``oom`` why the memory monitor killed it. Each task is
        retried, queued again or failed (``scheduling.after_worker_death``; the running one
        after a kill for memory: ``memory_policy``). Returns (tasks requeued, tasks
        failed)."""
        from miniray.exceptions import (
            OutOfMemoryError,
            RaySystemError,
            TaskCancelledError,
            WorkerCrashedError,
        )

        requeue = []
        failed = 0
        position = 0  # among tasks not done: a cancelled queued one was skipped, not run
        for task in inflight:
            if task.state == T_DONE:
                continue
            if oom is not None and position == 0 and not task.cancelled and not fatal:
                position += 1
                if task.retries_left == 0:
                    self.fail(task, OutOfMemoryError(oom))
                    failed += 1
                    continue
                # Retried without end, max_retries untouched, each time after a longer wait.
                task.oom_kills += 1
                logger.warning("%s", memory_policy.oom_retry_line(task.spec.name, oom))
                if self._requeue_later is None:
                    requeue.append(task)
                else:
                    task.state, task.worker = T_QUEUED, None  # in no queue until then
                    self._requeue_later(task, memory_policy.retry_delay_s(task.oom_kills))
                continue
            before = task.retries_left
            decision, task.retries_left = scheduling.after_worker_death(
                position, task.cancelled, before, bool(fatal))
            position += 1
            if decision == scheduling.DEATH_FAIL_SYSTEM:  # the session cannot go on
                self.fail(task, RaySystemError(fatal))
                failed += 1
            elif decision == scheduling.DEATH_FAIL_CANCELLED:
                self.fail(task, TaskCancelledError(ids.TaskID(task.spec.task_id)))
            elif decision == scheduling.DEATH_RETRY:
                # With the fork server, every worker died: one line says it all.
                log = logger.warning if death is None else logger.debug
                log("%s", retry_line(task.spec.name, before, f"the worker (pid={pid}) "
                                                     f"running it died or was killed: {detail}."))
                requeue.append(task)
            elif decision == scheduling.DEATH_FAIL_CRASHED:
                hint = ("Check the task for sys.exit, os._exit, segfaults or running out of "
                        "memory; " if death is None else "")
                self.fail(task, WorkerCrashedError(
                    f"Task {task.spec.name}: worker pid={pid} {detail}. {hint}"
                    "max_retries controls retries."))
                failed += 1
            else:  # DEATH_REQUEUE: sent behind the running task, never started
                requeue.append(task)
        for task in reversed(requeue):
            self.requeue(task)
        return len(requeue), failed

    def unfinished(self) -> list:
        """Every task not done yet (waiting, queued, infeasible or running)."""
        return [task for task in self.by_id.values() if task.state != T_DONE]

    def drop_queues(self) -> None:
        """Forget the queued and infeasible tasks (the session was lost: each has failed
        already)."""
        self.queues.clear()
        self.infeasible.clear()

    def fail(self, task: Task, error: BaseException) -> None:
        data = serialization.dumps(error)
        self.complete(task, [(protocol.ERR, data)] * max(1, len(task.spec.return_ids)))

    def complete(self, task: Task, results: list) -> None:
        task.state = T_DONE
        spec = task.spec
        if self.records is not None:
            self.records.task_done(task, results)
        self.by_id.pop(spec.task_id, None)
        objects = self.objects
        for object_id, (kind, data) in zip(spec.return_ids, results):
            objects.set_ready(object_id, kind, data)
        if spec.deps:
            if task.pinned:
                self._unpin_deps(spec.deps)
                task.pinned = False
            objects.release([object_id for _position, object_id in spec.deps])
        if spec.contained:
            objects.release(spec.contained)
        parent = task.parent
        if parent is not None and parent.children:
            try:
                parent.children.remove(task)
            except ValueError:
                pass

    def statistics(self) -> dict:
        return {
            "tasks_pending": len(self.by_id),
            "queued": sum(len(q) for q in self.queues.values()),
            "infeasible": sum(len(v) for v in self.infeasible.values()),
            "handed_back": self.handed_back,
        }

    def clear(self) -> None:
        self.by_id.clear()
        self.queues.clear()

    def __repr__(self) -> str:
        return f"<TaskQueue tasks={len(self.by_id)} queued keys={len(self.queues)}>"


def _reads_there(spec, node_id: str) -> bool:
    """Whether a task reads an argument kept on node ``node_id`` there (issue 16): a hard
    node affinity to that node (and no placement group), so it never runs anywhere else
    (``remote_nodes`` fails it unschedulable when that node is gone); any other task waits
    for the argument to be pulled here first."""
    affinity = spec.affinity
    if spec.placement is not None or affinity is None or isinstance(affinity, str) and \
            affinity == "SPREAD":
        return False
    if isinstance(affinity, str):
        return affinity == node_id
    return not affinity[1] and affinity[0] == node_id


def _places_first(spec) -> bool:
    """Whether a task is placed before its arguments kept on other nodes come here (issue
    16: ``node_pick`` weighs where their bytes are): one without an affinity, placement
    group or refs nested in its arguments, not a generator (what spill-over may move),
    one with a node affinity (it reads them where it must run, or they are pulled), and
    one in a placement group (a bundle on another node reads or fetches them there)."""
    if spec.placement is not None:
        return True
    return spec.affinity is not None or (not spec.contained and spec.num_returns >= 0)
