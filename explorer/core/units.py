"""Parsing and printing of shapes and byte sizes (Dask's byte-string conventions)."""

from __future__ import annotations

import math
import re

from dask.utils import format_bytes, parse_bytes

__all__ = ["FLOAT32_BYTES", "MAX_DIM", "MAX_SIZE_BYTES", "MAX_VOXELS", "format_bytes", "parse_shape", "parse_size", "format_shape"]

#: Largest accepted dimension (the store's integer range for a shape's axis) and volume:
#: 2^44 voxels is 64 TiB of float32, beyond any survey, and keeps every byte count of a
#: plan exact in int64 and float64.
MAX_DIM = 1 << 24
MAX_VOXELS = 1 << 44
#: Bytes of one float32 sample: what the operators read and return (``operators.Operator.output_dtype``),
#: the input block of a plan's footprint and of the search's sizes.
FLOAT32_BYTES = 4
#: Largest accepted size (1 EiB): byte counts stay exact integers.
MAX_SIZE_BYTES = 1 << 60

_SHAPE = re.compile(r"^\s*(-?\d+)(\s*[xX×,]\s*-?\d+)*\s*$")


def parse_shape(text: str | tuple | list, ndim: int = 3) -> tuple[int, ...]:
    """``"200x200x200"`` (or a sequence of ints) -> ``(200, 200, 200)``.

    Raises ``ValueError`` with a one-line message for anything else: wrong
    separators, wrong number of axes, or non-positive dimensions.
    """
    if isinstance(text, str):
        if not _SHAPE.match(text):
            raise ValueError(f"malformed shape {text!r}: expected {ndim} positive integers like 200x200x200")
        dims = tuple(int(part) for part in re.split(r"\s*[xX×,]\s*", text.strip()))
    else:
        try:
            dims = tuple(int(n) for n in text)
        except (TypeError, ValueError):
            raise ValueError(f"malformed shape {text!r}: expected {ndim} positive integers") from None
    if len(dims) != ndim:
        raise ValueError(f"shape {format_shape(dims)} has {len(dims)} axes; expected {ndim}")
    if any(n <= 0 for n in dims):
        raise ValueError(f"shape {format_shape(dims)} has a non-positive dimension")
    if max(dims) > MAX_DIM:
        raise ValueError(f"shape {format_shape(dims)} has a dimension above {MAX_DIM:,}")
    voxels = 1
    for n in dims:
        voxels *= n
    if voxels > MAX_VOXELS:
        raise ValueError(f"shape {format_shape(dims)} has {voxels:.3g} voxels, above {MAX_VOXELS:.3g} (64 TiB of float32)")
    return dims


def format_shape(shape) -> str:
    return "x".join(str(int(n)) for n in shape)


def parse_size(size: str | int | float) -> int:
    """Bytes from an int or a string like ``"4GiB"``, ``"1.5 GB"``, ``"800MB"``.

    Raises ``ValueError`` with a one-line message for malformed, empty, non-positive or
    larger than :data:`MAX_SIZE_BYTES` sizes.
    """
    if isinstance(size, bool):
        raise ValueError(f"malformed size {size!r}")
    if isinstance(size, float) and not math.isfinite(size):
        raise ValueError(f"malformed size {size!r}")
    if isinstance(size, (int, float)):
        value = int(size)
    elif not str(size).strip():
        raise ValueError("empty size: expected bytes or a string like 4GiB")
    else:
        try:
            value = int(parse_bytes(str(size).strip()))
        except (ValueError, TypeError, OverflowError):  # OverflowError: "1e400" is an infinite float
            raise ValueError(f"malformed size {size!r}: expected bytes or a string like 4GiB") from None
    if value <= 0:
        raise ValueError(f"size {size!r} is not positive")
    if value > MAX_SIZE_BYTES:
        raise ValueError(f"size {size!r} is above 1 EiB")
    return value
