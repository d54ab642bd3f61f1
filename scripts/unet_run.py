"""unet3d on Dask at a memory limit where ``chunks="auto"`` kills workers (issue 13).

Writes a synthetic SEG-Y (``--shape``, default 400x400x64: the samples axis shorter than
unet3d's minimum chunk of 2h + 1 = 97, so it stays whole and blocks are 200x200x64-ish),
then runs, each on a fresh 2-worker LocalCluster at ``--memory-limit`` (default 2GiB):

1. ``explore run unet3d IN.sgy --chunks auto``: Dask's auto chunks (one 41 MB chunk: the
   whole volume in one task, ~3 GB of activations);
2. ``explore run unet3d IN.sgy`` with the explored model's chunks (``--runs-dir``, from
   ``explore unet3d``);

and compares the second's Zarr output with whole-volume inference (``operator.run`` on
the whole volume, in this process): the largest absolute difference, against the
tolerance ``tests/test_unet.py`` states (1e-6).

    python scripts/unet_run.py --runs-dir DIR [--shape 400x400x64] [--memory-limit 2GiB] [--work runs/unet-run]

Prints Markdown and the machine line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness.machine import machine_line
from harness.trials import trials_text

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-6  # tests/test_unet.py: blockwise == whole-volume within this


def cli(*args) -> tuple[int, dict | None, str]:
    out = subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT)
    data = None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            break
    return out.returncode, data, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--shape", default="400x400x64")
    parser.add_argument("--memory-limit", default="2GiB")
    parser.add_argument("--work", default="runs/unet-run")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"synthetic-{args.shape}.sgy"
    subprocess.run([sys.executable, "scripts/make_volume.py", args.shape, str(source)], check=True, cwd=ROOT,
                   capture_output=True)
    rows = []
    for label, extra in (("auto", ["--chunks", "auto"]), ("explored model", [])):
        out = work / f"out-{label.replace(' ', '-')}.zarr"
        started = time.perf_counter()
        code, data, last = cli("run", "unet3d", source, "--output", out, "--overwrite", "--memory-limit",
                               args.memory_limit, "--workers", "2", "--runs-dir", args.runs_dir, "--json", *extra)
        rows.append((label, code, data, last, time.perf_counter() - started, out))
        print(f"{label}: exit {code} in {time.perf_counter() - started:.0f} s; {last}", file=sys.stderr, flush=True)

    import zarr

    import operators
    from operators import read_segy

    whole = operators.get("unet3d").run(np.asarray(read_segy(source)))
    print(f"## unet3d on Dask, {args.shape} at {args.memory_limit} per worker, 2 workers x 1 thread\n")
    print(f"`python scripts/unet_run.py {' '.join(sys.argv[1:])}`\n")
    print("| chunks | exit | status | chunk shape | tasks | seconds (the command's) | trials before the run (chunks, "
          "seconds) | workers restarted | worker HWM (max) | plan upper | tasks over their bound | "
          "max abs difference to whole-volume inference |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, code, data, last, seconds, out in rows:
        data = data or {}
        diff = "-"
        if code == 0 and out.exists():
            result = np.asarray(zarr.open(str(out), mode="r")[...])
            diff = f"{float(np.max(np.abs(result - whole))):.2e} ({'<=' if np.max(np.abs(result - whole)) <= TOLERANCE else '>'} {TOLERANCE:g})"
        hwm = [h for h in data.get("worker_hwm_bytes") or [] if h]
        hwm = f"{max(hwm) / 2**20:,.0f} MiB" if hwm else "-"
        upper = (data.get("plan") or {}).get("upper_bytes")
        print(f"| {label} | {code} | {data.get('status', last[:60])} | {'x'.join(map(str, data.get('chunks') or [])) or '-'} "
              f"| {data.get('n_tasks', '-')} | {seconds:.0f} | {trials_text(data.get('trials') or [])} "
              f"| {data.get('workers_restarted', '-')} | {hwm} | "
              f"{'-' if upper is None else f'{upper / 2**20:,.0f} MiB'} | {data.get('tasks_over_bound', '-')} | {diff} |")
    print(f"\nMachine: {machine_line()}")


if __name__ == "__main__":
    main()
