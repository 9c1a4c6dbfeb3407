"""ClassNode and ClassMethodNode: actors and their method calls in a DAG.

Mirrors ``ray.dag.class_node`` (Ray 2.60):

* ``Cls.bind(*args)`` gives a ``ClassNode``; each ``execute()`` creates a new actor with the
  class's options (merged with ``.options()`` before ``.bind()``). Its arguments may not
  depend on the InputNode (ValueError). Executed as the root, it returns the ActorHandle.
* ``class_node.method.bind(*args)`` gives a ``ClassMethodNode`` whose other arguments name
  the actor and the call bound before it on the same ClassNode, so executing a call first
  submits the calls bound before it, in bind order, even those outside the path to the
  result. ``class_node.method.options(...)`` sets the call's options.
* ``handle.method.bind(*args)`` on a live actor checks the arguments at once (TypeError) and
  calls that actor; a method with ``num_returns > 1`` gives a tuple of nodes, one per value.

Differs: ``.remote`` on a ClassNode raises the AttributeError of other nodes (Ray 2.60 says
the class has no attribute ``remote``).
"""

from __future__ import annotations

from typing import Any

from miniray._private.core.task_spec import DYNAMIC
from miniray.dag.constants import (
    IS_CLASS_METHOD_OUTPUT_KEY,
    PARENT_CLASS_NODE_KEY,
    PREV_CLASS_METHOD_CALL_KEY,
)
from miniray.dag.dag_node import DAGNode

__all__ = ["ClassMethodNode", "ClassNode"]


class ClassNode(DAGNode):
    """An actor of a DAG: ``Cls.bind(...)``; ``node.method.bind(...)`` calls it."""

    def __init__(self, cls: Any, cls_args: Any, cls_kwargs: dict, cls_options: dict,
                 other_args_to_resolve: dict | None = None):
        body = getattr(cls, "_cls", None)
        if body is None or not callable(getattr(cls, "options", None)):
            raise TypeError(
                f"ClassNode needs an actor class, got {cls!r}; decorate the class with "
                "@ray.remote and build the node with Cls.bind(...).")
        self._actor_class = cls
        self._body = body
        self._last_call: ClassMethodNode | None = None
        super().__init__(cls_args, cls_kwargs, cls_options, other_args_to_resolve)
        if any(node._is_input_node for node in self._upstream_nodes):
            raise ValueError(
                "InputNode handles user dynamic input the DAG, and cannot be used as args, "
                "kwargs, or other_args_to_resolve in ClassNode constructor because it is "
                "not available at class construction or binding time.")

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> ClassNode:
        return ClassNode(self._actor_class, new_args, new_kwargs, new_options,
                         new_other_args_to_resolve)

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Create the actor; its node arguments were already replaced by their results."""
        return self._actor_class.options(**self._bound_options).remote(
            *self._bound_args, **self._bound_kwargs)

    def __getattr__(self, method_name: str) -> Any:
        if method_name in ("bind", "remote") or method_name.startswith("__") \
                or "_body" not in self.__dict__:
            return super().__getattr__(method_name)
        getattr(self._body, method_name)  # AttributeError naming the class, as Ray
        return _UnboundClassMethodNode(self, method_name, {})

    def _body_text(self) -> str:
        return str(self._body)


class _UnboundClassMethodNode:
    """``class_node.method``: ``.bind(...)`` makes the call's node."""

    def __init__(self, actor: ClassNode, method_name: str, options: dict):
        self._actor = actor
        self._method_name = method_name
        self._options = options

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        node = ClassMethodNode(self._method_name, args, kwargs, self._options, {
            PARENT_CLASS_NODE_KEY: self._actor,
            PREV_CLASS_METHOD_CALL_KEY: self._actor._last_call,
        })
        self._actor._last_call = node
        return node

    def options(self, **options: Any) -> _UnboundClassMethodNode:
        self._options = options
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr == "remote":
            raise AttributeError(
                ".remote() cannot be used on ClassMethodNodes. Use .bind() instead to express "
                "an symbolic actor call.")
        raise AttributeError(f"'_UnboundClassMethodNode' object has no attribute {attr!r}")


