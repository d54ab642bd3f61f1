"""Pure tests of explorer.plan.chunk_plan: footprint arithmetic and chunk plans with an analytic predictor.

The predictor is analytic (peak = 240 B per block sample + 5 MB, bound = 1.05 x mean),
so every expected number below is computed by hand in the test, independently of
the module's code paths.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from explorer.core import units
from explorer.plan import candidates as plan_candidates
from explorer.plan import footprint as plan_footprint
from explorer.plan import grid
from explorer.plan import planner
from explorer.plan import staged
from explorer.plan import time_model
from explorer.plan.chunk_plan import ChunkPlan, ChunkPlanError
from explorer.plan.planner import plan_chunks
from explorer.plan.predictor import takes_keywords
from explorer.plan.spec import DEFAULT_MIN_CHUNK, TimeTerms, VolumeGeometry, WorkerSpec
from explorer.plan.footprint import worker_footprint
from explorer.plan.dask_config import worker_pause_fraction

MiB = 2**20
GiB = 2**30
BYTES_PER_SAMPLE = 240.0
FIXED_BYTES = 5e6
UPPER_FACTOR = 1.05
#: A worker baseline for these pure tests (in use it is measured: explorer.plan.recommend).
BASELINE = 150 * MiB


def analytic_peak(blocks):
    samples = np.prod(np.asarray(blocks, dtype=np.float64), axis=-1)
    mean = BYTES_PER_SAMPLE * samples + FIXED_BYTES
    return mean, UPPER_FACTOR * mean


class Recorder:
    """An analytic predictor that remembers how it was called."""

    def __init__(self):
        self.calls = []

    def __call__(self, blocks, confidence=0.99):
        self.calls.append((np.array(blocks, copy=True), confidence))
        return analytic_peak(blocks)


def predict(blocks, confidence=0.99):
    return analytic_peak(blocks)


def expected_total(block, threads=1, baseline=BASELINE, itemsize=4, output_itemsize=4, chunk=None, held_chunks=0,
                   windowed=False):
    """The footprint bound written out by hand: baseline + T (in + peak) + T in + T out + held chunks;
    a windowed task reads its block itself: baseline + T peak + T out."""
    samples = math.prod(block)
    peak = math.ceil(UPPER_FACTOR * (BYTES_PER_SAMPLE * samples + FIXED_BYTES))
    block_in = 0 if windowed else samples * itemsize
    running = threads * (block_in + peak)
    waiting = threads * block_in
    outputs = threads * samples * output_itemsize
    neighbours = held_chunks * math.prod(chunk) * itemsize if chunk is not None else 0
    return baseline + running + waiting + outputs + neighbours


def expected_held_chunks(shape, chunk, halo, workers=1):
    """Chunks kept for halos, by hand: two grid layers across the first overlapped axis."""
    counts = [-(-n // c) for n, c in zip(shape, chunk)]
    overlapped = [i for i, (k, h) in enumerate(zip(counts, halo)) if h > 0 and k > 1]
    if not overlapped:
        return 0
    alive = min(math.prod(counts), 2 * math.prod(counts[overlapped[0] + 1:]))
    return -(-alive // workers)


def hand_total(shape, chunk, halo, threads=1, workers=1, whole_axes=()):
    """``expected_total`` of the block a chunking implies, its tasks reading their blocks in
    windows (a plan's form): no input waits, no chunk is kept for a neighbour."""
    return expected_total(expected_block(shape, chunk, halo, whole_axes), threads, windowed=True)


def expected_block(shape, chunk, halo, whole_axes=()):
    """Largest task block by hand: N if whole or one chunk, c+h for two chunks, c+2h beyond."""
    block = []
    for axis, (n, c, h) in enumerate(zip(shape, chunk, halo)):
        count = -(-n // c)
        if axis in whole_axes or count == 1:
            block.append(n)
        elif count == 2:
            block.append(min(c + h, n))
        else:
            block.append(min(c + 2 * h, n))
    return tuple(block)


# --------------------------------------------------------------------------- footprint terms

BLOCK = (30, 40, 50)
SAMPLES = 30 * 40 * 50


def test_footprint_baseline_term():
    small = worker_footprint(BLOCK, 1000, baseline_bytes=100 * MiB)
    large = worker_footprint(BLOCK, 1000, baseline_bytes=300 * MiB)
    assert small.baseline_bytes == 100 * MiB
    assert large.total - small.total == 200 * MiB
    with pytest.raises(TypeError):  # no default: the baseline is measured where the work runs
        worker_footprint(BLOCK, 1000)


def test_footprint_task_term_is_threads_times_input_block_plus_peak():
    fp = worker_footprint(BLOCK, 12_345, threads_per_worker=3, itemsize=8, baseline_bytes=BASELINE)
    assert fp.input_block_bytes == SAMPLES * 8
    assert fp.task_peak_bytes == 12_345
    assert fp.task_bytes == 3 * (SAMPLES * 8 + 12_345)


def test_footprint_waiting_input_term_is_one_input_block_per_thread():
    fp = worker_footprint(BLOCK, 0, threads_per_worker=3, itemsize=8, output_itemsize=2, baseline_bytes=BASELINE)
    assert fp.waiting_input_bytes == 3 * SAMPLES * 8


def test_footprint_held_output_term_is_one_block_sized_output_per_thread():
    fp = worker_footprint(BLOCK, 0, threads_per_worker=3, itemsize=8, output_itemsize=2, baseline_bytes=BASELINE)
    assert fp.held_output_bytes == 3 * SAMPLES * 2
    assert fp.held_bytes == 3 * SAMPLES * (8 + 2)


def test_held_output_is_block_sized_because_dask_trim_returns_a_view():
    """The reason held outputs count prod(b), not prod(c): trim keeps the block's base alive."""
    import dask
    import dask.array as da

    x = da.ones((60, 40, 40), chunks=(20, 40, 40), dtype="f4")
    y = da.map_overlap(lambda b: b * 2, x, depth={0: 4, 1: 0, 2: 0}, boundary="none", trim=True, dtype="f4")
    graph = dict(y.__dask_optimize__(y.__dask_graph__(), y.__dask_keys__()))
    keys = [key for key in graph if key[0] == y.name]
    interior = dask.get(graph, keys)[1]
    base = interior
    while base.base is not None:
        base = base.base
    assert interior.shape == (20, 40, 40)
    assert base.shape == (28, 40, 40)  # c + 2h: the whole block output stays resident


def test_footprint_total_is_the_sum_of_its_terms():
    fp = worker_footprint(BLOCK, 777, threads_per_worker=2, baseline_bytes=10)
    assert fp.total == 10 + 2 * (SAMPLES * 4 + 777) + 2 * SAMPLES * 4 + 2 * SAMPLES * 4
    assert fp.total == fp.baseline_bytes + fp.task_bytes + fp.held_bytes


def test_footprint_peak_is_rounded_up_and_clipped_at_zero():
    assert worker_footprint(BLOCK, 10.2, baseline_bytes=BASELINE).task_peak_bytes == 11
    assert worker_footprint(BLOCK, -5.0, baseline_bytes=BASELINE).task_peak_bytes == 0


def test_footprint_vectorised_equals_scalar():
    blocks = np.array([[10, 20, 30], [40, 50, 60], [7, 8, 9]])
    peaks = np.array([1.0, 2e6, 3.5])
    many = worker_footprint(blocks, peaks, threads_per_worker=4, baseline_bytes=BASELINE)
    for i in range(3):
        one = worker_footprint(tuple(blocks[i]), peaks[i], threads_per_worker=4, baseline_bytes=BASELINE)
        assert isinstance(one.total, int)
        assert many.total[i] == one.total
        assert many.held_bytes[i] == one.held_bytes
    json.dumps(many.to_dict())
    json.dumps(one.to_dict())


# --------------------------------------------------------------------------- plans

SHAPE = (300, 240, 200)
HALO = (4, 4, 4)
LIMIT = 2 * GiB


def brute_force_fewest_tasks(shape, halo, whole_axes, budget, threads=1, min_chunk=16):
    """Every chunk count per axis, footprint by hand: the fewest tasks of any fitting chunking."""
    options = []
    for axis, (n, h) in enumerate(zip(shape, halo)):
        if axis in whole_axes:
            options.append([n])
            continue
        smallest = min(n, max(min_chunk, 2 * h + 1))
        chunks = {-(-n // k) for k in range(1, n // smallest + 1)}
        options.append([c for c in chunks if -(-n // c) == 1 or n - (-(-n // c) - 1) * c >= h])
    best = None
    for c0 in options[0]:
        for c1 in options[1]:
            for c2 in options[2]:
                chunk = (c0, c1, c2)
                if hand_total(shape, chunk, halo, threads, whole_axes=whole_axes) <= budget:
                    tasks = math.prod(-(-n // c) for n, c in zip(shape, chunk))
                    best = tasks if best is None else min(best, tasks)
    return best


def test_plan_fits_under_pause_and_is_no_smaller_than_needed():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE, pause_fraction=0.8))
    budget = math.floor(0.8 * LIMIT)
    assert plan.budget_bytes == budget
    block = expected_block(SHAPE, plan.chunks, HALO)
    assert plan.block == block
    assert plan.neighbour_chunks == 0  # windowed reads: no chunk is kept for a neighbour
    assert plan.upper_bytes == hand_total(SHAPE, plan.chunks, HALO) <= budget
    # No chunking with fewer tasks fits (checked by brute force with the formula by hand) ...
    assert plan.n_tasks == brute_force_fewest_tasks(SHAPE, HALO, (), budget)
    assert plan.n_tasks > 1
    # ... and lengthening any split axis to its next chunk count does not fit.
    for axis, (n, c) in enumerate(zip(SHAPE, plan.chunks)):
        count = -(-n // c)
        if count > 1:
            larger = list(plan.chunks)
            larger[axis] = -(-n // (count - 1))
            assert hand_total(SHAPE, larger, HALO) > budget


def test_plan_mean_and_bound_come_from_the_same_footprint():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE, threads_per_worker=2))
    mean, upper = analytic_peak([plan.block])
    kept = {"chunk_shapes": plan.chunks, "neighbour_chunks": plan.neighbour_chunks, "windowed": True}
    assert plan.predicted_bytes == worker_footprint(plan.block, mean[0], threads_per_worker=2, **kept, baseline_bytes=BASELINE).total
    assert plan.upper_bytes == plan.footprint.total == worker_footprint(plan.block, upper[0], threads_per_worker=2,
                                                                        **kept, baseline_bytes=BASELINE).total
    assert plan.predicted_bytes < plan.upper_bytes


def test_whole_axes_are_kept_whole():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO, whole_axes=(2,)), predict, WorkerSpec(1 * GiB, BASELINE))
    assert plan.chunks[2] == SHAPE[2]
    assert plan.dask_chunks[2] == (SHAPE[2],)
    assert plan.block[2] == SHAPE[2]  # no halo on a whole axis
    assert plan.n_tasks > 1  # the other axes had to be split


def test_halo_is_accounted_larger_halo_smaller_chunks():
    """A task's block is its chunk and the halo (one windowed read): the halo's samples are in
    its footprint, so where the halo-free plan's chunks no longer fit with the halo around
    them, the plan takes smaller chunks."""
    halo = (16, 16, 16)
    no_halo = plan_chunks(VolumeGeometry(SHAPE, (0, 0, 0)), predict, WorkerSpec(LIMIT, BASELINE))
    with_halo = plan_chunks(VolumeGeometry(SHAPE, halo), predict, WorkerSpec(LIMIT, BASELINE))
    assert hand_total(SHAPE, no_halo.chunks, (0, 0, 0)) <= math.floor(0.8 * LIMIT) \
        < hand_total(SHAPE, no_halo.chunks, halo)  # the scenario: the halo alone makes them too large
    assert no_halo.block == no_halo.chunks
    assert with_halo.block == expected_block(SHAPE, with_halo.chunks, halo)
    assert with_halo.upper_bytes == hand_total(SHAPE, with_halo.chunks, halo)
    assert math.prod(with_halo.block) > math.prod(with_halo.chunks)
    assert with_halo.n_tasks > no_halo.n_tasks
    assert math.prod(with_halo.chunks) < math.prod(no_halo.chunks)


def test_more_threads_give_smaller_chunks():
    one = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE, threads_per_worker=1))
    four = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE, threads_per_worker=4))
    assert four.n_tasks > one.n_tasks
    assert math.prod(four.chunks) < math.prod(one.chunks)
    assert four.upper_bytes == hand_total(SHAPE, four.chunks, HALO, threads=4) <= four.budget_bytes
    assert four.footprint.threads_per_worker == four.threads_per_worker == 4


def test_evenly_sized_chunks_preferred_over_compact_ones():
    # Two tasks fit, one does not.  Splitting axis 0 (121 -> 61 + 60) is uneven but
    # more compact (aspect 120/50 = 2.4) than splitting axis 1 (120 -> 60 + 60,
    # aspect 121/50 = 2.42); evenness ranks first, so axis 1 is split.
    shape = (121, 120, 50)
    one_task = expected_total(shape)
    two_tasks = expected_total((61, 120, 50))
    limit = int((one_task + two_tasks) / 2 / 0.8)
    plan = plan_chunks(VolumeGeometry(shape, (0, 0, 0)), predict, WorkerSpec(limit, BASELINE))
    assert plan.n_tasks == 2
    assert plan.chunks == (121, 60, 50)
    assert plan.dask_chunks == ((121,), (60, 60), (50,))


def test_compactness_counts_only_the_axes_with_a_halo():
    chunks = [(160, 160, 320), (80, 320, 320), (160, 160, 160)]
    np.testing.assert_allclose(plan_candidates.compactness_key(chunks, (8, 8, 8), ()), [2, 4, 1])
    np.testing.assert_allclose(plan_candidates.compactness_key(chunks, (5, 5, 5), (2,)), [1, 4, 1])
    np.testing.assert_allclose(plan_candidates.compactness_key(chunks, (1, 0, 4), ()), [2, 4, 1])
    for halo, whole in [((0, 0, 1), ()), ((0, 0, 0), (2,)), ((8, 0, 0), ()), (None, ())]:  # fewer than two: a tie
        np.testing.assert_array_equal(plan_candidates.compactness_key(chunks, halo, whole), [1, 1, 1])


def test_a_halo_along_the_samples_only_leaves_the_tie_to_the_contiguous_slab():
    """Four tasks of 80x320x320 and of 160x160x320 tie in the time model; with a halo along the
    samples only, where both are whole, the slab's longer later axes decide, where a halo on every
    axis takes the cube."""
    linear = lambda blocks, confidence=0.99: (12.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731
    terms = TimeTerms(seconds_per_voxel=2e-8, graph_task_seconds=0.005)

    def plan(halo):
        return plan_chunks(VolumeGeometry((320, 320, 320), halo), linear, WorkerSpec(700 * MiB, 100 * MiB, workers=2),
                           terms)

    slab, cube = plan((0, 0, 1)), plan((1, 1, 1))
    assert slab.chunks == (80, 320, 320) and [160, 160, 320] in [t["chunks"] for t in slab.tied]
    assert cube.chunks == (160, 160, 160)


def test_chunks_are_ceil_of_length_over_count_so_last_chunks_are_nearly_full():
    plan = plan_chunks(VolumeGeometry((1000, 999, 997), (2, 2, 2)), predict, WorkerSpec(3 * GiB, BASELINE))
    for n, c, chunks in zip(plan.shape, plan.chunks, plan.dask_chunks):
        assert c == -(-n // len(chunks))
        assert c - chunks[-1] < len(chunks)


@pytest.mark.parametrize(
    "shape, halo, whole_axes",
    [(SHAPE, HALO, ()), ((101, 97, 89), (5, 5, 5), ()), ((800, 600, 1000), (0, 0, 0), (2,)), ((64, 300, 90), (1, 1, 4), ())],
)
def test_dask_chunks_sum_to_shape_and_survive_map_overlap(shape, halo, whole_axes):
    import dask.array as da
    from dask.array.core import normalize_chunks

    plan = plan_chunks(VolumeGeometry(shape, halo, whole_axes=whole_axes, min_chunk=8), predict,
                       WorkerSpec(1 * GiB, BASELINE))
    assert tuple(sum(c) for c in plan.dask_chunks) == shape
    assert plan.dask_chunks == normalize_chunks(plan.chunks, shape)
    depth = {axis: 0 if axis in whole_axes else h for axis, h in enumerate(halo)}
    x = da.zeros(shape, chunks=plan.chunks, dtype="f4")
    y = da.map_overlap(lambda b: b, x, depth=depth, boundary="none", dtype="f4")
    assert y.chunks == plan.dask_chunks  # Dask did not rechunk: every chunk >= halo


@pytest.mark.parametrize("length, halo", [(100, 4), (1000, 5), (97, 8), (64, 1), (20, 0)])
def test_axis_candidates_are_never_rechunked_by_map_overlap(length, halo):
    from dask.array.overlap import ensure_minimum_chunksize

    candidates = plan_candidates.axis_chunk_candidates(length, halo, False, 8, 10**6)
    assert candidates[0] == length and list(candidates) == sorted(candidates, reverse=True)
    for c in candidates:
        chunks = grid._axis_chunks(length, int(c))
        if len(chunks) > 1:
            assert ensure_minimum_chunksize(halo, chunks) == chunks
    if (length, halo) == (100, 4):
        assert 33 not in candidates  # 33, 33, 33, 1: Dask would rechunk the 1
        assert {50, 34, 25, 20} <= set(candidates.tolist())
    assert plan_candidates.axis_chunk_candidates(length, halo, True, 8, 10**6).tolist() == [length]


def test_min_chunk_is_respected():
    plan = plan_chunks(VolumeGeometry((400, 400, 400), (3, 3, 3), min_chunk=50), predict,
                       WorkerSpec(700 * MiB, BASELINE))
    assert min(plan.chunks) >= 50


def test_too_small_limit_raises_a_one_line_message():
    limit = 195 * MiB
    # the scenario: the baseline fits under the pause threshold, the smallest chunks
    # (ceil(N / (N // 16)) per axis) do not
    assert BASELINE < math.floor(0.8 * limit) < hand_total(SHAPE, (17, 16, 17), HALO)
    with pytest.raises(ChunkPlanError) as error:
        plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(limit, BASELINE))
    message = str(error.value)
    assert "\n" not in message
    assert "195.00 MiB" in message and "raise the memory limit" in message
    assert "smallest worker footprint" in message
    assert "fewer threads" not in message
    assert isinstance(error.value, ValueError)
    with pytest.raises(ChunkPlanError, match="fewer threads per worker \\(now 4\\)"):
        plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(limit, BASELINE, threads_per_worker=4))


def test_confidence_and_int_blocks_are_passed_to_every_predict_call():
    recorder = Recorder()
    plan = plan_chunks(VolumeGeometry((800, 600, 1000), (5, 5, 5)), recorder, WorkerSpec(4 * GiB, BASELINE),
                       confidence=0.9)
    assert recorder.calls and all(confidence == 0.9 for _, confidence in recorder.calls)
    assert plan.confidence == 0.9
    for blocks, _ in recorder.calls:
        assert blocks.ndim == 2 and blocks.shape[1] == 3 and blocks.dtype == np.int64
        assert len(blocks) <= plan_candidates.PREDICT_BATCH_ROWS
    predicted = np.concatenate([blocks for blocks, _ in recorder.calls])
    assert plan.n_candidates == len(predicted) == len(np.unique(predicted, axis=0))  # no row twice
    assert plan.n_candidates <= plan_candidates.MAX_CANDIDATES


def test_probe_pruning_gives_the_exhaustive_answer(monkeypatch):
    shape, halo = (800, 600, 1000), (5, 5, 5)
    pruned = plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(1.5 * GiB, BASELINE))
    monkeypatch.setattr(plan_candidates, "PROBE_VALUES_PER_AXIS", 10**6)  # the probe is every candidate
    exhaustive = plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(1.5 * GiB, BASELINE))
    assert pruned.chunks == exhaustive.chunks
    assert pruned.n_candidates < exhaustive.n_candidates


