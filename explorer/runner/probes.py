"""In-worker probes: what the operator's tasks cost inside a real Dask worker, before production.

``explore`` ends here.  The isolated profiles measure ``operator.run`` alone; a task in a
Dask worker also reads its block from the file (a windowed read) and copies its output
for the store (``explorer.plan.calibration``).  Each probe is a real production run
(``explorer.runner.daskrun.run``, the same graph, observation and store) of the operator on a
synthetic SEG-Y, on a local cluster of one-thread workers (exact task figures), recorded
as ``source="probe"``.  Then the calibration is fitted from the probes (and any production
runs of this environment) and saved, and the workers' measured baseline is saved as this
machine's (``explorer.measure.worker_baseline.local_worker_baseline``).

Probe blocks: ``n`` cubes of edge ``e_j``, log-spaced from :data:`MIN_PROBE_EDGE` (at least
``3 h + 1``, so that two chunks of ``e - h`` are each longer than the halo) up to the **plan-scale
cube**, each edge a regular length (5-smooth, at most 2^3 in it) unless the operator pads to a grid
(:func:`_lengths`): the largest cube whose one-thread worker footprint (the isolated 99% bound, the
measured baseline) fits the pause threshold of the target
memory, which is the largest block a plan at that memory could run (without a target memory: the
largest cube the exact isolated profiles reached), and never past the region ``explore``'s loop
learnt (:func:`model_probe_blocks`, :func:`probe_volume_cap`).  Lowered until the probes' predicted seconds
fit ``seconds_budget`` (:data:`PROBE_SECONDS_BUDGET` by default), but never below the three
distinct blocks that identify the excess's line (the smallest on the operator's grid, even past
the budget).  **Plans run where the probes ran, never beyond**: tasks on equal blocks differ from
one another, more on larger blocks (gst3d's probes: sd 0.5 MiB at 110^3, 19 MiB at 182^3, 155 MiB
at 303^3; ``explorer.plan.excess.WithinFit``), and the workers' clock changes with the block (gst3d:
143 ns per voxel at 200^3, 189 at 324^3), so a plan's block is at most the largest block measured in
a worker (``TaskModel.largest_block_voxels``, the planner's ``VolumeGeometry.max_block_voxels``).
The budget trades the probes' seconds against the largest block plans may use, never against the
bound: a plan on a large survey rarely gains from blocks past a few million voxels (gst3d's plans:
120^3 for the README's volume at 1.5 GiB, 93x317x154 for a 651x951x462 survey at 4 GiB), and the
probes of gst3d's 324^3 plan-scale cube at 4 GiB took 30 of explore's 78 s.  A probe's volume has two chunks
along every axis the operator splits (``e - h`` each with a halo ``h``, ``e`` without),
so all its tasks run on blocks of exactly ``e`` per axis, each a windowed read of the file as
in a real plan (``operators.windowed_map``); an axis the operator needs whole is ``e`` long.  Then the
smallest block runs once more with four chunks per split axis: eight times the graph tasks per
worker for about the same work per task, so that the runs' wall times tell a run's fixed
seconds apart from the overhead per graph task (``explorer.plan.timing.fit_run_overheads``;
with every probe on one grid the two are one number, and charging all of it per graph task
made plans of many small chunks look up to 1.8x slower than they ran).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer.plan.excess import N_COEFFICIENTS
from explorer.plan.candidates import grid_volume

__all__ = ["ProbeResult", "calibrate_in_workers", "model_probe_blocks", "probe_blocks", "probe_volume_cap",
           "profiled_volume", "run_probes"]

#: Probes ``explore`` runs by default (``n`` groups: the excess fit keeps ``n - 2`` dof).
DEFAULT_PROBES = 6
#: Smallest probe cube edge (a task per 24^3 samples is mostly fixed overhead, which the
#: excess's intercept should see).
MIN_PROBE_EDGE = 24
#: Predicted seconds all probes may take together by default (operator time, from its profiles,
#: times the in-worker factor below, over the probe workers; ``explore --probe-seconds``).  A cost
#: control, not a safety term: fewer seconds means smaller probes and a smaller largest block for
#: the plans and a smaller region for the isolated loop (:func:`probe_volume_cap`), never a wider
#: extrapolation.  At 20, gst3d's probes go up to 180-216^3 and take 13-20 s
#: (``scripts/bench_timings.py``; at 90, 324^3 and 48-50 s).
PROBE_SECONDS_BUDGET = 20.0
#: A task in a worker takes about this many times the operator's own seconds (reading
#: and storing around ``run``); only used to size the probes.
IN_WORKER_TIME_FACTOR = 2.0
#: Largest cube edge a probe is ever sized at (:func:`plan_scale_edge`, :func:`probe_volume_cap`).
MAX_PROBE_EDGE = 2048
#: Workers of the probe cluster (one thread each: exact task figures).
PROBE_WORKERS = 2
#: Chunks per split axis of a probe's volume: every task then sees exactly the probe's block.
PROBE_GRID = 2
#: Chunks per split axis of the last probe, the smallest block again: with 4, a probe of three
#: split axes runs 64 tasks where the others run 8 (32 waves on two workers instead of 4).
OVERHEAD_PROBE_GRID = 4


@dataclass
class ProbeResult:
    """What the probes did: the blocks, each run, the calibration and the baseline."""

    blocks: list = field(default_factory=list)
    #: Chunks per split axis of each probe's volume (:data:`PROBE_GRID`, the last :data:`OVERHEAD_PROBE_GRID`).
    grids: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    calibration: object = None
    baseline_bytes: int | None = None
    seconds: float = 0.0
    warnings: list = field(default_factory=list)
    #: Where the probes ran: the scheduler's address (a LocalCluster's when none was given).
    scheduler: str | None = None

    @property
    def workers(self) -> list[str]:
        """The addresses of the workers the probes' tasks ran on, in order of first sight."""
        return list(dict.fromkeys(address for r in self.runs for address in (r.workers or [])))

    def to_dict(self) -> dict:
        cal = self.calibration
        return {
            "scheduler": self.scheduler,
            "workers": self.workers,
            "blocks": [list(b) for b in self.blocks],
            "runs": [{"block": list(b), "grid": g, "status": r.status, "n_tasks": r.n_tasks, "seconds": r.seconds,
                      "error": r.error} for b, g, r in zip(self.blocks, self.grids, self.runs)],
            "baseline_bytes": self.baseline_bytes,
            "seconds": round(self.seconds, 3),
            "calibration": cal.to_dict() if cal is not None else None,
            "warnings": self.warnings,
        }


