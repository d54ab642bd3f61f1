"""Does the isolated profile measure what the user's process does?  glibc's allocator, pinned or not
(issue 33, item 6; ``explorer/measure/workersetup.py``, ``docs/workers.md``).

The profiling server pins glibc's mmap threshold at 128 KiB; a process that does not has the dynamic
threshold.  This script measures, with the project's own high-water mark
(``explorer.measure.highwater.PeakMeter``: ``VmHWM`` reset just before ``op.run(x)``, the input resident):

a. **fresh processes**: one interpreter per measurement, the input built, a warm-up run on a tiny
   block (as ``explorer.measure.forkserver._warm_up``), garbage collected and the free heap trimmed (as the
   profiling child does), then ``op.run(x)`` measured; three kinds: ``default`` (no malloc
   variable), ``env`` (``MALLOC_MMAP_THRESHOLD_=131072``), ``call``
   (``explorer.measure.workersetup.pin_mmap_threshold()`` first, what the worker plugin does); against the
   isolated profile (``explorer.measure.profiling.Profiler``, as ``explore profile OP SHAPE``).
b. **inside Dask workers** (one worker, one thread, warmed as ``explore run`` warms it:
   ``explorer.measure.inworker.warm_worker``, without the warm-up graph): a task builds the block and measures ``op.run``
   as ``explorer.measure.inworker.measured_run`` does (``VmHWM`` reset before ``run``, no trim); each block
   runs as ``--tasks`` tasks one after another on the same worker; several cluster kinds (``KINDS``).
c. **speed**: ``op.run`` seconds with and without the setting in fresh processes, and
   ``explorer.runner.daskrun.run`` (what ``explore run`` calls) on a SEG-Y with and without.
d. **MAPE** of an explored model's mean (``--model-runs DIR``, its ``unet3d`` model) against the
   part-a fresh-process peaks.

Every process is started with the malloc variables removed from its environment, so nothing
leaks from one kind to the next (a nanny sets ``MALLOC_TRIM_THRESHOLD_`` in the process that
starts a LocalCluster).  Raw numbers go to ``scripts/results/allocator.json``; the tables to
``scripts/results/allocator.md``.  A part not asked for is kept from the JSON.

    python scripts/allocator.py [--parts a,b,c,d] [--model-runs DIR] [--tasks 2] [--repeat 2]

Part d needs a runs directory with an explored unet3d model, e.g. made by
``explore unet3d --probes 0 --runs-dir /tmp/unet-runs`` (30 profiles, a few minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
MIB = 2**20

#: Environment variables that set glibc's malloc: any of them turns the dynamic threshold off.
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                    "GLIBC_TUNABLES")
PINNED_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}

#: Hidden unet3d blocks (1.2-8.6 M voxels, padded and unpadded dims): the two of the issue, blocks
#: whose short axis is a survey's whole (short) axis, and 200x200x216, the block of the plan a 4 GiB
#: one-thread worker gets on 800x800x600 (chunks 104x104x120; a split axis's chunk is at least
#: 2 x 48 + 1 rounded up to 104, so no smaller worker plans a split cube).
UNET_SHAPES = [(200, 96, 64), (150, 90, 110), (200, 200, 96), (240, 176, 130), (208, 152, 200), (200, 200, 216)]
CONTROLS = {"gst3d": [(120, 120, 120), (160, 200, 140), (200, 200, 200)],
            "envelope": [(160, 160, 400), (240, 200, 500)]}
FRESH_KINDS = ("default", "env", "call")
#: Part b's cluster kinds: (label, how it is started).
KINDS = {
    "LC explore-run": "LocalCluster as `explore run` starts it (default config) + prepare_workers",
    "LC default": "LocalCluster, default config (its nanny sets MALLOC_TRIM_THRESHOLD_=65536), nothing else",
    "LC no-trim": "LocalCluster, pre-spawn-environ MALLOC_TRIM_THRESHOLD_ unset: glibc's dynamic threshold",
    "LC no-trim + plugin": "the same + prepare_workers (the plugin alone)",
    "LC no-trim + pre-spawn": "the same + pre-spawn-environ MALLOC_MMAP_THRESHOLD_=131072 (no plugin)",
    "dw --preload": "`dask worker --preload explorer.measure.workersetup` (with its nanny)",
    "dw env": "`MALLOC_MMAP_THRESHOLD_=131072 dask worker` (with its nanny)",
    "dw --no-nanny": "`dask worker --no-nanny`: glibc's dynamic threshold",
    "dw --no-nanny --preload": "`dask worker --no-nanny --preload explorer.measure.workersetup`",
}
SPEED = {"gst3d": (160, 160, 160), "unet3d": (200, 96, 64), "envelope": (240, 200, 500)}
RUN_SHAPE = (240, 240, 240)
RUN_CHUNKS = (120, 120, 240)
RUN_LIMIT = "2GiB"


def clean_env(**extra) -> dict:
    return {**{k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES}, **extra}


def scrub_environ() -> None:
    """Remove the malloc variables from this process's environment (a nanny started here set them)."""
    for name in MALLOC_VARIABLES:
        os.environ.pop(name, None)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


