"""Validation of ``@remote`` / ``.options()`` / ``@method`` arguments, and resource requests.

Owns the shape rules of ``@remote``; the option names of tasks, actors and actor methods with
their type and value rules (checked at decoration and ``.options()`` time); the checks Ray
makes only at ``.remote()`` time (fractional GPU above 1, reserved ``resources`` keys, unknown
scheduling-strategy strings, actor names and ordering); turning options into the resource
request the ledger is asked for, with Ray's defaults; and the defaults that depend on options
or the environment (``max_calls``, ``max_retries``).

Does not own: building RemoteFunction / ActorClass objects; deciding whether a function is a
generator or a class is async (callers pass that in); the ``num_returns="dynamic"``
deprecation warning (the public modules emit it, ``remote_function.warn_if_dynamic``);
resource arithmetic and fitting
(``_private/core/resources.py``). Pure logic: no I/O, no processes, nothing happens at import.

Called by ``miniray/remote_function.py``, ``miniray/actor.py`` and ``miniray/__init__.py``
(``remote``, ``method``)::

    @remote(**opts)  --check_remote_args, validate_*_options(in_options=False)-->  decorated
    .options(**new)  --update_options, validate_*_options(in_options=True)----->  wrapper
    .remote(...)     --task_resource_request | actor_creation_checks +
                       actor_resource_requests------------------------------->  ledger

Mirrors ``ray._common.ray_option_utils`` (Ray 2.60), plus the ``.remote()``-time checks Ray
makes in ``ray._common.utils.resources_from_ray_options``, ``_raylet.prepare_resources`` and
``ActorClass._remote``. Differs:
  * Scheduling-strategy and placement-group objects are recognised by class name, so this
    module imports nothing from ``miniray.util``; the TypeError names them under
    ``miniray.util``.
  * ``label_selector`` values are not checked against Ray's label syntax; ``fallback_strategy``
    gets Ray's structural checks only.
  * An actor's ``object_store_memory`` is warned about (as in Ray) but is not put in the
    resource request (Ray asks for it as a logical resource).
  * ``update_options`` itself drops the decorator's ``max_calls`` and ``concurrency_groups``
    before merging (Ray's ``.options()`` callers do that).
  * ``@method(num_returns=...)`` also gets the task type rules (a bad string raises the same
    TypeError as on a task); Ray checks only negative ints and generator-only values there.
    ``ActorMethod.options(...)`` gets the same ``num_returns`` rules and the task rules of
    ``max_task_retries``, ``name`` and ``retry_exceptions`` (Ray lets ``num_returns=1.5`` or
    ``max_task_retries=-2`` through there).
  * Deprecated ``placement_group*`` options get no DeprecationWarning at ``.remote()``.
  * ``num_gpus`` together with ``neuron_cores`` or ``TPU`` in one request is refused, as the
    GPU-support document says and Ray did until 2.9 (2.60 no longer checks).
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from typing import Any, Callable, NamedTuple, Union

from miniray._private.core import runtime_envs, serialization

__all__ = [
    "ACTOR_OPTIONS",
    "METHOD_OPTIONS",
    "TASK_OPTIONS",
    "actor_creation_checks",
    "actor_resource_requests",
    "check_remote_args",
    "default_max_calls",
    "default_max_retries",
    "placement_option",
    "hard_affinity",
    "node_affinity",
    "task_resource_request",
    "wire_retry_exceptions",
    "task_strategy",
    "update_options",
    "validate_actor_options",
    "validate_method_call_options",
    "validate_method_options",
    "validate_task_options",
]

_NoneType = type(None)

# Ray keeps resource quantities in fixed point with 1/10000 resolution.
_RESOURCE_UNIT_SCALING = 10_000

# Resources handed out as whole instances (Ray's predefined and default custom
# "unit instance" resources): a float quantity >= 1 must be a whole number, checked at
# .remote() time. Most of these already reject every fraction at decoration time.
_UNIT_INSTANCE_RESOURCES = frozenset(
    {"GPU", "neuron_cores", "TPU", "NPU", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT"}
)
_TPU_CHIP_OPTIONS = (1, 2, 4, 8)

# A kind is a type, or the dotted name of a miniray class matched by its class name, so
# this module needs no import of the (optional) classes it accepts.
_Kind = Union[type, str]
_PG = "miniray.util.placement_group.PlacementGroup"
_STRATEGIES = tuple(
    f"miniray.util.scheduling_strategies.{name}"
    for name in (
        "PlacementGroupSchedulingStrategy",
        "NodeAffinitySchedulingStrategy",
        "NodeLabelSchedulingStrategy",
    )
)


class _Rule(NamedTuple):
    """How one option is checked: allowed kinds, then a value check returning a message."""

    kinds: Union[_Kind, tuple]
    check: Callable[[Any], str | None] | None = None


def _is_kind(value: Any, kind: _Kind) -> bool:
    if isinstance(kind, str):
        short = kind.rsplit(".", 1)[-1]
        return any(cls.__name__ == short for cls in type(value).__mro__)
    return isinstance(value, kind)


def _render_kind(kind: _Kind) -> str:
    return f"<class '{kind}'>" if isinstance(kind, str) else repr(kind)


def _apply(rule: _Rule, key: str, value: Any) -> None:
    kinds = rule.kinds if isinstance(rule.kinds, tuple) else (rule.kinds,)
    if not any(_is_kind(value, kind) for kind in kinds):
        # Ray prints the constraint as Python shows it: a bare class, or a tuple of them.
        shown = (
            "(" + ", ".join(_render_kind(k) for k in kinds) + ")"
            if isinstance(rule.kinds, tuple)
            else _render_kind(rule.kinds)
        )
        raise TypeError(
            f"The type of keyword '{key}' must be {shown}, but received type {type(value)}"
        )
    if rule.check is not None:
        message = rule.check(value)
        if message:
            raise ValueError(message)


# --- Value checks ------------------------------------------------------------------------------


def _unless(ok: Callable[[Any], bool], message: str) -> Callable[[Any], str | None]:
    """A value check: None when ``ok(value)``, else ``message`` ("{}" becomes the value)."""
    return lambda value: None if ok(value) else message.format(value)


def _count(name: str, *, minus_one_is_infinite: bool) -> _Rule:
    if minus_one_is_infinite:
        return _Rule(
            (int, _NoneType),
            _unless(
                lambda v: v is None or v >= -1,
                f"The keyword '{name}' only accepts None, 0, -1 or a positive integer, "
                "where -1 represents infinity.",
            ),
        )
    message = f"The keyword '{name}' only accepts None, 0 or a positive integer."
    return _Rule((int, _NoneType), _unless(lambda v: v is None or v >= 0, message))


def _accelerator_quantity_error(resource: str, q: Any) -> str | None:
    """Rules of the accelerator families that do not share devices (Ray 2.60 wording)."""
    fractional = isinstance(q, float) and not q.is_integer()
    if resource in ("neuron_cores", "HPU", "RBLN") and fractional:
        return (
            f"{resource} resource quantity must be whole numbers. "
            f"The specified quantity {q} is invalid."
        )
    if resource == "FURIOSA" and fractional:
        return (
            "FURIOSA resource quantity must be a whole number. Furiosa NPUs do not support "
            f"fractional resource sharing. The specified quantity {q} is invalid."
        )
    if resource == "MBLT" and math.isfinite(float(q)) and not float(q).is_integer():
        return (
            "MBLT resource quantity must be a whole number. Mobilint NPUs do not support "
            f"fractional resource sharing. The specified quantity {q} is invalid."
        )
    if resource == "TTNPU" and q > 0 and q % 1 != 0:
        return f"TTNPU resource quantity ({q}) must be an integer."
    if resource == "TPU" and q not in _TPU_CHIP_OPTIONS:
        return (
            f"The number of requested 'TPU' was set to {q} which is not a supported chip "
            f"configuration. Supported configs: {_TPU_CHIP_OPTIONS}"
        )
    return None


def _quantity_error(name: str, q: Any) -> str | None:
    if q < 0:
        return f"The quantity of resource {name} cannot be negative"
    if isinstance(q, float) and q != 0.0 and int(q * _RESOURCE_UNIT_SCALING) == 0:
        return (
            f"The precision of the fractional quantity of resource {name} cannot go beyond 0.0001"
        )
    return _accelerator_quantity_error("GPU" if name == "num_gpus" else name, q)


def _quantity(name: str) -> _Rule:
    return _Rule((float, int, _NoneType), lambda v: None if v is None else _quantity_error(name, v))


def _resources_error(resources: dict | None) -> str | None:
    if resources is None:
        return None
    if "CPU" in resources or "GPU" in resources:
        return (
            "Use the 'num_cpus' and 'num_gpus' keyword instead of 'CPU' and 'GPU' "
            "in 'resources' keyword"
        )
    for name, quantity in resources.items():
        message = _quantity_error(name, quantity)
        if message:
            return message
    return None


def _check_accelerator_conflict(options: dict) -> None:
    """GPUs, AWS Neuron cores and TPUs cannot be asked for in one request (the GPU-support
    document: a task or actor may not specify both ``num_gpus`` and ``neuron_cores``).
    Ray 2.60 dropped this check; miniray keeps the documented rule, with the wording Ray
    used for it."""
    resources = options.get("resources") or {}
    accelerator_type = options.get("accelerator_type") or ""
    requested = []
    if (options.get("num_gpus") or 0) > 0:
        requested.append("GPU")
    if (resources.get("neuron_cores") or 0) > 0 or accelerator_type == "aws-neuron-core":
        requested.append("neuron_cores")
    if (resources.get("TPU") or 0) > 0 or accelerator_type.startswith("TPU-V"):
        requested.append("TPU")
    if len(requested) > 1:
        raise ValueError(
            "Only one of 'num_gpus', 'neuron_cores/accelerator_type:aws-neuron-core' and "
            f"'TPU/accelerator_type:TPU-V*' can be set. Detected {len(requested)} options "
            f"were configured: {','.join(requested)}."
        )


def _fallback_strategy_error(strategies: list | None) -> str | None:
    for strategy in strategies or ():
        if not isinstance(strategy, dict):
            return "Each element in fallback_strategy must be a dictionary."
        if not strategy:
            return "Empty dictionary found in `fallback_strategy`."
        for option in strategy:
            if option != "label_selector":
                return (
                    f"Unsupported option found: '{option}'. "
                    "Only ['label_selector'] is currently supported."
                )
        selector = strategy.get("label_selector")
        if selector and not isinstance(selector, dict):
            return 'The value of "label_selector" must be a dictionary.'
    return None


def _runtime_env_error(value: Any) -> str | None:
    """Ray's checks of a task's or actor's ``runtime_env`` (it raises TypeError or ValueError
    itself, with Ray's wording); fields it accepts but that change nothing are named once."""
    env = runtime_envs.parse_for_task(value)
    if env:
        runtime_envs.note_ignored(env, level="task")
    return None