def probe_blocks(op, max_volume: float, seconds_per_voxel: float | None, n: int = DEFAULT_PROBES,
                 budget_seconds: float = PROBE_SECONDS_BUDGET, workers: int = PROBE_WORKERS,
                 plan_edge: int | None = None) -> list[tuple]:
    """The probes' block shapes (module docstring): ``n`` distinct cubes, smallest first.

    ``plan_edge``: the plan-scale cube's edge (:func:`plan_scale_edge`), or None.
    """
    smallest = max(MIN_PROBE_EDGE, 3 * max(op.halo) + 1)
    reached = _cube_edge(max_volume)
    # The blocks plans run, no larger: the isolated profiles may reach blocks whose task
    # memory fits the target but whose in-worker copies do not (first_derivative at 4 GiB:
    # profiled to 809^3, where tasks in a worker took 4.4-10 GB).
    largest = max(smallest + n, int(plan_edge) if plan_edge else reached)
    split = [axis not in op.whole_axes for axis in range(3)]
    tasks_per_probe = 2 ** sum(split)

    def seconds(edges):
        if not seconds_per_voxel:
            return 0.0
        voxels = sum(tasks_per_probe * float(e) ** 3 for e in edges)
        return voxels * seconds_per_voxel * IN_WORKER_TIME_FACTOR / workers

    while True:
        edges = _lengths(op, np.rint(np.geomspace(smallest, largest, n)).astype(int), smallest, largest)
        if seconds(edges) <= budget_seconds or largest <= smallest + n:
            break
        largest = int(largest * 0.9)
    # The excess is identified from N_COEFFICIENTS + 1 distinct blocks: fewer probes are
    # spent for nothing, so the smallest such blocks on the operator's grid run even past
    # the seconds budget (unet3d: a halo of 48 and a multiple of 8 leave one or two).
    needed = min(n, N_COEFFICIENTS + 1)
    if len(edges) < needed:
        step = max(int(x) for x in op.block_multiple)
        first = int(_on_grid(op, np.array([smallest]))[0])
        extra = [e for e in first + step * np.arange(2 * needed) if e not in edges][:needed - len(edges)]
        edges = np.unique(np.concatenate([edges, extra]).astype(int))
    return [(int(e),) * 3 for e in edges]


