"""Production runs on real LocalClusters, real SEG-Y files and a real SQLite store."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import operators
from explorer.daskrun import run
from explorer.highwater import is_supported

distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

OPERATOR = "gst3d"
VOLUME = (48, 40, 36)
LIMIT = 2**30
CLUSTER_OPTIONS = dict(processes=True, dashboard_address=None, silence_logs=50,
                       scheduler_kwargs={"dashboard_address": ":0"})


@pytest.fixture(scope="module")
def cluster():
    """Two workers x one thread, 1 GiB each: the cluster that ``scheduler=`` runs use."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=LIMIT,
                                  **CLUSTER_OPTIONS) as c:
        yield c


@pytest.fixture(scope="module")
def volume():
    return operators.synthetic_volume(VOLUME, seed=2)


@pytest.fixture(scope="module")
def segy(tmp_path_factory, volume):
    path = tmp_path_factory.mktemp("daskrun") / "in.sgy"
    operators.write_segy(path, volume)
    return path


@pytest.fixture(scope="module")
def expected(volume):
    return operators.get(OPERATOR).run(volume)


@pytest.fixture
def model_runs(tmp_path):
    """A fresh runs directory holding only gst3d's surrogate (fitted from real profiles)."""
    from explorer import paths
    from tests.test_live import fitted_gst3d_model

    model = fitted_gst3d_model()
    if model is None:
        pytest.skip("explorer.surrogate or botorch is not available to fit a model")
    runs_dir = tmp_path / "model-runs"
    model.save(paths.model_path(OPERATOR, runs_dir))
    return runs_dir


def assert_equal_to_numpy(result, expected):
    tolerance = {"rtol": 1e-5, "atol": 1e-6 * float(np.abs(expected).max())}
    np.testing.assert_allclose(result, expected, **tolerance)


