"""Distribution functions the statistics share (SciPy's ``scipy.special``: cheap to import,
no ``scipy.stats``), each written once.

* :func:`t_quantile`: the one-sided Student-t quantile of a bound.
* :func:`normal_scores`: a t-distributed standardised residual mapped to the standard
  normal by its probability integral transform, ``Phi^{-1}(F_nu(t))``; calibrated
  residuals give independent N(0, 1) scores whatever their degrees of freedom, so
  scores from predictions with different ``nu`` can be pooled in one chi-square test.
* :func:`chi2_upper`, :func:`normal_upper`: the critical values of those tests.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["chi2_upper", "normal_scores", "normal_upper", "t_quantile"]


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
