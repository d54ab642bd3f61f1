"""The surrogate's GPyTorch modules: imported only to fit (``explorer.model.fit.fit``).

Kept out of :mod:`explorer.model.memory_model` so that ``load_model`` and ``recommend_chunks``
never import torch.  The math is stated in :mod:`explorer.model.memory_model`'s docstring; these
classes are its torch mirror (feature map, relative residual kernel, relative nugget
noise, explicit-basis mean, restricted marginal likelihood).
"""

from __future__ import annotations

import math
import warnings

with warnings.catch_warnings():  # gpytorch's import-time torch.jit deprecation notices
    warnings.simplefilter("ignore", DeprecationWarning)
    import gpytorch
    import torch
    from gpytorch.constraints import Interval, Positive
    from gpytorch.priors import LogNormalPrior, NormalPrior

from explorer.model import priors
from explorer.model.basis import BASIS_EXPONENTS, FLAT_TERMS, alike_groups


def positive_log():
    return Positive(transform=torch.exp, inv_transform=torch.log)


def lognormal_with_mode(mode, sd_log):
    """LogNormal whose mode (= MAP with no data) is ``mode``: loc = log(mode) + sd^2."""
    return LogNormalPrior(math.log(mode) + sd_log**2, sd_log, validate_args=False)


class FeatureMap(torch.nn.Module):
    """The torch mirror of ``_raw_basis``/``_kernel_inputs``/amplitude (fixed buffers)."""

    def __init__(self, features, amp_floor):
        super().__init__()
        for name in ("axis_length", "basis_map", "basis_transform", "basis_prior_precision", "amplitude_coef",
                     "log_lo", "log_span", "regime"):
            self.register_buffer(name, torch.as_tensor(features[name], dtype=torch.float64))
        self.register_buffer("basis_exponents", torch.as_tensor(BASIS_EXPONENTS, dtype=torch.float64))
        self.groups = [torch.as_tensor(g) for g in alike_groups(features["axis_classes"])]
        self.amp_floor = float(amp_floor)
        self.n_terms = int(self.basis_transform.shape[0])
        self.regime = self.regime.reshape(-1, 5)
        self.active = [b for b in range(self.regime.shape[0]) if bool(self.regime[b, :3].any())]

    def raw_basis(self, dims):
        u = dims / self.axis_length
        tied = torch.prod(u.unsqueeze(-2) ** self.basis_exponents, dim=-1) @ self.basis_map
        if not self.active:
            return tied
        side, flat = self.side(dims), tied[..., list(FLAT_TERMS)]
        return torch.cat([tied] + [side[..., b:b + 1] * flat for b in self.active], dim=-1)

    def side(self, dims):
        """``regime_side`` of effective dims, ``(..., B)``."""
        level = torch.log(dims) @ self.regime[:, :3].T
        side = torch.where(level >= self.regime[:, 4], 1.0, torch.where(level <= self.regime[:, 3], 0.0, 0.5))
        return side * self.regime[:, :3].any(dim=-1).to(side.dtype)

    def basis(self, dims):
        return self.raw_basis(dims) @ self.basis_transform

    def envelope(self, dims):
        """The amplitude's envelope (no hyperparameter in it)."""
        return (self.raw_basis(dims) @ self.amplitude_coef).clamp_min(self.amp_floor)

    def amplitude(self, dims, slope):
        return self.amplitude_of(self.envelope(dims), slope)

    def amplitude_of(self, envelope, slope):
        centre = max(float(self.amplitude_coef.sum()), self.amp_floor)
        return envelope * (envelope / centre) ** -slope

    def kernel_inputs(self, dims):
        """``_kernel_inputs`` of effective dims: the normalised log-dims and the side of the
        regime boundary (``regime_side``)."""
        side = self.side(dims)
        if self.groups:  # canonical_dims: sorted within each group of alike axes
            dims = dims.clone()
            for group in self.groups:
                dims[..., group] = torch.sort(dims[..., group], dim=-1).values
        return torch.cat([(torch.log(dims) - self.log_lo) / self.log_span, side], dim=-1)


