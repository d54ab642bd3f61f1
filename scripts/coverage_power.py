"""How often a bound of a given true coverage passes issue 33's coverage test.

The test: over ``n`` held-out runs, the 99% bound's covered count has a Clopper-Pearson 95%
lower end of at least 98%.  For each ``n``, the most misses that still pass, and the chance
of passing for a bound whose true coverage is 99% (exactly calibrated), 99.25%, 99.5% (the
run's quantile the loop keeps when its evidence holds: ``acquisition.risk_split``) and
99.75%.  Pure binomial arithmetic (``harness.coverage``); no measurement.

    PYTHONPATH=. python scripts/coverage_power.py [--threshold 0.98] [--output FILE]
"""

from __future__ import annotations

import argparse

from harness.coverage import most_misses_passing, pass_probability
from harness.report import emit

SIZES = (150, 300, 450, 600, 900, 1200)
COVERAGES = (0.99, 0.9925, 0.995, 0.9975)


def table(threshold: float) -> str:
    head = ("| held-out runs | most misses that pass | "
            + " | ".join(f"P(pass), true coverage {100 * p:g}%" for p in COVERAGES) + " |")
    lines = [head, "|" + "---|" * (2 + len(COVERAGES))]
    for n in SIZES:
        misses = most_misses_passing(n, threshold)
        cells = " | ".join(f"{pass_probability(n, p, threshold):.2f}" for p in COVERAGES)
        lines.append(f"| {n} | {misses if misses >= 0 else 'none'} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.98,
                        help="the lower end the Clopper-Pearson 95%% interval must reach")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    text = (f"`python scripts/coverage_power.py --threshold {args.threshold}`: the test passes when the "
            f"Clopper-Pearson 95% interval of the covered share has a lower end of at least "
            f"{100 * args.threshold:g}%.\n\n" + table(args.threshold))
    emit(text, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
