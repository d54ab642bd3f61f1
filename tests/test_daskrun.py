"""Production runs on real LocalClusters, real SEG-Y files and a real SQLite store."""

from __future__ import annotations

import json
import os
import math
from concurrent.futures import ThreadPoolExecutor

import distributed
import numpy as np
import pytest
import zarr

import operators
from explorer.runner.context import MAX_TRIALS
from explorer.runner.daskrun import RunError, run
from explorer.measure.highwater import is_supported
from explorer.measure.local_cluster import local_cluster

OPERATOR = "gst3d"
VOLUME = (48, 40, 36)
LIMIT = 2**30


@pytest.fixture(scope="module")
def cluster():
    """Two workers x one thread, 1 GiB each: the cluster that ``scheduler=`` runs use."""
    with local_cluster(2, memory_limit=LIMIT) as c:
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
def model_runs(tmp_path, gst3d_model):
    """A fresh runs directory holding only gst3d's surrogate (fitted from real profiles)."""
    from explorer.core import paths

    runs_dir = tmp_path / "model-runs"
    gst3d_model.save(paths.model_path(OPERATOR, runs_dir))
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
    r = run(OPERATOR, segy, out, chunks="24x20x36", workers=2, threads=1, memory_limit="1GiB",
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
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(run, OPERATOR, source, tmp_path / "out.zarr", chunks="140x140x140", workers=1,
                             memory_limit="250MB", runs_dir=tmp_path / "runs", stall_seconds=20)
        with pytest.raises(RunError) as raised:  # check=True, the default: a library run raises
            future.result(timeout=600)  # never hang
    r = raised.value.result
    assert r.status == "failed", r.to_dict()
    assert str(raised.value).startswith(f"{OPERATOR} run failed: {r.error}") and r.advice in str(raised.value)
    assert r.memory_kills >= 1 and r.workers_restarted >= 1
    assert "lost to memory" in r.error and "KilledWorker" in r.error
    assert "memory limit" in r.advice and "lower the chunk size" in r.advice
    assert "Traceback" not in (r.error + r.advice) and "\n" not in r.error
    assert not (tmp_path / "out.zarr").exists()
    assert not any("out.zarr" in p.name for p in tmp_path.iterdir())  # no output, no partial


def small_cluster(limit, **kwargs):
    return local_cluster(1, memory_limit=limit, **kwargs)


def test_workers_paused_for_good_mid_run_end_the_run_instead_of_hanging(tmp_path, monkeypatch):
    """A leaking operator keeps, on its first block, what puts its 1000 MB worker halfway
    between the pause (800 MB) and terminate (950 MB) thresholds, and returns once the worker
    has paused (``harness.plugin_ops.Leaks``): paused for good with tasks left, the run is given
    up after ``stall_seconds``."""
    monkeypatch.setenv("EXPLORER_PLUGINS", "harness.plugin_ops")
    source = tmp_path / "small.sgy"
    operators.write_segy(source, operators.synthetic_volume((96, 96, 24), seed=0))
    with small_cluster("1000MB") as c, ThreadPoolExecutor(1) as pool:
        r = pool.submit(run, "test_leaks", source, tmp_path / "out.zarr", chunks="24x24x24",
                        scheduler=c.scheduler_address, refine=False, stall_seconds=2,
                        check=False).result(timeout=600)  # never hang
    assert r.status == "failed", r.to_dict()
    assert "paused" in r.error and "\n" not in r.error
    assert "raise --memory-limit" in r.advice
    assert not any(p.name.startswith("out.zarr") for p in tmp_path.iterdir())


def test_workers_whose_idle_memory_is_above_the_pause_threshold_fail_at_once(tmp_path, monkeypatch):
    """A preload of 300 MiB on 500 MB workers: idle above the 400 MB pause threshold, so no
    task would ever run; the run says so before starting (no computation: no seconds), instead
    of waiting for a stall (whose error would say "no progress for 600 s")."""
    monkeypatch.setenv("EXPLORER_TEST_PRELOAD_MIB", "300")
    source = tmp_path / "small.sgy"
    operators.write_segy(source, operators.synthetic_volume((24, 24, 24), seed=0))
    with small_cluster("500MB", preload=["harness.heavy_preload"]) as c:
        r = run(OPERATOR, source, tmp_path / "out.zarr", chunks="12x12x24", scheduler=c.scheduler_address,
                refine=False, stall_seconds=600, check=False)
    assert r.status == "failed" and "above its pause threshold" in r.error and "\n" not in r.error
    assert r.seconds is None and "no progress" not in r.error
    assert r.worker_baseline_bytes > 300 * 2**20 and "raise --memory-limit" in r.advice
    assert not any(p.name.startswith("out.zarr") for p in tmp_path.iterdir())


# --------------------------------------------------------------------------- existing cluster


def _spike_and_free(megabytes: int) -> int:
    import numpy as np

    spike = np.ones(megabytes * 2**20, dtype=np.uint8)  # touched: resident
    total = int(spike[:: 4096].sum())
    del spike
    return total


@pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")
def test_a_run_on_a_long_lived_cluster_reports_its_own_high_water_mark(cluster, segy, tmp_path):
    """Earlier work on the workers (a 400 MiB spike, freed) is not this run's peak."""
    with distributed.Client(cluster.scheduler_address) as client:
        client.run(_spike_and_free, 400)
    r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, chunks=(16, 20, 36),
            refine=False)
    assert r.status == "ok", r.error
    assert all(h is not None and h < r.worker_baseline_bytes + 200 * 2**20 for h in r.worker_hwm_bytes), \
        (r.worker_hwm_bytes, r.worker_baseline_bytes)


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
    assert not any("worker-saturation" in w for w in r.warnings), r.warnings  # ours hands out one task a thread
    assert_equal_to_numpy(zarr.open_array(str(out), mode="r")[:], expected)
    # The cluster is left running, with no observation plugin behind.
    with distributed.Client(cluster.scheduler_address) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        assert not any(name.startswith("memory-explorer") for name in
                       client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)))


