"""The node's book of results it keeps for remote drivers (issue 16: a result stays on its node).

Owns: which large task results this node keeps in its shm dir for which remote driver's link,
the bytes kept per link and the cap on them (``MINIRAY_KEPT_BYTES_PER_DRIVER``, which the
link's workers respect themselves: ``worker_api.payload_for``; the book refuses a keep past
it as a last check), the totals ``miniray status`` shows (``KeptObjects``, pure: no file
is opened or unlinked here; the caller acts on the paths it is handed back), and the name
a kept segment must have (the link's tag: ``shm_segments.segment_name(link tag, object
id)``, so that one ``sweep_tag`` of the link's tag removes whatever a worker of that link
wrote, adopted or not). Does not own: the links (``remote_drivers.RemoteDrivers``, which
adds a link's tag when the link is served and drops it, unlinking every path it gets back,
when the link closes or is fenced), writing the segment (the remote worker:
``worker_api.result_route``; or this node's fetch from another node, ``remote_drivers``
step 12, booked here the same way), or the driver's record of where the value is
(``owner/remote_nodes.py``).
Called by: ``RemoteDrivers`` on the node's selector loop (single-threaded: nothing here locks).

Design: docs/remote-objects.md.
"""

from __future__ import annotations

import os
from typing import Hashable

__all__ = ["KeptObjects"]


class KeptObjects:
    """Per link: its tag, ``object_id -> (path, size)`` and the bytes kept; ``cap_bytes``
    bounds what one link may keep (None: no bound but the shm dir's room).

    >>> book = KeptObjects(cap_bytes=100)
    >>> book.add_link("L", "abcdef0123456789")
    >>> path = "/dev/shm/x/mr_abcdef0123456789_" + "01" * 28
    >>> book.add("L", bytes.fromhex("01" * 28), path, 60) is None
    True
    >>> "link's tag" in book.add("L", bytes.fromhex("02" * 28), path, 60)  # not its name
    True
    >>> book.totals(), book.free("L", [bytes.fromhex("01" * 28)]) == [path], book.totals()
    ((1, 60), True, (0, 0))
    """

    def __init__(self, cap_bytes: int | None = None):
        self.cap_bytes = cap_bytes
        self._tags: dict[Hashable, str] = {}
        self._objects: dict[Hashable, dict[bytes, tuple[str, int]]] = {}
        self._bytes: dict[Hashable, int] = {}

    def add_link(self, link: Hashable, tag: str) -> None:
        """A link is served: its workers name kept segments with ``tag``."""
        self._tags[link] = tag
        self._objects[link] = {}
        self._bytes[link] = 0

    def tag_of(self, link: Hashable) -> str | None:
        return self._tags.get(link)

    def room_for(self, link: Hashable) -> int:
        """Bytes ``link`` may still keep (0 for a link not in the book)."""
        if link not in self._tags:
            return 0
        if self.cap_bytes is None:
            return 1 << 62
        return max(0, self.cap_bytes - self._bytes[link])

    def add(self, link: Hashable, object_id: bytes, path: str, size: int) -> str | None:
        """Keep ``path`` (``size`` bytes) as ``object_id`` for ``link``: None, or the refusal
        text (an unknown link, a name that is not the link's segment of that object, a size
        that is not a positive int, an object kept already, or over the link's cap). The
        caller checks the file itself (``shm_segments.check_adoptable``)."""
        tag = self._tags.get(link)
        if tag is None:
            return "this driver's link is not served here (closed or fenced)"
        if not isinstance(object_id, bytes) or not isinstance(size, int) or \
                isinstance(size, bool) or size <= 0:
            return f"a kept object needs an object id (bytes) and a size > 0, got {size!r}"
        expected = f"mr_{tag}_{object_id.hex()}"
        if not isinstance(path, str) or os.path.basename(path) != expected:
            return (f"the segment name {path!r:.120} is not {expected}: a worker of this "
                    "driver names its kept results with the link's tag")
        objects = self._objects[link]
        if object_id in objects:
            return f"object {object_id.hex()} is kept for this driver already"
        if size > self.room_for(link):
            return (f"keeping {size} more bytes would pass this node's cap of "
                    f"{self.cap_bytes} bytes kept per driver: send the value instead")
        objects[object_id] = (path, size)
        self._bytes[link] += size
        return None

    def find(self, link: Hashable, object_id: bytes) -> tuple[str, int] | None:
        """``(path, size)`` of an object kept for ``link``; None for any other (another
        link's objects are never found: only the driver that keeps an object pulls it)."""
        return self._objects.get(link, {}).get(object_id)

    def free(self, link: Hashable, object_ids) -> list[str]:
        """Forget these objects of ``link``; returns their paths to unlink. Ids the link
        does not keep (freed already, gone with a fencing, never kept) are skipped."""
        objects = self._objects.get(link)
        if objects is None:
            return []
        paths = []
        for object_id in object_ids:
            item = objects.pop(object_id, None)
            if item is not None:
                paths.append(item[0])
                self._bytes[link] -= item[1]
        return paths

    def drop_link(self, link: Hashable) -> tuple[str | None, list[str]]:
        """The link closed or was fenced: ``(its tag, every path it kept)``; the caller
        unlinks the paths and sweeps the tag (a worker's segment not reported yet)."""
        tag = self._tags.pop(link, None)
        objects = self._objects.pop(link, {})
        self._bytes.pop(link, None)
        return tag, [path for path, _size in objects.values()]

    def totals(self, link: Hashable | None = None) -> tuple[int, int]:
        """``(objects, bytes)`` kept, for one link or for all (``miniray status``)."""
        links = [link] if link is not None else list(self._objects)
        count = sum(len(self._objects.get(one, {})) for one in links)
        return count, sum(self._bytes.get(one, 0) for one in links)
