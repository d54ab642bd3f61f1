"""What a count of covered runs says about a bound, and what a coverage test asks of it.

A bound at level ``c`` covers ``k`` of ``n`` independent new runs.  The Clopper-Pearson
interval (exact, from the binomial's beta tails) says which true coverages ``p`` that count
is consistent with; the issue's test of a 99% bound passes when the interval's lower end is
at least a threshold (98%).  How often a bound whose true coverage is ``p`` passes that test
is a binomial sum over the counts that pass:

    P(pass | n, p) = sum_{m = 0}^{m*(n)} C(n, m) (1 - p)^m p^(n - m)

with ``m*(n)`` the most misses whose count still passes.  Pure arithmetic: the tests and
``scripts/coverage_power.py`` call it without a process.
"""

from __future__ import annotations

from scipy.stats import beta, binom


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact two-sided ``level`` interval of a binomial proportion, ``k`` successes of ``n``:
    ``(Beta_{a}(k, n - k + 1), Beta_{1 - a}(k + 1, n - k))``, ``a = (1 - level) / 2``."""
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def most_misses_passing(n: int, threshold: float, level: float = 0.95) -> int:
    """The most misses among ``n`` runs whose covered count still has a Clopper-Pearson lower
    end of at least ``threshold`` (-1 when even ``n`` of ``n`` does not)."""
    misses = -1
    while misses + 1 <= n and clopper_pearson(n - (misses + 1), n, level)[0] >= threshold:
        misses += 1
    return misses


def pass_probability(n: int, coverage: float, threshold: float, level: float = 0.95) -> float:
    """``P(pass | n, p)``: the chance that ``n`` independent runs under a bound of true coverage
    ``coverage`` leave a Clopper-Pearson lower end of at least ``threshold``."""
    misses = most_misses_passing(n, threshold, level)
    return 0.0 if misses < 0 else float(binom.cdf(misses, n, 1.0 - coverage))