def test_auto_chunks_are_reported_on_a_cluster_given_by_its_client(cluster, segy, tmp_path):
    with distributed.Client(cluster) as client:
        r = run(OPERATOR, segy, tmp_path / "out.zarr", client=client, chunks="auto", refine=False)
        assert client.status == "running"  # the caller's client is left open
        with pytest.raises(ValueError, match="scheduler or client"):
            run(OPERATOR, segy, tmp_path / "o.zarr", client=client, scheduler=cluster.scheduler_address)
    assert r.status == "ok" and r.scheduler == cluster.scheduler_address, r.error
    x = operators.read_segy(segy, chunks="auto")
    assert r.chunks == [c[0] for c in x.chunks] and r.chunks_source == "auto"
    assert r.observations_recorded == 0 and r.tasks_over_bound is None


def test_the_workers_first_touch_is_measured_on_them_and_a_saved_rate_is_kept(cluster, tmp_path):
    """``first_touch=True`` touches memory on every worker until it reaches pages the machine has
    not used lately (a real LocalCluster): a rate of at least 0 s per byte once some worker did,
    none when no worker did (within a quarter of its 1 GiB), and the warm bytes each found;
    without it nothing is measured.  This machine's saved baseline keeps its rate when a later
    one measured none (``recommend_chunks`` outside a run charges at it), and a plan for workers
    of this machine that found no cold page charges it beyond their warm bytes."""
    from dataclasses import replace

    from distributed import Client

    from explorer.measure.worker_baseline import _load_local, measure_worker_baseline, save_worker_baseline

    with Client(cluster) as client:
        timed = measure_worker_baseline(client, OPERATOR, first_touch=True)
        untimed = measure_worker_baseline(client, OPERATOR)
    assert timed.first_touch_warm_bytes is not None and timed.first_touch_warm_bytes > 0
    if timed.first_touch_seconds_per_byte is None:
        assert timed.first_touch_warm_bytes >= LIMIT // 4 - 2 * 2**20 * 16
    else:
        assert timed.first_touch_seconds_per_byte >= 0
    assert untimed.first_touch_seconds_per_byte is None and untimed.first_touch_warm_bytes is None
    runs = tmp_path / "runs"
    save_worker_baseline(OPERATOR, replace(timed, first_touch_seconds_per_byte=1.5e-9), runs)
    assert _load_local(OPERATOR, runs).first_touch_seconds_per_byte == 1.5e-9
    save_worker_baseline(OPERATOR, untimed, runs)  # nothing measured: the saved rate stays
    assert _load_local(OPERATOR, runs).first_touch_seconds_per_byte == 1.5e-9
    # A run's workers that found no cold page: their warm bytes bound the warm memory from below,
    # and the pages beyond are charged at the rate saved for their machine, not at nothing.
    import operators
    from explorer.plan.recommend import _PlanRequest

    warm = replace(timed, first_touch_seconds_per_byte=None, first_touch_warm_bytes=96 * 2**20)
    elsewhere = replace(warm, environment={**warm.environment, "hostname": "another-host"})

    def charged(baseline):
        request = _PlanRequest(OPERATOR, operators.get(OPERATOR), VOLUME, LIMIT, 1, 0.99, runs, 2, baseline)
        return request.first_touch()["first_touch"]

    assert charged(warm).seconds_per_byte == 1.5e-9 and charged(warm).warm_bytes == 96 * 2**20
    assert charged(elsewhere) is None  # another machine's workers: no rate known for them
    assert charged(replace(warm, first_touch_seconds_per_byte=4e-10)).seconds_per_byte == 4e-10  # measured: theirs


