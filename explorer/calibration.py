r"""What a task costs inside a Dask worker beyond its isolated profile: memory and time.

Core, not edge: ``recommend_chunks`` applies the saved calibration by reading one small
JSON file (:func:`load_calibration`), without the store or distributed.  The data come
from in-worker observations (``explorer.live``): explore's probes (``source="probe"``,
run by ``explorer.probes`` before any production run) and production tasks
(``source="production"``).  Definitions: ``docs/definitions.md``.

Memory: the in-worker excess
----------------------------
A task on a block ``b`` inside a worker holds, besides what the operator itself needs
(the isolated ``peak_bytes`` ``P(b)``), the block it reads from the file (or
concatenates from overlap pieces), the trimmed output copied for the store, the store's encode buffers and the task's own
overhead; reused free heap can also make it smaller.  The excess is affine in the
block's voxels ``V`` (measured: about 4 bytes per voxel for gst3d, 10 for gaussian)::

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
count (one thread per worker: ``explorer.live``).

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

Time
----
From the same observations' clocks (``explorer.live`` reports each operator task's
seconds, the seconds inside ``operator.run``, and the seconds of the worker's other
tasks, reads and overlap slices, since its previous report), least-squares lines in the
block's voxel count ``V`` (a task has fixed costs, opening the input, Python and the
scheduler's bookkeeping, that a ratio of sums would charge per voxel: on small blocks
they dominate)::

    run_seconds                            ~ a_op + operator_seconds_per_voxel * V
    task_seconds - run_seconds + other     ~ a_io + io_seconds_per_voxel * V

(the ratio of sums when the blocks have a single volume, or a line comes out with a
negative slope or intercept): what a task costs per voxel at the margin, shown to users.

The planner's time model takes a task's whole cost at each block volume instead
(:func:`fit_clock`, an ``explorer.chunking.TaskClock``): per observed volume ``V`` the
tasks' total ``task_seconds + other`` over their total voxels (the other tasks' seconds go
to whichever operator task reports next: only their sum is the tasks' cost), so a task's
fixed costs stay with the small blocks that pay them and a large block that runs slower per
voxel (caches, fresh pages) is charged what it costs; and per volume the median coefficient
of variation ``sigma`` of the tasks' own ``task_seconds`` in groups of >= 3 equal tasks (one
run, one shape), the spread list scheduling of near-equal tasks pays in its last wave
(``explorer.chunking.schedule_waves``).  From the runs' wall times ``W`` (``source="run"``
records) the same time model is solved for a run's fixed seconds ``F`` and the overhead per
graph task ``g``, at each run's mean task volume ``V`` (:func:`fit_run_overheads`)::

    W - waves(n, C, sigma(V)) s(V) V = F + g * waves(n, C, sigma(V)) * tasks_per_chunk

by least squares (``F, g >= 0``) once the runs' graph tasks per slot differ enough to tell
the two apart (the probes make sure they do), else ``F = 0``.  These
replace ``explorer.chunking``'s defaults once a probe or a production run has taught them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import uuid
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from explorer.core import paths
from explorer.core.environment import environment_digest
from explorer.chunking import TaskClock, row_product
from explorer.model.stats import t_quantile

__all__ = [
    "CALIBRATION_FILE",
    "CalibrationFileError",
    "ColdFit",
    "ExcessFit",
    "StandardDistribution",
    "TaskModel",
    "WithinFit",
    "TimingFit",
    "WorkerCalibration",
    "calibrate",
    "calibration_path",
    "fit_excess",
    "fit_clock",
    "fit_cold",
    "fit_run_overheads",
    "fit_timing",
    "fit_within",
    "load_calibration",
    "max_task_quantile",
    "student_t_distribution",
    "task_bound",
    "task_groups",
    "task_model",
]

#: Calibration file name under ``runs/<operator>/``.
CALIBRATION_FILE = "calibration.json"
#: Bumped when the saved layout changes (a file of another version is not used).
FORMAT_VERSION = 3
#: Sources of in-worker observations (``explorer.store``): explore's probes, production tasks.
IN_WORKER_SOURCES = ("probe", "production")
#: Source of one record per observed run (wall time, slots, worker high-water mark).
RUN_SOURCE = "run"
#: Coefficients of the excess regression: intercept and bytes per voxel.
N_COEFFICIENTS = 2
#: Parameters of the within-group variance function: ``alpha`` and ``beta``.
N_WITHIN_PARAMETERS = 2


class CalibrationFileError(ValueError):
    """A saved calibration file cannot be read (one line naming the file and the fix)."""


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


# --------------------------------------------------------------------------- the largest of n tasks


#: The standardised distributions below are tabulated on one grid, uniform in
#: ``y = z / (1 + |z| / Z0)``: spacing 0.0078 near 0, wider in the tails, ``|z|`` up to ~8,000.
_Z0 = 16.0
_TABLE_SIZE = 4096
_Y_MAX = _Z0 * (1.0 - 1.0 / 512.0)
_TABLE_Y = np.linspace(-_Y_MAX, _Y_MAX, _TABLE_SIZE)
_TABLE_Z = _TABLE_Y / (1.0 - np.abs(_TABLE_Y) / _Z0)
_INV_DY = 1.0 / (_TABLE_Y[1] - _TABLE_Y[0])
_LAST = _TABLE_SIZE - 1.000001


def _grid_index(z) -> tuple[np.ndarray, np.ndarray]:
    """``(i, frac)``: where ``z`` falls on the tables' grid (clipped to its ends)."""
    p = np.abs(z)
    p *= 1.0 / _Z0
    p += 1.0
    np.divide(z, p, out=p)
    p += _Y_MAX
    p *= _INV_DY
    np.maximum(p, 0.0, out=p)
    np.minimum(p, _LAST, out=p)
    i = p.astype(np.intp)
    p -= i
    return i, p


def _lerp(table, i, frac):
    low = table[i]
    return low + (table[i + 1] - low) * frac


def _pairs(first, second) -> np.ndarray:
    """``(N, 4)``: each grid point's ``first``, its step to the next, ``second``, its step:
    one gather (``np.take`` along rows) interpolates both (:func:`_log_terms`)."""
    return np.stack([first, np.diff(first, append=first[-1]), second, np.diff(second, append=second[-1])], axis=1)


