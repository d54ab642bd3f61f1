"""Live observation on a real LocalCluster, a real SQLite store, real SEG-Y files and a
surrogate fitted from real profiles."""

from __future__ import annotations

import math

import dask.array as da
import distributed
import numpy as np
import pytest

import operators
from explorer.measure import inworker
from explorer.runner import live
from explorer.measure.highwater import is_supported
from explorer.search.store import Store
from explorer.measure.local_cluster import local_cluster

pytestmark = pytest.mark.skipif(not is_supported(), reason="needs Linux /proc/self/clear_refs")

OPERATOR = "gst3d"
VOLUME = (64, 48, 40)
CHUNKS = (32, 24, 40)  # 2 x 2 x 1 tasks
LIMIT = 2**30


@pytest.fixture(scope="module")
def client():
    with local_cluster(1, memory_limit=LIMIT) as cluster:
        with distributed.Client(cluster) as c:
            yield c


@pytest.fixture(scope="module")
def segy(tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "in.sgy"
    operators.write_segy(path, operators.synthetic_volume(VOLUME, seed=1))
    return path


@pytest.fixture(scope="module")
def model(gst3d_model):
    return gst3d_model


class Scaled:
    """A real model whose predictions are scaled by ``factor`` (a deliberately wrong model)."""

    def __init__(self, model, factor):
        self.model, self.factor = model, factor

    def predict(self, shape, confidence=0.99):
        mean, upper = self.model.predict(shape, confidence)
        return self.factor * mean, self.factor * upper


def expected_blocks(shape, chunks, halo):
    """The block each map_overlap task sees: the chunk plus the halo on each side that has a neighbour."""
    per_axis = []
    for n, c, h in zip(shape, chunks, halo):
        starts = list(range(0, n, c))
        per_axis.append([min(s + c, n) - s + (h if s > 0 else 0) + (h if s + c < n else 0) for s in starts])
    return sorted((a, b, c) for a in per_axis[0] for b in per_axis[1] for c in per_axis[2])


def compute(segy, out, observer):
    op = operators.get(OPERATOR)
    da.to_zarr(op.dask(operators.read_segy(segy, chunks=CHUNKS), wrap=observer.wrap), str(out))


# --------------------------------------------------------------------------- observation


def test_observations_are_stored_at_once_with_blocks_peaks_and_context(client, segy, tmp_path):
    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store, context={"run": "test"}) as observer:
        compute(segy, tmp_path / "out.zarr", observer)
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
        # The worker's managed memory around the task: at least the task's own input chunk
        # is held when it starts.
        assert r.context["managed_before_bytes"] >= 4 * math.prod(CHUNKS) - 2**20
        assert r.context["managed_after_bytes"] >= 0
        # The task (overlap concatenation + run + trim + zarr store, fused) contains the
        # run; only memory released by the worker's event loop between the task's start
        # and the run's start (input pieces, a chunk each at most) can make it smaller.
        assert r.peak_bytes >= r.context["run_peak_bytes"] - 4 * 4 * math.prod(r.shape) - 2**20
    assert observer.tasks_over_bound == 0  # no model given: nothing to compare


def test_a_tasks_seconds_are_its_compute_as_the_worker_records_it(client, segy, tmp_path):
    """``task_seconds`` is the compute interval distributed records for the task (its task
    stream's ``compute``), not the plugin's interval between transitions, which holds the
    event loop's latency; the other tasks' seconds are theirs, likewise."""
    store = Store(tmp_path)
    with distributed.get_task_stream(client) as stream:
        with live.observe(client, OPERATOR, store=store) as observer:
            compute(segy, tmp_path / "out.zarr", observer)
    compute_seconds = {}
    for task in stream.data:
        for step in task["startstops"]:
            if step["action"] == "compute":
                compute_seconds[str(task["key"])] = step["stop"] - step["start"]
    observed = observer.observations
    assert len(observed) == 4
    for o in observed:
        assert o.seconds == pytest.approx(compute_seconds[o.key], abs=1e-9)
        assert 0 < o.extra["run_seconds"] <= o.seconds
    others = sum(o.extra["other_seconds"] for o in observed)
    other_compute = sum(v for k, v in compute_seconds.items() if k not in {o.key for o in observed})
    assert others <= other_compute + 1e-9  # reported with the next operator task: none after the last


