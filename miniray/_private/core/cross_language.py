"""Ray's cross-language surface: the ``Language`` values, and the Java entry points refused.

Owns: ``Language`` (``ray.Language``: ``PYTHON``, ``JAVA``, ``CPP``, each with ``value()``), and
``java_function`` / ``java_actor_class``, which raise NotImplementedError: a miniray node runs
Python workers only, so a Java function or actor class could never be placed. Ray accepts
them at definition and fails at call time ("Cross language feature needs
--load-code-from-local to be set."); refusing at definition names the problem where it is
written. Called by: ``miniray/__init__.py``, ``miniray/exceptions.py`` (``PYTHON``).
"""

from __future__ import annotations

__all__ = ["Language", "java_actor_class", "java_function"]

_REFUSAL = ("Cross-language calls (Java, C++) are not supported by miniray: a miniray node runs "
            "Python workers only. Run the program on Ray with its Java workers to call {what}.")


class Language:
    """A worker language as Ray names it: ``Language.PYTHON``, ``JAVA`` or ``CPP``.

    As in Ray 2.60, ``str()`` is the name, ``value()`` the number, and members are compared
    by identity (``Language.PYTHON == 0`` is False).
    """

    __slots__ = ("_name", "_value")
    PYTHON: Language
    JAVA: Language
    CPP: Language

    def __init__(self, name: str, value: int):
        self._name = name
        self._value = value

    def value(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return self._name

    __str__ = __repr__

    def __reduce__(self):
        return (getattr, (Language, self._name))


Language.PYTHON = Language("PYTHON", 0)
Language.JAVA = Language("JAVA", 1)
Language.CPP = Language("CPP", 2)
Language.__module__ = "miniray"


def java_function(class_name: str, function_name: str):
    """Refused: raises NotImplementedError (Java workers do not exist in miniray)."""
    raise NotImplementedError(_REFUSAL.format(what=f"{class_name}.{function_name}"))


def java_actor_class(class_name: str):
    """Refused: raises NotImplementedError (Java workers do not exist in miniray)."""
    raise NotImplementedError(_REFUSAL.format(what=class_name))
