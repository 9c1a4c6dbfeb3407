"""Pure resource arithmetic and allocation decisions for one node.

Owns: the fixed-point representation of quantities, the ledger's data model (``NodeState``,
``Lease``), and every decision about resources: does a request fit now
(:func:`plan_allocation`), which GPU instances it gets (best-fit packing), can it ever fit
(:func:`infeasible_reasons`), and the node's advertised totals (:func:`node_totals`).

Does not own: files, locks or processes. ``ledger.py`` reads the state under its lock, asks
this module what to do, and writes the result; the owner and ``miniray status`` read it. Every
function here is deterministic and free of I/O, so it is unit-tested without processes.

Quantities are integers in units of 1/10000 (as in Ray), so ``0.1 + 0.2`` is exactly 3000
units and repeated acquire/release leaves no floating-point residue.

Mirrors Ray's unit-instance resources (``ray._private.resource_and_label_spec`` /
``ResourceInstanceSet`` in the raylet, Ray 2.60). Differs: labels are not modelled; instance
ids are the node's own strings (``CUDA_VISIBLE_DEVICES`` entries).

Placement groups (``placement.py`` names the resources): a group's reservation is a lease
that *provides* derived resources (``CPU_group_0_<hex>``, ...), which count as available
capacity while the lease exists (``NodeState.capacity``); a bundle's derived GPU carries the
device indices the group's lease holds, so a task's lease of it names real devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from miniray._private.core import placement

__all__ = [
    "OBJECT_STORE_MINIMUM_BYTES",
    "UNIT",
    "UNIT_INSTANCE_RESOURCES",
    "Allocation",
    "Lease",
    "NodeState",
    "check_object_store_memory",
    "format_infeasible",
    "from_units",
    "infeasible_reasons",
    "node_totals",
    "plan_allocation",
    "plan_group",
    "to_units",
]

UNIT = 10_000

# Resources whose capacity is split into numbered instances (devices). A request for one of
# them is assigned specific instances, and one instance never gives out more than 1.0.
UNIT_INSTANCE_RESOURCES = (
    "GPU",
    "neuron_cores",
    "TPU",
    "HPU",
    "NPU",
    "RBLN",
    "FURIOSA",
    "MBLT",
    "TTNPU",
)
_UNIT_INSTANCE_SET = frozenset(UNIT_INSTANCE_RESOURCES)


def to_units(x: float) -> int:
    """Converts a quantity to fixed-point units (1/10000), rounding to the nearest unit."""
    return int(round(x * UNIT))


def from_units(u: int) -> float:
    """Converts fixed-point units back to a float quantity."""
    return u / UNIT


def _request_units(request: Mapping[str, float]) -> dict[str, int]:
    """The request in units, without zero entries; negative or non-finite values are errors."""
    units: dict[str, int] = {}
    for name, amount in request.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(f"resource {name!r}: amount must be a number, got {amount!r}")
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"resource {name!r}: amount must be finite and >= 0, got {amount!r}")
        u = to_units(amount)
        if u:
            units[name] = u
    return units


def _check_instance_amount(name: str, u: int) -> None:
    if u > UNIT and u % UNIT:
        raise ValueError(
            f"{name} request {from_units(u)} is a fraction above 1: fractional requests of "
            f"{name} must be in (0, 1], larger ones must be whole numbers"
        )


# ---------------------------------------------------------------------------------------------
# Data model (the ledger's content)


@dataclass
class Lease:
    """Resources held by one holder process (usually an owner leasing a worker)."""

    lease_id: str
    holder_pid: int
    holder_start: int | None  # /proc/<pid>/stat field 22: tells a reused pid from the holder
    worker_pid: int | None
    resources: dict[str, int]  # units, including instance resources' totals
    instances: dict[str, list[tuple[int, int]]]  # {"GPU": [(index, units), ...]}
    tag: str = ""  # free text for status output
    # A placement group's reservation: the derived resources it adds (units), the device
    # indices behind each bundle's derived unit-instance resource, and the group's record
    # (id, name, strategy, bundles, node of each bundle, detached, creator pid).
    provides: dict[str, int] = field(default_factory=dict)
    provides_instances: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    group: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = {
            "lease_id": self.lease_id,
            "holder_pid": self.holder_pid,
            "holder_start": self.holder_start,
            "worker_pid": self.worker_pid,
            "resources": self.resources,
            "instances": {k: [[i, u] for i, u in v] for k, v in self.instances.items()},
            "tag": self.tag,
        }
        if self.group is not None:
            d["provides"] = self.provides
            d["provides_instances"] = {
                k: [[i, u] for i, u in v] for k, v in self.provides_instances.items()}
            d["group"] = self.group
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Lease:
        return cls(
            lease_id=d["lease_id"],
            holder_pid=d["holder_pid"],
            holder_start=d.get("holder_start"),
            worker_pid=d.get("worker_pid"),
            resources=dict(d["resources"]),
            instances={k: [(i, u) for i, u in v] for k, v in d.get("instances", {}).items()},
            tag=d.get("tag", ""),
            provides=dict(d.get("provides", {})),
            provides_instances={k: [(i, u) for i, u in v]
                                for k, v in d.get("provides_instances", {}).items()},
            group=d.get("group"),
        )


@dataclass
class NodeState:
    """The ledger's whole content: totals, instance ids and leases. Quantities in units."""

    totals: dict[str, int]
    instance_ids: dict[str, list[str]]  # {"GPU": ["0", "1"]}; ["3", "5"] from CUDA_VISIBLE_DEVICES
    leases: dict[str, Lease] = field(default_factory=dict)

    def used(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for lease in self.leases.values():
            for name, u in lease.resources.items():
                used[name] = used.get(name, 0) + u
        return used

    def capacity(self) -> dict[str, int]:
        """The totals plus what placement groups' reservations provide (derived names)."""
        cap = dict(self.totals)
        for lease in self.leases.values():
            for name, u in lease.provides.items():
                cap[name] = cap.get(name, 0) + u
        return cap

    def available(self) -> dict[str, int]:
        """capacity - used, per resource. Can be negative where a lease grew past the totals
        (a worker resuming after ``get()``; see ``Ledger.adjust``), or holds a group's
        resources after the group was removed."""
        avail = self.capacity()
        for name, u in self.used().items():
            avail[name] = avail.get(name, 0) - u
        return avail

    def groups(self) -> dict[str, Lease]:
        """The placement groups reserved here, by id hex."""
        return {lease.group["id"]: lease for lease in self.leases.values()
                if lease.group is not None}

    def instance_free(self, name: str) -> list[int]:
        """Free units of each instance of ``name`` (index order); [] when the node has none.
        For a bundle's derived name (``GPU_group_0_<hex>``), the free units of what the
        bundle holds of each device of its base resource."""
        parsed = placement.parse_derived(name) if "_group_" in name else None
        if parsed is not None:
            free = [0] * len(self.instance_ids.get(parsed[0], ()))
            for lease in self.leases.values():
                for index, u in lease.provides_instances.get(name, ()):
                    if 0 <= index < len(free):
                        free[index] += u
        else:
            free = [UNIT] * len(self.instance_ids.get(name, ()))
        for lease in self.leases.values():
            for index, u in lease.instances.get(name, ()):
                if 0 <= index < len(free):
                    free[index] -= u
        return free

    def to_json(self) -> dict[str, Any]:
        return {
            "totals": self.totals,
            "instance_ids": self.instance_ids,
            "leases": {lid: lease.to_json() for lid, lease in self.leases.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeState:
        return cls(
            totals=dict(d["totals"]),
            instance_ids={k: list(v) for k, v in d.get("instance_ids", {}).items()},
            leases={lid: Lease.from_json(ld) for lid, ld in d.get("leases", {}).items()},
        )


@dataclass(frozen=True)
class Allocation:
    """What ``plan_allocation`` decided: the units to take and the instances that carry them."""

    resources: dict[str, int]
    instances: dict[str, list[tuple[int, int]]]


# ---------------------------------------------------------------------------------------------
# Decisions


def _pick_instances(free: list[int], u: int) -> list[tuple[int, int]] | None:
    """Instances for ``u`` units of one unit-instance resource, or None if they are not
    free (``placement.pick_instances``: a remote bundle's GPUs follow the same rule)."""
    return placement.pick_instances(free, u)


def _instance_base(name: str) -> str | None:
    """The unit-instance resource ``name`` takes instances of: itself, or the base of a
    bundle's derived name (``GPU_group_0_<hex>``: GPU); None for any other resource (the
    wildcard ``GPU_group_<hex>`` is a plain count)."""
    if name in _UNIT_INSTANCE_SET:
        return name
    if "_group_" in name:
        parsed = placement.parse_derived(name)
        if parsed is not None and parsed[1] is not None and parsed[0] in _UNIT_INSTANCE_SET:
            return parsed[0]
    return None


def plan_allocation(
    state: NodeState,
    request: Mapping[str, float],
    instance_caps: Mapping[str, list[int]] | None = None,
) -> Allocation | None:
    """Decides whether ``request`` fits in what ``state`` has available now.

    Returns the allocation to record, or None if it does not fit. Raises ValueError for a
    fractional unit-instance request above 1 (e.g. ``{"GPU": 1.5}``) or a negative amount.
    Zero-valued entries are ignored. ``instance_caps`` limits what may be taken of each
    instance (units, by index) beyond what this node has free: the share of a physical GPU
    that other sessions on the host have not leased. A request for any bundle of a placement
    group (``placement.wildcard_group``) takes the first bundle it fits in.

    Example:
        >>> s = NodeState(totals={"CPU": 20000, "GPU": 20000}, instance_ids={"GPU": ["0", "1"]})
        >>> plan_allocation(s, {"CPU": 1, "GPU": 0.5}).instances
        {'GPU': [(0, 5000)]}
    """
    units = _request_units(request)
    for name, u in units.items():
        base = _instance_base(name)
        if base is not None:
            _check_instance_amount(base, u)
    if not units:
        return Allocation(resources={}, instances={})
    pg_hex = placement.wildcard_group(units) if any("_group_" in n for n in units) else None
    if pg_hex is not None:
        group = state.groups().get(pg_hex)
        for index in range(len(group.group["bundles"]) if group is not None else 0):
            alloc = _plan_units(state, placement.resolve_wildcard(units, pg_hex, index),
                                instance_caps)
            if alloc is not None:
                return alloc
        return None
    return _plan_units(state, units, instance_caps)


def _plan_units(state: NodeState, units: dict[str, int],
                instance_caps: Mapping[str, list[int]] | None) -> Allocation | None:
    avail = state.available()
    instances: dict[str, list[tuple[int, int]]] = {}
    for name, u in units.items():
        if avail.get(name, 0) < u:
            return None
        base = _instance_base(name)
        if base is not None:
            free = state.instance_free(name)
            caps = (instance_caps or {}).get(name) if base == name else None
            if caps is not None:
                free = [min(f, c) for f, c in zip(free, caps)]
            picked = _pick_instances(free, u)
            if picked is None:
                return None
            instances[name] = picked
    return Allocation(resources=units, instances=instances)


def plan_group(
    state: NodeState,
    bundles: list[Mapping[str, float]],
    instance_caps: Mapping[str, list[int]] | None = None,
) -> tuple[Allocation, list[dict[str, list[tuple[int, int]]]]] | None:
    """Decides whether a placement group's ``bundles`` fit now, bundle after bundle, each
    packed as a task of that request would be (a bundle of one GPU gets a whole device of
    its own; two bundles of 0.5 GPU share one).

    Returns the group's allocation (the sum of the bundles, their instances) and each
    bundle's instances, or None if they do not all fit.

    >>> s = NodeState(totals={"CPU": 40000, "GPU": 20000}, instance_ids={"GPU": ["0", "1"]})
    >>> alloc, per_bundle = plan_group(s, [{"GPU": 1}, {"GPU": 1}])
    >>> per_bundle
    [{'GPU': [(0, 10000)]}, {'GPU': [(1, 10000)]}]
    """
    scratch = NodeState(totals=state.totals, instance_ids=state.instance_ids,
                        leases=dict(state.leases))
    resources: dict[str, int] = {}
    instances: dict[str, list[tuple[int, int]]] = {}
    per_bundle = []
    for i, bundle in enumerate(bundles):
        alloc = plan_allocation(scratch, bundle, instance_caps)
        if alloc is None:
            return None
        scratch.leases[f"\0bundle{i}"] = Lease(f"\0bundle{i}", 0, None, None,
                                               dict(alloc.resources), dict(alloc.instances))
        for name, u in alloc.resources.items():
            resources[name] = resources.get(name, 0) + u
        for name, picked in alloc.instances.items():
            instances.setdefault(name, []).extend(picked)
        per_bundle.append({k: list(v) for k, v in alloc.instances.items()})
    return Allocation(resources=resources, instances=instances), per_bundle


def infeasible_reasons(
    state: NodeState, request: Mapping[str, float]
) -> list[tuple[str, float, float]]:
    """What in ``request`` can never be satisfied on this node, even when it is idle.

    Returns ``[(resource, requested, node_total), ...]`` (a missing resource has total 0.0),
    or [] if the request fits an idle node. Raises ValueError as ``plan_allocation`` does.
    """
    reasons: list[tuple[str, float, float]] = []
    for name, u in _request_units(request).items():
        if "_group_" in name and placement.is_derived(name):
            continue  # a placement group's: checked against its bundles at submission
        total = state.totals.get(name, 0)
        if name in _UNIT_INSTANCE_SET:
            _check_instance_amount(name, u)
            n = len(state.instance_ids.get(name, ()))
            # An idle instance has 1.0 free: a fraction needs one instance, k >= 1 needs k.
            needed = 1 if u < UNIT else u // UNIT
            if n < needed or total < u:
                reasons.append((name, from_units(u), from_units(min(total, n * UNIT))))
        elif total < u:
            reasons.append((name, from_units(u), from_units(total)))
    return reasons


def _hint_for(names: Iterable[str]) -> str:
    args = []
    names = set(names)
    if "CPU" in names:
        args.append("num_cpus=...")
    if "GPU" in names:
        args.append("num_gpus=...")
    if names - {"CPU", "GPU"}:
        args.append("resources={...}")
    return ", ".join(args) or "resources={...}"


def format_infeasible(
    request: Mapping[str, float], reasons: Iterable[tuple[str, float, float]]
) -> str:
    """One line for stderr saying why ``request`` can never run here and what to do."""
    reasons = list(reasons)
    parts = []
    for i, (name, requested, total) in enumerate(reasons):
        has = f"none ({total})" if total == 0 else f"{total}"
        parts.append(f"{'needs ' if i == 0 else ''}{name} {requested} but the node has {has}")
    full = {k: from_units(to_units(v)) for k, v in sorted(request.items()) if to_units(v)}
    what = "; ".join(parts) if parts else "it exceeds the node's resources"
    return (
        f"miniray: this request can never run on this node: {what}. Start the node with more "
        f"resources (init({_hint_for(r[0] for r in reasons)})) or lower the request; the task "
        f"stays pending. Full request: {full}."
    )


def node_totals(
    num_cpus: float,
    num_gpus: float,
    resources: Mapping[str, float] | None,
    memory: int,
    object_store_memory: int,
    node_ip: str,
) -> dict[str, float]:
    """The node's totals with Ray's ``cluster_resources()`` keys, as floats.

    Keys: ``CPU``, ``GPU``, the custom resources, ``memory``, ``object_store_memory``,
    ``node:<ip>`` and ``node:__internal_head__``. Zero-valued entries are omitted, as Ray's
    resource maps omit them (so ``num_gpus=0`` gives no ``GPU`` key). Quantities are rounded
    to the 1/10000 resolution.
    """
    resources = dict(resources or {})
    for reserved in ("CPU", "GPU"):
        if reserved in resources:
            raise ValueError(
                f"Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU' in "
                f"'resources' keyword (got {reserved!r})"
            )
    totals: dict[str, float] = {
        "CPU": float(num_cpus or 0),
        "GPU": float(num_gpus or 0),
    }
    for name, amount in resources.items():
        totals[name] = float(amount)
    totals["memory"] = float(memory)
    totals["object_store_memory"] = float(object_store_memory)
    totals[f"node:{node_ip}"] = 1.0
    totals["node:__internal_head__"] = 1.0
    for name, amount in list(totals.items()):
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"resource {name!r}: total must be finite and >= 0, got {amount!r}")
        if name not in ("memory", "object_store_memory"):
            amount = from_units(to_units(amount))
        if amount == 0:
            del totals[name]
        else:
            totals[name] = amount
    return totals


def float_request(request: dict) -> dict:
    """A request's amounts as floats (what a worker's task context reports).

    >>> float_request({"CPU": 1, "GPU": 0.5})
    {'CPU': 1.0, 'GPU': 0.5}
    """
    return {name: float(value) for name, value in request.items()}


# ------------------------------------------------------------- the object store's size
# Ray's OBJECT_STORE_MINIMUM_MEMORY_BYTES and REQUIRE_SHM_SIZE_THRESHOLD.
OBJECT_STORE_MINIMUM_BYTES = 75 * 1024 * 1024
_REQUIRE_SHM_ABOVE = 10**10


def check_object_store_memory(value, total_memory: int | None, shm_free: int | None = None,
                              allow_slow_storage: bool = False) -> int | None:
    """``init(object_store_memory=...)`` as a whole number of bytes, or None for the default.

    Ray takes any number (``700e6`` included) and truncates it; it refuses less than 75 MiB
    and more than the host's memory with ValueError, and a non-number with TypeError. Above
    10 GB it also refuses more than ``/dev/shm`` has free (``shm_free``), unless
    ``allow_slow_storage`` (``RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1``).

    Example:
        >>> check_object_store_memory(700e6, 8 << 30)
        700000000
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            "object_store_memory must be a number of bytes (an int, or a float such as 2e9), "
            f"got {type(value).__name__} {value!r}."
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"object_store_memory must be a finite number of bytes, got {value!r}.")
    size = int(value)
    if size < OBJECT_STORE_MINIMUM_BYTES:
        raise ValueError(
            f"Attempting to cap object store memory usage at {size} bytes, but the minimum "
            f"allowed is {OBJECT_STORE_MINIMUM_BYTES} bytes (75 MiB). Pass a larger "
            "object_store_memory, or leave it out for the default (30% of available memory)."
        )
    if total_memory is not None and size > total_memory:
        raise ValueError(
            f"The requested object store memory size ({size} bytes, {size / (1 << 30):.1f} "
            f"GiB) is greater than the total memory of this host ({total_memory} bytes, "
            f"{total_memory / (1 << 30):.1f} GiB). Pass a smaller object_store_memory, or "
            "leave it out for the default (30% of available memory)."
        )
    if (shm_free is not None and size > shm_free and size > _REQUIRE_SHM_ABOVE
            and not allow_slow_storage):
        raise ValueError(
            f"The configured object store size ({size / 1e9} GB) exceeds /dev/shm size "
            f"({shm_free / 1e9} GB). This will harm performance. Consider deleting files in "
            "/dev/shm or increasing its size with --shm-size in Docker. To ignore this "
            "warning, set RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE=1."
        )
    return size