def test_non_finite_predictions_never_fit():
    def nan_for_large(blocks, confidence=0.99):
        mean, upper = analytic_peak(blocks)
        large = np.prod(blocks, axis=1) > 2_000_000
        return np.where(large, np.nan, mean), np.where(large, np.inf, upper)

    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), nan_for_large, WorkerSpec(8 * GiB, BASELINE))
    assert math.prod(plan.block) <= 2_000_000
    assert plan.upper_bytes == hand_total(SHAPE, plan.chunks, HALO)


def test_an_underpredicted_upper_bound_is_lifted_to_the_mean():
    def inverted(blocks, confidence=0.99):
        mean, upper = analytic_peak(blocks)
        return upper, mean  # "upper" below mean: the plan must use the larger

    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), inverted, WorkerSpec(LIMIT, BASELINE))
    assert plan.upper_bytes == hand_total(SHAPE, plan.chunks, HALO)


def test_plan_to_dict_is_json():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE), operator="gst3d")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["chunks"] == list(plan.chunks)
    assert data["dask_chunks"] == [list(c) for c in plan.dask_chunks]
    assert data["footprint"]["total"] == plan.upper_bytes
    assert data["operator"] == "gst3d"


# --------------------------------------------------------------------------- pause fraction


def test_pause_fraction_follows_dask_config():
    import dask

    with dask.config.set({"distributed.worker.memory.pause": 0.65}):
        assert worker_pause_fraction() == 0.65
    with dask.config.set({"distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": 0.9}):
        assert worker_pause_fraction() == 0.9