def test_model_chunks_follow_recommend_chunks_with_the_clusters_baseline(cluster, segy, expected, model_runs,
                                                                         tmp_path):
    from explorer.plan.calibration import calibration_path
    from explorer.plan.recommend import recommend_chunks
    from explorer.search.store import Store

    r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, runs_dir=model_runs)
    assert r.status == "ok", r.error
    assert r.worker_baseline_bytes > 50 * 2**20
    plan = recommend_chunks(OPERATOR, VOLUME, LIMIT, threads_per_worker=1, runs_dir=model_runs,
                            workers=r.n_workers, baseline_bytes=r.worker_baseline_bytes)
    assert r.chunks_source == "model" and r.plan["chunks"] == list(plan.chunks) == r.chunks
    assert r.plan["baseline_bytes"] == r.worker_baseline_bytes and r.plan["baseline_source"] == "cluster"
    assert any("no in-worker calibration" in w for w in r.warnings)  # the model was saved without probes
    assert r.observations_recorded == r.n_tasks
    assert isinstance(r.tasks_over_bound, int)
    assert r.calibration is not None and r.calibration["n_tasks"] == r.n_tasks
    assert calibration_path(OPERATOR, model_runs).exists()
    runs = Store(model_runs).records(OPERATOR, source="run")
    assert len(runs) == 1 and runs[0].context["run"] == r.run_id and runs[0].context["n_tasks"] == r.n_tasks
    assert runs[0].context["baseline_bytes"] == r.worker_baseline_bytes
    assert r.plan["read_unit"] == [1, 1, VOLUME[2]]  # the SEG-Y's traces, which each task reads whole
    for task in Store(model_runs).records(OPERATOR, source="production"):
        assert task.context["read_unit"] == [1, 1, VOLUME[2]] and task.context["volume_shape"] == list(VOLUME)
        assert 0 < task.context["read_seconds"] < task.context["task_seconds"] - task.context["run_seconds"] + 1e-3
    assert_equal_to_numpy(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:], expected)


