"""Pure decisions about placement groups: validation, derived resource names, rewriting.

Owns: Ray's checks of ``placement_group()``'s arguments and of a bundle index, the names of
the resources a reserved group provides (``CPU_group_0_<hex>``, ``CPU_group_<hex>``,
``bundle_group_...``, as Ray names them), what each bundle provides, rewriting a task's or
actor's request into those names, resolving a request for "any bundle" (index -1) to one
bundle, and whether a group or a request can ever fit. Does not own: the reservation itself
(a ledger lease, ``ledger/ledger.py``, whose data model is ``resources.py``), the owner's
bookkeeping of pending groups (``owner/placement_groups.py``) or the public API
(``miniray/util/placement_group.py``). Every function is free of I/O and unit-tested.

Design (mirrors Ray's raylet)::

    placement_group(bundles) ──► one ledger lease, held by the creating driver (a detached
        group: by the node), taking the bundles' sum of CPU/GPU/...; GPU bundles get
        specific devices, packed bundle by bundle as tasks are.
        The lease *provides* derived resources, which the ledger adds to what is available:
            CPU_group_<i>_<hex>     bundle i's CPU            (for each resource R of it)
            CPU_group_<hex>         every bundle's CPU        (the wildcard)
            bundle_group_<i>_<hex>  1000 per bundle, bundle_group_<hex> 1000 per bundle
    task in bundle i:  {"CPU": 1} ──► {"CPU_group_i_<hex>": 1, "CPU_group_<hex>": 1,
                                       "bundle_group_i_<hex>": 0.001, "bundle_group_<hex>": ...}
    task in any bundle (-1): the wildcard names only; the ledger resolves them, under its
        lock, to the first bundle with room (``resolve_wildcard``) and takes that bundle's
        names too.
    a GPU bundle's derived GPU name carries the bundle's device indices, so a task in it
    gets devices from within them (``instance_ids_of``).

Every bundle carries the node it is on (``node_pick.plan_bundles`` chooses them in a
cluster); a node's ledger reserves only its own bundles, so what it provides is numbered by
the group's bundle indexes (``bundle_provides(..., indexes)``), not by position in that
subset. A task in a bundle on another node is recognised by its rewritten request
(``bundle_request``) and started in a bundle with room (``pick_bundle``) by
``owner/remote_bundles.py``.

Mirrors ``ray.util.placement_group``'s validation (Ray 2.60). Differs: outside a cluster, a
STRICT_SPREAD group of more than one bundle is refused at once, and a group larger than the
node is reported at once (Ray keeps both pending with no message).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

__all__ = [
    "BUNDLE_UNITS",
    "STRATEGIES",
    "bundle_provides",
    "bundle_request",
    "bundle_elsewhere",
    "check_bundle_index",
    "check_bundles",
    "check_lifetime",
    "check_strategy",
    "check_topology_strategy",
    "fits_bundle",
    "group_infeasible",
    "group_of",
    "key_in_group",
    "is_derived",
    "parse_derived",
    "pick_bundle",
    "pick_gpus",
    "pick_instances",
    "place",
    "resolve_option",
    "resolve_wildcard",
    "rewrite_request",
    "wildcard_group",
]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
NODE_ID_LABEL_KEY = "ray.io/node-id"  # Ray's: the node-level entry of topology_strategy
BUNDLE_UNITS = 1000.0  # what each bundle provides of bundle_group_* (Ray's 1000)
TASK_BUNDLE_AMOUNT = 0.001  # what a task or actor in a bundle takes of it (Ray's)
INSTANCE_UNIT = 10_000  # one whole device in units (resources.UNIT, which imports this)

# R_group_<i>_<hex> (indexed) or R_group_<hex> (wildcard); hex is 36 characters.
_DERIVED = re.compile(r"^(?P<base>.+)_group_(?:(?P<index>\d+)_)?(?P<hex>[0-9a-f]{36})$")


# -- validation (Ray's wording) ----------------------------------------------------------------


def check_bundles(bundles: Any) -> list[dict[str, float]]:
    """Ray's checks of ``bundles``; returns them as a list of dicts of floats.

    >>> check_bundles([{"CPU": 1}])
    [{'CPU': 1.0}]
    """
    if not isinstance(bundles, list):
        raise ValueError(f"Placement group bundles must be a list, got {type(bundles)}.")
    example = 'For example: `[{"CPU": 1.0}, {"GPU": 1.0}]`.'
    if not bundles:
        raise ValueError(
            f"Bundles must be a non-empty list of resource dictionaries. {example} "
            "Got empty list instead."
        )
    out = []
    for bundle in bundles:
        if not isinstance(bundle, dict):
            raise ValueError(
                f"Bundles must be a non-empty list of resource dictionaries. {example}")
        if not bundle or all(v == 0 for v in bundle.values()):
            raise ValueError(
                "Bundles cannot be an empty dictionary or resources with only 0 values. "
                f"Bundles: {bundles}"
            )
        clean = {}
        for name, amount in bundle.items():
            if (not isinstance(name, str) or isinstance(amount, bool)
                    or not isinstance(amount, (int, float))
                    or not math.isfinite(amount) or amount < 0):
                raise ValueError(
                    f"Bundle resources must map names to finite amounts >= 0; got "
                    f"{name!r}: {amount!r} in bundles {bundles}")
            if amount:
                clean[name] = float(amount)
        out.append(clean)
    return out


def check_strategy(strategy: Any) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(
            f"Invalid placement group strategy {strategy}. Supported strategies are: "
            f"{set(STRATEGIES)}."
        )
    return strategy


def check_topology_strategy(strategy: Any, topology: Any) -> str:
    """Ray's checks of ``strategy`` with ``topology_strategy``; returns the node-level
    strategy (``strategy``, or ``topology[NODE_ID_LABEL_KEY]``, "PACK" when neither names
    one). Other topology labels (at most one, STRICT_PACK only, as Ray allows) are left to
    the caller.

    >>> check_topology_strategy(None, None), check_topology_strategy(None, {NODE_ID_LABEL_KEY:
    ...     "SPREAD"})
    ('PACK', 'SPREAD')
    """
    if topology is not None and strategy is not None:
        raise ValueError(
            "`strategy` and `topology_strategy` cannot both be specified. Pass node-level "
            f"packing via `topology_strategy['{NODE_ID_LABEL_KEY}']`.")
    if strategy is not None:
        check_strategy(strategy)
    if topology is None:
        return strategy if strategy is not None else "PACK"
    if not isinstance(topology, dict):
        raise ValueError(f"`topology_strategy` must be a dict, got {type(topology).__name__}.")
    if len(topology) > 2:
        raise ValueError(
            f"`topology_strategy` must contain 0, 1, or 2 entries: `{NODE_ID_LABEL_KEY}` plus "
            f"an optional topology label. Got {len(topology)} entries.")
    others = []
    for label, value in topology.items():
        if not isinstance(label, str) or not label:
            raise ValueError(f"`topology_strategy` keys must be non-empty strings, got "
                             f"{label!r}.")
        if value not in STRATEGIES:
            raise ValueError(f"Invalid topology strategy {value!r} for label {label!r}. "
                             f"Supported strategies are: {set(STRATEGIES)}.")
        if label != NODE_ID_LABEL_KEY:
            others.append(label)
            if value != "STRICT_PACK":
                raise ValueError(
                    f"Topology strategy {value!r} for label {label!r} is not supported yet; "
                    "only 'STRICT_PACK' is supported for topology labels other than "
                    f"`{NODE_ID_LABEL_KEY}` for now.")
    if len(others) > 1:
        raise ValueError(
            "`topology_strategy` currently supports at most one topology label other than "
            f"`{NODE_ID_LABEL_KEY}`. Got {others}.")
    return topology.get(NODE_ID_LABEL_KEY, "PACK")


def check_lifetime(lifetime: Any) -> bool:
    """True for a detached group."""
    if lifetime not in (None, "detached"):
        raise ValueError(
            "Placement group `lifetime` argument must be either `None` or 'detached'. "
            f"Got {lifetime}."
        )
    return lifetime == "detached"


def check_bundle_index(index: Any, bundle_count: int) -> None:
    """Ray's check of ``placement_group_bundle_index`` against the group's bundles."""
    if not isinstance(index, int) or isinstance(index, bool) or not (
            -1 <= index < bundle_count):
        raise ValueError(
            f"placement group bundle index {index} is invalid. Valid placement group "
            f"indexes: 0-{bundle_count}"
        )


def group_infeasible(bundles: list[dict[str, float]], strategy: str, nodes: int,
                     totals: Mapping[str, float]) -> str | None:
    """Why a group can never be placed on ``nodes`` nodes with these ``totals`` (the sum over
    the nodes), or None. Only the sums are checked here: instance packing (two bundles of
    one whole GPU on a one-GPU node) is the ledger's to find."""
    if strategy == "STRICT_SPREAD" and len(bundles) > nodes:
        return (
            f"a STRICT_SPREAD placement group puts each of its {len(bundles)} bundles on a "
            f"different node, and this cluster has {nodes} node{'s' if nodes != 1 else ''}; "
            "use PACK or SPREAD, or fewer bundles"
        )
    need: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            need[name] = need.get(name, 0.0) + amount
    short = [f"{name} {amount:g} but the node has {totals.get(name, 0.0):g}"
             for name, amount in sorted(need.items())
             if amount > totals.get(name, 0.0) + 1e-9]
    if short:
        return "its bundles need " + "; ".join(short)
    return None


