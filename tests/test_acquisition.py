"""Acquisition on synthetic truths: candidates, designs, scoring, safety, batches, stopping."""

from __future__ import annotations


import numpy as np
import pytest

from explorer.search import acquisition as acq
from explorer.model.fit import fit

MiB = 2**20
GiB = 2**30
CV = 0.005


def truth(shapes):
    """gst3d-like: 240 bytes per voxel of the (n + 4)-padded block + 5 MiB."""
    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    return 240.0 * (d[:, 0] + 4) * (d[:, 1] + 4) * (d[:, 2] + 4) + 5 * MiB


def measure(shapes, rng, repeats=2):
    """Mean of ``repeats`` noisy runs and the variance of that mean."""
    runs = truth(shapes)[:, None] * (1.0 + CV * rng.standard_normal((len(shapes), repeats)))
    return runs.mean(1), runs.var(1, ddof=1) / repeats


def fit_truth(shapes, seed=0, lower_bound=None, values=None):
    shapes = np.asarray(shapes)
    rng = np.random.default_rng(seed)
    peak, var = measure(shapes, rng)
    lower = np.zeros(len(shapes), dtype=bool) if lower_bound is None else lower_bound
    if values is not None:
        peak = np.where(lower, values, peak)
    return fit("gst3d", shapes, peak, var, lower, halo=(2, 2, 2), n_repeats=np.full(len(shapes), 2))


@pytest.fixture(scope="module")
def model():
    shapes = np.vstack([acq.initial_design(6, max_input_bytes=16 * MiB),
                        acq.candidate_shapes(8, min_dim=16, max_dim=200, seed=3)])
    return fit_truth(shapes)


@pytest.fixture(scope="module")
def targets(model):
    candidates = acq.candidate_shapes(2048, seed=1)
    return candidates[acq.target_mask(model, candidates, 1.5 * GiB)]


def test_candidate_shapes_are_seeded_log_space_filling():
    a = acq.candidate_shapes(2000, min_dim=8, max_dim=2048, seed=0)
    assert a.shape == (2000, 3) and a.dtype.kind == "i"
    assert a.min() >= 8 and a.max() <= 2048
    np.testing.assert_array_equal(a, acq.candidate_shapes(2000, seed=0))
    assert not np.array_equal(a, acq.candidate_shapes(2000, seed=1))
    # Uniform in log-dims: half of each axis below the geometric middle (128), each decade filled.
    assert np.all(np.abs((a < 128).mean(0) - 0.5) < 0.03)
    assert np.all(np.histogram(np.log(a[:, 0]), bins=8)[0] > 200)


def test_initial_design_is_small_safe_and_spread():
    cap = 64 * MiB
    design = acq.initial_design(5, max_input_bytes=cap, min_dim=8)
    assert design.shape == (5, 3)
    assert len({tuple(s) for s in design}) == 5
    volumes = np.prod(design.astype(np.float64), axis=1)
    assert np.all(4 * volumes <= cap)
    assert volumes.max() / volumes.min() > 100  # small to conservative
    assert 4 * volumes.max() > 0.5 * cap
    aspect = design.max(1) / design.min(1)
    assert aspect.max() >= 2.5  # not all cubes
    assert len({tuple(np.argsort(s)) for s in design}) >= 3  # the long axis varies
    with pytest.raises(ValueError):
        acq.initial_design(5, max_input_bytes=100, min_dim=8)


def test_target_mask_is_task_memory_between_1_and_100_percent(model):
    limit = 1.5 * GiB
    shapes = acq.candidate_shapes(500, seed=4)
    mean, upper = model.predict_many(shapes, 0.99)
    task_mean = 4 * np.prod(shapes.astype(np.float64), axis=1) + mean
    task_upper = 4 * np.prod(shapes.astype(np.float64), axis=1) + upper
    mask = acq.target_mask(model, shapes, limit, 0.99)
    np.testing.assert_array_equal(mask, (task_upper >= 0.01 * limit) & (task_mean <= limit))
    assert 0 < mask.sum() < len(shapes)
    assert acq.target_mask(model, [[300, 300, 300]], limit).tolist() == [False]  # 6.5 GB
    assert acq.target_mask(model, [[100, 100, 100]], limit).tolist() == [True]  # ~270 MB


