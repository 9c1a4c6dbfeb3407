"""``miniray.util``: accelerators, scheduling strategies and helpers.

Mirrors ``ray.util`` (Ray 2.60): accelerators, ActorPool, queue, multiprocessing (Pool),
list_named_actors, scheduling_strategies, placement_group,
log_once (from ``miniray.util.debug``), get_node_instance_id, register_serializer /
deregister_serializer, metrics, as_completed / map_unordered (``helpers``),
inspect_serializability (``check_serialize``), joblib (``register_ray``);
``connect``/``disconnect`` (Ray Client) raise NotImplementedError saying how to connect
instead. Differs: ``pdb``, ``ray_debugpy`` and the deprecated ``iter`` are not provided;
``collective`` raises ImportError saying how to run on Ray
(``miniray/_private/core/out_of_scope.py``).
"""

from __future__ import annotations

from miniray._private import runtime
from miniray._private.core import config, context
from miniray._private.core.ray_client import connect, disconnect
from miniray.util import accelerators
from miniray.util.actor_pool import ActorPool
from miniray.util.check_serialize import inspect_serializability
from miniray.util.debug import disable_log_once_globally, enable_periodic_logging, log_once
from miniray.util.helpers import as_completed, map_unordered
from miniray.util.placement_group import (
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = ["accelerators", "ActorPool", "as_completed", "connect", "deregister_serializer",
           "disable_log_once_globally", "disconnect", "enable_periodic_logging",
           "get_node_instance_id", "get_node_ip_address", "inspect_serializability",
           "list_named_actors", "log_once", "map_unordered", "register_serializer",
           "get_current_placement_group", "get_placement_group", "placement_group",
           "placement_group_table", "remove_placement_group"]


def list_named_actors(all_namespaces: bool = False) -> list:
    """Names of the live named actors in the current namespace; with ``all_namespaces``, a
    list of ``{"name", "namespace"}`` dicts."""
    return runtime.auto_init().list_named_actors(all_namespaces)


def get_node_instance_id() -> str:
    """The cloud instance id of this node: ``$RAY_CLOUD_INSTANCE_ID``, "" when unset (as Ray,
    which reads the same variable; it does not need ``init()``)."""
    return config.cloud_instance_id()


def get_node_ip_address(address: str | None = None) -> str:
    """The IP address of the node this process runs on: in a driver its node's, in a task
    or actor that of the node running it (a member's, on another host); before ``init()``,
    loopback (the address of a single-host node). ``address`` is accepted as in Ray and
    not needed: a node's address is known, never probed."""
    rt = context.current()
    if rt is None:
        return "127.0.0.1"
    if rt.mode == "worker":
        return rt.info.get("node_ip") or "127.0.0.1"
    return getattr(rt, "node_ip", None) or "127.0.0.1"


def register_serializer(cls: type, *, serializer, deserializer) -> None:
    """Pickle instances of ``cls`` as ``serializer(obj)``, rebuilt by ``deserializer``.

    The deserializer travels inside each pickle (as in Ray 2.60), so any process can load what
    this one serialized. Registered in the driver, it is also honoured by every worker of the
    session, those started later included, for what they serialize (results, ``put``,
    arguments); Ray leaves workers to register it themselves. Registered in a worker, it
    holds in that worker only, as in Ray."""
    from miniray._private import api  # lazy: importing util loads no engine

    api.register_serializer(cls, serializer, deserializer)


def deregister_serializer(cls: type) -> None:
    """Forget the serializer of ``cls``; no effect when it has none (as in Ray 2.60)."""
    from miniray._private import api  # lazy: importing util loads no engine

    api.deregister_serializer(cls)