def _num_returns_error(value: Any) -> str | None:
    if isinstance(value, str) and value not in ("dynamic", "streaming"):
        # Ray 2.60 raises TypeError here too, with a bare "'>=' not supported between
        # instances of 'str' and 'int'"; this one names the keyword and its values.
        raise TypeError(
            f"The keyword 'num_returns' only accepts None, a non-negative integer, "
            f"'streaming' (for generators) or 'dynamic', got the string {value!r}."
        )
    if value is None or value in ("dynamic", "streaming") or value >= 0:
        return None
    return (
        "Default None. When None is passed, The default value is 1 for a task and actor "
        "task, and 'streaming' for generator tasks and generator actor tasks. The keyword "
        "'num_returns' only accepts None, a non-negative integer, 'streaming' (for "
        "generators), or 'dynamic'. 'dynamic' flag will be deprecated in the future, and "
        "it is recommended to use 'streaming' instead."
    )


def wire_retry_exceptions(value: Any):
    """``retry_exceptions`` (a task's or an actor method's) as a submission carries it: False,
    True, or the pickled tuple of exception classes the worker tests the error against.

    >>> wire_retry_exceptions(None), wire_retry_exceptions(True), wire_retry_exceptions([])
    (False, True, False)
    """
    value = value or False
    if isinstance(value, (list, tuple)):
        return serialization.dumps(tuple(value))
    return value


