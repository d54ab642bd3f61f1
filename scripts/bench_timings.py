"""Where a user's first commands spend their wall time (issue 36): ``explore gst3d --budget 30``
from an empty store, the same command again on its converged store, and ``explore run gst3d`` on
a 240^3 SEG-Y at 1.5 GiB per worker (2 workers), twice (the second on the first's trials).

Each command runs as a user runs it (a fresh ``explore`` process) with ``--json``; its
``timings`` (``explorer.core.timings``: nested sections are parts of their parent) and its wall
seconds are reported.  Markdown to stdout (``scripts/results/bench_timings.md``).

    python scripts/bench_timings.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness.cli import explore_json as timed
from harness.machine import machine_line


def table(rows: list[tuple[str, float, dict]]) -> None:
    names = list(dict.fromkeys(name for _, _, t in rows for name in t))
    print("| section | " + " | ".join(label for label, _, _ in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    print("| **wall (process)** | " + " | ".join(f"**{wall:.1f} s**" for _, wall, _ in rows) + " |")
    for name in names:
        cells = [f"{t[name]['seconds']:.1f} s ({t[name]['count']}x)" if name in t else "-" for _, _, t in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="from-empty explorations (medians reported)")
    args = parser.parse_args()
    import operators

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    scratch = Path(tempfile.mkdtemp(prefix="bench-timings-"))
    survey = scratch / "demo.sgy"
    operators.write_segy(survey, operators.synthetic_volume((240, 240, 240), seed=0))
    empties, explore_rows = [], []
    for k in range(args.repeat):
        runs = scratch / f"runs-{k}"
        wall, result = timed("gst3d", "--budget", "30", "--runs-dir", runs)
        empties.append((wall, result))
    runs = scratch / "runs-0"
    again_wall, again = timed("gst3d", "--budget", "30", "--runs-dir", runs)
    explore_rows.append(("explore gst3d, empty store", empties[0][0], empties[0][1]["timings"]))
    explore_rows.append(("again, converged store", again_wall, again["timings"]))
    run_rows = []
    for k in range(2):
        wall, r = timed("run", "gst3d", survey, "--output", scratch / "dip.zarr", "--memory-limit", "1.5GiB",
                        "--runs-dir", runs, "--overwrite")
        run_rows.append((f"explore run gst3d, {'first' if k == 0 else 'second'}", wall, r["timings"]))
        if r.get("trials_skipped"):
            print(f"<!-- run {k + 1}: trials skipped: {r['trials_skipped']} -->")
    print(f"`python scripts/bench_timings.py --repeat {args.repeat}`, {started}. Machine: {machine_line()}.\n")
    rows = []
    for wall, result in empties:
        inside = result["timings"].get("inside the operator", {}).get("seconds", 0.0)
        probes = result["timings"].get("in-worker probes", {}).get("seconds", 0.0)
        rows.append((wall, result["profiles"], result["converged"], wall - probes, inside, probes))
    print("| from an empty store | wall | profiles | converged | isolated loop (all but the probes) | inside the "
          "operator (share of the loop) | in-worker probes |\n|---|---:|---:|---|---:|---:|---:|")
    for k, (wall, profiles, converged, isolated, inside, probes) in enumerate(rows):
        print(f"| exploration {k + 1} | {wall:.1f} s | {profiles} | {converged} | {isolated:.1f} s | "
              f"{inside:.1f} s ({inside / isolated:.0%}) | {probes:.1f} s |")
    if len(rows) > 1:
        med = [statistics.median(column) for column in zip(*rows)]
        print(f"| median | {med[0]:.1f} s | {med[1]:g} | | {med[3]:.1f} s | {med[4]:.1f} s | {med[5]:.1f} s |")
    print(f"\n`explore gst3d --budget 30` again on the first exploration's converged store: {again_wall:.1f} s "
          f"(reused: {again['reused']}). Where the first exploration's time went, and the two runs':\n")
    table(explore_rows)
    print()
    table(run_rows)


if __name__ == "__main__":
    main()
