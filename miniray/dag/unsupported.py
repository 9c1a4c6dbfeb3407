"""What miniray's DAGs refuse: compiled graphs (Ray's "Compiled Graphs", aDAG) and plotting.

Owns: the refusal message and the compiled-graph names of ``ray.dag`` (``DAGContext``,
``CollectiveOutputNode``, ``DAGOperationFuture``, ``GPUFuture``, ``plot``), present so that
importing them works and using them says what to do instead. Does not own: the nodes.

Mirrors the names of ``ray.dag`` (Ray 2.60). Differs: each raises NotImplementedError;
``execute()`` runs the same DAG by submitting its tasks and actor calls.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CollectiveOutputNode", "DAGContext", "DAGOperationFuture", "GPUFuture",
           "compiled_graphs_refused", "plot"]


def compiled_graphs_refused(what: str) -> str:
    """The message of the NotImplementedError a compiled-graph feature raises."""
    return (f"{what}: compiled graphs are not supported by miniray. Run the DAG with "
            "dag.execute(*inputs), which submits the same tasks and actor calls and returns "
            "ObjectRefs (ray.get them); or run the program on Ray for compiled graphs.")


class CollectiveOutputNode:
    """Ray's collective operation node (compiled graphs only)."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(compiled_graphs_refused("CollectiveOutputNode"))


class DAGOperationFuture:
    """Ray's future of a compiled-graph operation."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(compiled_graphs_refused("DAGOperationFuture"))


class GPUFuture:
    """Ray's future of a compiled-graph GPU operation."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(compiled_graphs_refused("GPUFuture"))


class DAGContext:
    """Ray's settings of compiled graphs."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(compiled_graphs_refused("DAGContext"))

    @classmethod
    def get_current(cls) -> DAGContext:
        raise NotImplementedError(compiled_graphs_refused("DAGContext.get_current()"))


def plot(dag: Any, to_file: Any = None) -> Any:
    """Ray draws a DAG with pydot; miniray does not: raises NotImplementedError."""
    raise NotImplementedError(
        "ray.dag.plot is not supported by miniray; print(dag) shows the DAG as text.")


for _cls in (CollectiveOutputNode, DAGOperationFuture, GPUFuture, DAGContext):
    _cls.__module__ = "miniray.dag"
