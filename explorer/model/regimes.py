r"""Regimes: an operator whose peak jumps where it switches algorithm with the block's shape.

Libraries choose an algorithm by a threshold on a product of the block's dims (PyTorch's CPU
3D convolution runs ``Slow3d``, a vol2col buffer of 27 values per voxel and channel, while
``channels x n1 x n2`` is small, and oneDNN above it; FFT libraries and BLAS block sizes switch
the same way).  The peak is then two smooth functions with a step between them along a level
set of ``w . log n``, ``w`` in ``{0, 1}^3``, which a stationary kernel on the log-dims cannot
place from a few dozen profiles: the fit smears the step over its neighbourhood, and a block on
the high side near it is predicted between the two.

With a *regime boundary* the model knows each block's side of it
(``explorer.model.basis.regime_side``: 0 below, 1 above, 0.5 in the gap between the nearest
profiles either side).  The mean gets the constant and the volume once more times the side, so
each side has its own level and bytes per voxel (vague Gaussian priors, as the faces'), and the
kernel gets the side as a fourth input with its own lengthscale, so that the two sides'
residuals are as alike as the data say.  A block in the gap is bounded as the higher side
(``MemoryModel._latent``).

Which boundary, if any: :func:`candidate_boundaries` lists every direction ``w`` the operator's
alike axes allow and every gap between consecutive profiles along it that leaves at least
:data:`MIN_SIDE` exact profiles on each side (``K`` candidates); :func:`scan` scores each by the
restricted likelihood of the no-regime fit's own hyperparameters with the side's mean terms and
kernel input added (its lengthscale at :data:`SIDE_LENGTHSCALES`, the latent scale profiled),
which needs no refit.  The best, if it scores above none, is refitted by ML-II and kept when its
log evidence (``explorer.model.fit``: the maximised restricted likelihood with the priors, made
comparable between the two models' mean terms) exceeds the no-regime fit's by more than
``log K + log(n) / 2`` (:func:`accept`): the prior gives half its mass to *no boundary* and
spreads the other half evenly over the ``K`` candidates, so
the posterior odds of the best candidate against none are about ``exp(gain) / K``, each model
at its own optimum, times the Occam factor of the side's lengthscale, which Schwarz's
approximation puts at ``n^(-1/2)`` for ``n`` exact profiles.  Once one is kept, the scan runs again
on the model that has it, and so on until one is refused (``explorer.model.fit._with_boundary``):
a stack of layers can switch algorithm at a different threshold each.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from explorer.model.basis import FLAT_TERMS, _matern52, effective_dims, regime_description, regime_rows
from explorer.model import priors

__all__ = ["Boundary", "accept", "candidate_boundaries", "leave_one_out_gains", "scan"]

#: Exact profiles each side of a candidate boundary must have: a side of one or two profiles is
#: an outlier's explanation, not a regime's.
MIN_SIDE = 3
#: Lengthscales of the side input at which :func:`scan` scores a candidate (the side is 0 or 1:
#: 0.1 leaves the two sides' residuals independent, 0.5 correlated by 0.14).
SIDE_LENGTHSCALES = (0.1, 0.5)


@dataclass(frozen=True)
class Boundary:
    """A candidate regime boundary: ``regime = (w1, w2, w3, g_lo, g_hi)`` (``basis.regime_side``),
    its score (the restricted log-likelihood gain over no boundary at the no-regime fit's
    hyperparameters) and how many candidates were scored."""

    regime: tuple
    gain: float
    n_candidates: int

    def describe(self) -> str:
        return regime_description(self.regime)


def candidate_boundaries(dims: np.ndarray, multiple, axis_classes) -> list[np.ndarray]:
    """Every ``regime`` array (``basis.regime_side``) a boundary could have on these exact
    profiles: directions ``w`` in ``{0, 1}^3 \\ 0`` equal on axes of one class (a boundary must
    not tell alike axes apart), and each gap between consecutive distinct levels ``w . log n``
    with at least :data:`MIN_SIDE` profiles on each side."""
    classes = np.asarray(axis_classes)
    level_dims = np.log(effective_dims(np.asarray(dims, dtype=np.float64), multiple))
    out = []
    for w in itertools.product((0.0, 1.0), repeat=3):
        w = np.array(w)
        if not w.any() or any(len(set(w[classes == c])) > 1 for c in np.unique(classes)):
            continue
        level = level_dims @ w
        distinct = np.unique(level)
        for lo, hi in zip(distinct[:-1], distinct[1:]):
            above = int((level >= hi).sum())
            if above >= MIN_SIDE and len(level) - above >= MIN_SIDE:
                out.append(np.concatenate([w, [lo, hi]]))
    return out


def scan(model) -> Boundary | None:
    """The best of :func:`candidate_boundaries` on ``model``'s exact profiles (an ML-II model with
    the boundaries it has, if any) that it does not have yet, by the restricted log-likelihood at
    its hyperparameters with the new side's constant and volume terms (their prior's normaliser
    included) and kernel input (at :data:`SIDE_LENGTHSCALES`) added, the latent scale profiled
    over its grid, less the same without it; None when there is no candidate, or when the exact
    profiles do not outnumber the mean terms with the side's two (the boundary's model would
    have no residual to be judged by)."""
    a = model._a
    t = _LikelihoodTerms.of(model)
    dims = t.dims
    existing = [row for row in regime_rows(a["regime"]) if row[:3].any()]
    candidates = [c for c in candidate_boundaries(dims, a["block_multiple"], a["axis_classes"])
                  if not any(np.array_equal(c, row) for row in existing)]
    if not candidates or len(dims) <= a["basis_transform"].shape[0] + 2:
        return None
    y_s, z, amp, basis, noise, y, lengthscale = t.y_s, t.z, t.amp, t.basis, t.noise, t.y, t.lengthscale
    outputscale, nugget = model._ml2
    flat = model._raw_basis(dims)[:, list(FLAT_TERMS)]
    # the side's constant and volume terms (fit._fit_posterior's prior: vague Gaussians of sd tau s_c)
    s_c = float(a["amplitude_coef"][:a["basis_map"].shape[1]].sum())
    side_precision = 1.0 / (priors._FACE_EDGE_PRIOR_RELATIVE_SD * s_c) ** 2
    prior_precision = np.zeros((basis.shape[1] + 2,) * 2)
    prior_precision[:basis.shape[1], :basis.shape[1]] = a["basis_prior_precision"]
    prior_precision[basis.shape[1]:, basis.shape[1]:] = side_precision * np.eye(2)

    def log_likelihood(side=None, side_lengthscale=1.0):
        if side is None:
            correlation, h, precision = _matern52(z, z, lengthscale), basis, a["basis_prior_precision"]
        else:
            inputs = np.column_stack([z, side])
            correlation = _matern52(inputs, inputs, np.append(lengthscale, side_lengthscale))
            h, precision = np.column_stack([basis, side[:, None] * flat]), prior_precision
        latent = outputscale * amp[:, None] * correlation * amp[None, :] + np.diag(nugget * y_s**2)
        value = _profiled(latent, noise, h, y, precision)
        return value + (0.0 if side is None else math.log(side_precision))  # the side prior's normaliser

    base = log_likelihood()
    level_dims = np.log(effective_dims(dims, a["block_multiple"]))
    best, best_gain = None, -np.inf
    for regime in candidates:
        side = (level_dims @ regime[:3] >= regime[4]).astype(np.float64)
        gain = max(log_likelihood(side, ell) for ell in SIDE_LENGTHSCALES) - base
        if gain > best_gain:
            best, best_gain = regime, gain
    return Boundary(tuple(float(x) for x in best), float(best_gain), len(candidates))


@dataclass(frozen=True)
class _LikelihoodTerms:
    """What a restricted likelihood of ``model``'s exact profiles at its ML-II hyperparameters is
    made of (working units): their dims, the scaled peaks ``y_s``, the kernel inputs ``z`` (the
    log-dims and the sides of the boundaries it has) and lengthscales, the amplitude, the mean
    basis ``H`` and its prior precision, the run noise ``D`` and ``y = y_s - H b_0``."""

    dims: np.ndarray
    y_s: np.ndarray
    z: np.ndarray
    lengthscale: np.ndarray
    amp: np.ndarray
    basis: np.ndarray
    precision: np.ndarray
    noise: np.ndarray
    y: np.ndarray

    @classmethod
    def of(cls, model) -> "_LikelihoodTerms":
        a = model._a
        exact = ~a["train_is_lower_bound"]
        dims = a["train_dims"][exact]
        n_inputs = 3 + sum(1 for row in regime_rows(a["regime"]) if row[:3].any())
        y_s = a["train_bytes"][exact] / model._bytes_scale
        basis = model._basis(dims)
        return cls(dims, y_s, model._z(dims)[:, :n_inputs], a["lengthscale"][:n_inputs], model._amplitude(dims),
                   basis, a["basis_prior_precision"], a["train_noise_var"][exact] / model._bytes_scale**2,
                   y_s - basis @ a["basis_prior_mean"])

    def latent(self, model) -> np.ndarray:
        """``L``: the kernel matrix plus the nugget's misfit, at ``lambda = 1``."""
        outputscale, nugget = model._ml2
        correlation = _matern52(self.z, self.z, self.lengthscale)
        return outputscale * self.amp[:, None] * correlation * self.amp[None, :] + np.diag(nugget * self.y_s**2)


