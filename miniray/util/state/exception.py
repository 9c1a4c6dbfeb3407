"""``ray.util.state.exception``: the state API's error (Ray 2.60's name)."""

from __future__ import annotations

from miniray._private.state_api import RayStateApiException

__all__ = ["RayStateApiException"]
