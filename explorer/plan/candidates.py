"""Candidate chunk shapes (:func:`chunk_candidates`), their predictions and footprints
(:func:`evaluate_candidates`) and their ranking (:func:`rank_candidates`): the three stages
of a plan (``explorer.plan.planner`` states the rules).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from explorer.plan.footprint import partial_chunks
from explorer.plan.grid import Candidates, _samples, axis_blocks
from explorer.plan.predictor import takes
from explorer.plan.spec import TimeTerms
from explorer.plan.time_model import _fused_seconds, _grid_read_voxels

if TYPE_CHECKING:
    from explorer.core.machine import CacheGeometry
    from explorer.plan.chunk_plan import ChunkPlan
    from explorer.plan.predictor import Predictor
    from explorer.plan.spec import VolumeGeometry

__all__ = [
    "stride_key",
    "compactness_key",
    "chunk_candidates",
    "evaluate_candidates",
    "rank_candidates",
    "ranked_candidates",
    "compact_neighbour",
    "grid_volume",
]


#: Upper bound on the number of candidate chunk shapes per plan: 20 per axis when three
#: axes are free, 89 when two are.  Against an unthinned search over 80 cases (analytic
#: predictor), the thinned plans had 0.8% more tasks on average, 6.6% at most.
MAX_CANDIDATES = 8_000
#: Rows per ``predict`` call.  Every call is vectorised; batching only keeps each one in
#: the regime where its cost is linear: the GP's ``predict_many`` took 37 ms for 8,000
#: rows in one call and 3.3 ms in batches of 1,024 (BLAS threading on (n_train, m) products).
PREDICT_BATCH_ROWS = 1024
#: Lengths per axis in the probe pass of a plan (a sub-grid of at most 6^3 candidates).
PROBE_VALUES_PER_AXIS = 6
#: With several slots, plans whose predicted seconds are within this fraction of the
#: fastest count as tied, and evenness, compactness and fewer tasks decide among them:
#: fitted to ``scripts/bench_chunks.py``'s runs the time model's RMS error is 6-14%
#: (two machines), so it does not resolve smaller differences.  (With 2% and fewer tasks
#: first, it took 4 chunks of 160x320x160 for gaussian 320^3 over 8 cubes of 160^3
#: predicted 2% faster; measured, 1.3x slower.  With the seconds ranked right after the
#: strides (2c55381), it took 6 tasks of 107x160x320 for first_derivative 320^3 over the
#: even 160x160x320 priced 3.6% slower; measured, 1.14x the slab.  Within the tie the
#: seconds are no evidence either way; the trials' measurements are: ``explorer.runner.trials``.)
SECONDS_TIE_FRACTION = 0.05


def _counts(n_max: int, cap: int) -> np.ndarray:
    """Chunk counts ``1 .. n_max``; past ``cap`` values, the first half consecutive, the rest log-spaced."""
    if n_max <= cap:
        return np.arange(1, n_max + 1)
    dense = cap // 2
    sparse = np.geomspace(dense + 1, n_max, cap - dense)
    return np.unique(np.concatenate([np.arange(1, dense + 1), np.rint(sparse).astype(np.int64)]))


def axis_chunk_candidates(length: int, halo: int, whole: bool, min_chunk: int, cap: int,
                          multiple: int = 1, odd_blocks: bool = False) -> np.ndarray:
    """Candidate chunk lengths along one axis, largest first.

    Whole axis: ``[length]``.  Otherwise the distinct ``ceil(length / k)`` for
    ``k = 1 .. length // c_min``, ``c_min = min(length, max(min_chunk, 2 halo + 1))``,
    each rounded up to a multiple of ``multiple`` when the axis is split (an operator
    that pads its blocks to a multiple needs its chunk boundaries on that grid:
    ``Operator.block_multiple``), keeping those whose last chunk is at least ``halo``
    (Dask's ``map_overlap`` rechunks smaller ones).  ``odd_blocks`` (one of a block's two
    trailing axes, whose lengths set its memory strides: :func:`stride_key`): beside each
    split length whose block (:func:`axis_blocks`) is even, the next length, whose block is odd.
    """
    if whole:
        return np.array([length], dtype=np.int64)
    smallest = min(length, max(int(min_chunk), 2 * halo + 1))
    counts = _counts(length // smallest, cap)
    chunk = -(-length // counts)
    m = int(multiple)
    if m > 1:
        chunk = np.where(chunk >= length, length, np.minimum(-(-chunk // m) * m, length))
    elif odd_blocks:
        even = (chunk < length - 1) & (axis_blocks(length, chunk, halo) % 2 == 0)
        chunk = np.concatenate([chunk, chunk[even] + 1])
    chunk = np.unique(chunk)[::-1]
    n_chunks = -(-length // chunk)
    last = length - (n_chunks - 1) * chunk
    return chunk[(n_chunks == 1) | (last >= halo)]


def _axis_cap(ndim: int, whole) -> int:
    """Candidate lengths per split axis, so that their product stays near :data:`MAX_CANDIDATES`."""
    return max(4, int(MAX_CANDIDATES ** (1.0 / max(1, ndim - len(whole))) + 1e-9))


def grid_volume(block, halo, whole_axes, counts) -> tuple[tuple, tuple]:
    """``(volume_shape, chunks)`` of a synthetic volume whose tasks see ``block`` (the probes'
    and the trials'): along a split axis with ``k`` chunks, ``k`` chunks of ``b - h`` (with two,
    each has its neighbour's halo on one side only, so every task's block is exactly ``b``;
    with more, the interior ones see ``b + h``); with one chunk, or along a whole axis, ``b``
    (a windowed read clips the halo at the volume's edge)."""
    volume, chunks = [], []
    for axis, (b, h, k) in enumerate(zip(block, halo, counts)):
        if axis in whole_axes or int(k) == 1:
            volume.append(int(b))
            chunks.append(int(b))
        else:
            volume.append(int(k) * (int(b) - int(h)))
            chunks.append(int(b) - int(h))
    return tuple(volume), tuple(chunks)


def compact_neighbour(plan: "ChunkPlan") -> tuple[int, ...] | None:
    """The plan's chunks with its longest split axis cut in about twice as many chunks: the
    largest of that axis's candidate lengths (:func:`axis_chunk_candidates`, as
    :func:`plan_chunks` made them) at most half the plan's; None when no axis can be cut.

    The time model ranks blocks it has no clock of by their volume alone, and a longer
    block's extra cost per voxel (its cache misses) can outweigh the waves it saves: gst3d's
    256^3 plan of 128x128x256 chunks ran 1.6x slower than 128^3.  ``explorer.runner.daskrun`` times
    this neighbour beside the plan before a run (its trials) so that the choice between them
    is measured."""
    whole = set(plan.whole_axes)
    free = [axis for axis in range(len(plan.shape)) if axis not in whole and plan.chunks[axis] > 1]
    cap = _axis_cap(len(plan.shape), whole)
    multiple = plan.block_multiple or (1,) * len(plan.shape)
    for axis in sorted(free, key=lambda a: (-plan.chunks[a], -a)):
        lengths = axis_chunk_candidates(plan.shape[axis], plan.halo[axis], False, plan.min_chunk, cap,
                                        multiple[axis])
        shorter = lengths[lengths <= plan.chunks[axis] // 2]
        if shorter.size:
            chunks = list(plan.chunks)
            chunks[axis] = int(shorter.max())
            return tuple(chunks)
    return None


def chunk_candidates(geometry: VolumeGeometry, *, footprint, budget: int, slots: int,
                     time_terms: TimeTerms = TimeTerms(), chunks=None) -> Candidates:
    """The candidate chunkings of ``geometry`` (module docstring): the Cartesian product of
    per-axis chunk lengths, less those whose footprint with ``peak = 0`` already exceeds
    ``budget`` (the smallest is kept so that a failure can report it); their time model
    (``time_terms`` on ``slots`` slots) is evaluated.  ``chunks``: one chunk shape, the only
    candidate (a whole axis whole, none longer than the volume): the plan of a chunking
    chosen elsewhere."""
    shape, whole, min_chunk, block_multiple = (geometry.shape, geometry.whole_axes, geometry.min_chunk,
                                               geometry.block_multiple)
    halo = (0,) * len(shape) if geometry.halo is None else geometry.halo
    ndim = len(shape)
    cap = _axis_cap(ndim, whole)
    multiple = (1,) * ndim if block_multiple is None else tuple(int(m) for m in block_multiple)
    if chunks is None:
        axis_chunks = [axis_chunk_candidates(shape[i], halo[i], i in whole, min_chunk, cap, multiple[i],
                                             odd_blocks=i >= ndim - 2)
                       for i in range(ndim)]
    else:
        axis_chunks = [np.array([shape[i] if i in whole else min(int(chunks[i]), shape[i])], dtype=np.int64)
                       for i in range(ndim)]
    axis_block = [axis_blocks(shape[i], c, halo[i]) for i, c in enumerate(axis_chunks)]
    axis_counts = [-(-shape[i] // c) for i, c in enumerate(axis_chunks)]
    block_samples = functools.reduce(np.multiply.outer, axis_block).ravel()
    n_tasks = functools.reduce(np.multiply.outer, axis_counts).ravel()
    # The footprint depends on a block only through its volume: volumes as 1-axis shapes.
    floor_total = footprint(block_samples[:, None], 0).total
    allowed = floor_total <= budget
    if chunks is None and geometry.max_block_voxels is not None:
        allowed &= block_samples <= geometry.max_block_voxels
    keep = np.flatnonzero(allowed)
    if keep.size == 0:
        keep = np.array([np.argmin(floor_total)])
    grid = np.unravel_index(keep, [len(c) for c in axis_chunks])
    chunks = np.stack([c[g] for c, g in zip(axis_chunks, grid)], axis=1)
    blocks = np.stack([b[g] for b, g in zip(axis_block, grid)], axis=1)
    clock = time_terms.task_clock  # reads priced only where it timed them
    seconds = _fused_seconds(shape, axis_chunks, grid, blocks, n_tasks[keep], slots=slots,
                             seconds_per_voxel=time_terms.seconds_per_voxel,
                             graph_task_seconds=time_terms.graph_task_seconds, task_clock=clock,
                             run_fixed_seconds=time_terms.run_fixed_seconds,
                             first_touch=time_terms.first_touch,
                             read_voxels=None if clock is None or clock.read_seconds_per_voxel is None
                             else _grid_read_voxels(shape, halo, axis_chunks, grid, geometry.read_unit))
    return Candidates(axis_chunks=axis_chunks, grid=grid, chunks=chunks, blocks=blocks, n_tasks=n_tasks[keep],
                      # a fused task reads its own block (operators.windowed_map): nothing kept for a neighbour
                      neighbours=np.zeros(len(keep), dtype=np.int64), seconds=seconds,
                      partial=partial_chunks(shape, chunks))


def _first_key(c: Candidates, slots: int) -> tuple[np.ndarray, float]:
    """The first ranking key and its tie factor: fewest tasks (exactly) with one slot; the
    time model within :data:`SECONDS_TIE_FRACTION` with several.  Known before any prediction."""
    if slots == 1:
        return c.n_tasks.astype(np.float64), 1.0
    return c.seconds, 1.0 + SECONDS_TIE_FRACTION


def evaluate_candidates(c: Candidates, predict: Predictor | None, *, confidence: float, footprint, budget: int,
                        slots: int, fill=None) -> int:
    """Predict the candidates' task peaks and upper footprints; return how many were predicted.

    The first ranking key ``k`` (:func:`_first_key`) needs no prediction, and the plan is
    among the candidates that fit with ``k <= k* x tie``, ``k*`` the least key of any that
    fits (:func:`rank_candidates`).  Two passes over disjoint rows find them.  Pass 1, a
    probe: a sub-grid of at most :data:`PROBE_VALUES_PER_AXIS` lengths per axis, whose fits
    give a first ``k*``.  Pass 2, a sweep of the rest in increasing ``k``, in batches of
    :data:`PREDICT_BATCH_ROWS`: each batch's fits lower ``k*``, and the sweep stops
    at the first row with ``k > k* x tie``.  Every row it leaves has ``k`` above the
    threshold of the true ``k*`` (which is at most the sweep's), so the plan is the one an
    exhaustive evaluation would give, for a fraction of the rows; when nothing fits, every
    row is predicted (the error names the smallest footprint).  ``fill(rows)``, when
    given, fills ``c``'s predictions at ``rows`` instead of ``predict`` with ``footprint``
    (a staged plan's: :func:`plan_staged_chunks`).
    """
    if fill is None:
        takes_tasks, ceiling_budget = takes(predict, "tasks"), (budget if takes(predict, "ceiling") else None)

        def fill(rows):
            _predict_rows(predict, c, rows, confidence, footprint, takes_tasks, ceiling_budget, slots)

    first_key, tie = _first_key(c, slots)
    probe = np.ones(len(c.blocks), dtype=bool)
    for axis, lengths in enumerate(c.axis_chunks):
        sub = np.zeros(len(lengths), dtype=bool)
        sub[np.rint(np.linspace(0, len(lengths) - 1, PROBE_VALUES_PER_AXIS)).astype(np.int64)] = True
        probe &= sub[c.grid[axis]]
    probe_rows = np.flatnonzero(probe)
    fill(probe_rows)
    predicted = len(probe_rows)

    def least_fitting_key(rows, least):
        fits = rows[c.upper_total[rows] <= budget]
        return min(least, float(first_key[fits].min())) if fits.size else least

    least = least_fitting_key(probe_rows, math.inf)
    rest = np.flatnonzero(~probe)
    rest = rest[first_key[rest] <= least * tie]
    rest = rest[np.argsort(first_key[rest], kind="stable")]
    for start in range(0, len(rest), PREDICT_BATCH_ROWS):
        rows = rest[start:start + PREDICT_BATCH_ROWS]
        rows = rows[first_key[rows] <= least * tie]
        if not len(rows):
            break
        fill(rows)
        predicted += len(rows)
        least = least_fitting_key(rows, least)
    return predicted


def rank_candidates(c: Candidates, shape, whole, *, budget: int, slots: int, itemsize: int = 4,
                    cache: "CacheGeometry | None" = None, halo=None) -> int:
    """The index of the plan among the candidates that fit (module docstring, keys 1-6); ``itemsize``,
    ``cache`` and the operator's ``halo`` for key 2 (:func:`stride_key`)."""
    return int(ranked_candidates(c, shape, whole, budget=budget, slots=slots, itemsize=itemsize, cache=cache,
                                 halo=halo)[0])


def ranked_candidates(c: Candidates, shape, whole, *, budget: int, slots: int, itemsize: int = 4,
                      cache: "CacheGeometry | None" = None, halo=None) -> np.ndarray:
    """The candidates that fit within the first key's tie, best first (:func:`rank_candidates`'
    ranking, whose first row is the plan)."""
    tied, keys = _ranking_keys(c, shape, whole, budget=budget, slots=slots, itemsize=itemsize, cache=cache,
                               halo=halo)
    return tied[np.lexsort(keys)]


def _ranking_keys(c: Candidates, shape, whole, *, budget: int, slots: int, itemsize: int = 4,
                  cache: "CacheGeometry | None" = None, halo=None) -> tuple[np.ndarray, list]:
    """``(tied, keys)``: the candidates that fit within the first key's tie, and their later
    keys for ``np.lexsort`` (last key first; :func:`rank_candidates`)."""
    ndim = len(shape)
    fits = c.upper_total <= budget
    first_key, tie = _first_key(c, slots)
    # 1. the first key (fewest tasks; or, with several slots, least predicted seconds within
    #    the tie fraction: the model ranks, it is no stopwatch); the rest order the tied.
    tied = np.flatnonzero(fits & (first_key <= first_key[fits].min() * tie))
    tied_chunks = c.chunks[tied]
    n_chunks = -(-np.asarray(shape) // tied_chunks)
    # 2. columns that stay cached along the axes with a halo.
    strides = stride_key(c.blocks[tied], halo, itemsize, cache)
    # 3. evenness: the share of the task grid past the array's end.
    grid_samples = _samples(n_chunks * tied_chunks).astype(np.float64)
    padding_fraction = grid_samples / float(math.prod(shape)) - 1.0
    # 4. compactness: aspect ratio over the non-whole axes with a halo (none: a tie).
    aspect = compactness_key(tied_chunks, halo, whole)
    # 5. fewest tasks, 6. smaller upper footprint, then longer chunks on later axes.
    #    (np.lexsort: last key first.)
    later_axes_longer = [-tied_chunks[:, i] for i in range(ndim)]
    return tied, later_axes_longer + [c.upper_total[tied], c.n_tasks[tied], aspect, padding_fraction, strides]


def compactness_key(chunks, halo, whole) -> np.ndarray:
    """Per chunk shape ``(m, ndim)``, the ranking's fourth key (least first): the aspect ratio
    ``max(c_i) / min(c_i)`` over the axes ``i`` that are not whole and on which the operator
    has a halo (``halo_i > 0``); ones (a tie) where there are fewer than two such axes.

    A halo costs surface: a task reads ``prod(c_i + 2 h_i)`` voxels for ``prod(c_i)``, and at a
    given volume the excess is least where the chunk is a cube over the axes with ``h_i > 0``.  An
    axis without a halo reads nothing of its neighbours at any length, so the aspect along it saves
    nothing (first_derivative's halo is along the samples only).  Where this key ties, the later
    ones decide: fewest tasks, the smaller upper footprint, longer chunks on later axes."""
    chunks = np.atleast_2d(np.asarray(chunks, dtype=np.float64))
    axes = [i for i in range(chunks.shape[1]) if i not in whole and halo is not None and int(halo[i]) > 0]
    if len(axes) < 2:
        return np.ones(len(chunks))
    return chunks[:, axes].max(axis=1) / chunks[:, axes].min(axis=1)


def stride_key(blocks, halo, itemsize: int, cache: "CacheGeometry | None") -> np.ndarray:
    """Per block ``(m, ndim)``, the ranking's second key (least first): by how much a column the
    operator walks, along an axis it needs context on (``halo > 0``), outgrows the lines of
    ``cache`` its stride can use, ``log2`` of the ratio (the worst such axis; 0 without one).

    A C-order block's stride along axis ``a`` is ``s_a = prod(b_{a+1:}) itemsize`` bytes, ``2^k``
    times an odd number.  A cache of ``S`` sets of ``A`` ways of ``L``-byte lines puts an address
    in set ``(address // L) mod S``, so the ``b_a`` lines of a column visit ``S / 2^(k' - log2 L)``
    sets, ``k' = clip(k, log2 L, log2 (L S))``: all of them for a stride of a line or less, one
    from a way up.  A stencil's pass along that axis reuses a column's lines for the next columns
    only while they stay cached::

        key = max over a < ndim - 1 with halo_a > 0 of  max(0, log2(b_a / (A S / 2^(k'_a - log2 L))))

    An operator that needs no context along an axis (envelope's FFT along the samples) makes no
    such pass, and its plans are not ranked by it.  Measured on this machine (L1 data: 64-byte
    lines, 64 sets, 12 ways) on gaussian's ``run`` (halo 8 on every axis; ``scripts/shape_speed.py``,
    ``scripts/results/shape_speed_gaussian.md``): 96x168x320 (axis 0: ``k = 11``, 24 lines for a
    column of 96) ran 18 ns per voxel and 96x169x320 (``k = 8``, 192 lines) 12 ns; 96x176x320 (``k
    = 12``, 12 lines) 21 ns, 96x176x321 (``k = 6``) and 97x177x320 13 ns; 176x176x168, x176 and
    x160 (``k`` 9, 10, 11: 96, 48, 24 lines for 176) 15, 16 and 17 ns; 168^3 (``k = 8``, 192
    lines) 12 ns.  Among the plans the time model ties, an odd block length on either trailing
    axis takes the factors of two out (:func:`axis_chunk_candidates` offers one beside each even
    one).  Zeros (a tie) without a ``cache``."""
    blocks = np.atleast_2d(np.asarray(blocks, dtype=np.int64))
    key = np.zeros(len(blocks))
    if cache is None:
        return key
    line = math.log2(cache.line_bytes)
    for a in range(blocks.shape[1] - 1):
        if halo is None or not int(halo[a]) > 0:
            continue
        stride = blocks[:, a + 1:].prod(axis=1) * int(itemsize)
        visited = cache.sets / 2.0 ** (np.clip(np.log2(stride & -stride), line, line + math.log2(cache.sets)) - line)
        key = np.maximum(key, np.log2(blocks[:, a] / (cache.ways * visited)))
    return key


def _predict_rows(predict, c: Candidates, rows, confidence, footprint, takes_tasks: bool,
                  ceiling_budget: int | None = None, slots: int | None = None) -> None:
    """Fill ``mean_peak``, ``upper_peak`` (>= mean), ``upper_total`` and ``exact`` of ``c`` at
    ``rows`` (:func:`_predict_blocks`); a non-finite prediction leaves the total at int64 max
    (never fits).  With ``ceiling_budget`` (the predictor declares ``ceiling``), each row's
    ceiling is the largest task peak ``P`` whose footprint fits it: the footprint is
    ``F(0) + T ceil(P)`` (:func:`worker_footprint`), so it fits iff ``P <= floor((budget -
    F(0)) / T)``; a row the predictor bounds above its ceiling gets the footprint of that
    lower bound (above the budget) and stays inexact."""
    blocks, kept = c.blocks[rows], {"chunk_shapes": c.chunks[rows], "neighbour_chunks": c.neighbours[rows],
                                    "partial": c.partial[rows]}
    ceiling = None
    if ceiling_budget is not None:
        empty = footprint(blocks, 0.0, **kept)
        ceiling = ((int(ceiling_budget) - empty.total) // empty.threads_per_worker).astype(np.float64)
    mean, upper, exact = _predict_blocks(predict, blocks, c.n_tasks[rows], confidence, takes_tasks, ceiling, slots)
    finite = np.isfinite(upper)
    total = footprint(blocks, np.where(finite, upper, 0.0), **kept).total
    c.mean_peak[rows], c.upper_peak[rows] = mean, upper
    c.upper_total[rows] = np.where(finite, total, np.iinfo(np.int64).max)
    c.exact[rows] = exact


def _predict_blocks(predict, blocks, n_tasks, confidence, takes_tasks: bool,
                    ceiling=None, slots: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, upper, exact)`` task peaks at ``blocks`` (``upper >= mean``, NaN as inf),
    predicted in slices of ``PREDICT_BATCH_ROWS``; a predictor declaring ``tasks``
    (``takes_tasks``) gets each row's count from ``n_tasks``, and given ``ceiling`` (``(m,)``)
    it gets each row's; given ``slots`` a predictor declaring ``cold`` gets ``min(tasks, slots)``.
    ``exact`` is False where the predictor stopped short of a row (:class:`Predictor`): ``mean``
    inf and ``upper`` its bound there (a lower bound above the ceiling, or an upper bound at or
    below it)."""
    means, uppers, exacts = [], [], []
    takes_cold = takes_tasks and slots is not None and takes(predict, "cold")
    for start in range(0, len(blocks), PREDICT_BATCH_ROWS):
        part = slice(start, start + PREDICT_BATCH_ROWS)
        m = len(blocks[part])
        keywords = {"tasks": n_tasks[part]} if takes_tasks else {}
        if takes_cold:
            keywords["cold"] = np.minimum(n_tasks[part], int(slots))
        if ceiling is not None:
            keywords["ceiling"] = ceiling[part]
        raw_mean, upper = predict(blocks[part], confidence=confidence, **keywords)
        mean = _checked_prediction(raw_mean, m, "mean")
        upper = _checked_prediction(upper, m, "upper")
        bounded = np.zeros(m, dtype=bool) if ceiling is None else np.isnan(np.asarray(raw_mean, dtype=np.float64))
        means.append(mean)
        uppers.append(np.where(bounded, upper, np.maximum(upper, mean)))
        exacts.append(~bounded)
    if not means:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool)
    return np.concatenate(means), np.concatenate(uppers), np.concatenate(exacts)


def _complete_smallest(c: Candidates, exact, complete) -> None:
    """Make the smallest ``upper_total`` an exact one, as an exhaustive evaluation gives it
    (what the no-fit message names), when some totals are lower bounds: while the smallest
    is not ``exact()``, ``complete(rows)`` (predict exactly) the inexact rows at or below the
    smallest exact total, smallest first, a batch at a time.  A lower bound above an exact
    total cannot be the smallest once completed; every row is completed at most once."""
    completed = np.zeros(len(c.upper_total), dtype=bool)
    while True:
        done = exact() | completed
        if done[int(np.argmin(c.upper_total))]:
            return
        least_exact = c.upper_total[done].min(initial=np.iinfo(np.int64).max)
        below = np.flatnonzero(~done & (c.upper_total <= least_exact))
        rows = below[np.argsort(c.upper_total[below], kind="stable")[:PREDICT_BATCH_ROWS // 4]]
        complete(rows)
        completed[rows] = True


def _checked_prediction(values, m: int, what: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (m,):
        raise ValueError(f"predict returned {what} of shape {values.shape}; expected ({m},)")
    return np.where(np.isnan(values), np.inf, values)
