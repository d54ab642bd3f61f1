"""Production runs: an operator's Dask form on a SEG-Y volume, on a real Dask cluster.

``run("gst3d", "in.sgy", "out.zarr", memory_limit="2GiB", workers=2)`` reads the SEG-Y
lazily (each task reads its own traces), applies the operator's Dask form, writes the
output (``.zarr``, or ``.sgy``/``.segy``), and returns a :class:`RunResult`: the chunks
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

Output (``explorer.outputs``).  An existing output is refused unless ``overwrite``, and
even then only an output this tool wrote is replaced; the input itself never.  ``.zarr``:
the tasks store their blocks in parallel (``da.store``, zarr 3, one zarr chunk per Dask
block, no locks) into a hidden partial array beside the output, renamed into place when
complete; its attributes carry the operator, the input and the input's survey geometry.
``.sgy``/``.segy``: the same partial array, then ``operators.write_segy_like`` writes it on
the input's survey (every header copied, IEEE float32 samples) in this process a slab of
inlines at a time (at most 256 MiB), so the operator runs in parallel and only the
conversion is sequential.

Chunks.  ``"model"`` (default): ``explorer.recommend.recommend_chunks`` for the workers'
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
errors give ``status="error"``.  The run never waits forever: if every worker stays
paused (memory above ``distributed.worker.memory.pause``) or no worker is connected for
``stall_seconds``, the monitor cancels it as ``failed``.  A failed or interrupted run
leaves no partial output (removed again after the cluster closed, in case a task was
still running) and the old output, if any, untouched.

Observation (``refine=True``, default): :func:`explorer.live.observe` records every
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
same strategy: ``explorer.plan.candidates.compact_neighbour``): a fused plan's one block (the
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

Re-planning (``replan=True``, ``chunks="model"`` only, at most once): when a task exceeds
its bound, a re-planning thread recalibrates from the observations so far and asks
``explorer.plan.planner.replan`` (planning policy: only early, only when the running plan no
longer fits); if it gives a new plan, the computation is cancelled and restarted with it
into a fresh partial output.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer.live import MAX_OVER_BOUND_WARNINGS
from explorer.outputs import (ZARR_MARK, OutputError, branch_outputs, check_output, output_kind, partial_path,
                              put_in_place, remove_own)
from explorer.core.units import format_bytes, format_shape, parse_shape

__all__ = ["RunResult", "run"]

OK, FAILED, ERROR = "ok", "failed", "error"
#: Trials a run may make before it starts (module docstring, Trials): a cost control, not a
#: safety term (a trial runs tasks of a block whose plan's bound fits the workers).
MAX_TRIALS = 4
#: Seconds between two samples of the workers' memory metrics (and stall checks).
SAMPLE_SECONDS = 0.2
#: Output suffixes.


@dataclass
class RunResult:
    """What a production run did (``to_dict()`` is its JSON; the module docstring says how
    each figure is measured).

    ``status``: ``"ok"``; ``"failed"`` (workers lost, to memory or otherwise, or the
    cluster stalled: ``advice`` says what to change); ``"error"`` (bad input, no model,
    no plan fits, workers that cannot run the operator, a task raised).  ``error`` is one
    line.  ``chunks`` is one chunk shape (the first block's; axes the operator needs whole
    are whole), ``n_tasks`` the number of operator tasks (output blocks), ``plan`` the
    ``ChunkPlan`` dict when ``chunks_source == "model"``.  ``workers`` lists the worker
    addresses seen, in the order of ``worker_peak_bytes`` and ``worker_hwm_bytes``;
    ``worker_baseline_bytes`` the largest idle, warmed worker before the run.
    ``observations_recorded`` and ``tasks_over_bound`` (``None`` without a model to
    compare with) come from ``explorer.live``; ``run_id`` identifies the run's
    observations in the store; ``calibration`` is the one saved at the end (or
    ``None``); ``replanned_from`` the chunk shapes abandoned for a recalibrated plan;
    ``warnings`` one line each, for the run's output.
    """

    operator: str
    input: str
    output: str
    status: str
    shape: list[int] | None = None
    chunks: list[int] | None = None
    n_tasks: int | None = None
    seconds: float | None = None
    wall_seconds: float | None = None
    workers: list[str] = field(default_factory=list)
    worker_peak_bytes: list[int] = field(default_factory=list)
    worker_hwm_bytes: list[int] = field(default_factory=list)
    worker_baseline_bytes: int | None = None
    workers_restarted: int = 0
    memory_kills: int = 0
    error: str | None = None
    advice: str | None = None
    memory_limit_bytes: int | None = None
    n_workers: int | None = None
    threads_per_worker: int | None = None
    scheduler: str | None = None
    chunks_source: str | None = None
    plan: dict | None = None
    refine: bool = True
    run_id: str | None = None
    observations_recorded: int = 0
    tasks_over_bound: int | None = None
    calibration: dict | None = None
    replanned_from: list[list[int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: A fan-out's outputs, ``{branch: path}`` (``out.zarr/<branch>`` or ``<stem>-<branch>.sgy``).
    outputs: dict = field(default_factory=dict)
    #: The order a fan-out's tasks ran its branches in (the plan's, else the spec's).
    branch_order: list[str] = field(default_factory=list)
    #: How the pipeline ran: ``"fused"`` or ``"staged"`` (module docstring, Strategy).
    strategy: str | None = None
    #: The plan's blocks tried on the workers before the run (module docstring, Trials).
    trials: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for key in ("seconds", "wall_seconds"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


class _RunError(Exception):
    """Ends a run with ``status`` and a one-line message (never a traceback)."""

    def __init__(self, status: str, message: str, advice: str | None = None):
        super().__init__(message)
        self.status, self.advice = status, advice


@dataclass
class RunContext:
    """One production run: its request, then what the run learns as it goes.

    The request (set by :func:`run`): the operator, paths, the cluster to start or join,
    the chunks asked for, and the options.  Then, in order: the output ``kind`` and the
    volume ``shape``; the ``client``/``cluster``, the workers' ``limit`` and ``threads``;
    the measured ``baseline``; the chunk ``plan`` (or explicit/auto chunks) and the
    ``model`` tasks are checked against; the ``observer`` and ``monitor`` while computing.
    """

    operator: object
    input: str
    output: str
    result: RunResult
    requested_limit: int | None = None
    workers: int = 2
    threads: int = 1
    scheduler: str | None = None
    chunks_request: object = "model"
    runs_dir: object = None
    storage: str | None = None
    confidence: float = 0.99
    refine: bool = True
    replan: bool = True
    progress: object = None
    allowed_failures: int = 1
    stall_seconds: float = 60.0
    connect_timeout: float = 10.0
    source: str = "production"
    context: dict = field(default_factory=dict)
    calibrate: bool = True
    overwrite: bool = False
    strategy: str = "auto"
    trials: bool = True
    #: A fan-out's branch order asked for a run without a model plan (None: the spec's).
    branch_order: tuple | None = None
    # learnt as the run goes
    kind: str = ""
    shape: tuple = ()
    geometry: object = None
    partials: list = field(default_factory=list)
    limit: int = 0
    cluster: object = None
    client: object = None
    cluster_kind: str = ""
    baseline: object = None
    chunk: tuple = ()
    plan: object = None
    model: object = None
    store_future: object = None
    observer: object = None
    monitor: object = None
    started_at: float = 0.0
    done: int = 0
    total: int = 0


# --------------------------------------------------------------------------- monitor


class _Interrupt:
    """Cancels a running computation from another thread, saying why (``stall`` or ``replan``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.message = ""
        self.plan = None
        self._client = self._futures = None

    def arm(self, client, futures) -> None:
        with self._lock:
            self._client, self._futures = client, futures
            self.reason, self.message, self.plan = None, "", None

    def disarm(self) -> None:
        with self._lock:
            self._client = self._futures = None

    def __call__(self, reason: str, message: str = "", plan=None) -> bool:
        """Cancel the armed computation (first caller wins); False when none is armed."""
        with self._lock:
            if self._futures is None or self.reason is not None:
                return False
            self.reason, self.message, self.plan = reason, message, plan
            client, futures = self._client, self._futures
        client.cancel(futures)
        return True


class _Monitor(threading.Thread):
    """Samples the workers' memory metrics every ``SAMPLE_SECONDS`` and keeps, per worker
    address, the maximum; interrupts the computation when every worker stays paused or
    gone for ``stall_seconds``."""

    def __init__(self, client, interrupt: _Interrupt, stall_seconds: float):
        super().__init__(name="explorer-worker-monitor", daemon=True)
        self.client = client
        self.interrupt = interrupt
        self.stall_seconds = stall_seconds
        self.peaks: dict[str, int] = {}
        self.stalled_since: float | None = None
        self.stall_reason = ""
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        with self._lock:
            for address, info in workers.items():
                memory = int((info.get("metrics") or {}).get("memory") or 0)
                self.peaks[address] = max(self.peaks.get(address, 0), memory)
            statuses = [str(info.get("status", "running")).lower() for info in workers.values()]
            if not workers or all("paused" in s for s in statuses):
                if self.stalled_since is None:
                    self.stalled_since = time.monotonic()
                self.stall_reason = ("no worker is connected" if not workers else
                                     "every worker is paused (memory above the pause threshold)")
            else:
                self.stalled_since = None
        if self.stalled_since is not None and time.monotonic() - self.stalled_since > self.stall_seconds:
            self.interrupt("stall", f"no progress for {self.stall_seconds:g} s: {self.stall_reason}")

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_SECONDS):
            try:
                self.sample()
            except Exception:  # the cluster is closing
                if self._halt.is_set():
                    return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class _Replanner(threading.Thread):
    """Decides whether tasks over their bound restart the run with a new plan (at most once).

    Woken by the observer's ``on_over_bound``: flushes the observations, recalibrates
    (every in-worker group of this environment, the run's own included), and asks
    ``explorer.plan.planner.replan`` (the policy); a new plan interrupts the computation.
    While the run's groups do not yet identify the in-worker excess
    (``explorer.plan.excess.fit_excess``), it waits for the next task over the bound.
    Runs beside the computation so the main thread only waits on it.
    """

    def __init__(self, ctx: RunContext, interrupt: _Interrupt):
        super().__init__(name="explorer-replanner", daemon=True)
        self.ctx = ctx
        self.interrupt = interrupt
        self.wanted = threading.Event()
        self._halt = threading.Event()

    def on_over_bound(self, _observation) -> None:
        self.wanted.set()

    def run(self) -> None:
        while not self._halt.is_set():
            if self.wanted.wait(0.1):
                self.wanted.clear()
                if self._decide():
                    return

    def stop(self) -> None:
        self._halt.set()

    def _decide(self) -> bool:
        """True once decided (restarted, carried on, or failed); False to wait for more evidence."""
        ctx = self.ctx
        from explorer.plan.task_model import TaskModel
        from explorer.plan.calibration import calibrate
        from explorer.plan.planner import REPLAN_MAX_DONE_FRACTION, replan
        from explorer.plan.chunk_plan import ChunkPlanError

        done_fraction = ctx.done / max(ctx.total, 1)
        if done_fraction > REPLAN_MAX_DONE_FRACTION:
            return True
        ctx.observer.flush()
        try:
            cal = calibrate(ctx.operator.name, ctx.observer.store, ctx.model.isolated, confidence=ctx.confidence,
                            runs_dir=ctx.runs_dir, environment=ctx.baseline.environment)
            if cal is None or cal.excess is None:
                return False
            ctx.result.calibration = cal.to_dict()
            model = TaskModel(ctx.model.isolated, cal)
            ctx.observer.model = model  # later tasks are checked against the recalibrated bound
            new = replan(ctx.plan, model.predict_many, done_fraction=done_fraction)
        except (ChunkPlanError, ValueError, OSError) as exc:
            ctx.result.warnings.append(f"re-planning failed, the run continues with its plan: {_one_line(exc)}")
            return True
        if new is None:
            ctx.result.warnings.append("tasks exceeded their bound, but the running plan still fits its budget "
                                       "under the recalibrated model: not re-planned")
        else:
            self.interrupt("replan", plan=new)
        return True


