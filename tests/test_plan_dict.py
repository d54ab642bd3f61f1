"""A chunk plan's JSON keeps every field: ``ChunkPlan.from_dict`` rebuilds the plan from it,
for real plans of the golden fixture's saved models (fused, staged, with and without a clock)."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from explorer.core.units import parse_size
from explorer.plan.chunk_plan import ChunkPlan
from tests.test_golden import BASELINE, _runs

#: (operator, shape, memory limit, options): a single operator with a calibration (its task
#: clock), one without, a pipeline's fused and staged plans, several threads and workers.
CASES = [
    ("envelope", "400x300x500", "1GiB", {}),
    ("envelope", "800x600x1000", "2GiB", {"threads_per_worker": 2, "workers": 3}),
    ("gaussian", "300x300x300", "1GiB", {"confidence": 0.95}),
    ("gaussian,envelope", "400x300x500", "1GiB", {}),
    ("gaussian,envelope", "400x300x500", "1GiB", {"strategy": "staged"}),
]

#: Keys users read from ``explore chunks --json`` and a run's record: kept as they are.
PUBLISHED_KEYS = {
    "operator", "shape", "chunks", "dask_chunks", "block", "halo", "whole_axes", "predicted_bytes", "upper_bytes",
    "limit_bytes", "pause_fraction", "budget_bytes", "confidence", "n_tasks", "threads_per_worker", "footprint",
    "n_candidates", "slots", "predicted_seconds", "seconds_per_voxel", "task_spread", "block_clocked",
    "neighbour_chunks", "workers", "baseline_bytes", "baseline_source", "block_multiple", "graph_task_seconds",
    "run_fixed_seconds", "branch_order", "strategy", "stages", "considered", "warnings",
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from explorer.plan.recommend import recommend_chunks

    runs = _runs(tmp_path_factory.mktemp("golden"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # learnt in another environment: not what is tested here
        return [recommend_chunks(op, shape, limit, runs_dir=runs, baseline_bytes=parse_size(BASELINE), **options)
                for op, shape, limit, options in CASES]


def test_the_cases_cover_staged_plans_and_clocks(plans):
    assert {p.strategy for p in plans} == {"fused", "staged"}
    assert any(p.task_clock is not None for p in plans) and any(p.task_clock is None for p in plans)
    assert any(p.considered for p in plans)


def test_a_plan_is_rebuilt_from_its_dict_and_from_its_json(plans):
    for plan in plans:
        assert ChunkPlan.from_dict(plan.to_dict()) == plan
        assert ChunkPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_the_dict_keeps_every_field_and_every_published_key(plans):
    fields = {f.name for f in dataclasses.fields(ChunkPlan)}
    for plan in plans:
        keys = set(plan.to_dict())
        assert fields <= keys, sorted(fields - keys)
        assert PUBLISHED_KEYS <= keys, sorted(PUBLISHED_KEYS - keys)


def test_a_dict_without_the_later_keys_takes_the_defaults(plans):
    data = plans[0].to_dict()
    for key in ("itemsize", "output_itemsize", "min_chunk", "task_clock"):
        del data[key]
    old = ChunkPlan.from_dict(data)
    assert old == dataclasses.replace(plans[0], task_clock=None, itemsize=4, output_itemsize=4,
                                      min_chunk=ChunkPlan.__dataclass_fields__["min_chunk"].default)