@pytest.mark.integration
def test_pause_fraction_default_is_read_without_importing_distributed():
    code = (
        "import sys, time; t = time.perf_counter(); import explorer.plan.dask_config as c; "
        "t1 = time.perf_counter(); f = c.worker_pause_fraction(); t2 = time.perf_counter(); "
        "print(f, 'distributed' in sys.modules, round((t1 - t) * 1e3, 1), round((t2 - t1) * 1e3, 1))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DASK_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    fraction, imported, import_ms, pause_ms = out.stdout.split()
    print(f"\nimport explorer.plan.dask_config: {import_ms} ms; first worker_pause_fraction(): {pause_ms} ms")
    assert float(fraction) == 0.8
    assert imported == "False"


# --------------------------------------------------------------------------- the time model


def test_plan_seconds_is_grahams_bound_with_per_task_overhead():
    g, s = 0.002, 1e-7
    chunk = g * 13 + s * 1e6  # one chunk: 13 graph tasks and a 1e6-voxel block
    one_slot = time_model.plan_seconds(8, 1e6, 1, tasks_per_chunk=13, seconds_per_voxel=s, graph_task_seconds=g)
    assert one_slot == pytest.approx(8 * chunk)
    # 8 chunks on 2 slots: 4 each, plus half a chunk of tail (Graham: n/C + 1 - 1/C)
    two = time_model.plan_seconds(8, 1e6, 2, tasks_per_chunk=13, seconds_per_voxel=s, graph_task_seconds=g)
    assert two == pytest.approx(4.5 * chunk)
    # arrays broadcast, one value per candidate
    many = time_model.plan_seconds(np.array([1, 2, 4]), np.array([4e6, 2e6, 1e6]), 2, seconds_per_voxel=s,
                                 graph_task_seconds=0.0)
    assert many == pytest.approx([1.0 * 0.4, 1.5 * 0.2, 2.5 * 0.1])
    with pytest.raises(ValueError):
        time_model.plan_seconds(1, 1, 0)
    with pytest.raises(ValueError):
        time_model.plan_seconds(1, 1, 1, seconds_per_voxel=-1.0)


@pytest.mark.parametrize("name,shape,chunks", [
    ("envelope", (96, 96, 64), (48, 48, 64)),
    ("envelope", (96, 96, 64), (32, 32, 64)),
    ("gst3d", (96, 96, 96), (48, 48, 48)),
    ("gst3d", (96, 96, 96), (32, 32, 32)),
    ("semblance", (96, 96, 96), (32, 48, 96)),
    ("first_derivative", (64, 64, 96), (64, 64, 32)),
])
def test_graph_tasks_per_chunk_counts_the_operators_dask_graphs(name, shape, chunks):
    """The count the time model charges per chunk against Dask's own graph of the operator
    (plus the store task a run adds per chunk)."""
    import dask.array as da

    import operators

    op = operators.get(name)
    x = da.zeros(shape, chunks=chunks, dtype="float32")
    y = op.dask(x)
    n_chunks = math.prod(len(c) for c in x.chunks)
    per_chunk = len(dict(y.__dask_graph__())) / n_chunks + 1
    counts = [len(c) for c in x.chunks]
    assert time_model.graph_tasks_per_chunk(counts, op.halo) == pytest.approx(per_chunk, abs=1.0)


def test_run_seconds_per_voxel_adds_the_runs_io_to_the_profiled_speed():
    assert time_model.run_seconds_per_voxel(None) == time_model.DEFAULT_SECONDS_PER_VOXEL
    assert time_model.run_seconds_per_voxel(float("nan")) == time_model.DEFAULT_SECONDS_PER_VOXEL
    assert time_model.run_seconds_per_voxel(3e-7) == pytest.approx(3e-7 + time_model.RUN_IO_SECONDS_PER_VOXEL)


def test_with_several_slots_heavy_work_gets_more_chunks_and_light_work_fewer():
    """Memory allows one chunk.  On one slot the plan takes it; on two, a heavy operator
    is split into several chunks per slot so the tail is short, while work too light to
    pay for the per-task overhead stays in fewer chunks."""
    shape, halo = (256, 256, 256), (5, 5, 5)
    predict = lambda blocks, confidence=0.99: (240.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731

    def plan(workers, seconds_per_voxel):
        return plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(64 * GiB, BASELINE, workers=workers),
                           TimeTerms(seconds_per_voxel=seconds_per_voxel))

    alone = plan(workers=1, seconds_per_voxel=1e-6)
    heavy = plan(workers=2, seconds_per_voxel=1e-6)
    light = plan(workers=2, seconds_per_voxel=1e-9)
    assert alone.n_tasks == 1
    assert heavy.n_tasks >= 4  # at least two chunks per slot
    assert light.n_tasks < heavy.n_tasks
    for p in (heavy, light):
        assert p.slots == 2
        # a task reads its block in one window: read, operator, store per chunk, no halo pieces
        expected = time_model.plan_seconds(p.n_tasks, math.prod(p.block), 2, tasks_per_chunk=3.0,
                                         seconds_per_voxel=p.seconds_per_voxel)
        assert p.predicted_seconds == pytest.approx(float(expected))
        assert p.to_dict()["predicted_seconds"] == p.predicted_seconds
        assert plan(workers=2, seconds_per_voxel=p.seconds_per_voxel).chunks == p.chunks  # deterministic


def test_the_fastest_plan_is_the_exhaustive_optimum():
    """With several slots, the probe's pruning never changes the answer: a brute force
    over the same candidates, one at a time, finds nothing that fits and is predicted
    faster beyond the tie fraction.  (One slot: the fewest-tasks brute force above.)"""
    shape, halo, limit = (300, 200, 250), (5, 5, 5), 2 * GiB
    budget = math.floor(0.8 * limit)
    cands = [plan_candidates.axis_chunk_candidates(n, h, False, DEFAULT_MIN_CHUNK, 10**6)
             for n, h in zip(shape, halo)]
    for workers, s in ((2, 1e-7), (2, 4e-7), (4, 1e-7)):
        plan = plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(limit, BASELINE, workers=workers),
                           TimeTerms(seconds_per_voxel=s))
        assert plan.upper_bytes <= budget
        best = math.inf
        for chunk in itertools.product(*cands):
            counts = [-(-n // c) for n, c in zip(shape, chunk)]
            block = expected_block(shape, chunk, halo)
            if expected_total(block, windowed=True) > budget:  # windowed reads: no input waits, no chunk kept
                continue
            t = float(time_model.plan_seconds(math.prod(counts), math.prod(block), workers,
                                            tasks_per_chunk=3.0,  # read, operator, store: no halo pieces
                                            seconds_per_voxel=s))
            best = min(best, t)
        assert best < math.inf
        assert best <= plan.predicted_seconds <= best * (1 + plan_candidates.SECONDS_TIE_FRACTION) + 1e-12


def test_footprint_neighbour_chunk_term():
    """Chunks kept for halos: neighbour_chunks x prod(chunk) x itemsize, in held_bytes and total."""
    plain = worker_footprint(BLOCK, 1000, baseline_bytes=BASELINE)
    kept = worker_footprint(BLOCK, 1000, chunk_shapes=(20, 30, 40), neighbour_chunks=3, baseline_bytes=BASELINE)
    assert plain.neighbour_chunk_bytes == 0
    assert kept.neighbour_chunk_bytes == 3 * 20 * 30 * 40 * 4
    assert kept.held_bytes - plain.held_bytes == kept.total - plain.total == kept.neighbour_chunk_bytes
    many = worker_footprint([BLOCK, BLOCK], [1000, 1000], chunk_shapes=[(20, 30, 40), (10, 10, 10)],
                            neighbour_chunks=[3, 0], baseline_bytes=BASELINE)
    assert list(many.neighbour_chunk_bytes) == [3 * 20 * 30 * 40 * 4, 0]


def test_footprint_store_chunk_term_is_one_store_chunk_per_thread_where_a_chunk_is_partial():
    """A chunk the volume does not fill costs its task one whole store chunk (the output's
    itemsize), per running thread, in the task term and the total; none without ``partial``."""
    partial = plan_footprint.partial_chunks
    assert list(partial((320, 320, 320), [(160, 160, 320), (160, 161, 320), (160, 107, 320), (320, 320, 320)])) \
        == [False, True, True, False]
    whole = worker_footprint(BLOCK, 1000, threads_per_worker=2, chunk_shapes=(20, 30, 40), output_itemsize=2,
                             baseline_bytes=BASELINE)
    edge = worker_footprint(BLOCK, 1000, threads_per_worker=2, chunk_shapes=(20, 30, 40), output_itemsize=2,
                            partial=True, baseline_bytes=BASELINE)
    assert whole.store_chunk_bytes == 0 and edge.store_chunk_bytes == 20 * 30 * 40 * 2
    assert edge.task_bytes - whole.task_bytes == edge.total - whole.total == 2 * 20 * 30 * 40 * 2
    assert worker_footprint(BLOCK, 1000, partial=True, baseline_bytes=BASELINE).store_chunk_bytes == 0
    assert plan_footprint.WorkerFootprint.from_dict(edge.to_dict()).store_chunk_bytes == edge.store_chunk_bytes
    many = worker_footprint([BLOCK, BLOCK], [1000, 1000], chunk_shapes=[(20, 30, 40), (10, 10, 10)],
                            partial=[True, False], baseline_bytes=BASELINE)
    assert list(many.store_chunk_bytes) == [20 * 30 * 40 * 4, 0]


@pytest.mark.unit
def test_one_tasks_store_chunk_is_the_footprints_term_where_its_own_chunk_is_short():
    term = plan_footprint.task_store_chunk_bytes
    # 320 in chunks of 107: 107, 107, 106; the third is short, the others whole
    assert term((320, 320, 320), (107, 160, 320), (2, 0, 0)) == 107 * 160 * 320 * 4
    assert term((320, 320, 320), (107, 160, 320), (1, 1, 0)) == 0
    assert term((320, 320, 320), (160, 160, 160), (1, 1, 1)) == 0  # chunks that divide the volume
    assert term((10, 12, 14), (4, 5, 14), (1, 2, 0), output_itemsize=8) == 4 * 5 * 14 * 8
    # one task of the plan's partial chunks carries the term the plan's footprint adds to each
    plan = plan_footprint.worker_footprint((107, 160, 320), 0, baseline_bytes=0, windowed=True,
                                           chunk_shapes=(107, 160, 320),
                                           partial=plan_footprint.partial_chunks((320, 320, 320), (107, 160, 320)))
    assert plan.store_chunk_bytes == term((320, 320, 320), (107, 160, 320), (2, 1, 0))


def test_zarr_merges_a_chunk_the_array_does_not_fill_into_a_whole_store_chunk(tmp_path):
    """The fact the store-chunk term stands on: writing a chunk at the array's end, shorter than
    the store's chunk, allocates a whole store chunk beside it; a whole chunk is written as it is
    (zarr's own allocations, traced)."""
    import tracemalloc

    import zarr

    z = zarr.create_array(str(tmp_path / "out.zarr"), shape=(64, 64, 64), chunks=(32, 34, 64), dtype="float32")
    chunk_bytes = 32 * 34 * 64 * 4

    def traced(selection, value):
        tracemalloc.start()
        tracemalloc.reset_peak()
        z[selection] = value
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    whole = traced((slice(0, 32), slice(0, 34)), np.ones((32, 34, 64), dtype="float32"))
    edge = traced((slice(0, 32), slice(34, 64)), np.ones((32, 30, 64), dtype="float32"))
    # zarr's encode buffer is about one chunk either way (1.08-1.10 traced); the edge adds one more
    assert whole < 1.5 * chunk_bytes
    assert edge - whole >= 0.95 * chunk_bytes


def test_the_plan_of_a_chunking_that_does_not_divide_the_volume_counts_its_store_chunk():
    """The planner's bound (and ``plan_fits``) carry the store chunk exactly when a chunk is partial."""
    from explorer.plan.planner import plan_fits

    geometry, spec = VolumeGeometry((320, 320, 320), (4, 4, 4)), WorkerSpec(8 * GiB, BASELINE, workers=2)
    whole = plan_chunks(geometry, predict, spec, chunks=(160, 160, 320))
    edge = plan_chunks(geometry, predict, spec, chunks=(160, 161, 320))
    assert whole.footprint.store_chunk_bytes == 0
    assert edge.footprint.store_chunk_bytes == 160 * 161 * 320 * 4
    assert edge.upper_bytes == edge.footprint.total and plan_fits(edge, predict) and plan_fits(whole, predict)
    # a budget between the footprint without the store chunk and with it: it does not fit
    between = edge.upper_bytes - edge.footprint.store_chunk_bytes // 2
    tight = dataclasses.replace(edge, limit_bytes=math.ceil(between / edge.pause_fraction))
    assert tight.budget_bytes < edge.upper_bytes and not plan_fits(tight, predict)


def test_neighbour_chunks_held_are_two_grid_layers_across_the_first_overlapped_axis():
    held = plan_footprint.neighbour_chunks_held
    assert held([2, 2, 2], (8, 8, 8), 2) == 4  # every chunk borders every other: all 8, on 2 workers
    assert held([3, 3, 3], (1, 1, 4), 2) == 9  # two layers of 3 x 3, on 2 workers
    assert held([3, 3, 3], (1, 1, 4), 1) == 18
    assert held([4, 4, 1], (0, 0, 0), 2) == 0  # no halo: nothing is kept
    assert held([1, 1, 5], (5, 5, 5), 1) == 2  # only the last axis is split: a chunk and the next
    assert held([4, 4, 4], (0, 0, 1), 1) == 2  # a halo on the fastest axis alone
    assert held([4, 1, 1], (5, 5, 5), 2) == 1
    assert list(held([[2, 2, 2], [6, 6, 6], [4, 2, 1]], (0, 0, 1), 2)) == [1, 1, 0]
    with pytest.raises(ValueError):
        held([2, 2, 2], (1, 1, 1), 0)


# --------------------------------------------------------------------------- the baseline, the stages, re-planning


def test_a_baseline_at_the_pause_threshold_is_one_line_with_its_numbers():
    with pytest.raises(ChunkPlanError) as err:
        plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(1 * GiB, 900 * MiB, pause_fraction=0.8))
    message = str(err.value)
    assert "\n" not in message
    assert "baseline" in message and "900.00 MiB" in message and "819.20 MiB" in message
    assert "raise the memory limit" in message


def test_a_large_baseline_leaves_less_room_and_the_error_names_it():
    roomy = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE))
    crowded = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE + 700 * MiB))
    assert crowded.n_tasks > roomy.n_tasks
    assert crowded.upper_bytes <= crowded.budget_bytes
    assert crowded.footprint.baseline_bytes == BASELINE + 700 * MiB
    with pytest.raises(ChunkPlanError, match="of which the workers' baseline is 1.09 GiB"):
        plan_chunks(VolumeGeometry(SHAPE, HALO, min_chunk=150), predict, WorkerSpec(LIMIT, BASELINE + 970 * MiB))