class ClassMethodNode(DAGNode):
    """A call of an actor's method in a DAG: ``class_node.method.bind(...)``."""

    def __init__(self, method_name: str, method_args: Any, method_kwargs: dict,
                 method_options: dict, other_args_to_resolve: dict):
        self._method_name = method_name
        self._parent_class_node = other_args_to_resolve.get(PARENT_CLASS_NODE_KEY)
        self._prev_class_method_call = other_args_to_resolve.get(PREV_CLASS_METHOD_CALL_KEY)
        self._is_class_method_output = bool(
            other_args_to_resolve.get(IS_CLASS_METHOD_OUTPUT_KEY, False))
        # An output node stands for value i of a call with several returns: args (call, i).
        self._output_idx = method_args[1] if self._is_class_method_output else None
        super().__init__(method_args, method_kwargs, method_options, other_args_to_resolve)

    def _copy_impl(self, new_args: Any, new_kwargs: dict, new_options: dict,
                   new_other_args_to_resolve: dict) -> ClassMethodNode:
        return ClassMethodNode(self._method_name, new_args, new_kwargs, new_options,
                               new_other_args_to_resolve)

    def _execute_impl(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the call (its actor and the call before it already ran), or pick one
        value of a call with several returns."""
        if self._is_class_method_output:
            return self._bound_args[0][self._output_idx]
        method = getattr(self._parent_class_node, self._method_name)
        # A live handle's bind records Ray's full option set; unset ones are not options.
        options = {k: v for k, v in self._bound_options.items() if v is not None and v != ""}
        if options:
            method = method.options(**options)
        return method.remote(*self._bound_args, **self._bound_kwargs)

    def get_method_name(self) -> str:
        return self._method_name

    @property
    def is_class_method_call(self) -> bool:
        return not self._is_class_method_output

    @property
    def is_class_method_output(self) -> bool:
        return self._is_class_method_output

    @property
    def class_method_call(self) -> ClassMethodNode | None:
        return self._bound_args[0] if self._is_class_method_output else None

    @property
    def output_idx(self) -> int | None:
        return self._output_idx

    def _body_text(self) -> str:
        return f"{self._method_name}()"

    def __repr__(self) -> str:
        return self.__str__()


def bind_on_handle(method: Any, args: tuple, kwargs: dict) -> Any:
    """``handle.method.bind(...)`` (``method`` is an ActorMethod of a live actor): the node
    of the call, or a tuple of one node per value for ``num_returns > 1``."""
    argspec = method._argspec
    if argspec is not None:
        try:
            argspec.check(args, kwargs)
        except TypeError as error:
            message = str(error).replace(".remote()", ".bind()", 1)
            raise TypeError(f"{message} args: {args}. kwargs: {kwargs}.") from None
    num_returns = _user_num_returns(method._num_returns)
    options = {"name": method._call_name if method._call_name != method._name else "",
               "num_returns": num_returns,
               "concurrency_group": getattr(method, "_group_override", None),
               "_generator_backpressure_num_objects": None}
    node = ClassMethodNode(method._name, args, kwargs, options, {
        PARENT_CLASS_NODE_KEY: method._handle, PREV_CLASS_METHOD_CALL_KEY: None})
    if isinstance(num_returns, int) and num_returns > 1:
        return tuple(
            ClassMethodNode(f"return_idx_{i}", (node, i), {}, {}, {
                IS_CLASS_METHOD_OUTPUT_KEY: True, PARENT_CLASS_NODE_KEY: method._handle})
            for i in range(num_returns))
    return node


def _user_num_returns(wire: int) -> Any:
    """A call's ``num_returns`` as the user wrote it (calls carry generators' as < 0)."""
    if wire >= 0:
        return wire
    return "dynamic" if wire == DYNAMIC else "streaming"


for _cls in (ClassNode, ClassMethodNode):
    _cls.__module__ = "miniray.dag.class_node"
