"""Step 1 of ``remote_nodes.py``'s docstring: which of this driver's queued tasks go to
another node, and which node.

Owns: the methods of ``RemoteNodes`` (a mixin of it: the state is its, made in
``RemoteNodes.__init__``) that read the cluster's view (``view``, ``last_view``: the
view file, re-read at most every VIEW_MAX_AGE_S), decide where a task goes
(``_place``: ``task_nodes.decide`` on the view; ``offload``: a task with an affinity,
SPREAD, or one this node can never hold; ``spill``: a queue the local ledger has no room
for now; ``locate``: a task given results kept on other nodes, placed before they are
pulled, by ``_arg_bytes``), count this driver's own tasks against a stale view (``_claim``
on other nodes, ``_spread_here`` for its SPREAD tasks here; ``_own_view`` applies both), and
place again whatever waits for a node that may join (``watch``: one thread for infeasible
tasks and the rechecks others register). Does not own: the rules
(``core/task_nodes.py``, ``core/node_pick.py``), running a task once placed (``_begin`` and
steps 2-5, ``remote_nodes.py``), or the view file (the node writes it).
Called by: ``TaskQueue`` (``offload``, ``locate``), ``Owner._dispatch`` (``spill``),
``remote_actors`` and ``remote_bundles`` (``view``, ``last_view``, ``closed``, ``watch``),
all under the owner's lock but ``view``.
"""

from __future__ import annotations

import logging
import threading
import time

from miniray._private.core import cluster_view, node_pick
from miniray._private.core.resources import infeasible_reasons
from miniray._private.core.task_nodes import (
    SPREAD,
    Unschedulable,
    decide,
    may_spill,
    placement_for,
    request_text,
)
from miniray._private.owner.object_table import PENDING
from miniray._private.owner.tasks import T_DONE
from miniray._private.transport import node_client as nc

logger = logging.getLogger(__name__)

VIEW_MAX_AGE_S = 0.5  # the view file is read again at most this often
INFEASIBLE_WATCH_S = 1.0  # infeasible tasks are placed again this often (a node may join)


