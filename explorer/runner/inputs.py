"""What a run reads: a SEG-Y file or a Zarr array, opened once and described by a :class:`RunInput`.

* ``.sgy`` / ``.segy``: a post-stack 3D SEG-Y (``operators.segy``): each task reads its own
  traces (``operators.segy_volume``); the survey's geometry goes with it, so a SEG-Y output
  is written on the input's survey.
* An MDIO v1 dataset (``.mdio``, TGS's seismic format on Zarr v3, ``multidimio``): its default
  variable (the group's ``attributes.defaultVariableName``, ``amplitude``), or
  ``survey.mdio:VARIABLE``; its dims must be (inline, crossline, samples) in that order.  An MDIO
  output is the input's dataset (coordinates, headers, trace mask) with the result as a variable
  named after the operator, the amplitudes left out.
* A Zarr array, v2 or v3 (a directory; ``.zarr`` is customary): ``store.zarr`` holding one
  array, ``group.zarr:path/to/array``, or a group holding exactly one 3D array.  Each task
  reads its window of the array (zarr arrays slice like NumPy).  A Zarr output carries the
  input array's attributes and, when the array's dims are named (xarray's
  ``_ARRAY_DIMENSIONS``, Zarr v3's ``dimension_names``), the 1-D coordinate arrays beside it
  named after them, as attributes (``input_dims``, ``input_coordinates``).

The volume's axes are (inline, crossline, samples); a volume of another number of axes is
refused in one line.  Blocks are float32, as the profiles were: another dtype is converted
block by block (:class:`Float32Source`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Float32Source", "InputError", "MDIO_SUFFIXES", "RunInput", "SEGY_SUFFIXES", "open_input"]

SEGY_SUFFIXES = (".sgy", ".segy")
MDIO_SUFFIXES = (".mdio",)
#: The largest coordinate array copied into a Zarr output's attributes (values).
MAX_COORDINATE_VALUES = 1 << 16


class InputError(ValueError):
    """An input that cannot be run on (one line: which, why)."""


@dataclass(frozen=True)
class RunInput:
    """An opened input: ``kind`` ``"segy"``, ``"zarr"`` or ``"mdio"``, the volume's ``shape`` and
    ``dtype``, ``path`` (the file or the store on disk), for Zarr and MDIO the array's path in its
    store (an MDIO dataset's variable) and ``dims`` (its dimension names, when named).
    ``read_unit``: what a read touches whole, per axis: a SEG-Y's trace ``(1, 1, samples)``, a
    Zarr array's chunks (``explorer.plan.grid.mean_read_extent``: a task's read seconds)."""

    text: str
    kind: str
    path: str
    shape: tuple[int, int, int]
    dtype: str
    geometry: object = None
    array_path: str = ""
    attributes: dict = field(default_factory=dict)
    dims: tuple = ()
    read_unit: tuple = ()

    def source(self):
        """What the tasks read windows from: a SEG-Y reader, or the Zarr array (as float32)."""
        if self.kind == "segy":
            import operators

            return operators.segy_volume(self.path)
        import zarr

        array = zarr.open_array(self.path, mode="r", path=self.array_path or None)
        return array if np.dtype(array.dtype) == np.float32 else Float32Source(array)


class Float32Source:
    """A source (``shape``, ``dtype``, basic slices) whose windows are read as float32."""

    def __init__(self, array):
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(np.float32)
        self.ndim = len(self.shape)

    def __getitem__(self, index):
        return np.asarray(self.array[index], dtype=np.float32)


def _split(text: str) -> tuple[str, str]:
    """``group.zarr:array`` -> (``group.zarr``, ``array``); a plain path -> (path, "")."""
    head, sep, tail = text.rpartition(":")
    if sep and head and not os.path.exists(text) and os.path.isdir(head):
        return head, tail.strip("/")
    return text, ""


def open_input(text) -> RunInput:
    """The input at ``text`` (module docstring), or :class:`InputError` in one line."""
    text = os.fspath(text)
    path, array_path = _split(text)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"input {text} does not exist") from None
    except OSError as exc:
        raise InputError(f"input {text} cannot be read ({exc.strerror or exc})") from None
    if path.lower().endswith(SEGY_SUFFIXES):
        if not stat.S_ISREG(mode):
            raise InputError(f"input {text} is not a regular file (a SEG-Y input must be one)")
        return _segy(text, path)
    if stat.S_ISDIR(mode) and path.lower().rstrip("/").endswith(MDIO_SUFFIXES):
        return _mdio(text, path, array_path)
    if stat.S_ISDIR(mode):
        return _zarr(text, path, array_path)
    if not stat.S_ISREG(mode):
        raise InputError(f"input {text} is not a regular file or a directory")
    raise InputError(f"input {text}: a SEG-Y file (.sgy, .segy) or a Zarr array (a directory) is read, "
                     f"not {os.path.splitext(path)[1] or 'a file without a suffix'}")


def _segy(text: str, path: str) -> RunInput:
    from operators.segy import SegyGeometryError, segy_geometry

    try:
        geometry = segy_geometry(path)
    except SegyGeometryError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"input {text} cannot be read ({type(exc).__name__}: {exc})") from None
    return RunInput(text=text, kind="segy", path=path, shape=tuple(geometry.shape), dtype="float32",
                    geometry=geometry, read_unit=(1, 1, int(geometry.shape[2])))


def _zarr(text: str, path: str, array_path: str) -> RunInput:
    import zarr

    try:
        node = zarr.open(path, mode="r", path=array_path or None)
    except Exception as exc:  # zarr raises several kinds for a directory that is not a store
        where = f"{path} has no array {array_path!r}" if array_path else f"{text} is not a Zarr array or group"
        raise InputError(f"input {where} ({type(exc).__name__})") from None
    if isinstance(node, zarr.Group):
        arrays = sorted(name for name, a in node.arrays() if a.ndim == 3)
        if len(arrays) != 1:
            found = ", ".join(arrays) or "none"
            raise InputError(f"input {text} is a Zarr group: name its 3D array as {path}:ARRAY "
                             f"(its 3D arrays: {found})")
        array_path = f"{array_path}/{arrays[0]}".strip("/")
        node = node[arrays[0]]
    if node.ndim != 3:
        raise InputError(f"input {text} is a {node.ndim}-D array of shape {tuple(node.shape)}: a volume has three "
                         f"axes (inline, crossline, samples)")
    if not (np.issubdtype(node.dtype, np.number) and not np.issubdtype(node.dtype, np.complexfloating)):
        raise InputError(f"input {text} holds {node.dtype}, not real numbers")
    if min(node.shape) < 1:
        raise InputError(f"input {text} is empty (shape {tuple(node.shape)})")
    return RunInput(text=text, kind="zarr", path=path, shape=tuple(int(n) for n in node.shape),
                    dtype=str(node.dtype), array_path=array_path, attributes=_carried(path, array_path, node),
                    read_unit=tuple(int(n) for n in node.chunks))


def _mdio(text: str, path: str, variable: str) -> RunInput:
    """An MDIO v1 dataset's variable (its default one unless named) with dims (inline, crossline, samples)."""
    import zarr

    try:
        group = zarr.open_group(path, mode="r")
    except Exception as exc:
        raise InputError(f"input {text} is not an MDIO dataset (a Zarr v3 group): {type(exc).__name__}") from None
    variable = variable or (group.attrs.get("attributes") or {}).get("defaultVariableName") or "amplitude"
    found = _zarr(text, path, variable)
    dims = tuple(found.attributes.get("input_dims") or ())
    if dims[:2] != ("inline", "crossline"):
        raise InputError(f"input {text}: variable {variable!r} has dims {dims or 'without names'}: a volume's are "
                         f"(inline, crossline, samples), in that order")
    return RunInput(text=text, kind="mdio", path=path, shape=found.shape, dtype=found.dtype, array_path=variable,
                    attributes=found.attributes, dims=dims, read_unit=found.read_unit)


def _carried(path: str, array_path: str, array) -> dict:
    """The input array's attributes and named dims' 1-D coordinates, for a Zarr output's attributes."""
    import zarr

    attributes = {k: v for k, v in dict(array.attrs).items() if k != "_ARRAY_DIMENSIONS"}
    dims = array.attrs.get("_ARRAY_DIMENSIONS") or getattr(getattr(array, "metadata", None), "dimension_names", None)
    out = {"input_array": array_path, "input_attributes": attributes}
    if dims and all(isinstance(d, str) for d in dims):
        out["input_dims"] = list(dims)
        parent = array_path.rpartition("/")[0]
        coordinates = {}
        for dim, n in zip(dims, array.shape):
            try:
                coordinate = zarr.open_array(path, mode="r", path=f"{parent}/{dim}".strip("/"))
            except Exception:
                continue
            if coordinate.ndim == 1 and coordinate.shape[0] == n and n <= MAX_COORDINATE_VALUES:
                coordinates[dim] = np.asarray(coordinate[:]).tolist()
        if coordinates:
            out["input_coordinates"] = coordinates
    return out
