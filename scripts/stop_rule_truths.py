"""The stop rule on deliberately misspecified truths (issue 13): where the loop stops and how
its 99% bound covers there, against the old rule (stop as soon as the bound is tight).

The truths and the operator that declares padding are those of ``tests/test_stopping.py``
(bytes per voxel growing with the volume, with and without padding steps to multiples of 8),
driven through ``explorer.exploration.ExplorationCore`` (no processes: the truth is a
function, so coverage is measured on the target region's ~300 shapes per seed, each a new
noisy run).  For each seed: the profiles and coverage where the loop stops on its own, and
the profiles and coverage of the model at the first step whose bound was tight.

    python scripts/stop_rule_truths.py [--seeds 6] [--budget 60]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from explorer.exploration import ExplorationCore  # noqa: E402
from explorer.store import Record  # noqa: E402
from machine import machine_line  # noqa: E402
from tests.test_stopping import CV, LIMIT, size_dependent_truth  # noqa: E402  (registers the test operators)


def coverage(core, model, truth, seed) -> float:
    targets = core.target_shapes(model)
    new_run = truth(targets) * (1 + CV * np.random.default_rng(99 + seed).standard_normal(len(targets)))
    _, upper = model.predict_many(targets, 0.99)
    return float(np.mean(upper >= new_run))


def run(operator, truth, seed, budget):
    core = ExplorationCore(operator, memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=seed)
    rng = np.random.default_rng(seed)
    records, first_tight = [], None
    while True:
        ask = core.ask(records, budget_left=budget - len(records))
        if first_tight is None and ask.decision is not None and ask.decision.tight:
            first_tight = (len(records), coverage(core, ask.model, truth, seed))
        if ask.stopped_because:
            return len(records), ask.stopped_because.split(":")[0], coverage(core, ask.model, truth, seed), first_tight
        for shape in ask.shapes:
            runs = truth(shape)[0] * (1 + CV * rng.standard_normal(2))
            records.append(Record(tuple(shape), float(runs.mean()), "ok", "profile", repeats=list(runs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--budget", type=int, default=60)
    args = parser.parse_args()
    print(f"`python scripts/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    print("| truth | seed | stops at | stopped | coverage there | old rule: first tight at | coverage there |")
    print("|---|---|---|---|---|---|---|")
    for label, operator, multiple in (("size-dependent bytes per voxel, axes alike (gst3d's declaration)", "gst3d", 1),
                                      ("the same, axes not declared alike", "test_undeclared_truth", 1),
                                      ("and padding steps of 8 (declared), axes not declared alike",
                                       "test_padded_truth", 8)):
        for seed in range(args.seeds):
            n, why, cov, first = run(operator, lambda s, m=multiple: size_dependent_truth(s, m), seed, args.budget)
            old = ("-", "-") if first is None else (first[0], f"{first[1]:.1%}")
            print(f"| {label} | {seed} | {n} | {why} | {cov:.1%} | {old[0]} | {old[1]} |", flush=True)
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
