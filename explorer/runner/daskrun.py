"""Production runs: an operator's Dask form on a SEG-Y, Zarr or MDIO volume, on a real Dask cluster.

``run("gst3d", "in.sgy", "out.zarr", memory_limit="2GiB", workers=2)`` reads the input
lazily (each task reads its own window: ``explorer.runner.inputs``), applies the operator's
Dask form, writes the output (``.zarr``, ``.sgy``/``.segy`` or ``.mdio``), and returns a :class:`RunResult`: the chunks
used, the time taken, each worker's peak memory, workers lost, the status, and advice
when a worker was lost to memory.

Cluster.  A fresh ``LocalCluster`` (one process per worker, each with a nanny that
restarts it when its RSS passes ``distributed.worker.memory.terminate``, 95% of
``memory_limit``), or an existing cluster by ``scheduler`` address; then the workers'
own memory limit and threads are what the plan is made for, and the input and the
output's directory must be reachable from the workers.

Workers.  First every worker, and every worker that joins later, gets the profiling
server's allocator setting (``explorer.measure.workersetup.prepare_workers``: glibc's mmap threshold
pinned at 128 KiB, so a task's peak is the one the isolated profiles measured; a worker where
it does not take is named in ``warnings``).  Then, before planning, every worker loads and
warms the operator (``explorer.measure.inworker.warm_worker`` through ``client.run``): a worker that cannot load it
(its plugin module missing) or cannot read the input or write the output's directory
ends the run with one line naming it.  The largest resident set of these idle, warmed
workers is the plan's ``baseline_bytes`` (``worker_baseline_bytes``): measured on the
workers that do the work, with whatever they preload.

Output (``explorer.runner.outputs``).  An existing output is refused unless ``overwrite``, and
even then only an output this tool wrote is replaced; the input itself never.  ``.zarr``:
the tasks store their blocks in parallel (``da.store``, zarr 3, one zarr chunk per Dask
block, no locks) into a hidden partial array beside the output, renamed into place when
complete; its attributes carry the operator, the input and the input's survey geometry.
``.sgy``/``.segy``: the same partial array, then ``operators.write_segy_like`` writes it on
the input's survey (every header copied, IEEE float32 samples) in this process a slab of
inlines at a time (at most 256 MiB), so the operator runs in parallel and only the
conversion is sequential.  ``.mdio``: the MDIO input's dataset copied without its volume
variable into the partial group, the tasks storing into a new variable named after the
operator (``explorer.runner.writing``).

Chunks.  ``"model"`` (default): ``explorer.plan.recommend.recommend_chunks`` for the workers'
memory limit, threads and measured baseline.  ``"auto"``: Dask's, sized by input bytes
only.  ``"AxBxC"`` or a tuple: those.  Axes the operator needs whole are read whole
either way.

What is measured.
* ``seconds``: wall time from submitting the graph to the output being complete
  (for ``.sgy``, the conversion from the intermediate zarr included); cluster start-up,
  planning and the final bookkeeping are not in it (``wall_seconds`` has everything).
* ``worker_peak_bytes``: per worker address seen during the run (order of first
  sight), the largest ``metrics["memory"]`` (the worker process's RSS, as distributed's
  memory monitor reports it in heartbeats) sampled every ``SAMPLE_SECONDS`` by a monitor
  thread.  Heartbeats are periodic, so a short spike between two can be missed.
* ``worker_hwm_bytes``: per worker in ``workers``, the kernel's high-water RSS of its
  process (``VmHWM``, kept across the observation's resets:
  ``explorer.measure.inworker.worker_high_water_bytes``) since the run started (reset on every
  worker after the baseline is measured, so a long-lived cluster's earlier work does not
  count), read with ``client.run`` at the end: exact; ``None`` for a worker gone by then
  (a restarted worker's is since its restart).
* ``workers_restarted``: workers removed from the scheduler without being asked to
  (a nanny restart after a memory kill shows as one), from the scheduler's events;
  ``memory_kills``: the nannies' ``worker-restart-memory`` events among them.

Failure.  ``distributed.scheduler.allowed-failures`` is set to ``allowed_failures``
(default 1, Dask's is 3) for a cluster this function starts: a task whose worker dies
twice raises ``KilledWorker`` after two kills instead of four.  The run then ends with
``status="failed"``, a one-line ``error`` and ``advice``, never a traceback.  Other task
errors give ``status="error"``.  Either raises :class:`RunError` (carrying the result) unless
``check=False``.  The run never waits forever: if every worker stays
paused (memory above ``distributed.worker.memory.pause``) or no worker is connected for
``stall_seconds``, the monitor cancels it as ``failed``.  A failed or interrupted run
leaves no partial output (removed again after the cluster closed, in case a task was
still running) and the old output, if any, untouched.

Observation (``refine=True``, default): :func:`explorer.runner.live.observe` records every
operator task's block, peak and clocks in the store (``source="production"``, or
``"probe"`` for explore's in-worker probes), counts ``tasks_over_bound`` against the
in-worker task model (``explorer.plan.task_model.TaskModel``; ``None`` without a model), adds
one ``source="run"`` record (wall time, slots, largest worker high-water mark), and at the
end recalibrates (``runs/<operator>/calibration.json``).

Strategy (a pipeline's; ``operators.pipeline``): ``strategy="auto"`` (default) runs the
plan's (``recommend_chunks`` weighs ``fused`` against ``staged``), and ``fused`` with
explicit or ``auto`` chunks (no model to weigh them by); ``"fused"`` or ``"staged"`` asks for
one.  ``strategy`` in the result says which ran (``"fused"`` for a single operator).  A
staged run's tasks are its members', so they are neither checked against a bound nor
observed one by one (no ``production`` records, no recalibration, no re-planning): its
``run`` record (workers' peaks and seconds) is what refinement keeps of it.

Trials (``trials=True``, default; ``chunks="model"`` on several one-thread workers, the probes'
kind, whose tasks the clock times): the time model knows a task's seconds per voxel at the block
shapes workers have run (``explorer.plan.time_model.TaskClock``) and elsewhere only as a function of
the block's volume, which a block's shape can change by half or more (gst3d: 106 ns per voxel
on 133^3, 162 on 133x133x256).  So before the run, while the
plan's blocks are shapes the workers never ran, they are tried on the run's own workers, with
the blocks of the plan's compact neighbour (its longest split axis cut in twice as many chunks,
same strategy: ``explorer.plan.candidates.compact_neighbour``) and of the plans the time model
tied with it (``ChunkPlan.tied``, whose order its later keys chose): a fused plan's one block (the
operator's task, or the pipeline's when it has in-worker probes of its own), a staged plan's
block of each stage (its member's task).  A trial is a run of two tasks per slot (where the
block allows) of exactly that block on a synthetic volume (in a hidden directory beside the
output, removed after), recorded as in-worker probes (``context["trial"]``); the operator's
calibration is refitted and the plan made again, at most :data:`MAX_TRIALS` trials in all,
only for operators with their own in-worker calibration.  Each trial is in ``trials``
(operator, strategy, chunks, block, its tasks and how many were over their bound, seconds per
voxel by volume and measured, its wall seconds).  Afterwards the workers' baseline is measured
again (what the trials left resident counts) and the final plan made; if its blocks are still
untimed when the trials are spent, the fastest predicted plan among those the trials timed
runs instead (a warning says so).  A plan whose blocks the workers have run costs no trial, so
a shape is tried once per environment; but a run whose trials are spent leaves the candidates it
did not time to the next run, whose plan, made on the refitted clock, can then move to one of them.
Trials run only when they may repay themselves: all of them together take at most
:data:`explorer.runner.context.TRIAL_SHARE` (10%) of the run's predicted seconds, each predicted
before it runs (its computing, plus a run's overhead as measured: this run's own set-up before the
first, the trials' own after) and measured after (``explorer.runner.trials.TrialBudget``); a trial
that would pass the share does not run, and ``trials_skipped`` says why.

Re-planning (``replan=True``, ``chunks="model"`` only, at most once): when a task exceeds
its bound, a re-planning thread recalibrates from the observations so far and asks
``explorer.plan.planner.replan`` (planning policy: only early, only when the running plan no
longer fits); if it gives a new plan, the computation is cancelled and restarted with it
into a fresh partial output.
"""

