"""The learning loop end to end: real profiles, a real SQLite store, a real fit."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from explorer import load_model, recommend_chunks
from explorer.exploration import explore
from explorer.search.store import Store

OPERATOR = "first_derivative"  # cheap: a few ms per profile
LIMIT = "64MiB"


@pytest.fixture(scope="module")
def explored(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    seen = []
    # a tolerance no model reaches: the loop spends its budget
    result = explore(OPERATOR, budget=9, tolerance=1e-6, memory_limit=LIMIT, runs_dir=runs,
                     progress=lambda s, b: seen.append(s), report=True)
    return runs, result, seen


def test_explore_profiles_persists_fits_and_reports(explored):
    runs, result, seen = explored
    assert result.profiles == result.new_profiles == len(seen) == 9
    assert result.stopped_because.startswith("budget")
    assert result.max_relative_uncertainty is not None and result.max_relative_uncertainty > 0
    records = Store(runs).records(OPERATOR, source="profile")
    assert len(records) == result.profiles and all(r.status == "ok" for r in records)
    assert len({r.shape for r in records}) == len(records)  # never the same shape twice
    assert os.path.getsize(result.report_path) > 10_000
    timings = result.timings  # where the wall time went (explore --timings)
    assert timings["profiling (fork, IPC, operator)"]["count"] == 9 and timings["ML-II fits"]["count"] >= 1
    assert timings["inside the operator"]["seconds"] == pytest.approx(result.operator_seconds, abs=1e-3)
    assert sum(t["seconds"] for name, t in timings.items() if name in (
        "store", "start (candidates, priors)", "ask (fits, evidence, acquisition)", "profiling (fork, IPC, operator)",
        "conclude (final fit, evidence)", "save", "in-worker probes")) <= result.seconds
    model = load_model(OPERATOR, runs)
    assert model.n_observations == result.profiles
    # the planner's time model starts from the operator's own profiled speed: b of a + b V
    seconds = np.array([r.seconds for r in records])
    volume = np.array([np.prod(r.shape) for r in records], dtype=float)
    b = model.info["seconds_per_voxel"]
    assert 0 < b <= seconds.max() / volume[seconds.argmax()] * 2


def test_explore_ends_with_in_worker_probes_and_saves_the_calibration(explored, capsys):
    from explorer.plan.calibration import load_calibration
    from explorer.measure.worker_baseline import baseline_path

    runs, result, _ = explored
    probes = result.probes
    assert probes["runs"] and all(run["status"] == "ok" for run in probes["runs"]), probes
    probe_records = Store(runs).records(OPERATOR, source="probe")
    assert len({r.context["run"] for r in probe_records}) == len(probes["runs"]) >= 3
    assert all(r.context["exact"] for r in probe_records)
    cal = load_calibration(OPERATOR, runs)
    # the smallest block once more on a finer grid, whose interior tasks see blocks of their own
    first, last = probes["runs"][0], probes["runs"][-1]
    assert last["block"] == first["block"] and (first["grid"], last["grid"]) == (2, 4)
    assert last["n_tasks"] == 64 and {r.context["grid"] for r in probe_records} == {2, 4}
    assert cal.excess is not None and cal.n_probe_groups > len(probes["runs"]) and cal.stale == []
    assert cal.timing.seconds_per_voxel > 0 and cal.timing.n_runs == len(probes["runs"])
    assert cal.timing.run_fixed_seconds is not None and cal.timing.graph_task_seconds is not None
    saved = json.loads(baseline_path(OPERATOR, runs).read_text())
    assert saved["baseline_bytes"] == probes["baseline_bytes"] > 50 * 2**20
    # the loop learnt blocks up to the largest the probes could reach in their seconds, which they did not pass
    model = load_model(OPERATOR, runs)
    region = model.info["region_max_block_voxels"]
    assert model.info["explored_with"]["probe_seconds"] == 20.0
    assert region is not None and max(np.prod(b, dtype=float) for b in probes["blocks"]) <= region
    assert result.region_max_block_voxels == result.to_dict()["region_max_block_voxels"] == region
    from explorer.cli_text import print_explore

    print_explore(result)  # explore says where its target region stopped, and why
    assert f"target region: blocks up to {region:,.0f} voxels" in capsys.readouterr().out
    assert saved["environment"]["dask"] is not None


def test_explore_again_on_the_same_profiles_and_settings_reuses_the_saved_model(explored, tmp_path):
    """Paid once: nothing is profiled, refitted or saved, the probes are not run again; other
    settings, or refresh, let the loop decide again."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(explored[0], runs)
    path = runs / OPERATOR / "model.npz"
    before = path.read_bytes()
    again = explore(OPERATOR, budget=9, tolerance=1e-6, memory_limit=LIMIT, runs_dir=runs)
    assert again.reused and again.new_profiles == 0 and again.profiles == 9 and again.converged is False
    assert path.read_bytes() == before and again.model_path == str(path)
    assert "ML-II fits" not in again.timings and "profiling (fork, IPC, operator)" not in again.timings
    assert "skipped" in again.probes and again.stopped_because == explored[1].stopped_because
    other = explore(OPERATOR, budget=9, tolerance=0.5, memory_limit=LIMIT, runs_dir=runs, probes=0)
    assert not other.reused and other.new_profiles == 0 and path.read_bytes() != before
    refreshed = explore(OPERATOR, budget=9, tolerance=0.5, memory_limit=LIMIT, runs_dir=runs, probes=0, refresh=True)
    assert not refreshed.reused
    assert explore(OPERATOR, budget=9, tolerance=0.5, memory_limit=LIMIT, runs_dir=runs, probes=0).reused


