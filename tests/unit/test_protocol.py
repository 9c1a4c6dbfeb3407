"""One vocabulary per wire: every channel's tags are ints, named in ``core/protocol.py``,
unique within their channel, and the node and actor-service modules use no string tags, nor
do a worker's CALLs name their method with a string."""

from __future__ import annotations

import ast
import pathlib

import pytest

import miniray
from miniray._private.core import protocol

PRIVATE = pathlib.Path(miniray.__file__).parent / "_private"
# The modules that speak the node and actor-service channels.
SPEAKERS = ["node/node.py", "node/actor_service.py", "owner/actor_link.py",
            "transport/node_client.py", "transport/spawn.py"]
# Every tag name of every channel: a string literal spelling one in a speaker is a string tag.
TAG_NAMES = {name for names in protocol.CHANNELS.values() for name in names}
TAG_NAMES |= {name[len(prefix):] for name in TAG_NAMES for prefix in ("NODE_", "SVC_")
              if name.startswith(prefix)}
NOT_TAGS = {"OK", "ERR", "TIMEOUT", "CANCELLED", "PROTOCOL_VERSION", "V1_NODE_HELLO",
            "PYTHON_VERSION"}


def test_channels_are_the_five_sections_and_the_call_methods():
    assert list(protocol.CHANNELS) == ["data", "call", "control", "fork_server", "node",
                                       "actor_service"]


@pytest.mark.parametrize("channel", list(protocol.CHANNELS))
def test_every_tag_is_an_int_unique_within_its_channel(channel):
    names = protocol.CHANNELS[channel]
    assert len(set(names)) == len(names), f"{channel}: a name is listed twice"
    values = [getattr(protocol, name) for name in names]
    assert all(type(v) is int for v in values), dict(zip(names, values))
    clashes = {v: [n for n in names if getattr(protocol, n) == v] for v in values}
    assert {v: n for v, n in clashes.items() if len(n) > 1} == {}


def test_every_tag_constant_belongs_to_a_channel():
    """A tag added to the module but to no channel's list would escape the uniqueness test."""
    constants = {name for name, value in vars(protocol).items()
                 if name.isupper() and type(value) in (int, str)}
    listed = {name for names in protocol.CHANNELS.values() for name in names}
    assert constants - listed == NOT_TAGS


def test_the_node_relays_the_fork_servers_replies_unchanged():
    """The owner reads a node and its own fork server with one reader: the tags it can get from
    either must mean the same thing, and the node's own tags must not collide with them."""
    fork = {getattr(protocol, n) for n in protocol.CHANNELS["fork_server"]}
    node_only = {getattr(protocol, n) for n in protocol.CHANNELS["node"]
                 if n not in protocol.CHANNELS["fork_server"]}
    assert not fork & node_only


def test_protocol_version_was_bumped_for_each_changed_layout():
    """3: ACTOR_INIT, ACTOR_EXITING and the node's hello changed; 4: GET, WAIT and SUBMIT
    name the calling task, SVC_CANCEL says whether it is recursive; 5: streaming generators
    (YIELD, CALL_STREAM_NEXT, SVC_YIELD), which a node's workers of another version would not
    speak; 7: RESULT carries the worker's times (``ray.timeline``); 8: the actor service
    holds detached placement groups of a cluster (SVC_PG_CREATE, SVC_PG_REMOVE); 9: its
    call results kept on their node (SVC_FREE, SVC_HELLO's node id and IP); 10: a pending
    detached group found by name in the service (SVC_PG_FIND); 11: READY carries the worker's
    pid; 12: the actors a driver lent room to, asked of the service by id (SVC_ALIVE); 13: a
    driver on another host reads the service's detached groups (SVC_PG_TABLE); 14: SVC_KILL
    names the removed group an actor is killed for; 15: where a lent actor's room went when
    its bundle was placed again on another node (SVC_LENT_MOVED)."""
    assert protocol.PROTOCOL_VERSION == 15
    assert "SVC_LENT_MOVED" in protocol.CHANNELS["actor_service"]
    assert "SVC_ALIVE" in protocol.CHANNELS["actor_service"]
    assert "SVC_PG_TABLE" in protocol.CHANNELS["actor_service"]
    assert "SVC_PG_FIND" in protocol.CHANNELS["actor_service"]
    assert "SVC_PG_CREATE" in protocol.CHANNELS["actor_service"]
    assert "SVC_FREE" in protocol.CHANNELS["actor_service"]
    assert "YIELD" in protocol.CHANNELS["data"]
    assert "CALL_STREAM_NEXT" in protocol.CHANNELS["call"]


def test_tag_name():
    assert protocol.tag_name("node", protocol.NODE_GOODBYE) == "NODE_GOODBYE"
    assert protocol.tag_name("actor_service", protocol.SVC_CALL) == "SVC_CALL"
    assert protocol.tag_name("actor_service", "CALL") == "'CALL'"
    assert protocol.tag_name("node", True) == "True"  # not taken for tag 1


