"""Mirrors `ray.util.annotations` (Ray 2.60), only its warning class. Differs: the
``PublicAPI``/``DeveloperAPI``/``Deprecated`` decorators are not provided.

Owns: ``RayDeprecationWarning``, the category miniray uses when a Ray name it still accepts
is deprecated (for example ``ray.util.accelerators.NVIDIA_TESLA_A100``).
Called by: modules that warn about deprecated names.
"""

from __future__ import annotations

__all__ = ["RayDeprecationWarning"]


class RayDeprecationWarning(DeprecationWarning):
    """A deprecated Ray API was used; its own category so it can be filtered alone.

    Example:
        >>> import warnings
        >>> warnings.simplefilter("ignore", RayDeprecationWarning)
    """


RayDeprecationWarning.__module__ = __name__