def test_cost_model_defaults_fit_and_rescale():
    default = acq.CostModel()
    assert not default.fitted
    assert default.predict([[100, 100, 100]])[0] == pytest.approx(1.0 + 5e-8 * 1e6)
    rng = np.random.default_rng(0)
    shapes = acq.candidate_shapes(20, min_dim=16, max_dim=400, seed=2)
    seconds = (0.4 + 2e-8 * np.prod(shapes.astype(np.float64), axis=1)) * np.exp(0.02 * rng.standard_normal(20))
    fitted = acq.CostModel.fit(shapes, seconds)
    assert fitted.fitted
    assert fitted.intercept_seconds == pytest.approx(0.4, rel=0.05)
    assert fitted.seconds_per_voxel == pytest.approx(2e-8, rel=0.05)
    one = acq.CostModel.fit(shapes[:1], [2 * default.predict(shapes[:1])[0]])
    assert one.predict(shapes[:1])[0] == pytest.approx(2 * default.predict(shapes[:1])[0])
    assert not acq.CostModel.fit(np.zeros((0, 3)), []).fitted


def test_variance_reduction_matches_brute_force_refit(model, targets):
    """IVR == the drop of sum_t var(t) / mean(t)^2 after conditioning on the candidate from scratch."""
    candidates = acq.candidate_shapes(12, seed=7)
    targets = targets[:100]
    ivr = acq.integrated_variance_reduction(model, candidates, targets)
    mean_t, var_t = model.latent_moments(targets)
    brute = []
    for c in candidates:
        mean_c, _ = model.latent_moments(c)
        after = model.with_observations([c], mean_c, model.noise_var([c]))
        brute.append(np.sum((var_t - after.latent_moments(targets)[1]) / mean_t**2))
    np.testing.assert_allclose(ivr, brute, rtol=1e-5)
    assert ivr.max() > 10 * ivr.min()  # the score discriminates


def test_scores_of_2000_candidates_are_finite_and_favour_informative_shapes(model, targets):
    """Scoring at the loop's own scale (its latency is measured by scripts/bench_explore.py):
    finite, non-negative, and a candidate already profiled scores far below a new one."""
    candidates = acq.candidate_shapes(2000, seed=5)
    t300 = targets[np.linspace(0, len(targets) - 1, 300).astype(int)]
    scores = acq.integrated_variance_reduction(model, candidates, t300)
    assert scores.shape == (2000,) and np.all(np.isfinite(scores)) and np.all(scores >= 0)
    seen = model.train_shapes[np.argmax(model.train_bytes)][None, :]
    best = candidates[np.argmax(scores)][None, :]
    assert acq.integrated_variance_reduction(model, seen, t300)[0] < 0.1 * acq.integrated_variance_reduction(
        model, best, t300)[0]


def test_safety_filter_excludes_shapes_over_the_cap(model, targets):
    candidates = acq.candidate_shapes(2000, seed=5)
    cost = acq.CostModel(1.0, 0.0)  # every profile costs the same: the score is the variance reduction

    def task_upper(shapes):
        shapes = np.array(shapes)
        return 4 * np.prod(shapes.astype(float), axis=1) + model.predict_many(shapes)[1]

    unconstrained = acq.propose(model, candidates, targets, cost, np.inf, n=3)
    cap = 0.99 * task_upper(unconstrained).max()  # the largest of them is now unsafe
    picks = acq.propose(model, candidates, targets, cost, cap, n=3)
    assert len(picks) == 3
    assert np.all(task_upper(picks) <= cap)
    assert set(picks) != set(unconstrained)
    assert acq.propose(model, candidates, targets, cost, 1.0, n=3) == []  # nothing fits in 1 byte


