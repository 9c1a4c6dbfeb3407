"""A worker's report of the refs and actor handles it holds (``WorkerRuntime.borrow_report``):
actor handle events reach the owner in order, only when what the worker holds changes (or a
handle is pickled), and a handle taken and dropped between two reports is reported both
ways, so the owner's count can reach zero. A real runtime over a channel that sends nowhere."""

from __future__ import annotations

from miniray._private.core import protocol
from miniray._private.worker import worker_api


class _Conn:
    def __init__(self):
        self.sent = []

    def send(self, data):
        self.sent.append(data)


def _runtime():
    return worker_api.WorkerRuntime(worker_api.Channel(_Conn()), {})


A, B = b"a" * 16, b"b" * 16


def test_handle_events_are_reported_when_what_the_worker_holds_changes():
    rt = _runtime()
    assert rt.borrow_report() is None
    rt.actor_handle_event(A, 1)
    rt.actor_handle_event(A, 1)  # a second handle to A: no change for the owner
    rt.actor_handle_event(B, 1)
    report = rt.borrow_report()
    assert report[0] == protocol.BORROW and report[1:4] == ([], [], [])
    assert report[4] == [(A, 1), (B, 1)]
    rt.actor_handle_event(A, -1)
    assert rt.borrow_report() is None  # one handle to A is still held
    rt.actor_handle_event(A, 0)  # pickled: it may be held elsewhere now
    rt.actor_handle_event(A, -1)
    assert rt.borrow_report()[4] == [(A, 0), (A, -1)]


def test_a_handle_made_and_dropped_between_reports_is_reported_both_ways():
    rt = _runtime()
    rt.actor_handle_event(A, 1)
    rt.actor_handle_event(A, -1)
    rt.actor_handle_event(A, 1)
    assert rt.borrow_report()[4] == [(A, 1), (A, -1), (A, 1)]


def test_refs_and_handles_go_in_one_report():
    rt = _runtime()
    oid = b"o" * 28
    rt.ref_created(oid)
    rt.actor_handle_event(A, 1)
    assert rt.borrow_report() == (protocol.BORROW, [oid], [], [], [(A, 1)])