def test_the_three_stages_compose_into_the_plan():
    budget = math.floor(0.8 * LIMIT)
    footprint = functools.partial(worker_footprint, baseline_bytes=BASELINE, windowed=True)  # a plan's tasks read windows
    candidates = plan_candidates.chunk_candidates(
        VolumeGeometry(SHAPE, HALO, min_chunk=16), footprint=footprint, budget=budget, slots=2,
        time_terms=TimeTerms(seconds_per_voxel=1e-7, graph_task_seconds=0.002))
    assert len(candidates.chunks) == len(candidates.blocks) == len(candidates.seconds) > 100
    assert np.all(candidates.upper_total == np.iinfo(np.int64).max)  # nothing predicted yet
    n = plan_candidates.evaluate_candidates(candidates, predict, confidence=0.99, footprint=footprint, budget=budget,
                                     slots=2)
    assert 0 < n < len(candidates.chunks)  # the probe pass pruned rows
    index = plan_candidates.rank_candidates(candidates, SHAPE, (), budget=budget, slots=2, halo=HALO)
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE, workers=2))
    assert tuple(candidates.chunks[index]) == plan.chunks
    assert candidates.upper_total[index] == plan.upper_bytes <= budget


def test_schedule_waves_is_grahams_bound_without_clocks():
    assert time_model.schedule_waves(8, 1) == 8
    assert time_model.schedule_waves(8, 2) == pytest.approx(4.5)
    np.testing.assert_allclose(time_model.schedule_waves(np.array([1, 3]), 4), [1.0, 1.5])
    with pytest.raises(ValueError):
        time_model.schedule_waves(3, 0)


def test_expected_max_of_normals():
    rng = np.random.default_rng(0)
    assert time_model.expected_max_normal(1) == 0.0
    assert time_model.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    for m in (3, 8):
        sampled = rng.standard_normal((200_000, m)).max(axis=1).mean()
        assert time_model.expected_max_normal(m) == pytest.approx(sampled, abs=0.01)


def test_near_equal_tasks_pay_no_tail_on_a_multiple_of_the_slots():
    """Equal tasks (spread 0): ``ceil(n / C)`` waves, no idle tail when ``C`` divides ``n``
    (Graham charges 8 tasks on 2 slots 4.5).  With a spread, the mean makespan of greedy
    list scheduling, simulated with normal task times, is what the formula says when the
    waves are full; a partial last wave goes to the slots that finished first, so there
    the simulation is below the formula, within its spread term of ``ceil(n / C)``."""
    np.testing.assert_allclose(time_model.schedule_waves(np.array([1, 2, 3, 8, 9]), 2, 0.0), [1, 1, 2, 4, 5])
    rng = np.random.default_rng(1)
    for n, slots, sigma in ((8, 2, 0.1), (2, 2, 0.1), (1, 2, 0.1), (12, 4, 0.05), (5, 2, 0.1), (10, 4, 0.1)):
        makespans = []
        for _ in range(4000):
            finish = np.zeros(slots)
            for t in 1.0 + sigma * rng.standard_normal(n):
                finish[np.argmin(finish)] += t  # the free slot takes the next task
            makespans.append(finish.max())
        simulated, formula = np.mean(makespans), time_model.schedule_waves(n, slots, sigma)
        if n % slots == 0 or n < slots:
            assert formula == pytest.approx(simulated, rel=0.01)
        else:
            waves = math.ceil(n / slots)
            assert waves - (formula - waves) < simulated < formula
    with pytest.raises(ValueError):
        time_model.schedule_waves(3, 2, -0.1)


def test_tasks_of_several_units_are_balanced_unit_by_unit_but_never_beat_their_own_chain():
    """A staged chunk is ``u`` stage tasks the scheduler hands out one by one: ``ceil(n u / C)``
    waves of units, ``/ u`` in chunk times, at least one chunk time (its own chain)."""
    equal = time_model.schedule_waves(np.array([1, 2, 3, 9, 4]), 2, 0.0, units=3)
    np.testing.assert_allclose(equal, [1.0, 1.0, 5 / 3, 14 / 3, 2.0])
    np.testing.assert_allclose(time_model.schedule_waves(9, 2, 0.0, units=2), 4.5)  # a whole chunk's tail: 5
    np.testing.assert_allclose(time_model.schedule_waves(9, 2, 0.0, units=1), 5.0)
    k = 18 // 2
    spread = time_model.schedule_waves(9, 2, 0.3, units=2)
    assert spread == pytest.approx((k + 0.3 * math.sqrt(k) * time_model.expected_max_normal(2)) / 2)
    assert time_model.schedule_waves(8, 2, None, units=3) == time_model.schedule_waves(8, 2)  # Graham: its chain
    with pytest.raises(ValueError):
        time_model.schedule_waves(3, 2, 0.1, units=0)


def test_task_clock_interpolates_in_log_volume_and_holds_its_ends():
    clock = time_model.TaskClock(volumes=(1e3, 1e5), seconds_per_voxel=(3e-7, 1e-7),
                               spread_volumes=(1e3, 1e5), spreads=(0.4, 0.1))
    np.testing.assert_allclose(clock.seconds_per_voxel_at([1e2, 1e3, 1e4, 1e5, 1e7]), [3e-7, 3e-7, 2e-7, 1e-7, 1e-7])
    np.testing.assert_allclose(clock.spread_at([1e4]), [0.25])
    assert time_model.TaskClock(volumes=(1e3,), seconds_per_voxel=(1e-7,)).spread_at(1e4) is None
    assert time_model.TaskClock.from_dict(clock.to_dict()) == clock
    with pytest.raises(ValueError):
        time_model.TaskClock(volumes=(), seconds_per_voxel=())
    with pytest.raises(ValueError):
        time_model.TaskClock(volumes=(1e3,), seconds_per_voxel=(-1.0,))


def test_a_plan_pays_what_its_block_costs_per_voxel():
    """Two slots, 256^3 with a halo of 5: by one cost per voxel the two largest chunks are
    the fastest plan (least halo, fewest tasks, no tail for equal tasks).  When the clocks
    say blocks past 4e6 voxels cost 40% more per voxel, the plan takes smaller chunks, and
    its predicted seconds are the time model's at its own block."""
    shape, halo = (256, 256, 256), (5, 5, 5)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731

    def plan(clock):
        return plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(64 * GiB, BASELINE, workers=2),
                           TimeTerms(graph_task_seconds=0.002, task_clock=clock))

    flat = plan(time_model.TaskClock(volumes=(1e6, 1e8), seconds_per_voxel=(2e-7, 2e-7),
                                   spread_volumes=(1e6,), spreads=(0.02,)))
    steep = plan(time_model.TaskClock(volumes=(1e6, 4e6, 1e7), seconds_per_voxel=(2e-7, 2e-7, 2.8e-7),
                                    spread_volumes=(1e6,), spreads=(0.02,)))
    assert flat.n_tasks == 2
    assert math.prod(steep.block) <= 4e6 < math.prod(flat.block)
    assert steep.seconds_per_voxel == pytest.approx(2e-7) and steep.task_spread == pytest.approx(0.02)
    expected = time_model.plan_seconds(steep.n_tasks, math.prod(steep.block), 2, seconds_per_voxel=2e-7,
                                     tasks_per_chunk=3.0,  # read, operator, store: a windowed read, no halo pieces
                                     graph_task_seconds=0.002, spread=0.02)
    assert steep.predicted_seconds == pytest.approx(float(expected))
    assert steep.to_dict()["task_spread"] == steep.task_spread


