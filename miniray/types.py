"""``miniray.types``: ``ObjectRef[T]`` for type hints.

Mirrors ``ray.types`` (Ray 2.60): ``ObjectRef`` here is a generic placeholder class for
annotations (``def f() -> ObjectRef[int]``), not the class of the refs ``put`` and
``.remote()`` return (``miniray.ObjectRef``, which is generic itself); as in Ray,
``isinstance(ref, miniray.types.ObjectRef)`` is False.

Example:
    >>> from miniray.types import ObjectRef
    >>> def total(refs: list[ObjectRef[int]]) -> int:
    ...     return sum(ray.get(refs))
    >>> total([ray.put(1), ray.put(2)])
    3
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["ObjectRef", "T"]

T = TypeVar("T")


class ObjectRef(Generic[T]):
    """A placeholder for annotations only: ``ObjectRef[int]`` is a ref to an int."""