def test_model_predicts_a_fresh_profile(explored):
    """The fitted bound holds on a shape the loop never profiled."""
    from explorer.measure.profiling import profile

    runs, _, _ = explored
    model = load_model(OPERATOR, runs)
    shape = (150, 90, 300)
    truth = profile(OPERATOR, shape, repeat=1).peak_bytes
    mean, upper = model.predict(shape)
    assert abs(mean - truth) / truth < 0.05
    assert upper >= truth


def test_a_model_fitted_on_fewer_profiles_does_not_replace_a_better_informed_one(explored, tmp_path):
    """What a slower explore process sharing the store must not do at the end."""
    import operators
    from explorer.model import fit
    from explorer.exploration import save_model_unless_superseded
    from explorer.search.core import training_data

    runs, _, _ = explored
    records = Store(runs).records(OPERATOR, source="profile")
    shapes, values, noise, lower, n_repeats = training_data(records[:-1])
    fewer = fit.fit(OPERATOR, shapes, values, noise, lower, halo=operators.get(OPERATOR).halo,
                          n_repeats=n_repeats)
    path = tmp_path / "model.npz"
    load_model(OPERATOR, runs).save(path)
    before = path.read_bytes()
    kept = save_model_unless_superseded(fewer, path)
    assert path.read_bytes() == before and kept.n_observations == len(records)
    assert save_model_unless_superseded(kept, path) is kept  # the same shapes: saved again
    (tmp_path / "other").mkdir()
    assert save_model_unless_superseded(fewer, tmp_path / "other" / "model.npz") is fewer  # nothing there yet


def test_recommend_chunks_uses_the_explored_model(explored):
    runs, _, _ = explored
    plan = recommend_chunks(OPERATOR, (400, 300, 500), "512MiB", runs_dir=runs)
    assert plan.upper_bytes <= 0.8 * 512 * 2**20 + 1
    assert sum(plan.dask_chunks[0]) == 400 and plan.chunks[2] >= 3


