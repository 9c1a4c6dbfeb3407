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
