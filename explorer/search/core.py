"""The ask/tell core of the learning loop (:class:`ExplorationCore`): from the stored profiles,
the fitted model, its evidence and the next shapes to profile, or the decision to stop.  No
process and no profile of its own: ``explorer.exploration.explore`` runs the loop around it,
and any evaluation made elsewhere is told through the store.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np

import operators
from explorer.core.units import FLOAT32_BYTES
from explorer.measure.profiling import EXCEEDED, OK
from explorer.search.store import SOURCE_PROFILE, Record


#: Profiles of the space-filling start.
N_INITIAL = 5
#: Input bytes of the largest start shape, as a share of the target memory.
INITIAL_INPUT_SHARE = 1 / 256
#: Seconds per profile outside the operator before the loop has measured its own.
DEFAULT_LOOP_OVERHEAD = 0.3
#: Number of candidate shapes scored at each step, and of target shapes.
N_CANDIDATES = 2048
N_TARGETS = 384


def training_data(records: list[Record], dtype_itemsize: int = FLOAT32_BYTES):
    """Arrays ``(shapes, peak_bytes, noise_var, lower_bound, n_repeats)`` for
    :func:`explorer.model.fit.fit` from stored isolated profiles.

    The value of a profile is the mean of its repeats; its noise variance is
    the variance of that mean, ``s^2 / n`` (0 for a single run: the surrogate
    applies its own floor).  ``exceeded`` profiles enter as lower bounds.
    """
    shapes, values, noise, lower, n_repeats = [], [], [], [], []
    for r in _usable(records):
        repeats = np.asarray(r.repeats or [r.peak_bytes], dtype=float)
        shapes.append(r.shape)
        n_repeats.append(len(repeats))
        if r.status == OK:
            values.append(repeats.mean())
            noise.append(repeats.var(ddof=1) / len(repeats) if len(repeats) > 1 else 0.0)
            lower.append(False)
        else:
            values.append(float(r.peak_bytes))
            noise.append(0.0)
            lower.append(True)
    return (np.asarray(shapes, dtype=np.int64).reshape(-1, 3), np.asarray(values, dtype=float),
            np.asarray(noise, dtype=float), np.asarray(lower, dtype=bool), np.asarray(n_repeats, dtype=int))


def operator_run_cost(records: list[Record]):
    """``a + b V``: seconds of one ``operator.run`` on ``V`` voxels, fitted to the stored profiles."""
    from explorer.search.acquisition import CostModel

    ok = [r for r in records if r.source == SOURCE_PROFILE and r.status == OK and r.seconds]
    return CostModel.fit(np.asarray([r.shape for r in ok]).reshape(-1, 3), np.asarray([r.seconds for r in ok]))


def profile_cost_model(records: list[Record], repeat: int, loop_overhead: list[float]):
    """Seconds one more profile costs the loop: ``overhead + repeat * (a + b V)``.

    ``a + b V`` is :func:`operator_run_cost`; the overhead is the median time per
    profile the loop spent outside the operator (refit, scoring, forking), measured
    in this run: a tiny profile is not free.
    """
    from explorer.search.acquisition import CostModel

    run_cost = operator_run_cost(records)
    overhead = float(np.median(loop_overhead[1:])) if len(loop_overhead) > 1 else DEFAULT_LOOP_OVERHEAD
    return CostModel(overhead + repeat * run_cost.intercept_seconds, repeat * run_cost.seconds_per_voxel,
                     fitted=run_cost.fitted)


@dataclass
class Ask:
    """The loop's next move (:meth:`ExplorationCore.ask`).

    ``shapes`` to profile next; none with ``stopped_because`` None means wait (others'
    profiles in flight are what the fit needs).  ``decision`` is the stop rule's verdict
    on ``model`` (None before a model exists).
    """

    shapes: list[tuple[int, int, int]]
    stopped_because: str | None = None
    model: object | None = None
    decision: object | None = None
    #: Why these shapes: "design", "variance reduction" or "validation".
    purpose: str = "design"

    @property
    def half_width(self) -> float | None:
        return None if self.decision is None else self.decision.half_width


class ExplorationCore:
    """The explore loop's decisions in ask/tell form (as Optuna's), with no process and no store.

    ``ask(records, ...)`` looks at every observation so far (telling is appending a
    finished profile to ``records``) and answers with the shapes to profile next, or
    why to stop: first the space-filling design, then ``acquisition.propose`` until
    ``acquisition.stop_decision`` says stop or the budget is spent.  ``explore``
    drives it with real profiles in a store; a test or a benchmark can drive it with
    any truth.  Fits are cached by the observations they saw, so the prequential
    check (each of the latest profiles against the model fitted before it ran) costs
    no refit of what the loop fitted anyway.

    Which shape to profile next is chosen on every profile so far conditioned at the
    hyperparameters of the ML-II fit of all but the latest one (:meth:`acquisition_model`),
    so the fit of every profile can run beside the next profile (:meth:`prefit`, from another
    thread); whether to stop is always decided on the ML-II fit of every profile.
    """

    def __init__(self, operator: str, *, memory_limit: int, memory_cap: int, confidence: float = 0.99,
                 tolerance: float = 0.05, seed: int = 0, prior_model=None,
                 noise_floor: "RunNoiseFloor | None" = None, timings: "Timings | None" = None, fitter=None):
        """``prior_model``: a model that already predicts this operator's peak (a pipeline's
        composed model, ``explorer.model.composed``); its prediction over the target region becomes
        every fit's prior mean (``surrogate.MeanPrior``), so the loop learns only the departure
        from it, and profiles only there: its first design is :func:`region_design` of that
        region and its proposals are target shapes.  ``noise_floor``: the least single-run
        noise every fit may learn (:func:`member_noise_floor` for a pipeline), by default the
        surrogate's own floors.  ``timings``: where the fits' seconds are added (``ML-II fits``,
        ``scale posteriors``; ``explorer.core.timings``), a fresh one by default.  ``fitter``:
        what runs ``explorer.model.fit.fit`` (``explorer.model.fit_process.FitProcess``: in a
        process of its own), by default that function in the calling thread."""
        from explorer.core.timings import Timings

        from explorer.search import acquisition
        from explorer.model import basis
        from explorer.model import priors

        op = operators.get(operator)
        self.operator, self.halo = op.name, op.halo
        # passed to every fit, so a fit in another process needs no registry of operators
        self._declared = {"block_multiple": tuple(op.block_multiple), "axis_classes": tuple(op.axis_classes)}
        self.fitter = fitter
        self.memory_limit, self.memory_cap = int(memory_limit), int(memory_cap)
        self.confidence, self.tolerance, self.seed = confidence, tolerance, seed
        self._whole_axes = op.whole_axes
        self.design = [tuple(int(n) for n in s) for s in acquisition.initial_design(
            N_INITIAL, max_input_bytes=self.memory_limit * INITIAL_INPUT_SHARE, seed=seed)]
        self.timings = Timings() if timings is None else timings
        self._fitting = threading.RLock()  # the fit caches: :meth:`prefit` may run in another thread
        self._fits: dict[tuple, object] = {}
        self._calibrated: dict[tuple, object] = {}
        #: The largest block volume the target region holds (None: no bound but memory), set by the
        #: caller: ``explore`` sets the largest block its in-worker probes can reach, beyond which
        #: no plan runs (``explorer.runner.probes.probe_volume_cap``).
        self.max_block_voxels: float | None = None
        #: Shapes this core picked to validate a tight bound (``acquisition.validation_shapes``).
        self.validations: set[tuple[int, int, int]] = set()
        self.prior = None
        self.noise_floor = noise_floor
        if prior_model is not None:
            region = self.target_shapes(prior_model)
            if len(region) >= len(basis.BASIS_NAMES):
                source = getattr(prior_model, "source", None) or repr(prior_model)
                self.prior = priors.MeanPrior.from_model(
                    prior_model, region, f"{source} over {len(region)} target blocks", confidence)
                mean, upper = prior_model.predict_many(region, confidence)
                inputs = acquisition.input_bytes(region)
                safe = inputs + upper <= self.memory_cap  # acquisition.safe_mask's rule; nothing exceeded yet
                if safe.sum() >= N_INITIAL:
                    self.design = [tuple(int(n) for n in s)
                                   for s in region_design(region[safe], (inputs + mean)[safe], N_INITIAL)]

    def __getstate__(self) -> dict:  # picklable (a core sent to another process): the lock and fitter are not
        return {name: value for name, value in self.__dict__.items() if name not in ("_fitting", "fitter")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._fitting, self.fitter = threading.RLock(), None

    @cached_property
    def candidates(self) -> np.ndarray:
        """The shapes the loop scores and targets (``acquisition.candidate_shapes``), made on first
        use: SciPy's QMC is imported then, beside the first profiles in ``explore``."""
        from explorer.search import acquisition

        return acquisition.candidate_shapes(N_CANDIDATES, seed=self.seed)

    @cached_property
    def chunkable(self) -> np.ndarray:
        """Which :attr:`candidates` a chunk plan can produce (``acquisition.chunkable_mask``)."""
        from explorer.search import acquisition

        return acquisition.chunkable_mask(self.candidates, self._whole_axes)

    def fit(self, records: list[Record]):
        """The surrogate fitted on ``records``, its latent scale learnt from their prequential
        residuals too (:meth:`prequential`), or None when they cannot determine one (fewer than
        two exact profiles of different volumes; one with a prior mean)."""
        from explorer.model import fit as model_fit

        with self._fitting:
            model = self.base_fit(records)
            if model is None:
                return None
            key = self._key(records)
            if key not in self._calibrated:
                prequential = self.prequential(records)
                with self.timings.section("scale posteriors"):
                    self._calibrated[key] = model_fit.recalibrate(model, prequential)
            return self._calibrated[key]

    def prefit(self, records: list[Record]) -> None:
        """Fit ``records`` now (:meth:`fit`, cached), ahead of the :meth:`ask` that needs it: the
        loop calls it in another thread while the next profiles run.  A fit that fails here is
        left to that ask, which fails the same way in the loop's own thread."""
        try:
            self.fit(_usable(records))
        except Exception:  # noqa: BLE001 (raised again where it is needed)
            pass

    def acquisition_model(self, records: list[Record]):
        """The model the next shapes are chosen on: ``records`` (usable, store order) conditioned at
        the ML-II hyperparameters of the fit of all but the latest of them
        (``model_fit.HeldHyperparameters``), its latent scale integrated out on the same
        prequential evidence as :meth:`fit`'s; :meth:`fit` itself when all but the latest
        determine no fit.

        Why.  An ML-II fit is most of an ask's seconds (0.1-0.4 s, two starts of L-BFGS-B), and a
        profile of the target region takes about as long.  Held hyperparameters let the fit of
        the latest profiles run beside the next ones (:meth:`prefit`) instead of before them;
        the posterior still sees every profile, and only the hyperparameters lag, by one profile.
        Whether to stop is decided on :meth:`fit` (:meth:`ask`)."""
        from explorer.model import fit as model_fit

        with self._fitting:
            prequential = self.prequential(records)  # fits every earlier prefix, the one held from too
            reference = self.base_fit(records[:-1]) if len(records) > 1 else None
            if reference is None:
                return self.fit(records)
            return self._fitted(model_fit.fit, training_data(records), prequential=prequential,
                                held=model_fit.HeldHyperparameters.of(reference))

    def prequential(self, records: list[Record]):
        """Every exact profile predicted by the ML-II fit on the profiles before it (store
        order) once that fit's mean was determined (``MemoryModel.mean_determined``), as
        ``surrogate.Prequential``."""
        from explorer.model import fit as model_fit

        terms = [[float(x[0]) for x in model.ml2.prequential_terms([shape], [value], runs)]
                 for shape, value, runs, model in self._predicted(records, self.base_fit)]
        if not terms:
            return model_fit.Prequential()
        e, c, s = zip(*terms)
        return model_fit.Prequential(tuple(e), tuple(c), tuple(s))

    @staticmethod
    def _predicted(records: list[Record], fit):
        """``(shape, value, runs, model)`` of every exact profile (store order; ``value`` the mean
        of its ``runs`` repeats) with ``model = fit(the profiles before it)``, once that model's
        mean was determined (``MemoryModel.mean_determined``): the profiles that were predictions."""
        usable = _usable(records)
        for i, r in enumerate(usable):
            if r.status != OK or i == 0:
                continue
            model = fit(usable[:i])
            if model is None or not model.ml2.mean_determined:
                continue
            repeats = r.repeats or [r.peak_bytes]
            yield r.shape, float(np.mean(repeats)), len(repeats), model

    @staticmethod
    def _key(records):
        shapes, values, _noise, lower, _n = training_data(records)
        return shapes.tobytes(), values.tobytes(), lower.tobytes()

    def base_fit(self, records: list[Record]):
        """The surrogate fitted on ``records`` with no prequential evidence (cached; its ``ml2``
        is the ML-II fit), or None when they cannot determine one."""
        from explorer.model import fit as model_fit

        data = training_data(records)
        shapes, values, _noise, lower, _n = data
        if len(np.unique(shapes[~lower].prod(axis=1))) < (2 if self.prior is None else 1):
            return None
        key = (shapes.tobytes(), values.tobytes(), lower.tobytes())
        with self._fitting:
            if key not in self._fits:
                with self.timings.section("ML-II fits"):
                    self._fits[key] = self._fitted(self.fitter or model_fit.fit, data)
            return self._fits[key]

    def _fitted(self, fitter, data: tuple, **options):
        """``fitter`` (``explorer.model.fit.fit``, or :attr:`fitter` running it elsewhere) on the
        training data ``data`` (:func:`training_data`), with this operator's halo, padding, alike
        axes, prior and noise floors, and ``options``."""
        shapes, values, noise, lower, n_repeats = data
        return fitter(self.operator, shapes, values, noise, lower, halo=self.halo, n_repeats=n_repeats,
                      prior=self.prior, **self._declared, **self._floors(), **options)

    def _floors(self) -> dict:
        """:func:`model_fit.fit`'s run-noise floors (``noise_floor``), none by default."""
        from explorer.model import priors

        if self.noise_floor is None:
            return {}
        return {"rel_noise_floor": max(priors.DEFAULT_REL_NOISE_FLOOR, self.noise_floor.relative_sd),
                "abs_noise_floor_bytes": self.noise_floor.absolute_sd_bytes}

    def evidence(self, records: list[Record], model=None):
        """``acquisition.ScaleEvidence`` of ``records``' model: every exact profile standardised by
        the predictive of the model fitted on the profiles before it (``MemoryModel.standardised``,
        with that model's degrees of freedom), once that model's mean was determined; the
        anytime-valid bound on the factor by which those predictions understated their scale at
        the loop's share of the risk (``acquisition.risk_split`` of the loop's confidence); and
        the ratio of the model's predictive quantiles that moves its bound to the quantile the
        split leaves the run (at ``model``'s degrees of freedom, by default :meth:`fit`'s)."""
        from explorer.search import acquisition
        from explorer.model.stats import scale_confidence_bound, t_quantile

        residuals, dofs = [], []
        for shape, value, runs, before in self._predicted(records, self.fit):
            residuals.append(float(before.standardised([shape], [value], runs)[0]))
            dofs.append(before.predictive_t(np.asarray([shape]))[2])
        level, quantile = acquisition.risk_split(self.confidence)
        dof = (self.fit(records) if model is None else model).hyperparameters["predictive_dof"]
        return acquisition.ScaleEvidence(max(1.0, scale_confidence_bound(residuals, dofs, level)), len(residuals),
                                         level, quantile, t_quantile(quantile, dof) / t_quantile(self.confidence, dof))

    def conclude(self, records: list[Record], stopped_because: str):
        """The model a loop that stopped for ``stopped_because`` saves, fitted on ``records``:
        certified by the evidence (:meth:`certify`), ``converged`` when the stop rule holds on
        exactly these profiles, and why it stopped in ``info["stopped_because"]``; None when
        the records determine no model."""
        from explorer.search import acquisition

        model = self.fit(records)
        if model is None:
            return None
        targets = self.target_shapes(model)
        decision = acquisition.stop_decision(model, targets, tolerance=self.tolerance, confidence=self.confidence,
                                             evidence=self.evidence(records))
        certified = self.certify(model, decision, decision.stop)
        certified.info["stopped_because"] = f"converged: {decision.describe()}" if decision.stop else stopped_because
        return certified

    @staticmethod
    def certify(model, decision, converged: bool):
        """The model a loop ends with: its bound widened by the evidence's factor
        (``MemoryModel.certified``), and whether it converged (``info["converged"]``)."""
        certified = model.certified(decision.evidence.certified_factor, decision.evidence.describe())
        certified.info["converged"] = bool(converged)
        # the saved bound's largest relative half-width over the target region (certified)
        certified.info["half_width"] = decision.certified_half_width
        return certified

    def target_shapes(self, model) -> np.ndarray:
        """The candidates chunk sizing will ask about, at most ``N_TARGETS`` spread over them:
        task memory in the target range, a block a plan can produce, of at most
        :attr:`max_block_voxels` voxels."""
        from explorer.search import acquisition

        mask = acquisition.target_mask(model, self.candidates, self.memory_limit, self.confidence) & self.chunkable
        if self.max_block_voxels is not None:
            mask &= np.prod(self.candidates.astype(np.float64), axis=1) <= self.max_block_voxels
        targets = self.candidates[mask]
        if len(targets) > N_TARGETS:
            targets = targets[np.linspace(0, len(targets) - 1, N_TARGETS).astype(int)]
        return targets

    def _decide(self, records: list[Record], model):
        """``(target shapes, the stop rule's decision)`` of ``model`` on ``records``; the decision is
        None when no target is left."""
        from explorer.search import acquisition

        targets = self.target_shapes(model)
        if len(targets) == 0:
            return targets, None
        return targets, acquisition.stop_decision(model, targets, tolerance=self.tolerance, confidence=self.confidence,
                                                  evidence=self.evidence(records, model))

    def ask(self, records: list[Record], *, n: int = 1, budget_left: int, pending=(), cost_model=None) -> Ask:
        """What to profile next given ``records`` (everyone's finished profiles, store order),
        ``pending`` shapes being profiled elsewhere and the profiles ``budget_left``."""
        from explorer.search import acquisition

        usable = _usable(records)
        tried = [r.shape for r in records if r.source == SOURCE_PROFILE]  # errors too: never retried
        taken = set(tried) | {tuple(s) for s in pending}
        n_ok = sum(r.status == OK for r in usable)
        todo = [s for s in self.design if s not in taken][: max(0, min(n, N_INITIAL - n_ok, budget_left))]
        if todo:
            return Ask(todo)
        model = self.acquisition_model(usable)
        if model is None:
            if len(pending) and budget_left >= 0:
                return Ask([])  # their profiles may be what the fit needs: wait for them
            return Ask([], _too_few(records, 1 if self.prior is not None else 2))
        targets, decision = self._decide(usable, model)
        if "held_from" in model.info and (decision is None or decision.stop or budget_left <= 0):
            model = self.fit(usable)  # whether to stop is the fit of every profile's to decide
            targets, decision = self._decide(usable, model)
        if decision is None:
            return Ask([], "no candidate shape falls in the target region; check --memory-limit", model)
        if decision.stop:
            return Ask([], f"converged: {decision.describe()}", self.certify(model, decision, True), decision)
        if budget_left <= 0:
            return Ask([], f"budget spent: {decision.describe()}", self.certify(model, decision, False), decision)
        if decision.tight:  # the bound claims enough: test it on a random sample of the targets
            batch = acquisition.validation_shapes(model, targets, self.memory_cap, n=min(n, budget_left),
                                                  confidence=self.confidence, exclude=tried + list(pending),
                                                  seed=self.seed)
            self.validations.update(batch)
        else:  # variance reduction integrated over the targets whose bound is still too wide
            loose = targets[decision.widths > self.tolerance]
            # with a prior mean, only where it is used (the target region): see region_design
            pool = self.candidates if self.prior is None else targets
            batch = acquisition.propose(model, pool, loose, cost_model or acquisition.CostModel(),
                                        self.memory_cap, n=min(n, budget_left), confidence=self.confidence,
                                        pending=list(pending), exclude=tried)
        if not batch:
            return Ask([], "no safe candidate left under the profiling memory cap",
                       self.certify(model, decision, False), decision)
        return Ask(batch, None, model, decision, "validation" if decision.tight else "variance reduction")


