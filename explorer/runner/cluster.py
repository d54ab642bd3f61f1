"""The cluster a run uses: connected to (or started as a ``LocalCluster``), its workers set up
as the profiles were taken, the operator warmed on each and their baseline measured.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from explorer.core.units import format_bytes
from explorer.measure.local_cluster import local_cluster, saturation_warning
from explorer.runner.context import ERROR, FAILED, _RunError, _default_memory_limit, _one_line

if TYPE_CHECKING:
    from explorer.runner.context import RunContext


class ClusterError(ValueError):
    """A cluster that cannot be used: one line (the address, why, what to check)."""


def connect(address: str, timeout: float = 10.0):
    """A ``distributed.Client`` of the scheduler at ``address`` that has workers, or
    :class:`ClusterError` in one line (nothing listening within ``timeout`` seconds, no worker)."""
    from distributed import Client

    try:
        client = Client(address, timeout=f"{timeout:g}s")
    except Exception as exc:
        raise ClusterError(f"cannot connect to scheduler {address} within {timeout:g} s ({_one_line(exc)}): "
                           f"is a scheduler running there?") from None
    if not client.scheduler_info(n_workers=-1).get("workers"):
        client.close()
        raise ClusterError(f"scheduler {address} has no workers")
    return client


def _connect(ctx: RunContext) -> None:
    """Join the cluster at ``scheduler``, or start a LocalCluster; the workers' limit and threads."""
    import dask
    from distributed import Client

    result = ctx.result
    if ctx.scheduler:
        try:
            ctx.client = connect(ctx.scheduler, ctx.connect_timeout)
        except ClusterError as exc:
            raise _RunError(FAILED if "has no workers" in str(exc) else ERROR, str(exc)) from None
        info = ctx.client.scheduler_info(n_workers=-1).get("workers", {})
        limits = [int(w.get("memory_limit") or 0) for w in info.values()]
        ctx.threads = max(int(w.get("nthreads") or 1) for w in info.values())
        if all(limits):
            ctx.limit = min(limits)
            if ctx.requested_limit is not None and ctx.requested_limit != ctx.limit:
                result.warnings.append(f"the cluster's workers have {format_bytes(ctx.limit)} each; "
                                       f"--memory-limit {format_bytes(ctx.requested_limit)} is not applied to "
                                       f"an existing cluster")
        else:
            ctx.limit = ctx.requested_limit or _default_memory_limit(len(info))
        result.n_workers, ctx.cluster_kind = len(info), "external"
        warning = saturation_warning(_scheduler_saturation(ctx.client), ctx.threads)
        if warning is not None:
            result.warnings.append(warning)
    else:
        ctx.limit = ctx.requested_limit or _default_memory_limit(ctx.workers)
        with dask.config.set({"distributed.scheduler.allowed-failures": ctx.allowed_failures}):
            ctx.cluster = local_cluster(ctx.workers, threads_per_worker=ctx.threads, memory_limit=ctx.limit)
        ctx.client = Client(ctx.cluster)
        result.n_workers, ctx.cluster_kind = ctx.workers, "LocalCluster"
    result.threads_per_worker = ctx.threads
    result.memory_limit_bytes = int(ctx.limit)
    _prepare_workers(ctx)


def _scheduler_saturation(client) -> float:
    """The scheduler's ``distributed.scheduler.worker-saturation``, as it runs it (1.0, the
    time model's premise, when a scheduler does not say)."""
    def saturation(dask_scheduler):
        return float(getattr(dask_scheduler, "WORKER_SATURATION", 1.0))

    try:
        return float(client.run_on_scheduler(saturation))
    except Exception:  # a scheduler that refuses to run code: nothing to warn about
        return 1.0


def _prepare_workers(ctx: RunContext) -> None:
    """Every worker, now and later, gets the profiling server's allocator setting
    (``explorer.measure.workersetup``), before its baseline is measured and before any task."""
    from explorer.measure.workersetup import prepare_workers, unpinned_warning

    try:
        pinned = prepare_workers(ctx.client, ctx.operator)
    except Exception as exc:  # the workers cannot import explorer, or one vanished meanwhile
        raise _RunError(ERROR, f"cannot set up the workers' allocator ({_one_line(exc)}): the workers need "
                               f"memory-explorer installed") from None
    warning = unpinned_warning(pinned)
    if warning:
        ctx.result.warnings.append(warning)


def _measure_workers(ctx: RunContext) -> None:
    """Warm the operator on every worker, check the paths, measure the baseline."""
    from explorer.measure.worker_baseline import WorkerError, measure_worker_baseline
    from explorer.search.store import SOURCE_PROBE

    out_dir = os.path.dirname(os.path.abspath(ctx.output)) or "."
    try:
        ctx.baseline = measure_worker_baseline(ctx.client, ctx.operator.name,
                                               readable=(os.path.abspath(ctx.run_input.path),), writable=(out_dir,),
                                               first_touch=ctx.source != SOURCE_PROBE)  # a probe plans nothing
    except WorkerError as exc:
        lost = "was lost" in str(exc)
        raise _RunError(FAILED if lost else ERROR, str(exc),
                        advice="raise --memory-limit" if lost else None) from None
    ctx.result.worker_baseline_bytes = ctx.baseline.bytes
    from explorer.measure.inworker import reset_worker_high_water

    ctx.client.run(reset_worker_high_water, on_error="ignore")  # this run's peak, not the worker's of all time
    from explorer.plan.dask_config import worker_pause_fraction

    pause = worker_pause_fraction() * ctx.limit
    if ctx.baseline.bytes >= pause:
        raise _RunError(FAILED, f"an idle worker with {ctx.operator.name} loaded already holds "
                                f"{format_bytes(ctx.baseline.bytes)}, above its pause threshold "
                                f"({worker_pause_fraction():.0%} of {format_bytes(ctx.limit)} = {format_bytes(pause)}): "
                                f"no task would ever run",
                        advice="raise --memory-limit (or free the workers' memory: preloads, other work)")
