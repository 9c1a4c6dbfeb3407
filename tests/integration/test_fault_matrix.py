"""The fault matrix: every way a call can fail, in a task, an actor method and an actor
constructor, with the exception ``get()`` raises for each (house style, habit 11).

Each cell was run under Ray 2.60 (``compat_tests/fault_matrix_probe.py ray``, 2 CPUs, default
options: tasks ``max_retries=3``, actors ``max_restarts=0``); this table is what Ray gave. The
tests below expect the same type in every cell; the columns say what the messages carry.

Fault                         Task | actor method | actor constructor (Ray 2.60)
----------------------------  -----------------------------------------------------------------
raise ValueError              RayTaskError(ValueError), 1 run | RayTaskError(ValueError), the
                              actor lives on | ActorDiedError "The actor died because of an error
                              raised in its creation task, <traceback>", later calls too
os._exit(1)                   WorkerCrashedError after 4 runs (3 retries) | ActorDiedError, later
                              calls too | ActorDiedError, later calls too
SIGKILL from inside           as os._exit(1)
segfault (string_at(0))       as os._exit(1)
unpicklable argument (lock)   TypeError from .remote(), in all three
argument that fails to        RayTaskError(RaySystemError) "At least one of the input arguments
unpickle in the worker        for this task could not be computed: ... <the error>", 0 runs |
                              the same, the actor lives on | ActorDiedError "... creation task"
                              with the same text, later calls too
unpicklable result (lock)     RayTaskError(TypeError) "cannot pickle ..." | the same, the actor
                              lives on | not applicable: a constructor returns nothing (keeping
                              the value on self works, calls work)
result that fails to          RaySystemError (not a RayTaskError) naming the error | the same,
unpickle in the driver        the actor lives on | not applicable (calls work)
sys.exit(), sys.exit(3)       WorkerCrashedError after 4 runs: the worker exits | ActorDiedError
                              "Worker exits with an exit code None" (or 3), later calls too |
                              the same as the method
MemoryError                   RayTaskError(MemoryError), caught by ``except MemoryError`` | the
                              same, the actor lives on | ActorDiedError "... creation task"

After every cell Ray ran the next ordinary task normally. miniray gives the same types in every
cell. Deliberate differences, in wording only (README, "Differences from Ray"):

* Crashes: Ray's ``WorkerCrashedError`` points at its log files and its ``ActorDiedError`` says
  "connection error code 2. End of file" for ``os._exit``, SIGKILL and SIGSEGV alike;
  miniray names the exit code or the signal (it has the fork server's report), and for
  ``sys.exit()`` the code the worker exited with (0 for ``sys.exit()``, where Ray says None).
* An unpicklable argument: both raise Ray's ``TypeError`` at ``.remote()`` ("Could not
  serialize the argument <it> for a task or actor <module.name>:" and the
  ``inspect_serializability`` report on it); miniray adds a line on what to do.
* Unpickling failures: Ray's ``RaySystemError`` says ``System error: <error text>`` with Ray's
  own frames; miniray's names what failed (an argument in the worker, a result in the driver),
  the error's type and text, and keeps only the user's frames.
* Before this matrix, miniray differed in these rows: ``sys.exit`` came back as a
  ``RayTaskError(SystemExit)`` (so ``get()`` ended the driver unless caught) and actors lived
  on; ``MemoryError`` came back as a plain ``RayTaskError`` plus a warning; an argument that
  failed to unpickle came back as ``RayTaskError(<its error>)``; an actor's unpicklable
  result was headed ``ray::run()`` instead of ``ray::MethodFault.run()``.

Beyond the table (each compared with Ray 2.60 too): the same faults in threaded and async
actors; ``sys.exit`` with ``max_retries=0`` and with ``max_restarts=1`` (the lost call gets
``ActorUnavailableError``); a ``KeyboardInterrupt`` raised in a call (a cancelled task);
several returns of which one cannot be pickled; failures with spilled arguments.

Every row runs in its own session (the ``ray`` fixture), with a 256 KiB ``ObjectRef``
argument so shared-memory segments and pins are part of every failure. Afterwards it runs an
ordinary task, checks the ledger holds no lease and that the argument's segment is freed once
its ref is dropped; the fixture then checks that no process, segment, session file, lease or
spill file is left, in this root or outside it. Every ``get`` has a timeout, and a hang dumps
every thread's stack (faulthandler) after ``ROW_BOUND_S``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import shutil
import signal
import sys
import threading
from dataclasses import dataclass, field

import pytest

import miniray
from miniray._private import runtime
from miniray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    RaySystemError,
    RayTaskError,
    TaskCancelledError,
    WorkerCrashedError,
)

from .conftest import _root_segments
from .helpers import wait_until

ROW_BOUND_S = 60
GET_TIMEOUT_S = 30
BIG = 256 << 10  # above the inline threshold: the argument lives in a segment


# ----------------------------------------------------------------------------- the faults
def _explode():
    raise RuntimeError("cannot rebuild this object")


class Unloadable:
    """Pickles fine; unpickling it raises (its ``__reduce__`` names a callable that raises)."""

    def __reduce__(self):
        return (_explode, ())


def _count_run(counter: str) -> None:
    with open(counter, "a") as f:
        f.write("x")


def _runs(counter: str) -> int:
    try:
        with open(counter) as f:
            return len(f.read())
    except FileNotFoundError:
        return 0


def fault(kind: str):
    """Do ``kind`` here, in the worker; return what the call returns."""
    if kind == "raise":
        raise ValueError("boom")
    if kind == "exit1":
        os._exit(1)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "sys_exit":
        sys.exit()
    if kind == "sys_exit_3":
        sys.exit(3)
    if kind == "memory_error":
        raise MemoryError("out of memory in the call")
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt("interrupted in the call")
    if kind == "unpicklable_result":
        return threading.Lock()
    if kind == "result_fails_to_unpickle":
        return Unloadable()
    return "done"


@miniray.remote
def task_fault(kind, counter, big, arg=None):
    assert len(big) == BIG
    _count_run(counter)
    return fault(kind)


@miniray.remote
class MethodFault:
    def __init__(self, big):
        assert len(big) == BIG

    def run(self, kind, counter, big, arg=None):
        assert len(big) == BIG
        _count_run(counter)
        return fault(kind)

    def ping(self):
        return "pong"


@miniray.remote
class AsyncMethodFault:
    """The same method, run on the actor's event loop."""

    def __init__(self, big):
        assert len(big) == BIG

    async def run(self, kind, counter, big, arg=None):
        assert len(big) == BIG
        _count_run(counter)
        return fault(kind)

    async def ping(self):
        return "pong"


