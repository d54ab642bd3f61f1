"""Distribution functions the statistics share (SciPy's ``scipy.special``: cheap to import,
no ``scipy.stats``), each written once.

* :func:`t_quantile`: the one-sided Student-t quantile of a bound.
* :func:`normal_scores`: a t-distributed standardised residual mapped to the standard
  normal by its probability integral transform, ``Phi^{-1}(F_nu(t))``; calibrated
  residuals give independent N(0, 1) scores whatever their degrees of freedom, so
  scores from predictions with different ``nu`` can be pooled in one chi-square test.
* :func:`chi2_upper`, :func:`normal_upper`: the critical values of those tests.
* :func:`scale_posterior`: the posterior of a covariance's overall scale on a grid, from any
  log-likelihood in it and from residuals predicted before they were observed.
* :func:`scale_confidence_bound`: an anytime-valid upper confidence bound on how much a
  sequence of predictive distributions understated their scale (an e-process per candidate).
* :func:`fit_spread`: the spread ``sd(m)^2 = a^2 + (r m)^2`` of repeated measurements about
  their means, by maximum likelihood from sample variances (the isolated profiles' run noise,
  ``explorer.model.memory_model``; equal tasks of one run, ``explorer.plan.excess.fit_within``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["LOG_SCALE_GRID", "ScalePosterior", "chi2_upper", "fit_spread", "normal_scores", "normal_upper",
           "page_bytes", "scale_confidence_bound", "scale_posterior", "t_quantile"]


@lru_cache(maxsize=256)
def t_quantile(confidence: float, dof: float) -> float:
    """``F_nu^{-1}(confidence)``: the one-sided Student-t quantile with ``dof`` degrees of freedom
    (``dof = inf`` gives the normal quantile)."""
    from scipy.special import ndtri, stdtrit

    if dof == float("inf"):
        return float(ndtri(confidence))
    return float(stdtrit(float(dof), float(confidence)))


def normal_scores(t, dof) -> np.ndarray:
    """``Phi^{-1}(F_nu(t))`` elementwise, computed on the tail nearer to ``t`` (no rounding to 1)."""
    from scipy.special import ndtri, stdtr

    t = np.asarray(t, dtype=np.float64)
    dof = np.broadcast_to(np.asarray(dof, dtype=np.float64), t.shape)
    lower_tail = stdtr(dof, -np.abs(t))  # P(T <= -|t|) > 0, accurate in the tail
    score = -ndtri(np.clip(lower_tail, 1e-300, 0.5))
    return np.where(t >= 0, score, -score)


@lru_cache(maxsize=256)
def chi2_upper(dof: int, level: float) -> float:
    """The chi-square value with ``dof`` degrees of freedom exceeded with probability ``level``."""
    from scipy.special import chdtri

    return float(chdtri(dof, level))


@lru_cache(maxsize=256)
def normal_upper(level: float) -> float:
    """``Phi^{-1}(1 - level)``."""
    from scipy.special import ndtri

    return float(-ndtri(level))


def page_bytes() -> int:
    """The kernel's page, the resolution of a resident-set high-water mark: the least a
    spread of peaks can be (read where the work runs)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 4096


