"""``node/loan_relay.py``: a remote driver's loan requests carried to the lending driver's
state socket, and its link's end told to it (``remote_drivers`` step 15)."""

from __future__ import annotations

import doctest
import os
import queue
from types import SimpleNamespace

from miniray._private.node import loan_relay
from miniray._private.node.loan_relay import LoanRelay, check_fields
from miniray._private.owner.placement_group_loans import answer_borrower, far_token
from miniray._private.transport import state_socket

PG = "ab" * 14


def test_doctests():
    assert doctest.testmod(loan_relay, raise_on_error=False).failed == 0


def test_check_fields_refuses_what_a_remote_driver_may_not_ask():
    assert check_fields("pg_lend", {"pg": PG, "index": -1, "base": {"CPU": 1}}) is None
    assert check_fields("pg_return", {"pg": PG, "loan": 3}) is None
    assert check_fields("pg_remove", {"pg": PG}) is None
    actor = {"pg": PG, "index": 1, "base": {"CPU": 1}, "actor": "ff", "held": {"CPU": 1}}
    assert check_fields("pg_lend", actor) is None  # an actor's loan (remote_bundles step 10)
    assert check_fields("pg_kept", {"pg": PG, "actor": "ff", "kept": False}) is None
    for what, fields in [("pg_kept", {"pg": PG}), ("pg_drop", {"pg": PG}),
                         ("pg_kept", {"pg": PG, "actor": "ff", "kept": 1}),
                         ("pg_kept", {"pg": PG, "actor": "xyz", "kept": True}),
                         ("pg_lend", {**actor, "held": None}),
                         ("pg_lend", {**actor, "actor": 7}),
                         ("pg_lend", {"pg": PG, "index": True, "base": {}}),
                         ("pg_lend", {"pg": PG, "index": 0, "base": {"CPU": "1"}}),
                         ("pg_lend", {"index": 0, "base": {}}), ("pg_lend", []),
                         ("pg_remove", {"pg": 3})]:
        assert check_fields(what, fields) is not None, (what, fields)


class _Link:
    def __init__(self, name):
        self.name = name


class _Ledger:
    def __init__(self, holder_pid, detached=False):
        self.lease = SimpleNamespace(holder_pid=holder_pid, group={"detached": detached})
        self.released = []

    def groups(self):
        return {} if self.released else {PG: self.lease}

    def release_group(self, pg_hex):
        self.released.append(pg_hex)
        return self.lease


def _served(tmp_path):
    """A state socket for this process in a session folder, its loan requests queued."""
    asked = queue.Queue()

    def loans(request, pid):
        asked.put((request, pid))
        return {"loan": [1, 0, "n", []]} if request["what"] == "pg_lend" else {"loan": None}

    server = state_socket.StateServer(state_socket.socket_path(str(tmp_path)),
                                      lambda: {}, loans=loans)
    return server, asked


def test_a_loan_goes_to_the_groups_holder_naming_the_link_and_its_end_drops_it(tmp_path):
    server, asked = _served(tmp_path)
    answers = queue.Queue()
    relay = LoanRelay(_Ledger(os.getpid()), lambda: str(tmp_path), post=lambda fn: fn())
    link = _Link("remote driver 127.0.0.2 pid 7")
    try:
        relay.forward(link, 5, "pg_lend", {"pg": PG, "index": 0, "base": {"CPU": 1.0},
                                           "borrower": "me"}, answers.put)
        assert answers.get(timeout=10) == ("pg_loan", 5, {"loan": [1, 0, "n", []]})
        request, pid = asked.get(timeout=10)
        assert pid == os.getpid()
        name = request.pop("borrower")  # the link's, never the driver's word
        assert request == {"what": "pg_lend", "pg": PG, "index": 0, "base": {"CPU": 1.0}}
        assert name[0] == link.name and isinstance(name[1], int)
        actor = {"pg": PG, "index": 1, "base": {"CPU": 1.0}, "actor": "ff", "held": {}}
        relay.forward(link, 6, "pg_lend", actor, answers.put)  # an actor's loan, then kept
        relay.forward(link, 7, "pg_kept", {"pg": PG, "actor": "ff", "kept": True, "x": 1},
                      answers.put)
        seen = sorted((asked.get(timeout=10)[0] for _ in range(2)), key=lambda r: r["what"])
        assert seen == [{"what": "pg_kept", "pg": PG, "actor": "ff", "kept": True,
                         "borrower": name},
                        {"what": "pg_lend", **actor, "borrower": name}], seen
        assert sorted(answers.get(timeout=10)[1] for _ in range(2)) == [6, 7]
        relay.drop_link(link)
        request, _pid = asked.get(timeout=10)
        assert request == {"what": "pg_drop", "borrower": name}
        relay.drop_link(link)  # once only
        assert asked.empty()
    finally:
        server.close()


