"""``recommend_chunks``: a learnt model, a calibration and a measured worker, turned into a plan.

An edge module: it reads what ``explore`` saved (the isolated model, the in-worker
calibration) and the worker baseline (``explorer.measure.worker_baseline``), and calls the
pure planner (``explorer.plan.planner.plan_chunks``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from explorer.core.machine import l1_data_cache
from explorer.core.units import FLOAT32_BYTES
from explorer.plan.time_model import (DEFAULT_GRAPH_TASK_SECONDS, RUN_IO_SECONDS_PER_VOXEL, FirstTouch,
                                      run_seconds_per_voxel)
from explorer.plan.chunk_plan import ChunkPlan
from explorer.plan.planner import plan_chunks
from explorer.plan.dask_config import worker_pause_fraction
from explorer.plan.spec import TimeTerms, VolumeGeometry, WorkerSpec
from explorer.measure.worker_baseline import WorkerBaseline, local_worker_baseline, with_known_rate

__all__ = [
    "plan_for_chunks",
    "predicted_seconds",
    "recommend_chunks",
]


def recommend_chunks(
    operator: str,
    shape,
    memory_limit: int | str,
    *,
    threads_per_worker: int = 1,
    confidence: float = 0.99,
    runs_dir=None,
    workers: int = 1,
    baseline_bytes: "int | WorkerBaseline | Literal['local'] | None" = "local",
    strategy: str = "auto",
    read_unit=None,
) -> ChunkPlan:
    """The safe chunks for ``operator`` on a float32 volume of ``shape``.

    ``shape``: a tuple or ``"800x600x1000"``; ``memory_limit``: bytes or ``"4GiB"`` (a
    Dask worker's ``memory_limit``); ``workers``: how many such workers share the work
    (``explorer.plan.planner.plan_chunks``).  ``baseline_bytes``: an idle worker's resident
    memory with the operator loaded, measured on the cluster that runs the work: bytes,
    or the :class:`WorkerBaseline` of :func:`measure_worker_baseline` (whose workers'
    environment the model and its calibration are then checked against); ``"local"`` (default; ``None`` is
    the same): this machine's, read from ``runs_dir`` or, the first time in an environment,
    measured by starting a one-worker ``LocalCluster`` (a few seconds) and written there
    (:func:`local_worker_baseline`).  Nothing else is started or written.

    Halo and whole axes come from the operator registry; a task's peak from the saved
    model plus its in-worker calibration (``explorer.plan.task_model.TaskModel``); the pause
    fraction from Dask's config; the time model's terms from the calibration's learnt
    timings, else from the operator's profiled speed.  The plan's ``warnings`` say what
    the bound does not know (a stale model, no calibration).  The footprint is that of the
    form ``explore run`` uses, each task reading its own block from the file
    (``operator.dask(operators.segy_volume(path), chunks=plan.chunks)``): a ``map_overlap``
    on a chunked Dask array also keeps its chunks for their neighbours, which it does not count.
    The bound is for workers with the profiling server's allocator setting: run the plan on
    workers set up as ``docs/workers.md`` says (``explorer.measure.workersetup.prepare_workers(client)``,
    ``dask worker --preload explorer.measure.workersetup``, or ``MALLOC_MMAP_THRESHOLD_=131072``).

    ``strategy`` (a pipeline's; :data:`STRATEGY_CHOICES`): ``"fused"`` plans one task per
    block for all stages (the pipeline's own model, or the one composed from its members');
    ``"staged"`` one ``map_overlap`` per stage from the members' task models
    (``explorer.plan.staged.plan_staged_chunks``); ``"auto"`` plans both and takes the one of
    least predicted seconds among those that fit, a plan whose every task model has its
    in-worker calibration before one that lacks it (its bound omits what a task needs
    around its run inside a worker); the plan's ``considered`` keeps both.  A single
    operator has one form: its plan is ``"fused"`` whatever is asked.

    ``read_unit``: what a task's read of the input touches whole, per axis (``explore run``
    passes its input's: ``explorer.runner.inputs.RunInput.read_unit``); None (default): a SEG-Y's
    trace, ``(1, 1, shape[2])``.  A block that keeps part of each trace reads the whole traces,
    which the time model prices (``explorer.plan.time_model.TaskClock.read_correction``).

    Raises ``KeyError`` for an unknown operator, ``ModelNotFoundError`` naming the
    ``explore`` command when no model is saved, ``ChunkPlanError`` when the limit is too
    small, ``ValueError`` for a malformed shape, size, strategy or calibration file.
    """
    from explorer.core import validate

    operator = validate.operator(operator)
    shape = validate.shape(shape)
    limit_bytes = validate.size(memory_limit, "memory_limit")
    confidence = validate.confidence(confidence)
    threads_per_worker = validate.positive_int(threads_per_worker, "threads_per_worker")
    workers = validate.positive_int(workers, "workers")
    if strategy not in STRATEGY_CHOICES:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGY_CHOICES)}")
    import operators
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.model.memory_model import ModelNotFoundError

    op = operators.get(operator)
    request = _PlanRequest(operator, op, shape, limit_bytes, threads_per_worker, confidence, runs_dir, workers,
                           baseline_bytes, read_unit=_read_unit(read_unit, shape))
    staged_possible = request.is_pipeline
    wanted = [s for s in ("fused", "staged") if strategy in ("auto", s) and (s == "fused" or staged_possible)]
    if not wanted:  # "staged" asked of a single operator: its one form
        wanted = ["fused"]
    plans, complete, errors = {}, {}, {}
    for name in wanted:
        try:
            plans[name], complete[name] = _fused_plan(request) if name == "fused" else _staged_plan(request)
        except (ChunkPlanError, ModelNotFoundError) as exc:
            if len(wanted) == 1:
                raise
            errors[name] = exc
    if not plans:
        raise errors["fused"]
    considered = {name: {**plan.summary(), "in_worker_calibrated": complete[name]} for name, plan in plans.items()}
    chosen = choose_strategy(considered)
    warnings = plans[chosen].warnings + tuple(_passed_over(operator, considered, chosen))
    considered.update({name: {"error": str(exc)} for name, exc in errors.items()})
    return dataclasses.replace(plans[chosen], considered=considered if staged_possible else {}, warnings=warnings)


def _passed_over(operator: str, considered: dict, chosen: str) -> list[str]:
    """A line for each plan ``auto`` passed over although predicted faster, for want of its
    in-worker calibration, naming the command that measures it."""
    from explorer.core import paths

    seconds = considered[chosen]["predicted_seconds"]
    return [f"{name} (~{plan['predicted_seconds']:.1f} s predicted, against ~{seconds:.1f} s) was passed over: its "
            f"model has no in-worker calibration; `{paths.calibrate_command(operator)}` measures it"
            for name, plan in considered.items()
            if name != chosen and not plan["in_worker_calibrated"] and plan["predicted_seconds"] < seconds]


def choose_strategy(considered: dict) -> str:
    """The strategy ``auto`` takes among plans that fit (``{name: ChunkPlan.summary() +
    in_worker_calibrated}``): least predicted seconds among those whose task models all have
    their in-worker calibration, else among all; fused on a tie.  A bound without the
    in-worker term omits what a task needs around its run in a worker (the block it
    reads, a fan-out's stacked outputs, the store's copies), so it is not a bound that fits
    the way a complete one does."""
    return min(considered, key=lambda name: (not considered[name]["in_worker_calibrated"],
                                             considered[name]["predicted_seconds"], name != "fused"))


#: ``recommend_chunks``'s strategies: ``operators.pipeline.STRATEGIES`` and ``"auto"``.
STRATEGY_CHOICES = ("auto", "fused", "staged")


@dataclass
class _PlanRequest:
    """What ``recommend_chunks`` was asked, checked, and the worker baseline once known."""

    operator: str
    op: object
    shape: tuple
    limit_bytes: int
    threads: int
    confidence: float
    runs_dir: object
    workers: int
    baseline_given: object
    baseline: "WorkerBaseline | None" = None
    _model: object = None
    #: One chunk shape to plan instead of searching (:func:`plan_for_chunks`).
    chunks: tuple | None = None
    #: What a task's read touches whole, per axis (:func:`_read_unit`).
    read_unit: tuple | None = None

    def model(self):
        """The operator's (or pipeline's) task model, loaded once for every strategy."""
        if self._model is None:
            from explorer.plan.task_model import task_model

            self._model = task_model(self.operator, runs_dir=self.runs_dir, environment=self.environment)
        return self._model

    @property
    def is_pipeline(self) -> bool:
        """A chain or fan-out (``operators.pipeline.Pipeline``): fused and staged differ for it."""
        from operators.pipeline import Pipeline

        return isinstance(self.op, Pipeline)

    @property
    def environment(self):
        given = self.baseline_given
        return given.environment if isinstance(given, WorkerBaseline) else None

    def worker_baseline(self) -> "WorkerBaseline":
        """The given baseline, else this machine's (measured once; after a model was found, so
        that a missing model never starts a cluster)."""
        if self.baseline is None:
            given = self.baseline_given
            if isinstance(given, WorkerBaseline):
                self.baseline = given
            elif given is None or (isinstance(given, str) and given == "local"):
                self.baseline = local_worker_baseline(self.operator, self.runs_dir)
            elif isinstance(given, str):
                raise ValueError(f"baseline_bytes must be bytes, a WorkerBaseline or 'local', got {given!r}")
            else:
                self.baseline = WorkerBaseline(bytes=int(given), source="given")
        return self.baseline

    def worker_spec(self) -> WorkerSpec:
        """The workers every strategy plans for: the asked limit, threads and workers, the
        worker baseline (:meth:`worker_baseline`), Dask's pause fraction, and this machine's
        first data cache (the workers' where they run here, as a LocalCluster's do; the
        ranking's stride key, a tie-break, assumes a cluster's are alike)."""
        baseline = self.worker_baseline()
        return WorkerSpec(limit_bytes=self.limit_bytes, baseline_bytes=baseline.bytes,
                          threads_per_worker=self.threads, workers=self.workers,
                          pause_fraction=worker_pause_fraction(), baseline_source=baseline.source,
                          cache=l1_data_cache())

    def first_touch(self) -> dict:
        """The time term of the workers' fresh pages, ``{"first_touch": FirstTouch or None}``:
        :meth:`worker_baseline`'s measured rate and warm bytes, the rate saved for its machine
        when its workers found no cold page (``explorer.measure.worker_baseline.with_known_rate``);
        None for a baseline given as bytes, or with no rate known."""
        baseline = with_known_rate(self.operator, self.worker_baseline(), self.runs_dir)
        return {"first_touch": _first_touch_of(baseline)}

    def geometry(self, **operator_terms) -> VolumeGeometry:
        """The volume with the operator's whole axes and block multiple; ``operator_terms``: a
        fused plan's halo and item sizes (a staged plan's stages carry their own)."""
        op = self.op
        return VolumeGeometry(self.shape, whole_axes=tuple(op.whole_axes),
                              block_multiple=None if set(op.block_multiple) == {1} else op.block_multiple,
                              read_unit=self.read_unit, **operator_terms)

    def plan_options(self) -> dict:
        """The planner's keywords every strategy shares: the confidence, the operator, the one chunk shape."""
        return dict(confidence=self.confidence, operator=self.operator, chunks=self.chunks)


