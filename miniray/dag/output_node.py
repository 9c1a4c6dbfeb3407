"""MultiOutputNode: a DAG with several results.

Mirrors ``ray.dag.output_node`` (Ray 2.60): ``MultiOutputNode([a, b])`` (a list or a tuple,
else ValueError); ``execute()`` returns a list with each entry's result (an ObjectRef for
a node, a plain value as it is).
"""

from __future__ import annotations

from typing import Any

from miniray.dag.dag_node import DAGNode

__all__ = ["MultiOutputNode"]


class MultiOutputNode(DAGNode):
    """The end of a DAG with several results.

    Example:
        >>> @ray.remote
        ... def inc(x):
        ...     return x + 1
        >>> @ray.remote
        ... def double(x):
        ...     return 2 * x
        >>> with ray.dag.InputNode() as inp:
        ...     dag = ray.dag.MultiOutputNode([inc.bind(inp), double.bind(inp)])
        >>> ray.get(dag.execute(3))
        [4, 6]
    """

    def __init__(self, args: Any, other_args_to_resolve: dict | None = None):
        if isinstance(args, tuple):
            args = list(args)
        if not isinstance(args, list):
            raise ValueError(f"Invalid input type for `args`, {type(args)}.")
        super().__init__(args, {}, {}, other_args_to_resolve or {})

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        return self._bound_args

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> MultiOutputNode:
        return MultiOutputNode(new_args, new_other_args_to_resolve)

    def _body_text(self) -> str:
        return "__MultiOutputNode__"


MultiOutputNode.__module__ = "miniray.dag.output_node"
