"""What waits for resources, and the one line that says so: pure decisions, no processes.

Owns: tracking how long each queue of tasks (its head) and each actor waiting for placement
has waited (``WaitTracker.observe``), which resource shapes are due for a notice (waited past
the threshold, not noticed within the repeat interval: ``WaitTracker.due``), whether the wait
is only a backlog behind this driver's own leases of the same shape (then nothing is said),
the notice's wording (``format_notice``), and the demands a driver publishes for ``miniray
status -v`` (``demands``).
Does not own: sampling the owner's queues (``owner/waiting.py``, once a second on the I/O
thread) or reading the ledger's leases (passed in as plain data).

Ray prints nothing while a task waits for resources; miniray prints one stderr line per
shape, at most every ``REPEAT_S``, naming what holds the resources the shape needs: each
holder's leases (their shapes and tags) and whether the holder is this driver or another
driver of the node (README, "Differences from Ray").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Sequence

__all__ = ["Entry", "Holder", "WaitTracker", "demands", "format_notice", "shape_text"]

REPEAT_S = 30.0  # a shape still waiting is named again at most this often
MAX_NAMES = 3  # function or actor names listed per shape; the rest are counted


@dataclass(frozen=True)
class Entry:
    """One thing that waits, as sampled: a scheduling key's queue (``head`` is the id of the
    task at its front, ``count`` its length) or an actor waiting for placement."""

    key: Hashable
    head: Hashable
    count: int
    shape: tuple  # ((resource, amount), ...) sorted, amounts as floats
    name: str  # the head's function name, or "actor <Class>"


@dataclass(frozen=True)
class Holder:
    """One lease of the ledger, as the notice shows it."""

    pid: int  # the holder (a driver)
    shape: tuple  # ((resource, amount), ...) sorted, amounts as floats
    tag: str  # what it runs ("CPU=1", "actor A", ...)


def shape_text(shape: Iterable) -> str:
    """``CPU=1, GPU=0.5``; ``(no resources)`` for an empty shape."""
    return ", ".join(f"{name}={amount:g}" for name, amount in shape) or "(no resources)"


@dataclass
class _Wait:
    head: Hashable
    since: float


@dataclass
class WaitTracker:
    """Waits per entry key (since when its head has not moved), and notices per shape.

    An entry whose head changed since the last sample made progress: its wait restarts. An
    entry absent from a sample is no longer waiting and is forgotten."""

    threshold_s: float
    repeat_s: float = REPEAT_S
    _waits: dict = field(default_factory=dict)
    _noticed: dict = field(default_factory=dict)  # shape -> when it was last named

    def observe(self, now: float, entries: Sequence[Entry]) -> None:
        waits = {}
        for entry in entries:
            old = self._waits.get(entry.key)
            waits[entry.key] = old if old is not None and old.head == entry.head \
                else _Wait(entry.head, now)
        self._waits = waits
        waiting_shapes = {entry.shape for entry in entries}
        self._noticed = {s: t for s, t in self._noticed.items() if s in waiting_shapes}

    def due(self, now: float, entries: Sequence[Entry]) -> list[tuple[tuple, int, list, float]]:
        """The shapes to name now, as (shape, count, names, waited seconds), and marks them
        named. A shape is due when one of its entries has waited ``threshold_s`` (0 or less:
        never) and the shape was not named within ``repeat_s``."""
        if self.threshold_s <= 0:
            return []
        by_shape: dict[tuple, list[Entry]] = {}
        for entry in entries:
            by_shape.setdefault(entry.shape, []).append(entry)
        out = []
        for shape, group in by_shape.items():
            waited = max(now - self._waits[e.key].since for e in group if e.key in self._waits)
            if waited < self.threshold_s:
                continue
            last = self._noticed.get(shape)
            if last is not None and now - last < self.repeat_s:
                continue
            self._noticed[shape] = now
            names: list[str] = []
            for entry in group:
                if entry.name not in names:
                    names.append(entry.name)
            out.append((shape, sum(e.count for e in group), names, waited))
        return out


def _needs(shape: tuple) -> set:
    return {name for name, amount in shape if amount > 0}


def relevant_holders(shape: tuple, holders: Sequence[Holder]) -> list[Holder]:
    """The leases that hold some of what ``shape`` needs."""
    needs = _needs(shape)
    return [h for h in holders if needs & {name for name, amount in h.shape if amount > 0}]


def only_own_backlog(shape: tuple, holders: Sequence[Holder], own_pid: int) -> bool:
    """True when every lease holding what ``shape`` needs is this driver's lease for tasks
    of this very shape: the queue is a backlog behind its own running tasks, no news."""
    held = relevant_holders(shape, holders)
    tag = task_tag(shape)
    return bool(held) and all(h.pid == own_pid and h.tag == tag for h in held)


def task_tag(shape: Iterable) -> str:
    """The ledger's tag of a task lease of ``shape`` (``scheduling.key_tag``'s text)."""
    return ",".join(f"{name}={amount:g}" for name, amount in shape)


def format_notice(shape: tuple, count: int, names: Sequence[str], waited_s: float,
                  holders: Sequence[Holder], own_pid: int, env_name: str,
                  service_pid: int | None = None) -> str:
    """The one line: what waits (count, names, shape, for how long) and what holds the
    resources it needs, by holder (this driver first), then lease shape and tag.
    ``service_pid`` is the node's actor service (named and detached actors), if known."""
    shown = ", ".join(names[:MAX_NAMES]) + (
        f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")
    needs = ", ".join(sorted(_needs(shape))) or "nothing"
    head = (f"miniray: {count} task(s)/actor(s) ({shown}) have waited {waited_s:.0f}s for "
            f"{{{shape_text(shape)}}}; ")
    held = relevant_holders(shape, holders)
    if not _needs(shape):
        body = "they need no resources: they wait for a worker (MINIRAY_MAX_WORKERS caps them)"
    elif not held:
        body = f"no lease holds {needs} now (waiting for a worker or for the ledger)"
    else:
        by_holder: dict[int, dict[tuple, int]] = {}
        for h in held:
            leases = by_holder.setdefault(h.pid, {})
            leases[(h.shape, h.tag)] = leases.get((h.shape, h.tag), 0) + 1
        parts = []
        for pid in sorted(by_holder, key=lambda p: (p != own_pid, p)):
            who = (f"this driver (pid {pid})" if pid == own_pid
                   else f"the node's actor service (pid {pid})" if pid == service_pid
                   else f"another driver (pid {pid})")
            leases = []
            for (lease_shape, tag), n in sorted(by_holder[pid].items(), key=lambda kv: kv[0][1]):
                what = f" [{tag}]" if tag and tag != task_tag(lease_shape) else ""
                plural = "lease" if n == 1 else "leases"
                leases.append(f"{n} {plural} {{{shape_text(lease_shape)}}}{what}")
            parts.append(f"{who}: {', '.join(leases)}")
        body = f"{needs} held by " + "; ".join(parts)
    return head + body + f". ({env_name}: seconds before this is printed; 0 turns it off.)"


def demands(entries: Iterable[tuple[str, tuple, bool, int]]) -> list[list[Any]]:
    """What a driver publishes for ``miniray status -v``: ``[name, shape text, count,
    infeasible]`` per function (or actor) name and shape, from ``(name, shape, infeasible,
    count)`` items; most numerous first."""
    counts: dict[tuple, int] = {}
    for name, shape, infeasible, n in entries:
        key = (name, shape, bool(infeasible))
        counts[key] = counts.get(key, 0) + n
    rows = [[name, shape_text(shape), n, infeasible]
            for (name, shape, infeasible), n in counts.items()]
    rows.sort(key=lambda r: (-r[2], r[0], r[1]))
    return rows
