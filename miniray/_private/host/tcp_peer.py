"""Which user owns the other end of a loopback TCP connection (Linux: ``/proc/net/tcp``).

Owns: finding the uid of the process that opened a TCP connection to one of our ports from
this host, the TCP counterpart of ``same_uid.require_same_uid_peer`` (``SO_PEERCRED`` exists
only for AF_UNIX sockets). The kernel lists every TCP socket of the network namespace in
``/proc/net/tcp`` and ``/proc/net/tcp6`` with its owner's uid; the peer's socket is the row
whose local end is the peer's address and port and whose remote end is our port.
Does not own: what is allowed (``node/dashboard.py`` decides: a loopback peer of another uid,
or one that cannot be found where the table exists, is refused).
Called by: ``node/dashboard.py``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

__all__ = ["UNKNOWN", "parse_table", "peer_uid"]

PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
UNKNOWN = -1  # the platform has no table (not Linux, or /proc not mounted)


def _address(text: str) -> tuple[str, int]:
    """``"0100007F:1F90"`` (host byte order words, as the kernel prints) -> ``("127.0.0.1",
    8080)``; 32 hex digits for IPv6."""
    hex_ip, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_ip)
    # The kernel prints each 32-bit word in host byte order.
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    packed = struct.pack(f"!{len(words)}I", *words)
    if len(packed) == 4:
        return socket.inet_ntop(socket.AF_INET, packed), int(hex_port, 16)
    address = ipaddress.IPv6Address(packed)
    mapped = address.ipv4_mapped
    return str(mapped if mapped is not None else address), int(hex_port, 16)


def parse_table(text: str) -> list[tuple[str, int, str, int, int]]:
    """Pure: the rows of a ``/proc/net/tcp``-format table as ``(local_ip, local_port,
    remote_ip, remote_port, uid)``; lines that do not parse are skipped."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            local = _address(fields[1])
            remote = _address(fields[2])
            uid = int(fields[7])
        except (ValueError, struct.error, OSError):
            continue
        rows.append((local[0], local[1], remote[0], remote[1], uid))
    return rows


def find_uid(rows, peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """Pure: the uid of the row whose local end is ``peer`` and remote end ``ours``."""
    for local_ip, local_port, remote_ip, remote_port, uid in rows:
        if (local_port, remote_port) == (peer[1], ours[1]) and local_ip == peer[0] \
                and remote_ip == ours[0]:
            return uid
    return None


def _plain(ip: str) -> str:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def peer_uid(peer: tuple, ours: tuple, tables: tuple[str, ...] = PROC_TABLES) -> int | None:
    """The uid owning the connection from ``peer`` to ``ours`` (socket addresses as
    ``getpeername``/``getsockname`` give them): an int, ``UNKNOWN`` when this platform has
    no table, None when the tables exist but list no such connection."""
    present = [path for path in tables if os.path.exists(path)]
    if not present:
        return UNKNOWN
    peer_key = (_plain(peer[0]), int(peer[1]))
    ours_key = (_plain(ours[0]), int(ours[1]))
    for path in present:
        try:
            with open(path) as f:
                rows = parse_table(f.read())
        except OSError:
            continue
        uid = find_uid(rows, peer_key, ours_key)
        if uid is not None:
            return uid
    return None
