"""The memory curve of unet3d (issue 13, item 4): isolated peak versus block shape.

Profiles ``unet3d`` with the project's own profiler (``explorer.measure.profiling.Profiler``: a
fresh forked child per run, the kernel's high-water mark) along each axis at fixed others
(``n_i`` over 40..200 in steps of 3, which visit every residue modulo 8, the others 64),
plus a few volumes, repeated. Then it asks two questions of the numbers:

* is the peak a step function of the padded dims ``ceil(n / 8) * 8``?  (runs whose padded
  shapes are equal are compared);
* is ``peak ~ a + b * V_padded``?  Least squares on every ok run, against the padded
  volume and against the raw volume, with relative residuals.

Writes ``scripts/results/unet_curve.md`` (tables, fits, the machine), ``unet_curve.json``
(every run) and ``unet_curve.png`` (peak versus each dim, and versus the padded volume).

    python scripts/unet_curve.py [--step 3] [--lo 40] [--hi 200] [--fixed 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from explorer.measure.profiling import Profiler
from harness.machine import machine_line
from operators.unet import padded_shape

OPERATOR = "unet3d"
RESULTS = Path(__file__).resolve().parent / "results"
#: Volumes beyond the sweeps (cubes and boxes, raw and padded volumes apart).
VOLUMES = [(32, 32, 32), (48, 48, 48), (64, 64, 64), (96, 96, 96), (128, 128, 128), (160, 160, 160),
           (57, 121, 90), (100, 130, 70), (200, 200, 40), (41, 41, 41), (129, 129, 129)]
MIB = 2**20


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Least squares ``y ~ a + b x``; returns ``a, b`` and the relative residuals ``(y - fit) / y``."""
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a), float(b), (y - (a + b * x)) / y


