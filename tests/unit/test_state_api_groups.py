"""The placement groups of ``ray.util.state`` on a member's host (``state_api.py``): which
head to ask (``head_to_ask``) and the rows merged, each group once (``group_rows``)."""

from __future__ import annotations

from miniray._private.core.cluster_view import NodeEntry
from miniray._private.owner.placement_group_records import state_row
from miniray._private.state_api import group_rows, head_to_ask

HEAD = NodeEntry("h" * 56, "127.0.0.1", 6379, is_head=True)
MEMBER = NodeEntry("m" * 56, "127.0.0.2", 6380)
NODES = {HEAD.node_id: HEAD, MEMBER.node_id: MEMBER}


def _record(pg_hex: str, nodes: list) -> dict:
    return {"id": pg_hex, "name": pg_hex[:2], "bundles": [{"CPU": 1.0}] * len(nodes),
            "nodes": nodes, "detached": True, "job_id": "02000000"}


def test_a_members_sessions_ask_the_alive_head_from_their_own_ip():
    assert head_to_ask([(MEMBER.node_id, NODES)]) == (HEAD, "127.0.0.2")
    dead = {**NODES, HEAD.node_id: NodeEntry(HEAD.node_id, HEAD.ip, 6379, True, alive=False)}
    assert head_to_ask([(MEMBER.node_id, dead)]) == (None, "127.0.0.2")  # named as missing


def test_the_heads_own_session_or_no_cluster_asks_nothing():
    assert head_to_ask([]) is None
    assert head_to_ask([(MEMBER.node_id, NODES), (HEAD.node_id, NODES)]) is None
    assert head_to_ask([("x" * 56, NODES)]) is None  # a view not showing this node yet
    assert head_to_ask([(MEMBER.node_id, {})]) is None


def test_each_group_is_listed_once_its_first_reserved_record_winning():
    a, b = "a" * 36, "b" * 36
    on_member = {a: _record(a, [MEMBER.node_id])}
    on_head = {b: _record(b, [HEAD.node_id, MEMBER.node_id]), a: _record(a, ["elsewhere"])}
    pending = [state_row(_record(b, [""] * 2), "PENDING"),  # reserved since: once, CREATED
               state_row(_record("c" * 36, [""]), "PENDING")]
    rows = group_rows([on_member, on_head], pending + pending[1:])
    assert [(r["placement_group_id"], r["state"]) for r in rows] == [
        (a, "CREATED"), (b, "CREATED"), ("c" * 36, "PENDING")]
    assert [x["node_id"] for x in rows[0]["bundles"]] == [MEMBER.node_id]
    assert [x["node_id"] for x in rows[1]["bundles"]] == [HEAD.node_id, MEMBER.node_id]
    assert rows[1]["creator_job_id"] == "02000000" and rows[1]["is_detached"] is True
