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


def test_the_nodes_are_asked_at_once_and_a_silent_one_is_waited_for_once(monkeypatch):
    import threading

    n2_asked, release = threading.Event(), threading.Event()

    class Cluster(_Cluster):
        def client(self, entry):
            def groups(_timeout):
                self.asked.append(entry.node_id)
                if entry.node_id == "n1":  # answers only once n2 was asked too: at once
                    if not n2_asked.wait(10):
                        raise TimeoutError("n2 was not asked while n1 was")
                    return {"a": {"name": "a"}}
                if entry.node_id == "n2":
                    n2_asked.set()
                    return {"b": {"name": "b"}}
                release.wait(10)  # n3: alive in the view, never answers in time
                return {"c": {"name": "c"}}

            return SimpleNamespace(groups=groups)

    monkeypatch.setattr(far_groups, "ASK_TIMEOUT_S", 0.5)
    cluster = Cluster({"n1": {}, "n2": {}, "n3": {}})
    far = FarGroups(cluster)
    try:
        assert far.records() == {"a": ("n1", {"name": "a"}), "b": ("n2", {"name": "b"})}
    finally:
        release.set()
    assert sorted(cluster.asked) == ["n1", "n2", "n3"]
    for thread in threading.enumerate():  # n3's late answer is not taken
        if thread.name == "miniray-groups":
            thread.join(10)
    assert set(far.held) == {"a", "b"}
