"""Loans of room in a placement group of this node's driver to a driver of another host,
and that driver's removal of the group.

Owns: step 15 of ``remote_drivers.py``: a remote driver's ``pg_lend``, ``pg_return``,
``pg_kept`` (``owner/placement_group_loans.py``, ``remote_bundles`` step 10; an actor's
loan: ``pg_lend`` with its id and ``held``, then ``pg_kept``) and ``pg_remove``
(``remove_placement_group``: ``owner/placement_group_nodes._remove_far``) carried to the
driver of this node that holds the group (its lease's holder in this node's ledger), on
that driver's state socket, by a thread (never the loop), the answer handed back to the
loop; the borrower's name there (``borrower``: the link, which the node authenticated,
never what the driver says of itself); when that driver does not listen there, a removal
done here as a driver of this node does it (``_release``: the ledger, whose release the
holder's watch sees); and, when the link closes, telling each driver lent to on it that
this borrower is gone (``pg_drop``: its loans come back).
Does not own: the links (``remote_drivers.py``), the loans themselves (the lending
driver's ``answer_borrower``), the state socket (``transport/state_socket.py``).
Called by: ``remote_drivers.RemoteDrivers`` on the loop (``forward``, ``drop_link``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading

logger = logging.getLogger(__name__)

ASK_S = 10.0  # at most this long for the lending driver's answer
WHATS = ("pg_lend", "pg_return", "pg_kept", "pg_remove")  # what a remote driver may ask
FIELDS = {"pg_lend": ("pg", "index", "base"), "pg_return": ("pg", "loan"),
          "pg_kept": ("pg", "actor", "kept"), "pg_remove": ("pg",)}
ACTOR_FIELDS = ("actor", "held")  # an actor's pg_lend names these too


def _amounts(value) -> bool:
    """Pure. Whether ``value`` is ``{name: amount}``.

    >>> _amounts({"CPU": 1.0}), _amounts({"CPU": "1"}), _amounts([])
    (True, False, False)
    """
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in value.items())


def _actor_id(value) -> bool:
    """Pure. Whether ``value`` is an actor id in hex.

    >>> _actor_id("ff"), _actor_id("f"), _actor_id("zz"), _actor_id(3)
    (True, False, False, False)
    """
    if not isinstance(value, str) or not value or len(value) % 2:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def asked_fields(what: str, fields: dict) -> dict:
    """Pure. The fields of a checked request that reach the lending driver (nothing else
    does): ``FIELDS[what]``, and an actor's ``pg_lend`` its ``ACTOR_FIELDS``.

    >>> asked_fields("pg_lend", {"pg": "ab", "index": 0, "base": {}, "x": 1})
    {'pg': 'ab', 'index': 0, 'base': {}}
    >>> sorted(asked_fields("pg_lend", {"pg": "ab", "index": 0, "base": {}, "actor": "ff",
    ...                                 "held": {}}))
    ['actor', 'base', 'held', 'index', 'pg']
    """
    asked = {k: fields[k] for k in FIELDS[what]}
    if what == "pg_lend" and "actor" in fields:
        asked.update({k: fields[k] for k in ACTOR_FIELDS})
    return asked


def borrower(link_name: str, serial: int) -> list:
    """Pure. The lending driver's name for a remote driver borrowing on one link: the
    link's name (its host's IP and the driver's pid) and the link's serial on this node (a
    pid used again, or a second link of the same driver, is another borrower).

    >>> borrower("remote driver 127.0.0.2 pid 7", 3)
    ['remote driver 127.0.0.2 pid 7', 3]
    """
    return [link_name, serial]


def check_fields(what, fields) -> str | None:
    """Pure. What is wrong with a remote driver's loan request, or None.

    >>> check_fields("pg_lend", {"pg": "ab", "index": 1, "base": {"CPU": 1.0}})
    >>> check_fields("pg_kept", {"pg": "ab", "actor": "ff", "kept": True})
    >>> check_fields("pg_kept", {"pg": "ab"}) is not None
    True
    >>> check_fields("pg_return", {"pg": "ab", "loan": "1"}) is not None
    True
    >>> check_fields("pg_remove", {"pg": "ab"})
    >>> check_fields("pg_lend", {"pg": "ab", "index": 1, "base": {}, "actor": "ff"})[:13]
    "an actor's pg"
    """
    if what not in WHATS or not isinstance(fields, dict):
        return f"a loan request is one of {list(WHATS)} with a dict of fields"
    if not isinstance(fields.get("pg"), str):
        return "a loan request names its group (pg: hex)"
    if what == "pg_return":
        loan = fields.get("loan")
        return None if isinstance(loan, int) and not isinstance(loan, bool) else \
            "pg_return names a loan id (int)"
    if what == "pg_remove":
        return None
    if what == "pg_kept":
        return None if _actor_id(fields.get("actor")) and isinstance(
            fields.get("kept"), bool) else "pg_kept names actor (hex) and kept (bool)"
    index = fields.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or \
            not _amounts(fields.get("base")):
        return "pg_lend names pg (hex), index (int) and base ({name: amount})"
    if "actor" in fields and not (_actor_id(fields["actor"]) and
                                  _amounts(fields.get("held"))):
        return "an actor's pg_lend names actor (hex) and held ({name: amount})"
    return None


def removable(record) -> bool:
    """Pure. Whether this node releases a group of this ledger ``record`` (None: it holds
    none) for a remote driver's removal (``_release``): a driver's group; a detached one
    is the actor service's, which a driver removes through its own service.

    >>> removable({"detached": False}), removable({"detached": True}), removable(None)
    (True, False, False)
    """
    return record is not None and not record.get("detached")


class LoanRelay:
    """Given the node's ``ledger``, its ``session_dir`` (read when asked: set after
    construction) and ``post(fn)`` (runs fn on the loop): see the module docstring."""

    def __init__(self, ledger, session_dir=lambda: None, post=None):
        self.ledger = ledger
        self._session_dir = session_dir
        self.post = post
        self._serials = itertools.count(1)
        self._by_link: dict = {}  # link -> (its borrower name, {lender socket path})
        self.forwarded = 0

    def forward(self, link, req, what: str, fields: dict, reply) -> None:
        """*On the loop.* Ask the driver of this node holding group ``fields["pg"]``
        (checked: ``check_fields``); a thread asks, and ``reply(answer)`` runs on the loop
        with ``("pg_loan", req, doc)``. No such driver listening: a loan is None, a
        removal is done here (``_release``)."""
        known = self._by_link.get(link)
        if known is None:
            known = self._by_link[link] = (borrower(link.name, next(self._serials)), set())
        name, lenders = known
        path = self._lender(fields)
        if path is None:  # no driver of this node holds it, or it does not listen
            reply(("pg_loan", req, self._release(fields["pg"]) if what == "pg_remove"
                   else {"loan": None}))
            return
        if what != "pg_remove":  # a removal lends nothing: no pg_drop at the link's end
            lenders.add(path)
        self.forwarded += 1
        asked = asked_fields(what, fields)  # nothing else reaches the driver
        threading.Thread(target=self._ask, args=(path, what, asked, name, req, reply),
                         daemon=True, name="miniray-loan-relay").start()

    def _lender(self, fields: dict) -> str | None:
        """*On the loop* (a ledger read). The state socket of the driver holding the
        group (its lease's holder here), or None."""
        from miniray._private.transport import state_socket  # lazy: only when lending

        session_dir = self._session_dir()
        if not session_dir:
            return None
        try:
            lease = self.ledger.groups().get(fields.get("pg"))
        except Exception:  # noqa: BLE001 - the ledger's trouble: nothing lent
            return None
        if lease is None or lease.group.get("detached"):
            return None
        path = state_socket.socket_path(session_dir, lease.holder_pid)
        return path if os.path.exists(path) else None

    def _release(self, pg_hex: str) -> dict:
        """*On the loop* (a ledger transaction). A removal whose driver does not listen on
        its state socket: the group's lease released in this node's ledger, as a driver of
        this node removing it does (its holder's watch ends its work and its other nodes'
        part); a detached one is the actor service's (``removable``)."""
        try:
            lease = self.ledger.groups().get(pg_hex)
            removed = removable(None if lease is None else lease.group) and \
                self.ledger.release_group(pg_hex) is not None
        except Exception as error:  # noqa: BLE001 - the ledger's trouble is the answer
            return {"error": f"this node could not release the group in its ledger: {error}"}
        return {"removed": removed}

    def _ask(self, path: str, what: str, fields: dict, name: list, req, reply) -> None:
        """*Its own thread.* One request on the lender's state socket; the answer to the
        loop (an error is the driver's answer: ``{"error": text}``)."""
        from miniray._private.transport import state_socket  # lazy: only when lending

        try:
            doc = state_socket.ask(path, ASK_S, what, borrower=name, **fields)
        except (OSError, TimeoutError) as error:
            doc = {"error": f"the lending driver did not answer: {error}"}
        self.post(lambda: reply(("pg_loan", req, doc)))

    def drop_link(self, link) -> None:
        """*On the loop.* ``link`` closed: each driver it borrowed from is told, by a
        thread, that this borrower is gone (its loans come back there)."""
        known = self._by_link.pop(link, None)
        if not known or not known[1]:
            return
        name, lenders = known
        threading.Thread(target=self._drop, args=(name, sorted(lenders)), daemon=True,
                         name="miniray-loan-drop").start()

    @staticmethod
    def _drop(name: list, lenders: list) -> None:
        from miniray._private.transport import state_socket  # lazy: only when lending

        for path in lenders:
            try:
                state_socket.ask(path, ASK_S, "pg_drop", borrower=name)
            except (OSError, TimeoutError) as error:  # gone: its loans went with it
                logger.info("could not tell %s that a remote borrower left: %s", path,
                            error)
