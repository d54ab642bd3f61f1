"""The learning loop: profile, persist, refit, pick the next shapes, stop.

::

    design ─► profile (isolated child) ─► store (at once) ─► fit surrogate
      ▲                                                        │
      └──────── propose (variance reduction per second, safe) ◄┘   until the bound is
                                                                   tight or the budget spent

``budget`` counts the operator's isolated profiles in the store, so running
again resumes where the last run stopped (or was killed).

Several processes may explore one operator in one store at once
(``explorer.search.store``: claims).  Each shape is claimed in the store before it is
profiled, and never while the finished profiles plus the live claims (anyone's)
number ``budget``; a shape another process has claimed or profiled is not picked
(the initial design skips it; proposals treat it as pending, see
``acquisition.propose``); every refit reads everyone's finished profiles.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import operators
from explorer.core import paths, validate
from explorer.core.timings import Timings
from explorer.core.machine import default_memory_limit
from explorer.model.fit_process import FitProcess
from explorer.measure.profiling import default_memory_cap
from explorer.runner import probes as probing
from explorer.search.report import explore_report
from explorer.search.batches import PROFILE_SESSIONS, ProfileBatches, Step, close_all, local_profilers
from explorer.search.store import SOURCE_PROFILE, Store
from explorer.search.core import (
    ExplorationCore,
    composed_prior,
    member_noise_floor,
    operator_run_cost,
    profile_cost_model,
)


#: Seconds between looks at the store while waiting for other processes' profiles.
CLAIM_POLL_SECONDS = 0.5


@dataclass
class ExploreResult:
    operator: str
    profiles: int
    new_profiles: int
    stopped_because: str
    seconds: float
    operator_seconds: float
    max_relative_uncertainty: float | None
    tolerance: float
    confidence: float
    memory_limit_bytes: int
    model_path: str | None
    report_path: str | None
    steps: list[Step] = field(default_factory=list)
    #: The in-worker probes' summary (``explorer.runner.probes.ProbeResult.to_dict``), or None.
    probes: dict | None = None
    #: Where the surrogate's prior mean came from (``MeanPrior.source``), or None: flat.
    prior: str | None = None
    #: Whether the saved model met the stop rule (False: it ended on its budget, or short of
    #: profiles; None: no model was saved).
    converged: bool | None = None
    #: The factor the saved model's bound is widened by (``MemoryModel.certified``).
    certified_factor: float | None = None
    #: The largest block of the loop's target region (``ExplorationCore.max_block_voxels``), or None.
    region_max_block_voxels: float | None = None
    #: The saved model's regime boundary (``MemoryModel.regime``: where its peak jumps), or None.
    regime: str | None = None
    #: Whether the saved model was the answer as it stood (``explore``'s docstring, Paid once).
    reused: bool = False
    #: Where the wall time went: ``{section: {"seconds", "count"}}`` (``explorer.core.timings``;
    #: ``ML-II fits`` and ``scale posteriors`` are parts of ``ask`` and of ``fits (beside the
    #: profiles)``, ``inside the operator`` of ``profiling``; the imports and those fits run beside
    #: the profiles).
    timings: dict = field(default_factory=dict)

    @property
    def profiled_on(self) -> list[str] | None:
        """The workers this call's profiles ran on (sorted addresses), or None: all on this machine."""
        workers = sorted({s.profiled_on for s in self.steps if s.profiled_on and not s.status.startswith("lost")})
        return workers or None

    def to_dict(self) -> dict:
        return {
            "operator": self.operator,
            "profiles": self.profiles,
            "new_profiles": self.new_profiles,
            "stopped_because": self.stopped_because,
            "seconds": round(self.seconds, 3),
            "operator_seconds": round(self.operator_seconds, 3),
            "max_relative_uncertainty": self.max_relative_uncertainty,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "memory_limit_bytes": self.memory_limit_bytes,
            "model_path": self.model_path,
            "report_path": self.report_path,
            "probes": self.probes,
            "prior": self.prior,
            "converged": self.converged,
            "certified_factor": self.certified_factor,
            "regime": self.regime,
            "region_max_block_voxels": self.region_max_block_voxels,
            "reused": self.reused,
            "profiled_on": self.profiled_on,
            "timings": self.timings,
        }


#: The priors ``explore`` offers (its ``prior`` argument, ``explore --prior``).
PRIORS = ("composed", "none")


