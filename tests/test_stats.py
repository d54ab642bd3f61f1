"""The spread of repeated measurements (``explorer.model.stats.fit_spread``): pure arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from explorer.model.stats import fit_spread, page_bytes

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


# ---- the latent scale and the evidence (issue 33) -------------------------------------------


def test_the_scale_posterior_of_latent_residuals_is_the_conjugate_scaled_inverse_chi_square():
    from explorer.model.stats import scale_posterior

    rng = np.random.default_rng(0)
    c = rng.uniform(0.5, 2.0, 40)
    e = np.sqrt(3.0 * c) * rng.standard_normal(40)  # lambda = 3, no measured noise
    post = scale_posterior(e, c, np.zeros(40), prior_dof=1.0)
    assert post.dof == pytest.approx(41.0, rel=0.02)
    assert post.scale == pytest.approx((1.0 + np.sum(e * e / c)) / 41.0, rel=0.01)
    assert post.interval[0] < 3.0 < post.interval[1]


def test_the_fits_own_evidence_leaves_n_minus_p_degrees_of_freedom_and_is_not_truncated():
    """With a negligible run noise and ``p`` flat mean terms, the restricted likelihood in the
    latent scale is the conjugate one: ``n - p`` degrees of freedom (not ``n``: the mean's
    terms use some) and scale ``(nu_0 + RSS) / (nu_0 + n - p)``, below 1 when the residuals are
    smaller than the kernel says (never truncated at the fit's own scale)."""
    from explorer.model.stats import scale_posterior
    from explorer.model.posterior import restricted_log_likelihood_in_scale

    rng = np.random.default_rng(1)
    n, p = 24, 4
    basis = rng.standard_normal((n, p))
    y = basis @ rng.standard_normal(p) + 0.4 * rng.standard_normal(n)  # residual variance 0.16 of the kernel's 1
    ll = restricted_log_likelihood_in_scale(np.eye(n), np.full(n, 1e-9), basis, y, np.zeros((p, p)))
    post = scale_posterior(log_likelihood=ll, prior_dof=1.0)
    residual = y - basis @ np.linalg.lstsq(basis, y, rcond=None)[0]
    assert post.dof == pytest.approx(1 + n - p, rel=1e-3)
    assert post.scale == pytest.approx((1 + residual @ residual) / (1 + n - p), rel=1e-3)
    assert post.scale < 0.5


def test_residuals_the_measured_run_noise_explains_do_not_shrink_it():
    """Residuals as large as the measured run noise alone (no latent variance to speak of) say
    nothing against a small latent scale, and the predictive keeps the run noise: the scale
    multiplies the latent part only."""
    from explorer.model.stats import scale_posterior

    rng = np.random.default_rng(2)
    s = np.full(30, 4.0)
    e = 2.0 * rng.standard_normal(30)
    informative = scale_posterior(e, np.full(30, 4.0), np.zeros(30))
    noise_only = scale_posterior(e, np.full(30, 1e-6), s)
    assert informative.dof > 20  # the same residuals pin lambda when they are latent
    assert noise_only.dof < 5  # and leave it to the prior when the measured noise explains them


def test_the_evidence_bound_holds_under_repeated_looks_and_tightens_with_evidence():
    """Ville's inequality: over 40 looks at honest residuals (t with 8 dof), the bound on how
    much they understate their scale falls below the truth (1) in at most ~5% of sequences;
    with 40 predictions it is below 2; residuals twice too large are caught."""
    from explorer.model.stats import scale_confidence_bound, scale_confidence_sequence

    rng = np.random.default_rng(3)
    fell, last = 0, []
    for _ in range(300):
        r = rng.standard_t(8, 40)
        bounds = scale_confidence_sequence(r, 8.0, 0.05)  # the bound at each of the 40 looks
        assert bounds[-1] == scale_confidence_bound(r, 8.0, 0.05)
        assert bounds[9] == scale_confidence_bound(r[:10], 8.0, 0.05)  # each look sees only its past
        fell += bounds.min() < 1.0
        last.append(bounds[-1])
    assert fell / 300 <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 300)
    assert np.median(last) < 2.0
    assert scale_confidence_bound(2.0 * rng.standard_t(8, 40), 8.0, 0.05) > 1.5
    assert scale_confidence_bound([], 8.0, 0.05) == 100.0


def test_the_evidence_forgives_a_few_early_misses():
    """Three predictions 15x off (a model before it found a boundary), then twenty honest ones:
    each bet of the mixture loses at most what it staked on a miss, so its bound comes back
    sooner than the product of whole bets' (medians 3.1 and 4.4 on these sequences; 6.2 by the
    rule until 2026-11-27, whole bets with a running-mean plug-in that the misses inflate)."""
    from explorer.model.stats import scale_confidence_bound

    rng = np.random.default_rng(5)
    sequences = [np.r_[15.0 * rng.standard_t(8, 3), rng.standard_t(8, 20)] for _ in range(40)]
    mixture = np.median([scale_confidence_bound(r, 8.0, 0.005) for r in sequences])
    whole = np.median([scale_confidence_bound(r, 8.0, 0.005, bets=(1.0,)) for r in sequences])
    assert mixture < 0.8 * whole and mixture < 4.0
