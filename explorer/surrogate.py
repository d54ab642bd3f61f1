r"""The surrogate: an operator's ``peak_bytes`` as a function of the block shape.

What is modelled
----------------
``peak_bytes(n1, n2, n3)`` of ``operator.run(x)`` on a float32 block ``x`` of
exactly that shape (the definition lives in ``docs/definitions.md``).  The shape
is the *block the operator runs on*: a Dask task on a chunk ``c`` of an
operator with halo ``h`` runs on the chunk plus its halos (at most ``c + 2h``
per axis that is not whole), so the caller (``explorer.chunking``) asks about
that block.  ``halo`` is kept on the model as metadata for that caller.

The model (Rasmussen & Williams 2006, section 2.7, "explicit basis functions")
-------------------------------------------------------------------------------
.. math::

    y(x) = h(x)^\top \beta + f(x) + \varepsilon(x), \qquad
    f \sim \mathcal{GP}(0, k), \qquad \beta \sim \text{flat / vague Gaussian (below)}

*Mean basis* ``h``: the multilinear polynomial in the dims,
``[1, V, n1 n2, n1 n3, n2 n3, n1, n2, n3]`` (``V = n1 n2 n3``), evaluated on
``u = n / L`` with ``L`` the per-axis geometric mean of the profiled dims (so
every term is 1 at the centre of the design).  A halo padding
``(n1 + 2h1)(n2 + 2h2)(n3 + 2h3)`` expands into exactly these terms and their
span is invariant under ``n -> n + 2h``, so raw and padded dims describe the
same functions.  We use the raw dims of the profiled block because that is
what was measured and what a Dask task runs on (``c + 2h``); in block dims
there is no halo shift to expect, which is what the prior below is centred on.

*Alike axes* (``Operator.axis_classes``, declared only where measured:
``tests/test_operators.py`` profiles every declared swap).  When permuting some axes of a
block leaves the operator's peak unchanged (gst3d's isotropic stencils: all three; the
Hilbert-transform attributes: inline and crossline), the model is made invariant under
those permutations, so that one profile informs every permutation of its block:

* the mean's terms are tied over each orbit of the permutations (:func:`basis_map`: the
  column of an orbit is the average of its monomials, e.g. ``[1, V, (n1 n2 + n1 n3 +
  n2 n3) / 3, (n1 + n2 + n3) / 3]`` when all three axes are alike, 4 coefficients instead of
  8), with one reference length ``L`` shared by the axes of a class (:func:`class_lengths`);
* the residual kernel sees the dims sorted within each class (:func:`canonical_dims`):
  ``k(x, x') = k_0(sort(x), sort(x'))`` is a kernel (a kernel of a fixed map of the inputs)
  and is invariant under the permutations, whose orbits it collapses to one point.

A pipeline's axes are alike where every member's are and the members' halos and padding
agree on them (``operators.pipeline.Pipeline``).

*Prior on beta*: flat on the constant and volume coefficients; a vague
Gaussian ``N(0, (tau * s_c)^2)`` on each face and edge coefficient, with
``s_c`` the typical peak at the design centre and ``tau = 1`` (each of these
terms may be as large as the whole peak at the centre; real face terms are
~10-30 %).  With >= 10 profiles the data dominate it; with the 4-6 profiles of
an initial design it keeps all eight terms identified and makes the bound
honestly wide instead of switching bases.  Then ``A = H K_y^{-1} H^T + B^{-1}``
below (``B^{-1}`` is zero on the flat directions).  For conditioning the basis
is linearly re-parametrised so that the weighted design stacked on the prior
pseudo-rows is orthonormal; the posterior is invariant to this.

*Residual kernel* ``k``: a relative residual on normalised log-dims,

.. math::

    k(x, x') = \sigma_f^2\, s(x)\, s(x')\,
               \mathrm{Matern}_{5/2}\big(z(x), z(x'); \ell_1, \ell_2, \ell_3\big),
    \qquad z_i = \frac{\log n_i - \log n_i^{lo}}{\log n_i^{hi} - \log n_i^{lo}}

where ``s(x) = e(x) (e(x) / e_c)^{-kappa}`` is a positive amplitude: ``e(x) =
max(h(x)^T gamma, floor)`` an envelope of the peak (``gamma >= 0``: a non-negative
least-squares fit of the basis to the data with relative weights) and ``e_c`` its
value at the design centre.  ``sigma_f`` is then a *relative* deviation at the centre
(1 % means "the truth departs from the polynomial by about 1 % of its value"), and
the slope ``kappa`` in ``[0, 1]`` says how that relative deviation changes with the
size of the peak: ``kappa = 0`` one relative size everywhere, ``kappa = 1`` one
absolute size in bytes (allocator and page granularity: small blocks depart from the
polynomial by a larger share of their peak than large ones do).  ``kappa`` is fitted with the
kernel (ML-II below) under a half-normal prior of sd 0.5 about 0.

*Noise* (bytes^2).  A single profiling run at a shape whose peak is ``y`` has
variance ``rho_run^2 y^2 + a^2``: ``a`` an absolute term for the allocator's granularity
(repeats differ by whole quanta whatever the block: 68 KiB on one machine here, 184-196 KiB
on another, so it is learnt, never a constant) and ``rho_run`` a relative one.  Both are
learnt from the repeats by maximum likelihood (``explorer.stats.fit_spread``), ``rho_run``
with a weak prior (``nu_0 = 4`` pseudo-degrees of freedom at a typical 0.5 %), ``rho_run >=
rel_noise_floor`` and ``a >=`` the kernel's page:

.. math::

    \min_{a, \rho}\; \sum_i (r_i - 1)\Big(\log \sigma^2(y_i) + \frac{r_i v_i}{\sigma^2(y_i)}\Big)
        + \nu_0 \Big(\log \rho^2 + \frac{s_0^2}{\rho^2}\Big),
    \qquad \sigma^2(y) = \rho^2 y^2 + a^2,
    \qquad \nu = \nu_0 + \sum_i (r_i - 1)

(with ``a = 0`` its minimum is the pooled ``(nu_0 s_0^2 + sum (r_i - 1) r_i v_i / y_i^2) /
nu``: a quantum of a few hundred KiB then counted as a third of a tiny block's peak and
widened every bound, envelope's to 33 % at 512 MiB),
where ``y_i`` is the mean of ``r_i`` runs and ``v_i`` the variance of that
mean (``s_i^2 / r_i``, so ``r_i v_i`` is the single-run sample variance).  The
observation noise of training point ``i`` is

.. math::

    \sigma_i^2 = \max\!\big(v_i,\; (\rho_{run}^2 y_i^2 + a^2) / r_i\big)
                 + \rho_{nug}^2 y_i^2

(``max``: one lucky pair of repeats does not make a point exact, one noisy
pair is believed).  ``rho_nug^2`` is a relative nugget fitted with the kernel.

*Fitting* (ML-II).  ``sigma_f``, ``ell``, ``kappa`` and ``rho_nug`` maximise the
restricted marginal likelihood (``beta`` integrated out, R&W eq. 2.43-2.45
with ``B^{-1} -> 0`` on the flat directions) plus weak log-normal priors:

.. math::

    \log p(y) = -\tfrac12 y^\top K_y^{-1} y
                + \tfrac12 b^\top A^{-1} b
                - \tfrac12 \log|K_y| - \tfrac12 \log|A|
                - \tfrac{n-2}{2}\log 2\pi + \text{const},
    \qquad A = H K_y^{-1} H^\top + B^{-1},\; b = H K_y^{-1} y

with ``fit_gpytorch_mll`` (GPyTorch kernel and likelihood modules, a custom
MLL that computes this restricted likelihood).  Working units: bytes divided by
the largest observed peak.

*Posterior* (R&W eqs. 2.41-2.42), for test points ``*``:

.. math::

    \bar\beta = A^{-1} H K_y^{-1} y \;(\text{prior mean } 0), \qquad
    \bar g(x_*) = h_*^\top \bar\beta + k_*^\top K_y^{-1}(y - H^\top \bar\beta)

    \mathrm{cov}(g_*, g_*') = k(x_*, x_*') - k_*^\top K_y^{-1} k_*'
                              + R_*^\top A^{-1} R_*', \qquad
    R_* = h_* - H K_y^{-1} k_*

The last term is the coefficient uncertainty: it grows with the distance of
``h_*`` from the span of the training design, which is what widens the bound
when a block is 8x larger than anything profiled.

*The overall scale, integrated out.*  ML-II fixes the residual scale ``sigma_f``
at a point; with few profiles the data leave few degrees of freedom for it (9
profiles against 2 flat mean terms and 6 vague ones), and a point estimate then
claims a tightness nobody measured.  So every covariance above is taken as
``lambda K`` with ``K`` the ML-II fit and ``lambda`` an unknown multiplier with a
scaled-inverse-chi-square prior of ``nu_0 = SCALE_PRIOR_DOF`` degrees of freedom
centred on 1 (the fit's own scale, believed as one pseudo-observation).  With the
coefficients integrated out as above, the conjugate update (O'Hagan 1978; Santner,
Williams & Notz 2003, section 4.1) gives

.. math::

    \nu = \nu_0 + n - p_{flat}, \qquad
    s^2 = \max\Big(1,\; \frac{\nu_0 + y^\top P y}{\nu}\Big), \qquad
    P = K_y^{-1} - K_y^{-1} H^\top A^{-1} H K_y^{-1}

(``y^T P y = y^T alpha``, the generalised residual sum of squares; ``p_flat = 2``),
and the predictive of any linear functional is a Student-t with ``nu`` degrees of
freedom whose squared scale is ``s^2`` times the Gaussian variance at ``lambda = 1``.
The scale is never taken below the fit's own (``max(1, .)``, the prior truncated at
``lambda >= 1``): ``K_y`` holds the run noise measured by the repeats, and residuals
smoother than ``K_y`` expects (a truth the mean captures exactly) must not shrink that
measured noise; measured on a polynomial truth, the untruncated ``s^2`` fell to ~0.3
and covered 88 % of new runs with a 99 % bound (``tests/test_surrogate.py``).

*Prediction of a new single run* (what ``predict`` bounds): a Student-t with ``nu``
degrees of freedom, location ``mean_g`` and squared scale ``s^2 (var_g + sigma^2)``,
``sigma^2 = rho_run^2 mean^2 + a^2 + rho_nug^2 mean^2``;
``upper = mean + t_nu(confidence) * scale`` (SciPy's ``stdtrit``).  ``latent_moments``,
``noise_var`` and ``posterior_cov`` return the scaled (``s^2``) quantities.
``scores`` and ``loo_scores`` turn residuals into normal scores under this predictive
(the stop rule of ``explorer.acquisition`` tests them).

*An informative prior mean* (:class:`MeanPrior`).  When another model already predicts the
peak (a pipeline's model composed from its members', ``explorer.composed``), its means and
standard deviations over the target region become the prior ``beta ~ N(b_0, B)`` of every
basis term (:func:`_mean_prior_rows`: ``b_0`` their projection on the basis, ``B`` their
variance), in place of the flat / vague prior.  The posterior is the one above with
``beta_bar = A^{-1} (H K_y^{-1} y + B^{-1} b_0)``, ML-II is fitted on ``y - H^T b_0``, and
with no flat direction left ``nu = nu_0 + n``.  The loop then learns only what the profiles
say differs from the prior: with the composed model near the truth, a handful of profiles
make the bound tight.

*In a Dask worker* a task needs more than its isolated peak (the block it reads,
the copies of the store): ``explorer.calibration`` models that
excess on top of this model.

*Lower bounds* (profiles that exceeded the memory cap: the true peak of that run is at
least the recorded value ``L``) are censored observations, never dropped and never
taken as exact.  The model is fitted on the exact profiles; then each lower bound
enters through its proper likelihood ``P(y_run >= L | g) = Phi((g - L) / sigma)``,
approximated by assumed-density filtering (``_with_censored``): a bound above the
prediction pulls the mean up and narrows the variance only as far as the truncation
warrants, a bound the exact data already clear adds nothing.  The shapes and values
of all lower bounds are kept on the model (``exceeded_shapes``, ``exceeded_bytes``)
for the acquisition's safety filter.

Prediction is pure NumPy: ``fit`` exports the posterior (training inputs, the
inverse Cholesky factor of ``K_y``, ``alpha``, ``beta_bar``, ``A^{-1/2}``,
hyperparameters, scales) and ``MemoryModel`` never imports torch.  ``import
explorer.surrogate`` is torch-free; torch, gpytorch and botorch are imported
inside ``fit``.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from explorer.core import paths
from explorer.core.paths import model_path
from explorer.stats import MAX_DOF, normal_scores, scale_posterior, t_quantile

__all__ = [
    "BASIS_NAMES",
    "DEFAULT_REL_NOISE_FLOOR",
    "MeanPrior",
    "MemoryModel",
    "ModelFileError",
    "ModelNotFoundError",
    "fit",
    "load_model",
]

#: The mean basis, in the order of ``beta`` (physical units: bytes, bytes per voxel, ...).
BASIS_NAMES = ("constant", "volume", "face12", "face13", "face23", "edge1", "edge2", "edge3")
#: The basis itself, the one definition every form uses (NumPy here, torch in ``gp_torch``):
#: term ``j`` is the monomial ``prod_i u_i ** BASIS_EXPONENTS[j, i]``.
BASIS_EXPONENTS = np.array([[0, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
#: The axes each term multiplies, in increasing order (``BASIS_EXPONENTS`` holds only 0 and 1).
_TERM_AXES = [tuple(int(a) for a in np.flatnonzero(row)) for row in BASIS_EXPONENTS]
assert set(np.unique(BASIS_EXPONENTS)) <= {0, 1}
#: Terms with a flat prior (the constant and the volume); the others get a vague Gaussian.
#: They stay the first two columns whatever ties :func:`basis_map` makes (each is its own orbit).
FLAT_TERMS = (0, 1)


def basis_map(axis_classes=(0, 1, 2)) -> np.ndarray:
    """``(8, q)``: the mean's terms tied over axes that are alike (``Operator.axis_classes``).

    Axes of one class are interchangeable for the operator: permuting them leaves its peak
    unchanged, so two monomials that such a permutation maps onto each other (an *orbit*:
    ``n1 n2`` and ``n1 n3`` when axes 2 and 3 are alike) must carry one coefficient.  Column
    ``k`` averages the monomials of orbit ``k`` (so it is 1 at the design centre, like every
    raw term); orbits are numbered in the order of ``BASIS_EXPONENTS``, so the constant and
    the volume stay columns 0 and 1.  Two monomials share an orbit exactly when their
    multisets of ``(class, exponent)`` over the axes agree.  All axes distinct (the default):
    the identity, the full eight-term basis.  All alike: ``[1, V, mean of the faces, mean of
    the edges]``, four terms.
    """
    classes = tuple(int(c) for c in axis_classes)
    if len(classes) != BASIS_EXPONENTS.shape[1]:
        raise ValueError(f"axis_classes must give one class per axis, got {axis_classes}")
    orbits: dict[tuple, list[int]] = {}
    for j, exponents in enumerate(BASIS_EXPONENTS):
        key = tuple(sorted(zip(classes, (int(e) for e in exponents))))
        orbits.setdefault(key, []).append(j)
    mapping = np.zeros((len(BASIS_EXPONENTS), len(orbits)))
    for k, terms in enumerate(orbits.values()):
        mapping[terms, k] = 1.0 / len(terms)
    return mapping


def class_lengths(log_dims: np.ndarray, axis_classes) -> np.ndarray:
    """The basis's reference length per axis: the geometric mean of the profiled dims over
    every axis of the axis's class, so that alike axes share one unit (a tied coefficient
    is then one coefficient in physical units too)."""
    classes = np.asarray(axis_classes)
    per_axis = log_dims.mean(0)
    return np.exp(np.array([per_axis[classes == classes[a]].mean() for a in range(len(classes))]))


#: Default relative noise floor of a single run (0.2 %).
DEFAULT_REL_NOISE_FLOOR = 0.002
#: Weak prior of the pooled relative run noise: (typical relative sd, pseudo-degrees of freedom).
_RUN_NOISE_PRIOR = (0.005, 4.0)
#: Bumped when the saved layout changes.
FORMAT_VERSION = 5
#: Formats this code reads.  4 and older kept one scale for the latent peak and the run noise
#: alike, truncated at the fit's own: refit them.
READABLE_FORMATS = (FORMAT_VERSION,)

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
    composed model, ``explorer.composed.ComposedModel``, over the loop's target region).  ``fit`` turns
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


class ModelNotFoundError(LookupError):
    """No saved model for an operator: it has not been explored yet."""


class ModelFileError(ValueError):
    """A saved model file cannot be read (one line naming the file and the fix)."""


# --------------------------------------------------------------------------------------
# Feature map (pure NumPy; mirrored in torch inside the fitting code)
# --------------------------------------------------------------------------------------


def _as_dims(shapes) -> np.ndarray:
    """``(m, 3)`` float64 array of positive block dims from one shape or many."""
    dims = np.asarray(shapes, dtype=np.float64)
    if dims.ndim == 1:
        dims = dims[None, :]
    if dims.ndim != 2 or dims.shape[1] != 3:
        raise ValueError(f"expected shapes of 3 dims, got an array of shape {dims.shape}")
    if not np.all(dims > 0):
        raise ValueError("block dims must be positive")
    return dims


def effective_dims(dims: np.ndarray, multiple) -> np.ndarray:
    """``ceil(n / m) * m`` per axis: the dims an operator that pads its block to a multiple
    ``m`` (``Operator.block_multiple``) really computes on; ``m = 1`` leaves them alone."""
    multiple = np.asarray(multiple, dtype=np.float64)
    return np.ceil(dims / multiple) * multiple


def _raw_basis(dims: np.ndarray, axis_length: np.ndarray, multiple, mapping=None) -> np.ndarray:
    """``[1, V, n1n2, n1n3, n2n3, n1, n2, n3]`` on ``u = effective_dims / axis_length``, (m, 8),
    tied by ``mapping`` (:func:`basis_map`, (8, q); None: untied) into (m, q)."""
    u = effective_dims(dims, multiple) / axis_length
    raw = np.empty((len(u), len(BASIS_EXPONENTS)))
    for term, axes in enumerate(_TERM_AXES):  # exponents are 0 or 1: products of columns (hot path)
        if not axes:
            raw[:, term] = 1.0
            continue
        column = u[:, axes[0]].copy()
        for axis in axes[1:]:
            column *= u[:, axis]
        raw[:, term] = column
    return raw if mapping is None else raw @ mapping


def alike_groups(axis_classes) -> tuple[np.ndarray, ...]:
    """The axes of each class that has more than one (``Operator.axis_classes``), as index arrays."""
    classes = np.asarray(axis_classes, dtype=np.int64)
    return tuple(np.flatnonzero(classes == c) for c in np.unique(classes) if np.sum(classes == c) > 1)


def canonical_dims(dims: np.ndarray, groups) -> np.ndarray:
    """The dims sorted ascending within each group of alike axes (:func:`alike_groups`): one
    representative of every permutation an alike-axes operator cannot tell apart, so a kernel
    on them is invariant under those permutations (a profile informs all of its permutations)."""
    if not groups:
        return dims
    dims = np.array(dims, dtype=np.float64, copy=True)
    for group in groups:
        dims[:, group] = np.sort(dims[:, group], axis=1)
    return dims


def _kernel_inputs(dims: np.ndarray, log_lo: np.ndarray, log_span: np.ndarray, multiple, groups=()) -> np.ndarray:
    """Normalised log effective dims ``z = (log n - log n_lo) / span``: the training box is [0, 1]^3."""
    return (np.log(canonical_dims(effective_dims(dims, multiple), groups)) - log_lo) / log_span


def _amplitude(raw: np.ndarray, gamma: np.ndarray, floor: float, slope: float) -> np.ndarray:
    """``s(x) = e(x) (e(x) / e_c)^-kappa`` with the envelope ``e = max(h^T gamma, floor)`` and
    ``e_c = max(sum gamma, floor)`` its value at the design centre (every raw term is 1 there)."""
    envelope = np.maximum(raw @ gamma, floor)
    return envelope * (envelope / max(float(gamma.sum()), floor)) ** -slope


def _matern52(za: np.ndarray, zb: np.ndarray, lengthscale: np.ndarray) -> np.ndarray:
    """Matern-5/2 correlation ``(1 + sqrt5 r + 5/3 r^2) exp(-sqrt5 r)``, ARD distance ``r``."""
    a = za / lengthscale
    return _matern52_scaled(a, (a * a).sum(1), zb / lengthscale)


def _matern52_scaled(a: np.ndarray, a_squared: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_matern52` of inputs already divided by the lengthscales, with ``a_squared =
    (a * a).sum(1)`` given (a model's training side, computed once): ``r^2 = |a|^2 + |b|^2 -
    2 a.b``.  The same operations in the same order, in place on the ``(len(a), len(b))``
    result (the planner's hot path)."""
    sq = a_squared[:, None] + (b * b).sum(1)[None, :]
    cross = a @ b.T
    cross *= 2.0
    sq -= cross
    r = np.sqrt(np.maximum(sq, 0.0, out=sq), out=sq)
    s5r = math.sqrt(5.0) * r
    k = 1.0 + s5r
    quadratic = (5.0 / 3.0) * r
    quadratic *= r
    k += quadratic
    k *= np.exp(np.negative(s5r, out=s5r), out=s5r)
    return k


