"""What a task needs inside a Dask worker beyond its isolated profile: the in-worker excess, the
spread of equal tasks, the cold first tasks, and a task's bound.

Memory: the in-worker excess
----------------------------
A task on a block ``b`` inside a worker holds, besides what the operator itself needs
(the isolated ``peak_bytes`` ``P(b)``), the block it reads from the file (or
concatenates from overlap pieces), its trimmed output (a copy:
``operators.base._windowed_task``), the store's encode buffers and the task's own overhead;
reused free heap can also make it smaller.  The excess is affine in the block's voxels
``V`` (measured while the trimmed output was a view, which the store copied: about 4 bytes
per voxel for gst3d, 10 for gaussian; the copy made in the task frees a float32 block sooner)::

    y_task(b) = P(b) + delta(b),    delta(b) = a + k V(b) + e,    e ~ N(0, s^2)

A fixed overhead lives in ``a`` and does not scale with the block, so a run on a small
file cannot inflate large plans through a ratio.

*Groups, and the spread within them.*  Tasks of one run on blocks of one shape share
the run's conditions (a random effect ``u_g`` of the group) and still differ from one
another: the worker's allocator holds a different amount of freed memory when each
starts (measured, gst3d 222x322x236 in one survey run: 1,313-1,624 MiB).  So a task is::

    y_gi = P(b_g) + a + k V_g + u_g + kappa_g C_gi + w_gi,    w_gi ~ sigma_w(m_g) T_{nu_w}

with ``C_gi = 1`` for the **cold** task, a worker's first of its run (``first_in_run``,
``explorer.measure.inworker``): it finds none of the run's freed memory to reuse and peaked highest on
each worker of the first-run trials.  Observations are grouped by (run, block shape); a
group's value is its mean warm task ``ybar_g`` (its mean task when its tasks are not told
apart: observations saved before the flag, or a group of one kind), and its excess
``r_g = ybar_g - P_mean(b_g)`` against the isolated model's mean.  Only exact observations
count (one thread per worker: ``explorer.runner.live``).

*Within a group* (:func:`fit_within`): the sample variances ``s_g^2`` of the groups
with two or more tasks, about their cold and warm means where told apart,
``d_g s_g^2 / sigma_w^2(m_g) ~ chi^2_{d_g}`` (``d_g = n_g - 1``, or ``n_g - 2`` with both
kinds), with the variance function ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` (an absolute floor, which the
small blocks show, and a spread proportional to the task's peak ``m``, which the large
ones show), fitted by maximum likelihood; ``alpha`` is at least the kernel's page (the
resolution of the high-water mark).  ``nu_w = sum d_g - 2`` degrees of freedom.

*The cold first task* (:func:`fit_cold`): ``kappa_g = k0 + k1 m_g``, a fixed part and a share
of the group's mean task, estimated from the groups holding both kinds (the probes run 8 tasks
on 2 workers: 2 cold, 6 warm) by weighted least squares of their cold-minus-warm means, with
its covariance.  The rule: a cold task is bounded ``max(0, kappa(m))`` above the warm ones, its
spread widened by the estimate's standard error at ``m`` (at its ``c``-quantile), so **no
offset is assumed only where the data put it at or below zero, and then only as precisely as
they measure it** (an offset of 0 +- 1 MiB still widens each cold task by that MiB).  Without
a group holding both kinds (old stores) there is no estimate, and the cold tasks stay inside
the within-group spread, as before the flag.

*Between groups.*  Ordinary least squares of ``r_g`` on ``x_g = [1, V_g / V_ref]`` over
``n`` groups (``p = 2`` coefficients, ``V_ref`` the largest group volume, for
conditioning): ``beta = (X^T X)^{-1} X^T r``, ``s^2 = sum e_g^2 / (n - p)``, and a new
group's excess is ``x^T beta`` with half-width ``delta_half = q_c s sqrt(1 + x^T (X^T X)^{-1} x)``,
``q_c`` the **conformal** rank quantile of the studentised deleted residuals
``t_g = e_g / (s_(g) sqrt(1 - h_gg))``: the ``ceil((n + 1) c)``-th smallest, a
distribution-free finite-sample guarantee for exchangeable groups, once there are enough
groups for that rank to exist (``n >= c / (1 - c)``: 99 at 99%).  Before that, ``q_c`` is
SciPy's Student-t quantile with ``n - p`` degrees of freedom, the exact prediction
interval under Gaussian residuals.  The count of equal tasks never narrows the between
term; it teaches the within term ``sigma_w``.

*The bound on the largest of a plan's n tasks* (:func:`task_bound`, confidence ``c``; a
plan's footprint must hold for every task it runs, on ``C`` slots (workers x threads)
``k = min(n, C)`` of them cold).  A task's peak is ``y_i = mean + S + D_i``::

    mean = mean_P(b) + x^T beta
    S    = a T_{nu_P} + b T_{n-p}        shared by the plan's tasks: the isolated model's
                                         predictive error (a = (upper_P - mean_P) / t_{nu_P}(c),
                                         MemoryModel.predictive_t's dof) and the line's
                                         (b = delta_half / t_{n-p}(c))
    D_i  = W_i  or  kappa + W_c          W_i = s_w sigma_w(mean) T_{nu_w} iid; cold: W_c the same
                                         with the offset's error added to its scale (sigma_c)

    upper = max(upper_P, mean + u),   P(S + max_i D_i <= u) = E_S[ F_W((u - S) / sigma)^(n-k)
                                                                  F_W((u - S - kappa) / sigma_c)^k ] = c

solved numerically (:func:`max_task_quantile`: quadrature over the narrower of ``S`` and
the largest ``D``, Newton's method for ``u``).  ``s_w`` stretches the Student-t until its
``c``-quantile is the conformal one of the tasks' scores once there are enough
(:meth:`WithinFit.tail_scale`).  ``n = 1`` is a single task's bound (the check of each
observation, told whether it was cold).  The rule before combined half-widths in quadrature,
``sqrt(h_P^2 + h_between^2 + h_within(c^(1/n))^2)`` with a Sidak quantile for the within
part: 97.8% (n = 9) and 96.3% (n = 100) of simulated plans at a nominal 99% with the shared
and the within scales alike (``scripts/bench_first_run.py`` step 0; 95.9% with two cold
tasks), because the shared error and the largest of many are not a sum of squares; the exact
quantile covers 98.95-99.03% (Monte Carlo sd 0.016%).  A task in a fresh worker never
needs less than its isolated profile: ``upper >= upper_P``.  With fewer than ``p + 1`` groups or
a single group volume the excess is not identified: no correction is applied and
``TaskModel.warnings`` says so.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, replace

import numpy as np

from explorer.model.stats import t_quantile
from explorer.plan.max_task import max_task_quantile

__all__ = [
    "ColdFit",
    "ExcessFit",
    "WithinFit",
    "fit_excess",
    "fit_cold",
    "fit_within",
    "task_bound",
    "task_groups",
]


#: Sources of in-worker observations (``explorer.search.store``): explore's probes, production tasks.
IN_WORKER_SOURCES = ("probe", "production")
#: Source of one record per observed run (wall time, slots, worker high-water mark).
RUN_SOURCE = "run"
#: Coefficients of the excess regression: intercept and bytes per voxel.
N_COEFFICIENTS = 2
#: Parameters of the within-group variance function: ``alpha`` and ``beta``.
N_WITHIN_PARAMETERS = 2


def conformal_rank(n: int, confidence: float) -> int | None:
    """``ceil((n + 1) c)``, the rank of the conformal quantile among ``n`` scores, or
    None when it exceeds ``n`` (too few scores for a finite bound at ``c``)."""
    k = math.ceil((n + 1) * confidence - 1e-12)
    return k if k <= n else None


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class ExcessFit:
    """The in-worker excess ``delta(V) = a + k V`` fitted to the groups' mean tasks (module docstring)."""

    #: ``[a, k * V_ref]`` in bytes (coefficients of ``x = [1, V / V_ref]``).
    coef: tuple[float, float]
    #: ``(X^T X)^{-1}``, row-major 2x2.
    xtx_inv: tuple[float, float, float, float]
    #: Residual standard deviation ``s`` (bytes) with ``n - p`` degrees of freedom.
    residual_sd: float
    n_groups: int
    v_ref: float
    #: Studentised deleted residuals, sorted (the conformal scores).
    scores: tuple[float, ...] = ()

    @property
    def dof(self) -> int:
        return self.n_groups - N_COEFFICIENTS

    @property
    def intercept_bytes(self) -> float:
        return self.coef[0]

    @property
    def bytes_per_voxel(self) -> float:
        return self.coef[1] / self.v_ref

    def quantile(self, confidence: float) -> tuple[float, str]:
        """``(q_c, method)``: conformal when enough groups, else Student-t with ``n - p`` dof."""
        k = conformal_rank(len(self.scores), confidence)
        if k is not None:
            return max(0.0, self.scores[k - 1]), "conformal"
        return t_quantile(float(confidence), float(self.dof)), "student-t"

    def predict(self, voxels, confidence: float) -> tuple[np.ndarray, np.ndarray]:
        """``(delta_mean, delta_half)`` in bytes at block volumes ``voxels``."""
        v = np.asarray(voxels, dtype=np.float64) / self.v_ref
        a, b = self.coef
        m00, m01, m10, m11 = self.xtx_inv
        leverage = m00 + (m01 + m10) * v + m11 * v * v
        q, _ = self.quantile(confidence)
        return a + b * v, q * self.residual_sd * np.sqrt(1.0 + np.maximum(leverage, 0.0))


