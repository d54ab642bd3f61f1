"""The cost of live observation on a production run (``refine=True`` vs ``refine=False``).

    python scripts/bench_observation.py [--shape 160x160x160] [--chunks 80x80x80] [--repeat 3]

Each repetition runs ``explorer.runner.daskrun.run`` twice on the same synthetic SEG-Y volume
(order alternating), each on its own fresh ``LocalCluster`` (2 workers x 1 thread), and
prints ``seconds`` (submit to output complete), ``wall_seconds`` (everything,
cluster start-up included) and the CPU seconds spent by this process (client, scheduler,
observation writer) and by its reaped children (the workers, their nannies' processes).
CPU seconds are far less sensitive than wall time to other load on the machine.
Observations go to a throw-away runs directory.

:func:`measure` is the same loop for other benchmarks (``scripts/bench_refine.py``) to
call on their own input, chunks and runs directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import operators
from explorer.runner.daskrun import run
from explorer.core.units import parse_shape

#: The figures compared, in the order they are printed.
FIGURES = ("seconds", "wall_seconds", "cpu_seconds")


def measure(operator: str, source, out, *, chunks, runs_dir, repeat: int = 3, workers: int = 2,
            memory_limit="3GiB", log=print) -> dict:
    """``repeat`` pairs of runs of ``operator`` on ``source`` into ``out`` with fixed ``chunks``,
    ``refine=False`` and ``refine=True`` in alternating order, each on a fresh cluster.

    ``log(line)`` gets one line per run.  Returns ``{"runs": [per-run dict], "median":
    {figure: (no_refine, refine)}}`` for the figures in :data:`FIGURES`; each run dict has
    ``rep``, ``refine``, those figures, ``cpu_client``, ``cpu_workers``, ``load`` (1-minute
    load average at its start), ``observations``, ``tasks`` and ``status``.
    """
    runs = []
    for rep in range(repeat):
        for refine in ((False, True) if rep % 2 == 0 else (True, False)):
            load = os.getloadavg()[0]
            before = os.times()
            r = run(operator, source, out, chunks=chunks, workers=workers, threads=1,
                    memory_limit=memory_limit, refine=refine, runs_dir=runs_dir, overwrite=True, check=False)
            after = os.times()
            assert r.status == "ok", r.error
            own = (after.user + after.system) - (before.user + before.system)
            children = (after.children_user + after.children_system) - (before.children_user
                                                                        + before.children_system)
            runs.append({"rep": rep, "refine": refine, "seconds": r.seconds, "wall_seconds": r.wall_seconds,
                         "cpu_seconds": own + children, "cpu_client": own, "cpu_workers": children, "load": load,
                         "observations": r.observations_recorded, "tasks": r.n_tasks, "status": r.status,
                         "chunks": r.chunks})
            log(f"rep {rep} refine={refine!s:5}  seconds {r.seconds:6.3f}  wall {r.wall_seconds:6.3f}  "
                f"cpu client {own:6.3f} workers {children:6.3f}  "
                f"observations {r.observations_recorded}  tasks {r.n_tasks}  load {load:.2f}")
    median = {name: (statistics.median(x[name] for x in runs if not x["refine"]),
                     statistics.median(x[name] for x in runs if x["refine"])) for name in FIGURES}
    return {"runs": runs, "median": median}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--operator", default="gst3d")
    parser.add_argument("--shape", default="160x160x160")
    parser.add_argument("--chunks", default="80x80x80")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="3GiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = tmp / "in.sgy"
        operators.write_segy(source, operators.synthetic_volume(parse_shape(args.shape)))
        result = measure(args.operator, source, tmp / "out.zarr", chunks=args.chunks, runs_dir=tmp / "runs",
                         repeat=args.repeat, workers=args.workers, memory_limit=args.memory_limit,
                         log=lambda line: print(line, flush=True))
        for name in FIGURES:
            off, on = result["median"][name]
            print(f"median {name:12}  --no-refine {off:6.3f}  --refine {on:6.3f}  overhead {100 * (on / off - 1):+5.1f}%")


if __name__ == "__main__":
    main()
