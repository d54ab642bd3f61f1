"""Benchmark of production refinement (issues 5 and 11): from the model ``explore`` leaves
(isolated profiles and in-worker probes, no production run), successive production runs
of one operator on the same input and cluster settings observe every task, calibrate,
and plan again with the calibration; then the cost of the observation itself.

    python scripts/bench_refine.py [--operator gst3d] [--shape 256] [--memory-limit 768MiB]
        [--runs 3] [--budget 30] [--cache runs/bench] [--overhead-repeat 5] [--keep]

Defaults: gst3d on 256^3 at 768 MiB per worker, where the isolated plan has 8 tasks
(128^3 chunks), so each run records 8 observations (at 1.5 GiB, the limit of
``bench_chunks.py``, the plan has 2 tasks).

1. **Explored model**: the study, model and probes' calibration that
   ``scripts/bench_chunks.py`` explores for the same operator and limit
   (``<cache>/chunks/runs-<op>-<L bytes>``: ``explore(op, budget, memory_limit=L)``:
   isolated profiles, then in-worker probes), explored there first if absent, then copied
   into a fresh runs directory (no production observation).
2. **Successive runs**: ``--runs`` times ``explorer.runner.daskrun.run(op, input, out.zarr,
   chunks="model", refine=True, workers=2, threads=1, memory_limit=L,
   allowed_failures=1)`` into that directory, each on a fresh ``LocalCluster`` (default
   ``replan=True``: a run may restart once with a recalibrated plan; the row says so).
   Per run: the chunks and tasks, ``observations_recorded``, ``tasks_over_bound`` (against
   the in-worker task model as calibrated when the run started: the probes' alone for run
   1), the calibration saved after it (the excess ``a + k V`` over the isolated model, its
   residual sd and groups: ``explorer.plan.calibration``), the run's plan (``predicted_bytes``
   and ``upper_bytes``, the worker footprint with the task model's mean and 99 % bound and
   the measured baseline, and its budget, 80 % of L), worker peaks (sampled RSS and exact
   HWM), restarts, seconds.  **Fixed block**: the block of the plan before run 1; its 99 %
   upper bound of the task peak (``task_model(op).predict(block)``) and that block's worker
   footprint with it (and run 1's measured baseline) are printed before run 1 and after
   every run.
3. **Observation overhead**: ``scripts/bench_observation.measure``: ``--overhead-repeat``
   pairs of runs with ``refine=False`` and ``refine=True`` (order alternating, fresh cluster
   each) with the last run's chunks fixed explicitly, so both do identical work, on a copy
   of the refined runs directory (observations are checked against the calibrated model
   as in production).  Medians of ``seconds``, ``wall_seconds`` and CPU seconds.

Verdicts: observations recorded in every run; ``tasks_over_bound == 0`` in every run,
the first included; the fixed block's calibrated bound tightens or holds from the
calibration run 2 plans with to the one run 3 plans with, and after run 3 against after
run 2; no worker lost in any run; observation overhead on ``seconds`` <= 5 %.  Load
averages are printed (2 cores here: timings compare only at equal load).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import operators
from bench_chunks import STARTED, ensure_input, ensure_model, log, mib
from harness.trials import trials_note
from bench_observation import FIGURES, measure
from explorer.runner.daskrun import run
from explorer.core.units import format_bytes, format_shape, parse_shape, parse_size
from harness.machine import machine_line

WORKERS = 2
THREADS = 1
CONFIDENCE = 0.99
OVERHEAD_TARGET = 0.05
#: Relative slack when comparing two bounds ("holds" up to float rounding).
HOLDS = 1e-9


def fixed_block_bound(op, plan, runs_dir, baseline_bytes: int) -> tuple[float, float, int]:
    """``(mean, upper)`` of the in-worker task model at the plan's block and that plan's
    worker footprint with the upper bound and ``baseline_bytes``."""
    import numpy as np

    from explorer.plan.task_model import task_model
    from explorer.plan.footprint import partial_chunks, worker_footprint

    mean, upper = task_model(op.name, runs_dir).predict(tuple(plan.block), CONFIDENCE)
    total = worker_footprint(plan.block, float(upper), threads_per_worker=THREADS,
                             output_itemsize=np.dtype(op.output_dtype).itemsize, windowed=True,
                             baseline_bytes=baseline_bytes, chunk_shapes=plan.chunks,
                             partial=partial_chunks(plan.shape, plan.chunks)).total
    return float(mean), float(upper), int(total)


def production_records(op_name: str, runs_dir) -> int:
    from explorer.search.store import Store

    return len(Store(runs_dir).records(op_name, source="production"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operator", default="gst3d")
    parser.add_argument("--shape", default="256", help="EDGE or AxBxC")
    parser.add_argument("--memory-limit", default="768MiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--cache", default="runs/bench")
    parser.add_argument("--overhead-repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the fresh runs directory (path printed)")
    args = parser.parse_args()
    op = operators.get(args.operator)
    shape = parse_shape(args.shape if "x" in args.shape else "x".join([args.shape] * 3))
    limit = parse_size(args.memory_limit)
    cache = Path(args.cache) / "chunks"
    cache.mkdir(parents=True, exist_ok=True)

    from explorer import recommend_chunks

    load = os.getloadavg()
    p = print
    p("## Production refinement: successive runs from the explored model\n")
    p(f"Load average at start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) on {os.cpu_count()} cores.  "
      f"{op.name} on {format_shape(shape)} float32 ({format_bytes(math.prod(shape) * 4)}), {WORKERS} workers x "
      f"{THREADS} thread x {format_bytes(limit)}, LocalCluster each run, allowed_failures=1.", flush=True)

    source = ensure_input(cache, shape)
    isolated = cache / f"runs-{op.name}-{limit}"
    explored = ensure_model(op.name, limit, isolated, args.budget)
    if production_records(op.name, isolated):
        raise SystemExit(f"{isolated} holds production observations: not the study explore leaves")
    fresh = Path(tempfile.mkdtemp(prefix="bench-refine-"))
    runs_dir = fresh / "runs"
    shutil.copytree(isolated, runs_dir)
    out = fresh / "out.zarr"
    probes = explored.get("probes") or {}
    p(f"\nExplored model: {explored.get('profiles')} profiles, explore(budget={explored.get('budget')}, "
      f"memory_limit={format_bytes(limit)}) {explored.get('seconds', 0):.0f} s"
      f"{' (reused)' if explored.get('reused') else ''}, {explored.get('stopped_because')}, then "
      f"{len(probes.get('runs') or [])} in-worker probes; copied from {isolated} into a fresh runs directory "
      f"({production_records(op.name, runs_dir)} production records).")

    plan0 = recommend_chunks(op.name, shape, limit, workers=WORKERS, threads_per_worker=THREADS,
                             confidence=CONFIDENCE, runs_dir=runs_dir)
    block = tuple(plan0.block)
    baseline = plan0.footprint.baseline_bytes
    bounds = [fixed_block_bound(op, plan0, runs_dir, baseline)]
    p(f"Plan before any run (this machine's saved baseline {mib(baseline)}): chunks {format_shape(plan0.chunks)}, {plan0.n_tasks} tasks, block {format_shape(block)} "
      f"(the fixed block below), predicted {mib(plan0.predicted_bytes)}, upper {mib(plan0.upper_bytes)}, budget "
      f"{mib(plan0.budget_bytes)}; fixed block peak_bytes mean {mib(bounds[0][0])}, 99% bound {mib(bounds[0][1])}, "
      f"footprint with it {mib(bounds[0][2])}.\n", flush=True)

    results = []
    loads = []
    for i in range(1, args.runs + 1):
        loads.append(os.getloadavg()[0])
        r = run(op.name, source, out, chunks="model", refine=True, workers=WORKERS, threads=THREADS,
                memory_limit=limit, runs_dir=runs_dir, allowed_failures=1, confidence=CONFIDENCE, overwrite=True, check=False)
        results.append(r)
        bounds.append(fixed_block_bound(op, plan0, runs_dir, baseline))
        log(f"run {i}: {r.status} {format_shape(r.chunks or [])} x{r.n_tasks} in {r.seconds or 0:.1f} s, "
            f"{r.observations_recorded} observations, {r.tasks_over_bound} over bound, restarts "
            f"{r.workers_restarted}, replanned from {r.replanned_from}, load {loads[-1]:.2f}"
            + (f" | {r.error}" if r.error else ""))

    p("| run | chunks | tasks | status | seconds | observations | tasks over bound | calibration after "
      "(excess a + k V, residual sd, groups) | plan predicted | plan upper (bound) | budget | fixed block 99% bound after | "
      "its footprint | worker peak | worker HWM | restarts | kills | load | note |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    p(f"| 0 (explored) | {format_shape(plan0.chunks)} | {plan0.n_tasks} | | | | | probes' | {mib(plan0.predicted_bytes)} | "
      f"{mib(plan0.upper_bytes)} | {mib(plan0.budget_bytes)} | {mib(bounds[0][1])} | {mib(bounds[0][2])} | | | | | | "
      "plan before any run |")
    for i, r in enumerate(results, start=1):
        cal = r.calibration
        e = (cal or {}).get("excess")
        cal_text = "—" if not e else (f"{e['intercept_bytes'] / 2**20:+.2f} MiB {e['bytes_per_voxel']:+.2f} B/voxel, "
                                      f"sd {mib(e['residual_sd'])}, {cal['n_groups']} groups"
                                      + (f", within {mib(cal['within']['alpha_bytes'])} + {cal['within']['beta']:.1%}"
                                         if cal.get("within") else ""))
        plan = r.plan or {}
        notes = []
        if r.replanned_from:
            notes.append("re-planned from " + ", ".join(format_shape(c) for c in r.replanned_from))
        if r.trials:
            notes.append(trials_note(r.trials))
        if cal and cal.get("n_groups_over_bound"):
            notes.append(f"{cal['n_groups_over_bound']} group(s) over their in-sample bound")
        if r.error:
            notes.append(r.error[:90])
        hwm = [v for v in r.worker_hwm_bytes if v is not None]
        p(f"| {i} | {format_shape(r.chunks or [])} | {r.n_tasks} | {r.status} | {r.seconds or 0:.2f} | "
          f"{r.observations_recorded} | {r.tasks_over_bound} | {cal_text} | {mib(plan.get('predicted_bytes'))} | "
          f"{mib(plan.get('upper_bytes'))} | {mib(plan.get('budget_bytes'))} | {mib(bounds[i][1])} | "
          f"{mib(bounds[i][2])} | {mib(max(r.worker_peak_bytes, default=None))} | {mib(max(hwm, default=None))} | "
          f"{r.workers_restarted} | {r.memory_kills} | {loads[i - 1]:.1f} | {'; '.join(notes)} |")
    p("\nPlan predicted/upper: the worker footprint (measured baseline + task peak + held outputs; each task reads its own block) "
      "with the in-worker task model's mean / 99% bound, as calibrated when the run planned; the run's tasks are "
      "counted over the same bound.  Fixed block: the first plan's block, bound under the calibration saved after "
      "the run.\n")

    # ---- verdicts on the successive runs
    verdicts = []
    recorded = [(r.observations_recorded, r.n_tasks) for r in results]
    verdicts.append(("observations recorded in every run", all(n > 0 for n, _ in recorded),
                     ", ".join(f"run {i}: {n} of {t} tasks" for i, (n, t) in enumerate(recorded, 1))))
    verdicts.append(("no task over the 99% bound in any run, the first included",
                     all(r.tasks_over_bound == 0 for r in results),
                     ", ".join(f"run {i}: {r.tasks_over_bound}" for i, r in enumerate(results, 1))))
    if args.runs >= 3:
        used2, used3 = bounds[1][1], bounds[2][1]  # calibration run 2 planned with, run 3 planned with
        after2, after3 = bounds[2][1], bounds[3][1]
        verdicts.append(("bound tightens or holds, run 2 -> run 3 (fixed block, as planned with)",
                         used3 <= used2 * (1 + HOLDS),
                         f"{mib(used2)} (after run 1) -> {mib(used3)} (after run 2): {used3 / used2 - 1:+.2%}"))
        verdicts.append(("bound tightens or holds, after run 2 -> after run 3 (fixed block)",
                         after3 <= after2 * (1 + HOLDS),
                         f"{mib(after2)} -> {mib(after3)}: {after3 / after2 - 1:+.2%}"))
        r2, r3 = results[1], results[2]
        if r2.chunks == r3.chunks and r2.plan and r3.plan:
            u2, u3 = r2.plan["upper_bytes"], r3.plan["upper_bytes"]
            verdicts.append(("plan upper_bytes tightens or holds, run 2 -> run 3 (same chunks)", u3 <= u2 * (1 + HOLDS),
                             f"{mib(u2)} -> {mib(u3)}: {u3 / u2 - 1:+.2%}"))
    verdicts.append(("no worker lost", all(r.status == "ok" and r.workers_restarted == 0 and r.memory_kills == 0
                                             for r in results),
                     ", ".join(f"run {i}: {r.status}, {r.workers_restarted} restarts, {r.memory_kills} kills"
                               for i, r in enumerate(results, 1))))
    for name, passed, detail in verdicts:
        p(f"- {'PASS' if passed else 'FAIL'} {name}: {detail}")
    sys.stdout.flush()

    # ---- observation overhead
    chunks = tuple(results[-1].chunks)
    overhead_runs = fresh / "runs-overhead"
    shutil.copytree(runs_dir, overhead_runs)
    log(f"overhead: {args.overhead_repeat} pairs with chunks {format_shape(chunks)}")
    measured = measure(op.name, source, out, chunks=chunks, runs_dir=overhead_runs, repeat=args.overhead_repeat,
                       workers=WORKERS, memory_limit=limit, log=log)
    p(f"\n### Observation overhead: {op.name} {format_shape(shape)} in fixed {format_shape(chunks)} chunks "
      f"({measured['runs'][0]['tasks']} tasks), refine=False vs refine=True, fresh cluster each, alternating\n")
    p("| pair | refine | seconds | wall seconds | CPU client | CPU workers | observations | load |")
    p("|---|---|---|---|---|---|---|---|")
    for x in measured["runs"]:
        p(f"| {x['rep']} | {x['refine']} | {x['seconds']:.3f} | {x['wall_seconds']:.3f} | {x['cpu_client']:.2f} | "
          f"{x['cpu_workers']:.2f} | {x['observations']} | {x['load']:.2f} |")
    p("\n| median | --no-refine | --refine | overhead |")
    p("|---|---|---|---|")
    for name in FIGURES:
        off, on = measured["median"][name]
        p(f"| {name} | {off:.3f} | {on:.3f} | {100 * (on / off - 1):+.1f}% |")
    off, on = measured["median"]["seconds"]
    pairs = [statistics.median([x["seconds"] for x in measured["runs"] if x["rep"] == rep and x["refine"]])
             / statistics.median([x["seconds"] for x in measured["runs"] if x["rep"] == rep and not x["refine"]])
             for rep in range(args.overhead_repeat)]
    p(f"\nPer pair (adjacent runs, same load), refine / no-refine seconds: "
      f"{', '.join(f'{q:.3f}' for q in pairs)}; median {statistics.median(pairs):.3f}.")
    p(f"\n- {'PASS' if on / off - 1 <= OVERHEAD_TARGET else 'FAIL'} observation slows a run by <= "
      f"{OVERHEAD_TARGET:.0%}: median seconds {on:.3f} / {off:.3f} = {on / off:.3f} "
      f"({measured['runs'][0]['tasks']} tasks, {args.overhead_repeat} runs each)")

    end = os.getloadavg()
    if args.keep:
        p(f"\nRuns directory kept: {runs_dir}")
    else:
        shutil.rmtree(fresh, ignore_errors=True)
    p(f"\nBenchmark wall time {time.perf_counter() - STARTED:.0f} s.  Load average at end: "
      f"{end[0]:.2f} / {end[1]:.2f} / {end[2]:.2f}.")
    p(f"Machine: {machine_line()}")


if __name__ == "__main__":
    main()