def fit_excess(voxels, excess_bytes) -> ExcessFit | None:
    """Least squares of the group excesses on ``[1, V / V_ref]`` (module docstring); None
    when the excess is not identified (fewer than ``p + 1`` groups or one volume)."""
    v = np.asarray(voxels, dtype=np.float64).reshape(-1)
    r = np.asarray(excess_bytes, dtype=np.float64).reshape(-1)
    n = len(v)
    if n != len(r):
        raise ValueError("voxels and excess_bytes must have the same length")
    if n < N_COEFFICIENTS + 1 or len(np.unique(v)) < 2 or not np.all(np.isfinite(r)):
        return None
    v_ref = float(v.max())
    x = np.column_stack([np.ones(n), v / v_ref])
    xtx_inv = np.linalg.inv(x.T @ x)
    coef = xtx_inv @ (x.T @ r)
    residuals = r - x @ coef
    dof = n - N_COEFFICIENTS
    s2 = float(residuals @ residuals) / dof
    # Studentised deleted residuals: e / (s_(g) sqrt(1 - h)), s_(g)^2 the variance without g.
    hat = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    one_minus_h = np.maximum(1.0 - hat, 1e-12)
    if dof > 1:
        s2_deleted = np.maximum((dof * s2 - residuals**2 / one_minus_h) / (dof - 1), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.where(s2_deleted > 0, residuals / np.sqrt(s2_deleted * one_minus_h), 0.0)
    else:
        scores = np.zeros(n)
    return ExcessFit(coef=(float(coef[0]), float(coef[1])), xtx_inv=tuple(float(m) for m in xtx_inv.ravel()),
                     residual_sd=math.sqrt(s2), n_groups=n, v_ref=v_ref,
                     scores=tuple(sorted(float(t) for t in scores)))


@dataclass(frozen=True)
class WithinFit:
    """The spread of tasks within a group, ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` (module
    docstring), fitted by maximum likelihood to the groups' sample variances."""

    alpha_bytes: float
    beta: float
    #: ``sum (n_g - 1) - 2``: the degrees of freedom left for the bound's quantile.
    dof: int
    #: Each task's deviation from its group's mean in units of its standard deviation,
    #: ``(y_gi - ybar_g) / (sigma_w(ybar_g) sqrt(1 - 1/n_g))``, sorted (the conformal scores).
    scores: tuple[float, ...] = ()

    def sd(self, task_mean_bytes) -> np.ndarray:
        m = np.asarray(task_mean_bytes, dtype=np.float64)
        return np.sqrt(self.alpha_bytes**2 + (self.beta * m) ** 2)

    def quantile(self, confidence: float) -> tuple[float, str]:
        """``(q, method)``: the conformal rank quantile of the tasks' scores once there are
        enough of them (``ceil((N + 1) c) <= N``), else Student-t with ``nu_w`` dof.  Tasks
        in a worker have a heavier upper tail than a normal (an occasional task 3 sd above
        its group's mean): the rank quantile learns it from production's tasks."""
        method = "conformal" if conformal_rank(len(self.scores), confidence) is not None else "student-t"
        return float(self.quantiles([confidence])[0]), method

    def tail_scale(self, confidence: float) -> float:
        """``s_w``: the within-group deviation the bound on the largest of ``n`` tasks takes is
        ``W = s_w sigma_w(m) T_{nu_w}`` (:func:`task_bound`).  Once there are enough scores for the
        conformal rank quantile at ``confidence``, ``s_w = max(1, q_conformal / t_{nu_w}(c))``: the
        Student-t stretched until its ``c``-quantile is the scores' (they have shown a heavier
        upper tail than the t: gst3d's probes, 4.8 sd at the top of 112), never narrowed; else 1.
        Not the scores' empirical distribution itself: its steps of ``1 / (N + 1)`` sit exactly
        where the quantile of the largest of ``n`` is decided, and no cheap quadrature resolves
        them (3-7% off Monte Carlo with 15 nodes on gst3d's scores)."""
        return _tail_scale(self, float(confidence))

    def quantiles(self, confidences) -> np.ndarray:
        """:meth:`quantile` at each of ``confidences`` (vectorised: the planner's hot path)."""
        c = np.asarray(confidences, dtype=np.float64)
        q = student_t_quantiles(float(self.dof), c)
        n = len(self.scores)
        if n:
            ranks = np.ceil((n + 1) * c - 1e-12).astype(np.int64)
            conformal = ranks <= n
            scores = np.asarray(self.scores, dtype=np.float64)
            q = np.where(conformal, np.maximum(0.0, scores[np.minimum(ranks, n) - 1]), q)
        return q


@functools.lru_cache(maxsize=64)
def _tail_scale(within: WithinFit, confidence: float) -> float:
    """:meth:`WithinFit.tail_scale` (memoised: the planner asks it on every prediction)."""
    q, method = within.quantile(confidence)
    if method != "conformal":
        return 1.0
    return max(1.0, q / t_quantile(confidence, float(within.dof)))


#: Per ``dof``, the confidences :func:`student_t_quantiles` has met (sorted) and their t
#: quantiles; a table is started afresh past :data:`STUDENT_T_MEMO_SIZE` values.
_STUDENT_T_MEMO: dict[float, tuple[np.ndarray, np.ndarray]] = {}
STUDENT_T_MEMO_SIZE = 1 << 16


def student_t_quantiles(dof: float, confidences) -> np.ndarray:
    """``stdtrit(dof, c)`` at each of ``confidences``, memoised per value (a sorted table per
    ``dof``, looked up vectorised): a plan asks the within-group bound at ``c^(1 / n)`` for
    the task count ``n`` of every candidate, the same counts for every stage and strategy,
    and ``stdtrit`` (an iterative inversion, ~0.3 us a value) would otherwise cost more than
    the isolated model's prediction.  The same values as ``stdtrit`` (elementwise)."""
    c = np.asarray(confidences, dtype=np.float64)
    flat = c.ravel()
    keys, values = _STUDENT_T_MEMO.get(dof, (np.zeros(0), np.zeros(0)))
    index = np.minimum(np.searchsorted(keys, flat), max(len(keys) - 1, 0))
    if not len(keys) or not np.array_equal(keys[index], flat, equal_nan=True):
        from scipy.special import stdtrit

        new = np.unique(flat[~np.isin(flat, keys)])
        if len(keys) + len(new) > STUDENT_T_MEMO_SIZE:  # afresh, with every value asked now
            keys, values, new = np.zeros(0), np.zeros(0), np.unique(flat)
        keys = np.concatenate([keys, new])
        values = np.concatenate([values, stdtrit(dof, new)])
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        _STUDENT_T_MEMO[dof] = keys, values
        index = np.searchsorted(keys, flat)
    return values[index].reshape(c.shape)


def fit_within(mean_bytes, variances, n_tasks, deviations=(), dofs=None, cells=None) -> WithinFit | None:
    """Maximum likelihood of ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` from the groups' sample
    variances ``s_g^2`` (``d_g`` degrees of freedom each, at their means ``m_g``):
    maximises ``-sum d_g/2 (log sigma_w^2(m_g) + s_g^2 / sigma_w^2(m_g))`` with
    ``alpha >= `` the kernel's page.  None when fewer than ``3`` degrees of freedom remain
    (``sum d_g <= 2``): the between-group residual then carries the whole spread.

    ``dofs``: per group ``d_g``, by default ``n_g - 1``; a group whose cold and warm tasks are
    told apart has ``n_g - 2`` (its variance pooled about the two cells' means: ``task_groups``).
    ``deviations``: per group, its tasks' deviations from their cell's mean (for the conformal
    scores), each cell of ``cells`` tasks (per group an array per task; by default the group is
    one cell): a score is ``deviation / (sigma_w(m_g) sqrt(1 - 1 / cell))``."""
    from explorer.model.stats import fit_spread, page_bytes

    m = np.asarray(mean_bytes, dtype=np.float64).reshape(-1)
    s2 = np.asarray(variances, dtype=np.float64).reshape(-1)
    dof_g = (np.asarray(n_tasks, dtype=np.float64).reshape(-1) - 1.0 if dofs is None
             else np.asarray(dofs, dtype=np.float64).reshape(-1))
    keep = (dof_g > 0) & np.isfinite(s2) & np.isfinite(m)
    dof = int(dof_g[keep].sum()) - N_WITHIN_PARAMETERS
    if dof < 1:
        return None
    alpha, beta = fit_spread(m[keep], s2[keep], dof_g[keep], abs_floor=page_bytes())
    fit = WithinFit(alpha_bytes=float(alpha), beta=float(beta), dof=dof)
    scores = []
    for g, (mean, deviation) in enumerate(zip(m, deviations)):
        deviation = np.asarray(deviation, dtype=np.float64)
        cell = (np.full(len(deviation), float(len(deviation))) if cells is None
                else np.asarray(cells[g], dtype=np.float64))
        ok = cell > 1
        scores.extend(deviation[ok] / (float(fit.sd(abs(mean))) * np.sqrt(1.0 - 1.0 / cell[ok])))
    return replace(fit, scores=tuple(sorted(map(float, scores))))


@dataclass(frozen=True)
class ColdFit:
    """The cold first task's offset over its group's warm tasks (module docstring, *The cold
    first task*): ``kappa(m) = k0 + k1 m / m_ref`` at a warm mean task ``m``, the coefficients'
    covariance under the within spread (``cov``) and from the groups' own residuals
    (``cov_robust``, row-major 2x2 each), ``dof`` degrees of freedom, from ``n_groups`` groups
    holding both kinds.  One group or two: ``k1 = 0`` (no slope)."""

    coef: tuple[float, float]
    cov: tuple[float, float, float, float]
    m_ref: float
    dof: float
    n_groups: int
    cov_robust: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def offset(self, mean_bytes) -> np.ndarray:
        """``max(0, kappa(m))``: the offset the bound gives a cold task (cold tasks shown lower
        than warm ones are bounded as warm ones, with the estimate's error as extra spread)."""
        x = np.asarray(mean_bytes, dtype=np.float64) / self.m_ref
        return np.maximum(0.0, self.coef[0] + self.coef[1] * x)

    def error(self, mean_bytes, confidence: float, within_dof: float) -> np.ndarray:
        """The estimate's standard error at ``m``, the larger of ``sqrt(x^T cov x)`` and
        ``sqrt(x^T cov_robust x)`` with ``x = [1, m / m_ref]``, as a spread of each cold task in
        the units of a Student-t with ``within_dof``: times ``t_dof(c) / t_{nu_w}(c)`` (its
        ``c``-quantile kept).  Added to each cold task
        independently: their maxima then come out no smaller than with the one shared error it
        stands for (Slepian: less correlated maxima are larger)."""
        x = np.asarray(mean_bytes, dtype=np.float64) / self.m_ref
        variance = [c00 + (c01 + c10) * x + c11 * x * x for c00, c01, c10, c11 in (self.cov, self.cov_robust)]
        se = np.sqrt(np.maximum(np.maximum(*variance), 0.0))
        c = float(confidence)
        return se * (t_quantile(c, float(self.dof)) / t_quantile(c, float(within_dof)))


def fit_cold(warm_mean, cold_mean, n_warm, n_cold, within: WithinFit | None) -> ColdFit | None:
    """Weighted least squares of the groups' cold-minus-warm means ``d_g = ybar_cold - ybar_warm``
    on ``x_g = [1, m_g / m_ref]`` (``m_g`` the warm mean, ``m_ref`` the largest): an offset with a
    fixed part (gst3d's probes: +0.5-1 MiB on 24^3 blocks of 0.7 MiB) and a part that grows with
    the task (none shown on its 250^3 blocks of 1.4 GiB).  ``var(e_g) = sigma_w^2(m_g) (1/n_cold +
    1/n_warm)`` (:class:`WithinFit`), ``w = 1 / var``; ``coef = A^{-1} X^T W d`` with ``A = X^T W X``,
    ``cov = A^{-1}`` (right when the within spread is the whole story) and ``cov_robust =
    A^{-1} (sum_g w_g^2 e_g^2 x_g x_g^T) A^{-1} G / (G - p)`` (the sandwich, HC1: from the groups'
    own residuals, so an offset that varies between tiny blocks more than their tasks' spread
    explains widens the fixed part's error, not the slope's on large blocks); the bound takes the
    larger of the two at each ``m``, with ``G - p`` dof (the within fit's with ``G = p``).
    ``p = 2`` from three groups, else the fixed part alone.  None without a group holding both
    kinds, or without a within fit."""
    m = np.asarray(warm_mean, dtype=np.float64).reshape(-1)
    d = np.asarray(cold_mean, dtype=np.float64).reshape(-1) - m
    nw, nc = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (n_warm, n_cold))
    both = (nw > 0) & (nc > 0) & np.isfinite(d) & np.isfinite(m) & (m > 0)
    if within is None or not both.any():
        return None
    m, d = m[both], d[both]
    groups = int(both.sum())
    m_ref = float(m.max())
    w = 1.0 / np.maximum(within.sd(m) ** 2 * (1.0 / nc[both] + 1.0 / nw[both]), 1e-300)
    p = 2 if groups >= 3 and len(np.unique(m)) > 1 else 1
    x = np.column_stack([np.ones(groups), m / m_ref])[:, :p]
    information = np.linalg.inv((x * w[:, None]).T @ x)
    coef = information @ ((x * w[:, None]).T @ d)
    residual = d - x @ coef
    meat = (x * (w * residual)[:, None]).T @ (x * (w * residual)[:, None])
    cov, robust = np.zeros((2, 2)), np.zeros((2, 2))
    cov[:p, :p] = information
    if groups > p:
        robust[:p, :p] = information @ meat @ information * (groups / (groups - p))
    return ColdFit(coef=(float(coef[0]), float(coef[1]) if p == 2 else 0.0),
                   cov=tuple(float(v) for v in cov.ravel()), m_ref=m_ref,
                   dof=float(groups - p) if groups > p else float(within.dof), n_groups=groups,
                   cov_robust=tuple(float(v) for v in robust.ravel()))


