"""The graph walk of ``ray.dag`` (``miniray/dag/_walk.py``) and the DAG built by ``.bind()``,
without processes: binding never starts a runtime, and ``apply_recursive`` only walks.

The errors and orders asserted here were compared with Ray 2.60 (the same programs run in
its virtualenv), except where a test says miniray differs.
"""

from __future__ import annotations

import collections
import warnings

import pytest

import miniray
from miniray.dag import (
    ClassMethodNode,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
    _walk,
)


class Leaf:
    """A stand-in node for the pure functions."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


Pair = collections.namedtuple("Pair", "left right")


# -- the pure functions ---------------------------------------------------------------------
def test_find_nodes_looks_inside_containers_at_any_depth_once_each():
    a, b, c, d = Leaf("a"), Leaf("b"), Leaf("c"), Leaf("d")
    value = [a, (b, [c]), {"k": {d: a}}, {c}, frozenset([b]), Pair(a, d), "text", 3]
    assert _walk.find_nodes(value, Leaf) == [a, b, c, d]


def test_find_nodes_leaves_other_objects_opaque_and_survives_cycles():
    class Box:
        def __init__(self, item):
            self.item = item

    loop: list = []
    loop.append(loop)
    assert _walk.find_nodes([Box(Leaf("hidden")), loop], Leaf) == []


def test_find_nodes_is_not_limited_by_the_recursion_limit():
    value: list = [Leaf("deep")]
    for _ in range(5000):
        value = [value]
    assert [n.name for n in _walk.find_nodes(value, Leaf)] == ["deep"]


def test_replace_nodes_rebuilds_only_the_containers_that_hold_a_node():
    a, b = Leaf("a"), Leaf("b")
    untouched = [1, 2, {"x": 3}]
    value = (a, [b, untouched], {"k": a, b: "v"}, {a}, Pair(1, b))
    out = _walk.replace_nodes(value, lambda n: n.name.upper(), Leaf)
    assert out == ("A", ["B", [1, 2, {"x": 3}]], {"k": "A", "B": "v"}, {"A"}, Pair(1, "B"))
    assert out[1][1] is untouched
    assert type(out[4]) is Pair
    plain = [1, [2]]
    assert _walk.replace_nodes(plain, str, Leaf) is plain
    assert _walk.replace_nodes(a, lambda n: 7, Leaf) == 7


def test_replace_nodes_in_a_container_that_holds_itself_terminates():
    loop: list = [Leaf("a")]
    loop.append(loop)
    out = _walk.replace_nodes(loop, lambda n: "A", Leaf)
    assert out[0] == "A"


def test_post_order_puts_children_first_and_each_node_once():
    graph = {"root": ["left", "right"], "left": ["base"], "right": ["base", "left"],
             "base": []}
    assert _walk.post_order("root", graph.__getitem__) == ["base", "left", "right", "root"]


def test_post_order_walks_a_long_chain_without_recursion():
    graph = {i: [i + 1] for i in range(20000)}
    graph[20000] = []
    order = _walk.post_order(0, graph.__getitem__)
    assert order[0] == 20000 and order[-1] == 0 and len(order) == 20001


# -- DAGs built by .bind() ------------------------------------------------------------------
@miniray.remote
def add(a, b):
    return a + b


@miniray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def inc(self, k=1):
        self.value += k
        return self.value


def _names(dag: DAGNode) -> list:
    """The order in which apply_recursive visits the nodes, as (kind, detail) pairs."""
    seen = []

    def visit(node):
        detail = getattr(node, "_method_name", None) or node.get_args()
        seen.append((type(node).__name__, detail))
        return f"<{type(node).__name__}>"

    dag.apply_recursive(visit)
    return seen


def test_bind_builds_nodes_without_starting_a_runtime():
    with InputNode() as inp:
        dag = add.bind(add.bind(inp[0], 1), inp.y)
    assert isinstance(dag, FunctionNode)
    assert isinstance(dag.get_args()[0], FunctionNode)
    assert isinstance(dag.get_args()[1], InputAttributeNode)
    assert inp[0] is inp[0] and inp.y is inp.y  # one node per key
    assert not miniray.is_initialized()


def test_apply_recursive_visits_a_shared_node_once_and_children_first():
    with InputNode() as inp:
        shared = add.bind(inp, 1)
        dag = MultiOutputNode([add.bind(shared, 2), add.bind(shared, 3)])
    order = _names(dag)
    kinds = [kind for kind, _ in order]
    assert kinds == ["InputNode", "FunctionNode", "FunctionNode", "FunctionNode",
                     "MultiOutputNode"]
    # fn sees copies whose child nodes were replaced by fn's results
    assert order[1] == ("FunctionNode", ("<InputNode>", 1))
    assert order[4] == ("MultiOutputNode", ["<FunctionNode>", "<FunctionNode>"])


def test_method_calls_follow_the_calls_bound_before_them_on_the_same_actor():
    """Ray 2.60: a ClassMethodNode names the call bound before it on its ClassNode, so
    executing the last call runs the earlier ones first, in bind order."""
    counter = Counter.bind(10)
    counter.inc.bind(1)
    counter.inc.bind(2)
    last = counter.inc.bind(3)
    assert [detail for kind, detail in _names(last) if kind == "ClassMethodNode"] == [
        "inc", "inc", "inc"]
    assert [args for kind, args in _names(last)][0] == (10,)  # the actor is created first


def test_class_node_checks_the_method_name_and_refuses_the_input_node():
    counter = Counter.bind()
    with pytest.raises(AttributeError, match="type object 'Counter' has no attribute 'nope'"):
        counter.nope  # noqa: B018
    with InputNode() as inp:
        with pytest.raises(ValueError, match="cannot be used as args, kwargs"):
            Counter.bind(inp)
    assert isinstance(counter.inc.bind(), ClassMethodNode)


@pytest.mark.parametrize("make", [lambda: add.bind(1, 2), lambda: Counter.bind(),
                                  lambda: Counter.bind().inc.bind()])
def test_remote_and_bind_on_a_node_raise_rays_attribute_errors(make):
    node = make()
    with pytest.raises(AttributeError, match=r"\.remote\(\) cannot be used on .*use "
                                             r"\.execute\(\)"):
        node.remote()
    with pytest.raises(AttributeError, match=r"\.bind\(\) cannot be used again on"):
        node.bind()


def test_unbound_method_remote_says_to_use_bind():
    with pytest.raises(AttributeError, match=r"\.remote\(\) cannot be used on "
                                             r"ClassMethodNodes\. Use \.bind\(\) instead"):
        Counter.bind().inc.remote()


def test_options_before_bind_are_the_nodes_options():
    assert add.options(num_cpus=1, name="adder").bind(1, 2).get_options() == {
        "num_cpus": 1, "name": "adder"}
    assert add.bind(1, 2).get_options() == {}
    assert Counter.options(max_restarts=1).bind().get_options() == {"max_restarts": 1}
    assert Counter.bind().inc.options(name="x").bind().get_options() == {"name": "x"}


def test_input_node_refusals():
    with pytest.raises(ValueError, match="InputNode should not take any args or kwargs"):
        InputNode(1)
    with InputNode() as inp:
        with pytest.raises(AssertionError, match="Please only use int index or str"):
            inp[1.5]  # noqa: B018


def test_two_input_nodes_in_one_dag_are_refused():
    with InputNode() as first:
        pass
    with InputNode() as second:
        pass
    with pytest.raises(AssertionError, match="Each DAG should only have one unique InputNode"):
        add.bind(first, second).apply_recursive(lambda node: None)


def test_multi_output_node_takes_a_list_or_tuple():
    with pytest.raises(ValueError, match="Invalid input type for `args`"):
        MultiOutputNode(add.bind(1, 2))
    assert isinstance(MultiOutputNode((add.bind(1, 2),)).get_args(), list)


def test_compiled_graphs_are_refused_saying_execute_works():
    dag = add.bind(1, 2)
    with pytest.raises(NotImplementedError, match=r"compiled graphs are not supported by "
                                                  r"miniray\. Run the DAG with dag\.execute"):
        dag.experimental_compile()
    with pytest.raises(NotImplementedError, match="compiled graphs"):
        miniray.dag.DAGContext.get_current()
    with pytest.raises(NotImplementedError, match="plot"):
        miniray.dag.plot(dag)


def test_a_node_in_an_opaque_object_fails_to_pickle_saying_where_nodes_go():
    """Differs from Ray 2.60, whose pickling scan finds nodes in any object: miniray finds
    them in lists, tuples, dicts and sets, and says so rather than send the node itself."""
    with pytest.raises(TypeError, match="inside lists, tuples, dicts and sets"):
        miniray.cloudpickle.dumps(add.bind(1, 2))


def test_the_namespace_has_rays_names():
    ray_dag_all = [
        "ClassNode", "ClassMethodNode", "CollectiveOutputNode", "DAGNode",
        "DAGOperationFuture", "FunctionNode", "GPUFuture", "InputNode", "InputAttributeNode",
        "DAGInputData", "PARENT_CLASS_NODE_KEY", "PREV_CLASS_METHOD_CALL_KEY",
        "BIND_INDEX_KEY", "IS_CLASS_METHOD_OUTPUT_KEY", "COLLECTIVE_OPERATION_KEY",
        "DAGNODE_TYPE_KEY", "plot", "MultiOutputNode", "DAGContext"]
    assert sorted(miniray.dag.__all__) == sorted(ray_dag_all)
    for name in ray_dag_all:
        assert getattr(miniray.dag, name) is not None
    assert miniray.dag.FunctionNode.__module__ == "miniray.dag.function_node"
    assert miniray.dag.PARENT_CLASS_NODE_KEY == "parent_class_node"


def test_execute_warns_as_ray_does_before_running(monkeypatch):
    """Ray 2.60 deprecates DAGNode.execute(): a RayDeprecationWarning at the caller's line."""
    node = add.bind(1, 2)
    monkeypatch.setattr(FunctionNode, "_execute_impl", lambda self, *a, **k: "ran")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert node.execute() == "ran"
    assert [str(w.message) for w in caught] == [
        "DAGNode.execute() is deprecated and will be removed in a future release."]
    assert caught[0].category.__name__ == "RayDeprecationWarning"
    assert caught[0].filename == __file__


def test_with_tensor_transport_is_a_hint_execute_ignores_as_in_ray():
    node = add.bind(1, 2)
    assert node.with_tensor_transport("shm", device="cpu") is node
    with pytest.raises(ValueError, match="Invalid device 'tpu'"):
        node.with_tensor_transport(device="tpu")
    with pytest.raises(ValueError, match="Invalid transport type: pigeon"):
        node.with_tensor_transport("pigeon")


def test_the_copies_execute_makes_do_not_scan_the_input_value(monkeypatch):
    """A large input is read by key, not walked once per node that reads it."""
    scanned = []
    real = _walk.find_nodes
    monkeypatch.setattr(_walk, "find_nodes", lambda value, kind: scanned.append(1) or
                        real(value, kind))
    with InputNode() as inp:
        dag = MultiOutputNode([inp[0], inp[1]])
    big = list(range(100_000))
    assert dag.apply_recursive(lambda node: node._execute_impl(big)) == [0, 1]
    assert len(scanned) == 4  # each of the four nodes once, none of their copies
