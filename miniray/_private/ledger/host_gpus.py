"""The host-wide GPU ledger: which fractions of which physical GPU every miniray process leases.

Owns: ``gpus.json`` and its lock ``gpus.json.lock`` in the host directory, shared by every
miniray session on the host (by every user who points ``MINIRAY_HOST_DIR`` at one directory),
and the decisions about them: which whole devices or which device for a fraction (best-fit
packing, the node ledger's rule), and which leases belong to dead processes.
Does not own: a session's own GPU ledger (``ledger.py``: its logical GPUs and instance ids),
detecting devices (``gpu_detect.py``: it names each physical device by a *device key*), or
processes (it only reads ``/proc`` through ``procinfo``).
Called by: the runtime and the owner, for the GPUs of a node that are physical devices; GPUs
beyond the physical count (``init(num_gpus=8)`` on a 2-GPU host) stay per-session.

::

    session A (driver pid 100)        session B (driver pid 200)       miniray status
      acquire_whole(keys, 2) ──┐        acquire_fraction(keys, 0.5) ─┐     statistics()
                               ▼                                     ▼          │ (lock-free)
      gpus.json.lock  (flock(2), exclusive)  held for: read → decide (pure) → write
                               │                                                │
      gpus.json.<uid>.tmp ──os.replace──► gpus.json ◄───────────────────────────┘
                                          {"version": 1, "leases": {id: {holder, shares}}}

A lease is ``{device key: units}`` held by one live process (pid + start time, as in the node
ledger), in fixed point (``resources.UNIT`` = 1.0 device). No device ever has more than 1.0
leased. A lease whose holder died (pid gone, a zombie, a reused pid, or a lease from before the
last boot) is reclaimed by the next acquire that finds the ledger short, or by
``reclaim_dead()``. A holder in another pid namespace (a container sharing the directory)
cannot be checked from here and is kept until a process of its namespace reclaims it.

Files, as in ``ledger.py``: writers hold the lock, read, decide (pure functions below), write
``gpus.json.<uid>.tmp`` and ``os.replace`` it over ``gpus.json``; readers skip the lock. The
lock file is never unlinked (that breaks mutual exclusion), so two small files stay after the
last session. The uid in the temporary name keeps one user's crashed write from blocking
another user. No fsync: leases outlive neither their holders nor the boot.

Where. ``$MINIRAY_HOST_DIR`` when set; otherwise ``/dev/shm/miniray-host-<uid>`` (mode 0700,
refused unless it is a real directory owned by the user with no group or other permission:
``same_uid.ensure_private_dir``), falling back to ``/tmp``, then to
``tempfile.gettempdir()``. Not ``$TMPDIR``-relative by default: batch systems give each job its
own ``TMPDIR``, which would split the ledger and let two jobs of one user share a GPU unknowingly.
The default is per user: one user's sessions never double-book a GPU, and another user cannot
block or spoof them. To share GPUs between users, create one directory every such user can
write (group-writable and setgid, *not* sticky: replacing ``gpus.json`` renames over another
user's file) and set ``MINIRAY_HOST_DIR`` to it in each user's environment.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from miniray._private.core.resources import (
    UNIT,
    _check_instance_amount,
    _pick_instances,
    from_units,
)
from miniray._private.host import procinfo, same_uid
from miniray._private.ledger.flock import KeptFlock

__all__ = [
    "HOST_DIR_ENV",
    "HostGpuLease",
    "HostGpuLedger",
    "default_host_dir",
    "free_units",
    "plan_shares",
    "used_units",
]

logger = logging.getLogger(__name__)

HOST_DIR_ENV = "MINIRAY_HOST_DIR"
LEDGER_NAME = "gpus.json"
FORMAT_VERSION = 1


def default_host_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$MINIRAY_HOST_DIR``, else ``/dev/shm/miniray-host-<uid>`` (see the module docstring)."""
    environ = os.environ if environ is None else environ
    configured = environ.get(HOST_DIR_ENV)
    if configured:
        return os.path.abspath(configured)
    for base in ("/dev/shm", "/tmp"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            break
    else:
        base = tempfile.gettempdir()
    return os.path.join(base, f"miniray-host-{os.getuid()}")


def _ensure_private_dir(path: str) -> None:
    """Creates the per-user default directory, or checks that the existing one is ours."""
    same_uid.ensure_private_dir(
        path, remedy=f"set {HOST_DIR_ENV} to a directory of your own")


# ---------------------------------------------------------------------------------------------
# Data model and pure decisions


@dataclass
class HostGpuLease:
    """Device shares held by one process: ``{device key: units}``, each share at most 1.0."""

    lease_id: str
    holder_pid: int
    holder_start: int | None  # /proc/<pid>/stat field 22: tells a reused pid from the holder
    shares: dict[str, int]
    tag: str = ""  # free text for status output (e.g. the session name)
    pid_ns: str = ""  # readlink /proc/self/ns/pid of the acquirer: where holder_pid means this
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id at acquire time
    created: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["lease_id"]  # the key it is stored under
        return doc

    @classmethod
    def from_json(cls, lease_id: str, d: Mapping[str, Any]) -> HostGpuLease:
        shares = {str(k): int(u) for k, u in d["shares"].items()}
        fields = {k: d[k] for k in ("tag", "pid_ns", "boot_id", "created") if k in d}
        return cls(lease_id, int(d["holder_pid"]), d.get("holder_start"), shares, **fields)


def used_units(leases: Mapping[str, HostGpuLease]) -> dict[str, int]:
    """Units leased per device key (devices nobody leases are absent)."""
    used: dict[str, int] = {}
    for lease in leases.values():
        for key, u in lease.shares.items():
            used[key] = used.get(key, 0) + u
    return used


def free_units(leases: Mapping[str, HostGpuLease], device_keys: Sequence[str]) -> list[int]:
    """Free units of each of ``device_keys``, in their order (never below 0)."""
    used = used_units(leases)
    return [max(0, UNIT - used.get(key, 0)) for key in device_keys]


def _check_keys(device_keys: Sequence[str]) -> list[str]:
    keys = [str(k) for k in device_keys]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate device keys: {keys}")
    return keys


def plan_shares(
    leases: Mapping[str, HostGpuLease], device_keys: Sequence[str], units: int
) -> dict[str, int] | None:
    """The shares a request of ``units`` gets among ``device_keys`` now, or None if none fit.

    A fraction (``units < UNIT``) goes to the device with the least free capacity that still
    fits (best fit, ties to the earliest key), so fractions fill one device before the next; a
    request of k whole devices takes the first k completely free ones, in the caller's order.
    This is the node ledger's rule (``resources._pick_instances``), applied to physical devices.

    Raises ValueError for ``units <= 0``, a fraction above 1 (e.g. 1.5 devices), duplicate keys,
    or a request that can never fit (more devices than ``device_keys``).

    Example:
        >>> plan_shares({}, ["GPU-a", "GPU-b"], UNIT // 2)
        {'GPU-a': 5000}
    """
    keys = _check_keys(device_keys)
    if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
        raise ValueError(f"a GPU request must be a positive number of units, got {units!r}")
    _check_instance_amount("GPU", units)
    needed = 1 if units < UNIT else units // UNIT
    if needed > len(keys):
        raise ValueError(
            f"a request of {from_units(units)} GPU can never be satisfied by {len(keys)} "
            f"device(s): {keys}"
        )
    picked = _pick_instances(free_units(leases, keys), units)
    if picked is None:
        return None
    return {keys[index]: u for index, u in picked}


def exact_fits(leases: Mapping[str, HostGpuLease], shares: Mapping[str, int]) -> bool:
    """Whether every ``{key: units}`` share is free now. ValueError for a share not in (0, 1]."""
    for key, u in shares.items():
        if isinstance(u, bool) or not isinstance(u, int) or not 0 < u <= UNIT:
            raise ValueError(f"share of {key!r} must be in (0, {UNIT}] units, got {u!r}")
    keys = list(shares)
    return all(f >= shares[k] for k, f in zip(keys, free_units(leases, keys)))


# Where pids mean what they say (this boot, this PID namespace): one definition, in procinfo.
_Identity = procinfo.Identity
_read_identity = procinfo.identity


def holder_alive(lease: HostGpuLease, me: _Identity, is_alive=procinfo.is_alive) -> bool | None:
    """Whether a lease's holder still lives: False from an earlier boot, None (unknown) from
    another pid namespace, else whether its pid still names the process that took it."""
    if lease.boot_id and me.boot_id and lease.boot_id != me.boot_id:
        return False
    if lease.pid_ns and me.pid_ns and lease.pid_ns != me.pid_ns:
        return None
    return is_alive(lease.holder_pid, lease.holder_start)


# ---------------------------------------------------------------------------------------------
# The file


class HostGpuLedger:
    """A process's handle on the host's GPU ledger. Cheap; safe to share between threads.

    Example:
        >>> host = HostGpuLedger()  # doctest: +SKIP
        >>> got = host.wait_acquire_whole(inv.device_keys, 2, holder_pid=os.getpid(),
        ...                               timeout=30)  # doctest: +SKIP
        >>> if got is None: ...  # another session holds them  # doctest: +SKIP
        >>> lease_id, keys = got  # doctest: +SKIP
        >>> host.release(lease_id)  # doctest: +SKIP
        True
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        if directory is None:
            directory = default_host_dir()
            if not os.environ.get(HOST_DIR_ENV):
                _ensure_private_dir(directory)
        directory = os.fspath(directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._dir = directory
        self._path = os.path.join(directory, LEDGER_NAME)
        self._lock_path = self._path + ".lock"
        self._tmp_path = f"{self._path}.{os.getuid()}.tmp"
        self._me: _Identity | None = None
        self._flock = KeptFlock(self._lock_path)

    def close(self) -> None:
        """Closes the lock file's descriptor (reopened if the ledger is used again)."""
        self._flock.close()

    @property
    def path(self) -> str:
        return self._path

    # -- locking and file I/O ---------------------------------------------------------------

    def _locked(self):
        return self._flock.held()

    def _read(self, *, locked: bool) -> dict[str, HostGpuLease]:
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        if not raw.strip():
            return {}
        try:
            doc = json.loads(raw)
            version = doc.get("version")
            if isinstance(version, int) and version > FORMAT_VERSION:
                raise RuntimeError(
                    f"miniray: the host GPU ledger {self._path} was written by a newer miniray "
                    f"(format {version}, this one reads {FORMAT_VERSION}); use one miniray "
                    f"version on this host, or set {HOST_DIR_ENV} to another directory"
                )
            return {lid: HostGpuLease.from_json(lid, d) for lid, d in doc["leases"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if not locked:
                raise ValueError(f"unreadable host GPU ledger {self._path}: {e!r}") from None
            # Writes are atomic, so this is damage from outside miniray. Keep a copy for
            # diagnosis and start empty: blocking every GPU on the host would be worse.
            msg = "miniray: host GPU ledger %s unreadable (%r); moved to .corrupt, started empty"
            logger.warning(msg, self._path, e)
            os.replace(self._path, self._path + ".corrupt")
            return {}

    def _write(self, leases: Mapping[str, HostGpuLease]) -> None:
        doc = {
            "version": FORMAT_VERSION,
            "leases": {lid: lease.to_json() for lid, lease in leases.items()},
        }
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        fd = os.open(self._tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            # Readable by everyone who may enter the directory, whatever the umask: users
            # sharing a directory read each other's leases.
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.close(fd)
            fd = -1
            os.replace(self._tmp_path, self._path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            _unlink_quietly(self._tmp_path)
            raise

    def _identity(self) -> _Identity:
        if self._me is None:
            self._me = _read_identity()
        return self._me

    def _pop_dead(self, leases: dict[str, HostGpuLease]) -> list[HostGpuLease]:
        me = self._identity()
        dead = [lease for lease in leases.values() if holder_alive(lease, me) is False]
        for lease in dead:
            del leases[lease.lease_id]
            msg = "reclaimed host GPU lease %s of dead holder pid %d (%s): %s"
            logger.debug(msg, lease.lease_id, lease.holder_pid, lease.tag, lease.shares)
        return dead

    # -- transactions -----------------------------------------------------------------------

    def _acquire_planned(self, plan, *, holder_pid: int, tag: str) -> HostGpuLease | None:
        """Runs ``plan(leases) -> shares | None`` under the lock and records what it returns;
        when nothing fits, reclaims dead holders' leases and plans once more."""
        me = self._identity()
        start = procinfo.holder_start(holder_pid)
        lease = HostGpuLease(os.urandom(8).hex(), holder_pid, start, {}, tag, me.pid_ns, me.boot_id)
        with self._locked():
            leases = self._read(locked=True)
            shares = plan(leases)
            dead = []
            if shares is None:
                dead = self._pop_dead(leases)
                if dead:
                    shares = plan(leases)
            if shares is not None:
                lease.shares = dict(shares)
                leases[lease.lease_id] = lease
                used = used_units(leases)
                over = {k: used[k] for k in shares if used[k] > UNIT}
                if over:
                    raise RuntimeError(
                        f"bug in miniray: host GPU lease would assign more than 1.0 of {over}"
                    )
            if shares is not None or dead:
                self._write(leases)
        return lease if shares is not None else None

    def acquire(
        self, device_keys: Sequence[str], units: int, *, holder_pid: int, tag: str = ""
    ) -> tuple[str, list[str]] | None:
        """Leases ``units`` (fixed point; ``UNIT`` = one device) among ``device_keys``.

        A fraction (below ``UNIT``) takes part of one device, best fit; a whole number takes
        that many completely free devices, in the caller's order. Returns ``(lease_id, keys
        it got)``, or None if it does not fit now (after reclaiming dead holders' leases).
        Raises ValueError as :func:`plan_shares` does.
        """
        keys = _check_keys(device_keys)
        plan_shares({}, keys, units)  # validate before taking the lock
        lease = self._acquire_planned(
            lambda leases: plan_shares(leases, keys, units), holder_pid=holder_pid, tag=tag
        )
        return None if lease is None else (lease.lease_id, list(lease.shares))

    def acquire_whole(
        self, device_keys: Sequence[str], count: int, *, holder_pid: int, tag: str = ""
    ) -> tuple[str, list[str]] | None:
        """Leases ``count`` completely free devices among ``device_keys``: ``(lease_id, keys)``
        or None. ValueError if ``count`` exceeds the number of keys or is not positive."""
        return self.acquire(device_keys, _whole(count), holder_pid=holder_pid, tag=tag)

    def acquire_fraction(
        self, device_keys: Sequence[str], units: int, *, holder_pid: int, tag: str = ""
    ) -> tuple[str, str] | None:
        """Leases ``units`` (in (0, ``UNIT``]) of one device, best fit: ``(lease_id, key)`` or
        None. Fractions fill one device before the next."""
        if isinstance(units, bool) or not isinstance(units, int) or not 0 < units <= UNIT:
            raise ValueError(f"a fraction must be in (0, {UNIT}] units, got {units!r}")
        got = self.acquire(device_keys, units, holder_pid=holder_pid, tag=tag)
        return None if got is None else (got[0], got[1][0])

    def acquire_exact(
        self, shares: Mapping[str, int], *, holder_pid: int, tag: str = ""
    ) -> str | None:
        """Leases exactly ``{key: units}`` (all or nothing): the lease id, or None. For a caller
        that chose the devices itself, e.g. the node ledger planning with :meth:`free`."""
        shares = {str(k): u for k, u in shares.items()}
        if not shares:
            raise ValueError("acquire_exact needs at least one share")
        exact_fits({}, shares)  # validate before taking the lock
        lease = self._acquire_planned(
            lambda leases: dict(shares) if exact_fits(leases, shares) else None,
            holder_pid=holder_pid,
            tag=tag,
        )
        return None if lease is None else lease.lease_id

    def wait_acquire(
        self,
        device_keys: Sequence[str],
        units: int,
        *,
        holder_pid: int,
        tag: str = "",
        timeout: float | None,
        poll: float = 0.05,
    ) -> tuple[str, list[str]] | None:
        """:meth:`acquire`, retried every ``poll`` seconds until it succeeds or ``timeout``
        seconds pass (None: no limit; 0: try once, i.e. fail fast). None on timeout."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            got = self.acquire(device_keys, units, holder_pid=holder_pid, tag=tag)
            if got is not None:
                return got
            if deadline is None:
                time.sleep(poll)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(poll, remaining))

    def wait_acquire_whole(
        self, device_keys: Sequence[str], count: int, **kwargs: Any
    ) -> tuple[str, list[str]] | None:
        """:meth:`acquire_whole`, waiting as :meth:`wait_acquire` does (same keywords)."""
        return self.wait_acquire(device_keys, _whole(count), **kwargs)

    def release(self, lease_id: str) -> bool:
        """Returns a lease's devices. Idempotent: False if it is unknown (released, reclaimed)."""
        with self._locked():
            leases = self._read(locked=True)
            if leases.pop(lease_id, None) is None:
                return False
            self._write(leases)
        return True

    def release_holder(self, pid: int) -> int:
        """Drops every lease held by ``pid`` (in this pid namespace); returns how many."""
        ns = self._identity().pid_ns
        with self._locked():
            leases = self._read(locked=True)
            mine = [
                lid
                for lid, lease in leases.items()
                if lease.holder_pid == pid and (not lease.pid_ns or not ns or lease.pid_ns == ns)
            ]
            for lid in mine:
                del leases[lid]
            if mine:
                self._write(leases)
        return len(mine)

    def reclaim_dead(self) -> list[HostGpuLease]:
        """Drops the leases whose holder is dead; returns them."""
        with self._locked():
            leases = self._read(locked=True)
            dead = self._pop_dead(leases)
            if dead:
                self._write(leases)
        return dead

    # -- lock-free reads --------------------------------------------------------------------

    def leases(self) -> dict[str, HostGpuLease]:
        """Every lease now, dead holders' included (read without the lock: the file is
        replaced atomically)."""
        return self._read(locked=False)

    def free(self, device_keys: Sequence[str]) -> dict[str, int]:
        """Free units per device key now (dead holders' leases still count until reclaimed)."""
        keys = _check_keys(device_keys)
        return dict(zip(keys, free_units(self.leases(), keys)))

    def statistics(self, device_keys: Sequence[str] = ()) -> dict[str, Any]:
        """A snapshot for ``miniray status`` and tests.

        ``{"path", "leases": n, "devices": {key: {"used": float, "free": float, "holders":
        [{"pid", "tag", "fraction", "lease_id", "alive"}]}}}``: every leased device, plus
        ``device_keys`` (e.g. this node's) even when free. ``alive`` is None for a holder in
        another pid namespace.
        """
        leases = self.leases()
        me = self._identity()
        used = used_units(leases)
        devices: dict[str, dict[str, Any]] = {}
        for key in [str(k) for k in device_keys] + sorted(used):
            u = used.get(key, 0)
            devices[key] = {"used": from_units(u), "free": from_units(max(0, UNIT - u))}
            devices[key]["holders"] = []
        for lease in sorted(leases.values(), key=lambda le: le.created):
            alive = holder_alive(lease, me)
            for key, u in lease.shares.items():
                holder = dict(pid=lease.holder_pid, tag=lease.tag, fraction=from_units(u))
                holder.update(lease_id=lease.lease_id, alive=alive)
                devices[key]["holders"].append(holder)
        return {"path": self._path, "leases": len(leases), "devices": devices}

    def __repr__(self) -> str:
        try:
            leases = self.leases()
            used = {k: from_units(u) for k, u in sorted(used_units(leases).items())}
            detail = f"leases={len(leases)} used={used}"
        except (OSError, ValueError, RuntimeError) as e:
            detail = f"unreadable ({type(e).__name__})"
        return f"<HostGpuLedger {self._path!r} {detail}>"


def _whole(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise ValueError(f"count must be a positive whole number of devices, got {count!r}")
    return count * UNIT


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
