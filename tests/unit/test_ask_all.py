"""``core/ask_all.py``: peers asked at once, the answers gathered within one bound."""

from __future__ import annotations

import threading

from miniray._private.core.ask_all import ask_all


def test_peers_are_asked_at_once_and_one_that_does_not_answer_is_missing():
    stuck = threading.Event()  # released once ask_all returned
    asked = []

    def ask(peer):
        asked.append(peer)
        if peer == "stuck":
            stuck.wait(30)
            return "late"
        if peer == "refusing":
            raise ConnectionRefusedError("refused")
        return peer.upper()

    try:
        answers, missing = ask_all({1: "stuck", 2: "fine", 3: "refusing"}, ask, 0.2)
    finally:
        stuck.set()
    assert sorted(asked) == ["fine", "refusing", "stuck"]
    assert answers == {2: "FINE"}
    assert missing == {1: "did not answer within 0.2s", 3: "refused"}


def test_nothing_to_ask_returns_at_once_and_an_error_without_text_is_named():
    assert ask_all({}, lambda _peer: 1 / 0, 30.0) == ({}, {})

    def ask(_peer):
        raise TimeoutError()

    assert ask_all({"a": 1}, ask, 30.0) == ({}, {"a": "TimeoutError"})
