"""core/pull_grants: a driver's grant lets one node pull one object, from one address."""

from __future__ import annotations

from miniray._private.core.pull_grants import KEY_BYTES, check_grant, grant, new_key

OBJ = bytes(range(28))
NODE = "m" * 56
IP = "127.0.0.3"


def test_the_grant_of_the_links_key_for_that_object_node_and_ip_passes():
    key = new_key()
    assert len(key) == KEY_BYTES and key != new_key()
    assert check_grant(key, OBJ, NODE, IP, grant(key, OBJ, NODE, IP)) is None


def test_another_object_node_ip_or_key_is_refused():
    key = new_key()
    presented = grant(key, OBJ, NODE, IP)
    for args in ((key, OBJ[:-1] + b"x", NODE, IP), (key, OBJ, "n" * 56, IP),
                 (key, OBJ, NODE, "127.0.0.4"), (new_key(), OBJ, NODE, IP)):
        assert "does not match" in check_grant(*args, presented)


def test_malformed_grants_and_a_missing_key_are_refused_by_name():
    key = new_key()
    assert "no grant key" in check_grant(None, OBJ, NODE, IP, grant(key, OBJ, NODE, IP))
    for bad in (None, b"", "x" * 32, grant(key, OBJ, NODE, IP)[:31]):
        assert "same version" in check_grant(key, OBJ, NODE, IP, bad)
    assert "same version" in check_grant(key, "not bytes", NODE, IP, b"x" * 32)
    assert "same version" in check_grant(key, OBJ, "", IP, b"x" * 32)


def test_fields_cannot_be_shifted_between_node_id_and_ip():
    key = new_key()
    assert grant(key, OBJ, "ab", "c") != grant(key, OBJ, "a", "bc")
