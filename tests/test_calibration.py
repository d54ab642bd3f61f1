"""The in-worker calibration: the excess fit and its quantiles (pure), grouping and timings
(records), and the saved file (a real SQLite store and a surrogate fitted from real profiles)."""

from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from explorer.core import environment
from explorer.plan import calibration as cal
from explorer.plan import excess as plan_excess
from explorer.plan import task_model
from explorer.plan import time_model
from explorer.plan import timing
from explorer.core.environment import StaleModelWarning, environment_stamp
from explorer.search.store import Record, Store

MiB = 2**20
OPERATOR = "gst3d"
#: The environment digest the workers of this process would report (explorer.measure.inworker).
HERE = environment.environment_digest(environment_stamp(OPERATOR))


# --------------------------------------------------------------------------- the excess fit (pure)


def test_fit_recovers_intercept_and_bytes_per_voxel():
    rng = np.random.default_rng(0)
    v = np.geomspace(1e4, 5e6, 12)
    r = -0.8 * MiB + 4.4 * v + rng.normal(0, 0.3 * MiB, v.size)
    fit = plan_excess.fit_excess(v, r)
    assert fit.bytes_per_voxel == pytest.approx(4.4, rel=0.05)
    assert fit.intercept_bytes == pytest.approx(-0.8 * MiB, abs=0.4 * MiB)
    assert fit.dof == 10 and fit.residual_sd == pytest.approx(0.3 * MiB, rel=0.6)


def test_the_excess_is_not_identified_from_too_few_groups_or_one_volume():
    assert plan_excess.fit_excess([1e5, 2e5], [1.0, 2.0]) is None
    assert plan_excess.fit_excess([1e5, 1e5, 1e5], [1.0, 2.0, 3.0]) is None
    assert plan_excess.fit_excess([1e5, 2e5, 3e5], [1.0, 2.0, 2.5]) is not None


def test_few_groups_use_scipys_student_t_with_n_minus_2_dof():
    v = np.geomspace(1e4, 1e6, 6)
    fit = plan_excess.fit_excess(v, 3.0 * v + np.array([1, -2, 0.5, 1.5, -1, 0]) * MiB)
    q, method = fit.quantile(0.99)
    assert method == "student-t" and q == pytest.approx(stats.t.ppf(0.99, 4), rel=1e-10)
    mean, half = fit.predict([5e5], 0.99)
    x = np.array([1.0, 5e5 / fit.v_ref])
    leverage = x @ np.array(fit.xtx_inv).reshape(2, 2) @ x
    assert half[0] == pytest.approx(q * fit.residual_sd * math.sqrt(1 + leverage), rel=1e-10)
    # extrapolating 10x beyond the largest group widens the bound
    assert fit.predict([1e7], 0.99)[1][0] > 3 * half[0]


def test_enough_groups_switch_to_the_conformal_rank_of_studentised_residuals():
    rng = np.random.default_rng(1)
    v = rng.uniform(1e4, 1e6, 120)
    fit = plan_excess.fit_excess(v, 4.0 * v + rng.normal(0, MiB, v.size))
    assert plan_excess.conformal_rank(120, 0.99) == 120 and plan_excess.conformal_rank(98, 0.99) is None
    q, method = fit.quantile(0.99)
    assert method == "conformal" and q == fit.scores[119] == max(fit.scores)
    q95, _ = fit.quantile(0.95)
    assert q95 == fit.scores[math.ceil(121 * 0.95) - 1] < q


def coverage(draw, n_groups, trials, seed, confidence=0.99):
    """Share of new groups under the fitted bound, over independent data sets."""
    rng = np.random.default_rng(seed)
    covered = 0
    for _ in range(trials):
        v = np.geomspace(2e4, 4e6, n_groups)
        fit = plan_excess.fit_excess(v, 1e6 + 4.0 * v + draw(rng, n_groups))
        v_new = rng.uniform(2e4, 8e6)
        mean, half = fit.predict([v_new], confidence)
        covered += 1e6 + 4.0 * v_new + draw(rng, 1)[0] <= mean[0] + half[0]
    return covered / trials


def test_the_student_t_bound_covers_99_percent_of_new_groups_from_six():
    gaussian = lambda rng, n: rng.normal(0, 2 * MiB, n)  # noqa: E731
    assert coverage(gaussian, 6, 6000, seed=2) >= 0.985


def test_the_conformal_bound_covers_heavy_tailed_groups():
    """Student-t(2) residuals: a Gaussian-based interval from many groups would undercover."""
    heavy = lambda rng, n: 2 * MiB * rng.standard_t(2, n)  # noqa: E731
    assert coverage(heavy, 150, 3000, seed=3) >= 0.98


# --------------------------------------------------------------------------- the spread within a group (pure)


def simulated_groups(rng, n_groups, n_tasks, alpha, beta):
    """Groups of ``n_tasks`` tasks at means from 1 MiB to 2 GiB, spread ``alpha^2 + beta^2 m^2``."""
    means = np.geomspace(1 * MiB, 2048 * MiB, n_groups)
    peaks = [m + rng.normal(0, math.sqrt(alpha**2 + (beta * m) ** 2), n_tasks) for m in means]
    return peaks


