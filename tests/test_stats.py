"""The spread of repeated measurements (``explorer.stats.fit_spread``): pure arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from explorer.stats import fit_spread, page_bytes

KiB, MiB = 2**10, 2**20


def test_without_an_absolute_term_the_fit_is_the_pooled_relative_variance_with_its_prior():
    """Purely relative spread: the minimum is the pooled ``(nu_0 r_0^2 + sum nu s^2/m^2) /
    (nu_0 + sum nu)`` (the absolute term stays at its floor, far below the data)."""
    rng = np.random.default_rng(0)
    means = np.exp(rng.uniform(np.log(10 * MiB), np.log(2000 * MiB), 40))
    variances = (0.01 * means) ** 2 * rng.chisquare(1, 40)
    dof = np.ones(40)
    a, r = fit_spread(means, variances, dof, abs_floor=1.0, rel_prior=(0.005, 4.0))
    pooled = np.sqrt((4 * 0.005**2 + np.sum(variances / means**2)) / (4 + 40))
    assert r == pytest.approx(pooled, rel=0.02) and a < 0.001 * means.min()


def test_repeats_that_differ_by_an_allocator_quantum_are_an_absolute_spread_not_a_relative_one():
    """Pairs of runs that differ by 0 or one 184 KiB quantum whatever the block (as a real
    allocator's do): the absolute term takes it, the relative one stays small, so a large
    block's spread is not a tiny block's share of it."""
    rng = np.random.default_rng(1)
    means = np.exp(rng.uniform(np.log(0.2 * MiB), np.log(500 * MiB), 60))
    steps = 184 * KiB * rng.integers(0, 2, 60)
    variances = steps**2 / 2.0  # the sample variance of a pair that differs by the step
    a, r = fit_spread(means, variances, np.ones(60), abs_floor=page_bytes(), rel_prior=(0.005, 4.0))
    assert 60 * KiB < a < 184 * KiB and r < 0.004
    pooled = np.sqrt(np.mean(variances / means**2))  # what a relative-only spread would say
    assert pooled > 10 * r


def test_floors_hold_and_no_repeat_gives_the_floors_and_the_prior():
    assert fit_spread([1e6, 2e6], [0.0, 0.0], [1, 1], abs_floor=4096.0, rel_floor=0.002)[0] >= 4096.0
    assert fit_spread([1e6, 2e6], [0.0, 0.0], [1, 1], abs_floor=4096.0, rel_floor=0.002)[1] >= 0.002
    assert fit_spread([1e6], [5.0], [0], abs_floor=4096.0, rel_floor=0.002, rel_prior=(0.005, 4.0)) == (4096.0, 0.005)
    assert fit_spread([1e6], [5.0], [0], abs_floor=4096.0, rel_floor=0.002) == (4096.0, 0.002)
    assert page_bytes() >= 4096