def fit_spread(means, variances, dof, *, abs_floor: float, rel_floor: float = 0.0,
               rel_prior: tuple[float, float] | None = None) -> tuple[float, float]:
    """``(a, r)``: an absolute and a relative spread, ``sd(m)^2 = a^2 + (r m)^2``, by maximum
    likelihood from sample variances ``s_i^2`` with ``nu_i`` degrees of freedom at means
    ``m_i`` (``nu_i s_i^2 / sd(m_i)^2 ~ chi2(nu_i)``)::

        minimise  sum_i nu_i (log sd(m_i)^2 + s_i^2 / sd(m_i)^2)
                  + nu_0 (log r^2 + r_0^2 / r^2)             (rel_prior = (r_0, nu_0))

    with ``a >= abs_floor`` and ``r >= rel_floor``.  The prior is ``nu_0`` pseudo-observations of
    a relative variance ``r_0^2``: with ``a = 0`` the minimum is the pooled
    ``(nu_0 r_0^2 + sum nu_i s_i^2 / m_i^2) / (nu_0 + sum nu_i)``.  The absolute term is what
    an allocator's granularity gives: repeats that differ by a whole quantum (a few pages, or
    one ``mmap`` more) whatever the block, which as a relative spread would be up to a third
    of a tiny block's peak and so widen every bound.  Without any degree of freedom:
    ``(abs_floor, max(r_0, rel_floor))`` (``rel_floor`` without a prior).
    """
    from scipy.optimize import minimize

    m = np.abs(np.asarray(means, dtype=np.float64).reshape(-1))
    s2 = np.maximum(np.asarray(variances, dtype=np.float64).reshape(-1), 0.0)
    nu = np.asarray(dof, dtype=np.float64).reshape(-1)
    keep = (nu > 0) & np.isfinite(s2) & np.isfinite(m)
    m, s2, nu = m[keep], s2[keep], nu[keep]
    r0, nu0 = rel_prior if rel_prior is not None else (0.0, 0.0)
    abs_floor, rel_floor = float(abs_floor), float(rel_floor)
    if nu.sum() == 0:
        return abs_floor, max(float(r0), rel_floor)
    scale = float(max(m.max(), abs_floor, 1.0))  # bytes in units of the largest mean: O(1) numbers

    def unpack(theta):
        return abs_floor + math.exp(theta[0]) * scale, rel_floor + math.exp(theta[1])

    def negative_log_likelihood(theta):
        a, r = unpack(theta)
        var = (a / scale) ** 2 + (r * m / scale) ** 2
        prior = nu0 * (math.log(r * r) + r0 * r0 / (r * r)) if nu0 > 0 else 0.0
        return float(np.sum(nu * (np.log(var) + (s2 / scale**2) / var))) + prior

    pooled = math.sqrt(max(float((np.sum(nu * s2 / np.maximum(m, max(abs_floor, 1.0)) ** 2) + nu0 * r0 * r0)
                                 / (nu.sum() + nu0)), 1e-12))
    starts = ([math.log(1e-3), math.log(pooled)], [math.log(pooled), math.log(1e-4)])
    best = min((minimize(negative_log_likelihood, np.array(x0), method="Nelder-Mead",
                         options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 4000}) for x0 in starts),
               key=lambda result: result.fun)
    a, r = unpack(best.x)
    return float(a), float(r)


#: The grid of ``log lambda`` on which a scale's posterior is computed (1e-4 .. 1e4).
LOG_SCALE_GRID = np.linspace(math.log(1e-4), math.log(1e4), 481)
#: Prior degrees of freedom of a latent scale ``lambda``: one pseudo-observation of ``lambda = 1``.
SCALE_PRIOR_DOF = 1.0
#: Degrees of freedom reported for a scale the evidence pins down (the t is then a normal).
MAX_DOF = 1e6


@dataclass(frozen=True)
class ScalePosterior:
    r"""A variance multiplier ``lambda`` integrated out, summarised as the scaled inverse
    chi-square ``lambda ~ nu s^2 / chi^2_nu`` whose ``E[log lambda]`` and ``Var[log lambda]``
    equal the posterior's: a Gaussian variance ``c`` scaled by ``lambda`` then predicts a
    Student-t with ``nu`` degrees of freedom and squared scale ``s^2 c``."""

    #: ``s^2``.
    scale: float
    #: ``nu``.
    dof: float
    #: How many prequential residuals the posterior learnt from.
    n_residuals: int
    #: ``exp E[log lambda]`` and the 2.5% and 97.5% posterior quantiles of ``lambda``.
    median: float
    interval: tuple[float, float]

    def describe(self) -> dict:
        return {"scale": self.scale, "dof": self.dof, "prequential_residuals": self.n_residuals,
                "median": self.median, "interval_95": list(self.interval)}


