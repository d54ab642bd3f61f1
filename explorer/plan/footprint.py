"""A Dask worker's memory footprint: one formula, its terms named.

The worker footprint (one formula, stated once in :func:`worker_footprint`)
---------------------------------------------------------------------------
A Dask worker with ``T`` threads runs an operator with halo ``h`` on chunks ``c``.
Each task sees a block ``b``: on a whole axis the full length ``N``, on any other
axis ``c + 2h`` (one-sided ``c + h`` when the axis has two chunks, ``N`` when it has
one; never more than ``N``)::

    total = baseline_bytes                               # the worker process, measured
          + T * (input_block_bytes + task_peak_bytes     # task_bytes: T tasks running ...
                 + store_chunk_bytes)                    #   ... one writing a chunk the volume does not fill
          + T * waiting_input_bytes_per_thread           # held_bytes: blocks waiting ...
          + T * held_output_bytes_per_thread             #   ... outputs not yet released ...
          + neighbour_chunk_bytes                        #   ... and chunks kept for halos

    input_block_bytes               = prod(b) * itemsize          (float32 input: 4), or 0
    task_peak_bytes                 = the in-worker task peak at b (mean, or its upper bound on
                                      the largest of the plan's n tasks: ``Predictor``)
    store_chunk_bytes               = prod(c) * output_itemsize when a chunk of the plan is
                                      partial (``partial_chunks``), else 0
    waiting_input_bytes_per_thread  = WAITING_INPUTS_PER_THREAD * prod(b) * itemsize, or 0
    held_output_bytes_per_thread    = HELD_OUTPUTS_PER_THREAD  * prod(b) * output_itemsize

A task stores its chunk into the run's Zarr output (``explorer.runner.writing``; a SEG-Y output
is written from it) in the same task.  Where the chunks do not divide the volume, the last chunk
along that axis is shorter than the store's chunk, and Zarr merges it into a whole chunk
filled with the fill value before encoding it: one store chunk more at that task's peak
(``zarr`` 3.1, ``CodecPipeline._merge_chunk_array``; ``tests/test_chunking.py`` traces Zarr's
allocations: 1.08-1.10 chunks to write a whole chunk, its encode buffer, 2.08 for a shorter one
at the array's end).  The probes' volumes are whole numbers of their
chunks, so the in-worker excess never saw it; gaussian's first tasks on such chunks grew 94 MiB
against 70 MiB on whole ones of the same run.  The term is the largest task's, so it is
counted whenever any chunk is partial.

``baseline_bytes`` is the resident memory of an idle worker with the operator loaded,
measured on the workers that run the work (``explorer.measure.inworker.warm_worker``), never a
constant: a user's workers (preloads, plugins, other versions) differ from ours by
hundreds of MiB.  ``task_peak_bytes`` is the in-worker task peak of
``docs/definitions.md``: the isolated ``peak_bytes(b)`` (the highest RSS while
``operator.run(x)`` executes minus the RSS just before, with ``x`` resident) plus what
the task needs around ``run`` inside a worker (reading or concatenating its block, the
store's copies; ``explorer.plan.calibration``), so the task's own output is inside it while it runs.

A run reads its input file in **windows** (``operators.windowed_map``): each task reads
its own block (its chunk and the halo), runs and trims it, so no input is resident
before a task starts (``input_block_bytes`` and the waiting inputs are 0, ``windowed``
in :func:`worker_footprint`: the block it reads is inside its task peak) and no chunk is
kept for a neighbour.  ``map_overlap`` on a chunked Dask array instead slices every chunk
into pieces its neighbours gather: a chunk stays resident until its last neighbour has
run, and a worker that reads ahead of its slow tasks holds many.  The frontier count of
:func:`neighbour_chunks_held` (two layers of the grid split over the workers) was the
model of that; the first-run benchmark's survey (2 workers, a 7x4x2 grid of gst3d) held
about 15 chunks' worth on one worker against its 8, 1.09x its bound
(``scripts/results/run_trace_survey.md``): the count depends on how far the scheduler
reads ahead, which no count of the grid gives.  It remains the count for a staged
pipeline's later stages, whose inputs are intermediates in the workers (their producers
are slow tasks, not reads).  Held blocks are counted per thread because the scheduler
keeps each thread fed:

* one waiting input block of ``b`` (a ``map_overlap`` stage only): the next task's block
  (its chunk and the neighbour slices it gathers) is resident before a thread frees up;
* one finished output per thread, sized ``b`` and not ``c``: ``map_overlap``'s trim is a
  slice, a *view* whose base is the operator's whole ``b``-shaped result (checked with dask
  2026.8), so a finished output keeps ``prod(b) * output_itemsize`` alive until its
  consumer releases it (a windowed task returns a contiguous copy of its chunk,
  ``operators.base._windowed_task``: there the term is larger than the ``prod(c)`` held, by
  the halo's shell);
* a ``map_overlap`` stage's input chunks kept for their neighbours' halos
  (:func:`neighbour_chunks_held`)::

      neighbour_chunk_bytes = ceil(min(n, 2 prod(k_i, i > a)) / W) * prod(c) * itemsize

  (``n`` chunks, ``k_i`` per axis, ``a`` the first axis with a halo and more than one
  chunk; 0 without such an axis).

The same function gives the mean footprint (``task_peak_bytes`` = model mean) and
the bound (= model upper bound at the requested confidence); only that term differs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from explorer.core.units import FLOAT32_BYTES
from explorer.plan.grid import _samples

__all__ = [
    "WorkerFootprint",
    "neighbour_chunks_held",
    "partial_chunks",
    "task_store_chunk_bytes",
    "worker_footprint",
]


#: Input blocks gathered and waiting, per thread, beyond the one each running task holds.
WAITING_INPUTS_PER_THREAD = 1
#: Finished outputs not yet released, per thread (each keeps its whole block-shaped base).
HELD_OUTPUTS_PER_THREAD = 1


# --------------------------------------------------------------------------- footprint


@dataclass(frozen=True)
class WorkerFootprint:
    """The memory of one Dask worker running an operator, term by term (bytes).

    Fields are ints for one block shape, int64 arrays when :func:`worker_footprint`
    is given many.  ``total = baseline_bytes + task_bytes + held_bytes`` with
    ``task_bytes = T * (input_block_bytes + task_peak_bytes + store_chunk_bytes)`` and
    ``held_bytes = waiting_input_bytes + held_output_bytes + neighbour_chunk_bytes``.
    """

    threads_per_worker: int
    #: The worker process itself: interpreter, dask/distributed, operator modules.
    baseline_bytes: int
    #: One running task's input block: ``prod(b) * itemsize`` (0 when the task reads it: ``windowed``).
    input_block_bytes: int | np.ndarray
    #: One running task's ``peak_bytes(b)`` (model mean or upper bound).
    task_peak_bytes: int | np.ndarray
    #: Blocks gathered for the next tasks: ``T * WAITING_INPUTS_PER_THREAD * prod(b) * itemsize``
    #: (0 when each task reads its own: ``windowed``).
    waiting_input_bytes: int | np.ndarray
    #: Finished outputs not yet released: ``T * HELD_OUTPUTS_PER_THREAD * prod(b) * output_itemsize``.
    held_output_bytes: int | np.ndarray
    #: Input chunks kept for neighbours' halos: ``neighbour_chunks_held * prod(c) * itemsize``.
    neighbour_chunk_bytes: int | np.ndarray = 0
    #: A running task's whole store chunk, into which Zarr merges a chunk the volume does not
    #: fill: ``prod(c) * output_itemsize`` when the plan has one, else 0.
    store_chunk_bytes: int | np.ndarray = 0

    @property
    def task_bytes(self) -> int | np.ndarray:
        """``T * (input_block_bytes + task_peak_bytes + store_chunk_bytes)``: the tasks running at once."""
        return self.threads_per_worker * (self.input_block_bytes + self.task_peak_bytes + self.store_chunk_bytes)

    @property
    def held_bytes(self) -> int | np.ndarray:
        """``waiting_input_bytes + held_output_bytes + neighbour_chunk_bytes``: resident between tasks."""
        return self.waiting_input_bytes + self.held_output_bytes + self.neighbour_chunk_bytes

    @property
    def total(self) -> int | np.ndarray:
        """``baseline_bytes + task_bytes + held_bytes``."""
        return self.baseline_bytes + self.task_bytes + self.held_bytes

    def to_dict(self) -> dict:
        terms = {k: _plain(v) for k, v in asdict(self).items()}
        terms.update(
            task_bytes=_plain(self.task_bytes),
            held_bytes=_plain(self.held_bytes),
            total=_plain(self.total),
        )
        return terms

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerFootprint":
        """The footprint :meth:`to_dict` describes (its derived sums are not read)."""
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def worker_footprint(
    block_shapes,
    task_peak_bytes,
    *,
    threads_per_worker: int = 1,
    baseline_bytes: int,
    itemsize: int = FLOAT32_BYTES,  # the input block is float32 (docs/definitions.md: peak_bytes is beyond it)
    output_itemsize: int = FLOAT32_BYTES,
    waiting_inputs_per_thread: int = WAITING_INPUTS_PER_THREAD,
    held_outputs_per_thread: int = HELD_OUTPUTS_PER_THREAD,
    chunk_shapes=None,
    neighbour_chunks=0,
    windowed: bool = False,
    partial=False,
) -> WorkerFootprint:
    """The worker footprint of tasks on blocks ``b`` (see the module docstring).

    ``block_shapes`` is one block shape ``(ndim,)`` or many ``(m, ndim)``;
    ``task_peak_bytes`` the matching ``peak_bytes(b)`` (scalar or ``(m,)``), rounded up
    to whole bytes and clipped at 0.  ``neighbour_chunks`` (scalar or ``(m,)``, from
    :func:`neighbour_chunks_held`) chunks of ``chunk_shapes`` are kept for halos; without
    ``chunk_shapes`` that term is 0.  ``partial`` (scalar or ``(m,)``, from :func:`partial_chunks`):
    the plan has a chunk the volume does not fill, whose task merges it into a whole store chunk
    of ``chunk_shapes`` (the store-chunk term; 0 without ``chunk_shapes``).  ``windowed``: each task reads its own block
    (``operators.windowed_map``), so no input is resident before a task starts: the
    input-block and waiting-input terms are 0, the block it reads being inside its task
    peak.  Scalar inputs give int terms, arrays int64 arrays.
    """
    threads = int(threads_per_worker)
    if threads < 1:
        raise ValueError(f"threads_per_worker must be >= 1, got {threads_per_worker}")
    blocks = np.asarray(block_shapes, dtype=np.int64)
    block_samples = _samples(blocks)
    peak = np.ceil(np.maximum(np.asarray(task_peak_bytes, dtype=np.float64), 0.0)).astype(np.int64)
    block_input_bytes = block_samples * (0 if windowed else int(itemsize))
    block_output_bytes = block_samples * int(output_itemsize)
    if chunk_shapes is None:
        neighbour_bytes = store_bytes = np.zeros_like(block_samples)
    else:
        chunk_samples = _samples(np.asarray(chunk_shapes, dtype=np.int64))
        neighbour_bytes = np.asarray(neighbour_chunks, dtype=np.int64) * chunk_samples * int(itemsize)
        store_bytes = np.asarray(partial, dtype=bool) * chunk_samples * int(output_itemsize)
    return WorkerFootprint(
        threads_per_worker=threads,
        baseline_bytes=int(baseline_bytes),
        input_block_bytes=_int_or_array(block_input_bytes),
        task_peak_bytes=_int_or_array(_shaped(peak, block_samples.shape)),
        waiting_input_bytes=_int_or_array(threads * int(waiting_inputs_per_thread) * block_input_bytes),
        held_output_bytes=_int_or_array(threads * int(held_outputs_per_thread) * block_output_bytes),
        neighbour_chunk_bytes=_int_or_array(_shaped(neighbour_bytes, block_samples.shape)),
        store_chunk_bytes=_int_or_array(_shaped(store_bytes, block_samples.shape)),
    )


def partial_chunks(shape, chunk_shapes) -> np.ndarray:
    """Whether a chunking of ``shape`` leaves a chunk shorter than the others (its last along an
    axis the chunk length does not divide): the store-chunk term of :func:`worker_footprint`.
    ``chunk_shapes`` ``(ndim,)`` or ``(m, ndim)``; bool, one per row."""
    chunks = np.asarray(chunk_shapes, dtype=np.int64)
    return (np.asarray(shape, dtype=np.int64) % np.maximum(chunks, 1) != 0).any(axis=-1)


def task_store_chunk_bytes(shape, chunks, index, output_itemsize: int = FLOAT32_BYTES) -> int:
    """The store-chunk term of :func:`worker_footprint` for the one task of chunk ``index`` (its
    position in the chunk grid of ``shape`` by ``chunks``): ``prod(chunks) * output_itemsize``
    when that chunk is the last along an axis ``chunks`` does not divide, which Zarr merges into
    a whole store chunk inside the task, else 0.  (The footprint adds the term to every task of
    a plan that has such a chunk: it bounds the worst task.)"""
    last = [-(-int(n) // max(int(c), 1)) - 1 for n, c in zip(shape, chunks)]
    short = any(int(i) == k and int(n) % int(c) for n, c, i, k in zip(shape, chunks, index, last))
    return math.prod(int(c) for c in chunks) * int(output_itemsize) if short else 0


def _shaped(x: np.ndarray, shape) -> np.ndarray:
    """``x`` broadcast to ``shape``, itself when it has it (``np.broadcast_to`` costs ~10 us)."""
    return x if x.shape == shape else np.broadcast_to(x, shape)


def neighbour_chunks_held(chunk_counts, halo, workers: int = 1):
    """Input chunks one worker keeps resident for its neighbours' halos (module docstring).

    ``ceil(min(n, 2 * prod(k_i for i > a)) / W)``: ``n = prod(k)`` chunks, ``a`` the
    first axis that has a halo and more than one chunk (0 chunks when no axis has
    both).  Dask's order walks the chunk grid in index order, first axis slowest; a
    chunk read from the file is released only after the last block that slices a halo
    from it, its neighbour one step further along ``a`` and every later axis, which
    comes about ``2 * prod(k_i for i > a)`` blocks after the first: two layers of the
    grid across ``a``, shared by the ``W`` workers.  ``chunk_counts``: ``(ndim,)`` or
    ``(m, ndim)``; int64 result, one per row.
    """
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    k = np.asarray(chunk_counts, dtype=np.int64)
    overlapped = (np.asarray(halo) > 0) & (k > 1)
    rows = k.reshape(-1, k.shape[-1])
    overlapped = np.broadcast_to(overlapped, k.shape).reshape(rows.shape)
    # Column by column from the last axis: ``suffix`` is prod(k_i, i >= a); ``later`` ends as
    # prod(k_i, i > a) of the first axis a that overlaps (NumPy's reductions over a short
    # last axis are slow).
    suffix = np.ones(len(rows), dtype=np.int64)
    later = np.zeros(len(rows), dtype=np.int64)
    found = np.zeros(len(rows), dtype=bool)
    for a in reversed(range(rows.shape[1])):
        later = np.where(overlapped[:, a], suffix, later)
        found |= overlapped[:, a]
        suffix = suffix * rows[:, a]
    alive = np.minimum(suffix, 2 * later)
    held = np.where(found, -(-alive // int(workers)), 0)
    return held.reshape(k.shape[:-1])


def _int_or_array(x: np.ndarray):
    x = np.asarray(x)
    return int(x) if x.ndim == 0 else x


def _plain(x):
    return x.tolist() if isinstance(x, np.ndarray) else x
