"""Environment stamps: what a saved model or calibration was learnt with, and the warning
when this process differs (real files, real models, real operators)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import operators
from explorer.core import paths
from explorer.core.environment import ISOLATED_KEYS, WORKER_KEYS, StaleModelWarning, environment_stamp, operator_code_version, stamp_differences
from explorer.model.memory_model import ModelFileError
from explorer.model.load import load_model


def test_stamp_names_versions_machine_and_operator_code():
    stamp = environment_stamp("gst3d")
    assert stamp["numpy"] == np.__version__
    import dask
    import scipy

    assert stamp["scipy"] == scipy.__version__ and stamp["dask"] == dask.__version__
    assert stamp["torch"] is not None  # a declared dependency, read without importing it
    assert stamp["operator"] == "gst3d" and stamp["operator_code"].startswith("operators.seismic.")
    assert stamp["machine"] and stamp["python"].count(".") == 1
    assert set(ISOLATED_KEYS) <= set(stamp) and set(WORKER_KEYS) <= set(stamp)


@pytest.mark.integration  # writes copies of the task files
def test_task_code_is_a_worker_key_whose_digest_follows_the_task_files_only(tmp_path):
    """A calibration's figures depend on our code around ``run`` in the worker's task (the read,
    the windowed task's trim, the store, the measuring hook): the d7af9fe benchmark reused probes
    made before fd0c090 changed the trim, and nothing said so."""
    from explorer.core import environment, paths

    assert "task_code" in WORKER_KEYS and "task_code" not in ISOLATED_KEYS
    assert environment_stamp()["task_code"] == environment.task_code_version()
    installed = paths.PACKAGES_ROOT
    for name in environment.TASK_CODE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((installed / name).read_bytes())
    assert environment.task_code_version(tmp_path) == environment.task_code_version()
    (tmp_path / "operators" / "seismic.py").write_text("# an operator's module: its own digest\n")
    assert environment.task_code_version(tmp_path) == environment.task_code_version()
    for name in environment.TASK_CODE_FILES:
        path = tmp_path / name
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed\n")
        assert environment.task_code_version(tmp_path) != environment.task_code_version(), name
        path.write_bytes(original)
    other = dict(environment_stamp("gst3d"), task_code="0123456789ab")
    assert stamp_differences(other, environment_stamp("gst3d"), WORKER_KEYS) == [
        f"task_code 0123456789ab -> {environment.task_code_version()}"]
    assert stamp_differences(other, environment_stamp("gst3d")) == []  # an isolated model does not depend on it


def test_operator_code_version_is_the_class_version_or_its_modules_digest():
    op = operators.get("gst3d")
    digest = operator_code_version(op)
    assert digest == operator_code_version(type(op))

    class Versioned(type(op)):
        version = "2"

    assert operator_code_version(Versioned).endswith(":2")
    assert operator_code_version(Versioned) != digest


def test_stamp_differences_list_what_changed():
    old = dict(environment_stamp("gst3d"), numpy="1.0.0")
    assert stamp_differences(old, environment_stamp("gst3d")) == [f"numpy 1.0.0 -> {np.__version__}"]
    assert stamp_differences(environment_stamp("gst3d"), environment_stamp("gst3d")) == []
    assert "no environment stamp" in stamp_differences(None, environment_stamp("gst3d"))[0]
    # hostname is recorded, but a model moves between identical nodes: not compared
    assert stamp_differences(dict(environment_stamp("gst3d"), hostname="elsewhere"), environment_stamp("gst3d")) == []


def _restamp(path, **changes):
    """Rewrite a saved model's environment stamp (as if saved by another environment)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")[()]))
    meta["environment"].update(changes)
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)


@pytest.mark.integration
def test_a_model_from_another_numpy_warns_with_the_fix(tmp_path, gst3d_model):
    path = gst3d_model.save(paths.model_path("gst3d", tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a model saved here loads silently
        assert load_model("gst3d", tmp_path).stale == []
    _restamp(path, numpy="1.0.0")
    with pytest.warns(StaleModelWarning, match=r"numpy 1\.0\.0 -> .*run `explore gst3d` again"):
        model = load_model("gst3d", tmp_path)
    assert model.stale == [f"numpy 1.0.0 -> {np.__version__}"]


@pytest.mark.integration
def test_a_truncated_model_file_names_itself_and_the_command(tmp_path, gst3d_model):
    path = gst3d_model.save(paths.model_path("gst3d", tmp_path))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelFileError) as err:
        load_model("gst3d", tmp_path)
    message = str(err.value)
    assert str(path) in message and "explore gst3d" in message and "\n" not in message
