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
                                         class_name="Reader", max_restarts=0,
                                         out_of_order=False))
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


# -- a constructor given a kept result (docs/remote-objects.md, "Actor constructors given a
# kept result"): placed first, pulled only when it stays here ---------------------------


def _creating():
    manager, objects, owner, _sent = _manager(elsewhere=False)
    placed: list = []
    manager._place = placed.append
    manager.pending = []
    owner.runtime_env_error = lambda env: None
    return manager, objects, placed


def _creation(deps):
    return types.SimpleNamespace(
        actor_id=b"C" * 16, fn_bytes=None, name=None, contained=None, runtime_env=None,
        deps=[(i, d) for i, d in enumerate(deps)], lent=None, pg=None, max_restarts=0,
        max_pending_calls=None, class_name="Holder")


def test_a_constructors_kept_argument_is_not_pulled_before_the_actor_is_placed():
    manager, objects, placed = _creating()
    a = b"a" * 28
    objects.ensure(a)
    _copy, pulls = _kept(objects, a)
    manager.create(_creation([a]))
    actor = manager.actors[b"C" * 16]
    assert pulls == [] and placed == [actor] and actor.waiting == 0
    assert manager._kept_deps(actor.spec.deps) == {a: objects.get(a)}


def test_a_constructors_argument_still_running_that_comes_back_kept_places_it_unpulled():
    manager, objects, placed = _creating()
    a = b"a" * 28
    objects.ensure(a)
    manager.create(_creation([a]))
    actor = manager.actors[b"C" * 16]
    assert placed == [] and actor.waiting == 1
    _copy, pulls = _kept(objects, a)
    assert pulls == [] and placed == [actor] and actor.waiting == 0


def test_an_actor_kept_here_pulls_its_constructors_kept_argument_then_is_placed_again():
    manager, objects, placed = _creating()
    a, b = b"a" * 28, b"b" * 28
    objects.ensure(a)
    objects.ensure(b)
    _copy, pulls = _kept(objects, a)
    objects.set_ready(b, protocol.OK, b"small")
    manager.create(_creation([a, b]))
    actor = manager.actors[b"C" * 16]
    manager.pending = [actor]  # the placer's: it stays on this node
    assert manager._pull_kept(actor) and pulls == [a] and manager.pending == []
    assert actor.waiting == 1
    objects.set_ready(a, protocol.OK, b"x")  # pulled
    assert placed == [actor, actor] and actor.waiting == 0
    assert not manager._pull_kept(actor)  # nothing kept any more: placed here


def _placing(local_cpu: float, a_cpu: float, a_bytes: int, here_bytes: int = 0):
    from miniray._private.core.cluster_view import NodeEntry
    from miniray._private.owner.remote_actors import RemoteActors

    view = [NodeEntry("here", "10.0.0.1", 1, totals={"CPU": 2}, available={"CPU": local_cpu}),
            NodeEntry("a", "10.0.0.2", 1, totals={"CPU": 2}, available={"CPU": a_cpu})]
    arg_bytes = {k: v for k, v in (("a", a_bytes), ("here", here_bytes)) if v}
    places = RemoteActors.__new__(RemoteActors)
    places.nodes = types.SimpleNamespace(local="here", view=lambda: view,
                                         _arg_bytes=lambda spec: arg_bytes)
    return places, types.SimpleNamespace(placement={"CPU": 1})


def test_an_actor_goes_to_the_node_holding_over_16_mib_of_its_arguments_with_room():
    places, spec = _placing(2, 1, 20 << 20)
    assert places._near_args(spec, None) == "a"
    assert places._near_args(spec, "a") is None  # that node just died under it


def test_an_actor_stays_here_below_the_threshold_without_room_there_or_with_more_here():
    assert _placing(2, 1, 16 << 20)[0]._near_args(_placing(2, 1, 0)[1], None) is None
    places, spec = _placing(2, 0, 20 << 20)  # A is full now: here, as before
    assert places._near_args(spec, None) is None
    places, spec = _placing(2, 1, 20 << 20, here_bytes=30 << 20)
    assert places._near_args(spec, None) is None
    places, spec = _placing(0, 1, 20 << 20)  # no room here either: only A's bytes decide
    assert places._near_args(spec, None) == "a"


def test_a_constructors_kept_argument_lost_before_init_goes_kills_the_actor_with_its_error():
    import contextlib

    from miniray._private.core import serialization
    from miniray._private.owner.remote_actors import RemoteActors
    from miniray.exceptions import ActorDiedError, ObjectLostError

    def get_serialized(object_ids, timeout):
        raise ObjectLostError(object_ids[0].hex())

    manager, _objects, owner, _sent = _manager(elsewhere=True)
    owner.get_serialized = get_serialized
    owner.locked = contextlib.nullcontext
    died: list = []
    manager._die = lambda actor, death, init=False: died.append(death)
    actor = manager.actors[b"A" * 16]
    actor.restarts_left = 3
    killed: list = []
    worker = types.SimpleNamespace(actor=actor, dead=False,
                                   kill_later=lambda: killed.append(True))
    places = RemoteActors.__new__(RemoteActors)
    places.owner, places.manager = owner, manager
    places.nodes = types.SimpleNamespace(closed=False)
    assert places._pulled(worker, b"A" * 16, b"a" * 28) is None
    error = serialization.loads(died[0])
    assert isinstance(error, ActorDiedError) and "Reader.__init__" in str(error)
    assert "ObjectLostError" in str(error) or "lost" in str(error)
    assert killed == [True] and actor.restarts_left == 0 and actor.init_failed


def test_a_restart_here_whose_constructors_kept_argument_was_lost_dies_with_its_error():
    from miniray._private.core import serialization
    from miniray.exceptions import ObjectLostError

    manager, objects, placed = _creating()
    manager.owner.store = objects.store
    died: list = []
    manager._die = lambda actor, death, init=False: died.append(death)
    a = b"a" * 28
    objects.ensure(a)
    _copy, pulls = _kept(objects, a)
    manager.create(_creation([a]))
    actor = manager.actors[b"C" * 16]
    objects.set_ready(a, protocol.ERR, serialization.dumps(ObjectLostError(a.hex())))
    assert manager._pull_kept(actor) and pulls == [] and actor.init_failed
    assert "Holder.__init__" in str(serialization.loads(died[0]))
