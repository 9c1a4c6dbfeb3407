"""Asking several peers at once, within one bound.

Owns: ``ask_all``: each of a few peers asked by the caller's ``ask`` on a thread of its own,
the answers gathered until all came or the bound passed; a peer that raised, or did not
answer in time, is named with why. Its threads end on their own (each ``ask`` must be
bounded by its own timeout); nothing waits for a late one.
Does not own: what is asked, or how (the caller's ``ask``).
Called by: ``state_api._far_groups`` and ``owner/far_groups.py`` (the other nodes of a
cluster),
``node/group_listing.py`` (the drivers of a node).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def ask_all(peers: dict, ask: Callable[[Any], Any], wait_s: float,
            name: str = "miniray-ask") -> tuple[dict, dict]:
    """``peers`` (``{key: peer}``) each asked by ``ask(peer)`` at once, on a thread of its
    own named ``name``: ``({key: its answer}, {key: why it is missing})`` once every one
    answered or ``wait_s`` seconds after the start: one not done by then is missing
    ("did not answer within ..."), one whose ``ask`` raised is missing with its error."""
    answers: dict = {}
    missing: dict = {}
    done = threading.Condition()

    def one(key, peer) -> None:
        try:
            answer, why = ask(peer), None
        except Exception as error:  # noqa: BLE001 - the peer's failure is its answer
            answer, why = None, str(error) or type(error).__name__
        with done:
            if why is None:
                answers[key] = answer
            else:
                missing[key] = why
            done.notify_all()

    for key, peer in peers.items():
        threading.Thread(target=one, args=(key, peer), daemon=True, name=name).start()
    deadline = time.monotonic() + wait_s
    with done:
        while len(answers) + len(missing) < len(peers):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(left)
        late = {key: f"did not answer within {wait_s:g}s" for key in peers
                if key not in answers and key not in missing}
        return dict(answers), {**missing, **late}
