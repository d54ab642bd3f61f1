"""How sure a ratio of median run times is, when two arms were timed in the same rounds.

Both Dask benchmarks (``bench_chunks.py``, ``bench_pipeline_runs.py``) time ours and the
oracle's candidates once per round, the order changing from round to round, and compare
medians.  On two cores shared by two workers, the client and the scheduler, one plan timed as
two arms can come out 1.2x apart over five rounds; a ratio is reported with its uncertainty.
"""

from __future__ import annotations

import zlib

import numpy as np


def cycle_length(n_arms: int) -> int:
    """Rounds in one cycle of :func:`round_orders`' design: ``n`` for even ``n``, ``2n`` for odd."""
    return 1 if n_arms <= 1 else (2 * n_arms if n_arms % 2 else n_arms)


def choosing_rounds(n_rounds: int, cycle: int) -> int:
    """How many of ``n_rounds`` (whole cycles of ``cycle``) choose the oracle: the first half of
    the cycles, rounded down; the rest time it and ours.  The least of several medians over the
    same rounds is low by selection (the winner's curse), so a candidate chosen on rounds that
    also time it looks faster than it runs; with one cycle there is nothing to split (0: chosen
    and timed on the same rounds, as the report then says)."""
    return (n_rounds // cycle // 2) * cycle


def round_orders(n_arms: int, n_rounds: int, key: str = "", seed: int = 0) -> list[list[int]]:
    """The order of the arms in each round: a Williams design over whole cycles, its arms
    relabelled at random.  ``n_rounds`` is rounded up to a whole number of cycles
    (:func:`cycle_length`).

    A run after another configuration is not timed as it is after its own: on this 2-core
    machine one plan ran 2.30 s (median of 7) after itself and 2.56 s (of 4) after a plan of
    18 staged chunks (``scripts/run_order.py``, ``scripts/results/run_order.md``).  An order
    rotated by one from round to round puts every arm after the same neighbour each time,
    which turns that into a bias: ours, when it ran the oracle's own plan, always came after
    another plan while the oracle came after ours (1.13x apart over nine rounds).  In a
    Williams design every arm follows every other equally often over a cycle of ``n`` rounds
    (``n`` even) or ``2n`` (``n`` odd): row ``r`` is ``(r + c_j) mod n`` with ``c = 0, 1,
    n-1, 2, n-2, ...``, and for odd ``n`` also each row reversed.

    Whole cycles, because part of a cycle breaks the balance: nine rounds of four arms put
    the arm at index 0 first in three rounds and the others in two.  Relabelled, because the
    design's index 0 also runs first of all, right after the screening, and the benchmarks
    list ours first: in every invocation with ours at index 0 and the oracle's own plan (four,
    2026-11-25/26), ours came out slower, 1.07-1.23x; relabelled (ours drew the fourth place),
    0.98x (``scripts/results/bench_pipeline_runs.md``, ``gaussian,gst3d``).  The permutation is drawn from
    ``(seed, crc32(key))`` (``key``: the pipeline or scenario), so a rerun repeats it and
    different pipelines get different ones; relabelling keeps every balance above."""
    c = [0]
    for j in range(1, n_arms):
        c.append((j + 1) // 2 if j % 2 else n_arms - j // 2)
    rows = [[(r + x) % n_arms for x in c] for r in range(n_arms)]
    if n_arms % 2:
        rows += [row[::-1] for row in rows]
    cycle = cycle_length(n_arms)
    n_rounds = -(-max(n_rounds, 1) // cycle) * cycle
    label = np.random.default_rng([seed, zlib.crc32(key.encode())]).permutation(n_arms)
    return [[int(label[x]) for x in rows[i % len(rows)]] for i in range(n_rounds)]


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
