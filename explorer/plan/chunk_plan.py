"""A chunk plan (:class:`ChunkPlan`): the chunks, their worker footprint and predicted
seconds, what the plan assumed; and the error when no chunk fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.core.machine import CacheGeometry
from explorer.core.units import FLOAT32_BYTES
from explorer.plan.grid import _axis_chunks
from explorer.plan.spec import DEFAULT_MIN_CHUNK
from explorer.plan.time_model import DEFAULT_GRAPH_TASK_SECONDS

if TYPE_CHECKING:
    from explorer.plan.footprint import WorkerFootprint
    from explorer.plan.time_model import FirstTouch, TaskClock

__all__ = [
    "ChunkPlan",
    "ChunkPlanError",
]


class ChunkPlanError(ValueError):
    """No candidate chunk fits the memory limit (one-line message)."""


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ChunkPlan:
    """Chunks for ``operator`` on a volume of ``shape``, with the footprint that justifies them.

    ``predicted_bytes`` and ``upper_bytes`` are the worker footprint's total with the
    model's mean and upper bound (at ``confidence``) of ``peak_bytes(block)``;
    ``footprint`` holds the bound's terms.  The plan guarantees
    ``upper_bytes <= budget_bytes = floor(pause_fraction * limit_bytes)``.
    """

    operator: str | None
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    #: The largest block a task sees (chunk plus halos, whole axes whole).
    block: tuple[int, ...]
    halo: tuple[int, ...]
    whole_axes: tuple[int, ...]
    predicted_bytes: int
    upper_bytes: int
    limit_bytes: int
    pause_fraction: float
    confidence: float
    n_tasks: int
    threads_per_worker: int
    footprint: WorkerFootprint = field(repr=False)
    #: Candidate chunk shapes whose footprint was predicted.
    n_candidates: int = 0
    #: ``workers * threads_per_worker``: the tasks that run at once in the time model.
    slots: int = 1
    #: :func:`plan_seconds` of the plan: the time model's wall seconds (a ranking, not a promise).
    predicted_seconds: float | None = None
    #: The time model's seconds per block voxel (at the plan's block).
    seconds_per_voxel: float | None = None
    #: The time model's coefficient of variation of equal tasks' seconds at the plan's
    #: block (learnt from the clocks), or None: Graham's bound (:func:`schedule_waves`).
    task_spread: float | None = None
    #: The learnt clocks the time model used (None: the constant ``seconds_per_voxel``).
    task_clock: TaskClock | None = field(default=None, repr=False)
    #: Whether workers have timed the plan's block shape itself (:meth:`TaskClock.clocked`; a
    #: staged plan's: every stage's block by its member's clock); False: its seconds come from
    #: a clock's volume curve.
    block_clocked: bool = False
    #: What the predicted seconds charge each slot's first task for pages new to its worker
    #: (``explorer.plan.time_model.FirstTouch``; None: not measured, no such charge).
    first_touch: FirstTouch | None = None
    #: What a task's read of the input touches whole, per axis, as the predicted seconds priced
    #: it (``VolumeGeometry.read_unit``; None: as the clock's tasks read).
    read_unit: tuple[int, ...] | None = None
    #: Input chunks a worker keeps for its neighbours' halos (:func:`neighbour_chunks_held`).
    neighbour_chunks: int = 0
    #: The workers the plan shares the work between.
    workers: int = 1
    #: Bytes per sample of the input and of the output.
    itemsize: int = FLOAT32_BYTES
    output_itemsize: int = FLOAT32_BYTES
    #: The smallest chunk along a free axis the planner considered.
    min_chunk: int = DEFAULT_MIN_CHUNK
    #: The largest block (voxels) the planner considered: the largest the operator's tasks
    #: were measured on inside a worker (``VolumeGeometry.max_block_voxels``); None: any.
    max_block_voxels: int | None = None
    #: The time model's seconds of overhead per Dask graph task.
    graph_task_seconds: float = DEFAULT_GRAPH_TASK_SECONDS
    #: A run's fixed seconds in ``predicted_seconds`` (:func:`plan_seconds`).
    run_fixed_seconds: float = 0.0
    #: What the bound does not know, one line each (a stale model, no in-worker calibration).
    warnings: tuple[str, ...] = ()
    #: Where ``footprint.baseline_bytes`` came from: ``"cluster"`` (measured on the workers
    #: of the run), ``"local"`` (measured once on this machine and saved) or ``"given"``.
    baseline_source: str = "given"
    #: The workers' first data cache the ranking's stride key used (``WorkerSpec.cache``);
    #: None: unknown, no stride key.
    cache: CacheGeometry | None = None
    #: Chunk lengths of split axes are multiples of these (``Operator.block_multiple``).
    block_multiple: tuple[int, ...] | None = None
    #: A fan-out pipeline's branches in the order its tasks run them (the order the
    #: predicted peak assumes: ``explorer.model.composed``); empty for anything else.
    branch_order: tuple[str, ...] = ()
    #: How a pipeline runs on Dask (``operators.pipeline.STRATEGIES``): ``"fused"`` (one
    #: ``map_overlap`` with the whole halo; a single operator's only form) or ``"staged"``
    #: (:func:`plan_staged_chunks`).
    strategy: str = "fused"
    #: A staged plan's stages at its chunks, one dict each (:func:`plan_staged_chunks`).
    stages: tuple[dict, ...] = ()
    #: What the planner weighed when it chose between strategies: per strategy, its plan's
    #: chunks, upper footprint and predicted seconds, or why it had none (``error``).
    considered: dict = field(default_factory=dict)
    #: The next plans in the ranking that the first key could not tell from this one (within
    #: :data:`explorer.plan.candidates.SECONDS_TIE_FRACTION` of the fastest predicted seconds with
    #: several slots, as many tasks with one), best first, at most
    #: :data:`explorer.plan.planner.TIED_REPORTED`: ``{"chunks", "n_tasks", "predicted_seconds"}``
    #: each.  The later keys chose among them (``explorer.plan.planner``); empty when nothing tied,
    #: for one chunk shape asked, and for a staged plan.
    tied: tuple[dict, ...] = ()

    @property
    def budget_bytes(self) -> int:
        """``floor(pause_fraction * limit_bytes)``: what the upper footprint must not exceed."""
        return math.floor(self.pause_fraction * self.limit_bytes)

    @property
    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask's chunks tuple: per axis ``(c, ..., c, remainder)``, as ``normalize_chunks`` gives."""
        return tuple(_axis_chunks(n, c) for n, c in zip(self.shape, self.chunks))

    def to_dict(self) -> dict:
        """JSON-ready: ints, floats, strings and lists only; every field (:meth:`from_dict`
        rebuilds the plan), with the derived ``dask_chunks``, ``budget_bytes`` and
        ``baseline_bytes`` beside them."""
        return {
            "operator": self.operator,
            "shape": list(self.shape),
            "chunks": list(self.chunks),
            "dask_chunks": [list(c) for c in self.dask_chunks],
            "block": list(self.block),
            "halo": list(self.halo),
            "whole_axes": list(self.whole_axes),
            "predicted_bytes": self.predicted_bytes,
            "upper_bytes": self.upper_bytes,
            "limit_bytes": self.limit_bytes,
            "pause_fraction": self.pause_fraction,
            "budget_bytes": self.budget_bytes,
            "confidence": self.confidence,
            "n_tasks": self.n_tasks,
            "threads_per_worker": self.threads_per_worker,
            "footprint": self.footprint.to_dict(),
            "n_candidates": self.n_candidates,
            "slots": self.slots,
            "predicted_seconds": self.predicted_seconds,
            "seconds_per_voxel": self.seconds_per_voxel,
            "task_spread": self.task_spread,
            "block_clocked": self.block_clocked,
            "first_touch": None if self.first_touch is None else self.first_touch.to_dict(),
            "read_unit": None if self.read_unit is None else list(self.read_unit),
            "neighbour_chunks": self.neighbour_chunks,
            "workers": self.workers,
            "baseline_bytes": self.footprint.baseline_bytes,
            "baseline_source": self.baseline_source,
            "cache": None if self.cache is None else dict(vars(self.cache)),
            "block_multiple": None if self.block_multiple is None else list(self.block_multiple),
            "graph_task_seconds": self.graph_task_seconds,
            "run_fixed_seconds": self.run_fixed_seconds,
            "branch_order": list(self.branch_order),
            "strategy": self.strategy,
            "stages": [dict(stage) for stage in self.stages],
            "considered": {k: dict(v) for k, v in self.considered.items()},
            "tied": [dict(t) for t in self.tied],
            "warnings": list(self.warnings),
            "itemsize": self.itemsize,
            "output_itemsize": self.output_itemsize,
            "min_chunk": self.min_chunk,
            "max_block_voxels": self.max_block_voxels,
            "task_clock": None if self.task_clock is None else self.task_clock.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ChunkPlan":
        """The plan :meth:`to_dict` (or its JSON) describes: ``from_dict(plan.to_dict()) == plan``.
        A key a plan of an earlier version did not write takes the field's default; the
        derived keys are not read."""
        from explorer.plan.footprint import WorkerFootprint
        from explorer.plan.time_model import FirstTouch, TaskClock

        ints = lambda v: tuple(int(x) for x in v)  # noqa: E731
        optional = lambda convert: lambda v: None if v is None else convert(v)  # noqa: E731
        convert = {
            "operator": optional(str), "shape": ints, "chunks": ints, "block": ints, "halo": ints,
            "whole_axes": ints, "predicted_bytes": int, "upper_bytes": int, "limit_bytes": int,
            "pause_fraction": float, "confidence": float, "n_tasks": int, "threads_per_worker": int,
            "footprint": WorkerFootprint.from_dict, "n_candidates": int, "slots": int,
            "predicted_seconds": optional(float), "seconds_per_voxel": optional(float),
            "task_spread": optional(float), "task_clock": optional(TaskClock.from_dict), "block_clocked": bool,
            "first_touch": optional(FirstTouch.from_dict), "read_unit": optional(ints),
            "neighbour_chunks": int, "workers": int, "itemsize": int, "output_itemsize": int, "min_chunk": int,
            "max_block_voxels": optional(int), "graph_task_seconds": float, "run_fixed_seconds": float,
            "warnings": tuple, "baseline_source": str, "cache": optional(lambda v: CacheGeometry(**v)),
            "block_multiple": optional(ints), "branch_order": tuple, "strategy": str,
            "stages": lambda v: tuple(dict(stage) for stage in v),
            "considered": lambda v: {k: dict(c) for k, c in v.items()},
            "tied": lambda v: tuple({"chunks": [int(x) for x in t["chunks"]], "n_tasks": int(t["n_tasks"]),
                                     "predicted_seconds": float(t["predicted_seconds"])} for t in v),
        }
        return cls(**{name: conv(data[name]) for name, conv in convert.items() if name in data})

    def summary(self) -> dict:
        """What :attr:`considered` keeps of a plan: its chunks, bound and predicted time."""
        return {"chunks": list(self.chunks), "n_tasks": self.n_tasks, "upper_bytes": self.upper_bytes,
                "predicted_seconds": self.predicted_seconds}
