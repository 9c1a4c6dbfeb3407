"""The pool's pure decisions (chunk sizes, chunks, pool size), compared with Ray 2.60's
``ray.util.multiprocessing.Pool``; no process is started."""

from __future__ import annotations

import pytest

from miniray.util.multiprocessing.pool import check_processes, default_chunksize, make_chunks


def test_default_chunksize_is_rays():
    """Four chunks per process, rounded up (Ray 2.60's ``_calculate_chunksize``)."""
    assert default_chunksize(10, 2) == 2
    assert default_chunksize(8, 2) == 1
    assert default_chunksize(0, 2) == 0
    assert default_chunksize(100, 3) == 9


def test_make_chunks_splits_and_unpacks():
    assert make_chunks(range(5), 2, unpack_args=False) == [
        [((0,), {}), ((1,), {})], [((2,), {}), ((3,), {})], [((4,), {})]]
    assert make_chunks([(1, 2)], 3, unpack_args=True) == [[((1, 2), {})]]
    with pytest.raises(ValueError, match="chunksize must be a positive integer"):
        make_chunks([1], 0, unpack_args=False)


def test_check_processes_errors_are_rays():
    """Same messages as Ray 2.60 for 0 processes and for more than the cluster's CPUs."""
    assert check_processes(None, 4) == 4
    with pytest.raises(ValueError, match=r"Processes in the pool must be >0\."):
        check_processes(0, 2)
    with pytest.raises(ValueError, match="Tried to start a pool with 3 processes on an "
                                         "existing ray cluster, but there are only 2 CPUs"):
        check_processes(3, 2)
