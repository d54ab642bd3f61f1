"""Benchmark of the bound on a first production run (issue 11): no production run has taught
anything yet, and the 99% bound must already hold for the tasks inside the workers.

    python scripts/bench_first_run.py [--cache runs/bench/first-run] [--budget 30]
        [--survey 651x951x462] [--survey-limit 4GiB] [--workers 2] [--skip-survey]
        [--unet-shape 240x240x128] [--unet-limits 1.5GiB,2GiB,3GiB] [--unet-runs DIR] [--skip-unet]
        [--unet-only] [--skip-simulation] [--warm-up-timeout SECONDS]

Every step is the command a user runs (``explore`` through its CLI, in a fresh process):

1. **The README's first command**: ``explore gst3d --budget B`` (isolated profiles, then the
   in-worker probes) into a fresh runs directory, ``scripts/make_volume.py 240x240x240``,
   ``explore run gst3d demo.sgy --output demo-dip.zarr --memory-limit 1.5GiB``: observations
   recorded and tasks over their 99% bound.
2. **A survey-size volume** (``--survey``, default 651x951x462, 1.1 GB float32): ``explore
   run`` with ``--workers 2 --memory-limit 4GiB`` from a copy of the runs directory taken
   right after ``explore`` (a model that has seen no production run): tasks over their
   bound, worker high-water marks against the plan's bound and the pause threshold.
3. **One run on the smallest real crop** (F3, 23x18x75, ``tests/data``), from another copy of
   that runs directory: ``explore chunks gst3d --shape 800x600x1000 --memory-limit 4GiB``
   before and after, and the calibration's excess before and after; the issue measured
   the old single-ratio calibration moving that plan from 20 tasks to 36-48.
4. **A stale model**: the model's stamp rewritten as if saved with another NumPy; ``explore
   chunks`` and ``explore report`` print the warning with the fix.
5. **unet3d's first run where ``auto`` dies** (issue 33): ``explore unet3d`` (defaults: its
   in-worker probes) into a fresh runs directory (``--unet-runs`` reuses one), a SEG-Y of
   ``--unet-shape`` (default 240x240x128), then at each of ``--unet-limits`` in turn (default
   1.5GiB, 2GiB, 3GiB; 2 workers x 1 thread) ``explore chunks`` until the explored model's plan
   fits; at that limit ``explore run unet3d --chunks auto`` (Dask's chunks by bytes, blind to
   the operator's working memory) and ``explore run unet3d`` from a copy of the explored runs
   directory.  Whether ``auto`` lost its workers there is reported, not assumed.

0. **In simulation** (``--skip-simulation`` leaves it out): plans of ``n`` tasks drawn from the
   model the bound describes (a shared Student-t error of scale ``a`` with 10 dof, ``n`` within
   deviations of scale ``sigma`` with 88 dof, two of them cold when said), the share whose
   largest task is under the rule before (quadrature sum with a Sidak within term) and under
   ``explorer.plan.max_task.max_task_quantile``, 400,000 plans each (Monte Carlo sd 0.016%).

Each run's tasks are counted twice against their bounds: against one task's 99% bound (the
run's own check, which knows whether the task was its worker's first of the run) and
against the plan's bound on the largest of its ``n`` tasks (``task_peak_bytes`` of its
footprint: the exact quantile of the shared error plus the largest of ``n``, ``min(n, slots)``
of them cold, ``explorer.plan.excess.task_bound``), from the run's observations in the store.

Targets: tasks over their 99% bound <= 1%, and over the plan's bound <= 1%, in steps 1, 2
and 5; step 3 says how much the plan moved.  Prints Markdown and the machine line; progress
on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.machine import machine_line
from harness.trials import trials_text

ROOT = Path(__file__).resolve().parent.parent
CROP = ROOT / "tests" / "data" / "segyio_f3_ieee_float32.sgy"
OVER_TARGET = 0.01
STARTED = time.perf_counter()


def log(line: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {line}", file=sys.stderr, flush=True)


def mib(n) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f} MiB"


#: ``--warm-up-timeout``: run the CLI with ``explorer.measure.worker_baseline.WARM_UP_TIMEOUT_SECONDS`` raised
#: (the workers' warm-up graph before a baseline; for unet3d, eight tasks on 145^3 blocks).
WARM_UP_TIMEOUT: list = [None]


def cli(*args, runs: Path, timeout=3600) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    if WARM_UP_TIMEOUT[0] is None:
        command = [sys.executable, "-m", "explorer.cli"]
    else:
        command = [sys.executable, "-c", "import sys, explorer.plan.recommend as r; r.WARM_UP_TIMEOUT_SECONDS = "
                   f"{WARM_UP_TIMEOUT[0]!r}; from explorer.cli import main; sys.exit(main())"]
    out = subprocess.run([*command, *map(str, args), "--runs-dir", str(runs)],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    log(f"explore {' '.join(map(str, args))}: exit {out.returncode} in {time.perf_counter() - started:.1f} s")
    if out.returncode != 0:
        log(out.stderr.strip()[-2000:])
    return out


def last_json(out: subprocess.CompletedProcess) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


def warnings_of(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("warning:")]


def simulation_table(plans: int = 400_000, confidence: float = 0.99) -> None:
    """Step 0 (module docstring)."""
    import numpy as np
    from scipy import stats

    from explorer.plan.max_task import max_task_quantile

    rng = np.random.default_rng(20261126)
    c, nu_p, nu_w = confidence, 10.0, 88.0
    print("### The bound on the largest of n tasks, in simulation\n")
    print(f"Share of {plans:,} simulated plans whose largest task is under the {c:.0%} bound.\n")
    print("| n | a / sigma | cold tasks (k, offset / sigma, their sd / sigma) | quadrature + Sidak (before) | "
          "exact quantile of shared + max |")
    print("|---|---|---|---|---|")
    for n in (1, 9, 100):
        for ratio in (0.5, 1.4, 3.0):
            for k, kappa, cold_sd in ((0, 0.0, 1.0), (2, 0.5, 1.2)):
                if n == 1 and k:
                    continue
                shared = ratio * rng.standard_t(nu_p, plans)
                largest = stats.t.ppf(rng.random(plans) ** (1.0 / (n - k)), nu_w)
                if k:
                    largest = np.maximum(largest, kappa + cold_sd * stats.t.ppf(rng.random(plans) ** (1.0 / k), nu_w))
                x = shared + largest
                before = math.hypot(ratio * stats.t.ppf(c, nu_p), stats.t.ppf(c ** (1 / n), nu_w))
                exact = max_task_quantile(c, ([ratio], [0.0]), (nu_p, 12.0), 1.0, n, cold=k, cold_offset=kappa,
                                          cold_sd=cold_sd, within_dof=nu_w)[0]
                print(f"| {n} | {ratio} | {f'{k}, {kappa}, {cold_sd}' if k else 'none'} | {(x <= before).mean():.2%} | "
                      f"{(x <= exact).mean():.2%} |")
    print()


def run_tasks(runs: Path, operator: str, run_id: str | None) -> list:
    """The run's observed tasks in the store of ``runs``: ``(peak_bytes, first_in_run)`` each."""
    if not run_id:
        return []
    from explorer.search.store import Store

    return [(float(r.peak_bytes), r.context.get("first_in_run")) for r in Store(runs).records(operator)
            if r.source == "production" and r.context.get("run") == run_id and r.peak_bytes is not None]


