"""Every environment variable miniray reads, in one place.

Owns: the names, defaults and parsing of environment variables (Ray's, where miniray honours
them, and miniray's own). Does not own: what the values mean to the subsystems that read them.
Called by: the runtime at init(), the worker at start-up, the CLI.

Functions are read at call time, not import time, so tests can change the environment.
"""

from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def _number(name: str, parse, floor, default):
    """The environment variable ``name`` parsed by ``parse`` (int or float), at least
    ``floor`` (None: no floor); ``default`` when it is unset, empty or not a number."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        parsed = parse(value)
    except ValueError:
        return default
    return parsed if floor is None else max(floor, parsed)


def tmpdir_root() -> str:
    """Root of session directories: ``$MINIRAY_TMPDIR``, else ``/dev/shm/miniray-<uid>``
    (memory-backed: a ledger transaction there costs ~60 us against ~450 us on ext4), else
    ``<tmp>/miniray-<uid>``. The root is removed again when its last session ends."""
    root = os.environ.get("MINIRAY_TMPDIR")
    if root:
        return os.path.abspath(root)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return f"/dev/shm/miniray-{os.getuid()}"
    import tempfile  # lazy: most processes never ask; it costs milliseconds to import

    return os.path.join(tempfile.gettempdir(), f"miniray-{os.getuid()}")


DEFAULT_SHM_DIR = "/dev/shm"


def shm_dir() -> str:
    """``MINIRAY_SHM_DIR``: the directory of the object store's shared-memory segments
    (default ``/dev/shm``). Another one is created with mode 0700 when missing and checked
    (``shm_segments.prepare_shm_dir``). Every process of a session uses the driver's: the
    fork server and a node inherit the variable, workers and the actor service are told the
    store's directory. Two fake hosts on one machine get different ones (and so different
    ``shm_domain_id()``s)."""
    # Not made absolute here: a relative value is refused by prepare_shm_dir, since a node
    # daemon starts in "/" and would read it against another directory.
    return os.path.normpath(os.environ.get("MINIRAY_SHM_DIR") or DEFAULT_SHM_DIR)


def host_id() -> str:
    """``MINIRAY_HOST_ID``: an optional name of this host, mixed into ``shm_domain_id()`` so
    fake hosts sharing one machine (and one shm directory) can still be told apart."""
    return os.environ.get("MINIRAY_HOST_ID", "")


def cloud_instance_id() -> str:
    """``RAY_CLOUD_INSTANCE_ID``: the node's instance id in a cloud, "" when unset (as Ray)."""
    return os.environ.get("RAY_CLOUD_INSTANCE_ID", "")


def allow_slow_storage() -> bool:
    """``RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1``: accept an ``object_store_memory`` over
    10 GB that ``/dev/shm`` cannot hold (refused otherwise, as Ray does)."""
    return _flag("RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE", False)


def log_to_driver_default() -> bool:
    """``RAY_LOG_TO_DRIVER`` (default on): forward worker output to the driver."""
    return _flag("RAY_LOG_TO_DRIVER", True)


def tqdm_patch_print() -> bool:
    """``RAY_TQDM_PATCH_PRINT`` (default on): once ``tqdm_ray`` bars are drawn in place on a
    terminal, ``print`` goes through ``tqdm_ray.safe_print`` so it does not tear them."""
    return _flag("RAY_TQDM_PATCH_PRINT", True)


def worker_log_prefix_enabled() -> bool:
    """``RAY_DISABLE_WORKER_LOG_PREFIX=1`` drops the ``(name pid=N)`` prefix."""
    return not _flag("RAY_DISABLE_WORKER_LOG_PREFIX", False)


def logging_config_encoding() -> str | None:
    """``RAY_LOGGING_CONFIG_ENCODING`` (``TEXT`` or ``JSON``): ``init()`` without a
    ``logging_config`` applies a default one of that encoding, as Ray does."""
    return os.environ.get("RAY_LOGGING_CONFIG_ENCODING") or None


def auto_init_enabled() -> bool:
    """``RAY_ENABLE_AUTO_CONNECT=0`` turns off the implicit ``init()``."""
    return _flag("RAY_ENABLE_AUTO_CONNECT", True)


def noset_cuda_visible_devices() -> bool:
    """``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``: never set it in workers."""
    return _flag("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", False)


def override_cvd_on_zero() -> bool:
    """``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``: hide GPUs from 0-GPU workers (old Ray)."""
    return _flag("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", False)


