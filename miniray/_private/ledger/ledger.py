"""The node's resource ledger: one JSON file, replaced atomically under a file lock.

Owns: reading, applying and writing ``<session>/ledger.json`` (totals, GPU instance ids and
leases) and the lock ``ledger.json.lock``. Does not own: decisions (what fits, which GPU,
what is infeasible) -- those are pure functions in ``resources.py`` -- nor processes: it only
*reads* ``/proc`` (``procinfo``) to tell whether a lease's holder is still alive.

::

    driver / owner ──acquire/release/adjust──┐        (read-modify-write, under the lock)
    worker (get() gives its CPU back) ───────┤
                                             ▼
          ledger.json.lock  (flock(2), exclusive: the lock filelock.FileLock takes)
                                             │ held for: read → decide (resources.py) → write
                                             ▼
      ledger.json.tmp ──os.replace──► ledger.json ◄── snapshot()/available()/statistics()
      (written in full, same dir)     (always whole)    (lock-free readers: workers'
                                                        available_resources(), miniray status)

Writers take the lock, read the file, let ``resources.py`` decide, write the whole new state
to ``ledger.json.tmp`` in the same directory and ``os.replace`` it over ``ledger.json``. The
rename is atomic, so a reader opening ``ledger.json`` sees either the old or the new file,
never a torn one; that is why read-only callers skip the lock. A writer that dies mid-write
leaves at most a stale ``.tmp`` file, which the next writer (holding the lock) truncates;
the lock itself is released by the kernel when the holder dies. There is no fsync: the ledger
lives in a session directory that does not outlive the machine's uptime.

Within one process a ``threading.Lock`` serialises threads before they take the file lock, and
a ``Ledger`` used after ``fork()`` rebuilds both locks, since neither may cross a fork.

A request that does not fit while other processes hold leases touches ``ledger.json.wants``
(after the lock; it decides nothing): sessions keeping idle leases for reuse see its time
(``others_waiting``, one ``stat``) and give them back at once instead of after their keep.

Leases whose holder process died (pid gone, a zombie, or the pid now names a different process
as its start time shows) are reclaimed by the next ``acquire`` that finds the ledger short, or
by ``reclaim_dead()``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from miniray._private.core.resources import (
    _UNIT_INSTANCE_SET,
    UNIT,
    Lease,
    NodeState,
    from_units,
    plan_allocation,
    plan_group,
    to_units,
)
from miniray._private.host import procinfo
from miniray._private.ledger.flock import KeptFlock, open_lock_file

__all__ = ["Ledger"]

logger = logging.getLogger(__name__)

# Every write starts the file with a fresh random token, so the first bytes name the version:
# a process whose cached parse carries the same token skips parsing (see Ledger._load).
_WRITER_KEY = b'{"writer":"'
_PREFIX_LEN = len(_WRITER_KEY) + 16 + 1  # the key, 16 hex digits, the closing quote


def _dumps(state: NodeState) -> tuple[bytes, bytes]:
    """The file's bytes for ``state`` and their version prefix."""
    doc = {"writer": os.urandom(8).hex(), **state.to_json()}
    data = json.dumps(doc, separators=(",", ":")).encode()
    return data, data[:_PREFIX_LEN]


def _units_from_floats(amounts: Mapping[str, float], what: str) -> dict[str, int]:
    units: dict[str, int] = {}
    for name, amount in amounts.items():
        u = to_units(float(amount))
        if u < 0:
            raise ValueError(f"{what} {name!r} must be >= 0, got {amount!r}")
        if u:
            units[name] = u
    return units


