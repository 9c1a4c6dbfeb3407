"""The owner's streams (``owner/streams.py``) over a real object table and a dict store: what
is held, released, freed and answered, with no process."""

from __future__ import annotations

import threading

from miniray._private.core import ids, protocol
from miniray._private.owner.object_table import ObjectTable, Waiter
from miniray._private.owner.streams import Streams

TASK = b"t" * ids.TASK_ID_SIZE
COMPLETION = ids.object_id_for(TASK, 1)


class _Store:
    def __init__(self):
        self.values: dict[bytes, bytes] = {}

    def put_serialized(self, object_id, data):
        self.values[object_id] = data

    def free(self, object_id):
        self.values.pop(object_id, None)


def _setup():
    store = _Store()
    objects = ObjectTable(store, threading.Lock(), lambda: None)
    streams = Streams(objects)
    objects.on_free = streams.object_freed
    objects.ensure(COMPLETION)  # submitted: the completion object is pending
    objects.ref_created(COMPLETION)  # the ObjectRefGenerator's ref
    objects.apply_ref_events()
    return store, objects, streams


def _item(index):
    return ids.stream_item_id(TASK, index)


def test_item_ids_follow_the_completion_object_as_in_ray():
    assert _item(0) == TASK + (2).to_bytes(4, "big")
    assert _item(5) == TASK + (7).to_bytes(4, "big")


def test_a_value_is_held_until_the_consumer_asks_for_the_next():
    store, objects, streams = _setup()
    assert streams.next(TASK, 0) is None
    streams.on_item(TASK, 0, protocol.OK, b"v0", ())
    assert streams.next(TASK, 0) is True
    objects.ref_created(_item(0))  # the consumer's ObjectRef, queued as in the driver
    assert streams.next(TASK, 1) is None  # releases item 0: its ref (synced first) keeps it
    assert _item(0) in store.values
    objects.ref_dropped(_item(0))
    objects.apply_ref_events()
    assert _item(0) not in store.values


def test_the_end_is_the_completion_object_being_ready():
    _store, objects, streams = _setup()
    streams.on_item(TASK, 0, protocol.OK, b"v0", ())
    objects.set_ready(COMPLETION, protocol.OK, b"none")
    assert streams.next(TASK, 0) is True  # what arrived before the end is still given
    assert streams.next(TASK, 1) is False


def test_a_waiter_wakes_at_the_next_value_or_at_the_end():
    _store, objects, streams = _setup()
    for finish in ("value", "end"):
        waiter = Waiter(1, on_error=False)
        index = 0 if finish == "value" else 1
        assert streams.next(TASK, index) is None
        streams.add_waiter(TASK, waiter)
        assert not waiter.wait(0)
        if finish == "value":
            streams.on_item(TASK, 0, protocol.OK, b"v0", ())
        else:
            objects.set_ready(COMPLETION, protocol.OK, b"none")
        assert waiter.wait(0)
        streams.remove_waiter(TASK, waiter)
    assert streams.next(TASK, 1) is False


def test_freeing_the_completion_object_lets_go_of_untaken_values():
    store, objects, streams = _setup()
    for index in range(3):
        streams.on_item(TASK, index, protocol.OK, b"v", ())
    objects.set_ready(COMPLETION, protocol.OK, b"none")
    objects.ref_dropped(COMPLETION)  # the generator is gone
    objects.apply_ref_events()
    assert store.values == {} and len(streams) == 0


def test_values_of_a_dropped_generator_are_freed_as_they_come():
    store, objects, streams = _setup()
    streams.on_item(TASK, 0, protocol.OK, b"v0", ())
    objects.ref_dropped(COMPLETION)  # dropped while the call still runs
    objects.apply_ref_events()
    streams.on_item(TASK, 1, protocol.OK, b"v1", ())
    assert set(store.values) == set() and len(streams) == 0
    streams.on_item(TASK, 2, protocol.OK, b"v2", ())
    assert store.values == {}
    objects.set_ready(COMPLETION, protocol.OK, b"none")
    assert store.values == {} and len(objects) == 0


def test_a_retried_call_yielding_again_keeps_the_first_values():
    store, _objects, streams = _setup()
    streams.on_item(TASK, 0, protocol.OK, b"first", ())
    streams.on_item(TASK, 0, protocol.OK, b"again", ())
    assert store.values[_item(0)] == b"first"
    assert streams.next_item_id(TASK) == _item(1)