from __future__ import annotations

import os
import time

from explorer.runner.live import MAX_OVER_BOUND_WARNINGS
from explorer.runner.outputs import (OutputError, branch_outputs, check_output, clean_leftovers, output_kind, partial_path,
                                     remove_own)
from explorer.core.interrupts import caused_by_interrupt
from explorer.core.timings import Timings
from explorer.core.units import format_bytes, format_shape, parse_shape
from explorer.runner.cluster import _connect, _measure_workers
from explorer.runner.context import (
    ERROR,
    FAILED,
    OK,
    RunContext,
    RunError,
    RunResult,
    _RunError,
    _one_line,
    _recommend,
    _suggestion,
    _terminate_fraction,
    _whole,
)
from explorer.runner.monitor import _Interrupt, _Monitor, _Replanner
from explorer.runner.records import _open_store, _record_run
from explorer.runner.trials import _try_blocks
from explorer.runner.writing import _store, _write_output

__all__ = [
    "RunError",
    "run",
]


# --------------------------------------------------------------------------- run


def run(
    operator,
    input,
    output,
    *,
    memory_limit=None,
    workers: int = 2,
    threads: int = 1,
    scheduler: str | None = None,
    client=None,
    chunks="model",
    runs_dir=None,
    storage: str | None = None,
    confidence: float = 0.99,
    refine: bool = True,
    progress=None,
    allowed_failures: int = 1,
    stall_seconds: float = 60.0,
    replan: bool = True,
    connect_timeout: float = 10.0,
    source: str = "production",
    context: dict | None = None,
    calibrate: bool = True,
    overwrite: bool = False,
    strategy: str = "auto",
    branch_order=None,
    trials: bool = True,
    check: bool = True,
) -> RunResult:
    """Run ``operator`` (a name, a spec or an ``Operator``) on ``input`` into ``output`` on Dask.

    ``input``: a SEG-Y file, a 3D Zarr array or an MDIO v1 survey (``explorer.runner.inputs``);
    ``output``: a ``.zarr``, a ``.sgy``/``.segy`` on a SEG-Y input's survey, or a ``.mdio`` from an
    MDIO input (its dataset with the result added).
    ``memory_limit`` (bytes or ``"2GiB"``, per worker; default total RAM / ``workers``),
    ``workers`` and ``threads`` (per worker) shape the ``LocalCluster`` started here
    unless ``scheduler`` (an address, reached within ``connect_timeout`` seconds) names
    an existing cluster.  ``chunks``: ``"model"``, ``"auto"``, ``"AxBxC"`` or a tuple.
    ``progress(done, total)`` is called (from this thread) whenever more operator tasks
    have finished.  ``refine`` observes the tasks (``explorer.runner.live``) into the store under
    ``runs_dir`` (or ``storage``) as ``source`` records with ``context`` added, and
    ``calibrate`` recalibrates at the end; ``replan`` allows one restart with a
    recalibrated plan; ``allowed_failures`` is the ``distributed.scheduler.allowed-failures``
    of a cluster started here; ``stall_seconds`` bounds how long every worker may stay
    paused or absent.  ``strategy``: ``"auto"``, ``"fused"`` or ``"staged"`` (a pipeline's;
    module docstring).  ``branch_order``: a fan-out's branches in the order its tasks run
    them when the chunks are not the model's (a model plan brings its own order; default: as
    written).  ``trials``: time the plan's block on the workers first when they never ran
    it (module docstring, Trials).  See the module docstring for every measured field.

    ``client``: a ``distributed.Client`` of the cluster to run on (the same as
    ``scheduler=client.scheduler.address``; the client itself is left open).  Starts a
    ``LocalCluster`` (closed at the end) when neither is given; writes the output, and with
    ``refine`` the store and calibration under ``runs_dir``.

    ``check`` (as ``subprocess.run``'s): a run that does not end ``"ok"`` raises
    :class:`RunError`, whose ``result`` is the :class:`RunResult`; ``check=False`` returns it
    with ``status`` ``"error"``/``"failed"`` and a one-line ``error`` instead.  Either way no
    traceback of the workers' reaches the caller, and what finished is kept.
    """
    if client is not None:
        if scheduler is not None:
            raise ValueError("give scheduler or client, not both")
        scheduler = client.scheduler.address
    wall_started = time.perf_counter()
    result = RunResult(operator=str(getattr(operator, "name", operator)), input=os.fspath(input), output=os.fspath(output),
                       status=OK, refine=bool(refine), scheduler=scheduler)
    ctx = RunContext(operator=operator, input=result.input, output=result.output, result=result,
                     workers=int(workers), threads=int(threads), scheduler=scheduler,
                     chunks_request="model" if chunks is None else chunks, runs_dir=runs_dir, storage=storage,
                     confidence=float(confidence), refine=bool(refine), replan=bool(replan), progress=progress,
                     allowed_failures=int(allowed_failures), stall_seconds=float(stall_seconds),
                     connect_timeout=float(connect_timeout), source=source, context=dict(context or {}),
                     calibrate=bool(calibrate), overwrite=bool(overwrite), strategy=strategy, trials=bool(trials),
                     branch_order=None if branch_order is None else tuple(branch_order))
    timings = ctx.timings = Timings()
    try:
        with timings.section("prepare (input, output, store)"):
            _prepare(ctx, memory_limit)
        with timings.section("cluster (start or connect, worker set-up)"):
            _connect(ctx)
        with timings.section("workers (warm-up, baseline)"):
            _measure_workers(ctx)
        with timings.section("chunks (plan, trials)"):
            _choose_chunks(ctx)
        with timings.section("compute and write"):
            _compute(ctx)
    except _RunError as exc:
        result.status, result.error = exc.status, str(exc)
        result.advice = result.advice or exc.advice
    except Exception as exc:  # anything unforeseen still ends as one line
        if caused_by_interrupt(exc):  # a Ctrl-C wrapped by an import: the user asked to stop
            raise KeyboardInterrupt from exc
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        result.status, result.error = ERROR, _one_line(exc)
    finally:
        with timings.section("close"):
            _close_quietly(ctx.client, ctx.cluster)
        for path in ctx.partials:  # again: a task still running at the end may have written into one
            remove_own(path)
    result.wall_seconds = time.perf_counter() - wall_started
    result.timings = timings.to_dict()
    if check and result.status != OK:
        raise RunError(result)
    return result