def _profiled(latent, noise, basis, y, precision) -> float:
    """The restricted log-likelihood, the latent scale profiled over its grid (:func:`_grid_max`)."""
    from explorer.model.posterior import restricted_log_likelihood_in_scale

    return _grid_max(lambda grid: restricted_log_likelihood_in_scale(latent, noise, basis, y, precision, grid))


def leave_one_out_gains(with_boundary, without, gain: float) -> np.ndarray:
    r"""The gain of ``with_boundary`` over ``without`` (two ML-II models of the same exact
    profiles, the first with one boundary more) were each profile left out in turn:

    .. math::

        g_{-i} = g - \left[\ell_b(y) - \ell_b(y_{-i})\right] + \left[\ell_0(y) - \ell_0(y_{-i})\right]

    ``g`` the refitted gain, ``\ell`` each model's restricted log-likelihood at its own
    hyperparameters, the latent scale profiled (:func:`_profiled`).  The bracket is what profile
    ``i`` adds to a model's evidence, so ``g_{-i}`` is the gain without it (the hyperparameters
    held: no refit).  A boundary whose ``g_{-i}`` falls under the threshold for some ``i`` is one
    profile's explanation: its sides' terms fit that profile, not a regime (``fit._with_boundary``
    keeps a boundary only when :func:`accept` holds for every ``g_{-i}``)."""
    out = []
    for model in (with_boundary, without):
        t = _LikelihoodTerms.of(model)
        latent, n = t.latent(model), len(t.y)
        full = _profiled(latent, t.noise, t.basis, t.y, t.precision)
        left_out = np.array([_profiled(latent[np.ix_(keep, keep)], t.noise[keep], t.basis[keep], t.y[keep],
                                       t.precision)
                             for keep in (np.delete(np.arange(n), i) for i in range(n))])
        out.append(full - left_out)
    return gain - out[0] + out[1]


