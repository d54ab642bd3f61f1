"""MDIO v1 through ``explore run``, checked with MDIO's own tools (issue 35): this project's F3 crop
converted by ``multidimio``'s ``segy_to_mdio``, run as ``explore run gst3d f3.mdio --output
dip.mdio``, and the output opened with ``mdio.open_mdio``: its coordinates, headers and trace
mask against the input's, its ``gst3d`` variable against ``gst3d`` on the amplitudes.  With
``--fixture DIR`` it also writes the converted survey to ``DIR/f3.mdio`` (the test suite's
fixture, ``tests/data/f3.mdio``: the suite reads MDIO with zarr alone, because installing
``multidimio`` brings xarray, which ``dask.array`` then imports in every process).

Needs the ``mdio`` extra: ``pip install -e '.[mdio]'``.

    python scripts/mdio_roundtrip.py [--fixture tests/data]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.machine import machine_line

ROOT = Path(__file__).resolve().parents[1]
F3 = ROOT / "tests" / "data" / "segyio_f3_ieee_float32.sgy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", type=Path, default=None, help="also write the converted survey there")
    args = parser.parse_args()
    import mdio
    from mdio import open_mdio, segy_to_mdio
    from mdio.builder.template_registry import TemplateRegistry
    from segy.standards import get_segy_standard

    import operators

    scratch = Path(tempfile.mkdtemp(prefix="mdio-roundtrip-"))
    survey = scratch / "f3.mdio"
    segy_to_mdio(get_segy_standard(1.0), TemplateRegistry().get("PostStack3DTime"), F3, survey)
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "run", "gst3d", str(survey), "--output",
                          str(scratch / "dip.mdio"), "--chunks", "12x9x75", "--no-refine", "--workers", "1",
                          "--memory-limit", "1GiB"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    source, dip = open_mdio(survey), open_mdio(scratch / "dip.mdio")
    expected = operators.get("gst3d").run(source["amplitude"].values.astype(np.float32))
    checks = {name: bool(np.array_equal(dip[name].values, source[name].values))
              for name in ("inline", "crossline", "time", "cdp_x", "cdp_y", "trace_mask")}
    checks["headers"] = bool((dip["headers"].values == source["headers"].values).all())
    checks["gst3d == gst3d(amplitude)"] = bool(np.array_equal(dip["gst3d"].values, expected))
    print(f"`python scripts/mdio_roundtrip.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, multidimio "
          f"{mdio.__version__}. Machine: {machine_line()}.\n")
    print(f"`mdio.open_mdio` of the output: data variables {sorted(dip.data_vars)}, default variable "
          f"`{dip.attrs['attributes']['defaultVariableName']}`, dims {dict(dip.sizes)}.\n")
    print("| compared with the input (`segy_to_mdio` of the F3 crop) | equal |\n|---|---|")
    for name, ok in checks.items():
        print(f"| {name} | {'yes' if ok else 'NO'} |")
    if args.fixture is not None:
        target = args.fixture / "f3.mdio"
        if target.exists():
            raise SystemExit(f"{target} exists: remove it first (it is not replaced)")
        shutil.copytree(survey, target)
        print(f"\nfixture written: {target}")


if __name__ == "__main__":
    main()