def _prepare(ctx: RunContext, memory_limit) -> None:
    """The operator, the output kind, the volume's shape; the store starts opening."""
    import operators
    from operators.plugins import load_plugins
    from explorer.runner.inputs import InputError, open_input

    load_plugins()
    try:
        ctx.operator = operators.get(ctx.operator)
    except (KeyError, operators.SpecError) as exc:
        raise _RunError(ERROR, exc.args[0]) from None
    try:
        ctx.run_input = open_input(ctx.input)
    except InputError as exc:
        raise _RunError(ERROR, str(exc)) from None
    branches = getattr(ctx.operator, "branches", ())
    from explorer.core.paths import runs_dir as resolved_runs_dir

    protected = (ctx.run_input.path, resolved_runs_dir(ctx.runs_dir))
    try:
        if branches and output_kind(ctx.output) == "segy":  # one file per branch, each checked
            ctx.kind = "segy"
            ctx.result.outputs = branch_outputs(ctx.output, branches)
            for path in ctx.result.outputs.values():
                check_output(path, overwrite=ctx.overwrite, input_path=ctx.run_input.path, protected=protected)
        else:
            ctx.kind = check_output(ctx.output, overwrite=ctx.overwrite, input_path=ctx.run_input.path,
                                    protected=protected)
            ctx.result.outputs = branch_outputs(ctx.output, branches) if branches else {}
    except OutputError as exc:
        raise _RunError(ERROR, str(exc)) from None
    for path in {ctx.output, *ctx.result.outputs.values()}:  # what a killed run of them left behind
        ctx.result.warnings.extend(clean_leftovers(path))
    if ctx.kind in ("segy", "mdio") and ctx.run_input.kind != ctx.kind:
        what = {"segy": "a SEG-Y output is written on the input's survey", "mdio": "an MDIO output is the input's "
                "dataset (coordinates, headers, trace mask) with the result added"}[ctx.kind]
        raise _RunError(ERROR, f"--output {ctx.output}: {what}, and {ctx.input} is not "
                               f"{ {'segy': 'SEG-Y', 'mdio': 'MDIO'}[ctx.kind]}: write a .zarr output")
    ctx.geometry = ctx.run_input.geometry
    ctx.shape = tuple(ctx.run_input.shape)
    ctx.result.shape = list(ctx.shape)
    # The store (Optuna, SQLite: ~0.9 s of CPU to import and open) opens while the
    # cluster starts, so that no observation waits for it during the computation.
    ctx.store_future = _open_store(ctx.operator.name, ctx.runs_dir, ctx.storage) if ctx.refine else None
    if not (isinstance(ctx.chunks_request, str) and ctx.chunks_request in ("model", "auto")):
        try:
            ctx.chunks_request = parse_shape(ctx.chunks_request)
        except ValueError as exc:
            raise _RunError(ERROR, f"--chunks: {exc}") from None
    from explorer.core import validate
    from explorer.plan.recommend import STRATEGY_CHOICES

    if ctx.strategy not in STRATEGY_CHOICES:
        raise _RunError(ERROR, f"--strategy {ctx.strategy!r}: one of {', '.join(STRATEGY_CHOICES)}")
    try:
        ctx.requested_limit = validate.size(memory_limit, "--memory-limit") if memory_limit is not None else None
        ctx.confidence = validate.confidence(ctx.confidence, "--confidence")
        ctx.workers = validate.positive_int(ctx.workers, "--workers")
        ctx.threads = validate.positive_int(ctx.threads, "--threads")
    except ValueError as exc:
        raise _RunError(ERROR, str(exc)) from None


