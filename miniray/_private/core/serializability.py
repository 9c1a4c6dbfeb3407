"""``inspect_serializability``: which part of an object keeps it from being pickled.

Mirrors ``ray.util.check_serialize`` (Ray 2.60): the same walk, report layout and return
value, so a program or a test that reads them gets what Ray gives. Differs: colours (red
``!!! FAIL``, bold culprits) are written only when the report goes to a terminal, where Ray
writes the escape codes into files too; the advice at the end of the report is worded for
miniray.

The walk, from the object down at most ``depth`` levels:

* each object is tried with cloudpickle (what carries functions and arguments to workers);
  one that pickles is fine, and its children are not visited;
* a function that fails is searched through the globals, then the nonlocals, that it uses
  (``inspect.getclosurevars``); any other object through its functions, then its other
  members, leaving out dunder names and builtins;
* the first child that fails is followed (the search stops there); a failing object with no
  failing child, or one reached at depth 0, is the culprit: a ``FailureTuple`` naming the path
  of attribute or variable names from the top, the object and the object that holds it.

Returns ``(ok, failures)``: ``ok`` is whether the object pickles; ``failures`` the culprits
found (empty when it pickles). Owns nothing else; no process is started. Called by user code
(``miniray.util.check_serialize`` is its public name), and by ``serialization.py`` through
``report``: the TypeError of a function, an argument or a ``put`` value that cannot be
pickled carries the report, as Ray's does.
"""

from __future__ import annotations

import inspect
import io
import sys
from typing import Any

import cloudpickle

__all__ = ["FailureTuple", "inspect_serializability"]

_RED, _FORE_RESET, _BRIGHT, _RESET_ALL = "\x1b[31m", "\x1b[39m", "\x1b[1m", "\x1b[0m"


class FailureTuple:
    """One culprit: ``obj`` failed to pickle, reached through ``path`` (names from the top),
    held by ``parent`` (None at the top)."""

    def __init__(self, obj: Any, path: tuple, parent: Any):
        self.obj = obj
        self.path = path
        self.parent = parent

    def __repr__(self) -> str:
        names = ["unknown" if part is None else str(part) for part in self.path]
        last = names[-1] if names else "unknown"
        return (f"FailTuple({last} [path={' -> '.join(names)}, obj={self.obj}, "
                f"parent={self.parent}])")


class _Report:
    """Indented report lines, written to ``file`` (stdout when None)."""

    def __init__(self, file: Any):
        self.file = file
        self.level = 0
        stream = sys.stdout if file is None else file
        try:
            self.colour = bool(stream.isatty())
        except Exception:  # any file-like object without a working isatty
            self.colour = False

    def line(self, text: str) -> None:
        print("    " * self.level + text, file=self.file)

    def paint(self, text: str, start: str, end: str) -> str:
        return f"{start}{text}{end}" if self.colour else text


def inspect_serializability(base_obj: Any, name: str | None = None, depth: int = 3,
                            print_file: Any = None) -> tuple[bool, set]:
    """Say whether ``base_obj`` can be serialized and, if not, which parts of it cannot.

    Args:
        base_obj: the object to check (a function, an instance, a class, ...).
        name: a name for it, used as the first element of every culprit's path.
        depth: how many levels of closure variables or members to search.
        print_file: where the report goes (``print``'s ``file``; stdout when None).

    Returns:
        ``(ok, failures)``: True and an empty set when it pickles; otherwise False and a set
        of ``FailureTuple`` naming each culprit.

    Example:
        >>> import io, threading
        >>> lock = threading.Lock()
        >>> report = io.StringIO()
        >>> ok, failures = inspect_serializability(lambda: lock, name="job", print_file=report)
        >>> ok, [f.path for f in failures]
        (False, [('job', 'lock')])
    """
    report = _Report(print_file)
    failures: set = set()
    title = f"Checking Serializability of {base_obj}"
    rule = "=" * min(len(title), 80)
    for text in (rule, title, rule):
        report.line(text)
    ok = _inspect(base_obj, name, depth, None, failures, report, ())
    if ok:
        return True, failures
    report.line(rule)
    culprits = "\n".join(str(failure) for failure in failures)
    report.line(f"Variable: \n\n\t{report.paint(culprits, _BRIGHT, _RESET_ALL)}\n\n"
                "was found to be non-serializable. Others may be hidden behind it: the "
                "search follows the first failing member only. ")
    report.line("Create such objects inside the task or actor that uses them instead of "
                "capturing them, or give their class a __reduce__ (or register a "
                "serializer with ray.util.register_serializer). ")
    report.line(rule)
    return False, failures