# -- derived resources -------------------------------------------------------------------------


def is_derived(name: str) -> bool:
    return "_group_" in name and _DERIVED.match(name) is not None


def parse_derived(name: str) -> tuple[str, int | None, str] | None:
    """``(base, index or None for the wildcard, hex)`` of a derived name, or None.

    >>> parse_derived("GPU_group_1_" + "a" * 36)[:2], parse_derived("CPU")
    (('GPU', 1), None)
    """
    m = _DERIVED.match(name)
    if m is None:
        return None
    index = m.group("index")
    return m.group("base"), None if index is None else int(index), m.group("hex")


def bundle_provides(pg_hex: str, bundles: list[dict[str, float]],
                    indexes: list[int] | None = None) -> dict[str, float]:
    """Every derived resource a reserved group provides, with its amount. ``indexes``: the
    group's index of each of ``bundles`` when they are a subset of the group (the bundles
    one node holds); None: ``bundles`` is the whole group, numbered by position.

    >>> h = "a" * 36
    >>> bundle_provides(h, [{"CPU": 1.0}])["CPU_group_0_" + h]
    1.0
    >>> sorted(n[:-37] for n in bundle_provides(h, [{"CPU": 1.0}], [2]))
    ['CPU_group', 'CPU_group_2', 'bundle_group', 'bundle_group_2']
    """
    if indexes is None:
        indexes = list(range(len(bundles)))
    if len(indexes) != len(bundles):
        raise ValueError(f"bundle_provides: {len(bundles)} bundles but {len(indexes)} indexes")
    out: dict[str, float] = {}
    for index, bundle in zip(indexes, bundles):
        for name, amount in {**bundle, "bundle": BUNDLE_UNITS}.items():
            out[f"{name}_group_{index}_{pg_hex}"] = amount
            wildcard = f"{name}_group_{pg_hex}"
            out[wildcard] = out.get(wildcard, 0.0) + amount
    return out


