"""A worker preload holding memory, as a user's cluster does (``dask worker --preload``):
``EXPLORER_TEST_PRELOAD_MIB`` MiB (default 300) of touched pages, kept for the worker's life."""

import os

import numpy as np

PRELOAD_MIB = int(os.environ.get("EXPLORER_TEST_PRELOAD_MIB", "300"))
BALLAST = np.ones(PRELOAD_MIB * 2**20, dtype=np.uint8)


def dask_setup(worker):  # distributed calls this on preload; the ballast above is already resident
    worker.explorer_test_ballast = BALLAST