def explore(
    operator: str,
    *,
    budget: int = 30,
    tolerance: float = 0.05,
    confidence: float = 0.99,
    memory_limit=None,
    memory_cap=None,
    runs_dir=None,
    storage: str | None = None,
    jobs: int | None = None,
    repeat: int = 2,
    seed: int = 0,
    progress=None,
    on_start=None,
    report: bool = False,
    probes: int | None = None,
    probe_progress=None,
    probe_seconds: float | None = None,
    prior: str = "composed",
    refresh: bool = False,
    client=None,
) -> ExploreResult:
    """Explore ``operator``'s peak memory until the bound is tight or ``budget`` profiles exist,
    then probe it inside real Dask workers (``explorer.runner.probes``) and save its calibration.

    Safe with other processes exploring the same store (see the module docstring): the
    result's ``profiles`` is the store's count of finished isolated profiles when this
    call ends, ``new_profiles`` this call's own.  The model is refitted on everyone's
    profiles at the end if others finished some since the last fit, and saved unless the
    saved one already learnt from more (:func:`save_model_unless_superseded`).

    ``on_start(shape, purpose, predicted_seconds)`` is called as each profile starts
    (``purpose``: "design", "variance reduction" or "validation"; seconds None before
    any were measured), ``progress(step: Step, total_budget)`` after every profile,
    ``probe_progress(index, total, block, run_result)`` after every probe.  ``probes``:
    how many (default ``explorer.runner.probes.DEFAULT_PROBES``; 0 skips them);
    ``probe_seconds``: what they may take, predicted (default
    ``explorer.runner.probes.PROBE_SECONDS_BUDGET``): their largest block is the largest a plan
    runs.  Probes are skipped when this call profiled nothing new and the saved calibration
    already holds that many probes of this environment.

    What it writes and starts: profiles into the store (``storage``, or ``runs_dir``'s SQLite),
    the model and the calibration under ``runs_dir`` (``$EXPLORER_RUNS`` or ``./runs`` when
    None), ``report.png`` there only with ``report=True`` (the CLI's ``explore`` asks for it);
    profiling servers (child processes) for the profiles and, when ``probes`` > 0, a Dask
    LocalCluster for the in-worker probes, unless ``client`` (a ``distributed.Client``) names a
    cluster: then each profile is an isolated child of one of its workers
    (``explorer.measure.worker_profiling``; ``jobs``, default all the workers, at once; the
    result's ``profiled_on`` names them; a worker lost mid-profile costs that profile), the
    target memory defaults to its workers' smallest limit, the model carries the workers'
    environment, and the probes run there too (their baseline, memory and environment are then
    what the calibration describes; ``explorer.runner.probes.run_probes``).

    ``prior``: ``"composed"`` (default) makes a pipeline whose members all have models learn
    from its composed model (``explorer.model.composed``) as the prior mean: only the departure
    from it is left to learn.  ``"none"``: the flat prior, as for one operator (from scratch).

    Paid once: when the saved model was made by a loop with the same tolerance, confidence,
    target memory, prior and probes' seconds, in this environment, from exactly the profiles the store holds now,
    and it converged (or the store already holds ``budget`` profiles), that model is the answer:
    nothing is profiled or refitted (``reused`` in the result), only missing probes run.
    ``refresh=True`` refits from the store and lets the stop decide again.
    """
    started = time.perf_counter()
    operator = validate.operator(operator)
    op = operators.get(operator)
    limit = _target_memory(memory_limit, client)
    cap = None if memory_cap is None else validate.size(memory_cap, "memory_cap")
    budget = validate.positive_int(budget, "budget")
    jobs = None if jobs is None else validate.positive_int(jobs, "jobs")
    repeat = validate.positive_int(repeat, "repeat")
    probe_seconds = validate.positive_number(probing.PROBE_SECONDS_BUDGET if probe_seconds is None else probe_seconds,
                                             "probe_seconds")
    tolerance, confidence = validate.fraction(tolerance, "tolerance"), validate.confidence(confidence)
    if prior not in PRIORS:
        raise ValueError(f"prior must be one of {', '.join(PRIORS)}, got {prior!r}")
    n_probes = probing.DEFAULT_PROBES if probes is None else validate.non_negative_int(probes, "probes")
    # while probes are to run, their budget bounds the blocks plans run: the loop learns none larger
    region_seconds = probe_seconds if n_probes else None

    timings = Timings()
    # no saved model: the loop will run, so its profiling servers start now, beside the store's opening
    loop_certain = refresh or not paths.model_path(op.name, runs_dir).exists()
    profilers = local_profilers(jobs) if loop_certain and client is None else None
    try:
        with timings.section("store"):
            store = Store(runs_dir, storage)
        settings = {"tolerance": tolerance, "confidence": confidence, "memory_limit_bytes": int(limit),
                    "prior": prior, "probe_seconds": region_seconds}
        reusable = None if refresh else _reusable_model(op.name, runs_dir, store, settings, budget, client)
    except BaseException:
        close_all(profilers)
        raise
    if reusable is not None:
        close_all(profilers)
        return _reused(op.name, *reusable, settings, started, probes=n_probes, probe_progress=probe_progress,
                       runs_dir=runs_dir, storage=storage, seed=seed, report=report, timings=timings, client=client,
                       probe_seconds=probe_seconds)
    if client is not None:  # each profile an isolated child of a worker of the cluster
        with timings.section("cluster (profiling plug-in, memory cap)"):
            profilers, cap = _cluster_profilers(client, op, jobs, cap)
    cap = default_memory_cap() if cap is None else cap
    jobs = len(profilers) if profilers else jobs or 1
    batches = ProfileBatches(store, op.name, budget=budget, repeat=repeat, memory_cap=cap, jobs=jobs,
                             on_start=on_start, progress=progress, profilers=profilers)
    model, stopped_because, warm_up = None, None, None
    # the ML-II fit of the profiles so far runs while the next ones run (ExplorationCore.acquisition_model):
    # this thread waits for it, the fits' own process computes it
    fitting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explore-fit")
    fits = FitProcess()
    try:
        with timings.section("start (candidates, priors)"):
            core = ExplorationCore(op.name, memory_limit=limit, memory_cap=cap, confidence=confidence,
                                   tolerance=tolerance, seed=seed,
                                   prior_model=composed_prior(op, runs_dir) if prior == "composed" else None,
                                   noise_floor=member_noise_floor(op, runs_dir), timings=timings, fitter=fits)
        # ask (design, then refit, stop or propose), profile, tell (the store), repeat
        while True:
            with timings.section("store"):
                records = batches.stored_profiles()
                others = store.live_claims(op.name)
                counted = store.profiles_and_claims(op.name)
            if model is not None:
                batches.cost_model = profile_cost_model(records, repeat, batches.loop_overhead)
                core.max_block_voxels = _region_cap(op, records, n_probes, region_seconds)
            with timings.section("ask (fits, evidence, acquisition)"):
                ask = core.ask(records, n=jobs, budget_left=budget - counted, pending=[c.shape for c in others],
                               cost_model=batches.cost_model)
            if ask.model is not None:
                model = ask.model
                batches.metric = ask.half_width
            if ask.stopped_because:
                stopped_because = _with_budget(ask.stopped_because, budget, in_flight=counted - len(records))
                break
            if ask.shapes:
                fitting.submit(timings.section("fits (beside the profiles)")(core.prefit), records)
            with timings.section("profiling (fork, IPC, operator)"):
                claimed = bool(ask.shapes) and batches.run(ask.shapes, ask.purpose)
            if warm_up is None:  # after the first profile, not beside the servers' own start-up
                fits.start()  # its process imports torch, GPyTorch and BoTorch (seconds) while the next profiles run
                warm_up = threading.Thread(target=timings.section("imports (beside the profiles)")(_warm_up),
                                           daemon=True)
                warm_up.start()
            if not claimed:
                time.sleep(CLAIM_POLL_SECONDS)  # others hold what we would profile: look again
    except BaseException:
        fits.close()
        raise
    finally:
        fitting.shutdown(wait=True, cancel_futures=True)
        batches.close()
    steps, operator_seconds, metric = batches.steps, batches.operator_seconds, batches.metric

    records = batches.stored_profiles()  # the store's true count now, other processes' profiles included
    with fits:
        if model is not None:  # what the loop ended with, on everyone's profiles (cached when nothing new arrived)
            with timings.section("conclude (final fit, evidence)"):
                model = core.conclude(records, stopped_because or "interrupted") or model
    model_file = report_file = probe_result = None
    if model is not None:
        model_file = paths.model_path(op.name, runs_dir)
        run_cost = operator_run_cost(records)
        if run_cost.fitted:  # the chunk planner's time model starts from the operator's own speed
            model.info["seconds_per_voxel"] = run_cost.seconds_per_voxel
        model.info.update(explored_with=settings, region_max_block_voxels=core.max_block_voxels)
        model.info["profiles_digest"] = profiles_digest(records)
        if batches.environment is not None:  # profiled on a cluster: its workers' environment
            model.environment = batches.environment
        with timings.section("save"):
            model = save_model_unless_superseded(model, model_file)
        with ThreadPoolExecutor(max_workers=1) as drawing:  # the report is drawn while the probes run
            drawn = report and drawing.submit(timings.section("report.png (beside the probes)")(explore_report), model,
                                              records, steps, paths.report_path(op.name, runs_dir),
                                              confidence=confidence, memory_limit=limit, tolerance=tolerance)
            with timings.section("in-worker probes"):
                probe_result = _probe(op.name, model, n_probes, bool(steps), runs_dir, storage, confidence,
                                      probe_progress, seed, limit, client, timings, seconds_budget=probe_seconds)
            report_file = drawn.result() if drawn else None
    timings.add("inside the operator", operator_seconds, len(steps))
    return ExploreResult(
        operator=op.name,
        profiles=len(records),
        new_profiles=len(steps),
        stopped_because=(model.info.get("stopped_because") if model is not None else None)
        or stopped_because or "interrupted",
        seconds=time.perf_counter() - started,
        operator_seconds=operator_seconds,
        max_relative_uncertainty=metric if model is None else model.info.get("half_width"),
        tolerance=tolerance, confidence=confidence, memory_limit_bytes=limit,
        model_path=str(model_file) if model_file else None, report_path=str(report_file) if report_file else None,
        steps=steps, probes=probe_result, prior=core.prior.source if core.prior is not None else None,
        converged=None if model is None else bool(model.info.get("converged")),
        certified_factor=None if model is None else model.hyperparameters["certified_factor"],
        regime=None if model is None else model.regime,
        region_max_block_voxels=core.max_block_voxels,
        timings=timings.to_dict(),
    )


