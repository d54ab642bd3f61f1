"""The ``explore`` command (its commands: ``USAGE``): parse, call the core, print.  Nothing else lives here.

Bad input ends with one line on stderr and a non-zero exit, never a traceback
(set ``EXPLORER_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time

from explorer.core import validate
from explorer.cli_text import (considered_text, largest_block_text, print_explore, print_probes, print_run,
                               print_started, print_step, print_timings, probe_progress, tied_text,
                               time_model_text)
from explorer.core.units import format_bytes, format_shape, parse_shape

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CLIError(Exception):
    """A one-line error for the user."""


def _terminate(signum, frame):
    raise KeyboardInterrupt


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        raise CLIError(f"{self.prog}: {message}")


def _checked(check):
    """An argparse type from an ``explorer.core.validate`` check: the CLI and the library refuse
    the same values; argparse's own prefix (``argument --name:``) names the option."""

    def parse(text: str):
        try:
            return check(text, "")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip().removeprefix(": ")) from None

    return parse


_shape = _checked(validate.shape)
_size = _checked(validate.size)
_confidence = _checked(validate.confidence)
_fraction = _checked(validate.fraction)
_positive_int = _checked(validate.positive_int)
_non_negative_int = _checked(validate.non_negative_int)
_positive_float = _checked(validate.positive_number)


def _storage_url(text: str) -> str:
    """A URL of one of the accepted forms (whether it opens is found when it is opened)."""
    from explorer.search.store import StorageError, local_file

    try:
        local_file(text)
    except StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _operator_name(text: str) -> str:
    """An operator spec (a name, ``gaussian(sigma=4)``, ``gaussian,gst3d``, ``gaussian,envelope+gst3d``),
    returned canonical (``explorer.core.validate.operator``)."""
    from explorer.core import validate

    try:
        return validate.operator(text)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(exc.args[0]) from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- explore operators -----------------------------------------------------
def _cmd_operators(argv: list[str]) -> int:
    parser = _Parser(prog="explore operators", description="List the registered operators.")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    args = parser.parse_args(argv)
    import operators

    registered = {name: operators.get(name) for name in operators.names()}
    rows = [{"name": name, "halo": list(op.halo), "whole_axes": list(op.whole_axes), "description": op.description}
            for name, op in registered.items()]
    if args.json:
        print(json.dumps(rows))
        return 0
    axis_names = ("inline", "crossline", "samples")
    print(f"{'operator':<24} {'halo':<10} {'whole axes':<12} description")
    for row in rows:
        whole = ",".join(axis_names[a] for a in row["whole_axes"]) or "-"
        print(f"{row['name']:<24} {format_shape(row['halo']):<10} {whole:<12} {row['description']}")
    return 0


