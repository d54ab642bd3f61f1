"""``bench_chunks.py`` runs' scenarios planned again with the checkout's own calibration code.

For each ``bench_chunks.py --json`` file and the cache it ran with, copies every scenario's explored
store (``bench_chunks.scenario_runs_dir``) under ``--into``, refits its calibration there with this
checkout's ``explorer.plan.calibration.calibrate`` (the clock, the in-worker bound), plans the
scenario again with ``recommend_chunks`` at its first ``ours (refine=False)`` run's baseline and
first-touch terms, and prints that plan beside the plan the run took, each with its measured median
over the fastest measured chunking of the run (grid or ours, at least three runs), or "unmeasured".
No cluster is started.  Run it at two commits (``--into`` a different directory each) to see which
plans a change of the calibration's code moves; it is a diagnostic on past runs, not a benchmark.

    python scripts/replan_refitted.py --into /tmp/replan-new /tmp/bcQ.json:/tmp/bcQ /tmp/bcR.json:/tmp/bcR
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import warnings
from pathlib import Path

import numpy as np

from bench_chunks import chunks_cache, scenario_runs_dir
from explorer.core.units import format_shape
from explorer.model.load import load_model
from explorer.plan.calibration import calibrate
from explorer.plan.recommend import recommend_chunks
from explorer.search.store import Store
from plan_replay import run_baseline


def measured_medians(rows, op, shape, limit) -> dict[str, float]:
    """Per chunk shape, the median seconds of the scenario's ok runs (grid and ours), where it ran three times or more."""
    times = collections.defaultdict(list)
    for x in rows:
        if (x["operator"], tuple(x["shape"]), x["limit_bytes"]) == (op, shape, limit) and x["status"] == "ok" \
                and x["chunks"] and x["kind"] in ("grid", "ours"):
            times[format_shape(x["chunks"])].append(x["seconds"])
    return {c: float(np.median(v)) for c, v in times.items() if len(v) >= 3}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="BENCH_JSON:CACHE pairs")
    parser.add_argument("--into", type=Path, required=True, help="where the refitted copies go (made afresh)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    shutil.rmtree(args.into, ignore_errors=True)
    for pair in args.runs:
        bench_json, cache = (Path(p) for p in pair.split(":", 1))
        rows = json.loads(bench_json.read_text())
        firsts = {}
        for r in rows:
            if r["method"].startswith("ours") and not r.get("refine"):
                firsts.setdefault((r["operator"], tuple(r["shape"]), r["limit_bytes"]), r)
        for (op, shape, limit), first in firsts.items():
            copy = scenario_runs_dir(chunks_cache(args.into / bench_json.stem), op, limit)
            shutil.copytree(scenario_runs_dir(chunks_cache(cache), op, limit), copy)
            saved = json.loads((copy / op / "calibration.json").read_text())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the saved baseline's environment is not kept in the JSON
                calibrate(op, Store(copy), load_model(op, copy), runs_dir=copy, environment=saved["environment"])
                plan = recommend_chunks(op, shape, limit, workers=args.workers, runs_dir=copy,
                                        baseline_bytes=run_baseline(first))
            medians = measured_medians(rows, op, shape, limit)
            fastest = min(medians.values(), default=None)

            def rel(chunks: str) -> str:
                return f"{medians[chunks] / fastest:.3f}" if chunks in medians else "unmeasured"
            took, again = format_shape(first["chunks"]), format_shape(plan.chunks)
            print(f"{bench_json.stem} {op} {format_shape(shape)}: the run took {took} ({rel(took)}), "
                  f"planned again {again} ({rel(again)})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
