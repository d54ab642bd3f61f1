"""Chunk plans: the largest Dask chunks whose worker footprint stays under the pause threshold.

Like rechunker's ``algorithm.py``, the planning core is pure: shapes, bytes and a
predictor in, a :class:`ChunkPlan` out; no processes, files or Dask clusters.

The plan (:func:`plan_chunks`)
------------------------------
Per non-whole axis of length ``N``, the candidates are ``c = ceil(N / k)`` for chunk
counts ``k = 1 .. N // c_min`` (all distinct values, log-thinned beyond a cap so the
product over axes stays <= :data:`MAX_CANDIDATES`), with ``c_min = max(min_chunk,
2h + 1)`` and the last chunk ``N - (k - 1) c >= h`` (else ``map_overlap`` would
rechunk); along the two trailing axes also ``c + 1`` where ``c``'s block is even (key 2
below; up to 4x the candidates).  A whole axis has the one candidate ``N``.  A block larger than
``VolumeGeometry.max_block_voxels`` (the largest the operator's tasks were measured on in a
worker) is no candidate: beyond it the in-worker bound's spread and the clock are unseen (when
every block is larger, the smallest stays).  A candidate fits when
``upper total <= pause_fraction * limit_bytes`` (Dask pauses a worker at that
fraction of its memory limit).  Footprints are evaluated vectorised, never one shape
at a time: candidates whose footprint exceeds the budget even with ``peak = 0`` are
dropped, a probe sub-grid (6 lengths per axis) is predicted, and then the rest fastest
first, only until the rows are slower than the fastest fit so far (which cannot change
the answer); a predictor that declares ``ceiling`` (a task model's) may stop short
on a row it shows cannot fit (:class:`Predictor`).
Among the candidates that fit the plan is, in order:

1. with one slot (one worker, one thread): fewest tasks ``n = prod(ceil(N_i / c_i))``,
   the largest chunks.  With ``C = workers * threads > 1`` slots: fastest by
   :func:`plan_seconds`, ``waves(n, C) * (o + s(b) prod(b))`` (``o`` the Dask overhead
   of a chunk's graph tasks, ``s(b)`` the seconds per voxel at the block's volume,
   ``waves`` list scheduling's makespan in tasks: :func:`schedule_waves`), all plans within 5%
   (:data:`SECONDS_TIE_FRACTION`) of the fastest tied: enough chunks per slot that
   none idles through the tail, not so many that the overhead ``n o`` wins;
2. columns that stay in the cache: along an axis the operator needs context on, a stride of
   ``2^k`` bytes times an odd number leaves a walk along that axis ``1 / 2^(k - 6)`` of the sets
   of a cache of 64-byte lines (gaussian's ``run`` took 18 ns per voxel on 96x168x320 blocks,
   12 ns on 96x169x320: :func:`stride_key`, from the cache geometry in ``WorkerSpec.cache``);
3. most even: smallest padding fraction ``(prod(k_i c_i) - prod(N_i)) / prod(N_i)``,
   the share of the task grid past the array's end (0 when each axis divides evenly);
4. most compact: smallest aspect ratio ``max(c_i) / min(c_i)`` over the non-whole axes with a halo
   (halos cost surface, a cube the least per volume; an axis without a halo costs none:
   :func:`compactness_key`, a tie where fewer than two axes have one);
5. fewest tasks (this only matters with several slots);
6. smallest upper footprint, then longer chunks on later axes (the samples axis of a
   seismic volume is contiguous on disk), so the choice is deterministic.

The three stages are separate functions: :func:`chunk_candidates` (shapes, blocks, task
counts, time model), :func:`evaluate_candidates` (predictions and footprints) and
:func:`rank_candidates` (the keys above).  The time model's ``s`` and ``o`` come from
the caller (:class:`TimeTerms`): learnt from the workers' clocks once a probe or a run has taught them
(``explorer.plan.timing.TimingFit``: a :class:`TaskClock`), the defaults below before.

Re-planning (:func:`replan`) is planning policy too: a running computation whose task
exceeded its bound restarts with a new plan only early (at most
:data:`REPLAN_MAX_DONE_FRACTION` of its tasks done) and only when its own footprint no
longer fits under the updated predictor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from explorer.core.units import format_bytes, format_shape
from explorer.plan.candidates import (
    _complete_smallest,
    _predict_rows,
    _ranking_keys,
    chunk_candidates,
    evaluate_candidates,
    ranked_candidates,
)
from explorer.plan.chunk_plan import ChunkPlan, ChunkPlanError
from explorer.plan.footprint import worker_footprint
from explorer.plan.predictor import takes
from explorer.plan.spec import TimeTerms, VolumeGeometry, WorkerSpec
from explorer.plan.time_model import DEFAULT_SECONDS_PER_VOXEL

if TYPE_CHECKING:
    from explorer.plan.grid import Candidates
    from explorer.plan.predictor import Predictor

__all__ = [
    "plan_chunks",
    "plan_fits",
    "replan",
]

#: How many of the plans tied with the chosen one on the first key a plan reports (``ChunkPlan.tied``).
TIED_REPORTED = 3


def plan_chunks(
    geometry: VolumeGeometry,
    predict: Predictor,
    worker_spec: WorkerSpec,
    time_terms: TimeTerms = TimeTerms(),
    *,
    confidence: float = 0.99,
    operator: str | None = None,
    warnings: tuple[str, ...] = (),
    chunks=None,
) -> ChunkPlan:
    """The fastest chunks of ``geometry`` whose upper worker footprint fits (module docstring):
    :func:`chunk_candidates`, :func:`evaluate_candidates`, :func:`rank_candidates`.

    ``worker_spec``: the workers; tasks run ``C = workers * threads_per_worker`` at a time, each
    worker starting from its idle ``baseline_bytes``, measured where the work runs
    (``explorer.plan.recommend``).  With one slot the first key is the fewest tasks; with
    several it is :func:`plan_seconds` with ``C`` slots and ``time_terms``' seconds per voxel
    and graph-task seconds, or, given its learnt ``task_clock``, the clock's seconds per voxel
    and spread at each candidate's block; plans within :data:`SECONDS_TIE_FRACTION` of the
    fastest are tied.  ``predicted_seconds`` is reported either way.

    ``predict(block_shapes, confidence=confidence) -> (mean, upper)`` gives a task's
    ``peak_bytes`` for ``(m, ndim)`` int64 block shapes (:class:`Predictor`: the keywords it
    declares it takes are passed).  A candidate fits when ``worker_footprint(b, upper).total
    <= pause_fraction * limit_bytes``.  Raises :class:`ChunkPlanError` when none does, saying
    so when the baseline alone leaves no room.  ``warnings`` (one line each) and the spec's
    ``baseline_source`` are carried on the plan.  ``chunks``: plan only that chunk shape (its
    bound and time; :class:`ChunkPlanError` when its bound does not fit).
    """
    geometry, worker_spec = _checked_plan_arguments(geometry, worker_spec, confidence)
    shape, halo, whole = geometry.shape, geometry.halo, geometry.whole_axes
    threads, workers, limit_bytes = worker_spec.threads_per_worker, worker_spec.workers, worker_spec.limit_bytes
    pause_fraction, baseline_bytes = worker_spec.pause_fraction, worker_spec.baseline_bytes
    slots = workers * threads
    budget = math.floor(pause_fraction * limit_bytes)
    footprint = functools.partial(worker_footprint, threads_per_worker=threads, itemsize=geometry.itemsize,
                                  output_itemsize=geometry.output_itemsize, baseline_bytes=baseline_bytes,
                                  windowed=True)
    candidates = chunk_candidates(geometry, footprint=footprint, budget=budget, slots=slots, time_terms=time_terms,
                                  chunks=chunks)
    n_predicted = evaluate_candidates(candidates, predict, confidence=confidence, footprint=footprint,
                                      budget=budget, slots=slots)
    if not (candidates.upper_total <= budget).any():
        takes_tasks = takes(predict, "tasks")
        _complete_smallest(candidates, lambda: candidates.exact, lambda rows: _predict_rows(
            predict, candidates, rows, confidence, footprint, takes_tasks, slots=slots))
        raise ChunkPlanError(_no_fit_message(candidates, shape, operator, threads, confidence, pause_fraction,
                                             limit_bytes, budget, baseline_bytes))
    ranking = dict(budget=budget, slots=slots, itemsize=int(geometry.itemsize), cache=worker_spec.cache,
                   halo=geometry.halo)
    order = ranked_candidates(candidates, shape, whole, **ranking)
    if takes(predict, "ceiling"):
        order = _rank_on_own_bounds(candidates, shape, whole, order, predict, confidence, footprint, ranking)
    index = int(order[0])

    tied = _tied_with(candidates, order, index) if chunks is None else ()
    chunk = tuple(int(c) for c in candidates.chunks[index])
    block = tuple(int(b) for b in candidates.blocks[index])
    kept = {"chunk_shapes": chunk, "neighbour_chunks": int(candidates.neighbours[index]),
            "partial": bool(candidates.partial[index])}
    bound = footprint(block, float(candidates.upper_peak[index]), **kept)
    mean = footprint(block, float(candidates.mean_peak[index]), **kept)
    return ChunkPlan(
        operator=operator, shape=shape, chunks=chunk, block=block, halo=halo, whole_axes=whole,
        predicted_bytes=int(mean.total), upper_bytes=int(bound.total), limit_bytes=limit_bytes,
        pause_fraction=float(pause_fraction), confidence=float(confidence), n_tasks=int(candidates.n_tasks[index]),
        threads_per_worker=threads, footprint=bound, n_candidates=n_predicted, slots=slots,
        predicted_seconds=float(candidates.seconds[index]), **_time_at_block(time_terms, block),
        neighbour_chunks=int(candidates.neighbours[index]), workers=workers, itemsize=int(geometry.itemsize),
        output_itemsize=int(geometry.output_itemsize), min_chunk=geometry.min_chunk,
        max_block_voxels=None if chunks is not None else geometry.max_block_voxels,
        graph_task_seconds=float(time_terms.graph_task_seconds), run_fixed_seconds=float(time_terms.run_fixed_seconds),
        first_touch=time_terms.first_touch, read_unit=geometry.read_unit,
        warnings=tuple(warnings), baseline_source=str(worker_spec.baseline_source), cache=worker_spec.cache,
        block_multiple=None if geometry.block_multiple is None else tuple(int(m) for m in geometry.block_multiple),
        tied=tied,
    )


def _tied_with(c: Candidates, order, index: int) -> tuple[dict, ...]:
    """The plans other than ``index`` in the ranking ``order`` (:func:`ranked_candidates`: those the
    first key ties with it, best first), at most :data:`TIED_REPORTED` (``ChunkPlan.tied``)."""
    others = [int(i) for i in order if int(i) != index][:TIED_REPORTED]
    return tuple({"chunks": [int(x) for x in c.chunks[i]], "n_tasks": int(c.n_tasks[i]),
                  "predicted_seconds": float(c.seconds[i])} for i in others)


def _time_at_block(time_terms: TimeTerms, block) -> dict:
    """A fused plan's time-model figures at its ``block``: the seconds per voxel (the learnt
    clock's there, else ``time_terms``'), whether workers clocked that shape, the spread
    (None: Graham's bound) and the clock itself."""
    clock = time_terms.task_clock
    if clock is None:
        return dict(seconds_per_voxel=float(time_terms.seconds_per_voxel), block_clocked=False, task_spread=None,
                    task_clock=None)
    volume = math.prod(block)
    spread = clock.spread_at(volume)
    return dict(seconds_per_voxel=float(clock.seconds_per_voxel_at([volume], [block])[0]),
                block_clocked=bool(clock.clocked(block)[0]), task_spread=None if spread is None else float(spread),
                task_clock=clock)


def _rank_on_own_bounds(c: Candidates, shape, whole, order, predict: Predictor, confidence, footprint,
                        ranking: dict) -> np.ndarray:
    """The ranking ``order`` (:func:`ranked_candidates`) once the candidates the ranking's upper
    footprint (key 6) decides among have their own bounds: a predictor given a ceiling may have
    answered an upper bound of a row's upper where it showed the row fits (:class:`Predictor`,
    ``exact`` False).  Those are the rows ranked equal to the plan, ``order[0]``, on keys 1-5
    (usually it alone, whose footprint the plan reports); those not solved are predicted again
    without a ceiling and ranked again.  A row's own upper is at most that bound: each still
    fits, and no row ranked below them on keys 1-5 can overtake them.  ``ranking``:
    :func:`rank_candidates`' keywords."""
    tied, keys = _ranking_keys(c, shape, whole, **ranking)
    at = int(np.flatnonzero(tied == order[0])[0])
    same = np.ones(len(tied), dtype=bool)
    for key in keys[-4:]:  # n_tasks, aspect, padding, strides: the keys before the upper footprint
        same &= key == key[at]
    rows = tied[same & ~c.exact[tied]]
    if not len(rows):
        return order
    _predict_rows(predict, c, rows, confidence, footprint, takes(predict, "tasks"), slots=ranking["slots"])
    return ranked_candidates(c, shape, whole, **ranking)


def _checked_plan_arguments(geometry: VolumeGeometry, worker_spec: WorkerSpec,
                            confidence: float) -> tuple[VolumeGeometry, WorkerSpec]:
    """``geometry`` and ``worker_spec`` with ints where counts and bytes are (the geometry's
    halo zeros when None, its whole axes sorted and non-negative), or ``ValueError`` naming the
    bad one."""
    shape = tuple(int(n) for n in geometry.shape)
    ndim = len(shape)
    halo = (0,) * ndim if geometry.halo is None else tuple(int(h) for h in geometry.halo)
    whole = tuple(sorted({int(a) % ndim for a in geometry.whole_axes}))
    if len(halo) != ndim:
        raise ValueError(f"halo {halo} has {len(halo)} axes; shape {format_shape(shape)} has {ndim}")
    if any(n <= 0 for n in shape) or any(h < 0 for h in halo):
        raise ValueError(f"shape {format_shape(shape)} and halo {halo} must be positive and non-negative")
    limit_bytes = int(worker_spec.limit_bytes)
    if limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {limit_bytes}")
    pause_fraction = worker_spec.pause_fraction
    if not 0.0 < pause_fraction <= 1.0:
        raise ValueError(f"pause_fraction must be in (0, 1], got {pause_fraction}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    threads = int(worker_spec.threads_per_worker)
    if threads < 1:
        raise ValueError(f"threads_per_worker must be >= 1, got {worker_spec.threads_per_worker}")
    if int(geometry.min_chunk) < 1:
        raise ValueError(f"min_chunk must be >= 1, got {geometry.min_chunk}")
    if int(worker_spec.workers) < 1:
        raise ValueError(f"workers must be >= 1, got {worker_spec.workers}")
    if int(worker_spec.baseline_bytes) < 0:
        raise ValueError(f"baseline_bytes must be non-negative, got {worker_spec.baseline_bytes}")
    geometry = dataclasses.replace(geometry, shape=shape, halo=halo, whole_axes=whole,
                                   min_chunk=int(geometry.min_chunk))
    worker_spec = dataclasses.replace(worker_spec, limit_bytes=limit_bytes, threads_per_worker=threads,
                                      workers=int(worker_spec.workers), baseline_bytes=int(worker_spec.baseline_bytes))
    return geometry, worker_spec


def _no_fit_message(c: Candidates, shape, operator, threads, confidence, pause_fraction, limit_bytes, budget,
                    baseline_bytes) -> str:
    where = f" for {operator}" if operator else ""
    limits = f"{pause_fraction:g} x limit {format_bytes(limit_bytes)} = {format_bytes(budget)}"
    if baseline_bytes >= budget:
        return (f"no chunking of {format_shape(shape)} fits{where}: the workers' baseline (an idle worker with the "
                f"operator loaded) is {format_bytes(baseline_bytes)}, already at or above the pause threshold "
                f"{limits}; raise the memory limit")
    i = int(np.argmin(c.upper_total))
    advice = "raise the memory limit" + (f" or use fewer threads per worker (now {threads})" if threads > 1 else "")
    return (f"no chunking of {format_shape(shape)} fits{where}: the smallest worker footprint "
            f"({format_shape(c.chunks[i])} chunks, {threads} thread(s), {confidence:.0%} bound) is "
            f"{format_bytes(int(c.upper_total[i]))} > {limits}, of which the workers' baseline is "
            f"{format_bytes(baseline_bytes)}; {advice}")


# --------------------------------------------------------------------------- re-planning

#: A running computation whose task exceeded its bound is restarted with a new plan only
#: while at most this share of its tasks is done: later, finishing costs less than
#: starting again (finished blocks cannot be kept: two plans' tasks would write into the
#: same zarr chunks).
REPLAN_MAX_DONE_FRACTION = 0.5


def plan_fits(plan: ChunkPlan, predict: Predictor) -> bool:
    """Whether ``plan``'s upper worker footprint still fits its budget under ``predict``."""
    tasks = {"tasks": np.asarray([plan.n_tasks])} if takes(predict, "tasks") else {}
    if tasks and takes(predict, "cold"):
        tasks["cold"] = np.asarray([min(plan.n_tasks, plan.slots)])
    _mean, upper = predict(np.asarray([plan.block], dtype=np.int64), confidence=plan.confidence, **tasks)
    total = worker_footprint(plan.block, float(np.asarray(upper)[0]), threads_per_worker=plan.threads_per_worker,
                             itemsize=plan.itemsize, output_itemsize=plan.output_itemsize,
                             baseline_bytes=plan.footprint.baseline_bytes, chunk_shapes=plan.chunks,
                             neighbour_chunks=plan.neighbour_chunks, windowed=plan.strategy != "staged",
                             partial=bool(plan.footprint.store_chunk_bytes)).total
    return total <= plan.budget_bytes


def replan(plan: ChunkPlan, predict: Predictor, *, done_fraction: float) -> ChunkPlan | None:
    """The plan to restart a running computation with after a task exceeded its bound, or
    None to carry on.

    None for a staged plan (its tasks are its members', not one predictor's), when more
    than :data:`REPLAN_MAX_DONE_FRACTION` of the tasks are done, when
    ``plan`` still fits its budget under the updated ``predict`` (:func:`plan_fits`), or
    when planning again (:func:`plan_chunks` with the plan's own inputs) gives the
    same chunks.  :class:`ChunkPlanError` when nothing fits any more.
    """
    if plan.strategy != "fused" or done_fraction > REPLAN_MAX_DONE_FRACTION or plan_fits(plan, predict):
        return None
    geometry = VolumeGeometry(plan.shape, plan.halo, whole_axes=plan.whole_axes, block_multiple=plan.block_multiple,
                              itemsize=plan.itemsize, output_itemsize=plan.output_itemsize, min_chunk=plan.min_chunk,
                              max_block_voxels=plan.max_block_voxels, read_unit=plan.read_unit)
    worker_spec = WorkerSpec(plan.limit_bytes, plan.footprint.baseline_bytes,
                             threads_per_worker=plan.threads_per_worker, workers=plan.workers,
                             pause_fraction=plan.pause_fraction, baseline_source=plan.baseline_source,
                             cache=plan.cache)
    time_terms = TimeTerms(seconds_per_voxel=plan.seconds_per_voxel or DEFAULT_SECONDS_PER_VOXEL,
                           graph_task_seconds=plan.graph_task_seconds, run_fixed_seconds=plan.run_fixed_seconds,
                           task_clock=plan.task_clock, first_touch=plan.first_touch)
    new = plan_chunks(geometry, predict, worker_spec, time_terms, confidence=plan.confidence, operator=plan.operator,
                      warnings=plan.warnings)
    return None if new.chunks == plan.chunks else new
