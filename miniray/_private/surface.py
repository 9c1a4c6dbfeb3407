"""``remote``, ``method`` and ``get_actor``: the decorators and lookups of the public API.

Owns: dispatching ``@remote`` to RemoteFunction or ActorClass after Ray's shape checks, and
``@method`` option recording. Does not own: the options' rules (``options.py``).
Called by: ``miniray/__init__.py``.
"""

from __future__ import annotations

import inspect

from miniray._private import options as _options


def _make(target, opts: dict):
    _options.check_remote_args((target,), {})
    if inspect.isclass(target):
        from miniray.actor import make_actor_class

        return make_actor_class(target, opts)
    from miniray.remote_function import RemoteFunction

    return RemoteFunction(target, opts)


def remote(*args, **kwargs):
    """Make a function a remote function, or a class an actor class.

    Example:
        >>> @miniray.remote(num_cpus=2)
        ... def f():
        ...     return 1
    """
    _options.check_remote_args(args, kwargs)
    if len(args) == 1 and not kwargs:
        return _make(args[0], {})
    target_is_class = None  # decided when the decorator is applied

    def decorator(target):
        nonlocal target_is_class
        target_is_class = inspect.isclass(target)
        if target_is_class:
            _options.validate_actor_options(kwargs, in_options=False)
        return _make(target, dict(kwargs))

    return decorator


def method(*args, **kwargs):
    """Set per-method options of an actor method (``num_returns``, ...)."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    if args:
        raise AssertionError(
            "The @ray.method decorator must be applied using no arguments or at least one of "
            f"the arguments in the list {sorted(_options.METHOD_OPTIONS)}, for example "
            "'@ray.method(num_returns=2)'."
        )
    _options.validate_method_options(kwargs)

    def decorator(function):
        for key, value in kwargs.items():
            setattr(function, f"__ray_{key}__", value)
        function.__ray_method_options__ = dict(kwargs)
        return function

    return decorator


def get_actor(name: str, namespace: str | None = None):
    from miniray.actor import get_actor as _get_actor

    return _get_actor(name, namespace)
