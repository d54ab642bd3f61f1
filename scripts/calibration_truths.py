"""The explore loop's stop and its bound on known, deliberately misspecified truths.

No processes: each truth is a function of the block shape (memory the surrogate's
polynomial mean cannot express, or can), driven through the ask/tell core
(``explorer.search.core.ExplorationCore``) exactly as ``explore`` drives it with real
profiles; a profile is two noisy runs of the truth.  Where the loop stops on its own, the
model's predictive is scored on held-out new runs: the target region's shapes (about 300 per
seed) and shapes of 2x, 4x and 8x the largest profiled volume.  Per truth: the profiles at the
stop, how many loops converged, and the coverage of the one-sided bound at 50/80/90/95/99%
with Clopper-Pearson 95% intervals.  These truths are the development bench of the statistics
(``docs/model.md``); the benchmark of record runs real operators (``scripts/calibration.py``).

    python scripts/calibration_truths.py [--truths poly,jitter,...] [--seeds 8] [--budget 30]
        [--set MODULE.NAME=VALUE ...]

``--set`` overrides one of the statistics' stated constants for a sensitivity run (e.g.
``--set explorer.model.stats.SCALE_PRIOR_DOF=4``, ``--set explorer.search.acquisition.EVIDENCE_SHARE=0.2``,
``--set explorer.model.priors._RUN_NOISE_PRIOR=0.02,4``).

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from pathlib import Path

import numpy as np

from explorer.search.core import ExplorationCore
from explorer.search.store import Record
from harness.coverage import clopper_pearson
from harness.machine import machine_line
from operators.base import Operator, register

MiB = 2**20
LIMIT = 1024 * MiB
#: A run's noise: a relative and an absolute part (sd), unlike the surrogate's run-noise prior
#: (0.5 %), so that the prior is not the truth.
CV = 0.003
ABS_NOISE = 48 * 1024
LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)


@register
class _Undeclared(Operator):
    """A truth's stand-in that declares nothing of its axes (every axis its own)."""

    name = "sim_undeclared"

    def run(self, block):  # pragma: no cover - never run: the truth is a function
        return block


def _dims(shapes):
    return np.asarray(shapes, dtype=np.float64).reshape(-1, 3)


def _hash_normal(d):
    """A deterministic N(0, 1) per shape: misfit that repeats of one shape never see."""
    out = np.empty(len(d))
    for i, row in enumerate(d.astype(np.int64)):
        h = hashlib.sha256(row.tobytes()).digest()
        u1, u2 = (int.from_bytes(h[:8], "little") + 0.5) / 2**64, (int.from_bytes(h[8:16], "little") + 0.5) / 2**64
        out[i] = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    return out


def poly(shapes):
    d = _dims(shapes)
    v = d.prod(1)
    faces = d[:, 0] * d[:, 1] + d[:, 0] * d[:, 2] + d[:, 1] * d[:, 2]
    return 8 * MiB + 89.0 * v + 400.0 * faces


def sizedep(shapes):
    v = _dims(shapes).prod(1)
    return 8 * MiB + (150 + 30 * np.log10(v)) * v


def jitter(shapes):
    return poly(shapes) * (1 + 0.01 * _hash_normal(_dims(shapes)))


def _next_pow2(n):
    return 2.0 ** np.ceil(np.log2(n))


def pow2(shapes):
    d = _dims(shapes)
    return 8 * MiB + 24.0 * d.prod(1) + 16.0 * d[:, 0] * d[:, 1] * _next_pow2(2 * d[:, 2])


def pad32(shapes):
    d = _dims(shapes)
    return 8 * MiB + 60.0 * (np.ceil(d / 32) * 32).prod(1) + 20.0 * d.prod(1)


def quantum(shapes):
    return np.ceil(poly(shapes) / (2 * MiB)) * 2 * MiB


#: name -> (truth, the operator whose declaration the loop uses)
TRUTHS = {
    "poly": (poly, "gst3d"),
    "sizedep": (sizedep, "gst3d"),
    "jitter": (jitter, "gst3d"),
    "pow2": (pow2, "sim_undeclared"),
    "pad32": (pad32, "sim_undeclared"),
    "quantum": (quantum, "gst3d"),
}


def runs(truth, shapes, rng, n=1):
    """``n`` noisy runs of the truth at each shape, ``(m, n)``."""
    t = truth(shapes)
    return t[:, None] * (1 + CV * rng.standard_normal((len(t), n))) + ABS_NOISE * rng.standard_normal((len(t), n))


def extrapolation_shapes(v_max, rng, n_each=4):
    shapes = []
    for k in (2, 4, 8):
        for _ in range(n_each):
            offsets = rng.uniform(-math.log(8) / 2, math.log(8) / 2, 3)
            offsets -= offsets.mean()
            shapes.append(np.rint(np.exp(math.log(k * v_max) / 3 + offsets)).astype(int))
    return np.maximum(np.asarray(shapes), 8)


