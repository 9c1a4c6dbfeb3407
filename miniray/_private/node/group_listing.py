"""This node's placement groups for a listing on another host.

Owns: step 16 of ``remote_drivers.py``: the answer to another host's
``list_placement_groups`` / ``miniray list placement-groups`` (``state_api``): a thread
(never the loop) asks every live driver of this node's session at once for the groups it
still waits to reserve (``{"what": "pending_groups"}`` on its state socket, within half the
asker's wait: ``core/ask_all.py``), then, on the loop, the groups reserved in this node's
ledger are read (after the drivers answered: a group reserved meanwhile is seen reserved,
never missed) and the answer is handed back (``listing``).
Does not own: the links (``remote_drivers.py``), the ledger, the state socket
(``transport/state_socket.py``), the rows' merge (``state_api.group_rows``).
Called by: ``remote_drivers.RemoteDrivers`` on the loop (``answer``).
"""

from __future__ import annotations

import math
import threading

from miniray._private.core.ask_all import ask_all

MAX_WAIT_S = 60.0  # an asker's wait is bounded here too


def check_wait(wait_s) -> str | None:
    """Pure. What is wrong with step 16's wait (seconds the asker waits for the answer),
    or None.

    >>> check_wait(2.0), check_wait(1)
    (None, None)
    >>> check_wait(0) is not None, check_wait(True) is not None, check_wait("1") is not None
    (True, True, True)
    """
    if (isinstance(wait_s, bool) or not isinstance(wait_s, (int, float))
            or not math.isfinite(wait_s) or wait_s <= 0):
        return "a groups listing names its wait (seconds: a finite number > 0)"
    return None


def listing(reserved: dict, pending: list, missing: list) -> dict:
    """Pure. Step 16's answer: ``reserved`` (``{hex: ledger record}`` of the groups this
    node's ledger holds), ``pending`` (its drivers' rows of groups they wait to reserve)
    and ``missing`` (why a driver's rows are not there: one text each).

    >>> listing({}, [], ["driver pid 7: gone"])
    {'reserved': {}, 'pending': [], 'missing': ['driver pid 7: gone']}
    """
    return {"reserved": reserved, "pending": pending, "missing": missing}


class GroupListing:
    """Given the node's ``ledger``, its ``session_dir`` (read when asked: set after
    construction) and ``post(fn)`` (runs fn on the loop): see the module docstring."""

    def __init__(self, ledger, session_dir=lambda: None, post=None):
        self.ledger = ledger
        self._session_dir = session_dir
        self.post = post
        self.answered = 0

    def answer(self, req, wait_s: float, reply) -> None:
        """*On the loop.* Step 16 for one request (``wait_s`` checked: ``check_wait``):
        a thread asks the drivers, and ``reply(("pg_listing", req, listing))`` runs on the
        loop."""
        threading.Thread(target=self._ask, args=(req, min(wait_s, MAX_WAIT_S), reply),
                         daemon=True, name="miniray-group-listing").start()

    def _ask(self, req, wait_s: float, reply) -> None:
        """*Its own thread.* Each live driver of the session at once, within half of
        ``wait_s`` (the rest is the asker's link); then the ledger on the loop."""
        from miniray._private.transport import state_socket  # lazy: listings only

        session_dir = self._session_dir()
        sockets = dict(state_socket.live_sockets(session_dir)) if session_dir else {}
        bound = wait_s / 2

        def ask(path: str) -> list:
            doc = state_socket.ask(path, bound, "pending_groups")
            rows = doc.get("placement_groups")
            if "error" in doc or not isinstance(rows, list):
                raise ValueError(doc.get("error") or "it sent no rows")
            return rows

        answers, why = ask_all(sockets, ask, bound, "miniray-group-listing")
        pending = [row for pid in sorted(answers) for row in answers[pid]]
        missing = [f"driver pid {pid}: {why[pid]}" for pid in sorted(why)]
        self.post(lambda: self._reply(req, pending, missing, reply))

    def _reply(self, req, pending: list, missing: list, reply) -> None:
        """*On the loop.* The ledger's groups now, with what the drivers said."""
        try:
            reserved = {h: dict(lease.group) for h, lease in self.ledger.groups().items()}
        except (OSError, ValueError) as error:
            reply(("error", req, "node", f"this node cannot read its ledger: {error}"))
            return
        self.answered += 1
        reply(("pg_listing", req, listing(reserved, pending, missing)))
