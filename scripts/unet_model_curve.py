"""unet3d's explored model against its measured curve (issue 13, item 4): the picture.

Reads every run of ``scripts/results/unet_curve.json`` (``scripts/unet_curve.py``: peak
along each dim at fixed others, and volumes; measured independently of the explore loop)
and the model ``explore unet3d`` saved in ``--runs-dir``, then draws peak versus each dim
with the model's mean and its one-sided bound at ``--confidence``, and says how the bound
covers those measured shapes (the ones the loop did not profile are held out for it).

    python scripts/unet_model_curve.py --runs-dir DIR [--confidence 0.99] [--out scripts/results/unet_model_curve]

Writes ``<out>.png`` and ``<out>.md`` (with the machine line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from explorer.model.load import load_model
from harness.machine import machine_line

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--curve", default=str(RESULTS / "unet_curve.json"))
    parser.add_argument("--out", default=str(RESULTS / "unet_model_curve"))
    args = parser.parse_args()
    model = load_model("unet3d", args.runs_dir)
    rows = [r for r in json.loads(Path(args.curve).read_text())["rows"] if r["status"] == "ok"]
    trained = {tuple(int(d) for d in s) for s in model.train_shapes}
    held = [r for r in rows if tuple(r["shape"]) not in trained]
    shapes = np.array([r["shape"] for r in held], dtype=np.int64)
    peaks = np.array([max(r["peaks"]) for r in held], dtype=np.float64)
    means = np.array([np.mean(r["peaks"]) for r in held], dtype=np.float64)
    mean, upper = model.predict_many(shapes, args.confidence)
    ape = np.abs(mean - means) / means
    covered = upper >= peaks
    ratio = upper / peaks

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [s for s in ("n1", "n2", "n3") if any(r["sweep"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), sharey=True)
    for ax, sweep in zip(np.atleast_1d(axes), sweeps):
        axis = int(sweep[1]) - 1
        pts = [r for r in rows if r["sweep"] == sweep]
        fixed = [d for i, d in enumerate(pts[0]["shape"]) if i != axis]
        x = np.array([r["shape"][axis] for r in pts])
        grid = np.arange(x.min(), x.max() + 1)
        dense = np.tile(pts[0]["shape"], (len(grid), 1))
        dense[:, axis] = grid
        m, u = model.predict_many(dense, args.confidence)
        ax.plot(grid, m / MIB, color="C0", lw=1, label="model mean")
        ax.plot(grid, u / MIB, color="C1", lw=1, label=f"{args.confidence:.0%} bound")
        ax.plot(x, [max(r["peaks"]) / MIB for r in pts], "k.", ms=4, label="measured (unet_curve.py)")
        ax.set_xlabel(f"{sweep} (others {fixed[0]}, {fixed[1]})")
        ax.set_title(f"peak vs {sweep}")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("isolated peak (MiB)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(f"unet3d: measured peaks, the model explored from {model.n_observations} profiles")
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)

    lines = [
        "# unet3d: the explored model against the measured curve",
        "",
        f"`python scripts/unet_model_curve.py {' '.join(sys.argv[1:])}`",
        "",
        f"Model: {model.n_observations} profiles; {len(held)} measured shapes of `scripts/unet_curve.py` it did not "
        f"profile ({len(rows) - len(held)} it did are left out).",
        "",
        f"- MAPE of the mean: {ape.mean():.2%} (max {ape.max():.2%})",
        f"- measured peaks under the {args.confidence:.0%} bound: {int(covered.sum())}/{len(held)} "
        f"({covered.mean():.1%})",
        f"- upper / measured: median {np.median(ratio):.3f}, min {ratio.min():.3f}, max {ratio.max():.3f}",
        "",
        "Not covered:" if not covered.all() else "Every measured shape covered.",
    ]
    for s, p, u in zip(shapes[~covered], peaks[~covered], upper[~covered]):
        lines.append(f"- {'x'.join(map(str, s))}: measured {p / MIB:.1f} MiB, bound {u / MIB:.1f} MiB")
    lines += ["", f"Machine: {machine_line()}", ""]
    Path(args.out + ".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
