"""SEG-Y I/O on the project's axis order (inline, crossline, samples).

* :func:`segy_geometry` reads every trace's inline / crossline / offset header once and
  states the file's regular 3D grid as a small frozen :class:`SegyGeometry`, or refuses the
  file with :class:`SegyGeometryError` (one line: which file, what is wrong).
* :func:`read_segy` wraps a file as a lazy ``dask.array``: each chunk's task opens the file
  with segyio and reads only its own traces.  The graph holds the path and the geometry,
  never data, and pickles (it runs on a distributed cluster).
* :func:`write_segy` writes a NumPy or Dask array as IEEE float32 SEG-Y, a slab of inlines
  at a time, so a Dask result is never in memory whole.

Why not segyio's own geometry?  ``segyio.open`` guesses it from a few traces: on a file
with missing traces it raises a ``ValueError`` about counts, on 2D pre-stack gathers a
``RuntimeError`` about sorting, and with ``strict=False`` it opens both as unstructured.
Inferring the grid from all headers gives one code path, a precise message, and a check
that every trace sits where the trace index formula puts it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import segyio

#: Trace header bytes of the inline and crossline numbers (SEG-Y rev 1 standard).
INLINE_BYTE = int(segyio.TraceField.INLINE_3D)  # 189
CROSSLINE_BYTE = int(segyio.TraceField.CROSSLINE_3D)  # 193

#: Bin spacing (m) of the CDP coordinates that :func:`write_segy` puts in the headers.
BIN_SPACING_M = 25

_SAMPLE_FORMATS = {1, 2, 3, 5, 6, 8, 10, 11, 12, 16}


class SegyGeometryError(ValueError):
    """A SEG-Y file that is not a regular post-stack 3D volume (or not readable as SEG-Y)."""


@dataclass(frozen=True)
class SegyGeometry:
    """The regular 3D grid of a SEG-Y file.

    ``shape`` is (inlines, crosslines, samples); ``inlines`` and ``crosslines`` are the
    line numbers in file order (axis 0 and axis 1); ``sorting`` says which of them varies
    slowest in the file: ``"inline"`` (trace = inline index * crosslines + crossline index)
    or ``"crossline"``.  ``dtype`` is what segyio returns: float32 for IBM and IEEE floats,
    the integer type for integer formats.
    """

    shape: tuple[int, int, int]
    inlines: tuple[int, ...]
    crosslines: tuple[int, ...]
    sample_interval_us: float
    first_sample_ms: float
    sample_format: int
    dtype: np.dtype
    sorting: str
    endian: str = "big"
    iline_byte: int = INLINE_BYTE
    xline_byte: int = CROSSLINE_BYTE

    def trace_index(self, i, j):
        """File trace index of inline index ``i`` and crossline index ``j`` (0-based)."""
        nil, nxl, _ = self.shape
        return i * nxl + j if self.sorting == "inline" else j * nil + i


def _endian(path: str) -> str:
    """'big' or 'little': whichever reading of the binary header's format code is valid."""
    with open(path, "rb") as fh:
        fh.seek(3224)
        code = fh.read(2)
    if len(code) < 2:
        raise SegyGeometryError(f"{path}: not a SEG-Y file: shorter than its 3600-byte headers")
    if int.from_bytes(code, "big") in _SAMPLE_FORMATS:
        return "big"
    if int.from_bytes(code, "little") in _SAMPLE_FORMATS:
        return "little"
    return "big"  # let segyio report the problem