def within_of(peaks):
    return plan_excess.fit_within([p.mean() for p in peaks], [p.var(ddof=1) for p in peaks], [len(p) for p in peaks],
                          [p - p.mean() for p in peaks])


def test_the_within_group_spread_recovers_an_absolute_floor_and_a_relative_part():
    rng = np.random.default_rng(5)
    fit = within_of(simulated_groups(rng, 12, 8, alpha=0.3 * MiB, beta=0.04))
    assert fit.dof == 12 * 7 - 2
    assert fit.beta == pytest.approx(0.04, rel=0.25)
    assert fit.alpha_bytes == pytest.approx(0.3 * MiB, rel=0.5)
    assert fit.quantile(0.99) == (pytest.approx(stats.t.ppf(0.99, fit.dof)), "student-t")
    # one task per group: nothing within to learn
    assert plan_excess.fit_within([MiB, 2 * MiB], [0.0, 0.0], [1, 1]) is None


def test_enough_tasks_switch_the_within_quantile_to_their_conformal_rank():
    rng = np.random.default_rng(6)
    fit = within_of(simulated_groups(rng, 15, 8, alpha=0.3 * MiB, beta=0.04))
    assert len(fit.scores) == 120
    q, method = fit.quantile(0.99)
    assert method == "conformal" and q == fit.scores[plan_excess.conformal_rank(120, 0.99) - 1]


def test_a_single_tasks_bound_covers_99_percent_of_tasks_where_a_line_through_group_maxima_does_not():
    """Probes: 6 groups of 8 tasks (4% spread within, 1% between); production: groups of 18.
    The bound through the group means plus the spread within covers single tasks; a line
    through the probes' largest tasks (the calibration before) misses the largest of 18."""
    rng = np.random.default_rng(7)
    v = np.geomspace(1e4, 3e7, 6)
    truth = lambda v: 0.5 * MiB + 16.0 * v  # noqa: E731 the mean task, all of it excess here
    trials, covered, tasks, covered_old, groups = 400, 0, 0, 0, 0
    for _ in range(trials):
        means = truth(v) * (1 + rng.normal(0, 0.01, v.size))
        peaks = [m + rng.normal(0, 0.04 * m, 8) for m in means]
        excess = plan_excess.fit_excess(v, [p.mean() for p in peaks])
        within = within_of(peaks)
        old = plan_excess.fit_excess(v, [p.max() for p in peaks])
        v_new = rng.uniform(1e6, 3e7)
        m_new = truth(v_new) * (1 + rng.normal(0, 0.01))
        run = m_new + rng.normal(0, 0.04 * m_new, 18)
        zeros = np.zeros(1)
        _, upper = plan_excess.task_bound(zeros, zeros, [v_new], excess, within, 0.99)
        covered += int((run <= upper[0]).sum())
        tasks += run.size
        _, upper_old = plan_excess.task_bound(zeros, zeros, [v_new], old, None, 0.99)
        covered_old += int(run.max() <= upper_old[0])
        groups += 1
    assert covered / tasks >= 0.985
    assert covered_old / groups < 0.95


def test_a_plans_bound_covers_the_largest_of_its_tasks():
    """The footprint must hold for every task of a run: the bound on the largest of 18 tasks
    is above one task's and covers the largest of 18 drawn from the fitted spread within plus
    the line's error, which all 18 share (``task_bound``: the exact quantile of shared + max)."""
    rng = np.random.default_rng(8)
    within = within_of(simulated_groups(rng, 6, 8, alpha=0.3 * MiB, beta=0.04))
    v = np.geomspace(1e4, 3e7, 6)
    excess = plan_excess.fit_excess(v, 0.5 * MiB + 16.0 * v + rng.normal(0, 0.5 * MiB, v.size))
    zeros = np.zeros(3)
    voxels = np.array([1e6, 1e7, 2e7])
    mean, one = plan_excess.task_bound(zeros, zeros, voxels, excess, within, 0.99)
    _, many = plan_excess.task_bound(zeros, zeros, voxels, excess, within, 0.99, tasks=np.array([1, 18, 18]))
    assert many[0] == one[0] and np.all(many[1:] > one[1:])
    _, d_half = excess.predict(voxels, 0.99)
    b = d_half[2] / stats.t.ppf(0.99, excess.dof)
    sd = float(within.sd(mean[2])) * within.tail_scale(0.99)
    plans = 40_000
    largest = (mean[2] + b * rng.standard_t(excess.dof, plans)
               + sd * stats.t.ppf(rng.random(plans) ** (1 / 18), within.dof))
    assert (largest <= many[2]).mean() >= 0.985


# --------------------------------------------------------------------------- groups and timings (records)


def record(shape, peak, *, run="r1", source="production", exact=True, **context):
    return Record(shape=tuple(shape), peak_bytes=float(peak), status="ok", source=source,
                  context={"run": run, "exact": exact, **context})