class RemoteOffload:
    """``RemoteNodes``' step 1 (see the module docstring); every attribute is the
    ``RemoteNodes``'."""

    def view(self, fresh: bool = False) -> list:
        """The cluster's nodes (``NodeEntry``), as of ``cluster.json`` read at most
        VIEW_MAX_AGE_S ago (``fresh``: read now; a file read, so not under the owner's lock
        where it can be avoided)."""
        now = time.monotonic()
        read_at, nodes = self._view
        if fresh or now - read_at > VIEW_MAX_AGE_S:
            doc = nc.read_cluster(self.session_dir) if self.session_dir else None
            nodes = list(cluster_view.nodes_of(doc).values())
            with self._lock:
                for task_id, task in list(self._spread_here.items()):
                    if task.state == T_DONE:  # ended here since the last read
                        self._count_here(task_id, None)
                self._claims_seen = self._own_claims()
            self._view = (now, nodes)
        return nodes

    def alive_entry(self, node_id: str):
        """The ``NodeEntry`` of ``node_id`` in the view (``view``), if it is alive there;
        else None."""
        return next((e for e in self.view() if e.node_id == node_id and e.alive), None)

    def last_view(self) -> list:
        """The nodes as last read (never reads the file)."""
        return self._view[1]

    @property
    def closed(self) -> bool:
        """Whether ``close`` ran (the driver is ending): nothing new goes to other nodes."""
        return self._closed

    def _place(self, task, local_feasible: bool, exclude: str | None = None):
        """``decide`` (``placement_for`` and its ``Placement``) for ``task`` on the view;
        an affinity to a node the view lacks is looked up again in a fresh view first (it
        may have joined since the last read). ``SPREAD`` counts its turn here, is placed
        on ``_own_view``, and one placed here is counted there until it ends."""
        spec = task.spec
        spread = spec.affinity == SPREAD
        turn = 0
        if spread:
            turn = self._turn
            self._turn += 1
        view = self.view()
        placed = decide(spec.affinity, spec.request, self.local,
                         self._own_view(view) if spread else view,
                         local_feasible, exclude, turn=turn)
        if isinstance(placed[0], Unschedulable) and self._view[0] < time.monotonic() - 0.01:
            placed = decide(spec.affinity, spec.request, self.local,
                             self.view(fresh=True), local_feasible, exclude, turn=turn)
        if spread:
            with self._lock:  # elsewhere, its claim counts it there (or it is not placed)
                self._count_here(spec.task_id,
                                 task if placed[0] is None and local_feasible else None)
        return placed

    def _own_view(self, view: list) -> list:
        """``view`` brought up to date for this driver's own tasks (``node_pick.less_claims``,
        for spill-over, ``locate`` and SPREAD): on other nodes all of them (``_claims``),
        here its SPREAD tasks (``_spread_here``). A view read mid-burst shows the
        use of some and not of those placed since: on the view alone, the node idle by it
        took every SPREAD task after (1 and 7 over two nodes, not 4 and 4)."""
        with self._lock:
            return node_pick.less_claims(view, self._own_claims(), self._claims_seen)

    def _own_claims(self) -> dict:
        """*Locked* (``_lock``). ``_claims`` with this driver's SPREAD tasks here added
        under the local node (``_spread_use``)."""
        own = {node_id: dict(claim) for node_id, claim in self._claims.items()}
        if self._spread_use:
            here = own.setdefault(self.local, {})
            for name, amount in self._spread_use.items():
                here[name] = here.get(name, 0.0) + amount
        return own

    def _count_here(self, task_id: bytes, task) -> None:
        """*Locked* (``_lock``). The SPREAD task ``task_id`` runs here (``task``), or no
        more (None: it went elsewhere, or ended): ``_spread_here`` and its summed
        requests, ``_spread_use``. One that ended is forgotten at the next read of the
        view (``view``), not at once: the view itself shows it that long or longer."""
        old = self._spread_here.pop(task_id, None)
        for counted, sign in ((old, -1.0), (task, 1.0)):
            if counted is None:
                continue
            for name, amount in counted.spec.request.items():
                if amount:
                    self._spread_use[name] = self._spread_use.get(name, 0.0) + \
                        sign * float(amount)
        if task is not None:
            self._spread_here[task_id] = task
        self._spread_use = {k: v for k, v in self._spread_use.items() if v > 1e-9}

    def offload(self, task, local_feasible: bool = False) -> bool | str | None:
        """*Owner locked.* Step 1 for a task of ``TaskQueue`` whose arguments are ready: one
        with a node affinity or ``"SPREAD"``, or one the local node can never hold
        (``local_feasible`` False: its infeasible case). True when it is this module's from
        now on (another node runs it, or a hard affinity makes it unschedulable); None when
        it stays here.
        Else, for an infeasible one with other nodes, the stderr line naming every alive
        node's totals (None: this node's own line)."""
        if self._closed:
            return None
        placed, why = self._place(task, local_feasible)
        if placed is not None:
            self._begin(task, placed)
            return True
        if local_feasible:
            return None
        nodes = self.view()
        if not nodes:
            return None  # no view: a driver without a node (init() alone)
        self.watch()  # a node's view: one that can hold it may join later
        if not any(e.node_id != self.local for e in nodes):
            return None  # this node alone so far: its own line
        if why is None or why.action != "infeasible":
            return None  # no rule said "nowhere" (an affinity fell back): its own line
        return (f"miniray: this request can never run on any node of the cluster. "
                f"{why.reason} Start a node with the resources (miniray start --address=HEAD:PORT "
                f"--resources ...) or lower the request; the task stays pending until one "
                f"joins. Full request: {request_text(task.spec.request)}")

    def spill(self, queue) -> int:
        """*Owner locked.* Spill-over (step 1 with ``local_room=False``): the local ledger
        just said it has no room now for the tasks of ``queue`` (one scheduling key's
        queued tasks, arguments ready, front first). Those ``may_spill`` allows that
        another alive node has room for now, as the view shows it and at most its totals
        less this driver's tasks there (``less_claims``), leave the queue and run there;
        the first that stays (no room elsewhere, or its arguments here are too large to
        move) ends it. A task for "any bundle" of a placement group goes to one of the
        group's bundles on another node with room now (``bundles.spill``), else stays.
        Returns how many left. One node alone: nothing is read but the cached view."""
        if self._closed:
            return 0
        nodes = self.view()
        if not any(e.alive and e.node_id != self.local for e in nodes):
            return 0
        moved = 0
        while queue:
            task = queue[0]
            spec = task.spec
            if spec.placement is not None:  # "any bundle": a remote bundle with room now
                if not self.bundles.spill(task):
                    break
                queue.popleft()
                moved += 1
                continue
            if not may_spill(task):
                break  # it runs here (the front stays first in its queue)
            view = self._own_view(nodes)
            placed = placement_for(None, spec.request, self.local, view, True,
                                   local_room=False, arg_bytes=self._arg_bytes(spec))
            if type(placed) is not str:
                break
            queue.popleft()
            self._begin(task, placed)
            moved += 1
        return moved

    def _spill_more(self, key) -> None:
        """*Owner locked.* A task of this module ended on its node, which has that much
        more room: the local queue of ``key`` is offered to ``spill`` again while it is
        stuck (the local ledger found no room and nothing was freed here since), as no
        local event would offer it until one is."""
        owner = self.owner
        queue = owner.tasks.queues.get(key)
        if not queue or key not in owner.leases.stuck:
            return
        self.spill(queue)
        if not queue:
            del owner.tasks.queues[key]

    def _arg_bytes(self, spec) -> dict:
        """*Owner locked.* ``{node id: bytes of the task's ObjectRef arguments there}``:
        this store's shared memory (inline ones travel with the task anyway) and results
        kept on their node (step 7, not pulled yet), for ``node_pick`` rules 2-4."""
        if not spec.deps:
            return {}
        store = self.owner.store
        objects = self.owner.objects
        out: dict[str, int] = {}
        for _position, object_id in spec.deps:
            entry = objects.get(object_id)
            if entry is not None and entry.state == PENDING and entry.remote is not None:
                out[entry.remote.node_id] = out.get(entry.remote.node_id, 0) + \
                    entry.remote.size
                continue
            if store.inline_or_none(object_id) is not None:
                continue
            try:
                size = int(store.location(object_id)[-1])
            except (KeyError, TypeError, ValueError):
                continue  # not in this store (a borrowed ref): nothing here to weigh
            out[self.local] = out.get(self.local, 0) + size
        return {k: v for k, v in out.items() if v}

    def locate(self, task) -> bool | None:
        """*Owner locked.* Step 1 for a task whose arguments include results kept on
        other nodes, not pulled (``TaskQueue._kept_first``): without an affinity,
        ``node_pick`` weighs where its arguments' bytes are (rule 2's exception, rule 4),
        the view less this driver's tasks there; with one (or SPREAD), its own rule
        decides (``_place``). True when it went to another node (it reads the copy kept
        there, or that node fetches it: ``_dep_values``) or failed unschedulable; None: it
        stays here, and its kept arguments are pulled as before. A task in a placement
        group: its bundle decides (``bundles.submit``: one on another node reads or fetches
        them there; one here pulls them)."""
        spec = task.spec
        if self._closed or task.cancelled:
            return None
        if spec.placement is not None:
            return True if self.bundles.submit(task) else None
        if spec.affinity is not None:  # its own rule; on another node it fetches them there
            local_feasible = not infeasible_reasons(self.owner.tasks.node_state, spec.request)
            placed = self._place(task, local_feasible)[0]
            if placed is None:
                return None
            self._begin(task, placed)
            return True
        if not may_spill(task):
            return None
        with self._lock:  # a node whose link was lost is not chosen again (a retry)
            lost = {n for n, c in self._clients.items() if c.lost is not None}
        nodes = [e for e in self.view() if e.node_id not in lost]
        if not any(e.alive and e.node_id != self.local for e in nodes):
            return None
        local_feasible = not infeasible_reasons(self.owner.tasks.node_state, spec.request)
        view = self._own_view(nodes)
        placed = node_pick.pick_node(spec.request, self.local, view,
                                     arg_bytes=self._arg_bytes(spec),
                                     local_holds=local_feasible)
        if placed.node_id in (None, self.local) or placed.action == "infeasible" or (
                placed.action == "wait" and local_feasible):
            return None
        self._begin(task, placed.node_id)
        return True

    def _claim(self, slot, node_id: str | None, request: dict) -> None:
        """The task of ``slot`` is placed on ``node_id`` (None: it ended there, or moves):
        its request counts against that node in ``spill`` until then."""
        with self._lock:
            old = getattr(slot, "claim", None)
            if old is not None:
                claim = self._claims.get(old, {})
                for name, amount in request.items():
                    if amount and name in claim:
                        claim[name] -= float(amount)
                if not any(v > 1e-9 for v in claim.values()):
                    self._claims.pop(old, None)
            slot.claim = node_id
            if node_id is not None:
                claim = self._claims.setdefault(node_id, {})
                for name, amount in request.items():
                    if amount:
                        claim[name] = claim.get(name, 0.0) + float(amount)

    def watch(self, recheck=None) -> None:
        """*Owner locked.* Step 1 again every INFEASIBLE_WATCH_S while anything waits for a
        node that may join: the owner's infeasible tasks, and the pending work of each
        ``recheck`` registered (a callable taking the fresh view, called under the owner's
        lock, returning whether it still has work waiting; remote_actors' for pending
        actors). One thread for all of them (``_watch_infeasible``), started when needed."""
        if recheck is not None and recheck not in self._rechecks:
            self._rechecks.append(recheck)
        if self._watching:
            return
        self._watching = True
        threading.Thread(target=self._watch_infeasible, daemon=True,
                         name="miniray-remote-infeasible").start()

    def _watch_infeasible(self) -> None:
        """The thread of ``watch``: placing again, as Ray's pending tasks and actors wait for
        a node that can hold them. Ends when nothing waits any more, or with the driver."""
        owner = self.owner
        try:
            while True:
                time.sleep(INFEASIBLE_WATCH_S)
                nodes = self.view(fresh=True)  # a file read: not under the owner's lock
                with owner.locked():  # ends under the lock: watch() starts a new one after
                    if self._closed or owner.closed:
                        self._watching = False
                        return
                    waiting = self._recheck_tasks(nodes)
                    for recheck in list(self._rechecks):
                        waiting = recheck(nodes) or waiting
                    if not waiting:
                        self._watching = False
                        return
        except BaseException:
            self._watching = False
            raise

    def _recheck_tasks(self, nodes: list) -> bool:
        """*Owner locked.* ``watch``'s recheck of the owner's infeasible tasks: each that a
        node of ``nodes`` can hold now goes there. Whether any was waiting."""
        owner = self.owner
        waiting = [t for tasks in owner.tasks.infeasible.values() for t in tasks]
        for task in waiting:
            placed = placement_for(task.spec.affinity, task.spec.request, self.local,
                                   nodes, False)
            if placed is not None:
                owner.tasks.remove_waiting(task)
                self._begin(task, placed)
        return bool(waiting)
