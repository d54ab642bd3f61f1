"""How the ``explore`` command reads results as text: probe progress, in-worker probes, the
strategies a plan weighed, a plan's largest block, an exploration's and a run's summary
(``explorer.cli`` prints them)."""

from __future__ import annotations

import math
import sys

from explorer.core.units import format_bytes, format_shape


def probe_progress(index, total, block, r) -> None:
    if r.status != "ok":
        line = f"{r.status}: {r.error}"
    else:
        line = (f"{r.n_tasks} tasks in a Dask worker, {r.seconds:.1f} s, worker baseline "
                f"{format_bytes(r.worker_baseline_bytes)}")
    print(f"[probe {index}/{total}] {format_shape(block):>15}  {line}", file=sys.stderr, flush=True)


def print_probes(probes: dict | None) -> None:
    if not probes:
        return
    if probes.get("skipped"):
        print(f"in-worker probes: skipped ({probes['skipped']})")
        return
    for line in probes.get("warnings", []):
        print(f"warning: {line}", file=sys.stderr)
    if probes.get("workers"):
        print(f"in-worker probes ran on {', '.join(probes['workers'])} (scheduler {probes.get('scheduler')})")
    cal = probes.get("calibration")
    excess = (cal or {}).get("excess")
    if excess is None:
        print(f"in-worker probes: {len(probes['runs'])} in {probes['seconds']:.1f} s; the excess is not identified")
        return
    timing = cal["timing"]
    print(f"in-worker probes: {len(probes['runs'])} in {probes['seconds']:.1f} s; a task in a worker needs the "
          f"isolated peak {excess['intercept_bytes'] / 2**20:+.2f} MiB {excess['bytes_per_voxel']:+.2f} B/voxel "
          f"(residual sd {format_bytes(excess['residual_sd'])}, {excess['method']} quantile)"
          + within_text(cal.get("within")) + f"; idle worker {format_bytes(probes['baseline_bytes'])}")
    if timing.get("seconds_per_voxel") is not None:
        g, fixed = timing.get("graph_task_seconds"), timing.get("run_fixed_seconds")
        print(f"in-worker time: {timing['operator_seconds_per_voxel'] * 1e9:.0f} ns/voxel in the operator, "
              f"{timing['io_seconds_per_voxel'] * 1e9:.0f} ns/voxel around it"
              + (f", {g * 1e3:.1f} ms per graph task" if g is not None else "")
              + (f", {fixed:.2f} s per run" if fixed is not None else ""))


def within_text(within: dict | None) -> str:
    """How much equal tasks of one run differ (``explorer.plan.excess.WithinFit``)."""
    if not within:
        return ""
    return (f", tasks of one run within sd {format_bytes(within['alpha_bytes'])} + {within['beta']:.1%} "
            f"({within['method']} quantile)")


def considered_text(plan) -> str:
    """The strategies weighed, one phrase each: chunks and predicted seconds, or why none."""
    parts = []
    for name, c in plan.considered.items():
        if "error" in c:
            parts.append(f"{name}: none fits" if "fits" in c["error"] else f"{name}: {c['error']}")
        else:
            parts.append(f"{name}: {format_shape(c['chunks'])} ~{c['predicted_seconds']:.3g} s, "
                         f"bound {format_bytes(c['upper_bytes'])}"
                         + ("" if c.get("in_worker_calibrated", True) else " without in-worker calibration"))
    return "; ".join(parts)


def _voxels_text(voxels: float) -> str:
    """``"N voxels"``, with the cube's edge when ``voxels`` is a cube (``"(216^3)"``)."""
    edge = round(voxels ** (1 / 3))
    return f"{voxels:,.0f} voxels" + (f" ({edge}^3)" if edge**3 == voxels else "")


def largest_block_text(plan) -> str:
    """The plan's cap on its block (``ChunkPlan.max_block_voxels``), a cube's edge when it is one."""
    return (f"{_voxels_text(plan.max_block_voxels)}, the largest measured in a worker (this plan's: "
            f"{math.prod(plan.block):,}; `explore {plan.operator} --probe-seconds S` learns and probes larger)")


def time_model_text(plan) -> str:
    """The plan's predicted seconds and what they are made of (``explore chunks``' time line)."""
    spread = ("Graham's bound, no task clocks yet" if plan.task_spread is None
              else f"equal tasks' spread {plan.task_spread:.0%}, from the workers' clocks")
    source = ("timed at this block by the workers" if plan.block_clocked
              else "the workers' clock at this block's volume" if plan.task_clock is not None
              else "from the profiles")
    speed = "" if plan.seconds_per_voxel is None else f"{plan.seconds_per_voxel * 1e9:.0f} ns/voxel {source}, "
    touch = plan.first_touch
    fresh = ""
    if touch is not None and touch.seconds_per_byte:
        beyond = ("every page" if not touch.warm_bytes else f"beyond {format_bytes(touch.warm_bytes)} warm")
        fresh = f", first tasks' fresh pages at {touch.seconds_per_byte * 2**20 * 1e3:.2g} ms/MiB ({beyond})"
    return (f"~{plan.predicted_seconds:.3g} s on {plan.slots} slot(s) ({speed}{spread}{fresh}; used to rank shapes, "
            f"not a promise)")


def tied_text(plan) -> str:
    """The plans the time model could not tell from this one (``ChunkPlan.tied``), and why the
    plan is not one of them (``explore chunks``' tied line)."""
    others = ", ".join(f"{format_shape(t['chunks'])} ({t['n_tasks']} tasks, ~{t['predicted_seconds']:.3g} s)"
                       for t in plan.tied)
    first = "as many tasks" if plan.slots == 1 else "within the time model's resolution"
    return f"{others}  ({first}: the ranking's later keys chose this plan)"


