"""Unit tests for miniray/_private/core/options.py: option validation and resource requests.

Expected messages are Ray 2.60's (surface doc §2.1–2.7, §6.4–6.6). No processes.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import re
import warnings

import pytest

try:
    from miniray._private.core import options as opts
except Exception:  # the package __init__ may not be importable while it is being written
    _path = pathlib.Path(__file__).resolve().parents[2] / "miniray" / "_private" / "options.py"
    _spec = importlib.util.spec_from_file_location("_miniray_options_under_test", _path)
    opts = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(opts)


# --- stand-ins for classes that other modules define, matched by class name -----------------


class PlacementGroupSchedulingStrategy:
    pass


class NodeAffinitySchedulingStrategy:
    pass


class NodeLabelSchedulingStrategy:
    pass


class PlacementGroup:
    pass


class SubclassedStrategy(NodeAffinitySchedulingStrategy):
    pass


def plain():
    return 1


def gen():
    yield 1


async def coro():
    return 1


async def agen():
    yield 1


class Klass:
    async def method(self):
        return 1


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


# --- @remote shapes (surface §2.1) ---------------------------------------------------------

REMOTE_PREFIX = (
    "The @ray.remote decorator must be applied either with no arguments and no parentheses..."
)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((plain,), {}),
        ((Klass,), {}),  # async methods on a class are fine
        ((agen,), {}),  # async generators are generator tasks, not coroutines
        ((), {"num_cpus": 1}),
        ((), {"unknown_key": 1}),  # names are checked later, by validate_*_options
    ],
)
def test_remote_shapes_accepted(args, kwargs):
    assert opts.check_remote_args(args, kwargs) is None


@pytest.mark.parametrize(
    "args, kwargs",
    [((), {}), ((plain,), {"num_cpus": 1}), ((1,), {}), ((plain, plain), {}), (("f",), {})],
)
def test_remote_bad_shapes_raise_assertion(args, kwargs):
    with pytest.raises(AssertionError) as info:
        opts.check_remote_args(args, kwargs)
    message = str(info.value)
    if len(args) == 1 and not kwargs:  # a value, not callable: named before Ray's text
        given = (f"@ray.remote got {type(args[0]).__name__} {args[0]!r}, which is neither a "
                 "function nor a class. ")
        assert message.startswith(given)
        message = message[len(given):]
    assert message.startswith(REMOTE_PREFIX[:-3])
    assert "'num_returns'" in message and "'max_restarts'" in message
    assert message.endswith("""'@ray.remote(num_returns=2, resources={"CustomResource": 1})'.""")


@pytest.mark.parametrize("target", [len, print, (lambda: 1).__call__, Klass().method])
def test_remote_on_non_function_callable_raises_type_error(target):
    with pytest.raises(TypeError, match="must be applied to either a function or a class"):
        opts.check_remote_args((target,), {})


def test_remote_on_callable_instance_raises_type_error():
    class CallMe:
        def __call__(self):
            return 1

    with pytest.raises(TypeError, match="either a function or a class"):
        opts.check_remote_args((CallMe(),), {})


def test_remote_on_async_def_raises_value_error():
    with pytest.raises(ValueError, match=r"^'async def' should not be used for remote tasks"):
        opts.check_remote_args((coro,), {})


# --- option names (surface §2.2) -----------------------------------------------------------

TASK_NAMES = {
    "label_selector", "fallback_strategy", "accelerator_type", "memory", "name", "num_cpus",
    "num_gpus", "object_store_memory", "placement_group", "placement_group_bundle_index",
    "placement_group_capture_child_tasks", "resources", "runtime_env", "scheduling_strategy",
    "enable_task_events", "_labels", "max_calls", "max_retries", "num_returns",
    "retry_exceptions", "_generator_backpressure_num_objects", "_num_objects_per_yield",
}  # fmt: skip
ACTOR_ONLY_NAMES = {
    "concurrency_groups", "enable_tensor_transport", "lifetime", "max_concurrency",
    "max_restarts", "max_task_retries", "max_pending_calls", "namespace", "get_if_exists",
    "allow_out_of_order_execution", "_actor_generator_backpressure_num_objects",
}  # fmt: skip
TASK_ONLY_NAMES = {
    "max_calls", "max_retries", "num_returns", "retry_exceptions",
    "_generator_backpressure_num_objects", "_num_objects_per_yield",
}  # fmt: skip


def test_option_name_sets():
    assert opts.TASK_OPTIONS == TASK_NAMES
    assert opts.ACTOR_OPTIONS == (TASK_NAMES - TASK_ONLY_NAMES) | ACTOR_ONLY_NAMES
    assert opts.METHOD_OPTIONS == {
        "num_returns", "concurrency_group", "max_task_retries", "retry_exceptions",
        "_generator_backpressure_num_objects", "_num_objects_per_yield",
        "enable_task_events", "tensor_transport",
    }  # fmt: skip
    for names in (opts.TASK_OPTIONS, opts.ACTOR_OPTIONS, opts.METHOD_OPTIONS):
        assert isinstance(names, frozenset)


def test_unknown_task_option_lists_valid_ones_in_ray_order():
    with pytest.raises(ValueError) as info:
        opts.validate_task_options({"foo": 1}, in_options=False)
    message = str(info.value)
    assert message.startswith("Invalid option keyword foo for remote functions. Valid ones are [")
    assert message.endswith("'_generator_backpressure_num_objects', '_num_objects_per_yield'].")
    assert message.index("'label_selector'") < message.index("'max_calls'")


@pytest.mark.parametrize("key", sorted(ACTOR_ONLY_NAMES))
def test_actor_only_option_refused_on_tasks(key):
    with pytest.raises(ValueError, match=f"^Invalid option keyword {key} for remote functions"):
        opts.validate_task_options({key: None}, in_options=False)


@pytest.mark.parametrize("key", sorted(TASK_ONLY_NAMES))
def test_task_only_option_refused_on_actors(key):
    with pytest.raises(ValueError, match=f"^Invalid option keyword {key} for actors. Valid"):
        opts.validate_actor_options({key: None}, in_options=False)


# --- accepted values -----------------------------------------------------------------------

ACCEPTED_COMMON = [
    {"num_cpus": 0},
    {"num_cpus": 0.5, "num_gpus": 0.25},
    {"num_gpus": 1.5},  # refused only at .remote()
    {"num_gpus": 0.0001},
    {"num_gpus": None, "num_cpus": None, "resources": None},
    {"resources": {"custom": 2, "zero": 0}},
    {"resources": {"memory": 1}},  # refused only at .remote()
    {"resources": {"neuron_cores": 2, "HPU": 1.0, "NPU": 0.5}},
    {"resources": {"TPU": 4, "HPU": 1.0}},
    {"memory": 1e9, "accelerator_type": "V100", "name": "x"},
    {"scheduling_strategy": None},
    {"scheduling_strategy": "DEFAULT"},
    {"scheduling_strategy": "SPREAD"},
    {"scheduling_strategy": "NOT_A_STRATEGY"},  # refused only at .remote()
    {"scheduling_strategy": PlacementGroupSchedulingStrategy()},
    {"scheduling_strategy": NodeAffinitySchedulingStrategy()},
    {"scheduling_strategy": NodeLabelSchedulingStrategy()},
    {"scheduling_strategy": SubclassedStrategy()},
    {"placement_group": "default", "scheduling_strategy": "SPREAD"},
    {"placement_group": None, "scheduling_strategy": "SPREAD"},
    {"placement_group": PlacementGroup(), "placement_group_bundle_index": 0},
    {"runtime_env": {"env_vars": {"A": "1"}}, "enable_task_events": False, "_labels": {}},
    {"label_selector": {"region": "us"}, "fallback_strategy": [{"label_selector": {}}]},
]


@pytest.mark.parametrize("options", ACCEPTED_COMMON)
@pytest.mark.parametrize("in_options", [False, True])
def test_common_options_accepted(options, in_options):
    opts.validate_task_options(options, in_options=in_options)
    opts.validate_actor_options(options, in_options=in_options)


@pytest.mark.parametrize(
    "options",
    [
        {"max_calls": 0, "max_retries": -1, "retry_exceptions": True},
        {"retry_exceptions": [ValueError, KeyError]},
        {"retry_exceptions": (OSError,)},
        {"num_returns": 0},
        {"num_returns": 3},
        {"num_returns": None},
        {"num_returns": "streaming"},
        {"num_returns": "dynamic"},  # the caller warns at .remote()
        {"object_store_memory": None},
        {"_generator_backpressure_num_objects": -1, "_num_objects_per_yield": 2},
    ],
)
def test_task_options_accepted(options):
    opts.validate_task_options(options, in_options=False)


@pytest.mark.parametrize(
    "options",
    [
        {"max_restarts": -1, "max_task_retries": -1, "max_pending_calls": -1},
        {"max_task_retries": 2},  # Ray 2.60 no longer requires max_restarts for this
        {"max_concurrency": 0},
        {"max_concurrency": 8, "allow_out_of_order_execution": None},
        {"lifetime": "detached", "name": "a", "namespace": "ns"},
        {"lifetime": "non_detached"},
        {"lifetime": None},
        {"get_if_exists": True, "name": "a"},
        {"get_if_exists": False},
        {"concurrency_groups": {"io": 2}},
        {"enable_tensor_transport": True},
        {"_actor_generator_backpressure_num_objects": -1},
        {"_actor_generator_backpressure_num_objects": 5},
    ],
)
def test_actor_options_accepted(options):
    opts.validate_actor_options(options, in_options=False)


# --- refused values: surface §2.4, row by row ----------------------------------------------

FLOAT_INT_NONE = "(<class 'float'>, <class 'int'>, <class 'NoneType'>)"
INT_NONE = "(<class 'int'>, <class 'NoneType'>)"

BOTH_REFUSED = [
    (
        {"num_cpus": -1},
        ValueError,
        exact("The quantity of resource num_cpus cannot be negative"),
    ),
    ({"num_gpus": -0.5}, ValueError, exact("The quantity of resource num_gpus cannot be negative")),
    ({"resources": {"x": -1}}, ValueError, exact("The quantity of resource x cannot be negative")),
    ({"memory": -1}, ValueError, exact("The quantity of resource memory cannot be negative")),
    (
        {"num_gpus": "1"},
        TypeError,
        exact(
            f"The type of keyword 'num_gpus' must be {FLOAT_INT_NONE}, "
            "but received type <class 'str'>"
        ),
    ),
    (
        {"num_cpus": [1]},
        TypeError,
        exact(
            f"The type of keyword 'num_cpus' must be {FLOAT_INT_NONE}, "
            "but received type <class 'list'>"
        ),
    ),
    (
        {"num_gpus": 0.00001},
        ValueError,
        exact(
            "The precision of the fractional quantity of resource num_gpus cannot go beyond 0.0001"
        ),
    ),
    (
        {"resources": {"custom": 0.00001}},
        ValueError,
        exact(
            "The precision of the fractional quantity of resource custom cannot go beyond 0.0001"
        ),
    ),
    (
        {"resources": {"CPU": 1}},
        ValueError,
        exact(
            "Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU' in "
            "'resources' keyword"
        ),
    ),
    ({"resources": {"GPU": 1}}, ValueError, r"^Use the 'num_cpus' and 'num_gpus' keyword"),
    (
        {"resources": {"neuron_cores": 0.5}},
        ValueError,
        exact(
            "neuron_cores resource quantity must be whole numbers. "
            "The specified quantity 0.5 is invalid."
        ),
    ),
    ({"resources": {"HPU": 1.5}}, ValueError, r"^HPU resource quantity must be whole numbers\. "),
    ({"resources": {"RBLN": 0.5}}, ValueError, r"^RBLN resource quantity must be whole numbers\. "),
    (
        {"resources": {"FURIOSA": 0.5}},
        ValueError,
        r"^FURIOSA resource quantity must be a whole number\. Furiosa NPUs",
    ),
    (
        {"resources": {"MBLT": 2.5}},
        ValueError,
        r"^MBLT resource quantity must be a whole number\. Mobilint NPUs",
    ),
    (
        {"resources": {"TTNPU": 0.5}},
        ValueError,
        exact("TTNPU resource quantity (0.5) must be an integer."),
    ),
    (
        {"resources": {"TPU": 0.5}},
        ValueError,
        exact(
            "The number of requested 'TPU' was set to 0.5 which is not a supported chip "
            "configuration. Supported configs: (1, 2, 4, 8)"
        ),
    ),
    (
        {"resources": {"TPU": 3}},
        ValueError,
        r"^The number of requested 'TPU' was set to 3 which is not a supported chip",
    ),
    ({"resources": "gpu"}, TypeError, r"^The type of keyword 'resources' must be \(<class 'dict'>"),
    (
        {"accelerator_type": 1},
        TypeError,
        exact(
            "The type of keyword 'accelerator_type' must be (<class 'str'>, <class 'NoneType'>), "
            "but received type <class 'int'>"
        ),
    ),
    ({"name": 3}, TypeError, r"^The type of keyword 'name' must be"),
    ({"runtime_env": []}, TypeError, r"^The type of keyword 'runtime_env' must be"),
    (
        {"scheduling_strategy": 1},
        TypeError,
        r"^The type of keyword 'scheduling_strategy' must be \(<class 'NoneType'>, <class 'str'>, "
        r"<class 'miniray\.util\.scheduling_strategies\.PlacementGroupSchedulingStrategy'>",
    ),
    (
        {"scheduling_strategy": object()},
        TypeError,
        r"received type <class 'object'>$",
    ),
    (
        {"enable_task_events": None},
        TypeError,
        exact(
            "The type of keyword 'enable_task_events' must be <class 'bool'>, "
            "but received type <class 'NoneType'>"
        ),
    ),
    (
        {"placement_group_bundle_index": None},
        TypeError,
        r"^The type of keyword 'placement_group_bundle_index' must be <class 'int'>, ",
    ),
    (
        {"placement_group": PlacementGroup(), "scheduling_strategy": "SPREAD"},
        ValueError,
        exact(
            "Placement groups should be specified via the scheduling_strategy option. "
            "The placement_group option is deprecated."
        ),
    ),
    (
        {"fallback_strategy": [1]},
        ValueError,
        exact("Each element in fallback_strategy must be a dictionary."),
    ),
    ({"fallback_strategy": [{}]}, ValueError, r"^Empty dictionary found in `fallback_strategy`"),
    (
        {"fallback_strategy": [{"num_cpus": 1}]},
        ValueError,
        exact(
            "Unsupported option found: 'num_cpus'. Only ['label_selector'] is currently supported."
        ),
    ),
    ({"label_selector": "a=b"}, TypeError, r"^The type of keyword 'label_selector' must be"),
]


@pytest.mark.parametrize("options, exc, pattern", BOTH_REFUSED)
@pytest.mark.parametrize("in_options", [False, True])
def test_refused_for_tasks_and_actors(options, exc, pattern, in_options):
    with pytest.raises(exc, match=pattern):
        opts.validate_task_options(options, in_options=in_options)
    with pytest.raises(exc, match=pattern):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            opts.validate_actor_options(options, in_options=in_options)


TASK_REFUSED = [
    (
        {"max_retries": -2},
        ValueError,
        exact(
            "The keyword 'max_retries' only accepts None, 0, -1 or a positive integer, "
            "where -1 represents infinity."
        ),
    ),
    (
        {"max_retries": 1.0},
        TypeError,
        exact(
            f"The type of keyword 'max_retries' must be {INT_NONE}, "
            "but received type <class 'float'>"
        ),
    ),
    (
        {"max_calls": -1},
        ValueError,
        exact("The keyword 'max_calls' only accepts None, 0 or a positive integer."),
    ),
    ({"max_calls": 1.5}, TypeError, r"^The type of keyword 'max_calls' must be"),
    (
        {"num_returns": -1},
        ValueError,
        r"^Default None\. When None is passed, The default value is 1",
    ),
    (
        # Ray 2.60: TypeError "'>=' not supported between instances of 'str' and 'int'".
        {"num_returns": "foo"},
        TypeError,
        exact(
            "The keyword 'num_returns' only accepts None, a non-negative integer, 'streaming' "
            "(for generators) or 'dynamic', got the string 'foo'."
        ),
    ),
    (
        {"num_returns": 1.0},
        TypeError,
        r"^The type of keyword 'num_returns' must be "
        r"\(<class 'int'>, <class 'str'>, <class 'NoneType'>\)",
    ),
    (
        {"retry_exceptions": ["x"]},
        ValueError,
        exact("retry_exceptions must be either a boolean or a list of exceptions"),
    ),
    ({"retry_exceptions": [int]}, ValueError, r"^retry_exceptions must be either a boolean"),
    ({"retry_exceptions": None}, TypeError, r"^The type of keyword 'retry_exceptions' must be"),
    (
        {"object_store_memory": 100},
        ValueError,
        exact("Setting 'object_store_memory' is not implemented for tasks"),
    ),
    (
        {"_generator_backpressure_num_objects": 0},
        ValueError,
        r"^_generator_backpressure_num_objects=0 is not allowed\. Use a value > 0\.",
    ),
    (
        {"_num_objects_per_yield": 0},
        ValueError,
        r"^_num_objects_per_yield is a private streaming generator option",
    ),
]


@pytest.mark.parametrize("options, exc, pattern", TASK_REFUSED)
def test_task_options_refused(options, exc, pattern):
    with pytest.raises(exc, match=pattern):
        opts.validate_task_options(options, in_options=False)


ACTOR_REFUSED = [
    (
        {"max_concurrency": -1},
        ValueError,
        exact("The keyword 'max_concurrency' only accepts None, 0 or a positive integer."),
    ),
    ({"max_restarts": -2}, ValueError, r"^The keyword 'max_restarts' only accepts None, 0, -1"),
    ({"max_task_retries": -2}, ValueError, r"^The keyword 'max_task_retries' only accepts"),
    ({"max_pending_calls": -5}, ValueError, r"^The keyword 'max_pending_calls' only accepts"),
    ({"max_restarts": 1.0}, TypeError, r"^The type of keyword 'max_restarts' must be"),
    (
        {"lifetime": "forever"},
        ValueError,
        exact("actor `lifetime` argument must be one of 'detached', 'non_detached' and 'None'."),
    ),
    ({"lifetime": 1}, TypeError, r"^The type of keyword 'lifetime' must be"),
    (
        {"get_if_exists": True},
        ValueError,
        exact("The actor name must be specified to use `get_if_exists`."),
    ),
    ({"get_if_exists": True, "name": ""}, ValueError, r"^The actor name must be specified"),
    ({"get_if_exists": None}, TypeError, r"^The type of keyword 'get_if_exists' must be <class"),
    ({"namespace": 1}, TypeError, r"^The type of keyword 'namespace' must be"),
    ({"concurrency_groups": "io"}, TypeError, r"^The type of keyword 'concurrency_groups'"),
    ({"allow_out_of_order_execution": 1}, TypeError, r"'allow_out_of_order_execution' must be"),
    ({"enable_tensor_transport": "yes"}, TypeError, r"'enable_tensor_transport' must be"),
    (
        {"_actor_generator_backpressure_num_objects": 0},
        ValueError,
        r"^_actor_generator_backpressure_num_objects must be > 0 .* Got 0\.$",
    ),
    ({"object_store_memory": -1}, ValueError, r"'object_store_memory' only accepts None, 0 or"),
]


@pytest.mark.parametrize("options, exc, pattern", ACTOR_REFUSED)
def test_actor_options_refused(options, exc, pattern):
    with pytest.raises(exc, match=pattern):
        opts.validate_actor_options(options, in_options=False)


def test_first_bad_key_in_order_is_reported():
    with pytest.raises(TypeError, match="'num_gpus'"):
        opts.validate_task_options({"num_gpus": "1", "num_cpus": -1}, in_options=False)
    with pytest.raises(ValueError, match="num_cpus"):
        opts.validate_task_options({"num_cpus": -1, "num_gpus": "1"}, in_options=False)


# --- .options()-only rules and num_returns vs generators -----------------------------------


def test_max_calls_refused_in_options_only():
    opts.validate_task_options({"max_calls": 2}, in_options=False)
    with pytest.raises(
        ValueError, match=exact("Setting 'max_calls' is not supported in '.options()'.")
    ):
        opts.validate_task_options({"max_calls": 2}, in_options=True)


def test_concurrency_groups_refused_in_actor_options_only():
    opts.validate_actor_options({"concurrency_groups": {"io": 1}}, in_options=False)
    message = "Setting 'concurrency_groups' is not supported in '.options()'."
    with pytest.raises(ValueError, match=exact(message)):
        opts.validate_actor_options({"concurrency_groups": {"io": 1}}, in_options=True)


def test_decorator_only_options_do_not_leak_into_options_merge():
    merged = opts.update_options({"max_calls": 1, "num_gpus": 1}, {"num_cpus": 2})
    opts.validate_task_options(merged, in_options=True)
    merged = opts.update_options({"concurrency_groups": {"io": 1}}, {"name": "a"})
    opts.validate_actor_options(merged, in_options=True)


@pytest.mark.parametrize("value", ["streaming", "dynamic"])
def test_generator_only_num_returns_on_plain_function(value):
    message = (
        f"num_returns='{value}' can only be used with generator functions (functions that use "
        "'yield'). The decorated function is not a generator function."
    )
    with pytest.raises(ValueError, match=exact(message)):
        opts.validate_task_options({"num_returns": value}, in_options=False, is_generator=False)
    opts.validate_task_options({"num_returns": value}, in_options=False, is_generator=True)
    opts.validate_task_options({"num_returns": value}, in_options=False)  # unknown: no check


def test_object_store_memory_on_actor_warns():
    with pytest.warns(DeprecationWarning, match="object_store_memory"):
        opts.validate_actor_options({"object_store_memory": 100}, in_options=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opts.validate_actor_options({"num_cpus": 1}, in_options=False)


# --- update_options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "base, new, expected",
    [
        ({}, {}, {}),
        ({"num_cpus": 2}, {"num_gpus": 1}, {"num_cpus": 2, "num_gpus": 1}),
        ({"num_cpus": 2}, {"num_cpus": 4}, {"num_cpus": 4}),
        ({"resources": {"a": 1}}, {"resources": None}, {"resources": None}),
        ({"resources": {"a": 1}}, {"resources": {"b": 2}}, {"resources": {"b": 2}}),
        ({"max_calls": 1, "num_gpus": 1}, {}, {"num_gpus": 1}),
        ({"concurrency_groups": {"io": 1}, "name": "x"}, {}, {"name": "x"}),
        ({}, {"max_calls": 3}, {"max_calls": 3}),  # then refused by validation
    ],
)
def test_update_options(base, new, expected):
    base_copy, new_copy = dict(base), dict(new)
    merged = opts.update_options(base, new)
    assert merged == expected
    assert merged is not base and merged is not new
    assert base == base_copy and new == new_copy


# --- task resource requests (surface §2.3, §6.4, §6.6) -------------------------------------


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, {"CPU": 1}),
        ({"num_cpus": 2}, {"CPU": 2}),
        ({"num_cpus": 0}, {}),
        ({"num_cpus": None}, {}),  # as in Ray 2.60: an explicit None requests no CPU
        ({"num_gpus": 1}, {"CPU": 1, "GPU": 1}),
        ({"num_gpus": 0.5}, {"CPU": 1, "GPU": 0.5}),
        ({"num_gpus": 0.25, "num_cpus": 0}, {"GPU": 0.25}),
        ({"num_gpus": 0}, {"CPU": 1}),
        ({"num_gpus": 2}, {"CPU": 1, "GPU": 2}),
        ({"num_gpus": 2.0}, {"CPU": 1, "GPU": 2}),
        ({"memory": 1000.9}, {"CPU": 1, "memory": 1000}),
        ({"accelerator_type": "V100"}, {"CPU": 1, "accelerator_type:V100": 0.001}),
        ({"resources": {"custom": 2, "zero": 0}}, {"CPU": 1, "custom": 2}),
        ({"resources": None, "num_gpus": None}, {"CPU": 1}),
        ({"resources": {"NPU": 0.5}}, {"CPU": 1, "NPU": 0.5}),
        ({"resources": {"custom": 1.5}}, {"CPU": 1, "custom": 1.5}),  # not a unit resource
        ({"scheduling_strategy": "SPREAD"}, {"CPU": 1}),
        ({"scheduling_strategy": NodeAffinitySchedulingStrategy()}, {"CPU": 1}),
    ],
)
def test_task_resource_request(options, expected):
    request = opts.task_resource_request(options)
    assert request == expected
    assert all(isinstance(v, float) for k, v in request.items() if k != "memory")
    if "memory" in request:
        assert isinstance(request["memory"], int)


GPU_FRACTION_MESSAGE = str(
    ("GPU resource quantities >1 must", " be whole numbers. The specified quantity 1.5 is invalid.")
)

REMOTE_TIME_REFUSED = [
    ({"num_gpus": 1.5}, exact(GPU_FRACTION_MESSAGE)),
    ({"resources": {"NPU": 2.5}}, r"^\('NPU resource quantities >1 must', "),
    (
        {"resources": {"memory": 1}},
        exact(
            "The resources dictionary must not contain the key 'memory' or 'object_store_memory'"
        ),
    ),
    ({"resources": {"object_store_memory": 1}}, r"must not contain the key 'memory' or "),
    (
        {"resources": {"bundle": 1}},
        exact(
            "The resource should not include `bundle` which is reserved for Ray. "
            "resources: {'bundle': 1}"
        ),
    ),
    (
        {"scheduling_strategy": "RANDOM"},
        exact(
            'Invalid scheduling_strategy value RANDOM. Valid values are ["DEFAULT" | "SPREAD" '
            "| PlacementGroupSchedulingStrategy | NodeAffinitySchedulingStrategy]"
        ),
    ),
]


@pytest.mark.parametrize("options, pattern", REMOTE_TIME_REFUSED)
def test_remote_time_checks(options, pattern):
    # Accepted when decorating, refused when a request is built.
    opts.validate_task_options(options, in_options=False)
    opts.validate_actor_options(options, in_options=False)
    with pytest.raises(ValueError, match=pattern):
        opts.task_resource_request(options)
    with pytest.raises(ValueError, match=pattern):
        opts.actor_resource_requests(options)


def test_gpu_fraction_message_is_str_of_a_tuple():
    with pytest.raises(ValueError) as info:
        opts.task_resource_request({"num_gpus": 1.5})
    assert str(info.value) == (
        "('GPU resource quantities >1 must', ' be whole numbers. "
        "The specified quantity 1.5 is invalid.')"
    )


# --- actor resource requests (surface §2.3) ------------------------------------------------


@pytest.mark.parametrize(
    "options, placement, held",
    [
        ({}, {"CPU": 1}, {}),
        ({"name": "a", "max_concurrency": 4}, {"CPU": 1}, {}),
        ({"resources": None, "num_gpus": None}, {"CPU": 1}, {}),
        ({"resources": {}}, {"CPU": 1}, {}),
        ({"memory": 100}, {"CPU": 1, "memory": 100}, {"memory": 100}),
        ({"object_store_memory": 100}, {"CPU": 1}, {}),
        ({"num_gpus": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}),
        ({"num_gpus": 0.5}, {"CPU": 1, "GPU": 0.5}, {"CPU": 1, "GPU": 0.5}),
        ({"num_gpus": 0}, {"CPU": 1}, {"CPU": 1}),  # num_gpus=0 still counts, as in Ray
        ({"resources": {"custom": 1}}, {"CPU": 1, "custom": 1}, {"CPU": 1, "custom": 1}),
        ({"resources": {"custom": 0}}, {"CPU": 1}, {"CPU": 1}),
        (
            {"accelerator_type": "A100"},
            {"CPU": 1, "accelerator_type:A100": 0.001},
            {"CPU": 1, "accelerator_type:A100": 0.001},
        ),
        ({"num_cpus": 2}, {"CPU": 2}, {"CPU": 2}),
        ({"num_cpus": 0}, {}, {}),
        ({"num_cpus": 0, "num_gpus": 1}, {"GPU": 1}, {"GPU": 1}),
        ({"num_cpus": 0.5, "num_gpus": 0.5}, {"CPU": 0.5, "GPU": 0.5}, {"CPU": 0.5, "GPU": 0.5}),
        (
            {"num_gpus": 1, "memory": 10.5},
            {"CPU": 1, "GPU": 1, "memory": 10},
            {"CPU": 1, "GPU": 1, "memory": 10},
        ),
    ],
)
def test_actor_resource_requests(options, placement, held):
    assert opts.actor_resource_requests(options) == (placement, held)


# --- actor creation checks -----------------------------------------------------------------

ASYNC_IN_ORDER = (
    "If you're using async actors, Ray can't execute actor tasks in order. "
    "Set `allow_out_of_order_execution=True` to allow out-of-order execution."
)
THREADED_IN_ORDER = (
    "If you're using multi-threaded actors, Ray can't execute actor tasks in order. "
    "Set `allow_out_of_order_execution=True` to allow out-of-order execution."
)


@pytest.mark.parametrize(
    "options, is_async, exc, pattern",
    [
        ({"name": ""}, False, ValueError, exact("Actor name cannot be an empty string.")),
        (
            {"name": 5},
            False,
            TypeError,
            exact("name must be None or a string, got: '<class 'int'>'."),
        ),
        (
            {"namespace": ""},
            False,
            ValueError,
            exact('"" is not a valid namespace. Pass None to not specify a namespace.'),
        ),
        ({"namespace": 1}, False, TypeError, exact("namespace must be None or a string.")),
        ({"lifetime": "forever"}, False, ValueError, r"^actor `lifetime` argument must be one of"),
        ({"allow_out_of_order_execution": False}, True, ValueError, exact(ASYNC_IN_ORDER)),
        (
            {"allow_out_of_order_execution": False, "max_concurrency": 2},
            False,
            ValueError,
            exact(THREADED_IN_ORDER),
        ),
    ],
)
def test_actor_creation_checks_refuse(options, is_async, exc, pattern):
    with pytest.raises(exc, match=pattern):
        opts.actor_creation_checks(options, is_async=is_async)


@pytest.mark.parametrize(
    "options, is_async",
    [
        ({}, False),
        ({}, True),
        ({"name": "a", "namespace": "ns", "lifetime": "detached"}, False),
        ({"allow_out_of_order_execution": False}, False),
        ({"allow_out_of_order_execution": False, "max_concurrency": 1}, False),
        ({"allow_out_of_order_execution": True, "max_concurrency": 8}, True),
        ({"max_concurrency": 8}, False),
        ({"name": None, "namespace": None}, False),
    ],
)
def test_actor_creation_checks_accept(options, is_async):
    assert opts.actor_creation_checks(options, is_async=is_async) is None


# --- defaults (surface §6.5, §9) -----------------------------------------------------------


@pytest.mark.parametrize(
    "decorator_options, expected",
    [
        ({}, 0),
        ({"num_cpus": 2}, 0),
        ({"num_gpus": 1}, 1),
        ({"num_gpus": 0.5}, 1),
        ({"num_gpus": 0}, 0),
        ({"num_gpus": None}, 0),
        ({"num_gpus": 1, "max_calls": 0}, 0),
        ({"num_gpus": 1, "max_calls": 5}, 5),
        ({"num_gpus": 1, "max_calls": None}, 1),
        ({"max_calls": 3}, 3),
        ({"runtime_env": {"nsight": "default"}, "max_calls": 0}, 1),
    ],
)
def test_default_max_calls(decorator_options, expected):
    assert opts.default_max_calls(decorator_options) == expected


def test_default_max_calls_ignores_options_overrides():
    # Decided from the decorator only: .options(num_gpus=1) on a CPU function keeps reuse.
    decorator = {"num_cpus": 1}
    assert opts.default_max_calls(decorator) == 0
    assert opts.default_max_calls({"num_gpus": 1}) == 1  # even if called with num_gpus=0


def test_default_max_retries(monkeypatch):
    monkeypatch.delenv("RAY_TASK_MAX_RETRIES", raising=False)
    assert opts.default_max_retries() == 3
    monkeypatch.setenv("RAY_TASK_MAX_RETRIES", "7")
    assert opts.default_max_retries() == 7
    monkeypatch.setenv("RAY_TASK_MAX_RETRIES", "-1")
    assert opts.default_max_retries() == -1
    monkeypatch.setenv("RAY_TASK_MAX_RETRIES", "many")
    with pytest.raises(ValueError, match="RAY_TASK_MAX_RETRIES"):
        opts.default_max_retries()


# --- @method (surface §2.7) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_returns": 2},
        {"num_returns": 0},
        {"num_returns": "streaming"},
        {"concurrency_group": "io", "max_task_retries": 3, "retry_exceptions": True},
        {"_generator_backpressure_num_objects": 2, "_num_objects_per_yield": 1},
        {"enable_task_events": False, "tensor_transport": "nccl"},
    ],
)
def test_method_options_accepted(kwargs):
    opts.validate_method_options(kwargs)


def test_method_unknown_keyword_raises_assertion():
    with pytest.raises(AssertionError) as info:
        opts.validate_method_options({"num_returns": 1, "foo": 1})
    assert str(info.value) == (
        "Unexpected keyword argument to @ray.method: 'foo'. The supported keyword arguments "
        "are ['num_returns', 'concurrency_group', 'max_task_retries', 'retry_exceptions', "
        "'_generator_backpressure_num_objects', '_num_objects_per_yield', "
        "'enable_task_events', 'tensor_transport']"
    )


@pytest.mark.parametrize(
    "kwargs, is_generator, exc, pattern",
    [
        (
            {"num_returns": "foo"},
            None,
            TypeError,
            r"^The keyword 'num_returns' only accepts None, .* got the string 'foo'\.$",
        ),
        ({"num_returns": 1.5}, None, TypeError, r"^The type of keyword 'num_returns' must be"),
        ({"num_returns": -1}, None, ValueError, exact("num_returns must be >= 0, but got -1.")),
        ({"num_returns": "streaming"}, False, ValueError, r"^num_returns='streaming' can only be"),
        ({"num_returns": "dynamic"}, False, ValueError, r"^num_returns='dynamic' can only be"),
        ({"_num_objects_per_yield": 0}, None, ValueError, r"^_num_objects_per_yield is a private"),
    ],
)
def test_method_options_refused(kwargs, is_generator, exc, pattern):
    with pytest.raises(exc, match=pattern):
        opts.validate_method_options(kwargs, is_generator=is_generator)


def test_generator_method_accepts_streaming():
    opts.validate_method_options({"num_returns": "streaming"}, is_generator=True)
    opts.validate_method_options({"num_returns": "dynamic"}, is_generator=True)


def _method_of_a_handle(name: str):
    """``handle.<name>`` of a handle made without a runtime (``.options`` needs none)."""
    import miniray
    from miniray.actor import ActorHandle

    @miniray.remote
    class Calls:
        def plain(self):
            return 1

        def numbers(self):
            yield 1

    return getattr(ActorHandle(b"\x01" * 16, ("Calls", Calls._methods, 0)), name)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        ({"num_returns": "x"}, TypeError, r"^The keyword 'num_returns' only accepts None, .*'x'"),
        ({"num_returns": 1.5}, TypeError, r"^The type of keyword 'num_returns' must be"),
        ({"num_returns": -1}, ValueError, exact("num_returns must be >= 0, but got -1.")),
        ({"num_returns": "streaming"}, ValueError, r"^num_returns='streaming' can only be used"),
        ({"num_returns": "dynamic"}, ValueError, r"^num_returns='dynamic' can only be used"),
        ({"max_task_retries": "x"}, TypeError, r"^The type of keyword 'max_task_retries'"),
        ({"max_task_retries": -2}, ValueError, r"^The keyword 'max_task_retries' only accepts"),
        ({"name": 3}, TypeError, r"^The type of keyword 'name' must be"),
        ({"retry_exceptions": 3}, TypeError, r"^The type of keyword 'retry_exceptions'"),
        ({"retry_exceptions": [int]}, ValueError, r"^retry_exceptions must be either"),
    ],
)
def test_actor_method_options_are_checked_as_task_options(kwargs, exc, pattern):
    """``handle.method.options(...)`` refuses what task options refuse. Compared with Ray
    2.60: same types for ``num_returns`` "x" (TypeError), -1 and "streaming" on a plain method
    (ValueError), ``max_task_retries="x"`` and ``name=3`` (TypeError); Ray lets 1.5 and -2
    through and raises AssertionError for ``retry_exceptions=3``."""
    with pytest.raises(exc, match=pattern):
        _method_of_a_handle("plain").options(**kwargs)


def test_actor_method_options_accept_what_ray_accepts():
    """Compared with Ray 2.60: None, 0, 2 and True are counts; "streaming" suits a generator,
    and so does "dynamic", with its RayDeprecationWarning."""
    from miniray._private.core.task_spec import DYNAMIC, STREAMING
    from miniray.util.annotations import RayDeprecationWarning

    for value, count in ((None, 1), (0, 0), (2, 2), (True, True)):
        assert _method_of_a_handle("plain").options(num_returns=value)._num_returns == count
    numbers = _method_of_a_handle("numbers")
    assert numbers.options(num_returns="streaming")._num_returns == STREAMING
    with pytest.warns(RayDeprecationWarning, match="^num_returns='dynamic' is deprecated"):
        assert numbers.options(num_returns="dynamic")._num_returns == DYNAMIC
    method = _method_of_a_handle("plain").options(max_task_retries=-1, name="n",
                                                  retry_exceptions=[ValueError])
    assert method._max_task_retries == -1 and method._call_name == "n"


# --- module hygiene -------------------------------------------------------------------------


def test_public_surface():
    assert set(opts.__all__) == {
        "TASK_OPTIONS", "ACTOR_OPTIONS", "METHOD_OPTIONS", "check_remote_args",
        "validate_task_options", "validate_actor_options", "update_options",
        "task_resource_request", "actor_resource_requests", "actor_creation_checks",
        "default_max_calls", "validate_method_options", "default_max_retries",
        "validate_method_call_options", "placement_option", "hard_affinity", "node_affinity",
        "task_strategy", "wire_retry_exceptions",
    }  # fmt: skip
    defined_here = {
        name
        for name, value in vars(opts).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and getattr(value, "__module__", opts.__name__) == opts.__name__
    }
    assert defined_here == set(opts.__all__)


def test_placement_option_reads_the_options_as_ray_does():
    from miniray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = object()
    assert opts.placement_option({}) == ("default", -1, None)
    assert opts.placement_option({"scheduling_strategy": "DEFAULT"}) is None
    assert opts.placement_option({"scheduling_strategy": "SPREAD"}) is None
    assert opts.placement_option({"placement_group": None}) is None
    strategy = PlacementGroupSchedulingStrategy(group, 1, True)
    assert opts.placement_option({"scheduling_strategy": strategy}) == (group, 1, True)
    strategy = PlacementGroupSchedulingStrategy(group)
    assert opts.placement_option({"scheduling_strategy": strategy}) == (group, -1, None)
    assert opts.placement_option({"placement_group": group}) == (group, -1, None)
    assert opts.placement_option({"placement_group": group, "placement_group_bundle_index": 0,
                                  "placement_group_capture_child_tasks": True}) == (
        group, 0, True)


# The GPU-support document: a task or actor may not ask for both num_gpus and neuron_cores
# (Ray's check until 2.9; miniray keeps it).
ACCELERATOR_CONFLICTS = [
    ({"num_gpus": 1, "resources": {"neuron_cores": 1}}, "GPU,neuron_cores"),
    ({"num_gpus": 0.5, "resources": {"TPU": 4}}, "GPU,TPU"),
    ({"num_gpus": 1, "accelerator_type": "aws-neuron-core"}, "GPU,neuron_cores"),
    ({"resources": {"neuron_cores": 2, "TPU": 1}}, "neuron_cores,TPU"),
]


@pytest.mark.parametrize("request_opts,named", ACCELERATOR_CONFLICTS)
@pytest.mark.parametrize("validate", [opts.validate_task_options,
                                      opts.validate_actor_options], ids=["task", "actor"])
def test_gpus_and_other_accelerators_in_one_request_are_refused(request_opts, named, validate):
    with pytest.raises(ValueError, match=r"Only one of 'num_gpus', "
                       r"'neuron_cores/accelerator_type:aws-neuron-core' and "
                       r"'TPU/accelerator_type:TPU-V\*' can be set\. Detected 2 options "
                       r"were configured: " + named):
        validate(request_opts, in_options=False)


@pytest.mark.parametrize("request_opts", [{"num_gpus": 1, "resources": {"neuron_cores": 0}},
                                          {"resources": {"neuron_cores": 2}}, {"num_gpus": 2}])
def test_one_accelerator_family_is_fine(request_opts):
    opts.validate_task_options(request_opts, in_options=False)


@pytest.mark.parametrize("target", [1, "f", len, print, Klass().method, coro])
def test_remote_raises_what_check_remote_args_raises_bare_and_with_options(target):
    """``remote(x)`` leaves the target's checks to RemoteFunction: the same errors."""
    from miniray._private.surface import remote

    with pytest.raises((AssertionError, TypeError, ValueError)) as expected:
        opts.check_remote_args((target,), {})
    for make in (lambda: remote(target), lambda: remote(num_cpus=1)(target)):
        with pytest.raises(expected.type) as info:
            make()
        assert str(info.value) == str(expected.value)