@lru_cache(maxsize=256)
def _bound_quantile(confidence: float, dof: float) -> float:
    """``t_nu(confidence)`` of a validated confidence (cached: ``predict_many`` is on the planner's hot path)."""
    from explorer.core import validate

    return t_quantile(validate.confidence(confidence), dof)


# --------------------------------------------------------------------------------------
# The fitted model (NumPy only)
# --------------------------------------------------------------------------------------

#: Arrays that define a fitted model (saved as they are; everything else is derived).
_ARRAY_FIELDS = (
    "train_dims",  # (n, 3) block dims of the observations (exact + lower bounds used)
    "train_bytes",  # (n,) observed peak bytes
    "train_noise_var",  # (n,) total observation noise variance, bytes^2
    "train_is_lower_bound",  # (n,) bool: a lower bound added as an observation
    "exceeded_dims",  # (k, 3) all lower-bound profiles (exceeded the cap)
    "exceeded_bytes",  # (k,) their recorded values (the truth is >= these)
    "axis_length",  # (3,) reference lengths of the basis
    "block_multiple",  # (3,) the operator pads blocks to these multiples: features use effective_dims
    "basis_map",  # (8, p) the terms tied over alike axes (basis_map; the identity when none are)
    "axis_classes",  # (3,) which axes are alike (Operator.axis_classes): the kernel sorts their dims
    "basis_transform",  # (p, p) re-parametrisation T: h(x) = raw_basis(x) @ T
    "basis_prior_precision",  # (p, p) B^{-1} in the re-parametrised basis
    "basis_prior_mean",  # (p,) b_0, the prior mean of beta in the re-parametrised basis (0: none)
    "amplitude_coef",  # (p,) gamma >= 0: s(x) = max(raw_basis(x) @ gamma, amplitude_floor)
    "log_lo",  # (3,) kernel input normalisation
    "log_span",  # (3,)
    "lengthscale",  # (3,)
    "scalars",  # (6,) see _SCALAR_NAMES
    "chol_inv",  # (n, n) L^{-1}, K_y = L L^T
    "alpha",  # (n,) K_y^{-1} (y - H^T beta_bar)
    "beta",  # (p,) beta_bar in the transformed basis
    "whitened_basis",  # (n, p) W = L^{-1} H^T
    "chol_a_inv",  # (p, p) L_A^{-1}, A = W^T W = L_A L_A^T
)
_SCALAR_NAMES = (
    "bytes_scale",  # bytes per working unit
    "outputscale",  # sigma_f^2 (relative)
    "relative_nugget_var",  # rho_nug^2
    "relative_run_var",  # rho_run^2
    "abs_noise_var",  # a^2 in working units^2
    "amplitude_floor",  # in working units
    "noise_dof",  # nu: degrees of freedom of rho_run^2 (from the repeats; reported)
    "latent_scale",  # s^2: the latent scale lambda's posterior scale, applied to outputscale and nugget
    "latent_dof",  # nu_lambda: its degrees of freedom (module docstring)
    "amplitude_slope",  # kappa: the relative residual scales as e(x)^-kappa (module docstring)
    "ml2_outputscale",  # sigma_f^2 as ML-II fitted it (lambda = 1)
    "ml2_relative_nugget_var",  # rho_nug^2 as ML-II fitted it
    "certified_factor",  # kappa_U >= 1: the predictive's scale widened by the evidence's bound (module docstring)
)


