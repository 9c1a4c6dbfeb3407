"""Run every cell of the fault matrix under Ray or miniray and print what each gives.

The table in ``tests/integration/test_fault_matrix.py`` was recorded with it::

    <ray venv>/bin/python compat_tests/fault_matrix_probe.py ray
    MINIRAY_TMPDIR=$(mktemp -d) python compat_tests/fault_matrix_probe.py miniray

A cell is a fault (raise, ``os._exit(1)``, SIGKILL or SIGSEGV from inside, an argument that
cannot be pickled or that fails to unpickle in the worker, a result that cannot be pickled or
that fails to unpickle in the driver, ``sys.exit()``, ``sys.exit(3)``, ``MemoryError``) in a
task, an actor method or an actor constructor. For each, one JSON line: what ``.remote()`` or
``get`` raised (type, bases, message), how often the user code ran, what the actor's next
call gave, and whether an ordinary task still ran afterwards. Extra arguments select cells by
context (``task``, ``method``, ``ctor``), fault, or ``<context>-<fault>``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import tempfile
import threading
import time

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("ray", "miniray"):
        sys.exit("usage: fault_matrix_probe.py ray|miniray [cell ...]")
    LIBRARY = sys.argv[1]
    SELECTED = set(sys.argv[2:])
    if LIBRARY == "ray":
        import ray
    else:
        import miniray as ray
else:  # imported (by pytest's collection, say): define nothing that needs a library
    ray = None

COUNT_DIR = tempfile.mkdtemp(prefix="fault-matrix-")
FAULTS = ["raise", "exit1", "sigkill", "segfault", "unpicklable_arg", "arg_fails_to_unpickle",
          "unpicklable_result", "result_fails_to_unpickle", "sys_exit", "sys_exit_3",
          "memory_error"]


def _count_run(tag: str) -> None:
    with open(os.path.join(COUNT_DIR, tag), "a") as f:
        f.write("x")


def _runs(tag: str) -> int:
    try:
        with open(os.path.join(COUNT_DIR, tag)) as f:
            return len(f.read())
    except FileNotFoundError:
        return 0


def _explode():
    raise RuntimeError("cannot rebuild this object")


class Unloadable:
    def __reduce__(self):
        return (_explode, ())


def fault(kind: str):
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
    if kind == "unpicklable_result":
        return threading.Lock()
    if kind == "result_fails_to_unpickle":
        return Unloadable()
    return "done"


def describe(error: BaseException) -> dict:
    return {"type": type(error).__name__,
            "mro": [c.__name__ for c in type(error).__mro__][:6],
            "message": str(error)[:1200]}


def outcome(call) -> dict:
    try:
        return {"value": repr(call())}
    except BaseException as error:  # noqa: BLE001 - SystemExit too: that is the point
        return describe(error)


def main() -> None:
    @ray.remote
    def task(kind, tag, arg=None):
        _count_run(tag)
        return fault(kind)

    @ray.remote
    class Method:
        def run(self, kind, tag, arg=None):
            _count_run(tag)
            return fault(kind)

        def ping(self):
            return "pong"

    @ray.remote
    class Ctor:
        def __init__(self, kind, tag, arg=None):
            _count_run(tag)
            self.kept = fault(kind)

        def ping(self):
            return "pong"

    @ray.remote
    def ordinary():
        return 42

    def cell(where: str, kind: str) -> dict:
        tag = f"{where}-{kind}"
        run_kind, arg = kind, None
        if kind == "unpicklable_arg":
            run_kind, arg = "nothing", threading.Lock()
        elif kind == "arg_fails_to_unpickle":
            run_kind, arg = "nothing", Unloadable()
        row = {"cell": tag}
        started = time.monotonic()
        actor = None
        try:
            if where == "task":
                ref = task.remote(run_kind, tag, arg)
                row["get"] = outcome(lambda: ray.get(ref, timeout=90))
            else:
                if where == "method":
                    actor = Method.remote()
                    ray.get(actor.ping.remote(), timeout=60)
                    ref = actor.run.remote(run_kind, tag, arg)
                else:
                    actor = Ctor.remote(run_kind, tag, arg)
                    ref = actor.ping.remote()
                row["get"] = outcome(lambda: ray.get(ref, timeout=90))
                row["next_call"] = outcome(lambda: ray.get(actor.ping.remote(), timeout=30))
        except BaseException as error:  # noqa: BLE001 - refused at .remote()
            row["submit"] = describe(error)
        finally:
            if actor is not None:
                ray.kill(actor)
        row["runs"] = _runs(tag)
        row["ordinary_task_after"] = outcome(lambda: ray.get(ordinary.remote(), timeout=60))
        row["seconds"] = round(time.monotonic() - started, 1)
        return row

    if LIBRARY == "ray":
        ray.init(num_cpus=2, include_dashboard=False)
    else:
        ray.init(num_cpus=2)
    try:
        for where in ("task", "method", "ctor"):
            for kind in FAULTS:
                if SELECTED and not SELECTED & {where, kind, f"{where}-{kind}"}:
                    continue
                print(json.dumps(cell(where, kind)), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
