"""``miniray.util``'s helpers: ``as_completed`` and ``map_unordered``.

Behaviour compared with Ray 2.60 (its venv): yield order, lazy argument checks (errors come
at the first ``next``, with Ray's messages), a failed task's error raised at its batch after
the values before it, ``yield_obj_refs``, and backpressure reading ``items`` lazily.
"""

from __future__ import annotations

import os
import time

import pytest


def _gated(ray):
    @ray.remote
    def gated(path, value):
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return value

    return gated


def test_as_completed_yields_values_as_they_finish(ray, tmp_path):
    gate = str(tmp_path / "gate")
    gated = _gated(ray)

    @ray.remote
    def quick(value):
        return value

    slow_ref = gated.remote(gate, "slow")
    it = ray.util.as_completed([slow_ref, quick.remote("quick")], chunk_size=1)
    assert next(it) == "quick"  # the slow one is still waiting for its gate
    open(gate, "w").close()
    assert list(it) == ["slow"]


def test_as_completed_batches_keep_submission_order_and_pass_timeout(ray):
    @ray.remote
    def square(x):
        return x * x

    refs = [square.remote(i) for i in range(7)]
    ray.get(refs)
    assert list(ray.util.as_completed(refs, chunk_size=3)) == [i * i for i in range(7)]
    # timeout bounds each wait(), not the iteration: every value still comes.
    refs = [square.remote(i) for i in range(5)]
    assert sorted(ray.util.as_completed(refs, chunk_size=2, timeout=0.001)) == [
        0, 1, 4, 9, 16]
    assert list(ray.util.as_completed([], chunk_size=3)) == []


def test_as_completed_yields_refs_and_raises_a_failed_tasks_error_at_its_batch(ray):
    @ray.remote
    def boom(x):
        if x == 2:
            raise ValueError(f"bad {x}")
        return x

    refs = [boom.remote(i) for i in range(4)]
    ray.wait(refs, num_returns=4, timeout=30)
    seen = []
    with pytest.raises(ValueError, match="bad 2") as info:
        for value in ray.util.as_completed(refs, chunk_size=1):
            seen.append(value)
    assert type(info.value).__name__ == "RayTaskError(ValueError)"
    assert seen == [0, 1]
    got = list(ray.util.as_completed(refs, chunk_size=4, yield_obj_refs=True))
    assert got == refs and all(isinstance(r, ray.ObjectRef) for r in got)


def test_bad_arguments_raise_at_the_first_next_as_in_ray(ray):
    @ray.remote
    def ident(x):
        return x

    ref = ident.remote(1)
    lazy = ray.util.as_completed([ref], chunk_size=0)  # nothing raised yet
    with pytest.raises(ValueError, match="`chunk_size` must be >= 1"):
        next(lazy)
    with pytest.raises(ValueError, match="instead of `num_returns`"):
        next(ray.util.as_completed([ref], num_returns=2))
    with pytest.raises(ValueError, match="backpressure_size must be positive"):
        next(ray.util.map_unordered(ident, [1], backpressure_size=0))
    with pytest.raises(ValueError, match="`chunk_size` must be >= 1"):
        next(ray.util.map_unordered(ident, [1], chunk_size=0))
    with pytest.raises(ValueError, match="instead of `num_returns`"):
        next(ray.util.map_unordered(ident, [1], num_returns=3))


def test_map_unordered_applies_backpressure_and_reads_items_lazily(ray, tmp_path):
    gate = str(tmp_path / "gate")
    @ray.remote
    def double(x):
        return 2 * x

    consumed = []

    def items():
        for i in range(10):
            consumed.append(i)
            yield i

    it = ray.util.map_unordered(double, items(), backpressure_size=3, chunk_size=1)
    first = next(it)
    # Three calls were in flight when the first batch was waited for; no more were submitted.
    assert consumed == [0, 1, 2] and first in (0, 2, 4)
    assert sorted([first, *it]) == [2 * i for i in range(10)]

    # No backpressure: every item is submitted before anything is yielded.
    consumed.clear()
    it = ray.util.map_unordered(_gated_by_item(ray, gate),
                                items(), backpressure_size=None, chunk_size=1)
    first = next(it)
    assert consumed == list(range(10)) and first != 0  # 0 waits for the gate
    open(gate, "w").close()
    assert sorted([first, *it]) == list(range(10))


def _gated_by_item(ray, gate):
    @ray.remote
    def wait_if_zero(x):
        deadline = time.monotonic() + 30
        while x == 0 and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return x

    return wait_if_zero


def test_map_unordered_yields_refs(ray):
    @ray.remote
    def ident(x):
        return x

    refs = list(ray.util.map_unordered(ident, range(5), yield_obj_refs=True))
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert sorted(ray.get(refs)) == list(range(5))
