"""Where an operator's run-to-run noise comes from: every profile's repeats and the relative
and absolute run noise the surrogate learnt from them.

Explores ``OP`` from an empty runs directory first when it has no model there
(``explore OP --probes 0 --seed SEED``), then prints, per profile, its runs, their spread in
bytes and as a share of the peak, and the model's learnt run noise
(``MemoryModel.hyperparameters``: ``relative_run_sd`` and ``abs_noise_sd_bytes``) and the
relative half-width of its 99% bound that this noise alone would give at the largest and
smallest profiled peak (``t_nu(0.99) * sqrt(rho^2 + (a / peak)^2)``).

    python scripts/run_noise.py envelope [--runs-dir DIR] [--seed 0]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from harness.machine import machine_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("operator")
    parser.add_argument("--runs-dir", default=None, type=Path, help="default runs/noise-<op>-<seed>")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from explorer.core.paths import model_path
    from explorer.model.stats import t_quantile
    from explorer.search.store import SOURCE_PROFILE, Store
    from explorer.model.load import load_model

    runs = args.runs_dir or Path("runs") / f"noise-{args.operator}-{args.seed}"
    if not model_path(args.operator, runs).exists():
        subprocess.run(["explore", args.operator, "--probes", "0", "--seed", str(args.seed), "--runs-dir", str(runs)],
                       check=True, stdout=subprocess.DEVNULL)
    print(f"`python scripts/run_noise.py {' '.join(sys.argv[1:])}` (runs directory {runs})\n")
    print("| shape | runs (KiB) | spread (KiB) | spread / peak |")
    print("|---|---|---|---|")
    for r in Store(runs).records(args.operator, source=SOURCE_PROFILE):
        if r.repeats and len(r.repeats) > 1:
            runs_b = np.asarray(r.repeats, dtype=np.float64)
            spread = float(np.ptp(runs_b))
            print(f"| {'x'.join(map(str, r.shape))} | {', '.join(f'{v / 1024:.0f}' for v in runs_b)} | "
                  f"{spread / 1024:.0f} | {spread / runs_b.mean():.2%} |")
    model = load_model(args.operator, runs)
    hyper = model.hyperparameters
    rho, a = float(hyper["relative_run_sd"]), float(hyper["abs_noise_sd_bytes"])
    t = t_quantile(0.99, float(hyper["predictive_dof"])) * float(hyper["certified_factor"])
    peaks = np.asarray(model.train_bytes, dtype=np.float64)
    small, large = float(peaks.min()), float(peaks.max())

    def half_width(peak: float) -> float:
        return t * float(np.hypot(rho, a / peak))

    print(f"\nLearnt run noise (`explorer.model.stats.fit_spread`, {hyper['run_noise_dof']:.0f} dof): relative sd {rho:.2%}, "
          f"absolute sd {a / 1024:.0f} KiB.  This noise alone makes the 99% bound's relative half-width at least "
          f"{half_width(large):.1%} at the largest profiled peak ({large / 2**20:.1f} MiB) and "
          f"{half_width(small):.1%} at the smallest ({small / 2**20:.2f} MiB) (t = {t:.2f}).")
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
