"""Every example in this folder runs, as a user would run it, and prints what it promises."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# MINIRAY_EXAMPLES_ON_RAY=1 (the tox env ``ray``): the same programs on real Ray, the one that
# says ``import miniray as ray`` through ``miniray run --ray``, the ``import ray`` one unchanged.
ON_RAY = os.environ.get("MINIRAY_EXAMPLES_ON_RAY", "") not in ("", "0")

if ON_RAY:
    CASES = [
        (["-m", "miniray", "run", "--ray", os.path.join(HERE, "quickstart.py")],
         ["sum of squares: 328350", "caught: RayTaskError(ValueError)", "ok"]),
        ([os.path.join(HERE, "ray_program.py")],
         ["fib(10) = 55", "ray is ray"]),
    ]
else:
    CASES = [
        ([os.path.join(HERE, "quickstart.py")],
         ["sum of squares: 328350", "caught: RayTaskError(ValueError)", "ok"]),
        (["-m", "miniray", "run", os.path.join(HERE, "ray_program.py")],
         ["fib(10) = 55", "ray is miniray"]),
    ]


@pytest.mark.parametrize("argv,expected", CASES, ids=["quickstart", "ray_program"])
def test_example(argv, expected, tmp_path, request):
    env = dict(os.environ, MINIRAY_TMPDIR=str(tmp_path / "mr"), PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    if ON_RAY:
        # Ray's session files and its token (~/.ray) go to a short folder of this test.
        ray_dir = tempfile.mkdtemp(prefix="mr-ray-")
        request.addfinalizer(lambda: shutil.rmtree(ray_dir, ignore_errors=True))
        env.update(RAY_TMPDIR=ray_dir, HOME=ray_dir)
    proc = subprocess.run(
        # Run from a scratch folder, so `python -m` imports the installed miniray under tox.
        [sys.executable] + argv, cwd=str(tmp_path), env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for text in expected:
        assert text in proc.stdout, proc.stdout[-3000:]
    root = tmp_path / "mr"
    assert not root.exists() or not any(root.iterdir()), "a session directory was left behind"
