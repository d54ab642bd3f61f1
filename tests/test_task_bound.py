"""The bound on the largest of a plan's tasks in workers (issue 33 item 4): the exact quantile of
a shared error plus the largest of n within-group deviations, against Monte Carlo and numerical
integration (pure); each group at its fresh level, the mean of the tasks that were their
worker's first of the run (recorded by real workers), and the spread learnt above it, from
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
    mean, upper = plan_excess.task_bound(mean_p, upper_p, voxels, excess, within, c, n, isolated_dof=nu_p)
    # plans drawn from the model the bound describes: S = a T_nu_P + b T_{n-p}, W = sigma_w T_nu_w
    b = d_half[0] / stats.t.ppf(c, excess.dof)
    largest = mean[0] + simulate(rng, plans, a, b, sigma, n, dofs=(nu_p, excess.dof), within_dof=within.dof)
    covered = float((largest <= upper[0]).mean())
    assert covered >= c - 3.5 * math.sqrt(c * (1 - c) / plans)
    old = mean[0] + math.sqrt((upper_p[0] - mean_p[0]) ** 2 + d_half[0] ** 2
                              + (stats.t.ppf(c ** (1 / n), within.dof) * sigma) ** 2)
    assert float((largest <= old).mean()) < 0.97 < 0.985 < covered


def test_the_planner_bounds_the_largest_of_each_candidates_tasks():
    """``plan_chunks`` passes each candidate's task count to a predictor that takes it."""
    from explorer.plan.planner import plan_chunks
    from explorer.plan.predictor import takes_keywords
    from explorer.plan.spec import VolumeGeometry, WorkerSpec

    seen = []

    @takes_keywords("tasks")
    def predict(shapes, confidence=0.99, tasks=1):
        seen.append((np.asarray(shapes).copy(), np.asarray(tasks).copy()))
        v = np.asarray(shapes, dtype=float).prod(1)
        return 50.0 * v, 60.0 * v

    plan = plan_chunks(VolumeGeometry((300, 300, 300), (2, 2, 2)), predict,
                       WorkerSpec(2**31, 100 * MiB, threads_per_worker=2, workers=3))
    blocks, tasks = (np.concatenate(x) for x in zip(*seen))
    at = np.flatnonzero((blocks == plan.block).all(axis=1))
    assert len(at) and np.all(tasks[at] == plan.n_tasks) and len(np.unique(tasks)) > 1


# --------------------------------------------------------------------------- the fresh level


def probe_groups(rng, *, reuse=0.0, above=0.0, n_groups=7, workers=2, per_worker=4, alpha=0.2 * MiB, beta=0.02,
                 flagged=True):
    """Records of ``n_groups`` probe-like runs of ``workers x per_worker`` tasks each at levels
    from 2 MiB to 2 GiB, each worker's first task cold: every other warm task reused ``reuse`` of
    the level, the rest grew ``above`` of it more than a cold one; spread ``alpha^2 + beta^2 m^2``."""
    records = []
    for g, m in enumerate(np.geomspace(2 * MiB, 2048 * MiB, n_groups)):
        sd = math.sqrt(alpha**2 + (beta * m) ** 2)
        for w in range(workers):
            for i in range(per_worker):
                shift = 0.0 if i == 0 else (-reuse if i % 2 else above) * m
                context = {"run": f"r{g}", "exact": True, "worker": f"w{w}", "task_index": i}
                if flagged:
                    context["first_in_run"] = i == 0
                records.append(Record(shape=(10 + g, 10 + g, 10 + g), peak_bytes=float(m + shift + rng.normal(0, sd)),
                                      status="ok", source="probe", context=context))
    return records


def within_of_records(records):
    groups = plan_excess.task_groups(records)
    return groups, plan_excess.fit_within(groups.level_bytes, groups.variances, groups.n_tasks, groups.deviations,
                                          groups.dofs, groups.factors)


