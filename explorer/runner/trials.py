"""Trials before a run: the plan's block, its compact neighbour's and those of the plans the time
model tied with it, timed on the workers when they never ran them, so that the time model ranks
the plans on the workers' own clock (``explorer.runner.daskrun``'s docstring, Trials).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.core.units import format_shape
from explorer.runner.cluster import _measure_workers
from explorer.runner.context import MAX_TRIALS, TRIAL_SHARE, _recommend, read_unit

if TYPE_CHECKING:
    from explorer.runner.context import RunContext


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


def _try_blocks(ctx: RunContext, run) -> None:
    """Trials on the run's workers of the plan's blocks, its compact neighbour's and its tied
    plans' (:func:`_trial_plans`) until the plan's blocks are ones they ran (module docstring,
    Trials); then the baseline is measured and the plan made again.  ``run``: what runs a
    trial (``explorer.runner.daskrun.run``)."""
    import shutil
    import tempfile

    import operators

    if not (ctx.trials and ctx.threads == 1 and ctx.plan.slots > 1 and not ctx.plan.block_clocked
            and _trial_jobs(ctx, ctx.plan)):
        return  # the clock times tasks alone in one-thread workers (calibration.fit_timing): so do trials
    budget = TrialBudget.of_run(ctx.plan.predicted_seconds, _run_overhead_seconds(ctx))
    jobs = [job for plan in _trial_plans(ctx) for job in _trial_jobs(ctx, plan)]
    computing = _predicted_parts(ctx, jobs[0], 0.0)
    if not budget.allows(computing):  # past the share before its input is written: nothing to measure
        ctx.result.trials_skipped = skipped_because(budget.predict(computing), ctx.plan.predicted_seconds)
        return
    out_dir = os.path.dirname(os.path.abspath(ctx.output)) or "."
    tmp = Path(tempfile.mkdtemp(prefix=".explorer-trial-", dir=out_dir))  # the workers can write there
    try:
        write_per_voxel = _write_seconds_per_voxel(tmp, _trial_volume(operators.get(jobs[0].operator), jobs[0].block,
                                                                      jobs[0].plan.slots)[0][-1])
        first = _predicted_parts(ctx, jobs[0], write_per_voxel)
        if not budget.allows(first):
            ctx.result.trials_skipped = skipped_because(budget.predict(first), ctx.plan.predicted_seconds)
            return
        while len(ctx.result.trials) < MAX_TRIALS and not ctx.plan.block_clocked:
            jobs = [job for plan in _trial_plans(ctx) for job in _trial_jobs(ctx, plan)]
            unique = list({(job.operator, job.block): job for job in jobs}.values())
            if not unique:
                break  # nothing of the plan's left that a trial can time
            for job in unique[:MAX_TRIALS - len(ctx.result.trials)]:
                parts = _predicted_parts(ctx, job, write_per_voxel)
                if not budget.allows(parts):
                    ctx.result.trials_skipped = budget.why_not(parts, len(ctx.result.trials))
                    return
                started = time.perf_counter()
                ok = _trial(ctx, job, tmp, run)
                budget.spend(time.perf_counter() - started, parts)
                if not ok:
                    return
            ctx.plan = _recommend(ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if ctx.result.trials:
            _measure_workers(ctx)  # what the trials left in the workers is part of the baseline now
            ctx.plan = _recommend(ctx)
            if not ctx.plan.block_clocked:
                _timed_plan_instead(ctx)


def skipped_because(cost: float, run_seconds: float | None, share: float | None = None) -> str | None:
    """Why trials of predicted ``cost`` seconds should not run before a run of ``run_seconds``
    (``cost > share * run_seconds``, ``share`` :data:`TRIAL_SHARE` by default: the first trial's
    test of :class:`TrialBudget`, said), or None."""
    share = TRIAL_SHARE if share is None else share
    if run_seconds is None or cost <= share * run_seconds:
        return None
    return (f"the trials would take about {cost:.1f} s, more than {share:.0%} of the run's predicted "
            f"{run_seconds:.1f} s: the plan runs untried")


@dataclass
class TrialBudget:
    """The seconds trials may take before a run: ``share`` of the run's predicted seconds
    (:data:`TRIAL_SHARE`), spent as measured.

    A trial costs the parts predicted for it (``p``: its computing and writing its input,
    :func:`_predicted_parts`) plus what a run of ours costs around them (``o``: setting up and
    measuring the workers, the records, the refit calibration).  Before any trial ``o`` is what
    this run has spent setting up so far (``of_run``); after each, the most any trial took
    beyond its predicted parts (``spend``).  A trial runs only when ``spent + p + o <= budget``
    (``allows``), so the trials stay within the share but for one trial's misprediction."""

    seconds: float
    overhead: float
    spent: float = 0.0

    @classmethod
    def of_run(cls, run_seconds: float | None, overhead: float, share: float | None = None) -> "TrialBudget":
        share = TRIAL_SHARE if share is None else share
        return cls(math.inf if run_seconds is None else share * float(run_seconds), float(overhead))

    def predict(self, parts_seconds: float) -> float:
        return float(parts_seconds) + self.overhead

    def allows(self, parts_seconds: float) -> bool:
        return self.spent + self.predict(parts_seconds) <= self.seconds

    def spend(self, seconds: float, parts_seconds: float) -> None:
        self.spent += float(seconds)
        self.overhead = max(self.overhead, float(seconds) - float(parts_seconds))

    def why_not(self, parts_seconds: float, done: int) -> str:
        return (f"after {done} trial(s) ({self.spent:.1f} s), the next would take about "
                f"{self.predict(parts_seconds):.1f} s, past the {self.seconds:.1f} s the trials may take: "
                f"the plan runs as the trials left it")


