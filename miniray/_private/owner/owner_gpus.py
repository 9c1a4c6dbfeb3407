"""The owner's leases of physical GPUs, shared with every miniray session on the host.

Owns: taking a lease in the node ledger and, for real devices, the host GPU ledger in one step
(both or neither), noticing and reporting requests that only other sessions block, and giving
up on them after MINIRAY_HOST_GPU_TIMEOUT. Does not own: the ledgers' files (``ledger.py``,
``host_gpus.py``) or what the lease is for (tasks in ``owner.py``, actors in ``actors.py``).
Called by: ``owner.Owner`` (a mixin of it) with the owner's lock held.
"""

from __future__ import annotations

import sys
import time

from miniray._private.core.resources import plan_allocation


class HostGpuLeasing:
    def acquire_lease(self, request: dict, tag: str, key=None):
        """``(lease, host_lease_id)`` from the node ledger and, for physical GPUs, the host
        ledger (both or neither); ``(None, None)`` if it does not fit now."""
        caps = None
        host = self.host_gpus
        if host is not None and request.get("GPU"):
            caps = self._host_caps()
        lease = self.ledger.acquire(request, holder_pid=self.pid, tag=tag, instance_caps=caps)
        if lease is None and caps is not None and host.reclaim_dead():
            caps = self._host_caps()  # a session holding GPUs died: its shares are free again
            lease = self.ledger.acquire(request, holder_pid=self.pid, tag=tag,
                                        instance_caps=caps)
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

    def _host_caps(self) -> dict:
        """What this node may take of each GPU: the share no other session holds."""
        free = self.host_gpus.free([k for k in self.gpu_keys if k])
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
            self.reactor.call_later(0, lambda: self._fail_unschedulable(key, message))

    def _fail_unschedulable(self, key, message: str) -> None:
        from miniray.exceptions import ActorUnschedulableError, TaskUnschedulableError

        if isinstance(key, tuple) and key and key[0] == "actor":
            self.actors.fail_placement(key[1], ActorUnschedulableError(message))
            return
        queue = self._queues.pop(key, None)
        for task in list(queue or ()):
            self._fail_task(task, TaskUnschedulableError(message))

    def release_lease_ids(self, lease_id: str, host_lease: str | None) -> None:
        self.ledger.release(lease_id)
        if host_lease is not None and self.host_gpus is not None:
            self.host_gpus.release(host_lease)

