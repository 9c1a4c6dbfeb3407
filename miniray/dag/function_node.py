"""FunctionNode: a task in a DAG, what ``f.bind(*args, **kwargs)`` returns.

Mirrors ``ray.dag.function_node`` (Ray 2.60): ``_body`` is the plain function, the options
are the decorator's merged with those of ``.options()`` before ``.bind()``, and running the
node submits ``f.options(**options).remote(*args, **kwargs)`` once per ``execute()``.
Differs: the node is built from the remote function itself (``f.bind``), not from a plain
function, so the function is exported once per session however often the DAG runs.
"""

from __future__ import annotations

from typing import Any

from miniray.dag.dag_node import DAGNode

__all__ = ["FunctionNode"]


class FunctionNode(DAGNode):
    """A bound task of a DAG: ``f.bind(...)``."""

    def __init__(self, func_body: Any, func_args: Any, func_kwargs: dict, func_options: dict,
                 other_args_to_resolve: dict | None = None):
        function = getattr(func_body, "_function", None)
        if function is None or not callable(getattr(func_body, "options", None)):
            raise TypeError(
                f"FunctionNode needs a remote function, got {func_body!r}; decorate the "
                "function with @ray.remote and build the node with f.bind(...).")
        self._remote_function = func_body
        self._body = function
        self._submitter = None  # the .options() object, shared by the copies execute() makes
        super().__init__(func_args, func_kwargs, func_options, other_args_to_resolve)

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> FunctionNode:
        copy = FunctionNode(self._remote_function, new_args, new_kwargs, new_options,
                            new_other_args_to_resolve)
        if new_options == self._bound_options:
            copy._submitter = self._shared_submitter()
        return copy

    def _shared_submitter(self) -> Any:
        if self._submitter is None:
            # max_calls is a decorator option that .options() refuses; it is already among
            # the remote function's own options, which .options() merges over.
            options = {k: v for k, v in self._bound_options.items() if k != "max_calls"}
            self._submitter = self._remote_function.options(**options)
        return self._submitter

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the task; its node arguments were already replaced by their results."""
        return self._shared_submitter().remote(*self._bound_args, **self._bound_kwargs)

    def _body_text(self) -> str:
        return str(self._body)


FunctionNode.__module__ = "miniray.dag.function_node"