def composed_prior(op, runs_dir=None):
    """The composed model of a pipeline ``op`` when every member has a model
    (``explorer.model.composed.compose``), predicting a fan-out in the order ``op``'s profiles run
    its branches (``op.branch_order``, not Liu's: the prior describes what is profiled);
    None for a single operator or a member without one."""
    from operators.pipeline import Pipeline

    if not isinstance(op, Pipeline):
        return None
    from explorer.model.composed import compose
    from explorer.model.memory_model import ModelNotFoundError

    try:
        return compose(op, runs_dir).in_order(op.branch_order)
    except ModelNotFoundError:
        return None


@dataclass(frozen=True)
class RunNoiseFloor:
    """The least single-run noise a fit may learn, ``sd = sqrt((relative_sd y)^2 +
    absolute_sd_bytes^2)`` (``surrogate.run_noise``'s floors), and where it comes from."""

    relative_sd: float
    absolute_sd_bytes: float
    source: str


def member_noise_floor(op, runs_dir=None) -> RunNoiseFloor | None:
    """A pipeline's run-noise floor: the largest relative and the largest absolute single-run
    noise its members' models learnt from their repeats; None for a single operator or a
    member without a model.

    Why.  A pipeline's peak is one stage's peak, the member run on its block, so a run of
    the pipeline varies at least as that member's runs do; which stage sets the peak changes
    with the shape, hence the largest over the members.  The pipeline's own repeats are few
    (ten profiles give ten repeat pairs): fitted on the ten of ``explore SPEC --budget 10``
    without this floor, all four pipelines of ``scripts/bench_pipelines.py`` at seed 0 learnt
    the page (4 KiB) as their absolute noise where the largest of their members' was 44-101 KiB
    (``scripts/pipeline_noise.py``), and before the floor the bounds missed held-out blocks by
    allocator-scale steps (``README.md``, Pipelines).  The members measured that
    noise with the same profiler, where the pipeline runs."""
    from operators.pipeline import Pipeline

    if not isinstance(op, Pipeline):
        return None
    from explorer.model.memory_model import ModelNotFoundError
    from explorer.model.load import load_model

    rel, absolute, names = 0.0, 0.0, []
    for member in op.members:
        if member.name in names:
            continue
        try:
            h = load_model(member.name, runs_dir=runs_dir).hyperparameters
        except ModelNotFoundError:
            return None
        rel, absolute = max(rel, h["relative_run_sd"]), max(absolute, h["abs_noise_sd_bytes"])
        names.append(member.name)
    return RunNoiseFloor(rel, absolute, f"the largest of its members' ({', '.join(names)}) learnt run noise")


