"""Actor calls given results kept on other nodes (``owner/actor_calls.py``: ``submit`` and
``_pump``; docs/remote-objects.md, "Actor calls and bundles given a kept result"), with a
real object table over a fake store and fake workers. No processes."""

from __future__ import annotations

import threading
import types

from miniray._private.core import protocol
from miniray._private.core.task_spec import ActorCallSpec
from miniray._private.owner.actors import A_ALIVE, ActorManager, _Actor
from miniray._private.owner.object_table import ObjectTable, RemoteCopy

from .test_tasks import _Store  # the same in-memory store stand-in


class _Requests:
    def __init__(self, objects):
        self.objects = objects
        self.pinned: list = []

    def dep_payloads(self, deps, pin, worker=None):
        if pin:
            self.pinned += [object_id for _position, object_id in deps]
        entries, data = self.objects.entries, self.objects.store.data
        return [(position, entries[object_id].kind, data[object_id])
                for position, object_id in deps]


def _manager(elsewhere: bool):
    objects = ObjectTable(_Store(), threading.Lock(), lambda: None)
    sent: list = []
    owner = types.SimpleNamespace(objects=objects, requests=_Requests(objects),
                                  send=lambda worker, message: sent.append(message),
                                  send_soon=lambda worker, message: sent.append(message))
    manager = ActorManager.__new__(ActorManager)  # the fields submit and _pump read
    manager.owner = owner
    manager.actors = {}
    manager.calls = {}
    manager.link = None
    actor = _Actor(types.SimpleNamespace(actor_id=b"A" * 16, max_pending_calls=None,
                                         class_name="Reader", max_restarts=0))
    actor.state = A_ALIVE
    actor.worker = types.SimpleNamespace(
        elsewhere=elsewhere, send=lambda message: sent.append(message))
    manager.actors[actor.spec.actor_id] = actor
    return manager, objects, owner, sent


def _kept(objects, object_id, node="n1"):
    pulls: list = []
    copy = RemoteCopy(node, 20 << 20, lambda: pulls.append(object_id), lambda: None, "/p")
    objects.set_ready(object_id, protocol.OK, ("remote", copy))
    return copy, pulls


def _call(n: int, deps=()):
    task_id = bytes([n]) * 24
    return ActorCallSpec(task_id, "m", b"", [(i, d) for i, d in enumerate(deps)],
                         [task_id + b"\0\0\0\1"], 1, "m", 0)


def test_a_call_to_an_actor_elsewhere_gets_its_kept_argument_unpulled_and_in_order():
    manager, objects, owner, sent = _manager(elsewhere=True)
    a = b"a" * 28
    objects.ensure(a)
    copy, pulls = _kept(objects, a)
    manager.submit(b"A" * 16, _call(1, deps=[a]))
    manager.submit(b"A" * 16, _call(2))
    assert pulls == [] and [m[1] for m in sent] == [b"\1" * 24, b"\2" * 24]
    assert sent[0][4] == [(0, protocol.OK, ("kept", a, copy))]
    assert owner.requests.pinned == []  # nothing of it here to pin
    assert manager.calls[b"\1" * 24].kept == (a,)


def test_a_call_to_an_actor_here_pulls_its_kept_argument_and_holds_the_later_ones():
    manager, objects, owner, sent = _manager(elsewhere=False)
    a = b"a" * 28
    objects.ensure(a)
    _copy, pulls = _kept(objects, a)
    manager.submit(b"A" * 16, _call(1, deps=[a]))
    manager.submit(b"A" * 16, _call(2))
    assert pulls == [a] and sent == []  # the second waits behind the first
    objects.set_ready(a, protocol.OK, b"x")  # pulled
    assert [m[1] for m in sent] == [b"\1" * 24, b"\2" * 24]
    assert sent[0][4] == [(0, protocol.OK, b"x")] and owner.requests.pinned == [a]


def test_an_argument_still_running_that_comes_back_kept_is_not_pulled_for_a_call_elsewhere():
    manager, objects, _owner, sent = _manager(elsewhere=True)
    a = b"a" * 28
    objects.ensure(a)
    manager.submit(b"A" * 16, _call(1, deps=[a]))
    assert sent == []
    copy, pulls = _kept(objects, a)
    assert pulls == [] and sent[0][4] == [(0, protocol.OK, ("kept", a, copy))]
