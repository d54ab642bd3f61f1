"""Benchmark of chunk sizing (issue 4): Dask's auto chunks, the prototype's rule, a manual
grid of chunk shapes and ours, side by side, on synthetic SEG-Y volumes where Dask's
auto chunks kill workers.

    python scripts/bench_chunks.py [--scenarios gst3d:256:1.5GiB,envelope:320:640MiB,semblance:320:512MiB,...]
        [--cache runs/bench] [--repeat 3] [--budget 30] [--proto-edges 50,200] [--no-refine-run]
        [--user-clusters gst3d:256:1.5GiB --preload-mib 0,650 --user-threads 1,2,4 --user-repeat 3]
        [--json PATH]
    python scripts/bench_chunks.py --refit RUNS.json [RUNS.json ...]

Every run is ``explorer.runner.daskrun.run(op, <input>.sgy, <tmp>/out.zarr, workers=2,
threads=1, memory_limit=L, allowed_failures=1, stall_seconds=60)`` on its own
fresh ``LocalCluster``, with ``refine=False`` unless said otherwise.  Per scenario
(operator, cube volume, per-worker limit ``L``):

* **auto**: ``chunks="auto"`` (Dask's ``array.chunk-size``, 128 MiB of input per chunk;
  the samples axis whole, as ``operators.read_segy`` asks).
* **prototype**: cubes of edge ``floor(cbrt(0.8 L / b))``, ``b`` the slope of an ordinary
  least-squares line ``peak = a + b V`` fitted to isolated profiles
  (``explorer.measure.profiling.Profiler``, one run each) of the 8 corner shapes of a 4x4x4 grid
  whose edges span ``--proto-edges`` (the prototype's grid spanned 100..400; the corners
  carry the fit of a line in ``V``).  As in the prototype's data, ``peak`` is the profiled
  process's peak RSS (interpreter and input included: ``process_peak_bytes``).  The rule
  ignores the intercept, halos, threads and Dask's own memory, by design.  Axes the
  operator needs whole are read whole (daskrun does this for every explicit shape).
* **grid**: cubes of edge ``ceil(N/k)`` for ``k = 1, 2, 3, 4, 6`` and one slab
  ``(ceil(N/4), N, N)``; a shape equal (after whole axes) to auto's or the prototype's
  is not run again, its row says so.  Every grid shape runs once; those that ended ok
  without a restart in at most 1.5x the fastest one's time (at most three) are the oracle
  candidates and run ``--repeat`` more times (or, with ``--timed-seconds S``, enough rounds
  that half of them at the fastest screening run's seconds sum to ``S``) in rounds with ours
  (each once per round, in the orders of a Williams design over whole cycles, the rounds
  rounded up, its methods relabelled at random per scenario, ``harness/rounds.py``: every
  method after every other, and in every position, equally often, since a run is slower after
  some plans than after its own, and none first of all by the order of the list); the
  **oracle** is the candidate with the lowest median ``seconds`` over the first half of the
  rounds' cycles; its ``seconds`` and ours are the medians over the other half, which the choice
  never saw (one cycle only: chosen and timed on the same rounds).  The screening run that
  selected a candidate, and ours' first run, are left out of the medians (shown apart): the least
  of several noisy single runs, or medians over the same rounds, is low by selection.
  Beside ours / oracle, the 95% bootstrap interval of that ratio of medians, resampling whole
  rounds (``harness/rounds.py``): sub-second runs on two cores swing by a quarter between repeats.
* **ours**: ``chunks="model"``: ``recommend_chunks(op, shape, L, workers=2)`` (with the
  workers' measured baseline) on the model and in-worker calibration of
  ``explore(op, budget=--budget, memory_limit=L)`` (isolated profiles, then explore's
  in-worker probes; no production run) in the scenario's own runs directory
  ``<cache>/chunks/runs-<op>-<L bytes>`` (reused when its model exists: the profiles and
  exploration seconds are those of the run that made it), ``--repeat`` runs with
  ``refine=False``; then once with ``refine=True`` (observation, calibration, possible
  re-plan) on a throw-away copy of that directory, so the benchmark's calibration stays
  the probes' from one invocation to the next.

Per run: status, ``seconds`` (daskrun's: graph submitted to output complete), tasks, chunk
shape, worker peak (max over workers of the sampled RSS, ``worker_peak_bytes``), worker
HWM (max of the exact ``VmHWM``, ``worker_hwm_bytes``; none for a worker that died),
utilisation = max(peak, HWM) / L, workers restarted, memory kills, and the 1-minute
load average when the run started (2 cores here: timing is only comparable at equal load).
Repeated methods show the median seconds and every run's seconds; peaks are the max
over their runs, restarts and kills the sum.

Targets (issue 4): ours never loses a worker in any scenario; its median ``seconds``
<= 1.10 x the oracle's; its worker peak <= L.

Scenarios (defaults), chosen so that ``chunks="auto"`` is killed, measured here with
2 workers x 8 GiB (HWM of the worker running the single auto chunk):

* gst3d 256^3 at 1.5 GiB.  The field notes' 240^3 at 1.5 GiB is no longer killed:
  this gst3d (closed-form 3x3 eigen-solver) takes ~90 B/voxel, not 240, and 240^3 in one
  auto chunk peaked at 1.30 GiB < 95% of 1.5 GiB (status ok).  256^3 (64 MiB, one auto
  chunk) peaks ~1.6 GiB: killed.
* envelope 320^3 at 640 MiB and semblance 320^3 at 512 MiB.  Auto caps a chunk at 128 MiB
  of input, so an operator of 13-16 B/voxel peaks at most ~0.6-0.8 GiB per worker under
  auto, however large the volume: only limits below that are killed (no larger volume on
  this 24 GiB machine changes it).  320^3 (125 MiB) is one auto chunk, HWM 781 MiB
  (envelope) and 630 MiB (semblance): 1.28x and 1.30x the terminate threshold (95% of L).
  Small workers, but the ratio task/limit is the one of many-worker nodes (24 GiB / 32).
* gaussian 320^3 at 384 MiB (auto: one chunk, killed): not in the fit that set the
  planner's time constants (``explorer.plan.time_model.DEFAULT_GRAPH_TASK_SECONDS`` and
  ``RUN_IO_SECONDS_PER_VOXEL`` came from the grid runs of the three scenarios above).

The time model (after the summary): ``explorer.plan.time_model.plan_seconds`` fitted to every
grid and ours shape that ended ok, one graph-task overhead for all operators and one
seconds-per-voxel per operator, printed beside the planner's own prediction with the
terms it learnt from the probes' clocks (``explorer.plan.timing.TimingFit``), and those
learnt terms against the constants they replace (``DEFAULT_GRAPH_TASK_SECONDS``, the
profiled operator speed plus ``RUN_IO_SECONDS_PER_VOXEL``); ``--json`` keeps every run
and ``--refit`` fits again from such files (several runs together) without running
anything.  Then the footprint check: for every shape that ran without a restart, the
worker footprint bound ``recommend_chunks`` would promise for it (the in-worker task
model, the run's measured baseline), against the measured HWM.

User clusters (``--user-clusters``, issue 11): a cluster started as a user starts one,
``dask scheduler`` plus ``dask worker --nworkers W --nthreads T --memory-limit L``
(W = ``--user-workers``, default 2)
(``harness/cluster.py``), idle or with ``--preload harness.heavy_preload`` holding
``--preload-mib`` MiB per worker (a library loaded at start), for each T in
``--user-threads``.  Per configuration, ``--user-repeat`` runs of ours
(``explore run --scheduler``: the workers' own baseline measured, ``chunks="model"``,
observed against the bound, no recalibration, no re-plan) and as many of the plan the
code made before issue 11 would have made: the isolated model's bound, the fixed
160 MiB baseline, the profiled speed plus 60 ns/voxel and 2 ms per graph task
(``plan_chunks`` with those inputs), run with explicit chunks on the same cluster.
Targets: every run of ours ends ok, without a restart, with every worker's kernel
high-water mark under the pause threshold.

Inputs are written once (``operators.write_segy(path, operators.synthetic_volume(shape))``)
to ``<cache>/chunks/`` and reused; prototype profiles are cached there too.  Prints a
Markdown table and verdicts per scenario, a summary and the machine line; progress on stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import operators
from explorer.runner.daskrun import run
from explorer.core.atomic import atomic_path, atomic_write_text
from explorer.core.units import format_bytes, format_shape, parse_shape, parse_size
from harness.machine import machine_line
from harness.rounds import choosing_rounds, cycle_length, ratio_interval, round_orders
from harness.trials import trials_note

WORKERS = 2
THREADS = 1
#: The prototype's rule sizes a chunk's peak to this share of the limit.
PROTOTYPE_SHARE = 0.8
#: Grid cubes: edge ceil(N / k).  The slab: ceil(N / SLAB_K) inlines, whole otherwise.
GRID_K = (1, 2, 3, 4, 6)
SLAB_K = 4
#: Oracle candidates: the grid shapes (at most ORACLE_CANDIDATES) whose first run took at most
#: ORACLE_WINDOW x the fastest first run; they are repeated to --repeat runs, like ours.
ORACLE_CANDIDATES = 3
ORACLE_WINDOW = 1.5
#: Ours' wall-time target against the oracle.
WALL_TARGET = 1.10
STALL_SECONDS = 60.0
DEFAULT_SCENARIOS = "gst3d:256:1.5GiB,envelope:320:640MiB,semblance:320:512MiB,gaussian:320:384MiB"

STARTED = time.perf_counter()


def log(line: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {line}", file=sys.stderr, flush=True)


def mib(n) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f} MiB"


# --------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One ``daskrun.run`` and the load average when it started."""

    result: object
    load: float

    @property
    def ok(self) -> bool:
        r = self.result
        return r.status == "ok" and r.workers_restarted == 0 and r.memory_kills == 0

    @property
    def peak(self) -> int | None:
        return max(self.result.worker_peak_bytes, default=None)

    @property
    def hwm(self) -> int | None:
        values = [v for v in self.result.worker_hwm_bytes if v is not None]
        return max(values, default=None)


