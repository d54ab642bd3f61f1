"""Is the bound's confidence earned?  Coverage at several levels, at the loop's own stop.

For each operator and seed: ``explore(operator, seed=seed, probes=0)`` with the defaults a user
gets (budget 30, tolerance 5 %, confidence 99 %) into a fresh runs directory, targeting a
worker of ``--memory-limit`` (default 1 GiB); the saved model (certified, with ``converged``)
is then scored on held-out shapes drawn afresh for that seed, each profiled once for real
(``explorer.measure.profiling.Profiler``, a server of its own, not the loop's) as a new run:

* ``--region`` (default 12) shapes whose task memory ``4 V + mean`` (by the saved model) is
  stratified log-uniform in [1 %, 100 %] of the memory limit: the target region chunk sizing
  asks about (``acquisition.target_mask``), any aspect a plan can produce (free axes within a
  factor 8 of each other, ``acquisition.MAX_BLOCK_ASPECT``; an axis that must stay whole
  log-uniform in [8, 2048]);
* three shapes of 2x, 4x and 8x the largest volume the loop profiled (extrapolation).

The draws (:func:`draw_held_out`) depend only on the seed, the saved model and the operator's
declaration; the rule and its seeds were committed with this script before its first
measurement.  A held-out shape whose predicted ``input + upper`` exceeds the profiling cap is
skipped and counted.  The truth is one run's ``peak_bytes``; its PIT is the saved model's
predictive CDF there, ``F_nu((y - m) / s)`` (``MemoryModel.predictive_t``), so the bound at
level ``c`` covers it exactly when ``PIT <= c``.

Reported per operator, per set (the three families nobody tuned for, in
``scripts/unseen_operators.py``; the eight shipped operators) and pooled, with converged
loops and budget-ended ones apart: coverage at 50/80/90/95/99 % with Clopper-Pearson 95 %
intervals, the profiles at the stop, MAPE and the median upper/true at 99 %; pictures: the
PIT histogram and the reliability diagram of each set (``--figures``).  Every (operator,
seed) result is written to ``--cache`` as soon as it is measured (a rerun resumes).

    python scripts/calibration.py [--sets unseen,shipped] [--operators a,b] [--seeds 10]
        [--memory-limit 1GiB] [--cache runs/calibration] [--output FILE] [--figures docs/figures]
        [--report-only] [--from OP=CACHE:FIRST:N ...]

Prints Markdown and the machine line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
from harness.plugins import use_plugin  # noqa: E402

use_plugin("unseen_operators", HERE)

import operators  # noqa: E402
from explorer.exploration import explore  # noqa: E402
from operators.plugins import load_plugins  # noqa: E402
from explorer.measure.profiling import OK, Profiler, default_memory_cap  # noqa: E402
from explorer.core.atomic import atomic_write_text  # noqa: E402
from explorer.core.units import format_bytes, format_shape, parse_size  # noqa: E402
from harness.coverage import clopper_pearson  # noqa: E402
from harness.machine import machine_line  # noqa: E402
from harness.report import emit  # noqa: E402
from harness.shapes import place_shape  # noqa: E402

load_plugins()

SETS = {
    "unseen": ("unseen_fft_samples", "unseen_median", "unseen_torch_conv"),
    "shipped": ("gst3d", "envelope", "first_derivative", "gaussian", "instantaneous_frequency",
                "instantaneous_phase", "semblance", "unet3d"),
}
LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)
EXTRAPOLATION_FACTORS = (2, 4, 8)
#: explore's own default budget, what a user gets.
DEFAULT_BUDGET = inspect.signature(explore).parameters["budget"].default
#: The held-out draws' seed sequence: ``[seed, DRAW_STREAM]`` (fixed before the first measurement).
DRAW_STREAM = 3302
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# The held-out draws
# --------------------------------------------------------------------------------------


def draw_held_out(model, op, limit: float, seed: int, n_region: int, v_max: float):
    """``[(shape, kind)]``: ``n_region`` target-region shapes (task memory stratified
    log-uniform in [1 %, 100 %] of ``limit``) and one shape each at 2x, 4x and 8x ``v_max``."""
    rng = np.random.default_rng([seed, DRAW_STREAM])

    def task(shape):
        return 4.0 * float(np.prod(shape)) + float(model.predict_many(np.asarray([shape], dtype=np.float64))[0][0])

    fractions = 10.0 ** (-2.0 + 2.0 * (np.arange(n_region) + rng.uniform(0, 1, n_region)) / n_region)
    drawn = [(place_shape(rng, op.whole_axes, task, f * limit), "region") for f in fractions]
    drawn += [(place_shape(rng, op.whole_axes, lambda s: float(np.prod(s)), k * v_max), f"{k}x volume")
              for k in EXTRAPOLATION_FACTORS]
    return [(s, kind) for s, kind in drawn if s is not None]


# --------------------------------------------------------------------------------------
# One (operator, seed)
# --------------------------------------------------------------------------------------


def measure(operator: str, seed: int, args, work: Path) -> dict:
    """Explore, draw, profile the truths, score them: the cache entry of one (operator, seed)."""
    from scipy.special import stdtr

    from explorer.model.load import load_model

    op = operators.get(operator)
    runs = work / f"{operator}-{seed}"
    log(f"{operator} seed {seed}: explore")
    budget = {} if args.budget is None else {"budget": args.budget}
    result = explore(operator, seed=seed, probes=0, report=False, runs_dir=runs, memory_limit=args.limit, **budget)
    entry = {"operator": operator, "seed": seed, "budget": args.budget or DEFAULT_BUDGET, "profiles": result.profiles,
             "converged": result.converged,
             "stopped_because": result.stopped_because, "seconds": result.seconds,
             "operator_seconds": result.operator_seconds, "certified_factor": result.certified_factor,
             "half_width": result.max_relative_uncertainty, "regime": result.regime, "held_out": [], "skipped": []}
    if result.model_path is None:
        return entry
    model = load_model(operator, runs)
    v_max = float(np.max(np.prod(model.train_shapes.astype(np.float64), axis=1)))
    cap = default_memory_cap()
    profiler = Profiler(gpu=False)
    try:
        for shape, kind in draw_held_out(model, op, args.limit, seed, args.region, v_max):
            location, scale, dof = model.predictive_t(np.asarray([shape], dtype=np.float64))
            _, upper = model.predict_many(np.asarray([shape], dtype=np.float64), 0.99)
            if 4.0 * np.prod(shape) + upper[0] > cap:
                entry["skipped"].append({"shape": list(shape), "kind": kind, "why": "input + upper above the cap"})
                continue
            m = profiler.profile(operator, shape, repeat=1, memory_cap=cap)
            if m.status != OK or m.peak_bytes is None:
                entry["skipped"].append({"shape": list(shape), "kind": kind, "why": f"{m.status}: {m.error}"})
                continue
            y = float(m.peak_bytes)
            entry["held_out"].append({
                "shape": list(shape), "kind": kind, "peak_bytes": y, "mean_bytes": float(location[0]),
                "scale_bytes": float(scale[0]), "dof": float(dof), "upper99_bytes": float(upper[0]),
                "pit": float(stdtr(dof, (y - location[0]) / scale[0]))})
            log(f"  {operator} seed {seed} {kind} {format_shape(shape)}: {format_bytes(y)} "
                f"(mean {format_bytes(location[0])}, 99% {format_bytes(upper[0])})")
    finally:
        profiler.close()
    return entry


# --------------------------------------------------------------------------------------
# Statistics and report
# --------------------------------------------------------------------------------------


def verdict(k: int, n: int, level: float) -> str:
    """Whether ``k`` of ``n`` covered is consistent with ``level`` (honest), above it
    (conservative) or below it (over-confident), by the Clopper-Pearson 95 % interval."""
    lo, hi = clopper_pearson(k, n)
    return "honest" if lo <= level <= hi else ("conservative" if lo > level else "OVER-CONFIDENT")


def row(label: str, entries: list[dict]) -> str:
    held = [h for e in entries for h in e["held_out"]]
    if not held:
        return f"| {label} | {len(entries)} | - | - | 0 | - | - |" + " - |" * len(LEVELS)
    pit = np.array([h["pit"] for h in held])
    peaks = np.array([h["peak_bytes"] for h in held])
    ape = np.abs(np.array([h["mean_bytes"] for h in held]) - peaks) / peaks
    ratio = np.array([h["upper99_bytes"] for h in held]) / peaks
    profiles = [e["profiles"] for e in entries]
    cells = []
    for c in LEVELS:
        k = int(np.sum(pit <= c))
        lo, hi = clopper_pearson(k, len(pit))
        cells.append(f"{k / len(pit):.1%} ({lo:.1%}-{hi:.1%}) {verdict(k, len(pit), c)}")
    distinct = len({(e["operator"], tuple(h["shape"])) for e in entries for h in e["held_out"]})
    return (f"| {label} | {len(entries)} | {int(np.median(profiles))} ({min(profiles)}-{max(profiles)}) | "
            f"{sum(bool(e['converged']) for e in entries)} | {len(pit)} ({distinct} distinct) | {np.mean(ape):.2%} | "
            f"{np.median(ratio):.3f} | " + " | ".join(cells) + " |")


def report(results: dict, sets: dict, args) -> str:
    spent = sorted({e.get("budget", DEFAULT_BUDGET) for entries in results.values() for e in entries})
    budgets = ", ".join(map(str, spent or [DEFAULT_BUDGET])) + (
        "" if spent in ([], [DEFAULT_BUDGET]) else f" in place of explore's {DEFAULT_BUDGET}")
    lines = [f"`python scripts/{Path(__file__).name} {' '.join(sys.argv[1:])}`", "",
             f"Commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; target worker memory "
             f"{format_bytes(args.limit)}; explore's defaults (budget {budgets}, tolerance 5 %, 99 %), probes off; "
             f"held-out: {args.region} region shapes and 3 extrapolation shapes per (operator, seed), each one new "
             "run in a profiling server of its own.", ""]
    header = ("| operator | loops | profiles at the stop (median, range) | converged | held-out runs | MAPE | "
              "median upper/true at 99% | " + " | ".join(f"{c:.0%} coverage (95% CI)" for c in LEVELS) + " |")
    for name, ops in sets.items():
        entries = [e for op in ops for e in results.get(op, [])]
        if not entries:
            continue
        lines += [f"### {name}: {', '.join(ops)}", "", header, "|" + "---|" * (header.count("|") - 1)]
        for op in ops:
            if results.get(op):
                lines.append(row(f"`{op}`", results[op]))
        lines.append(row(f"**{name}, all loops**", entries))
        lines.append(row(f"{name}, converged loops", [e for e in entries if e["converged"]]))
        lines.append(row(f"{name}, budget-ended loops", [e for e in entries if not e["converged"]]))
        lines.append("")
        skipped = [(e["operator"], s) for e in entries for s in e["skipped"]]
        if skipped:
            lines.append(f"Skipped held-out shapes: {len(skipped)} ("
                         + "; ".join(f"{op} {format_shape(s['shape'])} {s['kind']}: {s['why']}" for op, s in skipped[:8])
                         + (" ..." if len(skipped) > 8 else "") + ").")
            lines.append("")
    lines.append(f"Machine: {machine_line()}")
    return "\n".join(lines)


def figures(results: dict, sets: dict, directory: Path) -> list[Path]:
    """The PIT histogram and the reliability diagram of each set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, ops in sets.items():
        held = [h for op in ops for e in results.get(op, []) for h in e["held_out"]]
        if not held:
            continue
        pit = np.sort(np.array([h["pit"] for h in held]))
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        left.hist(pit, bins=20, range=(0, 1), color="#4c72b0", edgecolor="white")
        left.axhline(len(pit) / 20, color="k", lw=1, ls="--", label="uniform (honest at every level)")
        left.set_xlabel("PIT: the saved model's predictive CDF at the new run")
        left.set_ylabel("held-out runs")
        left.set_title(f"{name}: PIT histogram ({len(pit)} runs)")
        left.legend(loc="upper left", fontsize=8)
        levels = np.linspace(0.01, 0.99, 99)
        observed = np.array([np.mean(pit <= c) for c in levels])
        band = np.array([clopper_pearson(int(round(c * len(pit))), len(pit)) for c in levels])
        right.fill_between(levels, band[:, 0], band[:, 1], color="0.85", label="95% band of an honest bound")
        right.plot([0, 1], [0, 1], "k--", lw=1)
        right.plot(levels, observed, color="#c44e52", lw=2, label="held-out coverage")
        for c in LEVELS:
            right.plot([c], [np.mean(pit <= c)], "o", color="#c44e52")
        right.set_xlabel("nominal level of the one-sided bound")
        right.set_ylabel("fraction of new runs under it")
        right.set_title(f"{name}: reliability")
        right.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"calibration_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "explorer", "operators"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (explorer/ or operators/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --------------------------------------------------------------------------------------


