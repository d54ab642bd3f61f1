"""How much equal in-worker tasks of one run differ, and whether data arriving explains it.

Reads a runs directory's store (any one ``explore`` and ``explore run`` wrote: probes and
production tasks, ``explorer.runner.live``'s observations) and prints, per (run, block shape)
group of exact observations, the tasks' peaks (mean, sd, range), and per production task
its peak, the worker's managed memory when it started and ended (``managed_before_bytes``,
``managed_after_bytes``: ``WorkerState.nbytes`` plus bytes in flight) and its resident set
at the start less that managed memory (freed memory the allocator kept).

    python scripts/task_spread.py RUNS_DIR [--operator gst3d]

The figures in ``docs/definitions.md`` and the README's "Inside a worker" come from this,
on the runs directory of one survey run (651x951x462 at 4 GiB, 2 workers) from the model
and probes of ``scripts/bench_first_run.py``'s trial E.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

MIB = 2**20
#: A change of managed memory within this many MiB is "level" (allocator and bookkeeping).
LEVEL_MIB = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir")
    parser.add_argument("--operator", default="gst3d")
    args = parser.parse_args()

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from explorer.search.store import Store

    records = [r for r in Store(args.runs_dir).records(args.operator)
               if r.source in ("probe", "production") and r.status == "ok" and r.context.get("exact")]
    groups = defaultdict(list)
    for r in records:
        groups[(r.source, str(r.context.get("run", "")), tuple(r.shape))].append(r.peak_bytes / MIB)
    print(f"## {args.operator}: equal tasks of one run ({args.runs_dir})\n")
    print("| source | block | tasks | mean MiB | sd MiB | sd / mean | range MiB |")
    print("|---|---|---|---|---|---|---|")
    for (source, _run, shape), peaks in sorted(groups.items(), key=lambda kv: (kv[0][0], np.prod(kv[0][2]))):
        p = np.asarray(peaks)
        sd = p.std(ddof=1) if len(p) > 1 else 0.0
        print(f"| {source} | {'x'.join(map(str, shape))} | {len(p)} | {p.mean():,.1f} | {sd:,.2f} | "
              f"{sd / p.mean():.1%} | {p.min():,.1f}-{p.max():,.1f} |")

    production = [r for r in records if r.source == "production" and "managed_after_bytes" in r.context]
    if not production:
        return
    print("\n| block | peak MiB | managed at start MiB | managed at end MiB | change MiB | "
          "resident at start less managed MiB |")
    print("|---|---|---|---|---|---|")
    changes, kept = [], []
    for r in sorted(production, key=lambda r: r.peak_bytes):
        c = r.context
        before, after = c.get("managed_before_bytes"), c["managed_after_bytes"]
        change = None if before is None else (after - before) / MIB
        unmanaged = None if before is None else (c["rss_before_bytes"] - before) / MIB
        changes.append(change)
        kept.append(unmanaged)
        print(f"| {'x'.join(map(str, r.shape))} | {r.peak_bytes / MIB:,.1f} | "
              f"{'-' if before is None else f'{before / MIB:,.0f}'} | {after / MIB:,.0f} | "
              f"{'-' if change is None else f'{change:+,.0f}'} | {'-' if unmanaged is None else f'{unmanaged:,.0f}'} |")
    known = [x for x in changes if x is not None]
    rises = [x for x in known if x > LEVEL_MIB]
    print(f"\nManaged memory rose by more than {LEVEL_MIB:g} MiB during {len(rises)} of {len(known)} production tasks"
          + (f" (by {', '.join(f'{x:+.0f}' for x in rises)} MiB)" if rises else "")
          + f"; the resident set at a task's start was {min(k for k in kept if k is not None):,.0f}-"
            f"{max(k for k in kept if k is not None):,.0f} MiB above the managed memory.")


if __name__ == "__main__":
    main()