def _open(path: str, endian: str):
    try:
        return segyio.open(path, "r", ignore_geometry=True, endian=endian)
    except (RuntimeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise SegyGeometryError(f"{path}: not readable as SEG-Y: {reason}") from None


def _first_seen(values: np.ndarray) -> np.ndarray:
    """Distinct values in order of first appearance."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


def segy_geometry(path, *, iline: int = INLINE_BYTE, xline: int = CROSSLINE_BYTE) -> SegyGeometry:
    """The regular 3D grid of the SEG-Y file at ``path``, from all its trace headers.

    Raises :class:`SegyGeometryError` when the traces do not form one regular post-stack
    grid: several offsets per position (pre-stack gathers), missing or duplicated
    positions, or traces in neither inline nor crossline order.
    """
    path = os.fspath(path)
    endian = _endian(path)
    where = f"inline byte {iline}, crossline byte {xline}"
    with _open(path, endian) as f:
        count, ns = f.tracecount, len(f.samples)
        if count == 0 or ns == 0:
            raise SegyGeometryError(f"{path}: no 3D volume: {count} traces of {ns} samples")
        f.mmap()
        ils = np.asarray(f.attributes(iline)[:], dtype=np.int64)
        xls = np.asarray(f.attributes(xline)[:], dtype=np.int64)
        offsets = np.unique(f.attributes(int(segyio.TraceField.offset))[:])
        inlines, crosslines = _first_seen(ils), _first_seen(xls)
        nil, nxl = len(inlines), len(crosslines)
        if len(offsets) > 1:
            raise SegyGeometryError(
                f"{path}: not a post-stack 3D volume: {count} traces at {nil} inline x "
                f"{nxl} crossline positions carry {len(offsets)} distinct offsets "
                f"(pre-stack gathers?) ({where})"
            )
        if nil * nxl != count:
            raise SegyGeometryError(
                f"{path}: no regular 3D grid: {count} traces for {nil} inlines x {nxl} "
                f"crosslines = {nil * nxl} positions, so traces are missing or duplicated ({where})"
            )
        if np.array_equal(ils, np.repeat(inlines, nxl)) and np.array_equal(xls, np.tile(crosslines, nil)):
            sorting = "inline"
        elif np.array_equal(ils, np.tile(inlines, nxl)) and np.array_equal(xls, np.repeat(crosslines, nil)):
            sorting = "crossline"
        else:
            raise SegyGeometryError(
                f"{path}: no regular 3D grid: {count} traces on {nil} inlines x {nxl} "
                f"crosslines are in neither inline nor crossline order ({where})"
            )
        return SegyGeometry(
            shape=(nil, nxl, ns),
            inlines=tuple(int(n) for n in inlines),
            crosslines=tuple(int(n) for n in crosslines),
            sample_interval_us=float(segyio.tools.dt(f, fallback_dt=4000.0)),
            first_sample_ms=float(f.samples[0]),
            sample_format=int(f.format),
            dtype=np.dtype(f.dtype),
            sorting=sorting,
            endian=endian,
            iline_byte=iline,
            xline_byte=xline,
        )


def _as_ranges(key, shape):
    """Normalise a basic index (ints, slices, one Ellipsis) into per-axis ranges and the
    axes that an int index drops."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is Ellipsis for k in key):
        at = next(n for n, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1 :]
    key = key + (slice(None),) * (len(shape) - len(key))
    if len(key) != len(shape):
        raise IndexError(f"too many indices for a {len(shape)}-dimensional SEG-Y volume")
    ranges, drop = [], []
    for axis, (k, n) in enumerate(zip(key, shape)):
        if isinstance(k, slice):
            ranges.append(range(*k.indices(n)))
        elif isinstance(k, (int, np.integer)):
            k = int(k) + n if k < 0 else int(k)
            if not 0 <= k < n:
                raise IndexError(f"index {k} out of range for axis {axis} of size {n}")
            ranges.append(range(k, k + 1))
            drop.append(axis)
        else:
            raise TypeError(f"SEG-Y volumes take ints and slices only, got {type(k).__name__}")
    return ranges, tuple(drop)


class SegyVolume:
    """An array-like view of a regular SEG-Y volume: ``volume[i0:i1, j0:j1, k0:k1]`` reads
    just those traces (opening the file for each read), so it is cheap to pickle and safe to
    share between threads and processes.  :func:`read_segy` gives it to ``dask.array``.
    """

    def __init__(self, path, geometry: SegyGeometry):
        self.path = os.fspath(path)
        self.geometry = geometry

    ndim = 3

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.geometry.shape

    @property
    def dtype(self) -> np.dtype:
        return self.geometry.dtype

    def __dask_tokenize__(self):
        stat = os.stat(self.path)
        path = os.path.abspath(self.path)
        return ("SegyVolume", path, stat.st_size, stat.st_mtime_ns, self.geometry)

    def __repr__(self) -> str:
        return f"<SegyVolume {self.path} shape={self.shape} dtype={self.dtype} sorting={self.geometry.sorting}>"

    def __getitem__(self, key) -> np.ndarray:
        (ri, rj, rk), drop = _as_ranges(key, self.shape)
        out = np.empty((len(ri), len(rj), len(rk)), dtype=self.dtype)
        if out.size:
            self._read(ri, rj, rk, out)
        return out.squeeze(axis=drop) if drop else out

    def _read(self, ri: range, rj: range, rk: range, out: np.ndarray) -> None:
        geometry = self.geometry
        samples = slice(rk.start, rk.stop if rk.stop >= 0 else None, rk.step)
        inline_sorted = geometry.sorting == "inline"
        # Along the fast axis, traces are consecutive in the file: read them as one run.
        fast, slow = (rj, ri) if inline_sorted else (ri, rj)
        # Read, not memory-mapped: a mapped file's pages a task touches count in its worker's RSS
        # until the file closes, and a window that keeps part of each trace touches whole traces
        # (and the kernel's fault-around): a 109x109x115 window of 320-sample traces (5.2 MiB) raised
        # the RSS high-water by 33 MiB mapped, 5 MiB read, which the in-worker task peak then carried
        # (semblance's tasks at twice their bound).  Reading costs about 2-3 ms per MiB, page cache warm.
        with segyio.open(self.path, "r", ignore_geometry=True, endian=geometry.endian) as f:
            for n, line in enumerate(slow):
                i, j = (line, fast[0]) if inline_sorted else (fast[0], line)
                first = geometry.trace_index(i, j)
                if fast.step == 1:
                    traces = np.asarray(f.trace.raw[first : first + len(fast)]).reshape(len(fast), -1)
                else:
                    steps = range(0, len(fast) * fast.step, fast.step)
                    traces = np.stack([f.trace.raw[first + d] for d in steps])
                if inline_sorted:
                    out[n] = traces[:, samples]
                else:
                    out[:, n] = traces[:, samples]


def segy_volume(path, *, iline: int = INLINE_BYTE, xline: int = CROSSLINE_BYTE) -> SegyVolume:
    """The SEG-Y file at ``path`` as a :class:`SegyVolume` (its trace headers read to check
    the geometry): a source an operator's Dask form reads in windows,
    ``operator.dask(segy_volume(path), chunks=...)`` (``operators.base.windowed_map``)."""
    return SegyVolume(path, segy_geometry(path, iline=iline, xline=xline))


def read_segy(path, chunks="auto", *, iline: int = INLINE_BYTE, xline: int = CROSSLINE_BYTE):
    """A lazy ``dask.array`` (inline, crossline, samples) over the SEG-Y file at ``path``.

    ``chunks`` is anything ``dask.array`` accepts (a tuple, a dict by axis, ``-1``,
    ``"auto"``).  ``"auto"`` keeps the samples axis whole (a trace is read whole anyway)
    and lets Dask size the other two axes.  The dtype is segyio's: float32 for IBM and IEEE
    float files, int16 for 2-byte integer files.  Building the array reads only the trace
    headers (to check the geometry); each chunk's traces are read when its task runs.
    """
    import dask.array as da
    from dask.base import tokenize

    volume = segy_volume(path, iline=iline, xline=xline)
    geometry = volume.geometry
    if isinstance(chunks, str) and chunks == "auto":
        chunks = {0: "auto", 1: "auto", 2: -1}
    name = f"read-segy-{tokenize(volume, chunks)}"
    return da.from_array(
        volume,
        chunks=chunks,
        name=name,
        lock=False,
        fancy=False,
        asarray=False,
        meta=np.empty((0, 0, 0), dtype=geometry.dtype),
    )


def _text_header(shape, sample_interval_us, iline_start, xline_start):
    lines = {
        1: "memory-explorer: 3D post-stack volume, IEEE float32 (format 5)",
        2: f"inlines {iline_start}-{iline_start + shape[0] - 1} (byte 189), "
        f"crosslines {xline_start}-{xline_start + shape[1] - 1} (byte 193)",
        3: f"{shape[2]} samples at {sample_interval_us} us, traces sorted by inline",
        4: f"CDP X/Y (bytes 181/185): {BIN_SPACING_M} m bins, X along crosslines, Y along inlines",
    }
    return segyio.tools.create_text_header(lines)


def _slabs(data, nil: int, slab_bytes: int):
    """Inline ranges to write at once: Dask chunk rows along axis 0, cut to ``slab_bytes``.

    Cutting a chunk row recomputes it once per piece: the price of bounded memory when a
    row of float32 output is larger than ``slab_bytes``.
    """
    per_inline = max(1, int(np.prod(data.shape[1:])) * 4)
    most = max(1, slab_bytes // per_inline)
    chunks = getattr(data, "chunks", None)  # Dask: tuple of tuples; zarr: tuple of ints
    if chunks and isinstance(chunks[0], tuple):
        bounds = np.cumsum((0,) + chunks[0]).tolist()
    else:
        bounds = [0, nil]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        for i0 in range(start, stop, most):
            yield i0, min(i0 + most, stop)


def write_segy(
    path,
    data,
    *,
    sample_interval_us: int = 4000,
    iline_start: int = 1,
    xline_start: int = 1,
    slab_bytes: int = 256 * 2**20,
) -> None:
    """Write ``data`` (inline, crossline, samples) as an IEEE float32 SEG-Y at ``path``.

    ``data`` is a NumPy array, a Dask array or any array-like that slices along axis 0.
    Inline numbers start at ``iline_start`` (trace header byte 189), crossline numbers at
    ``xline_start`` (byte 193), both in steps of 1; traces are inline-sorted, so
    ``segyio.open(path)`` and :func:`read_segy` see axis 0 as inlines.  A Dask array is
    computed one row of chunks along axis 0 at a time (cut to at most ``slab_bytes`` of
    float32), with whatever scheduler is active.  The file is written under a temporary
    name and renamed when complete, so a failed computation leaves no truncated file.
    """
    path = os.fspath(path)
    shape = tuple(int(n) for n in getattr(data, "shape", ()))
    if len(shape) != 3 or min(shape) <= 0:
        raise ValueError(f"data must be a non-empty 3D array (inline, crossline, samples), got shape {shape}")
    if not (int(sample_interval_us) == sample_interval_us and 0 < sample_interval_us < 2**16):
        raise ValueError(
            f"sample_interval_us must be an integer in 1..65535 (2 bytes in SEG-Y), got {sample_interval_us}"
        )
    dt = int(sample_interval_us)
    partial = f"{path}.partial"
    try:
        _write(partial, data, shape, dt, iline_start, xline_start, slab_bytes)
        os.replace(partial, path)
        mark_written(path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


#: The big-endian type of each trace header field :func:`write_segy` sets (the sample count and
#: interval two unsigned bytes, as ``write_segy`` allows intervals to 65535 us).
_FIELD_TYPES = {
    segyio.TraceField.TRACE_SEQUENCE_LINE: ">i4", segyio.TraceField.TRACE_SEQUENCE_FILE: ">i4",
    segyio.TraceField.CDP: ">i4", segyio.TraceField.SourceGroupScalar: ">i2",
    segyio.TraceField.TRACE_SAMPLE_COUNT: ">u2", segyio.TraceField.TRACE_SAMPLE_INTERVAL: ">u2",
    segyio.TraceField.CDP_X: ">i4", segyio.TraceField.CDP_Y: ">i4",
    segyio.TraceField.INLINE_3D: ">i4", segyio.TraceField.CROSSLINE_3D: ">i4",
}


def _spec(shape, dt: int, iline_start: int, xline_start: int):
    """The ``segyio.spec`` of :func:`write_segy`'s file: inline-sorted, IEEE float32 (format 5)."""
    nil, nxl, ns = shape
    spec = segyio.spec()
    spec.iline, spec.xline = INLINE_BYTE, CROSSLINE_BYTE
    spec.ilines = np.arange(iline_start, iline_start + nil, dtype=np.intc)
    spec.xlines = np.arange(xline_start, xline_start + nxl, dtype=np.intc)
    spec.offsets = np.array([0], dtype=np.intc)
    spec.samples = np.arange(ns) * (dt / 1000.0)
    spec.sorting = int(segyio.TraceSortingFormat.INLINE_SORTING)
    spec.format = 5
    return spec


def _write(path, data, shape, dt, iline_start, xline_start, slab_bytes):
    """segyio writes the textual and binary headers; the traces (headers and big-endian IEEE
    samples) are written a slab of inlines at a time through a memory map of that slab, the bytes segyio's
    own trace-by-trace writer gives (``tests/test_segy.py``) at disk speed rather than
    Python's per trace (24 us a trace: 10 s for a 648x648x324 probe volume)."""
    nil, nxl, ns = shape
    with segyio.create(path, _spec(shape, dt, iline_start, xline_start)) as f:
        f.text[0] = _text_header(shape, dt, iline_start, xline_start)
        f.bin.update(hdt=dt, dto=dt)  # segyio derives them from float sample times
    header_bytes = _TEXT_BYTES + _BINARY_BYTES
    trace_bytes = _TRACE_HEADER_BYTES + 4 * ns
    with open(path, "r+b") as fh:
        fh.truncate(header_bytes + nil * nxl * trace_bytes)
    names = {field: f"byte{int(field)}" for field in _FIELD_TYPES}  # a field's byte, 1-based, names it
    layout = np.dtype({"names": list(names.values()) + ["data"],
                       "formats": list(_FIELD_TYPES.values()) + [(">f4", (ns,))],
                       "offsets": [int(field) - 1 for field in _FIELD_TYPES] + [_TRACE_HEADER_BYTES],
                       "itemsize": trace_bytes})
    tf = segyio.TraceField
    j = np.arange(nxl)
    for i0, i1 in _slabs(data, nil, slab_bytes):
        # one map per slab, flushed and closed: the process holds at most a slab of the file's pages
        out = np.memmap(path, mode="r+", offset=header_bytes + i0 * nxl * trace_bytes, dtype=layout,
                        shape=(i1 - i0, nxl))
        i = np.arange(i0, i1)[:, None]
        sequence = i * nxl + j + 1
        header = {tf.TRACE_SEQUENCE_LINE: j + 1, tf.TRACE_SEQUENCE_FILE: sequence, tf.CDP: sequence,
                  tf.INLINE_3D: iline_start + i, tf.CROSSLINE_3D: xline_start + j, tf.SourceGroupScalar: 1,
                  tf.CDP_X: BIN_SPACING_M * j, tf.CDP_Y: BIN_SPACING_M * i, tf.TRACE_SAMPLE_COUNT: ns,
                  tf.TRACE_SAMPLE_INTERVAL: dt}
        for field, value in header.items():
            out[names[field]] = value
        out["data"] = np.asarray(data[i0:i1], dtype=np.float32)  # computes a Dask slab
        out.flush()
        del out


# --------------------------------------------------------------------------- same survey out

#: What :func:`write_segy_like` writes into the textual header's last blank line, with the
#: history of the file (what made it, from what): a processing-history line, as processing
#: systems add.  Not the evidence of ownership (a user's file may copy our headers): that is
#: :func:`mark_written`'s token.
HISTORY_MARK = "memory-explorer:"

_TEXT_BYTES, _BINARY_BYTES, _TRACE_HEADER_BYTES = 3200, 400, 240
_FORMAT_OFFSET, _SAMPLES_OFFSET, _EXT_TEXT_OFFSET = 3224, 3220, 3504  # in the file (0-based)
_TRACE_SAMPLES_OFFSET = 114  # in a trace header (bytes 115-116)
#: The ownership token: binary-header bytes 3401-3440, in the range 3301-3500 that SEG-Y revisions 1
#: and 2 leave unassigned (rev 2 assigns 3261-3300).
_TOKEN_OFFSET, _TOKEN_PREFIX = 3400, b"memory-explorer "
_TOKEN_DIGITS = 24
#: Blocks of the traces the token's digest reads (evenly spaced; the whole file when smaller).
_DIGEST_BLOCKS, _DIGEST_BLOCK_BYTES = 64, 4096


def _text_lines(text: bytes) -> tuple[list[bytes], str]:
    """The 40 lines of a textual header, and its encoding (``"cp037"`` EBCDIC or ``"ascii"``)."""
    ebcdic = text.count(b"\x40") + text.count(b"\xc3") > text.count(b" ") + text.count(b"C")
    return [text[k:k + 80] for k in range(0, _TEXT_BYTES, 80)], "cp037" if ebcdic else "ascii"


def _token(path) -> bytes:
    """The ownership token of the file at ``path`` as it is: a digest of its size and of
    :data:`_DIGEST_BLOCKS` evenly spaced blocks of what follows its textual and binary headers
    (trace headers and samples), so a file with our headers over other traces has another."""
    import hashlib

    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    start = _TEXT_BYTES + _BINARY_BYTES
    span = max(0, size - start)
    with open(path, "rb") as fh:
        for k in range(_DIGEST_BLOCKS):
            fh.seek(start + (span * k) // _DIGEST_BLOCKS)
            digest.update(fh.read(_DIGEST_BLOCK_BYTES))
    return _TOKEN_PREFIX + digest.hexdigest()[:_TOKEN_DIGITS].encode()


def mark_written(path) -> None:
    """Write the ownership token of the complete file at ``path`` into its binary header's
    unassigned bytes (:data:`_TOKEN_OFFSET`): every textual line and every assigned field stay
    as they are, and nothing is written beside the file."""
    token = _token(path)
    with open(path, "r+b") as fh:
        fh.seek(_TOKEN_OFFSET)
        fh.write(token)


def written_by_explorer(path) -> bool:
    """Whether this tool wrote the SEG-Y at ``path`` and its traces are as it wrote them: its
    binary header holds the token of its own traces (:func:`mark_written`).  A user's file whose
    headers were copied from an output, or an output whose traces changed since, is not."""
    try:
        with open(path, "rb") as fh:
            fh.seek(_TOKEN_OFFSET)
            held = fh.read(len(_TOKEN_PREFIX) + _TOKEN_DIGITS)
        return held.startswith(_TOKEN_PREFIX) and held == _token(path)
    except OSError:
        return False


def _with_history(text: bytes, history: str) -> bytes | None:
    """``text`` with ``history`` in its last blank line, in the header's own encoding; None when
    no line is blank (every line of the input's is kept: no history line then)."""
    lines, codec = _text_lines(text)
    blank = [n for n, line in enumerate(lines) if not line.decode(codec, "replace")[4:].strip(" \x00")]
    if not blank:
        return None
    at = blank[-1]
    line = f"C{at + 1:2d} {HISTORY_MARK} {history}"[:80].ljust(80)
    lines[at] = line.encode(codec, "replace")
    return b"".join(lines)


def _layout(path: str, geometry: SegyGeometry) -> tuple[int, int, int]:
    """``(header_bytes, traces, bytes per sample)`` of a regular SEG-Y file (fixed-length traces)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        fh.seek(_EXT_TEXT_OFFSET)
        ext = int.from_bytes(fh.read(2), geometry.endian, signed=True)
    if ext < 0:
        raise SegyGeometryError(f"{path}: a variable number of extended textual headers is not supported")
    header = _TEXT_BYTES + _BINARY_BYTES + ext * _TEXT_BYTES
    traces, ns = geometry.shape[0] * geometry.shape[1], geometry.shape[2]
    per_trace, rest = divmod(size - header, traces)
    itemsize, odd = divmod(per_trace - _TRACE_HEADER_BYTES, ns)
    if rest or odd or itemsize not in (1, 2, 4, 8):
        raise SegyGeometryError(f"{path}: traces are not of one fixed length ({size} bytes for {traces} traces "
                                f"of {ns} samples after {header} header bytes)")
    return header, traces, itemsize


def write_segy_like(path, data, like, *, history: str = "", slab_bytes: int = 256 * 2**20) -> bool:
    """Write ``data`` (inline, crossline, samples) as a SEG-Y on the survey of the SEG-Y ``like``.

    The output is ``like`` byte for byte except what the data changes: the textual and
    binary headers (every extended textual header too) and every trace header are copied
    unchanged, so inline/crossline numbers, coordinates and their scalars, dt, delay,
    sorting and byte order are the input's; the samples are IEEE float32 (format code 5
    in the binary header) in the input's byte order, each trace where the input's trace
    at that (inline, crossline) position is.  A trace count of samples other than the
    input's is written to the binary header and every trace header.  ``history`` goes
    into the textual header's last blank line after :data:`HISTORY_MARK`; with no blank line
    every textual line stays the input's and no history is written (returns False, else
    True).  The file is recorded as this tool's (:func:`mark_written`).  A Dask array is computed a slab of
    inlines at a time (at most ``slab_bytes`` of float32), and the file is written under
    a temporary name and renamed when complete.
    """
    path, like = os.fspath(path), os.fspath(like)
    geometry = segy_geometry(like, iline=INLINE_BYTE, xline=CROSSLINE_BYTE)
    shape = tuple(int(n) for n in getattr(data, "shape", ()))
    if len(shape) != 3 or shape[:2] != geometry.shape[:2] or shape[2] <= 0:
        raise ValueError(f"data of shape {shape} is not on the survey of {like} "
                         f"({geometry.shape[0]} inlines x {geometry.shape[1]} crosslines)")
    header_bytes, traces, itemsize = _layout(like, geometry)
    nil, nxl, ns = shape
    order = ">" if geometry.endian == "big" else "<"
    source = np.memmap(like, mode="r", offset=header_bytes,
                       dtype=np.dtype([("header", "V240"), ("data", f"V{geometry.shape[2] * itemsize}")]))
    with open(like, "rb") as fh:
        head = bytearray(fh.read(header_bytes))
    text = _with_history(bytes(head[:_TEXT_BYTES]), history)
    if text is not None:
        head[:_TEXT_BYTES] = text
    head[_FORMAT_OFFSET:_FORMAT_OFFSET + 2] = (5).to_bytes(2, geometry.endian)
    if ns != geometry.shape[2]:
        head[_SAMPLES_OFFSET:_SAMPLES_OFFSET + 2] = ns.to_bytes(2, geometry.endian)

    partial = f"{path}.partial"
    try:
        with open(partial, "wb") as fh:
            fh.write(head)
            fh.truncate(header_bytes + traces * (_TRACE_HEADER_BYTES + 4 * ns))
        out = np.memmap(partial, mode="r+", offset=header_bytes,
                        dtype=np.dtype([("header", "V240"), ("data", f"{order}f4", (ns,))]))
        step = max(1, 2**16)
        for t0 in range(0, traces, step):
            out["header"][t0:t0 + step] = source["header"][t0:t0 + step]
        if ns != geometry.shape[2]:
            counts = out["header"].view(np.uint8).reshape(traces, _TRACE_HEADER_BYTES)
            counts[:, _TRACE_SAMPLES_OFFSET:_TRACE_SAMPLES_OFFSET + 2] = np.frombuffer(
                ns.to_bytes(2, geometry.endian), dtype=np.uint8)
        columns = np.arange(nxl)
        for i0, i1 in _slabs(data, nil, slab_bytes):
            slab = np.asarray(data[i0:i1], dtype=np.float32)  # computes a Dask slab
            for i in range(i0, i1):
                out["data"][geometry.trace_index(i, columns)] = slab[i - i0]
            del slab
        out.flush()
        del out
        os.replace(partial, path)
        mark_written(path)
    finally:
        del source
        if os.path.exists(partial):
            os.remove(partial)
    return text is not None