def rewrite_request(request: Mapping[str, float], pg_hex: str,
                    index: int) -> dict[str, float]:
    """A task's or actor's request inside a group: every resource becomes the bundle's (and
    the wildcard's), plus Ray's 0.001 of ``bundle_group``. ``index`` -1: the wildcard only,
    resolved by the ledger to a bundle with room.

    >>> sorted(rewrite_request({"CPU": 1}, "h" * 4, -1))  # (a real hex has 36 characters)
    ['CPU_group_hhhh', 'bundle_group_hhhh']
    """
    out: dict[str, float] = {}
    for name, amount in {**request, "bundle": TASK_BUNDLE_AMOUNT}.items():
        if not amount:
            continue
        out[f"{name}_group_{pg_hex}"] = amount
        if index >= 0:
            out[f"{name}_group_{index}_{pg_hex}"] = amount
    return out


def wildcard_group(units: Mapping[str, Any]) -> str | None:
    """The group's hex when a (rewritten) request asks for any bundle of it, else None.

    >>> h = "a" * 36
    >>> wildcard_group(rewrite_request({"CPU": 1}, h, -1)) == h
    True
    >>> wildcard_group(rewrite_request({"CPU": 1}, h, 0)), wildcard_group({"CPU": 1})
    (None, None)
    """
    found = None
    for name in units:
        if name.startswith("bundle_group_"):
            parsed = parse_derived(name)
            if parsed is None:
                continue
            if parsed[1] is not None:
                return None
            found = parsed[2]
    return found