def _predicted_parts(ctx: RunContext, job, write_seconds_per_voxel: float) -> float:
    """Predicted seconds of ``job``'s trial computing and of writing its input: its tasks'
    voxels times the block's seconds per voxel over the slots that run them at once, plus its
    input's voxels times the measured seconds to make and write one,
    ``n prod(block) spv / min(slots, n) + w prod(V)``."""
    import operators

    op = operators.get(job.operator)
    volume, chunks = _trial_volume(op, job.block, job.plan.slots)
    n_tasks = math.prod(-(-v // c) for v, c in zip(volume, chunks))
    per_task = math.prod(job.block) * (job.predicted_seconds_per_voxel or job.plan.seconds_per_voxel or 0.0)
    return n_tasks * per_task / max(1, min(job.plan.slots, n_tasks)) + write_seconds_per_voxel * math.prod(volume)


#: Traces per axis of the input written to time its writing (:func:`_write_seconds_per_voxel`).
WRITE_PROBE_TRACES = 32


def _write_seconds_per_voxel(tmp: Path, samples: int) -> float:
    """Seconds to make and write one voxel of a trial's input (a SEG-Y whose traces hold
    ``samples``), measured here by writing ``WRITE_PROBE_TRACES``^2 such traces into ``tmp``."""
    import operators

    n = WRITE_PROBE_TRACES
    path = tmp / "write-probe.sgy"
    started = time.perf_counter()
    operators.write_segy(path, operators.synthetic_volume((n, n, int(samples)), seed=0))
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds / (n * n * int(samples))


def _run_overhead_seconds(ctx: RunContext) -> float:
    """What this run spent so far on its input and on the workers' warm-up and baseline, and a
    run's fixed seconds: a trial, itself a run on the same cluster, pays as much (not the
    cluster's start, which it does not repeat)."""
    spent = ctx.timings.to_dict() if ctx.timings is not None else {}
    return (sum(spent.get(name, {}).get("seconds", 0.0) for name in ("prepare (input, output, store)",
                                                                     "workers (warm-up, baseline)"))
            + float(ctx.plan.run_fixed_seconds))


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
                                   workers=ctx.result.n_workers or 1, baseline_bytes=ctx.baseline,
                                   read_unit=read_unit(ctx))
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
    """The plan; the plan of its compact neighbour's chunks in the same strategy
    (``explorer.plan.candidates.compact_neighbour``) when that fits; then the plans the time
    model tied with it (``ChunkPlan.tied``, best first), so that the plan made again after the
    trials prices them on the workers' measured times, and the keys that broke the tie decide
    only where those times are within it again."""
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.plan.candidates import compact_neighbour
    from explorer.plan.recommend import plan_for_chunks

    neighbour = compact_neighbour(ctx.plan)
    wanted = ([] if neighbour is None else [tuple(neighbour)]) + [tuple(t["chunks"]) for t in ctx.plan.tied]
    plans = [ctx.plan]
    for chunks in dict.fromkeys(c for c in wanted if c != tuple(ctx.plan.chunks)):
        try:
            plans.append(plan_for_chunks(ctx.operator.name, ctx.shape, chunks, ctx.limit,
                                         strategy=ctx.plan.strategy, threads_per_worker=ctx.threads,
                                         confidence=ctx.confidence, runs_dir=ctx.runs_dir,
                                         workers=ctx.result.n_workers or 1, baseline_bytes=ctx.baseline,
                                         read_unit=read_unit(ctx)))
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


def _trial(ctx: RunContext, job: _TrialJob, tmp: Path, run) -> bool:
    """One trial of ``job``'s block (module docstring, Trials), recorded in ``ctx.result.trials``
    and in the recalibrated clock; False when it did not end ok (the run goes on untried).  ``run``
    runs it (``explorer.runner.daskrun.run``, handed down: a trial is a run)."""
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
                branch_order=order or None, check=False)
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
