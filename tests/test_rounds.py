"""The Dask benchmarks' round orders and ratio intervals (harness/rounds.py): pure arithmetic."""

from collections import Counter

import numpy as np
import pytest

from harness.rounds import choosing_rounds, cycle_length, ratio_interval, round_orders


@pytest.mark.parametrize("key", ["", "gaussian,gst3d"])
@pytest.mark.parametrize("n_arms", [2, 3, 4, 5, 6])
def test_williams_orders_put_every_arm_after_every_other_equally_often(n_arms, key):
    cycle = 2 * n_arms if n_arms % 2 else n_arms
    rows = round_orders(n_arms, cycle, key=key)
    assert all(sorted(row) == list(range(n_arms)) for row in rows)
    follows = Counter((a, b) for row in rows for a, b in zip(row, row[1:]))
    assert len(follows) == n_arms * (n_arms - 1)
    assert len(set(follows.values())) == 1
    positions = Counter((arm, row.index(arm)) for row in rows for arm in row)
    assert len(set(positions.values())) == 1  # and every arm in every position equally often


def test_round_orders_run_whole_cycles_and_cycle_past_one_design():
    assert len(round_orders(4, 9)) == 12 and len(round_orders(4, 8)) == 8 and len(round_orders(3, 8)) == 12
    assert round_orders(4, 8)[4] == round_orders(4, 8)[0]


def test_which_arm_runs_first_is_drawn_per_key_and_repeatable():
    firsts = {round_orders(4, 4, key=f"pipeline {i}")[0][0] for i in range(40)}
    assert firsts == {0, 1, 2, 3}  # not always the arm listed first
    assert round_orders(4, 8, key="a,b") == round_orders(4, 8, key="a,b")
    assert round_orders(4, 8, key="a,b", seed=1) != round_orders(4, 8, key="a,b") or \
        round_orders(4, 8, key="a,b", seed=2) != round_orders(4, 8, key="a,b")


def test_ratio_interval_brackets_the_ratio_and_needs_three_rounds():
    pairs = [(1.1 * s, s) for s in (1.0, 1.2, 0.9, 1.1, 1.0)]
    text = ratio_interval(pairs)
    low, high = (float(x) for x in text.split(" ")[0].split("-"))
    assert low <= 1.1 <= high and high - low < 0.05
    assert "1.10" in text
    assert ratio_interval(pairs[:2]) == "-"
    assert ratio_interval([(1.0, None)] * 5) == "-"


def test_the_oracle_is_chosen_on_the_first_half_of_whole_cycles():
    assert choosing_rounds(16, cycle_length(4)) == 8
    assert choosing_rounds(8, cycle_length(4)) == 4
    assert choosing_rounds(18, cycle_length(3)) == 6  # three cycles of six: one chooses, two time
    assert choosing_rounds(4, cycle_length(4)) == 0  # one cycle: nothing to split


def test_an_oracle_timed_on_rounds_its_choice_never_saw_is_not_low_by_selection():
    """Ours and three candidates, all the same plan (equal run times, 20% noise): chosen and
    timed on the same rounds, the least median makes ours look 1.1x slower; timed on the
    other cycles, ours / oracle is 1 on average."""
    rng = np.random.default_rng(0)
    n_rounds, cycle = 16, cycle_length(4)
    k = choosing_rounds(n_rounds, cycle)
    same, split = [], []
    for _ in range(2000):
        seconds = rng.lognormal(0.0, 0.2, size=(4, n_rounds))  # row 0 ours, rows 1-3 the candidates
        medians = np.median(seconds, axis=1)
        same.append(medians[0] / medians[1:].min())
        chosen = 1 + int(np.argmin(np.median(seconds[1:, :k], axis=1)))
        split.append(np.median(seconds[0, k:]) / np.median(seconds[chosen, k:]))
    assert np.mean(np.log(same)) > 0.05
    assert abs(np.mean(np.log(split))) < 0.01