def test_a_slots_first_task_pays_for_its_fresh_pages_once_and_larger_blocks_pay_more():
    """Two slots, 256^3, halo 5.  By the clock alone (2e-7 s/voxel everywhere) the two largest
    chunks are the fastest plan.  When each task touches 400 bytes per voxel and the workers
    measured 2 ns per byte of fresh pages (about 2 ms per MiB, this machine's), a slot's first
    task pays 0.8 us per voxel of its block once: the plan takes smaller blocks, its predicted
    seconds are the time model's with that term, and the plan keeps it (a replan uses it).  The
    warm bytes the workers found are not charged."""
    shape, halo = (256, 256, 256), (5, 5, 5)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731
    clock = time_model.TaskClock(volumes=(1e6, 1e8), seconds_per_voxel=(2e-7, 2e-7), spread_volumes=(1e6,),
                                 spreads=(0.02,), task_bytes_per_voxel=(400.0, 400.0))
    fresh_pages = time_model.FirstTouch(seconds_per_byte=2e-9)

    def plan(first_touch):
        return plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(64 * GiB, BASELINE, workers=2),
                           TimeTerms(graph_task_seconds=0.002, task_clock=clock, first_touch=first_touch))

    unmeasured, fresh = plan(None), plan(fresh_pages)
    assert unmeasured.n_tasks == 2 and unmeasured.first_touch is None
    assert math.prod(fresh.block) < math.prod(unmeasured.block) and fresh.first_touch == fresh_pages
    expected = time_model.plan_seconds(fresh.n_tasks, math.prod(fresh.block), 2, seconds_per_voxel=2e-7,
                                       tasks_per_chunk=3.0, graph_task_seconds=0.002, spread=0.02)
    assert fresh.predicted_seconds == pytest.approx(float(expected) + 2e-9 * 400.0 * math.prod(fresh.block))
    assert ChunkPlan.from_dict(json.loads(json.dumps(fresh.to_dict()))).first_touch == fresh_pages
    # warm bytes enough for the largest block's tasks: nothing is charged, the plan is the clock's
    assert plan(time_model.FirstTouch(2e-9, warm_bytes=1e12)).chunks == unmeasured.chunks
    # explore chunks says what the predicted seconds charge for
    from explorer.cli_text import time_model_text

    assert "fresh pages at 2.1 ms/MiB (every page)" in time_model_text(fresh)  # 2e-9 s/byte
    assert "beyond 1.00 GiB warm" in time_model_text(plan(time_model.FirstTouch(2e-9, warm_bytes=2**30)))
    assert "fresh pages" not in time_model_text(unmeasured)
    # r * max(0, m(V) - w); nothing without a rate or without the clock's task bytes
    assert time_model.FirstTouch().seconds(clock, [1e6]) == 0.0
    bare = time_model.TaskClock(volumes=(1e6,), seconds_per_voxel=(2e-7,))
    assert fresh_pages.seconds(bare, [1e6]) == 0.0
    np.testing.assert_allclose(fresh_pages.seconds(clock, [1e6, 4e6]), [0.8, 3.2])
    np.testing.assert_allclose(time_model.FirstTouch(2e-9, 1e9).seconds(clock, [1e6, 4e6]), [0.0, 1.2])
    with pytest.raises(ValueError):
        time_model.TaskClock(volumes=(1e6, 1e7), seconds_per_voxel=(1e-7, 1e-7), task_bytes_per_voxel=(1.0,))
    # a fused pipeline's task touches its largest member's pages, not their sum
    other = time_model.TaskClock(volumes=(1e6, 1e8), seconds_per_voxel=(1e-7, 1e-7), task_bytes_per_voxel=(100.0, 900.0))
    fused = time_model.composed_clock([clock, other])
    np.testing.assert_allclose(fused.task_bytes_at([1e6, 1e8]), [400.0 * 1e6, 900.0 * 1e8])


def test_a_clocked_block_shape_takes_its_own_figure_and_survives_a_round_trip():
    clock = time_model.TaskClock(volumes=(1e6, 1e7), seconds_per_voxel=(2e-7, 2e-7),
                               shapes=((100, 100, 400),), shape_seconds_per_voxel=(5e-7,))
    blocks = np.array([[100, 100, 400], [200, 200, 100], [400, 100, 100]])
    np.testing.assert_allclose(clock.seconds_per_voxel_at(np.prod(blocks, axis=1), blocks), [5e-7, 2e-7, 2e-7])
    np.testing.assert_allclose(clock.seconds_per_voxel_at([4e6]), [2e-7])  # no blocks: the volume curve
    assert clock.clocked(blocks).tolist() == [True, False, False] and clock.clocked((100, 100, 400))[0]
    assert time_model.TaskClock.from_dict(json.loads(json.dumps(clock.to_dict()))) == clock
    with pytest.raises(ValueError):
        time_model.TaskClock(volumes=(1e6,), seconds_per_voxel=(1e-7,), shapes=((10, 10, 10),))
    huge = time_model.TaskClock(volumes=(1e6,), seconds_per_voxel=(1e-7,), shapes=((2**40, 1, 1), (1, 2, 3)),
                              shape_seconds_per_voxel=(5e-7, 6e-7))  # too long to pack into one key
    assert huge.clocked([[2**40, 1, 1], [1, 1, 1], [1, 2, 3]]).tolist() == [True, False, True]
    # a composed clock knows the shapes every member clocked, at the members' sum less the shared I/O
    other = time_model.TaskClock(volumes=(1e6,), seconds_per_voxel=(1e-7,),
                               shapes=((100, 100, 400), (50, 50, 50)), shape_seconds_per_voxel=(3e-7, 9e-7))
    fused = time_model.composed_clock([clock, other], shared_seconds_per_voxel=5e-8)
    assert fused.shapes == ((100, 100, 400),)
    assert fused.seconds_per_voxel_at([4e6], [[100, 100, 400]])[0] == pytest.approx(5e-7 + 3e-7 - 5e-8)


def test_a_read_touches_whole_units_a_segy_trace_or_a_zarr_chunk():
    # on average over positions: the window plus a unit less one sample, at most the axis
    assert grid.read_extent(5, 1, 10) == 5 and grid.read_extent(5, 4, 10) == 8 and grid.read_extent(5, 10, 10) == 10
    # exactly, over an axis's chunks: windows [0, 5), [3, 9), [7, 10) of chunks of 4 with a halo of 1
    np.testing.assert_allclose(grid.mean_read_extent(10, [4], 1, 1), [(5 + 6 + 3) / 3])
    # units of 4: [0, 4) and [4, 8) whole, [8, 10) reads the last unit's 2 samples
    np.testing.assert_allclose(grid.mean_read_extent(10, [4, 10], 0, 4), [(4 + 4 + 2) / 3, 10])
    # a SEG-Y's samples axis: every chunk reads whole traces
    np.testing.assert_allclose(grid.mean_read_extent(320, [40, 160, 320], 3, 320), [320, 320, 320])


def test_a_plan_keeps_whole_traces_when_its_clocked_cubes_read_twice_their_voxels():
    """A clock timed on cubes that read whole traces twice their length (the probes': rho = 2),
    read at 10 ns per voxel of 20 ns per block voxel in all.  On a SEG-Y (a read unit of one
    trace) a block that keeps whole traces reads half as much per voxel: the time model takes
    10 ns per voxel off it, and the plan keeps the traces whole, where without the read unit the
    two tie and, with a halo on every axis, the compact block wins."""
    shape, halo = (256, 256, 256), (1, 1, 1)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731
    clock = time_model.TaskClock(volumes=(1e5, 1e8), seconds_per_voxel=(2e-8, 2e-8), read_seconds_per_voxel=1e-8,
                                 read_voxels_per_voxel=(2.0, 2.0))

    def plan(read_unit):
        return plan_chunks(VolumeGeometry(shape, halo, read_unit=read_unit, max_block_voxels=2**21), predict,
                           WorkerSpec(1536 * MiB, BASELINE, workers=2),
                           TimeTerms(graph_task_seconds=0.002, task_clock=clock))

    compact, traces = plan(None), plan((1, 1, 256))
    assert compact.chunks[2] < 256 and compact.read_unit is None
    assert traces.chunks[2] == 256 and traces.read_unit == (1, 1, 256)
    assert ChunkPlan.from_dict(json.loads(json.dumps(traces.to_dict()))) == traces
    cube, slab = time_model.fused_seconds(shape, halo, [compact.chunks, traces.chunks], slots=2,
                                          graph_task_seconds=0.002, task_clock=clock, read_unit=(1, 1, 256))
    assert slab < cube * (1 - plan_candidates.SECONDS_TIE_FRACTION)  # out of the tie: the time model decides
    # without a halo the cube reads what the clock's cubes read: the read unit leaves its price alone
    terms = dict(slots=2, graph_task_seconds=0.002, task_clock=clock)
    assert float(time_model.fused_seconds(shape, (0, 0, 0), [compact.chunks], read_unit=(1, 1, 256), **terms)[0]) \
        == pytest.approx(float(time_model.fused_seconds(shape, (0, 0, 0), [compact.chunks], **terms)[0]))


def test_the_stride_key_counts_a_columns_lines_against_the_cache_lines_its_stride_can_use():
    from explorer.core.machine import CacheGeometry

    l1 = CacheGeometry(line_bytes=64, sets=64, ways=12)  # a way of 4 KiB
    blocks = [(96, 176, 320), (96, 176, 321), (97, 177, 320), (176, 176, 168), (176, 176, 160), (168, 168, 168)]
    # plane strides 2^12, 2^6, 2^8, 2^9, 2^11 and 2^8 bytes times odd numbers: 1, 64, 16, 8, 2 and 16 sets
    # of 12 lines for columns of 96, 96, 97, 176, 176 and 168 lines
    np.testing.assert_allclose(plan_candidates.stride_key(blocks, (8, 8, 8), 4, l1),
                               [3.0, 0.0, 0.0, math.log2(176 / 96), math.log2(176 / 24), 0.0])
    assert not plan_candidates.stride_key(blocks, (8, 8, 8), 4, None).any()  # no cache known: a tie
    # no context needed along the first two axes (envelope's, an FFT along the samples): no such walk
    assert not plan_candidates.stride_key(blocks, (0, 0, 0), 4, l1).any()
    # along the second axis the row stride counts: 320 x 4 bytes = 2^8 x 5, 16 sets of 12 lines for 400
    np.testing.assert_allclose(plan_candidates.stride_key([(10, 400, 320)], (0, 3, 0), 4, l1), [math.log2(400 / 192)])