def group_of(request: Mapping[str, Any]) -> str | None:
    """The hex of the group a (rewritten) request is scheduled into, or None.

    >>> group_of(rewrite_request({"CPU": 1}, "a" * 36, 0)) == "a" * 36, group_of({"CPU": 1})
    (True, None)
    """
    for name in request:
        if name.startswith("bundle_group_"):
            parsed = parse_derived(name)
            if parsed is not None:
                return parsed[2]
    return None


def key_in_group(items, pg_hex: str) -> bool:
    """Whether a scheduling key's resource items (``(name, amount)`` pairs) belong to the
    group: they name its wildcard ``bundle_group``."""
    wildcard = f"bundle_group_{pg_hex}"
    return any(name == wildcard for name, _amount in items)


def resolve_wildcard(units: Mapping[str, Any], pg_hex: str, index: int) -> dict[str, Any]:
    """A wildcard request with bundle ``index``'s names added (same amounts)."""
    out = dict(units)
    suffix = f"_group_{pg_hex}"
    for name, amount in units.items():
        if name.endswith(suffix):
            out[f"{name[:-len(suffix)]}_group_{index}_{pg_hex}"] = amount
    return out


def bundle_request(request: Mapping[str, float]) -> tuple[str, int, dict[str, float]] | None:
    """``(hex, bundle index or -1 for any bundle, the request before rewriting)`` of a
    request that ``rewrite_request`` made, or None for one outside a group. Ray's 0.001 of
    ``bundle_group`` is left out of the base request.

    >>> h = "a" * 36
    >>> bundle_request(rewrite_request({"CPU": 2}, h, 1)) == (h, 1, {"CPU": 2})
    True
    >>> bundle_request(rewrite_request({"CPU": 2}, h, -1))[1:], bundle_request({"CPU": 1})
    ((-1, {'CPU': 2}), None)
    """
    pg_hex, index, base = None, -1, {}
    for name, amount in request.items():
        parsed = parse_derived(name) if "_group_" in name else None
        if parsed is None:
            continue
        pg_hex = parsed[2]
        if parsed[1] is not None:
            index = parsed[1]
        elif parsed[0] != "bundle":
            base[parsed[0]] = amount
    return None if pg_hex is None else (pg_hex, index, base)


def pick_bundle(request: Mapping[str, float], index: int,
                free: Mapping[int, Mapping[str, float]],
                gpus: Mapping[int, list[int]] | None = None) -> int | None:
    """Which bundle of ``free`` (index -> what is free in it now) a task of ``request``
    starts in now: bundle ``index`` if it has room, or for -1 the lowest index with room;
    None: it waits (a bundle not in ``free`` is not this caller's). With ``gpus`` (index
    -> each of its GPUs' free units), a GPU request also needs devices (``pick_gpus``).

    >>> pick_bundle({"CPU": 1}, -1, {1: {"CPU": 0.5}, 3: {"CPU": 1.0}})
    3
    >>> pick_bundle({"CPU": 1}, 1, {1: {"CPU": 0.5}, 3: {"CPU": 1.0}}) is None
    True
    >>> pick_bundle({"GPU": 0.6}, 0, {0: {"GPU": 0.8}}, {0: [4000, 4000]}) is None
    True
    """
    candidates = sorted(free) if index < 0 else [index] if index in free else []
    for candidate in candidates:
        if not _has_room(free[candidate], request):
            continue
        if (gpus is not None and request.get("GPU")
                and pick_gpus(gpus.get(candidate, []), request["GPU"]) is None):
            continue
        return candidate
    return None