def _retry_exceptions_error(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if all(inspect.isclass(x) and issubclass(x, Exception) for x in value):
        return None
    return "retry_exceptions must be either a boolean or a list of exceptions"


# --- The option tables. Their order is Ray's, since it shows in error messages. ----------------

_COMMON: dict[str, _Rule] = {
    "label_selector": _Rule((dict, _NoneType)),
    "fallback_strategy": _Rule((list, _NoneType), _fallback_strategy_error),
    "accelerator_type": _Rule((str, _NoneType)),
    "memory": _quantity("memory"),
    "name": _Rule((str, _NoneType)),
    "num_cpus": _quantity("num_cpus"),
    "num_gpus": _quantity("num_gpus"),
    "object_store_memory": _count("object_store_memory", minus_one_is_infinite=False),
    "placement_group": _Rule((_NoneType, str, _PG)),
    "placement_group_bundle_index": _Rule(int),
    "placement_group_capture_child_tasks": _Rule((bool, _NoneType)),
    "resources": _Rule((dict, _NoneType), _resources_error),
    "runtime_env": _Rule((dict, _NoneType), lambda v: _runtime_env_error(v)),
    "scheduling_strategy": _Rule((_NoneType, str, *_STRATEGIES)),
    "enable_task_events": _Rule(bool),
    "_labels": _Rule((dict, _NoneType)),
}

_TASK_ONLY: dict[str, _Rule] = {
    "max_calls": _count("max_calls", minus_one_is_infinite=False),
    "max_retries": _count("max_retries", minus_one_is_infinite=True),
    "num_cpus": _quantity("num_cpus"),
    "num_returns": _Rule((int, str, _NoneType), _num_returns_error),
    "object_store_memory": _Rule(
        (int, _NoneType),
        _unless(lambda v: v is None, "Setting 'object_store_memory' is not implemented for tasks"),
    ),
    "retry_exceptions": _Rule((bool, list, tuple), _retry_exceptions_error),
    "_generator_backpressure_num_objects": _Rule(
        (int, _NoneType),
        _unless(
            lambda v: v != 0,
            "_generator_backpressure_num_objects=0 is not allowed. Use a value > 0. If the value "
            "is equal to 1, the behavior is identical to Python generator (generator 1 object "
            "whenever `next` is called). Use -1 to disable this feature. ",
        ),
    ),
    "_num_objects_per_yield": _Rule(
        (int, _NoneType),
        _unless(
            lambda v: v is None or v > 0,
            "_num_objects_per_yield is a private streaming generator option that must be set "
            "to a positive integer.",
        ),
    ),
}

_ACTOR_ONLY: dict[str, _Rule] = {
    "concurrency_groups": _Rule((list, dict, _NoneType)),
    "enable_tensor_transport": _Rule((bool, _NoneType)),
    "lifetime": _Rule(
        (str, _NoneType),
        _unless(
            lambda v: v in (None, "detached", "non_detached"),
            "actor `lifetime` argument must be one of 'detached', 'non_detached' and 'None'.",
        ),
    ),
    "max_concurrency": _count("max_concurrency", minus_one_is_infinite=False),
    "max_restarts": _count("max_restarts", minus_one_is_infinite=True),
    "max_task_retries": _count("max_task_retries", minus_one_is_infinite=True),
    "max_pending_calls": _count("max_pending_calls", minus_one_is_infinite=True),
    "namespace": _Rule((str, _NoneType)),
    "get_if_exists": _Rule(bool),
    "allow_out_of_order_execution": _Rule((bool, _NoneType)),
    "_actor_generator_backpressure_num_objects": _Rule(
        (int, _NoneType),
        _unless(
            lambda v: v is None or v > 0 or v == -1,
            "_actor_generator_backpressure_num_objects must be > 0 to cap the actor's total "
            "unconsumed generator objects, or -1 to disable. Got {}.",
        ),
    ),
}

# A later table replaces an earlier rule but keeps the key where it first appeared.
_TASK_RULES = {**_COMMON, **_TASK_ONLY}
_ACTOR_RULES = {**_COMMON, **_ACTOR_ONLY}
_ALL_NAMES = list({**_TASK_ONLY, **_ACTOR_ONLY, **_COMMON})

TASK_OPTIONS: frozenset[str] = frozenset(_TASK_RULES)
ACTOR_OPTIONS: frozenset[str] = frozenset(_ACTOR_RULES)

_METHOD_NAMES = [
    "num_returns",
    "concurrency_group",
    "max_task_retries",
    "retry_exceptions",
    "_generator_backpressure_num_objects",
    "_num_objects_per_yield",
    "enable_task_events",
    "tensor_transport",
]
METHOD_OPTIONS: frozenset[str] = frozenset(_METHOD_NAMES)

_REMOTE_ARGS_ERROR = (
    "The @ray.remote decorator must be applied either with no arguments and no "
    "parentheses, for example '@ray.remote', or it must be applied using some of "
    f"the arguments in the list {_ALL_NAMES}, for example "
    "'@ray.remote(num_returns=2, resources={\"CustomResource\": 1})'."
)

# Options fixed when the function or class is defined; `.options()` may not set them.
_DECORATOR_ONLY = ("max_calls", "concurrency_groups")


# --- Decoration and .options() time ------------------------------------------------------------


def check_remote_args(args: tuple, kwargs: dict) -> None:
    """Check the shape of a ``@remote`` call, and the target when there is one.

    ``remote(f)`` / ``remote(Cls)`` check the target; ``remote(**options)`` is accepted (call
    this again with ``((target,), {})`` when the decorator it returns is applied).

    Raises:
        AssertionError: any other shape (``remote()``, ``remote(f, num_cpus=1)``, ``remote(1)``).
        TypeError: the target is neither a function nor a class.
        ValueError: the target is an ``async def`` function (async actor methods are fine).

    Example:
        >>> check_remote_args((), {"num_cpus": 2})
    """
    if len(args) == 1 and not kwargs and callable(args[0]):
        target = args[0]
        if inspect.isclass(target):
            return
        if not inspect.isfunction(target):
            raise TypeError(
                "The @ray.remote decorator must be applied to either a function or a class."
            )
        if inspect.iscoroutinefunction(target):
            raise ValueError(
                "'async def' should not be used for remote tasks. You can wrap the async "
                "function with `asyncio.run(f())`. See more at:"
                "https://docs.ray.io/en/latest/ray-core/actors/async_api.html "
            )
        return
    if args or not kwargs:
        # Ray raises AssertionError with the general text only; say what was given first.
        given = (
            f"@ray.remote got {type(args[0]).__name__} {args[0]!r}, which is neither a function "
            "nor a class. " if len(args) == 1 and not kwargs else ""
        )
        raise AssertionError(given + _REMOTE_ARGS_ERROR)


def _check_num_returns(num_returns: Any, is_generator: bool | None) -> None:
    """Ray's ``validate_num_returns``: the generator rule applies only when it is known."""
    if isinstance(num_returns, int) and num_returns < 0:
        raise ValueError(f"num_returns must be >= 0, but got {num_returns}.")
    if is_generator is None or num_returns not in ("streaming", "dynamic"):
        return
    if not is_generator:
        raise ValueError(
            f"num_returns='{num_returns}' can only be used with generator functions "
            "(functions that use 'yield'). The decorated function is not a generator function."
        )


def _check_placement_group(options: dict) -> None:
    if options.get("placement_group", "default") not in ("default", None) and (
        options.get("scheduling_strategy") is not None
    ):
        raise ValueError(
            "Placement groups should be specified via the scheduling_strategy option. "
            "The placement_group option is deprecated."
        )


def validate_task_options(
    options: dict, *, in_options: bool, is_generator: bool | None = None
) -> None:
    """Check a remote function's options, as at ``@remote(...)`` or ``.options(...)``.

    Args:
        options: The options; for ``.options()``, the result of ``update_options``.
        in_options: True at ``.options()``: ``max_calls`` is then refused.
        is_generator: Whether the function yields. When given, ``num_returns`` of
            ``"streaming"``/``"dynamic"`` on a plain function is refused. (Ray passes it at
            ``.options()`` only when that call sets ``num_returns``.)

    Raises:
        ValueError: unknown option or bad value. TypeError: wrong type.

    Example:
        >>> validate_task_options({"num_gpus": 0.5}, in_options=False)
    """
    for key, value in options.items():
        rule = _TASK_RULES.get(key)
        if rule is None:
            raise ValueError(
                f"Invalid option keyword {key} for remote functions. "
                f"Valid ones are {list(_TASK_RULES)}."
            )
        _apply(rule, key, value)
    if in_options and "max_calls" in options:
        raise ValueError("Setting 'max_calls' is not supported in '.options()'.")
    _check_placement_group(options)
    _check_num_returns(options.get("num_returns"), is_generator)
    _check_accelerator_conflict(options)


def validate_actor_options(options: dict, *, in_options: bool) -> None:
    """Check an actor class's options, as at ``@remote(...)`` or ``.options(...)``.

    Emits a DeprecationWarning when ``object_store_memory`` is given, as Ray does.

    Raises:
        ValueError: unknown option, bad value, ``concurrency_groups`` in ``.options()``,
            ``get_if_exists`` without ``name``. TypeError: wrong type.

    Example:
        >>> validate_actor_options({"max_restarts": -1}, in_options=True)
    """
    for key, value in options.items():
        rule = _ACTOR_RULES.get(key)
        if rule is None:
            raise ValueError(
                f"Invalid option keyword {key} for actors. Valid ones are {list(_ACTOR_RULES)}."
            )
        _apply(rule, key, value)
    if in_options and "concurrency_groups" in options:
        raise ValueError("Setting 'concurrency_groups' is not supported in '.options()'.")
    if options.get("get_if_exists") and not options.get("name"):
        raise ValueError("The actor name must be specified to use `get_if_exists`.")
    if "object_store_memory" in options:
        warnings.warn(
            "Setting 'object_store_memory' for actors is deprecated: it reserves no object "
            "store memory. miniray ignores it.",
            DeprecationWarning,
            stacklevel=3,
        )
    _check_placement_group(options)
    _check_accelerator_conflict(options)


def update_options(base: dict, new: dict) -> dict:
    """Merge ``.options(**new)`` over the decorator's options into a new dict.

    A key in ``new`` wins even when its value is None, so ``resources=None`` clears the
    decorator's resources. The decorator's ``max_calls`` and ``concurrency_groups`` are left
    out: they took effect at definition time and ``.options()`` may not set them (get
    ``max_calls`` from ``default_max_calls(decorator_options)``).

    Example:
        >>> update_options({"num_cpus": 2, "resources": {"a": 1}}, {"resources": None})
        {'num_cpus': 2, 'resources': None}
    """
    merged = {k: v for k, v in base.items() if k not in _DECORATOR_ONLY}
    merged.update(new)
    return merged


def validate_method_options(kwargs: dict, *, is_generator: bool | None = None) -> None:
    """Check the keyword arguments of ``@method(...)``.

    Raises:
        AssertionError: an unknown keyword (Ray raises AssertionError here).
        TypeError / ValueError: a bad ``num_returns`` or ``_num_objects_per_yield``.

    Example:
        >>> validate_method_options({"num_returns": 2})
    """
    for key in kwargs:
        if key not in METHOD_OPTIONS:
            raise AssertionError(
                f"Unexpected keyword argument to @ray.method: '{key}'. "
                f"The supported keyword arguments are {_METHOD_NAMES}"
            )
    if "num_returns" in kwargs:
        _check_method_num_returns(kwargs["num_returns"], is_generator)
    if "_num_objects_per_yield" in kwargs:
        key = "_num_objects_per_yield"
        _apply(_TASK_ONLY[key], key, kwargs[key])


def _check_method_num_returns(num_returns: Any, is_generator: bool | None) -> None:
    _apply(_Rule((int, str, _NoneType)), "num_returns", num_returns)
    if isinstance(num_returns, str):
        _num_returns_error(num_returns)  # "foo" raises TypeError, as on a task
    _check_num_returns(num_returns, is_generator)


# The options of one actor call (``handle.method.options(...)``) that have a type to check.
_METHOD_CALL_RULES: dict[str, _Rule] = {
    "name": _Rule((str, _NoneType)),
    "max_task_retries": _count("max_task_retries", minus_one_is_infinite=True),
    "retry_exceptions": _TASK_ONLY["retry_exceptions"],
    "enable_task_events": _Rule(bool),
    "concurrency_group": _Rule((str, _NoneType)),
}


def validate_method_call_options(options: dict, *, is_generator: bool) -> None:
    """Check ``ActorMethod.options(...)`` with the rules of task options: ``num_returns``
    as at ``@method`` (TypeError for a float or an unknown string, ValueError for a negative
    count or ``"streaming"`` on a method that does not yield), ``max_task_retries``,
    ``name``, ``retry_exceptions`` as on a task.

    Ray 2.60 checks only ``num_returns`` there, and lets ``num_returns=1.5`` or
    ``max_task_retries=-2`` through to fail later or never.

    Example:
        >>> validate_method_call_options({"num_returns": 2}, is_generator=False)
    """
    if "num_returns" in options:
        _check_method_num_returns(options["num_returns"], is_generator)
    for key, rule in _METHOD_CALL_RULES.items():
        if key in options:
            _apply(rule, key, options[key])


# --- .remote() time ----------------------------------------------------------------------------


def _check_resource_keys(resources: dict) -> None:
    """Keys refused only when a request is built (Ray's resources_from_ray_options)."""
    if "CPU" in resources or "GPU" in resources:
        raise ValueError("The resources dictionary must not contain the key 'CPU' or 'GPU'")
    if "memory" in resources or "object_store_memory" in resources:
        raise ValueError(
            "The resources dictionary must not contain the key 'memory' or 'object_store_memory'"
        )
    if "bundle" in resources:
        raise ValueError(
            f"The resource should not include `bundle` which is reserved for Ray. "
            f"resources: {resources}"
        )


def _check_scheduling_strategy(strategy: Any) -> None:
    if isinstance(strategy, str) and strategy not in ("DEFAULT", "SPREAD"):
        raise ValueError(
            f"Invalid scheduling_strategy value {strategy}. "
            'Valid values are ["DEFAULT" | "SPREAD" | PlacementGroupSchedulingStrategy'
            " | NodeAffinitySchedulingStrategy]"
        )


def _finish(request: dict) -> dict[str, float]:
    """Drop zero quantities and apply Ray's whole-instance rule above 1."""
    out: dict[str, float] = {}
    for key, value in request.items():
        if value <= 0:
            continue
        if (
            isinstance(value, float)
            and value >= 1
            and not value.is_integer()
            and key in _UNIT_INSTANCE_RESOURCES
        ):
            # Two arguments on purpose: Ray's message is the str() of this tuple.
            raise ValueError(
                f"{key} resource quantities >1 must",
                f" be whole numbers. The specified quantity {value} is invalid.",
            )
        out[key] = value if key == "memory" else float(value)
    return out


def _base_request(options: dict) -> dict:
    """Every resource the options name, zeros included (they matter to actor defaults)."""
    request = dict(options.get("resources") or {})
    _check_resource_keys(request)
    if options.get("num_cpus") is not None:
        request["CPU"] = options["num_cpus"]
    if options.get("num_gpus") is not None:
        request["GPU"] = options["num_gpus"]
    if options.get("memory") is not None:
        request["memory"] = int(options["memory"])
    if options.get("accelerator_type") is not None:
        request[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    return request


def task_resource_request(options: dict) -> dict[str, float]:
    """The resources one run of a task holds, after the checks Ray makes at ``.remote()``.

    ``num_cpus`` absent means 1 CPU. As in Ray, ``num_cpus`` present but None (or 0) means
    no CPU. Zero quantities are left out, ``memory`` is truncated to an int, and
    ``accelerator_type="T"`` adds ``{"accelerator_type:T": 0.001}``.

    Raises:
        ValueError: fractional unit-instance quantity above 1 (e.g. ``num_gpus=1.5``);
            ``memory``/``object_store_memory``/``bundle`` in ``resources``; unknown
            scheduling-strategy string.

    Example:
        >>> task_resource_request({"num_gpus": 0.5})
        {'CPU': 1.0, 'GPU': 0.5}
    """
    options = options if "num_cpus" in options else {**options, "num_cpus": 1}
    request = _finish(_base_request(options))
    _check_scheduling_strategy(options.get("scheduling_strategy"))
    return request


def actor_resource_requests(options: dict) -> tuple[dict[str, float], dict[str, float]]:
    """``(placement_request, held_request)`` for creating an actor (surface doc §2.3).

    With no resource option at all (``memory`` alone does not count), the actor needs 1 CPU
    to be placed and holds none afterwards. With any (``num_cpus``, ``num_gpus`` even 0,
    ``resources`` with any key, ``accelerator_type``) it holds what it asked for plus 1 CPU
    unless ``num_cpus`` is given, and is placed with the same.

    Raises:
        ValueError: as ``task_resource_request``.

    Example:
        >>> actor_resource_requests({})
        ({'CPU': 1.0}, {})
        >>> actor_resource_requests({"num_gpus": 1})
        ({'GPU': 1.0, 'CPU': 1.0}, {'GPU': 1.0, 'CPU': 1.0})
    """
    base = _base_request(options)
    if set(base) - {"memory"}:
        held = {**base, "CPU": base.get("CPU", 1)}
        placement = held
    else:
        held = base
        placement = {**base, "CPU": 1}
    placement, held = _finish(placement), _finish(held)
    _check_scheduling_strategy(options.get("scheduling_strategy"))
    return placement, held


def actor_creation_checks(options: dict, *, is_async: bool) -> None:
    """The checks Ray makes when an actor is created (``Cls.remote()`` / ``.options().remote()``).

    Args:
        options: The actor's merged options.
        is_async: Whether any method of the class is ``async def``.

    Raises:
        TypeError / ValueError: bad ``name`` or ``namespace`` (empty strings are refused),
            bad ``lifetime``, ``allow_out_of_order_execution=False`` on an async actor or
            one with ``max_concurrency > 1``.

    Example:
        >>> actor_creation_checks({"name": "counter"}, is_async=False)
    """
    name = options.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"name must be None or a string, got: '{type(name)}'.")
        if name == "":
            raise ValueError("Actor name cannot be an empty string.")
    namespace = options.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str):
            raise TypeError("namespace must be None or a string.")
        if namespace == "":
            raise ValueError('"" is not a valid namespace. Pass None to not specify a namespace.')
    _apply(_ACTOR_ONLY["lifetime"], "lifetime", options.get("lifetime"))

    max_concurrency = options.get("max_concurrency")
    if max_concurrency is None:
        max_concurrency = 1000 if is_async else 1
    in_order = options.get("allow_out_of_order_execution") is False
    if in_order and is_async:
        raise ValueError(
            "If you're using async actors, Ray can't execute actor tasks in order. "
            "Set `allow_out_of_order_execution=True` to allow out-of-order execution."
        )
    if in_order and max_concurrency > 1:
        raise ValueError(
            "If you're using multi-threaded actors, Ray can't execute actor tasks in order. "
            "Set `allow_out_of_order_execution=True` to allow out-of-order execution."
        )