#: What code ran (``--code``; default: this checkout's commit).
CODE = None


def commit() -> str:
    if CODE:
        return CODE
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "explorer", "operators", "scripts/allocator.py"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return f"code of commit {head.strip()}" + (" with uncommitted changes in explorer/ or operators/" if dirty else "")


def shape_text(shape) -> str:
    return "x".join(map(str, shape))


def parse(text: str) -> tuple:
    return tuple(int(n) for n in text.split("x"))


# --------------------------------------------------------------------------- children


def child_fresh(kind: str, operator: str, shape: tuple) -> dict:
    """Part a, in a fresh interpreter: the peak of ``op.run(x)`` as the profiling child measures it."""
    if kind == "call":
        from explorer.measure.workersetup import pin_mmap_threshold

        assert pin_mmap_threshold()
    import gc

    import numpy as np

    import operators
    from explorer.measure.highwater import PeakMeter, release_free_heap

    op = operators.get(operator)
    x = operators.synthetic_volume(shape, seed=0)
    tiny = tuple(min(n, 2 * h + 8) for n, h in zip(x.shape, op.halo))
    op.run(np.ascontiguousarray(x[tuple(slice(0, n) for n in tiny)]))
    gc.collect()
    gc.disable()
    release_free_heap()
    started = time.perf_counter()
    with PeakMeter() as meter:
        op.run(x)
    return {"peak_bytes": meter.peak_bytes, "seconds": time.perf_counter() - started}


def child_speed(kind: str, operator: str, shape: tuple, n: int) -> dict:
    """Part c: seconds of ``n`` runs of ``op.run(x)`` after a tiny warm-up, in one process."""
    import numpy as np

    import operators

    op = operators.get(operator)
    x = operators.synthetic_volume(shape, seed=0)
    tiny = tuple(min(n, 2 * h + 8) for n, h in zip(x.shape, op.halo))
    op.run(np.ascontiguousarray(x[tuple(slice(0, n) for n in tiny)]))
    seconds, cpu, faults = [], [], []
    for _ in range(n):
        started, cpu_started = time.perf_counter(), time.process_time()
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        op.run(x)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
    return {"seconds": seconds, "cpu_seconds": cpu, "minor_faults": faults}


def child_run(kind: str, source: str, output: str) -> dict:
    """Part c: ``explorer.runner.daskrun.run`` (``explore run``) of gst3d; ``dynamic``: the workers'
    malloc variable unset and the plugin not registered (this benchmark's patch, not an option)."""
    import dask

    import explorer.measure.workersetup
    from explorer.runner.daskrun import run

    if kind == "dynamic":
        dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
        explorer.measure.workersetup.prepare_workers = lambda client, threshold=None: {}
    r = run("gst3d", source, output, chunks=RUN_CHUNKS, memory_limit=RUN_LIMIT, workers=2, threads=1,
            refine=False, trials=False, overwrite=True, check=False)
    # The worker processes are this process's children, joined when the cluster closed.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"status": r.status, "error": r.error, "seconds": r.seconds, "wall_seconds": r.wall_seconds,
            "worker_hwm_bytes": r.worker_hwm_bytes, "worker_baseline_bytes": r.worker_baseline_bytes,
            "workers_cpu_seconds": children.ru_utime + children.ru_stime, "workers_minor_faults": children.ru_minflt}


