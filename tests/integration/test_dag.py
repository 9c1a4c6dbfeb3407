"""Ray DAGs (``ray.dag``, non-compiled): ``.bind()`` then ``execute()`` runs real tasks and
actors.

Each behaviour was compared with Ray 2.60 (the same program run in its virtualenv): the
results, which nodes run how often, when actors are created, and the error types and texts.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest

import miniray.dag  # noqa: F401  (as in Ray, ``ray.dag`` is an attribute once imported)

from .test_imports import miniray_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def dag_api(ray):
    """The ``ray`` fixture with a few remote functions and an actor class."""

    @ray.remote
    def inc(x):
        return x + 1

    @ray.remote
    def add(a, b):
        return a + b

    @ray.remote
    def describe(value):
        return repr(value)

    @ray.remote
    class Counter:
        def __init__(self, start=0):
            self.value = start
            self.calls = 0

        def inc(self, k=1):
            self.value += k
            return self.value

        def get(self):
            return self.value

        def bump(self, *ignored):
            self.calls += 1
            return self.calls

        @ray.method(num_returns=2)
        def pair(self):
            return self.value, -self.value

    class Api:
        pass

    api = Api()
    api.ray, api.inc, api.add, api.describe, api.Counter = ray, inc, add, describe, Counter
    return api


def test_a_chain_runs_with_its_input(dag_api):
    ray, inc, add = dag_api.ray, dag_api.inc, dag_api.add
    with ray.dag.InputNode() as inp:
        dag = add.bind(inc.bind(inc.bind(inp)), 10)
    ref = dag.execute(5)
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref, timeout=30) == 17
    assert ray.get(dag.execute(0), timeout=30) == 12  # a DAG runs again with new input


def test_a_diamond_runs_its_shared_node_once_per_execute(dag_api):
    """Ray 2.60: a node referenced twice is executed once per execute()."""
    ray, add, Counter = dag_api.ray, dag_api.add, dag_api.Counter
    tally = Counter.remote()

    @ray.remote
    def counted(x, counter):
        ray.get(counter.bump.remote(), timeout=30)
        return x * 10

    with ray.dag.InputNode() as inp:
        top = counted.bind(inp, tally)
        dag = add.bind(add.bind(top, 1), add.bind(top, 2))
    assert ray.get(dag.execute(1), timeout=30) == 23
    assert ray.get(tally.bump.remote(), timeout=30) == 2  # one counted run, then this call
    assert ray.get(dag.execute(2), timeout=30) == 43
    assert ray.get(tally.bump.remote(), timeout=30) == 4


def test_stages_pass_refs_without_waiting_in_the_driver(dag_api, tmp_path):
    ray, inc = dag_api.ray, dag_api.inc
    gate = str(tmp_path / "gate")

    # The stages wait for a file the test writes after execute() returned: an execute()
    # that waited for a stage would make them give up (an error, not 2), whatever the
    # machine's speed (a bound on execute()'s wall time failed on a loaded one).
    @ray.remote(max_retries=0)
    def slow(x):
        deadline = time.monotonic() + 30
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise TimeoutError("the gate was not opened: execute() waited for a stage")
            time.sleep(0.01)
        return x

    dag = inc.bind(slow.bind(slow.bind(1)))
    ref = dag.execute()  # submitted, not waited for
    assert ray.wait([ref], timeout=0)[0] == []
    open(gate, "w").close()
    assert ray.get(ref, timeout=60) == 2


def test_nodes_nested_in_containers_reach_the_task_as_refs(dag_api):
    """Ray 2.60: nodes inside lists, dicts and tuples (any depth) are replaced by their
    ObjectRefs, which the task receives as refs (not values), like nested refs of
    ``.remote()``; top-level nodes arrive as values."""
    ray, inc = dag_api.ray, dag_api.inc

    @ray.remote
    def unpack(first, rest, keyed):
        return [first, ray.get(rest[0], timeout=30), ray.get(rest[1][0], timeout=30),
                ray.get(keyed["k"], timeout=30), type(rest[0]).__name__]

    dag = unpack.bind(inc.bind(0), [inc.bind(1), (inc.bind(2),)], keyed={"k": inc.bind(3)})
    assert ray.get(dag.execute(), timeout=30) == [1, 2, 3, 4, "ObjectRef"]


def test_input_attributes_indices_and_keys(dag_api):
    ray, add = dag_api.ray, dag_api.add
    with ray.dag.InputNode() as inp:
        by_position = add.bind(inp[0], inp[1])
    with ray.dag.InputNode() as inp:
        by_keyword = add.bind(inp[0], inp.x)
    with ray.dag.InputNode() as inp:
        by_key = add.bind(inp["a"], inp["b"])

    class Point:
        x, y = 3, 4

    with ray.dag.InputNode() as inp:
        by_attribute = add.bind(inp.x, inp.y)
    assert ray.get(by_position.execute(1, 2), timeout=30) == 3
    assert ray.get(by_position.execute([5, 6]), timeout=30) == 11  # one list: indexed
    assert ray.get(by_keyword.execute(1, x=2), timeout=30) == 3
    assert ray.get(by_key.execute({"a": 1, "b": 2}), timeout=30) == 3
    assert ray.get(by_attribute.execute(Point()), timeout=30) == 7


def test_wrong_inputs_raise_what_ray_raises(dag_api):
    """Ray 2.60: the input is read as given, so a missing one fails in execute() with the
    read's own error (TypeError, IndexError, KeyError), before anything is submitted."""
    ray, add, inc = dag_api.ray, dag_api.add, dag_api.inc
    with ray.dag.InputNode() as inp:
        two = add.bind(inp[0], inp[1])
    with pytest.raises(TypeError, match="'int' object is not subscriptable"):
        two.execute(1)
    with pytest.raises(IndexError, match="list index out of range"):
        two.execute()
    with ray.dag.InputNode() as inp:
        keyed = add.bind(inp[0], inp.x)
    with pytest.raises(KeyError, match="'x'"):
        keyed.execute(1, 2)
    loose = ray.dag.InputNode()
    with pytest.raises(AssertionError, match="should be only used in context manager"):
        inc.bind(loose).execute(1)
    # several values for a single InputNode: it stands for all of them (DAGInputData)
    with ray.dag.InputNode() as inp:
        whole = dag_api.describe.bind(inp)
    assert ray.get(whole.execute(1, 2), timeout=30).startswith("DAGInputData(")


