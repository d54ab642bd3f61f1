"""Seconds per voxel of ``operator.run`` on blocks of one volume and different shapes.

The planner's clock (``explorer.plan.time_model.TaskClock``) knows a block by its volume only, learnt
from cube probes.  This measures, in one process, how much a block's shape alone changes the
operator's speed: each shape's ``run`` on a synthetic block, the least of ``--repeat`` runs
(after one warm-up on a small block), in ns per voxel.

    python scripts/shape_speed.py [gst3d] [--shapes 133x133x133,133x133x256,...] [--repeat 3]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import time

import operators
from explorer.core.units import format_shape, parse_shape
from harness.machine import machine_line

DEFAULT_SHAPES = "133x133x133,176x176x176,133x133x256,133x256x133,256x133x133,74x256x256,256x74x256,256x256x74"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("operator", nargs="?", default="gst3d")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    op = operators.get(args.operator)
    op.run(operators.synthetic_volume((20, 20, 20), seed=1))  # lazy imports, first-use allocations
    print(f"## `{args.operator}`: `operator.run` on blocks of different shapes, least of {args.repeat}\n")
    print("| block | voxels | seconds | ns per voxel |")
    print("|---|---:|---:|---:|")
    for text in args.shapes.split(","):
        shape = parse_shape(text)
        x = operators.synthetic_volume(shape, seed=1)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            op.run(x)
            best = min(best, time.perf_counter() - started)
        voxels = x.size
        print(f"| {format_shape(shape)} | {voxels:,} | {best:.3f} | {best / voxels * 1e9:.0f} |")
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