# --------------------------------------------------------------------------- helpers


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _whole(op, shape, chunk):
    """The chunk shape with the operator's whole axes whole and every axis at most the shape."""
    return tuple(int(n) if axis in op.whole_axes else min(int(c), int(n))
                 for axis, (n, c) in enumerate(zip(shape, chunk)))


def _default_memory_limit(n_workers: int) -> int:
    import psutil

    return int(psutil.virtual_memory().total // max(1, n_workers))


def _terminate_fraction() -> float:
    import dask.config

    value = dask.config.get("distributed.worker.memory.terminate", 0.95)
    return float(value) if value else 1.0


def _regular(chunks) -> bool:
    return all(len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0]) for c in chunks)


class ZarrTarget:
    """Where tasks store their blocks: a zarr array by path, opened once per process.

    ``da.store(..., return_stored=True, load_stored=False)`` makes every store task
    return its target, and a persisted run keeps each task's result until the end: with
    the zarr ``Array`` itself as the target, every finished chunk kept its own unpickled
    copy of it (50-140 KB each, measured: 37 MiB per worker for 1,000 chunks).  This
    target pickles as its path, so a finished chunk holds a few bytes.
    """

    _open: dict = {}

    def __init__(self, path, shape, dtype):
        self.path, self.shape, self.dtype = str(path), tuple(shape), np.dtype(dtype)

    def __reduce__(self):
        return (ZarrTarget, (self.path, self.shape, self.dtype.str))

    def __setitem__(self, index, value) -> None:
        if not os.path.isdir(self.path):  # the run was given up and its partial output removed
            return
        array = ZarrTarget._open.get(self.path)
        if array is None:
            import zarr

            array = ZarrTarget._open[self.path] = zarr.open_array(self.path, mode="r+")
        array[index] = value


