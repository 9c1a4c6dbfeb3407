"""GPU detection through the real pynvml, on a host with at least one NVIDIA GPU.

Every test is marked ``gpu`` and the module skips cleanly unless ``pynvml`` imports and NVML
reports at least one device. Runtime-level GPU tests (assignment, CUDA_VISIBLE_DEVICES in
workers, fractional sharing, memory release) live with the runtime's tests.
"""

from __future__ import annotations

import os
import warnings

import pytest

from miniray._private.ledger.gpu_detect import detect_gpus
from miniray._private.ledger.host_gpus import HostGpuLedger


def _real_device_count() -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except Exception:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        pynvml.nvmlShutdown()


REAL_GPUS = _real_device_count()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(REAL_GPUS < 1, reason="needs pynvml and at least one NVIDIA GPU"),
]


def test_detection_through_pynvml():
    inv = detect_gpus(cuda_visible_devices=None)
    assert inv.count == inv.physical_count == REAL_GPUS >= 1
    assert inv.ids == [str(i) for i in range(inv.count)] and inv.ids_are_ints
    assert inv.accelerator_type  # e.g. "H100"
    assert all(inv.names) and all(inv.device_keys)
    assert all(u.startswith(("GPU-", "MIG-")) for u in inv.uuids), inv.uuids
    assert len(set(inv.device_keys)) == inv.count


def test_cuda_visible_devices_by_index_and_by_uuid_name_the_same_device():
    full = detect_gpus(cuda_visible_devices=None)
    last = str(full.count - 1)
    by_index = detect_gpus(cuda_visible_devices=last)
    by_uuid = detect_gpus(cuda_visible_devices=full.uuids[-1])
    assert (by_index.count, by_index.ids, by_index.ids_are_ints) == (1, [last], False)
    assert by_index.device_keys == by_uuid.device_keys == [full.device_keys[-1]]
    assert by_uuid.ids == [full.uuids[-1]]


def test_real_devices_are_exclusive_between_two_host_ledgers(tmp_path):
    keys = detect_gpus(cuda_visible_devices=None).device_keys
    a, b = HostGpuLedger(str(tmp_path)), HostGpuLedger(str(tmp_path))
    got = a.acquire_whole(keys, len(keys), holder_pid=os.getpid(), tag="a")
    assert got is not None
    assert b.wait_acquire_whole(keys, 1, holder_pid=os.getpid(), timeout=0.1) is None
    assert a.release(got[0])
    assert b.acquire_whole(keys, 1, holder_pid=os.getpid()) is not None
    a.close()
    b.close()


# ----------------------------------------------------------------- the runtime on real GPUs
def _torch_cuda():
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


needs_torch = pytest.mark.skipif(_torch_cuda() is None, reason="needs PyTorch with CUDA")


def _processes_on_gpus() -> set:
    import pynvml

    pynvml.nvmlInit()
    try:
        pids = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                pids.add(proc.pid)
        return pids
    finally:
        pynvml.nvmlShutdown()


@needs_torch
def test_a_task_allocates_on_exactly_its_assigned_device(ray_start):
    import miniray

    ray_start(num_cpus=2)
    assert miniray.cluster_resources()["GPU"] == REAL_GPUS

    @miniray.remote(num_gpus=1)
    def allocate():
        import torch

        tensor = torch.ones(1024, 1024, device="cuda")
        return (miniray.get_gpu_ids(), os.environ["CUDA_VISIBLE_DEVICES"],
                torch.cuda.device_count(), float(tensor.sum()))

    ids, cvd, visible, total = miniray.get(allocate.remote())
    assert len(ids) == 1 and cvd == str(ids[0])
    assert visible == 1  # the worker sees exactly its device
    assert total == 1024 * 1024


@needs_torch
def test_fractional_tasks_share_one_device(ray_start):
    import miniray

    ray_start(num_cpus=2)

    @miniray.remote(num_gpus=0.5)
    def share():
        import time

        import torch

        tensor = torch.zeros(256, device="cuda")
        time.sleep(1.0)
        return miniray.get_gpu_ids(), int(tensor.numel())

    results = miniray.get([share.remote() for _ in range(2)])
    assert results[0][0] == results[1][0]  # packed on one device
    assert all(n == 256 for _, n in results)


@needs_torch
def test_gpu_memory_is_released_after_a_default_gpu_task(ray_start):
    import miniray

    ray_start(num_cpus=2)

    @miniray.remote(num_gpus=1)
    def leak():
        import torch

        global KEEP
        KEEP = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        return os.getpid()

    pid = miniray.get(leak.remote())
    import time

    deadline = time.monotonic() + 10
    while pid in _processes_on_gpus() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in _processes_on_gpus(), "the GPU task's process still holds GPU memory"