def lease_linger_s() -> float:
    """``MINIRAY_LEASE_LINGER_MS``: how long an idle lease is kept for reuse while another
    session of the node waits for resources (default 5 ms)."""
    return _number("MINIRAY_LEASE_LINGER_MS", float, 0.0, 5.0) / 1000.0


def lease_keep_s() -> float:
    """``MINIRAY_LEASE_KEEP_MS``: how long an idle lease is kept for reuse while no other
    session of the node waits for resources (default 250 ms; never less than the linger)."""
    keep = _number("MINIRAY_LEASE_KEEP_MS", float, 0.0, 250.0) / 1000.0
    return max(keep, lease_linger_s())


def worker_log_bytes() -> int:
    """``MINIRAY_WORKER_LOG_BYTES``: the cap of each worker log file in the session's
    ``logs/`` (default 1 MiB, one rotated generation kept; 0: no log files)."""
    return _number("MINIRAY_WORKER_LOG_BYTES", int, 0, 1 << 20)


def wait_notice_s() -> float:
    """``MINIRAY_WAIT_NOTICE_S``: after how many seconds of waiting for resources a task or
    actor is named on the driver's stderr (default 5; 0 or less: never)."""
    return _number("MINIRAY_WAIT_NOTICE_S", float, None, 5.0)


def max_workers(num_cpus: float) -> int:
    """Cap on live worker processes (``MINIRAY_MAX_WORKERS``; default 4 x CPUs, at least 8)."""
    return _number("MINIRAY_MAX_WORKERS", int, 1, max(8, int(4 * max(num_cpus, 1))))


def pipeline_depth() -> int:
    """``MINIRAY_PIPELINE_DEPTH``: how many tasks of one scheduling key a leased worker may
    hold at once, the running one included (default 8; 1: one at a time, no pipelining).
    Tasks that need GPUs or set ``max_calls`` always go one at a time."""
    return _number("MINIRAY_PIPELINE_DEPTH", int, 1, 8)


def prestart_workers(num_cpus: float) -> int:
    """How many idle workers ``init()`` starts for the default shape
    (``MINIRAY_PRESTART_WORKERS``; default the CPUs, at most 8; 0: none). ``init()`` returns
    once the first is ready (connected and set up), so the first task does not wait for the
    fork server's start."""
    return _number("MINIRAY_PRESTART_WORKERS", int, 0, max(1, min(8, int(num_cpus))))


def store_write_threads() -> int | None:
    """``MINIRAY_STORE_WRITE_THREADS``: threads that write a new object segment of 32 MiB or
    more (unset or not a number: chosen from the CPUs and the directory's page size,
    ``object_store/parallel_write.write_plan``; 0: always one ``pwritev``; N: N threads)."""
    return _number("MINIRAY_STORE_WRITE_THREADS", int, 0, None)


def fork_server_restarts() -> int:
    """``MINIRAY_FORK_SERVER_RESTARTS``: how many times a minute a dead fork server is
    replaced before the session gives up (default 3; 0: never)."""
    return _number("MINIRAY_FORK_SERVER_RESTARTS", int, 0, 3)


def host_gpu_timeout_s() -> float | None:
    """``MINIRAY_HOST_GPU_TIMEOUT``: seconds a request may wait for physical GPUs that other
    sessions on the host hold before it fails (unset: wait as long as it takes)."""
    return _number("MINIRAY_HOST_GPU_TIMEOUT", float, 0.0, None)


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


RAY_ALIAS_ENV = "MINIRAY_RAY_ALIAS"


def ray_alias_requested() -> bool:
    """Set by ``miniray run`` so workers resolve ``import ray`` to miniray too."""
    return _flag(RAY_ALIAS_ENV, False)


# Set by ``miniray run --ray`` (the reverse alias: ``import miniray`` gives Ray) for the program
# and every process it starts; read by ``core/ray_startup/sitecustomize.py``, which cannot
# import this module, so ``core/alias.py`` repeats the name.
ON_RAY_ENV = "MINIRAY_ON_RAY"


def on_ray() -> bool:
    """``MINIRAY_ON_RAY=1``: this process belongs to a program that ``miniray run --ray`` runs
    on Ray."""
    return os.environ.get(ON_RAY_ENV) == "1"


def state_max_tasks() -> int:
    """``MINIRAY_STATE_MAX_TASKS``: how many finished tasks and actor calls each driver keeps
    for ``ray.util.state`` and ``miniray list tasks`` (default 10000; the oldest go first)."""
    return _number("MINIRAY_STATE_MAX_TASKS", int, 0, 10000)


