"""``miniray run --ray``: a program written with ``import miniray as ray`` runs on Ray.

CI has no Ray, so a fake ``ray`` package in tmp_path records what the program imported and
called; its ``run_in_worker`` starts a Python process the way Ray's raylet starts a worker
(same environment, fresh interpreter) that imports a module of the program, which says
``import miniray``. Both must get the fake Ray. One test runs real Ray 2.60 when
``MINIRAY_TEST_RAY_PYTHON`` names an interpreter that has it (``benchmarks/setup_ray_venv.sh``
builds one; miniray's own dependencies must be installed there too), and is skipped with the
reason otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

import miniray
from miniray._private.host import procinfo

from .conftest import MINIRAY_PARENT
from .helpers import wait_until

RAY_PYTHON_ENV = "MINIRAY_TEST_RAY_PYTHON"

FAKE_RAY = '''
"""A stand-in for Ray: records each import and call in $FAKE_RAY_LOG."""
import os, subprocess, sys
__version__ = "2.60.0"
def _record(text):
    with open(os.environ["FAKE_RAY_LOG"], "a") as log:
        log.write(f"{os.getpid()} {text}\\n")
_record("import ray")
def init(**kwargs):
    _record(f"init {sorted(kwargs.items())}")
def run_in_worker(module, function):
    """What Ray's worker does with a function defined in a module of the program."""
    code = f"import {module}; print({module}.{function}())"
    return subprocess.run([sys.executable, "-c", code], env=os.environ, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()
'''

PROGRAM = '''
import miniray as ray
import miniray.util
from miniray.util import queue
from miniray import exceptions
import helper

ray.init(num_cpus=1)
print("driver:", ray.__name__, miniray.util.__name__, queue.WHO, exceptions.WHO,
      ray.__file__.startswith(os.environ["FAKE_RAY_DIR"]))
print("worker:", ray.run_in_worker("helper", "where"))
print("driver pid:", os.getpid())
try:
    import miniray._private.runtime
except ModuleNotFoundError as error:
    print("no miniray internals:", error.name)
'''

HELPER = '''
import os
import sys

import miniray


def where():
    return f"{miniray.__name__} {os.getpid()} {os.environ.get('MINIRAY_ON_RAY')}"
'''


def _fake_ray(tmp_path):
    root = tmp_path / "fake"
    package = root / "ray"
    (package / "util").mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_RAY))
    (package / "util" / "__init__.py").write_text("WHO = 'ray.util'\n")
    (package / "util" / "queue.py").write_text("WHO = 'ray.util.queue'\n")
    (package / "exceptions.py").write_text("WHO = 'ray.exceptions'\n")
    return root


def _program(tmp_path):
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "main.py").write_text("import os\n" + textwrap.dedent(PROGRAM))
    (folder / "helper.py").write_text(textwrap.dedent(HELPER))
    return folder


def _env(tmp_path, *path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [MINIRAY_PARENT])
    env.pop("MINIRAY_ON_RAY", None)
    env.pop("MINIRAY_RAY_ALIAS", None)
    return env


def test_run_ray_maps_miniray_to_ray_in_driver_and_worker(tmp_path):
    fake = _fake_ray(tmp_path)
    program = _program(tmp_path)
    log = tmp_path / "ray.log"
    env = _env(tmp_path, fake, program)
    env.update(FAKE_RAY_LOG=str(log), FAKE_RAY_DIR=str(fake))
    for argv in (["main.py", "arg1"], ["-m", "main", "arg1"]):
        log.write_text("")
        proc = subprocess.run([sys.executable, "-m", "miniray", "run", "--ray", *argv],
                              cwd=str(program), env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = proc.stdout.splitlines()
        assert "driver: ray ray.util ray.util.queue ray.exceptions True" in lines, proc.stdout
        worker = [line for line in lines if line.startswith("worker: ")]
        assert len(worker) == 1, proc.stdout
        name, pid, flag = worker[0].split()[1:]
        assert (name, flag) == ("ray", "1")
        assert f"driver pid: {pid}" not in lines, "the worker stand-in ran in the driver"
        assert "no miniray internals: miniray._private" in lines, proc.stdout
        records = log.read_text().splitlines()
        # Ray was imported once in the driver and once in the worker, and init() was called.
        assert [r.split(" ", 1)[1] for r in records] == [
            "import ray", "init [('num_cpus', 1)]", "import ray"], records
        assert not (tmp_path / "mr").exists() or not any((tmp_path / "mr").iterdir())


def test_run_ray_without_ray_says_how_to_install(tmp_path):
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is importable here, so its absence cannot be shown")
    program = _program(tmp_path)
    before = set(os.listdir(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "miniray", "run", "--ray", "main.py"],
                          cwd=str(program), env=_env(tmp_path, program), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # one line, no traceback
    assert 'pip install "ray[default]==2.60.0"' in proc.stderr
    assert set(os.listdir(tmp_path)) == before
    assert not (tmp_path / "mr").exists()


def test_init_with_ray_url_names_both_commands():
    with pytest.raises(NotImplementedError) as info:
        miniray.init(address="ray://head:10001")
    text = str(info.value)
    assert "miniray run --ray" in text
    assert "ray job submit --address http://HEAD:8265 --working-dir . -- python script.py" in text
    assert not miniray.is_initialized()


def _ray_python() -> str:
    python = os.environ.get(RAY_PYTHON_ENV)
    if not python:
        pytest.skip(f"set {RAY_PYTHON_ENV} to a Python with ray 2.60.0 (and miniray's "
                    "dependencies) to run this on real Ray; benchmarks/setup_ray_venv.sh makes one")
    probe = subprocess.run([python, "-c", "import ray, cloudpickle; print(ray.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or probe.stdout.strip() != "2.60.0":
        pytest.skip(f"{RAY_PYTHON_ENV}={python} has no ray 2.60.0 with cloudpickle: "
                    f"{(probe.stdout + probe.stderr).strip()[-300:]}")
    return python


REAL_PROGRAM = '''
import miniray as ray
import helper

ray.init(num_cpus=1, include_dashboard=False)


@ray.remote
def square(x):
    return x * x


@ray.remote
def where():
    return helper.where()


@ray.remote
def fails():
    raise ValueError("on purpose")


print("squares:", sum(ray.get([square.remote(i) for i in range(10)])))
print("worker:", ray.get(where.remote()).split()[0])
try:
    ray.get(fails.remote())
except ray.exceptions.RayTaskError as error:
    print("caught:", type(error).__name__)
print("runtime:", ray.__name__, ray.__version__)
ray.shutdown()
'''


def _session_processes(leader: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()
        if fields[0] not in (b"Z", b"X") and int(fields[3]) == leader:
            found.append(int(name))
    return found


def test_run_ray_on_real_ray(tmp_path):
    python = _ray_python()
    program = _program(tmp_path)
    (program / "main.py").write_text(textwrap.dedent(REAL_PROGRAM))
    # Ray's socket paths must stay short, and Ray writes a token under $HOME: both go to a
    # folder of this test, never to the user's /tmp/ray or ~/.ray.
    scratch = tempfile.mkdtemp(prefix="mr-ray-")
    env = _env(tmp_path, program)
    env.update(RAY_TMPDIR=scratch, HOME=os.path.join(scratch, "home"), RAY_ADDRESS="")
    env.pop("RAY_ADDRESS")
    proc = subprocess.Popen([python, "-m", "miniray", "run", "--ray", "main.py"],
                            cwd=str(program), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    try:
        assert proc.returncode == 0, err[-3000:]
        lines = out.splitlines()
        assert "squares: 285" in lines, out
        assert "worker: ray" in lines, out
        assert "caught: RayTaskError(ValueError)" in lines, out
        assert "runtime: ray 2.60.0" in lines, out
        # Ray's processes may take a moment to exit after shutdown().
        assert wait_until(lambda: not _session_processes(proc.pid), timeout=30.0), (
            f"Ray processes left: {_session_processes(proc.pid)}")
    finally:
        for pid in _session_processes(proc.pid):
            if procinfo.is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)


def test_startup_hook_keeps_the_sitecustomize_it_hides(tmp_path):
    """A process started with ``alias.on_ray_environ`` (as Ray's workers are) has the alias
    from its first line, and the ``sitecustomize`` later on the path still runs."""
    from miniray._private.core import alias

    fake = _fake_ray(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    env = alias.on_ray_environ(_env(tmp_path, fake, site))
    env["FAKE_RAY_LOG"] = str(tmp_path / "ray.log")
    code = ("import os, sys, miniray, miniray.util; "
            "print(miniray.__name__, miniray.util.__name__, os.environ.get('SITE_RAN'), "
            "sys.modules['sitecustomize'].__file__)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    name, util, ran, hook = proc.stdout.split()
    assert (name, util, ran) == ("ray", "ray.util", "yes")
    assert hook == os.path.join(alias.STARTUP_DIR, "sitecustomize.py")
    # Without the flag the folder on PYTHONPATH changes nothing.
    env.pop("MINIRAY_ON_RAY")
    proc = subprocess.run([sys.executable, "-c", "import miniray; print(miniray.__name__)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "miniray", proc.stderr
