"""What a task costs inside a Dask worker beyond its isolated profile: memory and time.

Core, not edge: ``recommend_chunks`` applies the saved calibration by reading one small
JSON file (:func:`load_calibration`), without the store or distributed.  The data come
from in-worker observations (``explorer.runner.live``): explore's probes (``source="probe"``,
run by ``explorer.runner.probes`` before any production run) and production tasks
(``source="production"``).  Definitions: ``docs/definitions.md``.

This module: the calibration of an operator (:class:`WorkerCalibration`), fitted from the
store's observations (:func:`calibrate`: ``explorer.plan.excess``, ``explorer.plan.timing``),
saved and loaded.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from explorer.core import paths
from explorer.core.atomic import atomic_write_text
from explorer.core.file_cache import MtimeCache
from explorer.core.environment import environment_digest
from explorer.plan.time_model import TaskClock
from explorer.plan.excess import (
    ColdFit,
    ExcessFit,
    N_COEFFICIENTS,
    WithinFit,
    _predictive_dof,
    fit_cold,
    fit_excess,
    fit_within,
    task_bound,
    task_groups,
)
from explorer.plan.timing import TimingFit, fit_timing

__all__ = [
    "CALIBRATION_FILE",
    "CalibrationFileError",
    "WorkerCalibration",
    "calibrate",
    "calibration_path",
    "load_calibration",
]


#: Calibration file name under ``runs/<operator>/``.
CALIBRATION_FILE = "calibration.json"
#: Bumped when the saved layout changes (a file of another version is not used).
FORMAT_VERSION = 3


class CalibrationFileError(ValueError):
    """A saved calibration file cannot be read (one line naming the file and the fix)."""


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

    @property
    def largest_block_voxels(self) -> int | None:
        """The largest block (voxels) of a group of exact in-worker observations (the excess
        line's ``V_ref``); None while the excess is not identified."""
        return None if self.excess is None else int(round(self.excess.v_ref))

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
    atomic_write_text(path, json.dumps(cal.to_dict(), indent=2))


_CACHE: MtimeCache[WorkerCalibration] = MtimeCache()


def load_calibration(operator: str, runs_dir=None, environment: dict | None = None) -> WorkerCalibration | None:
    """The saved calibration of ``operator``, or None when there is none (cached by mtime).

    Cheap (one small JSON file; neither distributed nor the store).  A file that is not a
    calibration of this version raises :class:`CalibrationFileError` naming the file and
    the command that rebuilds it.  ``cal.stale`` lists how ``environment`` (default: this
    process's) differs from the one it was learnt in.
    """
    from explorer.core.environment import WORKER_KEYS, environment_stamp, stamp_differences

    path = calibration_path(operator, runs_dir)

    def load(path):
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
                              f"`{paths.explore_command(operator)}` to rebuild it", RuntimeWarning, stacklevel=4)
                return None
            return WorkerCalibration.from_dict(data)
        except Exception as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise CalibrationFileError(
                f"{path} is not a readable calibration ({type(exc).__name__}: {reason[:120]}): run "
                f"`{paths.explore_command(operator)}` to rebuild it (its in-worker probes), or delete the file") from None

    try:
        cal = _CACHE.get(path, load)
    except FileNotFoundError:
        return None
    if cal is None:
        return None
    current = environment or environment_stamp(operator)
    return _with_stale(cal, stamp_differences(cal.environment, current, WORKER_KEYS))


def _with_stale(cal: WorkerCalibration, stale: list) -> WorkerCalibration:
    if stale == cal.stale:
        return cal
    copy = WorkerCalibration(**{f: getattr(cal, f) for f in cal.__dataclass_fields__})
    copy.stale = stale
    return copy
