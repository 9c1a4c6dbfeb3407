"""init(), shutdown() and the driver's Runtime: what exists between them, and in what order.

Owns: ``init()`` (the order of its checks, joining a node or starting one: the session
directory, ledger, fork server, owner), the ``atexit`` hook, auto-init, and the teardown
order of ARCHITECTURE.md. Does not own: tasks and objects (``owner.py``), resource
arithmetic (``resources.py``), the checks of ``init()``'s arguments (``init_args.py``,
re-exported here), or the driver's store and session files (``driver_session.py``: making
the store, the statistics a joined driver publishes, removing the files at shutdown).
Called by: the public API in ``miniray/__init__.py``; inside workers, ``worker_main`` installs a
``WorkerRuntime`` here instead.

Module state: none of its own; the Runtime of this process (driver) or the WorkerRuntime (worker)
is in ``core/context.py``'s slot, and importing this module installs ``auto_init`` there as the
hook that starts a runtime on first use. Nothing is started at import.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Union

from miniray._private.core import (
    cluster_view,
    config,
    context,
    ids,
    memory_policy,
    metric_values,
    runtime_envs,
    serialization,
)
from miniray._private.core import logging_config as logging_configs  # init() has that argument
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.resources import NodeState, check_object_store_memory, to_units
from miniray._private.driver_session import SessionFiles, _driver_sys_path, _make_store
from miniray._private.host import session
from miniray._private.init_args import (
    HIDDEN_INIT_KWARGS,
    _check_whole,
    check_init_arguments,
    job_logging_config,
)
from miniray._private.object_store import values
from miniray._version import __version__

# The engine (owner, store, ledger, host inventory, fork server and node clients, actor link)
# is imported lazily, inside the functions that start it: `import miniray` loads the API only,
# and init() the rest. Those imports point down the layers; none of them closes a cycle.

logger = logging.getLogger("miniray")

_init_lock = threading.RLock()


class RayContext(dict):
    """What ``init()`` returns: a read-only mapping over ``address_info``, and a context
    manager that calls ``shutdown()`` on exit.

    Mirrors ``ray._private.worker.RayContext`` (Ray 2.60).
    """

    def __init__(self, address_info: dict):
        super().__init__(address_info)
        self.address_info = dict(address_info)
        self.dashboard_url = ""
        self.python_version = ".".join(map(str, sys.version_info[:3]))
        self.ray_version = __version__
        self.ray_commit = "miniray"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutdown()

    def disconnect(self):
        shutdown()

    def __repr__(self) -> str:
        return f"RayContext({self.address_info!r})"


# Run by ``init()`` once its first worker is ready, once per round: each makes what a
# program's first task makes (``remote_function.warm_up``, added when that module loads), so
# that the program's own first ``@remote`` and ``.remote()`` pay none of that code's first
# runs. One may return ``(spec, fn_bytes)``: a no-op init() sends through the first lease's
# worker (``Owner.warm_up_round_trip``), never recorded as a task.
WARM_UPS: list = []
# The bound on all the rounds together, counted from before the first: each round's
# ``WARM_UPS`` run and round trip (the first trip about 0.3-1 ms on 2 cores, the next ~0.1 ms
# each). No round starts after it; an answer that comes later is dropped when it comes, and
# the first task, sent meanwhile, runs after it.
WARM_UP_WAIT_S = 0.005
# How many rounds: CPython 3.11 specialises a function's code after about 8 calls, so the
# code the rounds run is specialised by the first task: the no-op's making (``WARM_UPS``),
# the driver's ``_send_task`` (not ``RemoteFunction._submit``, ``Owner.submit_task`` or
# ``_dispatch``), the worker's whole task path, and the driver's own read of the RESULT up
# to ``_on_result``'s look-up (not ``tasks.complete``, the object table or ``get()``'s
# return). First no-op 0.52 -> 0.475 ms median against one round, 30 runs each.
WARM_UP_ROUNDS = 8
# How long ``init()`` waits for the first prestarted worker (a loaded machine's fork server
# may take seconds to start; init then returns and the first task waits instead).
PRESTART_WAIT_S = 5.0
# Then how long it waits for the other prestarted workers (a setup hook that takes seconds
# in each is not waited for).
PRESTART_REST_S = 0.05


class Runtime(SessionFiles):
    """The driver's runtime for one ``init()``: session directory, ledger, fork server, owner."""

    mode = "driver"

    def __init__(self, *, num_cpus, num_gpus, resources, object_store_memory, namespace,
                 log_to_driver, temp_dir, runtime_env, node=None, setup_hook=None,
                 logging_config=None, memory_settings=None):
        self.pid = os.getpid()
        # The memory monitor's (init's _system_config, RAY_* variables; memory_policy.py).
        self.memory_settings = memory_settings or memory_policy.monitor_settings(
            None, os.environ)
        # The workers' LoggingConfig (or None): init()'s (which ``_started`` applies here
        # too) or its job_config's; each worker applies it from HELLO, and while it is set
        # worker lines reach the driver without their prefix.
        self.logging_config = logging_config
        # The job's runtime environment (init's, checked by runtime_envs.parse_for_job):
        # the driver's own, and every task's and actor's unless they name one. "" is its
        # env_key: workers started in it need nothing more than HELLO says.
        self.runtime_env = self.job_runtime_env = runtime_env or {}
        self.runtime_env_key = ""
        self.setup_hook = setup_hook
        self.node_ip = "127.0.0.1"
        self.node_id = ids.random_hex(ids.NODE_ID_SIZE)
        self.worker_id = ids.random_hex(ids.NODE_ID_SIZE)
        self.namespace = namespace if namespace is not None else ids.random_hex(16)
        ids.set_job_id(ids.job_id_for(1))  # an embedded node's only driver: job 1
        self.job_id = ids.JOB_ID
        self._shut = False
        self.node_client = None
        if node is not None:  # a node started with `miniray start`: join it
            self._connect(node, log_to_driver, runtime_env)
            return
        self.session_dir = session.create_session_dir(temp_dir)
        self.session_name = os.path.basename(self.session_dir)
        self.temp_dir = os.path.dirname(self.session_dir)
        self.address = f"{self.node_ip}:0"
        try:
            self._start(num_cpus, num_gpus, resources, object_store_memory, log_to_driver,
                        runtime_env)
        except BaseException:
            session.remove_session_dir(self.session_dir)
            raise

    def _connect(self, record, log_to_driver, runtime_env) -> None:
        """Drive a node started by ``miniray start``: its ledger, its fork server (through the
        node's socket); this driver keeps its own object store and talks to its workers
        directly, as in embedded mode."""
        from miniray._private.ledger.ledger import Ledger  # lazy: see the note at the imports
        from miniray._private.transport import node_client

        client = node_client.connect(record)
        info = client.info
        try:
            self.node_client = client
            self.session_dir = info["session_dir"]
            # The node numbers its drivers (Ray's jobs): ids made from here on carry ours.
            ids.set_job_id(info.get("job_id") or ids.job_id_for(1))
            self.job_id = ids.JOB_ID
            self.session_name = os.path.basename(self.session_dir)
            self.temp_dir = os.path.dirname(self.session_dir)
            self.node_id = info["node_id"]
            self.node_pid = info.get("node_pid", self.pid)  # holds detached groups
            self.node_ip = info.get("node_ip", self.node_ip)
            self.address = info["address"]
            self.gpu_ids_are_ints = info["gpu_ids_are_ints"]
            self.gpu_keys = info["gpu_keys"]
            self.accelerator_type = info.get("accelerator_type")
            self.num_cpus = int(info["totals"].get("CPU", 0))
            self.ledger = Ledger(info["ledger_path"])
            state = self.ledger.snapshot()
            self.node_state = NodeState(totals=dict(state.totals),
                                        instance_ids=dict(state.instance_ids), leases={})
            self.store = _make_store(self.session_dir, int(info["object_store_memory"]),
                                     driver=f"driver_{self.pid}")
            client.announce_store(self.store.session_tag)
            self._start_owner(client, log_to_driver, runtime_env, int(info["object_store_memory"]))
            if not AS_ACTOR_SERVICE:  # the service starts a fresh worker per actor
                # No lease for the first task here: the node's ledger is shared with other
                # drivers and published to the cluster's view (SPREAD reads it).
                self._prestart_workers(first_lease=False)
            if not AS_ACTOR_SERVICE:  # named and detached actors live in the node's service
                from miniray._private.owner.actor_link import SOCKET_NAME, ActorLink  # lazy

                self.owner.actors.link = ActorLink(
                    self.owner, os.path.join(self.session_dir, SOCKET_NAME))
        except BaseException:
            client.close()
            raise
        with self.owner.locked():  # timers run on the I/O thread, with the owner's lock
            self.owner.waits.want_demands = True  # for `miniray status -v`
            self.owner.reactor.call_later(0, self._publish_store_stats)

    def _start_owner(self, fork_server, log_to_driver, runtime_env, capacity: int,
                     restart_fork_server=None) -> None:
        from miniray._private.core import alias  # lazy: see the note at the imports

        hook = self.setup_hook
        if callable(hook):  # sent as a function's pickle, as Ray exports it
            hook = serialization.dumps_function(hook, "worker_process_setup_hook")
        hello = {
            "session_dir": self.session_dir,
            "store": {"session_tag": self.store.session_tag, "shm_dir": self.store.shm_dir,
                      "inline_threshold": self.store.inline_threshold, "capacity": capacity},
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "job_id": self.job_id,
            "namespace": self.namespace,
            "sys_path": _driver_sys_path(),
            "cwd": os.getcwd(),
            "runtime_env": self.job_runtime_env,
            "setup_hook": hook,
            "ray_alias": alias.installed(),
            "gpu_ids_are_ints": self.gpu_ids_are_ints,
            "nodes": [self.node_info()],
            "logging_config": (self.logging_config.to_dict()
                               if self.logging_config is not None else None),
        }
        if log_to_driver is None:
            log_to_driver = config.log_to_driver_default()
        from miniray._private.owner.owner import Owner  # lazy: see the note at the imports

        self.owner = Owner(
            ledger=self.ledger, store=self.store, fork_server=fork_server,
            node_state=self.node_state, hello_info=hello, num_cpus=self.num_cpus,
            log_to_driver=bool(log_to_driver), gpu_keys=self.gpu_keys,
            restart_fork_server=restart_fork_server,
        )
        self.session_token = self.owner.session_token
        # The per-task delegations to the owner, bound once (a Python call less each on
        # every submission, ref and get(); self.owner is never replaced)
        self.ref_created = self.owner.ref_created
        self.ref_dropped = self.owner.ref_dropped
        self.get_serialized = self.owner.get_serialized
        self.submit_task = self.owner.submit_task
        from miniray._private.owner.placement_groups import PlacementGroups  # lazy: as Owner

        self.owner.pgs = PlacementGroups(
            owner=self.owner, pid=self.pid, node_id=self.node_id,
            holder_for_detached=getattr(self, "node_pid", self.pid),
            totals=self.ledger.totals())
        self._serve_state()
        from miniray._private.owner.memory_watch import MemoryWatch  # lazy: as Owner

        self.memory_watch = MemoryWatch(self.owner, self.memory_settings, self.node_ip,
                                        self.node_id)
        with self.owner.locked():
            self.memory_watch.start()

    def _serve_state(self) -> None:
        """Every driver answers state requests (``ray.util.state``, ``miniray list``) on
        its own socket in the session: reading its state costs the task path nothing."""
        from miniray._private.owner import (  # lazy: see the note at the imports
            placement_group_loans,
            state_records,
        )
        from miniray._private.transport import state_socket  # lazy: as above

        ids_ = {"job_id": self.job_id, "node_id": self.node_id, "worker_id": self.worker_id,
                "pid": self.pid, "namespace": self.namespace,
                "session_dir": self.session_dir, "address": self.address,
                "actor_service": AS_ACTOR_SERVICE}
        owner = self.owner

        def snapshot() -> dict:
            return state_records.dumpable(
                state_records.snapshot(owner, owner.state_records, ids_))

        def spans() -> dict:
            return state_records.spans(owner, owner.state_records, ids_)

        def pending_groups() -> dict:  # its node answering another host's listing
            return state_records.pending_groups(owner)

        node_pid = getattr(self, "node_pid", None)  # joined to a node: it relays far loans

        def loans(request: dict, pid: int) -> dict:  # room lent to another driver's task
            return placement_group_loans.answer_borrower(owner, request, pid, node_pid)

        self.state_server = None
        try:
            self.state_server = state_socket.StateServer(
                state_socket.socket_path(self.session_dir), snapshot, spans, loans,
                pending_groups)
        except OSError as error:  # the session works without it; only observing it fails
            logger.warning("miniray: cannot serve this driver's state (%s); `miniray list` "
                           "and ray.util.state will not see it", error)

    def _prestart_workers(self, first_lease: bool = True) -> None:
        """Idle workers for the default shape, and ``init()`` returns once the first is
        ready (it answered its HELLO): the first task then costs about a warm round trip, not
        the fork server's start. Bounded: a fork server slower than ``PRESTART_WAIT_S`` is
        not waited for. Then (``first_lease``: a session of its own, no node) the lease of
        the default shape is taken for that worker (``Owner.take_first_lease``), the other
        workers are waited for at most ``PRESTART_REST_S``, and the submit path is run once
        without submitting (``WARM_UPS``); with that lease, a no-op goes through its worker
        and back (``Owner.warm_up_round_trip``), which no state, timeline or object shows.
        Both are done ``WARM_UP_ROUNDS`` times (the no-op made again each round), all
        rounds within ``WARM_UP_WAIT_S`` from before the first (no round starts after it,
        the last waits for what is left)."""
        count = config.prestart_workers(self.num_cpus)
        if count:
            ready = self.owner.prestart_workers(count).wait(PRESTART_WAIT_S)
            if ready:
                if first_lease:
                    self.owner.take_first_lease()
                # The others are a few ms behind the first on a small machine: the first
                # task would share the CPU with their start-up (0.5-5 ms on 2 cores).
                self.owner.workers_ready.wait(PRESTART_REST_S)
            # One bound for every round, each round's making of the no-op included.
            deadline = time.monotonic() + WARM_UP_WAIT_S
            for round_ in range(max(1, WARM_UP_ROUNDS)):
                if round_ and deadline <= time.monotonic():
                    break
                trip = None
                for warm_up in WARM_UPS:  # the first @remote and .remote() made, unsent
                    trip = warm_up() or trip
                left = deadline - time.monotonic()
                if (not ready or not first_lease or trip is None or WARM_UP_WAIT_S <= 0
                        or left <= 0):
                    break
                if not self.owner.warm_up_round_trip(trip[0], trip[1], left):
                    break

    def _start(self, num_cpus, num_gpus, resources, object_store_memory, log_to_driver,
               runtime_env) -> None:
        from miniray._private.ledger import inventory  # lazy: see the note at the imports
        from miniray._private.ledger.ledger import Ledger

        spec = inventory.node_resources(num_cpus, num_gpus, resources, object_store_memory,
                                        self.node_ip)
        gpu_ids = spec["gpu_ids"]
        self.gpu_ids_are_ints = spec["gpu_ids_are_ints"]
        self.gpu_keys = spec["gpu_keys"]
        self.accelerator_type = spec["accelerator_type"]
        object_store_memory = spec["object_store_memory"]
        self.num_cpus = num_cpus
        totals = spec["totals"]
        ledger_path = os.path.join(self.session_dir, "ledger.json")
        self.ledger = Ledger.create(ledger_path, totals, {"GPU": gpu_ids} if gpu_ids else {})
        self.node_state = NodeState(
            totals={name: to_units(value) for name, value in totals.items()},
            instance_ids={"GPU": gpu_ids} if gpu_ids else {},
            leases={},
        )
        self.store = _make_store(self.session_dir, int(object_store_memory))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(_driver_sys_path())
        job_vars = self.job_runtime_env.get("env_vars") or {}
        if job_vars:  # in the fork server too (import-time settings), expanded once
            env.update(runtime_envs.expand_env_vars(job_vars, dict(env)))
            env[runtime_envs.JOB_ENV_VARS] = json.dumps(job_vars)
        from miniray._private.core import alias  # lazy: see the note at the imports

        if alias.installed():  # and so in what a task starts (README, `miniray run`)
            env = alias.forward_environ(env)
        from miniray._private.transport.spawn import (
            ForkServerClient,  # lazy: see the note at the imports
        )

        self.fork_server = ForkServerClient(env)
        try:
            self._start_owner(self.fork_server, log_to_driver, runtime_env,
                              int(object_store_memory),
                              restart_fork_server=lambda: ForkServerClient(env))
            self._prestart_workers()
        except BaseException:
            self.fork_server.close()
            self.fork_server.wait(timeout=5)
            raise

    # -- ObjectRef tracking: delegated to the owner ----------------------------------
    def ref_created(self, object_id):
        self.owner.ref_created(object_id)

    def ref_dropped(self, object_id):
        self.owner.ref_dropped(object_id)

    def ref_pickled(self, object_id):
        self.owner.ref_pickled(object_id)

    def as_future(self, ref):
        return values.future_of(self, ref)

    # -- the API the public functions call -------------------------------------------
    def is_initialized(self) -> bool:
        return not self._shut

    def needs_function(self, fn_id: bytes) -> bool:
        return self.owner.needs_function(fn_id)

    def submit_task(self, spec) -> None:
        self.owner.submit_task(spec)

    def put_value(self, object_id: bytes, value) -> None:
        self.owner.put_value(object_id, value)

    @property
    def large_arguments(self) -> tuple:
        """``(threshold, put)`` for ``serialization.pack_arguments``: an argument passed by
        value from the inline threshold on is stored once and passed as a ref, as in Ray."""
        return self.store.inline_threshold, self._put_argument

    def _put_argument(self, ser, contained: tuple) -> bytes:
        object_id = ids.new_put_id()
        self.owner.put_value(object_id, ser, contained)
        return object_id

    def read_value(self, object_id: bytes, payload):
        """A large object's value in the driver: the store's own zero-copy view."""
        return self.store.get_value(object_id)

    def get_serialized(self, object_ids, timeout):
        return self.owner.get_serialized(object_ids, timeout)

    def wait_ready(self, object_ids, num_returns, timeout):
        return self.owner.wait_ready(object_ids, num_returns, timeout)

    def stream_next(self, task_id: bytes, index: int, timeout):
        """Value ``index`` of a streaming call: True (there), False (the call ended without
        it) or None (the timeout passed first)."""
        return self.owner.stream_next(task_id, index, timeout)

    def cancel(self, object_id, force, recursive):
        self.owner.cancel(object_id, force, recursive)

    def knows(self, object_id) -> bool:
        """Whether the owner still holds ``object_id`` (for tests and status)."""
        return self.owner.knows(object_id)

    # -- actors ------------------------------------------------------------------------
    def create_actor(self, spec) -> bytes:
        owner = self.owner
        if spec.pg is not None and owner.actors.link is not None and owner.pgs is not None:
            owner.pgs.route_served(spec.placement)  # a detached group of the node's service
        with owner.locked():
            owner.check_usable()
            if not owner.actors.is_node_actor(spec):
                return owner.actors.create(spec)
        return owner.actors.create_in_service(spec)  # waits for the service, lock free

    def submit_actor_call(self, actor_id: bytes, call) -> None:
        owner = self.owner
        with owner.locked():
            if owner.closed or owner.helper_loss.fatal:  # check_usable(), inlined
                owner.check_usable()
            owner.actors.submit(actor_id, call)

    def kill_actor(self, actor_id: bytes, no_restart: bool) -> None:
        actors = self.owner.actors
        with self.owner.locked():
            in_service = actors.kill(actor_id, no_restart)
        if in_service:
            actors.kill_in_service(actor_id, no_restart)

    def get_actor(self, name: str, namespace: str | None):
        actors = self.owner.actors
        if actors.link is not None:  # joined to a node: its actor service holds the names
            return actors.lookup_in_service(name, namespace or self.namespace)
        with self.owner.locked():
            return actors.lookup(name, namespace or self.namespace)

    def list_named_actors(self, all_namespaces: bool) -> list:
        actors = self.owner.actors
        if actors.link is not None:
            return actors.named_in_service(self.namespace, all_namespaces)
        with self.owner.locked():
            return actors.named(self.namespace, all_namespaces)

    def actor_handle_event(self, actor_id: bytes, delta: int) -> None:
        self.owner.actors.handle_event(actor_id, delta)

    def cluster_resources(self) -> dict:
        local = self.ledger.capacity()
        others = self._other_nodes()
        return _summed(local, cluster_view.totals_sum(others)) if others else local

    def _other_nodes(self) -> list:
        """The other alive nodes of this node's cluster; [] in embedded mode or on a node
        of its own."""
        return [e for e in self._cluster_entries() if e.alive]

    def _cluster_entries(self) -> list:
        """Every node of this node's cluster but this one, from the view the node publishes
        in its session dir (``node/peering.py``)."""
        if self.node_client is None:
            return []
        from miniray._private.transport import node_client  # lazy, as in _connect

        doc = node_client.read_cluster(self.session_dir)
        return [e for e in cluster_view.nodes_of(doc).values()
                if e.node_id not in (doc.get("local"), self.node_id)]

    # -- placement groups (owner/placement_groups.py) ----------------------------------------
    def placement_group_create(self, hex_: str, bundles, strategy: str, name: str,
                               detached: bool) -> None:
        self.owner.pgs.create(hex_, bundles, strategy, name, detached)

    def placement_group_ready(self, handle):
        return ObjectRef(self.owner.pgs.ready_object(handle.id.hex(), handle))

    def placement_group_wait(self, hex_: str, timeout: float) -> bool:
        return self.owner.pgs.wait(hex_, timeout)

    def placement_group_remove(self, hex_: str) -> None:
        self.owner.pgs.remove(hex_)

    def placement_group_lookup(self, name: str) -> tuple[str, list]:
        return self.owner.pgs.lookup(name)

    def placement_group_table(self) -> dict:
        return self.owner.pgs.table()

    def placement_group_bundles(self, hex_: str) -> list:
        bundles = self.owner.pgs.bundles_of(hex_)
        if bundles is None:
            raise ValueError(f"Placement group {hex_} does not exist.")
        return bundles

    def current_placement(self):
        """The placement group the caller runs in: none in the driver."""
        return None

    def available_resources(self) -> dict:
        self.owner.flush_idle_leases()
        local = self.ledger.available()
        others = self._other_nodes()
        return _summed(local, cluster_view.available_sum(others)) if others else local

    def node_info(self) -> dict:
        return {
            "NodeID": self.node_id,
            "Alive": True,
            "alive": True,
            "NodeManagerAddress": self.node_ip,
            "NodeManagerHostname": socket.gethostname(),
            "NodeManagerPort": 0,
            "NodeName": self.node_ip,
            "ObjectManagerPort": 0,
            "ObjectStoreSocketName": "",
            "RayletSocketName": "",
            "Resources": dict(self.ledger.totals()),
            "Labels": {"ray.io/node-id": self.node_id},
            "MetricsExportPort": 0,
            "MetricsAgentPort": 0,
            "DashboardAgentListenPort": 0,
            "RuntimeEnvAgentPort": 0,
            "DeathReason": 0,
            "DeathReasonMessage": "",
        }

    def nodes(self) -> list:
        """This node's row, then every other node of its cluster, alive or dead."""
        others = sorted(self._cluster_entries(), key=lambda e: not e.alive)
        return [self.node_info()] + [cluster_view.node_row(e) for e in others]

    def get_gpu_ids(self) -> list:
        return []

    def address_info(self) -> dict:
        address = self.address
        return {
            "address": address,
            "gcs_address": address,
            "node_id": self.node_id,
            "node_ip_address": self.node_ip,
            "object_store_address": "",
            "raylet_socket_name": "",
            "redis_address": None,
            "session_dir": self.session_dir,
            "webui_url": "",
            "metrics_export_port": 0,
            "dashboard_agent_listen_port": 0,
        }

    def statistics(self) -> dict:
        return {"owner": self.owner.statistics(), "ledger": self.ledger.statistics()}

    def pids(self) -> list[int]:
        """The processes this runtime started and will stop: the fork server (embedded
        mode) and every live worker (for status output and tests)."""
        if self.node_client is not None:
            return self.owner.worker_pids()  # the node's own processes outlive this driver
        return [self.owner.fork_server.pid] + self.owner.worker_pids()

    def shutdown(self) -> None:
        """Teardown steps 1-4 in the owner; then 5: leases, files (ARCHITECTURE.md)."""
        if self._shut:
            return
        self._shut = True
        server = getattr(self, "state_server", None)
        if server is not None:  # first: a reader never sees a driver half torn down
            server.close()
        try:
            self.owner.shutdown()
        finally:
            # Step 5: peer connections are closed by now; the MAC pool's threads end.
            from miniray._private.transport.mac_pool import MAC_POOL  # lazy: small, rare

            try:
                MAC_POOL.stop()
            except Exception:  # noqa: BLE001 - never keeps the session's release from running
                logger.warning("the MAC pool's threads did not stop", exc_info=True)
            self._release_session()
            metric_values.RECORDER.clear()  # a later session starts from zero, as its workers do
            ids.set_job_id(ids.job_id_for(1))  # this process's ids: no job of a node's now

    def __repr__(self) -> str:
        return f"<Runtime {self.session_name} cpus={self.num_cpus}>"


