"""A driver's grant that lets one node pull one object another node keeps for that driver.

Owns: the grant's bytes (``grant``: HMAC-SHA256 under the key of the keeping node's link
to the driver, over the object id and the requesting node's id and IP) and its check
(``check_grant``, pure: the refusal text or None). Does not own: the key (made by the
keeping node for each driver link, ``node/remote_drivers.py`` step 12, handed only to that
driver over that link), the wire (step 12 there), or who asks for a grant
(``owner/remote_objects.py``).
Called by: ``owner/remote_objects.KeptResults`` (the driver makes a grant) and
``node/remote_drivers.RemoteDrivers.pull`` (the keeping node checks it on its loop).

Why a grant as well as the cluster token: every node holds the token, so a node proving
it may still not read what a driver keeps on another node unless that driver asked it to,
for that object, for that node (bound to its id and the IP it connects from).
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["KEY_BYTES", "check_grant", "grant", "new_key"]

KEY_BYTES = 32
_CONTEXT = b"miniray pull grant v1\0"


def new_key() -> bytes:
    """A link's grant key (random; never leaves the node but to that link's driver)."""
    return os.urandom(KEY_BYTES)


def _message(object_id: bytes, node_id: str, ip: str) -> bytes:
    return b"\0".join((_CONTEXT, object_id, node_id.encode(), ip.encode()))


def grant(key: bytes, object_id: bytes, node_id: str, ip: str) -> bytes:
    """The driver's grant for node ``node_id`` (connecting from ``ip``) to pull
    ``object_id`` from the node whose link key is ``key``.

    >>> key = bytes(32)
    >>> len(grant(key, b"\\x01" * 28, "m" * 56, "127.0.0.3"))
    32
    """
    return hmac.new(key, _message(object_id, node_id, ip), hashlib.sha256).digest()


def check_grant(key: bytes | None, object_id, node_id, ip: str, presented) -> str | None:
    """None when ``presented`` is the grant of ``key`` for that object, node and IP; else
    the refusal text (it names what was wrong, never the key or the expected grant).

    >>> key = bytes(32)
    >>> g = grant(key, b"\\x01" * 28, "m" * 56, "127.0.0.3")
    >>> check_grant(key, b"\\x01" * 28, "m" * 56, "127.0.0.3", g) is None
    True
    >>> check_grant(key, b"\\x01" * 28, "m" * 56, "127.0.0.4", g)[:40]
    'the grant does not match this object, no'
    """
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        return "this driver's link has no grant key here (closed or fenced)"
    if (not isinstance(object_id, bytes) or not isinstance(node_id, str) or not node_id
            or not isinstance(ip, str) or not isinstance(presented, bytes)
            or len(presented) != hashlib.sha256().digest_size):
        return ("a pull grant names {'node_id': str, 'object_id': bytes, 'grant': 32 bytes}: "
                "connect with miniray of the same version")
    if not hmac.compare_digest(grant(key, object_id, node_id, ip), presented):
        return ("the grant does not match this object, node and address: only the driver "
                "that keeps the object grants a pull of it, to one node")
    return None