class Ledger:
    """A process's handle on the node's ledger file.

    Cheap to create. It keeps one descriptor open, on the lock file, from the first
    transaction until ``close()`` or garbage collection. Safe to share between threads.

    Example:
        >>> led = Ledger.create(path, {"CPU": 2, "GPU": 1}, {"GPU": ["0"]})  # doctest: +SKIP
        >>> lease = led.acquire({"CPU": 1, "GPU": 0.5}, holder_pid=os.getpid())  # doctest: +SKIP
        >>> led.instance_ids_of(lease)  # doctest: +SKIP
        ['0']
        >>> led.release(lease.lease_id)  # doctest: +SKIP
        True
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._tmp_path = self._path + ".tmp"
        self._lock_path = self._path + ".lock"
        # Touched by a session whose request did not fit while other sessions held leases:
        # holders keeping idle leases for reuse give them back sooner (``others_waiting``).
        self._wants_path = self._path + ".wants"
        self._my_want_ns = 0
        self._cache: tuple[bytes, NodeState] | None = None
        self._loaded_prefix: bytes | None = None
        self._flock = KeptFlock(self._lock_path)
        # Totals and instance ids never change after create(), so read them once.
        try:
            static = self._read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"miniray: no resource ledger at {self._path}; the session it belonged to has "
                "ended or was never started"
            ) from None
        self._totals = dict(static.totals)
        self._instance_ids = {k: list(v) for k, v in static.instance_ids.items()}

    def close(self) -> None:
        """Closes the lock file's descriptor (reopened if the ledger is used again)."""
        self._flock.close()

    # -- creation ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        totals: Mapping[str, float],
        instance_ids: Mapping[str, list[str]],
    ) -> Ledger:
        """Writes a new ledger with no leases and returns a handle on it.

        ``totals`` are floats; each unit-instance resource in it (``GPU``, ...) must be a whole
        number equal to the number of its ``instance_ids`` (ids default to ``"0".."n-1"`` when
        the name is missing from ``instance_ids``). Raises ValueError when they disagree and
        FileExistsError when a ledger is already there.
        """
        path = os.fspath(path)
        units = _units_from_floats(totals, "total")
        ids: dict[str, list[str]] = {}
        for name, given in instance_ids.items():
            if name not in _UNIT_INSTANCE_SET:
                raise ValueError(f"{name!r} is not a unit-instance resource; it has no instances")
            if given and name not in units:
                raise ValueError(f"instance ids given for {name!r}, which has no total")
        for name, u in units.items():
            if name not in _UNIT_INSTANCE_SET:
                continue
            if u % UNIT:
                raise ValueError(f"total {name} must be a whole number, got {from_units(u)}")
            n = u // UNIT
            names = [str(x) for x in instance_ids.get(name, [str(i) for i in range(n)])]
            if len(names) != n:
                raise ValueError(
                    f"total {name} is {n} but {len(names)} instance ids were given: {names}"
                )
            if len(set(names)) != n:
                raise ValueError(f"duplicate {name} instance ids: {names}")
            ids[name] = names
        state = NodeState(totals=units, instance_ids=ids, leases={})
        data, _ = _dumps(state)
        with _flocked(path + ".lock"):
            if os.path.exists(path):
                raise FileExistsError(f"a resource ledger already exists at {path}")
            _write_atomic(path, path + ".tmp", data)
        return cls(path)

    # -- locking and file I/O ---------------------------------------------------------------

    def _locked(self):
        return self._flock.held()

    def _read(self) -> NodeState:
        return NodeState.from_json(json.loads(_read_file(self._path)))

    # Under the lock, a transaction is _load, decide, then _write (changed) or _keep (not).
    # The parsed state of the last version this instance saw is cached with the version's
    # prefix, so a process that wrote last (the usual case: the owner) skips parsing. The
    # cache is cleared while a transaction may mutate the state, so an exception midway
    # leaves nothing stale behind.

    def _load(self) -> NodeState:
        cached, self._cache = self._cache, None
        raw = _read_file(self._path)
        prefix = raw[:_PREFIX_LEN]
        self._loaded_prefix = prefix if prefix.startswith(_WRITER_KEY) else None
        if cached is not None and cached[0] == prefix:
            return cached[1]
        return NodeState.from_json(json.loads(raw))

    def _keep(self, state: NodeState) -> None:
        if self._loaded_prefix is not None:
            self._cache = (self._loaded_prefix, state)

    def _commit(self, state: NodeState, changed) -> None:
        """*Under the lock.* End a transaction: write ``state`` if it ``changed`` (truthy),
        else only keep the parse for the next reader of the same version."""
        if changed:
            self._write(state)
        else:
            self._keep(state)

    def _write(self, state: NodeState) -> None:
        data, prefix = _dumps(state)
        _write_atomic(self._path, self._tmp_path, data)
        self._cache = (prefix, state)

    @staticmethod
    def _pop_dead(state: NodeState) -> list[Lease]:
        alive: dict[tuple[int, int | None], bool] = {}
        dead = []
        for lease in list(state.leases.values()):
            key = (lease.holder_pid, lease.holder_start)
            if key not in alive:
                alive[key] = procinfo.is_alive(*key)
            if not alive[key]:
                dead.append(state.leases.pop(lease.lease_id))
        return dead

    @staticmethod
    def _log_reclaimed(dead: list[Lease]) -> None:
        for lease in dead:
            logger.debug(
                "reclaimed lease %s of dead holder pid %d (%s): %s",
                lease.lease_id,
                lease.holder_pid,
                lease.tag,
                lease.resources,
            )

    # -- waiting sessions ---------------------------------------------------------------------

    def _note_want(self) -> None:
        """A request of this process did not fit while other processes held leases: say so
        by touching ``ledger.json.wants`` (after the lock: it decides nothing)."""
        now = time.time_ns()
        try:
            os.utime(self._wants_path, ns=(now, now))
        except FileNotFoundError:
            try:
                os.close(os.open(self._wants_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                                 0o644))
                os.utime(self._wants_path, ns=(now, now))
            except OSError:
                return
        except OSError:
            return
        self._my_want_ns = now

    def others_waiting(self, within_s: float) -> bool:
        """Whether another process found no room in the last ``within_s`` seconds while
        others held leases (one ``stat``; no lock)."""
        try:
            touched = os.stat(self._wants_path).st_mtime_ns
        except OSError:
            return False
        return touched != self._my_want_ns and time.time_ns() - touched < within_s * 1e9

    # -- transactions -----------------------------------------------------------------------

    def acquire(
        self,
        request: Mapping[str, float],
        *,
        holder_pid: int,
        worker_pid: int | None = None,
        tag: str = "",
        instance_caps: Mapping[str, list[int]] | None = None,
        wanted: bool = True,
    ) -> Lease | None:
        """Takes ``request`` from the ledger, or returns None if it does not fit now.

        If it does not fit, leases of dead holders are reclaimed and the request is tried once
        more. Raises ValueError for an invalid request (see ``resources.plan_allocation``).
        ``instance_caps`` caps each instance further (see ``plan_allocation``). ``wanted``
        False: a lease taken ahead of need, whose failure is not noted as a want (other
        sessions keep their idle leases).
        """
        holder_start = procinfo.holder_start(holder_pid)
        lease_id = os.urandom(8).hex()
        dead: list[Lease] = []
        with self._locked():
            state = self._load()
            alloc = plan_allocation(state, request, instance_caps)
            if alloc is None:
                dead = self._pop_dead(state)
                if dead:
                    alloc = plan_allocation(state, request, instance_caps)
            lease = None
            if alloc is not None:
                lease = Lease(
                    lease_id=lease_id,
                    holder_pid=holder_pid,
                    holder_start=holder_start,
                    worker_pid=worker_pid,
                    resources=dict(alloc.resources),
                    instances={k: list(v) for k, v in alloc.instances.items()},
                    tag=tag,
                )
                # The state (cached) and the caller each get their own copy.
                state.leases[lease_id] = Lease.from_json(lease.to_json())
            others_hold = wanted and lease is None and _held_by_others(state, holder_pid)
            self._commit(state, lease is not None or dead)
        self._log_reclaimed(dead)
        if others_hold:
            self._note_want()
        return lease

    def acquire_group(
        self,
        bundles: list[Mapping[str, float]],
        group: dict[str, Any],
        provides: Mapping[str, float],
        *,
        holder_pid: int,
        instance_caps: Mapping[str, list[int]] | None = None,
        indexes: list[int] | None = None,
    ) -> Lease | None:
        """Reserves a placement group: one lease taking the ``bundles`` (packed bundle by
        bundle, ``resources.plan_group``) and providing the derived resources ``provides``
        (``placement.bundle_provides``), recorded with ``group`` (its ``id`` hex, name,
        bundles...). ``indexes``: the group's index of each of ``bundles`` when this node
        holds only some (the others are on other nodes); None: all, by position. None if it
        does not fit now (after reclaiming dead holders' leases)."""
        holder_start = procinfo.holder_start(holder_pid)
        lease_id = os.urandom(8).hex()
        dead: list[Lease] = []
        pg_hex = group["id"]
        provided = _units_from_floats(provides, "derived amount")
        with self._locked():
            state = self._load()
            if pg_hex in state.groups():
                self._keep(state)
                raise ValueError(f"placement group {pg_hex} is already reserved")
            plan = plan_group(state, list(bundles), instance_caps)
            if plan is None:
                dead = self._pop_dead(state)
                if dead:
                    plan = plan_group(state, list(bundles), instance_caps)
            lease = None
            if plan is not None:
                alloc, per_bundle = plan
                bundle_instances = {}
                numbers = indexes if indexes is not None else range(len(per_bundle))
                for index, picked in zip(numbers, per_bundle):
                    for name, inst in picked.items():
                        bundle_instances[f"{name}_group_{index}_{pg_hex}"] = list(inst)
                lease = Lease(
                    lease_id=lease_id, holder_pid=holder_pid, holder_start=holder_start,
                    worker_pid=None, resources=dict(alloc.resources),
                    instances={k: list(v) for k, v in alloc.instances.items()},
                    tag=f"placement group {group.get('name') or pg_hex}",
                    provides=provided, provides_instances=bundle_instances, group=dict(group),
                )
                state.leases[lease_id] = Lease.from_json(lease.to_json())
            others_hold = lease is None and _held_by_others(state, holder_pid)
            self._commit(state, lease is not None or dead)
        self._log_reclaimed(dead)
        if others_hold:
            self._note_want()
        return lease

    def grow_group(
        self,
        pg_hex: str,
        bundles: list[Mapping[str, float]],
        provides: Mapping[str, float],
        *,
        indexes: list[int],
        fields: Mapping[str, Any] | None = None,
    ) -> bool:
        """Adds bundles to a reserved group's lease: ``bundles`` (the group's numbers
        ``indexes``) whose node died are held here now, packed as ``acquire_group`` packs
        them, their derived resources ``provides`` added to the group's, and ``fields``
        set in its record (the bundles' nodes) in the same write. False, nothing changed,
        if the group is not reserved or they do not fit now."""
        provided = _units_from_floats(provides, "derived amount")
        with self._locked():
            state = self._load()
            lease = state.groups().get(pg_hex)
            plan = None if lease is None else plan_group(state, list(bundles))
            if plan is not None:
                alloc, per_bundle = plan
                for name, u in alloc.resources.items():
                    lease.resources[name] = lease.resources.get(name, 0) + u
                for name, picked in alloc.instances.items():
                    lease.instances.setdefault(name, []).extend(picked)
                for name, u in provided.items():
                    lease.provides[name] = lease.provides.get(name, 0) + u
                for index, picked in zip(indexes, per_bundle):
                    for name, inst in picked.items():
                        lease.provides_instances[f"{name}_group_{index}_{pg_hex}"] = list(inst)
                lease.group = {**lease.group, **(fields or {})}
            self._commit(state, plan is not None)
        return plan is not None

    def release_group(self, pg_hex: str) -> Lease | None:
        """Drops a placement group's reservation; returns its lease, None if it had none
        (never reserved, removed already, or its holder died)."""
        with self._locked():
            state = self._load()
            lease = state.groups().get(pg_hex)
            if lease is not None:
                del state.leases[lease.lease_id]
            self._commit(state, lease is not None)
        return lease

    def update_group(self, pg_hex: str, fields: Mapping[str, Any]) -> bool:
        """Changes fields of a reserved group's record (its bundles' nodes once one was
        placed again on another node); False if it is not reserved."""
        with self._locked():
            state = self._load()
            lease = state.groups().get(pg_hex)
            if lease is not None:
                lease.group = {**lease.group, **fields}
            self._commit(state, lease is not None)
        return lease is not None

    def groups(self) -> dict[str, Lease]:
        """The placement groups reserved now (lock-free read), by id hex; a group whose
        holder died is left out (its lease is reclaimed by the next writer)."""
        return {h: lease for h, lease in self.snapshot().groups().items()
                if procinfo.is_alive(lease.holder_pid, lease.holder_start)}

    def release(self, lease_id: str) -> bool:
        """Returns a lease's resources. Idempotent: False if the lease is unknown (or gone)."""
        return self.release_many((lease_id,)) == 1

    def release_many(self, lease_ids: Iterable[str]) -> int:
        """Releases several leases in one lock round trip; returns how many were known."""
        lease_ids = list(lease_ids)
        if not lease_ids:
            return 0
        with self._locked():
            state = self._load()
            n = sum(state.leases.pop(lid, None) is not None for lid in lease_ids)
            self._commit(state, n)
        return n

    def set_worker(self, lease_id: str, worker_pid: int) -> None:
        """Records the worker that runs under a lease. KeyError if the lease is unknown."""
        with self._locked():
            state = self._load()
            lease = self._lease_or_raise(state, lease_id)
            lease.worker_pid = worker_pid
            self._write(state)

    def adjust(self, lease_id: str, delta: Mapping[str, float]) -> None:
        """Adds ``delta`` to a lease's non-instance resources.

        Used when a worker blocks in ``get()`` (``{"CPU": -1}``) and resumes (``{"CPU": +1}``).
        Growing always succeeds, even past the totals, as Ray lets an unblocked worker
        oversubscribe. Raises ValueError for unit-instance resources (GPUs stay assigned) or for
        shrinking below zero, KeyError if the lease is unknown.
        """
        units: dict[str, int] = {}
        for name, amount in delta.items():
            if name in _UNIT_INSTANCE_SET:
                raise ValueError(
                    f"cannot adjust {name} of a lease: instance resources stay assigned "
                    "to the lease"
                )
            u = to_units(float(amount))
            if u:
                units[name] = u
        if not units:
            return
        with self._locked():
            state = self._load()
            lease = self._lease_or_raise(state, lease_id)
            new = dict(lease.resources)
            for name, u in units.items():
                value = new.get(name, 0) + u
                if value < 0:
                    raise ValueError(
                        f"lease {lease_id} holds {from_units(new.get(name, 0))} {name}; "
                        f"cannot give back {from_units(-u)}"
                    )
                if value:
                    new[name] = value
                else:
                    new.pop(name, None)
            lease.resources = new
            self._write(state)

    def release_holder(self, pid: int) -> int:
        """Drops every lease held by ``pid``; returns how many."""
        with self._locked():
            state = self._load()
            mine = [lid for lid, lease in state.leases.items() if lease.holder_pid == pid]
            for lid in mine:
                del state.leases[lid]
            self._commit(state, mine)
        return len(mine)

    def reclaim_dead(self) -> list[Lease]:
        """Drops the leases whose holder is no longer alive; returns them."""
        with self._locked():
            state = self._load()
            dead = self._pop_dead(state)
            self._commit(state, dead)
        self._log_reclaimed(dead)
        return dead

    @staticmethod
    def _lease_or_raise(state: NodeState, lease_id: str) -> Lease:
        try:
            return state.leases[lease_id]
        except KeyError:
            raise KeyError(f"no lease {lease_id!r} in the ledger (released or reclaimed)") from None

    # -- lock-free reads --------------------------------------------------------------------

    def snapshot(self) -> NodeState:
        """The current state, read without the lock (safe: the file is replaced atomically)."""
        return self._read()

    def totals(self) -> dict[str, float]:
        """The node's totals as floats."""
        return {k: from_units(u) for k, u in self._totals.items()}

    def capacity(self) -> dict[str, float]:
        """Ray's ``cluster_resources()``: the totals plus what placement groups provide."""
        return {k: from_units(u) for k, u in self.snapshot().capacity().items() if u > 0}

    def available(self) -> dict[str, float]:
        """What is free now, as floats, clamped at 0 with zero entries omitted, as Ray's
        ``available_resources()`` omits them."""
        return {k: from_units(u) for k, u in self.snapshot().available().items() if u > 0}

    def instance_ids_of(self, lease: Lease, name: str = "GPU") -> list[str]:
        """The device ids (e.g. ``CUDA_VISIBLE_DEVICES`` entries) of a lease's instances,
        those it holds of a placement group's bundle included (``GPU_group_0_<hex>``)."""
        ids = self._instance_ids.get(name, [])
        picked = list(lease.instances.get(name, ()))
        prefix = f"{name}_group_"
        for key, inst in lease.instances.items():
            if key.startswith(prefix):
                picked.extend(inst)
        return [ids[index] for index, _ in picked if 0 <= index < len(ids)]

    def statistics(self) -> dict[str, Any]:
        """A snapshot for ``miniray status`` and tests."""
        state = self.snapshot()
        return {
            "leases": len(state.leases),
            "holders": sorted({lease.holder_pid for lease in state.leases.values()}),
            "totals": self.totals(),
            "available": {k: from_units(u) for k, u in state.available().items() if u > 0},
            "instances": {
                name: [from_units(u) for u in state.instance_free(name)]
                for name in state.instance_ids
            },
        }

    @property
    def path(self) -> str:
        return self._path

    def __repr__(self) -> str:
        try:
            state = self.snapshot()
            avail = {k: from_units(u) for k, u in state.available().items() if u > 0}
            detail = f"leases={len(state.leases)} available={avail}"
        except (OSError, ValueError) as e:
            detail = f"unreadable ({type(e).__name__})"
        return f"<Ledger {self._path!r} {detail}>"


