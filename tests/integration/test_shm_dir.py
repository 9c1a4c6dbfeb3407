"""``MINIRAY_SHM_DIR``: every segment of a session, and of a node and its drivers, lands in the
configured directory and nowhere else, and nothing is left there afterwards.

The directory is a fresh one under ``/dev/shm`` (memory-backed, as the setting is meant to be
used by fake hosts); miniray creates it (mode 0700), and each test removes it. The leak checks of
conftest.py and helpers.node_env_for look in it as well as in ``/dev/shm``.
"""

from __future__ import annotations

import os
import shutil
import stat

import numpy as np
import pytest

from miniray._private.core import config
from miniray._private.host import session, shm_domain

from .helpers import cli, driver, json_line, wait_until

BIG = 1 << 20  # 8 MiB of float64: far above the inline threshold


def _fresh_shm_dir() -> str:
    return f"/dev/shm/mr-test-{os.getpid()}-{os.urandom(4).hex()}"


def _segments(place: str, prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(place) if n.startswith(prefix))
    except FileNotFoundError:
        return []


@pytest.fixture
def shm_dir(monkeypatch):
    """A fresh MINIRAY_SHM_DIR under /dev/shm, set before any session starts; removed after
    the session's own leak check (this fixture is set up first, so torn down last)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this host")
    path = _fresh_shm_dir()
    monkeypatch.setenv("MINIRAY_SHM_DIR", path)
    yield path
    left = os.listdir(path) if os.path.isdir(path) else []
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"left in MINIRAY_SHM_DIR {path}: {left}"


def test_a_session_keeps_its_segments_in_the_configured_dir(shm_dir, ray_start, session_root):
    ray = __import__("miniray")
    ray_start(num_cpus=2)
    assert config.shm_dir() == shm_dir
    assert stat.S_IMODE(os.stat(shm_dir).st_mode) == 0o700  # created private
    prefix = "mr_" + session.root_tag(session_root)

    @ray.remote
    def make(n):
        return np.arange(n, dtype=np.float64)

    @ray.remote
    def total(array):
        return float(array.sum())

    @ray.remote
    class Keeper:
        def __init__(self):
            self.kept = None

        def keep(self, array):
            self.kept = array
            return array.nbytes

        def give(self):
            return self.kept * 2

    put_ref = ray.put(np.ones(BIG))
    made = make.remote(BIG)
    keeper = Keeper.remote()
    assert ray.get(total.remote(put_ref)) == float(BIG)
    assert ray.get(made)[-1] == BIG - 1
    assert ray.get(keeper.keep.remote(made)) == BIG * 8
    assert ray.get(keeper.give.remote())[1] == 2.0
    assert ray.get([make.remote(3) for _ in range(4)])[0].tolist() == [0.0, 1.0, 2.0]
    here = _segments(shm_dir, prefix)
    assert len(here) >= 2, f"no segments in {shm_dir}: {os.listdir(shm_dir)}"
    assert _segments("/dev/shm", prefix) == [], "a segment went to /dev/shm instead"
    # The store reports the directory it uses; workers were told the same one.
    from miniray._private import runtime

    assert runtime.current().store.shm_dir == shm_dir
    ray.kill(keeper)
    # Two fake hosts with different directories are different shared-memory domains.
    assert shm_domain.shm_domain_id() != shm_domain.shm_domain_id("/dev/shm")


def test_an_insecure_shm_dir_is_refused_at_init(tmp_path, monkeypatch, session_root):
    import miniray
    from miniray._private.host.same_uid import InsecurePathError

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv("MINIRAY_SHM_DIR", str(open_dir))
    with pytest.raises(InsecurePathError, match="MINIRAY_SHM_DIR"):
        miniray.init(num_cpus=1)
    assert not miniray.is_initialized()
    assert wait_until(lambda: not os.path.isdir(session_root) or not any(
        n.startswith("session_") for n in os.listdir(session_root)))


def test_a_node_and_its_driver_use_the_configured_dir(node_env):
    path = _fresh_shm_dir()
    node_env["MINIRAY_SHM_DIR"] = path  # node_env_for's teardown checks it for segments
    root = node_env["MINIRAY_TMPDIR"]
    prefix = "mr_" + session.root_tag(root)
    try:
        started = cli(node_env, "start", "--head", "--num-cpus", "2", "--port", "0")
        assert started.returncode == 0, started.stderr
        proc = driver(f"""
            import json, os
            import numpy as np
            import miniray as ray
            ray.init(address="auto")

            @ray.remote
            def make(n):
                return np.ones(n)

            @ray.remote
            class Holder:
                def hold(self, array):
                    self.array = array
                    return float(array.sum())

            ref = ray.put(np.zeros({BIG}))
            holder = Holder.options(name="holder", lifetime="detached").remote()
            held = ray.get(holder.hold.remote(make.remote({BIG})))
            print(json.dumps({{"held": held, "zeros": float(ray.get(ref).sum()),
                              "here": sorted(n for n in os.listdir({path!r})
                                             if n.startswith({prefix!r})),
                              "shm": sorted(n for n in os.listdir("/dev/shm")
                                            if n.startswith({prefix!r}))}}))
            ray.kill(holder)
            ray.shutdown()
        """, node_env)
        result = json_line(proc, timeout=60)
        assert proc.wait(30) == 0, proc.stderr.read()
        assert result["held"] == float(BIG) and result["zeros"] == 0.0
        assert result["here"], f"no segment of the session in {path}"
        assert result["shm"] == [], "a segment went to /dev/shm instead"
        assert cli(node_env, "stop").returncode == 0
        assert wait_until(lambda: not _segments(path, prefix), 30.0), _segments(path, prefix)
    finally:
        cli(node_env, "stop", "--force")
        left = os.listdir(path) if os.path.isdir(path) else []
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"left in MINIRAY_SHM_DIR {path}: {left}"