class RelativeResidualKernel(gpytorch.kernels.Kernel):
    """``sigma_f^2 s(x) s(x') Matern52(z(x), z(x'))`` on raw dims, ``s`` with its learnt slope
    ``kappa`` in ``[0, 1]`` (``FeatureMap.amplitude``)."""

    def __init__(self, feature_map):
        super().__init__()
        self.feature_map = feature_map
        self.register_parameter("raw_slope", torch.nn.Parameter(torch.zeros((), dtype=torch.float64)))
        self.register_constraint("raw_slope", Interval(0.0, 1.0))
        self.register_prior("slope_prior", NormalPrior(0.0, priors._SLOPE_PRIOR_SD), lambda m: m.slope,
                            lambda m, v: m._set_slope(v))
        self._set_slope(torch.tensor(priors._SLOPE_START, dtype=torch.float64))
        n_inputs = 3 + feature_map.regime.shape[0]  # the log-dims and each regime boundary's side
        self.scaled = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.MaternKernel(
                nu=2.5, ard_num_dims=n_inputs, lengthscale_prior=lognormal_with_mode(*priors._LENGTHSCALE_PRIOR),
                lengthscale_constraint=positive_log()),
            outputscale_prior=lognormal_with_mode(*priors._OUTPUTSCALE_PRIOR),
            outputscale_constraint=positive_log())

    @property
    def slope(self):
        return self.raw_slope_constraint.transform(self.raw_slope)

    @slope.setter
    def slope(self, value):
        self._set_slope(value)

    def _set_slope(self, value):
        value = torch.as_tensor(value, dtype=torch.float64)
        self.initialize(raw_slope=self.raw_slope_constraint.inverse_transform(value))

    def forward(self, x1, x2, diag=False, **params):
        fm = self.feature_map
        k = self.scaled.forward(fm.kernel_inputs(x1), fm.kernel_inputs(x2), diag=diag)
        s1, s2 = fm.amplitude(x1, self.slope), fm.amplitude(x2, self.slope)
        if diag:
            return s1 * k * s2
        return s1.unsqueeze(-1) * k * s2.unsqueeze(-2)

    def train_covariance(self, x):
        """``forward(x, x)``, the same numbers, with what does not depend on a hyperparameter (the
        kernel inputs, the amplitude's envelope) computed once per ``x``: an ML-II fit evaluates
        the training covariance a few dozen times on the same inputs."""
        fm = self.feature_map
        cached = getattr(self, "_train_inputs_cache", None)
        if cached is None or cached[0] is not x:
            cached = self._train_inputs_cache = (x, fm.kernel_inputs(x), fm.envelope(x))
        _, z, envelope = cached
        k = self.scaled.forward(z, z)
        # two amplitudes, as forward's graph has: one would sum their gradients in another order
        s1, s2 = fm.amplitude_of(envelope, self.slope), fm.amplitude_of(envelope, self.slope)
        return s1.unsqueeze(-1) * k * s2.unsqueeze(-2)


class RelativeNuggetNoise(gpytorch.likelihoods.noise_models.Noise):
    """Known per-point variance plus a learnt relative nugget ``rho_nug^2 y_i^2``."""

    def __init__(self, fixed_var, y_ref):
        super().__init__()
        self.register_buffer("fixed_var", fixed_var)
        self.register_buffer("y_ref_sq", y_ref * y_ref)
        self.register_parameter("raw_nugget", torch.nn.Parameter(torch.zeros((), dtype=torch.float64)))
        self.register_constraint("raw_nugget", positive_log())
        self.register_prior("nugget_prior", lognormal_with_mode(*priors._NUGGET_PRIOR),
                            lambda m: m.nugget, lambda m, v: m._set_nugget(v))
        self._set_nugget(torch.tensor(priors._NUGGET_PRIOR[0], dtype=torch.float64))

    @property
    def nugget(self):
        return self.raw_nugget_constraint.transform(self.raw_nugget)

    def _set_nugget(self, value):
        value = torch.as_tensor(value, dtype=torch.float64)
        self.initialize(raw_nugget=self.raw_nugget_constraint.inverse_transform(value))

    def forward(self, *params, shape=None, **kwargs):
        from linear_operator.operators import DiagLinearOperator
        return DiagLinearOperator(self.fixed_var + self.nugget * self.y_ref_sq)


