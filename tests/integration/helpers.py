"""Helpers the integration tests share: polling, finding a root's processes, a stand-in NVML.
"""

from __future__ import annotations

import os
import time

from miniray._private import procinfo


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy or ``timeout`` passes; returns its
    last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def procs_with_root(root: str) -> list[int]:
    """Live processes (other than this one) whose environment has ``MINIRAY_TMPDIR=<root>``."""
    needle = f"MINIRAY_TMPDIR={root}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        if needle in entries and procinfo.is_alive(int(name)):
            found.append(int(name))
    return found


# Written as pynvml.py into a folder put on the PYTHONPATH of the processes under test: they
# find it the way they would find the real one, so production code needs no test hook.
FAKE_PYNVML = '''
"""A stand-in for pynvml in tests: devices come from FAKE_NVML_DEVICES ("name|uuid,...")."""
import os

_DEVICES = [d.split("|") for d in os.environ.get("FAKE_NVML_DEVICES", "").split(",") if d]


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_DEVICES)


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return _DEVICES[handle][0]


def nvmlDeviceGetUUID(handle):
    return _DEVICES[handle][1]
'''