def over_plan_bound(d: dict) -> tuple[int | None, float | None]:
    """``(tasks over the plan's bound on the largest of its n tasks, largest task / that bound)``
    (``d["tasks"]``: :func:`run_tasks`; None without observations or a model plan).  The bound is
    the footprint's per-task allowance, its task peak and its store chunk (a plan with a chunk
    the volume does not fill: that chunk's task merges it into a whole store chunk)."""
    footprint = (d.get("plan") or {}).get("footprint") or {}
    bound = footprint.get("task_peak_bytes")
    bound = bound and bound + (footprint.get("store_chunk_bytes") or 0)
    peaks = [peak for peak, _first in d.get("tasks") or []]
    if not bound or not peaks or (d.get("plan") or {}).get("threads_per_worker", 1) != 1:
        return None, None
    return sum(peak > bound for peak in peaks), max(peaks) / bound


def run_table(rows: list[tuple[str, dict]]) -> None:
    p = print
    p("| run | volume | chunks | tasks | status | seconds | trials before it (chunks, seconds) | observations | "
      "tasks over 99% bound | tasks over the plan's bound on the largest of n | largest task / that bound | "
      "first tasks (peak / warm mean) | worker baseline | plan upper | worker HWM (max) | HWM / plan upper | "
      "pause threshold | restarts |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, d in rows:
        plan = d.get("plan") or {}
        hwm = max((h for h in d.get("worker_hwm_bytes") or [] if h), default=None)
        upper = plan.get("upper_bytes")
        pause = plan.get("budget_bytes")
        over, ratio = over_plan_bound(d)
        warm = [peak for peak, first in d.get("tasks") or [] if first is False]
        first = [peak for peak, first in d.get("tasks") or [] if first]
        cold = "—" if not (warm and first) else ", ".join(f"{peak / (sum(warm) / len(warm)):.3f}" for peak in first)
        p(f"| {name} | {'x'.join(map(str, d['shape']))} | {'x'.join(map(str, d['chunks']))} | {d['n_tasks']} | "
          f"{d['status']} | {d['seconds']:.1f} | {trials_text(d.get('trials') or [])} | "
          f"{d['observations_recorded']} | {d['tasks_over_bound']} | {'—' if over is None else over} | "
          f"{'—' if ratio is None else f'{ratio:.3f}'} | {cold} | "
          f"{mib(d.get('worker_baseline_bytes'))} | {mib(upper)} | {mib(hwm)} | "
          f"{'—' if not (hwm and upper) else f'{hwm / upper:.2f}'} | {mib(pause)} | {d['workers_restarted']} |")


def run_verdicts(name: str, d: dict) -> list:
    """The targets of one model-planned run: tasks over their 99% bound and over the plan's
    bound on the largest of n <= 1%, worker HWM under the plan's upper footprint."""
    share = (d["tasks_over_bound"] or 0) / max(d["n_tasks"], 1)
    out = [(f"{name}: tasks over their 99% bound <= {OVER_TARGET:.0%}", share <= OVER_TARGET,
            f"{d['tasks_over_bound']} of {d['observations_recorded']} ({share:.1%})")]
    over, ratio = over_plan_bound(d)
    if over is not None:
        observed = len(d["tasks"])
        out.append((f"{name}: tasks over the plan's bound on the largest of its {d['n_tasks']} tasks <= "
                    f"{OVER_TARGET:.0%}", over / observed <= OVER_TARGET,
                    f"{over} of {observed} ({over / observed:.1%}); the largest at {ratio:.3f} of the bound"))
    hwm = max((h for h in d["worker_hwm_bytes"] or [] if h), default=0)
    out.append((f"{name}: worker HWM <= the plan's upper footprint", hwm <= d["plan"]["upper_bytes"],
                f"{mib(hwm)} vs {mib(d['plan']['upper_bytes'])}"))
    return out


def within_text(cal: dict, short: bool = False) -> str:
    """The spread of equal tasks of one run (``explorer.plan.excess.WithinFit``)."""
    w = cal.get("within")
    if not w:
        return "" if not short else "-"
    text = f"{w['alpha_bytes'] / 2**20:.2f} MiB + {w['beta']:.1%}"
    return text if short else f", tasks of one run within sd {text} ({w['method']} quantile, {w['dof']} dof)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="runs/bench/first-run", type=Path)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--survey", default="651x951x462")
    parser.add_argument("--survey-limit", default="4GiB")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-survey", action="store_true")
    parser.add_argument("--unet-shape", default="240x240x128")
    parser.add_argument("--unet-limits", default="1.5GiB,2GiB,3GiB",
                        help="tried in turn: the first where the explored model's plan fits is used")
    parser.add_argument("--unet-runs", type=Path, default=None,
                        help="a runs directory where `explore unet3d` ran already (copied, not changed)")
    parser.add_argument("--skip-unet", action="store_true")
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--unet-only", action="store_true", help="steps 0 and 5 only")
    parser.add_argument("--warm-up-timeout", type=float, default=None,
                        help="seconds the workers' warm-up graph may take (explorer.plan.recommend's 60 s by default)")
    args = parser.parse_args()
    WARM_UP_TIMEOUT[0] = args.warm_up_timeout
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    p = print
    p("## The bound on a first production run\n")
    if not args.skip_simulation:
        simulation_table()
    explored = cache / "explored"  # explore only: no production run
    verdicts = []
    if args.unet_only:
        verdicts = unet_scenario(args, cache)
        p("")
        for name, passed, detail in verdicts:
            p(f"- {'PASS' if passed else 'FAIL'} {name}: {detail}")
        p(f"\nBenchmark wall time {time.perf_counter() - STARTED:.0f} s.")
        p(f"Machine: {machine_line()}")
        return
    shutil.rmtree(explored, ignore_errors=True)

    # 1. The README's first command.
    out = cli("gst3d", "--budget", args.budget, "--json", runs=explored)
    exploration = last_json(out)
    probes = exploration["probes"]
    cal = probes["calibration"]
    readme = cache / "readme"
    shutil.rmtree(readme, ignore_errors=True)
    shutil.copytree(explored, readme)
    demo = cache / "demo.sgy"
    if not demo.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_volume.py"), "240x240x240", str(demo)],
                       check=True, capture_output=True)
    shutil.rmtree(cache / "demo-dip.zarr", ignore_errors=True)
    out = cli("run", "gst3d", demo, "--output", cache / "demo-dip.zarr", "--overwrite", "--memory-limit", "1.5GiB", "--json",
              runs=readme)
    first = last_json(out)
    first["tasks"] = run_tasks(readme, "gst3d", first.get("run_id"))
    p(f"`explore gst3d --budget {args.budget}`: {exploration['profiles']} profiles, {exploration['seconds']:.0f} s, "
      f"{exploration['stopped_because']}; then {len(probes['runs'])} in-worker probes in {probes['seconds']:.0f} s "
      f"(blocks {', '.join('x'.join(map(str, b)) for b in probes['blocks'])}): a task in a worker needs the isolated "
      f"peak {cal['excess']['intercept_bytes'] / 2**20:+.2f} MiB {cal['excess']['bytes_per_voxel']:+.2f} B/voxel "
      f"(residual sd {mib(cal['excess']['residual_sd'])}, {cal['excess']['method']} quantile, "
      f"{cal['excess']['dof']} dof){within_text(cal)}{cold_text(cal)}; idle worker {mib(probes['baseline_bytes'])}.\n")
    rows = [("README: 240^3 @ 1.5 GiB, 2 workers", first)]

    # 2. A survey-size volume from the explored model (no production run).
    if not args.skip_survey:
        survey = cache / f"survey-{args.survey}.sgy"
        if not survey.exists():
            log(f"writing {survey}")
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_volume.py"), args.survey, str(survey)],
                           check=True, capture_output=True)
        fresh = cache / "survey-runs"
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.copytree(explored, fresh)
        shutil.rmtree(cache / "survey-dip.zarr", ignore_errors=True)
        out = cli("run", "gst3d", survey, "--output", cache / "survey-dip.zarr", "--overwrite", "--memory-limit", args.survey_limit,
                  "--workers", args.workers, "--json", runs=fresh)
        result = last_json(out)
        result["tasks"] = run_tasks(fresh, "gst3d", result.get("run_id"))
        rows.append((f"survey {args.survey} @ {args.survey_limit}, {args.workers} workers", result))
        shutil.rmtree(cache / "survey-dip.zarr", ignore_errors=True)
    p("### First production runs from the explored model\n")
    run_table(rows)
    for name, d in rows:
        verdicts.extend(run_verdicts(name, d))

    readme_samples(explored, cache)

    # 3. One run on the smallest real crop.
    crop_runs = cache / "crop-runs"
    shutil.rmtree(crop_runs, ignore_errors=True)
    shutil.copytree(explored, crop_runs)
    plan_args = ("chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "4GiB", "--json")
    before = last_json(cli(*plan_args, runs=crop_runs))
    cal_before = json.loads((crop_runs / "gst3d" / "calibration.json").read_text())
    shutil.rmtree(cache / "crop-dip.zarr", ignore_errors=True)
    crop = last_json(cli("run", "gst3d", CROP, "--output", cache / "crop-dip.zarr", "--overwrite", "--json", runs=crop_runs))
    after = last_json(cli(*plan_args, runs=crop_runs))
    cal_after = json.loads((crop_runs / "gst3d" / "calibration.json").read_text())
    p("\n### One run on the smallest real crop, then the 800x600x1000 @ 4 GiB plan\n")
    p(f"`explore run gst3d {CROP.relative_to(ROOT)}` (F3, 23x18x75): {crop['n_tasks']} task(s) of "
      f"{'x'.join(map(str, crop['chunks']))}, {crop['tasks_over_bound']} over the bound, status {crop['status']}.\n")
    p("| | chunks | tasks | predicted | upper | task peak bound (block) | excess a | excess k | excess residual sd | "
      "within sd | groups (probes) |")
    p("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, plan, c in (("before", before, cal_before), ("after the crop's run", after, cal_after)):
        e = c["excess"]
        p(f"| {name} | {'x'.join(map(str, plan['chunks']))} | {plan['n_tasks']} | {mib(plan['predicted_bytes'])} | "
          f"{mib(plan['upper_bytes'])} | {mib(plan['footprint']['task_peak_bytes'])} "
          f"({'x'.join(map(str, plan['block']))}) | {e['intercept_bytes'] / 2**20:+.2f} MiB | "
          f"{e['bytes_per_voxel']:+.2f} B/voxel | {mib(e['residual_sd'])} | {within_text(c, short=True)} | "
          f"{c['n_groups']} ({c['n_probe_groups']}) |")
    moved = after["footprint"]["task_peak_bytes"] / before["footprint"]["task_peak_bytes"] - 1
    p(f"\nThe crop's run adds {cal_after['n_groups'] - cal_before['n_groups']} group(s) at "
      f"{math.prod(crop['chunks'])} voxels; the 800x600x1000 plan's task bound moved by {moved:+.2%} "
      f"({before['n_tasks']} -> {after['n_tasks']} tasks).  The single-ratio calibration before issue 11 moved "
      f"it from 20 tasks to 36-48 (the issue's measurement).")
    verdicts.append(("one small-crop run moves the 800x600x1000 @ 4 GiB plan only as its evidence warrants",
                     abs(moved) <= 0.05 and after["n_tasks"] <= 1.25 * before["n_tasks"],
                     f"task bound {moved:+.2%}, tasks {before['n_tasks']} -> {after['n_tasks']}"))

    # 4. A stale model.
    stale = cache / "stale-runs"
    shutil.rmtree(stale, ignore_errors=True)
    shutil.copytree(explored, stale)
    import numpy as np

    path = stale / "gst3d" / "model.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")[()]))
    meta["environment"]["numpy"] = "1.26.0"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    chunks_out = cli("chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "4GiB", runs=stale)
    report_out = cli("report", "gst3d", runs=stale)
    p("\n### A model saved with another NumPy\n")
    shown = warnings_of(chunks_out) + [line for line in report_out.stdout.splitlines() if line.startswith("warning:")]
    for line in shown:
        p(f"    {line}")
    verdicts.append(("a stale model produces the warning with the fix (explore chunks, explore report)",
                     len(shown) >= 2 and all("explore gst3d" in line for line in shown),
                     f"{len(shown)} warning line(s)"))

    # 5. unet3d's first run at a limit where auto dies.
    if not args.skip_unet:
        verdicts.extend(unet_scenario(args, cache))

    p("")
    for name, passed, detail in verdicts:
        p(f"- {'PASS' if passed else 'FAIL'} {name}: {detail}")
    p(f"\nBenchmark wall time {time.perf_counter() - STARTED:.0f} s.")
    p(f"Machine: {machine_line()}")


def readme_samples(explored: Path, cache: Path) -> None:
    """The README's sample plan and Python quick start on the explored model (a copy of its runs
    directory, no production run): ``explore chunks``' text and the calls' values."""
    samples = cache / "samples-runs"
    shutil.rmtree(samples, ignore_errors=True)
    shutil.copytree(explored, samples)
    text = cli("chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "4GiB", runs=samples).stdout
    code = ("import numpy as np, explorer; m = explorer.load_model('gst3d', runs_dir={r!r}); "
            "p = explorer.recommend_chunks('gst3d', (800, 600, 1000), memory_limit='4GiB', confidence=0.99, "
            "runs_dir={r!r}); mean, upper = m.predict((128, 128, 128), confidence=0.99); "
            "print(p.chunks, p.dask_chunks, p.upper_bytes, p.n_tasks, *(int(np.ravel(x)[0]) for x in (mean, upper)), "
            "sep='\\n')")
    values = subprocess.run([sys.executable, "-c", code.format(r=str(samples))], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout.splitlines()
    print("\n### The README's samples on this model\n")
    print("```console\n$ explore chunks gst3d --shape 800x600x1000 --memory-limit 4GiB")
    print(text.rstrip() + "\n```\n")
    names = ("plan.chunks", "plan.dask_chunks", "plan.upper_bytes", "plan.n_tasks",
             "model.predict((128, 128, 128)) mean", "model.predict((128, 128, 128)) upper")
    for name, value in zip(names, values):
        print(f"- `{name}`: `{value}`")
    print()


def unet_scenario(args, cache: Path) -> list:
    """Step 5 (module docstring): prints its section, returns its verdicts."""
    p = print
    explored = cache / "unet-explored"
    if args.unet_runs is not None:
        if args.unet_runs.resolve() != explored.resolve():
            shutil.rmtree(explored, ignore_errors=True)
            shutil.copytree(args.unet_runs, explored)
        exploration = None
        log(f"unet3d: the explored runs directory {args.unet_runs}")
    else:
        shutil.rmtree(explored, ignore_errors=True)
        out = cli("unet3d", "--json", runs=explored, timeout=7200)
        if out.returncode != 0 or not out.stdout.strip():
            reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
            p("\n### unet3d's first run where Dask's `auto` chunks lose their workers\n")
            p(f"`explore unet3d` exited {out.returncode}: {reason}\n")
            return [("unet3d: `explore unet3d` explores and calibrates", False, reason)]
        exploration = last_json(out)
    volume = cache / f"unet-{args.unet_shape}.sgy"
    if not volume.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_volume.py"), args.unet_shape, str(volume)],
                       check=True, capture_output=True)
    limit, plan = None, None
    tried = []
    for candidate in args.unet_limits.split(","):
        out = cli("chunks", "unet3d", "--shape", args.unet_shape, "--memory-limit", candidate, "--workers",
                  args.workers, "--json", runs=explored)
        tried.append((candidate, out.returncode))
        if out.returncode == 0:
            limit, plan = candidate, last_json(out)
            break
    p("\n### unet3d's first run where Dask's `auto` chunks lose their workers\n")
    if exploration is not None:
        probes = exploration.get("probes") or {}
        cal = probes.get("calibration") or {}
        e = cal.get("excess") or {}
        p(f"`explore unet3d`: {exploration['profiles']} profiles, {exploration['seconds']:.0f} s, "
          f"{exploration['stopped_because']}; then {len(probes.get('runs') or [])} in-worker probes in "
          f"{probes.get('seconds', 0):.0f} s (blocks {', '.join('x'.join(map(str, b)) for b in probes.get('blocks') or [])})"
          + (f": a task in a worker needs the isolated peak {e['intercept_bytes'] / 2**20:+.2f} MiB "
             f"{e['bytes_per_voxel']:+.2f} B/voxel (residual sd {mib(e['residual_sd'])}, {e['method']} quantile, "
             f"{e['dof']} dof){within_text(cal)}{cold_text(cal)}" if e else "") + ".\n")
    p(f"Limits tried for the explored model's plan on {args.unet_shape} ({args.workers} workers x 1 thread): "
      + ", ".join(f"{c} ({'fits' if rc == 0 else 'no plan'})" for c, rc in tried) + ".\n")
    if limit is None:
        return [("unet3d: the explored model plans the volume at one of the limits tried", False,
                 ", ".join(c for c, _ in tried))]
    rows = []
    shutil.rmtree(cache / "unet-auto.zarr", ignore_errors=True)
    auto_runs = cache / "unet-auto-runs"
    shutil.rmtree(auto_runs, ignore_errors=True)
    shutil.copytree(explored, auto_runs)
    auto = last_json(cli("run", "unet3d", volume, "--output", cache / "unet-auto.zarr", "--overwrite", "--chunks",
                         "auto", "--memory-limit", limit, "--workers", args.workers, "--json", runs=auto_runs))
    auto["tasks"] = []
    rows.append((f"unet3d auto @ {limit}", auto))
    shutil.rmtree(cache / "unet-auto.zarr", ignore_errors=True)
    ours_runs = cache / "unet-runs"
    shutil.rmtree(ours_runs, ignore_errors=True)
    shutil.copytree(explored, ours_runs)
    shutil.rmtree(cache / "unet-out.zarr", ignore_errors=True)
    ours = last_json(cli("run", "unet3d", volume, "--output", cache / "unet-out.zarr", "--overwrite", "--memory-limit",
                         limit, "--workers", args.workers, "--json", runs=ours_runs))
    ours["tasks"] = run_tasks(ours_runs, "unet3d", ours.get("run_id"))
    rows.append((f"unet3d explored model @ {limit}", ours))
    shutil.rmtree(cache / "unet-out.zarr", ignore_errors=True)
    run_table(rows)
    died = auto["status"] != "ok" or auto["workers_restarted"] > 0
    p(f"\nAt {limit}, `auto` ({'x'.join(map(str, auto['chunks']))}, {auto['n_tasks']} task(s)) ended "
      f"{auto['status']} with {auto['workers_restarted']} worker restart(s); the explored model planned "
      f"{'x'.join(map(str, plan['chunks']))} ({plan['n_tasks']} tasks, task bound "
      f"{mib(plan['footprint']['task_peak_bytes'])}, upper footprint {mib(plan['upper_bytes'])}).")
    verdicts = [(f"unet3d: auto loses its workers at {limit}, where the explored model's plan fits", died,
                 f"auto {auto['status']}, {auto['workers_restarted']} restart(s)"),
                (f"unet3d explored model @ {limit}: the run finishes", ours["status"] == "ok", ours["status"])]
    if ours["status"] == "ok":
        verdicts.extend(run_verdicts(f"unet3d explored model @ {limit}", ours))
    return verdicts


def cold_text(cal: dict) -> str:
    """The cold first task's offset (``explorer.plan.excess.ColdFit``)."""
    c = cal.get("cold")
    if not c:
        return ""
    return (f", a worker's first task of a run {c['intercept_bytes'] / 2**20:+.2f} MiB {c['bytes_per_byte']:+.2%} "
            f"of its mean task above the others ({c['n_groups']} groups, {c['dof']:.0f} dof)")


if __name__ == "__main__":
    main()