def run_cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_json_last_and_chunks(explored):
    runs, result, _ = explored
    out = run_cli(OPERATOR, "--budget", str(result.profiles), "--memory-limit", LIMIT, "--runs-dir", str(runs),
                  "--json", "--timings")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("operator", "profiles", "stopped_because", "seconds", "max_relative_uncertainty", "probes",
                "reused", "timings", "regime"):
        assert key in data
    assert data["regime"] == load_model(OPERATOR, runs).regime  # the saved model's boundary, or None
    assert "where the" in out.stderr and "ask (fits, evidence, acquisition)" in out.stderr
    assert data["profiles"] == len(Store(runs).records(OPERATOR, source="profile")) >= result.profiles
    assert data["stopped_because"].startswith("budget")
    assert "skipped" in data["probes"]  # nothing new profiled: the saved calibration still holds
    chunks = run_cli("chunks", OPERATOR, "--shape", "400x300x500", "--memory-limit", "512MiB",
                     "--runs-dir", str(runs), "--json")
    assert chunks.returncode == 0, chunks.stderr
    plan = json.loads(chunks.stdout)
    for key in ("chunks", "predicted_bytes", "upper_bytes", "limit_bytes", "confidence", "n_tasks"):
        assert key in plan


def _profiling_servers() -> set[int]:
    import psutil

    return {c.pid for c in psutil.Process().children() if "explorer.measure.forkserver" in " ".join(c.cmdline())}


def test_explore_that_fails_before_its_loop_leaves_no_profiling_server(tmp_path):
    """With no saved model the servers start before the store opens: a store that cannot open
    must still close them."""
    before = _profiling_servers()
    with pytest.raises(Exception, match="cannot open storage"):
        explore(OPERATOR, runs_dir=tmp_path, storage="nosuchdb://x", probes=0)
    assert _profiling_servers() == before


def test_chunks_without_a_model_names_the_command(tmp_path):
    out = run_cli("chunks", "gst3d", "--shape", "100x100x100", "--memory-limit", "1GiB", "--runs-dir",
                  str(tmp_path))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "explore gst3d" in out.stderr


