"""This machine's defaults: the worker memory chunks are sized for when none is given; its first
data cache's geometry, which the planner's stride key reads (``explorer.plan.candidates.stride_key``)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

#: Default target worker memory: what a LocalCluster worker gets here, at most 4 GiB.
DEFAULT_LIMIT_CAP = 4 * 2**30


def default_memory_limit() -> int:
    total = psutil.virtual_memory().total
    return int(min(DEFAULT_LIMIT_CAP, total / max(1, os.cpu_count() or 1)))


@dataclass(frozen=True)
class CacheGeometry:
    """A set-associative cache of ``sets`` sets of ``ways`` lines of ``line_bytes``: an address's
    set is ``(address // line_bytes) mod sets``."""

    line_bytes: int
    sets: int
    ways: int


@functools.lru_cache(maxsize=4)
def l1_data_cache(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> CacheGeometry | None:
    """This machine's level-1 data cache, from Linux's sysfs, or None where it does not say (read
    once per process: every plan asks)."""
    try:
        for index in sorted(root.glob("index*")):
            read = lambda name: (index / name).read_text().strip()  # noqa: E731
            if read("level") == "1" and read("type") in ("Data", "Unified"):
                return CacheGeometry(line_bytes=int(read("coherency_line_size")), sets=int(read("number_of_sets")),
                                     ways=int(read("ways_of_associativity")))
    except (OSError, ValueError):
        return None
    return None