class MemoryModel:
    """A fitted peak-memory model of one operator; prediction is pure NumPy.

    Attributes: ``operator``, ``halo``, ``n_observations`` (profiles given to
    ``fit``, lower bounds included), ``environment`` (the stamp it was learnt in),
    ``exceeded_shapes`` and ``exceeded_bytes`` (lower-bound profiles),
    ``coefficients`` (``beta_bar`` in physical units, by ``BASIS_NAMES``),
    ``info`` (fit metadata).
    """

    def __init__(self, operator: str, halo, n_observations: int, arrays: dict, info: dict | None = None,
                 environment: dict | None = None):
        self.operator = str(operator)
        self.halo = tuple(int(h) for h in halo)
        self.n_observations = int(n_observations)
        self.info = dict(info or {})
        #: The environment the profiles were measured in (``explorer.core.environment``); set
        #: when the model is saved, read back when it is loaded.
        self.environment = dict(environment) if environment else None
        #: Differences from this process's environment, set by ``load_model`` (empty: none).
        self.stale: list[str] = []
        missing = [name for name in _ARRAY_FIELDS if name not in arrays]
        if missing:
            raise ValueError(f"model arrays missing: {missing}")
        self._a = {name: np.asarray(arrays[name]) for name in _ARRAY_FIELDS}
        for name in _ARRAY_FIELDS:
            if name != "train_is_lower_bound":
                self._a[name] = self._a[name].astype(np.float64)
        self._a["train_is_lower_bound"] = self._a["train_is_lower_bound"].astype(bool)
        s = dict(zip(_SCALAR_NAMES, self._a["scalars"].tolist()))
        self._bytes_scale = s["bytes_scale"]
        self._outputscale = s["outputscale"]
        self._rel_nugget_var = s["relative_nugget_var"]
        self._rel_run_var = s["relative_run_var"]
        self._abs_noise_var = s["abs_noise_var"]
        self._amp_floor = s["amplitude_floor"]
        self._noise_dof = s["noise_dof"]
        self._latent_scale = s["latent_scale"]
        self._latent_dof = s["latent_dof"]
        self._amp_slope = s["amplitude_slope"]
        self._ml2 = (s["ml2_outputscale"], s["ml2_relative_nugget_var"])
        self._certified_factor = s["certified_factor"]
        #: Degrees of freedom of the predictive of a new run: the smaller of the latent scale's and
        #: the run noise's (a Welch-Satterthwaite t lies between them: never fewer).
        self._predictive_dof = float(min(self._latent_dof, self._noise_dof))
        mapping = self._a["basis_map"]
        self._map = None if mapping.shape[0] == mapping.shape[1] and np.allclose(mapping, np.eye(len(mapping))) \
            else mapping  # untied: skip the product on the hot path
        self._groups = alike_groups(self._a["axis_classes"])
        # Derived training quantities.
        self._train_z = self._z(self._a["train_dims"])
        self._train_amp = self._amplitude(self._a["train_dims"])
        # The training side of the predictive's kernel (``_parts``), once.
        self._train_scaled_z = self._train_z / self._a["lengthscale"]
        self._train_scaled_z_squared = (self._train_scaled_z * self._train_scaled_z).sum(1)
        self._train_scale = self._outputscale * self._train_amp[:, None]

    # ---- feature map ------------------------------------------------------------
    def _z(self, dims):
        return _kernel_inputs(dims, self._a["log_lo"], self._a["log_span"], self._a["block_multiple"], self._groups)

    def _raw_basis(self, dims):
        return _raw_basis(dims, self._a["axis_length"], self._a["block_multiple"], self._map)

    def _amplitude(self, dims):
        return _amplitude(self._raw_basis(dims), self._a["amplitude_coef"], self._amp_floor, self._amp_slope)

    def _basis(self, dims):
        return self._raw_basis(dims) @ self._a["basis_transform"]

    def _kernel(self, dims_a, dims_b, z_a=None, z_b=None, amp_a=None, amp_b=None):
        z_a = self._z(dims_a) if z_a is None else z_a
        z_b = self._z(dims_b) if z_b is None else z_b
        amp_a = self._amplitude(dims_a) if amp_a is None else amp_a
        amp_b = self._amplitude(dims_b) if amp_b is None else amp_b
        return self._outputscale * amp_a[:, None] * _matern52(z_a, z_b, self._a["lengthscale"]) * amp_b[None, :]

    # ---- posterior in working units -------------------------------------------
    def _parts(self, dims):
        """Per-test-point pieces: mean, ``V = L^{-1} k_*``, ``Q = L_A^{-1} R_*``, z, amplitude."""
        z = self._z(dims)
        raw = self._raw_basis(dims)
        amp = _amplitude(raw, self._a["amplitude_coef"], self._amp_floor, self._amp_slope)
        k_train = _matern52_scaled(self._train_scaled_z, self._train_scaled_z_squared, z / self._a["lengthscale"])
        k_train *= self._train_scale  # outputscale x the training amplitudes, (n, 1)
        k_train *= amp[None, :]  # (n, m)
        h = raw @ self._a["basis_transform"]  # (m, p)
        mean = h @ self._a["beta"] + k_train.T @ self._a["alpha"]
        v = self._a["chol_inv"] @ k_train  # (n, m)
        r = h.T - self._a["whitened_basis"].T @ v  # (p, m)
        q = self._a["chol_a_inv"] @ r  # (p, m)
        return mean, v, q, z, amp

    def _latent(self, dims):
        """Mean and variance of the latent peak (working units), the nugget's misfit included
        (both scaled by ``lambda``: module docstring)."""
        mean, v, q, _z, amp = self._parts(dims)
        var = self._outputscale * amp * amp - (v * v).sum(0) + (q * q).sum(0)
        m = np.maximum(mean, 0.0)
        return mean, np.maximum(var, 0.0) + self._rel_nugget_var * m * m

    def _run_noise_var(self, mean):
        """Variance of one new run about the latent peak (working units): the run noise the
        repeats measured, ``rho_run^2 m^2 + a^2``."""
        m = np.maximum(mean, 0.0)
        return self._rel_run_var * m * m + self._abs_noise_var

    # ---- public: moments in bytes ---------------------------------------------
    def latent_moments(self, shapes) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean (bytes) and variance (bytes^2) of the noise-free peak ``g`` at each
        shape, its misfit (the nugget) and the basis-coefficient term included, at the learnt
        latent scale (the square of the Student-t's latent scale).  Isolated peak.
        """
        mean, var = self._latent(_as_dims(shapes))
        s = self._bytes_scale
        return mean * s, var * s * s

    def noise_var(self, shapes_or_mean, *, from_mean: bool = False) -> np.ndarray:
        """Variance (bytes^2) of one new profiling run about the latent peak: the run noise
        ``rho_run^2 m^2 + a^2`` with ``m`` the posterior mean at the shapes (or the given
        means in bytes when ``from_mean=True``).
        """
        s = self._bytes_scale
        if from_mean:
            mean = np.asarray(shapes_or_mean, dtype=np.float64) / s
        else:
            mean, _ = self._latent(_as_dims(shapes_or_mean))
        return self._run_noise_var(mean) * s * s

    def predictive_var(self, shapes) -> np.ndarray:
        """Squared scale (bytes^2) of a new single isolated run: latent + run noise (the
        predictive is a Student-t with :meth:`predictive_t`'s degrees of freedom and this scale).
        """
        mean, var = self._latent(_as_dims(shapes))
        return (var + self._run_noise_var(mean)) * self._bytes_scale**2

    def posterior_cov(self, shapes_a, shapes_b) -> np.ndarray:
        """Joint posterior covariance (bytes^2) of the smooth latent peak, ``(m_a, m_b)``:
        ``k(a, b) - k_a^T K_y^{-1} k_b + R_a^T A^{-1} R_b`` (basis term included; the nugget,
        independent from shape to shape, is not).
        """
        dims_a, dims_b = _as_dims(shapes_a), _as_dims(shapes_b)
        _, v_a, q_a, z_a, amp_a = self._parts(dims_a)
        _, v_b, q_b, z_b, amp_b = self._parts(dims_b)
        prior = self._kernel(dims_a, dims_b, z_a, z_b, amp_a, amp_b)
        return (prior - v_a.T @ v_b + q_a.T @ q_b) * self._bytes_scale**2

    def predictive_t(self, shapes) -> tuple[np.ndarray, np.ndarray, float]:
        """``(location, scale, dof)`` in bytes of the Student-t predictive of one new isolated
        run at each shape: ``upper(c) = location + scale * t_dof(c)`` (:meth:`predict_many`).

        The one description of the predictive that other models build on (the in-worker
        task model adds its own shared and per-task terms to it)."""
        mean, var = self._latent(_as_dims(shapes))
        var = var + self._run_noise_var(mean)
        scale = self._bytes_scale * self._certified_factor
        return mean * self._bytes_scale, np.sqrt(var) * scale, self._predictive_dof

    def predict_many(self, shapes, confidence: float = 0.99) -> tuple[np.ndarray, np.ndarray]:
        """Mean and one-sided upper bound (bytes) of the isolated peak of a new run.

        The predictive of a new run is a Student-t with ``nu`` degrees of freedom, location
        ``m = mean_g`` and squared scale ``v = var_g + sigma^2`` (``predictive_var``,
        :meth:`predictive_t`): ``upper = m + t_nu(confidence) sqrt(v)``.
        What a task needs inside a Dask worker on top is ``explorer.calibration.TaskModel``'s.
        """
        t = _bound_quantile(float(confidence), self._predictive_dof) * self._certified_factor
        mean, var = self._latent(_as_dims(shapes))
        var = var + self._run_noise_var(mean)
        scale = self._bytes_scale
        return mean * scale, (mean + t * np.sqrt(var)) * scale

    def scores(self, shapes, peak_bytes, n_repeats=1) -> np.ndarray:
        """Normal scores of observed values under this model's predictive (``explorer.stats``).

        A value that is the mean of ``r`` new runs at a shape has the predictive location
        ``m`` and squared scale ``var_g + sigma^2 / r``; its standardised residual is
        ``t``-distributed with the predictive's degrees of freedom when the model is right,
        and its normal score ``Phi^{-1}(F_nu(t))`` is then N(0, 1).  Used on profiles the
        model had not seen (predicted before they ran).
        """
        return normal_scores(self.standardised(shapes, peak_bytes, n_repeats), self._predictive_dof)

    def standardised(self, shapes, peak_bytes, n_repeats=1) -> np.ndarray:
        """``(y - m) / sqrt(var_g + sigma^2 / r)``: observed values (each the mean of ``r``
        runs) standardised by this model's predictive (Student-t with ``predictive_t``'s dof)."""
        dims = _as_dims(shapes)
        mean, var = self._latent(dims)
        r = np.broadcast_to(np.asarray(n_repeats, dtype=np.float64), mean.shape)
        var = var + self._run_noise_var(mean) / np.maximum(r, 1.0)
        y = np.asarray(peak_bytes, dtype=np.float64).reshape(-1) / self._bytes_scale
        return (y - mean) / (np.sqrt(var) * self._certified_factor)

    def prequential_terms(self, shapes, peak_bytes, n_repeats=1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(e, c, s)`` of observed values (each the mean of ``r`` runs) this model had not seen:
        the residual ``e = y - m`` (bytes), the latent variance ``c`` (bytes^2, at this model's
        latent scale, misfit included) and the run noise ``s`` of the mean (bytes^2): the data of
        the latent scale's posterior (``explorer.stats.scale_posterior``, :meth:`calibrated`)."""
        dims = _as_dims(shapes)
        mean, var = self._latent(dims)
        r = np.broadcast_to(np.asarray(n_repeats, dtype=np.float64), mean.shape)
        noise = self._run_noise_var(mean) / np.maximum(r, 1.0)
        scale = self._bytes_scale
        y = np.asarray(peak_bytes, dtype=np.float64).reshape(-1)
        return y - mean * scale, var * scale**2, noise * scale**2

    def predict(self, shape, confidence: float = 0.99) -> tuple[float, float]:
        """``(mean_bytes, upper_bytes)`` of the peak of one run on a block of ``shape``."""
        mean, upper = self.predict_many(_as_dims(shape), confidence)
        return float(mean[0]), float(upper[0])

    def with_observations(self, shapes, peak_bytes, noise_var, *, lower_bound: bool = False) -> "MemoryModel":
        """The posterior conditioned on further observations, hyperparameters held fixed.

        No refit: the same kernel, feature map, noise model and latent scale; ``noise_var``
        (bytes^2, on the scale of :meth:`noise_var`) is each new observation's run noise (an
        exact one also has the nugget's misfit).  Used to check closed-form variance
        reductions, and for the censored-observation sites of ``fit``
        (``lower_bound=True`` marks them).
        """
        dims = _as_dims(shapes)
        y = np.asarray(peak_bytes, dtype=np.float64).reshape(-1)
        v = np.asarray(noise_var, dtype=np.float64).reshape(-1)
        if not (len(y) == len(v) == len(dims)):
            raise ValueError("shapes, peak_bytes and noise_var must have the same length")
        a = dict(self._a)
        a["train_dims"] = np.vstack([a["train_dims"], dims])
        a["train_bytes"] = np.concatenate([a["train_bytes"], y])
        a["train_noise_var"] = np.concatenate([a["train_noise_var"], v])
        a["train_is_lower_bound"] = np.concatenate([a["train_is_lower_bound"], np.full(len(y), lower_bound)])
        hyper = {"outputscale": self._outputscale, "lengthscale": a["lengthscale"], "amplitude_slope": self._amp_slope}
        a.update(_posterior_arrays(a["train_dims"], a["train_bytes"] / self._bytes_scale,
                                   _training_noise(a, self._rel_nugget_var), a, self._amp_floor, hyper))
        return MemoryModel(self.operator, self.halo, self.n_observations + len(y), a, self.info,
                           environment=self.environment)

    def certified(self, factor: float, evidence: dict | None = None) -> "MemoryModel":
        """This model with its predictive's scale multiplied by ``max(1, factor)``: ``factor`` an
        upper confidence bound on how much the model's predictions understated their scale
        (``explorer.stats.scale_confidence_bound``; module docstring, *The bound, certified*).
        ``evidence`` is kept in ``info["certified"]``."""
        a = dict(self._a)
        names = dict(zip(_SCALAR_NAMES, a["scalars"].tolist()))
        names["certified_factor"] = max(1.0, float(factor))
        a["scalars"] = np.array([names[name] for name in _SCALAR_NAMES])
        model = MemoryModel(self.operator, self.halo, self.n_observations, a,
                            {**self.info, "certified": {"factor": names["certified_factor"], **(evidence or {})}},
                            environment=self.environment)
        if hasattr(self, "ml2"):
            model.ml2 = self.ml2
        return model

    def calibrated(self, residuals=(), latent_var=(), noise_var=()) -> "MemoryModel":
        """This ML-II model (latent scale 1) with its latent scale ``lambda`` integrated out
        (module docstring, *The latent scale*): the posterior of ``lambda`` from a weak prior,
        the fit's own restricted likelihood in ``lambda`` and the prequential residuals
        (:meth:`prequential_terms` of each profile under the ML-II fit before it ran), summarised
        as ``(s^2, nu_lambda)`` (``explorer.stats.scale_posterior``); the returned model's
        outputscale and nugget are ``s^2`` times ML-II's, its posterior recomputed with them,
        its predictive a Student-t with ``min(nu_lambda, nu_run)`` degrees of freedom."""
        outputscale, nugget = self._ml2
        if self._latent_scale != 1.0 or outputscale != self._outputscale:
            raise ValueError("calibrated() takes the ML-II model (latent scale 1), not a calibrated one")
        posterior = scale_posterior(residuals, latent_var, noise_var,
                                    log_likelihood=_restricted_log_likelihood_in_scale(self))
        a = dict(self._a)
        lam = posterior.scale
        names = dict(zip(_SCALAR_NAMES, a["scalars"].tolist()))
        names.update(outputscale=lam * outputscale, relative_nugget_var=lam * nugget, latent_scale=lam,
                     latent_dof=posterior.dof)
        a["scalars"] = np.array([names[name] for name in _SCALAR_NAMES])
        hyper = {"outputscale": lam * outputscale, "lengthscale": a["lengthscale"],
                 "amplitude_slope": self._amp_slope}
        a.update(_posterior_arrays(a["train_dims"], a["train_bytes"] / self._bytes_scale,
                                   _training_noise(a, lam * nugget), a, self._amp_floor, hyper))
        return MemoryModel(self.operator, self.halo, self.n_observations, a,
                           {**self.info, "latent_scale": posterior.describe()}, environment=self.environment)

    @property
    def warnings(self) -> list[str]:
        """What a plan made from this model must say of it: that the explore loop ended without
        meeting its stop rule (on its budget, or short of safe shapes), so its bound, certified
        by the evidence it has, is wider than the tolerance asked or barely tested."""
        if self.info.get("converged", True):
            return []
        why = str(self.info.get("stopped_because") or "the loop ended before its stop rule held").split(":")[0]
        return [f"{self.operator}'s model did not converge ({why}): its bound holds on the evidence it has but is "
                f"wider than asked; run `{paths.explore_command(self.operator)} --budget N` with a larger budget "
                "to tighten it"]

    @property
    def mean_determined(self) -> bool:
        """Whether the exact profiles alone determine every term of the mean (more profiles
        than terms) or a prior mean does (``MeanPrior``): a prediction before then is the
        vague prior's, not evidence about how this model's scale holds."""
        n_exact = int(np.sum(~self._a["train_is_lower_bound"]))
        has_prior = bool(np.any(self._a["basis_prior_mean"] != 0))
        return has_prior or n_exact > self._a["basis_transform"].shape[0]

    # ---- read-only views ----------------------------------------------------------
    @property
    def exceeded_shapes(self) -> np.ndarray:
        """Block shapes whose profile exceeded the cap (true peak >= ``exceeded_bytes``)."""
        return self._a["exceeded_dims"].astype(np.int64)

    @property
    def exceeded_bytes(self) -> np.ndarray:
        return self._a["exceeded_bytes"].copy()

    @property
    def train_shapes(self) -> np.ndarray:
        """Block shapes of the observations the posterior conditions on."""
        return self._a["train_dims"].astype(np.int64)

    @property
    def train_bytes(self) -> np.ndarray:
        return self._a["train_bytes"].copy()

    @property
    def train_is_lower_bound(self) -> np.ndarray:
        """True where a training observation is a lower bound (an exceeded profile)."""
        return self._a["train_is_lower_bound"].copy()

    @property
    def coefficients(self) -> dict[str, float]:
        """``beta_bar`` in physical units: bytes, bytes/voxel, bytes/face-sample, ..."""
        scale = self._a["axis_length"]
        per_unit = np.prod(scale[None, :] ** BASIS_EXPONENTS, axis=1)
        # each of the eight monomials' own coefficient: a tied one is shared by its orbit
        beta_raw = self._a["basis_map"] @ (self._a["basis_transform"] @ self._a["beta"]) * self._bytes_scale
        return {name: float(b / u) for name, b, u in zip(BASIS_NAMES, beta_raw, per_unit)}

    @property
    def hyperparameters(self) -> dict[str, object]:
        return {
            "lengthscale": self._a["lengthscale"].tolist(),
            "relative_residual_sd": math.sqrt(self._outputscale),
            "relative_nugget_sd": math.sqrt(self._rel_nugget_var),
            "relative_run_sd": math.sqrt(self._rel_run_var),
            "run_noise_dof": self._noise_dof,
            "latent_scale": self._latent_scale,
            "latent_dof": self._latent_dof,
            "predictive_dof": self._predictive_dof,
            "certified_factor": self._certified_factor,
            "abs_noise_sd_bytes": math.sqrt(self._abs_noise_var) * self._bytes_scale,
        }

    def __repr__(self) -> str:
        return f"<MemoryModel {self.operator} n={self.n_observations} halo={self.halo}>"

    # ---- persistence --------------------------------------------------------------
    def stale_reasons(self) -> list[str]:
        """How this process's environment differs from the one the profiles were measured
        in (``explorer.core.environment.stamp_differences``); empty when they agree."""
        from explorer.core.environment import ISOLATED_KEYS, environment_stamp, stamp_differences

        return stamp_differences(self.environment, environment_stamp(self.operator), ISOLATED_KEYS)

    def save(self, path) -> Path:
        """Write one ``.npz`` (no pickles): the arrays plus a JSON metadata string.

        The metadata carries the environment stamp (``explorer.core.environment``) of the
        process that saves it, which is the one that profiled: ``load_model`` compares it.
        """
        from explorer.core.environment import environment_stamp

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.environment is None:
            self.environment = environment_stamp(self.operator)
        meta = {
            "format_version": FORMAT_VERSION,
            "operator": self.operator,
            "halo": list(self.halo),
            "n_observations": self.n_observations,
            "info": self.info,
            "environment": self.environment,
        }
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.npz")  # this process's own
        np.savez(tmp, meta=np.array(json.dumps(meta)), **self._a)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path) -> "MemoryModel":
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"][()]))
            if meta.get("format_version") not in READABLE_FORMATS:
                raise ValueError(f"{path}: model format {meta.get('format_version')} is not one of {READABLE_FORMATS}")
            arrays = {name: data[name] for name in _ARRAY_FIELDS if name in data}
        return cls(meta["operator"], meta["halo"], meta["n_observations"], arrays, meta["info"],
                   environment=meta.get("environment"))


