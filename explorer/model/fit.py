r"""Fitting the model (``explorer.model.memory_model`` states it): the run noise, the posterior
of the mean and the residual given the hyperparameters (NumPy), censored profiles,
recalibration; the hyperparameters themselves by ML-II in ``explorer.model.torch_fit``
(torch imported on first use).

*Noise* (bytes^2).  A single profiling run at a shape whose peak is ``y`` has
variance ``rho_run^2 y^2 + a^2``: ``a`` an absolute term for the allocator's granularity
(repeats differ by whole quanta whatever the block: 68 KiB on one machine here, 184-196 KiB
on another, so it is learnt, never a constant) and ``rho_run`` a relative one.  Both are
learnt from the repeats by maximum likelihood (``explorer.model.stats.fit_spread``), ``rho_run``
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

*An informative prior mean* (:class:`MeanPrior`).  When another model already predicts the
peak (a pipeline's model composed from its members', ``explorer.model.composed``), its means and
standard deviations over the target region become the prior ``beta ~ N(b_0, B)`` of every
basis term (:func:`_mean_prior_rows`: ``b_0`` their projection on the basis, ``B`` their
variance), in place of the flat / vague prior.  The posterior is the one above with
``beta_bar = A^{-1} (H K_y^{-1} y + B^{-1} b_0)``, ML-II is fitted on ``y - H^T b_0``, and
with no flat direction left ``nu = nu_0 + n``.  The loop then learns only what the profiles
say differs from the prior: with the composed model near the truth, a handful of profiles
make the bound tight.

*Lower bounds* (profiles that exceeded the memory cap: the true peak of that run is at
least the recorded value ``L``) are censored observations, never dropped and never
taken as exact.  The model is fitted on the exact profiles; then each lower bound
enters through its proper likelihood ``P(y_run >= L | g) = Phi((g - L) / sigma)``,
approximated by assumed-density filtering (``_with_censored``): a bound above the
prediction pulls the mean up and narrows the variance only as far as the truncation
warrants, a bound the exact data already clear adds nothing.  The shapes and values
of all lower bounds are kept on the model (``exceeded_shapes``, ``exceeded_bytes``)
for the acquisition's safety filter.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from explorer.core.blas import with_one_blas_thread
from explorer.model.stats import MAX_DOF
from explorer.model.basis import (
    FLAT_TERMS,
    NO_REGIME,
    _as_dims,
    _raw_basis,
    alike_groups,
    basis_map,
    canonical_dims,
    class_lengths,
    effective_dims,
    regime_description,
    regime_rows,
)
from explorer.model.memory_model import MemoryModel
from explorer.model.posterior import _SCALAR_NAMES, _posterior_arrays
from explorer.model import priors, regimes, torch_fit

if TYPE_CHECKING:
    from explorer.model.priors import MeanPrior

__all__ = [
    "fit",
]


# --------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------


def run_noise(y, single_run_var, n_repeats, *, rel_floor: float, abs_floor: float | None = None
              ) -> tuple[float, float, float]:
    """``(rho_run^2, a^2, nu)``: a single run's relative and absolute noise variances and the
    degrees of freedom of the repeats (see the module docstring), by maximum likelihood
    (``explorer.model.stats.fit_spread``, the weak prior ``priors._RUN_NOISE_PRIOR``, ``rho_run >=
    rel_floor``, ``a >=`` the kernel's page).  ``single_run_var``: each point's single-run
    sample variance (``r v``); without repeat counts every ``s^2 > 0`` is one dof."""
    from explorer.model.stats import fit_spread, page_bytes

    single_run_var = np.asarray(single_run_var, dtype=np.float64)
    if n_repeats is None:
        dof = (single_run_var > 0).astype(np.float64)
    else:
        dof = np.maximum(np.asarray(n_repeats) - 1, 0).astype(np.float64)
    a, rho = fit_spread(y, single_run_var, dof, abs_floor=page_bytes() if abs_floor is None else abs_floor,
                        rel_floor=rel_floor, rel_prior=priors._RUN_NOISE_PRIOR)
    return rho * rho, a * a, priors._RUN_NOISE_PRIOR[1] + float(dof.sum())


@with_one_blas_thread
def fit(operator: str, shapes, peak_bytes, noise_var, lower_bound, *, halo=(0, 0, 0), n_repeats=None,
        block_multiple=None, axis_classes=None, prior: MeanPrior | None = None,
        rel_noise_floor: float | None = None, abs_noise_floor_bytes: float | None = None,
        prequential: "Prequential | None" = None, held: "HeldHyperparameters | None" = None) -> MemoryModel:
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
        halo: the operator's halo, kept on the model for ``explorer.plan.chunk_plan``.
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
        held: another fit's hyperparameters and regime boundaries (:class:`HeldHyperparameters`)
            to condition on instead of maximising the likelihood: the posterior of these
            profiles at hyperparameters learnt from others, no ML-II run (``info["held_from"]``
            says from how many profiles).
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
                                                rel_floor=priors.DEFAULT_REL_NOISE_FLOOR if rel_noise_floor is None
                                                else rel_noise_floor, abs_floor=abs_noise_floor_bytes)
    # Fixed part of each observation's noise variance (the nugget is added in the fit).
    fixed_var = np.maximum(v, (rel_run_var * y * y + abs_var) / r_eff)

    def fit_on(regime=NO_REGIME, without=None):
        keep = np.flatnonzero(exact) if without is None else np.delete(np.flatnonzero(exact), without)
        return _fit_posterior(dims[keep], y[keep], fixed_var[keep], np.zeros(keep.size, dtype=bool),
                              multiple=multiple, rel_run_var=rel_run_var, abs_var=abs_var, noise_dof=noise_dof,
                              prior=prior, classes=classes, regime=regime, held=held)

    exceeded = {"exceeded_dims": dims[lb], "exceeded_bytes": y[lb]}
    if held is None:
        (arrays, fit_info), regime_info = _with_boundary(
            fit_on, lambda fitted: MemoryModel(operator, halo, n, {**fitted, **exceeded}))
    else:
        (arrays, fit_info), regime_info = fit_on(held.regime), None
    info = {
        **fit_info,
        **({"regime": regime_info} if regime_info else {}),
        **({"held_from": held.n_observations} if held is not None else {}),
        "n_exact": int(exact.sum()),
        "n_lower_bounds": int(lb.sum()),
        "fit_seconds": time.perf_counter() - started,
        **({"prior": prior.source} if prior is not None else {}),
    }
    return recalibrate(MemoryModel(operator, halo, n, {**arrays, **exceeded}, info), prequential)


def _with_boundary(fit_on, as_model) -> tuple[tuple[dict, dict], dict | None]:
    """The fit with no regime boundary or with each that earns it (``explorer.model.regimes``), one
    at a time: the best candidate the current fit does not have, refitted with the others, kept
    when it beats the current fit (``regimes.accept``) with every profile and, both refitted,
    without the one profile its gain leans on most (the least of ``regimes.leave_one_out_gains``):
    a boundary one profile justifies is that profile's explanation, not a regime; the first
    refused ends the search.
    Returns ``((arrays, fit_info), what was tried or None)``: ``boundary`` the kept ones (or the
    refused one when none was kept), ``kept``, and each step's ``boundary``, ``gain``, ``candidates``,
    ``gain_without_one`` and ``without`` (the refitted gain without that profile, and its shape,
    when the whole gain passed) and ``kept`` in ``steps``.  ``fit_on(regime, without=None)`` fits
    the exact profiles (all but the ``without``-th of them when given); ``as_model(arrays)`` is the
    ML-II model of a fit's arrays."""
    current, rows, steps = fit_on(), [], []
    while True:
        boundary = regimes.scan(as_model(current[0]))
        if boundary is None or boundary.gain <= 0:  # no candidate, or none better at these hyperparameters
            break
        candidate = np.asarray(boundary.regime)
        refit = fit_on(np.vstack(rows + [candidate]))
        gain = refit[1]["log_evidence"] - current[1]["log_evidence"]
        n = len(current[0]["train_bytes"])
        kept = regimes.accept(gain, boundary.n_candidates, n)
        step = {"boundary": boundary.describe(), "gain": round(gain, 2), "candidates": boundary.n_candidates}
        if kept:  # and refitted without the profile it leans on most (regimes.leave_one_out_gains)
            with_boundary = as_model(refit[0])
            i = int(np.argmin(regimes.leave_one_out_gains(with_boundary, as_model(current[0]), gain)))
            without = (fit_on(np.vstack(rows + [candidate]), without=i)[1]["log_evidence"]
                       - fit_on(np.vstack(rows) if rows else NO_REGIME, without=i)[1]["log_evidence"])
            kept = regimes.accept(without, boundary.n_candidates, n - 1)
            step.update(gain_without_one=round(without, 2),
                        without=[int(x) for x in with_boundary.train_shapes[i]])
        steps.append({**step, "kept": kept})
        if not kept:
            break
        current, rows = refit, rows + [candidate]
    if not steps:
        return current, None
    return current, {"boundary": regime_description(np.array(rows)) if rows else steps[-1]["boundary"],
                     "kept": bool(rows), "steps": steps}


@dataclass(frozen=True)
class HeldHyperparameters:
    """An ML-II fit's hyperparameters and regime boundaries, carried to other profiles of the
    same operator (:func:`fit`'s ``held``).

    The kernel sees the log-dims normalised by the training box, ``z = (log n - log n_lo) /
    span``, so a lengthscale ``l`` in ``z`` is ``l span`` in log-dims: that product is what is
    held (:meth:`on_span` divides it by the new profiles' span), so two given shapes stay as
    correlated as the fit learnt them whatever the new box.  The regime sides' lengthscales,
    the relative residual and nugget variances and the amplitude slope are scale-free and held
    as they are."""

    log_lengthscale: np.ndarray  # the log-dims' lengthscales in log units, ``l * span``
    side_lengthscale: np.ndarray  # one per regime boundary's side
    outputscale: float
    relative_nugget_var: float
    amplitude_slope: float
    regime: np.ndarray
    n_observations: int

    @classmethod
    def of(cls, model: MemoryModel) -> "HeldHyperparameters":
        """The ML-II hyperparameters of ``model`` (of its ``ml2`` when it was calibrated)."""
        ml2 = getattr(model, "ml2", model)
        lengthscale, span = np.asarray(ml2._a["lengthscale"], dtype=np.float64), np.asarray(ml2._a["log_span"])
        outputscale, nugget = ml2._ml2
        return cls(lengthscale[:span.size] * span, lengthscale[span.size:].copy(), float(outputscale), float(nugget),
                   float(ml2._amp_slope), np.array(ml2._a["regime"], dtype=np.float64), int(ml2.n_observations))

    def on_span(self, log_span) -> dict:
        """The hyperparameters (``_fit_hyperparameters``' dict) for a training box of ``log_span``."""
        return {"lengthscale": np.concatenate([self.log_lengthscale / np.asarray(log_span), self.side_lengthscale]),
                "outputscale": self.outputscale, "relative_nugget_var": self.relative_nugget_var,
                "amplitude_slope": self.amplitude_slope}


@dataclass(frozen=True)
class Prequential:
    """Profiles each predicted by a fit that had not seen it (``MemoryModel.prequential_terms``
    of the ML-II fit before it ran): residuals ``e`` (bytes), latent variances ``c`` and run
    noise variances ``s`` (bytes^2), the data of the latent scale (``explorer.model.stats.scale_posterior``)."""

    residuals: tuple[float, ...] = ()
    latent_var: tuple[float, ...] = ()
    noise_var: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.residuals)


