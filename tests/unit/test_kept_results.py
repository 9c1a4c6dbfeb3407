"""The driver's book of results kept on other nodes (``owner/remote_objects.KeptResults``):
what it holds for a link that was lost goes when a new link replaces it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from miniray._private.owner.remote_objects import KeptResults


class _Link:  # a RemoteNodeClient as the book sees it: hashable, ``lost`` or not
    def __init__(self, lost):
        self.lost = lost


class _Channel:
    closed = False

    def close(self):
        self.closed = True


def test_a_lost_links_grant_key_slots_and_idle_pulls_go_when_it_is_replaced():
    kept = KeptResults(SimpleNamespace(owner=None), None, None, 1.0)
    lost, alive = object(), object()
    idle = [_Channel(), _Channel()]
    kept._grant_keys.update({lost: b"k1", alive: b"k2"})
    kept._pulls.update({lost: list(idle), alive: [_Channel()]})
    kept._pull_slots.update({lost: threading.BoundedSemaphore(8),
                             alive: threading.BoundedSemaphore(8)})
    kept.forget_link(lost)
    assert list(kept._grant_keys) == [alive] and list(kept._pulls) == [alive]
    assert list(kept._pull_slots) == [alive]
    assert all(channel.closed for channel in idle)
    assert not kept._pulls[alive][0].closed
    kept.forget_link(lost)  # twice: nothing left to drop


def test_a_lost_links_slots_and_idle_pulls_are_not_kept_after_it_is_forgotten():
    kept = KeptResults(SimpleNamespace(owner=None, closed=False), None, None, 1.0)
    lost, alive = _Link("gone"), _Link(None)
    assert kept._slots(lost) is not kept._slots(lost)  # a late reader's own, not kept
    assert kept._slots(alive) is kept._slots(alive)
    assert list(kept._pull_slots) == [alive]
    channel = _Channel()
    kept._pull_idle(lost, channel)
    assert channel.closed and lost not in kept._pulls
    kept._pull_idle(alive, _Channel())
    assert len(kept._pulls[alive]) == 1


def test_granted_pulls_share_their_nodes_slots_and_are_never_kept_idle():
    """A result the actor service keeps for this driver is pulled on a connection that
    carries the service's grant of that one object (``_Granted``): such connections share
    one set of slots per node and are closed after their pull, never pooled."""
    from miniray._private.owner.remote_objects import _Granted

    kept = KeptResults(SimpleNamespace(owner=None, closed=False), None, None, 1.0)
    one = _Granted(("127.0.0.2", 7000), "t" * 16, b"\1" * 28, b"g" * 32, "n", "127.0.0.1", 1)
    two = _Granted(["127.0.0.2", 7000], "t" * 16, b"\2" * 28, b"g" * 32, "n", "127.0.0.1", 1)
    other = _Granted(("127.0.0.3", 7000), "t" * 16, b"\3" * 28, b"g" * 32, "n", "127.0.0.1", 1)
    assert kept._slots(one) is kept._slots(two) is not kept._slots(other)
    channel = _Channel()
    kept._pull_idle(one, channel)
    assert channel.closed and not kept._pulls
    one.node_dead("held dead")
    assert "127.0.0.2:7000" in one.lost and two.lost is None


def test_the_actor_services_hand_on_grants_one_object_to_the_callers_node_and_ip():
    """``hand_on`` (the service's side): N's address, its link's tag and the grant that N
    checks for exactly that object, node id and IP; None without the link's key, or once
    the link is lost."""
    from miniray._private.core import pull_grants

    kept = KeptResults(SimpleNamespace(owner=None), None, None, 1.0)
    link = _Link(None)  # hashable, as a RemoteNodeClient
    link.kept, link.address = ("t" * 16, 1 << 20), ("127.0.0.2", 7000)
    object_id = b"\7" * 28
    kept._homes[object_id] = link
    assert kept.hand_on(object_id, "node-d", "127.0.0.1") is None  # no key asked yet
    key = pull_grants.new_key()
    kept._grant_keys[link] = key
    address, tag, grant = kept.hand_on(object_id, "node-d", "127.0.0.1")
    assert address == ["127.0.0.2", 7000] and tag == "t" * 16
    assert pull_grants.check_grant(key, object_id, "node-d", "127.0.0.1", grant) is None
    assert pull_grants.check_grant(key, object_id, "node-d", "127.0.0.3", grant) is not None
    assert kept.hand_on(b"\x08" * 28, "node-d", "127.0.0.1") is None  # not kept by it
    assert kept.hand_on(object_id, "", "127.0.0.1") is None  # a caller that named no node
    link.lost = "gone"
    assert kept.hand_on(object_id, "node-d", "127.0.0.1") is None


def test_the_proxies_tell_a_kept_item_from_any_other_payload():
    import doctest

    from miniray._private.owner import actor_service_proxies

    assert doctest.testmod(actor_service_proxies, raise_on_error=False).failed == 0


def test_a_granted_pull_refused_every_time_is_pulled_again_by_the_next_reader(monkeypatch):
    """Defect: a pull of a result the actor service kept, refused by its node each time
    (the link's pulls all taken by other callers), was asked again for about 1 s and then
    left an ObjectLostError on the object for good, while the node still held it. Now the
    node says "busy", the pull is asked again with doubling pauses, and if the node still
    refuses, the waiters of now get the error and the next reader pulls again
    (``RemoteCopy.again``). A close without that answer (the link or the object gone on
    the node) stays final at once."""
    import contextlib

    from miniray._private.core import protocol
    from miniray._private.owner import remote_objects
    from miniray._private.owner.object_table import PENDING
    from miniray._private.owner.remote_objects import _Granted

    monkeypatch.setattr(remote_objects, "GRANTED_RETRY_S", 0.001)
    monkeypatch.setattr(remote_objects, "GRANTED_RETRY_MAX_S", 0.004)
    object_id = b"\1" * 28
    ready = []
    entry = SimpleNamespace(remote=None, state=PENDING, kind=protocol.OK)
    objects = SimpleNamespace(get=lambda oid: entry,
                              set_ready=lambda oid, kind, payload: ready.append(kind))
    store = SimpleNamespace(recycled_for=lambda oid, size: None,
                            make_room=lambda oid, size: None, give_up_recycled=print,
                            shm_dir="/nowhere", session_tag="t" * 16)
    owner = SimpleNamespace(store=store, objects=objects, locked=contextlib.nullcontext,
                            hello_info={}, closed=False)
    kept = KeptResults(SimpleNamespace(owner=owner, last_view=lambda: []), None, None, 1.0)
    asked = []

    class Refused(_Channel):
        def send(self, message):
            asked.append(message)

        def recv(self, timeout=None):
            return ("error", 1, "busy", "this link's 8 pulls are all taken; ask again")

    monkeypatch.setattr(kept, "_pull_channel", lambda *args: Refused())
    monkeypatch.setattr(kept, "_watch", lambda *args: None)
    monkeypatch.setattr(kept, "_unwatch", lambda channel: None)
    client = _Granted(("127.0.0.2", 7000), "t" * 16, object_id, b"g" * 32, "n", "127.0.0.1",
                      1.0)
    copy = SimpleNamespace(size=1 << 20, node_id="n" * 12, again=None)
    entry.remote = copy
    kept._pull(client, object_id, copy)
    assert len(asked) == remote_objects.GRANTED_TRIES
    assert ready == [protocol.ERR] and copy.again == protocol.OK  # pulled again later

    class Closed(Refused):  # no answer: the link or the object gone on N, not busy
        def recv(self, timeout=None):
            raise ConnectionError("closed by the node before it answered")

    monkeypatch.setattr(kept, "_pull_channel", lambda *args: Closed())
    asked.clear()
    ready.clear()
    copy.again = None
    kept._pull(client, object_id, copy)
    assert len(asked) == 1 and ready == [protocol.ERR] and copy.again is None  # final