def _first_touch_of(baseline: "WorkerBaseline | None") -> "FirstTouch | None":
    """The time model's :class:`~explorer.plan.time_model.FirstTouch` of a measured baseline, or
    None when it measured no rate."""
    if baseline is None or baseline.first_touch_seconds_per_byte is None:
        return None
    return FirstTouch(baseline.first_touch_seconds_per_byte, baseline.first_touch_warm_bytes)


def _fused_timing(request: _PlanRequest) -> dict:
    """The fused plan's time-model terms: the learnt clock (a pipeline without its own, its
    members' composed), else the profiled speed; the overhead per graph task."""
    model = request.model()
    learnt = model.seconds_per_voxel
    clock = model.task_clock
    if clock is None and request.is_pipeline:
        clock = _members_clock(request.op, request)
    return dict(seconds_per_voxel=learnt if learnt is not None
                else run_seconds_per_voxel(model.info.get("seconds_per_voxel")),
                graph_task_seconds=_graph_task_seconds(model), task_clock=clock,
                run_fixed_seconds=model.run_fixed_seconds)


def _fused_plan(request: _PlanRequest) -> tuple[ChunkPlan, bool]:
    """One task per block: the operator's (or the pipeline's fused) task model; and whether
    that model has its in-worker calibration."""
    op = request.op
    model = request.model()
    time_terms = TimeTerms(**_fused_timing(request), **request.first_touch())
    geometry = request.geometry(halo=tuple(op.halo), itemsize=FLOAT32_BYTES, output_itemsize=fused_output_itemsize(op),
                                max_block_voxels=model.largest_block_voxels)
    plan = plan_chunks(geometry, model.predict_many, request.worker_spec(), time_terms,
                       warnings=tuple(model.warnings), **request.plan_options())
    branches = getattr(op, "branches", ())
    calibrated = model.excess is not None
    if not branches:
        return plan, calibrated
    # A composed model predicts Liu's order at each block: the plan's block fixes the run's;
    # a pipeline's own model learnt the order its spec is written in.
    liu = getattr(model.isolated, "branch_order", None)
    order = liu(plan.block, request.confidence) if callable(liu) else tuple(branches)
    return dataclasses.replace(plan, branch_order=tuple(order)), calibrated