class StandardDistribution:
    """A standardised distribution tabulated on the grid: ``F``, the density ``f``, ``log F``,
    ``f / F`` (for the largest of ``n``: ``G = F^n``, ``log G = n log F``), and its quantile
    at ``logit p`` (a second table, uniform in ``logit p`` on [-60, 60])."""

    _LOGIT = 60.0
    _N_LOGIT = 8192

    def __init__(self, cdf, density):
        F = np.clip(np.maximum.accumulate(np.asarray(cdf, dtype=np.float64)), 1e-300, 1.0)
        self.F, self.f = F, np.maximum(np.asarray(density, dtype=np.float64), 0.0)
        self.log_F = np.log(F)
        self.dlog_F = self.f / F
        self.log_pairs = _pairs(self.log_F, self.dlog_F)
        #: :class:`_Tables`' layout of this distribution alone (float32: one gather's temporary
        #: stays small; ``log F`` to a relative 6e-8), and ``d(f / F) / dz`` with its step in the
        #: columns a table's ``theta`` differences take (for :func:`_max_nodes`' Halley steps).
        self.rows = np.zeros((_TABLE_SIZE, 8), dtype=np.float32)
        self.rows[:, :4] = self.log_pairs
        curvature = np.gradient(self.dlog_F, _TABLE_Z)
        self.rows[:, 4:6] = _pairs(curvature, curvature)[:, :2]
        logit = self.log_F - np.log(np.clip(1.0 - F, 1e-300, 1.0))
        rising = np.concatenate([[True], np.diff(logit) > 0])
        levels = np.linspace(-self._LOGIT, self._LOGIT, self._N_LOGIT)
        self._q_of_logit = np.interp(levels, logit[rising], _TABLE_Z[rising])
        self._q_scale = (self._N_LOGIT - 1) / (2 * self._LOGIT)

    def quantile_at_logit(self, logit) -> np.ndarray:
        """``F^{-1}(p)`` at ``logit p`` (elementwise)."""
        p = np.clip((np.asarray(logit, dtype=np.float64) + self._LOGIT) * self._q_scale, 0.0,
                    self._N_LOGIT - 1.000001)
        i = p.astype(np.intp)
        return _lerp(self._q_of_logit, i, p - i)

    def max_quantiles(self, levels: tuple, count) -> np.ndarray:
        """``(m, len(levels))``: the ``levels``-quantiles of the largest of ``count`` draws (per row;
        tabulated at ``count = 2^0 .. 2^30``, linear in ``log2 count`` between: within about
        ``0.01`` of the standard scale, a starting point, not an answer)."""
        tables = self.__dict__.setdefault("_max_quantiles", {})
        table = tables.get(levels)
        if table is None:
            log_q = np.log(np.asarray(levels, dtype=np.float64))[:, None] / 2.0 ** np.arange(31)[None, :]
            table = tables[levels] = self.quantile_at_logit(log_q - np.log(-np.expm1(log_q))).T.copy()
        position = np.minimum(np.log2(np.maximum(np.asarray(count, dtype=np.float64), 1.0)), 29.999999)
        j = position.astype(np.intp)
        low = table[j]
        return low + (table[j + 1] - low) * (position - j)[:, None]

    def max_quantiles_above(self, levels: tuple, count) -> np.ndarray:
        """:meth:`max_quantiles` at the next power of two at or above ``count``: the largest of
        more draws, so no less (for an upper bound)."""
        self.max_quantiles(levels, [1.0])
        table = self.__dict__["_max_quantiles"][levels]
        j = np.minimum(np.ceil(np.log2(np.maximum(np.asarray(count, dtype=np.float64), 1.0)) - 1e-9), 30.0)
        return table[j.astype(np.intp)]

    def max_range(self, count) -> np.ndarray:
        """The 10-90% range of the largest of ``count`` draws (elementwise; tabulated at
        ``count = 2^0 .. 2^30``, linear in ``log2 count`` between)."""
        table = getattr(self, "_max_range", None)
        if table is None:
            powers = 2.0 ** np.arange(31)
            spread = [self.quantile_at_logit(lq - np.log(-np.expm1(lq))) for lq in
                      (math.log(0.9) / powers, math.log(0.1) / powers)]
            table = self._max_range = spread[0] - spread[1]
        return np.interp(np.log2(np.maximum(count, 1.0)), np.arange(31.0), table)


@functools.lru_cache(maxsize=64)
def student_t_distribution(dof: float) -> StandardDistribution:
    """The standard Student-t with ``dof`` degrees of freedom (``inf``: the normal), tabulated."""
    from scipy.special import gammaln, ndtr, stdtr

    dof = float(dof)
    z = _TABLE_Z
    if math.isinf(dof):
        return StandardDistribution(ndtr(z), np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi))
    log_c = gammaln((dof + 1.0) / 2.0) - gammaln(dof / 2.0) - 0.5 * math.log(dof * math.pi)
    return StandardDistribution(stdtr(dof, z), np.exp(log_c - (dof + 1.0) / 2.0 * np.log1p(z * z / dof)))


#: Columns of the shared error's table: ``theta`` in ``[0, pi/2]`` in this many steps (``log F``
#: linear in ``theta`` between them: the quantile's error about ``(pi/32)^2 / 8 = 1e-3`` of it).
THETA_STEPS = 16


@functools.lru_cache(maxsize=256)
def _sum_column(dof1: float, dof2: float, j: int) -> StandardDistribution:
    """``Z = cos(theta) T_1 + sin(theta) T_2`` at ``theta = j pi / (2 THETA_STEPS)`` (independent
    standard Student-t's with ``dof1``, ``dof2``): ``F(z) = E[F_a((z - s T_b) / c)]`` over the
    component with the smaller weight ``s`` (the other's ``c >= s``: its cdf is the smoother), at
    its quantiles: 24 Gauss-Hermite nodes in the normal score with 10 or more dof, else the
    trapezoid rule in ``logit p`` on 61 nodes (a column costs 5-15 ms, once per process)."""
    t1, t2 = (student_t_distribution(d) for d in (dof1, dof2))
    if j == 0:
        return t1
    if j == THETA_STEPS:
        return t2
    theta = j * (math.pi / 2.0) / THETA_STEPS
    cos, sin = math.cos(theta), math.sin(theta)
    (big, wide), (small, narrow, small_dof) = ((t1, cos), (t2, sin, dof2)) if cos >= sin else \
        ((t2, sin), (t1, cos, dof1))
    rule = _Rule(24, gauss_hermite=True) if small_dof >= 10.0 else _Rule(61, -30.0, 30.0)
    i, frac = _grid_index((_TABLE_Z[:, None] - narrow * small.quantile_at_logit(rule.logit)[None, :]) / wide)
    return StandardDistribution(_lerp(big.F, i, frac) @ rule.w, (_lerp(big.f, i, frac) @ rule.w) / wide)


#: The slot of the within-group distribution in :class:`_Tables` (after the shared error's columns).
_WITHIN_SLOT = THETA_STEPS + 1


class _Tables:
    """What a bound's evaluation gathers from, in one array of 8-wide rows per grid point:
    ``log F`` and ``f / F`` with their steps to the next grid point (:func:`_pairs`), then the
    same of the next slot's minus this one's (``log F`` linear in ``theta`` between two columns
    in one gather).  Slots ``0 .. THETA_STEPS``: the shared error's columns (:func:`_sum_column`,
    copied in when first needed, with their neighbour); slot :data:`_WITHIN_SLOT`: the
    within-group distribution (its differences zero).  And each built column's quantiles at
    levels asked before (memoised)."""

    def __init__(self, dof1: float, dof2: float, within: StandardDistribution):
        self.dofs = (float(dof1), float(dof2))
        self.rows = np.zeros(((_WITHIN_SLOT + 1) * _TABLE_SIZE, 8), dtype=np.float32)
        self.rows[_WITHIN_SLOT * _TABLE_SIZE:, :4] = within.rows[:, :4]
        self.F = np.zeros((THETA_STEPS + 1, _TABLE_SIZE))
        self.built = np.zeros(THETA_STEPS + 1, dtype=bool)
        self.version = 0  # bumped when a column is built (the quantiles' memo is then refilled)
        self._quantiles: dict = {}

    def _slot(self, j: int) -> np.ndarray:
        return self.rows[j * _TABLE_SIZE:(j + 1) * _TABLE_SIZE]

    def build(self, columns) -> None:
        """Columns ``columns`` and, for each, the next one (its ``theta`` difference)."""
        columns = np.asarray(columns)
        if self.built[columns].all() and self.built[np.minimum(columns + 1, THETA_STEPS)].all():
            return
        for j in np.unique(np.minimum(np.concatenate([np.asarray(columns), np.asarray(columns) + 1]), THETA_STEPS)):
            if not self.built[j]:
                column = _sum_column(*self.dofs, int(j))
                self.F[j] = column.F
                self._slot(j)[:, :4] = column.rows[:, :4]
                self.built[j] = True
                self.version += 1
                for lower in (j - 1, j):
                    if 0 <= lower < THETA_STEPS and self.built[lower] and self.built[lower + 1]:
                        upper, here = _sum_column(*self.dofs, lower + 1), _sum_column(*self.dofs, lower)
                        self._slot(lower)[:, 4:] = upper.log_pairs - here.log_pairs

    def quantiles(self, levels: tuple) -> np.ndarray:
        """``(THETA_STEPS + 1, len(levels))``: each built column's quantiles at ``levels``."""
        entry = self._quantiles.get(levels)
        if entry is not None and entry[1] == self.version:
            return entry[0]
        table = np.full((THETA_STEPS + 1, len(levels)), np.nan) if entry is None else entry[0]
        for j in np.flatnonzero(self.built & np.isnan(table[:, 0])):
            table[j] = np.interp(levels, self.F[j], _TABLE_Z)
        self._quantiles[levels] = (table, self.version)
        return table