# -- explore profile -------------------------------------------------------
def _cmd_profile(argv: list[str]) -> int:
    parser = _Parser(
        prog="explore profile",
        description="Profile one operator at one shape in an isolated child process.",
    )
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("shape", type=_shape, help="like 200x200x200 (inline x crossline x samples)")
    parser.add_argument("--repeat", type=_positive_int, default=1, help="runs, each in a fresh child")
    parser.add_argument("--memory-cap", type=_size, default=None,
                        help="cap on the operator's working memory, like 2GiB (default: half this machine's memory)")
    parser.add_argument("--timeout", type=_positive_float, default=None, help="seconds per run")
    parser.add_argument("--seed", type=int, default=0, help="synthetic volume seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    from explorer.measure.profiling import profile

    if not args.json:
        print(f"profiling {args.operator} at {format_shape(args.shape)} ({args.repeat} run(s))...", file=sys.stderr)
    m = profile(args.operator, args.shape, repeat=args.repeat, memory_cap=args.memory_cap,
                timeout=args.timeout, seed=args.seed)
    if args.json:
        print(json.dumps(m.to_dict()))
    else:
        voxels = 1
        for n in m.shape:
            voxels *= n
        print(f"operator        {m.operator}")
        print(f"shape           {format_shape(m.shape)} ({voxels:,} voxels, {m.dtype})")
        print(f"status          {m.status}" + (f" ({m.error})" if m.error else ""))
        if m.peak_bytes is not None:
            bound = "  (lower bound: the run hit the memory cap)" if m.status == "exceeded" else ""
            print(f"peak_bytes      {format_bytes(m.peak_bytes)}  = {m.peak_bytes / voxels:.1f} bytes/voxel{bound}")
            print(f"process peak    {format_bytes(m.process_peak_bytes)}")
        print(f"input / output  {format_bytes(m.input_bytes)} / "
              f"{format_bytes(m.output_bytes) if m.output_bytes is not None else '-'}")
        if m.seconds is not None:
            print(f"seconds         {m.seconds:.3f}  (profile overhead {m.overhead_seconds:.3f} s)")
        if len(m.repeats) > 1:
            peaks = [r.get('peak_bytes') for r in m.repeats if r.get('peak_bytes') is not None]
            print("repeats         " + ", ".join(format_bytes(p) for p in peaks))
        if m.gpu and m.gpu.get("note"):
            print(f"gpu             {m.gpu['note']}")
    # ok and exceeded are measurements (exceeded: a lower bound); timeout and error are not
    if m.status in ("ok", "exceeded"):
        return 0
    print(f"explore profile: {m.operator} at {format_shape(m.shape)} {m.status}" + (f": {m.error}" if m.error else ""),
          file=sys.stderr)  # the failure is stderr's last line
    return EXIT_FAILURE


# -- explore OPERATOR ------------------------------------------------------
def _add_store_options(parser, *, storage: bool = False, storage_note: str = ""):
    parser.add_argument("--runs-dir", default=None,
                        help="where studies, model fits and reports live (default: $EXPLORER_RUNS or ./runs)")
    if storage:
        parser.add_argument("--storage", type=_storage_url, default=None,
                            help="an Optuna storage URL instead of the SQLite file: sqlite:///PATH, "
                                 f"postgresql://..., or journal:PATH{storage_note}")


def _add_scheduler_options(parser, what: str) -> None:
    parser.add_argument("--scheduler", default=None, help=f"address of an existing cluster, e.g. tcp://host:8786: {what}")
    parser.add_argument("--connect-timeout", type=_positive_float, default=10.0,
                        help="seconds to reach --scheduler (default 10)")


def _add_probe_seconds(parser, default) -> None:
    from explorer.runner.probes import PROBE_SECONDS_BUDGET

    parser.add_argument("--probe-seconds", type=_positive_float, default=default,
                        help=f"what the probes may take, predicted seconds (default {PROBE_SECONDS_BUDGET:g}): their "
                             "largest block is the largest a plan runs, and the largest explore's loop learns")


@contextlib.contextmanager
def _scheduler_client(args):
    """A client of ``--scheduler`` (None without one), closed at the end; a cluster that cannot be used is one line."""
    if not args.scheduler:
        yield None
        return
    from explorer.runner.cluster import ClusterError, connect

    try:
        client = connect(args.scheduler, args.connect_timeout)
    except ClusterError as exc:
        raise CLIError(str(exc)) from None
    with client:
        yield client


def _cmd_explore(argv: list[str]) -> int:
    from explorer.exploration import PRIORS, explore

    parser = _Parser(
        prog="explore",
        description="Learn an operator's peak memory versus shape by Bayesian active learning: "
                    "profile the most informative shape per second, refit, stop when the bound is tight.",
    )
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("--budget", type=_positive_int, default=30,
                        help="total isolated profiles in the store for this operator (default 30)")
    parser.add_argument("--tolerance", type=_fraction, default=0.05,
                        help="stop when the bound's relative half-width over the target region is below this (0.05)")
    parser.add_argument("--confidence", type=_confidence, default=0.99,
                        help="confidence of the upper bound, in (0.5, 1) (0.99)")
    parser.add_argument("--memory-limit", type=_size, default=None,
                        help="target worker memory the chunks will be sized for (default: min(4GiB, RAM/cores); "
                             "with --scheduler, its smallest worker's memory limit)")
    parser.add_argument("--memory-cap", type=_size, default=None,
                        help="cap on one profile's working memory (default: half this machine's memory; with "
                             "--scheduler, half the smallest worker machine's)")
    _add_store_options(parser, storage=True, storage_note="; several explore processes may share one")
    parser.add_argument("--jobs", type=_positive_int, default=None,
                        help="profiles run in parallel (default 1; with --scheduler, one per worker)")
    parser.add_argument("--repeat", type=_positive_int, default=2, help="runs per profile (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probes", type=_non_negative_int, default=None,
                        help="in-worker probes after the isolated profiles (default 6; 0 skips them): what a task "
                             "costs inside a real Dask worker, so that the bound holds from the first run")
    _add_probe_seconds(parser, default=None)
    parser.add_argument("--prior", choices=PRIORS, default=PRIORS[0],
                        help="a pipeline whose members all have models learns from their composed model as its "
                             "prior mean (composed, the default), or from scratch (none)")
    parser.add_argument("--refresh", action="store_true",
                        help="refit from the store and let the stop decide again, even when the saved model was "
                             "made from exactly these profiles with these settings (then it is the answer at once)")
    _add_scheduler_options(parser, "the profiles (each an isolated child of a worker) and the in-worker probes run "
                                   "on its workers (default: profiles here, probes on a LocalCluster here)")
    parser.add_argument("--timings", action="store_true",
                        help="print where the wall time went (store, fits, profiling, probes...; always in --json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)

    from explorer.search.store import Store

    Store(args.runs_dir, args.storage)  # a storage that cannot be opened is one line, before any other
    print(f"exploring {args.operator}: budget {args.budget} profiles, tolerance {args.tolerance:.1%}, "
          f"confidence {args.confidence:.0%}", file=sys.stderr, flush=True)
    with _scheduler_client(args) as client:
        result = explore(args.operator, budget=args.budget, tolerance=args.tolerance, confidence=args.confidence,
                         memory_limit=args.memory_limit, memory_cap=args.memory_cap, runs_dir=args.runs_dir,
                         storage=args.storage, jobs=args.jobs, repeat=args.repeat, seed=args.seed,
                         progress=print_step, on_start=print_started, probes=args.probes, probe_progress=probe_progress,
                         probe_seconds=args.probe_seconds, prior=args.prior, report=True, refresh=args.refresh,
                         client=client)
    if args.timings:
        print_timings(result.timings, result.seconds)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0 if result.model_path else EXIT_FAILURE
    print_explore(result)
    if not result.model_path:
        print(f"explore: no model saved: {result.stopped_because}", file=sys.stderr)
        return EXIT_FAILURE
    if result.converged:
        print(result.stopped_because)
    else:
        print(f"NOT converged (the saved bound is wider than --tolerance asks, or untested): "
              f"{result.stopped_because}")
    return 0


# -- explore calibrate -----------------------------------------------------
def _cmd_calibrate(argv: list[str]) -> int:
    from explorer.runner.probes import DEFAULT_PROBES, PROBE_SECONDS_BUDGET, calibrate_in_workers

    parser = _Parser(prog="explore calibrate",
                     description="Run in-worker probes of an operator's or pipeline's saved model (a pipeline's "
                                 "may be composed from its members', with no profile of its own) on a local "
                                 "Dask cluster and save what a task costs inside a worker, so its plans' bound "
                                 "holds from the first run.")
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("--memory-limit", type=_size, default=None,
                        help="target worker memory: the probes go up to the block a plan at it runs, within "
                             "--probe-seconds "
                             "(default: min(4GiB, RAM/cores))")
    parser.add_argument("--probes", type=_positive_int, default=DEFAULT_PROBES,
                        help=f"probe blocks (default {DEFAULT_PROBES}; at least 3 distinct blocks identify the excess); "
                             "the smallest runs once more on a finer grid, which times a run's fixed seconds")
    _add_probe_seconds(parser, default=PROBE_SECONDS_BUDGET)
    parser.add_argument("--confidence", type=_confidence, default=0.99, help="in (0.5, 1) (0.99)")
    parser.add_argument("--seed", type=int, default=0)
    _add_store_options(parser, storage=True)
    _add_scheduler_options(parser, "the probes run on its workers (default: a LocalCluster here)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    from explorer.search.store import Store
    from explorer.model.load import load_model

    Store(args.runs_dir, args.storage)  # a storage that cannot be opened is one line, before any cluster
    load_model(args.operator, runs_dir=args.runs_dir)  # no model (or member's): one line naming the command
    print(f"calibrating {args.operator} in Dask workers: {args.probes} probes", file=sys.stderr, flush=True)
    with _scheduler_client(args) as client:
        result = calibrate_in_workers(args.operator, memory_limit=args.memory_limit, n=args.probes,
                                      runs_dir=args.runs_dir, storage=args.storage, confidence=args.confidence,
                                      progress=probe_progress, seed=args.seed, client=client,
                                      seconds_budget=args.probe_seconds).to_dict()
    if args.json:
        print(json.dumps(result))
    else:
        print_probes(result)
    if (result.get("calibration") or {}).get("excess") is None:
        print("explore calibrate: the probes did not identify a task's in-worker excess (warnings above); "
              "its plans keep the isolated bound", file=sys.stderr)
        return EXIT_FAILURE
    return 0


# -- explore chunks --------------------------------------------------------
_BASELINE_SOURCES = {"local": "an idle worker measured on this machine", "cluster": "measured on the cluster",
                     "given": "given"}


def _cmd_chunks(argv: list[str]) -> int:
    parser = _Parser(prog="explore chunks",
                     description="The fastest chunk shape whose worker footprint stays under the limit.")
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("--shape", type=_shape, required=True, help="the whole volume, like 800x600x1000")
    parser.add_argument("--memory-limit", type=_size, required=True, help="per worker, like 4GiB")
    parser.add_argument("--threads", type=_positive_int, default=1, help="threads per worker (default 1)")
    parser.add_argument("--workers", type=_positive_int, default=1,
                        help="workers sharing the work (default 1): the time model ranks shapes on workers x threads slots")
    parser.add_argument("--confidence", type=_confidence, default=0.99, help="in (0.5, 1) (0.99)")
    parser.add_argument("--baseline", type=_size, default=None,
                        help="an idle worker's resident memory on your cluster, like 800MiB (default: measured "
                             "once on this machine; `explore run --scheduler` measures the cluster's own)")
    _add_strategy_option(parser)
    _add_store_options(parser)
    parser.add_argument("--json", action="store_true", help="print the ChunkPlan as one JSON object")
    args = parser.parse_args(argv)

    from explorer.plan.recommend import recommend_chunks

    plan = recommend_chunks(args.operator, args.shape, args.memory_limit, threads_per_worker=args.threads,
                            confidence=args.confidence, runs_dir=args.runs_dir, workers=args.workers,
                            baseline_bytes=args.baseline, strategy=args.strategy)
    for line in plan.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(plan.to_dict()))
        return 0
    print(f"operator        {plan.operator}")
    print(f"volume          {format_shape(plan.shape)}")
    print(f"chunks          {format_shape(plan.chunks)}  ({plan.n_tasks} tasks)")
    print(f"worker memory   {format_bytes(plan.predicted_bytes)} predicted, {format_bytes(plan.upper_bytes)} "
          f"at {plan.confidence:.0%} confidence, limit {format_bytes(plan.limit_bytes)} "
          f"(pause at {plan.pause_fraction:.0%})")
    if plan.branch_order:
        print(f"branch order    {' then '.join(plan.branch_order)}")
    if plan.considered:
        print(f"strategy        {plan.strategy}  ({considered_text(plan)})")
    for stage in plan.stages:
        print(f"  stage         {stage['operator']}: block {format_shape(stage['block'])}, task bound "
              f"{format_bytes(stage['upper_peak_bytes'])}" + ("  (the largest)" if stage["binding"] else ""))
    if plan.max_block_voxels is not None:
        print(f"largest block   {largest_block_text(plan)}")
    print(f"threads/worker  {plan.threads_per_worker}")
    print(f"worker baseline {format_bytes(plan.footprint.baseline_bytes)} ({_BASELINE_SOURCES[plan.baseline_source]})")
    if plan.predicted_seconds is not None:
        print(f"time model      {time_model_text(plan)}")
    if plan.tied:
        print(f"tied with       {tied_text(plan)}")
    return 0


def _add_strategy_option(parser) -> None:
    from explorer.plan.recommend import STRATEGY_CHOICES

    parser.add_argument("--strategy", choices=STRATEGY_CHOICES, default="auto",
                        help="a pipeline's Dask form: fused (one task per block runs every stage), staged (one "
                             "map_overlap per stage) or auto (default: the faster predicted of those that fit)")


# -- explore run -----------------------------------------------------------
def _chunks_option(text: str):
    if text in ("model", "auto"):
        return text
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected model, auto or a shape like 120x120x120: {exc}") from None


def _cmd_run(argv: list[str]) -> int:
    parser = _Parser(prog="explore run",
                     description="Run an operator on a SEG-Y, Zarr or MDIO volume on Dask with memory-safe chunks, "
                                 "and learn from what the workers really used.")
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("input", help="a SEG-Y file with regular 3D geometry, a 3D Zarr array (v2 or v3: "
                                      "PATH.zarr, or GROUP.zarr:ARRAY) or an MDIO v1 survey (PATH.mdio[:VARIABLE])")
    parser.add_argument("--output", required=True,
                        help="PATH.zarr, PATH.sgy or PATH.mdio (a SEG-Y output keeps a SEG-Y input's headers and "
                             "geometry; an MDIO output is an MDIO input's dataset with the result added; a Zarr output "
                             "carries the input's attributes and coordinates); "
                             "a fan-out writes PATH.zarr/<branch>, or PATH-<branch>.sgy per branch")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output, if memory-explorer wrote it (never anything else)")
    parser.add_argument("--memory-limit", type=_size, default=None,
                        help="per worker, like 2GiB (default: this machine's memory / workers)")
    parser.add_argument("--workers", type=_positive_int, default=2, help="LocalCluster workers (default 2)")
    parser.add_argument("--threads", type=_positive_int, default=1, help="threads per worker (default 1)")
    _add_scheduler_options(parser, "the run's workers (default: a LocalCluster of --workers here)")
    parser.add_argument("--chunks", type=_chunks_option, default="model",
                        help="model (default: explore's recommendation), auto (Dask's) or AxBxC")
    parser.add_argument("--confidence", type=_confidence, default=0.99, help="in (0.5, 1) (0.99)")
    parser.add_argument("--refine", action=argparse.BooleanOptionalAction, default=True,
                        help="observe every task's memory and refine the model (default: on)")
    parser.add_argument("--trials", action=argparse.BooleanOptionalAction, default=True,
                        help="before the run, time the plan's block on the workers when they never ran it, "
                             "and the block of its compact neighbour, and plan again (default: on)")
    _add_strategy_option(parser)
    _add_store_options(parser, storage=True)
    parser.add_argument("--timings", action="store_true",
                        help="print where the wall time went (cluster, baseline, plan, trials, compute...; always "
                             "in --json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    from explorer.runner.daskrun import run

    state = {"last": 0.0}

    def progress(done, total):
        now = time.monotonic()
        if done == total or now - state["last"] >= 1.0:
            state["last"] = now
            print(f"  {done}/{total} tasks ({done / max(total, 1):.0%})", file=sys.stderr, flush=True)

    result = run(args.operator, args.input, args.output, memory_limit=args.memory_limit, workers=args.workers,
                 threads=args.threads, scheduler=args.scheduler, chunks=args.chunks,
                 runs_dir=args.runs_dir, storage=args.storage, confidence=args.confidence, refine=args.refine,
                 progress=progress, connect_timeout=args.connect_timeout, overwrite=args.overwrite,
                 strategy=args.strategy, trials=args.trials, check=False)
    if result.status == "error":  # bad input, no model, no plan fits: one line, like any CLI error
        if args.json:
            print(json.dumps(result.to_dict()))
        raise CLIError(f"explore run: {result.error}")
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    if args.timings and result.wall_seconds:
        print_timings(result.timings, result.wall_seconds)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print_run(result)
    if result.status != "ok":  # the failure is stderr's last line, whatever went to stdout
        print(f"explore run: {result.status}: {result.error}" + (f"; {result.advice}" if result.advice else ""),
              file=sys.stderr)
    return 0 if result.status == "ok" else EXIT_FAILURE


# -- explore report --------------------------------------------------------
def _cmd_report(argv: list[str]) -> int:
    parser = _Parser(prog="explore report",
                     description="Isolated profiles and production observations against the model.")
    parser.add_argument("operator", type=_operator_name)
    _add_store_options(parser, storage=True)
    parser.add_argument("--confidence", type=_confidence, default=0.99, help="in (0.5, 1) (0.99)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)

    from explorer.search.report import operator_report

    report = operator_report(args.operator, runs_dir=args.runs_dir, storage=args.storage,
                             confidence=args.confidence)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{'source':<11} {'shape':>15} {'status':<9} {'measured':>11} {'mean':>11} {args.confidence:>5.0%} bound "
          f"{'meas/mean':>9}")
    for row in report["rows"]:
        measured = format_bytes(row["peak_bytes"]) if row["peak_bytes"] is not None else "-"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        flag = "  OVER" if row["over_bound"] else ""
        print(f"{row['source']:<11} {format_shape(row['shape']):>15} {row['status']:<9} {measured:>11} "
              f"{format_bytes(row['mean_bytes']):>11} {format_bytes(row['upper_bytes']):>11} {ratio:>9}{flag}")
    for line in report["summary"]:
        print(line)
    print(f"report: {report['report_path']}")
    return 0


COMMANDS = {
    "operators": _cmd_operators,
    "profile": _cmd_profile,
    "chunks": _cmd_chunks,
    "run": _cmd_run,
    "report": _cmd_report,
    "calibrate": _cmd_calibrate,
    "explore": _cmd_explore,
}



def reserve_commands() -> None:
    """No operator may take a subcommand's name (``explore run`` must reach the command):
    the names are :data:`COMMANDS`' own, reserved in the operators' registry."""
    import operators

    operators.reserve_names(COMMANDS, "an `explore` subcommand")


USAGE = """usage: explore OPERATOR [options]                 learn an operator's peak memory (explore OPERATOR --help)
       explore operators                          list operators
       explore profile OPERATOR SHAPE             profile one shape in an isolated child
       explore chunks OPERATOR --shape S --memory-limit L   safe chunks for a volume
       explore run OPERATOR INPUT --output PATH            production run on Dask (SEG-Y, Zarr, MDIO)
       explore report OPERATOR                    profiles and production against the model
       explore calibrate OPERATOR                 in-worker probes of its model (a pipeline's composed one too)
"""


def _dispatch(argv: list[str]) -> int:
    from operators.plugins import load_plugins

    if argv and argv[0] == "--version":
        from explorer import __version__

        print(f"explore (memory-explorer) {__version__}")
        return 0
    reserve_commands()  # before any plugin registers an operator
    load_plugins()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else EXIT_USAGE
    command = COMMANDS.get(argv[0]) if argv[0] != "explore" else None
    if command is not None:
        return command(argv[1:])
    return _cmd_explore(argv)


def _interrupted() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one Ctrl-C is enough: the shutdown's cleanup must finish
    print("explore: interrupted; no partial output left behind, every finished measurement is in the store",
          file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    import warnings

    from explorer.core.environment import StaleModelWarning
    from explorer.core.interrupts import caused_by_interrupt, redeliver_swallowed_interrupts

    argv = sys.argv[1:] if argv is None else argv
    # Stale models and calibrations reach the user as the plans' and reports' own
    # "warning:" lines (with the fix), not as Python warnings.
    warnings.simplefilter("ignore", StaleModelWarning)
    signal.signal(signal.SIGTERM, _terminate)  # cleanup (partial outputs) runs as on Ctrl-C
    redeliver_swallowed_interrupts()
    try:
        return _dispatch(argv)
    except CLIError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted()
    except (ValueError, LookupError, OSError, RuntimeError) as exc:
        if caused_by_interrupt(exc):  # a Ctrl-C wrapped by an import (explorer.core.interrupts)
            return _interrupted()
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"explore: {str(message).splitlines()[0] if str(message) else type(exc).__name__}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # a bug of ours: still one line, the traceback on request
        if caused_by_interrupt(exc):
            return _interrupted()
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        print(f"explore: internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
              " (set EXPLORER_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_FAILURE


def entry() -> None:
    """The ``explore`` command: :func:`main`, then exit.  Objects are frozen out of the collector's
    reach first: the teardown's collections over torch and Dask took 0.6 s (exit handlers still run)."""
    import gc

    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
