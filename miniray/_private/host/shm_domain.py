"""The shared-memory domain: which processes can read each other's segments in place.

Owns: ``shm_domain_id()``, the identity of "processes that share this shared-memory
directory", and its pure part ``domain_id``. Does not own: the directory itself
(``core/config.shm_dir``, checked by ``object_store/shm_segments.prepare_shm_dir``) nor what
callers do with the answer. Called by: the peering code, to decide whether an object on another
node is read in place (same domain) or pulled over TCP (different domains).

Two processes are in the same domain when they run under the same kernel boot and name the
very same directory (its ``st_dev`` and ``st_ino``), and agree on ``MINIRAY_HOST_ID`` when it is
set. IP addresses say nothing here: two fake hosts on 127.0.0.1 and 127.0.0.2 of one machine,
each with its own ``MINIRAY_SHM_DIR``, are two domains; a container sharing the host's
``/dev/shm`` but with another boot id view is not assumed to share it.

Example:
    >>> domain_id("b1f0...", 23, 1, "")  # doctest: +SKIP
    'shm-6c1d0e5b2a7f4c3e9d1a'
"""

from __future__ import annotations

import hashlib
import os

from miniray._private.core import config
from miniray._private.host import procinfo

__all__ = ["domain_id", "shm_domain_id"]


def domain_id(boot_id: str, st_dev: int, st_ino: int, host_id: str = "") -> str:
    """Pure: the domain id of a shm directory with ``st_dev``/``st_ino`` under boot
    ``boot_id``, on the host named ``host_id`` (``""``: unnamed). Equal inputs, equal ids;
    any field different, a different id (a 80-bit digest, so collisions are not a concern)."""
    text = f"{boot_id.strip()}\0{int(st_dev)}\0{int(st_ino)}\0{host_id}"
    return "shm-" + hashlib.sha256(text.encode()).hexdigest()[:20]


def shm_domain_id(shm_dir: str | None = None, host_id: str | None = None) -> str:
    """This process's shared-memory domain: ``shm_dir`` (default ``MINIRAY_SHM_DIR`` or
    ``/dev/shm``) under this boot, on ``host_id`` (default ``MINIRAY_HOST_ID``). The directory
    must exist (OSError otherwise): a domain is a directory that holds segments."""
    path = os.path.abspath(shm_dir or config.shm_dir())
    st = os.stat(path)
    name = config.host_id() if host_id is None else host_id
    # No /proc: boot id "", and the directory's identity still tells fake hosts apart.
    return domain_id(procinfo.identity().boot_id, st.st_dev, st.st_ino, name)
