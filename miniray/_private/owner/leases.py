"""The owner's lease book: the one path by which tasks and actors take resources.

Owns: the leases this session holds for tasks, by scheduling key (``LeaseSlot``: the ledger's
lease, the worker it is given to, idle time, GPU ids), taking a lease in the node ledger and,
for physical GPUs, the host GPU ledger in one step (both or neither), the retry-after-full
window (``core/scheduling.RetryWindow``), the keys the owner's dispatch found no room for
(``stuck``: the owner marks and drops them, ``Owner._dispatch``), and requests that only
other sessions block (say so once, give up after MINIRAY_HOST_GPU_TIMEOUT). Does not own:
the ledgers' files (``ledger.py``, ``host_gpus.py``), workers (the owner's pool), or what a
lease is for (tasks in ``owner.py``, actors in ``actors.py``, which keep their own lease
while alive).
Called by: ``owner.Owner`` and ``actors.ActorManager`` with the owner's lock held; the
owner's dispatch reads ``by_key`` directly (``scheduling.lease_with_room``): it runs for every
task.

::

    acquire(request, tag, key) ──► node ledger (+ host GPU ledger) ──► (lease, host lease)
          │ none: make_room() (idle leases go back) and once more
          ▼ still none: (None, None); blocked only by other sessions: one stderr line
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from miniray._private.core.resources import plan_allocation
from miniray._private.core.scheduling import RetryWindow
from miniray._private.ledger.host_gpus import HostGpuLedger, free_units


class LeaseSlot:
    """A lease of the node ledger given to one worker for tasks of one scheduling key."""

    __slots__ = ("lease", "key", "worker", "cpu_released", "idle_since", "gpu_ids",
                 "host_lease", "float_request")

    def __init__(self, lease, key, worker, gpu_ids, host_lease: str | None = None):
        self.lease = lease
        self.key = key
        self.worker = worker
        # CPU given back while its worker is blocked in get(): {name: amount} (a task in a
        # placement group gives its bundle's CPU names), None when none is
        self.cpu_released: dict | None = None
        self.idle_since: float | None = None
        self.gpu_ids = gpu_ids
        self.host_lease = host_lease
        # The request as a task's context reports it (``resources.float_request``), made
        # for the first task sent: every task of one key asks the same.
        self.float_request: dict | None = None


class LeaseBook:
    """Leases of one session. ``make_room()`` returns idle leases to the ledger (True if it
    freed any); ``on_unschedulable(key, message)`` fails what waits on ``key`` when other
    sessions held its GPUs for too long; ``call_later(delay, fn)`` runs ``fn`` on the I/O
    thread with the lock held."""

    RETRY_S = 0.05

    def __init__(self, *, ledger, pid: int, gpu_keys: list | None, host_gpu_timeout,
                 make_room: Callable[[], bool], on_unschedulable: Callable[[Any, str], None],
                 call_later: Callable):
        self.ledger = ledger
        self.pid = pid
        self.by_key: dict[Any, list[LeaseSlot]] = {}
        self.window = RetryWindow(self.RETRY_S)
        # Keys whose queued tasks the owner's dispatch found no room for, with nothing but
        # a change able to make room (no idle lease, every pipeline full or blocked, the
        # retry window saying no): key -> (``window.releases`` then, the key's depth).
        # Every event that may make room for a key drops its entry (``Owner._dispatch``).
        self.stuck: dict[Any, tuple[int, int]] = {}
        self._make_room = make_room
        self._on_unschedulable = on_unschedulable
        self._call_later = call_later
        # Physical GPUs are shared with every miniray session on the host (host_gpus.py):
        # only devices NVML reported have keys; logical GPUs stay this session's own.
        self.gpu_keys = list(gpu_keys or [])
        self.host_gpus = HostGpuLedger() if any(self.gpu_keys) else None
        self.host_gpu_timeout = host_gpu_timeout
        self._host_blocked_since: dict = {}
        self._host_reported: set = set()

    # -- the book ------------------------------------------------------------------------
    def add(self, slot: LeaseSlot) -> None:
        self.by_key.setdefault(slot.key, []).append(slot)

    def remove(self, slot: LeaseSlot) -> None:
        leases = self.by_key.get(slot.key)
        if leases is not None:
            try:
                leases.remove(slot)
            except ValueError:
                pass
            if not leases:
                del self.by_key[slot.key]

    def slots(self) -> list[LeaseSlot]:
        return [slot for leases in self.by_key.values() for slot in leases]

    def idle_slots(self, now: float, linger: float, force: bool) -> list[LeaseSlot]:
        """Leases whose worker is idle: all of them if ``force``, else those idle ``linger``
        seconds or more."""
        found = []
        for leases in self.by_key.values():  # no slots() list: the I/O thread's sweep
            for slot in leases:
                since = slot.idle_since
                if (since is not None and not slot.worker.inflight
                        and (force or now - since >= linger)):
                    found.append(slot)
        return found

    def next_idle_check(self, now: float, linger: float, keep: float,
                        check_every: float) -> float | None:
        """Seconds until an idle lease may have to go back (None: none is idle): at its
        ``linger``, then every ``check_every`` (is another session waiting?) until its
        ``keep``. The caller released those past ``keep`` already."""
        wait = None
        for leases in self.by_key.values():
            for slot in leases:
                since = slot.idle_since
                if since is None or slot.worker.inflight:
                    continue
                age = now - since
                if age < linger:
                    left = linger - age
                else:
                    left = max(0.0, min(check_every, keep - age))
                if wait is None or left < wait:
                    wait = left
        return wait

    def any_idle(self) -> bool:
        for leases in self.by_key.values():  # asked on every wake-up of the I/O thread
            for slot in leases:
                if slot.idle_since is not None:
                    return True
        return False

    def __len__(self) -> int:
        return sum(len(leases) for leases in self.by_key.values())

    def __bool__(self) -> bool:
        return bool(self.by_key)

    # -- the ledgers ---------------------------------------------------------------------
    def acquire(self, request: dict, tag: str, key=None, make_room=None,
                worker_pid: int | None = None):
        """``(lease, host_lease_id)``, or ``(None, None)`` if the request does not fit now
        even after idle leases went back (``make_room``, the book's own if None: one that
        takes the owner's lock when called without it). ``worker_pid``: the worker expected
        to hold it, recorded in the same transaction."""
        lease, host_lease = self._acquire_once(request, tag, key, worker_pid)
        if lease is None and (make_room or self._make_room)():
            lease, host_lease = self._acquire_once(request, tag, key, worker_pid)
        return lease, host_lease

    def _acquire_once(self, request: dict, tag: str, key, worker_pid: int | None = None):
        """One try at the node ledger and, for physical GPUs, the host ledger (both or
        neither)."""
        caps = None
        host = self.host_gpus
        if host is not None and request.get("GPU"):
            caps = self._host_caps()
        lease = self.ledger.acquire(request, holder_pid=self.pid, tag=tag, instance_caps=caps,
                                    worker_pid=worker_pid)
        if lease is None:
            if caps is not None:
                self._note_host_blocked(request, tag, key)
            return None, None
        host_lease = None
        if caps is not None:
            shares = {}
            for index, units in lease.instances.get("GPU", []):
                device = self.gpu_keys[index] if index < len(self.gpu_keys) else None
                if device:
                    shares[device] = shares.get(device, 0) + units
            if shares:
                host_lease = host.acquire_exact(shares, holder_pid=self.pid, tag=tag)
                if host_lease is None:  # another session took it in between
                    self.ledger.release(lease.lease_id)
                    return None, None
        if key is not None:
            self._host_blocked_since.pop(key, None)
        return lease, host_lease

    def gpu_ids(self, lease) -> list | None:
        """The GPU instance ids a lease holds."""
        return self.ledger.instance_ids_of(lease, "GPU")

    def release(self, lease_id: str, host_lease: str | None, note: bool = True) -> None:
        """Give a lease back to the ledgers; ``note``: room appeared, so the next acquire
        asks the ledger even within the retry window."""
        self.ledger.release(lease_id)
        if host_lease is not None and self.host_gpus is not None:
            self.host_gpus.release(host_lease)
        if note:
            self.window.note_release()

    def take_all(self) -> list[LeaseSlot]:
        """Shutdown: every task lease leaves the book (the caller releases them)."""
        held = self.slots()
        self.by_key.clear()
        return held

    # -- GPUs other sessions hold --------------------------------------------------------
    def host_caps_for(self, bundles) -> dict | None:
        """The instance caps for a placement group's reservation: None unless its bundles
        ask for GPUs that are physical devices shared with other sessions."""
        if self.host_gpus is None or not any(b.get("GPU") for b in bundles):
            return None
        return self._host_caps()

    def take_host_shares(self, lease, holder_pid: int, tag: str) -> str | None | bool:
        """The host ledger's lease for the physical GPUs a node lease holds (a placement
        group's): its id, None if it holds none, False if another session took them."""
        shares: dict = {}
        for index, units in lease.instances.get("GPU", []):
            device = self.gpu_keys[index] if index < len(self.gpu_keys) else None
            if device:
                shares[device] = shares.get(device, 0) + units
        if not shares or self.host_gpus is None:
            return None
        host_lease = self.host_gpus.acquire_exact(shares, holder_pid=holder_pid, tag=tag)
        return False if host_lease is None else host_lease

    def release_host(self, host_lease: str | None) -> None:
        if host_lease and self.host_gpus is not None:
            self.host_gpus.release(host_lease)

    def _host_caps(self) -> dict:
        """What this node may take of each GPU: the share no other session holds. Shares of
        other holders that died are reclaimed first: left in place they would only move a
        request to another instance (a logical GPU, say) rather than fail it, so a reclaim
        after a failed fit would come too late and packing would break."""
        keys = [k for k in self.gpu_keys if k]
        leases = self.host_gpus.leases()
        if (any(lease.holder_pid != self.pid for lease in leases.values())
                and self.host_gpus.reclaim_dead()):
            leases = self.host_gpus.leases()
        free = dict(zip(keys, free_units(leases, keys)))
        return {"GPU": [free.get(k, 0) if k else 10_000 for k in self.gpu_keys]}

    def _note_host_blocked(self, request: dict, tag: str, key) -> None:
        """The request fits this node but not the host: other sessions hold the GPUs. Say so
        once, naming them; with MINIRAY_HOST_GPU_TIMEOUT, give up after that many seconds."""
        if plan_allocation(self.ledger.snapshot(), request) is None:
            return  # this session's own work holds them: an ordinary wait
        now = time.monotonic()
        since = self._host_blocked_since.setdefault(key, now)
        if key not in self._host_reported:
            self._host_reported.add(key)
            holders = set()
            stats = self.host_gpus.statistics([k for k in self.gpu_keys if k])
            for device in stats.get("devices", {}).values():
                for holder in device.get("holders", []):
                    if holder.get("pid") != self.pid:
                        holders.add(f"pid {holder.get('pid')} ({holder.get('tag') or '?'})")
            wait = (f"it fails after {self.host_gpu_timeout:g} s (MINIRAY_HOST_GPU_TIMEOUT)"
                    if self.host_gpu_timeout is not None else
                    "it waits until they are released (set MINIRAY_HOST_GPU_TIMEOUT to fail "
                    "instead)")
            print(f"miniray: {tag or 'a request'} needs GPUs that other miniray sessions on "
                  f"this host hold: {', '.join(sorted(holders)) or 'another session'}; {wait}.",
                  file=sys.stderr, flush=True)
        if self.host_gpu_timeout is not None and now - since >= self.host_gpu_timeout:
            self._host_blocked_since.pop(key, None)
            message = (f"The GPUs this request needs ({request}) stayed held by other miniray "
                       f"sessions on this host for {self.host_gpu_timeout:g} s "
                       "(MINIRAY_HOST_GPU_TIMEOUT); see `miniray status` for who holds them.")
            self._call_later(0, lambda: self._on_unschedulable(key, message))
