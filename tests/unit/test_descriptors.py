"""``core/descriptors.py``: Ray 2.60's function names (compared with Ray 2.60: nested
functions have no ``<locals>`` segment; ``__main__`` is named after its file)."""

from __future__ import annotations

from miniray._private.core import descriptors


def _defined_in(filename: str):
    namespace = {"__name__": "__main__"}
    source = "def outer():\n    def inner():\n        pass\n    return inner\n" \
             "class Cls:\n    def method(self):\n        pass\n"
    exec(compile(source, filename, "exec"), namespace)
    return namespace["outer"](), namespace["Cls"]


def test_nested_function_has_no_locals_segment():
    def inner():
        pass

    assert "<locals>" in inner.__qualname__
    assert descriptors.function_name(inner) == f"{__name__}.inner"


def test_main_is_named_after_the_file_it_was_defined_in():
    inner, cls = _defined_in("/somewhere/app.py")
    assert descriptors.function_name(inner) == "app.inner"
    assert descriptors.method_name(cls, "method") == "app.Cls.method"


def test_main_without_a_file_stays_main():
    inner, cls = _defined_in("<string>")  # python -c
    assert descriptors.function_name(inner) == "__main__.inner"
    assert descriptors.method_name(cls, "method") == "__main__.Cls.method"


def test_method_of_an_imported_class_keeps_its_module():
    class Local:
        def method(self):
            pass

    assert descriptors.method_name(Local, "method") == f"{__name__}.Local.method"


def test_main_functions_file_name_is_looked_up_once_and_agrees_with_inspect():
    import inspect

    for path in ("/somewhere/app.py", "/x/tool.pyc", "<string>", "/x/no_suffix"):
        inner, _ = _defined_in(path)
        expected = inspect.getmodulename(inspect.getfile(inner)) or "__main__"
        assert descriptors.module_name(inner) == expected
        assert descriptors._by_file[path] == expected
        assert descriptors.module_name(inner) == expected  # from the table this time
