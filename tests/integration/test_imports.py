"""The imports real Ray programs make, run as programs (``miniray run`` and plain python).

Ray's libraries outside Ray Core (``ray.data``, ``ray.tune``, ...) raise an ImportError that
says miniray covers Ray Core and how to run the program on Ray, in the driver and in a task;
the small modules and id classes Ray programs use work under the ``ray`` alias. What each
returns was compared with Ray 2.60 in its own virtualenv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

LIBRARY_IMPORTS = [
    ("import ray.data", "ray.data"),
    ("from ray import tune", "ray.tune"),
    ("import ray.train.torch", "ray.train"),
    ("from ray.serve import deployment", "ray.serve"),
    ("import ray.rllib", "ray.rllib"),
    ("import ray.workflow", "ray.workflow"),
    ("import ray.autoscaler", "ray.autoscaler"),
    ("from ray.job_submission import JobSubmissionClient", "ray.job_submission"),
    ("import ray.util.collective as col", "ray.util.collective"),
    ("from ray.util import collective", "ray.util.collective"),
    # Ray imports ray.data, ray.workflow and ray.autoscaler on first attribute access.
    ("ray.data.range(3)", "ray.data"),
    ("ray.workflow", "ray.workflow"),
]


def miniray_run(drivers, source: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m miniray run <script>`` in the drivers' directory and environment."""
    try:
        return subprocess.run([sys.executable, "-m", "miniray", "run", drivers.script(source)],
                              cwd=drivers.tmp_path, env=drivers.env(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"miniray run did not exit within {timeout} s: {error}") from None


def test_ray_libraries_raise_import_error_under_miniray_run(drivers):
    statements = [statement for statement, _ in LIBRARY_IMPORTS]
    done = miniray_run(drivers, f"""
        import json
        import ray
        results = []
        for statement in {statements!r}:
            try:
                exec(statement)
                results.append(["imported", ""])
            except ImportError as error:
                results.append([type(error).__name__, str(error)])
        print(json.dumps(results))
    """)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (statement, name), (kind, text) in zip(LIBRARY_IMPORTS, results):
        assert kind == "ImportError", (statement, kind, text)
        assert text.startswith(f"{name} is not provided by miniray: miniray covers Ray Core only")
        assert "pip install 'ray[" in text and "instead of `miniray run`" in text, text


def test_an_uncaught_library_import_ends_the_program_with_the_message(drivers):
    done = miniray_run(drivers, "import ray\nimport ray.data\nprint('after')\n")
    assert done.returncode == 1 and "after" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ray.data is not provided by miniray"), done.stderr
    assert "pip install 'ray[data]'" in last


def test_a_task_importing_a_library_raises_the_same_import_error(drivers):
    done = miniray_run(drivers, """
        import ray

        @ray.remote
        def uses_data():
            import ray.data  # noqa: F401

        ray.init(num_cpus=1)
        try:
            ray.get(uses_data.remote(), timeout=60)
        except ray.exceptions.RayTaskError as error:
            print("caught", isinstance(error, ImportError), str(error.cause))
        ray.shutdown()
    """)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("caught True ray.data is not provided by miniray"), done.stdout
    assert "instead of `miniray run`" in line


def test_importing_miniray_libraries_says_to_import_ray(drivers):
    done = drivers.run("""
        try:
            import miniray.tune  # noqa: F401
        except ImportError as error:
            print(type(error).__name__, error)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImportError miniray.tune is not provided by"), done.stdout
    assert "pip install 'ray[tune]') and import ray instead of miniray" in done.stdout


def test_small_modules_and_id_classes_work_under_miniray_run(drivers):
    done = miniray_run(drivers, """
        import json
        import ray
        import ray.cloudpickle
        import ray.types
        from ray.util import get_node_instance_id, log_once

        def check():
            ref_hint = ray.types.ObjectRef[int]
            out = {
                "hint": ref_hint.__origin__ is ray.types.ObjectRef,
                "log_once": [log_once("k"), log_once("k")],
                "pickle": ray.cloudpickle.loads(ray.cloudpickle.dumps(lambda: 7))(),
                "method": ray.actor.method is ray.method,
                "instance": get_node_instance_id(),
                "object_id": ray.ObjectID is ray.ObjectRef,
            }
            for name in ("NodeID", "JobID", "TaskID", "ActorID", "ObjectID", "WorkerID",
                         "PlacementGroupID"):
                cls = getattr(ray, name)
                nil = cls.nil()
                out[name] = [cls.size(), nil.hex() == "ff" * cls.size(),
                             cls.from_hex(nil.hex()) == nil, len(nil.binary())]
            return out

        ray.init(num_cpus=1)
        print(json.dumps({"driver": check(), "task": ray.get(ray.remote(check).remote(),
                                                             timeout=60)}))
        ray.shutdown()
    """)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    sizes = {"NodeID": 28, "JobID": 4, "TaskID": 24, "ActorID": 16, "ObjectID": 28,
             "WorkerID": 28, "PlacementGroupID": 18}
    for where in ("driver", "task"):
        out = report[where]
        assert out["hint"] and out["method"] and out["object_id"], (where, out)
        assert out["log_once"] == [True, False] and out["pickle"] == 7, (where, out)
        assert out["instance"] == "", (where, out)
        for name, size in sizes.items():
            assert out[name] == [size, True, True, size], (where, name, out[name])


def test_the_names_rays_documents_import_from_ray_raylet(drivers):
    """Ray's streaming-generator page does ``from ray._raylet import ObjectRefGenerator`` and
    tells a generator apart from a ref with ``isinstance``; in Ray 2.60 each of these names
    is the public package's own class (checked there with the same script). miniray had no
    ``_raylet`` module, so the page's example stopped with ModuleNotFoundError."""
    done = miniray_run(drivers, """
        import json
        import ray
        from ray._raylet import (ActorID, DynamicObjectRefGenerator, JobID, NodeID, ObjectID,
                                 ObjectRef, ObjectRefGenerator, PlacementGroupID,
                                 StreamingObjectRefGenerator, TaskID, WorkerID)

        @ray.remote
        def gen():
            yield 1

        ray.init(num_cpus=1)
        g = gen.remote()
        first = next(g)
        print(json.dumps({
            "same": [ObjectRef is ray.ObjectRef, ObjectID is ray.ObjectRef,
                     ObjectRefGenerator is ray.ObjectRefGenerator,
                     StreamingObjectRefGenerator is ray.ObjectRefGenerator,
                     DynamicObjectRefGenerator is ray.DynamicObjectRefGenerator]
                    + [getattr(ray, c.__name__) is c for c in (
                        ActorID, JobID, NodeID, PlacementGroupID, TaskID, WorkerID)],
            "kinds": [isinstance(g, ObjectRefGenerator), isinstance(first, ObjectRef),
                      isinstance(first, ObjectRefGenerator)],
            "value": ray.get(first)}))
        ray.shutdown()
    """)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"same": [True] * 11, "kinds": [True, True, False], "value": 1}, report


def test_processes_the_program_starts_import_ray_as_miniray_too(drivers):
    """Ray's anti-pattern pages run a ``spawn`` process pool beside Ray; its children import
    the program's main module, ``import ray`` included, again. Under Ray 2.60 (checked with
    the same script) they do; under ``miniray run`` they failed with ModuleNotFoundError and
    the pool broke, since only the driver and its workers had the alias. A Python the
    program or one of its tasks starts now resolves ``ray`` as the driver does."""
    done = miniray_run(drivers, """
        import json
        import multiprocessing
        import subprocess
        import sys
        from concurrent.futures import ProcessPoolExecutor

        import ray

        def child(x):
            return ray.__name__, x + 1

        def python_says():
            return subprocess.run(
                [sys.executable, "-c", "import ray.util; print(ray.util.__name__)"],
                capture_output=True, text=True, timeout=60).stdout.strip()

        if __name__ == "__main__":
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
                pooled = ex.submit(child, 1).result(timeout=60)
            ray.init(num_cpus=1)
            print(json.dumps({"pool": pooled, "driver": python_says(),
                              "task": ray.get(ray.remote(python_says).remote(), timeout=60)}))
            ray.shutdown()
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"pool": ["miniray", 2], "driver": "miniray.util",
                      "task": "miniray.util"}, report


def test_a_program_under_miniray_run_sees_python_s_file_and_traceback(drivers):
    """As ``python script.py`` (Ray's way to run a program): ``__file__`` is absolute,
    ``sys.argv[0]`` as typed, and an uncaught error's traceback starts at the program's
    own frame, with no frame of the launcher or of runpy (a syntax error: the error
    alone); ``sys.exit(n)`` ends it with n. Before, ``__file__`` was the path as typed
    (``dirname`` of it empty) and nine launcher frames came first."""
    script = drivers.script("""
        import os
        import sys

        import ray

        print(os.path.isabs(__file__), os.path.dirname(__file__) == os.getcwd(), sys.argv)
        if sys.argv[1:] == ["exit"]:
            sys.exit(3)
        raise ValueError("boom")
    """)
    broken = drivers.script("x = (\n")

    def run(path, *argv):
        return subprocess.run([sys.executable, "-m", "miniray", "run", path, *argv],
                              cwd=os.path.dirname(script), env=drivers.env(),
                              capture_output=True, text=True, timeout=60)

    name = os.path.basename(script)
    raised, exited, syntax = run(name), run(name, "exit"), run(os.path.basename(broken))
    assert raised.returncode == 1 and raised.stdout == f"True True {[name]}\n", raised
    assert raised.stderr.splitlines() == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 10, in <module>', '    raise ValueError("boom")',
        "ValueError: boom"], raised.stderr
    assert exited.returncode == 3 and exited.stderr == "", exited
    assert syntax.returncode == 1 and syntax.stderr.splitlines()[0] == \
        f'  File "{broken}", line 1' and "SyntaxError: " in syntax.stderr, syntax
