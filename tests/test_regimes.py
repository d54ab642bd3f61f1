"""Regime boundaries (``explorer.model.regimes``): a peak that jumps where the operator switches
algorithm with the block's shape, found from the profiles and predicted on both sides."""

from __future__ import annotations

import numpy as np
import pytest

from explorer.model import regimes
from explorer.model.basis import NO_REGIME, regime_side
from explorer.model.fit import fit
from explorer.model.memory_model import MemoryModel
from operators.base import Operator, register

MiB = 2**20
OPERATOR = "test_regime_truth"


@register
class _RegimeTruthOperator(Operator):
    """Declares nothing of its axes (every axis its own class, no padding), as a user's own
    operator: registered so that the loop's core can size its candidates."""

    name = OPERATOR

    def run(self, block):
        return block


def two_algorithm_truth(shapes):
    """PyTorch's CPU conv3d as measured (``docs/calibration.md``): 118 bytes of peak per input byte
    while ``4 n1 n2 <= 20480`` (Slow3d's vol2col buffer), 32 above it (oneDNN)."""
    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    slow = d[:, 0] * d[:, 1] <= 5120
    return 6 * MiB + 4 * d.prod(1) * np.where(slow, 118.0, 32.0) + 200 * d[:, 0] * d[:, 1]


def three_algorithm_truth(shapes):
    """The three-layer torch stack as measured (``docs/calibration.md``): its 4-channel layers leave
    Slow3d at ``4 n1 n2 = 20480`` and its 1-channel layer at ``n1 n2 = 20480``: 118, then 32,
    then 26 bytes of peak per input byte."""
    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    p = d[:, 0] * d[:, 1]
    return 6 * MiB + 4 * d.prod(1) * np.where(p <= 5120, 118.0, np.where(p <= 20480, 32.0, 26.0)) + 200 * p


def smooth_truth(shapes):
    """Bytes per voxel growing with the volume, and faces: no step anywhere."""
    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    v = d.prod(1)
    return 8 * MiB + (150 + 30 * np.log10(v)) * v + 64 * (d[:, 0] * d[:, 1] + d[:, 1] * d[:, 2])


def random_shapes(rng, n, max_volume=4e6):
    out = []
    while len(out) < n:
        shape = np.exp(rng.uniform(np.log(8), np.log(400), 3)).round()
        if shape.prod() <= max_volume:
            out.append(shape)
    return np.array(out)


def fitted(truth, seed, n=30, cv=0.003):
    """The model of ``n`` profiles of ``truth`` at random shapes, each the mean of two runs."""
    rng = np.random.default_rng(seed)
    shapes = random_shapes(rng, n)
    runs = truth(shapes)[:, None] * (1 + cv * rng.standard_normal((n, 2)))
    return fit(OPERATOR, shapes, runs.mean(1), runs.var(1, ddof=1) / 2, np.zeros(n, dtype=bool),
               n_repeats=np.full(n, 2))


def test_a_blocks_side_is_below_above_or_in_the_gap_between_the_profiles():
    regime = np.array([1.0, 1.0, 0.0, np.log(4000), np.log(6000)])
    dims = np.array([[50, 50, 9], [55, 100, 9], [100, 100, 9], [40, 100, 1000]], dtype=float)
    assert regime_side(dims, regime, np.ones(3))[:, 0].tolist() == [0.0, 0.5, 1.0, 0.0]
    assert regime_side(dims, NO_REGIME, np.ones(3)).tolist() == [[0.0]] * 4
    two = np.array([regime, [1.0, 0.0, 0.0, np.log(45), np.log(52)]])
    assert regime_side(dims, two, np.ones(3)).tolist() == [[0, 0.5], [0.5, 1], [1, 1], [0, 0]]


def test_candidate_boundaries_keep_alike_axes_alike_and_three_profiles_a_side():
    dims = random_shapes(np.random.default_rng(0), 12)
    every = regimes.candidate_boundaries(dims, np.ones(3), (0, 1, 2))
    assert {tuple(c[:3]) for c in every} == {w for w in np.ndindex(2, 2, 2) if any(w)}
    alike = regimes.candidate_boundaries(dims, np.ones(3), (0, 0, 0))
    assert {tuple(c[:3]) for c in alike} == {(1.0, 1.0, 1.0)}  # the volume only
    level = np.log(dims).sum(1)
    for c in alike:
        below = int((level <= c[3]).sum())
        assert regimes.MIN_SIDE <= below <= len(dims) - regimes.MIN_SIDE


#: The profiles both two-algorithm tests fit: with the boundary, and with it refused.
TWO_ALGORITHM_SEED = 0