def test_a_group_no_driver_of_the_node_holds_lends_nothing(tmp_path):
    answers = []
    for ledger in (_Ledger(os.getpid(), detached=True), _Ledger(999999999)):
        relay = LoanRelay(ledger, lambda: str(tmp_path), post=lambda fn: fn())
        relay.forward(_Link("l"), 1, "pg_lend",
                      {"pg": PG, "index": 0, "base": {}}, answers.append)
    assert answers == [("pg_loan", 1, {"loan": None})] * 2


def test_the_lender_takes_a_far_borrower_only_from_its_node():
    owner = SimpleNamespace(remote_nodes=None)
    far = {"what": "pg_drop", "borrower": ["remote driver 127.0.0.2 pid 7", 1]}
    assert "error" in answer_borrower(owner, far, pid=123, node_pid=456)
    assert "error" in answer_borrower(owner, far, pid=123, node_pid=None)
    assert "error" in answer_borrower(owner, {"what": "pg_drop"}, pid=123, node_pid=123)
    dropped = []

    class _Locked:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    owner = SimpleNamespace(locked=_Locked, remote_nodes=SimpleNamespace(
        bundles=SimpleNamespace(drop_loans=dropped.append)))
    assert answer_borrower(owner, far, pid=456, node_pid=456) == {"loan": None}
    assert dropped == [far_token(far["borrower"])]


def test_a_removal_goes_to_the_groups_holder_and_lends_nothing(tmp_path):
    """``pg_remove`` (a driver of another host's ``remove_placement_group``) is carried to
    the group's holder as a loan request is, naming the link; the link's end tells that
    driver nothing (no loan was made)."""
    server, asked = _served(tmp_path)
    answers = queue.Queue()
    ledger = _Ledger(os.getpid())
    relay = LoanRelay(ledger, lambda: str(tmp_path), post=lambda fn: fn())
    link = _Link("remote driver 127.0.0.2 pid 7")
    try:
        relay.forward(link, 2, "pg_remove", {"pg": PG}, answers.put)
        assert answers.get(timeout=10) == ("pg_loan", 2, {"loan": None})  # _served's answer
        request, _pid = asked.get(timeout=10)
        assert request.pop("borrower")[0] == link.name
        assert request == {"what": "pg_remove", "pg": PG}
        assert ledger.released == []  # the holder removes it, not the node
        relay.drop_link(link)
        assert asked.empty()
    finally:
        server.close()


def test_a_removal_whose_holder_does_not_listen_releases_the_group_here(tmp_path):
    """No state socket for the holder: the node releases a driver's group in its ledger
    itself (its holder's watch sees it, as a removal by a driver of the node); a detached
    one (the actor service's) it leaves, and loans stay None."""
    answers = []
    ledger = _Ledger(999999999)
    relay = LoanRelay(ledger, lambda: str(tmp_path), post=lambda fn: fn())
    relay.forward(_Link("l"), 1, "pg_remove", {"pg": PG}, answers.append)
    relay.forward(_Link("l"), 2, "pg_remove", {"pg": PG}, answers.append)  # gone already
    assert ledger.released == [PG]
    detached = _Ledger(999999999, detached=True)
    relay = LoanRelay(detached, lambda: str(tmp_path), post=lambda fn: fn())
    relay.forward(_Link("l"), 3, "pg_remove", {"pg": PG}, answers.append)
    assert detached.released == []
    assert answers == [("pg_loan", 1, {"removed": True}), ("pg_loan", 2, {"removed": False}),
                       ("pg_loan", 3, {"removed": False})]