# The lock is an exclusive flock(2) on ``ledger.json.lock``: the same lock ``filelock.FileLock``
# takes on Unix, so a tool holding ``FileLock(path + ".lock")`` excludes ledger writers and
# vice versa. It is taken directly (filelock is not a dependency) because FileLock opens and
# closes the lock file on every acquire: 92 us per round trip against 4 us for ``KeptFlock``
# (filelock 4.2 on a 2-core machine), more than the rest of a ledger transaction. A
# blocking flock waits in the kernel (no polling), releases the GIL while it waits, and is
# dropped by the kernel if its holder dies. The lock file is never unlinked: unlinking a lock
# file breaks mutual exclusion for processes that still have the old one open.


@contextmanager
def _flocked(lock_path: str) -> Iterator[None]:
    """Holds the ledger's lock for one operation, with a descriptor of its own."""
    fd = open_lock_file(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor of this open file releases the flock


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            chunks.append(chunk)
            if len(chunk) < 1 << 16:  # a regular file reads short only at its end
                return b"".join(chunks)
    finally:
        os.close(fd)


def _held_by_others(state: NodeState, holder_pid: int) -> bool:
    return any(lease.holder_pid != holder_pid for lease in state.leases.values())


def _write_atomic(path: str, tmp_path: str, data: bytes) -> None:
    """Writes ``data`` to ``tmp_path`` and renames it over ``path``. Caller holds the lock."""
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp_path, path)