def test_a_task_with_arguments_that_do_not_fit_fails_at_execute(dag_api):
    """Ray 2.60 binds a function's arguments to its signature at execute(), not at bind()."""
    node = dag_api.add.bind(1)
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        node.execute()


def test_multi_output_node_returns_a_list_of_refs(dag_api):
    ray, inc, add = dag_api.ray, dag_api.inc, dag_api.add
    with ray.dag.InputNode() as inp:
        dag = ray.dag.MultiOutputNode([inc.bind(inp[0]), add.bind(inp[1], inp.x)])
    refs = dag.execute(1, 2, x=3)
    assert isinstance(refs, list) and all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs, timeout=30) == [2, 5]


def test_an_actor_is_created_anew_at_each_execute(dag_api):
    """Ray 2.60: a ClassNode is executed once per execute(), so each run has a new actor
    (the calls of one run share it)."""
    ray, Counter = dag_api.ray, dag_api.Counter
    with ray.dag.InputNode() as inp:
        counter = Counter.bind(100)
        first = counter.inc.bind(inp)
        dag = ray.dag.MultiOutputNode([first, counter.inc.bind(first)])
    assert ray.get(dag.execute(1), timeout=30) == [101, 202]
    assert ray.get(dag.execute(1), timeout=30) == [101, 202]  # not 303: a fresh actor


def test_calls_bound_earlier_on_an_actor_run_first(dag_api):
    """Ray 2.60: executing a method node first submits the calls bound before it on the same
    ClassNode, in bind order, even when the result does not depend on them."""
    ray, Counter = dag_api.ray, dag_api.Counter
    counter = Counter.bind(0)
    counter.inc.bind(5)
    counter.inc.bind(7)
    dag = counter.get.bind()
    assert ray.get(dag.execute(), timeout=30) == 12


