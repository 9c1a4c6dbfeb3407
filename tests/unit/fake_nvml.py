"""A test double for the ``pynvml`` module, passed to ``gpu_detect.detect_gpus(nvml=...)``.

It implements the calls of ``gpu_detect.NvmlBackend`` (and the two optional MIG calls) over a
list of fake devices, records every call, and can be told to fail any call the way NVML fails
(raising ``NVMLError``). It lives with the tests: production code has no hook to reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class NVMLError(Exception):
    """What pynvml raises (its NVMLError subclasses carry a return code)."""


@dataclass
class FakeDevice:
    name: str | bytes
    uuid: str | bytes
    migs: list[str] = field(default_factory=list)  # MIG instance UUIDs ("MIG-...")


def devices(n: int, name: str = "NVIDIA H100 80GB HBM3") -> list[FakeDevice]:
    """``n`` devices of one model with UUIDs ``GPU-0000...-<i>``."""
    return [FakeDevice(name, f"GPU-00000000-0000-0000-0000-00000000000{i}") for i in range(n)]


class FakeNvml:
    """Module-like NVML: ``FakeNvml(devices(4))``; ``fail={"nvmlInit"}`` makes a call raise."""

    def __init__(self, devs: list[FakeDevice] | None = None, *, fail=()):
        self.devs = list(devs or [])
        self.fail = set(fail)
        self.calls: list[str] = []
        self.initialized = 0  # nvmlInit calls not yet matched by nvmlShutdown

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise NVMLError(f"fake failure in {name}")
        if name not in ("nvmlInit", "nvmlShutdown") and self.initialized <= 0:
            raise NVMLError("NVML Shared Library Not Initialized")

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devs)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devs):
            raise NVMLError("Invalid Argument")
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle):
        self._enter("nvmlDeviceGetName")
        return self.devs[handle[1]].name

    def nvmlDeviceGetUUID(self, handle):
        self._enter("nvmlDeviceGetUUID")
        if handle[0] == "mig":
            return self.devs[handle[1]].migs[handle[2]]
        return self.devs[handle[1]].uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return 7 if self.devs[handle[1]].migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index: int):
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        if index >= len(self.devs[handle[1]].migs):
            raise NVMLError("Not Found")  # an empty MIG slot
        return ("mig", handle[1], index)
