"""Functions and classes pickled for export (``serialization.dumps_function``) keep the file
their code was defined in, whatever cloudpickle does with values: a worker then shows the
task's source lines in its traceback and names a script's methods after the script, as Ray
2.60 does. No processes."""

from __future__ import annotations

import pickle

from miniray._private.core import serialization


def _make():
    def inner(x):
        return x + 1

    class Local:
        def name(self):
            return "name"

    return inner, Local


def test_an_exported_function_keeps_its_file_and_still_runs():
    inner, _ = _make()
    copy = pickle.loads(serialization.dumps_function(inner, "inner"))
    assert copy(1) == 2
    assert copy.__code__.co_filename == __file__


def test_the_methods_of_an_exported_class_keep_their_file():
    _, local = _make()
    copy = pickle.loads(serialization.dumps_function(local, "Local"))
    assert copy().name() == "name"
    assert copy.name.__code__.co_filename == __file__


def _cloudpickle_names(code):
    """cloudpickle's own answer, found again (its cache left out)."""
    import types

    from cloudpickle import cloudpickle as cp

    names = {name: None for name in cp._walk_global_ops(code)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_cloudpickle_names(const))
    return names


def _many_names_source() -> str:
    """A function using over 256 distinct global names (EXTENDED_ARG in front of the
    later ones), deleting and assigning globals, with nested code of each kind."""
    lines = ["def big():", "    global g_set, g_del", "    g_set = 1", "    del g_del"]
    lines += [f"    v{i} = name_{i}" for i in range(300)]
    lines += ["    f = lambda: lam_global", "    c = [comp_global for _ in range(1)]",
              "    def nested():", "        return nested_global + name_299",
              "    class Body:", "        attr = body_global",
              "    return locals()"]
    return "\n".join(lines) + "\n"


def test_global_names_read_from_bytecode_match_cloudpickles():

    from tests.unit.test_signatures import plain_functions

    namespace: dict = {}
    exec(compile(_many_names_source(), "<big>", "exec"), namespace)
    codes = [namespace["big"].__code__] + [f.__code__ for f in plain_functions()]
    assert len(codes) > 1000
    for code in codes:
        ours = serialization.code_global_names(code)
        theirs = _cloudpickle_names(code)
        assert list(ours) == list(theirs), code
    big = serialization.code_global_names(codes[0])
    assert {"name_0", "name_299", "g_set", "g_del", "lam_global", "comp_global",
            "nested_global"} <= set(big)  # a class body's names are LOAD_NAME: not globals


def test_a_function_pickles_to_the_same_bytes_with_the_names_noted_first():
    from cloudpickle import cloudpickle as cp

    namespace: dict = {"__name__": "__main__", "helper_value": 41}
    exec("def uses():\n    return helper_value + 1\n", namespace)
    function = namespace["uses"]
    cp._extract_code_globals_cache.pop(function.__code__, None)
    plain = cp.dumps(function, protocol=serialization.PROTOCOL)  # cloudpickle's own walk
    cp._extract_code_globals_cache.pop(function.__code__, None)
    serialization._note_global_names(function)
    assert cp._extract_code_globals_cache[function.__code__] == {"helper_value": None}
    assert cp.dumps(function, protocol=serialization.PROTOCOL) == plain
    assert pickle.loads(serialization.dumps_function(function, "uses"))() == 42


def test_cloudpickles_helpers_known_by_reference_change_no_byte():
    import io

    from cloudpickle import cloudpickle as cp

    class Plain(serialization._CloudPickler):  # cloudpickle's decisions for every object
        dispatch_table = serialization._FunctionPickler.dispatch_table

    def dumps(pickler_class, value):
        buffer = io.BytesIO()
        pickler_class(buffer, protocol=serialization.PROTOCOL).dump(value)
        return buffer.getvalue()

    inner, local = _make()
    captured = [1, 2]

    def closure(x, *, y=3):
        return captured + [x, y, inner(x)]

    values = [inner, local, closure, _make, cp._make_function, (cp._builtin_type, inner)]
    assert serialization._HELPERS and cp._make_function in serialization._HELPERS
    for value in values:
        assert dumps(serialization._FunctionPickler, value) == dumps(Plain, value)
    assert pickle.loads(serialization.dumps_function(closure, "closure"))(1) == [1, 2, 1, 3, 2]


def test_with_a_module_registered_by_value_cloudpickle_decides_for_its_helpers_again():
    import io
    import sys

    import cloudpickle

    class Plain(serialization._CloudPickler):
        dispatch_table = serialization._FunctionPickler.dispatch_table

    def dumps(pickler_class, value):
        buffer = io.BytesIO()
        pickler_class(buffer, protocol=serialization.PROTOCOL).dump(value)
        return buffer.getvalue()

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        assert serialization._BY_VALUE_MODULES  # the shortcut is off while it is registered
        assert dumps(serialization._FunctionPickler, _make) == dumps(Plain, _make)
        inner, _ = pickle.loads(serialization.dumps_function(_make, "_make"))()
        assert inner(1) == 2
    finally:
        cloudpickle.unregister_pickle_by_value(module)