_CACHE: dict[tuple[str, int], MemoryModel] = {}


def load_model(operator: str, runs_dir=None) -> MemoryModel:
    """The saved model of ``operator`` (``explorer.core.paths.model_path``), cached by (path, mtime).

    A pipeline (``operators.pipeline``) without a model of its own gets one composed from
    its members' models (``explorer.composed``).  Raises ``ModelNotFoundError`` naming
    the command that creates it, and
    ``ModelFileError`` naming the file and the command that rebuilds it when the file is
    not a readable model.  A model learnt in another environment (library versions,
    operator code, machine: ``explorer.core.environment``) is returned with a
    ``StaleModelWarning`` on first load; ``model.stale`` keeps the differences.
    """
    from explorer.core import validate

    operator = validate.operator(operator)
    path = model_path(operator, runs_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        import operators
        from operators.pipeline import Pipeline

        op = operators.get(operator)
        if isinstance(op, Pipeline):  # without a model of its own: its members'
            from explorer.composed import compose

            return compose(op, runs_dir)
        where = path.parent.parent
        raise ModelNotFoundError(
            f"no explored model for {operator!r} in {where}/ — run: {paths.explore_command(operator)}") from None
    key = (str(path), mtime)
    model = _CACHE.get(key)
    if model is None:
        try:
            model = MemoryModel.load(path)
        except Exception as exc:  # truncated, not an npz, wrong layout: name the file and the fix
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ModelFileError(f"{path} is not a readable model ({reason[:160]}): "
                                 f"run `{paths.explore_command(operator)}` to rebuild it") from None
        from explorer.core.environment import warn_stale

        model.stale = model.stale_reasons()
        warn_stale(f"{operator}'s model ({path})", model.stale, f"explore {operator}")
        for old in [k for k in _CACHE if k[0] == key[0]]:
            del _CACHE[old]
        _CACHE[key] = model
    return model


# --------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------


def run_noise(y, single_run_var, n_repeats, *, rel_floor: float, abs_floor: float | None = None
              ) -> tuple[float, float, float]:
    """``(rho_run^2, a^2, nu)``: a single run's relative and absolute noise variances and the
    degrees of freedom of the repeats (see the module docstring), by maximum likelihood
    (``explorer.stats.fit_spread``, the weak prior of :data:`_RUN_NOISE_PRIOR`, ``rho_run >=
    rel_floor``, ``a >=`` the kernel's page).  ``single_run_var``: each point's single-run
    sample variance (``r v``); without repeat counts every ``s^2 > 0`` is one dof."""
    from explorer.stats import fit_spread, page_bytes

    single_run_var = np.asarray(single_run_var, dtype=np.float64)
    if n_repeats is None:
        dof = (single_run_var > 0).astype(np.float64)
    else:
        dof = np.maximum(np.asarray(n_repeats) - 1, 0).astype(np.float64)
    a, rho = fit_spread(y, single_run_var, dof, abs_floor=page_bytes() if abs_floor is None else abs_floor,
                        rel_floor=rel_floor, rel_prior=_RUN_NOISE_PRIOR)
    return rho * rho, a * a, _RUN_NOISE_PRIOR[1] + float(dof.sum())


def fit(operator: str, shapes, peak_bytes, noise_var, lower_bound, *, halo=(0, 0, 0), n_repeats=None,
        block_multiple=None, axis_classes=None, prior: MeanPrior | None = None,
        rel_noise_floor: float | None = None, abs_noise_floor_bytes: float | None = None,
        prequential: "Prequential | None" = None) -> MemoryModel:
    """Fit the surrogate of ``operator`` to its profiles (see the module docstring).

    The ML-II fit, then its latent scale integrated out (:meth:`MemoryModel.calibrated`) on the
    fit's own evidence and ``prequential``'s (residuals of profiles predicted before they ran:
    :class:`Prequential`), then the lower bounds as censored observations.  The returned
    model's ``ml2`` is the ML-II fit (latent scale 1, exact profiles only), what
    :func:`recalibrate` starts from.

    Args:
        shapes: ``(n, 3)`` block shapes that were profiled.
        peak_bytes: ``(n,)`` recorded peaks (the mean of the repeats if there were several).
        noise_var: ``(n,)`` variance of each recorded value, bytes^2: for a mean of
            ``r`` runs with sample variance ``s^2``, ``s^2 / r`` (0 or NaN for a single
            run: a floor applies).
        lower_bound: ``(n,)`` True where the profile exceeded the cap, so the truth
            is ``>= peak_bytes``.
        halo: the operator's halo, kept on the model for ``explorer.chunking``.
        block_multiple: the multiples the operator pads its blocks to (the features then
            use :func:`effective_dims`); by default the registered operator's
            ``block_multiple``, 1 for a name the registry does not know.
        axis_classes: which axes the operator treats alike (:func:`basis_map`); by default
            the registered operator's ``axis_classes``, every axis its own for a name the
            registry does not know.
        n_repeats: ``(n,)`` runs averaged in ``peak_bytes``.  Pass it: it turns
            ``noise_var`` back into single-run variances for the pooled noise level
            and gives each point ``r - 1`` degrees of freedom.  Without it every
            value counts as one run and each nonzero ``noise_var`` as one degree of
            freedom (the single-run noise is then underestimated by up to ``r``,
            which the noise prior dampens).
        rel_noise_floor, abs_noise_floor_bytes: the floors of the single-run noise
            ``sd = sqrt((rho y)^2 + a^2)``, whose ``rho`` and ``a`` are learnt from the repeats
            (:func:`run_noise`); None: :data:`DEFAULT_REL_NOISE_FLOOR` and the kernel's page.
        prior: what another model says of the peak (:class:`MeanPrior`): the mean basis
            then has the informative prior ``N(b_0, B)`` instead of the flat / vague one,
            and one exact profile is enough to fit.
    """
    started = time.perf_counter()
    dims = _as_dims(shapes)
    y = np.asarray(peak_bytes, dtype=np.float64).reshape(-1)
    v = np.nan_to_num(np.asarray(noise_var, dtype=np.float64).reshape(-1), nan=0.0)
    lb = np.asarray(lower_bound, dtype=bool).reshape(-1)
    n = dims.shape[0]
    if not (y.shape[0] == v.shape[0] == lb.shape[0] == n):
        raise ValueError("shapes, peak_bytes, noise_var and lower_bound must have the same length")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("peak_bytes must be positive and finite")
    v = np.maximum(v, 0.0)
    reps = None if n_repeats is None else np.maximum(np.asarray(n_repeats, dtype=np.int64).reshape(-1), 1)
    if reps is not None and reps.shape[0] != n:
        raise ValueError("n_repeats must have one entry per shape")
    multiple = np.asarray(_declared(operator, "block_multiple", (1, 1, 1)) if block_multiple is None else block_multiple,
                          dtype=np.float64)
    if multiple.shape != (3,) or np.any(multiple < 1):
        raise ValueError(f"block_multiple must be 3 positive ints, got {block_multiple}")
    classes = tuple(int(c) for c in (_declared(operator, "axis_classes", (0, 1, 2)) if axis_classes is None
                                     else axis_classes))
    exact = ~lb
    if not exact.any():
        raise ValueError(f"{operator}: every profile exceeded the cap; need at least one exact profile")

    r_eff = np.ones(n) if reps is None else reps.astype(np.float64)
    rel_run_var, abs_var, noise_dof = run_noise(y[exact], r_eff[exact] * v[exact], None if reps is None else reps[exact],
                                                rel_floor=DEFAULT_REL_NOISE_FLOOR if rel_noise_floor is None
                                                else rel_noise_floor, abs_floor=abs_noise_floor_bytes)
    # Fixed part of each observation's noise variance (the nugget is added in the fit).
    fixed_var = np.maximum(v, (rel_run_var * y * y + abs_var) / r_eff)

    def fit_on(mask_obs, as_lower_bound):
        return _fit_posterior(dims[mask_obs], y[mask_obs], fixed_var[mask_obs], as_lower_bound, multiple=multiple,
                              rel_run_var=rel_run_var, abs_var=abs_var, noise_dof=noise_dof, prior=prior,
                              classes=classes)

    exceeded = {"exceeded_dims": dims[lb], "exceeded_bytes": y[lb]}
    arrays, fit_info = fit_on(exact, np.zeros(int(exact.sum()), dtype=bool))
    info = {
        **fit_info,
        "n_exact": int(exact.sum()),
        "n_lower_bounds": int(lb.sum()),
        "fit_seconds": time.perf_counter() - started,
        **({"prior": prior.source} if prior is not None else {}),
    }
    return recalibrate(MemoryModel(operator, halo, n, {**arrays, **exceeded}, info), prequential)


@dataclass(frozen=True)
class Prequential:
    """Profiles each predicted by a fit that had not seen it (``MemoryModel.prequential_terms``
    of the ML-II fit before it ran): residuals ``e`` (bytes), latent variances ``c`` and run
    noise variances ``s`` (bytes^2), the data of the latent scale (``explorer.stats.scale_posterior``)."""

    residuals: tuple[float, ...] = ()
    latent_var: tuple[float, ...] = ()
    noise_var: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.residuals)