def fused_output_itemsize(op) -> int:
    """Bytes per block voxel of what one task returns: a fused fan-out's task returns every
    branch's output (stacked), so it holds ``itemsize x branches``."""
    return int(np.dtype(op.output_dtype).itemsize) * max(1, len(getattr(op, "branches", ())))


def _member_environment(request: _PlanRequest, member):
    """The workers' environment as a member's calibration was stamped in it (None: this process's)."""
    from explorer.core.environment import restamped

    return restamped(request.environment, member.name)


def _member_timings(op, request: _PlanRequest) -> dict:
    """Each member's learnt timing (``explorer.plan.timing.TimingFit``), or None without one."""
    from explorer.plan.calibration import load_calibration

    timings = {}
    for member in op.members:
        cal = load_calibration(member.name, request.runs_dir, _member_environment(request, member))
        timings[member.name] = None if cal is None else cal.timing
    return timings


def _members_io(timings: dict) -> float:
    """The members' learnt I/O seconds per voxel (their mean), else the run's default."""
    learnt = [t.io_seconds_per_voxel for t in timings.values() if t is not None and t.io_seconds_per_voxel is not None]
    return float(np.mean(learnt)) if learnt else RUN_IO_SECONDS_PER_VOXEL


def _members_clock(op, request: _PlanRequest):
    """A fused pipeline's clock composed from its members' learnt clocks
    (``explorer.plan.time_model.composed_clock``), or None unless every member has one."""
    from explorer.plan.time_model import composed_clock

    timings = _member_timings(op, request)
    if any(t is None or t.clock is None for t in timings.values()):
        return None
    return composed_clock([timings[m.name].clock for m in op.members], _members_io(timings))


