"""The graph walk of a DAG: finding nodes inside arguments, replacing them, ordering nodes.

Owns: the three pure functions ``execute()`` and ``apply_recursive()`` are built on. Does
not own: what a node does when run (the node classes) nor submitting anything. No I/O, no
miniray import: ``tests/unit/test_dag_walk.py`` tests it on plain objects.

Nodes are found at any depth inside lists, tuples (named tuples too), dicts (keys and
values), sets and frozensets, as Ray finds them (Ray 2.60 scans arguments by pickling them).
Other objects are opaque: a node inside one is not found, and pickling the node then
fails with a message saying where nodes may be placed (``DAGNode.__reduce__``). Both
walks use an explicit stack, so a long chain of nodes or deeply nested arguments never
reaches Python's recursion limit.

    bound args ──find_nodes──► upstream nodes ──post_order──► run order
    bound args ──replace_nodes(table)──► args with each node's result in its place
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["find_nodes", "post_order", "replace_nodes"]

_CONTAINERS = (list, tuple, dict, set, frozenset)


def _is_container(value: Any) -> bool:
    # Exact types (and named tuples) only: a subclass may need arguments to be rebuilt.
    kind = type(value)
    return kind in _CONTAINERS or (isinstance(value, tuple) and hasattr(value, "_fields"))


def _items(container: Any) -> Iterable[Any]:
    if isinstance(container, dict):
        for key, value in container.items():
            yield key
            yield value
    else:
        yield from container


def find_nodes(value: Any, node_type: type) -> list:
    """Every distinct ``node_type`` instance inside ``value``, in first-seen order (depth
    first, left to right)."""
    found: list = []
    seen_nodes: set = set()
    seen_containers: set = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, node_type):
            if id(item) not in seen_nodes:
                seen_nodes.add(id(item))
                found.append(item)
        elif _is_container(item) and id(item) not in seen_containers:
            seen_containers.add(id(item))
            stack.extend(reversed(list(_items(item))))
    return found


def replace_nodes(value: Any, result_of: Callable[[Any], Any], node_type: type) -> Any:
    """``value`` with each ``node_type`` instance inside it replaced by ``result_of(node)``.

    Containers holding no node are returned as they are (not copied); those that hold one
    are rebuilt with the same type.
    """
    if isinstance(value, node_type):
        return result_of(value)
    if not _is_container(value):
        return value
    # Post-order over the containers that hold a node: children are rebuilt before parents.
    rebuilt: dict = {}
    holds_node: dict = {}
    visiting: set = set()  # a container that holds itself is expanded once
    stack: list = [(value, False)]
    while stack:
        item, expanded = stack.pop()
        key = id(item)
        if key in holds_node or (not expanded and key in visiting):
            continue
        children = [c for c in _items(item) if _is_container(c) or isinstance(c, node_type)]
        if not expanded:
            visiting.add(key)
            stack.append((item, True))
            stack.extend((c, False) for c in children
                         if _is_container(c) and id(c) not in holds_node)
            continue
        holds = any(isinstance(c, node_type) or holds_node.get(id(c), False)
                    for c in children)
        holds_node[key] = holds
        if holds:
            rebuilt[key] = _rebuild(item, lambda c: _swap(c, rebuilt, result_of, node_type))
    return rebuilt.get(id(value), value)


def _swap(item: Any, rebuilt: dict, result_of: Callable[[Any], Any], node_type: type) -> Any:
    if isinstance(item, node_type):
        return result_of(item)
    return rebuilt.get(id(item), item)


def _rebuild(container: Any, swap: Callable[[Any], Any]) -> Any:
    if isinstance(container, dict):
        return {swap(k): swap(v) for k, v in container.items()}
    items = [swap(item) for item in container]
    if hasattr(container, "_fields"):  # a named tuple takes its fields as arguments
        return type(container)(*items)
    return type(container)(items)


def post_order(root: Any, children_of: Callable[[Any], list]) -> list:
    """Every node reachable from ``root``, each once, children before their parents
    (children in the order ``children_of`` gives them); ``root`` comes last."""
    order: list = []
    done: set = set()
    on_path: set = set()
    stack: list = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            on_path.discard(id(node))
            done.add(id(node))
            order.append(node)
            continue
        if id(node) in on_path:
            continue  # pushed twice before it was finished: finish it once
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children_of(node)) if id(c) not in done)
    return order
