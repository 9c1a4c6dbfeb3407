"""GPU detection through a fake NVML: counts, CUDA_VISIBLE_DEVICES restriction and naming, UUID
and MIG entries, NVML failures (always 0 GPUs, never an error), and Ray 2.60's device-name ->
accelerator type rule. No processes, no GPU."""

from __future__ import annotations

import logging
import sys

import pytest

from miniray._private.ledger.gpu_detect import (
    GpuInventory,
    accelerator_type_from_name,
    detect_gpus,
    parse_visible_devices,
)

from .fake_nvml import FakeDevice, FakeNvml, devices

UUID = [d.uuid for d in devices(4)]

# ------------------------------------------------------------------ name -> accelerator type

# Every row of the surface doc's section 6.1 table (Ray 2.60 outputs), then edge cases of the
# rule the table does not show.
NAMING_TABLE = [
    ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 PCIe", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("Tesla K80", "K80"),
    ("Tesla P100-PCIE-16GB", "P100"),
    ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ("Quadro RTX 8000", "RTX-8000"),
    ("NVIDIA TITAN V", "TITAN-V"),
]
EDGE_CASES = [
    ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("Tesla V100S-PCIE-32GB", "V100S"),  # the model word keeps trailing capitals
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000"),
    ("NVIDIA GeForce RTX 3080 Ti", "GeForce-RTX-3080-Ti"),
    ("NVIDIA GeForce GTX 1080", "GeForce-GTX-1080"),
    ("NVIDIA RTX  PRO 6000", "RTX--PRO-6000"),  # Ray replaces each space, even doubled ones
    ("NVIDIA DGX Display", "DGX-Display"),  # all caps but no digit: the fallback
    ("Tesla 4", "Tesla-4"),  # a one-character model: the fallback (only "NVIDIA " is stripped)
    ("NVIDIA 4", "4"),
    ("NVIDIA", "NVIDIA"),  # one word: nothing to skip; the fallback keeps it
    ("NVIDIA ", None),
    ("", None),
    ("   ", None),
]


@pytest.mark.parametrize("name, expected", NAMING_TABLE + EDGE_CASES)
def test_accelerator_type_from_name(name, expected):
    assert accelerator_type_from_name(name) == expected


def test_accelerator_type_of_none():
    assert accelerator_type_from_name(None) is None


def test_naming_table_types_are_known_constants():
    # Types that ray.util.accelerators names must come out exactly as its constants.
    from miniray.util import accelerators as acc
    from miniray.util.accelerators import accelerators as acc_all

    assert accelerator_type_from_name("Tesla V100-SXM2-16GB") == acc.NVIDIA_TESLA_V100
    assert accelerator_type_from_name("NVIDIA A100-SXM4-40GB") == acc.NVIDIA_A100
    assert accelerator_type_from_name("NVIDIA H100 80GB HBM3") == acc.NVIDIA_H100
    assert accelerator_type_from_name("NVIDIA H200") == acc_all.NVIDIA_H200
    rtx_pro = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert accelerator_type_from_name(rtx_pro) == acc_all.NVIDIA_RTX_PRO_6000


# ------------------------------------------------------------------ CUDA_VISIBLE_DEVICES parsing


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("", []),
        ("  ", []),
        ("NoDevFiles", []),
        ("0", ["0"]),
        ("1,3", ["1", "3"]),
        (" 1 , 3 ,", ["1", "3"]),
        ("GPU-abc,MIG-def", ["GPU-abc", "MIG-def"]),
    ],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


# ------------------------------------------------------------------ detection


@pytest.mark.parametrize("n", [0, 1, 4])
def test_counts_without_cvd(n):
    nvml = FakeNvml(devices(n))
    inv = detect_gpus(nvml, cuda_visible_devices=None)
    assert inv.count == n == inv.physical_count
    assert inv.ids == [str(i) for i in range(n)]
    assert inv.ids_are_ints is True
    assert inv.names == ["NVIDIA H100 80GB HBM3"] * n
    assert inv.uuids == UUID[:n]
    assert inv.device_keys == UUID[:n]
    assert inv.accelerator_type == ("H100" if n else None)
    assert nvml.initialized == 0 and nvml.calls[-1] == "nvmlShutdown"