def _median_seconds(runs) -> float | None:
    values = [r.result.seconds for r in runs if r.result.seconds is not None]
    return statistics.median(values) if values else None


@dataclass
class Method:
    """A row of the table: one chunking method and its runs."""

    name: str
    chunks: object  # what was asked for ("auto", "model" or a shape)
    kind: str  # auto, prototype, grid, ours
    runs: list[Run] = field(default_factory=list)
    same_as: str | None = None  # not run: same chunks as that method
    note: str = ""
    #: Runs before the interleaved rounds (a candidate's screening run, ours' first): left out of
    #: ``seconds`` once the rounds have run, since the screening run is the one that selected it.
    screened: int = 0
    #: The rounds after the screening that chose the oracle: left out of ``seconds`` too, which is
    #: then timed on rounds the choice never saw (``choosing_rounds``).
    choosing: int = 0

    @property
    def choosing_seconds(self) -> float | None:
        """The median over the rounds that choose the oracle (None: no such rounds)."""
        return _median_seconds(self.runs[self.screened:self.screened + self.choosing]) if self.choosing else None

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    @property
    def timed_runs(self) -> list[Run]:
        """The runs ``seconds`` is the median of: the rounds' once there are any, but those that
        chose the oracle."""
        skip = self.screened + self.choosing
        return self.runs[skip:] if len(self.runs) > skip else self.runs

    @property
    def seconds(self) -> float | None:
        return _median_seconds(self.timed_runs)

    @property
    def peak(self) -> int | None:
        return max((r.peak for r in self.runs if r.peak is not None), default=None)

    @property
    def hwm(self) -> int | None:
        return max((r.hwm for r in self.runs if r.hwm is not None), default=None)

    @property
    def restarts(self) -> int:
        return sum(r.result.workers_restarted for r in self.runs)

    @property
    def kills(self) -> int:
        return sum(r.result.memory_kills for r in self.runs)

    @property
    def status(self) -> str:
        statuses = [r.result.status for r in self.runs]
        bad = [s for s in statuses if s != "ok"]
        return bad[0] if bad else "ok"

    def by_chunks(self, runs=None) -> dict[tuple, list[Run]]:
        """``runs`` (default all) grouped by the chunks they ran, in order of first appearance:
        ours (``chunks="model"``) plans again at every run, and its plan may move after a run's
        trials have timed new shapes."""
        groups: dict[tuple, list[Run]] = {}
        for r in self.runs if runs is None else runs:
            groups.setdefault(tuple(int(c) for c in r.result.chunks or ()), []).append(r)
        return groups

    @property
    def chunks_text(self) -> str:
        """The chunks of the runs ``seconds`` is the median of (with how many when they differ),
        and the screening run's when it ran others."""
        timed = self.by_chunks(self.timed_runs)
        text = ", ".join(format_shape(c) + (f" (x{len(rs)})" if len(timed) > 1 else "") for c, rs in timed.items())
        first = tuple(int(c) for c in self.runs[0].result.chunks or ()) if self.runs else ()
        if self.screened and len(self.runs) > self.screened and first not in timed:
            text += f" (its first run: {format_shape(first)})"
        return text


def one_run(tag: str, op: str, source: Path, out: Path, limit: int, chunks, *, refine: bool,
            runs_dir: Path) -> Run:
    load = os.getloadavg()[0]
    r = run(op, source, out, chunks=chunks, workers=WORKERS, threads=THREADS, memory_limit=limit,
            refine=refine, runs_dir=runs_dir, allowed_failures=1, stall_seconds=STALL_SECONDS, overwrite=True, check=False)
    one = Run(r, load)
    seconds = f"{r.seconds:.1f} s" if r.seconds is not None else "—"
    log(f"{tag}: {r.status} {format_shape(r.chunks or [])} x{r.n_tasks} in {seconds} (wall {r.wall_seconds:.1f} s), "
        f"peak {mib(one.peak)}, HWM {mib(one.hwm)}, restarts {r.workers_restarted}, kills {r.memory_kills}, "
        f"load {load:.2f}" + (f" | {r.error}" if r.error else ""))
    return one


# --------------------------------------------------------------------------- inputs and baselines


def ensure_input(cache: Path, shape) -> Path:
    path = cache / f"synthetic-{format_shape(shape)}.sgy"
    if not path.exists():
        started = time.perf_counter()
        with atomic_path(path) as tmp:
            operators.write_segy(tmp, operators.synthetic_volume(shape))
        log(f"wrote {path} in {time.perf_counter() - started:.1f} s")
    return path


def normalise(op, shape, chunk) -> tuple[int, ...]:
    """The chunk daskrun runs: whole axes whole, every axis at most the volume's."""
    return tuple(int(n) if axis in op.whole_axes else min(int(c), int(n))
                 for axis, (n, c) in enumerate(zip(shape, chunk)))


def auto_chunks(source: Path) -> tuple[int, ...]:
    x = operators.read_segy(source, chunks="auto")
    return tuple(int(c[0]) for c in x.chunks)