def spawn(args: list[str], env: dict, timeout: float = 900) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh_env(kind: str) -> dict:
    return clean_env(**PINNED_ENV) if kind == "env" else clean_env()


# --------------------------------------------------------------------------- part a


def part_a(repeat: int) -> dict:
    from explorer.measure.profiling import Profiler

    scrub_environ()
    out = {"load_before": load(), "commit": commit(), "repeat": repeat, "rows": []}
    plan = [("unet3d", s) for s in UNET_SHAPES] + [(op, s) for op, shapes in CONTROLS.items() for s in shapes]
    with Profiler() as profiler:
        for operator, shape in plan:
            row = {"operator": operator, "shape": list(shape)}
            m = profiler.profile(operator, shape, repeat=2)
            assert m.status == "ok", m.error
            row["profile"] = [r["peak_bytes"] for r in m.repeats]
            for _ in range(repeat):  # kinds interleaved, so that load drifts hit them alike
                for kind in FRESH_KINDS:
                    reply = spawn(["fresh", kind, operator, shape_text(shape)], fresh_env(kind))
                    row.setdefault(kind, []).append(reply["peak_bytes"])
            out["rows"].append(row)
            print(operator, shape_text(shape), {k: [round(v / MIB, 1) for v in row[k]]
                                                  for k in ("profile",) + FRESH_KINDS}, flush=True)
    out["load_after"] = load()
    return out


# --------------------------------------------------------------------------- part b


def worker_task(operator: str, shape: tuple) -> dict:
    """In a worker: build the block, then ``op.run`` measured as ``measured_run`` measures it."""
    import gc
    import os

    import operators
    from explorer.measure.highwater import PeakMeter

    op = operators.get(operator)
    x = operators.synthetic_volume(tuple(shape), seed=0)
    gc.collect()
    with PeakMeter() as meter:
        op.run(x)
    return {"peak_bytes": meter.peak_bytes, "pid": os.getpid(),
            "malloc_env": {k: os.environ[k] for k in MALLOC_VARIABLES if k in os.environ}}


@contextlib.contextmanager
def local_cluster_of_kind(kind: str):

    import dask
    from distributed import Client
    from explorer.measure.local_cluster import local_cluster

    scrub_environ()
    config = {}
    if "no-trim" in kind:
        config["distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"] = None
    if "pre-spawn" in kind:
        config["distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"] = 131072
    with dask.config.set(config), \
            local_cluster(1, memory_limit="8GiB", preload=["explorer.measure.inworker"]) as cluster, \
            Client(cluster) as client:
        if "plugin" in kind or kind == "LC explore-run":
            from explorer.measure.workersetup import prepare_workers

            assert all(prepare_workers(client).values())
        yield client
    scrub_environ()