def test_cvd_restricts_and_names_devices():
    devs = [FakeDevice(f"NVIDIA A100-SXM4-40GB #{i}", UUID[i]) for i in range(4)]
    inv = detect_gpus(FakeNvml(devs), cuda_visible_devices="1,3")
    assert (inv.count, inv.ids, inv.ids_are_ints) == (2, ["1", "3"], False)
    assert inv.names == ["NVIDIA A100-SXM4-40GB #1", "NVIDIA A100-SXM4-40GB #3"]
    assert inv.uuids == [UUID[1], UUID[3]]
    assert inv.device_keys == [UUID[1], UUID[3]]
    assert inv.key_of("3") == UUID[3] and inv.key_of("0") is None
    assert inv.physical_count == 4


def test_cvd_on_a_host_without_gpus_gives_zero():
    # Ray 2.60, observed: CUDA_VISIBLE_DEVICES=3,5 on a host with no GPUs -> 0 GPUs.
    inv = detect_gpus(FakeNvml([]), cuda_visible_devices="3,5")
    assert (inv.count, inv.ids, inv.ids_are_ints) == (0, [], False)
    assert detect_gpus(FakeNvml(fail={"nvmlInit"}), cuda_visible_devices="3,5").count == 0


def test_count_is_capped_at_the_cvd_entries_and_at_the_devices():
    assert detect_gpus(FakeNvml(devices(4)), cuda_visible_devices="2").ids == ["2"]
    inv = detect_gpus(FakeNvml(devices(2)), cuda_visible_devices="0,1,2")
    assert (inv.count, inv.ids) == (2, ["0", "1"])


@pytest.mark.parametrize("value", ["", "NoDevFiles"])
def test_empty_cvd_means_no_devices(value):
    inv = detect_gpus(FakeNvml(devices(4)), cuda_visible_devices=value)
    assert (inv.count, inv.ids, inv.ids_are_ints, inv.accelerator_type) == (0, [], False, None)
    assert inv.physical_count == 4


def test_cvd_uuid_entries_map_by_uuid_and_stay_strings():
    nvml = FakeNvml(devices(4))
    inv = detect_gpus(nvml, cuda_visible_devices=f"{UUID[2]},{UUID[0].upper()}")
    assert inv.ids == [UUID[2], UUID[0].upper()] and inv.ids_are_ints is False
    assert inv.uuids == [UUID[2], UUID[0]]
    assert inv.device_keys == [UUID[2], UUID[0]]
    assert inv.accelerator_type == "H100"


def test_cvd_uuid_prefix_must_be_unique():
    devs = [FakeDevice("Tesla T4", "GPU-aaaa1111"), FakeDevice("Tesla T4", "GPU-aaaa2222")]
    inv = detect_gpus(FakeNvml(devs), cuda_visible_devices="GPU-aaaa2")
    assert inv.device_keys == ["GPU-aaaa2222"]
    inv = detect_gpus(FakeNvml(devs), cuda_visible_devices="GPU-aaaa")  # ambiguous
    assert (inv.count, inv.device_keys, inv.uuids) == (1, [None], [None])


def test_cvd_mig_entries():
    devs = [
        FakeDevice("NVIDIA A100-SXM4-40GB", "GPU-parent0", migs=["MIG-aaaa", "MIG-bbbb"]),
        FakeDevice("NVIDIA A100-SXM4-40GB", "GPU-parent1"),
    ]
    nvml = FakeNvml(devs)
    inv = detect_gpus(nvml, cuda_visible_devices="MIG-bbbb,MIG-GPU-parent1/1/0")
    assert inv.ids == ["MIG-bbbb", "MIG-GPU-parent1/1/0"] and inv.ids_are_ints is False
    # A MIG instance is its own device in the host ledger: two sessions on different
    # instances of one GPU do not contend.
    assert inv.device_keys == ["MIG-bbbb", "MIG-GPU-parent1/1/0"]
    assert inv.names == ["NVIDIA A100-SXM4-40GB"] * 2
    assert inv.accelerator_type == "A100"
    assert nvml.initialized == 0