def n_blocks(shape, chunks):
    return int(np.prod([-(-n // c) for n, c in zip(shape, chunks)]))


# --------------------------------------------------------------------------- own LocalCluster


def test_explicit_chunks_on_its_own_local_cluster_write_a_segy_equal_to_numpy(segy, expected, tmp_path):
    progress = []
    out = tmp_path / "out.sgy"
    r = run(OPERATOR, segy, out, chunks="24x20x36", workers=2, threads_per_worker=1, memory_limit="1GiB",
            runs_dir=tmp_path / "runs", progress=lambda done, total: progress.append((done, total)))
    assert r.status == "ok", r.error
    assert r.chunks == [24, 20, 36] and r.chunks_source == "explicit"
    assert r.n_tasks == 4 and r.shape == list(VOLUME)
    assert r.memory_limit_bytes == 2**30 and r.n_workers == 2 and r.threads_per_worker == 1
    assert len(r.workers) == len(r.worker_peak_bytes) == 2
    assert all(p > 0 for p in r.worker_peak_bytes)
    assert len(r.worker_hwm_bytes) == 2 and all(p > 0 for p in r.worker_hwm_bytes)
    assert r.workers_restarted == 0 and r.memory_kills == 0 and r.advice is None
    assert r.seconds > 0 and r.wall_seconds >= r.seconds
    assert r.observations_recorded == 4  # refine is on by default
    assert r.tasks_over_bound is None  # no model to compare with
    assert progress[-1] == (4, 4) and all(t == 4 for _, t in progress)
    data = operators.read_segy(out).compute()
    assert_equal_to_numpy(data, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.sgy", "runs"]  # no partial left
    json.dumps(r.to_dict())


@pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")
def test_a_worker_lost_to_memory_fails_the_run_with_advice_and_no_hang(tmp_path):
    """One 140^3 chunk of gst3d takes about 250 MiB beyond a worker's ~150 MiB: with a
    250 MB limit the nanny kills the worker at 95%, twice (allowed-failures 1)."""
    source = tmp_path / "big.sgy"
    operators.write_segy(source, operators.synthetic_volume((140, 140, 140), seed=0))
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(run, OPERATOR, source, tmp_path / "out.zarr", chunks="140x140x140", workers=1,
                             memory_limit="250MB", runs_dir=tmp_path / "runs", stall_seconds=20)
        r = future.result(timeout=90)  # never hang
    assert time.monotonic() - started < 90
    assert r.status == "failed", r.to_dict()
    assert r.memory_kills >= 1 and r.workers_restarted >= 1
    assert "lost to memory" in r.error and "KilledWorker" in r.error
    assert "memory limit" in r.advice and "lower the chunk size" in r.advice
    assert "Traceback" not in (r.error + r.advice) and "\n" not in r.error
    assert not (tmp_path / "out.zarr").exists()
    assert not any(p.name.startswith("out.zarr.partial") for p in tmp_path.iterdir())


def test_workers_paused_for_good_end_the_run_instead_of_hanging(tmp_path):
    """100 MB per worker: pause at 80 MB, below what an idle worker process holds, so no
    task ever starts; the run is given up after ``stall_seconds``."""
    source = tmp_path / "small.sgy"
    operators.write_segy(source, operators.synthetic_volume((24, 24, 24), seed=0))
    with ThreadPoolExecutor(1) as pool:
        r = pool.submit(run, OPERATOR, source, tmp_path / "out.zarr", chunks="12x12x24", workers=1,
                        memory_limit="100MB", refine=False, stall_seconds=2).result(timeout=60)
    assert r.status == "failed", r.to_dict()
    assert "paused" in r.error and "\n" not in r.error
    assert "raise --memory-limit" in r.advice
    assert not any(p.name.startswith("out.zarr") for p in tmp_path.iterdir())


# --------------------------------------------------------------------------- existing cluster


def test_scheduler_address_runs_on_the_existing_cluster_with_explicit_chunks(cluster, segy, expected, tmp_path):
    out = tmp_path / "out.zarr"
    r = run(OPERATOR, segy, out, scheduler=cluster.scheduler_address, chunks=(16, 20, 36),
            runs_dir=tmp_path / "runs")
    assert r.status == "ok", r.error
    assert r.scheduler == cluster.scheduler_address
    assert r.n_workers == 2 and r.threads_per_worker == 1 and r.memory_limit_bytes == LIMIT
    assert r.chunks == [16, 20, 36] and r.n_tasks == n_blocks(VOLUME, r.chunks) == 6
    assert len(r.worker_peak_bytes) == 2 and all(p > 0 for p in r.worker_peak_bytes)
    assert r.workers_restarted == 0
    assert r.observations_recorded == 6
    assert_equal_to_numpy(zarr.open_array(str(out), mode="r")[:], expected)
    # The cluster is left running, with no observation plugin behind.
    with distributed.Client(cluster.scheduler_address) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        assert not any(name.startswith("memory-explorer") for name in
                       client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)))


def test_auto_chunks_are_reported(cluster, segy, tmp_path):
    r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, chunks="auto",
            refine=False)
    assert r.status == "ok", r.error
    x = operators.read_segy(segy, chunks="auto")
    assert r.chunks == [c[0] for c in x.chunks] and r.chunks_source == "auto"
    assert r.observations_recorded == 0 and r.tasks_over_bound is None


def test_model_chunks_follow_recommend_chunks_and_refine_the_calibration(cluster, segy, expected, model_runs,
                                                                         tmp_path):
    from explorer.chunking import recommend_chunks
    from explorer.live import calibration_path, load_calibration

    r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, runs_dir=model_runs)
    assert r.status == "ok", r.error
    plan = recommend_chunks(OPERATOR, VOLUME, LIMIT, threads_per_worker=1, runs_dir=model_runs,
                            workers=r.n_workers)
    assert r.chunks_source == "model" and r.plan["chunks"] == list(plan.chunks) == r.chunks
    assert r.observations_recorded == r.n_tasks
    assert isinstance(r.tasks_over_bound, int)
    assert r.calibration is not None and r.calibration["n"] == r.n_tasks
    assert calibration_path(OPERATOR, model_runs).exists()
    assert load_calibration(OPERATOR, model_runs) == (r.calibration["mean"], r.calibration["var"])
    assert_equal_to_numpy(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:], expected)


