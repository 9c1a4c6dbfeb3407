"""The ``"ray"`` joblib backend: a ``Parallel`` loop's batches run on a pool of actors.

Mirrors ``ray.util.joblib.ray_backend.RayBackend`` (Ray 2.60): ``n_jobs`` actors of
``miniray.util.multiprocessing.Pool`` (``n_jobs=-1``: one per CPU of the cluster, starting
miniray if needed; more than the cluster's CPUs raises the Pool's ``ValueError``; 1 runs the
loop in the calling process, as joblib's process backends do), ``ray_remote_args`` configuring
the actors (given to ``parallel_config`` or to ``Parallel``, the latter winning), batches
sized automatically, and a call's exception re-raised as itself. Differs: Ray grafts its Pool
under joblib's memory-mapping pool by replacing that class's base at run time; miniray builds
on joblib's pool-backend interface instead, and arrays travel through miniray's object store
rather than joblib's memory-mapped files.

Owns: the backend's pool for the duration of a ``Parallel`` call (``configure`` creates it,
``terminate`` kills its actors). Called by joblib.
"""

from __future__ import annotations

from typing import Any

from joblib._parallel_backends import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    PoolManagerMixin,
    SequentialBackend,
)

import miniray
from miniray.util.multiprocessing.pool import Pool

__all__ = ["RayBackend"]


class RayBackend(PoolManagerMixin, AutoBatchingMixin, ParallelBackendBase):
    """joblib's ``"ray"`` backend; register it with ``miniray.util.joblib.register_ray()``."""

    supports_retrieve_callback = True
    supports_return_generator = False

    def __init__(self, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None,
                 ray_remote_args: dict[str, Any] | None = None, **kwargs):
        self.ray_remote_args = ray_remote_args
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)

    def effective_n_jobs(self, n_jobs: int) -> int:
        """``-1``: the cluster's CPUs (starting miniray if needed); else joblib's count."""
        if n_jobs == -1:
            if not miniray.is_initialized():
                miniray.init()
            return int(miniray.cluster_resources()["CPU"])
        return super().effective_n_jobs(n_jobs)

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: str | None = None,
                  require: str | None = None, ray_remote_args: dict[str, Any] | None = None,
                  **pool_kwargs) -> int:
        """Start the pool of ``n_jobs`` actors for one ``Parallel`` call."""
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:  # as joblib's process backends: no pool for one job
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        remote_args = ray_remote_args if ray_remote_args is not None else self.ray_remote_args
        self._pool = Pool(processes=n_jobs, ray_remote_args=remote_args)
        self.parallel = parallel
        return n_jobs

    def terminate(self) -> None:
        """Kill the pool's actors (joblib calls this at the end of each ``Parallel`` call)."""
        super().terminate()
        self.reset_batch_stats()
