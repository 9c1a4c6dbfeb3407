"""The owner's lease book (``owner/leases.py``) over a real ledger file, without processes:
acquire with one retry after making room, release noting the retry window, which lease has
room, and which leases are idle."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from miniray._private.core.scheduling import lease_with_room
from miniray._private.ledger.ledger import Ledger
from miniray._private.owner.leases import LeaseBook, LeaseSlot


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger.create(str(tmp_path / "ledger.json"), {"CPU": 2, "GPU": 1},
                           {"GPU": ["0"]})
    yield ledger
    ledger.close()


def _book(ledger, make_room=lambda: False, later=None):
    return LeaseBook(ledger=ledger, pid=os.getpid(), gpu_keys=None, host_gpu_timeout=None,
                     make_room=make_room, on_unschedulable=lambda key, message: None,
                     call_later=later if later is not None else (lambda delay, fn: None))


def _worker(blocked=0, inflight=()):
    return SimpleNamespace(blocked=blocked, inflight=list(inflight))


def test_acquire_takes_from_the_ledger_and_release_gives_back(ledger):
    book = _book(ledger)
    lease, host_lease = book.acquire({"CPU": 1, "GPU": 1}, "t", ("k",))
    assert lease is not None and host_lease is None  # no physical GPU keys: no host ledger
    assert book.gpu_ids(lease) == ["0"]
    assert ledger.available().get("GPU", 0) == 0
    releases = book.window.releases
    book.release(lease.lease_id, host_lease)
    assert ledger.available() == {"CPU": 2.0, "GPU": 1.0}
    assert book.window.releases == releases + 1


def test_release_without_note_leaves_the_window(ledger):
    book = _book(ledger)
    lease, _ = book.acquire({"CPU": 1}, "t")
    book.release(lease.lease_id, None, note=False)
    assert book.window.releases == 0


def test_a_full_ledger_makes_room_once_then_tries_again(ledger):
    held, _ = _book(ledger).acquire({"CPU": 2}, "other")
    calls = []

    def make_room():
        calls.append(1)
        ledger.release(held.lease_id)  # an idle lease went back
        return True

    lease, _ = _book(ledger, make_room).acquire({"CPU": 1}, "t")
    assert lease is not None and calls == [1]


def test_no_room_to_make_returns_none(ledger):
    _book(ledger).acquire({"CPU": 2}, "other")
    calls = []
    book = _book(ledger, lambda: calls.append(1) or False)
    assert book.acquire({"CPU": 1}, "t") == (None, None)
    assert calls == [1]


def test_add_remove_and_idle(ledger):
    book = _book(ledger)
    busy = LeaseSlot("L1", "k", _worker(inflight=["task"]), None)
    free = LeaseSlot("L2", "k", _worker(), None)
    free.idle_since = 1.0
    assert not book and lease_with_room(book.by_key.get("k")) is None
    book.add(busy)
    book.add(free)
    assert len(book) == 2 and book.any_idle()
    assert book.idle_slots(now=1.2, linger=0.5, force=False) == []
    assert book.idle_slots(now=1.6, linger=0.5, force=False) == [free]
    assert book.idle_slots(now=1.2, linger=0.5, force=True) == [free]
    assert lease_with_room(book.by_key["k"]) is free  # the owner's dispatch asks so
    book.remove(free)
    book.remove(busy)
    book.remove(busy)  # twice is harmless
    assert not book and "k" not in book.by_key


def test_next_idle_check_wakes_at_the_linger_then_asks_until_the_keep(ledger):
    book = _book(ledger)
    assert book.next_idle_check(5.0, linger=0.005, keep=0.25, check_every=0.02) is None
    book.add(LeaseSlot("L1", "k", _worker(inflight=["task"]), None))  # busy: never counts
    assert book.next_idle_check(5.0, linger=0.005, keep=0.25, check_every=0.02) is None
    young = LeaseSlot("L2", "k", _worker(), None)
    young.idle_since = 5.0
    book.add(young)
    assert book.next_idle_check(5.001, 0.005, 0.25, 0.02) == pytest.approx(0.004)
    assert book.next_idle_check(5.1, 0.005, 0.25, 0.02) == pytest.approx(0.02)  # ask again
    assert book.next_idle_check(5.24, 0.005, 0.25, 0.02) == pytest.approx(0.01)  # keep ends
    assert book.next_idle_check(5.3, 0.005, 0.25, 0.02) == 0.0  # due now
    old = LeaseSlot("L3", "k2", _worker(), None)
    old.idle_since = 4.0
    book.add(old)
    assert book.next_idle_check(5.001, 0.005, 0.25, 0.02) == 0.0  # the soonest wins