def test_sigkill_loses_no_finished_profile_and_resume_goes_on(tmp_path):
    args = [sys.executable, "-m", "explorer.cli", OPERATOR, "--budget", "40", "--tolerance", "0.000001",
            "--memory-limit", LIMIT, "--runs-dir", str(tmp_path)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    reported = 0
    while reported < 3:
        line = proc.stderr.readline()
        if not line:  # it ended (or closed stderr) before its third profile: the assertion below says so
            break
        if line.startswith("["):
            reported = int(line[1:].split("/")[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    records = Store(tmp_path).records(OPERATOR, source="profile")
    assert len(records) >= reported >= 3
    whole = [(r.shape, r.status, r.peak_bytes, r.repeats) for r in records]
    # a block of a few KiB may measure 0: its working set can fit the heap's free resident memory
    # (docs/definitions.md); every finished profile is whole, with both runs
    assert all(status == "ok" and peak is not None and peak >= 0 and len(repeats) == 2
               for _, status, peak, repeats in whole), whole
    assert any(peak > 0 for _, _, peak, _ in whole), whole
    resumed = explore(OPERATOR, budget=len(records) + 1, tolerance=1e-6, memory_limit=LIMIT, runs_dir=tmp_path, probes=0)
    assert resumed.new_profiles == 1 and resumed.profiles == len(records) + 1
    assert resumed.stopped_because.startswith("budget")
    # a library call writes its picture only when asked (report=True; the CLI asks)
    assert resumed.report_path is None and not (tmp_path / OPERATOR / "report.png").exists()


def test_cli_run_then_report_learn_from_production(explored, tmp_path):
    """explore run on a real SEG-Y and a real LocalCluster, then explore report."""
    import operators

    runs, _, _ = explored
    source = tmp_path / "in.sgy"
    operators.write_segy(source, operators.synthetic_volume((48, 40, 64), seed=3))
    out = run_cli("run", OPERATOR, str(source), "--output", str(tmp_path / "out.zarr"), "--memory-limit", "400MiB",
                  "--workers", "1", "--runs-dir", str(runs), "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("chunks", "seconds", "worker_peak_bytes", "workers_restarted", "status", "observations_recorded",
                "tasks_over_bound"):
        assert key in data
    assert data["status"] == "ok" and data["workers_restarted"] == 0 and len(data["worker_peak_bytes"]) == 1
    assert data["observations_recorded"] == data["n_tasks"] >= 1
    production = Store(runs).records(OPERATOR, source="production")
    assert len(production) == data["observations_recorded"]

    report = run_cli("report", OPERATOR, "--runs-dir", str(runs), "--json")
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["rows"]
    assert {row["source"] for row in rows} == {"profile", "probe", "production"}
    assert os.path.getsize(runs / OPERATOR / "report.png") > 10_000


@pytest.mark.parametrize("args, fragment", [
    (["run", OPERATOR, "/no/such/file.sgy", "--output", "x.zarr"], "does not exist"),
    (["run", OPERATOR, "tests/data/xtgeo_ex1_missing_traces_75x71x26_unknownprov.segy", "--output", "x.zarr",
      "--chunks", "auto"], "no regular 3D grid"),
    (["run", OPERATOR, "in.sgy", "--output", "x.zarr", "--chunks", "10x10"], "has 2 axes"),
    (["run", OPERATOR, "in.sgy"], "--output"),
    (["report", "nosuchop"], "unknown operator"),
])
def test_cli_run_bad_input_is_one_line(args, fragment, tmp_path):
    out = run_cli(*args)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], out.stderr


@pytest.mark.unit
def test_region_design_takes_one_shape_per_band_of_task_memory_spread_in_log_dims():
    """``region_design``: ``n`` distinct shapes, one from each equal-count band of the sorted
    task memory, each the farthest (log-dims) from those picked before; deterministic."""
    from explorer.search.core import region_design

    rng = np.random.default_rng(3)
    shapes = np.rint(np.exp(rng.uniform(np.log(8), np.log(1024), size=(200, 3)))).astype(int)
    task = shapes.prod(1) * 40.0
    design = region_design(shapes, task, 5)
    assert design.shape == (5, 3) and len({tuple(s) for s in design}) == 5
    order = np.argsort(task, kind="stable")
    bands = np.array_split(order, 5)
    index = [int(np.flatnonzero((shapes == s).all(1))[0]) for s in design]
    assert [any(i in b for b in [band]) for i, band in zip(index, bands)] == [True] * 5
    # spread: the picks are farther apart in log-dims than 5 shapes taken at the bands' middles
    def min_gap(s):
        z = np.log(np.asarray(s, float))
        d = np.sqrt(((z[:, None] - z[None]) ** 2).sum(2))
        return d[np.triu_indices(len(z), 1)].min()
    middles = shapes[[b[len(b) // 2] for b in bands]]
    assert min_gap(design) > min_gap(middles)
    assert (region_design(shapes, task, 5) == design).all()
    with pytest.raises(ValueError, match="at least 5"):
        region_design(shapes[:4], task[:4], 5)


def test_a_fit_in_the_fits_process_is_the_fit_here_raises_as_here_and_outlives_its_process():
    import psutil

    from explorer.model.fit import fit
    from explorer.model.fit_process import FitProcess

    rng = np.random.default_rng(0)
    shapes = rng.integers(16, 200, size=(8, 3))
    peaks = 90.0 * shapes.prod(axis=1) * (1 + 0.01 * rng.standard_normal(8)) + 2**22
    data = (shapes, peaks, (0.005 * peaks) ** 2, np.zeros(8, bool))
    declared = {"block_multiple": (1, 1, 1), "axis_classes": (0, 0, 0)}  # gst3d's, passed: no registry there
    targets = rng.integers(16, 300, size=(50, 3))
    here = fit("gst3d", *data, **declared).predict_many(targets, 0.99)
    with FitProcess() as fits:
        there = fits("gst3d", *data, **declared).predict_many(targets, 0.99)
        for a, b in zip(there, here):
            np.testing.assert_array_equal(a, b)  # the same fit, to the bit
        with pytest.raises(ValueError, match="same length"):
            fits("gst3d", shapes, peaks[:-1], *data[2:], **declared)
        child, = [p for p in psutil.Process().children() if "explorer.model.fit_process" in " ".join(p.cmdline())]
        child.kill()
        child.wait(10)
        after = fits("gst3d", *data, **declared).predict_many(targets, 0.99)  # fitted here now
        np.testing.assert_array_equal(after[1], here[1])
        assert not [p for p in psutil.Process().children() if "explorer.model.fit_process" in " ".join(p.cmdline())]
