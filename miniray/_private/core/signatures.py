"""Call signatures checked at ``.remote()``: the arguments must fit the function's parameters.

Owns: a compact, picklable description of the parameters of a remote function, an actor
constructor or an actor method (``ArgSpec``), made once per function, and the check of a
call's ``(args, kwargs)`` against it. Does not own: pickling the arguments or running the
call (``remote_function.py``, ``actor.py``, which call this before submitting).
Pure logic: no I/O, nothing happens at import.

Mirrors ``ray._common.signature`` (Ray 2.60): the arguments are bound with
``inspect.Signature.bind``, so positional-only, keyword-only, ``*args``, ``**kwargs`` and
defaults are respected and the submission fails at once with TypeError. Differs:

  * The message names the call and shows the signature (Ray's is only bind's text, e.g.
    "too many positional arguments").
  * Defaults and annotations are not kept (only whether a parameter has a default), so a
    description always pickles with the actor handle that carries it.
  * A plain function (nothing set on it: no ``__wrapped__``, ``__signature__``) is
    described from its code object, as ``inspect`` would (about 2 µs instead of 30 at
    ``@remote``); the signature's text, shown only in errors, is rendered by ``inspect``
    when first needed.
  * A call with positional arguments only, whose count fits, is accepted without
    ``bind`` (the common case costs a tuple length and two comparisons). Whether a call
    binds depends only on how many positional arguments it has and which keywords it
    names, so shapes that bound once are remembered and not bound again.

    f.remote(1, 2) --ArgSpec.check--> fits? --> submit
                                      no    --> TypeError("f.remote() got invalid ...")
"""

from __future__ import annotations

import inspect
import types
from typing import Any

__all__ = ["ArgSpec", "of_class", "of_function"]

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_HAS_DEFAULT = "<default>"  # stands for any default value in a rebuilt signature
_MAX_SHAPES = 64  # call shapes remembered per callable (call sites are few)


class ArgSpec:
    """The parameters of one callable: ``(name, kind, has_default)`` each, plus its text.

    Example:
        >>> def f(x, y=2, *, z): ...
        >>> spec = of_function(f, "f")
        >>> spec.check((1,), {"z": 3})
        >>> spec.check((1, 2, 3), {"z": 3})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: f.remote() got invalid arguments: too many positional arguments. ...
    """

    __slots__ = ("params", "_text", "name", "_min", "_max", "_signature", "_shapes",
                 "plain_counts")

    def __init__(self, params: tuple, text: Any, name: str):
        self.params = tuple(params)
        # The signature's text, or a callable that renders it (``_fast``: made when an
        # error or a pickle first needs it, not at ``@remote``).
        self._text = text
        self.name = name
        self._signature = None
        self._shapes: set = set()  # (positional count, keyword names) that bound
        positional = [p for p in self.params if p[1] in _POSITIONAL]
        self._min = sum(1 for p in positional if not p[2])
        self._max = len(positional)
        if any(p[1] == _P.VAR_POSITIONAL for p in self.params):
            self._max = 1 << 30
        if any(p[1] == _P.KEYWORD_ONLY and not p[2] for p in self.params):
            self._max = -1  # a required keyword: a call without keywords always needs bind
        # The positional counts a call without keywords may have: ``check``'s first test,
        # which a caller on the per-task path makes itself (``len(args) in plain_counts``)
        self.plain_counts = range(self._min, self._max + 1)

    @property
    def text(self) -> str:
        """The signature as Python shows it, e.g. ``f(x, y=2, *, z)``."""
        text = self._text
        if not isinstance(text, str):
            text = self._text = text()
        return text

    def __reduce__(self):
        return (ArgSpec, (self.params, self.text, self.name))

    def __repr__(self) -> str:
        return f"<ArgSpec {self.text}>"

    def check(self, args: tuple, kwargs: dict) -> None:
        """Raise TypeError naming the call and the signature if the arguments do not bind."""
        if not kwargs and self._min <= len(args) <= self._max:
            return
        shape = (len(args), tuple(kwargs))
        if shape in self._shapes:
            return
        signature = self._signature
        if signature is None:
            signature = self._signature = inspect.Signature([
                _P(name, kind, default=_HAS_DEFAULT if has_default else _P.empty)
                for name, kind, has_default in self.params
            ])
        try:
            bound = signature.bind(*args, **kwargs)
            if kwargs:  # a new shape only (remembered below): a look at each parameter
                _check_positional_only(self.params, bound.arguments, kwargs)
        except TypeError as error:
            raise TypeError(
                f"{self.name}.remote() got invalid arguments: {error}. The signature is "
                f"{self.text}."
            ) from None
        if len(self._shapes) < _MAX_SHAPES:
            self._shapes.add(shape)