def test_two_algorithms_get_their_boundary_and_a_bound_that_covers_both_sides():
    seed = TWO_ALGORITHM_SEED
    model = fitted(two_algorithm_truth, seed)
    kept = model.info["regime"]
    assert kept["kept"], kept
    assert model._a["regime"].shape == (1, 5)  # one step, one boundary
    regime = model._a["regime"][0]
    assert regime[:3].tolist() == [1.0, 1.0, 0.0] and regime[3] < np.log(5120) < regime[4]
    assert model.regime.startswith("n1 n2 between ")

    held_out = random_shapes(np.random.default_rng(100 + seed), 400)
    truth = two_algorithm_truth(held_out)
    mean, upper = model.predict_many(held_out, 0.99)
    decided = ~(regime_side(held_out, model._a["regime"], np.ones(3)) == 0.5).any(axis=1)
    assert np.median(np.abs(mean[decided] / truth[decided] - 1)) < 0.02  # each side's own mean
    assert np.mean(truth <= upper) >= 0.97
    # a block whose side the profiles leave open is bounded as the higher of its two sides
    gap = ~decided
    if gap.any():
        for s in (0.0, 1.0):
            m, v = model._latent_at(held_out[gap], np.full((int(gap.sum()), 1), s))
            assert np.all(model._latent(held_out[gap])[0] >= m)
        assert np.all(truth[gap] <= upper[gap])


@pytest.mark.parametrize("seed", [0, 1])
def test_three_algorithms_get_two_boundaries_one_at_a_time(seed):
    """A second step (17% at ``n1 n2 = 20480``) is found once the first is in the model: each
    boundary is scanned for and kept on its own evidence (``fit._with_boundary``)."""
    model = fitted(three_algorithm_truth, seed, n=40)
    rows = model._a["regime"]
    assert rows.shape == (2, 5) and [steps["kept"] for steps in model.info["regime"]["steps"]][:2] == [True, True]
    gaps = sorted((np.exp(row[3]), np.exp(row[4])) for row in rows if row[:3].tolist() == [1.0, 1.0, 0.0])
    assert gaps[0][0] < 5120 < gaps[0][1] and gaps[1][0] < 20480 < gaps[1][1], gaps
    assert set(model.coefficients) >= {"constant_above", "volume_above", "constant_above_2", "volume_above_2"}
    held_out = random_shapes(np.random.default_rng(100 + seed), 400)
    mean, upper = model.predict_many(held_out, 0.99)
    truth = three_algorithm_truth(held_out)
    assert np.mean(truth <= upper) >= 0.97 and np.median(np.abs(mean / truth - 1)) < 0.01


def test_without_the_boundary_the_same_profiles_miss_on_the_high_side(monkeypatch):
    """What the boundary is for: the smooth model of the same profiles spreads the step over its
    neighbourhood and its bound misses blocks on the high side near it."""
    monkeypatch.setattr(regimes, "accept", lambda *args: False)
    model = fitted(two_algorithm_truth, TWO_ALGORITHM_SEED)
    assert not model.info["regime"]["kept"]
    held_out = random_shapes(np.random.default_rng(100 + TWO_ALGORITHM_SEED), 400)
    near_high = np.abs(np.log(held_out[:, 0] * held_out[:, 1] / 5120)) < 0.5
    near_high &= held_out[:, 0] * held_out[:, 1] <= 5120
    _, upper = model.predict_many(held_out[near_high], 0.99)
    assert np.mean(two_algorithm_truth(held_out[near_high]) <= upper) < 0.97


@pytest.mark.parametrize("seed", [0, 1])
def test_a_smooth_peak_keeps_no_boundary(seed):
    model = fitted(smooth_truth, seed)
    assert not model.info.get("regime", {}).get("kept", False), model.info.get("regime")
    assert model._a["regime"].tolist() == NO_REGIME.tolist() and model.regime is None


def test_a_model_saved_before_regimes_existed_predicts_as_it_did():
    """Its arrays have no ``regime`` and three lengthscales (``MemoryModel.load`` reads them as they are)."""
    model = fitted(smooth_truth, 0)
    old = {name: value for name, value in model._a.items() if name != "regime"}
    old["lengthscale"] = old["lengthscale"][:3]
    before = MemoryModel(model.operator, model.halo, model.n_observations, old, model.info)
    shapes = random_shapes(np.random.default_rng(5), 50)
    assert np.allclose(before.predict_many(shapes, 0.99)[1], model.predict_many(shapes, 0.99)[1], rtol=1e-12)


def test_a_model_saved_with_one_boundary_as_one_row_predicts_as_it_did():
    """Before a model could have several boundaries its ``regime`` was saved as ``(5,)``."""
    model = fitted(two_algorithm_truth, TWO_ALGORITHM_SEED)
    old = {**model._a, "regime": model._a["regime"][0]}
    before = MemoryModel(model.operator, model.halo, model.n_observations, old, model.info)
    shapes = random_shapes(np.random.default_rng(5), 50)
    assert np.array_equal(before.predict_many(shapes, 0.99)[1], model.predict_many(shapes, 0.99)[1])
    assert before.regime == model.regime


