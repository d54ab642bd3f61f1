"""The model's weak priors: of the run noise, of the ML-II hyperparameters (log-normal, given as
(mode, sd of the log)), of the face and edge coefficients, and an informative prior mean
from another model (:class:`MeanPrior`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from explorer.model.basis import _as_dims

__all__ = [
    "DEFAULT_REL_NOISE_FLOOR",
    "MeanPrior",
]


#: Default relative noise floor of a single run (0.2 %).
DEFAULT_REL_NOISE_FLOOR = 0.002
#: Weak prior of the pooled relative run noise: (typical relative sd, pseudo-degrees of freedom).
_RUN_NOISE_PRIOR = (0.005, 4.0)

# Weak priors of the ML-II stage, log-normal given as (mode, sd of the log).  The fit
# is a MAP on the parameter itself, so with no information a parameter sits at the mode.
_LENGTHSCALE_PRIOR = (0.5, 1.0)  # on normalised log-dims (the training box is [0, 1])
_OUTPUTSCALE_PRIOR = (0.005**2, 2.0)  # relative residual variance: sigma_f ~ 0.5 %
_NUGGET_PRIOR = (0.001**2, 2.0)  # relative nugget variance: rho_nug ~ 0.1 %
#: The residual amplitude's slope ``kappa`` in ``[0, 1]``: a half-normal prior of this sd about 0
#: (a relative residual of one size everywhere unless the data say otherwise), and its start.
_SLOPE_PRIOR_SD = 0.5
_SLOPE_START = 0.02
#: Prior sd of each face/edge coefficient, relative to the peak at the design centre.
_FACE_EDGE_PRIOR_RELATIVE_SD = 1.0


@dataclass(frozen=True)
class MeanPrior:
    r"""What another model already says of this operator's peak, as a prior on ``beta``.

    ``mean_bytes`` and ``sd_bytes`` at block ``shapes`` (e.g. :meth:`from_model` on a pipeline's
    composed model, ``explorer.model.composed.ComposedModel``, over the loop's target region).  ``fit`` turns
    it into the Gaussian prior ``beta ~ N(b_0, B)`` of the mean basis (module docstring,
    *An informative prior mean*); ``source`` is recorded in the model's ``info["prior"]``.
    """

    shapes: np.ndarray
    mean_bytes: np.ndarray
    sd_bytes: np.ndarray
    source: str

    @classmethod
    def from_model(cls, model, shapes, source: str, confidence: float = 0.99) -> "MeanPrior":
        """From any model's ``predict_many``: the mean, and the sd its one-sided bound at
        ``confidence`` implies for a normal, ``(upper - mean) / Phi^{-1}(confidence)`` (a
        Student-t or Bonferroni bound makes that larger than the model's own sd: cautious)."""
        from scipy.special import ndtri

        shapes = _as_dims(shapes)
        mean, upper = model.predict_many(shapes, confidence)
        sd = (np.asarray(upper, dtype=np.float64) - mean) / float(ndtri(confidence))
        return cls(shapes, np.asarray(mean, dtype=np.float64), sd, source)