def _region_cap(op, records, n_probes: int, region_seconds: float | None) -> float | None:
    """The largest block the loop's target region holds: with probes to run, the largest probe
    ``region_seconds`` allows at the operator's speed in ``records`` (``probes.probe_volume_cap``);
    None (memory alone) without probes."""
    if region_seconds is None:
        return None
    return probing.probe_volume_cap(op, operator_run_cost(records).seconds_per_voxel, n_probes, region_seconds)


def _warm_up() -> None:
    """Import what the loop's scoring needs here (SciPy's ``stats`` and ``qmc`` for the candidates
    and quantiles; the fits import torch in their own process, ``FitProcess.start``)."""
    import scipy.stats  # noqa: F401
    from scipy.stats import qmc  # noqa: F401


def _target_memory(memory_limit, client) -> int:
    """The worker memory the chunks will be sized for: ``memory_limit``, else the smallest
    memory limit of ``client``'s workers, else this machine's default."""
    if memory_limit is not None:
        return validate.size(memory_limit, "memory_limit")
    if client is not None:
        from explorer.measure.worker_profiling import workers_memory_limit

        return workers_memory_limit(client) or default_memory_limit()
    return default_memory_limit()


def _cluster_profilers(client, op, jobs: int | None, memory_cap: int | None):
    """``(profilers, memory cap)``: one ``WorkerProfiler`` per worker of ``client`` (at most
    ``jobs``), and ``memory_cap`` or, when None, the workers' own default cap."""
    from explorer.measure.worker_profiling import cluster_profilers, workers_memory_cap

    return (cluster_profilers(client, op, PROFILE_SESSIONS, jobs),
            workers_memory_cap(client) if memory_cap is None else memory_cap)