class PrototypeProfiles:
    """Isolated profiles for the prototype's regression, cached in a JSON file by study name."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.profiler = None

    def get(self, op: str, shape) -> dict:
        from explorer.search.store import study_name

        key = study_name(op)
        entry = self.data.setdefault(key, {}).get(format_shape(shape))
        if entry is None:
            if self.profiler is None:
                from explorer.measure.profiling import Profiler

                self.profiler = Profiler(gpu=False)
            m = self.profiler.profile(op, shape, repeat=1)
            entry = {"status": m.status, "process_peak_bytes": m.process_peak_bytes, "peak_bytes": m.peak_bytes,
                     "seconds": m.seconds}
            self.data[key][format_shape(shape)] = entry
            atomic_write_text(self.path, json.dumps(self.data, indent=1))
            log(f"prototype profile {op} {format_shape(shape)}: {m.status}, process peak "
                f"{mib(m.process_peak_bytes)}, {m.seconds or 0:.2f} s")
        return entry

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()


def prototype_rule(op: str, limit: int, edges, profiles: PrototypeProfiles):
    """``(edge, bytes_per_voxel, intercept, n_profiles)`` of the prototype's rule."""
    shapes = list(itertools.product(edges, repeat=3))
    volumes, peaks = [], []
    for shape in shapes:
        entry = profiles.get(op, shape)
        if entry["status"] == "ok" and entry["process_peak_bytes"]:
            volumes.append(math.prod(shape))
            peaks.append(float(entry["process_peak_bytes"]))
    slope, intercept = np.polyfit(np.asarray(volumes, float), np.asarray(peaks), 1)
    edge = max(1, math.floor((PROTOTYPE_SHARE * limit / slope) ** (1 / 3)))
    return edge, float(slope), float(intercept), len(volumes)


def stale_exploration(op: str, runs_dir: Path) -> list[str]:
    """How a cached exploration's model or in-worker calibration differs from this code and
    environment (``[]``: reusable).  The d7af9fe invocation reused probes made before fd0c090
    changed what a task holds, and said only "reused"."""
    import warnings

    from explorer import task_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tasks = task_model(op, runs_dir=runs_dir)
    calibration = tasks.calibration
    return list(tasks.isolated_stale or []) + (["no in-worker calibration"] if calibration is None
                                               else list(calibration.stale or []))


def ensure_model(op: str, limit: int, runs_dir: Path, budget: int) -> dict:
    """Explore ``op`` into ``runs_dir`` unless its model is there; the exploration's summary."""
    from explorer.core import paths

    summary_path = runs_dir / "explore.json"
    if paths.model_path(op, runs_dir).exists() and summary_path.exists():
        stale = stale_exploration(op, runs_dir)
        if not stale:
            summary = json.loads(summary_path.read_text())
            summary["reused"] = True
            return summary
        log(f"{op}: the cached exploration in {runs_dir} was learnt elsewhere ({'; '.join(stale)}): exploring again")
        shutil.rmtree(runs_dir)
    from explorer import explore

    log(f"exploring {op} (budget {budget}, memory limit {format_bytes(limit)}) into {runs_dir}")

    def progress(step, total):
        peak = mib(step.peak_bytes) if step.peak_bytes is not None else "—"
        log(f"  explore {op} {step.index}/{total}: {format_shape(step.shape)} {step.status} peak {peak}")

    result = explore(op, budget=budget, memory_limit=limit, runs_dir=runs_dir, progress=progress, report=False)
    summary = result.to_dict()
    summary["budget"] = budget
    summary_path.write_text(json.dumps(summary, indent=1))
    summary["reused"] = False
    return summary


# --------------------------------------------------------------------------- one scenario


@dataclass
class Scenario:
    op: str
    shape: tuple[int, int, int]
    limit: int

    @property
    def name(self) -> str:
        return f"{self.op} {format_shape(self.shape)} @ {format_bytes(self.limit)}"


@dataclass
class Outcome:
    scenario: Scenario
    methods: list[Method]
    oracle: Method | None
    ours: Method
    ours_refine: Method | None
    auto: Method
    explore: dict
    seconds: float
    verdicts: list[tuple[str, bool, str]]
    runs_dir: Path | None = None


def chunks_cache(root) -> Path:
    """Where ``--cache root`` keeps this benchmark's inputs and explored models."""
    return Path(root) / "chunks"


def scenario_runs_dir(cache: Path, op: str, limit: int) -> Path:
    """The runs directory of ``op``'s model explored at worker ``limit`` in :func:`chunks_cache`'s ``cache``."""
    return cache / f"runs-{op}-{limit}"


