"""The requests of a detached placement group between a driver and the node's actor service
(``node/actor_service.py``, ``owner/actor_link.py``) without processes: every request is
answered, and a driver's wait for an answer is bounded."""

from __future__ import annotations

import pickle
import socket
import threading
import time
import types

import pytest

from miniray._private.core import protocol, serialization
from miniray._private.node.actor_service import ActorService
from miniray._private.owner import actor_link
from miniray._private.transport.framing import FramedSocket


class _Conn:
    fd = 7

    def __init__(self):
        self.sent: list = []
        self.event = threading.Event()

    def send(self, data):
        self.sent.append(pickle.loads(data))
        self.event.set()


def _service(pgs):
    service = object.__new__(ActorService)
    lock = threading.RLock()
    service.owner = types.SimpleNamespace(pgs=pgs, locked=lambda: lock)
    conn = _Conn()
    service._conns = {conn.fd: (conn, None, "control")}
    return service, conn


class _Fatal(BaseException):
    pass


class _Unpicklable(Exception):
    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


@pytest.mark.parametrize("error", [_Fatal("stop"), _Unpicklable(), ValueError("bad")])
@pytest.mark.parametrize("tag", [protocol.SVC_PG_CREATE, protocol.SVC_PG_REMOVE,
                                 protocol.SVC_PG_TABLE])
def test_every_group_request_is_answered_whatever_its_thread_meets(error, tag):
    def fail(*args):
        raise error

    service, conn = _service(types.SimpleNamespace(serve_create=fail, serve_remove=fail,
                                                   served_records=fail))
    message = {protocol.SVC_PG_CREATE: (tag, "ab" * 18, [{"CPU": 1.0}], "PACK", ""),
               protocol.SVC_PG_TABLE: (tag,)}.get(tag, (tag, "ab" * 18))
    service._group_request(conn, message)
    assert conn.event.wait(5), "the driver's request was never answered"
    (status, value), = conn.sent
    assert status == protocol.SVC_ERR
    raised = serialization.loads(value)
    if isinstance(error, ValueError):
        assert type(raised) is ValueError
    else:  # named: the request and what happened
        assert isinstance(raised, RuntimeError)
        assert protocol.tag_name("actor_service", tag) in str(raised)
        assert type(error).__name__ in str(raised)


def test_a_group_request_answered_ok_when_it_works():
    pgs = types.SimpleNamespace(serve_create=lambda *a: "PENDING", serve_remove=lambda h: True)
    service, conn = _service(pgs)
    service._group_request(conn, (protocol.SVC_PG_REMOVE, "ab" * 18))
    assert conn.event.wait(5)
    assert conn.sent == [(protocol.SVC_OK, True)]
    conn.event.clear()
    record = {"id": "ab" * 18, "nodes": ["head", "member"]}
    service.owner.pgs.served_records = lambda: {"ab" * 18: record}
    service._group_request(conn, (protocol.SVC_PG_TABLE,))  # a member's driver reads it
    assert conn.event.wait(5)
    assert conn.sent[-1] == (protocol.SVC_OK, {"ab" * 18: record})


def test_a_driver_waits_for_an_answer_at_most_the_request_timeout(monkeypatch):
    """A service that never answers: ServiceUnavailable names the request and the time
    waited, and the link is closed (the next request opens a new one)."""
    monkeypatch.setattr(actor_link, "REQUEST_TIMEOUT_S", 0.3)
    lock = threading.RLock()
    lost: list = []
    owner = types.SimpleNamespace(
        locked=lambda: lock, reactor=types.SimpleNamespace(unregister=lambda fd: None),
        actors=types.SimpleNamespace(on_link_lost=lost.append))
    link = actor_link.ActorLink(owner, "/nonexistent/actors.sock")
    ours, theirs = socket.socketpair()
    try:
        ours.settimeout(actor_link.REQUEST_TIMEOUT_S)  # as _connect_local sets it
        link._control = FramedSocket(ours)
        ours.settimeout(actor_link.REQUEST_TIMEOUT_S)
        started = time.monotonic()
        with pytest.raises(actor_link.ServiceUnavailable) as caught:
            link._request((protocol.SVC_PG_CREATE, "ab" * 18, [{"CPU": 1.0}], "PACK", ""))
        assert time.monotonic() - started < 5
        assert "did not answer SVC_PG_CREATE within 0.3 s" in str(caught.value)
        assert link._control is None and lost  # closed: its proxies' calls failed
    finally:
        theirs.close()
        ours.close()
