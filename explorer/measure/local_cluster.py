"""The ``LocalCluster`` this tool starts (a run's, the in-worker probes', a worker baseline's):
one process per worker, quiet, no dashboard; distributed is imported only when one starts."""

from __future__ import annotations

import logging
import math

__all__ = ["local_cluster", "WORKER_SATURATION", "saturation_warning"]


#: ``distributed.scheduler.worker-saturation`` of the clusters this tool starts: a worker is
#: handed a new root task only when one of its threads is free, which is the greedy list
#: scheduling the time model prices (``explorer.plan.time_model.schedule_waves``).  Dask's
#: default, 1.1, lets a one-thread worker hold ``ceil(1.1) = 2`` root tasks, and they went
#: out in pairs: 6 equal tasks on 2 one-thread workers ran 4 and 2, 10 ran 6 and 4, with 1.0
#: 3 and 3, 5 and 5 (``python scripts/root_task_balance.py``,
#: ``scripts/results/root_task_balance.md``).
WORKER_SATURATION = 1.0


def saturation_warning(saturation: float, threads_per_worker: int) -> str | None:
    """Why a cluster's scheduler may not balance a plan's tasks as the time model assumes, or
    None: when its worker-saturation ``s`` hands a worker of ``T`` threads more root tasks at
    a time than it has threads (``ceil(s T) > T``; ``s = inf``: all of them at once)."""
    threads = max(1, int(threads_per_worker))
    held = math.inf if math.isinf(saturation) else max(1, math.ceil(float(saturation) * threads))
    if held <= threads:
        return None
    what = "every root task at once" if math.isinf(held) else f"{held} root tasks at a time"
    return (f"the scheduler's distributed.scheduler.worker-saturation is {saturation:g}: it hands each "
            f"{threads}-thread worker {what}, and plans are timed as one task per free thread (as in the "
            f"clusters this tool starts, which use {WORKER_SATURATION:g}); tasks that do not split evenly "
            f"into those batches may run slower than predicted")


def local_cluster(n_workers: int, *, threads_per_worker: int = 1, memory_limit=None, preload=None):
    """A ``distributed.LocalCluster`` of ``n_workers`` processes, ``threads_per_worker`` each.

    ``memory_limit``: each worker's (None: distributed's default, ``"auto"``).  ``preload``:
    modules the workers import at start, besides ``explorer.measure.inworker``, which every worker
    of ours preloads so that it ignores SIGINT (a Ctrl-C reaches the whole process group; this
    process ends the work in one line, not every worker with a ``KeyboardInterrupt`` traceback).
    No dashboard, logs below CRITICAL silenced; the scheduler's HTTP server (health checks) on a
    free port; the scheduler's worker-saturation :data:`WORKER_SATURATION`.
    """
    import dask
    from distributed import LocalCluster

    options = {}
    if memory_limit is not None:
        options["memory_limit"] = memory_limit
    configured = dask.config.get("distributed.worker.preload", default=[]) if preload is None else preload
    options["preload"] = list(dict.fromkeys(["explorer.measure.inworker", *configured]))
    # The scheduler runs in this process and reads its configuration when it starts.
    with dask.config.set({"distributed.scheduler.worker-saturation": WORKER_SATURATION}):
        return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                            dashboard_address=None, silence_logs=logging.CRITICAL,
                            scheduler_kwargs={"dashboard_address": ":0"}, **options)
