"""The evidence's bound on how much predictions understated their scale
(``explorer.model.stats.scale_confidence_bound``) on simulated standardised residuals: the
betting mixture it uses against the product of whole bets (``bets=(1.0,)``, same plug-in).

Scenarios: honest predictions (Student-t, 8 dof), predictions understated 2x, and a few
predictions 15x off (a model before it found a regime boundary) followed by honest ones.
Reports the median and 90th percentile of the bound at the loop's level (0.5%,
``acquisition.risk_split`` at 99%), and how often an honest sequence's bound fell below the
truth (1) at any of 40 looks at level 5%.

    PYTHONPATH=. python scripts/evidence_rule.py [--repeats 400] [--output docs/evidence_rule.md]
"""

from __future__ import annotations

import argparse
import platform

import numpy as np

from explorer.model.stats import scale_confidence_bound, scale_confidence_sequence
from harness.report import emit

LEVEL = 0.005
DOF = 8.0


def scenarios(rng):
    t = lambda n: rng.standard_t(DOF, n)  # noqa: E731
    return {
        "honest, 21 predictions": lambda: t(21),
        "honest, 40 predictions": lambda: t(40),
        "understated 2x, 21 predictions": lambda: 2.0 * t(21),
        "3 misses (15x), then 10 honest": lambda: np.r_[15.0 * t(3), t(10)],
        "5 misses (15x), then 16 honest": lambda: np.r_[15.0 * t(5), t(16)],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rules = {"mixture": {}, "whole bets": {"bets": (1.0,)}}
    lines = [f"`python scripts/evidence_rule.py --repeats {args.repeats} --seed {args.seed}` "
             f"({platform.machine()}, numpy {np.__version__}); level {LEVEL}, t with {DOF:g} dof.", "",
             "| scenario | mixture: median (90th pct) | whole bets: median (90th pct) |", "|---|---|---|"]
    for name, draw in scenarios(rng).items():
        seqs = [draw() for _ in range(args.repeats)]
        cells = []
        for keywords in rules.values():
            bounds = np.array([scale_confidence_bound(r, DOF, LEVEL, **keywords) for r in seqs])
            cells.append(f"{np.median(bounds):.2f} ({np.quantile(bounds, 0.9):.2f})")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    fell = {name: 0 for name in rules}
    for _ in range(args.repeats):
        r = rng.standard_t(DOF, 40)
        for name, keywords in rules.items():
            fell[name] += scale_confidence_sequence(r, DOF, 0.05, **keywords).min() < 1.0
    lines += ["", "Honest sequences whose bound fell below the truth at any of 40 looks (level 5%): "
              + ", ".join(f"{name} {count}/{args.repeats}" for name, count in fell.items()) + "."]
    text = "\n".join(lines)
    emit(text, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
