"""A chunk grid's arithmetic: the chunks along an axis, the block each task sees (its chunk and
the halo, clipped at the array's ends), products over rows, and the halo a pipeline stage
exchanges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Candidates",
    "row_product",
]


def _axis_chunks(length: int, chunk: int) -> tuple[int, ...]:
    full, remainder = divmod(length, chunk)
    return (chunk,) * full + ((remainder,) if remainder else ())


def axis_blocks(length: int, chunks, halo: int) -> np.ndarray:
    """The largest block extent a task sees along one axis, for each chunk length.

    ``N`` when the axis is in one chunk (a whole axis always is); ``min(c + h, N)``
    with two chunks (each has a neighbour on one side only: ``boundary="none"``);
    ``min(c + 2h, N)`` with three or more (an interior chunk has both).
    """
    chunks = np.asarray(chunks, dtype=np.int64)
    n_chunks = -(-length // chunks)
    block = np.minimum(chunks + np.where(n_chunks >= 3, 2 * halo, halo), length)
    return np.where(n_chunks == 1, length, block)


def read_extent(window, unit, length):
    """Samples a read of ``window`` samples touches along an axis of ``length`` stored in units of
    ``unit`` samples (a SEG-Y's samples axis: one trace; a Zarr array's: its chunk), on average
    over where the window starts::

        min(length, window + unit - 1)

    (a window touches ``1 + (window - 1) / unit`` units on average): the window itself when
    ``unit`` is 1, the whole axis when ``unit`` is the axis.  Arrays broadcast."""
    w, u = np.asarray(window, dtype=np.float64), np.asarray(unit, dtype=np.float64)
    return np.minimum(np.asarray(length, dtype=np.float64), w + u - 1.0)


def mean_read_extent(length: int, chunks, halo: int, unit: int) -> np.ndarray:
    """Per chunk length of ``chunks``, the mean over the axis's chunks of the samples their
    windowed reads touch (``operators.windowed_map``): chunk ``j``'s window ``[lo, hi) = [max(0,
    j c - h), min(N, (j + 1) c + h))`` touches the units ``floor(lo / u)`` to ``ceil(hi / u)``,
    so ``min(N, u ceil(hi / u)) - u floor(lo / u)`` samples; exact where :func:`read_extent`
    averages over positions."""
    out = np.empty(len(np.atleast_1d(chunks)), dtype=np.float64)
    for i, c in enumerate(np.atleast_1d(np.asarray(chunks, dtype=np.int64)).tolist()):
        starts = np.arange(0, length, c, dtype=np.int64)
        lo = np.maximum(0, starts - halo)
        hi = np.minimum(length, starts + c + halo)
        out[i] = float((np.minimum(length, -(-hi // unit) * unit) - (lo // unit) * unit).mean())
    return out


def row_product(a: np.ndarray):
    """``prod`` over the last axis of ``(ndim,)`` or ``(m, ndim)``: for many rows a product of
    columns, the same multiplications in the same order as ``np.prod(axis=-1)`` and 10x
    faster on a few columns (NumPy's reduction over a short axis is slow)."""
    a = np.asarray(a)
    if a.ndim != 2:
        return np.prod(a, axis=-1)
    out = a[:, 0].copy()
    for i in range(1, a.shape[1]):
        out *= a[:, i]
    return out


def _samples(shapes: np.ndarray) -> np.ndarray:
    """``prod(shape)`` over the last axis (a column product: 10x faster than ``np.prod(axis=-1)``)."""
    shapes = np.asarray(shapes, dtype=np.int64)
    if shapes.ndim == 1:
        return np.int64(math.prod(int(n) for n in shapes))
    out = shapes[:, 0].copy()
    for i in range(1, shapes.shape[1]):
        out *= shapes[:, i]
    return out


@dataclass
class Candidates:
    """Candidate chunkings of one volume, one row each (:func:`chunk_candidates`).

    ``axis_chunks[i]``: the candidate lengths along axis ``i``; ``grid[i]``: each row's
    index into it.  ``chunks``, ``blocks`` ``(m, ndim)``; ``n_tasks``, ``neighbours``
    (:func:`neighbour_chunks_held`), ``seconds`` (:func:`plan_seconds`), ``partial``
    (:func:`explorer.plan.footprint.partial_chunks`) ``(m,)``.  The
    predictions ``mean_peak``, ``upper_peak`` and the bound's ``upper_total`` are filled
    by :func:`evaluate_candidates` (``inf``/int64 max where not predicted); ``exact`` marks the
    rows whose prediction is complete, the others' ``upper_total`` being a lower bound above
    the budget (a predictor's ``ceiling``: :class:`Predictor`) or nothing.
    """

    axis_chunks: list
    grid: tuple
    chunks: np.ndarray
    blocks: np.ndarray
    n_tasks: np.ndarray
    neighbours: np.ndarray
    seconds: np.ndarray
    partial: np.ndarray = None
    mean_peak: np.ndarray = None
    upper_peak: np.ndarray = None
    upper_total: np.ndarray = None
    exact: np.ndarray = None

    def __post_init__(self):
        m = len(self.chunks)
        self.mean_peak = np.full(m, np.inf)
        self.upper_peak = np.full(m, np.inf)
        self.upper_total = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
        self.exact = np.zeros(m, dtype=bool)


def reads_file(group: int) -> bool:
    """Whether pipeline stage ``group`` (its index) reads its blocks from the file in windows
    (``operators.windowed_map``): the first does; a later one ``map_overlap`` s the previous
    stage's output (``operators.pipeline.Pipeline.dask``)."""
    return group == 0


def exchanged_halo(halo, group: int) -> tuple[int, ...]:
    """The halo a pipeline stage's Dask form exchanges between chunks, ``group`` its index: none
    for the first stage (group 0), whose blocks are windowed reads of the file
    (``operators.windowed_map``); a later stage's own, which its ``map_overlap`` slices from the
    intermediate's chunks."""
    return (0,) * len(halo) if reads_file(group) else tuple(int(h) for h in halo)
