"""What a task costs inside a Dask worker in time, from the observations' clocks.

Time
----
From the same observations' clocks (``explorer.runner.live`` reports each operator task's
seconds, the seconds inside ``operator.run``, and the seconds of the worker's other
tasks, reads and overlap slices, since its previous report), least-squares lines in the
block's voxel count ``V`` (a task has fixed costs, opening the input, Python and the
scheduler's bookkeeping, that a ratio of sums would charge per voxel: on small blocks
they dominate)::

    run_seconds                            ~ a_op + operator_seconds_per_voxel * V
    task_seconds - run_seconds + other     ~ a_io + io_seconds_per_voxel * V

(the ratio of sums when the blocks have a single volume, or a line comes out with a
negative slope or intercept): what a task costs per voxel at the margin, shown to users.

The planner's time model takes a task's whole cost at each block volume instead
(:func:`fit_clock`, an ``explorer.plan.time_model.TaskClock``): per observed volume ``V`` the
tasks' total ``task_seconds + other`` over their total voxels (the other tasks' seconds go
to whichever operator task reports next: only their sum is the tasks' cost), so a task's
fixed costs stay with the small blocks that pay them and a large block that runs slower per
voxel (caches, fresh pages) is charged what it costs; and per volume the median coefficient
of variation ``sigma`` of the tasks' own ``task_seconds`` in groups of >= 3 equal tasks (one
run, one shape), the spread list scheduling of near-equal tasks pays in its last wave
(``explorer.plan.time_model.schedule_waves``).  From the runs' wall times ``W`` (``source="run"``
records) the same time model is solved for a run's fixed seconds ``F`` and the overhead per
graph task ``g``, at each run's mean task volume ``V`` (:func:`fit_run_overheads`)::

    W - waves(n, C, sigma(V)) s(V) V = F + g * waves(n, C, sigma(V)) * tasks_per_chunk

by least squares (``F, g >= 0``) once the runs' graph tasks per slot differ enough to tell
the two apart (the probes make sure they do), else ``F = 0``.  These
replace ``explorer.plan.chunk_plan``'s defaults once a probe or a production run has taught them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from explorer.plan.grid import read_extent
from explorer.plan.time_model import TaskClock
from explorer.plan.excess import IN_WORKER_SOURCES, RUN_SOURCE

__all__ = [
    "TimingFit",
    "fit_clock",
    "fit_run_overheads",
    "fit_timing",
    "task_read_voxels",
    "valley_fit",
]


# --------------------------------------------------------------------------- time


@dataclass(frozen=True)
class TimingFit:
    """Seconds a Dask run spends, learnt from the workers' clocks (module docstring)."""

    operator_seconds_per_voxel: float | None
    io_seconds_per_voxel: float | None
    graph_task_seconds: float | None
    n_tasks: int
    n_runs: int
    #: The planner's time per task at each observed block volume, and equal tasks' spread.
    clock: TaskClock | None = None
    #: A run's fixed seconds apart from its tasks and their graph overhead (:func:`fit_run_overheads`).
    run_fixed_seconds: float | None = None

    @property
    def seconds_per_voxel(self) -> float | None:
        """``operator + io``: the planner's seconds per block voxel, or None when not learnt."""
        if self.operator_seconds_per_voxel is None or self.io_seconds_per_voxel is None:
            return None
        return self.operator_seconds_per_voxel + self.io_seconds_per_voxel