@functools.lru_cache(maxsize=8)
def _tables(dof1: float, dof2: float, within: StandardDistribution) -> _Tables:
    return _Tables(dof1, dof2, within)


class _Rule:
    """A quadrature over an integrated variable's quantiles ``p_k`` (``logit`` their log-odds)
    with weights ``w_k``: the
    trapezoid rule in ``v = logit p`` on ``[v_lo, v_hi]`` (weights ``p_k (1 - p_k)`` normalised),
    or, with ``gauss_hermite``, Gauss-Hermite in the normal score ``Phi^{-1}(p)`` with that many
    nodes (spectrally accurate when the variable's quantile is smooth in its normal score: light
    tails)."""

    def __init__(self, nodes: int, v_lo: float = 0.0, v_hi: float = 0.0, *, gauss_hermite: bool = False):
        if gauss_hermite:
            from numpy.polynomial.hermite_e import hermegauss
            from scipy.special import log_ndtr, ndtr

            z, w = hermegauss(nodes)
            self.p = ndtr(z)
            self.logit = log_ndtr(z) - log_ndtr(-z)
        else:
            v = np.linspace(v_lo, v_hi, nodes)
            self.p = 1.0 / (1.0 + np.exp(-v))
            self.logit = v
            w = self.p * (1.0 - self.p)
        self.w = w / w.sum()
        self.levels = tuple(float(p) for p in self.p)


#: Every Student-t involved with 10 or more dof: 8 Gauss-Hermite nodes.  Against numerical
#: integration (the configurations below with ``c`` 95% to 99.9%, ``n`` 1 to 1,000, with and
#: without cold tasks): within ``1.8e-3 (a + sigma)``, median ``2e-5``.
LIGHT_RULE = _Rule(8, gauss_hermite=True)
#: 5 or more dof: 15 trapezoid nodes in ``logit p`` to ``p = 1 - 3e-10`` (the integrated
#: variable's lower tail matters little, the other's cdf is ~1 there; its upper tail holds the
#: ``1 - c``): within ``2.5e-3 (a + sigma)``, median ``2e-4``.
QUADRATURE_RULE = _Rule(15, -6.0, 22.0)
#: Fewer than 5: within ``4e-4 (a + sigma)`` down to 4 dof; with 3 dof, ``1e-4`` at 99%, 2.5% at
#: 99.9%.  (An error of ``1e-3 (a + sigma)`` in ``u`` is one of about ``3e-5`` in ``P`` at 99%.)
FINE_RULE = _Rule(97, -14.0, 28.0)


def _rule(dof: float) -> _Rule:
    """The quadrature for the smallest dof among the Student-t's a bound involves."""
    return LIGHT_RULE if dof >= 10.0 else QUADRATURE_RULE if dof >= 5.0 else FINE_RULE
#: Rows are solved in blocks of at most this many: the temporaries stay under glibc's 128 KiB
#: mmap threshold (above it each is a fresh mapping whose page faults took 4x the time here).
BLOCK_ROWS = 256
#: :func:`max_task_quantile`'s states of a row not solved: its ``u`` a lower bound above the
#: ceiling, or an upper bound at or below it.
ABOVE, BELOW = 1, 2


def max_task_quantile(confidence: float, shared_scales, shared_dofs, within_sd, tasks, *, cold=0, cold_offset=0.0,
                      cold_sd=None, within_dof: float = math.inf, ceiling=None):
    r"""The ``c``-quantile ``u`` of ``S + max_i D_i`` over ``n`` tasks, per row (bytes above the
    tasks' common location).

    ``S = a T_1 + b T_2`` is shared by all the tasks of a plan (``shared_scales`` ``(a, b)``,
    ``shared_dofs`` ``(nu_1, nu_2)``: independent standard Student-t's); ``D_i = W_i`` for the
    ``n - k`` warm tasks and ``kappa + sigma_c Z_i`` for the ``k`` cold ones (``cold`` ``k``,
    ``cold_offset`` ``kappa``, ``cold_sd`` ``sigma_c``, by default ``sigma``), ``W_i = sigma Z_i`` iid
    (``within_sd`` ``sigma``; ``Z`` a standard Student-t with ``within_dof``).  With
    ``G(x) = F_Z(x / sigma)^{n-k} F_Z((x - kappa) / sigma_c)^k`` the distribution function of the
    largest ``D``::

        P(S + max_i D_i <= u) = E_S[ G(u - S) ] = E_M[ F_S(u - M) ] = c

    solved for ``u`` by Newton's method on ``logit P`` from the quadrature sum of the two
    ``c``-quantiles (the rule this replaces, ``sqrt(Q_S(c)^2 + Q_M(c)^2)``, usually a little
    below), steps at most one spread long and bisected inside the bracket the evaluations have
    found, until a step is under 1% of the spread (the error left is of its square).  The
    expectation is taken over whichever of ``S`` and ``M`` is the narrower (10-90% range), at
    its quantiles (:func:`_rule`: Gauss-Hermite in the normal score when every Student-t
    involved has 10 or more dof, else the trapezoid rule in ``logit p``): the other's
    distribution function is then smooth on the nodes' scale.  ``S``'s quantiles and ``F_S``
    come from a table of ``cos(theta) T_1 + sin(theta) T_2`` over ``theta = atan(b / a)``
    (columns every ``pi / 32``, ``log F`` linear between them); ``M``'s quantiles are
    ``sigma F_Z^{-1}(p^{1/n})`` without cold tasks, else found by Newton's method on ``log G``
    from the larger factor's.  Rows go in blocks of :data:`BLOCK_ROWS`, one Newton iteration
    per block (:func:`_solve_block`).

    ``n = 1`` without cold tasks: the quantile of ``S + W``; ``sigma = 0``: ``Q_S(c)`` plus the
    cold offset when there is a cold task; ``a = b = 0``: ``G^{-1}(c)``.

    ``ceiling`` (per row, optional): a row whose lower bound ``L`` is above it, or whose upper
    bound ``U`` is at or below it, is not solved: its ``u`` is that bound.  Returns ``(u, state)``
    then, ``state`` 0 where solved, :data:`ABOVE` where ``u = L``, :data:`BELOW` where ``u = U``.
    ``L = Q_S(c) + kappa [k >= 1]`` holds for ``c >= 1/2``: ``S`` and ``W`` are symmetric and
    unimodal (Student-t's and their sums), so for either, ``P(X + Y <= Q_X(c)) = E[(F_X(Q_X - |Y|)
    + F_X(Q_X + |Y|)) / 2] <= c`` (the mass of ``X`` just above ``Q_X`` is no more than just below
    it), and ``max_i D_i >= D_1`` (a cold one when any).  ``U = min_s Q_S(1 - s(1 - c)) +
    max(sigma, kappa + sigma_c) Q_n(1 - (1 - s)(1 - c))`` over ``s`` in 0.1, 0.3, 0.5, 0.7
    (Bonferroni: ``P(S > x) + P(M > y) = 1 - c``; ``Q_n(p) = F_Z^{-1}(p^{1/n})``, at the power of
    two at or above ``n``, bounds ``M``'s quantile: each warm factor of ``G`` is then at least
    ``p^{1/n}``, each cold one too), plus 0.1% for the tables' interpolation.  On gst3d's plans
    ``U`` is 1.2-1.5 times ``u``, and still shows 92% of the candidates a planner predicts to fit.
    """
    c = float(confidence)
    a = np.maximum(np.asarray(shared_scales[0], dtype=np.float64).reshape(-1), 0.0)
    rows = len(a)

    def per_row(value):
        value = np.asarray(value, dtype=np.float64)
        return np.full(rows, float(value.reshape(-1)[0])) if value.size == 1 else value.reshape(rows)

    b = np.maximum(per_row(shared_scales[1]), 0.0)
    sigma, n, kappa = per_row(within_sd), np.maximum(per_row(tasks), 1.0), np.maximum(per_row(cold_offset), 0.0)
    stretch = np.ones(rows) if cold_sd is None else \
        np.where(sigma > 0, per_row(cold_sd) / np.where(sigma > 0, sigma, 1.0), 1.0)
    k = np.where((kappa > 0) | (stretch != 1.0), np.minimum(per_row(cold), n), 0.0)
    dof1, dof2 = (float(d) for d in shared_dofs)
    within = student_t_distribution(float(within_dof))
    tables = _tables(dof1, dof2, within)
    rule = _rule(min(dof1 if (a > 0).any() else math.inf, dof2 if (b > 0).any() else math.inf,
                     float(within_dof) if (sigma > 0).any() else math.inf))
    limit = None if ceiling is None else per_row(ceiling)
    u, state = np.empty(rows), np.zeros(rows, dtype=np.int8)
    for start in range(0, rows, BLOCK_ROWS):
        part = slice(start, start + BLOCK_ROWS)
        u[part], state[part] = _solve_block(c, a[part], b[part], tables, sigma[part], n[part] - k[part], k[part],
                                            kappa[part], stretch[part], within, rule,
                                            None if limit is None else limit[part])
    return u if ceiling is None else (u, state)