def _staged_stages(request: _PlanRequest) -> tuple[list, dict, tuple, bool]:
    """A staged plan's stages (each member's own task model, its in-worker calibration
    included, and learnt clock, else profiled speed), its time-model terms (the members' I/O,
    the graph-task overhead the fused plan uses), the members' warnings, and whether every
    member's task model has its in-worker calibration."""
    from explorer.plan.task_model import TaskModel
    from explorer.plan.calibration import load_calibration
    from explorer.plan.staged import PlanStage
    from explorer.model.composed import compose

    op = request.op
    fused = _loaded_isolated(request)  # the fused plan's composed model has the members' already
    isolated = (fused if getattr(fused, "composed", False)
                else compose(op, request.runs_dir)).members  # ModelNotFoundError naming every member without one
    speeds = [isolated[m.name].info.get("seconds_per_voxel") for m in op.members]
    # Without every member's profiled speed, the default work per voxel (the fused plan's
    # then) is shared by the stages: the two strategies then differ only by their structure.
    shared = None if all(s is not None for s in speeds) else (
        (run_seconds_per_voxel(None) - RUN_IO_SECONDS_PER_VOXEL) / len(op.members))
    stages, warnings, itemsize, calibrated, timings = [], [], FLOAT32_BYTES, True, {}
    for index, stage in enumerate(op.stages):
        for member in stage:
            environment = _member_environment(request, member)
            model = TaskModel(isolated[member.name], load_calibration(member.name, request.runs_dir, environment),
                              environment)
            timings[member.name] = None if model.calibration is None else model.calibration.timing
            stages.append(PlanStage(
                name=member.name, halo=tuple(member.halo), predict=model.predict_many, group=index,
                itemsize=itemsize, output_itemsize=np.dtype(member.output_dtype).itemsize,
                seconds_per_voxel=shared if shared is not None else float(model.info["seconds_per_voxel"]),
                task_clock=model.task_clock, max_block_voxels=model.largest_block_voxels))
            warnings.extend(w for w in model.warnings if w not in warnings)
            calibrated = calibrated and model.excess is not None
        itemsize = np.dtype(stage[0].output_dtype).itemsize
    model = request.model()  # the fused plan's run overheads: a run's fixed seconds are the same either way
    timing = dict(graph_task_seconds=_graph_task_seconds(model), io_seconds_per_voxel=_members_io(timings),
                  run_fixed_seconds=model.run_fixed_seconds)
    return stages, timing, tuple(warnings), calibrated


def _staged_plan(request: _PlanRequest) -> tuple[ChunkPlan, bool]:
    """One ``map_overlap`` per stage (:func:`_staged_stages`); and whether every member's task
    model has its in-worker calibration."""
    from explorer.plan.staged import plan_staged_chunks

    stages, timing, warnings, calibrated = _staged_stages(request)
    plan = plan_staged_chunks(request.geometry(), stages, request.worker_spec(),
                              TimeTerms(**timing, **request.first_touch()),
                              warnings=warnings, **request.plan_options())
    return plan, calibrated


