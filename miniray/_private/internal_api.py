"""``ray._private.internal_api``: the one function of Ray's private module that programs
use, ``memory_summary`` (benchmarks print or parse its "Plasma memory usage" line; Ray's
own tests look for "Spilled" in it).

Owns: nothing but the mapping of Ray's arguments onto ``state_api.memory``, which gathers
and lays out the report ``miniray memory`` prints.

Example:
    >>> ref = ray.put(b"x" * (1 << 20))
    >>> line = ray._private.internal_api.memory_summary(stats_only=True).splitlines()[1]
    >>> line.startswith("Plasma memory usage 1 MiB, 1 objects, ") and line.endswith("needed")
    True
"""

from __future__ import annotations

from miniray._private import state_api

__all__ = ["memory_summary"]


def memory_summary(address: str | None = None, group_by: str = "NODE_ADDRESS",
                   sort_by: str = "OBJECT_SIZE", units: str = "B", line_wrap: bool = True,
                   stats_only: bool = False, num_entries: int | None = None) -> str:
    """The text ``ray memory`` prints for the session ``address`` names (None: this
    process's own): each driver's references with their sizes, then the stores' totals;
    with ``stats_only``, the totals alone. ``line_wrap`` is accepted and changes nothing:
    rows are never wrapped here. ValueError names a bad option; ConnectionError, a session
    with no live driver."""
    del line_wrap  # Ray wraps long rows on narrow terminals; these rows are fixed-width
    text = state_api.memory(address, group_by=group_by, sort_by=sort_by, units=units,
                            stats_only=stats_only, num_entries=num_entries)
    if text is None:
        raise ConnectionError("no miniray driver is running in that session: call "
                              "ray.init() first, or name a live session or node as "
                              "address.")
    return text
