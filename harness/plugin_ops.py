"""Operators that misbehave on purpose, loaded by the profiling server through
``EXPLORER_PLUGINS=harness.plugin_ops``: real code paths, real child processes."""

import ctypes
import time

import numpy as np

from operators import Operator, register

MIB = 2**20


@register
class Allocates(Operator):
    """Holds a 64 MiB temporary at once, then returns a copy of the input: a
    known peak of 64 MiB + the output, far above the RSS left at the end."""

    name = "test_allocates"
    temporary_bytes = 64 * MIB

    def run(self, block):
        spike = np.ones(self.temporary_bytes // 8)  # touched: resident
        total = float(spike.sum())
        del spike
        return block.astype(np.float32) + np.float32(total * 0)


@register
class Sleeps(Operator):
    name = "test_sleeps"

    def run(self, block):
        time.sleep(30)
        return block


@register
class Slow(Operator):
    """A copy that takes ``EXPLORER_TEST_SLOW_SECONDS`` (default 0.5) per block of more than
    8^3 samples: a run long enough to be interrupted while its tasks write."""

    name = "test_slow"

    def run(self, block):
        import os

        if block.size > 8**3:
            time.sleep(float(os.environ.get("EXPLORER_TEST_SLOW_SECONDS", "0.5")))
        return block.astype(np.float32)


@register
class Raises(Operator):
    name = "test_raises"

    def run(self, block):
        raise ValueError("bad block on purpose")


@register
class Crashes(Operator):
    name = "test_crashes"

    def run(self, block):
        ctypes.string_at(0)  # SIGSEGV
        return block


#: What ``test_leaks`` keeps for good, per process.
LEAKED: list = []


@register
class Leaks(Operator):
    """In a Dask worker with a memory limit: on its first real block (larger than the chunks of
    the baseline's warm-up graph, so measuring the baseline leaks nothing), keeps for good what
    puts the worker's process memory halfway between its pause and terminate thresholds, waits
    (at most a minute) until the worker has paused, then copies the input: the worker stays
    paused for good, with tasks left, and is never terminated.  Sized from the worker's own
    figures, not a fixed amount, so that neither its idle memory nor the memory monitor's pace
    decides between paused, terminated and finished."""

    name = "test_leaks"

    def run(self, block):
        from explorer.measure.worker_baseline import WARM_UP_CHUNK_EDGE

        if block.size > WARM_UP_CHUNK_EDGE**3 and not LEAKED:
            import dask
            import psutil
            from distributed import get_worker
            from distributed.core import Status

            worker = get_worker()
            limit = worker.memory_manager.memory_limit
            pause = dask.config.get("distributed.worker.memory.pause")
            terminate = dask.config.get("distributed.worker.memory.terminate")
            target = limit * (pause + terminate) / 2
            LEAKED.append(np.ones(max(int(target - psutil.Process().memory_info().rss), 0), dtype=np.uint8))
            deadline = time.monotonic() + 60
            while worker.status != Status.paused and time.monotonic() < deadline:
                time.sleep(0.01)
        return block.astype(np.float32)
