"""The time model: a plan's predicted seconds (graph tasks, waves of list scheduling, a
chunk's seconds at its block's volume, the fresh pages of each slot's first task:
:class:`FirstTouch`) and the workers' learnt clock (:class:`TaskClock`).  Used to rank chunk
shapes, never a promise.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np

from explorer.plan.grid import _samples, axis_blocks, exchanged_halo, mean_read_extent, reads_file, row_product

__all__ = [
    "plan_seconds",
    "makespan_seconds",
    "FirstTouch",
    "schedule_waves",
    "expected_max_normal",
    "TaskClock",
    "composed_clock",
    "chunk_grid",
    "fused_seconds",
    "staged_seconds",
    "run_seconds_per_voxel",
    "graph_tasks_per_chunk",
]


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
#: operator's profiled ``b`` (``explorer.search.core.operator_run_cost``): 82 - 21 =
#: 61 ns (envelope), 94 - 41 = 53 ns (semblance).
RUN_IO_SECONDS_PER_VOXEL = 6e-8


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
    the result; learnt: ``explorer.plan.timing.fit_run_overheads``), the same for every
    chunking of one run, so it ranks nothing and only makes the figure a run's.  ``units``: a
    chunk's graph tasks the scheduler hands out one by one (a staged pipeline's stages:
    :func:`schedule_waves`).  A fused or staged plan's seconds add what each slot's first task
    pays for pages new to its worker (:class:`FirstTouch`), which the clock's figures leave out.
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


@dataclass(frozen=True)
class FirstTouch:
    """What a slot's first task of a run pays for pages new to its worker, which the clock's
    figures (its later tasks') leave out: measured on the workers
    (``explorer.measure.worker_baseline.WorkerBaseline``).

    ``seconds_per_byte`` ``r``: the cost of touching memory the machine has not used lately
    (None: not measured, no such term); ``warm_bytes`` ``w``: the memory each worker found warm
    (pages freed moments before) when it was measured (None: none known, every page charged).
    A task of block ``b`` has peak ``m(b)`` (:meth:`TaskClock.task_bytes_at`), so its slot's
    first task pays::

        r * max(0, m(b) - w)

    once per run (the slots start their first tasks together): more for a plan of larger
    blocks.
    """

    seconds_per_byte: float | None = None
    warm_bytes: float | None = None

    def seconds(self, task_clock: "TaskClock | None", volumes):
        """``r * max(0, m(V) - w)`` at block ``volumes``; 0 without a rate or the clock's task bytes."""
        task_bytes = None if task_clock is None else task_clock.task_bytes_at(volumes)
        if task_bytes is None or self.seconds_per_byte is None or not self.seconds_per_byte > 0:
            return 0.0
        return float(self.seconds_per_byte) * np.maximum(0.0, task_bytes - float(self.warm_bytes or 0.0))

    def to_dict(self) -> dict:
        return {"seconds_per_byte": self.seconds_per_byte, "warm_bytes": self.warm_bytes}

    @classmethod
    def from_dict(cls, data: dict) -> "FirstTouch":
        return cls(**{k: None if data.get(k) is None else float(data[k]) for k in ("seconds_per_byte", "warm_bytes")})


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
    task's (mean) time (:func:`plan_seconds`): a free slot takes the next task, as the clusters
    this tool starts schedule (``explorer.measure.local_cluster.WORKER_SATURATION``).

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
    (``explorer.plan.timing.fit_timing``): the planner's time model where it has them.

    ``volumes`` (increasing) and ``seconds_per_voxel``: a task's median seconds per block
    voxel (read, operator, store: everything the worker spends on it) in groups of equal
    tasks of those volumes, fitted across volumes as a valley
    (``explorer.plan.timing.valley_fit``); between them, linear in ``log V``; beyond them, the nearest
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
    block before a run: ``explorer.runner.daskrun``, a production task) is known exactly.

    ``task_bytes_per_voxel``: per volume of ``volumes``, the median peak of the tasks (bytes
    above the worker before each) per block voxel: the memory a worker's first task of a run
    touches afresh (:class:`FirstTouch`); empty in a clock saved before it was kept.

    Reads: a task reads whole units of its input (a SEG-Y's traces, a Zarr array's chunks), so
    a block that keeps part of each trace reads more than its voxels, and the figures above hold
    the reads of the blocks they were timed on (the probes' cubes read twice their voxels along
    a split samples axis).  ``read_seconds_per_voxel`` ``r``: the seconds per voxel read, the
    slope of the tasks' measured read seconds (``read_seconds``, from the task's start to its
    ``run``) over the voxels their reads touched; ``read_voxels_per_voxel`` ``rho`` (per volume)
    and ``shape_read_voxels_per_voxel`` (per shape): the voxels the timed tasks read per block
    voxel.  A task reading ``R`` voxels then costs what the figure says plus
    :meth:`read_correction`, ``r (R - rho V)``.  None and empty in a clock without reads timed.
    """

    volumes: tuple[float, ...]
    seconds_per_voxel: tuple[float, ...]
    spread_volumes: tuple[float, ...] = ()
    spreads: tuple[float, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    shape_seconds_per_voxel: tuple[float, ...] = ()
    task_bytes_per_voxel: tuple[float, ...] = ()
    read_seconds_per_voxel: float | None = None
    read_voxels_per_voxel: tuple[float, ...] = ()
    shape_read_voxels_per_voxel: tuple[float, ...] = ()

    def __post_init__(self):
        if self.read_seconds_per_voxel is not None and (
                not self.read_seconds_per_voxel >= 0 or len(self.read_voxels_per_voxel) != len(self.volumes)
                or len(self.shape_read_voxels_per_voxel) != len(self.shapes)
                or any(not x > 0 for x in self.read_voxels_per_voxel + self.shape_read_voxels_per_voxel)):
            raise ValueError("a task clock's reads need a non-negative rate and one positive voxels read per "
                             "block voxel per volume and per shape")
        if self.task_bytes_per_voxel and (len(self.task_bytes_per_voxel) != len(self.volumes)
                                          or any(not b >= 0 for b in self.task_bytes_per_voxel)):
            raise ValueError("a task clock's task bytes per voxel must be one non-negative figure per volume")
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

    def _curve_or_shape(self, volumes, blocks, per_volume, per_shape) -> np.ndarray:
        """``per_volume`` interpolated at ``volumes``; given the ``blocks`` ``(m, ndim)`` those
        volumes are of, a clocked shape's own figure of ``per_shape`` in its row."""
        curve = self._at(volumes, self.volumes, per_volume)
        if blocks is None or not self.shapes:
            return curve
        index = self._shape_index(blocks)
        own = np.asarray(per_shape, dtype=np.float64)[np.maximum(index, 0)]
        return np.where(index >= 0, own, np.broadcast_to(curve, index.shape))

    def seconds_per_voxel_at(self, volumes, blocks=None) -> np.ndarray:
        """Seconds per voxel at ``volumes`` (the curve); given the ``blocks`` ``(m, ndim)``
        those volumes are of, a clocked shape's own figure in its row."""
        return self._curve_or_shape(volumes, blocks, self.seconds_per_voxel, self.shape_seconds_per_voxel)

    def read_correction(self, volumes, blocks, read_voxels):
        """Seconds a task of block volume ``volumes`` (shapes ``blocks``, or None) reading
        ``read_voxels`` voxels pays beyond what its figure holds: ``r (R - rho V)``, negative when
        it reads less per voxel than the timed tasks did; 0 without reads timed."""
        if self.read_seconds_per_voxel is None:
            return 0.0
        volumes = np.asarray(volumes, dtype=np.float64)
        rho = self.read_voxels_per_voxel_at(volumes, blocks)
        return self.read_seconds_per_voxel * (np.asarray(read_voxels, dtype=np.float64) - rho * volumes)

    def read_voxels_per_voxel_at(self, volumes, blocks=None) -> np.ndarray:
        """``rho``: the timed tasks' voxels read per block voxel at ``volumes`` (a clocked shape's
        own in its row, as :meth:`seconds_per_voxel_at`); needs reads timed."""
        return self._curve_or_shape(volumes, blocks, self.read_voxels_per_voxel, self.shape_read_voxels_per_voxel)

    def task_bytes_at(self, volumes):
        """A task's peak bytes at ``volumes`` (per voxel interpolated like the seconds), or None
        when the clock has no task bytes."""
        if not self.task_bytes_per_voxel:
            return None
        volumes = np.asarray(volumes, dtype=np.float64)
        return self._at(volumes, self.volumes, self.task_bytes_per_voxel) * volumes

    def spread_at(self, volumes):
        """The coefficient of variation at ``volumes``, or None when no group had three tasks."""
        return self._at(volumes, self.spread_volumes, self.spreads) if self.spreads else None

    def to_dict(self) -> dict:
        data = {k: v if k == "read_seconds_per_voxel" else list(v) for k, v in asdict(self).items()}
        data["shapes"] = [list(shape) for shape in self.shapes]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TaskClock":
        rate = data.get("read_seconds_per_voxel")
        return cls(**{k: tuple(float(x) for x in data.get(k) or ()) for k in
                      ("volumes", "seconds_per_voxel", "spread_volumes", "spreads", "shape_seconds_per_voxel",
                       "task_bytes_per_voxel", "read_voxels_per_voxel", "shape_read_voxels_per_voxel")},
                   shapes=tuple(tuple(int(n) for n in shape) for shape in data.get("shapes") or ()),
                   read_seconds_per_voxel=None if rate is None else float(rate))