def run_scenario(sc: Scenario, args, cache: Path, tmp: Path, profiles: PrototypeProfiles) -> Outcome:
    started = time.perf_counter()
    op = operators.get(sc.op)
    source = ensure_input(cache, sc.shape)
    out = tmp / "out.zarr"
    runs_dir = scenario_runs_dir(cache, sc.op, sc.limit)
    scratch_runs = tmp / "scratch-runs"  # runs=... of the methods that use no model
    tag = sc.op

    explored = ensure_model(sc.op, sc.limit, runs_dir, args.budget)
    from explorer.search.store import Store

    if Store(runs_dir).records(sc.op, source="production"):
        raise SystemExit(f"{runs_dir} holds production observations: the benchmark's calibration must be the "
                         f"probes' alone")

    edge, bpv, intercept, n_profiles = prototype_rule(sc.op, sc.limit, args.proto_edges, profiles)
    auto_chunk = normalise(op, sc.shape, auto_chunks(source))
    proto_chunk = normalise(op, sc.shape, (edge,) * 3)

    auto = Method("auto", "auto", "auto")
    proto = Method(f"prototype (edge {edge})", (edge,) * 3, "prototype",
                   note=f"peak = a + b V: b = {bpv:.1f} B/voxel, a = {mib(intercept)}, {n_profiles} profiles")
    grid: list[Method] = []
    seen = {auto_chunk: "auto"}
    seen.setdefault(proto_chunk, proto.name)
    for k in GRID_K:
        chunk = tuple(-(-n // k) for n in sc.shape)
        grid.append(Method(f"grid N/{k}", chunk, "grid"))
    grid.append(Method(f"grid slab N/{SLAB_K}", (-(-sc.shape[0] // SLAB_K),) + tuple(sc.shape[1:]), "grid"))
    ours = Method("ours (refine=False)", "model", "ours")
    ours_refine = Method("ours (refine=True)", "model", "ours") if args.refine_run else None

    def go(method: Method, refine: bool = False, runs=None):
        method.runs.append(one_run(f"{tag} {method.name}", sc.op, source, out, sc.limit, method.chunks,
                                   refine=refine, runs_dir=runs or scratch_runs))

    go(ours, runs=runs_dir)
    go(auto)
    if proto_chunk == auto_chunk:
        proto.same_as = "auto"
        proto.runs = auto.runs
    else:
        go(proto)
    for method in grid:
        chunk = normalise(op, sc.shape, method.chunks)
        if chunk in seen:
            method.same_as = seen[chunk]
            method.runs = auto.runs if method.same_as == "auto" else proto.runs
            continue
        seen[chunk] = method.name
        go(method)
    # The fastest grid shapes, repeated in turn with ours.
    survived = sorted((m for m in grid if m.same_as is None and m.ok), key=lambda m: m.seconds)
    candidates = [m for m in survived if m.seconds <= ORACLE_WINDOW * survived[0].seconds][:ORACLE_CANDIDATES]
    for m in survived:
        if m not in candidates:
            m.note = f"first run > {ORACLE_WINDOW:g} x the fastest: not an oracle candidate"
    # Rounds: each of them and ours once per round, in a Williams design's orders; the screening runs
    # (the one that selected a candidate, ours' first) are left out of the medians, since the
    # least of several noisy single runs is low by selection.
    for method in [ours] + candidates:
        method.screened = len(method.runs)
    arms = [ours] + candidates
    rounds = timed_rounds(args.repeat, args.timed_seconds,
                          [r.result.seconds for m in arms for r in m.runs if r.ok and r.result.seconds])
    orders = round_orders(len(arms), rounds, key=sc.name)
    choosing = choosing_rounds(len(orders), cycle_length(len(arms)))
    for order in orders:
        for method in (arms[i] for i in order):
            go(method, runs=runs_dir if method is ours else None)
    for method in arms:
        method.choosing = choosing
    # The oracle: the lowest median among the candidates over the rounds that choose it, all with
    # the same number of runs; its seconds and ours are the other rounds'.
    oracle = min((m for m in candidates if m.ok), key=lambda m: m.choosing_seconds or m.seconds, default=None)
    if ours_refine is not None:
        copy = tmp / f"runs-refine-{sc.op}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(runs_dir, copy)
        go(ours_refine, refine=True, runs=copy)
        shutil.rmtree(copy, ignore_errors=True)

    methods = [auto, proto] + grid + [ours] + ([ours_refine] if ours_refine else [])
    verdicts = verdicts_for(sc, ours, ours_refine, oracle, auto)
    return Outcome(sc, methods, oracle, ours, ours_refine, auto, explored, time.perf_counter() - started, verdicts,
                   runs_dir)


def timed_rounds(repeat: int, timed_seconds: float, screening_seconds) -> int:
    """Rounds enough that each arm's timed half sums to about ``timed_seconds`` at the fastest
    screening run, and at least ``repeat``: the median of sub-second runs needs more of them for
    the precision a median of seconds-long runs has (``first_derivative``'s 0.3 s runs spread
    0.24-0.39 s between repeats of one plan)."""
    fastest = min(screening_seconds, default=None)
    if not timed_seconds or not fastest:
        return repeat
    return max(repeat, math.ceil(2 * timed_seconds / fastest))


def verdicts_for(sc: Scenario, ours: Method, ours_refine: Method | None, oracle: Method | None, auto: Method):
    mine = ours.runs + (ours_refine.runs if ours_refine else [])
    lost = [r for r in mine if not r.ok]
    out = [("ours never lost a worker", not lost,
            f"{len(mine)} runs, statuses {', '.join(r.result.status for r in mine)}, "
            f"{sum(r.result.workers_restarted for r in mine)} restarts, {sum(r.result.memory_kills for r in mine)} memory kills")]
    if oracle is None or ours.seconds is None:
        out.append((f"ours wall <= {WALL_TARGET:.2f} x oracle", False, "no oracle (no grid shape survived) or no time"))
    else:
        ratio = ours.seconds / oracle.seconds
        pairs = [(a.result.seconds, b.result.seconds) for a, b in zip(ours.timed_runs, oracle.timed_runs)
                 if a.ok and b.ok] if ours.screened and oracle.screened else []
        same = ours.runs[-1].result.chunks == oracle.runs[0].result.chunks
        out.append((f"ours wall <= {WALL_TARGET:.2f} x oracle", ratio <= WALL_TARGET,
                    f"ours {ours.seconds:.2f} s (median of {len(ours.timed_runs)}) / oracle {oracle.name} "
                    f"{format_shape(oracle.runs[0].result.chunks)} {oracle.seconds:.2f} s (median of "
                    f"{len(oracle.timed_runs)}) = {ratio:.3f}; 95% interval over the rounds "
                    f"{ratio_interval(pairs)}" + ("; ours ran the oracle's own chunks" if same else "")))
    peaks = [max(v for v in (r.peak, r.hwm) if v is not None) for r in mine if r.peak is not None or r.hwm is not None]
    top = max(peaks, default=None)
    out.append(("ours worker peak <= limit", top is not None and top <= sc.limit,
                f"max over ours' runs of max(peak, HWM) {mib(top)} = "
                f"{(top or 0) / sc.limit:.0%} of {format_bytes(sc.limit)}"))
    out.append(("(scenario check) auto lost a worker", not auto.ok,
                f"auto: {auto.status}, {auto.restarts} restarts, {auto.kills} memory kills"))
    return out


# --------------------------------------------------------------------------- printing


def print_outcome(o: Outcome) -> None:
    sc = o.scenario
    op = operators.get(sc.op)
    nbytes = math.prod(sc.shape) * 4
    p = print
    p(f"\n### {sc.op}: {format_shape(sc.shape)} float32 ({format_bytes(nbytes)}), "
      f"{WORKERS} workers x {THREADS} thread x {format_bytes(sc.limit)}\n")
    p(f"halo {list(op.halo)}, whole axes {list(op.whole_axes)}. Scenario time {o.seconds:.0f} s.\n")
    p("| method | chunks | tasks | status | seconds | worker peak | worker HWM | utilisation | restarts | "
      "memory kills | load | note |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in o.methods:
        if not m.runs:
            continue
        r0 = m.runs[0].result
        if m.same_as:
            p(f"| {m.name} | {format_shape(r0.chunks or [])} | | | | | | | | | | same chunks as {m.same_as}: not run again |")
            continue
        secs = m.seconds
        seconds = "—" if secs is None else f"{secs:.2f}"
        if len(m.runs) > 1:
            timed = m.timed_runs
            seconds += " (n=" + str(len(timed)) + ": " + ", ".join(f"{r.result.seconds:.2f}" for r in timed
                                                                   if r.result.seconds is not None)
            if m.screened and len(m.runs) > m.screened:
                seconds += "; screening " + ", ".join(f"{r.result.seconds:.2f}" for r in m.runs[:m.screened]
                                                      if r.result.seconds is not None)
            if m.choosing:
                seconds += "; choosing the oracle " + ", ".join(
                    f"{r.result.seconds:.2f}" for r in m.runs[m.screened:m.screened + m.choosing]
                    if r.result.seconds is not None)
            seconds += ")"
        if m.status != "ok":
            seconds += " until failure"
        top = max((v for v in (m.peak, m.hwm) if v is not None), default=None)
        util = "—" if top is None else f"{'>= ' if m.hwm is None else ''}{top / sc.limit:.0%}"
        loads = "/".join(f"{r.load:.1f}" for r in m.runs)
        marks = []
        if m is o.oracle:
            marks.append("**oracle**")
        if m.note:
            marks.append(m.note)
        if m.kind == "ours" and r0.plan:
            plan = r0.plan
            marks.append(f"plan block {format_shape(plan['block'])}, predicted {mib(plan['predicted_bytes'])}, "
                         f"upper {mib(plan['upper_bytes'])} <= budget {mib(plan['budget_bytes'])}")
        if m.kind == "ours" and r0.trials:
            marks.append(trials_note(r0.trials))
        if m is o.ours_refine:
            r = r0
            marks.append(f"{r.observations_recorded} observations, {r.tasks_over_bound} tasks over bound"
                         + (f", re-planned from {r.replanned_from}" if r.replanned_from else ""))
        if m.status != "ok" and r0.error:
            marks.append(r0.error[:90] + ("..." if len(r0.error) > 90 else ""))
        p(f"| {m.name} | {m.chunks_text} | {r0.n_tasks if r0.n_tasks is not None else '—'} | "
          f"{m.status} | {seconds} | {mib(m.peak)} | {mib(m.hwm)} | {util} | {m.restarts} | {m.kills} | {loads} | "
          f"{'; '.join(marks)} |")
    e = o.explore
    p(f"\nOurs' model: explore({sc.op}, budget={e.get('budget')}, memory_limit={format_bytes(sc.limit)}): "
      f"{e.get('profiles')} isolated profiles, {e.get('seconds', 0):.0f} s of exploration "
      f"({e.get('operator_seconds', 0):.0f} s in the operator), {e.get('stopped_because')}"
      f"{' (reused from an earlier invocation)' if e.get('reused') else ''}; in-worker calibration from "
      f"{len((e.get('probes') or {}).get('runs') or [])} probes, no production run.")
    p("Utilisation = max(peak, HWM) / limit; '>=' when every HWM was lost with its worker (sampled peak only).\n")
    for name, passed, detail in o.verdicts:
        p(f"- {'PASS' if passed else 'FAIL'} {name}: {detail}")


def print_summary(outcomes: list[Outcome]) -> None:
    p = print
    p("\n### Summary\n")
    p("| scenario | auto | prototype | oracle | ours (refine=False) | ours / oracle | ours utilisation | "
      "ours lost a worker |")
    p("|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        def cell(m: Method | None) -> str:
            if m is None:
                return "—"
            if m.same_as:
                return f"= {m.same_as}"
            s = f"{m.seconds:.1f} s" if m.seconds is not None else "—"
            return f"{m.status} {m.chunks_text}, {s}, {m.restarts} restarts"
        proto = next(m for m in o.methods if m.kind == "prototype")
        top = max((v for r in o.ours.runs + (o.ours_refine.runs if o.ours_refine else [])
                   for v in (r.peak, r.hwm) if v is not None), default=None)
        ratio = (o.ours.seconds / o.oracle.seconds) if o.oracle and o.ours.seconds else None
        lost = any(not r.ok for r in o.ours.runs + (o.ours_refine.runs if o.ours_refine else []))
        p(f"| {o.scenario.name} | {cell(o.auto)} | {cell(proto)} | {cell(o.oracle)} | {cell(o.ours)} | "
          f"{'—' if ratio is None else f'{ratio:.3f}'} | {'—' if top is None else f'{top / o.scenario.limit:.0%}'} | "
          f"{'yes' if lost else 'no'} |")
    every = [v for o in outcomes for v in o.verdicts if not v[0].startswith("(")]
    p(f"\nTargets met: {sum(v[1] for v in every)} of {len(every)} "
      f"({', '.join(f'{o.scenario.op}: ' + '/'.join('PASS' if v[1] else 'FAIL' for v in o.verdicts if not v[0].startswith('(')) for o in outcomes)}).")


# --------------------------------------------------------------------------- the time model


def learnt_timing(op: str, runs_dir) -> dict:
    """The scenario's learnt time terms (explore's probes) and the constants they replace."""
    from explorer.plan.calibration import load_calibration
    from explorer.model.load import load_model

    timing = load_calibration(op, runs_dir).timing
    return {"learnt_seconds_per_voxel": timing.seconds_per_voxel,
            "learnt_operator_seconds_per_voxel": timing.operator_seconds_per_voxel,
            "learnt_io_seconds_per_voxel": timing.io_seconds_per_voxel,
            "learnt_graph_task_seconds": timing.graph_task_seconds,
            "learnt_clock": None if timing.clock is None else timing.clock.to_dict(),
            "profiled_seconds_per_voxel": load_model(op, runs_dir=runs_dir).info.get("seconds_per_voxel")}


def _plan_terms(plan: dict | None) -> dict:
    """What a model run's plan priced its chunks with: its predicted seconds and the first tasks'
    fresh pages (rate and warm bytes), which a run's own measurement of the workers moves."""
    if not plan:
        return {}
    return {"plan_predicted_seconds": plan.get("predicted_seconds"), "plan_first_touch": plan.get("first_touch")}


def run_records(outcomes: list[Outcome]) -> list[dict]:
    """Every run of every method, JSON-ready: what ``--json`` writes and ``--refit`` reads."""
    data = []
    for o in outcomes:
        terms = learnt_timing(o.scenario.op, o.runs_dir) if o.runs_dir else {}
        for m in o.methods:
            if m.same_as:
                continue
            for r in m.runs:
                res = r.result
                data.append({"operator": o.scenario.op, "shape": list(o.scenario.shape),
                             "limit_bytes": o.scenario.limit, "method": m.name, "kind": m.kind,
                             "refine": m is o.ours_refine, "chunks": list(res.chunks or []),
                             "n_tasks": res.n_tasks, "status": res.status, "seconds": res.seconds,
                             "workers_restarted": res.workers_restarted, "memory_kills": res.memory_kills,
                             "worker_peak_bytes": res.worker_peak_bytes, "worker_hwm_bytes": res.worker_hwm_bytes,
                             "worker_baseline_bytes": res.worker_baseline_bytes, "load": r.load,
                             "oracle": m is o.oracle, **_plan_terms(res.plan), **terms})
    return data


@dataclass
class TimedPlan:
    """A chunk shape whose runs all ended ok without a restart, with the time model's inputs."""

    op: str
    name: str
    chunks: tuple[int, ...]
    n_tasks: int
    block_samples: int
    tasks_per_chunk: float
    #: median over the runs
    seconds: float
    #: what the planner uses for this operator: learnt from the probes' clocks
    planner_seconds_per_voxel: float
    planner_graph_task_seconds: float
    #: the learnt spread of equal tasks at this block (None: Graham's bound)
    planner_spread: float | None
    #: what it used before issue 11: profiled b + RUN_IO_SECONDS_PER_VOXEL, DEFAULT_GRAPH_TASK_SECONDS
    constant_seconds_per_voxel: float


def timed_plans(records: list[dict]) -> list[TimedPlan]:
    """The grid shapes and ours (refine=False) of ``records``, one per scenario and method."""
    from explorer.plan.time_model import DEFAULT_GRAPH_TASK_SECONDS, TaskClock, graph_tasks_per_chunk, run_seconds_per_voxel
    from explorer.plan.grid import axis_blocks, mean_read_extent

    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r["kind"] in ("grid", "ours") and not r.get("refine", r["method"].startswith("ours (refine=True")):
            groups.setdefault((r["operator"], tuple(r["shape"]), r["limit_bytes"], r["method"], tuple(r["chunks"])),
                              []).append(r)
    out = []
    for (op_name, shape, _, name, _), runs in groups.items():
        if any(r["status"] != "ok" or r["workers_restarted"] or r["seconds"] is None for r in runs):
            continue
        halo = operators.get(op_name).halo
        chunks = tuple(int(c) for c in runs[0]["chunks"])
        counts = [-(-n // c) for n, c in zip(shape, chunks)]
        block = [int(axis_blocks(n, [c], h)[0]) for n, c, h in zip(shape, chunks, halo)]
        constant = run_seconds_per_voxel(runs[0].get("profiled_seconds_per_voxel"))
        learnt_g = runs[0].get("learnt_graph_task_seconds")
        clock = TaskClock.from_dict(runs[0]["learnt_clock"]) if runs[0].get("learnt_clock") else None
        volume = math.prod(block)
        per_voxel = runs[0].get("learnt_seconds_per_voxel") or constant
        if clock is not None:  # the planner's figure: the block's shape if clocked, and what its reads touch
            read = math.prod(float(mean_read_extent(n, [c], h, u)[0])  # the SEG-Y's traces, read whole
                             for n, c, h, u in zip(shape, chunks, halo, (1, 1, shape[2])))
            per_voxel = float(clock.seconds_per_voxel_at([volume], [block])[0]
                              + clock.read_correction([volume], [block], [read])[0] / volume)
        spread = None if clock is None or clock.spread_at(volume) is None else float(clock.spread_at(volume))
        out.append(TimedPlan(op_name, name, chunks, math.prod(counts), volume,
                             float(graph_tasks_per_chunk(counts, (0,) * len(shape))),  # windowed: no halo exchanged
                             statistics.median(r["seconds"] for r in runs),
                             per_voxel, DEFAULT_GRAPH_TASK_SECONDS if learnt_g is None else learnt_g, spread,
                             constant))
    return out


def print_time_model(records: list[dict]) -> None:
    """Fit ``explorer.plan.time_model.plan_seconds`` to the measured runs, beside the planner's own terms.

    Least squares on relative errors: one ``graph_task_seconds`` shared by every
    operator and one ``seconds_per_voxel`` per operator.  The planner's column uses
    the terms it learnt from explore's probes (``explorer.plan.timing.TimingFit``),
    scaled per operator to the measured median: a plan depends only on how the model
    ranks shapes of one volume.  Then the learnt terms against the constants they replace.
    """
    from scipy.optimize import least_squares

    from explorer.plan.time_model import DEFAULT_GRAPH_TASK_SECONDS, RUN_IO_SECONDS_PER_VOXEL, plan_seconds

    plans = timed_plans(records)
    ops = sorted({p.op for p in plans})
    if len(plans) < len(ops) + 2:
        return
    index = np.array([ops.index(p.op) for p in plans])
    measured = np.array([p.seconds for p in plans])

    def model(p: TimedPlan, seconds_per_voxel: float, graph_task_seconds: float) -> float:
        return float(plan_seconds(p.n_tasks, p.block_samples, WORKERS * THREADS, tasks_per_chunk=p.tasks_per_chunk,
                                  seconds_per_voxel=seconds_per_voxel, graph_task_seconds=graph_task_seconds,
                                  spread=p.planner_spread))

    def fitted_seconds(params):
        return np.array([model(p, params[1 + index[i]] * 1e-9, params[0] * 1e-3) for i, p in enumerate(plans)])

    fit = least_squares(lambda x: fitted_seconds(x) / measured - 1.0, x0=[2.0] + [100.0] * len(ops),
                        bounds=(0.0, np.inf))
    fitted = fitted_seconds(fit.x)
    planner = np.array([model(p, p.planner_seconds_per_voxel, p.planner_graph_task_seconds) for p in plans])
    raw_error = planner / measured - 1.0
    scale = np.array([float(np.median((measured / planner)[index == index[i]])) for i in range(len(plans))])
    error = fitted / measured - 1.0
    p = print
    p("\n### Time model: `plan_seconds` against the measured runs\n")
    p(f"`schedule_waves(n, C, sigma) * (g * tasks_per_chunk + s * prod(block))` with C = {WORKERS * THREADS} slots "
      "and sigma the spread of equal tasks the probes' clocks give at the block (Graham's n / C + 1 - 1 / C where "
      "they give none), fitted "
      f"by least squares on relative errors to the {len(plans)} grid and ours (refine=False) shapes whose runs all "
      f"ended ok (median seconds): g = {fit.x[0]:.2f} ms per graph task, "
      + ", ".join(f"s({op}) = {s:.0f} ns/voxel" for op, s in zip(ops, fit.x[1:]))
      + f"; RMS error {float(np.sqrt(np.mean(error ** 2))):.1%}, worst {float(np.max(np.abs(error))):.1%}.  "
      f"The planner's column uses the terms learnt from the probes (unscaled RMS error "
      f"{float(np.sqrt(np.mean(raw_error ** 2))):.1%}), scaled per operator to the measured median, since a plan "
      "depends only on how the model ranks the shapes of one volume.\n")
    p("| operator | method | chunks | chunks x graph tasks | measured s | fitted s | error | planner (scaled) | "
      "planner s/voxel | planner spread |")
    p("|---|---|---|---|---|---|---|---|---|---|")
    for i, plan in enumerate(plans):
        p(f"| {plan.op} | {plan.name} | {format_shape(plan.chunks)} | {plan.n_tasks} x {plan.tasks_per_chunk:.1f} | "
          f"{plan.seconds:.2f} | {fitted[i]:.2f} | {error[i]:+.1%} | {planner[i] * scale[i]:.2f} | "
          f"{plan.planner_seconds_per_voxel * 1e9:.0f} ns | "
          f"{'Graham' if plan.planner_spread is None else f'{plan.planner_spread:.1%}'} |")
    p("\n#### Learnt time terms against the constants they replace\n")
    p("Learnt: from the in-worker probes' clocks (`explorer.plan.timing.TimingFit`: operator and I/O seconds per "
      "voxel from the workers' task timings, the overhead per graph task from the probe runs' wall times).  "
      f"Constants before: the operator's isolated profiled speed + {RUN_IO_SECONDS_PER_VOXEL * 1e9:.0f} ns/voxel of "
      f"run I/O, {DEFAULT_GRAPH_TASK_SECONDS * 1e3:g} ms per graph task.  Fitted: this benchmark's wall times "
      "(above).\n")
    p("| operator | learnt operator s/voxel | learnt I/O s/voxel | learnt s/voxel | constant s/voxel "
      "(profiled + I/O) | fitted s/voxel | learnt g | constant g | fitted g |")
    p("|---|---|---|---|---|---|---|---|---|")
    for i, op in enumerate(ops):
        r = next(x for x in records if x["operator"] == op)
        learnt_g = r.get("learnt_graph_task_seconds")
        cells = [f"{(r.get(k) or 0) * 1e9:.0f} ns" for k in ("learnt_operator_seconds_per_voxel",
                                                             "learnt_io_seconds_per_voxel", "learnt_seconds_per_voxel")]
        constant = next(p.constant_seconds_per_voxel for p in plans if p.op == op)
        p(f"| {op} | {' | '.join(cells)} | {constant * 1e9:.0f} ns | {fit.x[1 + i]:.0f} ns | "
          f"{'—' if learnt_g is None else f'{learnt_g * 1e3:.2f} ms'} | {DEFAULT_GRAPH_TASK_SECONDS * 1e3:g} ms | "
          f"{fit.x[0]:.2f} ms |")


# --------------------------------------------------------------------------- the footprint


def print_footprint_check(outcomes: list[Outcome]) -> None:
    """Every shape that ran without a restart: its worker footprint bound against the measured HWM.

    The bound is ``explorer.plan.footprint.worker_footprint`` of the shape's block and chunks
    with the scenario's in-worker task model's 99% upper bound
    (``explorer.plan.task_model.TaskModel``), each task reading its own block (``windowed``: every
    method's run reads the file in windows, so no chunk is kept for a neighbour) and the largest
    baseline the runs measured: what ``recommend_chunks`` would promise for that shape.  HWM: the highest
    ``worker_hwm_bytes`` over its runs.  A method whose runs ran different chunks (ours, when a run's
    trials moved its plan) has a row per chunking, each with its own runs' HWM.
    """
    from explorer.plan.task_model import task_model
    from explorer.plan.grid import axis_blocks
    from explorer.plan.footprint import partial_chunks, worker_footprint

    rows = []
    for o in outcomes:
        sc, op = o.scenario, operators.get(o.scenario.op)
        if o.runs_dir is None:
            continue
        model = task_model(sc.op, runs_dir=o.runs_dir)
        for m in o.methods:
            if m.same_as or not m.runs or m is o.ours_refine or not all(r.ok for r in m.runs) or m.hwm is None:
                continue
            for chunks, runs in m.by_chunks().items():  # ours' plan may move between runs: each its own bound
                hwm = max((r.hwm for r in runs if r.hwm is not None), default=None)
                if hwm is None:
                    continue
                block = tuple(int(axis_blocks(n, [c], h)[0]) for n, c, h in zip(sc.shape, chunks, op.halo))
                upper = model.predict(block, 0.99)[1]
                baseline = max(r.result.worker_baseline_bytes for r in runs)
                bound = worker_footprint(block, upper, threads_per_worker=THREADS, windowed=True,
                                         output_itemsize=np.dtype(op.output_dtype).itemsize, baseline_bytes=baseline,
                                         chunk_shapes=chunks, partial=partial_chunks(sc.shape, chunks))
                rows.append((sc, m, chunks, bound, hwm))
    if not rows:
        return
    p = print
    p("\n### Worker footprint bound against the measured high-water mark\n")
    p("Per shape: `worker_footprint` with the in-worker task model's 99% bound, each task reading its own block "
      "(`windowed`: nothing kept for a neighbour) and the baseline measured on the workers, against the highest "
      "`worker_hwm_bytes` of its runs.\n")
    p("| scenario | method | chunks | bound | of which baseline | HWM | HWM / bound |")
    p("|---|---|---|---|---|---|---|")
    for sc, m, chunks, bound, hwm in rows:
        p(f"| {sc.name} | {m.name} | {format_shape(chunks)} | {mib(bound.total)} | "
          f"{mib(bound.baseline_bytes)} | {mib(hwm)} | {hwm / bound.total:.2f} |")
    over = [(sc, chunks, bound, hwm) for sc, _, chunks, bound, hwm in rows if hwm > bound.total]
    p(f"\nShapes whose HWM exceeded the bound: {len(over)} of {len(rows)}"
      + (": " + ", ".join(f"{sc.op} {format_shape(chunks)} ({hwm / bound.total:.2f})"
                          for sc, chunks, bound, hwm in over) if over else "")
      + ".")


# --------------------------------------------------------------------------- user clusters


@dataclass
class UserOutcome:
    """One user-cluster configuration: ours' runs and those of the pre-issue-11 plan."""

    scenario: Scenario
    preload_mib: int
    threads: int
    pause_bytes: int
    workers: int = WORKERS
    ours: list = field(default_factory=list)
    fixed_plan: object = None
    fixed: list = field(default_factory=list)
    fixed_same: bool = False

    def ok(self, r) -> bool:
        hwm = [h for h in r.worker_hwm_bytes if h is not None]
        return (r.status == "ok" and r.workers_restarted == 0 and r.memory_kills == 0
                and len(hwm) == len(r.worker_hwm_bytes) and max(hwm, default=0) <= self.pause_bytes)


def fixed_160_plan(op, shape, limit: int, threads: int, workers: int, runs_dir):
    """The plan the code made before issue 11: the isolated model's bound, a fixed 160 MiB
    baseline, the profiled speed + 60 ns/voxel, 2 ms per graph task."""
    from explorer.plan.time_model import DEFAULT_GRAPH_TASK_SECONDS, run_seconds_per_voxel
    from explorer.plan.planner import plan_chunks
    from explorer.plan.dask_config import worker_pause_fraction
    from explorer.plan.spec import TimeTerms, VolumeGeometry, WorkerSpec
    from explorer.model.load import load_model

    isolated = load_model(op.name, runs_dir=runs_dir)
    geometry = VolumeGeometry(shape, op.halo, whole_axes=op.whole_axes,
                              output_itemsize=np.dtype(op.output_dtype).itemsize)
    worker_spec = WorkerSpec(limit, 160 * 2**20, threads_per_worker=threads, workers=workers,
                             pause_fraction=worker_pause_fraction())
    time_terms = TimeTerms(seconds_per_voxel=run_seconds_per_voxel(isolated.info.get("seconds_per_voxel")),
                           graph_task_seconds=DEFAULT_GRAPH_TASK_SECONDS)
    return plan_chunks(geometry, isolated.predict_many, worker_spec, time_terms, operator=op.name)


def run_user_clusters(args, cache: Path, tmp: Path) -> list[UserOutcome]:
    from explorer.plan.dask_config import worker_pause_fraction
    from harness.cluster import user_cluster

    outcomes = []
    for sc in args.user_clusters:
        op = operators.get(sc.op)
        source = ensure_input(cache, sc.shape)
        runs_dir = scenario_runs_dir(cache, sc.op, sc.limit)
        ensure_model(sc.op, sc.limit, runs_dir, args.budget)
        for preload in args.preload_mib:
            for threads in args.user_threads:
                o = UserOutcome(sc, preload, threads, math.floor(worker_pause_fraction() * sc.limit),
                                args.user_workers)
                o.fixed_plan = fixed_160_plan(op, sc.shape, sc.limit, threads, args.user_workers, runs_dir)
                tag = f"user {sc.op} preload {preload} MiB W={args.user_workers} T={threads}"
                log(f"{tag}: starting dask scheduler + dask worker")
                with user_cluster(workers=args.user_workers, threads=threads, memory_limit=str(sc.limit),
                                  preload=["harness.heavy_preload"] if preload else (),
                                  env={"EXPLORER_TEST_PRELOAD_MIB": str(preload)}) as address:
                    copy = tmp / "runs-user"
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.copytree(runs_dir, copy)
                    for rep in range(args.user_repeat):
                        order = ("ours", "fixed") if rep % 2 == 0 else ("fixed", "ours")
                        for method in order:
                            if method == "ours":
                                r = run(sc.op, source, tmp / "out.zarr", scheduler=address, chunks="model",
                                        runs_dir=copy, refine=True, calibrate=False, replan=False,
                                        stall_seconds=STALL_SECONDS, overwrite=True, check=False)
                                o.ours.append(r)
                            else:
                                chunk = normalise(op, sc.shape, o.fixed_plan.chunks)
                                if o.ours and tuple(o.ours[0].chunks or ()) == chunk:
                                    o.fixed_same = True
                                    continue
                                r = run(sc.op, source, tmp / "out.zarr", scheduler=address, chunks=chunk,
                                        runs_dir=copy, refine=False, stall_seconds=STALL_SECONDS, overwrite=True, check=False)
                                o.fixed.append(r)
                            hwm = max((h for h in r.worker_hwm_bytes if h), default=None)
                            log(f"{tag} {method}: {r.status} {format_shape(r.chunks or [])} x{r.n_tasks}, "
                                f"baseline {mib(r.worker_baseline_bytes)}, HWM {mib(hwm)} (pause {mib(o.pause_bytes)}), "
                                f"restarts {r.workers_restarted}, over bound {r.tasks_over_bound}"
                                + (f" | {r.error}" if r.error else ""))
                    shutil.rmtree(copy, ignore_errors=True)
                outcomes.append(o)
    return outcomes


def print_user_clusters(outcomes: list[UserOutcome]) -> None:
    if not outcomes:
        return
    p = print
    p("\n### Clusters started like a user's: `dask scheduler` + `dask worker`, idle and with a preload\n")
    p("W workers x T threads; a preload is `--preload harness.heavy_preload` holding that many MiB per worker "
      "from its start.  Ours: `explore run --scheduler ADDR` (the workers' baseline measured, the in-worker task "
      "model; observed, not recalibrated, not re-planned).  Before: the plan the code made before issue 11 (the "
      "isolated bound, a fixed 160 MiB baseline), run with explicit chunks on the same cluster.  HWM: the highest "
      "kernel high-water mark of a worker over the method's runs, against the pause threshold.\n")
    p("| scenario | preload | workers x threads | method | chunks | tasks | measured baseline | plan upper | pause threshold | "
      "HWM (max) | HWM / pause | runs ok, no restart, HWM <= pause | restarts | tasks over bound | seconds (median) |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        rows = [("ours", o.ours, o.ours[0].plan["upper_bytes"] if o.ours and o.ours[0].plan else None)]
        if o.fixed_same:
            rows.append(("before (fixed 160 MiB)", None, o.fixed_plan.upper_bytes))
        else:
            rows.append(("before (fixed 160 MiB)", o.fixed, o.fixed_plan.upper_bytes))
        for name, runs, upper in rows:
            if runs is None:
                p(f"| {o.scenario.name} | {o.preload_mib} MiB | {o.workers} x {o.threads} | {name} | "
                  f"{format_shape(o.fixed_plan.chunks)} | | | {mib(upper)} | | | | same chunks as ours | | | |")
                continue
            if not runs:
                continue
            hwm = max((h for r in runs for h in r.worker_hwm_bytes if h), default=None)
            good = sum(o.ok(r) for r in runs)
            over = [r.tasks_over_bound for r in runs if r.tasks_over_bound is not None]
            secs = [r.seconds for r in runs if r.seconds is not None]
            p(f"| {o.scenario.name} | {o.preload_mib} MiB | {o.workers} x {o.threads} | {name} | "
              f"{format_shape(runs[0].chunks or [])} "
              f"| {runs[0].n_tasks} | {mib(max(r.worker_baseline_bytes or 0 for r in runs))} | {mib(upper)} | "
              f"{mib(o.pause_bytes)} | {mib(hwm)} | {'—' if hwm is None else f'{hwm / o.pause_bytes:.2f}'} | "
              f"{good} of {len(runs)} | {sum(r.workers_restarted for r in runs)} | "
              f"{'—' if not over else f'{sum(over)} of {sum(r.n_tasks or 0 for r in runs)}'} | "
              f"{statistics.median(secs) if secs else float('nan'):.1f} |")
    ours = [r for o in outcomes for r in o.ours]
    good = sum(o.ok(r) for o in outcomes for r in o.ours)
    before = [(o, r) for o in outcomes for r in o.fixed]
    bad_before = sum(not o.ok(r) for o, r in before)
    p(f"\n- {'PASS' if good == len(ours) else 'FAIL'} every run of ours ended ok, without a restart, every worker's "
      f"HWM under the pause threshold: {good} of {len(ours)} runs")
    p(f"- before issue 11 (fixed 160 MiB, isolated bound), runs over the pause threshold, restarted or failed: "
      f"{bad_before} of {len(before)} runs (configurations where its chunks equal ours are not run twice: "
      f"{sum(o.fixed_same for o in outcomes)})")


# --------------------------------------------------------------------------- main


def parse_scenario(text: str) -> Scenario:
    try:
        op, shape, limit = text.split(":")
    except ValueError:
        raise SystemExit(f"--scenarios: {text!r} is not OPERATOR:SHAPE:LIMIT") from None
    shape = parse_shape(shape if "x" in shape else f"{shape}x{shape}x{shape}")
    operators.get(op)
    return Scenario(op, shape, parse_size(limit))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=DEFAULT_SCENARIOS,
                        help="comma-separated OPERATOR:EDGE_OR_SHAPE:LIMIT (default %(default)s)")
    parser.add_argument("--cache", default="runs/bench", help="inputs, profiles and runs dirs go to CACHE/chunks")
    parser.add_argument("--repeat", type=int, default=3, help="runs of ours and of the oracle candidates")
    parser.add_argument("--timed-seconds", type=float, default=0.0,
                        help="more rounds than --repeat where runs are short: enough that each arm's "
                             "timed half sums to about this many seconds (0: --repeat rounds)")
    parser.add_argument("--budget", type=int, default=30, help="explore budget (profiles) for ours' model")
    parser.add_argument("--proto-edges", default="50,200",
                        help="min,max edge of the prototype's 4x4x4 grid; its 8 corners are profiled")
    parser.add_argument("--no-refine-run", dest="refine_run", action="store_false",
                        help="skip ours with refine=True")
    parser.add_argument("--user-clusters", default="",
                        help="OPERATOR:EDGE_OR_SHAPE:LIMIT scenarios run on dask scheduler + dask worker clusters")
    parser.add_argument("--preload-mib", default="0,650", help="worker preloads (MiB) of the user clusters")
    parser.add_argument("--user-threads", default="1,2,4", help="threads per worker of the user clusters")
    parser.add_argument("--user-repeat", type=int, default=3, help="runs of each method per user cluster")
    parser.add_argument("--user-workers", type=int, default=WORKERS, help="workers of the user clusters")
    parser.add_argument("--json", type=Path, default=None, help="also write every run to this JSON file")
    parser.add_argument("--refit", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the time-model fit of runs written by --json")
    args = parser.parse_args()
    if args.refit:
        missing = [str(p) for p in args.refit if not p.is_file()]
        if missing:
            raise SystemExit(f"--refit: no such file: {', '.join(missing)}")
        print_time_model([r for p in args.refit for r in json.loads(p.read_text())])
        return
    args.proto_edges = [int(e) for e in args.proto_edges.split(",")]
    if len(args.proto_edges) != 2:
        raise SystemExit("--proto-edges: two edges, min,max")
    scenarios = [parse_scenario(s) for s in args.scenarios.split(",") if s]
    args.user_clusters = [parse_scenario(s) for s in args.user_clusters.split(",") if s]
    args.preload_mib = [int(m) for m in args.preload_mib.split(",") if m]
    args.user_threads = [int(t) for t in args.user_threads.split(",") if t]
    cache = chunks_cache(args.cache)
    cache.mkdir(parents=True, exist_ok=True)

    load = os.getloadavg()
    print("## Chunk sizing: auto, the prototype's rule, a manual grid, ours\n")
    print(f"Load average at start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) on "
          f"{os.cpu_count()} cores.  {WORKERS} workers x {THREADS} thread, LocalCluster, allowed_failures=1, "
          f"stall guard {STALL_SECONDS:g} s; repeats {args.repeat}"
          + (f", or enough that each arm's timed runs sum to {args.timed_seconds:g} s" if args.timed_seconds else "")
          + ".", flush=True)
    profiles = PrototypeProfiles(cache / "prototype-profiles.json")
    outcomes = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-chunks-"))
    try:
        for sc in scenarios:
            log(f"scenario {sc.name}")
            outcome = run_scenario(sc, args, cache, tmp, profiles)
            outcomes.append(outcome)
            print_outcome(outcome)
            sys.stdout.flush()
        user_outcomes = run_user_clusters(args, cache, tmp)
    finally:
        profiles.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if outcomes:
        print_summary(outcomes)
        records = run_records(outcomes)
        print_time_model(records)
        print_footprint_check(outcomes)
    else:
        records = []
    print_user_clusters(user_outcomes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1))
    end = os.getloadavg()
    print(f"\nBenchmark wall time {time.perf_counter() - STARTED:.0f} s.  Load average at end: "
          f"{end[0]:.2f} / {end[1]:.2f} / {end[2]:.2f}.")
    print(f"Machine: {machine_line()}")


if __name__ == "__main__":
    main()
