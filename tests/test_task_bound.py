"""The bound on the largest of a plan's tasks in workers (issue 33 item 4): the exact quantile of
a shared error plus the largest of n within-group deviations, against Monte Carlo and numerical
integration (pure); the cold first task per worker, recorded by real workers and estimated from
synthetic groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from explorer.plan import calibration as cal
from explorer.plan import excess as plan_excess
from explorer.plan import max_task
from explorer.plan import task_model
from explorer.plan import timing
from explorer.search.store import Record

MiB = 2**20
GiB = 2**30


def simulate(rng, plans, a, b, sigma, n, *, k=0, kappa=0.0, cold_sd=None, dofs=(10.0, 12.0), within_dof=96.0):
    """``plans`` draws of ``S + max_i D_i`` (``S = a T_1 + b T_2``; ``n - k`` warm ``sigma T``,
    ``k`` cold ``kappa + cold_sd T``): the largest of each plan's tasks above their location."""
    shared = a * rng.standard_t(dofs[0], plans) + b * rng.standard_t(dofs[1], plans)
    # the largest of m iid draws from its distribution function F^m: F^{-1}(U^(1/m))
    largest = np.full(plans, -np.inf)
    for count, shift, scale in ((n - k, 0.0, sigma), (k, kappa, sigma if cold_sd is None else cold_sd)):
        if count:
            largest = np.maximum(largest, shift + scale * stats.t.ppf(rng.random(plans) ** (1.0 / count), within_dof))
    return shared + largest


@pytest.mark.parametrize("a, b, sigma, n, k, kappa, cold_sd, dofs, within_dof", [
    (1.0, 0.0, 0.1, 1, 0, 0.0, None, (10.0, 12.0), 96.0),     # the shared error alone, one task
    (1.0, 0.3, 1.0, 9, 0, 0.0, None, (10.0, 12.0), 96.0),     # comparable, a survey's 9 tasks
    (1.0, 0.2, 3.0, 100, 0, 0.0, None, (20.0, 5.0), 30.0),    # the spread within dominates, 100 tasks
    (1.0, 0.1, 0.3, 100, 2, 0.6, None, (6.0, 12.0), 96.0),    # shared dominates, two cold tasks
    (0.5, 0.5, 1.0, 40, 8, 1.5, None, (4.0, 4.0), 20.0),      # heavy tails, eight cold tasks well above
    (1.0, 0.2, 1.0, 30, 2, 0.0, 1.6, (10.0, 12.0), 96.0),     # cold tasks no higher but wider
])
def test_the_quantile_matches_monte_carlo_of_shared_plus_the_largest(a, b, sigma, n, k, kappa, cold_sd, dofs,
                                                                     within_dof):
    """The share of simulated plans whose largest task is under the bound is ``c`` within
    Monte Carlo error (3.5 binomial standard deviations at 300,000 draws)."""
    c, plans = 0.99, 300_000
    u = max_task.max_task_quantile(c, ([a], [b]), dofs, sigma, n, cold=k, cold_offset=kappa, cold_sd=cold_sd,
                              within_dof=within_dof)[0]
    x = simulate(np.random.default_rng(11), plans, a, b, sigma, n, k=k, kappa=kappa, cold_sd=cold_sd, dofs=dofs,
                 within_dof=within_dof)
    covered = float((x <= u).mean())
    assert abs(covered - c) <= 3.5 * math.sqrt(c * (1 - c) / plans), (covered, u)