def test_this_machines_first_data_cache_is_read_from_sysfs(tmp_path):
    from explorer.core.machine import CacheGeometry, l1_data_cache

    for index, (level, kind, sets, ways) in enumerate([("1", "Instruction", 32, 8), ("1", "Data", 64, 12),
                                                       ("2", "Unified", 1024, 8)]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("coherency_line_size", "64"),
                            ("number_of_sets", str(sets)), ("ways_of_associativity", str(ways))):
            (d / name).write_text(value + "\n")
    assert l1_data_cache(tmp_path) == CacheGeometry(64, 64, 12)
    assert l1_data_cache(tmp_path / "missing") is None


def test_among_tied_plans_the_block_whose_stride_keeps_its_columns_cached_wins():
    """Whole traces of 320 samples, a halo of 8: 80x160x320 chunks make 96x168x320 blocks, whose
    plane stride (2^11 bytes times 105) leaves a column of 96 lines 24 of the 12-way cache's; the
    next length, 161, makes them 169 wide (2^8 times 845: 192 lines) for the same predicted time.
    Without a cache geometry the even split stands."""
    from explorer.core.machine import CacheGeometry

    shape, halo = (320, 320, 320), (8, 8, 8)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731

    def plan(cache):
        return plan_chunks(VolumeGeometry(shape, halo, whole_axes=(2,), max_block_voxels=96 * 169 * 320), predict,
                           WorkerSpec(1536 * MiB, BASELINE, workers=2, cache=cache),
                           TimeTerms(graph_task_seconds=0.002,
                                     task_clock=time_model.TaskClock(volumes=(1e5, 1e8), seconds_per_voxel=(2e-8, 2e-8))))

    even, odd = plan(None), plan(CacheGeometry(64, 64, 12))
    assert even.chunks == (80, 160, 320) and even.block == (96, 168, 320)
    assert odd.chunks == (80, 161, 320) and odd.block == (96, 169, 320)
    assert odd.predicted_seconds <= even.predicted_seconds * (1 + plan_candidates.SECONDS_TIE_FRACTION)
    # Each plan says what the time model could not tell it from: the other's choice among them.
    from explorer.plan.planner import TIED_REPORTED

    for chosen, other in ((odd, even), (even, odd)):
        assert 1 <= len(chosen.tied) <= TIED_REPORTED
        assert all(t["chunks"] != list(chosen.chunks) for t in chosen.tied)
        fastest = min([chosen.predicted_seconds] + [t["predicted_seconds"] for t in chosen.tied])
        assert all(t["predicted_seconds"] <= fastest * (1 + plan_candidates.SECONDS_TIE_FRACTION)
                   for t in chosen.tied)
        assert ChunkPlan.from_dict(chosen.to_dict()) == chosen


def test_a_plan_avoids_a_block_shape_the_workers_timed_slow_and_says_whether_its_block_was_timed():
    """256^3, halo 5, two slots, 1.5 GiB: by one cost per voxel the two largest chunks that fit
    are the fastest plan (one wave, least halo); once the workers timed their block at 1.6x that
    cost per voxel, the plan takes another block, whose cost the clock knows only by volume."""
    shape, halo = (256, 256, 256), (5, 5, 5)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731

    def plan(clock):
        return plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(1536 * MiB, BASELINE, workers=2),
                           TimeTerms(graph_task_seconds=0.002, task_clock=clock))

    curve = dict(volumes=(1e6, 1e8), seconds_per_voxel=(2e-7, 2e-7), spread_volumes=(1e6,), spreads=(0.02,))
    by_volume = plan(time_model.TaskClock(**curve))
    assert by_volume.n_tasks == 2 and not by_volume.block_clocked
    slow = plan(time_model.TaskClock(**curve, shapes=(tuple(by_volume.block),), shape_seconds_per_voxel=(3.2e-7,)))
    assert tuple(slow.block) != tuple(by_volume.block) and not slow.block_clocked
    assert slow.predicted_seconds < float(time_model.fused_seconds(
        shape, halo, [by_volume.chunks], slots=2, graph_task_seconds=0.002,
        task_clock=time_model.TaskClock(**curve, shapes=(tuple(by_volume.block),), shape_seconds_per_voxel=(3.2e-7,))
    )[0])
    timed = plan(time_model.TaskClock(**curve, shapes=(tuple(by_volume.block), tuple(slow.block)),
                                    shape_seconds_per_voxel=(3.2e-7, 2e-7)))
    assert timed.block_clocked and timed.chunks == slow.chunks and timed.to_dict()["block_clocked"] is True


def test_a_grid_volume_gives_every_task_the_block_with_two_chunks_per_axis():
    volume, chunks = plan_candidates.grid_volume((40, 50, 60), (5, 5, 5), (2,), (2, 1, 2))
    assert volume == (70, 50, 60) and chunks == (35, 50, 60)  # two chunks of b - h, one of b, a whole axis b
    assert grid.axis_blocks(70, [35], 5)[0] == 40  # each of the two chunks sees its neighbour's halo once
    assert plan_candidates.grid_volume((40, 40, 40), (5, 5, 5), (), (4, 4, 4)) == ((140, 140, 140), (35, 35, 35))


def test_the_compact_neighbour_cuts_the_longest_split_axis_into_twice_the_chunks():
    shape, halo = (256, 256, 256), (5, 5, 5)
    predict = lambda blocks, confidence=0.99: (100.0 * np.prod(blocks, axis=1),) * 2  # noqa: E731
    plan = plan_chunks(VolumeGeometry(shape, halo), predict, WorkerSpec(64 * GiB, BASELINE), chunks=(128, 128, 256))
    assert plan_candidates.compact_neighbour(plan) == (128, 128, 128)
    whole = plan_chunks(VolumeGeometry(shape, halo, whole_axes=(2,)), predict, WorkerSpec(64 * GiB, BASELINE),
                        chunks=(128, 64, 256))
    assert plan_candidates.compact_neighbour(whole) == (64, 64, 256)  # the whole axis stays whole
    smallest = plan_chunks(VolumeGeometry((40, 40, 40), halo, min_chunk=16), predict, WorkerSpec(64 * GiB, BASELINE),
                           chunks=(20, 20, 20))
    assert plan_candidates.compact_neighbour(smallest) is None  # nothing shorter than 16 on any axis


def scaled(factor):
    def prediction(blocks, confidence=0.99):
        mean, upper = analytic_peak(blocks)
        return factor * mean, factor * upper
    return prediction


def test_a_plan_still_fits_under_its_own_predictor_and_not_under_a_doubled_one():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE))
    assert planner.plan_fits(plan, predict)
    assert not planner.plan_fits(plan, scaled(2.0))


def test_replan_policy_only_early_and_only_when_the_plan_no_longer_fits():
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, WorkerSpec(LIMIT, BASELINE))  # one slot: largest chunks
    assert planner.replan(plan, predict, done_fraction=0.0) is None  # still fits: carry on
    assert planner.replan(plan, scaled(2.0), done_fraction=0.9) is None  # too late: finishing is cheaper
    new = planner.replan(plan, scaled(2.0), done_fraction=0.1)
    assert new is not None and new.n_tasks > plan.n_tasks
    assert new == plan_chunks(VolumeGeometry(SHAPE, HALO), scaled(2.0), WorkerSpec(LIMIT, BASELINE))
    with pytest.raises(ChunkPlanError):
        planner.replan(plan, scaled(1e4), done_fraction=0.1)


def test_a_replan_ranks_with_the_cache_its_plan_was_made_for():
    """The plan carries the workers' data cache (JSON too): a re-plan keeps the stride key."""
    from explorer.core.machine import CacheGeometry

    l1 = CacheGeometry(line_bytes=64, sets=64, ways=12)
    spec = WorkerSpec(LIMIT, BASELINE, cache=l1)
    plan = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, spec)
    assert plan.cache == l1 and ChunkPlan.from_dict(plan.to_dict()) == plan
    new = planner.replan(plan, scaled(2.0), done_fraction=0.1)
    assert new is not None and new.cache == l1
    assert new == plan_chunks(VolumeGeometry(SHAPE, HALO), scaled(2.0), spec)


def test_chunks_of_an_operator_that_pads_its_blocks_sit_on_its_grid():
    """unet3d pads blocks to multiples of 8: split axes get chunk lengths on that grid, and the
    plan carries the multiple (a re-plan keeps it)."""
    from explorer.plan.candidates import axis_chunk_candidates

    lengths = axis_chunk_candidates(1000, 48, False, 1, 64, multiple=8)
    split = lengths[lengths < 1000]
    assert len(split) > 5 and np.all(split % 8 == 0)
    assert set(axis_chunk_candidates(1000, 48, False, 1, 64)) - set(lengths)  # not the same without it

    def predict(blocks, confidence=0.99):
        v = np.prod(np.asarray(blocks, dtype=float), axis=1)
        return 320.0 * v, 330.0 * v

    plan = planner.plan_chunks(VolumeGeometry((300, 500, 700), (48, 48, 48), block_multiple=(8, 8, 8)), predict,
                               WorkerSpec(8 * 2**30, 100 * 2**20))
    assert plan.block_multiple == (8, 8, 8)
    assert all(c % 8 == 0 or c == n for c, n in zip(plan.chunks, (300, 500, 700)))


def test_a_predictor_taking_tasks_bounds_the_largest_task_of_each_candidate_plan():
    """The planner gives a predictor that takes ``tasks`` each candidate's task count: a
    plan's footprint must hold for every task it runs (``explorer.plan.excess.task_bound``)."""
    seen = []

    @takes_keywords("tasks")
    def predict(blocks, confidence=0.99, tasks=1):
        tasks = np.broadcast_to(np.asarray(tasks), (len(blocks),))
        seen.append(tasks.copy())
        mean = 100.0 * np.prod(blocks, axis=1)
        return mean, mean + 2**20 * tasks  # 1 MiB more per task covered

    plan = plan_chunks(VolumeGeometry((200, 200, 200), (4, 4, 4)), predict, WorkerSpec(1 * GiB, BASELINE))
    assert any(np.any(t > 1) for t in seen)
    mean = 100.0 * math.prod(plan.block)
    assert plan.footprint.task_peak_bytes == pytest.approx(mean + 2**20 * plan.n_tasks, rel=1e-9)
    assert planner.plan_fits(plan, predict)


