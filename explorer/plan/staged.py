"""Staged plans: a pipeline run as one ``map_overlap`` per stage.

A pipeline run *staged* (one ``map_overlap`` per stage: ``operators.pipeline``) is planned by
:func:`plan_staged_chunks` on the same candidates and ranking, with each stage's own block,
task model and time, and every stage's held intermediates in the footprint.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from explorer.core.units import FLOAT32_BYTES
from explorer.plan.candidates import (
    _complete_smallest,
    _predict_blocks,
    chunk_candidates,
    evaluate_candidates,
    rank_candidates,
)
from explorer.plan.chunk_plan import ChunkPlan, ChunkPlanError
from explorer.plan.footprint import neighbour_chunks_held, worker_footprint
from explorer.plan.grid import _samples, exchanged_halo, reads_file
from explorer.plan.planner import _checked_plan_arguments, _no_fit_message
from explorer.plan.predictor import takes
from explorer.plan.spec import TimeTerms
from explorer.plan.time_model import (
    DEFAULT_SECONDS_PER_VOXEL,
    RUN_IO_SECONDS_PER_VOXEL,
    _staged_seconds,
)

if TYPE_CHECKING:
    from explorer.plan.predictor import Predictor
    from explorer.plan.spec import VolumeGeometry, WorkerSpec
    from explorer.plan.time_model import TaskClock

__all__ = [
    "PlanStage",
    "plan_staged_chunks",
]


# --------------------------------------------------------------------------- staged plans


@dataclass(frozen=True)
class PlanStage:
    """One ``map_overlap`` of a staged pipeline: a stage, or one branch of a fan-out stage.

    ``predict``: the member's task :class:`Predictor`.  ``group``: the stage's index; a
    fan-out's branches share one input, whose chunks are kept for their neighbours once.
    ``itemsize``: bytes per sample of the stage's input.  ``task_clock``: the member's
    learnt clock (a whole task of its own in a worker, its input's gathering and its output's
    handing over included); without one, ``seconds_per_voxel``: the member's profiled
    operator seconds per block voxel (``b``, without the run's I/O).
    """

    name: str
    halo: tuple[int, ...]
    predict: Predictor
    group: int
    itemsize: int = FLOAT32_BYTES
    output_itemsize: int = FLOAT32_BYTES
    seconds_per_voxel: float = DEFAULT_SECONDS_PER_VOXEL - RUN_IO_SECONDS_PER_VOXEL
    task_clock: TaskClock | None = None
    #: The largest block the member's tasks were measured on inside a worker
    #: (``TaskModel.largest_block_voxels``); None: not measured.
    max_block_voxels: int | None = None

    @property
    def windowed(self) -> bool:
        """The stage's tasks read their blocks from the file (``operators.windowed_map``): the
        first stage's (group 0); a later stage's ``map_overlap`` gathers them from the previous
        stage's chunks."""
        return reads_file(self.group)


def plan_staged_chunks(
    geometry: VolumeGeometry,
    stages: list[PlanStage],
    worker_spec: WorkerSpec,
    time_terms: TimeTerms = TimeTerms(),
    *,
    confidence: float = 0.99,
    operator: str | None = None,
    warnings: tuple[str, ...] = (),
    chunks=None,
) -> ChunkPlan:
    """The fastest chunks for a pipeline run *staged* (one ``map_overlap`` per stage, every
    intermediate chunked like the input) whose upper worker footprint fits.

    ``geometry``: the volume's shape, whole axes, block multiple and smallest chunk; its halo
    is None and its item sizes are not read (each :class:`PlanStage` has its own; the plan's
    ``halo`` is the largest per axis).  ``worker_spec``: the workers, as :func:`plan_chunks`
    takes them.  ``time_terms``: its ``graph_task_seconds``, ``io_seconds_per_voxel`` and
    ``run_fixed_seconds`` (each stage carries its own seconds per voxel and clock).

    Stage ``s`` (halo ``h_s``) sees blocks ``b_s`` (:func:`axis_blocks` with ``h_s``).  One
    stage's tasks run at a time on a thread, but every stage is a ``map_overlap`` of its own
    whose gathered inputs and finished outputs wait on the worker whichever stage runs, and
    every stage's input keeps chunks for its neighbours' halos (the held intermediates)::

        total = baseline
              + max_s T (in_s(b_s) + P_s(b_s))                           # the running task
              + sum_s [ waiting_s(b_s) + held_output_s(b_s) ]            # every stage's queue
              + sum_g neighbour_chunks_held(k, max_{s in g} h_s, W) * prod(c) * itemsize_g

    (:func:`worker_footprint`'s terms per stage.  Counting the queue of the running stage only,
    the fan-out ``gaussian,envelope+instantaneous_phase+instantaneous_frequency+gst3d`` on
    64x64x384 chunks, 2 workers at 1 GiB, went over its bound, 438 MiB against 415 MiB
    (``scripts/results/bench_pipeline_runs_before_queues.md``), with up to eight finished stage
    outputs waiting on one worker (``scripts/run_trace.py``).)

    (``g`` over stages: a fan-out's branches share one input).  Each ``P_s`` is the
    member's task bound at ``1 - (1 - c) / S`` (Bonferroni over the ``S`` stage terms), so
    the largest holds with ``>= c``.  The time model charges every stage's own graph tasks
    and its task: with the member's learnt clock, what a task of it took in a worker
    (``s_s(V_s) V_s``, its own reading of the input and storing of its chunk included, so a
    stage after the first, whose input and output stay in the workers, has that chunk's
    ``io prod(c)`` taken off, as :func:`composed_clock` takes ``S - 1`` members' I/O off a
    fused task); without, its profiled speed ``b_s V_s``, and the run's reading and storing
    once (``io``, on the first stage's block, as a fused plan charges it on its block).  The
    intermediates' halo slices that come from another worker (a share ``(W - 1) / W`` of
    them) cost ``io`` per voxel::

        seconds = schedule_waves(n, C, sigma, units=S) * chunk_seconds
        chunk_seconds = sum_s ( o * graph_tasks_per_chunk(k, h_s) + task_s )
                      + io * (W - 1) / W * sum_{s on an intermediate} (V_s - prod(c))
        task_s = s_s(V_s) V_s - [s after the first] io prod(c)     (learnt clock)
               = b_s V_s + [s first] io V_s                         (profiled speed)

    ``sigma``: the largest of the stages' learnt spreads at their blocks (Graham's bound when
    a stage has none); ``units=S``: the scheduler hands out stage tasks, not whole chunks, so it
    balances the ``n S`` stage tasks over the slots (:func:`schedule_waves`).  Candidates and ranking
    are :func:`plan_chunks`'s (with its probe pass: the time model needs no prediction).  The plan's
    ``footprint`` is the binding stage's terms with every stage's held chunks,
    ``stages`` one dict per stage, ``halo`` the largest stage halo per axis.
    """
    if not stages:
        raise ValueError("a staged plan needs at least one stage")
    if geometry.halo is not None:
        raise ValueError("a staged plan's halos are its stages': its geometry takes none")
    halos = np.asarray([s.halo for s in stages], dtype=np.int64)
    halo_max = tuple(int(h) for h in halos.max(axis=0))
    # every stage's block is at most the chunk with the largest halo: that block within the smallest
    # of the stages' caps keeps each stage within its own (VolumeGeometry.max_block_voxels)
    cap = min((int(c) for c in (geometry.max_block_voxels, *(s.max_block_voxels for s in stages)) if c is not None),
              default=None)
    geometry, worker_spec = _checked_plan_arguments(dataclasses.replace(geometry, halo=halo_max, max_block_voxels=cap),
                                                    worker_spec, confidence)
    shape, whole, limit_bytes = geometry.shape, geometry.whole_axes, worker_spec.limit_bytes
    threads, workers, baseline_bytes = worker_spec.threads_per_worker, worker_spec.workers, worker_spec.baseline_bytes
    pause_fraction = worker_spec.pause_fraction
    slots = workers * threads
    budget = math.floor(pause_fraction * limit_bytes)
    nothing = functools.partial(worker_footprint, threads_per_worker=threads, baseline_bytes=0)
    c = chunk_candidates(geometry, footprint=nothing, budget=np.iinfo(np.int64).max, slots=slots,
                         time_terms=TimeTerms(seconds_per_voxel=DEFAULT_SECONDS_PER_VOXEL,
                                              graph_task_seconds=time_terms.graph_task_seconds),
                         chunks=chunks)
    m = len(c.chunks)
    counts = -(-np.asarray(shape) // c.chunks)
    chunk_samples = _samples(c.chunks)
    # What needs no prediction first, for every row: each stage's blocks, the time model, the
    # held intermediates.  Then predictions only where evaluate_candidates' probe pass asks.
    blocks, c.seconds = _staged_seconds(shape, stages, c.axis_chunks, c.grid, chunk_samples, c.n_tasks,
                                        workers=workers, slots=slots,
                                        graph_task_seconds=time_terms.graph_task_seconds,
                                        io_seconds_per_voxel=time_terms.io_seconds_per_voxel,
                                        run_fixed_seconds=time_terms.run_fixed_seconds,
                                        first_touch=time_terms.first_touch, read_unit=geometry.read_unit)
    held_chunks = np.zeros(m, dtype=np.int64)
    held_bytes = np.zeros(m, dtype=np.int64)
    for group in sorted({s.group for s in stages}):
        members = [s for s in stages if s.group == group]
        exchanged = np.max([exchanged_halo(s.halo, s.group) for s in members], axis=0)
        kept = neighbour_chunks_held(counts, exchanged, workers)
        held_chunks += kept
        held_bytes += kept * chunk_samples * int(members[0].itemsize)
    # Every stage's map_overlap keeps its own gathered inputs and finished outputs, whichever runs.
    # only the last stage's tasks store the output, so only they hold a partial chunk's store chunk
    partial = [c.partial if i == len(stages) - 1 else np.zeros(m, dtype=bool) for i in range(len(stages))]
    idle = [worker_footprint(b, 0, threads_per_worker=threads, baseline_bytes=0, itemsize=s.itemsize,
                             output_itemsize=s.output_itemsize, windowed=s.windowed, chunk_shapes=c.chunks,
                             partial=partial[i])
            for i, (s, b) in enumerate(zip(stages, blocks))]
    waiting = np.sum([f.waiting_input_bytes for f in idle], axis=0)
    finished = np.sum([f.held_output_bytes for f in idle], axis=0)
    resident = held_bytes + waiting + finished  # between tasks, whichever stage runs
    # With every task peak at 0 the footprint is already a lower bound: rows over the budget
    # at that are never predicted (as chunk_candidates drops an operator plan's).
    floor = baseline_bytes + resident + np.max([f.task_bytes for f in idle], axis=0)
    per_stage = 1.0 - (1.0 - float(confidence)) / len(stages)
    worst = np.iinfo(np.int64).max // 4
    means, uppers = np.full((m, len(stages)), np.inf), np.full((m, len(stages)), np.inf)
    running_upper = np.full((m, len(stages)), worst, dtype=np.int64)

    order = list(range(len(stages)))  # heaviest stage first, once the first (probe) pass has shown which
    predicted, ordered = [0], [False]

    def fill(rows, prune=True):
        """Each stage's bound at ``rows`` and their totals; with ``prune``, a row already over
        the budget after the stages so far is not predicted further (its total then a lower
        bound above the budget: it cannot fit whatever the rest predicts)."""
        rows = np.asarray(rows, dtype=np.int64)
        prune = prune and ordered[0]
        c.upper_total[rows] = floor[rows]
        alive = rows[floor[rows] <= budget] if prune else rows
        for position, i in enumerate(order):
            if not len(alive):
                break
            stage, b = stages[i], blocks[i][alive]
            mean, upper, _ = _predict_blocks(stage.predict, b, c.n_tasks[alive], per_stage,
                                             takes(stage.predict, "tasks"), slots=slots)
            predicted[0] += len(alive)
            terms = functools.partial(worker_footprint, b, threads_per_worker=threads, baseline_bytes=0,
                                      itemsize=stage.itemsize, output_itemsize=stage.output_itemsize,
                                      windowed=stage.windowed, chunk_shapes=c.chunks[alive],
                                      partial=partial[i][alive])
            finite = np.isfinite(upper)
            running_upper[alive, i] = np.where(finite, terms(np.where(finite, upper, 0.0)).task_bytes, worst)
            means[alive, i], uppers[alive, i] = mean, upper
            so_far = running_upper[alive][:, order[: position + 1]].max(axis=1)
            total = np.minimum(baseline_bytes + so_far + resident[alive], np.iinfo(np.int64).max)
            c.upper_total[alive] = total
            if prune:
                alive = alive[total <= budget]
        if not ordered[0] and len(rows):
            order.sort(key=lambda k: -float(np.mean(running_upper[rows, k])))
            ordered[0] = True

    evaluate_candidates(c, None, confidence=confidence, footprint=None, budget=budget, slots=slots, fill=fill)
    if not (c.upper_total <= budget).any():  # the message's smallest footprint, as an unpruned search gives it
        _complete_smallest(c, lambda: np.isfinite(uppers).all(axis=1), lambda rows: fill(rows, prune=False))
    done = np.flatnonzero(np.isfinite(uppers).all(axis=1))  # every stage predicted: the binding stage's
    binding = np.argmax(running_upper[done], axis=1)
    c.mean_peak[done], c.upper_peak[done] = means[done, binding], uppers[done, binding]
    if not (c.upper_total <= budget).any():
        raise ChunkPlanError(_no_fit_message(c, shape, operator, threads, confidence, pause_fraction, limit_bytes,
                                             budget, baseline_bytes).replace(" fits", " fits staged", 1))
    index = rank_candidates(c, shape, whole, budget=budget, slots=slots, itemsize=int(stages[0].itemsize),
                            cache=worker_spec.cache, halo=halo_max)
    j = int(np.argmax(running_upper[index]))
    chunk = tuple(int(x) for x in c.chunks[index])
    stage_j = stages[j]
    running_mean = [worker_footprint(tuple(blocks[i][index]), float(means[index, i]), threads_per_worker=threads,
                                     baseline_bytes=0, itemsize=s.itemsize, output_itemsize=s.output_itemsize,
                                     windowed=s.windowed, chunk_shapes=chunk,
                                     partial=bool(partial[i][index])).task_bytes
                    for i, s in enumerate(stages)]
    bound = worker_footprint(tuple(blocks[j][index]), float(uppers[index, j]), threads_per_worker=threads,
                             baseline_bytes=baseline_bytes, itemsize=stage_j.itemsize,
                             output_itemsize=stage_j.output_itemsize, windowed=stage_j.windowed, chunk_shapes=chunk,
                             partial=bool(partial[j][index]))
    bound = dataclasses.replace(bound, waiting_input_bytes=int(waiting[index]), held_output_bytes=int(finished[index]),
                                neighbour_chunk_bytes=int(held_bytes[index]))
    table = tuple({"operator": s.name, "halo": list(s.halo), "block": [int(x) for x in blocks[i][index]],
                   "mean_peak_bytes": float(means[index, i]), "upper_peak_bytes": float(uppers[index, i]),
                   "running_upper_bytes": int(running_upper[index, i]), "binding": i == j,
                   "block_clocked": s.task_clock is not None and bool(s.task_clock.clocked(blocks[i][index])[0])}
                  for i, s in enumerate(stages))
    return ChunkPlan(
        operator=operator, shape=shape, chunks=chunk, block=tuple(int(x) for x in blocks[j][index]), halo=geometry.halo,
        whole_axes=whole, predicted_bytes=int(baseline_bytes + max(running_mean) + resident[index]),
        upper_bytes=int(c.upper_total[index]), limit_bytes=limit_bytes, pause_fraction=float(pause_fraction),
        confidence=float(confidence), n_tasks=int(c.n_tasks[index]), threads_per_worker=threads, footprint=bound,
        n_candidates=predicted[0], slots=slots, predicted_seconds=float(c.seconds[index]),
        seconds_per_voxel=None, block_clocked=all(t["block_clocked"] for t in table),
        neighbour_chunks=int(held_chunks[index]), workers=workers,
        itemsize=int(stages[0].itemsize), output_itemsize=int(stages[-1].output_itemsize),
        min_chunk=geometry.min_chunk, max_block_voxels=None if chunks is not None else geometry.max_block_voxels,
        graph_task_seconds=float(time_terms.graph_task_seconds),
        run_fixed_seconds=float(time_terms.run_fixed_seconds), warnings=tuple(warnings),
        first_touch=time_terms.first_touch, read_unit=geometry.read_unit,
        baseline_source=str(worker_spec.baseline_source), cache=worker_spec.cache,
        block_multiple=None if geometry.block_multiple is None else tuple(int(m) for m in geometry.block_multiple),
        strategy="staged", stages=table)