def _read_unit(read_unit, shape) -> tuple:
    """The checked read unit, per axis positive and at most the axis; None: a SEG-Y's trace."""
    if read_unit is None:
        return (1,) * (len(shape) - 1) + (int(shape[-1]),)
    unit = tuple(int(n) for n in read_unit)
    if len(unit) != len(shape) or any(n < 1 for n in unit):
        raise ValueError(f"read_unit must be {len(shape)} positive lengths, got {read_unit!r}")
    return tuple(min(n, int(length)) for n, length in zip(unit, shape))


def predicted_seconds(operator: str, shape, chunks, *, strategy: str = "fused", workers: int = 1,
                      threads_per_worker: int = 1, runs_dir=None) -> np.ndarray:
    """What the planner's time model predicts for running ``operator`` on ``shape`` with each
    of the given chunk shapes (``(m, 3)`` or one) in ``strategy`` (``"fused"``, or a pipeline's
    ``"staged"``), on ``workers`` x ``threads_per_worker`` slots: the same terms
    :func:`recommend_chunks` weighs (``explorer.plan.time_model.fused_seconds`` and
    ``staged_seconds``), for chunkings it did not choose (``scripts/bench_pipeline_runs.py``
    sets them beside the measured seconds).  Needs no memory limit and starts no cluster: the
    first tasks' fresh pages are charged at this machine's saved rate, if one was measured; the
    reads are a SEG-Y's (:func:`recommend_chunks`' default ``read_unit``)."""
    from explorer.core import validate
    from explorer.plan.time_model import fused_seconds, staged_seconds

    operator = validate.operator(operator)
    shape = validate.shape(shape)
    if strategy not in ("fused", "staged"):
        raise ValueError(f"unknown strategy {strategy!r}: fused or staged")
    import operators

    request = _PlanRequest(operator, operators.get(operator), shape, 0, int(threads_per_worker), 0.99, runs_dir,
                           int(workers), None)
    slots = int(workers) * int(threads_per_worker)
    chunks = np.array(np.atleast_2d(chunks), dtype=np.int64)  # the axes it needs whole are whole, as a run makes them
    chunks[:, list(request.op.whole_axes)] = np.asarray(shape)[list(request.op.whole_axes)]
    touch = _first_touch_of(local_worker_baseline(operator, runs_dir, measure=False))
    if strategy == "staged" and request.is_pipeline:
        stages, timing, _, _ = _staged_stages(request)
        return staged_seconds(shape, stages, chunks, workers=int(workers), slots=slots, **timing, first_touch=touch,
                              read_unit=_read_unit(None, shape))
    return fused_seconds(shape, request.op.halo, chunks, slots=slots, **_fused_timing(request), first_touch=touch,
                         read_unit=_read_unit(None, shape))


def plan_for_chunks(operator: str, shape, chunks, memory_limit: int | str, *, strategy: str = "fused",
                    threads_per_worker: int = 1, confidence: float = 0.99, runs_dir=None, workers: int = 1,
                    baseline_bytes: "int | WorkerBaseline | None" = None, read_unit=None) -> ChunkPlan:
    """The plan :func:`recommend_chunks` would make of one chunk shape it did not choose: its
    footprint's bound and mean, its predicted seconds, in ``strategy`` (``"fused"``, or a
    pipeline's ``"staged"``).  ``ChunkPlanError`` when its bound does not fit ``memory_limit``
    (the message gives it).  The other arguments are :func:`recommend_chunks`'s."""
    from explorer.core import validate

    operator = validate.operator(operator)
    shape = validate.shape(shape)
    chunks = validate.shape(chunks)
    if strategy not in ("fused", "staged"):
        raise ValueError(f"unknown strategy {strategy!r}: fused or staged")
    import operators

    request = _PlanRequest(operator, operators.get(operator), shape, validate.size(memory_limit, "memory_limit"),
                           validate.positive_int(threads_per_worker, "threads_per_worker"),
                           validate.confidence(confidence), runs_dir, validate.positive_int(workers, "workers"),
                           baseline_bytes, chunks=tuple(chunks), read_unit=_read_unit(read_unit, shape))
    plan, _ = _staged_plan(request) if strategy == "staged" and request.is_pipeline else _fused_plan(request)
    return plan


def _loaded_isolated(request: _PlanRequest):
    """The isolated model of the request's task model when it loaded, else None."""
    from explorer.model.memory_model import ModelNotFoundError

    try:
        return request.model().isolated
    except ModelNotFoundError:
        return None


def _graph_task_seconds(model) -> float:
    learnt = model.graph_task_seconds
    return DEFAULT_GRAPH_TASK_SECONDS if learnt is None else learnt