def recalibrate(model: MemoryModel, prequential: Prequential | None = None) -> MemoryModel:
    """``model``'s ML-II fit (``model.ml2``, or ``model`` itself when it is one) with its latent
    scale integrated out on ``prequential`` too, then its lower bounds as censored observations."""
    ml2 = getattr(model, "ml2", model)
    p = prequential or Prequential()
    calibrated = ml2.calibrated(p.residuals, p.latent_var, p.noise_var)
    calibrated, n_sites = _with_censored(calibrated, ml2.exceeded_shapes, ml2.exceeded_bytes)
    calibrated.info["n_lower_bounds_used"] = n_sites
    calibrated.ml2 = ml2
    return calibrated


def _with_censored(model: MemoryModel, dims, lower_bytes) -> tuple[MemoryModel, int]:
    r"""``model`` conditioned on censored runs ``y_run >= L`` by assumed-density filtering.

    For each lower bound in turn, the current predictive of the latent peak at its shape
    is the cavity ``N(m, v)`` (scaled); the run's noise ``sigma^2`` makes the likelihood
    ``P(y_run >= L | g) = Phi((g - L) / sigma)``.  The exact posterior of ``g`` is then
    a probit-tilted normal with, for ``z = (m - L) / sqrt(v + sigma^2)`` and
    ``r = phi(z) / Phi(z)``,

    .. math::

        m' = m + \frac{v\, r}{\sqrt{v + \sigma^2}}, \qquad
        v' = v - \frac{v^2\, r\,(z + r)}{v + \sigma^2}

    and the Gaussian site with those moments, ``tau^2 = v v' / (v - v')`` and
    ``mu = tau^2 (m' / v' - m / v)``, joins the data as an observation of ``g``
    (Minka 2001; the censored-GP likelihood, one sweep).  A bound far below the
    prediction gives ``v' = v``: no site, no information, exactly as it should.
    Hyperparameters and scale stay those of the exact profiles.  Returns the model and
    the number of sites added.
    """
    from scipy.special import log_ndtr

    n_sites = 0
    scale = model._bytes_scale
    for shape, bound in zip(np.asarray(dims).reshape(-1, 3), np.asarray(lower_bytes).reshape(-1)):
        m, v = (float(x[0]) for x in model._latent(shape[None, :].astype(np.float64)))
        noise = float(model._run_noise_var(np.array([m]))[0])
        sd = math.sqrt(v + noise)
        z = (m - bound / scale) / sd
        ratio = math.exp(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - float(log_ndtr(z)))
        m_new = m + v * ratio / sd
        v_new = v - v * v * ratio * (z + ratio) / (sd * sd)
        if not v_new < v * (1 - 1e-9) or v_new <= 0:
            continue
        tau2 = v * v_new / (v - v_new)
        mu = tau2 * (m_new / v_new - m / v)
        model = model.with_observations(shape[None, :], [mu * scale], [tau2 * scale**2], lower_bound=True)
        n_sites += 1
    return model, n_sites


