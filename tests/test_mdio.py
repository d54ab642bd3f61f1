"""MDIO v1 in and out of ``explore run``: this project's F3 crop as converted by MDIO's own
``segy_to_mdio`` (``tests/data/f3.mdio``, made by ``scripts/mdio_roundtrip.py``, which also opens
the output with ``mdio.open_mdio``); read here with zarr alone.  The SEG-Y, Zarr and MDIO results agree."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr
from distributed import Client

import explorer
import operators
from explorer.measure.local_cluster import local_cluster
from harness.cli import one_line_failure

DATA = Path(__file__).parent / "data"
F3 = DATA / "segyio_f3_ieee_float32.sgy"
RUN = ("--chunks", "12x9x75", "--no-refine", "--workers", "1", "--memory-limit", "1GiB")


def explore(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_gst3d_on_an_mdio_survey_a_zarr_array_and_the_segy_agree(tmp_path):
    survey = tmp_path / "f3.mdio"
    shutil.copytree(DATA / "f3.mdio", survey)
    source = zarr.open_group(str(survey), mode="r")
    amplitudes = source["amplitude"][:]
    np.testing.assert_array_equal(amplitudes, np.asarray(operators.read_segy(F3)))  # the fixture is the F3 crop
    expected = operators.get("gst3d").run(amplitudes.astype(np.float32))
    zarr.save_array(str(tmp_path / "f3.zarr"), amplitudes)

    with local_cluster(1, memory_limit="1GiB") as cluster, Client(cluster) as client:  # the three share one
        for source_path, output in ((survey, "dip.mdio"), (tmp_path / "f3.zarr", "dip.zarr"), (F3, "dip.sgy")):
            explorer.run("gst3d", source_path, tmp_path / output, chunks=(12, 9, 75), refine=False, client=client)
    dip = zarr.open_group(str(tmp_path / "dip.mdio"), mode="r")
    for name in ("inline", "crossline", "time", "cdp_x", "cdp_y", "trace_mask", "headers"):
        np.testing.assert_array_equal(dip[name][:], source[name][:])  # copied, byte for byte
    assert "amplitude" not in dip and dip.attrs["attributes"]["defaultVariableName"] == "gst3d"
    assert dip["gst3d"].metadata.dimension_names == source["amplitude"].metadata.dimension_names
    assert dip["gst3d"].attrs["coordinates"] == source["amplitude"].attrs["coordinates"]
    np.testing.assert_array_equal(dip["gst3d"][:], expected)
    from_zarr = zarr.open_array(str(tmp_path / "dip.zarr"), mode="r")[:]
    from_segy = np.asarray(operators.read_segy(tmp_path / "dip.sgy"))
    np.testing.assert_array_equal(from_zarr, expected)
    np.testing.assert_array_equal(from_segy, expected)

    # an MDIO output is the input's dataset: it needs an MDIO input
    one_line_failure(explore("run", "gst3d", F3, "--output", tmp_path / "x.mdio", *RUN), "is not MDIO")
