"""Ray DAGs: build a graph of tasks and actor calls with ``.bind()``, run it with ``execute()``.

Mirrors ``ray.dag`` (Ray 2.60), non-compiled: ``f.bind(...)`` (FunctionNode),
``Cls.bind(...)`` (ClassNode), ``class_node.method.bind(...)`` and ``handle.method.bind(...)``
(ClassMethodNode), ``InputNode`` and its attributes, ``MultiOutputNode``;
``dag.execute(*inputs)`` submits every node once, upstream results passed as ObjectRefs.
Differs: compiled graphs (``experimental_compile``, ``DAGContext``, ``CollectiveOutputNode``,
the futures) and ``plot`` raise NotImplementedError (``unsupported.py``).

Layout: ``dag_node.py`` the base node and the walk of ``execute()``, ``_walk.py`` the pure
graph functions, one module per node kind as in Ray, ``constants.py`` the reserved keys.
Nothing runs at import; ``import miniray`` does not load this package (``.bind()`` does).

Example:
    >>> @ray.remote
    ... def add(a, b):
    ...     return a + b
    >>> with ray.dag.InputNode() as inp:
    ...     dag = add.bind(add.bind(inp[0], inp[1]), inp[1])
    >>> ray.get(dag.execute(1, 2))
    5
"""

from __future__ import annotations

from miniray.dag.class_node import ClassMethodNode, ClassNode
from miniray.dag.constants import (
    BIND_INDEX_KEY,
    COLLECTIVE_OPERATION_KEY,
    DAGNODE_TYPE_KEY,
    IS_CLASS_METHOD_OUTPUT_KEY,
    PARENT_CLASS_NODE_KEY,
    PREV_CLASS_METHOD_CALL_KEY,
)
from miniray.dag.dag_node import DAGNode
from miniray.dag.function_node import FunctionNode
from miniray.dag.input_node import DAGInputData, InputAttributeNode, InputNode
from miniray.dag.output_node import MultiOutputNode
from miniray.dag.unsupported import (
    CollectiveOutputNode,
    DAGContext,
    DAGOperationFuture,
    GPUFuture,
    plot,
)

__all__ = [
    "ClassNode",
    "ClassMethodNode",
    "CollectiveOutputNode",
    "DAGNode",
    "DAGOperationFuture",
    "FunctionNode",
    "GPUFuture",
    "InputNode",
    "InputAttributeNode",
    "DAGInputData",
    "PARENT_CLASS_NODE_KEY",
    "PREV_CLASS_METHOD_CALL_KEY",
    "BIND_INDEX_KEY",
    "IS_CLASS_METHOD_OUTPUT_KEY",
    "COLLECTIVE_OPERATION_KEY",
    "DAGNODE_TYPE_KEY",
    "plot",
    "MultiOutputNode",
    "DAGContext",
]