def test_one_task_is_the_quantile_of_the_shared_error_plus_one_deviation():
    """``n = 1``: ``P(S + W <= u) = c`` by numerical integration over ``S``; the limits: no
    spread within gives ``S``'s own quantile, no shared error the within one's."""
    c, a, sigma, nu, nu_w = 0.99, 1.0, 0.7, 8.0, 30.0
    u = max_task.max_task_quantile(c, ([a], [0.0]), (nu, 12.0), sigma, 1, within_dof=nu_w)[0]
    p, _ = integrate.quad(lambda s: stats.t.cdf((u - a * s) / sigma, nu_w) * stats.t.pdf(s, nu), -np.inf, np.inf,
                          epsabs=1e-12)
    assert p == pytest.approx(c, abs=5e-5)
    assert max_task.max_task_quantile(c, ([a], [0.0]), (nu, 12.0), 0.0, 1)[0] == pytest.approx(stats.t.ppf(c, nu), rel=2e-3)
    assert max_task.max_task_quantile(c, ([0.0], [0.0]), (nu, 12.0), sigma, 1, within_dof=nu_w)[0] == \
        pytest.approx(sigma * stats.t.ppf(c, nu_w), rel=2e-3)
    # the largest of n warm deviations alone is exactly Sidak's: F^{-1}(c^(1/n))
    assert max_task.max_task_quantile(c, ([0.0], [0.0]), (nu, 12.0), sigma, 50, within_dof=nu_w)[0] == \
        pytest.approx(sigma * stats.t.ppf(c ** (1 / 50), nu_w), rel=2e-3)


def test_the_bound_on_many_tasks_is_at_least_one_tasks_and_grows_with_their_count():
    counts = np.array([1, 2, 4, 9, 30, 100, 1000, 10_000], dtype=float)
    for a, sigma in ((1.0, 0.2), (1.0, 1.0), (0.2, 1.0)):
        u = max_task.max_task_quantile(0.99, (np.full(counts.size, a), 0.1), (10.0, 12.0), sigma, counts,
                                  within_dof=96.0)
        assert np.all(np.diff(u) > 0) and u[0] > 0
        # never below either part's own quantile (S and W symmetric and unimodal)
        assert np.all(u >= a * stats.t.ppf(0.99, 10.0) - 1e-9)
        assert np.all(u >= sigma * stats.t.ppf(0.99 ** (1 / counts), 96.0) - 1e-3 * (a + sigma))


def test_the_quadrature_sum_covers_too_few_plans_of_100_tasks_and_the_exact_quantile_covers_c():
    """Regression for issue 33 (review point 5): the rule before, ``sqrt(h_P^2 + h_between^2 +
    h_within(c^(1/n))^2)``, covered 95.7% of simulated plans of 100 tasks at a nominal 99%.
    ``task_bound`` (what the planner calls) must cover 99%: this fails if the combination
    reverts to a quadrature sum."""
    c, n, plans = 0.99, 100, 200_000
    rng = np.random.default_rng(5)
    v = np.geomspace(1e4, 3e7, 6)
    excess = plan_excess.fit_excess(v, 0.5 * MiB + 16.0 * v + np.array([1, -1, 0.5, -0.5, 0.3, -0.3]) * 2 * MiB)
    within = plan_excess.WithinFit(alpha_bytes=0.3 * MiB, beta=0.03, dof=96)
    voxels = np.array([2e7])
    mean_p, nu_p = np.array([900 * MiB]), 10.0
    d_mean, d_half = excess.predict(voxels, c)
    sigma = float(within.sd(mean_p[0] + d_mean[0]))
    a = 1.4 * sigma  # the isolated model's scale: the shared and the largest's quantiles alike
    upper_p = mean_p + stats.t.ppf(c, nu_p) * a
    mean, upper = plan_excess.task_bound(mean_p, upper_p, voxels, excess, within, c, n, cold=0, isolated_dof=nu_p)
    # plans drawn from the model the bound describes: S = a T_nu_P + b T_{n-p}, W = sigma_w T_nu_w
    b = d_half[0] / stats.t.ppf(c, excess.dof)
    largest = mean[0] + simulate(rng, plans, a, b, sigma, n, dofs=(nu_p, excess.dof), within_dof=within.dof)
    covered = float((largest <= upper[0]).mean())
    assert covered >= c - 3.5 * math.sqrt(c * (1 - c) / plans)
    old = mean[0] + math.sqrt((upper_p[0] - mean_p[0]) ** 2 + d_half[0] ** 2
                              + (stats.t.ppf(c ** (1 / n), within.dof) * sigma) ** 2)
    assert float((largest <= old).mean()) < 0.97 < 0.985 < covered


