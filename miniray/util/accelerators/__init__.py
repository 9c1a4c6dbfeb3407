"""Mirrors `ray.util.accelerators` (Ray 2.60). Differs: star import works.

Owns: the accelerator type names Ray re-exports here, and the deprecated
``NVIDIA_TESLA_A100`` alias (resolved on access with a ``RayDeprecationWarning``).
Called by: user programs, as ``accelerator_type=NVIDIA_TESLA_V100`` and the like.

As in Ray 2.60, the newer names (``NVIDIA_H200``, ``NVIDIA_B200``, ``NVIDIA_A100_80G``,
``FURIOSA_RNGD``, ...) are defined only in the submodule
``miniray.util.accelerators.accelerators``; importing them from this package raises
``ImportError``. Ray's ``__all__`` here lists two names the package does not import
(``NVIDIA_A100_40G``/``NVIDIA_A100_80G``), so ``from ray.util.accelerators import *``
raises; this package's ``__all__`` lists only names that exist (and leaves out the
deprecated alias, so a star import does not warn).

Example:
    >>> from miniray.util.accelerators import NVIDIA_TESLA_V100
    >>> NVIDIA_TESLA_V100
    'V100'
"""

from __future__ import annotations

import sys
import warnings

from miniray.util.accelerators import tpu
from miniray.util.accelerators.accelerators import (
    AMD_INSTINCT_MI100,
    AMD_INSTINCT_MI210,
    AMD_INSTINCT_MI250,
    AMD_RADEON_HD_7900,
    AMD_RADEON_R9_200_HD_7900,
    APPLE_M1,
    APPLE_M1_MAX,
    APPLE_M1_PRO,
    APPLE_M1_ULTRA,
    APPLE_M2,
    APPLE_M2_MAX,
    APPLE_M2_PRO,
    APPLE_M2_ULTRA,
    APPLE_M3,
    APPLE_M3_MAX,
    APPLE_M3_PRO,
    APPLE_SILICON,
    AWS_NEURON_CORE,
    GOOGLE_TPU_V2,
    GOOGLE_TPU_V3,
    GOOGLE_TPU_V4,
    GOOGLE_TPU_V5LITEPOD,
    GOOGLE_TPU_V5P,
    GOOGLE_TPU_V6E,
    GOOGLE_TPU_V7X,
    INTEL_GAUDI,
    INTEL_MAX_1100,
    INTEL_MAX_1550,
    METAX_C500,
    METAX_C550,
    MOBILINT_ARIES,
    MOBILINT_REGULUS,
    NVIDIA_A100,
    NVIDIA_H100,
    NVIDIA_L4,
    NVIDIA_TESLA_A10G,
    NVIDIA_TESLA_K80,
    NVIDIA_TESLA_P4,
    NVIDIA_TESLA_P100,
    NVIDIA_TESLA_T4,
    NVIDIA_TESLA_V100,
    AMD_INSTINCT_MI250x,
    AMD_INSTINCT_MI300x,
)

__all__ = [
    "tpu",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_A10G",
    "NVIDIA_L4",
    "NVIDIA_A100",
    "NVIDIA_H100",
    "INTEL_MAX_1550",
    "INTEL_MAX_1100",
    "INTEL_GAUDI",
    "METAX_C500",
    "METAX_C550",
    "MOBILINT_ARIES",
    "MOBILINT_REGULUS",
    "AMD_INSTINCT_MI100",
    "AMD_INSTINCT_MI210",
    "AMD_INSTINCT_MI250",
    "AMD_INSTINCT_MI250x",
    "AMD_INSTINCT_MI300x",
    "AMD_RADEON_R9_200_HD_7900",
    "AMD_RADEON_HD_7900",
    "AWS_NEURON_CORE",
    "GOOGLE_TPU_V2",
    "GOOGLE_TPU_V3",
    "GOOGLE_TPU_V4",
    "GOOGLE_TPU_V5P",
    "GOOGLE_TPU_V5LITEPOD",
    "GOOGLE_TPU_V6E",
    "GOOGLE_TPU_V7X",
    "APPLE_SILICON",
    "APPLE_M1",
    "APPLE_M1_PRO",
    "APPLE_M1_MAX",
    "APPLE_M1_ULTRA",
    "APPLE_M2",
    "APPLE_M2_PRO",
    "APPLE_M2_MAX",
    "APPLE_M2_ULTRA",
    "APPLE_M3",
    "APPLE_M3_PRO",
    "APPLE_M3_MAX",
]

_DEPRECATED = {"NVIDIA_TESLA_A100": "NVIDIA_A100"}


def __getattr__(name: str):
    replacement = _DEPRECATED.get(name)
    if replacement is not None:
        from miniray.util.annotations import RayDeprecationWarning  # lazy: a deprecated name only

        # `from pkg import NAME` probes the name with hasattr() inside importlib before
        # fetching it; warn only on the fetch, so the user sees one warning at their line.
        if sys._getframe(1).f_globals.get("__name__") == "importlib._bootstrap":
            return globals()[replacement]

        warnings.warn(
            f"{name} is deprecated, use {replacement} instead.",
            RayDeprecationWarning,
            stacklevel=2,
        )
        return globals()[replacement]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
