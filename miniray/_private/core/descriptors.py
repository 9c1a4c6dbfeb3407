"""Ray's names for a remote function and an actor method.

Owns: the "function name" Ray 2.60 reports for a task (``get_task_function_name()``):
``<module>.<function __name__>`` or ``<module>.<Class __name__>.<method>``, with no
``<locals>`` segment for a function or class defined inside another function, and with a
``__main__`` module named after the file it was defined in (``python app.py``: ``app``;
no file, as with ``python -c``: ``__main__``). Does not own: task names (``f``,
``Class.method`` or ``options(name=...)``: ``remote_function.py``, ``actor_host.py``).
Called by: remote_function.py (in the driver), actor_host.py (in the actor's worker).
"""

from __future__ import annotations

import inspect
import types
from typing import Any

__all__ = ["function_name", "method_name", "module_name"]


def module_name(obj: Any) -> str:
    """The module Ray names ``obj`` by: its ``__module__``, except that ``__main__`` becomes
    the stem of the file ``obj`` was defined in, when there is one.

    Example:
        >>> module_name(module_name)
        'miniray._private.core.descriptors'
    """
    module = getattr(obj, "__module__", None) or "__main__"
    if module != "__main__":
        return module
    if isinstance(obj, types.FunctionType):  # inspect.getfile's answer, looked up once
        path = obj.__code__.co_filename
        name = _by_file.get(path)
        if name is None:
            if len(_by_file) >= 256:
                _by_file.clear()
            name = _by_file[path] = inspect.getmodulename(path) or module
        return name
    try:
        path = inspect.getfile(obj)
    except (TypeError, OSError):  # built-in, or defined where no file is known
        return module
    return inspect.getmodulename(path) or module


# The module name of a __main__ function's file (``inspect.getmodulename``: 8 µs a call).
_by_file: dict = {}


def function_name(function: Any) -> str:
    """``<module>.<name>`` of a remote function, e.g. ``app.inner`` for ``inner`` defined
    inside another function of ``app.py``."""
    return f"{module_name(function)}.{function.__name__}"


def method_name(cls: type, method: str) -> str:
    """``<module>.<Class>.<method>`` of an actor method. The module is found through the
    method's function when it has one: a class unpickled in a worker reports ``__main__``
    as its module and no file, while its functions keep the file they were defined in."""
    function = getattr(cls, method, None)
    function = getattr(function, "__func__", function)
    source = function if inspect.isfunction(function) else cls
    module = module_name(source) if cls.__module__ == "__main__" else cls.__module__
    return f"{module}.{cls.__name__}.{method}"
