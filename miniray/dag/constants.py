"""The keys a DAG node uses in ``other_args_to_resolve``.

Mirrors ``ray.dag.constants`` (Ray 2.60): the same names and values, so code that reads
``node.get_other_args_to_resolve()[PARENT_CLASS_NODE_KEY]`` works unchanged. Differs: the
compiled-graph feature flags (``RAY_CGRAPH_*``) are absent, as compiled graphs are.
"""

from __future__ import annotations

__all__ = ["BIND_INDEX_KEY", "COLLECTIVE_OPERATION_KEY", "DAGNODE_TYPE_KEY",
           "IS_CLASS_METHOD_OUTPUT_KEY", "PARENT_CLASS_NODE_KEY", "PREV_CLASS_METHOD_CALL_KEY"]

# An actor method node names the actor it runs on and the call bound before it on the same
# actor (run first, so calls keep their bind order).
PARENT_CLASS_NODE_KEY = "parent_class_node"
PREV_CLASS_METHOD_CALL_KEY = "prev_class_method_call"
BIND_INDEX_KEY = "bind_index"
IS_CLASS_METHOD_OUTPUT_KEY = "is_class_method_output"
COLLECTIVE_OPERATION_KEY = "collective_operation"
DAGNODE_TYPE_KEY = "__dag_node_type__"