def test_in_worker_peak_is_plausible_against_the_isolated_profile(client, segy, tmp_path):
    from explorer.measure.profiling import profile

    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr", observer)
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
        client.compute(op.dask(operators.read_segy(segy, chunks=CHUNKS), wrap=observer.wrap)).result()
    assert len(observer.observations) == 4
    numpy_keys = {key_split(eval(o.key)) for o in observer.observations}
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr", observer)
    zarr_keys = {key_split(eval(o.key)) for o in observer.observations}
    assert len(observer.observations) == 4 and len(numpy_keys) == len(zarr_keys) == 1
    assert OPERATOR not in numpy_keys | zarr_keys and "run" not in numpy_keys | zarr_keys


def test_the_hook_travels_with_the_graph_and_the_operator_class_is_never_patched(client, segy, tmp_path):
    def run_is_the_class_own():
        import operators

        cls = type(operators.get("gst3d"))
        return cls.run is cls.__dict__["run"] and not hasattr(cls.run, "__wrapped__")

    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        assert all(client.run(run_is_the_class_own).values())
        op = operators.get(OPERATOR)
        da.to_zarr(op.dask(operators.read_segy(segy, chunks=CHUNKS)), str(tmp_path / "unobserved.zarr"))
        unobserved = len(observer.observations)
        compute(segy, tmp_path / "out.zarr", observer)
    assert unobserved == 0  # a graph without the hook reports nothing
    assert len(observer.observations) == 4


def test_tasks_over_the_bound_are_counted_and_warned(client, segy, tmp_path, model):
    store = Store(tmp_path)
    # A model that under-predicts by half: every task is over its bound.
    low = Scaled(model, 0.5)
    with pytest.warns(RuntimeWarning, match="bound"):
        with live.observe(client, OPERATOR, store=store, model=low) as observer:
            compute(segy, tmp_path / "low.zarr", observer)
    assert observer.tasks_over_bound == len(observer.observations) == 4
    assert all(o.peak_bytes > o.upper_bytes for o in observer.over_bound)
    stored = store.records(OPERATOR, source="production")
    assert all(r.context["upper_bytes"] is not None for r in stored)

    # A generous one: none is.
    with live.observe(client, OPERATOR, store=store, model=Scaled(model, 3.0)) as observer:
        compute(segy, tmp_path / "high.zarr", observer)
    assert observer.tasks_over_bound == 0 and len(observer.observations) == 4


# --------------------------------------------------------------------------- what the calibration learns from


def test_observations_carry_run_environment_and_clocks(client, segy, tmp_path, model):
    from explorer.plan.calibration import calibrate
    from explorer.core.environment import environment_digest
    from explorer.core.environment import environment_stamp

    store = Store(tmp_path)
    with live.observe(client, OPERATOR, store=store) as observer:
        compute(segy, tmp_path / "out.zarr", observer)
    records = store.records(OPERATOR, source="production")
    digest = environment_digest(environment_stamp(OPERATOR))
    for r in records:
        assert r.context["run"] == observer.run_id and r.context["environment"] == digest
        assert 0 < r.context["run_seconds"] <= r.context["task_seconds"]
        # before its run the task gathered its overlap pieces: part of its own seconds
        assert 0 <= r.context["read_seconds"] <= r.context["task_seconds"] - r.context["run_seconds"] + 1e-3
        assert r.context["other_seconds"] >= 0 and r.context["other_tasks"] >= 0
    assert sum(r.context["other_tasks"] for r in records) > 0  # the reads and overlap slices
    c = calibrate(OPERATOR, store, model, runs_dir=tmp_path, save=False)
    assert c.n_groups == 1 and c.n_tasks == 4  # four equal blocks of one run: one group
    assert c.excess is None  # one volume does not identify an affine excess
    assert c.timing.operator_seconds_per_voxel > 0 and c.timing.io_seconds_per_voxel > 0


# --------------------------------------------------------------------------- high-water intervals


