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

    y_gi = P(b_g) + a + k V_g + u_g + w_gi,    w_gi ~ N(0, sigma_w^2(m_g))

Observations are grouped by (run, block shape); a group's value is its **mean** task
``ybar_g``, and its excess ``r_g = ybar_g - P_mean(b_g)`` against the isolated model's
mean.  Only exact observations count (one thread per worker: ``explorer.live``).

*Within a group* (:func:`fit_within`): the sample variances ``s_g^2`` of the groups
with two or more tasks, ``(n_g - 1) s_g^2 / sigma_w^2(m_g) ~ chi^2_{n_g - 1}``, with the
variance function ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` (an absolute floor, which the
small blocks show, and a spread proportional to the task's peak ``m``, which the large
ones show), fitted by maximum likelihood; ``alpha`` is at least the kernel's page (the
resolution of the high-water mark).  ``nu_w = sum (n_g - 1) - 2`` degrees of freedom.

*Between groups.*  Ordinary least squares of ``r_g`` on ``x_g = [1, V_g / V_ref]`` over
``n`` groups (``p = 2`` coefficients, ``V_ref`` the largest group volume, for
conditioning): ``beta = (X^T X)^{-1} X^T r``, ``s^2 = sum e_g^2 / (n - p)``.

*Bound on a new task* at ``b`` (confidence ``c``), ``m`` its mean task peak::

    delta_mean(b) = x^T beta
    delta_half(b) = sqrt( (q_c * s * sqrt(1 + x^T (X^T X)^{-1} x))^2 + (q_w * sigma_w(m))^2 )

``q_w``: the Student-t quantile with ``nu_w`` dof, or, once there are enough tasks
(99 at 99%), the conformal rank quantile of their standardised deviations from their
groups' means (:meth:`WithinFit.quantile`).

with ``q_c`` the **conformal** rank quantile of the studentised deleted residuals
``t_g = e_g / (s_(g) sqrt(1 - h_gg))``: the ``ceil((n + 1) c)``-th smallest, a
distribution-free finite-sample guarantee for exchangeable groups, once there are enough
groups for that rank to exist (``n >= c / (1 - c)``: 99 at 99%).  Before that, ``q_c`` is
SciPy's Student-t quantile with ``n - p`` degrees of freedom, the exact prediction
interval under Gaussian residuals.  The count of equal tasks never narrows the between
term; it teaches the within term ``sigma_w``, which a bound on a single task must carry
whatever the count (a bound through the groups' *largest* tasks, as before, covers a new
group's largest of about as many tasks as the probes ran, 4 per worker, and not one of
the 9 tasks per worker a survey runs).

*Combined with the isolated model* (:class:`TaskModel`), ``h_P = upper_P - mean_P`` the
isolated model's own half-width at ``c``::

    mean  = mean_P(b) + delta_mean(b)
    upper = max(upper_P(b), mean + sqrt(h_P^2 + delta_half^2))

written once, in :func:`task_bound`.

(a task in a fresh worker never needs less than its isolated profile).  With fewer than
``p + 1`` groups or a single group volume the excess is not identified: no correction
is applied and ``TaskModel.warnings`` says so.

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

import hashlib
import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from explorer import paths
from explorer.chunking import TaskClock, row_product
from explorer.stats import t_quantile

__all__ = [
    "CALIBRATION_FILE",
    "CalibrationFileError",
    "ExcessFit",
    "TaskModel",
    "WithinFit",
    "TimingFit",
    "WorkerCalibration",
    "calibrate",
    "calibration_path",
    "environment_digest",
    "fit_excess",
    "fit_clock",
    "fit_run_overheads",
    "fit_timing",
    "fit_within",
    "load_calibration",
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

    def half_width(self, task_mean_bytes, confidence: float, tasks=1) -> np.ndarray:
        """``q sigma_w(m)``: the within-group part of the bound on the largest of ``tasks``
        tasks (scalar or per row), ``q`` at ``c^(1 / tasks)`` (Sidak: ``c`` that none of
        them exceeds it); one task: the single task's ``q_c``."""
        m = np.asarray(task_mean_bytes, dtype=np.float64)
        counts = np.broadcast_to(np.maximum(np.asarray(tasks, dtype=np.int64), 1), m.shape)
        unique, inverse = np.unique(counts, return_inverse=True)
        q = self.quantiles(float(confidence) ** (1.0 / unique.astype(np.float64)))
        return q[inverse].reshape(m.shape) * self.sd(m)

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


def fit_within(mean_bytes, variances, n_tasks, deviations=()) -> WithinFit | None:
    """Maximum likelihood of ``sigma_w^2(m) = alpha^2 + beta^2 m^2`` from the groups' sample
    variances ``s_g^2`` (``n_g - 1`` degrees of freedom each, at their means ``m_g``):
    maximises ``-sum (n_g - 1)/2 (log sigma_w^2(m_g) + s_g^2 / sigma_w^2(m_g))`` with
    ``alpha >= `` the kernel's page.  None when fewer than ``3`` degrees of freedom remain
    (``sum (n_g - 1) <= 2``): the between-group residual then carries the whole spread.
    ``deviations``: per group, its tasks' ``y_gi - ybar_g`` (for the conformal scores)."""
    from explorer.stats import fit_spread, page_bytes

    m = np.asarray(mean_bytes, dtype=np.float64).reshape(-1)
    s2 = np.asarray(variances, dtype=np.float64).reshape(-1)
    dof_g = np.asarray(n_tasks, dtype=np.float64).reshape(-1) - 1.0
    keep = (dof_g > 0) & np.isfinite(s2) & np.isfinite(m)
    dof = int(dof_g[keep].sum()) - N_WITHIN_PARAMETERS
    if dof < 1:
        return None
    alpha, beta = fit_spread(m[keep], s2[keep], dof_g[keep], abs_floor=page_bytes())
    fit = WithinFit(alpha_bytes=float(alpha), beta=float(beta), dof=dof)
    scores = []
    for mean, deviation in zip(np.asarray(mean_bytes, dtype=np.float64).reshape(-1), deviations):
        deviation = np.asarray(deviation, dtype=np.float64)
        if len(deviation) > 1:
            scores.extend(deviation / (float(fit.sd(abs(mean))) * math.sqrt(1.0 - 1.0 / len(deviation))))
    return replace(fit, scores=tuple(sorted(map(float, scores))))


@dataclass(frozen=True)
class TaskGroups:
    """In-worker tasks, one group per (run, block shape) (module docstring)."""

    shapes: np.ndarray  # (n, 3) int64 block shapes
    peak_bytes: np.ndarray  # (n,) the group's largest task
    mean_bytes: np.ndarray  # (n,) the group's mean task
    variances: np.ndarray  # (n,) the group's sample variance (0 for a single task)
    n_tasks: np.ndarray  # (n,) tasks in the group
    sources: tuple[str, ...]  # the group's source ("probe" or "production")
    deviations: tuple = ()  # per group, its tasks' peaks minus the group's mean


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
    peaks = [np.asarray([float(r.peak_bytes) for r in groups[k]]) for k in keys]
    return TaskGroups(
        shapes=np.asarray([k[1] for k in keys], dtype=np.int64).reshape(-1, 3),
        peak_bytes=np.asarray([p.max() for p in peaks], dtype=np.float64),
        mean_bytes=np.asarray([p.mean() for p in peaks], dtype=np.float64),
        variances=np.asarray([p.var(ddof=1) if len(p) > 1 else 0.0 for p in peaks], dtype=np.float64),
        n_tasks=np.asarray([len(p) for p in peaks], dtype=np.int64),
        sources=tuple(groups[k][0].source for k in keys),
        deviations=tuple(p - p.mean() for p in peaks),
    )


def task_bound(mean_isolated, upper_isolated, voxels, excess: ExcessFit | None, within: WithinFit | None,
               confidence: float, tasks=1) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, upper)`` bytes of a task in a worker (module docstring): the isolated
    model's ``(mean_P, upper_P)`` plus the excess between groups and the spread within one::

        mean  = mean_P + delta_mean(V)
        upper = max(upper_P, mean + sqrt(h_P^2 + h_between(V)^2 + h_within(mean; tasks)^2))

    ``tasks`` (scalar or per row): the bound covers the largest of that many tasks of one
    run.  Only the spread within a group differs from task to task; the model's and the
    line's uncertainty is shared by all of them and stays at ``c``
    (:meth:`WithinFit.half_width`).  The isolated bound alone when the excess is not
    identified."""
    mean_isolated = np.asarray(mean_isolated, dtype=np.float64)
    upper_isolated = np.asarray(upper_isolated, dtype=np.float64)
    if excess is None:
        return mean_isolated, upper_isolated
    d_mean, d_half = excess.predict(voxels, confidence)
    mean = mean_isolated + d_mean
    w_half = within.half_width(mean, confidence, tasks) if within is not None else 0.0
    half = np.sqrt((upper_isolated - mean_isolated) ** 2 + d_half**2 + w_half**2)
    return mean, np.maximum(upper_isolated, mean + half)


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
    is the workers' stamp (``explorer.environment``) the observations were made in;
    ``within`` the spread of tasks within a group (None while fewer than three degrees
    of freedom); ``n_groups_over_bound`` counts the groups whose largest task is above its
    own in-sample single-task bound at ``confidence`` (a diagnostic).
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
        t = data["timing"]
        timing = TimingFit(**{k: t.get(k) for k in ("operator_seconds_per_voxel", "io_seconds_per_voxel",
                                                    "graph_task_seconds", "run_fixed_seconds")},
                           n_tasks=int(t.get("n_tasks") or 0), n_runs=int(t.get("n_runs") or 0),
                           clock=TaskClock.from_dict(t["clock"]) if t.get("clock") else None)
        return cls(operator=str(data["operator"]), excess=excess, timing=timing, n_groups=int(data["n_groups"]),
                   n_probe_groups=int(data.get("n_probe_groups", 0)), n_tasks=int(data["n_tasks"]),
                   confidence=float(data["confidence"]), n_groups_over_bound=int(data["n_groups_over_bound"]),
                   environment=data.get("environment"), within=within, updated=float(data.get("updated", 0.0)))


def calibration_path(operator: str, runs_dir=None) -> Path:
    """``<runs>/<operator>/calibration.json``."""
    return paths.operator_dir(operator, runs_dir) / CALIBRATION_FILE


def environment_digest(stamp: dict) -> str:
    """A short digest of the worker-relevant part of an environment stamp, kept with each
    in-worker observation so that a calibration uses its own environment's evidence."""
    from explorer.environment import WORKER_KEYS

    text = json.dumps({k: stamp.get(k) for k in WORKER_KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def calibrate(operator: str, store, model, *, confidence: float = 0.99, runs_dir=None,
              environment: dict | None = None, save: bool = True) -> WorkerCalibration | None:
    """The calibration of ``operator`` from the in-worker observations in ``store``.

    ``model`` is the operator's isolated ``MemoryModel`` (the excess is against its mean);
    ``environment``: the workers' stamp (default: this process's), whose observations
    are used and which the saved file carries.  Saved atomically to
    :func:`calibration_path` (``runs_dir`` defaults to the store's) unless ``save=False``.
    None when there is no in-worker observation at all.
    """
    from explorer.environment import environment_stamp

    stamp = dict(environment) if environment else environment_stamp(operator)
    digest = environment_digest(stamp)
    records = store.records(operator)
    groups = task_groups(records, digest)
    timing = fit_timing(records, digest)
    if len(groups.peak_bytes) == 0 and timing.n_tasks == 0:
        return None
    excess, within, over = None, None, 0
    if len(groups.peak_bytes):
        mean, upper = model.predict_many(groups.shapes, confidence)
        voxels = groups.shapes.prod(axis=1).astype(np.float64)
        excess = fit_excess(voxels, groups.mean_bytes - mean)
        within = fit_within(groups.mean_bytes, groups.variances, groups.n_tasks, groups.deviations)
        if excess is not None:
            _, bound = task_bound(mean, upper, voxels, excess, within, confidence)
            over = int((groups.peak_bytes > bound).sum())
    result = WorkerCalibration(
        operator=operator, excess=excess, timing=timing, n_groups=len(groups.peak_bytes),
        n_probe_groups=sum(s == "probe" for s in groups.sources), n_tasks=int(groups.n_tasks.sum()),
        confidence=float(confidence), n_groups_over_bound=over, environment=stamp, within=within)
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
    from explorer.environment import WORKER_KEYS, environment_stamp, stamp_differences

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
        lines = []
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

    def predict_many(self, shapes, confidence: float = 0.99, tasks=1, ceiling=None) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, upper)`` bytes of a task's in-worker peak on blocks of ``shapes``; with
        ``tasks`` (scalar or per row), ``upper`` bounds the largest of that many tasks of
        one run (:func:`task_bound`: what a plan's worker footprint must hold for).

        ``ceiling`` (``(m,)`` bytes; the planner's, ``explorer.chunking.Predictor``) is passed
        to a composed isolated model, which may stop short on blocks it shows above their
        ceiling (``mean`` NaN, ``upper`` a lower bound of the isolated upper): the task's
        upper is at least the isolated one (:func:`task_bound`), so those blocks are returned
        as they are; the others get the task bound."""
        if ceiling is not None and getattr(self.isolated, "composed", False):
            mean, upper = self.isolated.predict_many(shapes, confidence, ceiling=ceiling)
        else:
            mean, upper = self.isolated.predict_many(shapes, confidence)
        if self.excess is None:
            return mean, upper
        voxels = row_product(np.asarray(shapes, dtype=np.float64).reshape(-1, 3))
        if ceiling is None:
            return task_bound(mean, upper, voxels, self.excess, self.calibration.within, confidence, tasks)
        mean, upper = np.array(mean, dtype=np.float64), np.array(upper, dtype=np.float64)
        rows = ~np.isnan(mean)
        per_row = np.broadcast_to(np.asarray(tasks), mean.shape)[rows]
        mean[rows], upper[rows] = task_bound(mean[rows], upper[rows], voxels[rows], self.excess,
                                             self.calibration.within, confidence, per_row)
        return mean, upper

    def predict(self, shape, confidence: float = 0.99) -> tuple[float, float]:
        mean, upper = self.predict_many(np.asarray(shape).reshape(1, 3), confidence)
        return float(mean[0]), float(upper[0])

    def __repr__(self) -> str:
        e = self.excess
        excess = "none" if e is None else f"{e.intercept_bytes / 2**20:+.2f} MiB + {e.bytes_per_voxel:.2f} B/voxel"
        return f"<TaskModel {self.operator} excess={excess}>"


def task_model(operator: str, runs_dir=None, environment: dict | None = None) -> TaskModel:
    """``load_model(operator)`` with the saved in-worker calibration (if any)."""
    from explorer.surrogate import load_model

    return TaskModel(load_model(operator, runs_dir=runs_dir), load_calibration(operator, runs_dir, environment))
