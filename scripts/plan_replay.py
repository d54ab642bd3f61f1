"""A ``bench_chunks.py`` run's plan made again, and the shapes it was chosen over priced beside it.

For one scenario of a ``bench_chunks.py --json`` file and the cache it ran with, takes the
conditions its first ``ours (refine=False)`` run planned under (the workers' baseline and the
first-touch terms its probe measured, saved in the JSON) and the model it explored (in the
cache), plans again with ``recommend_chunks`` and prices each chunk shape given with
``plan_for_chunks``: predicted seconds, the clock's seconds per voxel and spread at the block,
and the upper footprint, in bytes (the ranking's keys compare them exactly).  No cluster is
started: it shows what the planner saw, not what the run measured.

    python scripts/plan_replay.py BENCH_JSON CACHE OPERATOR SHAPE LIMIT [--chunks AxBxC ...] [--workers N]
    python scripts/plan_replay.py /tmp/bcQ.json /tmp/bcQ first_derivative 320x320x320 384MiB \\
        --chunks 160x160x320,80x320x320,160x320x320
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from bench_chunks import chunks_cache, scenario_runs_dir
from explorer.core.units import parse_shape, parse_size
from explorer.measure.worker_baseline import WorkerBaseline
from explorer.plan.recommend import plan_for_chunks, recommend_chunks


def run_baseline(run: dict) -> WorkerBaseline:
    """The workers' baseline a ``bench_chunks.py --json`` run planned under: its bytes and the
    first-touch terms its probe measured (``plan_first_touch``)."""
    touch = run.get("plan_first_touch") or {}
    return WorkerBaseline(bytes=int(run["worker_baseline_bytes"]),
                          first_touch_seconds_per_byte=touch.get("seconds_per_byte"),
                          first_touch_warm_bytes=touch.get("warm_bytes"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("cache", type=Path)
    parser.add_argument("operator")
    parser.add_argument("shape")
    parser.add_argument("limit")
    parser.add_argument("--chunks", default="", help="comma-separated chunk shapes to price beside the plan")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    shape, limit = parse_shape(args.shape), parse_size(args.limit)
    runs = [r for r in json.loads(args.bench_json.read_text()) if r["operator"] == args.operator
            and tuple(r["shape"]) == tuple(shape) and r["limit_bytes"] == limit
            and r["method"].startswith("ours") and not r.get("refine")]
    if not runs:
        parser.error(f"no ours (refine=False) run of {args.operator} {args.shape} at {args.limit} in {args.bench_json}")
    run = runs[0]
    touch = run.get("plan_first_touch") or {}
    baseline = run_baseline(run)
    runs_dir = scenario_runs_dir(chunks_cache(args.cache), args.operator, limit)
    common = dict(workers=args.workers, runs_dir=runs_dir, baseline_bytes=baseline)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the saved baseline's environment is not kept in the JSON
        plan = recommend_chunks(args.operator, shape, limit, **common)
        print(f"{args.operator} {args.shape} at {args.limit}, {args.workers} workers; the run's first-touch terms "
              f"{touch}, baseline {baseline.bytes} bytes; {len(runs)} runs, the first one's chunks "
              f"{'x'.join(map(str, run['chunks']))}")
        print(f"plan {'x'.join(map(str, plan.chunks))}: {plan.n_tasks} tasks, {plan.predicted_seconds:.4f} s; tied: "
              + (", ".join(f"{'x'.join(map(str, t['chunks']))} ({t['predicted_seconds']:.4f} s)" for t in plan.tied)
                 or "none"))
        print("| chunks | tasks | predicted s | s per voxel | spread | upper footprint (bytes) |")
        print("|---|---|---|---|---|---|")
        for text in filter(None, args.chunks.split(",")):
            priced = plan_for_chunks(args.operator, shape, parse_shape(text), limit, **common)
            print(f"| {text} | {priced.n_tasks} | {priced.predicted_seconds:.4f} | "
                  f"{priced.seconds_per_voxel * 1e9:.1f} ns | {priced.task_spread or 0:.3f} | {priced.upper_bytes:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
