"""The type variables of the public API's annotations.

Owns: ``P`` (a remote function's parameters), ``R`` (its return type) and ``T`` (a stored
value's type, an actor's class), so that a type checker reads ``@remote`` on ``def f(x: int)
-> str`` as an object whose ``.remote(x: int)`` returns ``ObjectRef[str]``, and ``get`` of an
``ObjectRef[str]`` as a ``str``. Does nothing at run time beyond defining the names.

``ParamSpec`` is in ``typing`` from Python 3.10 on. Type checkers read the ``TYPE_CHECKING``
branch (``typing_extensions``, whose stubs they ship); at run time on 3.9 a ``TypeVar`` stands
in, since nothing there looks at ``P`` beyond subscripting ``Generic``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from typing_extensions import ParamSpec

    P = ParamSpec("P")
elif sys.version_info >= (3, 10):
    from typing import ParamSpec

    P = ParamSpec("P")
else:
    P = TypeVar("P")

R = TypeVar("R")
T = TypeVar("T")

__all__ = ["P", "R", "T"]
