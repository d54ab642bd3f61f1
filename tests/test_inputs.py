"""What a run reads (``explorer.runner.inputs``) and what it must never write over
(``explorer.runner.outputs.check_output``): real files, no cluster."""

import os

import numpy as np
import pytest
import zarr

import operators
from explorer.runner.inputs import InputError, open_input
from explorer.runner.outputs import OutputError, check_output


def test_inputs_of_every_kind_and_their_one_line_refusals(tmp_path):
    operators.write_segy(tmp_path / "in.sgy", operators.synthetic_volume((6, 5, 8), seed=0))
    assert open_input(tmp_path / "in.sgy").kind == "segy"
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("amp", data=np.zeros((4, 5, 6), dtype=np.int16))
    group.create_array("flat", data=np.zeros((4, 5), dtype=np.float32))
    opened = open_input(tmp_path / "g.zarr")  # the group's one 3D array
    assert (opened.kind, opened.array_path, opened.shape) == ("zarr", "amp", (4, 5, 6))
    assert opened.source()[0:2, 0:2, 0:2].dtype == np.float32  # read as float32, as the profiles were
    os.mkfifo(tmp_path / "pipe.sgy")
    (tmp_path / "in.txt").write_text("not a volume")
    for path, fragment in ((tmp_path / "pipe.sgy", "not a regular file"),  # a FIFO used to hang forever
                           (tmp_path / "missing.sgy", "does not exist"),
                           (f"{tmp_path}/g.zarr:flat", "2-D array"),
                           (f"{tmp_path}/g.zarr:nope", "has no array 'nope'"),
                           (tmp_path / "in.txt", "is read, not .txt")):
        with pytest.raises(InputError, match=fragment) as info:
            open_input(path)
        assert "\n" not in str(info.value)


def test_an_output_that_contains_the_input_or_the_runs_dir_is_refused(tmp_path):
    """`--overwrite` of a Zarr this tool wrote once removed the run's own input and a runs
    directory inside it: an output that contains either, or lies inside a Zarr input, is refused."""
    out = tmp_path / "out.zarr"
    (out / "runs").mkdir(parents=True)
    (out / "survey.sgy").write_text("the user's survey")
    for protected in (out / "survey.sgy", out / "runs"):
        with pytest.raises(OutputError, match="contains"):
            check_output(out, overwrite=True, protected=(protected,))
    (tmp_path / "in.zarr").mkdir()
    with pytest.raises(OutputError, match="lies inside the input"):
        check_output(tmp_path / "in.zarr" / "dip.zarr", input_path=tmp_path / "in.zarr")
    assert (out / "survey.sgy").read_text() == "the user's survey"