@contextlib.contextmanager
def dask_worker_cluster(kind: str, timeout: float = 60.0):
    """``dask scheduler`` + one ``dask worker`` process, as a user starts them."""
    from distributed import Client

    from harness.cluster import start_scheduler, stop_processes

    folder = Path(tempfile.mkdtemp(prefix="allocator-cluster-"))
    log = open(folder / "cluster.log", "w")
    scheduler, workers = None, []
    worker_args = ["--nthreads", "1", "--memory-limit", "8GiB", "--no-dashboard", "--local-directory", str(folder)]
    env = clean_env(**PINNED_ENV) if kind == "dw env" else clean_env()
    if "--no-nanny" in kind:
        worker_args.append("--no-nanny")
    if "--preload" in kind:
        worker_args += ["--preload", "explorer.measure.workersetup"]
    try:
        scheduler, address = start_scheduler(folder, log, clean_env(), timeout)
        workers.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address, *worker_args], stdout=log,
                                        stderr=subprocess.STDOUT, env=env))
        with Client(address, timeout="20s") as client:
            client.wait_for_workers(1, timeout=timeout)
            yield client
    finally:
        stop_processes(workers, scheduler)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def part_b(tasks: int) -> dict:
    from explorer.measure.inworker import warm_worker
    from explorer.measure.workersetup import mmap_threshold_pinned

    out = {"load_before": load(), "commit": commit(), "tasks": tasks, "kinds": {}}
    plan = [("unet3d", s) for s in UNET_SHAPES] + [("gst3d", s) for s in CONTROLS["gst3d"]]
    for kind in KINDS:
        started = time.perf_counter()
        cluster = local_cluster_of_kind(kind) if kind.startswith("LC") else dask_worker_cluster(kind)
        record = {"rows": [], "baseline_bytes": {}}
        with cluster as client:
            # Read the behaviour before any task: the probe itself would raise a dynamic threshold.
            record["pinned_at_start"] = list(client.run(mmap_threshold_pinned).values())[0]
            for operator in ("unet3d", "gst3d"):
                # explore run's warm-up without its warm-up graph, which for unet3d is 8 tasks of 145^3
                # (over its 60 s on one worker here): the operator loaded, run on 8^3, collected.
                (reply,) = client.run(warm_worker, operator).values()
                record["baseline_bytes"][operator] = reply["rss_bytes"]
            for operator, shape in plan:
                peaks = []
                for _ in range(tasks):
                    reply = client.submit(worker_task, operator, shape, pure=False).result()
                    peaks.append(reply["peak_bytes"])
                record["malloc_env"] = reply["malloc_env"]
                record["rows"].append({"operator": operator, "shape": list(shape), "peaks": peaks})
        record["seconds"] = time.perf_counter() - started
        out["kinds"][kind] = record
        print(kind, record["pinned_at_start"], record["malloc_env"],
              [(r["shape"], [round(p / MIB, 1) for p in r["peaks"]]) for r in record["rows"]], flush=True)
    out["load_after"] = load()
    return out


# --------------------------------------------------------------------------- part c


def part_c(rounds: int, runs_per_process: int, run_repeats: int) -> dict:
    scrub_environ()
    out = {"load_before": load(), "commit": commit(), "speed": {}, "run": {}}
    for operator, shape in SPEED.items():
        processes = {"default": [], "env": []}
        for index in range(rounds):
            order = ("default", "env") if index % 2 == 0 else ("env", "default")
            for kind in order:
                processes[kind].append(spawn(["speed", kind, operator, shape_text(shape), str(runs_per_process)],
                                             fresh_env(kind)))
        out["speed"][operator] = {"shape": list(shape), "processes": processes}
        print(operator, {k: [round(statistics.median(p["cpu_seconds"][1:]), 3) for p in v]
                         for k, v in processes.items()}, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="allocator-run-"))
    try:
        import operators

        source = folder / "in.sgy"
        operators.write_segy(source, operators.synthetic_volume(RUN_SHAPE, seed=0))
        runs = {"pinned": [], "dynamic": []}
        for index in range(run_repeats):
            order = ("pinned", "dynamic") if index % 2 == 0 else ("dynamic", "pinned")
            for kind in order:
                reply = spawn(["run", kind, str(source), str(folder / f"out-{kind}.zarr")], clean_env())
                assert reply["status"] == "ok", reply
                runs[kind].append(reply)
                print("run", kind, round(reply["seconds"], 2), round(reply["wall_seconds"], 2), flush=True)
        out["run"] = runs
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out["load_after"] = load()
    return out


# --------------------------------------------------------------------------- part d


def part_d(model_runs: str, a: dict) -> dict:
    from explorer.model.load import load_model

    model = load_model("unet3d", runs_dir=model_runs)
    rows = []
    for row in a["rows"]:
        if row["operator"] != "unet3d":
            continue
        mean, upper = model.predict(tuple(row["shape"]), 0.99)
        rows.append({"shape": row["shape"], "mean": mean, "upper": upper,
                     **{kind: statistics.median(row[kind]) for kind in ("profile",) + FRESH_KINDS},
                     **{f"{kind}_max": max(row[kind]) for kind in ("profile",) + FRESH_KINDS}})
    info = {k: model.info.get(k) for k in ("converged", "stopped_because", "n_profiles") if k in model.info}
    return {"model_runs": str(model_runs), "n_train": int(len(model.train_shapes)), "info": info, "rows": rows,
            "load": load()}