def test_the_planner_bounds_the_largest_of_a_plans_tasks_with_one_cold_task_per_slot():
    """``plan_chunks`` passes each candidate's task count and ``min(tasks, workers x threads)``
    cold tasks to a predictor that takes them."""
    from explorer.plan.planner import plan_chunks
    from explorer.plan.predictor import takes_keywords
    from explorer.plan.spec import VolumeGeometry, WorkerSpec

    seen = []

    @takes_keywords("tasks", "cold")
    def predict(shapes, confidence=0.99, tasks=1, cold=None):
        seen.append((np.asarray(tasks).copy(), np.asarray(cold).copy()))
        v = np.asarray(shapes, dtype=float).prod(1)
        return 50.0 * v, 60.0 * v

    plan = plan_chunks(VolumeGeometry((300, 300, 300), (2, 2, 2)), predict,
                       WorkerSpec(2**31, 100 * MiB, threads_per_worker=2, workers=3))
    tasks, cold = (np.concatenate(x) for x in zip(*seen))
    assert np.array_equal(cold, np.minimum(tasks, 6)) and plan.n_tasks >= 1


# --------------------------------------------------------------------------- the cold first task


def cold_groups(rng, ratio, fixed=0.0, *, n_groups=7, workers=2, per_worker=4, alpha=0.2 * MiB, beta=0.02):
    """Records of ``n_groups`` probe-like runs (``workers x per_worker`` tasks each, the first on
    each worker cold, ``fixed + ratio m`` above the warm ones)."""
    records = []
    for g, m in enumerate(np.geomspace(2 * MiB, 2048 * MiB, n_groups)):
        sd = math.sqrt(alpha**2 + (beta * m) ** 2)
        for w in range(workers):
            for i in range(per_worker):
                peak = m + (fixed + ratio * m) * (i == 0) + rng.normal(0, sd)
                records.append(Record(shape=(10 + g, 10 + g, 10 + g), peak_bytes=float(peak), status="ok",
                                      source="probe", context={"run": f"r{g}", "exact": True, "worker": f"w{w}",
                                                               "first_in_run": i == 0, "task_index": i}))
    return records


def fit_cold_of(records):
    groups = plan_excess.task_groups(records)
    within = plan_excess.fit_within(groups.mean_bytes, groups.variances, groups.n_tasks, groups.deviations, groups.dofs,
                            groups.cells)
    return groups, within, plan_excess.fit_cold(groups.mean_bytes, groups.cold_mean, groups.n_warm, groups.n_cold, within)


def test_the_cold_offset_is_estimated_from_groups_holding_both_kinds():
    rng = np.random.default_rng(3)
    records = cold_groups(rng, 0.05)
    groups, within, cold = fit_cold_of(records)
    top = groups.mean_bytes.max()
    assert cold.n_groups == 7 and cold.offset(top) / top == pytest.approx(0.05, abs=0.01)
    assert 0 < cold.error(top, 0.99, within.dof) / top < 0.02
    # a fixed part (a first task's own buffers): recovered on small and large blocks alike
    _, _, fixed = fit_cold_of(cold_groups(rng, 0.0, fixed=1 * MiB))
    assert fixed.offset(2 * MiB) == pytest.approx(1 * MiB, abs=0.3 * MiB)
    assert fixed.offset(top) == pytest.approx(1 * MiB, abs=3 * fixed.error(top, 0.84, within.dof))
    # told apart: the group's value is its warm mean, its variance pooled about two means
    assert np.all(groups.n_cold == 2) and np.all(groups.n_warm == 6) and np.all(groups.dofs == 6)
    assert within.dof == 7 * 6 - 2 and within.beta == pytest.approx(0.02, rel=0.3)
    # the within spread is not inflated by the cold tasks (it is, taken as one cell)
    _, one_cell, none = fit_cold_of([Record(shape=r.shape, peak_bytes=r.peak_bytes, status=r.status, source=r.source,
                                            context={**r.context, "first_in_run": None}) for r in records])
    assert none is None and within.beta < 0.8 * one_cell.beta