@miniray.remote
class ConstructorFault:
    def __init__(self, kind, counter, big, arg=None):
        assert len(big) == BIG
        _count_run(counter)
        self.kept = fault(kind)

    def ping(self):
        return "pong"


@miniray.remote
def ordinary(x):
    return x + 1


# ----------------------------------------------------------------------------- the table
@dataclass
class Expect:
    """What a cell gives: ``raises`` (None: the call works) from ``get`` or, with
    ``at_submit``, from ``.remote()``; ``name``: the exception's type name; ``match``:
    substrings of ``str(error)``; ``runs``: how often the user code started; ``later``: what
    the actor's next call gives ("pong", or an exception type)."""

    raises: type | None
    name: str | None = None
    match: list[str] = field(default_factory=list)
    runs: int = 1
    at_submit: bool = False
    later: object = None


CRASH_TASK = {
    "exit1": ["exited with code 1"],
    "sigkill": ["killed by signal 9 (SIGKILL)"],
    "segfault": ["killed by signal 11 (SIGSEGV)"],
    "sys_exit": ["exited with code 0"],
    "sys_exit_3": ["exited with code 3"],
}
UNPICKLABLE_ARG = ["Could not serialize the argument <unlocked _thread.lock object",
                   "for a task or actor", "Checking Serializability of"]
