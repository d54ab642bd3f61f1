"""ML-II of the model's hyperparameters with GPyTorch and BoTorch, and the torch posterior that
checks the NumPy one.  Importing this module is torch-free: ``explorer.model.gp_torch`` (torch,
gpytorch) is imported on first use, or ahead of it by :func:`warm_up`.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from explorer.model.basis import _as_dims, effective_dims
from explorer.model.posterior import _training_noise

if TYPE_CHECKING:
    from explorer.model.memory_model import MemoryModel


# ---- torch / gpytorch part (imported lazily) -------------------------------------------


def warm_up() -> None:
    """Import torch, GPyTorch and BoTorch now (seconds), e.g. in a thread while profiles run."""
    _torch_modules()
    import botorch.fit  # noqa: F401


#: ML-II fits change process-wide state while they run (torch's thread count, the warnings
#: filters): one at a time, whichever thread asks.
_FIT_LOCK = threading.Lock()


def _torch_modules():
    """The GPyTorch side of the surrogate (:mod:`explorer.model.gp_torch`), imported on first use
    (Python's import lock makes a concurrent ``warm_up`` safe)."""
    import importlib

    return importlib.import_module("explorer.model.gp_torch")


#: Starting points of the ML-II optimisation (lengthscale, relative residual sd, nugget sd).
_STARTS = ((0.5, 0.005, 0.001), (2.0, 0.03, 0.001))


def _fit_hyperparameters(dims, y_s, fixed_var_s, features, amp_floor, *, y_ref=None, optimizer_options=None):
    """Maximise the restricted marginal likelihood (+ priors) with ``fit_gpytorch_mll``.

    ``y_s``: the targets (the peaks less the prior mean ``H b_0``); ``y_ref``: the peaks the
    relative nugget scales with (``y_s`` by default).  Runs from each of ``_STARTS`` and keeps
    the one of highest value; returns ``(hyperparameters, value)``.  ``optimizer_options``:
    SciPy L-BFGS-B options (default SciPy's).
    """
    with _FIT_LOCK:
        return _fit_hyperparameters_locked(dims, y_s, fixed_var_s, features, amp_floor, y_ref=y_ref,
                                           optimizer_options=optimizer_options)


def _fit_hyperparameters_locked(dims, y_s, fixed_var_s, features, amp_floor, *, y_ref, optimizer_options):
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
    n_inputs = gp.covar_module.scaled.base_kernel.ard_num_dims  # the three log-dims and each boundary's side
    gp.covar_module.scaled.base_kernel.lengthscale = torch.full((1, n_inputs), lengthscale, dtype=torch.float64)
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
                                           "basis_prior_precision", "amplitude_coef", "log_lo", "log_span", "regime")}
    feature_map = t.FeatureMap(features, model._amp_floor)
    x = torch.as_tensor(effective_dims(a["train_dims"], a["block_multiple"]), dtype=torch.float64)
    y = torch.as_tensor(a["train_bytes"] / scale, dtype=torch.float64)
    noise = torch.as_tensor(_training_noise(a, model._rel_nugget_var), dtype=torch.float64)
    with gpytorch.settings.min_fixed_noise(float_value=1e-30, double_value=1e-30, half_value=1e-30):
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise)
        gp = t.ExplicitBasisGP(x, y, likelihood, feature_map,
                                  beta=torch.as_tensor(a["beta"], dtype=torch.float64))
        gp.covar_module.scaled.base_kernel.lengthscale = torch.as_tensor(a["lengthscale"]).reshape(1, -1)
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