def test_a_group_is_valued_at_its_cold_tasks_and_reuse_below_them_does_not_widen_the_spread():
    """Warm tasks that reused 40% of what a fresh one grows (every other one) neither lower a
    group's level nor widen its spread: the level is the cold tasks' mean and the spread is
    learnt from the deviations above it.  Valued at the mean of all its tasks with the spread
    either side (the rule before), the same groups' level fell by about 10% and their
    spread grew tenfold."""
    rng = np.random.default_rng(3)
    records = probe_groups(rng, reuse=0.4)
    groups, within = within_of_records(records)
    levels = np.geomspace(2 * MiB, 2048 * MiB, 7)
    assert np.all(groups.n_cold == 2)
    assert np.allclose(groups.level_bytes, levels, rtol=0.06, atol=0.5 * MiB)
    assert within.beta == pytest.approx(0.02, rel=0.35) and within.dof == int(groups.dofs.sum()) - 2
    # the scores keep every task, the reused ones far below
    assert len(within.scores) == len(records) and within.scores[0] < -10
    # with the tasks' mean as the level and their spread either side: lower, far wider
    peaks = [np.asarray([r.peak_bytes for r in records if r.context["run"] == f"r{g}"]) for g in range(7)]
    either_side = plan_excess.fit_within([p.mean() for p in peaks], [p.var(ddof=1) for p in peaks],
                                         [len(p) for p in peaks])
    assert np.all(np.asarray([p.mean() for p in peaks])[3:] < 0.92 * groups.level_bytes[3:])
    assert either_side.beta > 8 * within.beta


def test_warm_tasks_above_their_cold_ones_widen_the_spread_they_showed():
    """A warm task that grows more than a fresh one (8% above: say, a buffer kept from the task
    before) is a deviation above the level: the spread learns it, and the bound on a task
    covers it."""
    rng = np.random.default_rng(4)
    groups, within = within_of_records(probe_groups(rng, above=0.08))
    assert within.beta > 0.04
    excess = plan_excess.fit_excess(groups.shapes.prod(axis=1).astype(float), groups.level_bytes * 0.5)
    level = groups.level_bytes[-1]
    _, upper = plan_excess.task_bound(np.array([level / 2]), np.array([level / 2]), [float(groups.shapes[-1].prod())],
                                      excess, within, 0.99, 9)
    assert upper[0] > 1.08 * level


def test_tasks_not_told_apart_are_one_cell_at_their_mean():
    """Observations saved before the flag: the level is the group's mean, the spread is learnt
    from the deviations above it, each of variance ``(1 - 1/n) sigma^2``."""
    rng = np.random.default_rng(5)
    groups, within = within_of_records(probe_groups(rng, flagged=False, n_groups=12, per_worker=8))
    assert np.all(groups.n_cold == 0)
    for g, deviation in enumerate(groups.deviations):
        assert deviation.mean() == pytest.approx(0.0, abs=1e-6 * groups.level_bytes[g])
        assert groups.dofs[g] == (deviation > 0).sum()
        assert np.allclose(groups.factors[g], 1 - 1 / 16)
    assert within.beta == pytest.approx(0.02, rel=0.3)


@pytest.mark.integration
def test_a_calibration_of_the_rule_before_is_not_used(tmp_path):
    """A file of format 3 was fitted to the groups' warm means with a cold offset beside it, which
    this version does not read: it is used as none, with the command that rebuilds it."""
    import json

    path = cal.calibration_path("gst3d", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format_version": 3, "operator": "gst3d", "cold": {"coef": [0.0, 1.0]}}))
    assert cal.FORMAT_VERSION == 4
    with pytest.warns(RuntimeWarning, match="calibration format 3, this one reads 4.*explore gst3d"):
        assert cal.load_calibration("gst3d", tmp_path) is None


@pytest.mark.integration
def test_real_workers_record_each_ones_first_task_of_a_run(probed_runs):
    """The probes (a real LocalCluster of two one-thread workers) store whether each task was
    its worker's first of the run, its place among them and over the worker process's life;
    the calibration values each group at its cold tasks."""
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
    # a run's first task on each worker is on one block shape: that group is valued at them
    groups = plan_excess.task_groups(records)
    assert (groups.n_cold == 2).sum() >= 3
    for g in np.flatnonzero(groups.n_cold > 0):
        cold = groups.factors[g] < 1
        assert cold.sum() == groups.n_cold[g] and abs(groups.deviations[g][cold].sum()) <= 1e-6 * groups.level_bytes[g]
    assert cal.load_calibration("gst3d", probed_runs).within is not None


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
    from explorer.core.environment import environment_stamp

    calibration = cal.WorkerCalibration("gst3d", excess, timing.fit_timing([]), 7, 7, 56, 0.99, 0,
                                        environment_stamp("gst3d"), within=within)
    model = task_model.TaskModel(Isolated(), calibration)
    plan = plan_chunks(VolumeGeometry((600, 500, 400), (5, 5, 5)), model.predict_many,
                       WorkerSpec(4 * GiB, 100 * MiB, workers=2))
    _, own = model.predict_many(np.asarray([plan.block]), 0.99, tasks=[plan.n_tasks])
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