ARG_UNPICKLE = ["At least one of the input arguments for this task could not be computed",
                "RuntimeError: cannot rebuild this object"]
RESULT_UNPICKLE = ["Could not deserialize", "RuntimeError: cannot rebuild this object"]
UNPICKLABLE_RESULT = ["cannot pickle '_thread.lock' object"]

TASK = {
    "raise": Expect(ValueError, "RayTaskError(ValueError)", ["ValueError: boom"]),
    **{kind: Expect(WorkerCrashedError, "WorkerCrashedError", text, runs=4)
       for kind, text in CRASH_TASK.items()},
    "unpicklable_arg": Expect(TypeError, "TypeError", UNPICKLABLE_ARG, runs=0, at_submit=True),
    "arg_fails_to_unpickle": Expect(RaySystemError, "RayTaskError(RaySystemError)",
                                    ARG_UNPICKLE, runs=0),
    "unpicklable_result": Expect(TypeError, "RayTaskError(TypeError)", UNPICKLABLE_RESULT),
    "result_fails_to_unpickle": Expect(RaySystemError, "RaySystemError", RESULT_UNPICKLE),
    "memory_error": Expect(MemoryError, "RayTaskError(MemoryError)",
                           ["MemoryError: out of memory in the call"]),
}

CRASH_ACTOR = {
    "exit1": ["exited with code 1"],
    "sigkill": ["killed by signal 9 (SIGKILL)"],
    "segfault": ["killed by signal 11 (SIGSEGV)"],
    "sys_exit": ["died unexpectedly: exited with code 0"],
    "sys_exit_3": ["died unexpectedly: exited with code 3"],
}

METHOD = {
    "raise": Expect(ValueError, "RayTaskError(ValueError)",
                    ["ray::MethodFault.run()", "ValueError: boom"], later="pong"),
    **{kind: Expect(ActorDiedError, "ActorDiedError", text, later=ActorDiedError)
       for kind, text in CRASH_ACTOR.items()},
    "unpicklable_arg": Expect(TypeError, "TypeError", UNPICKLABLE_ARG, runs=0, at_submit=True,
                              later="pong"),
    "arg_fails_to_unpickle": Expect(RaySystemError, "RayTaskError(RaySystemError)",
                                    ARG_UNPICKLE, runs=0, later="pong"),
    "unpicklable_result": Expect(TypeError, "RayTaskError(TypeError)",
                                 ["ray::MethodFault.run()", *UNPICKLABLE_RESULT], later="pong"),
    "result_fails_to_unpickle": Expect(RaySystemError, "RaySystemError", RESULT_UNPICKLE,
                                       later="pong"),
    "memory_error": Expect(MemoryError, "RayTaskError(MemoryError)",
                           ["MemoryError: out of memory in the call"], later="pong"),
}

CREATION = "The actor died because of an error raised in its creation task"
CONSTRUCTOR = {
    "raise": Expect(ActorDiedError, "ActorDiedError", [CREATION, "ValueError: boom"],
                    later=ActorDiedError),
    **{kind: Expect(ActorDiedError, "ActorDiedError", text, later=ActorDiedError)
       for kind, text in CRASH_ACTOR.items()},
    "unpicklable_arg": Expect(TypeError, "TypeError", UNPICKLABLE_ARG, runs=0, at_submit=True),
    "arg_fails_to_unpickle": Expect(ActorDiedError, "ActorDiedError", [CREATION, *ARG_UNPICKLE],
                                    runs=0, later=ActorDiedError),
    # A constructor returns nothing: keeping such a value on self is fine, as in Ray.
    "unpicklable_result": Expect(None, later="pong"),
    "result_fails_to_unpickle": Expect(None, later="pong"),
    "memory_error": Expect(ActorDiedError, "ActorDiedError",
                           [CREATION, "MemoryError: out of memory in the call"],
                           later=ActorDiedError),
}

