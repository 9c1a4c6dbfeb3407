"""``owner/far_groups.py``: the groups of other nodes' drivers, read from their nodes."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

from miniray._private.owner import far_groups
from miniray._private.owner.far_groups import FarGroups, merge


def test_doctests():
    assert doctest.testmod(far_groups, raise_on_error=False).failed == 0


def test_merge_keeps_a_silent_nodes_groups_and_drops_a_dead_nodes():
    held = {"a": ("n1", {"name": "a"}), "b": ("n2", {"name": "b"}), "c": ("n3", {})}
    out = merge(held, {"n1": {}, "n2": {"b": {"name": "b2"}, "d": {}}}, {"n1", "n2"})
    # n1 no longer holds a; n2's answer replaces its groups; n3 is dead in the view
    assert out == {"b": ("n2", {"name": "b2"}), "d": ("n2", {})}
    assert merge(held, {}, {"n1", "n2", "n3"}) == held  # nobody answered: as before


class _Cluster:
    """A driver's ``RemoteNodes`` as ``FarGroups`` uses it: the view, links, this node."""

    def __init__(self, groups):
        self.local = "here"
        self.groups = groups  # node id -> {hex: record}, or an exception to raise
        self.asked = []

    def view(self, fresh=False):
        return [SimpleNamespace(node_id=n, alive=True) for n in ["here", *self.groups]]

    def client(self, entry):
        def groups(_timeout):
            self.asked.append(entry.node_id)
            answer = self.groups[entry.node_id]
            if isinstance(answer, Exception):
                raise answer
            return answer

        return SimpleNamespace(groups=groups)


def test_a_known_group_asks_its_node_only_and_a_name_every_node(monkeypatch):
    cluster = _Cluster({"n1": {"g": {"name": "x"}, "d": {"name": "x", "detached": True}},
                        "n2": OSError("down")})
    far = FarGroups(cluster)
    assert far.named("x") == ("g", "n1", {"name": "x"})
    assert sorted(cluster.asked) == ["n1", "n2"]  # never this node
    cluster.asked.clear()
    assert far.record_of("g") == ("n1", {"name": "x"})
    assert cluster.asked == ["n1"]
    cluster.asked.clear()
    # an unknown id right after a scan: the last answers (SCAN_GAP_S), nobody asked
    assert far.record_of("nope") is None and cluster.asked == []
    monkeypatch.setattr(far_groups, "SCAN_GAP_S", 0.0)
    assert far.record_of("nope") is None and sorted(cluster.asked) == ["n1", "n2"]
    cluster.groups["n1"] = {}  # removed by its driver: gone at the next answer
    assert far.record_of("g") is None