def profiles_digest(records) -> str:
    """A digest of the isolated profiles ``records`` (shape, status, recorded bytes; in any
    order): equal exactly when a store holds the same profiles."""
    import hashlib

    rows = sorted((tuple(int(n) for n in r.shape), str(r.status), None if r.peak_bytes is None else float(r.peak_bytes))
                  for r in records)
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _reusable_model(operator: str, runs_dir, store: Store, settings: dict, budget: int, client=None):
    """``(saved model, the store's profiles)`` when the saved model is the loop's answer as it
    stands (``explore``'s docstring, Paid once), else None.  With ``client``, the environment
    it must have been learnt in is its workers' (where the profiles then run)."""
    from explorer.model.memory_model import MemoryModel

    try:
        saved = MemoryModel.load(paths.model_path(operator, runs_dir))
    except Exception:  # none, or unreadable: the loop makes one
        return None
    info = saved.info
    if client is not None:
        from explorer.measure.worker_profiling import workers_environment

        current = workers_environment(client, operator)
    else:
        current = None
    if info.get("explored_with") != settings or saved.stale_reasons(current):
        return None
    records = [r for r in store.records(operator) if r.source == SOURCE_PROFILE]
    if info.get("profiles_digest") != profiles_digest(records):
        return None
    return (saved, records) if info.get("converged") or len(records) >= budget else None


