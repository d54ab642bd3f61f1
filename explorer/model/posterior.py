"""The model's posterior given its hyperparameters, in NumPy (``explorer.model.memory_model``
states the math): the arrays a fitted model is (saved as they are), the training noise, the
restricted log-likelihood in the latent scale, and the posterior arrays themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from explorer.model.basis import NO_REGIME, _amplitude, _kernel_inputs, _matern52, _raw_basis, alike_groups, regime_rows

if TYPE_CHECKING:
    from explorer.model.memory_model import MemoryModel


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
    "regime",  # (B, 5) the regime boundaries: direction w and the gap (g_lo, g_hi) of w . log n (basis.regime_side)
    "lengthscale",  # (3 + B,) of the three normalised log-dims and of the side of each regime boundary
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


def _with_regime(arrays: dict) -> dict:
    """A model's arrays with the regime fields of a model saved before they existed: no regime
    boundary (``basis.NO_REGIME``), and a lengthscale for the kernel's regime input that then
    never acts (every block is on side 0)."""
    if "regime" in arrays:  # one boundary's was saved as (5,) before there could be several
        return {**arrays, "regime": regime_rows(arrays["regime"])}
    lengthscale = np.asarray(arrays["lengthscale"], dtype=np.float64).reshape(-1)
    return {**arrays, "regime": NO_REGIME, "lengthscale": np.append(lengthscale, 1.0)}


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


def restricted_log_likelihood_in_scale(latent, noise, basis, y, prior_precision, log_scales=None) -> np.ndarray:
    r"""A fit's restricted log-likelihood as a function of the latent scale ``lambda``, on
    ``explorer.model.stats.LOG_SCALE_GRID`` (or the ``log lambda`` given; up to a constant):

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
    from explorer.model.stats import LOG_SCALE_GRID

    root = 1.0 / np.sqrt(np.asarray(noise, dtype=np.float64))
    eig, u = np.linalg.eigh(root[:, None] * latent * root[None, :])
    eig = np.maximum(eig, 0.0)
    y_t = u.T @ (root * y)
    h_t = u.T @ (root[:, None] * basis)
    lam = np.exp(LOG_SCALE_GRID if log_scales is None else np.asarray(log_scales, dtype=np.float64))
    w = 1.0 / (lam[:, None] * eig[None, :] + 1.0)  # the eigenvalues of (lambda L~ + I)^-1, (grid, n)
    a_mat = np.matmul(h_t.T[None, :, :] * w[:, None, :], h_t) + np.asarray(prior_precision)[None, :, :]
    b = (w * y_t[None, :]) @ h_t
    chol = np.linalg.cholesky(a_mat)
    c = np.linalg.solve(chol, b[:, :, None])[:, :, 0]
    return (-0.5 * (w * y_t * y_t).sum(1) + 0.5 * (c * c).sum(1) + 0.5 * np.log(w).sum(1)
            - np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(1))


def _posterior_arrays(dims, y_s, noise_var_s, features, amp_floor, hyper):
    """``L^{-1}``, ``alpha``, ``beta_bar = A^{-1} (H K_y^{-1} y + B^{-1} b_0)``, ``W = L^{-1} H^T``,
    ``L_A^{-1}`` (NumPy, float64)."""
    raw = _raw_basis(dims, features["axis_length"], features["block_multiple"], features["basis_map"],
                     features["regime"])
    h = raw @ features["basis_transform"]
    amp = _amplitude(raw, features["amplitude_coef"], amp_floor, hyper["amplitude_slope"])
    z = _kernel_inputs(dims, features["log_lo"], features["log_span"], features["block_multiple"],
                       alike_groups(features["axis_classes"]), features["regime"])
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
