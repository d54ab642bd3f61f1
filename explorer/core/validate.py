"""The ranges of every user-facing parameter, in one place: the CLI's argument types and
the library's entry points call these, so both refuse the same values with the same line.

Each function returns the value, normalised, or raises ``ValueError`` with one line that
names the parameter, the value and the range.
"""

from __future__ import annotations

import functools
import math

from explorer.core.units import MAX_DIM, MAX_SIZE_BYTES, MAX_VOXELS, parse_shape, parse_size

__all__ = ["MAX_DIM", "MAX_SIZE_BYTES", "MAX_VOXELS", "confidence", "fraction", "positive_int", "non_negative_int",
           "operator", "positive_number", "shape", "size"]


def operator(spec) -> str:
    """The canonical name of an operator spec (``operators.pipeline``): an operator, one
    with parameters (``gaussian(sigma=4)``), a pipeline (``gaussian,gst3d``), a ``module:attr``
    reference or an ``Operator`` (registered here under its name), with
    default parameters dropped and parameters sorted, so that one operator has one study
    and one model.  ``KeyError`` for an unknown operator, ``operators.SpecError`` (a
    ``ValueError``) naming the fault of a malformed spec."""
    import operators

    if isinstance(spec, operators.Operator) or (isinstance(spec, type) and issubclass(spec, operators.Operator)):
        return operators.get(spec).name  # registered in this process, under its name
    if not isinstance(spec, str):
        raise ValueError(f"operator must be a name, a spec string or an Operator, not {type(spec).__name__}")
    return _canonical_name(spec)


@functools.lru_cache(maxsize=1024)
def _canonical_name(spec: str) -> str:
    """``operators.get(spec).name``, parsed once per spec (a name is registered once, so a
    spec's canonical name never changes; an error is raised again, not cached)."""
    import operators

    return operators.get(spec).name


def confidence(value, name: str = "confidence") -> float:
    """A one-sided confidence level ``c`` with ``0.5 < c < 1``.

    At ``c <= 0.5`` the upper bound is at or below the mean (its quantile is <= 0) and
    is no bound; at 1 it is infinite.
    """
    c = _number(value, name)
    if not 0.5 < c < 1:
        raise ValueError(f"{name} must be in (0.5, 1), like 0.99; got {value!r}")
    return c


def fraction(value, name: str) -> float:
    """A number in (0, 1) (a tolerance, a share)."""
    x = _number(value, name)
    if not 0 < x < 1:
        raise ValueError(f"{name} must be in (0, 1); got {value!r}")
    return x


def positive_number(value, name: str) -> float:
    x = _number(value, name)
    if not x > 0:
        raise ValueError(f"{name} must be a positive number; got {value!r}")
    return x


def positive_int(value, name: str) -> int:
    n = _integer(value, name)
    if n < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return n


def non_negative_int(value, name: str) -> int:
    n = _integer(value, name)
    if n < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    return n


def shape(value, name: str = "shape") -> tuple[int, int, int]:
    """A 3D shape (``"200x200x200"`` or a sequence) within :data:`MAX_DIM` per axis and
    :data:`MAX_VOXELS` in all (``explorer.core.units.parse_shape``)."""
    try:
        return parse_shape(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def size(value, name: str) -> int:
    """Bytes (``"4GiB"`` or an int), positive and at most :data:`MAX_SIZE_BYTES`."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _converted(value, name: str, cast, kind: str):
    """``cast(value)``, or one line saying ``name`` must be ``kind`` (a bool is neither)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {kind}; got {value!r}") from None


def _number(value, name: str) -> float:
    x = _converted(value, name, float, "a number")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    return x


def _integer(value, name: str) -> int:
    n = _converted(value, name, int, "an integer")
    if isinstance(value, float) and n != value:
        raise ValueError(f"{name} must be an integer; got {value!r}")
    return n
