"""ArgSpec: the call-signature check made at ``.remote()`` (pure, no processes).

Compared with Ray 2.60, which binds with ``inspect.Signature.bind`` and raises TypeError with
bind's text; the texts below contain it.
"""

from __future__ import annotations

import inspect
import pickle
import sys
import threading

import pytest

from miniray._private.core import signatures


def f(a, b=2, *rest, c, d=4, **extra):
    return a


def g(a, /, b):
    return a


def h(a, /, b, *rest, **extra):
    return a


# inspect's own words for a positional-only parameter passed by keyword, which Python 3.13
# changed
POSITIONAL_ONLY_BY_KEYWORD = (
    "'a' parameter is positional only, but was passed as a keyword" if sys.version_info < (3, 13)
    else "got some positional-only arguments passed as keyword arguments: 'a'")


@pytest.mark.parametrize(
    "args, kwargs",
    [((1,), {"c": 3}), ((1, 2, 3, 4), {"c": 3, "z": 0}), ((), {"a": 1, "c": 3})],
)
def test_calls_that_bind_pass(args, kwargs):
    signatures.of_function(f, "f").check(args, kwargs)


def test_a_positional_only_name_may_also_come_by_keyword_into_extra():
    assert h(1, 2, a=3) == 1  # Python takes it: so does the check
    signatures.of_function(h, "h").check((1, 2), {"a": 3})


@pytest.mark.parametrize(
    "function, args, kwargs, text",
    [
        (f, (1,), {}, "missing a required argument: 'c'"),
        (f, (), {"c": 1}, "missing a required argument: 'a'"),
        (f, (1,), {"a": 1, "c": 1}, "multiple values for argument 'a'"),
        (g, (1, 2, 3), {}, "too many positional arguments"),
        (g, (), {"a": 1, "b": 2}, POSITIONAL_ONLY_BY_KEYWORD),
        # With **extra, Python 3.13's bind() takes "a" into extra and binds: the call
        # itself raises (missing 'a'), and so does the check, in any version
        (h, (), {"a": 1, "b": 2}, POSITIONAL_ONLY_BY_KEYWORD),
        (h, (), {"b": 2}, "missing a required argument: 'a'"),
    ],
)
def test_calls_that_do_not_bind_raise_type_error_naming_call_and_signature(
    function, args, kwargs, text
):
    spec = signatures.of_function(function, function.__name__)
    with pytest.raises(TypeError) as info:
        spec.check(args, kwargs)
    assert str(info.value) == (
        f"{function.__name__}.remote() got invalid arguments: {text}. "
        f"The signature is {spec.text}."
    )


def test_methods_drop_self_and_classes_use_init():
    class Plain:
        def __init__(self, x, *, y=1):
            pass

        def method(self, a):
            pass

    class NoInit:
        pass

    assert signatures.of_class(Plain, "Plain").text == "Plain(x, *, y=1)"
    assert signatures.of_function(Plain.method, "Plain.method", drop_first=True).text == (
        "Plain.method(a)"
    )
    no_init = signatures.of_class(NoInit, "NoInit")
    no_init.check((), {})
    with pytest.raises(TypeError, match="too many positional arguments"):
        no_init.check((1,), {})
    # Signatures Python cannot tell (a C base class's __init__) are not checked.
    assert signatures.of_class(type("D", (dict,), {}), "D") is None
    assert signatures.of_function(len, "len") is not None  # builtins with a text signature


def test_spec_pickles_without_its_defaults():
    def h(x, lock=threading.Lock()):  # a default that cannot be pickled
        return x

    spec = pickle.loads(pickle.dumps(signatures.of_function(h, "h")))
    spec.check((1,), {})
    spec.check((1, 2), {})
    with pytest.raises(TypeError, match="too many positional arguments"):
        spec.check((1, 2, 3), {})


def test_check_binds_only_a_new_shape(monkeypatch):
    """The positional call that fits skips bind (the hot path), and a keyword shape seen
    once is not bound again: counted, not timed (its cost is in benchmarks/)."""
    binds = []
    real_bind = inspect.Signature.bind

    def counting_bind(self, *args, **kwargs):
        binds.append((args, kwargs))
        return real_bind(self, *args, **kwargs)

    monkeypatch.setattr(inspect.Signature, "bind", counting_bind)
    spec_g = signatures.of_function(g, "g")
    for _ in range(3):
        spec_g.check((1, 2), {})
    assert binds == []
    spec_f = signatures.of_function(f, "f")
    for _ in range(3):
        spec_f.check((1, 2), {"c": 1})
    assert binds == [((1, 2), {"c": 1})]


