r"""Where to profile next and when to stop: pure functions of shapes, bytes and a posterior.

No processes, no files: the explore loop gives a fitted ``MemoryModel``
(``explorer.model.memory_model``), candidate block shapes, and the shapes chunk sizing
will ask about; these functions answer with numbers.

Scoring (integrated variance reduction, closed form)
----------------------------------------------------
A GP's posterior covariance does not depend on the observed values, so the
effect of profiling a shape ``x`` once (noise variance ``s^2(x)``) on the
latent variance at a target ``t`` is known before running it:

.. math::

    \operatorname{var}_{+x}(t) = \operatorname{var}(t)
        - \frac{\operatorname{cov}(t, x)^2}{\operatorname{var}(x) + s^2(x)}

and the *integrated variance reduction* over the targets, in relative terms
(each target weighted by ``1 / mean(t)^2`` so that small and large blocks
count alike), is

.. math::

    \mathrm{IVR}(x) = \sum_t \frac{\operatorname{cov}(t, x)^2}
                       {\bar g(t)^2\, (\operatorname{var}(x) + s^2(x))}

with the full posterior covariance of the surrogate (the basis-coefficient
term included, so extrapolation directions are valued).  ``propose`` divides
this by the predicted profiling cost and picks greedily; after each pick the
covariance is updated exactly by the rank-one formula above (no fantasised
values needed).

Safety: a candidate is never proposed if the upper bound of its task memory
(input ``4 V`` bytes + predicted peak, at ``confidence``) exceeds the
profiling cap, nor if it contains (is >= on every axis) a shape whose
profile already exceeded the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from explorer.core.units import FLOAT32_BYTES

__all__ = [
    "DEFAULT_TOLERANCE",
    "CostModel",
    "candidate_shapes",
    "initial_design",
    "input_bytes",
    "integrated_variance_reduction",
    "propose",
    "relative_half_width",
    "safe_mask",
    "ScaleEvidence",
    "StopDecision",
    "stop_decision",
    "target_mask",
    "validation_shapes",
]

#: The explore loop stops when the relative half-width of the bound is below this everywhere
#: in the target region.
DEFAULT_TOLERANCE = 0.05


def _shapes(shapes) -> np.ndarray:
    arr = np.asarray(shapes)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"expected shapes of 3 dims, got an array of shape {arr.shape}")
    return arr


def input_bytes(shapes) -> np.ndarray:
    """Bytes of a float32 block of each shape: ``4 n1 n2 n3``."""
    return FLOAT32_BYTES * np.prod(_shapes(shapes).astype(np.float64), axis=1)


def candidate_shapes(n: int, *, min_dim: int = 8, max_dim: int = 2048, seed: int = 0) -> np.ndarray:
    """``(n, 3)`` int block shapes, space-filling in log-dims (scrambled Sobol, seeded).

    ``log n_i = log min_dim + u_i (log max_dim - log min_dim)`` with ``u`` a
    scrambled Sobol sequence, rounded to ints.
    """
    from scipy.stats import qmc

    if n <= 0:
        return np.zeros((0, 3), dtype=np.int64)
    if not 1 <= min_dim <= max_dim:
        raise ValueError(f"need 1 <= min_dim <= max_dim, got {min_dim}, {max_dim}")
    m = max(int(math.ceil(math.log2(n))), 0)
    u = qmc.Sobol(d=3, scramble=True, seed=seed).random_base2(m)[:n]
    lo, hi = math.log(min_dim), math.log(max_dim)
    dims = np.rint(np.exp(lo + u * (hi - lo))).astype(np.int64)
    return np.clip(dims, min_dim, max_dim)


def initial_design(n: int = 5, *, max_input_bytes: float, min_dim: int = 8, max_dim: int = 2048,
                   volume_ratio: float = 1000.0, max_aspect: float = 4.0, seed: int = 0) -> np.ndarray:
    """A small space-filling first design: ``(n, 3)`` distinct int shapes.

    Volumes are log-spaced from ``V_hi / volume_ratio`` (at least ``min_dim^3``)
    to ``V_hi = max_input_bytes / 4`` (float32 input), so that even a heavy
    operator stays within the profiling cap.  Aspect ratios spread around a
    circle in the plane of log-aspects (``sum log n_i = log V``): shape ``k``
    has ``log n = log V / 3 + r (cos th_k e1 + sin th_k e2)``, with ``e1, e2``
    orthonormal and orthogonal to ``(1, 1, 1)``, ``th_k = th_0 + 2 pi k * 3/8``
    and ``r`` such that the longest-to-shortest axis ratio is about ``max_aspect``.
    """
    if n <= 0:
        return np.zeros((0, 3), dtype=np.int64)
    v_hi = float(max_input_bytes) / FLOAT32_BYTES
    if v_hi < min_dim**3:
        raise ValueError(f"max_input_bytes={max_input_bytes:.0f} is below one {min_dim}^3 float32 block")
    v_lo = max(float(min_dim) ** 3, v_hi / volume_ratio)
    volumes = np.geomspace(v_lo, v_hi, n) if n > 1 else np.array([v_hi])
    e1 = np.array([1.0, -1.0, 0.0]) / math.sqrt(2.0)
    e2 = np.array([1.0, 1.0, -2.0]) / math.sqrt(6.0)
    # Largest spread of log n over the circle is r * sqrt(2) (direction e1): ratio = exp(r sqrt 2).
    radius = math.log(max_aspect) / math.sqrt(2.0)
    theta0 = np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi)
    shapes: list[tuple[int, int, int]] = []
    for k, volume in enumerate(volumes):
        theta = theta0 + 2.0 * math.pi * k * 3.0 / 8.0
        log_dims = math.log(volume) / 3.0 + radius * (math.cos(theta) * e1 + math.sin(theta) * e2)
        dims = np.clip(np.rint(np.exp(log_dims)).astype(np.int64), min_dim, max_dim)
        while FLOAT32_BYTES * float(np.prod(dims.astype(np.float64))) > max_input_bytes:
            i = int(np.argmax(dims))
            if dims[i] <= min_dim:
                break
            dims[i] -= 1
        shape = tuple(int(d) for d in dims)
        while shape in shapes:  # keep the design distinct (tiny volumes can collide)
            i = int(np.argmin(shape))
            shape = tuple(d + 1 if j == i else d for j, d in enumerate(shape))
        shapes.append(shape)
    return np.array(shapes, dtype=np.int64)


def target_mask(model, shapes, memory_limit_bytes: float, confidence: float = 0.99, *,
                low_fraction: float = 0.01, high_fraction: float = 1.0) -> np.ndarray:
    """Shapes chunk sizing will ask about: task memory plausibly within the target range.

    Task memory = input ``4 V`` + predicted peak.  A shape is a target when its
    interval ``[4V + mean, 4V + upper]`` meets ``[low, high] * memory_limit_bytes``:
    ``4V + upper >= low * limit`` and ``4V + mean <= high * limit``.
    """
    shapes = _shapes(shapes)
    mean, upper = model.predict_many(shapes, confidence)
    inp = input_bytes(shapes)
    return (inp + upper >= low_fraction * memory_limit_bytes) & (inp + mean <= high_fraction * memory_limit_bytes)


#: Largest aspect ratio of a block's non-whole axes that chunk sizing produces;
#: the planner prefers compact chunks, so targets stay within this.
MAX_BLOCK_ASPECT = 8.0


def chunkable_mask(shapes, whole_axes=(), *, max_aspect: float = MAX_BLOCK_ASPECT) -> np.ndarray:
    """Shapes a chunk plan can produce as a task's block.

    On the axes that may be chunked, ``max(n) / min(n) <= max_aspect`` (plans
    prefer compact chunks: halos cost surface); an axis that must stay whole
    takes the volume's length, any length.
    """
    shapes = _shapes(shapes).astype(np.float64)
    free = [axis for axis in range(shapes.shape[1]) if axis not in set(whole_axes)]
    if len(free) < 2:
        return np.ones(len(shapes), dtype=bool)
    sub = shapes[:, free]
    return sub.max(axis=1) <= max_aspect * sub.min(axis=1)


class CostModel:
    """Predicted seconds of one profile: ``a + b V`` with ``a, b >= 0``.

    ``fit`` minimises the squared *relative* residuals ``((a + b V - t) / t)^2``
    (the log-scale least squares to first order) by non-negative least squares.
    Before any data: ``a = 1 s`` (a fresh interpreter and the operator's imports)
    and ``b = 5e-8 s`` per voxel.  ``fitted`` tells whether measurements went in.
    """

    def __init__(self, intercept_seconds: float = 1.0, seconds_per_voxel: float = 5e-8, *, fitted: bool = False):
        if intercept_seconds < 0 or seconds_per_voxel < 0 or intercept_seconds + seconds_per_voxel <= 0:
            raise ValueError("cost coefficients must be non-negative and not both zero")
        self.intercept_seconds = float(intercept_seconds)
        self.seconds_per_voxel = float(seconds_per_voxel)
        self.fitted = bool(fitted)

    @classmethod
    def fit(cls, shapes, seconds) -> "CostModel":
        """Fit to measured profiling seconds; the default with no data, rescaled with one point."""
        shapes = _shapes(shapes) if len(shapes) else np.zeros((0, 3))
        t = np.asarray(seconds, dtype=np.float64).reshape(-1)
        ok = np.isfinite(t) & (t > 0)
        shapes, t = shapes[ok], t[ok]
        default = cls()
        if t.size == 0:
            return default
        volume = np.prod(shapes.astype(np.float64), axis=1)
        if t.size == 1 or np.ptp(volume) == 0:
            ratio = float(np.exp(np.mean(np.log(t / default.predict(shapes)))))
            return cls(default.intercept_seconds * ratio, default.seconds_per_voxel * ratio, fitted=True)
        from scipy.optimize import nnls

        design = np.stack([np.ones_like(volume), volume], axis=1) / t[:, None]
        col_scale = np.abs(design).max(0)
        coef, _ = nnls(design / col_scale, np.ones_like(t))
        a, b = coef / col_scale
        if a + b <= 0:
            return default
        return cls(a, b, fitted=True)

    def predict(self, shapes) -> np.ndarray:
        """Seconds per profile, at least 1 ms."""
        volume = np.prod(_shapes(shapes).astype(np.float64), axis=1)
        return np.maximum(self.intercept_seconds + self.seconds_per_voxel * volume, 1e-3)

    def __repr__(self) -> str:
        return f"CostModel({self.intercept_seconds:.3g} s + {self.seconds_per_voxel:.3g} s/voxel)"


def _relative_weights(mean_targets: np.ndarray) -> np.ndarray:
    """``1 / mean(t)^2``, guarded against non-positive means."""
    floor = max(float(np.max(np.abs(mean_targets))) * 1e-6, 1.0)
    return 1.0 / np.maximum(mean_targets, floor) ** 2


def integrated_variance_reduction(model, candidates, targets) -> np.ndarray:
    """``IVR(x) = sum_t cov(t, x)^2 / (mean(t)^2 (var(x) + s^2(x)))`` for each candidate, (m,).

    ``cov`` and ``var`` are the latent posterior (co)variances (basis term included);
    ``s^2(x)`` the noise variance of one new run at ``x``.  Dimensionless: the sum
    over targets of the drop in relative variance if ``x`` were profiled once.
    """
    candidates, targets = _shapes(candidates), _shapes(targets)
    weights, cov_tc, var_c, noise_c = _score_terms(model, candidates, targets)
    return _ivr(weights, cov_tc, var_c, noise_c)


def _score_terms(model, candidates, targets):
    """``1 / mean(t)^2``, ``cov(t, x)``, ``var(x)`` and the run noise ``s^2(x)`` of the score."""
    mean_t, _ = model.latent_moments(targets)
    mean_c, var_c = model.latent_moments(candidates)
    noise_c = model.noise_var(mean_c, from_mean=True)
    return _relative_weights(mean_t), model.posterior_cov(targets, candidates), var_c, noise_c


def _ivr(weights, cov_tc, var_c, noise_c):
    """The score's formula, the one place it is written: ``sum_t w_t cov(t, x)^2 / (var(x) + s^2(x))``."""
    return (weights @ (cov_tc * cov_tc)) / np.maximum(var_c + noise_c, 1e-300)


def safe_mask(model, candidates, memory_cap_bytes: float, confidence: float = 0.99) -> np.ndarray:
    """Candidates that are safe to profile under ``memory_cap_bytes``.

    Safe: ``4 V + upper(peak) <= memory_cap_bytes`` at ``confidence``, and the
    shape does not contain (``>=`` on every axis) a shape whose profile exceeded the cap.
    """
    candidates = _shapes(candidates)
    _, upper = model.predict_many(candidates, confidence)
    safe = input_bytes(candidates) + upper <= memory_cap_bytes
    exceeded = np.asarray(model.exceeded_shapes).reshape(-1, 3)
    if exceeded.size:
        dominates = np.all(candidates[:, None, :] >= exceeded[None, :, :], axis=2).any(axis=1)
        safe &= ~dominates
    return safe


def propose(model, candidates, targets, cost_model, memory_cap_bytes: float, n: int = 1,
            confidence: float = 0.99, *, pending=(), exclude=()) -> list[tuple[int, int, int]]:
    """Up to ``n`` distinct safe candidates maximising variance reduction per predicted second.

    Greedy: pick ``argmax IVR(x) / cost(x)`` among safe, unpicked candidates; then
    condition the posterior covariance on that pick exactly,
    ``cov(a, b) -= cov(a, x) cov(x, b) / (var(x) + s^2(x))`` for targets and
    candidates alike; repeat.  Returns fewer than ``n`` shapes (possibly none) when
    the safe candidates run out or none reduces the variance.

    ``pending``: shapes being profiled elsewhere.  The covariance is conditioned on
    them first, the same way (no value is needed), so the batch complements them;
    they and the ``exclude`` shapes are never proposed.
    """
    candidates, targets = _shapes(candidates), _shapes(targets)
    if n <= 0 or len(targets) == 0 or len(candidates) == 0:
        return []
    pending = np.asarray(pending, dtype=candidates.dtype).reshape(-1, 3)
    exclude = np.asarray(exclude, dtype=candidates.dtype).reshape(-1, 3)
    available = safe_mask(model, candidates, memory_cap_bytes, confidence)
    available &= ~_is_one_of(candidates, np.vstack([pending, exclude]))
    cost = np.asarray(cost_model.predict(candidates), dtype=np.float64)
    # The pending shapes join the pool as unavailable candidates the greedy loop starts from.
    pool = np.vstack([candidates, pending])
    available = np.concatenate([available, np.zeros(len(pending), dtype=bool)])
    cost = np.concatenate([cost, np.ones(len(pending))])
    picked, _ = _greedy_batch(model, pool, targets, cost, available, n,
                              given=range(len(candidates), len(pool)))
    return [tuple(int(d) for d in pool[j]) for j in picked]


def validation_shapes(model, targets, memory_cap_bytes: float, n: int = 1, confidence: float = 0.99, *,
                      exclude=(), seed: int = 0) -> list[tuple[int, int, int]]:
    """Up to ``n`` safe targets drawn uniformly at random without replacement, never one of
    ``exclude``; the draw is seeded by ``(seed, len(exclude))``, so a loop's picks are a
    function of its seed and its history (a resumed loop picks what it would have).

    Once the bound is tight everywhere, the loop profiles these instead of the
    variance-reduction picks: each is predicted before it runs, so the stop rule's
    prequential test (:func:`stop_decision`) is a sample of the bound's calibration over the
    target region, which is what the coverage claim is about.  Picking by the bound itself
    (e.g. where it is widest) would select the standardised residuals' denominators: where a
    bound is widest a residual is small relative to it, and the regions whose bound is narrow
    and wrong (a step the smooth fit has not seen, on an axis it thinks it knows) would rarely
    be tested.
    """
    targets = _shapes(targets)
    exclude = np.asarray(exclude, dtype=targets.dtype).reshape(-1, 3)
    ok = np.flatnonzero(safe_mask(model, targets, memory_cap_bytes, confidence) & ~_is_one_of(targets, exclude))
    rng = np.random.default_rng([int(seed), len(exclude)])
    picked = rng.permutation(ok)[: max(int(n), 0)]
    return [tuple(int(d) for d in targets[j]) for j in picked]


def _is_one_of(shapes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Which of ``shapes`` equal one of ``others`` on every axis."""
    if len(others) == 0:
        return np.zeros(len(shapes), dtype=bool)
    return np.all(shapes[:, None, :] == others[None, :, :], axis=2).any(axis=1)


def _greedy_batch(model, candidates, targets, cost, available, n, given=()):
    """Indices of the greedy picks and their scores ``IVR / cost`` at the time of picking,
    after conditioning on the candidates at indices ``given`` (observations under way)."""
    weights, cov_tc, var_c, noise_c = _score_terms(model, candidates, targets)  # cov_tc updated in place
    available = np.array(available, dtype=bool)
    updates_c: list[np.ndarray] = []  # u_i over the candidates: cov -= u_i u_i^T

    def condition_on(j):
        """The rank-one update of the covariances for one more observation at candidate ``j``."""
        nonlocal cov_tc, var_c
        denom_j = max(float(var_c[j] + noise_c[j]), 1e-300)
        # Current covariance between every candidate and j.
        col_c = model.posterior_cov(candidates, candidates[j : j + 1])[:, 0]
        for u in updates_c:
            col_c = col_c - u * u[j]
        scale = 1.0 / math.sqrt(denom_j)
        u_t = cov_tc[:, j] * scale
        u_c = col_c * scale
        cov_tc -= np.outer(u_t, u_c)
        var_c = np.maximum(var_c - u_c * u_c, 0.0)
        updates_c.append(u_c)

    for j in given:
        condition_on(j)
    picked, scores = [], []
    for _ in range(n):
        if not available.any():
            break
        score = np.full(len(candidates), -np.inf)
        score[available] = _ivr(weights, cov_tc[:, available], var_c[available], noise_c[available]) / cost[available]
        j = int(np.argmax(score))
        if not np.isfinite(score[j]) or score[j] <= 0:
            break
        picked.append(j)
        scores.append(float(score[j]))
        available[j] = False
        if len(picked) == n:
            break
        condition_on(j)
    return picked, scores


def relative_half_width(model, targets, confidence: float = 0.99) -> np.ndarray:
    """``(upper - mean) / mean`` of the predicted peak at each target (inf where mean <= 0)."""
    mean, upper = model.predict_many(_shapes(targets), confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, (upper - mean) / mean, np.inf)


#: The share of the bound's ``1 - confidence`` that the loop's evidence takes (:func:`risk_split`).
EVIDENCE_SHARE = 0.5


def risk_split(confidence: float, share: float | None = None) -> tuple[float, float]:
    r"""``(level, quantile)``: how a saved bound at ``confidence`` spends its ``1 - confidence``.

    A new run exceeds the saved bound only if the loop's evidence failed (its anytime-valid
    bound on how much the predictions understate their scale, :class:`ScaleEvidence`, does not
    hold: probability at most ``level``) or, the evidence holding, the run lies above the
    ``quantile`` of the certified predictive (probability at most ``1 - quantile``).  So
    ``P(run > bound) <= level + (1 - quantile) = 1 - confidence`` (a union bound) with
    ``level = share (1 - confidence)`` and ``quantile = 1 - (1 - share)(1 - confidence)``:
    the claim is per run, whatever loop made the model.  ``share``: :data:`EVIDENCE_SHARE`."""
    share = EVIDENCE_SHARE if share is None else share
    return share * (1.0 - confidence), 1.0 - (1.0 - share) * (1.0 - confidence)


@dataclass(frozen=True)
class StopTest:
    """One test of the stop rule: its name, whether it passed, and its numbers."""

    name: str
    passed: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name} {'passed' if self.passed else 'failed'} ({self.detail})"


@dataclass(frozen=True)
class ScaleEvidence:
    """How much a loop's predictions understated their scale, at most, with confidence: the
    anytime-valid bound ``factor`` (``explorer.model.stats.scale_confidence_bound``, taken no smaller
    than 1) from ``n_predictions`` profiles each predicted before it ran, at ``level`` (the loop's
    share of the risk, :func:`risk_split`);
    and ``quantile_ratio``, ``t(quantile) / t(confidence)`` of the model's predictive: the
    bound at ``confidence`` is the ``quantile`` of the predictive widened by ``factor``."""

    factor: float
    n_predictions: int
    level: float
    quantile: float = 0.99
    quantile_ratio: float = 1.0

    @property
    def certified_factor(self) -> float:
        """What the saved model's predictive scale is multiplied by: ``factor * quantile_ratio``."""
        return self.factor * self.quantile_ratio

    def describe(self) -> dict:
        return {"factor": self.factor, "predictions": self.n_predictions, "level": self.level,
                "quantile": self.quantile, "quantile_ratio": self.quantile_ratio}


@dataclass(frozen=True)
class StopDecision:
    """The stop rule's verdict: ``stop`` when every test passed."""

    half_width: float
    tests: tuple[StopTest, ...]
    #: The relative half-width at each target (``half_width`` is their largest).
    widths: np.ndarray | None = field(default=None, repr=False, compare=False)
    evidence: ScaleEvidence | None = None

    @property
    def tight(self) -> bool:
        return self.tests[0].passed

    @property
    def stop(self) -> bool:
        return all(t.passed for t in self.tests)

    @property
    def certified_half_width(self) -> float:
        """The largest relative half-width once the bound is widened by the evidence's factor."""
        return self.half_width * (self.evidence.certified_factor if self.evidence is not None else math.inf)

    def describe(self) -> str:
        return "; ".join(str(t) for t in self.tests)


def stop_decision(model, targets, *, tolerance: float = DEFAULT_TOLERANCE, confidence: float = 0.99,
                  evidence: ScaleEvidence | None = None) -> StopDecision:
    r"""The stop rule, the one place it is written: stop when the bound, widened by what the
    evidence cannot rule out, is tight over the target region.

    1. **tight**: the relative half-width ``w = (upper - mean) / mean`` of the model's bound at
       ``confidence`` is ``<= tolerance`` at every target.
    2. **evidence**: ``kappa_U r w <= tolerance`` at every target, where ``kappa_U >= 1``
       (``evidence.factor``) bounds, with confidence ``1 - level`` and however often it is
       looked at, how much the loop's predictions understated their scale: each profile was
       predicted by the model fitted before it ran, and its standardised residual is data on
       that factor (``explorer.model.stats.scale_confidence_bound``, an e-process per candidate
       factor).  A loop with few predictions has a large ``kappa_U`` (100 with none), so a
       model whose bound is tight on paper but untested does not stop; one whose residuals
       are larger than it claims does not either, until its own scale has learnt them.
       ``r = t(quantile) / t(confidence)`` (``evidence.quantile_ratio``) moves the bound to the
       quantile :func:`risk_split` leaves the run when the evidence takes its share.

    The saved model is ``model.certified(kappa_U r)`` (``ExplorationCore.certify``): its bound at
    ``confidence`` is the ``quantile`` of the predictive widened by ``kappa_U``, which a new run
    exceeds with probability at most ``1 - confidence`` (:func:`risk_split`), and which test 2
    says is within ``tolerance``.
    """
    targets = _shapes(targets)
    widths = relative_half_width(model, targets, confidence)
    half_width = float(np.max(widths)) if len(targets) else math.inf
    tests = [StopTest("tight", half_width <= tolerance,
                      f"{confidence:.0%} bound's relative half-width {half_width:.1%} vs tolerance {tolerance:.1%}")]
    if evidence is None:
        tests.append(StopTest("evidence", False, "no profile was predicted before it ran"))
    else:
        certified = half_width * evidence.certified_factor
        tests.append(StopTest(
            "evidence", certified <= tolerance,
            f"{evidence.n_predictions} profiles predicted before they ran bound "
            f"the scale's understatement by {evidence.factor:.2f} at {1 - evidence.level:.2%} (anytime); "
            f"at the {evidence.quantile:.1%} quantile that leaves: half-width {certified:.1%}"))
    return StopDecision(half_width, tuple(tests), widths, evidence)
