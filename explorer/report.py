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

import os
from pathlib import Path

import numpy as np


def _volume(shapes) -> np.ndarray:
    shapes = np.asarray(shapes, dtype=float).reshape(-1, 3)
    return shapes.prod(axis=1)


def explore_report(model, records, steps, path, *, confidence=0.99, memory_limit=None, tolerance=None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax_unc) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})

    groups = {
        ("profile", "ok"): dict(marker="o", color="C0", label="isolated profile"),
        ("profile", "exceeded"): dict(marker="^", color="C3", label="exceeded cap (lower bound)"),
        ("production", "ok"): dict(marker="x", color="C2", label="production task"),
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

    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)  # never a half-written picture
    return path