def report_unhandled_errors() -> bool:
    """False when ``RAY_IGNORE_UNHANDLED_ERRORS`` is set (to anything, as Ray reads it): an
    error object freed without being read is then not logged."""
    return "RAY_IGNORE_UNHANDLED_ERRORS" not in os.environ


FUNCTION_SIZE_WARN_BYTES = 10**7  # Ray's FUNCTION_SIZE_WARN_THRESHOLD


def function_size_error_bytes() -> int:
    """``FUNCTION_SIZE_ERROR_THRESHOLD`` (Ray's name; default 10**8 bytes): a remote function
    or actor class whose pickle reaches it is refused at its first submission."""
    return _number("FUNCTION_SIZE_ERROR_THRESHOLD", int, 0, 10**8)


def exit_grace_s() -> float:
    """``MINIRAY_EXIT_GRACE_S`` (default 0.5; 0: none): at interpreter exit without an
    explicit ``shutdown()``, how long the tasks and actor calls running then may go on
    finishing (their nested ``get``s answered, their output printed) before they are
    killed."""
    return _number("MINIRAY_EXIT_GRACE_S", float, 0.0, 0.5)


def _positive_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}.") from None
    if not parsed > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return parsed


def heartbeat_s() -> float:
    """``MINIRAY_HEARTBEAT_S`` (default 1.0): how often a member node sends the head a
    heartbeat with its available resources."""
    return _positive_float("MINIRAY_HEARTBEAT_S", 1.0)


def node_dead_after_s() -> float:
    """``MINIRAY_NODE_DEAD_AFTER_S`` (default 5.0): a member without a heartbeat for this long
    is declared dead by the head (a closed link: after a short grace instead)."""
    return _positive_float("MINIRAY_NODE_DEAD_AFTER_S", 5.0)


def state_node_timeout_s() -> float:
    """``MINIRAY_STATE_NODE_TIMEOUT_S`` (default 5.0): how long a placement-group listing
    (``ray.util.state``, ``miniray list placement-groups``) waits for the other nodes of
    the cluster; a node that has not answered by then is left out, named."""
    return _positive_float("MINIRAY_STATE_NODE_TIMEOUT_S", 5.0)


def test_die_after_keep_reserve() -> str | None:
    """``MINIRAY_TEST_DIE_AFTER_KEEP_RESERVE`` (tests only): a marker file's path; the
    remote worker that reserves room for a kept result first after it exists removes it
    and SIGKILLs itself before writing (``worker_api.payload_for``). Unset: None."""
    return os.environ.get("MINIRAY_TEST_DIE_AFTER_KEEP_RESERVE") or None


def test_actor_cancel_gate() -> str | None:
    """``MINIRAY_TEST_ACTOR_CANCEL_GATE`` (tests only): a file's path; an actor's process
    handles each CANCEL it reads only once that file exists (at most 60 s later), so that a
    test can have the cancel reach it after the call has ended (``worker_main``). Read from
    the actor's own environment (its ``runtime_env``'s ``env_vars``). Unset: None."""
    return os.environ.get("MINIRAY_TEST_ACTOR_CANCEL_GATE") or None


def kept_bytes_per_driver(shm_dir_bytes: int) -> int:
    """``MINIRAY_KEPT_BYTES_PER_DRIVER``: how many bytes of task results a node keeps in its
    shm dir for one remote driver's link (docs/remote-objects.md); past it, a result is sent
    to the driver at once. Read by the node. Default: a quarter of the shm dir's size
    (``shm_dir_bytes``); 0: nothing is kept, every result is sent at once."""
    value = os.environ.get("MINIRAY_KEPT_BYTES_PER_DRIVER")
    if not value:
        return max(0, shm_dir_bytes // 4)
    try:
        parsed = int(value)
    except ValueError:
        raise ValueError(f"MINIRAY_KEPT_BYTES_PER_DRIVER must be a number of bytes, got "
                         f"{value!r}.") from None
    if parsed < 0:
        raise ValueError(f"MINIRAY_KEPT_BYTES_PER_DRIVER must be >= 0, got {value!r}.")
    return parsed


def peer_mac_threads() -> int:
    """``MINIRAY_PEER_MAC_THREADS``: how many threads of a process hash a large value's
    frames between hosts (``transport/mac_pool.py``). Default ``min(4, usable CPUs - 1)``;
    0: none, each connection's own thread hashes what it sends and receives. A bad value
    falls back to the default."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return _number("MINIRAY_PEER_MAC_THREADS", int, 0, max(0, min(4, cpus - 1)))