def test_high_water_intervals_fold_before_each_reset_and_flag_overlap():
    """An allocation freed before a second measurement begins still counts for the first:
    the current VmHWM is folded into open intervals before each reset."""
    import mmap

    hw = inworker._HighWater()
    hw.begin("a", owner="task-a")
    # 64 MiB of new resident pages, then unmapped: an anonymous map, every page written.
    # np.ones(64 MiB) measured 0 once in CI (stop 50), as in the test below; a guess, not
    # reproduced: malloc served it from free heap pages the long-lived process still had
    pages = mmap.mmap(-1, 64 * 2**20)
    np.frombuffer(pages, dtype=np.uint8)[:] = 1
    pages.close()
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
    import mmap

    hw = inworker._HighWater()
    hw.begin("task", owner="k")
    hw.begin("run", owner="k")
    # an anonymous map, every page written: new resident pages whatever the process's allocator
    # holds (np.ones(40 MiB) measured 0 once in a fresh clone's suite; the cause was not found)
    pages = mmap.mmap(-1, 40 * 2**20)
    view = np.frombuffer(pages, dtype=np.uint8)
    view[:] = 1
    run = hw.end("run")
    task = hw.end("task")
    del view
    pages.close()
    assert run[3] is True and task[3] is True
    assert task[0] >= run[0] >= 39 * 2**20


def test_observations_arrive_from_a_thread_pool_worker_with_two_threads(segy, tmp_path):
    """With T = 2 the figures are the process's growth during each task: marked
    ``exact`` only when no other task ran meanwhile, and left out of the calibration."""
    with local_cluster(1, threads_per_worker=2, memory_limit=LIMIT) as cluster:
        with distributed.Client(cluster) as c:
            store = Store(tmp_path)
            with live.observe(c, OPERATOR, store=store) as observer:
                compute(segy, tmp_path / "out.zarr", observer)
    assert observer.recorded == 4
    records = store.records(OPERATOR, source="production")
    assert all(r.context["threads_per_worker"] == 2 for r in records)
    assert any(r.context["exact"] is False for r in records)


@pytest.mark.unit
def test_a_concurrent_figure_is_bounded_by_the_task_term_of_its_form():
    """With T > 1 threads a figure is the process's growth while T tasks ran: against
    ``T (input block + upper)`` when the inputs were resident before the tasks (map_overlap),
    ``T upper`` when each task read its own block (windowed: the read is inside its peak)."""
    shape, upper = (10, 20, 30), 5_000_000.0
    common = dict(operator="gst3d", shape=shape, peak_bytes=0, run_peak_bytes=0, seconds=1.0, exact=False,
                  worker="w", threads=2, memory_limit=2**30, key="k", upper_bytes=upper)
    assert live.Observation(**common).bound_bytes == 2 * (upper + 4 * math.prod(shape))
    assert live.Observation(**common, windowed=True).bound_bytes == 2 * upper
    exact = dict(common, exact=True)
    assert live.Observation(**exact).bound_bytes == live.Observation(**exact, windowed=True).bound_bytes == upper


class _SlowStore(Store):
    """A real SQLite store whose writes take ``seconds`` longer and note the thread that made them."""

    def __init__(self, runs_dir, seconds):
        super().__init__(runs_dir)
        self.seconds, self.threads = seconds, []

    def add_observation(self, *args, **kwargs):
        import threading
        import time

        time.sleep(self.seconds)
        self.threads.append(threading.current_thread().name)
        super().add_observation(*args, **kwargs)


def test_close_writes_what_is_queued_itself_and_loses_nothing(client, tmp_path):
    """The writer thread runs at the lowest CPU priority, so that it does not slow the tasks; once
    the run is over ``close`` writes what is still queued at its own priority (on a busy machine
    the writer took about 2 s a write) and waits for the one the writer holds."""
    import threading

    store = _SlowStore(tmp_path, 0.2)
    observer = live.observe(client, OPERATOR, store=store, warn=False).start()
    n = 8
    for i in range(n):
        observer._on_event((0.0, {
            "id": f"task-{i}", "operator": OPERATOR, "shape": [20 + i, 20, 20], "peak_bytes": 10**6 + i,
            "run_peak_bytes": 10**6 + i, "seconds": 0.01, "exact": True, "worker": "w", "threads": 1,
            "memory_limit": LIMIT, "key": f"k{i}"}))
    observer.close(expected=n)
    assert observer.recorded == n and not observer.errors
    assert len(store.records(OPERATOR, source="production")) == n
    assert store.threads.count(threading.current_thread().name) >= n - 2, store.threads