def _mean_prior_rows(basis: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""The prior ``beta ~ N(b_0, B)`` from another model's ``mean`` and ``sd`` at ``m`` design
    blocks (``basis``: their ``(m, p)`` raw basis rows; working units): ``(R, b_0)`` with
    ``B^{-1} = R^T R``.

    ``b_0`` is the weighted least-squares projection of ``mean`` on the basis (weights
    ``1 / sd^2``), and ``e = mean - basis @ b_0`` what the basis cannot express of it.  With
    ``v_i = sd_i^2 + e_i^2``, ``D = diag(1 / v)`` and the leverages
    ``l_i = h_i^T (H_d^T D H_d)^{-1} h_i / v_i``,

    .. math::

        B = \frac{1}{\min_i l_i} \big(H_d^\top D H_d\big)^{-1}, \qquad
        \text{so that}\quad h_i^\top B h_i \ge v_i \text{ at every design block}

    (equality at the least-leveraged one): the prior never claims more of ``h^T beta`` than
    the other model's own predictive variance plus its misfit, anywhere on the design.  The
    ``m`` design means are *one* belief, not ``m`` independent observations (their errors are
    shared), so ``B`` is not shrunk by ``m``.  Scaling ``B`` to match ``v`` only on average
    over the design (``m / p`` in place of ``1 / min l``) claimed more than the prior model
    at its low-leverage blocks, and covered 97.1% of a truth the prior had 2% too high
    (``tests/test_stopping.py``); this rule covers 99.6%.
    """
    m, p = basis.shape
    if m < p:
        raise ValueError(f"a mean prior needs at least {p} design blocks, got {m}")
    w = 1.0 / np.maximum(sd, 1e-12 * np.abs(mean).max())
    b0, *_ = np.linalg.lstsq(basis * w[:, None], mean * w, rcond=None)
    misfit = mean - basis @ b0
    rows = basis / np.sqrt(sd * sd + misfit * misfit)[:, None]
    q, _ = np.linalg.qr(rows)
    leverage = (q * q).sum(1)
    return rows * math.sqrt(float(leverage.min())), b0


def _declared(operator: str, attribute: str, default):
    """The registered operator's ``attribute`` (``block_multiple``, ``axis_classes``), or
    ``default`` for a name the registry does not know (it claims nothing)."""
    import operators

    try:
        return getattr(operators.get(operator), attribute)
    except KeyError:
        return default


def _fit_posterior(dims, y, fixed_var, is_lower_bound, *, rel_run_var, abs_var, noise_dof, multiple, prior=None,
                   classes=(0, 1, 2)):
    """ML-II hyperparameters (torch) and the exported NumPy posterior of one data set."""
    from scipy.optimize import nnls

    n = dims.shape[0]
    multiple = np.asarray(multiple, dtype=np.float64)
    log_dims = np.log(effective_dims(dims, multiple))
    axis_length = class_lengths(log_dims, classes)
    mapping = basis_map(classes)
    bytes_scale = float(y.max())
    y_s = y / bytes_scale
    raw = _raw_basis(dims, axis_length, multiple, mapping)
    p = raw.shape[1]
    if prior is None:
        envelope_rows, envelope_values = raw, y_s
    else:
        prior_raw = _raw_basis(_as_dims(prior.shapes), axis_length, multiple, mapping)
        prior_mean_s = np.asarray(prior.mean_bytes, dtype=np.float64) / bytes_scale
        envelope_rows, envelope_values = np.vstack([raw, prior_raw]), np.concatenate([y_s, prior_mean_s])
    # Amplitude envelope: relative NNLS, s(x) = raw_basis(x) @ gamma > 0 (on the prior's means too).
    gamma, _ = nnls(envelope_rows / envelope_values[:, None], np.ones(len(envelope_values)))
    if not np.any(gamma > 0):
        gamma = np.zeros(p)
        gamma[0] = float(np.exp(np.log(y_s).mean()))
    amp_floor = 1e-3 * float(y_s.min())
    if prior is None:
        # Prior precision of beta (raw basis): flat on [1, V]; N(0, (tau s_c)^2) on faces, edges.
        # s_c = s(centre) = sum(gamma) since every raw term is 1 at u = (1, 1, 1).
        prior_sd = _FACE_EDGE_PRIOR_RELATIVE_SD * float(gamma.sum())
        prior_rows = np.diag([0.0 if j in FLAT_TERMS else 1.0 / prior_sd for j in range(p)])
        prior_mean_raw = np.zeros(p)
        n_flat = len(FLAT_TERMS)
    else:
        prior_rows, prior_mean_raw = _mean_prior_rows(prior_raw, prior_mean_s,
                                                      np.asarray(prior.sd_bytes, dtype=np.float64) / bytes_scale)
        n_flat = 0
    prior_precision_raw = prior_rows.T @ prior_rows
    # Re-parametrise so the design (rows weighted ~ 1 / noise sd) stacked on the prior
    # pseudo-rows is orthonormal: then A is close to the identity.
    weights = 1.0 / (math.sqrt(rel_run_var) * y_s)
    stacked = np.vstack([raw * weights[:, None], prior_rows])
    _, r_factor = np.linalg.qr(stacked)
    if np.min(np.abs(np.diag(r_factor))) < 1e-10 * np.max(np.abs(np.diag(r_factor))):
        raise ValueError("the exact profiles do not determine a constant and a per-voxel term: "
                         "need at least two exact profiles of different volumes")
    transform = np.linalg.inv(r_factor)
    prior_precision = transform.T @ prior_precision_raw @ transform
    prior_mean = r_factor @ prior_mean_raw  # b_0 in the transformed basis: raw @ b_raw = (raw @ T) @ (T^-1 b_raw)
    offset_s = raw @ prior_mean_raw
    log_kernel_dims = canonical_dims(log_dims, alike_groups(classes))  # log is monotone: sorted logs
    log_lo = log_kernel_dims.min(0)
    log_span = np.maximum(log_kernel_dims.max(0) - log_lo, math.log(2.0))
    scalars = {
        "bytes_scale": bytes_scale,
        "relative_run_var": rel_run_var,
        "abs_noise_var": abs_var / bytes_scale**2,
        "amplitude_floor": amp_floor,
        "noise_dof": noise_dof,
    }
    fixed_s = fixed_var / bytes_scale**2
    features = {
        "axis_length": axis_length,
        "block_multiple": multiple,
        "basis_map": mapping,
        "axis_classes": np.asarray(classes, dtype=np.int64),
        "basis_transform": transform,
        "basis_prior_precision": prior_precision,
        "basis_prior_mean": prior_mean,
        "amplitude_coef": gamma,
        "log_lo": log_lo,
        "log_span": log_span,
    }
    # ML-II on the departure from the prior mean (b_0 = 0 without a prior): the same likelihood
    hyper, reml = _fit_hyperparameters(effective_dims(dims, multiple), y_s - offset_s, fixed_s, features, amp_floor,
                                       y_ref=y_s)
    total_var_s = fixed_s + hyper["relative_nugget_var"] * y_s * y_s
    posterior = _posterior_arrays(dims, y_s, total_var_s, features, amp_floor, hyper)
    # ML-II's own: latent scale 1 (``MemoryModel.calibrated`` integrates it out)
    scalars.update(outputscale=hyper["outputscale"], relative_nugget_var=hyper["relative_nugget_var"],
                   amplitude_slope=hyper["amplitude_slope"], latent_scale=1.0, latent_dof=MAX_DOF,
                   ml2_outputscale=hyper["outputscale"], ml2_relative_nugget_var=hyper["relative_nugget_var"],
                   certified_factor=1.0)
    arrays = {
        "train_dims": dims,
        "train_bytes": y,
        "train_noise_var": fixed_var,
        "train_is_lower_bound": np.asarray(is_lower_bound, dtype=bool),
        **features,
        "lengthscale": hyper["lengthscale"],
        "scalars": np.array([scalars[name] for name in _SCALAR_NAMES]),
        **posterior,
    }
    return arrays, {"restricted_log_likelihood": reml}


def _training_noise(arrays, relative_nugget_var) -> np.ndarray:
    """The diagonal of ``K_y`` beyond the kernel (working units): each observation's run noise
    (``train_noise_var``) and, for an exact one, the nugget's misfit ``rho_nug^2 y^2``."""
    scale = float(arrays["scalars"][_SCALAR_NAMES.index("bytes_scale")])
    y_s = arrays["train_bytes"] / scale
    exact = ~np.asarray(arrays["train_is_lower_bound"], dtype=bool)
    return arrays["train_noise_var"] / scale**2 + relative_nugget_var * y_s * y_s * exact


def _restricted_log_likelihood_in_scale(model: "MemoryModel") -> np.ndarray:
    """:func:`restricted_log_likelihood_in_scale` of an ML-II model's exact profiles: ``K_f`` its
    kernel matrix, ``N`` their nugget, ``D`` their measured run noise, ``y - H b_0``."""
    a = model._a
    exact = ~a["train_is_lower_bound"]
    dims = a["train_dims"][exact]
    y_s = a["train_bytes"][exact] / model._bytes_scale
    outputscale, nugget = model._ml2
    z = model._z(dims)
    amp = model._amplitude(dims)
    latent = outputscale * amp[:, None] * _matern52(z, z, a["lengthscale"]) * amp[None, :] + np.diag(nugget * y_s**2)
    h = model._basis(dims)
    return restricted_log_likelihood_in_scale(latent, a["train_noise_var"][exact] / model._bytes_scale**2, h,
                                              y_s - h @ a["basis_prior_mean"], a["basis_prior_precision"])


def restricted_log_likelihood_in_scale(latent, noise, basis, y, prior_precision) -> np.ndarray:
    r"""A fit's restricted log-likelihood as a function of the latent scale ``lambda``, on
    ``explorer.stats.LOG_SCALE_GRID`` (up to a constant):

    .. math::

        \ell(\lambda) = -\tfrac12 y^\top K^{-1} y + \tfrac12 b^\top A^{-1} b
                        - \tfrac12 \log|K| - \tfrac12 \log|A|, \qquad
        K = \lambda L + D,\; A = H^\top K^{-1} H + B^{-1},\; b = H^\top K^{-1} y

    ``latent``: ``L`` (``(n, n)``, the kernel matrix plus the nugget's misfit at ``lambda = 1``);
    ``noise``: the diagonal ``D`` (the run noise the repeats measured, not scaled); ``basis``:
    ``H`` (``(n, p)``); ``y``: the data less the prior mean; ``prior_precision``: ``B^{-1}``
    (zero on flat terms).  This is the evidence the profiles themselves give about ``lambda``,
    the mean's coefficients integrated out: the ``log|A|`` term is what leaves ``n - p_eff``
    degrees of freedom to the scale (with ``D`` negligible and ``p`` flat terms, exactly the
    scaled inverse chi-square's ``n - p``).  With ``D^{-1/2} L D^{-1/2} = U diag(d) U^T``, every
    ``lambda`` costs ``O(n p^2)``.
    """
    from explorer.stats import LOG_SCALE_GRID

    root = 1.0 / np.sqrt(np.asarray(noise, dtype=np.float64))
    eig, u = np.linalg.eigh(root[:, None] * latent * root[None, :])
    eig = np.maximum(eig, 0.0)
    y_t = u.T @ (root * y)
    h_t = u.T @ (root[:, None] * basis)
    lam = np.exp(LOG_SCALE_GRID)
    w = 1.0 / (lam[:, None] * eig[None, :] + 1.0)  # the eigenvalues of (lambda L~ + I)^-1, (grid, n)
    a_mat = np.einsum("gi,ip,iq->gpq", w, h_t, h_t) + np.asarray(prior_precision)[None, :, :]
    b = np.einsum("gi,ip->gp", w * y_t[None, :], h_t)
    chol = np.linalg.cholesky(a_mat)
    c = np.linalg.solve(chol, b[:, :, None])[:, :, 0]
    return (-0.5 * (w * y_t * y_t).sum(1) + 0.5 * (c * c).sum(1) + 0.5 * np.log(w).sum(1)
            - np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(1))


def _posterior_arrays(dims, y_s, noise_var_s, features, amp_floor, hyper):
    """``L^{-1}``, ``alpha``, ``beta_bar = A^{-1} (H K_y^{-1} y + B^{-1} b_0)``, ``W = L^{-1} H^T``,
    ``L_A^{-1}`` (NumPy, float64)."""
    raw = _raw_basis(dims, features["axis_length"], features["block_multiple"], features["basis_map"])
    h = raw @ features["basis_transform"]
    amp = _amplitude(raw, features["amplitude_coef"], amp_floor, hyper["amplitude_slope"])
    z = _kernel_inputs(dims, features["log_lo"], features["log_span"], features["block_multiple"],
                       alike_groups(features["axis_classes"]))
    k = hyper["outputscale"] * amp[:, None] * _matern52(z, z, hyper["lengthscale"]) * amp[None, :]
    k_y = k + np.diag(noise_var_s)
    chol = np.linalg.cholesky(k_y)
    chol_inv = np.linalg.inv(chol)
    w = chol_inv @ h  # (n, p)
    a = w.T @ w + features["basis_prior_precision"]
    chol_a = np.linalg.cholesky(a)
    chol_a_inv = np.linalg.inv(chol_a)
    wy = chol_inv @ y_s
    prior_term = features["basis_prior_precision"] @ features["basis_prior_mean"]  # B^{-1} b_0
    beta = chol_a_inv.T @ (chol_a_inv @ (w.T @ wy + prior_term))
    alpha = chol_inv.T @ (chol_inv @ (y_s - h @ beta))
    return {"chol_inv": chol_inv, "alpha": alpha, "beta": beta, "whitened_basis": w, "chol_a_inv": chol_a_inv}


# ---- torch / gpytorch part (imported lazily) -------------------------------------------


def warm_up() -> None:
    """Import torch, GPyTorch and BoTorch now (seconds), e.g. in a thread while profiles run."""
    _torch_modules()
    import botorch.fit  # noqa: F401


def _torch_modules():
    """The GPyTorch side of the surrogate (:mod:`explorer.gp_torch`), imported on first use
    (Python's import lock makes a concurrent ``warm_up`` safe)."""
    import importlib

    return importlib.import_module("explorer.gp_torch")


#: Starting points of the ML-II optimisation (lengthscale, relative residual sd, nugget sd).
_STARTS = ((0.5, 0.005, 0.001), (2.0, 0.03, 0.001))


def _fit_hyperparameters(dims, y_s, fixed_var_s, features, amp_floor, *, y_ref=None, optimizer_options=None):
    """Maximise the restricted marginal likelihood (+ priors) with ``fit_gpytorch_mll``.

    ``y_s``: the targets (the peaks less the prior mean ``H b_0``); ``y_ref``: the peaks the
    relative nugget scales with (``y_s`` by default).  Runs from each of ``_STARTS`` and keeps
    the one of highest value; returns ``(hyperparameters, value)``.  ``optimizer_options``:
    SciPy L-BFGS-B options (default SciPy's).
    """
    t = _torch_modules()
    torch = t.torch
    x = torch.as_tensor(dims, dtype=torch.float64)
    y = torch.as_tensor(y_s, dtype=torch.float64)
    y_ref = y if y_ref is None else torch.as_tensor(y_ref, dtype=torch.float64)
    fixed = torch.as_tensor(fixed_var_s, dtype=torch.float64)
    best = None
    failures = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    try:
        for start in _STARTS:
            fitted = _fit_from_start(t, x, y, y_ref, fixed, features, amp_floor, *start,
                                     optimizer_options=optimizer_options)
            if isinstance(fitted, str):
                failures.append(fitted)
            elif best is None or fitted[0] > best[0]:
                best = fitted
    finally:
        torch.set_num_threads(threads)
    if best is None:
        raise RuntimeError(f"fitting the surrogate's hyperparameters failed from every start "
                           f"({len(y_s)} profiles): " + "; ".join(failures))
    return best[1], best[0]


def _start_mll(t, x, y, y_ref, fixed, features, amp_floor, lengthscale, residual_sd, nugget_sd):
    """The restricted marginal likelihood of the surrogate at one of :data:`_STARTS`."""
    torch = t.torch
    likelihood = t.RelativeNuggetLikelihood(fixed, y_ref)
    gp = t.ExplicitBasisGP(x, y, likelihood, t.FeatureMap(features, amp_floor))
    gp.covar_module.scaled.base_kernel.lengthscale = torch.full((1, 3), lengthscale, dtype=torch.float64)
    gp.covar_module.scaled.outputscale = torch.tensor(residual_sd**2, dtype=torch.float64)
    likelihood.noise_covar._set_nugget(nugget_sd**2)
    return t.RestrictedMarginalLogLikelihood(likelihood, gp)


def _fit_from_start(t, x, y, y_ref, fixed, features, amp_floor, lengthscale, residual_sd, nugget_sd, *,
                    optimizer_options=None):
    """One ML-II run: ``(restricted log-likelihood + log priors, hyperparameters)``, or why it failed.

    Where L-BFGS-B stopped is kept even when SciPy flags the stop (an abnormal line search
    ends at a point no worse than the start): BoTorch's default would discard it and, with
    one attempt, the whole start; the caller compares the starts by their value instead.
    """
    import warnings

    from botorch.fit import fit_gpytorch_mll

    torch = t.torch
    mll = _start_mll(t, x, y, y_ref, fixed, features, amp_floor, lengthscale, residual_sd, nugget_sd)
    gp, likelihood = mll.model, mll.likelihood
    optimizer_kwargs = None if optimizer_options is None else {"options": dict(optimizer_options)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_gpytorch_mll(mll, max_attempts=1, warning_handler=lambda w: True,
                             optimizer_kwargs=optimizer_kwargs)
        with torch.no_grad():
            value = float(mll.restricted_log_likelihood()) * y.shape[0]
    except Exception as e:  # e.g. not PSD at every point tried: the caller tries the next start
        return f"start {(lengthscale, residual_sd, nugget_sd)}: {type(e).__name__}: {e}".splitlines()[0]
    if not math.isfinite(value):
        return f"start {(lengthscale, residual_sd, nugget_sd)}: restricted log-likelihood {value}"
    scaled = gp.covar_module.scaled
    return value, {
        "lengthscale": scaled.base_kernel.lengthscale.detach().reshape(-1).numpy().copy(),
        "outputscale": float(scaled.outputscale.detach()),
        "relative_nugget_var": float(likelihood.noise_covar.nugget.detach()),
        "amplitude_slope": float(gp.covar_module.slope.detach()),
    }


def _torch_posterior(model: MemoryModel, shapes):
    """The posterior of ``model`` recomputed by GPyTorch (for tests): mean (bytes), latent cov (bytes^2).

    Rebuilds an ``ExactGP`` from the exported training data and hyperparameters
    with the mean ``h(x)^T beta_bar`` and a ``FixedNoiseGaussianLikelihood``;
    GPyTorch's posterior variance (beta known) is then completed with the
    explicit-basis term ``R^T A^{-1} R`` computed in torch.
    """
    t = _torch_modules()
    torch, gpytorch = t.torch, t.gpytorch
    a = model._a
    scale = model._bytes_scale
    features = {name: a[name] for name in ("axis_length", "block_multiple", "basis_map", "axis_classes",
                                           "basis_transform",
                                           "basis_prior_precision", "amplitude_coef", "log_lo", "log_span")}
    feature_map = t.FeatureMap(features, model._amp_floor)
    x = torch.as_tensor(effective_dims(a["train_dims"], a["block_multiple"]), dtype=torch.float64)
    y = torch.as_tensor(a["train_bytes"] / scale, dtype=torch.float64)
    noise = torch.as_tensor(_training_noise(a, model._rel_nugget_var), dtype=torch.float64)
    with gpytorch.settings.min_fixed_noise(float_value=1e-30, double_value=1e-30, half_value=1e-30):
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise)
        gp = t.ExplicitBasisGP(x, y, likelihood, feature_map,
                                  beta=torch.as_tensor(a["beta"], dtype=torch.float64))
        gp.covar_module.scaled.base_kernel.lengthscale = torch.as_tensor(a["lengthscale"]).reshape(1, 3)
        gp.covar_module.scaled.outputscale = torch.tensor(model._outputscale, dtype=torch.float64)
        gp.covar_module.slope = torch.tensor(model._amp_slope, dtype=torch.float64)
        gp.eval()
        xs = torch.as_tensor(effective_dims(_as_dims(shapes), a["block_multiple"]), dtype=torch.float64)
        with torch.no_grad(), gpytorch.settings.fast_pred_var(False), gpytorch.settings.max_cholesky_size(10**6):
            post = gp(xs)
            mean = post.mean
            cov = post.covariance_matrix
            # Explicit-basis term: R = h_* - H K_y^{-1} k_*, cov += R^T A^{-1} R.
            k_y = gp.covar_module(x).to_dense() + torch.diag(noise)
            k_star = gp.covar_module(x, xs).to_dense()
            h = feature_map.basis(x)
            h_star = feature_map.basis(xs)
            r = h_star.T - h.T @ torch.linalg.solve(k_y, k_star)
            a_mat = h.T @ torch.linalg.solve(k_y, h) + feature_map.basis_prior_precision
            cov = cov + r.T @ torch.linalg.solve(a_mat, r)
    return mean.numpy() * scale, cov.numpy() * scale**2
