"""The mistakes users make, tried for real: each case runs the ``explore`` CLI in a fresh
process in a scratch directory and prints a Markdown table of the command, its exit code,
whether a traceback appeared, and the stderr line the user gets (the README's "Bad input").

    python scripts/bad_inputs.py [--keep]

Nothing here is compared with expected text: the table shows what happens.  The CLI tests
(``tests/test_cli.py``, ``tests/test_outputs.py``) assert the same cases.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.machine import machine_line

ROOT = Path(__file__).resolve().parents[1]
F3 = ROOT / "tests" / "data" / "segyio_f3_ieee_float32.sgy"
PRESTACK = ROOT / "tests" / "data" / "segyio_viking_small_2d_prestack.segy"
MISSING_TRACES = ROOT / "tests" / "data" / "xtgeo_ex1_missing_traces_75x71x26_unknownprov.segy"
RUN = ("--chunks", "12x18x75", "--no-refine", "--workers", "1", "--memory-limit", "1GiB")


def setup(scratch: Path) -> None:
    """A foreign directory where the user points --output, a model and a calibration to corrupt."""
    import numpy as np

    (scratch / "p.zarr").mkdir()
    (scratch / "p.zarr" / "important.txt").write_text("x")
    shutil.copy(F3, scratch / "in.sgy")
    ops = scratch / "runs" / "envelope"
    ops.mkdir(parents=True)
    np.savez(ops / "model.npz", junk=np.zeros(3))
    (scratch / "runs" / "envelope" / "model.npz").write_bytes((ops / "model.npz").read_bytes()[:100])
    gst = scratch / "runs-cal" / "gst3d"
    gst.mkdir(parents=True)
    (gst / "calibration.json").write_text("{not json")
    import zarr

    zarr.save_array(str(scratch / "flat.zarr"), np.zeros((20, 30), dtype=np.float32))
    zarr.save_array(str(scratch / "gathers.zarr"), np.zeros((4, 5, 6, 7), dtype=np.float32))
    survey = zarr.open_group(str(scratch / "survey.zarr"), mode="w")
    survey.create_array("amplitude", data=np.zeros((20, 30, 40), dtype=np.float32))
    os.mkfifo(scratch / "pipe.sgy")
    turned = zarr.open_group(str(scratch / "turned.mdio"), mode="w")
    turned.attrs["attributes"] = {"defaultVariableName": "amplitude"}
    turned.create_array("amplitude", data=np.zeros((40, 20, 30), dtype=np.float32),
                        dimension_names=("time", "inline", "crossline"))
    (scratch / "userops.py").write_text(
        "import operators\n\n"
        "def broken(block):\n"
        "    raise RuntimeError('this attribute needs a velocity model')\n\n"
        "broken_op = operators.from_function(broken, name='broken_op')\n"
        "not_an_op = len\n")


CASES = [
    ("--output over a directory of yours", ["run", "gst3d", "in.sgy", "--output", "p.zarr", *RUN], {}),
    ("... with --overwrite", ["run", "gst3d", "in.sgy", "--output", "p.zarr", "--overwrite", *RUN], {}),
    ("--output is the input", ["run", "gst3d", "in.sgy", "--output", "in.sgy", "--overwrite", *RUN], {}),
    ("--output of an unknown kind", ["run", "gst3d", "in.sgy", "--output", "out.npy", *RUN], {}),
    ("--output in a missing directory", ["run", "gst3d", "in.sgy", "--output", "no/such/out.zarr", *RUN], {}),
    ("input missing", ["run", "gst3d", "nosuch.sgy", "--output", "o.zarr"], {}),
    ("input is pre-stack 2D", ["run", "gst3d", str(PRESTACK), "--output", "o.zarr", *RUN], {}),
    ("input has missing traces", ["run", "gst3d", str(MISSING_TRACES), "--output", "o.zarr", *RUN], {}),
    ("--confidence 0.5", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "4GiB",
                          "--confidence", "0.5"], {}),
    ("--confidence 1.5 (explore)", ["gst3d", "--confidence", "1.5"], {}),
    ("--shape that overflows", ["chunks", "gst3d", "--shape", "1000000000x1000000000x1000000000",
                                "--memory-limit", "4GiB"], {}),
    ("--shape of 10^15 voxels", ["chunks", "gst3d", "--shape", "100000x100000x100000", "--memory-limit", "4GiB"],
     {}),
    ("--shape with two axes", ["chunks", "gst3d", "--shape", "800x600", "--memory-limit", "4GiB"], {}),
    ("--memory-limit \"\"", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", ""], {}),
    ("--memory-limit lots", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "lots"], {}),
    ("--memory-limit too small", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "100MiB",
                                  "--runs-dir", "runs-model"], {"needs_model": "runs-model"}),
    ("--chunks 0x10x10", ["run", "gst3d", "in.sgy", "--output", "o.zarr", "--chunks", "0x10x10"], {}),
    ("--strategy sideways", ["run", "gaussian,gst3d", "in.sgy", "--output", "o.zarr", "--strategy", "sideways"],
     {}),
    ("unknown operator", ["chunks", "nosuchop", "--shape", "800x600x1000", "--memory-limit", "4GiB"], {}),
    ("no model yet", ["chunks", "semblance", "--shape", "800x600x1000", "--memory-limit", "4GiB", "--runs-dir",
                      "empty-runs"], {}),
    ("truncated model.npz", ["chunks", "envelope", "--shape", "800x600x1000", "--memory-limit", "4GiB"], {}),
    ("garbage calibration.json", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "4GiB",
                                  "--runs-dir", "runs-cal"], {"needs_model": "runs-cal"}),
    ("bad --storage URL", ["envelope", "--budget", "2", "--storage", "nosuchdb://x"], {}),
    ("--storage sqlite:/// (in memory)", ["envelope", "--budget", "2", "--storage", "sqlite:///"], {}),
    ("--memory-limit 1e400", ["chunks", "gst3d", "--shape", "800x600x1000", "--memory-limit", "1e400"], {}),
    ("a parameter that overflows", ["chunks", "gaussian(sigma=1e308)", "--shape", "800x600x1000",
                                    "--memory-limit", "4GiB"], {}),
    ("missing plugin module", ["operators"], {"env": {"EXPLORER_PLUGINS": "no_such_module"}}),
    ("--scheduler with nothing listening", ["run", "gst3d", "in.sgy", "--output", "o.zarr", "--scheduler",
                                            "tcp://127.0.0.1:9", "--connect-timeout", "2", *RUN], {}),
    ("--budget 0", ["gst3d", "--budget", "0"], {}),
    ("input is a 2D Zarr array", ["run", "gst3d", "flat.zarr", "--output", "o.zarr", *RUN], {}),
    ("input is a 4D Zarr array", ["run", "gst3d", "gathers.zarr", "--output", "o.zarr", *RUN], {}),
    ("input names a missing Zarr array", ["run", "gst3d", "survey.zarr:velocity", "--output", "o.zarr", *RUN], {}),
    ("--output inside the Zarr input", ["run", "gst3d", "survey.zarr", "--output", "survey.zarr/dip.zarr", *RUN],
     {}),
    ("SEG-Y output from a Zarr input", ["run", "gst3d", "survey.zarr", "--output", "dip.sgy", *RUN], {}),
    ("input is a FIFO", ["run", "gst3d", "pipe.sgy", "--output", "o.zarr", *RUN], {}),
    ("MDIO input whose dims are out of order", ["run", "gst3d", "turned.mdio", "--output", "o.mdio", *RUN], {}),
    ("MDIO output from a SEG-Y input", ["run", "gst3d", "in.sgy", "--output", "o.mdio", *RUN], {}),
    ("module:attr that does not exist", ["userops:no_such_op", "--budget", "2"], {}),
    ("module:attr that is not an operator", ["userops:not_an_op", "--budget", "2"], {}),
    ("a function that fails on the synthetic volume", ["profile", "userops:broken_op", "20x20x20"], {}),
    ("... explored", ["userops:broken_op", "--budget", "2", "--probes", "0"], {}),
    ("calibrate a pipeline whose members have no model", ["calibrate", "envelope,gaussian", "--runs-dir",
                                                          "empty-runs"], {}),
    ("calibrate --probes 0", ["calibrate", "gst3d", "--probes", "0"], {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (path printed)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    setup(scratch)
    from explorer.core import paths

    print("| mistake | command | exit | traceback | what the user gets (stderr, last line) |")
    print("|---|---|---|---|---|")
    try:
        for label, argv, extra in CASES:
            if "needs_model" in extra:  # a valid model beside the garbage calibration
                from harness.models import fitted_gst3d_model

                fitted_gst3d_model().save(paths.model_path("gst3d", scratch / extra["needs_model"]))
            env = {**os.environ, "EXPLORER_RUNS": str(scratch / "runs"), **extra.get("env", {})}
            out = subprocess.run([sys.executable, "-m", "explorer.cli", *argv], cwd=scratch, capture_output=True,
                                 text=True, env=env, timeout=300)
            lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
            last = lines[-1] if lines else ""
            command = "explore " + " ".join(a if a and " " not in a else repr(a) for a in argv)
            command = command.replace(str(ROOT) + "/", "")
            shown = last.replace(str(scratch) + "/", "").replace(str(ROOT) + "/", "").replace("|", "\\|")
            print(f"| {label} | `{command}` | {out.returncode} | {'yes' if 'Traceback' in out.stderr else 'no'} "
                  f"| {shown} |", flush=True)
        print(f"\n`p.zarr/important.txt` after every case: "
              f"{'intact' if (scratch / 'p.zarr' / 'important.txt').read_text() == 'x' else 'LOST'}; "
              f"`in.sgy` unchanged: {(scratch / 'in.sgy').read_bytes() == F3.read_bytes()}.")
        print(f"Machine: {machine_line()}")
    finally:
        if args.keep:
            print(f"scratch: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
