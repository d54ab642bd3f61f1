"""The ``LocalCluster`` this tool starts (a run's, the in-worker probes', a worker baseline's):
one process per worker, quiet, no dashboard; distributed is imported only when one starts."""

from __future__ import annotations

import logging

__all__ = ["local_cluster"]


def local_cluster(n_workers: int, *, threads_per_worker: int = 1, memory_limit=None, preload=None):
    """A ``distributed.LocalCluster`` of ``n_workers`` processes, ``threads_per_worker`` each.

    ``memory_limit``: each worker's (None: distributed's default, ``"auto"``).  ``preload``:
    modules the workers import at start, besides ``explorer.measure.inworker``, which every worker
    of ours preloads so that it ignores SIGINT (a Ctrl-C reaches the whole process group; this
    process ends the work in one line, not every worker with a ``KeyboardInterrupt`` traceback).
    No dashboard, logs below CRITICAL silenced; the scheduler's HTTP server (health checks) on a
    free port.
    """
    import dask
    from distributed import LocalCluster

    options = {}
    if memory_limit is not None:
        options["memory_limit"] = memory_limit
    configured = dask.config.get("distributed.worker.preload", default=[]) if preload is None else preload
    options["preload"] = list(dict.fromkeys(["explorer.measure.inworker", *configured]))
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                        dashboard_address=None, silence_logs=logging.CRITICAL,
                        scheduler_kwargs={"dashboard_address": ":0"}, **options)