def _inspect(obj: Any, name: str | None, depth: int, parent: Any, failures: set,
             report: _Report, path: tuple) -> bool:
    """True when ``obj`` pickles; otherwise searches it and records culprits in ``failures``."""
    if parent is not None:
        report.line(f"Serializing '{name}' {obj}...")
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception as error:
        report.line(f"{report.paint('!!! FAIL', _RED, _FORE_RESET)} serialization: {error}")
    here = path + ((name,) if name is not None else ())
    if depth <= 0:
        _record(failures, obj, here, parent)
        return False
    if inspect.isfunction(obj):
        _search_closure(obj, depth, failures, report, here)
    else:
        _search_members(obj, depth, failures, report, here)
    if not failures:  # nothing below it failed on its own: the object itself is the culprit
        _record(failures, obj, here, parent)
    return False


def _record(failures: set, obj: Any, path: tuple, parent: Any) -> None:
    try:
        failures.add(FailureTuple(obj, path, parent))
    except Exception:  # an object whose hash raises; the report above still names it
        pass


def _search(children, depth: int, parent: Any, failures: set, report: _Report,
            path: tuple) -> bool:
    """Inspect ``(name, child)`` pairs one level deeper until one fails."""
    report.level += 1
    try:
        for child_name, child in children:
            if not _inspect(child, child_name, depth - 1, parent, failures, report, path):
                return True
        return False
    finally:
        report.level -= 1


def _search_closure(fn: Any, depth: int, failures: set, report: _Report, path: tuple) -> None:
    report.line(f"Inspecting closure of '{fn.__qualname__}':")
    closure = inspect.getclosurevars(fn)
    found = False
    for kind, variables in (("global", closure.globals), ("nonlocal", closure.nonlocals)):
        if not variables or found:
            continue
        report.line(f"Detected {len(variables)} {kind} variables. Checking serializability...")
        found = _search(variables.items(), depth, fn, failures, report, path)
    if not found:
        report.line(f"WARNING: no variable of {fn.__qualname__} failed to serialize on its "
                    "own: it may fail only in combination with others. Check the suspected "
                    "variables one by one with inspect_serializability.")


def _members(obj: Any, predicate=None) -> list:
    try:
        return inspect.getmembers(obj, predicate)
    except Exception:  # a property that raises on one member ends getmembers for all
        return []


def _search_members(obj: Any, depth: int, failures: set, report: _Report, path: tuple) -> None:
    found = _search(_members(obj, inspect.isfunction), depth, obj, failures, report, path)
    if not found:
        others = [(member_name, member) for member_name, member in _members(obj)
                  if not (member_name.startswith("__") and member_name.endswith("__"))
                  and not inspect.isbuiltin(member)]
        found = _search(others, depth, obj, failures, report, path)
    if not found:
        what = obj.__name__ if inspect.isclass(obj) else f"{type(obj).__name__} instance"
        report.line(f"WARNING: no member of {what} failed to serialize on its own: it may "
                    "fail only in combination with others. Check its attributes one by one "
                    "with inspect_serializability.")


def report(obj: Any, name: str | None = None) -> str:
    """The report ``inspect_serializability`` writes about ``obj`` (no colours), for an
    error message; "" when the walk itself fails (an object whose members raise oddly)."""
    text = io.StringIO()
    try:
        inspect_serializability(obj, name=name, print_file=text)
    except Exception:  # never hide the original error behind one of the report's
        return ""
    return text.getvalue().rstrip("\n")