def test_no_offset_only_where_the_data_put_it_and_then_with_its_error():
    rng = np.random.default_rng(4)
    groups, within, none = fit_cold_of(cold_groups(rng, 0.0))
    top = groups.mean_bytes.max()
    assert none.offset(top) < 3 * none.error(top, 0.84, within.dof) and none.error(top, 0.99, within.dof) > 0
    _, _, lower = fit_cold_of(cold_groups(rng, -0.08))
    assert lower.coef[1] < 0 and lower.offset(top) == 0.0  # cold tasks below the warm ones: no offset
    # observations saved before the flag: not told apart, no estimate, the spread carries them
    records = [Record(shape=r.shape, peak_bytes=r.peak_bytes, status=r.status, source=r.source,
                      context={k: v for k, v in r.context.items() if k != "first_in_run"})
               for r in cold_groups(rng, 0.05)]
    groups, within, cold = fit_cold_of(records)
    assert cold is None and np.all(groups.n_cold == 0) and np.all(groups.dofs == 7)


def test_the_bound_takes_the_cold_tasks_into_the_largest():
    """Cold tasks raise the bound on a plan's largest task; a warm task alone is bounded
    without the offset, one of unknown order with it."""
    v = np.geomspace(1e4, 3e7, 6)
    excess = plan_excess.fit_excess(v, 0.5 * MiB + 16.0 * v + np.array([1, -1, 0.5, -0.5, 0.3, -0.3]) * MiB)
    within = plan_excess.WithinFit(alpha_bytes=0.3 * MiB, beta=0.02, dof=96)
    cold = plan_excess.ColdFit(coef=(0.0, 0.04 * GiB), cov=(0.0, 0.0, 0.0, (0.005 * GiB) ** 2), m_ref=GiB, dof=40,
                       n_groups=7)
    m, u = np.array([800 * MiB]), np.array([840 * MiB])
    bound = lambda **kw: plan_excess.task_bound(m, u, [2e7], excess, within, 0.99, cold_fit=cold, **kw)[1][0]  # noqa: E731
    warm_one, cold_one, unknown = bound(cold=0), bound(cold=1), bound()
    assert warm_one < cold_one == unknown
    assert bound(tasks=100, cold=0) < bound(tasks=100, cold=2) < bound(tasks=100, cold=8)
    assert plan_excess.task_bound(m, u, [2e7], excess, within, 0.99, 100, cold=2)[1][0] < bound(tasks=100, cold=2)
    # an offset measured as nothing still widens the cold tasks by its error
    measured_none = plan_excess.ColdFit(coef=(0.0, -0.01 * GiB), cov=(0.0, 0.0, 0.0, (0.01 * GiB) ** 2), m_ref=GiB,
                                dof=40, n_groups=7)
    none = plan_excess.task_bound(m, u, [2e7], excess, within, 0.99, 9, cold=2, cold_fit=measured_none)[1][0]
    assert plan_excess.task_bound(m, u, [2e7], excess, within, 0.99, 9, cold=2)[1][0] < none < \
        plan_excess.task_bound(m, u, [2e7], excess, within, 0.99, 9, cold=2, cold_fit=cold)[1][0]


@pytest.mark.integration
def test_a_saved_calibration_keeps_its_cold_fit_and_an_old_file_reads_without_one(tmp_path):
    from explorer.core.environment import environment_stamp

    cold = plan_excess.ColdFit(coef=(0.5 * MiB, 0.03 * GiB), cov=(1e10, -1e9, -1e9, 1e14), m_ref=GiB, dof=12.0, n_groups=6)
    c = cal.WorkerCalibration("gst3d", None, timing.fit_timing([]), 6, 6, 48, 0.99, 0, environment_stamp("gst3d"),
                              cold=cold)
    data = c.to_dict()
    assert data["cold"]["intercept_bytes"] == 0.5 * MiB and data["cold"]["bytes_per_byte"] == pytest.approx(0.03)
    assert cal.WorkerCalibration.from_dict(data).cold == cold
    del data["cold"]
    assert cal.WorkerCalibration.from_dict(data).cold is None


