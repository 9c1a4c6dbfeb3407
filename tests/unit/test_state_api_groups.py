"""The placement groups of ``ray.util.state`` in a cluster (``state_api.py``): which other
nodes a listing asks (``nodes_to_ask``), asking them at once within a bound
(``_far_groups``), and the rows merged, each group once (``group_rows``)."""

from __future__ import annotations

import socket

from miniray._private import state_api
from miniray._private.core.cluster_view import NodeEntry
from miniray._private.owner.placement_group_records import state_row
from miniray._private.state_api import SessionView, group_rows, nodes_to_ask

HEAD = NodeEntry("h" * 56, "127.0.0.1", 6379, is_head=True)
MEMBER = NodeEntry("m" * 56, "127.0.0.2", 6380)
OTHER = NodeEntry("o" * 56, "127.0.0.3", 6381)
NODES = {HEAD.node_id: HEAD, MEMBER.node_id: MEMBER, OTHER.node_id: OTHER}


def _record(pg_hex: str, nodes: list) -> dict:
    return {"id": pg_hex, "name": pg_hex[:2], "bundles": [{"CPU": 1.0}] * len(nodes),
            "nodes": nodes, "detached": True, "job_id": "02000000"}


def test_a_listing_asks_every_other_alive_node_from_this_hosts_ip():
    assert nodes_to_ask([(MEMBER.node_id, NODES)]) == ([HEAD, OTHER], "127.0.0.2", None)
    assert nodes_to_ask([(HEAD.node_id, NODES)]) == ([MEMBER, OTHER], "127.0.0.1", None)
    gone = NodeEntry(OTHER.node_id, OTHER.ip, OTHER.port, alive=False)
    assert nodes_to_ask([(HEAD.node_id, {**NODES, OTHER.node_id: gone})]) == (
        [MEMBER], "127.0.0.1", None)  # a dead node is not asked


def test_a_member_whose_view_shows_no_alive_head_says_so():
    dead = {**NODES, HEAD.node_id: NodeEntry(HEAD.node_id, HEAD.ip, 6379, True, alive=False)}
    entries, own_ip, why = nodes_to_ask([(MEMBER.node_id, dead)])
    assert entries == [OTHER] and own_ip == "127.0.0.2"
    assert "head is not alive" in why  # named as missing


def test_no_cluster_or_a_view_not_showing_this_node_asks_nothing():
    assert nodes_to_ask([]) == ([], None, None)
    assert nodes_to_ask([("x" * 56, NODES)]) == ([], None, None)  # not shown here yet
    assert nodes_to_ask([(MEMBER.node_id, {})]) == ([], None, None)
    # Every node's session on this host: nobody else to ask.
    assert nodes_to_ask([(n, NODES) for n in NODES])[0] == []


def test_each_group_is_listed_once_reserved_anywhere_winning_in_the_order_of_ids():
    a, b, c = "a" * 36, "b" * 36, "c" * 36
    on_member = {b: _record(b, [MEMBER.node_id])}
    on_head = {c: _record(c, [HEAD.node_id, MEMBER.node_id]), b: _record(b, ["elsewhere"])}
    pending = [state_row(_record(c, [""] * 2), "PENDING"),  # reserved since: once, CREATED
               state_row(_record(a, [""]), "PENDING")]
    rows = group_rows([on_member, on_head], pending + pending[1:])
    assert [(r["placement_group_id"], r["state"]) for r in rows] == [
        (a, "PENDING"), (b, "CREATED"), (c, "CREATED")]
    assert [x["node_id"] for x in rows[1]["bundles"]] == [MEMBER.node_id]
    assert [x["node_id"] for x in rows[2]["bundles"]] == [HEAD.node_id, MEMBER.node_id]
    assert rows[2]["creator_job_id"] == "02000000" and rows[2]["is_detached"] is True
    # The same rows in the same order whichever host lists them (its own ledger first;
    # a group's record is in one ledger).
    del on_head[b]
    assert group_rows([on_head, on_member], pending[::-1]) == rows


def test_a_node_alive_in_the_view_that_never_answers_is_left_out_named(tmp_path,
                                                                      monkeypatch):
    # A listener that takes connections and never speaks: the listing's wait is bounded
    # by MINIRAY_STATE_NODE_TIMEOUT_S, and the node is named as missing.
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    quiet = NodeEntry("q" * 56, "127.0.0.1", port)
    nodes = {HEAD.node_id: HEAD, quiet.node_id: quiet}
    monkeypatch.setenv("MINIRAY_STATE_NODE_TIMEOUT_S", "0.3")
    monkeypatch.setenv("MINIRAY_AUTH_TOKEN", "t" * 32)
    monkeypatch.setattr(state_api.node_client, "read_cluster",
                        lambda _path: {"local": HEAD.node_id})
    monkeypatch.setattr(state_api.cluster_view, "nodes_of", lambda _doc: nodes)
    try:
        far = state_api._far_groups([SessionView(str(tmp_path))], 30.0)
    finally:
        silent.close()
    assert far.reserved == [] and far.pending == []
    [why] = far.missing
    assert why.startswith(f"node {quiet.node_id} at 127.0.0.1:{port}: "), why