class RelativeNuggetLikelihood(gpytorch.likelihoods._GaussianLikelihoodBase):
    def __init__(self, fixed_var, y_ref):
        super().__init__(noise_covar=RelativeNuggetNoise(fixed_var, y_ref))


class BasisMean(gpytorch.means.Mean):
    """``h(x)^T beta`` with ``beta`` fixed (set to ``beta_bar`` after fitting)."""

    def __init__(self, feature_map, beta):
        super().__init__()
        self.feature_map = feature_map
        self.register_buffer("beta", beta)

    def forward(self, x):
        return self.feature_map.basis(x) @ self.beta


class ExplicitBasisGP(gpytorch.models.ExactGP):
    def __init__(self, train_x, train_y, likelihood, feature_map, beta=None):
        super().__init__(train_x, train_y, likelihood)
        beta = torch.zeros(feature_map.n_terms, dtype=torch.float64) if beta is None else beta
        self.mean_module = BasisMean(feature_map, beta)
        self.covar_module = RelativeResidualKernel(feature_map)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class RestrictedMarginalLogLikelihood(gpytorch.mlls.MarginalLogLikelihood):
    """Restricted (beta integrated out, flat prior) log marginal likelihood + log priors, / n."""

    def forward(self, function_dist, target, *params, **kwargs):
        return self.restricted_log_likelihood()

    def restricted_log_likelihood(self, with_priors=True):
        model = self.model
        x = model.train_inputs[0]
        y = model.train_targets
        n = y.shape[-1]
        k_y = model.covar_module.train_covariance(x) + self.likelihood.noise_covar(x).to_dense()
        chol = torch.linalg.cholesky(k_y)
        h = self._training_basis(x)
        ly = torch.linalg.solve_triangular(chol, y.unsqueeze(-1), upper=False).squeeze(-1)
        lh = torch.linalg.solve_triangular(chol, h, upper=False)
        prior_precision = model.covar_module.feature_map.basis_prior_precision
        chol_a = torch.linalg.cholesky(lh.T @ lh + prior_precision)
        c = torch.linalg.solve_triangular(chol_a, (lh.T @ ly).unsqueeze(-1), upper=False).squeeze(-1)
        n_flat = len(FLAT_TERMS)  # improper directions; the prior's own normaliser is a constant
        value = (-0.5 * (ly @ ly - c @ c) - torch.log(torch.diagonal(chol)).sum()
                 - torch.log(torch.diagonal(chol_a)).sum() - 0.5 * (n - n_flat) * math.log(2 * math.pi))
        if with_priors:
            for module, prior, closure in self._prior_terms():
                value = value + prior.log_prob(closure(module)).sum()
        return value / n

    def _training_basis(self, x):
        """The training inputs' basis ``H`` (no hyperparameter in it), computed once per ``x``."""
        cached = getattr(self, "_basis_cache", None)
        if cached is None or cached[0] is not x:
            cached = self._basis_cache = (x, self.model.covar_module.feature_map.basis(x))
        return cached[1]

    def _prior_terms(self):
        """``named_priors()``'s (module, prior, closure), listed once: the modules do not change."""
        if getattr(self, "_prior_list", None) is None:
            self._prior_list = [(module, prior, closure) for _n, module, prior, closure, _s in self.named_priors()]
        return self._prior_list

    def compute_custom_loss(self, **kwargs):
        return -self.restricted_log_likelihood()
