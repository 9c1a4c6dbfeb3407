"""What ``miniray start`` checks before it launches a node: the head's address and the error.

Owns: the ``host:port`` address format of a node (``parse_address``), ``NodeStartError``
(a node could not start; its message says why and what to do) and how long a start may
take. Pure, and imports nothing else, so the command line checks its arguments and launches
the node process before it loads anything heavier (ARCHITECTURE.md, "Layers"). Does not
own: finding or connecting to nodes (``transport/node_client.py``, which re-exports the
error and the parser).
Called by: the CLI, ``transport/node_client.py``, ``node/daemon.py``, ``node/node.py``.
"""

from __future__ import annotations

__all__ = ["READY_TIMEOUT_S", "NodeStartError", "parse_address"]

# How long ``miniray start`` waits for the node it launched to be ready.
READY_TIMEOUT_S = 30.0


class NodeStartError(Exception):
    """``miniray start`` could not start a node; the message says why and what to do."""


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) as ``(host, port)``; ValueError (Ray's
    message) when it is malformed.

    Example:
        >>> parse_address("[::1]:6379")
        ('::1', 6379)
    """
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Invalid address format: {address}")
    return host, int(port)
