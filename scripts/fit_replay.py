"""The ML-II fits of a few explore loops, recorded once and fitted again: the same numbers bit for bit,
and how much CPU they take.  For a change to the fitting code that must not change a fit.

    python scripts/fit_replay.py --record FILE     # run the loops, keep every fit's inputs and result
    python scripts/fit_replay.py --replay FILE     # fit them again with the code checked out here

The loops are the ask/tell core (``explorer.search.core.ExplorationCore``, budget 25) on two
truths no polynomial in the dims is, with 0.5% run noise (no process, no profile): gst3d's
declaration on bytes per voxel that grow with the volume, ``(150 + 30 log10 V) V + 8 MiB``,
and an operator that declares nothing of its axes on the same truth (every fit with and
without a regime boundary).  ``--replay`` prints how many fits came out identical (value and
every hyperparameter, ``==``), and the CPU seconds of the fits (``time.process_time``: less
sensitive than wall seconds to other work on the machine, not insensitive to it).  Record with
the code before a change, replay with the code after, and replay the old code too on the same
machine: compare CPU seconds side by side.
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np

import explorer.model.torch_fit as torch_fit
from explorer.search.core import ExplorationCore
from explorer.search.store import Record
from calibration_truths import sizedep as truth  # (150 + 30 log10 V) V + 8 MiB
from operators.base import Operator, register

MiB = 2**20
CV = 0.005
LIMIT = 1024 * MiB


@register
class _Undeclared(Operator):
    """An operator that declares nothing of its axes (every axis its own class)."""

    name = "fit_replay_undeclared"

    def run(self, block):
        return block


def loop(operator: str, seed: int, budget: int = 25) -> None:
    core = ExplorationCore(operator, memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=seed)
    rng = np.random.default_rng(seed)
    records: list[Record] = []
    while True:
        ask = core.ask(records, budget_left=budget - len(records))
        if ask.stopped_because:
            return
        for shape in ask.shapes:
            runs = truth(shape)[0] * (1 + CV * rng.standard_normal(2))
            records.append(Record(tuple(shape), float(runs.mean()), "ok", "profile", repeats=list(runs)))


def record(path: str) -> None:
    calls = []
    fit = torch_fit._fit_hyperparameters_locked

    def recorded(*args, **kwargs):
        result = fit(*args, **kwargs)
        calls.append((args, kwargs, result))
        return result

    torch_fit._fit_hyperparameters_locked = recorded
    for operator, seed in (("gst3d", 0), ("fit_replay_undeclared", 1)):
        loop(operator, seed)
        print(f"{operator} seed {seed}: {len(calls)} fits so far", flush=True)
    with open(path, "wb") as fh:
        pickle.dump(calls, fh)


def replay(path: str) -> None:
    with open(path, "rb") as fh:
        calls = pickle.load(fh)
    same, cpu, wall = 0, time.process_time(), time.perf_counter()
    for args, kwargs, (hyper, value) in calls:
        again, value_again = torch_fit._fit_hyperparameters_locked(*args, **kwargs)
        same += value_again == value and all(np.array_equal(np.asarray(hyper[k]), np.asarray(again[k])) for k in hyper)
    print(f"{same} of {len(calls)} fits identical bit for bit; {time.process_time() - cpu:.1f} s CPU, "
          f"{time.perf_counter() - wall:.1f} s wall")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="FILE")
    group.add_argument("--replay", metavar="FILE")
    args = parser.parse_args()
    record(args.record) if args.record else replay(args.replay)


if __name__ == "__main__":
    main()