MATRIX = {"task": TASK, "actor method": METHOD, "actor constructor": CONSTRUCTOR}
CELLS = [pytest.param(where, kind, id=f"{where.replace(' ', '_')}-{kind}")
         for where, table in MATRIX.items() for kind in table]


def test_the_table_covers_every_fault_everywhere():
    kinds = set(TASK)
    assert set(METHOD) == kinds and set(CONSTRUCTOR) == kinds
    assert len(kinds) == 11


# ----------------------------------------------------------------------------- the rows
@pytest.fixture
def row_bound(request):
    """A hang dumps every thread's stack instead of waiting out CI. faulthandler has one
    timer, which pytest's ``faulthandler_timeout`` also uses: it is armed again afterwards,
    for the fixtures' teardown."""
    faulthandler.dump_traceback_later(ROW_BOUND_S, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()
    try:
        pytest_timeout = float(request.config.getini("faulthandler_timeout") or 0)
    except (TypeError, ValueError):
        pytest_timeout = 0
    if pytest_timeout > 0:
        faulthandler.dump_traceback_later(pytest_timeout, exit=False)


def _arguments(kind: str):
    """The call's (kind the worker acts on, extra argument)."""
    if kind == "unpicklable_arg":
        return "nothing", threading.Lock()
    if kind == "arg_fails_to_unpickle":
        return "nothing", Unloadable()
    return kind, None


def _outcome(call):
    """("value", v) or ("error", exception) of ``call()``."""
    try:
        return "value", call()
    except Exception as error:  # noqa: BLE001 - the cell's outcome, checked by the caller
        return "error", _without_frames(error)


def _without_frames(error: BaseException) -> BaseException:
    """``error`` with no traceback in its chain: frames would keep the row's locals (the
    argument's ref) alive after the row drops them."""
    seen = set()
    link = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


def _check_error(error: BaseException, expect: Expect) -> None:
    assert isinstance(error, expect.raises), f"{type(error).__name__}: {error}"
    assert type(error).__name__ == expect.name, f"{type(error).__name__}: {error}"
    if expect.name.startswith("RayTaskError("):  # the task's class, and still a task error
        assert isinstance(error, RayTaskError)
    text = str(error)
    for piece in expect.match:
        assert piece in text, f"{piece!r} not in the message:\n{text}"


def _run_cell(ray, where: str, kind: str, counter: str, big):
    """Submit the cell's call; returns (submit error or None, get outcome, later outcome)."""
    run_kind, arg = _arguments(kind)
    actor = None
    try:
        if where == "task":
            ref = task_fault.remote(run_kind, counter, big, arg)
            return None, _outcome(lambda: ray.get(ref, timeout=GET_TIMEOUT_S)), None
        if where == "actor method":
            actor = MethodFault.remote(big)
            assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S) == "pong"
            ref = actor.run.remote(run_kind, counter, big, arg)
        else:
            actor = ConstructorFault.remote(run_kind, counter, big, arg)
            ref = actor.ping.remote()
        first = _outcome(lambda: ray.get(ref, timeout=GET_TIMEOUT_S))
        later = _outcome(lambda: ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S))
        return None, first, later
    except (TypeError, ValueError) as error:  # refused at .remote()
        return _without_frames(error), None, None
    finally:
        if actor is not None:
            ray.kill(actor)