def test_mig_calls_only_when_cvd_names_mig():
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-40GB", "GPU-p", migs=["MIG-a"])])
    detect_gpus(nvml, cuda_visible_devices="0")
    assert not [c for c in nvml.calls if "Mig" in c]


def test_unknown_cvd_entry_is_counted_as_a_logical_gpu(caplog):
    with caplog.at_level(logging.WARNING, logger="miniray._private.ledger.gpu_detect"):
        inv = detect_gpus(FakeNvml(devices(4)), cuda_visible_devices="1,7,GPU-nope")
    assert (inv.count, inv.ids) == (3, ["1", "7", "GPU-nope"])
    assert inv.device_keys == [UUID[1], None, None]
    assert inv.names == ["NVIDIA H100 80GB HBM3", None, None]
    assert "['7', 'GPU-nope']" in caplog.text


def test_accelerator_type_from_first_visible_device():
    devs = [FakeDevice("NVIDIA A100-SXM4-40GB", "GPU-a"), FakeDevice("Tesla T4", "GPU-t")]
    assert detect_gpus(FakeNvml(devs), cuda_visible_devices=None).accelerator_type == "A100"
    assert detect_gpus(FakeNvml(devs), cuda_visible_devices="1").accelerator_type == "T4"


def test_bytes_from_old_pynvml_are_decoded():
    nvml = FakeNvml([FakeDevice(b"Tesla V100-SXM2-16GB", b"GPU-bytes")])
    inv = detect_gpus(nvml, cuda_visible_devices=None)
    assert (inv.names, inv.uuids, inv.accelerator_type) == (
        ["Tesla V100-SXM2-16GB"],
        ["GPU-bytes"],
        "V100",
    )


# ------------------------------------------------------------------ failures: 0 GPUs, no error


def test_nvml_init_failure_gives_zero():
    nvml = FakeNvml(devices(2), fail={"nvmlInit"})
    assert detect_gpus(nvml, cuda_visible_devices=None) == GpuInventory()
    assert nvml.calls == ["nvmlInit"]


def test_count_failure_gives_zero_and_shuts_nvml_down():
    nvml = FakeNvml(devices(2), fail={"nvmlDeviceGetCount"})
    assert detect_gpus(nvml, cuda_visible_devices=None).count == 0
    assert nvml.initialized == 0 and nvml.calls[-1] == "nvmlShutdown"


def test_shutdown_failure_is_ignored():
    nvml = FakeNvml(devices(2), fail={"nvmlShutdown"})
    assert detect_gpus(nvml, cuda_visible_devices=None).count == 2


def test_per_device_failures_keep_the_device():
    nvml = FakeNvml(devices(2), fail={"nvmlDeviceGetName", "nvmlDeviceGetUUID"})
    inv = detect_gpus(nvml, cuda_visible_devices=None)
    assert inv.count == 2 and inv.names == [None, None] and inv.accelerator_type is None
    # Without a UUID the physical index names the device in the host ledger.
    assert inv.device_keys == ["nvml-index:0", "nvml-index:1"]
    nvml = FakeNvml(devices(2), fail={"nvmlDeviceGetHandleByIndex"})
    assert detect_gpus(nvml, cuda_visible_devices=None).device_keys == [
        "nvml-index:0",
        "nvml-index:1",
    ]


def test_no_pynvml_gives_zero(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert detect_gpus(cuda_visible_devices=None) == GpuInventory()
    assert detect_gpus(cuda_visible_devices="0,1").count == 0


def test_lazy_import_uses_the_pynvml_module(monkeypatch):
    fake = FakeNvml(devices(2))
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # stands in for the real module
    inv = detect_gpus(cuda_visible_devices=None)
    assert inv.count == 2 and fake.calls[0] == "nvmlInit" and fake.initialized == 0


def test_default_cvd_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    inv = detect_gpus(FakeNvml(devices(4)))
    assert (inv.ids, inv.ids_are_ints, inv.device_keys) == (["2", "0"], False, [UUID[2], UUID[0]])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert detect_gpus(FakeNvml(devices(4))).ids == ["0", "1", "2", "3"]