@pytest.mark.integration
def test_real_workers_record_each_ones_first_task_of_a_run(probed_runs):
    """The probes (a real LocalCluster of two one-thread workers) store whether each task was
    its worker's first of the run, its place among them and over the worker process's life;
    the calibration fits the cold offset from them."""
    from explorer.search.store import Store

    records = [r for r in Store(probed_runs).records("gst3d") if r.source == "probe"]
    runs: dict = {}
    for r in records:
        runs.setdefault(r.context["run"], []).append(r)
    assert len(runs) >= 3
    for run in runs.values():
        by_worker: dict = {}
        for r in run:
            by_worker.setdefault(r.context["worker"], []).append(r)
        for tasks in by_worker.values():
            assert sum(bool(r.context["first_in_run"]) for r in tasks) == 1
            assert sorted(r.context["task_index"] for r in tasks) == list(range(len(tasks)))
            first = [r for r in tasks if r.context["first_in_run"]][0]
            assert first.context["task_index"] == 0
            assert first.context["process_task_index"] == min(r.context["process_task_index"] for r in tasks)
    # the workers live across the probes: each counts its tasks over every run, so a later
    # run's first task is not its process's first
    by_process: dict = {}
    for r in records:
        by_process.setdefault(r.context["worker"], []).append(r.context["process_task_index"])
    for indices in by_process.values():
        assert sorted(indices) == list(range(len(indices)))
    assert any(r.context["first_in_run"] and r.context["process_task_index"] > 0 for r in records)
    saved = cal.load_calibration("gst3d", probed_runs)
    assert saved.cold is not None and saved.cold.n_groups >= 3


def test_rows_shown_above_or_below_the_ceiling_get_a_bound_on_the_right_side():
    """With a ceiling, a row is solved only where its cheap bounds straddle it: below its lower
    bound the answer is that bound (never above the quantile), above its upper bound that bound
    (never below the quantile)."""
    counts = np.array([1.0, 9.0, 100.0, 1000.0])
    a, b, sigma = np.full(4, 1.0), 0.2, 0.8
    kwargs = dict(cold=2, cold_offset=0.3, cold_sd=1.0, within_dof=88.0)
    exact = max_task.max_task_quantile(0.99, (a, b), (10.0, 12.0), sigma, counts, **kwargs)
    for ceiling, state in ((-1.0, max_task.ABOVE), (1e3, max_task.BELOW)):
        u, states = max_task.max_task_quantile(0.99, (a, b), (10.0, 12.0), sigma, counts, ceiling=ceiling, **kwargs)
        assert np.all(states == state)
        assert np.all(u <= exact) if state == max_task.ABOVE else np.all((u >= exact) & (u < 1.6 * exact))
    u, states = max_task.max_task_quantile(0.99, (a, b), (10.0, 12.0), sigma, counts, ceiling=exact * 1.0001, **kwargs)
    assert np.all(states == 0) and np.allclose(u, exact)


def test_a_plans_footprint_is_its_blocks_own_bound_not_the_shortcut():
    """The planner's ceiling lets the task model answer an upper bound for rows that surely
    fit; the plan is ranked and its footprint computed on its block's own bound."""
    from explorer.plan.planner import plan_chunks
    from explorer.plan.spec import VolumeGeometry, WorkerSpec

    class Isolated:
        operator, halo, info, stale = "gst3d", (5, 5, 5), {}, []

        def predict_many(self, shapes, confidence=0.99):
            v = np.asarray(shapes, dtype=float).reshape(-1, 3).prod(1)
            return 90.0 * v, 94.0 * v

    v = np.geomspace(1e4, 3e7, 7)
    excess = plan_excess.fit_excess(v, 0.5 * MiB + 4.0 * v + np.array([1, -1, 0.5, -0.5, 0.3, -0.3, 0.1]) * MiB)
    within = plan_excess.WithinFit(alpha_bytes=0.3 * MiB, beta=0.02, dof=96)
    cold = plan_excess.ColdFit(coef=(0.3 * MiB, 0.003 * GiB), cov=(1e10, 0.0, 0.0, (0.005 * GiB) ** 2), m_ref=GiB, dof=6,
                       n_groups=7)
    from explorer.core.environment import environment_stamp

    calibration = cal.WorkerCalibration("gst3d", excess, timing.fit_timing([]), 7, 7, 56, 0.99, 0,
                                        environment_stamp("gst3d"), within=within, cold=cold)
    model = task_model.TaskModel(Isolated(), calibration)
    plan = plan_chunks(VolumeGeometry((600, 500, 400), (5, 5, 5)), model.predict_many,
                       WorkerSpec(4 * GiB, 100 * MiB, workers=2))
    _, own = model.predict_many(np.asarray([plan.block]), 0.99, tasks=[plan.n_tasks],
                                cold=[min(plan.n_tasks, plan.slots)])
    assert plan.footprint.task_peak_bytes == pytest.approx(own[0], rel=1e-9)


