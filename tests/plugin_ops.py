"""Operators that misbehave on purpose, loaded by the profiling server through
``EXPLORER_PLUGINS=tests.plugin_ops``: real code paths, real child processes."""

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
    """Keeps ``EXPLORER_TEST_LEAK_MB`` MB (default 240) for good on its first real block
    (larger than the chunks of the baseline's warm-up graph, so measuring the baseline
    leaks nothing), then copies the input: a worker running it stays above its pause
    threshold, paused for good."""

    name = "test_leaks"

    def run(self, block):
        import os

        from explorer.measure.worker_baseline import WARM_UP_CHUNK_EDGE

        if block.size > WARM_UP_CHUNK_EDGE**3 and not LEAKED:
            LEAKED.append(np.ones(int(os.environ.get("EXPLORER_TEST_LEAK_MB", "240")) * 10**6, dtype=np.uint8))
        return block.astype(np.float32)
