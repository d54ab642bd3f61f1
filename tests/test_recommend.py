"""recommend_chunks on real parts: a surrogate fitted from real profiles, its calibration from
real in-worker probes, a worker baseline measured on a real LocalCluster."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from explorer.core import paths
from explorer.plan.chunk_plan import ChunkPlanError
from explorer.core.environment import StaleModelWarning
from explorer.measure.worker_baseline import baseline_path
from explorer.plan.recommend import plan_for_chunks, recommend_chunks
from explorer.model.memory_model import ModelNotFoundError

OPERATOR = "gst3d"
SHAPE = (300, 240, 200)
MiB, GiB = 2**20, 2**30


@pytest.fixture
def runs(tmp_path, probed_runs):
    copy = tmp_path / "runs"
    shutil.copytree(probed_runs, copy)
    return copy


def test_string_and_int_limits_and_shapes_agree(runs):
    by_string = recommend_chunks(OPERATOR, "300x240x200", "2GiB", runs_dir=runs)
    by_int = recommend_chunks(OPERATOR, SHAPE, 2 * GiB, runs_dir=runs)
    assert by_string == by_int and by_string.limit_bytes == 2 * GiB
    assert by_string.upper_bytes <= by_string.budget_bytes


def test_confidence_threads_and_dask_pause_fraction_are_applied(runs):
    import dask

    loose = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, confidence=0.9)
    tight = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, confidence=0.999)
    assert (loose.confidence, tight.confidence) == (0.9, 0.999)
    # The same chunks bound at 0.9 and at 0.999: the higher confidence bounds the task higher.
    at_loose = plan_for_chunks(OPERATOR, SHAPE, tight.chunks, "1GiB", runs_dir=runs, confidence=0.9)
    assert at_loose.block == tight.block
    assert at_loose.footprint.task_peak_bytes < tight.footprint.task_peak_bytes
    assert at_loose.upper_bytes < tight.upper_bytes <= tight.budget_bytes
    # at 400 MiB one thread runs the largest probed block (the cap binds), four threads do not fit it
    one = recommend_chunks(OPERATOR, SHAPE, "400MiB", runs_dir=runs)
    four = recommend_chunks(OPERATOR, SHAPE, "400MiB", runs_dir=runs, threads_per_worker=4)
    assert four.threads_per_worker == 4 and four.n_tasks > one.n_tasks and four.upper_bytes <= four.budget_bytes
    with dask.config.set({"distributed.worker.memory.pause": 0.5}):
        half = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs)
    assert half.pause_fraction == 0.5 and half.upper_bytes <= 0.5 * GiB


def test_the_bound_is_the_in_worker_one_and_the_time_terms_are_learnt(runs, gst3d_model):
    from explorer.plan.calibration import load_calibration

    plan = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs)
    isolated_upper = gst3d_model.predict(plan.block)[1]
    assert plan.footprint.task_peak_bytes > isolated_upper  # the in-worker excess is counted
    cal = load_calibration(OPERATOR, runs)
    volume = math.prod(plan.block)
    assert plan.task_clock == cal.timing.clock is not None  # the probes' clocks
    assert plan.seconds_per_voxel == pytest.approx(float(cal.timing.clock.seconds_per_voxel_at(volume)))
    assert plan.task_spread == pytest.approx(float(cal.timing.clock.spread_at(volume)))
    assert plan.graph_task_seconds == pytest.approx(cal.timing.graph_task_seconds)
    assert plan.warnings == ()


def test_the_local_baseline_is_measured_once_per_environment_and_saved(runs):
    saved = json.loads(baseline_path(OPERATOR, runs).read_text())  # the probes saved it
    plan = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs)
    assert plan.baseline_source == "local" and plan.footprint.baseline_bytes == saved["baseline_bytes"]
    assert recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, baseline_bytes="local") == plan
    assert recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, baseline_bytes=None) == plan
    with pytest.raises(ValueError, match="baseline_bytes must be bytes, a WorkerBaseline or 'local'"):
        recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, baseline_bytes="remote")
    # A second process reuses the file: no cluster, distributed never imported.
    code = ("import sys, explorer; p = explorer.recommend_chunks('gst3d', (300, 240, 200), '1GiB', "
            f"runs_dir={str(runs)!r}); print(p.footprint.baseline_bytes, 'distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(saved["baseline_bytes"]), "False"]
    # Measured on another host: measured again here, on a real one-worker LocalCluster.
    saved["environment"]["hostname"] = "elsewhere"
    saved["baseline_bytes"] = 1
    baseline_path(OPERATOR, runs).write_text(json.dumps(saved))
    again = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs)
    remeasured = json.loads(baseline_path(OPERATOR, runs).read_text())
    assert again.footprint.baseline_bytes == remeasured["baseline_bytes"] > 50 * MiB
    assert remeasured["environment"]["hostname"] != "elsewhere"


def test_a_given_baseline_is_planned_for_and_one_too_large_is_one_line(runs):
    light = recommend_chunks(OPERATOR, SHAPE, "1.5GiB", runs_dir=runs, baseline_bytes=100 * MiB)
    # 1200 MiB of 1.5 GiB leaves less room than the largest probed block needs: memory binds
    heavy = recommend_chunks(OPERATOR, SHAPE, "1.5GiB", runs_dir=runs, baseline_bytes=1200 * MiB)
    assert heavy.baseline_source == "given" and heavy.footprint.baseline_bytes == 1200 * MiB
    assert heavy.n_tasks > light.n_tasks and heavy.upper_bytes <= heavy.budget_bytes
    with pytest.raises(ChunkPlanError) as err:
        recommend_chunks(OPERATOR, SHAPE, "1.5GiB", runs_dir=runs, baseline_bytes=1300 * MiB)
    assert "baseline" in str(err.value) and "1.27 GiB" in str(err.value) and "\n" not in str(err.value)


def test_a_stale_model_is_a_warning_on_the_plan(runs):
    import numpy as np

    path = paths.model_path(OPERATOR, runs)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")[()]))
    meta["environment"]["scipy"] = "0.1.0"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    with pytest.warns(StaleModelWarning):
        plan = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs)
    assert any("scipy 0.1.0 ->" in w and f"explore {OPERATOR}" in w for w in plan.warnings)
    assert plan.to_dict()["warnings"] == list(plan.warnings)


def test_without_probes_the_plan_says_the_bound_is_isolated(tmp_path, gst3d_model):
    runs = tmp_path / "runs"
    gst3d_model.save(paths.model_path(OPERATOR, runs))
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleModelWarning)
        plan = recommend_chunks(OPERATOR, SHAPE, "1GiB", runs_dir=runs, baseline_bytes=100 * MiB)
    assert len(plan.warnings) == 1 and "no in-worker calibration" in plan.warnings[0]
    assert not os.path.exists(baseline_path(OPERATOR, runs))  # a given baseline measures nothing


def test_errors_name_the_fix(tmp_path, runs):
    with pytest.raises(KeyError, match="unknown operator 'nope'"):
        recommend_chunks("nope", SHAPE, "2GiB", runs_dir=runs)
    with pytest.raises(ModelNotFoundError, match="explore gst3d"):
        recommend_chunks(OPERATOR, SHAPE, "2GiB", runs_dir=tmp_path / "empty")
    assert not (tmp_path / "empty").exists()  # no cluster started, nothing written for a missing model
    with pytest.raises(ChunkPlanError, match="raise the memory limit"):
        recommend_chunks(OPERATOR, SHAPE, "100MiB", runs_dir=runs)
    with pytest.raises(ValueError, match="malformed size"):
        recommend_chunks(OPERATOR, SHAPE, "lots", runs_dir=runs)
    with pytest.raises(ValueError, match="malformed shape"):
        recommend_chunks(OPERATOR, "300by240", "2GiB", runs_dir=runs)


@pytest.mark.unit
def test_auto_prefers_a_complete_bound_then_the_faster_plan_then_fused():
    from explorer.plan.recommend import choose_strategy

    def plan(seconds, calibrated):
        return {"predicted_seconds": seconds, "in_worker_calibrated": calibrated}

    assert choose_strategy({"fused": plan(3.0, False), "staged": plan(3.5, True)}) == "staged"
    assert choose_strategy({"fused": plan(3.0, True), "staged": plan(3.5, True)}) == "fused"
    assert choose_strategy({"fused": plan(3.0, False), "staged": plan(2.5, False)}) == "staged"
    assert choose_strategy({"fused": plan(3.0, True), "staged": plan(3.0, True)}) == "fused"
    assert choose_strategy({"fused": plan(3.0, True)}) == "fused"


@pytest.mark.unit
def test_auto_names_the_command_that_calibrates_a_faster_plan_it_passed_over():
    from explorer.plan.recommend import _passed_over

    def plan(seconds, calibrated):
        return {"predicted_seconds": seconds, "in_worker_calibrated": calibrated}

    lines = _passed_over("gaussian(sigma=1),semblance", {"fused": plan(0.9, False), "staged": plan(1.9, True)}, "staged")
    assert len(lines) == 1 and lines[0].startswith("fused (~0.9 s predicted, against ~1.9 s) was passed over")
    assert "`explore calibrate 'gaussian(sigma=1),semblance'`" in lines[0]
    # a slower uncalibrated plan, or a calibrated one, is not worth a line
    assert _passed_over("a,b", {"fused": plan(2.0, False), "staged": plan(1.9, True)}, "staged") == []
    assert _passed_over("a,b", {"fused": plan(0.9, True), "staged": plan(1.9, True)}, "fused") == []


def test_a_pipelines_members_calibrations_are_checked_against_their_own_stamp_on_the_workers(runs):
    """The workers' baseline carries the pipeline's environment stamp (its operator and code);
    each member's calibration was stamped with the member's own.  Checked against the
    pipeline's, every member's calibration looked learnt in another environment; against the
    workers' stamp with the member's own code, it does not."""
    from explorer.core.environment import environment_stamp
    from explorer.measure.worker_baseline import WorkerBaseline

    spec = "gst3d,gst3d"
    baseline = WorkerBaseline(bytes=100 * MiB, source="cluster", environment=environment_stamp(spec))
    plan = recommend_chunks(spec, (200, 200, 200), "2GiB", runs_dir=runs, strategy="staged", workers=2,
                            baseline_bytes=baseline)
    assert plan.strategy == "staged"
    assert not any("another environment" in w for w in plan.warnings), plan.warnings