# ---------------------------------------------------------------------- module API
# True in the node's actor service (``actor_service.py``): it owns its named actors itself.
AS_ACTOR_SERVICE = False


def current():
    return context.current()


def is_initialized() -> bool:
    """Whether ``init()`` has been called (and ``shutdown()`` not since).

    Mirrors ``ray.is_initialized``. Inside a task or actor it is True.

    Example:
        >>> ray.is_initialized()
        True
    """
    rt = context.current()
    return rt is not None and rt.is_initialized()


def auto_init():
    """The runtime, starting a plain ``init()`` first if needed (as Ray does)."""
    rt = context.current()
    if rt is not None:
        return rt
    if not config.auto_init_enabled():
        from miniray.exceptions import RaySystemError

        raise RaySystemError(
            "miniray has not been started yet and RAY_ENABLE_AUTO_CONNECT=0 turns off the "
            "implicit init(); call miniray.init() first."
        )
    init()
    return context.current()


context.set_auto_init(auto_init)  # ObjectRef.future() and the public API start one on first use


def require_initialized(what: str):
    rt = context.current()
    if rt is None:
        from miniray.exceptions import RaySystemError

        raise RaySystemError(
            f"Ray has not been started yet. You can start Ray with 'ray.init()' ({what} does "
            "not start it for you)."
        )
    return rt