@dataclass(frozen=True)
class TaskGroups:
    """In-worker tasks, one group per (run, block shape) (module docstring).  A group whose
    every task says whether it was its worker's first of the run (``first_in_run``) and that
    holds both kinds has its cold and warm tasks apart: its mean is the warm tasks', its
    variance pooled about the two means (``dofs = n - 2``).  Otherwise (observations saved
    before the flag, or one kind only) the group is one cell, as before the flag."""

    shapes: np.ndarray  # (n, 3) int64 block shapes
    peak_bytes: np.ndarray  # (n,) the group's largest task
    mean_bytes: np.ndarray  # (n,) the group's mean warm task (all its tasks when not told apart)
    variances: np.ndarray  # (n,) the group's sample variance about its cells' means (0 for a single task)
    n_tasks: np.ndarray  # (n,) tasks in the group
    sources: tuple[str, ...]  # the group's source ("probe" or "production")
    deviations: tuple = ()  # per group, its tasks' peaks minus their cell's mean
    dofs: np.ndarray | None = None  # (n,) degrees of freedom of the variance
    cells: tuple = ()  # per group, the size of each task's cell
    cold_mean: np.ndarray | None = None  # (n,) the cold tasks' mean (NaN: not told apart)
    n_cold: np.ndarray | None = None  # (n,) cold tasks (0 when not told apart)
    n_warm: np.ndarray | None = None  # (n,) warm tasks (all when not told apart)


