"""How Dask's scheduler shares equal root tasks among one-thread workers, by its worker-saturation.

The time model prices a plan as greedy list scheduling: a free thread takes the next task
(``explorer.plan.time_model.schedule_waves``).  Dask's queuing hands a worker of ``T`` threads
up to ``ceil(s T)`` root tasks at a time (``distributed.scheduler.worker-saturation`` ``s``,
1.1 by default).  This submits ``n`` equal root tasks (a busy loop of ``--task-seconds``), each
with a small dependent task (a run's store), to a ``LocalCluster`` of ``--workers`` one-thread
workers started at each saturation, twice per ``n``, and reports how many root tasks each worker
ran and the wall seconds.

    python scripts/root_task_balance.py [--saturations 1.0,1.1,2.0] [--tasks 4,6,8,10] [--workers 2]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import collections
import logging
import math
import time

from harness.machine import machine_line


def _root(index: int, seconds: float):
    from distributed import get_worker

    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        pass
    return index, get_worker().address


def _store(result):
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saturations", default="1.0,1.1,2.0")
    parser.add_argument("--tasks", default="4,6,8,10")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--task-seconds", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import dask
    from distributed import Client, LocalCluster

    counts = [int(n) for n in args.tasks.split(",")]
    print(f"## {args.workers} one-thread workers, root tasks of {args.task_seconds:g} s each with a dependent task, "
          f"{args.repeat} submissions per count\n")
    print("| worker-saturation | root tasks | tasks per worker (each submission) | list scheduling | wall s |")
    print("|---|---:|---|---|---|")
    for text in args.saturations.split(","):
        saturation = float(text)
        with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.CRITICAL)
        with cluster, Client(cluster) as client:
            for n in counts:
                shares, walls = [], []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    futures = [client.submit(_store, client.submit(_root, i, args.task_seconds, pure=False), pure=False)
                               for i in range(n)]
                    ran = client.gather(futures)
                    walls.append(time.perf_counter() - started)
                    per_worker = collections.Counter(address for _, address in ran)
                    shares.append("/".join(str(c) for c in sorted(per_worker.values(), reverse=True)))
                even = [n // args.workers + (w < n % args.workers) for w in range(args.workers)]
                print(f"| {saturation:g} | {n} | {', '.join(shares)} | {'/'.join(map(str, even))} "
                      f"(makespan {math.ceil(n / args.workers)} tasks) | {', '.join(f'{w:.2f}' for w in walls)} |")
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
