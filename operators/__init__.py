"""Seismic operators, synthetic volumes and SEG-Y I/O: the ground floor.

Knows nothing about ``explorer``.
"""

from operators.base import RESERVED_NAMES, Operator, SpecError, names, register, reserve_names, windowed_map
from operators.functional import from_function
from operators.pipeline import get
from operators import seismic as _seismic  # noqa: F401  (registers the operators)
from operators import unet as _unet  # noqa: F401  (registers unet3d; torch is imported by its first run)
from operators.synthetic import synthetic_volume
from operators.segy import SegyGeometryError, read_segy, segy_volume, write_segy, write_segy_like

__all__ = [
    "Operator",
    "RESERVED_NAMES",
    "SegyGeometryError",
    "SpecError",
    "from_function",
    "get",
    "names",
    "read_segy",
    "register",
    "reserve_names",
    "segy_volume",
    "synthetic_volume",
    "windowed_map",
    "write_segy",
    "write_segy_like",
]
