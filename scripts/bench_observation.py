"""The cost of live observation on a production run (``refine=True`` vs ``refine=False``).

    python scripts/bench_observation.py [--shape 160x160x160] [--chunks 80x80x80] [--repeat 3]

Each repetition runs ``explorer.daskrun.run`` twice on the same synthetic SEG-Y volume
(order alternating), each on its own fresh ``LocalCluster`` (2 workers x 1 thread), and
prints ``seconds`` (submit to output complete), ``wall_seconds`` (everything,
cluster start-up included) and the CPU seconds spent by this process (client, scheduler,
observation writer) and by its reaped children (the workers, their nannies' processes).
CPU seconds are far less sensitive than wall time to other load on the machine.
Observations go to a throw-away runs directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import operators
from explorer.daskrun import run
from explorer.units import parse_shape


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
        seconds = {True: [], False: []}
        walls = {True: [], False: []}
        cpu = {True: [], False: []}
        for rep in range(args.repeat):
            for refine in ((False, True) if rep % 2 == 0 else (True, False)):
                before = os.times()
                r = run(args.operator, source, tmp / "out.zarr", chunks=args.chunks, workers=args.workers,
                        threads_per_worker=1, memory_limit=args.memory_limit, refine=refine,
                        runs_dir=tmp / "runs")
                after = os.times()
                assert r.status == "ok", r.error
                own = (after.user + after.system) - (before.user + before.system)
                children = (after.children_user + after.children_system) - (before.children_user
                                                                            + before.children_system)
                seconds[refine].append(r.seconds)
                walls[refine].append(r.wall_seconds)
                cpu[refine].append(own + children)
                print(f"rep {rep} refine={refine!s:5}  seconds {r.seconds:6.3f}  wall {r.wall_seconds:6.3f}  "
                      f"cpu client {own:6.3f} workers {children:6.3f}  "
                      f"observations {r.observations_recorded}  tasks {r.n_tasks}", flush=True)
        for name, data in (("seconds", seconds), ("wall_seconds", walls), ("cpu_seconds", cpu)):
            off, on = statistics.median(data[False]), statistics.median(data[True])
            print(f"median {name:12}  --no-refine {off:6.3f}  --refine {on:6.3f}  overhead {100 * (on / off - 1):+5.1f}%")


if __name__ == "__main__":
    main()
