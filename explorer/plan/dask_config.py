"""What the plans read from Dask's configuration: the fraction of its memory limit at which
a worker pauses (``distributed.worker.memory.pause``).
"""

from __future__ import annotations

import functools

__all__ = [
    "worker_pause_fraction",
]


#: Dask's documented default of ``distributed.worker.memory.pause`` if distributed is absent.
FALLBACK_PAUSE_FRACTION = 0.8


# --------------------------------------------------------------------------- the edge


@functools.lru_cache(maxsize=None)
def _distributed_memory_defaults() -> dict:
    """``distributed.worker.memory`` from distributed's packaged YAML, without importing it.

    ``import distributed.config`` imports the whole package (0.3-0.5 s measured);
    parsing its ``distributed.yaml`` takes about 3 ms and is cached.
    """
    import importlib.util
    import os

    import yaml

    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(list(spec.submodule_search_locations)[0], "distributed.yaml")
    try:
        with open(path) as f:
            loaded = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError:
        return {}
    return ((loaded or {}).get("distributed", {}).get("worker", {}).get("memory", {})) or {}


def _memory_setting(name: str):
    import dask.config

    value = dask.config.get(f"distributed.worker.memory.{name}", None)
    return _distributed_memory_defaults().get(name) if value is None else value


def worker_pause_fraction() -> float:
    """The fraction of its memory limit at which a Dask worker stops running tasks.

    ``distributed.worker.memory.pause`` from Dask's config (user files, ``DASK_*``
    variables, ``dask.config.set``), else distributed's packaged default (0.8), read
    without importing distributed.  If pausing is disabled (``False``), the terminate
    fraction (0.95 by default) is the ceiling; if that is disabled too, 1.0.
    """
    for name in ("pause", "terminate"):
        value = _memory_setting(name)
        if value is None:
            return FALLBACK_PAUSE_FRACTION
        if value is not False:
            return float(value)
    return 1.0
