"""Exploration and a first run on a user's cluster (issue 35, item 3): a ``dask scheduler`` and
``dask worker`` processes (no LocalCluster) whose preload holds ``--preload-mib`` MiB, as a user's
cluster that imports its software stack does.

1. ``explore gst3d --budget 30 --scheduler ADDR --memory-limit L``: the profiles (the JSON's
   ``profiled_on``) and the in-worker probes (``probes.workers``) on the cluster's workers;
2. ``explore run gst3d survey.sgy --scheduler ADDR``: the first run there, on the model's plan.

Reported: where the profiles and the probes ran against the cluster's workers, the probes' idle-worker baseline
(the preload in it), each worker's kernel high-water mark against Dask's pause threshold, and the
run's tasks over their bound.  Markdown to stdout (``scripts/results/cluster_probes.md``).

    python scripts/cluster_probes.py [--workers 2] [--memory-limit 1GiB] [--preload-mib 300] [--volume 200x200x200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from harness.cli import explore_json
from harness.cluster import user_cluster
from harness.machine import machine_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--preload-mib", type=int, default=300)
    parser.add_argument("--volume", default="200x200x200")
    args = parser.parse_args()
    import dask

    import operators
    from explorer.core.units import format_bytes, parse_shape

    scratch = Path(tempfile.mkdtemp(prefix="cluster-probes-"))
    runs, source = scratch / "runs", scratch / "survey.sgy"
    operators.write_segy(source, operators.synthetic_volume(parse_shape(args.volume), seed=7))
    env = {**os.environ, "EXPLORER_TEST_PRELOAD_MIB": str(args.preload_mib)}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with user_cluster(workers=args.workers, memory_limit=args.memory_limit, preload=("harness.heavy_preload",),
                      env=env) as address:
        from distributed import Client

        with Client(address) as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        explore_seconds, learnt = explore_json("gst3d", "--budget", "30", "--scheduler", address,
                                               "--memory-limit", args.memory_limit, "--runs-dir", runs)
        _, ran = explore_json("run", "gst3d", source, "--output", scratch / "dip.zarr", "--scheduler", address,
                              "--runs-dir", runs)
    probes = learnt["probes"] or {}
    pause = dask.config.get("distributed.worker.memory.pause") * ran["memory_limit_bytes"]
    hwm = [b for b in ran["worker_hwm_bytes"] if b is not None]
    over, n = ran["tasks_over_bound"], ran["n_tasks"]
    print(f"`python scripts/cluster_probes.py --workers {args.workers} --memory-limit {args.memory_limit} "
          f"--preload-mib {args.preload_mib} --volume {args.volume}`, {started}. Machine: {machine_line()}.\n")
    print("| what | measured |\n|---|---|")
    print(f"| cluster | `dask scheduler` + `dask worker --nworkers {args.workers} --memory-limit {args.memory_limit} "
          f"--preload harness.heavy_preload` ({args.preload_mib} MiB held per worker) |")
    print(f"| profiles ran on | {', '.join(learnt['profiled_on'] or ['this machine'])} |")
    print(f"| explore gst3d --scheduler | {learnt['profiles']} profiles, {explore_seconds:.0f} s wall; converged: "
          f"{learnt['converged']} |")
    print(f"| probes ran on | {', '.join(probes.get('workers') or ['-'])} (cluster's workers: {', '.join(workers)}) |")
    print(f"| probes' idle-worker baseline | {format_bytes(probes.get('baseline_bytes') or 0)} |")
    print(f"| first run | {ran['status']}, chunks {'x'.join(map(str, ran['chunks'] or []))} ({ran['chunks_source']}), "
          f"{n} tasks |")
    print(f"| worker high-water marks | {', '.join(format_bytes(b) for b in hwm)}; pause threshold "
          f"{format_bytes(pause)}: {'all under' if hwm and max(hwm) < pause else 'NOT all under'} |")
    print(f"| tasks over their bound | {over} of {n}"
          + (f" ({over / n:.1%})" if over is not None and n else "") + " |")


if __name__ == "__main__":
    main()
