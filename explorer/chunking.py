"""Chunk plans: the largest Dask chunks whose worker footprint stays under the pause threshold.

Like rechunker's ``algorithm.py``, the planning core is pure: shapes, bytes and a
predictor in, a :class:`ChunkPlan` out; no processes, files or Dask clusters.

The worker footprint (one formula, stated once in :func:`worker_footprint`)
---------------------------------------------------------------------------
A Dask worker with ``T`` threads runs an operator with halo ``h`` on chunks ``c``.
Each task sees a block ``b``: on a whole axis the full length ``N``, on any other
axis ``c + 2h`` (one-sided ``c + h`` when the axis has two chunks, ``N`` when it has
one; never more than ``N``)::

    total = baseline_bytes                               # the worker process, measured
          + T * (input_block_bytes + task_peak_bytes)    # task_bytes: T tasks running
          + T * waiting_input_bytes_per_thread           # held_bytes: blocks waiting ...
          + T * held_output_bytes_per_thread             #   ... outputs not yet released ...
          + neighbour_chunk_bytes                        #   ... and chunks kept for halos

    input_block_bytes               = prod(b) * itemsize          (float32 input: 4), or 0
    task_peak_bytes                 = the in-worker task peak at b (mean, or its upper bound on
                                      the largest of the plan's n tasks: Predictor)
    waiting_input_bytes_per_thread  = WAITING_INPUTS_PER_THREAD * prod(b) * itemsize, or 0
    held_output_bytes_per_thread    = HELD_OUTPUTS_PER_THREAD  * prod(b) * output_itemsize

``baseline_bytes`` is the resident memory of an idle worker with the operator loaded,
measured on the workers that run the work (``explorer.measure.inworker.warm_worker``), never a
constant: a user's workers (preloads, plugins, other versions) differ from ours by
hundreds of MiB.  ``task_peak_bytes`` is the in-worker task peak of
``docs/definitions.md``: the isolated ``peak_bytes(b)`` (the highest RSS while
``operator.run(x)`` executes minus the RSS just before, with ``x`` resident) plus what
the task needs around ``run`` inside a worker (reading or concatenating its block, the
store's copies; ``explorer.calibration``), so the task's own output is inside it while it runs.

A run reads its input file in **windows** (``operators.windowed_map``): each task reads
its own block (its chunk and the halo), runs and trims it, so no input is resident
before a task starts (``input_block_bytes`` and the waiting inputs are 0, ``windowed``
in :func:`worker_footprint`: the block it reads is inside its task peak) and no chunk is
kept for a neighbour.  ``map_overlap`` on a chunked Dask array instead slices every chunk
into pieces its neighbours gather: a chunk stays resident until its last neighbour has
run, and a worker that reads ahead of its slow tasks holds many.  The frontier count of
:func:`neighbour_chunks_held` (two layers of the grid split over the workers) was the
model of that; the first-run benchmark's survey (2 workers, a 7x4x2 grid of gst3d) held
about 15 chunks' worth on one worker against its 8, 1.09x its bound
(``scripts/results/run_trace_survey.md``): the count depends on how far the scheduler
reads ahead, which no count of the grid gives.  It remains the count for a staged
pipeline's later stages, whose inputs are intermediates in the workers (their producers
are slow tasks, not reads).  Held blocks are counted per thread because the scheduler
keeps each thread fed:

* one waiting input block of ``b`` (a ``map_overlap`` stage only): the next task's block
  (its chunk and the neighbour slices it gathers) is resident before a thread frees up;
* one finished output per thread, sized ``b`` and not ``c``: the trim is a slice, a
  *view* whose base is the operator's whole ``b``-shaped result (checked with dask
  2026.8), so a finished output keeps ``prod(b) * output_itemsize`` alive until its
  consumer releases it;
* a ``map_overlap`` stage's input chunks kept for their neighbours' halos
  (:func:`neighbour_chunks_held`)::

      neighbour_chunk_bytes = ceil(min(n, 2 prod(k_i, i > a)) / W) * prod(c) * itemsize

  (``n`` chunks, ``k_i`` per axis, ``a`` the first axis with a halo and more than one
  chunk; 0 without such an axis).

The same function gives the mean footprint (``task_peak_bytes`` = model mean) and
the bound (= model upper bound at the requested confidence); only that term differs.

The plan (:func:`plan_chunks`)
------------------------------
Per non-whole axis of length ``N``, the candidates are ``c = ceil(N / k)`` for chunk
counts ``k = 1 .. N // c_min`` (all distinct values, log-thinned beyond a cap so the
product over axes stays <= :data:`MAX_CANDIDATES`), with ``c_min = max(min_chunk,
2h + 1)`` and the last chunk ``N - (k - 1) c >= h`` (else ``map_overlap`` would
rechunk).  A whole axis has the one candidate ``N``.  A candidate fits when
``upper total <= pause_fraction * limit_bytes`` (Dask pauses a worker at that
fraction of its memory limit).  Footprints are evaluated vectorised, never one shape
at a time: candidates whose footprint exceeds the budget even with ``peak = 0`` are
dropped, a probe sub-grid (6 lengths per axis) is predicted, and then the rest fastest
first, only until the rows are slower than the fastest fit so far (which cannot change
the answer); a predictor that takes a ``ceiling`` (a composed pipeline's) may stop short
on a row it shows cannot fit (:data:`Predictor`).
Among the candidates that fit the plan is, in order:

1. with one slot (one worker, one thread): fewest tasks ``n = prod(ceil(N_i / c_i))``,
   the largest chunks.  With ``C = workers * threads > 1`` slots: fastest by
   :func:`plan_seconds`, ``waves(n, C) * (o + s(b) prod(b))`` (``o`` the Dask overhead
   of a chunk's graph tasks, ``s(b)`` the seconds per voxel at the block's volume,
   ``waves`` list scheduling's makespan in tasks: :func:`schedule_waves`), all plans within 5%
   (:data:`SECONDS_TIE_FRACTION`) of the fastest tied: enough chunks per slot that
   none idles through the tail, not so many that the overhead ``n o`` wins;
2. most even: smallest padding fraction ``(prod(k_i c_i) - prod(N_i)) / prod(N_i)``,
   the share of the task grid past the array's end (0 when each axis divides evenly);
3. most compact: smallest aspect ratio ``max(c_i) / min(c_i)`` over non-whole axes
   (halos cost surface; a cube has the least surface per volume);
4. fewest tasks (this only matters with several slots);
5. smallest upper footprint, then longer chunks on later axes (the samples axis of a
   seismic volume is contiguous on disk), so the choice is deterministic.

The three stages are separate functions: :func:`chunk_candidates` (shapes, blocks, task
counts, time model), :func:`evaluate_candidates` (predictions and footprints) and
:func:`rank_candidates` (the keys above).  The time model's ``s`` and ``o`` come from
the caller: learnt from the workers' clocks once a probe or a run has taught them
(``explorer.calibration.TimingFit``: a :class:`TaskClock`), the defaults below before.

A pipeline run *staged* (one ``map_overlap`` per stage: ``operators.pipeline``) is planned by
:func:`plan_staged_chunks` on the same candidates and ranking, with each stage's own block,
task model and time, and every stage's held intermediates in the footprint.

Re-planning (:func:`replan`) is planning policy too: a running computation whose task
exceeded its bound restarts with a new plan only early (at most
:data:`REPLAN_MAX_DONE_FRACTION` of its tasks done) and only when its own footprint no
longer fits under the updated predictor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from explorer.core.units import format_bytes, format_shape

__all__ = [
    "ChunkPlan",
    "ChunkPlanError",
    "WorkerFootprint",
    "Candidates",
    "chunk_candidates",
    "evaluate_candidates",
    "PlanStage",
    "plan_chunks",
    "plan_fits",
    "plan_staged_chunks",
    "plan_seconds",
    "makespan_seconds",
    "rank_candidates",
    "replan",
    "schedule_waves",
    "expected_max_normal",
    "TaskClock",
    "compact_neighbour",
    "grid_volume",
    "composed_clock",
    "chunk_grid",
    "fused_seconds",
    "staged_seconds",
    "neighbour_chunks_held",
    "run_seconds_per_voxel",
    "graph_tasks_per_chunk",
    "worker_footprint",
    "worker_pause_fraction",
    "row_product",
]

#: Input blocks gathered and waiting, per thread, beyond the one each running task holds.
WAITING_INPUTS_PER_THREAD = 1
#: Finished outputs not yet released, per thread (each keeps its whole block-shaped base).
HELD_OUTPUTS_PER_THREAD = 1

#: Smallest chunk along a non-whole axis (a task per 16^3 float32 samples is all overhead).
DEFAULT_MIN_CHUNK = 16
#: Upper bound on the number of candidate chunk shapes per plan: 20 per axis when three
#: axes are free, 89 when two are.  Against an unthinned search over 80 cases (analytic
#: predictor), the thinned plans had 0.8% more tasks on average, 6.6% at most.
MAX_CANDIDATES = 8_000
#: Rows per ``predict`` call.  Every call is vectorised; batching only keeps each one in
#: the regime where its cost is linear: the GP's ``predict_many`` took 37 ms for 8,000
#: rows in one call and 3.3 ms in batches of 1,024 (BLAS threading on (n_train, m) products).
PREDICT_BATCH_ROWS = 1024
#: Lengths per axis in the probe pass of a plan (a sub-grid of at most 6^3 candidates).
PROBE_VALUES_PER_AXIS = 6
#: The input block is float32 (docs/definitions.md: peak_bytes is beyond the float32 input).
INPUT_ITEMSIZE = 4
#: Seconds of overhead per Dask graph task (scheduling, messages, small transfers).
#: A measured default: :func:`plan_seconds` fitted to the grid runs of
#: ``scripts/bench_chunks.py`` (2 workers x 1 thread, 2 to 216 chunks, 3 to 24 graph
#: tasks per chunk) gave 2.0 ms (gst3d, envelope, semblance; all runs within 9%) and,
#: refitted by the script itself with a start-up term, 2.6 and 3.0 ms (four operators,
#: RMS error 7.6% and 5.9%).  Dask's best-practice pages quote "up to 1 ms" per task
#: for the scheduler alone.
DEFAULT_GRAPH_TASK_SECONDS = 0.002
#: Seconds per voxel of a chunk's block in a Dask run (read, operator, store), for a
#: model without profiled timings.  The first fit gave 82 ns (envelope), 94 ns
#: (semblance) and 337 ns (gst3d).
DEFAULT_SECONDS_PER_VOXEL = 1e-7
#: Seconds per voxel a run spends beyond the operator itself: reading the SEG-Y block,
#: slicing and storing the output.  The same fit's per-voxel seconds less the
#: operator's profiled ``b`` (``explorer.exploration.operator_run_cost``): 82 - 21 =
#: 61 ns (envelope), 94 - 41 = 53 ns (semblance).
RUN_IO_SECONDS_PER_VOXEL = 6e-8
#: With several slots, plans whose predicted seconds are within this fraction of the
#: fastest count as tied, and evenness, compactness and fewer tasks decide among them:
#: fitted to ``scripts/bench_chunks.py``'s runs the time model's RMS error is 6-14%
#: (two machines), so it does not resolve smaller differences.  (With 2% and fewer tasks
#: first, it took 4 chunks of 160x320x160 for gaussian 320^3 over 8 cubes of 160^3
#: predicted 2% faster; measured, 1.3x slower.)
SECONDS_TIE_FRACTION = 0.05
#: Dask's documented default of ``distributed.worker.memory.pause`` if distributed is absent.
FALLBACK_PAUSE_FRACTION = 0.8

#: ``predict(block_shapes (m, ndim) int64, confidence=...) -> (mean_bytes (m,), upper_bytes (m,))``.
#: A predictor that takes ``tasks=`` (``(m,)``: the tasks of each row's plan) bounds the
#: largest of that many tasks (``explorer.calibration.TaskModel``: a plan's footprint must
#: hold for every task it runs); the planner passes it when it does.  A predictor that
#: takes ``ceiling=`` (``(m,)`` bytes: the largest task peak with which each row's plan
#: still fits) may stop short on a row once it has shown that the row's ``upper`` exceeds
#: its ceiling: it returns ``mean = nan`` there and, as ``upper``, a lower bound of the
#: row's upper that is above the ceiling (``explorer.model.composed.ComposedModel``: one member's
#: term bounds the pipeline's peak from below; ``explorer.calibration.TaskModel``: the isolated
#: bound, or its quantile's lower bound), and where it has shown that the row's upper is at or
#: below its ceiling it may return, also with ``mean = nan``, an upper bound of it
#: (``TaskModel``: a Bonferroni bound, a few table lookups instead of the quantile's
#: quadrature): ``plan_chunks`` predicts the candidates the upper footprint ranks, and its
#: plan, again without a ceiling where they were not solved (:func:`_rank_on_own_bounds`).
#: A predictor that takes ``cold=`` (``(m,)``) is told how many of each row's tasks are their
#: slot's first of the run, ``min(tasks, slots)``: a worker's first task finds none of the
#: run's freed memory to reuse (the task model's cold offset).
Predictor = Callable[..., tuple[np.ndarray, np.ndarray]]


def _takes(predict, keyword: str) -> bool:
    """Whether ``predict`` takes the keyword ``keyword`` (its signature read once per function)."""
    function = getattr(predict, "__func__", predict)  # a bound method's function: one entry per class
    try:
        return _function_takes(function, keyword)
    except TypeError:  # an unhashable callable
        return _function_takes.__wrapped__(function, keyword)


@functools.lru_cache(maxsize=256)
def _function_takes(function, keyword: str) -> bool:
    import inspect

    try:
        return keyword in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _takes_tasks(predict) -> bool:
    return _takes(predict, "tasks")


class ChunkPlanError(ValueError):
    """No candidate chunk fits the memory limit (one-line message)."""


# --------------------------------------------------------------------------- footprint


@dataclass(frozen=True)
class WorkerFootprint:
    """The memory of one Dask worker running an operator, term by term (bytes).

    Fields are ints for one block shape, int64 arrays when :func:`worker_footprint`
    is given many.  ``total = baseline_bytes + task_bytes + held_bytes`` with
    ``task_bytes = T * (input_block_bytes + task_peak_bytes)`` and
    ``held_bytes = waiting_input_bytes + held_output_bytes + neighbour_chunk_bytes``.
    """

    threads_per_worker: int
    #: The worker process itself: interpreter, dask/distributed, operator modules.
    baseline_bytes: int
    #: One running task's input block: ``prod(b) * itemsize`` (0 when the task reads it: ``windowed``).
    input_block_bytes: int | np.ndarray
    #: One running task's ``peak_bytes(b)`` (model mean or upper bound).
    task_peak_bytes: int | np.ndarray
    #: Blocks gathered for the next tasks: ``T * WAITING_INPUTS_PER_THREAD * prod(b) * itemsize``
    #: (0 when each task reads its own: ``windowed``).
    waiting_input_bytes: int | np.ndarray
    #: Finished outputs not yet released: ``T * HELD_OUTPUTS_PER_THREAD * prod(b) * output_itemsize``.
    held_output_bytes: int | np.ndarray
    #: Input chunks kept for neighbours' halos: ``neighbour_chunks_held * prod(c) * itemsize``.
    neighbour_chunk_bytes: int | np.ndarray = 0

    @property
    def task_bytes(self) -> int | np.ndarray:
        """``T * (input_block_bytes + task_peak_bytes)``: the tasks running at once."""
        return self.threads_per_worker * (self.input_block_bytes + self.task_peak_bytes)

    @property
    def held_bytes(self) -> int | np.ndarray:
        """``waiting_input_bytes + held_output_bytes + neighbour_chunk_bytes``: resident between tasks."""
        return self.waiting_input_bytes + self.held_output_bytes + self.neighbour_chunk_bytes

    @property
    def total(self) -> int | np.ndarray:
        """``baseline_bytes + task_bytes + held_bytes``."""
        return self.baseline_bytes + self.task_bytes + self.held_bytes

    def to_dict(self) -> dict:
        terms = {k: _plain(v) for k, v in asdict(self).items()}
        terms.update(
            task_bytes=_plain(self.task_bytes),
            held_bytes=_plain(self.held_bytes),
            total=_plain(self.total),
        )
        return terms


def worker_footprint(
    block_shapes,
    task_peak_bytes,
    *,
    threads_per_worker: int = 1,
    baseline_bytes: int,
    itemsize: int = INPUT_ITEMSIZE,
    output_itemsize: int = 4,
    waiting_inputs_per_thread: int = WAITING_INPUTS_PER_THREAD,
    held_outputs_per_thread: int = HELD_OUTPUTS_PER_THREAD,
    chunk_shapes=None,
    neighbour_chunks=0,
    windowed: bool = False,
) -> WorkerFootprint:
    """The worker footprint of tasks on blocks ``b`` (see the module docstring).

    ``block_shapes`` is one block shape ``(ndim,)`` or many ``(m, ndim)``;
    ``task_peak_bytes`` the matching ``peak_bytes(b)`` (scalar or ``(m,)``), rounded up
    to whole bytes and clipped at 0.  ``neighbour_chunks`` (scalar or ``(m,)``, from
    :func:`neighbour_chunks_held`) chunks of ``chunk_shapes`` are kept for halos; without
    ``chunk_shapes`` that term is 0.  ``windowed``: each task reads its own block
    (``operators.windowed_map``), so no input is resident before a task starts: the
    input-block and waiting-input terms are 0, the block it reads being inside its task
    peak.  Scalar inputs give int terms, arrays int64 arrays.
    """
    threads = int(threads_per_worker)
    if threads < 1:
        raise ValueError(f"threads_per_worker must be >= 1, got {threads_per_worker}")
    blocks = np.asarray(block_shapes, dtype=np.int64)
    block_samples = _samples(blocks)
    peak = np.ceil(np.maximum(np.asarray(task_peak_bytes, dtype=np.float64), 0.0)).astype(np.int64)
    block_input_bytes = block_samples * (0 if windowed else int(itemsize))
    block_output_bytes = block_samples * int(output_itemsize)
    if chunk_shapes is None:
        neighbour_bytes = np.zeros_like(block_samples)
    else:
        chunk_samples = _samples(np.asarray(chunk_shapes, dtype=np.int64))
        neighbour_bytes = np.asarray(neighbour_chunks, dtype=np.int64) * chunk_samples * int(itemsize)
    return WorkerFootprint(
        threads_per_worker=threads,
        baseline_bytes=int(baseline_bytes),
        input_block_bytes=_int_or_array(block_input_bytes),
        task_peak_bytes=_int_or_array(_shaped(peak, block_samples.shape)),
        waiting_input_bytes=_int_or_array(threads * int(waiting_inputs_per_thread) * block_input_bytes),
        held_output_bytes=_int_or_array(threads * int(held_outputs_per_thread) * block_output_bytes),
        neighbour_chunk_bytes=_int_or_array(_shaped(neighbour_bytes, block_samples.shape)),
    )


def _shaped(x: np.ndarray, shape) -> np.ndarray:
    """``x`` broadcast to ``shape``, itself when it has it (``np.broadcast_to`` costs ~10 us)."""
    return x if x.shape == shape else np.broadcast_to(x, shape)


def neighbour_chunks_held(chunk_counts, halo, workers: int = 1):
    """Input chunks one worker keeps resident for its neighbours' halos (module docstring).

    ``ceil(min(n, 2 * prod(k_i for i > a)) / W)``: ``n = prod(k)`` chunks, ``a`` the
    first axis that has a halo and more than one chunk (0 chunks when no axis has
    both).  Dask's order walks the chunk grid in index order, first axis slowest; a
    chunk read from the file is released only after the last block that slices a halo
    from it, its neighbour one step further along ``a`` and every later axis, which
    comes about ``2 * prod(k_i for i > a)`` blocks after the first: two layers of the
    grid across ``a``, shared by the ``W`` workers.  ``chunk_counts``: ``(ndim,)`` or
    ``(m, ndim)``; int64 result, one per row.
    """
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    k = np.asarray(chunk_counts, dtype=np.int64)
    overlapped = (np.asarray(halo) > 0) & (k > 1)
    rows = k.reshape(-1, k.shape[-1])
    overlapped = np.broadcast_to(overlapped, k.shape).reshape(rows.shape)
    # Column by column from the last axis: ``suffix`` is prod(k_i, i >= a); ``later`` ends as
    # prod(k_i, i > a) of the first axis a that overlaps (NumPy's reductions over a short
    # last axis are slow).
    suffix = np.ones(len(rows), dtype=np.int64)
    later = np.zeros(len(rows), dtype=np.int64)
    found = np.zeros(len(rows), dtype=bool)
    for a in reversed(range(rows.shape[1])):
        later = np.where(overlapped[:, a], suffix, later)
        found |= overlapped[:, a]
        suffix = suffix * rows[:, a]
    alive = np.minimum(suffix, 2 * later)
    held = np.where(found, -(-alive // int(workers)), 0)
    return held.reshape(k.shape[:-1])


def _int_or_array(x: np.ndarray):
    x = np.asarray(x)
    return int(x) if x.ndim == 0 else x


def _plain(x):
    return x.tolist() if isinstance(x, np.ndarray) else x


# --------------------------------------------------------------------------- the time model

def run_seconds_per_voxel(operator_seconds_per_voxel: float | None) -> float:
    """Seconds per block voxel in a Dask run: the operator's profiled ``b`` plus the run's I/O.

    ``s = b + RUN_IO_SECONDS_PER_VOXEL``; :data:`DEFAULT_SECONDS_PER_VOXEL` when the
    model carries no profiled ``b`` (saved before timings were kept, or never timed).
    """
    if operator_seconds_per_voxel is None or not math.isfinite(operator_seconds_per_voxel) \
            or operator_seconds_per_voxel < 0:
        return DEFAULT_SECONDS_PER_VOXEL
    return float(operator_seconds_per_voxel) + RUN_IO_SECONDS_PER_VOXEL


def graph_tasks_per_chunk(chunk_counts, halo) -> np.ndarray:
    """Dask graph tasks per chunk of the run: read, operator and store, plus the overlap.

    ``map_overlap`` (``boundary="none"``) slices each neighbour a chunk borders on an
    axis with a halo and more than one chunk, then concatenates and trims.  Along an
    axis of ``k > 1`` chunks a chunk gathers ``(3k - 2) / k`` pieces on average (edge
    chunks have one neighbour), so::

        pieces = prod_i ((3 k_i - 2) / k_i  if h_i > 0 and k_i > 1  else 1)
        tasks  = 3 + (pieces + 2  if pieces > 1  else 0)

    (checked against ``len(graph) / n_chunks`` of the operators' Dask forms: 2.1 + 1
    for envelope, 12.1 + 1 and 16.7 + 1 for gst3d on 2^3 and 3^3 chunks).
    ``chunk_counts``: ``(ndim,)`` or ``(m, ndim)`` chunks per axis.
    """
    return _tasks_from_pieces(row_product(_overlap_pieces(chunk_counts, halo)))


def _overlap_pieces(chunk_counts, halo) -> np.ndarray:
    """Per axis, the pieces a chunk gathers (:func:`graph_tasks_per_chunk`): ``(3 k - 2) / k``
    with a halo and ``k > 1`` chunks, else 1."""
    k = np.asarray(chunk_counts, dtype=np.float64)
    return np.where((np.asarray(halo) > 0) & (k > 1), (3.0 * k - 2.0) / np.maximum(k, 1.0), 1.0)


def _tasks_from_pieces(pieces) -> np.ndarray:
    return 3.0 + np.where(pieces > 1.0, pieces + 2.0, 0.0)


def _grid_graph_tasks(shape, halo, axis_chunks, grid) -> np.ndarray:
    """:func:`graph_tasks_per_chunk` of candidates on a sub-grid of per-axis chunk lengths
    (``axis_chunks[a][grid[a]]``: :class:`Candidates`), each axis's factor computed once per
    length and gathered; the same products, in the same order."""
    pieces = None
    for length, chunks, rows, h in zip(shape, axis_chunks, grid, halo):
        factor = _overlap_pieces(-(-int(length) // np.asarray(chunks, dtype=np.int64)), h)[rows]
        pieces = factor if pieces is None else pieces * factor
    return _tasks_from_pieces(pieces)


def plan_seconds(
    n_tasks,
    block_samples,
    slots: int,
    *,
    tasks_per_chunk=3.0,
    seconds_per_voxel=DEFAULT_SECONDS_PER_VOXEL,
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
    spread=None,
    fixed_seconds: float = 0.0,
    units: int = 1,
):
    """Predicted wall time of ``n_tasks`` chunks' work on blocks of ``block_samples`` voxels::

        seconds = fixed_seconds + schedule_waves(n, C, spread, units) * chunk_seconds
        chunk_seconds = graph_task_seconds * tasks_per_chunk + seconds_per_voxel * prod(b)

    on ``C = slots`` workers x threads (Dask hands ready tasks to free slots: greedy list
    scheduling).  ``spread``: the coefficient of variation of equal tasks' seconds, learnt
    from the workers' clocks (:class:`TaskClock`); None (nothing learnt) takes Graham's
    bound, which assumes nothing about the durations.  With one slot it is ``n *
    chunk_seconds``: the fewest, largest chunks.  With several, large chunks leave slots
    idle in the last wave and small ones pay the overhead ``n`` times.

    ``seconds_per_voxel`` is the cost per voxel at each row's block volume: in a worker a
    task's fixed costs weigh on small blocks, and caches and fresh pages on large ones,
    which :meth:`TaskClock.seconds_per_voxel_at` follows from the clocks.
    ``tasks_per_chunk``: :func:`graph_tasks_per_chunk`.  Scalars or arrays (broadcast).
    ``fixed_seconds``: what a run costs whatever its chunks (submitting the graph, gathering
    the result; learnt: ``explorer.calibration.fit_run_overheads``), the same for every
    chunking of one run, so it ranks nothing and only makes the figure a run's.  ``units``: a
    chunk's graph tasks the scheduler hands out one by one (a staged pipeline's stages:
    :func:`schedule_waves`).
    """
    seconds_per_voxel = np.asarray(seconds_per_voxel, dtype=np.float64)
    if (seconds_per_voxel < 0).any() or graph_task_seconds < 0:
        raise ValueError("seconds_per_voxel and graph_task_seconds must be non-negative")
    chunk_seconds = (graph_task_seconds * np.asarray(tasks_per_chunk, dtype=np.float64)
                     + seconds_per_voxel * np.asarray(block_samples, dtype=np.float64))
    return makespan_seconds(n_tasks, slots, chunk_seconds, spread=spread, fixed_seconds=fixed_seconds, units=units)


def makespan_seconds(n_tasks, slots: int, chunk_seconds, *, spread=None, fixed_seconds: float = 0.0, units: int = 1):
    """A run's seconds, written once: ``fixed_seconds + schedule_waves(n, C, spread, units) *
    chunk_seconds`` (:func:`plan_seconds`; a staged plan's ``chunk_seconds`` sums its stages')."""
    if fixed_seconds < 0:
        raise ValueError("fixed_seconds must be non-negative")
    return fixed_seconds + schedule_waves(n_tasks, slots, spread, units) * np.asarray(chunk_seconds, dtype=np.float64)


@functools.lru_cache(maxsize=64)
def expected_max_normal(m: int) -> float:
    """``E[max(Z_1 .. Z_m)]`` of ``m`` independent standard normals, by quadrature of
    ``m z phi(z) Phi(z)^(m - 1)`` (0 for one, ``1 / sqrt(pi)`` for two)."""
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if m == 1:
        return 0.0
    z = np.linspace(-10.0, 10.0, 8001)
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    cdf = np.cumsum(pdf) * (z[1] - z[0])
    integrand = m * z * pdf * np.clip(cdf, 0.0, 1.0) ** (m - 1)
    return float(np.sum(integrand) * (z[1] - z[0]))


def schedule_waves(n_tasks, slots: int, spread=None, units: int = 1):
    """The makespan of greedy list scheduling of ``n`` tasks on ``C`` slots, in units of one
    task's (mean) time (:func:`plan_seconds`).

    ``spread`` None: Graham's bound ``n / C + 1 - 1 / C``, for durations nothing is known
    about.  ``spread`` ``sigma`` (the tasks' coefficient of variation, learnt): near-equal
    tasks run in ``k = ceil(n / C)`` waves, and the last slot to finish has run ``k``
    tasks whose sum is about normal, so the expected makespan is::

        k + sigma * sqrt(k) * E[max of min(n, C) standard normals]

    (no idle tail when ``n`` is a multiple of ``C`` and the tasks are equal).  When the
    last wave is partial its tasks go to the slots that finished first, so the makespan
    is a little shorter than this (within its spread term of ``k``): the formula charges
    a partial wave as a full one.

    ``units`` ``u > 1``: each task is ``u`` near-equal graph tasks run one after another, each
    of which the scheduler may hand to any free slot (a staged pipeline's chunk: one task per
    stage, :func:`plan_staged_chunks`).  The scheduler then balances units, not whole tasks:
    ``k = ceil(n u / C)`` waves of units (spread ``sigma`` each), in task times ``k / u``, and
    never less than the one task's own chain (``>= 1``); without a spread, Graham's bound for
    a graph holds unchanged (its critical path is the one task's chain)::

        max(1, (k + sigma * sqrt(k) * E[max of min(n u, C) standard normals]) / u)

    (9 staged chunks of 2 stages on 2 slots: 4.5 task times, not 5; measured balanced in
    ``scripts/bench_pipeline_runs.py``'s task streams).  ``units=1`` is the formula above.
    """
    slots, units = int(slots), int(units)
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    n = np.asarray(n_tasks, dtype=np.float64)
    if spread is None:
        return n / slots + 1.0 - 1.0 / slots
    spread = np.asarray(spread, dtype=np.float64)
    if (spread < 0).any():
        raise ValueError("spread must be non-negative")
    pieces = n * units
    waves = np.ceil(pieces / slots)
    table = np.array([expected_max_normal(m) for m in range(1, slots + 1)])
    running = np.clip(pieces, 1, slots).astype(np.int64)
    makespan = waves + spread * np.sqrt(waves) * table[running - 1]
    return makespan if units == 1 else np.maximum(1.0, makespan / units)


@dataclass(frozen=True)
class TaskClock:
    """A task's seconds as a function of its block, learnt from workers' clocks
    (``explorer.calibration.fit_timing``): the planner's time model where it has them.

    ``volumes`` (increasing) and ``seconds_per_voxel``: a task's median seconds per block
    voxel (read, operator, store: everything the worker spends on it) in groups of equal
    tasks of those volumes; between them, linear in ``log V``; beyond them, the nearest
    group's (a task's fixed costs are inside each group's figure, so no per-voxel slope
    fitted over all sizes charges small blocks' fixed costs to large ones).
    ``spread_volumes`` and ``spreads``: the coefficient of variation of the groups' task
    seconds (groups of at least three tasks), interpolated alike; empty when none.

    ``shapes`` and ``shape_seconds_per_voxel``: the same figure per exact block shape that
    workers ran.  A block of a clocked shape takes its own figure, any other the volume
    curve.  Blocks of one volume need not cost alike: gst3d in one process ran 106 ns per
    voxel on 133^3 and 162 ns on 133x133x256 (its cache misses grow with the planes its
    filters stride across, ``scripts/shape_speed.py``), which no function of the volume
    learnt from cubes can tell; a shape the workers timed (a probe, a trial of the plan's
    block before a run: ``explorer.daskrun``, a production task) is known exactly.
    """

    volumes: tuple[float, ...]
    seconds_per_voxel: tuple[float, ...]
    spread_volumes: tuple[float, ...] = ()
    spreads: tuple[float, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    shape_seconds_per_voxel: tuple[float, ...] = ()

    def __post_init__(self):
        if not self.volumes or len(self.volumes) != len(self.seconds_per_voxel) \
                or len(self.spread_volumes) != len(self.spreads) \
                or len(self.shapes) != len(self.shape_seconds_per_voxel):
            raise ValueError("a task clock needs one seconds per voxel (and one spread) per volume and per shape")
        if any(v <= 0 for v in self.volumes + self.spread_volumes) \
                or any(not s >= 0 for s in self.seconds_per_voxel + self.spreads + self.shape_seconds_per_voxel) \
                or any(not all(int(n) >= 1 for n in shape) for shape in self.shapes):
            raise ValueError("a task clock's volumes and shapes must be positive and its seconds and spreads "
                             "non-negative")

    @staticmethod
    def _at(volumes, knots, values):
        return np.interp(np.log(np.maximum(np.asarray(volumes, dtype=np.float64), 1.0)), np.log(knots), values)

    def _shape_index(self, blocks) -> np.ndarray:
        """Per row of ``blocks`` ``(m, ndim)`` (or one shape), its index in ``shapes``, or -1.
        Vectorised (a plan weighs thousands of candidate blocks): each shape is packed into
        one integer key and looked up in the sorted keys of ``shapes``."""
        blocks = np.atleast_2d(np.asarray(blocks, dtype=np.int64))
        if not self.shapes:
            return np.full(len(blocks), -1, dtype=np.int64)
        known = np.asarray(self.shapes, dtype=np.int64)
        if known.shape[1] != blocks.shape[1]:
            return np.full(len(blocks), -1, dtype=np.int64)
        bits = max(1, int(max(known.max(), blocks.max(initial=1))).bit_length())
        if bits * blocks.shape[1] > 62:  # too long to pack: compare row by row
            lookup = {tuple(row): i for i, row in enumerate(known.tolist())}
            return np.array([lookup.get(tuple(row), -1) for row in blocks.tolist()], dtype=np.int64)
        shifts = np.arange(blocks.shape[1], dtype=np.int64) * bits
        keys, wanted = (known << shifts).sum(axis=1), (blocks << shifts).sum(axis=1)
        order = np.argsort(keys)
        at = np.minimum(np.searchsorted(keys[order], wanted), len(keys) - 1)
        return np.where(keys[order][at] == wanted, order[at], -1)

    def clocked(self, blocks) -> np.ndarray:
        """Whether each block shape of ``blocks`` ``(m, ndim)`` (or one shape) was timed in workers."""
        return self._shape_index(blocks) >= 0

    def seconds_per_voxel_at(self, volumes, blocks=None) -> np.ndarray:
        """Seconds per voxel at ``volumes`` (the curve); given the ``blocks`` ``(m, ndim)``
        those volumes are of, a clocked shape's own figure in its row."""
        curve = self._at(volumes, self.volumes, self.seconds_per_voxel)
        if blocks is None or not self.shapes:
            return curve
        index = self._shape_index(blocks)
        own = np.asarray(self.shape_seconds_per_voxel, dtype=np.float64)[np.maximum(index, 0)]
        return np.where(index >= 0, own, np.broadcast_to(curve, index.shape))

    def spread_at(self, volumes):
        """The coefficient of variation at ``volumes``, or None when no group had three tasks."""
        return self._at(volumes, self.spread_volumes, self.spreads) if self.spreads else None

    def to_dict(self) -> dict:
        data = {k: list(v) for k, v in asdict(self).items()}
        data["shapes"] = [list(shape) for shape in self.shapes]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TaskClock":
        return cls(**{k: tuple(float(x) for x in data.get(k) or ()) for k in
                      ("volumes", "seconds_per_voxel", "spread_volumes", "spreads", "shape_seconds_per_voxel")},
                   shapes=tuple(tuple(int(n) for n in shape) for shape in data.get("shapes") or ()))


def composed_clock(clocks, shared_seconds_per_voxel: float = 0.0) -> TaskClock:
    """The clock of one task running the members of ``clocks`` in turn on the same block: a
    fused pipeline's, from its members' learnt clocks.

    Each member's clock times a whole task of its own (read, operator, store); a fused task
    reads and stores once, so ``S - 1`` of the members' I/O (``shared_seconds_per_voxel``, their
    learnt I/O per voxel) is taken off::

        s(V)     = sum_s s_s(V) - (S - 1) * io          (at the union of the members' volumes)
        sigma(V) = max_s sigma_s(V)                     (none when a member has no spread)

    and alike per block shape that every member clocked (:class:`TaskClock`).
    """
    clocks = list(clocks)
    if not clocks:
        raise ValueError("a composed clock needs at least one member clock")
    volumes = np.unique(np.concatenate([np.asarray(c.volumes, dtype=np.float64) for c in clocks]))
    speed = sum(c.seconds_per_voxel_at(volumes) for c in clocks) - (len(clocks) - 1) * float(shared_seconds_per_voxel)
    floor = max(float(c.seconds_per_voxel_at(volumes).min()) for c in clocks)
    shapes = sorted(set.intersection(*(set(c.shapes) for c in clocks)))  # clocked by every member
    if shapes:
        volumes_of = [float(math.prod(shape)) for shape in shapes]
        members = [c.seconds_per_voxel_at(volumes_of, shapes) for c in clocks]
        own = np.maximum(sum(members) - (len(clocks) - 1) * float(shared_seconds_per_voxel),
                         max(float(m.min()) for m in members))
    spread_volumes, spreads = (), ()
    if all(c.spreads for c in clocks):
        knots = np.unique(np.concatenate([np.asarray(c.spread_volumes, dtype=np.float64) for c in clocks]))
        spread_volumes = tuple(float(v) for v in knots)
        spreads = tuple(float(x) for x in np.max([c.spread_at(knots) for c in clocks], axis=0))
    return TaskClock(volumes=tuple(float(v) for v in volumes),
                     seconds_per_voxel=tuple(float(x) for x in np.maximum(speed, floor)),
                     spread_volumes=spread_volumes, spreads=spreads, shapes=tuple(shapes),
                     shape_seconds_per_voxel=tuple(float(x) for x in own) if shapes else ())


def _fused_seconds(shape, axis_chunks, grid, blocks, n_tasks, *, slots: int, seconds_per_voxel,
                   graph_task_seconds: float, task_clock: TaskClock | None = None,
                   run_fixed_seconds: float = 0.0) -> np.ndarray:
    """:func:`plan_seconds` of one task per block (an operator's plan, a pipeline's fused one) for
    candidates on a sub-grid of per-axis chunk lengths (:class:`Candidates`): with the learnt
    ``task_clock`` its seconds per voxel and spread at each block's volume, else the given
    ``seconds_per_voxel`` and Graham's bound.  A fused task's block is one windowed read of
    the file (``operators.windowed_map``): no halo is exchanged between chunks, so its graph
    tasks are :func:`graph_tasks_per_chunk` with none."""
    halo = (0,) * len(shape)
    volumes = _samples(blocks)
    spread = None
    if task_clock is not None:
        seconds_per_voxel, spread = task_clock.seconds_per_voxel_at(volumes, blocks), task_clock.spread_at(volumes)
    return plan_seconds(n_tasks, volumes, slots, tasks_per_chunk=_grid_graph_tasks(shape, halo, axis_chunks, grid),
                        seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds, spread=spread,
                        fixed_seconds=run_fixed_seconds)


def _staged_seconds(shape, stages, axis_chunks, grid, chunk_samples, n_tasks, *, workers: int, slots: int,
                    graph_task_seconds: float, io_seconds_per_voxel: float,
                    run_fixed_seconds: float = 0.0) -> tuple[list, np.ndarray]:
    """``(blocks per stage, seconds)``: :func:`plan_staged_chunks`'s time model (its docstring)
    for candidates on a sub-grid of per-axis chunk lengths."""
    ndim = len(shape)
    blocks, chunk_seconds, spreads = [], np.zeros(len(chunk_samples)), []  # the stages' graph tasks and work
    for stage in stages:
        b = np.stack([axis_blocks(shape[a], axis_chunks[a], int(stage.halo[a]))[grid[a]] for a in range(ndim)],
                     axis=1)  # per axis, then gathered: the candidates are a sub-grid of the axes' lengths
        blocks.append(b)
        volumes = _samples(b).astype(np.float64)
        exchanged = exchanged_halo(stage.halo, stage.group)
        chunk_seconds += graph_task_seconds * _grid_graph_tasks(shape, exchanged, axis_chunks, grid)
        clock = stage.task_clock
        if clock is not None:
            chunk_seconds += clock.seconds_per_voxel_at(volumes, b) * volumes
            if stage is not stages[0]:  # its input and output stay in the workers: no read, no store
                chunk_seconds -= io_seconds_per_voxel * chunk_samples
        else:
            chunk_seconds += stage.seconds_per_voxel * volumes + (io_seconds_per_voxel * volumes
                                                                  if stage is stages[0] else 0.0)
        spreads.append(None if clock is None else clock.spread_at(volumes))
        if not stage.windowed:  # its halo slices come from the intermediate's chunks, some on other workers
            chunk_seconds += io_seconds_per_voxel * (workers - 1) / workers * (volumes - chunk_samples)
    spread = None if any(x is None for x in spreads) else np.max(spreads, axis=0)
    return blocks, makespan_seconds(n_tasks, slots, chunk_seconds, spread=spread, fixed_seconds=run_fixed_seconds,
                                    units=len(stages))


def chunk_grid(shape, chunks) -> tuple[list, tuple, np.ndarray, np.ndarray]:
    """Given chunk shapes ``(m, ndim)`` as candidates on a sub-grid: ``(axis_chunks, grid,
    n_tasks, chunk_samples)`` (each axis's distinct lengths, each row's index into them)."""
    chunks = np.atleast_2d(np.asarray(chunks, dtype=np.int64))
    if chunks.shape[1] != len(shape) or (chunks < 1).any():
        raise ValueError(f"chunks must be rows of {len(shape)} positive lengths, got {chunks.tolist()}")
    chunks = np.minimum(chunks, np.asarray(shape, dtype=np.int64))
    axis_chunks, grid = [], []
    for a in range(len(shape)):
        lengths, index = np.unique(chunks[:, a], return_inverse=True)
        axis_chunks.append(lengths)
        grid.append(index.ravel())
    n_tasks = row_product(-(-np.asarray(shape, dtype=np.int64) // chunks))
    return axis_chunks, tuple(grid), n_tasks, _samples(chunks)


def fused_seconds(shape, halo, chunks, *, slots: int, seconds_per_voxel=DEFAULT_SECONDS_PER_VOXEL,
                  graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
                  task_clock: TaskClock | None = None, run_fixed_seconds: float = 0.0) -> np.ndarray:
    """The time model of :func:`plan_chunks` at given chunk shapes ``(m, ndim)`` (one task per
    block): what it predicts for a chunking it did not choose."""
    axis_chunks, grid, n_tasks, _ = chunk_grid(shape, chunks)
    blocks = np.stack([axis_blocks(shape[a], axis_chunks[a], int(halo[a]))[grid[a]] for a in range(len(shape))],
                      axis=1)
    return _fused_seconds(tuple(shape), axis_chunks, grid, blocks, n_tasks, slots=slots,
                          seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds,
                          task_clock=task_clock, run_fixed_seconds=run_fixed_seconds)


def staged_seconds(shape, stages, chunks, *, workers: int, slots: int,
                   graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
                   io_seconds_per_voxel: float = RUN_IO_SECONDS_PER_VOXEL, run_fixed_seconds: float = 0.0) -> np.ndarray:
    """The time model of :func:`plan_staged_chunks` at given chunk shapes ``(m, ndim)``."""
    axis_chunks, grid, n_tasks, chunk_samples = chunk_grid(shape, chunks)
    return _staged_seconds(tuple(shape), stages, axis_chunks, grid, chunk_samples, n_tasks, workers=int(workers),
                           slots=int(slots), graph_task_seconds=graph_task_seconds,
                           io_seconds_per_voxel=io_seconds_per_voxel, run_fixed_seconds=run_fixed_seconds)[1]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ChunkPlan:
    """Chunks for ``operator`` on a volume of ``shape``, with the footprint that justifies them.

    ``predicted_bytes`` and ``upper_bytes`` are the worker footprint's total with the
    model's mean and upper bound (at ``confidence``) of ``peak_bytes(block)``;
    ``footprint`` holds the bound's terms.  The plan guarantees
    ``upper_bytes <= budget_bytes = floor(pause_fraction * limit_bytes)``.
    """

    operator: str | None
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    #: The largest block a task sees (chunk plus halos, whole axes whole).
    block: tuple[int, ...]
    halo: tuple[int, ...]
    whole_axes: tuple[int, ...]
    predicted_bytes: int
    upper_bytes: int
    limit_bytes: int
    pause_fraction: float
    confidence: float
    n_tasks: int
    threads_per_worker: int
    footprint: WorkerFootprint = field(repr=False)
    #: Candidate chunk shapes whose footprint was predicted.
    n_candidates: int = 0
    #: ``workers * threads_per_worker``: the tasks that run at once in the time model.
    slots: int = 1
    #: :func:`plan_seconds` of the plan: the time model's wall seconds (a ranking, not a promise).
    predicted_seconds: float | None = None
    #: The time model's seconds per block voxel (at the plan's block).
    seconds_per_voxel: float | None = None
    #: The time model's coefficient of variation of equal tasks' seconds at the plan's
    #: block (learnt from the clocks), or None: Graham's bound (:func:`schedule_waves`).
    task_spread: float | None = None
    #: The learnt clocks the time model used (None: the constant ``seconds_per_voxel``).
    task_clock: TaskClock | None = field(default=None, repr=False)
    #: Whether workers have timed the plan's block shape itself (:meth:`TaskClock.clocked`; a
    #: staged plan's: every stage's block by its member's clock); False: its seconds come from
    #: a clock's volume curve.
    block_clocked: bool = False
    #: Input chunks a worker keeps for its neighbours' halos (:func:`neighbour_chunks_held`).
    neighbour_chunks: int = 0
    #: The workers the plan shares the work between.
    workers: int = 1
    #: Bytes per sample of the input and of the output.
    itemsize: int = INPUT_ITEMSIZE
    output_itemsize: int = 4
    #: The smallest chunk along a free axis the planner considered.
    min_chunk: int = DEFAULT_MIN_CHUNK
    #: The time model's seconds of overhead per Dask graph task.
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS
    #: A run's fixed seconds in ``predicted_seconds`` (:func:`plan_seconds`).
    run_fixed_seconds: float = 0.0
    #: What the bound does not know, one line each (a stale model, no in-worker calibration).
    warnings: tuple[str, ...] = ()
    #: Where ``footprint.baseline_bytes`` came from: ``"cluster"`` (measured on the workers
    #: of the run), ``"local"`` (measured once on this machine and saved) or ``"given"``.
    baseline_source: str = "given"
    #: Chunk lengths of split axes are multiples of these (``Operator.block_multiple``).
    block_multiple: tuple[int, ...] | None = None
    #: A fan-out pipeline's branches in the order its tasks run them (the order the
    #: predicted peak assumes: ``explorer.model.composed``); empty for anything else.
    branch_order: tuple[str, ...] = ()
    #: How a pipeline runs on Dask (``operators.pipeline.STRATEGIES``): ``"fused"`` (one
    #: ``map_overlap`` with the whole halo; a single operator's only form) or ``"staged"``
    #: (:func:`plan_staged_chunks`).
    strategy: str = "fused"
    #: A staged plan's stages at its chunks, one dict each (:func:`plan_staged_chunks`).
    stages: tuple[dict, ...] = ()
    #: What the planner weighed when it chose between strategies: per strategy, its plan's
    #: chunks, upper footprint and predicted seconds, or why it had none (``error``).
    considered: dict = field(default_factory=dict)

    @property
    def budget_bytes(self) -> int:
        """``floor(pause_fraction * limit_bytes)``: what the upper footprint must not exceed."""
        return math.floor(self.pause_fraction * self.limit_bytes)

    @property
    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask's chunks tuple: per axis ``(c, ..., c, remainder)``, as ``normalize_chunks`` gives."""
        return tuple(_axis_chunks(n, c) for n, c in zip(self.shape, self.chunks))

    def to_dict(self) -> dict:
        """JSON-ready: ints, floats, strings and lists only."""
        return {
            "operator": self.operator,
            "shape": list(self.shape),
            "chunks": list(self.chunks),
            "dask_chunks": [list(c) for c in self.dask_chunks],
            "block": list(self.block),
            "halo": list(self.halo),
            "whole_axes": list(self.whole_axes),
            "predicted_bytes": self.predicted_bytes,
            "upper_bytes": self.upper_bytes,
            "limit_bytes": self.limit_bytes,
            "pause_fraction": self.pause_fraction,
            "budget_bytes": self.budget_bytes,
            "confidence": self.confidence,
            "n_tasks": self.n_tasks,
            "threads_per_worker": self.threads_per_worker,
            "footprint": self.footprint.to_dict(),
            "n_candidates": self.n_candidates,
            "slots": self.slots,
            "predicted_seconds": self.predicted_seconds,
            "seconds_per_voxel": self.seconds_per_voxel,
            "task_spread": self.task_spread,
            "block_clocked": self.block_clocked,
            "neighbour_chunks": self.neighbour_chunks,
            "workers": self.workers,
            "baseline_bytes": self.footprint.baseline_bytes,
            "baseline_source": self.baseline_source,
            "block_multiple": None if self.block_multiple is None else list(self.block_multiple),
            "graph_task_seconds": self.graph_task_seconds,
            "run_fixed_seconds": self.run_fixed_seconds,
            "branch_order": list(self.branch_order),
            "strategy": self.strategy,
            "stages": [dict(stage) for stage in self.stages],
            "considered": {k: dict(v) for k, v in self.considered.items()},
            "warnings": list(self.warnings),
        }

    def summary(self) -> dict:
        """What :attr:`considered` keeps of a plan: its chunks, bound and predicted time."""
        return {"chunks": list(self.chunks), "n_tasks": self.n_tasks, "upper_bytes": self.upper_bytes,
                "predicted_seconds": self.predicted_seconds}


def _axis_chunks(length: int, chunk: int) -> tuple[int, ...]:
    full, remainder = divmod(length, chunk)
    return (chunk,) * full + ((remainder,) if remainder else ())


def _counts(n_max: int, cap: int) -> np.ndarray:
    """Chunk counts ``1 .. n_max``; past ``cap`` values, the first half consecutive, the rest log-spaced."""
    if n_max <= cap:
        return np.arange(1, n_max + 1)
    dense = cap // 2
    sparse = np.geomspace(dense + 1, n_max, cap - dense)
    return np.unique(np.concatenate([np.arange(1, dense + 1), np.rint(sparse).astype(np.int64)]))


def axis_chunk_candidates(length: int, halo: int, whole: bool, min_chunk: int, cap: int,
                          multiple: int = 1) -> np.ndarray:
    """Candidate chunk lengths along one axis, largest first.

    Whole axis: ``[length]``.  Otherwise the distinct ``ceil(length / k)`` for
    ``k = 1 .. length // c_min``, ``c_min = min(length, max(min_chunk, 2 halo + 1))``,
    each rounded up to a multiple of ``multiple`` when the axis is split (an operator
    that pads its blocks to a multiple needs its chunk boundaries on that grid:
    ``Operator.block_multiple``), keeping those whose last chunk is at least ``halo``
    (Dask's ``map_overlap`` rechunks smaller ones).
    """
    if whole:
        return np.array([length], dtype=np.int64)
    smallest = min(length, max(int(min_chunk), 2 * halo + 1))
    counts = _counts(length // smallest, cap)
    chunk = -(-length // counts)
    m = int(multiple)
    if m > 1:
        chunk = np.where(chunk >= length, length, np.minimum(-(-chunk // m) * m, length))
    chunk = np.unique(chunk)[::-1]
    n_chunks = -(-length // chunk)
    last = length - (n_chunks - 1) * chunk
    return chunk[(n_chunks == 1) | (last >= halo)]


def _axis_cap(ndim: int, whole) -> int:
    """Candidate lengths per split axis, so that their product stays near :data:`MAX_CANDIDATES`."""
    return max(4, int(MAX_CANDIDATES ** (1.0 / max(1, ndim - len(whole))) + 1e-9))


def grid_volume(block, halo, whole_axes, counts) -> tuple[tuple, tuple]:
    """``(volume_shape, chunks)`` of a synthetic volume whose tasks see ``block`` (the probes'
    and the trials'): along a split axis with ``k`` chunks, ``k`` chunks of ``b - h`` (with two,
    each has its neighbour's halo on one side only, so every task's block is exactly ``b``;
    with more, the interior ones see ``b + h``); with one chunk, or along a whole axis, ``b``
    (a windowed read clips the halo at the volume's edge)."""
    volume, chunks = [], []
    for axis, (b, h, k) in enumerate(zip(block, halo, counts)):
        if axis in whole_axes or int(k) == 1:
            volume.append(int(b))
            chunks.append(int(b))
        else:
            volume.append(int(k) * (int(b) - int(h)))
            chunks.append(int(b) - int(h))
    return tuple(volume), tuple(chunks)


def compact_neighbour(plan: "ChunkPlan") -> tuple[int, ...] | None:
    """The plan's chunks with its longest split axis cut in about twice as many chunks: the
    largest of that axis's candidate lengths (:func:`axis_chunk_candidates`, as
    :func:`plan_chunks` made them) at most half the plan's; None when no axis can be cut.

    The time model ranks blocks it has no clock of by their volume alone, and a longer
    block's extra cost per voxel (its cache misses) can outweigh the waves it saves: gst3d's
    256^3 plan of 128x128x256 chunks ran 1.6x slower than 128^3.  ``explorer.daskrun`` times
    this neighbour beside the plan before a run (its trials) so that the choice between them
    is measured."""
    whole = set(plan.whole_axes)
    free = [axis for axis in range(len(plan.shape)) if axis not in whole and plan.chunks[axis] > 1]
    cap = _axis_cap(len(plan.shape), whole)
    multiple = plan.block_multiple or (1,) * len(plan.shape)
    for axis in sorted(free, key=lambda a: (-plan.chunks[a], -a)):
        lengths = axis_chunk_candidates(plan.shape[axis], plan.halo[axis], False, plan.min_chunk, cap,
                                        multiple[axis])
        shorter = lengths[lengths <= plan.chunks[axis] // 2]
        if shorter.size:
            chunks = list(plan.chunks)
            chunks[axis] = int(shorter.max())
            return tuple(chunks)
    return None


def axis_blocks(length: int, chunks, halo: int) -> np.ndarray:
    """The largest block extent a task sees along one axis, for each chunk length.

    ``N`` when the axis is in one chunk (a whole axis always is); ``min(c + h, N)``
    with two chunks (each has a neighbour on one side only: ``boundary="none"``);
    ``min(c + 2h, N)`` with three or more (an interior chunk has both).
    """
    chunks = np.asarray(chunks, dtype=np.int64)
    n_chunks = -(-length // chunks)
    block = np.minimum(chunks + np.where(n_chunks >= 3, 2 * halo, halo), length)
    return np.where(n_chunks == 1, length, block)


def row_product(a: np.ndarray):
    """``prod`` over the last axis of ``(ndim,)`` or ``(m, ndim)``: for many rows a product of
    columns, the same multiplications in the same order as ``np.prod(axis=-1)`` and 10x
    faster on a few columns (NumPy's reduction over a short axis is slow)."""
    a = np.asarray(a)
    if a.ndim != 2:
        return np.prod(a, axis=-1)
    out = a[:, 0].copy()
    for i in range(1, a.shape[1]):
        out *= a[:, i]
    return out


def _samples(shapes: np.ndarray) -> np.ndarray:
    """``prod(shape)`` over the last axis (a column product: 10x faster than ``np.prod(axis=-1)``)."""
    shapes = np.asarray(shapes, dtype=np.int64)
    if shapes.ndim == 1:
        return np.int64(math.prod(int(n) for n in shapes))
    out = shapes[:, 0].copy()
    for i in range(1, shapes.shape[1]):
        out *= shapes[:, i]
    return out


@dataclass
class Candidates:
    """Candidate chunkings of one volume, one row each (:func:`chunk_candidates`).

    ``axis_chunks[i]``: the candidate lengths along axis ``i``; ``grid[i]``: each row's
    index into it.  ``chunks``, ``blocks`` ``(m, ndim)``; ``n_tasks``, ``neighbours``
    (:func:`neighbour_chunks_held`), ``seconds`` (:func:`plan_seconds`) ``(m,)``.  The
    predictions ``mean_peak``, ``upper_peak`` and the bound's ``upper_total`` are filled
    by :func:`evaluate_candidates` (``inf``/int64 max where not predicted); ``exact`` marks the
    rows whose prediction is complete, the others' ``upper_total`` being a lower bound above
    the budget (a predictor's ``ceiling``: :data:`Predictor`) or nothing.
    """

    axis_chunks: list
    grid: tuple
    chunks: np.ndarray
    blocks: np.ndarray
    n_tasks: np.ndarray
    neighbours: np.ndarray
    seconds: np.ndarray
    mean_peak: np.ndarray = None
    upper_peak: np.ndarray = None
    upper_total: np.ndarray = None
    exact: np.ndarray = None

    def __post_init__(self):
        m = len(self.chunks)
        self.mean_peak = np.full(m, np.inf)
        self.upper_peak = np.full(m, np.inf)
        self.upper_total = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
        self.exact = np.zeros(m, dtype=bool)


def chunk_candidates(shape, halo, whole, *, footprint, budget: int, min_chunk: int, workers: int, slots: int,
                     seconds_per_voxel: float, graph_task_seconds: float, block_multiple=None,
                     task_clock: TaskClock | None = None, run_fixed_seconds: float = 0.0,
                     chunks=None) -> Candidates:
    """The candidate chunkings (module docstring): the Cartesian product of per-axis chunk
    lengths, less those whose footprint with ``peak = 0`` already exceeds ``budget`` (the
    smallest is kept so that a failure can report it); their time model is evaluated.
    ``chunks``: one chunk shape, the only candidate (a whole axis whole, none longer than the
    volume): the plan of a chunking chosen elsewhere."""
    ndim = len(shape)
    cap = _axis_cap(ndim, whole)
    multiple = (1,) * ndim if block_multiple is None else tuple(int(m) for m in block_multiple)
    if chunks is None:
        axis_chunks = [axis_chunk_candidates(shape[i], halo[i], i in whole, min_chunk, cap, multiple[i])
                       for i in range(ndim)]
    else:
        axis_chunks = [np.array([shape[i] if i in whole else min(int(chunks[i]), shape[i])], dtype=np.int64)
                       for i in range(ndim)]
    axis_block = [axis_blocks(shape[i], c, halo[i]) for i, c in enumerate(axis_chunks)]
    axis_counts = [-(-shape[i] // c) for i, c in enumerate(axis_chunks)]
    block_samples = functools.reduce(np.multiply.outer, axis_block).ravel()
    n_tasks = functools.reduce(np.multiply.outer, axis_counts).ravel()
    # The footprint depends on a block only through its volume: volumes as 1-axis shapes.
    floor_total = footprint(block_samples[:, None], 0).total
    keep = np.flatnonzero(floor_total <= budget)
    if keep.size == 0:
        keep = np.array([np.argmin(floor_total)])
    grid = np.unravel_index(keep, [len(c) for c in axis_chunks])
    chunks = np.stack([c[g] for c, g in zip(axis_chunks, grid)], axis=1)
    blocks = np.stack([b[g] for b, g in zip(axis_block, grid)], axis=1)
    seconds = _fused_seconds(shape, axis_chunks, grid, blocks, n_tasks[keep], slots=slots,
                             seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds,
                             task_clock=task_clock, run_fixed_seconds=run_fixed_seconds)
    return Candidates(axis_chunks=axis_chunks, grid=grid, chunks=chunks, blocks=blocks, n_tasks=n_tasks[keep],
                      # a fused task reads its own block (operators.windowed_map): nothing kept for a neighbour
                      neighbours=np.zeros(len(keep), dtype=np.int64), seconds=seconds)


def _first_key(c: Candidates, slots: int) -> tuple[np.ndarray, float]:
    """The first ranking key and its tie factor: fewest tasks (exactly) with one slot; the
    time model within :data:`SECONDS_TIE_FRACTION` with several.  Known before any prediction."""
    if slots == 1:
        return c.n_tasks.astype(np.float64), 1.0
    return c.seconds, 1.0 + SECONDS_TIE_FRACTION


def evaluate_candidates(c: Candidates, predict: Predictor | None, *, confidence: float, footprint, budget: int,
                        slots: int, fill=None) -> int:
    """Predict the candidates' task peaks and upper footprints; return how many were predicted.

    The first ranking key ``k`` (:func:`_first_key`) needs no prediction, and the plan is
    among the candidates that fit with ``k <= k* x tie``, ``k*`` the least key of any that
    fits (:func:`rank_candidates`).  Two passes over disjoint rows find them.  Pass 1, a
    probe: a sub-grid of at most :data:`PROBE_VALUES_PER_AXIS` lengths per axis, whose fits
    give a first ``k*``.  Pass 2, a sweep of the rest in increasing ``k``, in batches of
    :data:`PREDICT_BATCH_ROWS`: each batch's fits lower ``k*``, and the sweep stops
    at the first row with ``k > k* x tie``.  Every row it leaves has ``k`` above the
    threshold of the true ``k*`` (which is at most the sweep's), so the plan is the one an
    exhaustive evaluation would give, for a fraction of the rows; when nothing fits, every
    row is predicted (the error names the smallest footprint).  ``fill(rows)``, when
    given, fills ``c``'s predictions at ``rows`` instead of ``predict`` with ``footprint``
    (a staged plan's: :func:`plan_staged_chunks`).
    """
    if fill is None:
        takes_tasks, ceiling_budget = _takes_tasks(predict), (budget if _takes(predict, "ceiling") else None)

        def fill(rows):
            _predict_rows(predict, c, rows, confidence, footprint, takes_tasks, ceiling_budget, slots)

    first_key, tie = _first_key(c, slots)
    probe = np.ones(len(c.blocks), dtype=bool)
    for axis, lengths in enumerate(c.axis_chunks):
        sub = np.zeros(len(lengths), dtype=bool)
        sub[np.rint(np.linspace(0, len(lengths) - 1, PROBE_VALUES_PER_AXIS)).astype(np.int64)] = True
        probe &= sub[c.grid[axis]]
    probe_rows = np.flatnonzero(probe)
    fill(probe_rows)
    predicted = len(probe_rows)

    def least_fitting_key(rows, least):
        fits = rows[c.upper_total[rows] <= budget]
        return min(least, float(first_key[fits].min())) if fits.size else least

    least = least_fitting_key(probe_rows, math.inf)
    rest = np.flatnonzero(~probe)
    rest = rest[first_key[rest] <= least * tie]
    rest = rest[np.argsort(first_key[rest], kind="stable")]
    for start in range(0, len(rest), PREDICT_BATCH_ROWS):
        rows = rest[start:start + PREDICT_BATCH_ROWS]
        rows = rows[first_key[rows] <= least * tie]
        if not len(rows):
            break
        fill(rows)
        predicted += len(rows)
        least = least_fitting_key(rows, least)
    return predicted


def rank_candidates(c: Candidates, shape, whole, *, budget: int, slots: int) -> int:
    """The index of the plan among the candidates that fit (module docstring, keys 1-5)."""
    tied, keys = _ranking_keys(c, shape, whole, budget=budget, slots=slots)
    return int(tied[np.lexsort(keys)[0]])


def _ranking_keys(c: Candidates, shape, whole, *, budget: int, slots: int) -> tuple[np.ndarray, list]:
    """``(tied, keys)``: the candidates that fit within the first key's tie, and their later
    keys for ``np.lexsort`` (last key first; :func:`rank_candidates`)."""
    ndim = len(shape)
    fits = c.upper_total <= budget
    first_key, tie = _first_key(c, slots)
    # 1. the first key (fewest tasks; or, with several slots, least predicted seconds within
    #    the tie fraction: the model ranks, it is no stopwatch); the rest order the tied.
    tied = np.flatnonzero(fits & (first_key <= first_key[fits].min() * tie))
    tied_chunks = c.chunks[tied]
    n_chunks = -(-np.asarray(shape) // tied_chunks)
    # 2. evenness: the share of the task grid past the array's end.
    grid_samples = _samples(n_chunks * tied_chunks).astype(np.float64)
    padding_fraction = grid_samples / float(math.prod(shape)) - 1.0
    # 3. compactness: aspect ratio over the non-whole axes.
    free = [i for i in range(ndim) if i not in whole] or list(range(ndim))
    aspect = tied_chunks[:, free].max(axis=1) / tied_chunks[:, free].min(axis=1)
    # 4. fewest tasks, 5. smaller upper footprint, then longer chunks on later axes.
    #    (np.lexsort: last key first.)
    later_axes_longer = [-tied_chunks[:, i] for i in range(ndim)]
    return tied, later_axes_longer + [c.upper_total[tied], c.n_tasks[tied], aspect, padding_fraction]


def plan_chunks(
    shape,
    halo,
    whole_axes,
    predict: Predictor,
    limit_bytes: int,
    *,
    baseline_bytes: int,
    threads_per_worker: int = 1,
    confidence: float = 0.99,
    pause_fraction: float = FALLBACK_PAUSE_FRACTION,
    itemsize: int = INPUT_ITEMSIZE,
    output_itemsize: int = 4,
    min_chunk: int = DEFAULT_MIN_CHUNK,
    operator: str | None = None,
    workers: int = 1,
    seconds_per_voxel: float = DEFAULT_SECONDS_PER_VOXEL,
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
    warnings: tuple[str, ...] = (),
    baseline_source: str = "given",
    block_multiple=None,
    task_clock: TaskClock | None = None,
    run_fixed_seconds: float = 0.0,
    chunks=None,
) -> ChunkPlan:
    """The fastest chunks whose upper worker footprint fits (module docstring):
    :func:`chunk_candidates`, :func:`evaluate_candidates`, :func:`rank_candidates`.

    ``baseline_bytes``: the idle worker's resident memory, measured where the work runs
    (``explorer.recommend``).  ``workers``: the cluster's workers; tasks run
    ``C = workers * threads_per_worker`` at a time.  With one slot the first key is the
    fewest tasks; with several it is :func:`plan_seconds` with ``C`` slots and the given
    ``seconds_per_voxel`` and ``graph_task_seconds``, or, given the workers' learnt
    ``task_clock``, its seconds per voxel and spread at each candidate's block; plans
    within :data:`SECONDS_TIE_FRACTION` of the fastest are tied.  ``predicted_seconds``
    is reported either way.

    ``predict(block_shapes, confidence=confidence) -> (mean, upper)`` gives a task's
    ``peak_bytes`` for ``(m, ndim)`` int64 block shapes.  A candidate fits when
    ``worker_footprint(b, upper).total <= pause_fraction * limit_bytes``.  Raises
    :class:`ChunkPlanError` when none does, saying so when the baseline alone leaves no
    room.  ``warnings`` (one line each) and ``baseline_source`` are carried on the plan.
    ``chunks``: plan only that chunk shape (its bound and time; :class:`ChunkPlanError` when
    its bound does not fit).
    """
    shape, halo, whole, limit_bytes, threads = _checked_plan_arguments(
        shape, halo, whole_axes, limit_bytes, pause_fraction=pause_fraction, confidence=confidence,
        threads_per_worker=threads_per_worker, min_chunk=min_chunk, workers=workers, baseline_bytes=baseline_bytes)
    slots = int(workers) * threads
    budget = math.floor(pause_fraction * limit_bytes)
    footprint = functools.partial(worker_footprint, threads_per_worker=threads, itemsize=itemsize,
                                  output_itemsize=output_itemsize, baseline_bytes=baseline_bytes, windowed=True)
    candidates = chunk_candidates(shape, halo, whole, footprint=footprint, budget=budget, min_chunk=int(min_chunk),
                                  workers=int(workers), slots=slots, seconds_per_voxel=seconds_per_voxel,
                                  graph_task_seconds=graph_task_seconds, block_multiple=block_multiple,
                                  task_clock=task_clock, run_fixed_seconds=run_fixed_seconds, chunks=chunks)
    n_predicted = evaluate_candidates(candidates, predict, confidence=confidence, footprint=footprint,
                                      budget=budget, slots=slots)
    if not (candidates.upper_total <= budget).any():
        takes_tasks = _takes_tasks(predict)
        _complete_smallest(candidates, lambda: candidates.exact, lambda rows: _predict_rows(
            predict, candidates, rows, confidence, footprint, takes_tasks, slots=slots))
        raise ChunkPlanError(_no_fit_message(candidates, shape, operator, threads, confidence, pause_fraction,
                                             limit_bytes, budget, int(baseline_bytes)))
    index = rank_candidates(candidates, shape, whole, budget=budget, slots=slots)
    if _takes(predict, "ceiling"):
        index = _rank_on_own_bounds(candidates, shape, whole, index, predict, confidence, footprint, budget, slots)

    chunk = tuple(int(c) for c in candidates.chunks[index])
    block = tuple(int(b) for b in candidates.blocks[index])
    kept = {"chunk_shapes": chunk, "neighbour_chunks": int(candidates.neighbours[index])}
    bound = footprint(block, float(candidates.upper_peak[index]), **kept)
    mean = footprint(block, float(candidates.mean_peak[index]), **kept)
    return ChunkPlan(
        operator=operator,
        shape=shape,
        chunks=chunk,
        block=block,
        halo=halo,
        whole_axes=whole,
        predicted_bytes=int(mean.total),
        upper_bytes=int(bound.total),
        limit_bytes=limit_bytes,
        pause_fraction=float(pause_fraction),
        confidence=float(confidence),
        n_tasks=int(candidates.n_tasks[index]),
        threads_per_worker=threads,
        footprint=bound,
        n_candidates=n_predicted,
        slots=slots,
        predicted_seconds=float(candidates.seconds[index]),
        seconds_per_voxel=float(seconds_per_voxel if task_clock is None
                                else task_clock.seconds_per_voxel_at([math.prod(block)], [block])[0]),
        block_clocked=task_clock is not None and bool(task_clock.clocked(block)[0]),
        task_spread=None if task_clock is None or task_clock.spread_at(math.prod(block)) is None
        else float(task_clock.spread_at(math.prod(block))),
        task_clock=task_clock,
        neighbour_chunks=int(candidates.neighbours[index]),
        workers=int(workers),
        itemsize=int(itemsize),
        output_itemsize=int(output_itemsize),
        min_chunk=int(min_chunk),
        graph_task_seconds=float(graph_task_seconds),
        run_fixed_seconds=float(run_fixed_seconds),
        warnings=tuple(warnings),
        baseline_source=str(baseline_source),
        block_multiple=None if block_multiple is None else tuple(int(m) for m in block_multiple),
    )


def _rank_on_own_bounds(c: Candidates, shape, whole, index: int, predict: Predictor, confidence, footprint,
                        budget: int, slots: int) -> int:
    """The plan's index once the candidates the ranking's upper footprint (key 5) decides
    among have their own bounds: a predictor given a ceiling may have answered an upper bound
    of a row's upper where it showed the row fits (:data:`Predictor`, ``exact`` False).  Those
    are the rows ranked equal to ``index`` on keys 1-4 (usually it alone, whose footprint the
    plan reports); those not solved are predicted again without a ceiling and ranked again.
    A row's own upper is at most that bound: each still fits, and no row ranked below them on
    keys 1-4 can overtake them."""
    tied, keys = _ranking_keys(c, shape, whole, budget=budget, slots=slots)
    at = int(np.flatnonzero(tied == index)[0])
    same = np.ones(len(tied), dtype=bool)
    for key in keys[-3:]:  # n_tasks, aspect, padding: the keys before the upper footprint
        same &= key == key[at]
    rows = tied[same & ~c.exact[tied]]
    if not len(rows):
        return index
    _predict_rows(predict, c, rows, confidence, footprint, _takes_tasks(predict), slots=slots)
    return rank_candidates(c, shape, whole, budget=budget, slots=slots)


def _checked_plan_arguments(shape, halo, whole_axes, limit_bytes, *, pause_fraction, confidence, threads_per_worker,
                            min_chunk, workers, baseline_bytes):
    """``(shape, halo, whole, limit_bytes, threads)`` as ints, or ``ValueError`` naming the bad one."""
    shape = tuple(int(n) for n in shape)
    ndim = len(shape)
    halo = tuple(int(h) for h in halo)
    whole = tuple(sorted({int(a) % ndim for a in whole_axes}))
    if len(halo) != ndim:
        raise ValueError(f"halo {halo} has {len(halo)} axes; shape {format_shape(shape)} has {ndim}")
    if any(n <= 0 for n in shape) or any(h < 0 for h in halo):
        raise ValueError(f"shape {format_shape(shape)} and halo {halo} must be positive and non-negative")
    limit_bytes = int(limit_bytes)
    if limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {limit_bytes}")
    if not 0.0 < pause_fraction <= 1.0:
        raise ValueError(f"pause_fraction must be in (0, 1], got {pause_fraction}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    threads = int(threads_per_worker)
    if threads < 1:
        raise ValueError(f"threads_per_worker must be >= 1, got {threads_per_worker}")
    if int(min_chunk) < 1:
        raise ValueError(f"min_chunk must be >= 1, got {min_chunk}")
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if int(baseline_bytes) < 0:
        raise ValueError(f"baseline_bytes must be non-negative, got {baseline_bytes}")
    return shape, halo, whole, limit_bytes, threads


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


def _predict_rows(predict, c: Candidates, rows, confidence, footprint, takes_tasks: bool,
                  ceiling_budget: int | None = None, slots: int | None = None) -> None:
    """Fill ``mean_peak``, ``upper_peak`` (>= mean), ``upper_total`` and ``exact`` of ``c`` at
    ``rows`` (:func:`_predict_blocks`); a non-finite prediction leaves the total at int64 max
    (never fits).  With ``ceiling_budget`` (the predictor takes ``ceiling``), each row's
    ceiling is the largest task peak ``P`` whose footprint fits it: the footprint is
    ``F(0) + T ceil(P)`` (:func:`worker_footprint`), so it fits iff ``P <= floor((budget -
    F(0)) / T)``; a row the predictor bounds above its ceiling gets the footprint of that
    lower bound (above the budget) and stays inexact."""
    blocks, kept = c.blocks[rows], {"chunk_shapes": c.chunks[rows], "neighbour_chunks": c.neighbours[rows]}
    ceiling = None
    if ceiling_budget is not None:
        empty = footprint(blocks, 0.0, **kept)
        ceiling = ((int(ceiling_budget) - empty.total) // empty.threads_per_worker).astype(np.float64)
    mean, upper, exact = _predict_blocks(predict, blocks, c.n_tasks[rows], confidence, takes_tasks, ceiling, slots)
    finite = np.isfinite(upper)
    total = footprint(blocks, np.where(finite, upper, 0.0), **kept).total
    c.mean_peak[rows], c.upper_peak[rows] = mean, upper
    c.upper_total[rows] = np.where(finite, total, np.iinfo(np.int64).max)
    c.exact[rows] = exact


def _predict_blocks(predict, blocks, n_tasks, confidence, takes_tasks: bool,
                    ceiling=None, slots: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, upper, exact)`` task peaks at ``blocks`` (``upper >= mean``, NaN as inf),
    predicted in slices of ``PREDICT_BATCH_ROWS``; a predictor taking ``tasks``
    (``takes_tasks``) gets each row's count from ``n_tasks``, and given ``ceiling`` (``(m,)``)
    it gets each row's; given ``slots`` a predictor taking ``cold`` gets ``min(tasks, slots)``.
    ``exact`` is False where the predictor stopped short of a row (:data:`Predictor`): ``mean``
    inf and ``upper`` its bound there (a lower bound above the ceiling, or an upper bound at or
    below it)."""
    means, uppers, exacts = [], [], []
    takes_cold = takes_tasks and slots is not None and _takes(predict, "cold")
    for start in range(0, len(blocks), PREDICT_BATCH_ROWS):
        part = slice(start, start + PREDICT_BATCH_ROWS)
        m = len(blocks[part])
        keywords = {"tasks": n_tasks[part]} if takes_tasks else {}
        if takes_cold:
            keywords["cold"] = np.minimum(n_tasks[part], int(slots))
        if ceiling is not None:
            keywords["ceiling"] = ceiling[part]
        raw_mean, upper = predict(blocks[part], confidence=confidence, **keywords)
        mean = _checked_prediction(raw_mean, m, "mean")
        upper = _checked_prediction(upper, m, "upper")
        bounded = np.zeros(m, dtype=bool) if ceiling is None else np.isnan(np.asarray(raw_mean, dtype=np.float64))
        means.append(mean)
        uppers.append(np.where(bounded, upper, np.maximum(upper, mean)))
        exacts.append(~bounded)
    if not means:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool)
    return np.concatenate(means), np.concatenate(uppers), np.concatenate(exacts)


def _complete_smallest(c: Candidates, exact, complete) -> None:
    """Make the smallest ``upper_total`` an exact one, as an exhaustive evaluation gives it
    (what the no-fit message names), when some totals are lower bounds: while the smallest
    is not ``exact()``, ``complete(rows)`` (predict exactly) the inexact rows at or below the
    smallest exact total, smallest first, a batch at a time.  A lower bound above an exact
    total cannot be the smallest once completed; every row is completed at most once."""
    completed = np.zeros(len(c.upper_total), dtype=bool)
    while True:
        done = exact() | completed
        if done[int(np.argmin(c.upper_total))]:
            return
        least_exact = c.upper_total[done].min(initial=np.iinfo(np.int64).max)
        below = np.flatnonzero(~done & (c.upper_total <= least_exact))
        rows = below[np.argsort(c.upper_total[below], kind="stable")[:PREDICT_BATCH_ROWS // 4]]
        complete(rows)
        completed[rows] = True


def _checked_prediction(values, m: int, what: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (m,):
        raise ValueError(f"predict returned {what} of shape {values.shape}; expected ({m},)")
    return np.where(np.isnan(values), np.inf, values)


# --------------------------------------------------------------------------- staged plans


@dataclass(frozen=True)
class PlanStage:
    """One ``map_overlap`` of a staged pipeline: a stage, or one branch of a fan-out stage.

    ``predict``: the member's task :data:`Predictor`.  ``group``: the stage's index; a
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
    itemsize: int = INPUT_ITEMSIZE
    output_itemsize: int = 4
    seconds_per_voxel: float = DEFAULT_SECONDS_PER_VOXEL - RUN_IO_SECONDS_PER_VOXEL
    task_clock: TaskClock | None = None

    @property
    def windowed(self) -> bool:
        """The stage's tasks read their blocks from the file (``operators.windowed_map``): the
        first stage's (group 0); a later stage's ``map_overlap`` gathers them from the previous
        stage's chunks."""
        return reads_file(self.group)


def reads_file(group: int) -> bool:
    """Whether pipeline stage ``group`` (its index) reads its blocks from the file in windows
    (``operators.windowed_map``): the first does; a later one ``map_overlap`` s the previous
    stage's output (``operators.pipeline.Pipeline.dask``)."""
    return group == 0


def exchanged_halo(halo, group: int) -> tuple[int, ...]:
    """The halo a pipeline stage's Dask form exchanges between chunks, ``group`` its index: none
    for the first stage (group 0), whose blocks are windowed reads of the file
    (``operators.windowed_map``); a later stage's own, which its ``map_overlap`` slices from the
    intermediate's chunks."""
    return (0,) * len(halo) if reads_file(group) else tuple(int(h) for h in halo)


def plan_staged_chunks(
    shape,
    whole_axes,
    stages: list[PlanStage],
    limit_bytes: int,
    *,
    baseline_bytes: int,
    threads_per_worker: int = 1,
    confidence: float = 0.99,
    pause_fraction: float = FALLBACK_PAUSE_FRACTION,
    min_chunk: int = DEFAULT_MIN_CHUNK,
    operator: str | None = None,
    workers: int = 1,
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
    io_seconds_per_voxel: float = RUN_IO_SECONDS_PER_VOXEL,
    warnings: tuple[str, ...] = (),
    baseline_source: str = "given",
    block_multiple=None,
    run_fixed_seconds: float = 0.0,
    chunks=None,
) -> ChunkPlan:
    """The fastest chunks for a pipeline run *staged* (one ``map_overlap`` per stage, every
    intermediate chunked like the input) whose upper worker footprint fits.

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
    halos = np.asarray([s.halo for s in stages], dtype=np.int64)
    halo_max = tuple(int(h) for h in halos.max(axis=0))
    shape, halo_max, whole, limit_bytes, threads = _checked_plan_arguments(
        shape, halo_max, whole_axes, limit_bytes, pause_fraction=pause_fraction, confidence=confidence,
        threads_per_worker=threads_per_worker, min_chunk=min_chunk, workers=workers, baseline_bytes=baseline_bytes)
    workers, baseline_bytes = int(workers), int(baseline_bytes)
    slots = workers * threads
    budget = math.floor(pause_fraction * limit_bytes)
    nothing = functools.partial(worker_footprint, threads_per_worker=threads, baseline_bytes=0)
    c = chunk_candidates(shape, halo_max, whole, footprint=nothing, budget=np.iinfo(np.int64).max,
                         min_chunk=int(min_chunk), workers=workers, slots=slots,
                         seconds_per_voxel=DEFAULT_SECONDS_PER_VOXEL, graph_task_seconds=graph_task_seconds,
                         block_multiple=block_multiple, chunks=chunks)
    m = len(c.chunks)
    counts = -(-np.asarray(shape) // c.chunks)
    chunk_samples = _samples(c.chunks)
    # What needs no prediction first, for every row: each stage's blocks, the time model, the
    # held intermediates.  Then predictions only where evaluate_candidates' probe pass asks.
    blocks, c.seconds = _staged_seconds(shape, stages, c.axis_chunks, c.grid, chunk_samples, c.n_tasks,
                                        workers=workers, slots=slots, graph_task_seconds=graph_task_seconds,
                                        io_seconds_per_voxel=io_seconds_per_voxel,
                                        run_fixed_seconds=run_fixed_seconds)
    held_chunks = np.zeros(m, dtype=np.int64)
    held_bytes = np.zeros(m, dtype=np.int64)
    for group in sorted({s.group for s in stages}):
        members = [s for s in stages if s.group == group]
        exchanged = np.max([exchanged_halo(s.halo, s.group) for s in members], axis=0)
        kept = neighbour_chunks_held(counts, exchanged, workers)
        held_chunks += kept
        held_bytes += kept * chunk_samples * int(members[0].itemsize)
    # Every stage's map_overlap keeps its own gathered inputs and finished outputs, whichever runs.
    idle = [worker_footprint(b, 0, threads_per_worker=threads, baseline_bytes=0, itemsize=s.itemsize,
                             output_itemsize=s.output_itemsize, windowed=s.windowed) for s, b in zip(stages, blocks)]
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
                                             _takes_tasks(stage.predict), slots=slots)
            predicted[0] += len(alive)
            terms = functools.partial(worker_footprint, b, threads_per_worker=threads, baseline_bytes=0,
                                      itemsize=stage.itemsize, output_itemsize=stage.output_itemsize,
                                      windowed=stage.windowed)
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
    index = rank_candidates(c, shape, whole, budget=budget, slots=slots)
    j = int(np.argmax(running_upper[index]))
    chunk = tuple(int(x) for x in c.chunks[index])
    stage_j = stages[j]
    running_mean = [worker_footprint(tuple(blocks[i][index]), float(means[index, i]), threads_per_worker=threads,
                                     baseline_bytes=0, itemsize=s.itemsize, output_itemsize=s.output_itemsize,
                                     windowed=s.windowed).task_bytes
                    for i, s in enumerate(stages)]
    bound = worker_footprint(tuple(blocks[j][index]), float(uppers[index, j]), threads_per_worker=threads,
                             baseline_bytes=baseline_bytes, itemsize=stage_j.itemsize,
                             output_itemsize=stage_j.output_itemsize, windowed=stage_j.windowed)
    bound = dataclasses.replace(bound, waiting_input_bytes=int(waiting[index]), held_output_bytes=int(finished[index]),
                                neighbour_chunk_bytes=int(held_bytes[index]))
    table = tuple({"operator": s.name, "halo": list(s.halo), "block": [int(x) for x in blocks[i][index]],
                   "mean_peak_bytes": float(means[index, i]), "upper_peak_bytes": float(uppers[index, i]),
                   "running_upper_bytes": int(running_upper[index, i]), "binding": i == j,
                   "block_clocked": s.task_clock is not None and bool(s.task_clock.clocked(blocks[i][index])[0])}
                  for i, s in enumerate(stages))
    return ChunkPlan(
        operator=operator, shape=shape, chunks=chunk, block=tuple(int(x) for x in blocks[j][index]), halo=halo_max,
        whole_axes=whole, predicted_bytes=int(baseline_bytes + max(running_mean) + resident[index]),
        upper_bytes=int(c.upper_total[index]), limit_bytes=limit_bytes, pause_fraction=float(pause_fraction),
        confidence=float(confidence), n_tasks=int(c.n_tasks[index]), threads_per_worker=threads, footprint=bound,
        n_candidates=predicted[0], slots=slots, predicted_seconds=float(c.seconds[index]),
        seconds_per_voxel=None, block_clocked=all(t["block_clocked"] for t in table),
        neighbour_chunks=int(held_chunks[index]), workers=workers,
        itemsize=int(stages[0].itemsize), output_itemsize=int(stages[-1].output_itemsize), min_chunk=int(min_chunk),
        graph_task_seconds=float(graph_task_seconds), run_fixed_seconds=float(run_fixed_seconds),
        warnings=tuple(warnings), baseline_source=str(baseline_source),
        block_multiple=None if block_multiple is None else tuple(int(m) for m in block_multiple),
        strategy="staged", stages=table)


# --------------------------------------------------------------------------- re-planning

#: A running computation whose task exceeded its bound is restarted with a new plan only
#: while at most this share of its tasks is done: later, finishing costs less than
#: starting again (finished blocks cannot be kept: two plans' tasks would write into the
#: same zarr chunks).
REPLAN_MAX_DONE_FRACTION = 0.5


def plan_fits(plan: ChunkPlan, predict: Predictor) -> bool:
    """Whether ``plan``'s upper worker footprint still fits its budget under ``predict``."""
    tasks = {"tasks": np.asarray([plan.n_tasks])} if _takes_tasks(predict) else {}
    if tasks and _takes(predict, "cold"):
        tasks["cold"] = np.asarray([min(plan.n_tasks, plan.slots)])
    _mean, upper = predict(np.asarray([plan.block], dtype=np.int64), confidence=plan.confidence, **tasks)
    total = worker_footprint(plan.block, float(np.asarray(upper)[0]), threads_per_worker=plan.threads_per_worker,
                             itemsize=plan.itemsize, output_itemsize=plan.output_itemsize,
                             baseline_bytes=plan.footprint.baseline_bytes, chunk_shapes=plan.chunks,
                             neighbour_chunks=plan.neighbour_chunks, windowed=plan.strategy != "staged").total
    return total <= plan.budget_bytes


def replan(plan: ChunkPlan, predict: Predictor, *, done_fraction: float) -> ChunkPlan | None:
    """The plan to restart a running computation with after a task exceeded its bound, or
    None to carry on.

    None for a staged plan (its tasks are its members', not one predictor's), when more
    than :data:`REPLAN_MAX_DONE_FRACTION` of the tasks are done, when
    ``plan`` still fits its budget under the updated ``predict`` (:func:`plan_fits`), or
    when planning again (:func:`plan_chunks` with the plan's own parameters) gives the
    same chunks.  :class:`ChunkPlanError` when nothing fits any more.
    """
    if plan.strategy != "fused" or done_fraction > REPLAN_MAX_DONE_FRACTION or plan_fits(plan, predict):
        return None
    new = plan_chunks(plan.shape, plan.halo, plan.whole_axes, predict, plan.limit_bytes,
                      baseline_bytes=plan.footprint.baseline_bytes, threads_per_worker=plan.threads_per_worker,
                      confidence=plan.confidence, pause_fraction=plan.pause_fraction, itemsize=plan.itemsize,
                      output_itemsize=plan.output_itemsize, min_chunk=plan.min_chunk, operator=plan.operator,
                      workers=plan.workers, seconds_per_voxel=plan.seconds_per_voxel or DEFAULT_SECONDS_PER_VOXEL,
                      graph_task_seconds=plan.graph_task_seconds, warnings=plan.warnings,
                      baseline_source=plan.baseline_source, block_multiple=plan.block_multiple,
                      task_clock=plan.task_clock, run_fixed_seconds=plan.run_fixed_seconds)
    return None if new.chunks == plan.chunks else new


# --------------------------------------------------------------------------- the edge


@functools.lru_cache(maxsize=None)
def _distributed_memory_defaults() -> dict:
    """``distributed.worker.memory`` from distributed's packaged YAML, without importing it.

    ``import distributed.config`` imports the whole package (0.3-0.5 s measured);
    parsing its ``distributed.yaml`` takes about 3 ms and is cached.
    """
    import importlib.util
    import os

    import yaml

    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(list(spec.submodule_search_locations)[0], "distributed.yaml")
    try:
        with open(path) as f:
            loaded = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError:
        return {}
    return ((loaded or {}).get("distributed", {}).get("worker", {}).get("memory", {})) or {}


def _memory_setting(name: str):
    import dask.config

    value = dask.config.get(f"distributed.worker.memory.{name}", None)
    return _distributed_memory_defaults().get(name) if value is None else value


def worker_pause_fraction() -> float:
    """The fraction of its memory limit at which a Dask worker stops running tasks.

    ``distributed.worker.memory.pause`` from Dask's config (user files, ``DASK_*``
    variables, ``dask.config.set``), else distributed's packaged default (0.8), read
    without importing distributed.  If pausing is disabled (``False``), the terminate
    fraction (0.95 by default) is the ceiling; if that is disabled too, 1.0.
    """
    for name in ("pause", "terminate"):
        value = _memory_setting(name)
        if value is None:
            return FALLBACK_PAUSE_FRACTION
        if value is not False:
            return float(value)
    return 1.0
