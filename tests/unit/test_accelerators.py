"""miniray.util.accelerators: the constants of Ray 2.60 (surface doc section 7.1), which of
them the package re-exports, the deprecated alias, and star import. No processes."""

from __future__ import annotations

import types
import warnings

import pytest

import miniray.util.accelerators as acc
import miniray.util.accelerators.accelerators as acc_sub
from miniray.util.annotations import RayDeprecationWarning

# Importable from miniray.util.accelerators (re-exported, as in Ray 2.60).
EXPORTED = {
    "NVIDIA_TESLA_V100": "V100",
    "NVIDIA_TESLA_P100": "P100",
    "NVIDIA_TESLA_T4": "T4",
    "NVIDIA_TESLA_P4": "P4",
    "NVIDIA_TESLA_K80": "K80",
    "NVIDIA_TESLA_A10G": "A10G",
    "NVIDIA_L4": "L4",
    "NVIDIA_A100": "A100",
    "NVIDIA_H100": "H100",
    "INTEL_MAX_1550": "Intel-GPU-Max-1550",
    "INTEL_MAX_1100": "Intel-GPU-Max-1100",
    "INTEL_GAUDI": "Intel-GAUDI",
    "METAX_C500": "MXC500",
    "METAX_C550": "MXC550",
    "MOBILINT_ARIES": "MOBILINT_ARIES",
    "MOBILINT_REGULUS": "MOBILINT_REGULUS",
    "APPLE_M1": "M1",
    "APPLE_M1_PRO": "M1-Pro",
    "APPLE_M1_MAX": "M1-Max",
    "APPLE_M1_ULTRA": "M1-Ultra",
    "APPLE_M2": "M2",
    "APPLE_M2_PRO": "M2-Pro",
    "APPLE_M2_MAX": "M2-Max",
    "APPLE_M2_ULTRA": "M2-Ultra",
    "APPLE_M3": "M3",
    "APPLE_M3_PRO": "M3-Pro",
    "APPLE_M3_MAX": "M3-Max",
    "AMD_INSTINCT_MI100": "AMD-Instinct-MI100",
    "AMD_INSTINCT_MI210": "AMD-Instinct-MI210",
    "AMD_INSTINCT_MI250": "AMD-Instinct-MI250X-MI250",
    "AMD_INSTINCT_MI250x": "AMD-Instinct-MI250X",
    "AMD_INSTINCT_MI300x": "AMD-Instinct-MI300X-OAM",
    "AMD_RADEON_R9_200_HD_7900": "AMD-Radeon-R9-200-HD-7900",
    "AMD_RADEON_HD_7900": "AMD-Radeon-HD-7900",
    "AWS_NEURON_CORE": "aws-neuron-core",
    "GOOGLE_TPU_V2": "TPU-V2",
    "GOOGLE_TPU_V3": "TPU-V3",
    "GOOGLE_TPU_V4": "TPU-V4",
    "GOOGLE_TPU_V5P": "TPU-V5P",
    "GOOGLE_TPU_V5LITEPOD": "TPU-V5LITEPOD",
    "GOOGLE_TPU_V6E": "TPU-V6E",
    "GOOGLE_TPU_V7X": "TPU-V7X",
    "APPLE_SILICON": "Apple-Silicon",
}

# Defined only in the submodule miniray.util.accelerators.accelerators (as in Ray 2.60).
SUBMODULE_ONLY = {
    "NVIDIA_L40S": "L40S",
    "NVIDIA_H200": "H200",
    "NVIDIA_H20": "H20",
    "NVIDIA_B200": "B200",
    "NVIDIA_B300": "B300",
    "NVIDIA_GB200": "GB200",
    "NVIDIA_GB300": "GB300",
    "NVIDIA_RTX_PRO_6000": "RTX-PRO-6000",
    "NVIDIA_A100_40G": "A100-40G",
    "NVIDIA_A100_80G": "A100-80G",
    "AMD_INSTINCT_MI300A": "AMD-Instinct-MI300A",
    "AMD_INSTINCT_MI300x_HF": "AMD-Instinct-MI300X-HF",
    "AMD_INSTINCT_MI308x": "AMD-Instinct-MI308X",
    "AMD_INSTINCT_MI325x": "AMD-Instinct-MI325X-OAM",
    "AMD_INSTINCT_MI350x": "AMD-Instinct-MI350X-OAM",
    "AMD_INSTINCT_MI355x": "AMD-Instinct-MI355X-OAM",
    "HUAWEI_NPU_910B": "Ascend910B",
    "HUAWEI_NPU_910B4": "Ascend910B4",
    "FURIOSA_RNGD": "FURIOSA_RNGD",
}


@pytest.mark.parametrize("name, value", sorted(EXPORTED.items()))
def test_exported_constant(name, value):
    namespace: dict = {}
    exec(f"from miniray.util.accelerators import {name}", namespace)
    assert namespace[name] == value
    assert getattr(acc_sub, name) == value


@pytest.mark.parametrize("name, value", sorted(SUBMODULE_ONLY.items()))
def test_submodule_only_constant(name, value):
    assert getattr(acc_sub, name) == value
    with pytest.raises(ImportError):
        exec(f"from miniray.util.accelerators import {name}", {})


def test_submodule_defines_exactly_the_documented_names():
    constants = {k for k, v in vars(acc_sub).items() if k[0] != "_" and isinstance(v, str)}
    assert constants == set(EXPORTED) | set(SUBMODULE_ONLY)
    assert sorted(acc_sub.__all__) == sorted(constants)


def test_all_lists_the_reexports_and_tpu():
    assert sorted(acc.__all__) == sorted([*EXPORTED, "tpu"])
    assert len(acc.__all__) == len(set(acc.__all__))
    for name in acc.__all__:
        assert name in vars(acc), name


def test_star_import_works_without_warnings():
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from miniray.util.accelerators import *", namespace)
    for name, value in EXPORTED.items():
        assert namespace[name] == value
    assert isinstance(namespace["tpu"], types.ModuleType)
    assert not set(SUBMODULE_ONLY) & set(namespace)


def test_tpu_submodule():
    from miniray.util.accelerators import tpu

    assert tpu is acc.tpu
    assert tpu.__name__ == "miniray.util.accelerators.tpu"
    assert tpu.__doc__


def test_deprecated_alias_warns_once_and_resolves():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace: dict = {}
        exec("from miniray.util.accelerators import NVIDIA_TESLA_A100", namespace)
    assert namespace["NVIDIA_TESLA_A100"] == "A100"
    assert [w.category for w in caught] == [RayDeprecationWarning]
    assert str(caught[0].message) == "NVIDIA_TESLA_A100 is deprecated, use NVIDIA_A100 instead."

    with pytest.warns(RayDeprecationWarning, match="use NVIDIA_A100 instead"):
        assert acc.NVIDIA_TESLA_A100 == "A100"


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="NVIDIA_RTX_9999"):
        acc.NVIDIA_RTX_9999  # noqa: B018


def test_ray_deprecation_warning():
    assert issubclass(RayDeprecationWarning, DeprecationWarning)
    assert RayDeprecationWarning.__module__ == "miniray.util.annotations"
    import miniray.util.annotations as annotations

    assert "RayDeprecationWarning" in annotations.__all__