def test_groups_are_run_and_block_shape_with_their_largest_task():
    records = [record((40, 40, 40), 10), record((40, 40, 40), 12), record((40, 40, 30), 7),
               record((40, 40, 40), 30, run="r2"), record((40, 40, 40), 99, exact=False),
               record((40, 40, 40), 50, source="profile"), record((40, 40, 40), 77, run="r3", environment="other")]
    g = plan_excess.task_groups(records)
    assert sorted(zip(map(tuple, g.shapes), g.peak_bytes, g.n_tasks)) == [
        ((40, 40, 30), 7.0, 1), ((40, 40, 40), 12.0, 2), ((40, 40, 40), 30.0, 1), ((40, 40, 40), 77.0, 1)]
    only = plan_excess.task_groups(records, environment="other")
    assert list(only.peak_bytes) == [77.0]


def test_equal_tasks_of_one_run_are_one_piece_of_evidence():
    shapes = [(30, 30, 30), (50, 50, 50), (70, 70, 70), (90, 90, 90)]
    one = [record(s, 4.0 * math.prod(s) + i * 1e4, run=f"r{i}") for i, s in enumerate(shapes)]
    many = one + [record(shapes[0], 4.0 * 27000, run="r0") for _ in range(200)]
    a, b = plan_excess.task_groups(one), plan_excess.task_groups(many)
    assert len(b.peak_bytes) == len(a.peak_bytes) == 4
    fa = plan_excess.fit_excess(a.shapes.prod(1), a.peak_bytes)
    fb = plan_excess.fit_excess(b.shapes.prod(1), b.peak_bytes)
    assert fa.residual_sd == fb.residual_sd and fa.quantile(0.99) == fb.quantile(0.99)


def test_timings_are_learnt_from_the_workers_clocks_and_the_runs_wall_time():
    from explorer.plan.time_model import schedule_waves

    v = 100**3
    tasks = [record((100, 100, 100), 1, run="r1", task_seconds=0.30, run_seconds=0.20, other_seconds=0.05)
             for _ in range(8)]
    # 8 equal tasks on 2 slots: 4 full waves; g = 4 ms per graph task, 10 graph tasks per chunk
    wall = schedule_waves(8, 2, 0.0) * (0.35 + 0.004 * 10)
    run_record = Record(shape=(96, 96, 96), peak_bytes=1.0, status="ok", source="run",
                        context={"run": "r1", "seconds": wall, "n_tasks": 8, "slots": 2, "tasks_per_chunk": 10})
    t = timing.fit_timing(tasks + [run_record])
    assert t.operator_seconds_per_voxel == pytest.approx(0.20 / v)
    assert t.io_seconds_per_voxel == pytest.approx(0.15 / v)
    assert t.seconds_per_voxel == pytest.approx(0.35 / v)
    assert t.graph_task_seconds == pytest.approx(0.004)
    assert t.n_tasks == 8 and t.n_runs == 1
    assert t.clock.volumes == (v,) and t.clock.seconds_per_voxel == pytest.approx((0.35 / v,))
    assert t.clock.spreads == (0.0,)  # equal tasks
    assert timing.fit_timing([]).seconds_per_voxel is None


def test_the_clock_times_each_block_shape_by_the_tasks_after_each_workers_first():
    """Two runs on two workers.  A worker's first task of a run takes twice its later ones
    (fresh pages); the clock's figure per volume and per block shape is the later tasks'.  A
    shape whose every task was a worker's first (or with no worker named) keeps them all."""
    def task(shape, run, worker, seconds):
        return record(shape, 1, run=run, worker=worker, task_seconds=seconds, run_seconds=seconds,
                      other_seconds=0.0)

    slab, cube, lone = (50, 50, 200), (80, 80, 78), (10, 10, 10)
    rows = [task(slab, "a", w, s) for w, s in (("w1", 0.2), ("w2", 0.2), ("w1", 0.1), ("w2", 0.1), ("w1", 0.1))]
    rows += [task(cube, "b", w, s) for w, s in (("w1", 0.8), ("w2", 0.8), ("w2", 0.05), ("w1", 0.05))]
    rows += [task(lone, "c", "w1", 0.001), task(lone, "c", "w2", 0.003)]
    clock = timing.fit_timing(rows).clock
    assert clock.shapes == tuple(sorted((slab, cube, lone)))
    figures = dict(zip(clock.shapes, clock.shape_seconds_per_voxel))
    assert figures[slab] == pytest.approx(0.1 / math.prod(slab))
    assert figures[cube] == pytest.approx(0.05 / math.prod(cube))
    assert figures[lone] == pytest.approx(0.002 / 1000)  # both first on their worker: their median
    assert clock.seconds_per_voxel_at([math.prod(cube)], [cube])[0] == pytest.approx(0.05 / math.prod(cube))
    # tasks of workers with several threads share the cores: the clock does not time them
    shared = [record(cube, 1, run="d", worker="w1", threads_per_worker=4, task_seconds=9.0, run_seconds=9.0,
                     other_seconds=0.0) for _ in range(3)]
    assert timing.fit_timing(rows + shared).clock == clock