def _slope_through(volume: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """``(slope, intercept)`` of ``seconds ~ intercept + slope * volume`` by least squares,
    or the ratio of sums and 0 when the volumes do not identify a slope (fewer than two
    distinct volumes, or a slope that comes out negative)."""
    ratio = float(seconds.sum() / volume.sum())
    if len(np.unique(volume)) < 2:
        return ratio, 0.0
    slope, intercept = np.polyfit(volume, seconds, 1)
    if slope <= 0 or intercept < 0:
        return ratio, 0.0
    return float(slope), float(intercept)


def task_read_voxels(block, unit, volume_shape) -> float | None:
    """The voxels a task's windowed read of ``block`` touched, on an input of ``volume_shape``
    stored in ``unit`` s (``explorer.plan.grid.read_extent`` per axis: exact for a SEG-Y's traces,
    the mean over positions for a Zarr array's chunks); None when the record lacks either."""
    if not unit or not volume_shape or len(unit) != len(block) or len(volume_shape) != len(block):
        return None
    return float(np.prod(read_extent(np.asarray(block), np.asarray(unit), np.asarray(volume_shape))))


def _non_decreasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit (pool adjacent violators: a block whose
    value exceeds its successor's is merged with it into their weighted mean)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for y, w in zip(values.tolist(), weights.tolist()):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.repeat([b[0] for b in blocks], [b[2] for b in blocks]).astype(np.float64)


def valley_fit(values, weights) -> np.ndarray:
    """The weighted least-squares fit of ``values`` (ordered by block volume) that first falls,
    then rises::

        min_f sum_k w_k (y_k - f_k)^2,   f_0 >= ... >= f_{m-1},  f_m <= ... <= f_{K-1},  over m

    each side by pooling adjacent violators (every split ``m`` tried: ``K`` is a few volumes).
    A task's seconds per voxel is its fixed costs over its voxels, which fall with the volume,
    plus what a voxel costs in caches and fresh pages, which does not fall as blocks grow: a
    valley.  A volume measured above both neighbours is noise the shape cannot hold, and is
    pooled with whichever neighbour costs the fit less (``w``: inverse variances,
    :func:`_inverse_variances`; the less certain one, other things equal).  Probe
    tasks at large blocks vary by tens of percent from run to run (first_derivative's 180^3
    probe measured 39.8 ns per voxel between 28.4 at 108^3 and 25.7 at 300^3; its tasks of one
    run ranged 25-53 ns); interpolated as measured, such a bump made the planner take two tasks
    of 160x320x320 over four of half their size, 1.09x slower measured."""
    y = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    best, fit = math.inf, y
    for m in range(len(y) + 1):
        f = np.concatenate([-_non_decreasing(-y[:m], w[:m]), _non_decreasing(y[m:], w[m:])])
        sse = float(w @ (y - f) ** 2)
        if sse < best:
            best, fit = sse, f
    return fit


def _typical(cold_and_warm, other) -> float:
    """A volume's or a shape's seconds per voxel: the median of its warm tasks' own (of its cold
    ones without any), plus the mean of the other tasks' seconds they carried (:func:`fit_clock`)."""
    cold, warm = cold_and_warm
    return float(np.median(warm if warm else cold)) + float(np.mean(other))


def _inverse_variances(measured: np.ndarray, cold_and_warm, spreads) -> np.ndarray:
    """Per volume, ``n / (sigma s)^2``: the weight of its figure ``s`` in :func:`valley_fit`, from
    the ``n`` tasks it was taken over (the warm ones, else the cold) and their coefficient of
    variation ``sigma`` (``spreads``: the clock's, the median over its groups of three or more, or
    None; a volume without one takes the median of the others', all alike without any)."""
    known = [s for s in spreads if s is not None]
    fallback = float(np.median(known)) if known else 1.0
    sigma = np.array([fallback if s is None else s for s in spreads])
    positive = sigma[sigma > 0]
    sigma = np.maximum(sigma, positive.min() if positive.size else 1.0)  # equal tasks: the least spread measured
    counts = np.array([len(warm) or len(cold) for cold, warm in cold_and_warm], dtype=np.float64)
    return counts / np.maximum(sigma * measured, np.finfo(float).tiny) ** 2


def fit_clock(rows) -> TaskClock | None:
    """The :class:`~explorer.plan.time_model.TaskClock` of in-worker tasks ``(run, shape, seconds,
    own_seconds[, worker[, peak_bytes[, read_seconds, read_voxels]]])`` in the order the workers
    reported them (module docstring): ``seconds`` what the worker spent for the task (its own
    seconds and the other tasks' since its previous report), ``own_seconds`` the task's own,
    ``peak_bytes`` its task peak (per volume, the median per voxel is the clock's
    ``task_bytes_per_voxel``: the pages a worker's first task of a run touches afresh, which these
    seconds leave out), ``read_seconds`` the seconds before its ``run`` and ``read_voxels`` the
    voxels its read touched (:func:`task_read_voxels`; the clock's reads: :func:`_read_terms`).

    A worker's first task of a run is slower than its later ones: it faults in the fresh
    pages its arrays need, which the later ones find in the process's heap (gst3d's 150^3
    probes: 0.72 and 0.80 s first on each worker, 0.42-0.47 s after).  A run of many waves
    is made of the later ones, so per volume (and shape) the figure is the median of the
    tasks that were not their worker's first in their run, where there are any (rows
    without a worker all count as such).

    Across volumes the figures are fitted as a valley (:func:`valley_fit`); a shape's own figure is
    its tasks' as measured.

    Per block volume the seconds per voxel are the tasks' total over their voxels: the other
    tasks' seconds (reads, overlap slices) go to whichever operator task reports next, often
    the first of a run on each worker, so only their sum means anything (a median per task
    left most of the reading out: gaussian(sigma=1),semblance,gaussian's 195^3 probes, 0.50 s
    against a mean of 0.65 s).  The same figure per exact block shape makes the clock's
    shape table (:class:`~explorer.plan.time_model.TaskClock`).  The spread is, per volume, the median over groups of three or
    more equal tasks (one run, one shape) of the coefficient of variation of the tasks' *own*
    seconds, for the same reason (with the reads attributed, 0.42-0.84; without, 0.06-0.45)."""
    own_by_volume: dict[int, tuple[list, list]] = {}
    other_by_volume: dict[int, list[float]] = {}
    own_by_shape: dict[tuple, tuple[list, list]] = {}
    other_by_shape: dict[tuple, list[float]] = {}
    groups: dict[tuple, list[float]] = {}
    peaks_by_volume: dict[int, list[float]] = {}
    reads: list[tuple] = []
    started: set = set()
    for row in rows:
        run, shape, seconds, own = row[:4]
        worker = row[4] if len(row) > 4 else None
        peak = row[5] if len(row) > 5 else None
        read_seconds, read_voxels = row[6:8] if len(row) > 7 else (None, None)
        shape = tuple(int(n) for n in shape)
        volume = math.prod(shape)
        warm = worker is None or (run, worker) in started
        started.add((run, worker))
        if read_seconds is not None and read_voxels:
            reads.append((shape, warm, float(read_seconds), float(read_voxels)))
        own_by_volume.setdefault(volume, ([], []))[warm].append(own / volume)
        other_by_volume.setdefault(volume, []).append((seconds - own) / volume)
        own_by_shape.setdefault(shape, ([], []))[warm].append(own / volume)
        other_by_shape.setdefault(shape, []).append((seconds - own) / volume)
        groups.setdefault((run, shape), []).append(own)
        if peak is not None and peak > 0:
            peaks_by_volume.setdefault(volume, []).append(float(peak) / volume)
    if not own_by_volume:
        return None
    spread_by_volume: dict[int, list[float]] = {}
    for (_run, shape), seconds in groups.items():
        s = np.asarray(seconds)
        if len(s) >= 3 and s.mean() > 0:
            spread_by_volume.setdefault(math.prod(shape), []).append(float(s.std(ddof=1) / s.mean()))
    volumes = sorted(own_by_volume)
    spread_volumes = sorted(spread_by_volume)
    spread = {v: float(np.median(spread_by_volume[v])) for v in spread_volumes}
    shapes = sorted(own_by_shape)
    task_bytes = ()
    if peaks_by_volume:  # every volume its own median, the volumes without a peak interpolated
        known = sorted(peaks_by_volume)
        task_bytes = tuple(float(x) for x in np.interp(np.log(volumes), np.log(known),
                                                       [float(np.median(peaks_by_volume[v])) for v in known]))
    measured = np.array([_typical(own_by_volume[v], other_by_volume[v]) for v in volumes])
    per_volume = valley_fit(measured, _inverse_variances(measured, [own_by_volume[v] for v in volumes],
                                                         [spread.get(v) for v in volumes]))
    return TaskClock(volumes=tuple(float(v) for v in volumes),
                     seconds_per_voxel=tuple(float(x) for x in per_volume),
                     spread_volumes=tuple(float(v) for v in spread_volumes),
                     spreads=tuple(spread[v] for v in spread_volumes),
                     shapes=tuple(shapes),
                     shape_seconds_per_voxel=tuple(_typical(own_by_shape[b], other_by_shape[b]) for b in shapes),
                     task_bytes_per_voxel=task_bytes, **_read_terms(reads, volumes, shapes))


def _read_terms(reads, volumes, shapes) -> dict:
    """The clock's read terms from tasks ``(shape, warm, read_seconds, read_voxels)``, or none
    without a read timed by a task that was not its worker's first in its run.

    ``r`` is the slope of ``read_seconds`` over ``read_voxels`` of those tasks
    (:func:`_slope_through`: a task's fixed read cost, opening the file, is its intercept, which
    every task pays alike; a first task's reads also fault in fresh pages), and ``rho`` per volume
    and per shape the median ``read_voxels / V`` of all the tasks there (volumes without any
    interpolated in ``log V``)."""
    timed = [(voxels, seconds) for _shape, warm, seconds, voxels in reads if warm]
    if not timed:
        return {}
    rate, _ = _slope_through(*(np.asarray(col) for col in zip(*timed)))
    read_by_volume: dict[int, list[float]] = {}
    read_by_shape: dict[tuple, list[float]] = {}
    for shape, _warm, _seconds, voxels in reads:
        read_by_volume.setdefault(math.prod(shape), []).append(voxels / math.prod(shape))
        read_by_shape.setdefault(shape, []).append(voxels / math.prod(shape))
    known = sorted(read_by_volume)
    rho = np.interp(np.log(volumes), np.log(known), [float(np.median(read_by_volume[v])) for v in known])
    curve = dict(zip(volumes, rho))
    return dict(read_seconds_per_voxel=float(rate), read_voxels_per_voxel=tuple(float(x) for x in rho),
                shape_read_voxels_per_voxel=tuple(float(np.median(read_by_shape[b])) if b in read_by_shape
                                                  else float(curve[math.prod(b)]) for b in shapes))


def fit_timing(records, environment: str | None = None) -> TimingFit:
    """Operator and I/O seconds per voxel from in-worker task clocks, the planner's
    :class:`~explorer.plan.time_model.TaskClock` from the same clocks, and the overhead per graph
    task from the runs' wall times (module docstring).

    Only tasks of one-thread workers are timed: the clock is a task's seconds alone in its
    worker, as the probes run them, and ``T`` tasks sharing a worker's cores each take longer
    (on 2x4 threads here, trials of gst3d's blocks timed that way drove the planner from every
    shape it had timed to 140 chunks of 37x52x64, twice as slow)."""
    from explorer.plan.time_model import schedule_waves

    rows, runs, clocked = [], [], []
    for r in records:
        if (r.source not in IN_WORKER_SOURCES or r.status != "ok"
                or (environment is not None and r.context.get("environment") != environment)
                or int(r.context.get("threads_per_worker") or 1) > 1):
            continue
        c = r.context
        task, inside = c.get("task_seconds"), c.get("run_seconds")
        if task is None or inside is None:
            continue
        other = float(c.get("other_seconds") or 0.0)
        rows.append((float(math.prod(r.shape)), float(inside), max(0.0, float(task) - float(inside)) + other))
        runs.append(str(c.get("run", "")))
        own = max(float(task), float(inside))
        clocked.append((runs[-1], tuple(r.shape), own + other, own, c.get("worker"), r.peak_bytes,
                        c.get("read_seconds"), task_read_voxels(r.shape, c.get("read_unit"), c.get("volume_shape"))))
    if not rows:
        return TimingFit(None, None, None, 0, 0)
    volume, inside, around = (np.asarray(col) for col in zip(*rows))
    operator_slope, _ = _slope_through(volume, inside)
    io_slope, _ = _slope_through(volume, around)
    clock = fit_clock(clocked)
    per_run_volume: dict[str, list[float]] = {}
    for run, v in zip(runs, volume):
        per_run_volume.setdefault(run, []).append(float(v))
    walls = []
    for r in records:
        if r.source != RUN_SOURCE or r.status != "ok":
            continue
        c = r.context
        volumes = per_run_volume.get(str(c.get("run", "")))
        needed = ("seconds", "n_tasks", "slots", "tasks_per_chunk")
        if not volumes or any(c.get(k) is None for k in needed):
            continue
        mean_volume = float(np.mean(volumes))
        waves = float(schedule_waves(c["n_tasks"], c["slots"], clock.spread_at(mean_volume)))
        walls.append((float(c["seconds"]), waves * float(c["tasks_per_chunk"]),
                      waves * float(clock.seconds_per_voxel_at(mean_volume)) * mean_volume))
    fixed, per_graph_task = fit_run_overheads(walls)
    return TimingFit(
        operator_seconds_per_voxel=operator_slope,
        io_seconds_per_voxel=io_slope,
        graph_task_seconds=per_graph_task,
        n_tasks=len(rows),
        n_runs=len(walls),
        clock=clock,
        run_fixed_seconds=fixed,
    )


#: Runs identify a fixed cost apart from the overhead per graph task only when their graph
#: tasks per slot (``waves x tasks_per_chunk``) differ by at least this factor.
RUN_OVERHEAD_SPREAD = 1.5


def fit_run_overheads(walls) -> tuple[float | None, float | None]:
    """``(F, g)``: a run's fixed seconds and the seconds per graph task, from runs' wall times
    ``(W, x, c)`` with ``x = waves * tasks_per_chunk`` (graph tasks on the busiest slot) and
    ``c = waves * s(V) V`` (its tasks' work, from the clock)::

        W - c = F + g x

    by least squares with ``F, g >= 0`` when the runs' ``x`` differ by
    :data:`RUN_OVERHEAD_SPREAD` or more (the probes run their smallest block on a finer grid
    for this: ``explorer.runner.probes``).  Otherwise ``F`` is not identified apart from ``g``: ``F =
    0`` and ``g`` the median of ``(W - c) / x``, which charges a run's fixed seconds (submitting
    the graph, gathering the result, starting and stopping the observation) to its graph tasks:
    a plan with more waves is then charged them again.  ``(None, None)`` without a run."""
    if not walls:
        return None, None
    wall, x, work = (np.asarray(col, dtype=np.float64) for col in zip(*walls))
    y = wall - work
    if len(x) < 2 or x.max() < RUN_OVERHEAD_SPREAD * x.min():
        return 0.0, float(np.median(np.maximum(0.0, y / x)))
    g, fixed = np.polyfit(x, y, 1)
    if g < 0:
        return float(max(0.0, np.median(y))), 0.0
    if fixed < 0:
        return 0.0, float(max(0.0, (x * y).sum() / (x * x).sum()))
    return float(fixed), float(g)
