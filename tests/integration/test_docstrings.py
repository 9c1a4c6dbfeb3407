"""The public functions have docstrings, and their examples run (as doctests) and pass.

``help(miniray.get)`` must explain ``get`` the way Ray's docstrings do; an example that no
longer runs is worse than none. Each example runs with ``ray`` bound to miniray, already
initialized with ``num_cpus=2`` by the ``ray`` fixture, whose teardown checks for leaks.
"""

from __future__ import annotations

import doctest
import inspect

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