def test_the_clock_keeps_each_volumes_task_bytes_per_voxel_the_pages_a_first_task_touches():
    """Per volume, the median task peak per voxel of its tasks (first or not: the pages are the
    same); a volume without a peak takes the curve between its neighbours'; a clock of tasks
    that carry no peak has none, and plans then charge no first touch."""
    def task(shape, peak, worker):
        return record(shape, peak, run="a", worker=worker, task_seconds=0.1, run_seconds=0.1, other_seconds=0.0)

    small, large = (10, 10, 10), (40, 40, 40)
    rows = [task(small, p, w) for p, w in ((5000, "w1"), (7000, "w2"), (6000, "w1"))]
    rows += [task(large, p, w) for p, w in ((64e4, "w1"), (128e4, "w2"))]
    clock = timing.fit_timing(rows).clock
    assert clock.task_bytes_per_voxel == pytest.approx((6.0, 15.0))
    assert clock.task_bytes_at([1000.0])[0] == pytest.approx(6000.0)
    bare = timing.fit_clock([("a", small, 0.1, 0.1, "w1"), ("a", large, 0.2, 0.2, "w1")])
    assert bare.task_bytes_per_voxel == () and bare.task_bytes_at([1000.0]) is None


def test_the_clock_learns_the_seconds_per_voxel_read_and_what_its_tasks_read_per_voxel():
    """Probe-like cubes on SEG-Ys of two chunks per axis read their whole traces: twice their
    voxels along samples.  Their read seconds are 1 ms plus 5 ns per voxel read (a worker's
    first task 3x, fresh pages): the clock's rate is the later tasks' slope, and per volume and
    shape it keeps what the tasks read per block voxel.  Records without a read timed (saved
    before reads were) leave a clock without reads."""
    def task(edge, worker, first=False):
        shape, volume_shape = (edge,) * 3, [2 * edge] * 3
        read = 2.0 * edge**3
        return record(shape, 1, run=f"r{edge}", worker=worker, task_seconds=0.5, run_seconds=0.1, other_seconds=0.0,
                      read_seconds=(3.0 if first else 1.0) * (1e-3 + 5e-9 * read),
                      read_unit=[1, 1, 2 * edge], volume_shape=volume_shape)

    rows = [task(e, w, first=True) for e in (40, 80) for w in ("w1", "w2")]
    rows += [task(e, w) for e in (40, 80) for w in ("w1", "w2", "w1")]
    clock = timing.fit_timing(rows).clock
    assert clock.read_seconds_per_voxel == pytest.approx(5e-9)
    assert clock.read_voxels_per_voxel == pytest.approx((2.0, 2.0))
    assert clock.shape_read_voxels_per_voxel == pytest.approx((2.0, 2.0))
    # a full-trace block of the 80^3 volume reads its voxels once: 5 ns less per voxel than the clock's cube
    assert clock.read_correction([80.0**3], None, [80.0**3])[0] == pytest.approx(-5e-9 * 80**3)
    assert time_model.TaskClock.from_dict(json.loads(json.dumps(clock.to_dict()))) == clock
    bare = [record((40,) * 3, 1, run="old", worker="w1", task_seconds=0.5, run_seconds=0.1, other_seconds=0.0)] * 2
    assert timing.fit_timing(bare).clock.read_seconds_per_voxel is None
    assert timing.fit_timing(bare).clock.read_correction([1e5], None, [1e6]) == 0.0


def test_a_tasks_fixed_cost_stays_with_the_blocks_that_pay_it():
    """Tasks of 20 ms fixed plus 100 ns/voxel (operator) and 10 ms fixed plus 50 ns/voxel
    (around it).  The lines' slopes are the marginal costs; the planner's clock charges
    each volume its own tasks' seconds, so the small blocks' fixed costs are not a
    per-voxel cost of large ones (as a ratio of sums would make them), and the runs' wall
    times (4 ms per graph task, 4 graph tasks per chunk, tasks spread by 10%) give back
    the overhead per graph task.  Groups of 4 tasks with a known spread give it back."""
    from explorer.plan.time_model import schedule_waves

    shapes = [(20, 20, 20), (40, 40, 40), (80, 80, 80)]
    spread = 0.1
    tasks, runs = [], []
    for shape in shapes:
        v = math.prod(shape)
        inside, around = 0.020 + 100e-9 * v, 0.010 + 50e-9 * v
        run = "x".join(map(str, shape))
        # four tasks whose own seconds have median inside + around - 2 ms and coefficient of
        # variation 0.1, each with 2 ms of the worker's other tasks (reads) reported with it
        for z in (-1.5, -0.5, 0.5, 1.5):
            scale = 1.0 + spread * z / np.std([-1.5, -0.5, 0.5, 1.5], ddof=1)
            tasks.append(record(shape, 1, run=run, task_seconds=(inside + around - 0.002) * scale,
                                run_seconds=inside * scale, other_seconds=0.002))
        runs.append(Record(shape=shape, peak_bytes=1.0, status="ok", source="run",
                           context={"run": run, "seconds": schedule_waves(4, 2, spread) * (inside + around + 0.016),
                                    "n_tasks": 4, "slots": 2, "tasks_per_chunk": 4}))
    t = timing.fit_timing(tasks + runs)
    assert t.operator_seconds_per_voxel == pytest.approx(100e-9)
    assert t.io_seconds_per_voxel == pytest.approx(50e-9)
    volumes = [math.prod(s) for s in shapes]
    assert t.clock.volumes == tuple(volumes)
    assert t.clock.seconds_per_voxel == pytest.approx([(0.030 + 150e-9 * v) / v for v in volumes])
    assert t.clock.spreads == pytest.approx((spread,) * 3)
    assert t.graph_task_seconds == pytest.approx(0.004)
    ratio = sum(r.context["task_seconds"] + r.context["other_seconds"] for r in tasks) / sum(
        math.prod(r.shape) for r in tasks)
    assert ratio > 1.1 * t.clock.seconds_per_voxel[-1]  # what the ratio of sums would have charged