def bundle_elsewhere(index: int, nodes: list[str], local: str) -> list[int]:
    """The bundles on other nodes that a task for bundle ``index`` (-1: any) of a group
    whose bundles are on ``nodes`` (its record's, by index) is bound to, when none of
    them is on ``local``; [] when it can run on ``local`` (or nothing says where).

    >>> bundle_elsewhere(1, ["a", "b"], "a"), bundle_elsewhere(0, ["a", "b"], "a")
    ([1], [])
    >>> bundle_elsewhere(-1, ["b", "c"], "a"), bundle_elsewhere(-1, ["b", "a"], "a")
    ([0, 1], [])
    """
    if not nodes:
        return []
    if index >= 0:
        return [index] if index < len(nodes) and nodes[index] != local else []
    return [] if local in nodes else list(range(len(nodes)))


def bundles_free(available: Mapping[str, float], pg_hex: str) -> dict[int, dict[str, float]]:
    """What is free now in each bundle of group ``pg_hex`` that a node's ledger provides,
    by bundle index (``available``: the ledger's free amounts, zero ones left out, as
    ``Ledger.available`` gives them), for ``pick_bundle``; every bundle of the group the
    node holds is there (its ``bundle_group`` share is never all taken), one with nothing
    free as ``{}``.

    >>> h = "a" * 36
    >>> b = {"bundle_group_0_" + h: 1.0, "bundle_group_1_" + h: 1.0, "bundle_group_" + h: 2.0}
    >>> bundles_free({**b, "CPU_group_1_" + h: 1.0, "CPU_group_" + h: 1.0, "CPU": 3.0}, h)
    {0: {}, 1: {'CPU': 1.0}}
    """
    out: dict[int, dict[str, float]] = {}
    for name, amount in available.items():
        parsed = parse_derived(name) if "_group_" in name else None
        if parsed is None or parsed[2] != pg_hex or parsed[1] is None:
            continue
        free = out.setdefault(parsed[1], {})
        if parsed[0] != "bundle":
            free[parsed[0]] = float(amount)
    return dict(sorted(out.items()))


def pick_gpus(free: list[int], amount: float) -> list[tuple[int, int]] | None:
    """Which of a bundle's GPUs (``free``: each one's free units, ``resources.UNIT`` a
    whole GPU) a task of ``amount`` GPUs takes, as ``(position, units)`` pairs: as the
    node's ledger picks devices (a fraction fills one GPU before the next, a whole amount
    takes that many idle GPUs); [] for no GPU; None: not free now.

    >>> pick_gpus([10000, 10000], 1), pick_gpus([4000, 10000], 0.5), pick_gpus([5000], 1)
    ([(0, 10000)], [(1, 5000)], None)
    """
    units = round(float(amount) * INSTANCE_UNIT) if amount else 0
    if units <= 0:
        return []
    return pick_instances(list(free), units)


def pick_instances(free: list[int], u: int) -> list[tuple[int, int]] | None:
    """Instances for ``u`` units of one unit-instance resource (GPU), or None if they are
    not free (the node's ledger's rule, ``resources.plan_allocation``, and a remote
    bundle's, ``pick_gpus``).

    A fraction goes to the instance with the least free capacity that still fits (best fit,
    ties to the lowest index), so fractions fill one device before starting the next. A whole
    request takes that many completely free instances, lowest indices first.
    """
    if u < INSTANCE_UNIT:
        best = -1
        for index, f in enumerate(free):
            if f >= u and (best < 0 or f < free[best]):
                best = index
        return None if best < 0 else [(best, u)]
    k = u // INSTANCE_UNIT
    whole = [index for index, f in enumerate(free) if f == INSTANCE_UNIT][:k]
    return [(index, INSTANCE_UNIT) for index in whole] if len(whole) == k else None


def keeps_instances(name: str) -> bool:
    """Whether a lease's amount of ``name`` is tied to devices (GPU, or a bundle's GPU), so
    an actor's lease cannot be shrunk in it."""
    if name == "GPU":
        return True
    parsed = parse_derived(name) if "_group_" in name else None
    return parsed is not None and parsed[0] == "GPU" and parsed[1] is not None