def probe_volume_cap(op, seconds_per_voxel: float | None, n: int = DEFAULT_PROBES,
                     budget_seconds: float = PROBE_SECONDS_BUDGET) -> float | None:
    """The volume of the largest block the probes can run in ``budget_seconds`` at any target
    memory: :func:`probe_blocks` without a plan-scale cube, at ``seconds_per_voxel`` (the
    operator's, from its isolated profiles; None or 0, no clock yet: None, no bound).

    A plan runs no block larger than the largest probe, which is at most this (the plan-scale
    cube only lowers it), so the isolated loop need not learn blocks beyond it:
    ``explorer.exploration.explore`` bounds its target region by it
    (``ExplorationCore.max_block_voxels``) while the probes are to run."""
    if not seconds_per_voxel:
        return None
    blocks = probe_blocks(op, float(MAX_PROBE_EDGE) ** 3, seconds_per_voxel, n=n, budget_seconds=budget_seconds)
    return max(float(np.prod(np.asarray(b, dtype=np.float64))) for b in blocks)


def _cube_edge(volume: float) -> int:
    """The largest edge whose cube is at most ``volume`` voxels (a cube's volume gives its edge
    exactly, not one less: the float cube root of 100^3 is 99.99...)."""
    return int(math.floor(float(volume) ** (1 / 3) + 1e-6))


def _lengths(op, edges: np.ndarray, smallest: int, largest: int) -> np.ndarray:
    """The probe edges a block is really run at, distinct and increasing: on the operator's
    grid when it pads its blocks to a multiple (:func:`_on_grid`), else each the nearest (in
    log) *regular* length between ``smallest`` and ``largest``: ``2^a 3^b 5^c`` with ``a <= 3``.

    A block's speed per voxel depends on its edges' factors at both ends.  An FFT's on a prime
    length goes through Bluestein's algorithm at several times the cost (pocketfft has fast
    paths for small primes), and envelope, instantaneous_phase and instantaneous_frequency
    transform their whole samples axis, which a probe's cube gives the probe's edge: probes at
    24, 38, 60, 96, 151 and 240 gave envelope a clock whose cost per voxel rose and fell with
    their factors, and the planner chased the volumes that happened to probe fast.  A stride of
    a large power of two aliases in the caches: with 5-smooth edges semblance's 128^3 probe ran
    slower per voxel than its 90^3 and 200^3 neighbours (79.8 ns against 68.0 and 50.7), and
    the planner went from cubes to slabs.  Between the two, the clock follows the block's
    volume; a survey's own lengths then change the speed of its chunkings, not the probes'."""
    if max(int(x) for x in op.block_multiple) > 1:
        return np.unique(_on_grid(op, edges))
    lo = _regular_at_least(smallest)
    regular = np.array([r for r in _REGULAR if lo <= r <= max(largest, lo)], dtype=np.int64)
    nearest = np.abs(np.log(regular)[None, :] - np.log(np.asarray(edges, dtype=np.float64))[:, None]).argmin(axis=1)
    return np.unique(regular[nearest])


