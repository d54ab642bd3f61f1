"""Benchmark of the profiler (issue 2): per operator and shape,

* peak bytes per voxel (``peak_bytes / voxels``),
* coefficient of variation of ``peak_bytes`` over repeats (target <= 1% from 1M voxels up),
* per-run overhead beyond the operator's own time, with a warm server (target <= 0.15 s),
* agreement of ``process_peak_bytes`` with an independent measure: the maximum
  resident set size that ``/usr/bin/time -v`` reports for a fresh process that
  imports what the profiling server preloads, loads the same volume from disk
  and runs the same operator (target within 3%).

    python scripts/bench_profiler.py [--repeat 5] [--operators gst3d,envelope] [--shapes 64,100,160]

Prints a Markdown table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import operators
from explorer.measure.profiling import Profiler
from harness.machine import machine_line

# The same process set-up as the profiling server: the modules it preloads and
# glibc's mmap threshold pinned at 128 KiB (here through glibc's own environment
# variable, read at start-up, instead of mallopt).
FRESH = (
    "import sys, numpy as np, scipy.ndimage, scipy.signal, operators\n"
    "x = np.load(sys.argv[1])\n"
    "y = operators.get(sys.argv[2]).run(x)\n"
)


def fresh_max_rss(operator: str, volume_path: str) -> int:
    """Max RSS (bytes) of a fresh interpreter doing the same work, from GNU time."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", FRESH, volume_path, operator],
                         capture_output=True, text=True, env=env, check=True)
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return kib * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--operators", default=",".join(operators.names()))
    parser.add_argument("--shapes", default="64,100,160", help="cube edges")
    args = parser.parse_args()
    edges = [int(e) for e in args.shapes.split(",")]

    print("| operator | shape | voxels | peak bytes/voxel | CV over repeats | overhead/run (s) | operator s | "
          "process peak | fresh process max RSS | difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst_cv, worst_overhead, worst_diff = 0.0, 0.0, 0.0
    with Profiler(gpu=False) as profiler, tempfile.TemporaryDirectory() as tmp:
        startup = profiler.startup_seconds
        for name in args.operators.split(","):
            for edge in edges:
                shape = (edge, edge, edge)
                voxels = edge**3
                m = profiler.profile(name, shape, repeat=args.repeat)
                if m.status != "ok":
                    print(f"| {name} | {edge}^3 | {voxels:,} | {m.status}: {m.error} | | | | | | |")
                    continue
                peaks = np.array([r["peak_bytes"] for r in m.repeats], dtype=float)
                cv = peaks.std(ddof=1) / peaks.mean() if len(peaks) > 1 else float("nan")
                overhead = m.overhead_seconds / len(m.repeats)
                path = os.path.join(tmp, "x.npy")
                np.save(path, operators.synthetic_volume(shape))
                fresh = fresh_max_rss(name, path)
                diff = (m.process_peak_bytes - fresh) / fresh
                if voxels >= 1_000_000:
                    worst_cv = max(worst_cv, cv)
                    worst_diff = max(worst_diff, abs(diff))
                worst_overhead = max(worst_overhead, overhead)
                print(f"| {name} | {edge}^3 | {voxels:,} | {peaks.mean() / voxels:.1f} | {cv:.2%} | "
                      f"{overhead:.3f} | {m.seconds:.3f} | {m.process_peak_bytes / 2**20:.1f} MiB | "
                      f"{fresh / 2**20:.1f} MiB | {diff:+.1%} |", flush=True)
    print()
    print(f"From 1M voxels up: worst CV {worst_cv:.2%} (target <= 1%), worst process-peak difference "
          f"{worst_diff:.1%} (target <= 3%). Worst per-run overhead {worst_overhead:.3f} s (target <= 0.15 s; "
          f"includes building the synthetic volume once per profile). Server start-up {startup:.2f} s, once.")
    print(f"Machine: {machine_line()}")


if __name__ == "__main__":
    main()