@pytest.mark.parametrize("where, kind", CELLS)
def test_fault_cell(ray, row_bound, tmp_path, where, kind):
    """One cell: the exception as Ray 2.60 gives it (module docstring), the message naming
    what happened, how often the user code ran (retries), the actor's next call, then an
    ordinary task works and no lease is left."""
    expect = MATRIX[where][kind]
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    submit_error, first, later = _run_cell(ray, where, kind, counter, big)

    if expect.at_submit:
        assert submit_error is not None, f"{kind}: .remote() accepted the call"
        _check_error(submit_error, expect)
    else:
        assert submit_error is None, f"{kind}: refused at .remote(): {submit_error!r}"
        outcome, value = first
        if expect.raises is None:
            assert (outcome, value) == ("value", "pong")
        else:
            assert outcome == "error", f"{kind}: get() returned {value!r}"
            _check_error(value, expect)
    if where != "task" and not expect.at_submit:
        outcome, value = later
        if expect.later == "pong":
            assert (outcome, value) == ("value", "pong")
        else:
            assert outcome == "error" and isinstance(value, expect.later), value
    assert _runs(counter) == expect.runs

    # The runtime still works, every lease went back, and once the argument's last ref is
    # gone its segment is freed: no failure path kept it pinned or borrowed (the store keeps
    # a freed segment up to 0.5 s for reuse).
    assert ray.get(ordinary.remote(41), timeout=GET_TIMEOUT_S) == 42
    ledger = runtime.current().ledger
    assert wait_until(lambda: ledger.statistics()["leases"] == 0, timeout=30), ledger.statistics()
    del big, first, later
    root = os.environ["MINIRAY_TMPDIR"]
    assert wait_until(lambda: not _root_segments(root), timeout=30), _root_segments(root)


# ----------------------------------------------------------------------------- beyond the table
KIND_FAULTS = ["raise", "segfault", "sys_exit", "arg_fails_to_unpickle", "unpicklable_result",
               "result_fails_to_unpickle", "memory_error"]


@pytest.mark.parametrize("kind", KIND_FAULTS)
@pytest.mark.parametrize("actor_kind", ["threaded", "async"])
def test_fault_in_threaded_and_async_actors(ray, row_bound, tmp_path, actor_kind, kind):
    """A method on a pool thread (``max_concurrency=2``) or on the event loop gives what a
    plain method gives. Compared with Ray 2.60: the same in every case but one, ``sys.exit()``
    in an ``async def`` method, where Ray's ``get`` never returns (the call and the next one
    time out); miniray ends the actor as for any other method."""
    expect = METHOD[kind]
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    if actor_kind == "threaded":
        actor, cls_name = MethodFault.options(max_concurrency=2).remote(big), "MethodFault"
    else:
        actor, cls_name = AsyncMethodFault.remote(big), "AsyncMethodFault"
    try:
        assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S) == "pong"
        run_kind, arg = _arguments(kind)
        outcome, error = _outcome(lambda: ray.get(actor.run.remote(run_kind, counter, big, arg),
                                                  timeout=GET_TIMEOUT_S))
        assert outcome == "error", error
        _check_error(error, Expect(expect.raises, expect.name, [
            piece.replace("MethodFault", cls_name) for piece in expect.match]))
        outcome, value = _outcome(lambda: ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S))
        if expect.later == "pong":
            assert (outcome, value) == ("value", "pong")
        else:
            assert outcome == "error" and isinstance(value, expect.later), value
        assert _runs(counter) == expect.runs
    finally:
        ray.kill(actor)
    assert ray.get(ordinary.remote(41), timeout=GET_TIMEOUT_S) == 42


def test_sys_exit_in_a_task_is_a_crash_without_retries_when_max_retries_is_0(ray, tmp_path):
    """``sys.exit()`` ends the worker: with ``max_retries=0`` the first exit fails the task
    with WorkerCrashedError (compared with Ray 2.60: same type, one run)."""
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    ref = task_fault.options(max_retries=0).remote("sys_exit_3", counter, big)
    with pytest.raises(WorkerCrashedError, match="exited with code 3"):
        ray.get(ref, timeout=GET_TIMEOUT_S)
    assert _runs(counter) == 1
    assert ray.get(ordinary.remote(1), timeout=GET_TIMEOUT_S) == 2


