"""Pipeline specs (``operators.pipeline``): the grammar and its one-line errors, parameters
as part of an operator's identity, the composed operator's halo, NumPy form and fused Dask
form (equal to the NumPy composition on the whole volume, seams included), and the
commands taking a spec (real profiling children, a real LocalCluster, a real SEG-Y)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import dask
import numpy as np
import pytest

import operators
from explorer.search.core import member_noise_floor
from operators.pipeline import Pipeline, SpecError, parse
from harness.models import fitted_model

ISSUE_PIPELINES = ["gaussian,gst3d", "envelope,gaussian", "gaussian(sigma=1),semblance,gaussian"]


# --------------------------------------------------------------------------- the grammar (pure)


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty operator spec"),
    ("gaussian,,gst3d", "empty stage or branch"),
    ("gaussian,", "empty stage or branch"),
    ("+gst3d", "empty stage or branch"),
    ("gaussian(sigma=4", "a '(' without its ')'"),
    ("gaussian)sigma=4(", "a ')' without its '('"),
    ("gaussian((sigma=4))", "nested parentheses"),
    ("gaussian()", "empty parentheses"),
    ("gaussian(sigma)", "write key=value"),
    ("gaussian(sigma=4)x", "text after ')'"),
    ("gaussian(sigma=1,sigma=2)", "given twice"),
    ("gaussian(size=3)", "gaussian has no parameter 'size' (its parameters: sigma)"),
    ("gst3d(sigma=2)", "gst3d has no parameter 'sigma' (its parameters: none)"),
    ("gaussian(sigma=-1)", "gaussian: sigma=-1: every value must be > 0"),
    ("gaussian(sigma=abc)", "gaussian: sigma 'abc' is not a number"),
    ("semblance(window=4x4x9)", "semblance: window=4x4x9: each size must be odd"),
    ("semblance(window=3x3)", "one value or three joined by 'x'"),
    ("envelope+gst3d,gaussian", "a fan-out ('+') must be the last stage"),
    ("gaussian, gst3d", "spaces in the spec"),
    ("gauss=ian", "malformed operator name"),
])
def test_a_bad_spec_is_one_line_naming_its_fault(spec, fragment):
    with pytest.raises(SpecError) as info:
        operators.get(spec)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_an_unknown_member_names_the_known_operators():
    with pytest.raises(KeyError) as info:
        operators.get("gaussian,dip")
    assert "unknown operator 'dip'; known operators: envelope" in info.value.args[0]


def test_stages_branches_and_parameters_parse_as_written():
    stages = parse("gaussian(sigma=4),envelope+semblance(window=5x5x11)")
    assert [[(c.name, c.params) for c in stage] for stage in stages] == [
        [("gaussian", (("sigma", "4"),))], [("envelope", ()), ("semblance", (("window", "5x5x11"),))]]


def test_a_parameter_is_part_of_the_name_and_a_default_is_not():
    assert operators.get("gaussian(sigma=2.0)").name == "gaussian"
    assert operators.get("gaussian(sigma=2x2x2)").name == "gaussian"
    assert operators.get("gaussian(sigma=4.0)").name == "gaussian(sigma=4)"
    assert operators.get("gaussian(sigma=1x1x2.5)").name == "gaussian(sigma=1x1x2.5)"
    assert operators.get("semblance(window=3x3x9)").name == "semblance"
    # The parameter sets the halo: gaussian's radius int(4 sigma + 0.5), semblance's half-window.
    assert operators.get("gaussian(sigma=4)").halo == (16, 16, 16)
    assert operators.get("gaussian(sigma=1x1x2)").halo == (4, 4, 8)
    assert operators.get("semblance(window=5x5x11)").halo == (2, 2, 5)
    assert operators.get("gaussian").halo == (8, 8, 8)  # the class is untouched


def test_the_pipeline_halo_is_the_sum_along_the_chain_and_the_largest_over_branches():
    chain = operators.get("gaussian(sigma=1),semblance,gaussian")
    assert isinstance(chain, Pipeline) and chain.halo == (4 + 1 + 8, 4 + 1 + 8, 4 + 4 + 8)
    fan = operators.get("gaussian,envelope+gst3d+semblance")
    assert fan.halo == (8 + 5, 8 + 5, 8 + 5) and fan.whole_axes == (2,)
    assert fan.branches == ("envelope", "gst3d", "semblance")
    assert operators.get("envelope,gaussian").whole_axes == (2,)
    assert fan.name == "gaussian,envelope+gst3d+semblance"


# --------------------------------------------------------------------------- the NumPy and Dask forms


def volume(shape, seed=0):
    return operators.synthetic_volume(shape, seed=seed)


def test_run_applies_the_stages_in_order_and_a_fan_out_returns_each_branch():
    x = volume((30, 26, 40))
    smoothed = operators.get("gaussian").run(x)
    np.testing.assert_array_equal(operators.get("gaussian,gst3d").run(x), operators.get("gst3d").run(smoothed))
    outputs = operators.get("gaussian,envelope+gst3d").run(x)
    assert isinstance(outputs, tuple) and len(outputs) == 2
    np.testing.assert_array_equal(outputs[0], operators.get("envelope").run(smoothed))
    np.testing.assert_array_equal(outputs[1], operators.get("gst3d").run(smoothed))
    assert operators.get("gaussian,gst3d").output_shape((30, 26, 40)) == (30, 26, 40)


@pytest.mark.parametrize("strategy", ["fused", "staged"])
@pytest.mark.parametrize("spec", ISSUE_PIPELINES)
def test_both_dask_forms_equal_the_numpy_composition_seams_included(spec, strategy):
    import dask.array as da

    op = operators.get(spec)
    x = volume((72, 64, 70), seed=1)
    chunks = tuple(max(h + 4, n // 3) for h, n in zip(op.halo, x.shape))  # several chunks per split axis
    lazy = op.dask(da.from_array(x, chunks=chunks), strategy=strategy)
    assert any(lazy.numblocks[a] > 1 for a in range(3) if a not in op.whole_axes)
    # fused: one operator layer; staged: one per stage, each with its own overlap
    run_layers = [name for name in lazy.dask.layers if name.startswith("run-")]
    assert len(run_layers) == (len(op.stages) if strategy == "staged" else 1)
    with dask.config.set(scheduler="synchronous"):
        got = lazy.compute()
    np.testing.assert_allclose(got, op.run(x), rtol=0, atol=2e-6)


@pytest.mark.parametrize("strategy", ["fused", "staged"])
@pytest.mark.parametrize("spec", ISSUE_PIPELINES + ["gaussian,envelope+gst3d"])
def test_from_a_source_both_forms_read_windows_and_equal_the_numpy_composition(spec, strategy):
    """A run's form: the pipeline reads its input in windows (``chunks`` given with a source);
    fused, one task per block and nothing else per block; equal to ``run`` on the whole volume."""
    op = operators.get(spec)
    x = volume((72, 64, 70), seed=1)
    chunks = tuple(max(h + 4, n // 3) for h, n in zip(op.halo, x.shape))
    lazy = op.dask(x, chunks=chunks, strategy=strategy)
    arrays = lazy if isinstance(lazy, dict) else {None: lazy}
    if strategy == "fused" and not op.branches:
        assert len(dict(lazy.__dask_graph__())) == math.prod(lazy.numblocks) + 1
    expected = op.run(x)
    expected = dict(zip(op.branches, expected)) if op.branches else {None: expected}
    with dask.config.set(scheduler="synchronous"):
        for name, a in arrays.items():
            np.testing.assert_allclose(a.compute(), expected[name], rtol=0, atol=2e-6)


@pytest.mark.parametrize("strategy", ["fused", "staged"])
def test_a_fan_outs_dask_form_is_one_array_per_branch_equal_to_numpy_seams_included(strategy):
    import dask.array as da

    op = operators.get("gaussian,envelope+gst3d+semblance(window=5x5x11)")
    x = volume((72, 64, 70), seed=3)
    out = op.dask(da.from_array(x, chunks=(30, 28, 70)), strategy=strategy)
    assert list(out) == ["envelope", "gst3d", "semblance(window=5x5x11)"]
    assert all(a.numblocks == (3, 3, 1) for a in out.values())
    with dask.config.set(scheduler="synchronous"):
        got = dask.compute(out)[0]
    for branch, expected in zip(out, op.run(x)):
        np.testing.assert_allclose(got[branch], expected, rtol=0, atol=2e-6)


# --------------------------------------------------------------------------- commands taking a spec


def cli(*args, runs=None):
    command = [sys.executable, "-m", "explorer.cli", *map(str, args)]
    if runs is not None:
        command += ["--runs-dir", str(runs)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_explore_profile_takes_a_spec_and_names_it_canonically():
    out = cli("profile", "gaussian(sigma=2.0),gst3d", "32x28x40", "--json")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["operator"] == "gaussian,gst3d" and m["status"] == "ok" and m["peak_bytes"] > 0
    fan = json.loads(cli("profile", "gaussian,envelope+gst3d", "32x28x40", "--json").stdout.strip().splitlines()[-1])
    assert fan["output_bytes"] == 2 * 4 * 32 * 28 * 40  # both branches' outputs
    bad = cli("profile", "gaussian(sigma=0),gst3d", "32x28x40")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("gaussian: sigma=0: every value must be > 0")
    assert "Traceback" not in bad.stderr


@pytest.mark.integration
def test_explore_run_on_a_chain_writes_the_numpy_composition(tmp_path):
    spec = "envelope,gaussian"
    x = volume((40, 36, 48), seed=2)
    source = tmp_path / "in.sgy"
    operators.write_segy(source, x)
    out = cli("run", spec, source, "--output", tmp_path / "out.zarr", "--chunks", "20x18x48", "--workers", "1",
              "--memory-limit", "1GiB", "--json", runs=tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok" and result["operator"] == spec
    # live refinement records the pipeline's tasks in its own study, each on its block
    from explorer.search.store import Store

    tasks = Store(tmp_path / "runs").records(spec, source="production")
    assert len(tasks) == result["n_tasks"] == result["observations_recorded"] == 4
    assert {r.shape for r in tasks} == {(20 + 8, 18 + 8, 48)}  # halo 8 on the split axes, samples whole
    import zarr

    got = np.asarray(zarr.open(str(tmp_path / "out.zarr"), mode="r"))
    np.testing.assert_allclose(got, operators.get(spec).run(operators.read_segy(source).compute()), rtol=0, atol=2e-6)
    # a fan-out: one Zarr group of an array per branch, and one SEG-Y per branch on the survey
    spec = "gaussian,envelope+gst3d"
    smoothed_outputs = operators.get(spec).run(operators.read_segy(source).compute())
    fan = cli("run", spec, source, "--output", tmp_path / "fan.zarr", "--chunks", "20x18x48", "--workers", "1",
              "--memory-limit", "1GiB", "--no-refine", "--json", runs=tmp_path / "runs")
    assert fan.returncode == 0, fan.stderr
    result = json.loads(fan.stdout.strip().splitlines()[-1])
    assert result["outputs"] == {b: str(tmp_path / "fan.zarr" / b) for b in ("envelope", "gst3d")}
    group = zarr.open_group(str(tmp_path / "fan.zarr"), mode="r")
    for branch, expected in zip(("envelope", "gst3d"), smoothed_outputs):
        np.testing.assert_allclose(np.asarray(group[branch]), expected, rtol=0, atol=2e-6)
    (tmp_path / "keep-envelope.sgy").write_text("a file of the user's")
    refused = cli("run", spec, source, "--output", tmp_path / "keep.sgy", "--chunks", "20x18x48", "--workers", "1",
                  "--memory-limit", "1GiB", "--no-refine", "--overwrite", runs=tmp_path / "runs")
    assert refused.returncode != 0 and "was not written by memory-explorer" in refused.stderr.strip().splitlines()[-1]
    assert (tmp_path / "keep-envelope.sgy").read_text() == "a file of the user's"
    segy = cli("run", spec, source, "--output", tmp_path / "dip.sgy", "--chunks", "20x18x48", "--workers", "1",
               "--memory-limit", "1GiB", "--no-refine", runs=tmp_path / "runs")
    assert segy.returncode == 0, segy.stderr
    for branch, expected in zip(("envelope", "gst3d"), smoothed_outputs):
        written = tmp_path / f"dip-{branch}.sgy"
        np.testing.assert_allclose(operators.read_segy(written).compute(), expected, rtol=0, atol=2e-6)
        assert written.read_bytes()[3600:3840] == source.read_bytes()[3600:3840]  # the first trace header: same survey
    assert not (tmp_path / "dip.sgy").exists()


@pytest.mark.integration
def test_a_staged_run_writes_the_numpy_composition_and_keeps_only_its_run_record(tmp_path):
    """``explore run SPEC --strategy staged``: one ``map_overlap`` per stage on a real
    LocalCluster; each branch equals the NumPy composition, the result says ``staged``, and
    the members' tasks are not recorded as the pipeline's (only the run record, tagged)."""
    from explorer.search.store import Store

    spec = "gaussian,envelope+gst3d"
    source = tmp_path / "in.sgy"
    operators.write_segy(source, volume((40, 36, 48), seed=4))
    out = cli("run", spec, source, "--output", tmp_path / "fan.zarr", "--chunks", "20x18x48", "--workers", "1",
              "--memory-limit", "1GiB", "--strategy", "staged", "--json", runs=tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok" and result["strategy"] == "staged" and result["observations_recorded"] == 0
    import zarr

    group = zarr.open_group(str(tmp_path / "fan.zarr"), mode="r")
    for branch, expected in zip(("envelope", "gst3d"), operators.get(spec).run(operators.read_segy(source).compute())):
        np.testing.assert_allclose(np.asarray(group[branch]), expected, rtol=0, atol=2e-6)
    store = Store(tmp_path / "runs")
    assert store.records(spec, source="production") == []
    (run_record,) = store.records(spec, source="run")
    assert run_record.context["strategy"] == "staged" and run_record.context["n_tasks"] == 4
    bad = cli("run", spec, source, "--output", tmp_path / "x.zarr", "--strategy", "sideways", runs=tmp_path / "runs")
    assert bad.returncode == 2 and "invalid choice: 'sideways'" in bad.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- the composed model


class Known:
    """A member model with a known mean and upper (bytes per voxel), recording the confidence asked."""

    def __init__(self, mean_per_voxel, upper_per_voxel, seconds_per_voxel=1e-8):
        self.a, self.b = mean_per_voxel, upper_per_voxel
        self.info, self.stale, self.asked = {"seconds_per_voxel": seconds_per_voxel}, [], []

    def predict_many(self, shapes, confidence=0.99):
        self.asked.append(confidence)
        v = np.asarray(shapes, dtype=float).reshape(-1, 3).prod(1)
        return self.a * v, self.b * v


def test_the_composed_peak_is_the_largest_stage_with_what_is_alive_and_bonferroni_bounds():
    from explorer.model.composed import ComposedModel

    chain = operators.get("gaussian,gst3d")
    members = {"gaussian": Known(20.0, 21.0), "gst3d": Known(90.0, 95.0)}
    model = ComposedModel(chain, members)
    v = 50**3
    mean, upper = model.predict((50, 50, 50), 0.99)
    # gst3d runs with gaussian's float32 output alive: 4 + 90 bytes per voxel
    assert mean == pytest.approx((4 + 90) * v) and upper == pytest.approx((4 + 95) * v)
    assert members["gst3d"].asked == [pytest.approx(1 - 0.01 / 2)]
    assert model.info["seconds_per_voxel"] == pytest.approx(2e-8)
    # a fan-out: each branch runs with the prefix's output and the earlier branches' outputs alive
    fan = operators.get("gaussian,envelope+gst3d")
    members = {"gaussian": Known(200.0, 210.0), "envelope": Known(16.0, 17.0), "gst3d": Known(90.0, 95.0)}
    mean, upper = ComposedModel(fan, members).predict((50, 50, 50), 0.99)
    assert mean == pytest.approx(200.0 * v)  # the smoothing dominates here
    members["gaussian"] = Known(20.0, 21.0)
    model = ComposedModel(fan, members)
    # in the order written, gst3d runs with envelope's output alive too
    mean, upper = model.predict_many([(50, 50, 50)], 0.99, branch_order=("envelope", "gst3d"))
    assert mean[0] == pytest.approx((4 + 4 + 90) * v) and upper[0] == pytest.approx((4 + 4 + 95) * v)
    assert members["envelope"].asked[-1] == pytest.approx(1 - 0.01 / 3)
    # Liu's order (decreasing peak - output) runs gst3d first: the default, and the plan's
    mean, upper = model.predict((50, 50, 50), 0.99)
    assert mean == pytest.approx((4 + 90) * v) and upper == pytest.approx((4 + 95) * v)
    assert model.branch_order((50, 50, 50)) == ("gst3d", "envelope")


def test_liu_order_gives_the_smallest_peak_of_every_order():
    import itertools

    from explorer.model.composed import liu_order, sequence_peak

    rng = np.random.default_rng(3)
    for _ in range(200):
        b = int(rng.integers(2, 6))
        output = rng.uniform(0, 10, size=(1, b))
        peak = output + rng.uniform(0, 30, size=(1, b))  # a branch's peak includes its output
        held = rng.uniform(0, 5, size=1)
        best = min(sequence_peak(held, peak, output, np.asarray([p]))[0] for p in itertools.permutations(range(b)))
        assert sequence_peak(held, peak, output, liu_order(peak, output))[0] == pytest.approx(best)


def test_a_fan_out_runs_its_branches_in_the_order_asked_with_the_same_outputs():
    fan = operators.get("gaussian,envelope+gst3d+instantaneous_phase")
    block = volume((24, 20, 18), seed=2)
    written = fan.run(block)
    reordered = fan.in_order(("gst3d", "instantaneous_phase", "envelope"))
    assert reordered.branch_order == ("gst3d", "instantaneous_phase", "envelope") and reordered.name == fan.name
    # a profile of the spec written in that order runs the same pipeline, order included
    assert operators.get(reordered.spec_in_order).branch_order == reordered.branch_order
    for a, b in zip(written, reordered.run(block)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(SpecError, match="not an order of"):
        fan.in_order(("gst3d", "envelope"))


@pytest.mark.integration
def test_a_member_without_a_model_is_named_with_the_command_that_explores_it(tmp_path, gst3d_model):
    from explorer.core import paths
    from explorer.model.memory_model import ModelNotFoundError
    from explorer.model.load import load_model

    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    with pytest.raises(ModelNotFoundError) as info:
        load_model("gaussian(sigma=1),gst3d", runs_dir=tmp_path)
    message = str(info.value)
    assert "none for its member(s) gaussian(sigma=1)" in message and "explore 'gaussian(sigma=1)'" in message


@pytest.mark.integration
def test_the_composed_model_predicts_a_real_pipeline_profile_it_never_saw(tmp_path, gst3d_model):
    """gaussian's model from six real profiles and gst3d's session model, composed: the
    pipeline's own isolated profile at held-out shapes falls under the 99% bound and
    within 5% of the mean; recommend_chunks plans with it without importing torch."""
    from explorer.core import paths
    from explorer.measure.profiling import profile
    from explorer.model.load import load_model

    fitted_model("gaussian").save(paths.model_path("gaussian", tmp_path))
    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    model = load_model("gaussian,gst3d", runs_dir=tmp_path)
    assert getattr(model, "composed", False)
    for shape in [(56, 80, 64), (90, 70, 96)]:
        truth = profile("gaussian,gst3d", shape, repeat=2)
        peak = max(r["peak_bytes"] for r in truth.repeats)
        mean, upper = model.predict(shape, 0.99)
        assert peak <= upper and abs(mean / truth.peak_bytes - 1) <= 0.05, (shape, peak, mean, upper)
    code = ("import json, sys, explorer; p = explorer.recommend_chunks('gaussian,gst3d', (300, 300, 300), '1GiB', "
            f"runs_dir={str(tmp_path)!r}, baseline_bytes=100 * 2**20, strategy='fused'); "
            "print(json.dumps([p.upper_bytes <= p.budget_bytes, 'torch' in sys.modules, list(p.halo), p.warnings]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fits, torch_imported, halo, plan_warnings = json.loads(out.stdout.strip().splitlines()[-1])
    assert fits and not torch_imported and halo == [13, 13, 13]
    assert any("no in-worker calibration for gaussian,gst3d" in w for w in plan_warnings)


@pytest.mark.integration
def test_a_fan_out_plan_from_composed_models_runs_the_branches_in_liu_order(tmp_path, gst3d_model):
    """Real models of gaussian and envelope, gst3d's session model: gst3d's working memory
    over its output (~85 B/voxel) dwarfs envelope's (~12), so the plan runs gst3d first,
    whatever the order written, and its bound is the one of that order."""
    from explorer.core import paths
    from explorer.plan.recommend import recommend_chunks
    from explorer.model.load import load_model

    for name in ("gaussian", "envelope"):
        fitted_model(name).save(paths.model_path(name, tmp_path))
    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    spec = "gaussian,envelope+gst3d"
    plan = recommend_chunks(spec, (300, 300, 300), "1GiB", runs_dir=tmp_path, baseline_bytes=100 * 2**20,
                            strategy="fused")  # a fused task runs the branches in order; staged ones run apart
    assert plan.branch_order == ("gst3d", "envelope") and plan.to_dict()["branch_order"] == ["gst3d", "envelope"]
    # a fused fan-out's finished task holds both branches' float32 outputs until they are stored
    assert plan.output_itemsize == 2 * 4 and plan.footprint.held_output_bytes == 8 * int(np.prod(plan.block))
    model = load_model(spec, runs_dir=tmp_path)
    _, liu = model.predict_many([plan.block], 0.99)
    _, written = model.predict_many([plan.block], 0.99, branch_order=("envelope", "gst3d"))
    assert liu[0] < written[0]
    chain = recommend_chunks("gaussian,gst3d", (300, 300, 300), "1GiB", runs_dir=tmp_path, baseline_bytes=100 * 2**20)
    assert chain.branch_order == ()


@pytest.mark.integration
def test_three_profiles_of_a_pipeline_with_its_composed_prior_bound_it_tighter_than_from_scratch(tmp_path,
                                                                                                 gst3d_model):
    """``explore SPEC``'s prior (issue 14 item 4), on real profiles: the composed model of
    gaussian,gst3d as the prior mean (``MeanPrior`` over the loop's target region), three
    real profiles of the pipeline: every held-out profile under both bounds, and the prior's
    bound nearer the truth than the flat prior's at every one.  (Before the surrogate knew
    the members' alike axes the flat fit from 3 profiles was more than twice as far above;
    now it is within ~8 %, so the prior's margin is smaller than that.)"""
    from explorer.core import paths
    from explorer.search.core import ExplorationCore, composed_prior
    from explorer.measure.profiling import profile
    from explorer.search.store import Record
    from explorer.model.load import load_model

    fitted_model("gaussian").save(paths.model_path("gaussian", tmp_path))
    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    spec = "gaussian,gst3d"
    op = operators.get(spec)

    def record(shape):
        m = profile(spec, shape, repeat=2)
        assert m.status == "ok", m.error
        return Record(shape, m.peak_bytes, "ok", "profile", repeats=[r["peak_bytes"] for r in m.repeats])

    train = [record(s) for s in [(40, 50, 60), (64, 64, 64), (110, 90, 80)]]
    held_out = [record(s) for s in [(56, 80, 64), (120, 100, 100)]]
    kwargs = dict(memory_limit=2**30, memory_cap=4 * 2**30)
    with_prior = ExplorationCore(spec, prior_model=composed_prior(op, tmp_path), **kwargs).fit(train)
    flat = ExplorationCore(spec, **kwargs).fit(train)
    assert with_prior.info["prior"].startswith("composed from the models of gaussian, gst3d")
    shapes = [r.shape for r in held_out]
    peaks = np.array([max(r.repeats) for r in held_out])
    _, upper_prior = with_prior.predict_many(shapes, 0.99)
    _, upper_flat = flat.predict_many(shapes, 0.99)
    assert np.all(upper_prior >= peaks) and np.all(upper_flat >= peaks), (upper_prior, upper_flat, peaks)
    assert np.all(upper_prior < upper_flat), (upper_prior / peaks, upper_flat / peaks)

    # explore's noise floor for a pipeline: its members' largest learnt run noise, which the
    # fit of three profiles (three repeat pairs) may not learn below
    floor = member_noise_floor(op, tmp_path)
    members = [load_model(name, runs_dir=tmp_path).hyperparameters for name in ("gaussian", "gst3d")]
    assert floor.relative_sd == max(h["relative_run_sd"] for h in members)
    assert floor.absolute_sd_bytes == max(h["abs_noise_sd_bytes"] for h in members)
    floored = ExplorationCore(spec, prior_model=composed_prior(op, tmp_path), noise_floor=floor, **kwargs).fit(train)
    h = floored.hyperparameters
    assert h["abs_noise_sd_bytes"] >= floor.absolute_sd_bytes * (1 - 1e-9)
    assert h["relative_run_sd"] >= floor.relative_sd * (1 - 1e-9)
    # and its bound still covers the held-out runs.  Not asserted: that it is at or above the
    # unfloored bound.  The floored fit is an ML-II fit of its own, which may give the latent part
    # less when the noise is larger: on a fresh clone (2026-11-27) it came out 0.014% below.
    assert np.all(floored.predict_many(shapes, 0.99)[1] >= peaks)


@pytest.mark.integration
def test_explore_on_a_pipeline_saves_a_model_whose_run_noise_is_no_lower_than_its_members(tmp_path, gst3d_model):
    """``explore SPEC`` end to end (real profiles, a real store): the saved model of the
    pipeline learnt its run noise with the members' floor (``member_noise_floor``)."""
    from explorer.core import paths
    from explorer.exploration import explore
    from explorer.model.load import load_model

    fitted_model("gaussian").save(paths.model_path("gaussian", tmp_path))
    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    spec = "gaussian,gst3d"
    floor = member_noise_floor(operators.get(spec), tmp_path)
    result = explore(spec, budget=3, memory_limit="64MiB", runs_dir=tmp_path, probes=0, report=False)
    assert result.profiles == 3 and result.prior.startswith("composed")
    h = load_model(spec, runs_dir=tmp_path).hyperparameters
    assert not getattr(load_model(spec, runs_dir=tmp_path), "composed", False)
    assert h["abs_noise_sd_bytes"] >= floor.absolute_sd_bytes * (1 - 1e-9)
    assert h["relative_run_sd"] >= floor.relative_sd * (1 - 1e-9)


@pytest.mark.integration
def test_a_pipelines_noise_floor_needs_every_members_model_and_a_single_operator_has_none(tmp_path, gst3d_model):
    from explorer.core import paths

    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    assert member_noise_floor(operators.get("gst3d"), tmp_path) is None
    assert member_noise_floor(operators.get("gaussian,gst3d"), tmp_path) is None  # gaussian has no model
    floor = member_noise_floor(operators.get("gst3d,gst3d"), tmp_path)
    h = gst3d_model.hyperparameters
    assert (floor.relative_sd, floor.absolute_sd_bytes) == (h["relative_run_sd"], h["abs_noise_sd_bytes"])
    assert "gst3d" in floor.source


@pytest.mark.integration
def test_recommend_weighs_fused_against_staged_by_predicted_time_among_plans_that_fit(tmp_path, gst3d_model):
    """Real models of gaussian and gst3d: ``auto`` plans both strategies and takes the one of
    least predicted seconds (``considered`` keeps both); an asked strategy is honoured; a
    single operator has one form; a staged plan needs every member's model."""
    from explorer.core import paths
    from explorer.plan.recommend import recommend_chunks
    from explorer.model.memory_model import ModelNotFoundError

    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    spec, kwargs = "gaussian,gst3d", dict(runs_dir=tmp_path, baseline_bytes=100 * 2**20, workers=2)
    with pytest.raises(ModelNotFoundError, match="none for its member.s. gaussian"):
        recommend_chunks(spec, (300, 300, 300), "1GiB", strategy="staged", **kwargs)
    fitted_model("gaussian").save(paths.model_path("gaussian", tmp_path))
    for limit in ("700MiB", "1GiB", "4GiB"):
        plan = recommend_chunks(spec, (300, 300, 300), limit, **kwargs)
        assert set(plan.considered) == {"fused", "staged"}
        fits = {k: v for k, v in plan.considered.items() if "error" not in v}
        assert plan.strategy == min(fits, key=lambda k: fits[k]["predicted_seconds"])
        assert plan.upper_bytes <= plan.budget_bytes and plan.to_dict()["strategy"] == plan.strategy
        for asked in ("fused", "staged"):
            one = recommend_chunks(spec, (300, 300, 300), limit, strategy=asked, **kwargs)
            assert one.strategy == asked and list(one.considered) == [asked]
            assert one.considered[asked] == plan.considered[asked]
    staged = recommend_chunks(spec, (300, 300, 300), "1GiB", strategy="staged", **kwargs)
    assert [s["operator"] for s in staged.stages] == ["gaussian", "gst3d"]
    from explorer.plan.grid import axis_blocks

    gst3d_halo = operators.get("gst3d").halo  # each stage's block carries its own halo, not the pipeline's
    assert staged.stages[1]["block"] == [int(axis_blocks(300, [c], h)[0]) for c, h in zip(staged.chunks, gst3d_halo)]
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.plan.recommend import plan_for_chunks, predicted_seconds

    for plan in (staged, recommend_chunks(spec, (300, 300, 300), "1GiB", strategy="fused", **kwargs)):
        again = predicted_seconds(spec, (300, 300, 300), [plan.chunks, (100, 100, 300)], strategy=plan.strategy,
                                  workers=2, runs_dir=tmp_path)  # the time model at chunks it did or did not choose
        assert again[0] == pytest.approx(plan.predicted_seconds) and again[1] > 0
        same = plan_for_chunks(spec, (300, 300, 300), plan.chunks, "1GiB", strategy=plan.strategy, **kwargs)
        assert (same.chunks, same.upper_bytes, same.strategy) == (plan.chunks, plan.upper_bytes, plan.strategy)
        assert same.predicted_seconds == pytest.approx(plan.predicted_seconds)
        other = plan_for_chunks(spec, (300, 300, 300), (100, 100, 300), "1GiB", strategy=plan.strategy, **kwargs)
        assert other.chunks == (100, 100, 300) and other.predicted_seconds == pytest.approx(again[1])
        with pytest.raises(ChunkPlanError):  # the whole volume in one task: its bound is over the limit
            plan_for_chunks(spec, (300, 300, 300), (300, 300, 300), "1GiB", strategy=plan.strategy, **kwargs)
    single = recommend_chunks("gst3d", (300, 300, 300), "1GiB", strategy="staged", **kwargs)
    assert single.strategy == "fused" and single.considered == {}
    with pytest.raises(ValueError, match="unknown strategy 'both'"):
        recommend_chunks(spec, (300, 300, 300), "1GiB", strategy="both", **kwargs)


@pytest.mark.integration
def test_explore_calibrate_probes_a_composed_model_in_workers_so_auto_weighs_fused_by_time(tmp_path, capsys):
    """Real models of envelope and gaussian, no profile of ``envelope,gaussian``: before, the
    fused plan from the composed model lacks its in-worker term (a warning naming
    ``explore calibrate``); ``explore calibrate`` runs real probes of the fused pipeline on a
    LocalCluster and saves its calibration; after, the fused plan is calibrated (its bound
    carries the excess) and no warning is left."""
    from explorer.core import paths
    from explorer.plan.recommend import recommend_chunks

    for name in ("envelope", "gaussian"):
        fitted_model(name).save(paths.model_path(name, tmp_path))
    spec, kwargs = "envelope,gaussian", dict(runs_dir=tmp_path, baseline_bytes=100 * 2**20, workers=2)
    before = recommend_chunks(spec, (256, 256, 256), "512MiB", **kwargs)
    assert before.considered["fused"]["in_worker_calibrated"] is False
    fused_before = recommend_chunks(spec, (256, 256, 256), "512MiB", strategy="fused", **kwargs)
    assert any(f"`explore calibrate {spec}`" in w for w in fused_before.warnings)

    out = subprocess.run([sys.executable, "-m", "explorer.cli", "calibrate", spec, "--memory-limit", "512MiB",
                          "--probes", "3", "--runs-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # three blocks, then the smallest again on a finer grid (a run's fixed seconds from its graph tasks')
    assert [r["status"] for r in result["runs"]] == ["ok"] * 4 and len({tuple(b) for b in result["blocks"]}) == 3
    assert result["blocks"][-1] == result["blocks"][0] and [r["grid"] for r in result["runs"]] == [2, 2, 2, 4]
    assert result["calibration"]["excess"] is not None and result["calibration"]["n_probe_groups"] >= 4
    assert result["calibration"]["timing"]["run_fixed_seconds"] is not None
    assert "[probe 4/4]" in out.stderr
    from explorer.cli_text import print_probes

    print_probes(result)  # what the command prints without --json: the learnt time terms too
    printed = capsys.readouterr().out
    assert "in-worker probes: 4 in" in printed and "ms per graph task" in printed and "s per run" in printed

    after = recommend_chunks(spec, (256, 256, 256), "512MiB", **kwargs)
    assert after.considered["fused"]["in_worker_calibrated"] is True
    fused_after = recommend_chunks(spec, (256, 256, 256), "512MiB", strategy="fused", **kwargs)
    assert not any("no in-worker calibration" in w for w in fused_after.warnings)
    assert fused_after.predicted_bytes != fused_before.predicted_bytes  # the excess is in the task's bound


@pytest.mark.integration
def test_explore_calibrate_without_a_model_is_one_line_naming_the_members_to_explore(tmp_path):
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "calibrate", "envelope,gaussian",
                          "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "explore envelope" in out.stderr and "explore gaussian" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "explorer.cli", "calibrate", "nosuchop"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown operator 'nosuchop'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_probes_of_a_composed_fan_out_run_its_branches_in_the_order_its_plans_would(tmp_path, gst3d_model):
    """The probes' tasks must be those the composed bound describes: Liu's order at the probe's block."""
    from explorer.core import paths
    from explorer.runner.probes import _branch_order, profiled_volume
    from explorer.model.load import load_model

    for name in ("gaussian", "envelope"):
        fitted_model(name).save(paths.model_path(name, tmp_path))
    gst3d_model.save(paths.model_path("gst3d", tmp_path))
    model = load_model("gaussian,envelope+gst3d", runs_dir=tmp_path)
    assert _branch_order(model, (64, 64, 64), 0.99) == ("gst3d", "envelope") == model.branch_order((64, 64, 64))
    assert _branch_order(gst3d_model, (64, 64, 64), 0.99) is None
    # every member was profiled at least this far (each member's largest profiled block: 100^3)
    assert profiled_volume(model) == min(profiled_volume(m) for m in model.members.values()) == 100**3


class Wavy(Known):
    """A member whose bounds are not monotone in the block (a GP's need not be): bytes per
    voxel times a ripple in each dim, so a ceiling's shortcut cannot lean on monotonicity."""

    def predict_many(self, shapes, confidence=0.99):
        s = np.asarray(shapes, dtype=float).reshape(-1, 3)
        ripple = 1.0 + 0.3 * np.sin(s / 37.0).prod(1)
        return self.a * s.prod(1) * ripple, self.b * s.prod(1) * ripple


def wavy_members():
    return {"gaussian": Wavy(20.0, 23.0), "envelope": Wavy(16.0, 19.0), "gst3d": Wavy(90.0, 99.0),
            "instantaneous_phase": Wavy(12.0, 13.0)}


@pytest.mark.parametrize("spec", ["gaussian,gst3d", "gaussian,envelope+gst3d+instantaneous_phase",
                                  "gaussian,envelope,gaussian"])
def test_a_composed_models_ceiling_only_stops_short_on_blocks_above_it(spec):
    from explorer.model.composed import ComposedModel

    pipeline = operators.get(spec)
    shapes = np.random.default_rng(5).integers(8, 400, size=(300, 3))
    exact_mean, exact_upper = ComposedModel(pipeline, wavy_members()).predict_many(shapes, 0.99)
    ceiling = np.random.default_rng(6).uniform(0.5, 1.5, size=300) * exact_upper
    model = ComposedModel(pipeline, wavy_members())
    for _ in range(2):  # the first call ranks the members (heaviest first), the second prunes with them
        mean, upper = model.predict_many(shapes, 0.99, ceiling=ceiling)
        short = np.isnan(mean)
        np.testing.assert_array_equal(mean[~short], exact_mean[~short])
        np.testing.assert_array_equal(upper[~short], exact_upper[~short])
        assert np.all(upper[short] > ceiling[short]) and np.all(upper[short] <= exact_upper[short])
        assert not short[exact_upper <= ceiling].any()
    assert short.any()


@pytest.mark.parametrize("limit", [1.2, 3.0, 12.0, 0.45])  # GiB; the last fits nothing
@pytest.mark.parametrize("threads, workers", [(1, 1), (4, 8)])
def test_a_fused_plan_of_a_composed_model_is_the_plan_of_its_full_predictions(limit, threads, workers):
    """The planner's ceiling lets a composed model skip members on blocks that cannot fit:
    the plan (or the no-fit message) is the one predicting every member everywhere gives."""
    from explorer.plan.task_model import TaskModel
    from explorer.plan.chunk_plan import ChunkPlanError
    from explorer.plan.planner import plan_chunks
    from explorer.plan.predictor import takes_keywords
    from explorer.plan.spec import VolumeGeometry, WorkerSpec
    from explorer.model.composed import ComposedModel

    pipeline = operators.get("gaussian,envelope+gst3d+instantaneous_phase")
    model = TaskModel(ComposedModel(pipeline, wavy_members()))

    @takes_keywords("tasks")
    def full(shapes, confidence=0.99, tasks=1):  # no ceiling: every member predicted on every block
        return model.predict_many(shapes, confidence, tasks)

    def plan(predict):
        try:
            return plan_chunks(VolumeGeometry((2000, 1600, 1200), pipeline.halo), predict,
                               WorkerSpec(int(limit * 2**30), 300 * 2**20, threads_per_worker=threads, workers=workers))
        except ChunkPlanError as exc:
            return str(exc)

    pruned, unpruned = plan(model.predict_many), plan(full)
    if isinstance(unpruned, str):
        assert pruned == unpruned and limit < 1
        return
    assert pruned.to_dict() == {**unpruned.to_dict(), "n_candidates": pruned.n_candidates}