def _is_in_worker(record, environment: str | None) -> bool:
    return (record.source in IN_WORKER_SOURCES and record.status == "ok" and record.peak_bytes is not None
            and bool(record.context.get("exact", False))
            and (environment is None or record.context.get("environment") == environment))


def task_groups(records, environment: str | None = None) -> TaskGroups:
    """Group exact in-worker observations by (run, block shape); ``environment``: keep only
    those whose workers had this :func:`environment_digest`."""
    groups: dict[tuple, list] = {}
    for r in records:
        if _is_in_worker(r, environment):
            key = (str(r.context.get("run", "")), tuple(int(n) for n in r.shape))
            groups.setdefault(key, []).append(r)
    keys = sorted(groups)
    columns = {name: [] for name in ("peak", "mean", "var", "n", "dof", "dev", "cells", "cold_mean", "n_cold",
                                     "n_warm")}
    for k in keys:
        peaks = np.asarray([float(r.peak_bytes) for r in groups[k]])
        flags = [r.context.get("first_in_run") for r in groups[k]]
        cold = np.asarray([bool(f) for f in flags])
        apart = all(f is not None for f in flags) and cold.any() and not cold.all()
        if apart:
            cells = [peaks[~cold], peaks[cold]]
            deviation = np.where(cold, peaks - cells[1].mean(), peaks - cells[0].mean())
            size = np.where(cold, float(cold.sum()), float((~cold).sum()))
            dof = len(peaks) - 2
            mean, cold_mean = cells[0].mean(), cells[1].mean()
        else:
            deviation, size, dof = peaks - peaks.mean(), np.full(len(peaks), float(len(peaks))), len(peaks) - 1
            mean, cold_mean = peaks.mean(), np.nan
        columns["peak"].append(peaks.max())
        columns["mean"].append(mean)
        columns["var"].append(float(deviation @ deviation) / dof if dof > 0 else 0.0)
        columns["n"].append(len(peaks))
        columns["dof"].append(dof)
        columns["dev"].append(deviation)
        columns["cells"].append(size)
        columns["cold_mean"].append(cold_mean)
        columns["n_cold"].append(int(cold.sum()) if apart else 0)
        columns["n_warm"].append(int((~cold).sum()) if apart else len(peaks))
    as_float = lambda name: np.asarray(columns[name], dtype=np.float64)  # noqa: E731
    return TaskGroups(
        shapes=np.asarray([k[1] for k in keys], dtype=np.int64).reshape(-1, 3),
        peak_bytes=as_float("peak"), mean_bytes=as_float("mean"), variances=as_float("var"),
        n_tasks=np.asarray(columns["n"], dtype=np.int64), sources=tuple(groups[k][0].source for k in keys),
        deviations=tuple(columns["dev"]), dofs=as_float("dof"), cells=tuple(columns["cells"]),
        cold_mean=as_float("cold_mean"), n_cold=as_float("n_cold"), n_warm=as_float("n_warm"),
    )