def _string_tags(path: pathlib.Path) -> list[str]:
    """String literals in code (docstrings aside) that spell a tag name."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings and node.value in TAG_NAMES):
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("module", SPEAKERS)
def test_no_string_tag_is_left_in_the_node_and_actor_service_modules(module):
    assert _string_tags(PRIVATE / module) == []


def test_the_string_tag_finder_finds_one(tmp_path):
    """The grep above is not vacuous: a string tag in code is found, one in a docstring not."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""("HELLO", pid)."""\nsend(("GOODBYE", 1.0))\n')
    assert _string_tags(probe) == ["probe.py:2: 'GOODBYE'"]


def test_check_hello_admits_this_version_and_refuses_others_with_what_to_do():
    from miniray._private.node.node import check_hello

    assert check_hello((protocol.NODE_HELLO, 4242, protocol.PROTOCOL_VERSION)) == (4242, None)
    probe = (protocol.NODE_HELLO, 4242, protocol.PROTOCOL_VERSION, {"probe": True})
    assert check_hello(probe) == (4242, None)
    assert check_hello(probe[:3] + ("probe",)) == (None, None)  # options are a dict
    for old in [("HELLO", 4242), (protocol.NODE_HELLO, 4242, 1), (protocol.NODE_HELLO, 1, 99)]:
        pid, why = check_hello(old)
        assert pid is None
        assert f"protocol version {protocol.PROTOCOL_VERSION}" in why
        assert "miniray stop" in why and "miniray start --head" in why
    for junk in [(protocol.SPAWN, 1), ("WELCOME", {}), (protocol.NODE_HELLO, "x", 2)]:
        assert check_hello(junk) == (None, None)


# The modules on either end of a worker's CALL, and the method names CALLs once spelled.
CALL_SPEAKERS = ["owner/requests.py", "worker/worker_api.py"]
CALL_METHOD_NAMES = {name[len("CALL_"):].lower() for name in protocol.CHANNELS["call"]}


@pytest.mark.parametrize("module", CALL_SPEAKERS)
def test_a_workers_calls_name_their_method_with_an_int(module):
    assert _string_methods((PRIVATE / module).read_text()) == []


def _string_methods(source: str) -> list[int]:
    """Lines where a method name is compared (``method == "nodes"``) or passed to a
    ``.call(...)`` as a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            candidates = [node.left, *node.comparators]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "call" and node.args):
            candidates = [node.args[0]]
        else:
            continue
        found += [c.lineno for c in candidates
                  if isinstance(c, ast.Constant) and c.value in CALL_METHOD_NAMES]
    return found


def test_the_string_method_finder_finds_one():
    source = 'if method == "nodes":\n    pass\nself.call("cancel", 1)\nd.get("nodes")\n'
    assert _string_methods(source) == [1, 3]


def test_version_mismatch_refuses_another_miniray_or_python_minor_and_warns_on_patch():
    """Ray 2.60's wording (``check_version_info``): both versions, this process's place."""
    here = protocol.local_versions()
    major, minor, patch = here["python_version"].split(".")
    assert protocol.version_mismatch(dict(here), "node 127.0.0.1") == (None, None)
    for node in (dict(here, miniray_version="0.0.1"),
                 dict(here, python_version=f"{major}.{int(minor) + 1}.{patch}"),
                 {}):  # a node older than version reporting
        refusal, warning = protocol.version_mismatch(node, "node 127.0.0.1")
        assert warning is None and refusal.startswith(
            "Version mismatch: The cluster was started with:\n    miniray: ")
        assert (f"This process on node 127.0.0.1 was started with:\n"
                f"    miniray: {here['miniray_version']}\n"
                f"    Python: {here['python_version']}\n") in refusal
        assert "miniray stop" in refusal and "miniray start --head" in refusal
    refusal, _ = protocol.version_mismatch({}, "node x")
    assert "miniray: unknown (a miniray older than this one)" in refusal
    refusal, warning = protocol.version_mismatch(
        dict(here, python_version=f"{major}.{minor}.{int(patch) + 1}"), "node x")
    assert refusal is None and warning.startswith("Python patch version mismatch: ")


def test_version_policy_refuses_miniray_and_python_minor_naming_both():
    here = protocol.peer_versions()
    assert protocol.version_policy(here, dict(here)) == (None, None)
    major, minor, patch = here["python"].split(".")
    for other in (dict(here, miniray="0.0.1"),
                  dict(here, python=f"{major}.{int(minor) + 1}.0"), {}):
        refusal, warning = protocol.version_policy(here, other, local_name="node A",
                                                   remote_name="node B")
        assert warning is None and refusal.startswith("Version mismatch: node A runs miniray "
                                                      f"{here['miniray']}, python")
        assert f"node B runs miniray {other.get('miniray') or 'unknown'}" in refusal
    for other in (dict(here, python=f"{major}.{minor}.{int(patch) + 1}"),
                  dict(here, numpy="0.1"), dict(here, cloudpickle=None)):
        refusal, warning = protocol.version_policy(here, other)
        assert refusal is None and "this process runs" in warning and "the peer runs" in warning
