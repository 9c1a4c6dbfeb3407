"""The public functions have docstrings, and every docstring example in miniray runs (as a
doctest) and passes.

``help(miniray.get)`` must explain ``get`` the way Ray's docstrings do; an example that no
longer runs is worse than none. Each example runs with ``ray`` bound to miniray, already
initialized with ``num_cpus=2`` by the ``ray`` fixture, whose teardown checks for leaks; the
examples of every other module (public or not) run the same way, with the module's own names.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import miniray

PUBLIC_FUNCTIONS = sorted(
    name
    for name in miniray.__all__
    if callable(getattr(miniray, name)) and not inspect.isclass(getattr(miniray, name))
)


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_function_has_a_docstring(name):
    doc = inspect.getdoc(getattr(miniray, name))
    assert doc and len(doc.split()) >= 5, f"miniray.{name} has no real docstring"


def _examples(name: str):
    finder = doctest.DocTestFinder(recurse=False)
    return [t for t in finder.find(getattr(miniray, name), f"miniray.{name}") if t.examples]


WITH_EXAMPLES = [name for name in PUBLIC_FUNCTIONS if _examples(name)]


def test_the_main_functions_have_examples():
    for name in ("get", "put", "wait", "init", "shutdown", "kill", "cancel", "get_actor"):
        assert name in WITH_EXAMPLES, f"miniray.{name}'s docstring has no example"


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(ray, name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _examples(name):
        test.globs = {"ray": ray}
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) of miniray.{name} failed (above)"


# Modules of an optional extra, left out where the extra's package is not installed.
OPTIONAL = {"miniray.util.joblib": "joblib"}


def _modules_with_examples() -> list[str]:
    names = ["miniray"] + [m.name for m in pkgutil.walk_packages(miniray.__path__, "miniray.")]
    found = []
    for name in names:
        if name.endswith("__main__"):
            continue
        if any(name.startswith(prefix) and importlib.util.find_spec(package) is None
               for prefix, package in OPTIONAL.items()):
            continue
        module = importlib.import_module(name)
        if any(t.examples for t in doctest.DocTestFinder().find(module, name)):
            found.append(name)
    return found


MODULES_WITH_EXAMPLES = _modules_with_examples()


def test_examples_are_found_in_the_engine_too():
    for name in ("miniray._private.object_store.store_policy", "miniray._private.core.options",
                 "miniray.exceptions", "miniray.util.actor_pool"):
        assert name in MODULES_WITH_EXAMPLES


@pytest.mark.parametrize("name", MODULES_WITH_EXAMPLES)
def test_module_examples_run(ray, name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module, name):
        if test.examples:
            test.globs = {**test.globs, "ray": ray}
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) in {name} failed (above)"