def test_sys_exit_in_an_actor_method_restarts_it_while_max_restarts_allows(ray, tmp_path):
    """The actor's process exits: with ``max_restarts=1`` its constructor runs again and the
    next call works; the call that exited fails with ActorUnavailableError (no task retries),
    and calls already sent to that process with it. Compared with Ray 2.60: the same types
    (Ray says "UnexpectedSystemExit" for the first call and "The actor was restarted" for the
    ones behind it)."""
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    actor = MethodFault.options(max_restarts=1).remote(big)
    assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S) == "pong"
    exiting = actor.run.remote("sys_exit", counter, big)
    behind = [actor.ping.remote() for _ in range(3)]
    with pytest.raises(ActorUnavailableError, match="exited with code 0"):
        ray.get(exiting, timeout=GET_TIMEOUT_S)
    for ref in behind:  # sent to the process that exited (calls are pipelined), or run after
        outcome, value = _outcome(lambda ref=ref: ray.get(ref, timeout=GET_TIMEOUT_S))
        assert value == "pong" or isinstance(value, ActorUnavailableError), value
    assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S) == "pong"
    assert _runs(counter) == 1
    ray.kill(actor)


def test_sys_exit_in_a_threaded_actor_ends_the_actor(ray, tmp_path):
    """With ``max_concurrency > 1`` the method runs on a pool thread; ``sys.exit()`` there
    still ends the actor's process."""
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    actor = MethodFault.options(max_concurrency=2).remote(big)
    with pytest.raises(ActorDiedError, match="exited with code 3"):
        ray.get(actor.run.remote("sys_exit_3", counter, big), timeout=GET_TIMEOUT_S)
    with pytest.raises(ActorDiedError):
        ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S)


def test_sys_exit_says_so_on_the_drivers_stderr(ray, tmp_path, capfd):
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    ref = task_fault.options(max_retries=0).remote("sys_exit", counter, big)
    with pytest.raises(WorkerCrashedError):
        ray.get(ref, timeout=GET_TIMEOUT_S)
    seen = []
    assert wait_until(lambda: seen.append(capfd.readouterr().err)
                      or "sys.exit() in task task_fault" in "".join(seen), timeout=30), seen


def test_keyboard_interrupt_in_a_constructor_reads_as_a_cancelled_creation_task(ray, tmp_path):
    """Compared with Ray 2.60: ActorDiedError whose creation-task error ends with
    ``TaskCancelledError: Task: TaskID(<ffffffffffffffff + actor id>) was cancelled.``"""
    big = ray.put(b"x" * BIG)
    actor = ConstructorFault.remote("keyboard_interrupt", str(tmp_path / "runs"), big)
    with pytest.raises(ActorDiedError) as info:
        ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S)
    text = str(info.value)
    assert "creation task" in text and "KeyboardInterrupt: interrupted" in text
    creation_task = "ff" * 8 + actor._actor_id_hex()  # Ray's creation task id
    assert f"TaskCancelledError: Task: TaskID({creation_task}) was cancelled." in text


@pytest.mark.parametrize("where", ["task", "actor method"])
def test_keyboard_interrupt_in_a_call_reads_as_a_cancelled_task(ray, tmp_path, where):
    """A KeyboardInterrupt raised in a task or method comes back as
    ``RayTaskError(TaskCancelledError)``, as in Ray 2.60 (which cancels with it), not as a
    KeyboardInterrupt that ``get()`` would raise in the driver like Ctrl-C. Not retried, and
    an actor lives on."""
    counter = str(tmp_path / "runs")
    big = ray.put(b"x" * BIG)
    actor = None
    if where == "task":
        ref = task_fault.options(retry_exceptions=True).remote("keyboard_interrupt", counter,
                                                               big)
    else:
        actor = MethodFault.remote(big)
        ref = actor.run.remote("keyboard_interrupt", counter, big)
    outcome, error = _outcome(lambda: ray.get(ref, timeout=GET_TIMEOUT_S))
    assert outcome == "error", error
    assert type(error).__name__ == "RayTaskError(TaskCancelledError)"
    assert isinstance(error, TaskCancelledError) and not isinstance(error, KeyboardInterrupt)
    assert "was cancelled" in str(error) and "KeyboardInterrupt: interrupted" in str(error)
    assert _runs(counter) == 1
    if actor is not None:
        assert ray.get(actor.ping.remote(), timeout=GET_TIMEOUT_S) == "pong"
        ray.kill(actor)


