"""The object store on a tmpfs mounted with ``huge=within_size`` (README: "Large objects
in huge pages"): large objects, a put's and a task's result, live in 2 MiB pages and are
mapped that way; small ones take no more than their own 4 KiB pages (a 512 KiB one, not 2 MiB).

The tmpfs is mounted in a mount namespace of the test's own (``unshare -m``, or ``-r -m``
where user namespaces are allowed), so nothing is mounted on the machine: it goes when the
driver inside exits. Skipped, with the reason, where neither works."""

from __future__ import annotations

from .helpers import run_on_own_tmpfs

INNER = """
import json, os, sys
import numpy as np
import miniray as ray

shm = os.environ["MINIRAY_SHM_DIR"]


def pmd_mapped_kib():
    # ShmemPmdMapped of this process's mappings of files in the store's directory.
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = len(head) >= 6 and head[5].startswith(shm + "/")
            elif inside and line.startswith("ShmemPmdMapped:"):
                total += int(head[1])
    return total


def used_kib():
    st = os.statvfs(shm)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024


ray.init(num_cpus=1)
before = used_kib()
small = ray.put(np.ones(512 << 10, dtype=np.uint8))  # 512 KiB: a segment, not inline
small_kib = used_kib() - before
big = np.arange(2 << 20, dtype=np.int64)  # 16 MiB
put = ray.get(ray.put(big))
equal = bool((put == big).all())  # every page of it read
after_put = pmd_mapped_kib()


@ray.remote
def make(n):
    return np.full(n, 7, dtype=np.int64)


made = ray.get(make.remote(2 << 20))
equal = equal and bool((made == 7).all()) and int(ray.get(small).sum()) == 512 << 10
after_task = pmd_mapped_kib()
del put, made, small
ray.shutdown()
print(json.dumps({"equal": equal, "small_kib": small_kib, "after_put": after_put,
                  "after_task": after_task, "left": sorted(os.listdir(shm))}))
"""


def test_large_objects_live_in_huge_pages_and_small_ones_do_not(session_root, drivers,
                                                                tmp_path):
    mount_point, seen = run_on_own_tmpfs(drivers, tmp_path, "huge-shm",
                                         "huge=within_size,size=256m", INNER, timeout=180)
    assert seen["equal"]
    assert seen["after_put"] >= 12 << 10, seen  # most of the 16 MiB put in 2 MiB pages
    assert seen["after_task"] - seen["after_put"] >= 12 << 10, seen  # the task's result too
    assert 512 <= seen["small_kib"] < 1024, seen  # its own pages, not a 2 MiB one
    assert seen["left"] == [], seen  # nothing left in the store's directory