def loop(name, seed, budget, tolerance=0.05):
    """One loop from an empty store until it stops: (ask, records, core, seconds)."""
    truth, operator = TRUTHS[name]
    core = ExplorationCore(operator, memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=seed, tolerance=tolerance)
    rng = np.random.default_rng([seed, 1])
    records: list[Record] = []
    started = time.perf_counter()
    while True:
        ask = core.ask(records, budget_left=budget - len(records))
        if ask.stopped_because:
            return ask, records, core, time.perf_counter() - started
        for shape in ask.shapes:
            r = runs(truth, [shape], rng, 2)[0]
            records.append(Record(tuple(shape), float(r.mean()), "ok", "profile", repeats=list(r)))


def pit(model, shapes, values):
    """The predictive's CDF at each new run: ``F_nu((y - location) / scale)``."""
    from scipy.special import stdtr

    location, scale, dof = model.predictive_t(shapes)
    return stdtr(dof, (np.asarray(values) - location) / scale)


def evaluate(name, seed, budget):
    ask, records, core, seconds = loop(name, seed, budget)
    model = ask.model
    truth, _ = TRUTHS[name]
    rng = np.random.default_rng([seed, 2])
    targets = core.target_shapes(model)
    v_max = float(np.max([np.prod(r.shape) for r in records]))
    held = np.vstack([targets, extrapolation_shapes(v_max, rng)])
    new = runs(truth, held, rng)[:, 0]
    u = pit(model, held, new)
    location, _, _ = model.predictive_t(held)
    _, upper = model.predict_many(held, 0.99)
    return {"name": name, "seed": seed, "profiles": len(records), "converged": ask.stopped_because.startswith("conv"),
            "why": ask.stopped_because, "pit": u, "ape": np.abs(location - new) / new, "ratio": upper / new,
            "seconds": seconds, "n_targets": len(targets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truths", default=",".join(TRUTHS))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE")
    args = parser.parse_args()
    for assignment in args.set:
        override(assignment)
    print(f"`python scripts/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    header = "| truth | loops converged | profiles at the stop (median, range) | MAPE | median upper/true | " + \
        " | ".join(f"{c:.0%} coverage (95% CI)" for c in LEVELS) + " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    pooled = []
    for name in args.truths.split(","):
        results = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = evaluate(name, seed, args.budget)
            results.append(r)
            if args.verbose:
                cov = " ".join(f"{np.mean(r['pit'] <= c):.3f}" for c in LEVELS)
                print(f"  {name} seed {seed}: {r['profiles']} profiles, {r['why'][:160]}; coverage {cov}; "
                      f"{r['seconds']:.0f} s", file=sys.stderr, flush=True)
        pooled.extend(results)
        print(_row(name, results), flush=True)
    if len(args.truths.split(",")) > 1:
        print(_row("pooled", pooled))
    print(f"\nMachine: {machine_line()}")


def override(assignment: str) -> None:
    """``MODULE.NAME=VALUE``: set a module constant for this run (a number, or numbers joined by
    commas for a tuple)."""
    import importlib

    target, _, text = assignment.partition("=")
    module, _, name = target.rpartition(".")
    values = tuple(float(v) for v in text.split(","))
    for loaded in ("explorer.model.fit", "explorer.model.gp_torch", "explorer.search.core"):
        importlib.import_module(loaded)  # every reader of the statistics' constants, before the check below
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        raise SystemExit(f"--set: {module} has no {name}")
    old = getattr(mod, name)
    # a module that imported the constant by value would keep the old one: the run would measure nothing
    copies = [m.__name__ for m in list(sys.modules.values())
              if m is not mod and m is not None and getattr(m, name, None) is old and isinstance(old, (float, tuple))]
    if copies:
        raise SystemExit(f"--set: {', '.join(copies)} hold their own copy of {name}: the override would not reach them")
    setattr(mod, name, values[0] if len(values) == 1 else values)


def _row(name, results):
    u = np.concatenate([r["pit"] for r in results])
    profiles = [r["profiles"] for r in results]
    cells = []
    for c in LEVELS:
        k = int(np.sum(u <= c))
        lo, hi = clopper_pearson(k, len(u))
        cells.append(f"{k / len(u):.1%} ({lo:.1%}-{hi:.1%})")
    return (f"| {name} | {sum(r['converged'] for r in results)}/{len(results)} | {int(np.median(profiles))} "
            f"({min(profiles)}-{max(profiles)}) | {np.mean(np.concatenate([r['ape'] for r in results])):.2%} | "
            f"{np.median(np.concatenate([r['ratio'] for r in results])):.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