def test_a_cold_spread_of_zero_gives_a_finite_bound_above_the_cold_offset():
    """A fitted cold spread of 0 (few groups) made ``(x - kappa) / sigma_c`` infinite and the
    tables' index garbage (``explore calibrate`` failed with an IndexError); the spread is floored
    at 1/64 of the warm tasks', so the bound is finite, at least the cold offset, and no lower
    than with the floor's spread itself."""
    from explorer.plan.max_task import max_task_quantile

    for shared in ((0.0, 0.0), (1e6, 5e5)):
        zero = max_task_quantile(0.99, shared, (10, 4), within_sd=1e5, tasks=2, cold=1, cold_offset=1e6, cold_sd=0.0)
        floor = max_task_quantile(0.99, shared, (10, 4), within_sd=1e5, tasks=2, cold=1, cold_offset=1e6,
                                  cold_sd=1e5 / 64)
        assert np.all(np.isfinite(zero)) and zero[0] >= 1e6
        assert zero[0] == pytest.approx(floor[0], rel=1e-9)


@pytest.mark.parametrize("case", [
    dict(a=[16991.5, 13647.4, 573.4, 0.0, 0.0, 1183.0, 0.0, 475771.8],
         b=[0.0, 41026.5, 6159.0, 29845.6, 4038.9, 725.0, 0.0, 202203.0],
         sigma=[0.0, 89390.5, 2207.4, 0.0, 709.0, 1441.4, 16308.7, 0.0],
         tasks=[176, 137, 75, 173, 105, 171, 85, 175],
         kappa=[0.0, 0.0, 0.0, 138976.0, 858596.4, 196369.7, 39538.3, 0.0],
         cold_sd=[0.0, 91933.4, 211250.6, 0.0, 2123.6, 753455.2, 9867925.6, 0.0], dofs=(2.0, 2.0), wd=1.0, c=0.99,
         anchor=1),
    dict(a=[0.0, 47142.6, 37789.0, 1378.7, 1027.3, 0.0, 0.0, 10438.6],
         b=[0.0, 0.0, 0.0, 0.0, 111513.1, 5155.7, 0.0, 0.0],
         sigma=[106553.9, 4416.9, 350826.1, 376.9, 468103.5, 230.9, 0.0, 281.6],
         tasks=[61, 106, 97, 4, 179, 157, 141, 7],
         kappa=[771876.9, 0.0, 3622.0, 0.0, 335842.0, 0.0, 35671.2, 0.0],
         cold_sd=[41966281.0, 123325.9, 1631960.2, 175147.6, 204437645.7, 6326.6, 0.0, 1190.0],
         dofs=(math.inf, 2.0), wd=59.0, c=0.99, anchor=4),
])
def test_a_row_newton_solves_exactly_keeps_its_root_while_the_block_goes_on(case):
    """Rows are solved together, one Newton iteration per block; a row whose step came out exactly
    zero (its root found) while others still stepped was taken for a step out of its bracket and
    sent to the midpoint of ``(-inf, u]`` (CI, a one-worker probe's calibration: an IndexError from
    the tables).  Found by a search over random inputs; each row's bound is now finite and the
    same as when that row is solved beside one other (``anchor``: with a shared error of both
    kinds and a spread within, so that the pair's quadrature rule and tables are the block's)."""
    columns = {k: np.asarray(case[k], dtype=np.float64) for k in ("a", "b", "sigma", "tasks", "kappa", "cold_sd")}

    def solve(rows):
        x = {k: v[rows] for k, v in columns.items()}
        return max_task.max_task_quantile(case["c"], (x["a"], x["b"]), case["dofs"], x["sigma"], x["tasks"], cold=1,
                                          cold_offset=x["kappa"], cold_sd=x["cold_sd"], within_dof=case["wd"])

    together = solve(slice(None))
    assert np.all(np.isfinite(together))
    for r in range(len(together)):
        assert together[r] == pytest.approx(solve([case["anchor"], r])[1], rel=2e-3), r