def region_design(shapes, task_bytes, n: int) -> np.ndarray:
    """The first ``n`` profiles of a loop with a prior mean: ``n`` of the target ``shapes``
    spread over the region, ``(n, 3)``.

    Why in the region.  Without a prior the first design is cheap and small
    (``acquisition.initial_design``: inputs up to ``INITIAL_INPUT_SHARE`` of the target
    memory) because the profiles alone must pin down the basis's constant and per-voxel
    terms.  A prior mean (a pipeline's composed model) pins them already; what the profiles
    must teach is where the prior departs from the truth *where chunk sizing asks*.  Below the
    region (blocks of a few MiB and 8-voxel axes) a composed model can be off by 10-20 %
    (its members' models extrapolate below their own explored regions; allocator
    granularity), a departure unlike the region's.  Fitting it pulled the fan-out
    ``gaussian,envelope+instantaneous_phase+instantaneous_frequency+gst3d``'s held-out MAPE
    from 2.1 % at 6 profiles to 4.2-4.5 % at 7-9 and 3.0 % at 10; its 3 in-region profiles
    alone gave 0.9 % (``scripts/bench_pipelines.py``'s truths).  So the loop with a prior
    profiles, and proposes (``ExplorationCore.ask``), only target shapes.

    The rule: the shapes sorted by ``task_bytes`` (input + the prior's mean) cut into ``n``
    bands of equal count; from each band in turn, the shape whose log-dims are farthest
    from those picked so far (the first: farthest from the region's mean log-dims), so the
    picks spread over sizes and aspects alike.  Deterministic.
    """
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    if len(shapes) < n:
        raise ValueError(f"a region design of {n} needs at least {n} shapes, got {len(shapes)}")
    z = np.log(shapes.astype(np.float64))
    picked: list[int] = []
    for band in np.array_split(np.argsort(np.asarray(task_bytes, dtype=np.float64), kind="stable"), n):
        ref = z[picked] if picked else z.mean(0, keepdims=True)
        distance = np.sqrt(((z[band][:, None, :] - ref[None, :, :]) ** 2).sum(2)).min(1)
        picked.append(int(band[int(np.argmax(distance))]))
    return shapes[picked]


def _too_few(records: list[Record], needed: int) -> str:
    """Why no model can be fitted: how many profiles succeeded, and what the failures said."""
    profiles = [r for r in records if r.source == SOURCE_PROFILE]
    ok = [r for r in profiles if r.status == OK]
    failed = [r for r in profiles if r.status not in (OK, EXCEEDED)]
    volumes = len({int(np.prod(r.shape)) for r in ok})
    text = (f"too few successful profiles to fit a model: {len(ok)} ok ({volumes} distinct volumes), "
            f"a model needs {needed} distinct volumes")
    if failed:
        errors = sorted({r.error or r.status for r in failed})
        text += f"; {len(failed)} failed ({'; '.join(str(e) for e in errors[:2])})"
    else:
        text += "; raise --budget"
    return text


def _usable(records: list[Record]) -> list[Record]:
    """The isolated profiles a fit can use (exact or lower bound), in store order."""
    return [r for r in records
            if r.source == SOURCE_PROFILE and r.peak_bytes is not None and r.status in (OK, EXCEEDED)]
