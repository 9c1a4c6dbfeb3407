"""InputNode, InputAttributeNode, DAGInputData: the inputs of a DAG.

Mirrors ``ray.dag.input_node`` (Ray 2.60). ``with InputNode() as inp:`` marks the DAG's one
input; ``dag.execute(x)`` makes ``inp`` stand for ``x``, and ``dag.execute(1, 2, k=3)`` for a
``DAGInputData`` of them, read through ``inp[0]``, ``inp[1]``, ``inp.k`` or ``inp["k"]``
(``InputAttributeNode``; the same node for the same key). An InputNode used outside a
``with`` block, two InputNodes in one DAG, or an input without the key read raise what
Ray raises (AssertionError, AssertionError, the TypeError/IndexError/KeyError of the read).
Differs: ``input_type`` is kept but describes nothing (Ray uses it for Gradio widgets).
"""

from __future__ import annotations

from typing import Any

from miniray.dag.dag_node import DAGNode

__all__ = ["DAGInputData", "InputAttributeNode", "InputNode"]

IN_CONTEXT_MANAGER = "__in_context_manager__"

_KEY_TYPES_MESSAGE = ("Please only use int index or str as first-level key to access fields "
                      "of dag input.")


class InputNode(DAGNode):
    """The input of a DAG, used in a ``with`` block.

    Example:
        >>> @ray.remote
        ... def add(a, b):
        ...     return a + b
        >>> with ray.dag.InputNode() as inp:
        ...     dag = add.bind(inp[0], inp.y)
        >>> ray.get(dag.execute(1, y=2))
        3
    """

    _is_input_node = True

    def __init__(self, *args: Any, input_type: Any = None,
                 _other_args_to_resolve: dict | None = None, **kwargs: Any):
        if args or kwargs:
            raise ValueError("InputNode should not take any args or kwargs.")
        self.input_attribute_nodes: dict = {}
        self.input_type = input_type
        super().__init__([], {}, {}, dict(_other_args_to_resolve or {}))

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> InputNode:
        return InputNode(_other_args_to_resolve=new_other_args_to_resolve)

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """The DAG's input: the one value given, else a DAGInputData of all of them."""
        if not self._in_context_manager():
            raise AssertionError(
                "InputNode is a singleton instance that should be only used in context "
                "manager for dag building and execution. See the docstring of class "
                "InputNode for examples.")
        if len(args) == 1 and not kwargs:
            return args[0]
        return DAGInputData(*args, **kwargs)

    def _in_context_manager(self) -> bool:
        return bool(self._bound_other_args_to_resolve.get(IN_CONTEXT_MANAGER, False))

    def set_context(self, key: str, val: Any) -> None:
        self._bound_other_args_to_resolve[key] = val

    def __enter__(self) -> InputNode:
        self.set_context(IN_CONTEXT_MANAGER, True)
        return self

    def __exit__(self, *args: Any) -> None:
        pass

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or "input_attribute_nodes" not in self.__dict__:
            # Python's own protocols (copy, pickle, ...) and lookups before __init__ ran.
            return super().__getattr__(key)
        return self._attribute_node(key, "__getattr__")

    def __getitem__(self, key: Any) -> InputAttributeNode:
        if not isinstance(key, (str, int)):
            raise AssertionError(_KEY_TYPES_MESSAGE)
        return self._attribute_node(key, "__getitem__")

    def _attribute_node(self, key: Any, accessor: str) -> InputAttributeNode:
        nodes = self.input_attribute_nodes
        if key not in nodes:
            nodes[key] = InputAttributeNode(self, key, accessor)
        return nodes[key]

    def _body_text(self) -> str:
        return "__InputNode__"


class InputAttributeNode(DAGNode):
    """One part of the DAG's input: ``inp[0]``, ``inp["key"]`` or ``inp.name``."""

    def __init__(self, dag_input_node: Any, key: Any, accessor_method: str,
                 input_type: Any = None):
        self._dag_input_node = dag_input_node
        self._key = key
        self._accessor_method = accessor_method
        super().__init__([], {}, {}, {
            "dag_input_node": dag_input_node, "key": key,
            "accessor_method": accessor_method, "result_type_string": input_type,
        })

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> InputAttributeNode:
        other = new_other_args_to_resolve
        return InputAttributeNode(other["dag_input_node"], other["key"],
                                  other["accessor_method"], other["result_type_string"])

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Read the key from the input (already the executed InputNode's value)."""
        value = self._dag_input_node
        if isinstance(value, DAGInputData):
            return value[self._key]
        if isinstance(self._key, str) and self._accessor_method == "__getattr__":
            return getattr(value, self._key)
        if isinstance(self._key, (str, int)):
            return value[self._key]
        raise ValueError(_KEY_TYPES_MESSAGE)

    @property
    def key(self) -> Any:
        return self._key

    def _body_text(self) -> str:
        return f'["{self._key}"]'


class DAGInputData:
    """The inputs of ``execute(*args, **kwargs)`` when there are several: ``[i]`` reads a
    positional one, ``["name"]`` a keyword one."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._args = list(args)
        self._kwargs = kwargs

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            return self._args[key]
        if isinstance(key, str):
            return self._kwargs[key]
        raise ValueError(_KEY_TYPES_MESSAGE)

    def __repr__(self) -> str:
        return f"DAGInputData(args={self._args!r}, kwargs={self._kwargs!r})"


for _cls in (InputNode, InputAttributeNode, DAGInputData):
    _cls.__module__ = "miniray.dag.input_node"
