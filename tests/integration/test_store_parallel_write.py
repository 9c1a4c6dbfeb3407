"""Large first writes of the store on several threads (``object_store/parallel_write.py``),
forced with ``MINIRAY_STORE_WRITE_THREADS`` (this machine's CPUs alone would pick ``pwritev``):
a driver's put and an actor's result round-trip byte for byte, and a tmpfs too small for the
object answers the store's "full" error with nothing left in it."""

from __future__ import annotations

import os

import numpy as np

import miniray
from miniray._private.object_store import parallel_write

from .helpers import run_on_own_tmpfs

MIB = 1 << 20


def test_put_and_actor_result_round_trip_through_threaded_writes(ray_start, monkeypatch):
    monkeypatch.setenv("MINIRAY_STORE_WRITE_THREADS", "4")  # the workers inherit it
    calls = []
    real = parallel_write.write_threaded
    monkeypatch.setattr(parallel_write, "write_threaded",
                        lambda *a: calls.append(a[3]) or real(*a))
    ray_start(num_cpus=1)
    ray = miniray
    value = np.random.default_rng(3).random(5 * MIB + 3)  # 40 MiB and 24 bytes
    got = ray.get(ray.put({"x": value, "tail": value[-1000:]}))
    assert calls == [4]
    assert np.array_equal(got["x"], value) and np.array_equal(got["tail"], value[-1000:])
    del got

    @ray.remote
    class Maker:
        def __init__(self):
            self.calls = []
            real = parallel_write.write_threaded

            def spy(*args):
                self.calls.append(args[3])
                return real(*args)

            parallel_write.write_threaded = spy

        def make(self, n):
            return np.arange(n, dtype=np.int64)

        def seen(self):
            return self.calls

    maker = Maker.remote()
    n = 5 * MIB + 11
    made = ray.get(maker.make.remote(n))
    assert made.shape == (n,) and made[0] == 0 and made[-1] == n - 1
    assert np.array_equal(made, np.arange(n, dtype=np.int64))
    assert ray.get(maker.seen.remote()) == [4]
    del made
    ray.kill(maker)


INNER = """
import json, os, sys
import numpy as np
from miniray._private.object_store import shm_segments
from miniray.exceptions import ObjectStoreFullError

shm = os.environ["MINIRAY_SHM_DIR"]
out = {}
for threads in ("4", "0"):
    os.environ["MINIRAY_STORE_WRITE_THREADS"] = threads
    try:
        shm_segments.create_segment("abcdef0123456789", os.urandom(28), np.ones(6 << 20),
                                    shm_dir=shm)  # 48 MiB into a 40 MiB tmpfs
        out[threads] = "written"
    except ObjectStoreFullError as error:
        out[threads] = str(error)
    out[threads + "_left"] = sorted(os.listdir(shm))
    out[threads + "_used_kib"] = (os.statvfs(shm).f_blocks - os.statvfs(shm).f_bfree) * \\
        os.statvfs(shm).f_frsize // 1024
print(json.dumps(out))
"""


def test_a_full_tmpfs_is_the_store_full_error_with_nothing_left(session_root, drivers,
                                                                 tmp_path):
    mount_point, seen = run_on_own_tmpfs(drivers, tmp_path, "small-shm", "size=40m", INNER,
                                         timeout=120)
    for threads in ("4", "0"):  # threaded (fallocate's ENOSPC) and pwritev alike
        assert seen[threads].startswith("No room in " + str(mount_point)), seen
        assert seen[threads + "_left"] == [], seen
        assert seen[threads + "_used_kib"] == 0, seen
    assert os.listdir(mount_point) == []  # the mount went with the namespace