def test_a_class_node_as_root_or_argument_is_an_actor_handle(dag_api):
    ray, Counter = dag_api.ray, dag_api.Counter
    handle = Counter.bind(7).execute()
    assert isinstance(handle, ray.actor.ActorHandle)
    assert ray.get(handle.get.remote(), timeout=30) == 7

    @ray.remote
    def read(actor):
        return ray.get(actor.inc.remote(1), timeout=30)

    assert ray.get(read.bind(Counter.bind(41)).execute(), timeout=30) == 42


def test_methods_of_a_live_actor_bind_and_check_their_arguments(dag_api):
    """Ray 2.60: ``handle.method.bind()`` checks the arguments at once (TypeError), calls the
    same actor at each execute, and splits ``num_returns=2`` into a tuple of two nodes."""
    ray, Counter = dag_api.ray, dag_api.Counter
    handle = Counter.remote(1)
    with pytest.raises(TypeError, match=r"too many positional arguments.*args: \(1, 2, 3\)"):
        handle.inc.bind(1, 2, 3)
    with ray.dag.InputNode() as inp:
        dag = handle.inc.bind(inp)
    assert ray.get(dag.execute(2), timeout=30) == 3
    assert ray.get(dag.execute(2), timeout=30) == 5  # the same actor
    first, second = handle.pair.bind()
    assert ray.get(ray.dag.MultiOutputNode([first, second]).execute(), timeout=30) == [5, -5]
    assert ray.get(second.execute(), timeout=30) == -5


def test_options_before_bind_are_honoured(dag_api):
    ray, Counter = dag_api.ray, dag_api.Counter

    @ray.remote
    def named():
        return ray.get_runtime_context().get_task_name()

    @ray.remote
    def halves(items):
        return items[:1], items[1:]

    assert ray.get(named.options(name="stage-one").bind().execute(), timeout=30) == "stage-one"
    refs = halves.options(num_returns=2).bind([1, 2]).execute()
    assert ray.get(refs, timeout=30) == [[1], [2]]
    actor = Counter.options(name="dag-counter").bind(3).execute()
    assert ray.get(ray.get_actor("dag-counter").get.remote(), timeout=30) == 3
    ray.kill(actor)
    counter = Counter.bind(4)
    both = counter.pair.options(num_returns=1).bind()
    assert ray.get(both.execute(), timeout=30) == (4, -4)


def test_a_failing_stage_fails_its_downstream_result(dag_api):
    ray, inc = dag_api.ray, dag_api.inc

    @ray.remote
    def boom(x):
        raise ValueError(f"bad {x}")

    with ray.dag.InputNode() as inp:
        dag = inc.bind(boom.bind(inp))
    with pytest.raises(ValueError, match="bad 3"):
        ray.get(dag.execute(3), timeout=30)


def test_execute_warns_and_compile_is_refused(dag_api):
    ray, inc = dag_api.ray, dag_api.inc
    with ray.dag.InputNode() as inp:
        dag = inc.bind(inp)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = dag.execute(1)
    assert any("DAGNode.execute() is deprecated" in str(w.message) for w in caught)
    assert ray.get(ref, timeout=30) == 2
    with pytest.raises(NotImplementedError, match=r"dag\.execute"):
        dag.experimental_compile()


def test_dags_work_under_the_ray_alias(drivers):
    """``miniray run`` programs import ``ray.dag`` and its submodules as in Ray."""
    done = miniray_run(drivers, """
        import ray
        from ray.dag import InputNode, MultiOutputNode
        from ray.dag.input_node import InputAttributeNode
        from ray.dag.class_node import ClassNode

        @ray.remote
        def double(x):
            return 2 * x

        @ray.remote
        class Scale:
            def __init__(self, k):
                self.k = k
            def apply(self, x):
                return self.k * x

        ray.init(num_cpus=1)
        with InputNode() as inp:
            scale = Scale.bind(3)
            dag = MultiOutputNode([double.bind(inp.a), scale.apply.bind(inp.b)])
        assert isinstance(inp.a, InputAttributeNode) and isinstance(scale, ClassNode)
        print(ray.get(dag.execute(a=1, b=2), timeout=60), ray.dag is __import__("miniray").dag)
        ray.shutdown()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[2, 6] True"
