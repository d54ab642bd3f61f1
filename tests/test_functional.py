"""A user's own operator: a plain function (``operators.from_function``), a ``module:attr``
reference and a package's entry point, profiled in the profiling server, explored, planned
and run on Dask workers that cannot import the module that defined it."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage
import zarr

import explorer
import operators
from explorer.measure.local_cluster import local_cluster
from explorer.search.store import study_name
from harness.cli import one_line_failure

ENTRY_POINT_PKG = Path(__file__).parent / "data" / "entry_point_pkg"


def local_mean(block):
    return scipy.ndimage.uniform_filter(block, size=3, mode="reflect")


def local_mean_edited(block):  # the same operator after its user edited it: another study
    return scipy.ndimage.uniform_filter(block, size=3, mode="nearest")


def test_a_function_in_this_module_is_explored_planned_and_run_on_a_zarr_input(tmp_path):
    op = operators.from_function(local_mean, name="test_local_mean", halo=(1, 1, 1), axis_classes=(0, 0, 0))
    runs = tmp_path / "runs"
    # Profiled in the profiling server, a fresh `python -m` process that cannot import this module.
    # Ten profiles: five of them predicted before they ran, the evidence a plan's bound needs (with
    # one, a budget-ended model's bound is widened by the evidence grid's 100: no plan fits).
    result = explorer.explore(op, budget=10, memory_limit="256MiB", runs_dir=runs, probes=0)
    assert result.operator == "test_local_mean" and result.model_path and result.profiles == 10
    model = explorer.load_model(op, runs_dir=runs)
    assert model.operator == "test_local_mean"
    assert model.environment["operator_code"].endswith(":" + op.version)

    volume = operators.synthetic_volume((40, 36, 48), seed=3)
    group = zarr.open_group(str(tmp_path / "survey.zarr"), mode="w")
    group.create_array("amplitude", data=volume, chunks=(20, 18, 48), dimension_names=("inline", "crossline", "time"))
    group.create_array("inline", data=np.arange(1000, 1040))
    plan = explorer.recommend_chunks(op, volume.shape, "512MiB", runs_dir=runs, baseline_bytes=120 * 2**20)
    expected = local_mean(volume)
    with local_cluster(1, memory_limit="512MiB") as cluster:
        from distributed import Client

        with Client(cluster) as client:
            by_model = explorer.run(op, f"{tmp_path}/survey.zarr:amplitude", tmp_path / "model.zarr", client=client,
                                    runs_dir=runs, trials=False)
            seams = explorer.run(op, tmp_path / "survey.zarr", tmp_path / "seams.zarr", client=client,
                                 chunks=(16, 12, 20), runs_dir=runs, refine=False)
    assert by_model.status == "ok" and by_model.chunks_source == "model" and by_model.operator == "test_local_mean"
    assert plan.chunks and seams.n_tasks > 1
    for name in ("model.zarr", "seams.zarr"):
        out = zarr.open_array(str(tmp_path / name), mode="r")
        np.testing.assert_array_equal(out[:], expected)
    carried = zarr.open_array(str(tmp_path / "model.zarr"), mode="r").attrs["memory_explorer"]
    assert carried["input_dims"] == ["inline", "crossline", "time"]
    assert carried["input_coordinates"]["inline"] == list(range(1000, 1040))

    # Edited under the same name: a new study (no profile of the old code in it), and the old
    # model is stale, not the new code's.
    old_study = study_name(op)
    edited = operators.from_function(local_mean_edited, name="test_local_mean", halo=(1, 1, 1),
                                     axis_classes=(0, 0, 0))
    assert edited.version != op.version and study_name("test_local_mean") != old_study
    assert operators.get("test_local_mean").version == edited.version
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stale = explorer.load_model(edited, runs_dir=runs)
    assert any("operator_code" in line for line in stale.stale) and caught
    again = explorer.explore(edited, budget=2, memory_limit="256MiB", runs_dir=runs, probes=0)
    assert again.profiles == again.new_profiles == 2


def test_from_function_checks_what_it_is_given():
    with pytest.raises(ValueError, match="letters, digits and underscores"):
        operators.from_function(local_mean, name="../escape")
    with pytest.raises(ValueError, match="halo must be"):
        operators.from_function(local_mean, name="ok_name", halo=(1, 2))
    with pytest.raises(ValueError, match="whole_axes"):
        operators.from_function(local_mean, name="ok_name", whole_axes=(3,))
    with pytest.raises(TypeError, match="function"):
        operators.from_function(42, name="ok_name")

    @operators.from_function(name="test_decorated", whole_axes=(2,))
    def decorated(block):
        """Doubles the block."""
        return block * 2

    assert isinstance(decorated, operators.Operator) and decorated.whole_axes == (2,)
    assert decorated.description == "Doubles the block."
    assert operators.get("test_decorated") is not decorated and operators.get("test_decorated").name == "test_decorated"
    with pytest.raises(ValueError, match="returned shape"):
        operators.from_function(lambda b: b[:1], name="test_shrinks").run(np.zeros((4, 4, 4), np.float32))


def _explore(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_module_attr_reference_on_the_cli(tmp_path):
    (tmp_path / "attrs_mod.py").write_text(
        "import numpy as np\nimport operators\n\n"
        "def _negate(block):\n    return -np.asarray(block)\n\n"
        "negate = operators.from_function(_negate, name='cli_negate')\n"
        "not_an_op = len\n")
    out = _explore("profile", "attrs_mod:negate", "20x24x28", "--json", cwd=tmp_path)
    assert out.returncode == 0 and '"operator": "cli_negate"' in out.stdout, out.stderr
    one_line_failure(_explore("attrs_mod:missing", "--budget", "2", cwd=tmp_path), "has no attribute 'missing'")
    one_line_failure(_explore("attrs_mod:not_an_op", "--budget", "2", cwd=tmp_path), "not an Operator")
    one_line_failure(_explore("no_such_module_x:op", "--budget", "2", cwd=tmp_path), "cannot be imported")


def test_an_entry_point_package_is_found_and_run_on_workers_with_nothing_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EXPLORER_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENTRY_POINT_PKG), env.get("PYTHONPATH")]))
    listed = _explore("operators", env=env)
    assert listed.returncode == 0 and "demo_scale" in listed.stdout and "demo_shift" in listed.stdout, listed.stderr
    volume = operators.synthetic_volume((24, 20, 30), seed=5)
    operators.write_segy(tmp_path / "in.sgy", volume)
    # both, as one pipeline: the function operator and the class, on the workers of one run
    out = _explore("run", "demo_scale,demo_shift", str(tmp_path / "in.sgy"), "--output", str(tmp_path / "o.zarr"),
                   "--chunks", "12x10x30", "--workers", "1", "--memory-limit", "512MiB", "--no-refine", "--no-trials",
                   env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "o.zarr"), mode="r")[:], volume * 3.0 + 1.0, rtol=1e-6)
