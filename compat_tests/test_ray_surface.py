"""Every public name of Ray 2.60 that a Ray Core program reaches for, looked up in miniray.

The names come from Ray's own package (``ray_2_60_names.json``, written by
``collect_ray_names.py``); ``ray_surface.py`` classifies each one and holds the reason for
every name that is refused or missing. These tests fail when:
  * a name's classification differs from its written verdict (a stub that only raises
    NotImplementedError cannot pass as working; a name that starts working must lose its
    verdict, so the README table stays true);
  * a refused or missing name has no reason;
  * README's table is not the one the verdicts give.
What each working name does is tested where it is built (tests/).
"""

from __future__ import annotations

import os
import re

import pytest

from compat_tests import ray_surface

ROWS = ray_surface.load_names()
README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_the_names_come_from_ray_2_60():
    import json

    with open(ray_surface.NAMES_FILE) as f:
        assert json.load(f)["ray_version"] == "2.60.0"
    assert len(ROWS) > 300
    assert len({ray_surface.key(r) for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=ray_surface.key)
def test_name_is_as_its_verdict_says(row):
    verdict, detail = ray_surface.classify(row)
    assert verdict == ray_surface.expected(row), (
        f"{ray_surface.key(row)} is {verdict} in miniray ({detail}), but its verdict in "
        f"compat_tests/ray_surface.py says {ray_surface.expected(row)}: update the verdict "
        f"and the README table (python -m compat_tests.ray_surface)")


def test_every_verdict_names_a_real_name_and_gives_a_reason():
    keys = {ray_surface.key(r) for r in ROWS} | {f"{r['module']}:*" for r in ROWS}
    for table in (ray_surface.REFUSED, ray_surface.MISSING):
        for k, reason in table.items():
            assert k in keys, f"{k} is not one of Ray 2.60's names"
            assert len(reason) > 15, f"{k} needs a reason a user can act on"
    assert not set(ray_surface.REFUSED) & set(ray_surface.MISSING)


def test_a_stub_that_only_raises_is_seen_as_refused():
    def stub(x):
        """Doc."""
        raise NotImplementedError("no")

    def real(x):
        if x:
            raise NotImplementedError("no")
        return x

    class Refused:
        def __init__(self):
            raise NotImplementedError

    assert ray_surface._is_refusal_stub(stub)
    assert ray_surface._is_refusal_stub(Refused)
    assert not ray_surface._is_refusal_stub(real)
    assert not ray_surface._is_refusal_stub(property(lambda self: 1))


def test_refused_names_raise_a_message_that_says_what_to_do():
    import miniray

    for call in (lambda: miniray.client(), lambda: miniray.util.connect("h:1"),
                 lambda: miniray.java_function("A", "f"), lambda: miniray.ClientBuilder()):
        with pytest.raises(NotImplementedError, match="miniray"):
            call()


def test_readme_shows_the_table_the_verdicts_give():
    with open(README) as f:
        text = f.read()
    match = re.search(r"<!-- ray-surface-table -->\n(.*?)<!-- /ray-surface-table -->", text,
                      re.S)
    assert match, "README.md lacks the <!-- ray-surface-table --> section"
    assert match.group(1) == ray_surface.table(), (
        "README's Ray 2.60 surface table is stale: regenerate it with "
        "`python -m compat_tests.ray_surface`")