def test_reads_reported_with_one_task_are_every_tasks_cost_and_not_their_spread():
    """A worker's other tasks (reads, overlap slices) are reported with whichever operator task
    ends next, often the first of a run on each worker: the clock charges each task their mean
    (their sum is what the tasks cost) and its spread is of the tasks' own seconds."""
    shape = (100, 100, 100)
    v = math.prod(shape)
    own = [0.30, 0.32, 0.28, 0.30, 0.31, 0.29]
    evenly = [record(shape, 1, run="a", task_seconds=t, run_seconds=0.2, other_seconds=0.04) for t in own]
    first = [record(shape, 1, run="b", task_seconds=t, run_seconds=0.2, other_seconds=0.24 if i == 0 else 0.0)
             for i, t in enumerate(own)]
    a, b = timing.fit_timing(evenly).clock, timing.fit_timing(first).clock
    assert a.seconds_per_voxel == pytest.approx(b.seconds_per_voxel)
    assert a.seconds_per_voxel == pytest.approx(((0.30 + 0.04) / v,))
    cv = np.std(own, ddof=1) / np.mean(own)
    assert a.spreads == pytest.approx(b.spreads) and a.spreads == pytest.approx((cv,))
    assert b.spreads[0] < 0.1  # with the reads in it the first task's 0.54 s would make it 0.3


# --------------------------------------------------------------------------- the task model


class Isolated:
    """A stand-in isolated model with a known mean and half-width (pure arithmetic)."""

    operator, halo, info, stale = OPERATOR, (5, 5, 5), {}, []

    def predict_many(self, shapes, confidence=0.99):
        v = np.asarray(shapes, dtype=float).reshape(-1, 3).prod(1)
        return 90.0 * v, 92.0 * v


def test_task_bound_adds_the_excess_and_never_falls_below_the_isolated_bound():
    v = np.geomspace(1e4, 2e6, 6)
    excess = plan_excess.fit_excess(v, -2 * MiB + 4.0 * v + np.array([1, -1, 0.5, -0.5, 0.2, -0.2]) * 1e5)
    c = cal.WorkerCalibration(OPERATOR, excess, timing.fit_timing([]), 6, 6, 48, 0.99, 0, environment_stamp(OPERATOR))
    model = task_model.TaskModel(Isolated(), c)
    shapes = np.array([[20, 20, 20], [150, 150, 150]])
    mean, upper = model.predict_many(shapes, 0.99)
    m0, u0 = Isolated().predict_many(shapes)
    d_mean, d_half = excess.predict(shapes.prod(1), 0.99)
    np.testing.assert_allclose(mean, m0 + d_mean)
    # one task of unknown order, no spread within fitted: the 99% quantile of the shared error
    # a Z + b T_4 (a normal isolated predictive, the line's Student-t), by numerical integration
    a, b = (u0[1] - m0[1]) / stats.norm.ppf(0.99), d_half[1] / stats.t.ppf(0.99, excess.dof)
    from scipy import integrate
    p, _ = integrate.quad(lambda t: stats.norm.cdf((upper[1] - mean[1] - b * t) / a) * stats.t.pdf(t, excess.dof),
                          -np.inf, np.inf)
    assert p == pytest.approx(0.99, abs=1e-4)
    assert upper[0] == u0[0]  # heap reuse on a tiny block never lowers the bound below isolation
    assert upper[1] > u0[1] and model.warnings == []
    assert "no in-worker calibration" in task_model.TaskModel(Isolated(), None).warnings[0]


def test_a_small_crop_run_moves_a_large_plan_only_as_its_evidence_warrants():
    """Probes over 24^3..161^3 plus one run on a 23x18x75 crop whose tasks carry a fixed
    overhead: the 800x600x1000 @ 4 GiB block's excess barely moves (the old ratio did 1.5-2x)."""
    rng = np.random.default_rng(4)
    probes = [record((e, e, e), 90.0 * e**3 + 0.3 * MiB + 4.4 * e**3 + rng.normal(0, 0.5 * MiB), run=f"p{e}",
                     source="probe") for e in (24, 35, 51, 75, 110, 161)]
    crop = record((23, 18, 75), 90.0 * 23 * 18 * 75 + 3 * MiB, run="crop")
    before = plan_excess.task_groups(probes)
    after = plan_excess.task_groups(probes + [crop])
    large = (210.0, 210.0, 210.0)
    fits = [plan_excess.fit_excess(g.shapes.prod(1), g.peak_bytes - 90.0 * g.shapes.prod(1)) for g in (before, after)]
    (m0, h0), (m1, h1) = [f.predict([math.prod(large)], 0.99) for f in fits]
    task = 90.0 * math.prod(large)
    assert abs((m1[0] + h1[0]) - (m0[0] + h0[0])) < 0.02 * task


