"""A run as a typed request and its state (:class:`RunContext`), its result (:class:`RunResult`),
the one error that ends it, the plan ``recommend_chunks`` makes for it, and small helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.core.units import format_bytes, format_shape

__all__ = [
    "RunError",
    "RunResult",
]


OK, FAILED, ERROR = "ok", "failed", "error"
#: Trials a run may make before it starts (module docstring, Trials): a cost control, not a
#: safety term (a trial runs tasks of a block whose plan's bound fits the workers).
MAX_TRIALS = 4
#: Trials run only when they may repay themselves: their seconds, predicted before each and
#: measured after it, at most this share of the run's predicted seconds
#: (``explorer.runner.trials.TrialBudget``).  A plan chosen by a
#: trial saves at most the difference between two candidates' run times, a fraction of the run
#: (2.03 against 2.60 s, 22%, in the slip issue 36 measured); a cost control, not a safety term.
TRIAL_SHARE = 0.1
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
    compare with) come from ``explorer.runner.live``; ``run_id`` identifies the run's
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
    #: Why no trial ran although the plan's blocks were untimed (their cost against the run's), or None.
    trials_skipped: str | None = None
    #: Where the wall time went: ``{section: {"seconds", "count"}}`` (``explorer.core.timings``;
    #: ``trials`` is part of ``chunks``, ``records and calibration`` of ``compute and write``).
    timings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for key in ("seconds", "wall_seconds"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


class RunError(RuntimeError):
    """A run that did not end ``"ok"`` (``explorer.run`` with ``check=True``): its message is the
    result's one-line ``error`` (and ``advice``), ``result`` the whole :class:`RunResult` (what was
    measured before it ended: workers' peaks, restarts, the plan)."""

    def __init__(self, result: RunResult):
        message = f"{result.operator} run {result.status}: {result.error}"
        super().__init__(message + (f" ({result.advice})" if result.advice else ""))
        self.result = result


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
    #: The opened input (``explorer.runner.inputs.RunInput``).
    run_input: object = None
    #: Where the wall time goes (``explorer.core.timings.Timings``): ``result.timings`` at the end.
    timings: object = None
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


def _recommend(ctx: RunContext):
    from explorer.plan.recommend import recommend_chunks

    return recommend_chunks(ctx.operator.name, ctx.shape, ctx.limit, threads_per_worker=ctx.threads,
                            confidence=ctx.confidence, runs_dir=ctx.runs_dir, workers=ctx.result.n_workers or 1,
                            baseline_bytes=ctx.baseline, strategy=ctx.strategy, read_unit=read_unit(ctx))


def read_unit(ctx: RunContext) -> tuple | None:
    """What a task's read of the run's input touches whole (``RunInput.read_unit``), or None."""
    return tuple(ctx.run_input.read_unit) if ctx.run_input is not None and ctx.run_input.read_unit else None


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
