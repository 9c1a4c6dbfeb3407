"""``ray.util.check_serialize``: ``inspect_serializability`` and its ``FailureTuple``.

The walk and its report live in ``miniray/_private/core/serializability.py``, where the
errors of a function, an argument or a ``put`` value that cannot be pickled embed the same
report, as Ray's do.
"""

from __future__ import annotations

from miniray._private.core.serializability import FailureTuple, inspect_serializability

__all__ = ["FailureTuple", "inspect_serializability"]
