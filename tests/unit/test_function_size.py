"""Ray's limits on a pickled remote function or actor class (``serialization
.check_function_size``), in Ray 2.60's words (its test_oversized_function, run there)."""

from __future__ import annotations

import logging

import pytest

from miniray._private.core import serialization


def test_past_the_error_threshold_it_is_refused_naming_both_sizes(monkeypatch):
    monkeypatch.delenv("FUNCTION_SIZE_ERROR_THRESHOLD", raising=False)
    with pytest.raises(ValueError) as error:
        serialization.check_function_size(b"x" * 10**8, "__main__.f", "remote function")
    assert str(error.value).startswith(
        "The remote function __main__.f is too large (95 MiB > "
        "FUNCTION_SIZE_ERROR_THRESHOLD=95 MiB). Check that its definition is not implicitly "
        "capturing a large array")
    monkeypatch.setenv("FUNCTION_SIZE_ERROR_THRESHOLD", str(20 << 20))  # Ray's variable
    with pytest.raises(ValueError, match=r"The actor Actor is too large \(20 MiB > "
                                         r"FUNCTION_SIZE_ERROR_THRESHOLD=20 MiB\)"):
        serialization.check_function_size(b"x" * (20 << 20), "Actor", "actor")


def test_past_ten_megabytes_a_warning_and_below_nothing(monkeypatch, caplog):
    monkeypatch.delenv("FUNCTION_SIZE_ERROR_THRESHOLD", raising=False)
    with caplog.at_level(logging.WARNING, logger="miniray"):
        serialization.check_function_size(b"x" * 10**7, "__main__.small", "remote function")
        assert not caplog.records  # 10**7 bytes exactly: Ray's warning starts above it
        serialization.check_function_size(b"x" * (20 << 20), "__main__.m", "remote function")
    assert [r.getMessage()[:60] for r in caplog.records] == [
        "Warning: The remote function __main__.m is very large (20 Mi"]
