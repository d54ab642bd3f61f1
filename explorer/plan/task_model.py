"""The task model (:class:`TaskModel`): a task's peak inside a worker, the isolated model plus
its in-worker calibration; what ``recommend_chunks`` and the live checks bound a plan with.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from explorer.core import paths
from explorer.plan.time_model import TaskClock
from explorer.plan.grid import row_product
from explorer.plan.calibration import load_calibration
from explorer.plan.excess import _predictive_dof, task_bound
from explorer.plan.predictor import takes_keywords

if TYPE_CHECKING:
    from explorer.plan.calibration import WorkerCalibration
    from explorer.plan.excess import ExcessFit, WithinFit

__all__ = [
    "TaskModel",
    "task_model",
]


# --------------------------------------------------------------------------- the task model


class TaskModel:
    """Peak memory of an operator's task inside a Dask worker: the isolated model plus the
    in-worker excess (module docstring).  ``predict_many`` is the predictor
    ``explorer.plan.planner.plan_chunks`` takes; ``warnings`` (one line each) says what the
    bound does not know (no calibration, a stale model or calibration).

    ``environment``: the stamp of the workers that run the tasks (None: this process's), which
    the isolated model is judged stale against, as the calibration is: a model explored on a
    cluster's workers (``explore OP --scheduler``) and used there from another machine is
    theirs, not the caller's."""

    def __init__(self, isolated, calibration: WorkerCalibration | None = None, environment: dict | None = None):
        self.isolated = isolated
        self.calibration = calibration
        self.operator = isolated.operator
        self.halo = isolated.halo
        self.info = isolated.info
        judge = getattr(isolated, "stale_reasons", None)
        self.isolated_stale: list[str] = (judge(environment) if environment is not None and judge is not None
                                          else list(getattr(isolated, "stale", None) or []))

    @property
    def excess(self) -> ExcessFit | None:
        return None if self.calibration is None else self.calibration.excess

    @property
    def within(self) -> WithinFit | None:
        return None if self.calibration is None else self.calibration.within

    @property
    def warnings(self) -> list[str]:
        lines = list(getattr(self.isolated, "warnings", None) or [])  # e.g. a model that did not converge
        if self.isolated_stale:
            lines.append(f"{self.operator}'s model was learnt in another environment ({'; '.join(self.isolated_stale)}): "
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
        """The workers' learnt :class:`~explorer.plan.time_model.TaskClock` (None: not learnt yet)."""
        return None if self.calibration is None else self.calibration.timing.clock

    @property
    def largest_block_voxels(self) -> int | None:
        """The largest block (voxels) the operator's tasks were measured on inside a worker (the
        probes' plan-scale block, or a larger production block); None without a calibration.
        A plan runs no larger block (``VolumeGeometry.max_block_voxels``): beyond it neither the
        spread of equal tasks, which grows with the block, nor the workers' clock was seen."""
        return None if self.calibration is None else self.calibration.largest_block_voxels

    @functools.cached_property
    def isolated_dof(self) -> float:
        """The dof of the isolated model's Student-t predictive (:func:`_predictive_dof`)."""
        return _predictive_dof(self.isolated)

    @takes_keywords("tasks", "ceiling", "cold")
    def predict_many(self, shapes, confidence: float = 0.99, tasks=1, ceiling=None,
                     cold=None) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, upper)`` bytes of a task's in-worker peak on blocks of ``shapes``; with
        ``tasks`` (scalar or per row), ``upper`` bounds the largest of that many tasks of one
        run, ``cold`` of them their worker's first (default one; :func:`task_bound`: what a
        plan's worker footprint must hold for; the planner passes ``min(tasks, slots)``).

        ``ceiling`` (``(m,)`` bytes; the planner's, ``explorer.plan.predictor.Predictor``): a block
        whose upper is shown above its ceiling is not solved further: its ``mean`` is NaN and
        its ``upper`` that lower bound (the isolated upper, which the task's never falls below,
        or :func:`max_task_quantile`'s; a composed isolated model may stop short itself, on one
        member's bound); a block shown at or below it gets an upper bound of its ``upper``
        (:func:`max_task_quantile`'s ``U``), its ``mean`` NaN too: the planner predicts the
        candidates it ranks by their upper again without a ceiling
        (``explorer.plan.planner.plan_chunks``)."""
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

    @takes_keywords("cold")
    def predict(self, shape, confidence: float = 0.99, cold=None) -> tuple[float, float]:
        """One task on a block of ``shape`` (``cold``: 1 when it is its worker's first of the
        run, 0 when it is not; default: bounded as a first)."""
        mean, upper = self.predict_many(np.asarray(shape).reshape(1, 3), confidence, cold=cold)
        return float(mean[0]), float(upper[0])

    def __repr__(self) -> str:
        e = self.excess
        excess = "none" if e is None else f"{e.intercept_bytes / 2**20:+.2f} MiB + {e.bytes_per_voxel:.2f} B/voxel"
        return f"<TaskModel {self.operator} excess={excess}>"


def task_model(operator: str, runs_dir=None, environment: dict | None = None) -> TaskModel:
    """``load_model(operator)`` with the saved in-worker calibration (if any), both judged stale
    against ``environment`` (the workers' stamp; None: this process's), in ``warnings``."""
    import warnings

    from explorer.core.environment import StaleModelWarning
    from explorer.model.load import load_model

    with warnings.catch_warnings():
        if environment is not None:  # load_model judges this process's; TaskModel the workers'
            warnings.simplefilter("ignore", StaleModelWarning)
        isolated = load_model(operator, runs_dir=runs_dir)
    return TaskModel(isolated, load_calibration(operator, runs_dir, environment), environment)
