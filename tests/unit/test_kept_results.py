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