def composed_clock(clocks, shared_seconds_per_voxel: float = 0.0) -> TaskClock:
    """The clock of one task running the members of ``clocks`` in turn on the same block: a
    fused pipeline's, from its members' learnt clocks.

    Each member's clock times a whole task of its own (read, operator, store); a fused task
    reads and stores once, so ``S - 1`` of the members' I/O (``shared_seconds_per_voxel``, their
    learnt I/O per voxel) is taken off::

        s(V)     = sum_s s_s(V) - (S - 1) * io          (at the union of the members' volumes)
        sigma(V) = max_s sigma_s(V)                     (none when a member has no spread)
        bytes(V) = max_s bytes_s(V)                     (each member reuses its predecessor's pages)
        r, rho   = mean_s r_s, mean_s rho_s(V)          (the one read left; when every member timed reads)

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
    task_bytes = ()
    if all(c.task_bytes_per_voxel for c in clocks):
        task_bytes = tuple(float(x) for x in np.max([c.task_bytes_at(volumes) for c in clocks], axis=0) / volumes)
    reads = {}
    if all(c.read_seconds_per_voxel is not None for c in clocks):
        reads = dict(read_seconds_per_voxel=float(np.mean([c.read_seconds_per_voxel for c in clocks])),
                     read_voxels_per_voxel=tuple(float(x) for x in np.mean(
                         [c.read_voxels_per_voxel_at(volumes) for c in clocks], axis=0)),
                     shape_read_voxels_per_voxel=tuple(float(x) for x in np.mean(
                         [c.read_voxels_per_voxel_at(volumes_of, shapes) for c in clocks], axis=0)) if shapes else ())
    return TaskClock(volumes=tuple(float(v) for v in volumes),
                     seconds_per_voxel=tuple(float(x) for x in np.maximum(speed, floor)),
                     spread_volumes=spread_volumes, spreads=spreads, shapes=tuple(shapes),
                     shape_seconds_per_voxel=tuple(float(x) for x in own) if shapes else (),
                     task_bytes_per_voxel=task_bytes, **reads)


def _grid_read_voxels(shape, halo, axis_chunks, grid, read_unit) -> np.ndarray | None:
    """Per candidate on a sub-grid of per-axis chunk lengths, the mean voxels a task's windowed
    read touches (:func:`explorer.plan.grid.mean_read_extent` per axis, multiplied: the mean of
    products over a full grid of chunks); None without a ``read_unit``."""
    if read_unit is None:
        return None
    voxels = None
    for length, chunks, rows, h, u in zip(shape, axis_chunks, grid, halo, read_unit):
        extent = mean_read_extent(int(length), chunks, int(h), int(u))[rows]
        voxels = extent if voxels is None else voxels * extent
    return voxels


def _fused_seconds(shape, axis_chunks, grid, blocks, n_tasks, *, slots: int, seconds_per_voxel,
                   graph_task_seconds: float, task_clock: TaskClock | None = None,
                   run_fixed_seconds: float = 0.0, first_touch: FirstTouch | None = None,
                   read_voxels=None) -> np.ndarray:
    """:func:`plan_seconds` of one task per block (an operator's plan, a pipeline's fused one) for
    candidates on a sub-grid of per-axis chunk lengths (:class:`Candidates`): with the learnt
    ``task_clock`` its seconds per voxel and spread at each block's volume, else the given
    ``seconds_per_voxel`` and Graham's bound.  A fused task's block is one windowed read of
    the file (``operators.windowed_map``): no halo is exchanged between chunks, so its graph
    tasks are :func:`graph_tasks_per_chunk` with none.  ``first_touch``: the workers' fresh
    pages (:class:`FirstTouch`).  ``read_voxels``: the voxels each candidate's task reads
    (:func:`_grid_read_voxels`), whose difference from the clocked tasks' reads the clock
    prices (:meth:`TaskClock.read_correction`); None: read as the clocked tasks did."""
    halo = (0,) * len(shape)
    volumes = _samples(blocks)
    spread = None
    if task_clock is not None:
        seconds_per_voxel, spread = task_clock.seconds_per_voxel_at(volumes, blocks), task_clock.spread_at(volumes)
        if read_voxels is not None:
            seconds_per_voxel = np.maximum(
                0.0, seconds_per_voxel + task_clock.read_correction(volumes, blocks, read_voxels) / volumes)
    return plan_seconds(n_tasks, volumes, slots, tasks_per_chunk=_grid_graph_tasks(shape, halo, axis_chunks, grid),
                        seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds, spread=spread,
                        fixed_seconds=run_fixed_seconds) + (first_touch or FirstTouch()).seconds(task_clock, volumes)


def _staged_seconds(shape, stages, axis_chunks, grid, chunk_samples, n_tasks, *, workers: int, slots: int,
                    graph_task_seconds: float, io_seconds_per_voxel: float,
                    run_fixed_seconds: float = 0.0, first_touch: FirstTouch | None = None,
                    read_unit=None) -> tuple[list, np.ndarray]:
    """``(blocks per stage, seconds)``: :func:`plan_staged_chunks`'s time model (its docstring)
    for candidates on a sub-grid of per-axis chunk lengths.  A slot's first chunk touches afresh
    the pages of its largest stage (:class:`FirstTouch`; the later stages reuse them).  The
    stages that read the file price their reads by ``read_unit`` (:func:`_fused_seconds`)."""
    ndim = len(shape)
    blocks, chunk_seconds, spreads = [], np.zeros(len(chunk_samples)), []  # the stages' graph tasks and work
    touch = np.zeros(len(chunk_samples))
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
            if reads_file(stage.group) and read_unit is not None:
                read = _grid_read_voxels(shape, stage.halo, axis_chunks, grid, read_unit)
                chunk_seconds += clock.read_correction(volumes, b, read)
            if stage is not stages[0]:  # its input and output stay in the workers: no read, no store
                chunk_seconds -= io_seconds_per_voxel * chunk_samples
        else:
            chunk_seconds += stage.seconds_per_voxel * volumes + (io_seconds_per_voxel * volumes
                                                                  if stage is stages[0] else 0.0)
        spreads.append(None if clock is None else clock.spread_at(volumes))
        touch = np.maximum(touch, (first_touch or FirstTouch()).seconds(clock, volumes))
        if not stage.windowed:  # its halo slices come from the intermediate's chunks, some on other workers
            chunk_seconds += io_seconds_per_voxel * (workers - 1) / workers * (volumes - chunk_samples)
    spread = None if any(x is None for x in spreads) else np.max(spreads, axis=0)
    return blocks, makespan_seconds(n_tasks, slots, chunk_seconds, spread=spread, fixed_seconds=run_fixed_seconds,
                                    units=len(stages)) + touch


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
                  task_clock: TaskClock | None = None, run_fixed_seconds: float = 0.0,
                  first_touch: FirstTouch | None = None, read_unit=None) -> np.ndarray:
    """The time model of :func:`plan_chunks` at given chunk shapes ``(m, ndim)`` (one task per
    block): what it predicts for a chunking it did not choose.  ``read_unit``: the input's
    (``VolumeGeometry.read_unit``)."""
    axis_chunks, grid, n_tasks, _ = chunk_grid(shape, chunks)
    blocks = np.stack([axis_blocks(shape[a], axis_chunks[a], int(halo[a]))[grid[a]] for a in range(len(shape))],
                      axis=1)
    return _fused_seconds(tuple(shape), axis_chunks, grid, blocks, n_tasks, slots=slots,
                          seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds,
                          task_clock=task_clock, run_fixed_seconds=run_fixed_seconds,
                          first_touch=first_touch,
                          read_voxels=_grid_read_voxels(shape, halo, axis_chunks, grid, read_unit))


def staged_seconds(shape, stages, chunks, *, workers: int, slots: int,
                   graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS,
                   io_seconds_per_voxel: float = RUN_IO_SECONDS_PER_VOXEL, run_fixed_seconds: float = 0.0,
                   first_touch: FirstTouch | None = None, read_unit=None) -> np.ndarray:
    """The time model of :func:`plan_staged_chunks` at given chunk shapes ``(m, ndim)``."""
    axis_chunks, grid, n_tasks, chunk_samples = chunk_grid(shape, chunks)
    return _staged_seconds(tuple(shape), stages, axis_chunks, grid, chunk_samples, n_tasks, workers=int(workers),
                           slots=int(slots), graph_task_seconds=graph_task_seconds,
                           io_seconds_per_voxel=io_seconds_per_voxel, run_fixed_seconds=run_fixed_seconds,
                           first_touch=first_touch, read_unit=read_unit)[1]
