"""What a finished run leaves in the store: one record of the run (wall time, slots, the
workers' high-water mark), and the store opened for it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from explorer.runner.context import OK

if TYPE_CHECKING:
    from explorer.runner.context import RunContext


def _tasks_per_chunk(ctx: RunContext, counts) -> float:
    """The run's graph tasks per chunk as the time model counts them: a fused run's blocks are
    windowed reads (no halo exchanged); a staged one adds each later stage's ``map_overlap``
    (``explorer.plan.grid.exchanged_halo``)."""
    from explorer.plan.grid import exchanged_halo
    from explorer.plan.time_model import graph_tasks_per_chunk

    if ctx.result.strategy != "staged":
        return float(graph_tasks_per_chunk(counts, (0,) * len(counts)))
    return float(sum(graph_tasks_per_chunk(counts, exchanged_halo(member.halo, index))
                     for index, stage in enumerate(ctx.operator.stages) for member in stage))


def _record_run(ctx: RunContext) -> None:
    """One ``source="run"`` record: what the time model and the footprint check learn from."""
    from explorer.search.store import SOURCE_RUN

    result = ctx.result
    if not result.n_tasks or result.seconds is None:
        return
    counts = [-(-n // c) for n, c in zip(ctx.shape, ctx.chunk)]
    hwm = [h for h in result.worker_hwm_bytes if h]
    peak = max(hwm + [p for p in result.worker_peak_bytes if p], default=0)
    # A re-planned run's seconds include the abandoned plan's: not a clean timing.
    status = "replanned" if result.status == OK and result.replanned_from else result.status
    ctx.observer.store.add_observation(
        ctx.operator.name, ctx.chunk, float(peak), source=SOURCE_RUN, status=status,
        context={"run": result.run_id, "seconds": result.seconds, "n_tasks": result.n_tasks,
                 "slots": (result.n_workers or 1) * ctx.threads, "workers": result.n_workers,
                 "threads_per_worker": ctx.threads,
                 "tasks_per_chunk": _tasks_per_chunk(ctx, counts),
                 "volume_shape": list(ctx.shape), "memory_limit_bytes": ctx.limit,
                 "baseline_bytes": ctx.baseline.bytes, "worker_hwm_bytes": result.worker_hwm_bytes,
                 "plan_upper_bytes": ctx.plan.upper_bytes if ctx.plan is not None else None,
                 "chunks_source": result.chunks_source, "source": ctx.source, "cluster": ctx.cluster_kind,
                 "strategy": result.strategy})


def _open_store(operator, runs_dir, storage):
    """A future of the operator's opened ``Store`` (opened in a background thread)."""
    from concurrent.futures import Future

    future: Future = Future()

    def open_it():
        try:
            from explorer.search.store import Store

            store = Store(runs_dir, storage)
            store.study(operator)
            future.set_result(store)
        except BaseException as exc:  # reported when the run needs the store
            future.set_exception(exc)

    threading.Thread(target=open_it, name="explorer-store-open", daemon=True).start()
    return future
