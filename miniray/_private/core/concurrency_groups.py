"""Actor concurrency groups: checking an actor class's groups and choosing a call's group.

Mirrors Ray 2.60's ``@ray.remote(concurrency_groups={...})``, ``@ray.method(
concurrency_group=...)`` and ``.options(concurrency_group=...)`` on a method call. Each group
runs its calls with its own limit (a thread pool of its size in a sync actor, an event loop
thread with a semaphore of its size in an async one); calls of no group run in the default
group, whose size is the actor's ``max_concurrency``.

Owns the pure decisions: whether a class's groups are well formed, whether every method names
a defined group, which group a call runs in, and the executors an actor host starts. Does not
own running the calls (``worker/actor_host.py``) or the handle's method table
(``miniray/actor.py``, which calls these at creation and at ``.options()``).

Differs from Ray 2.60, which lets these through to fail later: a group size that is not an
int raises TypeError and one below 1 ValueError at ``.remote()`` (Ray: TypeError,
OverflowError, or an actor that crashes for 0); a call naming a group its class does not
define raises ValueError at ``.options()`` (Ray's actor process aborts on a failed check).
"""

from __future__ import annotations

from typing import Any

DEFAULT = None  # the default group's key: calls of no group, sized by max_concurrency


def check_groups(value: Any, class_name: str) -> dict[str, int]:
    """The groups of an actor class, as ``@remote(concurrency_groups=...)`` gave them.

    Args:
        value: The option's value: None, a dict of name to size (an empty list is taken
            as none, as Ray takes it).
        class_name: For the messages.

    Returns:
        Group name -> its maximum concurrency (a new dict; empty for none).

    Raises:
        TypeError: not a dict, a name that is not a str, a size that is not an int.
        ValueError: a size below 1.

    Example:
        >>> check_groups({"io": 2}, "Reader")
        {'io': 2}
    """
    if value is None or (isinstance(value, list) and not value):
        return {}
    if not isinstance(value, dict):
        raise TypeError(
            f"concurrency_groups of actor class {class_name} must be a dict mapping each "
            f"group's name to its maximum concurrency, for example {{'io': 2}}; got "
            f"{type(value).__name__} {value!r}.")
    groups = {}
    for name, size in value.items():
        if not isinstance(name, str):
            raise TypeError(
                f"concurrency_groups of actor class {class_name}: a group's name must be a "
                f"str, got {type(name).__name__} {name!r}.")
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(
                f"concurrency_groups of actor class {class_name}: the maximum concurrency of "
                f"group {name!r} must be an int, got {type(size).__name__} {size!r}.")
        if size < 1:
            raise ValueError(
                f"concurrency_groups of actor class {class_name}: the maximum concurrency of "
                f"group {name!r} must be at least 1, got {size}.")
        groups[name] = size
    return groups


def check_method_groups(method_groups: dict[str, Any], groups: dict[str, int],
                        class_name: str) -> None:
    """Every ``@method(concurrency_group=...)`` of the class names one of its groups.

    Raises:
        AssertionError: a method names a group the class does not define (Ray 2.60 asserts
            this when the actor is created; this message names the method and the groups).

    Example:
        >>> check_method_groups({"read": "io", "compute": None}, {"io": 2}, "Reader")
    """
    for method, group in method_groups.items():
        if group is not None and group not in groups:
            raise AssertionError(
                f"{class_name}.{method} is in concurrency group {group!r}, which "
                f"{class_name} does not define (its groups: {sorted(groups)}). Define it in "
                "@ray.remote(concurrency_groups={...}) on the class.")


def call_group(method_group: str | None, override: str | None, groups: tuple,
               class_name: str, method: str) -> str | None:
    """The group one call runs in: the call's ``.options(concurrency_group=...)``, else the
    method's ``@method(concurrency_group=...)``, else the default group (None).

    An empty override is no override, as in Ray (its wire form of "unset" is empty).

    Raises:
        ValueError: the override names a group the class does not define.

    Example:
        >>> call_group("io", None, ("io", "cpu"), "Reader", "read")
        'io'
        >>> call_group("io", "cpu", ("io", "cpu"), "Reader", "read")
        'cpu'
        >>> call_group(None, None, (), "Reader", "read") is None
        True
    """
    if override:
        if override not in groups:
            raise ValueError(
                f"{class_name}.{method}.options(concurrency_group={override!r}): "
                f"{class_name} defines no such concurrency group (its groups: "
                f"{sorted(groups)}). Define it in @ray.remote(concurrency_groups={{...}}) "
                "on the class, or name one of its groups.")
        return override
    return method_group


def executor_sizes(groups: dict[str, int] | None, max_concurrency: int) -> dict:
    """The executors an actor host starts: group name -> size, the default group under
    ``DEFAULT`` (sized by ``max_concurrency``).

    Example:
        >>> executor_sizes({"io": 2}, 1)
        {None: 1, 'io': 2}
    """
    return {DEFAULT: max_concurrency, **(groups or {})}
