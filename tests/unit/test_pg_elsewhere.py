"""What a driver's task in another driver's placement group bundle on another node is told
(``placement_group_nodes.PlacementGroupNodes.elsewhere``): why it cannot run there and what
to do instead. A stand-in owner and ledger; no processes."""

from __future__ import annotations

import contextlib
import os
import threading
from types import SimpleNamespace

from miniray._private.core import placement
from miniray._private.owner.placement_group_nodes import PlacementGroupNodes

PG = "ab" * 18
HOLDER = 4242  # the pid of the driver holding the group


class _Groups(PlacementGroupNodes):
    def __init__(self, record: dict, head_elsewhere: bool, session_dir: str = "",
                 held=None):
        link = SimpleNamespace(on_another_host=lambda: head_elsewhere)
        self.noted: list = []
        self.held = held  # the head's service's answer to SVC_PG_TABLE (an error: raised)

        def note_served(*args, **options):
            self.noted.append(args + tuple(options.values()))

        def table_in_service():
            if isinstance(self.held, Exception):
                raise self.held
            return dict(self.held or {})

        remote = SimpleNamespace(bundles=SimpleNamespace(
            served_pending=set(), note_served=note_served))
        self.owner = SimpleNamespace(remote_nodes=remote,
                                     actors=SimpleNamespace(link=link,
                                                            table_in_service=table_in_service),
                                     hello_info={"session_dir": session_dir},
                                     locked=contextlib.nullcontext)
        lease = SimpleNamespace(group=record, holder_pid=HOLDER)  # another driver's
        self.ledger = SimpleNamespace(groups=lambda: {PG: lease} if record else {})
        self.node_id = "node-a"
        self.pid = HOLDER + 1
        self._far_known = None
        self._far_held = {}


def _why(record: dict, head_elsewhere: bool, index: int = 1) -> str | None:
    request = placement.rewrite_request({"CPU": 1}, PG, index)
    return _Groups(record, head_elsewhere).elsewhere(request)


def test_a_member_drivers_task_in_the_heads_detached_group_borrows_room_in_any_bundle():
    """A driver whose actor service is the head's, on another host, reads the groups that
    service holds (``_reserved``): its task in any bundle of one, its own node's too, is
    noted to borrow room there (``everywhere``), not failed. A service that cannot answer
    now leaves the groups as last read (they do not look removed)."""
    from miniray._private.owner.actor_link import ServiceUnavailable

    record = {"id": PG, "name": "g", "detached": True, "nodes": ["node-b", "node-a"]}
    groups = _Groups({}, head_elsewhere=True, held={PG: record})
    for index in (0, 1, -1):
        assert groups.elsewhere(placement.rewrite_request({"CPU": 1}, PG, index)) is None
    assert groups.noted == [(PG, ["node-b", "node-a"], True)] * 3
    groups.held = ServiceUnavailable("the head's actor service did not answer")
    assert PG in groups._reserved()
    groups.held = RuntimeError("not asked")  # the watch's groups are none of the service's:
    assert groups._reserved(only={"cd" * 18}) == {}  # no request
    groups.held = {}
    assert PG not in groups._reserved()  # removed in the service
    assert _Groups({}, head_elsewhere=False, held={PG: record})._reserved() == {}


def test_a_group_of_another_driver_says_to_create_it_here():
    """Its driver does not lend (no state socket): the task cannot run there."""
    record = {"name": "g", "nodes": ["node-b"], "job_id": "07"}
    why = _why(record, head_elsewhere=False, index=0)
    assert "only the driver that created the group (job 07)" in why
    assert "its state socket is not there" in why and "Create the group in this driver" in why


