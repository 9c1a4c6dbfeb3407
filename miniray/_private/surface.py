"""``remote``, ``method``, ``get_actor`` and ``kill``: the decorators and actor calls of the public
API.

Owns: dispatching ``@remote`` to RemoteFunction or ActorClass after Ray's shape checks, and
``kill``'s check that it is given an actor handle. Does not own: the options' rules
(``options.py``), ``@method`` (``miniray/actor.py``, where Ray defines it).
Called by: ``miniray/__init__.py``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, overload

from miniray._private import runtime
from miniray._private.core import options as _options
from miniray._private.core.type_vars import P, R, T
from miniray.actor import ActorClass, ActorHandle, make_actor_class
from miniray.actor import get_actor as _get_actor
from miniray.remote_function import RemoteFunction

if TYPE_CHECKING:
    from typing import Protocol

    class _RemoteDecorator(Protocol):
        """What ``remote(num_cpus=...)`` returns, for type checkers."""

        @overload
        def __call__(self, target: type[T], /) -> ActorClass[T]: ...

        @overload
        def __call__(self, target: Callable[P, R], /) -> RemoteFunction[P, R]: ...


def _make(target, opts: dict):
    # The target's checks (``check_remote_args``) are RemoteFunction's first step; a class
    # passes them all.
    if inspect.isclass(target):
        return make_actor_class(target, opts)
    return RemoteFunction(target, opts)


# A class is also a callable, so the class overload comes first (and overlaps the next).
@overload
def remote(target: type[T], /) -> ActorClass[T]: ...  # type: ignore[overload-overlap]


@overload
def remote(target: Callable[P, R], /) -> RemoteFunction[P, R]: ...


@overload
def remote(**options: Any) -> _RemoteDecorator: ...


def remote(*args, **kwargs):
    """Makes a function a remote function, or a class an actor class.

    Mirrors ``ray.remote``: used bare (``@ray.remote``) or with options
    (``@ray.remote(num_cpus=2, num_gpus=1, max_retries=3, ...)``; every option of Ray 2.60,
    checked as Ray checks them). ``f.remote(*args)`` then runs ``f`` in a worker process and
    returns an ObjectRef at once; ``Cls.remote(*args)`` starts an actor and returns its handle.

    Example:
        >>> @ray.remote(num_cpus=2)
        ... def add(a, b):
        ...     return a + b
        >>> ray.get(add.remote(1, 2))
        3
        >>> @ray.remote
        ... class Counter:
        ...     def __init__(self):
        ...         self.n = 0
        ...     def incr(self):
        ...         self.n += 1
        ...         return self.n
        >>> counter = Counter.remote()
        >>> ray.get([counter.incr.remote() for _ in range(3)])
        [1, 2, 3]
    """
    if len(args) == 1 and not kwargs:  # checked by what _make makes (a class passes)
        return _make(args[0], {})
    _options.check_remote_args(args, kwargs)
    target_is_class = None  # decided when the decorator is applied

    def decorator(target):
        nonlocal target_is_class
        target_is_class = inspect.isclass(target)
        if target_is_class:
            _options.validate_actor_options(kwargs, in_options=False)
        return _make(target, dict(kwargs))

    return decorator


def get_actor(name: str, namespace: str | None = None):
    """Returns a handle to the named actor ``name``.

    Mirrors ``ray.get_actor``. Drivers of one node share named actors.

    Args:
        name: The name given with ``.options(name=...)``.
        namespace: The namespace to look in; defaults to the current one.

    Raises:
        ValueError: No actor of that name is alive in that namespace.

    Example:
        >>> @ray.remote
        ... class Registry:
        ...     def size(self):
        ...         return 0
        >>> registry = Registry.options(name="registry").remote()
        >>> ray.get(ray.get_actor("registry").size.remote())
        0
        >>> ray.kill(registry)
    """
    return _get_actor(name, namespace)


def kill(actor, *, no_restart: bool = True) -> None:
    """Kills an actor at once; its pending and later calls raise ActorDiedError.

    Mirrors ``ray.kill``. Queued calls are not run and ``atexit`` handlers of the actor do not
    run (use ``actor.__ray_terminate__.remote()`` to end it after its queued calls).

    Args:
        actor: An actor handle.
        no_restart: ``False`` lets an actor with ``max_restarts`` restart after the kill.

    Example:
        >>> @ray.remote
        ... class Counter:
        ...     def ping(self):
        ...         return "pong"
        >>> counter = Counter.remote()
        >>> ray.get(counter.ping.remote())
        'pong'
        >>> ray.kill(counter)
    """
    if not isinstance(actor, ActorHandle):
        raise ValueError(
            "ray.kill() only supported for actors. For tasks, try ray.cancel(). "
            f"Got: {type(actor)}."
        )
    runtime.auto_init()
    actor._kill(no_restart=no_restart)
