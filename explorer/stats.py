"""Distribution functions the statistics share (SciPy's ``scipy.special``: cheap to import,
no ``scipy.stats``), each written once.

* :func:`t_quantile`: the one-sided Student-t quantile of a bound.
* :func:`normal_scores`: a t-distributed standardised residual mapped to the standard
  normal by its probability integral transform, ``Phi^{-1}(F_nu(t))``; calibrated
  residuals give independent N(0, 1) scores whatever their degrees of freedom, so
  scores from predictions with different ``nu`` can be pooled in one chi-square test.
* :func:`chi2_upper`, :func:`normal_upper`: the critical values of those tests.
* :func:`fit_spread`: the spread ``sd(m)^2 = a^2 + (r m)^2`` of repeated measurements about
  their means, by maximum likelihood from sample variances (the isolated profiles' run noise,
  ``explorer.surrogate``; equal tasks of one run, ``explorer.calibration.fit_within``).
"""

from __future__ import annotations

from functools import lru_cache

import math

import numpy as np

__all__ = ["chi2_upper", "fit_spread", "normal_scores", "normal_upper", "page_bytes", "t_quantile"]


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
