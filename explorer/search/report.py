"""Pictures of what was learnt: measured peaks against the model, and how uncertainty fell.

``explore_report`` draws ``runs/<operator>/report.png`` with two panels:

* peak bytes against block volume (log-log): isolated profiles (dots; exceeded
  profiles as upward triangles, lower bounds), production observations (crosses),
  the model's mean and its upper bound along cubic blocks and along blocks of
  aspect 1:1:4, and the band of task memory the target worker memory asks about;
* the bound's maximum relative half-width over the target region after each
  profile of this run, against the tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from explorer.core.atomic import atomic_path


def _volume(shapes) -> np.ndarray:
    shapes = np.asarray(shapes, dtype=float).reshape(-1, 3)
    return shapes.prod(axis=1)


def _peak_panel(ax, model, records, confidence, memory_limit, calibrated=None) -> None:
    """Measured peaks against block volume with the model's mean and bound."""
    groups = {
        ("profile", "ok"): dict(marker="o", color="C0", label="isolated profile"),
        ("profile", "exceeded"): dict(marker="^", color="C3", label="exceeded cap (lower bound)"),
        ("probe", "ok"): dict(marker="+", color="C4", label="in-worker probe task"),
        ("production", "ok"): dict(marker="x", color="C2", label="production task (in a worker)"),
    }
    for (source, status), style in groups.items():
        chosen = [r for r in records if r.source == source and r.status == status and r.peak_bytes]
        if chosen:
            ax.scatter(_volume([r.shape for r in chosen]), [r.peak_bytes for r in chosen], s=22, zorder=3,
                       linestyle="none", **style)

    volumes = _volume([r.shape for r in records if r.peak_bytes]) if records else np.array([1e5])
    v_lo, v_hi = max(volumes.min() / 4, 512), volumes.max() * 16
    edges = np.geomspace(v_lo ** (1 / 3), v_hi ** (1 / 3), 80)
    for aspect, style in (((1, 1, 1), "-"), ((1, 1, 4), "--")):
        scale = (np.prod(aspect)) ** (1 / 3)
        shapes = np.maximum(1, np.round(np.outer(edges / scale, aspect))).astype(np.int64)
        mean, upper = model.predict_many(shapes, confidence=confidence)
        label = f"{aspect[0]}:{aspect[1]}:{aspect[2]} blocks"
        ax.plot(_volume(shapes), mean, style, color="k", lw=1.2, label=f"model mean, {label}")
        ax.fill_between(_volume(shapes), mean, upper, color="k", alpha=0.12,
                        label=f"{confidence:.0%} bound, {label}" if aspect == (1, 1, 1) else None)
        if calibrated is not None and aspect == (1, 1, 1):
            c_mean, c_upper = calibrated.predict_many(shapes, confidence=confidence)
            ax.plot(_volume(shapes), c_upper, ":", color="C2", lw=1.5,
                    label=f"in-worker {confidence:.0%} bound (calibrated)")
    if memory_limit:
        ax.axhspan(0.01 * memory_limit, memory_limit, color="C1", alpha=0.07,
                   label="target task memory (1-100% of limit)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("block volume (voxels)")
    ax.set_ylabel("peak_bytes")
    ax.set_title(f"{model.operator}: peak memory beyond the input")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    return plt, fig, axes


def _save(plt, fig, path) -> Path:
    path = Path(path)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:  # never a half-written picture
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
    return path


def explore_report(model, records, steps, path, *, confidence=0.99, memory_limit=None, tolerance=None) -> Path:
    """The picture ``explore`` leaves in ``runs/<operator>/report.png``."""
    plt, fig, (ax, ax_unc) = _figure()
    _peak_panel(ax, model, records, confidence, memory_limit)
    measured = [(s.index, s.max_relative_uncertainty) for s in steps if s.max_relative_uncertainty is not None]
    if measured:
        index, unc = zip(*measured)
        ax_unc.plot(index, np.asarray(unc) * 100, "o-", color="C0")
        if tolerance:
            ax_unc.axhline(tolerance * 100, color="C3", ls="--", label=f"tolerance {tolerance:.0%}")
            ax_unc.legend(fontsize=8)
        ax_unc.set_yscale("log")
    else:
        ax_unc.text(0.5, 0.5, "no new profiles in this run", ha="center", va="center", transform=ax_unc.transAxes)
    ax_unc.set_xlabel("profiles in the store")
    ax_unc.set_ylabel("max relative half-width over target (%)")
    ax_unc.set_title("uncertainty of the bound")
    ax_unc.grid(True, which="both", alpha=0.2)
    return _save(plt, fig, path)


def operator_report(operator: str, *, runs_dir=None, storage=None, confidence: float = 0.99) -> dict:
    """Every stored observation of ``operator`` against the model, as a table and a picture.

    Isolated profiles are compared with the isolated model; tasks inside Dask workers
    (explore's probes and production) with the in-worker task model
    (``explorer.plan.task_model.TaskModel``), the one ``recommend_chunks`` applies.  A model
    or calibration learnt in another environment is a ``warning:`` line of the summary.  Writes ``runs/<operator>/report.png`` and returns
    ``{"rows": [...], "summary": [...], "report_path": ...}``.
    """
    from explorer.core import paths
    from explorer.plan.excess import IN_WORKER_SOURCES
    from explorer.plan.task_model import task_model
    from explorer.search.store import SOURCE_RUN, Store

    store = Store(runs_dir, storage)  # a bad storage URL is the first thing to say
    tasks = task_model(operator, runs_dir=runs_dir)
    model = tasks.isolated
    calibrated = tasks if tasks.excess is not None else None
    records = [r for r in store.records(operator) if r.source != SOURCE_RUN]
    rows = []
    for r in records:
        against = tasks if r.source in IN_WORKER_SOURCES else model
        mean, upper = against.predict(r.shape, confidence)
        measured = r.peak_bytes
        rows.append({
            "source": r.source, "shape": list(r.shape), "status": r.status, "peak_bytes": measured,
            "mean_bytes": mean, "upper_bytes": upper,
            "ratio": (measured / mean) if measured and r.status == "ok" else None,
            "over_bound": bool(measured and r.status == "ok" and measured > upper),
        })
    summary = []
    for source in sorted({row["source"] for row in rows}):
        chosen = [row for row in rows if row["source"] == source and row["ratio"] is not None]
        if not chosen:
            continue
        errors = np.abs(np.array([row["ratio"] for row in chosen]) - 1)
        over = sum(row["over_bound"] for row in chosen)
        summary.append(f"{source}: {len(chosen)} observations, mean absolute error {errors.mean():.1%}, "
                       f"{over} over the {confidence:.0%} bound")
    if calibrated is not None:
        e, cal = tasks.excess, tasks.calibration
        method = e.quantile(confidence)[1]
        summary.append(f"in-worker calibration: task peak = isolated peak {e.intercept_bytes / 2**20:+.2f} MiB "
                       f"{e.bytes_per_voxel:+.2f} B/voxel (residual sd {e.residual_sd / 2**20:.2f} MiB, "
                       f"{cal.n_groups} groups of which {cal.n_probe_groups} probes, {cal.n_tasks} tasks; "
                       f"{method} quantile, {e.dof} dof)")
        if tasks.within is not None:
            w = tasks.within
            summary.append(f"tasks of one run on one block differ by sd {w.alpha_bytes / 2**20:.2f} MiB + "
                           f"{w.beta:.1%} of the task ({w.quantile(confidence)[1]} quantile, {w.dof} dof, "
                           f"{len(w.scores)} tasks)")
    summary.extend(f"warning: {line}" for line in tasks.warnings)

    plt, fig, (ax, ax_ratio) = _figure()
    _peak_panel(ax, model, records, confidence, None, calibrated=calibrated)
    for source, style in (("profile", dict(marker="o", color="C0")), ("probe", dict(marker="+", color="C4")),
                          ("production", dict(marker="x", color="C2"))):
        chosen = [(row["shape"], row["peak_bytes"]) for row in rows
                  if row["source"] == source and row["ratio"] is not None]
        if chosen:
            shapes, measured = zip(*chosen)
            isolated_mean, _ = model.predict_many(np.asarray(shapes), confidence)
            ax_ratio.scatter(_volume(shapes), np.asarray(measured) / isolated_mean, s=22, label=source, **style)
    ax_ratio.axhline(1.0, color="k", lw=1)
    ax_ratio.set_xscale("log")
    ax_ratio.set_xlabel("block volume (voxels)")
    ax_ratio.set_ylabel("measured / isolated model mean")
    ax_ratio.set_title("where production departs from isolation")
    ax_ratio.legend(fontsize=8)
    ax_ratio.grid(True, which="both", alpha=0.2)
    path = _save(plt, fig, paths.report_path(operator, runs_dir))
    return {"operator": operator, "rows": rows, "summary": summary, "warnings": tasks.warnings,
            "report_path": str(path)}
