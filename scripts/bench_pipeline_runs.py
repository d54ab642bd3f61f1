"""Benchmark of pipelines on Dask: does the planner's choice of strategy and chunks run a
pipeline safely, and about as fast as the best choice a grid search finds?

For each pipeline spec (default: the four of issue 14), on a synthetic SEG-Y volume
(``--shape``), a real ``LocalCluster`` of 2 workers x 1 thread per run (``--workers``,
``--threads``), each worker limited to ``--memory-limit``:

1. **Members.** Every member is explored once into ``--cache`` (``explore(member,
   budget=--budget, memory_limit=L)``, with its in-worker probes, so each has a
   calibration); a member already there is reused.
2. **ours**: first ``explore calibrate SPEC --memory-limit L`` (in-worker probes of the model
   composed from the members', no isolated profile of the pipeline; skipped with
   ``--no-calibrate``, or when the cache holds the pipeline's calibration already), then
   ``explore run SPEC`` as a user runs it (``chunks="model"``, ``strategy="auto"``:
   ``recommend_chunks`` weighs fused against staged, a plan without its in-worker term after
   one with it): one first run, which fixes its plan, then ``--repeats`` runs in the rounds below.
3. **oracle**: the best of {fused, staged} x a grid of chunk shapes (the first two axes
   split in 1, 2, 3 and 4, the samples axis whole or halved), each run once (the screening),
   then the ``--finalists`` fastest that lost no worker and stayed under the limit.  Then
   ``--repeats`` **rounds**, each running ours and every finalist once, in the orders of a
   Williams design over whole cycles, its arms relabelled at random per pipeline (every arm
   after every other, and in every position, equally often: a run is slower after some
   other plans than after its own; and no arm is first of all by the order of the list,
   ``rounds.round_orders``); every median is of these rounds' runs only.  The screening run
   is left out of a finalist's median because it is the run that chose it: the least of 16
   noisy single runs is low by selection (the winner's curse), and with it the oracle's median would
   be too (two workers on two cores spread repeats of one shape by +-15% here).  The rounds
   share the machine's drift between ours and the finalists.  The oracle is the finalist of
   least median in the rounds.  How sure the ratio ours / oracle is: the 95% bootstrap
   interval of the ratio of medians, resampling whole rounds, and the median of the rounds'
   own ratios.  Eight rounds by default (two cycles of four arms; ``--repeats`` is rounded
   up to whole cycles): with five, one plan timed twice as two arms (ours ran the oracle's
   own plan) came out 1.23x apart (commit ce1f50c, ``gaussian,gst3d``).
   Beside each grid shape, the planner's time model at that chunking
   (``explorer.plan.recommend.predicted_seconds``): its rank correlation (Spearman) with the
   screening seconds and its RMS log error, raw and after the one scale that fits best (a
   plan depends only on how the model ranks one volume's chunkings).
4. **chained**: the way a user chains today: each operator run on its own with its own
   recommended chunks (``explore run MEMBER``), one after the other through SEG-Y
   intermediates (a fan-out's branches one by one on the prefix's output); its seconds are
   the sum of the runs'.
5. **auto**: Dask's ``chunks="auto"`` (sized by input bytes only) with one Dask form per
   stage, as a user chaining Dask operators writes it (``strategy="staged"``; the first
   stage reads the file in windows, the later ones ``map_overlap`` the intermediates).

Every run's output is compared with the NumPy composition on the whole volume
(``Pipeline.run``): ``max |error|`` over every branch.  Seconds are ``RunResult.seconds``
(from submitting the graph to the output being complete; the cluster's start-up is not in
it): medians of ``--repeats`` runs, with their spread (min-max), because two workers on a
2-core machine share it with the client.  Memory: the largest worker high-water mark
(``VmHWM``) against the limit, workers lost and the nannies' memory kills.

Targets (issue 14): ours loses no worker and stays under the limit; its median seconds
<= 1.10 x the oracle's; every output equals the NumPy composition.

    python scripts/bench_pipeline_runs.py [--pipelines SPEC;SPEC] [--memory-limit 1GiB]
        [--shape 256x256x384] [--repeats 8] [--finalists 3] [--cache runs/bench/pipeline-runs]
        [--no-calibrate]

Prints Markdown tables, verdicts and the machine line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import operators
from explorer.runner.daskrun import run
from explorer.exploration import explore
from explorer.model.load import load_model
from explorer.core.units import format_bytes, format_shape, parse_shape, parse_size
from harness.machine import machine_line
from harness.rounds import ratio_interval, round_orders
from harness.trials import trials_note

ISSUE_PIPELINES = ("gaussian,gst3d;envelope,gaussian;gaussian(sigma=1),semblance,gaussian;"
                   "gaussian,envelope+instantaneous_phase+instantaneous_frequency+gst3d")
TOLERANCE = 2e-6
TIME_TARGET = 1.10
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


def explore_members(specs, runs: Path, budget: int, limit: int) -> None:
    seen = set()
    for spec in specs:
        for op in getattr(operators.get(spec), "members", None) or (operators.get(spec),):  # one operator: itself
            if op.name in seen:
                continue
            seen.add(op.name)
            try:
                load_model(op.name, runs_dir=runs)
                log(f"member {op.name}: model in the cache")
                continue
            except LookupError:
                pass
            log(f"member {op.name}: explore budget={budget} (with in-worker probes)")
            r = explore(op.name, budget=budget, memory_limit=limit, runs_dir=runs, report=False)
            log(f"member {op.name}: {r.profiles} profiles, {r.seconds:.0f} s, {r.stopped_because}")


def calibrate_pipeline(spec: str, args, limit: int) -> str:
    """``explore calibrate SPEC`` into the cache unless asked not to or done already; what was done, in words."""
    from explorer.plan.calibration import load_calibration
    from explorer.runner.probes import calibrate_in_workers

    if not args.calibrate:
        return "not calibrated (--no-calibrate)"
    if load_calibration(spec, args.cache) is not None:
        return "its calibration from the cache"
    log(f"{spec}: explore calibrate (in-worker probes of the composed model)")
    r = calibrate_in_workers(spec, memory_limit=limit, runs_dir=args.cache)
    ok = sum(run.status == "ok" for run in r.runs)
    excess = r.calibration.excess if r.calibration is not None else None
    log(f"{spec}: {ok} of {len(r.runs)} probes ok in {r.seconds:.0f} s, excess "
        f"{'identified' if excess is not None else 'not identified'}")
    return f"explore calibrate: {ok} probes, {r.seconds:.0f} s"


class Arm:
    """The runs of one way of running a pipeline."""

    def __init__(self, name: str, detail: str = "", predicted: float | None = None):
        self.name, self.detail, self.runs, self.predicted = name, detail, [], predicted
        self.plan_text = None  # "strategy chunks", as a grid arm's detail reads

    def add(self, seconds, hwm, lost, kills, error, ok, round_index=None):
        self.runs.append({"seconds": seconds, "hwm": hwm, "lost": lost, "kills": kills, "error": error, "ok": ok,
                          "round": round_index})

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r["ok"] for r in self.runs)

    @property
    def seconds(self) -> list[float]:
        return [r["seconds"] for r in self.runs if r["ok"]]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.ok else float("inf")

    def row(self, limit: int, oracle: float) -> str:
        hwm = max((r["hwm"] for r in self.runs if r["hwm"]), default=0)
        lost = sum(r["lost"] for r in self.runs)
        kills = sum(r["kills"] for r in self.runs)
        errors = max((r["error"] for r in self.runs if r["error"] is not None), default=None)
        if self.ok:
            s = self.seconds
            time_text = f"{statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f})"
            ratio = f"{statistics.median(s) / oracle:.2f}x" if np.isfinite(oracle) else "-"
        else:
            failed = sum(not r["ok"] for r in self.runs)
            time_text, ratio = f"failed {failed} of {len(self.runs)}", "-"
        err = "-" if errors is None else f"{errors:.1e}"
        return (f"| {self.name} | {self.detail} | {len(self.runs)} | {time_text} | {ratio} | "
                f"{format_bytes(hwm)} ({hwm / limit:.0%}) | {lost} | {kills} | {err} |")


def outputs_error(result, spec: str, reference) -> float | None:
    """``max |output - NumPy composition|`` over the branches (None when no output)."""
    import zarr

    if result.status != "ok":
        return None
    op = operators.get(spec)
    if getattr(op, "branches", ()):
        group = zarr.open_group(result.output, mode="r")
        return max(float(np.abs(np.asarray(group[b]) - r).max()) for b, r in zip(op.branches, reference))
    return float(np.abs(np.asarray(zarr.open_array(result.output, mode="r")) - reference).max())


def measured(arm: Arm, result, error, round_index=None) -> None:
    hwm = max([h for h in result.worker_hwm_bytes if h] + list(result.worker_peak_bytes), default=0)
    ok = result.status == "ok" and result.workers_restarted == 0 and (error is not None and error <= TOLERANCE)
    arm.add(result.seconds or 0.0, hwm, result.workers_restarted, result.memory_kills, error, ok, round_index)


def one_run(spec, source, work: Path, limit, args, **kwargs):
    out = work / f"out-{time.monotonic_ns()}.zarr"
    return run(spec, source, out, memory_limit=limit, workers=args.workers, threads=args.threads,
               runs_dir=args.cache, refine=False, replan=False, **kwargs, check=False)


def rounds(arms_kwargs, spec, source, work, limit, args, reference) -> None:
    """``--repeats`` rounds over ``[(arm, run kwargs), ...]``: each round runs every arm once, in
    the order of a Williams design over whole cycles, relabelled at random (``rounds.round_orders``:
    every arm after every other, and in every position, equally often); an arm that fails is not
    run again."""
    orders = round_orders(len(arms_kwargs), args.repeats, key=spec, seed=args.seed)
    first = ", ".join(f"{arms_kwargs[i][0].name} {arms_kwargs[i][0].detail.split(' (')[0]}" for i in orders[0])
    log(f"{len(orders)} rounds, the first in the order: {first}")
    for r, order in enumerate(orders):
        for arm, kwargs in (arms_kwargs[i] for i in order):
            if arm.runs and not arm.runs[-1]["ok"]:
                continue
            run_arm(arm, spec, source, work, limit, args, reference, 1, round_index=r, **kwargs)


def round_pairs(ours: Arm, oracle: Arm) -> list[tuple]:
    """``(ours, oracle)`` seconds of every round both ran in without failing."""
    by_round = {}
    for arm, slot in ((ours, 0), (oracle, 1)):
        for x in arm.runs:
            if x["ok"] and x["round"] is not None:
                by_round.setdefault(x["round"], [None, None])[slot] = x["seconds"]
    return [tuple(p) for p in by_round.values()]


def time_model_quality(grid_arms) -> str:
    """Spearman's rank correlation and RMS log error of the predicted against the screening
    seconds, over the grid shapes that ran (raw, and after the best single scale)."""
    pairs = [(a.predicted, a.runs[0]["seconds"]) for a in grid_arms
             if a.runs and a.runs[0]["ok"] and a.predicted is not None]
    if len(pairs) < 3:
        return "too few grid shapes ran to judge the time model"
    from scipy.stats import spearmanr

    predicted, measured = (np.asarray(c, dtype=float) for c in zip(*pairs))
    log_ratio = np.log(predicted / measured)
    rho = spearmanr(predicted, measured).statistic
    return (f"time model over the {len(pairs)} grid shapes that ran (screening runs): Spearman {rho:+.2f}, "
            f"RMS log error {np.sqrt(np.mean(log_ratio ** 2)):.2f} raw, "
            f"{np.std(log_ratio):.2f} after its best scale (x{np.exp(-log_ratio.mean()):.2f})")


def time_terms(specs, cache: Path) -> str:
    """A table of each member's and pipeline's learnt time terms: the overhead per graph task
    ``g``, a run's fixed seconds ``F`` (``explorer.plan.timing.fit_run_overheads``), the clock's
    seconds per voxel at its smallest and largest probe, the runs it was learnt from."""
    from explorer.plan.calibration import load_calibration

    names = []
    for spec in specs:
        names += [m.name for m in operators.get(spec).members if m.name not in names]
        names += [] if spec in names else [spec]
    lines = ["| calibration | g (per graph task) | F (per run) | s at the smallest / largest probe | runs |",
             "|---|---:|---:|---|---:|"]
    for name in names:
        cal = load_calibration(name, cache)
        t = None if cal is None else cal.timing
        if t is None or t.clock is None:
            lines.append(f"| `{name}` | - | - | - | - |")
            continue
        s = t.clock.seconds_per_voxel
        lines.append(f"| `{name}` | {1e3 * (t.graph_task_seconds or 0):.2f} ms | {t.run_fixed_seconds or 0:.3f} s | "
                     f"{1e9 * s[0]:.0f} / {1e9 * s[-1]:.0f} ns per voxel | {t.n_runs} |")
    return "\n".join(lines)


def run_arm(arm: Arm, spec, source, work, limit, args, reference, times: int, round_index=None, **kwargs):
    """Run ``arm``'s configuration up to ``times`` times (stopping at a failure); its last ok result or None."""
    last = None
    for _ in range(times):
        result = one_run(spec, source, work, limit, args, **kwargs)
        error = outputs_error(result, spec, reference)
        measured(arm, result, error, round_index)
        log(f"  {arm.name} {arm.detail}: {result.status}, {result.seconds or 0:.2f} s, "
            f"{result.workers_restarted} lost, error {error}")
        shutil.rmtree(result.output, ignore_errors=True)
        if result.status != "ok" or result.workers_restarted:
            break  # a configuration that loses workers is not run again
        last = result
    return last if arm.runs and arm.runs[-1]["ok"] else None  # None also when no run was asked