def init(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    resources: Dict[str, float] | None = None,
    labels: Dict[str, str] | None = None,
    object_store_memory: int | None = None,
    local_mode: bool = False,
    ignore_reinit_error: bool = False,
    include_dashboard: bool | None = None,
    dashboard_host: str = "127.0.0.1",
    dashboard_port: int | None = None,
    job_config: Any = None,
    configure_logging: bool = True,
    logging_level: Union[int, str] = "info",
    logging_format: str | None = None,
    logging_config: Any = None,
    log_to_driver: bool | None = None,
    namespace: str | None = None,
    runtime_env: Dict[str, Any] | None = None,
    enable_resource_isolation: bool = False,
    cgroup_path: str | None = None,
    system_reserved_cpu: float | None = None,
    system_reserved_memory: int | None = None,
    proxy_server_url: str | None = None,
    **kwargs: Any,
) -> RayContext:
    """Starts miniray in this process, or joins a node started with ``miniray start``.

    Mirrors ``ray.init`` (Ray 2.60's signature, checks and errors). Differs: the dashboard,
    ``configure_logging``/``logging_level``/``logging_format``, job-config,
    resource-isolation and proxy parameters are accepted and have no effect (README,
    "Differences from Ray"). With no node
    running, it starts an embedded one: a fork server and a session directory, no daemon.
    ``with ray.init():`` shuts down at the end of the block.

    Args:
        address: ``None`` or ``"auto"`` joins a running node if there is one (also through
            ``RAY_ADDRESS``), else starts one; ``"local"`` always starts one;
            ``"127.0.0.1:<port>"`` names a node started with that ``--port``.
        num_cpus, num_gpus, resources, object_store_memory: this node's resources (only
            when starting one; refused when joining a node, as Ray refuses them).
        namespace, runtime_env, log_to_driver, ignore_reinit_error: as in Ray.
        logging_config: a ``LoggingConfig``, applied to the root logger of this driver and
            of every worker, as in Ray (``core/logging_config.py``).
        **kwargs: Ray's hidden options (``_temp_dir``, ...: ``HIDDEN_INIT_KWARGS``). Any
            other keyword raises RuntimeError, as in Ray.

    Returns:
        A context with ``address_info`` (usable as a context manager).

    Raises:
        RuntimeError: Already initialized (unless ``ignore_reinit_error=True``), or an
            unknown keyword.

    Example:
        >>> ray.shutdown()
        >>> context = ray.init(num_cpus=2)
        >>> ray.cluster_resources()["CPU"]
        2.0
    """
    unknown = [key for key in kwargs if key not in HIDDEN_INIT_KWARGS]  # Ray's order: as passed
    if "storage" in kwargs:
        raise RuntimeError(
            "The 'storage' argument was removed from ray.init() and is not supported."
        )
    if "allow_multiple" in kwargs:
        raise RuntimeError("allow_multiple=True is only supported with a ray:// address.")
    if unknown:
        raise RuntimeError(f"Unknown keyword argument(s): {', '.join(unknown)}")
    if local_mode:
        raise RuntimeError(
            "`local_mode` is no longer supported. For interactive debugging, use the Ray "
            "debugger or run the function directly; miniray starts in well under a second."
        )
    check_init_arguments(address, namespace, runtime_env)
    system_config = kwargs.get("_system_config")
    if system_config is not None and not isinstance(system_config, dict):
        raise TypeError(f"_system_config must be a dict, got {type(system_config).__name__}.")
    # The memory monitor's keys are applied (a bad value raises here); Ray's other internal
    # settings configure parts miniray does not have and are accepted (README).
    memory_settings = memory_policy.monitor_settings(system_config, os.environ)
    driver_logging = job_logging_config(logging_config)
    logging_config = driver_logging  # the workers': a job_config's when init() names none
    if logging_config is None and getattr(job_config, "py_logging_config", None) is not None:
        logging_config = job_logging_config(job_config.py_logging_config)
    temp_dir = kwargs.get("_temp_dir")
    with _init_lock:
        rt = context.current()
        if rt is not None:
            if rt.mode == "worker":
                return RayContext({})
            if ignore_reinit_error:
                logger.info("Calling ray.init() again after it has already been called.")
                return RayContext(rt.address_info())
            raise RuntimeError(
                "Maybe you called ray.init twice by accident? This error can be suppressed by "
                "passing in 'ignore_reinit_error=True' or by calling 'ray.shutdown()' prior to "
                "'ray.init()'."
            )
        # Ray's checks of the job's runtime_env (a bad field raises here, before anything
        # starts); its fields that take no effect are named once.
        if not runtime_env and job_config is not None:  # Ray: init's wins, else the config's
            runtime_env = getattr(job_config, "runtime_env", None)
            check_init_arguments(None, None, runtime_env)
        if namespace is None and getattr(job_config, "ray_namespace", None) is not None:
            namespace = job_config.ray_namespace  # as Ray: init's namespace wins
            check_init_arguments(None, namespace, None)
        job_env, setup_hook = runtime_envs.parse_for_job(runtime_env)
        runtime_envs.note_ignored(job_env, level="job")
        if address in (None, "auto"):
            env_address = os.environ.get("RAY_ADDRESS")
            if env_address:
                logger.info("Using address %s set in the environment variable RAY_ADDRESS",
                            env_address)
                address = env_address
        from miniray._private.transport import node_client  # lazy: see the note at the imports

        node = None if address == "local" else node_client.find_node(
            address, temp_dir)
        if node is not None:
            if num_cpus is not None or num_gpus is not None:
                raise ValueError("When connecting to an existing cluster, num_cpus and "
                                 "num_gpus must not be provided.")
            given = {"resources": resources, "labels": labels,
                     "object_store_memory": object_store_memory,
                     "_system_config": kwargs.get("_system_config"),
                     "_node_name": kwargs.get("_node_name")}
            for key, value in given.items():
                if value is not None:
                    raise ValueError(f"When connecting to an existing cluster, {key} must not "
                                     "be provided.")
            rt = Runtime(num_cpus=None, num_gpus=None, resources=None,
                         object_store_memory=None, namespace=namespace,
                         log_to_driver=log_to_driver, temp_dir=None,
                         runtime_env=job_env, setup_hook=setup_hook, node=node,
                         logging_config=logging_config)
            return _started(rt, driver_logging)
        if resources is not None:
            if not isinstance(resources, dict):
                raise TypeError(f"resources must be a dict, got {type(resources).__name__}.")
            for reserved in ("CPU", "GPU", "memory", "object_store_memory"):
                hint = {"CPU": "num_cpus", "GPU": "num_gpus"}.get(reserved, reserved)
                assert reserved not in resources, (
                    f"Use the '{hint}' argument of ray.init() instead of putting '{reserved}' "
                    "in 'resources'."
                )
        shown = {"CPU": num_cpus, "GPU": num_gpus, **(resources or {})}
        _check_whole("CPU", num_cpus, shown)
        _check_whole("GPU", num_gpus, shown)
        for name, value in (resources or {}).items():
            _check_whole(name, value, shown)
        from miniray._private.ledger import inventory  # lazy: see the note at the imports

        if num_cpus is None:
            num_cpus = inventory.cpu_count()
        osm = check_object_store_memory(object_store_memory,
                                        inventory.host_memory(), inventory.shm_free(),
                                        config.allow_slow_storage())
        rt = Runtime(
            num_cpus=int(num_cpus), num_gpus=num_gpus, resources=resources,
            object_store_memory=osm, namespace=namespace,
            log_to_driver=log_to_driver, temp_dir=temp_dir,
            runtime_env=job_env, setup_hook=setup_hook, logging_config=logging_config,
            memory_settings=memory_settings,
        )
        return _started(rt, driver_logging)