# --------------------------------------------------------------------------- report


def median_range(values, scale=1.0, digits=1) -> str:
    values = [v / scale for v in values]
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def _reading(data: dict) -> list[str]:
    """A few figures read off the tables below (computed, so a rerun keeps them true)."""
    out = []
    a, b, d = data.get("a"), data.get("b"), data.get("d")
    if a:
        unet = [r for r in a["rows"] if r["operator"] == "unet3d"]
        worst = max(statistics.median(r["default"]) / statistics.median(r["profile"]) for r in unet)
        pinned = [statistics.median(r[k]) / statistics.median(r["profile"]) for r in unet for k in ("env", "call")]
        others = [statistics.median(r[k]) / statistics.median(r["profile"]) for r in a["rows"]
                  if r["operator"] != "unet3d" for k in FRESH_KINDS]
        out.append(f"- Fresh processes: unet3d peaks up to {worst - 1:.0%} above its isolated profile in a default "
                   f"process, and within {max(abs(x - 1) for x in pinned):.2%} of it when pinned by either way; "
                   f"gst3d and envelope within {max(abs(x - 1) for x in others):.1%} in every kind.")
    if b:
        profiles = {(r["operator"], tuple(r["shape"])): statistics.median(r["profile"]) for r in (a or {}).get("rows", [])}
        groups = {True: [], False: []}
        for record in b["kinds"].values():
            groups[bool(record["pinned_at_start"])].append(record)

        def ratios(records, operator):
            return [p / profiles[(operator, tuple(r["shape"]))] for rec in records for r in rec["rows"]
                    if r["operator"] == operator and (operator, tuple(r["shape"])) in profiles for p in r["peaks"]]

        for pinned, records in groups.items():
            if not records or not profiles:
                continue
            u, g = ratios(records, "unet3d"), ratios(records, "gst3d")
            base = [rec["baseline_bytes"]["unet3d"] / MIB for rec in records]
            out.append(f"- Workers {'pinned' if pinned else 'with the dynamic threshold'} ({len(records)} kinds): "
                       f"unet3d tasks at {min(u):.3f}-{max(u):.3f} of the isolated profile, gst3d at "
                       f"{min(g):.3f}-{max(g):.3f}; idle warmed baseline {min(base):.0f}-{max(base):.0f} MiB.")
    if d:
        errors = {k: statistics.mean(abs(r["mean"] / r[k] - 1) for r in d["rows"]) for k in ("env", "default")}
        covered = sum(r["upper"] >= r["env_max"] for r in d["rows"])
        covered_default = sum(r["upper"] >= r["default_max"] for r in d["rows"])
        out.append(f"- The explored unet3d model's mean: MAPE {errors['env']:.2%} against pinned fresh processes "
                   f"(its 99% bound above {covered}/{len(d['rows'])}), {errors['default']:.2%} against default ones "
                   f"(bound above {covered_default}/{len(d['rows'])}).")
    for part in ("a", "b", "c"):
        if data.get(part, {}).get("alongside"):
            out.append(f"- Alongside part {part}: {data[part]['alongside']}")
    return out + ([""] if out else [])