def test_the_planner_passes_only_the_keywords_a_predictor_declares():
    """A keyword in a predictor's signature is not enough: the planner passes ``tasks``,
    ``ceiling`` or ``cold`` only where the predictor declares it (``takes_<keyword>``,
    :func:`takes_keywords` or a class attribute of a callable object)."""
    from explorer.plan.predictor import takes, takes_keywords

    class Declared:
        takes_tasks = True

        def __init__(self):
            self.keywords = set()

        def __call__(self, blocks, confidence=0.99, **keywords):
            self.keywords |= set(keywords)
            return analytic_peak(blocks)

    undeclared_seen = set()

    def undeclared(blocks, confidence=0.99, tasks=None, cold=None):
        undeclared_seen.update(k for k, v in (("tasks", tasks), ("cold", cold)) if v is not None)
        return analytic_peak(blocks)

    declared = Declared()
    plan_chunks(VolumeGeometry(SHAPE, HALO), declared, WorkerSpec(LIMIT, BASELINE, workers=2))
    plan_chunks(VolumeGeometry(SHAPE, HALO), undeclared, WorkerSpec(LIMIT, BASELINE, workers=2))
    assert declared.keywords == {"tasks"} and not undeclared_seen
    assert takes(Declared(), "tasks") and not takes(Declared(), "cold") and not takes(undeclared, "tasks")
    with pytest.raises(ValueError, match="unknown predictor keyword"):
        takes_keywords("slots")


# --------------------------------------------------------------------------- staged plans


class StagePredictor:
    """An analytic stage: ``a`` bytes per block sample, its bound ``UPPER_FACTOR`` times
    that; remembers the confidences it was asked at."""

    def __init__(self, bytes_per_sample):
        self.a, self.asked = bytes_per_sample, []

    def __call__(self, blocks, confidence=0.99):
        self.asked.append(confidence)
        samples = np.prod(np.asarray(blocks, dtype=np.float64), axis=-1)
        return self.a * samples, UPPER_FACTOR * self.a * samples


def staged_stages(halos=((4, 4, 4), (6, 6, 6)), bytes_per_sample=(20.0, 200.0), groups=None):
    groups = groups or list(range(len(halos)))
    return [staged.PlanStage(name=f"op{i}", halo=h, predict=StagePredictor(a), group=g,
                               seconds_per_voxel=1e-8 * (i + 1))
            for i, (h, a, g) in enumerate(zip(halos, bytes_per_sample, groups))]


def by_hand_staged_total(plan, stages, shape, workers, threads=1, baseline=BASELINE):
    """The staged bound at the plan's chunks, written out: the largest running stage, every
    stage's queue, and every later stage group's input chunks held for neighbours.  A first
    stage (group 0) reads its blocks from the file in windows: its running task is its peak
    alone, its queue a finished output per thread, and it keeps no chunk for a neighbour.  A
    later stage gathers its block from the intermediate: its running task holds its input
    block too, its queue is a waiting input and a finished output per thread, and its group
    keeps the intermediate's chunks for its neighbours' halos (the group's largest halo).  The
    last stage stores the output: where a chunk is partial, its task holds a whole store chunk."""
    running, queues = [], 0
    partial = any(n % c for n, c in zip(shape, plan.chunks))
    for i, s in enumerate(stages):
        samples = math.prod(expected_block(shape, plan.chunks, s.halo))
        peak = math.ceil(UPPER_FACTOR * s.predict.a * samples)
        block_in = 0 if s.group == 0 else 4 * samples  # float32 input; none resident for a windowed read
        store = 4 * math.prod(plan.chunks) if partial and i == len(stages) - 1 else 0
        running.append(threads * (block_in + peak + store))  # T (in + peak + store chunk)
        queues += threads * block_in + threads * 4 * samples  # T waiting input + T held output (float32 out)
    held = 0
    for g in sorted({s.group for s in stages} - {0}):
        halo = tuple(max(h) for h in zip(*[s.halo for s in stages if s.group == g]))
        held += expected_held_chunks(shape, plan.chunks, halo, workers) * math.prod(plan.chunks) * 4
    return baseline + max(running) + queues + held


@pytest.mark.parametrize("workers", [1, 2])
def test_a_staged_plans_bound_is_its_largest_stage_plus_every_stages_queue_and_held_chunks(workers):
    shape = (300, 260, 200)
    stages = staged_stages()
    plan = staged.plan_staged_chunks(VolumeGeometry(shape), stages, WorkerSpec(1 * GiB, BASELINE, workers=workers),
                                     confidence=0.99)
    assert plan.strategy == "staged" and plan.upper_bytes <= plan.budget_bytes
    assert plan.upper_bytes == by_hand_staged_total(plan, stages, shape, workers)
    assert plan.footprint.total == plan.upper_bytes
    # only the later stage keeps chunks (of the intermediate) for its neighbours' halos
    assert plan.neighbour_chunks == expected_held_chunks(shape, plan.chunks, (6, 6, 6), workers) > 0
    # each stage's bound at the Bonferroni confidence, so that the largest holds with 99%
    asked = [c for s in stages for c in s.predict.asked]
    assert asked and all(c == pytest.approx(1 - 0.01 / 2) for c in asked)
    assert [s["binding"] for s in plan.stages] == [False, True]  # 200 B/sample dwarfs 20
    assert json.loads(json.dumps(plan.to_dict()))["strategy"] == "staged"


def test_a_fan_outs_branches_keep_their_shared_input_once():
    shape = (300, 260, 200)
    fan = staged_stages(halos=((4, 4, 4), (6, 6, 6), (3, 3, 3)), bytes_per_sample=(20.0, 200.0, 50.0),
                        groups=[0, 1, 1])
    plan = staged.plan_staged_chunks(VolumeGeometry(shape), fan, WorkerSpec(1 * GiB, BASELINE, workers=2))
    assert plan.upper_bytes == by_hand_staged_total(plan, fan, shape, 2)
    assert len(plan.stages) == 3
    # the branches' shared intermediate keeps its chunks once, for the larger of their halos
    assert plan.neighbour_chunks == expected_held_chunks(shape, plan.chunks, (6, 6, 6), 2) > 0


