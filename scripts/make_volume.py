"""Write a synthetic seismic volume as SEG-Y (IEEE float, inline x crossline x samples).

A file at PATH is replaced only if memory-explorer wrote it (its textual header says so).

    python scripts/make_volume.py 240x240x240 runs/demo.sgy [--seed 0]
"""

import argparse

import operators
from explorer.core.units import format_shape, parse_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", help="like 240x240x240")
    parser.add_argument("path", help="output .sgy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        shape = parse_shape(args.shape)
    except ValueError as exc:
        parser.error(str(exc))
    from pathlib import Path

    from operators.segy import written_by_explorer

    path = Path(args.path)
    if path.exists() and not written_by_explorer(path):
        parser.error(f"{path} exists and was not written by memory-explorer: not replaced; choose another path")
    if not path.parent.is_dir():
        parser.error(f"directory {path.parent} does not exist")
    operators.write_segy(path, operators.synthetic_volume(shape, seed=args.seed))
    print(f"wrote {args.path}: synthetic {format_shape(shape)} float32 volume, seed {args.seed}")


if __name__ == "__main__":
    main()
