"""What a task's read costs inside Dask workers, by the chunks' shape, and the rate the clock learns.

``scripts/read_cost.py`` times reads in one process.  This runs the operator on a synthetic SEG-Y
with each chunking (``explorer.runner.daskrun.run``, 2 one-thread workers, observed), interleaved
``--repeat`` times, and reports per chunking the medians of its tasks that were not their worker's
first of a run: the task's seconds, its ``read_seconds`` (before its ``run``: the windowed read,
``docs/definitions.md``), the voxels its read touched (whole traces) and the seconds per voxel read;
the runs' median compute seconds and how many tasks each worker ran in each run; and the read rate
the planner's clock learns from all of them (``explorer.plan.timing.fit_timing``:
``TaskClock.read_seconds_per_voxel``).

    python scripts/read_in_workers.py [first_derivative] [--volume 320x320x320]
        [--chunks 160x160x160,80x160x320,80x320x320] [--memory-limit 384MiB] [--repeat 3]
        [--worker-saturation 1.1]

``--worker-saturation``: the runs' clusters start with this ``distributed.scheduler.worker-saturation``
instead of ours (``explorer.measure.local_cluster.WORKER_SATURATION``), e.g. Dask's default 1.1.

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
from pathlib import Path

import operators
from explorer.core.units import format_shape, parse_shape
from explorer.plan.timing import task_read_voxels, fit_timing
from explorer.runner.daskrun import run
from explorer.search.store import Store
from harness.machine import machine_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("operator", nargs="?", default="first_derivative")
    parser.add_argument("--volume", default="320x320x320")
    parser.add_argument("--chunks", default="160x160x160,80x160x320,80x320x320")
    parser.add_argument("--memory-limit", default="384MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker-saturation", type=float, default=None)
    args = parser.parse_args()
    if args.worker_saturation is not None:
        import explorer.measure.local_cluster as local_cluster

        local_cluster.WORKER_SATURATION = args.worker_saturation
    volume = parse_shape(args.volume)
    chunkings = [parse_shape(text) for text in args.chunks.split(",")]
    with tempfile.TemporaryDirectory(prefix="read-in-workers-") as tmp:
        source, runs = Path(tmp) / "volume.sgy", Path(tmp) / "runs"
        operators.write_segy(source, operators.synthetic_volume(volume, seed=0))
        seconds: dict[tuple, list[float]] = {c: [] for c in chunkings}
        run_ids: dict[str, tuple] = {}
        for _ in range(args.repeat):
            for chunks in chunkings:
                r = run(args.operator, source, Path(tmp) / f"out-{len(run_ids)}.zarr", workers=2,
                        memory_limit=args.memory_limit, chunks=chunks, runs_dir=runs, refine=True)
                if r.status != "ok":
                    raise SystemExit(f"{format_shape(chunks)}: {r.status}: {r.error}")
                seconds[chunks].append(r.seconds)
                run_ids[r.run_id] = chunks
        records = Store(runs).records(args.operator, source="production")
        print(f"## `{args.operator}` on a {format_shape(volume)} SEG-Y, 2 one-thread workers at "
              f"{args.memory_limit}, {args.repeat} runs per chunking (interleaved), scheduler worker-saturation "
              f"{args.worker_saturation if args.worker_saturation is not None else 'ours'}\n")
        print("Medians of the tasks that were not their worker's first of their run.\n")
        print("| chunks | tasks | run compute s | tasks per worker (each run) | task ms | read ms | in `run` ms | "
              "voxels read / block voxel | ns per voxel read |")
        print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
        for chunks in chunkings:
            mine = [x for x in records if run_ids.get(x.context["run"]) == chunks and not x.context["first_in_run"]]
            read = [task_read_voxels(x.shape, x.context["read_unit"], x.context["volume_shape"]) for x in mine]
            ratio = statistics.median(v / (x.shape[0] * x.shape[1] * x.shape[2]) for v, x in zip(read, mine))
            per_voxel = statistics.median(x.context["read_seconds"] / v for v, x in zip(read, mine))
            shares = []
            for run_id in (i for i, c in run_ids.items() if c == chunks):
                per_worker = collections.Counter(x.context["worker"] for x in records if x.context["run"] == run_id)
                shares.append("/".join(str(n) for n in sorted(per_worker.values(), reverse=True)))
            print(f"| {format_shape(chunks)} | {len(mine)} | {statistics.median(seconds[chunks]):.3f} | "
                  f"{', '.join(shares)} | "
                  f"{1e3 * statistics.median(x.context['task_seconds'] for x in mine):.1f} | "
                  f"{1e3 * statistics.median(x.context['read_seconds'] for x in mine):.1f} | "
                  f"{1e3 * statistics.median(x.context['run_seconds'] for x in mine):.1f} | {ratio:.2f} | "
                  f"{1e9 * per_voxel:.2f} |")
        clock = fit_timing(records).clock
        print(f"\nThe clock's read rate from these tasks: {1e9 * clock.read_seconds_per_voxel:.2f} ns per voxel read.")
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    main()