def test_a_group_of_another_driver_that_lends_is_noted_with_its_state_socket(
        tmp_path, monkeypatch):
    """``remote_bundles`` step 9: the group's holder listens on its state socket; the
    task is not failed, and the group is noted with that socket as its lender."""
    from miniray._private.transport import state_socket

    monkeypatch.setattr(state_socket.procinfo, "start_time", lambda pid: 99)
    path = state_socket.socket_path(str(tmp_path), HOLDER)
    os.makedirs(os.path.dirname(path))
    open(path, "w").close()  # stands for the listening socket
    record = {"name": "g", "nodes": ["node-a", "node-b"], "job_id": "07"}
    groups = _Groups(record, head_elsewhere=False, session_dir=str(tmp_path))
    assert groups.elsewhere(placement.rewrite_request({"CPU": 1}, PG, 1)) is None
    assert groups.noted == [(PG, ["node-a", "node-b"], path)]
    groups.pid = HOLDER  # the holder itself borrows from nobody (its own group)
    assert groups._lender_of(SimpleNamespace(group=record, holder_pid=HOLDER)) is None


# ---------------------------------------------------------- a lent actor's kill, asked again
class _Actors:
    def __init__(self, failures: int):
        self.failures = failures
        self.asked: list = []
        self.link = SimpleNamespace(leaving=threading.Event())  # ActorLink.leaving

    def kill_in_service(self, actor_id: bytes, no_restart: bool, group: str = "") -> None:
        self.asked.append((actor_id, group))
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the head's actor service stopped answering (a blip)")


def _lender(actors) -> PlacementGroupNodes:
    groups = _Groups({}, head_elsewhere=True)
    groups.owner = SimpleNamespace(actors=actors, closed=False)
    return groups


def test_a_lent_actors_kill_the_service_did_not_take_is_asked_again(monkeypatch):
    """Defect: the kill of a named actor lent room in a removed (or moved) bundle was asked
    once; a blip of the link to the actor service left it running for good (a far lender
    is the only one that tells the service). Now it is asked again, bounded."""
    import time

    from miniray._private.owner import placement_group_nodes as pgn

    monkeypatch.setattr(pgn, "KILL_LENT_PAUSE_S", 0.01)
    actors = _Actors(failures=2)
    _lender(actors)._kill_lent([(b"\x01" * 16, "ab12")])
    deadline = time.monotonic() + 5
    while len(actors.asked) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    # two blips, then taken; no more asks; each ask names the removed group
    assert actors.asked == [(b"\x01" * 16, "ab12")] * 3


def test_a_lent_actors_kill_gives_up_after_its_tries_and_says_so(monkeypatch, capsys):

    from miniray._private.owner import placement_group_nodes as pgn

    monkeypatch.setattr(pgn, "KILL_LENT_PAUSE_S", 0.005)
    actors = _Actors(failures=100)
    lender = _lender(actors)
    lender._kill_lent_again([(b"\x02" * 16, "")])  # the thread's body, run here
    assert len(actors.asked) == pgn.KILL_LENT_TRIES - 1
    assert "could not kill 1 named actor(s)" in capsys.readouterr().err
    actors.link.leaving.set()  # the driver shutting down: no more tries
    actors.asked.clear()
    lender._kill_lent_again([(b"\x03" * 16, "")])
    assert actors.asked == []


def test_a_lent_actors_kill_asked_again_ends_at_once_at_shutdown_without_polling(
        monkeypatch):
    """Defect: the thread that asks the kill again looked at ``owner.closed`` every 50 ms
    while it paused (up to 3.5 s): 70 wake-ups for nothing, and a shutdown seen up to
    50 ms late. Now it waits on the link's ``leaving`` event: no wake-up until its pause
    ends, and the shutdown ends it at once."""
    import time

    from miniray._private.owner import placement_group_nodes as pgn

    monkeypatch.setattr(pgn, "KILL_LENT_PAUSE_S", 30.0)
    slept: list = []
    monkeypatch.setattr(pgn.time, "sleep", slept.append, raising=False)
    actors = _Actors(failures=100)
    lender = _lender(actors)
    thread = threading.Thread(target=lender._kill_lent_again, args=([(b"\x04" * 16, "")],))
    thread.start()
    threading.Event().wait(0.1)  # (time.sleep is counted)
    t0 = time.monotonic()
    actors.link.leaving.set()  # ActorLink.close at the driver's shutdown
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - t0 < 0.05
    assert slept == [] and actors.asked == []  # never woke up, never asked
