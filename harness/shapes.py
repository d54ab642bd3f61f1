"""Held-out block shapes for the benchmarks: a shape a plan can produce, of a given size.

``bench_explore.py`` and ``calibration.py`` draw their held-out shapes with
:func:`place_shape`, so that the two benchmarks' draws mean the same thing.
"""

from __future__ import annotations

import math

import numpy as np

from explorer.search import acquisition

MIN_DIM, MAX_DIM = 8, 2048  # the box of acquisition.candidate_shapes


def bisect_log(f, target, lo=math.log(1.0), hi=math.log(1e5), iterations=60):
    """``c`` with ``f(c) ~= target`` for ``f`` increasing in ``c``."""
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def place_shape(rng, whole_axes, size_of, target, attempts=500) -> tuple[int, int, int] | None:
    """A shape in the box ``[8, 2048]^3`` a plan can produce, with ``size_of(shape) ~= target``
    (``None`` after ``attempts`` draws that fell outside it): free axes ``log n = c + o`` with
    offsets ``o`` uniform in ``[-log 8 / 2, log 8 / 2]`` (any aspect up to
    ``MAX_BLOCK_ASPECT``), whole axes log-uniform in the box, ``c`` solved."""
    free = [a for a in range(3) if a not in set(whole_axes)]
    span = math.log(acquisition.MAX_BLOCK_ASPECT)
    for _ in range(attempts):
        offsets = rng.uniform(-span / 2, span / 2, len(free))
        whole = {a: math.exp(rng.uniform(math.log(MIN_DIM), math.log(MAX_DIM))) for a in whole_axes}

        def dims(c):
            d = np.empty(3)
            for a, o in zip(free, offsets):
                d[a] = math.exp(c + o)
            for a, n in whole.items():
                d[a] = n
            return d

        c = bisect_log(lambda c: float(size_of(dims(c))), target)
        shape = np.rint(dims(c)).astype(np.int64)
        if shape.min() >= MIN_DIM and shape.max() <= MAX_DIM and acquisition.chunkable_mask(shape, whole_axes)[0]:
            return tuple(int(n) for n in shape)
    return None