def _recommend(ctx: RunContext):
    from explorer.plan.recommend import recommend_chunks

    return recommend_chunks(ctx.operator.name, ctx.shape, ctx.limit, threads_per_worker=ctx.threads,
                            confidence=ctx.confidence, runs_dir=ctx.runs_dir, workers=ctx.result.n_workers or 1,
                            baseline_bytes=ctx.baseline, strategy=ctx.strategy)


def _suggestion(ctx: RunContext) -> str:
    """The advice after a worker was lost to memory."""
    name, limit, threads = ctx.operator.name, ctx.limit, ctx.threads
    cmd = (f"explore chunks {name} --shape {format_shape(ctx.shape)} "
           f"--memory-limit {format_bytes(limit).replace(' ', '')} --threads {threads}")
    try:
        plan = _recommend(ctx)
        lower = f"lower the chunk size ({cmd} suggests {format_shape(plan.chunks)} for this limit)"
    except Exception:
        lower = f"lower the chunk size (run `explore {name}`, then `{cmd}`)"
    threads_part = f", or use fewer --threads (now {threads})" if threads > 1 else ""
    return f"a worker exceeded its memory limit: {lower}, or raise --memory-limit{threads_part}"


# --------------------------------------------------------------------------- run


def run(
    operator: str,
    input_path,
    output_path,
    *,
    memory_limit=None,
    workers: int = 2,
    threads_per_worker: int = 1,
    scheduler: str | None = None,
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
) -> RunResult:
    """Run ``operator`` on the SEG-Y at ``input_path`` into ``output_path`` on Dask.

    ``memory_limit`` (bytes or ``"2GiB"``, per worker; default total RAM / ``workers``),
    ``workers`` and ``threads_per_worker`` shape the ``LocalCluster`` started here
    unless ``scheduler`` (an address, reached within ``connect_timeout`` seconds) names
    an existing cluster.  ``chunks``: ``"model"``, ``"auto"``, ``"AxBxC"`` or a tuple.
    ``progress(done, total)`` is called (from this thread) whenever more operator tasks
    have finished.  ``refine`` observes the tasks (``explorer.live``) into the store under
    ``runs_dir`` (or ``storage``) as ``source`` records with ``context`` added, and
    ``calibrate`` recalibrates at the end; ``replan`` allows one restart with a
    recalibrated plan; ``allowed_failures`` is the ``distributed.scheduler.allowed-failures``
    of a cluster started here; ``stall_seconds`` bounds how long every worker may stay
    paused or absent.  ``strategy``: ``"auto"``, ``"fused"`` or ``"staged"`` (a pipeline's;
    module docstring).  ``branch_order``: a fan-out's branches in the order its tasks run
    them when the chunks are not the model's (a model plan brings its own order; default: as
    written).  ``trials``: time the plan's block on the workers first when they never ran
    it (module docstring, Trials).  See the module docstring for every measured field; bad input and failures
    come back as ``status`` ``"error"``/``"failed"`` with a one-line ``error``, not as
    exceptions.
    """
    wall_started = time.perf_counter()
    result = RunResult(operator=str(operator), input=os.fspath(input_path), output=os.fspath(output_path),
                       status=OK, refine=bool(refine), scheduler=scheduler)
    ctx = RunContext(operator=operator, input=result.input, output=result.output, result=result,
                     workers=int(workers), threads=int(threads_per_worker), scheduler=scheduler,
                     chunks_request="model" if chunks is None else chunks, runs_dir=runs_dir, storage=storage,
                     confidence=float(confidence), refine=bool(refine), replan=bool(replan), progress=progress,
                     allowed_failures=int(allowed_failures), stall_seconds=float(stall_seconds),
                     connect_timeout=float(connect_timeout), source=source, context=dict(context or {}),
                     calibrate=bool(calibrate), overwrite=bool(overwrite), strategy=strategy, trials=bool(trials),
                     branch_order=None if branch_order is None else tuple(branch_order))
    try:
        _prepare(ctx, memory_limit)
        _connect(ctx)
        _measure_workers(ctx)
        _choose_chunks(ctx)
        _compute(ctx)
    except _RunError as exc:
        result.status, result.error = exc.status, str(exc)
        result.advice = result.advice or exc.advice
    except Exception as exc:  # anything unforeseen still ends as one line
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        result.status, result.error = ERROR, _one_line(exc)
    finally:
        _close_quietly(ctx.client, ctx.cluster)
        for path in ctx.partials:  # again: a task still running at the end may have written into one
            remove_own(path)
    result.wall_seconds = time.perf_counter() - wall_started
    return result


