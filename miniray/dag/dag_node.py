"""DAGNode: the base of every node of a Ray DAG, and how a DAG is executed.

Mirrors ``ray.dag.dag_node`` (Ray 2.60): a node holds its bound ``args``, ``kwargs``,
``options`` and ``other_args_to_resolve`` (nodes may sit inside any of them, also nested in
lists, tuples, dicts and sets); ``execute(*args, **kwargs)`` runs the DAG once with those
inputs and warns that it is deprecated, as Ray 2.60 does; ``apply_recursive(fn)`` applies
``fn`` bottom-up to a copy of each node whose child nodes were replaced by ``fn``'s results,
once per node (by its stable uuid) even when it is referenced twice. Calling ``.remote()``
or ``.bind()`` on a node raises Ray's AttributeError.

Differs: ``experimental_compile()`` raises NotImplementedError (compiled graphs are not
supported; ``execute()`` runs the same graph). A node nested inside an object other than
those containers is not found, and the node refuses to be pickled, saying so (Ray's
pickling scan finds it). ``str(node)`` is a tree of the same fields in miniray's layout.

Owns: the walk of ``execute()``; the node kinds (``function_node.py``, ``class_node.py``,
``input_node.py``, ``output_node.py``) own what running one node does. Executing submits
through the public paths (``f.options(...).remote()``, ``handle.method.remote()``), passing
upstream ObjectRefs as arguments: nothing is fetched in the driver between stages.
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any, Callable, TypeVar

from miniray.dag import _walk
from miniray.dag.unsupported import compiled_graphs_refused
from miniray.util.annotations import RayDeprecationWarning

__all__ = ["DAGNode"]

T = TypeVar("T")

_TRANSPORTS = ("auto", "nccl", "accelerator", "shm")
_DEVICES = ("default", "cpu", "gpu", "cuda")


class DAGNode:
    """A node of a Ray DAG: a bound call whose arguments may be other nodes.

    Example:
        >>> @ray.remote
        ... def inc(x):
        ...     return x + 1
        >>> with ray.dag.InputNode() as inp:
        ...     dag = inc.bind(inc.bind(inp))
        >>> ray.get(dag.execute(1))
        3
    """

    # An InputNode says so here, so the walk can hold "one InputNode per DAG" without
    # importing input_node (which imports this module).
    _is_input_node = False

    def __init__(self, args: Any, kwargs: dict | None, options: dict | None,
                 other_args_to_resolve: dict | None):
        self._bound_args = args or []
        self._bound_kwargs = kwargs or {}
        self._bound_options = options or {}
        self._bound_other_args_to_resolve = other_args_to_resolve or {}
        # Stable across the copies execute() makes: the key of "run each node once".
        self._stable_uuid = uuid.uuid4().hex
        self._upstream: list | None = None
        self.cache_from_last_execute: dict = {}

    @property
    def _upstream_nodes(self) -> list:
        """The nodes this node's arguments hold (found on first use: the copies execute()
        makes hold the inputs' values, which need no scan)."""
        if self._upstream is None:
            self._upstream = _walk.find_nodes(
                [self._bound_args, self._bound_kwargs, self._bound_other_args_to_resolve],
                DAGNode)
        return self._upstream

    # -- what Ray's DAGNode offers -----------------------------------------------------
    def get_args(self) -> Any:
        """The bound positional arguments."""
        return self._bound_args

    def get_kwargs(self) -> dict:
        """A copy of the bound keyword arguments."""
        return self._bound_kwargs.copy()

    def get_options(self) -> dict:
        """A copy of the options the node runs with (``.options()`` before ``.bind()``)."""
        return self._bound_options.copy()

    def get_other_args_to_resolve(self) -> dict:
        """A copy of the node's other arguments (the actor of a method call, ...)."""
        return self._bound_other_args_to_resolve.copy()

    def get_stable_uuid(self) -> str:
        """The node's id, the same for every copy ``execute()`` makes of it."""
        return self._stable_uuid

    def clear_cache(self) -> None:
        self.cache_from_last_execute = {}

    async def get_object_refs_from_last_execute(self) -> dict:
        """The results of each node of the last ``execute(..., _ray_cache_refs=True)``,
        by stable uuid."""
        return dict(self.cache_from_last_execute)

    def execute(self, *args: Any, _ray_cache_refs: bool = False, **kwargs: Any) -> Any:
        """Run the DAG once: each node is submitted once, upstream results travel as
        ObjectRefs. ``args``/``kwargs`` are the InputNode's value.

        Returns:
            The root's result: an ObjectRef for a function or method node, an ActorHandle
            for a class node, a list of them for a MultiOutputNode.
        """
        warnings.warn(  # Ray 2.60 warns on every execute(), with this text
            "DAGNode.execute() is deprecated and will be removed in a future release.",
            RayDeprecationWarning, stacklevel=2)
        results = self._apply(lambda node: node._execute_impl(*args, **kwargs))
        if _ray_cache_refs:
            self.cache_from_last_execute = results
        return results[self._stable_uuid]

    def apply_recursive(self, fn: Callable[[DAGNode], T]) -> T:
        """Apply ``fn`` to each node of the DAG, children first; ``fn`` gets a copy of the
        node whose child nodes were replaced by what ``fn`` returned for them. Each node is
        applied once, however often it is referenced.

        Returns:
            ``fn``'s result for this node.
        """
        return self._apply(fn)[self._stable_uuid]

    def experimental_compile(self, *args: Any, **kwargs: Any):
        """Compiled graphs are not supported: raises NotImplementedError."""
        raise NotImplementedError(compiled_graphs_refused("experimental_compile()"))

    def with_tensor_transport(self, transport: Any = "auto", device: str = "default",
                              _static_shape: bool = False, _direct_return: bool = False):
        """Accepted as Ray accepts it: a hint for compiled graphs, which ``execute()``
        ignores (as Ray's does). A custom Communicator raises NotImplementedError."""
        if device not in _DEVICES:
            valid = ", ".join(f"'{d}'" for d in _DEVICES)
            raise ValueError(f"Invalid device '{device}'. Valid options are: {valid}.")
        if not isinstance(transport, str):
            raise NotImplementedError(
                compiled_graphs_refused("with_tensor_transport() with a Communicator"))
        if transport not in _TRANSPORTS:
            raise ValueError(
                f"Invalid transport type: {transport}. Transport must be one of 'auto', "
                "'nccl', 'shm', 'accelerator' or an instance of Communicator type.")
        return self

    # -- the walk -----------------------------------------------------------------------
    def _apply(self, fn: Callable[[DAGNode], Any]) -> dict:
        """``fn`` applied bottom-up to each node (as ``apply_recursive``): results by
        stable uuid."""
        results: dict = {}
        input_uuid = None
        for node in _walk.post_order(self, lambda n: n._upstream_nodes):
            key = node._stable_uuid
            if node._is_input_node:
                if input_uuid is None:
                    input_uuid = key
                elif input_uuid != key:
                    raise AssertionError("Each DAG should only have one unique InputNode.")
            if key not in results:
                results[key] = fn(node._resolved_copy(results))
        return results

    def _resolved_copy(self, results: dict) -> DAGNode:
        """A copy of this node with each child node replaced by its result."""
        def result_of(node: DAGNode) -> Any:
            return results[node._stable_uuid]

        args, kwargs, other = (
            _walk.replace_nodes(part, result_of, DAGNode)
            for part in (self._bound_args, self._bound_kwargs,
                         self._bound_other_args_to_resolve))
        return self._copy(args, kwargs, self.get_options(), other)

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Run this node, its child nodes already replaced by their results."""
        raise NotImplementedError

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> DAGNode:
        raise NotImplementedError

    def _copy(self, new_args: Any, new_kwargs: dict, new_options: dict,
              new_other_args_to_resolve: dict) -> DAGNode:
        """A copy with new arguments and the same stable uuid."""
        copy = self._copy_impl(new_args, new_kwargs, new_options, new_other_args_to_resolve)
        copy._stable_uuid = self._stable_uuid
        return copy

    # -- Ray's refusals -------------------------------------------------------------------
    def __getattr__(self, attr: str):
        if attr == "bind":
            raise AttributeError(f".bind() cannot be used again on {type(self)} ")
        if attr == "remote":
            raise AttributeError(
                f".remote() cannot be used on {type(self)}. To execute the task graph for "
                "this node, use .execute().")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    def __reduce__(self):
        # Reached when a node sits where the walk does not look (inside an object other than
        # a list, tuple, dict or set): a pickled node would reach the task as a node, not as
        # its result.
        raise TypeError(
            f"A DAG node ({type(self).__name__}) cannot be pickled; miniray finds nodes "
            "bound as arguments at the top level or inside lists, tuples, dicts and sets. "
            "Pass the node there, or build the object inside a task that takes the node's "
            "result as an argument.")

    def _body_text(self) -> str:
        return type(self).__name__

    def __str__(self) -> str:
        return _describe(self, indent=0)


def _describe(node: DAGNode, indent: int) -> str:
    pad = " " * (indent + 4)

    def text(value: Any) -> str:
        if isinstance(value, DAGNode):
            return _describe(value, indent + 4)
        return repr(value)

    def mapping(values: dict) -> str:
        return "{" + ", ".join(f"{key}: {text(value)}" for key, value in values.items()) + "}"

    return "\n".join([
        f"({type(node).__name__}, {node._stable_uuid})(",
        f"{pad}body={node._body_text()}",
        f"{pad}args=[{', '.join(text(a) for a in node._bound_args)}]",
        f"{pad}kwargs={mapping(node._bound_kwargs)}",
        f"{pad}options={node._bound_options!r}",
        f"{pad}other_args_to_resolve={mapping(node._bound_other_args_to_resolve)}",
        " " * indent + ")",
    ])


DAGNode.__module__ = "miniray.dag.dag_node"