def _regular_numbers(limit: int, max_twos: int = 3) -> tuple[int, ...]:
    """The numbers ``2^a 3^b 5^c <= limit`` with ``a <= max_twos``, increasing."""
    out = {1}
    for prime in (3, 5):
        for value in sorted(out):
            value *= prime
            while value <= limit:
                out.add(value)
                value *= prime
    return tuple(sorted({v * 2**a for v in out for a in range(max_twos + 1) if v * 2**a <= limit}))


#: Regular lengths (:func:`_lengths`) up to twice the largest plan-scale edge :func:`plan_scale_edge` tries.
_REGULAR = _regular_numbers(4096)


def _regular_at_least(n: int) -> int:
    return next(r for r in _REGULAR if r >= n)


def _on_grid(op, edges: np.ndarray) -> np.ndarray:
    """Edges ``e`` whose chunks ``e - h`` are multiples of the operator's block multiple
    (rounded up), so that the probe's blocks are the ones it really runs on (``Operator.block_multiple``)."""
    m = max(int(x) for x in op.block_multiple)
    if m <= 1:
        return edges
    h = max(op.halo)
    return h + -(-(edges - h) // m) * m


def plan_scale_edge(op, model, memory_limit: int, baseline_bytes: int, confidence: float = 0.99,
                    max_edge: int = MAX_PROBE_EDGE) -> int | None:
    """The largest cube edge ``e`` whose probe task fits a one-thread worker of
    ``memory_limit`` under its pause threshold: ``worker_footprint`` of the block ``e^3``
    with the isolated model's upper bound and ``baseline_bytes`` (a block is a windowed read:
    no chunk is kept for a neighbour).  None when not even the smallest probe fits."""
    from explorer.plan.footprint import worker_footprint
    from explorer.plan.dask_config import worker_pause_fraction
    from explorer.plan.recommend import fused_output_itemsize

    budget = worker_pause_fraction() * float(memory_limit)

    def fits(e: int) -> bool:
        block = (e, e, e)
        _, upper = model.predict(block, confidence)
        total = worker_footprint(block, upper, baseline_bytes=baseline_bytes,
                                 output_itemsize=fused_output_itemsize(op), windowed=True).total
        return total <= budget

    lo = max(MIN_PROBE_EDGE, 3 * max(op.halo) + 1)
    if not fits(lo):
        return None
    hi = max_edge
    while lo < hi:  # the footprint grows with e: the largest edge that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def model_probe_blocks(op, model, memory_limit, baseline_bytes: int, confidence: float = 0.99, *,
                       n: int = DEFAULT_PROBES, budget_seconds: float = PROBE_SECONDS_BUDGET) -> list[tuple]:
    """The probes of ``model`` (:func:`probe_blocks`): up to the plan-scale cube at ``memory_limit``
    (:func:`plan_scale_edge`; None: the isolated profiles' reach), at the operator's profiled speed
    (``model.info["seconds_per_voxel"]``), and never past the region ``explore``'s loop learnt
    (``model.info["region_max_block_voxels"]``, :func:`probe_volume_cap`)."""
    plan_edge = None if memory_limit is None else plan_scale_edge(op, model, int(memory_limit), baseline_bytes,
                                                                 confidence)
    reach = profiled_volume(model)
    region = model.info.get("region_max_block_voxels")
    if region:
        reach = min(reach, float(region))
        if plan_edge is not None:
            plan_edge = min(plan_edge, _cube_edge(region))
    return probe_blocks(op, reach, model.info.get("seconds_per_voxel"), n=n, plan_edge=plan_edge,
                        budget_seconds=budget_seconds)