def chained(spec, source, work: Path, limit, args, reference) -> Arm:
    """Each member run on its own with its own recommended chunks, through SEG-Y intermediates."""
    op = operators.get(spec)
    arm = Arm("chained", "each operator with its own plan")
    for _ in range(args.repeats):
        seconds, hwm, lost, kills, ok, current = 0.0, 0, 0, 0, True, source
        chunk_text = []
        for index, stage in enumerate(op.stages):
            last = index == len(op.stages) - 1
            outputs = {}
            for member in stage:
                out = work / (f"{member.name}-{index}.zarr" if last else f"stage-{index}.sgy")
                r = run(member.name, current, out, memory_limit=limit, workers=args.workers,
                        threads=args.threads, runs_dir=args.cache, refine=False, replan=False,
                        overwrite=True, check=False)
                seconds += r.seconds or 0.0
                hwm = max([hwm] + [h for h in r.worker_hwm_bytes if h] + list(r.worker_peak_bytes))
                lost, kills = lost + r.workers_restarted, kills + r.memory_kills
                ok = ok and r.status == "ok"
                chunk_text.append(format_shape(r.chunks) if r.chunks else "-")
                outputs[member.name] = out
                if not ok:
                    break
            if not ok:
                break
            current = outputs[stage[0].name]
        error = None
        if ok:
            import zarr

            got = [np.asarray(zarr.open_array(str(outputs[m.name]), mode="r")) for m in op.stages[-1]]
            expected = reference if getattr(op, "branches", ()) else [reference]
            error = max(float(np.abs(g - e).max()) for g, e in zip(got, expected))
        arm.detail = "each operator with its own plan: " + ", ".join(chunk_text)
        arm.add(seconds, hwm, lost, kills, error, ok and lost == 0 and error is not None and error <= TOLERANCE)
        log(f"  chained: ok={ok}, {seconds:.2f} s, {lost} lost, error {error}")
        for path in work.iterdir():
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        if not ok:
            break
    return arm


