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