def _source(text: str) -> tuple[str, tuple[Path, range]]:
    """``--from``'s ``OP=CACHE:FIRST:N`` as ``(OP, (CACHE, seeds))``."""
    operator, _, rest = text.partition("=")
    where, _, seeds = rest.rpartition(":")
    where, _, first = where.rpartition(":")
    if not (operator and where and first.isdigit() and seeds.isdigit()):
        raise ValueError(f"--from {text!r}: expected OP=CACHE:FIRST:N")
    return operator, (Path(where), range(int(first), int(first) + int(seeds)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="unseen,shipped")
    parser.add_argument("--operators", default=None, help="only these (comma-separated), of the sets")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--region", type=int, default=12)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--budget", type=int, default=None,
                        help=f"explore's budget (default: explore's own, {DEFAULT_BUDGET}); use a cache of its own")
    parser.add_argument("--cache", default="runs/calibration")
    parser.add_argument("--output", default=None)
    parser.add_argument("--figures", default=None, help="directory for the PIT and reliability pictures")
    parser.add_argument("--report-only", action="store_true", help="report what the cache holds, measure nothing")
    parser.add_argument("--from", dest="sources", action="append", default=[], metavar="OP=CACHE:FIRST:N",
                        help="report OP's entries of seeds FIRST..FIRST+N-1 from CACHE, in place of --cache, "
                             "--first-seed and --seeds; never measures them (repeatable)")
    args = parser.parse_args()
    args.limit = parse_size(args.memory_limit)
    sets = {name: SETS[name] for name in args.sets.split(",")}
    only = None if args.operators is None else set(args.operators.split(","))
    try:
        sources = dict(_source(text) for text in args.sources)
    except ValueError as error:
        parser.error(str(error))
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    work = None
    for ops in sets.values():
        for operator in ops:
            where, seeds = sources.get(operator, (cache, range(args.first_seed, args.first_seed + args.seeds)))
            for seed in seeds:
                path = where / f"{operator}-seed{seed}-{args.memory_limit}.json"
                if path.exists():
                    entry = json.loads(path.read_text())
                elif args.report_only or operator in sources or (only is not None and operator not in only):
                    continue
                else:
                    work = work or Path(tempfile.mkdtemp(prefix="calibration-", dir=cache))
                    entry = measure(operator, seed, args, work)
                    atomic_write_text(path, json.dumps(entry, indent=1))
                results.setdefault(operator, []).append(entry)
    text = report(results, sets, args)
    if args.figures:
        for path in figures(results, sets, Path(args.figures)):
            text += f"\n\n![{path.stem}]({os.path.relpath(path, Path(args.output).parent if args.output else ROOT)})"
    emit(text, args.output)


if __name__ == "__main__":
    main()