def test_remembered_shapes_still_refuse_other_shapes():
    spec = signatures.of_function(f, "f")
    spec.check((1,), {"c": 1})
    spec.check((1,), {"c": 2})  # same shape: not bound again
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        spec.check((1,), {"c": 1, "a": 2})
    with pytest.raises(TypeError, match="missing a required argument: 'c'"):
        spec.check((1,), {"d": 1})
    spec.check((1,), {"c": 1})


def test_plain_counts_say_what_check_passes_without_keywords():
    # the submission path skips check() when a call without keywords has a count in
    # plain_counts: that must be exactly the counts check() passes
    def f(a, b=1, *rest): ...

    def g(a, *, k): ...

    def h(): ...

    for fn, counts in ((f, (1, 2, 3, 50)), (g, ()), (h, (0,))):
        spec = signatures.of_function(fn, fn.__name__)
        for n in range(6):
            plain = n in spec.plain_counts
            assert plain == (n in counts or (fn is f and n >= 1)), (fn, n)
            if not plain:
                with pytest.raises(TypeError):
                    spec.check((0,) * n, {})


def _slow(function, name, drop_first=False):
    """``of_function`` through ``inspect.signature``, as before the code-object path."""
    try:
        signature = signatures.inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return signatures._describe(signature, drop_first, name)


def plain_functions(limit: int = 3000):
    """Plain functions of the standard library modules loaded here (thousands of shapes:
    defaults, keyword-only, positional-only, ``*args``, ``**kwargs``, annotations): one per
    code object, at most ``limit`` of them spread evenly over every loaded module (the same
    ones for the same modules, however many other tests loaded more)."""
    import types

    seen = {}
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            members = _own_dict(value)
            candidates = list(members.values()) if members is not None else [value]
            for c in candidates:
                if type(c) is types.FunctionType:
                    seen.setdefault(c.__code__, c)
    functions = sorted(seen.values(), key=lambda f: (f.__code__.co_filename,
                                                     f.__code__.co_firstlineno, f.__qualname__))
    stride = max(1, -(-len(functions) // limit))
    return functions[::stride]


def test_code_object_path_describes_as_inspect_does():
    functions = plain_functions()
    assert len(functions) > 500
    fast_ones = 0
    for function in functions:
        for drop_first in (False, True):
            slow = _slow(function, "h", drop_first)
            fast = signatures._fast(function, "h", drop_first)
            if fast is None:
                continue
            fast_ones += 1
            assert slow is not None, function
            assert fast.params == slow.params, function
            assert fast.text == slow.text, function
            assert (fast._min, fast._max) == (slow._min, slow._max), function
    assert fast_ones > 500


def test_code_object_path_is_left_for_functions_with_attributes():
    import functools

    @functools.wraps(g)
    def wrapper(*args, **kwargs):
        return g(*args, **kwargs)

    assert signatures._fast(wrapper, "w", False) is None  # __wrapped__: inspect follows it
    spec = signatures.of_function(wrapper, "w")
    assert [p[0] for p in spec.params] == ["a", "b"]

    def h(x, y):
        return x

    h.__signature__ = signatures.inspect.signature(lambda z: z)
    assert signatures._fast(h, "h", False) is None
    assert [p[0] for p in signatures.of_function(h, "h").params] == ["z"]

    def k(x):
        return x

    k.__defaults__ = (1, 2)  # more defaults than parameters
    assert signatures._fast(k, "k", False) is None


def test_code_object_text_is_rendered_when_first_needed_and_pickles():
    def h(a, b: int = 3, *rest, c, d="x", **more) -> int:
        return a

    spec = signatures.of_function(h, "h")
    assert not isinstance(spec._text, str)  # not rendered at description time
    assert spec.text == str(signatures.inspect.signature(h)).join(("h", ""))
    copy = pickle.loads(pickle.dumps(spec))
    assert copy.text == spec.text and copy.params == spec.params
    with pytest.raises(TypeError, match=r"The signature is h\(a, b: "):
        spec.check((), {})


def _own_dict(value):
    """A class's own ``__dict__`` (read past any attribute the class shadows it with), or
    None for anything else (on Python 3.9 ``list[int]`` passes ``isinstance(x, type)``)."""
    try:
        return type.__dict__["__dict__"].__get__(value) if isinstance(value, type) else None
    except TypeError:
        return None