def report(data: dict) -> str:
    from harness.machine import machine_line

    lines = ["# The allocator: isolated profiles against the processes that run the work",
             "",
             "The profiling server pins glibc's mmap threshold at 128 KiB; `explorer/measure/workersetup.py` gives the "
             "workers the same setting (`docs/workers.md`).  Peaks are `peak_bytes` (`VmHWM` reset just before "
             "`op.run(x)`, the input resident), in MiB.  glibc " + data.get("glibc", "?") + "; last run "
             + data.get("date", "") + ".  Made by:",
             ""]
    lines += [f"- `{c}`" for c in dict.fromkeys(data.get("commands", {}).values())] + [""]
    lines += _reading(data)
    a = data.get("a")
    if a:
        lines += [f"## a. Fresh processes against the isolated profile ({a['commit']})", "",
                  f"One fresh interpreter per figure, {a['repeat']} per kind (median [range]); the isolated profile's "
                  "two runs (median [range], `explorer.measure.profiling.Profiler`, as `explore profile`). `default`: no "
                  "malloc variable; `env`: `MALLOC_MMAP_THRESHOLD_=131072`; `call`: "
                  "`explorer.measure.workersetup.pin_mmap_threshold()` at the start (what the plugin does). Ratio: "
                  "median over the profile's median.",
                  "",
                  "| operator | block | isolated profile | default | env | call | default / profile | "
                  "env / profile | call / profile |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in a["rows"]:
            prof = statistics.median(row["profile"])
            cells = [median_range(row[k], MIB) for k in ("profile",) + FRESH_KINDS]
            ratios = [f"{statistics.median(row[k]) / prof:.3f}" for k in FRESH_KINDS]
            lines.append(f"| {row['operator']} | {shape_text(row['shape'])} | " + " | ".join(cells + ratios) + " |")
        lines += ["", f"Load average (1, 5, 15 min) before {a['load_before']}, after {a['load_after']}.", ""]
    b = data.get("b")
    if b:
        lines += [f"## b. Inside Dask workers ({b['commit']})", "",
                  f"One worker, one thread, 8 GiB, warmed as `explore run` warms it (`warm_worker`; its idle resident set is the baseline below); each block runs as {b['tasks']} "
                  "tasks in a row on the same worker, the blocks in the table's order (each task builds its block; peak "
                  "of `op.run` as `explorer.measure.inworker.measured_run` measures it, no trim); a cell is the tasks' "
                  "peaks in their order (the largest over the isolated profile's median, part a). `pinned`: the worker's threshold behaves as pinned "
                  "before any task (`explorer.measure.workersetup.mmap_threshold_pinned`).",
                  ""]
        for kind, text in KINDS.items():
            record = b["kinds"].get(kind)
            if record:
                env = ", ".join(f"{k}={v}" for k, v in record["malloc_env"].items()) or "none"
                lines.append(f"- **{kind}**: {text}. pinned: {record['pinned_at_start']}; malloc variables in "
                             f"the worker: {env}; idle warmed baseline unet3d "
                             f"{record['baseline_bytes']['unet3d'] / MIB:.0f} MiB, gst3d "
                             f"{record['baseline_bytes']['gst3d'] / MIB:.0f} MiB.")
        kinds = [k for k in KINDS if k in b["kinds"]]
        profiles = {(r["operator"], tuple(r["shape"])): statistics.median(r["profile"])
                    for r in (a or {}).get("rows", [])}
        lines += ["", "| operator | block | isolated profile | " + " | ".join(kinds) + " |",
                  "|---|---|---|" + "---|" * len(kinds)]
        first = b["kinds"][kinds[0]]["rows"]
        for index, row in enumerate(first):
            key = (row["operator"], tuple(row["shape"]))
            prof = profiles.get(key)
            cells = []
            for kind in kinds:
                peaks = b["kinds"][kind]["rows"][index]["peaks"]
                cells.append(", ".join(f"{p / MIB:.1f}" for p in peaks) +
                             (f" ({max(peaks) / prof:.3f})" if prof else ""))
            isolated = f"{prof / MIB:.1f}" if prof else "-"
            lines.append(f"| {row['operator']} | {shape_text(row['shape'])} | {isolated} | " + " | ".join(cells) + " |")
        lines += ["", f"Load average before {b['load_before']}, after {b['load_after']}.", ""]
    c = data.get("c")
    if c:
        lines += [f"## c. Speed ({c['commit']})", "",
                  "`op.run(x)` in fresh processes, `default` (glibc's dynamic threshold) and `pinned` "
                  "(`MALLOC_MMAP_THRESHOLD_=131072`), the processes of the two kinds alternating. Each process: a "
                  "tiny warm-up, then several runs on the same block; the first run apart from the later ones (a "
                  "worker's steady state: the dynamic threshold has risen and the heap holds freed memory). Wall "
                  "seconds; the process's CPU seconds (user + system: zeroing fresh pages counts, waiting for a "
                  "core does not); minor page faults per run (first touches of fresh pages; deterministic where "
                  "seconds are not). Median [range]:", "",
                  "| operator | block | allocator | processes x runs | wall s, first | wall s, later | CPU s, first | "
                  "CPU s, later | later CPU, pinned / default | minor faults, first | minor faults, later |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for operator, row in c["speed"].items():
            medians = {}
            for kind, procs in row["processes"].items():
                first = {key: [p[key][0] for p in procs] for key in ("seconds", "cpu_seconds", "minor_faults")}
                later = {key: [v for p in procs for v in p[key][1:]] for key in first}
                medians[kind] = statistics.median(later["cpu_seconds"])
                ratio = f"{medians['env'] / medians['default']:.3f}" if kind == "env" and "default" in medians else ""
                label = "pinned" if kind == "env" else "default"
                lines.append(
                    f"| {operator} | {shape_text(row['shape'])} | {label} | {len(procs)} x {len(procs[0]['seconds'])} | "
                    f"{median_range(first['seconds'], 1, 3)} | {median_range(later['seconds'], 1, 3)} | "
                    f"{median_range(first['cpu_seconds'], 1, 3)} | {median_range(later['cpu_seconds'], 1, 3)} | "
                    f"{ratio} | {median_range(first['minor_faults'], 1, 0)} | "
                    f"{median_range(later['minor_faults'], 1, 0)} |")
        if c.get("run"):
            lines += ["", f"`explorer.runner.daskrun.run` (what `explore run` calls) of gst3d on a {shape_text(RUN_SHAPE)} "
                      f"SEG-Y, chunks {shape_text(RUN_CHUNKS)}, 2 workers x 1 thread x {RUN_LIMIT}, no refinement, "
                      "no trials, each in a fresh process, the kinds alternating; `pinned`: as shipped (the "
                      "plugin); `dynamic`: the nanny's `MALLOC_TRIM_THRESHOLD_` unset and the plugin not "
                      "registered (a patch in this script). Median [range]:", "",
                      "| workers | runs | compute s (`seconds`) | wall s (`wall_seconds`) | workers' CPU s (whole life) | "
                      "workers' minor faults | largest worker high-water MiB |",
                      "|---|---|---|---|---|---|---|"]
            for kind, runs in c["run"].items():
                cpu = [r["workers_cpu_seconds"] for r in runs if "workers_cpu_seconds" in r]
                lines.append(f"| {kind} | {len(runs)} | {median_range([r['seconds'] for r in runs], 1, 2)} | "
                             f"{median_range([r['wall_seconds'] for r in runs], 1, 2)} | "
                             f"{median_range(cpu, 1, 2) if cpu else '-'} | "
                             f"{median_range([r['workers_minor_faults'] for r in runs], 1, 0) if cpu else '-'} | "
                             f"{median_range([max(r['worker_hwm_bytes']) for r in runs], MIB, 0)} |")
        lines += ["", f"Load average before {c['load_before']}, after {c['load_after']}.", ""]
    d = data.get("d")
    if d:
        lines += ["## d. The explored unet3d model against fresh processes", "",
                  f"Model: `{d['model_runs']}` ({d['n_train']} profiles; {d.get('model_note', '')}). Its 99% bound "
                  "and mean at the part-a blocks; error = mean / peak - 1 against each kind's median.", "",
                  "| block | model mean | 99% upper | env peak | env max | error (env) | call peak | error (call) | "
                  "default peak | error (default) | upper >= env max | upper >= default max |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        errors = {k: [] for k in FRESH_KINDS + ("profile",)}
        for row in d["rows"]:
            for k in errors:
                errors[k].append(abs(row["mean"] / row[k] - 1))
            lines.append(f"| {shape_text(row['shape'])} | {row['mean'] / MIB:.1f} | {row['upper'] / MIB:.1f} | "
                         f"{row['env'] / MIB:.1f} | {row['env_max'] / MIB:.1f} | {row['mean'] / row['env'] - 1:+.1%} | "
                         f"{row['call'] / MIB:.1f} | {row['mean'] / row['call'] - 1:+.1%} | {row['default'] / MIB:.1f} | "
                         f"{row['mean'] / row['default'] - 1:+.1%} | {'yes' if row['upper'] >= row['env_max'] else 'NO'} | "
                         f"{'yes' if row['upper'] >= row['default_max'] else 'NO'} |")
        lines += ["", "MAPE of the model's mean: " + "; ".join(
            f"{k} {100 * statistics.mean(v):.2f}% (max {100 * max(v):.1f}%)" for k, v in errors.items()) + ".", ""]
    lines += [f"Machine: {machine_line()}", ""]
    return "\n".join(lines)


def glibc_version() -> str:
    import ctypes

    libc = ctypes.CDLL(None)
    try:
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        return libc.gnu_get_libc_version().decode()
    except AttributeError:
        return "not glibc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=None,
                        help="which to measure: a,b,c,d (default a,b,c, and d with --model-runs; others kept from the JSON)")
    parser.add_argument("--repeat", type=int, default=2, help="fresh processes per kind and block (part a)")
    parser.add_argument("--tasks", type=int, default=2, help="tasks per block and cluster kind (part b)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per kind (part c speed)")
    parser.add_argument("--runs-per-process", type=int, default=4, help="timed runs per process (part c speed)")
    parser.add_argument("--run-repeats", type=int, default=5, help="explore-run repeats per kind (part c)")
    parser.add_argument("--kinds", default=None, help="part b's cluster kinds, comma-separated (default all)")
    parser.add_argument("--model-runs", default=None, help="runs directory holding an explored unet3d model (part d)")
    parser.add_argument("--model-note", default="", help="how the model was explored (printed with part d)")
    parser.add_argument("--code", default=None, help="what code ran, for the report (default: this checkout's commit)")
    parser.add_argument("--json", default=str(RESULTS / "allocator.json"))
    parser.add_argument("--output", default=str(RESULTS / "allocator.md"))
    args = parser.parse_args()
    parts = set(args.parts.split(",")) if args.parts else {"a", "b", "c"} | ({"d"} if args.model_runs else set())
    if not parts <= {"a", "b", "c", "d"}:
        parser.error(f"--parts: a comma-separated subset of a,b,c,d, got {args.parts!r}")
    if "d" in parts and not args.model_runs:
        parser.error("--parts d needs --model-runs DIR (a runs directory with an explored unet3d model)")
    if args.kinds:
        unknown = set(args.kinds.split(",")) - set(KINDS)
        if unknown:
            parser.error(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(KINDS)}")
        for kind in list(KINDS):
            if kind not in args.kinds.split(","):
                del KINDS[kind]
    global CODE
    CODE = args.code
    path = Path(args.json)
    data = json.loads(path.read_text()) if path.exists() else {}
    command = shlex.join(["python", "scripts/allocator.py", *sys.argv[1:]])
    for part in sorted(parts):
        data.setdefault("commands", {})[part] = command.strip()
    data["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data["glibc"] = glibc_version()
    if "a" in parts:
        data["a"] = part_a(args.repeat)
    if "b" in parts:
        b = part_b(args.tasks)
        if args.kinds and data.get("b"):  # a subset of kinds replaces only those
            data["b"]["kinds"].update(b["kinds"])
            b["kinds"] = data["b"]["kinds"]
        data["b"] = b
    if "c" in parts:
        data["c"] = part_c(args.rounds, args.runs_per_process, args.run_repeats)
    if "d" in parts:
        if not data.get("a"):
            parser.error("--parts d needs part a's fresh-process peaks (run --parts a first)")
        data["d"] = {**part_d(args.model_runs, data["a"]), "model_note": args.model_note}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    Path(args.output).write_text(report(data))
    print(f"wrote {args.output} and {path}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        what, kind, *rest = sys.argv[2:]
        if what == "fresh":
            reply = child_fresh(kind, rest[0], parse(rest[1]))
        elif what == "speed":
            reply = child_speed(kind, rest[0], parse(rest[1]), int(rest[2]))
        else:
            reply = child_run(kind, rest[0], rest[1])
        print(json.dumps(reply))
    else:
        main()