def share_serializers(rt: Runtime | None = None) -> None:
    """Write this driver's custom serializers where its session's workers read them
    (``host/serializer_file.py``); nothing in a worker or without a session."""
    from miniray._private.host import serializer_file  # lazy: only users of serializers

    rt = rt if rt is not None else context.current()
    if isinstance(rt, Runtime) and not rt._shut:
        serializer_file.write(rt.session_dir, serialization.registrations_blob())
        rt.owner.notify_serializers()


def _summed(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0.0) + value
    return out


def _started(rt: Runtime, logging_config=None) -> RayContext:
    context.set_current(rt)
    if logging_config is not None:  # after the start: a failed init() changes nothing
        logging_configs.configure_process(logging_config)
    if serialization.has_custom_serializers():  # registered before init(): share them now
        share_serializers(rt)
    _register_atexit(rt)
    logger.debug("miniray started: %s", rt.session_dir)
    return RayContext(rt.address_info())


_atexit_state: dict = {}


def _register_atexit(rt: Runtime) -> None:
    pid = os.getpid()

    def hook():
        if os.getpid() == pid:  # a forked child never tears down its parent's session
            shutdown(_exiting_interpreter=True)

    _atexit_state["hook"] = hook
    atexit.register(hook)


def shutdown(*, wait_for_processes: bool = False, _exiting_interpreter: bool = False) -> None:
    """Stops everything ``init()`` started: workers, the fork server, objects, the session.

    Mirrors ``ray.shutdown``. Runs by itself at interpreter exit; does nothing when nothing is
    running. Afterwards no process, shared-memory segment or session directory of this driver
    is left, and ``init()`` may be called again.

    Example:
        >>> ray.shutdown()
        >>> ray.is_initialized()
        False
        >>> _ = ray.init(num_cpus=2)
    """
    with _init_lock:
        rt = context.current()
        if rt is None or rt.mode != "driver":
            return
        context.set_current(None)
        hook = _atexit_state.pop("hook", None)
        if hook is not None and not _exiting_interpreter:
            atexit.unregister(hook)
        if _exiting_interpreter:  # teardown step 0: what runs now may finish first
            grace = config.exit_grace_s()
            if grace > 0:
                rt.owner.let_running_finish(grace)
        rt.shutdown()
