"""This machine's defaults: the worker memory chunks are sized for when none is given."""

from __future__ import annotations

import os

import psutil

#: Default target worker memory: what a LocalCluster worker gets here, at most 4 GiB.
DEFAULT_LIMIT_CAP = 4 * 2**30


def default_memory_limit() -> int:
    total = psutil.virtual_memory().total
    return int(min(DEFAULT_LIMIT_CAP, total / max(1, os.cpu_count() or 1)))