# --- Defaults ----------------------------------------------------------------------------------


def default_max_calls(decorator_options: dict) -> int:
    """How many tasks a worker runs for this function before exiting (0 = no limit).

    Decided from the decorator's options only (surface doc §6.5): a function decorated with
    ``num_gpus > 0`` and no ``max_calls`` gets 1, so each GPU task gets a fresh process and
    its GPU memory is freed. As in Ray, a ``runtime_env`` with ``nsight`` or
    ``rocprof-sys`` also forces 1 (profilers write their report when the process exits).

    Example:
        >>> default_max_calls({"num_gpus": 1}), default_max_calls({"num_gpus": 1, "max_calls": 0})
        (1, 0)
    """
    num_gpus = decorator_options.get("num_gpus") or 0
    max_calls = decorator_options.get("max_calls")
    runtime_env = decorator_options.get("runtime_env") or {}
    if (num_gpus > 0 and max_calls is None) or any(
        profiler in runtime_env for profiler in ("nsight", "rocprof-sys")
    ):
        return 1
    return max_calls or 0


def default_max_retries() -> int:
    """A task's ``max_retries`` when none is given: 3, or ``$RAY_TASK_MAX_RETRIES``.

    Read from ``os.environ`` on every call, as Ray reads it at each ``.remote()``. It is
    read here rather than in ``_private/core/config.py`` so that this module depends on nothing.

    Example:
        >>> default_max_retries()  # doctest: +SKIP
        3
    """
    value = os.environ.get("RAY_TASK_MAX_RETRIES")
    if value is None:
        return 3
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"RAY_TASK_MAX_RETRIES must be an integer, got {value!r}.") from None


