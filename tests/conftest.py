"""Session-wide set-up shared by every test directory.

Bytecode for the processes the tests start. With ``PYTHONDONTWRITEBYTECODE`` set (as some CI
runners and containers do), Python never writes ``__pycache__``, so every process a test
starts (a fork server per ``init()``, node daemons, drivers, CLI calls: thousands in a run)
compiles all of miniray from source again: about 0.25 s of CPU each on a 2-core runner,
half a fork server's start. Python still reads bytecode that exists, so the session
compiles miniray's modules once, before the first test, into the package's own
``__pycache__`` (only files that were missing or stale: what Python itself writes without
the setting), and removes at its end exactly the files it wrote, leaving the tree as it
found it. Nothing is done when bytecode is written anyway, or when miniray is not a source
tree this user may write.
"""

from __future__ import annotations

import compileall
import os
import pathlib
import sys

import miniray

_WRITTEN: list[str] = []


def _cache_files(package: pathlib.Path) -> set[str]:
    return {str(p) for p in package.rglob("__pycache__/*.pyc")}


def pytest_configure(config):
    if not sys.dont_write_bytecode or config.option.collectonly:
        return
    package = pathlib.Path(miniray.__file__).resolve().parent
    if not os.access(package, os.W_OK):
        return
    before = _cache_files(package)
    compileall.compile_dir(str(package), quiet=2, workers=1)
    _WRITTEN.extend(sorted(_cache_files(package) - before))


def pytest_unconfigure(config):
    while _WRITTEN:
        path = _WRITTEN.pop()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(os.path.dirname(path))  # only once empty: a __pycache__ of ours
        except OSError:
            pass

