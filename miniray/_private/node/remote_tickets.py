"""Spawn tickets of remote drivers: which ATTACH connections make up which new worker (pure).

Owns: the tickets a node gives out for ``("spawn", req)`` on a driver link
(``remote_drivers.py`` step 8), matching each ``attach`` connection to its ticket by the
ticket, its role (one of ``ATTACH_ROLES``) and the peer's host, a ticket's deadline, and
what is left to close when a ticket expires or its link goes. Pure: no sockets, no clock
of its own (``now`` is passed in), no randomness (the caller makes the ticket string); the
"parts" it keeps for a ticket are opaque to it (the node's channels).
Does not own: the links and channels (``remote_drivers.py``), the handshake
(``peer_channel.py``), or forking the worker (the node's fork server:
``node.NodeServer._remote_spawn``).
Called by: ``remote_drivers.RemoteDrivers`` on the node's loop.

Rules:

1. A link may hold at most ``per_link`` tickets not yet complete; ``issue`` refuses more.
2. ``attach(ticket, role, host, now, part)``: "unknown" for a ticket never issued, expired,
   or complete already; "refused" when the role is not one of ``ATTACH_ROLES``, came
   already for this ticket, or the peer's host is not the driver link's host; else
   "waiting" or, with the fourth role, "complete" (the ticket is then forgotten: each
   ticket makes at most one worker).
3. ``expired(now)``: tickets past their deadline, forgotten here (their parts go to the
   caller, to be closed). ``drop_link(link)``: the same for every ticket of a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ATTACH_ROLES", "Ticket", "TicketBook"]

# A worker's four connections, in the order the fork server takes its fds.
ATTACH_ROLES = ("data", "control", "stdout", "stderr")


@dataclass
class Ticket:
    """One spawn in progress: the driver link and request it answers, and what arrived."""

    ticket: str
    link: Any
    req: Any
    host: str
    deadline: float
    parts: dict = field(default_factory=dict)  # role -> the caller's object (a channel)

    def ordered(self) -> list:
        """The parts in ``ATTACH_ROLES`` order (complete tickets only)."""
        return [self.parts[role] for role in ATTACH_ROLES]


class TicketBook:
    """The tickets of every driver link of one node (see the module docstring).

    >>> book = TicketBook(ttl=5.0)
    >>> book.issue("link", 1, "10.0.0.1", 0.0, "t1").ticket
    't1'
    >>> [book.attach("t1", r, "10.0.0.1", 1.0, r)[0] for r in ATTACH_ROLES]
    ['waiting', 'waiting', 'waiting', 'complete']
    >>> book.attach("t1", "data", "10.0.0.1", 1.0, None)[0]
    'unknown'
    """

    def __init__(self, ttl: float = 10.0, per_link: int = 16):
        self.ttl = ttl
        self.per_link = per_link
        self._tickets: dict[str, Ticket] = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, link, req, host: str, now: float, ticket: str) -> Ticket | None:
        """Rule 1: a new ticket for ``link``, or None when it holds ``per_link`` already."""
        if sum(1 for t in self._tickets.values() if t.link is link) >= self.per_link:
            return None
        entry = Ticket(ticket=ticket, link=link, req=req, host=host, deadline=now + self.ttl)
        self._tickets[ticket] = entry
        return entry

    def attach(self, ticket: str, role: str, host: str, now: float,
               part) -> tuple[str, Ticket | None, str]:
        """Rule 2: ``(outcome, ticket entry or None, why)``."""
        entry = self._tickets.get(ticket)
        if entry is None or now >= entry.deadline:
            return "unknown", None, "no such ticket (never issued, expired, or used)"
        if role not in ATTACH_ROLES:
            return "refused", entry, f"the role {role!r:.20} is not one of {ATTACH_ROLES}"
        if role in entry.parts:
            return "refused", entry, f"the {role} connection of this ticket came already"
        if host != entry.host:
            return "refused", entry, (f"the ticket was given to a driver on {entry.host}, "
                                      f"not {host}")
        entry.parts[role] = part
        if len(entry.parts) < len(ATTACH_ROLES):
            return "waiting", entry, ""
        del self._tickets[ticket]
        return "complete", entry, ""

    def expired(self, now: float) -> list[Ticket]:
        """Rule 3: tickets past their deadline, forgotten here."""
        gone = [t for t in self._tickets.values() if now >= t.deadline]
        for entry in gone:
            del self._tickets[entry.ticket]
        return gone

    def drop_link(self, link) -> list[Ticket]:
        """Rule 3: every ticket of ``link``, forgotten here."""
        gone = [t for t in self._tickets.values() if t.link is link]
        for entry in gone:
            del self._tickets[entry.ticket]
        return gone

    def next_deadline(self) -> float | None:
        return min((t.deadline for t in self._tickets.values()), default=None)