def test_no_shape_at_or_above_an_exceeded_profile():
    base = np.vstack([acq.initial_design(6, max_input_bytes=16 * MiB), acq.candidate_shapes(8, min_dim=16, max_dim=200, seed=3)])
    exceeded = np.array([[150, 150, 150]])
    model = fit_truth(np.vstack([base, exceeded]), lower_bound=np.append(np.zeros(len(base), bool), True),
                      values=np.append(np.zeros(len(base)), 4 * GiB))
    candidates = np.array([[150, 150, 150], [150, 151, 300], [600, 150, 150], [149, 600, 600], [60, 60, 60]])
    safe = acq.safe_mask(model, candidates, np.inf)
    np.testing.assert_array_equal(safe, [False, False, False, True, True])
    targets = acq.candidate_shapes(200, min_dim=16, max_dim=300, seed=9)
    picks = acq.propose(model, candidates, targets, acq.CostModel(), np.inf, n=5)
    assert sorted(picks) == [(60, 60, 60), (149, 600, 600)]


def test_batch_is_distinct_and_its_greedy_update_is_exact(model, targets):
    candidates = acq.candidate_shapes(400, seed=6)
    cost = acq.CostModel()
    cap = 4 * GiB
    picks = acq.propose(model, candidates, targets, cost, cap, n=4)
    assert len(picks) == 4 and len(set(picks)) == 4
    # Each pick and its score are those of the model conditioned from scratch on the
    # previous picks (hyperparameters fixed): the rank-one updates are exact.
    seconds = cost.predict(candidates)
    safe = acq.safe_mask(model, candidates, cap)
    index, scores = acq._greedy_batch(model, candidates, targets, seconds, safe, 4)
    assert [tuple(candidates[j]) for j in index] == picks
    conditioned = model
    for k, j in enumerate(index):
        score = acq.integrated_variance_reduction(conditioned, candidates, targets) / seconds
        score[~safe] = -np.inf
        score[index[:k]] = -np.inf
        assert int(np.argmax(score)) == j
        assert scores[k] == pytest.approx(score[j], rel=1e-6)
        x = candidates[j : j + 1]
        # The noise of a new run at x is the original model's (propose fixes it before picking).
        conditioned = conditioned.with_observations(x, conditioned.latent_moments(x)[0], model.noise_var(x))


def test_pending_shapes_are_never_proposed_and_the_batch_is_picked_as_if_they_were_profiled(model, targets):
    """What another process is profiling: conditioned on exactly (no value needed), never picked again."""
    candidates = acq.candidate_shapes(400, seed=6)
    cost = acq.CostModel()
    cap = 4 * GiB
    alone = acq.propose(model, candidates, targets, cost, cap, n=3)
    pending = alone[:1]
    picks = acq.propose(model, candidates, targets, cost, cap, n=2, pending=pending, exclude=[alone[2]])
    assert pending[0] not in picks and alone[2] not in picks and len(picks) == 2
    # the same picks as from the model conditioned on the pending shape, minus the excluded one
    x = np.array(pending)
    conditioned = model.with_observations(x, model.latent_moments(x)[0], model.noise_var(x))
    seconds = cost.predict(candidates)
    score = acq.integrated_variance_reduction(conditioned, candidates, targets) / seconds
    score[~acq.safe_mask(model, candidates, cap)] = -np.inf
    score[[tuple(c) in (pending[0], alone[2]) for c in candidates]] = -np.inf
    assert picks[0] == tuple(candidates[int(np.argmax(score))])