@with_one_blas_thread
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


def _log_evidence_terms(transform: np.ndarray, prior_precision_raw: np.ndarray) -> float:
    r"""What turns the ML-II fit's restricted log-likelihood (computed in the re-parametrised basis
    ``h = raw @ T``, the proper prior's normaliser left out) into the log evidence of the raw
    basis's model, comparable between models whose proper mean terms differ (a regime
    boundary's two, ``explorer.model.regimes``): ``log|det T| + log pdet(B^{-1}) / 2``, ``pdet`` the
    product of the raw prior precision's nonzero eigenvalues (the flat terms, the same in both
    models, have none)."""
    eig = np.linalg.eigvalsh(prior_precision_raw)
    proper = eig > 1e-12 * max(float(eig.max()), 1e-300)
    return float(np.linalg.slogdet(transform)[1] + 0.5 * np.log(eig[proper]).sum())


def _envelope(relative_rows: np.ndarray, n_free: int) -> np.ndarray:
    """``gamma`` minimising ``|rows gamma - 1|``, non-negative but for the last ``n_free`` terms."""
    from scipy.optimize import lsq_linear, nnls

    ones = np.ones(len(relative_rows))
    if n_free == 0:
        return nnls(relative_rows, ones)[0]
    lower = np.r_[np.zeros(relative_rows.shape[1] - n_free), np.full(n_free, -np.inf)]
    return lsq_linear(relative_rows, ones, bounds=(lower, np.inf)).x


