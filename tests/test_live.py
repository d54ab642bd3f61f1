"""Live observation on a real LocalCluster, a real SQLite store, real SEG-Y files and a
surrogate fitted from real profiles; calibration saved, loaded and widening the bound."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

import operators
from explorer import live
from explorer.highwater import is_supported
from explorer.store import Store

pytestmark = pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

OPERATOR = "gst3d"
VOLUME = (64, 48, 40)
CHUNKS = (32, 24, 40)  # 2 x 2 x 1 tasks
LIMIT = 2**30


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=LIMIT, processes=True,
                                  dashboard_address=None, silence_logs=50,
                                  scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        with distributed.Client(cluster) as c:
            yield c


@pytest.fixture(scope="module")
def segy(tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "in.sgy"
    operators.write_segy(path, operators.synthetic_volume(VOLUME, seed=1))
    return path


@functools.lru_cache(maxsize=None)
def fitted_gst3d_model():
    """gst3d's surrogate fitted from five real isolated profiles (two runs each); fitted
    once per test session (``tests/test_daskrun.py`` uses it too).  None when the
    surrogate or botorch is missing."""
    try:
        import botorch  # noqa: F401

        from explorer import surrogate
    except ImportError:
        return None
    from explorer.profiling import profile

    shapes = [(24, 24, 24), (40, 30, 50), (60, 60, 40), (30, 70, 60), (74, 58, 50)]
    peaks, noise = [], []
    for shape in shapes:
        m = profile(OPERATOR, shape, repeat=2)
        assert m.status == "ok", m.error
        runs = [r["peak_bytes"] for r in m.repeats]
        peaks.append(np.mean(runs))
        noise.append(np.var(runs, ddof=1) / len(runs))
    return surrogate.fit(OPERATOR, shapes, peaks, noise, np.zeros(len(shapes), bool),
                         halo=operators.get(OPERATOR).halo, n_repeats=[2] * len(shapes))


@pytest.fixture(scope="module")
def model():
    fitted = fitted_gst3d_model()
    if fitted is None:
        pytest.skip("explorer.surrogate or botorch is not available to fit a model")
    return fitted


def expected_blocks(shape, chunks, halo):
    """The block each map_overlap task sees: the chunk plus the halo on each side that has a neighbour."""
    per_axis = []
    for n, c, h in zip(shape, chunks, halo):
        starts = list(range(0, n, c))
        per_axis.append([min(s + c, n) - s + (h if s > 0 else 0) + (h if s + c < n else 0) for s in starts])
    return sorted((a, b, c) for a in per_axis[0] for b in per_axis[1] for c in per_axis[2])


def compute(segy, out):
    op = operators.get(OPERATOR)
    da.to_zarr(op.dask(operators.read_segy(segy, chunks=CHUNKS)), str(out))


# --------------------------------------------------------------------------- observation


def test_observations_are_stored_at_once_with_blocks_peaks_and_context(client, segy, tmp_path):
    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store, context={"run": "test"}) as observer:
        compute(segy, tmp_path / "out.zarr")
    records = store.records(OPERATOR, source="production")
    blocks = expected_blocks(VOLUME, CHUNKS, operators.get(OPERATOR).halo)
    assert observer.recorded == len(records) == len(blocks) == 4
    assert sorted(r.shape for r in records) == blocks
    for r in records:
        assert r.source == "production" and r.status == "ok"
        assert r.peak_bytes > 0 and r.context["run_peak_bytes"] > 0
        assert r.context["threads_per_worker"] == 1
        assert r.context["memory_limit_bytes"] == LIMIT
        assert r.context["cluster"] == "LocalCluster"
        assert r.context["run"] == "test"
        assert r.context["exact"] is True  # one thread per worker
        # The task (overlap concatenation + run + trim + zarr store, fused) contains the
        # run; only memory released by the worker's event loop between the task's start
        # and the run's start (input pieces, a chunk each at most) can make it smaller.
        assert r.peak_bytes >= r.context["run_peak_bytes"] - 4 * 4 * math.prod(r.shape) - 2**20
    assert observer.tasks_over_bound == 0  # no model given: nothing to compare


def test_in_worker_peak_is_plausible_against_the_isolated_profile(client, segy, tmp_path):
    from explorer.profiling import profile

    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr")
    largest = max(observer.observations, key=lambda o: math.prod(o.shape))
    isolated = profile(OPERATOR, largest.shape, repeat=2)
    assert isolated.status == "ok"
    # Same definition, same block: the run inside the worker is close to the isolated
    # profile (reused free heap can make it a little smaller), and the whole task adds
    # the overlap concatenation and the zarr write (a few block-sized buffers) at most.
    block_bytes = 4 * math.prod(largest.shape)
    assert 0.8 * isolated.peak_bytes <= largest.run_peak_bytes <= 1.3 * isolated.peak_bytes + 8 * 2**20
    assert 0.8 * isolated.peak_bytes <= largest.peak_bytes <= 1.3 * isolated.peak_bytes + 4 * block_bytes + 16 * 2**20


def test_tasks_are_found_whatever_fusion_names_them(client, segy, tmp_path):
    """Fusion names the task that calls ``run`` after other layers: with dask/distributed
    2026.8, ``overlap-...`` when computed to NumPy and ``overlap-store-map-...`` when
    stored to zarr (``trim-...`` with the local scheduler's optimisation).  Never the
    operator's name: tasks are recognised by the ``run`` they call."""
    from dask.utils import key_split

    op = operators.get(OPERATOR)
    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        client.compute(op.dask(operators.read_segy(segy, chunks=CHUNKS))).result()
    assert len(observer.observations) == 4
    numpy_keys = {key_split(eval(o.key)) for o in observer.observations}
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr")
    zarr_keys = {key_split(eval(o.key)) for o in observer.observations}
    assert len(observer.observations) == 4 and len(numpy_keys) == len(zarr_keys) == 1
    assert OPERATOR not in numpy_keys | zarr_keys and "run" not in numpy_keys | zarr_keys


def test_the_run_hook_exists_only_while_observing(client, tmp_path):
    def hooked():
        import operators

        return bool(getattr(type(operators.get("gst3d")).run, "__explorer_observed__", False))

    assert not any(client.run(hooked).values())
    with live.observe(client, OPERATOR, store=Store(tmp_path)):
        assert all(client.run(hooked).values())
    assert not any(client.run(hooked).values())


def test_tasks_over_the_bound_are_counted_and_warned(client, segy, tmp_path, model):
    store = Store(tmp_path)
    # A model that under-predicts by half: every task is over its bound.
    low = model.with_calibration(0.5, 0.0)
    with pytest.warns(RuntimeWarning, match="bound"):
        with live.observe(client, OPERATOR, store=store, model=low) as observer:
            compute(segy, tmp_path / "low.zarr")
    assert observer.tasks_over_bound == len(observer.observations) == 4
    assert all(o.peak_bytes > o.upper_bytes for o in observer.over_bound)
    stored = store.records(OPERATOR, source="production")
    assert all(r.context["upper_bytes"] is not None for r in stored)

    # A generous one: none is.
    with live.observe(client, OPERATOR, store=store, model=model.with_calibration(3.0, 0.0)) as observer:
        compute(segy, tmp_path / "high.zarr")
    assert observer.tasks_over_bound == 0 and len(observer.observations) == 4


# --------------------------------------------------------------------------- calibration


def test_calibration_is_saved_loaded_and_widens_the_bound(client, segy, tmp_path, model):
    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr")
    observed = observer.observations

    cal = live.calibration(OPERATOR, store, model, runs_dir=tmp_path)
    assert cal.n == len(observed) == 4
    ratios = [o.peak_bytes / model.predict(o.shape)[0] for o in observed]
    assert cal.ratio_mean == pytest.approx(np.mean(ratios), rel=1e-6)
    assert cal.mean >= max(1.0, cal.ratio_mean) - 1e-12 and cal.var > 0
    mean, var = cal  # unpacks as what with_calibration takes

    path = live.calibration_path(OPERATOR, tmp_path)
    saved = json.loads(path.read_text())
    assert saved["mean"] == mean and saved["var"] == var and saved["n"] == 4
    assert live.load_calibration(OPERATOR, tmp_path) == (mean, var)

    calibrated = model.with_calibration(*live.load_calibration(OPERATOR, tmp_path))
    for o in observed:
        assert calibrated.predict(o.shape)[1] > model.predict(o.shape)[1]  # wider
        assert calibrated.predict(o.shape)[1] >= o.peak_bytes  # covers every task


def test_a_task_over_the_bound_widens_the_next_bound(tmp_path, model):
    """Twenty tasks 20% above the isolated prediction and one 60% above: the spread alone
    would not cover the outlier, so the calibration's variance is raised until the
    calibrated upper bound covers every observed task."""
    store = Store(tmp_path)
    shapes = [(40 + i, 34, 40) for i in range(20)] + [(50, 50, 40)]
    factors = [1.2] * 20 + [1.6]
    for shape, f in zip(shapes, factors):
        store.add_observation(OPERATOR, shape, f * model.predict(shape)[0], context={"exact": True})
    store.add_observation(OPERATOR, (50, 50, 50), 10 * model.predict((50, 50, 50))[0],
                          context={"exact": False})  # concurrent tasks: left out
    cal = live.calibration(OPERATOR, store, model, runs_dir=tmp_path)
    assert cal.n == 21
    assert cal.max_ratio == pytest.approx(1.6, rel=1e-6)
    over = sum(f * model.predict(s)[0] > model.predict(s)[1] for s, f in zip(shapes, factors))
    assert cal.n_over_uncalibrated_bound == over >= 1
    assert cal.coverage_raised
    calibrated = model.with_calibration(*cal)
    for shape, f in zip(shapes, factors):
        assert calibrated.predict(shape, 0.99)[1] >= f * model.predict(shape)[0]


def test_calibration_of_in_worker_peaks_below_the_isolated_never_shrinks(tmp_path, model):
    store = Store(tmp_path)
    for shape in [(40, 40, 40), (44, 40, 40), (40, 44, 40)]:
        store.add_observation(OPERATOR, shape, 0.7 * model.predict(shape)[0], context={"exact": True})
    cal = live.calibration(OPERATOR, store, model, runs_dir=tmp_path, save=False)
    assert cal.ratio_mean == pytest.approx(0.7, rel=1e-6)
    from explorer.calibration import MIN_APPLIED_RATIO

    assert cal.mean == MIN_APPLIED_RATIO
    assert not live.calibration_path(OPERATOR, tmp_path).exists()


def test_no_exact_observation_means_no_calibration(tmp_path, model):
    store = Store(tmp_path)
    store.add_observation(OPERATOR, (40, 40, 40), 1e7, context={"exact": False})
    assert live.calibration(OPERATOR, store, model, runs_dir=tmp_path) is None
    assert live.load_calibration(OPERATOR, tmp_path) is None


def test_load_calibration_treats_a_malformed_file_as_absent(tmp_path):
    path = live.calibration_path(OPERATOR, tmp_path)
    path.parent.mkdir(parents=True)
    for text in ("", "{", json.dumps({"mean": -1, "var": 0}), json.dumps({"mean": 1.0})):
        path.write_text(text)
        assert live.load_calibration(OPERATOR, tmp_path) is None
    path.write_text(json.dumps({"mean": 1.1, "var": 0.01}))
    assert live.load_calibration(OPERATOR, tmp_path) == (1.1, 0.01)


# --------------------------------------------------------------------------- high-water intervals


def test_high_water_intervals_fold_before_each_reset_and_flag_overlap():
    """An allocation freed before a second measurement begins still counts for the first:
    the current VmHWM is folded into open intervals before each reset."""
    hw = live._HighWater()
    hw.begin("a", owner="task-a")
    big = np.ones(64 * 2**20 // 8)  # 64 MiB of fresh (mmapped) pages touched, then freed
    del big
    hw.begin("b", owner="task-b")  # resets VmHWM: without folding, task a's peak is lost
    b = hw.end("b")
    a = hw.end("a")
    assert a[0] >= 60 * 2**20
    assert b[0] < 60 * 2**20
    assert a[3] is False and b[3] is False  # overlapping tasks: not exact
    hw.begin("c", owner="task-c")
    c = hw.end("c")
    assert c[3] is True
    assert hw.lifetime_peak >= a[2]


def test_nested_measurements_of_the_same_task_stay_exact():
    hw = live._HighWater()
    hw.begin("task", owner="k")
    hw.begin("run", owner="k")
    arr = np.ones(40 * 2**20 // 8)  # above glibc's largest mmap threshold (32 MiB): fresh pages
    run = hw.end("run")
    task = hw.end("task")
    del arr
    assert run[3] is True and task[3] is True
    assert task[0] >= run[0] >= 39 * 2**20


def test_observations_arrive_from_a_thread_pool_worker_with_two_threads(segy, tmp_path):
    """With T = 2 the figures are the process's growth during each task: marked
    ``exact`` only when no other task ran meanwhile, and left out of the calibration."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=LIMIT, processes=True,
                                  dashboard_address=None, silence_logs=50,
                                  scheduler_kwargs={"dashboard_address": ":0"}) as cluster:
        with distributed.Client(cluster) as c:
            store = Store(tmp_path)
            with live.observe(c, OPERATOR, store=store) as observer:
                compute(segy, tmp_path / "out.zarr")
    assert observer.recorded == 4
    records = store.records(OPERATOR, source="production")
    assert all(r.context["threads_per_worker"] == 2 for r in records)
    assert any(r.context["exact"] is False for r in records)
