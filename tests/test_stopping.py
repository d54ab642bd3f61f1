"""The stop rule and the loop's own stop, driven through the ask/tell core on known truths.

No processes here on purpose: the truths are deliberately misspecified functions (memory
the surrogate's polynomial mean cannot express), so the coverage of the bound at the point
where the loop stops on its own can be measured on hundreds of held-out shapes.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from explorer.search import acquisition
from explorer.search.core import ExplorationCore
from explorer.search.store import Record
from explorer.model.fit import fit
from operators.base import Operator, register

MiB = 2**20
CV = 0.005  # run-to-run coefficient of variation
LIMIT = 1024 * MiB


@register
class _PaddedTestOperator(Operator):
    """Stands for a network that pads its blocks to multiples of 8 (it declares it)."""

    name = "test_padded_truth"
    block_multiple = (8, 8, 8)

    def run(self, block):
        return block


@register
class _UndeclaredTestOperator(Operator):
    """gst3d's stand-in that declares nothing of its axes (every axis its own class): the
    untied eight-term mean and a kernel on unsorted dims."""

    name = "test_undeclared_truth"

    def run(self, block):
        return block


def size_dependent_truth(shapes, multiple=1):
    """Bytes per voxel that grow with the (padded) volume: ``(150 + 30 log10 V) V + 8 MiB``,
    ``V`` of the block padded to ``multiple``: no polynomial in the dims is this."""
    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    v = (np.ceil(d / multiple) * multiple).prod(axis=1)
    return 8 * MiB + (150 + 30 * np.log10(v)) * v


def run_loop(operator, truth, seed, budget=60, prior_model=None):
    """The loop on ``truth`` until it stops: (the last ask, records, core)."""
    core = ExplorationCore(operator, memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=seed, prior_model=prior_model)
    rng = np.random.default_rng(seed)
    records: list[Record] = []
    while True:
        ask = core.ask(records, budget_left=budget - len(records))
        if ask.stopped_because:
            return ask, records, core
        for shape in ask.shapes:
            runs = truth(shape)[0] * (1 + CV * rng.standard_normal(2))
            records.append(Record(tuple(shape), float(runs.mean()), "ok", "profile", repeats=list(runs)))


def _loop_of(spec):
    """:func:`run_loop` of ``spec = (operator, truth, seed, budget, prior bias)``, ``truth``
    ``("size", multiple)`` (:func:`size_dependent_truth`) or ``("jitter",)`` (:func:`jitter_truth`),
    the prior a :class:`_ScaledTruthModel` of that bias (2% wide) or none."""
    operator, truth, seed, budget, bias = spec
    function = jitter_truth if truth[0] == "jitter" else (lambda s: size_dependent_truth(s, truth[1]))
    prior = None if bias is None else _ScaledTruthModel(bias, 0.02)
    return run_loop(operator, function, seed, budget=budget, prior_model=prior)


#: Loops run so far, by spec: the tests that ask for the same loop share it (its fits are
#: cached by the observations they saw, so reading it changes nothing).
_LOOPS: dict = {}
_POOL: list = []


@pytest.fixture(scope="module", autouse=True)
def _close_pool():
    yield
    while _POOL:
        _POOL.pop().shutdown()


def loops(specs):
    """``[(ask, records, core)]`` of each spec (:func:`_loop_of`), those not run yet two at a time
    in child processes: the loops are independent, single-threaded and take most of this
    module's time, and the suite runs on two cores."""
    missing = list(dict.fromkeys(s for s in specs if s not in _LOOPS))
    if len(missing) == 1:
        _LOOPS[missing[0]] = _loop_of(missing[0])
    elif missing:
        if not _POOL:
            _POOL.append(ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")))
        for spec, loop in zip(missing, _POOL[0].map(_loop_of, missing)):
            _LOOPS[spec] = loop
    return [_LOOPS[s] for s in specs]


def size_dependent_loop(operator, multiple, seed):
    """:func:`run_loop` on ``size_dependent_truth`` (``multiple``) from scratch, budget 60."""
    return loops([(operator, ("size", multiple), seed, 60, None)])[0]


@pytest.mark.parametrize("operator, multiple", [("gst3d", 1), ("test_undeclared_truth", 1), ("test_padded_truth", 8)],
                         ids=["size-dependent bytes per voxel, axes alike (gst3d)", "axes not declared alike",
                              "and padding steps"])
def test_where_the_loop_stops_on_its_own_the_bound_covers_a_misspecified_truth(operator, multiple):
    covered, stops = [], []
    for seed, (ask, records, core) in enumerate(loops([(operator, ("size", multiple), s, 60, None) for s in range(2)])):
        assert ask.stopped_because.startswith("converged"), ask.stopped_because
        stops.append(len(records))
        targets = core.target_shapes(ask.model)
        assert len(targets) > 100
        new_run = size_dependent_truth(targets, multiple) * (1 + CV * np.random.default_rng(99 + seed).standard_normal(
            len(targets)))
        _, upper = ask.model.predict_many(targets, 0.99)
        covered.append(upper >= new_run)
    coverage = float(np.mean(np.concatenate(covered)))
    print(f"\n{operator}: stopped at {stops} profiles, coverage of the 99% bound {coverage:.3f}")
    assert coverage >= 0.98  # nominal 0.99 over ~600 correlated held-out shapes


def jitter_truth(shapes):
    """gst3d-like memory that departs from its polynomial by 1% at random from shape to shape
    (a deterministic function of the shape, like padding to fast FFT lengths): misfit that
    repeats of one shape never see, since they agree."""
    import hashlib

    d = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    poly = 8 * MiB + 89.0 * d.prod(1) + 400.0 * (d[:, 0] * d[:, 1] + d[:, 0] * d[:, 2] + d[:, 1] * d[:, 2])
    u = np.array([[(int.from_bytes(hashlib.sha256(row.tobytes()).digest()[k:k + 8], "little") + 0.5) / 2**64
                   for k in (0, 8)] for row in d.astype(np.int64)])
    normal = np.sqrt(-2 * np.log(u[:, 0])) * np.cos(2 * np.pi * u[:, 1])
    return poly * (1 + 0.01 * normal)


def test_on_misfit_repeats_cannot_see_the_loop_stops_only_once_its_bound_has_earned_it():
    """A truth with 1% per-shape misfit.  The rule before this one (stop when the bound is
    tight and the last 3 prequential scores pass a chi-square test) stopped after 9-13
    profiles and its 99% bound covered 91% of new runs over four seeds
    (``scripts/calibration_truths.py --truths jitter``, issue 33).  Now the predictions' own
    residuals widen the scale and an anytime-valid bound on what they may still understate
    must leave the bound tight: the loop stops later or not at all, and covers."""
    covered, stops = [], []
    for seed, (ask, records, core) in enumerate(loops([("gst3d", ("jitter",), s, 30, None) for s in range(2)])):
        model = ask.model
        assert model.info["converged"] == ask.stopped_because.startswith("converged")
        assert model.hyperparameters["certified_factor"] >= 1.0
        stops.append(len(records))
        targets = core.target_shapes(model)
        new_run = jitter_truth(targets) * (1 + CV * np.random.default_rng(99 + seed).standard_normal(len(targets)))
        covered.append(model.predict_many(targets, 0.99)[1] >= new_run)
    coverage = float(np.mean(np.concatenate(covered)))
    print(f"\njitter: stopped at {stops} profiles, coverage of the 99% bound {coverage:.3f}")
    assert coverage >= 0.98


def test_the_stop_needs_a_tight_bound_and_evidence_that_holds_it():
    rng = np.random.default_rng(0)
    shapes = np.rint(np.exp(rng.uniform(np.log(16), np.log(200), size=(14, 3)))).astype(int)
    truth = size_dependent_truth(shapes)
    model = fit("gst3d", shapes, truth * (1 + CV * rng.standard_normal(14)), np.zeros(14), np.zeros(14, bool))
    targets = shapes[:5]
    width = float(np.max(acquisition.relative_half_width(model, targets)))
    calm = acquisition.stop_decision(model, targets, tolerance=2.5 * width,
                                     evidence=acquisition.ScaleEvidence(2.0, 12, 0.0025))
    assert calm.stop and [t.name for t in calm.tests] == ["tight", "evidence"]
    assert calm.certified_half_width == pytest.approx(2.0 * width)
    # tight on paper, but the evidence cannot rule out a scale 3x too small: no stop
    doubtful = acquisition.stop_decision(model, targets, tolerance=2.5 * width,
                                         evidence=acquisition.ScaleEvidence(3.0, 4, 0.0025))
    assert doubtful.tight and not doubtful.stop and not doubtful.tests[1].passed
    untested = acquisition.stop_decision(model, targets, tolerance=2.5 * width, evidence=None)
    assert untested.tight and not untested.stop
    loose = acquisition.stop_decision(model, targets, tolerance=0.5 * width,
                                      evidence=acquisition.ScaleEvidence(1.0, 30, 0.0025))
    assert not loose.tight and not loose.stop


def test_the_next_shapes_are_chosen_at_the_hyperparameters_before_the_latest_profile_a_stop_on_every_profiles_fit():
    import threading

    from explorer.model.fit import HeldHyperparameters
    from explorer.search.core import training_data

    ask, records, core = size_dependent_loop("gst3d", 1, 0)
    assert ask.stopped_because.startswith("converged")
    assert "held_from" not in ask.model.info and ask.model.n_observations == len(records)
    k = len(records) - 3
    reference = core.base_fit(records[:k - 1])
    chosen_on = core.acquisition_model(records[:k])
    assert chosen_on.info["held_from"] == k - 1 and chosen_on.n_observations == k  # every profile, held parameters
    held, again = HeldHyperparameters.of(reference), HeldHyperparameters.of(chosen_on)
    np.testing.assert_allclose(again.log_lengthscale, held.log_lengthscale, rtol=1e-12)  # in log units: span-free
    assert (again.outputscale, again.relative_nugget_var) == (held.outputscale, held.relative_nugget_var)
    # the reference's own hyperparameters on the reference's own profiles: the reference's predictions
    targets = core.target_shapes(reference)
    shapes, values, noise, lower, n_repeats = training_data(records[:k - 1])
    same = fit("gst3d", shapes, values, noise, lower, n_repeats=n_repeats, held=held)
    for a, b in zip(same.ml2.predict_many(targets, 0.99), reference.ml2.predict_many(targets, 0.99)):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    # the fit of every profile, made in another thread before the ask that needs it, is not made again
    fresh = ExplorationCore("gst3d", memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=0)
    beside = threading.Thread(target=fresh.prefit, args=(records[:k],))
    beside.start()
    beside.join()
    fits = fresh.timings.to_dict()["ML-II fits"]["count"]
    assert fresh.fit(records[:k]) is not None and fresh.timings.to_dict()["ML-II fits"]["count"] == fits


def test_the_evidence_is_each_profile_standardised_by_the_model_fitted_before_it_ran():
    from explorer.model.stats import scale_confidence_bound, t_quantile

    ask, records, core = size_dependent_loop("gst3d", 1, 0)
    evidence = core.evidence(records)
    residuals, dofs = [], []
    for i, r in enumerate(records):
        model = core.fit(records[:i]) if i else None
        if model is None or not model.ml2.mean_determined:
            continue
        assert r.shape not in {tuple(s) for s in model.train_shapes}
        residuals.append(model.standardised([r.shape], [np.mean(r.repeats)], len(r.repeats))[0])
        dofs.append(model.predictive_t([r.shape])[2])
    assert evidence.n_predictions == len(residuals) >= 3
    loop_level, quantile = acquisition.risk_split(0.99)
    assert evidence.level == loop_level == pytest.approx(0.005)
    assert quantile == pytest.approx(0.995)
    assert evidence.factor == max(1.0, scale_confidence_bound(residuals, dofs, evidence.level))
    # the bound at 99% is the 99.5% quantile widened by the factor (t quantiles of the model's dof)
    dof = core.fit(records).predictive_t([(64, 64, 64)])[2]
    assert evidence.quantile_ratio == pytest.approx(t_quantile(0.995, dof) / t_quantile(0.99, dof))
    assert evidence.quantile_ratio > 1
    assert evidence.certified_factor == evidence.factor * evidence.quantile_ratio
    # the model the loop ends with is certified by that evidence
    assert ask.model.hyperparameters["certified_factor"] == pytest.approx(evidence.certified_factor)
    assert ask.model.info["certified"]["predictions"] == evidence.n_predictions


def test_the_latent_scale_learns_from_predictions_the_misfit_the_fit_did_not_see():
    """On the jitter truth the ML-II fit's own scale is too small for what it then predicts:
    the prequential residuals raise the latent scale above what the fit's own evidence alone
    gives (and so the bound)."""
    ask, records, core = run_loop("gst3d", jitter_truth, seed=3, budget=16)
    learnt = core.fit(records)
    alone = core.base_fit(records)  # the same fit, its own restricted likelihood only
    assert len(core.prequential(records)) >= 5
    assert learnt.hyperparameters["latent_scale"] > 1.5 * alone.hyperparameters["latent_scale"]


class _ScaledTruthModel:
    """Stands for a pipeline's composed model: the truth times ``bias``, with a bound
    ``relative_sd`` wide at the one-sided 99% normal quantile."""

    source = "a scaled truth"

    def __init__(self, bias, relative_sd):
        self.bias, self.relative_sd = bias, relative_sd

    def predict_many(self, shapes, confidence=0.99):
        mean = size_dependent_truth(shapes) * self.bias
        return mean, mean * (1 + 2.326 * self.relative_sd)


@pytest.mark.parametrize("bias", [1.02, 1.10], ids=["prior 2% off", "prior 10% off"])
def test_a_prior_mean_close_or_wrong_does_not_break_the_bound(bias):
    """The loop given a prior model (as a pipeline's composed model): wherever it stops, the bound
    covers the truth's new runs as without a prior, also when the prior is 10% off (wider than
    its own stated 2%: the profiles must overrule it).  That a close prior stops the loop
    sooner is no longer asserted: since the bound claims its confidence per run
    (``acquisition.risk_split``), the stop waits on the evidence of predictions, which a prior
    cannot supply; on five seeds a 2% prior stopped at 45, 33, 36, 32, 23 profiles and the flat
    prior at 45, 30, 40, 24, 26 (it saved about one a loop before)."""
    covered, stops = [], []
    seeds = range(1)  # one loop a prior (~300 shapes): the suite's time goes to these loops
    for seed, (ask, records, core) in zip(seeds, loops([("gst3d", ("size", 1), s, 60, bias) for s in seeds])):
        assert core.prior is not None and ask.model.info["prior"].startswith("a scaled truth")
        assert ask.stopped_because.startswith("converged"), ask.stopped_because
        stops.append(len(records))
        targets = core.target_shapes(ask.model)
        new_run = size_dependent_truth(targets) * (1 + CV * np.random.default_rng(99 + seed).standard_normal(
            len(targets)))
        covered.append(ask.model.predict_many(targets, 0.99)[1] >= new_run)
    coverage = float(np.mean(np.concatenate(covered)))
    print(f"\nprior x{bias}: stopped at {stops} profiles, coverage {coverage:.3f}")
    assert coverage >= 0.98


def test_with_a_prior_mean_the_loop_profiles_only_where_chunk_sizing_asks():
    """A loop with a prior mean (a pipeline's composed model) starts in the target region
    (``exploration.region_design``) and proposes only target shapes: every profile it takes
    is a target of the prior or of the model it had when it asked.  Without a prior the
    start is small and cheap, below the region (which is what the prior makes unnecessary)."""
    prior = _ScaledTruthModel(1.02, 0.02)
    ask, records, core = run_loop("gst3d", size_dependent_truth, 0, budget=12, prior_model=prior)
    assert len(records) >= 8
    profiled = np.asarray([r.shape for r in records])
    in_prior_region = acquisition.target_mask(prior, profiled, LIMIT)
    assert in_prior_region[: len(core.design)].all()
    for i, shape in enumerate(profiled):  # a proposal: a target of the fit on the profiles before it
        if not in_prior_region[i]:
            model = core.fit(records[:i])
            assert acquisition.target_mask(model, shape[None, :], LIMIT)[0], shape
    # the start spreads over the region: from its bottom decade to its top one
    task = (acquisition.input_bytes(core.design) + size_dependent_truth(core.design)) / LIMIT
    assert task.min() < 0.05 and task.max() > 0.3, task
    flat = ExplorationCore("gst3d", memory_limit=LIMIT, memory_cap=8 * LIMIT, seed=0)
    assert not acquisition.target_mask(prior, flat.design, LIMIT).all()  # its smallest blocks: below