def test_the_fit_runs_on_one_blas_thread_and_gives_the_threads_back():
    """``explorer.core.blas``: the model's tens-of-rows matrices on one thread, the process's own
    setting restored after (the operators and the planner keep theirs)."""
    from threadpoolctl import threadpool_info

    from explorer.core.blas import one_blas_thread, with_one_blas_thread

    def blas_threads():
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    before = blas_threads()
    assert before, "numpy's BLAS is not visible to threadpoolctl"
    with one_blas_thread():
        assert set(blas_threads()) == {1}
    assert blas_threads() == before
    assert with_one_blas_thread(blas_threads)() == [1] * len(before)
    assert hasattr(fit, "__wrapped__")  # explorer.model.fit.fit runs inside one_blas_thread


def test_a_boundary_found_late_keeps_the_evidence_of_every_prediction():
    """A loop that finds its boundary late: the profiles before it were predicted by models with
    none, off by the step.  The evidence is still every prediction, at the loop's whole share of
    the risk (``acquisition.risk_split``), and its bets forgive the early misses
    (``stats.scale_confidence_bound``)."""
    from explorer.model.stats import scale_confidence_bound
    from explorer.search import acquisition
    from explorer.search.core import ExplorationCore
    from explorer.search.store import Record

    rng = np.random.default_rng(TWO_ALGORITHM_SEED)
    shapes = random_shapes(rng, 60)
    slow = shapes[:, 0] * shapes[:, 1] <= 5120
    shapes = np.concatenate([shapes[slow][:14], shapes[~slow][:4], shapes[slow][14:17]])  # the step seen late
    runs = two_algorithm_truth(shapes)[:, None] * (1 + 0.003 * rng.standard_normal((len(shapes), 2)))
    records = [Record(tuple(int(n) for n in s), float(r.mean()), "ok", "profile", repeats=list(r))
               for s, r in zip(shapes, runs)]
    core = ExplorationCore(OPERATOR, memory_limit=1024 * MiB, memory_cap=8192 * MiB, seed=0)
    model = core.fit(records)
    assert model.regime is not None
    every, with_boundary = [], []
    for shape, value, n_runs, before in core._predicted(records, core.fit):
        every.append((float(before.standardised([shape], [value], n_runs)[0]), before.predictive_t([shape])[2]))
        with_boundary.append(before.regime is not None)
    assert not with_boundary[0] and any(with_boundary)
    evidence = core.evidence(records)
    assert evidence.level == pytest.approx(acquisition.risk_split(0.99)[0])
    assert evidence.n_predictions == len(every) == len(core.prequential(records))
    assert evidence.factor == max(1.0, scale_confidence_bound(*zip(*every), evidence.level))
    assert max(abs(z) for z, _ in every) > 5  # the early misses are in it
    assert evidence.factor < 20.0  # 64 by the rule before 8a7746c (whole bets, a running-mean plug-in)


def test_a_boundary_that_one_profile_justifies_is_refused():
    """A smooth truth with one large block 18% high (a second state of the allocator or library
    that repeats cannot see): the whole gain of the best boundary passes ``accept``, as it did
    for ``unseen_torch_conv`` seed 111's steps along ``n3``, but refitted without the profile it
    leans on most it earns nothing, and that profile is the outlier."""
    rng = np.random.default_rng(2)
    n = 30
    shapes = random_shapes(rng, n)
    runs = smooth_truth(shapes)[:, None] * (1 + 0.003 * rng.standard_normal((n, 2)))
    outlier = np.argsort(shapes.prod(1))[-8:][2]
    runs[outlier] *= 1.18
    model = fit(OPERATOR, shapes, runs.mean(1), runs.var(1, ddof=1) / 2, np.zeros(n, dtype=bool),
                n_repeats=np.full(n, 2))
    first = model.info["regime"]["steps"][0]
    assert regimes.accept(first["gain"], first["candidates"], n)
    assert first["without"] == [int(x) for x in shapes[outlier]]
    assert not first["kept"] and not model.info["regime"]["kept"]
    assert regime_side(shapes, model._a["regime"], np.ones(3)).max() == 0.0  # no boundary in the model


def test_a_step_survives_the_loss_of_any_one_profile():
    """The same check on a real step (the two-algorithm truth): the gain without the most
    influential profile still passes, and the boundary is kept where the step is."""
    model = fitted(two_algorithm_truth, seed=4)
    first = model.info["regime"]["steps"][0]
    assert first["kept"] and regimes.accept(first["gain_without_one"], first["candidates"], 29)
    lo, hi = model._a["regime"][0][3:] if np.ndim(model._a["regime"]) == 2 else model._a["regime"][3:]
    assert np.exp(lo) <= 5120 <= np.exp(hi)