def _choose_chunks(ctx: RunContext) -> None:
    """The chunk shape, and the in-worker task model to check tasks against (or None)."""
    import operators
    from explorer.plan.calibration import CalibrationFileError
    from explorer.plan.task_model import task_model
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.model.memory_model import ModelFileError, ModelNotFoundError

    result, op = ctx.result, ctx.operator
    request = ctx.chunks_request
    if isinstance(request, str) and request == "model":
        try:
            ctx.plan = _recommend(ctx)
            with ctx.timings.section("trials"):
                _try_blocks(ctx, run)
        except (ChunkPlanError, ModelNotFoundError, ModelFileError, CalibrationFileError) as exc:
            raise _RunError(ERROR, str(exc)) from None
        result.plan, result.chunks_source = ctx.plan.to_dict(), "model"
        result.warnings.extend(ctx.plan.warnings)
        chunk = tuple(ctx.plan.chunks)
    elif isinstance(request, str) and request == "auto":
        chunk = _auto_chunks(ctx)
        result.chunks_source = "auto"
    else:
        chunk = tuple(int(c) for c in request)
        result.chunks_source = "explicit"
    op = _in_plan_order(ctx, ctx.plan)
    from operators.pipeline import Pipeline

    staged_possible = isinstance(op, Pipeline)
    if ctx.plan is not None:
        result.strategy = ctx.plan.strategy
    else:  # explicit or auto chunks: nothing to weigh the strategies by
        result.strategy = "staged" if ctx.strategy == "staged" and staged_possible else "fused"
    ctx.chunk = _whole(op, ctx.shape, chunk)
    if result.chunks_source == "explicit" and result.strategy == "fused":
        # A chunk shorter than the halo is merged with its neighbour (as dask's overlap does):
        # the run's chunks are then the merged ones, and the summary says so.
        layout, depth = op.windowed_layout(ctx.shape, ctx.chunk)
        merged = tuple(int(layout[a][0]) if depth.get(a) else ctx.chunk[a] for a in range(3))
        short = [a for a in range(3) if merged[a] != ctx.chunk[a]]
        ctx.chunk = merged
    else:
        short = []
    if ctx.chunk != chunk and result.chunks_source == "explicit":
        reasons = []
        if short:
            reasons.append(f"a chunk shorter than {op.name}'s halo {format_shape(op.halo)} on axes {short} is merged "
                           f"with its neighbour")
        whole = [axis for axis in op.whole_axes if chunk[axis] != ctx.shape[axis]]
        if whole:
            reasons.append(f"{op.name} needs axes {whole} whole")
        larger = [axis for axis in range(3) if axis not in op.whole_axes and chunk[axis] > ctx.shape[axis]]
        if larger:
            reasons.append(f"axes {larger} are longer than the volume {format_shape(ctx.shape)}")
        result.warnings.append(f"chunks {format_shape(chunk)} become {format_shape(ctx.chunk)}: "
                               + "; ".join(reasons))
    if result.strategy == "staged":
        ctx.model = None  # its tasks are the members': no one bound to check them against
        if ctx.refine:
            result.warnings.append("a staged run's tasks are its members': they are not observed one by one "
                                   "(no task records, no recalibration); its run record keeps the workers' peaks")
        result.chunks = list(ctx.chunk)
        return
    try:
        ctx.model = task_model(op.name, ctx.runs_dir, environment=ctx.baseline.environment)
    except ModelNotFoundError:  # nothing to compare the tasks with
        ctx.model = None
    except (ModelFileError, CalibrationFileError) as exc:
        ctx.model = None
        result.warnings.append(f"tasks not checked against a bound: {exc}")
    result.chunks = list(ctx.chunk)