def _prepare(ctx: RunContext, memory_limit) -> None:
    """The operator, the output kind, the volume's shape; the store starts opening."""
    import operators
    from explorer.core.plugins import load_plugins
    from operators.segy import SegyGeometryError, segy_geometry

    load_plugins()
    try:
        ctx.operator = operators.get(ctx.operator)
    except (KeyError, operators.SpecError) as exc:
        raise _RunError(ERROR, exc.args[0]) from None
    branches = getattr(ctx.operator, "branches", ())
    try:
        if branches and output_kind(ctx.output) == "segy":  # one file per branch, each checked
            ctx.kind = "segy"
            ctx.result.outputs = branch_outputs(ctx.output, branches)
            for path in ctx.result.outputs.values():
                check_output(path, overwrite=ctx.overwrite, input_path=ctx.input)
        else:
            ctx.kind = check_output(ctx.output, overwrite=ctx.overwrite, input_path=ctx.input)
            ctx.result.outputs = branch_outputs(ctx.output, branches) if branches else {}
    except OutputError as exc:
        raise _RunError(ERROR, str(exc)) from None
    try:
        ctx.geometry = segy_geometry(ctx.input)
    except (SegyGeometryError, OSError) as exc:
        raise _RunError(ERROR, str(exc) if isinstance(exc, SegyGeometryError) else _one_line(exc)) from None
    ctx.shape = tuple(ctx.geometry.shape)
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


