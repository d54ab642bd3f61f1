"""Trace real Dask runs of an operator or pipeline: where the workers' seconds and memory go.

For each ``STRATEGY:CHUNKS`` asked, on a synthetic SEG-Y volume (``--shape``) and a real
``LocalCluster`` (``--workers`` x 1 thread, ``--memory-limit`` each), ``--repeats`` runs of
``explorer.runner.daskrun.run`` (``refine=False``, no re-planning) with:

* the **task stream** (``distributed.get_task_stream``): per worker the seconds its thread
  computed (busy), per task prefix the count and compute seconds, and the transfers;
* a **memory sampler** (``client.run`` every ~30 ms): each worker's resident set and the task
  data it holds (``WorkerState.nbytes``) by key prefix, kept at the sample of its largest
  resident set;
* the run's own figures: seconds, each worker's kernel high-water mark, the baseline measured
  before it, and each worker's resident set once it is over (idle);
* the plan ``recommend_chunks`` would promise for these chunks and strategy: its upper
  footprint (``explorer.plan.recommend.plan_for_chunks``) and predicted seconds.

This is how the staged footprint's per-stage queues and the staged makespan's unit
balancing were found (README, "Pipelines of operators"); it needs the models (and their
calibrations) in ``--cache``, e.g. ``scripts/bench_pipeline_runs.py``'s.

    python scripts/run_trace.py SPEC STRATEGY:CHUNKS[,STRATEGY:CHUNKS...] --cache DIR
        [--memory-limit 1GiB] [--shape 256x256x384] [--workers 2] [--repeats 3]

Prints Markdown; progress to stderr.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import operators
from explorer.core.units import format_bytes, format_shape, parse_shape, parse_size
from harness.machine import machine_line


def held_data(dask_worker):
    """A worker's resident set, its managed bytes and the held task data by key prefix (runs on the worker)."""
    import psutil

    state = dask_worker.state
    count, nbytes = collections.Counter(), collections.Counter()
    for key, ts in state.tasks.items():
        if ts.state == "memory":
            name = str(key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0][:40]
            count[name] += 1
            nbytes[name] += ts.nbytes or 0
    return psutil.Process().memory_info().rss, int(state.nbytes), dict(nbytes), dict(count), pinned_bytes(dask_worker)


def pinned_bytes(dask_worker) -> int:
    """The memory the worker's held arrays really keep alive: each distinct buffer once.

    Dask counts a view (``map_overlap``'s halo slices are ``getitem`` views) by its own
    ``nbytes``; the whole base it slices stays resident until the last view is released.
    """
    import numpy as np

    roots = {}
    data = getattr(dask_worker.data, "fast", dask_worker.data)  # in memory only: never unspill
    for value in list(data.values()):
        if not isinstance(value, np.ndarray):
            continue
        root = value
        while isinstance(root.base, np.ndarray):
            root = root.base
        roots[id(root)] = root.nbytes if root.base is None else value.nbytes
    return int(sum(roots.values()))


def prefix(key) -> str:
    return str(key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0][:40]