def fit_padded_flag(vp: np.ndarray, padded: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares ``y ~ a + b V_p + d [a dim was padded] V_p``; coefficients, relative residuals."""
    design = np.column_stack([np.ones_like(vp), vp, padded * vp])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return coef, (y - design @ coef) / y


def fit_two_phases(vp: np.ndarray, padded: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``y ~ max(a1 + b1 V_p, b2 V_p) + d [padded] V_p``, least squares on relative residuals:
    a phase with a fixed cost (the bottleneck's reordered weights) and one linear in V_p."""
    from scipy.optimize import least_squares

    def model(theta):
        a1, b1, b2, d = theta
        return np.maximum(a1 + b1 * vp, b2 * vp) + d * padded * vp

    start = np.array([27.0 * MIB, 80.0, 320.0, 4.0])
    theta = least_squares(lambda t: (y - model(t)) / y, start, x_scale=start).x
    return theta, (y - model(theta)) / y


def profile_all(shapes, repeat: int) -> list[dict]:
    rows = []
    with Profiler(gpu=False) as profiler:
        for label, shape in shapes:
            started = time.perf_counter()
            m = profiler.profile(OPERATOR, shape, repeat=repeat)
            wall = time.perf_counter() - started
            ok = [r for r in m.repeats if r.get("status") == "ok"]
            row = {
                "sweep": label,
                "shape": list(shape),
                "padded": list(padded_shape(shape)),
                "status": m.status,
                "peaks": [int(r["peak_bytes"]) for r in ok],
                "seconds": [float(r["seconds"]) for r in ok],
                "child_wall_seconds": [float(r["child_wall_seconds"]) for r in ok],
                "profile_wall_seconds": wall,
                "error": m.error,
            }
            rows.append(row)
            peak = max(row["peaks"]) / MIB if row["peaks"] else float("nan")
            print(f"{label:>6} {'x'.join(map(str, shape)):>12} -> {'x'.join(map(str, row['padded'])):>12}: "
                  f"{m.status} peak {peak:8.2f} MiB, run {np.median(row['seconds'] or [np.nan]):6.2f} s, "
                  f"profile {wall:5.1f} s", flush=True)
    return rows


def step_check(rows: list[dict]) -> tuple[int, float]:
    """Groups of runs with equal padded shapes: how many, and the largest relative spread
    (max - min) / min of their peaks within a group."""
    groups: dict[tuple, list[int]] = {}
    for row in rows:
        groups.setdefault(tuple(row["padded"]), []).extend(row["peaks"])
    spreads = [(max(p) - min(p)) / min(p) for p in groups.values() if len(p) > 1]
    return sum(len(p) > 1 for p in groups.values()), max(spreads) if spreads else float("nan")


def plot(rows: list[dict], fits: dict, path: Path, fixed: int) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is in the venv here
        return f"no plot: matplotlib unavailable ({exc})"
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    for axis, ax in enumerate(axes.flat[:3]):
        sweep = sorted((r for r in rows if r["sweep"] == f"n{axis + 1}" and r["peaks"]), key=lambda r: r["shape"][axis])
        n = np.array([r["shape"][axis] for r in sweep])
        peak = np.array([max(r["peaks"]) for r in sweep]) / MIB
        ax.plot(n, peak, "o", ms=4, label="measured peak")
        a, b = fits["padded"][:2]
        dense = np.arange(int(n.min()), int(n.max()) + 1)
        shape = np.array(sweep[0]["shape"])
        dense_vp = np.array([math.prod(padded_shape(np.where(np.arange(3) == axis, k, shape))) for k in dense])
        ax.step(dense, (a + b * dense_vp) / MIB, where="mid", lw=1, color="C1", label="a + b V_padded")
        for k in range(int(n.min()) // 8 * 8, int(n.max()) + 8, 8):
            ax.axvline(k + 0.5, color="0.85", lw=0.5, zorder=0)
        others = [f"n{j + 1}={fixed}" for j in range(3) if j != axis]
        ax.set_xlabel(f"n{axis + 1} ({', '.join(others)}); grey lines: multiples of 8 (+0.5)")
        ax.set_ylabel("peak (MiB)")
        ax.legend(loc="upper left", fontsize=8)
    ax = axes.flat[3]
    ok = [r for r in rows if r["peaks"]]
    vp = np.array([math.prod(r["padded"]) for r in ok], dtype=float)
    peak = np.array([max(r["peaks"]) for r in ok]) / MIB
    ax.loglog(vp, peak, "o", ms=3, label="every shape")
    grid = np.geomspace(vp.min(), vp.max(), 50)
    a, b = fits["padded"][:2]
    ax.loglog(grid, (a + b * grid) / MIB, "-", color="C1", label=f"{a / MIB:.1f} MiB + {b:.0f} B x V_padded")
    a1, b1, b2, _ = fits["two_phases"]
    ax.loglog(grid, np.maximum(a1 + b1 * grid, b2 * grid) / MIB, "--", color="C2",
              label=f"max({a1 / MIB:.1f} MiB + {b1:.0f} B x V_p, {b2:.0f} B x V_p)")
    ax.set_xlabel("padded volume (voxels)")
    ax.set_ylabel("peak (MiB)")
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("unet3d (FaultSeg3D U-Net, torch CPU, 1 thread): isolated peak vs block shape")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"plot: {path.name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lo", type=int, default=40)
    parser.add_argument("--hi", type=int, default=200)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--fixed", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1, help="runs per sweep shape")
    parser.add_argument("--volume-repeat", type=int, default=3, help="runs per volume")
    parser.add_argument("--from-json", action="store_true",
                        help="analyse scripts/results/unet_curve.json again instead of profiling")
    args = parser.parse_args()

    if args.from_json:
        saved = json.loads((RESULTS / "unet_curve.json").read_text())
        rows, total, args = saved["rows"], saved["seconds"], argparse.Namespace(**saved["args"])
    else:
        started = time.perf_counter()
        sweeps = []
        for axis in range(3):
            for n in range(args.lo, args.hi + 1, args.step):
                shape = [args.fixed] * 3
                shape[axis] = n
                sweeps.append((f"n{axis + 1}", tuple(shape)))
        rows = profile_all(sweeps, args.repeat)
        rows += profile_all([("volume", s) for s in VOLUMES], args.volume_repeat)
        total = time.perf_counter() - started
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "unet_curve.json").write_text(json.dumps(
            {"rows": rows, "machine": machine_line(), "seconds": total, "args": vars(args)}, indent=1))

    ok = [r for r in rows if r["peaks"]]
    peak = np.array([max(r["peaks"]) for r in ok], dtype=float)
    vp = np.array([math.prod(r["padded"]) for r in ok], dtype=float)
    v = np.array([math.prod(r["shape"]) for r in ok], dtype=float)
    padded = np.array([r["padded"] != r["shape"] for r in ok], dtype=float)
    fits = {"padded": fit_line(vp, peak), "raw": fit_line(v, peak)}
    large = vp >= 64**3
    flag_coef, flag_rel = fit_padded_flag(vp[large], padded[large], peak[large])
    two_coef, two_rel = fit_two_phases(vp, padded, peak)
    fits["two_phases"] = two_coef
    groups, spread = step_check(ok)
    repeats = [np.array(r["peaks"], float) for r in ok if len(r["peaks"]) > 1]
    cv = max(p.std(ddof=1) / p.mean() for p in repeats) if repeats else float("nan")

    lines = ["# unet3d: isolated peak versus block shape", "",
             f"`python scripts/unet_curve.py --lo {args.lo} --hi {args.hi} --step {args.step} --fixed {args.fixed} "
             f"--repeat {args.repeat} --volume-repeat {args.volume_repeat}`: {len(rows)} shapes, "
             f"{sum(len(r['peaks']) for r in rows)} runs, {total:.0f} s. Each run is a fresh child of the "
             "profiling server (torch imported and the network built in its warm-up, outside the peak). "
             "`peak` is the largest run's `peak_bytes`; `run s` the median time of `run` alone; `profile s` "
             "the wall time of the whole profile (child start, torch import, warm-up, run; all repeats).", ""]
    lines += ["## Fits", "",
              "| model | a (MiB) | b (bytes/voxel) | max abs rel. residual | RMS rel. residual |",
              "|---|---|---|---|---|"]
    for name, label in (("padded", "a + b V_padded (every shape)"), ("raw", "a + b V_raw (every shape)")):
        a, b, rel = fits[name]
        lines.append(f"| {label} | {a / MIB:.2f} | {b:.1f} | {np.abs(rel).max():.1%} | "
                     f"{np.sqrt(np.mean(rel**2)):.1%} |")
    a, b, rel = fit_line(vp[large], peak[large])
    lines.append(f"| a + b V_padded (V_padded >= 64^3, {int(large.sum())} shapes) | {a / MIB:.2f} | {b:.1f} | "
                 f"{np.abs(rel).max():.1%} | {np.sqrt(np.mean(rel**2)):.1%} |")
    a, b, rel = fit_line(v[large], peak[large])
    lines.append(f"| a + b V_raw (V_padded >= 64^3) | {a / MIB:.2f} | {b:.1f} | "
                 f"{np.abs(rel).max():.1%} | {np.sqrt(np.mean(rel**2)):.1%} |")
    lines.append(f"| a + b V_padded + d [padded] V_padded (V_padded >= 64^3), d = {flag_coef[2]:.2f} B | "
                 f"{flag_coef[0] / MIB:.2f} | {flag_coef[1]:.1f} | {np.abs(flag_rel).max():.1%} | "
                 f"{np.sqrt(np.mean(flag_rel**2)):.1%} |")
    a1, b1, b2, d = two_coef
    lines.append(f"| max(a + b1 V_padded, b V_padded) + d [padded] V_padded (every shape), b1 = {b1:.1f} B, "
                 f"d = {d:.2f} B | {a1 / MIB:.2f} | {b2:.1f} | {np.abs(two_rel).max():.1%} | "
                 f"{np.sqrt(np.mean(two_rel**2)):.1%} |")
    lines += ["", "`[padded]` is 1 when some dim is not a multiple of 8 (the block is copied into a padded one "
              "and the output trimmed), 0 otherwise."]
    run_s = np.array([np.median(r["seconds"]) for r in ok])
    overhead = np.array([r["profile_wall_seconds"] / len(r["peaks"]) - np.median(r["seconds"]) for r in ok])
    lines += ["", f"Time: `run` takes {np.median(run_s[large] / vp[large]) * 1e6:.2f} us per padded voxel "
              f"(median over V_padded >= 64^3; {run_s.min():.2f} s to {run_s.max():.2f} s here); a profile adds "
              f"{np.median(overhead):.1f} s per run beyond it (median; {overhead.min():.1f} to {overhead.max():.1f} s: "
              "the child's torch import, network build and warm-up on a block of up to 104 per axis)."]
    lines += ["", f"Step function: {groups} padded shapes were reached by more than one raw shape (or repeat); "
              f"the largest relative spread (max - min) / min of peaks within one padded shape is {spread:.2%} "
              "(the raw shapes that need padding cost the `[padded]` term more than the one that does not). "
              f"Largest coefficient of variation over repeats of one shape: {cv:.2%}.", ""]
    lines += ["## Every shape", "",
              "| sweep | shape | padded | V_padded | peak (MiB) | peak / V_padded (B) | rel. residual (padded fit) | "
              "run s | profile s |", "|---|---|---|---|---|---|---|---|---|"]
    a, b, _ = fits["padded"]
    for r in rows:
        vpad = math.prod(r["padded"])
        if r["peaks"]:
            p = max(r["peaks"])
            lines.append(f"| {r['sweep']} | {'x'.join(map(str, r['shape']))} | {'x'.join(map(str, r['padded']))} | "
                         f"{vpad:,} | {p / MIB:.2f} | {p / vpad:.0f} | {(p - a - b * vpad) / p:+.1%} | "
                         f"{np.median(r['seconds']):.2f} | {r['profile_wall_seconds']:.1f} |")
        else:
            lines.append(f"| {r['sweep']} | {'x'.join(map(str, r['shape']))} | {'x'.join(map(str, r['padded']))} | "
                         f"{vpad:,} | {r['status']}: {r['error']} | | | | |")
    lines += ["", plot(rows, fits, RESULTS / "unet_curve.png", args.fixed), "", f"Machine: {machine_line()}"]
    (RESULTS / "unet_curve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:18]))


if __name__ == "__main__":
    main()