def scale_posterior(residuals=(), latent_var=(), noise_var=(), *, log_likelihood=None,
                    prior_dof: float | None = None) -> ScalePosterior:
    r"""The posterior of a latent variance multiplier ``lambda`` on :data:`LOG_SCALE_GRID`:

    .. math::

        \log p(\lambda \mid \cdot) = \log p_0(\lambda) + \ell_{in}(\lambda)
            + \sum_j \log N\big(e_j;\, 0,\; \lambda c_j + s_j\big) + \text{const}

    ``p_0``: a scaled inverse chi-square of ``prior_dof`` (default :data:`SCALE_PRIOR_DOF`)
    pseudo-observations of ``lambda = 1``
    (``p_0(log lambda) ∝ lambda^{-nu_0/2} exp(-nu_0 / (2 lambda))``); ``log_likelihood``:
    ``l_in`` on the grid (a fit's own restricted likelihood in ``lambda``, or None); ``e_j``:
    residuals each predicted before it was observed, whose predictive had latent variance
    ``c_j`` (scaled by ``lambda``) and measured noise variance ``s_j`` (not scaled: the run
    noise is learnt from repeats).  Summarised by :class:`ScalePosterior`: ``nu`` solves
    ``psi'(nu / 2) = Var[log lambda]`` and ``s^2 = exp(E[log lambda] + psi(nu / 2) + log 2) / nu``.
    """
    from scipy.special import digamma, polygamma

    grid = LOG_SCALE_GRID
    lam = np.exp(grid)
    prior_dof = SCALE_PRIOR_DOF if prior_dof is None else float(prior_dof)
    log_post = -0.5 * prior_dof * grid - 0.5 * prior_dof / lam
    if log_likelihood is not None:
        log_post = log_post + np.asarray(log_likelihood, dtype=np.float64)
    e = np.asarray(residuals, dtype=np.float64).reshape(-1)
    c = np.asarray(latent_var, dtype=np.float64).reshape(-1)
    s = np.asarray(noise_var, dtype=np.float64).reshape(-1)
    if not (len(e) == len(c) == len(s)):
        raise ValueError("residuals, latent_var and noise_var must have the same length")
    if len(e):
        total = lam[:, None] * np.maximum(c, 0.0)[None, :] + np.maximum(s, 1e-300)[None, :]
        log_post = log_post - 0.5 * np.sum(np.log(total) + e[None, :] ** 2 / total, axis=1)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    mean_log = float(w @ grid)
    var_log = float(w @ (grid - mean_log) ** 2)
    dof = _dof_from_log_variance(var_log, polygamma)
    scale = math.exp(mean_log + float(digamma(dof / 2)) + math.log(2.0)) / dof
    cdf = np.cumsum(w)
    lo, hi = (float(lam[min(int(np.searchsorted(cdf, q)), len(lam) - 1)]) for q in (0.025, 0.975))
    return ScalePosterior(scale=float(scale), dof=float(dof), n_residuals=len(e), median=math.exp(mean_log),
                          interval=(lo, hi))


def _dof_from_log_variance(var_log: float, polygamma) -> float:
    """``nu`` with ``psi'(nu / 2) = var_log`` (the variance of ``log chi^2_nu``), by bisection in
    ``log nu`` (``psi'`` is decreasing); :data:`MAX_DOF` when the variance is that small."""
    if var_log <= float(polygamma(1, MAX_DOF / 2)):
        return MAX_DOF
    lo, hi = math.log(1e-3), math.log(MAX_DOF)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if float(polygamma(1, math.exp(mid) / 2)) > var_log:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


#: The candidate factors of :func:`scale_confidence_bound` (0.25 .. 100).
_FACTOR_GRID = np.geomspace(0.25, 100.0, 241)
#: The bets of :func:`scale_confidence_bound`'s mixture: the midpoints of ``K = 20`` equal cells of
#: ``[0, 1]`` (a uniform prior on the fraction of the evidence staked on each prediction).
BET_FRACTIONS = (np.arange(20) + 0.5) / 20
#: The median of ``chi^2_1``: ``u^2 / MEDIAN_CHI2_1`` has median 1 for a standard normal ``u``.
MEDIAN_CHI2_1 = 0.454936423119572