def _max_levels(sigma, kappa, warm, cold, log_p, within: StandardDistribution, stretch=1.0):
    """The larger of the warm maximum's and the cold maximum's ``p``-quantiles,
    ``sigma F^{-1}(p^(1 / (n - k)))`` and ``kappa + stretch sigma F^{-1}(p^(1 / k))``: a lower bound
    of ``M``'s (``G`` is at most either factor), and ``M``'s own without cold tasks."""
    out = None
    for count, shift, scale in ((warm, 0.0, sigma), (cold, kappa, sigma * stretch)) if (cold > 0).any() \
            else ((warm, 0.0, sigma),):
        log_q = log_p / np.maximum(count, 1.0)
        x = shift + scale * within.quantile_at_logit(log_q - np.log(-np.expm1(log_q)))
        x = np.where(count > 0, x, -np.inf)
        out = x if out is None else np.maximum(out, x)
    return out


def _log_terms(rows, z, base, weight):
    """``L`` and ``dL / dz`` at ``z`` in slot ``base`` of ``rows`` (:class:`_Tables`), with
    ``weight`` of the next slot's difference (``None``: none)."""
    i, frac = _grid_index(z)
    t = np.take(rows, i + base, axis=0)
    log_g = t[..., 0] + t[..., 1] * frac
    slope = t[..., 2] + t[..., 3] * frac
    if weight is not None:
        log_g += (t[..., 4] + t[..., 5] * frac) * weight
        slope += (t[..., 6] + t[..., 7] * frac) * weight
    return log_g, slope


def _newton(evaluate, u, scale, target: float, iterations: int = 40, rtol: float = 1e-2):
    """``u`` with ``logit P(u) = target`` per row (``P`` increasing; ``evaluate(u) -> (P, P')``)
    from ``u``: Newton's steps of at most ``scale``, bisection when one leaves the bracket the
    evaluations have found; stops once every step is below ``rtol scale`` (quadratic
    convergence: the step taken then leaves an error of order its square)."""
    low, high = np.full(u.shape, -np.inf), np.full(u.shape, np.inf)
    tolerance = rtol * scale
    for _ in range(iterations):
        P, slope = evaluate(u)
        np.maximum(P, 1e-300, out=P)
        np.minimum(P, 1.0 - 1e-16, out=P)
        q = 1.0 - P
        f = np.log(P / q)
        f -= target
        below = f < 0
        np.copyto(low, u, where=below)
        np.copyto(high, u, where=~below)
        step = f * P * q
        step /= np.maximum(slope, 1e-300)
        np.maximum(step, -scale, out=step)
        np.minimum(step, scale, out=step)
        new = u - step
        outside = (new <= low) | (new >= high)
        if outside.any():
            new[outside] = 0.5 * (low[outside] + high[outside])
        elif (np.abs(step) <= tolerance).all():
            return new
        u = new
    return u


