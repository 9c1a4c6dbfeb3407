"""What a driver's task in another driver's placement group bundle on another node is told
(``placement_group_nodes.PlacementGroupNodes.elsewhere``): why it cannot run there and what
to do instead. A stand-in owner and ledger; no processes."""

from __future__ import annotations

from types import SimpleNamespace

from miniray._private.core import placement
from miniray._private.owner.placement_group_nodes import PlacementGroupNodes

PG = "ab" * 18


class _Groups(PlacementGroupNodes):
    def __init__(self, record: dict, head_elsewhere: bool):
        link = SimpleNamespace(on_another_host=lambda: head_elsewhere)
        self.owner = SimpleNamespace(remote_nodes=object(), actors=SimpleNamespace(link=link))
        self.ledger = SimpleNamespace(groups=lambda: {PG: SimpleNamespace(group=record)})
        self.node_id = "node-a"


def _why(record: dict, head_elsewhere: bool, index: int = 1) -> str | None:
    request = placement.rewrite_request({"CPU": 1}, PG, index)
    return _Groups(record, head_elsewhere).elsewhere(request)


def test_a_detached_group_when_the_drivers_actor_service_is_on_another_host():
    record = {"name": "g", "detached": True, "nodes": ["node-a", "node-b"]}
    why = _why(record, head_elsewhere=True)
    assert "not supported yet" not in why
    assert "bundle 1 on node node-b" in why
    assert "the head's, on another host" in why  # why
    assert "Run this driver on the head's host" in why  # what to do
    assert "lifetime='detached'" in why and "a bundle of this node ([0])" in why
    assert _why(record, head_elsewhere=True, index=0) is None  # its bundle here: runs


def test_a_group_of_another_driver_says_to_create_it_here():
    record = {"name": "g", "nodes": ["node-b"], "job_id": "07"}
    why = _why(record, head_elsewhere=False, index=0)
    assert "only the driver that created the group (job 07)" in why
