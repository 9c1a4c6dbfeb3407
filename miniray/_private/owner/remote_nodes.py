"""Tasks on other hosts: which tasks run on another node, running them there, retries.

``RemoteNodes`` is one object in two modules: step 1 below (the view, ``offload``,
``spill``, ``locate``, ``watch``) is ``remote_offload.RemoteOffload``, a mixin of it; steps
2-7 are here.

Owns: the decision which task goes to another node (``task_nodes.placement_for``, pure, on
``node_pick``'s rules), the owner's links to other nodes (one ``RemoteNodeClient`` per node,
opened at first use with the cluster token), the workers it runs there (spawned through
tickets and attach connections, kept idle per node between tasks), taking such a task from
the owner's queue (``offload``), running it there (lease, spawn, HELLO/FUNC/TASK/RESULT
over the worker's MAC'd data connection, release), retrying it when that node dies, and
completing it in the owner's task table; the workers' output, printed as local workers' is.
Does not own: the placement rule itself (``core/node_pick.py``), the view
(``<session>/cluster.json``, written by the node), the link's protocol
(``transport/remote_node.py``), the node's side (``node/remote_drivers.py``), or anything of
local tasks.
Called by: ``TaskQueue`` (``locate``, locked: a task given results kept on other nodes,
placed before they are pulled; ``offload``, locked: a task with a node affinity or
``"SPREAD"``, or one the local node can never hold; submitted as any task, its arguments
ready), ``Owner._dispatch`` (``spill``, locked: a queue the local ledger has no room for
now), ``Owner._kill_for_cancel`` (``RemoteTaskSlot.remote_kill``, deferred), ``Owner.shutdown``
(``close``, not locked), and ``remote_actors.RemoteActors`` for actors on other nodes:
the view (``view``, ``last_view``, ``closed``),
``watch`` (locked: its pending actors no node can hold yet), and in its thread per actor,
not locked, the seam it shares with remote_bundles: ``client``, ``lease`` and ``release``
(the actor's lease, ``remote_worker.Move``/``Failed`` as for a task) and ``adopt_results``
(large results); the object table
(``RemoteCopy``'s hooks, locked: a pull or a free handed to a thread after the lock); and
``remote_bundles.RemoteBundles`` (``bundles``) for placement groups' bundles on other
nodes: ``run_in_bundle`` (locked) runs a task under its bundle's lease (step 2 takes no
lease, step 4 releases none, step 5 puts it back in its group's queue
(``RemoteBundles.requeue``, per ``max_retries``) until the bundle is placed again).

Steps for one task of owner D placed on node N (N's half: ``remote_drivers.py``)::

    1. Placement, under the owner's lock (``placement_for``, Ray's rules): a hard
       ``NodeAffinitySchedulingStrategy`` runs on that node when the view holds it alive
       with the totals (this node: locally), else the task fails with
       TaskUnschedulableError naming it (a node the view lacks is looked up once more in a
       fresh view first); a soft one runs there too when it is alive with the totals (its
       lease waits for room; with ``_spill_on_unavailable`` only when it has room now),
       else as without one. ``"SPREAD"``: the least used node with room now, rotating
       (this node: its local queue), as of the view less this driver's own tasks
       (``_own_view``: those on other nodes, and its SPREAD tasks here). Without:
       locally whenever the local node can ever hold the request, except spill-over
       (``spill``): the local ledger has no room for it now and another node has room
       now, as of its heartbeat and at most its totals less this driver's tasks there,
       and its arguments here are not over ``node_pick.MOVE_MAX_ARG_BYTES``: it leaves
       the local queue for that node; a task it can never hold
       (``TaskQueue`` offers it before holding it infeasible) goes to another alive node
       with room now, else to one with the totals (its lease waits there), else stays
       pending as before (looked at again every INFEASIBLE_WATCH_S while the view has
       nodes: one may join). A task is offered once ``TaskQueue.submit`` registered it
       (its return objects exist, its argument objects are held, its parent knows it) and
       its arguments are ready: a missing or failed one failed it there, as any task.
    2. A thread per task, not locked: its argument objects (ObjectRefs, large arguments)
       (``_dep_values``); N's client; ("lease", request) until granted (a
       denial waits, 20 ms doubling to 0.5 s, and asks again, unless ``move_to`` names
       another node with room now where step 1 would place it: then that node's); an
       idle worker of N, or ("spawn") and the four attach connections; HELLO (a new
       worker), FUNC (once per function and worker), TASK, all MAC'd, on the worker's
       data connection; a large argument's bytes follow TASK, sent from its segment's
       read-only mapping in frames of at most ``framing.PEER_CHUNK`` (the worker reads them into one
       buffer: ``worker_api.Channel._receive_bulk``).
    3. The worker answers READY (a new one) and RESULT; each large value in it,
       ``("peer", size, index)``, has its bytes follow RESULT in frames
       (``framing.send_in_frames``), received straight into a segment of the driver's
       store (``adopt_results``: a freed one of its pool when one fits, else a new one),
       which the owner adopts as a local worker's. Before
       RESULT, what the task asks of its driver (BORROW, SUBMIT, ACTOR_SUBMIT, PUT, GET,
       WAIT, CALL) and a streaming generator's values (YIELD) are served in this thread
       (``remote_requests.py``, its own steps); anything else fails the task with an
       error saying so, and the worker is closed.
    4. ("release", lease_id); the worker is kept idle for N's next task (at most
       IDLE_PER_NODE; others are closed: a worker exits on its data connection's EOF).
    5. N lost (its link's EOF, "fenced", the data connection's EOF while the link does
       not answer a ping, N unreachable): the task is placed again by step 1's rules, N
       excluded: for free if the task was not sent to N yet (at most FREE_MOVES times),
       else while ``max_retries`` allows (each such retry uses one; the node's death is a
       system failure, whatever ``retry_exceptions`` says; a hard affinity to N then
       fails unschedulable, as in Ray); with none left it fails with NodeDiedError naming
       N's IP and id (``node_died_error``). A worker that died alone: WorkerCrashedError.
       No hang: every wait on N has a deadline, or ends with its connection. A partition
       (N's sockets stay open): while its task runs, the worker's silence makes this thread
       look N up in the view every WATCH_S; dead there, or a new incarnation, is N lost too
       (the head declares it after ``MINIRAY_NODE_DEAD_AFTER_S``). An idle worker whose
       data connection turned readable (its EOF) is closed rather than used.
    6. Cancel: the task's ``worker`` in the owner's table is a ``RemoteTaskSlot``; the owner's
       CANCEL goes to the remote worker's MAC'd control connection, or, before the task
       was sent, keeps it from being sent (TaskCancelledError). ``force=True`` asks N over
       the driver link to SIGKILL that worker (``("kill", pid)``, N's step 10); its death
       then fails the task with TaskCancelledError, never retried.
    7. Results kept on N (docs/remote-objects.md; off with MINIRAY_KEEP_REMOTE_RESULTS=0):
       the link asks N ("keeps") for its tag once; HELLO hands it to N's workers
       (``store["keep_tag"]``, ``keep_max``); a result they keep comes in RESULT as
       ``("kept", path, size)``, which N books (("keep", ...), ``remote_objects``) and the
       owner gets as ``("remote", RemoteCopy)``: its entry stays PENDING until a waiter
       (get, wait, a task given it) starts the one pull (``remote_objects.py``, a thread, never
       locked: a ``pull`` connection of the link, idle ones kept, straight into a
       segment of the store as in step 3), which makes it READY. The link lost, the view
       holding N dead, or N keeping no such object: ObjectLostError, waiters woken; no
       room in the store: ObjectStoreFullError, and the next reader pulls again. The
       owner freeing it queues ("free", ...) for the link, sent in batches off the lock
       (``KeptResults._send_frees``); a lost link's go unsent (N swept them). A task with a hard
       affinity to N given such a ref does not wait for it (``tasks._reads_there``):
       ``_dep_values`` sends ``("shm", path on N, size)``, read there, never pulled. Any
       other task given one is placed before it is pulled (``locate``, from
       ``TaskQueue._kept_first``: ``node_pick`` weighs the kept bytes per node,
       ``_arg_bytes``; an affinity's own rule): on N it reads N's copy as above; on
       another member M, M's node fetches it from N with this driver's grant
       (``KeptResults.fetch``, the node's step 12) and the worker reads M's copy
       (``MINIRAY_FETCH_BETWEEN_NODES=0``: through this driver instead); M failing to
       (N gone): pulled here, ObjectLostError as the task's argument error; placed
       here: pulled, as before.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time

from miniray._private.core import config, protocol
from miniray._private.core.resources import infeasible_reasons
from miniray._private.core.task_nodes import (
    SPREAD,
    Unschedulable,
    move_to,
    placement_for,
)
from miniray._private.host import auth_token
from miniray._private.object_store import shm_segments
from miniray._private.owner.object_table import PENDING
from miniray._private.owner.remote_objects import KeepRefused, KeptResults
from miniray._private.owner.remote_offload import RemoteOffload
from miniray._private.owner.remote_requests import RemoteRequests
from miniray._private.owner.remote_worker import (
    BULK_FRAME_S,
    Failed,
    Move,
    RemoteTaskSlot,
    RemoteWorker,
    cancelled_failure,
    dependency_failure,
    node_died_error,
    receive_frames,
    receive_segment,
    system_error,
)
from miniray._private.owner.tasks import T_DONE, T_RUNNING
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport.framing import send_in_frames
from miniray._private.transport.remote_node import (
    RemoteDenial,
    RemoteLeaseError,
    RemoteNodeClient,
)

__all__ = ["SPREAD", "RemoteNodes", "Unschedulable", "move_to", "node_died_error",
           "placement_for"]

logger = logging.getLogger(__name__)

IDLE_PER_NODE = 4
REMOTE_LINGER_S = 0.05  # an idle worker's lease on N is kept at least this long for reuse
THREAD_IDLE_S = 5.0  # a task thread waits this long for the next task before it ends
WATCH_S = 0.5  # a silent running task's node is looked up in the view this often
FREE_MOVES = 3  # a task never sent to a node that died is placed again this often for free
UNSUPPORTED = "objects across hosts are not supported yet"


def keep_results() -> bool:
    """Whether tasks' large results stay on their node until needed (step 7; default on).
    ``MINIRAY_KEEP_REMOTE_RESULTS=0``: they cross at once, as before (for comparison)."""
    return os.environ.get("MINIRAY_KEEP_REMOTE_RESULTS", "1") != "0"


def fetch_between_nodes() -> bool:
    """Whether a task's argument kept on another node than its own is fetched by its
    node straight from there (step 7; default on). ``MINIRAY_FETCH_BETWEEN_NODES=0``: it
    comes through this driver, as before (for comparison)."""
    return os.environ.get("MINIRAY_FETCH_BETWEEN_NODES", "1") != "0"


class RemoteNodes(RemoteOffload):
    """The owner's tasks on other nodes (see the module docstring)."""

    def __init__(self, owner):
        self.owner = owner
        info = owner.hello_info
        self.session_dir = info.get("session_dir") or ""
        self.local = info.get("node_id") or ""
        self.source_ip = info.get("node_ip") or "127.0.0.1"
        self._lock = threading.Lock()  # the fields below; never held while waiting on N
        self._clients: dict[str, RemoteNodeClient] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._idle: dict[str, list[RemoteWorker]] = {}
        self._busy: set = set()
        self._threads: set = set()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # for threads waiting
        self._waiting_threads = 0
        self._reaping = False  # a _reap thread runs
        self.linger = max(config.lease_linger_s(), REMOTE_LINGER_S)
        self._view: tuple[float, list] = (0.0, [])
        self._closed = False
        self._watching = False  # a _watch_infeasible thread runs
        # Other placers' "place again" calls for that thread (``watch``): remote_actors'.
        self._rechecks: list = []
        self._turn = 0  # SPREAD's rotation (node_pick rule 4)
        # Per other node, the summed requests of this driver's tasks there, from
        # placement to their end (``node_pick.less_claims``: the view's ``available`` lags
        # them); its SPREAD tasks placed here by task id, until they end, and their
        # summed requests; and what both were when the view was last read
        # (``_own_claims``, ``_own_view``).
        self._claims: dict[str, dict[str, float]] = {}
        self._spread_here: dict = {}
        self._spread_use: dict[str, float] = {}
        self._claims_seen: dict[str, dict[str, float]] = {}
        self.ran = 0
        from miniray._private.owner.remote_bundles import RemoteBundles  # lazy: a cycle

        self.bundles = RemoteBundles(owner, self)  # placement groups' remote bundles
        self.kept_results = KeptResults(  # step 7: results kept on their node
            self, receive_segment, receive_frames, BULK_FRAME_S)

    def __repr__(self) -> str:
        return f"<RemoteNodes clients={len(self._clients)} ran={self.ran}>"

    def _begin(self, task, placed, moves: int = 0) -> None:
        """*Owner locked.* A registered task goes to node ``placed`` (or fails)."""
        owner = self.owner
        spec = task.spec
        if isinstance(placed, Unschedulable):
            from miniray.exceptions import TaskUnschedulableError  # lazy: as below

            owner.tasks.fail(task, TaskUnschedulableError(str(placed)))
            return
        entry = next((e for e in self._view[1] if e.node_id == placed), None)
        if entry is None:  # the view was replaced meanwhile, without it (a new head)
            from miniray.exceptions import TaskUnschedulableError  # lazy: as below

            owner.tasks.fail(task, TaskUnschedulableError(
                f"the node {placed} chosen for task {spec.name} left the cluster's view"))
            return
        task.state = T_RUNNING
        task.worker = RemoteTaskSlot(task, moves)  # what the owner's cancel and state rows read
        self._start(task, entry)

    def run_in_bundle(self, task, bundle, gpu_ids: list | None = None) -> None:
        """*Owner locked.* Run ``task`` on ``bundle``'s node under the bundle's lease
        (``remote_bundles`` took its room in the bundle, and ``gpu_ids``: its share of
        the bundle's devices): steps 2-4 with no lease taken or released."""
        task.state = T_RUNNING
        task.worker = RemoteTaskSlot(task)
        task.worker.bundle = bundle
        task.worker.gpu_ids = list(gpu_ids or [])
        self._start(task, bundle.entry)

    def _retry(self, task, entry) -> bool:
        """*Owner locked.* Step 5's retry: ``task`` failed because node ``entry`` died;
        True if it was placed again (or failed unschedulable): by step 1's rules, that
        node excluded. A task that was never sent there moves for free (at most
        FREE_MOVES times: as in Ray, only a task that ran uses a retry); one that was
        uses one of ``max_retries`` (Ray's rule: a node's death is a system failure,
        whatever ``retry_exceptions`` says)."""
        slot = task.worker
        if task.cancelled or self._closed or self.owner.closed:
            return False
        spec = task.spec
        bundle = getattr(slot, "bundle", None)
        if bundle is not None:  # its bundle died with N: it waits for the bundle's new node
            if task.retries_left == 0 and getattr(slot, "sent", True):
                return False
            if getattr(slot, "sent", True) and task.retries_left > 0:
                task.retries_left -= 1
            logger.warning("Task %s failed because node %s (%s), which held bundle %d of "
                           "placement group %s, died; retrying it once the bundle is placed "
                           "again.", spec.name, entry.node_id[:12], entry.ip, bundle.index,
                           bundle.pg_hex)
            self.bundles.requeue(task, bundle)
            self.owner.note_placement_use()  # the group's watch places the bundle again
            return True
        moves = getattr(slot, "moves", 0)
        if not getattr(slot, "sent", True) and moves < FREE_MOVES:
            moves += 1
            logger.info("Task %s had not started on node %s (%s), which died; placing it "
                        "again.", spec.name, entry.node_id[:12], entry.ip)
        elif task.retries_left == 0:
            return False
        else:
            if task.retries_left > 0:
                task.retries_left -= 1
            logger.warning("Task %s failed because node %s (%s) died; retrying it (%s "
                           "retries left).", spec.name, entry.node_id[:12], entry.ip,
                           "infinite" if task.retries_left < 0 else task.retries_left)
        local_feasible = not infeasible_reasons(self.owner.tasks.node_state, spec.request)
        placed = self._place(task, local_feasible, exclude=entry.node_id)[0]
        if placed is None:
            task.worker = None
            self.owner.tasks.resubmit(task)
        else:
            self._begin(task, placed, moves)
        return True

    def _start(self, task, entry) -> None:
        """Run ``_run(task, entry)`` on a waiting thread of this module, or a new one."""
        if task.worker.bundle is None:  # a bundle's task: its lease holds N's room
            self._claim(task.worker, entry.node_id, task.spec.request)
        with self._lock:
            if self._waiting_threads:
                self._waiting_threads -= 1
                self._jobs.put((task, entry))
                return
            thread = threading.Thread(target=self._thread_main, args=((task, entry),),
                                      daemon=True, name="miniray-remote-task")
            self._threads.add(thread)
        thread.start()

    def _thread_main(self, job) -> None:
        """A task thread: runs its job, then waits up to THREAD_IDLE_S for the next."""
        try:
            while job is not None:
                self._run(*job)
                with self._lock:
                    if self._closed:
                        return
                    self._waiting_threads += 1
                try:
                    job = self._jobs.get(timeout=THREAD_IDLE_S)
                except queue.Empty:
                    with self._lock:
                        if self._waiting_threads and self._jobs.empty():
                            self._waiting_threads -= 1
                            return
                    job = self._jobs.get()  # a job was promised to this thread
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    # -- steps 2-5 -------------------------------------------------------------------------
    def client(self, entry) -> RemoteNodeClient:
        with self._lock:
            client = self._clients.get(entry.node_id)
            if client is not None and client.lost is None:
                return client
            opening = self._opening.setdefault(entry.node_id, threading.Lock())
        with opening:  # one connect per node at a time
            with self._lock:
                client = self._clients.get(entry.node_id)
                if client is not None and client.lost is None:
                    return client
            client = RemoteNodeClient((entry.ip, entry.port), auth_token.load_token(),
                                      source_address=(self.source_ip, 0),
                                      ssl_context=_tls_client())
            try:  # step 7: large results stay there (the link's tag and the room)
                client.kept = client.keeps() if keep_results() else None
            except BaseException:
                client.close()
                raise
            with self._lock:
                if self._closed:
                    client.close()
                    raise system_error("the driver is shutting down")
                old = self._clients.get(entry.node_id)
                self._clients[entry.node_id] = client
            if old is not None:  # lost: what the kept results held for it goes too
                self.kept_results.forget_link(old)
            return client

    def _run(self, task, entry) -> None:
        from miniray.exceptions import NodeDiedError, RaySystemError  # lazy: as above

        spec = task.spec
        results = None
        error = None  # the task's failure (``TaskQueue.fail``), when it has no results
        client = worker = None
        died = False  # step 5: the node died under the task (retried while allowed)
        moved = None  # step 2: denied there, another node has room now
        bundle = task.worker.bundle  # a placement group's bundle on N, or None
        try:
            client = self.client(entry)
            dep_values = self._dep_values(task, entry.node_id, client, entry) \
                if spec.deps else None
            worker = self._leased_worker(client, entry, spec, task.worker)
            results = self._call(worker, client, spec, task.worker, dep_values)
            self.ran += 1
        except Move as move:
            moved = move.entry
        except NodeDiedError as lost:
            died = True
            error = node_died_error(spec.name, entry, str(lost))
        except pc.PeerAuthError as refused:  # a wrong token: said at once, never retried
            from miniray.exceptions import AuthenticationError  # lazy: as above

            error = AuthenticationError(
                f"Task {spec.name} cannot run on node {entry.ip}:{entry.port}: {refused}")
        except RemoteLeaseError as denied:
            error = system_error(str(denied))
        except Failed as failed:
            error = failed.error
        except (OSError, TimeoutError, pc.PeerRefused) as unreachable:
            died = True
            error = node_died_error(spec.name, entry, f"it could not be reached: {unreachable}")
        except BaseException as bug:  # noqa: BLE001 - the task's caller gets it
            logger.exception("a task on node %s failed", entry.ip)
            error = RaySystemError(f"miniray bug: {bug!r}")
        finally:
            self._claim(task.worker, None, spec.request)
            if worker is not None:
                self._put_back(client, worker, not worker.broken)
            owner = self.owner
            if moved is not None and not self._closed:
                self._start(task, moved)  # the same task and slot, asking another node
            else:
                with owner.locked():
                    if task.state != T_DONE and not owner.closed and not (
                            died and self._retry(task, entry)):
                        if results is not None:
                            owner.tasks.finished(task, results, False)
                            results = None  # the owner's now
                        else:
                            owner.tasks.fail(task, error or system_error(
                                "the driver is shutting down"))
                    if bundle is not None:
                        self.bundles.done(task, bundle)
                    elif task.spec.placement is not None:  # run on the head (step 8)
                        self.bundles.ended_on_head(task)
                    if not died and not self._closed and not owner.closed:
                        self._spill_more(task.key)
                if results is not None:  # not completed here (done already, shut down):
                    self.kept_results.drop_results(results)  # its segments and copies: nobody's

    def _leased_worker(self, client: RemoteNodeClient, entry, spec, slot) -> RemoteWorker:
        """Step 2: an idle worker of N that still holds a lease of this request (no round
        trip), else a new lease and an idle worker without one, else a new worker."""
        if slot.bundle is not None:  # under its bundle's lease, held on that link
            if slot.bundle.client.lost is not None or slot.bundle.client is not client:
                from miniray.exceptions import NodeDiedError  # lazy: as above

                raise NodeDiedError(f"the link that held bundle {slot.bundle.index} of "
                                    f"placement group {slot.bundle.pg_hex} was lost")
            worker = self._worker(client, entry, spec.runtime_env)
            worker.gpu_ids = list(slot.gpu_ids)  # its share of the bundle's devices
            return worker
        shape = tuple(sorted(spec.request.items()))
        worker = self._take_idle(entry.node_id, lambda w: (
            w.lease_id is not None and w.shape == shape and w.client is client
            and w.env == spec.runtime_env))
        if worker is not None:
            return worker
        grant = self.lease(client, spec, slot, entry.node_id)
        lease_id = grant.lease_id
        try:
            worker = self._worker(client, entry, spec.runtime_env)
        except BaseException:
            self.release(client, lease_id)
            raise
        worker.lease_id, worker.shape = lease_id, shape
        worker.gpu_ids = [str(g) for g in grant.gpu_ids]
        return worker

    def release(self, client: RemoteNodeClient, lease_id: str) -> None:
        from miniray.exceptions import NodeDiedError  # lazy: as above

        if client.lost is None:
            try:
                client.release(lease_id)
            except (RemoteLeaseError, NodeDiedError, OSError, TimeoutError):
                pass

    def lease(self, client: RemoteNodeClient, spec, slot, current: str):
        wait = 0.02
        local_feasible = None
        while True:
            if self._closed:
                raise Failed(system_error("the driver is shutting down"))
            if slot.cancelled:  # cancelled while N was full
                raise cancelled_failure(spec)
            answer = client.lease(spec.request, tag=spec.name)
            if not isinstance(answer, RemoteDenial):
                return answer
            if local_feasible is None:
                local_feasible = not infeasible_reasons(self.owner.tasks.node_state,
                                                        spec.request)
            nodes = self.view()
            there = move_to(spec.affinity, spec.request, self.local, nodes, current,
                            local_feasible)
            if there is not None:  # another node has room now: ask it instead
                raise Move(next(e for e in nodes if e.node_id == there))
            time.sleep(wait)
            wait = min(0.5, wait * 2)

    def _take_idle(self, node_id: str, fits) -> RemoteWorker | None:
        """An idle worker of the node that ``fits``; one whose data connection has
        something to read while idle (its EOF: it died, or the node killed it) is closed
        instead (its lease, if any, went with its link or is released)."""
        with self._lock:
            idle = self._idle.get(node_id) or []
            for index in range(len(idle) - 1, -1, -1):
                if fits(idle[index]):
                    worker = idle.pop(index)
                    break
            else:
                return None
        if not worker.stale():
            return worker
        if worker.lease_id is not None and worker.client is not None:
            self.release(worker.client, worker.lease_id)
        worker.close()
        return self._take_idle(node_id, fits)

    def _worker(self, client: RemoteNodeClient, entry, env: str) -> RemoteWorker:
        worker = self._take_idle(entry.node_id,
                                 lambda w: w.lease_id is None and w.env == env)
        if worker is not None:
            return worker
        pid, channels = client.spawn()
        worker = RemoteWorker(pid, channels, entry.node_id, entry.ip, self.owner.log_to_driver,
                         self.owner.prefix_enabled)
        worker.incarnation = entry.incarnation
        worker.env = env
        return worker

    def _dep_values(self, task, node_id: str = "", client=None, entry=None) -> list:
        """Step 2's first part: the task's argument objects (ready, none an error: the
        owner's queue offered it so), as ``[(position, kind, payload)]`` for TASK, a large
        one as ``("peer", size, mapping)``: its segment mapped read-only, whose bytes
        ``_call`` sends after TASK in frames of at most ``framing.PEER_CHUNK`` (the worker receives
        them into one buffer)."""
        spec = task.spec
        there = {}  # step 7: kept on N, where the task runs: the worker reads N's segment
        elsewhere = {}  # kept on another node: N fetches it from there (step 7)
        with self.owner.locked():
            for _position, object_id in spec.deps:
                kept = self.owner.objects.get(object_id)
                if kept is None or kept.state != PENDING or kept.remote is None:
                    continue
                copy = kept.remote
                if copy.node_id == node_id and copy.path:
                    there[object_id] = (kept.kind, ("shm", copy.path, copy.size))
                    continue
                if client is not None and node_id != self.local and fetch_between_nodes():
                    elsewhere[object_id] = (kept.kind, copy)
        for object_id, (kind, copy) in elsewhere.items():
            try:
                path = self.kept_results.fetch(object_id, copy, client, entry)
            except (LookupError, RemoteLeaseError) as failed:  # pulled through here instead
                logger.info("node %s could not fetch object %s from node %s (%s); it "
                            "comes through this driver", client.name, object_id.hex()[:16],
                            copy.node_id[:12], failed)
                continue
            there[object_id] = (kind, ("shm", path, copy.size))
        ids_ = [object_id for _position, object_id in spec.deps if object_id not in there]
        for _attempt in range(3):  # a segment spilled while being mapped: ask again
            items = None
            while items is None:
                if self._closed:
                    raise Failed(system_error("the driver is shutting down"))
                if task.worker.cancelled:
                    raise cancelled_failure(spec)
                items = self.owner.get_serialized(ids_, WATCH_S) if ids_ else []
            if len(items) < len(ids_):  # an argument's error: the first one, as for any task
                items = items + items[-1:] * (len(ids_) - len(items))
            items = iter(items)
            out = []
            try:
                for position, object_id in spec.deps:
                    if object_id in there:
                        out.append((position, *there[object_id]))
                        continue
                    kind, data = next(items)
                    if kind == protocol.ERR:  # a kept one's pull failed (its node lost)
                        raise Failed(dependency_failure(data, spec.name))
                    if not isinstance(data, (bytes, bytearray)):
                        path = shm_segments.resolve_path(data[1], self.owner.store.shm_dir)
                        mapping = shm_segments.map_readonly(path)
                        data = ("peer", len(mapping), mapping)  # sent after TASK (_call)
                    out.append((position, kind, data))
            except FileNotFoundError:
                continue
            return out
        raise Failed(system_error(f"Task {spec.name}: an argument's segment kept moving "
                                    "while it was read for another node; try again."))

    def adopt_results(self, data, spec, items: list, recycle: bool = False) -> list:
        """Step 3's large results: each ``("peer", size, index)`` value's bytes follow
        RESULT on the data connection in frames of at most ``framing.PEER_CHUNK`` bytes; they are
        received straight into a segment of this driver's store (no other copy), named as a
        local worker's result would be, and handed to the owner as such
        (``put_segment_from`` adopts it). With ``recycle`` (a task's results, which this
        store adopts: an actor's may be renamed into another store instead), a freed segment
        of the pool when one fits (``recycled_for``: its pages exist, and are mapped here
        already), else a new one. A frame late by BULK_FRAME_S: the node is lost."""
        owner = self.owner
        store = owner.store
        if recycle and owner.objects.ref_events:  # objects just dropped: freed first, as a
            with owner.locked():       # put does, so that their segments take these bytes
                owner.objects.apply_ref_events()
            owner.reactor.wake()
        out = []
        try:
            for index, item in enumerate(items):
                payload = item[1]
                if isinstance(payload, tuple) and payload and payload[0] == "peer":
                    object_id = spec.return_ids[index]
                    recycled = store.recycled_for(object_id, payload[1]) if recycle else None
                    path = recycled[0] if recycled else os.path.join(
                        store.shm_dir, shm_segments.segment_name(store.session_tag, object_id))
                    out.append((item[0], ("shm", path, payload[1])) + tuple(item[2:]))
                    try:
                        if recycled:
                            receive_frames(data, recycled[1], payload[1])
                        else:
                            receive_segment(data, path, payload[1])
                    except OSError as error:
                        if error.errno not in (errno.ENOSPC, errno.ENOMEM):
                            raise
                        data.close()  # its frames are left unread: the worker goes
                        raise Failed(shm_segments.no_room_error(
                            store.shm_dir, payload[1], spec.return_ids[index])) from None
                else:
                    out.append(item)
        except BaseException:
            for item in out:  # the segments written so far: nobody adopted them
                if isinstance(item[1], tuple):
                    store.give_up_recycled(item[1][1])
            raise
        return out

    def _call(self, worker: RemoteWorker, client: RemoteNodeClient, spec, slot,
              dep_values=None) -> list:
        owner = self.owner
        data = worker.data
        if not slot.bind(worker, client):  # cancelled before it was sent: it never runs
            raise cancelled_failure(spec)
        asks = RemoteRequests(owner, slot.inflight[0], data, lambda: self._check_alive(
            worker, client, spec), receive_segment)  # step 3: what the task asks
        try:
            if not worker.said_hello:
                hello = owner.hello_info
                if worker.env:  # a task's own runtime_env, as adopt_worker says it
                    hello = {**hello, "runtime_env_key": worker.env}
                kept = client.kept
                if kept is not None:  # step 7: its large results stay on N
                    hello = {**hello, "store": {**hello["store"], "keep_tag": kept[0],
                                                "keep_max": kept[1]}}
                data.send((protocol.HELLO, hello))
                worker.said_hello = True
            if spec.fn_id not in worker.funcs:
                with owner.locked():
                    fn_bytes = owner.function_bytes(spec.fn_id)
                data.send((protocol.FUNC, spec.fn_id, fn_bytes))
                worker.funcs.add(spec.fn_id)
            ctx = ({k: float(v) for k, v in spec.request.items()}, worker.gpu_ids or None,
                   owner.gpu_ids_are_ints, spec.retry_exceptions, spec.function_name,
                   spec.placement if slot.bundle is not None else None)  # its group
            bulk = [d[2][2] for d in dep_values or ()
                    if type(d[2]) is tuple and d[2][0] == "peer"]
            if bulk:  # the mappings stay here; the worker reads their bytes after TASK
                dep_values = [(p, k, d[:2] if type(d) is tuple and d[0] == "peer" else d)
                              for p, k, d in dep_values]
            data.send((protocol.TASK, spec.task_id, spec.fn_id, spec.name, spec.args_blob,
                       dep_values, spec.return_ids, spec.num_returns, ctx))
            for mapping in bulk:  # straight from the segment's mapping: no copy here
                send_in_frames(data.send_bytes, mapping)
                mapping.close()
            del bulk
            while True:
                try:
                    message = data.recv(timeout=WATCH_S)
                except TimeoutError:
                    self._check_alive(worker, client, spec)
                    continue
                tag = message[0]
                if tag == protocol.RESULT and message[1] == spec.task_id:
                    results = message[2]
                    asks.contain(message[4])
                    if any(not isinstance(item[1], (bytes, bytearray)) for item in results):
                        if any(not (isinstance(item[1], tuple) and item[1][0] in (
                                "peer", "kept")) for item in results
                               if not isinstance(item[1], (bytes, bytearray))):
                            worker.broken = True  # a segment on N: never read from here
                            raise Failed(system_error(
                                f"Task {spec.name} returned a value stored on node "
                                f"{client.name}: {UNSUPPORTED}."))
                        try:
                            results = self.adopt_results(data, spec, results,
                                                          recycle=True)
                        except Failed:
                            worker.broken = True
                            raise
                        try:
                            results = self.kept_results.keep_results(
                                client, worker.node, spec, results)
                        except KeepRefused as refused:
                            raise Failed(system_error(str(refused))) from None
                    return results
                if tag == protocol.READY or asks.serve(message):
                    continue
                worker.broken = True
                raise Failed(system_error(
                    f"Task {spec.name} on node {worker.node[:12]} asked its driver for "
                    f"something ({protocol.tag_name('data', tag)}) that a task on another "
                    "host cannot ask for yet; run it on the driver's node."))
        except (pc.PeerClosed, OSError) as error:
            worker.broken = True
            from miniray.exceptions import NodeDiedError, WorkerCrashedError  # lazy

            if slot.killed:  # cancel(force=True) killed it
                raise cancelled_failure(spec) from None

            try:
                client.ping(timeout=1.0)
            except (NodeDiedError, TimeoutError, OSError):
                raise NodeDiedError(
                    f"Task {spec.name} was running on node {worker.node[:12]} "
                    f"({client.name}), which died: {client.lost or error}") from None
            raise Failed(WorkerCrashedError(
                f"Task {spec.name}: the worker pid={worker.pid} on node {client.name} died "
                f"({error}).")) from None
        finally:
            asks.end()

    def _check_alive(self, worker: RemoteWorker, client: RemoteNodeClient, spec) -> None:
        """Step 5 while a task runs and its worker is silent: NodeDiedError when the view
        holds N dead or N rejoined as a new incarnation (a partition: its sockets stay
        open, so only the head's heartbeats tell)."""
        why = self.node_lost(worker, client)
        if why is None:
            return
        from miniray.exceptions import NodeDiedError  # lazy: as above

        worker.broken = True
        raise NodeDiedError(f"Task {spec.name} was running on node {worker.node[:12]} "
                            f"({client.name}), which died: {why}")

    def node_lost(self, worker, client: RemoteNodeClient) -> str | None:
        """Why the node of ``worker`` (a task's or an actor's, with its ``node`` and
        ``incarnation``) is lost, as the view says (held dead, or back as a new
        incarnation: a partition, whose sockets stay open), its ``client`` told so; None
        while the view holds it alive or has no entry to go by (the file being replaced:
        ask again later)."""
        entry = next((e for e in self.view() if e.node_id == worker.node), None)
        if entry is None or (entry.alive and entry.incarnation == worker.incarnation):
            return None
        why = (entry.death_message or "the cluster holds it dead") if not entry.alive else \
            "it rejoined as a new incarnation after the cluster held it dead"
        client.node_dead(why)
        return why

    def _put_back(self, client: RemoteNodeClient, worker: RemoteWorker, keep: bool) -> None:
        """Step 4: the worker goes idle with its lease, which ``_reap`` releases once it
        was idle for ``linger`` (the next task of the same request on N takes both at
        once); a broken worker, one of a lost node, or one too many is closed."""
        keep = keep and client.lost is None
        with self._lock:
            idle = self._idle.setdefault(worker.node, [])
            if keep and not self._closed and len(idle) < IDLE_PER_NODE:
                worker.idle_since = time.monotonic()
                worker.client = client
                idle.append(worker)
                if not self._reaping:
                    self._reaping = True
                    threading.Thread(target=self._reap, daemon=True,
                                     name="miniray-remote-linger").start()
                return
        if worker.lease_id is not None:
            self.release(client, worker.lease_id)
            worker.lease_id, worker.gpu_ids = None, []
        worker.close()

    def _reap(self) -> None:
        """Step 4's linger: leases of idle workers released after ``linger`` seconds
        (the workers stay idle, without a lease); ends when none is left to release."""
        while True:
            time.sleep(self.linger / 2)
            now = time.monotonic()
            due = []
            with self._lock:
                if self._closed:
                    self._reaping = False
                    return
                left = False
                for workers in self._idle.values():
                    for worker in workers:
                        if worker.lease_id is None:
                            continue
                        if now - worker.idle_since >= self.linger:
                            due.append((worker.client, worker.lease_id))
                            worker.lease_id, worker.gpu_ids = None, []
                        else:
                            left = True
                if not due and not left:
                    self._reaping = False
                    return
            for client, lease_id in due:
                self.release(client, lease_id)

    # -- shutdown ------------------------------------------------------------------------
    def close(self, timeout: float = 2.0) -> None:
        """*Not locked.* Close every link and worker (each worker exits on EOF, and N
        kills what is left when the link closes); running tasks end with their links."""
        with self._lock:
            self._closed = True
            clients = list(self._clients.values())
            self._clients.clear()
            idle = [w for workers in self._idle.values() for w in workers]
            self._idle.clear()
            threads = list(self._threads)
            for _ in range(self._waiting_threads):  # each waiting thread ends on one
                self._jobs.put(None)
            self._waiting_threads = 0
        for worker in idle:
            worker.close()
        self.kept_results.close()
        for client in clients:  # N frees what it keeps for each link (its tag's sweep)
            client.close()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for worker in idle:
            worker.join_output(max(0.0, deadline - time.monotonic()))


def _tls_client():
    contexts = ph.tls_contexts()
    return contexts[0] if contexts else None

