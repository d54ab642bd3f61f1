"""Seconds to read a block from a SEG-Y file, by the block's shape (``operators.segy.SegyVolume``).

A task reads its own block from the file (``explorer.runner.daskrun``'s windowed reads).  SEG-Y stores
the volume trace by trace, and ``SegyVolume`` reads whole traces (``segyio``'s raw trace reads)
and keeps the block's samples: a block that keeps part of each trace pays for the whole trace.
The planner's clock is learnt from probes on synthetic volumes of the block's own size, whose
traces are the block's length, so it never sees that cost.  This measures it: each block shape
read from one synthetic volume, the median of ``--repeat`` reads (after one warm-up read), in ns
per voxel kept and per sample read (the block's traces times the file's samples per trace).

    python scripts/read_cost.py [--volume 320x320x320] [--shapes 160x160x320,...] [--repeat 15]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import operators
from explorer.core.units import format_shape, parse_shape
from harness.machine import machine_line
from operators.segy import segy_volume

DEFAULT_SHAPES = "80x320x320,160x160x320,160x160x160,80x80x320,80x80x160,107x107x107"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--volume", default="320x320x320")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    volume = parse_shape(args.volume)
    with tempfile.TemporaryDirectory(prefix="read-cost-") as tmp:
        path = Path(tmp) / "volume.sgy"
        operators.write_segy(path, operators.synthetic_volume(volume, seed=0))
        source = segy_volume(path)
        source[:8, :8, :]  # open, map and page in the headers once
        print(f"## Reading blocks of a {format_shape(volume)} float32 SEG-Y, median of {args.repeat} reads\n")
        print("| block | voxels kept | samples read | read / kept | ms | ns per voxel kept | ns per sample read |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for text in args.shapes.split(","):
            block = parse_shape(text)
            key = tuple(slice(0, n) for n in block)
            source[key]
            seconds = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                source[key]
                seconds.append(time.perf_counter() - started)
            s = statistics.median(seconds)
            kept = block[0] * block[1] * block[2]
            read = block[0] * block[1] * volume[2]
            print(f"| {format_shape(block)} | {kept:,} | {read:,} | {read / kept:.1f} | {1e3 * s:.1f} | "
                  f"{1e9 * s / kept:.2f} | {1e9 * s / read:.2f} |")
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    main()
