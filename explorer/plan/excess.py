"""What a task needs inside a Dask worker beyond its isolated profile: the in-worker excess, the
spread of equal tasks above their fresh level, and a task's bound.

Memory: the in-worker excess
----------------------------
A task on a block ``b`` inside a worker holds, besides what the operator itself needs
(the isolated ``peak_bytes`` ``P(b)``), the block it reads from the file (or
concatenates from overlap pieces), its trimmed output (a copy:
``operators.base._windowed_task``), the store's encode buffers and the task's own overhead.
The excess is affine in the block's voxels ``V`` (measured while the trimmed output was a
view, which the store copied: about 4 bytes per voxel for gst3d, 10 for gaussian; the copy
made in the task frees a float32 block sooner)::

    y_task(b) = P(b) + delta(b),    delta(b) = a + k V(b) + e,    e ~ N(0, s^2)

A fixed overhead lives in ``a`` and does not scale with the block, so a run on a small
file cannot inflate large plans through a ratio.

*The fresh level of a group, and the spread above it.*  A task's peak is the growth of its
worker's resident set from the task's start (``docs/definitions.md``).  Tasks of one run on
blocks of one shape share the run's conditions, and still differ: a task that starts with
freed memory the worker's allocator kept reuses some of it and grows less (measured, gaussian
270^3 probes in one run: 86 MiB on three tasks, 150 MiB on the other five).  A worker's
**cold** task, its first of the run (``first_in_run``, ``explorer.measure.inworker``), finds
none of the run's freed memory: it grows what the block needs afresh.  So a task is::

    y_gi = F_g + w_gi - R_gi,      F_g = P(b_g) + a + k V_g + u_g,    R_gi >= 0  (0 when cold)

``F_g`` the group's **fresh level**, ``w_gi`` the fresh task's own spread and ``R_gi`` what it
reused.  A bound needs the upper side only, and reuse only lowers a task, so the groups are
valued at their fresh level, the mean ``c_g`` of their cold tasks (:func:`task_groups`; the mean
of all their tasks where the tasks are not told apart: observations saved before the flag, or
one kind only), and every task by its deviation from it, ``d_gi = y_gi - c_g``.  A deviation
below the level says nothing about the spread above it (it may be reuse), so the spread is
learnt from the deviations at or above it (a half-normal's likelihood: a deviation ``d >= 0`` of
variance ``f sigma_w^2``, ``f`` below, has ``d^2 / (f sigma_w^2) ~ chi^2_1``).  A warm task
above its cold ones counts there: a task that grows more than a fresh one widens the bound
by what it showed.  The rule before valued a group at its warm tasks' mean, fitted the spread
to deviations either side of it and added a learnt offset for the cold tasks: reuse then
lowered the mean and widened the spread both ways (gaussian's in-worker bound on 160x161x320
at 270 MiB in one exploration and 143 MiB in another from the same kind of probes; 82-84 MiB
on either by this rule).

*The spread* (:func:`fit_within`): ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` (an absolute
floor, which the small blocks show, and a spread proportional to the task's peak ``m``, which
the large ones show), fitted by maximum likelihood to the groups' mean squared deviations
at or above their level, ``s_g^2 = mean(d^2 / f)`` over them, with ``d_g`` their count, at most
``n_g - 1`` (the level took one) (``d_g s_g^2 / sigma_w^2(m_g) ~ chi^2_{d_g}``); ``f = 1 - 1/n_c`` for a cold task about the mean
of its ``n_c`` cold tasks, ``1 + 1/n_c`` for a warm one, ``1 - 1/n`` about the mean of a group's
``n`` tasks not told apart.  ``alpha`` is at least the kernel's page (the resolution of the
high-water mark).  ``nu_w = sum d_g - 2`` degrees of freedom.  Every task's deviation, above
the level or below, is a conformal score ``d / (sigma_w(c_g) sqrt(f))``.

*Between groups.*  Ordinary least squares of ``r_g = c_g - P_mean(b_g)`` on ``x_g = [1, V_g / V_ref]`` over
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
plan's footprint must hold for every task it runs).  A task's peak is at most
``mean + S + W_i``::

    mean = mean_P(b) + x^T beta          the fresh level
    S    = a T_{nu_P} + b T_{n-p}        shared by the plan's tasks: the isolated model's
                                         predictive error (a = (upper_P - mean_P) / t_{nu_P}(c),
                                         MemoryModel.predictive_t's dof) and the line's
                                         (b = delta_half / t_{n-p}(c))
    W_i  = s_w sigma_w(mean) T_{nu_w}    iid, each task as if fresh (reuse only lowers it)

    upper = max(upper_P, mean + u),   P(S + max_i W_i <= u) = E_S[ F_W((u - S) / sigma)^n ] = c

solved numerically (:func:`max_task_quantile`: quadrature over the narrower of ``S`` and
the largest ``W``, Newton's method for ``u``).  ``s_w`` stretches the Student-t until its
``c``-quantile is the conformal one of the tasks' scores once there are enough
(:meth:`WithinFit.tail_scale`).  ``n = 1`` is a single task's bound (the check of each
observation).  The rule before combined half-widths in quadrature,
``sqrt(h_P^2 + h_between^2 + h_within(c^(1/n))^2)`` with a Sidak quantile for the within
part: 97.8% (n = 9) and 96.3% (n = 100) of simulated plans at a nominal 99% with the shared
and the within scales alike (``scripts/bench_first_run.py`` step 0), because the shared error
and the largest of many are not a sum of squares; the exact quantile covers 98.95-99.03%
(Monte Carlo sd 0.016%).  A task in a fresh worker never needs less than its isolated
profile: ``upper >= upper_P``.  With fewer than ``p + 1`` groups or a single group volume the
excess is not identified: no correction is applied and ``TaskModel.warnings`` says so.
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
    "ExcessFit",
    "WithinFit",
    "fit_excess",
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
    #: Each task's deviation from its group's fresh level in units of its standard deviation,
    #: ``d_gi / (sigma_w(c_g) sqrt(f_gi))`` (module docstring), sorted (the conformal scores).
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


def fit_within(level_bytes, variances, n_tasks, deviations=(), dofs=None, factors=None) -> WithinFit | None:
    """Maximum likelihood of ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` from the groups' mean squared
    deviations ``s_g^2`` (``d_g`` degrees of freedom each, at their levels ``m_g``):
    maximises ``-sum d_g/2 (log sigma_w^2(m_g) + s_g^2 / sigma_w^2(m_g))`` with
    ``alpha >= `` the kernel's page.  None when fewer than ``3`` degrees of freedom remain
    (``sum d_g <= 2``): the between-group residual then carries the whole spread.

    ``dofs``: per group ``d_g``, by default ``n_g - 1`` (a sample variance about the group's
    mean); :func:`task_groups` gives the count of deviations at or above the group's fresh level.
    ``deviations``: per group, its tasks' deviations from its level (for the conformal scores),
    each of variance ``factors`` (per group an array per task) times ``sigma_w^2``, by default
    ``1 - 1 / n_g`` (deviations about the group's own mean): a score is
    ``deviation / (sigma_w(m_g) sqrt(factor))``."""
    from explorer.model.stats import fit_spread, page_bytes

    m = np.asarray(level_bytes, dtype=np.float64).reshape(-1)
    s2 = np.asarray(variances, dtype=np.float64).reshape(-1)
    n = np.asarray(n_tasks, dtype=np.float64).reshape(-1)
    dof_g = n - 1.0 if dofs is None else np.asarray(dofs, dtype=np.float64).reshape(-1)
    keep = (dof_g > 0) & np.isfinite(s2) & np.isfinite(m)
    dof = int(dof_g[keep].sum()) - N_WITHIN_PARAMETERS
    if dof < 1:
        return None
    alpha, beta = fit_spread(m[keep], s2[keep], dof_g[keep], abs_floor=page_bytes())
    fit = WithinFit(alpha_bytes=float(alpha), beta=float(beta), dof=dof)
    scores = []
    for g, (level, deviation) in enumerate(zip(m, deviations)):
        deviation = np.asarray(deviation, dtype=np.float64)
        factor = (np.full(len(deviation), 1.0 - 1.0 / len(deviation)) if factors is None
                  else np.asarray(factors[g], dtype=np.float64))
        ok = factor > 0
        scores.extend(deviation[ok] / (float(fit.sd(abs(level))) * np.sqrt(factor[ok])))
    return replace(fit, scores=tuple(sorted(map(float, scores))))


@dataclass(frozen=True)
class TaskGroups:
    """In-worker tasks, one group per (run, block shape), each valued at its fresh level (module
    docstring): the mean of its cold tasks when every task says whether it was its worker's
    first of the run (``first_in_run``) and the group holds both kinds, else the mean of all
    its tasks."""

    shapes: np.ndarray  # (n, 3) int64 block shapes
    peak_bytes: np.ndarray  # (n,) the group's largest task
    level_bytes: np.ndarray  # (n,) the group's fresh level c_g
    variances: np.ndarray  # (n,) mean of d^2 / f over the deviations at or above the level (0: none)
    n_tasks: np.ndarray  # (n,) tasks in the group
    sources: tuple[str, ...]  # the group's source ("probe" or "production")
    deviations: tuple = ()  # per group, its tasks' peaks minus its level
    dofs: np.ndarray | None = None  # (n,) deviations at or above the level, at most n - 1: the variance's dof
    factors: tuple = ()  # per group, each deviation's variance in units of sigma_w^2
    n_cold: np.ndarray | None = None  # (n,) cold tasks that set the level (0: the mean of all set it)


def _is_in_worker(record, environment: str | None) -> bool:
    return (record.source in IN_WORKER_SOURCES and record.status == "ok" and record.peak_bytes is not None
            and bool(record.context.get("exact", False))
            and (environment is None or record.context.get("environment") == environment))


def task_groups(records, environment: str | None = None) -> TaskGroups:
    """Group exact in-worker observations by (run, block shape), each at its fresh level with its
    deviations from it (module docstring); ``environment``: keep only those whose workers had
    this :func:`environment_digest`."""
    groups: dict[tuple, list] = {}
    for r in records:
        if _is_in_worker(r, environment):
            key = (str(r.context.get("run", "")), tuple(int(n) for n in r.shape))
            groups.setdefault(key, []).append(r)
    keys = sorted(groups)
    columns = {name: [] for name in ("peak", "level", "var", "n", "dof", "dev", "factor", "n_cold")}
    for k in keys:
        peaks = np.asarray([float(r.peak_bytes) for r in groups[k]])
        flags = [r.context.get("first_in_run") for r in groups[k]]
        cold = np.asarray([bool(f) for f in flags])
        apart = all(f is not None for f in flags) and cold.any() and not cold.all()
        if apart:
            n_cold = float(cold.sum())
            level = peaks[cold].mean()
            factor = np.where(cold, 1.0 - 1.0 / n_cold, 1.0 + 1.0 / n_cold)
        else:
            level = peaks.mean()
            factor = np.full(len(peaks), 1.0 - 1.0 / len(peaks))
        deviation = peaks - level
        above = (deviation >= 0) & (factor > 0)  # a page-exact repeat deviates by 0: evidence of no spread
        columns["peak"].append(peaks.max())
        columns["level"].append(level)
        columns["var"].append(float(np.mean(deviation[above] ** 2 / factor[above])) if above.any() else 0.0)
        columns["n"].append(len(peaks))
        columns["dof"].append(min(int(above.sum()), len(peaks) - 1))  # the level took one of the n
        columns["dev"].append(deviation)
        columns["factor"].append(factor)
        columns["n_cold"].append(int(cold.sum()) if apart else 0)
    as_float = lambda name: np.asarray(columns[name], dtype=np.float64)  # noqa: E731
    return TaskGroups(
        shapes=np.asarray([k[1] for k in keys], dtype=np.int64).reshape(-1, 3),
        peak_bytes=as_float("peak"), level_bytes=as_float("level"), variances=as_float("var"),
        n_tasks=np.asarray(columns["n"], dtype=np.int64), sources=tuple(groups[k][0].source for k in keys),
        deviations=tuple(columns["dev"]), dofs=as_float("dof"), factors=tuple(columns["factor"]),
        n_cold=as_float("n_cold"),
    )


def task_bound(mean_isolated, upper_isolated, voxels, excess: ExcessFit | None, within: WithinFit | None,
               confidence: float, tasks=1, *, isolated_dof: float = math.inf, ceiling=None):
    r"""``(mean, upper)`` bytes of the largest of ``tasks`` tasks of one plan in workers (module
    docstring), from the isolated model's ``(mean_P, upper_P)`` at ``c``::

        mean  = mean_P + delta_mean(V)                                      (the fresh level)
        upper = max(upper_P, mean + u),   u: P(S + max_i W_i <= u) = c   (max_task_quantile)

    with the shared error ``S = a T_{nu_P} + b T_{n-p}``, ``a = (upper_P - mean_P) / t_{nu_P}(c)``
    (the isolated predictive's scale, ``isolated_dof`` its dof: ``MemoryModel.predictive_t``),
    ``b = delta_half(V) / t_{n-p}(c)`` (the excess's, whichever quantile ``delta_half`` took), and
    per task ``W_i = s_w sigma_w(mean) T_{nu_w}`` (:meth:`WithinFit.tail_scale`), each task bounded
    as a fresh one.

    ``tasks`` (scalar or per row): how many tasks the bound covers.  The isolated bound alone
    when the excess is not identified.  ``ceiling`` (per row, optional): rows shown above it or
    at or below it are not solved (:func:`max_task_quantile`: ``upper`` a lower, resp. an upper
    bound); returns ``(mean, upper, state)`` then."""
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
    solved = max_task_quantile(c, (a, b), (float(isolated_dof), float(excess.dof)), sigma, tasks,
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