def as_leased(request: Mapping[str, float], held: Mapping[str, float],
              leased: Mapping[str, Any]) -> tuple[dict, dict]:
    """An actor's placement and held requests with the bundle its lease resolved "any
    bundle" to (``leased``: the lease's resources), so that shrinking the lease to what the
    actor holds covers the bundle's own names too. Other requests come back unchanged.

    >>> h = "a" * 36
    >>> p, k = as_leased(rewrite_request({"CPU": 1}, h, -1), rewrite_request({}, h, -1),
    ...                  resolve_wildcard(rewrite_request({"CPU": 1}, h, -1), h, 1))
    >>> sorted(n[:-37] for n in p)
    ['CPU_group', 'CPU_group_1', 'bundle_group', 'bundle_group_1']
    >>> sorted(n[:-37] for n in k)
    ['bundle_group', 'bundle_group_1']
    """
    pg_hex = wildcard_group(request)
    if pg_hex is None:
        return dict(request), dict(held)
    for name in leased:
        parsed = parse_derived(name) if name.startswith("bundle_group_") else None
        if parsed is not None and parsed[1] is not None and parsed[2] == pg_hex:
            return (resolve_wildcard(request, pg_hex, parsed[1]),
                    resolve_wildcard(held, pg_hex, parsed[1]))
    return dict(request), dict(held)


def fits_bundle(request: Mapping[str, float], bundles: list[dict[str, float]],
                index: int) -> bool:
    """Whether ``request`` fits in bundle ``index`` (any bundle for -1) when it is idle."""
    candidates = bundles if index < 0 else [bundles[index]]
    return any(_has_room(bundle, request) for bundle in candidates)


def _has_room(room: Mapping[str, float], request: Mapping[str, float]) -> bool:
    """Whether ``room`` (a bundle's amounts, or what is free in it) holds ``request``."""
    return all(room.get(name, 0.0) + 1e-9 >= amount for name, amount in request.items()
               if amount)


def resolve_option(placed: Any, current: tuple | None) -> tuple | None:
    """Which group a call goes to, as Ray decides at ``.remote()``: ``placed`` is
    ``options.placement_option``'s answer, ``current`` the caller's own group context
    ``(hex, bundles, capture)`` (None in the driver or outside a group). Returns
    ``(hex, bundles, bundle_index, capture)`` or None (no group). A capture left unset is
    the caller's; a call naming no group goes to the caller's when that one captures.

    >>> current = ("a" * 36, [{"CPU": 1.0}], True)
    >>> resolve_option(("default", -1, None), current)[2:]
    (-1, True)
    >>> resolve_option(("default", -1, False), current), resolve_option(None, current)
    (None, None)
    """
    if placed is None:
        return None
    group, index, capture = placed
    if capture is None:
        capture = bool(current is not None and current[2])
    if isinstance(group, str):  # "default": the caller's group, if it captures
        if not capture or current is None:
            return None
        return current[0], current[1], index, capture
    if group.is_empty():
        return None
    return group.id.hex(), group.bundle_specs, index, bool(capture)


def place(request: Mapping[str, float], pg_hex: str, bundles: list[dict[str, float]],
          index: int, capture: bool, name: str) -> tuple[dict[str, float], tuple]:
    """A call's request scheduled into a group: ``(rewritten request, context)``, the
    context ``(hex, bundles, capture_child_tasks)`` being what the call sees as its current
    group. Raises Ray's ValueError for a bad bundle index or a request no bundle can hold.

    >>> place({"CPU": 1}, "a" * 36, [{"CPU": 1.0}], 0, False, "f")[1][2]
    False
    """
    check_bundle_index(index, len(bundles))
    if not fits_bundle(request, bundles, index):
        raise ValueError(cannot_fit_message(name, request, bundles))
    return rewrite_request(request, pg_hex, index), (pg_hex, bundles, capture)


def cannot_fit_message(name: str, request: Mapping[str, float],
                       bundles: list[dict[str, float]]) -> str:
    """Ray's ValueError text for a request no bundle of the group can hold."""
    shown = {k: (int(v) if float(v).is_integer() else v) for k, v in request.items()}
    return (
        f"Cannot schedule {name} with the placement group because the resource request "
        f"{shown} cannot fit into any bundles for the placement group, {bundles}."
    )
