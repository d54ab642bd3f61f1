"""memory-explorer: learn an operator's peak memory, size Dask chunks safely.

The public surface is four functions::

    profile(operator, shape, ...)            -> Measurement    (explorer.measure.profiling)
    explore(operator, budget=..., ...)       -> ExploreResult  (explorer.exploration)
    load_model(operator, runs_dir=None)      -> MemoryModel    (explorer.model.load)
    recommend_chunks(operator, shape, memory_limit, ...) -> ChunkPlan (explorer.plan.recommend)

and ``prepare_workers(client)`` (``explorer.measure.workersetup``): gives a cluster's workers the
allocator setting the profiles were taken with (``docs/workers.md``); ``task_model`` and
``observe`` (``explorer.plan.calibration``, ``explorer.runner.live``) serve a user's own Dask code.

They are imported lazily so that ``import explorer`` stays cheap: the
profiling child and ``recommend_chunks`` never import torch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("memory-explorer")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_PUBLIC = {
    "profile": "explorer.measure.profiling",
    "Measurement": "explorer.measure.profiling",
    "explore": "explorer.exploration",
    "load_model": "explorer.model.load",
    "MemoryModel": "explorer.model.memory_model",
    "recommend_chunks": "explorer.plan.recommend",
    "ChunkPlan": "explorer.plan.chunk_plan",
    "prepare_workers": "explorer.measure.workersetup",
    "task_model": "explorer.plan.task_model",
    "observe": "explorer.runner.live",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")


def __dir__():
    return __all__
