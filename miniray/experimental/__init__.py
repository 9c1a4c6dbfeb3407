"""``miniray.experimental``: ``tqdm_ray`` only.

Mirrors the part of ``ray.experimental`` (Ray 2.60) that Ray Core programs use: progress bars
from tasks and actors (``tqdm_ray``). Ray's other experimental modules (collective tensor
transport, channels, ...) are not provided.
"""

from __future__ import annotations

__all__ = ["tqdm_ray"]