def test_a_task_whose_chunk_the_volume_does_not_fill_is_bounded_with_its_store_chunk(cluster, segy, model_runs,
                                                                                     tmp_path):
    """40 crosslines in chunks of 15: the third chunk along that axis is 10 long, and its task merges
    it into a whole 16x15x36 store chunk; the observer adds that chunk to those tasks' bound only."""
    from explorer.search.store import Store

    r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=cluster.scheduler_address, chunks=(16, 15, 36),
            runs_dir=model_runs)
    assert r.status == "ok", r.error
    tasks = Store(model_runs).records(OPERATOR, source="production")
    assert len(tasks) == r.n_tasks == 3 * 3
    store_chunk = 16 * 15 * 36 * 4
    for task in tasks:
        index = task.context["chunk_index"]
        assert task.context["store_chunk_bytes"] == (store_chunk if index[1] == 2 else 0), index
    by_shape = {}
    for task in tasks:
        by_shape.setdefault((tuple(task.shape), task.context["first_in_run"]), set()).add(
            task.context["upper_bytes"] - task.context["store_chunk_bytes"])
    assert all(len(bounds) == 1 for bounds in by_shape.values()), by_shape  # the model's bound, then the term


def test_bad_input_ends_as_one_line_errors(cluster, segy, tmp_path):
    cases = [
        dict(operator="no_such_operator", input=segy, output=tmp_path / "o.zarr"),
        dict(operator=OPERATOR, input=tmp_path / "missing.sgy", output=tmp_path / "o.zarr"),
        dict(operator=OPERATOR, input=segy, output=tmp_path / "o.txt"),
        dict(operator=OPERATOR, input=segy, output=tmp_path / "o.zarr", chunks="12xx3"),
        dict(operator=OPERATOR, input=segy, output=tmp_path / "o.zarr", chunks="model",
             runs_dir=tmp_path / "empty-runs"),
    ]
    for case in cases:
        case = dict(case)
        args = case.pop("operator"), case.pop("input"), case.pop("output")
        r = run(*args, scheduler=cluster.scheduler_address, check=False, **case)
        assert r.status == "error", case
        assert r.error and "\n" not in r.error and "Traceback" not in r.error
        with pytest.raises(RunError, match="run error: ") as raised:
            run(*args, scheduler=cluster.scheduler_address, **case)
        assert raised.value.result.error == r.error
    assert "explore gst3d" in r.error  # no model: the command that makes one


# --------------------------------------------------------------------------- re-planning


@pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")
def test_a_task_over_the_bound_early_restarts_the_run_with_the_recalibrated_plan(tmp_path, gst3d_model,
                                                                                  probed_runs, monkeypatch):
    """A calibration learnt against another fit of the model (as after a refit without new
    probes), and a model that under-predicts by 30%: the first plan is too large, its first
    task exceeds the bound, recalibration against this model shows the plan no longer fits,
    and the run restarts, once, with the recalibrated plan.  (By half, the first plan's task,
    with nothing else held beside it now that it reads its own block, could reach the nanny's
    terminate threshold before the re-planner saw it: a worker restart, 1 run in 4.)  At 180 MB the
    first plan's bound is at its budget; at 260 MB it would stop at the largest probed block
    (100^3) with room to spare, and an exceeded task would rightly not re-plan it.

    Ordered, not raced: a production task runs far longer than the re-planner's decision, these
    take a fraction of a second, so the first plan could finish (and the run end, rightly not
    restarted) before the decision.  The run's progress callback holds its main loop at the
    start of the first plan until the real re-planner has decided (its ``_decide`` wrapped, not
    replaced); the workers go on meanwhile, and a restart cancels what is left, done or not."""
    import shutil
    import threading

    from explorer.core import paths
    from explorer.model import fit
    from explorer.plan.recommend import recommend_chunks
    from explorer.runner import monitor
    from explorer.search.store import Store

    decided = threading.Event()
    decide = monitor._Replanner._decide

    def decide_and_tell(replanner):
        final = decide(replanner)
        if final:
            decided.set()
        return final

    monkeypatch.setattr(monitor._Replanner, "_decide", decide_and_tell)
    totals = []

    def progress(done, total):
        if done == 0:
            totals.append(total)
            if len(totals) == 1:
                decided.wait(timeout=600)  # bounded: without a decision the assertions below say so

    runs = tmp_path / "model-runs"
    shutil.copytree(probed_runs, runs)
    n = len(gst3d_model.train_bytes)
    low = fit.fit(OPERATOR, gst3d_model.train_shapes, 0.7 * gst3d_model.train_bytes, np.zeros(n),
                        np.zeros(n, bool), halo=gst3d_model.halo, n_repeats=[2] * n)
    low.save(paths.model_path(OPERATOR, runs))
    shape, limit = (160, 160, 160), "180MB"
    source = tmp_path / "in.sgy"
    volume = operators.synthetic_volume(shape, seed=4)
    operators.write_segy(source, volume)

    r = run(OPERATOR, source, tmp_path / "out.zarr", workers=1, memory_limit=limit, runs_dir=runs, progress=progress)
    assert r.status == "ok", (r.error, r.warnings)
    assert decided.is_set() and len(totals) == 2, (totals, r.warnings)
    assert len(r.replanned_from) == 1, r.warnings
    assert r.chunks != r.replanned_from[0] and r.tasks_over_bound >= 1 and r.workers_restarted == 0
    assert any("restarted with the recalibrated plan" in w for w in r.warnings)
    assert r.calibration["excess"] is not None
    # the saved calibration is the recalibrated one: the next plan is no larger than the restart's
    again = recommend_chunks(OPERATOR, shape, limit, runs_dir=runs, baseline_bytes=r.worker_baseline_bytes)
    assert math.prod(again.chunks) <= math.prod(r.replanned_from[0]) and again.upper_bytes <= again.budget_bytes
    assert_equal_to_numpy(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:],
                          operators.get(OPERATOR).run(volume))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.sgy", "model-runs", "out.zarr"]  # no partial left
    records = Store(runs).records(OPERATOR, source="production")
    assert len(records) == r.observations_recorded >= r.n_tasks + 1
    assert {tuple(rec.context["chunks"]) for rec in records} == {tuple(r.replanned_from[0]), tuple(r.chunks)}


# --------------------------------------------------------------------------- the bound holds in the workers


@pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_task_and_worker_stays_under_the_plans_bound(threads, tmp_path, probed_runs, monkeypatch):
    """Two workers x 1, 2 or 4 threads x 1 GiB on a 160^3 volume, chunks from the model with
    its in-worker calibration (real probes) and the cluster's measured baseline, on the first
    production run: every task's measured peak is under its bound (exact with one thread; the
    task term of T concurrent tasks with several), and every worker's kernel high-water mark
    is under the plan's upper footprint."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(probed_runs, runs)
    source = tmp_path / "in.sgy"
    shape = (160, 160, 160)
    operators.write_segy(source, operators.synthetic_volume(shape, seed=5))
    # The run is seconds long: its trials would not repay themselves (TRIAL_SHARE); let them run
    # anyway, as they do before a long run, to see what they do.
    monkeypatch.setattr("explorer.runner.trials.TRIAL_SHARE", 1e9)
    with local_cluster(2, threads_per_worker=threads, memory_limit="1GiB") as c:
        r = run(OPERATOR, source, tmp_path / "out.zarr", scheduler=c.scheduler_address, runs_dir=runs)
    assert r.status == "ok", r.error
    assert r.threads_per_worker == threads and r.workers_restarted == 0
    assert r.plan["baseline_source"] == "cluster" and r.plan["threads_per_worker"] == threads
    assert not any("no in-worker calibration" in w for w in r.warnings)
    assert r.observations_recorded == r.n_tasks >= 2
    assert r.tasks_over_bound == 0, r.warnings
    assert all(h is not None and h <= r.plan["upper_bytes"] for h in r.worker_hwm_bytes), \
        (r.worker_hwm_bytes, r.plan["upper_bytes"])
    # Before the run, one-thread workers timed the plan's block (the probes' cubes are not it) and
    # its compact neighbour's, as probes of their own; the plan run is one whose block they timed.
    # Workers of several threads time nothing: their tasks share the cores, unlike the probes'.
    from explorer.search.store import Store

    if threads > 1:
        assert r.trials == []
        return
    assert r.trials and all(t["status"] == "ok" and t["measured_seconds_per_voxel"] > 0 for t in r.trials), r.trials
    assert r.plan["block_clocked"] or len(r.trials) == MAX_TRIALS
    tried = [rec for rec in Store(runs).records(OPERATOR, source="probe") if "trial" in rec.context]
    assert {tuple(rec.shape) for rec in tried} == {tuple(t["block"]) for t in r.trials}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.sgy", "out.zarr", "runs"]  # trial files removed


def test_the_trials_time_the_plans_the_time_model_tied_with_the_plan(probed_runs):
    """The plans a trial times (``_trial_plans``): the plan, its compact neighbour, then each plan
    the time model tied with it (``ChunkPlan.tied``), so that the plan made again after the trials
    chooses among them on the workers' measured times; each the plan of those chunks, none twice."""
    from types import SimpleNamespace

    from explorer.plan.candidates import compact_neighbour
    from explorer.plan.recommend import plan_for_chunks, recommend_chunks
    from explorer.runner.trials import _trial_plans

    shape, limit = (256, 256, 256), 1 << 30
    plan = recommend_chunks(OPERATOR, shape, limit, runs_dir=probed_runs, workers=2, baseline_bytes=300 << 20)
    assert plan.tied, "no tie to try: pick a scenario whose plan has one"
    ctx = SimpleNamespace(operator=SimpleNamespace(name=OPERATOR), shape=shape, limit=limit, plan=plan, threads=1,
                          confidence=0.99, runs_dir=probed_runs, result=SimpleNamespace(n_workers=2),
                          baseline=300 << 20, run_input=None)
    plans = _trial_plans(ctx)
    wanted = [tuple(plan.chunks), tuple(compact_neighbour(plan))] + [tuple(t["chunks"]) for t in plan.tied]
    assert [tuple(p.chunks) for p in plans] == list(dict.fromkeys(wanted))
    for p in plans[1:]:
        assert p == plan_for_chunks(OPERATOR, shape, p.chunks, limit, runs_dir=probed_runs, workers=2,
                                    baseline_bytes=300 << 20)


def test_probes_run_on_the_users_cluster_and_measure_its_workers(tmp_path):
    """``client=``: the in-worker probes run on a `dask scheduler` + `dask worker` cluster whose
    preload holds 200 MiB; the result names its scheduler and workers, and the baseline carries
    the preload (the whole explore-then-run on such a cluster: ``scripts/cluster_probes.py``)."""
    from distributed import Client

    from explorer.measure.worker_baseline import baseline_path
    from explorer.runner.probes import run_probes
    from harness.cluster import user_cluster
    from harness.models import fitted_gst3d_model

    env = {**os.environ, "EXPLORER_TEST_PRELOAD_MIB": "200"}
    with user_cluster(workers=1, memory_limit="1GiB", preload=("harness.heavy_preload",), env=env) as address:
        with Client(address) as client:
            cluster_workers = set(client.scheduler_info(n_workers=-1)["workers"])
            result = run_probes(OPERATOR, fitted_gst3d_model(), n=1, runs_dir=tmp_path / "runs", client=client)
    assert [r.status for r in result.runs] == ["ok", "ok"]
    assert result.scheduler == address and set(result.workers) == cluster_workers
    assert result.baseline_bytes > 200 * 2**20
    assert not baseline_path(OPERATOR, tmp_path / "runs").exists()  # a cluster's baseline is not this machine's