def trace(spec, strategy, chunks, source, work, args, limit):
    from distributed import get_task_stream

    from explorer.runner.daskrun import run

    samples, stop = [], threading.Event()

    def sampler():
        while not stop.is_set():
            try:
                samples.append(args.client.run(held_data))
            except Exception:  # a worker restarting: keep sampling
                pass
            time.sleep(0.03)

    out = work / f"out-{time.monotonic_ns()}.zarr"
    thread = threading.Thread(target=sampler, daemon=True)
    with get_task_stream(args.client) as stream:
        thread.start()
        result = run(spec, source, out, scheduler=args.cluster.scheduler_address, chunks=chunks, strategy=strategy,
                     runs_dir=args.cache, refine=False, replan=False, check=False)
        stop.set()
        thread.join()
    shutil.rmtree(out, ignore_errors=True)
    busy, compute, transfer = collections.defaultdict(float), collections.defaultdict(lambda: [0, 0.0]), 0.0
    for task in stream.data:
        for step in task["startstops"]:
            seconds = step["stop"] - step["start"]
            if step["action"] == "compute":
                busy[task["worker"]] += seconds
                compute[prefix(task["key"])][0] += 1
                compute[prefix(task["key"])][1] += seconds
            elif step["action"] == "transfer":
                transfer += seconds
    largest = {}
    for sample in samples:
        for worker, (rss, managed, nbytes, count, pinned) in sample.items():
            if rss > largest.get(worker, (0,))[0]:
                largest[worker] = (rss, managed, nbytes, count, pinned)
    return result, dict(busy), dict(compute), transfer, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("configs", help="STRATEGY:CHUNKS[,STRATEGY:CHUNKS...], e.g. staged:64x64x384")
    parser.add_argument("--cache", required=True, type=Path, help="runs directory with the models")
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--shape", default="256x256x384")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    limit = parse_size(args.memory_limit)
    shape = parse_shape(args.shape)
    configs = [(c.split(":")[0], parse_shape(c.split(":")[1])) for c in args.configs.split(",")]
    from distributed import Client
    from explorer.measure.local_cluster import local_cluster

    from explorer.plan.recommend import plan_for_chunks

    work = Path(tempfile.mkdtemp(prefix="run-trace-"))
    source = work / "in.sgy"
    operators.write_segy(source, operators.synthetic_volume(shape, seed=args.seed))
    print(f"## `{args.spec}` on {args.shape}, {args.workers} workers x 1 thread, {format_bytes(limit)} each\n")
    try:
        with local_cluster(args.workers, memory_limit=limit) as cluster, Client(cluster) as client:
            args.cluster, args.client = cluster, client
            for strategy, chunks in configs:
                print(f"### {strategy} {format_shape(chunks)}\n")
                rows = []
                for repeat in range(args.repeats):
                    result, busy, compute, transfer, largest = trace(args.spec, strategy, chunks, source, work, args,
                                                                     limit)
                    print(f"[{strategy} {format_shape(chunks)} run {repeat + 1}] {result.status} "
                          f"{result.seconds or 0:.2f} s", file=sys.stderr, flush=True)
                    if repeat == 0 and result.worker_baseline_bytes:
                        plan = plan_for_chunks(args.spec, shape, chunks, limit, strategy=strategy,
                                               workers=args.workers, runs_dir=args.cache,
                                               baseline_bytes=result.worker_baseline_bytes)
                        print(f"The plan for these chunks (`explorer.plan.recommend.plan_for_chunks`, the run's measured "
                              f"baseline {format_bytes(result.worker_baseline_bytes)}): upper footprint "
                              f"{format_bytes(plan.upper_bytes)}, mean {format_bytes(plan.predicted_bytes)}, "
                              f"predicted {plan.predicted_seconds:.2f} s.\n")
                        print("| run | status | seconds | busy per worker (s) | transfers (s) | baseline measured "
                              "before | HWM per worker | idle RSS after | at the largest sampled RSS: RSS, held data "
                              "(largest holders) |")
                        print("|---|---|---:|---|---:|---|---|---|---|")
                    held = "; ".join(
                        f"{format_bytes(rss)}, {format_bytes(managed)} held, {format_bytes(pinned)} pinned ("
                        + ", ".join(f"{count[k]} {k} {format_bytes(nbytes[k])}"
                                    for k in sorted(nbytes, key=lambda k: -nbytes[k])[:3]) + ")"
                        for rss, managed, nbytes, count, pinned in largest.values())
                    rows.append(result)
                    from explorer.measure.inworker import resident_bytes

                    idle = client.run(resident_bytes)  # what the workers keep once the run is over
                    print(f"| {repeat + 1} | {result.status} | {result.seconds or 0:.2f} | "
                          + ", ".join(f"{b:.2f}" for b in busy.values()) + f" | {transfer:.2f} | "
                          + format_bytes(result.worker_baseline_bytes or 0) + " | "
                          + ", ".join(format_bytes(h) for h in result.worker_hwm_bytes if h) + " | "
                          + ", ".join(format_bytes(v) for v in idle.values()) + f" | {held} |")
                print("\nCompute by task prefix, last run: " + "; ".join(
                    f"{name} {n} tasks {seconds:.2f} s" for name, (n, seconds) in
                    sorted(compute.items(), key=lambda kv: -kv[1][1])[:6]) + ".\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"Machine: {machine_line()}")


if __name__ == "__main__":
    main()