def _auto_chunks(ctx: RunContext) -> tuple:
    """Dask's ``chunks="auto"`` as a user reading the input would get it (by bytes only)."""
    import dask.array as da

    import operators

    if ctx.run_input.kind == "segy":
        array = operators.read_segy(ctx.input, chunks="auto")
    else:
        array = da.from_array(ctx.run_input.source(), chunks="auto")
    return tuple(int(c[0]) for c in array.chunks)


def _in_plan_order(ctx: RunContext, plan):
    """``ctx.operator`` set to run a fan-out's branches in ``plan``'s order (a model plan's;
    else the one asked, else the spec's), recorded in the result; returns it."""
    order = plan.branch_order if plan is not None and plan.branch_order else ctx.branch_order
    if order and getattr(ctx.operator, "branches", ()):
        ctx.operator = ctx.operator.in_order(order)
    ctx.result.branch_order = list(getattr(ctx.operator, "branch_order", ()))
    return ctx.operator


def _compute(ctx: RunContext) -> None:
    result = ctx.result
    interrupt = _Interrupt()
    ctx.monitor = _Monitor(ctx.client, interrupt, ctx.stall_seconds)
    try:
        ctx.monitor.sample()
    except Exception:
        pass
    ctx.monitor.start()
    ctx.started_at = time.time()
    replanner = _start_observing(ctx, interrupt)
    partials = ctx.partials
    try:
        while True:
            partial = partial_path(ctx.output)
            partials.append(partial)
            new_plan = _store(ctx, partial, interrupt)
            if new_plan is None:
                break
            result.replanned_from.append(list(ctx.chunk))
            result.warnings.append(f"a task exceeded its bound early: restarted with the recalibrated plan "
                                   f"{format_shape(new_plan.chunks)} (was {format_shape(ctx.chunk)})")
            ctx.plan, result.plan = new_plan, new_plan.to_dict()
            _in_plan_order(ctx, new_plan)
            ctx.chunk = _whole(ctx.operator, ctx.shape, new_plan.chunks)
            result.chunks = list(ctx.chunk)
            ctx.observer.context["chunks"] = list(ctx.chunk)
        _write_output(ctx, partials[-1])
    except _RunError as exc:
        result.status, result.error, result.advice = exc.status, str(exc), exc.advice
    finally:
        ctx.monitor.stop()
        if replanner is not None:
            replanner.stop()
        for path in partials:
            remove_own(path)
        with ctx.timings.section("records and calibration"):
            _finish(ctx)