def _solve_block(c, a, b, tables: _Tables, sigma, warm, cold, kappa, stretch, within, rule, ceiling=None):
    """:func:`max_task_quantile` on one block of rows: each row's expectation as
    ``P(u) = sum_k w_k exp(c L(z_k) + k L_Z((z_k - kappa / sigma) / r))``, ``z_k = alpha u - beta_k``,
    ``r = sigma_c / sigma``:
    over ``S`` (``L = log F_Z``, ``c = n - k``, ``alpha = 1 / sigma``, ``beta_k = s_k / sigma``) or
    over ``M`` (``L = log F_S``, linear in ``theta`` between the shared error's two nearest
    columns, ``c = 1``, no cold term, ``alpha = 1 / rho``, ``beta_k = m_k / rho``): one Newton
    iteration for the whole block."""
    rows = len(a)
    rho = np.hypot(a, b)
    if (b > 0).any():
        position = np.arctan2(b, a) * (THETA_STEPS / (math.pi / 2.0))
        j = np.minimum(position.astype(np.intp), THETA_STEPS - 1)
        theta_frac = position - j
        tables.build(j)
    else:
        j, theta_frac = np.zeros(rows, dtype=np.intp), np.zeros(rows)
        tables.build([0])

    def shared_quantiles(at, levels: tuple):
        table = tables.quantiles(levels)
        jj, w = j[at], theta_frac[at, None]
        low = table[jj]
        if (w > 0).any():
            low = low + (table[np.minimum(jj + 1, THETA_STEPS)] - low) * w
        return low * rho[at, None]

    q = shared_quantiles(slice(None), (0.1, 0.9, c))
    has_cold = cold > 0
    u = q[:, 2] + np.where(has_cold, kappa, 0.0)  # sigma = 0; else a lower bound (max_task_quantile)
    still = sigma <= 0  # no spread within: the largest task is the cold offset above the rest
    state = np.zeros(rows, dtype=np.int8)
    if ceiling is not None:
        state[~still & (u > ceiling)] = ABOVE
        shares = (0.1, 0.3, 0.5, 0.7)
        s_part = shared_quantiles(slice(None), tuple(1.0 - s * (1.0 - c) for s in shares))
        widest = np.maximum(sigma, np.where(has_cold, sigma * stretch, 0.0))[:, None]
        m_part = np.where(has_cold, kappa, 0.0)[:, None] + widest * within.max_quantiles_above(
            tuple(1.0 - (1.0 - s) * (1.0 - c) for s in shares), warm + cold)
        upper = s_part + m_part
        upper = upper.min(axis=1) + 1e-3 * (np.abs(s_part) + np.abs(m_part)).max(axis=1)
        below = ~still & (state == 0) & (upper <= ceiling)
        u[below], state[below] = upper[below], BELOW
        still = still | (state != 0)
    if still.all():
        return u, state
    todo = slice(None) if not still.any() else np.flatnonzero(~still)
    if not isinstance(todo, slice):
        q, j, theta_frac, rho = q[todo], j[todo], theta_frac[todo], rho[todo]
        sigma, warm, cold, kappa, has_cold = sigma[todo], warm[todo], cold[todo], kappa[todo], has_cold[todo]
        stretch = stretch[todo]
    sig = sigma
    spread_m = sig * within.max_range(np.maximum(warm, 1.0)) + np.where(has_cold, kappa, 0.0)
    scale = q[:, 1] - q[:, 0] + spread_m
    largest = sig * within.max_quantiles((c,), warm)[:, 0]
    if has_cold.any():
        largest = np.where(warm > 0, largest, -np.inf)
        largest = np.maximum(largest, np.where(has_cold, kappa + sig * stretch * within.max_quantiles((c,), cold)[:, 0],
                                               -np.inf))
    start = np.hypot(np.maximum(q[:, 2], 0.0), np.maximum(largest, 0.0))
    over_m = (q[:, 1] - q[:, 0]) > spread_m  # S the wider: integrate over M
    alpha = np.where(over_m, 1.0 / np.maximum(rho, 1e-300), 1.0 / sig)
    beta = np.empty((len(sig), len(rule.p)))
    over_s = np.flatnonzero(~over_m)
    if len(over_s):
        beta[over_s] = shared_quantiles(over_s, rule.levels) / sig[over_s, None]
    at = np.flatnonzero(over_m)
    if len(at):
        beta[at] = _max_nodes(sig[at, None], kappa[at, None], warm[at, None], cold[at, None], stretch[at, None],
                              rule, within) / np.maximum(rho[at], 1e-300)[:, None]
    coef = np.where(over_m, 1.0, warm)[:, None]
    mix = np.where(over_m, theta_frac, 0.0)[:, None] if (theta_frac[over_m] > 0).any() else None
    base = (np.where(over_m, j, _WITHIN_SLOT) * _TABLE_SIZE)[:, None]
    few = np.where(over_m, 0.0, cold)[:, None] if (cold[~over_m] > 0).any() else None
    shift = np.where(over_m, 0.0, kappa / sig)[:, None]
    narrow = (1.0 / stretch)[:, None]
    rows_, weights = tables.rows, rule.w

    def evaluate(x):
        z = (x * alpha)[:, None] - beta
        log_g, slope = _log_terms(rows_, z, base, mix)
        log_g *= coef
        slope *= coef
        if few is not None:  # the cold tasks' factor F((x - kappa) / sigma_c)^k
            log_c, slope_c = _log_terms(rows_, (z - shift) * narrow, _WITHIN_SLOT * _TABLE_SIZE, None)
            log_g += log_c * few
            slope += slope_c * (few * narrow)
        g = np.exp(log_g)
        slope *= g
        return g @ weights, (slope @ weights) * alpha
    u[todo] = _newton(evaluate, start, scale, math.log(c) - math.log1p(-c))
    return u, state


def _max_nodes(sigma, kappa, warm, cold, stretch, rule: _Rule, within: StandardDistribution):
    """``M``'s quantiles at the rule's levels (``(m, 1)`` columns in, ``(m, K)`` out): without
    cold tasks in closed form, else by Halley's method on ``log G(x) = log p`` from the larger
    factor's (tabulated: :meth:`StandardDistribution.max_quantiles`), steps at most ``sigma``,
    until every step is under ``1e-3 sigma``."""
    if not (cold > 0).any():
        return _max_levels(sigma, kappa, warm, cold, np.log(rule.p)[None, :], within)
    log_p = np.log(rule.p)[None, :]
    x = np.maximum(np.where(warm > 0, sigma * within.max_quantiles(rule.levels, warm[:, 0]), -np.inf),
                   np.where(cold > 0, kappa + sigma * stretch * within.max_quantiles(rule.levels, cold[:, 0]), -np.inf))
    inv, kappa_z, narrow = 1.0 / sigma, kappa / sigma, 1.0 / stretch
    rows = within.rows
    for _ in range(20):
        z = x * inv
        log_g, slope, bend = _curved_terms(rows, z)
        log_c, slope_c, bend_c = _curved_terms(rows, (z - kappa_z) * narrow)
        f = warm * log_g + cold * log_c - log_p
        d1 = np.maximum(warm * slope + cold * narrow * slope_c, 1e-300)
        d2 = warm * bend + cold * narrow * narrow * bend_c
        # Halley's step, at most twice Newton's and one sigma long
        step = 2.0 * f * d1 / np.maximum(2.0 * d1 * d1 - f * d2, d1 * d1) * sigma
        np.maximum(step, -sigma, out=step)
        np.minimum(step, sigma, out=step)
        x = x - step
        if (np.abs(step) <= 1e-3 * sigma).all():
            break
    return x


def _curved_terms(rows, z):
    """``log F``, ``f / F`` and its derivative at ``z`` (a distribution's own ``rows``)."""
    i, frac = _grid_index(z)
    t = np.take(rows, i, axis=0)
    return t[..., 0] + t[..., 1] * frac, t[..., 2] + t[..., 3] * frac, t[..., 4] + t[..., 5] * frac


# --------------------------------------------------------------------------- time


@dataclass(frozen=True)
class TimingFit:
    """Seconds a Dask run spends, learnt from the workers' clocks (module docstring)."""

    operator_seconds_per_voxel: float | None
    io_seconds_per_voxel: float | None
    graph_task_seconds: float | None
    n_tasks: int
    n_runs: int
    #: The planner's time per task at each observed block volume, and equal tasks' spread.
    clock: TaskClock | None = None
    #: A run's fixed seconds apart from its tasks and their graph overhead (:func:`fit_run_overheads`).
    run_fixed_seconds: float | None = None

    @property
    def seconds_per_voxel(self) -> float | None:
        """``operator + io``: the planner's seconds per block voxel, or None when not learnt."""
        if self.operator_seconds_per_voxel is None or self.io_seconds_per_voxel is None:
            return None
        return self.operator_seconds_per_voxel + self.io_seconds_per_voxel