def grid(shape) -> list[tuple[int, int, int]]:
    n0, n1, n2 = shape
    return [(-(-n0 // k), -(-n1 // k), m) for k in (1, 2, 3, 4) for m in (n2, -(-n2 // 2))]


def bench_pipeline(spec: str, args, limit: int) -> dict:
    op = operators.get(spec)
    shape = parse_shape(args.shape)
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-runs-"))
    source = work / "in.sgy"
    x = operators.synthetic_volume(shape, seed=args.seed)
    operators.write_segy(source, x)
    reference = op.run(x)
    del x
    out_dir = work / "out"
    out_dir.mkdir()
    log(f"{spec}: volume {format_shape(shape)}, limit {format_bytes(limit)}")
    calibrated = calibrate_pipeline(spec, args, limit)
    first = Arm("ours (first run)", "")
    last = run_arm(first, spec, source, out_dir, limit, args, reference, 1)
    ours = Arm("ours", "")
    ours_kwargs = {}
    if last is not None and last.plan:
        plan = last.plan
        considered = "; ".join(f"{k} {format_shape(v['chunks'])} ~{v['predicted_seconds']:.1f} s"
                               + ("" if v["in_worker_calibrated"] else " uncalibrated")
                               if "error" not in v else f"{k}: none fits" for k, v in plan["considered"].items())
        ours.detail = first.detail = (f"{plan['strategy']} {format_shape(plan['chunks'])} (bound "
                                      f"{format_bytes(plan['upper_bytes'])}; "
                                      + (f"weighed {considered}" if considered else
                                         "the trials spent, the fastest plan they timed")
                                      + f"; {calibrated})")
        ours.predicted = first.predicted = plan["predicted_seconds"]
        ours.plan_text = f"{plan['strategy']} {format_shape(plan['chunks'])}"
        ours_kwargs = {"chunks": tuple(plan["chunks"]), "strategy": plan["strategy"],
                       "branch_order": plan.get("branch_order") or None}
    from explorer.plan.recommend import predicted_seconds

    screened = []
    for chunks in grid(shape):
        for strategy in ("fused", "staged"):
            predicted = float(predicted_seconds(spec, shape, [chunks], strategy=strategy, workers=args.workers,
                                                threads_per_worker=args.threads, runs_dir=args.cache)[0])
            arm = Arm("grid", f"{strategy} {format_shape(chunks)}", predicted)
            run_arm(arm, spec, source, out_dir, limit, args, reference, 1, chunks=chunks, strategy=strategy)
            screened.append(arm)
    finalists = sorted((a for a in screened if a.ok), key=lambda a: a.median)[: args.finalists]
    contenders = []
    for arm in finalists:
        strategy, chunk_text = arm.detail.split()
        again = Arm("finalist", arm.detail, arm.predicted)
        contenders.append((again, {"chunks": parse_shape(chunk_text), "strategy": strategy}))
    if last is not None:
        contenders.insert(0, (ours, ours_kwargs))  # ours's plan, fixed by its first run, as `explore run` repeats it
    rounds(contenders, spec, source, out_dir, limit, args, reference)
    finalists = [a for a, _ in contenders if a is not ours and a.ok]
    oracle = min(finalists, key=lambda a: a.median) if finalists else None
    if oracle is not None:
        oracle.name = "oracle"
    auto = Arm("auto", "Dask's chunks, one Dask form per stage")
    run_arm(auto, spec, source, out_dir, limit, args, reference, args.auto_repeats, chunks="auto",
            strategy="staged")
    chain = chained(spec, source, out_dir, limit, args, reference)
    shutil.rmtree(work, ignore_errors=True)
    return {"spec": spec, "limit": limit, "ours": ours, "first": first, "oracle": oracle, "grid": screened,
            "finalists": finalists, "auto": auto, "chained": chain, "trials": last.trials if last else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=ISSUE_PIPELINES, help="specs separated by ';'")
    parser.add_argument("--memory-limit", default="1GiB", help="per worker")
    parser.add_argument("--shape", default="256x256x384", help="the synthetic SEG-Y volume")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=int, default=30, help="explore budget of each member")
    parser.add_argument("--repeats", type=int, default=8, help="rounds (rounded up to whole cycles of the design)")
    parser.add_argument("--finalists", type=int, default=3)
    parser.add_argument("--auto-repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="runs/bench/pipeline-runs", type=Path)
    parser.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                        help="run explore calibrate SPEC before ours (default: on)")
    args = parser.parse_args()
    limit = parse_size(args.memory_limit)
    specs = [s for s in args.pipelines.split(";") if s]
    explore_members(specs, args.cache, args.budget, limit)
    results = [bench_pipeline(spec, args, limit) for spec in specs]

    print(f"## Pipelines on Dask: {args.workers} workers x {args.threads} thread, "
          f"{format_bytes(limit)} per worker, volume {args.shape}\n")
    verdicts = []
    for r in results:
        oracle = r["oracle"].median if r["oracle"] is not None else float("inf")
        print(f"### `{r['spec']}`\n")
        print("| arm | chunks | runs | seconds, median (min-max) | / oracle | largest worker HWM (of limit) "
              "| workers lost | memory kills | max abs error |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for arm in [r["ours"], r["oracle"], r["chained"], r["auto"], r["first"]]:
            if arm is not None:
                print(arm.row(r["limit"], oracle))
        print()
        others = [a for a in r["finalists"] if a is not r["oracle"]]
        if others:
            print("Other finalists, same rounds: " + "; ".join(
                f"{a.detail} {a.median:.2f} s ({a.median / oracle:.2f}x)" for a in others) + ".")
        same = r["oracle"] is not None and r["ours"].plan_text == r["oracle"].detail
        compared = r["oracle"] is not None and r["ours"].ok
        interval = ratio_interval(round_pairs(r["ours"], r["oracle"])) if compared else "-"
        if compared:
            print(f"Ours / oracle, 95% interval of the ratio of medians (bootstrap over the rounds): "
                  f"{interval}"
                  + ("; ours' plan is the oracle's own, so this is the spread of one configuration timed "
                     "twice." if same else "."))
        print(f"Ours predicted {r['ours'].predicted:.2f} s." if r["ours"].predicted is not None else "")
        if r["trials"]:
            print(f"Ours' {trials_note(r['trials'])}.")
        print(f"{time_model_quality(r['grid'])}.\n")
        print("<details><summary>grid (screening: one run each)</summary>\n")
        print("| strategy chunks | seconds | predicted | predicted / seconds | largest HWM | lost |")
        print("|---|---:|---:|---:|---:|---:|")
        for arm in r["grid"]:
            hwm = max((x["hwm"] for x in arm.runs), default=0)
            secs = f"{arm.runs[0]['seconds']:.2f}" if arm.ok else "failed"
            ratio = f"{arm.predicted / arm.runs[0]['seconds']:.2f}" if arm.ok and arm.predicted else "-"
            predicted = "-" if arm.predicted is None else f"{arm.predicted:.2f}"
            print(f"| {arm.detail} | {secs} | {predicted} | {ratio} | {format_bytes(hwm)} | "
                  f"{sum(x['lost'] for x in arm.runs)} |")
        print("\n</details>\n")
        ours = r["ours"]
        hwm = max((x["hwm"] for x in ours.runs), default=0)
        safe = ours.ok and hwm <= r["limit"]
        fast = ours.ok and ours.median <= TIME_TARGET * oracle
        auto_killed = any(x["lost"] or x["kills"] for x in r["auto"].runs) or not r["auto"].ok
        own = "; ours ran the oracle's own plan" if same else ""
        verdicts.append(f"- `{r['spec']}`: ours {'safe' if safe else 'NOT safe'} (no worker lost, HWM "
                        f"{hwm / r['limit']:.0%} of the limit), {ours.median / oracle:.2f}x the oracle "
                        f"({'meets' if fast else 'misses'} <= {TIME_TARGET:.2f}x; 95% interval {interval}"
                        f"{own}); auto "
                        f"{'lost workers or failed' if auto_killed else 'did not fail at this limit'}")
    print("### Verdicts\n")
    print("\n".join(verdicts))
    print("\n### Time terms learnt (each calibration's `TimingFit`)\n")
    print(time_terms(specs, args.cache))
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