def hard_affinity(options: dict) -> str | None:
    """The node id of a ``NodeAffinitySchedulingStrategy(node_id, soft=False)`` in the
    options, else None.

    >>> hard_affinity({}), hard_affinity({"scheduling_strategy": "SPREAD"})
    (None, None)
    """
    strategy = options.get("scheduling_strategy")
    if (strategy is None or type(strategy).__name__ != "NodeAffinitySchedulingStrategy"
            or getattr(strategy, "soft", False)):
        return None
    node_id = getattr(strategy, "node_id", None)
    return node_id if isinstance(node_id, str) and node_id else None


def node_affinity(options: dict) -> tuple[str, bool, bool] | None:
    """``(node_id, soft, on_unavailable)`` of a ``NodeAffinitySchedulingStrategy`` in the
    options, else None (what a task's spec carries: ``owner/remote_nodes.py`` places it).
    ``on_unavailable``: its ``_spill_on_unavailable`` when soft, ``_fail_on_unavailable``
    when hard (what to do when the node has no room now, instead of waiting there).

    >>> node_affinity({}), node_affinity({"scheduling_strategy": "DEFAULT"})
    (None, None)
    """
    strategy = options.get("scheduling_strategy")
    if strategy is None or type(strategy).__name__ != "NodeAffinitySchedulingStrategy":
        return None
    node_id = getattr(strategy, "node_id", None)
    if not isinstance(node_id, str) or not node_id:
        return None
    soft = bool(getattr(strategy, "soft", False))
    flag = "_spill_on_unavailable" if soft else "_fail_on_unavailable"
    return node_id, soft, bool(getattr(strategy, flag, False))


