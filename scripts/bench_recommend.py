"""Benchmark of ``explorer.recommend_chunks``' latency (issue 4: a warm call takes <= 20 ms).

    python scripts/bench_recommend.py [--operators gst3d,envelope,...] [--cache runs/bench]
        [--budget 30] [--calls 10] [--children 3]

1. **Models**: per operator, the model, in-worker calibration and worker baseline of
   ``explore(op, budget=--budget)`` (isolated profiles, then explore's in-worker probes;
   default target memory) in ``<cache>/recommend/runs-<op>``, explored there first if
   absent (``bench_chunks.ensure_model``), reused otherwise.
2. **Children**: ``--children`` fresh ``python`` processes per setting, each started
   with nothing but this file's ``child`` function, so the benchmark's own imports
   (torch from exploring, distributed) neither slow nor flatter a call.  A child
   times, with ``time.perf_counter``:

   * **cold**: ``import explorer`` and the first ``explorer.recommend_chunks`` call
     (importing ``explorer.plan.recommend`` and ``explorer.plan.chunk_plan``, the operators, loading
     the model's ``.npz``, the calibration and the saved worker baseline, reading Dask's
     config, the environment stamp); the interpreter's own start-up is not counted;
   * **warm**: then every case of the grid below, ``--calls`` calls each, the cases
     interleaved (one call of each case per round), so a case's calls are not
     back-to-back repeats on a hot cache line.  A warm call does everything a user's
     second call does: ``stat`` the model, calibration and baseline files (the caches are
     keyed on their mtimes), compare the environment stamps, plan (vectorised footprints of up to
     :data:`explorer.plan.candidates.MAX_CANDIDATES` shapes, model predictions of the
     candidates that can win);
   * which of torch, optuna and distributed are in ``sys.modules`` at the end
     (``recommend_chunks`` should import none of them).

   Cases: volume shapes 256x256x256, 800x600x1000 (the issue's example) and
   2000x2000x1500 (a 22 GiB survey), limits 1.5, 4 and 16 GiB, 1 or 4 threads per
   worker, 1 or 8 workers: 36 per operator.  A case whose limit is too small ends in
   ``ChunkPlanError``; its calls are timed like the rest (that is an answer, too).
3. **Settings**: with explore's in-worker calibration (what a user has after ``explore``),
   then without it (the file moved aside, and back at the end): the isolated model alone,
   as a model explored with ``--probes 0`` plans.  A pipeline (``--pipelines``) is planned
   from the model composed of its members' with their calibrations, then again after
   ``explore calibrate SPEC`` (its fused plans' own in-worker term and clock).

Per operator and setting: the cold first call (median over children), the warm calls'
median, 95th percentile and maximum over every call, the slowest case's median, and the
candidates a plan predicted (median).  Target: every case's median warm call <= 20 ms
(:data:`WARM_TARGET_SECONDS`); the single slowest call is printed beside it.  Progress on
stderr, Markdown on stdout, the machine line last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

WARM_TARGET_SECONDS = 0.020
SHAPES = ("256x256x256", "800x600x1000", "2000x2000x1500")
LIMITS = ("1.5GiB", "4GiB", "16GiB")
THREADS = (1, 4)
WORKERS = (1, 8)
HEAVY_MODULES = ("torch", "optuna", "distributed")


def cases() -> list[tuple[str, str, int, int]]:
    return list(itertools.product(SHAPES, LIMITS, THREADS, WORKERS))


# --------------------------------------------------------------------------- the child


def child(spec: dict) -> dict:
    """Run in a fresh interpreter: the cold call, then the warm grid.  Returns JSON-ready timings."""
    started = time.perf_counter()
    import explorer

    recommend = explorer.recommend_chunks
    imported = time.perf_counter()
    from explorer.plan.chunk_plan import ChunkPlanError

    runs, op, grid, calls = spec["runs_dir"], spec["operator"], spec["cases"], spec["calls"]

    def call(case):
        shape, limit, threads, workers = case
        try:
            plan = recommend(op, shape, limit, threads_per_worker=threads, workers=workers, runs_dir=runs)
            return plan.n_candidates
        except ChunkPlanError:
            return None

    call(grid[0])
    cold = time.perf_counter() - started
    seconds = [[] for _ in grid]
    candidates = [None] * len(grid)
    for _ in range(calls):
        for i, case in enumerate(grid):
            t0 = time.perf_counter()
            candidates[i] = call(case)
            seconds[i].append(time.perf_counter() - t0)
    return {
        "cold_seconds": cold,
        "import_seconds": imported - started,
        "seconds": seconds,
        "candidates": candidates,
        "heavy_modules": [m for m in HEAVY_MODULES if m in sys.modules],
    }


def run_child(spec: dict) -> dict:
    code = ("import json, runpy, sys; b = runpy.run_path(%r); "
            "print(json.dumps(b['child'](json.loads(sys.stdin.read()))))" % str(HERE / "bench_recommend.py"))
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(spec), capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the parent


def summarise(results: list[dict], grid) -> dict:
    import numpy as np  # here, not at the top: a child must not have numpy before its timed import

    every = [s for r in results for case in r["seconds"] for s in case]
    per_case = [statistics.median(s for r in results for s in r["seconds"][i]) for i in range(len(grid))]
    slowest = max(range(len(grid)), key=per_case.__getitem__)
    planned = [c for c in results[0]["candidates"] if c is not None]
    return {
        "cold": statistics.median(r["cold_seconds"] for r in results),
        "import": statistics.median(r["import_seconds"] for r in results),
        "median": statistics.median(every),
        "p95": float(np.percentile(every, 95, method="nearest")),
        "max": max(every),
        "calls": len(every),
        "slowest_case": grid[slowest],
        "slowest_case_median": per_case[slowest],
        "errors": sum(c is None for c in results[0]["candidates"]),
        "candidates": statistics.median(planned) if planned else None,
        "heavy": sorted({m for r in results for m in r["heavy_modules"]}),
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operators", default=None, help="comma-separated (default: every registered operator)")
    parser.add_argument("--cache", default="runs/bench", help="models go to CACHE/recommend/runs-<op>")
    parser.add_argument("--budget", type=int, default=30, help="explore budget (profiles) per model")
    parser.add_argument("--calls", type=int, default=10, help="warm calls per case per child")
    parser.add_argument("--children", type=int, default=3, help="fresh processes per operator and setting")
    parser.add_argument("--pipelines", default="", help="pipeline specs separated by ';': each planned from the "
                        "model composed of its members' (explored as operators are, their in-worker "
                        "calibrations with them: auto weighs fused against staged)")
    args = parser.parse_args(argv)

    import operators
    from bench_chunks import ensure_model, log
    from explorer.plan import calibration
    from explorer.core.machine import default_memory_limit
    from harness.machine import machine_line

    names = args.operators.split(",") if args.operators else sorted(operators.names())
    for name in names:
        operators.get(name)
    grid = cases()
    rows = []
    for name in names:
        runs = Path(args.cache) / "recommend" / f"runs-{name}"
        explored = ensure_model(name, default_memory_limit(), runs, args.budget)
        cal_path = calibration.calibration_path(name, runs)
        aside = cal_path.with_name(cal_path.name + ".aside")
        for setting in ("probes", "none"):
            if setting == "none":
                os.replace(cal_path, aside)
            spec = {"runs_dir": str(runs), "operator": name, "cases": grid, "calls": args.calls}
            results = []
            for k in range(args.children):
                results.append(run_child(spec))
                log(f"{name} calibration {setting}: child {k + 1}/{args.children}: cold "
                    f"{ms(results[-1]['cold_seconds'])} ms")
            summary = summarise(results, grid)
            summary.update(operator=name, setting=setting, profiles=explored.get("profiles"))
            rows.append(summary)
        os.replace(aside, cal_path)
    for index, spec_text in enumerate(s for s in args.pipelines.split(";") if s):
        pipeline = operators.get(spec_text)
        runs = Path(args.cache) / "recommend" / f"runs-pipeline-{index}"
        for member in {m.name for m in pipeline.members}:
            member_runs = Path(args.cache) / "recommend" / f"runs-{member}"
            ensure_model(member, default_memory_limit(), member_runs, args.budget)
            target = runs / member
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(member_runs / member / "model.npz", target / "model.npz")
            member_calibration = calibration.calibration_path(member, member_runs)
            if member_calibration.exists():
                shutil.copy2(member_calibration, calibration.calibration_path(member, runs))
        spec = {"runs_dir": str(runs), "operator": pipeline.name, "cases": grid, "calls": 1}
        run_child(spec)  # measures and saves this machine's idle-worker baseline for the spec once
        spec["calls"] = args.calls
        for setting in ("composed, members calibrated", "composed, members and pipeline calibrated"):
            if setting.endswith("pipeline calibrated"):  # what `explore calibrate SPEC` adds: fused plans' own term
                from explorer.runner.probes import calibrate_in_workers

                if calibration.load_calibration(pipeline.name, runs) is None:
                    log(f"{pipeline.name}: explore calibrate")
                    calibrate_in_workers(pipeline.name, memory_limit=default_memory_limit(), runs_dir=runs)
            results = [run_child(spec) for _ in range(args.children)]
            log(f"{pipeline.name} ({setting}): {args.children} children")
            summary = summarise(results, grid)
            summary.update(operator=f"`{pipeline.name}`", setting=setting, profiles=0)
            rows.append(summary)

    load = os.getloadavg()
    print("## recommend_chunks latency\n")
    print(f"`python scripts/bench_recommend.py {' '.join(argv if argv is not None else sys.argv[1:])}`".replace(" `", "`"))
    print(f"\n{len(grid)} cases per operator ({' / '.join(SHAPES)}; {' / '.join(LIMITS)}; "
          f"threads {THREADS}; workers {WORKERS}), {args.calls} warm calls each, in each of "
          f"{args.children} fresh processes per row.  Times in ms.\n")
    print("| operator | calibration | profiles | cold first call (import) | warm median | warm p95 | warm max "
          "| slowest case (its median) | no plan fits | candidates predicted | torch / optuna / distributed imported |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape, limit, threads, workers = r["slowest_case"]
        print(f"| {r['operator']} | {r['setting']} | {r['profiles']} | {ms(r['cold'])} ({ms(r['import'])}) "
              f"| {ms(r['median'])} | {ms(r['p95'])} | {ms(r['max'])} "
              f"| {shape} @ {limit}, {threads} thr, {workers} wkr ({ms(r['slowest_case_median'])}) "
              f"| {r['errors']}/{len(grid)} | {r['candidates']:.0f} | {', '.join(r['heavy']) or 'none'} |")
    worst = max(rows, key=lambda r: r["slowest_case_median"])
    verdict = "PASS" if worst["slowest_case_median"] <= WARM_TARGET_SECONDS else "FAIL"
    calls = sum(r["calls"] for r in rows)
    print(f"\n- {verdict} warm recommend_chunks <= {WARM_TARGET_SECONDS * 1e3:.0f} ms: slowest case median "
          f"{ms(worst['slowest_case_median'])} ms ({worst['operator']}, calibration {worst['setting']}); "
          f"slowest single call of {calls:,}: {ms(max(r['max'] for r in rows))} ms")
    heavy = sorted({m for r in rows for m in r["heavy"]})
    print(f"- {'PASS' if not heavy else 'FAIL'} recommend_chunks imports none of torch, optuna, distributed"
          f"{': imported ' + ', '.join(heavy) if heavy else ''}")
    print(f"\nLoad average at end: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min).  "
          f"Benchmark wall time {time.perf_counter() - STARTED:.0f} s.")
    print(f"\nMachine: {machine_line()}")
    return 0 if verdict == "PASS" and not heavy else 1


STARTED = time.perf_counter()

if __name__ == "__main__":
    sys.exit(main())
