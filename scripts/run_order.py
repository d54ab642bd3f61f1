"""Does a Dask run's time depend on the run before it?  One pipeline's plans run on a fresh
``LocalCluster`` each, in a fixed sequence, one process; each run's seconds are grouped by the
plan that ran just before it.

Its ``any`` rows pool a plan's runs whatever ran before: with a sequence that puts every plan
after every other equally often, an A/B (or A/B/C) of plans on one operator (``--spec`` a single
operator: its plans ``fused:CHUNKS``).

This is why the Dask benchmarks order their rounds by a Williams design
(``harness/rounds.py``): if a plan runs slower after some plans than after itself, an order
that always puts one arm after the same neighbour biases that arm.

    python scripts/run_order.py [--spec gaussian,gst3d] [--shape 256x256x384]
        [--memory-limit 1GiB] [--plans A=staged:128x128x192,B=fused:128x128x192,C=staged:86x86x192]
        [--sequence AAAAABABABABABACACACACAAAA] [--cache runs/bench/run-order]

The spec's members are explored into ``--cache`` first when they have no model there, as
``bench_pipeline_runs.py`` explores them (budget 30, with their in-worker probes; the plans are
explicit, so only their bounds need one).  Seconds are
``RunResult.seconds`` (graph submitted to output complete, ``refine=False``).  Prints a
Markdown table (median, runs, every run's seconds per (plan, plan before)) and the machine line.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.machine import machine_line


def parse_plans(text: str) -> dict[str, dict]:
    """``A=staged:128x128x192,B=...`` -> ``{"A": {"strategy": "staged", "chunks": (128, 128, 192)}, ...}``."""
    from explorer.core.units import parse_shape

    plans = {}
    for item in text.split(","):
        name, _, plan = item.partition("=")
        strategy, _, chunks = plan.partition(":")
        plans[name] = {"strategy": strategy, "chunks": parse_shape(chunks)}
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="gaussian,gst3d")
    parser.add_argument("--shape", default="256x256x384")
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--plans", default="A=staged:128x128x192,B=fused:128x128x192,C=staged:86x86x192")
    parser.add_argument("--sequence", default="AAAAABABABABABACACACACAAAA")
    parser.add_argument("--cache", default="runs/bench/run-order", type=Path)
    args = parser.parse_args()

    import operators
    from bench_pipeline_runs import explore_members
    from explorer.runner.daskrun import run
    from explorer.core.units import format_shape, parse_shape, parse_size

    plans = parse_plans(args.plans)
    unknown = set(args.sequence) - set(plans)
    if unknown:
        raise SystemExit(f"--sequence names plans not in --plans: {', '.join(sorted(unknown))}")
    explore_members([args.spec], args.cache, 30, parse_size(args.memory_limit))
    shape = parse_shape(args.shape)
    work = Path(tempfile.mkdtemp(prefix="run-order-"))
    source = work / "in.sgy"
    operators.write_segy(source, operators.synthetic_volume(shape, seed=0))
    groups: dict[tuple[str, str], list[float]] = {}
    before = "-"
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        for name in args.sequence:
            out = work / f"out-{time.monotonic_ns()}.zarr"
            r = run(args.spec, source, out, memory_limit=args.memory_limit, workers=2, threads=1,
                    runs_dir=args.cache, refine=False, replan=False, trials=False, **plans[name], check=False)
            shutil.rmtree(out, ignore_errors=True)
            if r.status != "ok":
                raise SystemExit(f"plan {name} ({plans[name]}) ended {r.status}: {r.error}")
            groups.setdefault((name, before), []).append(r.seconds)
            print(f"{name} after {before}: {r.seconds:.2f} s", file=sys.stderr, flush=True)
            before = name
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"## `{args.spec}` on {args.shape}, 2 workers x 1 thread x {args.memory_limit}: seconds by the plan "
          f"before ({started})\n")
    print("Plans: " + "; ".join(f"{k} = {v['strategy']} {format_shape(v['chunks'])}" for k, v in plans.items())
          + f". Sequence: `{args.sequence}`.\n")
    print("| plan | after | runs | median s | every run's s |")
    print("|---|---|---:|---:|---|")
    for (name, prior), seconds in sorted(groups.items()):
        print(f"| {name} | {prior} | {len(seconds)} | {statistics.median(seconds):.2f} | "
              f"{', '.join(f'{s:.2f}' for s in seconds)} |")
    for name in plans:  # every run of a plan, whatever ran before it
        seconds = [s for (n, _), runs in groups.items() if n == name for s in runs]
        if seconds:
            print(f"| {name} | any | {len(seconds)} | {statistics.median(seconds):.2f} | "
                  f"{', '.join(f'{s:.2f}' for s in seconds)} |")
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