def test_stopping_metric_decreases_as_points_are_added():
    rng = np.random.default_rng(11)
    limit, cap = 1.5 * GiB, 4 * GiB
    candidates = acq.candidate_shapes(1024, seed=1)
    task = 4 * np.prod(candidates.astype(np.float64), axis=1) + truth(candidates)
    targets = candidates[(task >= 0.01 * limit) & (task <= limit)]
    shapes = acq.initial_design(5, max_input_bytes=16 * MiB)
    peaks, variances = measure(shapes, rng)
    metric = []
    for _ in range(6):
        model = fit("gst3d", shapes, peaks, variances, np.zeros(len(shapes), bool), n_repeats=np.full(len(shapes), 2))
        metric.append(float(np.max(acq.relative_half_width(model, targets))))
        batch = np.array(acq.propose(model, candidates, targets, acq.CostModel(), cap, n=2))
        p, v = measure(batch, rng)
        shapes, peaks, variances = np.vstack([shapes, batch]), np.append(peaks, p), np.append(variances, v)
    print("\nmax relative half-width by round:", " ".join(f"{m:.3f}" for m in metric))
    assert metric[-1] < metric[0] / 10
    assert metric[-1] <= acq.DEFAULT_TOLERANCE
    # With hyperparameters fixed, every observation can only shrink the latent variance.
    fixed = model
    before = fixed.latent_moments(targets)[1]
    for shape in candidates[:5]:
        fixed = fixed.with_observations([shape], fixed.latent_moments(shape)[0], fixed.noise_var([shape]))
        after = fixed.latent_moments(targets)[1]
        assert np.all(after <= before * (1 + 1e-9))
        before = after


def test_relative_half_width_definition(model):
    shapes = np.array([[64, 64, 64], [200, 30, 90]])
    mean, upper = model.predict_many(shapes, 0.95)
    np.testing.assert_allclose(acq.relative_half_width(model, shapes, 0.95), (upper - mean) / mean)