def profiled_volume(model) -> float:
    """The largest block volume ``model``'s exact isolated profiles reached; a composed
    model's (``explorer.model.composed``), the smallest of its members' (each was profiled that far)."""
    members = getattr(model, "members", None)
    if isinstance(members, dict) and members:
        return min(profiled_volume(m) for m in members.values())
    exact = model.train_shapes[~model.train_is_lower_bound]
    return float(np.prod(exact.astype(np.float64), axis=1).max())


def _branch_order(model, block, confidence: float):
    """The order a production plan on ``block`` runs a fan-out's branches in: a composed
    model's (Liu's, ``ComposedModel.branch_order``), so that the probes' tasks are the ones
    its bound describes; None (as written) for a model learnt from the pipeline's own profiles."""
    order = getattr(model, "branch_order", None)
    if not callable(order):
        return None
    return tuple(order(block, confidence)) or None


def run_probes(operator: str, model, *, n: int = DEFAULT_PROBES, runs_dir=None, storage=None,
               confidence: float = 0.99, progress=None, seed: int = 0, memory_limit=None,
               client=None, timings=None, seconds_budget: float = PROBE_SECONDS_BUDGET) -> ProbeResult:
    """Run the in-worker probes of ``operator`` (module docstring), fit and save the calibration.

    ``model``: the freshly fitted isolated ``MemoryModel``, or a pipeline's composed model
    (``explorer.model.composed.ComposedModel``; its fan-out's branches then run in the order its
    plans would at each probe block): it sizes the probes, and the excess is against its
    mean.  ``memory_limit``: the target worker memory (explore's), which sets the plan-scale
    probe; None probes only up to the isolated profiles' reach.
    ``progress(index, total, block, run_result)`` after each.  ``client``: a
    ``distributed.Client`` of the cluster to probe (its workers' baseline, memory and
    environment: the calibration describes them; the probe volumes are written under the
    system's temporary directory, which its workers must read); None starts a LocalCluster of
    :data:`PROBE_WORKERS` workers here and saves its baseline as this machine's.  ``timings``: an
    ``explorer.core.timings.Timings`` the probes' parts are added to (``probes: ...`` sections).
    ``seconds_budget``: what the probes may take, predicted (:func:`probe_blocks`).  No probe is
    larger than the region ``explore``'s loop learnt (``model.info["region_max_block_voxels"]``,
    :func:`probe_volume_cap`), whatever ``seconds_budget``: ``explore OP --probe-seconds S``
    widens both.
    """
    import contextlib
    import time

    from distributed import Client

    import operators
    from explorer.core.timings import Timings
    from explorer.plan.calibration import calibrate
    from explorer.runner.daskrun import run
    from explorer.measure.worker_baseline import measure_worker_baseline, save_worker_baseline
    from explorer.search.store import Store
    from explorer.measure.local_cluster import local_cluster
    from explorer.measure.workersetup import prepare_workers

    started = time.perf_counter()
    section = (Timings() if timings is None else timings).section
    op = operators.get(operator)
    result = ProbeResult()
    tmp = Path(tempfile.mkdtemp(prefix=f"explorer-probes-{operator}-"))
    environment = None
    try:
        with contextlib.ExitStack() as stack:
            with section("probes: cluster start"):
                cluster = stack.enter_context(local_cluster(PROBE_WORKERS)) if client is None else None
            # The idle, warmed workers before any task (their baseline; this machine's is saved);
            # the workers first get the profiling server's allocator setting (explorer.measure.workersetup).
            address = cluster.scheduler_address if cluster is not None else client.scheduler.address
            result.scheduler = address
            with (Client(cluster) if cluster is not None else contextlib.nullcontext(client)) as connected, \
                    section("probes: worker set-up and baseline"):
                prepare_workers(connected, operator)
                # on the cluster started here, before its first task: the machine's fresh pages
                baseline = measure_worker_baseline(connected, operator, first_touch=cluster is not None)
            if cluster is not None:
                baseline.source = "local"
                save_worker_baseline(operator, baseline, runs_dir)
            result.baseline_bytes, environment = baseline.bytes, baseline.environment
            blocks = model_probe_blocks(op, model, memory_limit, baseline.bytes, confidence, n=n,
                                        budget_seconds=seconds_budget)
            # The smallest block once more on a finer grid: many more graph tasks per slot for about
            # the same work, which tells a run's fixed seconds from its overhead per graph task
            # (``explorer.plan.timing.fit_run_overheads``).
            grids = result.grids = [PROBE_GRID] * len(blocks) + [OVERHEAD_PROBE_GRID]
            blocks = result.blocks = blocks + blocks[:1]
            for index, (block, per_axis) in enumerate(zip(blocks, grids)):
                volume, chunks = grid_volume(block, op.halo, op.whole_axes, (per_axis,) * 3)
                source = tmp / f"probe-{index}.sgy"
                with section("probes: volumes (synthetic, SEG-Y)"):
                    operators.write_segy(source, operators.synthetic_volume(volume, seed=seed + index))
                with section("probes: runs (explore run's path)"):
                    r = run(operator, source, tmp / f"probe-{index}.zarr", scheduler=address,
                            chunks=chunks, runs_dir=runs_dir, storage=storage, confidence=confidence, replan=False,
                            calibrate=False, source="probe", context={"probe": index, "grid": per_axis},
                            branch_order=_branch_order(model, block, confidence), check=False)
                source.unlink()
                if timings is not None:  # the run's own parts, nested in "probes: runs"
                    for name, entry in r.timings.items():
                        timings.add(f"probes: runs: {name}", entry["seconds"], entry["count"])
                result.runs.append(r)
                if r.status != "ok":
                    result.warnings.append(f"probe {index + 1} ({'x'.join(map(str, block))}) {r.status}: {r.error}")
                if progress is not None:
                    progress(index + 1, len(blocks), block, r)
            with section("probes: cluster close"):
                stack.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if environment is not None and any(r.status == "ok" for r in result.runs):
        with section("probes: calibration fit"):
            result.calibration = calibrate(operator, Store(runs_dir, storage), model, confidence=confidence,
                                           runs_dir=runs_dir, environment=environment)
    result.seconds = time.perf_counter() - started
    return result


