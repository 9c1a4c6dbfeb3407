"""Mirrors `ray.util.annotations` (Ray 2.60): API-stability decorators and the warning class.

Owns: ``PublicAPI``, ``DeveloperAPI`` and ``Deprecated`` (decorators that library code built on
Ray puts on its own functions and classes), ``AnnotationType``, and ``RayDeprecationWarning``,
the category miniray uses when a Ray name it still accepts is deprecated (for example
``ray.util.accelerators.NVIDIA_TESLA_A100``).
Called by: user code; modules that warn about deprecated names.

Each decorator works bare (``@PublicAPI``) or called (``@PublicAPI(stability="beta")``), returns
the object itself (a deprecated class keeps its identity), records ``_annotated`` (the name),
``_annotated_type`` and ``_annotated_api_group``, and appends to the docstring what Ray
appends: nothing for a stable public API, a line for alpha/beta and developer APIs, a warning
block for deprecated ones. ``Deprecated(warning=True)`` also warns with
``RayDeprecationWarning`` at each call (a class: at each instantiation).

Example:
    >>> @PublicAPI(stability="beta")
    ... def fetch():
    ...     "Fetches."
    >>> print(fetch.__doc__.splitlines()[-1])
    **PublicAPI (beta):** This API is in beta and may change before becoming stable.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from enum import Enum
from typing import Any, Callable

__all__ = ["AnnotationType", "Deprecated", "DeveloperAPI", "PublicAPI", "RayDeprecationWarning"]


class RayDeprecationWarning(DeprecationWarning):
    """A deprecated Ray API was used; its own category so it can be filtered alone.

    Example:
        >>> import warnings
        >>> warnings.simplefilter("ignore", RayDeprecationWarning)
    """


RayDeprecationWarning.__module__ = __name__


class AnnotationType(Enum):
    PUBLIC_API = "PublicAPI"
    DEVELOPER_API = "DeveloperAPI"
    DEPRECATED = "Deprecated"
    UNKNOWN = "Unknown"


_STABILITIES = ("stable", "beta", "alpha")
_DEPRECATED_TEXT = "This API is deprecated and may be removed in future Ray releases."
_SUPPRESS_HINT = (" You could suppress this warning by setting env variable "
                  'PYTHONWARNINGS="ignore::DeprecationWarning"')


def _bare_or_called(args: tuple, kwargs: dict) -> Callable | None:
    """The decorated object when the decorator was used bare (``@PublicAPI``), else None."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return None


def _append_doc(obj: Any, text: str) -> None:
    if not text:
        return
    try:
        obj.__doc__ = (obj.__doc__ or "") + text
    except (AttributeError, TypeError):  # a builtin or slotted object: its doc is fixed
        pass


def _mark(obj: Any, kind: AnnotationType, api_group: str) -> Any:
    obj._annotated = getattr(obj, "__name__", None)
    obj._annotated_type = kind
    obj._annotated_api_group = api_group
    return obj


def PublicAPI(*args, **kwargs):
    """Marks an API as public: ``stability`` is ``"stable"`` (default), ``"beta"`` or
    ``"alpha"``; ``api_group`` groups it in generated docs."""
    obj = _bare_or_called(args, kwargs)
    if obj is not None:
        return PublicAPI()(obj)
    stability = kwargs.pop("stability", args[0] if args else "stable")
    api_group = kwargs.pop("api_group", "Others")
    assert stability in _STABILITIES, stability

    def wrap(obj):
        if stability in ("alpha", "beta"):
            _append_doc(obj, f"\n\n**PublicAPI ({stability}):** This API is in {stability} and "
                             "may change before becoming stable.\n")
        return _mark(obj, AnnotationType.PUBLIC_API, api_group)

    return wrap


def DeveloperAPI(*args, **kwargs):
    """Marks an API for advanced users and library authors: it may change between minor
    releases."""
    obj = _bare_or_called(args, kwargs)
    if obj is not None:
        return DeveloperAPI()(obj)

    def wrap(obj):
        _append_doc(obj, "\n\n**DeveloperAPI:** This API may change across minor Ray releases.\n")
        return _mark(obj, AnnotationType.DEVELOPER_API, "Others")

    return wrap


def Deprecated(*args, **kwargs):
    """Marks an API as deprecated: ``message`` says what to use instead; with ``warning=True``
    each call (or instantiation) warns with ``RayDeprecationWarning``."""
    obj = _bare_or_called(args, kwargs)
    if obj is not None:
        return Deprecated()(obj)
    message = kwargs.pop("message", "")
    warning = kwargs.pop("warning", False)
    if kwargs:
        raise ValueError(f"Unknown kwargs: {kwargs.keys()}")
    doc = "\n\n.. warning::\n\n    **DEPRECATED**: " + _DEPRECATED_TEXT + "\n"
    if message:
        doc += f"    {message}\n"

    def wrap(obj):
        if warning:
            obj = _warning_on_use(obj, f"{_DEPRECATED_TEXT}{_SUPPRESS_HINT}\n{message}")
        _append_doc(obj, doc)
        return _mark(obj, AnnotationType.DEPRECATED, "Others")

    return wrap


def _warning_on_use(obj: Any, text: str) -> Any:
    """``obj`` warning ``text`` on each call; a class keeps its identity (its ``__init__``
    warns)."""
    if inspect.isclass(obj):
        init = obj.__init__

        @functools.wraps(init)
        def __init__(self, *a, **k):
            warnings.warn(text, RayDeprecationWarning, stacklevel=2)
            init(self, *a, **k)

        obj.__init__ = __init__
        return obj

    @functools.wraps(obj)
    def warned(*a, **k):
        warnings.warn(text, RayDeprecationWarning, stacklevel=2)
        return obj(*a, **k)

    return warned