# --------------------------------------------------------------------------- the saved calibration


@pytest.mark.integration
def test_calibrate_saves_a_stamped_file_that_loads_back(tmp_path, gst3d_model):
    store = Store(tmp_path)
    for i, e in enumerate((24, 40, 56, 72)):
        shape = (e, e, e)
        for _ in range(3):
            store.add_observation(OPERATOR, shape, gst3d_model.predict(shape)[0] + 4.0 * e**3 + 1e5 * i,
                                  source="probe", context={"run": f"p{i}", "exact": True, "environment": HERE})
    c = cal.calibrate(OPERATOR, store, gst3d_model, runs_dir=tmp_path)
    assert c.n_groups == c.n_probe_groups == 4 and c.n_tasks == 12
    assert c.excess.bytes_per_voxel == pytest.approx(4.0, rel=0.2)
    saved = json.loads(cal.calibration_path(OPERATOR, tmp_path).read_text())
    assert saved["format_version"] == cal.FORMAT_VERSION and saved["environment"]["numpy"] == np.__version__
    loaded = cal.load_calibration(OPERATOR, tmp_path)
    assert loaded.excess == c.excess and loaded.stale == []
    assert c.within is not None and c.within.dof == 4 * 2 - 2 and loaded.within == c.within
    gst3d_model.save(cal.paths.model_path(OPERATOR, tmp_path))
    tasks = task_model.task_model(OPERATOR, tmp_path)
    assert tasks.predict((60, 60, 60))[0] > gst3d_model.predict((60, 60, 60))[0]
    # plans run where the workers were measured, never beyond: the largest group's block, 72^3
    assert c.largest_block_voxels == tasks.largest_block_voxels == 72**3
    from explorer.plan.recommend import recommend_chunks

    plan = recommend_chunks(OPERATOR, (400, 400, 400), "8GiB", runs_dir=tmp_path, baseline_bytes=100 * 2**20)
    assert math.prod(plan.block) <= 72**3 == plan.max_block_voxels


@pytest.mark.integration
def test_a_calibration_from_other_workers_is_stale_and_a_garbage_file_names_the_fix(tmp_path, gst3d_model):
    store = Store(tmp_path)
    for i, e in enumerate((24, 40, 56)):
        other = dict(environment_stamp(OPERATOR), distributed="1999.1.0")
        store.add_observation(OPERATOR, (e, e, e), gst3d_model.predict((e, e, e))[0] * 1.05, source="probe",
                              context={"run": f"p{i}", "exact": True, "environment": environment.environment_digest(other)})
    cal.calibrate(OPERATOR, store, gst3d_model, runs_dir=tmp_path, environment=other)
    loaded = cal.load_calibration(OPERATOR, tmp_path)
    assert loaded.stale and "distributed 1999.1.0" in loaded.stale[0]
    gst3d_model.save(cal.paths.model_path(OPERATOR, tmp_path))
    assert any("in-worker calibration was learnt in another environment" in w
               for w in task_model.task_model(OPERATOR, tmp_path).warnings)
    path = cal.calibration_path(OPERATOR, tmp_path)
    for garbage in ("", "{", json.dumps({"mean": 1.1, "var": 0.01})):
        path.write_text(garbage)
        with pytest.raises(cal.CalibrationFileError) as err:
            cal.load_calibration(OPERATOR, tmp_path)
        assert str(path) in str(err.value) and "explore gst3d" in str(err.value) and "\n" not in str(err.value)
    assert StaleModelWarning  # the class users filter on
    # a calibration saved by another version of the tool is not garbage: used as none, with the fix
    saved = json.loads(json.dumps({"format_version": cal.FORMAT_VERSION - 1, "operator": OPERATOR}))
    path.write_text(json.dumps(saved))
    with pytest.warns(RuntimeWarning, match="saved by another version of memory-explorer.*explore gst3d"):
        assert cal.load_calibration(OPERATOR, tmp_path) is None
    with pytest.warns(RuntimeWarning, match="saved by another version"):
        tasks = task_model.task_model(OPERATOR, tmp_path)
    assert any("no in-worker calibration for gst3d" in w for w in tasks.warnings)


