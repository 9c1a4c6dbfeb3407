"""The cluster view's rules and failure detector (core/cluster_view.py), with an injected clock."""

import json

from miniray._private.core import cluster_view as cv
from miniray._private.core.cluster_view import ClusterView, NodeEntry


def entry(node_id="b" * 56, ip="127.0.0.2", incarnation=1, **kw):
    totals = {"CPU": 2.0, f"node:{ip}": 1.0}
    return NodeEntry(node_id=node_id, ip=ip, port=6379, totals=totals, incarnation=incarnation,
                     **kw)


def test_join_adds_alive_with_totals_as_available():
    view = ClusterView()
    assert view.join(entry(), now=10.0) is None
    (e,) = view.alive()
    assert e.available == e.totals and e.last_heartbeat == 10.0 and view.version == 1


def test_heartbeat_updates_available_and_unknown_or_dead_must_rejoin():
    view = ClusterView()
    view.join(entry(), now=0.0)
    assert view.heartbeat("b" * 56, {"CPU": 1.0}, now=1.0, incarnation=1)
    assert view.nodes["b" * 56].available == {"CPU": 1.0}
    assert not view.heartbeat("c" * 56, {}, now=1.0)
    assert not view.heartbeat("b" * 56, {}, now=1.0, incarnation=2)
    view.leave("b" * 56, "stopped")
    assert not view.heartbeat("b" * 56, {}, now=2.0, incarnation=1)


def test_heartbeat_gap_declares_dead_and_rejoin_revives_with_new_incarnation():
    view = ClusterView()
    view.join(entry(), now=0.0)
    assert view.expire(now=4.9, dead_after=5.0) == []
    assert view.next_deadline(5.0) == 5.0
    assert view.expire(now=5.0, dead_after=5.0) == ["b" * 56]
    e = view.nodes["b" * 56]
    assert not e.alive and e.death_reason == cv.DEATH_UNEXPECTED
    assert "heartbeat" in e.death_message and e.available == {}
    assert view.join(entry(incarnation=2), now=6.0) is None
    assert view.nodes["b" * 56].alive and view.nodes["b" * 56].incarnation == 2


def test_stale_incarnation_is_refused():
    view = ClusterView()
    view.join(entry(incarnation=3), now=0.0)
    refusal = view.join(entry(incarnation=2), now=1.0)
    assert refusal and "stale" in refusal


def test_eof_grace_then_dead_unless_reconnected():
    view = ClusterView()
    view.join(entry(), now=0.0)
    assert view.link_lost("b" * 56, now=1.0) is False
    assert view.expire(now=1.4, dead_after=5.0, eof_grace=0.5) == []
    assert view.expire(now=1.5, dead_after=5.0, eof_grace=0.5) == ["b" * 56]
    assert "connection" in view.nodes["b" * 56].death_message
    view2 = ClusterView()
    view2.join(entry(), now=0.0)
    view2.link_lost("b" * 56, now=1.0)
    view2.join(entry(), now=1.2)  # reconnect, same id and incarnation
    assert view2.expire(now=2.0, dead_after=5.0, eof_grace=0.5) == []


def test_grace_never_longer_than_dead_after():
    view = ClusterView()
    view.join(entry(), now=0.0)
    view.link_lost("b" * 56, now=0.0)
    assert view.expire(now=0.3, dead_after=0.3, eof_grace=0.5) == ["b" * 56]


def test_leave_is_expected_termination_and_head_is_exempt():
    view = ClusterView()
    view.join(entry(node_id="a" * 56, ip="127.0.0.1", is_head=True), now=0.0)
    view.join(entry(), now=0.0)
    assert view.leave("b" * 56, "miniray stop")
    assert not view.leave("b" * 56, "again")
    assert view.nodes["b" * 56].death_reason == cv.DEATH_EXPECTED
    assert view.expire(now=100.0, dead_after=1.0, exempt="a" * 56) == []
    assert view.nodes["a" * 56].alive