def scale_confidence_sequence(standardised, dof, level: float, bets=BET_FRACTIONS) -> np.ndarray:
    r"""Anytime-valid upper confidence bounds on ``kappa``, one after each residual: how much
    predictive distributions understated their scale, from residuals each standardised by its
    own predictive before it was observed (:func:`scale_confidence_bound` is the last).

    Residual ``j`` is ``r_j = (y_j - m_j) / a_j`` with the predictive ``m_j + a_j T_{nu_j}``
    (a Student-t); the hypothesis ``H_kappa`` is that every ``r_j`` is in fact ``sigma_j T_{nu_j}``
    with ``sigma_j >= kappa``.  Against it, each prediction's likelihood ratio

    .. math::

        L_j(\kappa) = \frac{f_{\nu_j}(r_j / \hat\sigma_{j-1}) / \hat\sigma_{j-1}}
                             {f_{\nu_j}(r_j / \kappa) / \kappa},
        \qquad \hat\sigma_{j-1} = \mathrm{clip}\Big(\sqrt{\mathrm{median}\big(\{1\} \cup
        \{u_i^2 / m_1\}_{i<j}\big)},\; \tfrac12,\; \kappa\Big)

    (``u_i = Phi^{-1}(F_{nu_i}(r_i))``, ``m_1`` the median of ``chi^2_1``: a predictable plug-in
    that a few far-off predictions do not move, the ``{1}`` its value before any) has expectation
    at most 1 under ``H_kappa`` (1 at ``sigma_j = kappa``, less above: the t family's likelihood
    ratio is monotone in ``|r|``).  A bet of a fraction ``lambda`` of the evidence on each
    prediction, ``prod_j (1 - lambda + lambda L_j)``, is then a nonnegative supermartingale, and
    so is the mixture

    .. math::

        E_m(\kappa) = \frac1K \sum_{k} \prod_{j \le m} \big(1 - \lambda_k + \lambda_k L_j(\kappa)\big)

    over ``bets`` (:data:`BET_FRACTIONS`: a uniform prior on ``lambda``, Cover's universal portfolio): a
    prediction far off costs each bet at most the fraction it staked, so a model's early misses
    (before it found a boundary, say) do not outweigh every later prediction, and the mixture
    grows nearly as fast as the best single bet in hindsight.  By Ville's inequality,
    ``P(sup_m E_m(kappa) >= 1 / level) <= level`` however often it is looked at, so the bound
    ``inf {kappa : E_m(kappa') >= 1 / level for every kappa' >= kappa}`` (on a grid of
    0.25 .. 100; 100 when nothing is rejected) covers the true factor with probability at least
    ``1 - level`` at every ``m`` at once (a confidence sequence; Waudby-Smith & Ramdas 2023 for
    the betting form).
    """
    from scipy.special import logsumexp, ndtri, stdtr

    r = np.asarray(standardised, dtype=np.float64).reshape(-1)
    nu = np.broadcast_to(np.asarray(dof, dtype=np.float64), r.shape)
    u = ndtri(np.clip(stdtr(nu, r), 1e-300, 1 - 1e-16))
    scaled = u * u / MEDIAN_CHI2_1
    running = np.sqrt([np.median(np.append(scaled[:j], 1.0)) for j in range(len(r))])
    kappa = _FACTOR_GRID[:, None]
    sigma = np.clip(running[None, :], 0.5, kappa)
    log_lr = (_log_t_density(r[None, :] / sigma, nu[None, :]) - np.log(sigma)
              - _log_t_density(r[None, :] / kappa, nu[None, :]) + np.log(kappa))  # (grid, m)
    fractions = np.asarray(bets, dtype=np.float64)[:, None, None]
    with np.errstate(divide="ignore"):  # a whole bet (lambda = 1) keeps nothing back: log 0
        log_wealth = np.cumsum(np.logaddexp(np.log1p(-fractions), np.log(fractions) + log_lr[None]), axis=2)
    log_e = logsumexp(log_wealth, axis=0) - math.log(len(fractions))  # (grid, m): E_1 .. E_m
    rejected = log_e >= math.log(1.0 / level)
    # each bound: the smallest grid factor above which every factor is rejected
    last_kept = np.where(~rejected, np.arange(len(_FACTOR_GRID))[:, None], -1).max(axis=0)
    return np.where(last_kept < 0, _FACTOR_GRID[0], _FACTOR_GRID[np.minimum(last_kept + 1, len(_FACTOR_GRID) - 1)])


def scale_confidence_bound(standardised, dof, level: float, bets=BET_FRACTIONS) -> float:
    """The bound of :func:`scale_confidence_sequence` after every residual; 100 (the grid's
    largest) with none."""
    bounds = scale_confidence_sequence(standardised, dof, level, bets)
    return float(bounds[-1]) if len(bounds) else float(_FACTOR_GRID[-1])


def _log_t_density(x, nu):
    """``log f_nu(x)``, the Student-t density (the normal's where ``nu`` is huge)."""
    from scipy.special import gammaln

    nu = np.minimum(nu, MAX_DOF)
    return (gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * math.pi)
            - (nu + 1) / 2 * np.log1p(x * x / nu))
