"""What this host offers: usable cores, available memory, free /dev/shm, GPUs, and from them a
node's resource totals.

Owns: ``node_resources`` (a node's totals and GPU identity, as ``init()`` and ``miniray start``
compute them) and the host probes it reads. Does not own: who holds what (``ledger.py``) or
the resource arithmetic (``core/resources.py``).
Called by: ``runtime.py`` (an embedded driver) and ``node/node.py`` (``miniray start``);
``owner/memory_watch.py`` reads ``memory_usage``.
"""

from __future__ import annotations

import logging
import os

from miniray._private.core import config
from miniray._private.core.resources import node_totals

logger = logging.getLogger("miniray")


def cpu_count() -> int:
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:  # cgroup v2 quota
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            count = min(count, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return count


def _meminfo(field: str) -> int | None:
    """``field`` of /proc/meminfo (e.g. ``"MemTotal"``) in bytes, or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def memory_available() -> int:
    available = _meminfo("MemAvailable")
    return 8 << 30 if available is None else available


def host_memory() -> int | None:
    """The memory this host (or its cgroup limit) has in all, or None if unknown."""
    total = _meminfo("MemTotal")
    limit = _cgroup_memory_limit()  # as Ray's get_system_memory
    if limit is not None:
        total = limit if total is None else min(total, limit)
    return total


def _cgroup_memory_limit() -> int | None:
    """This process's cgroup v2 memory limit in bytes, or None when it has none."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        return None if limit == "max" else int(limit)
    except (OSError, ValueError):
        return None


def memory_usage() -> tuple[int, int] | None:
    """(bytes used, bytes in all) of this host's memory as the memory monitor sees it: the
    host's total less what it has available, or its cgroup's use (less the inactive file
    cache, which the kernel reclaims first) against the cgroup's limit when that is lower.
    None when /proc/meminfo cannot be read."""
    total, available = _meminfo("MemTotal"), _meminfo("MemAvailable")
    if total is None or available is None:
        return None
    limit = _cgroup_memory_limit()
    if limit is not None and limit < total:
        try:
            with open("/sys/fs/cgroup/memory.current") as f:
                current = int(f.read())
            inactive = 0
            with open("/sys/fs/cgroup/memory.stat") as f:
                for line in f:
                    if line.startswith("inactive_file "):
                        inactive = int(line.split()[1])
            return max(0, current - inactive), limit
        except (OSError, ValueError):
            pass
    return total - available, total


def shm_free() -> int | None:
    try:
        st = os.statvfs(config.shm_dir())
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def node_resources(num_cpus, num_gpus, resources, object_store_memory,
                   node_ip: str = "127.0.0.1") -> dict:
    """A node's totals and GPU identity, as ``init()`` and ``miniray start`` compute them.

    ``num_cpus`` None means the usable cores. GPUs: NVML detection, capped and named by
    ``CUDA_VISIBLE_DEVICES``; an explicit ``num_gpus`` overrides the count. Returns
    ``{"totals", "gpu_ids", "gpu_ids_are_ints", "gpu_keys", "accelerator_type",
    "object_store_memory"}``; ValueError as Ray's for a ``num_gpus`` above the visible devices.
    """
    if num_cpus is None:
        num_cpus = cpu_count()
    # Lazy: GPU detection (and NVML) loads at the first init() or `miniray start`, never at
    # `import miniray`.
    from miniray._private.ledger.gpu_detect import detect_gpus, parse_visible_devices

    inventory = detect_gpus()
    cvd = parse_visible_devices(config.cuda_visible_devices())
    if num_gpus is None:
        num_gpus = inventory.count
    elif cvd is not None and num_gpus > len(cvd):
        raise ValueError(
            f"Attempting to start raylet with {num_gpus} GPU, but CUDA_VISIBLE_DEVICES "
            f"contains {cvd}."
        )
    num_gpus = int(num_gpus)
    # Device ids: the detected ones first (named by CUDA_VISIBLE_DEVICES when it is set),
    # then logical ones (num_gpus may exceed the hardware: resources are logical).
    gpu_ids = list(inventory.ids[:num_gpus])
    spare = cvd if cvd is not None else [str(i) for i in range(num_gpus)]
    for gpu_id in spare:
        if len(gpu_ids) >= num_gpus:
            break
        if gpu_id not in gpu_ids:
            gpu_ids.append(gpu_id)
    gpu_ids_are_ints = cvd is None and all(i.isdigit() for i in gpu_ids)
    gpu_keys = [inventory.key_of(i) if i in inventory.ids else None for i in gpu_ids]
    accelerator_type = inventory.accelerator_type if num_gpus else None
    resources = dict(resources or {})
    if accelerator_type and inventory.count:
        resources.setdefault(f"accelerator_type:{accelerator_type}", 1)
    available = memory_available()
    if object_store_memory is None:
        object_store_memory = int(available * 0.3)
        shm = shm_free()
        if shm is not None:
            object_store_memory = min(object_store_memory, int(shm * 0.95))
        object_store_memory = min(object_store_memory, 200 * (1 << 30))
        logger.debug("object store capacity %d bytes (RAM available %d, /dev/shm free %s)",
                     object_store_memory, available, shm)
    memory = max(0, int(available - object_store_memory))
    totals = node_totals(num_cpus, num_gpus, resources, memory,
                         int(object_store_memory), node_ip)
    return {
        "totals": totals, "gpu_ids": gpu_ids, "gpu_ids_are_ints": gpu_ids_are_ints,
        "gpu_keys": gpu_keys, "accelerator_type": accelerator_type,
        "object_store_memory": int(object_store_memory),
    }
