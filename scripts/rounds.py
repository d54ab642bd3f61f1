"""How sure a ratio of median run times is, when two arms were timed in the same rounds.

Both Dask benchmarks (``bench_chunks.py``, ``bench_pipeline_runs.py``) time ours and the
oracle's candidates once per round, the order changing from round to round, and compare
medians.  On two cores shared by two workers, the client and the scheduler, one plan timed as
two arms can come out 1.2x apart over five rounds; a ratio is reported with its uncertainty.
"""

from __future__ import annotations

import numpy as np


def ratio_interval(pairs, draws: int = 10_000, seed: int = 0) -> str:
    """``pairs``: ``(ours_seconds, other_seconds)`` of each round both ran in.  Text: the 95%
    percentile-bootstrap interval of ``median(ours) / median(other)`` resampling whole rounds
    (a round's two runs shared the machine's state), and the median of the rounds' own ratios;
    '-' with fewer than 3 rounds."""
    both = np.array([p for p in pairs if None not in p], dtype=float).reshape(-1, 2)
    if len(both) < 3:
        return "-"
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(both), size=(draws, len(both)))
    ratios = np.median(both[picks, 0], axis=1) / np.median(both[picks, 1], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    paired = float(np.median(both[:, 0] / both[:, 1]))
    return f"{low:.2f}-{high:.2f} (median of the {len(both)} rounds' own ratios {paired:.2f})"