def _declared(operator: str, attribute: str, default):
    """The registered operator's ``attribute`` (``block_multiple``, ``axis_classes``), or
    ``default`` for a name the registry does not know (it claims nothing)."""
    import operators

    try:
        return getattr(operators.get(operator), attribute)
    except KeyError:
        return default


def _fit_posterior(dims, y, fixed_var, is_lower_bound, *, rel_run_var, abs_var, noise_dof, multiple, prior=None,
                   classes=(0, 1, 2), regime=NO_REGIME, held: "HeldHyperparameters | None" = None):
    """ML-II hyperparameters (torch), or ``held``'s, and the exported NumPy posterior of one data set."""
    n = dims.shape[0]
    multiple = np.asarray(multiple, dtype=np.float64)
    log_dims = np.log(effective_dims(dims, multiple))
    axis_length = class_lengths(log_dims, classes)
    mapping = basis_map(classes)
    bytes_scale = float(y.max())
    y_s = y / bytes_scale
    raw = _raw_basis(dims, axis_length, multiple, mapping, regime)
    p = raw.shape[1]
    if prior is None:
        envelope_rows, envelope_values = raw, y_s
    else:
        prior_raw = _raw_basis(_as_dims(prior.shapes), axis_length, multiple, mapping, regime)
        prior_mean_s = np.asarray(prior.mean_bytes, dtype=np.float64) / bytes_scale
        envelope_rows, envelope_values = np.vstack([raw, prior_raw]), np.concatenate([y_s, prior_mean_s])
    # Amplitude envelope: relative NNLS, s(x) = raw_basis(x) @ gamma > 0 (on the prior's means too);
    # what a regime's side adds to the constant and the volume may be negative (the floor keeps s > 0).
    gamma = _envelope(envelope_rows / envelope_values[:, None], p - mapping.shape[1])
    if not np.any(gamma > 0):
        gamma = np.zeros(p)
        gamma[0] = float(np.exp(np.log(y_s).mean()))
    amp_floor = 1e-3 * float(y_s.min())
    if prior is None:
        # Prior precision of beta (raw basis): flat on [1, V]; N(0, (tau s_c)^2) on faces, edges.
        # s_c = s(centre) = sum(gamma) since every raw term is 1 at u = (1, 1, 1) (below a regime
        # boundary: its side's terms are 0 there).
        prior_sd = priors._FACE_EDGE_PRIOR_RELATIVE_SD * float(gamma[:mapping.shape[1]].sum())
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
        "regime": regime_rows(regime),
    }
    # ML-II on the departure from the prior mean (b_0 = 0 without a prior): the same likelihood
    if held is None:
        hyper, reml = torch_fit._fit_hyperparameters(effective_dims(dims, multiple), y_s - offset_s, fixed_s,
                                                     features, amp_floor, y_ref=y_s)
    else:
        hyper, reml = held.on_span(log_span), None
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
    if reml is None:  # held hyperparameters: no likelihood was maximised
        return arrays, {}
    return arrays, {"restricted_log_likelihood": reml,
                    "log_evidence": reml + _log_evidence_terms(transform, prior_precision_raw)}
