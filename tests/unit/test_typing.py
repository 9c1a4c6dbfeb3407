"""A type checker understands a Ray program written against miniray, as it does with Ray.

mypy (pinned in the ``test`` extra) checks a small typed user program that uses remote
functions, ``options``, ``get``/``put``/``wait`` and an actor. The program has mistakes planted
on the lines marked ``# MISTAKE: <error code>``; the test asserts that mypy reports exactly
those lines, with those codes, and nothing else: a correct line that mypy flags (as it flagged
every ``.remote`` call before miniray's public API was typed) fails the test, and so does a
planted mistake that slips through.

mypy ignores what a class decorator returns (python/mypy#3135), so for mypy the program makes
its actor class with ``ray.remote(Counter)``; type checkers that apply class decorators
(pyright) read ``@ray.remote class Counter`` the same way.

miniray is found through a folder on ``MYPYPATH`` that holds a link to the imported package,
so the test checks the package under test (an editable install's import hook is invisible to
mypy), and ``--follow-imports=silent`` keeps mypy's opinions about miniray's own internals out
of the report, as for any installed library.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

import miniray

api = pytest.importorskip("mypy.api", reason="mypy is part of the test extra")

PROGRAM = textwrap.dedent('''\
    from __future__ import annotations

    from typing import List

    import miniray as ray


    @ray.remote
    def add(a: int, b: int) -> int:
        return a + b


    @ray.remote(num_cpus=1)
    def shout(text: str) -> str:
        return text.upper()


    class Counter:
        def __init__(self, start: int) -> None:
            self.n = start

        def incr(self) -> int:
            self.n += 1
            return self.n


    CounterActor = ray.remote(Counter)

    ref = add.remote(1, 2)
    total: int = ray.get(ref)
    totals: List[int] = ray.get([ref, add.remote(3, 4)])
    loud: str = ray.get(shout.options(num_cpus=1).remote("hi"))
    stored: ray.ObjectRef[List[int]] = ray.put([1, 2])
    ready, pending = ray.wait([ref], num_returns=1, timeout=1.0)
    again: int = ray.get(ready[0])
    counter: ray.actor.ActorHandle[Counter] = CounterActor.remote(0)
    value = ray.get(counter.incr.remote())
    ray.kill(counter)
    ray.cancel(ref)

    wrong: str = ray.get(ref)  # MISTAKE: assignment
    add.remote("1", 2)  # MISTAKE: arg-type
    shout.remote()  # MISTAKE: call-arg
    number: int = ray.get(ray.put("text"))  # MISTAKE: assignment
    strings: List[str] = ray.get([ref])  # MISTAKE: list-item
    other: ray.actor.ActorHandle[str] = CounterActor.remote(0)  # MISTAKE: assignment
''')


def planted(program: str) -> set[tuple[int, str]]:
    found = set()
    for number, line in enumerate(program.splitlines(), start=1):
        match = re.search(r"# MISTAKE: ([a-z-]+)", line)
        if match:
            found.add((number, match.group(1)))
    return found


def test_mypy_reports_exactly_the_planted_mistakes(tmp_path):
    package_dir = os.path.dirname(os.path.abspath(miniray.__file__))
    search = tmp_path / "search"
    search.mkdir()
    os.symlink(package_dir, search / "miniray")
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    old = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = str(search)
    try:
        stdout, stderr, status = api.run([
            "--no-site-packages", "--follow-imports=silent", "--show-error-codes",
            "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
            "--python-version", "3.9", str(program),
        ])
    finally:
        if old is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = old
    reported = set()
    for line in stdout.splitlines():
        match = re.match(r".*program\.py:(\d+): error: .*\[([a-z-]+)\]$", line)
        assert match or ": note:" in line, f"unexpected mypy output: {line!r}\n{stdout}"
        if match:
            reported.add((int(match.group(1)), match.group(2)))
    assert not stderr, stderr
    assert reported == planted(PROGRAM), stdout
    assert status == 1
