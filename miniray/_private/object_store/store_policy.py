"""Pure decisions of the shared-memory object store: what to spill, drop, reuse or recycle.

Owns: the rules, as functions from numbers to choices, so they are tested without files or
processes. Does not own: the table they are applied to, or any I/O (``shm_store.py`` calls
these under its lock and acts on the answer after releasing it).
Called by: shm_store.py.

Room is made in this order, cheapest first::

    need > capacity - used - pooled ?
      1. drop recycled segments (pooled: free memory kept for reuse), oldest first
      2. spill objects that are neither pinned nor moving, least recently used first
      3. still short: the put fails (ObjectStoreFullError); an adoption (a worker's segment,
         whose bytes already exist) spills what it can and goes over

Above ``HIGH_USAGE`` of the capacity, Python's garbage collector is run in the driver and its
workers (``global_gc_due``, at most once per ``GLOBAL_GC_MIN_INTERVAL_S``, Ray's
``high_plasma_storage_usage`` and ``global_gc_min_interval_s``): refs held only by reference
cycles (in a worker that disabled ``gc``, or between its automatic passes) then let their
objects go before anything has to be spilled.

An object larger than the whole capacity (``oversized``) never fits: as Ray 2.60 does (its
"fallback allocation"), it is stored anyway, straight into the spill directory, and nothing
else is spilled for it; the first one logs a warning naming both sizes
(``oversized_message``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "default_recycle_bytes", "full_message", "global_gc_due", "may_recycle", "oversized",
    "oversized_message", "pick_reusable", "plan_room",
]  # fmt: skip

HIGH_USAGE = 0.7  # Ray's high_plasma_storage_usage
GLOBAL_GC_MIN_INTERVAL_S = 30.0  # Ray's global_gc_min_interval_s

# Most recycled segments kept: each holds a mapping and (inside Python's mmap) a descriptor.
POOL_MAX_SEGMENTS = 16
_REUSE_SLACK = 64 * 1024  # a recycled segment may exceed the need by 25% plus this


def plan_room(
    need: int,
    capacity: int,
    used: int,
    pooled: list[tuple[Any, int]],
    candidates: list[tuple[Any, int]],
    allow_over: bool = False,
) -> tuple[list, list] | None:
    """What to give up so that ``need`` more bytes fit under ``capacity``.

    ``used`` counts objects in memory; ``pooled`` are ``(key, size)`` of recycled segments,
    oldest first; ``candidates`` are ``(key, size)`` of spillable objects, least recently
    used first. Returns ``(pooled keys to drop, candidate keys to spill)``, or None when even
    spilling every candidate leaves too little room; with ``allow_over`` it returns all it
    could free instead.

    Example:
        >>> plan_room(60, 100, 80, [("p", 10)], [("a", 30), ("b", 30)])
        (['p'], ['a', 'b'])
    """
    excess = used + sum(size for _, size in pooled) + need - capacity
    drops: list = []
    spills: list = []
    for key, size in pooled:
        if excess <= 0:
            break
        drops.append(key)
        excess -= size
    for key, size in candidates:
        if excess <= 0:
            break
        spills.append(key)
        excess -= size
    if excess > 0 and not allow_over:
        return None
    return drops, spills


def pick_reusable(need: int, pooled: list[tuple[Any, int]]) -> Any | None:
    """The key of the smallest pooled segment that holds ``need`` bytes without wasting more
    than a quarter (plus 64 KiB) of it, or None."""
    limit = need + need // 4 + _REUSE_SLACK
    fits = [(size, i) for i, (_, size) in enumerate(pooled) if need <= size <= limit]
    return pooled[min(fits)[1]][0] if fits else None


def may_recycle(
    size: int, *, used: int, pooled: int, pooled_count: int, capacity: int, recycle_bytes: int
) -> bool:
    """Whether a freed segment of ``size`` bytes may be kept for reuse: the pool stays under
    its byte and count limits, and everything together under the capacity."""
    return (
        pooled + size <= recycle_bytes
        and pooled_count < POOL_MAX_SEGMENTS
        and used + pooled + size <= capacity
    )


# Writing into fresh tmpfs pages runs at about 1.5-2.5 GB/s here (page allocation), into
# pages that already exist near memcpy speed (benchmarks/RESULTS.md, 2026-11-24).
_FRESH_WRITE_BPS = 2.5e9
DRAIN_WAIT_MAX_S = 0.02


def drain_wait_s(size: int) -> float:
    """How long a put of ``size`` bytes may wait for a pooled segment that a reader is about
    to let go of (a worker unmapping its argument on the owner's UNMAP) rather than write
    into fresh pages: a fifth of what the fresh pages would cost, at most 20 ms."""
    return min(DRAIN_WAIT_MAX_S, size / _FRESH_WRITE_BPS / 5)


def default_recycle_bytes(capacity: int) -> int:
    """A quarter of the capacity, at most 1 GiB: enough to reuse the segments of a loop of
    large puts, little enough that idle memory stays small."""
    return min(capacity // 4, 1 << 30)


def full_message(object_hex: str, size: int, used: int, capacity: int, pinned: int, busy: int):
    """The text of ObjectStoreFullError when nothing more can be spilled."""
    return (
        f"Cannot store object {object_hex} of {_mib(size)}: {_mib(used)} of the "
        f"{_mib(capacity)} object store capacity is in use, {_mib(pinned)} of it by objects "
        f"being read (pinned) and {_mib(busy)} by objects being written or moved, and nothing "
        "else can be spilled. Raise object_store_memory in init() or free ObjectRefs you no "
        "longer need."
    )


def global_gc_due(used: int, capacity: int, now: float, last: float | None) -> bool:
    """Whether a collection is due: the store holds more than ``HIGH_USAGE`` of its capacity
    and none ran in the last ``GLOBAL_GC_MIN_INTERVAL_S`` (``last``: when the last one was
    asked, None before the first).

    Example:
        >>> global_gc_due(80, 100, 5.0, None), global_gc_due(60, 100, 5.0, None)
        (True, False)
        >>> global_gc_due(80, 100, 20.0, 5.0), global_gc_due(80, 100, 35.0, 5.0)
        (False, True)
    """
    if capacity <= 0 or used <= HIGH_USAGE * capacity:
        return False
    return last is None or now - last >= GLOBAL_GC_MIN_INTERVAL_S


def oversized(size: int, capacity: int) -> bool:
    """Whether an object of ``size`` bytes can never be in memory: it is larger than the
    whole store, so spilling every other object would not make room for it.

    Example:
        >>> oversized(200 << 20, 100 << 20), oversized(100 << 20, 100 << 20)
        (True, False)
    """
    return size > capacity


def oversized_message(object_hex: str, size: int, capacity: int, spill_dir: str) -> str:
    """The one-time warning when an object larger than the whole store is kept on disk."""
    return (
        f"Object {object_hex} is {_mib(size)}, larger than the whole object store "
        f"({_mib(capacity)}, object_store_memory), so it is stored on disk in {spill_dir} and "
        "read from there (slower). Later objects larger than the store are stored the same "
        "way without this warning. Raise object_store_memory in init() to keep such objects "
        "in memory."
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