def test_a_staged_plans_time_charges_every_stages_tasks_and_block_and_the_transfers():
    shape, workers = (300, 260, 200), 2
    stages = staged_stages()
    plan = staged.plan_staged_chunks(VolumeGeometry(shape), stages, WorkerSpec(4 * GiB, BASELINE, workers=workers),
                                     TimeTerms(graph_task_seconds=0.002, io_seconds_per_voxel=5e-8))
    counts = [-(-n // c) for n, c in zip(shape, plan.chunks)]
    chunk_seconds = 0.0
    for i, s in enumerate(stages):
        block = [int(grid.axis_blocks(n, [c], h)[0]) for n, c, h in zip(shape, plan.chunks, s.halo)]
        # the first stage reads its blocks in windows: read, operator, store, no halo pieces
        graph_tasks = 3.0 if i == 0 else float(time_model.graph_tasks_per_chunk(counts, s.halo))
        chunk_seconds += 0.002 * graph_tasks + s.seconds_per_voxel * math.prod(block)
        chunk_seconds += 5e-8 * (math.prod(block) if i == 0 else (math.prod(block) - math.prod(plan.chunks)) / 2)
    waves = plan.n_tasks / 2 + 1 - 1 / 2  # Graham's bound on two slots
    assert plan.predicted_seconds == pytest.approx(waves * chunk_seconds)


def test_a_staged_plan_is_never_replanned_and_fails_in_one_line_when_nothing_fits():
    stages = staged_stages()
    plan = staged.plan_staged_chunks(VolumeGeometry((200, 200, 200)), stages, WorkerSpec(1 * GiB, BASELINE))
    doubled = lambda blocks, confidence=0.99: tuple(2 * x for x in analytic_peak(blocks))  # noqa: E731
    assert planner.replan(plan, doubled, done_fraction=0.0) is None
    with pytest.raises(ChunkPlanError) as info:
        staged.plan_staged_chunks(VolumeGeometry((2000, 2000, 2000), whole_axes=(2,)), stages,
                                  WorkerSpec(200 * MiB, BASELINE), operator="a,b")
    assert "fits staged for a,b" in str(info.value) and "\n" not in str(info.value)


def test_a_composed_clock_sums_the_members_and_takes_off_the_io_a_fused_task_does_once():
    a = time_model.TaskClock(volumes=(1e4, 1e6), seconds_per_voxel=(4e-7, 1e-7), spread_volumes=(1e4, 1e6),
                           spreads=(0.5, 0.1))
    b = time_model.TaskClock(volumes=(1e5, 1e7), seconds_per_voxel=(3e-7, 2e-7), spread_volumes=(1e5,), spreads=(0.3,))
    fused = time_model.composed_clock([a, b], shared_seconds_per_voxel=5e-8)
    for v in (1e4, 3e5, 1e6, 5e6, 1e7):
        expected = a.seconds_per_voxel_at(v) + b.seconds_per_voxel_at(v) - 5e-8
        assert fused.seconds_per_voxel_at(v) == pytest.approx(expected, rel=1e-9)
    assert fused.spread_at(1e4) == pytest.approx(0.5) and fused.spread_at(1e6) == pytest.approx(0.3)
    no_spread = time_model.TaskClock(volumes=(1e5,), seconds_per_voxel=(1e-7,))
    assert time_model.composed_clock([a, no_spread]).spread_at(1e5) is None
    # a fused task reads once: the members' read rates and voxels read per voxel, averaged
    read_a = dataclasses.replace(a, read_seconds_per_voxel=4e-9, read_voxels_per_voxel=(2.0, 2.0))
    read_b = dataclasses.replace(b, read_seconds_per_voxel=6e-9, read_voxels_per_voxel=(1.0, 3.0))
    both = time_model.composed_clock([read_a, read_b])
    assert both.read_seconds_per_voxel == pytest.approx(5e-9)
    assert both.read_voxels_per_voxel_at([1e5])[0] == pytest.approx((2.0 + 1.0) / 2)
    assert time_model.composed_clock([read_a, b]).read_seconds_per_voxel is None  # a member without reads timed


def test_a_staged_plans_first_stage_pays_the_reads_of_its_windows():
    """Only the stage that reads the file has a read correction: a read unit of whole traces
    charges a block that splits them, at its stage's clock's rate."""
    shape = (300, 260, 200)
    clock = time_model.TaskClock(volumes=(1e5, 1e7), seconds_per_voxel=(1e-7, 1e-7), read_seconds_per_voxel=1e-8,
                                 read_voxels_per_voxel=(1.0, 1.0))
    stages = [dataclasses.replace(s, task_clock=clock) for s in staged_stages()]
    chunks = [(100, 130, 100), (100, 130, 200)]  # half traces, whole traces
    kwargs = dict(workers=2, slots=2, graph_task_seconds=0.002, io_seconds_per_voxel=5e-8)
    as_timed = time_model.staged_seconds(shape, stages, chunks, **kwargs)
    traces = time_model.staged_seconds(shape, stages, chunks, **kwargs, read_unit=(1, 1, 200))
    assert traces[0] > as_timed[0]  # a half-trace block reads its traces whole: more than the clock's tasks
    assert traces[1] == pytest.approx(as_timed[1], rel=0.02)  # whole traces read what the clock's tasks read (halo aside)


def test_a_staged_plan_is_timed_when_every_stages_block_is_and_pays_each_stages_own_figure():
    shape = (300, 260, 200)
    curve = dict(volumes=(1e5, 1e7), seconds_per_voxel=(2e-7, 5e-8))

    def plan(shapes_of):
        stages = [dataclasses.replace(s, task_clock=time_model.TaskClock(
            **curve, shapes=shapes_of(i), shape_seconds_per_voxel=(5e-8,) * len(shapes_of(i))))
            for i, s in enumerate(staged_stages())]
        return stages, staged.plan_staged_chunks(VolumeGeometry(shape), stages,
                                                 WorkerSpec(4 * GiB, BASELINE, workers=2),
                                                 TimeTerms(graph_task_seconds=0.002, io_seconds_per_voxel=5e-8))

    _, untimed = plan(lambda i: ())
    assert not untimed.block_clocked and not any(s["block_clocked"] for s in untimed.stages)
    blocks = [tuple(s["block"]) for s in untimed.stages]
    _, first_only = plan(lambda i: (blocks[0],) if i == 0 else ())
    assert [s["block_clocked"] for s in first_only.stages] == [True, False] and not first_only.block_clocked
    stages, timed = plan(lambda i: (blocks[i],))
    assert timed.block_clocked and timed.chunks == untimed.chunks
    # each stage pays its own block's figure (50 ns, below the curve's at these volumes), not the curve's
    assert timed.predicted_seconds < untimed.predicted_seconds
    assert timed.predicted_seconds == pytest.approx(float(time_model.staged_seconds(
        shape, stages, [timed.chunks], workers=2, slots=2, graph_task_seconds=0.002, io_seconds_per_voxel=5e-8)[0]))


def test_a_staged_plan_with_the_members_clocks_pays_their_tasks_and_their_spread():
    shape, workers = (300, 260, 200), 2
    clocks = [time_model.TaskClock(volumes=(1e5, 1e7), seconds_per_voxel=(2e-7, 5e-8), spread_volumes=(1e5,),
                                 spreads=(s,)) for s in (0.2, 0.4)]
    stages = [dataclasses.replace(s, task_clock=c) for s, c in zip(staged_stages(), clocks)]
    plan = staged.plan_staged_chunks(VolumeGeometry(shape), stages, WorkerSpec(4 * GiB, BASELINE, workers=workers),
                                     TimeTerms(graph_task_seconds=0.002, io_seconds_per_voxel=5e-8))
    counts = [-(-n // c) for n, c in zip(shape, plan.chunks)]
    chunk_seconds = 0.0
    for i, (s, clock) in enumerate(zip(stages, clocks)):
        v = math.prod(int(grid.axis_blocks(n, [c], h)[0]) for n, c, h in zip(shape, plan.chunks, s.halo))
        # the first stage reads its blocks in windows: read, operator, store, no halo pieces
        graph_tasks = 3.0 if i == 0 else float(time_model.graph_tasks_per_chunk(counts, s.halo))
        chunk_seconds += 0.002 * graph_tasks + clock.seconds_per_voxel_at(v) * v
        # a later stage reads its input from, and leaves its output in, the workers: no read, no store
        chunk_seconds += 0.0 if i == 0 else 5e-8 * (v - math.prod(plan.chunks)) / 2 - 5e-8 * math.prod(plan.chunks)
    # the larger of the two spreads; the scheduler balances the 2 n stage tasks, not n chunks
    k = math.ceil(2 * plan.n_tasks / 2)
    waves = max(1.0, (k + 0.4 * math.sqrt(k) * time_model.expected_max_normal(2)) / 2)
    assert plan.predicted_seconds == pytest.approx(waves * chunk_seconds)
    np.testing.assert_allclose(time_model.staged_seconds(shape, stages, [plan.chunks], workers=workers, slots=2,
                                                       graph_task_seconds=0.002, io_seconds_per_voxel=5e-8),
                               [plan.predicted_seconds])


@pytest.mark.parametrize("workers", [1, 4])
def test_a_staged_plans_probe_pruning_gives_the_exhaustive_answer(monkeypatch, workers):
    shape = (800, 600, 1000)
    pruned = staged.plan_staged_chunks(VolumeGeometry(shape), staged_stages(),
                                       WorkerSpec(1.5 * GiB, BASELINE, workers=workers))
    monkeypatch.setattr(plan_candidates, "PROBE_VALUES_PER_AXIS", 10**6)  # the probe is every candidate
    exhaustive = staged.plan_staged_chunks(VolumeGeometry(shape), staged_stages(),
                                           WorkerSpec(1.5 * GiB, BASELINE, workers=workers))
    assert pruned.chunks == exhaustive.chunks and pruned.upper_bytes == exhaustive.upper_bytes
    assert pruned.n_candidates < exhaustive.n_candidates


def test_a_staged_no_fit_names_the_smallest_complete_footprint_as_an_unpruned_search_would():
    """Pruning stops predicting a candidate once it is over the budget; when nothing fits, the
    message still names the smallest footprint of an exhaustive evaluation.  (At 260 MiB the
    smallest candidates fit with every task peak at 0, so they are predicted, and pruned, stage
    by stage; none fits once predicted.)"""
    stages = staged_stages(halos=((4, 4, 4), (6, 6, 6), (3, 3, 3)), bytes_per_sample=(20.0, 200.0, 50.0),
                           groups=[0, 1, 1])
    limit = 260 * MiB
    with pytest.raises(ChunkPlanError) as info:
        staged.plan_staged_chunks(VolumeGeometry((1200, 1000, 900)), stages, WorkerSpec(limit, BASELINE, workers=2))
    c = plan_candidates.chunk_candidates(
        VolumeGeometry((1200, 1000, 900), (6, 6, 6)),
        footprint=functools.partial(worker_footprint, threads_per_worker=1, baseline_bytes=0), budget=2**62, slots=2,
        time_terms=TimeTerms(seconds_per_voxel=1e-7, graph_task_seconds=0.002))
    rows = [type("P", (), {"chunks": tuple(int(x) for x in row)}) for row in c.chunks]
    smallest = min(by_hand_staged_total(row, stages, (1200, 1000, 900), 2) for row in rows)
    idle = [dataclasses.replace(s, predict=StagePredictor(0.0)) for s in stages]  # every task peak at 0
    least_floor = min(by_hand_staged_total(row, idle, (1200, 1000, 900), 2) for row in rows)
    assert least_floor <= math.floor(0.8 * limit) < smallest  # predicted, and pruned, yet nothing fits
    assert units.format_bytes(smallest) in str(info.value)


@pytest.mark.parametrize("halo", [(5, 5, 5), (0, 3, 0), (0, 0, 0)])
def test_a_candidate_grids_time_model_terms_are_the_row_by_row_ones(halo):
    """Candidates are a sub-grid of per-axis lengths: their graph tasks are computed per axis
    and gathered, and must equal graph_tasks_per_chunk's row by row (bit for bit)."""
    c = plan_candidates.chunk_candidates(
        VolumeGeometry((800, 600, 1000), halo, min_chunk=16),
        footprint=functools.partial(worker_footprint, baseline_bytes=BASELINE), budget=10**15, slots=3,
        time_terms=TimeTerms(seconds_per_voxel=1e-7, graph_task_seconds=0.002))
    counts = -(-np.asarray((800, 600, 1000)) // c.chunks)
    np.testing.assert_array_equal(time_model._grid_graph_tasks((800, 600, 1000), halo, c.axis_chunks, c.grid),
                                  time_model.graph_tasks_per_chunk(counts, halo))
    k = counts[:, None, :]  # (m, 1, 3): neighbour_chunks_held on any leading shape, row by row
    rows = np.array([plan_footprint.neighbour_chunks_held(row, halo, 3) for row in counts])
    np.testing.assert_array_equal(plan_footprint.neighbour_chunks_held(k, halo, 3)[:, 0], rows)


def test_no_plan_runs_a_block_larger_than_the_largest_measured_in_a_worker():
    """``max_block_voxels`` (the largest block a task was measured on inside a worker) drops
    every larger block: the plan is the fewest tasks among the rest, says its cap, keeps it
    through JSON and a re-plan; a chunking given by hand is planned as given."""
    spec = WorkerSpec(LIMIT, BASELINE)
    free = plan_chunks(VolumeGeometry(SHAPE, HALO), predict, spec)
    cap = math.prod(free.block) // 3
    capped = plan_chunks(VolumeGeometry(SHAPE, HALO, max_block_voxels=cap), predict, spec)
    assert math.prod(capped.block) <= cap < math.prod(free.block)
    assert capped.n_tasks > free.n_tasks and capped.max_block_voxels == cap
    # the fewest tasks of any chunking whose block is at most the cap (by hand: every chunk length
    # that map_overlap keeps, as brute_force_fewest_tasks lists them)
    options = [[c for c in {-(-n // k) for k in range(1, n // 16 + 1)}
                if -(-n // c) == 1 or n - (-(-n // c) - 1) * c >= h] for n, h in zip(SHAPE, HALO)]
    fewest = min(math.prod(-(-n // c) for n, c in zip(SHAPE, chunk)) for chunk in itertools.product(*options)
                 if math.prod(expected_block(SHAPE, chunk, HALO)) <= cap)
    assert capped.n_tasks == fewest
    assert ChunkPlan.from_dict(json.loads(json.dumps(capped.to_dict()))) == capped
    doubled = lambda blocks, confidence=0.99: tuple(2 * v for v in analytic_peak(blocks))  # noqa: E731
    again = planner.replan(dataclasses.replace(capped, chunks=free.chunks, block=free.block), doubled,
                           done_fraction=0.0)
    assert again is not None and math.prod(again.block) <= cap
    given = plan_chunks(VolumeGeometry(SHAPE, HALO, max_block_voxels=cap), predict, spec, chunks=free.chunks)
    assert given.chunks == free.chunks and given.max_block_voxels is None


def test_a_staged_plan_keeps_every_stages_block_within_its_members_cap():
    """Each stage's block is at most the chunk with the largest stage halo: the planner keeps that
    block within the smallest of the stages' caps (their members' largest blocks measured in a
    worker), so every stage runs within its own; the plan says the cap it kept."""
    shape = (300, 260, 200)
    spec = WorkerSpec(4 * GiB, BASELINE)
    free = staged.plan_staged_chunks(VolumeGeometry(shape), staged_stages(), spec)
    largest = math.prod(expected_block(shape, free.chunks, (6, 6, 6)))
    caps = (largest // 2, largest // 5)
    stages = [dataclasses.replace(s, max_block_voxels=cap) for s, cap in zip(staged_stages(), caps)]
    capped = staged.plan_staged_chunks(VolumeGeometry(shape), stages, spec)
    assert capped.max_block_voxels == min(caps) and free.max_block_voxels is None
    for s in stages:
        assert math.prod(expected_block(shape, capped.chunks, s.halo)) <= min(caps)
    assert capped.n_tasks > free.n_tasks