def calibrate_in_workers(operator: str, *, memory_limit=None, n: int = DEFAULT_PROBES, runs_dir=None,
                         storage=None, confidence: float = 0.99, progress=None, seed: int = 0,
                         client=None, seconds_budget: float = PROBE_SECONDS_BUDGET) -> ProbeResult:
    """The in-worker probes of ``operator``'s saved model, alone: ``explore calibrate SPEC``.

    For a pipeline with no profile of its own this is the model composed from its members'
    (``explorer.model.composed``): its fused tasks are probed in workers exactly as ``explore``'s
    probes do for an explored model, so its plans get their in-worker term (and ``auto`` can
    weigh them, ``explorer.plan.recommend.choose_strategy``) without any isolated profile of the
    pipeline.  ``memory_limit``: the target worker memory that sets the plan-scale probe
    (default ``explorer.core.machine.default_memory_limit()``).  ``client``: the cluster to probe
    and ``seconds_budget`` what the probes may take (:func:`run_probes`).  Raises
    ``ModelNotFoundError`` naming the ``explore`` command(s) when there is no model to probe.
    """
    from explorer.core import validate
    from explorer.core.machine import default_memory_limit
    from explorer.model.load import load_model

    operator = validate.operator(operator)
    limit = default_memory_limit() if memory_limit is None else validate.size(memory_limit, "memory_limit")
    n = validate.positive_int(n, "probes")
    confidence = validate.confidence(confidence)
    seconds_budget = validate.positive_number(seconds_budget, "probe_seconds")
    model = load_model(operator, runs_dir=runs_dir)
    return run_probes(operator, model, n=n, runs_dir=runs_dir, storage=storage, confidence=confidence,
                      progress=progress, seed=seed, memory_limit=limit, client=client, seconds_budget=seconds_budget)