def task_bound(mean_isolated, upper_isolated, voxels, excess: ExcessFit | None, within: WithinFit | None,
               confidence: float, tasks=1, *, cold=None, cold_fit: ColdFit | None = None,
               isolated_dof: float = math.inf, ceiling=None):
    r"""``(mean, upper)`` bytes of the largest of ``tasks`` tasks of one plan in workers (module
    docstring), from the isolated model's ``(mean_P, upper_P)`` at ``c``::

        mean  = mean_P + delta_mean(V)
        upper = max(upper_P, mean + u),   u: P(S + max_i D_i <= u) = c   (max_task_quantile)

    with the shared error ``S = a T_{nu_P} + b T_{n-p}``, ``a = (upper_P - mean_P) / t_{nu_P}(c)``
    (the isolated predictive's scale, ``isolated_dof`` its dof: ``MemoryModel.predictive_t``),
    ``b = delta_half(V) / t_{n-p}(c)`` (the excess's, whichever quantile ``delta_half`` took), and
    per task ``D_i = W_i`` (warm, ``W_i = s_w sigma_w(mean) T_{nu_w}``: :meth:`WithinFit.tail_scale`)
    or ``kappa + W_c`` (cold, ``kappa = max(0, kappa(mean))``, ``W_c`` with the offset's error at
    ``mean`` added to its spread: :class:`ColdFit`).

    ``tasks`` (scalar or per row): how many tasks the bound covers; ``cold`` (scalar or per row):
    how many of them are their worker's first (default ``min(tasks, 1)``: a run has at least one,
    and a task of unknown order is bounded as one).  The isolated bound alone when the excess
    is not identified.  ``ceiling`` (per row, optional): rows shown above it or at or below it
    are not solved (:func:`max_task_quantile`: ``upper`` a lower, resp. an upper bound); returns
    ``(mean, upper, state)`` then."""
    mean_isolated = np.asarray(mean_isolated, dtype=np.float64)
    upper_isolated = np.asarray(upper_isolated, dtype=np.float64)
    if excess is None:
        return (mean_isolated, upper_isolated) if ceiling is None else \
            (mean_isolated, upper_isolated, np.zeros(mean_isolated.shape, dtype=np.int8))
    c = float(confidence)
    d_mean, d_half = excess.predict(voxels, c)
    mean = mean_isolated + d_mean
    a = np.maximum(upper_isolated - mean_isolated, 0.0) / t_quantile(c, float(isolated_dof))
    b = d_half / t_quantile(c, float(excess.dof))
    sigma = within.sd(mean) * within.tail_scale(c) if within is not None else 0.0
    tasks = np.maximum(np.asarray(tasks, dtype=np.float64), 1.0)
    cold = np.minimum(tasks, 1.0) if cold is None else np.asarray(cold, dtype=np.float64)
    kappa, cold_sd = 0.0, None
    if cold_fit is not None and within is not None:
        kappa = cold_fit.offset(mean)
        cold_sd = np.hypot(sigma, cold_fit.error(mean, c, within.dof))
    solved = max_task_quantile(c, (a, b), (float(isolated_dof), float(excess.dof)), sigma, tasks, cold=cold,
                               cold_offset=kappa, cold_sd=cold_sd,
                               within_dof=math.inf if within is None else float(within.dof),
                               ceiling=None if ceiling is None else np.asarray(ceiling, dtype=np.float64) - mean)
    u, state = (solved, None) if ceiling is None else solved
    upper = np.maximum(upper_isolated, mean + u.reshape(mean.shape))
    return (mean, upper) if ceiling is None else (mean, upper, state.reshape(mean.shape))


_PREDICTIVE_DOF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _predictive_dof(model) -> float:
    """The degrees of freedom of ``model``'s Student-t predictive (``predictive_t(shapes) ->
    (location, scale, dof)``: ``explorer.model.memory_model.MemoryModel``, ``explorer.model.composed.ComposedModel``);
    a model without one is taken as normal (``inf``).  Memoised per model object (models are
    cached by their files' mtimes)."""
    try:
        return _PREDICTIVE_DOF[model]
    except (KeyError, TypeError):
        pass
    predictive = getattr(model, "predictive_t", None)
    dof = math.inf if predictive is None else float(predictive(np.full((1, 3), 32, dtype=np.int64))[2])
    dof = dof if dof > 0 else math.inf
    try:
        _PREDICTIVE_DOF[model] = dof
    except TypeError:
        pass
    return dof