def test_the_holder_removes_its_group_for_a_far_driver_only_from_its_node():
    asked = []
    owner = SimpleNamespace(pgs=SimpleNamespace(
        remove_asked=lambda hex_: asked.append(hex_) or True))
    far = {"what": "pg_remove", "pg": PG, "borrower": ["remote driver 127.0.0.2 pid 7", 1]}
    assert "error" in answer_borrower(owner, far, pid=123, node_pid=456)
    assert "error" in answer_borrower(owner, {"what": "pg_remove", "pg": PG}, pid=456,
                                      node_pid=456)
    assert asked == []
    assert answer_borrower(owner, far, pid=456, node_pid=456) == {"removed": True}
    assert asked == [PG]


def test_a_far_borrowers_actor_loan_is_its_until_kept_and_its_link_drop_gives_it_back():
    """The lender's side of an actor of a driver of another host (``remote_bundles`` step
    10): its node names the borrower; the room is lent for the actor, kept once the
    borrower says the service took it; its link to the node closing before it said keeps
    the room until the service is found not to hold the actor (``loans_ended``)."""
    from miniray._private.core import placement
    from miniray._private.owner.remote_bundles import RemoteBundle, RemoteBundles

    class _Locked:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    pg = "cd" * 18  # a group id's length: its bundles' resource names carry it
    owner = SimpleNamespace(locked=_Locked, closed=False, used=[])
    owner.note_placement_use = lambda: owner.used.append(True)
    book = RemoteBundles(owner, SimpleNamespace(local="head"))
    member = SimpleNamespace(node_id="member")
    book.adopt(pg, {1: RemoteBundle(pg, 1, {"CPU": 1.0}, member, object(), "l1", [])}, True)
    owner.remote_nodes = SimpleNamespace(bundles=book)
    node = 456

    def ask(what, name, **fields):
        return answer_borrower(owner, {"what": what, "borrower": name, **fields}, node, node)

    first, second = ["remote driver 127.0.0.3 pid 7", 1], ["remote driver 127.0.0.3 pid 8", 2]
    lend = {"pg": pg, "index": -1, "base": {"CPU": 1.0}, "held": {"CPU": 0.5}}
    assert ask("pg_lend", first, actor="aa", **lend) == {"loan": [1, "member", []]}
    assert ask("pg_lend", second, actor="bb", **lend) == {"loan": None}  # no room left
    assert ask("pg_kept", second, pg=pg, actor="aa", kept=True) == {"loan": None}
    assert book.actor_loans_unsent == {b"\xaa": far_token(first)}  # only from its borrower
    assert ask("pg_drop", first) == {"loan": None}  # its link closed before it said
    # the service may hold the actor already: lent until the watch finds it does not
    assert book.actor_loans_unsent == {} and set(book.loans) == {b"\xaa"}
    assert set(book.actor_loans_dropped) == {b"\xaa"}
    book.end_loan(b"\xaa")  # the watch's answer (SVC_ALIVE: not held) after the grace
    assert book.groups[pg][1].free == {"CPU": 1.0} and book.actor_loans_dropped == {}
    assert ask("pg_lend", second, actor="bb", **lend) == {"loan": [1, "member", []]}
    assert ask("pg_kept", second, pg=pg, actor="bb", kept=True) == {"loan": None}
    assert owner.used and b"\xbb" in book.loans  # the watch keeps it now
    assert ask("pg_drop", second) == {"loan": None}  # kept: the service holds the actor
    assert book.groups[pg][1].free == {"CPU": 0.5}
    assert placement.bundle_request(book.loans[b"\xbb"][1])[1] == 1  # "any" made bundle 1