def _reused(operator: str, model, records, settings: dict, started: float, *, probes: int, probe_progress,
            runs_dir, storage, seed, report: bool, timings: Timings, client=None,
            probe_seconds: float = probing.PROBE_SECONDS_BUDGET) -> "ExploreResult":
    """The result of an ``explore`` whose saved model is the answer: only missing probes run,
    and the report is drawn only when asked and not there yet."""
    limit, confidence = settings["memory_limit_bytes"], settings["confidence"]
    with timings.section("in-worker probes"):
        probe_result = _probe(operator, model, probes, False, runs_dir, storage, confidence, probe_progress, seed,
                              limit, client, seconds_budget=probe_seconds)
    report_file = paths.report_path(operator, runs_dir)
    if report and not report_file.exists():
        with timings.section("report.png"):
            explore_report(model, records, [], report_file, confidence=confidence, memory_limit=limit,
                           tolerance=settings["tolerance"])
    return ExploreResult(
        operator=operator, profiles=len(records), new_profiles=0,
        stopped_because=model.info.get("stopped_because") or "the saved model", seconds=time.perf_counter() - started,
        operator_seconds=0.0, max_relative_uncertainty=model.info.get("half_width"),
        tolerance=settings["tolerance"], confidence=confidence, memory_limit_bytes=limit,
        model_path=str(paths.model_path(operator, runs_dir)), report_path=str(report_file) if report else None,
        probes=probe_result, prior=model.info.get("prior"),
        converged=bool(model.info.get("converged")),
        certified_factor=model.hyperparameters["certified_factor"], regime=model.regime, reused=True,
        region_max_block_voxels=model.info.get("region_max_block_voxels"),
        timings=timings.to_dict())


def _with_budget(stopped_because: str, budget: int, in_flight: int) -> str:
    """The loop's reason to stop, a spent budget said with its size and the profiles others
    still have under way."""
    if not stopped_because.startswith("budget"):
        return stopped_because
    return (f"budget of {budget} profiles spent"
            + (f", {in_flight} still being profiled by other processes" if in_flight else "")
            + stopped_because[len("budget spent"):])


def _observed_shapes(model) -> set[tuple[int, ...]]:
    return {tuple(s) for s in model.train_shapes} | {tuple(s) for s in model.exceeded_shapes}


def supersedes(saved, model) -> bool:
    """Whether the saved model ``saved`` learnt from everything ``model`` did and more, in this
    environment (``model``'s: the workers' when they profiled): another explore process sharing
    the store read it later and saved first."""
    return (saved.operator == model.operator and not saved.stale_reasons(model.environment)
            and _observed_shapes(saved) > _observed_shapes(model))


def save_model_unless_superseded(model, path):
    """Save ``model`` to ``path`` unless the model there :func:`supersedes` it; return the model
    now at ``path``.

    Under an exclusive ``flock`` on ``<path>.lock``, so explore processes finishing
    together leave the best-informed model, whole.
    """
    import fcntl

    from explorer.model.memory_model import MemoryModel

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            saved = MemoryModel.load(path)
        except Exception:  # none yet, or unreadable: ours replaces it
            saved = None
        if saved is not None and supersedes(saved, model):
            return saved
        model.save(path)
        return model


def _probe(operator, model, n: int, profiled_new, runs_dir, storage, confidence, progress, seed,
           memory_limit=None, client=None, timings=None, *,
           seconds_budget: float = probing.PROBE_SECONDS_BUDGET) -> dict | None:
    """Run ``n`` in-worker probes unless ``n`` is 0 or they were already done for this model and
    environment (``seconds_budget``: ``run_probes``')."""
    from explorer.plan.calibration import CalibrationFileError, load_calibration

    if n <= 0:
        return None
    if not profiled_new:
        try:
            # judged where the probes would run: the workers' environment on a cluster
            saved = load_calibration(operator, runs_dir, model.environment if client is not None else None)
        except CalibrationFileError:
            saved = None
        if saved is not None and not saved.stale and saved.n_probe_groups >= n:
            return {"skipped": f"the calibration already holds {saved.n_probe_groups} probes of this environment"}
    return probing.run_probes(operator, model, n=n, runs_dir=runs_dir, storage=storage, confidence=confidence,
                              progress=progress, seed=seed, memory_limit=memory_limit, client=client,
                              timings=timings, seconds_budget=seconds_budget).to_dict()
