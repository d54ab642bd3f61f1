"""The planner's inputs as value objects: the workers a plan is for (:class:`WorkerSpec`), the
volume and its chunk grid's rules (:class:`VolumeGeometry`) and the time model's terms
(:class:`TimeTerms`).  Plain frozen records: ``explorer.plan.planner.plan_chunks`` checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.core.machine import CacheGeometry
from explorer.core.units import FLOAT32_BYTES
from explorer.plan.dask_config import FALLBACK_PAUSE_FRACTION
from explorer.plan.time_model import (
    DEFAULT_GRAPH_TASK_SECONDS,
    DEFAULT_SECONDS_PER_VOXEL,
    RUN_IO_SECONDS_PER_VOXEL,
)

if TYPE_CHECKING:
    from explorer.plan.time_model import FirstTouch, TaskClock

__all__ = [
    "DEFAULT_MIN_CHUNK",
    "TimeTerms",
    "VolumeGeometry",
    "WorkerSpec",
]


#: Smallest chunk along a non-whole axis (a task per 16^3 float32 samples is all overhead).
DEFAULT_MIN_CHUNK = 16


@dataclass(frozen=True)
class WorkerSpec:
    """The Dask workers a plan is for (like Cubed's ``Spec``): ``workers`` alike, each with
    ``threads_per_worker`` threads, so ``slots = workers * threads_per_worker`` tasks run at
    once, and each may hold ``budget = floor(pause_fraction * limit_bytes)`` bytes before Dask
    pauses it.
    """

    #: A worker's Dask ``memory_limit``, bytes.
    limit_bytes: int
    #: An idle worker's resident memory with the operator loaded, bytes, measured where the
    #: work runs (``explorer.measure.worker_baseline``).
    baseline_bytes: int
    #: Threads per worker: the tasks one worker runs at once.
    threads_per_worker: int = 1
    #: How many such workers share the work.
    workers: int = 1
    #: The fraction of ``limit_bytes`` at which Dask pauses a worker
    #: (``distributed.worker.memory.pause``: ``explorer.plan.dask_config``).
    pause_fraction: float = FALLBACK_PAUSE_FRACTION
    #: Where ``baseline_bytes`` came from: ``"cluster"`` (measured on the run's workers),
    #: ``"local"`` (measured once on this machine and saved) or ``"given"``.
    baseline_source: str = "given"
    #: The workers' level-1 data cache (``explorer.core.machine.l1_data_cache``), which the
    #: ranking's stride key reads (``explorer.plan.candidates.stride_key``); None: that key ties.
    cache: CacheGeometry | None = None


@dataclass(frozen=True)
class VolumeGeometry:
    """The volume a plan chunks and the rules of its chunk grid: what one operator's tasks
    see of it.

    A staged plan (``explorer.plan.staged.plan_staged_chunks``) reads only ``shape``,
    ``whole_axes``, ``block_multiple`` and ``min_chunk``: its stages carry their own halos
    and item sizes (``PlanStage``), so it refuses a geometry with a ``halo``.
    """

    #: Samples per axis.
    shape: tuple[int, ...]
    #: Samples of context a task needs on each side, per axis; None: none.
    halo: tuple[int, ...] | None = None
    #: Axes the operator needs whole (one chunk along each).
    whole_axes: tuple[int, ...] = ()
    #: Chunk lengths of split axes are multiples of these (``Operator.block_multiple``); None: any.
    block_multiple: tuple[int, ...] | None = None
    #: Bytes per sample of the input (float32: 4).
    itemsize: int = FLOAT32_BYTES
    #: Bytes per block sample of what a task returns (a fused fan-out's: every branch's).
    output_itemsize: int = FLOAT32_BYTES
    #: The smallest chunk considered along a split axis, samples.
    min_chunk: int = DEFAULT_MIN_CHUNK
    #: The largest block (voxels, halo included) a planned task may run: the largest the
    #: operator's tasks were measured on inside a worker (``TaskModel.largest_block_voxels``),
    #: beyond which neither the in-worker bound's spread nor the clock was seen; None: any.
    max_block_voxels: int | None = None
    #: What a task's read touches whole, per axis (``explorer.runner.inputs.RunInput.read_unit``):
    #: a SEG-Y's trace ``(1, 1, samples)``, a Zarr array's chunks; the time model prices a block's
    #: reads by it (``TaskClock.read_correction``).  None: reads priced as the clock's tasks read.
    read_unit: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TimeTerms:
    """The time model's terms (``explorer.plan.time_model.plan_seconds``): what a plan's
    predicted seconds are made of.  Learnt from the workers' clocks once a probe or a run has
    taught them (``explorer.plan.timing.TimingFit``), the measured defaults before.
    """

    #: Seconds per block voxel of a task in a run (read, operator, store), where no
    #: ``task_clock`` says; a fused plan's only (a staged plan's stages carry their own).
    seconds_per_voxel: float = DEFAULT_SECONDS_PER_VOXEL
    #: Seconds of Dask overhead per graph task.
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS
    #: What a run costs whatever its chunks (submitting the graph, gathering the result), seconds.
    run_fixed_seconds: float = 0.0
    #: The workers' learnt seconds per voxel and spread by block (None: ``seconds_per_voxel``
    #: and Graham's bound); a fused plan's only.
    task_clock: TaskClock | None = None
    #: Seconds per voxel a run spends reading and storing beyond the operators; a staged plan's
    #: only (its first stage's read, its intermediates' halo slices from other workers).
    io_seconds_per_voxel: float = RUN_IO_SECONDS_PER_VOXEL
    #: What a slot's first task of a run pays for pages new to its worker (measured on the
    #: workers; None: not measured, no such term).
    first_touch: FirstTouch | None = None