def _check_positional_only(params: tuple, bound: dict, kwargs: dict) -> None:
    """TypeError for a required positional-only parameter that ``bind`` left unbound.

    Python 3.13's ``Signature.bind`` puts a positional-only name passed by keyword into
    ``**kwargs`` and binds without that parameter (``g(a, /, **kw)`` with ``a=1`` alone),
    where the call itself raises; earlier versions raise in ``bind``. The words are 3.13's
    own for the same mistake without ``**kwargs``.

    Example:
        >>> P = inspect.Parameter
        >>> _check_positional_only((("a", P.POSITIONAL_ONLY, False),), {}, {"a": 1})
        Traceback (most recent call last):
        TypeError: got some positional-only arguments passed as keyword arguments: 'a'
    """
    for name, kind, has_default in params:  # (one left out of kwargs too: bind raised)
        if kind == _P.POSITIONAL_ONLY and not has_default and name not in bound \
                and name in kwargs:
            raise TypeError(
                f"got some positional-only arguments passed as keyword arguments: {name!r}")


def _describe(signature: inspect.Signature, drop_first: bool, name: str) -> ArgSpec | None:
    params = list(signature.parameters.values())
    if drop_first:
        if not params or params[0].kind not in (*_POSITIONAL, _P.VAR_POSITIONAL):
            return None  # no room for self: Python raises when it is called; leave it
        if params[0].kind in _POSITIONAL:
            params = params[1:]
    text = f"{name}{signature.replace(parameters=params)}"
    described = tuple((p.name, p.kind, p.default is not _P.empty) for p in params)
    return ArgSpec(described, text, name)


_CO_VARARGS = inspect.CO_VARARGS
_CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def _code_params(function: types.FunctionType) -> list:
    """``(name, kind, has_default)`` of a plain function's parameters, read from its code
    object and defaults as ``inspect.signature`` reads them (``_signature_from_function``),
    in the signature's order: positional, ``*args``, keyword-only, ``**kwargs``."""
    code = function.__code__
    names = code.co_varnames
    positional = code.co_argcount
    positional_only = code.co_posonlyargcount
    keyword_only = code.co_kwonlyargcount
    defaults = function.__defaults__ or ()
    first_default = positional - len(defaults)
    kw_defaults = function.__kwdefaults__ or {}
    empty = _P.empty  # a default that is ``empty`` itself is no default, as in inspect
    params = [
        (names[i], _P.POSITIONAL_ONLY if i < positional_only else _P.POSITIONAL_OR_KEYWORD,
         i >= first_default and defaults[i - first_default] is not empty)
        for i in range(positional)
    ]
    index = positional + keyword_only
    flags = code.co_flags
    if flags & _CO_VARARGS:
        params.append((names[index], _P.VAR_POSITIONAL, False))
        index += 1
    params.extend((names[i], _P.KEYWORD_ONLY, kw_defaults.get(names[i], empty) is not empty)
                  for i in range(positional, positional + keyword_only))
    if flags & _CO_VARKEYWORDS:
        params.append((names[index], _P.VAR_KEYWORD, False))
    return params


def _fast(function: Any, name: str, drop_first: bool) -> ArgSpec | None:
    """``of_function`` for a plain function, without ``inspect``; None where the answer
    could differ from inspect's (anything set on the function may change its signature:
    ``__wrapped__``, ``__signature__``, a partialmethod's marker)."""
    if type(function) is not types.FunctionType or function.__dict__:
        return None
    if len(function.__defaults__ or ()) > function.__code__.co_argcount:
        return None  # defaults set by hand beyond the parameters: inspect's slicing decides
    params = _code_params(function)
    if drop_first:
        if not params or params[0][1] not in (*_POSITIONAL, _P.VAR_POSITIONAL):
            return None  # inspect's path says the same (no room for self)
        if params[0][1] in _POSITIONAL:
            params = params[1:]

    def text() -> str:
        return _describe(inspect.signature(function), drop_first, name).text

    return ArgSpec(tuple(params), text, name)


def of_function(function: Any, name: str, *, drop_first: bool = False) -> ArgSpec | None:
    """The ArgSpec of ``function`` (``drop_first``: a method, without ``self``); None when
    Python cannot tell its signature (then nothing is checked).

    ``name`` is how the call is shown in errors, e.g. ``"f"`` or ``"Counter.incr"``.
    """
    spec = _fast(function, name, drop_first)
    if spec is not None:
        return spec
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return _describe(signature, drop_first, name)


def of_class(cls: type, name: str) -> ArgSpec | None:
    """The ArgSpec of creating an instance of ``cls`` (its ``__init__`` without ``self``).

    A class with neither ``__init__`` nor ``__new__`` of its own takes no arguments, as
    Python (and Ray) say. None when the signature cannot be told (a C base class).
    """
    init, new = cls.__init__, cls.__new__
    if init is object.__init__:
        if new is object.__new__:
            return ArgSpec((), f"{name}()", name)
        return of_function(new, name, drop_first=True) if inspect.isfunction(new) else None
    if not inspect.isfunction(init):
        return None
    return of_function(init, name, drop_first=True)