def test_bad_input_ends_as_one_line_errors(cluster, segy, tmp_path):
    cases = [
        dict(operator="no_such_operator", input_path=segy, output_path=tmp_path / "o.zarr"),
        dict(operator=OPERATOR, input_path=tmp_path / "missing.sgy", output_path=tmp_path / "o.zarr"),
        dict(operator=OPERATOR, input_path=segy, output_path=tmp_path / "o.txt"),
        dict(operator=OPERATOR, input_path=segy, output_path=tmp_path / "o.zarr", chunks="12xx3"),
        dict(operator=OPERATOR, input_path=segy, output_path=tmp_path / "o.zarr", chunks="model",
             runs_dir=tmp_path / "empty-runs"),
    ]
    for case in cases:
        case = dict(case)
        r = run(case.pop("operator"), case.pop("input_path"), case.pop("output_path"),
                scheduler=cluster.scheduler_address, **case)
        assert r.status == "error", case
        assert r.error and "\n" not in r.error and "Traceback" not in r.error
    assert "explore gst3d" in r.error  # no model: the command that makes one


# --------------------------------------------------------------------------- re-planning


def test_recommend_chunks_applies_the_saved_calibration(model_runs, tmp_path):
    """A production calibration (in-worker peaks 3x the isolated ones) makes plans smaller."""
    import shutil

    from explorer import chunking, live

    probe = tmp_path / "probe-runs"
    shutil.copytree(model_runs, probe)
    before = chunking.recommend_chunks(OPERATOR, (96, 96, 96), "250MB", runs_dir=probe)
    live.calibration_path(OPERATOR, probe).write_text(json.dumps({"mean": 3.0, "var": 0.0}))
    after = chunking.recommend_chunks(OPERATOR, (96, 96, 96), "250MB", runs_dir=probe)
    assert after.n_tasks > before.n_tasks


@pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")
def test_a_task_over_the_bound_early_restarts_the_run_with_the_recalibrated_plan(
        model_runs, tmp_path):
    from explorer import live
    from explorer.chunking import recommend_chunks

    runs = model_runs
    # A calibration that under-predicts by 15%: the first plan is too large, its tasks exceed the bound.
    live.calibration_path(OPERATOR, runs).write_text(json.dumps({"mean": 0.85, "var": 0.0}))
    shape, limit = (96, 96, 96), "250MB"
    first = recommend_chunks(OPERATOR, shape, limit, runs_dir=runs)
    assert first.n_tasks >= 3
    source = tmp_path / "in.sgy"
    volume = operators.synthetic_volume(shape, seed=4)
    operators.write_segy(source, volume)

    r = run(OPERATOR, source, tmp_path / "out.zarr", workers=1, memory_limit=limit, runs_dir=runs)
    assert r.status == "ok", r.error
    assert r.replanned_from == [list(first.chunks)], r.warnings
    assert r.chunks != list(first.chunks) and r.n_tasks > first.n_tasks
    assert r.tasks_over_bound >= 1 and any("bound" in w for w in r.warnings)
    assert r.calibration["mean"] > 0.85
    # the saved calibration now covers what was seen, and the next plan is the widened one
    assert live.load_calibration(OPERATOR, runs) == (r.calibration["mean"], r.calibration["var"])
    again = recommend_chunks(OPERATOR, shape, limit, runs_dir=runs)
    assert again.n_tasks > first.n_tasks and again.upper_bytes <= again.budget_bytes
    assert_equal_to_numpy(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:],
                          operators.get(OPERATOR).run(volume))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.sgy", "model-runs", "out.zarr"]  # no partial output left
    from explorer.store import Store

    records = Store(runs).records(OPERATOR, source="production")
    assert len(records) == r.observations_recorded >= r.n_tasks + 1
    assert {tuple(rec.context["chunks"]) for rec in records} == {tuple(first.chunks), tuple(r.chunks)}
