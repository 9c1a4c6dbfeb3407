"""``miniray.util``: accelerators, scheduling strategies and helpers.

Mirrors ``ray.util`` (Ray 2.60): accelerators, ActorPool, queue, multiprocessing (Pool),
list_named_actors, scheduling_strategies, placement_group (importable; creating one
raises). Differs: ``collective``, ``pdb`` and ``ray_debugpy`` are not provided.
"""

from __future__ import annotations

from miniray._private import runtime
from miniray.util import accelerators
from miniray.util.actor_pool import ActorPool

__all__ = ["accelerators", "ActorPool", "get_node_ip_address", "inspect_serializability",
           "list_named_actors"]


def list_named_actors(all_namespaces: bool = False) -> list:
    """Names of the live named actors in the current namespace; with ``all_namespaces``, a
    list of ``{"name", "namespace"}`` dicts."""
    return runtime.auto_init().list_named_actors(all_namespaces)


def get_node_ip_address(address: str | None = None) -> str:
    """The address of this node: always loopback on one host."""
    return "127.0.0.1"


def inspect_serializability(obj, name: str | None = None, depth: int = 3, print_file=None):
    """Whether ``obj`` can be pickled for a task; returns ``(ok, failures)``."""
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
        return True, set()
    except Exception as error:
        print(f"{name or obj!r} cannot be serialized: {type(error).__name__}: {error}",
              file=print_file)
        return False, {repr(obj)}
