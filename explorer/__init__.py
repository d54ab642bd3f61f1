"""memory-explorer: learn an operator's peak memory, size Dask chunks safely.

The public surface::

    profile(operator, shape, ...)            -> Measurement    (explorer.measure.profiling)
    explore(operator, budget=..., ...)       -> ExploreResult  (explorer.exploration)
    load_model(operator, runs_dir=None)      -> MemoryModel    (explorer.model.load)
    recommend_chunks(operator, shape, memory_limit, ...) -> ChunkPlan (explorer.plan.recommend)
    run(operator, input, output, ...)        -> RunResult      (explorer.runner.daskrun; raises RunError)

``measure_worker_baseline(client, operator)`` -> ``WorkerBaseline`` measures an idle worker of
a user's cluster for ``recommend_chunks(baseline_bytes=...)``; ``prepare_workers(client)``
(``explorer.measure.workersetup``) gives a cluster's workers the allocator setting the profiles
were taken with (``docs/workers.md``); ``task_model`` and ``observe`` (``explorer.plan.task_model``,
``explorer.runner.live``) serve a user's own Dask code.  The errors a user catches:
``ModelNotFoundError``, ``ChunkPlanError``, ``RunError``.

``operator`` is a name, a spec, a ``module:attr`` reference or an ``operators.Operator``
(``operators.from_function`` makes one of a plain function).

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
    "ExploreResult": "explorer.exploration",
    "load_model": "explorer.model.load",
    "MemoryModel": "explorer.model.memory_model",
    "ModelNotFoundError": "explorer.model.memory_model",
    "recommend_chunks": "explorer.plan.recommend",
    "ChunkPlan": "explorer.plan.chunk_plan",
    "ChunkPlanError": "explorer.plan.chunk_plan",
    "run": "explorer.runner.daskrun",
    "RunResult": "explorer.runner.context",
    "RunError": "explorer.runner.context",
    "measure_worker_baseline": "explorer.measure.worker_baseline",
    "WorkerBaseline": "explorer.measure.worker_baseline",
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
