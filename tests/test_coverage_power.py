"""The coverage test's arithmetic (``harness.coverage``) against scipy's own exact interval."""

import numpy as np
from scipy.stats import binom, binomtest

from harness.coverage import clopper_pearson, most_misses_passing, pass_probability


def test_the_interval_is_scipys_exact_binomial_interval():
    for k, n in [(0, 15), (15, 15), (148, 150), (446, 450), (789, 794), (7, 12)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert np.allclose(clopper_pearson(k, n), (ci.low, ci.high), rtol=0, atol=1e-9)


def test_the_pass_probability_sums_the_counts_whose_exact_interval_passes():
    for n, p in [(300, 0.995), (450, 0.99), (450, 0.995), (600, 0.9925)]:
        passing = [m for m in range(0, 40)
                   if binomtest(n - m, n).proportion_ci(method="exact").low >= 0.98]
        assert passing == list(range(most_misses_passing(n, 0.98) + 1))
        expected = sum(binom.pmf(m, n, 1 - p) for m in passing)
        assert abs(pass_probability(n, p, 0.98) - expected) < 1e-12


def test_no_count_of_150_runs_reaches_98_percent():
    assert most_misses_passing(150, 0.98) == -1
    assert pass_probability(150, 0.9999, 0.98) == 0.0
    assert most_misses_passing(450, 0.98) == 3