def _connect(ctx: RunContext) -> None:
    """Join the cluster at ``scheduler``, or start a LocalCluster; the workers' limit and threads."""
    import dask
    from distributed import Client, LocalCluster

    result = ctx.result
    if ctx.scheduler:
        try:
            ctx.client = Client(ctx.scheduler, timeout=f"{ctx.connect_timeout:g}s")
        except Exception as exc:
            raise _RunError(ERROR, f"cannot connect to scheduler {ctx.scheduler} within {ctx.connect_timeout:g} s "
                                   f"({_one_line(exc)}): is a scheduler running there?") from None
        info = ctx.client.scheduler_info(n_workers=-1).get("workers", {})
        if not info:
            raise _RunError(FAILED, f"scheduler {ctx.scheduler} has no workers")
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
    else:
        ctx.limit = ctx.requested_limit or _default_memory_limit(ctx.workers)
        with dask.config.set({"distributed.scheduler.allowed-failures": ctx.allowed_failures}):
            ctx.cluster = LocalCluster(n_workers=ctx.workers, threads_per_worker=ctx.threads, memory_limit=ctx.limit,
                                       processes=True, dashboard_address=None, silence_logs=logging.CRITICAL,
                                       preload=["explorer.measure.inworker"],  # workers leave Ctrl-C to this process
                                       # no dashboard; its HTTP server (health checks) on a free port
                                       scheduler_kwargs={"dashboard_address": ":0"})
        ctx.client = Client(ctx.cluster)
        result.n_workers, ctx.cluster_kind = ctx.workers, "LocalCluster"
    result.threads_per_worker = ctx.threads
    result.memory_limit_bytes = int(ctx.limit)
    _prepare_workers(ctx)


def _prepare_workers(ctx: RunContext) -> None:
    """Every worker, now and later, gets the profiling server's allocator setting
    (``explorer.measure.workersetup``), before its baseline is measured and before any task."""
    from explorer.measure.workersetup import prepare_workers, unpinned_warning

    try:
        pinned = prepare_workers(ctx.client)
    except Exception as exc:  # the workers cannot import explorer, or one vanished meanwhile
        raise _RunError(ERROR, f"cannot set up the workers' allocator ({_one_line(exc)}): the workers need "
                               f"memory-explorer installed") from None
    warning = unpinned_warning(pinned)
    if warning:
        ctx.result.warnings.append(warning)


def _measure_workers(ctx: RunContext) -> None:
    """Warm the operator on every worker, check the paths, measure the baseline."""
    from explorer.measure.worker_baseline import WorkerError, measure_worker_baseline

    out_dir = os.path.dirname(os.path.abspath(ctx.output)) or "."
    try:
        ctx.baseline = measure_worker_baseline(ctx.client, ctx.operator.name,
                                               readable=(os.path.abspath(ctx.input),), writable=(out_dir,))
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
            _try_blocks(ctx)
        except (ChunkPlanError, ModelNotFoundError, ModelFileError, CalibrationFileError) as exc:
            raise _RunError(ERROR, str(exc)) from None
        result.plan, result.chunks_source = ctx.plan.to_dict(), "model"
        result.warnings.extend(ctx.plan.warnings)
        chunk = tuple(ctx.plan.chunks)
    elif isinstance(request, str) and request == "auto":
        chunk = tuple(int(c[0]) for c in operators.read_segy(ctx.input, chunks="auto").chunks)
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
    if ctx.chunk != chunk and result.chunks_source == "explicit":
        reasons = []
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


def _trial_volume(op, block, slots: int) -> tuple[tuple, tuple]:
    """``(volume_shape, chunks)`` of a trial (``explorer.plan.candidates.grid_volume``): every task
    sees exactly ``block``.  Two chunks along split axes longer than twice their halo, one at
    a time until every one of the ``slots`` can run two tasks (a worker's first task of a run
    is slower than its later ones: ``explorer.plan.timing.fit_clock`` times the later ones);
    one chunk along the others."""
    from explorer.plan.candidates import grid_volume

    counts, tasks = [1] * len(block), 1
    for axis, (b, h) in enumerate(zip(block, op.halo)):
        if tasks >= 2 * slots:
            break
        if axis not in op.whole_axes and b - h > h:
            counts[axis], tasks = 2, tasks * 2
    return grid_volume(block, op.halo, op.whole_axes, counts)