def test_a_run_on_a_scheduler_that_hands_out_task_pairs_says_so(segy, tmp_path):
    """A `dask scheduler` at Dask's default worker-saturation (1.1) gives a one-thread worker two
    root tasks at a time; the time model prices one per free thread, and the run says so."""
    from harness.cluster import user_cluster

    with user_cluster(workers=1) as address:
        r = run(OPERATOR, segy, tmp_path / "out.zarr", scheduler=address, chunks=(16, 20, 36), refine=False)
    assert r.status == "ok", r.error
    assert [w for w in r.warnings if "worker-saturation is 1.1" in w and "2 root tasks at a time" in w], r.warnings


@pytest.mark.unit
@pytest.mark.parametrize("saturation, threads, held", [(1.0, 1, None), (1.1, 1, "2 root tasks"), (1.0, 4, None),
                                                       (1.1, 4, "5 root tasks"), (1.05, 10, "11 root tasks"),
                                                       (float("inf"), 2, "every root task at once")])
def test_the_saturation_warning_names_the_tasks_a_worker_holds(saturation, threads, held):
    from explorer.measure.local_cluster import saturation_warning

    warning = saturation_warning(saturation, threads)
    assert (warning is None) if held is None else (held in warning)


@pytest.mark.unit
def test_trials_run_only_when_they_may_repay_themselves():
    from explorer.runner.context import TRIAL_SHARE
    from explorer.runner.trials import skipped_because

    assert skipped_because(1.0, 100.0) is None  # 1% of the run: worth trying the candidates
    assert skipped_because(TRIAL_SHARE * 100.0, 100.0) is None
    why = skipped_because(6.0, 2.5)  # issue 36's case: 11 s of trials before 2.5 s of computing
    assert why and "6.0 s" in why and "2.5 s" in why and "untried" in why
    assert skipped_because(6.0, None) is None  # no predicted time: nothing to weigh, the trials run


@pytest.mark.unit
def test_trials_stop_once_their_measured_seconds_would_pass_the_share():
    """The survey issue 36 measured: a run predicted at 41 s, its trials' computing predicted at
    1-3 s each but taking 4-6 s each with their input, set-up and refit: the budget (10%: 4.1 s)
    learns the overhead from the first trial and runs no second."""
    from explorer.runner.trials import TrialBudget

    budget = TrialBudget.of_run(41.0, overhead=1.0, share=0.1)
    assert budget.seconds == pytest.approx(4.1)
    assert budget.allows(2.8) and budget.predict(2.8) == pytest.approx(3.8)
    budget.spend(5.9, 2.8)  # measured: 3.1 s beyond its computing
    assert budget.overhead == pytest.approx(3.1) and budget.spent == pytest.approx(5.9)
    assert not budget.allows(0.5)
    why = budget.why_not(0.5, 1)
    assert "after 1 trial(s) (5.9 s)" in why and "about 3.6 s" in why and "4.1 s" in why
    # a long run affords several
    long = TrialBudget.of_run(600.0, overhead=1.0)
    for _ in range(4):
        assert long.allows(3.0)
        long.spend(6.0, 3.0)
    assert long.spent == pytest.approx(24.0) and long.spent <= long.seconds
    assert TrialBudget.of_run(None, 1.0).allows(1e9)  # no predicted run time: nothing to weigh


def test_explicit_chunks_merged_by_the_halo_are_the_chunks_reported(tmp_path, segy, cluster):
    """`--chunks 1x1x1` ran 8x8x8 and printed 1x1x1: a chunk shorter than the halo is merged
    with its neighbour (as Dask's overlap does), and the result says what ran."""
    r = run(OPERATOR, segy, tmp_path / "out.zarr", chunks=(2, 40, 36), scheduler=cluster.scheduler_address,
            refine=False, trials=False)
    halo = operators.get(OPERATOR).halo[0]
    assert r.status == "ok" and r.chunks[0] >= halo and r.chunks[1:] == [40, 36]
    assert any(w.startswith(f"chunks 2x40x36 become {r.chunks[0]}x40x36") and "merged" in w for w in r.warnings)