def test_validation_picks_are_a_seeded_uniform_sample_of_the_safe_targets(model, targets):
    """The stop's evidence is a sample of the target region, not the bound's own choice: over
    many draws every safe target is picked about equally often (the widest ones no more), a
    draw never repeats a profiled shape or exceeds the cap, and it is a function of (seed,
    history)."""
    width = acq.relative_half_width(model, targets)
    cap = float(np.median(acq.input_bytes(targets) + model.predict_many(targets)[1]))
    safe = acq.safe_mask(model, targets, cap)
    exclude = [tuple(int(d) for d in targets[np.flatnonzero(safe)[0]])]
    first = acq.validation_shapes(model, targets, cap, n=3, exclude=exclude, seed=7)
    assert first == acq.validation_shapes(model, targets, cap, n=3, exclude=exclude, seed=7)
    assert first != acq.validation_shapes(model, targets, cap, n=3, exclude=exclude, seed=8)
    counts = {}
    for seed in range(400):
        for shape in acq.validation_shapes(model, targets, cap, n=1, exclude=exclude, seed=seed):
            counts[shape] = counts.get(shape, 0) + 1
    allowed = {tuple(int(d) for d in s) for s in targets[safe]} - set(exclude)
    assert set(counts) <= allowed
    expected_distinct = len(allowed) * (1 - (1 - 1 / len(allowed)) ** 400)  # uniform draws
    assert len(counts) > 0.9 * expected_distinct
    widest = {tuple(int(d) for d in s) for s in targets[safe][np.argsort(-width[safe])[:len(allowed) // 4]]}
    picked_widest = sum(c for s, c in counts.items() if s in widest) / 400
    assert picked_widest < 0.5  # a quarter of the targets; the old rule picked only these


@pytest.mark.parametrize("confidence", [0.9, 0.99, 0.999])
def test_the_risk_of_a_run_over_its_bound_is_split_between_the_evidence_and_the_run(confidence):
    """``P(run > bound) <= level + (1 - quantile) = 1 - confidence`` (``acq.risk_split``): the
    evidence takes ``EVIDENCE_SHARE`` of the risk, the run's quantile the rest, and a different
    share moves risk between them without changing the total."""
    level, quantile = acq.risk_split(confidence)
    assert level + (1 - quantile) == pytest.approx(1 - confidence)
    assert level == pytest.approx(acq.EVIDENCE_SHARE * (1 - confidence)) and quantile > confidence
    other_level, other_quantile = acq.risk_split(confidence, share=0.2)
    assert other_level < level and other_quantile < quantile
    assert other_level + (1 - other_quantile) == pytest.approx(1 - confidence)


def test_the_target_region_stops_at_the_largest_block_the_probes_reach(gst3d_model):
    """With the probes to run, the loop learns only blocks a plan may run: at most the largest
    probe the seconds budget allows (``probe_volume_cap``), which is :func:`probe_blocks`'
    largest block without a memory limit, and shrinks with the budget."""
    import operators
    from explorer.runner.probes import probe_blocks, probe_volume_cap
    from explorer.search.core import ExplorationCore

    op = operators.get("gst3d")
    cap = probe_volume_cap(op, 1.6e-7, budget_seconds=20)
    largest = probe_blocks(op, 2048.0**3, 1.6e-7, budget_seconds=20)[-1]
    assert cap == float(np.prod(largest)) and 150**3 < cap < 300**3
    assert probe_volume_cap(op, 1.6e-7, budget_seconds=5) < cap < probe_volume_cap(op, 1.6e-7, budget_seconds=90)
    assert probe_volume_cap(op, None) is None and probe_volume_cap(op, 0.0) is None  # no clock yet: no bound

    core = ExplorationCore("gst3d", memory_limit=4 * 2**30, memory_cap=8 * 2**30)
    whole = core.target_shapes(gst3d_model)
    volumes = np.prod(whole.astype(float), axis=1)
    assert volumes.max() > cap  # the memory alone would have the loop learn larger blocks
    core.max_block_voxels = cap
    bounded = core.target_shapes(gst3d_model)
    assert len(bounded) > 100 and np.prod(bounded.astype(float), axis=1).max() <= cap


def test_the_probes_never_pass_the_region_the_loop_learnt(gst3d_model):
    """The probes keep to the region the saved model says its loop learnt, whether they are sized
    from the plan-scale cube of a target memory (shrinking from it by seconds once rounded gst3d's
    top probe to 225^3 against a region of 216^3) or, with none that fits, from the isolated
    profiles' reach (first_derivative at 64 MiB: the region's 810^3 blocks, not its profiles')."""
    import copy

    import operators
    from explorer.runner.probes import model_probe_blocks, profiled_volume

    def top(blocks):
        return max(np.prod(b, dtype=float) for b in blocks)

    op = operators.get("gst3d")
    model = copy.deepcopy(gst3d_model)
    model.info["seconds_per_voxel"] = None  # no seconds budget: the memory and the reach alone
    limit, baseline = 4 * 2**30, 100 * 2**20
    free = top(model_probe_blocks(op, model, limit, baseline))
    reach = top(model_probe_blocks(op, model, None, baseline))
    assert reach <= profiled_volume(model) + 1
    for region in (0.7 * free, 0.6 * reach, 10 * max(free, reach)):
        model.info["region_max_block_voxels"] = region
        assert top(model_probe_blocks(op, model, limit, baseline)) <= min(region, free)
        assert top(model_probe_blocks(op, model, None, baseline)) <= min(region, reach)
    # a region beyond both changes nothing
    assert top(model_probe_blocks(op, model, limit, baseline)) == free
    assert top(model_probe_blocks(op, model, None, baseline)) == reach
    # and the region's own cube is a probe edge exactly (no cube root rounding it down by one)
    model.info["region_max_block_voxels"] = 150.0**3
    assert top(model_probe_blocks(op, model, limit, baseline)) == 150.0**3
