"""The production calibration: how a task's peak inside a Dask worker relates to the
isolated profiles, learnt from the observations :mod:`explorer.live` stores.

Core, not edge: ``recommend_chunks`` applies the saved calibration
(:func:`calibrated_model`) by reading one small JSON file, without the store or
distributed.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from explorer import paths

#: Calibration file name under ``runs/<operator>/``.
CALIBRATION_FILE = "calibration.json"
#: The applied calibration never shrinks an isolated prediction: an in-worker peak below
#: the isolated one usually means the task reused free heap that Dask still counts in RSS.
MIN_APPLIED_RATIO = 1.0
#: Prior on the spread of the ratio (relative sd) and its weight in pseudo-observations,
#: so one or two production tasks do not make a tight calibration.
PRIOR_RATIO_SD = 0.10
PRIOR_PSEUDO_OBSERVATIONS = 2.0

@dataclass
class Calibration:
    r"""How in-worker task peaks relate to the model's isolated predictions.

    With ``r_i = y_i / m_i`` (observed task peak over the uncalibrated model mean at the
    task's block), over the ``n`` exact production observations:

    * ``ratio_mean``, ``ratio_var``: the sample mean and variance (ddof 1) of ``r``;
    * ``mean = max(ratio_mean, MIN_APPLIED_RATIO)``: the applied factor;
    * ``var``: the variance of a *new task's* ratio, so that the bound covers single
      tasks, not only their average: ``s_p^2 (1 + 1/n)`` where ``s_p^2`` pools the
      sample variance with a prior relative spread (``PRIOR_RATIO_SD`` worth
      ``PRIOR_PSEUDO_OBSERVATIONS`` observations):
      ``s_p^2 = ((n - 1) s^2 + k_0 sd_0^2) / (n - 1 + k_0)``;
      then raised, if needed, until every observation lies under the calibrated upper
      bound at ``confidence`` (so a task that was over the bound widens the next plan).

    ``mean, var = calibration`` unpacks the two numbers ``MemoryModel.with_calibration`` takes.
    """

    operator: str
    mean: float
    var: float
    n: int
    ratio_mean: float
    ratio_var: float
    max_ratio: float
    confidence: float
    coverage_raised: bool
    n_over_uncalibrated_bound: int
    updated: float

    def __iter__(self):
        return iter((self.mean, self.var))

    def to_dict(self) -> dict:
        return asdict(self)


def calibration_path(operator: str, runs_dir=None) -> Path:
    """``<runs>/<operator>/calibration.json``."""
    return paths.operator_dir(operator, runs_dir) / CALIBRATION_FILE


def _production_data(records):
    shapes, peaks = [], []
    for r in records:
        if r.source != "production" or r.status != "ok" or r.peak_bytes is None:
            continue
        if not r.context.get("exact", False):
            continue
        shapes.append(r.shape)
        peaks.append(float(r.peak_bytes))
    return np.asarray(shapes, dtype=np.int64).reshape(-1, 3), np.asarray(peaks, dtype=np.float64)


def calibration(operator: str, store, model, *, confidence: float = 0.99, runs_dir=None,
                save: bool = True) -> Calibration | None:
    """The calibration of ``operator`` from its production observations in ``store``.

    ``model`` is the operator's fitted ``MemoryModel`` (its own calibration is ignored:
    ratios are against isolated predictions).  Saved atomically to
    :func:`calibration_path` (``runs_dir`` defaults to the store's) unless ``save=False``.
    Returns ``None`` when there is no exact production observation (``T > 1`` runs give
    none: see the module docstring).
    """
    shapes, peaks = _production_data(store.records(operator, source="production"))
    if len(peaks) == 0:
        return None
    isolated = model.with_calibration(1.0, 0.0)
    m, upper0 = isolated.predict_many(shapes, confidence)
    # Isolated predictive variance of a single run, recovered from the bound.
    z = NormalDist().inv_cdf(confidence)
    v = ((upper0 - m) / z) ** 2
    ratios = peaks / m
    n = len(ratios)
    ratio_mean = float(ratios.mean())
    ratio_var = float(ratios.var(ddof=1)) if n > 1 else float("nan")
    k0, sd0 = PRIOR_PSEUDO_OBSERVATIONS, PRIOR_RATIO_SD
    pooled = ((n - 1) * (ratio_var if n > 1 else 0.0) + k0 * sd0**2) / (n - 1 + k0)
    c = max(ratio_mean, MIN_APPLIED_RATIO)
    var = pooled * (1.0 + 1.0 / n)
    # Coverage: c m + z sqrt(c^2 v + (m^2 + v) var) >= y for every observation.
    gap = peaks - c * m
    need = np.where(gap > 0, ((gap / z) ** 2 - c * c * v) / (m * m + v), 0.0)
    needed = float(need.max()) * (1.0 + 1e-9)
    raised = needed > var
    var = max(var, needed)
    result = Calibration(
        operator=operator, mean=float(c), var=float(var), n=n, ratio_mean=ratio_mean,
        ratio_var=ratio_var, max_ratio=float(ratios.max()), confidence=float(confidence),
        coverage_raised=bool(raised), n_over_uncalibrated_bound=int((peaks > upper0).sum()),
        updated=time.time(),
    )
    if save:
        runs = runs_dir if runs_dir is not None else getattr(store, "runs_dir", None)
        _save_calibration(result, calibration_path(operator, runs))
    return result


def _save_calibration(cal: Calibration, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    data = cal.to_dict()
    data["ratio_var"] = None if math.isnan(cal.ratio_var) else cal.ratio_var
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_calibration(operator: str, runs_dir=None) -> tuple[float, float] | None:
    """``(mean, var)`` saved by :func:`calibration` for ``operator``, or ``None``.

    Cheap (reads one small JSON file; imports neither distributed nor the store), for
    ``recommend_chunks``: ``model.with_calibration(*cal)`` when ``cal`` is not None.
    A malformed file is treated as absent.
    """
    try:
        with open(calibration_path(operator, runs_dir)) as f:
            data = json.load(f)
        mean, var = float(data["mean"]), float(data["var"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (mean > 0 and var >= 0 and math.isfinite(mean) and math.isfinite(var)):
        return None
    return mean, var


def calibrated_model(operator: str, runs_dir=None):
    """``load_model(operator, runs_dir)`` with the saved calibration applied (if any)."""
    from explorer.surrogate import load_model

    model = load_model(operator, runs_dir=runs_dir)
    cal = load_calibration(operator, runs_dir)
    return model.with_calibration(*cal) if cal is not None else model