def task_strategy(options: dict) -> tuple[str, bool, bool] | str | None:
    """What a task's spec carries for ``owner/remote_nodes.py`` to place it by: the
    ``node_affinity`` tuple, ``"SPREAD"`` for ``scheduling_strategy="SPREAD"``, or None
    (``"DEFAULT"``, none, or a placement group's: the local queue's, as before).

    >>> task_strategy({"scheduling_strategy": "SPREAD"}), task_strategy({})
    ('SPREAD', None)
    """
    if options.get("scheduling_strategy") == "SPREAD":
        return "SPREAD"
    return node_affinity(options)


def placement_option(options: dict) -> Any:
    """The placement group the options name, as Ray reads them at ``.remote()``:
    ``(group, bundle_index, capture_child_tasks)``, where group is ``"default"`` when they
    name none (the caller's group may then capture the call) and capture is None when they
    leave it to the caller (``placement.resolve_option`` decides both); None when they opt
    out (``placement_group=None``, or a scheduling strategy other than a group's).

    >>> placement_option({}), placement_option({"scheduling_strategy": "SPREAD"})
    (('default', -1, None), None)
    """
    strategy = options.get("scheduling_strategy")
    if strategy is not None and type(strategy).__name__ == "PlacementGroupSchedulingStrategy":
        group = strategy.placement_group
        index = strategy.placement_group_bundle_index
        capture = strategy.placement_group_capture_child_tasks
    elif strategy is not None:
        return None  # "DEFAULT", "SPREAD", node affinity...: no group, none captured
    else:
        group = options.get("placement_group", "default")
        index = options.get("placement_group_bundle_index", -1)
        capture = options.get("placement_group_capture_child_tasks")
    if group is None or (isinstance(group, str) and group != "default"):
        return None
    return group, -1 if index is None else index, capture
