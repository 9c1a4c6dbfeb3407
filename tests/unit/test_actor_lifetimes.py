"""The actor service's lifetime decisions (pure): which named actor ends, and when."""

from __future__ import annotations

import doctest

from miniray._private.node import actor_service
from miniray._private.node.actor_service import Lifetimes


def test_docstring_examples():
    assert doctest.testmod(actor_service, raise_on_error=False).failed == 0


def test_a_named_actor_ends_when_the_last_driver_holding_it_lets_go():
    life = Lifetimes()
    life.created(b"a", "A", detached=False)
    life.hold(b"a", "A")
    life.hold(b"a", "B")
    assert life.release(b"a", "A") is False  # B still holds it
    assert life.release(b"a", "B") is True
    assert life.release(b"a", "B") is False  # already ended: told once


def test_a_detached_actor_never_ends_by_handles_or_by_its_creator_leaving():
    life = Lifetimes()
    life.created(b"d", "A", detached=True)
    life.hold(b"d", "A")
    assert life.release(b"d", "A") is False
    life.hold(b"d", "A")
    assert life.client_gone("A") == ([], [])


def test_the_creator_leaving_kills_what_it_created_and_releases_what_it_held():
    life = Lifetimes()
    life.created(b"mine", "A", detached=False)
    life.created(b"theirs", "B", detached=False)
    life.created(b"kept", "B", detached=False)
    for actor in (b"mine", b"theirs", b"kept"):
        life.hold(actor, "A")
    life.hold(b"kept", "B")
    kill, end = life.client_gone("A")
    assert kill == [b"mine"]
    assert end == [b"theirs"]  # only A held it; B still holds b"kept"
    assert life.client_gone("A") == ([], [])  # nothing twice


def test_release_without_hold_and_unknown_actors_change_nothing():
    life = Lifetimes()
    assert life.release(b"x", "A") is False
    life.hold(b"x", "A")  # not created through the service (e.g. by one of its own actors)
    assert life.holders == {}
    life.created(b"a", "A", detached=False)
    assert life.release(b"a", "B") is False
    life.forget(b"a")
    assert life.client_gone("A") == ([], [])


def test_a_detached_actor_in_its_creators_own_group_ends_with_the_creator_only():
    # Its placement group is the creator's (not detached): the group, and so the actor,
    # ends when the creator leaves; no handle's release ends it before.
    life = Lifetimes()
    life.created(b"t", "A", detached=True, tied=True)
    life.created(b"d", "A", detached=True)
    for holder in ("A", "B"):
        life.hold(b"t", holder)
    assert life.release(b"t", "B") is False
    assert life.release(b"t", "A") is False
    life.hold(b"t", "B")
    assert life.client_gone("B") == ([], [])  # a holder leaving: still the creator's
    assert life.client_gone("A") == ([b"t"], [])  # b"d" stays: detached on its own
    assert life.tied == set() and life.detached == {b"d"}
    assert life.client_gone("A") == ([], [])


def test_tied_means_nothing_without_detached():
    life = Lifetimes()
    life.created(b"a", "A", detached=False, tied=True)
    assert life.tied == set()
    life.hold(b"a", "A")
    assert life.release(b"a", "A") is True  # a named actor's rule
