"""The ``LocalCluster`` this tool starts (a run's, the in-worker probes', a worker baseline's):
one process per worker, quiet, no dashboard; distributed is imported only when one starts."""

from __future__ import annotations

import logging

__all__ = ["local_cluster"]


def local_cluster(n_workers: int, *, threads_per_worker: int = 1, memory_limit=None, preload=None):
    """A ``distributed.LocalCluster`` of ``n_workers`` processes, ``threads_per_worker`` each.

    ``memory_limit``: each worker's (None: distributed's default, ``"auto"``).  ``preload``:
    modules the workers import at start (None: Dask's configuration's).  No dashboard, logs
    below CRITICAL silenced; the scheduler's HTTP server (health checks) on a free port.
    """
    from distributed import LocalCluster

    options = {}
    if memory_limit is not None:
        options["memory_limit"] = memory_limit
    if preload is not None:
        options["preload"] = list(preload)
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                        dashboard_address=None, silence_logs=logging.CRITICAL,
                        scheduler_kwargs={"dashboard_address": ":0"}, **options)
