"""``MINIRAY_EXIT_GRACE_S``: how long running work may finish at interpreter exit."""

from __future__ import annotations

import pytest

from miniray._private.core import config


@pytest.mark.parametrize("value, expected", [
    (None, 0.5), ("", 0.5), ("0", 0.0), ("2.5", 2.5), ("-1", 0.0), ("soon", 0.5)])
def test_exit_grace_reads_seconds_with_a_floor_of_none(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MINIRAY_EXIT_GRACE_S", raising=False)
    else:
        monkeypatch.setenv("MINIRAY_EXIT_GRACE_S", value)
    assert config.exit_grace_s() == expected