def _slope_through(volume: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """``(slope, intercept)`` of ``seconds ~ intercept + slope * volume`` by least squares,
    or the ratio of sums and 0 when the volumes do not identify a slope (fewer than two
    distinct volumes, or a slope that comes out negative)."""
    ratio = float(seconds.sum() / volume.sum())
    if len(np.unique(volume)) < 2:
        return ratio, 0.0
    slope, intercept = np.polyfit(volume, seconds, 1)
    if slope <= 0 or intercept < 0:
        return ratio, 0.0
    return float(slope), float(intercept)


def fit_clock(rows) -> TaskClock | None:
    """The :class:`~explorer.chunking.TaskClock` of in-worker tasks ``(run, shape, seconds,
    own_seconds[, worker])`` in the order the workers reported them (module docstring):
    ``seconds`` what the worker spent for the task (its own seconds and the other tasks'
    since its previous report), ``own_seconds`` the task's own.

    A worker's first task of a run is slower than its later ones: it faults in the fresh
    pages its arrays need, which the later ones find in the process's heap (gst3d's 150^3
    probes: 0.72 and 0.80 s first on each worker, 0.42-0.47 s after).  A run of many waves
    is made of the later ones, so per volume (and shape) the figure is the median of the
    tasks that were not their worker's first in their run, where there are any (rows
    without a worker all count as such).

    Per block volume the seconds per voxel are the tasks' total over their voxels: the other
    tasks' seconds (reads, overlap slices) go to whichever operator task reports next, often
    the first of a run on each worker, so only their sum means anything (a median per task
    left most of the reading out: gaussian(sigma=1),semblance,gaussian's 195^3 probes, 0.50 s
    against a mean of 0.65 s).  The same figure per exact block shape makes the clock's
    shape table (:class:`~explorer.chunking.TaskClock`).  The spread is, per volume, the median over groups of three or
    more equal tasks (one run, one shape) of the coefficient of variation of the tasks' *own*
    seconds, for the same reason (with the reads attributed, 0.42-0.84; without, 0.06-0.45)."""
    own_by_volume: dict[int, tuple[list, list]] = {}
    other_by_volume: dict[int, list[float]] = {}
    own_by_shape: dict[tuple, tuple[list, list]] = {}
    other_by_shape: dict[tuple, list[float]] = {}
    groups: dict[tuple, list[float]] = {}
    started: set = set()
    for row in rows:
        run, shape, seconds, own = row[:4]
        worker = row[4] if len(row) > 4 else None
        shape = tuple(int(n) for n in shape)
        volume = math.prod(shape)
        warm = worker is None or (run, worker) in started
        started.add((run, worker))
        own_by_volume.setdefault(volume, ([], []))[warm].append(own / volume)
        other_by_volume.setdefault(volume, []).append((seconds - own) / volume)
        own_by_shape.setdefault(shape, ([], []))[warm].append(own / volume)
        other_by_shape.setdefault(shape, []).append((seconds - own) / volume)
        groups.setdefault((run, shape), []).append(own)
    by_volume = own_by_volume
    if not by_volume:
        return None

    def typical(cold_and_warm) -> float:
        cold, warm = cold_and_warm
        return float(np.median(warm if warm else cold))
    spread_by_volume: dict[int, list[float]] = {}
    for (_run, shape), seconds in groups.items():
        s = np.asarray(seconds)
        if len(s) >= 3 and s.mean() > 0:
            spread_by_volume.setdefault(math.prod(shape), []).append(float(s.std(ddof=1) / s.mean()))
    volumes = sorted(by_volume)
    spread_volumes = sorted(spread_by_volume)
    shapes = sorted(own_by_shape)
    return TaskClock(volumes=tuple(float(v) for v in volumes),
                     seconds_per_voxel=tuple(typical(own_by_volume[v]) + float(np.mean(other_by_volume[v]))
                                             for v in volumes),
                     spread_volumes=tuple(float(v) for v in spread_volumes),
                     spreads=tuple(float(np.median(spread_by_volume[v])) for v in spread_volumes),
                     shapes=tuple(shapes),
                     shape_seconds_per_voxel=tuple(typical(own_by_shape[b]) + float(np.mean(other_by_shape[b]))
                                                   for b in shapes))


def fit_timing(records, environment: str | None = None) -> TimingFit:
    """Operator and I/O seconds per voxel from in-worker task clocks, the planner's
    :class:`~explorer.chunking.TaskClock` from the same clocks, and the overhead per graph
    task from the runs' wall times (module docstring).

    Only tasks of one-thread workers are timed: the clock is a task's seconds alone in its
    worker, as the probes run them, and ``T`` tasks sharing a worker's cores each take longer
    (on 2x4 threads here, trials of gst3d's blocks timed that way drove the planner from every
    shape it had timed to 140 chunks of 37x52x64, twice as slow)."""
    from explorer.chunking import schedule_waves

    rows, runs, clocked = [], [], []
    for r in records:
        if (r.source not in IN_WORKER_SOURCES or r.status != "ok"
                or (environment is not None and r.context.get("environment") != environment)
                or int(r.context.get("threads_per_worker") or 1) > 1):
            continue
        c = r.context
        task, inside = c.get("task_seconds"), c.get("run_seconds")
        if task is None or inside is None:
            continue
        other = float(c.get("other_seconds") or 0.0)
        rows.append((float(math.prod(r.shape)), float(inside), max(0.0, float(task) - float(inside)) + other))
        runs.append(str(c.get("run", "")))
        own = max(float(task), float(inside))
        clocked.append((runs[-1], tuple(r.shape), own + other, own, c.get("worker")))
    if not rows:
        return TimingFit(None, None, None, 0, 0)
    volume, inside, around = (np.asarray(col) for col in zip(*rows))
    operator_slope, _ = _slope_through(volume, inside)
    io_slope, _ = _slope_through(volume, around)
    clock = fit_clock(clocked)
    per_run_volume: dict[str, list[float]] = {}
    for run, v in zip(runs, volume):
        per_run_volume.setdefault(run, []).append(float(v))
    walls = []
    for r in records:
        if r.source != RUN_SOURCE or r.status != "ok":
            continue
        c = r.context
        volumes = per_run_volume.get(str(c.get("run", "")))
        needed = ("seconds", "n_tasks", "slots", "tasks_per_chunk")
        if not volumes or any(c.get(k) is None for k in needed):
            continue
        mean_volume = float(np.mean(volumes))
        waves = float(schedule_waves(c["n_tasks"], c["slots"], clock.spread_at(mean_volume)))
        walls.append((float(c["seconds"]), waves * float(c["tasks_per_chunk"]),
                      waves * float(clock.seconds_per_voxel_at(mean_volume)) * mean_volume))
    fixed, per_graph_task = fit_run_overheads(walls)
    return TimingFit(
        operator_seconds_per_voxel=operator_slope,
        io_seconds_per_voxel=io_slope,
        graph_task_seconds=per_graph_task,
        n_tasks=len(rows),
        n_runs=len(walls),
        clock=clock,
        run_fixed_seconds=fixed,
    )


#: Runs identify a fixed cost apart from the overhead per graph task only when their graph
#: tasks per slot (``waves x tasks_per_chunk``) differ by at least this factor.
RUN_OVERHEAD_SPREAD = 1.5


def fit_run_overheads(walls) -> tuple[float | None, float | None]:
    """``(F, g)``: a run's fixed seconds and the seconds per graph task, from runs' wall times
    ``(W, x, c)`` with ``x = waves * tasks_per_chunk`` (graph tasks on the busiest slot) and
    ``c = waves * s(V) V`` (its tasks' work, from the clock)::

        W - c = F + g x

    by least squares with ``F, g >= 0`` when the runs' ``x`` differ by
    :data:`RUN_OVERHEAD_SPREAD` or more (the probes run their smallest block on a finer grid
    for this: ``explorer.probes``).  Otherwise ``F`` is not identified apart from ``g``: ``F =
    0`` and ``g`` the median of ``(W - c) / x``, which charges a run's fixed seconds (submitting
    the graph, gathering the result, starting and stopping the observation) to its graph tasks:
    a plan with more waves is then charged them again.  ``(None, None)`` without a run."""
    if not walls:
        return None, None
    wall, x, work = (np.asarray(col, dtype=np.float64) for col in zip(*walls))
    y = wall - work
    if len(x) < 2 or x.max() < RUN_OVERHEAD_SPREAD * x.min():
        return 0.0, float(np.median(np.maximum(0.0, y / x)))
    g, fixed = np.polyfit(x, y, 1)
    if g < 0:
        return float(max(0.0, np.median(y))), 0.0
    if fixed < 0:
        return 0.0, float(max(0.0, (x * y).sum() / (x * x).sum()))
    return float(fixed), float(g)


# --------------------------------------------------------------------------- the calibration


@dataclass
class WorkerCalibration:
    """The in-worker excess and timings of one operator, as saved in ``calibration.json``.

    ``excess`` is None while not identified (see the module docstring); ``environment``
    is the workers' stamp (``explorer.core.environment``) the observations were made in;
    ``within`` the spread of tasks within a group (None while fewer than three degrees
    of freedom); ``cold`` the offset of a worker's first task of a run (None without a group
    holding both kinds: files saved before the flag, or observations without it);
    ``n_groups_over_bound`` counts the groups whose largest task is above the bound on the
    largest of their tasks at ``confidence``, in sample (a diagnostic).
    """

    operator: str
    excess: ExcessFit | None
    timing: TimingFit
    n_groups: int
    n_probe_groups: int
    n_tasks: int
    confidence: float
    n_groups_over_bound: int
    environment: dict | None
    within: WithinFit | None = None
    updated: float = field(default_factory=time.time)
    cold: ColdFit | None = None
    #: Differences from this process's environment, set by :func:`load_calibration`.
    stale: list = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("stale")
        out["format_version"] = FORMAT_VERSION
        if self.excess is not None:
            out["excess"].update(bytes_per_voxel=self.excess.bytes_per_voxel,
                                 intercept_bytes=self.excess.intercept_bytes, dof=self.excess.dof,
                                 method=self.excess.quantile(self.confidence)[1])
        if self.within is not None:
            out["within"]["method"] = self.within.quantile(self.confidence)[1]
        if self.cold is not None:
            out["cold"]["intercept_bytes"], slope = self.cold.coef[0], self.cold.coef[1] / self.cold.m_ref
            out["cold"]["bytes_per_byte"] = slope
        out["timing"]["seconds_per_voxel"] = self.timing.seconds_per_voxel
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerCalibration":
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format {data.get('format_version')} != {FORMAT_VERSION}")
        excess = data.get("excess")
        if excess is not None:
            excess = ExcessFit(coef=tuple(excess["coef"]), xtx_inv=tuple(excess["xtx_inv"]),
                               residual_sd=float(excess["residual_sd"]), n_groups=int(excess["n_groups"]),
                               v_ref=float(excess["v_ref"]), scores=tuple(excess.get("scores") or ()))
            values = [*excess.coef, *excess.xtx_inv, excess.residual_sd, excess.v_ref]
            if len(excess.coef) != 2 or len(excess.xtx_inv) != 4 or not all(map(math.isfinite, values)) \
                    or excess.residual_sd < 0 or excess.v_ref <= 0 or excess.n_groups <= N_COEFFICIENTS:
                raise ValueError("the excess fit is malformed")
        within = data.get("within")
        if within is not None:
            within = WithinFit(alpha_bytes=float(within["alpha_bytes"]), beta=float(within["beta"]),
                               dof=int(within["dof"]), scores=tuple(within.get("scores") or ()))
            if not (math.isfinite(within.alpha_bytes) and math.isfinite(within.beta) and within.alpha_bytes >= 0
                    and within.beta >= 0 and within.dof >= 1):
                raise ValueError("the within-group fit is malformed")
        cold = data.get("cold")
        if cold is not None:
            cold = ColdFit(coef=tuple(float(v) for v in cold["coef"]), cov=tuple(float(v) for v in cold["cov"]),
                           m_ref=float(cold["m_ref"]), dof=float(cold["dof"]), n_groups=int(cold["n_groups"]),
                           cov_robust=tuple(float(v) for v in cold.get("cov_robust") or (0.0,) * 4))
            values = [*cold.coef, *cold.cov, *cold.cov_robust, cold.m_ref]
            if len(cold.coef) != 2 or len(cold.cov) != 4 or len(cold.cov_robust) != 4 \
                    or not all(map(math.isfinite, values)) \
                    or cold.m_ref <= 0 or cold.dof <= 0:
                raise ValueError("the cold-task fit is malformed")
        t = data["timing"]
        timing = TimingFit(**{k: t.get(k) for k in ("operator_seconds_per_voxel", "io_seconds_per_voxel",
                                                    "graph_task_seconds", "run_fixed_seconds")},
                           n_tasks=int(t.get("n_tasks") or 0), n_runs=int(t.get("n_runs") or 0),
                           clock=TaskClock.from_dict(t["clock"]) if t.get("clock") else None)
        return cls(operator=str(data["operator"]), excess=excess, timing=timing, n_groups=int(data["n_groups"]),
                   n_probe_groups=int(data.get("n_probe_groups", 0)), n_tasks=int(data["n_tasks"]),
                   confidence=float(data["confidence"]), n_groups_over_bound=int(data["n_groups_over_bound"]),
                   environment=data.get("environment"), within=within, updated=float(data.get("updated", 0.0)),
                   cold=cold)


def calibration_path(operator: str, runs_dir=None) -> Path:
    """``<runs>/<operator>/calibration.json``."""
    return paths.operator_dir(operator, runs_dir) / CALIBRATION_FILE


def calibrate(operator: str, store, model, *, confidence: float = 0.99, runs_dir=None,
              environment: dict | None = None, save: bool = True) -> WorkerCalibration | None:
    """The calibration of ``operator`` from the in-worker observations in ``store``.

    ``model`` is the operator's isolated ``MemoryModel`` (the excess is against its mean);
    ``environment``: the workers' stamp (default: this process's), whose observations
    are used and which the saved file carries.  Saved atomically to
    :func:`calibration_path` (``runs_dir`` defaults to the store's) unless ``save=False``.
    None when there is no in-worker observation at all.
    """
    from explorer.core.environment import environment_stamp

    stamp = dict(environment) if environment else environment_stamp(operator)
    digest = environment_digest(stamp)
    records = store.records(operator)
    groups = task_groups(records, digest)
    timing = fit_timing(records, digest)
    if len(groups.peak_bytes) == 0 and timing.n_tasks == 0:
        return None
    excess, within, cold, over = None, None, None, 0
    if len(groups.peak_bytes):
        mean, upper = model.predict_many(groups.shapes, confidence)
        voxels = groups.shapes.prod(axis=1).astype(np.float64)
        excess = fit_excess(voxels, groups.mean_bytes - mean)
        within = fit_within(groups.mean_bytes, groups.variances, groups.n_tasks, groups.deviations, groups.dofs,
                            groups.cells)
        cold = fit_cold(groups.mean_bytes, groups.cold_mean, groups.n_warm, groups.n_cold, within)
        if excess is not None:
            _, bound = task_bound(mean, upper, voxels, excess, within, confidence, groups.n_tasks,
                                  cold=np.maximum(groups.n_cold, 1.0), cold_fit=cold,
                                  isolated_dof=_predictive_dof(model))
            over = int((groups.peak_bytes > bound).sum())
    result = WorkerCalibration(
        operator=operator, excess=excess, timing=timing, n_groups=len(groups.peak_bytes),
        n_probe_groups=sum(s == "probe" for s in groups.sources), n_tasks=int(groups.n_tasks.sum()),
        confidence=float(confidence), n_groups_over_bound=over, environment=stamp, within=within, cold=cold)
    if save:
        runs = runs_dir if runs_dir is not None else getattr(store, "runs_dir", None)
        _save(result, calibration_path(operator, runs))
    return result


def _save(cal: WorkerCalibration, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(cal.to_dict(), f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_CACHE: dict[tuple[str, int], WorkerCalibration] = {}


def load_calibration(operator: str, runs_dir=None, environment: dict | None = None) -> WorkerCalibration | None:
    """The saved calibration of ``operator``, or None when there is none (cached by mtime).

    Cheap (one small JSON file; neither distributed nor the store).  A file that is not a
    calibration of this version raises :class:`CalibrationFileError` naming the file and
    the command that rebuilds it.  ``cal.stale`` lists how ``environment`` (default: this
    process's) differs from the one it was learnt in.
    """
    from explorer.core.environment import WORKER_KEYS, environment_stamp, stamp_differences

    path = calibration_path(operator, runs_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    key = (str(path), mtime)
    cal = _CACHE.get(key)
    if cal is None:
        try:
            with open(path) as f:
                data = json.load(f)
            if isinstance(data, dict) and isinstance(data.get("format_version"), int) \
                    and data["format_version"] != FORMAT_VERSION:
                # Saved by another version of this tool: not this version's evidence, and
                # not a broken file either.  Used as none (``TaskModel.warnings`` names the fix).
                import warnings

                warnings.warn(f"{path} was saved by another version of memory-explorer (calibration format "
                              f"{data['format_version']}, this one reads {FORMAT_VERSION}): not used; run "
                              f"`{paths.explore_command(operator)}` to rebuild it", RuntimeWarning, stacklevel=2)
                return None
            cal = WorkerCalibration.from_dict(data)
        except Exception as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise CalibrationFileError(
                f"{path} is not a readable calibration ({type(exc).__name__}: {reason[:120]}): run "
                f"`{paths.explore_command(operator)}` to rebuild it (its in-worker probes), or delete the file") from None
        _CACHE[key] = cal
    current = environment or environment_stamp(operator)
    return _with_stale(cal, stamp_differences(cal.environment, current, WORKER_KEYS))


def _with_stale(cal: WorkerCalibration, stale: list) -> WorkerCalibration:
    if stale == cal.stale:
        return cal
    copy = WorkerCalibration(**{f: getattr(cal, f) for f in cal.__dataclass_fields__})
    copy.stale = stale
    return copy


# --------------------------------------------------------------------------- the task model


class TaskModel:
    """Peak memory of an operator's task inside a Dask worker: the isolated model plus the
    in-worker excess (module docstring).  ``predict_many`` is the predictor
    ``explorer.chunking.plan_chunks`` takes; ``warnings`` (one line each) says what the
    bound does not know (no calibration, a stale model or calibration)."""

    def __init__(self, isolated, calibration: WorkerCalibration | None = None):
        self.isolated = isolated
        self.calibration = calibration
        self.operator = isolated.operator
        self.halo = isolated.halo
        self.info = isolated.info

    @property
    def excess(self) -> ExcessFit | None:
        return None if self.calibration is None else self.calibration.excess

    @property
    def within(self) -> WithinFit | None:
        return None if self.calibration is None else self.calibration.within

    @property
    def warnings(self) -> list[str]:
        lines = list(getattr(self.isolated, "warnings", None) or [])  # e.g. a model that did not converge
        stale = getattr(self.isolated, "stale", None)
        if stale:
            lines.append(f"{self.operator}'s model was learnt in another environment ({'; '.join(stale)}): "
                         f"run `{paths.explore_command(self.operator)}` again")
        if self.calibration is not None and self.calibration.stale:
            lines.append(f"{self.operator}'s in-worker calibration was learnt in another environment "
                         f"({'; '.join(self.calibration.stale)}): run `{paths.explore_command(self.operator)}` again")
        if self.excess is None:
            fix = (f"run `{paths.calibrate_command(self.operator)}` (in-worker probes of the composed model)"
                   if getattr(self.isolated, "composed", False)
                   else f"run `{paths.explore_command(self.operator)}` (it ends with in-worker probes)")
            lines.append(f"no in-worker calibration for {self.operator}: the bound is the isolated profile's and "
                         f"does not count a task's copies inside a Dask worker; {fix}")
        return lines

    @property
    def seconds_per_voxel(self) -> float | None:
        """Learnt seconds per block voxel of a Dask run (None: not learnt yet)."""
        return None if self.calibration is None else self.calibration.timing.seconds_per_voxel

    @property
    def graph_task_seconds(self) -> float | None:
        return None if self.calibration is None else self.calibration.timing.graph_task_seconds

    @property
    def run_fixed_seconds(self) -> float:
        """A run's fixed seconds (:func:`fit_run_overheads`; 0 when not learnt)."""
        fixed = None if self.calibration is None else self.calibration.timing.run_fixed_seconds
        return float(fixed or 0.0)

    @property
    def task_clock(self) -> TaskClock | None:
        """The workers' learnt :class:`~explorer.chunking.TaskClock` (None: not learnt yet)."""
        return None if self.calibration is None else self.calibration.timing.clock

    @functools.cached_property
    def isolated_dof(self) -> float:
        """The dof of the isolated model's Student-t predictive (:func:`_predictive_dof`)."""
        return _predictive_dof(self.isolated)

    def predict_many(self, shapes, confidence: float = 0.99, tasks=1, ceiling=None,
                     cold=None) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, upper)`` bytes of a task's in-worker peak on blocks of ``shapes``; with
        ``tasks`` (scalar or per row), ``upper`` bounds the largest of that many tasks of one
        run, ``cold`` of them their worker's first (default one; :func:`task_bound`: what a
        plan's worker footprint must hold for; the planner passes ``min(tasks, slots)``).

        ``ceiling`` (``(m,)`` bytes; the planner's, ``explorer.chunking.Predictor``): a block
        whose upper is shown above its ceiling is not solved further: its ``mean`` is NaN and
        its ``upper`` that lower bound (the isolated upper, which the task's never falls below,
        or :func:`max_task_quantile`'s; a composed isolated model may stop short itself, on one
        member's bound); a block shown at or below it gets an upper bound of its ``upper``
        (:func:`max_task_quantile`'s ``U``), its ``mean`` NaN too: the planner predicts the
        candidates it ranks by their upper again without a ceiling
        (``explorer.chunking.plan_chunks``)."""
        if ceiling is not None and getattr(self.isolated, "composed", False):
            mean, upper = self.isolated.predict_many(shapes, confidence, ceiling=ceiling)
        else:
            mean, upper = self.isolated.predict_many(shapes, confidence)
        if self.excess is None:
            return mean, upper
        mean, upper = np.array(mean, dtype=np.float64), np.array(upper, dtype=np.float64)
        voxels = row_product(np.asarray(shapes, dtype=np.float64).reshape(-1, 3))
        rows = ~np.isnan(mean)
        limit = None
        if ceiling is not None:
            limit = np.broadcast_to(np.asarray(ceiling, dtype=np.float64), mean.shape)
            rows &= ~(upper > limit)
            mean[~rows] = np.nan

        every = bool(rows.all())
        pick = slice(None) if every else rows

        def per_row(value):
            value = np.asarray(value, dtype=np.float64)
            return value if value.ndim == 0 else np.broadcast_to(value, mean.shape)[pick]
        solved = task_bound(mean[pick], upper[pick], voxels[pick], self.excess, self.within, confidence,
                            per_row(tasks), cold=None if cold is None else per_row(cold),
                            cold_fit=self.calibration.cold, isolated_dof=self.isolated_dof,
                            ceiling=None if limit is None else limit[pick])
        if limit is None:
            mean[pick], upper[pick] = solved
        else:
            m, u, state = solved
            mean[pick], upper[pick] = np.where(state == 0, m, np.nan), u
        return mean, upper

    def predict(self, shape, confidence: float = 0.99, cold=None) -> tuple[float, float]:
        """One task on a block of ``shape`` (``cold``: 1 when it is its worker's first of the
        run, 0 when it is not; default: bounded as a first)."""
        mean, upper = self.predict_many(np.asarray(shape).reshape(1, 3), confidence, cold=cold)
        return float(mean[0]), float(upper[0])

    def __repr__(self) -> str:
        e = self.excess
        excess = "none" if e is None else f"{e.intercept_bytes / 2**20:+.2f} MiB + {e.bytes_per_voxel:.2f} B/voxel"
        return f"<TaskModel {self.operator} excess={excess}>"


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


def task_model(operator: str, runs_dir=None, environment: dict | None = None) -> TaskModel:
    """``load_model(operator)`` with the saved in-worker calibration (if any)."""
    from explorer.model.load import load_model

    return TaskModel(load_model(operator, runs_dir=runs_dir), load_calibration(operator, runs_dir, environment))
