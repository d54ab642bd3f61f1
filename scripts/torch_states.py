"""Per-shape states of ``unseen_torch_conv`` (issue 33): the peak per voxel of neighbouring blocks.

The benchmark family ``unseen_torch_conv`` (``scripts/unseen_operators.py``) steps at
``n1 n2 = 5120`` and ``20480`` (its layers leave ``Slow3d``; ``docs/model.md``, Regimes).  Above
both, the calibration of 2026-11-28 (``docs/calibration.md``) missed blocks whose peak per voxel
was about 20% above their neighbours'.  This script profiles blocks one voxel apart along one
axis, and a sweep of the samples axis at fixed ``n1 x n2``, with the project's profiler (a fresh
child per run in a profiling server, the kernel's high-water mark: ``explorer.measure.profiling``),
and says for each block its ``peak_bytes`` per voxel.  Is the peak a smooth function of the
block's dims above the last step, or does it jump from one block to the next?

Writes ``scripts/results/torch_states.md`` (the table, the machine).

    python scripts/torch_states.py [--repeat 1] [--step 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OPERATOR = "unseen_torch_conv"
MIB = 2**20
#: Blocks one voxel apart (each pair differs in one dim); the first of each is a held-out block the
#: calibration of 2026-11-28 missed (seeds 72 and 78).
PAIRS = [((381, 91, 156), (380, 91, 156)), ((381, 91, 156), (381, 91, 157)), ((381, 91, 156), (381, 90, 156)),
         ((191, 228, 115), (192, 228, 115)), ((104, 449, 197), (104, 449, 196))]
#: The samples axis swept at this ``n1 x n2`` (``34671``, above both steps).
SWEEP_N12 = (381, 91)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per block, each in a fresh child")
    parser.add_argument("--step", type=int, default=8, help="step of the samples sweep (40..200)")
    args = parser.parse_args()
    os.environ["EXPLORER_PLUGINS"] = "unseen_operators"  # the profiling server imports the family
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from explorer.measure.profiling import Profiler
    from harness.machine import machine_line

    import unseen_operators  # noqa: F401 (registers the family here too)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    sweep = [(*SWEEP_N12, n3) for n3 in range(40, 201, args.step)]
    shapes = list(dict.fromkeys([s for pair in PAIRS for s in pair] + sweep))
    per_voxel = {}
    with Profiler(gpu=False) as profiler:
        for i, shape in enumerate(shapes, 1):
            m = profiler.profile(OPERATOR, shape, repeat=args.repeat)
            per_voxel[shape] = (m.peak_bytes, m.peak_bytes / float(np.prod(shape)))
            print(f"[{i}/{len(shapes)}] {'x'.join(map(str, shape))}: {m.peak_bytes / MIB:.1f} MiB, "
                  f"{per_voxel[shape][1]:.1f} B/voxel", flush=True)

    lines = [f"# `{OPERATOR}`: peak per voxel of neighbouring blocks", "",
             f"`python scripts/torch_states.py --repeat {args.repeat} --step {args.step}`, {started}, "
             f"{machine_line()}", "", "## Blocks one voxel apart", "",
             "| block | peak MiB | B/voxel | neighbour | peak MiB | B/voxel | ratio |", "|---|---|---|---|---|---|---|"]
    for a, b in PAIRS:
        (pa, va), (pb, vb) = per_voxel[a], per_voxel[b]
        lines.append(f"| {'x'.join(map(str, a))} | {pa / MIB:.1f} | {va:.1f} | {'x'.join(map(str, b))} | "
                     f"{pb / MIB:.1f} | {vb:.1f} | {pa / pb:.3f} |")
    values = np.array([per_voxel[s][1] for s in sweep])
    low = float(values.min())
    high = values > 1.05 * low
    lines += ["", f"## The samples axis at n1 x n2 = {SWEEP_N12[0]} x {SWEEP_N12[1]}", "",
              "| n3 | peak MiB | B/voxel |", "|---|---|---|"]
    lines += [f"| {s[2]} | {per_voxel[s][0] / MIB:.1f} | {per_voxel[s][1]:.1f} |" for s in sweep]
    lines += ["", f"{int(high.sum())} of {len(sweep)} blocks of the sweep peak more than 5% above its lowest "
              f"({low:.1f} B/voxel), by {np.round(values[high] / low, 3).tolist()}."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "torch_states.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