def test_snapshot_round_trip_is_json_and_head_first():
    view = ClusterView()
    view.join(entry(start_time=2.0), now=0.0)
    view.join(entry(node_id="a" * 56, ip="127.0.0.1", is_head=True, start_time=5.0), now=0.0)
    doc = json.loads(json.dumps(view.snapshot()))
    copy = ClusterView.from_snapshot(doc)
    assert [e.node_id for e in copy.nodes.values()] == ["a" * 56, "b" * 56]
    assert copy.version == view.version
    doc["nodes"][0]["unknown_future_field"] = 1
    ClusterView.from_snapshot(doc)


def test_rows_have_the_local_rows_keys_and_dead_rows_say_why():
    local_keys = {  # runtime.Runtime.node_info's keys (the local node's row)
        "NodeID", "Alive", "alive", "NodeManagerAddress", "NodeManagerHostname",
        "NodeManagerPort", "NodeName", "ObjectManagerPort", "ObjectStoreSocketName",
        "RayletSocketName", "Resources", "Labels", "MetricsExportPort", "MetricsAgentPort",
        "DashboardAgentListenPort", "RuntimeEnvAgentPort", "DeathReason", "DeathReasonMessage"}
    view = ClusterView()
    view.join(entry(labels={"zone": "a"}), now=0.0)
    row = cv.node_row(view.nodes["b" * 56])
    assert row["Alive"] is True and row["NodeManagerAddress"] == "127.0.0.2"
    assert row["Labels"] == {"ray.io/node-id": "b" * 56, "zone": "a"}
    assert row["Resources"]["node:127.0.0.2"] == 1.0
    assert set(row) == local_keys
    view.expire(now=10.0, dead_after=1.0)
    dead = cv.node_row(view.nodes["b" * 56])
    assert dead["Alive"] is False and dead["DeathReason"] == cv.DEATH_UNEXPECTED
    assert dead["DeathReasonMessage"]


def test_sums_over_alive_nodes_leave_out_zeros():
    a = entry(node_id="a" * 56, ip="127.0.0.1")
    b = entry()
    a.available = {"CPU": 0.0, "node:127.0.0.1": 1.0}
    b.available = {"CPU": 1.5}
    assert cv.totals_sum([a, b]) == {"CPU": 4.0, "node:127.0.0.1": 1.0, "node:127.0.0.2": 1.0}
    assert cv.available_sum([a, b]) == {"CPU": 1.5, "node:127.0.0.1": 1.0}


def test_status_lists_active_and_dead_nodes_with_resources_or_reasons():
    from miniray._private.node import node_status

    view = ClusterView()
    view.join(entry(node_id="a" * 56, ip="127.0.0.1", is_head=True), now=0.0)
    view.join(entry(), now=0.0)
    view.join(entry(node_id="c" * 56, ip="127.0.0.3"), now=0.0)
    view.heartbeat("b" * 56, {"CPU": 0.5}, now=0.5)
    view.leave("c" * 56, "The node was stopped (miniray stop).")
    doc = {"view": view.snapshot(), "head": "127.0.0.1:6379", "is_head": False, "linked": True}
    text = "\n".join(node_status.cluster_section(doc, now=1.0))
    active, dead = text.split("Active:")[1].split("Dead:")
    assert "127.0.0.1:6379 (head)" in active and "127.0.0.2:6379: 1.5/2 CPU" in active
    assert "127.0.0.3:6379: The node was stopped (miniray stop)." in dead
    doc["linked"] = False
    assert "link to the head is down" in node_status.cluster_section(doc, now=1.0)[0]


def test_malformed_records_and_reports_are_caught():
    assert entry().problem() is None
    assert "labels" in entry(labels={"a": 1}).problem()
    wrong_port = entry()
    wrong_port.port = "6379"
    assert wrong_port.problem()
    bad = entry()
    bad.totals = {"CPU": "lots"}
    assert "totals" in bad.problem()
    view = ClusterView()
    view.join(entry(), now=0.0)
    assert view.heartbeat("b" * 56, {"CPU": -1}, now=1.0)  # alive, the report ignored
    assert view.nodes["b" * 56].available["CPU"] == 2.0


def test_dead_nodes_are_kept_up_to_a_bound_oldest_forgotten_first(monkeypatch):
    monkeypatch.setattr(cv, "MAX_DEAD", 2)
    view = ClusterView()
    for i in range(4):
        node_id = f"{i}" * 56
        view.join(entry(node_id=node_id), now=0.0)
        view.leave(node_id, "stopped")
    assert sorted(view.nodes) == ["2" * 56, "3" * 56]


