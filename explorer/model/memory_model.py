r"""The surrogate: an operator's ``peak_bytes`` as a function of the block shape.

What is modelled
----------------
``peak_bytes(n1, n2, n3)`` of ``operator.run(x)`` on a float32 block ``x`` of
exactly that shape (the definition lives in ``docs/definitions.md``).  The shape
is the *block the operator runs on*: a Dask task on a chunk ``c`` of an
operator with halo ``h`` runs on the chunk plus its halos (at most ``c + 2h``
per axis that is not whole), so the caller (``explorer.plan.chunk_plan``) asks about
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

*Regime boundaries* (``explorer.model.regimes``, where the peak jumps with the block's shape):
for each, the basis gets the constant and the volume once more times the block's side of it,
and the kernel below the side as one more input; a block in a gap between the profiles either
side gets the largest mean and variance of the sides it may be on (:meth:`MemoryModel._latent`).

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

*The latent scale, integrated out.*  ML-II's point estimate of ``sigma_f`` claims a
tightness nobody measured, so the latent part of every covariance (the kernel and the nugget,
not the measured run noise) is ``lambda`` times the ML-II fit's, and ``lambda`` is integrated
out on a grid from a weak prior, the fit's own restricted likelihood in ``lambda`` (the mean's
coefficients integrated out) and the residuals of the profiles predicted before they ran
(``explorer.model.stats.scale_posterior``, :meth:`MemoryModel.calibrated`; the math in
``docs/model.md``), summarised as a scaled inverse chi-square ``(nu_lambda, s^2)``, untruncated.

*Prediction of a new single run* (what ``predict`` bounds): a Student-t with
``nu = min(nu_lambda, nu_run)`` degrees of freedom, location ``mean_g`` and squared scale
``s^2 (var_g + rho_nug^2 mean^2) + rho_run^2 mean^2 + a^2``, times the certified factor
(:meth:`MemoryModel.certified`); ``upper = mean + t_nu(confidence) * scale``.
``latent_moments``, ``noise_var`` and ``posterior_cov`` return the scaled quantities;
``scores`` turns residuals into normal scores under this predictive.

The noise, the ML-II fit of the hyperparameters, an informative prior mean and lower
bounds: ``explorer.model.fit``.

*In a Dask worker* a task needs more than its isolated peak (the block it reads,
the copies of the store): ``explorer.plan.calibration`` models that
excess on top of this model.

Prediction is pure NumPy: ``fit`` exports the posterior (training inputs, the
inverse Cholesky factor of ``K_y``, ``alpha``, ``beta_bar``, ``A^{-1/2}``,
hyperparameters, scales) and ``MemoryModel`` never imports torch.  ``import
explorer.model.memory_model`` is torch-free; torch, gpytorch and botorch are imported
inside ``fit`` (``explorer.model.fit``, ``explorer.model.torch_fit``).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np

from explorer.core import paths
from explorer.core.atomic import atomic_path
from explorer.model.stats import normal_scores, scale_posterior
from explorer.model.basis import (
    BASIS_EXPONENTS,
    BASIS_NAMES,
    FLAT_TERMS,
    _amplitude,
    regime_description, regime_side,
    _as_dims,
    _bound_quantile,
    _kernel_inputs,
    _matern52,
    _matern52_scaled,
    _raw_basis,
    alike_groups,
)
from explorer.model.posterior import (
    _ARRAY_FIELDS,
    _with_regime,
    _SCALAR_NAMES,
    _posterior_arrays,
    _restricted_log_likelihood_in_scale,
    _training_noise,
)

__all__ = [
    "MemoryModel",
    "ModelFileError",
    "ModelNotFoundError",
]


#: Bumped when the saved layout changes.
FORMAT_VERSION = 5
#: Formats this code reads.  4 and older kept one scale for the latent peak and the run noise
#: alike, truncated at the fit's own: refit them.
READABLE_FORMATS = (FORMAT_VERSION,)


class ModelNotFoundError(LookupError):
    """No saved model for an operator: it has not been explored yet."""


class ModelFileError(ValueError):
    """A saved model file cannot be read (one line naming the file and the fix)."""


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
        arrays = _with_regime(arrays)
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
        #: The predictive's dof: the latent scale's or the run noise's, the smaller (Welch-Satterthwaite: never fewer).
        self._predictive_dof = float(min(self._latent_dof, self._noise_dof))
        mapping = self._a["basis_map"]
        self._map = None if mapping.shape[0] == mapping.shape[1] and np.allclose(mapping, np.eye(len(mapping))) \
            else mapping  # untied: skip the product on the hot path
        self._groups = alike_groups(self._a["axis_classes"])
        self._train_z = self._z(self._a["train_dims"])
        self._train_amp = self._amplitude(self._a["train_dims"])
        # The training side of the predictive's kernel (``_parts``), once.
        self._train_scaled_z = self._train_z / self._a["lengthscale"]
        self._train_scaled_z_squared = (self._train_scaled_z * self._train_scaled_z).sum(1)
        self._train_scale = self._outputscale * self._train_amp[:, None]

    # ---- feature map ------------------------------------------------------------
    def _z(self, dims, side=None):
        return _kernel_inputs(dims, self._a["log_lo"], self._a["log_span"], self._a["block_multiple"], self._groups,
                              self._a["regime"], side)

    def _raw_basis(self, dims, side=None):
        return _raw_basis(dims, self._a["axis_length"], self._a["block_multiple"], self._map, self._a["regime"], side)

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
    def _parts(self, dims, side=None):
        """Per-test-point pieces: mean, ``V = L^{-1} k_*``, ``Q = L_A^{-1} R_*``, z, amplitude
        (``side``: the blocks' side of the regime boundary, ``basis.regime_side``'s by default)."""
        z = self._z(dims, side)
        raw = self._raw_basis(dims, side)
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
        (both scaled by ``lambda``: module docstring).

        A block in the gap of a regime boundary (``basis.regime_side`` 0.5: the profiles do not
        say which side it is on) gets the largest mean and the largest variance of the sides it
        may be on, so that every upper quantile of its predictive is at or above each one's."""
        side = regime_side(dims, self._a["regime"], self._a["block_multiple"])  # once, for z and the basis
        mean, var = self._latent_at(dims, side)
        gap = side == 0.5
        rows = gap.any(axis=1)
        if rows.any():
            moments = [self._latent_at(dims[rows], np.where(gap[rows], sides, side[rows]))
                       for sides in itertools.product((0.0, 1.0), repeat=side.shape[1])]
            mean[rows], var[rows] = (np.max(np.array(x), axis=0) for x in zip(*moments))
        return mean, var

    def _latent_at(self, dims, side=None):
        """:meth:`_latent` of blocks on a given side of the regime boundary (``side``)."""
        mean, v, q, _z, amp = self._parts(dims, side)
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
        latent scale (the square of the Student-t's latent scale).  Isolated peak."""
        mean, var = self._latent(_as_dims(shapes))
        return mean * self._bytes_scale, var * self._bytes_scale**2

    def noise_var(self, shapes_or_mean, *, from_mean: bool = False) -> np.ndarray:
        """Variance (bytes^2) of one new profiling run about the latent peak: the run noise
        ``rho_run^2 m^2 + a^2`` with ``m`` the posterior mean at the shapes (or the given
        means in bytes when ``from_mean=True``)."""
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
        scale = np.sqrt(var + self._run_noise_var(mean)) * self._bytes_scale * self._certified_factor
        return mean * self._bytes_scale, scale, self._predictive_dof

    def predict_many(self, shapes, confidence: float = 0.99) -> tuple[np.ndarray, np.ndarray]:
        """Mean and one-sided upper bound (bytes) of the isolated peak of a new run.

        The predictive of a new run is a Student-t with ``nu`` degrees of freedom, location
        ``m = mean_g`` and squared scale ``v = var_g + sigma^2`` (``predictive_var``,
        :meth:`predictive_t`): ``upper = m + t_nu(confidence) sqrt(v)``.
        What a task needs inside a Dask worker on top is ``explorer.plan.task_model.TaskModel``'s.
        """
        t = _bound_quantile(float(confidence), self._predictive_dof) * self._certified_factor
        mean, var = self._latent(_as_dims(shapes))
        return mean * self._bytes_scale, (mean + t * np.sqrt(var + self._run_noise_var(mean))) * self._bytes_scale

    def scores(self, shapes, peak_bytes, n_repeats=1) -> np.ndarray:
        """Normal scores of observed values under this model's predictive (``explorer.model.stats``).

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
        the latent scale's posterior (``explorer.model.stats.scale_posterior``, :meth:`calibrated`)."""
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
        """This model with its predictive's scale multiplied by ``max(1, factor)``: the evidence's bound
        on how much the predictions understated their scale, moved to the quantile the risk split
        leaves the run (``explorer.search.acquisition.ScaleEvidence.certified_factor``).
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
        as ``(s^2, nu_lambda)`` (``explorer.model.stats.scale_posterior``); the returned model's
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
    def regime(self) -> str | None:
        """Its regime boundaries (``explorer.model.regimes``), e.g. ``"n1 n2 between 4826 and 5406"``, or None."""
        return regime_description(self._a["regime"])

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
        """``beta_bar`` in physical units: bytes, bytes/voxel, bytes/face-sample, ...; with regime
        boundaries, those below them and, as ``constant_above`` and ``volume_above`` (``_2``, ...
        for a second boundary), what the constant and the volume add above each."""
        scale = self._a["axis_length"]
        per_unit = np.prod(scale[None, :] ** BASIS_EXPONENTS, axis=1)
        mapping, tied = self._a["basis_map"], self._a["basis_transform"] @ self._a["beta"] * self._bytes_scale
        beta_raw = mapping @ tied[:mapping.shape[1]]  # each monomial's own: a tied one is shared by its orbit
        out = {name: float(b / u) for name, b, u in zip(BASIS_NAMES, beta_raw, per_unit)}
        for j, b in enumerate(tied[mapping.shape[1]:]):
            suffix = "" if j < 2 else f"_{j // 2 + 1}"
            out[("constant_above", "volume_above")[j % 2] + suffix] = float(b / per_unit[FLAT_TERMS[j % 2]])
        return out

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
    def stale_reasons(self, current: dict | None = None) -> list[str]:
        """How ``current`` (an environment stamp; default this process's) differs from the one
        the profiles were measured in (``explorer.core.environment.stamp_differences``); empty
        when they agree."""
        from explorer.core.environment import ISOLATED_KEYS, environment_stamp, stamp_differences

        return stamp_differences(self.environment, current or environment_stamp(self.operator), ISOLATED_KEYS)

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
        with atomic_path(path) as tmp:
            np.savez(tmp, meta=np.array(json.dumps(meta)), **self._a)
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