def print_timings(timings: dict, total_seconds: float) -> None:
    """``explore --timings``: each section's seconds, entries and share of the wall time, to stderr
    (nested sections are parts of their parent: ``ExploreResult.timings``)."""
    print(f"\nwhere the {total_seconds:.1f} s went:", file=sys.stderr)
    for name, t in timings.items():
        share = t["seconds"] / total_seconds if total_seconds > 0 else 0.0
        print(f"  {name:<38} {t['seconds']:>8.2f} s  {share:>6.1%}  ({t['count']}x)", file=sys.stderr)


def print_explore(result) -> None:
    """An ``ExploreResult`` as ``explore`` prints it: the profiles, the summary, the probes, the files."""
    print()
    print(f"{'shape':>15} {'status':<9} {'peak_bytes':>11} {'bytes/voxel':>11} {'seconds':>8}")
    for step in result.steps:
        voxels = step.shape[0] * step.shape[1] * step.shape[2]
        peak = format_bytes(step.peak_bytes) if step.peak_bytes is not None else "-"
        per_voxel = f"{step.peak_bytes / voxels:.1f}" if step.peak_bytes is not None else "-"
        secs = f"{step.seconds:.2f}" if step.seconds is not None else "-"
        print(f"{format_shape(step.shape):>15} {step.status:<9} {peak:>11} {per_voxel:>11} {secs:>8}")
    unc = result.max_relative_uncertainty
    print(f"\n{result.operator}: {result.profiles} profiles in the store ({result.new_profiles} new), "
          f"{result.seconds:.1f} s ({result.operator_seconds:.1f} s inside the operator)")
    if result.reused:
        print("the saved model was made from exactly these profiles with these settings: reused as it is "
              "(--refresh refits)")
    if result.prior:
        print(f"prior mean: {result.prior}")
    if unc is not None:
        print(f"max relative half-width of the {result.confidence:.0%} bound over the target region: {unc:.1%}"
              f" (widened x{result.certified_factor:.2f} by the evidence and the run's share of the risk)")
    if result.region_max_block_voxels:
        print(f"target region: blocks up to {_voxels_text(result.region_max_block_voxels)}, the largest the "
              f"in-worker probes reach in their seconds (--probe-seconds): no plan runs a larger one")
    if result.regime:
        print(f"regime boundary: {result.regime} (the peak jumps there: each side has its own level and "
              "bytes per voxel; a block between the profiles either side is bounded as the higher side)")
    print_probes(result.probes)
    if result.model_path:
        print(f"model:  {result.model_path}")
    if result.report_path:
        print(f"report: {result.report_path}")


def print_run(result) -> None:
    """A ``RunResult`` as ``explore run`` prints it (stdout): status, trials, chunks, time, peaks."""
    print(f"status           {result.status}" + (f" ({result.error})" if result.error else ""))
    if result.trials_skipped:
        print(f"trials           none: {result.trials_skipped}")
    for trial in result.trials:
        measured = trial.get("measured_seconds_per_voxel")
        print(f"trial            chunks {format_shape(trial['chunks'])}: block {format_shape(trial['block'])} "
              + (f"{measured * 1e9:.0f} ns/voxel on the workers" if measured else trial["status"])
              + (f" (by volume {trial['predicted_seconds_per_voxel'] * 1e9:.0f})"
                 if trial.get("predicted_seconds_per_voxel") else "") + f", {trial['seconds']:.1f} s")
    if result.chunks:
        print(f"chunks           {format_shape(result.chunks)} ({result.chunks_source}, {result.n_tasks} tasks)")
    if result.strategy and (result.plan or {}).get("considered"):
        print(f"strategy         {result.strategy} (of {', '.join(result.plan['considered'])}, by the time model)")
    elif result.strategy == "staged":
        print("strategy         staged (asked)")
    if result.seconds is not None:
        print(f"seconds          {result.seconds:.1f}")
    for branch, path in result.outputs.items():
        print(f"output           {path}  ({branch})")
    if result.worker_peak_bytes:
        limit = result.memory_limit_bytes
        peaks = ", ".join(format_bytes(p) + (f" ({p / limit:.0%})" if limit else "")
                          for p in result.worker_peak_bytes)
        print(f"worker peaks     {peaks} of {format_bytes(limit) if limit else '?'}")
    print(f"workers lost     {max(result.workers_restarted, result.memory_kills)}")
    if result.refine:
        over = "-" if result.tasks_over_bound is None else result.tasks_over_bound
        print(f"observations     {result.observations_recorded} recorded, {over} over the bound")
    if result.advice:
        print(f"advice           {result.advice}")


def print_step(step, budget: int) -> None:
    """``explore``'s progress line for one finished (or lost) profile, on stderr."""
    peak = format_bytes(step.peak_bytes) if step.peak_bytes is not None else "-"
    secs = f"{step.seconds:.2f} s" if step.seconds is not None else "-"
    unc = f"{step.max_relative_uncertainty:.1%}" if step.max_relative_uncertainty is not None else "-"
    print(f"[{step.index:>3}/{budget}] {format_shape(step.shape):>15}  {step.status:<8} peak {peak:>10}  "
          f"{secs:>9}  uncertainty {unc}" + (f"  on {step.profiled_on}" if step.profiled_on else ""),
          file=sys.stderr, flush=True)


def print_started(shape, purpose: str, predicted_seconds) -> None:
    """``explore``'s line as a profile expected to take a second or more starts, on stderr."""
    if predicted_seconds is None or predicted_seconds < 1:
        return  # a line per profile is enough when they take under a second
    print(f"{'':>9} {format_shape(shape):>15}  profiling ({purpose}, ~{predicted_seconds:.0f} s) ...",
          file=sys.stderr, flush=True)
