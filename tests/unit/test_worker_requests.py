"""A worker's get and wait requests at the owner (``owner/requests.py``) when the waiting
call is cancelled: its waits are answered CANCELLED, pending and later ones, and the worker
is no longer counted blocked. A real object table over a fake store; no processes."""

from __future__ import annotations

import threading
import types

from miniray._private.core import protocol
from miniray._private.owner.object_table import ObjectTable
from miniray._private.owner.requests import WorkerRequests
from miniray._private.owner.workers import WorkerSlot


class _Store:
    def __init__(self):
        self.data = {}

    def put_serialized(self, object_id, data):
        self.data[object_id] = data

    def inline_bytes(self, object_id):
        return self.data[object_id]

    def free(self, object_id):
        self.data.pop(object_id, None)


CALL_A, CALL_B = b"a" * 24, b"b" * 24
OBJ = b"o" * 28


def _requests():
    objects = ObjectTable(_Store(), threading.Lock(), lambda: None)
    sent: list = []
    pool = types.SimpleNamespace(blocked=0)
    requests = WorkerRequests(
        objects=objects, store=objects.store, reactor=types.SimpleNamespace(call_later=None),
        workers=pool, leases=types.SimpleNamespace(
            window=types.SimpleNamespace(note_release=lambda: None)),
        ledger=None, actors=None, lock=threading.Lock(),
        send=lambda worker, message: sent.append(message), defer=lambda action: action(),
        ledger_later=lambda *args: None, dispatch_all=lambda: None, cancel=None,
        release_idle_leases=None, hello_info={}, streams=None)
    worker = WorkerSlot(None, None, 0)
    objects.ensure(OBJ)
    return requests, objects, worker, pool, sent


def test_a_cancelled_calls_pending_get_is_answered_cancelled_and_unblocks_the_worker():
    requests, objects, worker, pool, sent = _requests()
    requests.on_get(worker, 1, [OBJ], None, CALL_A)
    requests.on_wait(worker, 2, [OBJ], 1, None, CALL_B)
    assert worker.blocked == 2 and pool.blocked == 1 and sent == []
    requests.interrupt(worker, CALL_A)
    assert sent == [(protocol.REPLY, 1, protocol.CANCELLED)]
    assert worker.blocked == 1 and list(worker.waits) == [2]
    objects.set_ready(OBJ, protocol.OK, b"v")  # only the other call's wait is answered now
    assert sent[1:] == [(protocol.REPLY, 2, [OBJ])]
    assert worker.blocked == 0 and pool.blocked == 0 and worker.waits == {}


def test_later_waits_of_a_cancelled_call_are_answered_at_once_until_it_ends():
    requests, objects, worker, pool, sent = _requests()
    requests.interrupt(worker, CALL_A)  # the cancel came before the call's first wait
    requests.on_wait(worker, 1, [OBJ], 1, 5.0, CALL_A)
    requests.on_get(worker, 2, [OBJ], None, CALL_A)
    assert sent == [(protocol.REPLY, 1, protocol.CANCELLED), (protocol.REPLY, 2,
                                                              protocol.CANCELLED)]
    assert worker.blocked == 0
    requests.call_ended(worker, CALL_A)
    requests.on_get(worker, 3, [OBJ], None, CALL_A)
    assert worker.blocked == 1 and len(sent) == 2


def test_a_wait_outside_a_call_is_never_interrupted():
    requests, objects, worker, pool, sent = _requests()
    requests.on_wait(worker, 1, [OBJ], 1, None, None)
    requests.interrupt(worker, CALL_A)
    assert sent == [] and worker.blocked == 1 and worker.waits == {}
    objects.set_ready(OBJ, protocol.OK, b"v")
    assert sent == [(protocol.REPLY, 1, [OBJ])] and worker.blocked == 0


def test_abandon_stops_a_wait_unless_it_already_finished():
    objects = ObjectTable(_Store(), threading.Lock(), lambda: None)
    objects.ensure(OBJ)
    finished: list = []
    abandon = objects.await_objects([OBJ], 1, False, finished.append, None, None)
    assert abandon() is True and abandon() is False
    objects.set_ready(OBJ, protocol.OK, b"v")
    assert finished == []
    other = b"p" * 28
    objects.ensure(other)
    abandon = objects.await_objects([other], 1, False, finished.append, None, None)
    objects.set_ready(other, protocol.OK, b"v")
    assert finished == [False] and abandon() is False
    assert objects.await_objects([OBJ], 1, False, finished.append, None, None) is None
