"""What a profile of the loop costs beyond its operator's own seconds: ``SessionProfiler`` (two
servers, a repeat in each, as ``explore`` profiles), warm servers, shapes new to them.

    python scripts/profile_overhead.py [--operator gst3d] [--rounds 3]

Per shape: wall seconds of ``profile(..., repeat=2)``, the operator's seconds over both runs, and
the rest (input volumes, forks, IPC, the servers' collections); per round the sum over the
shapes, each round on fresh seeds (so every shape's input is new to the servers).  Markdown to
stdout, with the machine and the commit the code came from.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from explorer.measure.profiling import SessionProfiler
from harness.machine import machine_line

#: Shapes like those the loop profiles for gst3d (small to about 3 M voxels).
SHAPES = ((64, 58, 201), (74, 64, 121), (214, 116, 38), (239, 66, 208), (100, 60, 80), (40, 40, 40),
          (150, 90, 120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operator", default="gst3d")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    print(f"`python scripts/profile_overhead.py --operator {args.operator} --rounds {args.rounds}`, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code of commit {commit}. Machine: {machine_line()}.\n")
    print("| round | profiles | wall | inside the operator | beyond it | beyond it, per profile |\n|---|---:|---:|---:|---:|---:|")
    beyond_all = []
    with SessionProfiler(2, gpu=False) as sessions:
        sessions.profile(args.operator, (16, 16, 16), repeat=2)  # both servers warm
        for k in range(args.rounds):
            wall = inside = 0.0
            for shape in SHAPES:
                started = time.perf_counter()
                m = sessions.profile(args.operator, shape, repeat=2, seed=k + 1)
                wall += time.perf_counter() - started
                inside += sum(r.get("seconds") or 0.0 for r in m.repeats)
            beyond_all.append(wall - inside)
            print(f"| {k + 1} | {len(SHAPES)} | {wall:.3f} s | {inside:.3f} s | {wall - inside:.3f} s | "
                  f"{(wall - inside) / len(SHAPES) * 1000:.0f} ms |")
    print(f"\nBeyond the operator, median over the rounds: {statistics.median(beyond_all):.3f} s for "
          f"{len(SHAPES)} profiles ({statistics.median(beyond_all) / len(SHAPES) * 1000:.0f} ms a profile).")


if __name__ == "__main__":
    main()