@pytest.mark.integration
def test_a_model_profiled_on_a_clusters_workers_is_judged_against_them_not_the_caller(tmp_path, gst3d_model):
    """``explore OP --scheduler`` stamps the model with the workers' environment; a plan for those
    workers made from another machine (its numpy differs) does not call the model stale, while a
    plan for this machine's own workers does."""
    workers = dict(environment_stamp(OPERATOR), numpy="1.0.0-on-the-cluster")
    model = copy.deepcopy(gst3d_model)
    model.environment = workers
    model.save(cal.paths.model_path(OPERATOR, tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        there = task_model.task_model(OPERATOR, tmp_path, environment=workers)
    assert not any("model was learnt in another environment" in w for w in there.warnings), there.warnings
    assert not [w for w in caught if issubclass(w.category, StaleModelWarning)]
    stale_line = "gst3d's model was learnt in another environment (numpy 1.0.0-on-the-cluster"
    here = task_model.task_model(OPERATOR, tmp_path)
    assert any(w.startswith(stale_line) for w in here.warnings), here.warnings


# --------------------------------------------------------------------------- probe sizes


@pytest.mark.integration
def test_the_top_probe_is_the_block_a_plan_at_the_target_memory_runs(gst3d_model):
    """The plan-scale edge is the largest cube whose one-thread footprint fits the pause
    threshold: the next edge does not; the probes reach it (when their seconds allow)."""
    import operators
    from explorer.plan.dask_config import worker_pause_fraction
    from explorer.runner.probes import _REGULAR, plan_scale_edge, probe_blocks

    op = operators.get("gst3d")
    limit, baseline = 2**30, 100 * 2**20
    edge = plan_scale_edge(op, gst3d_model, limit, baseline)

    def total(e):
        # by hand: the task reads its block in one windowed read (inside its peak), so no input
        # block waits and no chunk is kept for a neighbour: baseline + peak + its float32 output
        _, upper = gst3d_model.predict((e, e, e))
        return baseline + math.ceil(float(np.asarray(upper).reshape(-1)[0])) + 4 * e**3

    pause = worker_pause_fraction() * limit
    assert total(edge) <= pause < total(edge + 1)
    blocks = probe_blocks(op, 50.0**3, seconds_per_voxel=None, plan_edge=edge)
    top = max(r for r in _REGULAR if r <= edge)  # the plan-scale edge, on a regular length
    assert blocks[-1] == (top,) * 3 and top > 0.85 * edge and len(blocks) == 6
    # isolated profiles that reached far larger blocks do not push the probes past the plans' blocks
    assert probe_blocks(op, (4 * edge) ** 3, seconds_per_voxel=None, plan_edge=edge)[-1] == (top,) * 3
    assert plan_scale_edge(op, gst3d_model, 120 * 2**20, baseline) is None  # nothing fits: no plan-scale probe


def test_probes_keep_enough_distinct_blocks_to_identify_the_excess():
    """unet3d: a halo of 48 and blocks on a grid of 8 leave the seconds budget room for one
    probe; the excess's line needs three distinct blocks, so the smallest three on the
    grid run anyway.  An operator the budget does not bind keeps its log-spaced six."""
    import operators
    from explorer.plan.excess import N_COEFFICIENTS
    from explorer.runner.probes import _on_grid, probe_blocks

    unet = operators.get("unet3d")
    blocks = probe_blocks(unet, 300.0**3, seconds_per_voxel=2e-6, plan_edge=230)
    edges = [b[0] for b in blocks]
    assert len(set(edges)) == N_COEFFICIENTS + 1 and edges == sorted(edges)
    assert list(_on_grid(unet, np.array(edges))) == edges  # blocks the network really runs on
    assert edges[0] >= 3 * max(unet.halo) + 1
    gst3d = probe_blocks(operators.get("gst3d"), 300.0**3, seconds_per_voxel=2e-7, plan_edge=200)
    assert len(gst3d) == 6 and gst3d[-1] == (200,) * 3


def test_probe_edges_are_regular_lengths_so_an_ffts_factors_do_not_shape_the_clock():
    """An operator that does not pad its blocks probes at regular edges, 5-smooth (a prime
    length's FFT runs several times slower) and not multiples of 16 (such strides alias in the
    caches), spread as before from its smallest block to the plan-scale one; one that pads keeps
    the edges of its grid."""
    import operators
    from explorer.runner.probes import probe_blocks

    def regular(n):
        if n % 16 == 0:  # a stride of a large power of two aliases in the caches
            return False
        for p in (2, 3, 5):  # a prime length's FFT is several times slower
            while n % p == 0:
                n //= p
        return n == 1

    for name, edge in [("envelope", 215), ("gaussian", 300), ("instantaneous_frequency", 97)]:
        op = operators.get(name)
        edges = [b[0] for b in probe_blocks(op, 400.0**3, seconds_per_voxel=None, plan_edge=edge)]
        assert all(regular(e) for e in edges) and edges == sorted(set(edges)), (name, edges)
        assert edges[0] >= max(24, 3 * max(op.halo) + 1) and 0.85 * edge < edges[-1] <= edge
        assert len(edges) == 6
    unet = operators.get("unet3d")
    edges = [b[0] for b in probe_blocks(unet, 300.0**3, seconds_per_voxel=None, plan_edge=230)]
    assert all((e - max(unet.halo)) % 8 == 0 for e in edges)  # its grid, not regular lengths


def test_the_memoised_student_t_quantiles_are_stdtrits_values(monkeypatch):
    """The planner's within-group bound memoises ``stdtrit`` per value: the same numbers as
    computing them afresh, whatever was asked before (and across a cleared table)."""
    from scipy.special import stdtrit

    monkeypatch.setattr(plan_excess, "_STUDENT_T_MEMO", {})
    monkeypatch.setattr(plan_excess, "STUDENT_T_MEMO_SIZE", 500)
    rng = np.random.default_rng(4)
    for _ in range(40):
        dof = float(rng.choice([2.0, 7.0, 31.5]))
        counts = rng.integers(1, 4000, size=int(rng.integers(1, 300)))
        confidences = 0.99 ** (1.0 / counts)
        np.testing.assert_array_equal(plan_excess.student_t_quantiles(dof, confidences), stdtrit(dof, confidences))
    assert all(len(keys) <= 500 for keys, _ in plan_excess._STUDENT_T_MEMO.values())


def test_a_runs_fixed_seconds_are_told_from_its_graph_tasks_when_the_runs_differ():
    """Runs of ``F + g x`` (x: graph tasks on the busiest slot) plus their tasks' work: with two
    grids the least squares gives both back; on one grid ``F`` is charged per graph task (the
    old rule, for stores whose runs cannot tell them apart); no run, no figure."""
    fixed, g = 0.15, 0.001
    runs = [(fixed + g * x + work, x, work) for x, work in [(52, 0.2), (52, 0.5), (52, 1.4), (660, 0.3)]]
    f, per_task = timing.fit_run_overheads(runs)
    assert f == pytest.approx(fixed) and per_task == pytest.approx(g)
    one_grid = runs[:3]
    f, per_task = timing.fit_run_overheads(one_grid)
    assert f == 0.0 and per_task == pytest.approx(g + fixed / 52)
    assert timing.fit_run_overheads([]) == (None, None)
    # never negative: a wall below its work's clock is no negative overhead
    f, per_task = timing.fit_run_overheads([(0.1, 52, 0.3), (0.2, 660, 0.3)])
    assert f >= 0 and per_task >= 0


def test_the_valley_fit_falls_then_rises_and_pools_a_bump_with_its_least_certain_neighbour():
    """``valley_fit``: a falling-then-rising sequence is its own fit; a value above both
    neighbours is pooled into a weighted mean, with the neighbour whose weight is least
    (first_derivative's probes: 28.4 ns at 108^3 from tight tasks, 39.8 at 180^3 and 25.7 at 300^3
    from tasks spread 24-31%); the fit is the weighted least squares over every valley."""
    valley = [443.0, 126.0, 52.0, 28.0, 30.0, 33.0]
    assert timing.valley_fit(valley, np.ones(6)) == pytest.approx(valley)
    y, w = np.array([126.0, 52.0, 28.4, 39.8, 25.7]), np.array([5.0, 5.0, 1.5, 0.066, 0.094])
    fit = timing.valley_fit(y, w)
    pooled = (39.8 * 0.066 + 25.7 * 0.094) / (0.066 + 0.094)
    assert fit == pytest.approx([126.0, 52.0, 28.4, pooled, pooled])
    other = np.array([126.0, 52.0, *[(28.4 * 1.5 + 39.8 * 0.066) / 1.566] * 2, 25.7])  # pooled the other way
    assert w @ (y - fit) ** 2 < w @ (y - other) ** 2
    rng = np.random.default_rng(5)
    from scipy.optimize import isotonic_regression

    def scipy_best(y, w):  # each split's two sides by scipy's own pool-adjacent-violators
        sides = [np.concatenate([isotonic_regression(y[:m], weights=w[:m], increasing=False).x if m else [],
                                 isotonic_regression(y[m:], weights=w[m:]).x if m < len(y) else []])
                 for m in range(len(y) + 1)]
        return min(float(w @ (y - f) ** 2) for f in sides)

    for _ in range(50):  # always a valley, and the least squares scipy finds over the splits
        y, w = rng.uniform(1, 10, 7), rng.uniform(0.1, 2, 7)
        f = timing.valley_fit(y, w)
        m = int(np.argmin(f))
        assert np.all(np.diff(f[:m + 1]) <= 1e-12) and np.all(np.diff(f[m:]) >= -1e-12)
        assert w @ (y - f) ** 2 == pytest.approx(scipy_best(y, w), rel=1e-9, abs=1e-12)


def test_a_clock_does_not_carry_one_slow_probe_into_the_volumes_beside_it():
    """Warm tasks at three volumes as first_derivative's probes ran them: tight at the smallest,
    slow and spread at the middle one, spread at the largest.  The clock pools the middle with
    the largest (its tasks' figures taken together), so a block between them is priced flat
    rather than cheaper the larger it is; each shape's own figure is still its tasks'."""
    def tasks(edge, per_voxel_ns):
        v = edge**3
        return [("r%d" % edge, (edge,) * 3, ns * 1e-9 * v, ns * 1e-9 * v, "w%d" % (i % 2))
                for i, ns in enumerate(per_voxel_ns)]

    rows = (tasks(108, [29.7, 31.8, 26.3, 28.1, 27.6, 29.9, 32.3, 28.8])
            + tasks(180, [26.2, 42.7, 46.4, 40.9, 38.7, 38.3, 25.1, 53.3])
            + tasks(300, [23.1, 23.8, 24.2, 25.5, 41.1, 46.9, 25.9, 24.9]))
    clock = timing.fit_clock(rows)
    s = np.asarray(clock.seconds_per_voxel) * 1e9
    assert s[0] == pytest.approx(28.45, abs=0.1)  # the median of its warm tasks, unchanged
    assert s[1] == pytest.approx(s[2]) and 25.7 < s[1] < 39.8
    middle = clock.seconds_per_voxel_at([240.0**3, 280.0**3])
    assert middle[0] == pytest.approx(middle[1])
    assert clock.seconds_per_voxel_at([180**3], [(180, 180, 180)])[0] * 1e9 == pytest.approx(39.8, abs=0.1)