def test_state_rows_have_ray_node_state_fields_and_wall_times_from_the_heads_clock():
    view = ClusterView()
    view.join(entry(node_id="a" * 56, ip="127.0.0.1", is_head=True, start_time=1000.0),
              now=0.0)
    view.join(entry(start_time=1001.5, labels={"zone": "a"}), now=0.0)
    view.join(entry(node_id="c" * 56, ip="127.0.0.3"), now=0.0)
    view.leave("c" * 56, "The node was stopped (miniray stop).", now=4.0)
    # The head wrote the file at wall time 2000.0 when its clock read 10.0.
    doc = {"view": view.snapshot(), "is_head": True, "clock": 10.0, "updated_at": 2000.0}
    alive = cv.state_row(view.nodes["b" * 56], doc)
    assert alive == {
        "node_id": "b" * 56, "node_ip": "127.0.0.2", "is_head_node": False, "state": "ALIVE",
        "state_message": None, "node_name": "127.0.0.2",
        "resources_total": {"CPU": 2.0, "node:127.0.0.2": 1.0},
        "labels": {"ray.io/node-id": "b" * 56, "zone": "a"},
        "start_time_ms": 1001500, "end_time_ms": None, "address": "127.0.0.2:6379"}
    dead = cv.state_row(view.nodes["c" * 56], doc)
    assert dead["state"] == "DEAD" and dead["state_message"].startswith("The node was stopped")
    assert dead["end_time_ms"] == 1994000  # 6 s before the file was written
    assert cv.state_row(view.nodes["c" * 56], {"view": {}})["end_time_ms"] is None
    assert cv.state_row(view.nodes["a" * 56], doc)["is_head_node"] is True
    # Heartbeat ages: from the head's clock, none for the head itself or a dead node.
    view.heartbeat("b" * 56, None, now=9.5)
    assert cv.heartbeat_age(doc, view.nodes["b" * 56], now=2001.0) == 1.5
    assert cv.heartbeat_age(doc, view.nodes["a" * 56], now=2001.0) is None
    assert cv.heartbeat_age(doc, view.nodes["c" * 56], now=2001.0) is None
    assert cv.heartbeat_age({"view": {}}, view.nodes["b" * 56], now=2001.0) is None
    # A rejoin clears the death time.
    view.join(entry(node_id="c" * 56, ip="127.0.0.3", incarnation=2), now=11.0)
    assert view.nodes["c" * 56].died_at == 0.0


def test_status_shows_heartbeat_ages_on_a_heads_view_and_a_hint_past_eight_nodes():
    from miniray._private.node import node_status

    view = ClusterView()
    view.join(entry(node_id="a" * 56, ip="127.0.0.1", is_head=True), now=0.0)
    view.join(entry(), now=0.0)
    view.heartbeat("b" * 56, None, now=9.6)
    doc = {"view": view.snapshot(), "head": "127.0.0.1:6379", "is_head": True, "linked": True,
           "clock": 10.0, "updated_at": 2000.0}
    lines = node_status.cluster_section(doc, now=2000.0)
    (member,) = [line for line in lines if "127.0.0.2:6379" in line]
    assert member.endswith("0/2 CPU, heartbeat 0.4 s ago")
    (head,) = [line for line in lines if "(head)" in line]
    assert "heartbeat" not in head
    assert not any("Hint" in line for line in lines)
    member_copy = dict(doc, is_head=False)
    del member_copy["clock"]
    assert not any("heartbeat" in line for line in node_status.cluster_section(member_copy, 0))
    assert node_status.heartbeat_text(125.0) == ", heartbeat 2m05s ago"
    for i in range(8):
        view.join(entry(node_id=f"{i}" * 56, ip=f"127.0.1.{i}"), now=10.0)
    doc["view"] = view.snapshot()
    hints = [line for line in node_status.cluster_section(doc, now=2000.0) if "Hint" in line]
    assert hints == ["Hint: this cluster has 10 nodes; miniray's peering is meant for a few "
                     "hosts. Past that, run the same program on Ray (README: \"When you "
                     "outgrow miniray\")."]
    assert node_status.peering_hint(8) is None
