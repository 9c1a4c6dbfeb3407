"""Mirrors `ray.util.accelerators.tpu` (Ray 2.60) by name only. Differs: it is empty.

Ray's TPU helpers (pod names, worker counts, TPU slice placement) describe multi-host TPU
pods, which this single-host runtime does not manage, so none are provided. The module
exists so that ``from miniray.util.accelerators import tpu`` works as in Ray.
"""

from __future__ import annotations

__all__: list = []