def _start_observing(ctx: RunContext, interrupt: _Interrupt):
    """Start the observer (when ``refine``) and, for model plans, the re-planning thread."""
    result = ctx.result
    if not ctx.refine:
        return None
    try:
        store = ctx.store_future.result()
    except Exception as exc:
        result.warnings.append(f"observation off: the store did not open: {_one_line(exc)}")
        result.refine = ctx.refine = False
        return None
    from explorer.runner.live import observe

    replanner = None
    if ctx.replan and result.chunks_source == "model" and ctx.model is not None:
        replanner = _Replanner(ctx, interrupt)
    ctx.observer = observe(
        ctx.client, ctx.operator.name, store=store, model=ctx.model, confidence=ctx.confidence, source=ctx.source,
        context={"cluster": ctx.cluster_kind, "n_workers": result.n_workers, "chunks": list(ctx.chunk),
                 "volume_shape": list(ctx.shape), "read_unit": list(ctx.run_input.read_unit), "output": ctx.kind,
                 **ctx.context},
        on_over_bound=replanner.on_over_bound if replanner else None, warn=False, windowed=True,
    ).start()
    result.run_id = ctx.observer.run_id
    if replanner is not None:
        replanner.start()
    return replanner


def _finish(ctx: RunContext) -> None:
    """Worker peaks, restarts, observations, the run record and the calibration, whatever the outcome."""
    result = ctx.result
    monitor = ctx.monitor
    try:
        monitor.sample()
    except Exception:
        pass
    result.workers = list(monitor.peaks)
    result.worker_peak_bytes = [monitor.peaks[a] for a in result.workers]
    try:
        from explorer.measure.inworker import worker_high_water_bytes

        hwm = ctx.client.run(worker_high_water_bytes, on_error="ignore")
        result.worker_hwm_bytes = [int(hwm[a]) if isinstance(hwm.get(a), int) else None for a in result.workers]
    except Exception:
        pass
    try:
        removed = [msg for t, msg in ctx.client.get_events("all")
                   if t >= ctx.started_at - 1 and isinstance(msg, dict)
                   and msg.get("action") == "remove-worker" and not msg.get("expected")]
        kills = [msg for t, msg in ctx.client.get_events("worker-restart-memory") if t >= ctx.started_at - 1]
        result.workers_restarted, result.memory_kills = len(removed), len(kills)
    except Exception:
        pass
    _advise(ctx)
    if ctx.observer is not None:
        _close_observer(ctx)


