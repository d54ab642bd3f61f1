"""MDIO v1 (``multidimio``) in and out: this project's F3 crop converted by MDIO's own
``segy_to_mdio``, run through ``explore run``; the SEG-Y, Zarr and MDIO results agree."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from distributed import Client
from mdio import open_mdio, segy_to_mdio
from mdio.builder.template_registry import TemplateRegistry
from segy.standards import get_segy_standard

import explorer
import operators
from explorer.measure.local_cluster import local_cluster
from harness.cli import one_line_failure

F3 = Path(__file__).parent / "data" / "segyio_f3_ieee_float32.sgy"
RUN = ("--chunks", "12x9x75", "--no-refine", "--workers", "1", "--memory-limit", "1GiB")


def explore(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_gst3d_on_an_mdio_survey_a_zarr_array_and_the_segy_agree(tmp_path):
    survey = tmp_path / "f3.mdio"
    segy_to_mdio(get_segy_standard(1.0), TemplateRegistry().get("PostStack3DTime"), F3, survey)
    source = open_mdio(survey)
    amplitudes = source["amplitude"].values
    expected = operators.get("gst3d").run(amplitudes.astype(np.float32))
    zarr.save_array(str(tmp_path / "f3.zarr"), amplitudes)

    out = explore("run", "gst3d", survey, "--output", tmp_path / "dip.mdio", *RUN)
    assert out.returncode == 0, out.stderr
    with local_cluster(1, memory_limit="1GiB") as cluster, Client(cluster) as client:  # the other two share one
        for source_path, output in ((tmp_path / "f3.zarr", "dip.zarr"), (F3, "dip.sgy")):
            explorer.run("gst3d", source_path, tmp_path / output, chunks=(12, 9, 75), refine=False, client=client)
    dip = open_mdio(tmp_path / "dip.mdio")
    for name in ("inline", "crossline", "time", "cdp_x", "cdp_y", "trace_mask"):
        np.testing.assert_array_equal(dip[name].values, source[name].values)
    assert (dip["headers"].values == source["headers"].values).all()
    assert "amplitude" not in dip and dip.attrs["attributes"]["defaultVariableName"] == "gst3d"
    np.testing.assert_array_equal(dip["gst3d"].values, expected)
    from_zarr = zarr.open_array(str(tmp_path / "dip.zarr"), mode="r")[:]
    from_segy = np.asarray(operators.read_segy(tmp_path / "dip.sgy"))
    np.testing.assert_array_equal(from_zarr, dip["gst3d"].values)
    np.testing.assert_array_equal(from_segy, dip["gst3d"].values)

    # an MDIO output is the input's dataset: it needs an MDIO input
    one_line_failure(explore("run", "gst3d", F3, "--output", tmp_path / "x.mdio", *RUN), "is not MDIO")