#: Every how many points of ``LOG_SCALE_GRID`` :func:`_grid_max` looks first.
_COARSE_STEP = 16


def _grid_max(values_on) -> float:
    """The largest of ``values_on(grid)`` over ``explorer.model.stats.LOG_SCALE_GRID``, from every
    :data:`_COARSE_STEP`-th point and then the points between the best one's neighbours (the
    whole grid's maximum where the function is unimodal in ``log lambda``, as a restricted
    likelihood in one scale is; a scan makes hundreds of these)."""
    from explorer.model.stats import LOG_SCALE_GRID

    coarse = values_on(LOG_SCALE_GRID[::_COARSE_STEP])
    best = int(np.argmax(coarse)) * _COARSE_STEP
    fine = LOG_SCALE_GRID[max(0, best - _COARSE_STEP):best + _COARSE_STEP + 1]
    return float(values_on(fine).max())


def accept(gain: float, n_candidates: int, n_profiles: int) -> bool:
    """Whether a refitted boundary's gain in maximised restricted log-likelihood over no boundary
    earns it (module docstring): more than ``log K + log(n) / 2`` nats, the second term the
    Occam factor of the side's lengthscale, one more hyperparameter fitted to ``n`` exact
    profiles (Schwarz's approximation)."""
    return n_candidates > 0 and gain > math.log(n_candidates) + 0.5 * math.log(n_profiles)

