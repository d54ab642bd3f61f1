"""Exploration on a user's cluster's workers against exploration on the calling machine (issue 36, item 3).

Starts a ``dask scheduler`` and ``--workers`` ``dask worker`` processes (no LocalCluster: the way a
user starts a cluster), then, each into a store of its own, with the in-worker probes off (both
sides alike: this compares the profiles):

1. ``explore OP --scheduler ADDR``: each profile an isolated child of a worker, one per worker at
   once (``--jobs`` defaults to the workers); the target memory is the workers' limit;
2. ``explore OP --jobs 1 --memory-limit L``: every profile here, one at a time.

Reported: where the profiles ran (the JSON's ``profiled_on`` against the cluster's workers), each
side's wall time, profiles and stop, and, on ``--shapes`` shapes drawn in the target region
(seeded), whether the two models agree within their bounds: each model's mean under the other's
99% bound, and the largest relative difference of the means.  Markdown to stdout
(``scripts/results/cluster_explore.md``).

    python scripts/cluster_explore.py [--operator envelope] [--workers 2] [--memory-limit 4GiB] [--shapes 40]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.cli import explore_json
from harness.cluster import user_cluster
from harness.machine import machine_line


def target_shapes(model, limit: int, n: int, seed: int) -> np.ndarray:
    """``n`` of the shapes chunk sizing asks ``model`` about at ``limit`` (the explore loop's
    targets, ``ExplorationCore.target_shapes``), drawn with ``seed``."""
    from explorer.search.core import ExplorationCore

    targets = ExplorationCore(model.operator, memory_limit=limit, memory_cap=8 * limit).target_shapes(model)
    rng = np.random.default_rng(seed)
    return targets[rng.choice(len(targets), size=min(n, len(targets)), replace=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operator", default="envelope")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="4GiB")
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--shapes", type=int, default=40)
    args = parser.parse_args()
    from explorer.core.units import format_bytes, format_shape, parse_size
    from explorer.model.load import load_model

    scratch = Path(tempfile.mkdtemp(prefix="cluster-explore-"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    limit = parse_size(args.memory_limit)
    with user_cluster(workers=args.workers, memory_limit=args.memory_limit) as address:
        from distributed import Client

        with Client(address) as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        remote_seconds, remote = explore_json(args.operator, "--scheduler", address, "--probes", "0", "--budget",
                                              args.budget, "--runs-dir", scratch / "cluster")
    local_seconds, local = explore_json(args.operator, "--jobs", "1", "--probes", "0", "--budget", args.budget,
                                        "--memory-limit", args.memory_limit, "--runs-dir", scratch / "local")

    models = {"cluster": load_model(args.operator, scratch / "cluster"), "local": load_model(args.operator, scratch / "local")}
    shapes = target_shapes(models["local"], limit, args.shapes, seed=0)
    predicted = {k: m.predict_many(shapes.astype(np.float64), 0.99) for k, m in models.items()}
    (mean_c, upper_c), (mean_l, upper_l) = predicted["cluster"], predicted["local"]
    agree = (mean_c <= upper_l) & (mean_l <= upper_c)
    difference = np.abs(mean_c - mean_l) / mean_l

    print(f"# `explore {args.operator}` on a cluster's workers and on the calling machine\n")
    print(f"`python scripts/cluster_explore.py --operator {args.operator} --workers {args.workers} "
          f"--memory-limit {args.memory_limit} --budget {args.budget} --shapes {args.shapes}`, {started}: a `dask "
          f"scheduler` and {args.workers} `dask worker` processes ({args.memory_limit}, 1 thread each) on this "
          "machine; probes off on both sides.\n")
    print(f"Profiles ran on: {remote['profiled_on']} (the cluster's workers: {workers}); "
          f"{'all' if remote['profiled_on'] == workers else 'NOT all'} of them.\n")
    print("| explore | wall | profiles | converged | inside the operator | target memory |")
    print("|---|---:|---:|---|---:|---:|")
    for name, r, seconds in (("`--scheduler` (one profile per worker at once)", remote, remote_seconds),
                             ("`--jobs 1` here", local, local_seconds)):
        print(f"| {name} | {seconds:.1f} s | {r['profiles']} | {r['converged']} | {r['operator_seconds']:.1f} s | "
              f"{format_bytes(r['memory_limit_bytes'])} |")
    print(f"\nOn {len(shapes)} target shapes of the local model (task memory 1-100% of {args.memory_limit}, seed 0): "
          f"each mean under the other model's 99% bound at {int(agree.sum())} of {len(shapes)}; means differ by "
          f"at most {difference.max():.2%} (median {np.median(difference):.2%}).")
    worst = int(np.argmax(difference))
    print(f"Largest difference at {format_shape(shapes[worst])}: cluster {format_bytes(mean_c[worst])} "
          f"(99% {format_bytes(upper_c[worst])}), local {format_bytes(mean_l[worst])} (99% {format_bytes(upper_l[worst])}).\n")
    print(machine_line())


if __name__ == "__main__":
    main()