def _advise(ctx: RunContext) -> None:
    result = ctx.result
    if result.memory_kills:
        result.advice = _suggestion(ctx)
        if result.status == FAILED and "workers died" in (result.error or ""):
            result.error = (f"a worker was lost to memory: its nanny killed it {result.memory_kills} time(s) above "
                            f"{_terminate_fraction():.0%} of its {format_bytes(ctx.limit)} limit while it ran "
                            f"{format_shape(result.chunks or [])} chunks, and the task was given up (KilledWorker)")
        if result.status == OK:
            result.warnings.append(
                f"{result.memory_kills} worker(s) exceeded their memory limit and were restarted; "
                f"the run recovered by retrying their tasks")
    elif result.status == FAILED and result.advice is None:
        remedy = _suggestion(ctx).split(": ", 1)[1]
        if "paused" in (result.error or ""):
            from explorer.plan.dask_config import worker_pause_fraction

            result.advice = (
                f"the workers' memory stayed above their pause threshold ({worker_pause_fraction():.0%} of "
                f"{format_bytes(ctx.limit)}) with no task finishing: raise --memory-limit (an idle worker alone "
                f"took {format_bytes(ctx.baseline.bytes)} here), or {remedy}")
        else:
            result.advice = ("workers died without their nanny reporting a memory kill (check the worker "
                             f"logs); if they ran out of memory: {remedy}")


def _close_observer(ctx: RunContext) -> None:
    """Store every observation and the run record, then recalibrate from them."""
    result, observer = ctx.result, ctx.observer
    observed = result.strategy != "staged"  # a staged run's tasks are not wrapped
    expected = result.n_tasks if observed and result.status == OK and result.error is None else None
    with ctx.timings.section("records: observations stored"):
        observer.close(expected=expected, timeout=2.0)
    result.observations_recorded = observer.recorded
    result.tasks_over_bound = observer.tasks_over_bound if ctx.model is not None else None
    result.warnings.extend(observer.warnings)
    if observer.tasks_over_bound > MAX_OVER_BOUND_WARNINGS:
        worst = max(o.peak_bytes / o.bound_bytes for o in observer.over_bound)
        result.warnings.append(f"{observer.tasks_over_bound} tasks exceeded their bound in all "
                               f"(the worst by {worst - 1:.0%}); the first {MAX_OVER_BOUND_WARNINGS} are above")
    result.warnings.extend(observer.errors)
    try:
        with ctx.timings.section("records: run record"):
            _record_run(ctx)
    except Exception as exc:
        result.warnings.append(f"run record not stored: {_one_line(exc)}")
    if not (ctx.calibrate and observer.recorded and ctx.model is not None):
        return
    try:
        from explorer.plan.calibration import calibrate

        with ctx.timings.section("records: calibration"):
            cal = calibrate(ctx.operator.name, observer.store, ctx.model.isolated, confidence=ctx.confidence,
                            runs_dir=ctx.runs_dir, environment=ctx.baseline.environment)
        result.calibration = cal.to_dict() if cal is not None else result.calibration
    except Exception as exc:
        result.warnings.append(f"calibration not updated: {_one_line(exc)}")


def _close_quietly(client, cluster) -> None:
    for closing in (client, cluster):
        if closing is not None:
            try:
                closing.close()
            except Exception:
                pass