@dataclass(frozen=True)
class _TrialJob:
    """One block to try: the operator (a spec, or a staged plan's member) whose task runs it,
    and the plan it is for."""

    operator: str
    block: tuple
    plan: object
    predicted_seconds_per_voxel: float | None


def _try_blocks(ctx: RunContext) -> None:
    """Trials on the run's workers of the plan's blocks and of its compact neighbour's until
    the plan's blocks are ones they ran (module docstring, Trials); then the baseline is
    measured and the plan made again."""
    import shutil
    import tempfile

    if not (ctx.trials and ctx.threads == 1 and ctx.plan.slots > 1 and not ctx.plan.block_clocked
            and _trial_jobs(ctx, ctx.plan)):
        return  # the clock times tasks alone in one-thread workers (calibration.fit_timing): so do trials
    out_dir = os.path.dirname(os.path.abspath(ctx.output)) or "."
    tmp = Path(tempfile.mkdtemp(prefix=".explorer-trial-", dir=out_dir))  # the workers can write there
    try:
        while len(ctx.result.trials) < MAX_TRIALS and not ctx.plan.block_clocked:
            jobs = [job for plan in _trial_plans(ctx) for job in _trial_jobs(ctx, plan)]
            unique = list({(job.operator, job.block): job for job in jobs}.values())
            if not unique:
                break  # nothing of the plan's left that a trial can time
            for job in unique[:MAX_TRIALS - len(ctx.result.trials)]:
                if not _trial(ctx, job, tmp):
                    return
            ctx.plan = _recommend(ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if ctx.result.trials:
            _measure_workers(ctx)  # what the trials left in the workers is part of the baseline now
            ctx.plan = _recommend(ctx)
            if not ctx.plan.block_clocked:
                _timed_plan_instead(ctx)


def _timed_plan_instead(ctx: RunContext) -> None:
    """Once the trials are spent with the plan's own blocks untimed, the fastest predicted of
    the plans whose blocks the workers did time (each tried plan, planned again): a time
    measured beats one the volume curve only promises (the curve under-predicted every
    elongated block the trials found)."""
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.plan.recommend import plan_for_chunks

    tried = {(t["strategy"], tuple(t["chunks"])) for t in ctx.result.trials}
    timed = []
    for strategy, chunks in sorted(tried):
        try:
            plan = plan_for_chunks(ctx.operator.name, ctx.shape, chunks, ctx.limit, strategy=strategy,
                                   threads_per_worker=ctx.threads, confidence=ctx.confidence, runs_dir=ctx.runs_dir,
                                   workers=ctx.result.n_workers or 1, baseline_bytes=ctx.baseline)
        except ChunkPlanError:
            continue
        if plan.block_clocked:
            timed.append(plan)
    if timed:
        best = min(timed, key=lambda p: p.predicted_seconds)
        ctx.result.warnings.append(
            f"the trials were spent before the plan's own blocks were timed: ran {best.strategy} "
            f"{format_shape(best.chunks)} (~{best.predicted_seconds:.2f} s, timed) rather than {ctx.plan.strategy} "
            f"{format_shape(ctx.plan.chunks)} (~{ctx.plan.predicted_seconds:.2f} s by block volume)")
        ctx.plan = best


def _trial_plans(ctx: RunContext) -> list:
    """The plan, and the plan of its compact neighbour's chunks in the same strategy
    (``explorer.plan.candidates.compact_neighbour``) when that fits."""
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.plan.candidates import compact_neighbour
    from explorer.plan.recommend import plan_for_chunks

    plans = [ctx.plan]
    neighbour = compact_neighbour(ctx.plan)
    if neighbour is not None:
        try:
            plans.append(plan_for_chunks(ctx.operator.name, ctx.shape, neighbour, ctx.limit,
                                         strategy=ctx.plan.strategy, threads_per_worker=ctx.threads,
                                         confidence=ctx.confidence, runs_dir=ctx.runs_dir,
                                         workers=ctx.result.n_workers or 1, baseline_bytes=ctx.baseline))
        except ChunkPlanError:
            pass
    return plans


def _trial_jobs(ctx: RunContext, plan) -> list[_TrialJob]:
    """The blocks of ``plan`` no worker has timed whose operator has its own in-worker
    calibration to add a trial to: a fused plan's block (the operator's, or the pipeline's
    with its own probes), or each staged stage's (its member's)."""
    from explorer.plan.calibration import load_calibration

    if plan.block_clocked:
        return []
    if plan.strategy == "staged":
        wanted = [(stage["operator"], stage["block"]) for stage in plan.stages if not stage["block_clocked"]]
    else:
        wanted = [(ctx.operator.name, plan.block)]
    jobs = []
    for name, block in wanted:
        own = load_calibration(name, ctx.runs_dir, _own_environment(ctx, name))
        if own is not None and own.excess is not None and own.timing.clock is not None:
            block = tuple(int(b) for b in block)
            by_volume = float(own.timing.clock.seconds_per_voxel_at([math.prod(block)])[0])
            jobs.append(_TrialJob(name, block, plan, by_volume))
    return jobs


def _own_environment(ctx: RunContext, name: str) -> dict:
    """The workers' environment stamp as ``name``'s calibration was stamped in it (a staged
    stage's member has its own code version)."""
    from explorer.core.environment import restamped

    return ctx.baseline.environment if name == ctx.operator.name else restamped(ctx.baseline.environment, name)


def _trial(ctx: RunContext, job: _TrialJob, tmp: Path) -> bool:
    """One trial of ``job``'s block (module docstring, Trials), recorded in ``ctx.result.trials``
    and in the recalibrated clock; False when it did not end ok (the run goes on untried)."""
    import operators
    from explorer.plan.calibration import calibrate
    from explorer.search.store import Store
    from explorer.model.load import load_model

    index = len(ctx.result.trials)
    op = operators.get(job.operator)
    volume, chunks = _trial_volume(op, job.block, job.plan.slots)
    source = tmp / f"trial-{index}.sgy"
    operators.write_segy(source, operators.synthetic_volume(volume, seed=index))
    order = job.plan.branch_order if job.operator == ctx.operator.name else ()
    trial = run(job.operator, source, tmp / f"trial-{index}.zarr", scheduler=ctx.client.scheduler.address,
                chunks=chunks, runs_dir=ctx.runs_dir, storage=ctx.storage, confidence=ctx.confidence,
                replan=False, calibrate=False, source="probe", strategy="fused", trials=False,
                context={"trial": index, "for": ctx.operator.name, "for_shape": list(ctx.shape),
                         "for_chunks": list(job.plan.chunks)},
                branch_order=order or None)
    source.unlink()
    record = {"operator": job.operator, "strategy": job.plan.strategy, "chunks": list(job.plan.chunks),
              "block": list(job.block), "status": trial.status, "n_tasks": trial.n_tasks,
              "tasks_over_bound": trial.tasks_over_bound, "predicted_seconds_per_voxel": job.predicted_seconds_per_voxel,
              "seconds": round(trial.wall_seconds or 0.0, 3)}
    ctx.result.trials.append(record)
    if trial.status != "ok":
        ctx.result.warnings.append(f"trial of {job.operator}'s block {format_shape(job.block)} {trial.status}: "
                                   f"{trial.error}")
        return False
    cal = calibrate(job.operator, Store(ctx.runs_dir, ctx.storage), load_model(job.operator, runs_dir=ctx.runs_dir),
                    confidence=ctx.confidence, runs_dir=ctx.runs_dir, environment=_own_environment(ctx, job.operator))
    if cal is None or cal.timing.clock is None:
        return False
    record["measured_seconds_per_voxel"] = float(cal.timing.clock.seconds_per_voxel_at([math.prod(job.block)],
                                                                                         [job.block])[0])
    return True


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
    from explorer.live import observe

    replanner = None
    if ctx.replan and result.chunks_source == "model" and ctx.model is not None:
        replanner = _Replanner(ctx, interrupt)
    ctx.observer = observe(
        ctx.client, ctx.operator.name, store=store, model=ctx.model, confidence=ctx.confidence, source=ctx.source,
        context={"cluster": ctx.cluster_kind, "n_workers": result.n_workers, "chunks": list(ctx.chunk),
                 "volume_shape": list(ctx.shape), "output": ctx.kind, **ctx.context},
        on_over_bound=replanner.on_over_bound if replanner else None, warn=False, windowed=True,
    ).start()
    result.run_id = ctx.observer.run_id
    if replanner is not None:
        replanner.start()
    return replanner


def _store(ctx: RunContext, partial: Path, interrupt: _Interrupt):
    """Compute the operator into a zarr array at ``partial``.  None when complete, or the
    plan to restart with when the re-planner interrupted.  Raises :class:`_RunError`."""
    import dask.array as da
    import zarr
    from distributed import KilledWorker, as_completed, futures_of

    import operators

    # Every block is one windowed read of the file: no chunk is kept for a neighbour's halo.
    x = operators.segy_volume(ctx.input)
    if ctx.result.strategy == "staged":
        y = ctx.operator.dask(x, strategy="staged", chunks=ctx.chunk)
    else:
        y = ctx.operator.dask(x, wrap=ctx.observer.wrap if ctx.observer is not None else None, chunks=ctx.chunk)
    arrays = y if isinstance(y, dict) else {None: y}  # a fan-out: one array per branch
    for name, a in arrays.items():
        if not _regular(a.chunks):  # zarr chunks must not be shared by two tasks
            arrays[name] = a.rechunk(tuple(c[0] for c in a.chunks))
    first = next(iter(arrays.values()))
    ctx.result.n_tasks = int(np.prod(first.numblocks))
    attributes = _output_attributes(ctx)
    targets = []
    if None in arrays:
        target = zarr.create_array(store=str(partial), shape=first.shape, chunks=tuple(c[0] for c in first.chunks),
                                   dtype=first.dtype)
        target.attrs[ZARR_MARK] = attributes
        targets.append(ZarrTarget(partial, first.shape, first.dtype))
    else:
        group = zarr.create_group(store=str(partial))
        group.attrs[ZARR_MARK] = {**attributes, "branches": list(arrays)}
        for name, a in arrays.items():
            array = group.create_array(name, shape=a.shape, chunks=tuple(c[0] for c in a.chunks), dtype=a.dtype)
            array.attrs[ZARR_MARK] = {**attributes, "branch": name}
            targets.append(ZarrTarget(partial / name, a.shape, a.dtype))
    stored = da.store(list(arrays.values()), targets, lock=False, compute=False, return_stored=True,
                      load_stored=False)

    started = time.perf_counter()
    persisted = ctx.client.persist(stored)
    futures = futures_of(persisted)
    ctx.done, ctx.total = 0, len(futures)
    interrupt.arm(ctx.client, futures)
    if ctx.progress is not None:
        ctx.progress(0, ctx.total)
    try:
        # A finished block is in the output already: its future is released at once, so the
        # scheduler and the workers forget its lineage (a persisted result keeps the
        # TaskState and spec of every task it came from, about 5 KB per graph task on each
        # worker: 37 MiB per worker for 1,000 chunks of gaussian, measured).
        for future in as_completed(futures):
            if future.status == "finished":
                future.release()
                ctx.done += 1
                if ctx.progress is not None:
                    ctx.progress(ctx.done, ctx.total)
                continue
            if interrupt.reason == "replan":
                return interrupt.plan
            if interrupt.reason == "stall":
                raise _RunError(FAILED, interrupt.message)
            exc = future.exception() if future.status == "error" else None
            if isinstance(exc, KilledWorker):
                line = " ".join(str(exc).split())
                raise _RunError(FAILED, f"workers died while running a task ({line[:200]})")
            raise _RunError(ERROR, _one_line(exc) if exc is not None else f"a task was {future.status}")
        return None
    finally:
        interrupt.disarm()
        ctx.result.seconds = (ctx.result.seconds or 0.0) + time.perf_counter() - started
        unfinished = [f for f in futures if f.status != "finished"]
        if unfinished:
            ctx.client.cancel(unfinished)
        del persisted, futures, unfinished


def _output_attributes(ctx: RunContext) -> dict:
    """What a Zarr output records of its making, and the input's survey geometry (so that
    ``operators.write_segy_like(path, array, like=attrs["input"])`` puts it back on it)."""
    from explorer import __version__

    g = ctx.geometry
    return {"writer": f"memory-explorer {__version__}", "operator": ctx.operator.name,
            "input": os.path.abspath(ctx.input),
            "geometry": {"inlines": list(g.inlines), "crosslines": list(g.crosslines),
                         "sample_interval_us": g.sample_interval_us, "first_sample_ms": g.first_sample_ms,
                         "sorting": g.sorting, "input_sample_format": g.sample_format}}


def _write_output(ctx: RunContext, partial: Path) -> None:
    """Put the complete result in place: the Zarr itself (a group of one array per branch for
    a fan-out), or a SEG-Y on the input's survey (one per branch, ``result.outputs``)."""
    if ctx.kind == "segy":
        import zarr

        from operators import write_segy_like

        started = time.perf_counter()
        pieces = ({ctx.output: (partial, ctx.operator.name)} if not ctx.result.outputs else
                  {path: (partial / branch, f"{branch} of {ctx.operator.name}")
                   for branch, path in ctx.result.outputs.items()})
        written = []
        for path, (array_path, what) in pieces.items():
            segy = partial_path(path)
            ctx.partials.append(segy)
            write_segy_like(segy, zarr.open_array(str(array_path), mode="r"), like=ctx.input,
                            history=f"{what} of {os.path.basename(ctx.input)}")
            written.append((segy, path))
        for segy, path in written:  # all written before any is put in place
            put_in_place(segy, path, overwrite=ctx.overwrite)
        ctx.result.seconds += time.perf_counter() - started
    else:
        put_in_place(partial, ctx.output, overwrite=ctx.overwrite)


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
        _record_run(ctx)
    except Exception as exc:
        result.warnings.append(f"run record not stored: {_one_line(exc)}")
    if not (ctx.calibrate and observer.recorded and ctx.model is not None):
        return
    try:
        from explorer.plan.calibration import calibrate

        cal = calibrate(ctx.operator.name, observer.store, ctx.model.isolated, confidence=ctx.confidence,
                        runs_dir=ctx.runs_dir, environment=ctx.baseline.environment)
        result.calibration = cal.to_dict() if cal is not None else result.calibration
    except Exception as exc:
        result.warnings.append(f"calibration not updated: {_one_line(exc)}")


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


def _close_quietly(client, cluster) -> None:
    for closing in (client, cluster):
        if closing is not None:
            try:
                closing.close()
            except Exception:
                pass
