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

A time limit per test phase (set-up, the test, teardown): a phase still running after
``PHASE_LIMIT_S`` (``MINIRAY_TEST_PHASE_LIMIT_S``) has every thread's stack written out and
fails with ``PhaseTimeLimit``, raised in the main thread by ``SIGALRM``, so one wedged test
(a child that never exits, a wait with no bound) fails alone and the run goes on, instead of
holding the whole run until its outer limit kills it with nothing reported. A test's own
waits are bounded far below it: the slowest phase takes about 14 s on a 2-core runner.
"""

from __future__ import annotations

import compileall
import faulthandler
import os
import pathlib
import signal
import sys
import threading

import pytest

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



# ------------------------------------------------------------------------ per-phase time limit
PHASE_LIMIT_S = float(os.environ.get("MINIRAY_TEST_PHASE_LIMIT_S", "180"))


class PhaseTimeLimit(BaseException):
    """A test phase outlived ``PHASE_LIMIT_S``. A ``BaseException``, as ``KeyboardInterrupt``
    is, so that a test's ``except Exception`` cannot swallow it."""


def _over_time(signum, frame):
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    raise PhaseTimeLimit(f"still running after {PHASE_LIMIT_S:g} s (MINIRAY_TEST_PHASE_LIMIT_S);"
                         " every thread's stack is above")


def _default_sigalrm_in_child() -> None:
    """A forked child's ``SIGALRM`` (its own ``signal.alarm``) kills it as by default."""
    if signal.getsignal(signal.SIGALRM) is _over_time:
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        except ValueError:  # pragma: no cover - forked from a thread Python has no main of
            pass


os.register_at_fork(after_in_child=_default_sigalrm_in_child)


def _limited():
    if (PHASE_LIMIT_S <= 0 or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _over_time)
    signal.setitimer(signal.ITIMER_REAL, PHASE_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _limited()