@miniray.remote(num_returns=2)
def two_returns(unpicklable_first: bool):
    big, lock = b"y" * BIG, threading.Lock()
    return (lock, big) if unpicklable_first else (big, lock)


def test_returns_before_an_unpicklable_one_are_kept(ray):
    """Of several returns, those before the first that cannot be pickled are kept and the
    rest fail, as in Ray 2.60 (compared: ``(big, lock)`` gives the bytes then
    ``RayTaskError(TypeError)``; ``(lock, big)`` two errors). Before, every return failed and
    the segment already written for the first stayed in /dev/shm until shutdown."""
    root = os.environ["MINIRAY_TMPDIR"]
    first, second = two_returns.remote(False)
    assert ray.get(first, timeout=GET_TIMEOUT_S) == b"y" * BIG
    with pytest.raises(TypeError, match="return value 1 of two_returns"):
        ray.get(second, timeout=GET_TIMEOUT_S)
    refs = two_returns.remote(True)
    for ref in refs:
        with pytest.raises(TypeError, match="return value 0 of two_returns"):
            ray.get(ref, timeout=GET_TIMEOUT_S)
    del first, second, refs
    # Every segment written was handed over, so freeing the refs frees them (the store keeps
    # a freed segment up to 0.5 s for reuse).
    assert wait_until(lambda: not _root_segments(root), timeout=30), _root_segments(root)


MIB = 1 << 20


@miniray.remote
def spilled_fault(kind, counter, blob):
    assert len(blob) == 20 * MIB
    _count_run(counter)
    return fault(kind)


def test_failures_with_spilled_arguments_leave_no_spill_file(ray_start, row_bound, tmp_path,
                                                             monkeypatch):
    """A session root in /dev/shm spills to the shared spill root
    (``$TMPDIR/miniray-spill-<uid>/<session>``). Calls whose argument was spilled fail in
    each way, the runtime goes on, and after shutdown neither the root, nor the session's spill
    folder, nor any other entry of this test is left (the leak check, run here on this
    root)."""
    import tempfile

    from . import conftest

    root = tempfile.mkdtemp(prefix="mrfm-", dir="/dev/shm")
    monkeypatch.setenv("MINIRAY_TMPDIR", root)
    try:
        before = conftest.outside_snapshot()
        ctx = ray_start(num_cpus=2, object_store_memory=80 * MIB)  # Ray's minimum is 75 MiB
        store = runtime.current().owner.store
        assert store.spill_dir.startswith(conftest.spill_root() + os.sep), store.spill_dir
        refs = [miniray.put(bytes([i]) * (20 * MIB)) for i in range(6)]  # 120 MiB, 80 MiB cap
        assert store.statistics()["bytes_spilled"] > 0, store.statistics()
        counter = str(tmp_path / "runs")
        expected = {"raise": ValueError, "exit1": WorkerCrashedError,
                    "sys_exit": WorkerCrashedError, "memory_error": MemoryError,
                    "result_fails_to_unpickle": RaySystemError}
        for ref, (kind, error) in zip(refs, expected.items()):
            call = spilled_fault.options(max_retries=1).remote(kind, counter, ref)
            with pytest.raises(error):
                miniray.get(call, timeout=GET_TIMEOUT_S)
        assert miniray.get(ordinary.remote(1), timeout=GET_TIMEOUT_S) == 2
        del refs, call
        conftest.shutdown_and_check(root, extra_sessions=[ctx["session_dir"]], before=before)
        assert not os.path.exists(os.path.join(conftest.spill_root(),
                                               os.path.basename(ctx["session_dir"])))
    finally:
        shutil.rmtree(root, ignore_errors=True)
