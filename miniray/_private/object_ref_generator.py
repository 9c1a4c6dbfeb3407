"""The generator types at Ray's import path ``ray._private.object_ref_generator``.

Owns: nothing of its own; it names ``ObjectRefGenerator`` (``api.py``) and
``DynamicObjectRefGenerator`` (``core/object_ref.py``) where Ray's programs and pickles look
for them. Called by: user code importing Ray's path, and unpickling a
``DynamicObjectRefGenerator`` (its ``__module__`` is this module).
"""

from __future__ import annotations

from miniray._private.api import ObjectRefGenerator
from miniray._private.core.object_ref import DynamicObjectRefGenerator

__all__ = ["DynamicObjectRefGenerator", "ObjectRefGenerator"]
